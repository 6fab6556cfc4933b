//! The kernels of `kernels/attention.cu`.

use super::KernelTable;
use crate::backend::KernelRef;
use crate::dtype::DType;

/// Head dims with prefill and decode kernels (the instantiation lists of attention.cu and
/// paged_attention.cu).
pub const SUPPORTED_HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// Every kernel, by (dtype, head_dim).
pub static KERNELS: KernelTable<(DType, usize)> = KernelTable {
    module: "attention",
    entries: &[
        ((DType::BF16, 32), "attention_hd32_bf16"),
        ((DType::BF16, 64), "attention_hd64_bf16"),
        ((DType::BF16, 96), "attention_hd96_bf16"),
        ((DType::BF16, 128), "attention_hd128_bf16"),
        ((DType::BF16, 256), "attention_hd256_bf16"),
        ((DType::F16, 32), "attention_hd32_f16"),
        ((DType::F16, 64), "attention_hd64_f16"),
        ((DType::F16, 96), "attention_hd96_f16"),
        ((DType::F16, 128), "attention_hd128_f16"),
        ((DType::F16, 256), "attention_hd256_f16"),
        ((DType::F32, 32), "attention_hd32_f32"),
        ((DType::F32, 64), "attention_hd64_f32"),
        ((DType::F32, 96), "attention_hd96_f32"),
        ((DType::F32, 128), "attention_hd128_f32"),
        ((DType::F32, 256), "attention_hd256_f32"),
    ],
};

/// The tensor-core kernels with `LLK_ATTN_KEYS_SMALL`-key tiles (head_dim 96 and 128), by
/// (dtype, head_dim): the configuration for GPUs whose SM holds two of these blocks but not two of
/// the 64-key ones (`ops::attention`'s `mma_keys`).
pub static SMALL_KEY_KERNELS: KernelTable<(DType, usize)> = KernelTable {
    module: "attention",
    entries: &[
        ((DType::BF16, 96), "attention_hd96_k32_bf16"),
        ((DType::BF16, 128), "attention_hd128_k32_bf16"),
        ((DType::F16, 96), "attention_hd96_k32_f16"),
        ((DType::F16, 128), "attention_hd128_k32_f16"),
    ],
};

/// The plan kernel for device-resident sequence offsets.
pub const PLAN: KernelRef = KernelRef { module: "attention", symbol: "attention_plan" };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = KernelRef> {
    KERNELS.symbols().chain(SMALL_KEY_KERNELS.symbols()).chain(std::iter::once(PLAN))
}
