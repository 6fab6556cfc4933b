//! The kernels of `kernels/rms_norm.cu`.

use super::KernelTable;
use crate::dtype::DType;

/// Every kernel the wrappers may load, by (fused, vectorized, dtype).
pub static KERNELS: KernelTable<(bool, bool, DType)> = KernelTable {
    module: "rms_norm",
    entries: &[
        ((false, false, DType::F32), "rms_norm_f32"),
        ((false, false, DType::F16), "rms_norm_f16"),
        ((false, false, DType::BF16), "rms_norm_bf16"),
        ((false, true, DType::F32), "rms_norm_vec_f32"),
        ((false, true, DType::F16), "rms_norm_vec_f16"),
        ((false, true, DType::BF16), "rms_norm_vec_bf16"),
        ((true, false, DType::F32), "fused_add_rms_norm_f32"),
        ((true, false, DType::F16), "fused_add_rms_norm_f16"),
        ((true, false, DType::BF16), "fused_add_rms_norm_bf16"),
        ((true, true, DType::F32), "fused_add_rms_norm_vec_f32"),
        ((true, true, DType::F16), "fused_add_rms_norm_vec_f16"),
        ((true, true, DType::BF16), "fused_add_rms_norm_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
