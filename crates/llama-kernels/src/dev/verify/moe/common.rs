//! What the MoE cases share: NaN-aware comparison, tolerances, timing and result rows.

use std::time::Instant;

use crate::backend::Device;
use crate::dev::testing::{Comparison, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;

/// Compares with NaN == NaN (routing weights of all-NaN rows are NaN by specification).
pub(crate) fn compare_nan_aware(got: &[f64], expected: &[f64], tol: Tolerance) -> Comparison {
    let both = |i: usize| got.get(i).is_some_and(|g| g.is_nan()) && expected[i].is_nan();
    let e: Vec<f64> = (0..expected.len()).map(|i| if both(i) { 0.0 } else { expected[i] }).collect();
    let g: Vec<f64> = (0..got.len()).map(|i| if i < expected.len() && both(i) { 0.0 } else { got[i] }).collect();
    compare(&g, &e, tol)
}

pub(crate) fn exact() -> Tolerance {
    Tolerance { atol: 0.0, rtol: 0.0 }
}

pub(crate) fn rms(v: &[f64]) -> f64 {
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

pub(crate) use crate::dev::verify::common::result;

pub(crate) fn timed(device: &Device, f: impl FnOnce() -> Result<()>) -> Result<f64> {
    let start = Instant::now();
    f()?;
    device.synchronize()?;
    Ok(start.elapsed().as_secs_f64() * 1e3)
}
