//! The kernels of `kernels/cross_entropy.cu`.

use super::{Access, KernelTable};
use crate::backend::KernelRef;
use crate::dtype::DType;

/// The per-row kernel (loss and gradient), by (access, dtype).
pub static ROWS: KernelTable<(Access, DType)> = KernelTable {
    module: "cross_entropy",
    entries: &[
        ((Access::Scalar, DType::F32), "cross_entropy_f32"),
        ((Access::Scalar, DType::F16), "cross_entropy_f16"),
        ((Access::Scalar, DType::BF16), "cross_entropy_bf16"),
        ((Access::Vector, DType::F32), "cross_entropy_vec_f32"),
        ((Access::Vector, DType::F16), "cross_entropy_vec_f16"),
        ((Access::Vector, DType::BF16), "cross_entropy_vec_bf16"),
    ],
};

/// The count of labels that are not `ignore_index` (one block).
pub const COUNT: KernelRef = KernelRef { module: "cross_entropy", symbol: "cross_entropy_count" };
/// The reduction of the per-row losses (one block).
pub const REDUCE: KernelRef = KernelRef { module: "cross_entropy", symbol: "cross_entropy_reduce" };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = KernelRef> {
    ROWS.symbols().chain([COUNT, REDUCE])
}
