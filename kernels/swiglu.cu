// swiglu.cu -- the SwiGLU activation of Llama's MLP: out = silu(gate) * up.
//
// Math (the spec is src/reference/swiglu.rs, in f64): silu(g) = g / (1 + exp(-g)); the product is
// computed in f32 from the stored inputs and rounded once to T.
//
// Input layouts:
//   LLK_GATE_UP_SEPARATE     gate and up are two row-strided [tokens, d] tensors. This also
//                            covers one packed [tokens, 2d] tensor with the gate in the first half
//                            and up in the second (the output of one fused gate-up GEMM, and
//                            Llama 4's gate_up_proj, split by `chunk(2, dim=-1)`): the host passes
//                            up = gate + d with the same row stride.
//   LLK_GATE_UP_INTERLEAVED  one [tokens, 2d] tensor with gate at even and up at odd columns, the
//                            order GPT-OSS's gate_up_proj uses (gate_up[..., ::2], [..., 1::2]).
// The output may be the gate itself (separate layout): each element is read before it is written,
// by the same thread.
//
// Grid mapping: grid.x * blockDim.x threads cover the VEC-element vectors of a row; grid.y walks
// the tokens (strided by gridDim.y when tokens > 65535). Accesses are coalesced along the row.
//
// Vectors: VEC = 16 / sizeof(T) (128-bit loads and stores) when d, pointers and row strides allow,
// else VEC = 1. Bytes per call: reads 2 * tokens * d * sizeof(T), writes tokens * d * sizeof(T).
#include "common/llk.cuh"

namespace {

constexpr int kMaxThreads = 256;

__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

template <class T, int VEC, LlkGateUpLayout LAYOUT>
__device__ void swiglu_kernel(const SwiGluParams& p) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.d / VEC) return;  // no barriers or warp operations below
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    float g[VEC], u[VEC], o[VEC];
    const T* gate_row = reinterpret_cast<const T*>(p.gate) + t * p.gate_row_stride;
    if constexpr (LAYOUT == LLK_GATE_UP_SEPARATE) {
      llk::load_f32<T, VEC>(gate_row + v * VEC, g);
      llk::load_f32<T, VEC>(reinterpret_cast<const T*>(p.up) + t * p.up_row_stride + v * VEC, u);
    } else {
      float w[2 * VEC];  // gate, up, gate, up, ...
      llk::load_f32<T, VEC>(gate_row + 2 * v * VEC, *reinterpret_cast<float(*)[VEC]>(w));
      llk::load_f32<T, VEC>(gate_row + 2 * v * VEC + VEC, *reinterpret_cast<float(*)[VEC]>(w + VEC));
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[j] = w[2 * j], u[j] = w[2 * j + 1];
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) o[j] = silu(g[j]) * u[j];
    llk::store_f32<T, VEC>(reinterpret_cast<T*>(p.out) + t * p.out_row_stride + v * VEC, o);
  }
}

}  // namespace

// Symbols: swiglu[_interleaved][_vec]_<dtype>. `_vec` is the 16-byte path.
#define SWIGLU_KERNELS(X)                                                                                          \
  X(swiglu_f32, SwiGluParams, (kMaxThreads), (swiglu_kernel<float, 1, LLK_GATE_UP_SEPARATE>))                       \
  X(swiglu_f16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__half, 1, LLK_GATE_UP_SEPARATE>))                      \
  X(swiglu_bf16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__nv_bfloat16, 1, LLK_GATE_UP_SEPARATE>))              \
  X(swiglu_vec_f32, SwiGluParams, (kMaxThreads), (swiglu_kernel<float, 4, LLK_GATE_UP_SEPARATE>))                   \
  X(swiglu_vec_f16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__half, 8, LLK_GATE_UP_SEPARATE>))                  \
  X(swiglu_vec_bf16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__nv_bfloat16, 8, LLK_GATE_UP_SEPARATE>))          \
  X(swiglu_interleaved_f32, SwiGluParams, (kMaxThreads), (swiglu_kernel<float, 1, LLK_GATE_UP_INTERLEAVED>))        \
  X(swiglu_interleaved_f16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__half, 1, LLK_GATE_UP_INTERLEAVED>))       \
  X(swiglu_interleaved_bf16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__nv_bfloat16, 1, LLK_GATE_UP_INTERLEAVED>)) \
  X(swiglu_interleaved_vec_f32, SwiGluParams, (kMaxThreads), (swiglu_kernel<float, 4, LLK_GATE_UP_INTERLEAVED>))    \
  X(swiglu_interleaved_vec_f16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__half, 8, LLK_GATE_UP_INTERLEAVED>))   \
  X(swiglu_interleaved_vec_bf16, SwiGluParams, (kMaxThreads), (swiglu_kernel<__nv_bfloat16, 8, LLK_GATE_UP_INTERLEAVED>))

LLK_EXPORT_KERNELS(swiglu, SWIGLU_KERNELS)
