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
//! **Planning.** [`LayerWorkspace::new`] allocates every buffer for `max_tokens` tokens and
//! `max_slots` sequences (activations, sequence offsets, the attention workspace, the pinned
//! staging buffer, the cuBLAS handle); [`KvCache::new`] allocates the cache. After that, a step
//! ([`LayerWorkspace::begin_step`] + one [`DecoderLayer::forward`] per layer) allocates nothing
//! and does not wait on the host. `begin_step` makes one asynchronous upload from pinned memory
//! (positions and sequence offsets for every layer of the step); it waits only if the device is
//! more than four steps behind (the staging ring is full). The forward keeps the offsets on the
//! device (the attention kernel reads them there) and appends k/v with device-to-device copies
//! whose addresses the host knows from the step plan. The one exception is the first call with
//! a bias on a stream that `LayerWorkspace::new` did not plan (see `ops::linear::prepare`).
//!
//! **KV cache.** Until the paged cache (issue 8) lands, the cache is one contiguous
//! `[slots * max_len, kv_heads, head_dim]` K and V tensor per layer: slot `s` owns rows
//! `[s * max_len, (s + 1) * max_len)`. Attention runs over the whole cache as a varlen batch of
//! `2 * slots` entries: per slot, its queries against its cached keys (bottom-right causal
//! alignment makes a decode step or a chunked prefill after a cached prefix exact), then an entry
//! with no queries that owns the slot's unused rows. Decode is therefore the prefill kernel with
//! one query per sequence. The paged cache replaces `KvCache`, `append_kv` and the offsets, and
//! nothing else.

use super::config::{FfnSpec, LayerSpec};
use super::weights::{FfnWeights, HostLayerWeights, LayerWeights};
use crate::backend::{Device, PinnedStaging};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::{AttentionOptions, AttentionWorkspace};
use crate::ops::moe::{MoeFfnConfig, MoeWorkspace};
use crate::ops::rope::Rope;
use crate::ops::swiglu::GateUp;
use crate::ops::{self, linear};
use crate::tensor::Tensor;

const OP: &str = "DecoderLayer::forward";

/// The KV cache of a stack of layers: per layer, contiguous K and V of
/// `[slots * max_len, kv_heads, head_dim]`, and per slot the number of cached tokens (host-side:
/// the scheduler knows it).
#[derive(Debug)]
pub struct KvCache {
    dtype: DType,
    kv_heads: usize,
    head_dim: usize,
    slots: usize,
    max_len: usize,
    layers: Vec<(Tensor, Tensor)>,
    lens: Vec<usize>,
}

impl KvCache {
    /// A cache for `layers` layers of `kv_heads` x `head_dim`, `slots` sequences of up to
    /// `max_len` tokens each.
    pub fn new(
        device: &Device,
        dtype: DType,
        layers: usize,
        kv_heads: usize,
        head_dim: usize,
        slots: usize,
        max_len: usize,
    ) -> Result<KvCache> {
        if slots == 0 || max_len == 0 || kv_heads == 0 || head_dim == 0 {
            return Err(Error::invalid(
                "KvCache::new",
                "size",
                format!("{slots} slots x {max_len}"),
                "every size must be > 0",
            ));
        }
        let rows = slots
            .checked_mul(max_len)
            .ok_or_else(|| Error::invalid("KvCache::new", "slots x max_len", slots, "overflows"))?;
        let layers = (0..layers)
            .map(|_| {
                Ok((
                    Tensor::zeros(device, dtype, &[rows, kv_heads, head_dim])?,
                    Tensor::zeros(device, dtype, &[rows, kv_heads, head_dim])?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache { dtype, kv_heads, head_dim, slots, max_len, layers, lens: vec![0; slots] })
    }

    /// A cache for the layers of `specs` (which must share kv_heads and head_dim).
    pub fn for_layers(
        device: &Device,
        dtype: DType,
        specs: &[LayerSpec],
        slots: usize,
        max_len: usize,
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
        Self::new(device, dtype, specs.len(), first.kv_heads, first.head_dim, slots, max_len)
    }

    pub fn slots(&self) -> usize {
        self.slots
    }
    pub fn max_len(&self) -> usize {
        self.max_len
    }
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Cached tokens of `slot` (0 for a slot out of range).
    pub fn len(&self, slot: usize) -> usize {
        self.lens.get(slot).copied().unwrap_or(0)
    }
    pub fn lens(&self) -> &[usize] {
        &self.lens
    }
    /// Forgets `slot`'s tokens (a finished sequence).
    pub fn clear(&mut self, slot: usize) {
        if let Some(l) = self.lens.get_mut(slot) {
            *l = 0;
        }
    }
    /// Layer `layer`'s keys and values, `[slots * max_len, kv_heads, head_dim]`.
    pub fn layer(&self, layer: usize) -> Result<&(Tensor, Tensor)> {
        self.layers.get(layer).ok_or_else(|| {
            Error::invalid(OP, "cache layer", layer, format!("the cache has {} layers", self.layers.len()))
        })
    }
    /// Marks `len` tokens of `slot` as cached without computing them (their keys and values are
    /// whatever the cache holds): for benchmarks that need a long context quickly.
    pub fn assume_cached(&mut self, slot: usize, len: usize) -> Result<()> {
        if slot >= self.slots || len > self.max_len {
            return Err(Error::invalid(
                "KvCache::assume_cached",
                "slot or len",
                format!("{slot}, {len}"),
                "outside the cache",
            ));
        }
        self.lens[slot] = len;
        Ok(())
    }

    /// Records a step's tokens as cached, once every layer has run it.
    pub fn commit(&mut self, step: &Step) -> Result<()> {
        for s in &step.seqs {
            if self.lens.get(s.slot) != Some(&s.start) {
                return Err(Error::invalid(
                    "KvCache::commit",
                    "step",
                    s.slot,
                    "the slot's length changed since begin_step (committed twice?)",
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
    device: Device,
    dtype: DType,
    id: usize,
    generation: u64,
    max_tokens: usize,
    max_slots: usize,
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
    /// i32: positions `[max_tokens]`, cu_seqlens_q `[2 max_slots + 1]`, cu_seqlens_k (same).
    meta: Tensor,
    host_meta: Vec<i32>,
    staging: Option<PinnedStaging>,
    attention: AttentionWorkspace,
    /// The MoE feed-forward's buffers, shared by every MoE layer (none without MoE layers).
    moe: Option<MoeWorkspace>,
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
    /// steps of up to `max_tokens` tokens over caches of up to `max_slots` sequences.
    pub fn new(
        device: &Device,
        dtype: DType,
        specs: &[LayerSpec],
        max_tokens: usize,
        max_slots: usize,
    ) -> Result<Self> {
        let op = "LayerWorkspace::new";
        let first = specs.first().ok_or_else(|| Error::invalid(op, "specs", "[]", "needs a layer"))?;
        if let Some(s) = specs.iter().find(|s| {
            (s.hidden, s.q_heads, s.kv_heads, s.head_dim)
                != (first.hidden, first.q_heads, first.kv_heads, first.head_dim)
        }) {
            return Err(Error::invalid(op, "specs", s.index, "layers differ in hidden size or heads"));
        }
        if max_tokens == 0 || max_slots == 0 {
            return Err(Error::invalid(
                op,
                "max_tokens / max_slots",
                format!("{max_tokens} / {max_slots}"),
                "must be > 0",
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
        let cu = 2 * max_slots + 1;
        let meta_len = max_tokens + 2 * cu;
        static NEXT_ID: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        linear::prepare(device, dtype, max_tokens)?;
        Ok(LayerWorkspace {
            device: device.clone(),
            dtype,
            id: NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            generation: 0,
            max_tokens,
            max_slots,
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
            meta: Tensor::zeros(device, DType::I32, &[meta_len])?,
            host_meta: vec![0; meta_len],
            staging: PinnedStaging::new(device, meta_len * 4)?,
            attention: AttentionWorkspace::with_capacity(device, 2 * max_slots)?,
            moe,
        })
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Plans a step: `batch` lists `(slot, new_tokens)` in increasing slot order; the new tokens
    /// of each sequence follow its cached ones. Uploads the positions and sequence offsets once
    /// (asynchronously, from pinned memory) for every layer that runs the step.
    pub fn begin_step(&mut self, cache: &KvCache, batch: &[(usize, usize)]) -> Result<Step> {
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
        if cache.slots > self.max_slots {
            return Err(Error::invalid(
                op,
                "cache slots",
                cache.slots,
                format!("exceed the workspace's {}", self.max_slots),
            ));
        }
        if batch.is_empty() {
            return Err(Error::invalid(op, "batch", "[]", "needs at least one sequence"));
        }
        let mut seqs = Vec::with_capacity(batch.len());
        let mut offset = 0usize;
        for (i, &(slot, new)) in batch.iter().enumerate() {
            if slot >= cache.slots {
                return Err(Error::invalid(op, "slot", slot, format!("the cache has {} slots", cache.slots)));
            }
            if i > 0 && slot <= batch[i - 1].0 {
                return Err(Error::invalid(op, "slot", slot, "slots must be listed in increasing order"));
            }
            if new == 0 {
                return Err(Error::invalid(op, "new tokens", 0, format!("slot {slot} needs at least one new token")));
            }
            let start = cache.lens[slot];
            if start + new > cache.max_len {
                return Err(Error::invalid(
                    op,
                    "new tokens",
                    new,
                    format!(
                        "slot {slot} holds {start} tokens; {} exceed the cache's {} per slot",
                        start + new,
                        cache.max_len
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
        // Host meta: positions, then cu_seqlens_q and cu_seqlens_k of 2 entries per slot.
        let cu = 2 * self.max_slots + 1;
        let (pos0, q0, k0) = (0, self.max_tokens, self.max_tokens + cu);
        let to_i32 = |v: usize| i32::try_from(v).map_err(|_| Error::invalid(op, "tokens", v, "exceed i32"));
        self.host_meta.iter_mut().for_each(|v| *v = 0);
        let mut row = pos0;
        for s in &seqs {
            for p in s.start..s.start + s.new {
                self.host_meta[row] = to_i32(p)?;
                row += 1;
            }
        }
        let (mut cq, mut ck) = (0usize, 0usize);
        let mut next = seqs.iter().peekable();
        for slot in 0..cache.slots {
            let (q_len, k_len) = match next.peek() {
                Some(s) if s.slot == slot => {
                    let s = next.next().ok_or_else(|| Error::invalid(op, "batch", slot, "internal"))?;
                    (s.new, s.start + s.new)
                }
                _ => (0, cache.lens[slot]),
            };
            // The slot's entry, then an entry without queries owning its unused rows.
            cq += q_len;
            ck += k_len;
            self.host_meta[q0 + 2 * slot + 1] = to_i32(cq)?;
            self.host_meta[k0 + 2 * slot + 1] = to_i32(ck)?;
            ck += cache.max_len - k_len;
            self.host_meta[q0 + 2 * slot + 2] = to_i32(cq)?;
            self.host_meta[k0 + 2 * slot + 2] = to_i32(ck)?;
        }
        let bytes = crate::tensor::as_bytes(&self.host_meta);
        PinnedStaging::upload(self.staging.as_mut(), &self.device, bytes, &self.meta, 0)?;
        self.generation += 1;
        Ok(Step { workspace: self.id, generation: self.generation, tokens: offset, seqs })
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

    /// The device views of a step's positions and (for `slots` cache slots) sequence offsets.
    fn meta_views(&self, tokens: usize, slots: usize) -> Result<(Tensor, Tensor, Tensor)> {
        let cu = 2 * self.max_slots + 1;
        Ok((
            self.meta.narrow(0, 0, tokens)?,
            self.meta.narrow(0, self.max_tokens, 2 * slots + 1)?,
            self.meta.narrow(0, self.max_tokens + cu, 2 * slots + 1)?,
        ))
    }
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
        if let Some(bad) = step.seqs.iter().find(|q| cache.lens.get(q.slot) != Some(&q.start)) {
            return Err(Error::invalid(
                OP,
                "step",
                bad.slot,
                "the cache changed since begin_step (already committed?)",
            ));
        }
        let (k_cache, v_cache) = cache.layer(cache_layer)?;
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
        let (positions, cu_q, cu_k) = ws.meta_views(t, cache.slots)?;

        // Attention half.
        ops::rms_norm(hidden, &w.input_norm, s.rms_norm_eps, &normed)?;
        snap(&mut probe, "norm", &normed)?;
        linear::linear(&normed, &w.qkv, w.qkv_bias.as_ref(), &qkv)?;
        snap(&mut probe, "qkv", &qkv)?;
        let heads = qkv.reshape(&[t, qh + 2 * kvh, d])?;
        if let Some(rope) = &self.rope {
            // q and k heads are adjacent in the fused buffer: one view rotates (and qk-norms) both.
            rope.apply(&heads.narrow(1, 0, qh + kvh)?, None, &positions)?;
            snap(&mut probe, "rope", &qkv)?;
        }
        append_kv(&heads, k_cache, v_cache, step, cache.max_len, qh, kvh)?;
        let opts = AttentionOptions { mask: s.mask, temperature: s.temperature, scale: None, gqa_pack: None };
        let attn_heads = attn.reshape(&[t, qh, d])?;
        ws.attention.forward_device(
            &heads.narrow(1, 0, qh)?,
            k_cache,
            v_cache,
            &cu_q,
            &cu_k,
            &attn_heads,
            None,
            &opts,
        )?;
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

/// Copies each sequence's new k and v rows from the fused QKV buffer (`[t, q + 2 kv heads, d]`)
/// into its cache slot: two 2D device-to-device copies per sequence, queued, never waiting.
fn append_kv(
    heads: &Tensor,
    k_cache: &Tensor,
    v_cache: &Tensor,
    step: &Step,
    max_len: usize,
    qh: usize,
    kvh: usize,
) -> Result<()> {
    let elem = heads.dtype().size();
    let d = heads.shape()[2];
    let row_src = heads.strides()[0] * elem;
    let width = kvh * d * elem;
    for (first_head, cache) in [(qh, k_cache), (qh + kvh, v_cache)] {
        for s in &step.seqs {
            let src = (heads.offset() + s.offset * heads.strides()[0] + first_head * d) * elem;
            let dst = (cache.offset() + (s.slot * max_len + s.start) * kvh * d) * elem;
            cache.storage().copy_2d(dst, width, heads.storage(), src, row_src, width, s.new)?;
        }
    }
    Ok(())
}
