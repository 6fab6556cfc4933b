//! The backward of RMSNorm and of fused residual-add + RMSNorm (kernels/rms_norm.cu).
//!
//! ```text
//! forward:   y = x * r * w,   r = rsqrt(mean(x^2) + eps)            (per row)
//! backward:  dx = r * (dy * w) - x * r^3 * mean(dy * w * x)  (+ d_residual)
//!            dw = sum over rows of dy * x * r                        (f32)
//! ```
//!
//! `x` is what the forward normalized: for [`fused_add_rms_norm`](super::fused_add_rms_norm()),
//! the sum it stored into `residual`. `r` is recomputed from `x` (the forward saves nothing).
//! For the fused variant both inputs, `x` and `residual`, get the same gradient `dx`, which
//! includes `d_residual`, the gradient that reached the stored sum through the residual stream
//! (Liger Kernel's and transformers' semantics).
//!
//! `dw` is reduced without atomics: each block sums the rows of its chunk into an f32 partial row
//! of a caller's scratch ([`dw_scratch_len`] f32 values), and a second kernel adds the partial
//! rows in order, so the same inputs give the same bits on every run and schedule. The chunking
//! comes from the shape alone, never from the device.
//!
//! Shapes: `dy`, `x`, `dx` (and `d_residual`) `[..., hidden]` of one float dtype, last dimension
//! contiguous, rows any stride; `weight` `[hidden]` contiguous; `dw` `[hidden]` f32. `dx` may be
//! `dy` itself (in place). A row is kept in registers: `hidden` is at most [`max_hidden`]
//! (16384 for f16/bf16 and 8192 for f32 with 16-byte aligned rows, 4096 otherwise). An empty batch writes no `dx`
//! and, with `accumulate`, leaves `dw` as it was (otherwise zeroes it).

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_RMS_NORM_BWD_CACHE, LLK_RMS_NORM_BWD_CACHE_SCALAR, LLK_RMS_NORM_BWD_MAX_BLOCKS, LLK_RMS_NORM_BWD_THREADS,
    LLK_RMS_NORM_DW_THREADS, RmsNormBackwardParams,
};
use crate::kernels::Access;
use crate::kernels::rms_norm::{BACKWARD, DW_REDUCE, RmsNormKind};
use crate::launch::{KernelArgs, Rows, check_disjoint, check_dtype, check_float, check_shape, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "rms_norm_backward";
/// Vectors each thread keeps: 16-byte vectors, or single elements on the scalar path.
const fn cache(vectorized: bool) -> usize {
    if vectorized { LLK_RMS_NORM_BWD_CACHE as usize } else { LLK_RMS_NORM_BWD_CACHE_SCALAR as usize }
}
const THREADS: usize = LLK_RMS_NORM_BWD_THREADS as usize;

/// How the backward maps rows to blocks (see kernels/rms_norm.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BackwardPlan {
    /// Threads per block, one row at a time: a multiple of 32.
    pub threads: usize,
    /// Rows of each block's chunk (the last block may have fewer).
    pub rows_per_block: usize,
    /// Blocks, and so dw partial rows.
    pub blocks: usize,
}

/// The plan for `rows` rows of `vectors` vectors (16-byte ones when `vectorized`, else single
/// elements), from the shape alone: `None` when a row does not fit the registers.
pub fn plan(rows: usize, vectors: usize, vectorized: bool) -> Option<BackwardPlan> {
    let threads = vectors.div_ceil(cache(vectorized)).div_ceil(32).max(1) * 32;
    if threads > THREADS {
        return None;
    }
    let blocks = rows.clamp(1, LLK_RMS_NORM_BWD_MAX_BLOCKS as usize);
    let rows_per_block = rows.div_ceil(blocks).max(1);
    Some(BackwardPlan { threads, rows_per_block, blocks: rows.div_ceil(rows_per_block).max(1) })
}

/// The largest hidden size the backward takes for `dtype` on its 16-byte path (rows 16-byte
/// aligned, hidden a multiple of the vector: 16384 for f16 and bf16, 8192 for f32); other rows
/// take up to 4096.
pub fn max_hidden(dtype: DType) -> usize {
    THREADS * (cache(true) * dtype.vec16()).max(cache(false))
}

/// f32 values of the dw scratch a backward over `rows` rows of `hidden` needs.
pub fn dw_scratch_len(rows: usize, hidden: usize) -> usize {
    rows.clamp(1, LLK_RMS_NORM_BWD_MAX_BLOCKS as usize).saturating_mul(hidden)
}

/// The weight's gradient: where it goes and the scratch its partial sums use.
#[derive(Debug)]
pub struct WeightGrad<'a> {
    /// `[hidden]` f32.
    pub dw: &'a Tensor,
    /// f32, at least [`dw_scratch_len`] values (any shape; contiguous).
    pub scratch: &'a Tensor,
    /// `dw += ...` when true, `dw = ...` otherwise.
    pub accumulate: bool,
}

/// [`WeightGrad`] on borrowed views, for [`rms_norm_backward_on`].
#[derive(Debug)]
pub struct WeightGradView<'r, 'a> {
    /// `[hidden]` f32.
    pub dw: &'r mut TensorViewMut<'a>,
    /// f32, at least [`dw_scratch_len`] values (any shape; contiguous).
    pub scratch: &'r mut TensorViewMut<'a>,
    /// `dw += ...` when true, `dw = ...` otherwise.
    pub accumulate: bool,
}

/// The backward of [`rms_norm`](super::rms_norm()) (and, with `d_residual`, of
/// [`fused_add_rms_norm`](super::fused_add_rms_norm())): writes `dx`, and `dw` when asked. See the
/// module docs.
pub fn rms_norm_backward(
    dy: &Tensor,
    x: &Tensor,
    weight: &Tensor,
    eps: f32,
    dx: &Tensor,
    d_residual: Option<&Tensor>,
    dw: Option<WeightGrad<'_>>,
) -> Result<()> {
    let in_place = dx.shares_storage(dy) && dx.dims() == dy.dims() && dx.offset() == dy.offset();
    let (dyv, xv, wv) = (dy.view(), x.view(), weight.view());
    let drv = d_residual.map(Tensor::view);
    let mut dxv = TensorViewMut::of_tensor(dx);
    let mut grad = dw.map(|g| (TensorViewMut::of_tensor(g.dw), TensorViewMut::of_tensor(g.scratch), g.accumulate));
    let grad = grad.as_mut().map(|(dw, scratch, accumulate)| WeightGradView { dw, scratch, accumulate: *accumulate });
    rms_norm_backward_on(dx.device(), (!in_place).then_some(&dyv), &xv, &wv, eps, &mut dxv, drv.as_ref(), grad)
}

/// [`rms_norm_backward`] on borrowed views, queued on `queue` (a [`Device`](crate::Device) or an
/// engine's `Arc<CudaStream>`). `dy = None` takes dy from `dx` (in place).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm_backward_on(
    queue: &impl Queue,
    dy: Option<&TensorView<'_>>,
    x: &TensorView<'_>,
    weight: &TensorView<'_>,
    eps: f32,
    dx: &mut TensorViewMut<'_>,
    d_residual: Option<&TensorView<'_>>,
    mut dw: Option<WeightGradView<'_, '_>>,
) -> Result<()> {
    let device = queue.queue_device()?;
    let dtype = x.dtype();
    check_float(OP, "x", dtype)?;
    for (what, got) in [("dy", dy.map_or(dtype, TensorView::dtype)), ("weight", weight.dtype()), ("dx", dx.dtype())] {
        check_dtype(OP, what, got, dtype)?;
    }
    let shape = x.shape().to_vec();
    let hidden = *shape.last().ok_or_else(|| Error::shape(OP, "x", shape.clone(), "[..., hidden]"))?;
    if hidden == 0 {
        return Err(Error::invalid(OP, "hidden", 0, "must be > 0"));
    }
    if let Some(dy) = dy {
        check_shape(OP, "dy", dy.shape(), &shape)?;
    }
    check_shape(OP, "dx", dx.shape(), &shape)?;
    check_shape(OP, "weight", weight.shape(), &[hidden])?;
    if let Some(r) = d_residual {
        check_dtype(OP, "d_residual", r.dtype(), dtype)?;
        check_shape(OP, "d_residual", r.shape(), &shape)?;
    }
    if let Some(g) = &dw {
        check_dtype(OP, "dw", g.dw.dtype(), DType::F32)?;
        check_shape(OP, "dw", g.dw.shape(), &[hidden])?;
        check_dtype(OP, "dw scratch", g.scratch.dtype(), DType::F32)?;
    }
    if !eps.is_finite() || eps <= 0.0 {
        return Err(Error::invalid(OP, "eps", eps, "must be finite and > 0"));
    }

    let mut args = KernelArgs::new(OP, &device);
    let dxb = args.write("dx", dx)?;
    let dyb = match dy {
        Some(dy) => args.read("dy", dy)?,
        None => dxb,
    };
    let xb = args.read("x", x)?;
    let wb = args.read("weight", weight)?;
    let drb = d_residual.map(|v| args.read("d_residual", v)).transpose()?;
    let (dxr, dyr, xr) = (Rows::of(OP, "dx", &dxb, 1)?, Rows::of(OP, "dy", &dyb, 1)?, Rows::of(OP, "x", &xb, 1)?);
    let wr = Rows::of(OP, "weight", &wb, 1)?;
    let drr = drb.as_ref().map(|b| Rows::of(OP, "d_residual", b, 1)).transpose()?;
    if dy.is_some() {
        check_disjoint(OP, ("dx", dxr), ("dy", dyr))?;
    }
    check_disjoint(OP, ("dx", dxr), ("x", xr))?;
    check_disjoint(OP, ("dx", dxr), ("weight", wr))?;
    if let Some(r) = drr {
        check_disjoint(OP, ("dx", dxr), ("d_residual", r))?;
    }
    let rows = dxr.rows;

    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = hidden % v == 0
        && aligned(dxb.addr, dxr.row_stride)
        && aligned(dyb.addr, dyr.row_stride)
        && aligned(xb.addr, xr.row_stride)
        && aligned(wb.addr, 0)
        && drb.as_ref().zip(drr).is_none_or(|(b, r)| aligned(b.addr, r.row_stride));
    let vectors = if vectorized { hidden / v } else { hidden };
    let p = plan(rows, vectors, vectorized).ok_or_else(|| {
        Error::invalid(
            OP,
            "hidden",
            hidden,
            format!(
                "too large for the backward's registers (at most {} on this layout, {} with 16-byte aligned rows)",
                THREADS * cache(vectorized) * if vectorized { v } else { 1 },
                max_hidden(dtype)
            ),
        )
    })?;
    let partial = match &mut dw {
        Some(g) => {
            let need = p.blocks * hidden;
            if g.scratch.numel() < need || !g.scratch.dims().is_contiguous() {
                return Err(Error::invalid(
                    OP,
                    "dw scratch",
                    g.scratch.numel(),
                    format!("needs {need} contiguous f32 values (dw_scratch_len)"),
                ));
            }
            Some(args.write("dw scratch", g.scratch)?.addr)
        }
        None => None,
    };
    let params = RmsNormBackwardParams {
        dy: dyb.addr,
        x: xb.addr,
        weight: wb.addr,
        dx: dxb.addr,
        d_residual: drb.map_or(0, |b| b.addr),
        dw_partial: partial.unwrap_or(0),
        dw: 0,
        rows: to_i64(OP, "rows", rows)?,
        hidden: to_i64(OP, "hidden", hidden)?,
        rows_per_block: to_i64(OP, "rows per block", p.rows_per_block)?,
        blocks: to_i64(OP, "blocks", p.blocks)?,
        dy_row_stride: to_i64(OP, "dy row stride", dyr.row_stride)?,
        x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
        dx_row_stride: to_i64(OP, "dx row stride", dxr.row_stride)?,
        d_residual_row_stride: to_i64(OP, "d_residual row stride", drr.map_or(0, |r| r.row_stride))?,
        eps,
        accumulate: 0,
    };
    if rows > 0 {
        let kind = if d_residual.is_some() { RmsNormKind::FusedAdd } else { RmsNormKind::Plain };
        let dims =
            LaunchDims { grid: (grid_x(OP, p.blocks)?, 1, 1), block: (p.threads as u32, 1, 1), smem_at_launch: 0 };
        args.launch(BACKWARD.find(OP, "x", (kind, Access::of(vectorized), dtype))?, dims, &params)?;
    } else {
        // Nothing to launch; the registrations' borrows end here.
        drop(args);
    }
    let Some(g) = dw else { return Ok(()) };
    // The partial rows, added in block order (an empty batch: no partials, dw = 0 or unchanged).
    let mut args = KernelArgs::new(OP, &device);
    let dwb = args.write("dw", g.dw)?.addr;
    let part = args.write("dw scratch", g.scratch)?.addr;
    let params = RmsNormBackwardParams {
        dw: dwb,
        dw_partial: part,
        blocks: if rows == 0 { 0 } else { params.blocks },
        accumulate: i32::from(g.accumulate),
        ..params
    };
    let threads = LLK_RMS_NORM_DW_THREADS as usize;
    let dims = LaunchDims {
        grid: (grid_x(OP, hidden.div_ceil(threads))?, 1, 1),
        block: (threads as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(DW_REDUCE.find(OP, "dw", DType::F32)?, dims, &params)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plans_cover_every_row_once_and_keep_rows_in_registers() {
        for rows in [0, 1, 7, 1023, 1024, 1025, 70_000] {
            for (vectors, vectorized) in [(1, true), (31, true), (33, false), (512, true), (2048, true), (4096, false)]
            {
                let p = plan(rows, vectors, vectorized).unwrap();
                let fits = vectors <= p.threads * cache(vectorized);
                assert!(p.threads % 32 == 0 && p.threads <= THREADS && fits, "{p:?}");
                assert!(p.blocks <= LLK_RMS_NORM_BWD_MAX_BLOCKS as usize, "{p:?}");
                assert!(
                    p.blocks * p.rows_per_block >= rows && (p.blocks - 1) * p.rows_per_block < rows.max(1),
                    "{p:?}"
                );
                assert!(p.blocks * vectors <= dw_scratch_len(rows, vectors), "{p:?}");
            }
        }
        assert_eq!(plan(1, THREADS * cache(true) + 1, true), None);
        assert_eq!(plan(1, THREADS * cache(false) + 1, false), None);
    }
}
