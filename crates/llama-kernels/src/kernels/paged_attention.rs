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
            (($d, DType::BF16, DType::BF16), concat!("paged_decode_hd", $d, "_bf16")),
            (($d, DType::F8E4M3, DType::BF16), concat!("paged_decode_hd", $d, "_bf16_fp8")),
            (($d, DType::F16, DType::F16), concat!("paged_decode_hd", $d, "_f16")),
            (($d, DType::F8E4M3, DType::F16), concat!("paged_decode_hd", $d, "_f16_fp8")),
            (($d, DType::F32, DType::F32), concat!("paged_decode_hd", $d, "_f32")),
        )*]
    };
}

/// Decode kernels by (head_dim, page dtype, q dtype).
pub static DECODE_KERNELS: KernelTable<(usize, DType, DType)> =
    KernelTable { module: "paged_attention", entries: decode_entries!(32, 64, 96, 128, 256) };

/// The tensor-core decode kernels with `LLK_DECODE_STAGES_SMALL` K/V stages (16-bit pages of the
/// q dtype, head_dim 96 and 128), by (head_dim, dtype): the configuration for GPUs where it gives
/// more resident blocks per SM (`ops::attention`'s `decode_config`).
pub static FEW_STAGE_DECODE_KERNELS: KernelTable<(usize, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((96, DType::BF16), "paged_decode_hd96_s2_bf16"),
        ((128, DType::BF16), "paged_decode_hd128_s2_bf16"),
        ((96, DType::F16), "paged_decode_hd96_s2_f16"),
        ((128, DType::F16), "paged_decode_hd128_s2_f16"),
    ],
};

/// What a merge kernel combines: the splits of a split-KV decode (in the decode workspace's f32
/// partials), or two attention states of any strides (`merge_attention_states`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MergeSource {
    /// A decode's splits.
    Splits,
    /// Two attention states.
    TwoStates,
}

/// Merge kernels by (source, dtype).
pub static MERGE_KERNELS: KernelTable<(MergeSource, DType)> = KernelTable {
    module: "paged_attention",
    entries: &[
        ((MergeSource::Splits, DType::F32), "paged_decode_merge_f32"),
        ((MergeSource::Splits, DType::F16), "paged_decode_merge_f16"),
        ((MergeSource::Splits, DType::BF16), "paged_decode_merge_bf16"),
        ((MergeSource::TwoStates, DType::F32), "merge_states_f32"),
        ((MergeSource::TwoStates, DType::F16), "merge_states_f16"),
        ((MergeSource::TwoStates, DType::BF16), "merge_states_bf16"),
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
