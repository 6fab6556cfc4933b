//! The paged KV cache of a layer stack: per-layer page pools, host page lists and a free
//! list (see [`crate::block`] for how a step uses it).

use crate::error::{Error, Result};
use crate::formats::config::{LayerSpec, MAX_LAYERS};
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops::attention::{KvScales, PagedKvCache, PagedKvConfig};

use super::step::Step;

const OP: &str = "DecoderLayer::forward";

/// The default page size of [`KvCache`] (16 tokens, vLLM's and FlashInfer's usual).
pub const DEFAULT_PAGE_SIZE: usize = 16;

/// Most sequences a [`KvCache`] holds at once (its host bookkeeping is per slot).
pub const MAX_SLOTS: usize = 1 << 20;

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
    ///
    /// [`LayerWorkspace::begin_step`]: super::LayerWorkspace::begin_step
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
///
/// [`LayerWorkspace::begin_step`]: super::LayerWorkspace::begin_step
#[derive(Debug)]
pub struct KvCache {
    pub(crate) id: usize,
    /// Bumped whenever a slot's pages or length change outside a step (clear, assume_cached):
    /// a step planned before that is stale.
    pub(crate) generation: u64,
    pub(crate) dtype: DType,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) config: KvCacheConfig,
    pub(crate) num_pages: usize,
    pub(crate) layers: Vec<PagedKvCache>,
    pub(crate) lens: Vec<usize>,
    pub(crate) pages: Vec<Vec<i32>>,
    /// Free page ids, popped from the end (the lowest id first).
    pub(crate) free: Vec<i32>,
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
        if c.slots > MAX_SLOTS {
            return Err(Error::invalid(op, "slots", c.slots, format!("exceeds the maximum of {MAX_SLOTS}")));
        }
        if layers > MAX_LAYERS {
            return Err(Error::invalid(op, "layers", layers, format!("exceeds the maximum of {MAX_LAYERS}")));
        }
        // Sequence lengths and key offsets travel to the kernels as i32.
        if i32::try_from(c.max_len).is_err() {
            return Err(Error::invalid(op, "max_len", c.max_len, "must fit in i32"));
        }
        if !c.page_size.is_power_of_two() || i32::try_from(c.page_size).is_err() {
            return Err(Error::invalid(op, "page_size", c.page_size, "must be a power of two that fits in i32"));
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
        let layers =
            (0..layers).map(|_| PagedKvCache::new(device, &pool)).collect::<llama_kernels::Result<Vec<_>>>()?;
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
        specs.iter().try_for_each(LayerSpec::check)?;
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

    /// Sequences the cache holds at once.
    pub fn slots(&self) -> usize {
        self.config.slots
    }
    /// Most tokens of one sequence.
    pub fn max_len(&self) -> usize {
        self.config.max_len
    }
    /// The dtype of the K and V pages.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The size the cache was made with, as given (see [`KvCache::num_pages`] for the pool).
    pub fn config(&self) -> &KvCacheConfig {
        &self.config
    }
    /// Tokens per page (a power of two).
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
    /// Cached tokens of every slot, by slot.
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
    pub(crate) fn reserve(&mut self, needs: &[(usize, usize)]) -> Result<()> {
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
