// attention_sm90.cu -- prefill attention for Hopper (sm_90a): TMA loads, wgmma, warp specialization.
//
// The math, the masks, the variable-length batch and the GQA packing are those of attention.cu
// (its header states them; src/reference/attention.rs is the spec), and so is the grid: grid.x
// the row blocks of every sequence (cu_tiles), grid.y = kv_heads x (group / pack), a block of
// LLK_ATTN_ROWS_MMA = 128 (query token, q head) rows (prefill_blocks.cuh). What differs is how a
// block computes, in FlashAttention-3's structure:
//
// Warp specialization. Three warpgroups (384 threads). Warpgroup 0 is the producer: it gives its
// registers back (setmaxnreg.dec to 24) and one elected thread issues every load, by TMA
// (kernels/common/tma.cuh) from the tensor maps in the params: Q once (the block's 128 rows, one
// box of `pack` heads x 128 / pack tokens per 64-dim panel), then K and V tiles of 128 keys (64 at
// head_dim 256) into a ring of 2 stages. Each stage has a "full" mbarrier for K and one for V
// (arrive.expect_tx of the tile's bytes, completed by the copies), and an "empty" one for each
// that the 256 consumer threads arrive on when they are done with it (K once its S is computed,
// V once its P V is); the producer waits for it before refilling. Warpgroups 1 and 2 are the
// consumers (setmaxnreg.inc to 240), 64 rows each; per tile, each:
//   S = Q K^T     wgmma m64n<keys>k16 from shared memory (Q and K K-major), head_dim / 16 issues;
//   softmax       in registers: mask (only tiles that cross a mask or sequence boundary), the
//                 online max / sum in base 2 with quad shuffles, the exponentials in place;
//   O += P V      O rescaled when a maximum moved, then wgmma m64n<head_dim>k16 with P from
//                 registers (S's accumulator layout is the A fragment layout, converted to
//                 bf16/f16) and V MN-major, keys / 16 issues.
// Inside a warpgroup the two products overlap: each turn issues S = Q K^T of tile i and behind
// it O += P V of tile i - 1 (two commit groups), waits for the first only (wgmma.wait_group 1)
// and runs tile i's whole softmax while the P V still runs; the wait for that P V opens the next
// turn. (ptxas places a wgmma wait as early as its basic block allows: a wait at the end of the
// turn, after the softmax, is hoisted above it. At the loop's head it cannot be, and the sm_90a
// SASS has the softmax's MUFU.EX2 between WARPGROUP.DEPBAR 0x1 and 0x0, which
// tests/static_checks.rs asserts.) The order of operations on O, and so every bit, is that of
// the plain loop: O = O * corr_i + P_i V_i.
//
// Across warpgroups, ping-pong: two named barriers order the consumers' turns, so that while one
// runs its softmax the tensor cores work on the other's products: warpgroup c waits at barrier
// 1 + c before it issues, and arrives at the other's barrier after (warpgroup 1 opens with one
// arrival at barrier 1, and skips its last, so both balance).
//
// Shared memory (dynamic, aligned up to 1024 bytes, Layout<D>::bytes, its declaration): head dims in
// panels of 64 (128 bytes a row), each 128-byte swizzled as TMA writes it and as wgmma's
// descriptors read it (16-byte chunk c of row r at c ^ (r % 8)): Q [D/64][128 rows], K and V
// [2 stages][D/64][keys], then the mbarriers. Descriptors: Q and K K-major (rows 128 bytes
// apart, 8-row groups 1024 apart, a k-step 32 bytes further), V MN-major (a k-step of 16 keys
// 2048 bytes further, 8-key groups 1024 apart, panels of 64 dims a panel apart).
//
// Rows past the block's used rows (a pack that does not divide 128) or past the sequence are
// computed from whatever Q holds there (zeros past total_q, other tokens before it) and never
// stored; keys past the sequence are masked, past total_k zero-filled by TMA. The output is
// written from registers (4-byte stores of adjacent head dims); LSE as in attention.cu.
//
// Precision as attention.cu: products and sums in f32, P rounded to the input dtype for P V.
//
// Scope: bf16 and f16, head_dim 64, 128 and 256, contiguous K/V. K/V read in place from the paged
// cache, f32, and head_dim 32 and 96 stay on attention.cu's kernels. Not yet: a TMA store of the
// output. The producer prefetches the three tensor maps before its first copy; every register
// operand of a wgmma is fenced against compiler reordering at the fence, commit and wait
// (wgmma.cuh). ptxas must not serialize the wgmma (its C7518 note): every issue and wait sits on a
// path all threads of the warpgroup take, the first and last tiles peeled out of the loop.
#include "common/llk.cuh"
#include "common/mbarrier.cuh"
#include "common/prefill_blocks.cuh"
#include "common/ptx.cuh"
#include "common/tma.cuh"
#include "common/warp_specialize.cuh"
#include "common/wgmma.cuh"

namespace {

using namespace llk::prefill;

constexpr int kThreads = LLK_ATTN_SM90_THREADS;
constexpr int kRows = LLK_ATTN_ROWS_MMA;      // per block; 64 per consumer warpgroup
// Keys per K/V tile: 128, and 64 at head_dim 256 (whose 64 x 256 O accumulators leave the
// registers for a 64-key S, and whose stages must fit shared memory).
template <int D>
inline constexpr int kKeysOf = D <= 128 ? LLK_ATTN_SM90_KEYS : LLK_ATTN_SM90_KEYS_HD256;
constexpr int kStages = LLK_ATTN_SM90_STAGES;
constexpr int kPanel = LLK_ATTN_SM90_PANEL;   // head dims per 128-byte row of a panel
static_assert(kThreads == 3 * 128 && kRows == 2 * 64, "one producer and two consumer warpgroups of 64 rows");
constexpr int kRegsProducer = LLK_ATTN_SM90_REGS_PRODUCER, kRegsConsumer = LLK_ATTN_SM90_REGS_CONSUMER;
// The split moves registers within the pool the block launched with (params.h).
static_assert(LLK_ATTN_SM90_REGS == 65536 / kThreads / 8 * 8, "the per-thread count __launch_bounds__(kThreads, 1) gives");
static_assert(128 * kRegsProducer + 256 * kRegsConsumer == kThreads * LLK_ATTN_SM90_REGS,
              "the producer's registers given back are exactly the consumers' raise");

// Byte offsets of the shared-memory layout (from the 1024-aligned base).
template <int D>
struct Layout {
  static constexpr int kKeys = kKeysOf<D>;
  static constexpr int kPanels = D / kPanel;
  static constexpr int kQBytes = kRows * D * 2;
  static constexpr int kTileBytes = kKeys * D * 2;  // one K or V tile
  static constexpr int kPanelQ = kRows * 128, kPanelKV = kKeys * 128;
  static constexpr int q = 0;
  static constexpr int k = q + kQBytes;
  static constexpr int v = k + kStages * kTileBytes;
  static constexpr int bars = v + kStages * kTileBytes;
  static constexpr int kBarriers = 1 + 4 * kStages;  // full Q; full and empty K, full and empty V per stage
  static constexpr int bytes = bars + 128 + 1024;    // + the alignment slack
  static_assert(kBarriers * 8 <= 128, "the mbarriers fit their 128 bytes");
};

// A K-major, 128-byte swizzled operand: rows 128 bytes apart, 8-row groups 1024 apart.
__device__ __forceinline__ uint64_t kmajor_desc(const unsigned char* at) {
  return llk::wgmma_desc(at, 16, 1024, llk::WgmmaSwizzle::B128);
}

template <class T, int D>
__device__ void attention_sm90_body(const AttentionSm90Params& P);

// The entry: the kernel exists on sm_90a (and the emulator); other device targets, where the
// crate never selects it (ops::attention::prefill_kernel), get a trap instead of dead code.
template <class T, int D>
__device__ void attention_sm90_kernel(const AttentionSm90Params& P) {
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)P;
  __trap();
#else
  attention_sm90_body<T, D>(P);
#endif
}

template <class T, int D>
__device__ void attention_sm90_body(const AttentionSm90Params& P) {
  static_assert(D == 64 || D == 128 || D == 256, "head_dim 64, 128 or 256");
  using L = Layout<D>;
  constexpr int kKeys = L::kKeys;
  const AttentionParams& p = P.attn;
  LLK_DYN_SMEM(raw);
  unsigned char* smem = raw + ((1024u - (llk::smem_address(raw) & 1023u)) & 1023u);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + L::bars);
  uint64_t* full_q = bars;
  uint64_t* full_k = bars + 1;
  uint64_t* full_v = full_k + kStages;
  uint64_t* empty_k = full_v + kStages;
  uint64_t* empty_v = empty_k + kStages;

  if (past_last_tile(p, blockIdx.x)) return;  // the whole block: before any barrier
  // The warpgroup index through a shuffle: the compiler then knows it is uniform, and keeps what
  // derives from it (the consumer's wgmma descriptors) in uniform registers.
  const int tid = int(threadIdx.x), wg = __shfl_sync(0xffffffffu, tid / 128, 0);
  const Sequence s = locate(p, blockIdx.x);
  const RowMap rows = row_map(p, s, kRows);
  const int group = int(p.q_heads / p.kv_heads);
  const int kv_head = int(rows.first_head) / group;
  const BlockKeys bk = block_keys(p, s, rows.first_token, rows.tokens_per_block);
  const KeyTiles kt = key_tiles(p, s, bk, kKeys);
  const int tiles = max(kt.end - kt.first, 0);

  if (tid == 0) {
    llk::mbarrier_init(full_q, 1);
    for (int st = 0; st < kStages; ++st) {
      llk::mbarrier_init(&full_k[st], 1);
      llk::mbarrier_init(&full_v[st], 1);
      llk::mbarrier_init(&empty_k[st], 256);
      llk::mbarrier_init(&empty_v[st], 256);
    }
    llk::fence_mbarrier_init();
  }
  __syncthreads();

  // ------------------------------------------------------------------ producer warpgroup
  if (wg == 0) {
    llk::setmaxnreg<kRegsProducer, false>();
    if (tid >= 32 || !llk::elect_one_sync()) return;
    llk::prefetch_tensormap(P.q_map);
    llk::prefetch_tensormap(P.k_map);
    llk::prefetch_tensormap(P.v_map);
    const int32_t q_token = int32_t(s.q_start + rows.first_token), first_head = int32_t(rows.first_head);
    // The Q box is pack heads x tokens_per_block tokens: the used rows (128 when pack divides 128).
    llk::mbarrier_arrive_expect_tx(full_q, uint32_t(L::kPanels * kPanel * 2 * rows.used));
    for (int c = 0; c < L::kPanels; ++c)
      llk::tensor_copy_to_shared(smem + L::q + c * L::kPanelQ, P.q_map, {c * kPanel, first_head, q_token}, full_q);
    for (int i = 0; i < tiles; ++i) {
      const int st = i % kStages;
      const uint32_t refill = uint32_t(i / kStages - 1) & 1;  // the phase of the stage's last use
      const int32_t key = int32_t(s.k_start) + (kt.first + i) * kKeys;
      if (i >= kStages) llk::mbarrier_wait(&empty_k[st], refill);
      llk::mbarrier_arrive_expect_tx(&full_k[st], L::kTileBytes);
      for (int c = 0; c < L::kPanels; ++c)
        llk::tensor_copy_to_shared(smem + L::k + st * L::kTileBytes + c * L::kPanelKV, P.k_map, {c * kPanel, kv_head, key},
                                   &full_k[st]);
      if (i >= kStages) llk::mbarrier_wait(&empty_v[st], refill);
      llk::mbarrier_arrive_expect_tx(&full_v[st], L::kTileBytes);
      for (int c = 0; c < L::kPanels; ++c)
        llk::tensor_copy_to_shared(smem + L::v + st * L::kTileBytes + c * L::kPanelKV, P.v_map, {c * kPanel, kv_head, key},
                                   &full_v[st]);
    }
    return;
  }

  // ------------------------------------------------------------------ consumer warpgroups
  llk::setmaxnreg<kRegsConsumer, true>();
  const int c = wg - 1;                                   // consumer 0 or 1: block rows 64 c ..
  const int t = tid % 128, w = t / 32, g = (t % 32) / 4, qd = t % 4;
  // This thread's two rows (wgmma's accumulator layout): h = 0, 1 -> row 64 c + 16 w + g + 8 h.
  auto block_row = [&](int h) { return 64 * c + 16 * w + g + 8 * h; };
  KeyInterval keys[2];
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t pos = s.k_len - s.q_len + rows.token(block_row(h));
    keys[h] = key_interval(p, pos, s.k_len);
    scale[h] = row_scale_log2(p, pos);
  }
  // Accumulators in wgmma's layout: element i of row half h = (i >> 1) & 1, column
  // 8 (i >> 2) + 2 qd + (i & 1).
  float o[D / 2], sc[kKeys / 2];
#pragma unroll
  for (int i = 0; i < D / 2; ++i) o[i] = 0.f;
  llk::SoftmaxState row[2];  // the online softmax of rows g and g + 8
  const int my_turn = 1 + c, their_turn = 2 - c;  // named barrier ids (0 is __syncthreads)
  if (c == 1 && tiles > 0) llk::named_barrier_arrive(1, 256);

  llk::mbarrier_wait(full_q, 0);
  const unsigned char* sq = smem + L::q + 64 * c * 128;  // this warpgroup's 64 rows of each panel
  uint32_t pa[kKeys / 16][4];  // P as A fragments: k-step kk holds keys 16 kk .. 16 kk + 15
  // The descriptors of Q (this warpgroup's rows) and of stage 0's K and V, made once: a k-step,
  // panel or stage further is the same layout with its start address advanced.
  const uint64_t q_desc = kmajor_desc(sq), k_desc = kmajor_desc(smem + L::k);
  const uint64_t v_desc = llk::wgmma_desc(smem + L::v, L::kPanelKV, 1024, llk::WgmmaSwizzle::B128);
  // O += P V of tile i from the P in `pa` (one commit group).
  auto issue_pv = [&](int i) {
    const int st = i % kStages;
    llk::mbarrier_wait(&full_v[st], uint32_t(i / kStages) & 1);
    llk::wgmma_fence(o, pa);
#pragma unroll
    for (int kk = 0; kk < kKeys / 16; ++kk)
      llk::wgmma_rs<T, D, true>(o, pa[kk], llk::wgmma_desc_advance(v_desc, st * L::kTileBytes + kk * 2048), true);
    llk::wgmma_commit(o, pa);
  };
  // S = Q K^T of tile i (one commit group).
  auto issue_s = [&](int i) {
    const int st = i % kStages;
    llk::mbarrier_wait(&full_k[st], uint32_t(i / kStages) & 1);
    llk::wgmma_fence(sc);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const int panel = kk / 4, at = (kk % 4) * 32;
      llk::wgmma_ss<T, kKeys, false, false>(
          sc, llk::wgmma_desc_advance(q_desc, panel * L::kPanelQ + at),
          llk::wgmma_desc_advance(k_desc, st * L::kTileBytes + panel * L::kPanelKV + at), kk > 0);
    }
    llk::wgmma_commit(sc);
  };
  // Tile i's scores: mask (only tiles that cross a mask or sequence boundary), the online
  // softmax's row maxima (in base 2 as attention.cu) and the exponentials, in place in `sc`; l
  // takes their sums. Returns whether a maximum moved (step set). O and the P registers are not
  // touched: the last tile's P V may still run.
  llk::SoftmaxStep step[2];
  auto softmax = [&](int i) {
    const int tile = kt.first + i, n0 = tile * kKeys;
    if (tile < kt.free_lo || tile >= kt.free_hi) {
      // perf-model: cold {
#pragma unroll
      for (int e = 0; e < kKeys / 2; ++e) {
        const int key = n0 + 8 * (e >> 2) + 2 * qd + (e & 1);
        if (!keys[(e >> 1) & 1].contains(key)) sc[e] = -INFINITY;
      }
      // perf-model: cold }
    }
    bool moved = false;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int j = 0; j < kKeys / 8; ++j) mx = fmaxf(mx, fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      step[h] = row[h].update(mx * scale[h]);
      moved = moved || step[h].moved;
    }
#pragma unroll
    for (int e = 0; e < kKeys / 2; e += 2) {
      const int h = (e >> 1) & 1;
      sc[e] = step[h].weight(sc[e], scale[h]);
      sc[e + 1] = step[h].weight(sc[e + 1], scale[h]);
      row[h].l += sc[e] + sc[e + 1];
    }
    return moved;
  };
  // Once the P V before has completed: P from the exponentials, rounded to T (column 8 j + 2 qd of
  // half h, j = e / 4, goes to k-step j / 2, register h + 2 (j % 2)).
  auto to_p = [&]() {
#pragma unroll
    for (int e = 0; e < kKeys / 2; e += 2) {
      const int j = e >> 2;
      pa[j >> 1][((e >> 1) & 1) + 2 * (j & 1)] = llk::pack_pair<T>(sc[e], sc[e + 1]);
    }
  };
  // Before the next P V: O rescaled when a maximum moved.
  auto rescale_o = [&](bool moved) {
    if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
      for (int e = 0; e < D / 2; ++e) o[e] *= step[(e >> 1) & 1].corr;
    }
  };

  // Turn i (after the other warpgroup issued its products): S = Q K^T of tile i, O rescaled, and
  // behind it O += P V of tile i - 1; the wait for S only, tile i's softmax while that P V runs.
  // The wait for the P V opens the next turn, so that ptxas, which schedules a wgmma wait as early
  // as its basic block allows, cannot hoist it above the softmax. K of a tile is released once
  // its S is done, V once its P V is. The first tile has no P V before it, the last one's runs
  // after the loop; every path that issued a wgmma passes a wait before O is read.
  if (tiles > 0) {
    llk::named_barrier_sync(my_turn, 256);
    issue_s(0);
    if (c == 0 || tiles > 1) llk::named_barrier_arrive(their_turn, 256);
    llk::wgmma_wait<0>(sc);
    llk::mbarrier_arrive(&empty_k[0]);
    bool moved = softmax(0);
    for (int i = 1; i < tiles; ++i) {
      llk::wgmma_wait<0>(o, pa);  // P V of tile i - 2: O and the P registers are free
      if (i >= 2) llk::mbarrier_arrive(&empty_v[(i - 2) % kStages]);
      to_p();
      llk::named_barrier_sync(my_turn, 256);
      issue_s(i);
      rescale_o(moved);
      issue_pv(i - 1);
      if (c == 0 || i + 1 < tiles) llk::named_barrier_arrive(their_turn, 256);
      llk::wgmma_wait<1>(sc);  // S of tile i; P V of tile i - 1 may still run
      llk::mbarrier_arrive(&empty_k[i % kStages]);
      moved = softmax(i);
    }
    llk::wgmma_wait<0>(o, pa);
    if (tiles >= 2) llk::mbarrier_arrive(&empty_v[(tiles - 2) % kStages]);
    to_p();
    rescale_o(moved);
    issue_pv(tiles - 1);
    llk::wgmma_wait<0>(o, pa);
    llk::mbarrier_arrive(&empty_v[(tiles - 1) % kStages]);
  }

  // Finish: quad-wide sums, normalize, store (rows of the block and sequence only).
  T* out = reinterpret_cast<T*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const llk::SoftmaxState total = row[h].quad_total();
    const float inv = total.normalizer();  // fully masked: zeros; NaN stays NaN
    const int r = block_row(h);
    if (!rows.valid(r, s.q_len)) continue;
    T* orow = out + (s.q_start + rows.token(r)) * p.out_token_stride + rows.head(r) * p.out_head_stride;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<uint32_t*>(orow + 8 * j + 2 * qd) = llk::pack_pair<T>(o[4 * j + 2 * h] * inv, o[4 * j + 2 * h + 1] * inv);
    if (p.lse != 0 && qd == 0)
      reinterpret_cast<float*>(p.lse)[rows.head(r) * p.total_q + s.q_start + rows.token(r)] = total.lse();
  }
}

}  // namespace

// Symbols: attention_sm90_hd<head_dim>_<dtype>.
#define ATTENTION_SM90_KERNELS(X)                                                                                   \
  X(attention_sm90_hd64_bf16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<64>::bytes), (attention_sm90_kernel<__nv_bfloat16, 64>))   \
  X(attention_sm90_hd128_bf16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<128>::bytes), (attention_sm90_kernel<__nv_bfloat16, 128>)) \
  X(attention_sm90_hd256_bf16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<256>::bytes), (attention_sm90_kernel<__nv_bfloat16, 256>)) \
  X(attention_sm90_hd64_f16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<64>::bytes), (attention_sm90_kernel<__half, 64>))           \
  X(attention_sm90_hd128_f16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<128>::bytes), (attention_sm90_kernel<__half, 128>))         \
  X(attention_sm90_hd256_f16, AttentionSm90Params, (kThreads, 1), LLK_SMEM_FIXED(Layout<256>::bytes), (attention_sm90_kernel<__half, 256>))

LLK_EXPORT_KERNELS(attention_sm90, ATTENTION_SM90_KERNELS)
