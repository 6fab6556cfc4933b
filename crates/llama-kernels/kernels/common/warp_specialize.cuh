// warp_specialize.cuh -- what a warp-specialized kernel (producer warps feeding consumer
// warpgroups) coordinates its warps with on sm_90: named barriers over a subset of the block's
// warps, elect.sync, and setmaxnreg to move registers from producers to consumers.
//
// Named barriers 1..15 (0 is __syncthreads'): named_barrier_sync(id, n) waits until n threads
// (whole warps) have arrived at barrier id, named_barrier_arrive(id, n) arrives without waiting,
// so one group of warps can signal another, or two consumer warpgroups take turns (ping-pong).
//
// Three branches, as in mbarrier.cuh: the instruction on sm_90 and later (bar.sync and
// bar.arrive exist since sm_70; elect.sync and setmaxnreg need sm_90, setmaxnreg sm_90a), a trap
// where it does not exist, the emulator's model on the host (kernels/emu/emu_warp_specialize.h).
#pragma once
#include "async_proxy.cuh"

namespace llk {

// bar.sync id, n: waits until n threads (a multiple of 32) have arrived at barrier id.
__device__ __forceinline__ void named_barrier_sync(int id, int n LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory");
#elif !defined(__CUDACC__)
  llk_emu::named_barrier(id, n, true, LLK_CALL_SITE_ARGS);
#endif
}

// bar.arrive id, n: arrives at barrier id (of n threads) without waiting.
__device__ __forceinline__ void named_barrier_arrive(int id, int n LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__)
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory");
#elif !defined(__CUDACC__)
  llk_emu::named_barrier(id, n, false, LLK_CALL_SITE_ARGS);
#endif
}

// elect.sync over the whole warp: true in exactly one lane (the lowest).
__device__ __forceinline__ bool elect_one_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t elected = 0;
  asm volatile("{\n.reg .pred p;\n.reg .b32 lane;\nelect.sync lane|p, 0xffffffff;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(elected));
  return elected != 0;
#elif defined(__CUDA_ARCH__)
  __trap();
  return false;
#elif !defined(__CUDACC__)
  const unsigned voters = __ballot_sync(0xffffffffu, 1);
  return (threadIdx.x & 31) == unsigned(__ffs(int(voters)) - 1);
#else
  return false;
#endif
}

// setmaxnreg.inc / .dec: every thread of the warpgroup asks for COUNT registers (a multiple of 8
// in 24..256): producers give registers back (dec), consumers take them (inc).
template <int COUNT, bool INC>
__device__ __forceinline__ void setmaxnreg(LLK_CALL_SITE_ONLY) {
  static_assert(COUNT >= 24 && COUNT <= 256 && COUNT % 8 == 0, "setmaxnreg: a multiple of 8 in 24..256");
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (INC)
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(COUNT));
  else
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(COUNT));
#elif defined(__CUDA_ARCH__)
  // Without sm_90a the register split is not available; the kernel keeps its launch count.
#elif !defined(__CUDACC__)
  llk_emu::setmaxnreg(COUNT, LLK_CALL_SITE_ARGS);
#endif
}

}  // namespace llk
