// dropout.cu -- scaled dropout with a reproducible mask: out = x * scale * keep(t, i).
//
// Math (the spec is src/reference/dropout.rs): element (t, i) of a [tokens, d] tensor is kept when
// word i % 4 of Philox-4x32-10 (common/philox.cuh) at counter {i / 4, t, stream lo, stream hi}
// with key {seed lo, seed hi} is at least drop_threshold = round(p 2^32), so it drops with
// probability p. The mask depends on (seed, stream, t, i) only: not on the grid, the access width
// or the target, so a backward pass regenerates the forward's mask from the same (seed, stream)
// instead of storing it, and the scalar and vector kernels agree bit for bit. The product
// x * scale is computed in f32 and rounded once to T; the host folds 1 / (1 - p) and any other
// constant factor (LoRA's alpha / r) into scale, so a dropout followed by a scaling is one pass.
// Gradients take the same kernel: d_x (+)= d_out * scale * keep(t, i) with the forward's seed and
// stream (accumulate: the product is added to out in f32 and the sum rounded once).
//
// Grid mapping: grid.x * blockDim.x threads cover the VEC-element vectors of a row; grid.y walks
// the tokens (strided by gridDim.y past 65535). Accesses are coalesced along the row.
//
// Vectors: VEC = 16 / sizeof(T) (128-bit accesses) when d, pointers and row strides allow, else
// VEC = 1. A vector starts at a multiple of 4 columns, so it takes VEC / 4 Philox blocks; a
// scalar thread evaluates the block of its column and keeps one word. Bytes per call: reads and
// writes tokens * d * sizeof(T) (and reads out too when accumulating); 10 Philox rounds per 4
// elements stay below the memory time.
#include "common/llk.cuh"
#include "common/philox.cuh"

namespace {

// The 4 keep decisions of columns 4q .. 4q + 3 of row t.
__device__ __forceinline__ llk::Philox4 mask_block(const DropoutParams& p, int64_t t, int64_t q) {
  return llk::philox4x32_10(llk::Philox4{{uint32_t(q), uint32_t(t), uint32_t(p.stream), uint32_t(p.stream >> 32)}},
                            uint32_t(p.seed), uint32_t(p.seed >> 32));
}

template <class T, int VEC>
__device__ void dropout_kernel(const DropoutParams& p) {
  static_assert(VEC == 1 || VEC % 4 == 0, "a vector covers whole Philox blocks");
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.d / VEC) return;  // no barriers or warp operations below
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const T* x = reinterpret_cast<const T*>(p.x) + t * p.x_row_stride + v * VEC;  // [tokens, d]
    T* out = reinterpret_cast<T*>(p.out) + t * p.out_row_stride + v * VEC;        // [tokens, d]
    float a[VEC];
    llk::load_f32<T, VEC>(x, a);
    if constexpr (VEC == 1) {
      const llk::Philox4 r = mask_block(p, t, v / 4);
      a[0] = r.v[v % 4] >= p.drop_threshold ? a[0] * p.scale : 0.f;
    } else {
#pragma unroll
      for (int b = 0; b < VEC / 4; ++b) {
        const llk::Philox4 r = mask_block(p, t, v * (VEC / 4) + b);
#pragma unroll
        for (int j = 0; j < 4; ++j) a[4 * b + j] = r.v[j] >= p.drop_threshold ? a[4 * b + j] * p.scale : 0.f;
      }
    }
    if (p.accumulate) {
      float o[VEC];
      llk::load_f32<T, VEC>(out, o);
#pragma unroll
      for (int j = 0; j < VEC; ++j) a[j] += o[j];
    }
    llk::store_f32<T, VEC>(out, a);
  }
}

}  // namespace

#define DROPOUT_KERNELS(X)                                                                                     \
  X(dropout_f32, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<float, 1>))              \
  X(dropout_f16, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<__half, 1>))             \
  X(dropout_bf16, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<__nv_bfloat16, 1>))     \
  X(dropout_vec_f32, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<float, 4>))          \
  X(dropout_vec_f16, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<__half, 8>))         \
  X(dropout_vec_bf16, DropoutParams, (LLK_DROPOUT_THREADS), LLK_SMEM_NONE, (dropout_kernel<__nv_bfloat16, 8>))

LLK_EXPORT_KERNELS(dropout, DROPOUT_KERNELS)
