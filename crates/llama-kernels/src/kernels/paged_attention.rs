//! The kernels of `kernels/paged_attention.cu`.

use super::KernelTable;
use crate::dtype::DType;

/// KV-cache append kernels by (input dtype, page dtype).
pub static APPEND_KERNELS: KernelTable<(DType, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((DType::F32, DType::F32), "kv_append_f32_f32"),
        ((DType::F32, DType::F16), "kv_append_f32_f16"),
        ((DType::F32, DType::BF16), "kv_append_f32_bf16"),
        ((DType::F32, DType::F8E4M3), "kv_append_f32_fp8"),
        ((DType::F16, DType::F32), "kv_append_f16_f32"),
        ((DType::F16, DType::F16), "kv_append_f16_f16"),
        ((DType::F16, DType::BF16), "kv_append_f16_bf16"),
        ((DType::F16, DType::F8E4M3), "kv_append_f16_fp8"),
        ((DType::BF16, DType::F32), "kv_append_bf16_f32"),
        ((DType::BF16, DType::F16), "kv_append_bf16_f16"),
        ((DType::BF16, DType::BF16), "kv_append_bf16_bf16"),
        ((DType::BF16, DType::F8E4M3), "kv_append_bf16_fp8"),
    ],
};

macro_rules! decode_entries {
    ($($d:literal),*) => {
        &[$(
            ((DType::BF16, DType::BF16, $d), concat!("paged_decode_hd", $d, "_bf16")),
            ((DType::BF16, DType::F8E4M3, $d), concat!("paged_decode_hd", $d, "_bf16_fp8")),
            ((DType::F16, DType::F16, $d), concat!("paged_decode_hd", $d, "_f16")),
            ((DType::F16, DType::F8E4M3, $d), concat!("paged_decode_hd", $d, "_f16_fp8")),
            ((DType::F32, DType::F32, $d), concat!("paged_decode_hd", $d, "_f32")),
        )*]
    };
}

/// Decode kernels by (q dtype, page dtype, head_dim).
pub static DECODE_KERNELS: KernelTable<(DType, DType, usize)> =
    KernelTable { module: "paged_attention", entries: decode_entries!(32, 64, 96, 128, 256) };

/// The tensor-core decode kernels with `LLK_DECODE_STAGES_SMALL` K/V stages (16-bit pages of the
/// q dtype, head_dim 96 and 128), by (dtype, head_dim): the configuration for GPUs where it gives
/// more resident blocks per SM (`ops::attention`'s `decode_stages`).
pub static FEW_STAGE_DECODE_KERNELS: KernelTable<(DType, usize)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((DType::BF16, 96), "paged_decode_hd96_s2_bf16"),
        ((DType::BF16, 128), "paged_decode_hd128_s2_bf16"),
        ((DType::F16, 96), "paged_decode_hd96_s2_f16"),
        ((DType::F16, 128), "paged_decode_hd128_s2_f16"),
    ],
};

/// Merge kernels by (split variant, dtype).
pub static MERGE_KERNELS: KernelTable<(bool, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((true, DType::F32), "paged_decode_merge_f32"),
        ((true, DType::F16), "paged_decode_merge_f16"),
        ((true, DType::BF16), "paged_decode_merge_bf16"),
        ((false, DType::F32), "merge_states_f32"),
        ((false, DType::F16), "merge_states_f16"),
        ((false, DType::BF16), "merge_states_bf16"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = crate::backend::KernelRef> {
    APPEND_KERNELS
        .symbols()
        .chain(DECODE_KERNELS.symbols())
        .chain(FEW_STAGE_DECODE_KERNELS.symbols())
        .chain(MERGE_KERNELS.symbols())
}
