//! The safe API: one call per op, the same on every target, at two levels.
//!
//! * The view level (`*_on` functions): borrowed [`TensorView`](crate::TensorView) inputs and
//!   [`TensorViewMut`](crate::TensorViewMut) outputs over memory the caller owns (cudarc buffers,
//!   host slices for the emulated target, or tensors), queued on an explicit [`Queue`](crate::Queue):
//!   a [`Device`](crate::Device) or an engine's `Arc<CudaStream>`.
//! * The tensor level (`rms_norm`, `Rope::apply`, ...): the same ops on [`Tensor`](crate::Tensor)s, a
//!   convenience that builds views and calls the view level.
//!
//! Each call validates its arguments (dtypes, shapes, layouts, overlaps, scalar domains) and
//! returns a named [`Error`](crate::Error) before anything reaches a kernel; then it queues a single launch.
//! Once its workspace is planned, no call allocates device memory, copies from pageable host
//! memory or waits on the host ([`Device::counters`](crate::Device::counters) proves it).

pub mod attention;
pub mod cross_entropy;
pub mod dropout;
pub mod embedding;
pub mod embedding_backward;
mod error_flag;
pub mod linear;
pub mod linear_backward;
pub mod lora;
pub mod moe;
pub mod optimizer;
pub mod qlinear;
pub mod qlinear_backward;
pub mod rms_norm;
pub mod rms_norm_backward;
pub mod rope;
pub mod sampling;
pub mod swiglu;

pub use attention::{
    AttentionArgs, AttentionMask, AttentionOptions, AttentionTensors, AttentionWorkspace, CuSeqlens, KvInput,
    KvTensors, Llama4Temperature, Offsets,
};
pub use attention::{
    DecodeArgs, DecodeShape, DecodeTensors, ErrorFlag, KvAppendArgs, KvScale, KvScales, PagedDecodeOptions,
    PagedDecodeWorkspace, PagedKvCache, PagedKvConfig, PagedKvView, kv_append_on, merge_attention_states,
    merge_attention_states_on,
};
pub use embedding::{embedding, embedding_on};
pub use linear::{linear, linear_add, linear_add_on, linear_on};
pub use linear_backward::{
    linear_backward_input, linear_backward_input_on, linear_backward_weight, linear_backward_weight_on,
};
pub use moe::{
    GemmGroups, MoeAlign, MoeFfnConfig, MoeResidual, MoeRouting, WeightLayout, moe_combine, moe_combine_on, moe_gather,
    moe_gather_on, moe_grouped_gemm, moe_grouped_gemm_on, moe_route, moe_route_on,
};
pub use qlinear_backward::{qlinear_backward_input, qlinear_backward_input_on};
pub use rms_norm::{fused_add_rms_norm, fused_add_rms_norm_on, rms_norm, rms_norm_on};
pub use rms_norm_backward::{WeightGrad, WeightGradView, rms_norm_backward, rms_norm_backward_on};
pub use rope::{Llama3Scaling, Rope, RopeConfig, RopeLayout};
pub use sampling::{SamplingBatch, SamplingTensors, SamplingViews, sample, sample_on};
pub use swiglu::{GateUp, GateUpGrad, GateUpView, swiglu, swiglu_backward, swiglu_backward_on, swiglu_on};
