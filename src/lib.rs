//! # llama-kernels
//!
//! Hand-written CUDA kernels for Llama 3 and Llama 4 decoder blocks, behind a safe Rust API,
//! with an f64 CPU reference for every kernel and an emulated target that runs the very same
//! kernel sources on a CPU, so that they are tested on every commit, GPU or not.
//!
//! ## Ops
//!
//! | op | dtypes | constraints |
//! | --- | --- | --- |
//! | [`ops::rms_norm()`] | f32, f16, bf16 (f32 accumulation) | any hidden > 0; rows may be strided; 16-byte vector path when aligned, scalar fallback otherwise; in place allowed |
//! | [`ops::fused_add_rms_norm()`] | f32, f16, bf16 | as `rms_norm`; writes `x + residual` back into `residual` |
//! | [`ops::Rope::apply`] | f32, f16, bf16 | q and k in place in one launch; interleaved or half-split; i32/i64 positions; Llama 3.1 scaling; partial rotary (even, <= 512); Llama 4 qk-norm |
//! | [`ops::AttentionWorkspace::forward`] | bf16, f16 (tensor cores), f32 (SIMT) | flash-style GQA prefill; head_dim 64, 96, 128; varlen; causal (bottom-right), chunked (Llama 4), temperature (Llama 4); LSE |
//! | [`ops::swiglu()`] | f32, f16, bf16 | separate, packed `[gate \| up]`, or interleaved gate/up; in place over the gate |
//!
//! ## Targets
//!
//! | [`Target`] | runs | use |
//! | --- | --- | --- |
//! | `Cuda` | PTX (sm_90 or sm_80) through cudarc | the product |
//! | `Emulated` | the same `.cu` compiled for the host, CUDA threads as fibers | tests without a GPU, race detection |
//! | [`reference`](mod@reference) | plain Rust, f64 | the specification |
//!
//! ## Quick start
//!
//! ```
//! use llama_kernels::{DType, Device, Tensor, ops};
//!
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best(); // the GPU if there is one, else the emulator
//! let (rows, hidden) = (4, 64);
//! let x: Vec<f32> = (0..rows * hidden).map(|i| (i as f32 * 0.37).sin()).collect();
//! let x = Tensor::from_slice(&device, &x, &[rows, hidden])?;
//! let weight = Tensor::from_slice(&device, &vec![1.0f32; hidden], &[hidden])?;
//! let y = Tensor::zeros(&device, DType::F32, &[rows, hidden])?;
//! ops::rms_norm(&x, &weight, 1e-5, &y)?;
//! let y: Vec<f32> = y.to_vec()?;
//! let mean_sq: f32 = y[..hidden].iter().map(|v| v * v).sum::<f32>() / hidden as f32;
//! assert!((mean_sq - 1.0).abs() < 1e-3);
//! # Ok(())
//! # }
//! ```
//!
//! Every call validates its inputs and returns a named [`Error`] instead of launching on bad
//! ones; nothing on a caller-reachable path panics.

#![warn(missing_debug_implementations)]

pub mod backend;
pub mod dtype;
pub mod error;
pub mod inspect;
pub mod ops;
#[allow(missing_docs)]
pub mod params;
pub mod reference;
pub mod selftest;
pub mod tensor;
pub mod testing;
pub mod verify;

pub use backend::{CpAsyncTiming, Device, EmuOptions, KernelRef, Schedule, Target};
pub use dtype::{DType, Element};
pub use error::{Error, Result};
pub use tensor::Tensor;
