//! One layer's weights on the host, under their Hugging Face names and layouts
//! ([`HostLayerWeights`]): what the checkpoint loader produces, the device upload consumes and
//! the f64 reference reads. Values are stored as f32 already rounded to the run dtype (bf16 and
//! f16 values are exact in f32), so the device copy and the reference see the same numbers.

use crate::error::{Error, Result};
use crate::spec::layer::{FfnSpec, LayerSpec, ModelKind};

/// A host tensor: row-major f32 values (rounded to the run dtype) and a shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Dimensions, outermost first.
    pub shape: Vec<usize>,
    /// Values in row-major order.
    pub data: Vec<f32>,
}

impl HostTensor {
    /// Wraps `data` as `shape`; fails when their element counts differ.
    pub fn new(shape: &[usize], data: Vec<f32>) -> Result<HostTensor> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::LengthMismatch { what: "HostTensor", expected: n, got: data.len() });
        }
        Ok(HostTensor { shape: shape.to_vec(), data })
    }
    /// The values as f64 (for the reference).
    pub fn f64(&self) -> Vec<f64> {
        self.data.iter().map(|&v| f64::from(v)).collect()
    }
}

/// The feed-forward weights of one layer, in Hugging Face layouts.
#[derive(Clone, Debug, PartialEq)]
pub enum HostFfn {
    /// `mlp.{gate,up,down}_proj` (Llama) or `feed_forward.{gate,up,down}_proj` (Llama 4 dense
    /// layers): gate and up `[intermediate, hidden]`, down `[hidden, intermediate]`.
    Dense {
        /// `gate_proj.weight`, `[intermediate, hidden]`.
        gate: HostTensor,
        /// `up_proj.weight`, `[intermediate, hidden]`.
        up: HostTensor,
        /// `down_proj.weight`, `[hidden, intermediate]`.
        down: HostTensor,
        /// `mlp_bias`: gate, up and down biases.
        bias: Option<[HostTensor; 3]>,
    },
    /// Llama 4's `feed_forward`: `router.weight` `[experts, hidden]`, `experts.gate_up_proj`
    /// `[experts, hidden, 2 intermediate]` (x @ W, gate columns first), `experts.down_proj`
    /// `[experts, intermediate, hidden]`, and `shared_expert.{gate,up,down}_proj` (nn.Linear).
    Moe {
        /// `router.weight`, `[experts, hidden]`.
        router: HostTensor,
        /// `experts.gate_up_proj`, `[experts, hidden, 2 intermediate]`, gate columns first.
        experts_gate_up: HostTensor,
        /// `experts.down_proj`, `[experts, intermediate, hidden]`.
        experts_down: HostTensor,
        /// `shared_expert.gate_proj.weight`, `[intermediate, hidden]`.
        shared_gate: HostTensor,
        /// `shared_expert.up_proj.weight`, `[intermediate, hidden]`.
        shared_up: HostTensor,
        /// `shared_expert.down_proj.weight`, `[hidden, intermediate]`.
        shared_down: HostTensor,
    },
}

/// One decoder layer's weights on the host, under Hugging Face names (see [`Self::named`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HostLayerWeights {
    /// `input_layernorm.weight`, `[hidden]`.
    pub input_norm: HostTensor,
    /// `self_attn.q_proj.weight`, `[q_heads head_dim, hidden]`.
    pub q_proj: HostTensor,
    /// `self_attn.k_proj.weight`, `[kv_heads head_dim, hidden]`.
    pub k_proj: HostTensor,
    /// `self_attn.v_proj.weight`, `[kv_heads head_dim, hidden]`.
    pub v_proj: HostTensor,
    /// `self_attn.o_proj.weight`, `[hidden, q_heads head_dim]`.
    pub o_proj: HostTensor,
    /// `attention_bias`: q, k, v and o biases.
    pub attn_bias: Option<[HostTensor; 4]>,
    /// `post_attention_layernorm.weight`, `[hidden]`.
    pub post_norm: HostTensor,
    /// The feed-forward's weights.
    pub ffn: HostFfn,
    /// Projections also kept in a packed format, by their Hugging Face name
    /// (`self_attn.q_proj.weight`, `mlp.down_proj.weight`, ...): the device runs these packed
    /// ([`crate::ops::qlinear`]), and the dense tensor of the same name holds their dequantized
    /// values rounded to the run dtype (verify's references take the values each product's path
    /// multiplies by, `QPath::weight_values`). Empty for a dense checkpoint.
    pub packed: std::collections::BTreeMap<String, crate::spec::quant::PackedWeight>,
}

impl HostLayerWeights {
    /// Assembles a layer's weights from a source that returns each tensor by its Hugging Face
    /// name (relative to the layer, as [`Self::named`] lists them) and the shape `spec` expects:
    /// a safetensors checkpoint, a GGUF file, generated weights. The source's errors (of any
    /// type that a crate [`Error`] converts into) pass through.
    pub fn from_source<E: From<Error>>(
        spec: &LayerSpec,
        mut fetch: impl FnMut(&str, &[usize]) -> Result<HostTensor, E>,
    ) -> Result<HostLayerWeights, E> {
        let shapes = expected_shapes(spec);
        let mut take = |name: &str| -> Result<HostTensor, E> {
            let shape = shapes.iter().find(|(n, _)| n == name).map(|(_, s)| s.as_slice()).ok_or_else(|| {
                Error::Checkpoint { tensor: name.to_string(), why: format!("not a tensor of {}", spec.describe()) }
            })?;
            fetch(name, shape)
        };
        let mlp = ffn_prefix(spec);
        let input_norm = take("input_layernorm.weight")?;
        let q_proj = take("self_attn.q_proj.weight")?;
        let k_proj = take("self_attn.k_proj.weight")?;
        let v_proj = take("self_attn.v_proj.weight")?;
        let o_proj = take("self_attn.o_proj.weight")?;
        let post_norm = take("post_attention_layernorm.weight")?;
        let attn_bias = if spec.attention_bias {
            Some([
                take("self_attn.q_proj.bias")?,
                take("self_attn.k_proj.bias")?,
                take("self_attn.v_proj.bias")?,
                take("self_attn.o_proj.bias")?,
            ])
        } else {
            None
        };
        let ffn = match spec.ffn {
            FfnSpec::Dense { bias, .. } => HostFfn::Dense {
                gate: take(&format!("{mlp}.gate_proj.weight"))?,
                up: take(&format!("{mlp}.up_proj.weight"))?,
                down: take(&format!("{mlp}.down_proj.weight"))?,
                bias: if bias {
                    Some([
                        take(&format!("{mlp}.gate_proj.bias"))?,
                        take(&format!("{mlp}.up_proj.bias"))?,
                        take(&format!("{mlp}.down_proj.bias"))?,
                    ])
                } else {
                    None
                },
            },
            FfnSpec::Moe { .. } => HostFfn::Moe {
                router: take("feed_forward.router.weight")?,
                experts_gate_up: take("feed_forward.experts.gate_up_proj")?,
                experts_down: take("feed_forward.experts.down_proj")?,
                shared_gate: take("feed_forward.shared_expert.gate_proj.weight")?,
                shared_up: take("feed_forward.shared_expert.up_proj.weight")?,
                shared_down: take("feed_forward.shared_expert.down_proj.weight")?,
            },
        };
        Ok(HostLayerWeights {
            input_norm,
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            attn_bias,
            post_norm,
            ffn,
            packed: Default::default(),
        })
    }
}

impl HostLayerWeights {
    /// Quantizes every projection not yet packed (see [`Self::projections_mut`]) to NF4 in
    /// blocks of `block`, as bitsandbytes' `quantize_4bit` does
    /// ([`crate::spec::quant::PackedWeight::quantize_nf4`]); the dense tensors then hold the
    /// dequantized values rounded to `dtype` (the run dtype), what a dense run multiplies by and
    /// what the packed GEMM does (the tensor-core GEMV of decode multiplies by other roundings of
    /// the same values: `ops::qlinear::QPath::weight_values`, which verify's references follow).
    pub fn quantize_nf4(&mut self, spec: &LayerSpec, block: usize, dtype: crate::dtype::DType) -> Result<()> {
        let mut packed = std::mem::take(&mut self.packed);
        for (name, t) in self.projections_mut(spec) {
            if packed.contains_key(&name) {
                continue;
            }
            let p = crate::spec::quant::PackedWeight::quantize_nf4(t.shape[0], t.shape[1], block, &t.data)?;
            t.data = p.dequantize_to(dtype);
            packed.insert(name, p);
        }
        self.packed = packed;
        Ok(())
    }

    /// The linear projections a packed format may hold ([`packable_projections`]), by Hugging
    /// Face name, writable.
    pub fn projections_mut(&mut self, spec: &LayerSpec) -> Vec<(String, &mut HostTensor)> {
        let mut tensors: Vec<&mut HostTensor> =
            vec![&mut self.q_proj, &mut self.k_proj, &mut self.v_proj, &mut self.o_proj];
        if let HostFfn::Dense { gate, up, down, .. } = &mut self.ffn {
            tensors.extend([gate, up, down]);
        }
        packable_projections(spec).into_iter().zip(tensors).collect()
    }

    /// Every tensor under its Hugging Face name, relative to the layer prefix
    /// (`model.layers.N.`), in the order a checkpoint lists them.
    pub fn named(&self, spec: &LayerSpec) -> Vec<(String, &HostTensor)> {
        let mut v: Vec<(String, &HostTensor)> = vec![
            ("input_layernorm.weight".into(), &self.input_norm),
            ("self_attn.q_proj.weight".into(), &self.q_proj),
            ("self_attn.k_proj.weight".into(), &self.k_proj),
            ("self_attn.v_proj.weight".into(), &self.v_proj),
            ("self_attn.o_proj.weight".into(), &self.o_proj),
            ("post_attention_layernorm.weight".into(), &self.post_norm),
        ];
        if let Some([q, k, vb, o]) = &self.attn_bias {
            for (n, t) in [("q", q), ("k", k), ("v", vb), ("o", o)] {
                v.push((format!("self_attn.{n}_proj.bias"), t));
            }
        }
        let mlp = ffn_prefix(spec);
        match &self.ffn {
            HostFfn::Dense { gate, up, down, bias } => {
                v.push((format!("{mlp}.gate_proj.weight"), gate));
                v.push((format!("{mlp}.up_proj.weight"), up));
                v.push((format!("{mlp}.down_proj.weight"), down));
                if let Some([g, u, d]) = bias {
                    v.push((format!("{mlp}.gate_proj.bias"), g));
                    v.push((format!("{mlp}.up_proj.bias"), u));
                    v.push((format!("{mlp}.down_proj.bias"), d));
                }
            }
            HostFfn::Moe { router, experts_gate_up, experts_down, shared_gate, shared_up, shared_down } => {
                v.push(("feed_forward.router.weight".into(), router));
                v.push(("feed_forward.experts.gate_up_proj".into(), experts_gate_up));
                v.push(("feed_forward.experts.down_proj".into(), experts_down));
                v.push(("feed_forward.shared_expert.gate_proj.weight".into(), shared_gate));
                v.push(("feed_forward.shared_expert.up_proj.weight".into(), shared_up));
                v.push(("feed_forward.shared_expert.down_proj.weight".into(), shared_down));
            }
        }
        v
    }
}

/// Where a layer's dense MLP lives: `mlp` (Llama) or `feed_forward` (Llama 4).
pub fn ffn_prefix(spec: &LayerSpec) -> &'static str {
    match spec.model {
        ModelKind::Llama => "mlp",
        ModelKind::Llama4 => "feed_forward",
    }
}

/// The projections of a layer of `spec` that the device runs from a packed weight when one is
/// given ([`HostLayerWeights::packed`]): q, k, v, o and, for a dense feed-forward, gate, up and
/// down, by Hugging Face name. The MoE feed-forward (router, experts, shared expert) runs dense.
pub fn packable_projections(spec: &LayerSpec) -> Vec<String> {
    let mut v: Vec<String> = ["q", "k", "v", "o"].iter().map(|p| format!("self_attn.{p}_proj.weight")).collect();
    if let FfnSpec::Dense { .. } = spec.ffn {
        let mlp = ffn_prefix(spec);
        v.extend(["gate", "up", "down"].iter().map(|p| format!("{mlp}.{p}_proj.weight")));
    }
    v
}

/// The shape every weight of `spec` must have, by Hugging Face name (relative to the layer).
pub fn expected_shapes(spec: &LayerSpec) -> Vec<(String, Vec<usize>)> {
    let (h, d) = (spec.hidden, spec.head_dim);
    let (qd, kvd) = (spec.q_heads * d, spec.kv_heads * d);
    let mut v = vec![
        ("input_layernorm.weight".to_string(), vec![h]),
        ("self_attn.q_proj.weight".into(), vec![qd, h]),
        ("self_attn.k_proj.weight".into(), vec![kvd, h]),
        ("self_attn.v_proj.weight".into(), vec![kvd, h]),
        ("self_attn.o_proj.weight".into(), vec![h, qd]),
        ("post_attention_layernorm.weight".into(), vec![h]),
    ];
    if spec.attention_bias {
        v.push(("self_attn.q_proj.bias".into(), vec![qd]));
        v.push(("self_attn.k_proj.bias".into(), vec![kvd]));
        v.push(("self_attn.v_proj.bias".into(), vec![kvd]));
        v.push(("self_attn.o_proj.bias".into(), vec![h]));
    }
    let mlp = ffn_prefix(spec);
    match spec.ffn {
        FfnSpec::Dense { intermediate: i, bias } => {
            v.push((format!("{mlp}.gate_proj.weight"), vec![i, h]));
            v.push((format!("{mlp}.up_proj.weight"), vec![i, h]));
            v.push((format!("{mlp}.down_proj.weight"), vec![h, i]));
            if bias {
                v.push((format!("{mlp}.gate_proj.bias"), vec![i]));
                v.push((format!("{mlp}.up_proj.bias"), vec![i]));
                v.push((format!("{mlp}.down_proj.bias"), vec![h]));
            }
        }
        FfnSpec::Moe { experts: e, intermediate: i, .. } => {
            v.push(("feed_forward.router.weight".into(), vec![e, h]));
            v.push(("feed_forward.experts.gate_up_proj".into(), vec![e, h, 2 * i]));
            v.push(("feed_forward.experts.down_proj".into(), vec![e, i, h]));
            v.push(("feed_forward.shared_expert.gate_proj.weight".into(), vec![i, h]));
            v.push(("feed_forward.shared_expert.up_proj.weight".into(), vec![i, h]));
            v.push(("feed_forward.shared_expert.down_proj.weight".into(), vec![h, i]));
        }
    }
    v
}

/// Every tensor of `host` has the shape `spec` implies (and the same set of tensors).
pub fn check_shapes(spec: &LayerSpec, host: &HostLayerWeights) -> Result<()> {
    let named = host.named(spec);
    for (name, shape) in expected_shapes(spec) {
        match named.iter().find(|(n, _)| *n == name) {
            None => return Err(Error::Checkpoint { tensor: name, why: "missing".into() }),
            Some((_, t)) if t.shape != shape => {
                return Err(Error::Checkpoint {
                    tensor: name,
                    why: format!("shape {:?} disagrees with the config (expected {shape:?})", t.shape),
                });
            }
            Some(_) => {}
        }
    }
    for (name, p) in &host.packed {
        let dense = named.iter().find(|(n, _)| n == name).map(|(_, t)| t.shape.as_slice());
        if dense != Some(&[p.layout().rows(), p.layout().cols()][..]) {
            return Err(Error::Checkpoint {
                tensor: name.clone(),
                why: format!("packed [{}, {}] has no dense tensor of that shape", p.layout().rows(), p.layout().cols()),
            });
        }
    }
    Ok(())
}
