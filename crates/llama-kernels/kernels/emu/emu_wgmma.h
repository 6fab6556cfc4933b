// emu_wgmma.h -- the warpgroup MMA of sm_90 (wgmma.mma_async) in the emulation runtime.
//
// Included by emu_runtime.h after the warp machinery; kernel code reaches it through the
// wrappers of kernels/common/wgmma.cuh. What is modelled, from the PTX ISA ("Asynchronous
// Warpgroup Level Matrix Multiply-Accumulate Instructions"):
//
//   * wgmma.mma_async.sync.aligned.m64nNk16.f32.{bf16,f16}, N = 8..256 in steps of 8: D (64 x N,
//     f32) = A (64 x 16) * B (16 x N) + D, or A * B when scale-d is false. A comes from a shared
//     memory descriptor (K-major or M-major) or from four registers per thread; B from a
//     descriptor (K-major or N-major).
//   * Descriptors decoded as the ISA's "Matrix Descriptor Format" says: start address, leading
//     and stride byte offsets (each >> 4 in 14 bits), swizzle 0 none / 1 128 B / 2 64 B / 3 32 B
//     in bits 62-63. Element (mn, k) sits at the canonical layout's offset (ISA "Canonical
//     Layouts", in bytes, 16-bit elements, W the swizzle width):
//       K-major,  no swizzle:  (mn % 8) 16 + (mn / 8) SBO + (k % 8) 2 + (k / 8) LBO
//       K-major,  swizzled:    (mn % 8) W  + (mn / 8) SBO + k 2                 (LBO unused)
//       MN-major, no swizzle:  (mn % 8) 2  + (mn / 8) SBO + (k % 8) 16 + (k / 8) LBO
//       MN-major, swizzled:    (mn % (W/2)) 2 + (mn / (W/2)) LBO + (k % 8) W + (k / 8) SBO
//     and the swizzle XORs bits [4, 4 + b) of the absolute shared address with bits [7, 7 + b)
//     (b = 3, 2, 1 for 128, 64, 32 B: CuTe's Swizzle<b,4,3>). A non-zero matrix base offset
//     (bits 49-51) is reported as unsupported, not guessed. Shared addresses are offsets into
//     the launch's dynamic shared memory (its first byte is address 0, aligned to every swizzle
//     pattern); an operand outside it, or in static __shared__ memory, is an error.
//   * Fragments (ISA figures for m64nNk16; thread t of the warpgroup, warp w = t / 32, g = lane
//     / 4, q = lane % 4): d[i] is D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)];
//     register r of A holds A[16 w + g + 8 (r & 1)][2 q + 8 (r >> 1) + h], h the half.
//   * The warpgroup (four consecutive warps, 128 threads) meets at every wgmma.mma_async, as a
//     warp meets at a shuffle; its threads must give the same instruction and descriptors.
//   * Asynchrony: wgmma.commit_group closes a group, wgmma.wait_group N completes every
//     committed group but the newest N. With LLK_EMU_CP_ASYNC_AT_WAIT (the latest moment) the
//     product is computed at the first covering wait of the warpgroup, reading shared memory
//     then (the waiting thread yields first, so other threads' stores before that moment land
//     in it), and the accumulator registers hold a NaN pattern in between: a read before the wait
//     sees NaN, a write before it is reported as a race with the source lines. The A fragment is
//     read through its registers at the wait too, and a change since the issue is a race (so it
//     must stay in scope until then, as its registers stay live on the GPU). With
//     LLK_EMU_CP_ASYNC_AT_ISSUE (the earliest) the product lands when the warpgroup issues.
//     Several wgmma.mma_async on the same accumulator before a wait chain in issue order, as the
//     ISA orders them.
//   * wgmma.fence: a thread must execute one before its first wgmma.mma_async and after every
//     wait that retired one of its operations (the registers are then the kernel's again). The
//     ISA asks for a fence only where a register was touched in between; this rule is the
//     stricter, checkable form. A thread that exits with operations not waited for is reported.
//
//   * Operands are read through the async proxy (emu_async.h): shared memory written by ordinary
//     stores needs a fence.proxy.async before the wgmma that reads it (at its completion).
//
// Not modelled: sparse and integer/fp8/tf32 forms, f16 accumulators, scale-a/scale-b
// of -1, .sp, and the hardware's summation order (the 16 products are added in k order with f32
// fmas from zero, then D is added: compare with the GPU by tolerance).
#pragma once

namespace llk_emu {

inline constexpr uint32_t kWgmmaPoison = 0xffffffffu;  // the accumulator between issue and wait

// A wgmma.mma_async as one thread issues it: the shape, the operand forms and where its call is.
struct WgmmaInstr {
  int n;
  bool bf16, a_in_regs, trans_a, trans_b, accumulate;
  uint64_t desc_a, desc_b;
  const char* file;
  int line;
  bool same(const WgmmaInstr& o) const {
    return n == o.n && bf16 == o.bf16 && a_in_regs == o.a_in_regs && trans_a == o.trans_a && trans_b == o.trans_b &&
           accumulate == o.accumulate && desc_a == o.desc_a && desc_b == o.desc_b;
  }
};

// One wgmma.mma_async of a warpgroup: the instruction, each thread's registers, the product.
struct WgmmaOp {
  WgmmaInstr in;
  float* d[128];
  const uint32_t* a_ptr[128];
  uint32_t a_issued[128][4];
  std::vector<float> d_in;  // [128][n/2]: each thread's accumulator at issue (unless chained)
  bool chained[128];        // the accumulator is the destination of an earlier pending op
  int arrived = 0;
  bool computed = false;
  std::vector<float> ab;  // [64][n]: A * B
};

struct WgmmaPending {
  std::shared_ptr<WgmmaOp> op;
  int group;
  bool done;  // completed at issue (LLK_EMU_CP_ASYNC_AT_ISSUE), still counted by the waits
};

struct WgmmaThread {
  std::vector<WgmmaPending> pending;
  int group = 0;  // the group being filled
  bool fenced = false;
};

// Per block (one OS thread runs one block at a time).
struct WgmmaBlock {
  std::vector<WgmmaThread> threads;
  std::vector<std::shared_ptr<WgmmaOp>> forming;  // per warpgroup: the op being issued
  uint64_t dyn_smem_bytes = 0;
  bool used = false;  // made at the block's first wgmma instruction
  int nthreads = 0;
};
inline thread_local WgmmaBlock tl_wgmma;

inline void wgmma_block_start(int nthreads, uint64_t dyn_smem_bytes) {
  tl_wgmma.used = false;
  tl_wgmma.nthreads = nthreads;
  tl_wgmma.dyn_smem_bytes = dyn_smem_bytes;
}

// The block's state, made at its first wgmma instruction (blocks without one pay nothing).
inline WgmmaBlock& wgmma_state() {
  if (!tl_wgmma.used) {
    tl_wgmma.threads.assign(size_t(tl_wgmma.nthreads), WgmmaThread{});
    tl_wgmma.forming.assign(size_t((tl_wgmma.nthreads + 127) / 128), nullptr);
    tl_wgmma.used = true;
  }
  return tl_wgmma;
}

inline int fiber_index(Worker* w, Fiber* f) { return int(f - w->fibers.data()); }

[[noreturn]] inline void wgmma_fail(LlkEmuStatus s, const char* what, const WgmmaInstr& in) {
  fail(s, what, in.file, in.line);
}

// One 16-bit element of a descriptor operand: row/column `mn` of the M or N extent, `k` of 16.
inline uint16_t wgmma_element(const WgmmaInstr& in, uint64_t desc, bool mn_major, int mn, int k) {
  const uint32_t start = uint32_t(desc & 0x3fff) << 4, lbo = uint32_t(desc >> 16 & 0x3fff) << 4,
                 sbo = uint32_t(desc >> 32 & 0x3fff) << 4;
  const int mode = int(desc >> 62), base_offset = int(desc >> 49 & 7);
  if (base_offset != 0)
    wgmma_fail(LLK_EMU_UNSUPPORTED, "wgmma descriptor with a non-zero matrix base offset (not modelled)", in);
  const uint32_t width = mode == 1 ? 128 : mode == 2 ? 64 : mode == 3 ? 32 : 0;  // swizzle bytes
  uint32_t off;
  if (!mn_major) {
    off = width ? uint32_t(mn % 8) * width + uint32_t(mn / 8) * sbo + uint32_t(k) * 2
                : uint32_t(mn % 8) * 16 + uint32_t(mn / 8) * sbo + uint32_t(k % 8) * 2 + uint32_t(k / 8) * lbo;
  } else {
    const int atom = int(width / 2);  // elements of the MN extent in one swizzle row
    off = width ? uint32_t(mn % atom) * 2 + uint32_t(mn / atom) * lbo + uint32_t(k % 8) * width + uint32_t(k / 8) * sbo
                : uint32_t(mn % 8) * 2 + uint32_t(mn / 8) * sbo + uint32_t(k % 8) * 16 + uint32_t(k / 8) * lbo;
  }
  const uint32_t addr = swizzled(start + off, width);
  if (uint64_t(addr) + 2 > tl_wgmma.dyn_smem_bytes)
    wgmma_fail(LLK_EMU_MEMORY_FAULT, "wgmma operand outside the launch's dynamic shared memory", in);
  async_proxy_read(addr, 2, "wgmma.mma_async", in.file, in.line);
  uint16_t v;
  memcpy(&v, dyn_smem() + addr, 2);
  return v;
}

inline float wgmma_value(bool bf16, uint16_t bits) {
  if (bf16) {
    __nv_bfloat16 v;
    memcpy(static_cast<void*>(&v), &bits, 2);
    return __bfloat162float(v);
  }
  __half v;
  memcpy(static_cast<void*>(&v), &bits, 2);
  return __half2float(v);
}

// A * B of a formed op, from shared memory (and the A registers) as they are now.
inline void wgmma_compute(WgmmaOp& op) {
  const WgmmaInstr& in = op.in;
  float A[64][16];
  for (int m = 0; m < 64; ++m)
    for (int k = 0; k < 16; ++k) {
      uint16_t bits;
      if (in.a_in_regs) {
        const int w = m / 16, g = m % 8, hi_row = (m % 16) / 8, q = (k % 8) / 2, r = hi_row + 2 * (k / 8);
        const uint32_t reg = op.a_issued[32 * w + 4 * g + q][r];
        bits = uint16_t(k & 1 ? reg >> 16 : reg & 0xffffu);
      } else {
        bits = wgmma_element(in, in.desc_a, in.trans_a, m, k);
      }
      A[m][k] = wgmma_value(in.bf16, bits);
    }
  std::vector<float> B(size_t(16) * size_t(in.n));
  for (int c = 0; c < in.n; ++c)
    for (int k = 0; k < 16; ++k) B[size_t(k) * in.n + c] = wgmma_value(in.bf16, wgmma_element(in, in.desc_b, in.trans_b, c, k));
  op.ab.assign(size_t(64) * size_t(in.n), 0.f);
  for (int m = 0; m < 64; ++m)
    for (int c = 0; c < in.n; ++c) {
      float acc = 0.f;
      for (int k = 0; k < 16; ++k) acc = fmaf(A[m][k], B[size_t(k) * in.n + c], acc);
      op.ab[size_t(m) * in.n + c] = acc;
    }
  op.computed = true;
}

// Writes thread t's share of a completed op into its accumulator registers.
inline void wgmma_land(WgmmaOp& op, int t, bool check_poison) {
  const int n2 = op.in.n / 2, w = t / 32, lane = t % 32, g = lane / 4, q = lane % 4;
  float* d = op.d[t];
  if (op.in.a_in_regs && check_poison && memcmp(op.a_ptr[t], op.a_issued[t], 16) != 0)
    wgmma_fail(LLK_EMU_KERNEL_TRAP,
               "wgmma race: an A-fragment register was written between wgmma.mma_async (this line) and the "
               "wgmma.wait_group that covers it",
               op.in);
  if (!op.computed) wgmma_compute(op);
  for (int i = 0; i < n2; ++i) {
    const int row = 16 * w + g + 8 * ((i >> 1) & 1), col = 8 * (i >> 2) + 2 * q + (i & 1);
    float in_d = op.chained[t] ? d[i] : op.d_in[size_t(t) * n2 + i];
    if (check_poison && !op.chained[t]) {
      uint32_t bits;
      memcpy(&bits, &d[i], 4);
      if (bits != kWgmmaPoison)
        wgmma_fail(LLK_EMU_KERNEL_TRAP,
                   "wgmma race: an accumulator register was written between wgmma.mma_async (this line) and the "
                   "wgmma.wait_group that covers it",
                   op.in);
    }
    d[i] = op.ab[size_t(row) * op.in.n + col] + (op.in.accumulate ? in_d : 0.f);
  }
}

// wgmma.mma_async: the warpgroup meets; each thread records its registers and, at issue timing,
// receives its share of the product when the warpgroup is complete.
inline void wgmma_issue(const WgmmaInstr& in, float* d, const uint32_t* a) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  const int idx = fiber_index(w, f), wg = idx / 128, t = idx % 128;
  if (w->nthreads < 128 * (wg + 1))
    wgmma_fail(LLK_EMU_KERNEL_TRAP, "wgmma.mma_async executed by a partial warpgroup (fewer than 128 threads)", in);
  if (in.n < 8 || in.n > 256 || in.n % 8 != 0) wgmma_fail(LLK_EMU_UNSUPPORTED, "wgmma N must be 8..256, a multiple of 8", in);
  WgmmaThread& me = wgmma_state().threads[size_t(idx)];
  if (!me.fenced)
    wgmma_fail(LLK_EMU_KERNEL_TRAP,
               "wgmma.mma_async without a wgmma.fence since the thread's last wgmma.wait_group (or its start)", in);
  auto& slot = tl_wgmma.forming[size_t(wg)];
  if (!slot) {
    slot = std::make_shared<WgmmaOp>();
    slot->in = in;
    slot->d_in.assign(size_t(128) * size_t(in.n / 2), 0.f);
  } else if (!slot->in.same(in)) {
    char msg[300];
    snprintf(msg, sizeof msg,
             "threads of one warpgroup issue different wgmma.mma_async (shape, operands or descriptors differ; the "
             "first came from line %d)",
             slot->in.line);
    wgmma_fail(LLK_EMU_KERNEL_TRAP, msg, in);
  }
  std::shared_ptr<WgmmaOp> op = slot;
  const bool at_issue = w->cp_async_timing == LLK_EMU_CP_ASYNC_AT_ISSUE;
  bool chained = false;
  for (const WgmmaPending& p : me.pending) {
    if (p.done || p.op->d[t] != d) {
      const float* other = p.op->d[t];
      if (!p.done && d < other + p.op->in.n / 2 && other < d + in.n / 2)
        wgmma_fail(LLK_EMU_UNSUPPORTED, "wgmma accumulators that partly overlap a pending one (not modelled)", in);
      continue;
    }
    if (p.op->in.n != in.n) wgmma_fail(LLK_EMU_UNSUPPORTED, "wgmma chained on one accumulator with two shapes", in);
    chained = true;
  }
  op->d[t] = d;
  op->a_ptr[t] = a;
  if (a) memcpy(op->a_issued[t], a, 16);
  op->chained[t] = chained && !at_issue;
  if (!at_issue && !chained) {
    memcpy(&op->d_in[size_t(t) * (in.n / 2)], d, sizeof(float) * size_t(in.n / 2));
    for (int i = 0; i < in.n / 2; ++i) memcpy(&d[i], &kWgmmaPoison, 4);
  }
  me.pending.push_back({op, me.group, false});
  f->state = WAIT_WARP;
  if (++op->arrived == 128) {
    slot = nullptr;
    if (at_issue) wgmma_compute(*op);
    release_warpgroup(w, wg);
  }
  yield_to_scheduler(w, f);
  if (at_issue) {
    memcpy(&op->d_in[size_t(t) * (in.n / 2)], d, sizeof(float) * size_t(in.n / 2));
    wgmma_land(*op, t, false);
    me.pending.back().done = true;
  }
}

inline void wgmma_fence() { wgmma_state().threads[size_t(fiber_index(tl_worker, tl_worker->cur))].fenced = true; }
inline void wgmma_commit() { wgmma_state().threads[size_t(fiber_index(tl_worker, tl_worker->cur))].group++; }

// wgmma.wait_group n: completes, in issue order, this thread's share of every op in a committed
// group but the newest n. When one is still in flight the thread first yields, so that the
// product reads its operands as late as the wait allows: after whatever other threads do in
// between (a stage released to the producer before the wait is refilled first, and the product
// then reads the new tile).
inline void wgmma_wait(int n) {
  Worker* w = tl_worker;
  Fiber* f = w->cur;
  const int t = fiber_index(w, f);
  WgmmaThread& me = wgmma_state().threads[size_t(t)];
  const int limit = me.group - n;
  for (const WgmmaPending& p : me.pending) {
    if (p.group < limit && !p.done) {
      yield_to_scheduler(w, f);
      break;
    }
  }
  size_t keep = 0;
  bool retired = false;
  for (size_t i = 0; i < me.pending.size(); ++i) {
    WgmmaPending& p = me.pending[i];
    if (p.group < limit) {
      if (!p.done) wgmma_land(*p.op, t % 128, true);
      retired = true;
    } else {
      me.pending[keep++] = p;
    }
  }
  me.pending.resize(keep);
  if (retired) me.fenced = false;
}

// At a thread's exit: every wgmma it issued must have been waited for.
inline void wgmma_thread_exit(Worker* w, Fiber* f) {
  if (!tl_wgmma.used) return;
  const WgmmaThread& me = tl_wgmma.threads[size_t(fiber_index(w, f))];
  if (!me.pending.empty())
    wgmma_fail(LLK_EMU_KERNEL_TRAP,
               "thread exited with wgmma.mma_async operations not waited for (no covering wgmma.wait_group)",
               me.pending.front().op->in);
}

}  // namespace llk_emu
