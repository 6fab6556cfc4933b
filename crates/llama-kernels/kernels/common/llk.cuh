// llk.cuh -- what every kernel family includes first.
//
// One source, three targets: under nvcc this is plain CUDA (NVIDIA's cuda_fp16.h/cuda_bf16.h);
// under the host C++ compiler it pulls in the emulation runtime (kernels/emu/emu_runtime.h), which
// maps CUDA built-ins onto fibers, and our own vector and 16-bit float types
// (kernels/emu/emu_types.h): the host build needs no CUDA headers.
// It also provides the one export macro that turns a kernel list into
//   * `extern "C" __global__` entries with a single by-value params struct (CUDA, looked up in PTX),
//   * and, on the host, a registry table `llk_emu_kernels_<family>` with the same symbol names.
#pragma once

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>
#else
#include "../emu/emu_types.h"
#include "../emu/emu_runtime.h"
#endif

#include <type_traits>

#include "../params.h"

// ------------------------------------------------------------------------ kernel export
// A family lists its kernels once, as an X-macro of
// (symbol, Params, (launch bounds), shared memory, (impl)):
//
//   #define RMS_NORM_KERNELS(X)
//     X(rms_norm_vec_bf16, RmsNormParams, (1024), LLK_SMEM_NONE, (rms_norm_kernel<__nv_bfloat16, 8, false>)) ...
//   LLK_EXPORT_KERNELS(rms_norm, RMS_NORM_KERNELS)
// (the #define continues over lines ending in a backslash)
//
// `impl` is a __device__ function taking `const Params&`; it is parenthesized so that template
// arguments with commas survive the preprocessor. The shared-memory column declares the
// kernel's dynamic shared memory, the one number its host must get right at launch:
//
//   LLK_SMEM_NONE          none (static __shared__ arrays are ptxas's to count)
//   LLK_SMEM_FIXED(bytes)  exactly `bytes`, a constant expression of the layout the kernel carves
//                          its LLK_DYN_SMEM into (parenthesize it when it has commas)
//   LLK_SMEM_AT_LAUNCH     sized by each launch (the emulator's self-test kernels)
//
// The host build's registry carries the declaration (LlkEmuKernel::smem_rule, smem_bytes): the
// Rust side launches every kernel with it on both targets, and the emulator refuses a launch that
// differs (LLK_EMU_SHARED_MEMORY_DECLARATION) and reports a write past it.
#define LLK_SMEM_NONE (LLK_SMEM_RULE_NONE, 0u)
#define LLK_SMEM_FIXED(bytes) (LLK_SMEM_RULE_FIXED, (bytes))
#define LLK_SMEM_AT_LAUNCH (LLK_SMEM_RULE_AT_LAUNCH, 0u)
#define LLK_SMEM_RULE_OF(rule, bytes) rule
#define LLK_SMEM_BYTES_OF(rule, bytes) (bytes)
// The most dynamic shared memory a block may have on any architecture built for (sm_90).
#define LLK_MAX_DYN_SMEM (227 * 1024)

#ifdef __CUDACC__
#define LLK_KERNEL_ENTRY(name, Params, bounds, smem, impl)                                             \
  extern "C" __global__ void __launch_bounds__ bounds name(const __grid_constant__ Params p) { impl(p); } \
  static_assert(LLK_SMEM_BYTES_OF smem <= LLK_MAX_DYN_SMEM, #name ": declared dynamic shared memory over 227 KiB");
#define LLK_EXPORT_KERNELS(family, LIST) LIST(LLK_KERNEL_ENTRY)
#else
// Host entries have internal linkage: only the registry table, found by name, is exported. An
// entry takes its params by reference to the launch's one read-only copy (which ends at a guard
// page, as __grid_constant__ params are one copy in the constant bank); each row records the
// first launch bound (max threads per block), which the emulator enforces.
#define LLK_FIRST_BOUND(max_threads, ...) (max_threads)
#define LLK_KERNEL_ENTRY(name, Params, bounds, smem, impl)                                        \
  static void name(const Params& p) { impl(p); }                                                   \
  static_assert(LLK_SMEM_BYTES_OF smem <= LLK_MAX_DYN_SMEM, #name ": declared dynamic shared memory over 227 KiB");
#define LLK_EMU_TABLE_ROW(name, Params, bounds, smem, impl)                                                  \
  LlkEmuKernel{#name,                                                                                        \
               sizeof(Params),                                                                               \
               &::llk_emu::launch_entry<Params, name, LLK_FIRST_BOUND bounds, LLK_SMEM_RULE_OF smem,          \
                                        LLK_SMEM_BYTES_OF smem>,                                             \
               LLK_FIRST_BOUND bounds,                                                                       \
               LLK_SMEM_RULE_OF smem,                                                                        \
               LLK_SMEM_BYTES_OF smem},
#define LLK_EXPORT_KERNELS(family, LIST)                                             \
  LIST(LLK_KERNEL_ENTRY)                                                             \
  extern "C" const LlkEmuKernel* llk_emu_kernels_##family(uint64_t* count) {         \
    static const LlkEmuKernel table[] = {LIST(LLK_EMU_TABLE_ROW)};                   \
    *count = sizeof(table) / sizeof(table[0]);                                       \
    return table;                                                                    \
  }
#endif

// Dynamic shared memory as bytes, 128-byte aligned on both targets.
#ifdef __CUDACC__
#define LLK_DYN_SMEM(name)                                            \
  extern __shared__ __align__(128) unsigned char llk_dyn_smem_raw[]; \
  unsigned char* name = llk_dyn_smem_raw
#else
#define LLK_DYN_SMEM(name) unsigned char* name = ::llk_emu::dyn_smem()
#endif

namespace llk {

// ------------------------------------------------------------------------ dtypes
// Kernels compute in f32; storage types convert at load and store, rounding to nearest even.
__device__ __forceinline__ float to_f32(float v) { return v; }
__device__ __forceinline__ float to_f32(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T> __device__ __forceinline__ T from_f32(float v);
template <> __device__ __forceinline__ float from_f32<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_f32<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }

// Elements of T in one 16-byte vector: 4 for f32, 8 for f16 and bf16.
template <class T> inline constexpr int kVec16 = int(16 / sizeof(T));

// ------------------------------------------------------------------------ vector memory access
// Two values <-> one 32-bit word of two 16-bit elements (the low half is the lower index).
__device__ __forceinline__ uint32_t pack2(float a, float b, __half) {
  __half2 h = __floats2half2_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ uint32_t pack2(float a, float b, __nv_bfloat16) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  uint32_t u;
  memcpy(&u, &h, 4);
  return u;
}
__device__ __forceinline__ float2 unpack2(uint32_t u, __half) {
  __half2 h;
  memcpy(static_cast<void*>(&h), &u, 4);
  return __half22float2(h);
}
__device__ __forceinline__ float2 unpack2(uint32_t u, __nv_bfloat16) {
  // bf16 is the top half of an f32: one shift and one mask (the library conversion spends PRMTs).
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// load_f32 through the read-only data cache (LDG.CONSTANT): for data no thread of the kernel
// writes, such as RMSNorm's weight.
template <class T, int N>
__device__ __forceinline__ void load_f32_readonly(const T* p, float (&out)[N]) {
  if constexpr (N * sizeof(T) == 16) {
    const uint4 raw = __ldg(reinterpret_cast<const uint4*>(p));
    const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32(e[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32(__ldg(p + i));
  }
}

// A 128-bit global store. Explicit PTX: NVVM sometimes splits a plain uint4 store into four 32-bit
// stores after instcombine forgets its alignment; the static SASS check catches that. The
// emulator checks the alignment the instruction needs.
__device__ __forceinline__ void store_u4(void* p, uint4 v) {
#ifdef __CUDA_ARCH__
  asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w) : "memory");
#else
  llk_emu::check_align16(p, "16-byte vector store");
  memcpy(p, &v, 16);
#endif
}

// load_f32<T, N>(p, out): N consecutive elements at p, converted to f32. When N * sizeof(T) == 16
// this is a single 128-bit load (LDG.E.128), so p must be 16-byte aligned: callers take this path
// only after the host checked alignment, and fall back to N == 1 otherwise (the emulator checks).
template <class T, int N>
__device__ __forceinline__ void load_f32(const T* p, float (&out)[N]) {
  if constexpr (N * sizeof(T) == 16) {
#ifndef __CUDACC__
    llk_emu::check_align16(p, "16-byte vector load");
#endif
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    if constexpr (sizeof(T) == 4) {
      out[0] = __uint_as_float(raw.x), out[1] = __uint_as_float(raw.y);
      out[2] = __uint_as_float(raw.z), out[3] = __uint_as_float(raw.w);
    } else {
      const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const float2 f = unpack2(w[i], T());
        out[2 * i] = f.x, out[2 * i + 1] = f.y;
      }
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] = to_f32(p[i]);
  }
}

// The store counterpart: one 128-bit store (STG.E.128) on the 16-byte path.
template <class T, int N>
__device__ __forceinline__ void store_f32(T* p, const float (&in)[N]) {
  if constexpr (N * sizeof(T) == 16) {
    uint4 raw;
    if constexpr (sizeof(T) == 4) {
      raw = make_uint4(__float_as_uint(in[0]), __float_as_uint(in[1]), __float_as_uint(in[2]), __float_as_uint(in[3]));
    } else {
      raw = make_uint4(pack2(in[0], in[1], T()), pack2(in[2], in[3], T()), pack2(in[4], in[5], T()),
                       pack2(in[6], in[7], T()));
    }
    store_u4(p, raw);
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) p[i] = from_f32<T>(in[i]);
  }
}

// Rounds each value to T and back, so that f32 math sees exactly what is stored.
template <class T, int N>
__device__ __forceinline__ void round_to(float (&v)[N]) {
#pragma unroll
  for (int i = 0; i < N; ++i) v[i] = to_f32(from_f32<T>(v[i]));
}

// 2^x with the hardware approximation (ex2.approx.ftz: ~2 ulp, denormals flushed; -inf -> 0).
// The emulator uses exp2f, flushing a subnormal input and result to zero as .ftz does (so an input
// of -2^-140 gives exactly 1 and an exponent below -126 gives +0 on both targets).
__device__ __forceinline__ float fast_exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return llk_emu::ftz(exp2f(llk_emu::ftz(x)));
#endif
}

// 1/x with the hardware approximation (rcp.approx.ftz: max error 1 ulp, denormals flushed,
// rcp(+-inf) = +-0). The emulator divides exactly, flushing as .ftz does: a subnormal x gives
// +-inf (1/+-0), and |x| > 2^126 gives +-0.
__device__ __forceinline__ float fast_rcp(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return llk_emu::ftz(1.f / llk_emu::ftz(x));
#endif
}

// prmt.b32 in its default mode (PTX ISA, "prmt"): byte n of the result is byte (s_n & 7) of the
// 8 bytes {b:a} (a holds bytes 0-3), where s_n is nibble n of `s`; when s_n's bit 3 is set, the
// selected byte's sign bit replicated instead. CUDA's __byte_perm masks the selector to its low
// three bits first (an extra LOP3 when the selector is not a constant); this wrapper does not, so
// a caller whose selectors have bit 3 clear pays for the permute alone.
__device__ __forceinline__ uint32_t prmt(uint32_t a, uint32_t b, uint32_t s) {
#ifdef __CUDA_ARCH__
  uint32_t r;
  asm("prmt.b32 %0, %1, %2, %3;" : "=r"(r) : "r"(a), "r"(b), "r"(s));
  return r;
#else
  const uint64_t v = (uint64_t(b) << 32) | a;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) {
    const uint32_t sn = (s >> (4 * n)) & 15u, byte = uint32_t(v >> (8 * (sn & 7u))) & 0xffu;
    r |= (sn & 8u ? (byte & 0x80u ? 0xffu : 0u) : byte) << (8 * n);
  }
  return r;
#endif
}

// The value of `v`, through a copy the compiler cannot see through (no constant folding or
// rematerialization of the result).
__device__ __forceinline__ uint32_t opaque(uint32_t v) {
#ifdef __CUDA_ARCH__
  asm volatile("mov.b32 %0, %1;" : "=r"(v) : "r"(v));
#endif
  return v;
}

// ------------------------------------------------------------------------ reductions
// Sum over aligned groups of `width` lanes (a power of two <= 32): every lane gets its group's sum.
// The butterfly order is fixed, so the result does not depend on scheduling.
__device__ __forceinline__ float group_sum(float v, int width) {
  for (int o = width >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

}  // namespace llk
