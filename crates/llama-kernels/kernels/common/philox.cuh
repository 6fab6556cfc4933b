// philox.cuh -- Philox-4x32-10, the counter-based generator of Salmon et al., "Parallel random
// numbers: as easy as 1, 2, 3" (SC'11), as Random123 and cuRAND define it.
//
// philox4x32_10(counter, key) is a pure function of a 128-bit counter and a 64-bit key: ten rounds
// of two 32x32 -> 64-bit multiplies, with the key bumped by the Weyl constants between rounds. It
// gives the same four words on every target (the emulated one included), so a draw depends only
// on (key, counter). The Random123 known-answer vectors are checked against the Rust copy of this
// function in src/reference/sampling.rs, and the kernel's through it.
#pragma once

#include "llk.cuh"

namespace llk {

struct Philox4 {
  uint32_t v[4];
};

// High 32 bits of a 32 x 32 product.
__device__ __forceinline__ uint32_t mulhi32(uint32_t a, uint32_t b) {
#ifdef __CUDA_ARCH__
  return __umulhi(a, b);
#else
  return uint32_t((uint64_t(a) * uint64_t(b)) >> 32);
#endif
}

// High 64 bits of a 64 x 64 product: floor(a * b / 2^64).
__device__ __forceinline__ unsigned long long mulhi64(unsigned long long a, unsigned long long b) {
#ifdef __CUDA_ARCH__
  return __umul64hi(a, b);
#else
  return (unsigned long long)(((unsigned __int128)a * b) >> 64);
#endif
}

__device__ __forceinline__ Philox4 philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;  // multipliers
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;  // key bumps (golden ratio, sqrt(3) - 1)
#pragma unroll
  for (int r = 0; r < 10; ++r) {
    if (r > 0) k0 += kW0, k1 += kW1;
    const uint32_t hi0 = mulhi32(kM0, c.v[0]), lo0 = kM0 * c.v[0];
    const uint32_t hi1 = mulhi32(kM1, c.v[2]), lo1 = kM1 * c.v[2];
    c = Philox4{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

}  // namespace llk
