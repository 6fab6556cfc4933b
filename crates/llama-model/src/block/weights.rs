//! One layer's weights: on the host under their Hugging Face names and layouts
//! ([`HostLayerWeights`], what the checkpoint loader and the f64 reference use), and on the
//! device in the layout the forward needs ([`LayerWeights`]: q/k/v and gate/up concatenated, so
//! each is one GEMM).
//!
//! Host values are stored as f32 but are already rounded to the run dtype (bf16 and f16 values
//! are exact in f32), so the device copy and the reference see exactly the same numbers.

use crate::error::{Error, Result};
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops::moe::WeightLayout;
use llama_kernels::ops::moe::{GateUpTensors, MoeFfnWeights, SharedExpertTensors};
use llama_kernels::spec::layer::LayerSpec;
pub use llama_kernels::spec::weights::{HostFfn, HostLayerWeights, HostTensor, check_shapes, expected_shapes};
use llama_kernels::tensor::Tensor;

use super::proj::{Proj, upload};

/// The feed-forward weights of one layer on the device.
#[derive(Clone, Debug)]
pub enum FfnWeights {
    /// A dense SwiGLU MLP, gate and up fused into one projection.
    Dense {
        /// `[2 intermediate, hidden]`: the gate rows, then the up rows (one GEMM whose output is
        /// `[gate | up]`, what `swiglu`'s `GateThenUp` reads).
        gate_up: Proj,
        /// `[2 intermediate]`: the gate biases, then the up biases (`mlp_bias`).
        gate_up_bias: Option<Tensor>,
        /// `[hidden, intermediate]`.
        down: Proj,
        /// `[hidden]` (`mlp_bias`).
        down_bias: Option<Tensor>,
    },
    /// Kept in Hugging Face layouts, which the MoE ops read in place: router `[E, hidden]`,
    /// experts' packed gate_up `[E, hidden, 2I]` and down `[E, I, hidden]`
    /// ([`WeightLayout::InOut`]), and the shared expert's
    /// `nn.Linear` gate, up `[I, hidden]` and down `[hidden, I]`.
    Moe(MoeFfnWeights),
}

/// One decoder layer's weights on the device, in the run dtype.
#[derive(Clone, Debug)]
pub struct LayerWeights {
    /// `[hidden]`: the RMSNorm weight before attention.
    pub input_norm: Tensor,
    /// `[(q_heads + 2 kv_heads) head_dim, hidden]`: q, k and v rows concatenated.
    pub qkv: Proj,
    /// `[(q_heads + 2 kv_heads) head_dim]`: q, k and v biases concatenated (`attention_bias`).
    pub qkv_bias: Option<Tensor>,
    /// `[hidden, q_heads head_dim]`.
    pub o: Proj,
    /// `[hidden]` (`attention_bias`).
    pub o_bias: Option<Tensor>,
    /// `[hidden]`: the RMSNorm weight before the feed-forward.
    pub post_norm: Tensor,
    /// The feed-forward's weights.
    pub ffn: FfnWeights,
}

fn concat(parts: &[&HostTensor]) -> Vec<f32> {
    parts.iter().flat_map(|t| t.data.iter().copied()).collect()
}

impl LayerWeights {
    /// Uploads `host` (checked against `spec`) in `dtype`, concatenating q/k/v and gate/up.
    pub fn upload(device: &Device, dtype: DType, spec: &LayerSpec, host: &HostLayerWeights) -> Result<LayerWeights> {
        check_shapes(spec, host)?;
        let (h, qkv) = (spec.hidden, spec.qkv_dim());
        let up = |data: &[f32], shape: &[usize]| upload(device, dtype, data, shape);
        let pk = &host.packed;
        let mlp = llama_kernels::spec::weights::ffn_prefix(spec);
        if !pk.is_empty() && (host.attn_bias.is_some() || matches!(host.ffn, HostFfn::Dense { bias: Some(_), .. })) {
            return Err(Error::Unsupported { what: "packed projections with biases".into() });
        }
        let proj = |parts: &[(&str, &HostTensor)]| Proj::upload(device, dtype, parts, pk);
        let qkv_w = proj(&[
            ("self_attn.q_proj.weight", &host.q_proj),
            ("self_attn.k_proj.weight", &host.k_proj),
            ("self_attn.v_proj.weight", &host.v_proj),
        ])?;
        let (qkv_bias, o_bias) = match &host.attn_bias {
            Some([q, k, v, o]) => (Some(up(&concat(&[q, k, v]), &[qkv])?), Some(up(&o.data, &[h])?)),
            None => (None, None),
        };
        let ffn = match &host.ffn {
            HostFfn::Dense { gate, up: u, down, bias } => {
                let i = gate.shape[0];
                FfnWeights::Dense {
                    gate_up: proj(&[
                        (&format!("{mlp}.gate_proj.weight"), gate),
                        (&format!("{mlp}.up_proj.weight"), u),
                    ])?,
                    gate_up_bias: match bias {
                        Some([g, ub, _]) => Some(up(&concat(&[g, ub]), &[2 * i])?),
                        None => None,
                    },
                    down: proj(&[(&format!("{mlp}.down_proj.weight"), down)])?,
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
            o: proj(&[("self_attn.o_proj.weight", &host.o_proj)])?,
            o_bias,
            post_norm: up(&host.post_norm.data, &[h])?,
            ffn,
        })
    }

    /// Every packed weight of the layer.
    pub fn packed_weights(&self) -> Vec<&llama_kernels::ops::qlinear::QWeight> {
        let mut v: Vec<&llama_kernels::ops::qlinear::QWeight> =
            self.qkv.packed().iter().chain(self.o.packed()).collect();
        if let FfnWeights::Dense { gate_up, down, .. } = &self.ffn {
            v.extend(gate_up.packed().iter().chain(down.packed()));
        }
        v
    }
}
