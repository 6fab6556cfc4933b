//! The combine (kernels/moe.cu `moe_combine_*`): each token sums its k expert rows in slot
//! order in f32, optionally weighted, plus a shared expert and a residual.

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{LlkMoeScale, MoeCombineParams};
use crate::kernels::Access;
use crate::kernels::moe::COMBINE;
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::align::{MoeAlign, check_align_tokens, check_weights_shape, padded_rows, row_threads};
use super::rows::contiguous_rows;

const OP_COMBINE: &str = "moe_combine";

/// What `moe_combine` adds after the experts.
#[derive(Clone, Copy, Debug)]
pub enum MoeResidual<'r, 'a> {
    /// No residual: `out` is the expert sum (plus the shared expert).
    None,
    /// `[tokens, hidden]`, read.
    Separate(&'r TensorView<'a>),
    /// `out` already holds the residual: `out += moe(...)`.
    InPlace,
}

/// `out[t] = sum_j w_tj y[row(t, j)] (+ shared[t]) (+ residual[t])`, accumulated in f32 in slot
/// order and rounded once: `weights` (`[tokens, k]` f32) for softmax routing, `None` to sum
/// unweighted (Llama 4, whose weights already scaled the expert input). `y` is the expert-
/// contiguous output (`[rows >= padded rows, hidden]`), `shared` the shared expert's
/// `[tokens, hidden]`. No atomics: the result does not depend on the schedule.
pub fn moe_combine_on(
    queue: &impl Queue,
    y: &TensorView<'_>,
    align: &MoeAlign,
    weights: Option<&TensorView<'_>>,
    shared: Option<&TensorView<'_>>,
    residual: MoeResidual<'_, '_>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_COMBINE;
    let device = queue.queue_device()?;
    let dtype = y.dtype();
    check_float(OP, "y", dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    if let Some(w) = weights {
        check_dtype(OP, "weights", w.dtype(), DType::F32)?;
    }
    if let Some(s) = shared {
        check_dtype(OP, "shared", s.dtype(), dtype)?;
    }
    if let MoeResidual::Separate(r) = residual {
        check_dtype(OP, "residual", r.dtype(), dtype)?;
    }
    let state = align.state(OP)?;
    let arrays = align.arrays()?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let yb = args.read("y", y)?;
    let wb = weights.map(|w| args.read("weights", w)).transpose()?;
    let sb = shared.map(|s| args.read("shared", s)).transpose()?;
    let rb = match residual {
        MoeResidual::Separate(r) => Some(args.read("residual", r)?),
        _ => None,
    };
    let (yr, or) = (Rows::of(OP, "y", &yb, 1)?, Rows::of(OP, "out", &ob, 1)?);
    check_align_tokens(OP, "out", &ob, or.rows, state)?;
    let hidden = or.cols;
    let need = padded_rows(state.tokens * state.top_k, align.experts(), state.block_m)?;
    if yr.cols != hidden || yr.rows < need {
        return Err(Error::shape(
            OP,
            "y",
            yb.shape().to_vec(),
            format!("at least [{need}, {hidden}] (the padded rows of the permutation)"),
        ));
    }
    if let Some(w) = &wb {
        check_weights_shape(OP, w, state)?;
        check_disjoint(OP, ("out", or), ("weights", contiguous_rows(OP, "weights", w)?))?;
    }
    let mut extra = Vec::new();
    for (what, b) in [("shared", &sb), ("residual", &rb)] {
        if let Some(b) = b {
            let r = Rows::of(OP, what, b, 1)?;
            if (r.rows, r.cols) != (or.rows, or.cols) {
                return Err(Error::shape(OP, what, b.shape().to_vec(), format!("{:?} like out", ob.shape())));
            }
            check_disjoint(OP, ("out", or), (what, r))?;
            extra.push(r);
        }
    }
    check_disjoint(OP, ("out", or), ("y", yr))?;
    let (sr, rr) = (sb.as_ref().map(|_| extra[0]), rb.as_ref().map(|_| extra[extra.len() - 1]));
    let rr = match residual {
        MoeResidual::InPlace => Some(or),
        _ => rr,
    };
    if state.tokens == 0 || hidden == 0 {
        return Ok(());
    }
    let v = dtype.vec16();
    let aligned = |r: &Rows| r.addr % 16 == 0 && r.row_stride % v == 0;
    let vec = hidden % v == 0
        && aligned(&yr)
        && aligned(&or)
        && sr.is_none_or(|r| aligned(&r))
        && rr.is_none_or(|r| aligned(&r));
    let params = MoeCombineParams {
        y: yb.addr,
        rows: args.read_tensor("rows", &arrays.rows)?,
        weights: wb.map_or(0, |w| w.addr),
        shared: sr.map_or(0, |r| r.addr),
        residual: rr.map_or(0, |r| r.addr),
        out: ob.addr,
        tokens: to_i64(OP, "tokens", state.tokens)?,
        top_k: to_i64(OP, "top_k", state.top_k)?,
        hidden: to_i64(OP, "hidden", hidden)?,
        y_rows: to_i64(OP, "y rows", yr.rows)?,
        y_row_stride: to_i64(OP, "y row stride", yr.row_stride)?,
        shared_row_stride: to_i64(OP, "shared row stride", sr.map_or(0, |r| r.row_stride))?,
        residual_row_stride: to_i64(OP, "residual row stride", rr.map_or(0, |r| r.row_stride))?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        scale: if wb.is_some() { LlkMoeScale::LLK_MOE_SCALED } else { LlkMoeScale::LLK_MOE_UNSCALED },
    };
    let dims = LaunchDims {
        grid: (grid_x(OP, state.tokens)?, 1, 1),
        block: (row_threads(hidden, vec, v), 1, 1),
        smem_at_launch: 0,
    };
    args.launch(COMBINE.find(OP, "y", (Access::of(vec), dtype))?, dims, &params)
}

/// [`moe_combine_on`] on tensors; `residual` may be `out` itself (then `out += moe(...)`).
pub fn moe_combine(
    y: &Tensor,
    align: &MoeAlign,
    weights: Option<&Tensor>,
    shared: Option<&Tensor>,
    residual: Option<&Tensor>,
    out: &Tensor,
) -> Result<()> {
    let wv = weights.map(Tensor::view);
    let sv = shared.map(Tensor::view);
    let rv = residual.map(Tensor::view);
    let in_place = residual.is_some_and(|r| r.shares_storage(out) && r.dims() == out.dims());
    let res = match (&rv, in_place) {
        (_, true) => MoeResidual::InPlace,
        (Some(r), false) => MoeResidual::Separate(r),
        (None, _) => MoeResidual::None,
    };
    moe_combine_on(y.device(), &y.view(), align, wv.as_ref(), sv.as_ref(), res, &mut TensorViewMut::of_tensor(out))
}
