//! What one decoder layer is, independent of where its weights come from: the model family
//! ([`ModelKind`]), its attention (heads, RoPE or NoPE, mask, temperature) and its feed-forward
//! ([`FfnSpec`]), all in one [`LayerSpec`]. `block::config` derives these from Hugging Face
//! configs; [`crate::reference::block`] specifies the layer's forward.

use crate::error::{Error, Result};
use crate::spec::attention::{AttentionMask, Llama4Temperature};
use crate::spec::rope::RopeConfig;

/// Largest hidden or intermediate size of a layer (Llama 3.1 405B: 16384 and 53248).
pub const MAX_WIDTH: usize = 1 << 20;
/// Most attention heads (query or key/value) of a layer (Llama 3.1 405B has 128).
pub const MAX_HEADS: usize = 1024;

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
    /// Checks the sizes: every count positive and at most [`MAX_WIDTH`] or [`MAX_HEADS`], KV heads
    /// dividing the query heads, and a MoE's `top_k` at most its expert count, so that every
    /// derived size (such as [`LayerSpec::qkv_dim`]) is exact.
    pub fn check(&self) -> Result<()> {
        const OP: &str = "LayerSpec";
        let sizes = [
            ("hidden", self.hidden, MAX_WIDTH),
            ("q_heads", self.q_heads, MAX_HEADS),
            ("kv_heads", self.kv_heads, MAX_HEADS),
            ("head_dim", self.head_dim, MAX_WIDTH),
            ("intermediate", self.intermediate(), MAX_WIDTH),
        ];
        for (what, v, max) in sizes {
            if v == 0 || v > max {
                return Err(Error::invalid(OP, what, v, format!("must be 1..={max}")));
            }
        }
        if self.q_heads % self.kv_heads != 0 {
            return Err(Error::invalid(OP, "kv_heads", self.kv_heads, format!("must divide q_heads {}", self.q_heads)));
        }
        if let FfnSpec::Moe { experts, top_k, .. } = self.ffn {
            if experts == 0 || top_k == 0 || top_k > experts {
                return Err(Error::invalid(OP, "top_k", top_k, format!("must be 1..={experts} (the experts)")));
            }
        }
        Ok(())
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
