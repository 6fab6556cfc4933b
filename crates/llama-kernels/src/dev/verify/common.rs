//! What every `verify` case shares: its result row, the table, and buffer helpers.

use crate::backend::Device;
use crate::dev::testing::{Comparison, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::tensor::Tensor;

/// One checked case: a row of the `verify` table.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub op: String,
    pub dtype: DType,
    pub shape: String,
    /// The worst of the case's outputs.
    pub comparison: Comparison,
    /// Shape used to name the worst element.
    pub worst_shape: Vec<usize>,
    /// Every gap between strided rows still holds its poison.
    pub gaps_untouched: bool,
    pub pass: bool,
    /// Wall time of the launch(es), including the wait for completion.
    pub millis: f64,
    /// Raw outputs, for bit-for-bit comparison across schedules.
    pub outputs: Vec<Vec<f64>>,
}

impl CaseResult {
    pub fn describe(&self) -> String {
        let gaps = if self.gaps_untouched { "" } else { "; WROTE OUTSIDE ITS ROWS" };
        format!("{} {} {}: {}{gaps}", self.op, self.dtype, self.shape, self.comparison.describe(&self.worst_shape))
    }
}

/// Merges the comparisons of several outputs into the worst one.
pub(crate) fn worst_of(parts: Vec<(Comparison, Vec<usize>)>) -> (Comparison, Vec<usize>) {
    let pass = parts.iter().all(|(c, _)| c.pass);
    let max_abs = parts.iter().map(|(c, _)| c.max_abs).fold(0.0, f64::max);
    let max_rel = parts.iter().map(|(c, _)| c.max_rel).fold(0.0, f64::max);
    let (mut c, shape) = parts
        .into_iter()
        .max_by(|a, b| a.0.worst_ratio.total_cmp(&b.0.worst_ratio))
        .unwrap_or_else(|| (compare(&[], &[], Tolerance { atol: 0.0, rtol: 0.0 }), vec![]));
    c.pass = pass;
    c.max_abs = max_abs;
    c.max_rel = max_rel;
    (c, shape)
}

/// A `[rows, cols]` tensor holding `data`, either contiguous or as a view into a wider buffer
/// of `cols + pad` columns whose extra columns are poisoned. Returns (view, backing buffer).
pub fn rows_tensor(
    device: &Device,
    dtype: DType,
    data: &[f64],
    rows: usize,
    cols: usize,
    pad: usize,
) -> Result<(Tensor, Tensor)> {
    let full = Tensor::poisoned(device, dtype, &[rows, cols + pad])?;
    let view = full.narrow(1, 0, cols)?;
    view.copy_from_f64(data)?;
    Ok((view, full))
}

/// q, k and v (contiguous `[tokens, heads, d]` values) packed per token into one
/// `[tokens, q_heads + 2 kv_heads, d]` buffer, as a fused QKV projection writes them; returns
/// the three views into it.
pub(crate) fn fused_qkv_views(
    device: &Device,
    dtype: DType,
    [q, k, v]: [&[f64]; 3],
    tokens: usize,
    q_heads: usize,
    kv_heads: usize,
    d: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let heads = q_heads + 2 * kv_heads;
    let mut all = Vec::with_capacity(tokens * heads * d);
    for t in 0..tokens {
        all.extend_from_slice(&q[t * q_heads * d..(t + 1) * q_heads * d]);
        all.extend_from_slice(&k[t * kv_heads * d..(t + 1) * kv_heads * d]);
        all.extend_from_slice(&v[t * kv_heads * d..(t + 1) * kv_heads * d]);
    }
    let buf = Tensor::from_f64(device, dtype, &all, &[tokens, heads, d])?;
    Ok((buf.narrow(1, 0, q_heads)?, buf.narrow(1, q_heads, kv_heads)?, buf.narrow(1, q_heads + kv_heads, kv_heads)?))
}

/// Whether every element of `full` outside its first `cols` columns is still NaN (poison).
pub fn gaps_poisoned(full: &Tensor, cols: usize) -> Result<bool> {
    let width = *full.shape().last().unwrap_or(&0);
    Ok(full.to_f64_vec()?.iter().enumerate().all(|(i, v)| i % width.max(1) < cols || v.is_nan()))
}

/// One `verify` row: the case's debug text, or the error that stopped it.
pub type Outcome = std::result::Result<CaseResult, (String, crate::Error)>;

pub(crate) fn outcome<C: std::fmt::Debug + Copy>(case: C, r: Result<CaseResult>) -> Outcome {
    r.map_err(|e| (format!("{case:?}"), e))
}

/// Formats results as the `verify` table.
pub fn table(results: &[Outcome]) -> String {
    let mut s = format!(
        "{:<20} {:<5} {:<36} {:>11} {:>11} {:>6} {:>10}\n",
        "op", "dtype", "shape", "max abs", "max rel", "result", "time ms"
    );
    for r in results {
        match r {
            Ok(c) => s.push_str(&format!(
                "{:<20} {:<5} {:<36} {:>11.3e} {:>11.3e} {:>6} {:>10.3}\n",
                c.op,
                c.dtype.name(),
                c.shape,
                c.comparison.max_abs,
                c.comparison.max_rel,
                if c.pass { "pass" } else { "FAIL" },
                c.millis
            )),
            Err((case, e)) => s.push_str(&format!("ERROR {case}: {e}\n")),
        }
    }
    s
}

/// A case's row from its outputs' comparisons (the worst one names the case) and its gaps.
pub(crate) fn result(
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
