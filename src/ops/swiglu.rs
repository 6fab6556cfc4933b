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

use crate::backend::{KernelArgs, KernelRef, LaunchDims};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::{KernelTable, Rows, check_disjoint, check_dtype, check_float, check_same_device, grid_x, to_i64};
use crate::params::{LlkGateUpLayout, SwiGluParams};
use crate::tensor::Tensor;

const OP: &str = "swiglu";
/// Threads per block (kMaxThreads in kernels/swiglu.cu).
const MAX_THREADS: usize = 256;

/// Where gate and up come from.
#[derive(Clone, Copy, Debug)]
pub enum GateUp<'a> {
    /// Two `[tokens, d]` tensors.
    Separate { gate: &'a Tensor, up: &'a Tensor },
    /// One `[tokens, 2d]` tensor, gate in columns `[0, d)` and up in `[d, 2d)`: a fused gate-up
    /// GEMM's output, and Llama 4's `gate_up_proj` (Hugging Face splits it with
    /// `gate, up = gate_up.chunk(2, dim=-1)`).
    GateThenUp(&'a Tensor),
    /// One `[tokens, 2d]` tensor, gate at even and up at odd columns: the order GPT-OSS's
    /// `gate_up_proj` uses (`gate_up[..., ::2], gate_up[..., 1::2]`). Only the layout is shared:
    /// GPT-OSS's clamped activation is not SwiGLU and is not implemented here.
    Interleaved(&'a Tensor),
}

/// Every kernel, by (interleaved, vectorized, dtype).
static KERNELS: KernelTable<(bool, bool, DType)> = KernelTable {
    module: "swiglu",
    entries: &[
        ((false, false, DType::F32), "swiglu_f32"),
        ((false, false, DType::F16), "swiglu_f16"),
        ((false, false, DType::BF16), "swiglu_bf16"),
        ((false, true, DType::F32), "swiglu_vec_f32"),
        ((false, true, DType::F16), "swiglu_vec_f16"),
        ((false, true, DType::BF16), "swiglu_vec_bf16"),
        ((true, false, DType::F32), "swiglu_interleaved_f32"),
        ((true, false, DType::F16), "swiglu_interleaved_f16"),
        ((true, false, DType::BF16), "swiglu_interleaved_bf16"),
        ((true, true, DType::F32), "swiglu_interleaved_vec_f32"),
        ((true, true, DType::F16), "swiglu_interleaved_vec_f16"),
        ((true, true, DType::BF16), "swiglu_interleaved_vec_bf16"),
    ],
};

/// The symbols of this family, for static checks.
pub fn kernel_symbols() -> impl Iterator<Item = KernelRef> {
    KERNELS.symbols()
}

fn last_dim(what: &'static str, t: &Tensor) -> Result<usize> {
    t.shape().last().copied().ok_or_else(|| Error::ShapeMismatch {
        op: OP,
        what,
        got: t.shape().to_vec(),
        expected: "[tokens, features]".into(),
    })
}

fn split_packed(packed: &Tensor) -> Result<(Tensor, Tensor)> {
    let width = last_dim("gate_up", packed)?;
    if width % 2 != 0 {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "gate_up",
            got: packed.shape().to_vec(),
            expected: "an even last dimension [..., 2d]".into(),
        });
    }
    let dim = packed.rank() - 1;
    Ok((packed.narrow(dim, 0, width / 2)?, packed.narrow(dim, width / 2, width / 2)?))
}

/// `out = silu(gate) * up`. `out` is written.
pub fn swiglu(input: GateUp<'_>, out: &Tensor) -> Result<()> {
    match input {
        GateUp::Separate { gate, up } => launch_separate(gate, up, out),
        GateUp::GateThenUp(packed) => {
            check_float(OP, "gate_up", packed)?;
            let (gate, up) = split_packed(packed)?;
            launch_separate(&gate, &up, out)
        }
        GateUp::Interleaved(packed) => launch_interleaved(packed, out),
    }
}

fn check_out(gate_dtype: DType, tokens: usize, d: usize, out: &Tensor) -> Result<Rows> {
    check_dtype(OP, "out", out, gate_dtype)?;
    let orows = Rows::of(OP, "out", out, 1)?;
    if orows.rows != tokens || orows.cols != d {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "out",
            got: out.shape().to_vec(),
            expected: format!("{tokens} rows of {d}"),
        });
    }
    Ok(orows)
}

fn launch_separate(gate: &Tensor, up: &Tensor, out: &Tensor) -> Result<()> {
    check_float(OP, "gate", gate)?;
    let dtype = gate.dtype();
    check_dtype(OP, "up", up, dtype)?;
    check_same_device(OP, gate, &[("up", up), ("out", out)])?;
    if gate.shape() != up.shape() {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "up",
            got: up.shape().to_vec(),
            expected: format!("{:?} like gate", gate.shape()),
        });
    }
    let gr = Rows::of(OP, "gate", gate, 1)?;
    let ur = Rows::of(OP, "up", up, 1)?;
    let or = check_out(dtype, gr.rows, gr.cols, out)?;
    if !(out.shares_storage(gate) && or == gr) {
        check_disjoint(OP, ("out", out, &or), ("gate", gate, &gr))?;
    }
    check_disjoint(OP, ("out", out, &or), ("up", up, &ur))?;
    run(false, dtype, gate, Some(up), out, &gr, Some(&ur), &or)
}

fn launch_interleaved(packed: &Tensor, out: &Tensor) -> Result<()> {
    check_float(OP, "gate_up", packed)?;
    let dtype = packed.dtype();
    check_same_device(OP, packed, &[("out", out)])?;
    let pr = Rows::of(OP, "gate_up", packed, 1)?;
    if pr.cols % 2 != 0 {
        return Err(Error::ShapeMismatch {
            op: OP,
            what: "gate_up",
            got: packed.shape().to_vec(),
            expected: "an even last dimension [..., 2d]".into(),
        });
    }
    let or = check_out(dtype, pr.rows, pr.cols / 2, out)?;
    check_disjoint(OP, ("out", out, &or), ("gate_up", packed, &pr))?;
    run(true, dtype, packed, None, out, &pr, None, &or)
}

#[allow(clippy::too_many_arguments)]
fn run(
    interleaved: bool,
    dtype: DType,
    gate: &Tensor,
    up: Option<&Tensor>,
    out: &Tensor,
    gr: &Rows,
    ur: Option<&Rows>,
    or: &Rows,
) -> Result<()> {
    let (tokens, d) = (or.rows, or.cols);
    if tokens == 0 || d == 0 {
        return Ok(());
    }
    let mut args = KernelArgs::new(OP, gate.device());
    let params = SwiGluParams {
        gate: args.ptr("gate", gate)?,
        up: args.opt_ptr("up", up)?,
        out: args.ptr("out", out)?,
        tokens: to_i64(OP, "tokens", tokens)?,
        d: to_i64(OP, "d", d)?,
        gate_row_stride: to_i64(OP, "gate row stride", gr.row_stride)?,
        up_row_stride: to_i64(OP, "up row stride", ur.map_or(0, |r| r.row_stride))?,
        out_row_stride: to_i64(OP, "out row stride", or.row_stride)?,
        layout: if interleaved {
            LlkGateUpLayout::LLK_GATE_UP_INTERLEAVED
        } else {
            LlkGateUpLayout::LLK_GATE_UP_SEPARATE
        },
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
        grid: (grid_x(OP, nvec.div_ceil(block))?, tokens.min(65535) as u32, 1),
        block: (block as u32, 1, 1),
        dyn_smem: 0,
    };
    args.launch(KERNELS.find(OP, "gate", (interleaved, vectorized, dtype), dtype)?, dims, &params)
}
