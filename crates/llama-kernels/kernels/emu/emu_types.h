// emu_types.h -- CUDA's vector types and 16-bit float types for the host (emulated) build.
//
// The `Emulated` target compiles kernels/*.cu with the host C++ compiler. Those sources use the
// CUDA vector types (uint3, uint4, float2, dim3, ...), the storage types __half and
// __nv_bfloat16 (and their pairs) and the conversion intrinsics between them and float. This
// header provides all of that in plain C++20, so that the emulated target needs no CUDA install
// at all: build.rs gives the host compiler no CUDA include path. It is included by
// kernels/emu/emu_runtime.h; nvcc builds never see it and keep NVIDIA's cuda_fp16.h/cuda_bf16.h.
//
// Written from the definitions, not from NVIDIA's headers:
//   * vector types: the members, sizes and alignments the CUDA C++ Programming Guide documents
//     ("Built-in Vector Types": e.g. float2 8-byte aligned, int4/uint4/float4 16-byte aligned,
//     the 3-wide types aligned like their element), with make_<type>() constructors, and dim3
//     whose unspecified components are 1;
//   * __half is IEEE 754 binary16 (1 sign, 5 exponent bits with bias 15, 10 fraction bits);
//     __nv_bfloat16 is the upper half of an IEEE 754 binary32 (1 sign, 8 exponent bits with bias
//     127, 7 fraction bits). Both are 2-byte trivially copyable storage types; __half2 and
//     __nv_bfloat162 are 4-byte pairs with the .x element in the low 16 bits (lower address).
//
// Conversion semantics (each one checked on every 16-bit pattern and on ~17M floats by
// tests/emu_conversions.rs, against the `half` crate):
//   * 16-bit -> float is exact (both formats are subsets of binary32). A NaN stays a NaN with its
//     sign and payload; a signaling NaN comes back quiet, as IEEE 754 requires of a conversion.
//   * float -> 16-bit (`_rn` and the plain names alike) rounds to nearest, ties to even, with
//     gradual underflow (subnormal results, rounding across the subnormal/normal boundary) and
//     overflow to infinity (a finite value at or past the midpoint between the largest finite
//     value and the next power of two rounds to inf). Every NaN becomes the canonical quiet NaN
//     0x7fff, which is what cvt.rn.f16.f32 / cvt.rn.bf16.f32 produce on the GPU.
//   * Arithmetic (__hadd, __hsub, __hmul and the pair forms) computes in float and rounds once to
//     the 16-bit format. That is correctly rounded: float carries more than 2p + 2 bits for both
//     formats (p = 11 for f16, 8 for bf16), so the double rounding is innocuous.
//
// Deliberately absent: implicit conversions between the 16-bit types and float, and arithmetic
// operators on them. Kernels use the named intrinsics, which behave the same on both targets, so a
// kernel that compiles here also compiles against NVIDIA's headers.
#pragma once

#include <bit>
#include <cstdint>
#include <type_traits>

// ---------------------------------------------------------------------------------- vector types
// One macro per width. Members x, y, z, w; make_<name>(...) builds one. The 3-wide types are
// padded to nothing (alignment of the element), the others are aligned to their size up to 16.
#define LLK_EMU_VEC1(name, T, align)                                          \
  struct alignas(align) name {                                                \
    T x;                                                                      \
  };                                                                          \
  inline constexpr name make_##name(T x) { return name{x}; }
#define LLK_EMU_VEC2(name, T, align)                                          \
  struct alignas(align) name {                                                \
    T x, y;                                                                   \
  };                                                                          \
  inline constexpr name make_##name(T x, T y) { return name{x, y}; }
#define LLK_EMU_VEC3(name, T, align)                                          \
  struct alignas(align) name {                                                \
    T x, y, z;                                                                \
  };                                                                          \
  inline constexpr name make_##name(T x, T y, T z) { return name{x, y, z}; }
#define LLK_EMU_VEC4(name, T, align)                                          \
  struct alignas(align) name {                                                \
    T x, y, z, w;                                                             \
  };                                                                          \
  inline constexpr name make_##name(T x, T y, T z, T w) { return name{x, y, z, w}; }

// (family, element type, alignment of the 1-, 2-, 3- and 4-wide type)
#define LLK_EMU_VEC_FAMILY(stem, T, a1, a2, a3, a4) \
  LLK_EMU_VEC1(stem##1, T, a1)                      \
  LLK_EMU_VEC2(stem##2, T, a2)                      \
  LLK_EMU_VEC3(stem##3, T, a3)                      \
  LLK_EMU_VEC4(stem##4, T, a4)

LLK_EMU_VEC_FAMILY(char, signed char, 1, 2, 1, 4)
LLK_EMU_VEC_FAMILY(uchar, unsigned char, 1, 2, 1, 4)
LLK_EMU_VEC_FAMILY(short, short, 2, 4, 2, 8)
LLK_EMU_VEC_FAMILY(ushort, unsigned short, 2, 4, 2, 8)
LLK_EMU_VEC_FAMILY(int, int, 4, 8, 4, 16)
LLK_EMU_VEC_FAMILY(uint, unsigned int, 4, 8, 4, 16)
LLK_EMU_VEC_FAMILY(long, long, 8, 16, 8, 16)  // LP64: long is 8 bytes
LLK_EMU_VEC_FAMILY(ulong, unsigned long, 8, 16, 8, 16)
LLK_EMU_VEC_FAMILY(longlong, long long, 8, 16, 8, 16)
LLK_EMU_VEC_FAMILY(ulonglong, unsigned long long, 8, 16, 8, 16)
LLK_EMU_VEC_FAMILY(float, float, 4, 8, 4, 16)
LLK_EMU_VEC_FAMILY(double, double, 8, 16, 8, 16)

#undef LLK_EMU_VEC_FAMILY
#undef LLK_EMU_VEC1
#undef LLK_EMU_VEC2
#undef LLK_EMU_VEC3
#undef LLK_EMU_VEC4

static_assert(sizeof(uint3) == 12 && alignof(uint3) == 4, "uint3 layout");
static_assert(sizeof(float2) == 8 && alignof(float2) == 8, "float2 layout");
static_assert(sizeof(int2) == 8 && alignof(int2) == 8, "int2 layout");
static_assert(sizeof(uint4) == 16 && alignof(uint4) == 16, "uint4 layout");
static_assert(sizeof(float4) == 16 && alignof(float4) == 16, "float4 layout");
static_assert(sizeof(int4) == 16 && alignof(int4) == 16, "int4 layout");
static_assert(sizeof(double4) == 32 && alignof(double4) == 16, "double4 layout");
static_assert(sizeof(char3) == 3 && sizeof(short3) == 6, "3-wide types are not padded");
static_assert(std::is_trivially_copyable_v<uint4> && std::is_standard_layout_v<uint4>, "plain data");

// Launch dimensions: components left out are 1. Converts to and from uint3 like CUDA's dim3.
struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int vx = 1, unsigned int vy = 1, unsigned int vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
static_assert(sizeof(dim3) == 12 && std::is_trivially_copyable_v<dim3>, "dim3 layout");

// ---------------------------------------------------------------------------------- 16-bit floats
// The bits are private: kernels go through the intrinsics below (the bit casts included), as the
// CUDA types do not promise a public member either. Default construction leaves the value
// uninitialized, value initialization (`T()`, `T{}`) gives +0.
class __half {
  uint16_t bits_;
 public:
  __half() = default;
};
class __nv_bfloat16 {
  uint16_t bits_;
 public:
  __nv_bfloat16() = default;
};

// Pairs: .x is the low half of the 32-bit word, .y the high half.
struct alignas(4) __half2 {
  __half x, y;
  __half2() = default;
  constexpr __half2(__half lo, __half hi) : x(lo), y(hi) {}
};
struct alignas(4) __nv_bfloat162 {
  __nv_bfloat16 x, y;
  __nv_bfloat162() = default;
  constexpr __nv_bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) : x(lo), y(hi) {}
};

// The other spellings CUDA code uses.
using half = __half;
using half2 = __half2;
using nv_bfloat16 = __nv_bfloat16;
using nv_bfloat162 = __nv_bfloat162;

static_assert(sizeof(__half) == 2 && alignof(__half) == 2, "__half is 2 bytes");
static_assert(sizeof(__nv_bfloat16) == 2 && alignof(__nv_bfloat16) == 2, "__nv_bfloat16 is 2 bytes");
static_assert(sizeof(__half2) == 4 && alignof(__half2) == 4, "__half2 is 4 bytes");
static_assert(sizeof(__nv_bfloat162) == 4 && alignof(__nv_bfloat162) == 4, "__nv_bfloat162 is 4 bytes");
static_assert(std::is_trivially_copyable_v<__half> && std::is_trivially_copyable_v<__nv_bfloat16> &&
                  std::is_trivially_copyable_v<__half2> && std::is_trivially_copyable_v<__nv_bfloat162>,
              "the 16-bit types are memcpy'd and shuffled as raw bits");
static_assert(std::is_trivially_default_constructible_v<__half> &&
                  std::is_trivially_default_constructible_v<__nv_bfloat16>,
              "arrays of them in __shared__ memory need no constructor");

// ---------------------------------------------------------------------------------- bit casts
inline constexpr unsigned short __half_as_ushort(__half h) { return std::bit_cast<unsigned short>(h); }
inline constexpr __half __ushort_as_half(unsigned short u) { return std::bit_cast<__half>(u); }
inline constexpr short __half_as_short(__half h) { return std::bit_cast<short>(h); }
inline constexpr __half __short_as_half(short s) { return std::bit_cast<__half>(s); }
inline constexpr unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return std::bit_cast<unsigned short>(h); }
inline constexpr __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { return std::bit_cast<__nv_bfloat16>(u); }
inline constexpr short __bfloat16_as_short(__nv_bfloat16 h) { return std::bit_cast<short>(h); }
inline constexpr __nv_bfloat16 __short_as_bfloat16(short s) { return std::bit_cast<__nv_bfloat16>(s); }

namespace llk_emu {

inline constexpr uint16_t kCanonicalNan16 = 0x7fff;  // both formats: sign 0, all exponent and fraction bits

// binary32 -> binary16 bits, round to nearest even.
inline constexpr uint16_t f32_to_f16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7fffffffu;  // |f|
  if (a > 0x7f800000u) return kCanonicalNan16;
  // 65520 = 0x477ff000 is the midpoint between the largest finite half 65504 (fraction 0x3ff, odd)
  // and 2^16: it and everything above (inf included) round to inf.
  if (a >= 0x477ff000u) return uint16_t(sign | 0x7c00u);
  if (a >= 0x38800000u) {
    // Normal result (|f| >= 2^-14): rebias the exponent from 127 to 15 and keep the top 10
    // fraction bits; the 13 dropped bits decide the rounding. A carry out of the fraction bumps
    // the exponent, which is the correctly rounded result too.
    uint32_t h = (a >> 13) - ((127u - 15u) << 10);
    const uint32_t rest = a & 0x1fffu, halfway = 0x1000u;
    h += (rest > halfway || (rest == halfway && (h & 1u))) ? 1u : 0u;
    return uint16_t(sign | h);
  }
  // Subnormal or zero result: the answer is round(|f| / 2^-24) units of the smallest subnormal.
  // |f| <= 2^-25 (0x33000000, half a unit; f32 subnormals included) rounds to zero (a tie goes to
  // the even 0).
  if (a <= 0x33000000u) return sign;
  const uint32_t e = a >> 23;                          // 102..112: f is normal in binary32
  const uint32_t sig = (a & 0x7fffffu) | 0x800000u;    // |f| = sig * 2^(e - 150)
  const uint32_t shift = 126u - e;                     // |f| / 2^-24 = sig / 2^shift, shift in 14..24
  uint32_t m = sig >> shift;
  const uint32_t rest = sig & ((1u << shift) - 1u), halfway = 1u << (shift - 1u);
  m += (rest > halfway || (rest == halfway && (m & 1u))) ? 1u : 0u;  // 1024 is the smallest normal
  return uint16_t(sign | m);
}

// binary32 -> bfloat16 bits, round to nearest even. bfloat16 has binary32's exponent, so this is
// rounding away the low 16 bits for every non-NaN input: subnormals stay subnormals, a carry moves
// into the exponent, and a carry out of the largest finite value (0x7f7f) gives inf (0x7f80).
inline constexpr uint16_t f32_to_bf16_bits(float f) {
  const uint32_t u = std::bit_cast<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return kCanonicalNan16;
  const uint32_t keep = u >> 16, rest = u & 0xffffu, halfway = 0x8000u;
  return uint16_t(keep + ((rest > halfway || (rest == halfway && (keep & 1u))) ? 1u : 0u));
}

// binary16 bits -> binary32, exact.
inline constexpr float f16_bits_to_f32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) {
    // inf (m == 0) or NaN: the fraction moves to the top of binary32's; NaNs come back quiet.
    return std::bit_cast<float>(sign | 0x7f800000u | (m << 13) | (m ? 0x00400000u : 0u));
  }
  if (e == 0) {
    // Zero or subnormal: m * 2^-24, exact in binary32 (m < 2^10; the result is normal there).
    const float mag = float(m) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<uint32_t>(mag));
  }
  return std::bit_cast<float>(sign | ((e + (127u - 15u)) << 23) | (m << 13));
}

// bfloat16 bits -> binary32, exact: the bits are binary32's upper half. NaNs come back quiet.
inline constexpr float bf16_bits_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  if ((u & 0x7fffffffu) > 0x7f800000u) u |= 0x00400000u;
  return std::bit_cast<float>(u);
}

}  // namespace llk_emu

// ---------------------------------------------------------------------------------- conversions
inline constexpr __half __float2half_rn(float f) { return __ushort_as_half(llk_emu::f32_to_f16_bits(f)); }
inline constexpr __half __float2half(float f) { return __float2half_rn(f); }
inline constexpr float __half2float(__half h) { return llk_emu::f16_bits_to_f32(__half_as_ushort(h)); }
inline constexpr __nv_bfloat16 __float2bfloat16_rn(float f) {
  return __ushort_as_bfloat16(llk_emu::f32_to_bf16_bits(f));
}
inline constexpr __nv_bfloat16 __float2bfloat16(float f) { return __float2bfloat16_rn(f); }
inline constexpr float __bfloat162float(__nv_bfloat16 b) { return llk_emu::bf16_bits_to_f32(__bfloat16_as_ushort(b)); }

// Pairs from and to floats (a goes to .x, the low half).
inline constexpr __half2 __floats2half2_rn(float a, float b) { return {__float2half_rn(a), __float2half_rn(b)}; }
inline constexpr __half2 __float2half2_rn(float a) { return {__float2half_rn(a), __float2half_rn(a)}; }
inline constexpr __half2 __float22half2_rn(float2 v) { return __floats2half2_rn(v.x, v.y); }
inline constexpr float2 __half22float2(__half2 h) { return {__half2float(h.x), __half2float(h.y)}; }
inline constexpr __nv_bfloat162 __floats2bfloat162_rn(float a, float b) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(b)};
}
inline constexpr __nv_bfloat162 __float2bfloat162_rn(float a) {
  return {__float2bfloat16_rn(a), __float2bfloat16_rn(a)};
}
inline constexpr __nv_bfloat162 __float22bfloat162_rn(float2 v) { return __floats2bfloat162_rn(v.x, v.y); }
inline constexpr float2 __bfloat1622float2(__nv_bfloat162 h) { return {__bfloat162float(h.x), __bfloat162float(h.y)}; }

// Halves of pairs.
inline constexpr float __low2float(__half2 h) { return __half2float(h.x); }
inline constexpr float __high2float(__half2 h) { return __half2float(h.y); }
inline constexpr float __low2float(__nv_bfloat162 h) { return __bfloat162float(h.x); }
inline constexpr float __high2float(__nv_bfloat162 h) { return __bfloat162float(h.y); }
inline constexpr __half __low2half(__half2 h) { return h.x; }
inline constexpr __half __high2half(__half2 h) { return h.y; }
inline constexpr __nv_bfloat16 __low2bfloat16(__nv_bfloat162 h) { return h.x; }
inline constexpr __nv_bfloat16 __high2bfloat16(__nv_bfloat162 h) { return h.y; }
inline constexpr __half2 __halves2half2(__half lo, __half hi) { return {lo, hi}; }
inline constexpr __nv_bfloat162 __halves2bfloat162(__nv_bfloat16 lo, __nv_bfloat16 hi) { return {lo, hi}; }
inline constexpr __half2 __half2half2(__half h) { return {h, h}; }
inline constexpr __nv_bfloat162 __bfloat162bfloat162(__nv_bfloat16 h) { return {h, h}; }

// ---------------------------------------------------------------------------------- arithmetic
// Sign operations touch only the sign bit (IEEE 754 negate/abs), NaNs included.
inline constexpr __half __hneg(__half h) { return __ushort_as_half(__half_as_ushort(h) ^ 0x8000u); }
inline constexpr __half __habs(__half h) { return __ushort_as_half(__half_as_ushort(h) & 0x7fffu); }
inline constexpr __nv_bfloat16 __hneg(__nv_bfloat16 h) {
  return __ushort_as_bfloat16(__bfloat16_as_ushort(h) ^ 0x8000u);
}
inline constexpr __nv_bfloat16 __habs(__nv_bfloat16 h) {
  return __ushort_as_bfloat16(__bfloat16_as_ushort(h) & 0x7fffu);
}

// Correctly rounded +, -, * (see the header comment).
inline constexpr __half __hadd(__half a, __half b) { return __float2half_rn(__half2float(a) + __half2float(b)); }
inline constexpr __half __hsub(__half a, __half b) { return __float2half_rn(__half2float(a) - __half2float(b)); }
inline constexpr __half __hmul(__half a, __half b) { return __float2half_rn(__half2float(a) * __half2float(b)); }
inline constexpr __nv_bfloat16 __hadd(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) + __bfloat162float(b));
}
inline constexpr __nv_bfloat16 __hsub(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) - __bfloat162float(b));
}
inline constexpr __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) {
  return __float2bfloat16_rn(__bfloat162float(a) * __bfloat162float(b));
}
inline constexpr __half2 __hadd2(__half2 a, __half2 b) { return {__hadd(a.x, b.x), __hadd(a.y, b.y)}; }
inline constexpr __half2 __hsub2(__half2 a, __half2 b) { return {__hsub(a.x, b.x), __hsub(a.y, b.y)}; }
inline constexpr __half2 __hmul2(__half2 a, __half2 b) { return {__hmul(a.x, b.x), __hmul(a.y, b.y)}; }
inline constexpr __nv_bfloat162 __hadd2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {__hadd(a.x, b.x), __hadd(a.y, b.y)};
}
inline constexpr __nv_bfloat162 __hsub2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {__hsub(a.x, b.x), __hsub(a.y, b.y)};
}
inline constexpr __nv_bfloat162 __hmul2(__nv_bfloat162 a, __nv_bfloat162 b) {
  return {__hmul(a.x, b.x), __hmul(a.y, b.y)};
}

// Classification. __hisinf follows CUDA: -1 for -inf, 1 for +inf, 0 otherwise.
inline constexpr bool __hisnan(__half h) { return (__half_as_ushort(h) & 0x7fffu) > 0x7c00u; }
inline constexpr bool __hisnan(__nv_bfloat16 h) { return (__bfloat16_as_ushort(h) & 0x7fffu) > 0x7f80u; }
inline constexpr int __hisinf(__half h) {
  const unsigned short u = __half_as_ushort(h);
  return u == 0x7c00u ? 1 : (u == 0xfc00u ? -1 : 0);
}
inline constexpr int __hisinf(__nv_bfloat16 h) {
  const unsigned short u = __bfloat16_as_ushort(h);
  return u == 0x7f80u ? 1 : (u == 0xff80u ? -1 : 0);
}
