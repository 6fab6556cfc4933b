#![doc = include_str!("../README.md")]
//!
//! ## Modules
//!
//! The files models come in ([`formats`]: Hugging Face `config.json` and safetensors
//! checkpoints, GGUF, bitsandbytes NF4), the decoder-layer composer ([`block`]: prefill and
//! decode over a paged KV cache, planned workspaces), whole models with device sampling
//! ([`model`]) and the text around them ([`text`]: tokenizers, chat templates, stop ids,
//! streaming). Each layer is checked stage by stage against the f64 reference composer
//! ([`llama_kernels::reference::block`]).
//!
//! Errors are this crate's [`Error`]: the kernels' named errors ([`Error::Kernel`]) and those of
//! files, configs and templates.
//!
//! ## Features
//!
//! `dev`: the block and model checks of `verify`, seeded random models and the test model's
//! path, for this workspace's tests and command-line front end. Not needed to run models.

#![warn(missing_debug_implementations, missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod block;
// Test support behind a feature: its cases and reports are documented at the module level.
#[cfg(feature = "dev")]
#[allow(missing_docs)]
pub mod dev;
pub mod error;
pub mod formats;
pub mod model;
pub mod text;
pub mod train;

pub use error::{Error, Result};
pub use formats::{Checkpoint, GgufFile, ModelConfig};
pub use model::{HostModel, Model, ModelPlan, TextModel, WeightFormat};
pub use text::{ChatTemplate, StopIds, Tokenizer};
