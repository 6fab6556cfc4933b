//! Reference SwiGLU (the spec of kernels/swiglu.cu), in f64: `out = silu(gate) * up` with
//! `silu(g) = g / (1 + exp(-g))`, element-wise over `[tokens, d]`.

use super::check_len;
use crate::error::Result;

/// `silu(g) = g / (1 + exp(-g))`.
pub fn silu(g: f64) -> f64 {
    g / (1.0 + (-g).exp())
}

/// `silu(gate) * up` for two equally long slices.
pub fn swiglu(gate: &[f64], up: &[f64]) -> Result<Vec<f64>> {
    check_len("up", up.len(), gate.len())?;
    Ok(gate.iter().zip(up).map(|(&g, &u)| silu(g) * u).collect())
}

/// The backward of [`swiglu`]: `(d_gate, d_up)` for output gradient `d_out`, with
/// `s = sigmoid(gate)`: `d_up = d_out * gate * s`, `d_gate = d_out * up * s * (1 + gate (1 - s))`.
pub fn swiglu_backward(gate: &[f64], up: &[f64], d_out: &[f64]) -> Result<(Vec<f64>, Vec<f64>)> {
    check_len("up", up.len(), gate.len())?;
    check_len("d_out", d_out.len(), gate.len())?;
    Ok(gate
        .iter()
        .zip(up)
        .zip(d_out)
        .map(|((&g, &u), &d)| {
            let s = 1.0 / (1.0 + (-g).exp());
            (d * u * s * (1.0 + g * (1.0 - s)), d * g * s)
        })
        .unzip())
}
