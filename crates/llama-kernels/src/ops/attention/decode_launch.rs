//! One split-KV decode launch in named steps: bind the views ([`DecodeBound`]), check them
//! against the plan, check the aliasing and alignment, fill [`PagedDecodeParams`], launch the
//! decode kernel, then (with more than one split) the merge of the partial outputs.
//!
//! Grid: x = batch x splits, y = KV heads x row blocks (the q heads of one KV group and the
//! q_len new tokens share the mma rows); `LLK_DECODE_THREADS` threads.

use super::paged::PagedKvView;
use super::variant::Variant;
use crate::backend::{KernelRef, LaunchDims, blocks_per_sm_by_smem};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    LLK_DECODE_KEYS, LLK_DECODE_ROWS_MMA, LLK_DECODE_STAGES_SMALL, LLK_DECODE_THREADS, MergeStatesParams,
    PagedDecodeParams,
};
use crate::kernels::paged_attention::{DECODE_KERNELS, FEW_STAGE_DECODE_KERNELS, MERGE_KERNELS, MergeSource};
use crate::launch::pool::{Pool, check_block_table, check_pools, table_rows};
use crate::launch::{Arg, Heads, KernelArgs, Rows, check_disjoint, check_dtype, grid_x, to_i64};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

/// One decode call on borrowed views
/// ([`PagedDecodeWorkspace::forward_on`](super::PagedDecodeWorkspace::forward_on)), the argument
/// struct of the op as `PagedDecodeParams` is the kernel's.
#[derive(Debug)]
pub struct DecodeArgs<'r, 'a> {
    /// The new tokens' queries, `[batch * q_len, q_heads, head_dim]`.
    pub q: &'r TensorView<'a>,
    /// The page pools (the new tokens already appended).
    pub kv: &'r PagedKvView<'r, 'a>,
    /// `[batch, max_pages]` i32: the pages of each sequence.
    pub block_table: &'r TensorView<'a>,
    /// `[batch]` i32: each sequence's length, its new tokens included.
    pub seq_lens: &'r TensorView<'a>,
    /// The output, shaped as q.
    pub out: &'r mut TensorViewMut<'a>,
    /// `[q_heads, batch * q_len]` f32, if wanted.
    pub lse: Option<&'r mut TensorViewMut<'a>>,
}

pub(super) const OP: &str = "paged_decode_attention";
/// Keys per tile (the split granularity).
pub(super) const KEYS_PER_TILE: usize = LLK_DECODE_KEYS as usize;
const THREADS: u32 = LLK_DECODE_THREADS;

/// The batch shape a decode plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Largest batch (sequences) of the calls.
    pub batch: usize,
    /// New tokens per sequence (1..=8).
    pub q_len: usize,
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// KV heads of the cache (> 0).
    pub kv_heads: usize,
    /// Elements per head: one of [`SUPPORTED_HEAD_DIMS`](super::SUPPORTED_HEAD_DIMS).
    pub head_dim: usize,
    /// Longest context (keys, the new tokens included) the calls may have: it sizes the split
    /// count, and every call's block table must hold at least `ceil(max_seq_len / page_size)`
    /// pages per row. A longer sequence on the device is clamped to its block-table row and
    /// flagged.
    pub max_seq_len: usize,
    /// q and output dtype.
    pub dtype: DType,
    /// Page dtype: the q dtype or fp8 for bf16/f16, f32 for f32.
    pub page_dtype: DType,
}

/// The two configurations of the tensor-core decode kernel: the first, with the K/V stages its
/// layout picks (three where they fit in 128 KiB with Q, else two), and the second, with
/// `LLK_DECODE_STAGES_SMALL` (params.h) stages (16-bit pages at head_dim 96 and 128). Each is a kernel of
/// its own, whose shared memory is its declaration ([`decode_config`] chooses by it).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DecodeConfig {
    /// The first configuration.
    Default,
    /// Fewer K/V stages, so more blocks fit on an SM.
    FewStages,
}

/// The configuration of the decode kernel of `dtype` q and `page_dtype` pages at `head_dim` on a
/// GPU with `per_sm` bytes of shared memory per SM and `per_block` per block: the second where it
/// gives more resident blocks (168 registers per thread allow three): on an A100 two 80 KiB
/// blocks instead of one of 112 KiB, on 8.6/8.9 one instead of none (112 KiB is over their 99 KiB
/// per block). Hopper, with two blocks of either, keeps the first. Without a second configuration
/// (or a kernel) for the dtypes and head dim, the first.
pub fn decode_config(
    per_sm: usize,
    per_block: usize,
    dtype: DType,
    page_dtype: DType,
    head_dim: usize,
) -> DecodeConfig {
    let blocks = |kernel: Option<KernelRef>| {
        let bytes = kernel?.shared_memory().ok()?.bytes() as usize;
        Some(if bytes > per_block { 0 } else { blocks_per_sm_by_smem(per_sm, bytes) })
    };
    let first = blocks(DECODE_KERNELS.get((head_dim, page_dtype, dtype)));
    let second = if page_dtype == dtype { blocks(FEW_STAGE_DECODE_KERNELS.get((head_dim, dtype))) } else { None };
    match (first, second) {
        (Some(first), Some(second)) if second > first => DecodeConfig::FewStages,
        _ => DecodeConfig::Default,
    }
}

/// K/V stages of the decode kernel in `config` (its pipeline depth, for the performance model
/// and the shared-memory table): `LLK_DECODE_STAGES_SMALL` (params.h), or the first configuration's,
/// which its layout picks. A test holds this to the kernels: every decode kernel's declared
/// shared memory is the Q rows plus this many stages of a K tile, a V tile and a byte per key.
pub fn decode_stages_of(config: DecodeConfig, page_dtype: DType, head_dim: usize) -> usize {
    match config {
        DecodeConfig::FewStages => LLK_DECODE_STAGES_SMALL as usize,
        DecodeConfig::Default => {
            let (q, tile) = decode_tiles_of(head_dim, page_dtype.size());
            if q + 3 * (2 * tile + KEYS_PER_TILE) <= 131072 { 3 } else { 2 }
        }
    }
}

/// Bytes of the Q rows and of one K or V tile of the tensor-core decode kernel (DecodeLayout in
/// kernels/paged_attention.cu): rows of a power of two of 16-byte chunks, at least 8.
pub fn decode_tiles_of(head_dim: usize, page_elem: usize) -> (usize, usize) {
    let pitch = |chunks: usize| chunks.next_power_of_two().max(8);
    let rows = LLK_DECODE_ROWS_MMA as usize;
    (rows * pitch(head_dim / 8) * 16, KEYS_PER_TILE * pitch(head_dim * page_elem / 16) * 16)
}

/// Checks the dtypes of one call against the plan.
pub(super) fn check_dtypes(
    plan: &DecodeShape,
    q: &TensorView<'_>,
    kv: &PagedKvView<'_, '_>,
    seq_lens: &TensorView<'_>,
    out: &TensorViewMut<'_>,
    lse: Option<&TensorViewMut<'_>>,
) -> Result<()> {
    check_dtype(OP, "q", q.dtype(), plan.dtype)?;
    check_dtype(OP, "out", out.dtype(), plan.dtype)?;
    check_dtype(OP, "k_pages", kv.k_pages.dtype(), plan.page_dtype)?;
    check_dtype(OP, "seq_lens", seq_lens.dtype(), DType::I32)?;
    if let Some(l) = lse {
        check_dtype(OP, "lse", l.dtype(), DType::F32)?;
    }
    Ok(())
}

/// The registered views of one decode call, checked against the plan.
pub(super) struct DecodeBound {
    pub out: Arg,
    pub lse: Option<Arg>,
    pub q: Arg,
    pub k_pages: Arg,
    pub v_pages: Arg,
    pub table: Arg,
    pub seq_lens: Arg,
    pub kp: Pool,
    pub vp: Pool,
    pub qh: Heads,
    pub oh: Heads,
    pub batch: usize,
    pub max_pages: usize,
    pub table_stride: usize,
}

impl DecodeBound {
    /// Registers every view (outputs first) and checks the pools, the batch, q and out, the
    /// block table and the LSE against `plan`.
    pub fn new<'a>(args: &mut KernelArgs<'a>, plan: &DecodeShape, views: DecodeArgs<'a, '_>) -> Result<DecodeBound> {
        let DecodeArgs { q, kv, block_table, seq_lens, out, lse } = views;
        let ob = args.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(args.write("lse", l)?),
            None => None,
        };
        let qb = args.read("q", q)?;
        let (kpb, vpb) = (args.read("k_pages", kv.k_pages)?, args.read("v_pages", kv.v_pages)?);
        let (tb, sb) = (args.read("block_table", block_table)?, args.read("seq_lens", seq_lens)?);
        let (kp, vp) = (Pool::of(OP, "k_pages", &kpb)?, Pool::of(OP, "v_pages", &vpb)?);
        check_pools(OP, &kp, &vp)?;
        if (kp.kv_heads, kp.head_dim) != (plan.kv_heads, plan.head_dim) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "k_pages",
                got: kpb.shape().to_vec(),
                expected: format!(
                    "[pages, page_size, {}, {}] (the planned kv_heads and head_dim)",
                    plan.kv_heads, plan.head_dim
                ),
            });
        }
        let batch = batch_of(plan, &sb)?;
        let (qh, oh) = check_q_out(plan, batch, &qb, &ob)?;
        let (max_pages, table_stride) = check_block_table(OP, &tb, batch)?;
        let needed = plan.max_seq_len.div_ceil(kp.page_size);
        if max_pages < needed {
            return Err(Error::invalid(
                OP,
                "block_table",
                format!("{max_pages} pages per row"),
                format!("too narrow: max_seq_len {} needs {needed} pages of {}", plan.max_seq_len, kp.page_size),
            ));
        }
        let tokens = batch * plan.q_len;
        if let Some(l) = &lb {
            if l.shape() != [plan.q_heads, tokens] || !l.dims.is_contiguous() {
                return Err(Error::shape(
                    OP,
                    "lse",
                    l.shape().to_vec(),
                    format!("contiguous [{}, {tokens}] (q_heads, batch * q_len)", plan.q_heads),
                ));
            }
        }
        Ok(DecodeBound {
            out: ob,
            lse: lb,
            q: qb,
            k_pages: kpb,
            v_pages: vpb,
            table: tb,
            seq_lens: sb,
            kp,
            vp,
            qh,
            oh,
            batch,
            max_pages,
            table_stride,
        })
    }

    /// Aliasing: out and lse are written, everything else read.
    pub fn check_disjoint(&self, plan: &DecodeShape) -> Result<()> {
        let (qh, oh) = (self.qh, self.oh);
        let tables = table_rows(&self.table, self.max_pages, self.table_stride);
        let lens = Rows { addr: self.seq_lens.addr, elem: 4, rows: 1, cols: self.batch, row_stride: self.batch };
        let reads =
            [("k_pages", self.kp.rows()), ("v_pages", self.vp.rows()), ("block_table", tables), ("seq_lens", lens)];
        check_disjoint(OP, ("out", oh), ("q", qh))?;
        for (what, r) in reads {
            check_disjoint(OP, ("out", oh), (what, r))?;
        }
        if let Some(l) = &self.lse {
            let n = plan.q_heads * self.batch * plan.q_len;
            let lrows = Rows { addr: l.addr, elem: 4, rows: 1, cols: n, row_stride: n };
            check_disjoint(OP, ("lse", lrows), ("q", qh))?;
            check_disjoint(OP, ("lse", lrows), ("out", oh))?;
            for (what, r) in reads {
                check_disjoint(OP, ("lse", lrows), (what, r))?;
            }
        }
        Ok(())
    }

    /// 16-byte rows for the vector and cp.async paths.
    pub fn check_aligned(&self) -> Result<()> {
        for (what, h) in [("q", &self.qh), ("out", &self.oh)] {
            h.check_rows_aligned(OP, what)?;
        }
        self.kp.check_aligned(OP, "k_pages")?;
        self.vp.check_aligned(OP, "v_pages")
    }
}

/// The batch, from `seq_lens` (at most the planned one).
fn batch_of(plan: &DecodeShape, sb: &Arg) -> Result<usize> {
    if sb.shape().len() != 1 || !sb.dims.is_contiguous() {
        return Err(Error::shape(OP, "seq_lens", sb.shape().to_vec(), "a contiguous [batch] vector"));
    }
    let batch = sb.shape()[0];
    if batch > plan.batch {
        return Err(Error::invalid(OP, "batch", batch, format!("exceeds the planned batch {}", plan.batch)));
    }
    Ok(batch)
}

/// q and out are `[batch * q_len, q_heads, head_dim]`.
fn check_q_out(plan: &DecodeShape, batch: usize, qb: &Arg, ob: &Arg) -> Result<(Heads, Heads)> {
    let tokens = batch * plan.q_len;
    let (qh, oh) = (Heads::of(OP, "q", qb)?, Heads::of(OP, "out", ob)?);
    for (what, b, h) in [("q", qb, &qh), ("out", ob, &oh)] {
        if (h.tokens, h.heads, h.head_dim) != (tokens, plan.q_heads, plan.head_dim) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what,
                got: b.shape().to_vec(),
                expected: format!(
                    "[{tokens}, {}, {}] (batch {batch} x q_len {}, q_heads, head_dim)",
                    plan.q_heads, plan.head_dim, plan.q_len
                ),
            });
        }
    }
    Ok((qh, oh))
}

/// Where the decode kernel writes: `out` directly (one split), or the partial buffers.
pub(super) struct Outputs {
    pub partial_out: u64,
    pub partial_lse: u64,
    pub error_flag: u64,
    pub num_splits: usize,
    pub row_blocks: usize,
}

/// Fills the params struct of the decode kernel.
pub(super) fn params(
    plan: &DecodeShape,
    b: &DecodeBound,
    o: &Outputs,
    variant: &Variant,
    scales: ([f32; 128], [f32; 128]),
) -> Result<PagedDecodeParams> {
    let (kp, vp, qh, oh) = (&b.kp, &b.vp, &b.qh, &b.oh);
    let single = o.num_splits == 1;
    Ok(PagedDecodeParams {
        q: b.q.addr,
        k_pages: b.k_pages.addr,
        v_pages: b.v_pages.addr,
        block_table: b.table.addr,
        seq_lens: b.seq_lens.addr,
        out: if single { b.out.addr } else { 0 },
        lse: if single { b.lse.map_or(0, |l| l.addr) } else { 0 },
        partial_out: o.partial_out,
        partial_lse: o.partial_lse,
        error_flag: o.error_flag,
        batch: to_i64(OP, "batch", b.batch)?,
        q_len: to_i64(OP, "q_len", plan.q_len)?,
        q_heads: to_i64(OP, "q_heads", plan.q_heads)?,
        kv_heads: to_i64(OP, "kv_heads", plan.kv_heads)?,
        head_dim: to_i64(OP, "head_dim", plan.head_dim)?,
        num_pages: to_i64(OP, "num_pages", kp.num_pages)?,
        page_size: to_i64(OP, "page_size", kp.page_size)?,
        max_pages: to_i64(OP, "max_pages", b.max_pages)?,
        block_table_stride: to_i64(OP, "block table stride", b.table_stride)?,
        q_token_stride: to_i64(OP, "q token stride", qh.token_stride)?,
        q_head_stride: to_i64(OP, "q head stride", qh.head_stride)?,
        out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
        out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
        k_page_stride: to_i64(OP, "k page stride", kp.page_stride)?,
        v_page_stride: to_i64(OP, "v page stride", vp.page_stride)?,
        num_splits: to_i64(OP, "num_splits", o.num_splits)?,
        row_blocks: to_i64(OP, "row blocks", o.row_blocks)?,
        variant: variant.raw(OP)?,
        k_scale: scales.0,
        v_scale: scales.1,
    })
}

/// Grid and block of the decode kernel (its shared memory is the kernel's declaration).
pub(super) fn launch_dims(plan: &DecodeShape, b: &DecodeBound, o: &Outputs) -> Result<LaunchDims> {
    let grid_y = plan
        .kv_heads
        .checked_mul(o.row_blocks)
        .and_then(|y| u32::try_from(y).ok())
        .filter(|&y| y <= 65535)
        .ok_or_else(|| Error::invalid(OP, "kv_heads", plan.kv_heads, "too many head blocks for grid.y (65535)"))?;
    Ok(LaunchDims {
        grid: (
            grid_x(
                OP,
                b.batch.checked_mul(o.num_splits).ok_or_else(|| Error::invalid(OP, "batch", b.batch, "too large"))?,
            )?,
            grid_y,
            1,
        ),
        block: (THREADS, 1, 1),
        smem_at_launch: 0,
    })
}

/// The decode kernel of the plan's dtypes in `config` ([`decode_config`]).
pub(super) fn kernel(plan: &DecodeShape, page_dtype: DType, config: DecodeConfig) -> Result<KernelRef> {
    decode_kernel(plan.dtype, page_dtype, plan.head_dim, config)
}

/// The decode kernel of `dtype` q and `page_dtype` pages at `head_dim` in `config`.
pub fn decode_kernel(dtype: DType, page_dtype: DType, head_dim: usize, config: DecodeConfig) -> Result<KernelRef> {
    if config == DecodeConfig::FewStages {
        FEW_STAGE_DECODE_KERNELS.find(OP, "q", (head_dim, dtype))
    } else {
        DECODE_KERNELS.find(OP, "q", (head_dim, page_dtype, dtype))
    }
}

/// Merges the splits' partial outputs (f32, in the workspace) into `out` (and `lse`), in split
/// order: one more launch on `args`' device.
pub(super) fn merge_splits<'a>(
    mut margs: KernelArgs<'a>,
    plan: &DecodeShape,
    partial: (&'a Tensor, &'a Tensor),
    (out, lse): (Arg, Option<Arg>),
    oh: &Heads,
    tokens: usize,
    splits: usize,
) -> Result<()> {
    let merge = MergeStatesParams {
        v_a: margs.read_tensor("workspace", partial.0)?,
        lse_a: margs.read_tensor("workspace", partial.1)?,
        v_b: 0,
        lse_b: 0,
        out: out.addr,
        lse_out: lse.map_or(0, |l| l.addr),
        tokens: to_i64(OP, "tokens", tokens)?,
        heads: to_i64(OP, "q_heads", plan.q_heads)?,
        head_dim: to_i64(OP, "head_dim", plan.head_dim)?,
        num_states: to_i64(OP, "num_splits", splits)?,
        a_token_stride: 0,
        a_head_stride: 0,
        b_token_stride: 0,
        b_head_stride: 0,
        out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
        out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
        lse_a_token_stride: 0,
        lse_a_head_stride: 0,
        lse_b_token_stride: 0,
        lse_b_head_stride: 0,
        lse_out_token_stride: 1,
        lse_out_head_stride: to_i64(OP, "tokens", tokens)?,
    };
    let rows = tokens * plan.q_heads;
    let mdims = LaunchDims { grid: (grid_x(OP, rows.div_ceil(4))?, 1, 1), block: (THREADS, 1, 1), smem_at_launch: 0 };
    margs.launch(MERGE_KERNELS.find(OP, "out", (MergeSource::Splits, plan.dtype))?, mdims, &merge)
}
