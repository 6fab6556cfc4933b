//! What a rotary position embedding computes: the pairing of elements ([`RopeLayout`]), the
//! frequencies (theta, Llama 3.1 scaling, partial rotary dimension) and Llama 4's qk-norm
//! ([`RopeConfig`]), and the f64 inverse frequencies every implementation uses ([`inv_freq`]).
//! The rotation itself is specified in [`crate::reference::rope`].

use crate::error::{Error, Result};

const OP: &str = "rope";
/// Largest |position| rotated exactly; larger ones are clamped to it (see the module docs).
pub const MAX_POSITION: i64 = crate::ffi::params::LLK_ROPE_MAX_POSITION as i64;
/// Largest rotary_dim any kernel path handles (8 pairs x 32 threads x 2 elements).
pub const MAX_ROTARY_DIM: usize = 512;
/// Which elements form a rotary pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeLayout {
    /// Pairs `(2i, 2i+1)`: Meta's reference implementation (the complex form), and Llama 4 in
    /// Hugging Face (`apply_rotary_emb` with `view_as_complex`).
    Interleaved,
    /// Pairs `(i, i + rotary_dim/2)`: Hugging Face's `rotate_half` (Llama 3 checkpoints on the
    /// Hub, whose q/k weights were permuted for it) and GPT-NeoX.
    HalfSplit,
}

/// Llama 3.1 frequency scaling (`rope_type: "llama3"` in a Hugging Face config).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama3Scaling {
    /// Divides the low frequencies (Llama 3.1: 8).
    pub factor: f64,
    /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are fully divided.
    pub low_freq_factor: f64,
    /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
    pub high_freq_factor: f64,
    /// The pretraining context in tokens (Llama 3.1: 8192).
    pub original_max_position_embeddings: f64,
}

impl Llama3Scaling {
    /// Meta's published Llama 3.1 values: 8, 1, 4, 8192.
    pub const LLAMA_3_1: Llama3Scaling = Llama3Scaling {
        factor: 8.0,
        low_freq_factor: 1.0,
        high_freq_factor: 4.0,
        original_max_position_embeddings: 8192.0,
    };
    /// Llama 4 Scout: factor 16, low and high frequency factors both 1 (no smooth band), 8192.
    pub const LLAMA_4_SCOUT: Llama3Scaling = Llama3Scaling {
        factor: 16.0,
        low_freq_factor: 1.0,
        high_freq_factor: 1.0,
        original_max_position_embeddings: 8192.0,
    };
}

/// A RoPE configuration.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeConfig {
    /// Elements per head of q and k (> 0).
    pub head_dim: usize,
    /// Rotated dims (even, <= head_dim, <= 512); the rest pass through (partial rotary).
    pub rotary_dim: usize,
    /// Base of the frequencies (10 000 for Llama 2, 500 000 for Llama 3 and 4).
    pub theta: f64,
    /// Which elements form a rotary pair.
    pub layout: RopeLayout,
    /// Llama 3.1 frequency scaling, or `None`.
    pub scaling: Option<Llama3Scaling>,
    /// Llama 4's weightless L2 norm of q and k after rotating (`use_qk_norm`), with its eps
    /// (`rms_norm_eps`, 1e-5). `None`: no norm.
    pub qk_norm_eps: Option<f32>,
}

impl RopeConfig {
    /// Llama 3.1/3.2/3.3 as loaded from Hugging Face: theta 500 000, half-split, 3.1 scaling.
    pub fn llama3_1(head_dim: usize) -> RopeConfig {
        RopeConfig {
            head_dim,
            rotary_dim: head_dim,
            theta: 500_000.0,
            layout: RopeLayout::HalfSplit,
            scaling: Some(Llama3Scaling::LLAMA_3_1),
            qk_norm_eps: None,
        }
    }
    /// Llama 4 Scout RoPE layers: theta 500 000, interleaved, Scout scaling, qk-norm eps 1e-5.
    pub fn llama4_scout(head_dim: usize) -> RopeConfig {
        RopeConfig {
            head_dim,
            rotary_dim: head_dim,
            theta: 500_000.0,
            layout: RopeLayout::Interleaved,
            scaling: Some(Llama3Scaling::LLAMA_4_SCOUT),
            qk_norm_eps: Some(1e-5),
        }
    }

    /// Checks every field; the error names the offending one.
    pub fn validate(&self) -> Result<()> {
        if self.head_dim == 0 {
            return Err(Error::invalid(OP, "head_dim", 0, "must be > 0"));
        }
        if self.rotary_dim == 0 || self.rotary_dim % 2 != 0 {
            return Err(Error::invalid(
                OP,
                "rotary_dim",
                self.rotary_dim,
                "must be even and > 0 (rotary dims come in pairs)",
            ));
        }
        if self.rotary_dim > self.head_dim {
            return Err(Error::invalid(
                OP,
                "rotary_dim",
                self.rotary_dim,
                format!("exceeds head_dim {}", self.head_dim),
            ));
        }
        if self.rotary_dim > MAX_ROTARY_DIM {
            return Err(Error::invalid(
                OP,
                "rotary_dim",
                self.rotary_dim,
                format!("unsupported (at most {MAX_ROTARY_DIM})"),
            ));
        }
        if !self.theta.is_finite() || self.theta <= 0.0 {
            return Err(Error::invalid(OP, "theta", self.theta, "must be finite and > 0"));
        }
        if let Some(s) = &self.scaling {
            for (name, v) in [
                ("factor", s.factor),
                ("low_freq_factor", s.low_freq_factor),
                ("high_freq_factor", s.high_freq_factor),
                ("original_max_position_embeddings", s.original_max_position_embeddings),
            ] {
                if !v.is_finite() || v <= 0.0 {
                    return Err(Error::invalid(OP, name, v, "scaling factors must be finite and > 0"));
                }
            }
            if s.high_freq_factor < s.low_freq_factor {
                return Err(Error::invalid(
                    OP,
                    "high_freq_factor",
                    s.high_freq_factor,
                    format!("must be >= low_freq_factor {}", s.low_freq_factor),
                ));
            }
        }
        if let Some(eps) = self.qk_norm_eps {
            if !eps.is_finite() || eps <= 0.0 {
                return Err(Error::invalid(OP, "qk_norm_eps", eps, "must be finite and > 0"));
            }
        }
        Ok(())
    }
}

/// The (scaled) inverse frequencies of `config`, `rotary_dim / 2` of them.
pub fn inv_freq(config: &RopeConfig) -> Vec<f64> {
    let r = config.rotary_dim as f64;
    (0..config.rotary_dim / 2)
        .map(|i| {
            let f = config.theta.powf(-(2.0 * i as f64) / r);
            match &config.scaling {
                Some(s) => llama3_scale(f, s),
                None => f,
            }
        })
        .collect()
}

/// Llama 3.1 frequency scaling of one inverse frequency.
pub fn llama3_scale(f: f64, s: &Llama3Scaling) -> f64 {
    let wavelen = 2.0 * std::f64::consts::PI / f;
    let low_freq_wavelen = s.original_max_position_embeddings / s.low_freq_factor;
    let high_freq_wavelen = s.original_max_position_embeddings / s.high_freq_factor;
    if wavelen > low_freq_wavelen {
        f / s.factor
    } else if wavelen < high_freq_wavelen {
        f
    } else {
        let smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor)
            / (s.high_freq_factor - s.low_freq_factor);
        (1.0 - smooth) * f / s.factor + smooth * f
    }
}
