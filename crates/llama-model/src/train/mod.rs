//! LoRA and QLoRA fine-tuning: peft's adapters on a frozen base (dense, NF4 or a GGUF file's
//! packed weights), trained with this library's backward kernels.
//!
//! * [`batch`]: examples packed into micro-batches (no padding), labels shifted as Hugging Face's
//!   causal LM does.
//! * [`layer`]: one decoder layer's forward that keeps its activations, and its backward.
//! * [`data`]: JSON-lines training files (`text` or chat `messages`, the loss on assistant
//!   turns only), as TRL's SFT trainer reads them.
//! * [`schedule`]: constant, linear and cosine learning rates with a warm-up.
//! * [`trainer`]: the whole step: embedding, layers, the fused LM-head cross-entropy, the
//!   backward in reverse, gradient accumulation and AdamW on the adapters.
//!
//! The adapters use peft's semantics ([`llama_kernels::ops::lora`]); they are read and written in
//! peft's format by [`crate::formats::peft`].
//!
//! **Memory.** The forward keeps, per layer and token, `n1`, `h1`, `n2` (3 × hidden), the fused
//! qkv after RoPE, the attention output (q heads × head_dim), the gate|up output (2 ×
//! intermediate), the SwiGLU output (intermediate) in the run dtype, and the log-sum-exp (q
//! heads, f32), plus the residual stream (hidden) per layer. For Llama 3 8B in bf16 that is
//! (4·4096 + 6144 + 4096 + 3·14336) × 2 + 32 × 4 bytes = 136 KiB per token and layer. With
//! [`TrainPlan::recompute`] (gradient checkpointing) only each layer's input stays (8 KiB per
//! token and layer) and one layer's activations are shared, each layer's forward running again
//! before its backward: the same gradients, bit for bit, for about a third more compute. The base
//! weights get no gradient; the LM head's product runs in chunks, so the logits never exist
//! whole.

pub mod batch;
pub mod data;
pub mod layer;
pub mod schedule;
pub mod trainer;

pub use batch::{Batch, Example, IGNORE};
pub use data::{Encoder, micro_batches};
pub use schedule::{LrSchedule, Schedule};
pub use trainer::{LoraTrainer, TrainConfig, TrainPlan};
