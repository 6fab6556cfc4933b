//! Tokenizers from a Hugging Face `tokenizer.json` or from a GGUF file's metadata, encoded by
//! the `tokenizers` crate and decoded byte-exactly, all at once ([`Tokenizer::decode`]) or one
//! token at a time ([`StreamDecoder`](super::StreamDecoder)): byte-level BPE (GPT-2, Llama 3,
//! Llama 4, SmolLM, Qwen) and, from GGUF, SentencePiece BPE (Llama 2, Mistral, TinyLlama; see
//! [`spm`](super::spm)).
//!
//! # From GGUF metadata
//!
//! llama.cpp stores the vocabulary in the file: `tokenizer.ggml.model` (`gpt2` is byte-level
//! BPE, `llama` SentencePiece), `tokenizer.ggml.tokens` (id order), `tokenizer.ggml.token_type`
//! (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte), `tokenizer.ggml.merges`
//! (`"left right"`, rank order), `tokenizer.ggml.pre` (which split regexes come before BPE),
//! the special ids (`bos_token_id`, `eos_token_id`, `padding_token_id`, ...) and
//! `add_bos_token`. For `gpt2`, the Hugging Face pipeline built from it is what the original
//! `tokenizer.json` says: the pre-tokenizer names' regexes as isolated splits (the table of
//! [`GGUF_PRE_TOKENIZERS`], the same names and regexes llama.cpp's `llama-vocab.cpp` uses, in
//! their original `tokenizer.json` form), a byte-level mapping, BPE over the merges (ignoring
//! the merges when the whole piece is a token, for `llama-bpe`), and the control and
//! user-defined tokens as added tokens, so that chat markers such as `<|im_start|>` in a text
//! encode to their single id. For `llama`, see [`spm`](super::spm).
//!
//! The metadata is untrusted: every list length is bounded ([`MAX_VOCAB`], [`MAX_MERGES`],
//! [`MAX_TOKEN_BYTES`]), every special id must lie in the vocabulary, and a merge that names a
//! token outside the vocabulary (or whose result is not a token), a duplicate token, a
//! `token_type` list of another length or an unknown type is refused by name as an
//! [`Error::Config`] whose field is the GGUF key. Unknown `tokenizer.ggml.pre` names (for
//! `gpt2`) and other models (`bert`, `t5`, `rwkv`, ...) are [`Error::Unsupported`], never a
//! silent fallback.
//!
//! # Decoding
//!
//! Every id has its bytes, computed once: a byte-level token's characters mapped back through
//! GPT-2's byte-to-unicode table (as the Hugging Face `ByteLevel` decoder does), a SentencePiece
//! token's text with `▁` as a space or its `<0xNN>` byte, an added or control token's text as
//! it is. [`Tokenizer::decode`] joins them (dropping one leading space for SentencePiece, the
//! dummy prefix) and replaces invalid UTF-8 with U+FFFD; [`StreamDecoder`](super::StreamDecoder)
//! takes one id at a time and returns only completed characters, holding back the bytes of a
//! character split across tokens until its last byte arrives.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, DecoderWrapper, ModelWrapper, PreTokenizerWrapper, SplitDelimiterBehavior};

use super::gguf_vocab::{
    MERGES, Parts, check_added_ids, config, hf_err, meta_bool, meta_id, meta_str, read_merges, read_vocab, token_type,
};
use crate::error::{Error, Result};
use crate::formats::gguf::{GgufFile, GgufValue};

pub use super::gguf_vocab::{MAX_MERGES, MAX_TOKEN_BYTES, MAX_VOCAB};
pub use super::pretokenizer::{GGUF_PRE_TOKENIZERS, GgufPreTokenizer, gguf_pre_tokenizer};

/// Largest `tokenizer.json` read, in bytes (Llama 3's is 9 MB).
pub const MAX_TOKENIZER_JSON_BYTES: u64 = 256 << 20;

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes stand for themselves, the others for
/// U+0100 onwards in byte order.
fn byte_chars() -> [char; 256] {
    let printable = |b: u32| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let b = b as u32;
        let c = if printable(b) {
            b
        } else {
            next += 1;
            next - 1
        };
        *slot = char::from_u32(c).unwrap_or('\0');
    }
    table
}

/// A token's bytes from its byte-level text: every character through the inverse table, or,
/// when one is outside the table, the text's own UTF-8 (what Hugging Face's `ByteLevel`
/// decoder does).
fn byte_level_bytes(text: &str, inverse: &HashMap<char, u8>) -> Box<[u8]> {
    text.chars()
        .map(|c| inverse.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| text.as_bytes().to_vec())
        .into_boxed_slice()
}

fn inverse_byte_chars() -> HashMap<char, u8> {
    byte_chars().iter().enumerate().map(|(b, &c)| (c, b as u8)).collect()
}

pub use crate::formats::files::MAX_CONFIG_BYTES;
pub(crate) use crate::formats::files::read_bounded;

/// The text of a special token named by `key` in a `tokenizer_config.json`: a string, or an
/// added-token object with `content`; `None` when absent or null.
pub(crate) fn token_text(config: &serde_json::Value, key: &str) -> Result<Option<String>> {
    match config.get(key) {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => match v.get("content").and_then(serde_json::Value::as_str) {
            Some(s) => Ok(Some(s.to_string())),
            None => Err(Error::Config {
                field: format!("tokenizer_config.json {key}"),
                why: "expected a string or an object with a `content` string".into(),
            }),
        },
    }
}

/// A tokenizer with byte-exact decoding (byte-level BPE, or SentencePiece BPE from GGUF).
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` with special tokens in the text encoded as plain text, made on first use.
    literal: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// Each id's bytes.
    pieces: Vec<Box<[u8]>>,
    /// Whether each id is special (control tokens; skipped by `skip_special_tokens`).
    special: Vec<bool>,
    /// Prepended by [`Tokenizer::encode`] with `add_special_tokens` (GGUF `add_bos_token`); a
    /// `tokenizer.json` adds its own through its post-processor instead.
    prepend_bos: Option<u32>,
    /// Appended by [`Tokenizer::encode`] with `add_special_tokens` (GGUF `add_eos_token`, read
    /// for SentencePiece vocabularies).
    append_eos: Option<u32>,
    bos: Option<u32>,
    eos: Option<u32>,
    pad: Option<u32>,
    /// Decoding drops one leading space (SentencePiece's dummy prefix, `add_space_prefix`).
    strip_leading_space: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.pieces.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("pad", &self.pad)
            .field("prepend_bos", &self.prepend_bos.is_some())
            .field("append_eos", &self.append_eos.is_some())
            .field("strip_leading_space", &self.strip_leading_space)
            .finish()
    }
}

/// The byte-level BPE (`gpt2`) vocabulary of GGUF metadata (see the [module docs](self)).
fn byte_level_from_gguf(meta: &BTreeMap<String, GgufValue>) -> Result<Parts> {
    const PRE: &str = "tokenizer.ggml.pre";
    let pre_name = meta_str(meta, PRE)?
        .ok_or_else(|| config(PRE, "missing (llama.cpp then guesses a degraded default; name the pre-tokenizer)"))?;
    let pre = gguf_pre_tokenizer(pre_name).ok_or_else(|| {
        let known: Vec<&str> = GGUF_PRE_TOKENIZERS.iter().flat_map(|p| p.names.iter().copied()).collect();
        Error::Unsupported { what: format!("GGUF {PRE} `{pre_name}` (known: {})", known.join(", ")) }
    })?;

    let vocab = read_vocab(meta)?;
    let n = vocab.len();
    let merges = read_merges(meta, &vocab)?.ok_or_else(|| config(MERGES, "missing"))?;

    let bos = meta_id(meta, "tokenizer.ggml.bos_token_id", n)?;
    let eos = meta_id(meta, "tokenizer.ggml.eos_token_id", n)?;
    let pad = meta_id(meta, "tokenizer.ggml.padding_token_id", n)?;
    for key in ["tokenizer.ggml.unknown_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        meta_id(meta, key, n)?;
    }
    let add_bos = meta_bool(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(pre.add_bos);
    let prepend_bos = match (add_bos, bos) {
        (true, Some(id)) => Some(id),
        (true, None) => {
            return Err(config("tokenizer.ggml.bos_token_id", "missing, but add_bos_token asks for a BOS token"));
        }
        (false, _) => None,
    };

    let model = BPE::builder()
        .vocab_and_merges(
            vocab.texts.iter().enumerate().map(|(id, t)| (t.to_string(), id as u32)).collect::<Vocab>(),
            merges,
        )
        .ignore_merges(pre.ignore_merges)
        .build()
        .map_err(|e| hf_err(MERGES, e))?;
    let mut steps: Vec<PreTokenizerWrapper> = Vec::with_capacity(pre.regexes.len() + 1);
    for re in pre.regexes {
        let split = Split::new(SplitPattern::Regex((*re).to_string()), SplitDelimiterBehavior::Isolated, false)
            .map_err(|e| hf_err(PRE, e))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(tokenizers::decoders::byte_level::ByteLevel::default()));

    let is_added = |ty: i64| ty == token_type::CONTROL || ty == token_type::USER_DEFINED;
    let added: Vec<AddedToken> = vocab
        .texts
        .iter()
        .zip(&vocab.types)
        .filter(|&(_, &ty)| is_added(ty))
        .map(|(t, &ty)| AddedToken::from(t.to_string(), ty == token_type::CONTROL).normalized(false))
        .collect();
    inner.add_special_tokens(&added);

    let inverse = inverse_byte_chars();
    let mut pieces = Vec::with_capacity(n);
    let mut special = Vec::with_capacity(n);
    for (text, &ty) in vocab.texts.iter().zip(&vocab.types) {
        let (bytes, is_special) = match ty {
            token_type::NORMAL | token_type::BYTE => (byte_level_bytes(text, &inverse), false),
            token_type::USER_DEFINED => (text.as_bytes().into(), false),
            // Control, unknown, unused and undefined tokens: their text, skipped as special.
            token_type::CONTROL | token_type::UNKNOWN | token_type::UNUSED | token_type::UNDEFINED => {
                (text.as_bytes().into(), true)
            }
            _ => (text.as_bytes().into(), true),
        };
        pieces.push(bytes);
        special.push(is_special);
    }
    check_added_ids(&inner, &vocab, is_added)?;
    Ok(Parts { inner, pieces, special, prepend_bos, append_eos: None, bos, eos, pad, strip_leading_space: false })
}

impl Tokenizer {
    /// The tokenizer of a GGUF file, from its metadata (see the [module docs](self)).
    pub fn from_gguf(file: &GgufFile) -> Result<Tokenizer> {
        Self::from_gguf_metadata(file.metadata())
    }

    /// The tokenizer described by GGUF metadata `meta` (the `tokenizer.ggml.*` keys):
    /// byte-level BPE for `tokenizer.ggml.model` = `gpt2`, SentencePiece for `llama`.
    pub fn from_gguf_metadata(meta: &BTreeMap<String, GgufValue>) -> Result<Tokenizer> {
        const MODEL: &str = "tokenizer.ggml.model";
        let parts = match meta_str(meta, MODEL)? {
            Some("gpt2") => byte_level_from_gguf(meta)?,
            Some("llama") => super::spm::from_gguf_metadata(meta)?,
            Some(other) => {
                return Err(Error::Unsupported {
                    what: format!(
                        "GGUF {MODEL} `{other}`; only byte-level BPE (`gpt2`) and SentencePiece (`llama`) \
                         vocabularies are supported"
                    ),
                });
            }
            None => return Err(config(MODEL, "missing")),
        };
        let Parts { inner, pieces, special, prepend_bos, append_eos, bos, eos, pad, strip_leading_space } = parts;
        Ok(Tokenizer {
            inner,
            literal: Default::default(),
            pieces,
            special,
            prepend_bos,
            append_eos,
            bos,
            eos,
            pad,
            strip_leading_space,
        })
    }

    /// The tokenizer of a Hugging Face checkpoint directory: `tokenizer.json`, with the BOS and
    /// EOS tokens named by `tokenizer_config.json` when it exists.
    pub fn from_hf_dir(dir: impl AsRef<Path>) -> Result<Tokenizer> {
        let dir = dir.as_ref();
        let mut tok = Self::from_file(dir.join("tokenizer.json"))?;
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            let bytes = read_bounded(&config_path, MAX_CONFIG_BYTES)?;
            let v: serde_json::Value = serde_json::from_slice(&bytes)
                .map_err(|e| Error::Io { path: config_path.display().to_string(), why: e.to_string() })?;
            let id = |key: &str| -> Result<Option<u32>> {
                match token_text(&v, key)? {
                    None => Ok(None),
                    Some(text) => tok.token_to_id(&text).map(Some).ok_or_else(|| {
                        config(&format!("tokenizer_config.json {key}"), format!("`{text}` is not a token"))
                    }),
                }
            };
            let (bos, eos, pad) = (id("bos_token")?, id("eos_token")?, id("pad_token")?);
            (tok.bos, tok.eos, tok.pad) = (bos, eos, pad);
        }
        Ok(tok)
    }

    /// A Hugging Face `tokenizer.json` file (at most [`MAX_TOKENIZER_JSON_BYTES`]).
    pub fn from_file(path: impl AsRef<Path>) -> Result<Tokenizer> {
        let path = path.as_ref();
        let bytes = read_bounded(path, MAX_TOKENIZER_JSON_BYTES)?;
        Self::from_json_bytes(&bytes).map_err(|e| match e {
            Error::Config { field, why } => Error::Config { field: format!("{} {field}", path.display()), why },
            other => other,
        })
    }

    /// A Hugging Face `tokenizer.json` held in memory. Only byte-level BPE tokenizers (a `BPE`
    /// model with the `ByteLevel` decoder) are accepted, since decoding is byte-exact.
    pub fn from_json_bytes(json: &[u8]) -> Result<Tokenizer> {
        let inner = tokenizers::Tokenizer::from_bytes(json).map_err(|e| hf_err("tokenizer.json", e))?;
        if !matches!(inner.get_model(), ModelWrapper::BPE(_)) {
            return Err(Error::Unsupported { what: "tokenizer.json model other than BPE".into() });
        }
        match inner.get_decoder() {
            Some(DecoderWrapper::ByteLevel(_)) => {}
            other => {
                let name = match other {
                    None => "none".to_string(),
                    Some(d) => format!("{d:?}").split(['(', ' ', '{']).next().unwrap_or("?").to_string(),
                };
                return Err(Error::Unsupported {
                    what: format!("tokenizer.json decoder `{name}` (only byte-level BPE tokenizers are supported)"),
                });
            }
        }
        let vocab = inner.get_vocab(true);
        let n = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        if n == 0 || n > MAX_VOCAB {
            return Err(hf_err("tokenizer.json model.vocab", format!("{n} ids (1..={MAX_VOCAB} accepted)")));
        }
        let added = inner.get_added_tokens_decoder();
        let inverse = inverse_byte_chars();
        let mut pieces: Vec<Box<[u8]>> = vec![Box::default(); n];
        let mut special = vec![false; n];
        for (text, &id) in &vocab {
            let i = id as usize;
            match added.get(&id) {
                Some(t) => {
                    pieces[i] = t.content.as_bytes().into();
                    special[i] = t.special;
                }
                None => pieces[i] = byte_level_bytes(text, &inverse),
            }
        }
        Ok(Tokenizer {
            inner,
            literal: Default::default(),
            pieces,
            special,
            prepend_bos: None,
            append_eos: None,
            bos: None,
            eos: None,
            pad: None,
            strip_leading_space: false,
        })
    }

    /// Token ids of `text`. Control and added tokens written in the text (`<|im_start|>`)
    /// become their ids, as in Hugging Face and llama.cpp, so text from an untrusted user
    /// can contain chat markers. `add_special_tokens`: prepend the BOS token where the
    /// vocabulary asks for one (GGUF `add_bos_token`, or a `tokenizer.json` post-processor)
    /// and append the EOS token where it asks for that (GGUF `add_eos_token`, SentencePiece);
    /// pass `false` for a chat-rendered prompt whose template already wrote it.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        self.encode_with(&self.inner, text, add_special_tokens, "Tokenizer::encode")
    }

    /// As [`Tokenizer::encode`], but special (control) tokens written in `text` are encoded as
    /// plain text: `<|im_start|>` becomes several ordinary tokens, never the marker's id. For
    /// text from an untrusted user that must not open or close chat turns; user-defined
    /// (non-special) added tokens still match. The first call clones the tokenizer once.
    pub fn encode_literal(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let literal = self.literal.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        });
        self.encode_with(literal, text, add_special_tokens, "Tokenizer::encode_literal")
    }

    fn encode_with(
        &self,
        inner: &tokenizers::Tokenizer,
        text: &str,
        add_special_tokens: bool,
        op: &'static str,
    ) -> Result<Vec<u32>> {
        let enc = inner.encode(text, add_special_tokens).map_err(|e| {
            Error::from(llama_kernels::Error::InvalidArgument {
                op,
                name: "text",
                value: format!("{} bytes", text.len()),
                why: e.to_string(),
            })
        })?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if add_special_tokens {
            ids.extend(self.prepend_bos);
        }
        ids.extend_from_slice(enc.get_ids());
        if add_special_tokens {
            ids.extend(self.append_eos);
        }
        Ok(ids)
    }

    /// The text of `ids`: their bytes joined, invalid UTF-8 replaced by U+FFFD. With
    /// `skip_special_tokens`, control tokens are left out. A SentencePiece vocabulary with
    /// `add_space_prefix` drops one leading space of the joined bytes (the dummy prefix, as
    /// Hugging Face's `Strip` decoder does). An id outside the vocabulary is an
    /// [`llama_kernels::Error::InvalidArgument`] (in [`crate::Error::Kernel`]).
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        let mut bytes = Vec::new();
        for &id in ids {
            if let Some(piece) = self.piece(id, skip_special_tokens, "Tokenizer::decode")? {
                bytes.extend_from_slice(piece);
            }
        }
        let text = match bytes.split_first() {
            Some((b' ', rest)) if self.strip_leading_space => rest,
            _ => &bytes[..],
        };
        Ok(String::from_utf8_lossy(text).into_owned())
    }

    /// Whether decoding drops one leading space (see [`Tokenizer::decode`]).
    pub fn strips_leading_space(&self) -> bool {
        self.strip_leading_space
    }

    pub(super) fn piece(&self, id: u32, skip_special: bool, op: &'static str) -> Result<Option<&[u8]>> {
        let i = id as usize;
        let piece = self.pieces.get(i).ok_or_else(|| {
            Error::invalid(op, "id", id, format!("outside the vocabulary of {} tokens", self.pieces.len()))
        })?;
        Ok(if skip_special && self.special[i] { None } else { Some(piece) })
    }

    /// The bytes token `id` stands for, if it is in the vocabulary.
    pub fn token_bytes(&self, id: u32) -> Option<&[u8]> {
        self.pieces.get(id as usize).map(|p| &p[..])
    }

    /// The id of the token whose stored text is `text` (byte-level form for normal tokens,
    /// `<|im_end|>` for control tokens).
    pub fn token_to_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// The stored text of token `id`.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Whether `id` is a special (control) token.
    pub fn is_special(&self, id: u32) -> bool {
        self.special.get(id as usize).copied().unwrap_or(false)
    }

    /// Number of ids (the vocabulary with its added tokens).
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The beginning-of-sequence id, if the vocabulary names one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence id, if the vocabulary names one.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos
    }

    /// The padding id, if the vocabulary names one.
    pub fn pad_token_id(&self) -> Option<u32> {
        self.pad
    }

    /// Whether [`Tokenizer::encode`] with `add_special_tokens` prepends the BOS token itself
    /// (GGUF `add_bos_token`; a `tokenizer.json` does it through its post-processor).
    pub fn prepends_bos(&self) -> bool {
        self.prepend_bos.is_some()
    }

    /// Whether [`Tokenizer::encode`] with `add_special_tokens` appends the EOS token (GGUF
    /// `add_eos_token` of a SentencePiece vocabulary).
    pub fn appends_eos(&self) -> bool {
        self.append_eos.is_some()
    }

    /// The `tokenizers` crate's tokenizer inside (for offsets, batches, truncation).
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}
