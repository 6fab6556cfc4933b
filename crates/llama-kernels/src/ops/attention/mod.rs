//! Attention: flash-style grouped-query prefill ([`AttentionWorkspace`], kernels/attention.cu)
//! and its gradient (kernels/attention_backward.cu),
//! the paged KV cache with split-KV decode ([`PagedKvCache`], [`PagedDecodeWorkspace`]) and the
//! merge of attention states ([`merge_attention_states`]).
//!
//! ## Prefill (kernels/attention.cu)
//!
//! `O = softmax(scale * Q K^T + mask) V`, tile by tile with an online softmax: the score matrix is
//! never stored and the only workspace is about `3 * (batch + 1)` i32 values plus an error flag.
//!
//! ```
//! use llama_kernels::ops::attention::{
//!     AttentionMask, AttentionOptions, AttentionTensors, AttentionWorkspace, KvTensors, Offsets,
//! };
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (q_heads, kv_heads, d) = (8, 2, 64);
//! // Two sequences: 5 new tokens after a 3-token cached prefix, and 4 fresh tokens.
//! let (cu_q, cu_k) = ([0, 5, 9], [0, 8, 12]);
//! let q = Tensor::zeros(&device, DType::BF16, &[9, q_heads, d])?;
//! let k = Tensor::zeros(&device, DType::BF16, &[12, kv_heads, d])?;
//! let v = Tensor::zeros(&device, DType::BF16, &[12, kv_heads, d])?;
//! let out = Tensor::zeros(&device, DType::BF16, &[9, q_heads, d])?;
//! let mut ws = AttentionWorkspace::new(&device);
//! let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
//! let kv = KvTensors::Contiguous { k: &k, v: &v };
//! let cu_seqlens = Offsets::Host { q: &cu_q, k: &cu_k };
//! ws.forward(AttentionTensors { q: &q, kv, cu_seqlens, out: &out, lse: None }, &opts)?;
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: q and out `[total_q, q_heads, head_dim]`, k and v `[total_k, kv_heads, head_dim]`, each
//! with its own token and head strides (views into a fused QKV buffer work), `head_dim`
//! contiguous, one dtype; the optional log-sum-exp output is f32 `[q_heads, total_q]`, contiguous.
//! `cu_seqlens_q` / `cu_seqlens_k` are the cumulative sequence offsets (i32, `batch + 1` values,
//! from 0, non-decreasing); a single sequence is `[0, total_q]`, `[0, total_k]`. They can be host
//! slices (validated here, staged through pinned memory) or device tensors ([`Offsets::Device`],
//! [`CuSeqlens::Device`]: no host copy at all, so the call can be captured in a
//! CUDA graph; host slices during capture are an [`Error::Unsupported`](crate::Error::Unsupported),
//! since a captured copy would replay stale offsets). Device offsets are validated by the device: if they are invalid, the call writes
//! nothing and raises the workspace's error flag ([`AttentionWorkspace::check_errors`]).
//!
//! Supported: bf16 and f16 on tensor cores, f32 on a SIMT path; head_dim 32, 64, 96, 128 and 256.
//! Two tensor-core kernels ([`prefill_kernel`] says which serves a call): on Hopper (the emulator
//! standing for sm_90, and compute capability 9.0 when `LLK_ATTENTION_SM90=1`: the kernel has not
//! yet run on hardware, [`HOPPER_ON_CUDA_VAR`]), bf16/f16 at head_dim 64, 128 and 256 with
//! contiguous K/V run kernels/attention_sm90.cu, FlashAttention-3's structure (a producer
//! warpgroup loading Q and K/V tiles by TMA into a ring of mbarrier-guarded stages, two consumer
//! warpgroups on wgmma, ping-ponging on named barriers); everything else (paged K/V, other head
//! dims, earlier GPUs) runs kernels/attention.cu's mma.sync kernel (m16n8k16, ldmatrix, cp.async),
//! FlashAttention-2's. Both compute the same function to the same tolerances. Queries align to the end of their keys (chunked prefill
//! after a cached prefix). Fully masked rows and queries of sequences without keys write zeros
//! with `lse = -inf`.
//!
//! K and V may also be read in place from the paged KV cache
//! ([`KvTensors::Paged`], [`KvInput::Paged`], the paged cache below): `cu_seqlens.k`
//! then counts each sequence's keys (the cached prefix and the new tokens, already appended) and
//! the block table names its pages.
//!
//! NaN and infinity: a non-finite value in K or V at a key a query attends makes that query's
//! output NaN, as in exact arithmetic. A non-finite value at a key a query does *not* attend (a
//! later key under the causal mask, another chunk) may still reach it, because keys are processed
//! in tiles of 64 and a masked key's weight is an exact 0 that multiplies the NaN (FlashAttention
//! and PyTorch's SDPA behave the same). Such outputs are either exact or NaN, never another
//! finite value; other sequences and other KV groups are never affected.
//! [`crate::reference::attention::nan_exposed_rows`] states exactly which rows may be hit.

//! ## The gradient (kernels/attention_backward.cu)
//!
//! [`AttentionWorkspace::backward`] computes dQ, dK and dV of a prefill call from its inputs, its
//! output O and log-sum-exp (the forward's `lse`), and dO, with the forward's options
//! (FlashAttention-2's algorithm: P is recomputed tile by tile from the LSE, never stored).
//!
//! ```
//! use llama_kernels::ops::attention::{
//!     AttentionBackwardTensors, AttentionMask, AttentionOptions, AttentionTensors, AttentionWorkspace, KvTensors,
//!     Offsets,
//! };
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (q_heads, kv_heads, d, tokens) = (8, 2, 64, 12);
//! let x = |heads| Tensor::zeros(&device, DType::BF16, &[tokens, heads, d]);
//! let (q, k, v, out, d_out) = (x(q_heads)?, x(kv_heads)?, x(kv_heads)?, x(q_heads)?, x(q_heads)?);
//! let lse = Tensor::zeros(&device, DType::F32, &[q_heads, tokens])?;
//! let (dq, dk, dv) = (x(q_heads)?, x(kv_heads)?, x(kv_heads)?);
//! let cu = [0, 5, 12]; // two sequences of 5 and 7 tokens
//! let opts = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
//! let cu_seqlens = Offsets::Host { q: &cu, k: &cu };
//! let mut ws = AttentionWorkspace::new(&device);
//! let kv = KvTensors::Contiguous { k: &k, v: &v };
//! ws.forward(AttentionTensors { q: &q, kv, cu_seqlens, out: &out, lse: Some(&lse) }, &opts)?;
//! let grads = AttentionBackwardTensors {
//!     q: &q, k: &k, v: &v, out: &out, lse: &lse, d_out: &d_out, cu_seqlens, dq: &dq, dk: &dk, dv: &dv,
//! };
//! ws.backward(grads, &opts)?;
//! # Ok(())
//! # }
//! ```
//!
//! Two launches, neither with atomics, so the gradients are bit-identical from run to run: a dQ
//! kernel over query-row blocks, which also writes `delta = rowsum(dO * O)` into the workspace,
//! then a dK/dV kernel over key blocks of each KV head that loops over the q heads of its group
//! (GQA's sum happens in the kernel; K and V are never repeated) and over the query tiles that
//! can see its keys. K and V are contiguous tensors (any token and head strides); every mask,
//! temperature, scale, head dim and offset form of the forward's contiguous path is supported,
//! and dq, dk, dv are written (not accumulated), disjoint from every input. [`backward_path`]
//! says which kernels serve a call: tensor cores (`mma.sync`) for bf16 and f16 at head_dim 64
//! and 128 with 16-byte-aligned rows, rounding P and dS to the dtype for the products as
//! FlashAttention does; a SIMT path in f32 otherwise. A non-finite K, V, Q or dO value in a
//! tile the tensor-core path stages may reach the other rows of that tile (0 x NaN), as in the
//! forward; the SIMT path skips masked pairs, so a value at a key a row does not attend never
//! reaches that row's gradient.
//!
//! ## The paged KV cache and decode (kernels/paged_attention.cu)
//!
//! Appending new tokens, split-KV decode attention on tensor cores, and merging attention
//! states.
//!
//! ```
//! use llama_kernels::ops::attention::{
//!     DecodeShape, DecodeTensors, KvScales, PagedDecodeOptions, PagedDecodeWorkspace, PagedKvCache,
//!     PagedKvConfig,
//! };
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (q_heads, kv_heads, d, page_size) = (8, 2, 64, 16);
//! let cache = PagedKvCache::new(&device, &PagedKvConfig {
//!     num_pages: 8, page_size, kv_heads, head_dim: d, dtype: DType::BF16, scales: KvScales::default(),
//! })?;
//! // Two sequences decoding one token each: the new k/v go to their slots, then attention runs
//! // over the whole cache of each sequence (20 and 3 keys).
//! let k = Tensor::zeros(&device, DType::BF16, &[2, kv_heads, d])?;
//! let v = Tensor::zeros(&device, DType::BF16, &[2, kv_heads, d])?;
//! let slots = Tensor::from_slice(&device, &[3 * 16 + 3i64, 2 * 16 + 2], &[2])?;
//! cache.append(&k, &v, &slots)?;
//! let block_table = Tensor::from_slice(&device, &[0i32, 3, 2, 0], &[2, 2])?;
//! let seq_lens = Tensor::from_slice(&device, &[20i32, 3], &[2])?;
//! let shape = DecodeShape { batch: 2, q_len: 1, q_heads, kv_heads, head_dim: d, max_seq_len: 32,
//!     dtype: DType::BF16, page_dtype: DType::BF16 };
//! let mut ws = PagedDecodeWorkspace::plan(&device, &shape)?;  // once per batch shape
//! let q = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d])?;
//! let out = Tensor::zeros(&device, DType::BF16, &[2, q_heads, d])?;
//! let call = DecodeTensors { q: &q, cache: &cache, block_table: &block_table, seq_lens: &seq_lens, out: &out, lse: None };
//! ws.forward(call, &PagedDecodeOptions::default())?;
//! ws.check_errors()?;
//! cache.check_errors()?;
//! # Ok(())
//! # }
//! ```
//!
//! **The cache.** K and V page pools `[num_pages, page_size, kv_heads, head_dim]` (the NHD layout
//! of FlashInfer and FlashAttention; each page contiguous, pages any 16-byte-aligned stride apart,
//! so the `[num_pages, 2, page_size, ...]` layout's K and V views work), page size a power of two
//! (16, 32, 64, 128, ...; 16 is the usual), dtype bf16, f16, f32 or fp8 e4m3fn
//! ([`DType::F8E4M3`](crate::DType::F8E4M3): OCP, +-448). fp8 pages carry a scale per tensor or per KV head
//! ([`KvScales`]): stored = fp8(x / scale), read = fp8 * scale. A block table `[batch, max_pages]`
//! i32 lists each sequence's pages; `seq_lens` `[batch]` i32 its number of keys. Both live on the
//! device: a page id outside `[0, num_pages)` is never dereferenced. The kernels skip its keys
//! (they take no part in the softmax) and raise a device-side error flag
//! ([`PagedDecodeWorkspace::check_errors`], [`PagedKvCache::check_errors`], or [`ErrorFlag`] at
//! the view level). A sequence length below 0 or past its block-table row is clamped and flagged
//! the same way.
//!
//! **Append** ([`kv_append_on`]) writes new tokens' k and v (`[tokens, kv_heads, head_dim]`, any
//! token and head strides: views of a fused QKV buffer after RoPE) to their slots (an i64 slot
//! mapping, `page * page_size + row`; -1 skips a token), converting or quantizing (f32 math,
//! round to nearest even, saturating at +-448 for fp8) with 16-byte loads and stores. Slots must
//! be distinct; one outside the pool is skipped and flagged.
//!
//! **Decode** ([`PagedDecodeWorkspace`]): q `[batch * q_len, q_heads, head_dim]`, q_len 1..=8 new
//! tokens per sequence (speculative decoding and multi-token prediction verify several at once),
//! already appended: token i of sequence b sits at position `seq_len - q_len + i` and attends the
//! keys up to it (causal among the new tokens). The q heads of one KV group share the mma rows,
//! so GQA decode runs on tensor cores. The planner ([`PagedDecodeWorkspace::plan`]) runs once per
//! batch shape: it picks the number of splits of each sequence's keys from batch x kv_heads
//! against the SM count and the longest context, and allocates the partial outputs; a call then
//! allocates nothing, copies nothing from the host and never waits (CUDA-graph capturable). With
//! more than one split, each split writes a partial output and its log-sum-exp and a merge kernel
//! combines them in split order: for one plan the output is deterministic.
//! Options ([`PagedDecodeOptions`]): softmax scale, Llama 4 chunked local attention, Llama 4
//! temperature tuning, LSE output. bf16 and f16 (pages of the same dtype or fp8) run on tensor
//! cores; f32 (f32 pages) on a SIMT path for testing. head_dim 32, 64, 96, 128, 256.
//!
//! **Merge** ([`merge_attention_states_on`]): `lse = log(e^lse_a + e^lse_b)`,
//! `o = e^(lse_a - lse) o_a + e^(lse_b - lse) o_b`: the split merge as a public op, for cascade
//! attention over a shared prefix.

mod backward;
mod decode;
pub(crate) mod decode_launch;
mod merge;
mod paged;
mod prefill;
pub(crate) mod prefill_launch;
mod variant;

pub use crate::kernels::attention::SUPPORTED_HEAD_DIMS;
pub use crate::kernels::attention_backward::AttentionBackwardPath;
pub use crate::ops::error_flag::ErrorFlag;
pub use crate::spec::attention::{AttentionMask, Llama4Temperature};
pub use backward::{AttentionBackwardArgs, AttentionBackwardTensors, backward_path, backward_rows};
#[doc(hidden)]
pub use decode::plan_splits;
pub use decode::{DecodeTensors, MAX_Q_LEN, MAX_SPLITS, PagedDecodeOptions, PagedDecodeWorkspace};
pub use decode_launch::{DecodeArgs, DecodeShape};
pub use decode_launch::{DecodeConfig, decode_config, decode_kernel, decode_stages_of, decode_tiles_of};
pub use merge::{merge_attention_states, merge_attention_states_on};
pub use paged::{
    KvAppendArgs, KvScale, KvScales, MAX_SCALED_KV_HEADS, PagedKvCache, PagedKvConfig, PagedKvView, kv_append_on,
};
pub use prefill::{AttentionArgs, AttentionOptions, AttentionTensors, AttentionWorkspace, KvTensors, Offsets};
pub use prefill_launch::{
    CuSeqlens, HOPPER_ON_CUDA_VAR, KvInput, MAX_PACK, MMA_BLOCKS_PER_SM, PrefillKernel, mma_keys, prefill_kernel,
};
