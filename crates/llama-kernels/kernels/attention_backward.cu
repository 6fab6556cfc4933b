// attention_backward.cu -- the gradient of flash-style grouped-query attention (attention.cu):
// dQ, dK, dV from Q, K, V, the forward's output O and log-sum-exp, and dO. Deterministic.
//
// Math (the spec is src/reference/attention.rs, attention_backward, in f64). For a row i (query
// token x q head h, at absolute position p_i, kv head h / group) and an allowed key j, with the
// row's natural score scale c_i = scale * t(p_i) (t: Llama 4's temperature, else 1):
//   P_ij  = exp(c_i <Q_i, K_j> - LSE_i)          recomputed from the forward's LSE (never stored)
//   dV_j  = sum_i P_ij dO_i                       (over every q head of the group)
//   dP_ij = <dO_i, V_j>
//   D_i   = <dO_i, O_i>  ( = sum_j P_ij dP_ij )   "delta"
//   dS_ij = P_ij (dP_ij - D_i)
//   dQ_i  = c_i sum_j dS_ij K_j,    dK_j = sum_i c_i dS_ij Q_i
// Masked pairs (causal bottom-right, Llama 4 chunked, keys past the sequence) and rows that attend
// no key (LSE = -inf) contribute nothing: their P and dS are exactly 0 (the SIMT path skips them,
// so a non-finite K, V, Q or dO value at a pair the forward did not use never reaches a gradient
// there; the tensor-core path shares the forward's contract: 0 x NaN inside a staged tile).
//
// Two launches, FlashAttention-2's split with neither atomics nor a semaphore: every gradient
// element is written by exactly one thread, after sums in a fixed order, so gradients are
// bit-identical on every run and schedule.
//   attention_bwd_dq_hd<D>_<dtype>   grid as the forward's SIMT kernel: x = query-row blocks of
//     every sequence (cu_tiles; `pack` q heads of one KV group x consecutive tokens), y = KV heads
//     x head blocks. Each row computes D_i = <dO_i, O_i> first (and writes it to `delta` for the
//     second launch), then streams the key tiles it can see: dQ_i accumulates dS_ij K_j.
//   attention_bwd_dkdv_hd<D>_<dtype> grid x = key blocks of every sequence (cu_key_tiles), y = KV
//     heads. A block owns one KV head's keys j; for each q head of the group (in order) it streams
//     the query tiles that can see them (causal: from the first query at or after the block's
//     first key; chunked: up to the end of its last key's chunk) and accumulates dV_j and dK_j.
//     K_j and V_j stay in registers; Q, dO and the per-row LSE, D and scale of a query tile are
//     staged in shared memory.
// Two implementations of each launch. The tensor-core path (bf16, f16 at head_dim 64 and 128;
// section below): 4 warps of 16 rows (dQ) or keys (dK/dV), the other operand streamed through
// shared memory 32 keys or queries at a time, every product on mma.sync m16n8k16. The SIMT path
// (every dtype and head dim): a row (or key) gets LANES consecutive lanes, each owning
// head_dim / LANES dims (lane sub owns dims sub, sub + LANES, ...: the lanes of a row read
// consecutive shared-memory words, and every row of a warp reads the same key or query:
// broadcasts, no bank conflicts); a dot product ends with log2(LANES) xor shuffles in a fixed
// order. LANES is 4, 8 at head_dim 256 (so that a thread's four head_dim / LANES vectors fit in
// registers): 32 or 16 rows per block.
//
// Precision: products accumulated in f32 (inputs of any dtype; the SIMT path converts them on
// load), exp2f of scores scaled by c_i log2(e) against LSE_i log2(e); the tensor-core path
// rounds P and dS to the dtype where they enter the products (as FlashAttention does); each
// gradient is rounded once to its dtype.
//
// Work: per allowed (row, key) pair, each launch does two head_dim-long dot products (S and dP)
// and the dQ launch one update (dQ), the dK/dV launch two (dK, dV): 7 products of 2 head_dim
// FLOPs against the forward's 2, i.e. 3.5x the forward's FLOPs (FlashAttention-2's split
// recomputes S and dP in both launches, 2.5x with a single pass and atomic dQ, which is not
// deterministic).
#include "common/llk.cuh"
#include "common/attention_math.cuh"
#include "common/prefill_blocks.cuh"
#include "common/mma_tile.cuh"

namespace {

constexpr int kThreads = LLK_ATTN_BWD_THREADS;
using llk::KeyInterval;
using namespace llk::prefill;

// Lanes per row or key, rows (keys) per block, and the tile of keys (queries) staged at once.
template <int D>
inline constexpr int kLanes = D <= 128 ? LLK_ATTN_BWD_LANES : LLK_ATTN_BWD_LANES_HD256;
template <int D>
inline constexpr int kRows = kThreads / kLanes<D>;

// Dot product of a lane's dims with row `s` of a staged tile (dims sub, sub + L, ...), finished
// across the row's L lanes.
template <int D>
__device__ __forceinline__ float row_dot(const float (&a)[D / kLanes<D>], const float* s, int sub) {
  constexpr int L = kLanes<D>;
  float x = 0.f;
#pragma unroll
  for (int i = 0; i < D / L; ++i) x = fmaf(a[i], s[L * i + sub], x);
  return llk::group_sum(x, L);
}

// A lane's dims of row `src` (T elements) as f32; zeros when !ok.
template <class T, int D>
__device__ __forceinline__ void load_row(const T* src, bool ok, int sub, float (&out)[D / kLanes<D>]) {
  constexpr int L = kLanes<D>;
#pragma unroll
  for (int i = 0; i < D / L; ++i) out[i] = ok ? llk::to_f32(src[L * i + sub]) : 0.f;
}

template <class T, int D>
__device__ __forceinline__ void store_row(T* dst, int sub, const float (&in)[D / kLanes<D>], float factor) {
  constexpr int L = kLanes<D>;
#pragma unroll
  for (int i = 0; i < D / L; ++i) dst[L * i + sub] = llk::from_f32<T>(in[i] * factor);
}

// ------------------------------------------------------------------------- dQ (and delta)
template <class T, int D>
__device__ void attention_bwd_dq_kernel(const AttentionBackwardParams& bp) {
  constexpr int L = kLanes<D>, R = kRows<D>, kPer = D / L;
  __shared__ float sK[R][D];
  __shared__ float sV[R][D];
  const AttentionParams& p = bp.attn;
  if (past_last_tile(p, blockIdx.x)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), r = tid / L, sub = tid % L;
  const Sequence s = locate(p, blockIdx.x);
  const RowMap rows = row_map(p, s, R);
  const bool valid = rows.valid(r, s.q_len);
  const int64_t kv_head = rows.first_head / (p.q_heads / p.kv_heads);
  const int64_t token = rows.token(r), head = rows.head(r);
  const int64_t row = s.q_start + token;  // the row's token in the batch
  const int64_t pos = s.k_len - s.q_len + token;
  const BlockKeys bk = block_keys(p, s, rows.first_token, rows.tokens_per_block);

  // The row: Q and dO in registers, D = <dO, O> (published for the dK/dV launch).
  float q[kPer], dout[kPer], o[kPer], acc[kPer];
  load_row<T, D>(reinterpret_cast<const T*>(p.q) + row * p.q_token_stride + head * p.q_head_stride, valid, sub, q);
  load_row<T, D>(reinterpret_cast<const T*>(bp.d_out) + row * bp.d_out_token_stride + head * bp.d_out_head_stride,
                 valid, sub, dout);
  load_row<T, D>(reinterpret_cast<const T*>(p.out) + row * p.out_token_stride + head * p.out_head_stride, valid, sub,
                 o);
  float dsum = 0.f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) dsum = fmaf(dout[i], o[i], dsum), acc[i] = 0.f;
  const float delta = llk::group_sum(dsum, L);
  if (valid && sub == 0) reinterpret_cast<float*>(bp.delta)[head * p.total_q + row] = delta;

  // The row's base-2 score scale and LSE; a row that attends no key (LSE -inf) gets dQ = 0.
  const float sc = row_scale_log2(p, pos);
  const float lse2 = valid ? reinterpret_cast<const float*>(p.lse)[head * p.total_q + row] * llk::kLog2e : -INFINITY;
  const bool live = valid && lse2 != -INFINITY;
  const KeyInterval keys = key_interval(p, pos, s.k_len);
  const T* kbase = reinterpret_cast<const T*>(p.k) + s.k_start * p.k_token_stride + kv_head * p.k_head_stride;
  const T* vbase = reinterpret_cast<const T*>(p.v) + s.k_start * p.v_token_stride + kv_head * p.v_head_stride;

  for (int64_t n0 = (bk.begin / R) * R; n0 < bk.end; n0 += R) {
    __syncthreads();  // the previous tile is consumed
    for (int i = tid; i < R * D; i += kThreads) {
      const int j = i / D, d = i % D;
      const bool ok = n0 + j < s.k_len;
      sK[j][d] = ok ? llk::to_f32(kbase[(n0 + j) * p.k_token_stride + d]) : 0.f;
      sV[j][d] = ok ? llk::to_f32(vbase[(n0 + j) * p.v_token_stride + d]) : 0.f;
    }
    __syncthreads();
    for (int j = 0; j < R; ++j) {
      const float x = row_dot<D>(q, sK[j], sub);
      const float dp = row_dot<D>(dout, sV[j], sub);
      if (live && keys.contains(int(n0) + j)) {
        const float ds = exp2f(fmaf(x, sc, -lse2)) * (dp - delta);
#pragma unroll
        for (int i = 0; i < kPer; ++i) acc[i] = fmaf(ds, sK[j][L * i + sub], acc[i]);
      }
    }
  }
  if (!valid) return;  // no barriers or warp operations below
  store_row<T, D>(reinterpret_cast<T*>(bp.dq) + row * bp.dq_token_stride + head * bp.dq_head_stride, sub, acc,
                  sc * llk::kLn2);
}

// ------------------------------------------------------------------------- dK, dV
// The queries [lo, hi) of a sequence that can see some key of [n0, n_end) (n_end > n0).
struct QueryRange {
  int64_t lo, hi;
};

__device__ inline QueryRange queries_seeing(const AttentionParams& p, const Sequence& s, int64_t n0, int64_t n_end) {
  const int64_t off = s.k_len - s.q_len;  // query i sits at position off + i
  QueryRange r{0, s.q_len};
  if (p.variant.mask != LLK_ATTN_NONE) r.lo = max(int64_t(0), n0 - off);  // position >= the first key
  if (p.variant.mask == LLK_ATTN_CHUNKED_CAUSAL) {
    const int64_t c = p.variant.chunk_size;
    r.hi = min(s.q_len, ((n_end - 1) / c + 1) * c - off);  // position inside the last key's chunk
  }
  r.hi = max(r.hi, r.lo);
  return r;
}

template <class T, int D>
__device__ void attention_bwd_dkdv_kernel(const AttentionBackwardParams& bp) {
  constexpr int L = kLanes<D>, R = kRows<D>, kPer = D / L;
  __shared__ float sQ[R][D];
  __shared__ float sDO[R][D];
  __shared__ float sLse2[R], sDelta[R], sScale[R];  // per query: LSE log2(e), D, base-2 scale
  __shared__ KeyInterval sKeys[R];                  // per query: the keys it attends
  const AttentionParams& p = bp.attn;
  const int32_t* cu_key_tiles = reinterpret_cast<const int32_t*>(bp.cu_key_tiles);
  if (past_last_tile(p, blockIdx.x, cu_key_tiles)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), r = tid / L, sub = tid % L;
  const Sequence s = locate(p, blockIdx.x, cu_key_tiles);
  const int64_t kv_head = blockIdx.y;
  const int64_t n0 = s.block * R, n_end = min(s.k_len, n0 + R);
  const int key = int(n0) + r;
  const bool valid = key < s.k_len;
  const int64_t krow = s.k_start + key;

  float kr[kPer], vr[kPer], dk[kPer], dv[kPer];
  load_row<T, D>(reinterpret_cast<const T*>(p.k) + krow * p.k_token_stride + kv_head * p.k_head_stride, valid, sub, kr);
  load_row<T, D>(reinterpret_cast<const T*>(p.v) + krow * p.v_token_stride + kv_head * p.v_head_stride, valid, sub, vr);
#pragma unroll
  for (int i = 0; i < kPer; ++i) dk[i] = dv[i] = 0.f;

  const QueryRange qr = queries_seeing(p, s, n0, n_end);
  const int64_t group = p.q_heads / p.kv_heads;
  const T* q = reinterpret_cast<const T*>(p.q);
  const T* dout = reinterpret_cast<const T*>(bp.d_out);
  const float* lse = reinterpret_cast<const float*>(p.lse);
  const float* delta = reinterpret_cast<const float*>(bp.delta);
  for (int64_t head = kv_head * group; head < (kv_head + 1) * group; ++head) {
    for (int64_t i0 = qr.lo; i0 < qr.hi; i0 += R) {
      __syncthreads();  // the previous tile is consumed
      for (int i = tid; i < R * D; i += kThreads) {
        const int a = i / D, d = i % D;
        const bool ok = i0 + a < qr.hi;
        const int64_t row = s.q_start + i0 + a;
        sQ[a][d] = ok ? llk::to_f32(q[row * p.q_token_stride + head * p.q_head_stride + d]) : 0.f;
        sDO[a][d] = ok ? llk::to_f32(dout[row * bp.d_out_token_stride + head * bp.d_out_head_stride + d]) : 0.f;
      }
      if (tid < R) {
        const bool ok = i0 + tid < qr.hi;
        const int64_t row = s.q_start + i0 + tid, pos = s.k_len - s.q_len + i0 + tid;
        sLse2[tid] = ok ? lse[head * p.total_q + row] * llk::kLog2e : -INFINITY;
        sDelta[tid] = ok ? delta[head * p.total_q + row] : 0.f;
        sScale[tid] = row_scale_log2(p, pos);
        sKeys[tid] = ok ? key_interval(p, pos, s.k_len) : KeyInterval{0, -1};
      }
      __syncthreads();
      const int n = int(min(int64_t(R), qr.hi - i0));  // block-uniform
      for (int a = 0; a < n; ++a) {
        const float x = row_dot<D>(kr, sQ[a], sub);
        const float dp = row_dot<D>(vr, sDO[a], sub);
        if (valid && sKeys[a].contains(key) && sLse2[a] != -INFINITY) {
          const float pr = exp2f(fmaf(x, sScale[a], -sLse2[a]));
          const float ds = pr * (dp - sDelta[a]) * (sScale[a] * llk::kLn2);
#pragma unroll
          for (int i = 0; i < kPer; ++i) {
            dv[i] = fmaf(pr, sDO[a][L * i + sub], dv[i]);
            dk[i] = fmaf(ds, sQ[a][L * i + sub], dk[i]);
          }
        }
      }
    }
  }
  if (!valid) return;  // no barriers or warp operations below
  store_row<T, D>(reinterpret_cast<T*>(bp.dk) + krow * bp.dk_token_stride + kv_head * bp.dk_head_stride, sub, dk, 1.f);
  store_row<T, D>(reinterpret_cast<T*>(bp.dv) + krow * bp.dv_token_stride + kv_head * bp.dv_head_stride, sub, dv, 1.f);
}

// ------------------------------------------------------------------------- tensor-core path
// bf16/f16 at head_dim 64 and 128. Every operand tile lives in shared memory as rows of D 16-bit
// elements, XOR-swizzled (common/mma_tile.cuh: ldmatrix conflict-free). The four products whose
// B operand is a [rows][D] tile read along D (S = Q K^T, dP = dO V^T and their transposes in the
// dK/dV kernel) are llk::warp_mma_stage; the three that contract over rows (dV += P^T dO,
// dK += dS^T Q, dQ += dS K) take their A operand from the previous product's accumulators,
// converted in registers (P and dS rounded to the dtype for the tensor cores, as FlashAttention
// does), and B from the same tile with ldmatrix.trans (warp_mma_rows). As in the forward's
// tensor-core path, a masked pair weighs exactly 0, but a non-finite K, V, Q or dO value in a
// staged tile can still reach the other rows of the tile through 0 * NaN in the products.
constexpr int kMmaRows = LLK_ATTN_BWD_MMA_ROWS;  // dQ rows / dK,dV keys per block (4 warps x 16)
constexpr int kMmaTile = LLK_ATTN_BWD_MMA_TILE;  // keys (dQ) or queries (dK/dV) per staged tile
static_assert(kMmaRows == 16 * kThreads / 32, "one 16-row m-tile per warp");

// Dynamic shared memory of both kernels at head_dim D: two tiles of kMmaRows rows (the block's
// own operands), two of kMmaTile rows (the streamed ones), then per streamed row its f32 LSE,
// delta and scale and its key interval (dK/dV), or per block row its delta (dQ).
template <int D>
struct BwdMmaSmem {
  static constexpr int kRowBytes = D * 2;
  static constexpr int own0 = 0;
  static constexpr int own1 = own0 + kMmaRows * kRowBytes;
  static constexpr int tile0 = own1 + kMmaRows * kRowBytes;
  static constexpr int tile1 = tile0 + kMmaTile * kRowBytes;
  static constexpr int info = tile1 + kMmaTile * kRowBytes;
  static constexpr int bytes = info + kMmaRows * 5 * 4;
};

// Copies ROWS rows of D 16-bit elements into a swizzled [ROWS][D] tile: row r from src(r), zeros
// where src(r) is null (16-byte loads; the host checked the rows' alignment).
template <class T, int D, int ROWS, class Src>
__device__ __forceinline__ void stage_rows(T* dst, Src src) {
  constexpr int kChunks = D / 8;
  for (int i = int(threadIdx.x); i < ROWS * kChunks; i += kThreads) {
    const int r = i / kChunks, c = i % kChunks;
    const T* row = src(r);
    uint4 v = make_uint4(0u, 0u, 0u, 0u);
    if (row != nullptr) v = *reinterpret_cast<const uint4*>(row + c * 8);
    *reinterpret_cast<uint4*>(dst + llk::swizzled<D>(r, c)) = v;
  }
}

// The A-fragments of a 16 x (16 KS) product operand from the accumulators of a 16 x (8 NT)
// result (NT = 2 KS), rounded to T: P or dS feeding the next product.
template <class T, int KS>
__device__ __forceinline__ void acc_to_a(const float (&c)[1][2 * KS][4], uint32_t (&a)[KS][4]) {
#pragma unroll
  for (int kk = 0; kk < KS; ++kk) {
    a[kk][0] = llk::pack_pair<T>(c[0][2 * kk][0], c[0][2 * kk][1]);
    a[kk][1] = llk::pack_pair<T>(c[0][2 * kk][2], c[0][2 * kk][3]);
    a[kk][2] = llk::pack_pair<T>(c[0][2 * kk + 1][0], c[0][2 * kk + 1][1]);
    a[kk][3] = llk::pack_pair<T>(c[0][2 * kk + 1][2], c[0][2 * kk + 1][3]);
  }
}

// acc[16][D] += A[16][16 KS] * B[16 KS][D]: B the first 16 KS rows of a swizzled [rows][D] tile,
// read with ldmatrix.x4.trans (matrix mi = lane / 8: mi & 1 the k half, mi >> 1 the d-tile).
template <class T, int D, int KS>
__device__ __forceinline__ void warp_mma_rows(float (&acc)[D / 8][4], const uint32_t (&a)[KS][4], const T* b) {
  const int lane = int(threadIdx.x % 32), mat = lane >> 3;
#pragma unroll
  for (int kk = 0; kk < KS; ++kk)
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t bf[4];  // bf[0], bf[1]: d-tile n; bf[2], bf[3]: d-tile n + 1
      llk::ldmatrix<4, true>(bf, b + llk::swizzled<D>(16 * kk + (mat & 1) * 8 + (lane & 7), n + (mat >> 1)));
      const uint32_t b0[2] = {bf[0], bf[1]}, b1[2] = {bf[2], bf[3]};
      llk::mma_m16n8k16<T>(acc[n], a[kk], b0, acc[n]);
      llk::mma_m16n8k16<T>(acc[n + 1], a[kk], b1, acc[n + 1]);
    }
}

// Stores a warp's 16 x D accumulator rows (rows g and g + 8 of the m-tile) times a per-row
// factor, in pairs: dst(h) is row h's destination (null: not stored).
template <class T, int D, class Dst>
__device__ __forceinline__ void store_acc_rows(const float (&acc)[D / 8][4], const float (&factor)[2], Dst dst) {
  const int t = int(threadIdx.x % 4);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    T* row = dst(h);
    if (row == nullptr) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
      *reinterpret_cast<uint32_t*>(row + 8 * n + 2 * t) =
          llk::pack_pair<T>(acc[n][2 * h] * factor[h], acc[n][2 * h + 1] * factor[h]);
  }
}

template <class T, int D>
__device__ void attention_bwd_dq_mma_kernel(const AttentionBackwardParams& bp) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  constexpr int kNT = kMmaTile / 8, kKS = kMmaTile / 16;
  using Smem = BwdMmaSmem<D>;
  LLK_DYN_SMEM(raw);
  T* sQ = reinterpret_cast<T*>(raw + Smem::own0);
  T* sDO = reinterpret_cast<T*>(raw + Smem::own1);
  T* sK = reinterpret_cast<T*>(raw + Smem::tile0);
  T* sV = reinterpret_cast<T*>(raw + Smem::tile1);
  float* sDelta = reinterpret_cast<float*>(raw + Smem::info);
  const AttentionParams& p = bp.attn;
  if (past_last_tile(p, blockIdx.x)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const Sequence s = locate(p, blockIdx.x);
  const RowMap rows = row_map(p, s, kMmaRows);
  const int64_t kv_head = rows.first_head / (p.q_heads / p.kv_heads);
  const BlockKeys bk = block_keys(p, s, rows.first_token, rows.tokens_per_block);
  const T* q = reinterpret_cast<const T*>(p.q);
  const T* dout = reinterpret_cast<const T*>(bp.d_out);
  const T* o = reinterpret_cast<const T*>(p.out);
  auto row_of = [&](const T* base, int64_t ts, int64_t hs, int r) -> const T* {
    return rows.valid(r, s.q_len) ? base + (s.q_start + rows.token(r)) * ts + rows.head(r) * hs : nullptr;
  };
  stage_rows<T, D, kMmaRows>(sQ, [&](int r) { return row_of(q, p.q_token_stride, p.q_head_stride, r); });
  stage_rows<T, D, kMmaRows>(sDO, [&](int r) { return row_of(dout, bp.d_out_token_stride, bp.d_out_head_stride, r); });
  {
    // delta = <dO, O> per row: two threads per row, each half of the dims, then one shuffle.
    const int r = tid / 2, half = tid % 2;
    const T* dr = row_of(dout, bp.d_out_token_stride, bp.d_out_head_stride, r);
    const T* orow = row_of(o, p.out_token_stride, p.out_head_stride, r);
    float x = 0.f;
    if (dr != nullptr)
      for (int d = half * (D / 2); d < (half + 1) * (D / 2); ++d) x = fmaf(llk::to_f32(dr[d]), llk::to_f32(orow[d]), x);
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    if (half == 0) {
      sDelta[r] = x;
      if (dr != nullptr) reinterpret_cast<float*>(bp.delta)[rows.head(r) * p.total_q + s.q_start + rows.token(r)] = x;
    }
  }
  __syncthreads();
  // This lane's rows: g and g + 8 of the warp's m-tile.
  int r_of[2];
  float sc[2], lse2[2], delta[2];
  bool live[2];
  KeyInterval keys[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = warp * 16 + g + 8 * h;
    r_of[h] = r;
    const bool valid = rows.valid(r, s.q_len);
    const int64_t pos = s.k_len - s.q_len + rows.token(r);
    sc[h] = row_scale_log2(p, pos);
    lse2[h] = valid ? reinterpret_cast<const float*>(p.lse)[rows.head(r) * p.total_q + s.q_start + rows.token(r)] * llk::kLog2e
                    : -INFINITY;
    live[h] = valid && lse2[h] != -INFINITY;
    keys[h] = key_interval(p, pos, s.k_len);
    delta[h] = sDelta[r];
  }
  const T* kbase = reinterpret_cast<const T*>(p.k) + s.k_start * p.k_token_stride + kv_head * p.k_head_stride;
  const T* vbase = reinterpret_cast<const T*>(p.v) + s.k_start * p.v_token_stride + kv_head * p.v_head_stride;
  float dq[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  auto cols = [](int j) { return 8 * j; };
  for (int64_t n0 = (bk.begin / kMmaTile) * kMmaTile; n0 < bk.end; n0 += kMmaTile) {
    __syncthreads();  // the previous tile is consumed
    stage_rows<T, D, kMmaTile>(sK, [&](int r) { return n0 + r < s.k_len ? kbase + (n0 + r) * p.k_token_stride : nullptr; });
    stage_rows<T, D, kMmaTile>(sV, [&](int r) { return n0 + r < s.k_len ? vbase + (n0 + r) * p.v_token_stride : nullptr; });
    __syncthreads();
    float sp[1][kNT][4] = {}, dp[1][kNT][4] = {};
    llk::warp_mma_stage<T, 1, kNT, D>(sp, sQ, warp * 16, sK, cols);
    llk::warp_mma_stage<T, 1, kNT, D>(dp, sDO, warp * 16, sV, cols);
#pragma unroll
    for (int j = 0; j < kNT; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int h = i >> 1, key = int(n0) + 8 * j + 2 * t + (i & 1);
        const bool on = live[h] && keys[h].contains(key);
        const float pr = on ? exp2f(fmaf(sp[0][j][i], sc[h], -lse2[h])) : 0.f;
        sp[0][j][i] = on ? pr * (dp[0][j][i] - delta[h]) : 0.f;  // dS
      }
    uint32_t a[kKS][4];
    acc_to_a<T, kKS>(sp, a);
    warp_mma_rows<T, D, kKS>(dq, a, sK);
  }
  const float factor[2] = {sc[0] * llk::kLn2, sc[1] * llk::kLn2};
  T* dqp = reinterpret_cast<T*>(bp.dq);
  store_acc_rows<T, D>(dq, factor, [&](int h) -> T* {
    const int r = r_of[h];
    return rows.valid(r, s.q_len) ? dqp + (s.q_start + rows.token(r)) * bp.dq_token_stride + rows.head(r) * bp.dq_head_stride
                                  : nullptr;
  });
}

template <class T, int D>
__device__ void attention_bwd_dkdv_mma_kernel(const AttentionBackwardParams& bp) {
  static_assert(D == 64 || D == 128, "head_dim 64 or 128");
  constexpr int kNT = kMmaTile / 8, kKS = kMmaTile / 16;
  using Smem = BwdMmaSmem<D>;
  LLK_DYN_SMEM(raw);
  T* sK = reinterpret_cast<T*>(raw + Smem::own0);
  T* sV = reinterpret_cast<T*>(raw + Smem::own1);
  T* sQ = reinterpret_cast<T*>(raw + Smem::tile0);
  T* sDO = reinterpret_cast<T*>(raw + Smem::tile1);
  float* sLse2 = reinterpret_cast<float*>(raw + Smem::info);
  float* sDelta = sLse2 + kMmaTile;
  float* sScale = sDelta + kMmaTile;
  KeyInterval* sKeys = reinterpret_cast<KeyInterval*>(sScale + kMmaTile);
  const AttentionParams& p = bp.attn;
  const int32_t* cu_key_tiles = reinterpret_cast<const int32_t*>(bp.cu_key_tiles);
  if (past_last_tile(p, blockIdx.x, cu_key_tiles)) return;  // the whole block: before any barrier
  const int tid = int(threadIdx.x), warp = tid / 32, lane = tid % 32, g = lane >> 2, t = lane & 3;
  const Sequence s = locate(p, blockIdx.x, cu_key_tiles);
  const int64_t kv_head = blockIdx.y;
  const int64_t n0 = s.block * kMmaRows, n_end = min(s.k_len, n0 + kMmaRows);
  const T* kbase = reinterpret_cast<const T*>(p.k) + s.k_start * p.k_token_stride + kv_head * p.k_head_stride;
  const T* vbase = reinterpret_cast<const T*>(p.v) + s.k_start * p.v_token_stride + kv_head * p.v_head_stride;
  stage_rows<T, D, kMmaRows>(sK, [&](int r) { return n0 + r < s.k_len ? kbase + (n0 + r) * p.k_token_stride : nullptr; });
  stage_rows<T, D, kMmaRows>(sV, [&](int r) { return n0 + r < s.k_len ? vbase + (n0 + r) * p.v_token_stride : nullptr; });
  int key[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) key[h] = int(n0) + warp * 16 + g + 8 * h;
  float dk[D / 8][4], dv[D / 8][4];
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) dk[n][i] = dv[n][i] = 0.f;

  const QueryRange qr = queries_seeing(p, s, n0, n_end);
  // Head counts fit 32 bits (the host bounds them by grid.y); a 64-bit loop bound cost a spill.
  const int group = int(p.q_heads / p.kv_heads), head_end = (int(kv_head) + 1) * group;
  const T* q = reinterpret_cast<const T*>(p.q);
  const T* dout = reinterpret_cast<const T*>(bp.d_out);
  const float* lse = reinterpret_cast<const float*>(p.lse);
  const float* delta = reinterpret_cast<const float*>(bp.delta);
  auto cols = [](int j) { return 8 * j; };
  for (int head = int(kv_head) * group; head < head_end; ++head) {
    for (int64_t i0 = qr.lo; i0 < qr.hi; i0 += kMmaTile) {
      __syncthreads();  // the previous tile is consumed
      auto row_of = [&](const T* base, int64_t ts, int64_t hs, int r) -> const T* {
        return i0 + r < qr.hi ? base + (s.q_start + i0 + r) * ts + head * hs : nullptr;
      };
      stage_rows<T, D, kMmaTile>(sQ, [&](int r) { return row_of(q, p.q_token_stride, p.q_head_stride, r); });
      stage_rows<T, D, kMmaTile>(sDO, [&](int r) { return row_of(dout, bp.d_out_token_stride, bp.d_out_head_stride, r); });
      if (tid < kMmaTile) {
        const bool ok = i0 + tid < qr.hi;
        const int64_t row = s.q_start + i0 + tid, pos = s.k_len - s.q_len + i0 + tid;
        sLse2[tid] = ok ? lse[head * p.total_q + row] * llk::kLog2e : -INFINITY;
        sDelta[tid] = ok ? delta[head * p.total_q + row] : 0.f;
        sScale[tid] = row_scale_log2(p, pos);
        sKeys[tid] = ok ? key_interval(p, pos, s.k_len) : KeyInterval{0, -1};
      }
      __syncthreads();
      // S^T and dP^T: this warp's 16 keys x the tile's queries.
      float st[1][kNT][4] = {}, dpt[1][kNT][4] = {};
      llk::warp_mma_stage<T, 1, kNT, D>(st, sK, warp * 16, sQ, cols);
      llk::warp_mma_stage<T, 1, kNT, D>(dpt, sV, warp * 16, sDO, cols);
#pragma unroll
      for (int j = 0; j < kNT; ++j)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int a = 8 * j + 2 * t + (i & 1), kj = key[i >> 1];
          const bool on = kj < s.k_len && sKeys[a].contains(kj) && sLse2[a] != -INFINITY;
          const float pr = on ? exp2f(fmaf(st[0][j][i], sScale[a], -sLse2[a])) : 0.f;
          dpt[0][j][i] = on ? pr * (dpt[0][j][i] - sDelta[a]) * (sScale[a] * llk::kLn2) : 0.f;  // dS^T
          st[0][j][i] = pr;                                                                          // P^T
        }
      uint32_t pa[kKS][4], da[kKS][4];
      acc_to_a<T, kKS>(st, pa);
      acc_to_a<T, kKS>(dpt, da);
      warp_mma_rows<T, D, kKS>(dv, pa, sDO);
      warp_mma_rows<T, D, kKS>(dk, da, sQ);
    }
  }
  const float one[2] = {1.f, 1.f};
  T* dkp = reinterpret_cast<T*>(bp.dk);
  T* dvp = reinterpret_cast<T*>(bp.dv);
  store_acc_rows<T, D>(dk, one, [&](int h) -> T* {
    return key[h] < s.k_len ? dkp + (s.k_start + key[h]) * bp.dk_token_stride + kv_head * bp.dk_head_stride : nullptr;
  });
  store_acc_rows<T, D>(dv, one, [&](int h) -> T* {
    return key[h] < s.k_len ? dvp + (s.k_start + key[h]) * bp.dv_token_stride + kv_head * bp.dv_head_stride : nullptr;
  });
}

}  // namespace

// Symbols: attention_bwd_dq_hd<D>_<dtype> and attention_bwd_dkdv_hd<D>_<dtype> (SIMT), every head
// dim and dtype of the forward; attention_bwd_{dq,dkdv}_mma_hd<D>_<dtype> on tensor cores, bf16
// and f16 at head_dim 64 and 128.
#define ATTN_BWD_PAIR(X, D, T, name)                                                                                \
  X(attention_bwd_dq_hd##D##_##name, AttentionBackwardParams, (kThreads), LLK_SMEM_NONE,                           \
    (attention_bwd_dq_kernel<T, D>))                                                                                \
  X(attention_bwd_dkdv_hd##D##_##name, AttentionBackwardParams, (kThreads), LLK_SMEM_NONE,                         \
    (attention_bwd_dkdv_kernel<T, D>))
#define ATTN_BWD_DTYPES(X, D) \
  ATTN_BWD_PAIR(X, D, __nv_bfloat16, bf16) ATTN_BWD_PAIR(X, D, __half, f16) ATTN_BWD_PAIR(X, D, float, f32)
#define ATTN_BWD_MMA_PAIR(X, D, T, name)                                                                            \
  X(attention_bwd_dq_mma_hd##D##_##name, AttentionBackwardParams, (kThreads),                                        \
    LLK_SMEM_FIXED((BwdMmaSmem<D>::bytes)), (attention_bwd_dq_mma_kernel<T, D>))                                     \
  X(attention_bwd_dkdv_mma_hd##D##_##name, AttentionBackwardParams, (kThreads),                                      \
    LLK_SMEM_FIXED((BwdMmaSmem<D>::bytes)), (attention_bwd_dkdv_mma_kernel<T, D>))
#define ATTN_BWD_MMA(X, D) ATTN_BWD_MMA_PAIR(X, D, __nv_bfloat16, bf16) ATTN_BWD_MMA_PAIR(X, D, __half, f16)
#define ATTENTION_BACKWARD_KERNELS(X)                                                                                \
  ATTN_BWD_DTYPES(X, 32) ATTN_BWD_DTYPES(X, 64) ATTN_BWD_DTYPES(X, 96) ATTN_BWD_DTYPES(X, 128) ATTN_BWD_DTYPES(X, 256) \
  ATTN_BWD_MMA(X, 64) ATTN_BWD_MMA(X, 128)

LLK_EXPORT_KERNELS(attention_backward, ATTENTION_BACKWARD_KERNELS)
