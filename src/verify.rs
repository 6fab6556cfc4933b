//! The main job: run every op on a device and check it against the reference.
//!
//! Each case builds seeded random inputs, poisons its outputs (0xFF bytes: NaN), runs the kernel
//! through the public API, and compares every output with the f64 reference under a per-dtype
//! tolerance. Strided cases put the rows inside a wider poisoned buffer and also check that the
//! gaps between rows were not written. The same case functions back the test suite.

use std::time::Instant;

use crate::backend::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::reference;
use crate::tensor::Tensor;
use crate::testing::{Comparison, Rng, Tolerance, compare};

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
fn worst_of(parts: Vec<(Comparison, Vec<usize>)>) -> (Comparison, Vec<usize>) {
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
pub fn rows_tensor(device: &Device, dtype: DType, data: &[f64], rows: usize, cols: usize, pad: usize) -> Result<(Tensor, Tensor)> {
    let full = Tensor::poisoned(device, dtype, &[rows, cols + pad])?;
    let view = full.narrow(1, 0, cols)?;
    let staged = Tensor::from_f64(device, dtype, data, &[rows, cols])?;
    view_copy(&staged, &view)?;
    Ok((view, full))
}

fn view_copy(src: &Tensor, dst: &Tensor) -> Result<()> {
    match src.dtype() {
        DType::F32 => dst.copy_from_slice(&src.to_vec::<f32>()?),
        DType::F16 => dst.copy_from_slice(&src.to_vec::<half::f16>()?),
        DType::BF16 => dst.copy_from_slice(&src.to_vec::<half::bf16>()?),
        DType::I32 => dst.copy_from_slice(&src.to_vec::<i32>()?),
        DType::I64 => dst.copy_from_slice(&src.to_vec::<i64>()?),
    }
}

/// Whether every element of `full` outside its first `cols` columns is still NaN (poison).
pub fn gaps_poisoned(full: &Tensor, cols: usize) -> Result<bool> {
    let width = *full.shape().last().unwrap_or(&0);
    Ok(full.to_f64_vec()?.iter().enumerate().all(|(i, v)| i % width.max(1) < cols || v.is_nan()))
}

/// An RMSNorm case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormCase {
    pub dtype: DType,
    pub rows: usize,
    pub hidden: usize,
    /// Also add a residual (fused_add_rms_norm).
    pub fused: bool,
    /// Extra elements between rows of every row tensor (0: contiguous).
    pub pad: usize,
    pub seed: u64,
}

impl RmsNormCase {
    pub fn new(dtype: DType, rows: usize, hidden: usize, fused: bool) -> Self {
        RmsNormCase { dtype, rows, hidden, fused, pad: 0, seed: 1 }
    }
    pub fn strided(self, pad: usize) -> Self {
        RmsNormCase { pad, ..self }
    }
}

pub const RMS_NORM_EPS: f32 = 1e-5;

/// Runs one RMSNorm case on `device` and checks it against the reference.
pub fn rms_norm_case(device: &Device, case: RmsNormCase) -> Result<CaseResult> {
    let RmsNormCase { dtype, rows, hidden, fused, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (rows as u64) << 20 ^ (hidden as u64) << 40 ^ u64::from(fused));
    let x = rng.normal_vec(rows * hidden, 1.0, dtype);
    let res = rng.normal_vec(rows * hidden, 1.0, dtype);
    let w = rng.uniform_vec(hidden, 0.5, 1.5, dtype);
    let (xt, _xfull) = rows_tensor(device, dtype, &x, rows, hidden, pad)?;
    let (rt, rfull) = rows_tensor(device, dtype, &res, rows, hidden, pad)?;
    let wt = Tensor::from_f64(device, dtype, &w, &[hidden])?;
    let yfull = Tensor::poisoned(device, dtype, &[rows, hidden + pad])?;
    let yt = yfull.narrow(1, 0, hidden)?;

    let start = Instant::now();
    if fused {
        ops::fused_add_rms_norm(&xt, &rt, &wt, RMS_NORM_EPS, &yt)?;
    } else {
        ops::rms_norm(&xt, &wt, RMS_NORM_EPS, &yt)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let tol = Tolerance::rounded_output(dtype);
    let y = yt.to_f64_vec()?;
    let shape = vec![rows, hidden];
    let mut parts = Vec::new();
    let mut outputs = vec![y.clone()];
    let mut gaps = gaps_poisoned(&yfull, hidden)?;
    if fused {
        let (sum, yref) = reference::rms_norm::fused_add_rms_norm(&x, &res, &w, hidden, f64::from(RMS_NORM_EPS), dtype)?;
        let s = rt.to_f64_vec()?;
        parts.push((compare(&s, &sum, tol), shape.clone()));
        parts.push((compare(&y, &yref, tol), shape.clone()));
        outputs.push(s);
        if pad > 0 {
            gaps &= gaps_poisoned(&rfull, hidden)?;
        }
    } else {
        let yref = reference::rms_norm::rms_norm(&x, &w, hidden, f64::from(RMS_NORM_EPS))?;
        parts.push((compare(&y, &yref, tol), shape.clone()));
    }
    let (comparison, worst_shape) = worst_of(parts);
    Ok(CaseResult {
        op: if fused { "fused_add_rms_norm" } else { "rms_norm" }.into(),
        dtype,
        shape: if pad > 0 { format!("{rows}x{hidden} (row stride {})", hidden + pad) } else { format!("{rows}x{hidden}") },
        pass: comparison.pass && gaps,
        comparison,
        worst_shape,
        gaps_untouched: gaps,
        millis,
        outputs,
    })
}

/// The cases `verify` runs. `quick` keeps shapes small enough for the emulated target.
pub fn rms_norm_cases(quick: bool) -> Vec<RmsNormCase> {
    let shapes: &[(usize, usize)] =
        if quick { &[(1, 4096), (7, 769), (83, 768), (16, 8192)] } else { &[(1, 4096), (7, 769), (83, 768), (4096, 4096), (1024, 8192)] };
    let mut v = Vec::new();
    for fused in [false, true] {
        for dtype in DType::FLOATS {
            for &(rows, hidden) in shapes {
                v.push(RmsNormCase::new(dtype, rows, hidden, fused));
            }
            v.push(RmsNormCase::new(dtype, 33, 4096, fused).strided(8));
        }
    }
    v
}

/// Runs every case on `device`. Errors (a failed launch) become failing rows, not aborts.
pub fn run_all(device: &Device, quick: bool) -> Vec<std::result::Result<CaseResult, (String, crate::Error)>> {
    rms_norm_cases(quick)
        .into_iter()
        .map(|c| rms_norm_case(device, c).map_err(|e| (format!("{c:?}"), e)))
        .collect()
}

/// Formats results as the `verify` table.
pub fn table(results: &[std::result::Result<CaseResult, (String, crate::Error)>]) -> String {
    let mut s = format!(
        "{:<20} {:<5} {:<28} {:>11} {:>11} {:>6} {:>10}\n",
        "op", "dtype", "shape", "max abs", "max rel", "result", "time ms"
    );
    for r in results {
        match r {
            Ok(c) => s.push_str(&format!(
                "{:<20} {:<5} {:<28} {:>11.3e} {:>11.3e} {:>6} {:>10.3}\n",
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
