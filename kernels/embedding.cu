// embedding.cu -- the token embedding lookup: out[t] = table[ids[t]], a row gather.
//
// Math: none; the rows are copied bit for bit (the spec is src/reference/embedding.rs). An id
// outside [0, vocab) is never read from: its output row is zeros and the kernel raises
// LLK_DEVICE_BAD_TOKEN_ID in the error flag, which the host reads after the step.
//
// Grid mapping: grid.x * blockDim.x threads cover the VEC-element vectors of a row; grid.y walks
// the tokens (t, t + gridDim.y, ...). Each token's id is read once per thread (a broadcast load
// within the warp). Accesses are coalesced along the row.
//
// Vectors: VEC = 16 / sizeof(T) (128-bit loads through the read-only path, 128-bit stores) when
// hidden, both base pointers and both row strides allow, else VEC = 1. Bytes per call: reads
// tokens * (hidden * sizeof(T) + 4), writes tokens * hidden * sizeof(T): a memory-bound copy.
#include "common/device_error.cuh"
#include "common/llk.cuh"

namespace {

constexpr int kThreads = LLK_EMBEDDING_THREADS;

template <class T, int VEC>
__device__ void embedding_kernel(const EmbeddingParams& p) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.hidden / VEC) return;  // no barriers or warp operations below
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.ids);
  const T* table = reinterpret_cast<const T*>(p.table);
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const int32_t id = ids[t];
    T* out = reinterpret_cast<T*>(p.out) + t * p.out_row_stride + v * VEC;
    const bool valid = id >= 0 && int64_t(id) < p.vocab;
    if (!valid && v == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_TOKEN_ID);
    const T* src = table + (valid ? int64_t(id) * p.table_row_stride : 0) + v * VEC;
    if constexpr (VEC * sizeof(T) == 16) {
      const uint4 raw = valid ? __ldg(reinterpret_cast<const uint4*>(src)) : make_uint4(0, 0, 0, 0);
      llk::store_u4(out, raw);
    } else {
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] = valid ? __ldg(src + i) : llk::from_f32<T>(0.f);
    }
  }
}

}  // namespace

// Symbols: embedding[_vec]_<dtype>. `_vec` is the 16-byte path.
#define EMBEDDING_KERNELS(X)                                                                      \
  X(embedding_f32, EmbeddingParams, (kThreads), (embedding_kernel<float, 1>))                     \
  X(embedding_f16, EmbeddingParams, (kThreads), (embedding_kernel<__half, 1>))                    \
  X(embedding_bf16, EmbeddingParams, (kThreads), (embedding_kernel<__nv_bfloat16, 1>))            \
  X(embedding_vec_f32, EmbeddingParams, (kThreads), (embedding_kernel<float, 4>))                 \
  X(embedding_vec_f16, EmbeddingParams, (kThreads), (embedding_kernel<__half, 8>))                \
  X(embedding_vec_bf16, EmbeddingParams, (kThreads), (embedding_kernel<__nv_bfloat16, 8>))

LLK_EXPORT_KERNELS(embedding, EMBEDDING_KERNELS)
