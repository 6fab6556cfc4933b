//! `verify` cases of the whole MoE feed-forward layer against the reference layer.

use super::common::*;
use super::gemm::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, compare};
use crate::dev::verify::common::CaseResult;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::moe::{GateUpTensors, MoeFfn, MoeFfnWeights, SharedExpertTensors};
use crate::ops::moe::{MoeFfnConfig, MoeRouting, WeightLayout};
use crate::reference::moe as reference;
use crate::tensor::Tensor;

// ------------------------------------------------------------------------------------ the layer

/// A whole-layer case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeFfnCase {
    pub dtype: DType,
    pub tokens: usize,
    pub hidden: usize,
    pub intermediate: usize,
    pub experts: usize,
    pub top_k: usize,
    pub routing: MoeRouting,
    pub weights_on_input: bool,
    pub layout: WeightLayout,
    /// Gate and up in one tensor (else two).
    pub packed: bool,
    /// The shared expert's intermediate size (0: none).
    pub shared: usize,
    pub residual: bool,
    pub bias: bool,
    pub seed: u64,
}

impl MoeFfnCase {
    /// Llama 4 Scout scaled down: 16 experts, top-1, sigmoid weights on the input, packed
    /// `[E, hidden, 2I]` weights, a shared expert, the residual added.
    pub fn llama4_scout(dtype: DType, tokens: usize) -> Self {
        MoeFfnCase {
            dtype,
            tokens,
            hidden: 128,
            intermediate: 128,
            experts: 16,
            top_k: 1,
            routing: MoeRouting::Llama4,
            weights_on_input: true,
            layout: WeightLayout::InOut,
            packed: true,
            shared: 128,
            residual: true,
            bias: false,
            seed: 17,
        }
    }
    /// Mixtral scaled down: 8 experts, softmax top-2 renormalized, separate `nn.Linear` weights,
    /// no shared expert.
    pub fn mixtral(dtype: DType, tokens: usize) -> Self {
        MoeFfnCase {
            dtype,
            tokens,
            hidden: 64,
            intermediate: 192,
            experts: 8,
            top_k: 2,
            routing: MoeRouting::Softmax { renormalize: true },
            weights_on_input: false,
            layout: WeightLayout::OutIn,
            packed: false,
            shared: 0,
            residual: false,
            bias: false,
            seed: 19,
        }
    }
    /// DeepSeek-V3-style grouped routing scaled down: 32 experts in 8 groups, 4 kept, top-6,
    /// bias, renormalized and scaled, packed OutIn weights and a shared expert.
    pub fn grouped(dtype: DType, tokens: usize) -> Self {
        MoeFfnCase {
            dtype,
            tokens,
            hidden: 64,
            intermediate: 64,
            experts: 32,
            top_k: 6,
            routing: MoeRouting::Grouped { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 },
            weights_on_input: false,
            layout: WeightLayout::OutIn,
            packed: true,
            shared: 64,
            residual: true,
            bias: true,
            seed: 23,
        }
    }
}

pub fn moe_ffn_case(device: &Device, case: &MoeFfnCase) -> Result<CaseResult> {
    let c = *case;
    let (dtype, t, h, i, e) = (c.dtype, c.tokens, c.hidden, c.intermediate, c.experts);
    let mut rng = Rng::new(c.seed ^ (t as u64) << 20);
    let x = rng.normal_vec(t * h, 1.0, dtype);
    let router = rng.normal_vec(e * h, 1.0 / (h as f64).sqrt(), dtype);
    let bias = c.bias.then(|| rng.normal_vec(e, 0.05, DType::F32));
    let (gate_t, gate_d) =
        expert_weights(device, dtype, c.layout, e, h, if c.packed { 2 * i } else { i }, 0, &mut rng)?;
    let (up_t, up_d) = if c.packed {
        (None, Vec::new())
    } else {
        let (t, d) = expert_weights(device, dtype, c.layout, e, h, i, 0, &mut rng)?;
        (Some(t), d)
    };
    let (down_t, down_d) = expert_weights(device, dtype, c.layout, e, i, h, 0, &mut rng)?;
    let si = c.shared;
    let sg = rng.normal_vec(si * h, 1.0 / (h as f64).sqrt(), dtype);
    let su = rng.normal_vec(si * h, 1.0 / (h as f64).sqrt(), dtype);
    let sd = rng.normal_vec(h * si, 1.0 / (si.max(1) as f64).sqrt(), dtype);
    let res = rng.normal_vec(t * h, 1.0, dtype);
    let tensor = |d: &[f64], shape: &[usize]| Tensor::from_f64(device, dtype, d, shape);
    let weights = MoeFfnWeights {
        router: tensor(&router, &[e, h])?,
        router_bias: bias.as_ref().map(|b| Tensor::from_f64(device, DType::F32, b, &[e])).transpose()?,
        layout: c.layout,
        gate_up: match up_t {
            None => GateUpTensors::Packed(gate_t),
            Some(up) => GateUpTensors::Separate { gate: gate_t, up },
        },
        down: down_t,
        shared: if si > 0 {
            Some(SharedExpertTensors {
                gate: tensor(&sg, &[si, h])?,
                up: tensor(&su, &[si, h])?,
                down: tensor(&sd, &[h, si])?,
            })
        } else {
            None
        },
    };
    let config = MoeFfnConfig {
        hidden: h,
        intermediate: i,
        experts: e,
        top_k: c.top_k,
        routing: c.routing,
        weights_on_input: c.weights_on_input,
    };
    let mut ffn = MoeFfn::plan(device, config, weights, t)?;
    let xt = tensor(&x, &[t, h])?;
    let out = if c.residual { tensor(&res, &[t, h])? } else { Tensor::poisoned(device, dtype, &[t, h])? };
    let millis = timed(device, || ffn.forward(&xt, c.residual.then_some(&out), &out))?;
    ffn.check_errors()?;
    let got = out.to_f64_vec()?;
    let stages = ffn.stages()?;
    let dev_logits = stages.logits.to_f64_vec()?;
    let host = HostFfnData {
        router: &router,
        bias: bias.as_deref(),
        gate: &gate_d,
        up: &up_d,
        down: &down_d,
        shared: (&sg, &su, &sd),
    };
    let (rw, spec) = reference_layer(case, &host);
    let residual = c.residual.then_some(&res[..]);
    // Stage 1: the router against the reference's own logits.
    let full = reference::moe_ffn(&x, t, &spec, &rw, residual, None, None)?;
    // The rest from the device's logits (rounded to the storage type), so that near-ties the
    // rounding may flip do not change the routing under comparison.
    let dev_ids: Vec<i32> = stages.ids.to_vec()?;
    let staged = reference::moe_ffn(&x, t, &spec, &rw, residual, Some(&dev_logits), Some(&dev_ids))?;
    let ids: Vec<f64> = dev_ids.iter().map(|&v| f64::from(v)).collect();
    let want_ids: Vec<f64> = staged.ids.iter().map(|&v| f64::from(v)).collect();
    let mut parts = vec![
        (compare(&dev_logits, &full.logits, moe_tolerance(dtype, &full.logits, 2.0)), vec![t, e]),
        (compare(&ids, &want_ids, exact()), vec![t, c.top_k]),
        (compare(&stages.weights.to_f64_vec()?, &staged.weights, ROUTE_WEIGHT_TOLERANCE), vec![t, c.top_k]),
        (compare(&got, &staged.out, moe_tolerance(dtype, &staged.out, 8.0)), vec![t, h]),
    ];
    if let (Some(s), Some(want)) = (&stages.shared, &staged.shared) {
        parts.push((compare(&s.to_f64_vec()?, want, moe_tolerance(dtype, want, 4.0)), vec![t, h]));
    }
    Ok(result("moe_ffn", dtype, ffn_label(case), parts, true, millis, vec![got]))
}

/// The host values of one case's layer weights, as the reference reads them.
struct HostFfnData<'a> {
    router: &'a [f64],
    bias: Option<&'a [f64]>,
    gate: &'a [f64],
    up: &'a [f64],
    down: &'a [f64],
    shared: (&'a [f64], &'a [f64], &'a [f64]),
}

/// The reference layer of a case: its weights (borrowing `host`) and its configuration.
fn reference_layer<'a>(
    case: &MoeFfnCase,
    host: &HostFfnData<'a>,
) -> (reference::FfnWeights<'a>, reference::MoeFfnConfig) {
    let c = *case;
    let (h, i, e, si) = (c.hidden, c.intermediate, c.experts, c.shared);
    let (gate_d, up_d, down_d) = (host.gate, host.up, host.down);
    let (sg, su, sd) = host.shared;
    let gm = reference::ExpertMatrix {
        data: gate_d,
        layout: c.layout,
        experts: e,
        k: h,
        n: if c.packed { 2 * i } else { i },
    };
    let um = reference::ExpertMatrix { data: up_d, layout: c.layout, experts: e, k: h, n: i };
    let dm = reference::ExpertMatrix { data: down_d, layout: c.layout, experts: e, k: i, n: h };
    let rw = reference::FfnWeights {
        router: host.router,
        router_bias: host.bias,
        gate: gm,
        up: (!c.packed).then_some(um),
        down: dm,
        shared: (si > 0).then_some((sg, su, sd)),
    };
    let spec = reference::MoeFfnConfig {
        hidden: h,
        intermediate: i,
        experts: e,
        top_k: c.top_k,
        routing: c.routing,
        weights_on_input: c.weights_on_input,
    };
    (rw, spec)
}

/// The `verify` row's shape text of a case.
fn ffn_label(case: &MoeFfnCase) -> String {
    let c = *case;
    let (t, h, i, e, si) = (c.tokens, c.hidden, c.intermediate, c.experts, c.shared);
    let name = match c.routing {
        MoeRouting::Llama4 => "llama4",
        MoeRouting::Softmax { .. } => "softmax",
        MoeRouting::Grouped { .. } => "grouped",
    };
    format!(
        "{t}x{h} I{i} E{e} k{} {name} {:?}{}{}",
        c.top_k,
        c.layout,
        if si > 0 { " +shared" } else { "" },
        if c.residual { " +res" } else { "" }
    )
}
