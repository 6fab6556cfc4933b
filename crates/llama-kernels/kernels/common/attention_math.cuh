// attention_math.cuh -- the attention math prefill (attention.cu) and decode
// (paged_attention.cu) share, written once over the variant struct both params structs embed
// (LlkAttnVariant in params.h).
//
// * Which keys a query sees: the query at absolute position `pos` of a sequence of `k_len` keys
//   attends the interval [lo, hi] (hi < lo: none): every key (LLK_ATTN_NONE), keys up to pos
//   (causal, bottom-right aligned), or from the start of pos's chunk up to pos (Llama 4's
//   chunked local attention). Sequence lengths are i32, so key indices fit in int.
// * The score scale, in the base-2 domain the online softmax works in: scale * log2(e), times
//   Llama 4's temperature log(floor((pos + 1) / floor_scale) + 1) * attn_scale + 1 on NoPE
//   layers (p < 0 counts as 0), times K's dequantization scale (fp8 pages; 1 otherwise).
// * The online softmax: one row's state (running maximum and sum), its step per tile or key,
//   the merge of two partial states, the normalizer and the log-sum-exp.
// * The natural-log constants the LSE output is converted with.
#pragma once

#include "llk.cuh"

namespace llk {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;

struct KeyInterval {
  int lo, hi;
  __device__ bool contains(int key) const { return key >= lo && key <= hi; }
};

// The first key of the chunk that holds position `pos` (chunked mask), else 0.
__device__ __forceinline__ int64_t chunk_start(const LlkAttnVariant& v, int64_t pos) {
  return v.mask == LLK_ATTN_CHUNKED_CAUSAL && pos > 0 ? (pos / v.chunk_size) * v.chunk_size : 0;
}

__device__ __forceinline__ KeyInterval key_interval(const LlkAttnVariant& v, int64_t pos, int64_t k_len) {
  KeyInterval iv{0, int(k_len) - 1};
  if (v.mask != LLK_ATTN_NONE) iv.hi = int(min(pos, k_len - 1));  // pos < 0: hi < 0 <= lo, nothing
  if (v.mask == LLK_ATTN_CHUNKED_CAUSAL && pos > 0) iv.lo = int(chunk_start(v, pos));
  return iv;
}

__device__ __forceinline__ float score_scale_log2(const LlkAttnVariant& v, int64_t pos, float k_scale) {
  float s = v.scale * kLog2e * k_scale;
  if (v.temperature == LLK_ATTN_LLAMA4_TEMPERATURE) {
    const float q = floorf(float(max(pos, int64_t(0)) + 1) / v.temp_floor_scale);
    s *= logf(q + 1.f) * v.temp_attn_scale + 1.f;
  }
  return s;
}

// ------------------------------------------------------------------------- the online softmax
// One query row's softmax over keys that arrive a tile (or, on the SIMT paths, a key) at a time,
// in base 2: scores are scaled by score_scale_log2, so exp2 of a scaled score is e^(scale * s).
// The state is the running maximum m of the scaled scores and the running sum l of their
// exp2(s - m); O, kept by the kernel, is the matching sum of exp2(s - m) * v. When the maximum
// grows, l and O are rescaled by corr = exp2(m_old - m_new). At the end O / l is the output and
// m + log2(l) the row's log-sum-exp.
//
// * A row that has seen no allowed key has m = -inf; its exponentials are taken against base 0,
//   so a masked score (-inf) weighs exactly 0 and no -inf - -inf NaN appears.
// * corr is exactly 1 when the maximum did not move, so a kernel may skip multiplying O by it
//   (after the first tiles it rarely moves) without changing a bit.
// * In the tensor-core kernels a row's keys are spread over the four lanes of a quad: the tile
//   maximum is reduced across the quad before `update`, so m is the same in the four lanes, and
//   each lane's l sums its own keys until `quad_total`.
// * Precision: f32 throughout. The tensor-core paths take exponentials with ex2.approx (their
//   weights are rounded to 16 bits for the P V product anyway); the f32 SIMT paths with exp2f.

// What one tile's update tells the kernel: the base its exponentials subtract, the factor O
// takes, and whether the maximum moved (corr != 1).
struct SoftmaxStep {
  float base, corr;
  bool moved;
  // The weight of a raw score s of the tile, with the row's base-2 scale: one fma and one ex2.
  __device__ __forceinline__ float weight(float s, float scale) const { return fast_exp2(fmaf(s, scale, -base)); }
};

// One key on the SIMT paths: O = O * corr + p * v.
struct KeyStep {
  float corr, p;
};

// Merging two partial states of one row (the same row's keys split between warps): O takes
// `self` times its own accumulator plus `other` times the other's.
struct MergeFactors {
  float self, other;
};

struct SoftmaxState {
  float m = -INFINITY;  // running maximum of the scaled scores
  float l = 0.f;        // running sum of exp2(score - m) (this lane's keys, in a quad)

  __device__ __forceinline__ static float base_of(float m) { return m == -INFINITY ? 0.f : m; }

  // A tile whose largest scaled score is `tile_max` (-inf where every key is masked). l is
  // rescaled; the caller adds the tile's weights to l and rescales O by the step's corr.
  __device__ __forceinline__ SoftmaxStep update(float tile_max) {
    const float m_new = fmaxf(m, tile_max);
    SoftmaxStep st;
    st.base = base_of(m_new);
    st.moved = m_new != m;
    st.corr = st.moved ? fast_exp2(m - st.base) : 1.f;
    m = m_new;
    l *= st.corr;
    return st;
  }

  // One scaled score x (-inf: masked), the SIMT paths' step: l takes its weight.
  __device__ __forceinline__ KeyStep add_key(float x) {
    const float m_new = fmaxf(m, x);
    const float base = base_of(m_new);
    const KeyStep k{exp2f(m - base), exp2f(x - base)};
    l = l * k.corr + k.p;
    m = m_new;
    return k;
  }

  // Absorbs another partial state of the same row.
  __device__ __forceinline__ MergeFactors merge(const SoftmaxState& other) {
    const float m_new = fmaxf(m, other.m);
    const float base = base_of(m_new);
    const MergeFactors f{fast_exp2(m - base), fast_exp2(other.m - base)};
    m = m_new;
    l = l * f.self + other.l * f.other;
    return f;
  }

  // The row's state with l summed over the four lanes of its quad (every lane of the warp
  // must call it).
  __device__ __forceinline__ SoftmaxState quad_total() const {
    SoftmaxState t = *this;
    t.l += __shfl_xor_sync(0xffffffffu, t.l, 1);
    t.l += __shfl_xor_sync(0xffffffffu, t.l, 2);
    return t;
  }

  // The factor that turns O into the output, times `v_scale` (V's dequantization scale): 0 for
  // a row that saw no key (its output is zeros); a NaN sum (a non-finite score) stays NaN.
  __device__ __forceinline__ float normalizer(float v_scale = 1.f) const { return l == 0.f ? 0.f : v_scale / l; }

  // The row's natural-log log-sum-exp: -inf for a row that saw no key.
  __device__ __forceinline__ float lse() const { return l == 0.f ? -INFINITY : (m + log2f(l)) * kLn2; }
};

}  // namespace llk
