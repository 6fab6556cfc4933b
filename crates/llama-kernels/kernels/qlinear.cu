// qlinear.cu -- linear layers over packed 4- and 8-bit weights: a GEMV for decode on CUDA cores
// that streams the packed weights once (every format and dtype; the integer formats' bf16/f16
// decode has a tensor-core GEMV of its own, qmmv.cu), a tensor-core GEMM for prefill that
// dequantizes weight tiles into shared memory, and a dequantize kernel that expands a band of
// rows for a dense GEMM.
//
// The formats and how a chunk of a weight row is read and dequantized: common/quant_chunk.cuh.
// Every kernel here multiplies by the weight rounded to the activation dtype T: the GEMV rounds
// each dequantized value in registers, the GEMM stores it as T in shared memory, and the dense
// GEMM of the fallback path reads the values the dequantize kernel stored as T, as a
// dequantize-then-multiply kernel does (Marlin and llama.cpp's dequantize to half before their
// tensor-core products too). The tensor-core GEMV of qmmv.cu multiplies by the exact values.
//
// GEMV (qgemv_<format>_<dtype>): y[m, c] (+)= sum_j x[m, j] * w[c, j] for m < rows.
//   Grid mapping: `split` warps per output feature c (LLK_QGEMV_WARPS warps per block, grid.x
//   blocks over n). Lane l of part s takes chunks l + 32 s, l + 32 (s + split), ... of W's row c:
//   each lane's weight loads are 16 bytes and a warp's are 512 contiguous bytes, issued one chunk
//   ahead (LLK_QGEMV_DEPTH = 2 chunks in flight per lane: the next is loaded before the current
//   one is decoded). A chunk is
//   dequantized once into 32 registers and used for every activation row (x is read through
//   L1/L2: it is small and every warp of the grid reads it). Each lane accumulates in f32 with
//   fmaf in element order; a warp sums its lanes by a fixed butterfly, and the parts of a split
//   are added in order through shared memory, so the result does not depend on scheduling (only
//   on the split, which the host takes from the shape). Split-K is for shapes with few output
//   features (Llama 3's 1024-wide k/v projections): it multiplies the warps streaming the weight.
//   x is read in 16-byte vectors: the host sends activations whose rows are not 16-byte aligned
//   down the dequantize-and-GEMM path instead.
//   Bytes: the packed weights once (qs + qh + meta), x once per block from L2, y once.
//
// GEMM (qgemm_<format>_<dtype>, bf16 and f16): y = x W^T (+ y) for any number of rows.
//   Grid mapping: grid.x walks blocks of LLK_QGEMM_BLOCK_M (64) activation rows, grid.y blocks of
//   LLK_QGEMM_BLOCK_N (128) weight rows; consecutive blocks share a weight tile, so it is read
//   from DRAM about once and the other row blocks find it in L2. 4 warps, 2 x 2, each 32 rows x 64
//   output features (2 x 8 m16n8 tiles). Per 64-deep step: the activations arrive by a 3-stage
//   cp.async ring (16-byte copies, zero-filled past the rows and k); the weights' 256 chunks
//   (2 per thread) are loaded into registers during the previous step's products, then
//   dequantized, rounded to T and stored with 16-byte stores into one of two swizzled buffers;
//   then ldmatrix.x4 and mma.sync m16n8k16
//   (common/mma_tile.cuh), 16 mma per 6 ldmatrix per warp and 16-deep step. One barrier per step.
//   Epilogue: the f32 tile is staged in shared memory (the pipeline's), the old y added in f32
//   when accumulating, rounded once and stored with 16-byte stores where y allows.
//   Split-K (decode rows, small grids): grid.z splits the 64-deep steps into k_splits contiguous
//   ranges; each block writes its f32 tile to `partial` instead, and qsplit_reduce_<dtype> adds
//   the splits in order, adds the old y, rounds once (one thread per output element).
//   Bytes: the packed weights once per row block (from L2 after the first), x once per 128
//   output features, y once.
//
// Input gradient (qgemm_dx_<format>_<dtype>, bf16 and f16): dx = dy W (+ dx), the backward of the
//   GEMM through a frozen packed weight, from the packed bytes (QLoRA's base weights). The same
//   kernel with the roles of W's dimensions exchanged: `x` is dy [rows, n], `y` is dx [rows, k],
//   the 64-deep steps walk W's rows (the n outputs of the forward) and grid.y walks 128-wide
//   blocks of W's columns. A step's weight tile is 64 rows x 4 chunks of W, the same 256 chunks
//   as the forward's, dequantized the same way but stored as [64][128] (k rows, columns
//   contiguous), which the products read with ldmatrix.trans (common/mma_tile.cuh, kKCols).
//   The activations' last step copies only the bytes inside dy's row (cp.async zero-fills the
//   rest), so n needs no alignment beyond dy's rows starting on 16-byte boundaries. No split-K:
//   a training step has rows enough to fill the grid.
//   Bytes: the packed weights once per 64-row block of dy (from L2 after the first), dy once
//   per 128 columns of dx, dx once.
//
// Dequantize (qdequant_<format>_<dtype>): rows [row_first, row_first + n) of W into a dense
//   [n, k] tensor of T (row stride y_row_stride); one thread per chunk, 16-byte stores.
#include "common/mma_tile.cuh"
#include "common/quant_chunk.cuh"

namespace {

using namespace llk::quant;

constexpr int kWarps = LLK_QGEMV_WARPS;
constexpr int kMaxRows = LLK_QGEMV_MAX_ROWS;
constexpr int kGemvDepth = LLK_QGEMV_DEPTH;  // chunks of loads each GEMV lane keeps in flight
static_assert(kGemvDepth == 2, "the GEMV loop loads one chunk ahead");

template <LlkQuantFormat F, class T>
__device__ void qgemv_kernel(const QLinearParams& p) {
  __shared__ float code_smem[16];
  const float* code = code_book<F>(p, code_smem);
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32);
  const int split = int(p.split), part = warp % split;
  const int64_t col = int64_t(blockIdx.x) * (kWarps / split) + warp / split;
  const bool active = col < p.n;  // warp-uniform; an idle warp still meets the barrier below
  const int rows = int(p.rows);
  const T* x = reinterpret_cast<const T*>(p.x);
  float acc[kMaxRows];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) acc[m] = 0.f;
  const int64_t chunks = active ? p.k / kChunk : 0, stride = 32 * split;
  // Software pipeline of depth kGemvDepth: the bytes of the next chunk are loaded before the
  // current one is decoded, so each lane keeps two chunks of loads in flight.
  RawChunk cur{};  // zeroed: a lane without chunks never reads it, but copies it
  if (lane + 32 * part < chunks) load_chunk<F>(p, col, lane + 32 * part, cur);
#pragma unroll 1  // one chunk per iteration: its 16 x 32 fmas are the body (code size)
  for (int64_t c = lane + 32 * part; c < chunks; c += stride) {
    RawChunk nxt{};
    if (c + stride < chunks) load_chunk<F>(p, col, c + stride, nxt);
    float w[kChunk];
    decode_chunk<F>(code, cur, w);
    cur = nxt;
    llk::round_to<T>(w);  // the weight as the activation dtype holds it (see the header)
#pragma unroll
    for (int m = 0; m < kMaxRows; ++m) {
      if (m >= rows) break;
      const T* xr = x + m * p.x_row_stride + c * kChunk;
      constexpr int V = llk::kVec16<T>;
#pragma unroll
      for (int v = 0; v < kChunk / V; ++v) {
        float xv[V];
        llk::load_f32<T, V>(xr + v * V, xv);  // 16-byte aligned: the host checked
#pragma unroll
        for (int i = 0; i < V; ++i) acc[m] = fmaf(w[v * V + i], xv[i], acc[m]);
      }
    }
  }
  __shared__ float partial[kWarps][kMaxRows];  // split > 1: each part's warp sums
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) break;
    acc[m] = llk::warp_sum(acc[m]);
    if (split > 1 && lane == 0) partial[warp][m] = acc[m];
  }
  if (split > 1) {
    __syncthreads();  // block-uniform: split is a launch parameter
    if (part != 0) return;
#pragma unroll
    for (int m = 0; m < kMaxRows; ++m) {
      if (m >= rows) break;
      float s = partial[warp][m];
#pragma unroll
      for (int q = 1; q < LLK_QGEMV_MAX_SPLIT; ++q)
        if (q < split) s = __fadd_rn(s, partial[warp + q][m]);
      acc[m] = s;
    }
  }
  if (!active || lane != 0) return;
  T* y = reinterpret_cast<T*>(p.y);
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) break;
    T* out = y + m * p.y_row_stride + col;
    *out = llk::from_f32<T>(p.accumulate ? __fadd_rn(llk::to_f32(*out), acc[m]) : acc[m]);
  }
}

constexpr int kGemmThreads = LLK_QGEMM_THREADS;
constexpr int kBM = LLK_QGEMM_BLOCK_M, kBN = LLK_QGEMM_BLOCK_N, kBK = LLK_QGEMM_BLOCK_K;
constexpr int kStages = LLK_QGEMM_STAGES;
constexpr int kRowChunks = kBK / kChunk;                        // chunks per weight row and step
constexpr int kThreadChunks = kBN * kRowChunks / kGemmThreads;  // weight chunks per thread and step
constexpr int kWarpRows = kBM / 2, kWarpCols = kBN / 2;         // warps 2 x 2
constexpr int kMTiles = kWarpRows / 16, kNTiles = kWarpCols / 8;
// f32 output tile, rows 16-byte aligned. The accumulators go in as 8-byte writes, a half-warp at a
// time: 4 rows (g) x 4 column pairs (qd). A pitch of 8 mod 32 words puts the 4 rows on disjoint
// 8-bank groups (conflict-free); kBN + 4 (4 mod 32) would overlap them pairwise (2-way conflicts).
constexpr int kOutPitch = kBN + 8;
static_assert(kOutPitch % 32 == 8, "conflict-free 8-byte accumulator writes");
static_assert(kGemmThreads == 128 && kThreadChunks * kGemmThreads == kBN * kRowChunks, "warps 2 x 2");
// Dynamic shared memory (the kernels' declaration): kStages activation tiles and two weight
// tiles of 16-bit values; the f32 output tile reuses it at the end.
constexpr int kGemmSmemBytes = (kStages * kBM + 2 * kBN) * kBK * 2;
static_assert(kBM * kOutPitch * 4 <= kGemmSmemBytes, "the output tile fits in the pipeline's memory");

// Which product a GEMM computes: y = x W^T (the forward) or y = x W (the input gradient).
enum class Product { kXWt, kXW };

template <LlkQuantFormat F, class T, Product P>
__device__ void qgemm_kernel(const QLinearParams& p) {
  constexpr bool kXW = P == Product::kXW;
  // The product's depth and width: W's columns and rows for x W^T, its rows and columns for x W.
  const int64_t depth = kXW ? p.n : p.k, width = kXW ? p.k : p.n;
  LLK_DYN_SMEM(raw);
  T* sA = reinterpret_cast<T*>(raw);   // [kStages][kBM][kBK], swizzled
  T* sB = sA + kStages * kBM * kBK;    // [2][kBN][kBK] (x W^T) or [2][kBK][kBN] (x W), swizzled
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  if (m0 >= p.rows || n0 >= width) return;  // the whole block, before any barrier
  __shared__ float code_smem[16];
  const float* code = code_book<F>(p, code_smem);
  const int valid = int(min(int64_t(kBM), p.rows - m0));
  const int tid = int(threadIdx.x), warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  // This split's steps [s0, s0 + ksteps) (all of k when k_splits is 1); an empty split still
  // writes its zero partial tile, so the reduce kernel reads every split.
  const int64_t all_steps = (depth + kBK - 1) / kBK;
  const int64_t s0 = min(all_steps, int64_t(blockIdx.z) * p.k_steps_per_split);
  const int64_t ksteps = min(all_steps - s0, int64_t(p.k_steps_per_split));
  const T* x = reinterpret_cast<const T*>(p.x) + m0 * p.x_row_stride + s0 * kBK;
  const int64_t k_end = depth - s0 * kBK;  // depth past this split's start (zero-fill beyond it)

  auto load_a = [&](int64_t ks, int stage) {
    const int64_t k0 = ks * kBK;
    T* a = sA + stage * kBM * kBK;
#pragma unroll
    for (int i = tid; i < kBM * kBK / 8; i += kGemmThreads) {
      const int r = i / (kBK / 8), c = i % (kBK / 8);
      // The bytes inside the row, none past the rows or the depth: x W^T's depth (k) is whole
      // chunks, so a vector is all in or all out; x W's (n) may end inside a vector, which is
      // then copied in part (cp.async zero-fills the rest).
      int bytes;
      if constexpr (kXW) {
        const int64_t inside = r < valid ? k_end - (k0 + c * 8) : 0;
        bytes = int(max(int64_t(0), min(int64_t(8), inside))) * 2;
      } else {
        bytes = r < valid && k0 + c * 8 < k_end ? 16 : 0;
      }
      llk::cp_async_16(a + llk::swizzled<kBK>(r, c), bytes > 0 ? x + r * p.x_row_stride + k0 + c * 8 : x, bytes);
    }
  };
  // Weight chunk i of this thread in step ks: chunk `chunk` of W's row `row`, stored from 16-byte
  // vector c0 of tile row r. x W^T: row n0 + r, chunk ks * kRowChunks + c; x W: row ks * kBK + r,
  // the chunk c of the block's columns.
  constexpr int kTileCols = kXW ? kBN : kBK;  // a tile row's elements
  constexpr int kTileRowChunks = kTileCols / kChunk;
  auto chunk_of = [&](int i, int64_t ks, int& r, int64_t& row, int64_t& chunk) {
    const int e = tid + i * kGemmThreads;
    r = e / kTileRowChunks;
    const int c = e % kTileRowChunks;
    row = kXW ? (s0 + ks) * kBK + r : n0 + r;
    chunk = kXW ? n0 / kChunk + c : (s0 + ks) * kRowChunks + c;
    return row < p.n && chunk * kChunk < p.k;
  };
  RawChunk next[kThreadChunks]{};
  auto load_b = [&](int64_t ks) {
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      int r;
      int64_t row, chunk;
      if (chunk_of(i, ks, r, row, chunk)) load_chunk<F>(p, row, chunk, next[i]);
    }
  };
  auto store_b = [&](int64_t ks, int buf) {
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      int r;
      int64_t row, chunk;
      float w[kChunk];
      if (chunk_of(i, ks, r, row, chunk)) {
        decode_chunk<F>(code, next[i], w);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) w[j] = 0.f;
      }
      T* tile = sB + buf * kBN * kBK;
      const int c0 = int(chunk % kTileRowChunks) * (kChunk / 8);  // the chunk's first 16-byte vector
#pragma unroll
      for (int v = 0; v < kChunk / 8; ++v) {  // 8 values rounded to T: one 16-byte shared store
        const float* e = w + 8 * v;
        *reinterpret_cast<uint4*>(tile + llk::swizzled<kTileCols>(r, c0 + v)) =
            make_uint4(llk::pack_pair<T>(e[0], e[1]), llk::pack_pair<T>(e[2], e[3]), llk::pack_pair<T>(e[4], e[5]),
                       llk::pack_pair<T>(e[6], e[7]));
      }
    }
  };

  float acc[kMTiles][kNTiles][4];
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int j = 0; j < kNTiles; ++j) acc[mi][j][0] = acc[mi][j][1] = acc[mi][j][2] = acc[mi][j][3] = 0.f;
  const int mt_active = max(0, min(kMTiles, (valid - wm * kWarpRows + 15) / 16));  // warp-uniform

#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ksteps) load_a(s, s);
    llk::cp_async_commit();
  }
  load_b(0);
  for (int64_t ks = 0; ks < ksteps; ++ks) {
    // Step ks's weights, loaded a step ago (or just above), into the buffer that step ks - 2 read:
    // every warp passed the previous barrier after its products of step ks - 2.
    store_b(ks, int(ks % 2));
    if (ks + 1 < ksteps) load_b(ks + 1);  // in flight during this step's products
    // Step ks's activations have landed and its weights are stored, for every thread; every warp
    // is done with step ks - 1, whose activation stage is refilled next.
    llk::cp_async_wait<kStages - 2>();
    __syncthreads();
    if (ks + kStages - 1 < ksteps) load_a(ks + kStages - 1, int((ks + kStages - 1) % kStages));
    llk::cp_async_commit();
    if (mt_active > 0) {
      constexpr llk::BLayout kB = kXW ? llk::BLayout::kKCols : llk::BLayout::kColsK;
      auto col = [&](int j) { return wn * kWarpCols + 8 * j; };
      llk::warp_mma_stage<T, kMTiles, kNTiles, kBK, decltype(col), kB, kBN>(
          acc, sA + int(ks % kStages) * kBM * kBK, wm * kWarpRows, sB + int(ks % 2) * kBN * kBK, col, mt_active);
    }
  }
  llk::cp_async_wait<0>();
  __syncthreads();  // the pipeline's shared memory is free: stage the f32 output tile there

  float* sC = reinterpret_cast<float*>(raw);
  const int lane = tid % 32, g = lane >> 2, t = lane & 3;
#pragma unroll
  for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int j = 0; j < kNTiles; ++j) {
        const int r = wm * kWarpRows + 16 * mi + g + 8 * h, c = wn * kWarpCols + 8 * j + 2 * t;
        *reinterpret_cast<float2*>(sC + r * kOutPitch + c) = make_float2(acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
      }
  __syncthreads();
  const int cols = int(min(int64_t(kBN), width - n0));
  if (!kXW && p.k_splits > 1) {  // block-uniform: the f32 partial tile of this split, for the reduce kernel
    float* part = reinterpret_cast<float*>(p.partial) + (int64_t(blockIdx.z) * p.rows + m0) * p.n + n0;
    for (int i = tid; i < kBM * kBN; i += kGemmThreads) {
      const int r = i / kBN, c = i % kBN;
      if (r < valid && c < cols) part[r * p.n + c] = sC[r * kOutPitch + c];
    }
    return;
  }
  T* y = reinterpret_cast<T*>(p.y) + m0 * p.y_row_stride + n0;
  constexpr int V = llk::kVec16<T>;
  const bool vec = p.y % 16 == 0 && p.y_row_stride % V == 0 && width % V == 0;  // block-uniform
  if (vec) {
    for (int i = tid; i < kBM * kBN / V; i += kGemmThreads) {
      const int r = i / (kBN / V), c = (i % (kBN / V)) * V;
      if (r >= valid || c >= cols) continue;
      float out[V];
#pragma unroll
      for (int j = 0; j < V; ++j) out[j] = sC[r * kOutPitch + c + j];
      if (p.accumulate) {
        float old[V];
        llk::load_f32<T, V>(y + r * p.y_row_stride + c, old);
#pragma unroll
        for (int j = 0; j < V; ++j) out[j] = __fadd_rn(old[j], out[j]);
      }
      llk::store_f32<T, V>(y + r * p.y_row_stride + c, out);
    }
  } else {
    for (int i = tid; i < kBM * kBN; i += kGemmThreads) {
      const int r = i / kBN, c = i % kBN;
      if (r >= valid || c >= cols) continue;
      T* out = y + r * p.y_row_stride + c;
      const float v = sC[r * kOutPitch + c];
      *out = llk::from_f32<T>(p.accumulate ? __fadd_rn(llk::to_f32(*out), v) : v);
    }
  }
}
// y[r, c] (+)= sum over splits s, in order, of partial[s][r][c]; one rounding.
template <class T>
__device__ void qreduce_kernel(const QLinearParams& p) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= p.rows * p.n) return;
  const int64_t r = e / p.n, c = e % p.n;
  const float* part = reinterpret_cast<const float*>(p.partial) + e;
  float s = part[0];
  for (int q = 1; q < p.k_splits; ++q) s = __fadd_rn(s, part[int64_t(q) * p.rows * p.n]);
  T* out = reinterpret_cast<T*>(p.y) + r * p.y_row_stride + c;
  *out = llk::from_f32<T>(p.accumulate ? __fadd_rn(llk::to_f32(*out), s) : s);
}

template <LlkQuantFormat F, class T>
__device__ void qdequant_kernel(const QLinearParams& p) {
  __shared__ float code_smem[16];
  const float* code = code_book<F>(p, code_smem);  // before any thread returns
  const int64_t chunks = p.k / kChunk;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.n * chunks) return;
  const int64_t r = t / chunks, c = t % chunks;
  float w[kChunk];
  dequant_chunk<F>(p, code, p.row_first + r, c, w);
  store_chunk<T>(reinterpret_cast<T*>(p.y) + r * p.y_row_stride + c * kChunk, w, true);  // a dense band
}

}  // namespace

// Symbols: qgemv_<format>_<dtype>, qgemm_<format>_<f16|bf16>, qgemm_dx_<format>_<f16|bf16>,
// qdequant_<format>_<dtype> and qsplit_reduce_<f16|bf16>.
#define QLINEAR_FORMAT(X, fmt, F)                                                                            \
  X(qgemv_##fmt##_f32, QLinearParams, (kWarps * 32), LLK_SMEM_NONE, (qgemv_kernel<F, float>))                             \
  X(qgemv_##fmt##_f16, QLinearParams, (kWarps * 32), LLK_SMEM_NONE, (qgemv_kernel<F, __half>))                            \
  X(qgemv_##fmt##_bf16, QLinearParams, (kWarps * 32), LLK_SMEM_NONE, (qgemv_kernel<F, __nv_bfloat16>))                    \
  X(qgemm_##fmt##_f16, QLinearParams, (kGemmThreads), LLK_SMEM_FIXED(kGemmSmemBytes),                               \
    (qgemm_kernel<F, __half, Product::kXWt>))                                                                        \
  X(qgemm_##fmt##_bf16, QLinearParams, (kGemmThreads), LLK_SMEM_FIXED(kGemmSmemBytes),                              \
    (qgemm_kernel<F, __nv_bfloat16, Product::kXWt>))                                                                 \
  X(qgemm_dx_##fmt##_f16, QLinearParams, (kGemmThreads), LLK_SMEM_FIXED(kGemmSmemBytes),                            \
    (qgemm_kernel<F, __half, Product::kXW>))                                                                         \
  X(qgemm_dx_##fmt##_bf16, QLinearParams, (kGemmThreads), LLK_SMEM_FIXED(kGemmSmemBytes),                           \
    (qgemm_kernel<F, __nv_bfloat16, Product::kXW>))                                                                  \
  X(qdequant_##fmt##_f32, QLinearParams, (LLK_QDEQUANT_THREADS), LLK_SMEM_NONE, (qdequant_kernel<F, float>))              \
  X(qdequant_##fmt##_f16, QLinearParams, (LLK_QDEQUANT_THREADS), LLK_SMEM_NONE, (qdequant_kernel<F, __half>))             \
  X(qdequant_##fmt##_bf16, QLinearParams, (LLK_QDEQUANT_THREADS), LLK_SMEM_NONE, (qdequant_kernel<F, __nv_bfloat16>))

#define QLINEAR_KERNELS(X) LLK_QUANT_FORMATS(QLINEAR_FORMAT, X)

#define QLINEAR_REDUCE(X)                                                                     \
  X(qsplit_reduce_f16, QLinearParams, (LLK_QREDUCE_THREADS), LLK_SMEM_NONE, (qreduce_kernel<__half>))        \
  X(qsplit_reduce_bf16, QLinearParams, (LLK_QREDUCE_THREADS), LLK_SMEM_NONE, (qreduce_kernel<__nv_bfloat16>))

#define QLINEAR_ALL(X) \
  QLINEAR_KERNELS(X)   \
  QLINEAR_REDUCE(X)

LLK_EXPORT_KERNELS(qlinear, QLINEAR_ALL)
