//! LoRA adapters in peft's format: a directory holding `adapter_config.json` and
//! `adapter_model.safetensors`, as `PeftModel.save_pretrained` writes them and
//! `PeftModel.from_pretrained` reads them.
//!
//! The tensors are named `base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight`
//! (`[r, in]`) and `...lora_B.weight` (`[out, r]`) for each adapted projection of each layer
//! (`self_attn.{q,k,v,o}_proj`, `mlp.{gate,up,down}_proj`). The config carries peft's
//! `LoraConfig` fields; those this library does not implement (DoRA, per-module ranks or alphas,
//! `modules_to_save`, biases, `fan_in_fan_out`, a regex `target_modules`) are refused by name
//! when an adapter is read, never ignored. Reading checks every tensor's shape against the model
//! and that each adapted projection has both matrices; [`Adapter::save`] writes into a temporary
//! directory beside the target and renames it into place, so a failed save leaves nothing under
//! the target's name.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::checkpoint::{Shard, write_safetensors};
use super::config::ModelConfig;
use super::files::{MAX_CONFIG_BYTES, read_bounded_text};
use crate::error::{Error, Result};
use llama_kernels::dtype::DType;
use llama_kernels::reference::sampling::random_word;
use llama_kernels::spec::layer::{FfnSpec, LayerSpec};
use llama_kernels::spec::lora::LoraConfig;
use llama_kernels::spec::weights::HostTensor;

/// The config file of an adapter directory.
pub const CONFIG_FILE: &str = "adapter_config.json";
/// The weights file of an adapter directory.
pub const WEIGHTS_FILE: &str = "adapter_model.safetensors";
/// peft's prefix of every adapter tensor of a causal LM.
const PREFIX: &str = "base_model.model.model.layers.";

/// One of the seven projections of a Llama layer that LoRA adapts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Projection {
    /// `self_attn.q_proj`.
    Q,
    /// `self_attn.k_proj`.
    K,
    /// `self_attn.v_proj`.
    V,
    /// `self_attn.o_proj`.
    O,
    /// `mlp.gate_proj`.
    Gate,
    /// `mlp.up_proj`.
    Up,
    /// `mlp.down_proj`.
    Down,
}

impl Projection {
    /// All seven, in a layer's order.
    pub const ALL: [Projection; 7] = [
        Projection::Q,
        Projection::K,
        Projection::V,
        Projection::O,
        Projection::Gate,
        Projection::Up,
        Projection::Down,
    ];

    /// The module name peft's `target_modules` uses (`q_proj`).
    pub fn module(self) -> &'static str {
        match self {
            Projection::Q => "q_proj",
            Projection::K => "k_proj",
            Projection::V => "v_proj",
            Projection::O => "o_proj",
            Projection::Gate => "gate_proj",
            Projection::Up => "up_proj",
            Projection::Down => "down_proj",
        }
    }

    /// The module's path inside a layer (`self_attn.q_proj`).
    pub fn path(self) -> &'static str {
        match self {
            Projection::Q => "self_attn.q_proj",
            Projection::K => "self_attn.k_proj",
            Projection::V => "self_attn.v_proj",
            Projection::O => "self_attn.o_proj",
            Projection::Gate => "mlp.gate_proj",
            Projection::Up => "mlp.up_proj",
            Projection::Down => "mlp.down_proj",
        }
    }

    /// The projection of a peft module name or a short one (`q_proj` or `q`, `gate_proj` or `gate`).
    pub fn parse(name: &str) -> Option<Projection> {
        Projection::ALL.into_iter().find(|p| p.module() == name || p.module().strip_suffix("_proj") == Some(name))
    }

    /// `[out, in]` of this projection in `layer`; MoE feed-forwards have no dense MLP to adapt.
    pub fn shape(self, layer: &LayerSpec) -> Result<[usize; 2]> {
        let (h, q, kv) = (layer.hidden, layer.q_heads * layer.head_dim, layer.kv_heads * layer.head_dim);
        let ffn = || match layer.ffn {
            FfnSpec::Dense { intermediate, .. } => Ok(intermediate),
            FfnSpec::Moe { .. } => Err(Error::Unsupported {
                what: format!("a LoRA adapter on {} of MoE layer {} (dense MLPs only)", self.module(), layer.index),
            }),
        };
        Ok(match self {
            Projection::Q => [q, h],
            Projection::K | Projection::V => [kv, h],
            Projection::O => [h, q],
            Projection::Gate | Projection::Up => [ffn()?, h],
            Projection::Down => [h, ffn()?],
        })
    }

    /// The columns `(first, count)` this projection writes in the output of the fused product
    /// that computes it (q, k and v share the fused qkv output; gate and up the gate|up output;
    /// o and down have their own).
    pub fn columns(self, layer: &LayerSpec) -> (usize, usize) {
        let (q, kv, h) = (layer.q_heads * layer.head_dim, layer.kv_heads * layer.head_dim, layer.hidden);
        let i = match layer.ffn {
            FfnSpec::Dense { intermediate, .. } | FfnSpec::Moe { intermediate, .. } => intermediate,
        };
        match self {
            Projection::Q => (0, q),
            Projection::K => (q, kv),
            Projection::V => (q + kv, kv),
            Projection::Gate => (0, i),
            Projection::Up => (i, i),
            Projection::O | Projection::Down => (0, h),
        }
    }

    /// The names of this projection's `A` and `B` in layer `index`.
    pub fn tensor_names(self, index: usize) -> [String; 2] {
        let base = format!("{PREFIX}{index}.{}", self.path());
        [format!("{base}.lora_A.weight"), format!("{base}.lora_B.weight")]
    }
}

/// An adapter's configuration: the LoRA hyper-parameters, which projections it adapts, and the
/// base model it was trained on (peft's `base_model_name_or_path`; informational).
#[derive(Clone, Debug, PartialEq)]
pub struct AdapterConfig {
    /// r, alpha, dropout, rsLoRA.
    pub lora: LoraConfig,
    /// The adapted projections, sorted, without repeats.
    pub targets: Vec<Projection>,
    /// The base model's name or path, as recorded.
    pub base_model: Option<String>,
}

impl AdapterConfig {
    /// `lora` on `targets` (sorted and deduplicated); fails on an invalid `lora` or no target.
    pub fn new(lora: LoraConfig, targets: &[Projection], base_model: Option<String>) -> Result<AdapterConfig> {
        lora.check("AdapterConfig")?;
        let mut targets = targets.to_vec();
        targets.sort();
        targets.dedup();
        if targets.is_empty() {
            return Err(Error::invalid("AdapterConfig", "targets", "[]", "at least one projection"));
        }
        Ok(AdapterConfig { lora, targets, base_model })
    }

    /// Every adapter slot of `model`: each layer's index, each target, and its `[out, in]`.
    pub fn slots(&self, model: &ModelConfig) -> Result<Vec<(usize, Projection, [usize; 2])>> {
        let mut out = Vec::with_capacity(model.num_layers() * self.targets.len());
        for index in 0..model.num_layers() {
            let layer = model.layer(index)?;
            for &p in &self.targets {
                out.push((index, p, p.shape(&layer)?));
            }
        }
        Ok(out)
    }

    /// peft's `adapter_config.json` for this config.
    pub fn to_json(&self) -> Value {
        json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "base_model_name_or_path": self.base_model,
            "r": self.lora.r,
            "lora_alpha": self.lora.alpha,
            "lora_dropout": self.lora.dropout,
            "use_rslora": self.lora.rslora,
            "target_modules": self.targets.iter().map(|p| p.module()).collect::<Vec<_>>(),
            "bias": "none",
            "fan_in_fan_out": false,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_dora": false,
            "modules_to_save": null,
            "layers_to_transform": null,
            "layers_pattern": null,
            "rank_pattern": {},
            "alpha_pattern": {},
            "revision": null,
        })
    }

    /// Parses peft's `adapter_config.json` (`path` names it in errors).
    pub fn from_json(text: &str, path: &Path) -> Result<AdapterConfig> {
        let field = |f: &str, why: String| Error::Config { field: format!("{}: {f}", path.display()), why };
        let v: Value =
            serde_json::from_str(text).map_err(|e| field("<adapter_config.json>", format!("not JSON: {e}")))?;
        let get = |k: &str| v.get(k).filter(|x| !x.is_null());
        match get("peft_type").and_then(Value::as_str) {
            Some("LORA") => {}
            other => return Err(field("peft_type", format!("{other:?}; only LORA adapters are read"))),
        }
        // Features this library does not run: refused by name, never ignored.
        let refuse = |k: &str, why: &str| Err(Error::Unsupported { what: format!("adapter_config.json `{k}`: {why}") });
        if get("use_dora").and_then(Value::as_bool) == Some(true) {
            return refuse("use_dora", "DoRA adapters");
        }
        if get("fan_in_fan_out").and_then(Value::as_bool) == Some(true) {
            return refuse("fan_in_fan_out", "transposed (Conv1D) base layers");
        }
        for k in ["rank_pattern", "alpha_pattern"] {
            if get(k).and_then(Value::as_object).is_some_and(|m| !m.is_empty()) {
                return refuse(k, "per-module ranks or alphas");
            }
        }
        for k in ["use_qalora", "lora_bias"] {
            if get(k).and_then(Value::as_bool) == Some(true) {
                return refuse(k, "QA-LoRA and LoRA biases");
            }
        }
        for k in [
            "modules_to_save",
            "layers_to_transform",
            "layers_pattern",
            "exclude_modules",
            "target_parameters",
            "trainable_token_indices",
            "layer_replication",
        ] {
            if get(k).is_some_and(|x| x.as_array().is_none_or(|a| !a.is_empty())) {
                return refuse(k, "only adapters on every layer's projections, with nothing else saved");
            }
        }
        if let Some(b) = get("bias").and_then(Value::as_str).filter(|b| *b != "none") {
            return Err(Error::Unsupported { what: format!("adapter_config.json `bias`: {b:?} (only \"none\")") });
        }
        let r = get("r").and_then(Value::as_u64).ok_or_else(|| field("r", "missing or not a whole number".into()))?;
        let r = usize::try_from(r).map_err(|_| field("r", format!("{r} is too large")))?;
        let alpha = get("lora_alpha").and_then(Value::as_f64).ok_or_else(|| field("lora_alpha", "missing".into()))?;
        let dropout = get("lora_dropout")
            .map_or(Some(0.0), Value::as_f64)
            .ok_or_else(|| field("lora_dropout", "not a number".into()))?;
        let rslora = get("use_rslora")
            .map_or(Some(false), Value::as_bool)
            .ok_or_else(|| field("use_rslora", "not a boolean".into()))?;
        let targets = match get("target_modules") {
            Some(Value::String(s)) if s == "all-linear" => Projection::ALL.to_vec(),
            Some(Value::String(s)) => {
                return Err(Error::Unsupported {
                    what: format!("adapter_config.json `target_modules` as a pattern ({s:?})"),
                });
            }
            Some(Value::Array(a)) => a
                .iter()
                .map(|m| {
                    let name = m.as_str().unwrap_or_default();
                    Projection::parse(name).ok_or_else(|| Error::Unsupported {
                        what: format!(
                            "a LoRA target module {m} (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)"
                        ),
                    })
                })
                .collect::<Result<Vec<_>>>()?,
            _ => return Err(field("target_modules", "missing".into())),
        };
        let base_model =
            get("base_model_name_or_path").and_then(Value::as_str).filter(|s| !s.is_empty()).map(str::to_string);
        AdapterConfig::new(LoraConfig { r, alpha, dropout, rslora }, &targets, base_model)
    }
}

/// One projection's adapter matrices, as f32 host values.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraPair {
    /// `[r, in]`.
    pub a: HostTensor,
    /// `[out, r]`.
    pub b: HostTensor,
}

/// A LoRA adapter for a model: its config and, for every layer and target projection, its
/// matrices.
#[derive(Clone, Debug, PartialEq)]
pub struct Adapter {
    /// The hyper-parameters and targets.
    pub config: AdapterConfig,
    /// `(layer, projection)` → `A`, `B`; every layer has every target.
    pub weights: BTreeMap<(usize, Projection), LoraPair>,
}

impl Adapter {
    /// A fresh adapter for `model`, initialized as peft does: `A` uniform in
    /// `±1/sqrt(in)` ([`LoraConfig::a_init_bound`]; peft's `kaiming_uniform_(a = sqrt(5))`), `B`
    /// zero. The uniforms are Philox-4x32-10 words keyed by `seed` (the sampler's generator), so
    /// a seed gives the same adapter everywhere; torch's generator, and so peft's exact values,
    /// are not reproduced.
    pub fn init(config: AdapterConfig, model: &ModelConfig, seed: u64) -> Result<Adapter> {
        let mut draw = 0u64;
        let mut uniform = |bound: f64| {
            draw += 1;
            let u = (random_word(seed, draw) >> 11) as f64 / (1u64 << 53) as f64;
            ((2.0 * u - 1.0) * bound) as f32
        };
        let mut weights = BTreeMap::new();
        let r = config.lora.r;
        for (index, p, [d_out, d_in]) in config.slots(model)? {
            let bound = LoraConfig::a_init_bound(d_in);
            let a = (0..r * d_in).map(|_| uniform(bound)).collect();
            let pair =
                LoraPair { a: HostTensor::new(&[r, d_in], a)?, b: HostTensor::new(&[d_out, r], vec![0.0; d_out * r])? };
            weights.insert((index, p), pair);
        }
        Ok(Adapter { config, weights })
    }

    /// Reads the adapter in `dir` for `model`, its values rounded to `dtype`. Only
    /// `dir/adapter_config.json` and `dir/adapter_model.safetensors` are opened; every tensor's
    /// shape is checked against the model, and a tensor the config does not explain is an error.
    pub fn load(dir: impl AsRef<Path>, model: &ModelConfig, dtype: DType) -> Result<Adapter> {
        let dir = dir.as_ref();
        let config_path = dir.join(CONFIG_FILE);
        let config = AdapterConfig::from_json(&read_bounded_text(&config_path, MAX_CONFIG_BYTES)?, &config_path)?;
        let file = Shard::open(&dir.join(WEIGHTS_FILE))?;
        let mut expected = std::collections::BTreeSet::new();
        let mut weights = BTreeMap::new();
        let r = config.lora.r;
        for (index, p, [d_out, d_in]) in config.slots(model)? {
            let [an, bn] = p.tensor_names(index);
            let pair = LoraPair { a: file.tensor(&an, &[r, d_in], dtype)?, b: file.tensor(&bn, &[d_out, r], dtype)? };
            expected.insert(an);
            expected.insert(bn);
            weights.insert((index, p), pair);
        }
        if let Some(extra) = file.names().into_iter().filter(|n| !expected.contains(n)).min() {
            return Err(Error::Checkpoint {
                tensor: extra,
                why: format!(
                    "in {WEIGHTS_FILE} but not an adapter of this config and model ({} layers)",
                    model.num_layers()
                ),
            });
        }
        Ok(Adapter { config, weights })
    }

    /// The matrices of projection `p` of `layer`, checked against its shape: a missing or
    /// misshapen pair is an error naming its tensor.
    pub fn pair(&self, layer: &LayerSpec, p: Projection) -> Result<&LoraPair> {
        let name = || p.tensor_names(layer.index)[0].clone();
        let pair = self
            .weights
            .get(&(layer.index, p))
            .ok_or_else(|| Error::Checkpoint { tensor: name(), why: "missing from the adapter".into() })?;
        let ([d_out, d_in], r) = (p.shape(layer)?, self.config.lora.r);
        if pair.a.shape != [r, d_in] || pair.b.shape != [d_out, r] {
            return Err(Error::Checkpoint {
                tensor: name(),
                why: format!(
                    "A {:?} and B {:?} do not fit the projection [{d_out}, {d_in}] at rank {r}",
                    pair.a.shape, pair.b.shape
                ),
            });
        }
        Ok(pair)
    }

    /// Writes the adapter into `dir` in peft's format (f32 tensors). The files go to a temporary
    /// directory beside `dir` first and are renamed into place once both are complete: on
    /// failure `dir` is untouched (a new `dir` is not created; in an existing one no file is
    /// replaced).
    pub fn save(&self, dir: impl AsRef<Path>) -> Result<()> {
        let dir = dir.as_ref();
        let io = |p: &Path, e: std::io::Error| Error::Io { path: p.display().to_string(), why: e.to_string() };
        let name = dir
            .file_name()
            .ok_or_else(|| Error::Io { path: dir.display().to_string(), why: "no directory name".into() })?;
        let parent = dir
            .parent()
            .map(Path::to_path_buf)
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or_else(|| PathBuf::from("."));
        let tmp = parent.join(format!(".{}.tmp-{}", name.to_string_lossy(), std::process::id()));
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| io(&tmp, e))?;
        }
        std::fs::create_dir(&tmp).map_err(|e| io(&tmp, e))?;
        let written = self.write_files(&tmp).and_then(|()| {
            if dir.exists() {
                for f in [WEIGHTS_FILE, CONFIG_FILE] {
                    std::fs::rename(tmp.join(f), dir.join(f)).map_err(|e| io(&dir.join(f), e))?;
                }
                std::fs::remove_dir(&tmp).map_err(|e| io(&tmp, e))
            } else {
                std::fs::rename(&tmp, dir).map_err(|e| io(dir, e))
            }
        });
        if written.is_err() && tmp.exists() {
            // Best effort: the error being returned is the one that matters.
            let _ = std::fs::remove_dir_all(&tmp);
        }
        written
    }

    fn write_files(&self, dir: &Path) -> Result<()> {
        let mut tensors = Vec::with_capacity(2 * self.weights.len());
        for (&(index, p), pair) in &self.weights {
            let [an, bn] = p.tensor_names(index);
            tensors.push((an, &pair.a));
            tensors.push((bn, &pair.b));
        }
        write_safetensors(&dir.join(WEIGHTS_FILE), &tensors, DType::F32)?;
        let text = serde_json::to_string_pretty(&self.config.to_json())
            .map_err(|e| Error::Io { path: dir.join(CONFIG_FILE).display().to_string(), why: e.to_string() })?;
        std::fs::write(dir.join(CONFIG_FILE), text)
            .map_err(|e| Error::Io { path: dir.join(CONFIG_FILE).display().to_string(), why: e.to_string() })
    }
}
