//! The LoRA training step over a whole model: embedding, the layers' forward keeping their
//! activations, the final norm and the fused LM-head cross-entropy (no full logits), the
//! backward through every layer in reverse, and AdamW on the adapters.

use std::collections::BTreeMap;

use super::batch::Batch;
use super::layer::{Activations, GradScratch, LoraParams, StepCtx, TrainLayer};
use crate::block::proj::upload;
use crate::block::weights::LayerWeights;
use crate::error::{Error, Result};
use crate::formats::peft::{Adapter, LoraPair};
use crate::model::HostModel;
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops;
use llama_kernels::ops::ErrorFlag;
use llama_kernels::ops::attention::AttentionWorkspace;
use llama_kernels::ops::cross_entropy::{CrossEntropyOptions, FusedLinearCrossEntropy, LmHeadGrads};
use llama_kernels::ops::lora::LoraScratch;
use llama_kernels::ops::optimizer::{AdamW, AdamWConfig, Lr, OptimStats, ParamSlot};
use llama_kernels::ops::qlinear::QScratch;
use llama_kernels::spec::weights::HostTensor;
use llama_kernels::tensor::Tensor;

const OP: &str = "LoraTrainer";

/// Adapter gradients as host values: `(layer, projection)` → `(dA, dB)`.
pub type AdapterGrads = BTreeMap<(usize, crate::formats::peft::Projection), (Vec<f64>, Vec<f64>)>;

/// Sizes planned once: the longest micro-batch and its number of sequences, and whether the
/// backward recomputes each layer's forward.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TrainPlan {
    /// Tokens of the longest micro-batch (its sequences packed end to end).
    pub max_tokens: usize,
    /// Sequences in a micro-batch.
    pub max_seqs: usize,
    /// Gradient checkpointing: keep only each layer's input, and run each layer's forward again
    /// just before its backward (one set of activation buffers for all layers, about a third
    /// more compute). The gradients are bit for bit those of the run that keeps everything.
    pub recompute: bool,
}

/// The optimizer and the randomness of a run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TrainConfig {
    /// AdamW's hyper-parameters, clipping and loss scaling.
    pub adamw: AdamWConfig,
    /// Micro-batches per optimizer step: each micro-batch's mean loss is divided by it, as
    /// Hugging Face's Trainer does.
    pub grad_accum: usize,
    /// Keys every dropout mask.
    pub seed: u64,
}

/// A model with a LoRA adapter, ready to train it (see the module docs of [`crate::train`]).
#[derive(Debug)]
pub struct LoraTrainer {
    device: Device,
    dtype: DType,
    plan: TrainPlan,
    config: TrainConfig,
    adapter_config: crate::formats::peft::AdapterConfig,
    layers: Vec<TrainLayer>,
    /// One set per layer, or one shared set when recomputing.
    saved: Vec<Activations>,
    embed: Tensor,
    norm: Tensor,
    eps: f32,
    lm_head: Tensor,
    /// The residual stream: `[max_tokens, hidden]` before each layer and after the last.
    stream: Vec<Tensor>,
    normed: Tensor,
    /// Gradients of the stream: two buffers, taken in turn.
    d_stream: [Tensor; 2],
    grads: GradScratch,
    lora_scratch: LoraScratch,
    attention: AttentionWorkspace,
    qscratch: Option<QScratch>,
    head: FusedLinearCrossEntropy,
    loss: Tensor,
    errors: ErrorFlag,
    ids: Tensor,
    labels: Tensor,
    positions: Tensor,
    cu_seqlens: Tensor,
    optimizer: AdamW,
    micro_step: u64,
    /// Micro-batches since the last optimizer step.
    pending: usize,
    /// The loss scale the next micro-batches' gradients carry (1 without loss scaling).
    loss_scale: f32,
    /// Tokens of the last micro-batch.
    last_tokens: usize,
}

impl LoraTrainer {
    /// Uploads `host` in `dtype` (its projections as stored: dense, or packed NF4 / GGUF
    /// formats) with `adapter`, and plans every buffer for `plan`.
    pub fn new(
        device: &Device,
        host: &HostModel,
        dtype: DType,
        adapter: &Adapter,
        config: TrainConfig,
        plan: TrainPlan,
    ) -> Result<LoraTrainer> {
        host.validate()?;
        if plan.max_tokens == 0 || plan.max_seqs == 0 {
            return Err(Error::invalid(OP, "plan", format!("{plan:?}"), "every size must be > 0"));
        }
        if config.grad_accum == 0 {
            return Err(Error::invalid(OP, "grad_accum", 0, "must be > 0"));
        }
        let t = plan.max_tokens;
        let lora = adapter.config.lora;
        let mut layers = Vec::with_capacity(host.layers.len());
        let mut widest = 0;
        for (spec, w) in &host.layers {
            spec.check()?;
            let weights = LayerWeights::upload(device, dtype, spec, w)?;
            let mut params = BTreeMap::new();
            for &p in &adapter.config.targets {
                let pair = adapter.pair(spec, p)?;
                params.insert(p, LoraParams::upload(device, dtype, &pair.a, &pair.b)?);
            }
            widest = widest.max(spec.hidden).max(spec.q_heads * spec.head_dim).max(spec.intermediate());
            layers.push(TrainLayer::new(device, *spec, weights, lora, params)?);
        }
        let first =
            host.layers.first().map(|(s, _)| *s).ok_or_else(|| Error::invalid(OP, "model", 0, "has no layers"))?;
        let saved = match plan.recompute {
            true => vec![Activations::new(device, dtype, &first, t)?],
            false => layers.iter().map(|l| Activations::new(device, dtype, l.spec(), t)).collect::<Result<Vec<_>>>()?,
        };
        let packed: Vec<_> = layers.iter().flat_map(|l| l.packed_weights()).collect();
        let qscratch = match packed.first() {
            Some(w) => Some(QScratch::new(w.device(), dtype, &packed)?),
            None => None,
        };
        let mut slots = Vec::new();
        for l in &layers {
            for p in l.adapters().values() {
                let (ma, mb) = match &p.master {
                    Some((a, b)) => (Some(a), Some(b)),
                    None => (None, None),
                };
                slots.push(ParamSlot { param: &p.a, grad: &p.da, master: ma });
                slots.push(ParamSlot { param: &p.b, grad: &p.db, master: mb });
            }
        }
        let optimizer = AdamW::new(device, &slots, config.adamw)?;
        let hidden = host.hidden();
        let up = |h: &HostTensor| upload(device, dtype, &h.data, &h.shape);
        let z = |cols: usize| Tensor::zeros(device, dtype, &[t, cols]);
        let chunk = FusedLinearCrossEntropy::chunk_rows_for(host.vocab(), dtype, 64 << 20).min(t);
        Ok(LoraTrainer {
            device: device.clone(),
            dtype,
            plan,
            config,
            adapter_config: adapter.config.clone(),
            saved,
            embed: up(&host.embed)?,
            norm: up(&host.norm)?,
            eps: host.eps,
            lm_head: up(host.lm_head())?,
            stream: (0..=layers.len()).map(|_| z(hidden)).collect::<llama_kernels::Result<Vec<_>>>()?,
            normed: z(hidden)?,
            d_stream: [z(hidden)?, z(hidden)?],
            grads: GradScratch::new(device, dtype, &first, t)?,
            lora_scratch: LoraScratch::new(device, dtype, t, widest, lora.r)?,
            attention: AttentionWorkspace::plan(device, plan.max_seqs)?,
            qscratch,
            head: FusedLinearCrossEntropy::new(device, dtype, host.vocab(), t, chunk)?,
            loss: Tensor::zeros(device, DType::F32, &[1])?,
            errors: ErrorFlag::new(device)?,
            ids: Tensor::zeros(device, DType::I32, &[t])?,
            labels: Tensor::zeros(device, DType::I32, &[t])?,
            positions: Tensor::zeros(device, DType::I32, &[t])?,
            cu_seqlens: Tensor::zeros(device, DType::I32, &[plan.max_seqs + 1])?,
            optimizer,
            micro_step: 0,
            pending: 0,
            loss_scale: config.adamw.loss_scaling.map_or(1.0, |s| s.init_scale),
            last_tokens: 0,
            layers,
        })
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The run dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// One micro-batch: forward, loss, backward; the adapters' gradients are added to those of
    /// the step's earlier micro-batches. The loss stays on the device ([`LoraTrainer::loss`]).
    pub fn micro_step(&mut self, batch: &Batch) -> Result<()> {
        self.run(batch, true)
    }

    /// The loss of `batch` without gradients and without dropout (`model.eval()`); nothing
    /// accumulates.
    pub fn eval(&mut self, batch: &Batch) -> Result<f32> {
        self.run(batch, false)?;
        self.loss()
    }

    fn run(&mut self, batch: &Batch, train: bool) -> Result<()> {
        let t = batch.tokens();
        let seqs = batch.seq_lens.len();
        if t > self.plan.max_tokens || seqs > self.plan.max_seqs {
            return Err(Error::invalid(
                OP,
                "batch",
                format!("{t} tokens in {seqs} sequences"),
                format!("exceeds the plan ({:?})", self.plan),
            ));
        }
        if t == 0 {
            return Err(Error::invalid(OP, "batch", "0 tokens", "a micro-batch needs at least one token"));
        }
        self.ids.narrow(0, 0, t)?.copy_from_slice(&batch.ids)?;
        self.labels.narrow(0, 0, t)?.copy_from_slice(&batch.labels)?;
        self.positions.narrow(0, 0, t)?.copy_from_slice(&batch.positions())?;
        let cu = self.cu_seqlens.narrow(0, 0, seqs + 1)?;
        cu.copy_from_slice(&batch.cu_seqlens())?;
        self.last_tokens = t;
        let rows = |b: &Tensor| b.narrow(0, 0, t);
        ops::embedding(&self.embed, &rows(&self.ids)?, &rows(&self.stream[0])?, &self.errors)?;
        let ctx = StepCtx {
            tokens: t,
            positions: &rows(&self.positions)?,
            cu_seqlens: &cu,
            seed: self.config.seed,
            micro_step: self.micro_step,
            accumulate: self.pending > 0,
            train,
        };
        for (l, layer) in self.layers.iter().enumerate() {
            let (x, out) = (rows(&self.stream[l])?, rows(&self.stream[l + 1])?);
            let saved = &self.saved[l % self.saved.len()];
            layer.forward(&ctx, &mut self.attention, &self.lora_scratch, self.qscratch.as_ref(), saved, &x, &out)?;
        }
        let last = rows(&self.stream[self.layers.len()])?;
        let normed = rows(&self.normed)?;
        ops::rms_norm(&last, &self.norm, self.eps, &normed)?;
        // The gradient carries the loss scale (f16: GradScaler's), which AdamW divides out.
        let grad_scale = self.loss_scale / self.config.grad_accum as f32;
        let options = CrossEntropyOptions { grad_scale, ..CrossEntropyOptions::default() };
        let d = rows(&self.d_stream[0])?;
        let grads = LmHeadGrads { d_hidden: train.then_some(&d), d_weight: None, accumulate_weight: false };
        self.head.forward(&normed, &self.lm_head, &rows(&self.labels)?, &self.loss, grads, &options)?;
        if !train {
            return Ok(());
        }
        // d_stream[0] holds d normed; the final norm's backward takes it to d last.
        let d_last = rows(&self.d_stream[1])?;
        ops::rms_norm_backward(&d, &last, &self.norm, self.eps, &d_last, None, None)?;
        let mut cur = 1;
        for (l, layer) in self.layers.iter().enumerate().rev() {
            let (d_out, d_x) = (rows(&self.d_stream[cur])?, rows(&self.d_stream[1 - cur])?);
            let x = rows(&self.stream[l])?;
            let saved = &self.saved[l % self.saved.len()];
            if self.plan.recompute && l + 1 < self.layers.len() {
                // The shared buffers hold the last layer's activations: this layer's forward again
                // (the same kernels on the same input and masks: the same bits; its output,
                // rewritten, is the next layer's kept input).
                let out = rows(&self.stream[l + 1])?;
                layer.forward(
                    &ctx,
                    &mut self.attention,
                    &self.lora_scratch,
                    self.qscratch.as_ref(),
                    saved,
                    &x,
                    &out,
                )?;
            }
            layer.backward(
                &ctx,
                &mut self.attention,
                &self.lora_scratch,
                self.qscratch.as_ref(),
                saved,
                &self.grads,
                &x,
                &d_out,
                &d_x,
            )?;
            cur = 1 - cur;
        }
        self.micro_step += 1;
        self.pending += 1;
        Ok(())
    }

    /// The last micro-batch's loss (mean over its labelled tokens, before the `1 / grad_accum`
    /// scaling of its gradient); waits for the device. Without loss scaling (bf16, f32), a loss
    /// that is not finite is an error naming the first layer whose output overflowed; with it
    /// (f16), the non-finite loss is returned and the step that follows is skipped.
    pub fn loss(&self) -> Result<f32> {
        self.errors.check("embedding")?;
        self.head.check_labels()?;
        let loss = self.loss.to_f64_vec()?.first().copied().unwrap_or(f64::NAN) as f32;
        if loss.is_finite() || self.config.adamw.loss_scaling.is_some() {
            return Ok(loss);
        }
        let t = self.last_tokens;
        for (l, out) in self.stream.iter().enumerate().skip(1) {
            if out.narrow(0, 0, t)?.to_f64_vec()?.iter().any(|v| !v.is_finite()) {
                return Err(Error::invalid(
                    OP,
                    "loss",
                    loss,
                    format!(
                        "is not finite: the activations overflowed in layer {} (its output holds inf or NaN)",
                        l - 1
                    ),
                ));
            }
        }
        Err(Error::invalid(
            OP,
            "loss",
            loss,
            "is not finite: every layer's output is finite, so the LM head or the loss overflowed",
        ))
    }

    /// The loss scale the next micro-batches' gradients carry.
    pub fn loss_scale(&self) -> f32 {
        self.loss_scale
    }

    /// AdamW on the adapters with the gradients summed since the last step, at learning rate
    /// `lr`; returns what the step found (waits for the device).
    pub fn step(&mut self, lr: f32) -> Result<OptimStats> {
        if self.pending == 0 {
            return Err(Error::invalid(OP, "step", "no micro-batch", "run micro_step first"));
        }
        self.optimizer.step(Lr::Host(lr))?;
        self.pending = 0;
        let stats = self.optimizer.stats()?;
        self.loss_scale = stats.loss_scale;
        Ok(stats)
    }

    /// The adapter as it stands (its f32 masters when the run is 16-bit), ready to save.
    pub fn adapter(&self) -> Result<Adapter> {
        let mut weights = BTreeMap::new();
        for l in &self.layers {
            for (&p, params) in l.adapters() {
                let [a, b] = params.values()?;
                let pair =
                    LoraPair { a: HostTensor::new(params.a.shape(), a)?, b: HostTensor::new(params.b.shape(), b)? };
                weights.insert((l.spec().index, p), pair);
            }
        }
        Ok(Adapter { config: self.adapter_config.clone(), weights })
    }

    /// The gradients of the adapters summed since the last step (f32 host values), by layer and
    /// projection: `(dA, dB)`.
    pub fn gradients(&self) -> Result<AdapterGrads> {
        let mut out = BTreeMap::new();
        for l in &self.layers {
            for (&p, params) in l.adapters() {
                out.insert((l.spec().index, p), (params.da.to_f64_vec()?, params.db.to_f64_vec()?));
            }
        }
        Ok(out)
    }
}
