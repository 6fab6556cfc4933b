//! Whole models: the host weights of a checkpoint or GGUF file ([`HostModel`]) and the model on
//! the device ([`Model`]): embedding, decoder layers, final norm and LM head over one paged KV
//! cache; generation with device sampling ([`generate`], [`BatchRequest`]); and a model with its
//! text ([`TextModel`]: the tokenizer, chat template and stop ids of [`crate::text`]).
//!
//! ```no_run
//! use llama_kernels::{DType, Device};
//! use llama_model::model::{HostModel, Logits, Model, ModelPlan};
//! # fn main() -> llama_model::Result<()> {
//! let device = Device::best();
//! let host = HostModel::from_gguf("SmolLM2-135M-Instruct.Q4_1.gguf", DType::BF16)?;
//! let plan = ModelPlan { slots: 4, max_len: 2048, max_tokens: 256 };
//! let mut model = Model::new(&device, &host, DType::BF16, plan)?;
//! // Prefill a prompt in slot 0; the logits of its last token come back.
//! let logits = model.step(&[(0, &[1, 2, 3])], Logits::Last)?;
//! let next = logits.to_f64_vec()?;
//! # let _ = next;
//! # Ok(())
//! # }
//! ```

pub mod batch;
pub mod generate;
pub mod gguf;
pub mod runner;
pub mod text_model;
pub mod weights;

pub use batch::BatchRequest;
pub use generate::{GenerateOptions, Generation, SamplingConfig, StopReason};
pub use runner::{Logits, Model, ModelPlan};
pub use text_model::{TextModel, TextParts, default_dtype};
pub use weights::{HostModel, MAX_VOCAB, WeightFormat};
