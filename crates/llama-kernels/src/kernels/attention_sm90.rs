//! The kernels of `kernels/attention_sm90.cu`: Hopper prefill attention (TMA, wgmma, warp
//! specialization) for bf16 and f16 at head_dim 64, 128 and 256.

use super::KernelTable;
use crate::dtype::DType;

/// Every kernel, by (dtype, head_dim).
pub static KERNELS: KernelTable<(DType, usize)> = KernelTable {
    module: "attention_sm90",
    entries: &[
        ((DType::BF16, 64), "attention_sm90_hd64_bf16"),
        ((DType::BF16, 128), "attention_sm90_hd128_bf16"),
        ((DType::BF16, 256), "attention_sm90_hd256_bf16"),
        ((DType::F16, 64), "attention_sm90_hd64_f16"),
        ((DType::F16, 128), "attention_sm90_hd128_f16"),
        ((DType::F16, 256), "attention_sm90_hd256_f16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
