//! What one decoder layer is, independent of where its weights come from: the model family
//! ([`ModelKind`]), its attention (heads, RoPE or NoPE, mask, temperature) and its feed-forward
//! ([`FfnSpec`]), all in one [`LayerSpec`]. `block::config` derives these from Hugging Face
//! configs; [`crate::reference::block`] specifies the layer's forward.

use crate::spec::attention::{AttentionMask, Llama4Temperature};
use crate::spec::rope::RopeConfig;

/// Which model family a config describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelKind {
    /// Llama 2/3 (`LlamaForCausalLM`).
    Llama,
    /// Llama 4 text layers (`Llama4ForCausalLM`, or the language model of
    /// `Llama4ForConditionalGeneration`).
    Llama4,
}

impl ModelKind {
    /// The name `verify` prints (`llama3`, `llama4`).
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Llama => "llama3",
            ModelKind::Llama4 => "llama4",
        }
    }
}

/// The feed-forward of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnSpec {
    /// `down(silu(gate(x)) * up(x))`.
    Dense { intermediate: usize, bias: bool },
    /// Llama 4's MoE: top-k of the router logits, sigmoid of the chosen logits scaling each
    /// chosen expert's *input*, plus a shared expert of the same intermediate size.
    Moe { experts: usize, top_k: usize, intermediate: usize },
}

/// Everything one decoder layer needs to know, derived from a config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    pub model: ModelKind,
    /// The layer's index in the model (names its weights).
    pub index: usize,
    pub hidden: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub rms_norm_eps: f32,
    /// `None`: a NoPE layer (Llama 4).
    pub rope: Option<RopeConfig>,
    pub mask: AttentionMask,
    /// Llama 4 attention temperature tuning (NoPE layers).
    pub temperature: Option<Llama4Temperature>,
    pub attention_bias: bool,
    pub ffn: FfnSpec,
}

impl LayerSpec {
    /// Columns of the fused QKV projection: `(q_heads + 2 kv_heads) * head_dim`.
    pub fn qkv_dim(&self) -> usize {
        (self.q_heads + 2 * self.kv_heads) * self.head_dim
    }
    /// The intermediate size of the dense MLP or of the shared expert.
    pub fn intermediate(&self) -> usize {
        match self.ffn {
            FfnSpec::Dense { intermediate, .. } | FfnSpec::Moe { intermediate, .. } => intermediate,
        }
    }
    pub fn is_moe(&self) -> bool {
        matches!(self.ffn, FfnSpec::Moe { .. })
    }
    /// A short description: `llama4 layer 3 (NoPE, MoE 16x top-1)`.
    pub fn describe(&self) -> String {
        let attn = match (self.rope.is_some(), self.mask) {
            (false, _) => "NoPE".to_string(),
            (true, AttentionMask::ChunkedCausal { chunk_size }) => format!("RoPE, chunk {chunk_size}"),
            (true, _) => "RoPE".to_string(),
        };
        let ffn = match self.ffn {
            FfnSpec::Dense { .. } => "dense".to_string(),
            FfnSpec::Moe { experts, top_k, .. } => format!("MoE {experts}x top-{top_k}"),
        };
        format!("{} layer {} ({attn}, {ffn})", self.model.name(), self.index)
    }
}
