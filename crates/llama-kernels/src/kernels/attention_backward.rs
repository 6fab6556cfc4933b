//! The kernels of `kernels/attention_backward.cu`.

use super::KernelTable;
use crate::dtype::DType;

/// The two launches of one backward call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionBackwardKernel {
    /// dQ over query-row blocks; also writes delta = rowsum(dO * O) for the second launch.
    Dq,
    /// dK and dV over key blocks of one KV head.
    DkDv,
}

macro_rules! head_dims {
    ($(($d:literal, $dq:literal, $dkdv:literal)),*) => {
        &[$(
            ((AttentionBackwardKernel::Dq, $d, DType::BF16), concat!($dq, "_bf16")),
            ((AttentionBackwardKernel::Dq, $d, DType::F16), concat!($dq, "_f16")),
            ((AttentionBackwardKernel::Dq, $d, DType::F32), concat!($dq, "_f32")),
            ((AttentionBackwardKernel::DkDv, $d, DType::BF16), concat!($dkdv, "_bf16")),
            ((AttentionBackwardKernel::DkDv, $d, DType::F16), concat!($dkdv, "_f16")),
            ((AttentionBackwardKernel::DkDv, $d, DType::F32), concat!($dkdv, "_f32")),
        )*]
    };
}

/// Every kernel, by (launch, head_dim, dtype): the forward's head dims and dtypes.
pub static KERNELS: KernelTable<(AttentionBackwardKernel, usize, DType)> = KernelTable {
    module: "attention_backward",
    entries: head_dims!(
        (32, "attention_bwd_dq_hd32", "attention_bwd_dkdv_hd32"),
        (64, "attention_bwd_dq_hd64", "attention_bwd_dkdv_hd64"),
        (96, "attention_bwd_dq_hd96", "attention_bwd_dkdv_hd96"),
        (128, "attention_bwd_dq_hd128", "attention_bwd_dkdv_hd128"),
        (256, "attention_bwd_dq_hd256", "attention_bwd_dkdv_hd256")
    ),
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols()
}
