//! `verify` cases of the grouped expert GEMM (layouts, epilogues, block sizes, dtypes).

use super::common::*;
use super::route::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, compare};
use crate::dev::verify::common::{CaseResult, rows_tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::moe::{ExpertWeights, GemmGroups, MoeAlign, WeightLayout, moe_grouped_gemm};
use crate::reference::moe as reference;
use crate::tensor::Tensor;

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
pub(crate) fn expert_weights(
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
        let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m)?;
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
