//! What an attention call computes, independent of how: which keys a query sees
//! ([`AttentionMask`]) and Llama 4's position-dependent query temperature
//! ([`Llama4Temperature`]). The f64 specification is [`crate::reference::attention`].

use crate::error::{Error, Result};

/// Which keys a query may attend.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum AttentionMask {
    /// Every key of its sequence.
    #[default]
    None,
    /// Keys up to the query's position, aligned bottom-right (`k_len - q_len + i`).
    Causal,
    /// Llama 4's chunked local attention: causal, and only keys in the query's chunk
    /// `floor(position / chunk_size)` (Llama 4 uses 8192 on its RoPE layers).
    ChunkedCausal {
        /// Tokens per chunk (> 0).
        chunk_size: usize,
    },
}

/// Llama 4's attention temperature tuning (`attn_temperature_tuning`, NoPE layers): the query at
/// position p is scaled by `ln(floor((p + 1) / floor_scale) + 1) * attn_scale + 1`, as in Hugging
/// Face's `Llama4TextAttention` (`torch.log1p(torch.floor((cache_position + 1) / floor_scale)) *
/// attn_scale + 1`). The kernel scales the f32 scores; Hugging Face rounds the scaled q to the
/// model dtype first, which differs by one rounding of q.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Llama4Temperature {
    /// Positions per temperature step (Llama 4: 8192), finite and > 0.
    pub floor_scale: f32,
    /// Weight of the log term (Llama 4: 0.1), finite and >= 0.
    pub attn_scale: f32,
}

impl Default for Llama4Temperature {
    /// Llama 4's configuration defaults: floor_scale 8192, attn_scale 0.1.
    fn default() -> Self {
        Llama4Temperature { floor_scale: 8192.0, attn_scale: 0.1 }
    }
}

impl Llama4Temperature {
    /// Checks both fields; the error names the offending one.
    pub fn validate(&self, op: &'static str) -> Result<()> {
        let t = self;
        {
            if !(t.floor_scale.is_finite() && t.floor_scale > 0.0) {
                return Err(Error::invalid(op, "temperature floor_scale", t.floor_scale, "must be finite and > 0"));
            }
            if !(t.attn_scale.is_finite() && t.attn_scale >= 0.0) {
                return Err(Error::invalid(op, "temperature attn_scale", t.attn_scale, "must be finite and >= 0"));
            }
        }
        Ok(())
    }
}
