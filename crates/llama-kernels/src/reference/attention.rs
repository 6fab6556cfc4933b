//! Reference attention (the spec of kernels/attention.cu): explicit masks and a full softmax in
//! f64, one (sequence, q head, query) at a time.
//!
//! For sequence b with `q_len` queries and `k_len` keys, query i sits at absolute position
//! `p = k_len - q_len + i` (bottom-right alignment). Key j is allowed when: always (no mask);
//! `j <= p` (causal); `j <= p` and `j >= floor(p / C) * C` (Llama 4 chunked local attention).
//! Scores are `scale * t(p) * <q_i, k_j>` with `t(p) = ln(floor((max(p, 0) + 1) / floor_scale) + 1)
//! * attn_scale + 1` under Llama 4 temperature tuning, else 1. Output: the softmax-weighted sum of
//! V over allowed keys, and `lse = ln(sum_j exp(score_j))`; a query with no allowed key gets zeros
//! and `lse = -inf`. q heads map to kv heads by `h / (q_heads / kv_heads)`.

use super::check_len;
use crate::dtype::{DType, round_to};
use crate::error::{Error, Result};
use crate::spec::attention::{AttentionMask, Llama4Temperature};

/// Shapes and options of a reference attention call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionSpec {
    /// Query heads (a multiple of `kv_heads`).
    pub q_heads: usize,
    /// KV heads (> 0).
    pub kv_heads: usize,
    /// Elements per head.
    pub head_dim: usize,
    /// Which keys each query attends.
    pub mask: AttentionMask,
    /// Softmax scale on `<q, k>`.
    pub scale: f64,
    /// Llama 4 temperature tuning, or `None`.
    pub temperature: Option<Llama4Temperature>,
}

/// The temperature factor t(p).
pub fn temperature(t: &Llama4Temperature, pos: i64) -> f64 {
    ((((pos.max(0) + 1) as f64) / f64::from(t.floor_scale)).floor() + 1.0).ln() * f64::from(t.attn_scale) + 1.0
}

/// Whether query position `pos` may attend key `key` of a sequence with `k_len` keys.
pub fn allowed(mask: AttentionMask, pos: i64, key: i64, k_len: i64) -> bool {
    if key < 0 || key >= k_len {
        return false;
    }
    match mask {
        AttentionMask::None => true,
        AttentionMask::Causal => key <= pos,
        AttentionMask::ChunkedCausal { chunk_size } => {
            let c = chunk_size as i64;
            key <= pos && key >= pos.div_euclid(c) * c
        }
    }
}

/// `q`: `[total_q, q_heads, head_dim]`, `k`, `v`: `[total_k, kv_heads, head_dim]`, contiguous.
/// Returns `(out [total_q, q_heads, head_dim], lse [q_heads, total_q])`.
pub fn attention(
    q: &[f64],
    k: &[f64],
    v: &[f64],
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    spec: &AttentionSpec,
) -> Result<(Vec<f64>, Vec<f64>)> {
    let AttentionSpec { q_heads, kv_heads, head_dim: d, mask, scale, temperature: temp } = *spec;
    if kv_heads == 0 || q_heads % kv_heads != 0 || cu_seqlens_q.len() != cu_seqlens_k.len() || cu_seqlens_q.is_empty() {
        return Err(Error::Reference { what: "attention", why: "inconsistent heads or batch".into() });
    }
    let total_q = *cu_seqlens_q.last().unwrap_or(&0) as usize;
    let total_k = *cu_seqlens_k.last().unwrap_or(&0) as usize;
    check_len("q", q.len(), total_q * q_heads * d)?;
    check_len("k", k.len(), total_k * kv_heads * d)?;
    check_len("v", v.len(), total_k * kv_heads * d)?;
    let group = q_heads / kv_heads;
    let mut out = vec![0.0; total_q * q_heads * d];
    let mut lse = vec![f64::NEG_INFINITY; q_heads * total_q];
    for b in 0..cu_seqlens_q.len() - 1 {
        let (q0, q1) = (cu_seqlens_q[b] as usize, cu_seqlens_q[b + 1] as usize);
        let (k0, k1) = (cu_seqlens_k[b] as usize, cu_seqlens_k[b + 1] as usize);
        let (q_len, k_len) = ((q1 - q0) as i64, (k1 - k0) as i64);
        for h in 0..q_heads {
            let kh = h / group;
            for i in 0..q_len {
                let pos = k_len - q_len + i;
                let row = q0 + i as usize;
                let qv = &q[(row * q_heads + h) * d..(row * q_heads + h + 1) * d];
                let t = temp.map_or(1.0, |t| temperature(&t, pos));
                let scores: Vec<(usize, f64)> = (0..k_len)
                    .filter(|&j| allowed(mask, pos, j, k_len))
                    .map(|j| {
                        let kr = k0 + j as usize;
                        let kv = &k[(kr * kv_heads + kh) * d..(kr * kv_heads + kh + 1) * d];
                        (kr, scale * t * qv.iter().zip(kv).map(|(a, b)| a * b).sum::<f64>())
                    })
                    .collect();
                if scores.is_empty() {
                    continue;
                }
                let mx = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
                let denom: f64 = scores.iter().map(|s| (s.1 - mx).exp()).sum();
                lse[h * total_q + row] = mx + denom.ln();
                let o = &mut out[(row * q_heads + h) * d..(row * q_heads + h + 1) * d];
                for &(kr, sc) in &scores {
                    let w = (sc - mx).exp() / denom;
                    let vv = &v[(kr * kv_heads + kh) * d..(kr * kv_heads + kh + 1) * d];
                    o.iter_mut().zip(vv).for_each(|(acc, x)| *acc += w * x);
                }
            }
        }
    }
    Ok((out, lse))
}

/// The NaN contract of the kernels, which tile keys 64 at a time (as FlashAttention and PyTorch's
/// SDPA do): a non-finite value in K or V at key j of a sequence may reach the output of every
/// query of that sequence whose block visits j's tile, even a query that masks j (its weight 0
/// times NaN is NaN in the P V product). Which queries that hits depends on the tiling, so the
/// contract is stated per row: a row is *exposed* when a key of its sequence and KV head that it
/// does not attend carries a non-finite K or V value; each output element of an exposed row (and
/// its LSE) is either the exact value [`attention`] computes or NaN. Rows that are not exposed are
/// exact; a non-finite value at a key a row attends makes that row NaN in [`attention`] itself.
///
/// Returns one flag per `(token, q head)` row, row-major like the output.
pub fn nan_exposed_rows(
    k: &[f64],
    v: &[f64],
    cu_seqlens_q: &[i32],
    cu_seqlens_k: &[i32],
    spec: &AttentionSpec,
) -> Result<Vec<bool>> {
    let AttentionSpec { q_heads, kv_heads, head_dim: d, mask, .. } = *spec;
    if kv_heads == 0 || q_heads % kv_heads != 0 || cu_seqlens_q.len() != cu_seqlens_k.len() || cu_seqlens_q.is_empty() {
        return Err(Error::Reference { what: "attention", why: "inconsistent heads or batch".into() });
    }
    let total_q = *cu_seqlens_q.last().unwrap_or(&0) as usize;
    let group = q_heads / kv_heads;
    let bad = |kr: usize, kh: usize| {
        let r = (kr * kv_heads + kh) * d..(kr * kv_heads + kh + 1) * d;
        k[r.clone()].iter().chain(&v[r]).any(|x| !x.is_finite())
    };
    let mut exposed = vec![false; total_q * q_heads];
    for b in 0..cu_seqlens_q.len() - 1 {
        let (q0, q1) = (cu_seqlens_q[b] as usize, cu_seqlens_q[b + 1] as usize);
        let (k0, k1) = (cu_seqlens_k[b] as usize, cu_seqlens_k[b + 1] as usize);
        let (q_len, k_len) = ((q1 - q0) as i64, (k1 - k0) as i64);
        for h in 0..q_heads {
            let kh = h / group;
            for i in 0..q_len {
                let pos = k_len - q_len + i;
                let hit = (0..k_len).any(|j| !allowed(mask, pos, j, k_len) && bad(k0 + j as usize, kh));
                exposed[(q0 + i as usize) * q_heads + h] = hit;
            }
        }
    }
    Ok(exposed)
}

/// The inputs of an attention gradient: the forward's inputs and offsets, the upstream gradient
/// `d_out` (shaped as the output) and, optionally, the forward's saved output and log-sum-exp.
#[derive(Clone, Copy, Debug)]
pub struct AttentionGradInputs<'a> {
    /// `[total_q, q_heads, head_dim]`.
    pub q: &'a [f64],
    /// `[total_k, kv_heads, head_dim]`.
    pub k: &'a [f64],
    /// `[total_k, kv_heads, head_dim]`.
    pub v: &'a [f64],
    /// `[total_q, q_heads, head_dim]`.
    pub d_out: &'a [f64],
    /// Cumulative query offsets.
    pub cu_seqlens_q: &'a [i32],
    /// Cumulative key offsets.
    pub cu_seqlens_k: &'a [i32],
    /// `(out, lse)` as a forward kernel saved them, or `None`: computed here, exactly.
    pub saved: Option<(&'a [f64], &'a [f64])>,
    /// Computes as a 16-bit framework does (PyTorch's bf16 autograd, FlashAttention's tensor
    /// cores): P and dS rounded to this dtype where they enter the products, each gradient
    /// rounded to it at the end. `None`: exact.
    pub rounded: Option<DType>,
}

/// The gradient of [`attention`]: `(dq, dk, dv)`, shaped as q, k and v. With the row's
/// `c_i` = scale times its temperature, over the allowed keys of row i (its q head's KV head):
/// `P_ij = exp(c_i <q_i, k_j> - lse_i)`, `dP_ij = <dO_i, v_j>`, `D_i = <dO_i, O_i>` (which is
/// `sum_j P_ij dP_ij` for the exact O) and `dS_ij = P_ij (dP_ij - D_i)`; then
/// `dq_i = c_i sum_j dS_ij k_j`, `dk_j = sum_i c_i dS_ij q_i`, `dv_j = sum_i P_ij dO_i`, the sums
/// over i running over every q head of k_j's group. A row with no allowed key contributes nothing.
///
/// With `rounded`, P and dS are rounded to that dtype where they enter the products and the
/// gradients at the end (the error a 16-bit computation makes; FlashAttention's test rule bounds
/// a kernel's error by twice it). With `saved` the output and log-sum-exp are the given ones (the state a backward kernel reads:
/// this is exactly what it computes, in f64); without, the exact ones, which makes this the
/// derivative of `<d_out, attention(q, k, v)>`.
pub fn attention_backward(
    inputs: &AttentionGradInputs<'_>,
    spec: &AttentionSpec,
) -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
    let AttentionGradInputs { q, k, v, d_out, cu_seqlens_q, cu_seqlens_k, saved, rounded } = *inputs;
    let round = |x: f64| rounded.map_or(x, |dt| round_to(dt, x));
    let AttentionSpec { q_heads, kv_heads, head_dim: d, mask, scale, temperature: temp } = *spec;
    let (exact_out, exact_lse);
    let (out, lse) = match saved {
        Some(s) => s,
        None => {
            (exact_out, exact_lse) = attention(q, k, v, cu_seqlens_q, cu_seqlens_k, spec)?;
            (&exact_out[..], &exact_lse[..])
        }
    };
    let total_q = *cu_seqlens_q.last().unwrap_or(&0) as usize;
    check_len("d_out", d_out.len(), total_q * q_heads * d)?;
    check_len("out", out.len(), total_q * q_heads * d)?;
    check_len("lse", lse.len(), total_q * q_heads)?;
    let group = q_heads / kv_heads;
    let (mut dq, mut dk, mut dv) = (vec![0.0; q.len()], vec![0.0; k.len()], vec![0.0; v.len()]);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f64>();
    let at = |row: usize, heads: usize, head: usize| (row * heads + head) * d..(row * heads + head + 1) * d;
    for b in 0..cu_seqlens_q.len() - 1 {
        let (q0, q1) = (cu_seqlens_q[b] as usize, cu_seqlens_q[b + 1] as usize);
        let (k0, k1) = (cu_seqlens_k[b] as usize, cu_seqlens_k[b + 1] as usize);
        let (q_len, k_len) = ((q1 - q0) as i64, (k1 - k0) as i64);
        for h in 0..q_heads {
            let kh = h / group;
            for i in 0..q_len {
                let pos = k_len - q_len + i;
                let row = q0 + i as usize;
                let c = scale * temp.map_or(1.0, |t| temperature(&t, pos));
                let (qv, go) = (&q[at(row, q_heads, h)], &d_out[at(row, q_heads, h)]);
                let l = lse[h * total_q + row];
                let delta = dot(go, &out[at(row, q_heads, h)]);
                for j in (0..k_len).filter(|&j| allowed(mask, pos, j, k_len)) {
                    let kr = at(k0 + j as usize, kv_heads, kh);
                    let p = (c * dot(qv, &k[kr.clone()]) - l).exp();
                    let ds = round(c * p * (dot(go, &v[kr.clone()]) - delta));
                    let pr = round(p);
                    for e in 0..d {
                        dq[row * q_heads * d + h * d + e] += ds * k[kr.start + e];
                        dk[kr.start + e] += ds * qv[e];
                        dv[kr.start + e] += pr * go[e];
                    }
                }
            }
        }
    }
    if rounded.is_some() {
        for x in dq.iter_mut().chain(dk.iter_mut()).chain(dv.iter_mut()) {
            *x = round(*x);
        }
    }
    Ok((dq, dk, dv))
}
