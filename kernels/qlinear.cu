// qlinear.cu -- linear layers over packed 4- and 8-bit weights: a GEMV for decode (1 to
// LLK_QGEMV_MAX_ROWS activation rows) that streams the packed weights once, and a dequantize
// kernel that expands a band of rows for the dense GEMM of prefill.
//
// Formats (params.h LlkQuantFormat; the layout and the f32 reference are src/spec/quant.rs):
// GGUF's Q8_0, Q4_0, Q4_1, Q4_K and Q6_K, and bitsandbytes' NF4. Each is read in chunks of 32
// consecutive elements of one weight row. The quantized values of a chunk are one or two 16-byte
// vectors of the `qs` plane (Q6_K adds 8 bytes of the `qh` plane); its block header (scales,
// minimums, absmax) is an entry of the `meta` plane, as the format stores it. Dequantization is
// the reference formula with each product and sum rounded as written (__fmul_rn / __fadd_rn: no
// contraction into an fma, except the two fmas of Q4_0 and Q4_1 whose product is exact, see
// decode_chunk), so a chunk dequantizes to exactly the f32 values llama.cpp's
// `dequantize_row_*` and bitsandbytes' `dequantize_4bit` produce.
//
// Every kernel multiplies by the weight rounded to the activation dtype T: the GEMV rounds each
// dequantized value in registers, the GEMM stores it as T in shared memory, and the dense GEMM of
// the fallback path reads the values the dequantize kernel stored as T. So decode and prefill
// compute with the same weights (for f32, the exact dequantized values), as a
// dequantize-then-multiply kernel does (Marlin and llama.cpp's dequantize to half before their
// tensor-core products too).
//
// A chunk is read in two steps, `load_chunk` (its bytes, into registers) and `decode_chunk` (the
// f32 values), so that the GEMM can issue the loads of its next tile before the math of this one.
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
// Dequantize (qdequant_<format>_<dtype>): rows [row_first, row_first + n) of W into a dense
//   [n, k] tensor of T (row stride y_row_stride); one thread per chunk, 16-byte stores.
#include "common/llk.cuh"
#include "common/mma_tile.cuh"

namespace {

constexpr int kChunk = LLK_QUANT_CHUNK;
constexpr int kWarps = LLK_QGEMV_WARPS;
constexpr int kMaxRows = LLK_QGEMV_MAX_ROWS;
constexpr int kGemvDepth = LLK_QGEMV_DEPTH;  // chunks of loads each GEMV lane keeps in flight
static_assert(kGemvDepth == 2, "the GEMV loop loads one chunk ahead");

// The bytes chunk `chunk` of a weight row is made from: its quantized values (one 16-byte vector,
// two for Q8_0), Q6_K's top bits, and the fields of its block header that it uses, as stored.
struct RawChunk {
  uint4 q[2];
  uint2 qh;
  uint16_t h0, h1;  // f16 bits: Q8_0, Q4_0, Q6_K: d; Q4_1: d, m; Q4_K: d, dmin
  uint8_t b0, b1, b2;  // Q4_K: scale bytes s[j], s[j + 4], s[j - 4] of sub-block j; Q6_K: the
                       // scales of the chunk's two 16-element groups
  int sub;             // Q4_K: the sub-block j (from the chunk's position, not from memory)
  float absmax;        // NF4
};

__device__ __forceinline__ float f16_bits(uint16_t h) {
  __half v;
  memcpy(static_cast<void*>(&v), &h, 2);
  return __half2float(v);
}

__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }

// Issues the loads of chunk `chunk` of row `row` of W (nothing here waits for them).
template <LlkQuantFormat F>
__device__ __forceinline__ void load_chunk(const QLinearParams& p, int64_t row, int64_t chunk, RawChunk& c) {
  const uint8_t* meta = reinterpret_cast<const uint8_t*>(p.meta) + row * p.meta_row_bytes;
  const int64_t first = chunk * kChunk;  // the chunk's first element within the row
  const int64_t blk = first >> p.block_shift;
  constexpr int kQsBytes = F == LLK_QUANT_Q8_0 ? 32 : 16;
  const uint8_t* qs = reinterpret_cast<const uint8_t*>(p.qs) + row * p.qs_row_bytes + chunk * kQsBytes;
  c.q[0] = __ldg(reinterpret_cast<const uint4*>(qs));
  if constexpr (F == LLK_QUANT_Q8_0) c.q[1] = __ldg(reinterpret_cast<const uint4*>(qs + 16));
  if constexpr (F == LLK_QUANT_Q8_0 || F == LLK_QUANT_Q4_0) {
    c.h0 = ld_u16(meta + blk * 2);
  } else if constexpr (F == LLK_QUANT_Q4_1) {
    c.h0 = ld_u16(meta + blk * 4), c.h1 = ld_u16(meta + blk * 4 + 2);
  } else if constexpr (F == LLK_QUANT_Q4_K) {
    const uint8_t* e = meta + blk * 16;
    const int j = int((first % 256) / 32);
    c.sub = j;
    c.h0 = ld_u16(e), c.h1 = ld_u16(e + 2);
    c.b0 = __ldg(e + 4 + j), c.b1 = __ldg(e + 4 + j + 4), c.b2 = __ldg(e + 4 + (j >= 4 ? j - 4 : j));
  } else if constexpr (F == LLK_QUANT_Q6_K) {
    const uint8_t* e = meta + blk * 18;
    c.qh = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(p.qh) + row * p.qh_row_bytes +
                                                chunk * 8));
    const int group = int((first % 256) / 16);  // the chunk's first 16-element scale group
    c.b0 = __ldg(e + group), c.b1 = __ldg(e + group + 1);
    c.h0 = ld_u16(e + 16);
  } else {  // LLK_QUANT_NF4
    c.absmax = __ldg(reinterpret_cast<const float*>(meta + blk * 4));
  }
}

// Element i of a 4-bit chunk is the low nibble of byte i, element i + 16 the high one, as V (int
// or float). Each word is masked once per half (0x0f0f0f0f), so a value costs one byte extract.
template <class V>
__device__ __forceinline__ void nibbles(const uint4 raw, V (&q)[kChunk]) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const uint32_t lo = words[j] & 0x0f0f0f0fu, hi = (words[j] >> 4) & 0x0f0f0f0fu;
#pragma unroll
    for (int b = 0; b < 4; ++b) {
      q[4 * j + b] = V((lo >> (8 * b)) & 0xffu);
      q[16 + 4 * j + b] = V((hi >> (8 * b)) & 0xffu);
    }
  }
}

// The chunk's 32 values, by the reference formula with each product and sum rounded as written.
template <LlkQuantFormat F>
__device__ __forceinline__ void decode_chunk(const QLinearParams& p, const RawChunk& c, float (&w)[kChunk]) {
  if constexpr (F == LLK_QUANT_Q8_0) {
    const float d = f16_bits(c.h0);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint32_t words[4] = {c.q[h].x, c.q[h].y, c.q[h].z, c.q[h].w};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int8_t q = int8_t((words[i / 4] >> (8 * (i % 4))) & 0xffu);
        w[16 * h + i] = __fmul_rn(float(q), d);
      }
    }
  } else {
    // Q4_0, Q4_1, Q4_K multiply the value as f32; NF4 looks it up (Q6_K reads the words itself).
    using V = std::conditional_t<F == LLK_QUANT_NF4, int, float>;
    V q[kChunk];
    if constexpr (F != LLK_QUANT_Q6_K) nibbles(c.q[0], q);
    // Q4_0 and Q4_1 in one fma each, with the reference's rounding: q * d is exact in f32 (a 4-bit
    // integer times an f16), and so is 8 d, so fma(q, d, -8 d) rounds (q - 8) d once, as
    // (q - 8) * d does, and fma(q, d, m) rounds q d + m once, as q * d + m does.
    if constexpr (F == LLK_QUANT_Q4_0) {
      const float d = f16_bits(c.h0), off = -8.f * d;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = fmaf(q[i], d, off);
    } else if constexpr (F == LLK_QUANT_Q4_1) {
      const float d = f16_bits(c.h0), m = f16_bits(c.h1);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = fmaf(q[i], d, m);
    } else if constexpr (F == LLK_QUANT_Q4_K) {
      // get_scale_min_k4: sub-blocks 0-3 hold their 6 bits in bytes j and j + 4; 4-7 split them.
      int sc, mn;
      if (c.sub < 4) {
        sc = c.b0 & 63, mn = c.b1 & 63;
      } else {
        sc = (c.b1 & 0x0f) | ((c.b2 >> 6) << 4);
        mn = (c.b1 >> 4) | ((c.b0 >> 6) << 4);
      }
      const float d1 = __fmul_rn(f16_bits(c.h0), float(sc)), m1 = __fmul_rn(f16_bits(c.h1), float(mn));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fadd_rn(__fmul_rn(d1, q[i]), -m1);
    } else if constexpr (F == LLK_QUANT_Q6_K) {
      // Four 6-bit values per word at once: element i's top bits are bits 2 (i / 8) of qh byte
      // i % 8, so for qs word j (elements 4j..4j+3, and 16+4j.. in the high nibbles) they sit in
      // qh word j % 2, shifted by 2 (j / 2) (low nibbles) or 2 (2 + j / 2) (high nibbles).
      const float d = f16_bits(c.h0);
      const float s0 = __fmul_rn(d, float(int8_t(c.b0))), s1 = __fmul_rn(d, float(int8_t(c.b1)));
      const uint32_t qs[4] = {c.q[0].x, c.q[0].y, c.q[0].z, c.q[0].w}, qh[2] = {c.qh.x, c.qh.y};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint32_t lo = (qs[j] & 0x0f0f0f0fu) | (((qh[j % 2] >> (2 * (j / 2))) & 0x03030303u) << 4);
        const uint32_t hi = ((qs[j] >> 4) & 0x0f0f0f0fu) | (((qh[j % 2] >> (2 * (2 + j / 2))) & 0x03030303u) << 4);
#pragma unroll
        for (int b = 0; b < 4; ++b) {  // (v - 32) is exact in f32, then one rounded product
          w[4 * j + b] = __fmul_rn(s0, __fadd_rn(float((lo >> (8 * b)) & 0xffu), -32.f));
          w[16 + 4 * j + b] = __fmul_rn(s1, __fadd_rn(float((hi >> (8 * b)) & 0xffu), -32.f));
        }
      }
    } else {  // LLK_QUANT_NF4
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fmul_rn(p.code[q[i]], c.absmax);
    }
  }
}

// Chunk `chunk` of row `row` of W, dequantized into w.
template <LlkQuantFormat F>
__device__ __forceinline__ void dequant_chunk(const QLinearParams& p, int64_t row, int64_t chunk, float (&w)[kChunk]) {
  RawChunk c;
  load_chunk<F>(p, row, chunk, c);
  decode_chunk<F>(p, c, w);
}

template <LlkQuantFormat F, class T>
__device__ void qgemv_kernel(const QLinearParams& p) {
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
    decode_chunk<F>(p, cur, w);
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
constexpr int kOutPitch = kBN + 4;  // f32 output tile: 16-byte rows, conflict-free 8-byte writes
static_assert(kGemmThreads == 128 && kThreadChunks * kGemmThreads == kBN * kRowChunks, "warps 2 x 2");
static_assert(LLK_QGEMM_SMEM_BYTES == (kStages * kBM + 2 * kBN) * kBK * 2, "params.h's formula");
static_assert(kBM * kOutPitch * 4 <= LLK_QGEMM_SMEM_BYTES, "the output tile fits in the pipeline's memory");

template <LlkQuantFormat F, class T>
__device__ void qgemm_kernel(const QLinearParams& p) {
  LLK_DYN_SMEM(raw);
  T* sA = reinterpret_cast<T*>(raw);   // [kStages][kBM][kBK], swizzled
  T* sB = sA + kStages * kBM * kBK;    // [2][kBN][kBK], swizzled
  const int64_t m0 = int64_t(blockIdx.x) * kBM, n0 = int64_t(blockIdx.y) * kBN;
  if (m0 >= p.rows || n0 >= p.n) return;  // the whole block, before any barrier
  const int valid = int(min(int64_t(kBM), p.rows - m0));
  const int tid = int(threadIdx.x), warp = tid / 32;
  const int wm = warp / 2, wn = warp % 2;
  // This split's steps [s0, s0 + ksteps) (all of k when k_splits is 1); an empty split still
  // writes its zero partial tile, so the reduce kernel reads every split.
  const int64_t all_steps = (p.k + kBK - 1) / kBK;
  const int64_t s0 = min(all_steps, int64_t(blockIdx.z) * p.k_steps_per_split);
  const int64_t ksteps = min(all_steps - s0, int64_t(p.k_steps_per_split));
  const T* x = reinterpret_cast<const T*>(p.x) + m0 * p.x_row_stride + s0 * kBK;
  const int64_t k_end = p.k - s0 * kBK;  // k past this split's start (zero-fill beyond it)

  auto load_a = [&](int64_t ks, int stage) {
    const int64_t k0 = ks * kBK;
    T* a = sA + stage * kBM * kBK;
#pragma unroll
    for (int i = tid; i < kBM * kBK / 8; i += kGemmThreads) {
      const int r = i / (kBK / 8), c = i % (kBK / 8);
      const bool ok = r < valid && k0 + c * 8 < k_end;
      llk::cp_async_16(a + llk::swizzled<kBK>(r, c), ok ? x + r * p.x_row_stride + k0 + c * 8 : x, ok ? 16 : 0);
    }
  };
  // Weight chunk i of this thread in step ks: row n0 + r of W, chunk ks * kRowChunks + c.
  auto chunk_of = [&](int i, int64_t ks, int& r, int64_t& chunk) {
    const int e = tid + i * kGemmThreads;
    r = e / kRowChunks;
    chunk = (s0 + ks) * kRowChunks + e % kRowChunks;
    return n0 + r < p.n && chunk * kChunk < p.k;
  };
  RawChunk next[kThreadChunks]{};
  auto load_b = [&](int64_t ks) {
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      int r;
      int64_t chunk;
      if (chunk_of(i, ks, r, chunk)) load_chunk<F>(p, n0 + r, chunk, next[i]);
    }
  };
  auto store_b = [&](int64_t ks, int buf) {
#pragma unroll
    for (int i = 0; i < kThreadChunks; ++i) {
      int r;
      int64_t chunk;
      float w[kChunk];
      if (chunk_of(i, ks, r, chunk)) {
        decode_chunk<F>(p, next[i], w);
      } else {
#pragma unroll
        for (int j = 0; j < kChunk; ++j) w[j] = 0.f;
      }
      T* tile = sB + buf * kBN * kBK;
      const int c0 = int(chunk % kRowChunks) * (kChunk / 8);  // the chunk's first 16-byte vector
#pragma unroll
      for (int v = 0; v < kChunk / 8; ++v) {  // 8 values rounded to T: one 16-byte shared store
        const float* e = w + 8 * v;
        *reinterpret_cast<uint4*>(tile + llk::swizzled<kBK>(r, c0 + v)) =
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
      llk::warp_mma_stage<T, kMTiles, kNTiles, kBK>(
          acc, sA + int(ks % kStages) * kBM * kBK, wm * kWarpRows, sB + int(ks % 2) * kBN * kBK,
          [&](int j) { return wn * kWarpCols + 8 * j; }, mt_active);
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
  const int cols = int(min(int64_t(kBN), p.n - n0));
  if (p.k_splits > 1) {  // block-uniform: the f32 partial tile of this split, for the reduce kernel
    float* part = reinterpret_cast<float*>(p.partial) + (int64_t(blockIdx.z) * p.rows + m0) * p.n + n0;
    for (int i = tid; i < kBM * kBN; i += kGemmThreads) {
      const int r = i / kBN, c = i % kBN;
      if (r < valid && c < cols) part[r * p.n + c] = sC[r * kOutPitch + c];
    }
    return;
  }
  T* y = reinterpret_cast<T*>(p.y) + m0 * p.y_row_stride + n0;
  constexpr int V = llk::kVec16<T>;
  const bool vec = p.y % 16 == 0 && p.y_row_stride % V == 0 && p.n % V == 0;  // block-uniform
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
  const int64_t chunks = p.k / kChunk;
  const int64_t t = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= p.n * chunks) return;
  const int64_t r = t / chunks, c = t % chunks;
  float w[kChunk];
  dequant_chunk<F>(p, p.row_first + r, c, w);
  T* out = reinterpret_cast<T*>(p.y) + r * p.y_row_stride + c * kChunk;
  constexpr int V = llk::kVec16<T>;
#pragma unroll
  for (int v = 0; v < kChunk / V; ++v) {
    float part[V];
#pragma unroll
    for (int i = 0; i < V; ++i) part[i] = w[v * V + i];
    llk::store_f32<T, V>(out + v * V, part);
  }
}

}  // namespace

// Symbols: qgemv_<format>_<dtype>, qgemm_<format>_<f16|bf16>, qdequant_<format>_<dtype> and
// qsplit_reduce_<f16|bf16>.
#define QLINEAR_FORMAT(X, fmt, F)                                                                            \
  X(qgemv_##fmt##_f32, QLinearParams, (kWarps * 32), (qgemv_kernel<F, float>))                             \
  X(qgemv_##fmt##_f16, QLinearParams, (kWarps * 32), (qgemv_kernel<F, __half>))                            \
  X(qgemv_##fmt##_bf16, QLinearParams, (kWarps * 32), (qgemv_kernel<F, __nv_bfloat16>))                    \
  X(qgemm_##fmt##_f16, QLinearParams, (kGemmThreads), (qgemm_kernel<F, __half>))                          \
  X(qgemm_##fmt##_bf16, QLinearParams, (kGemmThreads), (qgemm_kernel<F, __nv_bfloat16>))                   \
  X(qdequant_##fmt##_f32, QLinearParams, (LLK_QDEQUANT_THREADS), (qdequant_kernel<F, float>))              \
  X(qdequant_##fmt##_f16, QLinearParams, (LLK_QDEQUANT_THREADS), (qdequant_kernel<F, __half>))             \
  X(qdequant_##fmt##_bf16, QLinearParams, (LLK_QDEQUANT_THREADS), (qdequant_kernel<F, __nv_bfloat16>))

#define QLINEAR_KERNELS(X)                    \
  QLINEAR_FORMAT(X, q8_0, LLK_QUANT_Q8_0)     \
  QLINEAR_FORMAT(X, q4_0, LLK_QUANT_Q4_0)     \
  QLINEAR_FORMAT(X, q4_1, LLK_QUANT_Q4_1)     \
  QLINEAR_FORMAT(X, q4_k, LLK_QUANT_Q4_K)     \
  QLINEAR_FORMAT(X, q6_k, LLK_QUANT_Q6_K)     \
  QLINEAR_FORMAT(X, nf4, LLK_QUANT_NF4)

#define QLINEAR_REDUCE(X)                                                                     \
  X(qsplit_reduce_f16, QLinearParams, (LLK_QREDUCE_THREADS), (qreduce_kernel<__half>))        \
  X(qsplit_reduce_bf16, QLinearParams, (LLK_QREDUCE_THREADS), (qreduce_kernel<__nv_bfloat16>))

#define QLINEAR_ALL(X) \
  QLINEAR_KERNELS(X)   \
  QLINEAR_REDUCE(X)

LLK_EXPORT_KERNELS(qlinear, QLINEAR_ALL)
