// embedding.cu -- the token embedding lookup: out[t] = table[ids[t]], a row gather.
//
// Math: none; the rows are copied bit for bit (the spec is src/reference/embedding.rs). An id
// outside [0, vocab) is never read from: its output row is zeros and the kernel raises
// LLK_DEVICE_BAD_TOKEN_ID in the error flag, which the host reads after the step.
//
// Grid mapping: grid.x * blockDim.x threads cover the VEC-element vectors of a row; grid.y walks
// the tokens LLK_EMBEDDING_ROWS at a time (rows R y .. R y + R - 1, then R gridDim.y further), so
// that each thread has R row loads in flight before its first store (one 16-byte load left a
// large gather latency-bound in the static model). Each token's id is read once per thread (a
// broadcast load within the warp). Accesses are coalesced along the row.
//
// Vectors: VEC = 16 / sizeof(T) (128-bit loads through the read-only path, 128-bit stores) when
// hidden, both base pointers and both row strides allow, else VEC = 1. Bytes per call: reads
// tokens * (hidden * sizeof(T) + 4), writes tokens * hidden * sizeof(T): a memory-bound copy.
//
// Packed tables (qembedding_<format>_<dtype>): the same lookup from a table kept in a packed
// format (common/quant_chunk.cuh), each row dequantized as the reference does and rounded to the
// dtype: bit for bit the dense lookup of the dequantized table. One thread per 32-element chunk
// of an output row (grid.x * blockDim.x threads over tokens x chunks): the chunk's packed bytes
// in one or two 16-byte loads, its values in 16-byte stores when out allows, else one by one.
// Bytes per call: tokens * (the packed row + 4) read, tokens * hidden * sizeof(T) written.
//
// Backward (embedding_backward_*): d_table[v] (+)= sum of d_out[t] over the tokens with
// ids[t] == v, summed in token order in f32, without atomics. Per chunk of at most
// LLK_EMBEDDING_BWD_CHUNK tokens, embedding_backward_sort (one block) bitonic-sorts the keys
// (id << 32 | token) in shared memory, so equal ids form runs ordered by token; then one block
// per (table row, column slice) finds its run by binary search (LLK_EMBEDDING_BWD_ROWS: every
// row of the table, those without tokens written as zeros, so no separate memset) or one block
// per run start (LLK_EMBEDDING_BWD_SEGMENTS: only the chunk's ids, added to the table, for the
// later chunks and for accumulation). The sum order depends on the ids alone: bit-identical on
// every run. Bytes: the ROWS pass writes the whole f32 table once and reads every d_out row once;
// the SEGMENTS pass touches only the chunk's rows. An id outside [0, vocab) is skipped and
// raises LLK_DEVICE_BAD_TOKEN_ID.
#include "common/device_error.cuh"
#include "common/llk.cuh"
#include "common/quant_chunk.cuh"

namespace {

constexpr int kThreads = LLK_EMBEDDING_THREADS;

template <class T, int VEC>
__device__ void embedding_kernel(const EmbeddingParams& p) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.hidden / VEC) return;  // no barriers or warp operations below
  constexpr int R = LLK_EMBEDDING_ROWS;
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.ids);
  const T* table = reinterpret_cast<const T*>(p.table);
  for (int64_t t0 = int64_t(blockIdx.y) * R; t0 < p.tokens; t0 += int64_t(gridDim.y) * R) {
    // The rows' sources first (a row past the tokens reads nothing), then their loads, then the
    // stores.
    const T* src[R];
    bool valid[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int64_t t = t0 + r;
      const int32_t id = t < p.tokens ? ids[t] : -1;
      valid[r] = id >= 0 && int64_t(id) < p.vocab;
      if (!valid[r] && t < p.tokens && v == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_TOKEN_ID);
      src[r] = table + (valid[r] ? int64_t(id) * p.table_row_stride : 0) + v * VEC;
    }
    if constexpr (VEC * sizeof(T) == 16) {
      uint4 raw[R];
#pragma unroll
      for (int r = 0; r < R; ++r) raw[r] = valid[r] ? __ldg(reinterpret_cast<const uint4*>(src[r])) : make_uint4(0, 0, 0, 0);
#pragma unroll
      for (int r = 0; r < R; ++r)
        if (t0 + r < p.tokens) llk::store_u4(reinterpret_cast<T*>(p.out) + (t0 + r) * p.out_row_stride + v * VEC, raw[r]);
    } else {
#pragma unroll
      for (int r = 0; r < R; ++r) {
        if (t0 + r >= p.tokens) continue;
        T* out = reinterpret_cast<T*>(p.out) + (t0 + r) * p.out_row_stride + v * VEC;
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] = valid[r] ? __ldg(src[r] + i) : llk::from_f32<T>(0.f);
      }
    }
  }
}

template <LlkQuantFormat F, class T>
__device__ void qembedding_kernel(const QEmbeddingParams& p) {
  using namespace llk::quant;
  __shared__ float code_smem[16];
  const float* code = code_book<F>(p.w, code_smem);  // before any thread returns
  const int64_t chunks = p.w.k / kChunk;
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.tokens * chunks) return;  // no barriers or warp operations below
  const int64_t t = i / chunks, c = i % chunks;
  const int32_t id = reinterpret_cast<const int32_t*>(p.ids)[t];
  const bool valid = id >= 0 && int64_t(id) < p.w.n;
  if (!valid && c == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_TOKEN_ID);
  float w[kChunk];
  if (valid) {
    dequant_chunk<F>(p.w, code, id, c, w);
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) w[j] = 0.f;
  }
  const bool vec = p.out % 16 == 0 && p.out_row_stride % llk::kVec16<T> == 0;  // uniform
  store_chunk<T>(reinterpret_cast<T*>(p.out) + t * p.out_row_stride + c * kChunk, w, vec);
}

}  // namespace

// Symbols: embedding[_vec]_<dtype>. `_vec` is the 16-byte path.
#define EMBEDDING_KERNELS(X)                                                                      \
  X(embedding_f32, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<float, 1>))                     \
  X(embedding_f16, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<__half, 1>))                    \
  X(embedding_bf16, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<__nv_bfloat16, 1>))            \
  X(embedding_vec_f32, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<float, 4>))                 \
  X(embedding_vec_f16, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<__half, 8>))                \
  X(embedding_vec_bf16, EmbeddingParams, (kThreads), LLK_SMEM_NONE, (embedding_kernel<__nv_bfloat16, 8>))

namespace {

constexpr int kBwdChunk = LLK_EMBEDDING_BWD_CHUNK;
constexpr int kSortThreads = LLK_EMBEDDING_BWD_SORT_THREADS;

// The keys (id << 32 | token) of one chunk, sorted ascending; invalid ids get id = vocab (after
// every valid run) and padding all ones.
__device__ void embedding_backward_sort_kernel(const EmbeddingBackwardParams& p) {
  __shared__ uint64_t s_keys[kBwdChunk];
  const int tid = int(threadIdx.x);
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.ids);
  for (int i = tid; i < kBwdChunk; i += kSortThreads) {
    uint64_t key = ~uint64_t(0);
    if (i < p.tokens) {
      const int32_t id = ids[i];
      const bool valid = id >= 0 && int64_t(id) < p.vocab;
      if (!valid) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_TOKEN_ID);
      key = (uint64_t(valid ? int64_t(id) : p.vocab) << 32) | uint64_t(i);
    }
    s_keys[i] = key;
  }
  __syncthreads();
  // Bitonic sort: stages k = 2, 4, ..., chunk; steps j = k/2 .. 1; each thread owns pairs.
  for (int k = 2; k <= kBwdChunk; k <<= 1) {
    for (int j = k >> 1; j > 0; j >>= 1) {
      for (int i = tid; i < kBwdChunk; i += kSortThreads) {
        const int partner = i ^ j;
        if (partner > i) {
          const uint64_t a = s_keys[i], b = s_keys[partner];
          const bool ascending = (i & k) == 0;
          if ((a > b) == ascending) s_keys[i] = b, s_keys[partner] = a;
        }
      }
      __syncthreads();
    }
  }
  uint64_t* keys = reinterpret_cast<uint64_t*>(p.keys);
  for (int i = tid; i < kBwdChunk; i += kSortThreads) keys[i] = s_keys[i];
}

// The first sorted position whose id is >= v (binary search over the chunk's keys).
__device__ __forceinline__ int64_t lower_bound(const uint64_t* keys, int64_t n, int64_t v) {
  int64_t lo = 0, hi = n;
  while (lo < hi) {
    const int64_t mid = (lo + hi) / 2;
    if (int64_t(keys[mid] >> 32) < v) lo = mid + 1; else hi = mid;
  }
  return lo;
}

template <class T, int VEC>
__device__ void embedding_backward_kernel(const EmbeddingBackwardParams& p) {
  const uint64_t* keys = reinterpret_cast<const uint64_t*>(p.keys);
  const int64_t c = (int64_t(blockIdx.y) * blockDim.x + threadIdx.x) * VEC;  // this thread's columns
  // The run of this block: a table row's (ROWS) or the run starting at sorted key blockIdx.x.
  int64_t v, begin;
  bool add;
  if (p.mode == LLK_EMBEDDING_BWD_ROWS) {
    v = blockIdx.x;
    begin = lower_bound(keys, p.tokens, v);
    add = false;
  } else {
    begin = blockIdx.x;
    v = int64_t(keys[begin] >> 32);
    if (v >= p.vocab || (begin > 0 && int64_t(keys[begin - 1] >> 32) == v)) return;  // not a run start
    add = true;
  }
  if (c >= p.hidden) return;  // no barriers below
  float acc[VEC] = {};
  for (int64_t k = begin; k < p.tokens && int64_t(keys[k] >> 32) == v; ++k) {
    const int64_t t = int64_t(keys[k] & 0xffffffffu);
    float x[VEC];
    const T* src = reinterpret_cast<const T*>(p.d_out) + t * p.d_out_row_stride + c;
    if constexpr (VEC == 4 && sizeof(T) == 2) {
      // Four 16-bit values in one 8-byte load (the host checked the 8-byte alignment).
      const uint2 raw = *reinterpret_cast<const uint2*>(src);
      const float2 a = llk::unpack2(raw.x, T()), b = llk::unpack2(raw.y, T());
      x[0] = a.x, x[1] = a.y, x[2] = b.x, x[3] = b.y;
    } else {
      llk::load_f32<T, VEC>(src, x);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] += x[i];
  }
  float* row = reinterpret_cast<float*>(p.d_table) + v * p.d_table_row_stride + c;
  if (add) {
    float old[VEC];
    llk::load_f32<float, VEC>(row, old);
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = old[i] + acc[i];
  }
  llk::store_f32<float, VEC>(row, acc);
}

}  // namespace

// Symbols: embedding_backward_sort, embedding_backward[_vec]_<dtype> (d_out's dtype; the table
// gradient is f32; `_vec` moves 4 elements per access).
#define EMBEDDING_BACKWARD_KERNELS(X)                                                                                      \
  X(embedding_backward_sort, EmbeddingBackwardParams, (kSortThreads), LLK_SMEM_NONE, (embedding_backward_sort_kernel))      \
  X(embedding_backward_f32, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<float, 1>))      \
  X(embedding_backward_f16, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<__half, 1>))     \
  X(embedding_backward_bf16, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<__nv_bfloat16, 1>)) \
  X(embedding_backward_vec_f32, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<float, 4>))  \
  X(embedding_backward_vec_f16, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<__half, 4>)) \
  X(embedding_backward_vec_bf16, EmbeddingBackwardParams, (kThreads), LLK_SMEM_NONE, (embedding_backward_kernel<__nv_bfloat16, 4>))

// Symbols: qembedding_<format>_<dtype>, the packed tables.
#define QEMBEDDING_FORMAT(X, fmt, F)                                                                    \
  X(qembedding_##fmt##_f32, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, float>))              \
  X(qembedding_##fmt##_f16, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, __half>))             \
  X(qembedding_##fmt##_bf16, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, __nv_bfloat16>))

#define EMBEDDING_ALL(X) \
  EMBEDDING_KERNELS(X)   \
  EMBEDDING_BACKWARD_KERNELS(X) \
  LLK_QUANT_FORMATS(QEMBEDDING_FORMAT, X)

LLK_EXPORT_KERNELS(embedding, EMBEDDING_ALL)
