//! Modules in candle-nn's style on the fused ops: [`RmsNorm`], [`LoraLinear`] (a frozen base,
//! dense or packed, with a trainable peft adapter: LoRA and QLoRA) and [`LlamaBlock`], a Llama
//! decoder layer whose forward and backward run through the kernels, or through candle's plain
//! ops ([`Ops::Unfused`]) for comparison.

use candle::{DType, Device, Module, Result, Tensor, Var};
use llama_kernels::ops::rope::RopeConfig;

use crate::ops::{
    AttentionMask, AttentionOptions, Lora, LoraConfig, QLinear, RotaryEmbedding, flash_attn, rms_norm, swiglu,
};
use crate::unfused;

/// RMSNorm over the last dimension with a learned weight, on the fused kernel.
#[derive(Clone, Debug)]
pub struct RmsNorm {
    weight: Tensor,
    eps: f32,
}

impl RmsNorm {
    /// `weight` `[hidden]`; `eps` > 0 (Llama: 1e-5).
    pub fn new(weight: Tensor, eps: f32) -> RmsNorm {
        RmsNorm { weight, eps }
    }
    /// The weight.
    pub fn weight(&self) -> &Tensor {
        &self.weight
    }
}

impl Module for RmsNorm {
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        rms_norm(x, &self.weight, self.eps)
    }
}

/// The frozen base of a [`LoraLinear`].
#[derive(Clone, Debug)]
pub enum Base {
    /// A dense weight `[out, in]` (candle's matmul: cuBLAS on CUDA) and an optional bias `[out]`.
    Dense {
        /// `[out, in]`.
        weight: Tensor,
        /// `[out]`.
        bias: Option<Tensor>,
    },
    /// A packed weight (QLoRA's NF4, or a GGUF type), read packed by the kernels.
    Packed(QLinear),
}

impl Base {
    /// `[out, in]`.
    fn dims(&self) -> Result<(usize, usize)> {
        match self {
            Base::Dense { weight, .. } => weight.dims2(),
            Base::Packed(q) => {
                let [d_out, d_in] = q.shape();
                Ok((d_out, d_in))
            }
        }
    }
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        match self {
            Base::Dense { weight, bias } => {
                let y = x.broadcast_matmul(&weight.t()?)?;
                match bias {
                    Some(b) => y.broadcast_add(b),
                    None => Ok(y),
                }
            }
            Base::Packed(q) => q.forward(x),
        }
    }
}

/// `base(x) + scaling · dropout(x) Aᵀ Bᵀ`: a frozen linear layer ([`Base`]: dense, or packed
/// for QLoRA) with a trainable LoRA adapter (A `[r, in]`, B `[out, r]`), peft's `Linear`. The
/// branch is [`Lora::branch`].
#[derive(Clone, Debug)]
pub struct LoraLinear {
    base: Base,
    a: Var,
    b: Var,
    config: LoraConfig,
    stream: u64,
}

impl LoraLinear {
    /// A new adapter on `base` with peft's initialization: A uniform in `±1/√in`
    /// (kaiming-uniform with `a = √5`), B zero, so the layer starts as the base. The adapter's
    /// dtype and device are `dtype` and `device` (the activations'). `stream` tells this
    /// adapter's dropout masks from the other adapters' of the same step.
    pub fn new(base: Base, config: LoraConfig, stream: u64, dtype: DType, device: &Device) -> Result<LoraLinear> {
        config.check("LoraLinear").map_err(candle::Error::wrap)?;
        let (d_out, d_in) = base.dims()?;
        let bound = LoraConfig::a_init_bound(d_in);
        let a = Tensor::rand(-bound, bound, (config.r, d_in), device)?.to_dtype(dtype)?;
        let b = Tensor::zeros((d_out, config.r), dtype, device)?;
        Ok(LoraLinear { base, a: Var::from_tensor(&a)?, b: Var::from_tensor(&b)?, config, stream })
    }

    /// The adapter's matrices, A then B: what an optimizer updates.
    pub fn vars(&self) -> [&Var; 2] {
        [&self.a, &self.b]
    }

    /// The training forward: dropout on, its mask keyed by `seed` (a new one each step).
    pub fn forward_train(&self, x: &Tensor, seed: u64) -> Result<Tensor> {
        self.forward_with(x, self.config, seed)
    }

    fn forward_with(&self, x: &Tensor, config: LoraConfig, seed: u64) -> Result<Tensor> {
        let lora = Lora { config, seed, stream: self.stream };
        self.base.forward(x)? + lora.branch(x, self.a.as_tensor(), self.b.as_tensor())?
    }
}

impl Module for LoraLinear {
    /// The evaluation forward: no dropout (peft in eval mode).
    fn forward(&self, x: &Tensor) -> Result<Tensor> {
        self.forward_with(x, LoraConfig { dropout: 0.0, ..self.config }, 0)
    }
}

/// Which implementation a [`LlamaBlock`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ops {
    /// The fused kernels of this crate.
    Fused,
    /// candle's plain ops ([`crate::unfused`]).
    Unfused,
}

/// The shape of a [`LlamaBlock`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BlockConfig {
    /// Model width.
    pub hidden: usize,
    /// Query heads.
    pub q_heads: usize,
    /// Key/value heads (divides `q_heads`).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// The MLP's inner width.
    pub intermediate: usize,
    /// RMSNorm's eps.
    pub eps: f32,
    /// Positions' rotary embedding (its `head_dim` must be the block's).
    pub rope: RopeConfig,
}

/// A Llama decoder layer (pre-norm attention with GQA and RoPE, then a pre-norm SwiGLU MLP,
/// each added to the residual stream), every weight a trainable [`Var`]:
///
/// ```text
/// h = x + o_proj(attention(rope(q_proj(n1)), rope(k_proj(n1)), v_proj(n1))),  n1 = rms_norm(x)
/// y = h + down_proj(swiglu(gate_proj(n2), up_proj(n2))),                       n2 = rms_norm(h)
/// ```
#[derive(Debug)]
pub struct LlamaBlock {
    config: BlockConfig,
    rope: RotaryEmbedding,
    /// attn_norm, q, k, v, o, mlp_norm, gate, up, down.
    weights: [Var; 9],
}

impl LlamaBlock {
    /// The weights in the order [`LlamaBlock::vars`] gives them.
    pub const WEIGHTS: [&'static str; 9] =
        ["attn_norm", "q_proj", "k_proj", "v_proj", "o_proj", "mlp_norm", "gate_proj", "up_proj", "down_proj"];

    /// The weights' shapes for `config`, in [`LlamaBlock::WEIGHTS`] order (projections `[out, in]`).
    pub fn shapes(c: &BlockConfig) -> [Vec<usize>; 9] {
        let (q, kv) = (c.q_heads * c.head_dim, c.kv_heads * c.head_dim);
        [
            vec![c.hidden],
            vec![q, c.hidden],
            vec![kv, c.hidden],
            vec![kv, c.hidden],
            vec![c.hidden, q],
            vec![c.hidden],
            vec![c.intermediate, c.hidden],
            vec![c.intermediate, c.hidden],
            vec![c.hidden, c.intermediate],
        ]
    }

    /// A block from its weights, in [`LlamaBlock::WEIGHTS`] order and shapes.
    pub fn new(config: BlockConfig, weights: [Tensor; 9]) -> Result<LlamaBlock> {
        for ((w, want), name) in weights.iter().zip(Self::shapes(&config)).zip(Self::WEIGHTS) {
            if w.dims() != want.as_slice() {
                candle::bail!("LlamaBlock: {name} has shape {:?}, expected {want:?}", w.dims());
            }
        }
        if config.rope.head_dim != config.head_dim {
            candle::bail!(
                "LlamaBlock: the rope config's head_dim {} is not the block's {}",
                config.rope.head_dim,
                config.head_dim
            );
        }
        let rope = RotaryEmbedding::new(config.rope)?;
        let vars = weights.iter().map(Var::from_tensor).collect::<Result<Vec<_>>>()?;
        let weights = vars.try_into().map_err(|_| candle::Error::msg("LlamaBlock: nine weights"))?;
        Ok(LlamaBlock { config, rope, weights })
    }

    /// The trainable weights, in [`LlamaBlock::WEIGHTS`] order.
    pub fn vars(&self) -> &[Var; 9] {
        &self.weights
    }

    /// The layer on `x` `[batch, seq, hidden]`, every sequence causal from position
    /// `positions[b * seq + i]` (i64, `[batch · seq]`), with `ops`.
    pub fn forward(&self, x: &Tensor, positions: &Tensor, ops: Ops) -> Result<Tensor> {
        let c = &self.config;
        let (b, s, _) = x.dims3()?;
        let w = |i: usize| self.weights[i].as_tensor();
        let linear = |t: &Tensor, i: usize| t.broadcast_matmul(&w(i).t()?);
        let norm = |t: &Tensor, i: usize| match ops {
            Ops::Fused => rms_norm(t, w(i), c.eps),
            Ops::Unfused => unfused::rms_norm(t, w(i), f64::from(c.eps)),
        };
        // The plain form computes its angles on the host: only it copies the positions there.
        let host_positions: Vec<i64> = if ops == Ops::Unfused { positions.to_vec1()? } else { Vec::new() };
        let rope = |t: &Tensor| match ops {
            Ops::Fused => self.rope.forward(t, positions),
            Ops::Unfused => unfused::rope(t, &host_positions, &c.rope),
        };
        let n1 = norm(x, 0)?;
        let q = rope(&linear(&n1, 1)?.reshape((b, s, c.q_heads, c.head_dim))?)?;
        let k = rope(&linear(&n1, 2)?.reshape((b, s, c.kv_heads, c.head_dim))?)?;
        let v = linear(&n1, 3)?.reshape((b, s, c.kv_heads, c.head_dim))?;
        let causal = AttentionOptions { mask: AttentionMask::Causal, ..Default::default() };
        let o = match ops {
            Ops::Fused => flash_attn(&q, &k, &v, &causal)?,
            Ops::Unfused => unfused::attention(&q, &k, &v, &causal)?,
        };
        let h = (x + linear(&o.reshape((b, s, c.q_heads * c.head_dim))?, 4)?)?;
        let n2 = norm(&h, 5)?;
        let (gate, up) = (linear(&n2, 6)?, linear(&n2, 7)?);
        let m = match ops {
            Ops::Fused => swiglu(&gate, &up)?,
            Ops::Unfused => unfused::swiglu(&gate, &up)?,
        };
        h + linear(&m, 8)?
    }
}
