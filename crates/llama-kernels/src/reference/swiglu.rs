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
