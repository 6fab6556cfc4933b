//! `verify` cases of MoE routing (every mode, ties, NaN) and of the expert permutation.

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, compare};
use crate::dev::verify::common::{CaseResult, rows_tensor};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::moe::{MoeAlign, MoeRouting, moe_route};
use crate::reference::moe as reference;
use crate::tensor::Tensor;

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
