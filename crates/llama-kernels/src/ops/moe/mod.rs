//! Mixture-of-experts feed-forward on the device (kernels/moe.cu): top-k routing, the expert
//! permutation, the grouped expert GEMM on tensor cores and the weighted combine.
//! [`MoeFfn`] composes them into a whole layer with its shared expert.
//!
//! ```text
//! logits [T, E] --moe_route--> ids [T, k] i32, weights [T, k] f32
//! ids --MoeAlign::align--> counts [E], offsets [E + 1], rows [T k], block -> expert map (device)
//! x [T, H] --moe_gather--> xp [R, H]        (R: the padded row capacity; Llama 4 scales by w)
//! xp --moe_grouped_gemm (SwiGLU)--> h [R, I] --moe_grouped_gemm--> y [R, H]
//! y --moe_combine--> out [T, H] = sum_j (w_tj) y[row(t, j)] (+ shared expert) (+ residual)
//! ```
//!
//! Nothing waits on the host: expert token counts stay on the device, every grid is sized by an
//! upper bound the host knows (`tokens * k` and the number of experts), and blocks past the real
//! work exit after one read. A planned [`MoeFfn`] forward allocates nothing and copies nothing, so
//! it can be captured in a CUDA graph.
//!
//! ```
//! use llama_kernels::ops::moe::{GateUpTensors, MoeFfn, MoeFfnConfig, MoeFfnWeights, WeightLayout};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (hidden, inter, experts, tokens) = (64, 64, 4, 3);
//! let t = |shape: &[usize]| Tensor::zeros(&device, DType::BF16, shape);
//! // Hugging Face Llama 4 layout: gate_up_proj [E, hidden, 2I], down_proj [E, I, hidden].
//! let weights = MoeFfnWeights {
//!     router: t(&[experts, hidden])?,
//!     router_bias: None,
//!     layout: WeightLayout::InOut,
//!     gate_up: GateUpTensors::Packed(t(&[experts, hidden, 2 * inter])?),
//!     down: t(&[experts, inter, hidden])?,
//!     shared: None,
//! };
//! let config = MoeFfnConfig::llama4(hidden, inter, experts, 1);
//! let mut ffn = MoeFfn::plan(&device, config, weights, 16)?;
//! let (x, out) = (t(&[tokens, hidden])?, t(&[tokens, hidden])?);
//! ffn.forward(&x, None, &out)?;
//! # Ok(())
//! # }
//! ```
//!
//! Routing modes ([`MoeRouting`]: Llama 4, softmax top-k, DeepSeek-V3 grouped), the ranking of
//! experts (ties to the lower index, NaN last), the permutation and the combine order are
//! specified once, in [`crate::reference::moe`]; the kernels compute exactly that.
//!
//! Limits: experts 1..=512, k <= 8 (16 for grouped routing), `n_group <= 32`, group size >= 2.
//!
//! Weight layouts ([`WeightLayout`]): [`WeightLayout::InOut`] is `[experts, in, out]` with
//! `y = x @ W[e]` (Hugging Face Llama 4 `experts.gate_up_proj [E, hidden, 2I]` and
//! `experts.down_proj [E, I, hidden]`); [`WeightLayout::OutIn`] is `[experts, out, in]`, one
//! `nn.Linear` per expert stacked (Mixtral `w1`/`w3` `[E, I, hidden]`, `w2` `[E, hidden, I]`).
//! Both are read in place, by strides: no repack. The SwiGLU epilogue takes the gate and up
//! columns packed in one tensor (gate first, as Llama 4's `gate_up_proj` and a fused gate-up
//! projection) or as two tensors with the same strides.

mod align;
mod combine;
mod ffn;
mod gather;
mod grouped_gemm;
mod route;
mod rows;

pub use crate::spec::moe::{MoeFfnConfig, MoeRouting, WeightLayout};
pub use align::{BLOCK_M, BLOCK_M_DECODE, MoeAlign};
#[doc(hidden)]
pub use align::{padded_rows, preferred_block_m};
pub use combine::{MoeResidual, moe_combine, moe_combine_on};
pub use ffn::{GateUpTensors, MoeFfn, MoeFfnStages, MoeFfnWeights, MoeWorkspace, SharedExpertTensors};
pub use gather::{moe_gather, moe_gather_on};
pub use grouped_gemm::{ExpertWeights, ExpertWeightsView, GemmGroups, moe_grouped_gemm, moe_grouped_gemm_on};
pub(crate) use route::check_routing;
pub use route::{MAX_EXPERTS, MAX_GROUPS, MAX_TOP_K, MAX_TOP_K_GROUPED, moe_route, moe_route_on};
