// emu_exports.cc -- the emulator's 16-bit float conversions, exported for tests.
//
// Host-only (compiled by build.rs next to the kernels/*.cu host sources, never by nvcc). The
// kernels convert through the intrinsics of emu_types.h; these batch entry points run exactly
// those intrinsics over arrays so that tests/emu_conversions.rs can compare them with the `half`
// crate on every 16-bit pattern and on millions of floats without a call per value. The pair
// entries go through __floats2half2_rn / __half22float2 and their bf16 twins, the forms llk.cuh
// uses on the 16-byte path, and expose the pair's memory layout (.x in the low 16 bits).
//
// Not part of the crate's ABI (src/ does not declare them): the test declares them itself.
#include <bit>
#include <cstdint>
#include <cstring>

#include "emu_types.h"

// Compile-time spot checks of the cases that are easiest to get wrong (the test covers the rest):
// ties to even, the overflow threshold, gradual underflow, NaN never becoming inf or -0, and
// the arithmetic's single rounding.
namespace {
constexpr uint16_t h(float f) { return llk_emu::f32_to_f16_bits(f); }
constexpr uint16_t b(uint32_t f32_bits) { return llk_emu::f32_to_bf16_bits(std::bit_cast<float>(f32_bits)); }
constexpr float f(uint32_t bits) { return std::bit_cast<float>(bits); }
static_assert(h(1.0f) == 0x3c00 && h(-0.0f) == 0x8000 && h(65504.0f) == 0x7bff);
static_assert(h(f(0x477fefff)) == 0x7bff && h(65520.0f) == 0x7c00 && h(-65520.0f) == 0xfc00);  // overflow
static_assert(h(f(0x7f800000)) == 0x7c00 && h(f(0x7f800001)) == 0x7fff && h(f(0xffc00000)) == 0x7fff);
static_assert(h(0x1p-25f) == 0 && h(f(0x33000001)) == 1 && h(0x1p-24f * 1.5f) == 2 && h(0x1p-24f * 2.5f) == 2);
static_assert(h(f(0x387fffff)) == 0x0400 && h(0x1p-14f) == 0x0400);  // rounding up into the normals
static_assert(h(1.0f + 0x1p-11f) == 0x3c00 && h(1.0f + 0x1p-11f + 0x1p-20f) == 0x3c01);  // ties to even
static_assert(h(1.0f + 3 * 0x1p-11f) == 0x3c02);
static_assert(b(0x3f808000) == 0x3f80 && b(0x3f818000) == 0x3f82 && b(0x3f808001) == 0x3f81);  // ties to even
static_assert(b(0x7f7f7fff) == 0x7f7f && b(0x7f7f8000) == 0x7f80 && b(0xff7f8000) == 0xff80);  // overflow
static_assert(b(0x7fffffff) == 0x7fff && b(0xffffffff) == 0x7fff && b(0x7f800001) == 0x7fff);  // NaN stays NaN
static_assert(b(0x00008000) == 0 && b(0x00018000) == 2 && b(0x80008001) == 0x8001);  // subnormals
static_assert(llk_emu::f16_bits_to_f32(0x0001) == 0x1p-24f && llk_emu::f16_bits_to_f32(0x7bff) == 65504.0f);
static_assert(std::bit_cast<uint32_t>(llk_emu::f16_bits_to_f32(0x8000)) == 0x80000000u);
static_assert(std::bit_cast<uint32_t>(llk_emu::f16_bits_to_f32(0xfc01)) == 0xffc02000u);  // sNaN comes back quiet
static_assert(std::bit_cast<uint32_t>(llk_emu::bf16_bits_to_f32(0x7f81)) == 0x7fc10000u);
constexpr uint16_t hadd(uint16_t x, uint16_t y) {
  return __half_as_ushort(__hadd(__ushort_as_half(x), __ushort_as_half(y)));
}
constexpr uint16_t hmul(uint16_t x, uint16_t y) {
  return __half_as_ushort(__hmul(__ushort_as_half(x), __ushort_as_half(y)));
}
static_assert(hadd(0x3c00, 0x3c00) == 0x4000 && hadd(0x7bff, 0x4c00) == 0x7c00 && hadd(0x7bff, 0x4800) == 0x7bff);
static_assert(hmul(0x0001, 0x3800) == 0 && hmul(0x0003, 0x3800) == 0x0002);
static_assert(__bfloat16_as_ushort(__hadd(__ushort_as_bfloat16(0x3f80), __ushort_as_bfloat16(0x3b80))) == 0x3f80);
static_assert(__bfloat16_as_ushort(__hadd(__ushort_as_bfloat16(0x3f81), __ushort_as_bfloat16(0x3b80))) == 0x3f82);
static_assert(__half_as_ushort(__hneg(__ushort_as_half(0x7fff))) == 0xffff && __hisinf(__ushort_as_half(0xfc00)) == -1);
}  // namespace

extern "C" {

void llk_emu_f32_to_f16_bits(const float* in, uint16_t* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) out[i] = __half_as_ushort(__float2half_rn(in[i]));
}

void llk_emu_f32_to_bf16_bits(const float* in, uint16_t* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) out[i] = __bfloat16_as_ushort(__float2bfloat16_rn(in[i]));
}

void llk_emu_f16_bits_to_f32(const uint16_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) out[i] = __half2float(__ushort_as_half(in[i]));
}

void llk_emu_bf16_bits_to_f32(const uint16_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) out[i] = __bfloat162float(__ushort_as_bfloat16(in[i]));
}

// in[2i], in[2i + 1] -> one 32-bit word (the first value in the low half), n pairs.
void llk_emu_f32x2_to_f16x2_bits(const float* in, uint32_t* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const __half2 h = __floats2half2_rn(in[2 * i], in[2 * i + 1]);
    memcpy(&out[i], &h, 4);
  }
}

void llk_emu_f32x2_to_bf16x2_bits(const float* in, uint32_t* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
    memcpy(&out[i], &h, 4);
  }
}

// One 32-bit word of two 16-bit values -> out[2i] (low half), out[2i + 1] (high half), n words.
void llk_emu_f16x2_bits_to_f32x2(const uint32_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    __half2 h;
    memcpy(static_cast<void*>(&h), &in[i], 4);
    const float2 f = __half22float2(h);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

void llk_emu_bf16x2_bits_to_f32x2(const uint32_t* in, float* out, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    __nv_bfloat162 h;
    memcpy(static_cast<void*>(&h), &in[i], 4);
    const float2 f = __bfloat1622float2(h);
    out[2 * i] = f.x, out[2 * i + 1] = f.y;
  }
}

}  // extern "C"
