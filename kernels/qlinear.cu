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
// contraction into an fma), so a chunk dequantizes to exactly the f32 values llama.cpp's
// `dequantize_row_*` and bitsandbytes' `dequantize_4bit` produce.
//
// Both kernels multiply by the weight rounded to the activation dtype T: the GEMV rounds each
// dequantized value in registers, the dense GEMM of prefill reads the values the dequantize kernel
// stored as T. So decode and prefill compute with the same weights (for f32, the exact dequantized
// values), as a dequantize-then-multiply kernel does (Marlin and llama.cpp's dequantize to half
// before their tensor-core products too).
//
// GEMV (qgemv_<format>_<dtype>): y[m, c] (+)= sum_j x[m, j] * w[c, j] for m < rows.
//   Grid mapping: one warp per output feature c (LLK_QGEMV_WARPS warps per block, grid.x blocks
//   over n). Lane l takes chunks l, l + 32, l + 64, ... of W's row c: each lane's weight loads
//   are 16 bytes and a warp's are 512 contiguous bytes. A chunk is dequantized once into 32
//   registers and used for every activation row (x is read through L1/L2: it is small and every
//   warp of the grid reads it). Each lane accumulates in f32 with fmaf in element order; the warp
//   then sums its lanes by a fixed butterfly, so the result does not depend on scheduling. x is
//   read in 16-byte vectors: the host sends activations whose rows are not 16-byte aligned down
//   the dequantize-and-GEMM path instead.
//   Bytes: the packed weights once (qs + qh + meta), x once per block from L2, y once.
//
// Dequantize (qdequant_<format>_<dtype>): rows [row_first, row_first + n) of W into a dense
//   [n, k] tensor of T (row stride y_row_stride); one thread per chunk, 16-byte stores.
#include "common/llk.cuh"

namespace {

constexpr int kChunk = LLK_QUANT_CHUNK;
constexpr int kWarps = LLK_QGEMV_WARPS;
constexpr int kMaxRows = LLK_QGEMV_MAX_ROWS;

__device__ __forceinline__ float f16_at(const uint8_t* p) {
  return __half2float(*reinterpret_cast<const __half*>(p));
}

// 16 bytes of a 4-bit chunk: element i is the low nibble of byte i, element i + 16 the high one.
__device__ __forceinline__ void nibbles(const uint8_t* qs, int (&q)[kChunk]) {
  const uint4 raw = __ldg(reinterpret_cast<const uint4*>(qs));
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    const uint32_t b = (words[i / 4] >> (8 * (i % 4))) & 0xffu;
    q[i] = int(b & 0x0fu);
    q[i + 16] = int(b >> 4);
  }
}

// Q4_K's 6-bit scale and minimum of sub-block j from its 12 packed bytes (get_scale_min_k4).
__device__ __forceinline__ void scale_min_k4(int j, const uint8_t* s, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63, m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Chunk `chunk` of row `row` of W, dequantized into w.
template <LlkQuantFormat F>
__device__ __forceinline__ void dequant_chunk(const QLinearParams& p, int64_t row, int64_t chunk, float (&w)[kChunk]) {
  const uint8_t* meta = reinterpret_cast<const uint8_t*>(p.meta) + row * p.meta_row_bytes;
  const int64_t first = chunk * kChunk;  // the chunk's first element within the row
  const int64_t blk = first / p.block;
  if constexpr (F == LLK_QUANT_Q8_0) {
    const uint8_t* qs = reinterpret_cast<const uint8_t*>(p.qs) + row * p.qs_row_bytes + chunk * 32;
    const float d = f16_at(meta + blk * 2);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const uint4 raw = __ldg(reinterpret_cast<const uint4*>(qs + 16 * h));
      const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        const int8_t q = int8_t((words[i / 4] >> (8 * (i % 4))) & 0xffu);
        w[16 * h + i] = __fmul_rn(float(q), d);
      }
    }
  } else {
    int q[kChunk];
    nibbles(reinterpret_cast<const uint8_t*>(p.qs) + row * p.qs_row_bytes + chunk * 16, q);
    if constexpr (F == LLK_QUANT_Q4_0) {
      const float d = f16_at(meta + blk * 2);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fmul_rn(__fadd_rn(float(q[i]), -8.f), d);
    } else if constexpr (F == LLK_QUANT_Q4_1) {
      const float d = f16_at(meta + blk * 4), m = f16_at(meta + blk * 4 + 2);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fadd_rn(__fmul_rn(float(q[i]), d), m);
    } else if constexpr (F == LLK_QUANT_Q4_K) {
      const uint8_t* e = meta + blk * 16;
      int sc, mn;
      scale_min_k4(int((first % 256) / 32), e + 4, sc, mn);
      const float d1 = __fmul_rn(f16_at(e), float(sc)), m1 = __fmul_rn(f16_at(e + 2), float(mn));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fadd_rn(__fmul_rn(d1, float(q[i])), -m1);
    } else if constexpr (F == LLK_QUANT_Q6_K) {
      const uint8_t* e = meta + blk * 18;
      const uint2 hi = __ldg(reinterpret_cast<const uint2*>(reinterpret_cast<const uint8_t*>(p.qh) +
                                                           row * p.qh_row_bytes + chunk * 8));
      const uint64_t hbits = (uint64_t(hi.y) << 32) | hi.x;
      const int group = int((first % 256) / 16);  // the chunk's first 16-element scale group
      const float d = f16_at(e + 16);
      const float s0 = __fmul_rn(d, float(int8_t(e[group]))), s1 = __fmul_rn(d, float(int8_t(e[group + 1])));
#pragma unroll
      for (int i = 0; i < kChunk; ++i) {
        const int b = i % 8, shift = 2 * (i / 8);
        const int top = int((hbits >> (8 * b + shift)) & 3u);
        w[i] = __fmul_rn(i < 16 ? s0 : s1, float((q[i] | (top << 4)) - 32));
      }
    } else {  // LLK_QUANT_NF4
      const float absmax = *reinterpret_cast<const float*>(meta + blk * 4);
#pragma unroll
      for (int i = 0; i < kChunk; ++i) w[i] = __fmul_rn(p.code[q[i]], absmax);
    }
  }
}

template <LlkQuantFormat F, class T>
__device__ void qgemv_kernel(const QLinearParams& p) {
  const int lane = int(threadIdx.x % 32);
  const int64_t col = int64_t(blockIdx.x) * kWarps + threadIdx.x / 32;
  if (col >= p.n) return;  // a whole warp leaves together: the shuffles below see full warps
  const int rows = int(p.rows);
  const T* x = reinterpret_cast<const T*>(p.x);
  float acc[kMaxRows];
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) acc[m] = 0.f;
  const int64_t chunks = p.k / kChunk;
  for (int64_t c = lane; c < chunks; c += 32) {
    float w[kChunk];
    dequant_chunk<F>(p, col, c, w);
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
  T* y = reinterpret_cast<T*>(p.y);
#pragma unroll
  for (int m = 0; m < kMaxRows; ++m) {
    if (m >= rows) break;
    const float s = llk::warp_sum(acc[m]);
    if (lane == 0) {
      T* out = y + m * p.y_row_stride + col;
      *out = llk::from_f32<T>(p.accumulate ? __fadd_rn(llk::to_f32(*out), s) : s);
    }
  }
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

// Symbols: qgemv_<format>_<dtype> and qdequant_<format>_<dtype>.
#define QLINEAR_FORMAT(X, fmt, F)                                                                            \
  X(qgemv_##fmt##_f32, QLinearParams, (kWarps * 32), (qgemv_kernel<F, float>))                             \
  X(qgemv_##fmt##_f16, QLinearParams, (kWarps * 32), (qgemv_kernel<F, __half>))                            \
  X(qgemv_##fmt##_bf16, QLinearParams, (kWarps * 32), (qgemv_kernel<F, __nv_bfloat16>))                    \
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

LLK_EXPORT_KERNELS(qlinear, QLINEAR_KERNELS)
