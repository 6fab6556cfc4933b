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

macro_rules! backward {
    ($($layout:ident $prefix:literal),*) => {
        &[$(
            ((LlkGateUpLayout::$layout, Access::Scalar, DType::F32), concat!($prefix, "_f32")),
            ((LlkGateUpLayout::$layout, Access::Scalar, DType::F16), concat!($prefix, "_f16")),
            ((LlkGateUpLayout::$layout, Access::Scalar, DType::BF16), concat!($prefix, "_bf16")),
            ((LlkGateUpLayout::$layout, Access::Vector, DType::F32), concat!($prefix, "_vec_f32")),
            ((LlkGateUpLayout::$layout, Access::Vector, DType::F16), concat!($prefix, "_vec_f16")),
            ((LlkGateUpLayout::$layout, Access::Vector, DType::BF16), concat!($prefix, "_vec_bf16")),
        )*]
    };
}

/// The backward, by (gate/up layout, access, dtype).
pub static BACKWARD: KernelTable<(LlkGateUpLayout, Access, DType)> = KernelTable {
    module: "swiglu",
    entries: backward!(LLK_GATE_UP_SEPARATE "swiglu_backward", LLK_GATE_UP_INTERLEAVED "swiglu_backward_interleaved"),
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols().chain(BACKWARD.symbols())
}
