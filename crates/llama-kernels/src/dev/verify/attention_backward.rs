//! `verify` cases of the attention backward: the forward kernel's output and log-sum-exp, then
//! dQ, dK and dV against the f64 reference gradient of the same inputs.

use std::time::Instant;

use super::attention::{AttentionCase, CaseInputs, case_inputs, case_label, qkv_tensors};
use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Tolerance, compare};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::ops::attention::{
    AttentionBackwardPath, AttentionBackwardTensors, AttentionMask, AttentionTensors, AttentionWorkspace, KvTensors,
    Llama4Temperature, Offsets, backward_path,
};
use crate::reference;
use crate::reference::attention::{AttentionGradInputs, AttentionSpec};
use crate::tensor::Tensor;

/// Tolerance of the gradients against the reference fed the same saved state (the forward
/// kernel's output and log-sum-exp): what the kernel computes is that reference's function, in
/// f32 from inputs of the dtype, each gradient a sum of up to `n` terms rounded once. `scale`:
/// the largest reference gradient.
pub fn attention_gradient_tolerance(dtype: DType, n: usize, scale: f64) -> Tolerance {
    super::backward::gradient_tolerance(dtype, n, scale)
}

/// FlashAttention's test rule for gradients computed with 16-bit operands: the kernel's largest
/// error against the `exact` gradient at most twice the largest error of `framework` (the same
/// gradient as a 16-bit framework computes it: [`reference::attention::attention_backward`] with
/// `rounded`), plus one unit of roundoff of the gradient's root-mean-square (at least the
/// absolute floor of a 16-bit output, [`Tolerance::rounded_output`]: where the exact gradient
/// vanishes, as with a single key, f32 sums in another order are not exactly 0).
pub fn flash_attention_rule(dtype: DType, exact: &[f64], framework: &[f64]) -> Tolerance {
    let err = exact.iter().zip(framework).fold(0.0f64, |m, (e, f)| m.max((e - f).abs()));
    let rms = (exact.iter().map(|x| x * x).sum::<f64>() / exact.len().max(1) as f64).sqrt();
    let small = (dtype.unit_roundoff() * rms).max(Tolerance::rounded_output(dtype).atol);
    Tolerance { atol: 2.0 * err + small, rtol: 0.0 }
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0f64, |m, x| m.max(x.abs()))
}

/// Runs the forward and the backward of `case` (contiguous K/V; `fused_qkv`: the inputs and
/// the gradients are views into fused QKV buffers) with a seeded dO.
pub fn attention_backward_case(device: &Device, case: &AttentionCase) -> Result<CaseResult> {
    let AttentionCase { dtype, q_heads, kv_heads, head_dim: d, opts, device_offsets, paged, .. } = *case;
    if paged.is_some() {
        return Err(Error::invalid("verify", "paged", "Some", "the backward reads contiguous K/V"));
    }
    let CaseInputs { cu_q, cu_k, tq, tk, mut rng, q, k, v } = case_inputs(case);
    let d_out = rng.normal_vec(tq * q_heads * d, 1.0, dtype);
    let (qt, kt, vt) = qkv_tensors(device, case, [&q, &k, &v], tq, tk)?;
    let dot = Tensor::from_f64(device, dtype, &d_out, &[tq, q_heads, d])?;
    let out = Tensor::poisoned(device, dtype, &[tq, q_heads, d])?;
    let lse = Tensor::poisoned(device, DType::F32, &[q_heads, tq])?;
    // Poisoned gradients, laid out as the inputs (fused: views into one NaN buffer).
    let nan = |n: usize| vec![f64::NAN; n];
    let (dq, dk, dv) = qkv_tensors(device, case, [&nan(q.len()), &nan(k.len()), &nan(v.len())], tq, tk)?;
    let (cq, ck) =
        (Tensor::from_slice(device, &cu_q, &[cu_q.len()])?, Tensor::from_slice(device, &cu_k, &[cu_k.len()])?);
    let cu_seqlens =
        if device_offsets { Offsets::Device { q: &cq, k: &ck } } else { Offsets::Host { q: &cu_q, k: &cu_k } };
    let mut ws = AttentionWorkspace::new(device);
    let kv = KvTensors::Contiguous { k: &kt, v: &vt };
    ws.forward(AttentionTensors { q: &qt, kv, cu_seqlens, out: &out, lse: Some(&lse) }, &opts)?;
    let start = Instant::now();
    let call = AttentionBackwardTensors {
        q: &qt,
        k: &kt,
        v: &vt,
        out: &out,
        lse: &lse,
        d_out: &dot,
        cu_seqlens,
        dq: &dq,
        dk: &dk,
        dv: &dv,
    };
    ws.backward(call, &opts)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    ws.check_errors()?;

    let spec = AttentionSpec {
        q_heads,
        kv_heads,
        head_dim: d,
        mask: opts.mask,
        scale: f64::from(opts.scale.unwrap_or(1.0 / (d as f32).sqrt())),
        temperature: opts.temperature,
    };
    let (saved_out, saved_lse) = (out.to_f64_vec()?, lse.to_f64_vec()?);
    let inputs = AttentionGradInputs {
        q: &q,
        k: &k,
        v: &v,
        d_out: &d_out,
        cu_seqlens_q: &cu_q,
        cu_seqlens_k: &cu_k,
        saved: Some((&saved_out, &saved_lse)),
        rounded: None,
    };
    let (gq, gk, gv) = (dq.to_f64_vec()?, dk.to_f64_vec()?, dv.to_f64_vec()?);
    let shapes = [vec![tq, q_heads, d], vec![tk, kv_heads, d], vec![tk, kv_heads, d]];
    let path = backward_path(dtype, d);
    let parts: Vec<_> = if path == AttentionBackwardPath::Simt {
        // f32 math from the saved state: the saved-state reference, tightly.
        let (rq, rk, rv) = reference::attention::attention_backward(&inputs, &spec)?;
        // The longest sums: dQ over a sequence's keys, dK and dV over its queries times the group.
        let longest = |i: usize| case.seqlens.iter().map(|s| [s.1, s.0 * (q_heads / kv_heads)][i]).max().unwrap_or(0);
        let tol = |n: usize, r: &[f64]| attention_gradient_tolerance(dtype, n, max_abs(r));
        let (nq, nk) = (longest(0), longest(1));
        [(&gq, rq, nq), (&gk, rk, nk), (&gv, rv, nk)]
            .into_iter()
            .zip(shapes)
            .map(|((g, r, n), shape)| (compare(g, &r, tol(n, &r)), shape))
            .collect()
    } else {
        // Tensor cores round P and dS to the dtype: FlashAttention's rule, against the exact
        // gradient, with the error of the same computation done as a 16-bit framework does it.
        let exact = AttentionGradInputs { saved: None, ..inputs };
        let (eq, ek, ev) = reference::attention::attention_backward(&exact, &spec)?;
        let (o, l) = reference::attention::attention(&q, &k, &v, &cu_q, &cu_k, &spec)?;
        let o16: Vec<f64> = o.iter().map(|&x| crate::dtype::round_to(dtype, x)).collect();
        let framework = AttentionGradInputs { saved: Some((&o16, &l)), rounded: Some(dtype), ..inputs };
        let (fq, fk, fv) = reference::attention::attention_backward(&framework, &spec)?;
        [(&gq, eq, fq), (&gk, ek, fk), (&gv, ev, fv)]
            .into_iter()
            .zip(shapes)
            .map(|((g, e, f), shape)| (compare(g, &e, flash_attention_rule(dtype, &e, &f)), shape))
            .collect()
    };
    Ok(result("attention_backward", dtype, case_label(case, tq, tk), parts, true, millis, vec![gq, gk, gv]))
}

/// The attention-backward cases `verify` runs: a Llama 3 8B group (4 q heads per KV head) at
/// head_dim 128, causal, one long sequence (quick: 65 tokens); a varlen batch with a cached
/// prefix and empty sequences; Llama 4's chunked attention with temperature; fused QKV views with
/// device offsets.
pub fn attention_backward_cases(quick: bool) -> Vec<AttentionCase> {
    let len = if quick { 65 } else { 512 };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(AttentionCase::single(dtype, len, 8, 2, 128, AttentionMask::Causal));
        v.push(AttentionCase::new(dtype, &[(17, 40), (0, 5), (33, 33), (4, 0)], 8, 1, 64, AttentionMask::Causal));
        let mut chunked = AttentionCase::single(dtype, len, 4, 1, 64, AttentionMask::ChunkedCausal { chunk_size: 16 });
        chunked.opts.temperature = Some(Llama4Temperature { floor_scale: 8.0, attn_scale: 0.1 });
        v.push(chunked);
        let mut fused = AttentionCase::new(dtype, &[(21, 21), (40, 40)], 8, 2, 128, AttentionMask::Causal);
        fused.fused_qkv = true;
        fused.device_offsets = true;
        v.push(fused);
    }
    v
}
