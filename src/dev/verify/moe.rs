//! MoE cases: each stage (route, align, gather, grouped GEMM, combine) and the whole layer,
//! against the f64 reference in `reference::moe`.

use std::time::Instant;

use super::common::{CaseResult, Outcome, rows_tensor, worst_of};
use crate::backend::Device;
use crate::dtype::{DType, round_to};
use crate::error::Result;
use crate::block::moe_ffn::{GateUpTensors, MoeFfn, MoeFfnWeights, SharedExpertTensors};
use crate::ops::moe::{
    ExpertWeights, GemmGroups, MoeAlign, MoeFfnConfig, MoeRouting,
    WeightLayout, moe_combine, moe_gather, moe_grouped_gemm, moe_route,
};
use crate::reference::moe as reference;
use crate::tensor::Tensor;
use crate::dev::testing::{Comparison, Rng, Tolerance, compare};

/// Compares with NaN == NaN (routing weights of all-NaN rows are NaN by specification).
fn compare_nan_aware(got: &[f64], expected: &[f64], tol: Tolerance) -> Comparison {
    let both = |i: usize| got.get(i).is_some_and(|g| g.is_nan()) && expected[i].is_nan();
    let e: Vec<f64> = (0..expected.len()).map(|i| if both(i) { 0.0 } else { expected[i] }).collect();
    let g: Vec<f64> = (0..got.len()).map(|i| if i < expected.len() && both(i) { 0.0 } else { got[i] }).collect();
    compare(&g, &e, tol)
}

fn exact() -> Tolerance {
    Tolerance { atol: 0.0, rtol: 0.0 }
}

fn rms(v: &[f64]) -> f64 {
    let f: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    (f.iter().map(|x| x * x).sum::<f64>() / f.len().max(1) as f64).sqrt()
}

/// Tolerance for outputs rounded once to `dtype` from f32 sums (GEMMs, combine): `units` units of
/// roundoff relative to each element, and the same relative to the output's RMS absolutely (sums
/// cancel, so small elements carry the large ones' error).
pub fn moe_tolerance(dtype: DType, expected: &[f64], units: f64) -> Tolerance {
    let u = match dtype {
        DType::F32 => 1e-5,
        _ => dtype.unit_roundoff(),
    };
    Tolerance { atol: units * u * rms(expected).max(1e-30), rtol: units * u }
}

/// Relative difference of two routing keys below which f32 may order them either way.
pub const NEAR_TIE: f64 = 1e-6;

/// Routing weights: f32 math with expf against f64.
pub const ROUTE_WEIGHT_TOLERANCE: Tolerance = Tolerance { atol: 1e-6, rtol: 1e-5 };

fn result(
    op: &str,
    dtype: DType,
    shape: String,
    parts: Vec<(Comparison, Vec<usize>)>,
    gaps: bool,
    millis: f64,
    outputs: Vec<Vec<f64>>,
) -> CaseResult {
    let (comparison, worst_shape) = worst_of(parts);
    CaseResult {
        op: op.into(),
        dtype,
        shape,
        pass: comparison.pass && gaps,
        comparison,
        worst_shape,
        gaps_untouched: gaps,
        millis,
        outputs,
    }
}

fn timed(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}

// ------------------------------------------------------------------------------------ route

/// What the router logits look like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitPattern {
    /// Seeded normal values.
    Random,
    /// Values on a coarse grid: many exact ties.
    Ties,
    /// Random with NaNs: about a fifth of all logits, one all-NaN row and one row with a single
    /// non-NaN logit.
    NaN,
}

/// A routing case.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeRouteCase {
    pub dtype: DType,
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub routing: MoeRouting,
    /// Grouped routing: a random selection bias.
    pub bias: bool,
    pub logits: LogitPattern,
    /// Extra elements between logit rows.
    pub pad: usize,
    pub seed: u64,
}

impl MoeRouteCase {
    pub fn new(dtype: DType, tokens: usize, experts: usize, top_k: usize, routing: MoeRouting) -> Self {
        MoeRouteCase {
            dtype,
            tokens,
            experts,
            top_k,
            routing,
            bias: false,
            logits: LogitPattern::Random,
            pad: 0,
            seed: 5,
        }
    }
}

fn route_logits(case: &MoeRouteCase, rng: &mut Rng) -> Vec<f64> {
    let (t, e) = (case.tokens, case.experts);
    let mut l = rng.normal_vec(t * e, 1.5, case.dtype);
    match case.logits {
        LogitPattern::Random => {}
        LogitPattern::Ties => l.iter_mut().for_each(|v| *v = (*v * 2.0).round() / 2.0),
        LogitPattern::NaN => {
            for v in l.iter_mut() {
                if rng.below(5) == 0 {
                    *v = f64::NAN;
                }
            }
            if t >= 1 {
                l[..e].iter_mut().for_each(|v| *v = f64::NAN); // all NaN
            }
            if t >= 2 {
                let keep = rng.below(e as u64) as usize;
                for (i, v) in l[e..2 * e].iter_mut().enumerate() {
                    if i != keep {
                        *v = f64::NAN;
                    }
                }
            }
        }
    }
    l
}

pub fn moe_route_case(device: &Device, case: &MoeRouteCase) -> Result<CaseResult> {
    let MoeRouteCase { dtype, tokens, experts, top_k, routing, bias, pad, seed, .. } = *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 16 ^ (experts as u64) << 32 ^ (top_k as u64) << 48);
    let logits = route_logits(case, &mut rng);
    let bias_v: Option<Vec<f64>> = bias.then(|| {
        let mut b = rng.normal_vec(experts, 0.05, DType::F32);
        if case.logits == LogitPattern::Ties {
            b.iter_mut().for_each(|v| *v = (*v * 64.0).round() / 64.0);
        }
        b
    });
    let (lt, _lfull) = rows_tensor(device, dtype, &logits, tokens, experts, pad)?;
    let bt = bias_v.as_ref().map(|b| Tensor::from_f64(device, DType::F32, b, &[experts])).transpose()?;
    let ids = Tensor::poisoned(device, DType::I32, &[tokens, top_k])?;
    let weights = Tensor::poisoned(device, DType::F32, &[tokens, top_k])?;
    let millis = timed(device, || moe_route(&lt, bt.as_ref(), routing, &ids, &weights))?;
    let (gid, gw) = (ids.to_f64_vec()?, weights.to_f64_vec()?);
    let dev_ids: Vec<i32> = ids.to_vec()?;
    // Keys are f32 on the device: two experts whose f64 keys differ by less than f32 resolution
    // may come in either order (exact ties may not).
    let (rid, rw) =
        reference::route_allowing_near_ties(&logits, experts, top_k, routing, bias_v.as_deref(), &dev_ids, NEAR_TIE)?;
    let rid: Vec<f64> = rid.iter().map(|&i| f64::from(i)).collect();
    let shape = vec![tokens, top_k];
    let parts = vec![
        (compare(&gid, &rid, exact()), shape.clone()),
        (compare_nan_aware(&gw, &rw, ROUTE_WEIGHT_TOLERANCE), shape),
    ];
    let name = match routing {
        MoeRouting::Llama4 => "llama4".to_string(),
        MoeRouting::Softmax { renormalize } => format!("softmax{}", if renormalize { "+renorm" } else { "" }),
        MoeRouting::Grouped { n_group, topk_group, .. } => format!("grouped {topk_group}/{n_group}"),
    };
    let pattern = match case.logits {
        LogitPattern::Random => "",
        LogitPattern::Ties => " ties",
        LogitPattern::NaN => " nan",
    };
    Ok(result(
        "moe_route",
        dtype,
        format!("{tokens}x{experts} k{top_k} {name}{pattern}{}", if bias { " +bias" } else { "" }),
        parts,
        true,
        millis,
        vec![gid, gw],
    ))
}

// ------------------------------------------------------------------------------------ align

/// How expert ids are drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdPattern {
    /// k distinct random experts per token.
    Random,
    /// Like `Random`, but only from the odd experts: the even ones get no tokens.
    Sparse,
    /// Every slot on expert 1 (duplicates within a token when k > 1).
    OneExpert,
    /// Random, with about a tenth of the ids outside `[0, experts)` (dropped, and flagged).
    Invalid,
}

pub fn expert_ids(tokens: usize, experts: usize, top_k: usize, pattern: IdPattern, rng: &mut Rng) -> Vec<i32> {
    let mut ids = Vec::with_capacity(tokens * top_k);
    let pool: Vec<usize> = match pattern {
        IdPattern::Sparse if experts >= 2 * top_k => (0..experts).filter(|e| e % 2 == 1).collect(),
        _ => (0..experts).collect(),
    };
    for _ in 0..tokens {
        let mut chosen: Vec<usize> = Vec::with_capacity(top_k);
        while chosen.len() < top_k {
            let e = match pattern {
                IdPattern::OneExpert => 1.min(experts - 1),
                _ => pool[rng.below(pool.len() as u64) as usize],
            };
            if pattern == IdPattern::OneExpert || !chosen.contains(&e) {
                chosen.push(e);
            }
        }
        for e in chosen {
            let id = if pattern == IdPattern::Invalid && rng.below(10) == 0 {
                if rng.below(2) == 0 { -1 } else { experts as i32 }
            } else {
                e as i32
            };
            ids.push(id);
        }
    }
    ids
}

/// An alignment case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeAlignCase {
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub block_m: usize,
    pub ids: IdPattern,
    pub seed: u64,
}

pub fn moe_align_case(device: &Device, case: &MoeAlignCase) -> Result<CaseResult> {
    let MoeAlignCase { tokens, experts, top_k, block_m, ids: pattern, seed } = *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (experts as u64) << 40);
    let ids = expert_ids(tokens, experts, top_k, pattern, &mut rng);
    let it = Tensor::from_slice(device, &ids, &[tokens, top_k])?;
    let mut a = MoeAlign::plan(device, experts, tokens * top_k)?;
    let millis = timed(device, || a.align(&it, block_m))?;
    let r = reference::align(&ids, experts, block_m);
    let as_f64 = |v: &[i32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<f64>>();
    let got = [a.counts()?.to_f64_vec()?, a.offsets()?.to_f64_vec()?, a.rows()?.to_f64_vec()?, {
        let be = a.block_expert()?.to_f64_vec()?;
        be[..r.block_expert.len().min(be.len())].to_vec()
    }];
    let want = [as_f64(&r.counts), as_f64(&r.offsets), as_f64(&r.rows), as_f64(&r.block_expert)];
    let parts = got.iter().zip(&want).map(|(g, w)| (compare(g, w, exact()), vec![w.len()])).collect();
    // Invalid ids must raise the flag, valid ones must not.
    let flag_ok = a.check_errors().is_err() == ids.iter().any(|&i| i < 0 || i as usize >= experts);
    Ok(result(
        "moe_align",
        DType::I32,
        format!("{tokens}x{experts} k{top_k} m{block_m} {pattern:?}"),
        parts,
        flag_ok,
        millis,
        got.to_vec(),
    ))
}

// ------------------------------------------------------------------------------------ gather

/// A gather case: random routing, optional scaling by the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeGatherCase {
    pub dtype: DType,
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub scaled: bool,
    pub seed: u64,
}

pub fn moe_gather_case(device: &Device, case: &MoeGatherCase) -> Result<CaseResult> {
    let MoeGatherCase { dtype, tokens, experts, top_k, hidden, scaled, seed } = *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (hidden as u64) << 40);
    let ids = expert_ids(tokens, experts, top_k, IdPattern::Random, &mut rng);
    let x = rng.normal_vec(tokens * hidden, 1.0, dtype);
    let w = rng.uniform_vec(tokens * top_k, 0.1, 1.0, DType::F32);
    let block_m = crate::ops::moe::preferred_block_m(tokens * top_k, experts);
    let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m);
    let xt = Tensor::from_f64(device, dtype, &x, &[tokens, hidden])?;
    let wt = Tensor::from_f64(device, DType::F32, &w, &[tokens, top_k])?;
    let it = Tensor::from_slice(device, &ids, &[tokens, top_k])?;
    let out = Tensor::poisoned(device, dtype, &[rows, hidden])?;
    let mut a = MoeAlign::plan(device, experts, tokens * top_k)?;
    a.align(&it, block_m)?;
    let millis = timed(device, || moe_gather(&xt, &a, scaled.then_some(&wt), &out))?;
    let r = reference::align(&ids, experts, block_m);
    let expected = reference::gather(&x, hidden, top_k, &r, scaled.then_some(&w[..]))?;
    let got = out.to_f64_vec()?;
    // Padding rows (NaN in the reference) must keep their poison; the others must match.
    let valid: Vec<usize> = (0..r.total() * hidden).filter(|&i| !expected[i].is_nan()).collect();
    let g: Vec<f64> = valid.iter().map(|&i| got[i]).collect();
    let e: Vec<f64> = valid.iter().map(|&i| round_to(dtype, expected[i])).collect();
    let gaps = (0..got.len()).filter(|&i| i >= expected.len() || expected[i].is_nan()).all(|i| got[i].is_nan());
    let parts = vec![(compare(&g, &e, Tolerance::rounded_output(dtype)), vec![g.len()])];
    Ok(result(
        "moe_gather",
        dtype,
        format!("{tokens}x{hidden} E{experts} k{top_k}{}", if scaled { " scaled" } else { "" }),
        parts,
        gaps,
        millis,
        vec![got],
    ))
}

// ------------------------------------------------------------------------------------ grouped GEMM

/// The weights of a GEMM case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmWeights {
    Plain,
    SwiGluPacked,
    SwiGluSeparate,
}

/// A grouped GEMM case: rows from a random alignment (or one dense group).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeGemmCase {
    pub dtype: DType,
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    /// Input columns.
    pub k: usize,
    /// Output columns (SwiGLU: of each of gate and up).
    pub n: usize,
    pub layout: WeightLayout,
    pub weights: GemmWeights,
    /// 16 or 64 (grouped).
    pub block_m: usize,
    pub ids: IdPattern,
    /// One group of `tokens` rows with `W[0]`.
    pub dense: bool,
    /// Extra elements between the rows of x and y, and between weight rows.
    pub pad: usize,
    pub seed: u64,
}

impl MoeGemmCase {
    pub fn new(dtype: DType, tokens: usize, experts: usize, top_k: usize, k: usize, n: usize) -> Self {
        MoeGemmCase {
            dtype,
            tokens,
            experts,
            top_k,
            k,
            n,
            layout: WeightLayout::InOut,
            weights: GemmWeights::Plain,
            block_m: 64,
            ids: IdPattern::Random,
            dense: false,
            pad: 0,
            seed: 11,
        }
    }
}

/// Stacked random weights with `out` outputs per expert in `layout`, optionally padded rows;
/// returns (the view, the contiguous f64 values).
#[allow(clippy::too_many_arguments)]
fn expert_weights(
    device: &Device,
    dtype: DType,
    layout: WeightLayout,
    experts: usize,
    inp: usize,
    out: usize,
    pad: usize,
    rng: &mut Rng,
) -> Result<(Tensor, Vec<f64>)> {
    let data = rng.normal_vec(experts * inp * out, 1.0 / (inp as f64).sqrt(), dtype);
    let (a, b) = match layout {
        WeightLayout::InOut => (inp, out),
        WeightLayout::OutIn => (out, inp),
    };
    let full = Tensor::poisoned(device, dtype, &[experts, a, b + pad])?;
    let view = full.narrow(2, 0, b)?;
    view.copy_from_f64(&data)?;
    Ok((view, data))
}

pub fn moe_gemm_case(device: &Device, case: &MoeGemmCase) -> Result<CaseResult> {
    let MoeGemmCase { dtype, tokens, experts, top_k, k, n, layout, weights, block_m, ids: pattern, dense, pad, seed } =
        *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 12 ^ (k as u64) << 28 ^ (n as u64) << 44);
    let (rows, row_experts, align) = if dense {
        (tokens, vec![Some(0); tokens], None)
    } else {
        let ids = expert_ids(tokens, experts, top_k, pattern, &mut rng);
        let it = Tensor::from_slice(device, &ids, &[tokens, top_k])?;
        let mut a = MoeAlign::plan(device, experts, tokens * top_k)?;
        a.align(&it, block_m)?;
        let r = reference::align(&ids, experts, block_m);
        let mut re = r.row_experts();
        let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m);
        re.resize(rows, None);
        (rows, re, Some(a))
    };
    let w_experts = if dense { 1 } else { experts };
    let x = rng.normal_vec(rows * k, 1.0, dtype);
    let (xt, _xfull) = rows_tensor(device, dtype, &x, rows, k, pad)?;
    let yfull = Tensor::poisoned(device, dtype, &[rows, n + pad])?;
    let yt = yfull.narrow(1, 0, n)?;
    let out_cols = if weights == GemmWeights::SwiGluPacked { 2 * n } else { n };
    let (wt, wd) = expert_weights(device, dtype, layout, w_experts, k, out_cols, pad, &mut rng)?;
    let (ut, ud) = if weights == GemmWeights::SwiGluSeparate {
        let (t, d) = expert_weights(device, dtype, layout, w_experts, k, n, pad, &mut rng)?;
        (Some(t), d)
    } else {
        (None, Vec::new())
    };
    let groups = match &align {
        Some(a) => GemmGroups::Experts(a),
        None => GemmGroups::Dense,
    };
    let tw = match (weights, &ut) {
        (GemmWeights::SwiGluSeparate, Some(u)) => ExpertWeights::SwiGluSeparate { gate: &wt, up: u },
        (GemmWeights::SwiGluPacked, _) => ExpertWeights::SwiGluPacked(&wt),
        _ => ExpertWeights::Plain(&wt),
    };
    let millis = timed(device, || moe_grouped_gemm(&xt, layout, tw, groups, &yt))?;
    let wm = reference::ExpertMatrix { data: &wd, layout, experts: w_experts, k, n: out_cols };
    let um = reference::ExpertMatrix { data: &ud, layout, experts: w_experts, k, n };
    let expected = match weights {
        GemmWeights::Plain => reference::expert_matmul(&x, &row_experts, &wm, 0..n)?,
        GemmWeights::SwiGluPacked => reference::expert_swiglu(&x, &row_experts, (&wm, 0..n), (&wm, n..2 * n))?,
        GemmWeights::SwiGluSeparate => reference::expert_swiglu(&x, &row_experts, (&wm, 0..n), (&um, 0..n))?,
    };
    let got = yt.to_f64_vec()?;
    let valid: Vec<usize> = (0..expected.len()).filter(|&i| !expected[i].is_nan()).collect();
    let g: Vec<f64> = valid.iter().map(|&i| got[i]).collect();
    let e: Vec<f64> = valid.iter().map(|&i| expected[i]).collect();
    // Padding rows and the gaps between rows keep their poison.
    let yall = yfull.to_f64_vec()?;
    let gaps = yall.iter().enumerate().all(|(i, v)| {
        let (r, c) = (i / (n + pad), i % (n + pad));
        (c < n && !expected[r * n + c].is_nan()) || v.is_nan()
    });
    let parts = vec![(compare(&g, &e, moe_tolerance(dtype, &e, 2.0)), vec![g.len()])];
    let form = match weights {
        GemmWeights::Plain => "plain",
        GemmWeights::SwiGluPacked => "swiglu",
        GemmWeights::SwiGluSeparate => "swiglu-sep",
    };
    let pattern = if pattern == IdPattern::Random { String::new() } else { format!(" {pattern:?}") };
    let groups = if dense { "dense".to_string() } else { format!("E{experts} k{top_k} m{block_m}{pattern}") };
    Ok(result(
        "moe_grouped_gemm",
        dtype,
        format!("{tokens}t {k}->{n} {layout:?} {form} {groups}{}", if pad > 0 { " strided" } else { "" }),
        parts,
        gaps,
        millis,
        vec![got],
    ))
}

// ------------------------------------------------------------------------------------ combine

/// A combine case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MoeCombineCase {
    pub dtype: DType,
    pub tokens: usize,
    pub experts: usize,
    pub top_k: usize,
    pub hidden: usize,
    pub weighted: bool,
    pub shared: bool,
    /// 0: none; 1: a separate residual; 2: in place (out holds the residual).
    pub residual: u8,
    pub seed: u64,
}

pub fn moe_combine_case(device: &Device, case: &MoeCombineCase) -> Result<CaseResult> {
    let MoeCombineCase { dtype, tokens, experts, top_k, hidden, weighted, shared, residual, seed } = *case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (hidden as u64) << 40);
    let ids = expert_ids(tokens, experts, top_k, IdPattern::Random, &mut rng);
    let block_m = crate::ops::moe::preferred_block_m(tokens * top_k, experts);
    let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m);
    let it = Tensor::from_slice(device, &ids, &[tokens, top_k])?;
    let mut a = MoeAlign::plan(device, experts, tokens * top_k)?;
    a.align(&it, block_m)?;
    let r = reference::align(&ids, experts, block_m);
    // y: random on used rows, NaN on padding (combine must not read it).
    let used: Vec<bool> = r.row_experts().iter().map(Option::is_some).collect();
    let y: Vec<f64> = (0..rows * hidden)
        .map(|i| if used.get(i / hidden).copied().unwrap_or(false) { round_to(dtype, rng.normal()) } else { f64::NAN })
        .collect();
    let w = rng.uniform_vec(tokens * top_k, 0.0, 1.0, DType::F32);
    let s = rng.normal_vec(tokens * hidden, 1.0, dtype);
    let res = rng.normal_vec(tokens * hidden, 1.0, dtype);
    let yt = Tensor::from_f64(device, dtype, &y, &[rows, hidden])?;
    let wt = Tensor::from_f64(device, DType::F32, &w, &[tokens, top_k])?;
    let st = Tensor::from_f64(device, dtype, &s, &[tokens, hidden])?;
    let rt = Tensor::from_f64(device, dtype, &res, &[tokens, hidden])?;
    let out = if residual == 2 { rt.clone() } else { Tensor::poisoned(device, dtype, &[tokens, hidden])? };
    let rarg = match residual {
        0 => None,
        1 => Some(&rt),
        _ => Some(&out),
    };
    let millis = timed(device, || moe_combine(&yt, &a, weighted.then_some(&wt), shared.then_some(&st), rarg, &out))?;
    let expected = reference::combine(
        &y,
        hidden,
        &r.rows,
        top_k,
        weighted.then_some(&w[..]),
        shared.then_some(&s[..]),
        (residual > 0).then_some(&res[..]),
    )?;
    let got = out.to_f64_vec()?;
    let parts = vec![(compare(&got, &expected, moe_tolerance(dtype, &expected, 2.0)), vec![tokens, hidden])];
    Ok(result(
        "moe_combine",
        dtype,
        format!(
            "{tokens}x{hidden} E{experts} k{top_k}{}{}{}",
            if weighted { " weighted" } else { "" },
            if shared { " +shared" } else { "" },
            ["", " +residual", " in-place"][residual.min(2) as usize]
        ),
        parts,
        true,
        millis,
        vec![got],
    ))
}

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
    let gm = reference::ExpertMatrix {
        data: &gate_d,
        layout: c.layout,
        experts: e,
        k: h,
        n: if c.packed { 2 * i } else { i },
    };
    let um = reference::ExpertMatrix { data: &up_d, layout: c.layout, experts: e, k: h, n: i };
    let dm = reference::ExpertMatrix { data: &down_d, layout: c.layout, experts: e, k: i, n: h };
    let rw = reference::FfnWeights {
        router: &router,
        router_bias: bias.as_deref(),
        gate: gm,
        up: (!c.packed).then_some(um),
        down: dm,
        shared: (si > 0).then_some((&sg[..], &su[..], &sd[..])),
    };
    let spec = reference::MoeFfnConfig {
        hidden: h,
        intermediate: i,
        experts: e,
        top_k: c.top_k,
        routing: c.routing,
        weights_on_input: c.weights_on_input,
    };
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
    let name = match c.routing {
        MoeRouting::Llama4 => "llama4",
        MoeRouting::Softmax { .. } => "softmax",
        MoeRouting::Grouped { .. } => "grouped",
    };
    Ok(result(
        "moe_ffn",
        dtype,
        format!(
            "{t}x{h} I{i} E{e} k{} {name} {:?}{}{}",
            c.top_k,
            c.layout,
            if si > 0 { " +shared" } else { "" },
            if c.residual { " +res" } else { "" }
        ),
        parts,
        true,
        millis,
        vec![got],
    ))
}

// ------------------------------------------------------------------------------------ verify rows

/// Every MoE case `verify` runs (`quick`: shapes for the emulator).
pub fn moe_cases(device: &Device, quick: bool) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = Vec::new();
    fn push<C: std::fmt::Debug>(out: &mut Vec<Outcome>, case: C, r: Result<CaseResult>) {
        out.push(r.map_err(|e| (format!("{case:?}"), e)));
    }
    let tokens = if quick { 64 } else { 4096 };
    for dtype in DType::FLOATS {
        for (experts, k, routing) in [
            (16, 1, MoeRouting::Llama4),
            (8, 2, MoeRouting::Softmax { renormalize: true }),
            (128, 8, MoeRouting::Softmax { renormalize: false }),
            (256, 8, MoeRouting::Grouped { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 }),
        ] {
            let mut c = MoeRouteCase::new(dtype, tokens, experts, k, routing);
            c.bias = matches!(routing, MoeRouting::Grouped { .. });
            push(&mut out, c, moe_route_case(device, &c));
        }
    }
    for (tokens, experts, k, block_m) in
        [(257, 60, 2, 64), (if quick { 3000 } else { 65536 }, 128, 8, 64), (5, 16, 1, 16)]
    {
        let c = MoeAlignCase { tokens, experts, top_k: k, block_m, ids: IdPattern::Random, seed: 1 };
        push(&mut out, c, moe_align_case(device, &c));
    }
    let (gt, hidden, inter) = if quick { (33, 128, 128) } else { (256, 2048, 1024) };
    for dtype in DType::FLOATS {
        let c = MoeGatherCase { dtype, tokens: gt, experts: 16, top_k: 2, hidden, scaled: true, seed: 1 };
        push(&mut out, c, moe_gather_case(device, &c));
        for (layout, weights, block_m) in [
            (WeightLayout::InOut, GemmWeights::SwiGluPacked, 64),
            (WeightLayout::OutIn, GemmWeights::SwiGluSeparate, 16),
            (WeightLayout::InOut, GemmWeights::Plain, 64),
            (WeightLayout::OutIn, GemmWeights::Plain, 16),
        ] {
            let mut c = MoeGemmCase::new(dtype, gt, 8, 2, hidden, inter);
            (c.layout, c.weights, c.block_m) = (layout, weights, block_m);
            push(&mut out, c, moe_gemm_case(device, &c));
        }
        let c = MoeCombineCase {
            dtype,
            tokens: gt,
            experts: 16,
            top_k: 2,
            hidden,
            weighted: true,
            shared: true,
            residual: 1,
            seed: 1,
        };
        push(&mut out, c, moe_combine_case(device, &c));
        for c in [MoeFfnCase::llama4_scout(dtype, gt), MoeFfnCase::mixtral(dtype, gt), MoeFfnCase::grouped(dtype, gt)] {
            push(&mut out, c, moe_ffn_case(device, &c));
        }
    }
    out
}
