//! Reference RoPE (the spec of kernels/rope.cu), in f64.
//!
//! Inverse frequencies: `f_i = theta^(-2i / rotary_dim)` for `i < rotary_dim / 2`, then, with
//! Llama 3.1 scaling (`factor`, `low_freq_factor`, `high_freq_factor`, `original_max_position_
//! embeddings` = L), per wavelength `w_i = 2 pi / f_i`:
//!
//! * `w_i > L / low_freq_factor` (low frequencies): `f_i / factor`;
//! * `w_i < L / high_freq_factor` (high frequencies): `f_i`, unchanged;
//! * otherwise: `(1 - s) f_i / factor + s f_i` with `s = (L / w_i - low) / (high - low)`.
//!
//! This is Hugging Face's `_compute_llama3_parameters`. When `high_freq_factor ==
//! low_freq_factor` (Llama 4 Scout: 1 and 1) the middle band is empty and no division by zero
//! happens.
//!
//! Rotation at position p: the pair `(a, b)` becomes `(a cos(p f) - b sin(p f), b cos(p f) +
//! a sin(p f))`; pairs are `(2i, 2i+1)` (interleaved) or `(i, i + rotary_dim/2)` (half-split).
//! With the Llama 4 qk-norm, each head is then scaled by `1 / sqrt(mean(x^2) + eps)`.

use super::check_len;
use crate::error::Result;
use crate::spec::rope::{MAX_POSITION, RopeConfig, RopeLayout};
pub use crate::spec::rope::{inv_freq, llama3_scale};

/// Rotates (and optionally normalizes) `x`, shaped `[tokens, heads, head_dim]` and contiguous,
/// at `positions[token]`, clamped to `+-(2^24 - 1)`.
pub fn rope(x: &[f64], heads: usize, positions: &[i64], config: &RopeConfig) -> Result<Vec<f64>> {
    let d = config.head_dim;
    check_len("x", x.len(), positions.len() * heads * d)?;
    let freqs = inv_freq(config);
    let half = config.rotary_dim / 2;
    let mut out = x.to_vec();
    let max = MAX_POSITION;
    for (t, &p) in positions.iter().enumerate() {
        // The documented domain: positions beyond +-(2^24 - 1) are clamped (see ops::rope).
        let p = p.clamp(-max, max);
        for h in 0..heads {
            let head = &mut out[(t * heads + h) * d..(t * heads + h + 1) * d];
            for (i, f) in freqs.iter().enumerate() {
                let (ia, ib) = match config.layout {
                    RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                    RopeLayout::HalfSplit => (i, i + half),
                };
                let (s, c) = (p as f64 * f).sin_cos();
                let (a, b) = (head[ia], head[ib]);
                head[ia] = a * c - b * s;
                head[ib] = b * c + a * s;
            }
            if let Some(eps) = config.qk_norm_eps {
                let mean_sq = head.iter().map(|v| v * v).sum::<f64>() / d as f64;
                let scale = 1.0 / (mean_sq + f64::from(eps)).sqrt();
                head.iter_mut().for_each(|v| *v *= scale);
            }
        }
    }
    Ok(out)
}
