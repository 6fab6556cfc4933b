// emu_abi.h -- the C ABI between Rust and the host emulation runtime.
//
// Plain C (no C++), so that bindgen mirrors it into Rust (src/backend/emu_abi.rs) next to
// kernels/params.h. Every emulated kernel is reached through one llk_emu_kernel entry, found by
// the same symbol name that the CUDA target looks up in PTX.
#pragma once
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

// Order in which the fibers (CUDA threads) of a block run between two barriers.
typedef enum LlkEmuSchedule {
  LLK_EMU_FORWARD = 0,  // thread 0, 1, 2, ...
  LLK_EMU_REVERSE = 1,  // last thread first
  LLK_EMU_RANDOM = 2,   // a fresh seeded permutation at every scheduling round
  // One warp at a time: the lowest (or highest) warp with a runnable thread runs until all its
  // threads wait at __syncthreads or exit. Maximizes the skew between warps inside a barrier
  // interval, so a shared-memory stage refilled by one warp while others still read it shows up.
  LLK_EMU_WARP_SERIAL = 3,
  LLK_EMU_WARP_SERIAL_REVERSE = 4,
} LlkEmuSchedule;

// When cp.async copies land. A correct kernel gives the same result under both; comparing them
// exposes a read before cp.async.wait_group (AT_WAIT) and a stage overwritten while another
// warp still reads it (AT_ISSUE).
typedef enum LlkEmuCpAsyncTiming {
  LLK_EMU_CP_ASYNC_AT_WAIT = 0,   // the latest legal moment: cp.async.wait_group
  LLK_EMU_CP_ASYNC_AT_ISSUE = 1,  // the earliest: the cp.async instruction itself
} LlkEmuCpAsyncTiming;

typedef enum LlkEmuStatus {
  LLK_EMU_OK = 0,
  LLK_EMU_BAD_LAUNCH = 1,     // grid/block/shared-memory/params size out of range
  LLK_EMU_DEADLOCK = 2,       // no thread can make progress (e.g. a lane missing from a shuffle)
  LLK_EMU_DIVERGENT_BARRIER = 3,  // threads of one block wait at different __syncthreads
  LLK_EMU_UNSUPPORTED = 4,    // an operation the emulator does not model (partial-mask warp op)
  LLK_EMU_KERNEL_TRAP = 5,    // the kernel called __trap() or failed an emulator check
  LLK_EMU_MEMORY_FAULT = 6,   // the kernel read or wrote outside its buffers (a guard page)
  LLK_EMU_LAUNCH_BOUNDS = 7,  // more threads per block than the kernel's __launch_bounds__
  LLK_EMU_SHARED_MEMORY_LIMIT = 8,  // static + dynamic shared memory over the architecture's limit
  LLK_EMU_MISALIGNED = 9,     // a 16-byte access (cp.async, ldmatrix row, vector) not 16-byte aligned
  LLK_EMU_PARAMS_OVERRUN = 10,  // the kernel read past the end of its params struct (or wrote it)
  LLK_EMU_INDEX_OUT_OF_BOUNDS = 11,  // an index past a fixed-size array (static __shared__, local)
  LLK_EMU_SHARED_MEMORY_DECLARATION = 12,  // a launch's dynamic shared memory is not the kernel's declared size
} LlkEmuStatus;

// How a kernel's dynamic shared memory is sized: declared once, in the kernel's row of its
// family's list (LLK_SMEM_* in kernels/common/llk.cuh). The host reads the declaration from this
// registry and launches with it; the emulator refuses a launch that differs.
typedef enum LlkSmemRule {
  LLK_SMEM_RULE_NONE = 0,       // no dynamic shared memory: launches request 0 bytes
  LLK_SMEM_RULE_FIXED = 1,      // exactly the declared bytes (the kernel's layout)
  LLK_SMEM_RULE_AT_LAUNCH = 2,  // sized by each launch (the emulator's self-test kernels)
} LlkSmemRule;

typedef struct LlkEmuLaunch {
  uint32_t grid[3];
  uint32_t block[3];
  uint64_t dyn_smem_bytes;
  LlkEmuSchedule schedule;
  uint64_t seed;          // for LLK_EMU_RANDOM; each block derives its own stream from it
  uint32_t os_threads;    // blocks run concurrently on this many OS threads (>= 1)
  uint32_t stack_bytes;   // per-fiber stack; 0 selects the default (64 KiB)
  LlkEmuCpAsyncTiming cp_async_timing;
  // The architecture emulated, as compute capability x 10 (90, 80, 86, 89): its per-block shared
  // memory limit applies to static_smem_bytes + dyn_smem_bytes. 0 selects 90.
  uint32_t arch;
  uint32_t static_smem_bytes;  // the kernel's static __shared__ bytes on `arch` (ptxas -v)
} LlkEmuLaunch;

// The emulated target's tensor map (what cp.async.bulk.tensor reads a box of a global tensor
// through): the fields of cuTensorMapEncodeTiled in the emulator's own encoding, in the 128
// bytes of the opaque LlkTensorMap (kernels/params.h) that a CUDA launch fills with the driver's
// encoding. Tile mode only, every element stride 1, no interleave. Written by the Rust side
// (src/launch/tensor_map.rs) after validating it; read by kernels/emu/emu_tma.h, which checks
// the tag and the fields again (a map is kernel input like any other).
#define LLK_EMU_TENSOR_MAP_TAG 0x70616d726f736e74ull  /* "tnsormap" */
typedef struct LlkEmuTensorMap {
  uint64_t tag;             // LLK_EMU_TENSOR_MAP_TAG
  uint64_t global_address;  // the element at coordinates (0, ..., 0); 16-byte aligned
  uint64_t dims[5];         // elements per dimension, dimension 0 innermost (contiguous)
  uint64_t strides[4];      // bytes from one index of dimension i + 1 to the next
  uint32_t box[5];          // the box a copy moves, elements per dimension (1 to 256)
  uint32_t rank;            // 1 to 5; dims, strides and box past it are unused
  uint32_t element_bytes;   // 1, 2, 4 or 8
  uint32_t swizzle_bytes;   // 0 (none), 32, 64 or 128: the shared-memory swizzle span
  uint32_t oob_nan;         // out-of-bounds elements read as 0 (0) or as a NaN pattern (1)
  uint32_t reserved;
} LlkEmuTensorMap;

typedef struct LlkEmuReport {
  LlkEmuStatus status;
  uint64_t threads;       // CUDA threads run
  uint64_t blocks;        // blocks run
  uint64_t switches;      // fiber context switches
  char message[512];      // NUL-terminated description when status != LLK_EMU_OK
} LlkEmuReport;

// One emulated kernel: `launch` runs the whole grid and returns report->status.
typedef LlkEmuStatus (*LlkEmuLaunchFn)(const void* params, const LlkEmuLaunch* cfg, LlkEmuReport* report);

typedef struct LlkEmuKernel {
  const char* name;       // the kernel's symbol, as in the PTX (`rms_norm_vec_bf16`)
  uint64_t params_size;   // sizeof its params struct, checked by Rust at every launch
  LlkEmuLaunchFn launch;
  uint32_t max_threads;   // its __launch_bounds__ (the PTX .maxntid): threads per block at most
  LlkSmemRule smem_rule;  // how its dynamic shared memory is sized
  uint32_t smem_bytes;    // LLK_SMEM_RULE_FIXED: the bytes it declares (0 otherwise)
} LlkEmuKernel;

#ifdef __cplusplus
}
#endif
