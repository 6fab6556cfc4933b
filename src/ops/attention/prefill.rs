//! Flash-style grouped-query attention for prefill (kernels/attention.cu): the workspace and
//! its launch. See [`crate::ops::attention`] for shapes and semantics.

use crate::backend::{Device, LaunchDims, PinnedStaging, Queue};
use crate::launch::KernelArgs;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::launch::pool::{Pool, check_block_table, check_pools};
use super::paged::{PagedKv, PagedKvCache};
use crate::kernels::attention::{KERNELS, PLAN, SUPPORTED_HEAD_DIMS};
use crate::launch::{Heads, Region, Rows, check_disjoint, check_dtype, check_float, grid_x, to_i64};
use crate::ffi::params::{
    AttentionParams, AttentionPlanParams, LlkAttnMask, LlkAttnTemperature, LlkDeviceError, LlkKvSource,
};
use crate::tensor::{Tensor, TensorView, TensorViewMut};
use crate::spec::attention::{AttentionMask, Llama4Temperature};

const OP: &str = "gqa_attention";
/// Rows (query token x q head) per block of the f32 SIMT kernel (kSimtRows in
/// kernels/attention.cu).
const ROWS_SIMT: usize = 32;

/// Rows per block of the tensor-core kernel (kBlockRows in kernels/attention.cu): 4 warps of two
/// 16-row m-tiles up to head_dim 128, of one at head_dim 256.
fn rows_mma(head_dim: usize) -> usize {
    if head_dim <= 128 { 128 } else { 64 }
}
const THREADS: u32 = 128;
/// Largest GQA pack (q heads sharing one block's K/V tiles).
pub const MAX_PACK: usize = 16;

/// Options of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionOptions {
    pub mask: AttentionMask,
    /// Softmax scale, finite and > 0; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    pub temperature: Option<Llama4Temperature>,
    /// q heads of one KV group that share a block (and so every K/V tile it loads). `None`
    /// picks the largest divisor of the group size up to 16. Must divide q_heads / kv_heads.
    pub gqa_pack: Option<usize>,
}


/// Dynamic shared memory of the tensor-core kernel: Q, and two stages of K and V, in rows padded
/// to a power of two of 16-byte chunks (kPitch in kernels/attention.cu).
fn mma_smem_bytes(head_dim: usize) -> u32 {
    let row = if head_dim <= 64 {
        64
    } else if head_dim <= 128 {
        128
    } else {
        256
    };
    // Q, two stages of K and V, and (paged K/V) a byte per key of each stage.
    ((rows_mma(head_dim) + 4 * 64) * row * 2 + 2 * 64) as u32
}

/// Checks cumulative sequence offsets and returns the batch size.
fn check_cu_seqlens(name: &'static str, cu: &[i32], total: usize) -> Result<usize> {
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
    Host { q: &'r [i32], k: &'r [i32] },
    /// Device-resident i32 views: no host copy at all (CUDA-graph capturable). The device
    /// validates them: invalid offsets write nothing and raise the workspace's error flag,
    /// which [`AttentionWorkspace::check_errors`] reports.
    Device { q: &'r TensorView<'a>, k: &'r TensorView<'a> },
}

/// Where K and V come from.
#[derive(Clone, Copy)]
enum KvSrc<'r, 'a> {
    Contiguous { k: &'r TensorView<'a>, v: &'r TensorView<'a> },
    Paged { kv: &'r PagedKv<'r, 'a>, block_table: &'r TensorView<'a> },
}

/// Offsets of the workspace buffer (i32 elements): the error flag, then three arrays of
/// `capacity` entries.
const FLAG: usize = 0;
const ARRAYS: usize = 4;

/// Reusable per-call state: a small device buffer for the sequence offsets, the tile map and a
/// device-side error flag, and a pinned staging buffer for host offsets. Plan it once with
/// [`AttentionWorkspace::with_capacity`] for the largest batch; calls within that capacity
/// allocate nothing (a larger batch grows it, the only allocation).
#[derive(Debug)]
pub struct AttentionWorkspace {
    device: Device,
    buf: Option<Tensor>,
    /// Entries per array: the largest `batch + 1` planned for.
    capacity: usize,
    host: Vec<i32>,
    staging: Option<PinnedStaging>,
}

impl AttentionWorkspace {
    pub fn new(device: &Device) -> AttentionWorkspace {
        AttentionWorkspace { device: device.clone(), buf: None, capacity: 0, host: Vec::new(), staging: None }
    }
    /// Preallocates room for batches of up to `max_batch` sequences.
    pub fn with_capacity(device: &Device, max_batch: usize) -> Result<AttentionWorkspace> {
        let mut ws = Self::new(device);
        ws.reserve(max_batch)?;
        Ok(ws)
    }
    fn reserve(&mut self, batch: usize) -> Result<()> {
        let need = batch.checked_add(1).ok_or_else(|| Error::invalid(OP, "batch", batch, "too large"))?;
        if self.buf.is_none() || self.capacity < need {
            let capacity = need.next_power_of_two();
            let elems = capacity
                .checked_mul(3)
                .and_then(|n| n.checked_add(ARRAYS))
                .ok_or_else(|| Error::invalid(OP, "batch", batch, "too large"))?;
            self.buf = Some(Tensor::zeros(&self.device, DType::I32, &[elems])?);
            self.staging = PinnedStaging::new(&self.device, 3 * capacity * 4)?;
            self.capacity = capacity;
        }
        Ok(())
    }
    fn array(&self, index: usize, len: usize) -> Result<Tensor> {
        let buf = self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        buf.narrow(0, ARRAYS + index * self.capacity, len)
    }

    /// Reads and clears the device-side error flag (waits for the device): `Err` names what an
    /// earlier call with device-resident offsets found invalid (that call wrote nothing).
    pub fn check_errors(&self) -> Result<()> {
        let Some(buf) = &self.buf else { return Ok(()) };
        let flag = buf.narrow(0, FLAG, 1)?;
        let bits = flag.to_vec::<i32>()?[0];
        if bits != 0 {
            flag.copy_from_slice(&[0i32])?;
            let mut what = Vec::new();
            if bits & LlkDeviceError::LLK_DEVICE_BAD_SEQLENS as i32 != 0 {
                what.push("cu_seqlens (not from 0, decreasing, or not ending at the token counts)");
            }
            if bits & LlkDeviceError::LLK_DEVICE_BAD_PAGE as i32 != 0 {
                what.push("a page id outside the pool or a key past the block-table row (its keys were skipped)");
            }
            if what.is_empty() {
                what.push("unknown error bits");
            }
            return Err(Error::DeviceReported { op: OP, what: format!("{} [flag {bits:#x}]", what.join("; ")) });
        }
        Ok(())
    }

    /// Runs attention; `out` (and `lse`) are written. See the module docs.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cu_seqlens_q: &[i32],
        cu_seqlens_k: &[i32],
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        let mut lse = lse.map(TensorViewMut::of_tensor);
        self.forward_on(
            q.device(),
            &q.view(),
            &k.view(),
            &v.view(),
            CuSeqlens::Host { q: cu_seqlens_q, k: cu_seqlens_k },
            &mut TensorViewMut::of_tensor(out),
            lse.as_mut(),
            opts,
        )
    }

    /// [`AttentionWorkspace::forward`] with device-resident sequence offsets (i32 tensors of
    /// `batch + 1` values): no host copy, so the call can be captured into a CUDA graph.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_device(
        &mut self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        cu_seqlens_q: &Tensor,
        cu_seqlens_k: &Tensor,
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        let mut lse = lse.map(TensorViewMut::of_tensor);
        let (cq, ck) = (cu_seqlens_q.view(), cu_seqlens_k.view());
        self.forward_on(
            q.device(),
            &q.view(),
            &k.view(),
            &v.view(),
            CuSeqlens::Device { q: &cq, k: &ck },
            &mut TensorViewMut::of_tensor(out),
            lse.as_mut(),
            opts,
        )
    }

    /// Attention on borrowed views, queued on `queue` (a [`Device`] or an engine's
    /// `Arc<CudaStream>` of the workspace's context). See the module docs for shapes.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        q: &TensorView<'_>,
        k: &TensorView<'_>,
        v: &TensorView<'_>,
        cu_seqlens: CuSeqlens<'_, '_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        self.run(queue, q, KvSrc::Contiguous { k, v }, cu_seqlens, out, lse, opts)
    }

    /// Prefill over the paged KV cache: K and V of sequence b are read in place from the pages
    /// `block_table[b]` names (`[batch, max_pages]` i32), key j at page `j / page_size`, row
    /// `j % page_size`; `cu_seqlens.k` gives each sequence's number of keys (the cached prefix
    /// and the new tokens, which must already be appended). Chunked prefill after a cached
    /// prefix thus needs no gather copy. Pages of the q dtype (fp8 pages: decode only). A page id
    /// outside the pool, or a key past the block-table row when the offsets live on the device,
    /// is never read: its keys are skipped and [`AttentionWorkspace::check_errors`] reports it.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_paged_on(
        &mut self,
        queue: &impl Queue,
        q: &TensorView<'_>,
        kv: &PagedKv<'_, '_>,
        block_table: &TensorView<'_>,
        cu_seqlens: CuSeqlens<'_, '_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        self.run(queue, q, KvSrc::Paged { kv, block_table }, cu_seqlens, out, lse, opts)
    }

    /// [`AttentionWorkspace::forward_paged_on`] on tensors and a [`PagedKvCache`], with host
    /// sequence offsets.
    #[allow(clippy::too_many_arguments)]
    pub fn forward_paged(
        &mut self,
        q: &Tensor,
        cache: &PagedKvCache,
        block_table: &Tensor,
        cu_seqlens_q: &[i32],
        cu_seqlens_k: &[i32],
        out: &Tensor,
        lse: Option<&Tensor>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        let (kp, vp) = (cache.k_pages().view(), cache.v_pages().view());
        let kv = PagedKv { k_pages: &kp, v_pages: &vp, scales: cache.scales() };
        let mut lse = lse.map(TensorViewMut::of_tensor);
        self.forward_paged_on(
            q.device(),
            &q.view(),
            &kv,
            &block_table.view(),
            CuSeqlens::Host { q: cu_seqlens_q, k: cu_seqlens_k },
            &mut TensorViewMut::of_tensor(out),
            lse.as_mut(),
            opts,
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        queue: &impl Queue,
        q: &TensorView<'_>,
        src: KvSrc<'_, '_>,
        cu_seqlens: CuSeqlens<'_, '_>,
        out: &mut TensorViewMut<'_>,
        lse: Option<&mut TensorViewMut<'_>>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        // Dtypes.
        let dtype = q.dtype();
        check_float(OP, "q", dtype)?;
        match src {
            KvSrc::Contiguous { k, v } => {
                check_dtype(OP, "k", k.dtype(), dtype)?;
                check_dtype(OP, "v", v.dtype(), dtype)?;
            }
            KvSrc::Paged { kv, .. } => {
                if kv.k_pages.dtype() == DType::F8E4M3 {
                    return Err(Error::UnsupportedDType {
                        op: OP,
                        what: "k_pages",
                        dtype: DType::F8E4M3,
                        supported: "the q dtype (fp8 pages: paged_decode_attention)",
                    });
                }
                check_dtype(OP, "k_pages", kv.k_pages.dtype(), dtype)?;
                check_dtype(OP, "v_pages", kv.v_pages.dtype(), dtype)?;
            }
        }
        check_dtype(OP, "out", out.dtype(), dtype)?;
        if let Some(l) = &lse {
            check_dtype(OP, "lse", l.dtype(), DType::F32)?;
        }
        // Batch size, from the offsets (host offsets are validated here, device ones later).
        let batch = match cu_seqlens {
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
                    .ok_or_else(|| Error::invalid(OP, "cu_seqlens_q", "[]", "needs batch + 1 >= 1 values"))?
            }
            CuSeqlens::Device { q: cq, k: ck } => {
                for (what, c) in [("cu_seqlens_q", cq), ("cu_seqlens_k", ck)] {
                    check_dtype(OP, what, c.dtype(), DType::I32)?;
                    if c.shape().len() != 1 || c.numel() == 0 || !c.dims().is_contiguous() {
                        return Err(Error::ShapeMismatch {
                            op: OP,
                            what,
                            got: c.shape().to_vec(),
                            expected: "a contiguous [batch + 1] vector".into(),
                        });
                    }
                }
                if cq.numel() != ck.numel() {
                    return Err(Error::ShapeMismatch {
                        op: OP,
                        what: "cu_seqlens_k",
                        got: ck.shape().to_vec(),
                        expected: format!("{:?} like cu_seqlens_q", cq.shape()),
                    });
                }
                cq.numel() - 1
            }
        };
        self.reserve(batch)?;
        // The workspace arrays (views of one buffer: no allocation).
        let n = batch + 1;
        let (cq_t, ck_t, cu_tiles_t, flag_t) =
            (self.array(0, n)?, self.array(1, n)?, self.array(2, n)?, self.array_flag()?);

        let mut args = KernelArgs::new(OP, &device);
        let ob = args.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(args.write("lse", l)?),
            None => None,
        };
        let qb = args.read("q", q)?;
        let (qh, oh) = (Heads::of(OP, "q", &qb)?, Heads::of(OP, "out", &ob)?);
        // K and V as [tokens, heads, head_dim] rows: the tensors, or (paged) the pools seen as
        // [num_pages * page_size, kv_heads, head_dim] with a page table (`paged`).
        let (kb, vb, kh, vh, paged) = match src {
            KvSrc::Contiguous { k, v } => {
                let (kb, vb) = (args.read("k", k)?, args.read("v", v)?);
                let (kh, vh) = (Heads::of(OP, "k", &kb)?, Heads::of(OP, "v", &vb)?);
                (kb, vb, kh, vh, None)
            }
            KvSrc::Paged { kv, block_table } => {
                let (kb, vb) = (args.read("k_pages", kv.k_pages)?, args.read("v_pages", kv.v_pages)?);
                let tb = args.read("block_table", block_table)?;
                let (kp, vp) = (Pool::of(OP, "k_pages", &kb)?, Pool::of(OP, "v_pages", &vb)?);
                check_pools(OP, &kp, &vp)?;
                kv.scales.per_head(OP, kp.dtype, kp.kv_heads)?;
                let as_heads = |p: &Pool| Heads {
                    addr: p.addr,
                    elem: p.dtype.size(),
                    tokens: p.num_pages * p.page_size,
                    heads: p.kv_heads,
                    head_dim: p.head_dim,
                    token_stride: p.kv_heads * p.head_dim,
                    head_stride: p.head_dim,
                };
                (kb, vb, as_heads(&kp), as_heads(&vp), Some((kp, vp, tb)))
            }
        };
        let d = qh.head_dim;
        for (what, b, h) in [("k", &kb, &kh), ("v", &vb, &vh), ("out", &ob, &oh)] {
            if h.head_dim != d {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what,
                    got: b.shape().to_vec(),
                    expected: format!("head_dim {d} like q"),
                });
            }
        }
        if !SUPPORTED_HEAD_DIMS.contains(&d) {
            return Err(Error::invalid(OP, "head_dim", d, format!("unsupported (supported: {SUPPORTED_HEAD_DIMS:?})")));
        }
        if kh.heads == 0 {
            return Err(Error::invalid(OP, "kv_heads", 0, "must be > 0 (k and v need at least one head)"));
        }
        if qh.heads % kh.heads != 0 {
            return Err(Error::invalid(OP, "q_heads", qh.heads, format!("not divisible by kv_heads {}", kh.heads)));
        }
        if paged.is_none() && (vh.heads != kh.heads || vh.tokens != kh.tokens) {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "v",
                got: vb.shape().to_vec(),
                expected: format!("{:?} like k", kb.shape()),
            });
        }
        if oh.tokens != qh.tokens || oh.heads != qh.heads {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "out",
                got: ob.shape().to_vec(),
                expected: format!("{:?} like q", qb.shape()),
            });
        }
        // Paged: the block table, and (host offsets) whether its rows hold every sequence's keys.
        let mut table = None;
        if let Some((kp, _, tb)) = &paged {
            let (max_pages, stride) = check_block_table(OP, tb, batch)?;
            if let CuSeqlens::Host { k: ck, .. } = cu_seqlens {
                check_cu_seqlens("cu_seqlens_k", ck, ck.last().map_or(0, |&x| x.max(0) as usize))?;
                let longest = ck.windows(2).map(|w| (w[1] - w[0]) as usize).max().unwrap_or(0);
                if longest > max_pages * kp.page_size {
                    return Err(Error::invalid(
                        OP,
                        "block_table",
                        format!("{max_pages} pages per row"),
                        format!(
                            "too narrow: a sequence of {longest} keys needs {} pages of {}",
                            longest.div_ceil(kp.page_size),
                            kp.page_size
                        ),
                    ));
                }
            }
            table = Some((
                tb.addr,
                max_pages,
                stride,
                Rows { addr: tb.addr, elem: 4, rows: batch, cols: max_pages, row_stride: stride.max(max_pages) },
            ));
        }
        if let CuSeqlens::Host { q: cq, k: ck } = cu_seqlens {
            check_cu_seqlens("cu_seqlens_q", cq, qh.tokens)?;
            if paged.is_none() {
                check_cu_seqlens("cu_seqlens_k", ck, kh.tokens)?;
            }
        }
        let lse_len = qh
            .heads
            .checked_mul(qh.tokens)
            .ok_or_else(|| Error::TooLarge { what: "lse", shape: vec![qh.heads, qh.tokens] })?;
        if let Some(l) = &lb {
            if l.shape() != [qh.heads, qh.tokens] || !l.dims.is_contiguous() {
                return Err(Error::ShapeMismatch {
                    op: OP,
                    what: "lse",
                    got: l.shape().to_vec(),
                    expected: format!("contiguous [{}, {}] (q_heads, total_q)", qh.heads, qh.tokens),
                });
            }
        }
        // Options.
        let scale = opts.scale.unwrap_or(1.0 / (d as f32).sqrt());
        // Positive: the kernel takes row maxima of raw scores and scales them (and a softmax
        // with a negative scale is not something a model asks for).
        if !(scale.is_finite() && scale > 0.0) {
            return Err(Error::invalid(OP, "scale", scale, "must be finite and > 0"));
        }
        let (mask, chunk_size) = match opts.mask {
            AttentionMask::None => (LlkAttnMask::LLK_ATTN_NONE, 0),
            AttentionMask::Causal => (LlkAttnMask::LLK_ATTN_CAUSAL, 0),
            AttentionMask::ChunkedCausal { chunk_size: 0 } => {
                return Err(Error::invalid(OP, "chunk_size", 0, "must be > 0"));
            }
            AttentionMask::ChunkedCausal { chunk_size } => (LlkAttnMask::LLK_ATTN_CHUNKED_CAUSAL, chunk_size),
        };
        if let Some(t) = &opts.temperature {
            t.validate(OP)?;
        }
        let group = qh.heads / kh.heads;
        let pack = match opts.gqa_pack {
            Some(p) if p == 0 || p > MAX_PACK || group % p != 0 => {
                return Err(Error::invalid(
                    OP,
                    "gqa_pack",
                    p,
                    format!("must divide the group size {group} and be 1..={MAX_PACK}"),
                ));
            }
            Some(p) => p,
            None => (1..=group.min(MAX_PACK)).rev().find(|p| group % p == 0).unwrap_or(1),
        };
        // Aliasing: out and lse are written, q, k and v (pages and table) read.
        let mut reads: Vec<(&'static str, Region)> = vec![("q", qh.into())];
        match &paged {
            None => reads.extend([("k", kh.into()), ("v", vh.into())]),
            Some((kp, vp, _)) => reads.extend([("k_pages", kp.rows().into()), ("v_pages", vp.rows().into())]),
        }
        if let Some(t) = &table {
            reads.push(("block_table", t.3.into()));
        }
        for (what, r) in &reads {
            check_disjoint(OP, ("out", oh), (*what, *r))?;
        }
        if let Some(l) = &lb {
            let lrows = Rows { addr: l.addr, elem: 4, rows: 1, cols: lse_len, row_stride: lse_len };
            check_disjoint(OP, ("lse", lrows), ("out", oh))?;
            for (what, r) in &reads {
                check_disjoint(OP, ("lse", lrows), (*what, *r))?;
            }
        }
        if qh.tokens == 0 || qh.heads == 0 {
            return Ok(()); // empty batch: nothing to write
        }

        // Tiles: each sequence's queries in blocks of rows / pack tokens.
        let rows_per_block = if dtype == DType::F32 { ROWS_SIMT } else { rows_mma(d) };
        let tokens_per_block = rows_per_block / pack;
        let (cu_q_addr, cu_k_addr, grid_tiles) = match cu_seqlens {
            CuSeqlens::Host { q: cq, k: ck } => {
                // The three arrays as they lie in the workspace (capacity entries each), staged
                // and uploaded in one asynchronous copy.
                let cap = self.capacity;
                self.host.clear();
                self.host.resize(3 * cap, 0);
                self.host[..cq.len()].copy_from_slice(cq);
                self.host[cap..cap + ck.len()].copy_from_slice(ck);
                let mut tiles = 0usize;
                for (i, w) in cq.windows(2).enumerate() {
                    tiles += ((w[1] - w[0]) as usize).div_ceil(tokens_per_block);
                    self.host[2 * cap + i + 1] =
                        i32::try_from(tiles).map_err(|_| Error::invalid(OP, "total_q", qh.tokens, "too many tiles"))?;
                }
                let buf =
                    self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
                let bytes = crate::tensor::as_bytes(&self.host);
                PinnedStaging::upload(self.staging.as_mut(), bytes, buf.storage(), ARRAYS * 4)?;
                (args.read_tensor("workspace", &cq_t)?, args.read_tensor("workspace", &ck_t)?, tiles)
            }
            CuSeqlens::Device { q: cq, k: ck } => {
                let (cqb, ckb) = (args.read("cu_seqlens_q", cq)?, args.read("cu_seqlens_k", ck)?);
                // The plan kernel validates the offsets and writes the tile map; an upper bound
                // on the tile count sizes the grid (extra blocks exit at once).
                let mut plan_args = KernelArgs::new(OP, &device);
                let plan = AttentionPlanParams {
                    cu_seqlens_q: plan_args.read("cu_seqlens_q", cq)?.addr,
                    cu_seqlens_k: plan_args.read("cu_seqlens_k", ck)?.addr,
                    cu_tiles: plan_args.write_tensor("workspace", &cu_tiles_t)?,
                    error_flag: plan_args.write_tensor("workspace", &flag_t)?,
                    batch: to_i64(OP, "batch", batch)?,
                    total_q: to_i64(OP, "total_q", qh.tokens)?,
                    // Paged: the keys' total is not a tensor's size, only the offsets say it.
                    total_k: if paged.is_some() { -1 } else { to_i64(OP, "total_k", kh.tokens)? },
                    tokens_per_block: to_i64(OP, "tokens per block", tokens_per_block)?,
                };
                let dims = LaunchDims { grid: (1, 1, 1), block: (32, 1, 1), dyn_smem: 0 };
                plan_args.launch(PLAN, dims, &plan)?;
                (cqb.addr, ckb.addr, qh.tokens / tokens_per_block + batch)
            }
        };
        if grid_tiles == 0 {
            return Ok(()); // every sequence is empty
        }
        let grid_y = u32::try_from(kh.heads * (group / pack))
            .ok()
            .filter(|&y| y <= 65535)
            .ok_or_else(|| Error::invalid(OP, "heads", qh.heads, "too many head blocks for grid.y (65535)"))?;

        let params = AttentionParams {
            q: qb.addr,
            k: kb.addr,
            v: vb.addr,
            out: ob.addr,
            lse: lb.map_or(0, |l| l.addr),
            cu_seqlens_q: cu_q_addr,
            cu_seqlens_k: cu_k_addr,
            cu_tiles: args.read_tensor("workspace", &cu_tiles_t)?,
            batch: to_i64(OP, "batch", batch)?,
            q_heads: to_i64(OP, "q_heads", qh.heads)?,
            kv_heads: to_i64(OP, "kv_heads", kh.heads)?,
            head_dim: to_i64(OP, "head_dim", d)?,
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
            chunk_size: to_i64(OP, "chunk_size", chunk_size)?,
            mask,
            temperature: if opts.temperature.is_some() {
                LlkAttnTemperature::LLK_ATTN_LLAMA4_TEMPERATURE
            } else {
                LlkAttnTemperature::LLK_ATTN_NO_TEMPERATURE
            },
            scale,
            temp_floor_scale: opts.temperature.map_or(1.0, |t| t.floor_scale),
            temp_attn_scale: opts.temperature.map_or(0.0, |t| t.attn_scale),
            kv_source: if paged.is_some() { LlkKvSource::LLK_KV_PAGED } else { LlkKvSource::LLK_KV_CONTIGUOUS },
            block_table: table.map_or(0, |t| t.0),
            error_flag: args.write_tensor("workspace", &flag_t)?,
            block_table_stride: to_i64(OP, "block table stride", table.map_or(0, |t| t.2))?,
            max_pages: to_i64(OP, "max_pages", table.map_or(0, |t| t.1))?,
            page_size: to_i64(OP, "page_size", paged.as_ref().map_or(1, |p| p.0.page_size))?,
            num_pages: to_i64(OP, "num_pages", paged.as_ref().map_or(0, |p| p.0.num_pages))?,
            k_page_stride: to_i64(OP, "k page stride", paged.as_ref().map_or(0, |p| p.0.page_stride))?,
            v_page_stride: to_i64(OP, "v page stride", paged.as_ref().map_or(0, |p| p.1.page_stride))?,
        };
        if let Some((kp, vp, _)) = &paged {
            kp.check_aligned(OP, "k_pages")?;
            vp.check_aligned(OP, "v_pages")?;
        }
        // The tensor-core path copies 16-byte chunks: every row must start 16-byte aligned.
        if dtype != DType::F32 {
            for (what, h) in [("q", &qh), ("k", &kh), ("v", &vh), ("out", &oh)] {
                h.check_rows_aligned(OP, what)?;
            }
        }
        let dims = LaunchDims {
            grid: (grid_x(OP, grid_tiles)?, grid_y, 1),
            block: (THREADS, 1, 1),
            dyn_smem: if dtype == DType::F32 { 0 } else { mma_smem_bytes(d) },
        };
        args.launch(KERNELS.find(OP, "q", (dtype, d), dtype)?, dims, &params)
    }

    fn array_flag(&self) -> Result<Tensor> {
        let buf = self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        buf.narrow(0, FLAG, 1)
    }
}

/// One-shot attention with a temporary workspace (allocates; engines should keep an
/// [`AttentionWorkspace`]).
#[allow(clippy::too_many_arguments)]
pub fn gqa_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    out: &Tensor,
    lse: Option<&Tensor>,
    opts: &AttentionOptions,
) -> Result<()> {
    AttentionWorkspace::new(q.device()).forward(q, k, v, cu_seqlens_q, cu_seqlens_k, out, lse, opts)
}

/// One-shot attention on borrowed views (allocates a temporary workspace; engines should keep
/// an [`AttentionWorkspace`] and call [`AttentionWorkspace::forward_on`]).
#[allow(clippy::too_many_arguments)]
pub fn gqa_attention_on(
    queue: &impl Queue,
    q: &TensorView<'_>,
    k: &TensorView<'_>,
    v: &TensorView<'_>,
    cu_seqlens: CuSeqlens<'_, '_>,
    out: &mut TensorViewMut<'_>,
    lse: Option<&mut TensorViewMut<'_>>,
    opts: &AttentionOptions,
) -> Result<()> {
    let device = queue.queue_device()?;
    AttentionWorkspace::new(&device).forward_on(&device, q, k, v, cu_seqlens, out, lse, opts)
}
