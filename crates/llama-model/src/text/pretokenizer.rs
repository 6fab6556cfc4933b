//! The pre-tokenizers GGUF files name (`tokenizer.ggml.pre`): which split regexes run before
//! byte-level BPE, as llama.cpp's `llama-vocab.cpp` defines them, in their original
//! `tokenizer.json` form.

/// A GGUF pre-tokenizer: the `tokenizer.ggml.pre` names that select it and what they mean.
#[derive(Debug)]
pub struct GgufPreTokenizer {
    /// The names llama.cpp maps to this pre-tokenizer.
    pub names: &'static [&'static str],
    /// Split regexes, applied in order, each splitting every piece of the one before into its
    /// matches and the text between them ("isolated").
    pub regexes: &'static [&'static str],
    /// Whether a piece that is itself a token is emitted without applying merges.
    pub ignore_merges: bool,
    /// Whether a BOS token is prepended when `tokenizer.ggml.add_bos_token` is absent.
    pub add_bos: bool,
}

/// GPT-2's split regex (Hugging Face `ByteLevel`'s built-in pattern).
const GPT2_RE: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";
/// Llama 3's (tiktoken cl100k-style, digits in groups of up to three).
const LLAMA3_RE: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen 2's (as Llama 3's, single digits).
const QWEN2_RE: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// GPT-4o's (o200k), which Llama 4 uses.
const GPT4O_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Mistral's Tekken.
const TEKKEN_RE: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `tokenizer.ggml.pre` names this crate knows, with llama.cpp's meaning of each.
pub const GGUF_PRE_TOKENIZERS: &[GgufPreTokenizer] = &[
    GgufPreTokenizer {
        names: &["gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "trillion", "granite-docling"],
        regexes: &[GPT2_RE],
        ignore_merges: false,
        add_bos: false,
    },
    // Hugging Face: `Digits(individual_digits)` then `ByteLevel`.
    GgufPreTokenizer {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        regexes: &[r"\p{N}", GPT2_RE],
        ignore_merges: false,
        add_bos: false,
    },
    GgufPreTokenizer {
        names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"],
        regexes: &[LLAMA3_RE],
        ignore_merges: true,
        add_bos: true,
    },
    GgufPreTokenizer { names: &["dbrx", "smaug-bpe"], regexes: &[LLAMA3_RE], ignore_merges: false, add_bos: false },
    GgufPreTokenizer {
        names: &["qwen2", "deepseek-r1-qwen", "stablelm2", "megrez", "hunyuan"],
        regexes: &[QWEN2_RE],
        ignore_merges: false,
        add_bos: false,
    },
    GgufPreTokenizer {
        names: &["gpt-4o", "llama4", "minimax-m2"],
        regexes: &[GPT4O_RE],
        ignore_merges: false,
        add_bos: false,
    },
    GgufPreTokenizer { names: &["tekken"], regexes: &[TEKKEN_RE], ignore_merges: true, add_bos: true },
    // llama.cpp's `default`, what it also falls back to (with a warning) when the key is missing.
    GgufPreTokenizer {
        names: &["default"],
        regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2_RE, r"\p{N}+", r"[0-9][0-9][0-9]"],
        ignore_merges: false,
        add_bos: false,
    },
];

/// The pre-tokenizer `name` selects, if it is one of [`GGUF_PRE_TOKENIZERS`].
pub fn gguf_pre_tokenizer(name: &str) -> Option<&'static GgufPreTokenizer> {
    GGUF_PRE_TOKENIZERS.iter().find(|p| p.names.contains(&name))
}
