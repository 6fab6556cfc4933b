//! The main job: run every op on a device and check it against the reference.
//!
//! Each case builds seeded random inputs, poisons its outputs (0xFF bytes: NaN), runs the kernel
//! through the public API, and compares every output with the f64 reference under a per-dtype
//! tolerance. Strided cases put the rows inside a wider poisoned buffer and also check that the
//! gaps between rows were not written. The same case functions back the test suite.

use std::time::Instant;

use crate::backend::Device;
use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::ops::attention::{AttentionMask, AttentionOptions, AttentionWorkspace, Llama4Temperature};
use crate::ops::rope::{Rope, RopeConfig, RopeLayout};
use crate::ops::swiglu::GateUp;
use crate::reference;
use crate::tensor::Tensor;
use crate::testing::{Comparison, Rng, Tolerance, compare};

#[path = "verify_paged.rs"]
mod paged;
pub use paged::*;
mod moe;
pub use moe::*;

/// One checked case: a row of the `verify` table.
#[derive(Clone, Debug)]
pub struct CaseResult {
    pub op: String,
    pub dtype: DType,
    pub shape: String,
    /// The worst of the case's outputs.
    pub comparison: Comparison,
    /// Shape used to name the worst element.
    pub worst_shape: Vec<usize>,
    /// Every gap between strided rows still holds its poison.
    pub gaps_untouched: bool,
    pub pass: bool,
    /// Wall time of the launch(es), including the wait for completion.
    pub millis: f64,
    /// Raw outputs, for bit-for-bit comparison across schedules.
    pub outputs: Vec<Vec<f64>>,
}

impl CaseResult {
    pub fn describe(&self) -> String {
        let gaps = if self.gaps_untouched { "" } else { "; WROTE OUTSIDE ITS ROWS" };
        format!("{} {} {}: {}{gaps}", self.op, self.dtype, self.shape, self.comparison.describe(&self.worst_shape))
    }
}

/// Merges the comparisons of several outputs into the worst one.
fn worst_of(parts: Vec<(Comparison, Vec<usize>)>) -> (Comparison, Vec<usize>) {
    let pass = parts.iter().all(|(c, _)| c.pass);
    let max_abs = parts.iter().map(|(c, _)| c.max_abs).fold(0.0, f64::max);
    let max_rel = parts.iter().map(|(c, _)| c.max_rel).fold(0.0, f64::max);
    let (mut c, shape) = parts
        .into_iter()
        .max_by(|a, b| a.0.worst_ratio.total_cmp(&b.0.worst_ratio))
        .unwrap_or_else(|| (compare(&[], &[], Tolerance { atol: 0.0, rtol: 0.0 }), vec![]));
    c.pass = pass;
    c.max_abs = max_abs;
    c.max_rel = max_rel;
    (c, shape)
}

/// A `[rows, cols]` tensor holding `data`, either contiguous or as a view into a wider buffer
/// of `cols + pad` columns whose extra columns are poisoned. Returns (view, backing buffer).
pub fn rows_tensor(
    device: &Device,
    dtype: DType,
    data: &[f64],
    rows: usize,
    cols: usize,
    pad: usize,
) -> Result<(Tensor, Tensor)> {
    let full = Tensor::poisoned(device, dtype, &[rows, cols + pad])?;
    let view = full.narrow(1, 0, cols)?;
    view.copy_from_f64(data)?;
    Ok((view, full))
}

/// q, k and v (contiguous `[tokens, heads, d]` values) packed per token into one
/// `[tokens, q_heads + 2 kv_heads, d]` buffer, as a fused QKV projection writes them; returns
/// the three views into it.
fn fused_qkv_views(
    device: &Device,
    dtype: DType,
    [q, k, v]: [&[f64]; 3],
    tokens: usize,
    q_heads: usize,
    kv_heads: usize,
    d: usize,
) -> Result<(Tensor, Tensor, Tensor)> {
    let heads = q_heads + 2 * kv_heads;
    let mut all = Vec::with_capacity(tokens * heads * d);
    for t in 0..tokens {
        all.extend_from_slice(&q[t * q_heads * d..(t + 1) * q_heads * d]);
        all.extend_from_slice(&k[t * kv_heads * d..(t + 1) * kv_heads * d]);
        all.extend_from_slice(&v[t * kv_heads * d..(t + 1) * kv_heads * d]);
    }
    let buf = Tensor::from_f64(device, dtype, &all, &[tokens, heads, d])?;
    Ok((buf.narrow(1, 0, q_heads)?, buf.narrow(1, q_heads, kv_heads)?, buf.narrow(1, q_heads + kv_heads, kv_heads)?))
}

/// Whether every element of `full` outside its first `cols` columns is still NaN (poison).
pub fn gaps_poisoned(full: &Tensor, cols: usize) -> Result<bool> {
    let width = *full.shape().last().unwrap_or(&0);
    Ok(full.to_f64_vec()?.iter().enumerate().all(|(i, v)| i % width.max(1) < cols || v.is_nan()))
}

/// An RMSNorm case.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RmsNormCase {
    pub dtype: DType,
    pub rows: usize,
    pub hidden: usize,
    /// Also add a residual (fused_add_rms_norm).
    pub fused: bool,
    /// Extra elements between rows of every row tensor (0: contiguous).
    pub pad: usize,
    pub seed: u64,
}

impl RmsNormCase {
    pub fn new(dtype: DType, rows: usize, hidden: usize, fused: bool) -> Self {
        RmsNormCase { dtype, rows, hidden, fused, pad: 0, seed: 1 }
    }
    pub fn strided(self, pad: usize) -> Self {
        RmsNormCase { pad, ..self }
    }
}

pub const RMS_NORM_EPS: f32 = 1e-5;

/// Runs one RMSNorm case on `device` and checks it against the reference.
pub fn rms_norm_case(device: &Device, case: RmsNormCase) -> Result<CaseResult> {
    let RmsNormCase { dtype, rows, hidden, fused, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (rows as u64) << 20 ^ (hidden as u64) << 40 ^ u64::from(fused));
    let x = rng.normal_vec(rows * hidden, 1.0, dtype);
    let res = rng.normal_vec(rows * hidden, 1.0, dtype);
    let w = rng.uniform_vec(hidden, 0.5, 1.5, dtype);
    let (xt, _xfull) = rows_tensor(device, dtype, &x, rows, hidden, pad)?;
    let (rt, rfull) = rows_tensor(device, dtype, &res, rows, hidden, pad)?;
    let wt = Tensor::from_f64(device, dtype, &w, &[hidden])?;
    let yfull = Tensor::poisoned(device, dtype, &[rows, hidden + pad])?;
    let yt = yfull.narrow(1, 0, hidden)?;

    let start = Instant::now();
    if fused {
        ops::fused_add_rms_norm(&xt, &rt, &wt, RMS_NORM_EPS, &yt)?;
    } else {
        ops::rms_norm(&xt, &wt, RMS_NORM_EPS, &yt)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let tol = Tolerance::rounded_output(dtype);
    let y = yt.to_f64_vec()?;
    let shape = vec![rows, hidden];
    let mut parts = Vec::new();
    let mut outputs = vec![y.clone()];
    let mut gaps = gaps_poisoned(&yfull, hidden)?;
    if fused {
        let (sum, yref) =
            reference::rms_norm::fused_add_rms_norm(&x, &res, &w, hidden, f64::from(RMS_NORM_EPS), dtype)?;
        let s = rt.to_f64_vec()?;
        parts.push((compare(&s, &sum, tol), shape.clone()));
        parts.push((compare(&y, &yref, tol), shape.clone()));
        outputs.push(s);
        if pad > 0 {
            gaps &= gaps_poisoned(&rfull, hidden)?;
        }
    } else {
        let yref = reference::rms_norm::rms_norm(&x, &w, hidden, f64::from(RMS_NORM_EPS))?;
        parts.push((compare(&y, &yref, tol), shape.clone()));
    }
    let (comparison, worst_shape) = worst_of(parts);
    Ok(CaseResult {
        op: if fused { "fused_add_rms_norm" } else { "rms_norm" }.into(),
        dtype,
        shape: if pad > 0 {
            format!("{rows}x{hidden} (row stride {})", hidden + pad)
        } else {
            format!("{rows}x{hidden}")
        },
        pass: comparison.pass && gaps,
        comparison,
        worst_shape,
        gaps_untouched: gaps,
        millis,
        outputs,
    })
}

/// The cases `verify` runs. `quick` keeps shapes small enough for the emulated target.
pub fn rms_norm_cases(quick: bool) -> Vec<RmsNormCase> {
    let shapes: &[(usize, usize)] = if quick {
        &[(1, 4096), (7, 769), (83, 768), (16, 8192)]
    } else {
        &[(1, 4096), (7, 769), (83, 768), (4096, 4096), (1024, 8192)]
    };
    let mut v = Vec::new();
    for fused in [false, true] {
        for dtype in DType::FLOATS {
            for &(rows, hidden) in shapes {
                v.push(RmsNormCase::new(dtype, rows, hidden, fused));
            }
            v.push(RmsNormCase::new(dtype, 33, 4096, fused).strided(8));
        }
    }
    v
}

/// One `verify` row: the case's debug text, or the error that stopped it.
pub type Outcome = std::result::Result<CaseResult, (String, crate::Error)>;

fn outcome<C: std::fmt::Debug + Copy>(case: C, r: Result<CaseResult>) -> Outcome {
    r.map_err(|e| (format!("{case:?}"), e))
}

/// Runs every case on `device`. Errors (a failed launch) become failing rows, not aborts.
pub fn run_all(device: &Device, quick: bool) -> Vec<Outcome> {
    let mut out: Vec<Outcome> =
        rms_norm_cases(quick).into_iter().map(|c| outcome(c, rms_norm_case(device, c))).collect();
    out.extend(rope_cases(quick).into_iter().map(|c| outcome(c, rope_case(device, c))));
    out.extend(swiglu_cases(quick).into_iter().map(|c| outcome(c, swiglu_case(device, c))));
    out.extend(
        attention_cases(quick).into_iter().map(|c| attention_case(device, &c).map_err(|e| (format!("{c:?}"), e))),
    );
    let (append, decode) = paged_cases(quick);
    out.extend(append.into_iter().map(|c| kv_append_case(device, &c).map_err(|e| (format!("{c:?}"), e))));
    out.extend(decode.into_iter().map(|c| paged_decode_case(device, &c).map_err(|e| (format!("{c:?}"), e))));
    out.extend(moe_cases(device, quick));
    out
}

// ------------------------------------------------------------------------------------- RoPE

/// A RoPE case: q and k rotated in place at seeded random positions (plus the edge positions
/// 0, 1, 8191, 8192, 30000 and 131071 when there are enough tokens).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RopeCase {
    pub dtype: DType,
    pub tokens: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub config: RopeConfig,
    /// Positions as i64 (else i32).
    pub i64_positions: bool,
    /// q, k (and an untouched v) are views into one `[tokens, q_heads + 2 kv_heads, head_dim]`
    /// buffer, as a fused QKV projection produces.
    pub fused_qkv: bool,
    /// Largest random position (exclusive).
    pub max_position: i64,
    pub seed: u64,
}

impl RopeCase {
    pub fn new(dtype: DType, tokens: usize, q_heads: usize, kv_heads: usize, config: RopeConfig) -> Self {
        RopeCase {
            dtype,
            tokens,
            q_heads,
            kv_heads,
            config,
            i64_positions: false,
            fused_qkv: false,
            max_position: 131_072,
            seed: 3,
        }
    }
}

/// Tolerance for RoPE outputs: the rounded output plus a few f32 ulps of angle error.
pub fn rope_tolerance(dtype: DType) -> Tolerance {
    match dtype {
        DType::F32 => Tolerance { atol: 4e-6, rtol: 4e-6 },
        _ => Tolerance::rounded_output(dtype),
    }
}

/// The positions of a case: edge positions first, then seeded random ones.
pub fn rope_positions(tokens: usize, max_position: i64, rng: &mut Rng) -> Vec<i64> {
    const EDGES: [i64; 6] = [0, 1, 8191, 8192, 30000, 131_071];
    (0..tokens)
        .map(|t| match EDGES.get(t) {
            Some(&e) if e < max_position => e,
            _ => rng.below(max_position.max(1) as u64) as i64,
        })
        .collect()
}

pub fn rope_case(device: &Device, case: RopeCase) -> Result<CaseResult> {
    let RopeCase { dtype, tokens, q_heads, kv_heads, config, i64_positions, fused_qkv, max_position, seed } = case;
    let d = config.head_dim;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 16 ^ (d as u64) << 32);
    let q = rng.normal_vec(tokens * q_heads * d, 1.0, dtype);
    let k = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    let pos = rope_positions(tokens, max_position, &mut rng);
    let positions = if i64_positions {
        Tensor::from_slice(device, &pos, &[tokens])?
    } else {
        Tensor::from_slice(device, &pos.iter().map(|&p| p as i32).collect::<Vec<_>>(), &[tokens])?
    };
    let rope = Rope::new(device, config)?;
    let (qt, kt, qkv) = if fused_qkv {
        let v = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
        let (qt, kt, vt) = fused_qkv_views(device, dtype, [&q, &k, &v], tokens, q_heads, kv_heads, d)?;
        (qt, kt, Some((vt, v)))
    } else {
        (
            Tensor::from_f64(device, dtype, &q, &[tokens, q_heads, d])?,
            Tensor::from_f64(device, dtype, &k, &[tokens, kv_heads, d])?,
            None,
        )
    };
    let start = Instant::now();
    rope.apply(&qt, Some(&kt), &positions)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let tol = rope_tolerance(dtype);
    let (qg, kg) = (qt.to_f64_vec()?, kt.to_f64_vec()?);
    let qref = reference::rope::rope(&q, q_heads, &pos, &config)?;
    let kref = reference::rope::rope(&k, kv_heads, &pos, &config)?;
    let mut parts = vec![
        (compare(&qg, &qref, tol), vec![tokens, q_heads, d]),
        (compare(&kg, &kref, tol), vec![tokens, kv_heads, d]),
    ];
    let mut untouched = true;
    if let Some((vt, v)) = qkv {
        let vg = vt.to_f64_vec()?;
        untouched = vg.iter().zip(&v).all(|(a, b)| a.to_bits() == b.to_bits());
        parts.push((compare(&vg, &v, Tolerance { atol: 0.0, rtol: 0.0 }), vec![tokens, kv_heads, d]));
    }
    let (comparison, worst_shape) = worst_of(parts);
    let layout = match config.layout {
        RopeLayout::Interleaved => "interleaved",
        RopeLayout::HalfSplit => "half-split",
    };
    let mut shape = format!("{tokens}x({q_heads}+{kv_heads})x{d} {layout}");
    if config.rotary_dim != d {
        shape += &format!(" rot {}", config.rotary_dim);
    }
    if config.qk_norm_eps.is_some() {
        shape += " +norm";
    }
    if fused_qkv {
        shape += " qkv";
    }
    Ok(CaseResult {
        op: "rope".into(),
        dtype,
        shape,
        pass: comparison.pass && untouched,
        comparison,
        worst_shape,
        gaps_untouched: untouched,
        millis,
        outputs: vec![qg, kg],
    })
}

/// The RoPE cases `verify` runs.
pub fn rope_cases(quick: bool) -> Vec<RopeCase> {
    let tokens = if quick { 16 } else { 512 };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(RopeCase::new(dtype, tokens, 32, 8, RopeConfig::llama3_1(128)));
        v.push(RopeCase {
            fused_qkv: true,
            i64_positions: true,
            ..RopeCase::new(dtype, tokens, 40, 8, RopeConfig::llama4_scout(128))
        });
        let partial = RopeConfig { rotary_dim: 50, scaling: None, theta: 10_000.0, ..RopeConfig::llama3_1(64) };
        v.push(RopeCase::new(dtype, tokens, 4, 4, partial));
    }
    v
}

// ----------------------------------------------------------------------------------- SwiGLU

/// How a SwiGLU case passes its input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwiGluInput {
    Separate,
    GateThenUp,
    Interleaved,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SwiGluCase {
    pub dtype: DType,
    pub tokens: usize,
    pub d: usize,
    pub input: SwiGluInput,
    /// Write the output over the gate (Separate and GateThenUp only).
    pub in_place: bool,
    /// Extra elements between rows of the separate inputs and the output.
    pub pad: usize,
    pub seed: u64,
}

impl SwiGluCase {
    pub fn new(dtype: DType, tokens: usize, d: usize, input: SwiGluInput) -> Self {
        SwiGluCase { dtype, tokens, d, input, in_place: false, pad: 0, seed: 5 }
    }
}

pub fn swiglu_case(device: &Device, case: SwiGluCase) -> Result<CaseResult> {
    let SwiGluCase { dtype, tokens, d, input, in_place, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 16 ^ (d as u64) << 32);
    let gate = rng.normal_vec(tokens * d, 2.0, dtype);
    let up = rng.normal_vec(tokens * d, 1.0, dtype);
    let expected = reference::swiglu::swiglu(&gate, &up)?;
    let packed = |interleaved: bool| -> Vec<f64> {
        (0..tokens)
            .flat_map(|t| {
                let (g, u) = (&gate[t * d..(t + 1) * d], &up[t * d..(t + 1) * d]);
                if interleaved {
                    g.iter().zip(u).flat_map(|(&a, &b)| [a, b]).collect::<Vec<_>>()
                } else {
                    [g, u].concat()
                }
            })
            .collect()
    };
    let (outfull, out, millis);
    match input {
        SwiGluInput::Separate => {
            let (gt, gfull) = rows_tensor(device, dtype, &gate, tokens, d, pad)?;
            let (ut, _ufull) = rows_tensor(device, dtype, &up, tokens, d, pad)?;
            if in_place {
                (outfull, out) = (gfull, gt.clone());
            } else {
                outfull = Tensor::poisoned(device, dtype, &[tokens, d + pad])?;
                out = outfull.narrow(1, 0, d)?;
            }
            let start = Instant::now();
            ops::swiglu(GateUp::Separate { gate: &gt, up: &ut }, &out)?;
            device.synchronize()?;
            millis = start.elapsed().as_secs_f64() * 1e3;
        }
        SwiGluInput::GateThenUp | SwiGluInput::Interleaved => {
            let interleaved = input == SwiGluInput::Interleaved;
            let buf = Tensor::from_f64(device, dtype, &packed(interleaved), &[tokens, 2 * d])?;
            if in_place && !interleaved {
                (outfull, out) = (buf.clone(), buf.narrow(1, 0, d)?);
            } else {
                outfull = Tensor::poisoned(device, dtype, &[tokens, d + pad])?;
                out = outfull.narrow(1, 0, d)?;
            }
            let gu = if interleaved { GateUp::Interleaved(&buf) } else { GateUp::GateThenUp(&buf) };
            let start = Instant::now();
            ops::swiglu(gu, &out)?;
            device.synchronize()?;
            millis = start.elapsed().as_secs_f64() * 1e3;
        }
    }
    let got = out.to_f64_vec()?;
    let gaps = in_place || gaps_poisoned(&outfull, d)?;
    let comparison = compare(&got, &expected, Tolerance::rounded_output(dtype));
    let name = match input {
        SwiGluInput::Separate => "separate",
        SwiGluInput::GateThenUp => "packed",
        SwiGluInput::Interleaved => "interleaved",
    };
    Ok(CaseResult {
        op: "swiglu".into(),
        dtype,
        shape: format!(
            "{tokens}x{d} {name}{}{}",
            if in_place { " in-place" } else { "" },
            if pad > 0 { " strided" } else { "" }
        ),
        pass: comparison.pass && gaps,
        comparison,
        worst_shape: vec![tokens, d],
        gaps_untouched: gaps,
        millis,
        outputs: vec![got],
    })
}

/// The SwiGLU cases `verify` runs (Llama 3 8B's ffn is 14336).
pub fn swiglu_cases(quick: bool) -> Vec<SwiGluCase> {
    let tokens = if quick { 8 } else { 512 };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(SwiGluCase::new(dtype, tokens, 14336, SwiGluInput::GateThenUp));
        v.push(SwiGluCase::new(dtype, tokens, 769, SwiGluInput::Separate));
        v.push(SwiGluCase::new(dtype, tokens, 1024, SwiGluInput::Interleaved));
    }
    v
}

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
    /// Pass the sequence offsets as device tensors (`forward_device`) instead of host slices.
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

/// Tolerance for the f32 log-sum-exp.
pub const LSE_TOLERANCE: Tolerance = Tolerance { atol: 1e-4, rtol: 1e-5 };

pub fn attention_case(device: &Device, case: &AttentionCase) -> Result<CaseResult> {
    let AttentionCase {
        dtype,
        ref seqlens,
        q_heads,
        kv_heads,
        head_dim: d,
        opts,
        with_lse,
        fused_qkv,
        device_offsets,
        paged,
        seed,
    } = *case;
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
    let (qt, kt, vt) = if fused_qkv {
        if tq != tk {
            return Err(crate::Error::invalid("verify", "fused_qkv", "q_len != k_len", "needs q_len == k_len"));
        }
        fused_qkv_views(device, dtype, [&q, &k, &v], tq, q_heads, kv_heads, d)?
    } else {
        (
            Tensor::from_f64(device, dtype, &q, &[tq, q_heads, d])?,
            Tensor::from_f64(device, dtype, &k, &[tk, kv_heads, d])?,
            Tensor::from_f64(device, dtype, &v, &[tk, kv_heads, d])?,
        )
    };
    let out = Tensor::poisoned(device, dtype, &[tq, q_heads, d])?;
    let lse = if with_lse { Some(Tensor::poisoned(device, DType::F32, &[q_heads, tq])?) } else { None };
    let mut ws = AttentionWorkspace::new(device);
    let start = Instant::now();
    if let Some(page_size) = paged {
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
        let scales = crate::ops::paged_attention::KvScales::default();
        let kv = crate::ops::paged_attention::PagedKv { k_pages: &kv, v_pages: &vv, scales: &scales };
        let (cq, ck) =
            (Tensor::from_slice(device, &cu_q, &[cu_q.len()])?, Tensor::from_slice(device, &cu_k, &[cu_k.len()])?);
        let (cqv, ckv) = (cq.view(), ck.view());
        let cu = if device_offsets {
            crate::ops::attention::CuSeqlens::Device { q: &cqv, k: &ckv }
        } else {
            crate::ops::attention::CuSeqlens::Host { q: &cu_q, k: &cu_k }
        };
        let mut lv = lse.as_ref().map(crate::tensor::TensorViewMut::of_tensor);
        ws.forward_paged_on(
            device,
            &qt.view(),
            &kv,
            &tt.view(),
            cu,
            &mut crate::tensor::TensorViewMut::of_tensor(&out),
            lv.as_mut(),
            &opts,
        )?;
    }
    if paged.is_some() {
        // (ran above: the pool and table live in that scope)
    } else if device_offsets {
        let cq = Tensor::from_slice(device, &cu_q, &[cu_q.len()])?;
        let ck = Tensor::from_slice(device, &cu_k, &[cu_k.len()])?;
        ws.forward_device(&qt, &kt, &vt, &cq, &ck, &out, lse.as_ref(), &opts)?;
    } else {
        ws.forward(&qt, &kt, &vt, &cu_q, &cu_k, &out, lse.as_ref(), &opts)?;
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
    Ok(CaseResult {
        op: "gqa_attention".into(),
        dtype,
        shape: format!(
            "{lens} {q_heads}/{kv_heads}x{d} {mask}{}{}",
            if opts.temperature.is_some() { " +temp" } else { "" },
            if fused_qkv { " qkv" } else { "" },
        ) + if device_offsets { " dev-cu" } else { "" }
            + &paged.map_or(String::new(), |p| format!(" paged p{p}")),
        pass: comparison.pass,
        comparison,
        worst_shape,
        gaps_untouched: true,
        millis,
        outputs,
    })
}

/// The attention cases `verify` runs.
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

/// Formats results as the `verify` table.
pub fn table(results: &[Outcome]) -> String {
    let mut s = format!(
        "{:<20} {:<5} {:<36} {:>11} {:>11} {:>6} {:>10}\n",
        "op", "dtype", "shape", "max abs", "max rel", "result", "time ms"
    );
    for r in results {
        match r {
            Ok(c) => s.push_str(&format!(
                "{:<20} {:<5} {:<36} {:>11.3e} {:>11.3e} {:>6} {:>10.3}\n",
                c.op,
                c.dtype.name(),
                c.shape,
                c.comparison.max_abs,
                c.comparison.max_rel,
                if c.pass { "pass" } else { "FAIL" },
                c.millis
            )),
            Err((case, e)) => s.push_str(&format!("ERROR {case}: {e}\n")),
        }
    }
    s
}
