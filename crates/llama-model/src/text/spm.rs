//! SentencePiece BPE vocabularies from GGUF metadata (`tokenizer.ggml.model` = `llama`: Llama 1
//! and 2, Mistral 7B v0.1, TinyLlama, Code Llama, ...), built as Hugging Face transformers'
//! GGUF converter builds them (`GGUFLlamaConverter` in transformers 4.x) and checked against
//! the `sentencepiece` library itself (`tests/fixtures/tokenizer/spm_bpe.json`).
//!
//! # The pipeline
//!
//! - Metadata: `tokenizer.ggml.tokens`, `tokenizer.ggml.scores` (one float per token),
//!   `tokenizer.ggml.token_type` (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused,
//!   6 byte `<0xNN>`), optional `tokenizer.ggml.merges`, the BOS/EOS/unknown/padding ids,
//!   `add_bos_token` (default true), `add_eos_token` (default false) and `add_space_prefix`
//!   (default true), the defaults llama.cpp uses. When an id key is absent, llama.cpp's default
//!   id applies (BOS 1, EOS 2, unknown 0), each only where that token has the matching type
//!   (control, control, unknown) or the file has no types.
//! - Normalizer: prepend `▁` to every non-empty piece of text (with `add_space_prefix`), then
//!   replace each space `" "` by `▁`. No pre-tokenizer: the whole normalized text is one BPE
//!   word.
//! - Model: BPE with `byte_fallback` (a character that is not a token becomes its UTF-8 bytes
//!   as `<0xNN>` tokens) and `fuse_unk` (consecutive unknown characters, only possible when
//!   byte tokens are missing, become one unknown id). A vocabulary without all 256 byte tokens
//!   must name an unknown token, so that no text is dropped.
//! - Merges: `tokenizer.ggml.merges` when present (validated as for `gpt2`); otherwise derived
//!   from the vocabulary as transformers' `generate_merges` does: every split of a token into
//!   two tokens is a merge, ranked by the merged token's score (highest first), ties by the
//!   longer left part, then the longer right part, then token order. That reproduces
//!   SentencePiece's BPE, which repeatedly joins the adjacent pair whose concatenation is the
//!   highest-scoring piece. Only normal tokens take part (see below). Deriving is bounded by
//!   [`MAX_MERGE_DERIVATION_BYTES`] of hashed text and by [`MAX_MERGES`].
//! - Added tokens: control and unknown tokens are special added tokens (`<s>` in a text is
//!   BOS, as in llama.cpp and Hugging Face; [`Tokenizer::encode_literal`] keeps it text), and
//!   user-defined tokens plain added tokens. The text between added tokens is normalized piece by
//!   piece, so a piece after `<s>` gets its own `▁` (Hugging Face's legacy Llama behaviour and
//!   llama.cpp's `is_prev_special` rule alike).
//! - Decoding (each id's bytes, [`Tokenizer::token_bytes`]): a normal token's text with every
//!   `▁` as a space; a byte token `<0xNN>` (type 6, or any token so spelled when the file has
//!   no types) its byte; a user-defined token its text as it is (llama.cpp); control, unknown,
//!   unused and undefined tokens their text, special, so `skip_special_tokens` drops them. A
//!   decode (and a stream) drops one leading space when `add_space_prefix` holds, like the
//!   Hugging Face decoder `Replace("▁", " ")`, `ByteFallback`, `Fuse`, `Strip(" ", 1, 0)`.
//!
//! # Where the references differ
//!
//! The tests check this crate against SentencePiece itself: equal ids and decodes for every text
//! of the fixture. llama.cpp's `llm_tokenizer_spm` is a port of SentencePiece's BPE encoder (it
//! joins the highest-scoring adjacent pair, by text), and Hugging Face's pipeline is the one
//! above. The three differ, and this crate follows the one named, in these cases:
//!
//! - A text spelling a control token (`<s>`): SentencePiece encodes it as text; llama.cpp (with
//!   `parse_special`) and Hugging Face give its id. [`Tokenizer::encode`] gives the id,
//!   [`Tokenizer::encode_literal`] the text, equal to SentencePiece's ids.
//! - Text after an added token gets a `▁` of its own here, as in llama.cpp and Hugging Face's
//!   legacy mode; transformers 5's `LlamaTokenizer` (`Metaspace` with `prepend_scheme="first"`)
//!   does not, and also gives `" hi"` as `▁hi` where SentencePiece and llama.cpp give `▁▁hi`.
//!   This crate follows SentencePiece and llama.cpp.
//! - User-defined tokens: SentencePiece matches them inside the normalized text (after the
//!   dummy `▁`), llama.cpp and this crate in the raw text, with a `▁` prepended after them;
//!   transformers 4's converter leaves them to the merges.
//! - Merge candidates: SentencePiece merges into normal, user-defined and unused pieces (and
//!   resegments unused ones), llama.cpp and transformers into any token, this crate into normal
//!   tokens only, so a control, byte or unused id never comes out of a merge. Equal scores:
//!   SentencePiece and llama.cpp take the leftmost pair, ranks the tie-breaks above. A
//!   multi-character token whose characters are not all tokens is reachable by SentencePiece and
//!   llama.cpp (they merge text), not by Hugging Face's BPE (its characters fall back to bytes).
//!   None of these arise in a vocabulary SentencePiece trained.
//! - Decoding an unknown id: SentencePiece writes ` ⁇ `, llama.cpp and this crate its text
//!   (`<unk>`) unless special tokens are skipped. Control ids: SentencePiece writes nothing;
//!   llama.cpp and this crate their text unless skipped.
//! - The leading space: SentencePiece drops the `▁` of the first piece only when nothing was
//!   written before it, and not from a `<0x20>` byte token; Hugging Face and this crate drop
//!   one leading space of the joined text, whatever token it came from; llama.cpp strips it from
//!   the first token's piece only, so after a leading BOS (removed, or written as nothing) the
//!   space stays.
//! - Invalid UTF-8 from byte tokens: SentencePiece writes one U+FFFD per invalid byte, Hugging
//!   Face's `ByteFallback` one per byte token of a run that is not valid UTF-8 as a whole, this
//!   crate one per maximal invalid sequence (Rust's and Python's `errors="replace"` rule, as for
//!   `gpt2`); [`Tokenizer::token_bytes`] gives the raw bytes, as llama.cpp does.
//! - `tokenizer.ggml.remove_extra_whitespaces` is ignored, as llama.cpp ignores it for
//!   SentencePiece vocabularies; scores of another length than the tokens are refused (llama.cpp
//!   accepts a longer list).
//!
//! [`Tokenizer::encode`]: crate::text::Tokenizer::encode
//! [`Tokenizer::encode_literal`]: crate::text::Tokenizer::encode_literal
//! [`Tokenizer::token_bytes`]: crate::text::Tokenizer::token_bytes

use std::collections::BTreeMap;

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{BPE, Merges, Vocab as BpeVocab};
use tokenizers::normalizers::{Prepend, Replace, Sequence as NormalizerSequence};
use tokenizers::{AddedToken, DecoderWrapper, NormalizerWrapper};

use super::gguf_vocab::{
    MAX_MERGES, MERGES, Parts, TOKENS, Vocab, check_added_ids, config, hf_err, kind, meta_array, meta_bool, meta_id,
    read_merges, read_vocab, token_type,
};
use crate::error::Result;
use crate::formats::gguf::GgufValue;

/// Most bytes of token text hashed while deriving merges from the scores (a token of `L`
/// bytes costs `L` per split; Llama 2's 32k tokens cost under 2 MB).
pub const MAX_MERGE_DERIVATION_BYTES: u64 = 1 << 28;

const SCORES: &str = "tokenizer.ggml.scores";
const UNK: &str = "tokenizer.ggml.unknown_token_id";
/// SentencePiece's escaped space.
const SPACE: char = '\u{2581}';

/// The byte a token spelled `<0xNN>` stands for.
fn byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

/// `tokenizer.ggml.scores`: one number (not NaN) per token; `None` when absent.
fn read_scores(meta: &BTreeMap<String, GgufValue>, n: usize) -> Result<Option<Vec<f64>>> {
    let Some(items) = meta_array(meta, SCORES, super::gguf_vocab::MAX_VOCAB)? else { return Ok(None) };
    if items.len() != n {
        return Err(config(SCORES, format!("{} entries for {n} tokens", items.len())));
    }
    let mut scores = Vec::with_capacity(n);
    for (id, v) in items.iter().enumerate() {
        match v.as_f64() {
            Some(s) if s.is_nan() => return Err(config(SCORES, format!("token {id}'s score is NaN"))),
            Some(s) => scores.push(s),
            None => return Err(config(SCORES, format!("token {id}'s score is {}, expected a number", kind(v)))),
        }
    }
    Ok(Some(scores))
}

/// The merges SentencePiece's BPE implies (see the [module docs](self)): every split of a
/// normal token into two normal tokens, best score first.
fn derive_merges(vocab: &Vocab<'_>, scores: &[f64]) -> Result<Merges> {
    derive_merges_within(vocab, scores, MAX_MERGES, MAX_MERGE_DERIVATION_BYTES)
}

/// [`derive_merges`] with the bounds given.
fn derive_merges_within(vocab: &Vocab<'_>, scores: &[f64], max_merges: usize, max_bytes: u64) -> Result<Merges> {
    let normal = |id: u32| vocab.types.get(id as usize) == Some(&token_type::NORMAL);
    // (score, left chars, right chars, left, right), in token order, splits by their ids.
    let mut candidates: Vec<(f64, usize, usize, &str, &str)> = Vec::new();
    let mut hashed: u64 = 0;
    let mut local: Vec<(u32, u32, usize, usize)> = Vec::new();
    for (id, text) in vocab.texts.iter().enumerate() {
        if !normal(id as u32) {
            continue;
        }
        local.clear();
        let chars = text.chars().count();
        for (split, (at, _)) in text.char_indices().enumerate().skip(1) {
            hashed += text.len() as u64;
            if hashed > max_bytes {
                return Err(config(
                    SCORES,
                    format!(
                        "deriving merges would hash more than {max_bytes} bytes of token text (give \
                         tokenizer.ggml.merges)"
                    ),
                ));
            }
            let (left, right) = text.split_at(at);
            match (vocab.ids.get(left), vocab.ids.get(right)) {
                (Some(&l), Some(&r)) if normal(l) && normal(r) => local.push((l, r, at, split)),
                _ => {}
            }
        }
        // As transformers: the splits of one token by the ids of their parts.
        local.sort_unstable();
        for &(_, _, at, split) in &local {
            let (left, right) = text.split_at(at);
            candidates.push((scores.get(id).copied().unwrap_or(f64::NEG_INFINITY), split, chars - split, left, right));
        }
        if candidates.len() > max_merges {
            return Err(config(SCORES, format!("the vocabulary implies more than {max_merges} merges")));
        }
    }
    // Stable: equal keys keep token order (Python's `sorted(..., reverse=True)` does too).
    candidates.sort_by(|a, b| (b.0, b.1, b.2).partial_cmp(&(a.0, a.1, a.2)).unwrap_or(std::cmp::Ordering::Equal));
    Ok(candidates.into_iter().map(|(_, _, _, l, r)| (l.to_string(), r.to_string())).collect())
}

/// A special id: the key's value, else llama.cpp's default where that token has type `ty`
/// (or the file gives no types).
fn special_id(
    meta: &BTreeMap<String, GgufValue>,
    key: &str,
    vocab: &Vocab<'_>,
    default: u32,
    ty: i64,
) -> Result<Option<u32>> {
    if meta.contains_key(key) {
        return meta_id(meta, key, vocab.len());
    }
    let fits = vocab.types.get(default as usize).is_some_and(|&t| !vocab.typed || t == ty);
    Ok(fits.then_some(default))
}

/// The SentencePiece (`llama`) vocabulary of GGUF metadata (see the [module docs](self)).
pub(super) fn from_gguf_metadata(meta: &BTreeMap<String, GgufValue>) -> Result<Parts> {
    let vocab = read_vocab(meta)?;
    let n = vocab.len();
    let scores = read_scores(meta, n)?;
    let merges = match read_merges(meta, &vocab)? {
        Some(merges) => merges,
        None => {
            let scores = scores.as_deref().ok_or_else(|| {
                config(SCORES, "missing, and without tokenizer.ggml.merges the merges come from the scores")
            })?;
            derive_merges(&vocab, scores)?
        }
    };

    let bos = special_id(meta, "tokenizer.ggml.bos_token_id", &vocab, 1, token_type::CONTROL)?;
    let eos = special_id(meta, "tokenizer.ggml.eos_token_id", &vocab, 2, token_type::CONTROL)?;
    let unk = special_id(meta, UNK, &vocab, 0, token_type::UNKNOWN)?;
    let pad = meta_id(meta, "tokenizer.ggml.padding_token_id", n)?;
    for key in ["tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"] {
        meta_id(meta, key, n)?;
    }
    let prepend_bos = match (meta_bool(meta, "tokenizer.ggml.add_bos_token")?.unwrap_or(true), bos) {
        (true, Some(id)) => Some(id),
        (true, None) => {
            return Err(config("tokenizer.ggml.bos_token_id", "missing, but add_bos_token asks for a BOS token"));
        }
        (false, _) => None,
    };
    let append_eos = match (meta_bool(meta, "tokenizer.ggml.add_eos_token")?.unwrap_or(false), eos) {
        (true, Some(id)) => Some(id),
        (true, None) => {
            return Err(config("tokenizer.ggml.eos_token_id", "missing, but add_eos_token asks for an EOS token"));
        }
        (false, _) => None,
    };
    let add_space_prefix = meta_bool(meta, "tokenizer.ggml.add_space_prefix")?.unwrap_or(true);
    meta_bool(meta, "tokenizer.ggml.remove_extra_whitespaces")?;

    let missing_bytes = (0..=255u8).filter(|b| !vocab.ids.contains_key(format!("<0x{b:02X}>").as_str())).count();
    if missing_bytes > 0 && unk.is_none() {
        return Err(config(
            UNK,
            format!(
                "missing, and {missing_bytes} of the 256 byte tokens <0x00>..<0xFF> are too: text would be dropped"
            ),
        ));
    }

    let mut builder = BPE::builder()
        .vocab_and_merges(
            vocab.texts.iter().enumerate().map(|(id, t)| (t.to_string(), id as u32)).collect::<BpeVocab>(),
            merges,
        )
        .byte_fallback(true)
        .fuse_unk(true);
    if let Some(text) = unk.and_then(|id| vocab.texts.get(id as usize)) {
        builder = builder.unk_token(text.to_string());
    }
    let model = builder.build().map_err(|e| hf_err(MERGES, e))?;

    let space = SPACE.to_string();
    let mut normalizers: Vec<NormalizerWrapper> = Vec::with_capacity(2);
    if add_space_prefix {
        normalizers.push(Prepend::new(space.clone()).into());
    }
    normalizers.push(Replace::new(" ", space.as_str()).map_err(|e| hf_err("tokenizer normalizer", e))?.into());
    let mut decoders: Vec<DecoderWrapper> = vec![
        Replace::new(space.as_str(), " ").map_err(|e| hf_err("tokenizer decoder", e))?.into(),
        ByteFallback::new().into(),
        Fuse::new().into(),
    ];
    if add_space_prefix {
        decoders.push(Strip::new(' ', 1, 0).into());
    }
    let mut inner = tokenizers::Tokenizer::new(model);
    inner.with_normalizer(Some(NormalizerSequence::new(normalizers)));
    inner.with_decoder(Some(DecoderSequence::new(decoders)));

    let is_special = |ty: i64| ty == token_type::CONTROL || ty == token_type::UNKNOWN;
    let is_added = |ty: i64| is_special(ty) || ty == token_type::USER_DEFINED;
    let added: Vec<AddedToken> = vocab
        .texts
        .iter()
        .zip(&vocab.types)
        .filter(|&(_, &ty)| is_added(ty))
        .map(|(t, &ty)| AddedToken::from(t.to_string(), is_special(ty)).normalized(false))
        .collect();
    inner.add_special_tokens(&added);
    check_added_ids(&inner, &vocab, is_added)?;

    let mut pieces: Vec<Box<[u8]>> = Vec::with_capacity(n);
    let mut special = Vec::with_capacity(n);
    for (id, (text, &ty)) in vocab.texts.iter().zip(&vocab.types).enumerate() {
        let (bytes, is_special): (Box<[u8]>, bool) = match ty {
            token_type::BYTE => match byte_token(text) {
                Some(b) => (Box::new([b]), false),
                None => return Err(config(TOKENS, format!("token {id} `{text}` has the byte type but is not <0xNN>"))),
            },
            token_type::NORMAL => match byte_token(text).filter(|_| !vocab.typed) {
                Some(b) => (Box::new([b]), false),
                None => (text.replace(SPACE, " ").into_bytes().into(), false),
            },
            token_type::USER_DEFINED => (text.as_bytes().into(), false),
            // Control, unknown, unused and undefined tokens: their text, skipped as special.
            _ => (text.as_bytes().into(), true),
        };
        pieces.push(bytes);
        special.push(is_special);
    }
    Ok(Parts { inner, pieces, special, prepend_bos, append_eos, bos, eos, pad, strip_leading_space: add_space_prefix })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every string of `a`s and `b`s up to `len` characters, all normal, scored by length.
    fn ab_vocab(len: u32) -> (Vec<String>, Vec<f64>) {
        let texts: Vec<String> = (1..=len)
            .flat_map(|l| {
                (0..1u32 << l).map(move |bits| (0..l).map(|i| if bits >> i & 1 == 1 { 'b' } else { 'a' }).collect())
            })
            .collect();
        let scores = texts.iter().map(|t| -(t.len() as f64)).collect();
        (texts, scores)
    }

    #[test]
    fn derived_merges_are_ranked_and_bounded() {
        let (texts, scores) = ab_vocab(4);
        let vocab = Vocab {
            texts: texts.iter().map(String::as_str).collect(),
            ids: texts.iter().enumerate().map(|(i, t)| (t.as_str(), i as u32)).collect(),
            types: vec![token_type::NORMAL; texts.len()],
            typed: true,
        };
        // Each token of `l` characters has `l - 1` splits: 4*1 + 8*2 + 16*3 = 68 merges.
        let merges = derive_merges(&vocab, &scores).unwrap();
        assert_eq!(merges.len(), 68);
        // Best score first; one token's splits by the longer left part first (ids ascending).
        assert_eq!(merges[0], ("a".to_string(), "a".to_string()));
        let first_long = merges.iter().position(|(l, r)| l.len() + r.len() == 4).unwrap();
        assert_eq!(merges[first_long], ("aaa".to_string(), "a".to_string()));
        let merge_error = |max_merges, max_bytes| match derive_merges_within(&vocab, &scores, max_merges, max_bytes) {
            Err(crate::error::Error::Config { field, why }) => (field, why),
            other => panic!("{other:?}"),
        };
        let (field, why) = merge_error(67, u64::MAX);
        assert_eq!(field, SCORES);
        assert!(why.contains("more than 67 merges"), "{why}");
        let (_, why) = merge_error(usize::MAX, 100);
        assert!(why.contains("more than 100 bytes"), "{why}");
    }
}
