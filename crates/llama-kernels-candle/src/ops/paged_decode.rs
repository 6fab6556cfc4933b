//! Decode attention over a paged KV cache (kernels/paged_attention.cu): appending new tokens'
//! K and V to the cache's pages, then split-KV attention of 1 to 8 new queries per sequence
//! against every cached key, on tensor cores for bf16 and f16 (with bf16/f16 or fp8 pages).
//! Inference only: there is no backward.
//!
//! The pools are the kernel crate's, allocated on the memory of the candle device the cache is
//! made for (candle's stream for CUDA, the emulated target for the CPU); the queries, block
//! tables, slots and outputs are candle tensors. Page `p` of a sequence's block table holds its
//! keys `p · page_size ..`; the slot of a new token is `page · page_size + offset`.

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::attention::{
    DecodeArgs, DecodeShape, KvAppendArgs, PagedDecodeWorkspace, PagedKvView, kv_append_on,
};
pub use llama_kernels::ops::attention::{KvScales, PagedDecodeOptions, PagedKvConfig};

use crate::bridge::{Input, Kernel, KernelStorage, arity, kernel_device_of, kernel_dtype, kernel_err, launch, op_err};

/// One layer's paged KV cache for candle tensors on one device.
#[derive(Debug)]
pub struct PagedKvCache {
    cache: llama_kernels::ops::attention::PagedKvCache,
}

impl PagedKvCache {
    /// Zeroed K and V pools `[num_pages, page_size, kv_heads, head_dim]` of `config.dtype` for
    /// tensors on `device` (the configuration is checked first).
    pub fn new(device: &candle::Device, config: &PagedKvConfig) -> Result<PagedKvCache> {
        let kdev = kernel_device_of(Append::NAME, device)?;
        let cache = llama_kernels::ops::attention::PagedKvCache::new(&kdev, config).map_err(kernel_err)?;
        Ok(PagedKvCache { cache })
    }

    /// The configuration.
    pub fn config(&self) -> &PagedKvConfig {
        self.cache.config()
    }

    /// Writes the new tokens' `k` and `v` (`[tokens, kv_heads, head_dim]`, the cache's dtype or,
    /// for fp8 pages, bf16/f16 quantized on the way) at `slots` (`[tokens]` i64; -1 skips a
    /// token). A slot outside the pools is skipped and reported by [`PagedKvCache::check_errors`].
    pub fn append(&self, k: &Tensor, v: &Tensor, slots: &Tensor) -> Result<()> {
        launch(&Append { cache: &self.cache }, &[&k.contiguous()?, &v.contiguous()?, &slots.contiguous()?]).map(|_| ())
    }

    /// Attention of `q` (`[batch · q_len, q_heads, head_dim]`, the new tokens of each sequence,
    /// already appended) over each sequence's cached keys: `block_table` `[batch, max_pages]`
    /// i32 names its pages, `seq_lens` `[batch]` i32 its length (new tokens included); the
    /// queries are causal among themselves. Returns the output shaped as q. A block table that
    /// names a page outside the pools is an error (its keys are never read); reporting it waits
    /// for the device.
    pub fn decode(
        &self,
        q: &Tensor,
        block_table: &Tensor,
        seq_lens: &Tensor,
        opts: &PagedDecodeOptions,
    ) -> Result<Tensor> {
        let inputs = [&q.contiguous()?, &block_table.contiguous()?, &seq_lens.contiguous()?];
        let mut out = launch(&Decode { cache: &self.cache, opts: *opts }, &inputs)?;
        out.pop().ok_or_else(|| op_err(Decode::NAME, "produced no output"))
    }

    /// Reads and clears the error flags (an append's bad slot, a block table's page outside the
    /// pools). Waits for the device.
    pub fn check_errors(&self) -> Result<()> {
        self.cache.check_errors().map_err(kernel_err)
    }
}

/// `[k, v, slots]` into the cache's pools; no outputs.
struct Append<'c> {
    cache: &'c llama_kernels::ops::attention::PagedKvCache,
}

impl Kernel for Append<'_> {
    const NAME: &'static str = "llama-kernels/kv_append";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [k, v, slots] = arity(Self::NAME, inputs)?;
        let device = k.storage.kernel_device()?;
        let (kv, vv, sv) = (k.view()?, v.view()?, slots.view()?);
        let (mut kp, mut vp) = (self.cache.k_pages().view_mut(), self.cache.v_pages().view_mut());
        let call = KvAppendArgs {
            k: &kv,
            v: &vv,
            slot_mapping: &sv,
            k_pages: &mut kp,
            v_pages: &mut vp,
            scales: &self.cache.config().scales,
        };
        kv_append_on(&device, call, self.cache.error_flag()).map_err(kernel_err)?;
        Ok(Vec::new())
    }
}

/// `[q, block_table, seq_lens]` to the output.
struct Decode<'c> {
    cache: &'c llama_kernels::ops::attention::PagedKvCache,
    opts: PagedDecodeOptions,
}

impl Kernel for Decode<'_> {
    const NAME: &'static str = "llama-kernels/paged_decode";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [q, block_table, seq_lens] = arity(Self::NAME, inputs)?;
        let device = q.storage.kernel_device()?;
        let c = self.cache.config();
        let (&[tokens, q_heads, head_dim], &[batch, max_pages], &[lens]) =
            (q.dims(), block_table.dims(), seq_lens.dims())
        else {
            return Err(op_err(
                Self::NAME,
                format_args!(
                    "q {:?}, block_table {:?}, seq_lens {:?} must be [batch · q_len, q_heads, head_dim], [batch, max_pages], [batch]",
                    q.dims(),
                    block_table.dims(),
                    seq_lens.dims()
                ),
            ));
        };
        if lens != batch || batch == 0 || tokens % batch != 0 {
            return Err(op_err(
                Self::NAME,
                format_args!(
                    "{tokens} queries, {batch} block-table rows and {lens} lengths: q must hold q_len queries per sequence"
                ),
            ));
        }
        let shape = DecodeShape {
            batch,
            q_len: tokens / batch,
            q_heads,
            kv_heads: c.kv_heads,
            head_dim,
            max_seq_len: max_pages.saturating_mul(c.page_size),
            dtype: kernel_dtype(Self::NAME, q.dtype())?,
            page_dtype: c.dtype,
        };
        let mut ws = PagedDecodeWorkspace::plan(&device, &shape).map_err(kernel_err)?;
        let mut out = q.zeros(q.dims(), q.dtype())?;
        {
            let (qv, bv, lv) = (q.view()?, block_table.view()?, seq_lens.view()?);
            let (kp, vp) = (self.cache.k_pages().view(), self.cache.v_pages().view());
            let kv = PagedKvView { k_pages: &kp, v_pages: &vp, scales: &c.scales };
            let mut ov = out.view_mut(q.dims())?;
            let args = DecodeArgs { q: &qv, kv: &kv, block_table: &bv, seq_lens: &lv, out: &mut ov, lse: None };
            ws.forward_on(&device, args, &self.opts).map_err(kernel_err)?;
        }
        ws.check_errors().map_err(kernel_err)?;
        Ok(vec![(out, q.layout.shape().clone())])
    }
}
