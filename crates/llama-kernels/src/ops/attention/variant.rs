//! The attention variant of one call, checked and in the params struct's terms: the softmax
//! scale, the mask (causal, Llama 4 chunked) and Llama 4's temperature. Prefill and decode fill
//! the same `LlkAttnVariant` (params.h) from one [`Variant`], so they cannot disagree on what an
//! option means or which values it accepts, and the kernels share its math
//! (kernels/common/attention_math.cuh).

use crate::error::{Error, Result};
use crate::ffi::params::{LlkAttnMask, LlkAttnTemperature, LlkAttnVariant};
use crate::launch::to_i64;
use crate::spec::attention::{AttentionMask, Llama4Temperature};

/// A checked attention variant.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Variant {
    /// Softmax scale, finite and > 0.
    pub scale: f32,
    pub mask: LlkAttnMask,
    /// Keys per chunk of the chunked mask (0 otherwise).
    pub chunk_size: usize,
    pub temperature: LlkAttnTemperature,
    pub temp_floor_scale: f32,
    pub temp_attn_scale: f32,
}

impl Variant {
    /// Checks the options of `op` for `head_dim` (`scale` `None` is `1 / sqrt(head_dim)`).
    pub fn new(
        op: &'static str,
        mask: AttentionMask,
        scale: Option<f32>,
        temperature: Option<Llama4Temperature>,
        head_dim: usize,
    ) -> Result<Variant> {
        let scale = scale.unwrap_or(1.0 / (head_dim as f32).sqrt());
        // Positive: the kernels take row maxima of raw scores and scale them (and a softmax
        // with a negative scale is not something a model asks for).
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(op, "scale", scale, "must be finite and > 0"));
        }
        let (mask, chunk_size) = match mask {
            AttentionMask::None => (LlkAttnMask::LLK_ATTN_NONE, 0),
            AttentionMask::Causal => (LlkAttnMask::LLK_ATTN_CAUSAL, 0),
            AttentionMask::ChunkedCausal { chunk_size: 0 } => {
                return Err(Error::invalid(op, "chunk_size", 0, "must be > 0"));
            }
            AttentionMask::ChunkedCausal { chunk_size } => (LlkAttnMask::LLK_ATTN_CHUNKED_CAUSAL, chunk_size),
        };
        if let Some(t) = &temperature {
            t.validate(op)?;
        }
        Ok(Variant {
            scale,
            mask,
            chunk_size,
            temperature: match temperature {
                Some(_) => LlkAttnTemperature::LLK_ATTN_LLAMA4_TEMPERATURE,
                None => LlkAttnTemperature::LLK_ATTN_NO_TEMPERATURE,
            },
            temp_floor_scale: temperature.map_or(1.0, |t| t.floor_scale),
            temp_attn_scale: temperature.map_or(0.0, |t| t.attn_scale),
        })
    }
}

impl Variant {
    /// The params-struct form (`LlkAttnVariant`, embedded in both params structs).
    pub fn raw(&self, op: &'static str) -> Result<LlkAttnVariant> {
        Ok(LlkAttnVariant {
            chunk_size: to_i64(op, "chunk_size", self.chunk_size)?,
            mask: self.mask,
            temperature: self.temperature,
            scale: self.scale,
            temp_floor_scale: self.temp_floor_scale,
            temp_attn_scale: self.temp_attn_scale,
        })
    }
}
