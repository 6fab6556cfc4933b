//! Gathering routed rows into the expert-contiguous buffer (kernels/moe.cu `moe_gather_*`),
//! optionally scaled by the routing weight (Llama 4).

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{LlkMoeScale, MoeGatherParams};
use crate::kernels::Access;
use crate::kernels::moe::GATHER;
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::align::{MoeAlign, check_align_tokens, check_weights_shape, padded_rows, row_threads};
use super::rows::contiguous_rows;

const OP_GATHER: &str = "moe_gather";

/// Copies every routed (token, slot) row of `x` (`[tokens, hidden]`) to its row of `out` (the
/// expert-contiguous buffer, `[rows >= align.padded_rows(), hidden]`), optionally times the
/// slot's routing weight (`weights` `[tokens, k]` f32: Llama 4 scales the expert input).
/// Padding rows are not written (the GEMM never reads them). 16-byte accesses when `hidden`,
/// the addresses and the row strides allow.
pub fn moe_gather_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    align: &MoeAlign,
    weights: Option<&TensorView<'_>>,
    out: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_GATHER;
    let device = queue.queue_device()?;
    let dtype = x.dtype();
    check_float(OP, "x", dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    if let Some(w) = weights {
        check_dtype(OP, "weights", w.dtype(), DType::F32)?;
    }
    let state = align.state(OP)?;
    let arrays = align.arrays()?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let xb = args.read("x", x)?;
    let wb = weights.map(|w| args.read("weights", w)).transpose()?;
    let (xr, or) = (Rows::of(OP, "x", &xb, 1)?, Rows::of(OP, "out", &ob, 1)?);
    check_align_tokens(OP, "x", &xb, xr.rows, state)?;
    let need = padded_rows(state.tokens * state.top_k, align.experts(), state.block_m)?;
    if or.cols != xr.cols || or.rows < need {
        return Err(Error::shape(
            OP,
            "out",
            ob.shape().to_vec(),
            format!("at least [{need}, {}] (the padded rows of the permutation)", xr.cols),
        ));
    }
    if let Some(w) = &wb {
        check_weights_shape(OP, w, state)?;
        check_disjoint(OP, ("out", or), ("weights", contiguous_rows(OP, "weights", w)?))?;
    }
    check_disjoint(OP, ("out", or), ("x", xr))?;
    let slots = state.tokens * state.top_k;
    if slots == 0 || xr.cols == 0 {
        return Ok(());
    }
    let v = dtype.vec16();
    let vec =
        xr.cols % v == 0 && xb.addr % 16 == 0 && ob.addr % 16 == 0 && xr.row_stride % v == 0 && or.row_stride % v == 0;
    let params = MoeGatherParams {
        x: xb.addr,
        rows: args.read_tensor("rows", &arrays.rows)?,
        weights: wb.map_or(0, |w| w.addr),
        out: ob.addr,
        tokens: to_i64(OP, "tokens", state.tokens)?,
        top_k: to_i64(OP, "top_k", state.top_k)?,
        hidden: to_i64(OP, "hidden", xr.cols)?,
        x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        out_rows: to_i64(OP, "out rows", or.rows)?,
        scale: if wb.is_some() { LlkMoeScale::LLK_MOE_SCALED } else { LlkMoeScale::LLK_MOE_UNSCALED },
    };
    let dims =
        LaunchDims { grid: (grid_x(OP, slots)?, 1, 1), block: (row_threads(xr.cols, vec, v), 1, 1), smem_at_launch: 0 };
    args.launch(GATHER.find(OP, "x", (Access::of(vec), dtype))?, dims, &params)
}

/// [`moe_gather_on`] on tensors.
pub fn moe_gather(x: &Tensor, align: &MoeAlign, weights: Option<&Tensor>, out: &Tensor) -> Result<()> {
    let wv = weights.map(Tensor::view);
    moe_gather_on(x.device(), &x.view(), align, wv.as_ref(), &mut TensorViewMut::of_tensor(out))
}
