//! The model crate's tests: file formats (safetensors checkpoints, GGUF, bitsandbytes), the
//! tokenizers and chat templates, decoder layers and whole models against the f64 reference.
//! One binary, so that the device code it embeds is linked once.

mod block;
#[path = "../../../llama-kernels/tests/kernels/common.rs"]
mod common;
mod gguf;
mod gguf_arch;
mod gguf_hf;
mod hf_fixtures;
mod hostile;
mod model;
mod nf4;
mod peft;
mod tokenizer;
mod train;
