// moe.cu -- the mixture-of-experts feed-forward on the device: routing, permutation, grouped
// expert GEMM (tensor cores), combine. Nothing here needs the host to know how many tokens each
// expert got: every size the kernels depend on is read from device memory, so a whole MoE layer
// can be captured in a CUDA graph.
//
// Pipeline (the spec is src/reference/moe.rs, f64, plain loops):
//   logits [T, E] --route--> ids [T, k] i32, weights [T, k] f32
//   ids --align--> counts [E], offsets [E + 1] (padded segment starts), rows [T k] (row of each
//                  slot s = t k + j in the expert-contiguous buffer), block_expert [blocks]
//   x [T, H] --gather--> xp [rows, H] (optionally times the slot's weight: Llama 4)
//   xp --grouped GEMM (gate_up, SwiGLU epilogue)--> h [rows, I] --grouped GEMM (down)--> y [rows, H]
//   y --combine--> out[t] = sum_j (w_tj) y[row(t, j)] (+ shared expert) (+ residual)
//
// Routing (one warp per token; expert e lives in lane e % 32, register e / 32; the k winners are
// found by k rounds of a warp-wide arg-max with shuffles, no shared memory). The order is total:
// a larger value ranks higher, equal values rank by the lower expert index, NaN ranks below every
// number (and -inf), so NaN experts are chosen only when fewer than k others exist; a row of k or
// more NaN logits picks experts 0, 1, ... in index order with NaN weights.
//   LLAMA4   select on the logits; weight = sigmoid(logit) (no softmax, no renormalization).
//   SOFTMAX  p_e = exp(l_e - max) / sum_e' exp(l_e' - max) over the non-NaN logits, in f32; the
//            top-k of p is the top-k of the logits, so selection uses the exact logits; optional
//            renormalization w_j / sum_j w_j. A NaN expert that gets chosen has weight NaN.
//   GROUPED  (DeepSeek-V3) s_e = sigmoid(l_e), choice c_e = s_e + bias_e; a group's score is the
//            sum of its two best c; the best `topk_group` of `n_group` groups stay (ties: lower
//            group), experts of the others are never chosen (as -inf, not Hugging Face's 0.0
//            fill); top-k on c; weight = s (unbiased), renormalized by (sum + 1e-20) if asked,
//            times routed_scaling_factor.
//
// Align (three launches, deterministic, no atomics on anything but the error flag). The slots are
// split into chunks of `chunk_slots` (<= 128 chunks); each of a chunk's 8 warps owns a contiguous
// range. Within 32 slots, lanes with the same expert are found by matching the id bit by bit with
// ballots; the highest such lane adds their count. (1) histogram: per-warp counts in shared
// memory, summed per chunk into chunk_counts[c][e]. (2) scan, one block: per expert, an exclusive
// scan over chunks (chunk_counts becomes each chunk's base), counts; an exclusive scan of the
// counts rounded up to block_m gives the padded offsets; block b gets the expert whose segment
// holds row b * block_m. (3) scatter: each warp's base = offsets[e] + chunk base + counts of the
// earlier warps of its chunk, and a slot's row = base + the number of earlier lanes with its
// expert. So rows are ordered by slot index (token, then j) inside each expert, whatever the
// schedule. An id outside [0, E) gets row -1 (dropped by gather and combine) and raises
// LLK_DEVICE_BAD_EXPERT_ID.
//
// Grouped GEMM: Y[r] = X[r] W[e(r)] for the rows r of every expert e, one launch. grid.x walks row
// blocks of BM rows (an upper bound on their number: blocks at or past offsets[E] exit at once),
// grid.y the output columns. A block reads its expert from block_expert and its valid rows from
// offsets and counts; other rows are zero-filled and never stored, and a warp whose rows are all
// invalid skips its mma (decode: 1-8 rows per expert cost one m16 tile per warp).
//   Tensor cores (bf16, f16): 4 warps, BM x 128 weight columns x 64 deep per stage, a 3-stage
//   (decode: 4-stage) cp.async pipeline of 16-byte copies into XOR-swizzled shared memory (16-byte
//   chunk c of row r at c ^ (r % 8)), so every ldmatrix is conflict-free; A fragments by
//   ldmatrix.x4, B by ldmatrix.x4 (nn.Linear layout [n, k]) or ldmatrix.x4.trans (x @ W layout
//   [k, n]); mma.sync.m16n8k16 with f32 accumulators. Prefill blocks are 64 rows x 128 weight
//   columns, warps 2 x 2 (32 x 64 each); decode blocks 16 rows x 64 columns, warps 1 x 4 (16 x 16
//   each: twice the blocks over the same weights, so that a single token's experts still occupy
//   the SMs). Per 16-deep k step a prefill warp issues 2 A + 4 B ldmatrix.x4 for 16 mma
//   (HMMA:LDSM 8:3); a decode warp 1 + 1 for 2 (decode streams weights: the mma are idle anyway).
//   SwiGLU epilogue: the block's weight columns are gate columns [n0, n0 + BN/2) and the same
//   up columns (packed Llama 4 gate_up_proj: up = gate + I), laid out so that each warp
//   holds matching gate and up accumulators in the same lanes: silu(g) * u is formed in registers
//   and only the [rows, I] result is stored. The output tile is staged in shared memory and
//   written with 16-byte stores (scalar stores when n is not a multiple of 8).
//   SIMT (f32): 256 threads, BM x 64 columns, 16 deep, each thread 4 (BM 64) or 1 (BM 16) rows x
//   4 columns, k accumulated in order with fmaf.
//
// Gather and combine: one block per slot (gather) or token (combine, which stages the token's k
// row indices and weights in shared memory once), 16-byte vectors along the row when the host
// found everything aligned (else one element per access). Combine accumulates
// in f32 in slot order j = 0..k-1 (then the shared expert, then the residual) and rounds once: the
// result does not depend on the schedule, and there are no atomics.
//
// Precision: routing in f32 (expf); GEMMs accumulate in f32 (tensor cores: bf16/f16 products,
// f32 sums, rounding order of the hardware); SwiGLU from the f32 accumulators, rounded once;
// gather rounds x * w once to the storage type.
#include "common/llk.cuh"
#include "common/ptx.cuh"
#include "common/device_error.cuh"

namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kNone = 0x7fffffff;  // "no expert" in a running arg-max

__device__ __forceinline__ float sigmoid(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float silu(float g) { return g / (1.f + expf(-g)); }

// ------------------------------------------------------------------------------------ routing
// Whether (va, ia) ranks above (vb, ib): larger value first, NaN below every number, ties (and
// NaN against NaN) to the lower index; kNone ranks below everything.
__device__ __forceinline__ bool ranks_above(float va, int ia, float vb, int ib) {
  if (ib == kNone) return ia != kNone;
  if (ia == kNone) return false;
  const bool na = va != va, nb = vb != vb;
  if (na != nb) return nb;
  if (!na && va != vb) return va > vb;
  return ia < ib;
}

// Warp-wide arg-max under ranks_above. The order is total, so every lane ends with the same pair.
__device__ __forceinline__ void warp_best(float& v, int& i) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(kFull, v, o);
    const int oi = __shfl_xor_sync(kFull, i, o);
    if (ranks_above(ov, oi, v, i)) v = ov, i = oi;
  }
}

// A running best-two under ranks_above.
struct Top2 {
  float v1, v2;
  int i1, i2;
  __device__ void push(float v, int i) {
    if (ranks_above(v, i, v1, i1)) {
      v2 = v1, i2 = i1, v1 = v, i1 = i;
    } else if (ranks_above(v, i, v2, i2)) {
      v2 = v, i2 = i;
    }
  }
};

template <class T, LlkMoeRouting MODE, int EPL>
__device__ void moe_route_kernel(const MoeRouteParams& p) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t token = int64_t(blockIdx.x) * LLK_MOE_ROUTE_WARPS + warp;
  if (token >= p.tokens) return;  // the whole warp: no warp operation is skipped by half of it
  const int E = int(p.experts), K = int(p.top_k);
  const T* row = reinterpret_cast<const T*>(p.logits) + token * p.logits_row_stride;
  const float* bias = reinterpret_cast<const float*>(p.bias);

  float key[EPL];    // what selection ranks: the logit, or (grouped) sigmoid + bias
  float score[EPL];  // grouped: the unbiased sigmoid score (the weight source)
  uint32_t avail = 0;  // bit i: expert lane + 32 i exists and is not chosen (or masked) yet
#pragma unroll
  for (int i = 0; i < EPL; ++i) {
    const int e = lane + 32 * i;
    float l = 0.f;
    if (e < E) {
      l = llk::to_f32(row[e]);
      avail |= 1u << i;
    }
    if constexpr (MODE == LLK_MOE_ROUTE_GROUPED) {
      score[i] = sigmoid(l);
      key[i] = score[i] + (bias != nullptr && e < E ? bias[e] : 0.f);
    } else {
      key[i] = l;
      score[i] = l;
    }
  }
  const uint32_t present = avail;

  if constexpr (MODE == LLK_MOE_ROUTE_GROUPED) {
    // Lane g ends up holding group g's score: the sum of its two best keys.
    const int groups = int(p.n_group), group_size = E / groups;
    float gscore = 0.f;
    int gid = kNone;
    for (int g = 0; g < groups; ++g) {
      Top2 t{0.f, 0.f, kNone, kNone};
#pragma unroll
      for (int i = 0; i < EPL; ++i) {
        const int e = lane + 32 * i;
        if ((avail >> i & 1u) && e / group_size == g) t.push(key[i], e);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const float v1 = __shfl_xor_sync(kFull, t.v1, o), v2 = __shfl_xor_sync(kFull, t.v2, o);
        const int i1 = __shfl_xor_sync(kFull, t.i1, o), i2 = __shfl_xor_sync(kFull, t.i2, o);
        t.push(v1, i1);
        t.push(v2, i2);
      }
      if (lane == g) gscore = t.v1 + t.v2, gid = g;  // group_size >= 2: both exist
    }
    uint32_t kept = 0;  // bit g: group g is among the best topk_group
    for (int r = 0; r < int(p.topk_group); ++r) {
      float v = gscore;
      int i = gid;
      warp_best(v, i);
      kept |= 1u << i;
      if (lane == i) gid = kNone;  // taken
    }
#pragma unroll
    for (int i = 0; i < EPL; ++i)  // present experts only: their group is below n_group <= 32
      if ((avail >> i & 1u) && !(kept >> ((lane + 32 * i) / group_size) & 1u)) avail &= ~(1u << i);
  }

  // k rounds of arg-max; the owner of each winner removes it and broadcasts its weight source.
  // Lane j keeps slot j (k <= 16 <= 32), so no register array is indexed by the slot.
  int my_id = 0;
  float my_src = 0.f, top_src = 0.f;
  for (int j = 0; j < K; ++j) {
    // This lane's best (and where it is), then the warp's.
    float lv = 0.f, ls = 0.f;
    int lbest = kNone, li = 0;
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if ((avail >> i & 1u) && ranks_above(key[i], lane + 32 * i, lv, lbest))
        lv = key[i], lbest = lane + 32 * i, ls = score[i], li = i;
    float v = lv;
    int best = lbest;
    warp_best(v, best);  // the host checked k <= the experts that can be chosen: best != kNone
    float mine = 0.f;
    if (best == lbest && best != kNone) avail &= ~(1u << li), mine = ls;  // the owner
    const float src = __shfl_sync(kFull, mine, best & 31);
    if (j == 0) top_src = src;
    if (lane == j) my_id = best, my_src = src;
  }

  float w;
  if constexpr (MODE == LLK_MOE_ROUTE_LLAMA4) {
    w = sigmoid(my_src);
  } else if constexpr (MODE == LLK_MOE_ROUTE_SOFTMAX) {
    // The top-1 logit is the maximum of the non-NaN logits (NaN only if all are NaN).
    const float mx = top_src;
    float sum = 0.f;
#pragma unroll
    for (int i = 0; i < EPL; ++i)
      if ((present >> i & 1u) && key[i] == key[i]) sum += expf(key[i] - mx);
    sum = llk::warp_sum(sum);
    w = expf(my_src - mx) / sum;
  } else {
    w = my_src;
  }
  if (p.renormalize == LLK_MOE_RENORMALIZE) {
    float total = llk::warp_sum(lane < K ? w : 0.f);
    if constexpr (MODE == LLK_MOE_ROUTE_GROUPED) total += 1e-20f;
    w /= total;
  }
  if constexpr (MODE == LLK_MOE_ROUTE_GROUPED) w *= p.routed_scaling_factor;
  if (lane < K) {
    reinterpret_cast<int32_t*>(p.ids)[token * K + lane] = my_id;
    reinterpret_cast<float*>(p.weights)[token * K + lane] = w;
  }
}

// ------------------------------------------------------------------------------------ align
// The lanes of this warp whose key equals this lane's (keys in [0, 2^bits)), by one ballot per bit.
__device__ __forceinline__ uint32_t match_lanes(int key, int bits) {
  uint32_t peers = kFull;
  for (int b = 0; b < bits; ++b) {
    const uint32_t ones = __ballot_sync(kFull, (key >> b) & 1);
    peers &= ((key >> b) & 1) ? ones : ~ones;
  }
  return peers;
}

__device__ __forceinline__ int key_bits(int64_t experts) {
  int bits = 1;
  while ((int64_t(1) << bits) < experts + 1) ++bits;
  return bits;
}

// One pass over this warp's slots of chunk blockIdx.x: for every group of lanes with the same
// valid expert, `visit(expert, lane rank among them, group size, slot)` on every lane and then
// `hist[warp][expert] += size` by its highest lane. Invalid slots (past the end, bad ids) get
// expert -1.
template <class Visit>
__device__ void align_walk(const MoeAlignParams& p, int32_t* hist, Visit visit) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t per_warp = p.chunk_slots / LLK_MOE_ALIGN_WARPS;
  const int64_t first = int64_t(blockIdx.x) * p.chunk_slots + warp * per_warp;
  const int E = int(p.experts), bits = key_bits(p.experts);
  const int32_t* ids = reinterpret_cast<const int32_t*>(p.ids);
  bool bad = false;
  for (int64_t base = first; base < first + per_warp && base < p.slots; base += 32) {  // warp-uniform
    const int64_t s = base + lane;
    int id = -1;
    if (s < p.slots) {
      id = ids[s];
      if (id < 0 || id >= E) bad = true, id = -1;
    }
    const uint32_t peers = match_lanes(id + 1, bits);  // key 0: invalid
    const int rank = __popc(peers & ((1u << lane) - 1u));
    visit(id, rank, s);
    __syncwarp();  // every lane has read hist before its group's leader updates it
    if (id >= 0 && lane == 31 - __clz(int(peers))) hist[warp * E + id] += __popc(peers);
    __syncwarp();
  }
  if (__any_sync(kFull, bad) && lane == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_EXPERT_ID);
}

__device__ void moe_align_histogram_kernel(const MoeAlignParams& p) {
  __shared__ int32_t hist[LLK_MOE_ALIGN_WARPS * LLK_MOE_MAX_EXPERTS];
  const int E = int(p.experts);
  for (int i = int(threadIdx.x); i < LLK_MOE_ALIGN_WARPS * E; i += LLK_MOE_ALIGN_THREADS) hist[i] = 0;
  __syncthreads();
  align_walk(p, hist, [](int, int, int64_t) {});
  __syncthreads();
  int32_t* out = reinterpret_cast<int32_t*>(p.chunk_counts) + int64_t(blockIdx.x) * E;
  for (int e = int(threadIdx.x); e < E; e += LLK_MOE_ALIGN_THREADS) {
    int32_t sum = 0;
    for (int w = 0; w < LLK_MOE_ALIGN_WARPS; ++w) sum += hist[w * E + e];
    out[e] = sum;
  }
}

// One block of LLK_MOE_MAX_EXPERTS threads: thread e owns expert e.
__device__ void moe_align_scan_kernel(const MoeAlignParams& p) {
  __shared__ int32_t offsets[LLK_MOE_MAX_EXPERTS + 1];
  __shared__ int32_t warp_total[LLK_MOE_MAX_EXPERTS / 32];
  const int e = int(threadIdx.x), lane = e % 32, warp = e / 32;
  const int E = int(p.experts), bm = int(p.block_m);
  int32_t count = 0;
  if (e < E) {
    int32_t* cc = reinterpret_cast<int32_t*>(p.chunk_counts) + e;
    for (int64_t c = 0; c < p.chunks; ++c) {  // exclusive scan over the chunks, in place
      const int32_t v = cc[c * E];
      cc[c * E] = count;
      count += v;
    }
    reinterpret_cast<int32_t*>(p.counts)[e] = count;
  }
  // Exclusive scan of the padded counts: within warps by shuffles, then over the warp totals.
  const int32_t mine = (count + bm - 1) / bm * bm;
  int32_t incl = mine;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const int32_t v = __shfl_up_sync(kFull, incl, o);
    if (lane >= o) incl += v;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int32_t before = 0;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  offsets[e] = before + incl - mine;
  if (e == LLK_MOE_MAX_EXPERTS - 1) offsets[LLK_MOE_MAX_EXPERTS] = before + incl;
  __syncthreads();
  int32_t* off_out = reinterpret_cast<int32_t*>(p.offsets);
  if (e < E) off_out[e] = offsets[e];
  const int32_t total = offsets[LLK_MOE_MAX_EXPERTS];  // experts past E count 0
  if (e == 0) off_out[E] = total;
  // Block b holds row b * bm: the last expert whose segment starts at or before it (an empty
  // expert's segment has the same start as the next one, so "last" skips it).
  int32_t* block_expert = reinterpret_cast<int32_t*>(p.block_expert);
  for (int32_t b = e; b < total / bm; b += LLK_MOE_MAX_EXPERTS) {
    const int32_t row = b * bm;
    int lo = 0, hi = E;  // offsets[lo] <= row < offsets[hi] (offsets[E] = total > row)
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (offsets[mid] <= row) lo = mid; else hi = mid;
    }
    block_expert[b] = lo;
  }
}

__device__ void moe_align_scatter_kernel(const MoeAlignParams& p) {
  __shared__ int32_t hist[LLK_MOE_ALIGN_WARPS * LLK_MOE_MAX_EXPERTS];
  const int E = int(p.experts);
  for (int i = int(threadIdx.x); i < LLK_MOE_ALIGN_WARPS * E; i += LLK_MOE_ALIGN_THREADS) hist[i] = 0;
  __syncthreads();
  align_walk(p, hist, [](int, int, int64_t) {});  // this chunk's per-warp counts again
  __syncthreads();
  // Per-warp bases: the expert's segment start + this chunk's base + earlier warps' counts.
  const int32_t* offsets = reinterpret_cast<const int32_t*>(p.offsets);
  const int32_t* chunk_base = reinterpret_cast<const int32_t*>(p.chunk_counts) + int64_t(blockIdx.x) * E;
  for (int e = int(threadIdx.x); e < E; e += LLK_MOE_ALIGN_THREADS) {
    int32_t run = offsets[e] + chunk_base[e];
    for (int w = 0; w < LLK_MOE_ALIGN_WARPS; ++w) {
      const int32_t c = hist[w * E + e];
      hist[w * E + e] = run;
      run += c;
    }
  }
  __syncthreads();
  int32_t* rows = reinterpret_cast<int32_t*>(p.rows);
  const int warp = int(threadIdx.x) / 32;
  align_walk(p, hist, [&](int id, int rank, int64_t s) {
    if (s < p.slots) rows[s] = id < 0 ? -1 : hist[warp * E + id] + rank;
  });
}

// ------------------------------------------------------------------------------------ gather
template <class T, int VEC>
__device__ void moe_gather_kernel(const MoeGatherParams& p) {
  const int64_t s = blockIdx.x;  // one slot per block
  const int32_t r = reinterpret_cast<const int32_t*>(p.rows)[s];
  if (r < 0 || r >= p.out_rows) return;
  const float w = p.scale == LLK_MOE_SCALED ? reinterpret_cast<const float*>(p.weights)[s] : 1.f;
  const T* src = reinterpret_cast<const T*>(p.x) + (s / p.top_k) * p.x_row_stride;
  T* dst = reinterpret_cast<T*>(p.out) + int64_t(r) * p.out_row_stride;
  for (int64_t v = threadIdx.x; v < p.hidden / VEC; v += blockDim.x) {
    float x[VEC];
    llk::load_f32<T, VEC>(src + v * VEC, x);
    if (p.scale == LLK_MOE_SCALED) {
#pragma unroll
      for (int i = 0; i < VEC; ++i) x[i] *= w;
    }
    llk::store_f32<T, VEC>(dst + v * VEC, x);
  }
}

// ------------------------------------------------------------------------------------ combine
template <class T, int VEC>
__device__ void moe_combine_kernel(const MoeCombineParams& p) {
  __shared__ int32_t s_rows[LLK_MOE_MAX_TOP_K_GROUPED];
  __shared__ float s_w[LLK_MOE_MAX_TOP_K_GROUPED];
  const int64_t t = blockIdx.x;  // one token per block
  const int K = int(p.top_k);
  if (int(threadIdx.x) < K) {  // this token's slots, once per block
    const int32_t r = reinterpret_cast<const int32_t*>(p.rows)[t * K + threadIdx.x];
    s_rows[threadIdx.x] = r >= 0 && r < p.y_rows ? r : -1;
    s_w[threadIdx.x] = p.scale == LLK_MOE_SCALED ? reinterpret_cast<const float*>(p.weights)[t * K + threadIdx.x] : 1.f;
  }
  __syncthreads();
  const T* y = reinterpret_cast<const T*>(p.y);
  const T* shared = reinterpret_cast<const T*>(p.shared);
  const T* residual = reinterpret_cast<const T*>(p.residual);
  T* out = reinterpret_cast<T*>(p.out) + t * p.out_row_stride;
  for (int64_t v = threadIdx.x; v < p.hidden / VEC; v += blockDim.x) {
    float acc[VEC], x[VEC];
#pragma unroll
    for (int i = 0; i < VEC; ++i) acc[i] = 0.f;
    for (int j = 0; j < K; ++j) {  // fixed slot order
      const int32_t r = s_rows[j];
      if (r < 0) continue;
      const float w = s_w[j];
      llk::load_f32<T, VEC>(y + int64_t(r) * p.y_row_stride + v * VEC, x);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] = fmaf(w, x[i], acc[i]);
    }
    if (shared != nullptr) {
      llk::load_f32<T, VEC>(shared + t * p.shared_row_stride + v * VEC, x);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += x[i];
    }
    if (residual != nullptr) {  // may be `out`: read before the write below, by this thread
      llk::load_f32<T, VEC>(residual + t * p.residual_row_stride + v * VEC, x);
#pragma unroll
      for (int i = 0; i < VEC; ++i) acc[i] += x[i];
    }
    llk::store_f32<T, VEC>(out + v * VEC, acc);
  }
}

// ------------------------------------------------------------------------------------ grouped GEMM
// The row block this block computes: its first row, its valid rows and its expert. False when the
// block has nothing to do (past the padded total, or past the rows of x and y).
struct RowBlock {
  int64_t row0, expert;
  int valid;
};

__device__ __forceinline__ bool locate_block(const MoeGemmParams& p, int bm, RowBlock& b) {
  b.row0 = int64_t(blockIdx.x) * bm;
  if (b.row0 >= p.rows) return false;
  int64_t end = p.rows;
  b.expert = 0;
  if (p.schedule == LLK_MOE_GROUPED) {
    const int32_t* offsets = reinterpret_cast<const int32_t*>(p.offsets);
    if (b.row0 >= offsets[p.experts]) return false;
    b.expert = reinterpret_cast<const int32_t*>(p.block_expert)[blockIdx.x];
    if (b.expert < 0 || b.expert >= p.experts) return false;
    end = min(end, int64_t(offsets[b.expert]) + reinterpret_cast<const int32_t*>(p.counts)[b.expert]);
  }
  b.valid = int(min(int64_t(bm), end - b.row0));
  return b.valid > 0;
}

constexpr int kBK = LLK_MOE_GEMM_BLOCK_K;
constexpr int kGemmThreads = LLK_MOE_GEMM_THREADS;

template <int BM>
struct MmaShape {
  static constexpr int kBN = BM == 64 ? LLK_MOE_GEMM_BLOCK_N : LLK_MOE_GEMM_BLOCK_N_DECODE;
  static constexpr int kWarpsM = BM == 64 ? 2 : 1;
  static constexpr int kWarpsN = 4 / kWarpsM;
  static constexpr int kWarpRows = BM / kWarpsM;  // 32 or 16
  static constexpr int kMTiles = kWarpRows / 16;  // 2 or 1
  static constexpr int kWarpCols = kBN / kWarpsN;  // 64 or 16 weight columns
  static constexpr int kNTiles = kWarpCols / 8;    // 8 or 2
  static constexpr int kStages = BM == 64 ? LLK_MOE_GEMM_STAGES : LLK_MOE_GEMM_STAGES_DECODE;
  static_assert(BM == LLK_MOE_GEMM_BLOCK_M || BM == LLK_MOE_GEMM_BLOCK_M_DECODE, "block rows");
  // Dynamic shared memory (the kernels' declaration): per stage a BM x kBK activation tile and a
  // kBN x kBK weight tile of 16-bit values.
  static constexpr int kSmemBytes = kStages * (BM + kBN) * kBK * 2;
};

// Shared-memory column (in weight columns of the block tile) of n-tile j of warp column wn.
// SwiGLU: the first half of a warp's n-tiles are gate columns, the second half the matching up
// columns, which live in the upper half of the tile.
template <int BM, bool SWIGLU>
__device__ __forceinline__ int tile_col(int wn, int j) {
  using S = MmaShape<BM>;
  if constexpr (SWIGLU) {
    constexpr int half = S::kNTiles / 2;
    return (j < half ? 0 : S::kBN / 2) + wn * (S::kWarpCols / 2) + 8 * (j % half);
  } else {
    return wn * S::kWarpCols + 8 * j;
  }
}

template <class T, int BM, LlkMoeWeightLayout LAYOUT, LlkMoeEpilogue EPI>
__device__ void moe_gemm_mma_kernel(const MoeGemmParams& p) {
  using S = MmaShape<BM>;
  constexpr int kStages = S::kStages, kBN = S::kBN;
  constexpr bool kSwiglu = EPI == LLK_MOE_EPILOGUE_SWIGLU;
  constexpr bool kKN = LAYOUT == LLK_MOE_WEIGHT_KN;
  constexpr int kAStage = BM * kBK, kBStage = kBN * kBK;  // elements
  constexpr int kOutCols = kSwiglu ? kBN / 2 : kBN;       // output columns per block
  LLK_DYN_SMEM(raw);
  T* sA = reinterpret_cast<T*>(raw);  // [stages][BM][kBK], 16-byte chunks swizzled by row
  T* sB = sA + kStages * kAStage;     // [stages][kBK][kBN] (KN) or [kBN][kBK] (NK), swizzled

  RowBlock blk;
  if (!locate_block(p, BM, blk)) return;  // the whole block, before any barrier
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32;
  const int wm = warp / S::kWarpsN, wn = warp % S::kWarpsN;
  const int64_t n0 = int64_t(blockIdx.y) * kOutCols;  // first output column (gate and up alike)
  const T* x = reinterpret_cast<const T*>(p.x) + blk.row0 * p.x_row_stride;
  const T* wg = reinterpret_cast<const T*>(p.w) + blk.expert * p.w_expert_stride;
  const T* wu = kSwiglu ? reinterpret_cast<const T*>(p.w_up) + blk.expert * p.w_expert_stride : wg;
  const int64_t ktiles = (p.k + kBK - 1) / kBK;

  // Which weight column (and which tensor) tile column c feeds.
  auto weight_col = [&](int c, const T*& base) -> int64_t {
    if constexpr (kSwiglu) {
      base = c < kBN / 2 ? wg : wu;
      return n0 + c % (kBN / 2);
    } else {
      base = wg;
      return n0 + c;
    }
  };
  auto load_stage = [&](int64_t kt, int stage) {
    const int64_t k0 = kt * kBK;
    T* a = sA + stage * kAStage;
    T* b = sB + stage * kBStage;
#pragma unroll
    for (int i = tid; i < BM * kBK / 8; i += kGemmThreads) {
      const int r = i / (kBK / 8), c = i % (kBK / 8);
      const bool ok = r < blk.valid && k0 + c * 8 < p.k;
      llk::cp_async_16(a + r * kBK + ((c ^ (r & 7)) * 8), ok ? x + r * p.x_row_stride + k0 + c * 8 : x, ok ? 16 : 0);
    }
#pragma unroll
    for (int i = tid; i < kBN * kBK / 8; i += kGemmThreads) {
      if constexpr (kKN) {  // rows of k, chunks of 8 columns
        const int r = i / (kBN / 8), c = i % (kBN / 8);
        const T* base;
        const int64_t col = weight_col(c * 8, base);
        const bool ok = k0 + r < p.k && col < p.n;
        llk::cp_async_16(b + r * kBN + (((c & ~7) | ((c & 7) ^ (r & 7))) * 8),
                         ok ? base + (k0 + r) * p.w_row_stride + col : wg, ok ? 16 : 0);
      } else {  // rows of n, chunks of 8 k
        const int r = i / (kBK / 8), c = i % (kBK / 8);
        const T* base;
        const int64_t col = weight_col(r, base);
        const bool ok = col < p.n && k0 + c * 8 < p.k;
        llk::cp_async_16(b + r * kBK + ((c ^ (r & 7)) * 8), ok ? base + col * p.w_row_stride + k0 + c * 8 : wg,
                         ok ? 16 : 0);
      }
    }
  };

  float acc[S::kMTiles][S::kNTiles][4];
#pragma unroll
  for (int mi = 0; mi < S::kMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < S::kNTiles; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;
  // m16 tiles of this warp holding at least one valid row (warp-uniform).
  const int mt_active = max(0, min(S::kMTiles, (blk.valid - wm * S::kWarpRows + 15) / 16));

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) load_stage(s, s);
    llk::cp_async_commit();
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    // Tile kt has landed for every thread, and every warp is done with the stage refilled next.
    llk::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (kt + kStages - 1 < ktiles) load_stage(kt + kStages - 1, int((kt + kStages - 1) % kStages));
    llk::cp_async_commit();
    if (mt_active == 0) continue;
    const T* a = sA + int(kt % kStages) * kAStage;
    const T* b = sB + int(kt % kStages) * kBStage;
    const int mat = lane >> 3;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[S::kMTiles][4];
#pragma unroll
      for (int mi = 0; mi < S::kMTiles; ++mi) {
        if (mi >= mt_active) continue;
        const int r = wm * S::kWarpRows + 16 * mi + (mat & 1) * 8 + (lane & 7);
        const int c = 2 * kk + (mat >> 1);
        llk::ldmatrix<4, false>(af[mi], a + r * kBK + ((c ^ (r & 7)) * 8));
      }
#pragma unroll
      for (int jp = 0; jp < S::kNTiles / 2; ++jp) {
        uint32_t bf[4];  // bf[0], bf[1]: n-tile 2 jp; bf[2], bf[3]: n-tile 2 jp + 1
        const int col = tile_col<BM, kSwiglu>(wn, 2 * jp + (mat >> 1));
        if constexpr (kKN) {
          const int r = 16 * kk + (mat & 1) * 8 + (lane & 7);
          const int c = col / 8;
          llk::ldmatrix<4, true>(bf, b + r * kBN + (((c & ~7) | ((c & 7) ^ (r & 7))) * 8));
        } else {
          const int r = col + (lane & 7);
          const int c = 2 * kk + (mat & 1);
          llk::ldmatrix<4, false>(bf, b + r * kBK + ((c ^ (r & 7)) * 8));
        }
        const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
        for (int mi = 0; mi < S::kMTiles; ++mi) {
          if (mi >= mt_active) continue;
          llk::mma_m16n8k16<T>(acc[mi][2 * jp], af[mi], b0, acc[mi][2 * jp]);
          llk::mma_m16n8k16<T>(acc[mi][2 * jp + 1], af[mi], b1, acc[mi][2 * jp + 1]);
        }
      }
    }
  }
  llk::cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory is free: stage the output tile there

  constexpr int kPitch = kOutCols + 8;  // 16-byte rows, conflict-free 4-byte writes
  T* sC = reinterpret_cast<T*>(raw);
  const int g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < S::kMTiles; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int r = wm * S::kWarpRows + 16 * mi + g + 8 * h;
      if constexpr (kSwiglu) {
#pragma unroll
        for (int j = 0; j < S::kNTiles / 2; ++j) {
          const float* gate = acc[mi][j];
          const float* up = acc[mi][j + S::kNTiles / 2];
          const int c = wn * (S::kWarpCols / 2) + 8 * j + 2 * t;
          *reinterpret_cast<uint32_t*>(sC + r * kPitch + c) =
              llk::pack_pair<T>(silu(gate[2 * h]) * up[2 * h], silu(gate[2 * h + 1]) * up[2 * h + 1]);
        }
      } else {
#pragma unroll
        for (int j = 0; j < S::kNTiles; ++j) {
          const int c = wn * S::kWarpCols + 8 * j + 2 * t;
          *reinterpret_cast<uint32_t*>(sC + r * kPitch + c) = llk::pack_pair<T>(acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
        }
      }
    }
  __syncthreads();
  T* y = reinterpret_cast<T*>(p.y) + blk.row0 * p.y_row_stride + n0;
  const int64_t cols = min(int64_t(kOutCols), p.n - n0);
  if (p.n % 8 == 0) {  // the host checked 16-byte alignment of y and its row stride
    for (int i = tid; i < BM * kOutCols / 8; i += kGemmThreads) {
      const int r = i / (kOutCols / 8), c = i % (kOutCols / 8);
      if (r < blk.valid && c * 8 < cols)
        llk::store_u4(y + r * p.y_row_stride + c * 8, *reinterpret_cast<const uint4*>(sC + r * kPitch + c * 8));
    }
  } else {
    for (int i = tid; i < BM * kOutCols; i += kGemmThreads) {
      const int r = i / kOutCols, c = i % kOutCols;
      if (r < blk.valid && c < cols) y[r * p.y_row_stride + c] = sC[r * kPitch + c];
    }
  }
}

// SIMT path (f32).
constexpr int kSimtN = LLK_MOE_SIMT_BLOCK_N;
constexpr int kSimtK = 16;
constexpr int kSimtThreads = LLK_MOE_SIMT_THREADS;

template <int BM, LlkMoeWeightLayout LAYOUT, LlkMoeEpilogue EPI>
__device__ void moe_gemm_simt_kernel(const MoeGemmParams& p) {
  constexpr bool kSwiglu = EPI == LLK_MOE_EPILOGUE_SWIGLU;
  constexpr int kRows = BM / 16;  // rows per thread
  constexpr int kOutCols = kSwiglu ? kSimtN / 2 : kSimtN;
  __shared__ float sA[kSimtK][BM + 1];
  __shared__ float sB[kSimtK][kSimtN + 1];
  RowBlock blk;
  if (!locate_block(p, BM, blk)) return;  // the whole block, before any barrier
  const int tid = int(threadIdx.x), tx = tid % 16, ty = tid / 16;
  const int64_t n0 = int64_t(blockIdx.y) * kOutCols;
  const float* x = reinterpret_cast<const float*>(p.x) + blk.row0 * p.x_row_stride;
  const float* wg = reinterpret_cast<const float*>(p.w) + blk.expert * p.w_expert_stride;
  const float* wu = kSwiglu ? reinterpret_cast<const float*>(p.w_up) + blk.expert * p.w_expert_stride : wg;
  // This thread's 4 tile columns: 4 tx.. (plain), or 2 gate columns and their up columns.
  int cols[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) cols[j] = kSwiglu ? (j < 2 ? 2 * tx + j : kSimtN / 2 + 2 * tx + j - 2) : 4 * tx + j;
  float acc[kRows][4];
#pragma unroll
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;

  for (int64_t k0 = 0; k0 < p.k; k0 += kSimtK) {
    __syncthreads();  // the previous tile is consumed
    for (int i = tid; i < BM * kSimtK; i += kSimtThreads) {
      const int r = i / kSimtK, kk = i % kSimtK;
      sA[kk][r] = r < blk.valid && k0 + kk < p.k ? x[r * p.x_row_stride + k0 + kk] : 0.f;
    }
    for (int i = tid; i < kSimtN * kSimtK; i += kSimtThreads) {
      // Consecutive threads walk the weight's contiguous dimension.
      const int c = LAYOUT == LLK_MOE_WEIGHT_KN ? i % kSimtN : i / kSimtK;
      const int kk = LAYOUT == LLK_MOE_WEIGHT_KN ? i / kSimtN : i % kSimtK;
      const float* base = kSwiglu && c >= kSimtN / 2 ? wu : wg;
      const int64_t col = n0 + (kSwiglu ? c % (kSimtN / 2) : c);
      const bool ok = col < p.n && k0 + kk < p.k;
      const int64_t at = LAYOUT == LLK_MOE_WEIGHT_KN ? (k0 + kk) * p.w_row_stride + col : col * p.w_row_stride + k0 + kk;
      sB[kk][c] = ok ? base[at] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < kSimtK; ++kk) {
      float b[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = sB[kk][cols[j]];
#pragma unroll
      for (int i = 0; i < kRows; ++i) {
        const float a = sA[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a, b[j], acc[i][j]);
      }
    }
  }
  float* y = reinterpret_cast<float*>(p.y) + blk.row0 * p.y_row_stride + n0;
#pragma unroll
  for (int i = 0; i < kRows; ++i) {
    const int r = ty + 16 * i;
    if (r >= blk.valid) continue;
    if constexpr (kSwiglu) {
#pragma unroll
      for (int j = 0; j < 2; ++j)
        if (n0 + 2 * tx + j < p.n) y[r * p.y_row_stride + 2 * tx + j] = silu(acc[i][j]) * acc[i][j + 2];
    } else {
#pragma unroll
      for (int j = 0; j < 4; ++j)
        if (n0 + 4 * tx + j < p.n) y[r * p.y_row_stride + 4 * tx + j] = acc[i][j];
    }
  }
}

}  // namespace

// Symbols:
//   moe_route_<llama4|softmax|grouped>_<e128|e512>_<dtype>   experts <= 128 / <= 512
//   moe_align_histogram, moe_align_scan, moe_align_scatter
//   moe_gather[_vec]_<dtype>, moe_combine[_vec]_<dtype>      `_vec`: 16-byte accesses
//   moe_grouped_gemm_<kn|nk>_<plain|swiglu>_<m64|m16>_<dtype> bf16/f16 tensor cores, f32 SIMT
#define MOE_ROUTE_KERNELS(X, T, name)                                                                                 \
  X(moe_route_llama4_e128_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                        \
    (moe_route_kernel<T, LLK_MOE_ROUTE_LLAMA4, 4>))                                               \
  X(moe_route_llama4_e512_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                        \
    (moe_route_kernel<T, LLK_MOE_ROUTE_LLAMA4, 16>))                                              \
  X(moe_route_softmax_e128_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                       \
    (moe_route_kernel<T, LLK_MOE_ROUTE_SOFTMAX, 4>))                                              \
  X(moe_route_softmax_e512_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                       \
    (moe_route_kernel<T, LLK_MOE_ROUTE_SOFTMAX, 16>))                                             \
  X(moe_route_grouped_e128_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                       \
    (moe_route_kernel<T, LLK_MOE_ROUTE_GROUPED, 4>))                                      \
  X(moe_route_grouped_e512_##name, MoeRouteParams, (32 * LLK_MOE_ROUTE_WARPS), LLK_SMEM_NONE,                                       \
    (moe_route_kernel<T, LLK_MOE_ROUTE_GROUPED, 16>))

#define MOE_ROW_KERNELS(X, T, name)                                                                                   \
  X(moe_gather_##name, MoeGatherParams, (LLK_MOE_ROW_THREADS), LLK_SMEM_NONE, (moe_gather_kernel<T, 1>))                             \
  X(moe_gather_vec_##name, MoeGatherParams, (LLK_MOE_ROW_THREADS), LLK_SMEM_NONE, (moe_gather_kernel<T, llk::kVec16<T>>))            \
  X(moe_combine_##name, MoeCombineParams, (LLK_MOE_ROW_THREADS), LLK_SMEM_NONE, (moe_combine_kernel<T, 1>))                          \
  X(moe_combine_vec_##name, MoeCombineParams, (LLK_MOE_ROW_THREADS), LLK_SMEM_NONE, (moe_combine_kernel<T, llk::kVec16<T>>))

#define MOE_MMA_KERNELS(X, T, name)                                                                                   \
  X(moe_grouped_gemm_kn_plain_m64_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<64>::kSmemBytes),                                            \
    (moe_gemm_mma_kernel<T, 64, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_PLAIN>))                                          \
  X(moe_grouped_gemm_kn_swiglu_m64_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<64>::kSmemBytes),                                           \
    (moe_gemm_mma_kernel<T, 64, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_SWIGLU>))                                         \
  X(moe_grouped_gemm_nk_plain_m64_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<64>::kSmemBytes),                                            \
    (moe_gemm_mma_kernel<T, 64, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_PLAIN>))                                          \
  X(moe_grouped_gemm_nk_swiglu_m64_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<64>::kSmemBytes),                                           \
    (moe_gemm_mma_kernel<T, 64, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_SWIGLU>))                                         \
  X(moe_grouped_gemm_kn_plain_m16_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<16>::kSmemBytes),                                            \
    (moe_gemm_mma_kernel<T, 16, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_PLAIN>))                                          \
  X(moe_grouped_gemm_kn_swiglu_m16_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<16>::kSmemBytes),                                           \
    (moe_gemm_mma_kernel<T, 16, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_SWIGLU>))                                         \
  X(moe_grouped_gemm_nk_plain_m16_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<16>::kSmemBytes),                                            \
    (moe_gemm_mma_kernel<T, 16, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_PLAIN>))                                          \
  X(moe_grouped_gemm_nk_swiglu_m16_##name, MoeGemmParams, (kGemmThreads), LLK_SMEM_FIXED(MmaShape<16>::kSmemBytes),                                           \
    (moe_gemm_mma_kernel<T, 16, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_SWIGLU>))

#define MOE_SIMT_KERNELS(X)                                                                                           \
  X(moe_grouped_gemm_kn_plain_m64_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                               \
    (moe_gemm_simt_kernel<64, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_PLAIN>))                                            \
  X(moe_grouped_gemm_kn_swiglu_m64_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                              \
    (moe_gemm_simt_kernel<64, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_SWIGLU>))                                           \
  X(moe_grouped_gemm_nk_plain_m64_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                               \
    (moe_gemm_simt_kernel<64, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_PLAIN>))                                            \
  X(moe_grouped_gemm_nk_swiglu_m64_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                              \
    (moe_gemm_simt_kernel<64, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_SWIGLU>))                                           \
  X(moe_grouped_gemm_kn_plain_m16_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                               \
    (moe_gemm_simt_kernel<16, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_PLAIN>))                                            \
  X(moe_grouped_gemm_kn_swiglu_m16_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                              \
    (moe_gemm_simt_kernel<16, LLK_MOE_WEIGHT_KN, LLK_MOE_EPILOGUE_SWIGLU>))                                           \
  X(moe_grouped_gemm_nk_plain_m16_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                               \
    (moe_gemm_simt_kernel<16, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_PLAIN>))                                            \
  X(moe_grouped_gemm_nk_swiglu_m16_f32, MoeGemmParams, (kSimtThreads), LLK_SMEM_NONE,                                              \
    (moe_gemm_simt_kernel<16, LLK_MOE_WEIGHT_NK, LLK_MOE_EPILOGUE_SWIGLU>))

#define MOE_KERNELS(X)                                                                                                \
  MOE_ROUTE_KERNELS(X, float, f32)                                                                                    \
  MOE_ROUTE_KERNELS(X, __half, f16)                                                                                   \
  MOE_ROUTE_KERNELS(X, __nv_bfloat16, bf16)                                                                           \
  X(moe_align_histogram, MoeAlignParams, (LLK_MOE_ALIGN_THREADS), LLK_SMEM_NONE, (moe_align_histogram_kernel))                       \
  X(moe_align_scan, MoeAlignParams, (LLK_MOE_MAX_EXPERTS), LLK_SMEM_NONE, (moe_align_scan_kernel))                                   \
  X(moe_align_scatter, MoeAlignParams, (LLK_MOE_ALIGN_THREADS), LLK_SMEM_NONE, (moe_align_scatter_kernel))                           \
  MOE_ROW_KERNELS(X, float, f32)                                                                                      \
  MOE_ROW_KERNELS(X, __half, f16)                                                                                     \
  MOE_ROW_KERNELS(X, __nv_bfloat16, bf16)                                                                             \
  MOE_MMA_KERNELS(X, __half, f16)                                                                                     \
  MOE_MMA_KERNELS(X, __nv_bfloat16, bf16)                                                                             \
  MOE_SIMT_KERNELS(X)

LLK_EXPORT_KERNELS(moe, MOE_KERNELS)
