//! `verify` cases of the gather into expert-contiguous rows and of the combine.

use super::common::*;
use super::route::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dev::verify::common::CaseResult;
use crate::dtype::{DType, round_to};
use crate::error::Result;
use crate::ops::moe::{MoeAlign, moe_combine, moe_gather};
use crate::reference::moe as reference;
use crate::tensor::Tensor;

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
    let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m)?;
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
    let rows = crate::ops::moe::padded_rows(tokens * top_k, experts, block_m)?;
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
