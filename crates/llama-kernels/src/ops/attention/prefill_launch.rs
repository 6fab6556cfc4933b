//! One prefill launch in named steps, as FlashAttention separates `set_params_*` from the
//! launch: check the dtypes and the batch, bind the views ([`Bound`]), check their shapes, the
//! block table and the aliasing, choose the tiles, fill [`AttentionParams`], launch.
//!
//! Grid: x = query tiles (each sequence's queries in blocks of `rows / pack` tokens, listed by
//! the cumulative tile map `cu_tiles`), y = KV heads x (group / pack) head blocks; 128 threads.

use super::paged::PagedKvView;
use super::variant::Variant;
use crate::backend::{Device, KernelRef, LaunchDims, blocks_per_sm_by_smem};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{
    AttentionParams, AttentionPlanParams, AttentionSm90Params, LLK_ATTN_KEYS, LLK_ATTN_KEYS_SMALL, LLK_ATTN_ROWS_MMA,
    LLK_ATTN_ROWS_MMA_HD256, LLK_ATTN_ROWS_SIMT, LLK_ATTN_SM90_KEYS, LLK_ATTN_SM90_KEYS_HD256, LLK_ATTN_SM90_PANEL,
    LLK_ATTN_SM90_THREADS, LLK_ATTN_THREADS, LlkKvSource,
};
use crate::kernels::attention::{KERNELS, PLAN, SMALL_KEY_KERNELS, SUPPORTED_HEAD_DIMS};
use crate::kernels::attention_sm90::KERNELS as SM90_KERNELS;
use crate::launch::pool::{Pool, check_block_table, check_pools, table_rows};
use crate::launch::tensor_map::{TmaLayout, TmaOobFill, TmaSwizzle};
use crate::launch::{Arg, Heads, KernelArgs, Region, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::tensor::{TensorView, TensorViewMut};

pub(super) const OP: &str = "gqa_attention";
/// Rows (query token x q head) per block of the f32 SIMT kernel.
const ROWS_SIMT: usize = LLK_ATTN_ROWS_SIMT as usize;
const THREADS: u32 = LLK_ATTN_THREADS;
/// Keys per K/V tile, and of the second configuration at head_dim 96 and 128.
const KEYS: usize = LLK_ATTN_KEYS as usize;
const KEYS_SMALL: usize = LLK_ATTN_KEYS_SMALL as usize;
/// Largest GQA pack (q heads sharing one block's K/V tiles).
pub const MAX_PACK: usize = 16;

/// Rows per block of the tensor-core kernel (kBlockRows in kernels/attention.cu, checked against
/// params.h there): 4 warps of two 16-row m-tiles up to head_dim 128, of one at head_dim 256.
const fn rows_mma(head_dim: usize) -> usize {
    (if head_dim <= 128 { LLK_ATTN_ROWS_MMA } else { LLK_ATTN_ROWS_MMA_HD256 }) as usize
}

/// Blocks per SM the tensor-core prefill kernel is built for: two (its registers, 249-255 per
/// thread at head_dim 96 and 128, allow no more).
pub const MMA_BLOCKS_PER_SM: usize = 2;

/// Keys per K/V tile of the tensor-core kernel for `dtype` and `head_dim` on a GPU with
/// `smem_per_sm` bytes of shared memory per SM: 64, or 32 (head_dim 96 and 128) where
/// [`MMA_BLOCKS_PER_SM`] blocks of 64 keys do not fit on an SM and of 32 keys do. So an A100 (164
/// KiB per SM) runs two 64 KiB blocks of 32 keys instead of one 96 KiB block of 64 (FlashAttention-2
/// shrinks its tiles on 8.x for the same reason); Hopper (228 KiB) and the 100 KiB 8.6/8.9 parts,
/// which hold one block either way, keep 64.
///
/// The shared memory of each configuration is its kernel's declaration. Without a second
/// configuration (or a kernel) for `dtype` and `head_dim`, the first.
pub fn mma_keys(smem_per_sm: usize, dtype: DType, head_dim: usize) -> usize {
    let blocks = |kernel: Option<KernelRef>| {
        let bytes = kernel?.shared_memory().ok()?.bytes() as usize;
        Some(blocks_per_sm_by_smem(smem_per_sm, bytes))
    };
    match (blocks(KERNELS.get((head_dim, dtype))), blocks(SMALL_KEY_KERNELS.get((head_dim, dtype)))) {
        (Some(wide), Some(small)) if wide < MMA_BLOCKS_PER_SM && small >= MMA_BLOCKS_PER_SM => KEYS_SMALL,
        _ => KEYS,
    }
}

/// Checks cumulative sequence offsets and returns the batch size.
pub(super) fn check_cu_seqlens(name: &'static str, cu: &[i32], total: usize) -> Result<usize> {
    if cu.is_empty() {
        return Err(Error::invalid(OP, name, "[]", "needs batch + 1 >= 1 values"));
    }
    if cu[0] != 0 {
        return Err(Error::invalid(OP, name, cu[0], "must start at 0"));
    }
    if let Some(i) = cu.windows(2).position(|w| w[1] < w[0]) {
        return Err(Error::invalid(
            OP,
            name,
            format!("{:?}", &cu[i..i + 2]),
            format!("must be non-decreasing (at index {i})"),
        ));
    }
    let last = cu[cu.len() - 1];
    if last as usize != total {
        return Err(Error::invalid(OP, name, last, format!("must end at the tensor's {total} tokens")));
    }
    Ok(cu.len() - 1)
}

/// The cumulative sequence offsets of a varlen batch (`batch + 1` i32 values each, from 0,
/// non-decreasing, ending at the total token counts).
#[derive(Clone, Copy, Debug)]
pub enum CuSeqlens<'r, 'a> {
    /// Host slices: validated on the host, then copied through the workspace's pinned staging
    /// buffer (asynchronous; it waits only if the copy from two calls ago has not run yet).
    Host {
        /// Query offsets: `batch + 1` values ending at q's token count.
        q: &'r [i32],
        /// Key offsets: as many values as `q`, ending at k's token count (contiguous K/V).
        k: &'r [i32],
    },
    /// Device-resident i32 views: no host copy at all (CUDA-graph capturable). The device
    /// validates them: invalid offsets write nothing and raise the workspace's error flag,
    /// which [`AttentionWorkspace::check_errors`](super::AttentionWorkspace::check_errors) reports.
    Device {
        /// Query offsets: a contiguous i32 vector of `batch + 1` values.
        q: &'r TensorView<'a>,
        /// Key offsets: a contiguous i32 vector as long as `q`.
        k: &'r TensorView<'a>,
    },
}

/// Where a prefill reads its keys and values (views).
#[derive(Clone, Copy, Debug)]
pub enum KvInput<'r, 'a> {
    /// `[total_k, kv_heads, head_dim]` tensors, sequences at the key offsets.
    Contiguous {
        /// Keys.
        k: &'r TensorView<'a>,
        /// Values, shaped as the keys.
        v: &'r TensorView<'a>,
    },
    /// The paged KV cache: K and V of sequence b read in place from the pages `block_table[b]`
    /// names (`[batch, max_pages]` i32), key j at page `j / page_size`, row `j % page_size`.
    Paged {
        /// The page pools (of the q dtype: fp8 pages are for decode).
        kv: &'r PagedKvView<'r, 'a>,
        /// `[batch, max_pages]` i32.
        block_table: &'r TensorView<'a>,
    },
}

/// Checks the dtypes of one call; returns the compute dtype (q's).
pub(super) fn check_dtypes(
    q: &TensorView<'_>,
    src: KvInput<'_, '_>,
    out: &TensorViewMut<'_>,
    lse: Option<&TensorViewMut<'_>>,
) -> Result<DType> {
    let dtype = q.dtype();
    check_float(OP, "q", dtype)?;
    match src {
        KvInput::Contiguous { k, v } => {
            check_dtype(OP, "k", k.dtype(), dtype)?;
            check_dtype(OP, "v", v.dtype(), dtype)?;
        }
        KvInput::Paged { kv, .. } => {
            if kv.k_pages.dtype() == DType::F8E4M3 {
                return Err(Error::UnsupportedDType {
                    op: OP,
                    what: "k_pages",
                    dtype: DType::F8E4M3,
                    supported: "the q dtype (fp8 pages: paged_decode_attention)".into(),
                });
            }
            check_dtype(OP, "k_pages", kv.k_pages.dtype(), dtype)?;
            check_dtype(OP, "v_pages", kv.v_pages.dtype(), dtype)?;
        }
    }
    check_dtype(OP, "out", out.dtype(), dtype)?;
    if let Some(l) = lse {
        check_dtype(OP, "lse", l.dtype(), DType::F32)?;
    }
    Ok(dtype)
}

/// The batch size, from the offsets (host offsets are validated later, device ones by the plan
/// kernel).
pub(super) fn batch_of(cu_seqlens: CuSeqlens<'_, '_>) -> Result<usize> {
    match cu_seqlens {
        CuSeqlens::Host { q: cq, k: ck } => {
            if cq.len() != ck.len() {
                return Err(Error::invalid(
                    OP,
                    "cu_seqlens_k",
                    format!("{} values", ck.len()),
                    format!("must have as many values as cu_seqlens_q ({})", cq.len()),
                ));
            }
            cq.len()
                .checked_sub(1)
                .ok_or_else(|| Error::invalid(OP, "cu_seqlens_q", "[]", "needs batch + 1 >= 1 values"))
        }
        CuSeqlens::Device { q: cq, k: ck } => {
            for (what, c) in [("cu_seqlens_q", cq), ("cu_seqlens_k", ck)] {
                check_dtype(OP, what, c.dtype(), DType::I32)?;
                if c.shape().len() != 1 || c.numel() == 0 || !c.dims().is_contiguous() {
                    return Err(Error::shape(OP, what, c.shape().to_vec(), "a contiguous [batch + 1] vector"));
                }
            }
            if cq.numel() != ck.numel() {
                return Err(Error::shape(
                    OP,
                    "cu_seqlens_k",
                    ck.shape().to_vec(),
                    format!("{:?} like cu_seqlens_q", cq.shape()),
                ));
            }
            Ok(cq.numel() - 1)
        }
    }
}

/// Paged K/V: the two pools and the block table.
#[derive(Clone, Copy)]
pub(super) struct PagedBound {
    pub k: Pool,
    pub v: Pool,
    pub table: Arg,
}

/// The registered views of one call, as the kernel addresses them. K and V are
/// `[tokens, heads, head_dim]` rows: the tensors, or (paged) the pools seen as
/// `[num_pages * page_size, kv_heads, head_dim]` with a page table.
pub(super) struct Bound {
    pub q: Arg,
    pub k: Arg,
    pub v: Arg,
    pub out: Arg,
    pub lse: Option<Arg>,
    pub qh: Heads,
    pub kh: Heads,
    pub vh: Heads,
    pub oh: Heads,
    pub paged: Option<PagedBound>,
}

impl Bound {
    /// Registers every view with `args` (outputs first) and checks each one's layout.
    pub fn new<'a>(
        args: &mut KernelArgs<'a>,
        q: &'a TensorView<'_>,
        src: KvInput<'a, '_>,
        out: &'a mut TensorViewMut<'_>,
        lse: Option<&'a mut TensorViewMut<'_>>,
    ) -> Result<Bound> {
        let ob = args.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(args.write("lse", l)?),
            None => None,
        };
        let qb = args.read("q", q)?;
        let (qh, oh) = (Heads::of(OP, "q", &qb)?, Heads::of(OP, "out", &ob)?);
        let (kb, vb, kh, vh, paged) = match src {
            KvInput::Contiguous { k, v } => {
                let (kb, vb) = (args.read("k", k)?, args.read("v", v)?);
                let (kh, vh) = (Heads::of(OP, "k", &kb)?, Heads::of(OP, "v", &vb)?);
                (kb, vb, kh, vh, None)
            }
            KvInput::Paged { kv, block_table } => {
                let (kb, vb) = (args.read("k_pages", kv.k_pages)?, args.read("v_pages", kv.v_pages)?);
                let table = args.read("block_table", block_table)?;
                let (kp, vp) = (Pool::of(OP, "k_pages", &kb)?, Pool::of(OP, "v_pages", &vb)?);
                check_pools(OP, &kp, &vp)?;
                kv.scales.per_head(OP, kp.dtype, kp.kv_heads)?;
                let (kh, vh) = (pool_heads(&kp), pool_heads(&vp));
                (kb, vb, kh, vh, Some(PagedBound { k: kp, v: vp, table }))
            }
        };
        Ok(Bound { q: qb, k: kb, v: vb, out: ob, lse: lb, qh, kh, vh, oh, paged })
    }

    /// Checks head dims and head counts against q; returns the head dim.
    pub fn check_heads(&self) -> Result<usize> {
        let d = self.qh.head_dim;
        for (what, b, h) in [("k", &self.k, &self.kh), ("v", &self.v, &self.vh), ("out", &self.out, &self.oh)] {
            if h.head_dim != d {
                return Err(Error::shape(OP, what, b.shape().to_vec(), format!("head_dim {d} like q")));
            }
        }
        if !SUPPORTED_HEAD_DIMS.contains(&d) {
            return Err(Error::invalid(OP, "head_dim", d, format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})")));
        }
        if self.kh.heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0 (k and v need at least one head)"));
        }
        if self.qh.heads % self.kh.heads != 0 {
            return Err(Error::invalid(
                OP,
                "q_heads",
                self.qh.heads,
                format!("not divisible by kv_heads {}", self.kh.heads),
            ));
        }
        if self.paged.is_none() && (self.vh.heads != self.kh.heads || self.vh.tokens != self.kh.tokens) {
            return Err(Error::shape(OP, "v", self.v.shape().to_vec(), format!("{:?} like k", self.k.shape())));
        }
        if self.oh.tokens != self.qh.tokens || self.oh.heads != self.qh.heads {
            return Err(Error::shape(OP, "out", self.out.shape().to_vec(), format!("{:?} like q", self.q.shape())));
        }
        Ok(d)
    }

    /// Paged: checks the block table (and, with host offsets, that its rows hold every
    /// sequence's keys). Host offsets: checks them against the token counts.
    pub fn check_table_and_offsets(&self, batch: usize, cu_seqlens: CuSeqlens<'_, '_>) -> Result<Option<Table>> {
        let mut table = None;
        if let Some(p) = &self.paged {
            let (max_pages, stride) = check_block_table(OP, &p.table, batch)?;
            if let CuSeqlens::Host { k: ck, .. } = cu_seqlens {
                check_cu_seqlens("cu_seqlens_k", ck, ck.last().map_or(0, |&x| x.max(0) as usize))?;
                let longest = ck.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
                if longest > max_pages * p.k.page_size {
                    return Err(Error::invalid(
                        OP,
                        "block_table",
                        format!("{max_pages} pages per row"),
                        format!(
                            "too narrow: a sequence of {longest} keys needs {} pages of {}",
                            longest.div_ceil(p.k.page_size),
                            p.k.page_size
                        ),
                    ));
                }
            }
            let rows = table_rows(&p.table, max_pages, stride);
            table = Some(Table { addr: p.table.addr, max_pages, stride, rows });
        }
        if let CuSeqlens::Host { q: cq, k: ck } = cu_seqlens {
            check_cu_seqlens("cu_seqlens_q", cq, self.qh.tokens)?;
            if self.paged.is_none() {
                check_cu_seqlens("cu_seqlens_k", ck, self.kh.tokens)?;
            }
        }
        Ok(table)
    }

    /// Checks the log-sum-exp output's shape; returns its length (`q_heads * total_q`).
    pub fn check_lse(&self) -> Result<usize> {
        let qh = &self.qh;
        let lse_len = qh
            .heads
            .checked_mul(qh.tokens)
            .ok_or_else(|| Error::TooLarge { what: "lse", shape: vec![qh.heads, qh.tokens] })?;
        if let Some(l) = &self.lse {
            if l.shape() != [qh.heads, qh.tokens] || !l.dims.is_contiguous() {
                return Err(Error::shape(
                    OP,
                    "lse",
                    l.shape().to_vec(),
                    format!("contiguous [{}, {}] (q_heads, total_q)", qh.heads, qh.tokens),
                ));
            }
        }
        Ok(lse_len)
    }

    /// Aliasing: out and lse are written, q, k and v (pages and table) read.
    pub fn check_disjoint(&self, table: Option<&Table>, lse_len: usize) -> Result<()> {
        let mut reads: Vec<(&'static str, Region)> = vec![("q", self.qh.into())];
        match &self.paged {
            None => reads.extend([("k", self.kh.into()), ("v", self.vh.into())]),
            Some(p) => reads.extend([("k_pages", p.k.rows().into()), ("v_pages", p.v.rows().into())]),
        }
        if let Some(t) = table {
            reads.push(("block_table", t.rows.into()));
        }
        for (what, r) in &reads {
            check_disjoint(OP, ("out", self.oh), (*what, *r))?;
        }
        if let Some(l) = &self.lse {
            let lrows = Rows { addr: l.addr, elem: 4, rows: 1, cols: lse_len, row_stride: lse_len };
            check_disjoint(OP, ("lse", lrows), ("out", self.oh))?;
            for (what, r) in &reads {
                check_disjoint(OP, ("lse", lrows), (*what, *r))?;
            }
        }
        Ok(())
    }

    /// The tensor-core path copies 16-byte chunks: every row (and page) must start 16-byte
    /// aligned.
    pub fn check_aligned(&self, dtype: DType) -> Result<()> {
        if let Some(p) = &self.paged {
            p.k.check_aligned(OP, "k_pages")?;
            p.v.check_aligned(OP, "v_pages")?;
        }
        if dtype != DType::F32 {
            for (what, h) in [("q", &self.qh), ("k", &self.kh), ("v", &self.vh), ("out", &self.oh)] {
                h.check_rows_aligned(OP, what)?;
            }
        }
        Ok(())
    }
}

/// A pool seen as `[num_pages * page_size, kv_heads, head_dim]` rows.
fn pool_heads(p: &Pool) -> Heads {
    Heads {
        addr: p.addr,
        elem: p.dtype.size(),
        tokens: p.num_pages * p.page_size,
        heads: p.kv_heads,
        head_dim: p.head_dim,
        token_stride: p.kv_heads * p.head_dim,
        head_stride: p.head_dim,
    }
}

/// A checked block table.
#[derive(Clone, Copy)]
pub(super) struct Table {
    pub addr: u64,
    pub max_pages: usize,
    pub stride: usize,
    pub rows: Rows,
}

/// The q heads of one KV group that share a block: `requested`, or the largest divisor of the
/// group size up to [`MAX_PACK`].
pub(super) fn gqa_pack(requested: Option<usize>, group: usize) -> Result<usize> {
    match requested {
        Some(p) if p == 0 || p > MAX_PACK || group % p != 0 => {
            Err(Error::invalid(OP, "gqa_pack", p, format!("must divide the group size {group} and be 1..={MAX_PACK}")))
        }
        Some(p) => Ok(p),
        None => Ok((1..=group.min(MAX_PACK)).rev().find(|p| group % p == 0).unwrap_or(1)),
    }
}

/// Query tokens per block: the block's rows shared among `pack` q heads.
pub(super) fn tokens_per_block(dtype: DType, head_dim: usize, pack: usize) -> usize {
    let rows_per_block = if dtype == DType::F32 { ROWS_SIMT } else { rows_mma(head_dim) };
    rows_per_block / pack
}

/// What the plan kernel reads and writes for device-resident offsets.
pub(super) struct DevicePlan<'r, 'a> {
    /// The caller's offsets.
    pub cu_seqlens_q: &'r TensorView<'a>,
    pub cu_seqlens_k: &'r TensorView<'a>,
    /// The workspace's tile map and error flag.
    pub cu_tiles: &'r crate::tensor::Tensor,
    pub error_flag: &'r crate::tensor::Tensor,
    pub batch: usize,
    pub tokens_per_block: usize,
}

/// Queues the plan kernel for device-resident offsets: it validates them (raising the error
/// flag) and writes the tile map of `cu_seqlens_q`'s sequences. `totals`: the token counts the
/// offsets must end at (the keys' is `None` for paged K/V, where only the offsets say it).
/// Returns the upper bound on the tile count that sizes the grid (extra blocks exit at once).
pub(super) fn plan_on_device(
    device: &Device,
    totals: (usize, Option<usize>),
    plan: DevicePlan<'_, '_>,
) -> Result<usize> {
    let DevicePlan { cu_seqlens_q, cu_seqlens_k, cu_tiles, error_flag, batch, tokens_per_block } = plan;
    let mut plan_args = KernelArgs::new(OP, device);
    let plan = AttentionPlanParams {
        cu_seqlens_q: plan_args.read("cu_seqlens_q", cu_seqlens_q)?.addr,
        cu_seqlens_k: plan_args.read("cu_seqlens_k", cu_seqlens_k)?.addr,
        cu_tiles: plan_args.write_tensor("workspace", cu_tiles)?,
        error_flag: plan_args.write_tensor("workspace", error_flag)?,
        batch: to_i64(OP, "batch", batch)?,
        total_q: to_i64(OP, "total_q", totals.0)?,
        total_k: match totals.1 {
            Some(k) => to_i64(OP, "total_k", k)?,
            None => -1,
        },
        tokens_per_block: to_i64(OP, "tokens per block", tokens_per_block)?,
    };
    let dims = LaunchDims { grid: (1, 1, 1), block: (32, 1, 1), smem_at_launch: 0 };
    plan_args.launch(PLAN, dims, &plan)?;
    Ok(totals.0 / tokens_per_block + batch)
}

/// Where the tile map and the offsets are on the device, and the flag.
pub(super) struct Tiles {
    pub cu_q: u64,
    pub cu_k: u64,
    pub cu_tiles: u64,
    pub error_flag: u64,
}

/// Fills the params struct of the attention kernel.
pub(super) fn params(
    b: &Bound,
    table: Option<&Table>,
    tiles: &Tiles,
    batch: usize,
    pack: usize,
    variant: &Variant,
) -> Result<AttentionParams> {
    let (qh, kh, vh, oh) = (&b.qh, &b.kh, &b.vh, &b.oh);
    let paged = b.paged.as_ref();
    Ok(AttentionParams {
        q: b.q.addr,
        k: b.k.addr,
        v: b.v.addr,
        out: b.out.addr,
        lse: b.lse.map_or(0, |l| l.addr),
        cu_seqlens_q: tiles.cu_q,
        cu_seqlens_k: tiles.cu_k,
        cu_tiles: tiles.cu_tiles,
        batch: to_i64(OP, "batch", batch)?,
        q_heads: to_i64(OP, "q_heads", qh.heads)?,
        kv_heads: to_i64(OP, "kv_heads", kh.heads)?,
        head_dim: to_i64(OP, "head_dim", qh.head_dim)?,
        total_q: to_i64(OP, "total_q", qh.tokens)?,
        q_token_stride: to_i64(OP, "q token stride", qh.token_stride)?,
        q_head_stride: to_i64(OP, "q head stride", qh.head_stride)?,
        k_token_stride: to_i64(OP, "k token stride", kh.token_stride)?,
        k_head_stride: to_i64(OP, "k head stride", kh.head_stride)?,
        v_token_stride: to_i64(OP, "v token stride", vh.token_stride)?,
        v_head_stride: to_i64(OP, "v head stride", vh.head_stride)?,
        out_token_stride: to_i64(OP, "out token stride", oh.token_stride)?,
        out_head_stride: to_i64(OP, "out head stride", oh.head_stride)?,
        pack: to_i64(OP, "gqa_pack", pack)?,
        variant: variant.raw(OP)?,
        kv_source: if paged.is_some() { LlkKvSource::LLK_KV_PAGED } else { LlkKvSource::LLK_KV_CONTIGUOUS },
        block_table: table.map_or(0, |t| t.addr),
        error_flag: tiles.error_flag,
        block_table_stride: to_i64(OP, "block table stride", table.map_or(0, |t| t.stride))?,
        max_pages: to_i64(OP, "max_pages", table.map_or(0, |t| t.max_pages))?,
        page_size: to_i64(OP, "page_size", paged.map_or(1, |p| p.k.page_size))?,
        num_pages: to_i64(OP, "num_pages", paged.map_or(0, |p| p.k.num_pages))?,
        k_page_stride: to_i64(OP, "k page stride", paged.map_or(0, |p| p.k.page_stride))?,
        v_page_stride: to_i64(OP, "v page stride", paged.map_or(0, |p| p.v.page_stride))?,
    })
}

/// Grid and block of the attention kernel (its shared memory is the kernel's declaration).
pub(super) fn launch_dims(b: &Bound, grid_tiles: usize, pack: usize) -> Result<LaunchDims> {
    let group = b.qh.heads / b.kh.heads;
    let grid_y = u32::try_from(b.kh.heads * (group / pack))
        .ok()
        .filter(|&y| y <= 65535)
        .ok_or_else(|| Error::invalid(OP, "heads", b.qh.heads, "too many head blocks for grid.y (65535)"))?;
    Ok(LaunchDims { grid: (grid_x(OP, grid_tiles)?, grid_y, 1), block: (THREADS, 1, 1), smem_at_launch: 0 })
}

/// The kernel for `dtype` and `head_dim` with `keys`-key tiles ([`mma_keys`]).
pub(super) fn kernel(dtype: DType, head_dim: usize, keys: usize) -> Result<crate::backend::KernelRef> {
    if keys == KEYS_SMALL && dtype != DType::F32 {
        SMALL_KEY_KERNELS.find(OP, "q", (head_dim, dtype))
    } else {
        KERNELS.find(OP, "q", (head_dim, dtype))
    }
}

// ------------------------------------------------------------------ which kernel
/// The prefill kernels, and which calls each serves ([`prefill_kernel`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrefillKernel {
    /// kernels/attention_sm90.cu (TMA, wgmma, warp specialization): bf16 and f16 at head_dim 64,
    /// 128 and 256 with contiguous K/V, on the emulator standing for sm_90, and on a GPU of compute
    /// capability 9.0 (H100, H200) when [`HOPPER_ON_CUDA_VAR`] is `1`.
    Hopper,
    /// kernels/attention.cu on tensor cores (mma.sync, ldmatrix, cp.async) with K/V tiles of
    /// `keys` keys ([`mma_keys`]): bf16 and f16 otherwise (K/V read from the paged cache, head_dim
    /// 32 and 96, GPUs before Hopper).
    MmaSync {
        /// Keys per K/V tile.
        keys: usize,
    },
    /// kernels/attention.cu's f32 path on CUDA cores.
    Simt,
}

/// The environment variable that lets a GPU run the Hopper kernel: `1` on. The kernel is checked
/// on the emulated sm_90 on every commit, which chooses it always; it has not yet run on
/// hardware, so a CUDA device chooses it only when this is set (the GPU test stage sets it).
pub const HOPPER_ON_CUDA_VAR: &str = "LLK_ATTENTION_SM90";

/// Whether [`HOPPER_ON_CUDA_VAR`] is `1` (read once).
fn hopper_on_cuda() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(HOPPER_ON_CUDA_VAR).is_some_and(|v| v == "1"))
}

/// The kernel a prefill call of `dtype` and `head_dim` runs on `device`, with K/V from the paged
/// cache (`paged`) or contiguous. (A batch without any key runs [`PrefillKernel::MmaSync`] even
/// where this says Hopper: a tensor map has no empty dimension.)
pub fn prefill_kernel(device: &Device, dtype: DType, head_dim: usize, paged: bool) -> PrefillKernel {
    let hopper =
        device.has_sm90a_features() && (device.target() == crate::backend::Target::Emulated || hopper_on_cuda());
    if dtype == DType::F32 {
        PrefillKernel::Simt
    } else if hopper && SM90_KERNELS.has((head_dim, dtype)) && !paged {
        PrefillKernel::Hopper
    } else {
        PrefillKernel::MmaSync { keys: mma_keys(device.max_shared_memory_per_sm(), dtype, head_dim) }
    }
}

/// Whether the Hopper kernel serves this call (at least one key: see [`prefill_kernel`]).
pub(super) fn uses_sm90(device: &Device, dtype: DType, b: &Bound) -> bool {
    prefill_kernel(device, dtype, b.qh.head_dim, b.paged.is_some()) == PrefillKernel::Hopper && b.kh.tokens > 0
}

/// The Hopper kernel's keys per K/V tile at `head_dim` (kKeysOf in kernels/attention_sm90.cu).
pub const fn sm90_keys(head_dim: usize) -> u32 {
    if head_dim <= 128 { LLK_ATTN_SM90_KEYS } else { LLK_ATTN_SM90_KEYS_HD256 }
}

/// Query tokens per block of the Hopper kernel: its 128 rows (at every head dim) shared among
/// `pack` q heads.
pub(super) fn sm90_tokens_per_block(pack: usize) -> usize {
    LLK_ATTN_ROWS_MMA as usize / pack
}

/// The Hopper kernel for `dtype` and `head_dim`, its launch shape (the grid of [`launch_dims`],
/// a producer and two consumer warpgroups) and its params: `attn` and the TMA maps of q, k and v,
/// each `[tokens, heads, head_dim]` view as dims (head_dim, heads, tokens), read in 128-byte
/// swizzled boxes of 64 head dims.
pub(super) fn sm90_launch(
    args: &KernelArgs<'_>,
    b: &Bound,
    dims: LaunchDims,
    attn: AttentionParams,
    pack: usize,
) -> Result<(crate::backend::KernelRef, LaunchDims, AttentionSm90Params)> {
    let (dtype, d) = (b.q.dtype, b.qh.head_dim);
    let map = |what: &'static str, h: &Heads, box_dims: Vec<u32>| {
        let layout = TmaLayout {
            dims: vec![h.head_dim as u64, h.heads as u64, h.tokens as u64],
            strides: vec![h.head_stride as u64, h.token_stride as u64],
            box_dims,
            swizzle: TmaSwizzle::B128,
            oob: TmaOobFill::Zeros,
        };
        args.tensor_map_at(what, h.addr, dtype, &layout)
    };
    let rows = LLK_ATTN_ROWS_MMA as usize;
    let params = AttentionSm90Params {
        attn,
        q_map: map("q", &b.qh, vec![LLK_ATTN_SM90_PANEL, pack as u32, (rows / pack) as u32])?,
        k_map: map("k", &b.kh, vec![LLK_ATTN_SM90_PANEL, 1, sm90_keys(d)])?,
        v_map: map("v", &b.vh, vec![LLK_ATTN_SM90_PANEL, 1, sm90_keys(d)])?,
    };
    let dims = LaunchDims { block: (LLK_ATTN_SM90_THREADS, 1, 1), ..dims };
    Ok((SM90_KERNELS.find(OP, "q", (d, dtype))?, dims, params))
}
