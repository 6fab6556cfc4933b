//! Flash-style grouped-query attention for prefill (kernels/attention.cu): the workspace and
//! its launch. See [`crate::ops::attention`] for shapes and semantics.

use super::paged::{PagedKvCache, PagedKvView};
use super::prefill_launch::{
    Bound, CuSeqlens, DevicePlan, KvInput, OP, Tiles, batch_of, check_dtypes, gqa_pack, kernel, launch_dims, mma_keys,
    params, plan_on_device, sm90_launch, sm90_tokens_per_block, tokens_per_block, uses_sm90,
};
use super::variant::Variant;
use crate::backend::{Device, PinnedStaging, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::LlkDeviceError;
use crate::launch::KernelArgs;
use crate::ops::error_flag::{Meanings, check_flag};
use crate::spec::attention::{AttentionMask, Llama4Temperature};
use crate::tensor::{Tensor, TensorView, TensorViewMut};

/// One prefill call on borrowed views ([`AttentionWorkspace::forward_on`]), the argument
/// struct of the op as `AttentionParams` is the kernel's. Shapes: see the module docs.
#[derive(Debug)]
pub struct AttentionArgs<'r, 'a> {
    /// Queries `[total_q, q_heads, head_dim]`.
    pub q: &'r TensorView<'a>,
    /// Where the keys and values are.
    pub kv: KvInput<'r, 'a>,
    /// Cumulative sequence offsets of the queries and keys.
    pub cu_seqlens: CuSeqlens<'r, 'a>,
    /// The output, shaped as q.
    pub out: &'r mut TensorViewMut<'a>,
    /// The log-sum-exp of each row, `[q_heads, total_q]` f32 (`-inf` for a row that attends no
    /// key), if wanted.
    pub lse: Option<&'r mut TensorViewMut<'a>>,
}

/// One prefill call on tensors ([`AttentionWorkspace::forward`]): [`AttentionArgs`] with
/// tensors for views.
#[derive(Clone, Copy, Debug)]
pub struct AttentionTensors<'t> {
    /// Queries `[total_q, q_heads, head_dim]`.
    pub q: &'t Tensor,
    /// Where the keys and values are.
    pub kv: KvTensors<'t>,
    /// Cumulative sequence offsets of the queries and keys.
    pub cu_seqlens: Offsets<'t>,
    /// The output, shaped as q.
    pub out: &'t Tensor,
    /// The log-sum-exp of each row, `[q_heads, total_q]` f32, if wanted.
    pub lse: Option<&'t Tensor>,
}

/// Where a prefill reads its keys and values (tensors): [`KvInput`] with tensors for views.
#[derive(Clone, Copy, Debug)]
pub enum KvTensors<'t> {
    /// `[total_k, kv_heads, head_dim]` keys and values.
    Contiguous {
        /// Keys.
        k: &'t Tensor,
        /// Values, shaped as the keys.
        v: &'t Tensor,
    },
    /// The paged KV cache, through a block table `[batch, max_pages]` i32.
    Paged {
        /// The page pools.
        cache: &'t PagedKvCache,
        /// `[batch, max_pages]` i32.
        block_table: &'t Tensor,
    },
}

/// Cumulative sequence offsets (tensors): [`CuSeqlens`] with tensors for views.
#[derive(Clone, Copy, Debug)]
pub enum Offsets<'t> {
    /// Host slices of `batch + 1` values each (copied through the workspace's pinned staging).
    Host {
        /// Query offsets.
        q: &'t [i32],
        /// Key offsets.
        k: &'t [i32],
    },
    /// Device-resident i32 vectors (no host copy: CUDA-graph capturable).
    Device {
        /// Query offsets.
        q: &'t Tensor,
        /// Key offsets.
        k: &'t Tensor,
    },
}

/// Options of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub struct AttentionOptions {
    /// Which keys each query attends.
    pub mask: AttentionMask,
    /// Softmax scale, finite and > 0; `None` is `1 / sqrt(head_dim)`.
    pub scale: Option<f32>,
    /// Llama 4 temperature tuning, from each query's absolute position.
    pub temperature: Option<Llama4Temperature>,
    /// q heads of one KV group that share a block (and so every K/V tile it loads). `None`
    /// picks the largest divisor of the group size up to 16. Must divide q_heads / kv_heads.
    pub gqa_pack: Option<usize>,
}

/// What the prefill kernels' error bits mean.
const MEANINGS: &Meanings = &[
    (LlkDeviceError::LLK_DEVICE_BAD_SEQLENS, "cu_seqlens (not from 0, decreasing, or not ending at the token counts)"),
    (
        LlkDeviceError::LLK_DEVICE_BAD_PAGE,
        "a page id outside the pool or a key past the block-table row (its keys were skipped)",
    ),
];

/// Offsets of the workspace buffer (i32 elements): the error flag, then [`ARRAY_COUNT`] arrays
/// of `capacity` entries: the q and k offsets, the query tile map, and the key tile map of the
/// backward's dK/dV launch.
const FLAG: usize = 0;
const ARRAYS: usize = 4;
const ARRAY_COUNT: usize = 4;

/// Reusable per-call state: a small device buffer for the sequence offsets, the tile map and a
/// device-side error flag, and a pinned staging buffer for host offsets. Plan it once with
/// [`AttentionWorkspace::plan`] for the largest batch; calls within that capacity
/// allocate nothing (a larger batch grows it, the only allocation).
#[derive(Debug)]
pub struct AttentionWorkspace {
    device: Device,
    buf: Option<Tensor>,
    /// Entries per array: the largest `batch + 1` planned for.
    capacity: usize,
    host: Vec<i32>,
    staging: Option<PinnedStaging>,
    /// The backward's delta = rowsum(dO * O), `[q_heads, total_q]` f32 (grown on demand).
    delta: Option<Tensor>,
}

impl AttentionWorkspace {
    /// An empty workspace on `device`; the first call allocates (see [`AttentionWorkspace::plan`]).
    pub fn new(device: &Device) -> AttentionWorkspace {
        AttentionWorkspace {
            device: device.clone(),
            buf: None,
            capacity: 0,
            host: Vec::new(),
            staging: None,
            delta: None,
        }
    }
    /// Preallocates room for batches of up to `max_batch` sequences.
    pub fn plan(device: &Device, max_batch: usize) -> Result<AttentionWorkspace> {
        let mut ws = Self::new(device);
        ws.reserve(max_batch)?;
        Ok(ws)
    }
    pub(super) fn device(&self) -> &Device {
        &self.device
    }
    pub(super) fn reserve(&mut self, batch: usize) -> Result<()> {
        let need = batch.checked_add(1).ok_or_else(|| Error::invalid(OP, "batch", batch, "too large"))?;
        if self.buf.is_none() || self.capacity < need {
            let capacity = need.next_power_of_two();
            let elems = capacity
                .checked_mul(ARRAY_COUNT)
                .and_then(|n| n.checked_add(ARRAYS))
                .ok_or_else(|| Error::invalid(OP, "batch", batch, "too large"))?;
            self.buf = Some(Tensor::zeros(&self.device, DType::I32, &[elems])?);
            self.staging = PinnedStaging::new(&self.device, ARRAY_COUNT * capacity * 4)?;
            self.capacity = capacity;
        }
        Ok(())
    }
    pub(super) fn array(&self, index: usize, len: usize) -> Result<Tensor> {
        let buf = self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        buf.narrow(0, ARRAYS + index * self.capacity, len)
    }

    /// Reads and clears the device-side error flag (waits for the device): `Err` names what an
    /// earlier call with device-resident offsets found invalid (that call wrote nothing).
    pub fn check_errors(&self) -> Result<()> {
        let Some(buf) = &self.buf else { return Ok(()) };
        check_flag(OP, &buf.narrow(0, FLAG, 1)?, MEANINGS)
    }

    /// Runs one call on tensors (see [`AttentionTensors`]); `out` (and `lse`) are written. See
    /// the module docs for shapes and semantics.
    pub fn forward(&mut self, call: AttentionTensors<'_>, opts: &AttentionOptions) -> Result<()> {
        let q = call.q.view();
        let (k, v, k_pages, v_pages, table, paged);
        let kv = match call.kv {
            KvTensors::Contiguous { k: kt, v: vt } => {
                (k, v) = (kt.view(), vt.view());
                KvInput::Contiguous { k: &k, v: &v }
            }
            KvTensors::Paged { cache, block_table } => {
                (k_pages, v_pages, table) = (cache.k_pages().view(), cache.v_pages().view(), block_table.view());
                paged = PagedKvView { k_pages: &k_pages, v_pages: &v_pages, scales: cache.scales() };
                KvInput::Paged { kv: &paged, block_table: &table }
            }
        };
        let (cq, ck);
        let cu_seqlens = match call.cu_seqlens {
            Offsets::Host { q, k } => CuSeqlens::Host { q, k },
            Offsets::Device { q, k } => {
                (cq, ck) = (q.view(), k.view());
                CuSeqlens::Device { q: &cq, k: &ck }
            }
        };
        let mut out = TensorViewMut::of_tensor(call.out);
        let mut lse = call.lse.map(TensorViewMut::of_tensor);
        let args = AttentionArgs { q: &q, kv, cu_seqlens, out: &mut out, lse: lse.as_mut() };
        self.forward_on(call.q.device(), args, opts)
    }

    /// Runs one call on borrowed views (see [`AttentionArgs`]), queued on `queue` (a
    /// [`Device`] or an engine's `Arc<CudaStream>` of the workspace's context). With K/V read in
    /// place from the paged cache ([`KvInput::Paged`]), a chunked prefill after a cached prefix
    /// needs no gather copy; a page id outside the pool, or a key past the block-table row when
    /// the offsets live on the device, is never read: its keys are skipped and
    /// [`AttentionWorkspace::check_errors`] reports it.
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        args: AttentionArgs<'_, '_>,
        opts: &AttentionOptions,
    ) -> Result<()> {
        self.run(queue, args, opts)
    }

    fn run(&mut self, queue: &impl Queue, call: AttentionArgs<'_, '_>, opts: &AttentionOptions) -> Result<()> {
        let AttentionArgs { q, kv: src, cu_seqlens, out, lse } = call;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let dtype = check_dtypes(q, src, out, lse.as_deref())?;
        let batch = batch_of(cu_seqlens)?;
        self.reserve(batch)?;
        // The workspace arrays (views of one buffer: no allocation).
        let n = batch + 1;
        let (cq_t, ck_t, cu_tiles_t, flag_t) =
            (self.array(0, n)?, self.array(1, n)?, self.array(2, n)?, self.array_flag()?);

        let mut args = KernelArgs::new(OP, &device);
        let b = Bound::new(&mut args, q, src, out, lse)?;
        let d = b.check_heads()?;
        let table = b.check_table_and_offsets(batch, cu_seqlens)?;
        let lse_len = b.check_lse()?;
        let variant = Variant::new(OP, opts.mask, opts.scale, opts.temperature, d)?;
        let pack = gqa_pack(opts.gqa_pack, b.qh.heads / b.kh.heads)?;
        b.check_disjoint(table.as_ref(), lse_len)?;
        if b.qh.tokens == 0 || b.qh.heads == 0 {
            return Ok(()); // empty batch: nothing to write
        }

        // The Hopper kernel's blocks hold 128 rows at every head dim; the mma.sync kernel's 64
        // at head_dim 256.
        let hopper = uses_sm90(&device, dtype, &b);
        let tokens_per_block = if hopper { sm90_tokens_per_block(pack) } else { tokens_per_block(dtype, d, pack) };
        let (cu_q, cu_k, grid_tiles) = match cu_seqlens {
            CuSeqlens::Host { q: cq, k: ck } => {
                let (tiles, _) = self.stage_host_offsets(&device, cq, ck, tokens_per_block, None)?;
                (args.read_tensor("workspace", &cq_t)?, args.read_tensor("workspace", &ck_t)?, tiles)
            }
            CuSeqlens::Device { q: cq, k: ck } => {
                let (cqb, ckb) = (args.read("cu_seqlens_q", cq)?, args.read("cu_seqlens_k", ck)?);
                let plan = DevicePlan {
                    cu_seqlens_q: cq,
                    cu_seqlens_k: ck,
                    cu_tiles: &cu_tiles_t,
                    error_flag: &flag_t,
                    batch,
                    tokens_per_block,
                };
                let tiles = plan_on_device(&device, (b.qh.tokens, b.paged.is_none().then_some(b.kh.tokens)), plan)?;
                (cqb.addr, ckb.addr, tiles)
            }
        };
        if grid_tiles == 0 {
            return Ok(()); // every sequence is empty
        }
        let keys = mma_keys(device.max_shared_memory_per_sm(), dtype, d);
        let dims = launch_dims(&b, grid_tiles, pack)?;
        let tiles = Tiles {
            cu_q,
            cu_k,
            cu_tiles: args.read_tensor("workspace", &cu_tiles_t)?,
            error_flag: args.write_tensor("workspace", &flag_t)?,
        };
        let params = params(&b, table.as_ref(), &tiles, batch, pack, &variant)?;
        b.check_aligned(dtype)?;
        if hopper {
            let (kernel, dims, params) = sm90_launch(&args, &b, dims, params, pack)?;
            return args.launch(kernel, dims, &params);
        }
        args.launch(kernel(dtype, d, keys)?, dims, &params)
    }

    /// Host offsets (validated): the arrays as they lie in the workspace (capacity entries each:
    /// the q and k offsets, the query tile map and, with `keys_per_block`, the key tile map),
    /// staged and uploaded in one asynchronous copy. Returns the numbers of query and key tiles.
    pub(super) fn stage_host_offsets(
        &mut self,
        reader: &Device,
        cq: &[i32],
        ck: &[i32],
        tokens_per_block: usize,
        keys_per_block: Option<usize>,
    ) -> Result<(usize, usize)> {
        let cap = self.capacity;
        self.host.clear();
        self.host.resize(ARRAY_COUNT * cap, 0);
        self.host[..cq.len()].copy_from_slice(cq);
        self.host[cap..cap + ck.len()].copy_from_slice(ck);
        let q_tiles = tile_map(cq, tokens_per_block, &mut self.host[2 * cap..3 * cap])?;
        let k_tiles = match keys_per_block {
            Some(n) => tile_map(ck, n, &mut self.host[3 * cap..])?,
            None => 0,
        };
        let buf = self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        let bytes = crate::tensor::as_bytes(&self.host);
        PinnedStaging::upload(self.staging.as_mut(), bytes, buf.storage(), ARRAYS * 4, reader)?;
        Ok((q_tiles, k_tiles))
    }

    /// The backward's delta buffer, `len` f32 values (grown on demand: the only allocation of a
    /// backward call beyond [`AttentionWorkspace::plan`]'s).
    pub(super) fn delta(&mut self, len: usize) -> Result<Tensor> {
        if self.delta.as_ref().is_none_or(|t| t.numel() < len) {
            self.delta = Some(Tensor::zeros(&self.device, DType::F32, &[len.max(1)])?);
        }
        let t = self.delta.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        t.narrow(0, 0, len)
    }

    pub(super) fn array_flag(&self) -> Result<Tensor> {
        let buf = self.buf.as_ref().ok_or(Error::InvalidView { what: OP, why: "workspace not planned".into() })?;
        buf.narrow(0, FLAG, 1)
    }
}

/// The cumulative tile map of validated offsets `cu` in blocks of `per_block` tokens (`map[0]`
/// stays 0); returns the number of tiles.
fn tile_map(cu: &[i32], per_block: usize, map: &mut [i32]) -> Result<usize> {
    let mut tiles = 0usize;
    for (i, w) in cu.windows(2).enumerate() {
        tiles += ((w[1] - w[0]) as usize).div_ceil(per_block);
        map[i + 1] = i32::try_from(tiles).map_err(|_| Error::invalid(OP, "cu_seqlens", tiles, "too many tiles"))?;
    }
    Ok(tiles)
}
