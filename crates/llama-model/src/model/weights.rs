//! A whole model's weights on the host ([`HostModel`]): the token embedding, every decoder
//! layer, the final norm and the LM head, under Hugging Face layouts, from a safetensors
//! checkpoint directory or a GGUF file. Values are f32 rounded once to the run dtype, as
//! [`HostTensor`]s are everywhere in this crate, so the device upload and the f64 reference see
//! the same numbers.
//!
//! GGUF files (llama.cpp's `llama` and `llama4` architectures) are mapped to the same layout
//! by [`super::gguf`]: the metadata becomes the `config.json` it stands for (checked by the same
//! code), `rope_freqs.weight` becomes Llama 3.1 scaling, and each Hugging Face tensor is read
//! from its GGUF counterpart (`llama`'s q/k rows unpermuted, `llama4`'s split and transposed
//! expert tensors reassembled), so a GGUF model is the same model its safetensors original is
//! (`tests/model/gguf_hf.rs` and `tests/model/gguf_arch.rs` check this against Hugging Face
//! transformers).

use std::path::Path;

use serde_json::Value;

use super::gguf::{
    self, GgufArch,
    tensors::{self, Source},
};
use crate::error::{Error, Result};
use crate::formats::Checkpoint;
use crate::formats::config::{LayerSpec, ModelConfig, ModelKind};
use crate::formats::files::{MAX_CONFIG_BYTES, read_bounded_text};
use crate::formats::gguf::GgufFile;
use llama_kernels::dtype::{DType, round_to};
use llama_kernels::spec::quant::PackedWeight;
use llama_kernels::spec::weights::{HostLayerWeights, HostTensor, packable_projections};

/// Largest vocabulary a model may have (token ids are i32; Llama 3 has 128 256, Gemma 262 144).
pub const MAX_VOCAB: usize = 1 << 20;

/// How a model's projections run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum WeightFormat {
    /// As the file stores them: a GGUF file's quantized projections packed, a checkpoint's dense.
    #[default]
    AsStored,
    /// Every projection dense in the run dtype (a GGUF file's dequantized at load).
    Dense,
    /// Every projection packed in NF4 (blocks of 64): a dense checkpoint quantized at load;
    /// projections already packed stay as they are.
    Nf4,
}

/// A whole model's host weights.
#[derive(Clone, Debug)]
pub struct HostModel {
    /// The parsed configuration (the `config.json`, or the GGUF metadata as one).
    pub config: ModelConfig,
    /// Every decoder layer, in order.
    pub layers: Vec<(LayerSpec, HostLayerWeights)>,
    /// `model.embed_tokens.weight`, `[vocab, hidden]`.
    pub embed: HostTensor,
    /// `model.norm.weight`, `[hidden]`.
    pub norm: HostTensor,
    /// `lm_head.weight`, `[vocab, hidden]`; `None` when tied to the embedding.
    pub lm_head: Option<HostTensor>,
    /// Epsilon of the final norm (the config's `rms_norm_eps`).
    pub eps: f32,
    /// The LM head kept packed (a GGUF `output.weight`, or the tied `token_embd.weight`, of a
    /// packed type); [`HostModel::lm_head`] holds its dequantized values. When it is the tied
    /// embedding, the device model looks tokens up in it too (no dense table on the device).
    pub lm_head_packed: Option<PackedWeight>,
}

impl HostModel {
    /// Tokens in the vocabulary.
    pub fn vocab(&self) -> usize {
        self.embed.shape.first().copied().unwrap_or(0)
    }
    /// Elements per token of the hidden states.
    pub fn hidden(&self) -> usize {
        self.embed.shape.get(1).copied().unwrap_or(0)
    }
    /// Applies `format` (see [`WeightFormat`]) to a model loaded in run dtype `dtype`.
    pub fn set_weight_format(&mut self, format: WeightFormat, dtype: DType) -> Result<()> {
        match format {
            WeightFormat::AsStored => Ok(()),
            WeightFormat::Dense => {
                self.dequantize_packed();
                Ok(())
            }
            WeightFormat::Nf4 => self.quantize_nf4(64, dtype),
        }
    }
    /// Whether any projection is kept packed (see [`HostLayerWeights::packed`]).
    pub fn is_packed(&self) -> bool {
        self.lm_head_packed.is_some() || self.layers.iter().any(|(_, w)| !w.packed.is_empty())
    }
    /// Drops the packed forms: every projection then runs dense (with the same values: the
    /// dense tensors hold the dequantized weights rounded to the run dtype).
    pub fn dequantize_packed(&mut self) {
        self.layers.iter_mut().for_each(|(_, w)| w.packed.clear());
        self.lm_head_packed = None;
    }
    /// Quantizes every projection of the dense layers (q, k, v, o, gate, up, down) to NF4 in
    /// blocks of `block` (bitsandbytes' `quantize_4bit`, see [`PackedWeight::quantize_nf4`]);
    /// the dense tensors then hold the dequantized values rounded to `dtype`, the run dtype.
    /// Projections already packed are left as they are.
    pub fn quantize_nf4(&mut self, block: usize, dtype: DType) -> Result<()> {
        Ok(self.layers.iter_mut().try_for_each(|(spec, w)| w.quantize_nf4(spec, block, dtype))?)
    }
    /// Merges a LoRA adapter into the base: every adapted projection becomes dense,
    /// `W + scaling · B A` rounded once to `dtype` (peft's `merge_and_unload`). A packed
    /// projection is merged from its dequantized values and then runs dense.
    pub fn merge_adapter(&mut self, adapter: &crate::formats::peft::Adapter, dtype: DType) -> Result<()> {
        use crate::formats::peft::Projection;
        let scaling = adapter.config.lora.scaling();
        let r = adapter.config.lora.r;
        for (spec, w) in &mut self.layers {
            for &p in &adapter.config.targets {
                let pair = adapter.pair(spec, p)?;
                let [d_out, d_in] = p.shape(spec)?;
                let base = match (p, &mut w.ffn) {
                    (Projection::Q, _) => &mut w.q_proj,
                    (Projection::K, _) => &mut w.k_proj,
                    (Projection::V, _) => &mut w.v_proj,
                    (Projection::O, _) => &mut w.o_proj,
                    (Projection::Gate, llama_kernels::spec::weights::HostFfn::Dense { gate, .. }) => gate,
                    (Projection::Up, llama_kernels::spec::weights::HostFfn::Dense { up, .. }) => up,
                    (Projection::Down, llama_kernels::spec::weights::HostFfn::Dense { down, .. }) => down,
                    _ => {
                        return Err(Error::Unsupported { what: format!("a LoRA adapter on MoE layer {}", spec.index) });
                    }
                };
                if base.shape != [d_out, d_in] {
                    return Err(Error::Checkpoint {
                        tensor: p.tensor_names(spec.index)[0].clone(),
                        why: format!("does not fit the base projection {:?}", base.shape),
                    });
                }
                for o in 0..d_out {
                    let b = &pair.b.data[o * r..(o + 1) * r];
                    for i in 0..d_in {
                        let delta: f64 = (0..r).map(|k| f64::from(b[k]) * f64::from(pair.a.data[k * d_in + i])).sum();
                        let v = &mut base.data[o * d_in + i];
                        *v = round_to(dtype, f64::from(*v) + scaling * delta) as f32;
                    }
                }
                // The packed form (under its Hugging Face name) is gone: the merged values run dense.
                let name = match p {
                    Projection::Q | Projection::K | Projection::V | Projection::O => format!("{}.weight", p.path()),
                    Projection::Gate | Projection::Up | Projection::Down => {
                        format!("{}.{}.weight", llama_kernels::spec::weights::ffn_prefix(spec), p.module())
                    }
                };
                w.packed.remove(&name);
            }
        }
        Ok(())
    }

    /// The LM head: its own weight, or the embedding when tied.
    pub fn lm_head(&self) -> &HostTensor {
        self.lm_head.as_ref().unwrap_or(&self.embed)
    }

    /// Checks every part against the config and the others: one layer per configured layer,
    /// each with the config's spec and the same hidden size; the embedding `[vocab, hidden]`
    /// (vocab 1..=[`MAX_VOCAB`]); the norm `[hidden]`; the LM head, dense or packed,
    /// `[vocab, hidden]`; every tensor's data as long as its shape; a positive finite `eps`.
    /// The loaders return checked models and [`Model::new`](super::Model::new) checks again, so
    /// a hand-built `HostModel` is refused by name instead of leaving logits unwritten.
    pub fn validate(&self) -> Result<()> {
        let bad = |tensor: &str, why: String| Err(Error::Checkpoint { tensor: tensor.into(), why });
        let hidden = match self.layers.first() {
            Some((s, _)) => s.hidden,
            None => return bad("model.layers.0", "the model has no layers".into()),
        };
        if self.layers.len() != self.config.num_layers() {
            return Err(Error::Config {
                field: "num_hidden_layers".into(),
                why: format!("{} layers given, the config has {}", self.layers.len(), self.config.num_layers()),
            });
        }
        for (i, (spec, _)) in self.layers.iter().enumerate() {
            if *spec != self.config.layer(i)? {
                return bad(&format!("model.layers.{i}"), "its spec differs from the config's".into());
            }
        }
        let vocab = self.embed.shape.first().copied().unwrap_or(0);
        if self.embed.shape != [vocab, hidden] || vocab == 0 || vocab > MAX_VOCAB {
            return bad(
                "embed_tokens",
                format!("shape {:?}, expected [vocab 1..={MAX_VOCAB}, {hidden}]", self.embed.shape),
            );
        }
        if self.norm.shape != [hidden] {
            return bad("norm", format!("shape {:?}, expected [{hidden}]", self.norm.shape));
        }
        if let Some(p) = &self.lm_head_packed {
            if p.shape() != [vocab, hidden] {
                return bad("lm_head", format!("packed {:?}, expected [{vocab}, {hidden}]", p.shape()));
            }
        }
        if let Some(h) = &self.lm_head {
            if h.shape != [vocab, hidden] {
                return bad("lm_head", format!("shape {:?}, expected [{vocab}, {hidden}]", h.shape));
            }
        }
        let tensors =
            [("embed_tokens", Some(&self.embed)), ("norm", Some(&self.norm)), ("lm_head", self.lm_head.as_ref())];
        for (name, t) in tensors {
            if let Some(t) = t {
                let numel = t.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
                if numel != Some(t.data.len()) {
                    return bad(name, format!("{} values for shape {:?}", t.data.len(), t.shape));
                }
            }
        }
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(Error::Config {
                field: "rms_norm_eps".into(),
                why: format!("{} is not positive and finite", self.eps),
            });
        }
        Ok(())
    }

    /// `self`, [validated](HostModel::validate).
    fn checked(self) -> Result<HostModel> {
        self.validate()?;
        Ok(self)
    }

    /// A checkpoint directory ([`HostModel::from_checkpoint`]) or a GGUF file
    /// ([`HostModel::from_gguf`]), whichever `path` is.
    pub fn open(path: impl AsRef<Path>, dtype: DType) -> Result<HostModel> {
        let path = path.as_ref();
        if path.is_dir() { Self::from_checkpoint(path, dtype) } else { Self::from_gguf(path, dtype) }
    }

    /// A Hugging Face checkpoint directory (`config.json` + safetensors), converted to `dtype`.
    pub fn from_checkpoint(dir: impl AsRef<Path>, dtype: DType) -> Result<HostModel> {
        let dir = dir.as_ref();
        let ckpt = Checkpoint::open(dir)?;
        let raw = read_json(&dir.join("config.json"))?;
        let config = ckpt.config().clone();
        let layers = (0..config.num_layers()).map(|i| ckpt.layer(i, dtype)).collect::<Result<Vec<_>>>()?;
        let (spec, _) =
            layers.first().ok_or_else(|| Error::Config { field: "num_hidden_layers".into(), why: "0".into() })?;
        let hidden = spec.hidden;
        let text = raw.get("text_config").unwrap_or(&raw);
        let vocab = text.get("vocab_size").and_then(Value::as_u64).and_then(|v| usize::try_from(v).ok());
        let vocab = vocab.filter(|v| (1..=MAX_VOCAB).contains(v)).ok_or_else(|| Error::Config {
            field: "vocab_size".into(),
            why: format!("missing or not 1..={MAX_VOCAB}"),
        })?;
        let tied = raw.get("tie_word_embeddings").and_then(Value::as_bool).unwrap_or(false);
        let prefix = ckpt.layer_prefix(0)?.trim_end_matches("layers.0.").to_string();
        let embed = ckpt.tensor(&format!("{prefix}embed_tokens.weight"), &[vocab, hidden], dtype)?;
        let norm = ckpt.tensor(&format!("{prefix}norm.weight"), &[hidden], dtype)?;
        let head_name = format!("{}lm_head.weight", prefix.trim_end_matches("model."));
        let lm_head = if tied && !ckpt.lists(&head_name) {
            None
        } else {
            Some(ckpt.tensor(&head_name, &[vocab, hidden], dtype)?)
        };
        let eps = spec.rms_norm_eps;
        HostModel { config, layers, embed, norm, lm_head, eps, lm_head_packed: None }.checked()
    }

    /// A GGUF file of llama.cpp's `llama` or `llama4` architecture, converted to `dtype`: its
    /// quantized projections kept packed, every other tensor dequantized (see the module docs
    /// and [`super::gguf`]).
    pub fn from_gguf(path: impl AsRef<Path>, dtype: DType) -> Result<HostModel> {
        let file = GgufFile::open(path)?;
        let (arch, raw) = gguf::config(&file)?;
        let config = ModelConfig::from_value(&raw)?;
        let expected_kind = match arch {
            GgufArch::Llama => ModelKind::Llama,
            GgufArch::Llama4 => ModelKind::Llama4,
        };
        if config.kind() != expected_kind {
            return Err(Error::Unsupported { what: format!("GGUF {} read as {:?}", arch.name(), config.kind()) });
        }
        let dense = |name: &str, shape: &[usize]| -> Result<Vec<f32>> {
            let t = file.tensor(name)?;
            if t.shape != shape {
                return Err(Error::Checkpoint {
                    tensor: name.to_string(),
                    why: format!("shape {:?} disagrees with the metadata (expected {shape:?})", t.shape),
                });
            }
            Ok(file.dequantize(name)?.into_iter().map(|v| round_to(dtype, f64::from(v)) as f32).collect())
        };
        let fetch =
            |name: &str, shape: &[usize]| -> Result<HostTensor> { Ok(HostTensor::new(shape, dense(name, shape)?)?) };
        // A projection stored in a packed type stays packed; its dense tensor holds the
        // dequantized values rounded to `dtype` (what the packed kernels multiply by).
        let fetch_packed = |name: &str, shape: &[usize]| -> Result<Option<PackedWeight>> {
            let t = file.tensor(name)?;
            if t.dtype.quant_format().is_none() || t.shape != shape {
                return Ok(None);
            }
            file.packed(name).map(Some)
        };
        let layers = (0..config.num_layers())
            .map(|i| {
                let spec = config.layer(i)?;
                let packable = packable_projections(&spec);
                let mut packed = std::collections::BTreeMap::new();
                let mut w = HostLayerWeights::from_source(&spec, |name, shape| {
                    let source = tensors::source(arch, i, name, spec.q_heads, spec.kv_heads)
                        .ok_or_else(|| Error::Checkpoint { tensor: name.into(), why: "has no GGUF name".into() })?;
                    let assembled = |data: Option<Vec<f32>>, from: &str| {
                        let data = data.ok_or_else(|| Error::Checkpoint {
                            tensor: from.to_string(),
                            why: format!("does not make {name} {shape:?}"),
                        })?;
                        Ok::<_, Error>(HostTensor::new(shape, data)?)
                    };
                    match (source, shape) {
                        (Source::ExpertsGateUp { gate, up }, &[e, h, two_i]) => {
                            let inter = two_i / 2;
                            let (g, u) = (dense(&gate, &[e, inter, h])?, dense(&up, &[e, inter, h])?);
                            assembled(tensors::experts_gate_up(&g, &u, e, inter, h), &gate)
                        }
                        (Source::ExpertsDown { name: down }, &[e, inter, h]) => {
                            assembled(tensors::experts_down(&dense(&down, &[e, h, inter])?, e, inter, h), &down)
                        }
                        (Source::Tensor { name: gguf, unpermute_heads }, _) => {
                            let order = unpermute_heads.map(|heads| tensors::unpermute_order(shape[0], heads));
                            let p = if packable.iter().any(|p| p == name) { fetch_packed(&gguf, shape)? } else { None };
                            match p {
                                Some(mut p) => {
                                    if let Some(order) = &order {
                                        p = p.permute_rows(order)?;
                                    }
                                    let t = HostTensor::new(shape, p.dequantize_to(dtype))?;
                                    packed.insert(name.to_string(), p);
                                    Ok(t)
                                }
                                None => {
                                    let t = fetch(&gguf, shape)?;
                                    match &order {
                                        Some(order) => permute_rows(&t, order),
                                        None => Ok(t),
                                    }
                                }
                            }
                        }
                        (_, _) => {
                            Err(Error::Checkpoint { tensor: name.into(), why: format!("unexpected shape {shape:?}") })
                        }
                    }
                })?;
                w.packed = packed;
                Ok((spec, w))
            })
            .collect::<Result<Vec<_>>>()?;
        let hidden = layers.first().map_or(0, |(s, _)| s.hidden);
        let vocab = file.tensor("token_embd.weight")?.shape.first().copied().unwrap_or(0);
        if !(1..=MAX_VOCAB).contains(&vocab) {
            return Err(Error::Checkpoint { tensor: "token_embd.weight".into(), why: format!("vocab {vocab}") });
        }
        let embed = fetch("token_embd.weight", &[vocab, hidden])?;
        let norm = fetch("output_norm.weight", &[hidden])?;
        let lm_head =
            if file.tensor("output.weight").is_ok() { Some(fetch("output.weight", &[vocab, hidden])?) } else { None };
        let head_name = if lm_head.is_some() { "output.weight" } else { "token_embd.weight" };
        let lm_head_packed = fetch_packed(head_name, &[vocab, hidden])?;
        let eps = layers.first().map_or(1e-5, |(s, _)| s.rms_norm_eps);
        HostModel { config, layers, embed, norm, lm_head, eps, lm_head_packed }.checked()
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = read_bounded_text(path, MAX_CONFIG_BYTES)?;
    serde_json::from_str(&text)
        .map_err(|e| Error::Io { path: path.display().to_string(), why: format!("not JSON: {e}") })
}

/// `t` (a weight `[rows, in]` or a bias `[rows]`) with its rows reordered: row `i` is row
/// `order[i]` of `t`.
fn permute_rows(t: &HostTensor, order: &[usize]) -> Result<HostTensor> {
    let cols: usize = t.shape.iter().skip(1).product();
    let data = order.iter().flat_map(|&r| t.data[r * cols..(r + 1) * cols].iter().copied()).collect();
    Ok(HostTensor::new(&t.shape, data)?)
}
