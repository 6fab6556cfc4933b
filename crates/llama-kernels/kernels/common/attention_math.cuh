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
// * The online softmax's step per row and tile (running maximum and sum, rescale factor).
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

// One row's online-softmax step in base 2, once the tile's scores are in: `mx` is the row's
// largest raw score of the tile (-inf where all are masked), `scale` its base-2 score scale
// (positive, so the largest raw score scales to the largest scaled one). The running maximum m
// and sum l advance (l rescaled by `corr`); the tile's weights are exp2(s * scale - base), and
// the row's O accumulator takes `corr` (exactly 1 when the maximum did not move, so skipping the
// multiply changes no bit). A row with no allowed key so far keeps base 0.
struct SoftmaxStep {
  float base, corr;
  bool moved;
};

__device__ __forceinline__ SoftmaxStep online_softmax_step(float& m, float& l, float mx, float scale) {
  const float m_new = fmaxf(m, mx * scale);
  SoftmaxStep st;
  st.base = m_new == -INFINITY ? 0.f : m_new;
  st.corr = m_new == m ? 1.f : fast_exp2(m - st.base);
  st.moved = m_new != m;
  m = m_new;
  l *= st.corr;
  return st;
}

}  // namespace llk
