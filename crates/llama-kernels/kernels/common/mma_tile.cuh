// mma_tile.cuh -- one warp's share of a block-tile product on tensor cores, from operands staged
// in XOR-swizzled shared memory.
//
// Layout of a staged operand: rows of BK 16-bit elements, k contiguous, as BK / 8 16-byte chunks,
// chunk c of row r at position c ^ (r % 8) (`swizzled`). The 8 rows one phase of an ldmatrix
// reads then fall in 8 different groups of banks, so every ldmatrix is conflict-free, and a row
// is still written with 16-byte stores or cp.async copies. A is [rows][BK] (activations, row
// major). B is staged one of two ways (BLayout): [cols][BK] (a weight in nn.Linear's [out, in]
// layout, which is the column-major B that mma.sync's .col operand wants; plain ldmatrix), or
// [BK][BN] (k rows, the columns contiguous: the same weight read as W for x W, or any row-major
// B; ldmatrix.trans hands each lane the same fragment).
//
// Per 16-deep step a warp with MT m-tiles and NT n-tiles issues MT ldmatrix.x4 of A and NT / 2
// of B for MT * NT mma.m16n8k16 (f32 accumulators).
#pragma once
#include "ptx.cuh"

namespace llk {

// Element offset of 16-byte chunk c of row r in a swizzled [rows][BK] tile.
template <int BK>
__device__ __forceinline__ int swizzled(int r, int c) {
  static_assert(BK % 64 == 0, "a row must span at least 8 chunks for the XOR swizzle");
  return r * BK + ((c ^ (r & 7)) * 8);
}

// How B is staged (see the header).
enum class BLayout {
  kColsK,  // [cols][BK], k contiguous
  kKCols,  // [BK][BN], the columns contiguous
};

// The B fragments of n-tiles (col / 8) and (col / 8 + 1) for the 16-deep step kk: bf[0], bf[1]
// the first n-tile's k halves, bf[2], bf[3] the second's. `col` is this lane's ldmatrix matrix's
// first column (mat >> 1 picks the n-tile, mat & 1 the k half).
template <BLayout L, int BK, int BN, class T>
__device__ __forceinline__ void load_b_pair(uint32_t (&bf)[4], const T* b, int col, int kk) {
  const int lane = int(threadIdx.x % 32), mat = lane >> 3;
  if constexpr (L == BLayout::kColsK) {
    ldmatrix<4, false>(bf, b + swizzled<BK>(col + (lane & 7), 2 * kk + (mat & 1)));
  } else {
    ldmatrix<4, true>(bf, b + swizzled<BN>(16 * kk + (mat & 1) * 8 + (lane & 7), col / 8));
  }
}

// acc[mi][j] += A[a_row0 + 16 mi + (0..16), :] * B(:, b_col(j) + (0..8)) over one BK-deep stage,
// B staged as L ([BK][BN] when kKCols). b_col(j) is the first column of n-tile j (a multiple of
// 8); m-tiles from mt_active on are skipped (warp-uniform: rows the block does not hold).
template <class T, int MT, int NT, int BK, class BCol, BLayout L = BLayout::kColsK, int BN = 0>
__device__ __forceinline__ void warp_mma_stage(float (&acc)[MT][NT][4], const T* a, int a_row0, const T* b,
                                               BCol b_col, int mt_active = MT) {
  static_assert(NT % 2 == 0, "B fragments come in pairs of n-tiles");
  static_assert(L == BLayout::kColsK || BN % 64 == 0, "a [BK][BN] tile needs its width");
  const int lane = int(threadIdx.x % 32), mat = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < BK / 16; ++kk) {
    uint32_t af[MT][4];
#pragma unroll
    for (int mi = 0; mi < MT; ++mi) {
      if (mi >= mt_active) continue;
      const int r = a_row0 + 16 * mi + (mat & 1) * 8 + (lane & 7);
      ldmatrix<4, false>(af[mi], a + swizzled<BK>(r, 2 * kk + (mat >> 1)));
    }
#pragma unroll
    for (int jp = 0; jp < NT / 2; ++jp) {
      uint32_t bf[4];  // bf[0], bf[1]: n-tile 2 jp; bf[2], bf[3]: n-tile 2 jp + 1
      load_b_pair<L, BK, BN>(bf, b, b_col(2 * jp + (mat >> 1)), kk);
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
#pragma unroll
      for (int mi = 0; mi < MT; ++mi) {
        if (mi >= mt_active) continue;
        mma_m16n8k16<T>(acc[mi][2 * jp], af[mi], b0, acc[mi][2 * jp]);
        mma_m16n8k16<T>(acc[mi][2 * jp + 1], af[mi], b1, acc[mi][2 * jp + 1]);
      }
    }
  }
}

}  // namespace llk
