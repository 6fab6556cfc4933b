//! The grouped expert GEMM (kernels/moe.cu `moe_gemm_*`): every expert in one launch, tensor
//! cores for 16-bit dtypes, a fused SwiGLU epilogue, expert offsets read on the device.

use crate::backend::{LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_MOE_GEMM_BLOCK_N, LLK_MOE_GEMM_BLOCK_N_DECODE, LLK_MOE_GEMM_THREADS, LLK_MOE_SIMT_BLOCK_N,
    LLK_MOE_SIMT_THREADS, LlkMoeEpilogue, LlkMoeSchedule, LlkMoeWeightLayout, MoeGemmParams,
};
use crate::kernels::moe::GEMM;
use crate::launch::KernelArgs;
use crate::launch::{Arg, Rows, check_disjoint, check_dtype, check_float, grid_x, grid_y, to_i64};
use crate::spec::moe::WeightLayout;
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use super::align::{BLOCK_M, MoeAlign, max_blocks, padded_rows, preferred_block_m};

const OP_GEMM: &str = "moe_grouped_gemm";

/// The params-struct enum of a weight layout.
fn raw_layout(layout: WeightLayout) -> LlkMoeWeightLayout {
    match layout {
        WeightLayout::InOut => LlkMoeWeightLayout::LLK_MOE_WEIGHT_KN,
        WeightLayout::OutIn => LlkMoeWeightLayout::LLK_MOE_WEIGHT_NK,
    }
}

/// The weights of one grouped GEMM, and so its epilogue.
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeightsView<'r, 'a> {
    /// `y = x W[e]`: `[experts, k, n]` (InOut) or `[experts, n, k]` (OutIn).
    Plain(&'r TensorView<'a>),
    /// SwiGLU over one tensor of `2n` output columns, gate first (Llama 4 `gate_up_proj`):
    /// `y = silu(x W[e][.., :n]) * (x W[e][.., n:])`, `[rows, n]`.
    SwiGluPacked(&'r TensorView<'a>),
    /// SwiGLU over separate gate and up tensors of `n` output columns each (same strides).
    SwiGluSeparate {
        /// Gate weights: `n` output columns per expert.
        gate: &'r TensorView<'a>,
        /// Up weights: the same shape and strides as `gate`.
        up: &'r TensorView<'a>,
    },
}

/// Which rows go with which expert.
#[derive(Clone, Copy, Debug)]
pub enum GemmGroups<'r> {
    /// The permutation's segments (read on the device).
    Experts(&'r MoeAlign),
    /// One group: every row of `x` with `W[0]` (a dense layer: the shared expert, the router).
    Dense,
}

/// A stacked expert weight view: `[experts, a, b]` (or `[a, b]`: one expert), `b` contiguous.
#[derive(Clone, Copy, Debug)]
struct ExpertDims {
    addr: u64,
    experts: usize,
    a: usize,
    b: usize,
    expert_stride: usize,
    row_stride: usize,
}

impl ExpertDims {
    fn of(op: &'static str, what: &'static str, w: &crate::launch::Arg) -> Result<ExpertDims> {
        let (shape, strides) = (w.shape(), w.strides());
        let bad = |why| Error::BadLayout { op, what, shape: shape.to_vec(), strides: strides.to_vec(), why };
        let (experts, a, b, se, sa) = match *shape {
            [e, a, b] => (e, a, b, strides[0], strides[1]),
            [a, b] => (1, a, b, 0, strides[0]),
            _ => {
                return Err(Error::shape(op, what, shape.to_vec(), "[experts, a, b] or [a, b]"));
            }
        };
        if b > 1 && strides[shape.len() - 1] != 1 {
            return Err(bad("the last dimension must be contiguous"));
        }
        let sa = if a > 1 { sa } else { b };
        let se = if experts > 1 { se } else { a * sa };
        Ok(ExpertDims { addr: w.addr, experts, a, b, expert_stride: se, row_stride: sa })
    }
    /// Every byte any expert may use, as rows of one expert's span (conservative).
    fn region(&self, elem: usize) -> Rows {
        let span = if self.a == 0 || self.b == 0 { 0 } else { (self.a - 1) * self.row_stride + self.b };
        Rows { addr: self.addr, elem, rows: self.experts, cols: span, row_stride: self.expert_stride.max(span) }
    }
}

/// The registered views of one grouped GEMM, with their shapes checked against each other.
#[derive(Clone, Copy)]
struct GemmBound {
    x: Arg,
    y: Arg,
    w: Arg,
    up: Option<Arg>,
    xr: Rows,
    yr: Rows,
    wd: ExpertDims,
    ud: Option<ExpertDims>,
    k: usize,
    n: usize,
    swiglu: bool,
    packed: bool,
}

impl GemmBound {
    /// Registers `y`, `x` and the weights with `args` and checks their shapes and aliasing.
    fn new<'a>(
        args: &mut KernelArgs<'a>,
        x: &'a TensorView<'_>,
        layout: WeightLayout,
        weights: ExpertWeightsView<'a, '_>,
        y: &'a mut TensorViewMut<'_>,
    ) -> Result<GemmBound> {
        const OP: &str = OP_GEMM;
        let dtype = x.dtype();
        let (wv, upv, swiglu, packed) = match weights {
            ExpertWeightsView::Plain(w) => (w, None, false, false),
            ExpertWeightsView::SwiGluPacked(w) => (w, None, true, true),
            ExpertWeightsView::SwiGluSeparate { gate, up } => (gate, Some(up), true, false),
        };
        let yb = args.write("y", y)?;
        let xb = args.read("x", x)?;
        let wb = args.read("weights", wv)?;
        let ub = upv.map(|u| args.read("up weights", u)).transpose()?;
        let (xr, yr) = (Rows::of(OP, "x", &xb, 1)?, Rows::of(OP, "y", &yb, 1)?);
        let wd = ExpertDims::of(OP, "weights", &wb)?;
        let ud = ub.as_ref().map(|u| ExpertDims::of(OP, "up weights", u)).transpose()?;
        // The weight's (k, n) in the kernel's terms.
        let (wk, wn) = match layout {
            WeightLayout::InOut => (wd.a, wd.b),
            WeightLayout::OutIn => (wd.b, wd.a),
        };
        let k = xr.cols;
        let layout_name = match layout {
            WeightLayout::InOut => "[experts, in, out]",
            WeightLayout::OutIn => "[experts, out, in]",
        };
        if wk != k {
            return Err(Error::shape(
                OP,
                "weights",
                wb.shape().to_vec(),
                format!("{layout_name} with in = {k} (the columns of x)"),
            ));
        }
        let n = if packed {
            if wn % 2 != 0 {
                return Err(Error::shape(
                    OP,
                    "weights",
                    wb.shape().to_vec(),
                    format!("{layout_name} with an even out = 2 I (gate then up)"),
                ));
            }
            wn / 2
        } else {
            wn
        };
        if let (Some(u), Some(ub)) = (&ud, &ub) {
            if (u.experts, u.a, u.b) != (wd.experts, wd.a, wd.b) {
                return Err(Error::shape(
                    OP,
                    "up weights",
                    ub.shape().to_vec(),
                    format!("{:?} like the gate weights", wb.shape()),
                ));
            }
            if (u.expert_stride, u.row_stride) != (wd.expert_stride, wd.row_stride) {
                return Err(Error::BadLayout {
                    op: OP,
                    what: "up weights",
                    shape: ub.shape().to_vec(),
                    strides: ub.strides().to_vec(),
                    why: "must have the gate weights' strides",
                });
            }
        }
        if yr.cols != n {
            return Err(Error::shape(
                OP,
                "y",
                yb.shape().to_vec(),
                format!("[rows, {n}] (the weights' {} columns)", if swiglu { "SwiGLU output" } else { "output" }),
            ));
        }
        let elem = dtype.size();
        check_disjoint(OP, ("y", yr), ("x", xr))?;
        check_disjoint(OP, ("y", yr), ("weights", wd.region(elem)))?;
        if let Some(u) = &ud {
            check_disjoint(OP, ("y", yr), ("up weights", u.region(elem)))?;
        }
        Ok(GemmBound { x: xb, y: yb, w: wb, up: ub, xr, yr, wd, ud, k, n, swiglu, packed })
    }

    /// Rows, blocks and the expert map: the schedule of `groups`.
    fn schedule<'g>(&self, groups: GemmGroups<'g>) -> Result<Schedule<'g>> {
        const OP: &str = OP_GEMM;
        let GemmBound { x: xb, y: yb, w: wb, xr, yr, wd, .. } = *self;
        let (schedule, rows, blocks, block_m, map) = match groups {
            GemmGroups::Dense => {
                if xr.rows != yr.rows {
                    return Err(Error::shape(OP, "y", yb.shape().to_vec(), format!("{} rows like x", xr.rows)));
                }
                let bm = preferred_block_m(xr.rows, 1);
                (LlkMoeSchedule::LLK_MOE_DENSE, xr.rows, xr.rows.div_ceil(bm), bm, None)
            }
            GemmGroups::Experts(a) => {
                let s = a.state(OP)?;
                if a.experts() != wd.experts {
                    return Err(Error::shape(
                        OP,
                        "weights",
                        wb.shape().to_vec(),
                        format!("{} experts like the permutation", a.experts()),
                    ));
                }
                let slots = s.tokens * s.top_k;
                let need = padded_rows(slots, a.experts(), s.block_m)?;
                for (what, b, r) in [("x", &xb, &xr), ("y", &yb, &yr)] {
                    if r.rows < need {
                        return Err(Error::shape(
                            OP,
                            what,
                            b.shape().to_vec(),
                            format!("at least {need} rows (the padded rows of the permutation)"),
                        ));
                    }
                }
                (
                    LlkMoeSchedule::LLK_MOE_GROUPED,
                    xr.rows.min(yr.rows),
                    max_blocks(slots, a.experts(), s.block_m)?,
                    s.block_m,
                    Some(a),
                )
            }
        };
        Ok(Schedule { schedule, rows, blocks, block_m, map })
    }

    /// The tensor-core path: k (and, InOut, n) a multiple of the 16-byte vector, 16-byte rows.
    fn check_tensor_core_layout(&self, dtype: DType, layout: WeightLayout) -> Result<()> {
        const OP: &str = OP_GEMM;
        let GemmBound { x: xb, y: yb, w: wb, up: ub, xr, yr, wd, ud, k, n, .. } = *self;
        if dtype != DType::F32 {
            let v = dtype.vec16();
            if k % v != 0 {
                return Err(Error::invalid(OP, "k", k, format!("must be a multiple of {v} on the tensor-core path")));
            }
            if layout == WeightLayout::InOut && n % v != 0 {
                return Err(Error::invalid(
                    OP,
                    "n",
                    n,
                    format!("must be a multiple of {v} with [experts, in, out] weights"),
                ));
            }
            let misaligned = |addr: u64, strides: &[usize]| addr % 16 != 0 || strides.iter().any(|s| s % v != 0);
            let up_addr = ud.map_or(0, |u| u.addr);
            let checks = [
                ("x", misaligned(xb.addr, &[xr.row_stride]), xb.shape().to_vec(), xb.strides().to_vec()),
                (
                    "weights",
                    misaligned(wd.addr, &[wd.row_stride, wd.expert_stride]),
                    wb.shape().to_vec(),
                    wb.strides().to_vec(),
                ),
                ("up weights", ub.is_some() && misaligned(up_addr, &[]), vec![], vec![]),
                ("y", n % v == 0 && misaligned(yb.addr, &[yr.row_stride]), yb.shape().to_vec(), yb.strides().to_vec()),
            ];
            for (what, bad, shape, strides) in checks {
                if bad {
                    return Err(Error::BadLayout {
                        op: OP,
                        what,
                        shape,
                        strides,
                        why: "the tensor-core path needs 16-byte aligned rows (address and strides)",
                    });
                }
            }
        }
        Ok(())
    }

    /// Fills the params struct.
    fn params<'a>(
        &self,
        args: &mut KernelArgs<'a>,
        dtype: DType,
        layout: WeightLayout,
        s: &Schedule<'a>,
    ) -> Result<MoeGemmParams> {
        const OP: &str = OP_GEMM;
        let GemmBound { x: xb, y: yb, xr, yr, wd, ud, k, n, swiglu, packed, .. } = *self;
        let (schedule, rows, map) = (s.schedule, s.rows, s.map);
        let elem = dtype.size();
        let up_addr = match (packed, &ud, layout) {
            (true, _, WeightLayout::InOut) => wd.addr + (n * elem) as u64,
            (true, _, WeightLayout::OutIn) => wd.addr + (n * wd.row_stride * elem) as u64,
            (false, Some(u), _) => u.addr,
            (false, None, _) => 0,
        };
        let (offsets, counts, block_expert) = match map {
            Some(a) => {
                let arrays = a.arrays()?;
                (
                    args.read_tensor("offsets", &arrays.offsets)?,
                    args.read_tensor("counts", &arrays.counts)?,
                    args.read_tensor("block_expert", &arrays.block_expert)?,
                )
            }
            None => (0, 0, 0),
        };
        Ok(MoeGemmParams {
            x: xb.addr,
            w: wd.addr,
            w_up: up_addr,
            y: yb.addr,
            offsets,
            counts,
            block_expert,
            rows: to_i64(OP, "rows", rows)?,
            n: to_i64(OP, "n", n)?,
            k: to_i64(OP, "k", k)?,
            experts: to_i64(OP, "experts", wd.experts)?,
            x_row_stride: to_i64(OP, "x row stride", xr.row_stride)?,
            y_row_stride: to_i64(OP, "y row stride", yr.row_stride)?,
            w_expert_stride: to_i64(OP, "expert stride", wd.expert_stride)?,
            w_row_stride: to_i64(OP, "weight row stride", wd.row_stride)?,
            layout: raw_layout(layout),
            epilogue: if swiglu {
                LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU
            } else {
                LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN
            },
            schedule,
        })
    }
}

/// How the rows of one grouped GEMM are scheduled: dense (one group) or by expert (the
/// permutation's block -> expert map), in blocks of `block_m` rows.
struct Schedule<'g> {
    schedule: LlkMoeSchedule,
    rows: usize,
    blocks: usize,
    block_m: usize,
    map: Option<&'g MoeAlign>,
}

/// Grid and block of the GEMM kernel (its shared memory is the kernel's declaration): blocks of
/// `block_m` rows by `cols_per_block` columns (half of them outputs with the SwiGLU epilogue).
fn launch_dims(dtype: DType, block_m: usize, swiglu: bool, n: usize, blocks: usize) -> Result<LaunchDims> {
    const OP: &str = OP_GEMM;
    let (cols_per_block, threads) = if dtype == DType::F32 {
        (LLK_MOE_SIMT_BLOCK_N as usize, LLK_MOE_SIMT_THREADS)
    } else if block_m == BLOCK_M {
        (LLK_MOE_GEMM_BLOCK_N as usize, LLK_MOE_GEMM_THREADS)
    } else {
        (LLK_MOE_GEMM_BLOCK_N_DECODE as usize, LLK_MOE_GEMM_THREADS)
    };
    let out_per_block = if swiglu { cols_per_block / 2 } else { cols_per_block };
    let grid_y = grid_y(OP, "n", n.div_ceil(out_per_block))?;
    Ok(LaunchDims { grid: (grid_x(OP, blocks)?, grid_y, 1), block: (threads, 1, 1), smem_at_launch: 0 })
}

/// `y = x W[e]` (or its SwiGLU form) for the rows of every expert, one launch: `x` is
/// `[rows, k]` and `y` `[rows, n]` (grouped: both with at least the permutation's padded rows;
/// their padding rows are neither read nor written), the weights `[experts, k, n]`
/// ([`WeightLayout::InOut`]) or `[experts, n, k]` ([`WeightLayout::OutIn`]) with any expert and
/// row strides and a contiguous last dimension. bf16 and f16 run on tensor cores (k a multiple of
/// 8, 16-byte aligned rows; InOut also n a multiple of 8), f32 on a SIMT path (no alignment
/// needs). Which rows belong to which expert is read on the device ([`GemmGroups::Experts`]).
pub fn moe_grouped_gemm_on(
    queue: &impl Queue,
    x: &TensorView<'_>,
    layout: WeightLayout,
    weights: ExpertWeightsView<'_, '_>,
    groups: GemmGroups<'_>,
    y: &mut TensorViewMut<'_>,
) -> Result<()> {
    const OP: &str = OP_GEMM;
    let device = queue.queue_device()?;
    let dtype = x.dtype();
    check_float(OP, "x", dtype)?;
    check_dtype(OP, "y", y.dtype(), dtype)?;
    let (wv, upv) = match weights {
        ExpertWeightsView::Plain(w) | ExpertWeightsView::SwiGluPacked(w) => (w, None),
        ExpertWeightsView::SwiGluSeparate { gate, up } => (gate, Some(up)),
    };
    check_dtype(OP, "weights", wv.dtype(), dtype)?;
    if let Some(u) = upv {
        check_dtype(OP, "up weights", u.dtype(), dtype)?;
    }
    let mut args = KernelArgs::new(OP, &device);
    let b = GemmBound::new(&mut args, x, layout, weights, y)?;
    let s = b.schedule(groups)?;
    if s.blocks == 0 || b.n == 0 {
        return Ok(());
    }
    b.check_tensor_core_layout(dtype, layout)?;
    let params = b.params(&mut args, dtype, layout, &s)?;
    let dims = launch_dims(dtype, s.block_m, b.swiglu, b.n, s.blocks)?;
    let epilogue =
        if b.swiglu { LlkMoeEpilogue::LLK_MOE_EPILOGUE_SWIGLU } else { LlkMoeEpilogue::LLK_MOE_EPILOGUE_PLAIN };
    args.launch(GEMM.find(OP, "x", (layout, epilogue, s.block_m, dtype))?, dims, &params)
}

/// The tensor form of [`ExpertWeightsView`].
#[derive(Clone, Copy, Debug)]
pub enum ExpertWeights<'a> {
    /// As [`ExpertWeightsView::Plain`].
    Plain(&'a Tensor),
    /// As [`ExpertWeightsView::SwiGluPacked`].
    SwiGluPacked(&'a Tensor),
    /// As [`ExpertWeightsView::SwiGluSeparate`].
    SwiGluSeparate {
        /// Gate weights: `n` output columns per expert.
        gate: &'a Tensor,
        /// Up weights: the same shape and strides as `gate`.
        up: &'a Tensor,
    },
}

/// [`moe_grouped_gemm_on`] on tensors.
pub fn moe_grouped_gemm(
    x: &Tensor,
    layout: WeightLayout,
    weights: ExpertWeights<'_>,
    groups: GemmGroups<'_>,
    y: &Tensor,
) -> Result<()> {
    let mut yv = TensorViewMut::of_tensor(y);
    match weights {
        ExpertWeights::Plain(w) => {
            moe_grouped_gemm_on(x.device(), &x.view(), layout, ExpertWeightsView::Plain(&w.view()), groups, &mut yv)
        }
        ExpertWeights::SwiGluPacked(w) => moe_grouped_gemm_on(
            x.device(),
            &x.view(),
            layout,
            ExpertWeightsView::SwiGluPacked(&w.view()),
            groups,
            &mut yv,
        ),
        ExpertWeights::SwiGluSeparate { gate, up } => moe_grouped_gemm_on(
            x.device(),
            &x.view(),
            layout,
            ExpertWeightsView::SwiGluSeparate { gate: &gate.view(), up: &up.view() },
            groups,
            &mut yv,
        ),
    }
}
