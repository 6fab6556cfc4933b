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

// ---------------------------------------------------------------------------- backward
//
// Math (src/reference/rms_norm.rs, rms_norm_backward): per row, r = rsqrt(sum(x^2) / H + eps),
// g = dy * w, dx = r g - x r^3 sum(g x) / H (+ d_residual), dw += (dy x) r. x is the forward's
// input (for the fused variant, the sum it stored); r is recomputed from it, so the forward saves
// nothing. Both row sums (x^2 and g x) are f32 and reduced together.
//
// Grid mapping: blockDim.x = tpr threads (32 to LLK_RMS_NORM_BWD_THREADS, a multiple of 32) own one
// row at a time: thread tx the vectors tx, tx + tpr, ... (at most kBwdCache, 4 vectors of 16 bytes
// or 8 elements on the scalar path, all in registers: x
// and dy are read once); block b takes rows [b c, (b + 1) c) in order, c = rows_per_block, and
// keeps dw's f32 sums for its columns in registers, written once as partial row b. The reduce
// kernel adds the partial rows in block order. Deterministic: no atomics, fixed orders.
//
// Bytes: reads x, dy (and d_residual) once, writes dx once: 3 (or 4) * rows * H * sizeof(T), plus
// blocks * H * 4 twice for the dw partials.

constexpr int kBwdThreads = LLK_RMS_NORM_BWD_THREADS;

template <class T, int VEC, bool RESIDUAL>
__device__ void rms_norm_backward_kernel(const RmsNormBackwardParams& p) {
  using R = Raw<T, VEC>;
  // Vectors per thread: 4 of 16 bytes, or 8 single elements on the scalar path.
  constexpr int kBwdCache = VEC == 1 ? LLK_RMS_NORM_BWD_CACHE_SCALAR : LLK_RMS_NORM_BWD_CACHE;
  __shared__ float2 partials[kBwdThreads / 32];
  const int tpr = int(blockDim.x), tx = int(threadIdx.x);
  const int64_t nvec = p.hidden / VEC;
  const T* __restrict__ w = reinterpret_cast<const T*>(p.weight);  // [hidden]
  const float inv_h = 1.f / float(p.hidden);
  float dw[kBwdCache][VEC] = {};
  const int64_t first = int64_t(blockIdx.x) * p.rows_per_block;
  const int64_t last = first + p.rows_per_block < p.rows ? first + p.rows_per_block : p.rows;
  for (int64_t row = first; row < last; ++row) {  // block-uniform trip count
    const T* x = reinterpret_cast<const T*>(p.x) + row * p.x_row_stride;     // [rows, hidden]
    const T* dy = reinterpret_cast<const T*>(p.dy) + row * p.dy_row_stride;  // [rows, hidden]
    // Every load of the row issued first (x, dy and the weights), then converted.
    typename R::type rx[kBwdCache], rdy[kBwdCache], rw[kBwdCache];
#pragma unroll
    for (int c = 0; c < kBwdCache; ++c) {
      const int64_t v = tx + int64_t(c) * tpr;
      const bool in = v < nvec;
      rx[c] = in ? R::load(x + v * VEC) : R::zero();
      rdy[c] = in ? R::load(dy + v * VEC) : R::zero();
      rw[c] = in ? R::load_readonly(w + v * VEC) : R::zero();
    }
    // x as f32 stays; g = dy * w is formed again from the raw words where it is needed (the
    // 16-byte path would otherwise exceed 128 registers at 512 threads).
    float xs[kBwdCache][VEC];
    float ss = 0.f, gx = 0.f;
#pragma unroll
    for (int c = 0; c < kBwdCache; ++c) {
      float d[VEC], wt[VEC];
      R::unpack(rx[c], xs[c]);
      R::unpack(rdy[c], d);
      R::unpack(rw[c], wt);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        ss = fmaf(xs[c][i], xs[c][i], ss);  // zeros past the row add 0
        gx = fmaf(d[i] * wt[i], xs[c][i], gx);
      }
    }
    // Both sums over the row: butterflies in each warp, then the warps' partials in warp order.
    ss = llk::warp_sum(ss), gx = llk::warp_sum(gx);
    if ((tx & 31) == 0) partials[tx / 32] = make_float2(ss, gx);
    __syncthreads();
    ss = 0.f, gx = 0.f;
    for (int wp = 0; wp < tpr / 32; ++wp) ss += partials[wp].x, gx += partials[wp].y;
    __syncthreads();  // every thread has read the partials before the next row writes them
    const float r = rsqrtf(ss * inv_h + p.eps);
    const float k = r * r * r * gx * inv_h;
    T* dx = reinterpret_cast<T*>(p.dx) + row * p.dx_row_stride;  // [rows, hidden]
    const T* dres = RESIDUAL ? reinterpret_cast<const T*>(p.d_residual) + row * p.d_residual_row_stride : nullptr;
#pragma unroll
    for (int c = 0; c < kBwdCache; ++c) {
      const int64_t v = tx + int64_t(c) * tpr;
      if (v >= nvec) continue;
      float d[VEC], wt[VEC], out[VEC];
      R::unpack(rdy[c], d);
      R::unpack(rw[c], wt);
#pragma unroll
      for (int i = 0; i < VEC; ++i) {
        out[i] = fmaf(r, d[i] * wt[i], -k * xs[c][i]);
        dw[c][i] = fmaf(d[i] * xs[c][i], r, dw[c][i]);
      }
      if constexpr (RESIDUAL) {
        float dr[VEC];
        R::unpack(R::load(dres + v * VEC), dr);
#pragma unroll
        for (int i = 0; i < VEC; ++i) out[i] += dr[i];
      }
      llk::store_f32<T, VEC>(dx + v * VEC, out);
    }
  }
  if (p.dw_partial == 0) return;
  float* part = reinterpret_cast<float*>(p.dw_partial) + int64_t(blockIdx.x) * p.hidden;  // [blocks, hidden]
#pragma unroll
  for (int c = 0; c < kBwdCache; ++c) {
    const int64_t v = tx + int64_t(c) * tpr;
    if (v >= nvec) continue;
    if constexpr (VEC % 4 == 0) {  // 16-byte stores of f32
#pragma unroll
      for (int h = 0; h < VEC; h += 4) {
        const float q[4] = {dw[c][h], dw[c][h + 1], dw[c][h + 2], dw[c][h + 3]};
        llk::store_f32<float, 4>(part + v * VEC + h, q);
      }
    } else {
      llk::store_f32<float, VEC>(part + v * VEC, dw[c]);
    }
  }
}

// dw[j] (+)= sum over b of dw_partial[b, j], in block order; one column per thread.
__device__ void rms_norm_dw_reduce_kernel(const RmsNormBackwardParams& p) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= p.hidden) return;
  const float* part = reinterpret_cast<const float*>(p.dw_partial);  // [blocks, hidden]
  float sum = 0.f;
  for (int64_t b = 0; b < p.blocks; ++b) sum += part[b * p.hidden + j];
  float* dw = reinterpret_cast<float*>(p.dw);  // [hidden]
  dw[j] = p.accumulate ? dw[j] + sum : sum;
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
  X(fused_add_rms_norm_vec_bf16, RmsNormParams, (kMaxThreadsFused), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 8, true>)) \
  RMS_NORM_BACKWARD_KERNELS(X)

// Backward symbols: rms_norm_backward[_residual][_vec]_<dtype> (`_residual` adds d_residual to dx),
// and rms_norm_dw_reduce (f32).
#define RMS_NORM_BACKWARD_DTYPE(X, suffix, T, V)                                                              \
  X(rms_norm_backward_##suffix, RmsNormBackwardParams, (kBwdThreads), LLK_SMEM_NONE, (rms_norm_backward_kernel<T, 1, false>)) \
  X(rms_norm_backward_vec_##suffix, RmsNormBackwardParams, (kBwdThreads), LLK_SMEM_NONE, (rms_norm_backward_kernel<T, V, false>)) \
  X(rms_norm_backward_residual_##suffix, RmsNormBackwardParams, (kBwdThreads), LLK_SMEM_NONE, (rms_norm_backward_kernel<T, 1, true>)) \
  X(rms_norm_backward_residual_vec_##suffix, RmsNormBackwardParams, (kBwdThreads), LLK_SMEM_NONE, (rms_norm_backward_kernel<T, V, true>))
#define RMS_NORM_BACKWARD_KERNELS(X)                        \
  RMS_NORM_BACKWARD_DTYPE(X, f32, float, 4)                 \
  RMS_NORM_BACKWARD_DTYPE(X, f16, __half, 8)                \
  RMS_NORM_BACKWARD_DTYPE(X, bf16, __nv_bfloat16, 8)        \
  X(rms_norm_dw_reduce, RmsNormBackwardParams, (LLK_RMS_NORM_DW_THREADS), LLK_SMEM_NONE, (rms_norm_dw_reduce_kernel))

LLK_EXPORT_KERNELS(rms_norm, RMS_NORM_KERNELS)
