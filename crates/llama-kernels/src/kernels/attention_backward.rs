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

/// How a backward launch computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AttentionBackwardPath {
    /// CUDA cores, f32 math (every dtype and head dim).
    Simt,
    /// Tensor cores (mma.sync m16n8k16, ldmatrix): bf16 and f16 at head_dim 64 and 128.
    MmaSync,
}

macro_rules! head_dims {
    ($(($d:literal, $dq:literal, $dkdv:literal, [$($dtype:ident: $suffix:literal),*])),*) => {
        &[$($(
            ((AttentionBackwardKernel::Dq, $d, DType::$dtype), concat!($dq, $suffix)),
            ((AttentionBackwardKernel::DkDv, $d, DType::$dtype), concat!($dkdv, $suffix)),
        )*)*]
    };
}

/// The SIMT kernels ([`AttentionBackwardPath::Simt`]), by (launch, head_dim, dtype): the
/// forward's head dims and dtypes.
pub static KERNELS: KernelTable<(AttentionBackwardKernel, usize, DType)> = KernelTable {
    module: "attention_backward",
    entries: head_dims!(
        (32, "attention_bwd_dq_hd32", "attention_bwd_dkdv_hd32", [BF16: "_bf16", F16: "_f16", F32: "_f32"]),
        (64, "attention_bwd_dq_hd64", "attention_bwd_dkdv_hd64", [BF16: "_bf16", F16: "_f16", F32: "_f32"]),
        (96, "attention_bwd_dq_hd96", "attention_bwd_dkdv_hd96", [BF16: "_bf16", F16: "_f16", F32: "_f32"]),
        (128, "attention_bwd_dq_hd128", "attention_bwd_dkdv_hd128", [BF16: "_bf16", F16: "_f16", F32: "_f32"]),
        (256, "attention_bwd_dq_hd256", "attention_bwd_dkdv_hd256", [BF16: "_bf16", F16: "_f16", F32: "_f32"])
    ),
};

/// The tensor-core kernels ([`AttentionBackwardPath::MmaSync`]), by (launch, head_dim, dtype).
pub static MMA_KERNELS: KernelTable<(AttentionBackwardKernel, usize, DType)> = KernelTable {
    module: "attention_backward",
    entries: head_dims!(
        (64, "attention_bwd_dq_mma_hd64", "attention_bwd_dkdv_mma_hd64", [BF16: "_bf16", F16: "_f16"]),
        (128, "attention_bwd_dq_mma_hd128", "attention_bwd_dkdv_mma_hd128", [BF16: "_bf16", F16: "_f16"])
    ),
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    KERNELS.symbols().chain(MMA_KERNELS.symbols())
}
