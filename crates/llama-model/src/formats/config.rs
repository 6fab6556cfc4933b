//! Hugging Face `config.json` → one [`LayerSpec`] per decoder layer.
//!
//! Two model types are read:
//!
//! * `LlamaConfig` (`model_type: "llama"`: Llama 2, 3, 3.1, 3.2, 3.3): `hidden_size`,
//!   `num_attention_heads`, `num_key_value_heads` (default: the head count), `head_dim` (default
//!   `hidden_size / num_attention_heads`), `intermediate_size`, `num_hidden_layers`, `rms_norm_eps`
//!   (default 1e-6), rope theta and scaling, `attention_bias` and `mlp_bias` (default false).
//! * `Llama4TextConfig` (`model_type: "llama4_text"`, or nested under `text_config` of a
//!   multimodal `"llama4"` config): the same, plus `intermediate_size_mlp` (dense layers),
//!   `no_rope_layers` (1 = RoPE, 0 = NoPE; default: every `no_rope_layer_interval`-th layer,
//!   4, is NoPE), `layer_types` (`"chunked_attention"` / `"full_attention"`; default: the RoPE
//!   layers are chunked), `attention_chunk_size`, `use_qk_norm`, `attn_temperature_tuning`,
//!   `floor_scale`, `attn_scale`, `num_local_experts`, `num_experts_per_tok`,
//!   `interleave_moe_layer_step` and `moe_layers` (default: every step-th layer from step - 1).
//!
//! Rope parameters come either as the older `rope_theta` + `rope_scaling` keys or as the newer
//! `rope_parameters` object (`rope_type`, `rope_theta`, `factor`, ...). Supported rope types:
//! `default` and `llama3` (Llama 3.1 and Llama 4 Scout scaling); anything else is a named
//! [`Error::Config`].
//!
//! Fields Hugging Face gives a default take that default; the fields without one
//! (`hidden_size`, `num_attention_heads`, `intermediate_size`, `num_hidden_layers`) are required.
//! A missing required field, a value of the wrong type, or an unsupported value is an
//! [`Error::Config`] that names the field (with its `text_config.` prefix when nested). Every
//! count is bounded before anything is allocated or multiplied from it: [`MAX_LAYERS`] layers,
//! [`MAX_WIDTH`] for the hidden and intermediate sizes, [`MAX_HEADS`] heads, and the MoE kernels'
//! [`MAX_EXPERTS`](llama_kernels::ops::moe::MAX_EXPERTS) and [`MAX_TOP_K`](llama_kernels::ops::moe::MAX_TOP_K).
//!
//! RoPE layout: Hugging Face Llama 3 checkpoints are half-split (`rotate_half`: their q/k weights
//! were permuted from Meta's interleaved originals at conversion); Llama 4 checkpoints are
//! interleaved (`apply_rotary_emb` with `view_as_complex`). The layer picks the layout its model
//! type implies.

use serde_json::{Map, Value};

use crate::error::{Error, Result};
use llama_kernels::spec::attention::{AttentionMask, Llama4Temperature};
pub use llama_kernels::spec::layer::{FfnSpec, LayerSpec, ModelKind};
use llama_kernels::spec::rope::{Llama3Scaling, RopeConfig, RopeLayout};

/// Rope theta and optional Llama 3 scaling.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeFrequencies {
    /// Base of the frequencies (`rope_theta`), finite and > 0.
    pub theta: f64,
    /// Llama 3.1 scaling (rope type `llama3`), or `None` (rope type `default` or absent).
    pub scaling: Option<Llama3Scaling>,
}

/// `LlamaConfig`: the fields a decoder layer needs.
#[derive(Clone, Debug, PartialEq)]
pub struct LlamaConfig {
    /// `hidden_size`: elements per token of the hidden states.
    pub hidden_size: usize,
    /// `num_attention_heads`: query heads.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`): KV heads, a divisor of the query heads.
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`): one of
    /// [`SUPPORTED_HEAD_DIMS`](llama_kernels::ops::attention::SUPPORTED_HEAD_DIMS).
    pub head_dim: usize,
    /// `intermediate_size`: outputs of the MLP's gate and up projections.
    pub intermediate_size: usize,
    /// `num_hidden_layers`: decoder layers.
    pub num_hidden_layers: usize,
    /// `rms_norm_eps` (default 1e-6): finite and > 0.
    pub rms_norm_eps: f64,
    /// `rope_parameters`, or `rope_theta` (default 10 000) and `rope_scaling`.
    pub rope: RopeFrequencies,
    /// `attention_bias` (default false): the q, k, v and o projections have biases.
    pub attention_bias: bool,
    /// `mlp_bias` (default false): the gate, up and down projections have biases.
    pub mlp_bias: bool,
}

/// `Llama4TextConfig`: the fields a decoder layer needs.
#[derive(Clone, Debug, PartialEq)]
pub struct Llama4TextConfig {
    /// `hidden_size`: elements per token of the hidden states.
    pub hidden_size: usize,
    /// `num_attention_heads`: query heads.
    pub num_attention_heads: usize,
    /// `num_key_value_heads` (default: `num_attention_heads`): KV heads, a divisor of the query heads.
    pub num_key_value_heads: usize,
    /// `head_dim` (default `hidden_size / num_attention_heads`): one of
    /// [`SUPPORTED_HEAD_DIMS`](llama_kernels::ops::attention::SUPPORTED_HEAD_DIMS).
    pub head_dim: usize,
    /// Expert (and shared expert) intermediate size.
    pub intermediate_size: usize,
    /// Intermediate size of the dense (non-MoE) layers.
    pub intermediate_size_mlp: usize,
    /// `num_hidden_layers`: decoder layers.
    pub num_hidden_layers: usize,
    /// `rms_norm_eps` (default 1e-5): finite and > 0; also the qk-norm's eps.
    pub rms_norm_eps: f64,
    /// `rope_parameters`, or `rope_theta` (default 500 000) and `rope_scaling`.
    pub rope: RopeFrequencies,
    /// Per layer: true when the layer uses RoPE (Hugging Face's `no_rope_layers[i] == 1`).
    pub rope_layers: Vec<bool>,
    /// Per layer: true when the layer uses chunked attention (`layer_types`).
    pub chunked_layers: Vec<bool>,
    /// `attention_chunk_size` (> 0 when given): the chunk of the chunked layers; without it they are causal.
    pub attention_chunk_size: Option<usize>,
    /// `use_qk_norm` (default true): the weightless L2 norm of q and k on the RoPE layers.
    pub use_qk_norm: bool,
    /// `attn_temperature_tuning` (default true): the query temperature on the NoPE layers.
    pub attn_temperature_tuning: bool,
    /// `floor_scale` (default 8192): the temperature's position divisor, finite and > 0.
    pub floor_scale: f64,
    /// `attn_scale` (default 0.1): the temperature's log weight, finite and >= 0.
    pub attn_scale: f64,
    /// `num_local_experts` (default 16): routed experts of each MoE layer.
    pub num_local_experts: usize,
    /// `num_experts_per_tok` (default 1): experts per token, at most `num_local_experts`.
    pub num_experts_per_tok: usize,
    /// `interleave_moe_layer_step` (default 1): without `moe_layers`, every step-th layer is MoE.
    pub interleave_moe_layer_step: usize,
    /// The MoE layers, ascending.
    pub moe_layers: Vec<usize>,
    /// `attention_bias` (default false): the q, k, v and o projections have biases.
    pub attention_bias: bool,
}

/// A model config: which family, and its fields.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelConfig {
    /// `model_type: "llama"` (Llama 2 and 3).
    Llama(LlamaConfig),
    /// `model_type: "llama4_text"`, or the `text_config` of a `"llama4"` config.
    Llama4(Llama4TextConfig),
}

/// Typed access to the fields of one JSON object, with errors that name the field.
struct Fields<'a> {
    map: &'a Map<String, Value>,
    prefix: String,
}

/// Most decoder layers a config may declare (Llama 3.1 405B has 126).
pub const MAX_LAYERS: usize = 1024;
pub use llama_kernels::spec::layer::{MAX_HEADS, MAX_WIDTH};

fn config_err(field: impl Into<String>, why: impl Into<String>) -> Error {
    Error::Config { field: field.into(), why: why.into() }
}

impl<'a> Fields<'a> {
    fn name(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }
    fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }
    fn usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| usize::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| config_err(self.name(key), format!("expected a non-negative integer, got {v}"))),
        }
    }
    fn req_usize(&self, key: &str) -> Result<usize> {
        self.usize(key)?.ok_or_else(|| config_err(self.name(key), "missing (required)"))
    }
    fn positive(&self, key: &str, default: Option<usize>) -> Result<usize> {
        let v = match default {
            Some(d) => self.usize(key)?.unwrap_or(d),
            None => self.req_usize(key)?,
        };
        if v == 0 {
            return Err(config_err(self.name(key), "must be > 0"));
        }
        Ok(v)
    }
    /// A positive count of at most `max`: every size a file gives is bounded before anything
    /// is allocated or multiplied from it.
    fn bounded(&self, key: &str, default: Option<usize>, max: usize) -> Result<usize> {
        let v = self.positive(key, default)?;
        if v > max {
            return Err(config_err(self.name(key), format!("{v} exceeds the supported maximum of {max}")));
        }
        Ok(v)
    }
    fn f64(&self, key: &str, default: f64) -> Result<f64> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| config_err(self.name(key), format!("expected a number, got {v}"))),
        }
    }
    /// A boolean; numbers are accepted too (0 is false), as some configs write flags as ints.
    fn bool(&self, key: &str, default: bool) -> Result<bool> {
        match self.get(key) {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(v) => v
                .as_f64()
                .map(|n| n != 0.0)
                .ok_or_else(|| config_err(self.name(key), format!("expected a boolean, got {v}"))),
        }
    }
    fn str(&self, key: &str) -> Result<Option<&'a str>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_str().map(Some).ok_or_else(|| config_err(self.name(key), format!("expected a string, got {v}")))
            }
        }
    }
    fn list(&self, key: &str) -> Result<Option<&'a Vec<Value>>> {
        match self.get(key) {
            None => Ok(None),
            Some(v) => {
                v.as_array().map(Some).ok_or_else(|| config_err(self.name(key), format!("expected a list, got {v}")))
            }
        }
    }
    fn object(&self, key: &str) -> Result<Option<Fields<'a>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Object(map)) => Ok(Some(Fields { map, prefix: format!("{}{key}.", self.prefix) })),
            Some(v) => Err(config_err(self.name(key), format!("expected an object, got {v}"))),
        }
    }
}

/// The rope theta and scaling of a config: `rope_parameters` (newer) or `rope_theta` +
/// `rope_scaling` (older). `layer_type` picks an entry when `rope_parameters` is keyed by layer type.
fn rope_params(f: &Fields<'_>, default_theta: f64, layer_type: &str) -> Result<RopeFrequencies> {
    if let Some(params) = f.object("rope_parameters")? {
        // Either one set of parameters, or one per attention type.
        let params = if params.get("rope_type").is_some() || params.get("rope_theta").is_some() {
            params
        } else {
            match params.object(layer_type)? {
                Some(p) => p,
                None => {
                    let first = params.map.keys().next().cloned().unwrap_or_default();
                    params.object(&first)?.ok_or_else(|| config_err(f.name("rope_parameters"), "empty"))?
                }
            }
        };
        let theta = match params.get("rope_theta") {
            Some(_) => params.f64("rope_theta", default_theta)?,
            None => f.f64("rope_theta", default_theta)?,
        };
        return Ok(RopeFrequencies { theta: check_theta(&params, theta)?, scaling: scaling(&params)? });
    }
    let theta = check_theta(f, f.f64("rope_theta", default_theta)?)?;
    let scaling = match f.object("rope_scaling")? {
        Some(s) => scaling(&s)?,
        None => None,
    };
    Ok(RopeFrequencies { theta, scaling })
}

fn check_theta(f: &Fields<'_>, theta: f64) -> Result<f64> {
    if !(theta.is_finite() && theta > 0.0) {
        return Err(config_err(f.name("rope_theta"), format!("{theta} must be finite and > 0")));
    }
    Ok(theta)
}

/// A `rope_scaling` / `rope_parameters` object: `llama3` scaling, or none for `default`.
fn scaling(s: &Fields<'_>) -> Result<Option<Llama3Scaling>> {
    let key = if s.get("rope_type").is_some() { "rope_type" } else { "type" };
    match s.str(key)? {
        None | Some("default") => Ok(None),
        Some("llama3") => {
            let get = |k: &str| -> Result<f64> {
                let v = s.f64(k, f64::NAN)?;
                if v.is_nan() {
                    return Err(config_err(s.name(k), "missing (required by rope_type llama3)"));
                }
                if !(v.is_finite() && v > 0.0) {
                    return Err(config_err(s.name(k), format!("{v} must be finite and > 0")));
                }
                Ok(v)
            };
            let sc = Llama3Scaling {
                factor: get("factor")?,
                low_freq_factor: get("low_freq_factor")?,
                high_freq_factor: get("high_freq_factor")?,
                original_max_position_embeddings: get("original_max_position_embeddings")?,
            };
            if sc.high_freq_factor < sc.low_freq_factor {
                return Err(config_err(s.name("high_freq_factor"), "must be >= low_freq_factor"));
            }
            Ok(Some(sc))
        }
        Some(other) => {
            Err(config_err(s.name(key), format!("rope type `{other}` unsupported (supported: default, llama3)")))
        }
    }
}

/// The attention shape fields shared by both families.
fn heads(f: &Fields<'_>) -> Result<(usize, usize, usize, usize)> {
    let hidden = f.bounded("hidden_size", None, MAX_WIDTH)?;
    let q_heads = f.bounded("num_attention_heads", None, MAX_HEADS)?;
    let kv_heads = f.bounded("num_key_value_heads", Some(q_heads), MAX_HEADS)?;
    if q_heads % kv_heads != 0 {
        return Err(config_err(
            f.name("num_key_value_heads"),
            format!("{kv_heads} does not divide num_attention_heads {q_heads}"),
        ));
    }
    let head_dim = match f.usize("head_dim")? {
        Some(d) => d,
        None => {
            if hidden % q_heads != 0 {
                return Err(config_err(
                    f.name("head_dim"),
                    "missing, and hidden_size is not divisible by the head count",
                ));
            }
            hidden / q_heads
        }
    };
    if head_dim == 0 || head_dim % 2 != 0 {
        return Err(config_err(f.name("head_dim"), format!("{head_dim} must be even and > 0")));
    }
    if !llama_kernels::ops::attention::SUPPORTED_HEAD_DIMS.contains(&head_dim) {
        return Err(config_err(
            f.name("head_dim"),
            format!(
                "{head_dim} unsupported by the attention kernels (supported: {:?})",
                llama_kernels::ops::attention::SUPPORTED_HEAD_DIMS
            ),
        ));
    }
    Ok((hidden, q_heads, kv_heads, head_dim))
}

fn eps(f: &Fields<'_>, default: f64) -> Result<f64> {
    let e = f.f64("rms_norm_eps", default)?;
    if !(e.is_finite() && e > 0.0) {
        return Err(config_err(f.name("rms_norm_eps"), format!("{e} must be finite and > 0")));
    }
    Ok(e)
}

impl LlamaConfig {
    fn parse(f: &Fields<'_>) -> Result<LlamaConfig> {
        let (hidden_size, num_attention_heads, num_key_value_heads, head_dim) = heads(f)?;
        Ok(LlamaConfig {
            hidden_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: f.bounded("intermediate_size", None, MAX_WIDTH)?,
            num_hidden_layers: f.bounded("num_hidden_layers", None, MAX_LAYERS)?,
            rms_norm_eps: eps(f, 1e-6)?,
            rope: rope_params(f, 10_000.0, "full_attention")?,
            attention_bias: f.bool("attention_bias", false)?,
            mlp_bias: f.bool("mlp_bias", false)?,
        })
    }
}

impl Llama4TextConfig {
    fn parse(f: &Fields<'_>) -> Result<Llama4TextConfig> {
        let (hidden_size, num_attention_heads, num_key_value_heads, head_dim) = heads(f)?;
        let layers = f.bounded("num_hidden_layers", None, MAX_LAYERS)?;
        let per_layer_flags = |key: &str| -> Result<Option<Vec<bool>>> {
            let Some(list) = f.list(key)? else { return Ok(None) };
            if list.is_empty() {
                return Ok(None); // Hugging Face treats an empty list as absent
            }
            if list.len() != layers {
                return Err(config_err(f.name(key), format!("has {} entries for {layers} layers", list.len())));
            }
            list.iter()
                .map(|v| match v {
                    Value::Bool(b) => Ok(*b),
                    v => v
                        .as_f64()
                        .map(|n| n != 0.0)
                        .ok_or_else(|| config_err(f.name(key), format!("entry {v} is not 0 or 1"))),
                })
                .collect::<Result<Vec<bool>>>()
                .map(Some)
        };
        let interval = f.positive("no_rope_layer_interval", Some(4))?;
        let rope_layers = match per_layer_flags("no_rope_layers")? {
            Some(v) => v,
            None => (0..layers).map(|i| (i + 1) % interval != 0).collect(),
        };
        let chunked_layers = match f.list("layer_types")? {
            Some(list) if !list.is_empty() => {
                if list.len() != layers {
                    return Err(config_err(
                        f.name("layer_types"),
                        format!("has {} entries for {layers} layers", list.len()),
                    ));
                }
                list.iter()
                    .map(|v| match v.as_str() {
                        Some("chunked_attention") => Ok(true),
                        Some("full_attention") => Ok(false),
                        _ => Err(config_err(
                            f.name("layer_types"),
                            format!("entry {v} unsupported (supported: chunked_attention, full_attention)"),
                        )),
                    })
                    .collect::<Result<Vec<bool>>>()?
            }
            _ => rope_layers.clone(),
        };
        let step = f.positive("interleave_moe_layer_step", Some(1))?;
        let moe_layers = match f.list("moe_layers")? {
            Some(list) => {
                let mut v = list
                    .iter()
                    .map(|x| {
                        x.as_u64().map(|n| n as usize).filter(|&n| n < layers).ok_or_else(|| {
                            config_err(f.name("moe_layers"), format!("entry {x} is not a layer index below {layers}"))
                        })
                    })
                    .collect::<Result<Vec<usize>>>()?;
                v.sort_unstable();
                v
            }
            None => (step - 1..layers).step_by(step).collect(),
        };
        let experts = f.bounded("num_local_experts", Some(16), llama_kernels::ops::moe::MAX_EXPERTS)?;
        let top_k = f.bounded("num_experts_per_tok", Some(1), llama_kernels::ops::moe::MAX_TOP_K)?;
        if top_k > experts {
            return Err(config_err(
                f.name("num_experts_per_tok"),
                format!("{top_k} exceeds num_local_experts {experts}"),
            ));
        }
        let chunk = f.usize("attention_chunk_size")?;
        if chunk == Some(0) {
            return Err(config_err(f.name("attention_chunk_size"), "must be > 0"));
        }
        let floor_scale = f.f64("floor_scale", 8192.0)?;
        if !(floor_scale.is_finite() && floor_scale > 0.0) {
            return Err(config_err(f.name("floor_scale"), format!("{floor_scale} must be finite and > 0")));
        }
        let attn_scale = f.f64("attn_scale", 0.1)?;
        if !(attn_scale.is_finite() && attn_scale >= 0.0) {
            return Err(config_err(f.name("attn_scale"), format!("{attn_scale} must be finite and >= 0")));
        }
        Ok(Llama4TextConfig {
            hidden_size,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            intermediate_size: f.bounded("intermediate_size", None, MAX_WIDTH)?,
            intermediate_size_mlp: f.bounded("intermediate_size_mlp", Some(16384), MAX_WIDTH)?,
            num_hidden_layers: layers,
            rms_norm_eps: eps(f, 1e-5)?,
            rope: rope_params(f, 500_000.0, "chunked_attention")?,
            rope_layers,
            chunked_layers,
            attention_chunk_size: chunk,
            use_qk_norm: f.bool("use_qk_norm", true)?,
            attn_temperature_tuning: f.bool("attn_temperature_tuning", true)?,
            floor_scale,
            attn_scale,
            num_local_experts: experts,
            num_experts_per_tok: top_k,
            interleave_moe_layer_step: step,
            moe_layers,
            attention_bias: f.bool("attention_bias", false)?,
        })
    }
}

impl ModelConfig {
    /// Parses a `config.json` text.
    pub fn from_json(text: &str) -> Result<ModelConfig> {
        let value: Value =
            serde_json::from_str(text).map_err(|e| config_err("<config.json>", format!("not valid JSON: {e}")))?;
        Self::from_value(&value)
    }

    /// Reads `path` (a `config.json` of at most [`MAX_CONFIG_BYTES`](super::files::MAX_CONFIG_BYTES)).
    pub fn from_file(path: &std::path::Path) -> Result<ModelConfig> {
        Self::from_json(&super::files::read_bounded_text(path, super::files::MAX_CONFIG_BYTES)?)
    }

    /// From a parsed JSON object: flat (`model_type` `llama` or `llama4_text`), or a multimodal
    /// Llama 4 config whose `text_config` holds the text model.
    pub fn from_value(value: &Value) -> Result<ModelConfig> {
        let map = value.as_object().ok_or_else(|| config_err("<config.json>", "expected a JSON object"))?;
        let top = Fields { map, prefix: String::new() };
        if let Some(text) = top.object("text_config")? {
            let kind = text.str("model_type")?.or(top.str("model_type")?);
            return match kind {
                Some("llama4_text") | Some("llama4") | None => Ok(ModelConfig::Llama4(Llama4TextConfig::parse(&text)?)),
                Some("llama") => Ok(ModelConfig::Llama(LlamaConfig::parse(&text)?)),
                Some(other) => Err(config_err(
                    text.name("model_type"),
                    format!("`{other}` unsupported (supported: llama, llama4_text)"),
                )),
            };
        }
        match top.str("model_type")? {
            Some("llama") => Ok(ModelConfig::Llama(LlamaConfig::parse(&top)?)),
            Some("llama4_text") => Ok(ModelConfig::Llama4(Llama4TextConfig::parse(&top)?)),
            Some("llama4") => Err(config_err("text_config", "missing (a llama4 config keeps its text model there)")),
            Some(other) => {
                Err(config_err("model_type", format!("`{other}` unsupported (supported: llama, llama4_text, llama4)")))
            }
            None => Err(config_err("model_type", "missing (required: llama, llama4_text or llama4)")),
        }
    }

    /// The model family.
    pub fn kind(&self) -> ModelKind {
        match self {
            ModelConfig::Llama(_) => ModelKind::Llama,
            ModelConfig::Llama4(_) => ModelKind::Llama4,
        }
    }

    /// Decoder layers (`num_hidden_layers`).
    pub fn num_layers(&self) -> usize {
        match self {
            ModelConfig::Llama(c) => c.num_hidden_layers,
            ModelConfig::Llama4(c) => c.num_hidden_layers,
        }
    }

    /// The spec of layer `index`.
    pub fn layer(&self, index: usize) -> Result<LayerSpec> {
        if index >= self.num_layers() {
            return Err(config_err(
                "num_hidden_layers",
                format!("layer {index} requested, the model has {}", self.num_layers()),
            ));
        }
        Ok(match self {
            ModelConfig::Llama(c) => LayerSpec {
                model: ModelKind::Llama,
                index,
                hidden: c.hidden_size,
                q_heads: c.num_attention_heads,
                kv_heads: c.num_key_value_heads,
                head_dim: c.head_dim,
                rms_norm_eps: c.rms_norm_eps as f32,
                rope: Some(RopeConfig {
                    head_dim: c.head_dim,
                    rotary_dim: c.head_dim,
                    theta: c.rope.theta,
                    layout: RopeLayout::HalfSplit,
                    scaling: c.rope.scaling,
                    qk_norm_eps: None,
                }),
                mask: AttentionMask::Causal,
                temperature: None,
                attention_bias: c.attention_bias,
                ffn: FfnSpec::Dense { intermediate: c.intermediate_size, bias: c.mlp_bias },
            },
            ModelConfig::Llama4(c) => {
                let rope = c.rope_layers[index];
                LayerSpec {
                    model: ModelKind::Llama4,
                    index,
                    hidden: c.hidden_size,
                    q_heads: c.num_attention_heads,
                    kv_heads: c.num_key_value_heads,
                    head_dim: c.head_dim,
                    rms_norm_eps: c.rms_norm_eps as f32,
                    rope: rope.then_some(RopeConfig {
                        head_dim: c.head_dim,
                        rotary_dim: c.head_dim,
                        theta: c.rope.theta,
                        layout: RopeLayout::Interleaved,
                        scaling: c.rope.scaling,
                        // Hugging Face: the L2 qk-norm exists only on RoPE layers.
                        qk_norm_eps: (c.use_qk_norm).then_some(c.rms_norm_eps as f32),
                    }),
                    mask: match (c.chunked_layers[index], c.attention_chunk_size) {
                        (true, Some(chunk_size)) => AttentionMask::ChunkedCausal { chunk_size },
                        _ => AttentionMask::Causal,
                    },
                    // Hugging Face: temperature tuning only on NoPE layers.
                    temperature: (c.attn_temperature_tuning && !rope).then_some(Llama4Temperature {
                        floor_scale: c.floor_scale as f32,
                        attn_scale: c.attn_scale as f32,
                    }),
                    attention_bias: c.attention_bias,
                    ffn: if c.moe_layers.contains(&index) {
                        FfnSpec::Moe {
                            experts: c.num_local_experts,
                            top_k: c.num_experts_per_tok,
                            intermediate: c.intermediate_size,
                        }
                    } else {
                        FfnSpec::Dense { intermediate: c.intermediate_size_mlp, bias: false }
                    },
                }
            }
        })
    }
}
