#![doc = include_str!("../README.md")]
//!
//! ## Ops
//!
//! | op | dtypes | constraints |
//! | --- | --- | --- |
//! | [`ops::rms_norm()`] | f32, f16, bf16 (f32 accumulation) | any hidden > 0; rows may be strided; 16-byte vector path when aligned, scalar fallback otherwise; in place allowed |
//! | [`ops::fused_add_rms_norm()`] | f32, f16, bf16 | as `rms_norm`; writes `x + residual` back into `residual` |
//! | [`ops::Rope::apply`] | f32, f16, bf16 | q and k in place in one launch; interleaved or half-split; i32/i64 positions; Llama 3.1 scaling; partial rotary (even, <= 512); Llama 4 qk-norm |
//! | [`ops::AttentionWorkspace::forward`] | bf16, f16 (tensor cores), f32 (SIMT) | flash-style GQA prefill; head_dim 32, 64, 96, 128, 256; varlen (host or device offsets); K/V contiguous or from the paged cache ([`ops::KvTensors::Paged`]); causal (bottom-right), chunked (Llama 4), temperature (Llama 4); LSE |
//! | [`ops::PagedKvCache::append`] / [`ops::kv_append_on`] | f32, f16, bf16 in; f32, f16, bf16, fp8 e4m3fn pages (per-tensor or per-head scales) | paged cache `[pages, page_size, kv_heads, head_dim]`, page size a power of two; any token/head strides; i64 slots, -1 skips; 16-byte accesses |
//! | [`ops::PagedDecodeWorkspace::forward`] | bf16, f16 q with same-dtype or fp8 pages (tensor cores), f32 (SIMT) | split-KV decode, q_len 1..=8 (causal among them); GQA heads share the mma rows; head_dim 32..256; chunked, temperature, LSE; planned once per batch shape |
//! | [`ops::merge_attention_states()`] | f32, f16, bf16 (f32 LSE) | merge two attention states by their LSE (cascade attention) |
//! | [`ops::swiglu()`] | f32, f16, bf16 | separate, packed `[gate \| up]`, or interleaved gate/up; in place over the gate |
//! | [`ops::moe_route()`] | logits f32, f16, bf16 | Llama 4, softmax (renormalized or not), DeepSeek-V3 grouped top-k; experts <= 512, k <= 8 (16 grouped) |
//! | [`ops::MoeAlign`] | ids i32 | device-side counts, padded offsets, rows ordered by token inside each expert, block -> expert map |
//! | [`ops::moe_gather()`], [`ops::moe_combine()`] | f32, f16, bf16 | expert-contiguous rows (optionally scaled); f32 combine in slot order + shared expert + residual |
//! | [`ops::moe_grouped_gemm()`] | bf16, f16 (tensor cores), f32 (SIMT) | all experts in one launch; `[E, in, out]` or `[E, out, in]` weights; plain or SwiGLU epilogue |
//! | [`ops::moe::MoeFfn`] | f32, f16, bf16 | the whole MoE layer with shared expert, planned once, no host sync |
//! | [`ops::linear()`] / [`ops::linear_add()`] | f32, f16, bf16 (f32 accumulation, one rounding) | `y (+)= x W^T + bias`, W `[out, in]`; cuBLAS on CUDA, a CPU GEMM on the emulated target |
//!
//! The `llama-model` crate composes them into Llama 3 and Llama 4 decoder layers and whole models
//! loaded from Hugging Face checkpoints and GGUF files (prefill and decode, planned workspaces),
//! checked against [`reference::block`].
//!
//! Every op exists at two levels: on [`Tensor`]s (a convenience), and on borrowed
//! [`TensorView`]/[`TensorViewMut`] views of memory the caller owns (cudarc buffers, or host
//! slices on the emulated target), queued on an explicit [`Queue`] (a [`Device`] or an
//! engine's `Arc<CudaStream>`): `ops::rms_norm_on`, `ops::swiglu_on`, `Rope::apply_on`,
//! `AttentionWorkspace::forward_on`, `ops::kv_append_on`, `PagedDecodeWorkspace::forward_on`,
//! `ops::merge_attention_states_on`; the attention calls take one struct of their tensors
//! ([`ops::AttentionTensors`], [`ops::AttentionArgs`], [`ops::DecodeTensors`], [`ops::DecodeArgs`],
//! [`ops::KvAppendArgs`]). Once planned, no call allocates, copies from pageable host
//! memory or waits on the host, so calls can be captured into CUDA graphs; [`Device::counters`]
//! is the counting hook that proves it.
//!
//! ## Targets
//!
//! | [`Target`] | runs | use |
//! | --- | --- | --- |
//! | `Cuda` | the embedded cubin for the GPU's architecture (sm_90, sm_80), else PTX JIT, through cudarc | the product |
//! | `Emulated` | the same `.cu` compiled for the host, CUDA threads as fibers | tests without a GPU, race detection |
//! | [`reference`](mod@reference) | plain Rust, f64 | the specification |
//!
//! Every call validates its inputs and returns a named [`Error`] instead of launching on bad
//! ones; nothing on a caller-reachable path panics.
//!
//! ## Features
//!
//! `dev`: the test and verification support this crate's own tests, benches and command-line
//! front end use (seeded generators and tolerances, the `verify` cases, `inspect`, the
//! emulator self-test kernels). Not needed to use the kernels.

#![warn(missing_debug_implementations, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod backend;
// Test support behind a feature: its cases, tolerances and reports are documented at the module
// level rather than item by item.
#[cfg(feature = "dev")]
#[allow(missing_docs)]
pub mod dev;
pub mod dtype;
pub mod error;
mod ffi;
mod kernels;
mod launch;
pub mod ops;
pub mod reference;
pub mod spec;
mod target;
pub mod tensor;

pub use backend::{
    CpAsyncTiming, Device, DeviceCounters, EmuArch, EmuOptions, KernelRef, Queue, Schedule, Selection, Target,
};
pub use dtype::{DType, Element, F8E4M3};
pub use error::{Error, Result};
pub use launch::tensor_map::{TmaLayout, TmaOobFill, TmaSwizzle};
pub use tensor::{CudaBuffer, CudaBufferGuard, CudaElement, Tensor, TensorView, TensorViewMut};
