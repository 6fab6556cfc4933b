// qmmv.cu -- the tensor-core GEMV of decode over packed weights (kernels qmmv_<format>_<dtype>;
// Q4_0, Q4_1, Q4_K and Q6_K, whose values are small integers with a scale, and a minimum, per 32
// or 16 elements, and NF4, whose values are a 16-entry code book times a block's absmax; bf16 and
// f16 activations). The formats and the chunk reader: common/quant_chunk.cuh; the other packed
// kernels: qlinear.cu.
//
// y (+)= x W^T for 1 to LLK_QMMV_MAX_ROWS rows, by mma.sync m16n8k16 with A = 16 rows of W and
// B = x^T: the activation rows are the MMA's 8 columns, so 1 to 8 rows cost the same.
//
// Precision: it multiplies by the exact dequantized values. The 16-bit operands are the stored
// integers, made exact 16-bit floats by one byte permute into the mantissa of a magic number
// (mmv_pair); each chunk's f32 factors, from the reference's roundings, are applied to the
// chunk's f32 partial sums (its scale; for the 4-bit formats also its minimum, times the chunk's
// activation sum from an mma with A all ones), as llama.cpp's mmvq applies block scales to
// integer dot products. The products are exact; the 4-bit formats' partial sums carry the magic
// number's base (1024 for f16, 128 for bf16) next to values below 16, so they give up about 7
// (f16) or 4 (bf16) of f32's 24 bits to its cancellation.
//
// NF4's values are not integers: its 16-bit operands are the code book's entries rounded to T,
// looked up in registers by byte permutes (nf4_pairs, eight values per word in 21 instructions),
// and the chunk's absmax (f32) multiplies its f32 partial sum. So NF4 on this path multiplies by
// T(code[q]) * absmax: the code book rounded once, not each dequantized value (the other paths
// round code[q] * absmax to T; both are within one rounding of T of the exact weight).
//
// Grid mapping: grid.x walks 16-row tiles of W, grid.z splits of `in` (k_steps_per_split groups
// each; f32 partials and qlinear.cu's reduce kernel, as the GEMM's), and the LLK_QMMV_WARPS warps
// of a block take the split's groups of LLK_QMMV_GROUP chunks in turn. Lane (g, t) loads chunk t
// of the group for rows g and g + 8 (two 16-byte loads: a warp reads 16 rows x 64 contiguous
// bytes), one group ahead. The quad transposes its words through shared memory, so that lane t
// holds word t of every chunk: the k16 slots an MMA fragment gives it are elements 4t..4t+3 of
// each half of a chunk, whose activations are one 8-byte load. Per chunk: 2 mma for the values
// (the low and high nibbles are two k16 steps), 2 for the activation sums (4-bit formats), and 8
// fmas of the factors. The warps' tiles are added in warp order through shared memory, so the
// result does not depend on scheduling.
//
// Bytes: the packed weights once, x once per 16 rows of W (from L1/L2), y once.
#include "common/ptx.cuh"
#include "common/quant_chunk.cuh"

namespace {

using namespace llk::quant;

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
constexpr bool kMmvSum = F != LLK_QUANT_Q6_K && F != LLK_QUANT_NF4;

// The chunk's two f32 factors (a, b), from the reference's roundings: the 4-bit formats' sum is
// a S(base + v) + b S(x); Q6_K's a S_lo(v - 32) + b S_hi(v - 32); NF4's a S(T(code[q])) (b unused).
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
  } else if constexpr (F == LLK_QUANT_Q6_K) {
    float s0, s1;
    q6k_scales(c, s0, s1);
    return make_float2(s0, s1);
  } else {
    static_assert(F == LLK_QUANT_NF4, "the tensor-core GEMV's formats");
    return make_float2(c.absmax, 0.f);
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

// NF4's code book rounded to T, in registers as two byte planes: byte e % 4 of lo[e / 4] is the low
// byte of entry e's bits, of hi[e / 4] the high byte. Empty for the other formats.
template <LlkQuantFormat F>
struct MmvCodeBook {
  uint32_t lo[4], hi[4];
};
template <>
struct MmvCodeBook<LLK_QUANT_Q4_0> {};
template <>
struct MmvCodeBook<LLK_QUANT_Q4_1> {};
template <>
struct MmvCodeBook<LLK_QUANT_Q4_K> {};
template <>
struct MmvCodeBook<LLK_QUANT_Q6_K> {};

template <LlkQuantFormat F, class T>
__device__ __forceinline__ MmvCodeBook<F> mmv_code_book(const QLinearParams& p) {
  MmvCodeBook<F> b{};
  if constexpr (F == LLK_QUANT_NF4) {
#pragma unroll
    for (int e = 0; e < 16; ++e) {
      const T v = llk::from_f32<T>(p.code[e]);
      uint16_t bits;
      memcpy(&bits, static_cast<const void*>(&v), 2);
      b.lo[e / 4] |= uint32_t(bits & 0xffu) << (8 * (e % 4));
      b.hi[e / 4] |= uint32_t(bits >> 8) << (8 * (e % 4));
    }
  }
  return b;
}

// One byte plane's bytes for four nibbles q_n: `m` holds q_n & 7 in nibble n, `pick` holds n + 4
// (q_n >> 3) (entries 0-7 from the first permute, 8-15 from the second). llama.cpp's
// get_int_from_table_16 selects the same way; llk::prmt spares the selector masks of __byte_perm.
__device__ __forceinline__ uint32_t code_bytes(const uint32_t (&plane)[4], uint32_t m, uint32_t pick) {
  return llk::prmt(llk::prmt(plane[0], plane[1], m), llk::prmt(plane[2], plane[3], m), pick);
}

// The T values of the eight nibbles of qs word u (elements 4t..4t+3 of a chunk in the low
// nibbles, 16+4t.. in the high ones, byte by byte), as the MMA's pairs: lo[s] = elements 4t+2s,
// 4t+2s+1 (the low-nibble k16 step), hi[s] = 16 plus those (the high-nibble step).
__device__ __forceinline__ void nf4_pairs(const MmvCodeBook<LLK_QUANT_NF4>& b, uint32_t u, uint32_t (&lo)[2],
                                          uint32_t (&hi)[2]) {
  const uint32_t m = u & 0x77777777u, pick = ((u >> 1) & 0x44444444u) | 0x32103210u;
#pragma unroll
  for (int s = 0; s < 2; ++s) {
    // Nibbles 4s..4s+3: elements 4t+2s, 16+4t+2s, 4t+2s+1, 16+4t+2s+1, in the bytes of l and h.
    const uint32_t ms = m >> (16 * s), ps = pick >> (16 * s);
    const uint32_t l = code_bytes(b.lo, ms, ps), h = code_bytes(b.hi, ms, ps);
    lo[s] = llk::prmt(l, h, 0x6240u), hi[s] = llk::prmt(l, h, 0x7351u);
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
  // A of all ones (the 4-bit formats), through copies ptxas cannot fold: with one register of
  // ones it rebuilt the four-register operand before every mma (9 of 211 slots per group, Q4_1).
  [[maybe_unused]] uint32_t ones_a[4];
  if constexpr (kMmvSum<F>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) ones_a[i] = llk::opaque(llk::pack_pair<T>(1.f, 1.f));
  }
  [[maybe_unused]] const MmvCodeBook<F> book = mmv_code_book<F, T>(p);
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
      uint32_t a_lo[4], a_hi[4];  // the A fragments of the low- and high-nibble k16 steps
      if constexpr (F == LLK_QUANT_NF4) {
        uint32_t lo[2][2], hi[2][2];
#pragma unroll
        for (int h = 0; h < 2; ++h) nf4_pairs(book, j == 0 ? mine[h].x : j == 1 ? mine[h].y : j == 2 ? mine[h].z : mine[h].w, lo[h], hi[h]);
#pragma unroll
        for (int s = 0; s < 2; ++s) a_lo[2 * s] = lo[0][s], a_lo[2 * s + 1] = lo[1][s], a_hi[2 * s] = hi[0][s], a_hi[2 * s + 1] = hi[1][s];
      } else {
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
#pragma unroll
        for (int s = 0; s < 2; ++s) {
          const uint32_t sel = s == 0 ? 0x0504u : 0x0706u;
          a_lo[2 * s] = mmv_pair<F, T>(lo[0], sel), a_lo[2 * s + 1] = mmv_pair<F, T>(lo[1], sel);
          a_hi[2 * s] = mmv_pair<F, T>(hi[0], sel), a_hi[2 * s + 1] = mmv_pair<F, T>(hi[1], sel);
        }
      }
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
        if constexpr (F != LLK_QUANT_NF4) acc[i] = fmaf(i < 2 ? f.y : f.w, s1[i], acc[i]);
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

}  // namespace

// Symbols: qmmv_<format>_<f16|bf16>.
#define QMMV_FORMAT(X, fmt, F)                                                              \
  X(qmmv_##fmt##_f16, QLinearParams, (kMmvWarps * 32), LLK_SMEM_NONE, (qmmv_kernel<F, __half>))          \
  X(qmmv_##fmt##_bf16, QLinearParams, (kMmvWarps * 32), LLK_SMEM_NONE, (qmmv_kernel<F, __nv_bfloat16>))

#define QMMV_KERNELS(X)                 \
  QMMV_FORMAT(X, q4_0, LLK_QUANT_Q4_0)  \
  QMMV_FORMAT(X, q4_1, LLK_QUANT_Q4_1)  \
  QMMV_FORMAT(X, q4_k, LLK_QUANT_Q4_K)  \
  QMMV_FORMAT(X, q6_k, LLK_QUANT_Q6_K)  \
  QMMV_FORMAT(X, nf4, LLK_QUANT_NF4)

LLK_EXPORT_KERNELS(qmmv, QMMV_KERNELS)
