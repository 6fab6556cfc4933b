//! The kernels of `kernels/rope.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;
use crate::ffi::params::LlkRopeNorm;
use crate::spec::rope::RopeLayout;

/// Every kernel, by (layout, access, qk-norm, dtype).
pub static KERNELS: KernelTable<(RopeLayout, Access, LlkRopeNorm, DType)> = KernelTable {
    module: "rope",
    entries: &[
        ((RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F32), "rope_interleaved_f32"),
        ((RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F16), "rope_interleaved_f16"),
        (
            (RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::BF16),
            "rope_interleaved_bf16",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F32),
            "rope_interleaved_vec_f32",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F16),
            "rope_interleaved_vec_f16",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::BF16),
            "rope_interleaved_vec_bf16",
        ),
        (
            (RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F32),
            "rope_interleaved_norm_f32",
        ),
        (
            (RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F16),
            "rope_interleaved_norm_f16",
        ),
        (
            (RopeLayout::Interleaved, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::BF16),
            "rope_interleaved_norm_bf16",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F32),
            "rope_interleaved_norm_vec_f32",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F16),
            "rope_interleaved_norm_vec_f16",
        ),
        (
            (RopeLayout::Interleaved, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::BF16),
            "rope_interleaved_norm_vec_bf16",
        ),
        ((RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F32), "rope_half_split_f32"),
        ((RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F16), "rope_half_split_f16"),
        ((RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::BF16), "rope_half_split_bf16"),
        ((RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F32), "rope_half_split_vec_f32"),
        ((RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::F16), "rope_half_split_vec_f16"),
        (
            (RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_NO_NORM, DType::BF16),
            "rope_half_split_vec_bf16",
        ),
        (
            (RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F32),
            "rope_half_split_norm_f32",
        ),
        (
            (RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F16),
            "rope_half_split_norm_f16",
        ),
        (
            (RopeLayout::HalfSplit, Access::Scalar, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::BF16),
            "rope_half_split_norm_bf16",
        ),
        (
            (RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F32),
            "rope_half_split_norm_vec_f32",
        ),
        (
            (RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::F16),
            "rope_half_split_norm_vec_f16",
        ),
        (
            (RopeLayout::HalfSplit, Access::Vector, LlkRopeNorm::LLK_ROPE_L2_NORM, DType::BF16),
            "rope_half_split_norm_vec_bf16",
        ),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
