//! SwiGLU, `out = silu(gate) * up` (kernels/swiglu.cu), from separate or packed inputs.
//!
//! ```
//! use llama_kernels::ops::swiglu::{GateUp, swiglu};
//! use llama_kernels::{DType, Device, Tensor};
//! # fn main() -> llama_kernels::Result<()> {
//! let device = Device::best();
//! let (tokens, d) = (4, 256);
//! // One fused gate-up GEMM output: gate in columns [0, d), up in [d, 2d).
//! let gate_up = Tensor::zeros(&device, DType::BF16, &[tokens, 2 * d])?;
//! let h = Tensor::zeros(&device, DType::BF16, &[tokens, d])?;
//! swiglu(GateUp::GateThenUp(&gate_up), &h)?;
//! # Ok(())
//! # }
//! ```
//!
//! Shapes: `gate`, `up` and `out` are `[..., d]` (leading dimensions collapse into tokens, rows
//! may be strided, the last dimension is contiguous); packed inputs are `[..., 2d]`. One float
//! dtype throughout, f32 math. `out` may be the gate view itself (in place over the gate half of
//! a packed buffer, too); otherwise it must not overlap the inputs.

use crate::backend::{LaunchDims, Queue};
use crate::error::{Error, Result};
use crate::ffi::params::{LlkGateUpLayout, SwiGluBackwardParams, SwiGluParams};
use crate::kernels::Access;
use crate::kernels::swiglu::{BACKWARD, KERNELS};
use crate::launch::{Arg, KernelArgs};
use crate::launch::{Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

const OP: &str = "swiglu";
/// Threads per block (kMaxThreads in kernels/swiglu.cu).
const MAX_THREADS: usize = 256;

/// Where gate and up come from.
#[derive(Clone, Copy, Debug)]
pub enum GateUp<'a> {
    /// Two `[tokens, d]` tensors.
    Separate {
        /// `[tokens, d]`: the input of silu.
        gate: &'a Tensor,
        /// `[tokens, d]`: what silu(gate) multiplies.
        up: &'a Tensor,
    },
    /// One `[tokens, 2d]` tensor, gate in columns `[0, d)` and up in `[d, 2d)`: a fused gate-up
    /// GEMM's output, and Llama 4's `gate_up_proj` (Hugging Face splits it with
    /// `gate, up = gate_up.chunk(2, dim=-1)`).
    GateThenUp(&'a Tensor),
    /// One `[tokens, 2d]` tensor, gate at even and up at odd columns: the order GPT-OSS's
    /// `gate_up_proj` uses (`gate_up[..., ::2], gate_up[..., 1::2]`). Only the layout is shared:
    /// GPT-OSS's clamped activation is not SwiGLU and is not implemented here.
    Interleaved(&'a Tensor),
}

/// Where gate and up come from, as borrowed views (the view-level [`swiglu_on`]).
#[derive(Clone, Copy, Debug)]
pub enum GateUpView<'r, 'a> {
    /// Two `[tokens, d]` views; `gate: None` reads the gate from `out` (in place).
    Separate {
        /// `[tokens, d]`: the input of silu, or `None` to read it from `out`.
        gate: Option<&'r TensorView<'a>>,
        /// `[tokens, d]`: what silu(gate) multiplies.
        up: &'r TensorView<'a>,
    },
    /// One `[tokens, 2d]` view, gate in columns `[0, d)` and up in `[d, 2d)`.
    GateThenUp(&'r TensorView<'a>),
    /// One `[tokens, 2d]` view, gate at even and up at odd columns.
    Interleaved(&'r TensorView<'a>),
}

/// `out = silu(gate) * up`. `out` is written; it may be the gate view itself (in place, also
/// over the gate half of a packed tensor).
pub fn swiglu(input: GateUp<'_>, out: &Tensor) -> Result<()> {
    let device = out.device();
    let same = |t: &Tensor| t.shares_storage(out) && t.dims() == out.dims();
    let mut ov = TensorViewMut::of_tensor(out);
    match input {
        GateUp::Separate { gate, up } => {
            let (gv, uv) = (gate.view(), up.view());
            let gate = (!same(gate)).then_some(&gv);
            swiglu_on(device, GateUpView::Separate { gate, up: &uv }, &mut ov)
        }
        GateUp::GateThenUp(packed) => {
            check_float(OP, "gate_up", packed.dtype())?;
            let (gate, up) = split_packed(packed)?;
            let (gv, uv) = (gate.view(), up.view());
            let gate = (!same(&gate)).then_some(&gv);
            swiglu_on(device, GateUpView::Separate { gate, up: &uv }, &mut ov)
        }
        GateUp::Interleaved(packed) => swiglu_on(device, GateUpView::Interleaved(&packed.view()), &mut ov),
    }
}

/// [`swiglu`] on borrowed views, queued on `queue` (a [`Device`](crate::Device) or an engine's
/// `Arc<CudaStream>`).
pub fn swiglu_on(queue: &impl Queue, input: GateUpView<'_, '_>, out: &mut TensorViewMut<'_>) -> Result<()> {
    let device = queue.queue_device()?;
    // The input defines the dtype; the output must match it.
    let (what, dtype) = match input {
        GateUpView::Separate { gate: Some(g), .. } => ("gate", g.dtype()),
        GateUpView::Separate { gate: None, .. } => ("gate", out.dtype()),
        GateUpView::GateThenUp(p) | GateUpView::Interleaved(p) => ("gate_up", p.dtype()),
    };
    check_float(OP, what, dtype)?;
    check_dtype(OP, "out", out.dtype(), dtype)?;
    let mut args = KernelArgs::new(OP, &device);
    let ob = args.write("out", out)?;
    let (interleaved, gb, ub) = match input {
        GateUpView::Separate { gate, up } => {
            let gb = match gate {
                Some(g) => args.read("gate", g)?,
                None => ob,
            };
            (false, gb, Some(args.read("up", up)?))
        }
        GateUpView::GateThenUp(packed) => {
            let pb = args.read("gate_up", packed)?;
            let width = packed_width("gate_up", pb.shape())?;
            let (gb, ub) = (narrow_last(&pb, 0, width / 2), narrow_last(&pb, width / 2, width / 2));
            (false, gb, Some(ub))
        }
        GateUpView::Interleaved(packed) => (true, args.read("gate_up", packed)?, None),
    };
    check_dtype(OP, "gate", gb.dtype, dtype)?;
    if let Some(ub) = &ub {
        check_dtype(OP, "up", ub.dtype, dtype)?;
        if ub.shape() != gb.shape() {
            return Err(Error::shape(OP, "up", ub.shape().to_vec(), format!("{:?} like gate", gb.shape())));
        }
    }
    let gr = Rows::of(OP, "gate", &gb, 1)?;
    let ur = ub.as_ref().map(|u| Rows::of(OP, "up", u, 1)).transpose()?;
    let or = Rows::of(OP, "out", &ob, 1)?;
    if interleaved && gr.cols % 2 != 0 {
        return Err(Error::shape(OP, "gate_up", gb.shape().to_vec(), "an even last dimension [..., 2d]"));
    }
    let d = if interleaved { gr.cols / 2 } else { gr.cols };
    let layout =
        if interleaved { LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED } else { LlkGateUpLayout::LLK_GATE_UP_SEPARATE };
    if or.rows != gr.rows || or.cols != d {
        return Err(Error::shape(OP, "out", ob.shape().to_vec(), format!("{} rows of {d}", gr.rows)));
    }
    let in_place = matches!(input, GateUpView::Separate { gate: None, .. });
    if !in_place {
        check_disjoint(OP, ("out", or), ("gate", gr))?;
    }
    if let Some(ur) = ur {
        check_disjoint(OP, ("out", or), ("up", ur))?;
    }
    let tokens = or.rows;
    if tokens == 0 || d == 0 {
        return Ok(());
    }
    let params = SwiGluParams {
        gate: gb.addr,
        up: ub.map_or(0, |u| u.addr),
        out: ob.addr,
        tokens: to_i64(OP, "tokens", tokens)?,
        d: to_i64(OP, "d", d)?,
        gate_row_stride: to_i64(OP, "gate row stride", gr.row_stride)?,
        up_row_stride: to_i64(OP, "up row stride", ur.map_or(0, |r| r.row_stride))?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        layout,
    };
    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = d % v == 0
        && aligned(params.gate, gr.row_stride)
        && aligned(params.out, or.row_stride)
        && ur.is_none_or(|r| aligned(params.up, r.row_stride));
    let nvec = if vectorized { d / v } else { d };
    let block = nvec.div_ceil(32).min(MAX_THREADS / 32) * 32;
    let dims = LaunchDims {
        // Two tokens per thread (kernels/swiglu.cu): grid.y covers half the tokens.
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.div_ceil(2).min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(KERNELS.find(OP, "gate", (layout, Access::of(vectorized), dtype))?, dims, &params)
}

/// The backward of [`swiglu`]: from the output's gradient `d_out` (`[tokens, d]`) and the
/// forward's `input`, writes `d_gate` and `d_up` into `grad`, which has the input's layout
/// (`Separate` gradients for `Separate` or `GateThenUp` inputs, and the other way around; an
/// `Interleaved` gradient for an `Interleaved` input). `grad` may be `input` itself: each element
/// is read before it is written, so the saved gate/up buffer can take its own gradient (as
/// Liger Kernel does). With `s = sigmoid(gate)`: `d_up = d_out * gate * s`,
/// `d_gate = d_out * up * s * (1 + gate (1 - s))`, in f32, rounded once.
pub fn swiglu_backward(d_out: &Tensor, input: GateUp<'_>, grad: GateUp<'_>) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let device = d_out.device();
    let dtype = d_out.dtype();
    check_float(OP, "d_out", dtype)?;
    // Every layout as (gate, up) pairs of [tokens, d] views, or one interleaved [tokens, 2d].
    let parts = |what: &'static str, g: GateUp<'_>| -> Result<(Tensor, Option<Tensor>)> {
        match g {
            GateUp::Separate { gate, up } => Ok((gate.clone(), Some(up.clone()))),
            GateUp::GateThenUp(p) => {
                check_float(OP, what, p.dtype())?;
                let (gate, up) = split_packed(p)?;
                Ok((gate, Some(up)))
            }
            GateUp::Interleaved(p) => Ok((p.clone(), None)),
        }
    };
    let (gate, up) = parts("input", input)?;
    let (dgate, dup) = parts("grad", grad)?;
    if up.is_some() != dup.is_some() {
        return Err(Error::invalid(OP, "grad", "layout", "must be interleaved exactly when the input is"));
    }
    for (what, t) in [("gate", Some(&gate)), ("up", up.as_ref()), ("d_gate", Some(&dgate)), ("d_up", dup.as_ref())] {
        if let Some(t) = t {
            check_dtype(OP, what, t.dtype(), dtype)?;
        }
    }
    let (dov, gv) = (d_out.view(), gate.view());
    let uv = up.as_ref().map(Tensor::view);
    let mut dgm = TensorViewMut::of_tensor(&dgate);
    let mut dum = dup.as_ref().map(TensorViewMut::of_tensor);
    let mut args = KernelArgs::new(OP, device);
    let dgb = args.write("d_gate", &mut dgm)?;
    let dub = dum.as_mut().map(|v| args.write("d_up", v)).transpose()?;
    let dob = args.read("d_out", &dov)?;
    // A gradient over its own input is in place: read through the gradient's registration.
    let same = |a: &Tensor, b: &Tensor| a.shares_storage(b) && a.dims() == b.dims() && a.offset() == b.offset();
    let gb = if same(&gate, &dgate) { dgb } else { args.read("gate", &gv)? };
    let ub = match (&up, &uv, &dup) {
        (Some(u), Some(v), Some(du)) => Some(if same(u, du) { dub.unwrap_or(dgb) } else { args.read("up", v)? }),
        _ => None,
    };
    launch_backward(args, dtype, [dob, gb, dgb], [ub, dub])
}

/// The gradients' destination for [`swiglu_backward_on`], in the input's layout family (see
/// [`swiglu_backward`]).
#[derive(Debug)]
pub enum GateUpGrad<'r, 'a> {
    /// Two `[tokens, d]` views.
    Separate {
        /// `[tokens, d]`: the gate's gradient.
        d_gate: &'r mut TensorViewMut<'a>,
        /// `[tokens, d]`: up's gradient.
        d_up: &'r mut TensorViewMut<'a>,
    },
    /// One `[tokens, 2d]` view, d_gate in columns `[0, d)` and d_up in `[d, 2d)`.
    GateThenUp(&'r mut TensorViewMut<'a>),
    /// One `[tokens, 2d]` view, d_gate at even and d_up at odd columns.
    Interleaved(&'r mut TensorViewMut<'a>),
}

/// [`swiglu_backward`] on borrowed views, queued on `queue`. The gradients are written out of
/// place: they may not overlap `d_out` or the input (the in-place form, a gradient over its own
/// input, is [`swiglu_backward`]'s). `GateUpView::Separate { gate: None, .. }` has no meaning
/// here and is an error.
pub fn swiglu_backward_on(
    queue: &impl Queue,
    d_out: &TensorView<'_>,
    input: GateUpView<'_, '_>,
    grad: GateUpGrad<'_, '_>,
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let device = queue.queue_device()?;
    let dtype = d_out.dtype();
    check_float(OP, "d_out", dtype)?;
    let mut args = KernelArgs::new(OP, &device);
    let dob = args.read("d_out", d_out)?;
    let (gb, ub) = match input {
        GateUpView::Separate { gate: Some(g), up } => (args.read("gate", g)?, Some(args.read("up", up)?)),
        GateUpView::Separate { gate: None, .. } => {
            return Err(Error::invalid(OP, "gate", "None", "the backward needs the forward's gate"));
        }
        GateUpView::GateThenUp(p) => {
            let (g, u) = split_halves("gate_up", args.read("gate_up", p)?)?;
            (g, Some(u))
        }
        GateUpView::Interleaved(p) => (args.read("gate_up", p)?, None),
    };
    let (dgb, dub) = match grad {
        GateUpGrad::Separate { d_gate, d_up } => (args.write("d_gate", d_gate)?, Some(args.write("d_up", d_up)?)),
        GateUpGrad::GateThenUp(p) => {
            let (g, u) = split_halves("grad", args.write("grad", p)?)?;
            (g, Some(u))
        }
        GateUpGrad::Interleaved(p) => (args.write("grad", p)?, None),
    };
    if ub.is_some() != dub.is_some() {
        return Err(Error::invalid(OP, "grad", "layout", "must be interleaved exactly when the input is"));
    }
    for (what, b) in [("gate", Some(gb)), ("up", ub), ("d_gate", Some(dgb)), ("d_up", dub)] {
        if let Some(b) = b {
            check_dtype(OP, what, b.dtype, dtype)?;
        }
    }
    // Out of place: a gradient that is its input would pass the shared launch's in-place rule.
    if gb.addr == dgb.addr || ub.zip(dub).is_some_and(|(u, du)| u.addr == du.addr) {
        return Err(Error::invalid(OP, "grad", "in place", "swiglu_backward_on writes out of place"));
    }
    launch_backward(args, dtype, [dob, gb, dgb], [ub, dub])
}

/// The backward's checks and launch on registered arguments: `[d_out, gate, d_gate]` and
/// `[up, d_up]` (`None` for an interleaved input, whose gate view holds both halves). A gradient
/// at its input's address is in place (read before written); otherwise none may overlap.
fn launch_backward(
    args: KernelArgs<'_>,
    dtype: crate::dtype::DType,
    [dob, gb, dgb]: [Arg; 3],
    [ub, dub]: [Option<Arg>; 2],
) -> Result<()> {
    const OP: &str = "swiglu_backward";
    let (dor, gr, dgr) =
        (Rows::of(OP, "d_out", &dob, 1)?, Rows::of(OP, "gate", &gb, 1)?, Rows::of(OP, "d_gate", &dgb, 1)?);
    let ur = ub.as_ref().map(|b| Rows::of(OP, "up", b, 1)).transpose()?;
    let dur = dub.as_ref().map(|b| Rows::of(OP, "d_up", b, 1)).transpose()?;
    let interleaved = ub.is_none();
    if interleaved && gr.cols % 2 != 0 {
        return Err(Error::shape(OP, "gate_up", gb.shape().to_vec(), "an even last dimension [..., 2d]"));
    }
    let d = if interleaved { gr.cols / 2 } else { gr.cols };
    if dor.cols != d || dor.rows != gr.rows {
        return Err(Error::shape(OP, "d_out", dob.shape().to_vec(), format!("{} rows of {d}", gr.rows)));
    }
    for (what, r) in [("up", ur), ("d_gate", Some(dgr)), ("d_up", dur)] {
        if let Some(r) = r {
            if r.rows != gr.rows || r.cols != gr.cols {
                return Err(Error::shape(
                    OP,
                    what,
                    vec![r.rows, r.cols],
                    format!("{:?} like gate", [gr.rows, gr.cols]),
                ));
            }
        }
    }
    // The outputs never overlap d_out or each other, nor an input they are not (in place).
    check_disjoint(OP, ("d_gate", dgr), ("d_out", dor))?;
    if let Some(dur) = dur {
        check_disjoint(OP, ("d_up", dur), ("d_out", dor))?;
        check_disjoint(OP, ("d_up", dur), ("d_gate", dgr))?;
        check_disjoint(OP, ("d_up", dur), ("gate", gr))?;
    }
    if gb.addr != dgb.addr {
        check_disjoint(OP, ("d_gate", dgr), ("gate", gr))?;
    }
    if let (Some(ub), Some(ur)) = (&ub, ur) {
        check_disjoint(OP, ("d_gate", dgr), ("up", ur))?;
        if dub.is_none_or(|b| b.addr != ub.addr) {
            if let Some(dur) = dur {
                check_disjoint(OP, ("d_up", dur), ("up", ur))?;
            }
        }
    }
    let tokens = gr.rows;
    if tokens == 0 || d == 0 {
        return Ok(());
    }
    let layout =
        if interleaved { LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED } else { LlkGateUpLayout::LLK_GATE_UP_SEPARATE };
    let params = SwiGluBackwardParams {
        d_out: dob.addr,
        gate: gb.addr,
        up: ub.map_or(0, |b| b.addr),
        d_gate: dgb.addr,
        d_up: dub.map_or(0, |b| b.addr),
        tokens: to_i64(OP, "tokens", tokens)?,
        d: to_i64(OP, "d", d)?,
        d_out_row_stride: to_i64(OP, "d_out row stride", dor.row_stride)?,
        gate_row_stride: to_i64(OP, "gate row stride", gr.row_stride)?,
        up_row_stride: to_i64(OP, "up row stride", ur.map_or(0, |r| r.row_stride))?,
        d_gate_row_stride: to_i64(OP, "d_gate row stride", dgr.row_stride)?,
        d_up_row_stride: to_i64(OP, "d_up row stride", dur.map_or(0, |r| r.row_stride))?,
        layout,
    };
    let v = dtype.vec16();
    let aligned = |addr: u64, stride: usize| addr % 16 == 0 && stride % v == 0;
    let vectorized = d % v == 0
        && aligned(params.d_out, dor.row_stride)
        && aligned(params.gate, gr.row_stride)
        && aligned(params.d_gate, dgr.row_stride)
        && ur.is_none_or(|r| aligned(params.up, r.row_stride))
        && dur.is_none_or(|r| aligned(params.d_up, r.row_stride));
    let nvec = if vectorized { d / v } else { d };
    let block = nvec.div_ceil(32).min(MAX_THREADS / 32) * 32;
    let dims = LaunchDims {
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        smem_at_launch: 0,
    };
    args.launch(BACKWARD.find(OP, "d_out", (layout, Access::of(vectorized), dtype))?, dims, &params)
}

/// The even last dimension `2d` of a packed gate/up view.
fn packed_width(what: &'static str, shape: &[usize]) -> Result<usize> {
    match shape.last() {
        Some(&w) if w % 2 == 0 => Ok(w),
        _ => Err(Error::shape(OP, what, shape.to_vec(), "an even last dimension [..., 2d]")),
    }
}

/// The two halves `[0, d)` and `[d, 2d)` of a packed `[..., 2d]` argument.
fn split_halves(what: &'static str, b: Arg) -> Result<(Arg, Arg)> {
    let width = packed_width(what, b.shape())?;
    Ok((narrow_last(&b, 0, width / 2), narrow_last(&b, width / 2, width / 2)))
}

/// Columns `[start, start + len)` of the last dimension.
fn narrow_last(b: &Arg, start: usize, len: usize) -> Arg {
    let mut out = *b;
    out.addr += (start * b.dtype.size()) as u64;
    out.dims = out.dims.with_last(len);
    out
}

fn split_packed(packed: &Tensor) -> Result<(Tensor, Tensor)> {
    let width = packed_width("gate_up", packed.shape())?;
    let dim = packed.rank() - 1;
    Ok((packed.narrow(dim, 0, width / 2)?, packed.narrow(dim, width / 2, width / 2)?))
}
