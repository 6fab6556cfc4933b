//! A GGUF file's tokenizer metadata (`tokenizer.ggml.*`), read with bounds and typed errors: the
//! pieces both vocabulary builders share (byte-level BPE in [`tokenizer`](super::tokenizer),
//! SentencePiece in [`spm`](super::spm)). Every failure is an [`Error::Config`] whose field is
//! the GGUF key.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokenizers::models::bpe::Merges;

use crate::error::{Error, Result};
use crate::formats::gguf::GgufValue;

/// Most tokens a vocabulary may have (the largest in use are about 262k).
pub const MAX_VOCAB: usize = 1 << 21;
/// Most merges a BPE vocabulary may have (Llama 3 has 280k for 128k tokens).
pub const MAX_MERGES: usize = 1 << 22;
/// Longest token text accepted, in bytes of its stored (byte-level) form.
pub const MAX_TOKEN_BYTES: usize = 4096;

pub(super) const TOKENS: &str = "tokenizer.ggml.tokens";
pub(super) const TYPES: &str = "tokenizer.ggml.token_type";
pub(super) const MERGES: &str = "tokenizer.ggml.merges";

/// llama.cpp's token types (`tokenizer.ggml.token_type`).
pub(super) mod token_type {
    pub const UNDEFINED: i64 = 0;
    pub const NORMAL: i64 = 1;
    pub const UNKNOWN: i64 = 2;
    pub const CONTROL: i64 = 3;
    pub const USER_DEFINED: i64 = 4;
    pub const UNUSED: i64 = 5;
    pub const BYTE: i64 = 6;
}

/// The parts of a [`Tokenizer`](super::Tokenizer) a vocabulary builder makes.
pub(super) struct Parts {
    pub inner: tokenizers::Tokenizer,
    /// Each id's bytes.
    pub pieces: Vec<Box<[u8]>>,
    /// Whether each id is special (skipped by `skip_special_tokens`).
    pub special: Vec<bool>,
    pub prepend_bos: Option<u32>,
    pub append_eos: Option<u32>,
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub pad: Option<u32>,
    /// Whether decoding drops one leading space (SentencePiece's dummy prefix).
    pub strip_leading_space: bool,
}

pub(super) fn config(field: &str, why: impl Into<String>) -> Error {
    Error::Config { field: field.to_string(), why: why.into() }
}

pub(super) fn hf_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Config { field: what.to_string(), why: e.to_string() }
}

pub(super) fn kind(v: &GgufValue) -> &'static str {
    match v {
        GgufValue::U64(_) | GgufValue::I64(_) => "an integer",
        GgufValue::F64(_) => "a float",
        GgufValue::Bool(_) => "a boolean",
        GgufValue::Str(_) => "a string",
        GgufValue::Array(_) => "an array",
    }
}

pub(super) fn meta_str<'a>(meta: &'a BTreeMap<String, GgufValue>, key: &str) -> Result<Option<&'a str>> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => v.as_str().map(Some).ok_or_else(|| config(key, format!("expected a string, found {}", kind(v)))),
    }
}

pub(super) fn meta_array<'a>(
    meta: &'a BTreeMap<String, GgufValue>,
    key: &str,
    max: usize,
) -> Result<Option<&'a [GgufValue]>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Array(items)) => {
            if items.len() > max {
                return Err(config(key, format!("{} entries exceed the {max} accepted", items.len())));
            }
            Ok(Some(items))
        }
        Some(v) => Err(config(key, format!("expected an array, found {}", kind(v)))),
    }
}

pub(super) fn meta_bool(meta: &BTreeMap<String, GgufValue>, key: &str) -> Result<Option<bool>> {
    match meta.get(key) {
        None => Ok(None),
        Some(GgufValue::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(config(key, format!("expected a boolean, found {}", kind(v)))),
    }
}

/// An optional token id, which must lie in a vocabulary of `n` tokens.
pub(super) fn meta_id(meta: &BTreeMap<String, GgufValue>, key: &str, n: usize) -> Result<Option<u32>> {
    match meta.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(id) if id < n as u64 => Ok(Some(id as u32)),
            Some(id) => Err(config(key, format!("token id {id} is outside the vocabulary of {n} tokens"))),
            None => Err(config(key, format!("expected a token id, found {}", kind(v)))),
        },
    }
}

/// The vocabulary: token texts in id order, their ids, and their types.
pub(super) struct Vocab<'a> {
    pub texts: Vec<&'a str>,
    pub ids: HashMap<&'a str, u32>,
    pub types: Vec<i64>,
    /// Whether `tokenizer.ggml.token_type` was given (else every type is normal).
    pub typed: bool,
}

impl Vocab<'_> {
    pub fn len(&self) -> usize {
        self.texts.len()
    }
}

/// `tokenizer.ggml.tokens` (non-empty, unique, each at most [`MAX_TOKEN_BYTES`]) and
/// `tokenizer.ggml.token_type` (one known type per token; all normal when absent).
pub(super) fn read_vocab(meta: &BTreeMap<String, GgufValue>) -> Result<Vocab<'_>> {
    let tokens = meta_array(meta, TOKENS, MAX_VOCAB)?.ok_or_else(|| config(TOKENS, "missing"))?;
    if tokens.is_empty() {
        return Err(config(TOKENS, "the vocabulary is empty"));
    }
    let n = tokens.len();
    let mut texts: Vec<&str> = Vec::with_capacity(n);
    let mut ids: HashMap<&str, u32> = HashMap::with_capacity(n);
    for (id, t) in tokens.iter().enumerate() {
        let text = t.as_str().ok_or_else(|| config(TOKENS, format!("token {id} is {}, expected a string", kind(t))))?;
        if text.is_empty() {
            return Err(config(TOKENS, format!("token {id} is empty")));
        }
        if text.len() > MAX_TOKEN_BYTES {
            return Err(config(TOKENS, format!("token {id} has {} bytes (at most {MAX_TOKEN_BYTES})", text.len())));
        }
        if let Some(first) = ids.insert(text, id as u32) {
            return Err(config(TOKENS, format!("tokens {first} and {id} are both `{text}`")));
        }
        texts.push(text);
    }

    let (types, typed) = match meta_array(meta, TYPES, MAX_VOCAB)? {
        None => (vec![token_type::NORMAL; n], false),
        Some(items) => {
            if items.len() != n {
                return Err(config(TYPES, format!("{} entries for {n} tokens", items.len())));
            }
            let mut types = Vec::with_capacity(n);
            for (id, v) in items.iter().enumerate() {
                let ty = match v {
                    GgufValue::I64(t) => *t,
                    GgufValue::U64(t) => i64::try_from(*t).unwrap_or(i64::MAX),
                    other => return Err(config(TYPES, format!("token {id}'s type is {}", kind(other)))),
                };
                if !(token_type::UNDEFINED..=token_type::BYTE).contains(&ty) {
                    return Err(config(TYPES, format!("token {id} has unknown type {ty} (0..=6)")));
                }
                types.push(ty);
            }
            (types, true)
        }
    };
    Ok(Vocab { texts, ids, types, typed })
}

/// `tokenizer.ggml.merges` (`"left right"`, rank order), `None` when absent. Both sides and
/// their concatenation must be tokens; a repeated merge keeps its first rank, as llama.cpp's
/// rank table does.
pub(super) fn read_merges(meta: &BTreeMap<String, GgufValue>, vocab: &Vocab<'_>) -> Result<Option<Merges>> {
    let Some(merge_items) = meta_array(meta, MERGES, MAX_MERGES)? else { return Ok(None) };
    let mut merges: Merges = Vec::with_capacity(merge_items.len());
    let mut seen: HashSet<(&str, &str)> = HashSet::with_capacity(merge_items.len());
    for (i, m) in merge_items.iter().enumerate() {
        let text = m.as_str().ok_or_else(|| config(MERGES, format!("merge {i} is {}, expected a string", kind(m))))?;
        // As llama.cpp: the separator is the first space after the first character.
        let first_len = text.chars().next().map_or(0, char::len_utf8);
        let (left, right) = match text[first_len..].find(' ') {
            Some(at) => (&text[..first_len + at], &text[first_len + at + 1..]),
            None => {
                return Err(config(MERGES, format!("merge {i} `{text}` is not two tokens separated by a space")));
            }
        };
        if right.is_empty() {
            return Err(config(MERGES, format!("merge {i} `{text}` is not two tokens separated by a space")));
        }
        for part in [left, right] {
            if !vocab.ids.contains_key(part) {
                return Err(config(
                    MERGES,
                    format!("merge {i} `{text}` names `{part}`, which is not in the vocabulary"),
                ));
            }
        }
        let merged = format!("{left}{right}");
        if !vocab.ids.contains_key(merged.as_str()) {
            return Err(config(MERGES, format!("merge {i} `{text}` makes `{merged}`, which is not in the vocabulary")));
        }
        if seen.insert((left, right)) {
            merges.push((left.to_string(), right.to_string()));
        }
    }
    Ok(Some(merges))
}

/// Checks that every token `added` selects kept its own id as an added token of `inner` (a
/// duplicate would have been refused before).
pub(super) fn check_added_ids(
    inner: &tokenizers::Tokenizer,
    vocab: &Vocab<'_>,
    added: impl Fn(i64) -> bool,
) -> Result<()> {
    for (id, (text, &ty)) in vocab.texts.iter().zip(&vocab.types).enumerate() {
        if added(ty) && inner.token_to_id(text) != Some(id as u32) {
            return Err(config(TOKENS, format!("token {id} `{text}` did not keep its id as an added token")));
        }
    }
    Ok(())
}
