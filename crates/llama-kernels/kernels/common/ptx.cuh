// ptx.cuh -- warp-level PTX the tensor-core kernels use, each with three branches:
//
//   __CUDA_ARCH__      the real instruction (inline PTX);
//   host (emulated)    the instruction rebuilt from the fragment layouts documented in the PTX ISA
//                      ("Matrix fragments for mma.m16n8k16", "Warp-level matrix load
//                      instruction: ldmatrix", "cp.async"), exchanging registers through the
//                      emulator's warp rendezvous;
//   nvcc host pass     nothing (the function is never called there).
//
// Notation for the fragment layouts: lane l of the warp, g = l >> 2 ("group"), t = l & 3
// ("thread in group"). Two 16-bit values share a 32-bit register, the lower column (or k) in the
// low half.
//
// The emulated branches are checked against scalar computations in the test suite, and against
// the hardware instructions by the GPU script (selftest kernels run on both targets).
#pragma once
#include "llk.cuh"

namespace llk {

// --------------------------------------------------------------------------------------------
// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: D = A * B + C with
//   A 16x16 (row-major), B 16x8 (column-major: stored as 8 rows of 16 k), C, D 16x8 f32.
// Fragments (PTX ISA, m16n8k16 with .bf16/.f16):
//   a[0] = A[g][2t, 2t+1]   a[1] = A[g+8][2t, 2t+1]   a[2] = A[g][2t+8, 2t+9]   a[3] = A[g+8][2t+8, 2t+9]
//   b[0] = B[2t, 2t+1][g]   b[1] = B[2t+8, 2t+9][g]
//   c[0], c[1] = C[g][2t, 2t+1]                      c[2], c[3] = C[g+8][2t, 2t+1]
// The emulation computes the 16x8 product A * B once per warp (the first lane to resume after the
// rendezvous; the others reuse it), accumulating the 16 exact products in k order with f32 fmas,
// then each lane adds its own c. The hardware's summation order and internal precision differ by
// a few f32 ulps: compare with tolerances.
#ifndef __CUDA_ARCH__
namespace emu_detail {
template <class T>
inline float half_of(uint32_t r, int hi) {
  const uint16_t bits = uint16_t(hi ? (r >> 16) : (r & 0xffffu));
  T v;
  memcpy(static_cast<void*>(&v), &bits, 2);
  return to_f32(v);
}
}  // namespace emu_detail
#endif

template <class T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                             const float (&c)[4]) {
  static_assert(std::is_same<T, __nv_bfloat16>::value || std::is_same<T, __half>::value, "bf16 or f16");
#if defined(__CUDA_ARCH__)
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
          "f"(c[3]));
  }
#elif !defined(__CUDACC__)
  struct Frag {
    uint32_t a[4], b[2];
  } mine{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}};
  const unsigned char* all = llk_emu::warp_gather(&mine, sizeof mine);
  float* ab = llk_emu::warp_scratch();  // [16][8] A * B, shared by the warp for this operation
  if (llk_emu::warp_scratch_first()) {
    auto frag = [&](int lane) { return reinterpret_cast<const Frag*>(all + 64 * lane); };
    float A[16][16], B[16][8];
    for (int lane = 0; lane < 32; ++lane) {  // scatter every lane's registers back into A and B
      const int g = lane >> 2, t = lane & 3;
      for (int reg = 0; reg < 4; ++reg)
        for (int h = 0; h < 2; ++h)
          A[g + 8 * (reg & 1)][2 * t + h + 8 * (reg >> 1)] = emu_detail::half_of<T>(frag(lane)->a[reg], h);
      for (int reg = 0; reg < 2; ++reg)
        for (int h = 0; h < 2; ++h) B[2 * t + h + 8 * reg][g] = emu_detail::half_of<T>(frag(lane)->b[reg], h);
    }
    for (int row = 0; row < 16; ++row)
      for (int col = 0; col < 8; ++col) {
        float acc = 0.f;
        for (int k = 0; k < 16; ++k) acc = fmaf(A[row][k], B[k][col], acc);
        ab[row * 8 + col] = acc;
      }
  }
  const int lane = llk_emu::lane_id(), g = lane >> 2, t = lane & 3;
  float out[4];
  for (int i = 0; i < 4; ++i) out[i] = ab[(g + (i >= 2 ? 8 : 0)) * 8 + 2 * t + (i & 1)] + c[i];
  for (int i = 0; i < 4; ++i) d[i] = out[i];
#endif
}

// --------------------------------------------------------------------------------------------
// ldmatrix.sync.aligned.m8n8.{x1,x2,x4}[.trans].shared.b16: loads N 8x8 matrices of 16-bit
// elements from shared memory. Lanes 8j..8j+7 give the addresses of rows 0..7 of matrix j (16
// contiguous bytes each; only lanes < 8N are read). Register j of lane l receives, of matrix j:
//   plain:  M[l >> 2][2 (l & 3)], M[l >> 2][2 (l & 3) + 1]
//   .trans: M[2 (l & 3)][l >> 2], M[2 (l & 3) + 1][l >> 2]
template <int N, bool TRANS>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* smem_row) {
  static_assert(N == 1 || N == 2 || N == 4, "ldmatrix loads 1, 2 or 4 matrices");
#if defined(__CUDA_ARCH__)
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(smem_row));
  if constexpr (N == 1 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
  } else if constexpr (N == 1 && TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(addr) : "memory");
  } else if constexpr (N == 2 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
  } else if constexpr (N == 2 && TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr)
                 : "memory");
  } else if constexpr (N == 4 && !TRANS) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  }
#elif !defined(__CUDACC__)
  // The instruction reads all 8N rows at once: the first lane to resume copies them (8N x 16
  // bytes <= 512, the warp's scratch), so a later write by some lane cannot leak into the loaded
  // fragments of lanes that resume after it. Each lane whose address is used checks that its row
  // is 16-byte aligned, as the instruction requires.
  if (llk_emu::lane_id() < 8 * N) llk_emu::check_align16(smem_row, "ldmatrix row address");
  const unsigned char* all = llk_emu::warp_gather(&smem_row, sizeof(void*));
  unsigned char* rows = reinterpret_cast<unsigned char*>(llk_emu::warp_scratch());
  if (llk_emu::warp_scratch_first()) {
    for (int i = 0; i < 8 * N; ++i) {
      const unsigned char* p;
      memcpy(&p, all + 64 * i, sizeof p);
      memcpy(rows + 16 * i, p, 16);
    }
  }
  auto row_ptr = [&](int matrix, int row) { return rows + 16 * (matrix * 8 + row); };
  const int lane = llk_emu::lane_id();
  for (int j = 0; j < N; ++j) {
    uint16_t lo, hi;
    if constexpr (!TRANS) {
      const unsigned char* p = row_ptr(j, lane >> 2);
      memcpy(&lo, p + 4 * (lane & 3), 2);
      memcpy(&hi, p + 4 * (lane & 3) + 2, 2);
    } else {
      memcpy(&lo, row_ptr(j, 2 * (lane & 3)) + 2 * (lane >> 2), 2);
      memcpy(&hi, row_ptr(j, 2 * (lane & 3) + 1) + 2 * (lane >> 2), 2);
    }
    r[j] = uint32_t(lo) | (uint32_t(hi) << 16);
  }
#endif
}

// --------------------------------------------------------------------------------------------
// cp.async.cg.shared.global [dst], [src], 16, src_bytes: copies src_bytes (0..16) from global to
// shared memory and zero-fills the rest of the 16 bytes, asynchronously; a group of copies is
// closed by cp_async_commit() and awaited by cp_async_wait<N>() (all but the newest N groups).
// With src_bytes == 0 nothing is read (src must still be a valid address). Every asm here
// clobbers "memory", so the compiler never moves plain shared-memory accesses across them. The emulation
// performs the copies at the wait, the latest moment the PTX ISA allows, so a read before the
// wait sees poison, not data, and reports a source or destination that is not 16-byte aligned.
__device__ __forceinline__ void cp_async_16(void* smem_dst, const void* gmem_src, int src_bytes = 16) {
#if defined(__CUDA_ARCH__)
  const uint32_t addr = uint32_t(__cvta_generic_to_shared(smem_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(addr), "l"(gmem_src), "r"(src_bytes) : "memory");
#elif !defined(__CUDACC__)
  llk_emu::cp_async_enqueue(smem_dst, gmem_src, 16, src_bytes);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#elif !defined(__CUDACC__)
  llk_emu::cp_async_commit();
#endif
}

template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__)
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#elif !defined(__CUDACC__)
  llk_emu::cp_async_wait(N);
#endif
}

// Two f32 values to one register of two T (round to nearest even), low half first.
template <class T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  return pack2(lo, hi, T());
}

}  // namespace llk
