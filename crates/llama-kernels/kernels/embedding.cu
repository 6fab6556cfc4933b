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

// Symbols: qembedding_<format>_<dtype>, the packed tables.
#define QEMBEDDING_FORMAT(X, fmt, F)                                                                    \
  X(qembedding_##fmt##_f32, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, float>))              \
  X(qembedding_##fmt##_f16, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, __half>))             \
  X(qembedding_##fmt##_bf16, QEmbeddingParams, (kThreads), LLK_SMEM_NONE, (qembedding_kernel<F, __nv_bfloat16>))

#define EMBEDDING_ALL(X) \
  EMBEDDING_KERNELS(X)   \
  LLK_QUANT_FORMATS(QEMBEDDING_FORMAT, X)

LLK_EXPORT_KERNELS(embedding, EMBEDDING_ALL)
