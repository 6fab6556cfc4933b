//! Token sampling: the per-sequence parameters of one draw (the device op takes them as arrays,
//! one entry per row; [`crate::reference::sampling`] states what they mean).

/// One sequence's sampling parameters, as Hugging Face `GenerationConfig` names them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SamplingConfig {
    /// Divides the logits; `0` is greedy (the argmax, ties to the lowest index). Finite, >= 0.
    pub temperature: f32,
    /// Keep the `top_k` highest scores (ties at the boundary kept); `0` (or >= vocab) is off.
    pub top_k: i32,
    /// Nucleus: keep the smallest prefix of the sorted order whose mass reaches `top_p`; `1` is
    /// off. In `[0, 1]`.
    pub top_p: f32,
    /// Drop tokens with probability < `min_p` times the largest; `0` is off. In `[0, 1]`.
    pub min_p: f32,
}

impl SamplingConfig {
    /// The argmax.
    pub const GREEDY: SamplingConfig = SamplingConfig { temperature: 0.0, top_k: 0, top_p: 1.0, min_p: 0.0 };

    /// Plain sampling at `temperature`, no filters.
    pub fn with_temperature(temperature: f32) -> SamplingConfig {
        SamplingConfig { temperature, ..SamplingConfig::GREEDY }
    }

    /// Whether every parameter is in its domain (the device raises
    /// `LLK_DEVICE_BAD_SAMPLING_PARAMS` and writes token -1 for a row where it is not).
    pub fn is_valid(&self) -> bool {
        self.temperature.is_finite()
            && self.temperature >= 0.0
            && self.top_k >= 0
            && (0.0..=1.0).contains(&self.top_p)
            && (0.0..=1.0).contains(&self.min_p)
    }
}

impl Default for SamplingConfig {
    /// Temperature 1, no filters.
    fn default() -> Self {
        SamplingConfig::with_temperature(1.0)
    }
}
