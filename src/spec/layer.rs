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
    Dense {
        /// Outputs of the gate and up projections.
        intermediate: usize,
        /// Whether gate, up and down have biases (`mlp_bias`).
        bias: bool,
    },
    /// Llama 4's MoE: top-k of the router logits, sigmoid of the chosen logits scaling each
    /// chosen expert's *input*, plus a shared expert of the same intermediate size.
    Moe {
        /// Routed experts.
        experts: usize,
        /// Experts per token.
        top_k: usize,
        /// Intermediate size of every routed expert and of the shared expert.
        intermediate: usize,
    },
}

/// Everything one decoder layer needs to know, derived from a config.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LayerSpec {
    /// The model family.
    pub model: ModelKind,
    /// The layer's index in the model (names its weights).
    pub index: usize,
    /// Elements per token of the hidden states (`hidden_size`).
    pub hidden: usize,
    /// Query heads.
    pub q_heads: usize,
    /// KV heads (a divisor of `q_heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Epsilon of the layer's RMSNorms.
    pub rms_norm_eps: f32,
    /// `None`: a NoPE layer (Llama 4).
    pub rope: Option<RopeConfig>,
    /// Which keys each query attends.
    pub mask: AttentionMask,
    /// Llama 4 attention temperature tuning (NoPE layers).
    pub temperature: Option<Llama4Temperature>,
    /// Whether the q, k, v and o projections have biases.
    pub attention_bias: bool,
    /// The feed-forward.
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
    /// Whether the feed-forward is a MoE.
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
