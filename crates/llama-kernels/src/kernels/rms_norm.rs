//! The kernels of `kernels/rms_norm.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;

/// What the kernel normalizes: `x`, or `x + residual` (written back into the residual).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RmsNormKind {
    /// `rms_norm`.
    Plain,
    /// `fused_add_rms_norm`.
    FusedAdd,
}

/// Every kernel the wrappers may load, by (kind, access, dtype).
pub static KERNELS: KernelTable<(RmsNormKind, Access, DType)> = KernelTable {
    module: "rms_norm",
    entries: &[
        ((RmsNormKind::Plain, Access::Scalar, DType::F32), "rms_norm_f32"),
        ((RmsNormKind::Plain, Access::Scalar, DType::F16), "rms_norm_f16"),
        ((RmsNormKind::Plain, Access::Scalar, DType::BF16), "rms_norm_bf16"),
        ((RmsNormKind::Plain, Access::Vector, DType::F32), "rms_norm_vec_f32"),
        ((RmsNormKind::Plain, Access::Vector, DType::F16), "rms_norm_vec_f16"),
        ((RmsNormKind::Plain, Access::Vector, DType::BF16), "rms_norm_vec_bf16"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::F32), "fused_add_rms_norm_f32"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::F16), "fused_add_rms_norm_f16"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::BF16), "fused_add_rms_norm_bf16"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::F32), "fused_add_rms_norm_vec_f32"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::F16), "fused_add_rms_norm_vec_f16"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::BF16), "fused_add_rms_norm_vec_bf16"),
    ],
};

/// The backward, by (kind: `FusedAdd` adds `d_residual` to dx, access, dtype).
pub static BACKWARD: KernelTable<(RmsNormKind, Access, DType)> = KernelTable {
    module: "rms_norm",
    entries: &[
        ((RmsNormKind::Plain, Access::Scalar, DType::F32), "rms_norm_backward_f32"),
        ((RmsNormKind::Plain, Access::Scalar, DType::F16), "rms_norm_backward_f16"),
        ((RmsNormKind::Plain, Access::Scalar, DType::BF16), "rms_norm_backward_bf16"),
        ((RmsNormKind::Plain, Access::Vector, DType::F32), "rms_norm_backward_vec_f32"),
        ((RmsNormKind::Plain, Access::Vector, DType::F16), "rms_norm_backward_vec_f16"),
        ((RmsNormKind::Plain, Access::Vector, DType::BF16), "rms_norm_backward_vec_bf16"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::F32), "rms_norm_backward_residual_f32"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::F16), "rms_norm_backward_residual_f16"),
        ((RmsNormKind::FusedAdd, Access::Scalar, DType::BF16), "rms_norm_backward_residual_bf16"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::F32), "rms_norm_backward_residual_vec_f32"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::F16), "rms_norm_backward_residual_vec_f16"),
        ((RmsNormKind::FusedAdd, Access::Vector, DType::BF16), "rms_norm_backward_residual_vec_bf16"),
    ],
};

/// The backward's dw reduction, by dw's dtype (f32).
pub static DW_REDUCE: KernelTable<DType> =
    KernelTable { module: "rms_norm", entries: &[(DType::F32, "rms_norm_dw_reduce")] };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols().chain(BACKWARD.symbols()).chain(DW_REDUCE.symbols())
}
