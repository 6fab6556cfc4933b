//! Whole models: the host weights of a checkpoint or GGUF file ([`HostModel`]) and the model on
//! the device ([`Model`]): embedding, decoder layers, final norm and LM head over one paged KV
//! cache; and the text around them: the tokenizer ([`Tokenizer`], byte-level BPE from
//! `tokenizer.json` or GGUF metadata, SentencePiece BPE from GGUF metadata, with
//! [`StreamDecoder`] for one token at a time), the chat
//! template ([`ChatTemplate`], minijinja) and the stop ids ([`StopIds`]).
//!
//! ```no_run
//! use llama_kernels::model::{HostModel, Logits, Model, ModelPlan};
//! use llama_kernels::{DType, Device};
//! # fn main() -> llama_kernels::Result<()> {
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
pub mod chat;
pub mod generate;
mod gguf_vocab;
mod pretokenizer;
pub mod runner;
pub mod spm;
pub mod stop;
mod stream;
pub mod text;
pub mod tokenizer;
pub mod weights;

pub use batch::BatchRequest;
pub use chat::{ChatTemplate, Message};
pub use generate::{GenerateOptions, Generation, SamplingConfig, StopReason};
pub use runner::{Logits, Model, ModelPlan};
pub use stop::StopIds;
pub use stream::StreamDecoder;
pub use text::{TextModel, default_dtype};
pub use tokenizer::Tokenizer;
pub use weights::{HostModel, MAX_VOCAB, WeightFormat};
