//! Reference decoder layers (the spec of `block::layer`): Llama 3 and Llama 4 layers in f64,
//! plain loops over the other references, no kernel code, every intermediate kept.
//!
//! Each stage is a public function of explicit inputs, so a check can feed it the device's own
//! input to that stage (a stage-local comparison), and [`forward`] chains them from the layer
//! input (an end-to-end comparison). Stage names, in order: `norm`, `qkv` (q, k, v packed per
//! token as `[tokens, q_heads + 2 kv_heads, head_dim]`, the fused projection's layout), `rope`
//! (q and k rotated, and qk-normed on Llama 4 RoPE layers; NoPE layers have no such stage),
//! `attention` (`[tokens, q_heads * head_dim]`), `o_proj`, `residual` (`x + o`), `post_norm`;
//! then dense: `gate_up` (`[tokens, 2 intermediate]`, gate columns first), `swiglu`; or MoE:
//! `router` (logits `[tokens, experts]`), `experts` (the routed sum), `shared` (the shared
//! expert), `combine` (their sum); and `output` (`residual + feed-forward`).
//!
//! Semantics: see the `llama_model::block` docs (Hugging Face's `LlamaDecoderLayer` and
//! `Llama4TextDecoderLayer`; the MoE is `Llama4TextMoe`: top-k of the logits, sigmoid of the
//! chosen logits, the weight scaling each chosen expert's input, plus the shared expert). No
//! intermediate is rounded here; that is the point of a reference.

use super::check_len;
use crate::error::{Error, Result};
use crate::spec::layer::{FfnSpec, LayerSpec};
use crate::spec::weights::{HostFfn, HostLayerWeights};

/// The f64 weights of one layer (Hugging Face layouts).
#[derive(Clone, Debug)]
pub struct RefLayer {
    /// What the layer is.
    pub spec: LayerSpec,
    input_norm: Vec<f64>,
    q: Vec<f64>,
    k: Vec<f64>,
    v: Vec<f64>,
    o: Vec<f64>,
    bias: Option<[Vec<f64>; 4]>,
    post_norm: Vec<f64>,
    ffn: RefFfn,
}

#[derive(Clone, Debug)]
enum RefFfn {
    Dense {
        gate: Vec<f64>,
        up: Vec<f64>,
        down: Vec<f64>,
        bias: Option<[Vec<f64>; 3]>,
    },
    Moe {
        router: Vec<f64>,
        gate_up: Vec<f64>,
        down: Vec<f64>,
        shared_gate: Vec<f64>,
        shared_up: Vec<f64>,
        shared_down: Vec<f64>,
    },
}

impl RefLayer {
    /// The f64 copy of `w`, after checking its shapes against `spec`.
    pub fn new(spec: LayerSpec, w: &HostLayerWeights) -> Result<RefLayer> {
        crate::spec::weights::check_shapes(&spec, w)?;
        let ffn = match &w.ffn {
            HostFfn::Dense { gate, up, down, bias } => RefFfn::Dense {
                gate: gate.f64(),
                up: up.f64(),
                down: down.f64(),
                bias: bias.as_ref().map(|[g, u, d]| [g.f64(), u.f64(), d.f64()]),
            },
            HostFfn::Moe { router, experts_gate_up, experts_down, shared_gate, shared_up, shared_down } => {
                RefFfn::Moe {
                    router: router.f64(),
                    gate_up: experts_gate_up.f64(),
                    down: experts_down.f64(),
                    shared_gate: shared_gate.f64(),
                    shared_up: shared_up.f64(),
                    shared_down: shared_down.f64(),
                }
            }
        };
        Ok(RefLayer {
            spec,
            input_norm: w.input_norm.f64(),
            q: w.q_proj.f64(),
            k: w.k_proj.f64(),
            v: w.v_proj.f64(),
            o: w.o_proj.f64(),
            bias: w.attn_bias.as_ref().map(|[q, k, v, o]| [q.f64(), k.f64(), v.f64(), o.f64()]),
            post_norm: w.post_norm.f64(),
            ffn,
        })
    }
}

/// A reference KV cache: per slot, the cached keys and values (`[len, kv_heads, head_dim]`).
#[derive(Clone, Debug, Default)]
pub struct RefCache {
    /// Per slot, its keys and values, each `[len, kv_heads, head_dim]` row-major.
    pub slots: Vec<(Vec<f64>, Vec<f64>)>,
}

impl RefCache {
    /// An empty cache of `slots` slots.
    pub fn new(slots: usize) -> RefCache {
        RefCache { slots: vec![(Vec::new(), Vec::new()); slots] }
    }
    /// Cached tokens of `slot`.
    pub fn len(&self, slot: usize, kv_row: usize) -> usize {
        self.slots.get(slot).map_or(0, |s| s.0.len() / kv_row.max(1))
    }
}

/// The intermediates of one reference forward, by stage name.
#[derive(Clone, Debug, Default)]
pub struct RefTrace {
    /// Each stage's name and values, in order (the names are in the module docs).
    pub stages: Vec<(&'static str, Vec<f64>)>,
}

impl RefTrace {
    /// The values of `stage`, or `None` when the forward had no such stage.
    pub fn get(&self, stage: &str) -> Option<&[f64]> {
        self.stages.iter().find(|(s, _)| *s == stage).map(|(_, v)| v.as_slice())
    }
}

fn err(what: &'static str, why: impl Into<String>) -> Error {
    Error::Reference { what, why: why.into() }
}

/// RMSNorm with the input (or post-attention) norm weight.
pub fn norm(layer: &RefLayer, x: &[f64], post: bool) -> Result<Vec<f64>> {
    let w = if post { &layer.post_norm } else { &layer.input_norm };
    super::rms_norm::rms_norm(x, w, layer.spec.hidden, f64::from(layer.spec.rms_norm_eps))
}

/// q, k and v projections of `x` (`[tokens, hidden]`), packed per token as
/// `[tokens, q_heads + 2 kv_heads, head_dim]`.
pub fn qkv(layer: &RefLayer, x: &[f64]) -> Result<Vec<f64>> {
    let s = &layer.spec;
    let (h, qd, kvd) = (s.hidden, s.q_heads * s.head_dim, s.kv_heads * s.head_dim);
    let b = layer.bias.as_ref();
    let q = super::linear::linear(x, &layer.q, b.map(|b| b[0].as_slice()), h, qd)?;
    let k = super::linear::linear(x, &layer.k, b.map(|b| b[1].as_slice()), h, kvd)?;
    let v = super::linear::linear(x, &layer.v, b.map(|b| b[2].as_slice()), h, kvd)?;
    let t = q.len() / qd.max(1);
    let mut out = Vec::with_capacity(t * (qd + 2 * kvd));
    for i in 0..t {
        out.extend_from_slice(&q[i * qd..(i + 1) * qd]);
        out.extend_from_slice(&k[i * kvd..(i + 1) * kvd]);
        out.extend_from_slice(&v[i * kvd..(i + 1) * kvd]);
    }
    Ok(out)
}

/// Splits a packed qkv buffer into (q `[t, qh, d]`, k `[t, kvh, d]`, v `[t, kvh, d]`).
pub fn split_qkv(spec: &LayerSpec, qkv: &[f64]) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let (qd, kvd) = (spec.q_heads * spec.head_dim, spec.kv_heads * spec.head_dim);
    let row = qd + 2 * kvd;
    let t = qkv.len() / row.max(1);
    check_len("qkv", qkv.len(), t * row)?;
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for r in qkv.chunks(row) {
        q.extend_from_slice(&r[..qd]);
        k.extend_from_slice(&r[qd..qd + kvd]);
        v.extend_from_slice(&r[qd + kvd..]);
    }
    Ok((q, k, v))
}

/// RoPE (and Llama 4's qk-norm) of the q and k parts of a packed qkv buffer; v is unchanged.
/// A NoPE layer returns its input.
pub fn rope(layer: &RefLayer, qkv: &[f64], positions: &[i64]) -> Result<Vec<f64>> {
    let s = &layer.spec;
    let Some(cfg) = &s.rope else { return Ok(qkv.to_vec()) };
    let (q, k, v) = split_qkv(s, qkv)?;
    let q = super::rope::rope(&q, s.q_heads, positions, cfg)?;
    let k = super::rope::rope(&k, s.kv_heads, positions, cfg)?;
    let (qd, kvd) = (s.q_heads * s.head_dim, s.kv_heads * s.head_dim);
    let mut out = Vec::with_capacity(qkv.len());
    for i in 0..positions.len() {
        out.extend_from_slice(&q[i * qd..(i + 1) * qd]);
        out.extend_from_slice(&k[i * kvd..(i + 1) * kvd]);
        out.extend_from_slice(&v[i * kvd..(i + 1) * kvd]);
    }
    Ok(out)
}

/// Attention of the step's queries (from the roped, packed `qkv`) over each sequence's cached
/// keys (`cache`, before this step) followed by its new keys. `seqs` lists `(slot, new tokens)`
/// in row order. Returns `[tokens, q_heads * head_dim]`.
pub fn attention(layer: &RefLayer, qkv: &[f64], cache: &RefCache, seqs: &[(usize, usize)]) -> Result<Vec<f64>> {
    let s = &layer.spec;
    let (q, k_new, v_new) = split_qkv(s, qkv)?;
    let kv_row = s.kv_heads * s.head_dim;
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    let (mut cu_q, mut cu_k) = (vec![0i32], vec![0i32]);
    let mut row = 0usize;
    for &(slot, new) in seqs {
        let (ck, cv) =
            cache.slots.get(slot).ok_or_else(|| err("attention", format!("slot {slot} not in the cache")))?;
        ks.extend_from_slice(ck);
        vs.extend_from_slice(cv);
        ks.extend_from_slice(&k_new[row * kv_row..(row + new) * kv_row]);
        vs.extend_from_slice(&v_new[row * kv_row..(row + new) * kv_row]);
        row += new;
        cu_q.push(row as i32);
        cu_k.push((ks.len() / kv_row) as i32);
    }
    let spec = super::attention::AttentionSpec {
        q_heads: s.q_heads,
        kv_heads: s.kv_heads,
        head_dim: s.head_dim,
        mask: s.mask,
        scale: 1.0 / (s.head_dim as f64).sqrt(),
        temperature: s.temperature,
    };
    Ok(super::attention::attention(&q, &ks, &vs, &cu_q, &cu_k, &spec)?.0)
}

/// The output projection of the attention output `[tokens, q_heads * head_dim]`.
pub fn o_proj(layer: &RefLayer, attn: &[f64]) -> Result<Vec<f64>> {
    let s = &layer.spec;
    super::linear::linear(
        attn,
        &layer.o,
        layer.bias.as_ref().map(|b| b[3].as_slice()),
        s.q_heads * s.head_dim,
        s.hidden,
    )
}

/// Element-wise sum (residual adds).
pub fn add(a: &[f64], b: &[f64]) -> Result<Vec<f64>> {
    check_len("residual", b.len(), a.len())?;
    Ok(a.iter().zip(b).map(|(x, y)| x + y).collect())
}

/// Dense MLP: `(gate_up [tokens, 2 intermediate], swiglu [tokens, intermediate], down
/// [tokens, hidden])`.
pub fn dense_mlp(layer: &RefLayer, x: &[f64]) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let RefFfn::Dense { gate, up, down, bias } = &layer.ffn else {
        return Err(err("dense_mlp", "an MoE layer"));
    };
    let h = layer.spec.hidden;
    let i = gate.len() / h;
    let g = super::linear::linear(x, gate, bias.as_ref().map(|b| b[0].as_slice()), h, i)?;
    let u = super::linear::linear(x, up, bias.as_ref().map(|b| b[1].as_slice()), h, i)?;
    let t = g.len() / i.max(1);
    let mut gate_up = Vec::with_capacity(2 * t * i);
    for r in 0..t {
        gate_up.extend_from_slice(&g[r * i..(r + 1) * i]);
        gate_up.extend_from_slice(&u[r * i..(r + 1) * i]);
    }
    let act = super::swiglu::swiglu(&g, &u)?;
    let out = super::linear::linear(&act, down, bias.as_ref().map(|b| b[2].as_slice()), i, h)?;
    Ok((gate_up, act, out))
}

/// The swiglu and down projection of a dense MLP from its packed gate/up `[tokens, 2I]`.
pub fn dense_down(layer: &RefLayer, gate_up: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    let RefFfn::Dense { down, bias, gate, .. } = &layer.ffn else {
        return Err(err("dense_down", "an MoE layer"));
    };
    let h = layer.spec.hidden;
    let i = gate.len() / h;
    let (mut g, mut u) = (Vec::new(), Vec::new());
    for r in gate_up.chunks(2 * i) {
        g.extend_from_slice(&r[..i]);
        u.extend_from_slice(&r[i..]);
    }
    let act = super::swiglu::swiglu(&g, &u)?;
    let out = super::linear::linear(&act, down, bias.as_ref().map(|b| b[2].as_slice()), i, h)?;
    Ok((act, out))
}

/// The down projection of a dense MLP from its activation `[tokens, intermediate]`.
pub fn dense_down_from_act(layer: &RefLayer, act: &[f64]) -> Result<Vec<f64>> {
    let RefFfn::Dense { down, bias, gate, .. } = &layer.ffn else {
        return Err(err("dense_down_from_act", "an MoE layer"));
    };
    let h = layer.spec.hidden;
    super::linear::linear(act, down, bias.as_ref().map(|b| b[2].as_slice()), gate.len() / h, h)
}

/// Top-k of one row of router logits: expert indices, larger logit first, ties to the lower
/// index.
pub fn top_k(logits: &[f64], k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..logits.len()).collect();
    idx.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// The MoE stages: (router logits, routed sum, shared expert, combined).
pub type MoeStages = (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>);

/// Llama 4's MoE (`Llama4TextMoe`): `(router logits [t, E], routed sum [t, H], shared expert
/// [t, H], combined [t, H])`.
///
/// For each token: the top-k experts of the logits; weight `w = sigmoid(logit)`; expert e
/// computes `down_e(silu(gate_e(w x)) * up_e(w x))` (the weight scales the expert's input), with
/// `gate_up_proj[e]` `[H, 2I]` used as `x @ W` (gate columns first) and `down_proj[e]` `[I, H]`;
/// the routed outputs are summed; the shared expert is a dense MLP of the same size.
pub fn moe(layer: &RefLayer, x: &[f64]) -> Result<MoeStages> {
    let (
        FfnSpec::Moe { experts: e, top_k: k, intermediate: i },
        RefFfn::Moe { router, gate_up, down, shared_gate, shared_up, shared_down },
    ) = (layer.spec.ffn, &layer.ffn)
    else {
        return Err(err("moe", "a dense layer"));
    };
    let h = layer.spec.hidden;
    let t = x.len() / h;
    check_len("x", x.len(), t * h)?;
    let logits = super::linear::linear(x, router, None, h, e)?;
    let mut routed = vec![0.0; t * h];
    for r in 0..t {
        let xr = &x[r * h..(r + 1) * h];
        for ex in top_k(&logits[r * e..(r + 1) * e], k) {
            let w = 1.0 / (1.0 + (-logits[r * e + ex]).exp());
            let xin: Vec<f64> = xr.iter().map(|v| v * w).collect();
            let gu = &gate_up[ex * h * 2 * i..(ex + 1) * h * 2 * i];
            let mut act = vec![0.0; i];
            for j in 0..i {
                let (mut g, mut u) = (0.0, 0.0);
                for c in 0..h {
                    g += xin[c] * gu[c * 2 * i + j];
                    u += xin[c] * gu[c * 2 * i + i + j];
                }
                act[j] = super::swiglu::silu(g) * u;
            }
            let dn = &down[ex * i * h..(ex + 1) * i * h];
            for c in 0..h {
                let mut acc = 0.0;
                for j in 0..i {
                    acc += act[j] * dn[j * h + c];
                }
                routed[r * h + c] += acc;
            }
        }
    }
    let g = super::linear::linear(x, shared_gate, None, h, i)?;
    let u = super::linear::linear(x, shared_up, None, h, i)?;
    let shared = super::linear::linear(&super::swiglu::swiglu(&g, &u)?, shared_down, None, i, h)?;
    let combined = add(&routed, &shared)?;
    Ok((logits, routed, shared, combined))
}

/// Appends a step's new keys and values (from the roped, packed `qkv`) to `cache`.
pub fn append(spec: &LayerSpec, cache: &mut RefCache, qkv: &[f64], seqs: &[(usize, usize)]) -> Result<()> {
    let (_, k, v) = split_qkv(spec, qkv)?;
    let kv_row = spec.kv_heads * spec.head_dim;
    let mut row = 0usize;
    for &(slot, new) in seqs {
        let entry = cache.slots.get_mut(slot).ok_or_else(|| err("append", format!("slot {slot} not in the cache")))?;
        entry.0.extend_from_slice(&k[row * kv_row..(row + new) * kv_row]);
        entry.1.extend_from_slice(&v[row * kv_row..(row + new) * kv_row]);
        row += new;
    }
    Ok(())
}

/// The positions of a step's tokens: each sequence continues after its cached tokens.
pub fn positions(spec: &LayerSpec, cache: &RefCache, seqs: &[(usize, usize)]) -> Vec<i64> {
    let kv_row = spec.kv_heads * spec.head_dim;
    seqs.iter()
        .flat_map(|&(slot, new)| {
            let start = cache.len(slot, kv_row);
            (start..start + new).map(|p| p as i64)
        })
        .collect()
}

/// One layer on a step: `x` `[tokens, hidden]` for the sequences `seqs` (`(slot, new tokens)`,
/// rows in that order). Returns every intermediate and appends the step's k/v to `cache`.
pub fn forward(layer: &RefLayer, cache: &mut RefCache, seqs: &[(usize, usize)], x: &[f64]) -> Result<RefTrace> {
    let s = &layer.spec;
    let tokens: usize = seqs.iter().map(|q| q.1).sum();
    check_len("x", x.len(), tokens * s.hidden)?;
    let mut tr = RefTrace::default();
    let pos = positions(s, cache, seqs);
    let normed = norm(layer, x, false)?;
    let packed = qkv(layer, &normed)?;
    let roped = rope(layer, &packed, &pos)?;
    let attn = attention(layer, &roped, cache, seqs)?;
    append(s, cache, &roped, seqs)?;
    let o = o_proj(layer, &attn)?;
    let residual = add(x, &o)?;
    let post = norm(layer, &residual, true)?;
    tr.stages.push(("norm", normed));
    tr.stages.push(("qkv", packed));
    if s.rope.is_some() {
        tr.stages.push(("rope", roped));
    }
    tr.stages.push(("attention", attn));
    tr.stages.push(("o_proj", o));
    match s.ffn {
        FfnSpec::Dense { .. } => {
            let (gate_up, act, down) = dense_mlp(layer, &post)?;
            let out = add(&residual, &down)?;
            tr.stages.push(("residual", residual));
            tr.stages.push(("post_norm", post));
            tr.stages.push(("gate_up", gate_up));
            tr.stages.push(("swiglu", act));
            tr.stages.push(("output", out));
        }
        FfnSpec::Moe { .. } => {
            let (logits, routed, shared, combined) = moe(layer, &post)?;
            let out = add(&residual, &combined)?;
            tr.stages.push(("residual", residual));
            tr.stages.push(("post_norm", post));
            tr.stages.push(("router", logits));
            tr.stages.push(("experts", routed));
            tr.stages.push(("shared", shared));
            tr.stages.push(("combine", combined));
            tr.stages.push(("output", out));
        }
    }
    Ok(tr)
}
