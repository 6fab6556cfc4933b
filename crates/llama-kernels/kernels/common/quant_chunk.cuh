// quant_chunk.cuh -- the packed weight formats as the kernels read them: one chunk (32
// consecutive elements of a weight row) at a time, in two steps, `load_chunk` (its bytes, into
// registers: nothing waits for them) and `decode_chunk` (its f32 values), so that a kernel can
// issue the loads of its next chunks before the math of this one.
//
// Formats (params.h LlkQuantFormat; the layout and the f32 reference are src/spec/quant.rs):
// GGUF's Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q5_K and Q6_K, and bitsandbytes' NF4. Each is read in
// chunks of 32 consecutive elements of one weight row. The quantized values of a chunk are one or
// two 16-byte vectors of the `qs` plane (Q6_K adds 8 bytes of the `qh` plane, the 5-bit formats 4
// bytes of fifth bits); its block header (scales,
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
// half before their tensor-core products too). The tensor-core GEMV (qmmv.cu) multiplies the
// integer formats by their exact values and NF4 by its code book rounded to T times the f32
// absmax.
//
// A chunk is read in two steps, `load_chunk` (its bytes, into registers) and `decode_chunk` (the
// f32 values), so that the GEMM can issue the loads of its next tile before the math of this one.
//
#pragma once
#include "llk.cuh"

// Every format, for the kernel families' symbol lists: M(X, name, LlkQuantFormat) for each.
#define LLK_QUANT_FORMATS(M, X)                                                             \
  M(X, q8_0, LLK_QUANT_Q8_0)                                                                \
  M(X, q4_0, LLK_QUANT_Q4_0)                                                                \
  M(X, q4_1, LLK_QUANT_Q4_1)                                                                \
  M(X, q4_k, LLK_QUANT_Q4_K)                                                                \
  M(X, q6_k, LLK_QUANT_Q6_K)                                                                \
  M(X, nf4, LLK_QUANT_NF4)                                                                  \
  M(X, q5_0, LLK_QUANT_Q5_0)                                                                \
  M(X, q5_1, LLK_QUANT_Q5_1)                                                                \
  M(X, q5_k, LLK_QUANT_Q5_K)

// The 5-bit formats: the 4-bit formats' values plus a fifth bit per element in the qh plane.
template <LlkQuantFormat F>
constexpr bool kFifthBit = F == LLK_QUANT_Q5_0 || F == LLK_QUANT_Q5_1 || F == LLK_QUANT_Q5_K;
// The formats whose header is Q4_K's (d, dmin, 12 bytes of 6-bit scales and minimums) and whose
// blocks are super-blocks of 256.
template <LlkQuantFormat F>
constexpr bool kQ4KHeader = F == LLK_QUANT_Q4_K || F == LLK_QUANT_Q5_K;

namespace llk::quant {

constexpr int kChunk = LLK_QUANT_CHUNK;

// The bytes chunk `chunk` of a weight row is made from: its quantized values (one 16-byte vector,
// two for Q8_0), Q6_K's top bits, and the fields of its block header that it uses, as stored.
// Registers, so every field is a full word (narrower fields would cost byte inserts).
struct RawChunk {
  uint4 q[2];
  uint2 qh;             // Q6_K: the top bits; the 5-bit formats: their fifth bits in qh.x
  uint32_t h0, h1;      // f16 bits: Q8_0, Q4_0, Q5_0, Q6_K: d; Q4_1, Q5_1: d, m; Q4_K, Q5_K: d, dmin
  uint32_t b0, b1, b2;  // Q4_K, Q5_K: scale bytes s[j], s[j + 4], s[j - 4] of sub-block j; Q6_K:
                        // the scales of the chunk's two 16-element groups
  int sub;              // Q4_K, Q5_K: the sub-block j (from the chunk's position, not from memory)
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
  constexpr int kShift = kQ4KHeader<F> || F == LLK_QUANT_Q6_K ? 8 : F == LLK_QUANT_NF4 ? -1 : 5;
  const int64_t blk = first >> (kShift >= 0 ? kShift : p.block_shift);
  constexpr int kQsBytes = F == LLK_QUANT_Q8_0 ? 32 : 16;
  const uint8_t* qs = r.qs + chunk * kQsBytes;
  c.q[0] = __ldg(reinterpret_cast<const uint4*>(qs));
  if constexpr (F == LLK_QUANT_Q8_0) c.q[1] = __ldg(reinterpret_cast<const uint4*>(qs + 16));
  if constexpr (kFifthBit<F>) c.qh.x = __ldg(reinterpret_cast<const uint32_t*>(r.qh + chunk * 4));
  if constexpr (F == LLK_QUANT_Q8_0 || F == LLK_QUANT_Q4_0 || F == LLK_QUANT_Q5_0) {
    c.h0 = ld_u16(meta + blk * 2);
  } else if constexpr (F == LLK_QUANT_Q4_1 || F == LLK_QUANT_Q5_1) {
    c.h0 = ld_u16(meta + blk * 4), c.h1 = ld_u16(meta + blk * 4 + 2);
  } else if constexpr (kQ4KHeader<F>) {
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

// Bits 0-3 of `x` moved to bit 4 of bytes 0-3 (the fifth bits of four 5-bit values, one per
// byte): x * 0x00204081 puts bit b at b, b + 7, b + 14 and b + 21, all distinct positions, so no
// carries; bit 8b holds bit b, masked out and shifted up by 4. One multiply, two logic ops.
__device__ __forceinline__ uint32_t fifth_bits(uint32_t x) { return ((x & 0xfu) * 0x00204081u & 0x01010101u) << 4; }

// Element i of a 4-bit chunk is the low nibble of byte i, element i + 16 the high one, as V (int
// or float). Each word is masked once per half (0x0f0f0f0f), so a value costs one byte extract.
// FIFTH: the 5-bit formats, whose element i has its fifth bit in bit i of `qh`, merged into the
// bytes four at a time before the extracts.
template <bool FIFTH = false, class V>
__device__ __forceinline__ void nibbles(const uint4 raw, V (&q)[kChunk], uint32_t qh = 0) {
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    uint32_t lo = words[j] & 0x0f0f0f0fu, hi = (words[j] >> 4) & 0x0f0f0f0fu;
    if constexpr (FIFTH) lo |= fifth_bits(qh >> (4 * j)), hi |= fifth_bits(qh >> (16 + 4 * j));
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

// NF4's code book, staged in shared memory (`smem`) by every block that decodes NF4: read from
// the params by index it would be a constant-bank load, which serializes a warp's lanes over
// their distinct indexes; in shared memory its 16 entries sit in 16 banks, so the lookups of a
// warp are conflict-free. A block-wide barrier for NF4 (a no-op for the other formats): call it
// before any thread of the block returns.
template <LlkQuantFormat F>
__device__ __forceinline__ const float* code_book(const QLinearParams& p, float (&smem)[16]) {
  if constexpr (F == LLK_QUANT_NF4) {
    if (threadIdx.x < 16) smem[threadIdx.x] = p.code[threadIdx.x];
    __syncthreads();
  }
  return smem;
}

// The chunk's 32 values, by the reference formula with each product and sum rounded as written;
// `code`: NF4's code book (code_book), unused by the other formats.
template <LlkQuantFormat F>
__device__ __forceinline__ void decode_chunk(const float* code, const RawChunk& c, float (&w)[kChunk]) {
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
  } else {
    // The nibble formats: Q4_0, Q4_1, Q4_K and the 5-bit ones multiply the value as f32; NF4
    // looks it up.
    using V = std::conditional_t<F == LLK_QUANT_NF4, int, float>;
    V q[kChunk];
    nibbles<kFifthBit<F>>(c.q[0], q, c.qh.x);
    // Q4_0, Q5_0, Q4_1 and Q5_1 in one fma each, with the reference's rounding: q * d is exact in
    // f32 (a 4- or 5-bit integer times an f16), and so is 8 d or 16 d, so fma(q, d, -8 d) rounds
    // (q - 8) d once, as (q - 8) * d does (exact, in fact), and fma(q, d, m) rounds q d + m once,
    // as q * d + m does.
    if constexpr (F == LLK_QUANT_Q4_0 || F == LLK_QUANT_Q5_0) {
      const float d = f16_bits(c.h0), off = (F == LLK_QUANT_Q4_0 ? -8.f : -16.f) * d;
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = fmaf(q[i], d, off);
    } else if constexpr (F == LLK_QUANT_Q4_1 || F == LLK_QUANT_Q5_1) {
      const float d = f16_bits(c.h0), m = f16_bits(c.h1);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = fmaf(q[i], d, m);
    } else if constexpr (kQ4KHeader<F>) {
      float d1, m1;
      q4k_scale_min(c, d1, m1);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fadd_rn(__fmul_rn(d1, q[i]), -m1);
    } else {
      static_assert(F == LLK_QUANT_NF4, "every format");
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fmul_rn(code[q[i]], c.absmax);
    }
  }
}

// Chunk `chunk` of row `row` of W, dequantized into w.
template <LlkQuantFormat F>
__device__ __forceinline__ void dequant_chunk(const QLinearParams& p, const float* code, int64_t row, int64_t chunk,
                                              float (&w)[kChunk]) {
  RawChunk c;
  load_chunk<F>(p, row, chunk, c);
  decode_chunk<F>(code, c, w);
}

// Stores a chunk's 32 values rounded to T at `out`: 16-byte stores when `vec` (out 16-byte
// aligned), else one by one.
template <class T>
__device__ __forceinline__ void store_chunk(T* out, const float (&w)[kChunk], bool vec) {
  constexpr int V = llk::kVec16<T>;
  if (vec) {
#pragma unroll
    for (int v = 0; v < kChunk / V; ++v) {
      float part[V];
#pragma unroll
      for (int j = 0; j < V; ++j) part[j] = w[v * V + j];
      llk::store_f32<T, V>(out + v * V, part);
    }
  } else {
#pragma unroll
    for (int j = 0; j < kChunk; ++j) out[j] = llk::from_f32<T>(w[j]);
  }
}

}  // namespace llk::quant
