// device_error.cuh -- raising the device-side error flag.
//
// A kernel that finds invalid device-resident input (a page id outside the pool, bad sequence
// offsets, an expert id out of range) ORs an LlkDeviceError bit into the i32 flag its params
// struct points at; the host reads and clears it (Rust: ops::error_flag). Callers raise it from
// one thread per finding, so the atomics stay rare.
#pragma once

#include "llk.cuh"

namespace llk {

__device__ __forceinline__ void raise_device_error(uint64_t flag, LlkDeviceError bits) {
  atomicOr(reinterpret_cast<int*>(flag), int(bits));
}

}  // namespace llk
