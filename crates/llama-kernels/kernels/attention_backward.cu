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
// no key (LSE = -inf) contribute nothing: such pairs are skipped, not multiplied by 0, so a
// non-finite K, V, Q or dO value at a pair the forward did not use never reaches a gradient.
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
// Both kernels give a row (or key) LANES consecutive lanes, each owning head_dim / LANES dims
// (lane sub owns dims sub, sub + LANES, ...: the lanes of a row read consecutive shared-memory
// words, and every row of a warp reads the same key or query: broadcasts, no bank conflicts);
// a dot product ends with log2(LANES) xor shuffles in a fixed order. LANES is 4, 8 at head_dim
// 256 (so that a thread's four head_dim / LANES vectors fit in registers): 32 or 16 rows per block.
//
// Precision: every product and sum in f32 (inputs of any dtype converted on load), exp2f of
// scores scaled by c_i log2(e) against LSE_i log2(e); each gradient rounded once to its dtype.
// Cost: 4 head_dim-long products per allowed (row, key) pair in each kernel's inner loop (dQ: two
// dots and one update per pair but the dots are shared with nothing; dK/dV: two dots and two
// updates), i.e. the FA2 backward's 2.5x the forward's FLOPs, here on CUDA cores.
#include "common/llk.cuh"
#include "common/attention_math.cuh"
#include "common/prefill_blocks.cuh"

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

}  // namespace

// Symbols: attention_bwd_dq_hd<D>_<dtype> and attention_bwd_dkdv_hd<D>_<dtype>, every head dim
// and dtype of the forward (one SIMT instantiation per pair).
#define ATTN_BWD_PAIR(X, D, T, name)                                                                                \
  X(attention_bwd_dq_hd##D##_##name, AttentionBackwardParams, (kThreads), LLK_SMEM_NONE,                           \
    (attention_bwd_dq_kernel<T, D>))                                                                                \
  X(attention_bwd_dkdv_hd##D##_##name, AttentionBackwardParams, (kThreads), LLK_SMEM_NONE,                         \
    (attention_bwd_dkdv_kernel<T, D>))
#define ATTN_BWD_DTYPES(X, D) \
  ATTN_BWD_PAIR(X, D, __nv_bfloat16, bf16) ATTN_BWD_PAIR(X, D, __half, f16) ATTN_BWD_PAIR(X, D, float, f32)
#define ATTENTION_BACKWARD_KERNELS(X) \
  ATTN_BWD_DTYPES(X, 32) ATTN_BWD_DTYPES(X, 64) ATTN_BWD_DTYPES(X, 96) ATTN_BWD_DTYPES(X, 128) ATTN_BWD_DTYPES(X, 256)

LLK_EXPORT_KERNELS(attention_backward, ATTENTION_BACKWARD_KERNELS)
