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
// the tokens, two per thread and step (tokens t and t + gridDim.y, then strided by 2 gridDim.y
// when there are more than 2 * 65535). Accesses are coalesced along the row.
//
// Vectors: VEC = 16 / sizeof(T) (128-bit loads and stores) when d, pointers and row strides allow,
// else VEC = 1. Bytes per call: reads 2 * tokens * d * sizeof(T), writes tokens * d * sizeof(T).
#include "common/llk.cuh"

namespace {

constexpr int kMaxThreads = 256;

// silu in f32. For f16/bf16 outputs: exp(-g) as ex2.approx(-g log2 e) (the rounding of the
// product dominates: a relative error of |g| log2(e) 2^-24 ln 2 + 2^-22, below 2e-6 for |g| < 20,
// where silu is not yet saturated) and the approximate reciprocal (1 ulp): 2 MUFU and 4 FP
// instructions per element. Both are far below half an ulp of the
// 16-bit output (2^-9 for bf16, 2^-12 for f16), so the tolerance against the f64 reference is
// unchanged. For g -> -inf, exp(-g) overflows to inf, rcp(inf) = 0, and silu = g * 0 = -0 as it
// should; g = NaN stays NaN. The f32 kernels keep the accurate expf and an IEEE division, since
// their output has no rounding slack to hide the approximation in.
template <class T>
__device__ __forceinline__ float silu(float g) {
  if constexpr (std::is_same<T, float>::value) return g / (1.f + expf(-g));
  else return g * llk::fast_rcp(1.f + llk::fast_exp2(g * -1.4426950408889634f));
}

// VEC gate and up values at `gate` (and `up`): the row pointers already point at this thread's
// vector (interleaved: at its 2 VEC gate/up values).
template <class T, int VEC, LlkGateUpLayout LAYOUT>
__device__ __forceinline__ void load_gate_up(const T* gate, const T* up, float (&g)[VEC], float (&u)[VEC]) {
  if constexpr (LAYOUT == LLK_GATE_UP_SEPARATE) {
    llk::load_f32<T, VEC>(gate, g);
    llk::load_f32<T, VEC>(up, u);
  } else {
    float w[2 * VEC];  // gate, up, gate, up, ...
    llk::load_f32<T, VEC>(gate, *reinterpret_cast<float(*)[VEC]>(w));
    llk::load_f32<T, VEC>(gate + VEC, *reinterpret_cast<float(*)[VEC]>(w + VEC));
#pragma unroll
    for (int j = 0; j < VEC; ++j) g[j] = w[2 * j], u[j] = w[2 * j + 1];
  }
}

// Each thread handles vector v of two tokens per step (t and t + gridDim.y): all four 16-byte
// loads are issued before the first silu. Row pointers advance by increments (no 64-bit
// multiply per token).
template <class T, int VEC, LlkGateUpLayout LAYOUT>
__device__ void swiglu_kernel(const SwiGluParams& p) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.d / VEC) return;  // no barriers or warp operations below
  constexpr int64_t kPerVec = LAYOUT == LLK_GATE_UP_SEPARATE ? VEC : 2 * VEC;  // gate elements per vector
  const int64_t step = int64_t(gridDim.y), t0 = blockIdx.y;
  const T* gate = reinterpret_cast<const T*>(p.gate) + t0 * p.gate_row_stride + v * kPerVec;  // [tokens, d] or [tokens, 2d]
  const T* up = LAYOUT == LLK_GATE_UP_SEPARATE ? reinterpret_cast<const T*>(p.up) + t0 * p.up_row_stride + v * VEC
                                               : gate;                                         // [tokens, d]
  T* out = reinterpret_cast<T*>(p.out) + t0 * p.out_row_stride + v * VEC;                      // [tokens, d]
  const int64_t gs = step * p.gate_row_stride, us = step * p.up_row_stride, os = step * p.out_row_stride;
  for (int64_t t = t0; t < p.tokens; t += 2 * step, gate += 2 * gs, up += 2 * us, out += 2 * os) {
    // Without a second token, load the first one twice (valid memory, stored once): the loads
    // stay unconditional, so all of them are issued before the first silu.
    const bool second = t + step < p.tokens;
    float g[2][VEC], u[2][VEC], o[VEC];
    load_gate_up<T, VEC, LAYOUT>(gate, up, g[0], u[0]);
    load_gate_up<T, VEC, LAYOUT>(second ? gate + gs : gate, second ? up + us : up, g[1], u[1]);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = silu<T>(g[k][j]) * u[k][j];
      if (k == 0) llk::store_f32<T, VEC>(out, o);
      else if (second) llk::store_f32<T, VEC>(out + os, o);
    }
  }
}

// ---------------------------------------------------------------------------- backward
//
// Math (src/reference/swiglu.rs, swiglu_backward): s = 1 / (1 + exp(-g)), silu = g s,
// d_up = d_out silu, d_gate = d_out u s (1 + g (1 - s)), in f32 with the accurate expf on every
// dtype, each output rounded once to T. For g -> -inf, exp(-g) overflows, s = 0 and both
// gradients are 0 (-0). Outputs in the input's layout; each element is read before it is written,
// by the same thread, so the outputs may be the inputs (in place over the saved gate/up).
// Grid mapping: as the forward's, one token per thread and grid.y step.
template <class T, int VEC, LlkGateUpLayout LAYOUT>
__device__ void swiglu_backward_kernel(const SwiGluBackwardParams& p) {
  const int64_t v = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= p.d / VEC) return;  // no barriers or warp operations below
  constexpr bool kSep = LAYOUT == LLK_GATE_UP_SEPARATE;
  constexpr int64_t kPerVec = kSep ? VEC : 2 * VEC;  // gate-row elements per vector
  for (int64_t t = blockIdx.y; t < p.tokens; t += gridDim.y) {
    const T* gate = reinterpret_cast<const T*>(p.gate) + t * p.gate_row_stride + v * kPerVec;  // [tokens, d] / [tokens, 2d]
    const T* up = kSep ? reinterpret_cast<const T*>(p.up) + t * p.up_row_stride + v * VEC : gate;  // [tokens, d]
    const T* dout = reinterpret_cast<const T*>(p.d_out) + t * p.d_out_row_stride + v * VEC;        // [tokens, d]
    float g[VEC], u[VEC], d[VEC], dg[VEC], du[VEC];
    load_gate_up<T, VEC, LAYOUT>(gate, up, g, u);
    llk::load_f32<T, VEC>(dout, d);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float s = 1.f / (1.f + expf(-g[j]));
      du[j] = d[j] * (g[j] * s);
      dg[j] = d[j] * u[j] * s * fmaf(g[j], 1.f - s, 1.f);
    }
    T* dgate = reinterpret_cast<T*>(p.d_gate) + t * p.d_gate_row_stride + v * kPerVec;  // like gate
    if constexpr (kSep) {
      llk::store_f32<T, VEC>(dgate, dg);
      llk::store_f32<T, VEC>(reinterpret_cast<T*>(p.d_up) + t * p.d_up_row_stride + v * VEC, du);  // like up
    } else {
      float w[2][VEC];  // gate, up, gate, up, ... as the input
#pragma unroll
      for (int j = 0; j < VEC; ++j) w[(2 * j) / VEC][(2 * j) % VEC] = dg[j], w[(2 * j + 1) / VEC][(2 * j + 1) % VEC] = du[j];
      llk::store_f32<T, VEC>(dgate, w[0]);
      llk::store_f32<T, VEC>(dgate + VEC, w[1]);
    }
  }
}

}  // namespace

// Symbols: swiglu[_interleaved][_vec]_<dtype>. `_vec` is the 16-byte path.
#define SWIGLU_KERNELS(X)                                                                                          \
  X(swiglu_f32, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<float, 1, LLK_GATE_UP_SEPARATE>))                       \
  X(swiglu_f16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__half, 1, LLK_GATE_UP_SEPARATE>))                      \
  X(swiglu_bf16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__nv_bfloat16, 1, LLK_GATE_UP_SEPARATE>))              \
  X(swiglu_vec_f32, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<float, 4, LLK_GATE_UP_SEPARATE>))                   \
  X(swiglu_vec_f16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__half, 8, LLK_GATE_UP_SEPARATE>))                  \
  X(swiglu_vec_bf16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__nv_bfloat16, 8, LLK_GATE_UP_SEPARATE>))          \
  X(swiglu_interleaved_f32, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<float, 1, LLK_GATE_UP_INTERLEAVED>))        \
  X(swiglu_interleaved_f16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__half, 1, LLK_GATE_UP_INTERLEAVED>))       \
  X(swiglu_interleaved_bf16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__nv_bfloat16, 1, LLK_GATE_UP_INTERLEAVED>)) \
  X(swiglu_interleaved_vec_f32, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<float, 4, LLK_GATE_UP_INTERLEAVED>))    \
  X(swiglu_interleaved_vec_f16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__half, 8, LLK_GATE_UP_INTERLEAVED>))   \
  X(swiglu_interleaved_vec_bf16, SwiGluParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_kernel<__nv_bfloat16, 8, LLK_GATE_UP_INTERLEAVED>)) \
  SWIGLU_BACKWARD_KERNELS(X)

// Backward symbols: swiglu_backward[_interleaved][_vec]_<dtype>.
#define SWIGLU_BACKWARD_DTYPE(X, suffix, T, V)                                                                                     \
  X(swiglu_backward_##suffix, SwiGluBackwardParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_backward_kernel<T, 1, LLK_GATE_UP_SEPARATE>))           \
  X(swiglu_backward_vec_##suffix, SwiGluBackwardParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_backward_kernel<T, V, LLK_GATE_UP_SEPARATE>))       \
  X(swiglu_backward_interleaved_##suffix, SwiGluBackwardParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_backward_kernel<T, 1, LLK_GATE_UP_INTERLEAVED>)) \
  X(swiglu_backward_interleaved_vec_##suffix, SwiGluBackwardParams, (kMaxThreads), LLK_SMEM_NONE, (swiglu_backward_kernel<T, V, LLK_GATE_UP_INTERLEAVED>))
#define SWIGLU_BACKWARD_KERNELS(X)                 \
  SWIGLU_BACKWARD_DTYPE(X, f32, float, 4)          \
  SWIGLU_BACKWARD_DTYPE(X, f16, __half, 8)         \
  SWIGLU_BACKWARD_DTYPE(X, bf16, __nv_bfloat16, 8)

LLK_EXPORT_KERNELS(swiglu, SWIGLU_KERNELS)
