//! The MoE rows of the `verify` table.

use crate::backend::Device;
use crate::dev::verify::common::{CaseResult, Outcome};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::moe::{MoeRouting, WeightLayout};

use super::ffn::*;
use super::gemm::*;
use super::permute::*;
use super::route::*;

// ------------------------------------------------------------------------------------ verify rows

/// Every MoE case `verify` runs (`quick`: shapes for the emulator).
pub fn moe_cases(device: &Device, quick: bool) -> Vec<Outcome> {
    let mut out: Vec<Outcome> = Vec::new();
    fn push<C: std::fmt::Debug>(out: &mut Vec<Outcome>, case: C, r: Result<CaseResult>) {
        out.push(r.map_err(|e| (format!("{case:?}"), e)));
    }
    let tokens = if quick { 64 } else { 4096 };
    for dtype in DType::FLOATS {
        for (experts, k, routing) in [
            (16, 1, MoeRouting::Llama4),
            (8, 2, MoeRouting::Softmax { renormalize: true }),
            (128, 8, MoeRouting::Softmax { renormalize: false }),
            (256, 8, MoeRouting::Grouped { n_group: 8, topk_group: 4, renormalize: true, routed_scaling_factor: 2.5 }),
        ] {
            let mut c = MoeRouteCase::new(dtype, tokens, experts, k, routing);
            c.bias = matches!(routing, MoeRouting::Grouped { .. });
            push(&mut out, c, moe_route_case(device, &c));
        }
    }
    for (tokens, experts, k, block_m) in
        [(257, 60, 2, 64), (if quick { 3000 } else { 65536 }, 128, 8, 64), (5, 16, 1, 16)]
    {
        let c = MoeAlignCase { tokens, experts, top_k: k, block_m, ids: IdPattern::Random, seed: 1 };
        push(&mut out, c, moe_align_case(device, &c));
    }
    let (gt, hidden, inter) = if quick { (33, 128, 128) } else { (256, 2048, 1024) };
    for dtype in DType::FLOATS {
        let c = MoeGatherCase { dtype, tokens: gt, experts: 16, top_k: 2, hidden, scaled: true, seed: 1 };
        push(&mut out, c, moe_gather_case(device, &c));
        for (layout, weights, block_m) in [
            (WeightLayout::InOut, GemmWeights::SwiGluPacked, 64),
            (WeightLayout::OutIn, GemmWeights::SwiGluSeparate, 16),
            (WeightLayout::InOut, GemmWeights::Plain, 64),
            (WeightLayout::OutIn, GemmWeights::Plain, 16),
        ] {
            let mut c = MoeGemmCase::new(dtype, gt, 8, 2, hidden, inter);
            (c.layout, c.weights, c.block_m) = (layout, weights, block_m);
            push(&mut out, c, moe_gemm_case(device, &c));
        }
        let c = MoeCombineCase {
            dtype,
            tokens: gt,
            experts: 16,
            top_k: 2,
            hidden,
            weighted: true,
            shared: true,
            residual: 1,
            seed: 1,
        };
        push(&mut out, c, moe_combine_case(device, &c));
        for c in [MoeFfnCase::llama4_scout(dtype, gt), MoeFfnCase::mixtral(dtype, gt), MoeFfnCase::grouped(dtype, gt)] {
            push(&mut out, c, moe_ffn_case(device, &c));
        }
    }
    out
}
