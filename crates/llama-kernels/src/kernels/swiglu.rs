//! The kernels of `kernels/swiglu.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;
use crate::ffi::params::LlkGateUpLayout;

/// Every kernel, by (gate/up layout, access, dtype).
pub static KERNELS: KernelTable<(LlkGateUpLayout, Access, DType)> = KernelTable {
    module: "swiglu",
    entries: &[
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Scalar, DType::F32), "swiglu_f32"),
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Scalar, DType::F16), "swiglu_f16"),
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Scalar, DType::BF16), "swiglu_bf16"),
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Vector, DType::F32), "swiglu_vec_f32"),
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Vector, DType::F16), "swiglu_vec_f16"),
        ((LlkGateUpLayout::LLK_GATE_UP_SEPARATE, Access::Vector, DType::BF16), "swiglu_vec_bf16"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Scalar, DType::F32), "swiglu_interleaved_f32"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Scalar, DType::F16), "swiglu_interleaved_f16"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Scalar, DType::BF16), "swiglu_interleaved_bf16"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Vector, DType::F32), "swiglu_interleaved_vec_f32"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Vector, DType::F16), "swiglu_interleaved_vec_f16"),
        ((LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED, Access::Vector, DType::BF16), "swiglu_interleaved_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
