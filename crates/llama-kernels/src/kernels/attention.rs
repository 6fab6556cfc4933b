//! The kernels of `kernels/attention.cu`.

use super::KernelTable;
use crate::backend::KernelRef;
use crate::dtype::DType;

/// Head dims with prefill and decode kernels (the instantiation lists of attention.cu and
/// paged_attention.cu).
pub const SUPPORTED_HEAD_DIMS: [usize; 5] = [32, 64, 96, 128, 256];

/// Every kernel, by (head_dim, dtype).
pub static KERNELS: KernelTable<(usize, DType)> = KernelTable {
    module: "attention",
    entries: &[
        ((32, DType::BF16), "attention_hd32_bf16"),
        ((64, DType::BF16), "attention_hd64_bf16"),
        ((96, DType::BF16), "attention_hd96_bf16"),
        ((128, DType::BF16), "attention_hd128_bf16"),
        ((256, DType::BF16), "attention_hd256_bf16"),
        ((32, DType::F16), "attention_hd32_f16"),
        ((64, DType::F16), "attention_hd64_f16"),
        ((96, DType::F16), "attention_hd96_f16"),
        ((128, DType::F16), "attention_hd128_f16"),
        ((256, DType::F16), "attention_hd256_f16"),
        ((32, DType::F32), "attention_hd32_f32"),
        ((64, DType::F32), "attention_hd64_f32"),
        ((96, DType::F32), "attention_hd96_f32"),
        ((128, DType::F32), "attention_hd128_f32"),
        ((256, DType::F32), "attention_hd256_f32"),
    ],
};

/// The tensor-core kernels with `LLK_ATTN_KEYS_SMALL`-key tiles (head_dim 96 and 128), by
/// (head_dim, dtype): the configuration for GPUs whose SM holds two of these blocks but not two of
/// the 64-key ones (`ops::attention`'s `mma_keys`).
pub static SMALL_KEY_KERNELS: KernelTable<(usize, DType)> = KernelTable {
    module: "attention",
    entries: &[
        ((96, DType::BF16), "attention_hd96_k32_bf16"),
        ((128, DType::BF16), "attention_hd128_k32_bf16"),
        ((96, DType::F16), "attention_hd96_k32_f16"),
        ((128, DType::F16), "attention_hd128_k32_f16"),
    ],
};

/// The plan kernel for device-resident sequence offsets.
pub const PLAN: KernelRef = KernelRef { module: "attention", symbol: "attention_plan" };

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = KernelRef> {
    KERNELS.symbols().chain(SMALL_KEY_KERNELS.symbols()).chain(std::iter::once(PLAN))
}
