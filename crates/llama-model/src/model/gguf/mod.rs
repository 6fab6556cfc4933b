//! GGUF files as Hugging Face models: the `config.json` a file's metadata stands for
//! ([`config`]) and the Hugging Face tensor each layer tensor of the file becomes
//! ([`tensors`]). Two llama.cpp architectures are read:
//!
//! * `llama` (Llama 2, 3, 3.1, 3.2, 3.3 and their fine-tunes): a `LlamaConfig`. llama.cpp's
//!   converter permutes q and k rows for its interleaved RoPE; the loader undoes it, giving the
//!   half-split model of the safetensors original. Llama 3.1 scaling comes back from
//!   `rope_freqs.weight` ([`rope_freqs`]).
//! * `llama4` (Llama 4 Scout and Maverick): a `Llama4TextConfig` with llama.cpp's semantics,
//!   several of which are fixed in llama.cpp rather than stored: every 4th layer (`(i + 1) % 4 ==
//!   0`) is a NoPE layer with global attention and attention temperature tuning (floor 8192,
//!   scale 0.1), the others RoPE layers with chunked attention over 8192 tokens, unless
//!   `llama4.attention.sliding_window` is 0 (then every layer is a RoPE layer with global
//!   attention); the weightless qk L2 norm runs on the RoPE layers unless the model has 128
//!   experts (Maverick); layer `i` is MoE when `(i + 1) % llama4.interleave_moe_layer_step == 0`.
//!   q and k are stored unpermuted (Hugging Face's Llama 4 is interleaved already).
//!
//! Every key is checked as a `config.json` field is: an absent optional key takes
//! transformers' default, a present key of the wrong type, or a float that is not positive and
//! finite, is an [`Error::Config`] naming the key, and other architectures are
//! [`Error::Unsupported`].

pub mod plan;
pub mod rope_freqs;
pub mod tensors;

use serde_json::{Value, json};

use crate::error::{Error, Result};
use crate::formats::gguf::{GgufFile, GgufValue};

/// The llama.cpp architectures read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GgufArch {
    /// `llama`: dense Llama 2/3 models.
    Llama,
    /// `llama4`: Llama 4 (MoE with a shared expert, NoPE layers, chunked attention).
    Llama4,
}

impl GgufArch {
    /// The `general.architecture` string.
    pub fn name(self) -> &'static str {
        match self {
            GgufArch::Llama => "llama",
            GgufArch::Llama4 => "llama4",
        }
    }
    /// The architecture of `file` (`general.architecture`).
    pub fn of(file: &GgufFile) -> Result<GgufArch> {
        match file.metadata().get("general.architecture") {
            Some(GgufValue::Str(s)) if s == "llama" => Ok(GgufArch::Llama),
            Some(GgufValue::Str(s)) if s == "llama4" => Ok(GgufArch::Llama4),
            Some(GgufValue::Str(s)) => {
                Err(Error::Unsupported { what: format!("GGUF architecture `{s}` (supported: llama, llama4)") })
            }
            Some(v) => Err(Error::Config {
                field: "general.architecture".into(),
                why: format!("expected a string, found {}", describe(v)),
            }),
            None => Err(Error::Unsupported { what: "GGUF architecture `` (supported: llama, llama4)".into() }),
        }
    }
}

/// Llama 4's chunked-attention span and attention temperature floor in llama.cpp (fixed there,
/// not stored in the file).
pub const LLAMA4_CHUNK: u64 = 8192;
/// Every this-many-th Llama 4 layer is a NoPE layer in llama.cpp (fixed, not stored).
pub const LLAMA4_NOPE_STEP: usize = 4;
/// llama.cpp runs Llama 4's qk norm unless the model has this many experts (Maverick).
pub const LLAMA4_NO_QK_NORM_EXPERTS: u64 = 128;

/// What a metadata value is, for an error message (never the whole value: a string or array
/// may be as long as the file).
pub(crate) fn describe(v: &GgufValue) -> String {
    match v {
        GgufValue::U64(x) => format!("the integer {x}"),
        GgufValue::I64(x) => format!("the integer {x}"),
        GgufValue::F64(x) => format!("the float {x}"),
        GgufValue::Bool(b) => format!("the boolean {b}"),
        GgufValue::Str(s) => format!("a string of {} bytes", s.len()),
        GgufValue::Array(a) => format!("an array of {} values", a.len()),
    }
}

/// Typed access to one architecture's `<arch>.*` keys.
struct Keys<'a> {
    file: &'a GgufFile,
    arch: GgufArch,
}

impl Keys<'_> {
    fn key(&self, k: &str) -> String {
        format!("{}.{k}", self.arch.name())
    }
    fn wrong(&self, k: &str, want: &str, v: &GgufValue) -> Error {
        Error::Config { field: self.key(k), why: format!("expected {want}, found {}", describe(v)) }
    }
    fn int(&self, k: &str) -> Result<Option<u64>> {
        match self.file.metadata().get(&self.key(k)) {
            None => Ok(None),
            Some(v) => v.as_u64().map(Some).ok_or_else(|| self.wrong(k, "a non-negative integer", v)),
        }
    }
    fn num(&self, k: &str) -> Result<Option<f64>> {
        match self.file.metadata().get(&self.key(k)) {
            None => Ok(None),
            Some(v) => match v.as_f64() {
                Some(x) if x.is_finite() && x > 0.0 => Ok(Some(x)),
                _ => Err(self.wrong(k, "a positive finite number", v)),
            },
        }
    }
    fn need(&self, k: &str) -> Result<u64> {
        self.int(k)?.ok_or_else(|| Error::Config { field: self.key(k), why: "missing".into() })
    }
}

/// The `config.json` equivalent of `file`'s metadata (see the module docs), and its
/// architecture. An absent key takes transformers' default (`head_count_kv`: `head_count`;
/// `layer_norm_rms_epsilon`: 1e-5; `rope.freq_base`: 10000 for `llama`, 500000 for `llama4`).
pub fn config(file: &GgufFile) -> Result<(GgufArch, Value)> {
    let arch = GgufArch::of(file)?;
    let keys = Keys { file, arch };
    let heads = keys.need("attention.head_count")?;
    let hidden = keys.need("embedding_length")?;
    let theta = keys.num("rope.freq_base")?.unwrap_or(match arch {
        GgufArch::Llama => 10_000.0,
        GgufArch::Llama4 => 500_000.0,
    });
    let mut c = json!({
        "hidden_size": hidden,
        "num_hidden_layers": keys.need("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": keys.int("attention.head_count_kv")?.unwrap_or(heads),
        "rms_norm_eps": keys.num("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-5),
        "rope_theta": theta,
    });
    let head_dim = keys.int("attention.key_length")?;
    if let Some(d) = head_dim {
        c["head_dim"] = json!(d);
    }
    match file.metadata().get(&keys.key("rope.scaling.type")) {
        None => {}
        Some(GgufValue::Str(kind)) if kind == "none" => {}
        Some(GgufValue::Str(kind)) => {
            return Err(Error::Unsupported { what: format!("GGUF rope scaling `{kind}`") });
        }
        Some(v) => return Err(keys.wrong("rope.scaling.type", "a string", v)),
    }
    let head_dim = head_dim.unwrap_or(hidden / heads.max(1));
    let rotary = keys.int("rope.dimension_count")?.unwrap_or(head_dim);
    if rotary != head_dim {
        return Err(Error::Unsupported { what: format!("GGUF partial rotary ({rotary} of {head_dim} dims)") });
    }
    if file.tensor(rope_freqs::TENSOR).is_ok() {
        let factors = file.dequantize(rope_freqs::TENSOR)?;
        let original = keys.num("rope.scaling.original_context_length")?.unwrap_or(8192.0);
        let rotary = usize::try_from(rotary)
            .map_err(|_| keys.wrong("rope.dimension_count", "a size", &GgufValue::U64(rotary)))?;
        if let Some(s) = rope_freqs::recover(&factors, theta, rotary, original)? {
            c["rope_scaling"] = json!({
                "rope_type": "llama3",
                "factor": s.factor,
                "low_freq_factor": s.low_freq_factor,
                "high_freq_factor": s.high_freq_factor,
                "original_max_position_embeddings": s.original_max_position_embeddings,
            });
        }
    }
    match arch {
        GgufArch::Llama => {
            c["model_type"] = json!("llama");
            c["intermediate_size"] = json!(keys.need("feed_forward_length")?);
        }
        GgufArch::Llama4 => llama4_keys(&keys, &mut c)?,
    }
    Ok((arch, c))
}

/// The Llama 4 fields of `c` (see the module docs for what llama.cpp fixes).
fn llama4_keys(keys: &Keys<'_>, c: &mut Value) -> Result<()> {
    let layers = keys.need("block_count")?;
    let experts = keys.need("expert_count")?;
    if experts == 0 {
        return Err(Error::Unsupported { what: "GGUF llama4 without experts (expert_count 0)".into() });
    }
    let chunked = match keys.int("attention.sliding_window")? {
        Some(0) => false,
        None => true,
        Some(w) if w == LLAMA4_CHUNK => true,
        Some(w) => {
            return Err(Error::Unsupported {
                what: format!(
                    "GGUF llama4.attention.sliding_window {w} (llama.cpp chunks Llama 4 attention by \
                     {LLAMA4_CHUNK} whatever the key says; only 0 and {LLAMA4_CHUNK} are unambiguous)"
                ),
            });
        }
    };
    let layers_usize = usize::try_from(layers).unwrap_or(usize::MAX).min(crate::formats::config::MAX_LAYERS + 1);
    let rope: Vec<u8> = (0..layers_usize).map(|i| u8::from(!chunked || (i + 1) % LLAMA4_NOPE_STEP != 0)).collect();
    let types: Vec<&str> =
        rope.iter().map(|&r| if chunked && r == 1 { "chunked_attention" } else { "full_attention" }).collect();
    let o = c.as_object_mut().ok_or_else(|| Error::Config { field: "<gguf>".into(), why: "not an object".into() })?;
    o.insert("model_type".into(), json!("llama4_text"));
    o.insert("intermediate_size".into(), json!(keys.need("expert_feed_forward_length")?));
    o.insert("intermediate_size_mlp".into(), json!(keys.need("feed_forward_length")?));
    o.insert("num_local_experts".into(), json!(experts));
    o.insert("num_experts_per_tok".into(), json!(keys.need("expert_used_count")?));
    o.insert("interleave_moe_layer_step".into(), json!(keys.need("interleave_moe_layer_step")?));
    o.insert("no_rope_layers".into(), json!(rope));
    o.insert("layer_types".into(), json!(types));
    o.insert("attention_chunk_size".into(), json!(LLAMA4_CHUNK));
    o.insert("use_qk_norm".into(), json!(experts != LLAMA4_NO_QK_NORM_EXPERTS));
    o.insert("attn_temperature_tuning".into(), json!(chunked));
    o.insert("floor_scale".into(), json!(LLAMA4_CHUNK));
    o.insert("attn_scale".into(), json!(0.1));
    Ok(())
}
