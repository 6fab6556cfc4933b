//! Scaled dropout with a reproducible mask (kernels/dropout.cu): `out = x · scale / (1 - p)` where
//! the mask keeps an element, `0` where it drops it.
//!
//! ```
//! use llama_kernels::ops::dropout::{Dropout, dropout};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let x = Tensor::from_f64(&device, DType::BF16, &vec![1.0; 256], &[4, 64])?;
//! let y = Tensor::zeros(&device, DType::BF16, &[4, 64])?;
//! // peft's lora_dropout = 0.05 with the adapter's scaling (alpha / r = 2) folded in.
//! let mask = Dropout { p: 0.05, seed: 1234, stream: 7 };
//! dropout(&x, &y, &mask, 2.0)?;
//! // The same (seed, stream) is the same mask: the backward applies it to the gradient.
//! # Ok(())
//! # }
//! ```
//!
//! The mask is a pure function of `(seed, stream, row, column)`
//! ([`reference::dropout::keeps`](crate::reference::dropout::keeps)): the same on every target,
//! schedule and access width, and regenerated rather than stored by a backward pass (the
//! gradient of `out` with respect to `x` is this op applied to the gradient). Shapes: `x` and
//! `out` are `[..., d]` (leading dimensions collapse into rows, rows may be strided, the last
//! dimension is contiguous), one float dtype, f32 math, one rounding. `out` may be `x` itself
//! ([`dropout_in_place_on`]); otherwise they must not overlap. Rows and columns of the mask count
//! from the view's first element.

pub use crate::spec::dropout::Dropout;

use crate::backend::{LaunchDims, Queue};
use crate::error::{Error, Result};
use crate::ffi::params::{DropoutParams, LLK_DROPOUT_THREADS};
use crate::kernels::Access;
use crate::kernels::dropout::KERNELS;
use crate::launch::{Arg, KernelArgs, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "dropout";

/// `out = x · scale / (1 - p)` where `mask` keeps the element, else 0. `scale` is any finite
/// factor folded into the same rounding (LoRA's `alpha / r`; 1 for plain dropout).
pub fn dropout(x: &Tensor, out: &Tensor, mask: &Dropout, scale: f64) -> Result<()> {
    dropout_on(x.device(), &x.view(), &mut TensorViewMut::of_tensor(out), mask, scale, false)
}

/// [`dropout`] on borrowed views, queued on `queue`; `accumulate` adds the product to `out` (in
/// f32, one rounding of the sum), as a backward adds its branch's share to an input gradient.
pub fn dropout_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    out: &mut TensorViewMut<'_>,
    mask: &Dropout,
    scale: f64,
    accumulate: bool,
) -> Result<()> {
    let device = queue.queue_device()?;
    check_dtype(OP, "x", x.dtype(), out.dtype())?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let xb = args.read("x", x)?;
    launch(args, Some(xb), ob, mask, scale, accumulate)
}

/// [`dropout`] over `x` itself.
pub fn dropout_in_place_on(queue: &impl Queue, x: &mut TensorViewMut<'_>, mask: &Dropout, scale: f64) -> Result<()> {
    let device = queue.queue_device()?;
    let mut args = KernelArgs::new(OP, &device);
    let xb = args.write("x", x)?;
    launch(args, None, xb, mask, scale, false)
}

/// Validates and queues one launch; `x: None` reads `out` (in place).
fn launch(args: KernelArgs<'_>, x: Option<Arg>, ob: Arg, mask: &Dropout, scale: f64, accumulate: bool) -> Result<()> {
    let dtype = ob.dtype;
    check_float(OP, "x", dtype)?;
    mask.check(OP)?;
    let factor = scale * mask.keep_scale();
    if !scale.is_finite() || !(factor as f32).is_finite() {
        return Err(Error::invalid(OP, "scale", scale, "scale / (1 - p) must be a finite f32"));
    }
    let or = Rows::of(OP, "out", &ob, 1)?;
    let (xb, xr) = match x {
        Some(xb) => {
            let xr = Rows::of(OP, "x", &xb, 1)?;
            if (xr.rows, xr.cols) != (or.rows, or.cols) {
                return Err(Error::shape(OP, "out", ob.shape().to_vec(), format!("{:?} like x", xb.shape())));
            }
            check_disjoint(OP, ("out", or), ("x", xr))?;
            (xb, xr)
        }
        None => (ob, or),
    };
    let (tokens, d) = (or.rows, or.cols);
    if tokens == 0 || d == 0 {
        return Ok(());
    }
    let params = DropoutParams {
        x: xb.addr,
        out: ob.addr,
        tokens: to_i64(OP, "tokens", tokens)?,
        d: to_i64(OP, "d", d)?,
        x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        seed: mask.seed,
        stream: mask.stream,
        drop_threshold: mask.drop_threshold(),
        scale: factor as f32,
        accumulate: i32::from(accumulate),
    };
    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = d % v == 0 && aligned(params.x, xr.row_stride) && aligned(params.out, or.row_stride);
    let nvec = if vectorized { d / v } else { d };
    let block = nvec.div_ceil(32).min(LLK_DROPOUT_THREADS as usize / 32) * 32;
    let dims = LaunchDims {
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(KERNELS.find(OP, "x", (Access::of(vectorized), dtype))?, dims, &params)
}
