//! Split-KV decode attention over the paged cache (kernels/paged_attention.cu): the planner
//! ([`PagedDecodeWorkspace::plan`]) and the launch of the decode and merge kernels. See
//! [`crate::ops::attention`] for the semantics.

use crate::backend::{Device, LaunchDims, Queue};
use crate::launch::KernelArgs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::spec::attention::Llama4Temperature;
use crate::kernels::attention::SUPPORTED_HEAD_DIMS;
use crate::kernels::paged_attention::{DECODE_KERNELS, MERGE_KERNELS};
use crate::launch::pool::{Pool, check_block_table, check_pools, table_rows};
use crate::launch::{Heads, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::ffi::params::{
    LLK_DECODE_KEYS, LLK_DECODE_MAX_Q_LEN, LLK_DECODE_MAX_SPLITS,
    LLK_DECODE_ROWS_MMA, LLK_DECODE_ROWS_SIMT, LLK_DECODE_THREADS, LlkAttnMask, LlkAttnTemperature, MergeStatesParams, PagedDecodeParams,
};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

use crate::ops::error_flag::ErrorFlag;
use super::paged::{PagedKv, PagedKvCache};

const DECODE: &str = "paged_decode_attention";
/// Most query tokens per sequence in one decode call.
pub const MAX_Q_LEN: usize = LLK_DECODE_MAX_Q_LEN as usize;
/// Most splits per sequence.
pub const MAX_SPLITS: usize = LLK_DECODE_MAX_SPLITS as usize;
const KEYS_PER_TILE: usize = LLK_DECODE_KEYS as usize;
const THREADS: u32 = LLK_DECODE_THREADS;

/// Dynamic shared memory of a tensor-core decode kernel (DecodeLayout in
/// kernels/paged_attention.cu): Q rows, and 2 or 3 stages of K and V tiles plus a byte per key.
pub fn decode_smem_bytes(head_dim: usize, page_elem: usize) -> usize {
    let pitch = |chunks: usize| {
        if chunks <= 8 {
            8
        } else if chunks <= 16 {
            16
        } else {
            32
        }
    };
    let rows = LLK_DECODE_ROWS_MMA as usize;
    let q = rows * pitch(head_dim / 8) * 16;
    let tile = KEYS_PER_TILE * pitch(head_dim * page_elem / 16) * 16;
    let stages = if q + 3 * 2 * tile + 3 * KEYS_PER_TILE <= 131072 { 3 } else { 2 };
    q + stages * (2 * tile + KEYS_PER_TILE)
}

/// The batch shape a decode plan is made for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DecodeShape {
    /// Largest batch (sequences) of the calls.
    pub batch: usize,
    /// New tokens per sequence (1..=8).
    pub q_len: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
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

/// Options of one decode call.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct PagedDecodeOptions {
    /// Softmax scale, finite and > 0; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Llama 4 chunked local attention: only keys in the query's chunk `floor(pos / chunk_size)`.
    pub chunk_size: Option<usize>,
    /// Llama 4 temperature tuning, from each query's absolute position.
    pub temperature: Option<Llama4Temperature>,
}

/// The split count the planner picks: enough (sequence, kv head, split) blocks for about two per
/// SM, at least 4 tiles (256 keys) per split, at most [`MAX_SPLITS`]. Deterministic in its inputs.
pub fn plan_splits(sm_count: usize, blocks_per_split: usize, max_seq_len: usize) -> usize {
    let target = 2 * sm_count.max(1);
    let by_fill = (target / blocks_per_split.max(1)).max(1);
    let tiles = max_seq_len.div_ceil(KEYS_PER_TILE).max(1);
    let by_length = tiles.div_ceil(4).max(1);
    by_fill.min(by_length).min(MAX_SPLITS)
}

/// A planned decode: the split count for one batch shape, the partial outputs of the splits and
/// an error flag. Plan once per batch shape; calls then allocate nothing.
#[derive(Debug)]
pub struct PagedDecodeWorkspace {
    device: Device,
    shape: DecodeShape,
    num_splits: usize,
    rows_per_block: usize,
    /// `[num_splits, batch * q_len, q_heads, head_dim]` and `[num_splits, batch * q_len, q_heads]`
    /// f32 (num_splits > 1).
    partial: Option<(Tensor, Tensor)>,
    errors: ErrorFlag,
}

impl PagedDecodeWorkspace {
    /// Plans a decode for `shape` on `device`, picking the split count ([`plan_splits`]).
    pub fn plan(device: &Device, shape: &DecodeShape) -> Result<PagedDecodeWorkspace> {
        Self::plan_with_splits(device, shape, None)
    }

    /// [`PagedDecodeWorkspace::plan`] with an explicit split count (1..=[`MAX_SPLITS`]).
    pub fn plan_with_splits(
        device: &Device,
        shape: &DecodeShape,
        num_splits: Option<usize>,
    ) -> Result<PagedDecodeWorkspace> {
        const OP: &str = DECODE;
        let s = *shape;
        check_float(OP, "q", s.dtype)?;
        let pages_ok = match s.dtype {
            DType::F32 => s.page_dtype == DType::F32,
            _ => s.page_dtype == s.dtype || s.page_dtype == DType::F8E4M3,
        };
        if !pages_ok {
            return Err(Error::UnsupportedDType {
                op: OP,
                what: "pages",
                dtype: s.page_dtype,
                supported: "the q dtype, or fp8 with bf16/f16 q",
            });
        }
        if !SUPPORTED_HEAD_DIMS.contains(&s.head_dim) {
            return Err(Error::invalid(
                OP,
                "head_dim",
                s.head_dim,
                format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})"),
            ));
        }
        if s.kv_heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0"));
        }
        if s.q_heads % s.kv_heads != 0 {
            return Err(Error::invalid(OP, "q_heads", s.q_heads, format!("not divisible by kv_heads {}", s.kv_heads)));
        }
        if !(1..=MAX_Q_LEN).contains(&s.q_len) {
            return Err(Error::invalid(OP, "q_len", s.q_len, format!("must be 1..={MAX_Q_LEN}")));
        }
        if s.max_seq_len > i32::MAX as usize {
            return Err(Error::invalid(OP, "max_seq_len", s.max_seq_len, "must fit in i32"));
        }
        let rows_per_block = if s.dtype == DType::F32 { LLK_DECODE_ROWS_SIMT } else { LLK_DECODE_ROWS_MMA } as usize;
        let group = s.q_heads / s.kv_heads;
        let row_blocks = (group * s.q_len).div_ceil(rows_per_block).max(1);
        let num_splits = match num_splits {
            Some(n) if n == 0 || n > MAX_SPLITS => {
                return Err(Error::invalid(OP, "num_splits", n, format!("must be 1..={MAX_SPLITS}")));
            }
            Some(n) => n,
            None => plan_splits(device.sm_count(), s.batch.max(1) * s.kv_heads * row_blocks, s.max_seq_len),
        };
        let tokens = s.batch.checked_mul(s.q_len).ok_or_else(|| Error::invalid(OP, "batch", s.batch, "too large"))?;
        let partial = if num_splits > 1 {
            let too_large =
                || Error::TooLarge { what: "decode workspace", shape: vec![num_splits, tokens, s.q_heads, s.head_dim] };
            let rows = num_splits.checked_mul(tokens).and_then(|n| n.checked_mul(s.q_heads)).ok_or_else(too_large)?;
            let elems = rows.checked_mul(s.head_dim).ok_or_else(too_large)?;
            Some((
                Tensor::zeros(device, DType::F32, &[elems.max(1)])?,
                Tensor::zeros(device, DType::F32, &[rows.max(1)])?,
            ))
        } else {
            None
        };
        Ok(PagedDecodeWorkspace {
            device: device.clone(),
            shape: s,
            num_splits,
            rows_per_block,
            partial,
            errors: ErrorFlag::new(device)?,
        })
    }

    /// The planned split count.
    pub fn num_splits(&self) -> usize {
        self.num_splits
    }
    /// The shape this workspace was planned for.
    pub fn shape(&self) -> &DecodeShape {
        &self.shape
    }
    /// Reads and clears the device-side error flag (waits for the device).
    pub fn check_errors(&self) -> Result<()> {
        self.errors.check(DECODE)
    }

    /// Decode over a [`PagedKvCache`] (see the module docs); `block_table` `[batch, max_pages]`
    /// i32, `seq_lens` `[batch]` i32, `out` like q, `lse` `[q_heads, batch * q_len]` f32.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        q: &Tensor,
        cache: &PagedKvCache,
        block_table: &Tensor,
        seq_lens: &Tensor,
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &PagedDecodeOptions,
    ) -> Result<()> {
        let (kv, vv) = (cache.k_pages().view(), cache.v_pages().view());
        let kv = PagedKv { k_pages: &kv, v_pages: &vv, scales: &cache.config().scales };
        let mut lse = lse.map(TensorViewMut::of_tensor);
        self.forward_on(
            q.device(),
            &q.view(),
            &kv,
            &block_table.view(),
            &seq_lens.view(),
            &mut TensorViewMut::of_tensor(out),
            lse.as_mut(),
            opts,
        )
    }

    /// Decode on borrowed views, queued on `queue`. `seq_lens.len()` is the batch (at most the
    /// planned one), q has `batch * q_len` tokens.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        q: &TensorView<'_>,
        kv: &PagedKv<'_, '_>,
        block_table: &TensorView<'_>,
        seq_lens: &TensorView<'_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        opts: &PagedDecodeOptions,
    ) -> Result<()> {
        const OP: &str = DECODE;
        let mut lse = lse;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let plan = self.shape;
        check_dtype(OP, "q", q.dtype(), plan.dtype)?;
        check_dtype(OP, "out", out.dtype(), plan.dtype)?;
        check_dtype(OP, "k_pages", kv.k_pages.dtype(), plan.page_dtype)?;
        check_dtype(OP, "seq_lens", seq_lens.dtype(), DType::I32)?;
        if let Some(l) = &lse {
            check_dtype(OP, "lse", l.dtype(), DType::F32)?;
        }
        let mut args = KernelArgs::new(OP, &device);
        let ob = args.write("out", out)?;
        let lb = match lse.as_deref_mut() {
            Some(l) => Some(args.write("lse", l)?),
            None => None,
        };
        let qb = args.read("q", q)?;
        let (kpb, vpb) = (args.read("k_pages", kv.k_pages)?, args.read("v_pages", kv.v_pages)?);
        let (tb, sb) = (args.read("block_table", block_table)?, args.read("seq_lens", seq_lens)?);
        let flag = args.write_tensor("error flag", self.errors.tensor())?;
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
        // Batch from seq_lens.
        if sb.shape().len() != 1 || !sb.dims.is_contiguous() {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "seq_lens",
                got: sb.shape().to_vec(),
                expected: "a contiguous [batch] vector".into(),
            });
        }
        let batch = sb.shape()[0];
        if batch > plan.batch {
            return Err(Error::invalid(OP, "batch", batch, format!("exceeds the planned batch {}", plan.batch)));
        }
        let tokens = batch * plan.q_len;
        let (qh, oh) = (Heads::of(OP, "q", &qb)?, Heads::of(OP, "out", &ob)?);
        for (what, b, h) in [("q", &qb, &qh), ("out", &ob, &oh)] {
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
        if let Some(l) = &lb {
            if l.shape() != [plan.q_heads, tokens] || !l.dims.is_contiguous() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "lse",
                    got: l.shape().to_vec(),
                    expected: format!("contiguous [{}, {tokens}] (q_heads, batch * q_len)", plan.q_heads),
                });
            }
        }
        let (k_scale, v_scale) = kv.scales.per_head(OP, kp.dtype, kp.kv_heads)?;
        // Options.
        let scale = opts.scale.unwrap_or(1.0 / (plan.head_dim as f32).sqrt());
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(OP, "scale", scale, "must be finite and > 0"));
        }
        let (mask, chunk_size) = match opts.chunk_size {
            None => (LlkAttnMask::LLK_ATTN_CAUSAL, 0),
            Some(0) => return Err(Error::invalid(OP, "chunk_size", 0, "must be > 0")),
            Some(c) => (LlkAttnMask::LLK_ATTN_CHUNKED_CAUSAL, c),
        };
        if let Some(t) = &opts.temperature {
            t.validate(OP)?;
        }
        // Aliasing: out and lse are written.
        let tables = table_rows(&tb, max_pages, table_stride);
        let lens = Rows { addr: sb.addr, elem: 4, rows: 1, cols: batch, row_stride: batch };
        check_disjoint(OP, ("out", oh), ("q", qh))?;
        for (what, r) in [("k_pages", kp.rows()), ("v_pages", vp.rows()), ("block_table", tables), ("seq_lens", lens)] {
            check_disjoint(OP, ("out", oh), (what, r))?;
        }
        if let Some(l) = &lb {
            let lrows =
                Rows { addr: l.addr, elem: 4, rows: 1, cols: plan.q_heads * tokens, row_stride: plan.q_heads * tokens };
            check_disjoint(OP, ("lse", lrows), ("q", qh))?;
            check_disjoint(OP, ("lse", lrows), ("out", oh))?;
            for (what, r) in
                [("k_pages", kp.rows()), ("v_pages", vp.rows()), ("block_table", tables), ("seq_lens", lens)]
            {
                check_disjoint(OP, ("lse", lrows), (what, r))?;
            }
        }
        // Layout: 16-byte rows for the vector and cp.async paths.
        for (what, h) in [("q", &qh), ("out", &oh)] {
            h.check_rows_aligned(OP, what)?;
        }
        kp.check_aligned(OP, "k_pages")?;
        vp.check_aligned(OP, "v_pages")?;
        if batch == 0 || plan.q_heads == 0 {
            return Ok(());
        }

        let group = plan.q_heads / plan.kv_heads;
        let row_blocks = (group * plan.q_len).div_ceil(self.rows_per_block);
        let splits = self.num_splits;
        let grid_y = u32::try_from(plan.kv_heads * row_blocks)
            .ok()
            .filter(|&y| y <= 65535)
            .ok_or_else(|| Error::invalid(OP, "kv_heads", plan.kv_heads, "too many head blocks for grid.y (65535)"))?;
        let (po, pl) = match &self.partial {
            Some((o, l)) => (args.write_tensor("workspace", o)?, args.write_tensor("workspace", l)?),
            None => (0, 0),
        };
        let params = PagedDecodeParams {
            q: qb.addr,
            k_pages: kpb.addr,
            v_pages: vpb.addr,
            block_table: tb.addr,
            seq_lens: sb.addr,
            out: if splits == 1 { ob.addr } else { 0 },
            lse: if splits == 1 { lb.map_or(0, |l| l.addr) } else { 0 },
            partial_out: po,
            partial_lse: pl,
            error_flag: flag,
            batch: to_i64(OP, "batch", batch)?,
            q_len: to_i64(OP, "q_len", plan.q_len)?,
            q_heads: to_i64(OP, "q_heads", plan.q_heads)?,
            kv_heads: to_i64(OP, "kv_heads", plan.kv_heads)?,
            head_dim: to_i64(OP, "head_dim", plan.head_dim)?,
            num_pages: to_i64(OP, "num_pages", kp.num_pages)?,
            page_size: to_i64(OP, "page_size", kp.page_size)?,
            max_pages: to_i64(OP, "max_pages", max_pages)?,
            block_table_stride: to_i64(OP, "block table stride", table_stride)?,
            q_token_stride: to_i64(OP, "q token stride", qh.token_stride)?,
            q_head_stride: to_i64(OP, "q head stride", qh.head_stride)?,
            out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
            out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
            k_page_stride: to_i64(OP, "k page stride", kp.page_stride)?,
            v_page_stride: to_i64(OP, "v page stride", vp.page_stride)?,
            num_splits: to_i64(OP, "num_splits", splits)?,
            row_blocks: to_i64(OP, "row blocks", row_blocks)?,
            chunk_size: to_i64(OP, "chunk_size", chunk_size)?,
            mask,
            temperature: temperature_kind(opts.temperature),
            scale,
            temp_floor_scale: opts.temperature.map_or(1.0, |t| t.floor_scale),
            temp_attn_scale: opts.temperature.map_or(0.0, |t| t.attn_scale),
            k_scale,
            v_scale,
        };
        let mma = plan.dtype != DType::F32;
        let dims = LaunchDims {
            grid: (grid_x(OP, batch * splits)?, grid_y, 1),
            block: (THREADS, 1, 1),
            dyn_smem: if mma { decode_smem_bytes(plan.head_dim, kp.dtype.size()) as u32 } else { 0 },
        };
        let kernel = DECODE_KERNELS.find(OP, "q", (plan.dtype, kp.dtype, plan.head_dim), plan.dtype)?;
        if splits == 1 {
            return args.launch(kernel, dims, &params);
        }
        // The splits, then their merge into out (and lse), in a second launch.
        args.launch(kernel, dims, &params)?;
        let Some((po_t, pl_t)) = &self.partial else {
            return Err(Error::InvalidView { what: OP, why: "workspace not planned".into() });
        };
        let mut margs = KernelArgs::new(OP, &device);
        let ob = margs.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(margs.write("lse", l)?),
            None => None,
        };
        let merge = MergeStatesParams {
            v_a: margs.read_tensor("workspace", po_t)?,
            lse_a: margs.read_tensor("workspace", pl_t)?,
            v_b: 0,
            lse_b: 0,
            out: ob.addr,
            lse_out: lb.map_or(0, |l| l.addr),
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
        let mdims = LaunchDims { grid: (grid_x(OP, rows.div_ceil(4))?, 1, 1), block: (THREADS, 1, 1), dyn_smem: 0 };
        margs.launch(MERGE_KERNELS.find(OP, "out", (true, plan.dtype), plan.dtype)?, mdims, &merge)
    }
}

fn temperature_kind(t: Option<Llama4Temperature>) -> LlkAttnTemperature {
    if t.is_some() {
        LlkAttnTemperature::LLK_ATTN_LLAMA4_TEMPERATURE
    } else {
        LlkAttnTemperature::LLK_ATTN_NO_TEMPERATURE
    }
}

/// The number of 64-key tiles a context of `len` keys spans (the split granularity).
pub fn tiles_of(len: usize) -> usize {
    len.div_ceil(KEYS_PER_TILE)
}
