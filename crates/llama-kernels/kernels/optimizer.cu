// optimizer.cu -- one AdamW step over many tensors: the global gradient norm and clipping, the
// non-finite check with GradScaler's dynamic loss scale, and the update, in three launches with no
// host synchronization.
//
// Math (the spec is src/reference/optimizer.rs, in f64): with s the loss scale, g = grad / s,
//   norm = sqrt(sum over every tensor of g^2),  c = min(1, max_norm / (norm + 1e-6)) (no clipping: 1),
//   found_inf = the sum is not finite (an inf or NaN gradient).
// When found_inf the step is skipped (nothing is written to the tensors) and the scale becomes
// s * backoff; otherwise, with t = step + 1 and g' = c g (torch.optim.AdamW):
//   p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g';  v <- b2 v + (1 - b2) g'^2
//   p <- p - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// and after growth_interval finite steps in a row the scale becomes s * growth (GradScaler).
// p is the f32 master weight when there is one (then also rounded into the parameter), else the
// parameter read in f32 and rounded back once. m and v are f32.
//
// Kernels (all deterministic: fixed reduction orders, no atomics):
//   optim_norm_partials  one block per chunk (LLK_OPTIM_CHUNK elements of one tensor): its sum of
//                        squared gradients in f64 (a fixed tree), into partials[chunk].
//   optim_finalize       one block: the partials summed in f64 in order; norm, clip coefficient,
//                        found_inf; the step count and the loss scale updated.
//   optim_adamw          one block per chunk: the update, reading the finalized state (skipped
//                        when found_inf). The scale the gradients were multiplied by is the one
//                        saved by optim_finalize in clip_coef (c / s), so the update of the scale
//                        does not race with its use.
// Bytes per step: the gradients are read twice (norm, update); params, m, v (and master) read
// and written once: (2 g + 2 p + 16 (+ 8)) bytes per element for g, p bytes per gradient/param.
#include "common/llk.cuh"

namespace {

constexpr int kChunk = LLK_OPTIM_CHUNK;
constexpr int kThreads = LLK_OPTIM_THREADS;
constexpr int kReduceThreads = LLK_OPTIM_REDUCE_THREADS;

__device__ __forceinline__ float load_as_f32(uint64_t base, LlkFloatType t, int64_t i) {
  switch (t) {
    case LLK_FLOAT_F16: return llk::to_f32(reinterpret_cast<const __half*>(base)[i]);
    case LLK_FLOAT_BF16: return llk::to_f32(reinterpret_cast<const __nv_bfloat16*>(base)[i]);
    default: return reinterpret_cast<const float*>(base)[i];
  }
}

__device__ __forceinline__ void store_from_f32(uint64_t base, LlkFloatType t, int64_t i, float v) {
  switch (t) {
    case LLK_FLOAT_F16: reinterpret_cast<__half*>(base)[i] = llk::from_f32<__half>(v); break;
    case LLK_FLOAT_BF16: reinterpret_cast<__nv_bfloat16*>(base)[i] = llk::from_f32<__nv_bfloat16>(v); break;
    default: reinterpret_cast<float*>(base)[i] = v; break;
  }
}

// Sum of a double over the block in a fixed order (warps by shuffles, then warp sums in order);
// thread 0 gets the total. `s_part` holds one value per warp.
template <int THREADS>
__device__ __forceinline__ double block_sum(double x, double* s_part) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  if (threadIdx.x % 32 == 0) s_part[threadIdx.x / 32] = x;
  __syncthreads();
  double total = 0.0;
  if (threadIdx.x == 0)
    for (int w = 0; w < THREADS / 32; ++w) total += s_part[w];
  return total;
}

__device__ void optim_norm_partials_kernel(const OptimizerParams& p) {
  __shared__ double s_part[kThreads / 32];
  const LlkOptimChunk ch = reinterpret_cast<const LlkOptimChunk*>(p.chunks)[blockIdx.x];
  const LlkOptimSlot s = reinterpret_cast<const LlkOptimSlot*>(p.slots)[ch.slot];
  const int64_t end = ch.start + kChunk < s.numel ? ch.start + kChunk : s.numel;
  double acc = 0.0;
  for (int64_t i = ch.start + threadIdx.x; i < end; i += kThreads) {
    const double g = double(load_as_f32(s.grad, s.grad_type, i));
    acc += g * g;
  }
  const double total = block_sum<kThreads>(acc, s_part);
  if (threadIdx.x == 0) reinterpret_cast<double*>(p.partials)[blockIdx.x] = total;
}

__device__ void optim_finalize_kernel(const OptimizerParams& p) {
  __shared__ double s_part[kReduceThreads / 32];
  const double* partials = reinterpret_cast<const double*>(p.partials);
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < p.n_chunks; i += kReduceThreads) acc += partials[i];
  const double total = block_sum<kReduceThreads>(acc, s_part);
  if (threadIdx.x != 0) return;
  LlkOptimState* st = reinterpret_cast<LlkOptimState*>(p.state);
  const double scale = double(st->loss_scale);
  const double norm = sqrt(total) / scale;  // of the unscaled gradients
  const bool found_inf = !isfinite(total) || !isfinite(norm);
  double clip = 1.0;
  if (p.max_norm > 0.f && !found_inf) clip = fmin(1.0, double(p.max_norm) / (norm + 1e-6));
  st->grad_norm = float(norm);
  st->found_inf = found_inf ? 1 : 0;
  st->clip_coef = float(clip / scale);
  if (found_inf) {
    st->loss_scale = float(scale * double(p.backoff));
    st->growth_tracker = 0;
  } else {
    st->step += 1;
    if (p.growth_interval > 0 && ++st->growth_tracker >= p.growth_interval) {
      st->loss_scale = float(scale * double(p.growth));
      st->growth_tracker = 0;
    }
  }
}

__device__ void optim_adamw_kernel(const OptimizerParams& p) {
  const LlkOptimState st = *reinterpret_cast<const LlkOptimState*>(p.state);
  if (st.found_inf) return;  // block-uniform; no barriers below
  const LlkOptimChunk ch = reinterpret_cast<const LlkOptimChunk*>(p.chunks)[blockIdx.x];
  const LlkOptimSlot s = reinterpret_cast<const LlkOptimSlot*>(p.slots)[ch.slot];
  const int64_t end = ch.start + kChunk < s.numel ? ch.start + kChunk : s.numel;
  // st.step already counts this step (optim_finalize ran first).
  const double t = double(st.step);
  const float lr = p.lr_device ? *reinterpret_cast<const float*>(p.lr_device) : p.lr;
  const float step_size = float(double(lr) / (1.0 - pow(double(p.beta1), t)));
  const float bc2_sqrt = float(sqrt(1.0 - pow(double(p.beta2), t)));
  const float decay = 1.f - lr * p.weight_decay;
  float* m = reinterpret_cast<float*>(s.m);
  float* v = reinterpret_cast<float*>(s.v);
  for (int64_t i = ch.start + threadIdx.x; i < end; i += kThreads) {
    const float g = load_as_f32(s.grad, s.grad_type, i) * st.clip_coef;
    float w = s.master ? reinterpret_cast<const float*>(s.master)[i] : load_as_f32(s.param, s.param_type, i);
    w *= decay;
    const float mi = fmaf(p.beta1, m[i], (1.f - p.beta1) * g);
    const float vi = fmaf(p.beta2, v[i], (1.f - p.beta2) * g * g);
    m[i] = mi, v[i] = vi;
    w -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + p.eps));
    if (s.master) reinterpret_cast<float*>(s.master)[i] = w;
    store_from_f32(s.param, s.param_type, i, w);
  }
}

}  // namespace

// Symbols: optim_norm_partials, optim_finalize, optim_adamw.
#define OPTIMIZER_KERNELS(X)                                                                                   \
  X(optim_norm_partials, OptimizerParams, (kThreads), LLK_SMEM_NONE, (optim_norm_partials_kernel))            \
  X(optim_finalize, OptimizerParams, (kReduceThreads), LLK_SMEM_NONE, (optim_finalize_kernel))                \
  X(optim_adamw, OptimizerParams, (kThreads), LLK_SMEM_NONE, (optim_adamw_kernel))

LLK_EXPORT_KERNELS(optimizer, OPTIMIZER_KERNELS)
