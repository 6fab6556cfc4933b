//! The text around a model: the tokenizer ([`Tokenizer`]: byte-level BPE from `tokenizer.json`
//! or GGUF metadata, SentencePiece BPE from GGUF metadata), [`StreamDecoder`] for one token at a
//! time, the chat template ([`ChatTemplate`], minijinja, run as untrusted input) and the stop ids
//! ([`StopIds`]).

pub mod chat;
mod gguf_vocab;
pub mod jinja;
mod pretokenizer;
pub mod spm;
pub mod stop;
mod stream;
pub mod tokenizer;

pub use chat::{ChatTemplate, Message};
pub use stop::StopIds;
pub use stream::StreamDecoder;
pub use tokenizer::Tokenizer;
