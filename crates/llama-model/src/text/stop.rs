//! Stop ids: the token ids that end generation.
//!
//! A Hugging Face checkpoint names them as `eos_token_id` in `generation_config.json` (what
//! `generate` uses), else in `config.json` (top level, or `text_config` for multimodal Llama 4):
//! a number or a list (Llama 3.1 Instruct lists 128001 `<|end_of_text|>`, 128008 `<|eom_id|>`
//! and 128009 `<|eot_id|>`).
//!
//! A GGUF file names `tokenizer.ggml.eos_token_id`, and may name `eot_token_id` and
//! `eom_token_id`; as llama.cpp does, the control tokens whose text is a known end-of-turn or
//! end-of-text marker (`<|im_end|>`, `<|eot_id|>`, `<|eom_id|>`, `<|end|>`, `<end_of_turn>`,
//! `<|endoftext|>`, `<|end_of_text|>`, `<EOT>`, `<|end▁of▁sentence|>`) stop generation too, and
//! so does the tokenizer's EOS (the same id, or llama.cpp's default `</s>` of a SentencePiece
//! vocabulary that names none).
//! SmolLM2's GGUF has `eos_token_id` 2 (`<|im_end|>`, its end of turn) and no `eot_token_id`;
//! its `<|endoftext|>` (0) is added by the marker rule, so its set is {0, 2}.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use super::tokenizer::{MAX_CONFIG_BYTES, Tokenizer, read_bounded};
use crate::error::{Error, Result};
use crate::formats::gguf::{GgufFile, GgufValue};

/// Most stop ids a configuration may list.
pub const MAX_STOP_IDS: usize = 1024;

/// Texts of control tokens that end a turn or a text (llama.cpp's end-of-generation list).
pub const END_MARKERS: &[&str] = &[
    "<|im_end|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "<|end▁of▁sentence|>",
];

/// A set of token ids that end generation.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopIds {
    ids: BTreeSet<u32>,
}

impl StopIds {
    /// A set of the given ids.
    pub fn new(ids: impl IntoIterator<Item = u32>) -> StopIds {
        StopIds { ids: ids.into_iter().collect() }
    }

    /// Whether `id` ends generation.
    pub fn contains(&self, id: u32) -> bool {
        self.ids.contains(&id)
    }

    /// The ids, ascending.
    pub fn ids(&self) -> impl Iterator<Item = u32> + '_ {
        self.ids.iter().copied()
    }

    /// Number of ids.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    /// Adds `id`.
    pub fn insert(&mut self, id: u32) {
        self.ids.insert(id);
    }

    /// The ids as a set (what [`GenerateOptions::stop`](crate::model::GenerateOptions::stop) takes).
    pub fn as_set(&self) -> &BTreeSet<u32> {
        &self.ids
    }

    /// An `eos_token_id` value: a number or a list of numbers (each a u32), `field` naming it
    /// in errors. `null` is the empty set.
    pub fn from_json(value: &serde_json::Value, field: &str) -> Result<StopIds> {
        let bad = |why: String| Error::Config { field: field.to_string(), why };
        let one = |v: &serde_json::Value| -> Result<u32> {
            v.as_u64().and_then(|id| u32::try_from(id).ok()).ok_or_else(|| bad(format!("`{v}` is not a token id")))
        };
        match value {
            serde_json::Value::Null => Ok(StopIds::default()),
            serde_json::Value::Array(items) => {
                if items.len() > MAX_STOP_IDS {
                    return Err(bad(format!("{} ids exceed the {MAX_STOP_IDS} accepted", items.len())));
                }
                Ok(StopIds { ids: items.iter().map(one).collect::<Result<_>>()? })
            }
            v => Ok(StopIds::new([one(v)?])),
        }
    }

    /// The stop ids of a Hugging Face checkpoint directory (see the [module docs](self)).
    /// Neither file naming `eos_token_id` is an [`Error::Config`].
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<StopIds> {
        let dir = dir.as_ref();
        for (file, nested) in [("generation_config.json", false), ("config.json", true)] {
            let path = dir.join(file);
            if !path.exists() {
                continue;
            }
            let bytes = read_bounded(&path, MAX_CONFIG_BYTES)?;
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Io { path: path.display().to_string(), why: e.to_string() })?;
            if let Some(ids) = v.get("eos_token_id") {
                return StopIds::from_json(ids, &format!("{file} eos_token_id"));
            }
            if let Some(ids) = v.get("text_config").and_then(|t| t.get("eos_token_id")).filter(|_| nested) {
                return StopIds::from_json(ids, &format!("{file} text_config.eos_token_id"));
            }
        }
        Err(Error::Config {
            field: "eos_token_id".into(),
            why: format!("neither generation_config.json nor config.json in {} names it", dir.display()),
        })
    }

    /// The stop ids of GGUF metadata (see the [module docs](self)), `tokenizer` being the one
    /// built from the same metadata. Ids outside its vocabulary are an [`Error::Config`].
    pub fn from_gguf_metadata(meta: &BTreeMap<String, GgufValue>, tokenizer: &Tokenizer) -> Result<StopIds> {
        let n = tokenizer.vocab_size();
        let mut stop = StopIds::default();
        for key in ["tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
            if let Some(v) = meta.get(key) {
                match v.as_u64() {
                    Some(id) if id < n as u64 => stop.insert(id as u32),
                    _ => {
                        return Err(Error::Config {
                            field: key.into(),
                            why: format!("not a token id of the {n}-token vocabulary"),
                        });
                    }
                }
            }
        }
        // A SentencePiece vocabulary without the key has llama.cpp's default EOS (2).
        stop.ids.extend(tokenizer.eos_token_id());
        for marker in END_MARKERS {
            if let Some(id) = tokenizer.token_to_id(marker).filter(|&id| tokenizer.is_special(id)) {
                stop.insert(id);
            }
        }
        Ok(stop)
    }

    /// The stop ids of a GGUF file.
    pub fn from_gguf(file: &GgufFile, tokenizer: &Tokenizer) -> Result<StopIds> {
        Self::from_gguf_metadata(file.metadata(), tokenizer)
    }
}

impl From<StopIds> for BTreeSet<u32> {
    fn from(stop: StopIds) -> BTreeSet<u32> {
        stop.ids
    }
}
