//! Top-k routing of every token (kernels/moe.cu `moe_route_*`): Llama 4, softmax and
//! DeepSeek-V3 grouped modes, one warp per token. [`crate::reference::moe`] states each mode.

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_MOE_MAX_EXPERTS, LLK_MOE_MAX_GROUPS, LLK_MOE_MAX_TOP_K, LLK_MOE_MAX_TOP_K_GROUPED, LLK_MOE_ROUTE_SMALL_EXPERTS,
    LLK_MOE_ROUTE_WARPS, LlkMoeRenormalize, LlkMoeRouting, MoeRouteParams,
};
use crate::kernels::moe::{ROUTE, RouteWidth};
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::spec::moe::MoeRouting;
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::rows::contiguous_rows;

const OP_ROUTE: &str = "moe_route";

/// Most experts a layer may have.
pub const MAX_EXPERTS: usize = LLK_MOE_MAX_EXPERTS as usize;
/// Most experts per token for Llama 4 and softmax routing.
pub const MAX_TOP_K: usize = LLK_MOE_MAX_TOP_K as usize;
/// Most experts per token for grouped routing.
pub const MAX_TOP_K_GROUPED: usize = LLK_MOE_MAX_TOP_K_GROUPED as usize;
/// Most expert groups (grouped routing).
pub const MAX_GROUPS: usize = LLK_MOE_MAX_GROUPS as usize;
/// Routes every token: writes `ids` (`[tokens, k]` i32, best first) and `weights` (`[tokens, k]`
/// f32) from `logits` (`[tokens, experts]` f32/f16/bf16, rows may be strided). `bias` (`[experts]`
/// f32, contiguous) is the grouped mode's selection bias (DeepSeek-V3 `e_score_correction_bias`);
/// other modes take none. k is `ids`' last dimension.
pub fn moe_route_on(
    queue: &impl Queue,
    logits: &TensorView<'_>,
    bias: Option<&TensorView<'_>>,
    routing: MoeRouting,
    ids: &mut TensorViewMut<'_>,
    weights: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_ROUTE;
    let device = queue.queue_device()?;
    let dtype = logits.dtype();
    check_float(OP, "logits", dtype)?;
    check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
    check_dtype(OP, "weights", weights.dtype(), DType::F32)?;
    if let Some(b) = bias {
        check_dtype(OP, "bias", b.dtype(), DType::F32)?;
    }
    let mut args = KernelArgs::new(OP, &device);
    let ib = args.write("ids", ids)?;
    let wb = args.write("weights", weights)?;
    let lb = args.read("logits", logits)?;
    let bb = bias.map(|b| args.read("bias", b)).transpose()?;
    let lr = Rows::of(OP, "logits", &lb, 1)?;
    let ir = contiguous_rows(OP, "ids", &ib)?;
    let wr = contiguous_rows(OP, "weights", &wb)?;
    let (tokens, experts, k) = (lr.rows, lr.cols, ir.cols);
    if ir.rows != tokens {
        return Err(Error::shape(
            OP,
            "ids",
            ib.shape().to_vec(),
            format!("[{tokens}, k] (one row per token of logits)"),
        ));
    }
    if wb.shape() != ib.shape() {
        return Err(Error::shape(OP, "weights", wb.shape().to_vec(), format!("{:?} like ids", ib.shape())));
    }
    check_routing(OP, experts, k, routing)?;
    let bias_addr = match (&bb, routing) {
        (Some(b), MoeRouting::Grouped { .. }) => {
            if b.shape() != [experts] {
                return Err(Error::shape(OP, "bias", b.shape().to_vec(), format!("[{experts}] (one per expert)")));
            }
            contiguous_rows(OP, "bias", b)?;
            b.addr
        }
        (Some(_), _) => {
            return Err(Error::invalid(OP, "bias", "given", "only grouped routing takes a selection bias"));
        }
        (None, _) => 0,
    };
    check_disjoint(OP, ("ids", ir), ("weights", wr))?;
    check_disjoint(OP, ("ids", ir), ("logits", lr))?;
    check_disjoint(OP, ("weights", wr), ("logits", lr))?;
    if tokens == 0 {
        return Ok(());
    }
    let (mode, renormalize, n_group, topk_group, factor) = match routing {
        MoeRouting::Llama4 => (LlkMoeRouting::LLK_MOE_ROUTE_LLAMA4, false, 0, 0, 1.0),
        MoeRouting::Softmax { renormalize } => (LlkMoeRouting::LLK_MOE_ROUTE_SOFTMAX, renormalize, 0, 0, 1.0),
        MoeRouting::Grouped { n_group, topk_group, renormalize, routed_scaling_factor } => {
            (LlkMoeRouting::LLK_MOE_ROUTE_GROUPED, renormalize, n_group, topk_group, routed_scaling_factor)
        }
    };
    let params = MoeRouteParams {
        logits: lb.addr,
        bias: bias_addr,
        ids: ib.addr,
        weights: wb.addr,
        tokens: to_i64(OP, "tokens", tokens)?,
        experts: to_i64(OP, "experts", experts)?,
        top_k: to_i64(OP, "top_k", k)?,
        logits_row_stride: to_i64(OP, "logits row stride", lr.row_stride)?,
        n_group: to_i64(OP, "n_group", n_group)?,
        topk_group: to_i64(OP, "topk_group", topk_group)?,
        mode,
        renormalize: if renormalize {
            LlkMoeRenormalize::LLK_MOE_RENORMALIZE
        } else {
            LlkMoeRenormalize::LLK_MOE_KEEP_WEIGHTS
        },
        routed_scaling_factor: factor,
    };
    let warps = LLK_MOE_ROUTE_WARPS as usize;
    let width = if experts <= LLK_MOE_ROUTE_SMALL_EXPERTS as usize { RouteWidth::E128 } else { RouteWidth::E512 };
    let dims = LaunchDims {
        grid: (grid_x(OP, tokens.div_ceil(warps))?, 1, 1),
        block: (32 * warps as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(ROUTE.find(OP, "logits", (mode, width, dtype))?, dims, &params)
}

/// Checks experts, k and the group configuration of a routing mode.
pub(crate) fn check_routing(op: &'static str, experts: usize, k: usize, routing: MoeRouting) -> Result<()> {
    if experts == 0 || experts > MAX_EXPERTS {
        return Err(Error::invalid(op, "experts", experts, format!("must be 1..={MAX_EXPERTS}")));
    }
    let max_k = if matches!(routing, MoeRouting::Grouped { .. }) { MAX_TOP_K_GROUPED } else { MAX_TOP_K };
    if k == 0 || k > max_k {
        return Err(Error::invalid(op, "top_k", k, format!("must be 1..={max_k} for {routing:?}")));
    }
    if k > experts {
        return Err(Error::invalid(op, "top_k", k, format!("exceeds the {experts} experts")));
    }
    if let MoeRouting::Grouped { n_group, topk_group, routed_scaling_factor, .. } = routing {
        if n_group == 0 || n_group > MAX_GROUPS || experts % n_group != 0 {
            return Err(Error::invalid(
                op,
                "n_group",
                n_group,
                format!("must divide the {experts} experts and be 1..={MAX_GROUPS}"),
            ));
        }
        if experts / n_group < 2 {
            return Err(Error::invalid(
                op,
                "n_group",
                n_group,
                "groups need at least 2 experts (scored by their top 2)",
            ));
        }
        if topk_group == 0 || topk_group > n_group {
            return Err(Error::invalid(op, "topk_group", topk_group, format!("must be 1..={n_group} (n_group)")));
        }
        if k > topk_group * (experts / n_group) {
            return Err(Error::invalid(
                op,
                "top_k",
                k,
                format!("exceeds the {} experts of the {topk_group} kept groups", topk_group * (experts / n_group)),
            ));
        }
        if !routed_scaling_factor.is_finite() {
            return Err(Error::invalid(op, "routed_scaling_factor", routed_scaling_factor, "must be finite"));
        }
    }
    Ok(())
}

/// [`moe_route_on`] on tensors.
pub fn moe_route(
    logits: &Tensor,
    bias: Option<&Tensor>,
    routing: MoeRouting,
    ids: &Tensor,
    weights: &Tensor,
) -> Result<()> {
    let bv = bias.map(Tensor::view);
    moe_route_on(
        logits.device(),
        &logits.view(),
        bv.as_ref(),
        routing,
        &mut TensorViewMut::of_tensor(ids),
        &mut TensorViewMut::of_tensor(weights),
    )
}
