// prefill_blocks.cuh -- how prefill attention's blocks map onto a variable-length batch, written
// once for the kernels of attention.cu (mma.sync, SIMT) and attention_sm90.cu (wgmma + TMA).
//
// grid.x enumerates the row blocks of every sequence (cu_tiles: the first tile of each, built on
// the host or by attention_plan); a block's rows are (query token, q head) pairs, `pack` q heads
// of one KV group times rows / pack consecutive tokens (RowMap); grid.y = kv_heads x group / pack.
// For a block: which sequence and row block it is (locate), which query positions and key range
// it covers (block_keys), and which key tiles it visits and which of them need no mask
// (key_tiles).
#pragma once
#include "attention_math.cuh"

namespace llk::prefill {

using llk::KeyInterval;

struct Sequence {
  int64_t q_start, q_len, k_start, k_len;
  int64_t block;  // row block within the sequence
  int64_t index;  // the sequence (its block-table row when K/V are paged)
};

// Whether grid.x tile `tile` is past the last row block (the grid may be an upper bound when the
// sequence offsets live on the device; a failed plan leaves cu_tiles all zero).
// `cu_tiles` is a tile map of the same form over another axis (the attention backward's key
// blocks).
__device__ __forceinline__ bool past_last_tile(const AttentionParams& p, int64_t tile, const int32_t* cu_tiles) {
  return tile >= int64_t(cu_tiles[p.batch]);
}
__device__ __forceinline__ bool past_last_tile(const AttentionParams& p, int64_t tile) {
  return past_last_tile(p, tile, reinterpret_cast<const int32_t*>(p.cu_tiles));
}

// Which sequence and block grid.x tile `tile` of the tile map `cu_tiles` is (binary search).
__device__ inline Sequence locate(const AttentionParams& p, int64_t tile, const int32_t* cu_tiles) {
  const int32_t* cu_q = reinterpret_cast<const int32_t*>(p.cu_seqlens_q);
  const int32_t* cu_k = reinterpret_cast<const int32_t*>(p.cu_seqlens_k);
  int64_t lo = 0, hi = p.batch;  // cu_tiles[lo] <= tile < cu_tiles[hi]
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (cu_tiles[mid] <= tile) lo = mid; else hi = mid;
  }
  // Now cu_tiles[lo] <= tile < cu_tiles[lo + 1]: sequence lo is not empty, even when empty
  // sequences (equal neighbouring entries) surround it.
  Sequence s;
  s.q_start = cu_q[lo];
  s.q_len = cu_q[lo + 1] - cu_q[lo];
  s.k_start = cu_k[lo];
  s.k_len = cu_k[lo + 1] - cu_k[lo];
  const int64_t tiles = cu_tiles[lo + 1] - cu_tiles[lo];
  s.block = tiles - 1 - (tile - cu_tiles[lo]);  // heaviest (last) causal block first
  s.index = lo;
  return s;
}

// Which sequence and row block grid.x tile `tile` is (the query tile map p.cu_tiles).
__device__ inline Sequence locate(const AttentionParams& p, int64_t tile) {
  return locate(p, tile, reinterpret_cast<const int32_t*>(p.cu_tiles));
}

// The keys the query at `pos` attends, and its base-2 score scale (attention_math.cuh).
__device__ __forceinline__ KeyInterval key_interval(const AttentionParams& p, int64_t pos, int64_t k_len) {
  return llk::key_interval(p.variant, pos, k_len);
}
__device__ __forceinline__ float row_scale_log2(const AttentionParams& p, int64_t pos) {
  return llk::score_scale_log2(p.variant, pos, 1.f);
}

// The query positions [pos_lo, pos_hi] of a block's tokens [first, first + count) and the key
// range [begin, end) they can attend.
struct BlockKeys {
  int64_t pos_lo, pos_hi, begin, end;
};

__device__ inline BlockKeys block_keys(const AttentionParams& p, const Sequence& s, int64_t first_token, int64_t tokens) {
  BlockKeys b;
  const int64_t last_token = min(s.q_len, first_token + tokens) - 1;
  b.pos_lo = s.k_len - s.q_len + first_token;
  b.pos_hi = s.k_len - s.q_len + last_token;
  b.end = p.variant.mask == LLK_ATTN_NONE ? s.k_len : min(s.k_len, max(b.pos_hi + 1, int64_t(0)));
  b.begin = 0;
  b.begin = min(b.end, llk::chunk_start(p.variant, b.pos_lo));
  return b;
}

// Rows of a block: row r is token (block * tokens_per_block + r / pack) of the sequence and q head
// first_head + r % pack.
struct RowMap {
  int pack, tokens_per_block;  // 32-bit: r / pack is cheap
  int used;                    // pack x tokens_per_block: fewer than the block's rows when pack does not divide it
  int64_t first_token, first_head;
  __device__ int64_t token(int r) const { return first_token + r / pack; }
  __device__ int64_t head(int r) const { return first_head + r % pack; }
  // Row r is one to store: within the used rows and the sequence's q_len tokens.
  __device__ bool valid(int r, int64_t q_len) const { return r < used && token(r) < q_len; }
};

__device__ inline RowMap row_map(const AttentionParams& p, const Sequence& s, int rows_per_block) {
  const int group = int(p.q_heads / p.kv_heads);  // heads fit in int: 32-bit divisions
  const int packs = group / int(p.pack);
  const int kv_head = int(blockIdx.y) / packs;
  RowMap m;
  m.pack = int(p.pack);
  m.tokens_per_block = rows_per_block / m.pack;
  m.used = m.pack * m.tokens_per_block;
  m.first_token = s.block * m.tokens_per_block;
  m.first_head = int64_t(kv_head) * group + int64_t(int(blockIdx.y) % packs) * m.pack;
  return m;
}

// The key tiles of `keys_per_tile` keys a block visits, [first, end), and those of them that
// need no mask, [free_lo, free_hi): every key in the sequence and allowed for every row of the
// block (causal: up to the first row's position; chunked: from the last row's chunk start, since
// rows below may start later). Key counts are i32.
struct KeyTiles {
  int first, end, free_lo, free_hi;
};

__device__ inline KeyTiles key_tiles(const AttentionParams& p, const Sequence& s, const BlockKeys& bk, int keys_per_tile) {
  KeyTiles t;
  t.first = int(bk.begin / keys_per_tile);
  t.end = int((bk.end + keys_per_tile - 1) / keys_per_tile);
  t.free_hi = int(min(s.k_len / keys_per_tile,
                      p.variant.mask == LLK_ATTN_NONE ? s.k_len : max(bk.pos_lo + 1, int64_t(0)) / keys_per_tile));
  t.free_lo = p.variant.mask == LLK_ATTN_CHUNKED_CAUSAL
                  ? int((key_interval(p, bk.pos_hi, s.k_len).lo + keys_per_tile - 1) / keys_per_tile)
                  : 0;
  return t;
}

}  // namespace llk::prefill
