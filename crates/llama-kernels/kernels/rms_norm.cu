// rms_norm.cu -- RMSNorm and fused residual-add + RMSNorm (Llama's pre-attention/pre-MLP norm).
//
// Math (the spec is src/reference/rms_norm.rs, in f64):
//   rms_norm:            y[r, :] = x[r, :] * rsqrt(mean_j x[r, j]^2 + eps) * weight[:]
//   fused_add_rms_norm:  s = round_T(x + residual);  residual <- s;  y = rms_norm(s)
// The sum of squares, the scale and the products are f32 whatever the storage type; each output is
// rounded once to T (round to nearest even). The fused variant normalizes the rounded sum, so y is
// exactly rms_norm of what it stored. Hugging Face rounds x * rsqrt(...) to T before multiplying
// by the weight; this kernel rounds once, which is at least as accurate.
//
// Grid mapping: a row is handled by a group of `tpr = blockDim.x` threads (a power of two up to 32,
// or a multiple of 32 up to 1024); a block holds `blockDim.y` such rows (so small hidden sizes do not
// waste a big block); grid.x = ceil(rows / blockDim.y). Each thread owns the vectors
// tx, tx + tpr, tx + 2 tpr, ... of its row. The first kCache of them stay in registers between the
// reduction and the output, so x (and residual) are read from memory once; rows longer than
// kCache * tpr vectors re-read the tail.
//
// Memory-level parallelism: each thread issues all of its cached 16-byte loads (x, and residual
// when fused) before converting any, and pass 2 issues its weight loads before scaling, so several
// loads are in flight per thread (the static performance report counts back-to-back LDGs).
//
// Vectors: VEC = 16 / sizeof(T) elements (one 128-bit load) on the fast path, which the host
// selects only when hidden % VEC == 0 and every base pointer and row stride is 16-byte aligned;
// VEC = 1 is the fallback for every other shape.
//
// Reduction: butterfly shuffles within the row group, then (tpr > 32) one f32 partial per warp in
// shared memory, summed by every thread in warp order: deterministic, schedule-independent.
//
// Bytes moved per row: rms_norm reads hidden*(x) and writes hidden*(y), plus the weight (cached);
// fused_add_rms_norm reads x and residual and writes residual and y: 4 * hidden * sizeof(T).
#include "common/llk.cuh"

namespace {

constexpr int kCache = LLK_RMS_NORM_CACHE;  // vectors per thread kept in registers
// Launch bounds: the plain kernel up to 1024 threads per block; the fused kernel holds twice the
// raw loads (x and residual) in flight and is bounded at 512 threads, where it fits in registers
// without spilling (ptxas spills it at 1024). The host never plans more (RMS_NORM_MAX_THREADS_*).
constexpr int kMaxThreads = LLK_RMS_NORM_MAX_THREADS;
constexpr int kMaxThreadsFused = LLK_RMS_NORM_MAX_THREADS_FUSED;

// Sum of v over the row group of the calling thread; every thread of the group gets the total.
__device__ __forceinline__ float row_sum(float v, float* warp_partials) {
  const int tpr = int(blockDim.x);
  if (tpr <= 32) return llk::group_sum(v, tpr);
  v = llk::warp_sum(v);
  const int warps_per_row = tpr / 32;
  const int warp_in_row = int(threadIdx.x) / 32;
  const int first = int(threadIdx.y) * warps_per_row;
  if ((threadIdx.x & 31) == 0) warp_partials[first + warp_in_row] = v;
  __syncthreads();
  float total = 0.f;
  for (int w = 0; w < warps_per_row; ++w) total += warp_partials[first + w];
  return total;
}

// VEC elements of T as they lie in memory: one 128-bit word on the vector path.
template <class T, int VEC>
struct Raw {
  static constexpr bool kWide = VEC * sizeof(T) == 16;
  using type = typename std::conditional<kWide, uint4, T>::type;
  static_assert(kWide || VEC == 1, "the scalar path moves one element");
  __device__ __forceinline__ static type load(const T* p) {
    if constexpr (kWide) return *reinterpret_cast<const uint4*>(p);
    else return *p;
  }
  __device__ __forceinline__ static type load_readonly(const T* p) {
    if constexpr (kWide) return __ldg(reinterpret_cast<const uint4*>(p));
    else return __ldg(p);
  }
  __device__ __forceinline__ static type zero() {
    if constexpr (kWide) return make_uint4(0, 0, 0, 0);
    else return llk::from_f32<T>(0.f);
  }
  __device__ __forceinline__ static void unpack(const type& r, float (&out)[VEC]) {
    if constexpr (kWide) llk::load_f32<T, VEC>(reinterpret_cast<const T*>(&r), out);
    else out[0] = llk::to_f32(r);
  }
};

template <class T, int VEC, bool FUSED>
__device__ void rms_norm_kernel(const RmsNormParams& p) {
  using R = Raw<T, VEC>;
  __shared__ float warp_partials[kMaxThreads / 32];
  const int tpr = int(blockDim.x);
  const int tx = int(threadIdx.x);
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows;  // no early return: every thread takes part in the reduction
  const int64_t nvec = p.hidden / VEC;

  const T* x = reinterpret_cast<const T*>(p.x) + (valid ? row * p.x_row_stride : 0);   // [rows, hidden]
  T* res = FUSED ? reinterpret_cast<T*>(p.residual) + (valid ? row * p.residual_row_stride : 0) : nullptr;  // [rows, hidden]
  const T* __restrict__ w = reinterpret_cast<const T*>(p.weight);                      // [hidden]
  T* y = reinterpret_cast<T*>(p.y) + (valid ? row * p.y_row_stride : 0);               // [rows, hidden]

  // Pass 1. Issue every cached load first (raw 16-byte words: kCache of x, and kCache of the
  // residual when fused), then convert: up to 2 * kCache loads in flight per thread, instead of
  // one load waiting behind each conversion.
  typename R::type rx[kCache], rr[kCache];
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t v = tx + int64_t(c) * tpr;
    const bool in = valid && v < nvec;
    rx[c] = in ? R::load(x + v * VEC) : R::zero();
    if constexpr (FUSED) rr[c] = in ? R::load(res + v * VEC) : R::zero();
  }
  float cache[kCache][VEC];
  float ss = 0.f;
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    R::unpack(rx[c], cache[c]);
    if constexpr (FUSED) {
      const int64_t v = tx + int64_t(c) * tpr;
      float r[VEC];
      R::unpack(rr[c], r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) cache[c][i] += r[i];
      llk::round_to<T, VEC>(cache[c]);
      if (valid && v < nvec) llk::store_f32<T, VEC>(res + v * VEC, cache[c]);
    }
#pragma unroll
    for (int i = 0; i < VEC; ++i) ss = fmaf(cache[c][i], cache[c][i], ss);  // zeros past the row add 0
  }
  // Rows longer than kCache * tpr vectors: the tail streams through (and is re-read in pass 2).
  if (valid) {
    for (int64_t v = tx + int64_t(kCache) * tpr; v < nvec; v += tpr) {
      float t[VEC];
      R::unpack(R::load(x + v * VEC), t);
      if constexpr (FUSED) {
        float r[VEC];
        R::unpack(R::load(res + v * VEC), r);
#pragma unroll
        for (int i = 0; i < VEC; ++i) t[i] += r[i];
        llk::round_to<T, VEC>(t);
        llk::store_f32<T, VEC>(res + v * VEC, t);
      }
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss = fmaf(t[i], t[i], ss);
    }
  }
  ss = row_sum(ss, warp_partials);
  const float inv_rms = rsqrtf(ss / float(p.hidden) + p.eps);
  if (!valid) return;

  // Pass 2: the weights of the cached vectors through the read-only path, all issued first, then
  // scale and store.
  typename R::type rw[kCache];
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t v = tx + int64_t(c) * tpr;
    rw[c] = v < nvec ? R::load_readonly(w + v * VEC) : R::zero();  // never written (checked on the host)
  }
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t v = tx + int64_t(c) * tpr;
    if (v < nvec) {
      float wt[VEC], out[VEC];
      R::unpack(rw[c], wt);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] = cache[c][i] * inv_rms * wt[i];
      llk::store_f32<T, VEC>(y + v * VEC, out);
    }
  }
  for (int64_t v = tx + int64_t(kCache) * tpr; v < nvec; v += tpr) {
    float t[VEC], wt[VEC], out[VEC];  // the tail was not cached: re-read it (the sum for FUSED, as stored)
    R::unpack(R::load((FUSED ? static_cast<const T*>(res) : x) + v * VEC), t);
    R::unpack(R::load_readonly(w + v * VEC), wt);
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = t[i] * inv_rms * wt[i];
    llk::store_f32<T, VEC>(y + v * VEC, out);
  }
}

}  // namespace

// Symbols: [fused_add_]rms_norm[_vec]_<dtype>. `_vec` is the 16-byte path; the plain name is the
// any-shape fallback.
#define RMS_NORM_KERNELS(X)                                                                       \
  X(rms_norm_f32, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<float, 1, false>))               \
  X(rms_norm_f16, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<__half, 1, false>))              \
  X(rms_norm_bf16, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 1, false>))      \
  X(rms_norm_vec_f32, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<float, 4, false>))           \
  X(rms_norm_vec_f16, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<__half, 8, false>))          \
  X(rms_norm_vec_bf16, RmsNormParams, (kMaxThreads), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 8, false>))  \
  X(fused_add_rms_norm_f32, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<float, 1, true>)) \
  X(fused_add_rms_norm_f16, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<__half, 1, true>)) \
  X(fused_add_rms_norm_bf16, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 1, true>)) \
  X(fused_add_rms_norm_vec_f32, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<float, 4, true>)) \
  X(fused_add_rms_norm_vec_f16, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<__half, 8, true>)) \
  X(fused_add_rms_norm_vec_bf16, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 8, true>))

LLK_EXPORT_KERNELS(rms_norm, RMS_NORM_KERNELS)
