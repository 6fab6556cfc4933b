// selftest.cu -- kernels that test the emulation runtime itself.
//
// Each one exercises a piece of the CUDA execution model that the emulator must reproduce:
// barriers, warp shuffles and votes, dynamic shared memory, atomics. The PLANTED_BUG variants
// carry a classic bug (a missing __syncthreads, a lane that skips a shuffle, threads split across
// two barriers) that the emulator must catch: as a difference between schedules, or as a named
// error instead of a hang. They run on the GPU too, where the CORRECT variants must agree with
// the emulated results (the PLANTED_BUG variants are never launched there).
#include "common/llk.cuh"
#include "common/ptx.cuh"
#include "common/fp8.cuh"
#include "common/mbarrier.cuh"
#include "common/tma.cuh"
#include "common/warp_specialize.cuh"
#include "common/wgmma.cuh"

namespace {

constexpr int kBlock = 256;

// out[i] = in[i-1] + in[i] + in[i+1] through shared memory; the bug drops the barrier between
// the shared-memory writes and the neighbours' reads.
__device__ void stencil_kernel(const SelftestParams& p) {
  __shared__ float tile[kBlock + 2];
  const float* in = reinterpret_cast<const float*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  const int t = int(threadIdx.x);
  const int64_t g = int64_t(blockIdx.x) * kBlock + t;
  tile[t + 1] = g < p.n ? in[g] : 0.f;
  if (t == 0) tile[0] = g > 0 && g - 1 < p.n ? in[g - 1] : 0.f;
  if (t == kBlock - 1) tile[kBlock + 1] = g + 1 < p.n ? in[g + 1] : 0.f;
  if (p.variant == LLK_SELFTEST_CORRECT) __syncthreads();
  if (g < p.n) out[g] = tile[t] + tile[t + 1] + tile[t + 2];
}

// Lane 0 of warp 0 shuffles while every other thread waits at the barrier (bug), or every lane
// shuffles first (correct). out[i] = the value each thread ends with.
__device__ void deadlock_kernel(const SelftestParams& p) {
  float* out = reinterpret_cast<float*>(p.out);
  float v = float(threadIdx.x);
  if (p.variant == LLK_SELFTEST_CORRECT || threadIdx.x == 0) v = __shfl_xor_sync(0xffffffffu, v, 1);
  __syncthreads();
  if (threadIdx.x < p.n) out[threadIdx.x] = v;
}

// Half the block waits at one __syncthreads and half at another (bug).
__device__ void divergent_barrier_kernel(const SelftestParams& p) {
  float* out = reinterpret_cast<float*>(p.out);
  if (p.variant == LLK_SELFTEST_PLANTED_BUG && threadIdx.x < blockDim.x / 2) {
    __syncthreads();
  } else {
    __syncthreads();
  }
  if (threadIdx.x < p.n) out[threadIdx.x] = 1.f;
}

// Every warp primitive, packed into one int per thread:
//   out[8 t + 0..7] = shfl(idx 3), shfl_xor(5), shfl_up(2), shfl_down(7), shfl width 8 (src 1),
//                     ballot(lane odd), any(lane == 31), all(lane < 32)
__device__ void warp_ops_kernel(const SelftestParams& p) {
  int* out = reinterpret_cast<int*>(p.out);
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int lane = int(threadIdx.x & 31);
  const int v = t * 10;
  int r[8];
  r[0] = __shfl_sync(0xffffffffu, v, 3);
  r[1] = __shfl_xor_sync(0xffffffffu, v, 5);
  r[2] = __shfl_up_sync(0xffffffffu, v, 2);
  r[3] = __shfl_down_sync(0xffffffffu, v, 7);
  r[4] = __shfl_sync(0xffffffffu, v, 1, 8);
  r[5] = int(__ballot_sync(0xffffffffu, lane & 1));
  r[6] = __any_sync(0xffffffffu, lane == 31);
  r[7] = __all_sync(0xffffffffu, lane < 32);
  if (8 * int64_t(t) + 7 < p.n)
    for (int i = 0; i < 8; ++i) out[8 * t + i] = r[i];
}

// Dynamic shared memory: each block reverses its slice of `in` through a dynamic buffer of
// blockDim.x floats: out[b * nb + t] = in[b * nb + nb - 1 - t].
__device__ void dyn_smem_kernel(const SelftestParams& p) {
  LLK_DYN_SMEM(raw);
  float* buf = reinterpret_cast<float*>(raw);
  const float* in = reinterpret_cast<const float*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  const int t = int(threadIdx.x), nb = int(blockDim.x);
  const int64_t g = int64_t(blockIdx.x) * nb + t;
  buf[t] = g < p.n ? in[g] : 0.f;
  __syncthreads();
  const int64_t src = int64_t(blockIdx.x) * nb + (nb - 1 - t);
  if (g < p.n && src < p.n) out[g] = buf[nb - 1 - t];
}

// A declared layout: the block reverses `in` through the LLK_DECLARED_SMEM_TEST_BYTES of dynamic
// shared memory its row declares: out[t] = in[block - 1 - t]. The planted bug writes one float
// past the declaration, which the emulator reports.
__device__ void declared_smem_kernel(const SelftestParams& p) {
  LLK_DYN_SMEM(raw);
  float* buf = reinterpret_cast<float*>(raw);
  const float* in = reinterpret_cast<const float*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  const int t = int(threadIdx.x), nb = int(blockDim.x);
  buf[t] = in[t];
  if (p.variant == LLK_SELFTEST_PLANTED_BUG && t == 0) buf[LLK_DECLARED_SMEM_TEST_BYTES / 4] = 1.f;
  __syncthreads();
  out[t] = buf[nb - 1 - t];
}

// Atomics: every thread adds its index into out[0] (as int) and counts itself into out[1].
__device__ void atomics_kernel(const SelftestParams& p) {
  int* out = reinterpret_cast<int*>(p.out);
  const int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (g < p.n) {
    atomicAdd(&out[0], int(g));
    atomicAdd(&out[1], 1);
  }
}

// Shuffle edge cases, as the PTX ISA defines them (b is taken mod 32; a butterfly may reach an
// earlier segment; out-of-segment sources read their own value). One warp per 32 threads;
// out[6 t + 0..5] = xor(8, width 8), down(33), up(2, width 16), idx(35, width 8),
//                   xor(16, width 8), down(3, width 4).
__device__ void shfl_edges_kernel(const SelftestParams& p) {
  int* out = reinterpret_cast<int*>(p.out);
  const int t = int(blockIdx.x * blockDim.x + threadIdx.x);
  const int v = 100 + t;
  int r[6];
  r[0] = __shfl_xor_sync(0xffffffffu, v, 8, 8);
  r[1] = __shfl_down_sync(0xffffffffu, v, 33);
  r[2] = __shfl_up_sync(0xffffffffu, v, 2, 16);
  r[3] = __shfl_sync(0xffffffffu, v, 35, 8);
  r[4] = __shfl_xor_sync(0xffffffffu, v, 16, 8);
  r[5] = __shfl_down_sync(0xffffffffu, v, 3, 4);
  if (6 * int64_t(t) + 5 < p.n)
    for (int i = 0; i < 6; ++i) out[6 * t + i] = r[i];
}

// Emulator guards, each with a planted bug (never launched on a GPU). Blocks of 64 threads (two
// warps); out[threadIdx.x] is written by every thread, after a barrier; p.n picks the guard:
//  1: dynamic shared memory: a block writes one float past what it was launched with (bug);
//  2: warp operations: half a warp shuffles while the other half votes (bug);
//  3: a static __shared__ array: thread 0 writes one element past its end (bug);
//  4: params: thread 0 reads the byte right after its params struct (bug);
//  5: a 16-byte vector load (llk::load_f32) 4 bytes past 16-byte alignment (bug);
//  6: a 16-byte vector store (llk::store_f32) 4 bytes past 16-byte alignment (bug);
//  7: cp.async to a shared address 4 bytes past 16-byte alignment (bug);
//  8: cp.async from a global address 4 bytes past 16-byte alignment (bug);
//  9: ldmatrix with lane 3's row address 2 bytes past 16-byte alignment (bug);
// 10: a local array indexed one past its end (bug).
// Each bug is one thread's: thread 0 (lane 3 for ldmatrix), which is what the reports name.
__device__ void guards_kernel(const SelftestParams& p) {
  float* out = reinterpret_cast<float*>(p.out);
  const bool bug = p.variant == LLK_SELFTEST_PLANTED_BUG;
  const int t = int(threadIdx.x), lane = t & 31;
  const int off = bug && t == 0 ? 1 : 0;  // elements of 4 bytes off alignment (or past the end)
  __shared__ __align__(16) float s[32 * 4 + 4];
  __shared__ __align__(16) __nv_bfloat16 m[8 * 8 + 8];
  float v = 0.f;
  if (p.n == 1) {
    LLK_DYN_SMEM(raw);
    float* buf = reinterpret_cast<float*>(raw);
    buf[t] = float(t);
    if (bug && t == 0) buf[blockDim.x] = 1.f;  // one past the launch's blockDim.x floats
    __syncthreads();
    v = buf[blockDim.x - 1 - t];
  } else if (p.n == 2) {
    if (!bug || (t & 31) < 16) v = __shfl_xor_sync(0xffffffffu, float(t), 1);
    else v = float(__ballot_sync(0xffffffffu, 1) & 1);
  } else if (p.n == 3) {
    __shared__ float tile[64];
    tile[(t & 63) + 64 * off] = float(t);  // thread 0 of the bug: tile[64]
    __syncthreads();
    v = tile[63 - (t & 63)];
  } else if (p.n == 4) {
    const volatile unsigned char* bytes = reinterpret_cast<const volatile unsigned char*>(&p);
    v = float(bytes[sizeof(SelftestParams) - 1 + off]);  // the last byte, or (bug) the one after it
  } else if (p.n == 10) {
    float local[4] = {1.f, 2.f, 3.f, float(t)};
    v = local[(t & 3) + 4 * off];  // thread 0 of the bug: local[4]
  } else {
    for (int i = t; i < 32 * 4 + 4; i += int(blockDim.x)) s[i] = float(i);
    for (int i = t; i < 8 * 8 + 8; i += int(blockDim.x)) m[i] = llk::from_f32<__nv_bfloat16>(float(i));
    __syncthreads();
    if (t < 32) {
      float x[4] = {0.f, 0.f, 0.f, 0.f};
      if (p.n == 5) {
        llk::load_f32<float, 4>(s + 4 * lane + off, x);
      } else if (p.n == 6) {
        x[0] = x[1] = x[2] = x[3] = float(t);
        llk::store_f32<float, 4>(s + 4 * lane + off, x);
      } else if (p.n == 7 || p.n == 8) {
        if (lane < 16) {  // out[4 lane .. 4 lane + 4) of the 64 floats of out, into s
          llk::cp_async_16(s + 4 * lane + (p.n == 7 ? off : 0), out + 4 * lane + (p.n == 8 ? off : 0));
        }
        llk::cp_async_commit();
        llk::cp_async_wait<0>();
      } else {
        uint32_t r[1];
        const int bad = bug && lane == 3 ? 1 : 0;  // one bf16 element: 2 bytes off
        llk::ldmatrix<1, false>(r, m + 8 * (lane & 7) + bad);
        x[0] = float(r[0] & 0xffffu);
      }
      v = x[0] + x[1] + x[2] + x[3];
    }
    __syncthreads();
    if (t < 32) v += s[4 * lane];
  }
  __syncthreads();
  out[t] = v;
}

// The approximations with .ftz and the explicitly rounded operations, on both targets: input
// f32 [x: n | c: n], out f32 [3][n] = fast_exp2(x), fast_rcp(x), __fadd_rn(__fmul_rn(x, x), c).
// The tests feed the special cases the PTX ISA defines exactly (zeros, subnormals, infinities,
// results that flush) and products whose fma would round differently.
__device__ void fast_math_kernel(const SelftestParams& p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const float* in = reinterpret_cast<const float*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  const float x = in[i], c = in[p.n + i];
  out[i] = llk::fast_exp2(x);
  out[p.n + i] = llk::fast_rcp(x);
  out[2 * p.n + i] = __fadd_rn(__fmul_rn(x, x), c);
}

// The byte permutes and the 16-bit pair addition the packed GEMVs build their operands with: for
// i < n, with x, y, s the bits of in[3i], in[3i + 1], in[3i + 2], out[3i] = __byte_perm(x, y, s &
// 0x7777), out[3i + 1] = the bf16 pair sum of x and y (bits, as f32 words) and out[3i + 2] =
// llk::prmt(x, y, s) (bit 3 of a selector nibble replicates the byte's sign).
__device__ void byte_perm_kernel(const SelftestParams& p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= p.n) return;
  const float* in = reinterpret_cast<const float*>(p.input);
  uint32_t* out = reinterpret_cast<uint32_t*>(p.out);
  const uint32_t x = __float_as_uint(in[3 * i]), y = __float_as_uint(in[3 * i + 1]), s = __float_as_uint(in[3 * i + 2]);
  out[3 * i] = __byte_perm(x, y, s & 0x7777u);
  __nv_bfloat162 a, b;
  memcpy(static_cast<void*>(&a), &x, 4);
  memcpy(static_cast<void*>(&b), &y, 4);
  const __nv_bfloat162 r = __hadd2(a, b);
  memcpy(&out[3 * i + 1], &r, 4);
  out[3 * i + 2] = llk::prmt(x, y, s);
}

// out[i] = 1 for i < n: a kernel whose __launch_bounds__ (128 threads) a launch can exceed.
__device__ void bounded_fill_kernel(const SelftestParams& p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.n) reinterpret_cast<float*>(p.out)[i] = 1.f;
}

// Always a planted bug (emulated only): each thread needs a 96 KiB local array, more than the
// fibers' 64 KiB stacks. The emulator must report the overflow, not crash or corrupt a neighbour.
__device__ void stack_hog_kernel(const SelftestParams& p) {
  volatile float local[96 * 1024 / 4];  // volatile: the array really lives on the stack
  for (int i = 0; i < 96 * 1024 / 4; ++i) local[i] = float(i + int(threadIdx.x));
  float acc = 0.f;
  for (int i = 0; i < 96 * 1024 / 4; i += 97) acc += local[i];
  reinterpret_cast<float*>(p.out)[threadIdx.x] = acc;
}

// ------------------------------------------------------------------ PTX wrapper fidelity
// One warp. Fragments are built straight from global memory with the layouts documented in
// ptx.cuh (not through ldmatrix), so the hardware result checks those layouts and the emulated
// result checks the emulation: input f32 [A 16x16 | B^T 8x16 | C 16x8] (values exact in T),
// out f32 [D 16x8].
template <class T>
__device__ void mma_kernel(const SelftestParams& p) {
  const float* A = reinterpret_cast<const float*>(p.input);
  const float* Bt = A + 256;  // Bt[n][k] = B[k][n]
  const float* C = A + 384;
  float* D = reinterpret_cast<float*>(p.out);
  const int lane = int(threadIdx.x & 31), g = lane >> 2, t = lane & 3;
  auto pk = [](float lo, float hi) { return llk::pack_pair<T>(lo, hi); };
  const uint32_t a[4] = {pk(A[g * 16 + 2 * t], A[g * 16 + 2 * t + 1]), pk(A[(g + 8) * 16 + 2 * t], A[(g + 8) * 16 + 2 * t + 1]),
                         pk(A[g * 16 + 2 * t + 8], A[g * 16 + 2 * t + 9]),
                         pk(A[(g + 8) * 16 + 2 * t + 8], A[(g + 8) * 16 + 2 * t + 9])};
  const uint32_t b[2] = {pk(Bt[g * 16 + 2 * t], Bt[g * 16 + 2 * t + 1]), pk(Bt[g * 16 + 2 * t + 8], Bt[g * 16 + 2 * t + 9])};
  const float c[4] = {C[g * 8 + 2 * t], C[g * 8 + 2 * t + 1], C[(g + 8) * 8 + 2 * t], C[(g + 8) * 8 + 2 * t + 1]};
  float d[4];
  llk::mma_m16n8k16<T>(d, a, b, c);
  D[g * 8 + 2 * t] = d[0], D[g * 8 + 2 * t + 1] = d[1], D[(g + 8) * 8 + 2 * t] = d[2], D[(g + 8) * 8 + 2 * t + 1] = d[3];
}

// One warp: four 8x8 bf16 matrices (input f32 [4][8][8], values exact in bf16) in shared memory;
// out i32 [6][32][4]: the registers each lane receives from ldmatrix x1, x2, x4, x1.trans,
// x2.trans, x4.trans (unused registers 0). Lane l points at row l % 8 of matrix l / 8.
template <int N, bool TRANS>
__device__ void ldmatrix_variant(const __nv_bfloat16* tile, int32_t* out, int variant) {
  const int lane = int(threadIdx.x & 31);
  uint32_t r[N];
  llk::ldmatrix<N, TRANS>(r, tile + ((lane >> 3) * 8 + (lane & 7)) * 8);
  for (int j = 0; j < 4; ++j) out[(variant * 32 + lane) * 4 + j] = j < N ? int32_t(r[j]) : 0;
}

__device__ void ldmatrix_kernel(const SelftestParams& p) {
  __shared__ __align__(16) __nv_bfloat16 tile[4 * 8 * 8];
  const float* in = reinterpret_cast<const float*>(p.input);
  int32_t* out = reinterpret_cast<int32_t*>(p.out);
  for (int i = int(threadIdx.x); i < 256; i += 32) tile[i] = llk::from_f32<__nv_bfloat16>(in[i]);
  __syncwarp();
  ldmatrix_variant<1, false>(tile, out, 0);
  ldmatrix_variant<2, false>(tile, out, 1);
  ldmatrix_variant<4, false>(tile, out, 2);
  ldmatrix_variant<1, true>(tile, out, 3);
  ldmatrix_variant<2, true>(tile, out, 4);
  ldmatrix_variant<4, true>(tile, out, 5);
}

// One warp: lane l copies 16 bytes of input (f32 [32][4]) to shared memory with cp.async and
// src_bytes = (4 * l) % 17 (0..16), after the buffer was filled with ones; out f32 [32][4] is the
// buffer after the wait: the first src_bytes bytes copied, the rest zero.
__device__ void cp_async_kernel(const SelftestParams& p) {
  __shared__ __align__(16) float buf[32 * 4];
  const int lane = int(threadIdx.x & 31);
  const float* in = reinterpret_cast<const float*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  for (int j = 0; j < 4; ++j) buf[lane * 4 + j] = 1.f;
  __syncwarp();
  llk::cp_async_16(buf + lane * 4, in + lane * 4, (4 * lane) % 17);
  llk::cp_async_commit();
  llk::cp_async_wait<0>();
  __syncwarp();
  for (int j = 0; j < 4; ++j) out[lane * 4 + j] = buf[lane * 4 + j];
}

// wgmma.mma_async through kernels/common/wgmma.cuh, one warpgroup (see LLK_WGMMA_TEST_* in
// params.h for the input). Header words: 0 case (the template arguments below), 1-3 A's
// swizzle, leading and stride byte offsets, 4-6 B's, 7 accumulate, 8 image bytes, 9 and 10 the
// byte offsets of A and B in shared memory, 11 issues (1, or 2 chained on one accumulator, the
// second accumulating), 12 the planted bug: 1 no wgmma.fence; 2 an accumulator written before
// the wait; 3 an A register written before it; 4 an accumulator read before it; 5 thread 5's
// B descriptor differs; 6 a non-zero matrix base offset; 7 B's shared memory overwritten before
// the wait; 8 no wait before the exit; 9 no fence.proxy.async after the shared-memory stores.
template <class T, int N, bool RS, bool TRANS_A, bool TRANS_B>
__device__ void wgmma_case(const SelftestParams& p) {
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p.input);
  float* out = reinterpret_cast<float*>(p.out);
  LLK_DYN_SMEM(smem);
  const int t = int(threadIdx.x);
  const uint32_t words = w[8] / 4;
  for (uint32_t i = uint32_t(t); i < words; i += blockDim.x)
    reinterpret_cast<uint32_t*>(smem)[i] = w[LLK_WGMMA_TEST_IMAGE + i];
  const int bug = p.variant == LLK_SELFTEST_PLANTED_BUG ? int(w[12]) : 0;
  if (bug != 9) llk::fence_proxy_async();  // the stores above, to wgmma's async-proxy reads
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = __uint_as_float(w[LLK_WGMMA_TEST_C + t * (N / 2) + i]);
  uint32_t a[4];
  for (int r = 0; r < 4; ++r) a[r] = w[LLK_WGMMA_TEST_A + 4 * t + r];
  uint64_t da = llk::wgmma_desc(smem + w[9], w[2], w[3], llk::WgmmaSwizzle(w[1]));
  uint64_t db = llk::wgmma_desc(smem + w[10], w[5], w[6], llk::WgmmaSwizzle(w[4]));
  if (bug == 5 && t == 5) db += 1;
  if (bug == 6) da |= uint64_t(1) << 49, db |= uint64_t(1) << 49;
  if (bug != 1) llk::wgmma_fence();
  for (uint32_t k = 0; k < w[11]; ++k) {
    if constexpr (RS)
      llk::wgmma_rs<T, N, TRANS_B>(d, a, db, w[7] != 0 || k > 0);
    else
      llk::wgmma_ss<T, N, TRANS_A, TRANS_B>(d, da, db, w[7] != 0 || k > 0);
  }
  llk::wgmma_commit();
  float early = 0.f;
  if (bug == 2) d[0] = 1.f;
  if (bug == 3) a[0] ^= 1u;
  if (bug == 4) early = d[1];
  if (bug == 7 && t == 0) smem[w[10]] ^= 0x40;
  if (bug != 8) llk::wgmma_wait<0>(d);
  d[1] += early;
  for (int i = 0; i < N / 2; ++i) out[t * (N / 2) + i] = d[i];
}

// The cases: the two products of attention (S = Q K^T: both K-major; O = P V: A from registers,
// B N-major), both transposes at the smallest N, the largest N, and an N that is no power of 2.
__device__ void wgmma_kernel(const SelftestParams& p) {
  switch (reinterpret_cast<const uint32_t*>(p.input)[0]) {
    case 0: wgmma_case<__nv_bfloat16, 64, false, false, false>(p); break;
    case 1: wgmma_case<__nv_bfloat16, 64, true, false, true>(p); break;
    case 2: wgmma_case<__half, 8, false, true, true>(p); break;
    case 3: wgmma_case<__nv_bfloat16, 256, false, false, true>(p); break;
    case 4: wgmma_case<__half, 24, true, false, false>(p); break;
    default: __trap();
  }
}

// A producer/consumer pipeline through a ring of shared-memory stages (LLK_MBARRIER_TEST_* in
// params.h): lane 0 of warp 0 fills stage i % stages with tile i by bulk copies, announced on the
// stage's "full" barrier (arrive.expect_tx); the consumers wait for it, use the tile and arrive
// on the stage's "empty" barrier, which the producer waits for before it refills the stage.
// Header words: 0 tiles, 1 stages, 2 copies per tile (1 or 2), 3 the planted bug: 1 expects 16
// bytes more than the copies move; 2 expects one copy's bytes of two; 3 the consumers do not
// wait for a full stage; 4 the producer does not wait for an empty one; 5 stage 0's full
// barrier is never initialized; 6 the producer arrives twice; 7 copies of 8 bytes.
__device__ void mbarrier_kernel(const SelftestParams& p) {
  constexpr int kTile = LLK_MBARRIER_TEST_TILE;
  constexpr uint32_t kBytes = kTile * sizeof(float);
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p.input);
  const float* data = reinterpret_cast<const float*>(p.input) + LLK_MBARRIER_TEST_DATA;
  float* out = reinterpret_cast<float*>(p.out);
  LLK_DYN_SMEM(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem);
  uint64_t* empty = full + LLK_MBARRIER_TEST_MAX_STAGES;
  float* stages = reinterpret_cast<float*>(smem + LLK_MBARRIER_TEST_STAGES_AT);
  const int tiles = int(min(w[0], uint32_t(LLK_MBARRIER_TEST_MAX_TILES)));
  const int nstages = int(max(1u, min(w[1], uint32_t(LLK_MBARRIER_TEST_MAX_STAGES))));
  const uint32_t copies = w[2] == 2 ? 2 : 1;
  const int bug = p.variant == LLK_SELFTEST_PLANTED_BUG ? int(w[3]) : 0;
  const int t = int(threadIdx.x);
  if (t == 0) {
    for (int s = 0; s < nstages; ++s) {
      if (bug != 5 || s != 0) llk::mbarrier_init(&full[s], 1);
      llk::mbarrier_init(&empty[s], kTile);
    }
    llk::fence_mbarrier_init();
  }
  __syncthreads();
  if (t < 32) {  // the producer warp
    if (t != 0) return;
    const uint32_t part = bug == 7 ? 8 : kBytes / copies;
    for (int i = 0; i < tiles; ++i) {
      const int s = i % nstages;
      const uint32_t round = uint32_t(i / nstages);
      if (round > 0 && bug != 4) llk::mbarrier_wait(&empty[s], (round - 1) & 1);
      llk::mbarrier_arrive_expect_tx(&full[s], bug == 1 ? kBytes + 16 : bug == 2 ? kBytes / 2 : kBytes);
      if (bug == 6) llk::mbarrier_arrive(&full[s]);
      for (uint32_t c = 0; c < copies; ++c)
        llk::bulk_copy_to_shared(stages + s * kTile + c * part / 4, data + i * kTile + c * part / 4, part, &full[s]);
    }
    return;
  }
  const int c = t - 32;  // a consumer: one element of each tile
  for (int i = 0; i < tiles; ++i) {
    const int s = i % nstages;
    if (bug != 3) llk::mbarrier_wait(&full[s], uint32_t(i / nstages) & 1);
    out[i * kTile + c] = stages[s * kTile + c] * 2.f + float(i);
    llk::mbarrier_arrive(&empty[s]);
  }
}

// One tensor copy (LLK_TMA_TEST_* in params.h): thread 0 announces the bytes on an mbarrier in
// the last 8 bytes of dynamic shared memory and copies the box at the header's coordinates from
// the params' tensor map to the header's offset; every thread waits, then the block writes its
// dynamic shared memory (the barrier excepted) to out. Header words: 0 rank, 1-5 coordinates,
// 6 destination offset, 7 bytes expected, 8 the planted bug: 1 expects 16 bytes fewer than the
// box; 2 expects 16 more; 3 a destination 64 bytes off 128-byte alignment; 4 a copy of another
// rank than the map's; 5 the threads read shared memory without waiting.
template <int Rank>
__device__ void tma_copy(void* dst, const LlkTensorMap& map, const int32_t* c, uint64_t* bar) {
  if constexpr (Rank == 1) llk::tensor_copy_to_shared(dst, map, {c[0]}, bar);
  if constexpr (Rank == 2) llk::tensor_copy_to_shared(dst, map, {c[0], c[1]}, bar);
  if constexpr (Rank == 3) llk::tensor_copy_to_shared(dst, map, {c[0], c[1], c[2]}, bar);
  if constexpr (Rank == 4) llk::tensor_copy_to_shared(dst, map, {c[0], c[1], c[2], c[3]}, bar);
  if constexpr (Rank == 5) llk::tensor_copy_to_shared(dst, map, {c[0], c[1], c[2], c[3], c[4]}, bar);
}

__device__ void tma_kernel(const SelftestParams& p) {
  constexpr int kWords = LLK_TMA_TEST_SMEM / 4 - 2;  // the barrier's 8 bytes excepted
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p.input);
  LLK_DYN_SMEM(smem);
  uint64_t* bar = reinterpret_cast<uint64_t*>(smem + LLK_TMA_TEST_SMEM - 8);
  const int bug = p.variant == LLK_SELFTEST_PLANTED_BUG ? int(w[8]) : 0;
  const int t = int(threadIdx.x);
  if (w[0] < 1 || w[0] > 5) return;  // the whole block: no copy, no wait
  if (t == 0) {
    llk::mbarrier_init(bar, 1);
    llk::fence_mbarrier_init();
  }
  __syncthreads();
  if (t == 0) {
    const uint32_t bytes = w[7];
    llk::mbarrier_arrive_expect_tx(bar, bug == 1 ? bytes - 16 : bug == 2 ? bytes + 16 : bytes);
    unsigned char* dst = smem + (w[6] % LLK_TMA_TEST_SMEM) + (bug == 3 ? 64 : 0);
    const int32_t c[5] = {int32_t(w[1]), int32_t(w[2]), int32_t(w[3]), int32_t(w[4]), int32_t(w[5])};
    switch (int(w[0]) + (bug == 4 ? (w[0] == 5 ? -1 : 1) : 0)) {
      case 1: tma_copy<1>(dst, p.tensor_map, c, bar); break;
      case 2: tma_copy<2>(dst, p.tensor_map, c, bar); break;
      case 3: tma_copy<3>(dst, p.tensor_map, c, bar); break;
      case 4: tma_copy<4>(dst, p.tensor_map, c, bar); break;
      default: tma_copy<5>(dst, p.tensor_map, c, bar); break;
    }
  }
  if (bug != 5) llk::mbarrier_wait(bar, 0);
  uint32_t* out = reinterpret_cast<uint32_t*>(p.out);
  for (int i = t; i < kWords; i += int(blockDim.x)) out[i] = reinterpret_cast<const uint32_t*>(smem)[i];
}

// Two warpgroups take turns on one shared-memory slot through named barriers (LLK_WS_TEST_* in
// params.h): the producer warpgroup gives registers back (setmaxnreg.dec), writes round r into
// the slot and arrives at barrier 1; the consumer warpgroup (setmaxnreg.inc) waits there, uses
// the slot and arrives at barrier 2, where the producer waits before the next round. Then each
// warp elects one lane. Header words: 0 rounds, 1 the planted bug: 1 the producer's last
// arrival is missing; 2 the consumers do not wait for a full slot; 3 the producer does not wait
// for a free one; 4 the producer counts 128 threads at barrier 1; 5 barrier id 0; 6 warp 5 asks
// setmaxnreg for another count; 7 warp 7 skips setmaxnreg.
__device__ void warp_specialize_kernel(const SelftestParams& p) {
  constexpr int kBlock = LLK_WS_TEST_BLOCK;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p.input);
  const float* data = reinterpret_cast<const float*>(p.input) + LLK_WS_TEST_DATA;
  float* out = reinterpret_cast<float*>(p.out);
  LLK_DYN_SMEM(smem);
  float* slot = reinterpret_cast<float*>(smem);
  const int rounds = int(min(w[0], uint32_t(LLK_WS_TEST_MAX_ROUNDS)));
  const int bug = p.variant == LLK_SELFTEST_PLANTED_BUG ? int(w[1]) : 0;
  const int t = int(threadIdx.x), i = t % 128, warp = t / 32;
  const int full = bug == 5 ? 0 : 1, free_slot = 2;
  if (t < 128) {
    llk::setmaxnreg<40, false>();
    for (int r = 0; r < rounds; ++r) {
      if (r > 0 && bug != 3) llk::named_barrier_sync(free_slot, kBlock);
      slot[i] = data[r * 128 + i];
      if (bug != 1 || r + 1 < rounds) llk::named_barrier_arrive(full, bug == 4 ? 128 : kBlock);
    }
  } else {
    if (bug == 6 && warp == 5)
      llk::setmaxnreg<40, false>();
    else if (bug != 7 || warp != 7)
      llk::setmaxnreg<232, true>();
    for (int r = 0; r < rounds; ++r) {
      if (bug != 2) llk::named_barrier_sync(full, kBlock);
      out[r * 128 + i] = slot[i] * 3.f + float(r);
      if (r + 1 < rounds) llk::named_barrier_arrive(free_slot, kBlock);
    }
  }
  if (llk::elect_one_sync()) out[rounds * 128 + warp] = float(t % 32);
}

}  // namespace

// out[i] = 1 for i < n (block-strided). The bug: thread 0 also writes out[n + in[0]] (in[0] an
// offset in elements past the end, or negative: before the start), which the emulator must report
// as a memory fault (a guard page) or a guard-zone write (the alignment slack before it).
__device__ void out_of_bounds_kernel(const SelftestParams& p) {
  float* out = reinterpret_cast<float*>(p.out);
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.n) out[i] = 1.f;
  if (p.variant == LLK_SELFTEST_PLANTED_BUG && i == 0)
    out[p.n + int64_t(reinterpret_cast<const float*>(p.input)[0])] = 2.f;
}

// The fp8 e4m3fn conversions of kv_append and of the decode kernels' packed paths, so tests can
// compare them with the Rust conversions on every code (see Fp8ConvertParams in params.h).
__device__ void fp8_convert_kernel(const Fp8ConvertParams& p) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < p.n)
    reinterpret_cast<uint8_t*>(p.codes)[i] = uint8_t(llk::e4m3_from_f32(reinterpret_cast<const float*>(p.input)[i]));
  if (i < 256) {
    float* out = reinterpret_cast<float*>(p.decoded);
    out[i] = llk::e4m3_to_f32(uint32_t(i));
    // The packed paths, on a word whose four codes are i, i + 1, i + 2, i + 3 (mod 256): code i
    // is element 0 of the in-order pairs and of the across pairs.
    const uint32_t w = uint32_t(i) | (uint32_t((i + 1) & 255) << 8) | (uint32_t((i + 2) & 255) << 16) |
                       (uint32_t((i + 3) & 255) << 24);
    uint32_t lo, hi;
    llk::e4m3x4_to_pairs<__half>(w, lo, hi);
    out[256 + i] = llk::unpack2(lo, __half()).x * llk::kFp8Unscale;
    llk::e4m3x4_to_pairs<__nv_bfloat16>(w, lo, hi);
    out[512 + i] = llk::unpack2(lo, __nv_bfloat16()).x * llk::kFp8Unscale;
    llk::e4m3x4_to_pairs_across<__half>(w, lo, hi);
    out[768 + i] = llk::unpack2(lo, __half()).x * llk::kFp8Unscale;
    llk::e4m3x4_to_pairs_across<__nv_bfloat16>(w, lo, hi);
    out[1024 + i] = llk::unpack2(lo, __nv_bfloat16()).x * llk::kFp8Unscale;
  }
}

#define SELFTEST_KERNELS(X)                                                               \
  X(selftest_stencil, SelftestParams, (kBlock), LLK_SMEM_AT_LAUNCH, (stencil_kernel))                         \
  X(selftest_deadlock, SelftestParams, (1024), LLK_SMEM_NONE, (deadlock_kernel))                         \
  X(selftest_divergent_barrier, SelftestParams, (1024), LLK_SMEM_NONE, (divergent_barrier_kernel))       \
  X(selftest_warp_ops, SelftestParams, (1024), LLK_SMEM_NONE, (warp_ops_kernel))                         \
  X(selftest_dyn_smem, SelftestParams, (1024), LLK_SMEM_AT_LAUNCH, (dyn_smem_kernel))                         \
  X(selftest_declared_smem, SelftestParams, (LLK_DECLARED_SMEM_TEST_BLOCK),                             \
    LLK_SMEM_FIXED(LLK_DECLARED_SMEM_TEST_BYTES), (declared_smem_kernel))                                 \
  X(selftest_atomics, SelftestParams, (1024), LLK_SMEM_NONE, (atomics_kernel))                          \
  X(selftest_shfl_edges, SelftestParams, (1024), LLK_SMEM_NONE, (shfl_edges_kernel))                    \
  X(selftest_guards, SelftestParams, (1024), LLK_SMEM_AT_LAUNCH, (guards_kernel))                             \
  X(selftest_stack_hog, SelftestParams, (1024), LLK_SMEM_NONE, (stack_hog_kernel))                       \
  X(selftest_mma_bf16, SelftestParams, (32), LLK_SMEM_NONE, (mma_kernel<__nv_bfloat16>))                 \
  X(selftest_mma_f16, SelftestParams, (32), LLK_SMEM_NONE, (mma_kernel<__half>))                         \
  X(selftest_ldmatrix, SelftestParams, (32), LLK_SMEM_NONE, (ldmatrix_kernel))                           \
  X(selftest_cp_async, SelftestParams, (32), LLK_SMEM_NONE, (cp_async_kernel))                            \
  X(selftest_out_of_bounds, SelftestParams, (1024), LLK_SMEM_NONE, (out_of_bounds_kernel))           \
  X(selftest_bounded_fill, SelftestParams, (128, 4), LLK_SMEM_NONE, (bounded_fill_kernel))             \
  X(selftest_fast_math, SelftestParams, (1024), LLK_SMEM_NONE, (fast_math_kernel))                       \
  X(selftest_byte_perm, SelftestParams, (1024), LLK_SMEM_NONE, (byte_perm_kernel))                       \
  X(selftest_wgmma, SelftestParams, (128), LLK_SMEM_FIXED(LLK_WGMMA_TEST_SMEM), (wgmma_kernel))                                \
  X(selftest_mbarrier, SelftestParams, (32 + LLK_MBARRIER_TEST_TILE), LLK_SMEM_FIXED(LLK_MBARRIER_TEST_SMEM), (mbarrier_kernel))  \
  X(selftest_warp_specialize, SelftestParams, (LLK_WS_TEST_BLOCK, 1), LLK_SMEM_FIXED(LLK_WS_TEST_SMEM), (warp_specialize_kernel)) \
  X(selftest_tma, SelftestParams, (LLK_TMA_TEST_BLOCK), LLK_SMEM_FIXED(LLK_TMA_TEST_SMEM), (tma_kernel))                     \
  X(fp8_e4m3_convert, Fp8ConvertParams, (256), LLK_SMEM_NONE, (fp8_convert_kernel))

LLK_EXPORT_KERNELS(selftest, SELFTEST_KERNELS)
