//! Reference LoRA branch (the spec of `ops::lora`), in f64: with `xs = dropout(x) · scaling`
//! ([`crate::spec::lora`]), the branch adds `y += xs Aᵀ Bᵀ` to the base's output, and its
//! backward is `dB = dyᵀ (xs Aᵀ)`, `dA = (dy B)ᵀ xs`, `dx += dropout(dy B A) · scaling` (the same
//! mask).

use super::dropout::dropout;
use super::linear::{linear, linear_backward};
use crate::error::Result;
use crate::spec::dropout::Dropout;
use crate::spec::lora::LoraConfig;

/// The gradients of one adapter's branch.
#[derive(Clone, Debug, PartialEq)]
pub struct LoraGrads {
    /// `[tokens, in]`: the branch's share of the input gradient (the base adds its own).
    pub dx: Vec<f64>,
    /// `[r, in]`.
    pub da: Vec<f64>,
    /// `[out, r]`.
    pub db: Vec<f64>,
}

/// The branch's output `[tokens, out]` from `x` `[tokens, in]`, `a` `[r, in]`, `b` `[out, r]`,
/// under the dropout mask `mask` (its `p` is `cfg.dropout`).
pub fn lora_forward(
    x: &[f64],
    a: &[f64],
    b: &[f64],
    cfg: &LoraConfig,
    mask: &Dropout,
    [d_out, d_in]: [usize; 2],
) -> Result<Vec<f64>> {
    let (_, h) = branch_input(x, a, cfg, mask, d_in)?;
    linear(&h, b, None, cfg.r, d_out)
}

/// `xs = dropout(x) · scaling` and `h = xs Aᵀ`: what the forward and the backward share.
fn branch_input(x: &[f64], a: &[f64], cfg: &LoraConfig, mask: &Dropout, d_in: usize) -> Result<(Vec<f64>, Vec<f64>)> {
    let xs = dropout(x, d_in, mask, cfg.scaling())?;
    let h = linear(&xs, a, None, d_in, cfg.r)?;
    Ok((xs, h))
}

/// The branch's gradients from `dy` `[tokens, out]` and the forward's inputs.
pub fn lora_backward(
    dy: &[f64],
    x: &[f64],
    a: &[f64],
    b: &[f64],
    cfg: &LoraConfig,
    mask: &Dropout,
    [d_out, d_in]: [usize; 2],
) -> Result<LoraGrads> {
    let (xs, h) = branch_input(x, a, cfg, mask, d_in)?;
    let (dh, db) = linear_backward(dy, &h, b, cfg.r, d_out)?;
    let (dxs, da) = linear_backward(&dh, &xs, a, d_in, cfg.r)?;
    let dx = dropout(&dxs, d_in, mask, cfg.scaling())?;
    Ok(LoraGrads { dx, da, db })
}
