//! The kernels of `kernels/embedding.cu`.

use super::KernelTable;
use crate::backend::KernelRef;
use crate::dtype::DType;

/// Every kernel, by (vectorized, dtype).
pub(crate) static KERNELS: KernelTable<(bool, DType)> = KernelTable {
    module: "embedding",
    entries: &[
        ((false, DType::F32), "embedding_f32"),
        ((false, DType::F16), "embedding_f16"),
        ((false, DType::BF16), "embedding_bf16"),
        ((true, DType::F32), "embedding_vec_f32"),
        ((true, DType::F16), "embedding_vec_f16"),
        ((true, DType::BF16), "embedding_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
pub(crate) fn symbols() -> impl Iterator<Item = KernelRef> {
    KERNELS.symbols()
}
