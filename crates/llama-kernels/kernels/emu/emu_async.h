// emu_async.h -- the async proxy of sm_90 in the emulation runtime: mbarriers, bulk copies into
// shared memory, and the async proxy's view of shared memory (fence.proxy.async).
//
// Included by emu_runtime.h after the fiber machinery; kernel code reaches it through
// kernels/common/mbarrier.cuh and kernels/common/async_proxy.cuh. What is modelled, from the PTX
// ISA ("Parallel Synchronization and Communication Instructions: mbarrier", "cp.async.bulk",
// "Memory Consistency Model: proxies"):
//
//   * An mbarrier is a 64-bit shared-memory object with an expected arrival count (1 to 2^20-1),
//     the arrivals still pending in the current phase, a tx-count and a phase number.
//     mbarrier.init sets them (pending = count, tx 0, phase 0); arrive takes one arrival,
//     arrive.expect_tx first adds bytes to the tx-count; complete_tx (the bulk copies'
//     completion) subtracts. The phase completes when no arrival is pending and the
//     tx-count is 0: the phase number advances, pending returns to the count.
//   * mbarrier.try_wait.parity P succeeds once the phase of parity P has completed (the current
//     phase's parity differs from P). Here it is a yield point that returns only on success: the
//     thread sleeps until the barrier's phase advances, so a producer/consumer pipeline makes
//     progress, and a pipeline that cannot (more bytes expected than copied, an arrival missing,
//     a wrong parity) ends in a deadlock report that names the barrier's state.
//   * The emulator's state lives beside the barrier, keyed by its address; the 64-bit word itself
//     holds a tag that every operation checks, so a barrier used before its mbarrier.init in
//     this block, or overwritten by an ordinary store, is reported. Stricter than the ISA, as
//     errors: more arrivals in one phase than the count; a complete_tx that would take the
//     tx-count below 0 ("complete_tx crossed a phase": more bytes arrived than the phase
//     expected, so the rest counts against the next phase); a tx-count past 2^20-1.
//   * cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes: `bytes` (a non-zero
//     multiple of 16, both addresses 16-byte aligned) from global to dynamic shared memory, then
//     complete_tx on the barrier. With LLK_EMU_CP_ASYNC_AT_WAIT (the latest moment) the
//     destination holds a NaN pattern from the issue until no thread of the block can run any
//     more (all wait or have exited); only then do the bytes land, in issue order, and the
//     transactions complete, so a read that did not wait sees NaN. At such a stall only the
//     copies of barriers some thread sleeps on land (all of them when there are none), so a
//     wait on one stage's barrier does not deliver another's. With
//     LLK_EMU_CP_ASYNC_AT_ISSUE they land at once. A block whose threads have all exited with
//     copies in flight (no thread waited on their barrier) is reported.
//   * Proxies: the async proxy (wgmma operands here, and the bulk copies) sees shared memory as
//     of the last fence.proxy.async (plus its own writes). The emulator keeps that view as a
//     copy of dynamic shared memory, refreshed by every fence.proxy.async of any thread of the
//     block; an async-proxy read of a byte that differs between the view and shared memory is a
//     generic-proxy write without the fence and is reported. As the fence is per block here,
//     a thread that skips its fence is seen only when no later fence of another thread covers
//     its write (the warp-serial and reverse schedules make that likely).
//
// Tensor copies (cp.async.bulk.tensor) complete through the same path: emu_tma.h.
//
// Not modelled: mbarrier.expect_tx without an arrival, mbarrier.test_wait, the arrival-state
// tokens, arrive.noComplete, mbarrier.inval, remote (cluster) barriers and multicast, bulk
// copies from shared to global, cp.reduce.async.bulk, and try_wait's time limit (it never
// returns false).
#pragma once

namespace llk_emu {

inline constexpr int64_t kMbarrierMaxCount = (int64_t(1) << 20) - 1;  // arrivals and tx-count
inline constexpr uint64_t kMbarrierTag = 0x6d62617272696572ull;       // "mbarrier" in the word

struct Mbarrier {
  const void* addr;
  int64_t count, pending, tx;
  uint64_t phase;
};

// A bulk copy whose bytes have not landed yet (LLK_EMU_CP_ASYNC_AT_WAIT).
struct BulkCopy {
  void* dst;
  const void* src;  // global memory (1-D copies), or null: the bytes are `staged`
  uint32_t bytes;
  const void* bar;
  const char* file;
  int line;
  std::vector<unsigned char> staged;  // tensor copies: the box as it will land (emu_tma.h)
};

// Per block (one OS thread runs one block at a time).
struct AsyncBlock {
  std::vector<Mbarrier> bars;
  std::vector<BulkCopy> in_flight;
  std::vector<const void*> waiting;  // per thread: the barrier it sleeps on, or null
  std::vector<unsigned char> view;   // dynamic shared memory as the async proxy sees it
  bool view_live = false;            // made at the block's first async-proxy access
  unsigned char poison = 0;
  uint64_t dyn_smem_bytes = 0;
};
inline thread_local AsyncBlock tl_async;

// Called before the block's dynamic shared memory is poisoned with `poison`.
inline void async_block_start(int nthreads, uint64_t dyn_smem_bytes, unsigned char poison) {
  tl_async.bars.clear();
  tl_async.in_flight.clear();
  tl_async.waiting.assign(size_t(nthreads), nullptr);
  tl_async.view_live = false;
  tl_async.poison = poison;
  tl_async.dyn_smem_bytes = dyn_smem_bytes;
}

// The async proxy's view, made on first use: until the block's first fence or copy it is the
// block's initial (poisoned) shared memory, so blocks that never use the async proxy pay nothing.
inline unsigned char* async_view() {
  if (!tl_async.view_live) {
    tl_async.view.assign(size_t(tl_async.dyn_smem_bytes), tl_async.poison);
    tl_async.view_live = true;
  }
  return tl_async.view.data();
}

// The shared address of a pointer into the launch's dynamic shared memory (its first byte is
// address 0, aligned to every swizzle pattern).
inline uint32_t shared_address(const void* p) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(dyn_smem()), a = reinterpret_cast<uintptr_t>(p);
  if (a < base || a >= base + kMaxDynSmem)
    fail(LLK_EMU_UNSUPPORTED, "a shared-memory address outside dynamic shared memory (static __shared__ operands of "
                              "wgmma and bulk copies are not emulated)");
  return uint32_t(a - base);
}

// The swizzle of the async proxy's shared-memory layouts (tensor copies write it, wgmma's
// descriptors read it): bits [4, 4 + b) of the absolute shared address XOR bits [7, 7 + b),
// b = 1, 2, 3 for a 32, 64 or 128-byte span, none for 0 (CuTe's Swizzle<b,4,3>). Only bits 4-6
// change, so an address stays in its 16-byte-chunk row of `span` bytes.
inline uint32_t swizzled(uint32_t addr, uint32_t span) {
  const uint32_t b = span == 128 ? 3 : span == 64 ? 2 : span == 32 ? 1 : 0;
  return addr ^ (((addr >> 7) & ((1u << b) - 1)) << 4);
}

// fence.proxy.async: the async proxy sees the generic proxy's shared-memory writes so far.
inline void fence_proxy_async() {
  if (tl_async.dyn_smem_bytes) memcpy(async_view(), dyn_smem(), size_t(tl_async.dyn_smem_bytes));
}

// An async-proxy read of [addr, addr + bytes) of dynamic shared memory (in bounds).
inline void async_proxy_read(uint32_t addr, uint32_t bytes, const char* what, const char* file, int line) {
  if (memcmp(dyn_smem() + addr, async_view() + addr, bytes) != 0) {
    char msg[300];
    snprintf(msg, sizeof msg,
             "%s reads shared memory at 0x%x that a generic-proxy store changed after the last fence.proxy.async "
             "(or while the operation was in flight)",
             what, addr);
    fail(LLK_EMU_KERNEL_TRAP, msg, file, line);
  }
}

// ------------------------------------------------------------------------------- mbarrier
inline Mbarrier& mbarrier_of(const void* bar, const char* file, int line) {
  for (Mbarrier& m : tl_async.bars)
    if (m.addr == bar) {
      uint64_t word;
      memcpy(&word, bar, 8);
      if (word != kMbarrierTag)
        fail(LLK_EMU_KERNEL_TRAP, "mbarrier overwritten by an ordinary store since its mbarrier.init", file, line);
      return m;
    }
  fail(LLK_EMU_KERNEL_TRAP, "mbarrier used before its mbarrier.init in this block", file, line);
}

inline void mbarrier_init(void* bar, uint32_t count, const char* file, int line) {
  if (reinterpret_cast<uintptr_t>(bar) & 7u) fail(LLK_EMU_MISALIGNED, "mbarrier not 8-byte aligned", file, line);
  if (count < 1 || int64_t(count) > kMbarrierMaxCount)
    fail(LLK_EMU_KERNEL_TRAP, "mbarrier.init with an arrival count outside 1..2^20-1", file, line);
  memcpy(bar, &kMbarrierTag, 8);
  for (Mbarrier& m : tl_async.bars)
    if (m.addr == bar) {
      m = Mbarrier{bar, count, count, 0, 0};
      return;
    }
  tl_async.bars.push_back(Mbarrier{bar, count, count, 0, 0});
}

// Completes the phase if nothing is pending, and wakes the threads sleeping on the barrier.
inline void mbarrier_maybe_complete(Mbarrier& m) {
  if (m.pending != 0 || m.tx != 0) return;
  m.phase++;
  m.pending = m.count;
  Worker* w = tl_worker;
  for (size_t t = 0; t < tl_async.waiting.size(); ++t)
    if (tl_async.waiting[t] == m.addr) {
      tl_async.waiting[t] = nullptr;
      if (w->fibers[t].state == WAIT_MBARRIER) w->fibers[t].state = RUNNABLE;
    }
}

inline void mbarrier_add_tx(Mbarrier& m, int64_t bytes, const char* file, int line) {
  if (bytes < 0 || m.tx + bytes > kMbarrierMaxCount)
    fail(LLK_EMU_KERNEL_TRAP, "mbarrier tx-count past 2^20-1 bytes", file, line);
  m.tx += bytes;
}

// mbarrier.arrive (tx = 0) or mbarrier.arrive.expect_tx (tx bytes expected first).
inline void mbarrier_arrive(void* bar, uint32_t tx, const char* file, int line) {
  Mbarrier& m = mbarrier_of(bar, file, line);
  mbarrier_add_tx(m, tx, file, line);
  if (m.pending == 0)
    fail(LLK_EMU_KERNEL_TRAP, "more arrivals on an mbarrier in one phase than its count", file, line);
  m.pending--;
  mbarrier_maybe_complete(m);
}

// A bulk copy lands: its bytes reach shared memory and the async proxy's view, then its
// transactions complete. Returns null, or what went wrong (in `msg`).
inline const char* bulk_copy_land(const BulkCopy& c, char* msg, size_t size) {
  Mbarrier* m = nullptr;
  for (Mbarrier& b : tl_async.bars)
    if (b.addr == c.bar) m = &b;
  uint64_t word = 0;
  if (m) memcpy(&word, c.bar, 8);
  if (!m || word != kMbarrierTag)
    return "a bulk copy completes on an mbarrier that was re-used (not initialized, or overwritten by an ordinary "
           "store) while the copy was in flight";
  if (int64_t(c.bytes) > m->tx) {
    snprintf(msg, size,
             "complete_tx crossed a phase: a bulk copy of %u bytes completes on an mbarrier whose phase %llu expects "
             "only %lld more (expect_tx counted fewer bytes than the copies move)",
             c.bytes, (unsigned long long)m->phase, (long long)m->tx);
    return msg;
  }
  const void* src = c.src ? c.src : c.staged.data();
  memcpy(c.dst, src, c.bytes);
  memcpy(async_view() + (static_cast<unsigned char*>(c.dst) - dyn_smem()), src, c.bytes);
  m->tx -= c.bytes;
  mbarrier_maybe_complete(*m);
  return nullptr;
}

// Called by the scheduler when no thread can run: copies land now, in issue order (the latest
// moment the hardware could deliver them), and wake their waiters. Only the copies whose
// mbarrier some thread sleeps on land (all of theirs), the others stay in flight, so that a
// thread that reads a stage without waiting for its own barrier still sees the NaN pattern
// though another barrier's wait let the block stall; when no thread waits on any of them, all
// land. Returns whether one landed; a failure sets the worker's status and message.
inline bool bulk_copies_land_at_stall(Worker* w) {
  if (tl_async.in_flight.empty()) return false;
  auto waited = [](const void* bar) {
    return std::find(tl_async.waiting.begin(), tl_async.waiting.end(), bar) != tl_async.waiting.end();
  };
  std::vector<BulkCopy> copies, later;
  for (BulkCopy& c : tl_async.in_flight) (waited(c.bar) ? copies : later).push_back(std::move(c));
  if (copies.empty()) copies.swap(later);
  tl_async.in_flight.swap(later);
  for (const BulkCopy& c : copies) {
    char msg[300];
    if (const char* what = bulk_copy_land(c, msg, sizeof msg)) {
      w->status = LLK_EMU_KERNEL_TRAP;
      snprintf(w->message, sizeof w->message, "%s (block (%u,%u,%u), the copy issued at %s:%d)", what, blockIdx.x,
               blockIdx.y, blockIdx.z, c.file, c.line);
      return true;
    }
  }
  return true;
}

// mbarrier.try_wait.parity until it succeeds.
inline void mbarrier_wait_parity(void* bar, uint32_t parity, const char* file, int line) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  const size_t t = size_t(f - w->fibers.data());
  for (;;) {
    if ((mbarrier_of(bar, file, line).phase & 1) != (parity & 1)) return;
    tl_async.waiting[t] = bar;
    f->state = WAIT_MBARRIER;
    yield_to_scheduler(w, f);
  }
}

// A checked copy (destination in dynamic shared memory, barrier initialized) starts: it lands
// now (LLK_EMU_CP_ASYNC_AT_ISSUE) or when the block stalls, its destination poisoned till then.
inline void bulk_copy_issue(BulkCopy c) {
  if (tl_worker->cp_async_timing == LLK_EMU_CP_ASYNC_AT_ISSUE) {
    char msg[300];
    if (const char* what = bulk_copy_land(c, msg, sizeof msg)) fail(LLK_EMU_KERNEL_TRAP, what, c.file, c.line);
    return;
  }
  memset(c.dst, 0xff, c.bytes);
  memset(async_view() + shared_address(c.dst), 0xff, c.bytes);
  tl_async.in_flight.push_back(std::move(c));
}

// cp.async.bulk global -> shared, completing on `bar`.
inline void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes, void* bar, const char* file, int line) {
  if (bytes == 0 || bytes % 16 != 0)
    fail(LLK_EMU_MISALIGNED, "cp.async.bulk size is not a non-zero multiple of 16 bytes", file, line);
  if ((reinterpret_cast<uintptr_t>(dst) | reinterpret_cast<uintptr_t>(src)) & 15u)
    fail(LLK_EMU_MISALIGNED, "cp.async.bulk address not 16-byte aligned", file, line);
  const uint32_t addr = shared_address(dst);
  if (uint64_t(addr) + bytes > tl_async.dyn_smem_bytes)
    fail(LLK_EMU_MEMORY_FAULT, "cp.async.bulk destination past the launch's dynamic shared memory", file, line);
  mbarrier_of(bar, file, line);
  bulk_copy_issue(BulkCopy{dst, src, bytes, bar, file, line, {}});
}

// At the end of a block: copies still in flight are an error. Returns false with the message.
inline bool async_block_end(char* message, size_t size) {
  if (tl_async.in_flight.empty()) return true;
  const BulkCopy& c = tl_async.in_flight.front();
  snprintf(message, size,
           "block (%u,%u,%u) finished with %zu bulk copies in flight (the first issued at %s:%d): no thread waited on "
           "their mbarrier",
           blockIdx.x, blockIdx.y, blockIdx.z, tl_async.in_flight.size(), c.file, c.line);
  return false;
}

// For a deadlock report: the state of (at most two of) the barriers threads sleep on.
inline void async_deadlock_detail(char* out, size_t size) {
  out[0] = 0;
  size_t used = 0;
  int shown = 0;
  for (const Mbarrier& m : tl_async.bars) {
    if (shown == 2 || std::find(tl_async.waiting.begin(), tl_async.waiting.end(), m.addr) == tl_async.waiting.end())
      continue;
    const uintptr_t a = reinterpret_cast<uintptr_t>(m.addr), base = reinterpret_cast<uintptr_t>(dyn_smem());
    const int k = snprintf(out + used, size - used, "; mbarrier %s0x%lx: phase %llu, %lld of %lld arrivals and %lld tx bytes pending",
                           a >= base && a < base + kMaxDynSmem ? "at shared " : "", (unsigned long)(a >= base && a < base + kMaxDynSmem ? a - base : a),
                           (unsigned long long)m.phase, (long long)m.pending, (long long)m.count, (long long)m.tx);
    if (k < 0 || size_t(k) >= size - used) return;
    used += size_t(k);
    shown++;
  }
}

}  // namespace llk_emu
