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
use crate::ffi::params::{LlkGateUpLayout, SwiGluParams};
use crate::kernels::Access;
use crate::kernels::swiglu::KERNELS;
use crate::launch::KernelArgs;
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

/// The even last dimension `2d` of a packed gate/up view.
fn packed_width(what: &'static str, shape: &[usize]) -> Result<usize> {
    match shape.last() {
        Some(&w) if w % 2 == 0 => Ok(w),
        _ => Err(Error::shape(OP, what, shape.to_vec(), "an even last dimension [..., 2d]")),
    }
}

/// Columns `[start, start + len)` of the last dimension.
fn narrow_last(b: &crate::launch::Arg, start: usize, len: usize) -> crate::launch::Arg {
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
