//! The kernels of `kernels/swiglu.cu`.

use super::KernelTable;
use crate::dtype::DType;

/// Every kernel, by (interleaved, vectorized, dtype).
pub static KERNELS: KernelTable<(bool, bool, DType)> = KernelTable {
    module: "swiglu",
    entries: &[
        ((false, false, DType::F32), "swiglu_f32"),
        ((false, false, DType::F16), "swiglu_f16"),
        ((false, false, DType::BF16), "swiglu_bf16"),
        ((false, true, DType::F32), "swiglu_vec_f32"),
        ((false, true, DType::F16), "swiglu_vec_f16"),
        ((false, true, DType::BF16), "swiglu_vec_bf16"),
        ((true, false, DType::F32), "swiglu_interleaved_f32"),
        ((true, false, DType::F16), "swiglu_interleaved_f16"),
        ((true, false, DType::BF16), "swiglu_interleaved_bf16"),
        ((true, true, DType::F32), "swiglu_interleaved_vec_f32"),
        ((true, true, DType::F16), "swiglu_interleaved_vec_f16"),
        ((true, true, DType::BF16), "swiglu_interleaved_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
