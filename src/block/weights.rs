//! One layer's weights: on the host under their Hugging Face names and layouts
//! ([`HostLayerWeights`], what the checkpoint loader and the f64 reference use), and on the
//! device in the layout the forward needs ([`LayerWeights`]: q/k/v and gate/up concatenated, so
//! each is one GEMM).
//!
//! Host values are stored as f32 but are already rounded to the run dtype (bf16 and f16 values
//! are exact in f32), so the device copy and the reference see exactly the same numbers.

use half::{bf16, f16};

use super::config::{FfnSpec, LayerSpec};
use crate::backend::Device;
use crate::dtype::{DType, round_to};
use crate::error::{Error, Result};
use crate::ops::moe::{GateUpTensors, MoeFfnWeights, SharedExpertTensors, WeightLayout};
use crate::tensor::Tensor;

/// A host tensor: row-major f32 values (rounded to the run dtype) and a shape.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f32>,
}

impl HostTensor {
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
    /// Seeded normal values with standard deviation `std`, rounded to `dtype`.
    pub fn random(rng: &mut Rng, shape: &[usize], std: f64, dtype: DType) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor { shape: shape.to_vec(), data: (0..n).map(|_| round_to(dtype, std * rng.normal()) as f32).collect() }
    }
    /// Seeded values uniform in [lo, hi), rounded to `dtype` (norm weights).
    pub fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64, dtype: DType) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| round_to(dtype, lo + (hi - lo) * rng.uniform()) as f32).collect(),
        }
    }
}

/// The feed-forward weights of one layer, in Hugging Face layouts.
#[derive(Clone, Debug, PartialEq)]
pub enum HostFfn {
    /// `mlp.{gate,up,down}_proj` (Llama) or `feed_forward.{gate,up,down}_proj` (Llama 4 dense
    /// layers): gate and up `[intermediate, hidden]`, down `[hidden, intermediate]`.
    Dense {
        gate: HostTensor,
        up: HostTensor,
        down: HostTensor,
        /// `mlp_bias`: gate, up and down biases.
        bias: Option<[HostTensor; 3]>,
    },
    /// Llama 4's `feed_forward`: `router.weight` `[experts, hidden]`, `experts.gate_up_proj`
    /// `[experts, hidden, 2 intermediate]` (x @ W, gate columns first), `experts.down_proj`
    /// `[experts, intermediate, hidden]`, and `shared_expert.{gate,up,down}_proj` (nn.Linear).
    Moe {
        router: HostTensor,
        experts_gate_up: HostTensor,
        experts_down: HostTensor,
        shared_gate: HostTensor,
        shared_up: HostTensor,
        shared_down: HostTensor,
    },
}

/// One decoder layer's weights on the host, under Hugging Face names (see [`Self::named`]).
#[derive(Clone, Debug, PartialEq)]
pub struct HostLayerWeights {
    pub input_norm: HostTensor,
    pub q_proj: HostTensor,
    pub k_proj: HostTensor,
    pub v_proj: HostTensor,
    pub o_proj: HostTensor,
    /// `attention_bias`: q, k, v and o biases.
    pub attn_bias: Option<[HostTensor; 4]>,
    pub post_norm: HostTensor,
    pub ffn: HostFfn,
}

/// A small deterministic generator (the same SplitMix64 as the test support).
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
}

impl HostLayerWeights {
    /// Seeded random weights for `spec`, scaled so activations stay of order one (projections
    /// with standard deviation `1 / sqrt(fan_in)`, norm weights in [0.5, 1.5)).
    pub fn random(spec: &LayerSpec, dtype: DType, seed: u64) -> HostLayerWeights {
        let mut rng = Rng::new(seed ^ (spec.index as u64) << 32);
        let (h, d) = (spec.hidden, spec.head_dim);
        let (qd, kvd) = (spec.q_heads * d, spec.kv_heads * d);
        let s = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
        let input_norm = HostTensor::uniform(&mut rng, &[h], 0.5, 1.5, dtype);
        let q_proj = HostTensor::random(&mut rng, &[qd, h], s(h), dtype);
        let k_proj = HostTensor::random(&mut rng, &[kvd, h], s(h), dtype);
        let v_proj = HostTensor::random(&mut rng, &[kvd, h], s(h), dtype);
        let o_proj = HostTensor::random(&mut rng, &[h, qd], s(qd), dtype);
        let attn_bias = spec.attention_bias.then(|| {
            [
                HostTensor::random(&mut rng, &[qd], 0.1, dtype),
                HostTensor::random(&mut rng, &[kvd], 0.1, dtype),
                HostTensor::random(&mut rng, &[kvd], 0.1, dtype),
                HostTensor::random(&mut rng, &[h], 0.1, dtype),
            ]
        });
        let post_norm = HostTensor::uniform(&mut rng, &[h], 0.5, 1.5, dtype);
        let ffn = match spec.ffn {
            FfnSpec::Dense { intermediate: i, bias } => HostFfn::Dense {
                gate: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                up: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                down: HostTensor::random(&mut rng, &[h, i], s(i), dtype),
                bias: bias.then(|| {
                    [
                        HostTensor::random(&mut rng, &[i], 0.1, dtype),
                        HostTensor::random(&mut rng, &[i], 0.1, dtype),
                        HostTensor::random(&mut rng, &[h], 0.1, dtype),
                    ]
                }),
            },
            FfnSpec::Moe { experts: e, intermediate: i, .. } => HostFfn::Moe {
                router: HostTensor::random(&mut rng, &[e, h], s(h), dtype),
                experts_gate_up: HostTensor::random(&mut rng, &[e, h, 2 * i], s(h), dtype),
                experts_down: HostTensor::random(&mut rng, &[e, i, h], s(i), dtype),
                shared_gate: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                shared_up: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                shared_down: HostTensor::random(&mut rng, &[h, i], s(i), dtype),
            },
        };
        HostLayerWeights { input_norm, q_proj, k_proj, v_proj, o_proj, attn_bias, post_norm, ffn }
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
pub(crate) fn ffn_prefix(spec: &LayerSpec) -> &'static str {
    match spec.model {
        super::config::ModelKind::Llama => "mlp",
        super::config::ModelKind::Llama4 => "feed_forward",
    }
}

/// The feed-forward weights of one layer on the device.
#[derive(Clone, Debug)]
pub enum FfnWeights {
    Dense {
        /// `[2 intermediate, hidden]`: the gate rows, then the up rows (one GEMM whose output is
        /// `[gate | up]`, what `swiglu`'s `GateThenUp` reads).
        gate_up: Tensor,
        gate_up_bias: Option<Tensor>,
        /// `[hidden, intermediate]`.
        down: Tensor,
        down_bias: Option<Tensor>,
    },
    /// Kept in Hugging Face layouts, which the MoE ops read in place: router `[E, hidden]`,
    /// experts' packed gate_up `[E, hidden, 2I]` and down `[E, I, hidden]`
    /// ([`WeightLayout::InOut`](crate::ops::moe::WeightLayout::InOut)), and the shared expert's
    /// `nn.Linear` gate, up `[I, hidden]` and down `[hidden, I]`.
    Moe(MoeFfnWeights),
}

/// One decoder layer's weights on the device, in the run dtype.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    pub input_norm: Tensor,
    /// `[(q_heads + 2 kv_heads) head_dim, hidden]`: q, k and v rows concatenated.
    pub qkv: Tensor,
    pub qkv_bias: Option<Tensor>,
    /// `[hidden, q_heads head_dim]`.
    pub o: Tensor,
    pub o_bias: Option<Tensor>,
    pub post_norm: Tensor,
    pub ffn: FfnWeights,
}

/// Uploads f32 values (already rounded to `dtype`) as a `dtype` tensor.
pub(crate) fn upload(device: &Device, dtype: DType, data: &[f32], shape: &[usize]) -> Result<Tensor> {
    match dtype {
        DType::F32 => Tensor::from_slice(device, data, shape),
        DType::F16 => Tensor::from_slice(device, &data.iter().map(|&v| f16::from_f32(v)).collect::<Vec<_>>(), shape),
        DType::BF16 => Tensor::from_slice(device, &data.iter().map(|&v| bf16::from_f32(v)).collect::<Vec<_>>(), shape),
        other => Err(Error::UnsupportedDType {
            op: "LayerWeights",
            what: "run dtype",
            dtype: other,
            supported: "f32, f16, bf16",
        }),
    }
}

fn concat(parts: &[&HostTensor]) -> Vec<f32> {
    parts.iter().flat_map(|t| t.data.iter().copied()).collect()
}

impl LayerWeights {
    /// Uploads `host` (checked against `spec`) in `dtype`, concatenating q/k/v and gate/up.
    pub fn upload(device: &Device, dtype: DType, spec: &LayerSpec, host: &HostLayerWeights) -> Result<LayerWeights> {
        check_shapes(spec, host)?;
        let (h, qkv) = (spec.hidden, spec.qkv_dim());
        let qd = spec.q_heads * spec.head_dim;
        let up = |data: &[f32], shape: &[usize]| upload(device, dtype, data, shape);
        let qkv_w = up(&concat(&[&host.q_proj, &host.k_proj, &host.v_proj]), &[qkv, h])?;
        let (qkv_bias, o_bias) = match &host.attn_bias {
            Some([q, k, v, o]) => (Some(up(&concat(&[q, k, v]), &[qkv])?), Some(up(&o.data, &[h])?)),
            None => (None, None),
        };
        let ffn = match &host.ffn {
            HostFfn::Dense { gate, up: u, down, bias } => {
                let i = gate.shape[0];
                FfnWeights::Dense {
                    gate_up: up(&concat(&[gate, u]), &[2 * i, h])?,
                    gate_up_bias: match bias {
                        Some([g, ub, _]) => Some(up(&concat(&[g, ub]), &[2 * i])?),
                        None => None,
                    },
                    down: up(&down.data, &[h, i])?,
                    down_bias: match bias {
                        Some([_, _, d]) => Some(up(&d.data, &[h])?),
                        None => None,
                    },
                }
            }
            HostFfn::Moe { router, experts_gate_up, experts_down, shared_gate, shared_up, shared_down } => {
                let t = |x: &HostTensor| up(&x.data, &x.shape);
                FfnWeights::Moe(MoeFfnWeights {
                    router: t(router)?,
                    router_bias: None,
                    layout: WeightLayout::InOut,
                    gate_up: GateUpTensors::Packed(t(experts_gate_up)?),
                    down: t(experts_down)?,
                    shared: Some(SharedExpertTensors {
                        gate: t(shared_gate)?,
                        up: t(shared_up)?,
                        down: t(shared_down)?,
                    }),
                })
            }
        };
        Ok(LayerWeights {
            input_norm: up(&host.input_norm.data, &[h])?,
            qkv: qkv_w,
            qkv_bias,
            o: up(&host.o_proj.data, &[h, qd])?,
            o_bias,
            post_norm: up(&host.post_norm.data, &[h])?,
            ffn,
        })
    }
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
    Ok(())
}
