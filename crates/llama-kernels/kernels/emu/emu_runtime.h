// emu_runtime.h -- run CUDA kernels on the CPU, exactly enough to test them.
//
// The `Emulated` target compiles the very same kernels/*.cu sources that nvcc turns into PTX, with
// the host C++ compiler, against this header. It is included by kernels/common/llk.cuh only when
// __CUDACC__ is not defined; kernel code never includes it directly.
//
// Model
//   * Every CUDA thread is a fiber with its own stack. The fibers of one block run on one OS
//     thread, one at a time; blocks are spread over `os_threads` OS threads.
//   * A fiber runs until it reaches a barrier (__syncthreads), a warp operation (shuffle, vote,
//     __syncwarp, mma/ldmatrix emulation) or its end. The scheduler then runs the next fiber. The
//     order of fibers in each round is forward, reverse, a seeded random permutation, or warp by
//     warp (one warp runs until all its threads wait at a barrier: the largest skew between warps
//     a barrier interval allows), so a race gives different results under different schedules.
//     Compare several schedules bit for bit to detect one.
//   * __syncthreads is an exact barrier over the live (not yet exited) threads of the block, as on
//     sm_70 and later. Warp operations are exact rendezvous of the live lanes of the warp.
//   * `__shared__` variables become `thread_local` (block scope implies static), so all fibers of a
//     block share them and blocks on other OS threads have their own copy. Dynamic shared memory
//     is one thread_local buffer, poisoned with 0xFF (a NaN pattern) at the start of every block.
//   * cp.async copies land either at the latest point the PTX ISA allows (cp.async.wait_group),
//     so reading a tile before waiting for it reads poison, or at the earliest (the copy itself),
//     so refilling a stage that another warp still reads corrupts that warp's data.
//
// Failures never abort the process and never hang: a deadlock, a divergent __syncthreads, lanes of
// a warp meeting in different warp operations, an unsupported warp mask, a fiber stack overflow
// (up to twice the stack size past its end), a write past the launch's dynamic shared memory (a
// 1 KiB red zone) or __trap() stop the launch, and the launch returns an LlkEmuStatus with a
// message naming the block, the thread and the source line.
//
// Guards that hold the kernel to what the hardware enforces or leaves undefined:
//   * a block larger than the kernel's __launch_bounds__ (recorded by LLK_EXPORT_KERNELS, the
//     PTX .maxntid) and static + dynamic shared memory over the per-block limit of the emulated
//     architecture (LlkEmuLaunch::arch) are refused before any thread runs;
//   * cp.async 16-byte copies, ldmatrix row addresses and the 16-byte vector loads and stores of
//     llk.cuh (and __ldg of a 16-byte type) check 16-byte alignment, which the GPU requires and
//     x86-64 does not;
//   * the kernel's params struct is one read-only copy that ends exactly at a PROT_NONE page, so
//     a read past its end (or a write to it) stops the launch with a named error;
//   * an index past a fixed-size array (static __shared__ arrays, local arrays) is reported with
//     its source line: build.rs compiles the host code with -fsanitize=bounds, whose handler
//     (kernels/emu/emu_checks.cc) turns the report into a failed launch;
//   * fast_exp2 and fast_rcp (ex2.approx.ftz, rcp.approx.ftz) flush subnormal inputs and results
//     to sign-preserving zero as the hardware does, and the host build never contracts a * b + c
//     into an fma (-ffp-contract=off), so __fmul_rn / __fadd_rn round as written.
//
// Semantics follow the PTX ISA where CUDA leaves freedom: shuffles take b mod 32 and the segment
// rules of shfl.sync (a butterfly may reach an earlier segment); a shuffle from a lane that has
// exited reads all-ones bits (NaN) instead of trapping, as the value is undefined on a GPU;
// blocks start in schedule order (forward, reversed, or a seeded permutation), so a dependence
// between blocks changes the result; ldmatrix reads its rows once for the whole warp.
//
// Limits (documented, not hidden): fast-math intrinsics (__expf, rsqrtf, ...) map to accurate libm
// calls, so compare with the GPU using tolerances, never bit for bit. Fibers are not preempted:
// a spin-wait on another thread's write never ends, and a non-atomic read-modify-write race
// between threads gives the same result under every schedule. Static __shared__ memory is not
// poisoned between blocks, and its bounds are checked on array indexing only (a pointer into a
// static array that walks past its end is not caught). Alignment is checked by the PTX wrappers
// and llk.cuh's vector accesses, not by a kernel's own casts to uint4 or float4. Divergent barriers are told apart by source line only (two calls of
// one helper look alike). Partial-mask warp operations are reported as unsupported. Fibers use
// x86-64 context switching only. wgmma.mma_async and its fence/commit/wait are modelled in
// emu_wgmma.h, mbarriers, 1-D bulk copies and fence.proxy.async in emu_async.h (each with its
// own limits), tensor copies (TMA) in emu_tma.h, named barriers, elect.sync and setmaxnreg in
// emu_warp_specialize.h. Abandoned fibers of a failed
// block do not run their destructors.
#pragma once
#ifdef __CUDACC__
#error "emu_runtime.h is for host (non-nvcc) builds only"
#endif
#if !defined(__x86_64__)
#error "the emulation runtime switches fiber contexts with x86-64 assembly"
#endif

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <thread>
#include <type_traits>
#include <vector>

#include <math.h>
#include <signal.h>
#include <sys/mman.h>

// Vector types, __half and __nv_bfloat16 with their conversions: our own host versions, so the
// emulated target needs no CUDA headers (build.rs gives the host compiler no CUDA include path).
#include "emu_types.h"

#include "emu_abi.h"

// ---------------------------------------------------------------------------------- qualifiers
// Execution-space qualifiers mean nothing on the host: every function is a plain host function.
#define __host__
#define __device__
#define __forceinline__ __inline__ __attribute__((always_inline))
#define __align__(n) __attribute__((aligned(n)))
#undef __shared__
#define __shared__ thread_local  // block scope: implies static; one copy per OS thread (block)
#undef __launch_bounds__
#define __launch_bounds__(...)
#undef __grid_constant__
#define __grid_constant__
#undef __global__
#define __global__
#ifndef __noinline__
#define __noinline__ __attribute__((noinline))
#endif

namespace llk_emu {

inline constexpr size_t kMaxDynSmem = 227 * 1024;  // sm_90 opt-in maximum per block
inline constexpr size_t kDefaultStack = 64 * 1024;
inline constexpr size_t kDynSmemRedZone = 1024;
inline constexpr unsigned char kDynSmemPoison = 0xff;

// Shared memory per block (static + dynamic, with the opt-in attribute) of the architectures the
// emulator can stand for, from the CUDA programming guide's table of compute capabilities;
// 0 for one it does not know. `arch` is the compute capability x 10; 0 means sm_90.
inline constexpr uint64_t smem_per_block_limit(uint32_t arch) {
  switch (arch) {
    case 0:
    case 90: return 227 * 1024;
    case 80: return 163 * 1024;
    case 86:
    case 89: return 99 * 1024;
    default: return 0;
  }
}
static_assert(smem_per_block_limit(90) == kMaxDynSmem, "the dynamic shared memory buffer covers every architecture");

enum FiberState : int { RUNNABLE = 0, WAIT_BLOCK = 1, WAIT_WARP = 2, DONE = 3, FAILED = 4, WAIT_MBARRIER = 5,
                        WAIT_NAMED_BARRIER = 6 };

struct CpCopy {
  void* dst;
  const void* src;
  int bytes;      // bytes copied from src
  int fill;       // bytes written in all (the rest is zero-filled)
  int group;
};

struct Fiber {
  void* sp;
  uint3 tid;
  int lane, warp, state;
  unsigned wseq;                   // warp-op sequence number (double-buffer parity)
  std::vector<CpCopy> cp_pending;  // cp.async copies not yet completed
  int cp_group;                    // index of the group being filled
};

enum WarpOp : int { OP_SHUFFLE = 1, OP_VOTE = 2, OP_SYNCWARP = 3, OP_GATHER = 4 };

struct Warp {
  uint32_t live_mask;
  int live, arrived;
  int op;  // the kind of warp operation the lanes that arrived are waiting in
  uint64_t buf[2][32];
  uint32_t joined[2];  // lanes that took part in the rendezvous using each buffer
  alignas(16) unsigned char big[2][32][64];  // fragment gathers for the mma/ldmatrix emulation
  float scratch[2][128];  // a warp-wide result computed once per gather (mma emulation)
  unsigned scratch_tag[2];  // which gather (sequence number + 1) scratch[par] belongs to
};

struct Worker {
  std::vector<Fiber> fibers;
  std::vector<Warp> warps;
  std::vector<int> order;
  char* stacks = nullptr;
  size_t nstacks = 0, slot = 0;
  void* sched_sp = nullptr;
  Fiber* cur = nullptr;
  int nthreads = 0, nlive = 0, block_arrived = 0, bar_line = 0;
  const char* bar_file = nullptr;
  void (*body)(void*) = nullptr;
  void* body_ctx = nullptr;
  uint64_t switches = 0;
  std::mt19937_64 rng;
  LlkEmuCpAsyncTiming cp_async_timing = LLK_EMU_CP_ASYNC_AT_WAIT;
  volatile bool in_fiber = false;    // a fiber (kernel code) is running on this OS thread
  // The launch's params copy (read-only) and the PROT_NONE page right after it, for the fault
  // handler: [params_lo, params_end) is the data pages, [params_end, + 4096) the guard.
  uintptr_t params_lo = 0, params_end = 0;
  size_t params_bytes = 0;
  LlkEmuStatus status = LLK_EMU_OK;  // first failure seen in the current block
  char message[500] = {0};

  ~Worker() { unmap_stacks(); }
  void unmap_stacks() {
    if (stacks) munmap(stacks - kGuard, kGuard + nstacks * slot);
    stacks = nullptr;
  }
  // All fiber stacks of this OS thread in one mapping: two kernel VMAs per OS thread, whatever
  // the block size (a guard page per fiber would cost ~2 VMAs per fiber and run into
  // vm.max_map_count on many-core machines). Each slot is a usable stack of `stack_bytes` above
  // twice as much slack (reserved, never committed unless touched): an overflow lands in the
  // slack, not in a neighbour's stack, and is reported when the fiber yields or exits (the
  // canary at the bottom of the usable stack was written, or the saved stack pointer is below
  // it). A guard page sits below the lowest slot.
  static constexpr size_t kGuard = 4096;
  static constexpr uint64_t kCanary = 0x5a17ca9a5a17ca9aull;
  static constexpr size_t kCanaryWords = 16;
  size_t usable = 0;  // bytes of each slot's usable stack (its top)
  bool ensure_stacks(size_t n, size_t stack_bytes) {
    const size_t want_usable = (stack_bytes + 4095) & ~size_t(4095);
    const size_t want_slot = 3 * want_usable;
    usable = want_usable;
    if (stacks && n <= nstacks && want_slot == slot) return true;
    unmap_stacks();
    void* m = mmap(nullptr, kGuard + n * want_slot, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return false;
    if (mprotect(m, kGuard, PROT_NONE) != 0) {
      munmap(m, kGuard + n * want_slot);
      return false;
    }
    stacks = static_cast<char*>(m) + kGuard;
    slot = want_slot;
    nstacks = n;
    return true;
  }
  char* usable_bottom(size_t i) { return stacks + (i + 1) * slot - usable; }
  uint64_t* canary(size_t i) { return reinterpret_cast<uint64_t*>(usable_bottom(i)); }
  void arm_canary(size_t i) {
    for (size_t k = 0; k < kCanaryWords; ++k) canary(i)[k] = kCanary;
  }
  bool canary_intact(size_t i) {
    for (size_t k = 0; k < kCanaryWords; ++k)
      if (canary(i)[k] != kCanary) return false;
    return true;
  }
};

// The worker of the OS thread that is running a block (null outside a launch).
inline thread_local Worker* tl_worker = nullptr;
inline Worker& worker_of_this_thread() {
  static thread_local Worker w;  // keeps fiber stacks across launches
  return w;
}

// Dynamic shared memory: one buffer per OS thread, reused by every block it runs.
inline unsigned char* dyn_smem() {
  alignas(128) static thread_local unsigned char buf[kMaxDynSmem];
  return buf;
}

// The params struct of a launch, as every thread of the grid sees it: one copy placed so that it
// ends exactly where a PROT_NONE page begins, and read-only while the grid runs (a
// __grid_constant__ parameter cannot be written). A kernel that reads past the end of its params
// faults on the guard page and the launch reports it (on a GPU it would read whatever follows in
// the parameter bank). One mapping per launching OS thread, kept across launches.
struct ParamsPage {
  static constexpr size_t kPage = 4096;
  unsigned char* base = nullptr;  // `data` bytes of data pages, then one guard page
  size_t data = 0;
  ParamsPage() = default;
  ParamsPage(const ParamsPage&) = delete;
  ParamsPage& operator=(const ParamsPage&) = delete;
  ~ParamsPage() {
    if (base) munmap(base, data + kPage);
  }
  // Copies `bytes` of params to the end of the data pages; returns the copy, or null when the
  // mapping could not be made.
  const void* place(const void* params, size_t bytes) {
    const size_t want = std::max<size_t>(kPage, (bytes + kPage - 1) / kPage * kPage);
    if (base == nullptr || want != data) {
      if (base) munmap(base, data + kPage);
      base = nullptr;
      void* m = mmap(nullptr, want + kPage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (m == MAP_FAILED) return nullptr;
      base = static_cast<unsigned char*>(m);
      data = want;
      if (mprotect(base + data, kPage, PROT_NONE) != 0) return nullptr;
    } else if (mprotect(base, data, PROT_READ | PROT_WRITE) != 0) {
      return nullptr;
    }
    // sizeof(P) is a multiple of alignof(P), and the end is page-aligned: the copy is aligned.
    unsigned char* dst = base + data - bytes;
    memcpy(dst, params, bytes);
    if (mprotect(base, data, PROT_READ) != 0) return nullptr;
    return dst;
  }
  uintptr_t end() const { return reinterpret_cast<uintptr_t>(base) + data; }
};
inline ParamsPage& params_page_of_this_thread() {
  static thread_local ParamsPage page;
  return page;
}

}  // namespace llk_emu

// ------------------------------------------------------------------------------ built-ins
inline thread_local uint3 threadIdx;
inline thread_local uint3 blockIdx;
inline thread_local dim3 blockDim;
inline thread_local dim3 gridDim;
static constexpr int warpSize = 32;

// ------------------------------------------------------------------------------ context switch
// x86-64 SysV: push the callee-saved registers on the old stack, store rsp, load the new rsp, pop.
// No signal mask and no floating-point environment are saved: fibers share both.
extern "C" void llk_emu_swap_ctx(void** save_sp, void* new_sp);
asm(R"(
  .pushsection .text.llk_emu_swap_ctx,"axG",@progbits,llk_emu_swap_ctx,comdat
  .weak llk_emu_swap_ctx
  .type llk_emu_swap_ctx,@function
llk_emu_swap_ctx:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size llk_emu_swap_ctx, .-llk_emu_swap_ctx
  .popsection
)");

namespace llk_emu {

inline void switch_to(Worker* w, Fiber* f) {
  threadIdx = f->tid;
  w->cur = f;
  w->switches += 2;
  w->in_fiber = true;
  llk_emu_swap_ctx(&w->sched_sp, f->sp);
  w->in_fiber = false;
}

// ---------------------------------------------------------------------------- memory faults
// Every emulated allocation has a PROT_NONE guard page on each side (src/tensor/storage.rs), and
// the fiber stacks have one below them. A kernel that reads or writes outside its buffers raises
// SIGSEGV there. The handler turns that into a failed launch instead of a dead process: it
// records the fault address, marks the faulting fiber FAILED and switches straight back to the
// scheduler, never returning into the faulting instruction (as siglongjmp would; SA_NODEFER
// keeps SIGSEGV unblocked afterwards). Faults outside kernel code go to the previous handler
// (Rust's stack-overflow handler, or the default action). The handler runs on an alternate
// signal stack, so that a fiber stack overflow into the guard page is reported too.
inline struct sigaction g_prev_segv;
inline std::once_flag g_segv_once;

inline void on_segv(int sig, siginfo_t* info, void* uctx) {
  Worker* w = tl_worker;
  if (w != nullptr && w->cur != nullptr && w->in_fiber) {
    Fiber* f = w->cur;
    const uintptr_t addr = reinterpret_cast<uintptr_t>(info->si_addr);
    const uintptr_t stacks = reinterpret_cast<uintptr_t>(w->stacks);
    const bool stack = w->stacks != nullptr && addr + Worker::kGuard >= stacks && addr < stacks + w->nstacks * w->slot;
    const bool params_guard = w->params_end != 0 && addr >= w->params_end && addr < w->params_end + ParamsPage::kPage;
    const bool params_write = w->params_end != 0 && addr >= w->params_lo && addr < w->params_end;
    if (w->status == LLK_EMU_OK && (params_guard || params_write)) {
      w->status = LLK_EMU_PARAMS_OVERRUN;
      if (params_guard) {
        snprintf(w->message, sizeof w->message,
                 "read past the end of the kernel's %zu-byte params struct (byte %zu of it) in block (%u,%u,%u), "
                 "thread (%u,%u,%u)",
                 w->params_bytes, size_t(addr - (w->params_end - w->params_bytes)), blockIdx.x, blockIdx.y,
                 blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
      } else {
        snprintf(w->message, sizeof w->message,
                 "write to the kernel's params struct (read-only: __grid_constant__) in block (%u,%u,%u), "
                 "thread (%u,%u,%u)",
                 blockIdx.x, blockIdx.y, blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
      }
    } else if (w->status == LLK_EMU_OK) {
      w->status = stack ? LLK_EMU_KERNEL_TRAP : LLK_EMU_MEMORY_FAULT;
      // A general-protection fault (si_code SI_KERNEL) carries no address: on x86-64 it comes from
      // a misaligned 16-byte SSE access (say, a float4 store to a __shared__ array that is not
      // __align__(16)) or a non-canonical pointer. Say so rather than report address 0.
      const bool gp = !stack && addr == 0 && info->si_code == SI_KERNEL;
      // Async-signal-safe enough: snprintf of integers into a preallocated buffer, no allocation.
      if (gp) {
        snprintf(w->message, sizeof w->message,
                 "invalid memory access: general-protection fault (misaligned 16-byte vector access or "
                 "non-canonical pointer; no fault address) in block (%u,%u,%u), thread (%u,%u,%u)",
                 blockIdx.x, blockIdx.y, blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
      } else {
        snprintf(w->message, sizeof w->message,
                 stack ? "fiber stack overflow (fault address 0x%lx) in block (%u,%u,%u), thread (%u,%u,%u): "
                         "raise EmuOptions::stack_bytes"
                       : "invalid memory access, fault address 0x%lx, in block (%u,%u,%u), thread (%u,%u,%u)",
                 static_cast<unsigned long>(addr), blockIdx.x, blockIdx.y, blockIdx.z, f->tid.x, f->tid.y, f->tid.z);
      }
    }
    f->state = FAILED;
    w->in_fiber = false;
    llk_emu_swap_ctx(&f->sp, w->sched_sp);  // never returns: the fiber is abandoned
  }
  if (g_prev_segv.sa_flags & SA_SIGINFO) {
    if (g_prev_segv.sa_sigaction != nullptr) g_prev_segv.sa_sigaction(sig, info, uctx);
    return;
  }
  if (g_prev_segv.sa_handler == SIG_DFL || g_prev_segv.sa_handler == SIG_IGN) {
    sigaction(SIGSEGV, &g_prev_segv, nullptr);  // the fault repeats with the default action
    return;
  }
  g_prev_segv.sa_handler(sig);
}

inline void install_fault_handler() {
  std::call_once(g_segv_once, [] {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_NODEFER;
    sigaction(SIGSEGV, &sa, &g_prev_segv);
  });
}

// An alternate signal stack for the OS thread running blocks, unless it has one (Rust threads
// do). Removed again when the launch is over.
struct AltStack {
  void* mem = nullptr;
  static constexpr size_t kBytes = 64 * 1024;
  AltStack() {
    stack_t old;
    if (sigaltstack(nullptr, &old) == 0 && !(old.ss_flags & SS_DISABLE)) return;
    mem = mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
      mem = nullptr;
      return;
    }
    stack_t ss;
    ss.ss_sp = mem;
    ss.ss_size = kBytes;
    ss.ss_flags = 0;
    if (sigaltstack(&ss, nullptr) != 0) {
      munmap(mem, kBytes);
      mem = nullptr;
    }
  }
  ~AltStack() {
    if (!mem) return;
    stack_t ss;
    memset(&ss, 0, sizeof ss);
    ss.ss_flags = SS_DISABLE;
    sigaltstack(&ss, nullptr);
    munmap(mem, kBytes);
  }
};
inline void yield_to_scheduler(Worker* w, Fiber* f) { llk_emu_swap_ctx(&f->sp, w->sched_sp); }

// Stop this fiber for good and make the launch fail with `status`. Never returns.
[[noreturn]] inline void fail(LlkEmuStatus status, const char* what, const char* file = nullptr, int line = 0) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  if (w->status == LLK_EMU_OK) {
    w->status = status;
    char where[160] = "";
    if (file) snprintf(where, sizeof where, ", at %s:%d", file, line);
    snprintf(w->message, sizeof w->message, "%s (block (%u,%u,%u), thread (%u,%u,%u)%s)", what, blockIdx.x,
             blockIdx.y, blockIdx.z, f->tid.x, f->tid.y, f->tid.z, where);
  }
  f->state = FAILED;
  yield_to_scheduler(w, f);
  __builtin_unreachable();
}

// The 16-byte alignment the GPU requires of cp.async copies, ldmatrix rows and 128-bit vector
// accesses (a misaligned one is a fault there; x86-64 would just run it). `what` names the access.
[[noreturn, gnu::cold, gnu::noinline]] inline void misaligned(const char* what, const void* p) {
  char msg[200];
  snprintf(msg, sizeof msg, "misaligned %s: address 0x%lx is not 16-byte aligned", what,
           static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  fail(LLK_EMU_MISALIGNED, msg);
}
inline void check_align16(const void* p, const char* what) {
  if (reinterpret_cast<uintptr_t>(p) & 15u) [[unlikely]]
    misaligned(what, p);
}

// ftz: a subnormal becomes a zero of the same sign, as .ftz instructions treat inputs and results.
inline float ftz(float x) {
  uint32_t b;
  memcpy(&b, &x, 4);
  if ((b & 0x7f800000u) == 0) b &= 0x80000000u;
  memcpy(&x, &b, 4);
  return x;
}

inline void release_block(Worker* w) {
  for (auto& f : w->fibers)
    if (f.state == WAIT_BLOCK) f.state = RUNNABLE;
  w->block_arrived = 0;
}
inline void release_warp(Worker* w, int wi) {
  for (int l = 0; l < 32; ++l) {
    int t = wi * 32 + l;
    if (t < w->nthreads && w->fibers[t].state == WAIT_WARP) w->fibers[t].state = RUNNABLE;
  }
  w->warps[wi].arrived = 0;
}

// The threads of warpgroup `wg` (four warps) waiting at a warpgroup-wide instruction run again.
inline void release_warpgroup(Worker* w, int wg) {
  for (int k = 0; k < 128; ++k) {
    Fiber& o = w->fibers[size_t(128 * wg + k)];
    if (o.state == WAIT_WARP) o.state = RUNNABLE;
  }
}

// __syncthreads(): every live thread of the block must arrive at the same call site.
inline void block_barrier(const char* file, int line) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  if (w->block_arrived == 0) {
    w->bar_file = file;
    w->bar_line = line;
  } else if (line != w->bar_line || strcmp(file, w->bar_file) != 0) {
    char msg[300];
    snprintf(msg, sizeof msg, "divergent __syncthreads: threads wait at %s:%d and at %s:%d", w->bar_file,
             w->bar_line, file, line);
    fail(LLK_EMU_DIVERGENT_BARRIER, msg);
  }
  f->state = WAIT_BLOCK;
  if (++w->block_arrived == w->nlive) release_block(w);
  yield_to_scheduler(w, f);
}

// Rendezvous of the live lanes of a warp (shuffles, votes, __syncwarp, fragment gathers). All
// lanes must be in the same kind of operation (a shuffle meeting a vote is undefined on a GPU).
inline void warp_rendezvous(Worker* w, Fiber* f, unsigned mask, WarpOp op) {
  Warp& wp = w->warps[f->warp];
  if ((mask & wp.live_mask) != wp.live_mask)
    fail(LLK_EMU_UNSUPPORTED, "warp operation with a mask that leaves out live lanes (partial masks are not emulated)");
  if (wp.arrived == 0) {
    wp.op = op;
  } else if (wp.op != op) {
    fail(LLK_EMU_KERNEL_TRAP, "lanes of one warp meet in different warp operations (e.g. a shuffle and a vote)");
  }
  f->state = WAIT_WARP;
  if (++wp.arrived == wp.live) release_warp(w, f->warp);
  yield_to_scheduler(w, f);
}

// Shuffle source lane, following the PTX ISA's shfl.sync pseudocode for a CUDA `width`
// (segment mask 32 - width): b is taken mod 32; the source must lie in [minLane, maxLane] of the
// caller's segment for up/down/idx, and at or below maxLane for bfly (so a butterfly may reach an
// earlier segment); otherwise the lane reads its own value.
enum class ShflMode { Idx, Up, Down, Bfly };
inline int shfl_source(ShflMode mode, int lane, int b, int width) {
  const int seg = 32 - width;  // segmask
  const int min_lane = lane & seg, max_lane = (lane & seg) | (31 & ~seg);
  b &= 31;
  int j = lane;
  bool ok = false;
  switch (mode) {
    case ShflMode::Idx: j = min_lane | (b & ~seg); ok = j <= max_lane; break;
    case ShflMode::Up: j = lane - b; ok = j >= min_lane; break;
    case ShflMode::Down: j = lane + b; ok = j <= max_lane; break;
    case ShflMode::Bfly: j = lane ^ b; ok = j <= max_lane; break;
  }
  return ok ? j : lane;
}

template <class T>
inline T warp_exchange(unsigned mask, T v, ShflMode mode, int b, int width) {
  static_assert(sizeof(T) <= 8 && std::is_trivially_copyable_v<T>, "shuffled values are at most 8 bytes");
  if (width < 1 || width > 32 || (width & (width - 1)) != 0)
    fail(LLK_EMU_KERNEL_TRAP, "shuffle width must be a power of two from 1 to 32");
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  Warp& wp = w->warps[f->warp];
  int par = f->wseq++ & 1;  // double buffer: no lane can get two rendezvous ahead of another
  uint64_t raw = 0;
  memcpy(&raw, &v, sizeof(T));
  wp.buf[par][f->lane] = raw;
  if (wp.arrived == 0) wp.joined[par] = 0;  // first lane of a new rendezvous on this buffer
  wp.joined[par] |= 1u << f->lane;
  warp_rendezvous(w, f, mask, OP_SHUFFLE);
  // The source may exit after the exchange (its value stays valid). A lane that had already
  // exited (or never existed, in a partial last warp) gives an undefined value on a GPU: here
  // all-ones bits (NaN for floats), so using it shows up instead of passing by luck.
  const int src = shfl_source(mode, f->lane, b, width);
  if (!(wp.joined[par] >> src & 1u)) raw = ~uint64_t(0);
  else raw = wp.buf[par][src];
  T r;
  memcpy(&r, &raw, sizeof(T));
  return r;
}

inline uint32_t warp_vote(unsigned mask, bool pred) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  Warp& wp = w->warps[f->warp];
  int par = f->wseq++ & 1;
  wp.buf[par][f->lane] = pred;
  if (wp.arrived == 0) wp.joined[par] = 0;
  wp.joined[par] |= 1u << f->lane;
  warp_rendezvous(w, f, mask, OP_VOTE);
  uint32_t b = 0;
  for (int l = 0; l < 32; ++l)  // lanes that voted, even if they have exited since
    if ((wp.joined[par] >> l & 1u) && wp.buf[par][l]) b |= 1u << l;
  return b & mask;
}

// Gathers `bytes` (<= 64) from every lane of the warp. Returns the [32][64] table, valid until the
// caller's next warp operation. Used to emulate warp-collective PTX (mma.sync, ldmatrix).
inline const unsigned char* warp_gather(const void* mine, size_t bytes) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  Warp& wp = w->warps[f->warp];
  if (wp.live != 32) fail(LLK_EMU_KERNEL_TRAP, "warp-collective matrix instruction executed by a partial warp");
  int par = f->wseq++ & 1;
  memcpy(wp.big[par][f->lane], mine, bytes);
  warp_rendezvous(w, f, 0xffffffffu, OP_GATHER);
  return &wp.big[par][0][0];
}
inline int lane_id() { return tl_worker->cur->lane; }

// After warp_gather: a per-warp scratch area for a result that depends only on the gathered
// data, and whether the calling lane is the first of its warp to get here for this gather (and
// so must fill it). The parity and sequence number are those of the caller's last gather.
inline float* warp_scratch() {
  Fiber* f = tl_worker->cur;
  return tl_worker->warps[f->warp].scratch[(f->wseq - 1) & 1];
}
inline bool warp_scratch_first() {
  Fiber* f = tl_worker->cur;
  Warp& wp = tl_worker->warps[f->warp];
  const int par = (f->wseq - 1) & 1;
  if (wp.scratch_tag[par] == f->wseq) return false;
  wp.scratch_tag[par] = f->wseq;
  return true;
}

// cp.async: `src_bytes` of `bytes` are read from global memory, the rest zero-filled, when the
// group completes (AT_WAIT) or at once (AT_ISSUE).
inline void cp_async_enqueue(void* dst, const void* src, int bytes, int src_bytes) {
  Worker* w = tl_worker;
  if (bytes == 16) {  // cp.async.cg: both addresses aligned to the copy size
    check_align16(dst, "cp.async destination (shared)");
    check_align16(src, "cp.async source (global)");
  }
  if (w->cp_async_timing == LLK_EMU_CP_ASYNC_AT_ISSUE) {
    if (src_bytes > 0) memcpy(dst, src, size_t(src_bytes));
    if (bytes > src_bytes) memset(static_cast<char*>(dst) + src_bytes, 0, size_t(bytes - src_bytes));
    return;
  }
  Fiber* f = w->cur;
  f->cp_pending.push_back({dst, src, src_bytes, bytes, f->cp_group});
}
inline void cp_async_commit() { tl_worker->cur->cp_group++; }
inline void cp_async_wait(int n) {  // complete every committed group except the newest n
  Fiber* f = tl_worker->cur;
  int limit = f->cp_group - n;
  auto& q = f->cp_pending;
  size_t k = 0;
  for (auto& c : q) {
    if (c.group < limit) {
      if (c.bytes > 0) memcpy(c.dst, c.src, size_t(c.bytes));
      if (c.fill > c.bytes) memset(static_cast<char*>(c.dst) + c.bytes, 0, size_t(c.fill - c.bytes));
    } else {
      q[k++] = c;
    }
  }
  q.resize(k);
}

}  // namespace llk_emu

#include "emu_async.h"
#include "emu_tma.h"
#include "emu_warp_specialize.h"
#include "emu_wgmma.h"

namespace llk_emu {

[[noreturn]] inline void fiber_exit() {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  wgmma_thread_exit(w, f);
  f->state = DONE;
  --w->nlive;
  Warp& wp = w->warps[f->warp];
  wp.live_mask &= ~(1u << f->lane);
  --wp.live;
  if (w->block_arrived > 0 && w->block_arrived == w->nlive) release_block(w);
  if (wp.arrived > 0 && wp.arrived == wp.live) release_warp(w, f->warp);
  warp_specialize_thread_exit(f);
  yield_to_scheduler(w, f);
  __builtin_unreachable();
}

extern "C" inline void llk_emu_fiber_entry() {
  Worker* w = tl_worker;
  w->body(w->body_ctx);
  fiber_exit();
}

// Runs one block to completion. Returns false (with w->status/message set) on failure.
inline bool run_block(Worker* w, const LlkEmuLaunch& cfg, uint3 bid) {
  blockIdx = bid;
  gridDim = dim3(cfg.grid[0], cfg.grid[1], cfg.grid[2]);
  blockDim = dim3(cfg.block[0], cfg.block[1], cfg.block[2]);
  const int n = int(cfg.block[0] * cfg.block[1] * cfg.block[2]);
  w->nthreads = w->nlive = n;
  w->block_arrived = 0;
  w->status = LLK_EMU_OK;
  w->message[0] = 0;
  if (!w->ensure_stacks(size_t(n), cfg.stack_bytes ? cfg.stack_bytes : kDefaultStack)) {
    w->status = LLK_EMU_BAD_LAUNCH;
    snprintf(w->message, sizeof w->message, "could not map %d fiber stacks", n);
    return false;
  }
  // A red zone past the launch's dynamic shared memory: a kernel that writes there is reported.
  if (cfg.dyn_smem_bytes + kDynSmemRedZone <= kMaxDynSmem)
    memset(dyn_smem() + cfg.dyn_smem_bytes, kDynSmemPoison, kDynSmemRedZone);
  w->fibers.resize(size_t(n));
  wgmma_block_start(n, cfg.dyn_smem_bytes);
  async_block_start(n, cfg.dyn_smem_bytes, 0xff);
  warp_specialize_block_start(n);
  const int nw = (n + 31) / 32;
  w->warps.resize(size_t(nw));
  for (int i = 0; i < nw; ++i) {
    int lanes = std::min(32, n - 32 * i);
    w->warps[i].arrived = 0;
    w->warps[i].scratch_tag[0] = w->warps[i].scratch_tag[1] = 0;
    w->warps[i].live = lanes;
    w->warps[i].live_mask = lanes == 32 ? 0xffffffffu : ((1u << lanes) - 1);
  }
  if (cfg.dyn_smem_bytes) memset(dyn_smem(), 0xff, cfg.dyn_smem_bytes);
  for (int i = 0; i < n; ++i) {
    Fiber& f = w->fibers[i];
    f.tid = uint3{unsigned(i % cfg.block[0]), unsigned(i / cfg.block[0] % cfg.block[1]),
                  unsigned(i / (cfg.block[0] * cfg.block[1]))};
    f.lane = i & 31;
    f.warp = i >> 5;
    f.state = RUNNABLE;
    f.wseq = 0;
    f.cp_pending.clear();
    f.cp_group = 0;
    w->arm_canary(size_t(i));
    char* hi = w->stacks + size_t(i + 1) * w->slot;
    void** sp = reinterpret_cast<void**>(uintptr_t(hi) & ~uintptr_t(15));
    *--sp = nullptr;                                  // fake return address: rsp % 16 == 8 at entry
    *--sp = reinterpret_cast<void*>(&llk_emu_fiber_entry);  // popped by `ret`
    for (int k = 0; k < 6; ++k) *--sp = nullptr;      // rbp rbx r12 r13 r14 r15
    f.sp = sp;
  }
  const LlkEmuSchedule mode = cfg.schedule;
  w->order.resize(size_t(n));
  for (int i = 0; i < n; ++i) w->order[i] = mode == LLK_EMU_REVERSE ? n - 1 - i : i;
  const uint64_t lin = bid.x + uint64_t(cfg.grid[0]) * (bid.y + uint64_t(cfg.grid[1]) * bid.z);
  w->rng.seed(cfg.seed * 0x9E3779B97F4A7C15ull + lin);
  const bool warp_serial = mode == LLK_EMU_WARP_SERIAL || mode == LLK_EMU_WARP_SERIAL_REVERSE;
  while (w->nlive > 0) {
    if (mode == LLK_EMU_RANDOM) std::shuffle(w->order.begin(), w->order.end(), w->rng);
    bool progressed = false;
    int lo = 0, hi = n;  // the fibers this round may run
    if (warp_serial) {
      for (int k = 0; k < nw; ++k) {
        const int wi = mode == LLK_EMU_WARP_SERIAL_REVERSE ? nw - 1 - k : k;
        const int first = wi * 32, last = std::min(n, first + 32);
        bool runnable = false;
        for (int t = first; t < last && !runnable; ++t) runnable = w->fibers[t].state == RUNNABLE;
        if (runnable) {
          lo = first, hi = last;
          break;
        }
      }
    }
    for (int idx : w->order) {
      if (idx < lo || idx >= hi) continue;
      Fiber* f = &w->fibers[idx];
      if (f->state != RUNNABLE) continue;
      switch_to(w, f);
      progressed = true;
      if (!w->canary_intact(size_t(idx)) || static_cast<char*>(f->sp) < w->usable_bottom(size_t(idx))) {
        w->status = LLK_EMU_KERNEL_TRAP;
        snprintf(w->message, sizeof w->message,
                 "fiber stack overflow in block (%u,%u,%u), thread (%u,%u,%u): the kernel needs more than %zu "
                 "bytes of stack (raise EmuOptions::stack_bytes)",
                 bid.x, bid.y, bid.z, f->tid.x, f->tid.y, f->tid.z, w->usable);
        return false;
      }
      if (w->status != LLK_EMU_OK) return false;
    }
    if (!progressed && bulk_copies_land_at_stall(w)) {
      if (w->status != LLK_EMU_OK) return false;
      continue;
    }
    if (!progressed) {
      int at_bar = 0, at_warp = 0, at_mbar = 0, at_named = 0;
      for (auto& f : w->fibers) {
        at_bar += f.state == WAIT_BLOCK;
        at_warp += f.state == WAIT_WARP;
        at_mbar += f.state == WAIT_MBARRIER;
        at_named += f.state == WAIT_NAMED_BARRIER;
      }
      char detail[240];
      async_deadlock_detail(detail, sizeof detail);
      w->status = LLK_EMU_DEADLOCK;
      snprintf(w->message, sizeof w->message,
               "deadlock in block (%u,%u,%u): %d threads wait at __syncthreads (%s:%d), %d at warp operations, "
               "%d at mbarriers, %d at named barriers, %d exited%s",
               bid.x, bid.y, bid.z, at_bar, w->bar_file ? w->bar_file : "-", w->bar_line, at_warp, at_mbar, at_named,
               n - w->nlive, detail);
      return false;
    }
  }
  if (!async_block_end(w->message, sizeof w->message)) {
    w->status = LLK_EMU_KERNEL_TRAP;
    return false;
  }
  if (cfg.dyn_smem_bytes + kDynSmemRedZone <= kMaxDynSmem) {
    const unsigned char* red = dyn_smem() + cfg.dyn_smem_bytes;
    for (size_t k = 0; k < kDynSmemRedZone; ++k)
      if (red[k] != kDynSmemPoison) {
        w->status = LLK_EMU_KERNEL_TRAP;
        snprintf(w->message, sizeof w->message,
                 "block (%u,%u,%u) wrote dynamic shared memory past the %llu bytes it was launched with", bid.x,
                 bid.y, bid.z, (unsigned long long)cfg.dyn_smem_bytes);
        return false;
      }
  }
  return true;
}

inline LlkEmuStatus bad_launch(LlkEmuReport* rep, const char* msg) {
  rep->status = LLK_EMU_BAD_LAUNCH;
  snprintf(rep->message, sizeof rep->message, "%s", msg);
  return rep->status;
}

// Runs the grid. `body` is called once per CUDA thread (it calls the kernel with its params);
// `max_threads` is the kernel's __launch_bounds__; `params` the page holding the params copy.
template <class Body>
LlkEmuStatus launch(Body& body, const LlkEmuLaunch& cfg, LlkEmuReport* rep, uint32_t max_threads,
                    const ParamsPage& params, size_t params_bytes) {
  const uint64_t threads = uint64_t(cfg.block[0]) * cfg.block[1] * cfg.block[2];
  if (threads == 0 || threads > 1024) return bad_launch(rep, "block must have 1 to 1024 threads");
  if (threads > max_threads) {
    rep->status = LLK_EMU_LAUNCH_BOUNDS;
    snprintf(rep->message, sizeof rep->message,
             "block of %llu threads (%u x %u x %u) exceeds the kernel's __launch_bounds__ of %u threads",
             (unsigned long long)threads, cfg.block[0], cfg.block[1], cfg.block[2], max_threads);
    return rep->status;
  }
  const uint32_t arch = cfg.arch ? cfg.arch : 90;
  const uint64_t smem_limit = smem_per_block_limit(arch);
  if (smem_limit == 0) return bad_launch(rep, "unknown architecture (LlkEmuLaunch::arch): 80, 86, 89 or 90");
  if (uint64_t(cfg.static_smem_bytes) + cfg.dyn_smem_bytes > smem_limit) {
    rep->status = LLK_EMU_SHARED_MEMORY_LIMIT;
    snprintf(rep->message, sizeof rep->message,
             "block needs %llu bytes of shared memory (%u static + %llu dynamic), more than the %llu bytes per block "
             "of sm_%u",
             (unsigned long long)(cfg.static_smem_bytes + cfg.dyn_smem_bytes), cfg.static_smem_bytes,
             (unsigned long long)cfg.dyn_smem_bytes, (unsigned long long)smem_limit, arch);
    return rep->status;
  }
  if (cfg.block[2] > 64) return bad_launch(rep, "blockDim.z must be at most 64");
  if (cfg.grid[0] == 0 || cfg.grid[1] == 0 || cfg.grid[2] == 0) return bad_launch(rep, "grid has a zero dimension");
  if (cfg.grid[0] > 0x7fffffffu || cfg.grid[1] > 65535 || cfg.grid[2] > 65535)
    return bad_launch(rep, "grid exceeds the CUDA limits (2^31-1, 65535, 65535)");
  if (cfg.dyn_smem_bytes > kMaxDynSmem) return bad_launch(rep, "dynamic shared memory exceeds 227 KiB");

  const uint64_t nblocks = uint64_t(cfg.grid[0]) * cfg.grid[1] * cfg.grid[2];
  // Blocks start in schedule order too: forward; last first (reverse, warp-serial reverse); or a
  // seeded affine permutation i -> (a i + c) mod n (random), so a dependence between blocks
  // changes the result.
  uint64_t perm_a = 1, perm_c = 0;
  if (cfg.schedule == LLK_EMU_RANDOM && nblocks > 1) {
    std::mt19937_64 g(cfg.seed ^ 0xb10c5eedull);
    perm_c = g() % nblocks;
    do perm_a = g() % nblocks; while (perm_a == 0 || std::gcd(perm_a, nblocks) != 1);
  }
  const bool reversed = cfg.schedule == LLK_EMU_REVERSE || cfg.schedule == LLK_EMU_WARP_SERIAL_REVERSE;
  auto block_order = [&](uint64_t i) -> uint64_t {
    if (reversed) return nblocks - 1 - i;
    return uint64_t((unsigned __int128)perm_a * i % nblocks + perm_c) % nblocks;
  };
  std::atomic<uint64_t> next{0};
  std::atomic<bool> failed{false};
  std::atomic<uint64_t> blocks_run{0}, switches{0};
  std::mutex fail_mu;
  install_fault_handler();
  auto work = [&]() {
    AltStack alt;
    Worker* w = &worker_of_this_thread();
    Worker* saved = tl_worker;
    tl_worker = w;
    w->body = [](void* c) { (*static_cast<Body*>(c))(); };
    w->body_ctx = &body;
    w->switches = 0;
    w->cp_async_timing = cfg.cp_async_timing;
    w->params_lo = reinterpret_cast<uintptr_t>(params.base);
    w->params_end = params.end();
    w->params_bytes = params_bytes;
    for (uint64_t i; !failed.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < nblocks;) {
      const uint64_t b = block_order(i);
      uint3 bid{unsigned(b % cfg.grid[0]), unsigned(b / cfg.grid[0] % cfg.grid[1]),
                unsigned(b / (uint64_t(cfg.grid[0]) * cfg.grid[1]))};
      if (!run_block(w, cfg, bid)) {
        std::lock_guard<std::mutex> g(fail_mu);
        if (!failed.exchange(true)) {
          rep->status = w->status;
          snprintf(rep->message, sizeof rep->message, "%s", w->message);
        }
        break;
      }
      blocks_run.fetch_add(1, std::memory_order_relaxed);
    }
    switches.fetch_add(w->switches, std::memory_order_relaxed);
    w->params_lo = w->params_end = 0;
    tl_worker = saved;
  };
  const uint64_t nt = std::min<uint64_t>(std::max<uint32_t>(1, cfg.os_threads), nblocks);
  std::vector<std::thread> pool;
  try {
    for (uint64_t i = 1; i < nt; ++i) pool.emplace_back(work);
  } catch (const std::exception&) {
    // Fewer OS threads than asked for: the calling thread and those started share the blocks.
  }
  work();
  for (auto& t : pool) t.join();
  rep->blocks = blocks_run.load();
  rep->threads = rep->blocks * threads;
  rep->switches = switches.load();
  return rep->status;
}

// Whether a launch's dynamic shared memory is the kernel's declaration (its row's LLK_SMEM_*);
// when not, the report says both.
inline bool smem_as_declared(LlkSmemRule rule, uint32_t declared, uint64_t requested, LlkEmuReport* rep) {
  const bool ok = rule == LLK_SMEM_RULE_AT_LAUNCH || requested == (rule == LLK_SMEM_RULE_FIXED ? declared : 0);
  if (!ok) {
    rep->status = LLK_EMU_SHARED_MEMORY_DECLARATION;
    snprintf(rep->message, sizeof rep->message,
             "the launch requests %llu bytes of dynamic shared memory; the kernel declares %u (%s)",
             (unsigned long long)requested, rule == LLK_SMEM_RULE_FIXED ? declared : 0u,
             rule == LLK_SMEM_RULE_FIXED ? "LLK_SMEM_FIXED" : "LLK_SMEM_NONE");
  }
  return ok;
}

// The registry entry for one kernel `K` taking params `P`, with at most `MaxThreads` threads per
// block and the dynamic shared memory its row declares (`Rule`, `SmemBytes`). Every thread reads
// the one read-only copy of the params, which ends at a guard page.
template <class P, void (*K)(const P&), uint32_t MaxThreads, LlkSmemRule Rule, uint32_t SmemBytes>
LlkEmuStatus launch_entry(const void* params, const LlkEmuLaunch* cfg, LlkEmuReport* rep) {
  static_assert(std::is_trivially_copyable_v<P>, "params cross the boundary as plain bytes");
  *rep = LlkEmuReport{};
  if (!smem_as_declared(Rule, SmemBytes, cfg->dyn_smem_bytes, rep)) return rep->status;
  ParamsPage& page = params_page_of_this_thread();
  const void* copy = page.place(params, sizeof(P));
  if (copy == nullptr) return bad_launch(rep, "could not map the params copy and its guard page");
  const P& p = *static_cast<const P*>(copy);  // memcpy created the object (an implicit-lifetime type)
  auto body = [&p]() { K(p); };
  return launch(body, *cfg, rep, MaxThreads, page, sizeof(P));
}

}  // namespace llk_emu

// ------------------------------------------------------------------------------ intrinsics
#define __syncthreads() ::llk_emu::block_barrier(__FILE__, __LINE__)
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  llk_emu::Worker* w = llk_emu::tl_worker;
  llk_emu::Fiber* f = w->cur;
  f->wseq++;
  llk_emu::warp_rendezvous(w, f, mask, llk_emu::OP_SYNCWARP);
}
[[noreturn]] inline void __trap() { llk_emu::fail(LLK_EMU_KERNEL_TRAP, "__trap() called"); }
template <class T> inline T __shfl_sync(unsigned m, T v, int src, int width = 32) {
  return llk_emu::warp_exchange(m, v, llk_emu::ShflMode::Idx, src, width);
}
template <class T> inline T __shfl_xor_sync(unsigned m, T v, int lane_mask, int width = 32) {
  return llk_emu::warp_exchange(m, v, llk_emu::ShflMode::Bfly, lane_mask, width);
}
template <class T> inline T __shfl_down_sync(unsigned m, T v, unsigned d, int width = 32) {
  return llk_emu::warp_exchange(m, v, llk_emu::ShflMode::Down, int(d), width);
}
template <class T> inline T __shfl_up_sync(unsigned m, T v, unsigned d, int width = 32) {
  return llk_emu::warp_exchange(m, v, llk_emu::ShflMode::Up, int(d), width);
}
inline unsigned __ballot_sync(unsigned m, int p) { return llk_emu::warp_vote(m, p != 0); }
inline int __any_sync(unsigned m, int p) { return llk_emu::warp_vote(m, p != 0) != 0; }
inline int __all_sync(unsigned m, int p) {  // no voting lane said false
  return llk_emu::warp_vote(m, p == 0) == 0;
}

// Atomics are real atomics: blocks run concurrently on several OS threads. Fibers of one block
// never interleave inside an atomic (there is no preemption).
template <class T> inline T atomicAdd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_add(v, std::memory_order_relaxed); }
template <class T> inline T atomicSub(T* p, T v) { return std::atomic_ref<T>(*p).fetch_sub(v, std::memory_order_relaxed); }
template <class T> inline T atomicExch(T* p, T v) { return std::atomic_ref<T>(*p).exchange(v, std::memory_order_relaxed); }
template <class T> inline T atomicCAS(T* p, T cmp, T v) {
  std::atomic_ref<T>(*p).compare_exchange_strong(cmp, v, std::memory_order_relaxed);
  return cmp;
}
template <class T> inline T atomicMax(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T o = a.load();
  while (o < v && !a.compare_exchange_weak(o, v)) {
  }
  return o;
}
template <class T> inline T atomicMin(T* p, T v) {
  std::atomic_ref<T> a(*p);
  T o = a.load();
  while (v < o && !a.compare_exchange_weak(o, v)) {
  }
  return o;
}
template <class T> inline T atomicOr(T* p, T v) { return std::atomic_ref<T>(*p).fetch_or(v, std::memory_order_relaxed); }
template <class T> inline T atomicAnd(T* p, T v) { return std::atomic_ref<T>(*p).fetch_and(v, std::memory_order_relaxed); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
inline void __threadfence_block() { std::atomic_signal_fence(std::memory_order_seq_cst); }

// Math: fast-math intrinsics map to accurate libm functions (this hides the GPU's ulp errors).
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fmaf_rn(float a, float b, float c) { return fmaf(a, b, c); }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __saturatef(float x) { return x < 0.f ? 0.f : (x > 1.f ? 1.f : x); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; memcpy(&i, &f, 4); return i; }
inline unsigned __float_as_uint(float f) { unsigned i; memcpy(&i, &f, 4); return i; }
inline float __uint_as_float(unsigned i) { float f; memcpy(&f, &i, 4); return f; }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __ffs(int x) { return __builtin_ffs(x); }
// Byte n of the result is byte (nibble n of s) & 7 of the 8-byte value {y:x} (x the low word).
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {
  const unsigned long long v = (static_cast<unsigned long long>(y) << 32) | x;
  unsigned r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<unsigned>((v >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}
template <class T> inline T __ldg(const T* p) {
  if constexpr (sizeof(T) == 16) llk_emu::check_align16(p, "16-byte __ldg");
  return *p;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline float min(float a, float b) { return fminf(a, b); }
inline float max(float a, float b) { return fmaxf(a, b); }
