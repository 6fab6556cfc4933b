// async_proxy.cuh -- shared memory as sm_90's asynchronous units see it: shared-window
// addresses, fence.proxy.async, and the 1-D bulk copy (cp.async.bulk) from global memory into
// shared memory that completes on an mbarrier (kernels/common/mbarrier.cuh).
//
// The async proxy (bulk and tensor copies, wgmma's shared-memory operands) reaches shared memory
// by another path than ordinary loads and stores. A store followed by an async-proxy read of the
// same bytes needs fence.proxy.async between them (and a barrier when other threads stored);
// the data a bulk copy writes is visible to the threads that waited on its mbarrier.
//
// Three branches: the instruction on sm_90 and later; a trap on older device targets; the
// emulation runtime's model on the host (kernels/emu/emu_async.h, which documents what it models
// and what not).
#pragma once
#include "llk.cuh"

// The emulator names the kernel's source line in its reports: LLK_CALL_SITE ends a parameter
// list with the caller's file and line (LLK_CALL_SITE_ONLY is the whole list), nothing on CUDA.
#if defined(__CUDACC__)
#define LLK_CALL_SITE
#define LLK_CALL_SITE_ONLY
#define LLK_CALL_SITE_ARGS nullptr, 0
#else
#define LLK_CALL_SITE_ONLY const char *call_file = __builtin_FILE(), int call_line = __builtin_LINE()
#define LLK_CALL_SITE , LLK_CALL_SITE_ONLY
#define LLK_CALL_SITE_ARGS call_file, call_line
#endif

namespace llk {

// The shared-window address of a pointer into shared memory.
__device__ __forceinline__ uint32_t smem_address(const void* p) {
#if defined(__CUDA_ARCH__)
  return uint32_t(__cvta_generic_to_shared(p));
#elif !defined(__CUDACC__)
  return llk_emu::shared_address(p);
#else
  return 0;
#endif
}

// fence.proxy.async.shared::cta: this thread's earlier shared-memory stores are visible to later
// async-proxy reads (and async-proxy writes to its later loads).
__device__ __forceinline__ void fence_proxy_async() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::fence_proxy_async();
#endif
}

// cp.async.bulk: `bytes` (a non-zero multiple of 16; both addresses 16-byte aligned) from
// global `src` to shared `dst`, completing `bytes` transactions on the mbarrier `bar`, whose
// phase must expect them (mbarrier_arrive_expect_tx) before the copy completes.
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                                    uint64_t* bar LLK_CALL_SITE) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_address(dst)),
               "l"(src), "r"(bytes), "r"(smem_address(bar))
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::bulk_copy_to_shared(dst, src, bytes, bar, LLK_CALL_SITE_ARGS);
#endif
}

}  // namespace llk
