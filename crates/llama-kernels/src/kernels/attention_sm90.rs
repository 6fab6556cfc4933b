//! The kernels of `kernels/attention_sm90.cu`: Hopper prefill attention (TMA, wgmma, warp
//! specialization) for bf16 and f16 at head_dim 64, 128 and 256.

use super::KernelTable;
use crate::dtype::DType;

/// Every kernel, by (head_dim, dtype).
pub static KERNELS: KernelTable<(usize, DType)> = KernelTable {
    module: "attention_sm90",
    entries: &[
        ((64, DType::BF16), "attention_sm90_hd64_bf16"),
        ((128, DType::BF16), "attention_sm90_hd128_bf16"),
        ((256, DType::BF16), "attention_sm90_hd256_bf16"),
        ((64, DType::F16), "attention_sm90_hd64_f16"),
        ((128, DType::F16), "attention_sm90_hd128_f16"),
        ((256, DType::F16), "attention_sm90_hd256_f16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
