//! The decoder layer forward, its planned workspace, and the KV cache it appends to.
//!
//! ```text
//! hidden ─ rms_norm ─ linear(qkv) ─ rope(q, k) ─ append k, v to the cache ─ attention ─ linear(o)
//!        └──────────────────────────────────────────── fused_add_rms_norm ◄─────────────────┘
//!                                          (hidden += o; normed = norm(hidden))
//! dense:  linear(gate|up) ─ swiglu (in place over the gate half) ─ linear_add(down) into hidden
//! MoE:    MoeWorkspace::forward: router ─ route ─ align ─ gather (x w) ─ grouped gate_up + swiglu
//!         ─ grouped down, shared expert (two one-group GEMMs) ─ combine + residual into hidden
//! ```
//!
//! Every stage is one op of this crate: matrix products are [`ops::linear`](mod@crate::ops::linear)
//! (cuBLAS / the CPU GEMM), the rest are the hand-written kernels. The residual add after the
//! feed-forward is fused into the down projection (cuBLAS `beta = 1`: one rounding of the sum).
//!
//! **Planning.** [`KvCache::new`] (or [`KvCache::with_config`]) allocates the cache;
//! [`LayerWorkspace::new`] allocates every buffer for `max_tokens` tokens over that cache
//! (activations, the step metadata, the attention and decode workspaces, the MoE workspace when
//! a layer is MoE, the pinned staging buffer, the cuBLAS handle). After that, a step
//! ([`LayerWorkspace::begin_step`] + one [`DecoderLayer::forward`] per layer) allocates nothing
//! and does not wait on the host. `begin_step` makes one asynchronous upload from pinned memory
//! (positions, sequence offsets, sequence lengths, the block table and the slot mapping, for
//! every layer of the step); it waits only if the device is more than four steps behind (the
//! staging ring is full). The one exception is the first call with a bias on a stream that
//! `LayerWorkspace::new` did not plan (see `ops::linear::prepare`).
//!
//! **KV cache.** The cache is paged ([`crate::ops::attention`]): per layer, K and V pools of
//! `[num_pages, page_size, kv_heads, head_dim]` (16-token pages by default). The host keeps each
//! slot's page list and a free list: `begin_step` gives a sequence pages as it grows (all or
//! nothing; an exhausted pool is a named error), [`KvCache::clear`] returns them, so a pool
//! smaller than `slots * max_len` serves sequences of different lengths. The forward appends the
//! step's k/v from the fused QKV buffer straight into their pages (`kv_append`, one launch for
//! K and V), then runs attention on the pages in place: a step where every sequence has one new
//! token runs the split-KV decode kernel (tensor cores, splits planned once for the cache's
//! slots and context); any other step (prefill, chunked prefill after a cached prefix, mixed
//! batches) runs the varlen prefill kernel over the paged K/V with device-resident offsets.
//! Both read the same block table; neither gathers the cache into a contiguous copy.

use super::config::{FfnSpec, LayerSpec};
use super::weights::{FfnWeights, HostLayerWeights, LayerWeights};
use crate::backend::{Device, PinnedStaging};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace, CuSeqlens};
use crate::ops::moe::{MoeFfnConfig, MoeWorkspace};
use crate::ops::attention::{
    DecodeShape, KvScales, PagedDecodeOptions, PagedDecodeWorkspace, PagedKv, PagedKvCache, PagedKvConfig,
};
use crate::ops::rope::Rope;
use crate::ops::swiglu::GateUp;
use crate::ops::{self, linear};
use crate::tensor::{Tensor, TensorViewMut};

const OP: &str = "DecoderLayer::forward";

/// The default page size of [`KvCache`] (16 tokens, vLLM's and FlashInfer's usual).
pub const DEFAULT_PAGE_SIZE: usize = 16;

/// The size of a paged [`KvCache`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvCacheConfig {
    /// Sequences the cache holds at once.
    pub slots: usize,
    /// Most tokens of one sequence.
    pub max_len: usize,
    /// Tokens per page (a power of two).
    pub page_size: usize,
    /// Pages in each layer's pool; `None` is enough for every slot at `max_len`
    /// (`slots * ceil(max_len / page_size)`). Fewer pages than that is the point of paging:
    /// memory for the tokens actually cached, with [`LayerWorkspace::begin_step`] returning a
    /// named error when the pool runs out.
    pub num_pages: Option<usize>,
}

impl KvCacheConfig {
    /// `slots` sequences of up to `max_len` tokens, pages of [`DEFAULT_PAGE_SIZE`], enough pages
    /// for all of them.
    pub fn new(slots: usize, max_len: usize) -> KvCacheConfig {
        KvCacheConfig { slots, max_len, page_size: DEFAULT_PAGE_SIZE, num_pages: None }
    }
}

/// The paged KV cache of a stack of layers: per layer one [`PagedKvCache`] (K and V pools of
/// `[num_pages, page_size, kv_heads, head_dim]`), and on the host the pages each slot owns (the
/// same page ids in every layer), a free list, and per slot the number of cached tokens (the
/// scheduler knows it). [`LayerWorkspace::begin_step`] gives a sequence pages as it grows;
/// [`KvCache::clear`] returns them.
#[derive(Debug)]
pub struct KvCache {
    id: usize,
    /// Bumped whenever a slot's pages or length change outside a step (clear, assume_cached):
    /// a step planned before that is stale.
    generation: u64,
    dtype: DType,
    kv_heads: usize,
    head_dim: usize,
    config: KvCacheConfig,
    num_pages: usize,
    layers: Vec<PagedKvCache>,
    lens: Vec<usize>,
    pages: Vec<Vec<i32>>,
    /// Free page ids, popped from the end (the lowest id first).
    free: Vec<i32>,
}

impl KvCache {
    /// A cache for `layers` layers of `kv_heads` x `head_dim`, `slots` sequences of up to
    /// `max_len` tokens each ([`KvCacheConfig::new`]).
    pub fn new(
        device: &Device,
        dtype: DType,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        slots: usize,
        max_len: usize,
    ) -> Result<KvCache> {
        Self::with_config(device, dtype, layers, kv_heads, head_dim, &KvCacheConfig::new(slots, max_len))
    }

    /// A cache of `config`'s size for `layers` layers of `kv_heads` x `head_dim`.
    pub fn with_config(
        device: &Device,
        dtype: DType,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        config: &KvCacheConfig,
    ) -> Result<KvCache> {
        let op = "KvCache::new";
        let c = *config;
        if c.slots == 0 || c.max_len == 0 || kv_heads == 0 || head_dim == 0 {
            return Err(Error::invalid(
                op,
                "size",
                format!("{} slots x {}", c.slots, c.max_len),
                "every size must be > 0",
            ));
        }
        if !c.page_size.is_power_of_two() {
            return Err(Error::invalid(op, "page_size", c.page_size, "must be a power of two"));
        }
        let per_slot = c.max_len.div_ceil(c.page_size);
        let num_pages = match c.num_pages {
            Some(n) => n,
            None => c
                .slots
                .checked_mul(per_slot)
                .ok_or_else(|| Error::invalid(op, "slots x max_len", c.slots, "overflows"))?,
        };
        if num_pages == 0 || i32::try_from(num_pages).is_err() {
            return Err(Error::invalid(op, "num_pages", num_pages, "must be 1..=i32::MAX"));
        }
        let pool =
            PagedKvConfig { num_pages, page_size: c.page_size, kv_heads, head_dim, dtype, scales: KvScales::default() };
        let layers = (0..layers).map(|_| PagedKvCache::new(device, &pool)).collect::<Result<Vec<_>>>()?;
        static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        Ok(KvCache {
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
            dtype,
            kv_heads,
            head_dim,
            config: c,
            num_pages,
            layers,
            lens: vec![0; c.slots],
            pages: vec![Vec::new(); c.slots],
            free: (0..num_pages as i32).rev().collect(),
        })
    }

    /// A cache for the layers of `specs` (which must share kv_heads and head_dim).
    pub fn for_layers(
        device: &Device,
        dtype: DType,
        specs: &[LayerSpec],
        slots: usize,
        max_len: usize,
    ) -> Result<KvCache> {
        Self::for_layers_with(device, dtype, specs, &KvCacheConfig::new(slots, max_len))
    }

    /// [`KvCache::for_layers`] of `config`'s size.
    pub fn for_layers_with(
        device: &Device,
        dtype: DType,
        specs: &[LayerSpec],
        config: &KvCacheConfig,
    ) -> Result<KvCache> {
        let first =
            specs.first().ok_or_else(|| Error::invalid("KvCache::for_layers", "specs", "[]", "needs a layer"))?;
        if let Some(s) = specs.iter().find(|s| s.kv_heads != first.kv_heads || s.head_dim != first.head_dim) {
            return Err(Error::invalid(
                "KvCache::for_layers",
                "specs",
                s.index,
                "layers differ in kv_heads or head_dim",
            ));
        }
        Self::with_config(device, dtype, specs.len(), first.kv_heads, first.head_dim, config)
    }

    pub fn slots(&self) -> usize {
        self.config.slots
    }
    pub fn max_len(&self) -> usize {
        self.config.max_len
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn config(&self) -> &KvCacheConfig {
        &self.config
    }
    pub fn page_size(&self) -> usize {
        self.config.page_size
    }
    /// Pages in each layer's pool.
    pub fn num_pages(&self) -> usize {
        self.num_pages
    }
    /// Pages no slot owns.
    pub fn free_pages(&self) -> usize {
        self.free.len()
    }
    /// The pages `slot` owns, in token order (empty for a slot out of range).
    pub fn pages(&self, slot: usize) -> &[i32] {
        self.pages.get(slot).map_or(&[], Vec::as_slice)
    }
    /// Pages one sequence of `max_len` tokens needs: the width of the block tables.
    pub fn max_pages_per_seq(&self) -> usize {
        self.config.max_len.div_ceil(self.config.page_size)
    }
    /// Cached tokens of `slot` (0 for a slot out of range).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }
    /// Forgets `slot`'s tokens (a finished sequence) and returns its pages to the pool.
    pub fn clear(&mut self, slot: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = 0;
            if let Some(p) = self.pages.get_mut(slot) {
                // Keep the free list ordered so that the lowest id goes out first.
                self.free.append(p);
                self.free.sort_unstable_by(|a, b| b.cmp(a));
            }
            self.generation += 1;
        }
    }
    /// Layer `layer`'s page pools.
    pub fn layer(&self, layer: usize) -> Result<&PagedKvCache> {
        self.layers.get(layer).ok_or_else(|| {
            Error::invalid(OP, "cache layer", layer, format!("the cache has {} layers", self.layers.len()))
        })
    }
    /// Marks `len` tokens of `slot` as cached without computing them (their keys and values are
    /// whatever the pages hold): for benchmarks that need a long context quickly.
    pub fn assume_cached(&mut self, slot: usize, len: usize) -> Result<()> {
        if slot >= self.config.slots || len > self.config.max_len {
            return Err(Error::invalid(
                "KvCache::assume_cached",
                "slot or len",
                format!("{slot}, {len}"),
                "outside the cache",
            ));
        }
        self.reserve(&[(slot, len)])?;
        self.lens[slot] = len;
        self.generation += 1;
        Ok(())
    }

    /// Gives each `(slot, tokens)` enough pages for `tokens` tokens, all or nothing: when the
    /// pool cannot cover every request, nothing changes and the error names the shortfall.
    fn reserve(&mut self, needs: &[(usize, usize)]) -> Result<()> {
        let ps = self.config.page_size;
        let more = |&(slot, tokens): &(usize, usize)| tokens.div_ceil(ps).saturating_sub(self.pages[slot].len());
        let want: usize = needs.iter().map(more).sum();
        if want > self.free.len() {
            return Err(Error::invalid(
                "LayerWorkspace::begin_step",
                "num_pages",
                self.num_pages,
                format!("the page pool is exhausted: the step needs {want} more pages, {} are free", self.free.len()),
            ));
        }
        for &(slot, tokens) in needs {
            while self.pages[slot].len() < tokens.div_ceil(ps) {
                let page =
                    self.free.pop().ok_or_else(|| Error::invalid(OP, "num_pages", self.num_pages, "internal"))?;
                self.pages[slot].push(page);
            }
        }
        Ok(())
    }

    /// Records a step's tokens as cached, once every layer has run it.
    pub fn commit(&mut self, step: &Step) -> Result<()> {
        for s in &step.seqs {
            if self.lens.get(s.slot) != Some(&s.start) || step.cache != (self.id, self.generation) {
                return Err(Error::invalid(
                    "KvCache::commit",
                    "step",
                    s.slot,
                    "the slot changed since begin_step (committed twice, cleared, or another cache?)",
                ));
            }
        }
        for s in &step.seqs {
            self.lens[s.slot] = s.start + s.new;
        }
        Ok(())
    }
}

/// One sequence of a step.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepSeq {
    /// Its cache slot.
    pub slot: usize,
    /// Tokens already cached (its new tokens sit at positions `start..start + new`).
    pub start: usize,
    /// New tokens in this step.
    pub new: usize,
    /// Row of its first new token in the step's hidden states.
    pub offset: usize,
}

/// A planned step: which sequences, at which positions; its offsets are on the device in the
/// workspace that planned it ([`LayerWorkspace::begin_step`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    workspace: usize,
    generation: u64,
    /// The cache it was planned on: (id, generation).
    cache: (usize, u64),
    /// Every sequence has one new token: attention runs the split-KV decode kernel.
    decode: bool,
    /// Block-table width (the cache's pages per sequence).
    width: usize,
    /// Total new tokens (rows of the hidden states).
    pub tokens: usize,
    pub seqs: Vec<StepSeq>,
}

impl Step {
    /// The positions of the step's tokens, in row order.
    pub fn positions(&self) -> Vec<i64> {
        self.seqs.iter().flat_map(|s| (s.start..s.start + s.new).map(|p| p as i64)).collect()
    }
}

/// Activations and per-step state of a layer stack, planned once for `max_tokens` tokens.
#[derive(Debug)]
pub struct LayerWorkspace {
    dtype: DType,
    id: usize,
    generation: u64,
    max_tokens: usize,
    /// The cache planned for: slots and block-table width.
    slots: usize,
    max_pages: usize,
    hidden: usize,
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    normed: Tensor,
    qkv: Tensor,
    attn: Tensor,
    proj: Tensor,
    gate_up: Tensor,
    /// One buffer, uploaded once per step (see [`MetaLayout`]).
    meta: Tensor,
    layout: MetaLayout,
    host_meta: Vec<i32>,
    staging: Option<PinnedStaging>,
    attention: AttentionWorkspace,
    decode: PagedDecodeWorkspace,
    /// The MoE feed-forward's buffers, shared by every MoE layer (none without MoE layers).
    moe: Option<MoeWorkspace>,
}

/// Where a step's metadata sits in the workspace's one i32 buffer (offsets in i32 elements):
/// positions `[max_tokens]`, cu_seqlens_q and cu_seqlens_k `[slots + 1]` each, seq_lens
/// `[slots]`, the block table `[batch, width]` (room for `slots x max_pages`), and the slot
/// mapping `[max_tokens]` as i64 (two i32 each, 8-byte aligned).
#[derive(Clone, Copy, Debug)]
struct MetaLayout {
    cu_q: usize,
    cu_k: usize,
    seq_lens: usize,
    table: usize,
    slot_mapping: usize,
    len: usize,
}

impl MetaLayout {
    fn new(max_tokens: usize, slots: usize, max_pages: usize) -> Option<MetaLayout> {
        let cu_q = max_tokens;
        let cu_k = cu_q.checked_add(slots + 1)?;
        let seq_lens = cu_k.checked_add(slots + 1)?;
        let table = seq_lens.checked_add(slots)?;
        let slot_mapping = table.checked_add(slots.checked_mul(max_pages)?)?.next_multiple_of(2);
        let len = slot_mapping.checked_add(max_tokens.checked_mul(2)?)?;
        Some(MetaLayout { cu_q, cu_k, seq_lens, table, slot_mapping, len })
    }
}

/// The MoE configuration of a layer (Llama 4: top-k of the logits, sigmoid weights scaling the
/// expert input, a shared expert of the same intermediate size), or none for a dense layer.
fn moe_config(spec: &LayerSpec) -> Option<MoeFfnConfig> {
    match spec.ffn {
        FfnSpec::Moe { experts, top_k, intermediate } => {
            Some(MoeFfnConfig::llama4(spec.hidden, intermediate, experts, top_k))
        }
        FfnSpec::Dense { .. } => None,
    }
}

impl LayerWorkspace {
    /// Plans the buffers of the layers in `specs` (one model: same hidden size and heads) for
    /// steps of up to `max_tokens` tokens over `cache` (or any cache with at most its slots and
    /// context).
    pub fn new(device: &Device, dtype: DType, specs: &[LayerSpec], max_tokens: usize, cache: &KvCache) -> Result<Self> {
        let op = "LayerWorkspace::new";
        let first = specs.first().ok_or_else(|| Error::invalid(op, "specs", "[]", "needs a layer"))?;
        if let Some(s) = specs.iter().find(|s| {
            (s.hidden, s.q_heads, s.kv_heads, s.head_dim)
                != (first.hidden, first.q_heads, first.kv_heads, first.head_dim)
        }) {
            return Err(Error::invalid(op, "specs", s.index, "layers differ in hidden size or heads"));
        }
        if max_tokens == 0 {
            return Err(Error::invalid(op, "max_tokens", 0, "must be > 0"));
        }
        if (cache.kv_heads, cache.head_dim) != (first.kv_heads, first.head_dim) || cache.dtype != dtype {
            return Err(Error::invalid(
                op,
                "cache",
                format!("{} {}x{}", cache.dtype, cache.kv_heads, cache.head_dim),
                "dtype, kv_heads or head_dim differ from the layers'",
            ));
        }
        if !dtype.is_float() {
            return Err(Error::UnsupportedDType { op, what: "run dtype", dtype, supported: "f32, f16, bf16" });
        }
        let (h, t) = (first.hidden, max_tokens);
        // The dense MLP's gate|up buffer (MoE layers use the MoE workspace instead).
        let intermediate = specs.iter().filter(|s| !s.is_moe()).map(LayerSpec::intermediate).max().unwrap_or(0);
        let moe_specs: Vec<MoeFfnConfig> = specs.iter().filter_map(moe_config).collect();
        if let Some(c) = moe_specs.iter().find(|c| **c != moe_specs[0]) {
            return Err(Error::invalid(
                op,
                "specs",
                format!("{} experts x top-{}, intermediate {}", c.experts, c.top_k, c.intermediate),
                "MoE layers differ in experts, top-k or intermediate size",
            ));
        }
        let moe = match moe_specs.first() {
            Some(&c) => Some(MoeWorkspace::new(device, c, dtype, c.intermediate, max_tokens)?),
            None => None,
        };
        let (slots, max_pages) = (cache.slots(), cache.max_pages_per_seq());
        let layout = MetaLayout::new(max_tokens, slots, max_pages)
            .ok_or_else(|| Error::invalid(op, "max_tokens", max_tokens, "the step metadata overflows"))?;
        let decode = PagedDecodeWorkspace::plan(
            device,
            &DecodeShape {
                batch: slots,
                q_len: 1,
                q_heads: first.q_heads,
                kv_heads: first.kv_heads,
                head_dim: first.head_dim,
                max_seq_len: cache.max_len(),
                dtype,
                page_dtype: cache.dtype,
            },
        )?;
        static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        linear::prepare(device, dtype, max_tokens)?;
        Ok(LayerWorkspace {
            dtype,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
            max_tokens,
            slots,
            max_pages,
            hidden: h,
            q_heads: first.q_heads,
            kv_heads: first.kv_heads,
            head_dim: first.head_dim,
            intermediate,
            normed: Tensor::zeros(device, dtype, &[t, h])?,
            qkv: Tensor::zeros(device, dtype, &[t, first.qkv_dim()])?,
            attn: Tensor::zeros(device, dtype, &[t, first.q_heads * first.head_dim])?,
            proj: Tensor::zeros(device, dtype, &[t, h])?,
            gate_up: Tensor::zeros(device, dtype, &[t, 2 * intermediate.max(1)])?,
            meta: Tensor::zeros(device, DType::I32, &[layout.len])?,
            layout,
            host_meta: vec![0; layout.len],
            staging: PinnedStaging::new(device, layout.len * 4)?,
            attention: AttentionWorkspace::with_capacity(device, slots)?,
            decode,
            moe,
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Plans a step: `batch` lists `(slot, new_tokens)` in increasing slot order; the new tokens
    /// of each sequence follow its cached ones. Gives each sequence the pages its new tokens
    /// need (all or nothing: an exhausted pool is a named error that changes nothing), then
    /// uploads the step's positions, sequence offsets, block table and slot mapping once
    /// (asynchronously, from pinned memory) for every layer that runs it.
    pub fn begin_step(&mut self, cache: &mut KvCache, batch: &[(usize, usize)]) -> Result<Step> {
        let op = "LayerWorkspace::begin_step";
        if cache.dtype != self.dtype {
            return Err(Error::DTypeMismatch { op, what: "cache", got: cache.dtype, expected: self.dtype });
        }
        if (cache.kv_heads, cache.head_dim) != (self.kv_heads, self.head_dim) {
            return Err(Error::invalid(
                op,
                "cache",
                format!("{}x{}", cache.kv_heads, cache.head_dim),
                "kv_heads x head_dim differ from the layers'",
            ));
        }
        if cache.slots() > self.slots || cache.max_pages_per_seq() > self.max_pages {
            return Err(Error::invalid(
                op,
                "cache",
                format!("{} slots x {} pages", cache.slots(), cache.max_pages_per_seq()),
                format!("exceeds the workspace's {} slots x {} pages", self.slots, self.max_pages),
            ));
        }
        if batch.is_empty() {
            return Err(Error::invalid(op, "batch", "[]", "needs at least one sequence"));
        }
        let mut seqs = Vec::with_capacity(batch.len());
        let mut offset = 0usize;
        for (i, &(slot, new)) in batch.iter().enumerate() {
            if slot >= cache.slots() {
                return Err(Error::invalid(op, "slot", slot, format!("the cache has {} slots", cache.slots())));
            }
            if i > 0 && slot <= batch[i - 1].0 {
                return Err(Error::invalid(op, "slot", slot, "slots must be listed in increasing order"));
            }
            if new == 0 {
                return Err(Error::invalid(op, "new tokens", 0, format!("slot {slot} needs at least one new token")));
            }
            let start = cache.lens[slot];
            if start + new > cache.max_len() {
                return Err(Error::invalid(
                    op,
                    "new tokens",
                    new,
                    format!(
                        "slot {slot} holds {start} tokens; {} exceed the cache's {} per slot",
                        start + new,
                        cache.max_len()
                    ),
                ));
            }
            seqs.push(StepSeq { slot, start, new, offset });
            offset += new;
        }
        if offset > self.max_tokens {
            return Err(Error::invalid(
                op,
                "tokens",
                offset,
                format!("exceed the workspace's max_tokens {}", self.max_tokens),
            ));
        }
        let needs: Vec<(usize, usize)> = seqs.iter().map(|s| (s.slot, s.start + s.new)).collect();
        cache.reserve(&needs)?;
        cache.generation += 1;
        let ps = cache.page_size();
        // The block table is [batch, pages per sequence at max_len] (what the decode plan needs).
        let width = cache.max_pages_per_seq();
        // Host meta (see MetaLayout); unused entries stay 0.
        let l = self.layout;
        let to_i32 = |v: usize| i32::try_from(v).map_err(|_| Error::invalid(op, "tokens", v, "exceed i32"));
        self.host_meta.iter_mut().for_each(|v| *v = 0);
        let mut row = 0;
        for (b, s) in seqs.iter().enumerate() {
            let pages = &cache.pages[s.slot];
            for p in s.start..s.start + s.new {
                self.host_meta[row] = to_i32(p)?;
                // The token's slot in the pools, page * page_size + row, as i64 (little endian).
                let page = pages.get(p / ps).copied().ok_or_else(|| Error::invalid(op, "pages", s.slot, "internal"))?;
                let slot = i64::from(page) * ps as i64 + (p % ps) as i64;
                self.host_meta[l.slot_mapping + 2 * row] = slot as i32;
                self.host_meta[l.slot_mapping + 2 * row + 1] = (slot >> 32) as i32;
                row += 1;
            }
            self.host_meta[l.cu_q + b + 1] = to_i32(s.offset + s.new)?;
            self.host_meta[l.cu_k + b + 1] = self.host_meta[l.cu_k + b] + to_i32(s.start + s.new)?;
            self.host_meta[l.seq_lens + b] = to_i32(s.start + s.new)?;
            self.host_meta[l.table + b * width..l.table + b * width + pages.len()].copy_from_slice(pages);
        }
        let bytes = crate::tensor::as_bytes(&self.host_meta);
        PinnedStaging::upload(self.staging.as_mut(), bytes, self.meta.storage(), 0)?;
        self.generation += 1;
        Ok(Step {
            workspace: self.id,
            generation: self.generation,
            cache: (cache.id, cache.generation),
            decode: seqs.iter().all(|s| s.new == 1),
            width,
            tokens: offset,
            seqs,
        })
    }

    fn check_step(&self, step: &Step) -> Result<()> {
        if step.workspace != self.id || step.generation != self.generation {
            return Err(Error::invalid(
                OP,
                "step",
                step.generation,
                "was planned by another workspace, or before its last begin_step",
            ));
        }
        Ok(())
    }

    /// The device views of a step's metadata.
    fn meta_views(&self, step: &Step) -> Result<StepMeta> {
        let (l, t, batch) = (self.layout, step.tokens, step.seqs.len());
        let i32_at = |at: usize, len: usize| self.meta.narrow(0, at, len);
        Ok(StepMeta {
            positions: i32_at(0, t)?,
            cu_q: i32_at(l.cu_q, batch + 1)?,
            cu_k: i32_at(l.cu_k, batch + 1)?,
            seq_lens: i32_at(l.seq_lens, batch)?,
            block_table: i32_at(l.table, batch * step.width)?.reshape(&[batch, step.width])?,
            slot_mapping: self.meta.reinterpret(DType::I64, 4 * (self.meta.offset() + l.slot_mapping), &[t])?,
        })
    }
}

/// A step's metadata on the device (views of the workspace's buffer).
struct StepMeta {
    positions: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    seq_lens: Tensor,
    block_table: Tensor,
    slot_mapping: Tensor,
}

/// The intermediates of one traced forward ([`DecoderLayer::forward_traced`]), as f64 values in
/// row-major order, by stage name.
#[derive(Debug, Default)]
pub struct Trace {
    pub stages: Vec<(&'static str, Vec<f64>)>,
}

impl Trace {
    pub fn get(&self, stage: &str) -> Option<&[f64]> {
        self.stages.iter().find(|(s, _)| *s == stage).map(|(_, v)| v.as_slice())
    }
}

/// What a forward does after each stage: nothing, download it, or call a mark.
enum Probe<'a> {
    None,
    Trace(&'a mut Trace),
    Mark(&'a mut dyn FnMut(&'static str) -> Result<()>),
}

/// One decoder layer on a device.
#[derive(Debug)]
pub struct DecoderLayer {
    spec: LayerSpec,
    dtype: DType,
    weights: LayerWeights,
    rope: Option<Rope>,
}

impl DecoderLayer {
    /// Uploads `host` (checked against `spec`) in `dtype`.
    pub fn new(device: &Device, dtype: DType, spec: LayerSpec, host: &HostLayerWeights) -> Result<DecoderLayer> {
        let weights = LayerWeights::upload(device, dtype, &spec, host)?;
        let rope = spec.rope.map(|cfg| Rope::new(device, cfg)).transpose()?;
        Ok(DecoderLayer { spec, dtype, weights, rope })
    }

    /// Layer `index` of a checkpoint, converted to `dtype`.
    pub fn load(device: &Device, checkpoint: &super::Checkpoint, index: usize, dtype: DType) -> Result<DecoderLayer> {
        let (spec, host) = checkpoint.layer(index, dtype)?;
        Self::new(device, dtype, spec, &host)
    }

    pub fn spec(&self) -> &LayerSpec {
        &self.spec
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    pub fn weights(&self) -> &LayerWeights {
        &self.weights
    }

    /// Runs the layer on a step's hidden states `[step.tokens, hidden]` (contiguous, the run
    /// dtype), in place: on return `hidden` holds the layer's output. Appends the step's k/v to
    /// layer `cache_layer` of `cache`. Allocates nothing and does not wait on the host (dense and
    /// MoE layers alike: the MoE's expert counts stay on the device).
    pub fn forward(
        &self,
        ws: &mut LayerWorkspace,
        cache: &KvCache,
        cache_layer: usize,
        step: &Step,
        hidden: &Tensor,
    ) -> Result<()> {
        self.run(ws, cache, cache_layer, step, hidden, Probe::None)
    }

    /// [`DecoderLayer::forward`], calling `mark(stage)` after each stage is queued (for
    /// benchmarks: record a CUDA event there to time the stages).
    pub fn forward_with_marks(
        &self,
        ws: &mut LayerWorkspace,
        cache: &KvCache,
        cache_layer: usize,
        step: &Step,
        hidden: &Tensor,
        mark: &mut dyn FnMut(&'static str) -> Result<()>,
    ) -> Result<()> {
        self.run(ws, cache, cache_layer, step, hidden, Probe::Mark(mark))
    }

    /// [`DecoderLayer::forward`], downloading every intermediate (waits for the device after
    /// each stage: for verification only). An MoE layer also records its router logits
    /// (`router`), chosen experts (`routing`, as f64), routing weights (`route_weights`) and
    /// shared expert output (`shared`).
    pub fn forward_traced(
        &self,
        ws: &mut LayerWorkspace,
        cache: &KvCache,
        cache_layer: usize,
        step: &Step,
        hidden: &Tensor,
    ) -> Result<Trace> {
        let mut trace = Trace::default();
        self.run(ws, cache, cache_layer, step, hidden, Probe::Trace(&mut trace))?;
        Ok(trace)
    }

    fn run(
        &self,
        ws: &mut LayerWorkspace,
        cache: &KvCache,
        cache_layer: usize,
        step: &Step,
        hidden: &Tensor,
        mut probe: Probe<'_>,
    ) -> Result<()> {
        let s = &self.spec;
        ws.check_step(step)?;
        let t = step.tokens;
        if hidden.dtype() != self.dtype {
            return Err(Error::DTypeMismatch { op: OP, what: "hidden", got: hidden.dtype(), expected: self.dtype });
        }
        if ws.dtype != self.dtype || cache.dtype != self.dtype {
            return Err(Error::DTypeMismatch {
                op: OP,
                what: "workspace or cache",
                got: ws.dtype,
                expected: self.dtype,
            });
        }
        if hidden.shape() != [t, s.hidden] || !hidden.is_contiguous() {
            return Err(Error::ShapeMismatch {
                op: OP,
                what: "hidden",
                got: hidden.shape().to_vec(),
                expected: format!("contiguous [{t}, {}] (the step's tokens x hidden)", s.hidden),
            });
        }
        let ffn_planned = match moe_config(s) {
            Some(c) => ws.moe.as_ref().map(MoeWorkspace::config) == Some(&c),
            None => ws.intermediate >= s.intermediate(),
        };
        if (ws.hidden, ws.q_heads, ws.kv_heads, ws.head_dim) != (s.hidden, s.q_heads, s.kv_heads, s.head_dim)
            || !ffn_planned
        {
            return Err(Error::invalid(OP, "workspace", ws.id, format!("was not planned for {}", s.describe())));
        }
        if (cache.kv_heads, cache.head_dim) != (s.kv_heads, s.head_dim) {
            return Err(Error::invalid(OP, "cache", cache_layer, "kv_heads x head_dim differ from the layer's"));
        }
        if let Some(bad) = step
            .seqs
            .iter()
            .find(|q| cache.lens.get(q.slot) != Some(&q.start) || step.cache != (cache.id, cache.generation))
        {
            return Err(Error::invalid(
                OP,
                "step",
                bad.slot,
                "the cache changed since begin_step (already committed, cleared, or another cache?)",
            ));
        }
        let pool = cache.layer(cache_layer)?;
        let snap = |probe: &mut Probe<'_>, stage: &'static str, tensor: &Tensor| -> Result<()> {
            match probe {
                Probe::None => Ok(()),
                Probe::Trace(tr) => {
                    tr.stages.push((stage, tensor.to_f64_vec()?));
                    Ok(())
                }
                Probe::Mark(mark) => mark(stage),
            }
        };
        let w = &self.weights;
        let (d, qh, kvh) = (s.head_dim, s.q_heads, s.kv_heads);
        let normed = ws.normed.narrow(0, 0, t)?;
        let qkv = ws.qkv.narrow(0, 0, t)?;
        let attn = ws.attn.narrow(0, 0, t)?;
        let proj = ws.proj.narrow(0, 0, t)?;
        let meta = ws.meta_views(step)?;

        // Attention half.
        ops::rms_norm(hidden, &w.input_norm, s.rms_norm_eps, &normed)?;
        snap(&mut probe, "norm", &normed)?;
        linear::linear(&normed, &w.qkv, w.qkv_bias.as_ref(), &qkv)?;
        snap(&mut probe, "qkv", &qkv)?;
        let heads = qkv.reshape(&[t, qh + 2 * kvh, d])?;
        if let Some(rope) = &self.rope {
            // q and k heads are adjacent in the fused buffer: one view rotates (and qk-norms) both.
            rope.apply(&heads.narrow(1, 0, qh + kvh)?, None, &meta.positions)?;
            snap(&mut probe, "rope", &qkv)?;
        }
        // The new k and v go straight from the fused buffer to their pages (strided views).
        pool.append(&heads.narrow(1, qh, kvh)?, &heads.narrow(1, qh + kvh, kvh)?, &meta.slot_mapping)?;
        let attn_heads = attn.reshape(&[t, qh, d])?;
        let q = heads.narrow(1, 0, qh)?;
        if step.decode {
            // One new token per sequence: split-KV decode on the pages.
            let chunk_size = match s.mask {
                AttentionMask::ChunkedCausal { chunk_size } => Some(chunk_size),
                AttentionMask::Causal | AttentionMask::None => None,
            };
            let opts = PagedDecodeOptions { scale: None, chunk_size, temperature: s.temperature };
            ws.decode.forward(&q, pool, &meta.block_table, &meta.seq_lens, &attn_heads, None, &opts)?;
        } else {
            // Prefill, chunked prefill after a cached prefix, and mixed steps: varlen attention
            // over the pages (cached prefix and new tokens alike), offsets on the device.
            let opts = AttentionOptions { mask: s.mask, temperature: s.temperature, scale: None, gqa_pack: None };
            let (kp, vp) = (pool.k_pages().view(), pool.v_pages().view());
            let kv = PagedKv { k_pages: &kp, v_pages: &vp, scales: pool.scales() };
            let (cq, ck) = (meta.cu_q.view(), meta.cu_k.view());
            ws.attention.forward_paged_on(
                hidden.device(),
                &q.view(),
                &kv,
                &meta.block_table.view(),
                CuSeqlens::Device { q: &cq, k: &ck },
                &mut TensorViewMut::of_tensor(&attn_heads),
                None,
                &opts,
            )?;
        }
        snap(&mut probe, "attention", &attn)?;
        linear::linear(&attn, &w.o, w.o_bias.as_ref(), &proj)?;
        snap(&mut probe, "o_proj", &proj)?;
        ops::fused_add_rms_norm(&proj, hidden, &w.post_norm, s.rms_norm_eps, &normed)?;
        snap(&mut probe, "residual", hidden)?;
        snap(&mut probe, "post_norm", &normed)?;

        // Feed-forward half; the residual add is fused into the down projection.
        match (&w.ffn, s.ffn) {
            (FfnWeights::Dense { gate_up, gate_up_bias, down, down_bias }, FfnSpec::Dense { intermediate: i, .. }) => {
                let gu = ws.gate_up.narrow(0, 0, t)?.narrow(1, 0, 2 * i)?;
                linear::linear(&normed, gate_up, gate_up_bias.as_ref(), &gu)?;
                snap(&mut probe, "gate_up", &gu)?;
                let act = gu.narrow(1, 0, i)?;
                ops::swiglu(GateUp::GateThenUp(&gu), &act)?;
                snap(&mut probe, "swiglu", &act)?;
                linear::linear_add(&act, down, down_bias.as_ref(), hidden)?;
                snap(&mut probe, "output", hidden)?;
                Ok(())
            }
            (FfnWeights::Moe(weights), FfnSpec::Moe { .. }) => {
                // (Checked above: the workspace was planned for this MoE.)
                let moe = ws.moe.as_mut().ok_or_else(|| {
                    Error::invalid(OP, "workspace", s.index, "was planned without MoE layers (LayerWorkspace::new)")
                })?;
                // hidden += moe(normed): combine adds the routed experts and the shared expert to
                // the residual in place.
                moe.forward(weights, &normed, Some(hidden), hidden)?;
                if let Probe::Trace(tr) = &mut probe {
                    let st = moe.stages()?;
                    tr.stages.push(("router", st.logits.to_f64_vec()?));
                    tr.stages.push(("routing", st.ids.to_f64_vec()?));
                    tr.stages.push(("route_weights", st.weights.to_f64_vec()?));
                    if let Some(shared) = &st.shared {
                        tr.stages.push(("shared", shared.to_f64_vec()?));
                    }
                }
                snap(&mut probe, "output", hidden)?;
                Ok(())
            }
            _ => Err(Error::invalid(OP, "weights", s.index, "feed-forward weights do not match the spec")),
        }
    }
}
