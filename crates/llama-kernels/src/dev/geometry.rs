//! The launch geometry of every kernel, from its one home, for tools that model the kernels
//! (the `llama-kernels-inspect` crate): the constants both sides of the ABI share
//! (`kernels/params.h`, [`params`]), the kernel tables ([`kernels`]) and the planners the ops
//! launch with. Nothing here restates a number: each item is the one the ops use.

pub use crate::ffi::params;
/// The kernel tables of every family: the symbols the wrappers load, by what they select on.
pub mod kernels {
    pub use crate::kernels::{
        KernelTable, attention, attention_sm90, embedding, moe, paged_attention, qlinear, rms_norm, rope, sampling,
        swiglu,
    };
}
pub use crate::ops::attention::decode_launch::decode_stages_of;
pub use crate::ops::attention::prefill_launch::sm90_keys;
