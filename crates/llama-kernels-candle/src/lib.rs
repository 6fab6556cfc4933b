#![doc = include_str!("../README.md")]
//!
//! ## How an op reaches the kernels
//!
//! Each forward is a candle `CustomOp1/2/3`: candle hands it the inputs' backend storages and
//! layouts, the op borrows them as llama-kernels views (host slices on the emulated target for
//! CPU storage, `CudaSlice`s queued on candle's stream for CUDA storage), allocates its output
//! through candle and launches. Its `bwd` runs the backward kernels the same way and returns
//! every gradient at once. The kernels check every view (dtype, shape, strides, alignment,
//! overlap) before launching, and their named error becomes the candle error.

#![warn(missing_debug_implementations, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod bridge;
/// The kernel crate, for its configuration types (`DType`, `RopeConfig`, ...).
pub use llama_kernels;
pub mod nn;
pub mod ops;
pub mod unfused;

pub use ops::{
    AttentionMask, AttentionOptions, CrossEntropyOptions, IGNORE_INDEX, KvScales, Lora, LoraConfig, PackedWeight,
    PagedDecodeOptions, PagedKvCache, PagedKvConfig, QLinear, Reduction, RotaryEmbedding, flash_attn,
    flash_attn_varlen, flash_attn_with_lse, fused_add_rms_norm, fused_linear_cross_entropy, rms_norm, rope, swiglu,
    swiglu_packed,
};
