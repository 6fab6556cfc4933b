//! The kernels of `kernels/rope.cu`.

use super::KernelTable;
use crate::dtype::DType;
use crate::spec::rope::RopeLayout;

/// Every kernel, by (layout, vectorized, qk-norm, dtype).
pub static KERNELS: KernelTable<(RopeLayout, bool, bool, DType)> = KernelTable {
    module: "rope",
    entries: &[
        ((RopeLayout::Interleaved, false, false, DType::F32), "rope_interleaved_f32"),
        ((RopeLayout::Interleaved, false, false, DType::F16), "rope_interleaved_f16"),
        ((RopeLayout::Interleaved, false, false, DType::BF16), "rope_interleaved_bf16"),
        ((RopeLayout::Interleaved, true, false, DType::F32), "rope_interleaved_vec_f32"),
        ((RopeLayout::Interleaved, true, false, DType::F16), "rope_interleaved_vec_f16"),
        ((RopeLayout::Interleaved, true, false, DType::BF16), "rope_interleaved_vec_bf16"),
        ((RopeLayout::Interleaved, false, true, DType::F32), "rope_interleaved_norm_f32"),
        ((RopeLayout::Interleaved, false, true, DType::F16), "rope_interleaved_norm_f16"),
        ((RopeLayout::Interleaved, false, true, DType::BF16), "rope_interleaved_norm_bf16"),
        ((RopeLayout::Interleaved, true, true, DType::F32), "rope_interleaved_norm_vec_f32"),
        ((RopeLayout::Interleaved, true, true, DType::F16), "rope_interleaved_norm_vec_f16"),
        ((RopeLayout::Interleaved, true, true, DType::BF16), "rope_interleaved_norm_vec_bf16"),
        ((RopeLayout::HalfSplit, false, false, DType::F32), "rope_half_split_f32"),
        ((RopeLayout::HalfSplit, false, false, DType::F16), "rope_half_split_f16"),
        ((RopeLayout::HalfSplit, false, false, DType::BF16), "rope_half_split_bf16"),
        ((RopeLayout::HalfSplit, true, false, DType::F32), "rope_half_split_vec_f32"),
        ((RopeLayout::HalfSplit, true, false, DType::F16), "rope_half_split_vec_f16"),
        ((RopeLayout::HalfSplit, true, false, DType::BF16), "rope_half_split_vec_bf16"),
        ((RopeLayout::HalfSplit, false, true, DType::F32), "rope_half_split_norm_f32"),
        ((RopeLayout::HalfSplit, false, true, DType::F16), "rope_half_split_norm_f16"),
        ((RopeLayout::HalfSplit, false, true, DType::BF16), "rope_half_split_norm_bf16"),
        ((RopeLayout::HalfSplit, true, true, DType::F32), "rope_half_split_norm_vec_f32"),
        ((RopeLayout::HalfSplit, true, true, DType::F16), "rope_half_split_norm_vec_f16"),
        ((RopeLayout::HalfSplit, true, true, DType::BF16), "rope_half_split_norm_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
