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

constexpr int kCache = 4;       // vectors per thread kept in registers
constexpr int kMaxThreads = 1024;

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

template <class T, int VEC, bool FUSED>
__device__ void rms_norm_kernel(const RmsNormParams& p) {
  __shared__ float warp_partials[kMaxThreads / 32];
  const int tpr = int(blockDim.x);
  const int tx = int(threadIdx.x);
  const int64_t row = int64_t(blockIdx.x) * blockDim.y + threadIdx.y;
  const bool valid = row < p.rows;  // no early return: every thread takes part in the reduction
  const int64_t nvec = p.hidden / VEC;

  const T* x = reinterpret_cast<const T*>(p.x) + (valid ? row * p.x_row_stride : 0);
  T* res = FUSED ? reinterpret_cast<T*>(p.residual) + (valid ? row * p.residual_row_stride : 0) : nullptr;
  const T* __restrict__ w = reinterpret_cast<const T*>(p.weight);
  T* y = reinterpret_cast<T*>(p.y) + (valid ? row * p.y_row_stride : 0);

  // Pass 1: load (and for FUSED form, round and store the sum), accumulate squares.
  // Returns the values the norm applies to.
  auto load_input = [&](int64_t v, float (&out)[VEC]) {
    llk::load_f32<T, VEC>(x + v * VEC, out);
    if constexpr (FUSED) {
      float r[VEC];
      llk::load_f32<T, VEC>(res + v * VEC, r);
#pragma unroll
      for (int i = 0; i < VEC; ++i) out[i] += r[i];
      llk::round_to<T, VEC>(out);
      llk::store_f32<T, VEC>(res + v * VEC, out);
    }
  };
  float cache[kCache][VEC] = {};  // zero-initialized: predicated loads otherwise leave ptxas a local-memory array
  float ss = 0.f;
  if (valid) {
#pragma unroll
    for (int c = 0; c < kCache; ++c) {
      const int64_t v = tx + int64_t(c) * tpr;
      if (v < nvec) {
        load_input(v, cache[c]);
#pragma unroll
        for (int i = 0; i < VEC; ++i) ss = fmaf(cache[c][i], cache[c][i], ss);
      }
    }
    for (int64_t v = tx + int64_t(kCache) * tpr; v < nvec; v += tpr) {
      float t[VEC];
      load_input(v, t);
#pragma unroll
      for (int i = 0; i < VEC; ++i) ss = fmaf(t[i], t[i], ss);
    }
  }
  ss = row_sum(ss, warp_partials);
  const float inv_rms = rsqrtf(ss / float(p.hidden) + p.eps);
  if (!valid) return;

  // Pass 2: scale by inv_rms and the weight, store.
  auto store_output = [&](int64_t v, const float (&in)[VEC]) {
    float wt[VEC], out[VEC];
    llk::load_f32_readonly<T, VEC>(w + v * VEC, wt);  // the weight is never written (checked on the host)
#pragma unroll
    for (int i = 0; i < VEC; ++i) out[i] = in[i] * inv_rms * wt[i];
    llk::store_f32<T, VEC>(y + v * VEC, out);
  };
#pragma unroll
  for (int c = 0; c < kCache; ++c) {
    const int64_t v = tx + int64_t(c) * tpr;
    if (v < nvec) store_output(v, cache[c]);
  }
  for (int64_t v = tx + int64_t(kCache) * tpr; v < nvec; v += tpr) {
    float t[VEC];  // the tail was not cached: re-read it (the sum for FUSED, as stored)
    llk::load_f32<T, VEC>((FUSED ? static_cast<const T*>(res) : x) + v * VEC, t);
    store_output(v, t);
  }
}

}  // namespace

// Symbols: [fused_add_]rms_norm[_vec]_<dtype>. `_vec` is the 16-byte path; the plain name is the
// any-shape fallback.
#define RMS_NORM_KERNELS(X)                                                                       \
  X(rms_norm_f32, RmsNormParams, (kMaxThreads), (rms_norm_kernel<float, 1, false>))               \
  X(rms_norm_f16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__half, 1, false>))              \
  X(rms_norm_bf16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__nv_bfloat16, 1, false>))      \
  X(rms_norm_vec_f32, RmsNormParams, (kMaxThreads), (rms_norm_kernel<float, 4, false>))           \
  X(rms_norm_vec_f16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__half, 8, false>))          \
  X(rms_norm_vec_bf16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__nv_bfloat16, 8, false>))  \
  X(fused_add_rms_norm_f32, RmsNormParams, (kMaxThreads), (rms_norm_kernel<float, 1, true>))      \
  X(fused_add_rms_norm_f16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__half, 1, true>))     \
  X(fused_add_rms_norm_bf16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__nv_bfloat16, 1, true>)) \
  X(fused_add_rms_norm_vec_f32, RmsNormParams, (kMaxThreads), (rms_norm_kernel<float, 4, true>))  \
  X(fused_add_rms_norm_vec_f16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__half, 8, true>)) \
  X(fused_add_rms_norm_vec_bf16, RmsNormParams, (kMaxThreads), (rms_norm_kernel<__nv_bfloat16, 8, true>))

LLK_EXPORT_KERNELS(rms_norm, RMS_NORM_KERNELS)
