//! The same functions in candle's plain ops: the computation the fused ops replace, for checking
//! them on your own inputs (run it in f64 for a reference) and for comparing speed. Each is the
//! textbook form, differentiable through candle's own autograd.

use candle::{D, Device, Result, Tensor};
use llama_kernels::ops::rope::{RopeConfig, RopeLayout};
use llama_kernels::spec::dropout::Dropout;

use crate::ops::{AttentionMask, AttentionOptions, Lora};

/// `x · rsqrt(mean(x²) + eps) · weight` over the last dimension.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// `silu(gate) · up`.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    let sigmoid = (gate.neg()?.exp()? + 1.0)?.recip()?;
    gate.mul(&sigmoid)?.mul(up)
}

/// RoPE of `x` `[tokens, heads, head_dim]` (or `[batch, seq, heads, head_dim]`) at `positions`
/// (one per token), with the frequencies of `config` (scaling and partial rotary included; no
/// qk-norm), computed in x's dtype from f64 angles.
pub fn rope(x: &Tensor, positions: &[i64], config: &RopeConfig) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let (heads, head_dim) = match dims.as_slice() {
        [.., h, d] => (*h, *d),
        _ => candle::bail!("rope: x {dims:?} must be [..., heads, head_dim]"),
    };
    let x = x.reshape((positions.len(), heads, head_dim))?;
    let inv = llama_kernels::spec::rope::inv_freq(config);
    let half = inv.len();
    let angles: Vec<f64> = positions.iter().flat_map(|&p| inv.iter().map(move |f| p as f64 * f)).collect();
    let angles = Tensor::from_vec(angles, (positions.len(), 1, half), &Device::Cpu)?;
    let (cos, sin) = (
        angles.cos()?.to_dtype(x.dtype())?.to_device(x.device())?,
        angles.sin()?.to_dtype(x.dtype())?.to_device(x.device())?,
    );
    let rot = x.narrow(D::Minus1, 0, 2 * half)?;
    let (a, b) = match config.layout {
        RopeLayout::HalfSplit => (rot.narrow(D::Minus1, 0, half)?, rot.narrow(D::Minus1, half, half)?),
        RopeLayout::Interleaved => {
            let pairs = rot.reshape((positions.len(), heads, half, 2))?;
            (pairs.narrow(3, 0, 1)?.squeeze(3)?, pairs.narrow(3, 1, 1)?.squeeze(3)?)
        }
    };
    let ra = (a.broadcast_mul(&cos)? - b.broadcast_mul(&sin)?)?;
    let rb = (b.broadcast_mul(&cos)? + a.broadcast_mul(&sin)?)?;
    let rotated = match config.layout {
        RopeLayout::HalfSplit => Tensor::cat(&[ra, rb], D::Minus1)?,
        RopeLayout::Interleaved => Tensor::stack(&[ra, rb], D::Minus1)?.flatten_from(2)?,
    };
    let out = if 2 * half < head_dim {
        Tensor::cat(&[rotated, x.narrow(D::Minus1, 2 * half, head_dim - 2 * half)?], D::Minus1)?
    } else {
        rotated
    };
    out.reshape(dims)
}

/// `softmax(t · scale · q kᵀ + mask) v` with q `[batch, seq_q, q_heads, head_dim]`, k and v
/// `[batch, seq_k, kv_heads, head_dim]` (each KV head serves `q_heads / kv_heads` q heads), with
/// [`flash_attn`](crate::flash_attn)'s options: query i sits at position `seq_k - seq_q + i`
/// (bottom-right alignment); the causal mask shows it the keys up to there, the chunked one only
/// those of its chunk; `scale = None` is `1 / √head_dim`; Llama 4's temperature `t` is
/// `ln(floor((p + 1) / floor_scale) + 1) · attn_scale + 1` at position p (1 without it). A
/// query that sees no key is NaN here (the kernels write 0).
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<Tensor> {
    let (b, sq, hq, d) = q.dims4()?;
    let (_, sk, hkv, _) = k.dims4()?;
    if hkv == 0 || hq % hkv != 0 {
        candle::bail!("attention: q_heads {hq} is not a multiple of kv_heads {hkv}");
    }
    let group = hq / hkv;
    let heads = |t: &Tensor| t.transpose(1, 2)?.contiguous();
    let repeat = |t: &Tensor| -> Result<Tensor> {
        heads(t)?.unsqueeze(2)?.broadcast_as((b, hkv, group, sk, d))?.contiguous()?.reshape((b, hq, sk, d))
    };
    let (q, k, v) = (heads(q)?, repeat(k)?, repeat(v)?);
    let scale = opts.scale.map_or(1.0 / (d as f64).sqrt(), f64::from);
    let scores = (q.matmul(&k.t()?)? * scale)?;
    // Query i's absolute position (None: before the first key, it sees nothing).
    let position = |i: usize| (sk + i).checked_sub(sq);
    let scores = match opts.temperature {
        None => scores,
        Some(t) => {
            let factor: Vec<f64> = (0..sq)
                .map(|i| {
                    let p = position(i).unwrap_or(0) as f64;
                    ((p + 1.0) / f64::from(t.floor_scale)).floor().ln_1p() * f64::from(t.attn_scale) + 1.0
                })
                .collect();
            let factor = Tensor::from_vec(factor, (sq, 1), q.device())?.to_dtype(scores.dtype())?;
            scores.broadcast_mul(&factor)?
        }
    };
    let sees = |i: usize, j: usize| -> bool {
        match (opts.mask, position(i)) {
            (AttentionMask::None, _) => true,
            (_, None) => false,
            (AttentionMask::Causal, Some(p)) => j <= p,
            (AttentionMask::ChunkedCausal { chunk_size }, Some(p)) => j <= p && j / chunk_size == p / chunk_size,
        }
    };
    let scores = if opts.mask == AttentionMask::None {
        scores
    } else {
        if let AttentionMask::ChunkedCausal { chunk_size: 0 } = opts.mask {
            candle::bail!("attention: chunk_size must be > 0");
        }
        let m: Vec<f32> = (0..sq)
            .flat_map(|i| (0..sk).map(move |j| (i, j)))
            .map(|(i, j)| if sees(i, j) { 0.0 } else { f32::NEG_INFINITY })
            .collect();
        let m = Tensor::from_vec(m, (sq, sk), q.device())?.to_dtype(scores.dtype())?;
        scores.broadcast_add(&m)?
    };
    let max = scores.max_keepdim(3)?.detach();
    let e = scores.broadcast_sub(&max)?.exp()?;
    e.broadcast_div(&e.sum_keepdim(3)?)?.matmul(&v)?.transpose(1, 2)
}

/// peft's LoRA branch `scaling · dropout(x) Aᵀ Bᵀ` for x `[..., in]`, with the same dropout mask
/// as [`Lora::branch`] (the specification's Philox keep function).
pub fn lora_branch(x: &Tensor, a: &Tensor, b: &Tensor, lora: &Lora) -> Result<Tensor> {
    let (lead, d_in) = match x.dims().split_last() {
        Some((&d_in, lead)) => (lead.to_vec(), d_in),
        None => candle::bail!("lora: x must be [..., in]"),
    };
    let tokens: usize = lead.iter().product();
    let x2 = x.reshape((tokens, d_in))?;
    let drop = Dropout { p: lora.config.dropout, seed: lora.seed, stream: lora.stream };
    let keep = drop.keep_scale();
    let mask: Vec<f64> = (0..tokens)
        .flat_map(|t| (0..d_in).map(move |i| (t, i)))
        .map(|(t, i)| if llama_kernels::reference::dropout::keeps(&drop, t, i) { keep } else { 0.0 })
        .collect();
    let mask = Tensor::from_vec(mask, (tokens, d_in), x.device())?.to_dtype(x.dtype())?;
    let h = x2.mul(&mask)?.matmul(&a.t()?)?;
    let y = (h.matmul(&b.t()?)? * lora.config.scaling())?;
    let d_out = y.dim(1)?;
    y.reshape(lead.into_iter().chain([d_out]).collect::<Vec<_>>())
}
