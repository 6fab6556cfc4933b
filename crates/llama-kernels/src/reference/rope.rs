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
//!
//! Backward ([`rope_backward`]): a rotation's transpose is the rotation by `-p f`; with the
//! qk-norm, `y = s z`, `z = R x`, `dz = s dy - s^3 z mean(z dy)`, then `dx = R^T dz`.

use super::check_len;
use crate::error::{Error, Result};
use crate::spec::rope::{MAX_POSITION, RopeConfig, RopeLayout};
pub use crate::spec::rope::{inv_freq, llama3_scale};

/// Rotates (and optionally normalizes) `x`, shaped `[tokens, heads, head_dim]` and contiguous,
/// at `positions[token]`, clamped to `+-(2^24 - 1)`.
pub fn rope(x: &[f64], heads: usize, positions: &[i64], config: &RopeConfig) -> Result<Vec<f64>> {
    let d = config.head_dim;
    check_len("x", x.len(), positions.len() * heads * d)?;
    let rotation = Rotation::new(config);
    let mut out = x.to_vec();
    for (row, head) in out.chunks_exact_mut(d).enumerate() {
        rotation.rotate(head, positions[row / heads], 1.0);
        if let Some(eps) = config.qk_norm_eps {
            let scale = norm_scale(head, eps);
            head.iter_mut().for_each(|v| *v *= scale);
        }
    }
    Ok(out)
}

/// The backward of [`rope`]: from `dy`, the gradient of its output, the gradient of its input
/// `x`. `x` (the forward's input, same shape) is read only with a qk-norm; pass `None` without.
pub fn rope_backward(
    dy: &[f64],
    x: Option<&[f64]>,
    heads: usize,
    positions: &[i64],
    config: &RopeConfig,
) -> Result<Vec<f64>> {
    let d = config.head_dim;
    check_len("dy", dy.len(), positions.len() * heads * d)?;
    let norm = match (config.qk_norm_eps, x) {
        (Some(eps), Some(x)) => {
            check_len("x", x.len(), dy.len())?;
            Some((eps, x))
        }
        (Some(_), None) => {
            return Err(Error::invalid("reference::rope_backward", "x", "None", "needed with a qk-norm"));
        }
        (None, _) => None,
    };
    let rotation = Rotation::new(config);
    let mut out = dy.to_vec();
    for (row, head) in out.chunks_exact_mut(d).enumerate() {
        let p = positions[row / heads];
        if let Some((eps, x)) = norm {
            let mut z = x[row * d..(row + 1) * d].to_vec();
            rotation.rotate(&mut z, p, 1.0);
            let s = norm_scale(&z, eps);
            let mean_zdy = z.iter().zip(head.iter()).map(|(z, g)| z * g).sum::<f64>() / d as f64;
            for (g, z) in head.iter_mut().zip(&z) {
                *g = s * *g - s * s * s * z * mean_zdy;
            }
        }
        rotation.rotate(head, p, -1.0);
    }
    Ok(out)
}

/// `1 / sqrt(mean(v^2) + eps)`.
fn norm_scale(v: &[f64], eps: f32) -> f64 {
    let mean_sq = v.iter().map(|v| v * v).sum::<f64>() / v.len() as f64;
    1.0 / (mean_sq + f64::from(eps)).sqrt()
}

/// The rotation of one head: the inverse frequencies and the pairing of the layout.
struct Rotation {
    freqs: Vec<f64>,
    layout: RopeLayout,
}

impl Rotation {
    fn new(config: &RopeConfig) -> Rotation {
        Rotation { freqs: inv_freq(config), layout: config.layout }
    }

    /// Rotates `head` by `sign` times the angles of position `p`, clamped to `+-(2^24 - 1)` (the
    /// documented domain, see ops::rope).
    fn rotate(&self, head: &mut [f64], p: i64, sign: f64) {
        let p = p.clamp(-MAX_POSITION, MAX_POSITION) as f64;
        let half = self.freqs.len();
        for (i, f) in self.freqs.iter().enumerate() {
            let (ia, ib) = match self.layout {
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                RopeLayout::HalfSplit => (i, i + half),
            };
            let (s, c) = (sign * p * f).sin_cos();
            let (a, b) = (head[ia], head[ib]);
            head[ia] = a * c - b * s;
            head[ib] = b * c + a * s;
        }
    }
}
