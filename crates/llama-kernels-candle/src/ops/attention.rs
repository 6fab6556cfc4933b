//! Flash attention (kernels/attention.cu; FlashAttention-2's algorithm, and FlashAttention-3's
//! on Hopper) with its gradient (kernels/attention_backward.cu): grouped-query heads, varlen
//! batches, causal (bottom-right aligned) and Llama 4's chunked and temperature variants,
//! head_dim 32, 64, 96, 128 and 256; bf16 and f16 on tensor cores, f32 on a SIMT path.
//!
//! The forward keeps its log-sum-exp (f32, `[q_heads, total_q]`) with the op, and the backward
//! recomputes the probabilities tile by tile from it: the score matrix never exists in memory,
//! forward or backward.
//!
//! Shapes: q `[total_q, q_heads, head_dim]` and k, v `[total_k, kv_heads, head_dim]` for
//! [`flash_attn_varlen`] (sequences at the cumulative offsets `cu_seqlens_q`/`cu_seqlens_k`,
//! `batch + 1` values from 0); `[batch, seq, heads, head_dim]` for [`flash_attn`], every
//! sequence of one length. `q_heads` must be a multiple of `kv_heads`.

use std::sync::Arc;

use candle::{Result, Shape, Tensor};
use llama_kernels::ops::attention::{AttentionArgs, AttentionBackwardArgs, AttentionWorkspace, CuSeqlens, KvInput};
pub use llama_kernels::ops::attention::{AttentionMask, AttentionOptions, Llama4Temperature};

use crate::bridge::{
    Input, Kept, Kernel, KernelStorage, arity, custom_op, first, kernel_err, launch, op_err, tensor_of,
};

/// `softmax(scale · q kᵀ + mask) v` over a batch of equal-length sequences: q
/// `[batch, seq_q, q_heads, head_dim]`, k and v `[batch, seq_k, kv_heads, head_dim]`; the
/// result is shaped like q. Differentiable in q, k and v.
pub fn flash_attn(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<Tensor> {
    flash_attn_with_lse(q, k, v, opts).map(|(out, _)| out)
}

/// [`flash_attn`] that also returns the log-sum-exp of each query row, f32
/// `[q_heads, batch · seq_q]` (not differentiable): what merging attention states needs.
pub fn flash_attn_with_lse(q: &Tensor, k: &Tensor, v: &Tensor, opts: &AttentionOptions) -> Result<(Tensor, Tensor)> {
    let op = FlashAttn::NAME;
    let (batch, seq_q, seq_k) = match (q.dims(), k.dims()) {
        (&[b, sq, _, _], &[kb, sk, _, _]) if kb == b => (b, sq, sk),
        (qd, kd) => {
            return Err(op_err(op, format_args!("q {qd:?} and k {kd:?} must be [batch, seq, heads, head_dim]")));
        }
    };
    let offsets = |len: usize| -> Result<Vec<i32>> {
        (0..=batch).map(|b| i32::try_from(b * len).map_err(|_| op_err(op, "more than 2^31 tokens"))).collect()
    };
    run(q, k, v, offsets(seq_q)?, offsets(seq_k)?, opts)
}

/// Attention over a varlen batch: q `[total_q, q_heads, head_dim]`, k and v
/// `[total_k, kv_heads, head_dim]`, sequence `b` at rows `cu_seqlens_q[b]..cu_seqlens_q[b + 1]`
/// of q and `cu_seqlens_k[b]..cu_seqlens_k[b + 1]` of k and v (queries aligned to the end of
/// their keys: chunked prefill after a cached prefix). Differentiable in q, k and v.
pub fn flash_attn_varlen(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    opts: &AttentionOptions,
) -> Result<Tensor> {
    run(q, k, v, cu_seqlens_q.to_vec(), cu_seqlens_k.to_vec(), opts).map(|(out, _)| out)
}

fn run(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    opts: &AttentionOptions,
) -> Result<(Tensor, Tensor)> {
    let lse = Arc::new(Kept::new());
    let op = FlashAttn { cu_q, cu_k, opts: *opts, lse: lse.clone() };
    let out = q.contiguous()?.apply_op3(&k.contiguous()?, &v.contiguous()?, op)?;
    Ok((out, lse.get(FlashAttn::NAME, "log-sum-exp")?))
}

/// `[q, k, v]` to `[out, lse]`; the op keeps lse for its backward.
struct FlashAttn {
    cu_q: Vec<i32>,
    cu_k: Vec<i32>,
    opts: AttentionOptions,
    lse: Arc<Kept<Tensor>>,
}

/// `[..., heads, head_dim]` as `[tokens, heads, head_dim]`.
fn rows3(op: &'static str, what: &str, dims: &[usize]) -> Result<[usize; 3]> {
    match dims {
        [lead @ .., heads, head_dim] if !lead.is_empty() => Ok([lead.iter().product(), *heads, *head_dim]),
        _ => Err(op_err(op, format_args!("{what} {dims:?} must be [tokens, heads, head_dim]"))),
    }
}

impl Kernel for FlashAttn {
    const NAME: &'static str = "llama-kernels/flash_attn";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [q, k, v] = arity(Self::NAME, inputs)?;
        let device = q.storage.kernel_device()?;
        let (qd, kd, vd) =
            (rows3(Self::NAME, "q", q.dims())?, rows3(Self::NAME, "k", k.dims())?, rows3(Self::NAME, "v", v.dims())?);
        let (qv, kv, vv) =
            (q.view_as(Self::NAME, "q", &qd)?, k.view_as(Self::NAME, "k", &kd)?, v.view_as(Self::NAME, "v", &vd)?);
        let mut out = q.zeros(q.dims(), q.dtype())?;
        let lse_dims = [qd[1], qd[0]];
        let mut lse = q.zeros(&lse_dims, candle::DType::F32)?;
        {
            let (mut ov, mut lv) = (out.view_mut(&qd)?, lse.view_mut(&lse_dims)?);
            let args = AttentionArgs {
                q: &qv,
                kv: KvInput::Contiguous { k: &kv, v: &vv },
                cu_seqlens: CuSeqlens::Host { q: &self.cu_q, k: &self.cu_k },
                out: &mut ov,
                lse: Some(&mut lv),
            };
            AttentionWorkspace::new(&device).forward_on(&device, args, &self.opts).map_err(kernel_err)?;
        }
        Ok(vec![(out, q.layout.shape().clone()), (lse, Shape::from_dims(&lse_dims))])
    }
}

impl FlashAttn {
    /// The output, keeping the log-sum-exp for the backward.
    fn forward<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<(S, Shape)> {
        let mut outputs = self.run(inputs)?;
        let (lse, shape) = outputs.pop().ok_or_else(|| op_err(Self::NAME, "produced no log-sum-exp"))?;
        self.lse.put(Self::NAME, tensor_of(lse, shape))?;
        first(outputs, Self::NAME)
    }

    fn backward(&self, [q, k, v]: [&Tensor; 3], out: &Tensor, d_out: &Tensor) -> Result<[Option<Tensor>; 3]> {
        let lse = self.lse.get(Self::NAME, "log-sum-exp")?;
        let grads = FlashAttnBackward { cu_q: &self.cu_q, cu_k: &self.cu_k, opts: self.opts };
        let mut g = launch(&grads, &[q, k, v, out, &lse, &d_out.contiguous()?])?.into_iter();
        Ok([g.next(), g.next(), g.next()])
    }
}
custom_op!(CustomOp3 for FlashAttn);

/// `[q, k, v, out, lse, d_out]` to `[dq, dk, dv]`.
struct FlashAttnBackward<'c> {
    cu_q: &'c [i32],
    cu_k: &'c [i32],
    opts: AttentionOptions,
}

impl Kernel for FlashAttnBackward<'_> {
    const NAME: &'static str = "llama-kernels/flash_attn_backward";
    fn run<S: KernelStorage>(&self, inputs: &[Input<'_, S>]) -> Result<Vec<(S, Shape)>> {
        let [q, k, v, out, lse, d_out] = arity(Self::NAME, inputs)?;
        let device = q.storage.kernel_device()?;
        let op = Self::NAME;
        let (qd, kd) = (rows3(op, "q", q.dims())?, rows3(op, "k", k.dims())?);
        let (qv, kv, vv) = (q.view_as(op, "q", &qd)?, k.view_as(op, "k", &kd)?, v.view_as(op, "v", &kd)?);
        let (ov, dov) = (out.view_as(op, "out", &qd)?, d_out.view_as(op, "d_out", &qd)?);
        let lv = lse.view()?;
        let (mut dq, mut dk, mut dv) =
            (q.zeros(q.dims(), q.dtype())?, k.zeros(k.dims(), k.dtype())?, v.zeros(v.dims(), v.dtype())?);
        {
            let (mut dqv, mut dkv, mut dvv) = (dq.view_mut(&qd)?, dk.view_mut(&kd)?, dv.view_mut(&kd)?);
            let args = AttentionBackwardArgs {
                q: &qv,
                k: &kv,
                v: &vv,
                out: &ov,
                lse: &lv,
                d_out: &dov,
                cu_seqlens: CuSeqlens::Host { q: self.cu_q, k: self.cu_k },
                dq: &mut dqv,
                dk: &mut dkv,
                dv: &mut dvv,
            };
            AttentionWorkspace::new(&device).backward_on(&device, args, &self.opts).map_err(kernel_err)?;
        }
        let shape = |i: &Input<'_, S>| i.layout.shape().clone();
        Ok(vec![(dq, shape(q)), (dk, shape(k)), (dv, shape(v))])
    }
}
