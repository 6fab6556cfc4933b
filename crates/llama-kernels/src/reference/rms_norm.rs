//! Reference RMSNorm.
//!
//! `y[r, j] = x[r, j] / sqrt(mean_k x[r, k]^2 + eps) * weight[j]`, in f64.

use super::check_len;
use crate::dtype::{DType, round_to};
use crate::error::Result;

/// RMSNorm of the rows of `x` (`hidden` values each).
pub fn rms_norm(x: &[f64], weight: &[f64], hidden: usize, eps: f64) -> Result<Vec<f64>> {
    check_len("weight", weight.len(), hidden)?;
    check_len("x", x.len(), x.len() / hidden.max(1) * hidden)?;
    Ok(x.chunks(hidden.max(1))
        .flat_map(|row| {
            let mean_sq = row.iter().map(|v| v * v).sum::<f64>() / hidden as f64;
            let inv_rms = 1.0 / (mean_sq + eps).sqrt();
            row.iter().zip(weight).map(move |(v, w)| v * inv_rms * w)
        })
        .collect())
}

/// Fused residual add + RMSNorm: returns `(s, y)` with `s = round_dtype(x + residual)` (what the
/// kernel stores into `residual`) and `y = rms_norm(s)`.
pub fn fused_add_rms_norm(
    x: &[f64],
    residual: &[f64],
    weight: &[f64],
    hidden: usize,
    eps: f64,
    dtype: DType,
) -> Result<(Vec<f64>, Vec<f64>)> {
    check_len("residual", residual.len(), x.len())?;
    let sum: Vec<f64> = x.iter().zip(residual).map(|(a, b)| round_to(dtype, a + b)).collect();
    let y = rms_norm(&sum, weight, hidden, eps)?;
    Ok((sum, y))
}

/// The backward of [`rms_norm`]: `(dx, dw)` for output gradient `dy`, per row
/// `r = 1/sqrt(mean(x^2) + eps)`, `dx = r (dy w) - x r^3 mean(dy w x)`, `dw = sum_rows dy x r`.
/// For [`fused_add_rms_norm`], `x` is the stored sum and the gradient of both inputs is
/// `dx + d_residual`.
pub fn rms_norm_backward(
    x: &[f64],
    weight: &[f64],
    dy: &[f64],
    hidden: usize,
    eps: f64,
) -> Result<(Vec<f64>, Vec<f64>)> {
    check_len("weight", weight.len(), hidden)?;
    check_len("dy", dy.len(), x.len())?;
    check_len("x", x.len(), x.len() / hidden.max(1) * hidden)?;
    let mut dx = Vec::with_capacity(x.len());
    let mut dw = vec![0.0; hidden];
    for (row, drow) in x.chunks(hidden.max(1)).zip(dy.chunks(hidden.max(1))) {
        let h = hidden as f64;
        let r = 1.0 / (row.iter().map(|v| v * v).sum::<f64>() / h + eps).sqrt();
        let gx: f64 = row.iter().zip(drow).zip(weight).map(|((x, d), w)| d * w * x).sum::<f64>() / h;
        for (j, ((x, d), w)) in row.iter().zip(drow).zip(weight).enumerate() {
            dx.push(r * d * w - x * r * r * r * gx);
            dw[j] += d * x * r;
        }
    }
    Ok((dx, dw))
}
