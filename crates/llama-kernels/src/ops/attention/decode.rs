//! Split-KV decode attention over the paged cache (kernels/paged_attention.cu): the planner
//! ([`PagedDecodeWorkspace::plan`]) and the launch of the decode and merge kernels. See
//! [`crate::ops::attention`] for the semantics.

use crate::backend::{Device, Queue};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ffi::params::{LLK_DECODE_MAX_Q_LEN, LLK_DECODE_MAX_SPLITS, LLK_DECODE_ROWS_MMA, LLK_DECODE_ROWS_SIMT};
use crate::kernels::attention::SUPPORTED_HEAD_DIMS;
use crate::launch::KernelArgs;
use crate::launch::check_float;
use crate::spec::attention::Llama4Temperature;
use crate::tensor::Tensor;

use super::decode_launch::{
    DecodeArgs, DecodeBound, DecodeConfig, DecodeShape, KEYS_PER_TILE, OP, Outputs, check_dtypes, decode_config,
    kernel, launch_dims, merge_splits, params,
};
use super::paged::{MAX_SCALED_KV_HEADS, PagedKvCache, PagedKvView};
use super::variant::Variant;
use crate::ops::error_flag::ErrorFlag;
use crate::spec::attention::AttentionMask;

/// Most query tokens per sequence in one decode call.
pub const MAX_Q_LEN: usize = LLK_DECODE_MAX_Q_LEN as usize;
/// Most splits per sequence.
pub const MAX_SPLITS: usize = LLK_DECODE_MAX_SPLITS as usize;

/// One decode call on tensors ([`PagedDecodeWorkspace::forward`]): [`DecodeArgs`] with a
/// [`PagedKvCache`] and tensors for views.
#[derive(Clone, Copy, Debug)]
pub struct DecodeTensors<'t> {
    /// The new tokens' queries, `[batch * q_len, q_heads, head_dim]`.
    pub q: &'t Tensor,
    /// The cache (the new tokens already appended).
    pub cache: &'t PagedKvCache,
    /// `[batch, max_pages]` i32.
    pub block_table: &'t Tensor,
    /// `[batch]` i32.
    pub seq_lens: &'t Tensor,
    /// The output, shaped as q.
    pub out: &'t Tensor,
    /// `[q_heads, batch * q_len]` f32, if wanted.
    pub lse: Option<&'t Tensor>,
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
    /// The tensor-core kernel's configuration on this device ([`decode_config`]).
    config: DecodeConfig,
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
                supported: "the q dtype, or fp8 with bf16/f16 q".into(),
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
        if s.page_dtype == DType::F8E4M3 && s.kv_heads > MAX_SCALED_KV_HEADS {
            return Err(Error::invalid(
                OP,
                "kv_heads",
                s.kv_heads,
                format!("an fp8 cache supports at most {MAX_SCALED_KV_HEADS} KV heads"),
            ));
        }
        if !(1..=MAX_Q_LEN).contains(&s.q_len) {
            return Err(Error::invalid(OP, "q_len", s.q_len, format!("must be 1..={MAX_Q_LEN}")));
        }
        if s.max_seq_len > i32::MAX as usize {
            return Err(Error::invalid(OP, "max_seq_len", s.max_seq_len, "must fit in i32"));
        }
        let limit = device.max_shared_memory_per_block();
        let config = decode_config(device.max_shared_memory_per_sm(), limit, s.dtype, s.page_dtype, s.head_dim);
        if s.dtype != DType::F32 {
            let bytes = kernel(&s, s.page_dtype, config)?.shared_memory()?.bytes() as usize;
            if bytes > limit {
                return Err(Error::invalid(
                    OP,
                    "head_dim",
                    s.head_dim,
                    format!(
                        "with {} pages needs {bytes} bytes of shared memory per block; this device allows {limit}",
                        s.page_dtype
                    ),
                ));
            }
        }
        let rows_per_block = if s.dtype == DType::F32 { LLK_DECODE_ROWS_SIMT } else { LLK_DECODE_ROWS_MMA } as usize;
        let group = s.q_heads / s.kv_heads;
        let row_blocks = (group * s.q_len).div_ceil(rows_per_block).max(1);
        let num_splits = match num_splits {
            Some(n) if n == 0 || n > MAX_SPLITS => {
                return Err(Error::invalid(OP, "num_splits", n, format!("must be 1..={MAX_SPLITS}")));
            }
            Some(n) => n,
            // (Only a heuristic's input: a product too large for usize fills the GPU anyway.)
            None => plan_splits(
                device.sm_count(),
                s.batch.max(1).saturating_mul(s.kv_heads).saturating_mul(row_blocks),
                s.max_seq_len,
            ),
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
            config,
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
        self.errors.check(OP)
    }

    /// Decode over a [`PagedKvCache`] (see [`DecodeTensors`] and the module docs).
    pub fn forward(&mut self, call: DecodeTensors<'_>, opts: &PagedDecodeOptions) -> Result<()> {
        let (k_pages, v_pages) = (call.cache.k_pages().view(), call.cache.v_pages().view());
        let kv = PagedKvView { k_pages: &k_pages, v_pages: &v_pages, scales: &call.cache.config().scales };
        let (q, block_table, seq_lens) = (call.q.view(), call.block_table.view(), call.seq_lens.view());
        let (mut out, mut lse) = (call.out.view_mut(), call.lse.map(Tensor::view_mut));
        let args = DecodeArgs {
            q: &q,
            kv: &kv,
            block_table: &block_table,
            seq_lens: &seq_lens,
            out: &mut out,
            lse: lse.as_mut(),
        };
        self.forward_on(call.q.device(), args, opts)
    }

    /// Decode on borrowed views (see [`DecodeArgs`]), queued on `queue`. `seq_lens.len()` is the
    /// batch (at most the planned one), q has `batch * q_len` tokens.
    pub fn forward_on(
        &mut self,
        queue: &impl Queue,
        call: DecodeArgs<'_, '_>,
        opts: &PagedDecodeOptions,
    ) -> Result<()> {
        let DecodeArgs { q, kv, block_table, seq_lens, out, lse } = call;
        let mut lse = lse;
        let device = queue.queue_device()?;
        if !device.same_context(&self.device) {
            return Err(Error::DeviceMismatch { op: OP, what: "workspace" });
        }
        let plan = self.shape;
        check_dtypes(&plan, q, kv, seq_lens, out, lse.as_deref())?;
        let mut args = KernelArgs::new(OP, &device);
        let views = DecodeArgs { q, kv, block_table, seq_lens, out, lse: lse.as_deref_mut() };
        let b = DecodeBound::new(&mut args, &plan, views)?;
        let error_flag = args.write_tensor("error flag", self.errors.tensor())?;
        let scales = kv.scales.per_head(OP, b.kp.dtype, b.kp.kv_heads)?;
        let mask = match opts.chunk_size {
            None => AttentionMask::Causal,
            Some(chunk_size) => AttentionMask::ChunkedCausal { chunk_size },
        };
        let variant = Variant::new(OP, mask, opts.scale, opts.temperature, plan.head_dim)?;
        b.check_disjoint(&plan)?;
        b.check_aligned()?;
        if b.batch == 0 || plan.q_heads == 0 {
            return Ok(());
        }

        let group = plan.q_heads / plan.kv_heads;
        let (partial_out, partial_lse) = match &self.partial {
            Some((o, l)) => (args.write_tensor("workspace", o)?, args.write_tensor("workspace", l)?),
            None => (0, 0),
        };
        let outputs = Outputs {
            partial_out,
            partial_lse,
            error_flag,
            num_splits: self.num_splits,
            row_blocks: (group * plan.q_len).div_ceil(self.rows_per_block),
        };
        let dims = launch_dims(&plan, &b, &outputs)?;
        let params = params(&plan, &b, &outputs, &variant, scales)?;
        let kernel = kernel(&plan, b.kp.dtype, self.config)?;
        let (tokens, oh) = (b.batch * plan.q_len, b.oh);
        args.launch(kernel, dims, &params)?;
        if outputs.num_splits == 1 {
            return Ok(());
        }
        // The splits, then their merge into out (and lse), in a second launch.
        let Some((po, pl)) = &self.partial else {
            return Err(Error::InvalidView { what: OP, why: "workspace not planned".into() });
        };
        let mut margs = KernelArgs::new(OP, &device);
        let ob = margs.write("out", out)?;
        let lb = match lse {
            Some(l) => Some(margs.write("lse", l)?),
            None => None,
        };
        merge_splits(margs, &plan, (po, pl), (ob, lb), &oh, tokens, outputs.num_splits)
    }
}
