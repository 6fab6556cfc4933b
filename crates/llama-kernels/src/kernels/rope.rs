//! The kernels of `kernels/rope.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;
use crate::spec::rope::RopeLayout;

/// What a RoPE kernel computes (the `Variant` template parameter of kernels/rope.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RopeKernel {
    /// The rotation; with `LLK_ROPE_BACKWARD`, its transpose (the plain backward).
    Rotate,
    /// The rotation, then Llama 4's qk L2 norm.
    Norm,
    /// The backward of rotation + qk-norm, from the forward's saved input.
    NormBackward,
}

macro_rules! variants {
    ($(($layout:ident, $kernel:ident, $prefix:literal)),*) => {
        &[$(
            ((RopeLayout::$layout, Access::Scalar, RopeKernel::$kernel, DType::F32), concat!($prefix, "_f32")),
            ((RopeLayout::$layout, Access::Scalar, RopeKernel::$kernel, DType::F16), concat!($prefix, "_f16")),
            ((RopeLayout::$layout, Access::Scalar, RopeKernel::$kernel, DType::BF16), concat!($prefix, "_bf16")),
            ((RopeLayout::$layout, Access::Vector, RopeKernel::$kernel, DType::F32), concat!($prefix, "_vec_f32")),
            ((RopeLayout::$layout, Access::Vector, RopeKernel::$kernel, DType::F16), concat!($prefix, "_vec_f16")),
            ((RopeLayout::$layout, Access::Vector, RopeKernel::$kernel, DType::BF16), concat!($prefix, "_vec_bf16")),
        )*]
    };
}

/// Every kernel, by (layout, access, variant, dtype).
pub static KERNELS: KernelTable<(RopeLayout, Access, RopeKernel, DType)> = KernelTable {
    module: "rope",
    entries: variants!(
        (Interleaved, Rotate, "rope_interleaved"),
        (HalfSplit, Rotate, "rope_half_split"),
        (Interleaved, Norm, "rope_interleaved_norm"),
        (HalfSplit, Norm, "rope_half_split_norm"),
        (Interleaved, NormBackward, "rope_interleaved_norm_backward"),
        (HalfSplit, NormBackward, "rope_half_split_norm_backward")
    ),
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
