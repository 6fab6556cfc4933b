// tma.cuh -- sm_90's tensor memory accelerator: one instruction copies a box of a global tensor
// into shared memory, addressed by a tensor map and completed on an mbarrier.
//
// A tensor map (LlkTensorMap, kernels/params.h; made on the host by src/launch/tensor_map.rs)
// describes a tensor of rank 1 to 5 (dimension 0 contiguous, byte strides for the others), the
// box one copy moves, the swizzle the box gets in shared memory, and what elements outside the
// tensor read as (zeros or NaN). tensor_copy_to_shared(dst, map, {c0, c1, ...}, bar) moves the
// box whose first element sits at those (signed) coordinates to `dst` (128-byte aligned; a
// swizzled box at a multiple of its pattern, 8 rows x the span, to get the layout wgmma's
// descriptors assume), densely with dimension 0 innermost, and completes the box's bytes (out of
// bounds included) on `bar`, whose phase must expect them (mbarrier_arrive_expect_tx). The map
// must be in the kernel's __grid_constant__ params (or global memory), never a local copy.
//
// Three branches, as in async_proxy.cuh: the instruction on sm_90 and later, a trap on older
// device targets, the emulator's model on the host (kernels/emu/emu_tma.h, which documents what
// it models and what not).
#pragma once
#include "async_proxy.cuh"

namespace llk {

// prefetch.tensormap: starts fetching a tensor map (generic address of the __grid_constant__
// params' copy) into the cache ahead of its first copy. sm_90 and later; nothing elsewhere (the
// emulator's copies read the map directly).
__device__ __forceinline__ void prefetch_tensormap(const LlkTensorMap& map) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&map)) : "memory");
#else
  (void)map;
#endif
}

template <int Rank>
__device__ __forceinline__ void tensor_copy_to_shared(void* dst, const LlkTensorMap& map, const int32_t (&c)[Rank],
                                                      uint64_t* bar LLK_CALL_SITE) {
  static_assert(Rank >= 1 && Rank <= 5, "tensor copies have rank 1 to 5");
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint64_t m = reinterpret_cast<uint64_t>(&map);
  const uint32_t d = smem_address(dst), b = smem_address(bar);
  if constexpr (Rank == 1)
    asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3}], [%2];\n"
                 ::"r"(d), "l"(m), "r"(b), "r"(c[0]) : "memory");
  else if constexpr (Rank == 2)
    asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n"
                 ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]) : "memory");
  else if constexpr (Rank == 3)
    asm volatile("cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
                 ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]) : "memory");
  else if constexpr (Rank == 4)
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6}], [%2];\n"
                 ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]) : "memory");
  else
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5, %6, %7}], [%2];\n"
                 ::"r"(d), "l"(m), "r"(b), "r"(c[0]), "r"(c[1]), "r"(c[2]), "r"(c[3]), "r"(c[4]) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::tensor_copy_to_shared(dst, &map, Rank, c, bar, LLK_CALL_SITE_ARGS);
#endif
}

}  // namespace llk
