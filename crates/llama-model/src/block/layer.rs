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
//! Every stage is one op of this crate: matrix products are [`ops::linear`](mod@llama_kernels::ops::linear)
//! (cuBLAS / the CPU GEMM), the rest are the hand-written kernels. The residual add after the
//! feed-forward is fused into the down projection (cuBLAS `beta = 1`: one rounding of the sum).
//!
//! **Planning.** [`KvCache::new`] (or [`KvCache::with_config`]) allocates the cache;
//! [`LayerWorkspace::plan`] allocates every buffer for `max_tokens` tokens over that cache
//! (activations, the step metadata, the attention and decode workspaces, the MoE workspace when
//! a layer is MoE, the pinned staging buffer, the cuBLAS handle). After that, a step
//! ([`LayerWorkspace::begin_step`] + one [`DecoderLayer::forward`] per layer) allocates nothing
//! and does not wait on the host. `begin_step` makes one asynchronous upload from pinned memory
//! (positions, sequence offsets, sequence lengths, the block table and the slot mapping, for
//! every layer of the step); it waits only if the device is more than four steps behind (the
//! staging ring is full). The one exception is the first call with a bias on a stream that
//! `LayerWorkspace::plan` did not plan (see `ops::linear::plan`).
//!
//! **KV cache.** The cache is paged ([`llama_kernels::ops::attention`]): per layer, K and V pools of
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

use super::weights::{FfnWeights, HostLayerWeights, LayerWeights};
use crate::error::{Error, Result};
use crate::formats::config::{FfnSpec, LayerSpec};
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops;
use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, AttentionTensors, DecodeTensors, KvTensors};
use llama_kernels::ops::attention::{Offsets, PagedDecodeOptions, PagedKvCache};
use llama_kernels::ops::lora::{LoraAdapter, LoraConfig, LoraScratch, lora_forward};
use llama_kernels::ops::moe::MoeWorkspace;
use llama_kernels::ops::qlinear::QScratch;
use llama_kernels::ops::rope::Rope;
use llama_kernels::ops::swiglu::GateUp;
use llama_kernels::tensor::Tensor;
use std::collections::BTreeMap;

use crate::formats::peft::{Adapter, Projection};

use super::kv_cache::KvCache;
use super::step::Step;
use super::workspace::{LayerWorkspace, StepMeta, moe_config};

const OP: &str = "DecoderLayer::forward";

/// The intermediates of one traced forward ([`DecoderLayer::forward_traced`]), as f64 values in
/// row-major order, by stage name.
#[derive(Debug, Default)]
pub struct Trace {
    /// Each stage's name and output, in the order the forward ran them.
    pub stages: Vec<(&'static str, Vec<f64>)>,
}

impl Trace {
    /// The output of `stage`, or `None` when the forward had no such stage.
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

impl Probe<'_> {
    /// After `stage`, which wrote `tensor`.
    fn snap(&mut self, stage: &'static str, tensor: &Tensor) -> Result<()> {
        match self {
            Probe::None => Ok(()),
            Probe::Trace(tr) => {
                tr.stages.push((stage, tensor.to_f64_vec()?));
                Ok(())
            }
            Probe::Mark(mark) => mark(stage),
        }
    }
}

/// One decoder layer on a device.
#[derive(Debug)]
pub struct DecoderLayer {
    spec: LayerSpec,
    dtype: DType,
    weights: LayerWeights,
    rope: Option<Rope>,
    adapter: Option<LayerAdapter>,
}

/// A LoRA adapter attached to a layer for inference, unmerged: the base weights stay as loaded
/// (packed ones stay packed) and each adapted projection adds `alpha/r · x Aᵀ Bᵀ` (no dropout).
#[derive(Debug)]
struct LayerAdapter {
    cfg: LoraConfig,
    /// `A` `[r, in]` and `B` `[out, r]` in the run dtype, by projection.
    weights: BTreeMap<Projection, (Tensor, Tensor)>,
}

impl DecoderLayer {
    /// Uploads `host` (checked against `spec`) in `dtype`.
    pub fn new(device: &Device, dtype: DType, spec: LayerSpec, host: &HostLayerWeights) -> Result<DecoderLayer> {
        spec.check()?;
        let weights = LayerWeights::upload(device, dtype, &spec, host)?;
        let rope = spec.rope.map(|cfg| Rope::new(device, cfg)).transpose()?;
        Ok(DecoderLayer { spec, dtype, weights, rope, adapter: None })
    }

    /// Attaches this layer's part of `adapter` (replacing any attached before); the workspace
    /// needs [`LayerWorkspace::plan_lora`] before the next forward.
    pub fn attach_adapter(&mut self, device: &Device, adapter: &Adapter) -> Result<()> {
        let cfg = LoraConfig { dropout: 0.0, ..adapter.config.lora };
        let mut weights = BTreeMap::new();
        for &p in &adapter.config.targets {
            let pair = adapter.pair(&self.spec, p)?;
            let up = |t: &super::HostTensor| {
                let data: Vec<f32> =
                    t.data.iter().map(|&v| llama_kernels::dtype::round_to(self.dtype, f64::from(v)) as f32).collect();
                super::proj::upload(device, self.dtype, &data, &t.shape)
            };
            weights.insert(p, (up(&pair.a)?, up(&pair.b)?));
        }
        self.adapter = Some(LayerAdapter { cfg, weights });
        Ok(())
    }

    /// Removes the attached adapter, if any.
    pub fn detach_adapter(&mut self) {
        self.adapter = None;
    }

    /// `y[:, columns of p] += lora_p(x)` when an attached adapter adapts `p`.
    fn lora(&self, ws: &LayerWorkspace, p: Projection, x: &Tensor, y: &Tensor) -> Result<()> {
        let Some(adapter) = &self.adapter else { return Ok(()) };
        let Some((a, b)) = adapter.weights.get(&p) else { return Ok(()) };
        let scratch = ws.lora.as_ref().ok_or_else(|| {
            Error::invalid(
                OP,
                "workspace",
                ws.id,
                "has no LoRA scratch (LayerWorkspace::plan_lora after attaching an adapter)",
            )
        })?;
        let (first, n) = p.columns(&self.spec);
        let call = LoraAdapter { cfg: adapter.cfg, a, b, seed: 0, stream: 0 };
        Ok(lora_forward(&call, x, &y.narrow(1, first, n)?, scratch)?)
    }

    /// Layer `index` of a checkpoint, converted to `dtype`.
    pub fn load(
        device: &Device,
        checkpoint: &crate::formats::Checkpoint,
        index: usize,
        dtype: DType,
    ) -> Result<DecoderLayer> {
        let (spec, host) = checkpoint.layer(index, dtype)?;
        Self::new(device, dtype, spec, &host)
    }

    /// What the layer is: heads, RoPE or NoPE, mask, feed-forward.
    pub fn spec(&self) -> &LayerSpec {
        &self.spec
    }
    /// The run dtype of its weights and activations.
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// Its weights on the device.
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
        ws.check_step(step)?;
        self.check_call(ws, cache, cache_layer, step, hidden)?;
        let pool = cache.layer(cache_layer)?;
        let meta = ws.meta_views(step)?;
        let normed = self.attention_half(ws, pool, &meta, step, hidden, &mut probe)?;
        self.ffn_half(ws, &normed, hidden, &mut probe)
    }

    /// Checks that the workspace, the cache and `hidden` fit this layer and the step.
    fn check_call(
        &self,
        ws: &LayerWorkspace,
        cache: &KvCache,
        cache_layer: usize,
        step: &Step,
        hidden: &Tensor,
    ) -> Result<()> {
        let s = &self.spec;
        let t = step.tokens;
        if hidden.dtype() != self.dtype {
            return Err(Error::from(llama_kernels::Error::DTypeMismatch {
                op: OP,
                what: "hidden",
                got: hidden.dtype(),
                expected: self.dtype,
            }));
        }
        for (what, dtype) in [("workspace", ws.dtype), ("cache", cache.dtype)] {
            if dtype != self.dtype {
                return Err(Error::from(llama_kernels::Error::DTypeMismatch {
                    op: OP,
                    what,
                    got: dtype,
                    expected: self.dtype,
                }));
            }
        }
        if hidden.shape() != [t, s.hidden] || !hidden.is_contiguous() {
            return Err(Error::shape(
                OP,
                "hidden",
                hidden.shape().to_vec(),
                format!("contiguous [{t}, {}] (the step's tokens x hidden)", s.hidden),
            ));
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
        Ok(())
    }

    /// norm -> qkv -> rope -> append k, v -> attention -> o_proj -> fused residual add + norm.
    /// Returns the normed hidden states the feed-forward reads.
    fn attention_half(
        &self,
        ws: &mut LayerWorkspace,
        pool: &PagedKvCache,
        meta: &StepMeta,
        step: &Step,
        hidden: &Tensor,
        probe: &mut Probe<'_>,
    ) -> Result<Tensor> {
        let (s, w, t) = (&self.spec, &self.weights, step.tokens);
        let (d, qh, kvh) = (s.head_dim, s.q_heads, s.kv_heads);
        let normed = ws.normed.narrow(0, 0, t)?;
        let qkv = ws.qkv.narrow(0, 0, t)?;
        let attn = ws.attn.narrow(0, 0, t)?;
        let proj = ws.proj.narrow(0, 0, t)?;
        ops::rms_norm(hidden, &w.input_norm, s.rms_norm_eps, &normed)?;
        probe.snap("norm", &normed)?;
        w.qkv.forward(&normed, w.qkv_bias.as_ref(), &qkv, false, ws.qscratch.as_ref())?;
        for p in [Projection::Q, Projection::K, Projection::V] {
            self.lora(ws, p, &normed, &qkv)?;
        }
        probe.snap("qkv", &qkv)?;
        let heads = qkv.reshape(&[t, qh + 2 * kvh, d])?;
        if let Some(rope) = &self.rope {
            // q and k heads are adjacent in the fused buffer: one view rotates (and qk-norms) both.
            rope.apply(&heads.narrow(1, 0, qh + kvh)?, None, &meta.positions)?;
            probe.snap("rope", &qkv)?;
        }
        // The new k and v go straight from the fused buffer to their pages (strided views).
        pool.append(&heads.narrow(1, qh, kvh)?, &heads.narrow(1, qh + kvh, kvh)?, &meta.slot_mapping)?;
        let attn_heads = attn.reshape(&[t, qh, d])?;
        self.attend(ws, pool, meta, step.decode, &heads.narrow(1, 0, qh)?, &attn_heads)?;
        probe.snap("attention", &attn)?;
        w.o.forward(&attn, w.o_bias.as_ref(), &proj, false, ws.qscratch.as_ref())?;
        self.lora(ws, Projection::O, &attn, &proj)?;
        probe.snap("o_proj", &proj)?;
        ops::fused_add_rms_norm(&proj, hidden, &w.post_norm, s.rms_norm_eps, &normed)?;
        probe.snap("residual", hidden)?;
        probe.snap("post_norm", &normed)?;
        Ok(normed)
    }

    /// Attention of `q` over the pages: split-KV decode when every sequence has one new token,
    /// else varlen prefill over the paged K/V with device-resident offsets.
    fn attend(
        &self,
        ws: &mut LayerWorkspace,
        pool: &PagedKvCache,
        meta: &StepMeta,
        decode: bool,
        q: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let s = &self.spec;
        if decode {
            let chunk_size = match s.mask {
                AttentionMask::ChunkedCausal { chunk_size } => Some(chunk_size),
                AttentionMask::Causal | AttentionMask::None => None,
            };
            let opts = PagedDecodeOptions { scale: None, chunk_size, temperature: s.temperature };
            let call = DecodeTensors {
                q,
                cache: pool,
                block_table: &meta.block_table,
                seq_lens: &meta.seq_lens,
                out,
                lse: None,
            };
            return Ok(ws.decode.forward(call, &opts)?);
        }
        // Prefill, chunked prefill after a cached prefix, and mixed steps: the cached prefix and
        // the new tokens alike are read from the pages.
        let opts = AttentionOptions { mask: s.mask, temperature: s.temperature, scale: None, gqa_pack: None };
        let kv = KvTensors::Paged { cache: pool, block_table: &meta.block_table };
        let cu_seqlens = Offsets::Device { q: &meta.cu_q, k: &meta.cu_k };
        Ok(ws.attention.forward(AttentionTensors { q, kv, cu_seqlens, out, lse: None }, &opts)?)
    }

    /// The feed-forward half; the residual add is fused into the down projection (dense) or
    /// the combine (MoE).
    fn ffn_half(&self, ws: &mut LayerWorkspace, normed: &Tensor, hidden: &Tensor, probe: &mut Probe<'_>) -> Result<()> {
        let (s, w, t) = (&self.spec, &self.weights, normed.shape()[0]);
        match (&w.ffn, s.ffn) {
            (FfnWeights::Dense { gate_up, gate_up_bias, down, down_bias }, FfnSpec::Dense { intermediate: i, .. }) => {
                let gu = ws.gate_up.narrow(0, 0, t)?.narrow(1, 0, 2 * i)?;
                gate_up.forward(normed, gate_up_bias.as_ref(), &gu, false, ws.qscratch.as_ref())?;
                self.lora(ws, Projection::Gate, normed, &gu)?;
                self.lora(ws, Projection::Up, normed, &gu)?;
                probe.snap("gate_up", &gu)?;
                let act = gu.narrow(1, 0, i)?;
                ops::swiglu(GateUp::GateThenUp(&gu), &act)?;
                probe.snap("swiglu", &act)?;
                down.forward(&act, down_bias.as_ref(), hidden, true, ws.qscratch.as_ref())?;
                self.lora(ws, Projection::Down, &act, hidden)?;
                probe.snap("output", hidden)?;
                Ok(())
            }
            (FfnWeights::Moe(weights), FfnSpec::Moe { .. }) => {
                // (Checked above: the workspace was planned for this MoE.)
                let moe = ws.moe.as_mut().ok_or_else(|| {
                    Error::invalid(OP, "workspace", s.index, "was planned without MoE layers (LayerWorkspace::plan)")
                })?;
                // hidden += moe(normed): combine adds the routed experts and the shared expert to
                // the residual in place.
                moe.forward(weights, normed, Some(hidden), hidden)?;
                if let Probe::Trace(tr) = probe {
                    let st = moe.stages()?;
                    tr.stages.push(("router", st.logits.to_f64_vec()?));
                    tr.stages.push(("routing", st.ids.to_f64_vec()?));
                    tr.stages.push(("route_weights", st.weights.to_f64_vec()?));
                    if let Some(shared) = &st.shared {
                        tr.stages.push(("shared", shared.to_f64_vec()?));
                    }
                }
                probe.snap("output", hidden)?;
                Ok(())
            }
            _ => Err(Error::invalid(OP, "weights", s.index, "feed-forward weights do not match the spec")),
        }
    }
}

// Planned here rather than in workspace.rs: it reads the layers' weights, and the workspace
// module stays below the layer.
impl LayerWorkspace {
    /// Sizes the scratch of LoRA branches of rank up to `r` for layers like `layers` (after
    /// [`DecoderLayer::attach_adapter`]).
    pub fn plan_lora(&mut self, device: &Device, layers: &[&DecoderLayer], r: usize) -> Result<()> {
        let widest = layers
            .iter()
            .map(|l| l.spec.hidden.max(l.spec.q_heads * l.spec.head_dim).max(l.spec.intermediate()))
            .max()
            .unwrap_or(0);
        self.lora = Some(LoraScratch::new(device, self.dtype, self.max_tokens, widest, r)?);
        Ok(())
    }

    /// Sizes the scratch that the packed projections of `layers` need for steps of more than
    /// [`MAX_GEMV_ROWS`](llama_kernels::ops::qlinear::MAX_GEMV_ROWS) tokens (a no-op when none is
    /// packed). A layer with packed weights fails such a step with a named error until this ran.
    pub fn plan_packed(&mut self, layers: &[&DecoderLayer]) -> Result<()> {
        let w = layers.iter().flat_map(|l| l.weights().packed_weights()).collect::<Vec<_>>();
        if let Some(first) = w.first() {
            self.qscratch = Some(QScratch::new(first.device(), self.dtype, &w)?);
        }
        Ok(())
    }
}
