// fp8.cuh -- e4m3fn (OCP FP8 E4M3, "fn": finite, no infinities) conversions, written out in
// integer arithmetic so that every target (sm_80 without fp8 instructions, the emulator) runs the
// same code.
//
// e4m3fn: 1 sign bit, 4 exponent bits (bias 7), 3 mantissa bits. Normal values 2^(e-7) (1 + m/8)
// for e in 1..15, subnormals m 2^-9; the largest finite value is 448 (0x7e); S.1111.111 (0x7f,
// 0xff) is NaN, the only non-finite code.
//
// Encoding rounds to nearest, ties to even; magnitudes >= 448 (infinity included) saturate to
// +-448; NaN stays NaN (sign kept). The Rust twin is `llama_kernels::dtype::f8e4m3_encode`; the
// test suite compares the two on every code and on a sweep of f32 values.
#pragma once
#include "llk.cuh"

namespace llk {

__device__ __forceinline__ uint32_t e4m3_from_f32(float x) {
  const uint32_t u = __float_as_uint(x);
  const uint32_t sign = (u >> 24) & 0x80u;
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (a >= 0x43e00000u) return sign | 0x7eu;  // >= 448 (and infinity): saturate
  if (a < 0x3c800000u) {
    // Below 2^-6, the subnormal range: m = a / 2^-9 rounded to nearest even, 0..8 (8 is the
    // smallest normal, code 0x08). a * 512 is exact.
    return sign | uint32_t(int(rintf(__uint_as_float(a) * 512.f)));
  }
  // Normal: keep 3 of the 23 mantissa bits, rounding to nearest even; a carry rounds up into the
  // exponent. Exponent rebias 127 -> 7. a < 448 keeps the code <= 0x7e.
  const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u);
  return sign | ((r >> 20) - ((127u - 7u) << 3));
}

__device__ __forceinline__ float e4m3_to_f32(uint32_t code) {
  const uint32_t mag = code & 0x7fu, e = mag >> 3, m = mag & 7u;
  float v;
  if (mag == 0x7fu) {
    v = __uint_as_float(0x7fc00000u);
  } else if (e == 0) {
    v = float(m) * (1.f / 512.f);
  } else {
    v = __uint_as_float(((e + 120u) << 23) | (m << 20));
  }
  return (code & 0x80u) ? -v : v;
}

// Two codes, at bits 0-7 and 16-23 of `x` (other bits zero), to two f16 of value * 2^-8 in one
// register (low half first). Exact: e4m3 shifted into f16's wider exponent field is the same
// number times 2^(7-15), subnormals included; the NaN code becomes an f16 NaN. Callers fold the
// 2^8 into their scale.
__device__ __forceinline__ uint32_t e4m3x2_spread_to_f16x2_lo(uint32_t x) {
  const uint32_t mag = x & 0x007f007fu;
  uint32_t h = (mag << 7) | ((x & 0x00800080u) << 8);
  const uint32_t nan = (mag + 0x00010001u) & 0x00800080u;  // bit 7 (23) set where mag == 0x7f
  return h | (nan * 0xfcu);                                 // exponent 11111: NaN
}

// The factor e4m3x2_spread_to_f16x2_lo leaves out.
constexpr float kFp8Unscale = 256.f;

// Four codes in one word (byte i = code i) to value * 2^-8 as two pairs of T (f16 or bf16):
// lo = codes 0, 1 and hi = codes 2, 3 (the order of a row in memory).
template <class T>
__device__ __forceinline__ void e4m3x4_to_pairs(uint32_t w, uint32_t& lo, uint32_t& hi);
// The same with the pairs taken across: lo = codes 0, 2 and hi = codes 1, 3 (what ldmatrix.trans
// of byte data delivers: two keys' values of two dims).
template <class T>
__device__ __forceinline__ void e4m3x4_to_pairs_across(uint32_t w, uint32_t& lo, uint32_t& hi);

__device__ __forceinline__ uint32_t f16x2_to(uint32_t h, __half) { return h; }
__device__ __forceinline__ uint32_t f16x2_to(uint32_t h, __nv_bfloat16) {
  // f16 -> f32 -> bf16 is exact here: the values have 4 significant bits and lie in
  // [2^-17, 1.75], well inside both ranges.
  const float2 f = unpack2(h, __half());
  return pack2(f.x, f.y, __nv_bfloat16());
}

template <class T>
__device__ __forceinline__ void e4m3x4_to_pairs(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = f16x2_to(e4m3x2_spread_to_f16x2_lo((w & 0xffu) | ((w & 0xff00u) << 8)), T());
  hi = f16x2_to(e4m3x2_spread_to_f16x2_lo(((w >> 16) & 0xffu) | ((w >> 8) & 0x00ff0000u)), T());
}

template <class T>
__device__ __forceinline__ void e4m3x4_to_pairs_across(uint32_t w, uint32_t& lo, uint32_t& hi) {
  lo = f16x2_to(e4m3x2_spread_to_f16x2_lo(w & 0x00ff00ffu), T());
  hi = f16x2_to(e4m3x2_spread_to_f16x2_lo((w >> 8) & 0x00ff00ffu), T());
}

}  // namespace llk
