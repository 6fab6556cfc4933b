//! One decoder layer for training: a forward that keeps what its backward reads, and the
//! backward through it in reverse, with LoRA adapters on any of its seven projections.
//!
//! ```text
//! forward (saved: n1, qkv after RoPE, attn, lse, h1, n2, gate|up, act)
//!   n1 = norm(x)      qkv = n1 Wqkvᵀ + lora q|k|v      rope(q, k)      attn, lse = attention(q, k, v)
//!   h1 = x + attn Woᵀ + lora o      n2 = norm(h1)      gu = n2 Wguᵀ + lora gate|up
//!   act = swiglu(gu)                out = h1 + act Wdownᵀ + lora down
//! backward (d_out -> d_x; adapter gradients added to their f32 buffers)
//!   d_act = d_out Wdown (+ lora)    d_gu = swiglu'(d_act)       d_n2 = d_gu Wgu (+ lora gate, up)
//!   d_h1 = norm'(d_n2) + d_out      d_attn = d_h1 Wo (+ lora)   dq, dk, dv = attention'(d_attn)
//!   rope'(dq, dk)                   d_n1 = d_qkv Wqkv (+ lora)  d_x = norm'(d_n1) + d_h1
//! ```
//!
//! The base weights are frozen: their input gradients come from the dense weight (cuBLAS) or the
//! packed one (`qlinear_backward_input`, from the packed bytes), and no base weight gradient is
//! formed. The norms' weights are frozen too. Each adapter's dropout mask is keyed by the run's
//! seed and a stream unique to (micro-step, layer, projection), so the backward regenerates the
//! forward's mask.

use std::collections::BTreeMap;

use crate::block::proj::Proj;
use crate::block::weights::{FfnWeights, LayerWeights};
use crate::error::{Error, Result};
use crate::formats::config::{FfnSpec, LayerSpec};
use crate::formats::peft::Projection;
use llama_kernels::backend::Device;
use llama_kernels::dtype::DType;
use llama_kernels::ops;
use llama_kernels::ops::attention::{
    AttentionBackwardTensors, AttentionOptions, AttentionTensors, AttentionWorkspace, KvTensors, Offsets,
};
use llama_kernels::ops::lora::{LoraAdapter, LoraConfig, LoraGrads, LoraScratch, lora_backward, lora_forward};
use llama_kernels::ops::qlinear::QScratch;
use llama_kernels::ops::rope::Rope;
use llama_kernels::ops::swiglu::GateUp;
use llama_kernels::tensor::Tensor;

const OP: &str = "TrainLayer";

/// One adapter's tensors on the device.
#[derive(Debug)]
pub struct LoraParams {
    /// `[r, in]` in the run dtype.
    pub a: Tensor,
    /// `[out, r]` in the run dtype.
    pub b: Tensor,
    /// `[r, in]` f32: the gradient, summed over a step's micro-batches.
    pub da: Tensor,
    /// `[out, r]` f32.
    pub db: Tensor,
    /// f32 masters of `a` and `b` when the run dtype is 16-bit (the optimizer updates them and
    /// rounds into `a` and `b`).
    pub master: Option<(Tensor, Tensor)>,
}

impl LoraParams {
    /// Uploads `a` and `b` (f32 host values) for a `dtype` run.
    pub fn upload(
        device: &Device,
        dtype: DType,
        a: &crate::block::HostTensor,
        b: &crate::block::HostTensor,
    ) -> Result<LoraParams> {
        let up = |t: &crate::block::HostTensor, dt: DType| crate::block::proj::upload(device, dt, &t.data, &t.shape);
        let master = if dtype == DType::F32 { None } else { Some((up(a, DType::F32)?, up(b, DType::F32)?)) };
        let round = |t: &crate::block::HostTensor| {
            let data: Vec<f32> =
                t.data.iter().map(|&v| llama_kernels::dtype::round_to(dtype, f64::from(v)) as f32).collect();
            crate::block::proj::upload(device, dtype, &data, &t.shape)
        };
        Ok(LoraParams {
            a: round(a)?,
            b: round(b)?,
            da: Tensor::zeros(device, DType::F32, &a.shape)?,
            db: Tensor::zeros(device, DType::F32, &b.shape)?,
            master,
        })
    }

    /// The values the optimizer keeps (the masters when there are), as f32 host values.
    pub fn values(&self) -> Result<[Vec<f32>; 2]> {
        let (a, b) = match &self.master {
            Some((a, b)) => (a, b),
            None => (&self.a, &self.b),
        };
        let host = |t: &Tensor| -> Result<Vec<f32>> { Ok(t.to_f64_vec()?.into_iter().map(|v| v as f32).collect()) };
        Ok([host(a)?, host(b)?])
    }
}

/// What a layer's backward reads, for up to `max_tokens` tokens: one set per layer, or one set
/// that every layer shares when the backward recomputes each layer's forward first (gradient
/// checkpointing).
#[derive(Debug)]
pub struct Activations {
    n1: Tensor,
    qkv: Tensor,
    attn: Tensor,
    /// `[q_heads * max_tokens]` f32: a step's `[q_heads, tokens]` log-sum-exp from its start.
    lse: Tensor,
    h1: Tensor,
    n2: Tensor,
    gu: Tensor,
    act: Tensor,
}

impl Activations {
    /// Buffers for a layer like `spec` and up to `max_tokens` tokens.
    pub fn new(device: &Device, dtype: DType, spec: &LayerSpec, max_tokens: usize) -> Result<Activations> {
        let z = |cols: usize| Tensor::zeros(device, dtype, &[max_tokens, cols]);
        let i = spec.intermediate();
        Ok(Activations {
            n1: z(spec.hidden)?,
            qkv: z(spec.qkv_dim())?,
            attn: z(spec.q_heads * spec.head_dim)?,
            lse: Tensor::zeros(device, DType::F32, &[spec.q_heads * max_tokens])?,
            h1: z(spec.hidden)?,
            n2: z(spec.hidden)?,
            gu: z(2 * i)?,
            act: z(i)?,
        })
    }
}

/// Gradient buffers every layer's backward shares (layers run one at a time).
#[derive(Debug)]
pub struct GradScratch {
    d_act: Tensor,
    d_gu: Tensor,
    d_n: Tensor,
    d_h1: Tensor,
    d_attn: Tensor,
    d_qkv: Tensor,
}

impl GradScratch {
    /// Buffers for layers as wide as `spec`'s, up to `max_tokens`.
    pub fn new(device: &Device, dtype: DType, spec: &LayerSpec, max_tokens: usize) -> Result<GradScratch> {
        let z = |cols: usize| Tensor::zeros(device, dtype, &[max_tokens, cols]);
        let i = spec.intermediate();
        Ok(GradScratch {
            d_act: z(i)?,
            d_gu: z(2 * i)?,
            d_n: z(spec.hidden)?,
            d_h1: z(spec.hidden)?,
            d_attn: z(spec.q_heads * spec.head_dim)?,
            d_qkv: z(spec.qkv_dim())?,
        })
    }
}

/// What one micro-step shares across layers.
#[derive(Debug)]
pub struct StepCtx<'a> {
    /// Tokens in the micro-batch.
    pub tokens: usize,
    /// `[tokens]` i32: each token's position in its sequence.
    pub positions: &'a Tensor,
    /// `[sequences + 1]` i32: the sequences' offsets.
    pub cu_seqlens: &'a Tensor,
    /// The run's seed (dropout masks).
    pub seed: u64,
    /// This micro-step's index in the run (dropout streams).
    pub micro_step: u64,
    /// Gradients are added to the adapters' buffers (not the micro-batch of a step).
    pub accumulate: bool,
    /// Training (dropout on); `false` evaluates (`model.eval()`: no dropout).
    pub train: bool,
}

/// A decoder layer being trained (see the module docs).
#[derive(Debug)]
pub struct TrainLayer {
    spec: LayerSpec,
    weights: LayerWeights,
    rope: Option<Rope>,
    lora: LoraConfig,
    adapters: BTreeMap<Projection, LoraParams>,
}

impl TrainLayer {
    /// A layer of `weights` (dense feed-forward, no qk-norm) with `adapters`.
    pub fn new(
        device: &Device,
        spec: LayerSpec,
        weights: LayerWeights,
        lora: LoraConfig,
        adapters: BTreeMap<Projection, LoraParams>,
    ) -> Result<TrainLayer> {
        if matches!(spec.ffn, FfnSpec::Moe { .. }) {
            return Err(Error::Unsupported {
                what: format!("training MoE layer {} (dense feed-forwards only)", spec.index),
            });
        }
        if spec.rope.is_some_and(|r| r.qk_norm_eps.is_some()) || spec.temperature.is_some() {
            return Err(Error::Unsupported {
                what: format!("training layer {} with a qk-norm or attention temperature (Llama 4)", spec.index),
            });
        }
        let rope = spec.rope.map(|cfg| Rope::new(device, cfg)).transpose()?;
        Ok(TrainLayer { spec, weights, rope, lora, adapters })
    }

    /// The layer's spec.
    pub fn spec(&self) -> &LayerSpec {
        &self.spec
    }

    /// The layer's packed base weights (none when dense).
    pub fn packed_weights(&self) -> Vec<&llama_kernels::ops::qlinear::QWeight> {
        self.weights.packed_weights()
    }

    /// The adapters, by projection.
    pub fn adapters(&self) -> &BTreeMap<Projection, LoraParams> {
        &self.adapters
    }

    fn adapter<'a>(&'a self, p: Projection, params: &'a LoraParams, ctx: &StepCtx<'_>) -> LoraAdapter<'a> {
        let stream = (ctx.micro_step * 4096 + self.spec.index as u64) * 8 + p as u64;
        let cfg = if ctx.train { self.lora } else { LoraConfig { dropout: 0.0, ..self.lora } };
        LoraAdapter { cfg, a: &params.a, b: &params.b, seed: ctx.seed, stream }
    }

    /// `y[:, cols of p] += lora_p(x)` when `p` is adapted.
    fn lora_fwd(&self, p: Projection, x: &Tensor, y: &Tensor, ctx: &StepCtx<'_>, ls: &LoraScratch) -> Result<()> {
        if let Some(params) = self.adapters.get(&p) {
            let (c0, n) = p.columns(&self.spec);
            lora_forward(&self.adapter(p, params, ctx), x, &y.narrow(1, c0, n)?, ls)?;
        }
        Ok(())
    }

    /// The adapter gradients of `p` and its share of `dx`.
    fn lora_bwd(
        &self,
        p: Projection,
        x: &Tensor,
        dy: &Tensor,
        dx: &Tensor,
        ctx: &StepCtx<'_>,
        ls: &LoraScratch,
    ) -> Result<()> {
        if let Some(params) = self.adapters.get(&p) {
            let (c0, n) = p.columns(&self.spec);
            let grads = LoraGrads { da: &params.da, db: &params.db, accumulate: ctx.accumulate };
            lora_backward(&self.adapter(p, params, ctx), x, &dy.narrow(1, c0, n)?, &grads, Some(dx), ls)?;
        }
        Ok(())
    }

    fn dense_ffn(&self) -> Result<(&Proj, &Proj)> {
        match &self.weights.ffn {
            FfnWeights::Dense { gate_up, gate_up_bias: _, down, down_bias: _ } => Ok((gate_up, down)),
            FfnWeights::Moe(_) => Err(Error::invalid(OP, "weights", self.spec.index, "an MoE feed-forward")),
        }
    }

    /// The attention call's options and offsets (the forward's and the backward's).
    fn attention_setup<'a>(&self, ctx: &'a StepCtx<'_>) -> (AttentionOptions, Offsets<'a>) {
        let opts = AttentionOptions { mask: self.spec.mask, temperature: None, scale: None, gqa_pack: None };
        (opts, Offsets::Device { q: ctx.cu_seqlens, k: ctx.cu_seqlens })
    }

    fn lse(&self, saved: &Activations, t: usize) -> Result<Tensor> {
        Ok(saved.lse.narrow(0, 0, self.spec.q_heads * t)?.reshape(&[self.spec.q_heads, t])?)
    }

    /// The forward of `x` `[tokens, hidden]` into `out` (another buffer), keeping what the
    /// backward reads in `saved`.
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        ctx: &StepCtx<'_>,
        attention: &mut AttentionWorkspace,
        ls: &LoraScratch,
        qs: Option<&QScratch>,
        saved: &Activations,
        x: &Tensor,
        out: &Tensor,
    ) -> Result<()> {
        let (s, w, t) = (&self.spec, &self.weights, ctx.tokens);
        let (d, qh, kvh, eps) = (s.head_dim, s.q_heads, s.kv_heads, s.rms_norm_eps);
        let rows = |b: &Tensor| b.narrow(0, 0, t);
        let (n1, qkv, attn, h1) = (rows(&saved.n1)?, rows(&saved.qkv)?, rows(&saved.attn)?, rows(&saved.h1)?);
        ops::rms_norm(x, &w.input_norm, eps, &n1)?;
        w.qkv.forward(&n1, w.qkv_bias.as_ref(), &qkv, false, qs)?;
        for p in [Projection::Q, Projection::K, Projection::V] {
            self.lora_fwd(p, &n1, &qkv, ctx, ls)?;
        }
        let heads = qkv.reshape(&[t, qh + 2 * kvh, d])?;
        if let Some(rope) = &self.rope {
            rope.apply(&heads.narrow(1, 0, qh + kvh)?, None, ctx.positions)?;
        }
        let (opts, cu) = self.attention_setup(ctx);
        let kv = KvTensors::Contiguous { k: &heads.narrow(1, qh, kvh)?, v: &heads.narrow(1, qh + kvh, kvh)? };
        let (q, o, lse) = (heads.narrow(1, 0, qh)?, attn.reshape(&[t, qh, d])?, self.lse(saved, t)?);
        attention.forward(AttentionTensors { q: &q, kv, cu_seqlens: cu, out: &o, lse: Some(&lse) }, &opts)?;
        h1.copy_from(x)?;
        w.o.forward(&attn, w.o_bias.as_ref(), &h1, true, qs)?;
        self.lora_fwd(Projection::O, &attn, &h1, ctx, ls)?;
        let (gate_up, down) = self.dense_ffn()?;
        let (n2, gu, act) = (rows(&saved.n2)?, rows(&saved.gu)?, rows(&saved.act)?);
        ops::rms_norm(&h1, &w.post_norm, eps, &n2)?;
        let gu_bias = match &w.ffn {
            FfnWeights::Dense { gate_up_bias, .. } => gate_up_bias.as_ref(),
            FfnWeights::Moe(_) => None,
        };
        gate_up.forward(&n2, gu_bias, &gu, false, qs)?;
        self.lora_fwd(Projection::Gate, &n2, &gu, ctx, ls)?;
        self.lora_fwd(Projection::Up, &n2, &gu, ctx, ls)?;
        ops::swiglu(GateUp::GateThenUp(&gu), &act)?;
        out.copy_from(&h1)?;
        let down_bias = match &w.ffn {
            FfnWeights::Dense { down_bias, .. } => down_bias.as_ref(),
            FfnWeights::Moe(_) => None,
        };
        down.forward(&act, down_bias, out, true, qs)?;
        self.lora_fwd(Projection::Down, &act, out, ctx, ls)
    }

    /// The backward: from `d_out` (the gradient of the forward's `out`), the forward's `x` and
    /// what it kept in `saved`, writes `d_x` (another buffer) and adds the adapters' gradients.
    #[allow(clippy::too_many_arguments)]
    pub fn backward(
        &self,
        ctx: &StepCtx<'_>,
        attention: &mut AttentionWorkspace,
        ls: &LoraScratch,
        qs: Option<&QScratch>,
        saved: &Activations,
        g: &GradScratch,
        x: &Tensor,
        d_out: &Tensor,
        d_x: &Tensor,
    ) -> Result<()> {
        let (s, w, t) = (&self.spec, &self.weights, ctx.tokens);
        let (d, qh, kvh, eps) = (s.head_dim, s.q_heads, s.kv_heads, s.rms_norm_eps);
        let i = s.intermediate();
        let rows = |b: &Tensor| b.narrow(0, 0, t);
        let (gate_up, down) = self.dense_ffn()?;
        let sv = saved;
        // The feed-forward half.
        let (act, gu, n2, h1) = (rows(&sv.act)?, rows(&sv.gu)?, rows(&sv.n2)?, rows(&sv.h1)?);
        let (d_act, d_gu, d_n, d_h1) =
            (rows(&g.d_act)?.narrow(1, 0, i)?, rows(&g.d_gu)?.narrow(1, 0, 2 * i)?, rows(&g.d_n)?, rows(&g.d_h1)?);
        down.backward_input(d_out, &d_act, false, qs)?;
        self.lora_bwd(Projection::Down, &act, d_out, &d_act, ctx, ls)?;
        ops::swiglu_backward(&d_act, GateUp::GateThenUp(&gu), GateUp::GateThenUp(&d_gu))?;
        gate_up.backward_input(&d_gu, &d_n, false, qs)?;
        self.lora_bwd(Projection::Gate, &n2, &d_gu, &d_n, ctx, ls)?;
        self.lora_bwd(Projection::Up, &n2, &d_gu, &d_n, ctx, ls)?;
        ops::rms_norm_backward(&d_n, &h1, &w.post_norm, eps, &d_h1, Some(d_out), None)?;
        // The attention half.
        let (attn, qkv, n1) = (rows(&sv.attn)?, rows(&sv.qkv)?, rows(&sv.n1)?);
        let (d_attn, d_qkv) = (rows(&g.d_attn)?, rows(&g.d_qkv)?);
        w.o.backward_input(&d_h1, &d_attn, false, qs)?;
        self.lora_bwd(Projection::O, &attn, &d_h1, &d_attn, ctx, ls)?;
        let (heads, d_heads) = (qkv.reshape(&[t, qh + 2 * kvh, d])?, d_qkv.reshape(&[t, qh + 2 * kvh, d])?);
        let (opts, cu) = self.attention_setup(ctx);
        let part = |h: &Tensor, first: usize, n: usize| h.narrow(1, first, n);
        let (q, k, v) = (part(&heads, 0, qh)?, part(&heads, qh, kvh)?, part(&heads, qh + kvh, kvh)?);
        let (dq, dk, dv) = (part(&d_heads, 0, qh)?, part(&d_heads, qh, kvh)?, part(&d_heads, qh + kvh, kvh)?);
        let (o, d_o, lse) = (attn.reshape(&[t, qh, d])?, d_attn.reshape(&[t, qh, d])?, self.lse(saved, t)?);
        attention.backward(
            AttentionBackwardTensors {
                q: &q,
                k: &k,
                v: &v,
                out: &o,
                lse: &lse,
                d_out: &d_o,
                cu_seqlens: cu,
                dq: &dq,
                dk: &dk,
                dv: &dv,
            },
            &opts,
        )?;
        if let Some(rope) = &self.rope {
            rope.backward(&part(&d_heads, 0, qh + kvh)?, None, ctx.positions, None)?;
        }
        w.qkv.backward_input(&d_qkv, &d_n, false, qs)?;
        for p in [Projection::Q, Projection::K, Projection::V] {
            self.lora_bwd(p, &n1, &d_qkv, &d_n, ctx, ls)?;
        }
        ops::rms_norm_backward(&d_n, x, &w.input_norm, eps, d_x, Some(&d_h1), None)?;
        Ok(())
    }
}
