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
