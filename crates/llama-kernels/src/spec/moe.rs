//! What a mixture-of-experts feed-forward computes: how tokens choose experts
//! ([`MoeRouting`]), how stacked expert weights are laid out ([`WeightLayout`]) and the shapes
//! of one layer ([`MoeFfnConfig`]). The f64 specification is [`crate::reference::moe`].

/// How tokens choose experts, and what each choice weighs. [`crate::reference::moe`] states each mode exactly.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MoeRouting {
    /// Top-k of the logits; weight `sigmoid(logit)`.
    Llama4,
    /// Softmax over all experts, top-k; `renormalize` divides the k weights by their sum.
    Softmax {
        /// Divides the k chosen weights by their sum.
        renormalize: bool,
    },
    /// DeepSeek-V3 grouped top-k over `sigmoid(logit) + bias` (bias optional).
    Grouped {
        /// Expert groups: divides the experts, at least 2 experts per group.
        n_group: usize,
        /// Groups kept per token (1..=`n_group`), by the sum of their two best keys.
        topk_group: usize,
        /// Divides the k chosen weights by their sum (plus 1e-20).
        renormalize: bool,
        /// Multiplies every weight, after renormalizing (finite).
        routed_scaling_factor: f32,
    },
}

/// How stacked expert weights are laid out; both are read in place through their strides.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `[experts, in, out]`, `y = x @ W[e]` (Hugging Face Llama 4 experts).
    InOut,
    /// `[experts, out, in]`, `y = x @ W[e]^T` (one `nn.Linear` per expert, stacked).
    OutIn,
}

/// The routing and shapes of a MoE layer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MoeFfnConfig {
    /// Elements per token of the input and output.
    pub hidden: usize,
    /// Each routed expert's intermediate size.
    pub intermediate: usize,
    /// Routed experts (1..=[`MAX_EXPERTS`](crate::ops::moe::MAX_EXPERTS)).
    pub experts: usize,
    /// Experts per token: at most `experts` and [`MAX_TOP_K`](crate::ops::moe::MAX_TOP_K)
    /// ([`MAX_TOP_K_GROUPED`](crate::ops::moe::MAX_TOP_K_GROUPED) with grouped routing).
    pub top_k: usize,
    /// How tokens choose experts, and what each choice weighs.
    pub routing: MoeRouting,
    /// Llama 4: the routing weight scales each expert's *input* (gather), and combine sums the
    /// expert outputs unweighted. Otherwise combine weights the outputs (Mixtral, Qwen, DeepSeek).
    pub weights_on_input: bool,
}

impl MoeFfnConfig {
    /// Llama 4 (Scout: 16 experts, Maverick: 128; top-1, sigmoid weights on the input).
    pub fn llama4(hidden: usize, intermediate: usize, experts: usize, top_k: usize) -> Self {
        MoeFfnConfig { hidden, intermediate, experts, top_k, routing: MoeRouting::Llama4, weights_on_input: true }
    }
    /// Mixtral (softmax top-2, renormalized, weights on the output).
    pub fn mixtral(hidden: usize, intermediate: usize, experts: usize, top_k: usize) -> Self {
        MoeFfnConfig {
            hidden,
            intermediate,
            experts,
            top_k,
            routing: MoeRouting::Softmax { renormalize: true },
            weights_on_input: false,
        }
    }
}
