// qlinear.cu -- linear layers over packed 4- and 8-bit weights: two GEMVs for decode that stream
// the packed weights once (on tensor cores for the integer formats with 16-bit activations, on
// CUDA cores for the rest), a tensor-core GEMM for prefill that dequantizes weight tiles into
// shared memory, and a dequantize kernel that expands a band of rows for a dense GEMM.
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
// Every kernel but the tensor-core GEMV multiplies by the weight rounded to the activation dtype
// T: the CUDA-core GEMV rounds each dequantized value in registers, the GEMM stores it as T in
// shared memory, and the dense GEMM of the fallback path reads the values the dequantize kernel
// stored as T, as a dequantize-then-multiply kernel does (Marlin and llama.cpp's dequantize to
// half before their tensor-core products too). The tensor-core GEMV multiplies by the exact
// values (below), so for its formats decode is the more accurate of the two paths.
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
// Tensor-core GEMV (qmmv_<format>_<dtype>; Q4_0, Q4_1, Q4_K, Q6_K; bf16, f16): y (+)= x W^T for
//   1 to LLK_QMMV_MAX_ROWS rows, by mma.sync m16n8k16 with A = 16 rows of W and B = x^T (the
//   activation rows are the MMA's 8 columns). It multiplies by the exact dequantized values: the
//   16-bit operands are the stored integers, made exact 16-bit floats by one byte permute into
//   the mantissa of a magic number (mmv_pair), and each chunk's f32 factors (its scale, and its
//   minimum times the chunk's activation sum, from an mma with A all ones) are applied to the
//   chunk's f32 partial sums, as llama.cpp's mmvq applies block scales to integer dot products.
//   Precision: the partial sums carry the magic number's base (1024 for f16, 128 for bf16) next
//   to values below 16, so they give up about 7 (f16) or 4 (bf16) of f32's 24 bits to the
//   cancellation; the products themselves are exact.
//   Grid mapping: grid.x walks 16-row tiles of W, grid.z splits of `in` (k_steps_per_split groups
//   each; f32 partials and the reduce kernel as the GEMM's), LLK_QMMV_WARPS warps per block take
//   the split's groups of LLK_QMMV_GROUP chunks in turn. Lane (g, t) loads chunk t of the group
//   for rows g and g + 8 (two 16-byte loads; a warp reads 16 rows x 64 contiguous bytes), one
//   group ahead; the quad transposes its words through shared memory so that lane t holds word t
//   of every chunk (the k16 slots an MMA fragment gives it: elements 4t..4t+3 of each half of a
//   chunk, whose activations are one 8-byte load), then per chunk 2 mma for the values (the low
//   and high nibbles are two k16 steps) and 2 for the activation sums, and 8 fmas of the factors.
//   The warps' tiles are added in warp order through shared memory: deterministic.
//   Bytes: the packed weights once, x once per 16 rows of W (from L1/L2), y once.
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
// Registers, so every field is a full word (narrower fields would cost byte inserts).
struct RawChunk {
  uint4 q[2];
  uint2 qh;
  uint32_t h0, h1;      // f16 bits: Q8_0, Q4_0, Q6_K: d; Q4_1: d, m; Q4_K: d, dmin
  uint32_t b0, b1, b2;  // Q4_K: scale bytes s[j], s[j + 4], s[j - 4] of sub-block j; Q6_K: the
                        // scales of the chunk's two 16-element groups
  int sub;              // Q4_K: the sub-block j (from the chunk's position, not from memory)
  float absmax;         // NF4
};

__device__ __forceinline__ float f16_bits(uint32_t bits) {
  const uint16_t h = uint16_t(bits);
  __half v;
  memcpy(static_cast<void*>(&v), &h, 2);
  return __half2float(v);
}

__device__ __forceinline__ uint16_t ld_u16(const uint8_t* p) { return __ldg(reinterpret_cast<const uint16_t*>(p)); }

// Where one row of W starts in each plane.
struct RowPlanes {
  const uint8_t* qs;
  const uint8_t* qh;
  const uint8_t* meta;
};
__device__ __forceinline__ RowPlanes row_planes(const QLinearParams& p, int64_t row) {
  return {reinterpret_cast<const uint8_t*>(p.qs) + row * p.qs_row_bytes,
          reinterpret_cast<const uint8_t*>(p.qh) + row * p.qh_row_bytes,
          reinterpret_cast<const uint8_t*>(p.meta) + row * p.meta_row_bytes};
}

// Issues the loads of chunk `chunk` of the row at `r` (nothing here waits for them).
template <LlkQuantFormat F>
__device__ __forceinline__ void load_chunk(const QLinearParams& p, const RowPlanes& r, int64_t chunk, RawChunk& c) {
  const uint8_t* meta = r.meta;
  const int64_t first = chunk * kChunk;  // the chunk's first element within the row
  // Every format's block but NF4's is fixed (32 or 256, QuantLayout::new checks it).
  constexpr int kShift = F == LLK_QUANT_Q4_K || F == LLK_QUANT_Q6_K ? 8 : F == LLK_QUANT_NF4 ? -1 : 5;
  const int64_t blk = first >> (kShift >= 0 ? kShift : p.block_shift);
  constexpr int kQsBytes = F == LLK_QUANT_Q8_0 ? 32 : 16;
  const uint8_t* qs = r.qs + chunk * kQsBytes;
  c.q[0] = __ldg(reinterpret_cast<const uint4*>(qs));
  if constexpr (F == LLK_QUANT_Q8_0) c.q[1] = __ldg(reinterpret_cast<const uint4*>(qs + 16));
  if constexpr (F == LLK_QUANT_Q8_0 || F == LLK_QUANT_Q4_0) {
    c.h0 = ld_u16(meta + blk * 2);
  } else if constexpr (F == LLK_QUANT_Q4_1) {
    c.h0 = ld_u16(meta + blk * 4), c.h1 = ld_u16(meta + blk * 4 + 2);
  } else if constexpr (F == LLK_QUANT_Q4_K) {
    // The 16-byte header in one load (rows are 16-byte aligned): d, dmin, then scales[12] in
    // words y, z, w. Sub-block j uses bytes j and j + 4 of the scales, and for j >= 4 also j - 4:
    // byte j % 4 of words (y, z), or (z, w) and y.
    const uint4 e = __ldg(reinterpret_cast<const uint4*>(meta + blk * 16));
    const int j = int(uint32_t(first) & 255u) >> 5, sel = 0x4440 | (j & 3);  // byte j % 4, zero above
    c.sub = j;
    c.h0 = e.x & 0xffffu, c.h1 = e.x >> 16;
    c.b0 = __byte_perm(j < 4 ? e.y : e.z, 0, sel);
    c.b1 = __byte_perm(j < 4 ? e.z : e.w, 0, sel);
    c.b2 = __byte_perm(e.y, 0, sel);
  } else if constexpr (F == LLK_QUANT_Q6_K) {
    const uint8_t* e = meta + blk * 18;
    c.qh = __ldg(reinterpret_cast<const uint2*>(r.qh + chunk * 8));
    const int group = int(uint32_t(first) & 255u) >> 4;  // the chunk's first 16-element scale group
    c.b0 = __ldg(e + group), c.b1 = __ldg(e + group + 1);
    c.h0 = ld_u16(e + 16);
  } else {  // LLK_QUANT_NF4
    c.absmax = __ldg(reinterpret_cast<const float*>(meta + blk * 4));
  }
}

template <LlkQuantFormat F>
__device__ __forceinline__ void load_chunk(const QLinearParams& p, int64_t row, int64_t chunk, RawChunk& c) {
  load_chunk<F>(p, row_planes(p, row), chunk, c);
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

// Q4_K's sub-block scale and minimum (get_scale_min_k4: sub-blocks 0-3 hold their 6 bits in bytes
// j and j + 4; 4-7 split them), times the super-block's d and dmin, each product rounded once.
__device__ __forceinline__ void q4k_scale_min(const RawChunk& c, float& d1, float& m1) {
  int sc, mn;
  if (c.sub < 4) {
    sc = c.b0 & 63, mn = c.b1 & 63;
  } else {
    sc = (c.b1 & 0x0f) | ((c.b2 >> 6) << 4);
    mn = (c.b1 >> 4) | ((c.b0 >> 6) << 4);
  }
  d1 = __fmul_rn(f16_bits(c.h0), float(sc)), m1 = __fmul_rn(f16_bits(c.h1), float(mn));
}

// Q6_K's scales of the chunk's two 16-element groups: d times each signed 8-bit scale.
__device__ __forceinline__ void q6k_scales(const RawChunk& c, float& s0, float& s1) {
  const float d = f16_bits(c.h0);
  s0 = __fmul_rn(d, float(int8_t(c.b0))), s1 = __fmul_rn(d, float(int8_t(c.b1)));
}

// Q6_K's 6-bit values of qs word j (elements 4j..4j+3 in `lo`, 16+4j..16+4j+3 in `hi`, one per
// byte), four at once: element i's top bits are bits 2 (i / 8) of qh byte i % 8, so for word j
// they sit in qh word j % 2 (`qh_word`), shifted by 2 (j / 2) (low nibbles) or 2 (2 + j / 2).
__device__ __forceinline__ void q6k_values(uint32_t qs, uint32_t qh_word, int j, uint32_t& lo, uint32_t& hi) {
  lo = (qs & 0x0f0f0f0fu) | (((qh_word >> (2 * (j / 2))) & 0x03030303u) << 4);
  hi = ((qs >> 4) & 0x0f0f0f0fu) | (((qh_word >> (2 * (2 + j / 2))) & 0x03030303u) << 4);
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
      float d1, m1;
      q4k_scale_min(c, d1, m1);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fadd_rn(__fmul_rn(d1, q[i]), -m1);
    } else if constexpr (F == LLK_QUANT_Q6_K) {
      float s0, s1;
      q6k_scales(c, s0, s1);
      const uint32_t qs[4] = {c.q[0].x, c.q[0].y, c.q[0].z, c.q[0].w}, qh[2] = {c.qh.x, c.qh.y};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t lo, hi;
        q6k_values(qs[j], qh[j % 2], j, lo, hi);
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

// ---------------------------------------------------------------------------------------------
// Tensor-core GEMV (qmmv_<format>_<f16|bf16>). A warp's step is one group of 4 chunks of a
// 16-row tile of W; lane (g, t) loads chunk 4 G + t of rows g and g + 8 (two 16-byte loads).
constexpr int kMmvWarps = LLK_QMMV_WARPS, kMmvGroup = LLK_QMMV_GROUP, kMmvRows = 16;
static_assert(kMmvGroup == 4 && LLK_QMMV_MAX_ROWS == 8, "a quad's lanes hold one group; one n-tile");
static_assert(LLK_QMMV_DEPTH == 2, "the tensor-core GEMV loads one group ahead");

// How a format's stored values enter the product. Each value v (a nibble, or Q6_K's 6 bits) is
// placed in the low mantissa bits of the magic number 1024 (f16) or 128 (bf16), whose ulp is 1,
// so one byte permute turns two of them into the exact T values base + v. The 4-bit formats keep
// base + v and fold the base into a second factor that multiplies the chunk's activation sum
// S(x) (an mma with A all ones, on every row): w = a v + m per element gives
// a S(base + v) + (m - a base) S(x), the same sum (Q4_0: m = -8 d). Q6_K, whose chunk has two
// scales, subtracts base + 32 exactly instead (one pair addition per two values) and scales each
// 16-element half's sum by its own factor.
template <class T>
constexpr float kMmvBase = std::is_same<T, __half>::value ? 1024.f : 128.f;
template <LlkQuantFormat F>
constexpr bool kMmvSum = F != LLK_QUANT_Q6_K;

// The chunk's two f32 factors (a, b), from the reference's roundings: the 4-bit formats' sum is
// a S(base + v) + b S(x); Q6_K's a S_lo(v - 32) + b S_hi(v - 32).
template <LlkQuantFormat F, class T>
__device__ __forceinline__ float2 mmv_factors(const RawChunk& c) {
  constexpr float kBase = kMmvBase<T>;
  if constexpr (F == LLK_QUANT_Q4_0) {  // w = d (v - 8): b = -(base + 8) d, exact in f32
    const float d = f16_bits(c.h0);
    return make_float2(d, -(kBase + 8.f) * d);
  } else if constexpr (F == LLK_QUANT_Q4_1) {  // w = d v + m: b = m - base d (base d is exact)
    const float d = f16_bits(c.h0);
    return make_float2(d, __fadd_rn(f16_bits(c.h1), -kBase * d));
  } else if constexpr (F == LLK_QUANT_Q4_K) {  // w = d1 v - m1: b = -m1 - base d1
    float d1, m1;
    q4k_scale_min(c, d1, m1);
    return make_float2(d1, __fadd_rn(-m1, -kBase * d1));
  } else {
    static_assert(F == LLK_QUANT_Q6_K, "the tensor-core GEMV's formats");
    float s0, s1;
    q6k_scales(c, s0, s1);
    return make_float2(s0, s1);
  }
}

// Bytes b0 and b1 (sel 0x0504) or b2 and b3 (sel 0x0706) of `v`, each an integer below 128, as two
// T values base + b (Q6_K: minus base + 32, exactly).
template <LlkQuantFormat F, class T>
__device__ __forceinline__ uint32_t mmv_pair(uint32_t v, uint32_t sel) {
  constexpr bool kF16 = std::is_same<T, __half>::value;
  constexpr uint32_t kMagic = kF16 ? 0x64646464u : 0x43434343u;  // 0x64xx = 1024 + xx, 0x43xx = 128 + xx
  // The magic word is the first operand so that it stays in a register and the selector is the
  // instruction's immediate (the other order makes ptxas rebuild the selector for every PRMT).
  const uint32_t biased = __byte_perm(kMagic, v, sel);
  if constexpr (kMmvSum<F>) {
    return biased;
  } else {
    // -(base + 32): the base's sign and exponent bits with 32 as mantissa (its ulp is 1).
    constexpr uint32_t kMinus = (kF16 ? 0xe400u : 0xc300u) + 32u;
    using P = std::conditional_t<kF16, __half2, __nv_bfloat162>;
    const uint32_t minus = kMinus | kMinus << 16;
    P a, b;
    memcpy(static_cast<void*>(&a), &biased, 4);
    memcpy(static_cast<void*>(&b), &minus, 4);
    const P r = __hadd2(a, b);
    uint32_t out;
    memcpy(&out, &r, 4);
    return out;
  }
}

// The quad's exchange of one group (per warp, double-buffered): lane (g, t) holds chunk t's words
// and wants word t of every chunk (a 4 x 4 transpose per row), Q6_K's high bits alike, and every
// chunk's factors. qs rows are [word ^ swizzle(g)][chunk], so both the scalar stores and the
// 16-byte loads are free of bank conflicts.
struct MmvExchange {
  uint32_t qs[2][8][16];  // [row g / g + 8][g][(word ^ ((g >> 1) & 3)) * 4 + chunk]
  uint32_t qh[2][8][8];   // [row][g][word * 4 + chunk] (Q6_K)
  float4 f[8][4];         // [g][chunk]: the factors of row g (x, y) and row g + 8 (z, w)
};

template <LlkQuantFormat F, class T>
__device__ void qmmv_kernel(const QLinearParams& p) {
  __shared__ MmvExchange ex[kMmvWarps][2];
  __shared__ float red[kMmvWarps][8][kMmvRows];  // [warp][activation row][weight row]
  const int lane = int(threadIdx.x % 32), warp = int(threadIdx.x / 32), g = lane >> 2, t = lane & 3;
  const int64_t r0 = int64_t(blockIdx.x) * kMmvRows;
  const int64_t chunks = p.k / kChunk, groups = (chunks + kMmvGroup - 1) / kMmvGroup;
  const int64_t g0 = min(groups, int64_t(blockIdx.z) * p.k_steps_per_split);
  const int64_t g1 = min(groups, g0 + p.k_steps_per_split);
  // This lane's B column is activation row g; lanes past the rows read the last one (their
  // outputs are never stored), and rows past n read row n - 1 (likewise).
  const T* xrow = reinterpret_cast<const T*>(p.x) + min(int64_t(g), p.rows - 1) * p.x_row_stride + 4 * t;
  const RowPlanes rows[2] = {row_planes(p, min(r0 + g, p.n - 1)), row_planes(p, min(r0 + g + 8, p.n - 1))};
  const int swz = (g >> 1) & 3;
  // A of all ones (the 4-bit formats); four registers the compiler cannot tell apart from other values,
  // so that it keeps them as one operand instead of rebuilding the quad for every mma.
  uint32_t ones_a[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) ones_a[i] = llk::opaque(llk::pack_pair<T>(1.f, 1.f));
  float acc[4] = {0.f, 0.f, 0.f, 0.f};

  // Group `grp`'s chunk t of both rows. In the tail group (k ends inside it) the chunks past k
  // are not read: zero bytes, so zero factors.
  auto load = [&](int64_t grp, RawChunk(&raw)[2], auto tail) {
    const bool ok = !decltype(tail)::value || t < chunks - grp * kMmvGroup;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if constexpr (decltype(tail)::value) raw[h] = RawChunk{};
      if (ok) load_chunk<F>(p, rows[h], grp * kMmvGroup + t, raw[h]);
    }
  };
  // One group's products, from its loaded chunks; `buf` picks the exchange buffer.
  auto group = [&](int64_t grp, const RawChunk(&cur)[2], int buf, auto tail) {
    constexpr bool kTail = decltype(tail)::value;
    // This lane's activations: elements 4t..4t+3 and 16+4t..16+4t+3 of each chunk (in the tail,
    // zero past k).
    const int valid = kTail ? int(chunks - grp * kMmvGroup) : kMmvGroup;
    const T* xg = xrow + grp * (kMmvGroup * kChunk);
    uint2 xv[kMmvGroup][2];
#pragma unroll
    for (int j = 0; j < kMmvGroup; ++j)
#pragma unroll
      for (int half = 0; half < 2; ++half)
        xv[j][half] = !kTail || j < valid ? *reinterpret_cast<const uint2*>(xg + j * kChunk + 16 * half) : make_uint2(0, 0);
    MmvExchange& e = ex[warp][buf];
    const uint32_t words[2][4] = {{cur[0].q[0].x, cur[0].q[0].y, cur[0].q[0].z, cur[0].q[0].w},
                                  {cur[1].q[0].x, cur[1].q[0].y, cur[1].q[0].z, cur[1].q[0].w}};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int w = 0; w < 4; ++w) e.qs[h][g][(w ^ swz) * 4 + t] = words[h][w];
      if constexpr (F == LLK_QUANT_Q6_K) e.qh[h][g][t] = cur[h].qh.x, e.qh[h][g][4 + t] = cur[h].qh.y;
    }
    const float2 f0 = mmv_factors<F, T>(cur[0]), f1 = mmv_factors<F, T>(cur[1]);
    e.f[g][t] = make_float4(f0.x, f0.y, f1.x, f1.y);
    // Every lane's stores are visible to its quad; the other buffer was last read before this.
    __syncwarp();
    uint4 mine[2];
    [[maybe_unused]] uint4 mine_qh[2]{};
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      mine[h] = *reinterpret_cast<const uint4*>(&e.qs[h][g][(t ^ swz) * 4]);
      if constexpr (F == LLK_QUANT_Q6_K) mine_qh[h] = *reinterpret_cast<const uint4*>(&e.qh[h][g][(t % 2) * 4]);
    }
#pragma unroll
    for (int j = 0; j < kMmvGroup; ++j) {
      const float4 f = e.f[g][j];
      uint32_t lo[2], hi[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t u = j == 0 ? mine[h].x : j == 1 ? mine[h].y : j == 2 ? mine[h].z : mine[h].w;
        if constexpr (F == LLK_QUANT_Q6_K) {
          const uint32_t qh = j == 0 ? mine_qh[h].x : j == 1 ? mine_qh[h].y : j == 2 ? mine_qh[h].z : mine_qh[h].w;
          q6k_values(u, qh, t, lo[h], hi[h]);
        } else {
          lo[h] = u & 0x0f0f0f0fu, hi[h] = (u >> 4) & 0x0f0f0f0fu;
        }
      }
      // Slots 2t, 2t+1 of the k16 step hold elements 4t, 4t+1 of its 16; slots 2t+8, 2t+9 hold
      // 4t+2, 4t+3 (the activations' order in xv): the low nibbles are one step, the high ones
      // the next.
      const uint32_t a_lo[4] = {mmv_pair<F, T>(lo[0], 0x0504), mmv_pair<F, T>(lo[1], 0x0504),
                                mmv_pair<F, T>(lo[0], 0x0706), mmv_pair<F, T>(lo[1], 0x0706)};
      const uint32_t a_hi[4] = {mmv_pair<F, T>(hi[0], 0x0504), mmv_pair<F, T>(hi[1], 0x0504),
                                mmv_pair<F, T>(hi[0], 0x0706), mmv_pair<F, T>(hi[1], 0x0706)};
      const uint32_t b_lo[2] = {xv[j][0].x, xv[j][0].y}, b_hi[2] = {xv[j][1].x, xv[j][1].y};
      float s0[4] = {0.f, 0.f, 0.f, 0.f}, s1[4] = {0.f, 0.f, 0.f, 0.f};
      llk::mma_m16n8k16<T>(s0, a_lo, b_lo, s0);
      if constexpr (F == LLK_QUANT_Q6_K) {  // each half its scale
        llk::mma_m16n8k16<T>(s1, a_hi, b_hi, s1);
      } else {
        llk::mma_m16n8k16<T>(s0, a_hi, b_hi, s0);
      }
      if constexpr (kMmvSum<F>) {  // the chunk's activation sums (on every row)
        llk::mma_m16n8k16<T>(s1, ones_a, b_lo, s1);
        llk::mma_m16n8k16<T>(s1, ones_a, b_hi, s1);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // c[0], c[1]: row g; c[2], c[3]: row g + 8
        acc[i] = fmaf(i < 2 ? f.x : f.z, s0[i], acc[i]);
        acc[i] = fmaf(i < 2 ? f.y : f.w, s1[i], acc[i]);
      }
    }
  };

  // The full groups, each loaded during the previous one's products; then the tail group, if
  // this warp has it.
  const int64_t full_end = min(g1, chunks / kMmvGroup);
  int64_t grp = g0 + warp;
  int buf = 0;
  RawChunk cur[2];
  if (grp < full_end) load(grp, cur, std::false_type{});
  for (; grp < full_end; grp += kMmvWarps, buf ^= 1) {
    RawChunk nxt[2];
    if (grp + kMmvWarps < full_end) load(grp + kMmvWarps, nxt, std::false_type{});
    group(grp, cur, buf, std::false_type{});
    cur[0] = nxt[0], cur[1] = nxt[1];
  }
  if (grp < g1) {
    load(grp, cur, std::true_type{});
    group(grp, cur, buf, std::true_type{});
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) red[warp][2 * t + (i & 1)][g + 8 * (i >> 1)] = acc[i];
  __syncthreads();
  const int tid = int(threadIdx.x), col = tid / kMmvRows, r = tid % kMmvRows;
  static_assert(kMmvWarps * 32 == 8 * kMmvRows, "one thread per output of the tile");
  if (col >= p.rows || r0 + r >= p.n) return;
  float s = red[0][col][r];
#pragma unroll
  for (int w = 1; w < kMmvWarps; ++w) s = __fadd_rn(s, red[w][col][r]);
  if (p.k_splits > 1) {
    reinterpret_cast<float*>(p.partial)[(int64_t(blockIdx.z) * p.rows + col) * p.n + r0 + r] = s;
    return;
  }
  T* out = reinterpret_cast<T*>(p.y) + col * p.y_row_stride + r0 + r;
  *out = llk::from_f32<T>(p.accumulate ? __fadd_rn(llk::to_f32(*out), s) : s);
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

// The tensor-core GEMV's formats (integer values and per-chunk scales).
#define QLINEAR_MMV_FORMAT(X, fmt, F)                                                       \
  X(qmmv_##fmt##_f16, QLinearParams, (kMmvWarps * 32), (qmmv_kernel<F, __half>))          \
  X(qmmv_##fmt##_bf16, QLinearParams, (kMmvWarps * 32), (qmmv_kernel<F, __nv_bfloat16>))

#define QLINEAR_MMV(X)                         \
  QLINEAR_MMV_FORMAT(X, q4_0, LLK_QUANT_Q4_0)  \
  QLINEAR_MMV_FORMAT(X, q4_1, LLK_QUANT_Q4_1)  \
  QLINEAR_MMV_FORMAT(X, q4_k, LLK_QUANT_Q4_K)  \
  QLINEAR_MMV_FORMAT(X, q6_k, LLK_QUANT_Q6_K)

#define QLINEAR_REDUCE(X)                                                                     \
  X(qsplit_reduce_f16, QLinearParams, (LLK_QREDUCE_THREADS), (qreduce_kernel<__half>))        \
  X(qsplit_reduce_bf16, QLinearParams, (LLK_QREDUCE_THREADS), (qreduce_kernel<__nv_bfloat16>))

#define QLINEAR_ALL(X) \
  QLINEAR_KERNELS(X)   \
  QLINEAR_MMV(X)       \
  QLINEAR_REDUCE(X)

LLK_EXPORT_KERNELS(qlinear, QLINEAR_ALL)
