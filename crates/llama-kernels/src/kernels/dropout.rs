//! The kernels of `kernels/dropout.cu`.

use super::{Access, KernelTable};
use crate::dtype::DType;

/// Every kernel, by (access, dtype).
pub static KERNELS: KernelTable<(Access, DType)> = KernelTable {
    module: "dropout",
    entries: &[
        ((Access::Scalar, DType::F32), "dropout_f32"),
        ((Access::Scalar, DType::F16), "dropout_f16"),
        ((Access::Scalar, DType::BF16), "dropout_bf16"),
        ((Access::Vector, DType::F32), "dropout_vec_f32"),
        ((Access::Vector, DType::F16), "dropout_vec_f16"),
        ((Access::Vector, DType::BF16), "dropout_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
