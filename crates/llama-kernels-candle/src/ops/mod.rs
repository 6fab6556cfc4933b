//! The ops, one file each: forward as a candle `CustomOp`, backward from the backward kernels.

pub mod attention;
pub mod cross_entropy;
pub mod lora;
pub mod paged_decode;
pub mod qlinear;
pub mod rms_norm;
pub mod rope;
pub mod swiglu;

pub use attention::{AttentionMask, AttentionOptions, flash_attn, flash_attn_varlen, flash_attn_with_lse};
pub use cross_entropy::{CrossEntropyOptions, IGNORE_INDEX, Reduction, fused_linear_cross_entropy};
pub use lora::{Lora, LoraConfig};
pub use paged_decode::{KvScales, PagedDecodeOptions, PagedKvCache, PagedKvConfig};
pub use qlinear::{PackedWeight, QLinear};
pub use rms_norm::{fused_add_rms_norm, rms_norm};
pub use rope::{RotaryEmbedding, rope};
pub use swiglu::{swiglu, swiglu_packed};
