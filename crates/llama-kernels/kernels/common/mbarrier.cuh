// mbarrier.cuh -- sm_90's transaction barrier in shared memory (mbarrier), the handshake of a
// producer/consumer pipeline.
//
// A barrier counts arrivals and bytes in phases: mbarrier_init(bar, n) expects n arrivals per
// phase; a producer announces the bytes its copies will deliver (mbarrier_arrive_expect_tx, one
// of the arrivals), the copies complete them (bulk_copy_to_shared); the phase completes when
// every arrival has come and every byte landed, and its parity flips. A consumer waits for the
// phase of parity p (mbarrier_wait(bar, p)), so a ring of stages alternates parities: round r
// of stage s waits for parity r & 1. A stage's "empty" barrier runs the same protocol in the
// other direction (consumers arrive, the producer waits) before the producer refills it.
//
// Three branches, as in async_proxy.cuh: the instruction on sm_90 and later, a trap on older
// device targets, the emulator's model on the host (kernels/emu/emu_async.h).
#pragma once
#include "async_proxy.cuh"

namespace llk {

// mbarrier.init: `bar` (8-byte aligned, shared memory) expects `count` (1 to 2^20-1) arrivals per
// phase. Threads other than the initializing one may use it after fence_mbarrier_init() and a
// barrier.
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t count LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_address(bar)), "r"(count) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::mbarrier_init(bar, count, LLK_CALL_SITE_ARGS);
#endif
}

// fence.mbarrier_init: this thread's mbarrier_init()s are visible to the async proxy (the copies
// that complete on them).
__device__ __forceinline__ void fence_mbarrier_init() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

// mbarrier.arrive: one arrival on the current phase.
__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}\n" ::"r"(smem_address(bar))
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::mbarrier_arrive(bar, 0, LLK_CALL_SITE_ARGS);
#endif
}

// mbarrier.arrive.expect_tx: the current phase also waits for `bytes` of copies; one arrival.
__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("{\n.reg .b64 state;\nmbarrier.arrive.expect_tx.shared::cta.b64 state, [%0], %1;\n}\n" ::"r"(
                   smem_address(bar)),
               "r"(bytes)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::mbarrier_arrive(bar, bytes, LLK_CALL_SITE_ARGS);
#endif
}

// Returns once the phase of parity `parity` has completed (mbarrier.try_wait.parity in a loop);
// the data of the copies that completed on it is then visible to this thread.
__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t addr = smem_address(bar);
  uint32_t done = 0;
  while (!done)
    asm volatile(
        "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(addr), "r"(parity)
        : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::mbarrier_wait_parity(bar, parity, LLK_CALL_SITE_ARGS);
#endif
}

}  // namespace llk
