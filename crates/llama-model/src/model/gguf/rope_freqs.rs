//! Llama 3.1 RoPE scaling recovered from a GGUF file's `rope_freqs.weight`.
//!
//! llama.cpp's converter does not store a Llama 3.1 `rope_scaling` (factor, low and high
//! frequency factors, original context) as metadata. It stores the result instead: one f32
//! divisor `g_i` per rotary pair, `rope_freqs.weight` `[rotary_dim / 2]`, and llama.cpp's
//! `rope_ext` rotates pair `i` by `p * theta^(-2i/d) / g_i`. For Llama 3.1 scaling with factor
//! `F`, the pair's wavelength `w_i = 2 pi theta^(2i/d)` decides `g_i`:
//!
//! ```text
//!   w_i < L / high_freq_factor   g_i = 1                       (kept)
//!   w_i > L / low_freq_factor    g_i = F                       (fully divided)
//!   otherwise                    g_i = 1 / ((1 - s) / F + s),  s = (L / w_i - low) / (high - low)
//! ```
//!
//! which is exactly Hugging Face's `llama3` inverse frequency `inv_freq_i / g_i`. So a file's
//! factors are turned back into a [`Llama3Scaling`], and the model runs with the same f64
//! inverse frequencies as the safetensors checkpoint the file was converted from.
//!
//! Only the band edges `L / high` and `L / low` are visible in the factors, never `L` itself
//! (scaling `L`, `low` and `high` together changes nothing), so `L` is the file's
//! `rope.scaling.original_context_length` when present and Llama 3's 8192 otherwise. The
//! parameters tried, in order: Meta's published bands (low 1, high 4: Llama 3.1, 3.2 and 3.3;
//! low 1, high 1: Llama 4 Scout) with `F` the factor of the lowest frequency, then, when two or
//! more pairs lie inside the smooth band, the band fitted through its two outermost pairs. The
//! first set whose factors match every stored factor to within [`MAX_ULPS`] f32 ulps is the
//! model's scaling. None matching is [`Error::Unsupported`] naming the first pair that differs:
//! a file with other factors is refused, never run with different frequencies than it asks for.

use crate::error::{Error, Result};
use llama_kernels::spec::rope::{Llama3Scaling, llama3_scale};

/// The tensor this module reads.
pub const TENSOR: &str = "rope_freqs.weight";

/// Largest distance, in f32 ulps of the stored factor, between a stored factor and the one the
/// recovered scaling gives. The converter computes the factors in f32 (`torch.float32` inverse
/// frequencies, then Python arithmetic on them); its Llama 3.1 factors at head_dim 64 are within
/// 1 ulp of the f64 values (`tests/fixtures/gguf_arch/llama31`). 16 ulps is a relative 1.9e-6;
/// changing any published parameter (a factor of 8 vs 16, a band edge) moves some factor by
/// orders of magnitude more.
pub const MAX_ULPS: u32 = 16;

/// The scaling whose factors are `factors` (a file's `rope_freqs.weight`), for RoPE with base
/// `theta` over `rotary_dim` dims, or `None` when every factor is exactly 1 (no scaling).
/// `original_context` is `L` in the module docs (8192 when the file does not say).
pub fn recover(factors: &[f32], theta: f64, rotary_dim: usize, original_context: f64) -> Result<Option<Llama3Scaling>> {
    let pairs = rotary_dim / 2;
    let bad = |why: String| Error::Checkpoint { tensor: TENSOR.into(), why };
    if factors.len() != pairs {
        return Err(bad(format!(
            "{} factors, but rope.dimension_count {rotary_dim} has {pairs} rotary pairs",
            factors.len()
        )));
    }
    if let Some((i, g)) = factors.iter().enumerate().find(|(_, g)| !(g.is_finite() && **g > 0.0)) {
        return Err(bad(format!("factor {i} is {g} (factors divide frequencies: finite and > 0)")));
    }
    if factors.iter().all(|&g| g == 1.0) {
        return Ok(None);
    }
    let Some(&last) = factors.last() else { return Ok(None) };
    let factor = f64::from(last);
    // The pairs' plain inverse frequencies and their wavelengths, as `spec::rope::inv_freq`.
    let freqs: Vec<f64> = (0..pairs).map(|i| theta.powf(-(2.0 * i as f64) / rotary_dim as f64)).collect();
    let published = [(1.0, 4.0), (1.0, 1.0)].map(|(low, high)| Llama3Scaling {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original_context,
    });
    let candidates = published.into_iter().chain(fitted(factors, &freqs, factor, original_context));
    let mut closest: Option<(usize, f64, f32)> = None;
    for s in candidates {
        match first_mismatch(factors, &freqs, &s) {
            None => return Ok(Some(s)),
            Some(m) => {
                closest = closest.or(Some(m));
            }
        }
    }
    let (i, want, got) = closest.unwrap_or((0, 1.0, last));
    Err(Error::Unsupported {
        what: format!(
            "GGUF {TENSOR}: the factors are not Llama 3.1 scaling of theta {theta} (pair {i}: the file has \
             {got}, the closest Llama 3.1 bands give {want})"
        ),
    })
}

/// The first pair whose stored factor is more than [`MAX_ULPS`] from the one `s` gives:
/// `(pair, factor of s, stored factor)`.
fn first_mismatch(factors: &[f32], freqs: &[f64], s: &Llama3Scaling) -> Option<(usize, f64, f32)> {
    factors.iter().zip(freqs).enumerate().find_map(|(i, (&g, &f))| {
        let want = f / llama3_scale(f, s);
        let ulp = f64::from(f32::EPSILON) * f64::from(g);
        ((want - f64::from(g)).abs() > f64::from(MAX_ULPS) * ulp).then_some((i, want, g))
    })
}

/// The band through the two outermost pairs strictly inside it (factor strictly between 1 and
/// `factor`), when there are two: `s = (1/g - 1/F) / (1 - 1/F)` is linear in `u = L / w`,
/// 0 at `u = low` and 1 at `u = high`.
fn fitted(factors: &[f32], freqs: &[f64], factor: f64, original: f64) -> Option<Llama3Scaling> {
    let inside: Vec<usize> =
        (0..factors.len()).filter(|&i| f64::from(factors[i]) > 1.0 && f64::from(factors[i]) < factor).collect();
    let (&a, &b) = (inside.first()?, inside.last()?);
    if a == b || factor <= 1.0 {
        return None;
    }
    let s = |i: usize| (1.0 / f64::from(factors[i]) - 1.0 / factor) / (1.0 - 1.0 / factor);
    let u = |i: usize| original * freqs[i] / (2.0 * std::f64::consts::PI);
    let width = (u(a) - u(b)) / (s(a) - s(b));
    let low = u(a) - s(a) * width;
    let high = low + width;
    (low.is_finite() && high.is_finite() && low > 0.0 && high > low).then_some(Llama3Scaling {
        factor,
        low_freq_factor: low,
        high_freq_factor: high,
        original_max_position_embeddings: original,
    })
}
