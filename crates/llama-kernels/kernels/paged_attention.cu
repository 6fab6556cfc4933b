// paged_attention.cu -- the paged KV cache: append, split-KV decode attention, state merge.
//
// Cache layout (FlashInfer / FlashAttention "NHD"): K and V pools [num_pages, page_size,
// kv_heads, head_dim], each page contiguous, pages page_stride elements apart; a block table
// [batch, max_pages] i32 names the pages of each sequence in order, and seq_lens [batch] i32 the
// number of keys. Key j of sequence b lives at page block_table[b][j / page_size], row
// j % page_size. A page id outside [0, num_pages) is never dereferenced: the keys it would hold
// are skipped (zero-filled and masked out) and LLK_DEVICE_BAD_PAGE is OR-ed into the error flag.
// fp8 pages hold e4m3fn codes (common/fp8.cuh): stored = fp8(x / scale), read = fp8 * scale, one
// scale per KV head (a per-tensor scale is passed repeated).
//
// kv_append. One thread per 16-byte unit of the narrower of source and page element: it loads
// its k or v elements of one (token, head) with 16-byte loads, converts (f32 math; fp8: x / scale
// in f32, then round to nearest even, saturating), and stores 16 bytes into the token's slot
// (slot_mapping i64: page * page_size + row; -1 skips the token, padding as vLLM uses it).
//
// paged_decode. q [batch * q_len, q_heads, head_dim]: q_len (1..8) new tokens per sequence,
// token i of sequence b at absolute position p = seq_len - q_len + i, causal among themselves
// (key j allowed when j <= p; Llama 4 chunked local attention also needs j >= floor(p / C) * C).
// Scores scale * t(p) * <q, k> with Llama 4's temperature t(p) as in attention.cu. The math is
// attention.cu's (the same online softmax, llk::SoftmaxState, in base 2; f32 accumulation; fully
// masked rows give zeros and LSE = -inf). The warps that split one m-tile's keys merge their
// states with SoftmaxState::merge.
//
// Grid: x = batch * num_splits, y = kv_heads * row_blocks. A block owns one split (a contiguous
// run of 64-key tiles) of one sequence and the rows of one KV group: row r is (token r / group,
// q head kv_head * group + r % group), so the q heads that share a KV head share the mma rows
// (tensor cores even at q_len 1). Up to 64 rows per block (more rows: more row blocks).
// Tensor-core path (bf16/f16 q; pages of the same dtype or fp8): 4 warps. The rows form m-tiles
// of 16; warp w takes m-tile w % mtiles and every (4 / mtiles)-th 16-key step of each tile, so
// with <= 16 rows (GQA 8 decode) the 4 warps split each tile's keys. K/V tiles stream through a
// cp.async pipeline (2 or 3 stages, 16-byte copies, swizzled rows: chunk c of row r at
// c ^ (r % 8)); per 16 keys: S = Q K^T (mma.m16n8k16, K by ldmatrix), mask, online softmax,
// O += P V (V by ldmatrix.trans). fp8 pages are copied as bytes and dequantized in registers
// after ldmatrix: 4 codes -> 4 f16/bf16 (exact, times 2^-8; the 2^8 and the scales fold into the
// softmax scale and the output); K's codes arrive as dims 4t..4t+3, so Q's A-fragments are built
// with the matching permutation of each 16-dim k-step, and V's as two keys x two dims, which
// become one even-dim and one odd-dim n-tile. At the end the warps of an m-tile merge their
// (m, l, O) through shared memory in a fixed order. head_dim 256 re-reads Q from shared memory
// at every k-step (registers hold O); smaller head dims keep Q in registers.
// SIMT path (f32 q and pages): 32 rows per block, 4 lanes per row, 16-key tiles in shared memory.
//
// Splits: with num_splits == 1 a block writes the output (and LSE) directly; otherwise it writes
// its normalized partial output (f32) and LSE, and paged_decode_merge combines the splits:
// lse = log sum_s exp(lse_s), o = sum_s exp(lse_s - lse) o_s, in split order (deterministic).
// merge_states is the same merge for two states of any strides (cascade attention).
#include "common/llk.cuh"
#include "common/ptx.cuh"
#include "common/fp8.cuh"
#include "common/paged.cuh"
#include "common/attention_math.cuh"
#include "common/device_error.cuh"

namespace {

using fp8_t = uint8_t;  // page element of e4m3fn pages

constexpr int kThreads = LLK_DECODE_THREADS;
constexpr int kKeys = LLK_DECODE_KEYS;
using llk::kLog2e;
using llk::KeyInterval;

// ------------------------------------------------------------------------------ kv_append
template <class S, class P>
__device__ void kv_append_kernel(const KvAppendParams& p) {
  constexpr int kE = int(16 / (sizeof(S) < sizeof(P) ? sizeof(S) : sizeof(P)));  // elements per thread
  constexpr int kSrcVec = int(16 / sizeof(S));
  const int64_t vecs = p.head_dim / kE;
  const int64_t per_kv = p.kv_heads * vecs;
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx >= p.tokens * 2 * per_kv) return;
  const int64_t token = idx / (2 * per_kv);
  int64_t rem = idx - token * 2 * per_kv;
  const bool is_v = rem >= per_kv;
  rem -= is_v ? per_kv : 0;
  const int64_t head = rem / vecs, vec = rem - head * vecs;

  const int64_t slot = reinterpret_cast<const int64_t*>(p.slot_mapping)[token];
  if (slot == -1) return;  // padding
  const int64_t page = slot >= 0 ? slot / p.page_size : -1;
  if (slot < -1 || page >= p.num_pages) {
    if (vec == 0 && head == 0 && !is_v) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_PAGE);
    return;
  }
  const int64_t row = slot - page * p.page_size;
  const S* src = reinterpret_cast<const S*>(is_v ? p.v : p.k) + token * (is_v ? p.v_token_stride : p.k_token_stride) +
                 head * (is_v ? p.v_head_stride : p.k_head_stride) + vec * kE;
  float x[kE];
#pragma unroll
  for (int i = 0; i < kE / kSrcVec; ++i) {
    float part[kSrcVec];
    llk::load_f32_readonly<S, kSrcVec>(src + i * kSrcVec, part);  // LDG.128: k and v are only read
#pragma unroll
    for (int j = 0; j < kSrcVec; ++j) x[i * kSrcVec + j] = part[j];
  }
  P* dst = reinterpret_cast<P*>(is_v ? p.v_pages : p.k_pages) + page * (is_v ? p.v_page_stride : p.k_page_stride) +
           (row * p.kv_heads + head) * p.head_dim + vec * kE;
  if constexpr (sizeof(P) == 1) {
    const float scale = is_v ? p.v_scale[head] : p.k_scale[head];
    uint32_t w[4] = {0, 0, 0, 0};
#pragma unroll
    for (int i = 0; i < 16; ++i) w[i / 4] |= llk::e4m3_from_f32(x[i] / scale) << (8 * (i % 4));
    llk::store_u4(dst, make_uint4(w[0], w[1], w[2], w[3]));
  } else {
    constexpr int kDstVec = int(16 / sizeof(P));
#pragma unroll
    for (int i = 0; i < kE / kDstVec; ++i) {
      float part[kDstVec];
#pragma unroll
      for (int j = 0; j < kDstVec; ++j) part[j] = x[i * kDstVec + j];
      llk::store_f32<P, kDstVec>(dst + i * kDstVec, part);
    }
  }
}

// ------------------------------------------------------------------------------ decode: shared
// The sequence and split of a block, and the 64-key tiles [tile_begin, tile_end) it covers.
struct DecodeSeq {
  int64_t b, split;
  int len, q_len;
  int64_t tile_begin, tile_end;
};

__device__ DecodeSeq decode_seq(const PagedDecodeParams& p) {
  DecodeSeq s;
  s.b = int64_t(blockIdx.x) / p.num_splits;
  s.split = int64_t(blockIdx.x) - s.b * p.num_splits;
  s.q_len = int(p.q_len);
  int64_t len = reinterpret_cast<const int32_t*>(p.seq_lens)[s.b];
  const int64_t cap = p.max_pages * p.page_size;
  if (len < 0 || len > cap) {
    // Invalid: never read past the block-table row. Reported once per sequence.
    if (s.split == 0 && blockIdx.y == 0 && threadIdx.x == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_SEQLENS);
    len = len < 0 ? 0 : cap;
  }
  s.len = int(len);
  // Keys any of the sequence's queries may attend: [lo, len).
  const int64_t lo = llk::chunk_start(p.variant, len - p.q_len);
  const int64_t t0 = lo / kKeys, t1 = (len + kKeys - 1) / kKeys;
  const int64_t per_split = (t1 - t0 + p.num_splits - 1) / p.num_splits;
  s.tile_begin = min(t1, t0 + s.split * per_split);
  s.tile_end = min(t1, s.tile_begin + per_split);
  return s;
}

// The keys the query at `pos` attends (the mask is causal or chunked), and its base-2 score
// scale with K's dequantization (attention_math.cuh).
__device__ __forceinline__ KeyInterval decode_interval(const PagedDecodeParams& p, int64_t pos, int len) {
  return llk::key_interval(p.variant, pos, len);
}
__device__ __forceinline__ float decode_scale_log2(const PagedDecodeParams& p, int64_t pos, float k_scale) {
  return llk::score_scale_log2(p.variant, pos, k_scale);
}

// Row r of a block: query token and q head.
struct DecodeRows {
  int group, first, count;  // rows [first, first + count) of the KV group's group * q_len
  int64_t kv_head;
  __device__ int token(int r) const { return (first + r) / group; }
  __device__ int64_t head(int r) const { return kv_head * group + (first + r) % group; }
};

__device__ DecodeRows decode_rows(const PagedDecodeParams& p, int rows_per_block) {
  DecodeRows m;
  m.group = int(p.q_heads / p.kv_heads);
  const int rb = int(int64_t(blockIdx.y) % p.row_blocks);
  m.kv_head = int64_t(blockIdx.y) / p.row_blocks;
  m.first = rb * rows_per_block;
  m.count = min(rows_per_block, m.group * int(p.q_len) - m.first);
  return m;
}

__device__ __forceinline__ llk::PageMap decode_pages(const PagedDecodeParams& p, int64_t b, int64_t kv_head) {
  return llk::page_map(p.block_table, b, p.block_table_stride, p.max_pages, p.num_pages, p.page_size, p.k_page_stride,
                       p.v_page_stride, p.kv_heads * p.head_dim, kv_head * p.head_dim);
}

// Where a finished row goes: the output (one split) or the split's f32 partial output.
template <class T>
struct RowOut {
  T* out;         // num_splits == 1
  float* part;    // num_splits > 1
  // Values for dims dim .. dim + N - 1.
  template <int N>
  __device__ __forceinline__ void store(int dim, const float (&v)[N]) const {
    if (out != nullptr) {
      if constexpr (std::is_same<T, float>::value) {
#pragma unroll
        for (int i = 0; i < N; ++i) out[dim + i] = v[i];
      } else {
#pragma unroll
        for (int i = 0; i < N; i += 2) *reinterpret_cast<uint32_t*>(out + dim + i) = llk::pack2(v[i], v[i + 1], T());
      }
    } else {
#pragma unroll
      for (int i = 0; i < N; ++i) part[dim + i] = v[i];
    }
  }
};

template <class T>
__device__ RowOut<T> row_out(const PagedDecodeParams& p, int64_t token, int64_t head) {
  RowOut<T> r{nullptr, nullptr};
  if (p.num_splits == 1) {
    r.out = reinterpret_cast<T*>(p.out) + token * p.out_token_stride + head * p.out_head_stride;
  } else {
    const int64_t split = int64_t(blockIdx.x) % p.num_splits;
    r.part = reinterpret_cast<float*>(p.partial_out) + ((split * p.batch * p.q_len + token) * p.q_heads + head) * p.head_dim;
  }
  return r;
}

__device__ __forceinline__ void store_lse(const PagedDecodeParams& p, int64_t token, int64_t head, float lse) {
  const int64_t tokens = p.batch * p.q_len;
  if (p.num_splits == 1) {
    if (p.lse != 0) reinterpret_cast<float*>(p.lse)[head * tokens + token] = lse;
  } else {
    reinterpret_cast<float*>(p.partial_lse)[((blockIdx.x % p.num_splits) * tokens + token) * p.q_heads + head] = lse;
  }
}

// ------------------------------------------------------------------------------ decode: tensor cores
// Shared-memory rows: a power of two of 16-byte chunks, at least 8 (the swizzle's reach).
__host__ __device__ constexpr int pitch_chunks(int chunks) {
  return chunks <= 8 ? 8 : (chunks <= 16 ? 16 : 32);
}
__device__ __forceinline__ int swz(int pitch, int r, int c) { return r * pitch * 16 + ((c ^ (r & 7)) * 16); }

template <int D, int kElem>
struct DecodeLayout {
  static constexpr int kQPitch = pitch_chunks(D / 8);           // Q rows, 16-bit
  static constexpr int kKVPitch = pitch_chunks(D * kElem / 16); // K/V rows, page elements
  static constexpr int kQBytes = LLK_DECODE_ROWS_MMA * kQPitch * 16;
  static constexpr int kTileBytes = kKeys * kKVPitch * 16;      // one K or V tile
  // Three stages when they fit in 128 KiB with Q, else two (head_dim 256 of 16-bit pages).
  static constexpr int kStages = kQBytes + 3 * 2 * kTileBytes + 3 * kKeys <= 131072 ? 3 : 2;
};

// The dynamic shared memory of paged_decode_mma_kernel with S stages (0: DecodeLayout's), in
// bytes from its start: the Q rows, then per stage a K and a V tile, then per stage a byte per
// key (readable and inside the sequence). `bytes` is the kernel's declaration.
template <int D, int kElem, int S = 0>
struct DecodeSmem {
  using L = DecodeLayout<D, kElem>;
  static constexpr int kStages = S != 0 ? S : L::kStages;
  static constexpr int q = 0;
  static constexpr int kv = q + L::kQBytes;
  static constexpr int ok = kv + kStages * 2 * L::kTileBytes;
  static constexpr int bytes = ok + kStages * kKeys;
};

// S: K/V stages, 0 for DecodeLayout's (3 where they fit in 128 KiB), or LLK_DECODE_STAGES_SMALL
// (head_dim 96 and 128, 16-bit pages: 80 KiB, two blocks on an A100's SM; the host picks).
template <class T, class P, int D, int S = 0>
__device__ void paged_decode_mma_kernel(const PagedDecodeParams& p) {
  static_assert(D == 32 || D == 64 || D == 96 || D == 128 || D == 256, "head_dim 32, 64, 96, 128 or 256");
  static_assert(S == 0 || (S == LLK_DECODE_STAGES_SMALL && (D == 96 || D == 128) && sizeof(P) == 2), "a configured stage count");
  constexpr bool kFp8 = sizeof(P) == 1;
  using L = DecodeLayout<D, int(sizeof(P))>;
  using Smem = DecodeSmem<D, int(sizeof(P)), S>;
  constexpr int kStages = Smem::kStages;
  constexpr int kKVChunks = D * int(sizeof(P)) / 16;
  constexpr int kChunkElems = 16 / int(sizeof(P));
  constexpr bool kQInRegs = D <= 128;
  constexpr int kQSteps = kQInRegs ? D / 16 : 1;
  LLK_DYN_SMEM(raw);
  unsigned char* sQ = raw + Smem::q;    // [64 rows][kQPitch chunks] of T
  unsigned char* sKV = raw + Smem::kv;  // [stage][K, V][64 keys][kKVPitch chunks]
  unsigned char* sOk = raw + Smem::ok;  // [stage][64]: key readable and < len

  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const DecodeSeq s = decode_seq(p);
  const DecodeRows rows = decode_rows(p, LLK_DECODE_ROWS_MMA);
  const P* kp = reinterpret_cast<const P*>(p.k_pages);
  const P* vp = reinterpret_cast<const P*>(p.v_pages);
  const T* q = reinterpret_cast<const T*>(p.q);

  // Q rows (zero past the block's rows).
  for (int i = tid; i < LLK_DECODE_ROWS_MMA * (D / 8); i += kThreads) {
    const int r = i / (D / 8), c = i % (D / 8);
    const bool ok = r < rows.count;
    const T* src = ok ? q + (s.b * s.q_len + rows.token(r)) * p.q_token_stride + rows.head(r) * p.q_head_stride + c * 8 : q;
    llk::cp_async_16(sQ + swz(L::kQPitch, r, c), src, ok ? 16 : 0);
  }
  llk::cp_async_commit();

  // K/V tiles: thread tid copies chunk tid % kKVPitch of rows tid / kKVPitch + i * kRowStep.
  constexpr int kRowStep = kThreads / L::kKVPitch;
  constexpr int kPasses = kKeys / kRowStep;
  const int ld_c = tid % L::kKVPitch, ld_r = tid / L::kKVPitch;
  auto load_tile = [&](int64_t tile, int stage) {
    if (ld_c >= kKVChunks) return;
    unsigned char* dk = sKV + (2 * stage) * L::kTileBytes;
    unsigned char* dv = dk + L::kTileBytes;
    const llk::PageMap pages = decode_pages(p, s.b, rows.kv_head);  // from the params, per tile
    // Partly unrolled: two block-table reads in flight, and a small code footprint.
#pragma unroll 2
    for (int i = 0; i < kPasses; ++i) {
      const int r = ld_r + i * kRowStep;
      const int key = int(tile) * kKeys + r;
      bool ok = key < s.len;
      int64_t ko = 0, vo = 0;
      if (ok) {
        ok = pages.locate(key, ko, vo);
        if (!ok && ld_c == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_PAGE);
      }
      llk::cp_async_16(dk + swz(L::kKVPitch, r, ld_c), ok ? kp + ko + ld_c * kChunkElems : kp, ok ? 16 : 0);
      llk::cp_async_16(dv + swz(L::kKVPitch, r, ld_c), ok ? vp + vo + ld_c * kChunkElems : vp, ok ? 16 : 0);
      if (ld_c == 0) sOk[stage * kKeys + r] = ok ? 1 : 0;
    }
  };
#pragma unroll 1
  for (int i = 0; i < kStages - 1; ++i) {
    if (s.tile_begin + i < s.tile_end) load_tile(s.tile_begin + i, i);
    llk::cp_async_commit();
  }

  // Warp roles: m-tile and key share.
  const int mtiles = (rows.count + 15) / 16;
  const int shares = 4 / mtiles;  // warps per m-tile (1, 2 or 4)
  const int mt = warp % mtiles, share = warp / mtiles;
  const bool active = share < shares;
  // Scales exist for fp8 pages only (at most LLK_KV_MAX_SCALES KV heads); 16-bit pages may have
  // any number of KV heads and never index the arrays.
  const float k_scale = kFp8 ? p.k_scale[rows.kv_head] * llk::kFp8Unscale : 1.f;
  const float v_scale = kFp8 ? p.v_scale[rows.kv_head] * llk::kFp8Unscale : 1.f;

  // This lane's rows g and g + 8 of its m-tile.
  KeyInterval keys[2];
  float scale[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = mt * 16 + g + 8 * h;
    const int64_t pos = int64_t(s.len) - s.q_len + rows.token(r);
    keys[h] = r < rows.count ? decode_interval(p, pos, s.len) : KeyInterval{0, -1};
    scale[h] = decode_scale_log2(p, pos, k_scale);
  }

  float o[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  llk::SoftmaxState row[2];  // the online softmax of rows g and g + 8

  // Q A-fragments of k-step kk. 16-bit pages: the standard layout (ldmatrix). fp8 pages: the
  // k-step's dims permuted as K's codes arrive (lane t holds dims 4t..4t+3 of rows g, g + 8).
  auto q_frag = [&](int kk, uint32_t (&a)[4]) {
    if constexpr (!kFp8) {
      const int mi = lane >> 3, r = mt * 16 + (mi & 1) * 8 + (lane & 7);
      llk::ldmatrix<4, false>(a, sQ + swz(L::kQPitch, r, 2 * kk + (mi >> 1)));
    } else {
      const int c = 2 * kk + (t >> 1), e = 4 * (t & 1);
      const uint2 x0 = *reinterpret_cast<const uint2*>(sQ + swz(L::kQPitch, mt * 16 + g, c) + 2 * e);
      const uint2 x1 = *reinterpret_cast<const uint2*>(sQ + swz(L::kQPitch, mt * 16 + g + 8, c) + 2 * e);
      a[0] = x0.x, a[1] = x1.x, a[2] = x0.y, a[3] = x1.y;
    }
  };
  uint32_t qf[kQSteps][4];
  llk::cp_async_wait<kStages - 1>();  // Q (the oldest group) has landed for this thread
  __syncthreads();
  if constexpr (kQInRegs) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) q_frag(kk, qf[kk]);
  }

  for (int64_t tile = s.tile_begin; tile < s.tile_end; ++tile) {
    const int stage = int((tile - s.tile_begin) % kStages);
    llk::cp_async_wait<kStages - 2>();  // this thread's copies of `tile` have landed
    __syncthreads();                    // everyone's have, and everyone is done with tile - 1
    if (tile + kStages - 1 < s.tile_end) load_tile(tile + kStages - 1, int((tile + kStages - 1 - s.tile_begin) % kStages));
    llk::cp_async_commit();
    if (!active) continue;
    const unsigned char* tk = sKV + (2 * stage) * L::kTileBytes;
    const unsigned char* tv = tk + L::kTileBytes;
    const unsigned char* ok = sOk + stage * kKeys;

    for (int step = share; step < 4; step += shares) {
      const int k0 = step * 16;  // key of the tile
      // S = Q K^T: 16 rows x 16 keys (two n-tiles of 8).
      float sc[2][4];
#pragma unroll
      for (int j = 0; j < 2; ++j) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; kk += 2) {
        uint32_t a0[4], a1[4];
        if constexpr (kQInRegs) {
#pragma unroll
          for (int i = 0; i < 4; ++i) a0[i] = qf[kQInRegs ? kk : 0][i], a1[i] = qf[kQInRegs ? kk + 1 : 0][i];
        } else {
          q_frag(kk, a0);
          q_frag(kk + 1, a1);
        }
        if constexpr (!kFp8) {
#pragma unroll
          for (int j = 0; j < 2; ++j) {
            uint32_t b[4];  // b[0], b[1]: k-step kk; b[2], b[3]: kk + 1
            llk::ldmatrix<4, false>(b, tk + swz(L::kKVPitch, k0 + 8 * j + (lane & 7), 2 * kk + (lane >> 3)));
            const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
            llk::mma_m16n8k16<T>(sc[j], a0, b0, sc[j]);
            llk::mma_m16n8k16<T>(sc[j], a1, b1, sc[j]);
          }
        } else {
          // Matrices: (keys 0-7, kk), (keys 8-15, kk), (keys 0-7, kk + 1), (keys 8-15, kk + 1);
          // one 16-byte chunk is one k-step of 16 codes.
          const int mi = lane >> 3;
          uint32_t r[4];
          llk::ldmatrix<4, false>(r, tk + swz(L::kKVPitch, k0 + 8 * (mi & 1) + (lane & 7), kk + (mi >> 1)));
#pragma unroll
          for (int x = 0; x < 4; ++x) {
            uint32_t b[2];
            llk::e4m3x4_to_pairs<T>(r[x], b[0], b[1]);
            llk::mma_m16n8k16<T>(sc[x & 1], (x >> 1) ? a1 : a0, b, sc[x & 1]);
          }
        }
      }

      // Mask: keys outside the row's interval, past the sequence or on a bad page.
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int kl = k0 + 8 * j + 2 * t + (i & 1);
          if (!ok[kl] || !keys[i >> 1].contains(int(tile) * kKeys + kl)) sc[j][i] = -INFINITY;
        }

      // Online softmax in base 2 (see attention.cu); O is rescaled only when some row maximum
      // of the warp moved (a multiply by exactly 1 skipped).
      llk::SoftmaxStep next[2];
      bool moved = false;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        float mx = fmaxf(fmaxf(sc[0][2 * h], sc[0][2 * h + 1]), fmaxf(sc[1][2 * h], sc[1][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        next[h] = row[h].update(mx * scale[h]);
        moved = moved || next[h].moved;
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          sc[j][2 * h] = next[h].weight(sc[j][2 * h], scale[h]);
          sc[j][2 * h + 1] = next[h].weight(sc[j][2 * h + 1], scale[h]);
          row[h].l += sc[j][2 * h] + sc[j][2 * h + 1];
        }
      }
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int n = 0; n < D / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) o[n][i] *= next[i >> 1].corr;
      }

      // O += P V: the 16 keys are one k-step.
      const uint32_t a[4] = {llk::pack_pair<T>(sc[0][0], sc[0][1]), llk::pack_pair<T>(sc[0][2], sc[0][3]),
                             llk::pack_pair<T>(sc[1][0], sc[1][1]), llk::pack_pair<T>(sc[1][2], sc[1][3])};
      const int mi = lane >> 3;
      if constexpr (!kFp8) {
#pragma unroll
        for (int n = 0; n < D / 8; n += 2) {
          uint32_t b[4];  // b[0], b[1]: d-tile n; b[2], b[3]: d-tile n + 1
          llk::ldmatrix<4, true>(b, tv + swz(L::kKVPitch, k0 + (mi & 1) * 8 + (lane & 7), n + (mi >> 1)));
          const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
          llk::mma_m16n8k16<T>(o[n], a, b0, o[n]);
          llk::mma_m16n8k16<T>(o[n + 1], a, b1, o[n + 1]);
        }
      } else {
        // Matrices: (keys 0-7, chunk c), (keys 8-15, c), (0-7, c + 1), (8-15, c + 1). Each
        // register: codes of keys 2t, 2t + 1 at dims 2g, 2g + 1 of its chunk; the even dims
        // form n-tile 2c, the odd dims n-tile 2c + 1.
#pragma unroll
        for (int c = 0; c < D / 16; c += 2) {
          uint32_t r[4];
          llk::ldmatrix<4, true>(r, tv + swz(L::kKVPitch, k0 + 8 * (mi & 1) + (lane & 7), c + (mi >> 1)));
#pragma unroll
          for (int cc = 0; cc < 2; ++cc) {
            uint32_t e0, o0, e1, o1;
            llk::e4m3x4_to_pairs_across<T>(r[2 * cc], e0, o0);
            llk::e4m3x4_to_pairs_across<T>(r[2 * cc + 1], e1, o1);
            const uint32_t be[2] = {e0, e1}, bo[2] = {o0, o1};
            llk::mma_m16n8k16<T>(o[2 * (c + cc)], a, be, o[2 * (c + cc)]);
            llk::mma_m16n8k16<T>(o[2 * (c + cc) + 1], a, bo, o[2 * (c + cc) + 1]);
          }
        }
      }
    }
  }

  // Merge the warps of each m-tile (fixed order), through the now idle K/V stages.
  llk::cp_async_wait<0>();
  __syncthreads();
  float* so = reinterpret_cast<float*>(sKV);  // [warp][D / 2][32 lanes]
  float* sml = reinterpret_cast<float*>(sQ);  // [warp][4][32 lanes]: m0, m1, l0, l1
  if (active && share > 0) {
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) so[(warp * (D / 2) + n * 4 + i) * 32 + lane] = o[n][i];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      sml[(warp * 4 + h) * 32 + lane] = row[h].m;
      sml[(warp * 4 + 2 + h) * 32 + lane] = row[h].l;
    }
  }
  __syncthreads();
  if (!active || share > 0) return;  // no barriers below
  for (int other = 1; other < shares; ++other) {
    const int w = mt + other * mtiles;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const llk::SoftmaxState theirs{sml[(w * 4 + h) * 32 + lane], sml[(w * 4 + 2 + h) * 32 + lane]};
      const llk::MergeFactors f = row[h].merge(theirs);
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int i = 2 * h + e;
          o[n][i] = o[n][i] * f.self + so[(w * (D / 2) + n * 4 + i) * 32 + lane] * f.other;
        }
    }
  }

  // Finish: quad-wide sums, normalize (V's dequantization folded in), write.
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const llk::SoftmaxState total = row[h].quad_total();
    const int r = mt * 16 + g + 8 * h;
    if (r >= rows.count) continue;
    const float inv = total.normalizer(v_scale);  // fully masked: zeros; NaN stays NaN
    const int64_t token = s.b * s.q_len + rows.token(r), head = rows.head(r);
    const RowOut<T> dst = row_out<T>(p, token, head);
    if constexpr (!kFp8) {
#pragma unroll
      for (int n = 0; n < D / 8; ++n) {
        const float v[2] = {o[n][2 * h] * inv, o[n][2 * h + 1] * inv};
        dst.store(8 * n + 2 * t, v);
      }
    } else {
#pragma unroll
      for (int c = 0; c < D / 16; ++c) {
        const float v[4] = {o[2 * c][2 * h] * inv, o[2 * c + 1][2 * h] * inv, o[2 * c][2 * h + 1] * inv,
                            o[2 * c + 1][2 * h + 1] * inv};
        dst.store(16 * c + 4 * t, v);
      }
    }
    if (t == 0) store_lse(p, token, head, total.lse());
  }
}

// ------------------------------------------------------------------------------ decode: SIMT (f32)
constexpr int kSimtKeys = 16;

template <int D>
__device__ void paged_decode_simt_kernel(const PagedDecodeParams& p) {
  constexpr int kPer = D / 4;  // dims per lane: sub, sub + 4, ...
  __shared__ __align__(16) float sK[kSimtKeys][D];  // float4 stores below: 16-byte aligned
  __shared__ __align__(16) float sV[kSimtKeys][D];
  __shared__ unsigned char sOk[kSimtKeys];
  const int tid = int(threadIdx.x), r = tid / 4, sub = tid % 4;
  const DecodeSeq s = decode_seq(p);
  const DecodeRows rows = decode_rows(p, LLK_DECODE_ROWS_SIMT);
  const llk::PageMap pages = decode_pages(p, s.b, rows.kv_head);
  const bool valid = r < rows.count;
  const int64_t token = s.b * s.q_len + (valid ? rows.token(r) : 0), head = rows.head(valid ? r : 0);
  const int64_t pos = int64_t(s.len) - s.q_len + (valid ? rows.token(r) : 0);
  const KeyInterval keys = valid ? decode_interval(p, pos, s.len) : KeyInterval{0, -1};
  const float sc = decode_scale_log2(p, pos, 1.f);  // f32 pages: no scales (any KV head count)
  const float* qrow = reinterpret_cast<const float*>(p.q) + token * p.q_token_stride + head * p.q_head_stride;
  float qv[kPer], acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) qv[i] = valid ? qrow[4 * i + sub] * sc : 0.f, acc[i] = 0.f;
  llk::SoftmaxState row;
  const float* kp = reinterpret_cast<const float*>(p.k_pages);
  const float* vp = reinterpret_cast<const float*>(p.v_pages);

  const int end = int(min(s.tile_end * kKeys, int64_t(s.len)));
  for (int n0 = int(s.tile_begin) * kKeys; n0 < end; n0 += kSimtKeys) {
    __syncthreads();  // the previous tile is consumed
    for (int i = tid; i < kSimtKeys * (D / 4); i += kThreads) {
      const int j = i / (D / 4), d = 4 * (i % (D / 4)), key = n0 + j;
      bool ok = key < s.len;
      int64_t ko = 0, vo = 0;
      if (ok) {
        ok = pages.locate(key, ko, vo);
        if (!ok && d == 0) llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_PAGE);
      }
      const float4 zero = make_float4(0.f, 0.f, 0.f, 0.f);
      *reinterpret_cast<float4*>(&sK[j][d]) = ok ? *reinterpret_cast<const float4*>(kp + ko + d) : zero;
      *reinterpret_cast<float4*>(&sV[j][d]) = ok ? *reinterpret_cast<const float4*>(vp + vo + d) : zero;
      if (d == 0) sOk[j] = ok ? 1 : 0;
    }
    __syncthreads();
    for (int j = 0; j < kSimtKeys; ++j) {
      float x = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) x = fmaf(qv[i], sK[j][4 * i + sub], x);
      x += __shfl_xor_sync(0xffffffffu, x, 1);
      x += __shfl_xor_sync(0xffffffffu, x, 2);
      if (!sOk[j] || !keys.contains(n0 + j)) x = -INFINITY;
      const llk::KeyStep step = row.add_key(x);
#pragma unroll
      for (int i = 0; i < kPer; ++i) acc[i] = fmaf(step.p, sV[j][4 * i + sub], acc[i] * step.corr);
    }
  }
  if (!valid) return;  // no barriers or warp operations below
  const float inv = row.normalizer();
  const RowOut<float> dst = row_out<float>(p, token, head);
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float v[1] = {acc[i] * inv};
    dst.store(4 * i + sub, v);
  }
  if (sub == 0) store_lse(p, token, head, row.lse());
}

// ------------------------------------------------------------------------------ merge
// One warp per (token, head) row: weights exp(lse_s - lse) in f32 (exp2 of base-2 differences),
// states summed in index order.
template <class T, bool kSplits>
__device__ void merge_kernel(const MergeStatesParams& p) {
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  const int64_t row = int64_t(blockIdx.x) * (kThreads / 32) + warp;
  if (row >= p.tokens * p.heads) return;
  const int64_t token = row / p.heads, head = row - token * p.heads;
  const int64_t states = kSplits ? p.num_states : 2;
  auto lse_of = [&](int64_t st) -> float {
    if constexpr (kSplits) return reinterpret_cast<const float*>(p.lse_a)[st * p.tokens * p.heads + row];
    const uint64_t base = st == 0 ? p.lse_a : p.lse_b;
    const int64_t ts = st == 0 ? p.lse_a_token_stride : p.lse_b_token_stride;
    const int64_t hs = st == 0 ? p.lse_a_head_stride : p.lse_b_head_stride;
    return reinterpret_cast<const float*>(base)[token * ts + head * hs];
  };
  float mx = -INFINITY;
  for (int64_t st = 0; st < states; ++st) mx = fmaxf(mx, lse_of(st));
  const float base = llk::SoftmaxState::base_of(mx);
  float sum = 0.f;
  for (int64_t st = 0; st < states; ++st) sum += llk::fast_exp2((lse_of(st) - base) * kLog2e);
  const float inv = sum == 0.f ? 0.f : 1.f / sum;  // no state saw a key: zeros, lse = -inf
  // Each lane takes 4 consecutive elements from 4 * lane; the last group of a head_dim that is
  // not a multiple of 4 has n < 4 of them (elements past n are neither read nor written).
  for (int64_t d = 4 * lane; d < p.head_dim; d += 128) {
    const int n = int(min(int64_t(4), p.head_dim - d));
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
    for (int64_t st = 0; st < states; ++st) {
      const float w = llk::fast_exp2((lse_of(st) - base) * kLog2e) * inv;
      float v[4] = {0.f, 0.f, 0.f, 0.f};
      if constexpr (kSplits) {
        // The split partials are a contiguous f32 buffer whose head_dim the planner made a
        // multiple of 4, so this is one 16-byte load.
        const float* src = reinterpret_cast<const float*>(p.v_a) + (st * p.tokens * p.heads + row) * p.head_dim + d;
        llk::load_f32<float, 4>(src, v);
      } else {
        const T* src = st == 0 ? reinterpret_cast<const T*>(p.v_a) + token * p.a_token_stride + head * p.a_head_stride + d
                               : reinterpret_cast<const T*>(p.v_b) + token * p.b_token_stride + head * p.b_head_stride + d;
        for (int i = 0; i < n; ++i) v[i] = llk::to_f32(src[i]);
      }
      // A state with weight 0 contributes nothing, even where its values are not finite (a
      // split without keys wrote zeros anyway).
      if (w != 0.f || !(sum == sum))
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[i] = fmaf(w, v[i], acc[i]);
    }
    T* dst = reinterpret_cast<T*>(p.out) + token * p.out_token_stride + head * p.out_head_stride + d;
    for (int i = 0; i < n; ++i) dst[i] = llk::from_f32<T>(acc[i]);
  }
  if (p.lse_out != 0 && lane == 0)
    reinterpret_cast<float*>(p.lse_out)[token * p.lse_out_token_stride + head * p.lse_out_head_stride] =
        sum == 0.f ? -INFINITY : base + logf(sum);
}

}  // namespace

// Symbols:
//   kv_append_<src>_<page>                            src f32/f16/bf16, page f32/f16/bf16/fp8
//   paged_decode_hd<D>_<q>[_fp8]                      bf16/f16 q with same-dtype or fp8 pages
//                                                     (tensor cores); f32 q and pages (SIMT)
//   paged_decode_merge_<out>, merge_states_<dtype>    split merge, pair merge
#define KV_APPEND(X, S, SN)                                                                     \
  X(kv_append_##SN##_f32, KvAppendParams, (256), LLK_SMEM_NONE, (kv_append_kernel<S, float>))                  \
  X(kv_append_##SN##_f16, KvAppendParams, (256), LLK_SMEM_NONE, (kv_append_kernel<S, __half>))                 \
  X(kv_append_##SN##_bf16, KvAppendParams, (256), LLK_SMEM_NONE, (kv_append_kernel<S, __nv_bfloat16>))         \
  X(kv_append_##SN##_fp8, KvAppendParams, (256), LLK_SMEM_NONE, (kv_append_kernel<S, fp8_t>))
#define PAGED_DECODE(X, D)                                                                                         \
  X(paged_decode_hd##D##_bf16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<D, 2>::bytes)), (paged_decode_mma_kernel<__nv_bfloat16, __nv_bfloat16, D>)) \
  X(paged_decode_hd##D##_bf16_fp8, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<D, 1>::bytes)), (paged_decode_mma_kernel<__nv_bfloat16, fp8_t, D>))  \
  X(paged_decode_hd##D##_f16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<D, 2>::bytes)), (paged_decode_mma_kernel<__half, __half, D>))          \
  X(paged_decode_hd##D##_f16_fp8, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<D, 1>::bytes)), (paged_decode_mma_kernel<__half, fp8_t, D>))       \
  X(paged_decode_hd##D##_f32, PagedDecodeParams, (kThreads), LLK_SMEM_NONE, (paged_decode_simt_kernel<D>))
#define PAGED_ATTENTION_KERNELS(X)                                                                       \
  KV_APPEND(X, float, f32)                                                                              \
  KV_APPEND(X, __half, f16)                                                                             \
  KV_APPEND(X, __nv_bfloat16, bf16)                                                                     \
  PAGED_DECODE(X, 32)                                                                                   \
  PAGED_DECODE(X, 64)                                                                                   \
  PAGED_DECODE(X, 96)                                                                                   \
  PAGED_DECODE(X, 128)                                                                                  \
  PAGED_DECODE(X, 256)                                                                                  \
  X(paged_decode_hd96_s2_bf16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<96, 2, 2>::bytes)), (paged_decode_mma_kernel<__nv_bfloat16, __nv_bfloat16, 96, 2>))   \
  X(paged_decode_hd128_s2_bf16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<128, 2, 2>::bytes)), (paged_decode_mma_kernel<__nv_bfloat16, __nv_bfloat16, 128, 2>)) \
  X(paged_decode_hd96_s2_f16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<96, 2, 2>::bytes)), (paged_decode_mma_kernel<__half, __half, 96, 2>))                   \
  X(paged_decode_hd128_s2_f16, PagedDecodeParams, (kThreads), LLK_SMEM_FIXED((DecodeSmem<128, 2, 2>::bytes)), (paged_decode_mma_kernel<__half, __half, 128, 2>))                 \
  X(paged_decode_merge_f32, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<float, true>))                \
  X(paged_decode_merge_f16, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<__half, true>))               \
  X(paged_decode_merge_bf16, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<__nv_bfloat16, true>))       \
  X(merge_states_f32, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<float, false>))                     \
  X(merge_states_f16, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<__half, false>))                    \
  X(merge_states_bf16, MergeStatesParams, (kThreads), LLK_SMEM_NONE, (merge_kernel<__nv_bfloat16, false>))

LLK_EXPORT_KERNELS(paged_attention, PAGED_ATTENTION_KERNELS)
