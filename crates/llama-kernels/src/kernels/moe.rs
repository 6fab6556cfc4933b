//! The kernels of `kernels/moe.cu`.

use super::{Access, KernelTable};
use crate::backend::KernelRef;
use crate::dtype::DType;
use crate::ffi::params::{LlkMoeEpilogue, LlkMoeRouting};
use crate::spec::moe::WeightLayout;

/// How many experts a route kernel holds per row: one warp's registers for up to 128 (4 per
/// lane), or up to 512.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RouteWidth {
    /// At most 128 experts.
    E128,
    /// At most 512 experts.
    E512,
}

/// Route kernels by (routing, width, dtype).
pub static ROUTE: KernelTable<(LlkMoeRouting, RouteWidth, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E128, DType::F32), "moe_route_llama4_e128_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E512, DType::F32), "moe_route_llama4_e512_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E128, DType::F32), "moe_route_softmax_e128_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E512, DType::F32), "moe_route_softmax_e512_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E128, DType::F32), "moe_route_grouped_e128_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E512, DType::F32), "moe_route_grouped_e512_f32"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E128, DType::F16), "moe_route_llama4_e128_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E512, DType::F16), "moe_route_llama4_e512_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E128, DType::F16), "moe_route_softmax_e128_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E512, DType::F16), "moe_route_softmax_e512_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E128, DType::F16), "moe_route_grouped_e128_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E512, DType::F16), "moe_route_grouped_e512_f16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E128, DType::BF16), "moe_route_llama4_e128_bf16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, RouteWidth::E512, DType::BF16), "moe_route_llama4_e512_bf16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E128, DType::BF16), "moe_route_softmax_e128_bf16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, RouteWidth::E512, DType::BF16), "moe_route_softmax_e512_bf16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E128, DType::BF16), "moe_route_grouped_e128_bf16"),
        ((LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, RouteWidth::E512, DType::BF16), "moe_route_grouped_e512_bf16"),
    ],
};

/// Align, pass 1: the per-expert token counts.
pub const ALIGN_HISTOGRAM: KernelRef = KernelRef { module: "moe", symbol: "moe_align_histogram" };
/// Align, pass 2: the padded offsets and the block -> expert map.
pub const ALIGN_SCAN: KernelRef = KernelRef { module: "moe", symbol: "moe_align_scan" };
/// Align, pass 3: each routed slot into its expert-contiguous row.
pub const ALIGN_SCATTER: KernelRef = KernelRef { module: "moe", symbol: "moe_align_scatter" };

/// Gather kernels by (access, dtype).
pub static GATHER: KernelTable<(Access, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((Access::Scalar, DType::F32), "moe_gather_f32"),
        ((Access::Scalar, DType::F16), "moe_gather_f16"),
        ((Access::Scalar, DType::BF16), "moe_gather_bf16"),
        ((Access::Vector, DType::F32), "moe_gather_vec_f32"),
        ((Access::Vector, DType::F16), "moe_gather_vec_f16"),
        ((Access::Vector, DType::BF16), "moe_gather_vec_bf16"),
    ],
};
/// Combine kernels by (access, dtype).
pub static COMBINE: KernelTable<(Access, DType)> = KernelTable {
    module: "moe",
    entries: &[
        ((Access::Scalar, DType::F32), "moe_combine_f32"),
        ((Access::Scalar, DType::F16), "moe_combine_f16"),
        ((Access::Scalar, DType::BF16), "moe_combine_bf16"),
        ((Access::Vector, DType::F32), "moe_combine_vec_f32"),
        ((Access::Vector, DType::F16), "moe_combine_vec_f16"),
        ((Access::Vector, DType::BF16), "moe_combine_vec_bf16"),
    ],
};

/// Grouped GEMM kernels by (layout, epilogue, block rows, dtype).
pub static GEMM: KernelTable<(WeightLayout, LlkMoeEpilogue, usize, DType)> = KernelTable {
    module: "moe",
    entries: &[
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::BF16),
            "moe_grouped_gemm_kn_plain_m64_bf16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::BF16),
            "moe_grouped_gemm_kn_swiglu_m64_bf16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::BF16),
            "moe_grouped_gemm_nk_plain_m64_bf16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::BF16),
            "moe_grouped_gemm_nk_swiglu_m64_bf16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::BF16),
            "moe_grouped_gemm_kn_plain_m16_bf16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::BF16),
            "moe_grouped_gemm_kn_swiglu_m16_bf16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::BF16),
            "moe_grouped_gemm_nk_plain_m16_bf16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::BF16),
            "moe_grouped_gemm_nk_swiglu_m16_bf16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::F16),
            "moe_grouped_gemm_kn_plain_m64_f16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::F16),
            "moe_grouped_gemm_kn_swiglu_m64_f16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::F16),
            "moe_grouped_gemm_nk_plain_m64_f16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::F16),
            "moe_grouped_gemm_nk_swiglu_m64_f16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::F16),
            "moe_grouped_gemm_kn_plain_m16_f16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::F16),
            "moe_grouped_gemm_kn_swiglu_m16_f16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::F16),
            "moe_grouped_gemm_nk_plain_m16_f16",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::F16),
            "moe_grouped_gemm_nk_swiglu_m16_f16",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::F32),
            "moe_grouped_gemm_kn_plain_m64_f32",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::F32),
            "moe_grouped_gemm_kn_swiglu_m64_f32",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 64, DType::F32),
            "moe_grouped_gemm_nk_plain_m64_f32",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 64, DType::F32),
            "moe_grouped_gemm_nk_swiglu_m64_f32",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::F32),
            "moe_grouped_gemm_kn_plain_m16_f32",
        ),
        (
            (WeightLayout::InOut, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::F32),
            "moe_grouped_gemm_kn_swiglu_m16_f32",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN, 16, DType::F32),
            "moe_grouped_gemm_nk_plain_m16_f32",
        ),
        (
            (WeightLayout::OutIn, LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU, 16, DType::F32),
            "moe_grouped_gemm_nk_swiglu_m16_f32",
        ),
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
