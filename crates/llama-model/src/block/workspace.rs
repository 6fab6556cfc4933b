//! The planned buffers of a layer stack ([`LayerWorkspace`]) and the planning of a step.

use crate::error::{Error, Result};
use crate::formats::config::{FfnSpec, LayerSpec};
use llama_kernels::backend::{Device, PinnedStaging};
use llama_kernels::dtype::DType;
use llama_kernels::ops::attention::AttentionWorkspace;
use llama_kernels::ops::attention::{DecodeShape, PagedDecodeWorkspace};
use llama_kernels::ops::linear;
use llama_kernels::ops::moe::MoeFfnConfig;
use llama_kernels::ops::moe::MoeWorkspace;
use llama_kernels::ops::qlinear::QScratch;
use llama_kernels::tensor::Tensor;

use super::kv_cache::KvCache;
use super::step::{Step, StepSeq};

const OP: &str = "DecoderLayer::forward";

/// Activations and per-step state of a layer stack, planned once for `max_tokens` tokens.
#[derive(Debug)]
pub struct LayerWorkspace {
    pub(crate) dtype: DType,
    pub(crate) id: usize,
    pub(crate) generation: u64,
    pub(crate) max_tokens: usize,
    /// The cache planned for: slots and block-table width.
    pub(crate) slots: usize,
    pub(crate) max_pages: usize,
    pub(crate) hidden: usize,
    pub(crate) q_heads: usize,
    pub(crate) kv_heads: usize,
    pub(crate) head_dim: usize,
    pub(crate) intermediate: usize,
    pub(crate) normed: Tensor,
    pub(crate) qkv: Tensor,
    pub(crate) attn: Tensor,
    pub(crate) proj: Tensor,
    pub(crate) gate_up: Tensor,
    /// One buffer, uploaded once per step (see [`MetaLayout`]).
    pub(crate) meta: Tensor,
    pub(crate) layout: MetaLayout,
    pub(crate) host_meta: Vec<i32>,
    pub(crate) staging: Option<PinnedStaging>,
    pub(crate) attention: AttentionWorkspace,
    pub(crate) decode: PagedDecodeWorkspace,
    /// The MoE feed-forward's buffers, shared by every MoE layer (none without MoE layers).
    pub(crate) moe: Option<MoeWorkspace>,
    /// The dense band packed projections dequantize into for prefill steps (see
    /// [`LayerWorkspace::plan_packed`]; none until then).
    pub(crate) qscratch: Option<QScratch>,
    /// The scratch of attached LoRA adapters' branches (none until an adapter is attached).
    pub(crate) lora: Option<llama_kernels::ops::lora::LoraScratch>,
}

/// Where a step's metadata sits in the workspace's one i32 buffer (offsets in i32 elements):
/// positions `[max_tokens]`, cu_seqlens_q and cu_seqlens_k `[slots + 1]` each, seq_lens
/// `[slots]`, the block table `[batch, width]` (room for `slots x max_pages`), and the slot
/// mapping `[max_tokens]` as i64 (two i32 each, 8-byte aligned).
#[derive(Clone, Copy, Debug)]
pub(crate) struct MetaLayout {
    pub(crate) cu_q: usize,
    pub(crate) cu_k: usize,
    pub(crate) seq_lens: usize,
    pub(crate) table: usize,
    pub(crate) slot_mapping: usize,
    pub(crate) len: usize,
}

impl MetaLayout {
    pub(crate) fn new(max_tokens: usize, slots: usize, max_pages: usize) -> Option<MetaLayout> {
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
pub(crate) fn moe_config(spec: &LayerSpec) -> Option<MoeFfnConfig> {
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
    pub fn plan(
        device: &Device,
        dtype: DType,
        specs: &[LayerSpec],
        max_tokens: usize,
        cache: &KvCache,
    ) -> Result<Self> {
        let op = "LayerWorkspace::plan";
        let first = specs.first().ok_or_else(|| Error::invalid(op, "specs", "[]", "needs a layer"))?;
        specs.iter().try_for_each(LayerSpec::check)?;
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
            return Err(Error::from(llama_kernels::Error::UnsupportedDType {
                op,
                what: "run dtype",
                dtype,
                supported: "f32, f16, bf16".into(),
            }));
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
            Some(&c) => Some(MoeWorkspace::plan(device, c, dtype, c.intermediate, max_tokens)?),
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
        linear::plan(device, dtype, max_tokens)?;
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
            attention: AttentionWorkspace::plan(device, slots)?,
            decode,
            moe,
            qscratch: None,
            lora: None,
        })
    }

    /// Most tokens (rows of the hidden states) one step may have.
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
            return Err(Error::from(llama_kernels::Error::DTypeMismatch {
                op,
                what: "cache",
                got: cache.dtype,
                expected: self.dtype,
            }));
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
        let (mut offset, mut keys) = (0usize, 0usize);
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
            let end = start.checked_add(new).filter(|&end| end <= cache.max_len()).ok_or_else(|| {
                Error::invalid(
                    op,
                    "new tokens",
                    new,
                    format!(
                        "slot {slot} holds {start} tokens; with these it would exceed the cache's {} per slot",
                        cache.max_len()
                    ),
                )
            })?;
            seqs.push(StepSeq { slot, start, new, offset });
            offset = offset.checked_add(new).filter(|&n| n <= self.max_tokens).ok_or_else(|| {
                Error::invalid(
                    op,
                    "tokens",
                    new,
                    format!("the step would exceed the workspace's max_tokens {}", self.max_tokens),
                )
            })?;
            // The keys of the whole batch are counted in i32 (cumulative key offsets).
            keys = keys
                .checked_add(end)
                .filter(|&n| i32::try_from(n).is_ok())
                .ok_or_else(|| Error::invalid(op, "tokens", end, "the batch's keys exceed i32"))?;
        }
        // Every check is above: from here on the cache changes (pages are reserved).
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
        let bytes = llama_kernels::tensor::as_bytes(&self.host_meta);
        self.meta.upload_staged(self.staging.as_mut(), bytes, self.meta.device())?;
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

    pub(crate) fn check_step(&self, step: &Step) -> Result<()> {
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
    pub(crate) fn meta_views(&self, step: &Step) -> Result<StepMeta> {
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
pub(crate) struct StepMeta {
    pub(crate) positions: Tensor,
    pub(crate) cu_q: Tensor,
    pub(crate) cu_k: Tensor,
    pub(crate) seq_lens: Tensor,
    pub(crate) block_table: Tensor,
    pub(crate) slot_mapping: Tensor,
}
