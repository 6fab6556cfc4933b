//! The kernels of `kernels/moe.cu`.

use super::KernelTable;
use crate::backend::KernelRef;
use crate::dtype::DType;
use crate::spec::moe::WeightLayout;

/// Route kernels by (mode, experts <= 128, dtype).
pub static ROUTE: KernelTable<(u8, bool, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((0, true, DType::F32), "moe_route_llama4_e128_f32"),
        ((0, false, DType::F32), "moe_route_llama4_e512_f32"),
        ((1, true, DType::F32), "moe_route_softmax_e128_f32"),
        ((1, false, DType::F32), "moe_route_softmax_e512_f32"),
        ((2, true, DType::F32), "moe_route_grouped_e128_f32"),
        ((2, false, DType::F32), "moe_route_grouped_e512_f32"),
        ((0, true, DType::F16), "moe_route_llama4_e128_f16"),
        ((0, false, DType::F16), "moe_route_llama4_e512_f16"),
        ((1, true, DType::F16), "moe_route_softmax_e128_f16"),
        ((1, false, DType::F16), "moe_route_softmax_e512_f16"),
        ((2, true, DType::F16), "moe_route_grouped_e128_f16"),
        ((2, false, DType::F16), "moe_route_grouped_e512_f16"),
        ((0, true, DType::BF16), "moe_route_llama4_e128_bf16"),
        ((0, false, DType::BF16), "moe_route_llama4_e512_bf16"),
        ((1, true, DType::BF16), "moe_route_softmax_e128_bf16"),
        ((1, false, DType::BF16), "moe_route_softmax_e512_bf16"),
        ((2, true, DType::BF16), "moe_route_grouped_e128_bf16"),
        ((2, false, DType::BF16), "moe_route_grouped_e512_bf16"),
    ],
};

/// Align, pass 1: the per-expert token counts.
pub const ALIGN_HISTOGRAM: KernelRef = KernelRef { module: "moe", symbol: "moe_align_histogram" };
/// Align, pass 2: the padded offsets and the block -> expert map.
pub const ALIGN_SCAN: KernelRef = KernelRef { module: "moe", symbol: "moe_align_scan" };
/// Align, pass 3: each routed slot into its expert-contiguous row.
pub const ALIGN_SCATTER: KernelRef = KernelRef { module: "moe", symbol: "moe_align_scatter" };

/// Gather kernels by (vectorized, dtype).
pub static GATHER: KernelTable<(bool, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((false, DType::F32), "moe_gather_f32"),
        ((false, DType::F16), "moe_gather_f16"),
        ((false, DType::BF16), "moe_gather_bf16"),
        ((true, DType::F32), "moe_gather_vec_f32"),
        ((true, DType::F16), "moe_gather_vec_f16"),
        ((true, DType::BF16), "moe_gather_vec_bf16"),
    ],
};
/// Combine kernels by (vectorized, dtype).
pub static COMBINE: KernelTable<(bool, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((false, DType::F32), "moe_combine_f32"),
        ((false, DType::F16), "moe_combine_f16"),
        ((false, DType::BF16), "moe_combine_bf16"),
        ((true, DType::F32), "moe_combine_vec_f32"),
        ((true, DType::F16), "moe_combine_vec_f16"),
        ((true, DType::BF16), "moe_combine_vec_bf16"),
    ],
};

/// Grouped GEMM kernels by (layout, SwiGLU, block rows, dtype).
pub static GEMM: KernelTable<(WeightLayout, bool, usize, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((WeightLayout::InOut, false, 64, DType::BF16), "moe_grouped_gemm_kn_plain_m64_bf16"),
        ((WeightLayout::InOut, true, 64, DType::BF16), "moe_grouped_gemm_kn_swiglu_m64_bf16"),
        ((WeightLayout::OutIn, false, 64, DType::BF16), "moe_grouped_gemm_nk_plain_m64_bf16"),
        ((WeightLayout::OutIn, true, 64, DType::BF16), "moe_grouped_gemm_nk_swiglu_m64_bf16"),
        ((WeightLayout::InOut, false, 16, DType::BF16), "moe_grouped_gemm_kn_plain_m16_bf16"),
        ((WeightLayout::InOut, true, 16, DType::BF16), "moe_grouped_gemm_kn_swiglu_m16_bf16"),
        ((WeightLayout::OutIn, false, 16, DType::BF16), "moe_grouped_gemm_nk_plain_m16_bf16"),
        ((WeightLayout::OutIn, true, 16, DType::BF16), "moe_grouped_gemm_nk_swiglu_m16_bf16"),
        ((WeightLayout::InOut, false, 64, DType::F16), "moe_grouped_gemm_kn_plain_m64_f16"),
        ((WeightLayout::InOut, true, 64, DType::F16), "moe_grouped_gemm_kn_swiglu_m64_f16"),
        ((WeightLayout::OutIn, false, 64, DType::F16), "moe_grouped_gemm_nk_plain_m64_f16"),
        ((WeightLayout::OutIn, true, 64, DType::F16), "moe_grouped_gemm_nk_swiglu_m64_f16"),
        ((WeightLayout::InOut, false, 16, DType::F16), "moe_grouped_gemm_kn_plain_m16_f16"),
        ((WeightLayout::InOut, true, 16, DType::F16), "moe_grouped_gemm_kn_swiglu_m16_f16"),
        ((WeightLayout::OutIn, false, 16, DType::F16), "moe_grouped_gemm_nk_plain_m16_f16"),
        ((WeightLayout::OutIn, true, 16, DType::F16), "moe_grouped_gemm_nk_swiglu_m16_f16"),
        ((WeightLayout::InOut, false, 64, DType::F32), "moe_grouped_gemm_kn_plain_m64_f32"),
        ((WeightLayout::InOut, true, 64, DType::F32), "moe_grouped_gemm_kn_swiglu_m64_f32"),
        ((WeightLayout::OutIn, false, 64, DType::F32), "moe_grouped_gemm_nk_plain_m64_f32"),
        ((WeightLayout::OutIn, true, 64, DType::F32), "moe_grouped_gemm_nk_swiglu_m64_f32"),
        ((WeightLayout::InOut, false, 16, DType::F32), "moe_grouped_gemm_kn_plain_m16_f32"),
        ((WeightLayout::InOut, true, 16, DType::F32), "moe_grouped_gemm_kn_swiglu_m16_f32"),
        ((WeightLayout::OutIn, false, 16, DType::F32), "moe_grouped_gemm_nk_plain_m16_f32"),
        ((WeightLayout::OutIn, true, 16, DType::F32), "moe_grouped_gemm_nk_swiglu_m16_f32"),
    ],
};

/// The symbols of this family, for static checks.
#[cfg(feature = "dev")]
pub fn symbols() -> impl Iterator<Item = KernelRef> {
    ROUTE
        .symbols()
        .chain([ALIGN_HISTOGRAM, ALIGN_SCAN, ALIGN_SCATTER])
        .chain(GATHER.symbols())
        .chain(COMBINE.symbols())
        .chain(GEMM.symbols())
}
