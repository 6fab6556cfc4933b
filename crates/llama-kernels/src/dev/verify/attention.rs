//! `verify` cases of prefill attention (contiguous and paged K/V).

use std::time::Instant;

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Comparison, Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::attention::{
    AttentionArgs, AttentionMask, AttentionOptions, AttentionTensors, AttentionWorkspace, KvInput, KvTensors,
    Llama4Temperature, Offsets,
};
use crate::reference;
use crate::tensor::Tensor;

// -------------------------------------------------------------------------------- Attention

/// An attention case: a varlen batch of (q_len, k_len) sequences.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionCase {
    pub dtype: DType,
    pub seqlens: Vec<(usize, usize)>,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub opts: AttentionOptions,
    pub with_lse: bool,
    /// q, k and v are views into one `[tokens, q_heads + 2 kv_heads, head_dim]` buffer (needs
    /// q_len == k_len for every sequence).
    pub fused_qkv: bool,
    /// Pass the sequence offsets as device tensors (`Offsets::Device`) instead of host slices.
    pub device_offsets: bool,
    /// Read K and V from a paged cache of this page size (scrambled pages) instead of tensors.
    pub paged: Option<usize>,
    pub seed: u64,
}

impl AttentionCase {
    pub fn new(
        dtype: DType,
        seqlens: &[(usize, usize)],
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        mask: AttentionMask,
    ) -> Self {
        AttentionCase {
            dtype,
            seqlens: seqlens.to_vec(),
            q_heads,
            kv_heads,
            head_dim,
            opts: AttentionOptions { mask, ..Default::default() },
            with_lse: true,
            fused_qkv: false,
            device_offsets: false,
            paged: None,
            seed: 9,
        }
    }
    /// One sequence of `len` queries and keys.
    pub fn single(
        dtype: DType,
        len: usize,
        q_heads: usize,
        kv_heads: usize,
        head_dim: usize,
        mask: AttentionMask,
    ) -> Self {
        Self::new(dtype, &[(len, len)], q_heads, kv_heads, head_dim, mask)
    }
}

/// Tolerances for attention outputs: the output is a convex combination of V with P rounded to
/// the storage type for the P V product (as in FlashAttention), so a few units of roundoff of
/// that type, relative to |V| ~ 1, plus the output rounding.
pub fn attention_tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { atol: 1e-5, rtol: 1e-5 },
        _ => Tolerance { atol: 4.0 * dtype.unit_roundoff(), rtol: 2.0 * dtype.unit_roundoff() },
    }
}

/// A batch of equal sequences (`batch` x `seq` tokens, q_len = k_len) checked on a sample:
/// the kernel's output `out` against the f64 reference on `rows` (token, head) rows, for shapes
/// whose whole reference would take too long (the benches check their output with it before they
/// report a speed). `q`, `k`, `v` are the inputs' values (`[batch * seq, heads, head_dim]`), as
/// the kernel read them; the scale is 1/sqrt(head_dim), no temperature.
#[derive(Clone, Copy, Debug)]
pub struct SampledAttention<'a> {
    pub q: &'a [f32],
    pub k: &'a [f32],
    pub v: &'a [f32],
    pub out: &'a [f32],
    pub batch: usize,
    pub seq: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub mask: AttentionMask,
}

impl SampledAttention<'_> {
    /// Compares `rows` sampled rows (each sequence's first and last token among them) with the
    /// reference at [`attention_tolerance`] of `dtype`; the comparison's shape is `[rows, head_dim]`.
    /// Inputs whose lengths disagree with the shape fail the comparison (nothing compared).
    pub fn check(&self, rows: usize, dtype: DType, seed: u64) -> Comparison {
        let (d, seq) = (self.head_dim, self.seq);
        let tokens = self.batch * seq;
        let consistent = d > 0
            && seq > 0
            && self.kv_heads > 0
            && self.q_heads % self.kv_heads == 0
            && self.q.len() == tokens * self.q_heads * d
            && self.out.len() == self.q.len()
            && self.k.len() == tokens * self.kv_heads * d
            && self.v.len() == self.k.len();
        if !consistent {
            return compare(&[], &[0.0], attention_tolerance(dtype));
        }
        let group = (self.q_heads / self.kv_heads.max(1)).max(1);
        let scale = 1.0 / (d as f64).sqrt();
        let mut rng = Rng::new(seed);
        let (mut got, mut want) = (Vec::new(), Vec::new());
        for i in 0..rows {
            let b = i % self.batch.max(1);
            let t = match i % 3 {
                0 => 0,
                1 => seq - 1,
                _ => rng.below(seq as u64) as usize,
            };
            let h = rng.below(self.q_heads as u64) as usize;
            let kv = h / group;
            let row = (b * seq + t) * self.q_heads + h;
            let qrow = &self.q[row * d..(row + 1) * d];
            let mut scores = Vec::new();
            for j in 0..seq {
                if reference::attention::allowed(self.mask, t as i64, j as i64, seq as i64) {
                    let kr = &self.k[((b * seq + j) * self.kv_heads + kv) * d..][..d];
                    let dot: f64 = qrow.iter().zip(kr).map(|(&a, &c)| f64::from(a) * f64::from(c)).sum();
                    scores.push((j, dot * scale));
                }
            }
            let m = scores.iter().map(|s| s.1).fold(f64::NEG_INFINITY, f64::max);
            let z: f64 = scores.iter().map(|s| (s.1 - m).exp()).sum();
            let mut o = vec![0f64; d];
            for &(j, sc) in &scores {
                let p = (sc - m).exp() / z;
                let vr = &self.v[((b * seq + j) * self.kv_heads + kv) * d..][..d];
                for (acc, &x) in o.iter_mut().zip(vr) {
                    *acc += p * f64::from(x);
                }
            }
            want.extend(o);
            got.extend(self.out[row * d..(row + 1) * d].iter().map(|&x| f64::from(x)));
        }
        compare(&got, &want, attention_tolerance(dtype))
    }
}

/// Tolerance for the f32 log-sum-exp.
pub const LSE_TOLERANCE: Tolerance = Tolerance { atol: 1e-4, rtol: 1e-5 };

pub fn attention_case(device: &Device, case: &AttentionCase) -> Result<CaseResult> {
    let AttentionCase { dtype, q_heads, kv_heads, head_dim: d, opts, with_lse, device_offsets, paged, .. } = *case;
    let CaseInputs { cu_q, cu_k, tq, tk, mut rng, q, k, v } = case_inputs(case);
    let (qt, kt, vt) = qkv_tensors(device, case, [&q, &k, &v], tq, tk)?;
    let out = Tensor::poisoned(device, dtype, &[tq, q_heads, d])?;
    let lse = if with_lse { Some(Tensor::poisoned(device, DType::F32, &[q_heads, tq])?) } else { None };
    let mut ws = AttentionWorkspace::new(device);
    let start = Instant::now();
    if let Some(page_size) = paged {
        let kv = PagedInputs { k: &k, v: &v, cu_q: &cu_q, cu_k: &cu_k, kv_heads, head_dim: d, page_size };
        run_paged(device, &mut ws, case, &kv, &mut rng, &qt, &out, lse.as_ref())?;
    }
    if paged.is_some() {
        // (ran above: the pool and table live in that scope)
    } else if device_offsets {
        let cq = Tensor::from_slice(device, &cu_q, &[cu_q.len()])?;
        let ck = Tensor::from_slice(device, &cu_k, &[cu_k.len()])?;
        let kv = KvTensors::Contiguous { k: &kt, v: &vt };
        let cu_seqlens = Offsets::Device { q: &cq, k: &ck };
        ws.forward(AttentionTensors { q: &qt, kv, cu_seqlens, out: &out, lse: lse.as_ref() }, &opts)?;
    } else {
        let (kv, cu_seqlens) = (KvTensors::Contiguous { k: &kt, v: &vt }, Offsets::Host { q: &cu_q, k: &cu_k });
        ws.forward(AttentionTensors { q: &qt, kv, cu_seqlens, out: &out, lse: lse.as_ref() }, &opts)?;
    }
    device.synchronize()?;
    ws.check_errors()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let spec = reference::attention::AttentionSpec {
        q_heads,
        kv_heads,
        head_dim: d,
        mask: opts.mask,
        scale: f64::from(opts.scale.unwrap_or(1.0 / (d as f32).sqrt())),
        temperature: opts.temperature,
    };
    let (oref, lref) = reference::attention::attention(&q, &k, &v, &cu_q, &cu_k, &spec)?;
    let og = out.to_f64_vec()?;
    let mut parts = vec![(compare(&og, &oref, attention_tolerance(dtype)), vec![tq, q_heads, d])];
    let mut outputs = vec![og];
    if let Some(l) = &lse {
        let lg = l.to_f64_vec()?;
        parts.push((compare(&lg, &lref, LSE_TOLERANCE), vec![q_heads, tq]));
        outputs.push(lg);
    }
    let (comparison, worst_shape) = worst_of(parts);
    Ok(CaseResult {
        op: match crate::ops::attention::prefill_kernel(device, dtype, d, paged.is_some()) {
            crate::ops::attention::PrefillKernel::Hopper => "gqa_attention sm90".into(),
            _ => "gqa_attention".into(),
        },
        dtype,
        shape: case_label(case, tq, tk),
        pass: comparison.pass,
        comparison,
        worst_shape,
        gaps_untouched: true,
        millis,
        outputs,
    })
}

/// The seeded inputs of a case: offsets, token totals, q, k and v (rounded to the dtype), and
/// the generator for whatever else the case draws.
pub(crate) struct CaseInputs {
    pub cu_q: Vec<i32>,
    pub cu_k: Vec<i32>,
    pub tq: usize,
    pub tk: usize,
    pub rng: Rng,
    pub q: Vec<f64>,
    pub k: Vec<f64>,
    pub v: Vec<f64>,
}

pub(crate) fn case_inputs(case: &AttentionCase) -> CaseInputs {
    let AttentionCase { dtype, ref seqlens, q_heads, kv_heads, head_dim: d, seed, .. } = *case;
    let mut cu_q = vec![0i32];
    let mut cu_k = vec![0i32];
    for &(ql, kl) in seqlens {
        cu_q.push(cu_q[cu_q.len() - 1] + ql as i32);
        cu_k.push(cu_k[cu_k.len() - 1] + kl as i32);
    }
    let (tq, tk) = (cu_q[cu_q.len() - 1] as usize, cu_k[cu_k.len() - 1] as usize);
    let mut rng = Rng::new(seed ^ (tq as u64) << 20 ^ (d as u64) << 40 ^ (q_heads as u64) << 8);
    let q = rng.normal_vec(tq * q_heads * d, 1.0, dtype);
    let k = rng.normal_vec(tk * kv_heads * d, 1.0, dtype);
    let v = rng.normal_vec(tk * kv_heads * d, 1.0, dtype);
    CaseInputs { cu_q, cu_k, tq, tk, rng, q, k, v }
}

/// Tensors holding `[q, k, v]`-shaped values: three contiguous tensors, or (`fused_qkv`) views
/// into one fused QKV buffer.
pub(crate) fn qkv_tensors(
    device: &Device,
    case: &AttentionCase,
    [q, k, v]: [&[f64]; 3],
    tq: usize,
    tk: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let AttentionCase { dtype, q_heads, kv_heads, head_dim: d, fused_qkv, .. } = *case;
    if fused_qkv {
        if tq != tk {
            return Err(crate::Error::invalid("verify", "fused_qkv", "q_len != k_len", "needs q_len == k_len"));
        }
        return fused_qkv_views(device, dtype, [q, k, v], tq, q_heads, kv_heads, d);
    }
    Ok((
        Tensor::from_f64(device, dtype, q, &[tq, q_heads, d])?,
        Tensor::from_f64(device, dtype, k, &[tk, kv_heads, d])?,
        Tensor::from_f64(device, dtype, v, &[tk, kv_heads, d])?,
    ))
}

/// The host data of a paged case: K and V (contiguous), the offsets, and the pool geometry.
struct PagedInputs<'a> {
    k: &'a [f64],
    v: &'a [f64],
    cu_q: &'a [i32],
    cu_k: &'a [i32],
    kv_heads: usize,
    head_dim: usize,
    page_size: usize,
}

/// Runs a paged case: each sequence's keys on its own pages, in scrambled order (the contiguous
/// K/V tensors go unused).
#[allow(clippy::too_many_arguments)]
fn run_paged(
    device: &Device,
    ws: &mut AttentionWorkspace,
    case: &AttentionCase,
    inputs: &PagedInputs<'_>,
    rng: &mut Rng,
    qt: &Tensor,
    out: &Tensor,
    lse: Option<&Tensor>,
) -> Result<()> {
    let AttentionCase { dtype, ref seqlens, opts, device_offsets, .. } = *case;
    let PagedInputs { k, v, cu_q, cu_k, kv_heads, head_dim: d, page_size } = *inputs;
    // Each sequence's keys on its own pages, in scrambled order; the contiguous K/V go unused.
    let pages: Vec<usize> = seqlens.iter().map(|s| s.1.div_ceil(page_size)).collect();
    let width = pages.iter().copied().max().unwrap_or(0).max(1);
    let num_pages = pages.iter().sum::<usize>() + 1;
    let mut ids: Vec<i32> = (0..num_pages as i32).collect();
    for i in (1..ids.len()).rev() {
        ids.swap(i, rng.below(i as u64 + 1) as usize);
    }
    let row = kv_heads * d;
    let mut kp = rng.normal_vec(num_pages * page_size * row, 1.0, dtype);
    let mut vp = rng.normal_vec(num_pages * page_size * row, 1.0, dtype);
    let mut table = vec![-1i32; seqlens.len() * width];
    let mut next = 0;
    for (b, &(_, kl)) in seqlens.iter().enumerate() {
        for j in 0..pages[b] {
            table[b * width + j] = ids[next];
            next += 1;
        }
        for key in 0..kl {
            let slot = table[b * width + key / page_size] as usize * page_size + key % page_size;
            let src = (cu_k[b] as usize + key) * row;
            kp[slot * row..(slot + 1) * row].copy_from_slice(&k[src..src + row]);
            vp[slot * row..(slot + 1) * row].copy_from_slice(&v[src..src + row]);
        }
    }
    let shape = [num_pages, page_size, kv_heads, d];
    let (kpt, vpt) = (Tensor::from_f64(device, dtype, &kp, &shape)?, Tensor::from_f64(device, dtype, &vp, &shape)?);
    let tt = Tensor::from_slice(device, &table, &[seqlens.len(), width])?;
    let (kv, vv) = (kpt.view(), vpt.view());
    let scales = crate::ops::attention::KvScales::default();
    let kv = crate::ops::attention::PagedKvView { k_pages: &kv, v_pages: &vv, scales: &scales };
    let (cq, ck) = (Tensor::from_slice(device, cu_q, &[cu_q.len()])?, Tensor::from_slice(device, cu_k, &[cu_k.len()])?);
    let (cqv, ckv) = (cq.view(), ck.view());
    let cu = if device_offsets {
        crate::ops::attention::CuSeqlens::Device { q: &cqv, k: &ckv }
    } else {
        crate::ops::attention::CuSeqlens::Host { q: cu_q, k: cu_k }
    };
    let (q, table) = (qt.view(), tt.view());
    let (mut out, mut lse) = (out.view_mut(), lse.map(Tensor::view_mut));
    let kv = KvInput::Paged { kv: &kv, block_table: &table };
    ws.forward_on(device, AttentionArgs { q: &q, kv, cu_seqlens: cu, out: &mut out, lse: lse.as_mut() }, &opts)?;
    Ok(())
}

/// The `verify` row's shape text of a case.
pub(crate) fn case_label(case: &AttentionCase, tq: usize, tk: usize) -> String {
    let AttentionCase { ref seqlens, q_heads, kv_heads, head_dim: d, opts, fused_qkv, device_offsets, paged, .. } =
        *case;
    let mask = match opts.mask {
        AttentionMask::None => "full".to_string(),
        AttentionMask::Causal => "causal".to_string(),
        AttentionMask::ChunkedCausal { chunk_size } => format!("chunk {chunk_size}"),
    };
    let lens = if seqlens.len() == 1 && seqlens[0].0 == seqlens[0].1 {
        format!("s{}", seqlens[0].0)
    } else {
        format!("{} seqs q{tq}/k{tk}", seqlens.len())
    };
    format!(
        "{lens} {q_heads}/{kv_heads}x{d} {mask}{}{}",
        if opts.temperature.is_some() { " +temp" } else { "" },
        if fused_qkv { " qkv" } else { "" },
    ) + if device_offsets { " dev-cu" } else { "" }
        + &paged.map_or(String::new(), |p| format!(" paged p{p}"))
}

pub fn attention_cases(quick: bool) -> Vec<AttentionCase> {
    let len = if quick { 65 } else { 1024 };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(AttentionCase::single(dtype, len, 8, 2, 128, AttentionMask::Causal));
        v.push(AttentionCase::single(dtype, len, 4, 4, 64, AttentionMask::None));
        v.push(AttentionCase::new(dtype, &[(17, 40), (0, 5), (33, 33)], 8, 1, 128, AttentionMask::Causal));
        let mut device_offsets =
            AttentionCase::new(dtype, &[(9, 20), (0, 3), (40, 40)], 8, 2, 64, AttentionMask::Causal);
        device_offsets.device_offsets = true;
        v.push(device_offsets);
        let mut chunked = AttentionCase::single(dtype, len, 4, 1, 64, AttentionMask::ChunkedCausal { chunk_size: 16 });
        chunked.opts.temperature = Some(Llama4Temperature { floor_scale: 8.0, attn_scale: 0.1 });
        v.push(chunked);
        // Chunked prefill after a cached prefix, K/V read from the paged cache.
        let mut paged = AttentionCase::new(dtype, &[(17, 60), (0, 5), (33, 33)], 8, 2, 128, AttentionMask::Causal);
        paged.paged = Some(16);
        v.push(paged);
    }
    v
}
