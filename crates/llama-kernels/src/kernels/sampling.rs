//! The kernels of `kernels/sampling.cu`.

use super::KernelTable;
use crate::dtype::DType;

/// Every kernel, by logits dtype.
pub static KERNELS: KernelTable<DType> = KernelTable {
    module: "sampling",
    entries: &[(DType::F32, "sample_f32"), (DType::F16, "sample_f16"), (DType::BF16, "sample_bf16")],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
