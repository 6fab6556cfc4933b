//! Layer verification: whole decoder layers on a device, checked stage by stage against
//! the f64 reference composer ([`llama_kernels::reference::block`]).
//!
//! For each layer, a schedule of steps runs through the composer with one cache: a varlen
//! prefill, a step mixing a decode, a chunked prefill after a cached prefix and a fresh
//! sequence, then decode steps. Every step is traced (every intermediate downloaded), and each
//! stage is compared two ways:
//!
//! * **stage-local**: the reference stage computed from the device's own input to that stage
//!   (the device's normed input for the QKV projection, its roped q/k/v and its cached K/V for
//!   attention, ...), so each stage is held to the tolerance of its op;
//! * **end to end**: the device's last stage against the reference chain run from the layer
//!   input alone (row `output e2e`), with a tolerance for the roundings the dtype adds on the way.
//!
//! Rows report the worst element over all steps. MoE layers report their router logits, chosen
//! experts (exactly), routing weights, shared expert and output; the stages after the router
//! follow the device's rounded logits, so a near-tie the rounding flips is not a failure, and
//! the end-to-end row leaves out the tokens whose experts differ from the chain's own routing
//! only by such a near-tie.

use std::time::Instant;

use llama_kernels::backend::Device;
use llama_kernels::dev::testing::{Comparison, Rng, Tolerance, compare, linear_tolerance};
use llama_kernels::dev::verify as vm;
use llama_kernels::dtype::DType;
use llama_kernels::spec::weights::{HostFfn, HostLayerWeights};

use crate::block::{DecoderLayer, KvCache, LayerWorkspace};
use crate::error::{Error, Result};
use crate::formats::Checkpoint;
use crate::formats::config::{FfnSpec, LayerSpec, ModelConfig};
use llama_kernels::ops::moe::{MoeRouting, WeightLayout};
use llama_kernels::ops::qlinear::{QPath, WeightValues};
use llama_kernels::reference::block as rb;
use llama_kernels::reference::moe as rm;
use llama_kernels::spec::quant::PackedWeight;
use llama_kernels::tensor::Tensor;

/// One row of the stage table.
#[derive(Clone, Debug)]
pub struct StageRow {
    /// `llama3 L0`, `llama4 L2`.
    pub model: String,
    /// The layer's description (`llama4 layer 2 (NoPE, dense)`).
    pub layer: String,
    pub stage: String,
    pub dtype: DType,
    /// The worst comparison over the steps; `None` for a skipped stage.
    pub comparison: Option<Comparison>,
    pub tolerance: Tolerance,
    pub pass: bool,
    /// Why a stage was skipped, or other context.
    pub note: String,
    pub millis: f64,
}

/// A layer's check: its rows, or the error that stopped it.
pub type BlockOutcome = std::result::Result<Vec<StageRow>, (String, crate::Error)>;

/// The built-in Llama 3 config: model-shaped (GQA 4/2, head_dim 64, Llama 3.1 RoPE scaling) but
/// small enough for the emulated target.
pub const LLAMA3_SMALL: &str = r#"{
  "model_type": "llama", "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,
  "head_dim": 64, "intermediate_size": 512, "num_hidden_layers": 1, "rms_norm_eps": 1e-5,
  "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
}"#;

/// The built-in Llama 4 config (multimodal form, text model nested): layer 0 RoPE + dense,
/// layer 1 RoPE + MoE, layer 2 NoPE + dense, layer 3 NoPE + MoE; chunked attention with chunk
/// 16 and temperature tuning with floor_scale 8, so both matter at verify's short lengths.
pub const LLAMA4_SMALL: &str = r#"{
  "model_type": "llama4",
  "text_config": {
    "model_type": "llama4_text", "hidden_size": 256, "num_attention_heads": 4,
    "num_key_value_heads": 2, "head_dim": 64, "intermediate_size": 256,
    "intermediate_size_mlp": 512, "num_hidden_layers": 4, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "rope_scaling": {"rope_type": "llama3", "factor": 16.0, "low_freq_factor": 1.0,
                     "high_freq_factor": 1.0, "original_max_position_embeddings": 8192},
    "no_rope_layers": [1, 1, 0, 0], "attention_chunk_size": 16, "use_qk_norm": true,
    "attn_temperature_tuning": true, "floor_scale": 8, "attn_scale": 0.1,
    "num_local_experts": 4, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2
  }
}"#;

/// The steps every layer runs: `(slot, new tokens)` per sequence. A varlen prefill; a decode
/// (slot 0), a chunked prefill after 17 cached tokens (slot 1) and a fresh prefill (slot 3);
/// then `decodes` decode steps of all four sequences.
pub fn schedule(decodes: usize) -> Vec<Vec<(usize, usize)>> {
    let mut v = vec![vec![(0, 9), (1, 17), (2, 5)], vec![(0, 1), (1, 12), (3, 7)]];
    for _ in 0..decodes {
        v.push(vec![(0, 1), (1, 1), (2, 1), (3, 1)]);
    }
    v
}

/// Cache slots and tokens per slot the schedule needs.
const SLOTS: usize = 4;

/// Tolerance of the end-to-end comparison: every stage's rounding to `dtype` propagated
/// through the layer, relative to the output's size.
pub fn e2e_tolerance(dtype: DType, rms: f64) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { atol: 2e-5 * rms.max(1.0), rtol: 2e-5 },
        _ => Tolerance { atol: 24.0 * dtype.unit_roundoff() * rms, rtol: 8.0 * dtype.unit_roundoff() },
    }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}
fn rms(v: &[f64]) -> f64 {
    (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

/// Accumulates the worst comparison of each stage over the steps.
#[derive(Default)]
struct Stages {
    rows: Vec<(String, Option<Comparison>, Tolerance, String)>,
}

impl Stages {
    fn add(&mut self, stage: &str, got: &[f64], expected: &[f64], tol: Tolerance) {
        let c = compare(got, expected, tol);
        match self.rows.iter_mut().find(|r| r.0 == stage) {
            Some(r) => {
                let keep_old = r.1.as_ref().is_some_and(|old| old.worst_ratio >= c.worst_ratio);
                let pass = r.1.as_ref().is_none_or(|o| o.pass) && c.pass;
                let (max_abs, max_rel) = r.1.as_ref().map_or((0.0, 0.0), |o| (o.max_abs, o.max_rel));
                if !keep_old {
                    r.1 = Some(c.clone());
                    r.2 = tol;
                }
                if let Some(o) = r.1.as_mut() {
                    o.pass = pass;
                    o.max_abs = o.max_abs.max(max_abs).max(c.max_abs);
                    o.max_rel = o.max_rel.max(max_rel).max(c.max_rel);
                }
            }
            None => self.rows.push((stage.to_string(), Some(c), tol, String::new())),
        }
    }
}

/// The reference layers of a schedule's steps: a packed projection's reference multiplies by the
/// values the device multiplies by at the step's row count ([`QPath::weight_values`]: exact,
/// rounded to the dtype, or NF4's rounded code book), so the tolerances compare roundings of the
/// same product. One [`rb::RefLayer`] per distinct choice.
#[derive(Default)]
pub(crate) struct StepReferences {
    layers: Vec<(Vec<WeightValues>, rb::RefLayer)>,
}

impl StepReferences {
    pub(crate) fn get(
        &mut self,
        spec: LayerSpec,
        host: &HostLayerWeights,
        dtype: DType,
        tokens: usize,
    ) -> Result<&rb::RefLayer> {
        let values = |p: &PackedWeight| step_values(p, dtype, tokens);
        let key: Vec<WeightValues> = host.packed.values().map(values).collect();
        let at = match self.layers.iter().position(|(k, _)| *k == key) {
            Some(i) => i,
            None => {
                let mut h = host.clone();
                for (name, t) in h.projections_mut(&spec) {
                    if let Some(p) = host.packed.get(&name) {
                        t.data = values(p).of(p, dtype).into_iter().map(|v| v as f32).collect();
                    }
                }
                self.layers.push((key, rb::RefLayer::new(spec, &h)?));
                self.layers.len() - 1
            }
        };
        Ok(&self.layers[at].1)
    }
}

/// The values of `p` the device multiplies by in a product of `tokens` rows of `dtype` (the
/// model's activations are 16-byte aligned).
pub(crate) fn step_values(p: &PackedWeight, dtype: DType, tokens: usize) -> WeightValues {
    let [n, k] = [p.layout().rows(), p.layout().cols()];
    QPath::choose(p.layout().format(), dtype, tokens, true, [n, k]).weight_values(p.layout().format())
}

/// Runs one layer through the schedule on `device` and compares every stage. `seed` picks the
/// inputs.
pub fn check_layer(
    device: &Device,
    dtype: DType,
    spec: LayerSpec,
    host: &HostLayerWeights,
    steps: &[Vec<(usize, usize)>],
    seed: u64,
) -> Result<Vec<StageRow>> {
    let started = Instant::now();
    let max_len = steps.iter().map(|s| s.iter().map(|x| x.1).max().unwrap_or(0)).sum::<usize>().max(1);
    let max_tokens = steps.iter().map(|s| s.iter().map(|x| x.1).sum::<usize>()).max().unwrap_or(1);
    let layer = DecoderLayer::new(device, dtype, spec, host)?;
    let mut cache = KvCache::for_layers(device, dtype, &[spec], SLOTS, max_len)?;
    let mut ws = LayerWorkspace::plan(device, dtype, &[spec], max_tokens, &cache)?;
    ws.plan_packed(&[&layer])?;
    let mut refs = StepReferences::default();
    let moe_weights = MoeRefWeights::new(&spec, host);
    let (mut e2e_cache, mut mirror) = (rb::RefCache::new(SLOTS), rb::RefCache::new(SLOTS));
    let mut rng = Rng::new(seed ^ (spec.index as u64) << 24);
    let mut st = Stages::default();
    let h = spec.hidden;
    let (qkv_w, o_w) =
        (wmax(&host.q_proj.data).max(wmax(&host.k_proj.data)).max(wmax(&host.v_proj.data)), wmax(&host.o_proj.data));
    let (rope_tol, attn_tol, round_tol) =
        (vm::rope_tolerance(dtype), vm::attention_tolerance(dtype), Tolerance::rounded_output(dtype));
    for batch in steps {
        let tokens: usize = batch.iter().map(|b| b.1).sum();
        let rl = refs.get(spec, host, dtype, tokens)?;
        let x = rng.normal_vec(tokens * h, 1.0, dtype);
        let step = ws.begin_step(&mut cache, batch)?;
        let hidden = Tensor::from_f64(device, dtype, &x, &[tokens, h])?;
        let tr = layer.forward_traced(&mut ws, &cache, 0, &step, &hidden)?;
        cache.commit(&step)?;
        let get = |stage: &str| trace_stage(&tr, stage);
        let pos = rb::positions(&spec, &mirror, batch);
        // Stage-local checks.
        let normed = get("norm")?;
        st.add("norm", normed, &rb::norm(rl, &x, false)?, round_tol);
        let qkv = get("qkv")?;
        st.add("qkv", qkv, &rb::qkv(rl, normed)?, linear_tolerance(dtype, h, max_abs(normed) * qkv_w));
        let roped = if spec.rope.is_some() {
            let r = get("rope")?;
            st.add("rope", r, &rb::rope(rl, qkv, &pos)?, rope_tol);
            r
        } else {
            qkv
        };
        let attn = get("attention")?;
        st.add("attention", attn, &rb::attention(rl, roped, &mirror, batch)?, attn_tol);
        rb::append(&spec, &mut mirror, roped, batch)?;
        let o = get("o_proj")?;
        let qd = spec.q_heads * spec.head_dim;
        st.add("o_proj", o, &rb::o_proj(rl, attn)?, linear_tolerance(dtype, qd, max_abs(attn) * o_w));
        let residual = get("residual")?;
        st.add("residual", residual, &rb::add(&x, o)?, round_tol);
        let post = get("post_norm")?;
        st.add("post_norm", post, &rb::norm(rl, residual, true)?, round_tol);
        // The end-to-end reference.
        let full = rb::forward(rl, &mut e2e_cache, batch, &x)?;
        match spec.ffn {
            FfnSpec::Dense { intermediate, .. } => {
                check_dense_ffn(
                    &mut st,
                    &FfnCheck { rl, host, dtype, hidden: h, post, residual, full: &full },
                    &tr,
                    intermediate,
                )?;
            }
            FfnSpec::Moe { .. } => {
                let moe_w = moe_weights.as_ref().ok_or_else(|| {
                    Error::from(llama_kernels::Error::Reference {
                        what: "verify",
                        why: "an MoE layer without MoE weights".into(),
                    })
                })?;
                check_moe_ffn(
                    &mut st,
                    &FfnCheck { rl, host, dtype, hidden: h, post, residual, full: &full },
                    &tr,
                    moe_w,
                    tokens,
                )?;
            }
        }
    }
    let millis = started.elapsed().as_secs_f64() * 1e3;
    let model = format!("{} L{}", spec.model.name(), spec.index);
    Ok(st
        .rows
        .into_iter()
        .map(|(stage, c, tol, note)| StageRow {
            model: model.clone(),
            layer: spec.describe(),
            stage,
            dtype,
            pass: c.as_ref().is_none_or(|c| c.pass),
            comparison: c,
            tolerance: tol,
            note,
            millis,
        })
        .collect())
}

/// The inputs every feed-forward check reads: the reference layer, the host weights, the
/// device's normed input and residual, and the end-to-end reference of the step.
struct FfnCheck<'a> {
    rl: &'a rb::RefLayer,
    host: &'a HostLayerWeights,
    dtype: DType,
    hidden: usize,
    post: &'a [f64],
    residual: &'a [f64],
    full: &'a rb::RefTrace,
}

/// A traced stage of the device forward, or a named error.
fn trace_stage<'t>(tr: &'t crate::block::Trace, stage: &str) -> Result<&'t [f64]> {
    tr.get(stage).ok_or_else(|| {
        Error::from(llama_kernels::Error::Reference { what: "verify", why: format!("device trace has no `{stage}`") })
    })
}

/// The largest magnitude of a weight.
fn wmax(w: &[f32]) -> f64 {
    w.iter().fold(0.0f64, |m, &x| m.max(f64::from(x).abs()))
}

/// The dense MLP stages: gate_up, swiglu, output, output e2e.
fn check_dense_ffn(st: &mut Stages, c: &FfnCheck<'_>, tr: &crate::block::Trace, intermediate: usize) -> Result<()> {
    let (dtype, post, residual, full) = (c.dtype, c.post, c.residual, c.full);
    let (h, round_tol) = (c.hidden, Tolerance::rounded_output(dtype));
    let get = |stage: &str| trace_stage(tr, stage);
    let gu = get("gate_up")?;
    let (gate_up_ref, _, _) = rb::dense_mlp(c.rl, post)?;
    let (g_w, d_w) = match &c.host.ffn {
        crate::block::HostFfn::Dense { gate, up, down, .. } => (wmax(&gate.data).max(wmax(&up.data)), wmax(&down.data)),
        crate::block::HostFfn::Moe { .. } => (0.0, 0.0),
    };
    st.add("gate_up", gu, &gate_up_ref, linear_tolerance(dtype, h, max_abs(post) * g_w));
    let act = get("swiglu")?;
    st.add("swiglu", act, &rb::dense_down(c.rl, gu)?.0, round_tol);
    let out = get("output")?;
    let down = rb::dense_down_from_act(c.rl, act)?;
    st.add("output", out, &rb::add(residual, &down)?, linear_tolerance(dtype, intermediate, max_abs(act) * d_w));
    let expected = full.get("output").unwrap_or(&[]);
    st.add("output e2e", out, expected, e2e_tolerance(dtype, rms(expected)));
    Ok(())
}

/// The MoE stages: router, routing (exact), route_weights, shared, output, output e2e.
fn check_moe_ffn(
    st: &mut Stages,
    c: &FfnCheck<'_>,
    tr: &crate::block::Trace,
    moe_w: &MoeRefWeights,
    tokens: usize,
) -> Result<()> {
    let (dtype, post, residual, full) = (c.dtype, c.post, c.residual, c.full);
    let get = |stage: &str| trace_stage(tr, stage);
    let (rspec, rw) = moe_w.reference();
    // The router against the reference's own logits; the later stages route the
    // device's logits (rounded to the dtype), so that a near-tie the rounding flips
    // does not change the experts under comparison.
    let logits = get("router")?;
    let own = rm::moe_ffn(post, tokens, &rspec, &rw, Some(residual), None, None)?;
    st.add("router", logits, &own.logits, vm::moe_tolerance(dtype, &own.logits, 2.0));
    let ids = get("routing")?;
    let dev_ids: Vec<i32> = ids.iter().map(|&v| v as i32).collect();
    let staged = rm::moe_ffn(post, tokens, &rspec, &rw, Some(residual), Some(logits), Some(&dev_ids))?;
    let want_ids: Vec<f64> = staged.ids.iter().map(|&v| f64::from(v)).collect();
    st.add("routing", ids, &want_ids, Tolerance { atol: 0.0, rtol: 0.0 });
    st.add("route_weights", get("route_weights")?, &staged.weights, vm::ROUTE_WEIGHT_TOLERANCE);
    if let Some(want) = &staged.shared {
        st.add("shared", get("shared")?, want, vm::moe_tolerance(dtype, want, 4.0));
    }
    let out = get("output")?;
    st.add("output", out, &staged.out, vm::moe_tolerance(dtype, &staged.out, 8.0));
    // The end-to-end chain routes its own logits, which carry every earlier stage's rounding: a
    // token whose experts differ from the device's only by a near-tie of those logits (within
    // the end-to-end tolerance) is left out of this row. The exact `routing` row above still
    // checks that token's experts against the device's own logits.
    let expected = full.get("output").unwrap_or(&[]);
    let chain_logits = full.get("router").unwrap_or(&[]);
    let lt = e2e_tolerance(dtype, rms(chain_logits));
    let (experts, k, routing, bias) = (rspec.experts, rspec.top_k, rspec.routing, rw.router_bias);
    let (strict, _) = rm::route(chain_logits, tokens, experts, k, routing, bias)?;
    let (near, _) = rm::route_allowing_near_ties(chain_logits, experts, k, routing, bias, &dev_ids, lt.rtol + lt.atol)?;
    let row = |t: usize| t * k..(t + 1) * k;
    let flipped: Vec<bool> =
        (0..tokens).map(|t| strict[row(t)] != dev_ids[row(t)] && near[row(t)] == dev_ids[row(t)]).collect();
    let width = out.len() / tokens.max(1);
    let kept = |v: &[f64]| -> Vec<f64> {
        v.chunks(width.max(1)).zip(&flipped).filter(|(_, f)| !**f).flat_map(|(r, _)| r.iter().copied()).collect()
    };
    st.add("output e2e", &kept(out), &kept(expected), e2e_tolerance(dtype, rms(expected)));
    Ok(())
}

/// An MoE layer's weights in f64, for [`rm::moe_ffn`] (Hugging Face Llama 4 layouts).
struct MoeRefWeights {
    spec: rm::MoeFfnConfig,
    router: Vec<f64>,
    gate_up: Vec<f64>,
    down: Vec<f64>,
    shared: [Vec<f64>; 3],
}

impl MoeRefWeights {
    fn new(spec: &LayerSpec, host: &HostLayerWeights) -> Option<MoeRefWeights> {
        let (
            FfnSpec::Moe { experts, top_k, intermediate },
            HostFfn::Moe { router, experts_gate_up, experts_down, shared_gate, shared_up, shared_down },
        ) = (spec.ffn, &host.ffn)
        else {
            return None;
        };
        let f = |t: &crate::block::HostTensor| t.data.iter().map(|&v| f64::from(v)).collect::<Vec<f64>>();
        Some(MoeRefWeights {
            spec: rm::MoeFfnConfig {
                hidden: spec.hidden,
                intermediate,
                experts,
                top_k,
                routing: MoeRouting::Llama4,
                weights_on_input: true,
            },
            router: f(router),
            gate_up: f(experts_gate_up),
            down: f(experts_down),
            shared: [f(shared_gate), f(shared_up), f(shared_down)],
        })
    }

    fn reference(&self) -> (rm::MoeFfnConfig, rm::FfnWeights<'_>) {
        let s = self.spec;
        let m = |data, k, n| rm::ExpertMatrix { data, layout: WeightLayout::InOut, experts: s.experts, k, n };
        (
            s,
            rm::FfnWeights {
                router: &self.router,
                router_bias: None,
                gate: m(&self.gate_up[..], s.hidden, 2 * s.intermediate),
                up: None,
                down: m(&self.down[..], s.intermediate, s.hidden),
                shared: Some((&self.shared[0][..], &self.shared[1][..], &self.shared[2][..])),
            },
        )
    }
}

/// The built-in layers `verify` checks: `(model config, layer index, dtype, NF4)`; with NF4 the
/// layer's projections are quantized at load (blocks of 64) and run packed.
pub fn builtin_layers(quick: bool) -> Vec<(&'static str, usize, DType, bool)> {
    let mut v = vec![
        (LLAMA3_SMALL, 0, DType::BF16, false),
        (LLAMA3_SMALL, 0, DType::F32, false),
        (LLAMA3_SMALL, 0, DType::BF16, true),
        (LLAMA4_SMALL, 0, DType::BF16, false),
        (LLAMA4_SMALL, 1, DType::BF16, false),
        (LLAMA4_SMALL, 2, DType::BF16, false),
        (LLAMA4_SMALL, 3, DType::BF16, false),
    ];
    if !quick {
        v.push((LLAMA3_SMALL, 0, DType::F16, false));
        v.push((LLAMA3_SMALL, 0, DType::F32, true));
        v.push((LLAMA4_SMALL, 0, DType::F32, false));
        v.push((LLAMA4_SMALL, 2, DType::F16, false));
    }
    v
}

/// Checks the built-in layers (random weights, seeded) on `device`.
pub fn run_blocks(device: &Device, quick: bool) -> Vec<BlockOutcome> {
    let steps = schedule(3);
    builtin_layers(quick)
        .into_iter()
        .map(|(json, index, dtype, nf4)| {
            let what = format!(
                "built-in {} layer {index} {dtype}{}",
                if json == LLAMA3_SMALL { "llama3" } else { "llama4" },
                if nf4 { " nf4" } else { "" }
            );
            let run = || -> Result<Vec<StageRow>> {
                let spec = ModelConfig::from_json(json)?.layer(index)?;
                let mut host = HostLayerWeights::random(&spec, dtype, 0x5eed);
                if nf4 {
                    host.quantize_nf4(&spec, 64, dtype)?;
                }
                let mut rows = check_layer(device, dtype, spec, &host, &steps, 7)?;
                if nf4 {
                    rows.iter_mut().for_each(|r| r.layer.push_str(", NF4 projections (packed, blocks of 64)"));
                }
                Ok(rows)
            };
            run().map_err(|e| (what, e))
        })
        .collect()
}

/// Checks layers `layers` of the checkpoint in `dir` (all layers when empty) in `dtype`.
pub fn run_checkpoint(device: &Device, dir: &std::path::Path, layers: &[usize], dtype: DType) -> Vec<BlockOutcome> {
    let ckpt = match Checkpoint::open(dir) {
        Ok(c) => c,
        Err(e) => return vec![Err((format!("checkpoint {}", dir.display()), e))],
    };
    let all: Vec<usize> = if layers.is_empty() { (0..ckpt.config().num_layers()).collect() } else { layers.to_vec() };
    let steps = schedule(2);
    all.into_iter()
        .map(|index| {
            let run = || -> Result<Vec<StageRow>> {
                let (spec, host) = ckpt.layer(index, dtype)?;
                check_layer(device, dtype, spec, &host, &steps, 7)
            };
            run().map_err(|e| (format!("checkpoint layer {index}"), e))
        })
        .collect()
}

/// Formats the stage table.
pub fn stage_table(outcomes: &[BlockOutcome]) -> String {
    let mut s = format!(
        "{:<10} {:<14} {:<5} {:>11} {:>11} {:>19} {:>6}\n",
        "model", "stage", "dtype", "max abs", "max rel", "tolerance (a, r)", "result"
    );
    for o in outcomes {
        match o {
            Ok(rows) => {
                if let Some(first) = rows.first() {
                    s.push_str(&format!("# {} ({:.0} ms)\n", first.layer, first.millis));
                }
                for r in rows {
                    match &r.comparison {
                        Some(c) => s.push_str(&format!(
                            "{:<10} {:<14} {:<5} {:>11.3e} {:>11.3e} {:>9.1e},{:>9.1e} {:>6}\n",
                            r.model,
                            r.stage,
                            r.dtype.name(),
                            c.max_abs,
                            c.max_rel,
                            r.tolerance.atol,
                            r.tolerance.rtol,
                            if r.pass { "pass" } else { "FAIL" }
                        )),
                        None => {
                            s.push_str(&format!("{:<10} {:<14} {:<5} {}\n", r.model, r.stage, r.dtype.name(), r.note))
                        }
                    }
                }
            }
            Err((what, e)) => s.push_str(&format!("ERROR {what}: {e}\n")),
        }
    }
    s
}

/// Failures of the stage table, described.
pub fn failures(outcomes: &[BlockOutcome]) -> Vec<String> {
    let mut v = Vec::new();
    for o in outcomes {
        match o {
            Ok(rows) => {
                for r in rows.iter().filter(|r| !r.pass) {
                    let detail = r.comparison.as_ref().map_or(String::new(), |c| c.describe(&[c.count]));
                    v.push(format!("{} {} {}: {detail}", r.model, r.stage, r.dtype));
                }
            }
            Err((what, e)) => v.push(format!("{what}: {e}")),
        }
    }
    v
}

/// Rows checked and rows passed (skipped rows count as neither).
pub fn counts(outcomes: &[BlockOutcome]) -> (usize, usize) {
    let mut total = 0;
    let mut passed = 0;
    for o in outcomes {
        match o {
            Ok(rows) => {
                for r in rows.iter().filter(|r| r.comparison.is_some()) {
                    total += 1;
                    passed += usize::from(r.pass);
                }
            }
            Err(_) => total += 1,
        }
    }
    (total, passed)
}
