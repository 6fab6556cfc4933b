// emu_warp_specialize.h -- the instructions a warp-specialized kernel coordinates its warps with:
// named barriers (bar.sync / bar.arrive with an id and a thread count), elect.sync and
// setmaxnreg, in the emulation runtime.
//
// Included by emu_runtime.h after the fiber machinery; kernel code reaches it through
// kernels/common/warp_specialize.cuh. What is modelled, from the PTX ISA ("bar, barrier",
// "elect.sync", "setmaxnreg"):
//
//   * Named barriers 1 to 15 (0 is __syncthreads' own and is refused here). bar.sync id, n and
//     bar.arrive id, n count arrivals per warp, as the hardware does: a warp arrives when all its
//     live lanes have executed the instruction, and counts as 32 threads. When n threads have
//     arrived the barrier completes, releases the threads waiting at bar.sync and starts afresh;
//     bar.arrive never waits. n must be a non-zero multiple of 32; one barrier used with two
//     counts before it completes and more arrivals than n are errors, and a barrier that never
//     completes (an arrival missing, the lanes of a warp at different barriers) ends in a
//     deadlock report.
//   * elect.sync (in kernels/common/warp_specialize.cuh, on the warp vote): the live lanes of
//     the warp meet; the lowest lane of the mask is elected.
//   * setmaxnreg.{inc,dec}: the four warps of a warpgroup meet and must ask for the same count, a
//     multiple of 8 in 24..256. The register file itself is not modelled (the count is checked,
//     then has no effect).
#pragma once

namespace llk_emu {

inline constexpr int kNamedBarriers = 16;

struct NamedBarrier {
  int expected = 0;             // n of the phase in progress (0: idle)
  int arrived = 0;              // threads (whole warps) arrived
  std::vector<int> lanes;       // per warp: lanes arrived in its current arrival
  const char* file = nullptr;   // where the phase's first arrival came from
  int line = 0;
};

struct WarpSpecializeBlock {
  NamedBarrier bars[kNamedBarriers];
  std::vector<int> waiting;     // per thread: the barrier id it waits at, or -1
  std::vector<int> setmaxnreg;  // per warpgroup: the count being set (0: none in progress)
  std::vector<int> setmaxnreg_arrived;
  bool used = false;  // the block has used a named barrier or setmaxnreg
  int nthreads = 0;
};
inline thread_local WarpSpecializeBlock tl_ws;

inline void warp_specialize_block_start(int nthreads) {
  // Only what every block needs now; the barriers' per-warp counts are sized at first use.
  tl_ws.used = false;
  tl_ws.nthreads = nthreads;
}

// The block's state, made at its first named barrier or setmaxnreg.
inline WarpSpecializeBlock& warp_specialize_state() {
  if (!tl_ws.used) {
    const int n = tl_ws.nthreads, nwarps = (n + 31) / 32;
    for (NamedBarrier& b : tl_ws.bars) b = NamedBarrier{0, 0, std::vector<int>(size_t(nwarps), 0), nullptr, 0};
    tl_ws.waiting.assign(size_t(n), -1);
    tl_ws.setmaxnreg.assign(size_t((n + 127) / 128), 0);
    tl_ws.setmaxnreg_arrived.assign(size_t((n + 127) / 128), 0);
    tl_ws.used = true;
  }
  return tl_ws;
}

inline void named_barrier_release(int id) {
  Worker* w = tl_worker;
  for (size_t t = 0; t < tl_ws.waiting.size(); ++t)
    if (tl_ws.waiting[t] == id) {
      tl_ws.waiting[t] = -1;
      if (w->fibers[t].state == WAIT_NAMED_BARRIER) w->fibers[t].state = RUNNABLE;
    }
  NamedBarrier& b = tl_ws.bars[id];
  b.expected = b.arrived = 0;
}

// Counts warp `wi` once all its live lanes have arrived at barrier `id`; completes the barrier.
inline void named_barrier_count_warp(int id, int wi) {
  NamedBarrier& b = tl_ws.bars[id];
  if (b.lanes[size_t(wi)] == 0 || b.lanes[size_t(wi)] < tl_worker->warps[size_t(wi)].live) return;
  b.lanes[size_t(wi)] = 0;
  b.arrived += 32;
  if (b.arrived > b.expected) {
    char msg[200];
    snprintf(msg, sizeof msg, "named barrier %d: more threads arrive than its count of %d (warps count 32 each)", id,
             b.expected);
    fail(LLK_EMU_KERNEL_TRAP, msg, b.file, b.line);
  }
  if (b.arrived == b.expected) named_barrier_release(id);
}

// bar.sync id, n (wait = true) or bar.arrive id, n.
inline void named_barrier(int id, int n, bool wait, const char* file, int line) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  if (id < 1 || id >= kNamedBarriers)
    fail(LLK_EMU_UNSUPPORTED, "named barrier id outside 1..15 (0 belongs to __syncthreads)", file, line);
  if (n <= 0 || n % 32 != 0 || n > w->nthreads + 31)
    fail(LLK_EMU_KERNEL_TRAP, "named barrier thread count is not a non-zero multiple of 32 within the block", file, line);
  NamedBarrier& b = warp_specialize_state().bars[id];
  if (b.expected == 0) {
    b.expected = n;
    b.file = file;
    b.line = line;
  } else if (b.expected != n) {
    char msg[300];
    snprintf(msg, sizeof msg, "named barrier %d used with %d threads while a phase of %d threads (from %s:%d) is open",
             id, n, b.expected, b.file, b.line);
    fail(LLK_EMU_KERNEL_TRAP, msg, file, line);
  }
  const size_t t = size_t(f - w->fibers.data());
  b.lanes[size_t(f->warp)]++;
  if (wait) {
    tl_ws.waiting[t] = id;
    f->state = WAIT_NAMED_BARRIER;
  }
  named_barrier_count_warp(id, f->warp);
  if (wait) yield_to_scheduler(w, f);
}

// At a thread's exit: a warp whose other lanes all arrived at a named barrier now counts.
inline void warp_specialize_thread_exit(Fiber* f) {
  if (!tl_ws.used) return;
  for (int id = 1; id < kNamedBarriers; ++id)
    if (tl_ws.bars[id].expected != 0) named_barrier_count_warp(id, f->warp);
}

// setmaxnreg: checked, then without effect.
inline void setmaxnreg(int count, const char* file, int line) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  if (count < 24 || count > 256 || count % 8 != 0)
    fail(LLK_EMU_KERNEL_TRAP, "setmaxnreg count is not a multiple of 8 in 24..256", file, line);
  const int wg = int(f - w->fibers.data()) / 128;
  if (w->nthreads < 128 * (wg + 1))
    fail(LLK_EMU_KERNEL_TRAP, "setmaxnreg executed by a partial warpgroup (fewer than 128 threads)", file, line);
  int& want = warp_specialize_state().setmaxnreg[size_t(wg)];
  if (want == 0) {
    want = count;
  } else if (want != count) {
    fail(LLK_EMU_KERNEL_TRAP, "threads of one warpgroup ask setmaxnreg for different counts", file, line);
  }
  f->state = WAIT_WARP;
  if (++tl_ws.setmaxnreg_arrived[size_t(wg)] == 128) {
    want = 0;
    tl_ws.setmaxnreg_arrived[size_t(wg)] = 0;
    release_warpgroup(w, wg);
  }
  yield_to_scheduler(w, f);
}

}  // namespace llk_emu
