//! The backward of [`linear`](super::linear::linear): [`linear_backward_input`] (`dx = dy W`) and
//! [`linear_backward_weight`] (`dw = dyᵀ x`, summed over the rows), both optionally accumulating
//! (`beta = 1`, one rounding) and with an f32 output if asked (16-bit inputs, f32 gradients). They
//! run on `linear`'s GEMM engines (cuBLAS on CUDA, `matrixmultiply` on the emulated target), the
//! operands transposed by cuBLAS's `op` flags and `sgemm`'s strides, never by a copy.

use super::linear::{Gemm, Operand};
use crate::backend::Queue;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::{KernelArgs, Rows, check_disjoint, check_dtype, check_float};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

/// `dx (+)= dy W`: the input gradient of [`linear`](super::linear::linear) (`accumulate`: added to `dx`, one rounding).
/// `dy` `[..., out]`, `weight` `[out, in]`, `dx` `[..., in]` with `dy`'s leading dimensions; `dx`
/// in `dy`'s dtype or f32.
pub fn linear_backward_input(dy: &Tensor, weight: &Tensor, dx: &Tensor, accumulate: bool) -> Result<()> {
    linear_backward_input_on(dy.device(), &dy.view(), &weight.view(), &mut TensorViewMut::of_tensor(dx), accumulate)
}

/// [`linear_backward_input`] on borrowed views, queued on `queue`.
pub fn linear_backward_input_on(
    queue: &impl Queue,
    dy: &TensorView<'_>,
    weight: &TensorView<'_>,
    dx: &mut TensorViewMut<'_>,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "linear_backward_input";
    let device = queue.queue_device()?;
    let dtype = dy.dtype();
    check_float(OP, "dy", dtype)?;
    check_dtype(OP, "weight", weight.dtype(), dtype)?;
    check_output_dtype(OP, "dx", dx.dtype(), dtype)?;
    let [d_out, d_in] = *weight.shape() else {
        return Err(Error::shape(OP, "weight", weight.shape().to_vec(), "[out, in] (the nn.Linear layout)"));
    };
    check_rows_like(OP, ("dy", dy.shape()), d_out, ("dx", dx.shape()), d_in)?;
    let mut args = KernelArgs::new(OP, &device);
    let dxb = args.write("dx", dx)?;
    let (dyb, wb) = (args.read("dy", dy)?, args.read("weight", weight)?);
    let (dxr, dyr, wr) = (Rows::of(OP, "dx", &dxb, 1)?, Rows::of(OP, "dy", &dyb, 1)?, Rows::of(OP, "weight", &wb, 1)?);
    check_disjoint(OP, ("dx", dxr), ("dy", dyr))?;
    check_disjoint(OP, ("dx", dxr), ("weight", wr))?;
    let tokens = dxr.rows;
    if tokens == 0 || d_in == 0 {
        return Ok(());
    }
    let g = Gemm {
        dtype,
        out_dtype: dxb.dtype,
        m: tokens,
        n: d_in,
        k: d_out,
        a: Operand { addr: dyb.addr, ld: dyr.row_stride, transposed: false, ld_name: "dy row stride" },
        b: Operand {
            addr: wb.addr,
            ld: if d_out > 1 { wr.row_stride } else { d_in },
            transposed: false,
            ld_name: "weight row stride",
        },
        bias: None,
        c: dxb.addr,
        ldc: if tokens > 1 { dxr.row_stride } else { d_in },
        accumulate,
        names: ["tokens", "in", "out", "dx row stride"],
    };
    // SAFETY: every address was registered with `args` above, and the row/stride extents were
    // validated by `Rows::of` against the views' shapes.
    unsafe { g.run(OP, &device, args) }
}

/// `dw (+)= dyᵀ x`: the weight gradient of [`linear`](super::linear::linear), summed over every row (`accumulate`: added
/// to `dw`, one rounding). `dy` `[..., out]`, `x` `[..., in]` with the same leading dimensions,
/// `dw` `[out, in]` in `dy`'s dtype or f32 (f32 keeps gradient accumulation exact to f32). With
/// no rows, `dw` is zeroed (or, accumulating, left as it is).
pub fn linear_backward_weight(dy: &Tensor, x: &Tensor, dw: &Tensor, accumulate: bool) -> Result<()> {
    linear_backward_weight_on(dy.device(), &dy.view(), &x.view(), &mut TensorViewMut::of_tensor(dw), accumulate)
}

/// [`linear_backward_weight`] on borrowed views, queued on `queue`.
pub fn linear_backward_weight_on(
    queue: &impl Queue,
    dy: &TensorView<'_>,
    x: &TensorView<'_>,
    dw: &mut TensorViewMut<'_>,
    accumulate: bool,
) -> Result<()> {
    const OP: &str = "linear_backward_weight";
    let device = queue.queue_device()?;
    let dtype = dy.dtype();
    check_float(OP, "dy", dtype)?;
    check_dtype(OP, "x", x.dtype(), dtype)?;
    check_output_dtype(OP, "dw", dw.dtype(), dtype)?;
    let [d_out, d_in] = *dw.shape() else {
        return Err(Error::shape(OP, "dw", dw.shape().to_vec(), "[out, in] (the nn.Linear layout)"));
    };
    check_rows_like(OP, ("dy", dy.shape()), d_out, ("x", x.shape()), d_in)?;
    let mut args = KernelArgs::new(OP, &device);
    let dwb = args.write("dw", dw)?;
    let (dyb, xb) = (args.read("dy", dy)?, args.read("x", x)?);
    let (dwr, dyr, xr) = (Rows::of(OP, "dw", &dwb, 1)?, Rows::of(OP, "dy", &dyb, 1)?, Rows::of(OP, "x", &xb, 1)?);
    check_disjoint(OP, ("dw", dwr), ("dy", dyr))?;
    check_disjoint(OP, ("dw", dwr), ("x", xr))?;
    let tokens = dyr.rows;
    if d_out == 0 || d_in == 0 {
        return Ok(());
    }
    let g = Gemm {
        dtype,
        out_dtype: dwb.dtype,
        m: d_out,
        n: d_in,
        k: tokens,
        // dy [tokens, out] row-major holds A^T for A = dy^T [out, tokens].
        a: Operand {
            addr: dyb.addr,
            ld: if tokens > 1 { dyr.row_stride } else { d_out },
            transposed: true,
            ld_name: "dy row stride",
        },
        b: Operand {
            addr: xb.addr,
            ld: if tokens > 1 { xr.row_stride } else { d_in },
            transposed: false,
            ld_name: "x row stride",
        },
        bias: None,
        c: dwb.addr,
        ldc: if d_out > 1 { dwr.row_stride } else { d_in },
        accumulate,
        names: ["out", "in", "tokens", "dw row stride"],
    };
    // SAFETY: every address was registered with `args` above, and the row/stride extents were
    // validated by `Rows::of` against the views' shapes.
    unsafe { g.run(OP, &device, args) }
}

/// The output of a product: `dtype` itself or f32.
fn check_output_dtype(op: &'static str, what: &'static str, got: DType, dtype: DType) -> Result<()> {
    if got == dtype || got == DType::F32 {
        Ok(())
    } else {
        Err(Error::UnsupportedDType { op, what, dtype: got, supported: format!("{dtype} or f32") })
    }
}

/// `a` is `[..., a_last]` and `b` `[..., b_last]` with the same leading dimensions.
fn check_rows_like(
    op: &'static str,
    (a_what, a): (&'static str, &[usize]),
    a_last: usize,
    (b_what, b): (&'static str, &[usize]),
    b_last: usize,
) -> Result<()> {
    if a.last() != Some(&a_last) {
        return Err(Error::shape(op, a_what, a.to_vec(), format!("[..., {a_last}]")));
    }
    let mut want = a.to_vec();
    if let Some(last) = want.last_mut() {
        *last = b_last;
    }
    if b != want.as_slice() {
        return Err(Error::shape(op, b_what, b.to_vec(), format!("{want:?} ({a_what}'s leading dimensions)")));
    }
    Ok(())
}
