// sampling.cu -- one token per row of logits: greedy, or temperature + top-k + top-p + min-p and a
// seeded inverse-CDF draw (the last step of a decode).
//
// Semantics (the spec is src/reference/sampling.rs, in f64; they follow Hugging Face
// transformers' TemperatureLogitsWarper -> TopKLogitsWarper -> TopPLogitsWarper ->
// MinPLogitsWarper, then torch.multinomial):
//   * NaN logits count as -inf; -0 as +0. A row with no logit above -inf gives token -1 and
//     raises LLK_DEVICE_NO_CANDIDATE. Parameters outside their domain (temperature negative, NaN or
//     inf; top_k < 0; top_p or min_p outside [0, 1]) give -1 and LLK_DEVICE_BAD_SAMPLING_PARAMS.
//   * temperature == 0: the argmax, ties to the lowest index (top-k/p, min-p and the RNG unused).
//   * Otherwise scores s = x / T. The sorted order is s descending, ties by lower index first.
//     Relative weights w = exp(s - max s) (w = 1 at the max, also when it is +inf).
//     top-k (0 < k < vocab): keep s >= the k-th largest score (ties at the boundary kept).
//     top-p (< 1): on the distribution of what top-k kept (total mass Z_k), keep the tokens of the
//       sorted order whose preceding mass is < top_p * Z_k (so at least one; a tie group at the
//       boundary is cut in index order).
//     min-p (> 0): drop w < min_p (prob < min_p * max prob; the max always survives).
//     Then draw from the renormalized weights of what is left: with r the 64-bit word
//     (v1 << 32 | v0) of Philox-4x32-10(counter = {offset lo, offset hi, 0, 0}, key = {seed lo,
//     seed hi}), the token is the first index (in index order) whose inclusive prefix mass
//     exceeds floor(r * Z / 2^64). A row's token depends only on its logits, parameters, seed and
//     offset, never on the batch around it.
//
// Algorithm (no sort; every pass reads the row from global memory, coalesced, and the sums are
// integers, so the result is the same under every schedule and block size):
//   1. max pass: the largest key and its lowest index (greedy stops here).
//   2. top-k: radix select on the 32-bit order-preserving key of the value, 8 bits per pass
//      (4 passes), counting each 256-bin histogram with shared-memory atomics; with top-p on the
//      same passes also histogram the mass, which gives Z_k. A count is a 32-bit increment (the
//      SASS combines a warp's lanes: ATOMS.POPC.INC); a 64-bit mass is added as two native 32-bit
//      adds with the carry passed on by the lane whose add wrapped (add_mass), because a 64-bit
//      shared-memory add is a compare-and-swap loop that a row's few crowded bins keep retrying.
//      The totals are the same integers either way.
//   3. top-p: the same radix search by mass, over keys >= the top-k boundary (4 passes), to the
//      key whose group holds the crossing, then how many of its ties are kept.
//   4. Z pass: the mass of what is kept. 5. draw pass: index order, LLK_SAMPLE_DRAW_PER_THREAD
//      consecutive elements per thread per step and one block scan per step, until the prefix
//      passes the target (on average half the row).
// Passes: greedy 1; sampling 2 to 11 (top-k and top-p both on).
//
// Grid mapping: one block per row (grid.x = batch), blockDim.x a multiple of 32 up to
// LLK_SAMPLE_MAX_THREADS (the host picks it from the vocabulary).
//
// Precision: w = exp2((x - m) * (log2(e) / T)) in f32 (exp2f: 2 ulp on the GPU, libm on the
// emulated target), so w carries a relative error of about (|x - m| / T) 2^-23 + 2^-22. Weights
// are summed as w * 2^40 truncated to integers (LLK_SAMPLE_MASS_BITS): a token with w < 2^-40 is
// never drawn (their total probability is below vocab * 2^-40 of the max token's). The draw
// target has 2^-64 resolution. min-p compares the f32 w with min_p.
#include "common/llk.cuh"
#include "common/device_error.cuh"
#include "common/philox.cuh"

namespace {

using u64 = unsigned long long;

constexpr int kMaxThreads = LLK_SAMPLE_MAX_THREADS;
constexpr int kMaxWarps = kMaxThreads / 32;
constexpr int kBins = 256;
constexpr int kPerThread = LLK_SAMPLE_DRAW_PER_THREAD;
constexpr unsigned kFull = 0xffffffffu;

struct Shared {
  uint32_t count[kBins];
  // Each bin's 64-bit mass as two 32-bit words (add_mass, bin_mass).
  uint32_t mass_lo[kBins];
  uint32_t mass_hi[kBins];
  u64 warp_u64[kMaxWarps];
  uint32_t warp_key[kMaxWarps];
  int64_t warp_idx[kMaxWarps];
  // The bin a radix level chose, and the counts and masses above and in it.
  uint32_t sel_bin;
  uint32_t sel_count_above;
  uint32_t sel_count_eq;
  u64 sel_mass_above;
  u64 sel_mass_eq;
  int64_t token;
};

// Order-preserving 32-bit key of an f32: larger value, larger key (-inf is 0x007fffff).
__device__ __forceinline__ uint32_t key_of(float x) {
  const uint32_t b = __float_as_uint(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7fffffffu) : ~k);
}

// Element i of a row as the kernel sees it: NaN -> -inf, -0 -> +0.
template <class T>
__device__ __forceinline__ float load_clean(const T* row, int64_t i) {
  const float x = llk::to_f32(row[i]);
  if (x != x) return -INFINITY;
  return x == 0.f ? 0.f : x;
}

// The relative weight w = exp((x - m) / T) of a value, in f32 and as fixed point.
struct Weigher {
  float m;      // the row's max (may be +inf)
  float scale;  // log2(e) / T (may be +inf for a tiny T)
  __device__ __forceinline__ float w(float x) const { return x >= m ? 1.f : exp2f((x - m) * scale); }
  __device__ __forceinline__ u64 fixed(float w) const { return u64(w * 0x1p40f); }
};
static_assert(LLK_SAMPLE_MASS_BITS == 40, "Weigher::fixed scales by 2^40");

__device__ __forceinline__ int nwarps() { return int(blockDim.x) >> 5; }
__device__ __forceinline__ int warp_id() { return int(threadIdx.x) >> 5; }
__device__ __forceinline__ int lane_id() { return int(threadIdx.x) & 31; }

// Sum over the block; every thread gets it. Integer: exact in any order.
__device__ u64 block_sum(u64 v, Shared& s) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(kFull, v, o);
  if (lane_id() == 0) s.warp_u64[warp_id()] = v;
  __syncthreads();
  u64 t = 0;
  for (int w = 0; w < nwarps(); ++w) t += s.warp_u64[w];
  __syncthreads();
  return t;
}

// Inclusive scan over the block in thread order; `total` gets the block's sum.
__device__ u64 block_inclusive_scan(u64 v, u64& total, Shared& s) {
  const int lane = lane_id();
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const u64 y = __shfl_up_sync(kFull, v, o);
    if (lane >= o) v += y;
  }
  if (lane == 31) s.warp_u64[warp_id()] = v;
  __syncthreads();
  u64 before = 0, all = 0;
  for (int w = 0; w < nwarps(); ++w) {
    const u64 t = s.warp_u64[w];
    if (w < warp_id()) before += t;
    all += t;
  }
  __syncthreads();
  total = all;
  return v + before;
}

// The largest key of the row and its lowest index.
template <class T>
__device__ void row_max(const T* row, int64_t vocab, Shared& s, uint32_t& key, int64_t& idx) {
  uint32_t best = 0;
  int64_t at = vocab;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const uint32_t k = key_of(load_clean(row, i));
    if (k > best) best = k, at = i;  // increasing i: the first of equal keys stays
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const uint32_t k = __shfl_xor_sync(kFull, best, o);
    const int64_t i = __shfl_xor_sync(kFull, at, o);
    if (k > best || (k == best && i < at)) best = k, at = i;
  }
  if (lane_id() == 0) s.warp_key[warp_id()] = best, s.warp_idx[warp_id()] = at;
  __syncthreads();
  best = 0, at = vocab;
  for (int w = 0; w < nwarps(); ++w) {
    const uint32_t k = s.warp_key[w];
    const int64_t i = s.warp_idx[w];
    if (k > best || (k == best && i < at)) best = k, at = i;
  }
  __syncthreads();
  key = best, idx = at;
}

// What a radix search found: the boundary key, and the count and mass of keys (>= lo) above it
// and equal to it.
struct Boundary {
  uint32_t key;
  uint32_t count_gt, count_eq;
  u64 mass_gt, mass_eq;
};

// Warp 0 picks the bin of a histogram level where the running total (from the top bin down)
// first reaches `need` (>= 1): the sum over bins above it is < need <= that sum plus the bin.
// A bin's mass.
__device__ __forceinline__ u64 bin_mass(const Shared& s, int b) { return u64(s.mass_hi[b]) << 32 | s.mass_lo[b]; }

// Adds w to bin b's mass with two 32-bit atomics (native shared-memory adds on every
// architecture, where a 64-bit shared add is a compare-and-swap loop). Exact: the low words sum
// modulo 2^32, and the low word wraps exactly once per 2^32 of the low parts' total, each time in
// the one add that crossed it, whose lane adds the carry to the high word.
__device__ __forceinline__ void add_mass(Shared& s, int b, u64 w) {
  const uint32_t lo = uint32_t(w);
  const uint32_t old = atomicAdd(&s.mass_lo[b], lo);
  const uint32_t hi = uint32_t(w >> 32) + (old + lo < old ? 1u : 0u);
  if (hi != 0) atomicAdd(&s.mass_hi[b], hi);
}

// By count (top-k) or by mass (top-p). Writes s.sel_*.
__device__ void select_bin(Shared& s, bool by_mass, u64 need) {
  const int lane = lane_id();
  uint32_t c = 0;
  u64 m = 0;
#pragma unroll
  for (int j = 0; j < 8; ++j) c += s.count[255 - 8 * lane - j], m += bin_mass(s, 255 - 8 * lane - j);
  uint32_t ci = c;
  u64 mi = m;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const uint32_t cy = __shfl_up_sync(kFull, ci, o);
    const u64 my = __shfl_up_sync(kFull, mi, o);
    if (lane >= o) ci += cy, mi += my;
  }
  const u64 incl = by_mass ? mi : u64(ci);
  const u64 excl = incl - (by_mass ? m : u64(c));
  const unsigned hit = __ballot_sync(kFull, excl < need && need <= incl);
  // No lane can miss when need <= the total; if it did (it cannot), take the lowest bin.
  const int f = hit ? __ffs(int(hit)) - 1 : 31;
  if (lane == f) {
    uint32_t ca = ci - c;
    u64 ma = mi - m;
    int bin = 255 - 8 * f - 7;
    for (int j = 0; j < 8; ++j) {
      const int b = 255 - 8 * f - j;
      const u64 a = by_mass ? bin_mass(s, b) : u64(s.count[b]);
      if ((by_mass ? ma : u64(ca)) + a >= need) {
        bin = b;
        break;
      }
      if (j < 7) ca += s.count[b], ma += bin_mass(s, b);
    }
    s.sel_bin = uint32_t(bin);
    s.sel_count_above = ca;
    s.sel_mass_above = ma;
    s.sel_count_eq = s.count[bin];
    s.sel_mass_eq = bin_mass(s, bin);
  }
}

// Radix search over the keys >= lo, 8 bits per level: the key K at which the count (by_mass
// false) or mass (true) of keys taken from the largest down first reaches `target` (>= 1).
// `with_mass` histograms the mass too (always when by_mass).
template <class T>
__device__ Boundary radix_search(const T* row, int64_t vocab, const Weigher& wt, uint32_t lo, bool by_mass,
                                 bool with_mass, u64 target, Shared& s) {
  uint32_t prefix = 0, mask = 0, count_above = 0;
  u64 mass_above = 0;
  Boundary r{};
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) s.count[b] = 0, s.mass_lo[b] = 0, s.mass_hi[b] = 0;
    __syncthreads();
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const float x = load_clean(row, i);
      const uint32_t k = key_of(x);
      if (k < lo || (k & mask) != prefix) continue;
      const int bin = int((k >> shift) & 0xffu);
      atomicAdd(&s.count[bin], 1u);
      if (with_mass) {
        const u64 w = wt.fixed(wt.w(x));
        if (w != 0) add_mass(s, bin, w);
      }
    }
    __syncthreads();
    if (warp_id() == 0) select_bin(s, by_mass, target - (by_mass ? mass_above : u64(count_above)));
    __syncthreads();
    const uint32_t bin = s.sel_bin;
    count_above += s.sel_count_above;
    mass_above += s.sel_mass_above;
    r.count_eq = s.sel_count_eq;
    r.mass_eq = s.sel_mass_eq;
    prefix |= bin << shift;
    mask |= 0xffu << shift;
    __syncthreads();  // s.sel_* and the histograms are rewritten at the next level
  }
  r.key = prefix;
  r.count_gt = count_above;
  r.mass_gt = mass_above;
  return r;
}

template <class T>
__device__ void sample_kernel(const SampleParams& p) {
  __shared__ Shared s;
  const int64_t b = blockIdx.x;
  const int64_t vocab = p.vocab;
  const T* row = reinterpret_cast<const T*>(p.logits) + b * p.logits_row_stride;
  int32_t* tokens = reinterpret_cast<int32_t*>(p.tokens);

  // Per-row parameters (every thread reads the same words).
  const float temp = reinterpret_cast<const float*>(p.temperature)[b];
  const int32_t top_k = p.top_k ? reinterpret_cast<const int32_t*>(p.top_k)[b] : 0;
  const float top_p = p.top_p ? reinterpret_cast<const float*>(p.top_p)[b] : 1.f;
  const float min_p = p.min_p ? reinterpret_cast<const float*>(p.min_p)[b] : 0.f;
  const bool bad = !(temp >= 0.f && temp <= 3.402823466e38f) || top_k < 0 || !(top_p >= 0.f && top_p <= 1.f) ||
                   !(min_p >= 0.f && min_p <= 1.f);
  if (bad) {  // uniform over the block: no barrier was passed yet
    if (threadIdx.x == 0) {
      tokens[b] = -1;
      llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_SAMPLING_PARAMS);
    }
    return;
  }

  // 1. The max and its lowest index.
  uint32_t max_key;
  int64_t argmax;
  row_max(row, vocab, s, max_key, argmax);
  if (max_key <= key_of(-INFINITY)) {  // every logit -inf or NaN
    if (threadIdx.x == 0) {
      tokens[b] = -1;
      llk::raise_device_error(p.error_flag, LLK_DEVICE_NO_CANDIDATE);
    }
    return;
  }
  if (temp == 0.f) {
    if (threadIdx.x == 0) tokens[b] = int32_t(argmax);
    return;
  }
  const Weigher wt{value_of(max_key), 1.4426950408889634f / temp};
  const bool k_on = top_k > 0 && int64_t(top_k) < vocab;
  const bool p_on = top_p < 1.f;

  // Kept: key > lo, or key == lo among the first `keep_eq` of those ties in index order (all of
  // them unless top-p cut the group), and w >= min_p.
  uint32_t lo = 0;
  u64 keep_eq = ~0ull, count_eq = 0;
  u64 mass_k = 0;  // Z_k, the mass top-k kept (top-p only)

  // 2. top-k.
  if (k_on) {
    const Boundary r = radix_search(row, vocab, wt, 0u, false, p_on, u64(top_k), s);
    lo = r.key;
    mass_k = r.mass_gt + r.mass_eq;
  } else if (p_on) {
    u64 m = 0;
    for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) m += wt.fixed(wt.w(load_clean(row, i)));
    mass_k = block_sum(m, s);
  }
  // 3. top-p: keep while the preceding mass is < top_p * Z_k, i.e. < ceil(top_p * Z_k) (>= 1).
  if (p_on) {
    u64 need = u64(ceil(double(top_p) * double(mass_k)));
    if (need < 1) need = 1;
    if (need > mass_k) need = mass_k;
    const Boundary r = radix_search(row, vocab, wt, lo, true, true, need, s);
    lo = r.key;
    count_eq = r.count_eq;
    const u64 w_eq = wt.fixed(wt.w(value_of(lo)));
    keep_eq = w_eq ? (need - r.mass_gt + w_eq - 1) / w_eq : count_eq;  // >= 1: mass_gt < need
    if (keep_eq > count_eq) keep_eq = count_eq;
  }
  const bool cut = keep_eq < count_eq;  // top-p keeps only part of the boundary's ties

  // 4. Z, the mass of what is kept.
  u64 z = 0;
  for (int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float x = load_clean(row, i);
    const float w = wt.w(x);
    if (key_of(x) >= lo && w >= min_p) z += wt.fixed(w);
  }
  z = block_sum(z, s);
  if (cut) {
    const float w_lo = wt.w(value_of(lo));
    if (w_lo >= min_p) z -= (count_eq - keep_eq) * wt.fixed(w_lo);
  }

  // 5. The draw: the first index whose inclusive prefix mass exceeds floor(r z / 2^64) < z.
  const uint64_t seed = p.seeds ? reinterpret_cast<const uint64_t*>(p.seeds)[b] : 0;
  const uint64_t offset = p.offsets ? reinterpret_cast<const uint64_t*>(p.offsets)[b] : 0;
  const llk::Philox4 rnd = llk::philox4x32_10(llk::Philox4{{uint32_t(offset), uint32_t(offset >> 32), 0u, 0u}},
                                              uint32_t(seed), uint32_t(seed >> 32));
  const u64 target = llk::mulhi64((u64(rnd.v[1]) << 32) | rnd.v[0], z);
  if (threadIdx.x == 0) s.token = -1;
  // (the barriers inside the scans order this store before any thread's write below)
  u64 running = 0, ties_before = 0;
  const int64_t step = int64_t(blockDim.x) * kPerThread;
  for (int64_t base = 0; base < vocab && running <= target; base += step) {
    const int64_t first = base + int64_t(threadIdx.x) * kPerThread;
    const int n = int(first < vocab ? (vocab - first < kPerThread ? vocab - first : kPerThread) : 0);
    // Rank of this thread's first tie of the boundary group, in index order (top-p cut only).
    u64 rank0 = 0;
    if (cut) {
      u64 my_ties = 0, all_ties;
      for (int j = 0; j < n; ++j) my_ties += key_of(load_clean(row, first + j)) == lo;
      rank0 = ties_before + block_inclusive_scan(my_ties, all_ties, s) - my_ties;
      ties_before += all_ties;
    }
    // The kept weight of element j; `rank` counts the boundary ties seen so far.
    auto weight = [&](int j, u64& rank) -> u64 {
      const float x = load_clean(row, first + j);
      const uint32_t k = key_of(x);
      const float w = wt.w(x);
      if (k < lo || !(w >= min_p)) return 0;
      if (cut && k == lo && rank++ >= keep_eq) return 0;
      return wt.fixed(w);
    };
    u64 mine = 0, rank = rank0;
    for (int j = 0; j < n; ++j) mine += weight(j, rank);
    u64 total;
    u64 before = running + block_inclusive_scan(mine, total, s) - mine;
    if (before <= target && target < before + mine) {  // exactly one thread of the block
      rank = rank0;
      for (int j = 0; j < n; ++j) {
        const u64 w = weight(j, rank);
        if (before <= target && target < before + w) s.token = first + j;
        before += w;
      }
    }
    running += total;
  }
  __syncthreads();
  if (threadIdx.x == 0) tokens[b] = int32_t(s.token >= 0 ? s.token : argmax);  // -1 cannot happen
}

}  // namespace

// Symbols: sample_<dtype>.
#define SAMPLING_KERNELS(X)                                                     \
  X(sample_f32, SampleParams, (kMaxThreads), LLK_SMEM_NONE, (sample_kernel<float>))           \
  X(sample_f16, SampleParams, (kMaxThreads), LLK_SMEM_NONE, (sample_kernel<__half>))          \
  X(sample_bf16, SampleParams, (kMaxThreads), LLK_SMEM_NONE, (sample_kernel<__nv_bfloat16>))

LLK_EXPORT_KERNELS(sampling, SAMPLING_KERNELS)
