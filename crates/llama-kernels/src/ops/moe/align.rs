//! The expert permutation (kernels/moe.cu `moe_align_*`): device-side counts, padded
//! offsets, rows ordered by token inside each expert, and the block -> expert map.

use crate::backend::{Device, KernelRef, LaunchDims, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_MOE_ALIGN_MAX_CHUNKS, LLK_MOE_ALIGN_MIN_CHUNK, LLK_MOE_ALIGN_THREADS, LLK_MOE_GEMM_BLOCK_M,
    LLK_MOE_GEMM_BLOCK_M_DECODE, LLK_MOE_MAX_EXPERTS, LLK_MOE_ROW_THREADS, MoeAlignParams,
};
use crate::kernels::moe::{ALIGN_HISTOGRAM, ALIGN_SCAN, ALIGN_SCATTER};
use crate::launch::KernelArgs;
use crate::launch::{check_dtype, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView};

use super::route::{MAX_EXPERTS, MAX_TOP_K_GROUPED};
use super::rows::{contiguous_rows, to_i32};
use crate::ops::error_flag::{BAD_EXPERT, Meanings, check_flag};

const OP_ALIGN: &str = "moe_align";

/// Rows per grouped-GEMM block: prefill and decode.
pub const BLOCK_M: usize = LLK_MOE_GEMM_BLOCK_M as usize;
/// Rows per block of the decode grouped GEMM (see [`preferred_block_m`]).
pub const BLOCK_M_DECODE: usize = LLK_MOE_GEMM_BLOCK_M_DECODE as usize;

/// Upper bound on the grouped GEMM's row blocks for `slots` rows over `experts` experts:
/// `sum_e ceil(c_e / block_m) <= floor((slots + min(experts, slots) (block_m - 1)) / block_m)`.
/// `Err` when the bound overflows `usize` (`block_m` must be > 0).
pub(crate) fn max_blocks(slots: usize, experts: usize, block_m: usize) -> Result<usize> {
    experts
        .min(slots)
        .checked_mul(block_m.saturating_sub(1))
        .and_then(|pad| pad.checked_add(slots))
        .and_then(|n| n.checked_div(block_m))
        .ok_or_else(|| too_many_slots(slots, experts, block_m))
}

fn too_many_slots(slots: usize, experts: usize, block_m: usize) -> Error {
    Error::invalid(
        OP_ALIGN,
        "slots",
        slots,
        format!("too many: padded for {experts} experts in blocks of {block_m} rows, the row count overflows"),
    )
}

/// Rows an expert-contiguous buffer (gather output, GEMM input and output) needs for `slots`
/// slots: every block the GEMM may run, whole. `Err` when that count overflows `usize`.
pub fn padded_rows(slots: usize, experts: usize, block_m: usize) -> Result<usize> {
    max_blocks(slots, experts, block_m)?.checked_mul(block_m).ok_or_else(|| too_many_slots(slots, experts, block_m))
}

/// The GEMM block rows for `slots` slots over `experts` experts: 16 (the decode kernel) when the
/// experts average at most 16 rows, else 64.
pub fn preferred_block_m(slots: usize, experts: usize) -> usize {
    if slots <= BLOCK_M_DECODE * experts.min(slots).max(1) { BLOCK_M_DECODE } else { BLOCK_M }
}

/// Slots per align chunk (at most LLK_MOE_ALIGN_MAX_CHUNKS chunks) and the chunk count.
fn chunking(slots: usize) -> (usize, usize) {
    let min = LLK_MOE_ALIGN_MIN_CHUNK as usize;
    let chunk = min * slots.div_ceil(min * LLK_MOE_ALIGN_MAX_CHUNKS as usize).max(1);
    (chunk, slots.div_ceil(chunk))
}

/// The expert permutation on the device: per-expert counts, padded segment offsets, the row of
/// every (token, slot) in the expert-contiguous buffer (ordered by token inside each expert),
/// and the GEMM's block -> expert map. Plan it once for the largest `tokens * k`; an alignment
/// within capacity allocates nothing (a larger one grows the buffers: the only allocation).
///
/// Expert ids outside `[0, experts)` (possible only with caller-made ids) are dropped: their slot
/// gets row -1, so gather and combine skip it, and [`MoeAlign::check_errors`] reports it.
#[derive(Debug)]
pub struct MoeAlign {
    device: Device,
    experts: usize,
    capacity: usize,
    arrays: Option<AlignArrays>,
    state: Option<AlignState>,
}

#[derive(Debug)]
pub(crate) struct AlignArrays {
    pub flag: Tensor,
    pub counts: Tensor,
    pub offsets: Tensor,
    pub rows: Tensor,
    pub block_expert: Tensor,
    pub chunk_counts: Tensor,
}

/// What the last alignment was for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct AlignState {
    pub tokens: usize,
    pub top_k: usize,
    pub block_m: usize,
}

impl MoeAlign {
    /// A permutation for `experts` experts (1..=512), planned for up to `max_slots` slots
    /// (`tokens * k`).
    pub fn plan(device: &Device, experts: usize, max_slots: usize) -> Result<MoeAlign> {
        if experts == 0 || experts > MAX_EXPERTS {
            return Err(Error::invalid(OP_ALIGN, "experts", experts, format!("must be 1..={MAX_EXPERTS}")));
        }
        let mut a = MoeAlign { device: device.clone(), experts, capacity: 0, arrays: None, state: None };
        a.reserve(max_slots)?;
        Ok(a)
    }

    fn reserve(&mut self, slots: usize) -> Result<()> {
        if self.arrays.is_some() && slots <= self.capacity {
            return Ok(());
        }
        let slots = slots.max(1);
        to_i32(OP_ALIGN, "slots", padded_rows(slots, self.experts, BLOCK_M)?)?;
        let e = self.experts;
        let blocks = max_blocks(slots, e, BLOCK_M_DECODE)?.max(max_blocks(slots, e, BLOCK_M)?).max(1);
        let chunk = LLK_MOE_ALIGN_MAX_CHUNKS as usize * e;
        let sizes = [1, e, e + 1, slots, blocks, chunk];
        let total: usize = sizes.iter().sum();
        let buf = Tensor::zeros(&self.device, DType::I32, &[total])?;
        let mut at = 0;
        let mut part = |n: usize| -> Result<Tensor> {
            let t = buf.narrow(0, at, n)?;
            at += n;
            Ok(t)
        };
        self.arrays = Some(AlignArrays {
            flag: part(sizes[0])?,
            counts: part(sizes[1])?,
            offsets: part(sizes[2])?,
            rows: part(sizes[3])?,
            block_expert: part(sizes[4])?,
            chunk_counts: part(sizes[5])?,
        });
        self.capacity = slots;
        Ok(())
    }

    pub(crate) fn arrays(&self) -> Result<&AlignArrays> {
        self.arrays.as_ref().ok_or(Error::InvalidView { what: OP_ALIGN, why: "not planned".into() })
    }
    pub(crate) fn state(&self, op: &'static str) -> Result<AlignState> {
        self.state.ok_or(Error::InvalidView { what: op, why: "the permutation has not been aligned yet".into() })
    }

    /// Experts the permutation was planned for.
    pub fn experts(&self) -> usize {
        self.experts
    }
    /// Slots planned for.
    pub fn capacity(&self) -> usize {
        self.capacity
    }
    /// `(tokens, top_k, block_m)` of the last alignment.
    pub fn aligned_for(&self) -> Option<(usize, usize, usize)> {
        self.state.map(|s| (s.tokens, s.top_k, s.block_m))
    }
    /// Rows the expert-contiguous buffers need for the last alignment.
    pub fn padded_rows(&self) -> Option<usize> {
        // (Within the planned capacity, which was checked to fit: never `None` after an alignment.)
        self.state.and_then(|s| padded_rows(s.tokens * s.top_k, self.experts, s.block_m).ok())
    }
    /// `[experts]` i32: rows routed to each expert (device memory, valid after an alignment).
    pub fn counts(&self) -> Result<Tensor> {
        Ok(self.arrays()?.counts.clone())
    }
    /// `[experts + 1]` i32: each expert's padded segment start; the last is the padded total.
    pub fn offsets(&self) -> Result<Tensor> {
        Ok(self.arrays()?.offsets.clone())
    }
    /// `[tokens * k]` i32 of the last alignment: the row of every slot (-1: dropped).
    pub fn rows(&self) -> Result<Tensor> {
        let s = self.state(OP_ALIGN)?;
        self.arrays()?.rows.narrow(0, 0, s.tokens * s.top_k)
    }
    /// The block -> expert map of the last alignment (entries below the padded total / block_m
    /// are set; the rest are stale).
    pub fn block_expert(&self) -> Result<Tensor> {
        let s = self.state(OP_ALIGN)?;
        self.arrays()?.block_expert.narrow(0, 0, max_blocks(s.tokens * s.top_k, self.experts, s.block_m)?)
    }

    /// Reads and clears the device-side error flag (waits for the device): `Err` when an earlier
    /// alignment met an expert id outside `[0, experts)` (those slots were dropped).
    pub fn check_errors(&self) -> Result<()> {
        const MEANINGS: &Meanings = &[BAD_EXPERT];
        check_flag(OP_ALIGN, &self.arrays()?.flag, MEANINGS)
    }

    /// Aligns `ids` (`[tokens, k]` i32, contiguous) for GEMM blocks of `block_m` rows (16 or
    /// 64, see [`preferred_block_m`]).
    pub fn align(&mut self, ids: &Tensor, block_m: usize) -> Result<()> {
        self.align_on(ids.device(), &ids.view(), block_m)
    }

    /// [`MoeAlign::align`] on a borrowed view, queued on `queue`.
    pub fn align_on(&mut self, queue: &impl Queue, ids: &TensorView<'_>, block_m: usize) -> Result<()> {
        const OP: &str = OP_ALIGN;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "permutation" });
        }
        check_dtype(OP, "ids", ids.dtype(), DType::I32)?;
        if block_m != BLOCK_M && block_m != BLOCK_M_DECODE {
            return Err(Error::invalid(OP, "block_m", block_m, format!("must be {BLOCK_M_DECODE} or {BLOCK_M}")));
        }
        if ids.shape().len() != 2 {
            return Err(Error::shape(OP, "ids", ids.shape().to_vec(), "[tokens, k]"));
        }
        let (tokens, top_k) = (ids.shape()[0], ids.shape()[1]);
        // Gather and combine take k from this alignment, and combine keeps a token's k slots in
        // shared arrays of MAX_TOP_K_GROUPED entries (the most any routing mode produces).
        if !(1..=MAX_TOP_K_GROUPED).contains(&top_k) {
            return Err(Error::invalid(
                OP,
                "top_k",
                top_k,
                format!("must be 1..={MAX_TOP_K_GROUPED} (ids is [tokens, k])"),
            ));
        }
        let slots =
            tokens.checked_mul(top_k).ok_or_else(|| Error::TooLarge { what: "ids", shape: ids.shape().to_vec() })?;
        self.reserve(slots)?;
        let arrays = self.arrays.as_ref().ok_or(Error::InvalidView { what: OP, why: "not planned".into() })?;
        let (chunk_slots, chunks) = chunking(slots);
        let experts = self.experts;
        // Three launches over the same memory: each registers all of it.
        let launch = |kernel: KernelRef, dims: LaunchDims| -> Result<()> {
            let mut args = KernelArgs::new(OP, &device);
            let ib = args.read("ids", ids)?;
            contiguous_rows(OP, "ids", &ib)?;
            let params = MoeAlignParams {
                ids: ib.addr,
                chunk_counts: args.write_tensor("chunk_counts", &arrays.chunk_counts)?,
                counts: args.write_tensor("counts", &arrays.counts)?,
                offsets: args.write_tensor("offsets", &arrays.offsets)?,
                rows: args.write_tensor("rows", &arrays.rows)?,
                block_expert: args.write_tensor("block_expert", &arrays.block_expert)?,
                error_flag: args.write_tensor("error_flag", &arrays.flag)?,
                slots: to_i64(OP, "slots", slots)?,
                experts: to_i64(OP, "experts", experts)?,
                chunks: to_i64(OP, "chunks", chunks)?,
                chunk_slots: to_i64(OP, "chunk slots", chunk_slots)?,
                block_m: to_i64(OP, "block_m", block_m)?,
            };
            args.launch(kernel, dims, &params)
        };
        let chunk_dims =
            LaunchDims { grid: (grid_x(OP, chunks)?, 1, 1), block: (LLK_MOE_ALIGN_THREADS, 1, 1), smem_at_launch: 0 };
        if chunks > 0 {
            launch(ALIGN_HISTOGRAM, chunk_dims)?;
        }
        launch(ALIGN_SCAN, LaunchDims { grid: (1, 1, 1), block: (LLK_MOE_MAX_EXPERTS, 1, 1), smem_at_launch: 0 })?;
        if chunks > 0 {
            launch(ALIGN_SCATTER, chunk_dims)?;
        }
        self.state = Some(AlignState { tokens, top_k, block_m });
        Ok(())
    }
}

/// Threads per gather/combine block: one per vector, up to LLK_MOE_ROW_THREADS, whole warps.
pub(crate) fn row_threads(cols: usize, vec: bool, v: usize) -> u32 {
    let n = if vec { cols / v } else { cols };
    (n.div_ceil(32) * 32).clamp(32, LLK_MOE_ROW_THREADS as usize) as u32
}

pub(crate) fn check_align_tokens(
    op: &'static str,
    what: &'static str,
    b: &crate::launch::Arg,
    rows: usize,
    state: AlignState,
) -> Result<()> {
    if rows != state.tokens {
        return Err(Error::shape(
            op,
            what,
            b.shape().to_vec(),
            format!("{} rows (the tokens of the last alignment)", state.tokens),
        ));
    }
    Ok(())
}

pub(crate) fn check_weights_shape(op: &'static str, w: &crate::launch::Arg, state: AlignState) -> Result<()> {
    if w.shape() != [state.tokens, state.top_k] {
        return Err(Error::shape(
            op,
            "weights",
            w.shape().to_vec(),
            format!("[{}, {}] like the aligned ids", state.tokens, state.top_k),
        ));
    }
    contiguous_rows(op, "weights", w)?;
    Ok(())
}
