// attention.cu -- flash-style grouped-query attention (prefill), bf16/f16 on tensor cores, f32 SIMT.
//
// Math (the spec is src/reference/attention.rs, f64 with explicit masks and a full softmax):
// for each sequence b of a variable-length batch, each q head h (kv head h / (q_heads/kv_heads)),
// and each query i of the sequence at absolute position p_i = k_len - q_len + i (bottom-right
// alignment: chunked prefill after a cached prefix),
//   O[i] = sum_j softmax_j(scale * t(p_i) * <Q[i], K[j]> + mask(p_i, j)) V[j]
//   LSE[h, i] = log sum_j exp(scale * t(p_i) * <Q[i], K[j]> + mask(p_i, j))
// mask: none; causal (j <= p_i); chunked causal (j <= p_i and j >= floor(p_i / C) * C, Llama 4's
// local attention). t(p) = log(floor((p + 1) / floor_scale) + 1) * attn_scale + 1 with Llama 4
// temperature tuning (NoPE layers), else 1 (p < 0 counts as 0). A row with no allowed key
// (fully masked, or a sequence without keys) writes zeros and LSE = -inf, never NaN. The S x S
// score matrix is never stored: scores live in registers one 64-key tile at a time, with an online
// softmax (running max m and sum l, rescaled as the max grows: llk::SoftmaxState in
// common/attention_math.cuh, shared with the Hopper and decode kernels), all in f32 and base 2.
//
// Grid mapping. A block owns kBlockRows "rows" (128 up to head_dim 128, 64 at head_dim 256),
// each a (query token, q head) pair: `pack` q heads of one KV group times kBlockRows / pack
// consecutive tokens of one sequence (GQA packing: the heads that share a KV head share every K/V
// tile the block loads). grid.x enumerates the row blocks of all sequences (cu_tiles; within a
// sequence the last, heaviest causal block runs first); grid.y = kv_heads * (group / pack). K and
// V are never copied or repeated: kv head = h / group.
//
// Tensor-core path (bf16, f16; head_dim 32, 64, 96, 128 or 256). 4 warps; each owns two 16-row
// m-tiles (one at head_dim 256), so that every K or V fragment it loads with ldmatrix.x4 feeds 4
// mma instead of 2: 256 mma per 80 ldmatrix per 64-key tile at head_dim 128, where shared-memory
// bandwidth, not the tensor cores, was the limit. Q (kBlockRows x D) is staged in shared memory
// once; its A-fragments stay in registers up to head_dim 64 and are re-read from shared memory at
// every k-step above, so that the registers hold the accumulators (2 x 64 of O and 2 x 32 scores
// per thread at head_dim 128; the few loop-invariant values that do not fit are spilled once to
// L1). K/V tiles of 64 keys (32 in the _k32 kernels at head_dim 96 and 128: Q plus two stages of
// 32-key K and V take 64 KiB instead of 96, so that an A100's 164 KiB per SM holds two blocks)
// stream through a 2-stage cp.async pipeline (16-byte copies; interior
// tiles without predicates, rows past the sequence zero-filled) into shared memory with an XOR
// swizzle (16-byte chunk c of row r lives at c ^ (r % 8)), which makes every ldmatrix
// conflict-free; each lane's swizzled ldmatrix offsets are computed once (SwizzledRows). Per tile
// and warp: S = Q K^T with mma.m16n8k16, scale, mask (only on tiles that cross a mask or sequence
// boundary), online softmax with quad shuffles (O rescaled only when a row maximum of the warp
// moved), P converted in registers to A-fragments, O += P V. The output is staged through shared
// memory and written with 16-byte stores. Both K and V of the next tile are in flight during the
// whole current tile (one commit group per tile, one barrier per tile).
//
// SIMT path (f32): 32 rows per block, 4 lanes per row (each owns head_dim / 4 dims of q and of
// the accumulator), K/V tiles of 32 keys (16 at head_dim 256) in shared memory, dot products
// finished by 2 shuffles.
//
// K/V source: contiguous [total_k, kv_heads, head_dim] tensors (cu_seqlens_k offsets), or the
// paged KV cache (LLK_KV_PAGED: key j of sequence b at page block_table[b][j / page_size], row
// j % page_size, see paged_attention.cu), read in place: chunked prefill after a cached prefix
// needs no gather copy. A page id outside [0, num_pages) (or a key past the block-table row) is
// never read: its keys are zero-filled and masked out, and LLK_DEVICE_BAD_PAGE is raised.
//
// Precision: products and accumulation in f32; P is rounded to bf16/f16 for the P V mma (as in
// FlashAttention); exp2 of scaled scores; LSE is returned in natural log.
#include "common/llk.cuh"
#include "common/ptx.cuh"
#include "common/paged.cuh"
#include "common/attention_math.cuh"
#include "common/prefill_blocks.cuh"
#include "common/device_error.cuh"

namespace {

constexpr int kThreads = LLK_ATTN_THREADS;
constexpr int kWarps = kThreads / 32;
using llk::KeyInterval;
using namespace llk::prefill;

// The pages of sequence s for kv head `kv_head` (paged K/V only).
__device__ __forceinline__ llk::PageMap seq_pages(const AttentionParams& p, const Sequence& s, int64_t kv_head) {
  return llk::page_map(p.block_table, s.index, p.block_table_stride, p.max_pages, p.num_pages, p.page_size,
                       p.k_page_stride, p.v_page_stride, p.k_token_stride, kv_head * p.k_head_stride);
}

// ------------------------------------------------------------------------- tensor-core path
// Shared-memory row pitch in 16-byte chunks: a power of two >= 8, so that the XOR swizzle below
// stays inside the row (head_dim 32 and 96 rows are padded).
template <int D>
inline constexpr int kPitch = D <= 64 ? 8 : (D <= 128 ? 16 : 32);

// Element offset of 16-byte chunk c of row r in a swizzled tile of 16-bit elements.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * kPitch<D> * 8 + ((c ^ (r & 7)) * 8);
}

// 16-row m-tiles per warp: two up to head_dim 128 (each K/V ldmatrix feeds 4 mma instead of 2),
// one at head_dim 256 (whose 128 accumulators per m-tile leave no registers for a second).
template <int D>
inline constexpr int kMTiles = D <= 128 ? 2 : 1;
// Rows per block: 4 warps of kMTiles * 16 rows.
template <int D>
inline constexpr int kBlockRows = kWarps * 16 * kMTiles<D>;
static_assert(kBlockRows<128> == LLK_ATTN_ROWS_MMA && kBlockRows<256> == LLK_ATTN_ROWS_MMA_HD256,
              "params.h states the rows per block the host plans with");

// The dynamic shared memory of attention_mma_kernel at head_dim D with N-key tiles, in bytes
// from its start: the Q tile (kBlockRows rows, later the output's staging tile), two stages of
// K and of V (N rows each), all 16-bit rows of kPitch chunks; then, for paged K/V, a byte per
// key of each stage saying whether the key is readable. `bytes` is the kernel's declaration.
template <int D, int N>
struct MmaSmem {
  static constexpr int kRowBytes = kPitch<D> * 16;
  static constexpr int q = 0;
  static constexpr int k = q + kBlockRows<D> * kRowBytes;
  static constexpr int v = k + 2 * N * kRowBytes;
  static constexpr int ok = v + 2 * N * kRowBytes;
  static constexpr int bytes = ok + 2 * N;
};

// ldmatrix row addresses without per-use swizzle arithmetic. A lane addresses row R + (lane & 7)
// (R a multiple of 8, so the XOR key is lane & 7) and chunk 8 h + 2 u + c (c = 0 or 1, u < 4).
// The XOR touches only the low 3 bits, so the offset is base[u] + R * kRow + 64 h: four
// per-lane offsets per operand, everything else an immediate.
template <int D>
struct SwizzledRows {
  int base[4];
  // row0: the lane's first row (a multiple of 8 plus lane & 7); c: its chunk bit.
  __device__ SwizzledRows(int row0, int c) {
#pragma unroll
    for (int u = 0; u < 4; ++u) base[u] = swz<D>(row0, 2 * u + c);
  }
  // Element offset of row row0 + R (R % 8 == 0) and chunk 2 kk + c.
  __device__ __forceinline__ int at(int R, int kk) const { return base[kk & 3] + R * kPitch<D> * 8 + 64 * (kk >> 2); }
};

// N: keys per K/V tile, LLK_ATTN_KEYS, or LLK_ATTN_KEYS_SMALL (head_dim 96, 128) where two
// 64-key blocks do not fit on an SM (the host picks).
template <class T, int D, int N = LLK_ATTN_KEYS>
__device__ void attention_mma_kernel(const AttentionParams& p) {
  constexpr int kBlockN = N;
  constexpr int kChunks = D / 8;  // 16-byte chunks per row
  constexpr int kRow = kPitch<D> * 8;  // elements per shared-memory row
  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "head_dim 32, 64, 96, 128 or 256");
  constexpr int kMT = kMTiles<D>;
  constexpr int kRows = kBlockRows<D>;
  constexpr int kLaneRows = 2 * kMT;  // rows of this lane: g and g + 8 of each m-tile
  // Q A-fragments stay in registers while they are few (head_dim <= 64: 32 registers); above,
  // each k-step re-reads them from shared memory, so that the registers hold the accumulators.
  constexpr bool kQInRegs = kMT * D <= 128;
  static_assert(N == LLK_ATTN_KEYS || (N == LLK_ATTN_KEYS_SMALL && (D == 96 || D == 128)), "a configured key tile");
  constexpr int kTileN = N / 8;                // n-tiles of 8 keys per K/V tile
  constexpr int kSubN = D <= 128 ? kTileN : 2;  // n-tiles per softmax step
  using Smem = MmaSmem<D, N>;
  static_assert(Smem::kRowBytes == kRow * int(sizeof(T)), "16-bit rows");
  LLK_DYN_SMEM(raw);
  T* sQ = reinterpret_cast<T*>(raw + Smem::q);  // [kRows][kRow], later the output staging tile
  T* sK = reinterpret_cast<T*>(raw + Smem::k);  // [2][kBlockN][kRow]
  T* sV = reinterpret_cast<T*>(raw + Smem::v);  // [2][kBlockN][kRow]
  unsigned char* sOk = raw + Smem::ok;          // [2][kBlockN], paged K/V
  const bool paged = p.kv_source == LLK_KV_PAGED;

  if (past_last_tile(p, blockIdx.x)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const Sequence s = locate(p, blockIdx.x);
  const RowMap rows = row_map(p, s, kRows);
  const int64_t kv_head = int(rows.first_head) / int(p.q_heads / p.kv_heads);
  // Block row of this lane's row i (m-tile i / 2, half i % 2): each warp owns kMT * 16
  // consecutive rows.
  auto lane_row = [&](int i) { return (warp * kMT + i / 2) * 16 + g + 8 * (i % 2); };

  const T* q = reinterpret_cast<const T*>(p.q);
  // Contiguous K/V: this sequence's rows of this kv head (paged: the pools, addressed per key).
  const T* k = reinterpret_cast<const T*>(p.k) + (paged ? 0 : s.k_start * p.k_token_stride + kv_head * p.k_head_stride);
  const T* v = reinterpret_cast<const T*>(p.v) + (paged ? 0 : s.k_start * p.v_token_stride + kv_head * p.v_head_stride);

  // Query positions of the block, and the key tiles it needs.
  const BlockKeys bk = block_keys(p, s, rows.first_token, rows.tokens_per_block);
  // The key tiles, and those that need no mask (prefill_blocks.cuh).
  const KeyTiles kt = key_tiles(p, s, bk, kBlockN);
  const int first_tile = kt.first, end_tile = kt.end, free_lo = kt.free_lo, free_hi = kt.free_hi;

  // Q tile: rows outside the sequence are zero-filled.
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const bool ok = rows.valid(r, s.q_len);
    const T* src = ok ? q + (s.q_start + rows.token(r)) * p.q_token_stride + rows.head(r) * p.q_head_stride + c * 8 : q;
    llk::cp_async_16(sQ + swz<D>(r, c), src, ok ? 16 : 0);
  }
  // K/V tiles: thread tid copies 16-byte chunk tid % kPitch of rows tid / kPitch + i * kRowStep
  // (chunks past head_dim idle: head_dim 96), so its offsets are computed once and only advance
  // by a tile per call.
  constexpr int kRowStep = kThreads / kPitch<D>;  // 8 or 16
  constexpr int kLoadPasses = kBlockN / kRowStep;
  const int ld_c = tid % kPitch<D>, ld_r = tid / kPitch<D>;
  const bool ld_active = ld_c < kChunks;
  const int64_t k_step = kRowStep * p.k_token_stride, v_step = kRowStep * p.v_token_stride;
  auto load_kv = [&](int tile, int stage) {
    if (!ld_active) return;
    T* dk = sK + stage * kBlockN * kRow;
    T* dv = sV + stage * kBlockN * kRow;
    const int64_t key0 = tile * kBlockN + ld_r;
    if (paged) {
      // perf-model: cold { (src/inspect/perf.rs leaves these lines out of the hot path)
      const llk::PageMap pages = seq_pages(p, s, kv_head);  // from the params: no registers held across tiles
#pragma unroll 2
      for (int i = 0; i < kLoadPasses; ++i) {
        const int r = ld_r + i * kRowStep;
        const int64_t key = key0 + i * kRowStep;
        int64_t ko = 0, vo = 0;
        bool ok = key < s.k_len;
        if (ok) {
          ok = pages.locate(key, ko, vo);
          if (!ok && ld_c == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_PAGE);
        }
        llk::cp_async_16(dk + swz<D>(r, ld_c), ok ? k + ko + ld_c * 8 : k, ok ? 16 : 0);
        llk::cp_async_16(dv + swz<D>(r, ld_c), ok ? v + vo + ld_c * 8 : v, ok ? 16 : 0);
        if (ld_c == 0) sOk[stage * kBlockN + r] = ok ? 1 : 0;
      }
      return;
      // perf-model: cold }
    }
    const T* ks = k + key0 * p.k_token_stride + ld_c * 8;
    const T* vs = v + key0 * p.v_token_stride + ld_c * 8;
    if ((tile + 1) * kBlockN <= s.k_len) {
      // Every key of the tile is in the sequence: copies without predicates or address selects.
      // head_dim 256: 16 passes; unrolled fully their addresses would stay live in registers.
#pragma unroll(D <= 128 ? kLoadPasses : 4)
      for (int i = 0; i < kLoadPasses; ++i) {
        const int r = ld_r + i * kRowStep;
        llk::cp_async_16(dk + swz<D>(r, ld_c), ks + i * k_step, 16);
        llk::cp_async_16(dv + swz<D>(r, ld_c), vs + i * v_step, 16);
      }
      return;
    }
    // perf-model: cold { (the sequence's last, partial tile)
#pragma unroll(D <= 128 ? kLoadPasses : 4)
    for (int i = 0; i < kLoadPasses; ++i) {
      const int r = ld_r + i * kRowStep;
      const bool ok = key0 + i * kRowStep < s.k_len;  // rows past the sequence are zero-filled
      llk::cp_async_16(dk + swz<D>(r, ld_c), ok ? ks + i * k_step : k, ok ? 16 : 0);
      llk::cp_async_16(dv + swz<D>(r, ld_c), ok ? vs + i * v_step : v, ok ? 16 : 0);
    }
    // perf-model: cold }
  };
  if (first_tile < end_tile) load_kv(first_tile, 0);
  llk::cp_async_commit();

  // This lane's rows: their key intervals and softmax scales.
  KeyInterval keys[kLaneRows];
  float scale[kLaneRows];
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) {
    const int64_t pos = s.k_len - s.q_len + rows.token(lane_row(i));
    keys[i] = key_interval(p, pos, s.k_len);
    scale[i] = row_scale_log2(p, pos);
  }

  // Accumulators: o[mt][n] is the m16n8 tile of m-tile mt and head dims 8n..8n+7; its elements
  // 0, 1 belong to lane row 2 mt, elements 2, 3 to lane row 2 mt + 1.
  float o[kMT][kChunks][4];
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kChunks; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
  llk::SoftmaxState row[kLaneRows];  // the online softmax of each lane row
  // ldmatrix addressing, by matrix mi = lane / 8 of each x4. Q (A-fragments): mi & 1 picks rows
  // +0/+8, mi >> 1 the k-step half. K (B-fragments): mi >> 1 picks the n-tile (rows +0/+8), mi & 1
  // the k-step half. V (.trans B-fragments): mi & 1 picks the k-step half (rows +0/+8), mi >> 1
  // the d-tile.
  const int mi = lane >> 3;
  const SwizzledRows<D> q_rows((warp * kMT) * 16 + (mi & 1) * 8 + (lane & 7), mi >> 1);
  const SwizzledRows<D> k_rows((mi >> 1) * 8 + (lane & 7), mi & 1);
  const SwizzledRows<D> v_rows((mi & 1) * 8 + (lane & 7), mi >> 1);
  // The A-fragment of m-tile mt for k-step kk (head dims 16 kk .. 16 kk + 15).
  auto q_frag = [&](int mt, int kk, uint32_t (&a)[4]) { llk::ldmatrix<4, false>(a, sQ + q_rows.at(mt * 16, kk)); };
  uint32_t qf[kQInRegs ? kMT : 1][kQInRegs ? D / 16 : 1][4];

  llk::cp_async_wait<0>();
  __syncthreads();
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) q_frag(mt, kk, qf[mt][kk]);
  }

  // One barrier per tile: after it, this tile's copies have landed for every thread, and every
  // warp is done with the other stage, which the copies issued next refill while this tile's
  // math runs.
  for (int tile = first_tile; tile < end_tile; ++tile) {
    const int stage = (tile - first_tile) & 1;
    if (tile > first_tile) {
      llk::cp_async_wait<0>();
      __syncthreads();
    }
    if (tile + 1 < end_tile) {
      load_kv(tile + 1, stage ^ 1);
      llk::cp_async_commit();
    }
    const T* tk = sK + stage * kBlockN * kRow;
    const T* tv = sV + stage * kBlockN * kRow;

    // The tile in sub-steps of kSubN n-tiles of 8 keys: all N keys at once, or (head_dim 256,
    // whose 128 accumulators leave fewer registers) 16 keys at a time, one after the other.
    const int n0 = int(tile * kBlockN);
    // Mask, only on tiles that cross a mask or sequence boundary; paged K/V: every tile (a key
    // may sit on a bad page).
    const bool needs_mask = paged || tile < free_lo || tile >= free_hi;
#pragma unroll 1
    for (int sub = 0; sub < kTileN / kSubN; ++sub) {
      const int j0 = sub * kSubN;  // first n-tile of the sub-step
      // S = Q K^T for this warp's rows and the sub-step's keys, one k-step (16 head dims) at a
      // time: an ldmatrix.x4 of K holds two n-tiles, and each feeds every m-tile's mma.
      float sc[kMT][kSubN][4];
#pragma unroll
      for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
        for (int j = 0; j < kSubN; ++j) sc[mt][j][0] = sc[mt][j][1] = sc[mt][j][2] = sc[mt][j][3] = 0.f;
      // k-steps in groups, so that kk % 4 (SwizzledRows' offset index) is a compile-time constant
      // even where the outer loop stays rolled (head_dim 256: 4 k-steps per iteration).
      constexpr int kGroup = (D / 16) % 4 == 0 ? 4 : 2;
#pragma unroll(D <= 128 ? D / 16 / kGroup : 1)
      for (int kq = 0; kq < D / 16 / kGroup; ++kq)
#pragma unroll
      for (int u = 0; u < kGroup; ++u) {
        const int kk = kq * kGroup + u;
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          if constexpr (kQInRegs) {
#pragma unroll
            for (int i = 0; i < 4; ++i) a[mt][i] = qf[kQInRegs ? mt : 0][kQInRegs ? kk : 0][i];
          } else {
            q_frag(mt, kk, a[mt]);
          }
        }
#pragma unroll
        for (int j = 0; j < kSubN; j += 2) {
          uint32_t b[4];  // b[0], b[1]: n-tile j0 + j; b[2], b[3]: n-tile j0 + j + 1
          llk::ldmatrix<4, false>(b, tk + k_rows.at(8 * (j0 + j), kk));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            llk::mma_m16n8k16<T>(sc[mt][j], a[mt], b0, sc[mt][j]);
            llk::mma_m16n8k16<T>(sc[mt][j + 1], a[mt], b1, sc[mt][j + 1]);
          }
        }
      }

      if (needs_mask) {
        // perf-model: cold { (only tiles that cross the diagonal, a chunk or the sequence end)
        const unsigned char* ok = sOk + stage * kBlockN;
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int j = 0; j < kSubN; ++j)
#pragma unroll
            for (int i = 0; i < 4; ++i) {
              const int key = 8 * (j0 + j) + 2 * t + (i & 1);
              if (!keys[2 * mt + (i >> 1)].contains(n0 + key) || (paged && !ok[key])) sc[mt][j][i] = -INFINITY;
            }
        // perf-model: cold }
      }

      // Online softmax in base 2: new row maxima (quad-wide), rescale, exponentiate. The scale
      // is positive, so the maximum of the raw scores scales to the maximum of the scaled ones,
      // and exp2(s * scale - m) is one fma and one ex2.
      llk::SoftmaxStep step[kLaneRows];
      bool moved = false;
#pragma unroll
      for (int i = 0; i < kLaneRows; ++i) {
        const int mt = i / 2, h = i % 2;
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kSubN; ++j) mx = fmaxf(mx, fmaxf(sc[mt][j][2 * h], sc[mt][j][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        step[i] = row[i].update(mx * scale[i]);
        moved = moved || step[i].moved;
      }
      // Rescale O only when some row maximum of the warp moved (after the first tiles it rarely
      // does): one warp-uniform branch around the kMT x kChunks x 4 multiplies. Skipping a
      // multiply by exactly 1 changes no bit.
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
          for (int n = 0; n < kChunks; ++n) {
            o[mt][n][0] *= step[2 * mt].corr, o[mt][n][1] *= step[2 * mt].corr;
            o[mt][n][2] *= step[2 * mt + 1].corr, o[mt][n][3] *= step[2 * mt + 1].corr;
          }
      }
#pragma unroll
      for (int i = 0; i < kLaneRows; ++i) {
        const int mt = i / 2, h = i % 2;
#pragma unroll
        for (int j = 0; j < kSubN; ++j) {
          sc[mt][j][2 * h] = step[i].weight(sc[mt][j][2 * h], scale[i]);
          sc[mt][j][2 * h + 1] = step[i].weight(sc[mt][j][2 * h + 1], scale[i]);
          row[i].l += sc[mt][j][2 * h] + sc[mt][j][2 * h + 1];
        }
      }

      // O += P V: P's accumulator layout is the A-fragment layout of the next mma, and each
      // ldmatrix.x4.trans of V (two d-tiles of 16 keys) feeds every m-tile's mma.
#pragma unroll
      for (int kk = 0; kk < kSubN / 2; ++kk) {  // 16 keys per k-step
        uint32_t a[kMT][4];
#pragma unroll
        for (int mt = 0; mt < kMT; ++mt) {
          a[mt][0] = llk::pack_pair<T>(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          a[mt][1] = llk::pack_pair<T>(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          a[mt][2] = llk::pack_pair<T>(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          a[mt][3] = llk::pack_pair<T>(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
#pragma unroll
        for (int n = 0; n < kChunks; n += 2) {
          uint32_t b[4];  // b[0], b[1]: d-tile n; b[2], b[3]: d-tile n + 1
          llk::ldmatrix<4, true>(b, tv + v_rows.at(8 * j0 + 16 * kk, n / 2));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
          for (int mt = 0; mt < kMT; ++mt) {
            llk::mma_m16n8k16<T>(o[mt][n], a[mt], b0, o[mt][n]);
            llk::mma_m16n8k16<T>(o[mt][n + 1], a[mt], b1, o[mt][n + 1]);
          }
        }
      }
    }
  }

  // Finish the softmax: quad-wide sums, normalize, stage the output tile in shared memory.
  // A fully masked row: zeros, lse = -inf; a NaN sum (a non-finite score) stays NaN.
  float inv[kLaneRows], lse[kLaneRows];
#pragma unroll
  for (int i = 0; i < kLaneRows; ++i) {
    const llk::SoftmaxState total = row[i].quad_total();
    inv[i] = total.normalizer();
    lse[i] = total.lse();
  }
#pragma unroll
  for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
    for (int n = 0; n < kChunks; ++n)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * mt + h;
        const uint32_t packed = llk::pack_pair<T>(o[mt][n][2 * h] * inv[i], o[mt][n][2 * h + 1] * inv[i]);
        *reinterpret_cast<uint32_t*>(sQ + swz<D>(lane_row(i), n) + 2 * t) = packed;
      }
  if (p.lse != 0 && t == 0) {
#pragma unroll
    for (int i = 0; i < kLaneRows; ++i) {
      const int r = lane_row(i);
      if (rows.valid(r, s.q_len)) reinterpret_cast<float*>(p.lse)[rows.head(r) * p.total_q + s.q_start + rows.token(r)] = lse[i];
    }
  }
  __syncthreads();
  T* out = reinterpret_cast<T*>(p.out);
  for (int i = tid; i < kRows * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    if (!rows.valid(r, s.q_len)) continue;
    const uint4 val = *reinterpret_cast<const uint4*>(sQ + swz<D>(r, c));
    llk::store_u4(out + (s.q_start + rows.token(r)) * p.out_token_stride + rows.head(r) * p.out_head_stride + c * 8, val);
  }
}

// ------------------------------------------------------------------------- SIMT path (f32)
constexpr int kSimtRows = LLK_ATTN_ROWS_SIMT;  // 4 warps x 8 rows, 4 lanes per row

template <int D>
__device__ void attention_simt_kernel(const AttentionParams& p) {
  constexpr int kPer = D / 4;  // dims per lane: sub, sub + 4, sub + 8, ... (conflict-free reads)
  constexpr int kSimtKeys = D <= 128 ? 32 : 16;  // keys per K/V tile (static shared memory < 48 KiB)
  __shared__ float sK[kSimtKeys][D];
  __shared__ float sV[kSimtKeys][D];
  __shared__ unsigned char sOk[kSimtKeys];
  const bool paged = p.kv_source == LLK_KV_PAGED;
  if (past_last_tile(p, blockIdx.x)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), r = tid / 4, sub = tid % 4;
  const Sequence s = locate(p, blockIdx.x);
  const RowMap rows = row_map(p, s, kSimtRows);
  const bool valid = rows.valid(r, s.q_len);
  const int64_t kv_head = rows.first_head / (p.q_heads / p.kv_heads);
  const int64_t token = rows.token(r), head = rows.head(r);
  const int64_t pos = s.k_len - s.q_len + token;
  const float* k = reinterpret_cast<const float*>(p.k);
  const float* v = reinterpret_cast<const float*>(p.v);
  const llk::PageMap pages = paged ? seq_pages(p, s, kv_head) : llk::PageMap{};

  const BlockKeys bk = block_keys(p, s, rows.first_token, rows.tokens_per_block);

  float qv[kPer], acc[kPer];
  const float sc = row_scale_log2(p, pos);
  const KeyInterval keys = key_interval(p, pos, s.k_len);
  const float* qrow = reinterpret_cast<const float*>(p.q) + (s.q_start + token) * p.q_token_stride + head * p.q_head_stride;
#pragma unroll
  for (int i = 0; i < kPer; ++i) qv[i] = valid ? qrow[4 * i + sub] * sc : 0.f, acc[i] = 0.f;
  llk::SoftmaxState row;

  for (int64_t n0 = (bk.begin / kSimtKeys) * kSimtKeys; n0 < bk.end; n0 += kSimtKeys) {
    __syncthreads();  // the previous tile is consumed
    for (int i = tid; i < kSimtKeys * D; i += kThreads) {
      const int j = i / D, d = i % D;
      int64_t ko = 0, vo = 0;
      bool ok = n0 + j < s.k_len;
      if (ok && paged) {
        ok = pages.locate(n0 + j, ko, vo);
        if (!ok && d == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_PAGE);
      } else if (ok) {
        ko = (s.k_start + n0 + j) * p.k_token_stride + kv_head * p.k_head_stride;
        vo = (s.k_start + n0 + j) * p.v_token_stride + kv_head * p.v_head_stride;
      }
      sK[j][d] = ok ? k[ko + d] : 0.f;
      sV[j][d] = ok ? v[vo + d] : 0.f;
      if (d == 0) sOk[j] = ok ? 1 : 0;
    }
    __syncthreads();
    for (int j = 0; j < kSimtKeys; ++j) {
      float x = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) x = fmaf(qv[i], sK[j][4 * i + sub], x);
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (!keys.contains(int(n0) + j) || (paged && !sOk[j])) x = -INFINITY;
      const llk::KeyStep step = row.add_key(x);
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] = fmaf(step.p, sV[j][4 * i + sub], acc[i] * step.corr);
    }
  }
  if (!valid) return;  // no barriers or warp operations below
  const float inv = row.normalizer();  // fully masked: zeros; NaN stays NaN
  float* orow = reinterpret_cast<float*>(p.out) + (s.q_start + token) * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
  for (int i = 0; i < kPer; ++i) orow[4 * i + sub] = acc[i] * inv;
  if (p.lse != 0 && sub == 0)
    reinterpret_cast<float*>(p.lse)[head * p.total_q + s.q_start + token] = row.lse();
}

// ------------------------------------------------------------------------- plan (device offsets)
// One warp turns device-resident cu_seqlens into cu_tiles, the first grid.x tile of each
// sequence, so that a call needs no host copy: pass 1 validates (cu[0] == 0, non-decreasing,
// cu[batch] == total, for q and k), pass 2 is a warp-wide inclusive scan of the per-sequence tile
// counts, 32 sequences per step. Invalid offsets raise LLK_DEVICE_BAD_SEQLENS and leave every
// cu_tiles entry 0, so the attention launch that follows exits at once.
__device__ void attention_plan_kernel(const AttentionPlanParams& p) {
  const int lane = int(threadIdx.x);
  const int32_t* cu_q = reinterpret_cast<const int32_t*>(p.cu_seqlens_q);
  const int32_t* cu_k = reinterpret_cast<const int32_t*>(p.cu_seqlens_k);
  int32_t* cu_tiles = reinterpret_cast<int32_t*>(p.cu_tiles);
  bool bad = false;
  if (lane == 0)
    bad = cu_q[0] != 0 || cu_k[0] != 0 || cu_q[p.batch] != p.total_q || (p.total_k >= 0 && cu_k[p.batch] != p.total_k);
  for (int64_t i = lane; i < p.batch; i += 32) bad = bad || cu_q[i + 1] < cu_q[i] || cu_k[i + 1] < cu_k[i];
  bad = __any_sync(0xffffffffu, bad);
  int64_t carry = 0;
  if (lane == 0) cu_tiles[0] = 0;
  for (int64_t base = 0; base < p.batch; base += 32) {  // warp-uniform trip count
    const int64_t i = base + lane;
    int64_t tiles = 0;
    if (!bad && i < p.batch) tiles = (int64_t(cu_q[i + 1]) - cu_q[i] + p.tokens_per_block - 1) / p.tokens_per_block;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t n = __shfl_up_sync(0xffffffffu, tiles, o);
      if (lane >= o) tiles += n;
    }
    if (i < p.batch) cu_tiles[i + 1] = int32_t(carry + tiles);
    carry += __shfl_sync(0xffffffffu, tiles, 31);
  }
  if (bad && lane == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_SEQLENS);
}

}  // namespace

// Symbols: attention_hd<head_dim>_<dtype>. bf16/f16 run on tensor cores, f32 on the SIMT path.
// head_dim 32 and 96 pad their shared-memory rows (the swizzle needs a power of two >= 8 chunks).
#define ATTENTION_KERNELS(X)                                                                          \
  X(attention_hd32_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<32, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__nv_bfloat16, 32>))     \
  X(attention_hd256_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<256, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__nv_bfloat16, 256>))   \
  X(attention_hd32_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<32, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__half, 32>))             \
  X(attention_hd256_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<256, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__half, 256>))           \
  X(attention_hd32_f32, AttentionParams, (kThreads), LLK_SMEM_NONE, (attention_simt_kernel<32>))                    \
  X(attention_hd256_f32, AttentionParams, (kThreads), LLK_SMEM_NONE, (attention_simt_kernel<256>))                  \
  X(attention_hd64_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<64, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__nv_bfloat16, 64>))     \
  X(attention_hd96_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<96, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__nv_bfloat16, 96>))     \
  X(attention_hd128_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<128, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__nv_bfloat16, 128>))   \
  X(attention_hd64_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<64, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__half, 64>))             \
  X(attention_hd96_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<96, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__half, 96>))             \
  X(attention_hd128_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<128, LLK_ATTN_KEYS>::bytes)), (attention_mma_kernel<__half, 128>))           \
  X(attention_hd96_k32_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<96, 32>::bytes)), (attention_mma_kernel<__nv_bfloat16, 96, 32>))   \
  X(attention_hd128_k32_bf16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<128, 32>::bytes)), (attention_mma_kernel<__nv_bfloat16, 128, 32>)) \
  X(attention_hd96_k32_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<96, 32>::bytes)), (attention_mma_kernel<__half, 96, 32>))           \
  X(attention_hd128_k32_f16, AttentionParams, (kThreads), LLK_SMEM_FIXED((MmaSmem<128, 32>::bytes)), (attention_mma_kernel<__half, 128, 32>))         \
  X(attention_hd64_f32, AttentionParams, (kThreads), LLK_SMEM_NONE, (attention_simt_kernel<64>))                    \
  X(attention_hd96_f32, AttentionParams, (kThreads), LLK_SMEM_NONE, (attention_simt_kernel<96>))                    \
  X(attention_hd128_f32, AttentionParams, (kThreads), LLK_SMEM_NONE, (attention_simt_kernel<128>))                  \
  X(attention_plan, AttentionPlanParams, (32), LLK_SMEM_NONE, (attention_plan_kernel))

LLK_EXPORT_KERNELS(attention, ATTENTION_KERNELS)
