//! The files models come in, read defensively: a file is untrusted input, so every count and
//! length is checked before anything is allocated from it, and nothing outside the checkpoint a
//! caller names is opened.
//!
//! * [`config`]: a Hugging Face `config.json` (flat `LlamaConfig`, flat or nested
//!   `Llama4TextConfig`) → a [`LayerSpec`](config::LayerSpec) per layer.
//! * [`checkpoint`]: safetensors weights by Hugging Face name, read by positioned reads, one file or
//!   sharded, converted once to the run dtype.
//! * [`bnb`]: bitsandbytes NF4 weights in those checkpoints, kept packed
//!   ([`Checkpoint::packed`]).
//! * [`gguf`]: llama.cpp's GGUF files: metadata, tensor directory, data.
//! * [`peft`]: LoRA adapters in peft's format (`adapter_config.json`,
//!   `adapter_model.safetensors`), read and written.
//! * [`files`]: opening and reading files inside a checkpoint: regular files only, JSON read up
//!   to a cap, weights by positioned reads.

pub mod bnb;
pub mod checkpoint;
pub mod config;
pub mod files;
pub mod gguf;
pub mod peft;

pub use checkpoint::Checkpoint;
pub use config::{Llama4TextConfig, LlamaConfig, ModelConfig};
pub use gguf::GgufFile;
