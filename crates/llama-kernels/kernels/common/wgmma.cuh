// wgmma.cuh -- the warpgroup MMA of sm_90a (wgmma.mma_async) and its matrix descriptors.
//
// A warpgroup (four consecutive warps, 128 threads) computes D (64 x N, f32) = A (64 x 16) * B
// (16 x N) + D asynchronously: A from a shared-memory descriptor or from four registers per
// thread, B from a descriptor. The kernel fences its registers (wgmma_fence), issues one or more
// wgmma_ss / wgmma_rs, closes them into a group (wgmma_commit) and waits for all but the newest
// n groups (wgmma_wait<n>) before it touches the accumulators or the A registers again.
//
// Layouts, from the PTX ISA (thread t of the warpgroup, w = t / 32, g = (t % 32) / 4, q = t % 4):
//   d[i]  = D[16 w + g + 8 ((i >> 1) & 1)][8 (i >> 2) + 2 q + (i & 1)],  i < N / 2
//   a[r]  = A[16 w + g + 8 (r & 1)][2 q + 8 (r >> 1) + {0, 1}]            (low half first)
//   shared memory: "core matrices" of 8 rows x 16 bytes, described by wgmma_desc() below.
//
// Three branches, as in ptx.cuh: the instruction on sm_90a (__CUDA_ARCH_FEAT_SM90_ALL); a trap
// on other device targets (sm_80, plain sm_90: the instruction does not exist there); the
// emulation runtime's model on the host (kernels/emu/emu_wgmma.h, which documents what it
// models and what not).
#pragma once
#include "async_proxy.cuh"

namespace llk {

// The swizzle of a descriptor operand, with the descriptor's own encoding (bits 62-63).
enum class WgmmaSwizzle : uint64_t { None = 0, B128 = 1, B64 = 2, B32 = 3 };

// The 64-bit matrix descriptor of an operand at `smem` (16-byte aligned; a swizzled tile at a
// multiple of its pattern, 8 rows x the swizzle width, as the base offset is left 0). In bytes:
//   K-major,  no swizzle: lbo = from k 0-7 to k 8-15, sbo = from rows 0-7 to rows 8-15
//   K-major,  swizzled:   lbo unused, sbo = from rows 0-7 to rows 8-15 (8 x the row pitch)
//   MN-major, no swizzle: lbo = from k 0-7 to k 8-15, sbo = from mn 0-7 to mn 8-15
//   MN-major, swizzled:   lbo = from one swizzle-width run of mn to the next, sbo = from k 0-7
//                         to k 8-15
__device__ __forceinline__ uint64_t wgmma_desc(const void* smem, uint32_t lbo, uint32_t sbo, WgmmaSwizzle swizzle) {
  auto enc = [](uint32_t x) { return uint64_t((x & 0x3ffffu) >> 4); };
  return enc(smem_address(smem)) | enc(lbo) << 16 | enc(sbo) << 32 | uint64_t(swizzle) << 62;
}

// The descriptor of the same operand layout `bytes` further on (a 16-byte multiple): the start
// address field (bits 0-13, in 16-byte units) advanced. Shared memory ends below 256 KiB, so the
// field never carries into the bits above it.
__device__ __forceinline__ uint64_t wgmma_desc_advance(uint64_t desc, uint32_t bytes) { return desc + (bytes >> 4); }

// Keeps the compiler from moving accesses of a register operand across a wgmma fence, commit or
// wait (CUDA; CUTLASS's warpgroup_fence_operand): the register is "read and written" by an empty
// asm. Arrays, nested or not, element by element. Nothing on the host, whose emulated wgmma runs
// in program order.
__device__ __forceinline__ void wgmma_fence_operand(float& r) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+f"(r)::"memory");
#else
  (void)r;
#endif
}
__device__ __forceinline__ void wgmma_fence_operand(uint32_t& r) {
#if defined(__CUDA_ARCH__)
  asm volatile("" : "+r"(r)::"memory");
#else
  (void)r;
#endif
}
template <class R, int K>
__device__ __forceinline__ void wgmma_fence_operand(R (&d)[K]) {
#pragma unroll
  for (int i = 0; i < K; ++i) wgmma_fence_operand(d[i]);
}

// wgmma.fence, after the register operands passed (the accumulators and the A fragments the next
// wgmmas read) are fenced: their last writes stay before it.
template <class... Regs>
__device__ __forceinline__ void wgmma_fence(Regs&... regs) {
  (wgmma_fence_operand(regs), ...);
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::wgmma_fence();
#endif
}

// wgmma.commit_group; the register operands passed are fenced after it (no access of them moves
// above the issue).
template <class... Regs>
__device__ __forceinline__ void wgmma_commit(Regs&... regs) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::wgmma_commit();
#endif
  (wgmma_fence_operand(regs), ...);
}

// wgmma.wait_group N; the register operands passed are fenced after it (no access of them moves
// above the wait).
template <int N, class... Acc>
__device__ __forceinline__ void wgmma_wait(Acc&... acc) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#elif !defined(__CUDACC__)
  llk_emu::wgmma_wait(N);
#endif
  (wgmma_fence_operand(acc), ...);
}

// Inline PTX numbers its operands, so each N has its register list written out.
#define LLK_WGMMA_F4(d, i) "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3])
#define LLK_WGMMA_F8(d, i) LLK_WGMMA_F4(d, i), LLK_WGMMA_F4(d, i + 4)
#define LLK_WGMMA_F12(d, i) LLK_WGMMA_F8(d, i), LLK_WGMMA_F4(d, i + 8)
#define LLK_WGMMA_F16(d, i) LLK_WGMMA_F8(d, i), LLK_WGMMA_F8(d, i + 8)
#define LLK_WGMMA_F32(d, i) LLK_WGMMA_F16(d, i), LLK_WGMMA_F16(d, i + 16)
#define LLK_WGMMA_F64(d, i) LLK_WGMMA_F32(d, i), LLK_WGMMA_F32(d, i + 32)
#define LLK_WGMMA_F128(d, i) LLK_WGMMA_F64(d, i), LLK_WGMMA_F64(d, i + 64)
#define LLK_WGMMA_D8 "{"  \
  "%0,%1,%2,%3"  \
  "}"
#define LLK_WGMMA_D16 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7"  \
  "}"
#define LLK_WGMMA_D24 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11"  \
  "}"
#define LLK_WGMMA_D32 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15"  \
  "}"
#define LLK_WGMMA_D64 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31"  \
  "}"
#define LLK_WGMMA_D128 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63"  \
  "}"
#define LLK_WGMMA_D256 "{"  \
  "%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"  \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"  \
  "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"  \
  "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63,"  \
  "%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%77,%78,%79,"  \
  "%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%92,%93,%94,%95,"  \
  "%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,%106,%107,%108,%109,%110,%111,"  \
  "%112,%113,%114,%115,%116,%117,%118,%119,%120,%121,%122,%123,%124,%125,%126,%127"  \
  "}"

// X(N, accumulator operands, their list, then the indexes of the operands that follow them)
#define LLK_WGMMA_SHAPES(X) \
  X(8, LLK_WGMMA_F4, LLK_WGMMA_D8, 4, 5, 6, 7, 8, 9, 10) \
  X(16, LLK_WGMMA_F8, LLK_WGMMA_D16, 8, 9, 10, 11, 12, 13, 14) \
  X(24, LLK_WGMMA_F12, LLK_WGMMA_D24, 12, 13, 14, 15, 16, 17, 18) \
  X(32, LLK_WGMMA_F16, LLK_WGMMA_D32, 16, 17, 18, 19, 20, 21, 22) \
  X(64, LLK_WGMMA_F32, LLK_WGMMA_D64, 32, 33, 34, 35, 36, 37, 38) \
  X(128, LLK_WGMMA_F64, LLK_WGMMA_D128, 64, 65, 66, 67, 68, 69, 70) \
  X(256, LLK_WGMMA_F128, LLK_WGMMA_D256, 128, 129, 130, 131, 132, 133, 134)

// The descriptor-descriptor form: operands d..., desc_a (i0), desc_b (i1), scale-d (i2),
// trans-a (i3), trans-b (i4).
#define LLK_WGMMA_SS_ASM(N, F, D, i0, i1, i2, i3, i4, i5, i6, ty)                                             \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #i2 ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." ty \
               "." ty " " D ", %" #i0 ", %" #i1 ", p, 1, 1, %" #i3 ", %" #i4 ";\n}\n"                             \
               : F(d, 0)                                                                                       \
               : "l"(desc_a), "l"(desc_b), "r"(int(accumulate)), "n"(int(TRANS_A)), "n"(int(TRANS_B)))
// The register-descriptor form: operands d..., a[0..3] (i0..i3), desc_b (i4), scale-d (i5),
// trans-b (i6).
#define LLK_WGMMA_RS_ASM(N, F, D, i0, i1, i2, i3, i4, i5, i6, ty)                                                \
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #i5 ", 0;\nwgmma.mma_async.sync.aligned.m64n" #N "k16.f32." ty \
               "." ty " " D ", {%" #i0 ", %" #i1 ", %" #i2 ", %" #i3 "}, %" #i4 ", p, 1, 1, %" #i6 ";\n}\n"           \
               : F(d, 0)                                                                                          \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(int(accumulate)), "n"(int(TRANS_B)))

template <class T>
constexpr bool is_wgmma_type = std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value;
template <int N>
constexpr bool is_wgmma_n = N == 8 || N == 16 || N == 24 || N == 32 || N == 64 || N == 128 || N == 256;

namespace detail {
// One issue of either form: `a` is the A fragment (RS) or null (SS, A from desc_a).
template <class T, int N, bool RS, bool TRANS_A, bool TRANS_B>
__device__ __forceinline__ void wgmma_async(float (&d)[N / 2], const uint32_t* a, uint64_t desc_a, uint64_t desc_b,
                                            bool accumulate, const char* call_file, int call_line) {
  static_assert(is_wgmma_type<T>, "wgmma: bf16 or f16 operands");
  static_assert(is_wgmma_n<N>, "wgmma: N is one of the shapes LLK_WGMMA_SHAPES lists");
  constexpr bool bf16 = std::is_same<T, __nv_bfloat16>::value;
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  (void)call_file, (void)call_line;
#define LLK_WGMMA_CASE(N_, F, D, i0, i1, i2, i3, i4, i5, i6)              \
  if constexpr (N == N_) {                                               \
    if constexpr (RS && bf16)                                            \
      LLK_WGMMA_RS_ASM(N_, F, D, i0, i1, i2, i3, i4, i5, i6, "bf16");    \
    else if constexpr (RS)                                               \
      LLK_WGMMA_RS_ASM(N_, F, D, i0, i1, i2, i3, i4, i5, i6, "f16");     \
    else if constexpr (bf16)                                             \
      LLK_WGMMA_SS_ASM(N_, F, D, i0, i1, i2, i3, i4, i5, i6, "bf16");    \
    else                                                                 \
      LLK_WGMMA_SS_ASM(N_, F, D, i0, i1, i2, i3, i4, i5, i6, "f16");     \
  }
  LLK_WGMMA_SHAPES(LLK_WGMMA_CASE)
#undef LLK_WGMMA_CASE
#elif defined(__CUDA_ARCH__)
  (void)d, (void)a, (void)desc_a, (void)desc_b, (void)accumulate, (void)call_file, (void)call_line, (void)bf16;
  __trap();
#elif !defined(__CUDACC__)
  const llk_emu::WgmmaInstr in{N, bf16, RS, TRANS_A, TRANS_B, accumulate, desc_a, desc_b, call_file, call_line};
  llk_emu::wgmma_issue(in, d, a);
#endif
}
}  // namespace detail

// D = A * B (+ D if `accumulate`), A and B from shared-memory descriptors; TRANS_A / TRANS_B
// select M-major / N-major operands (K-major when false).
template <class T, int N, bool TRANS_A, bool TRANS_B>
__device__ __forceinline__ void wgmma_ss(float (&d)[N / 2], uint64_t desc_a, uint64_t desc_b,
                                         bool accumulate LLK_CALL_SITE) {
  detail::wgmma_async<T, N, false, TRANS_A, TRANS_B>(d, nullptr, desc_a, desc_b, accumulate, LLK_CALL_SITE_ARGS);
}

// D = A * B (+ D if `accumulate`), A from registers (the fragment above), B from a descriptor.
template <class T, int N, bool TRANS_B>
__device__ __forceinline__ void wgmma_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t desc_b,
                                         bool accumulate LLK_CALL_SITE) {
  detail::wgmma_async<T, N, true, false, TRANS_B>(d, a, 0, desc_b, accumulate, LLK_CALL_SITE_ARGS);
}

}  // namespace llk
