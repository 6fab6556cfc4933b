//! `verify` cases of the memory-bound ops: RMSNorm (plain and fused), RoPE and SwiGLU.

use std::time::Instant;

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops;
use crate::ops::rope::{Rope, RopeConfig, RopeLayout, Saved};
use crate::ops::swiglu::GateUp;
use crate::reference;
use crate::tensor::Tensor;

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
    /// The backward ([`Rope::backward`]): q and k hold gradients, and with a qk-norm the
    /// forward's inputs are random tensors of their own.
    pub backward: bool,
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
            backward: false,
            seed: 3,
        }
    }
    /// The same case through the backward.
    pub fn backward(self) -> Self {
        RopeCase { backward: true, ..self }
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
    let RopeCase { dtype, tokens, q_heads, kv_heads, config, i64_positions, fused_qkv, max_position, backward, seed } =
        case;
    let d = config.head_dim;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 16 ^ (d as u64) << 32 ^ u64::from(backward) << 48);
    let q = rng.normal_vec(tokens * q_heads * d, 1.0, dtype);
    let k = rng.normal_vec(tokens * kv_heads * d, 1.0, dtype);
    let pos = rope_positions(tokens, max_position, &mut rng);
    // The backward's saved forward inputs (read only with a qk-norm).
    let (q_in, k_in) = (rng.normal_vec(q.len(), 1.0, dtype), rng.normal_vec(k.len(), 1.0, dtype));
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
    let q_in_t = Tensor::from_f64(device, dtype, &q_in, &[tokens, q_heads, d])?;
    let k_in_t = Tensor::from_f64(device, dtype, &k_in, &[tokens, kv_heads, d])?;
    let start = Instant::now();
    if backward {
        let saved = config.qk_norm_eps.map(|_| Saved { q: &q_in_t, k: Some(&k_in_t) });
        rope.backward(&qt, Some(&kt), &positions, saved)?;
    } else {
        rope.apply(&qt, Some(&kt), &positions)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let tol = rope_tolerance(dtype);
    let (qg, kg) = (qt.to_f64_vec()?, kt.to_f64_vec()?);
    let (qref, kref) = if backward {
        (
            reference::rope::rope_backward(&q, Some(&q_in), q_heads, &pos, &config)?,
            reference::rope::rope_backward(&k, Some(&k_in), kv_heads, &pos, &config)?,
        )
    } else {
        (reference::rope::rope(&q, q_heads, &pos, &config)?, reference::rope::rope(&k, kv_heads, &pos, &config)?)
    };
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
        op: if backward { "rope_backward" } else { "rope" }.into(),
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

/// The RoPE cases `verify` runs, forward then backward.
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
    let backward: Vec<RopeCase> = v.iter().map(|c| c.backward()).collect();
    v.extend(backward);
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
