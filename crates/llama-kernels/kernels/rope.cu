// rope.cu -- rotary position embedding of q and k, in place, in one launch (Llama 3 and Llama 4).
//
// Math (the spec is src/reference/rope.rs, in f64): for each token t at position p = positions[t]
// and each rotary pair i < rotary_dim / 2 with inverse frequency f_i,
//   (a, b) <- (a cos(p f_i) - b sin(p f_i),  b cos(p f_i) + a sin(p f_i))
// where the pair is (2i, 2i+1) for LLK_ROPE_INTERLEAVED (Meta's complex form) and
// (i, i + rotary_dim/2) for LLK_ROPE_HALF_SPLIT (Hugging Face rotate_half, NeoX). Dims from
// rotary_dim to head_dim pass through. With LLK_ROPE_L2_NORM (Llama 4 qk_norm), each rotated head
// is then scaled by rsqrt(mean(x^2) + eps) over all head_dim values, from the unrounded f32 values.
//
// Backward (LLK_ROPE_BACKWARD; q and k hold the gradients dy, overwritten by dx). A rotation's
// transpose is the rotation by the negated angle, and the angle below is exactly odd in it, so the
// plain backward is this kernel with sin negated. With the qk-norm, y = s z, z = R x and
// s = rsqrt(mean(z^2) + eps): the kernel recomputes z from the forward's saved input x, then
//   dz = s dy - s^3 z mean(z dy),   dx = R^T dz
// with both sums over all head_dim values, in f32, rounded once.
//
// Angles. f_i (theta^(-2i/rotary_dim), Llama 3.1 scaling applied) comes from an f64 table on the
// host, as a double-float pair hi + lo. A plain f32 product p * f_i loses the angle at large
// positions: at p = 131071 the product is ~1e5 rad and its f32 ulp is 0.008 rad. Instead the
// angle is formed as a double-float (p split into hi + lo, the hi * hi product split exactly by
// an fma), reduced modulo pi/2 with a double-float pi/2, and only the reduced angle |r| <= pi/4
// goes through the sin/cos polynomials. Error bound: the reduced angle is within ~1e-7 rad of
// (p f_i mod pi/2) for |p| < 2^24, and the polynomials add ~1 ulp; a unit pair is rotated to
// within 3e-7 of the exact result (tests sweep positions up to 2^24 - 1 against f64; 7e-8 seen).
// Positions beyond +-(2^24 - 1) (LLK_ROPE_MAX_POSITION) are clamped to it.
// Cost: ~30 flops per (token, pair), computed once per block and shared by all heads of the token.
//
// Grid mapping: grid.x = tokens, grid.y = head groups (1, or more when few tokens would leave
// SMs idle); blockDim.x = G threads per head (a power of two <= 32), blockDim.y = heads at once.
// The block computes each (token, pair) angle once into shared memory (its threads split the
// pairs), then every thread reads the cos/sin of its own chunks into registers. A thread owns the
// same `chunks` of every head (a chunk is VEC consecutive elements, plus for half-split the
// matching VEC elements of the second half), and walks over the q heads then the k heads with the
// next head's loads issued before the current head's stores retire. The head loop has a
// block-uniform trip count, so the norm's shuffles never diverge. The qk-norm is a template
// parameter: the plain kernels carry none of its instructions.
//
// Vectors: VEC = 16 / sizeof(T) (one 128-bit access) when the rotary chunks, pointers and strides
// allow; otherwise VEC = 2 (interleaved) or 1 (half-split).
#include "common/llk.cuh"

namespace {

// Threads per block (the host plans G * heads_at_once <= this). 256 leaves ptxas up to 255
// registers: cos/sin and the pairs of 8 rotary pairs live in registers without spilling.
constexpr int kMaxThreads = LLK_ROPE_MAX_THREADS;

// pi/2 as a double-float (hi + lo), and 2/pi.
constexpr float kPiO2Hi = 1.57079637050628662f;
constexpr float kPiO2Lo = -4.37113900018624283e-8f;
constexpr float kTwoOverPi = 0.636619772367581343f;

// cos and sin of p * (f.x + f.y). The product is formed as a double-float, reduced modulo pi/2
// with a double-float pi/2 (k * hi split exactly by an fma), and the reduced angle |r| <= pi/4
// goes through minimax polynomials (Cephes sinf/cosf coefficients, ~1 ulp on [-pi/4, pi/4]); the
// quadrant k mod 4 picks signs and swaps. No sincosf: its large-argument path needs local memory.
__device__ __forceinline__ void rope_cos_sin(int64_t pos, float2 f, float& c, float& s) {
  // The __fmul_rn/__fadd_rn below are not style: they forbid nvcc/ptxas from contracting a
  // multiply into a following add (FMA). `a_hi - t_hi` contracted into fma(-k, hi, a_hi) would use
  // the exact k * hi while t_lo already holds its rounding error, counting it twice (0.5 rad at
  // p = 2^24). Contracting the other products into fmas only makes them more exact.
  const float p_hi = float(pos);
  const float p_lo = float(pos - int64_t(p_hi));  // exact for |pos| < 2^48
  const float a_hi = __fmul_rn(p_hi, f.x);
  const float a_lo = fmaf(p_hi, f.x, -a_hi) + (p_hi * f.y + p_lo * f.x);
  float k = rintf(a_hi * kTwoOverPi);
  const float t_hi = __fmul_rn(k, kPiO2Hi);
  const float t_lo = fmaf(k, kPiO2Hi, -t_hi) + k * kPiO2Lo;
  float r = __fadd_rn(__fadd_rn(a_hi, -t_hi), __fadd_rn(a_lo, -t_lo));  // a_hi - t_hi is exact (Sterbenz)
  // Above 2^22 the f32 quotient a_hi * 2/pi can round k off by one, leaving |r| up to 3 pi / 4:
  // one more (exact) step brings r back to [-pi/4, pi/4].
  const float k2 = rintf(r * kTwoOverPi);
  r = (r - k2 * kPiO2Hi) - k2 * kPiO2Lo;
  k += k2;
  const float r2 = r * r;
  const float sr = fmaf(r * r2, fmaf(r2, fmaf(r2, -1.9515295891e-4f, 8.3321608736e-3f), -1.6666654611e-1f), r);
  const float cr = fmaf(r2 * r2, fmaf(r2, fmaf(r2, 2.443315711809948e-5f, -1.388731625493765e-3f), 4.166664568298827e-2f),
                        fmaf(-0.5f, r2, 1.f));
  switch (int(int64_t(k) & 3)) {
    case 0: s = sr, c = cr; break;
    case 1: s = cr, c = -sr; break;
    case 2: s = -sr, c = -cr; break;
    default: s = -cr, c = sr; break;
  }
}

template <LlkRopeLayout LAYOUT, int VEC>
struct Chunking {
  // Rotary pairs in one chunk, and the chunk cap that keeps a thread at <= 8 pairs (cos, sin and
  // the pair itself in registers: 32 floats). With at most 32 threads per head this bounds
  // rotary_dim at 512 on every path (checked on the host).
  static constexpr int kPairs = LAYOUT == LLK_ROPE_INTERLEAVED ? VEC / 2 : VEC;
  static constexpr int kMaxChunks = kPairs >= 8 ? 1 : 8 / kPairs;
  // Pair index of slot j of chunk c.
  __device__ static int64_t pair(int64_t c, int j) { return c * kPairs + j; }
};

// Most rotary pairs per token (rotary_dim <= 512, checked on the host).
constexpr int kMaxPairs = 256;

// What a kernel computes: the rotation (forward, or with LLK_ROPE_BACKWARD its transpose), the
// rotation then the qk-norm, or the backward of that pair.
enum class Variant { kRotate, kNorm, kNormBackward };

template <class T, int VEC, LlkRopeLayout LAYOUT, Variant V>
__device__ void rope_kernel(const RopeParams& p) {
  using C = Chunking<LAYOUT, VEC>;
  constexpr bool NORM = V != Variant::kRotate;
  constexpr bool BACKWARD_NORM = V == Variant::kNormBackward;
  __shared__ float2 s_cos_sin[kMaxPairs];  // (cos, sin) of every pair of this token
  const int g = int(blockDim.x);
  const int tx = int(threadIdx.x);
  const int tid = int(threadIdx.y) * g + tx, nthreads = g * int(blockDim.y);
  const int64_t token = blockIdx.x;
  const int64_t half = p.rotary_dim / 2;
  const int64_t nchunks = LAYOUT == LLK_ROPE_INTERLEAVED ? p.rotary_dim / VEC : half / VEC;
  const int64_t nheads = p.q_heads + p.kv_heads;
  // Heads are split over blockIdx.y (the host uses several y-blocks per token when there are few
  // tokens); the trip count is block-uniform, so barriers and the norm's shuffles never diverge.
  const int64_t head_step = int64_t(gridDim.y) * blockDim.y;

  // lo/hi: the pairs of the rotated tensor (q/k, or dq/dk in the backward); xlo/xhi: the pairs of
  // the forward's saved input (the norm's backward only; otherwise never touched, so no registers).
  float lo[C::kMaxChunks][C::kPairs] = {}, hi[C::kMaxChunks][C::kPairs] = {};
  float xlo[BACKWARD_NORM ? C::kMaxChunks : 1][C::kPairs] = {}, xhi[BACKWARD_NORM ? C::kMaxChunks : 1][C::kPairs] = {};
  // Head h of q (h < q_heads, [tokens, q_heads, head_dim]) or k ([tokens, kv_heads, head_dim]).
  auto head_at = [&](uint64_t q, int64_t q_ts, int64_t q_hs, uint64_t k, int64_t k_ts, int64_t k_hs, int64_t h) -> T* {
    return h < p.q_heads ? reinterpret_cast<T*>(q) + token * q_ts + h * q_hs
                         : reinterpret_cast<T*>(k) + token * k_ts + (h - p.q_heads) * k_hs;
  };
  auto head_ptr = [&](int64_t h) {
    return head_at(p.q, p.q_token_stride, p.q_head_stride, p.k, p.k_token_stride, p.k_head_stride, h);
  };
  auto saved_ptr = [&](int64_t h) -> const T* {
    return head_at(p.q_saved, p.q_saved_token_stride, p.q_saved_head_stride, p.k_saved, p.k_saved_token_stride,
                   p.k_saved_head_stride, h);
  };
  // This thread's chunks of one head into a/b (first and second element of each pair).
  auto load_pairs = [&](const T* x, auto& a, auto& b) {
#pragma unroll
    for (int c = 0; c < C::kMaxChunks; ++c) {
      const int64_t chunk = tx + int64_t(c) * g;
      if (chunk >= nchunks) continue;
      if constexpr (LAYOUT == LLK_ROPE_INTERLEAVED) {
        float v[VEC];
        llk::load_f32<T, VEC>(x + chunk * VEC, v);
#pragma unroll
        for (int j = 0; j < C::kPairs; ++j) a[c][j] = v[2 * j], b[c][j] = v[2 * j + 1];
      } else {
        llk::load_f32<T, VEC>(x + chunk * VEC, a[c]);
        llk::load_f32<T, VEC>(x + half + chunk * VEC, b[c]);
      }
    }
  };
  auto load_head = [&](int64_t h) {
    if (h >= nheads) return;
    load_pairs(head_ptr(h), lo, hi);
    if constexpr (BACKWARD_NORM) load_pairs(saved_ptr(h), xlo, xhi);
  };
  // The first head's loads go out before the trigonometry, which hides their latency.
  int64_t h = int64_t(blockIdx.y) * blockDim.y + threadIdx.y;
  load_head(h);

  // cos/sin once per (token, pair), shared by every head of the block: each thread computes a
  // distinct share of the pairs (no head recomputes another's angles), then keeps its own chunks'
  // values in registers for all its heads. The plain backward is the forward at the negated
  // angle (the kernel's angle is exactly odd in it: sin flips sign, cos does not).
  {
    const int64_t raw_pos = p.position_type == LLK_INDEX_I64 ? reinterpret_cast<const int64_t*>(p.positions)[token]
                                                             : int64_t(reinterpret_cast<const int32_t*>(p.positions)[token]);
    // Outside the accurate domain, clamp (a rotation at the clamped angle, never a non-rotation;
    // and no float-to-int conversion out of range, which host C++ leaves undefined).
    const int64_t pos = raw_pos > LLK_ROPE_MAX_POSITION ? int64_t(LLK_ROPE_MAX_POSITION)
                        : raw_pos < -LLK_ROPE_MAX_POSITION ? -int64_t(LLK_ROPE_MAX_POSITION)
                                                            : raw_pos;
    const bool transpose = V == Variant::kRotate && p.direction == LLK_ROPE_BACKWARD;
    const float2* inv_freq = reinterpret_cast<const float2*>(p.inv_freq);  // [rotary_dim / 2] {hi, lo}
    for (int i = tid; i < int(half); i += nthreads) {  // 32-bit: half <= 256, no 64-bit division for the trip count
      float c, sn;
      rope_cos_sin(pos, inv_freq[i], c, sn);
      s_cos_sin[i] = make_float2(c, transpose ? -sn : sn);
    }
  }
  __syncthreads();
  float cs[C::kMaxChunks][C::kPairs] = {}, sn[C::kMaxChunks][C::kPairs] = {};
#pragma unroll
  for (int c = 0; c < C::kMaxChunks; ++c) {
    const int64_t chunk = tx + int64_t(c) * g;
    if (chunk >= nchunks) continue;
#pragma unroll
    for (int j = 0; j < C::kPairs; ++j) {
      const float2 v = s_cos_sin[C::pair(chunk, j)];
      cs[c][j] = v.x, sn[c][j] = v.y;
    }
  }

  for (int64_t h0 = int64_t(blockIdx.y) * blockDim.y; h0 < nheads; h0 += head_step, h += head_step) {
    const bool valid = h < nheads;
    T* x = valid ? head_ptr(h) : nullptr;
    const T* xs = BACKWARD_NORM && valid ? saved_ptr(h) : nullptr;
    // Forward: rotate this thread's chunks in registers (lo holds the first element of each pair)
    // and sum the squares for the norm. Norm backward: rotate the saved input instead (z = R x),
    // summing z.z and z.dy.
    float ss = 0.f, dot = 0.f;
#pragma unroll
    for (int c = 0; c < C::kMaxChunks; ++c) {
#pragma unroll
      for (int j = 0; j < C::kPairs; ++j) {
        if constexpr (BACKWARD_NORM) {
          const float a = xlo[c][j], b = xhi[c][j];
          xlo[c][j] = a * cs[c][j] - b * sn[c][j];
          xhi[c][j] = b * cs[c][j] + a * sn[c][j];
          ss = fmaf(xlo[c][j], xlo[c][j], fmaf(xhi[c][j], xhi[c][j], ss));
          dot = fmaf(xlo[c][j], lo[c][j], fmaf(xhi[c][j], hi[c][j], dot));
        } else {
          const float a = lo[c][j], b = hi[c][j];
          lo[c][j] = a * cs[c][j] - b * sn[c][j];
          hi[c][j] = b * cs[c][j] + a * sn[c][j];
          if constexpr (NORM) ss = fmaf(lo[c][j], lo[c][j], fmaf(hi[c][j], hi[c][j], ss));
        }
      }
    }
    // The norm's scale s = rsqrt(mean(z^2) + eps) over all head_dim values (the pass-through ones
    // are their own z), and for the backward dz = s dy - s^3 z mean(z dy): `zcoef` = s^3 mean(z dy).
    float scale = 1.f, zcoef = 0.f;
    if constexpr (NORM) {
      // Chunks past nchunks hold zeros (never loaded), so they add nothing.
      if (valid)
        for (int64_t i = p.rotary_dim + tx; i < p.head_dim; i += g) {
          const float v = llk::to_f32(BACKWARD_NORM ? xs[i] : x[i]);
          ss = fmaf(v, v, ss);
          if constexpr (BACKWARD_NORM) dot = fmaf(v, llk::to_f32(x[i]), dot);
        }
      ss = llk::group_sum(ss, g);
      scale = rsqrtf(ss / float(p.head_dim) + p.norm_eps);
      if constexpr (BACKWARD_NORM) {
        dot = llk::group_sum(dot, g);
        zcoef = scale * scale * scale * (dot / float(p.head_dim));
      }
    }
    if constexpr (BACKWARD_NORM) {
      // dz in place of dy, then dx = R^T dz: (a, b) -> (a cos + b sin, b cos - a sin).
#pragma unroll
      for (int c = 0; c < C::kMaxChunks; ++c) {
#pragma unroll
        for (int j = 0; j < C::kPairs; ++j) {
          const float a = fmaf(scale, lo[c][j], -zcoef * xlo[c][j]), b = fmaf(scale, hi[c][j], -zcoef * xhi[c][j]);
          lo[c][j] = a * cs[c][j] + b * sn[c][j];
          hi[c][j] = b * cs[c][j] - a * sn[c][j];
        }
      }
    }
    const float out_scale = BACKWARD_NORM ? 1.f : scale;  // the norm's backward applied it above
    if (valid) {
#pragma unroll
      for (int c = 0; c < C::kMaxChunks; ++c) {
        const int64_t chunk = tx + int64_t(c) * g;
        if (chunk >= nchunks) continue;
        if constexpr (LAYOUT == LLK_ROPE_INTERLEAVED) {
          float v[VEC];
#pragma unroll
          for (int j = 0; j < C::kPairs; ++j) v[2 * j] = lo[c][j] * out_scale, v[2 * j + 1] = hi[c][j] * out_scale;
          llk::store_f32<T, VEC>(x + chunk * VEC, v);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) lo[c][j] *= out_scale, hi[c][j] *= out_scale;
          llk::store_f32<T, VEC>(x + chunk * VEC, lo[c]);
          llk::store_f32<T, VEC>(x + half + chunk * VEC, hi[c]);
        }
      }
      // The pass-through dims: y = s x forward; dx = s dy - s^3 mean(z dy) x backward.
      if constexpr (BACKWARD_NORM) {
        for (int64_t i = p.rotary_dim + tx; i < p.head_dim; i += g)
          x[i] = llk::from_f32<T>(fmaf(scale, llk::to_f32(x[i]), -zcoef * llk::to_f32(xs[i])));
      } else if constexpr (NORM) {
        for (int64_t i = p.rotary_dim + tx; i < p.head_dim; i += g) x[i] = llk::from_f32<T>(llk::to_f32(x[i]) * scale);
      }
    }
    load_head(h + head_step);  // the next head's loads, before this iteration's loop overhead
  }
}

}  // namespace

// Symbols: rope_<layout>[_norm[_backward]][_vec]_<dtype>. `_vec` is the 16-byte path, `_norm` the
// Llama 4 qk-norm and `_norm_backward` its backward (template parameters: the plain kernels carry
// none of their instructions). The plain backward is the plain kernel with LLK_ROPE_BACKWARD.
#define ROPE_LAYOUT_KERNELS(X, name, LAYOUT, VARIANT, SCALAR_VEC)                                                 \
  X(rope_##name##_f32, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<float, SCALAR_VEC, LAYOUT, VARIANT>))          \
  X(rope_##name##_f16, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<__half, SCALAR_VEC, LAYOUT, VARIANT>))         \
  X(rope_##name##_bf16, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<__nv_bfloat16, SCALAR_VEC, LAYOUT, VARIANT>)) \
  X(rope_##name##_vec_f32, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<float, 4, LAYOUT, VARIANT>))               \
  X(rope_##name##_vec_f16, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<__half, 8, LAYOUT, VARIANT>))              \
  X(rope_##name##_vec_bf16, RopeParams, (kMaxThreads, 1), LLK_SMEM_NONE, (rope_kernel<__nv_bfloat16, 8, LAYOUT, VARIANT>))
#define ROPE_KERNELS(X)                                                                                   \
  ROPE_LAYOUT_KERNELS(X, interleaved, LLK_ROPE_INTERLEAVED, Variant::kRotate, 2)                          \
  ROPE_LAYOUT_KERNELS(X, half_split, LLK_ROPE_HALF_SPLIT, Variant::kRotate, 1)                            \
  ROPE_LAYOUT_KERNELS(X, interleaved_norm, LLK_ROPE_INTERLEAVED, Variant::kNorm, 2)                       \
  ROPE_LAYOUT_KERNELS(X, half_split_norm, LLK_ROPE_HALF_SPLIT, Variant::kNorm, 1)                         \
  ROPE_LAYOUT_KERNELS(X, interleaved_norm_backward, LLK_ROPE_INTERLEAVED, Variant::kNormBackward, 2)      \
  ROPE_LAYOUT_KERNELS(X, half_split_norm_backward, LLK_ROPE_HALF_SPLIT, Variant::kNormBackward, 1)

LLK_EXPORT_KERNELS(rope, ROPE_KERNELS)
