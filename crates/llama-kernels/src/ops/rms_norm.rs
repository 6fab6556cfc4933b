//! RMSNorm and fused residual-add + RMSNorm (kernels/rms_norm.cu).
//!
//! ```text
//! rms_norm:            y = x * rsqrt(mean(x^2) + eps) * weight           (per row)
//! fused_add_rms_norm:  s = round(x + residual); residual <- s; y = rms_norm(s)
//! ```
//!
//! Shapes: `x`, `y` (and `residual`) are `[..., hidden]` with a contiguous last dimension and
//! leading dimensions that collapse into one row stride (so row views of a larger buffer work);
//! `weight` is `[hidden]`, contiguous. All share one float dtype; accumulation is f32.
//!
//! `y` may be `x` itself (same view: in place). An empty batch (0 rows) is a no-op. NaN or
//! infinity in a row propagates to that row's output; other rows are unaffected.

use crate::backend::{LaunchDims, Queue};
use crate::error::{Error, Result};
use crate::ffi::params::{LLK_RMS_NORM_CACHE, LLK_RMS_NORM_MAX_THREADS, LLK_RMS_NORM_MAX_THREADS_FUSED, RmsNormParams};
use crate::kernels::Access;
use crate::kernels::rms_norm::{KERNELS, RmsNormKind};
use crate::launch::KernelArgs;
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, check_shape, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

/// Vectors each thread keeps in registers; mirrors `kCache` in kernels/rms_norm.cu.
const CACHE: usize = LLK_RMS_NORM_CACHE as usize;

/// How the kernel maps rows to threads (see the header of kernels/rms_norm.cu).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormPlan {
    /// Threads per row: a power of two up to 32, or a multiple of 32 up to 1024.
    pub threads_per_row: usize,
    /// Rows per block.
    pub rows_per_block: usize,
    /// Whether the 16-byte vector path runs.
    pub vectorized: bool,
}

/// Chooses the thread mapping for `rows` rows of `vectors` vectors each.
///
/// Large batches give each thread up to 4 vectors (`kCache` in the kernel) (more bytes in flight per thread, a
/// cheaper reduction); small batches (decode) spread a row over more threads to cut latency.
/// Rows use at most 512 threads unless that would not keep the row in registers. Blocks hold at
/// least 128 threads, so small hidden sizes pack several rows per block.
///
/// `fused` caps a row at 512 threads (the fused kernel's launch bound, where it does not spill):
/// longer rows stream their tail twice instead.
pub fn plan(rows: usize, vectors: usize, vectorized: bool, fused: bool) -> RmsNormPlan {
    let max_warps = if fused { LLK_RMS_NORM_MAX_THREADS_FUSED } else { LLK_RMS_NORM_MAX_THREADS } as usize / 32;
    let items = if rows >= 1024 {
        CACHE
    } else if rows >= 128 {
        2
    } else {
        1
    };
    let per_row = vectors.div_ceil(items).max(1);
    let mut threads_per_row =
        if per_row <= 32 { per_row.next_power_of_two() } else { per_row.div_ceil(32).min(16).min(max_warps) * 32 };
    if vectors > threads_per_row * CACHE {
        threads_per_row = vectors.div_ceil(CACHE).div_ceil(32).min(max_warps) * 32;
    }
    RmsNormPlan { threads_per_row, rows_per_block: (128 / threads_per_row).max(1), vectorized }
}

fn check_eps(op: &'static str, eps: f32) -> Result<()> {
    if !eps.is_finite() || eps <= 0.0 {
        return Err(Error::invalid(op, "eps", eps, "must be finite and > 0"));
    }
    Ok(())
}

/// `y = x * rsqrt(mean(x^2) + eps) * weight` over the last dimension.
///
/// `y` is written; it may be the same view as `x` (in place). See the module docs for shapes.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f32, y: &Tensor) -> Result<()> {
    let in_place = x.shares_storage(y) && x.dims() == y.dims();
    let xv = x.view();
    rms_norm_on(x.device(), (!in_place).then_some(&xv), &weight.view(), eps, &mut TensorViewMut::of_tensor(y))
}

/// `residual <- x + residual` (rounded to the dtype), then `y = rms_norm(residual)`.
///
/// `residual` is read and written; `y` is written and may be the same view as `x`.
pub fn fused_add_rms_norm(x: &Tensor, residual: &Tensor, weight: &Tensor, eps: f32, y: &Tensor) -> Result<()> {
    let in_place = x.shares_storage(y) && x.dims() == y.dims();
    let xv = x.view();
    launch(
        "fused_add_rms_norm",
        x.device(),
        (!in_place).then_some(&xv),
        Some(&mut TensorViewMut::of_tensor(residual)),
        &weight.view(),
        eps,
        &mut TensorViewMut::of_tensor(y),
    )
}

/// [`rms_norm`] on borrowed views, queued on `queue` (a [`Device`](crate::Device) or an
/// engine's `Arc<CudaStream>`). `x = None` normalizes `y` in place.
pub fn rms_norm_on(
    queue: &impl Queue,
    x: Option<&TensorView<'_>>,
    weight: &TensorView<'_>,
    eps: f32,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    launch("rms_norm", &queue.queue_device()?, x, None, weight, eps, y)
}

/// [`fused_add_rms_norm`] on borrowed views. `x = None` takes x from `y` (in place).
pub fn fused_add_rms_norm_on(
    queue: &impl Queue,
    x: Option<&TensorView<'_>>,
    residual: &mut TensorViewMut<'_>,
    weight: &TensorView<'_>,
    eps: f32,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    launch("fused_add_rms_norm", &queue.queue_device()?, x, Some(residual), weight, eps, y)
}

fn launch(
    op: &'static str,
    device: &crate::Device,
    x: Option<&TensorView<'_>>,
    residual: Option<&mut TensorViewMut<'_>>,
    weight: &TensorView<'_>,
    eps: f32,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    // Dtypes and shapes: x (or y, in place) defines them.
    let (dtype, shape) = match x {
        Some(x) => (x.dtype(), x.shape()),
        None => (y.dtype(), y.shape()),
    };
    check_float(op, "x", dtype)?;
    check_dtype(op, "weight", weight.dtype(), dtype)?;
    check_dtype(op, "y", y.dtype(), dtype)?;
    if let Some(r) = &residual {
        check_dtype(op, "residual", r.dtype(), dtype)?;
    }
    let hidden = *shape.last().ok_or_else(|| Error::shape(op, "x", shape.to_vec(), "[..., hidden]"))?;
    if hidden == 0 {
        return Err(Error::invalid(op, "hidden", 0, "must be > 0"));
    }
    check_shape(op, "y", y.shape(), shape)?;
    check_shape(op, "weight", weight.shape(), &[hidden])?;
    if let Some(r) = &residual {
        check_shape(op, "residual", r.shape(), shape)?;
    }
    check_eps(op, eps)?;

    // Addresses, layouts and aliasing.
    let mut args = KernelArgs::new(op, device);
    let yb = args.write("y", y)?;
    let wb = args.read("weight", weight)?;
    let xb = match x {
        Some(x) => args.read("x", x)?,
        None => yb,
    };
    let rb = match residual {
        Some(r) => Some(args.write("residual", r)?),
        None => None,
    };
    let yr = Rows::of(op, "y", &yb, 1)?;
    let xr = Rows::of(op, "x", &xb, 1)?;
    let wr = Rows::of(op, "weight", &wb, 1)?;
    let rr = rb.as_ref().map(|r| Rows::of(op, "residual", r, 1)).transpose()?;
    if x.is_some() {
        check_disjoint(op, ("y", yr), ("x", xr))?;
    }
    check_disjoint(op, ("y", yr), ("weight", wr))?;
    if let Some(rr) = rr {
        check_disjoint(op, ("residual", rr), ("x", xr))?;
        check_disjoint(op, ("residual", rr), ("y", yr))?;
        check_disjoint(op, ("residual", rr), ("weight", wr))?;
    }
    let rows = yr.rows;
    if rows == 0 {
        return Ok(());
    }

    let params = RmsNormParams {
        x: xb.addr,
        residual: rb.map_or(0, |r| r.addr),
        weight: wb.addr,
        y: yb.addr,
        rows: to_i64(op, "rows", rows)?,
        hidden: to_i64(op, "hidden", hidden)?,
        x_row_stride: to_i64(op, "x row stride", xr.row_stride)?,
        residual_row_stride: to_i64(op, "residual row stride", rr.map_or(0, |r| r.row_stride))?,
        y_row_stride: to_i64(op, "y row stride", yr.row_stride)?,
        eps,
    };
    // The 16-byte path needs whole vectors in every row and 16-byte aligned rows everywhere.
    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = hidden % v == 0
        && aligned(params.x, xr.row_stride)
        && aligned(params.y, yr.row_stride)
        && aligned(params.weight, 0)
        && rr.is_none_or(|r| aligned(params.residual, r.row_stride));
    let p = plan(rows, if vectorized { hidden / v } else { hidden }, vectorized, rr.is_some());
    let dims = LaunchDims {
        grid: (grid_x(op, rows.div_ceil(p.rows_per_block))?, 1, 1),
        block: (p.threads_per_row as u32, p.rows_per_block as u32, 1),
        smem_at_launch: 0,
    };
    let kind = if rr.is_some() { RmsNormKind::FusedAdd } else { RmsNormKind::Plain };
    args.launch(KERNELS.find(op, "x", (kind, Access::of(vectorized), dtype))?, dims, &params)
}

#[cfg(test)]
mod tests {
    use super::plan;

    #[test]
    fn plan_keeps_blocks_full_and_rows_in_registers() {
        for fused in [false, true] {
            let max = if fused { 512 } else { 1024 };
            for rows in [1, 7, 1024, 16384] {
                for vectors in [1, 2, 3, 33, 96, 512, 1024, 2048, 4096, 9000] {
                    let p = plan(rows, vectors, true, fused);
                    let t = p.threads_per_row;
                    assert!(t <= max && (t.is_power_of_two() && t <= 32 || t % 32 == 0), "{p:?}");
                    assert!(t * p.rows_per_block >= 32 && t * p.rows_per_block <= max, "{p:?}");
                    assert_eq!((t * p.rows_per_block) % 32, 0, "{p:?}");
                    if vectors <= 4 * max {
                        assert!(vectors <= t * super::CACHE, "row of {vectors} vectors not cached: {p:?}");
                    }
                }
            }
        }
    }
}
