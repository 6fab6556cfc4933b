// paged.cuh -- where a key of the paged KV cache lives (shared by attention.cu and
// paged_attention.cu).
//
// Pools [num_pages, page_size, kv_heads, head_dim]: key j of a sequence sits on page
// block_table_row[j >> shift] (page_size = 2^shift, checked by the host), row j & (page_size - 1).
// A page id outside [0, num_pages), or a key past the block-table row, is never dereferenced.
#pragma once
#include "llk.cuh"

namespace llk {

struct PageMap {
  const int32_t* table_row;  // this sequence's block-table row
  int64_t max_pages, num_pages;
  int64_t k_page_stride, v_page_stride;
  int64_t token_stride;      // elements between a page's rows (kv_heads * head_dim)
  int64_t head_off;          // kv_head * head_dim
  int shift;

  // Element offsets of key `key` in the K and V pools; false (nothing may be read) when its page
  // is outside the pool or the block-table row.
  __device__ __forceinline__ bool locate(int64_t key, int64_t& ko, int64_t& vo) const {
    const int64_t slot = key >> shift;
    if (slot >= max_pages) return false;
    const int64_t id = table_row[slot];
    if (id < 0 || id >= num_pages) return false;
    const int64_t in_page = (key & ((int64_t(1) << shift) - 1)) * token_stride + head_off;
    ko = id * k_page_stride + in_page;
    vo = id * v_page_stride + in_page;
    return true;
  }
};

__device__ __forceinline__ PageMap page_map(uint64_t block_table, int64_t row, int64_t table_stride, int64_t max_pages,
                                            int64_t num_pages, int64_t page_size, int64_t k_page_stride,
                                            int64_t v_page_stride, int64_t token_stride, int64_t head_off) {
  PageMap m;
  m.table_row = reinterpret_cast<const int32_t*>(block_table) + row * table_stride;
  m.max_pages = max_pages;
  m.num_pages = num_pages;
  m.k_page_stride = k_page_stride;
  m.v_page_stride = v_page_stride;
  m.token_stride = token_stride;
  m.head_off = head_off;
  m.shift = __ffs(int(page_size)) - 1;  // page_size < 2^31, a power of two
  return m;
}

}  // namespace llk
