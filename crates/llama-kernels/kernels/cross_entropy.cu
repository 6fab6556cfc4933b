// cross_entropy.cu -- softmax cross-entropy over rows of logits, its gradient, and the reduction.
//
// Math (the spec is src/reference/cross_entropy.rs, in f64): for a row t with label y != ignore,
//   lse_t = log sum_v exp(x_tv),   loss_t = lse_t - x_ty,
//   d loss / d x_tv = (exp(x_tv - lse_t) - [v == y]) * scale,
// scale = grad_scale / n for the mean over the n counted rows, grad_scale for the sum. An ignored
// row has loss 0 and a zero gradient row. Everything is f32 from the logits' dtype (exp/log are
// expf/logf); the gradient is rounded once to its dtype. This is PyTorch's F.cross_entropy with
// ignore_index (Hugging Face's causal-LM loss once the caller has shifted the labels).
//
// Three kernels, all deterministic (fixed reduction orders, no atomics):
//   cross_entropy_count   one block: n = #labels != ignore_index, as f32 (exact below 2^24 rows).
//   cross_entropy_<dtype> one block per row: pass 1 streams the row once with an online
//     (max, sum of exp) per thread, merged across the block in a fixed tree; pass 2 (when a
//     gradient is asked for) streams it again and writes the gradient, which may overwrite the
//     logits in place (each element is read before it is written, by the same thread).
//   cross_entropy_reduce  one block: the per-row losses summed in f64 in a fixed order, divided
//     by n for the mean (0 / 0 = NaN when every label is ignored, as PyTorch).
// A label outside [0, vocab) that is not ignore_index raises LLK_DEVICE_BAD_LABEL; its row's
// loss is NaN (so is the reduced loss) and its gradient row is zero.
//
// Bytes: the row kernel reads the logits once (twice with a gradient) and writes the gradient
// once: 1 read per element for the loss alone, 2 reads + 1 write with the gradient. Vectors:
// VEC = 16 / sizeof(T) (128-bit accesses) when the vocabulary, pointers and strides allow.
#include "common/device_error.cuh"
#include "common/llk.cuh"

namespace {

constexpr int kThreads = LLK_CE_THREADS;
constexpr int kReduceThreads = LLK_CE_REDUCE_THREADS;

// A running (max, sum of exp(x - max)) over some of a row's logits.
struct LseState {
  float m = -INFINITY;
  float s = 0.f;
  // exp(a - m) that is 0 (not NaN) when both are -inf.
  __device__ __forceinline__ static float scaled(float a, float m) { return a == -INFINITY ? 0.f : expf(a - m); }
  __device__ __forceinline__ void add(float x) {
    if (x > m) {
      s = s * scaled(m, x) + 1.f;
      m = x;
    } else {
      s += scaled(x, m);  // NaN x: NaN sum, so a NaN logit gives a NaN loss
    }
  }
  __device__ __forceinline__ void merge(LseState o) {
    const float mn = fmaxf(m, o.m);
    s = s * scaled(m, mn) + o.s * scaled(o.m, mn);
    m = mn;
  }
  __device__ __forceinline__ float lse() const { return m + logf(s); }
};

__device__ __forceinline__ int64_t label_at(const CrossEntropyParams& p, int64_t t) {
  return p.label_type == LLK_INDEX_I64 ? reinterpret_cast<const int64_t*>(p.labels)[t]
                                       : int64_t(reinterpret_cast<const int32_t*>(p.labels)[t]);
}

template <class T, int VEC>
__device__ void cross_entropy_kernel(const CrossEntropyParams& p) {
  __shared__ LseState s_warp[kThreads / 32];
  __shared__ float s_lse;
  const int64_t t = blockIdx.x;
  const int tid = int(threadIdx.x);
  const T* x = reinterpret_cast<const T*>(p.logits) + t * p.logits_stride;
  const int64_t label = label_at(p, t);
  const bool ignored = label == p.ignore_index;
  const bool bad = !ignored && (label < 0 || label >= p.vocab);
  const int64_t nvec = p.vocab / VEC;

  // Pass 1: this thread's vectors, then the block's tree (warps by shuffles, then warp 0).
  LseState st;
  for (int64_t i = tid; i < nvec; i += kThreads) {
    float v[VEC];
    llk::load_f32<T, VEC>(x + i * VEC, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) st.add(v[j]);
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    LseState other;
    other.m = __shfl_xor_sync(0xffffffffu, st.m, o);
    other.s = __shfl_xor_sync(0xffffffffu, st.s, o);
    st.merge(other);
  }
  if (tid % 32 == 0) s_warp[tid / 32] = st;
  __syncthreads();
  if (tid < 32) {
    LseState w = tid < kThreads / 32 ? s_warp[tid] : LseState{};
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      LseState other;
      other.m = __shfl_xor_sync(0xffffffffu, w.m, o);
      other.s = __shfl_xor_sync(0xffffffffu, w.s, o);
      w.merge(other);
    }
    if (tid == 0) {
      const float lse = w.lse();
      s_lse = lse;
      float loss = 0.f;
      if (bad) {
        llk::raise_device_error(p.error_flag, LLK_DEVICE_BAD_LABEL);
        loss = __int_as_float(0x7fc00000);  // NaN
      } else if (!ignored) {
        loss = lse - llk::to_f32(x[label]);
      }
      reinterpret_cast<float*>(p.row_loss)[t] = loss;
    }
  }
  if (p.grad == 0) return;  // block-uniform
  __syncthreads();

  // Pass 2: the gradient. Ignored and bad rows get zeros.
  const float lse = s_lse;
  const bool counted = !ignored && !bad;
  const float n = *reinterpret_cast<const float*>(p.count);
  const float scale = !counted ? 0.f : p.reduction == LLK_LOSS_MEAN ? p.grad_scale / n : p.grad_scale;
  T* g = reinterpret_cast<T*>(p.grad) + t * p.grad_stride;
  for (int64_t i = tid; i < nvec; i += kThreads) {
    float v[VEC];
    llk::load_f32<T, VEC>(x + i * VEC, v);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      const float onehot = i * VEC + j == label ? 1.f : 0.f;
      v[j] = counted ? (expf(v[j] - lse) - onehot) * scale : 0.f;
    }
    llk::store_f32<T, VEC>(g + i * VEC, v);
  }
}

// n = #labels != ignore_index, in one block: integer partial counts, summed exactly.
__device__ void cross_entropy_count_kernel(const CrossEntropyParams& p) {
  __shared__ int64_t s_part[kReduceThreads / 32];
  const int tid = int(threadIdx.x);
  int64_t c = 0;
  for (int64_t t = tid; t < p.rows; t += kReduceThreads) c += label_at(p, t) != p.ignore_index ? 1 : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) c += __shfl_xor_sync(0xffffffffu, c, o);
  if (tid % 32 == 0) s_part[tid / 32] = c;
  __syncthreads();
  if (tid == 0) {
    int64_t n = 0;
    for (int w = 0; w < kReduceThreads / 32; ++w) n += s_part[w];
    *reinterpret_cast<float*>(p.count) = float(n);
  }
}

// The reduced loss: per-row losses summed in f64, each thread over a fixed stride of rows, then
// the warps' shuffles and warp sums in order.
__device__ void cross_entropy_reduce_kernel(const CrossEntropyParams& p) {
  __shared__ double s_part[kReduceThreads / 32];
  const int tid = int(threadIdx.x);
  const float* row_loss = reinterpret_cast<const float*>(p.row_loss);
  double sum = 0.0;
  for (int64_t t = tid; t < p.rows; t += kReduceThreads) sum += double(row_loss[t]);
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
  if (tid % 32 == 0) s_part[tid / 32] = sum;
  __syncthreads();
  if (tid == 0) {
    double total = 0.0;
    for (int w = 0; w < kReduceThreads / 32; ++w) total += s_part[w];
    const double n = double(*reinterpret_cast<const float*>(p.count));
    *reinterpret_cast<float*>(p.loss) = float(p.reduction == LLK_LOSS_MEAN ? total / n : total);
  }
}

}  // namespace

// Symbols: cross_entropy[_vec]_<dtype> (the per-row kernel; `_vec` the 16-byte path),
// cross_entropy_count, cross_entropy_reduce.
#define CROSS_ENTROPY_DTYPE(X, name, T, V)                                                                  \
  X(cross_entropy_##name, CrossEntropyParams, (kThreads), LLK_SMEM_NONE, (cross_entropy_kernel<T, 1>))     \
  X(cross_entropy_vec_##name, CrossEntropyParams, (kThreads), LLK_SMEM_NONE, (cross_entropy_kernel<T, V>))
#define CROSS_ENTROPY_KERNELS(X)                                                                            \
  CROSS_ENTROPY_DTYPE(X, f32, float, 4)                                                                     \
  CROSS_ENTROPY_DTYPE(X, f16, __half, 8)                                                                    \
  CROSS_ENTROPY_DTYPE(X, bf16, __nv_bfloat16, 8)                                                            \
  X(cross_entropy_count, CrossEntropyParams, (kReduceThreads), LLK_SMEM_NONE, (cross_entropy_count_kernel)) \
  X(cross_entropy_reduce, CrossEntropyParams, (kReduceThreads), LLK_SMEM_NONE, (cross_entropy_reduce_kernel))

LLK_EXPORT_KERNELS(cross_entropy, CROSS_ENTROPY_KERNELS)
