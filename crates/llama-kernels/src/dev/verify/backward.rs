//! The backward ops' `verify` cases, against the f64 reference's gradients
//! ([`crate::reference`]): each case poisons its outputs, runs the public op and compares.

use std::time::Instant;

use super::common::*;
use super::elementwise::RMS_NORM_EPS;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::{self, GateUp, WeightGrad};
use crate::reference;
use crate::tensor::Tensor;

/// One RMSNorm backward case: `rows` rows of `hidden`, rows `pad` elements apart beyond their
/// width; `residual`: the fused variant (a `d_residual` added to dx); `accumulate`: `dw +=` into
/// a random dw.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RmsNormBackwardCase {
    pub dtype: DType,
    pub rows: usize,
    pub hidden: usize,
    pub residual: bool,
    pub accumulate: bool,
    pub pad: usize,
    pub seed: u64,
}

impl RmsNormBackwardCase {
    pub fn new(dtype: DType, rows: usize, hidden: usize) -> Self {
        RmsNormBackwardCase { dtype, rows, hidden, residual: false, accumulate: false, pad: 0, seed: 5 }
    }
    pub fn fused(self) -> Self {
        RmsNormBackwardCase { residual: true, ..self }
    }
    pub fn accumulating(self) -> Self {
        RmsNormBackwardCase { accumulate: true, ..self }
    }
    pub fn strided(self, pad: usize) -> Self {
        RmsNormBackwardCase { pad, ..self }
    }
}

/// The tolerance of a gradient rounded once to `dtype` from f32 sums over `n` terms of
/// magnitude about `scale`.
pub fn gradient_tolerance(dtype: DType, n: usize, scale: f64) -> Tolerance {
    let base = Tolerance::rounded_output(dtype);
    Tolerance { atol: base.atol + 4.0 * (n as f64).sqrt() * scale * 5.960464477539063e-8, rtol: base.rtol }
}

/// Runs `case` on `device` against [`reference::rms_norm::rms_norm_backward`].
pub fn rms_norm_backward_case(device: &Device, case: RmsNormBackwardCase) -> Result<CaseResult> {
    let RmsNormBackwardCase { dtype, rows, hidden, residual, accumulate, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (rows as u64) << 20 ^ (hidden as u64) << 40 ^ u64::from(residual));
    let x = rng.normal_vec(rows * hidden, 1.0, dtype);
    let dy = rng.normal_vec(rows * hidden, 1.0, dtype);
    let dres = rng.normal_vec(rows * hidden, 1.0, dtype);
    let w = rng.uniform_vec(hidden, 0.5, 1.5, dtype);
    let dw0 = rng.normal_vec(hidden, 1.0, DType::F32);
    let (xt, _) = rows_tensor(device, dtype, &x, rows, hidden, pad)?;
    let (dyt, _) = rows_tensor(device, dtype, &dy, rows, hidden, pad)?;
    let (drt, _) = rows_tensor(device, dtype, &dres, rows, hidden, pad)?;
    let wt = Tensor::from_f64(device, dtype, &w, &[hidden])?;
    let dxfull = Tensor::poisoned(device, dtype, &[rows, hidden + pad])?;
    let dxt = dxfull.narrow(1, 0, hidden)?;
    let dwt = if accumulate {
        Tensor::from_f64(device, DType::F32, &dw0, &[hidden])?
    } else {
        Tensor::poisoned(device, DType::F32, &[hidden])?
    };
    let scratch = Tensor::poisoned(device, DType::F32, &[ops::rms_norm_backward::dw_scratch_len(rows, hidden)])?;

    let start = Instant::now();
    let grad = WeightGrad { dw: &dwt, scratch: &scratch, accumulate };
    ops::rms_norm_backward(&dyt, &xt, &wt, RMS_NORM_EPS, &dxt, residual.then_some(&drt), Some(grad))?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let (mut dx_ref, mut dw_ref) =
        reference::rms_norm::rms_norm_backward(&x, &w, &dy, hidden, f64::from(RMS_NORM_EPS))?;
    if residual {
        dx_ref.iter_mut().zip(&dres).for_each(|(a, b)| *a += b);
    }
    if accumulate {
        dw_ref.iter_mut().zip(&dw0).for_each(|(a, b)| *a += b);
    }
    let dx = dxt.to_f64_vec()?;
    let dw = dwt.to_f64_vec()?;
    // dx: terms of order |dy w| r ~ 1 and a row sum of hidden terms; dw: a sum over rows.
    let dx_tol = gradient_tolerance(dtype, hidden, 2.0);
    let dw_tol = gradient_tolerance(DType::F32, rows, 2.0);
    let parts =
        vec![(compare(&dx, &dx_ref, dx_tol), vec![rows, hidden]), (compare(&dw, &dw_ref, dw_tol), vec![hidden])];
    let gaps = gaps_poisoned(&dxfull, hidden)?;
    let mut shape = format!("{rows}x{hidden}");
    if pad > 0 {
        shape += &format!(" (row stride {})", hidden + pad);
    }
    if accumulate {
        shape += ", dw +=";
    }
    let op = if residual { "fused_add_rms_norm_backward" } else { "rms_norm_backward" };
    Ok(result(op, dtype, shape, parts, gaps, millis, vec![dx, dw]))
}

/// The cases `verify` runs: per dtype, decode and prefill rows at Llama's widths, an odd width
/// (the scalar path), strided rows, the fused variant and an accumulating dw.
pub fn rms_norm_backward_cases(quick: bool) -> Vec<RmsNormBackwardCase> {
    let shapes: &[(usize, usize)] =
        if quick { &[(1, 4096), (7, 769), (83, 768)] } else { &[(1, 4096), (7, 769), (2048, 4096), (512, 8192)] };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        for &(rows, hidden) in shapes {
            v.push(RmsNormBackwardCase::new(dtype, rows, hidden));
        }
        v.push(RmsNormBackwardCase::new(dtype, 33, 4096).strided(8).fused().accumulating());
        v.push(RmsNormBackwardCase::new(dtype, 9, 1000).strided(3).fused());
    }
    v
}

/// How a SwiGLU backward case lays out gate/up and their gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SwiGluLayout {
    /// Two `[tokens, d]` tensors each.
    Separate,
    /// One `[tokens, 2d]` tensor, gate then up.
    GateThenUp,
    /// One `[tokens, 2d]` tensor, gate and up interleaved.
    Interleaved,
}

/// One SwiGLU backward case: rows `pad` elements apart beyond their width; `in_place`: the
/// gradients overwrite the saved gate/up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SwiGluBackwardCase {
    pub dtype: DType,
    pub tokens: usize,
    pub d: usize,
    pub layout: SwiGluLayout,
    pub in_place: bool,
    pub pad: usize,
    pub seed: u64,
}

impl SwiGluBackwardCase {
    pub fn new(dtype: DType, tokens: usize, d: usize, layout: SwiGluLayout) -> Self {
        SwiGluBackwardCase { dtype, tokens, d, layout, in_place: false, pad: 0, seed: 9 }
    }
    pub fn in_place(self) -> Self {
        SwiGluBackwardCase { in_place: true, ..self }
    }
    pub fn strided(self, pad: usize) -> Self {
        SwiGluBackwardCase { pad, ..self }
    }
}

/// Runs `case` on `device` against [`reference::swiglu::swiglu_backward`].
pub fn swiglu_backward_case(device: &Device, case: SwiGluBackwardCase) -> Result<CaseResult> {
    let SwiGluBackwardCase { dtype, tokens, d, layout, in_place, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (d as u64) << 40 ^ layout as u64);
    let gate = rng.normal_vec(tokens * d, 2.0, dtype);
    let up = rng.normal_vec(tokens * d, 1.0, dtype);
    let dout = rng.normal_vec(tokens * d, 1.0, dtype);
    let (dot, _) = rows_tensor(device, dtype, &dout, tokens, d, pad)?;
    // The packed layouts' rows, and the fulls (poisoned gaps) of every output.
    let interleave = |a: &[f64], b: &[f64]| -> Vec<f64> { (0..tokens * d).flat_map(|i| [a[i], b[i]]).collect() };
    let concat = |a: &[f64], b: &[f64]| -> Vec<f64> {
        (0..tokens)
            .flat_map(|t| a[t * d..(t + 1) * d].iter().chain(&b[t * d..(t + 1) * d]).copied().collect::<Vec<_>>())
            .collect()
    };
    let start;
    let (dg, du, gaps) = match layout {
        SwiGluLayout::Separate => {
            let (gt, gfull) = rows_tensor(device, dtype, &gate, tokens, d, pad)?;
            let (ut, ufull) = rows_tensor(device, dtype, &up, tokens, d, pad)?;
            let (dgfull, dufull) = (
                Tensor::poisoned(device, dtype, &[tokens, d + pad])?,
                Tensor::poisoned(device, dtype, &[tokens, d + pad])?,
            );
            let (dgt, dut) = (dgfull.narrow(1, 0, d)?, dufull.narrow(1, 0, d)?);
            start = Instant::now();
            let input = GateUp::Separate { gate: &gt, up: &ut };
            if in_place {
                ops::swiglu_backward(&dot, input, input)?;
                (gt.to_f64_vec()?, ut.to_f64_vec()?, gaps_poisoned(&gfull, d)? && gaps_poisoned(&ufull, d)?)
            } else {
                ops::swiglu_backward(&dot, input, GateUp::Separate { gate: &dgt, up: &dut })?;
                (dgt.to_f64_vec()?, dut.to_f64_vec()?, gaps_poisoned(&dgfull, d)? && gaps_poisoned(&dufull, d)?)
            }
        }
        SwiGluLayout::GateThenUp | SwiGluLayout::Interleaved => {
            let packed = if layout == SwiGluLayout::Interleaved { interleave(&gate, &up) } else { concat(&gate, &up) };
            let (pt, pfull) = rows_tensor(device, dtype, &packed, tokens, 2 * d, pad)?;
            let gfull = Tensor::poisoned(device, dtype, &[tokens, 2 * d + pad])?;
            let gt = gfull.narrow(1, 0, 2 * d)?;
            let wrap =
                |t| if layout == SwiGluLayout::Interleaved { GateUp::Interleaved(t) } else { GateUp::GateThenUp(t) };
            start = Instant::now();
            let out = if in_place {
                ops::swiglu_backward(&dot, wrap(&pt), wrap(&pt))?;
                pt.to_f64_vec()?
            } else {
                ops::swiglu_backward(&dot, wrap(&pt), wrap(&gt))?;
                gt.to_f64_vec()?
            };
            let gaps = gaps_poisoned(if in_place { &pfull } else { &gfull }, 2 * d)?;
            let (mut dg, mut du) = (Vec::new(), Vec::new());
            for row in out.chunks(2 * d) {
                if layout == SwiGluLayout::Interleaved {
                    row.chunks(2).for_each(|p| {
                        dg.push(p[0]);
                        du.push(p[1]);
                    });
                } else {
                    dg.extend_from_slice(&row[..d]);
                    du.extend_from_slice(&row[d..]);
                }
            }
            (dg, du, gaps)
        }
    };
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let (dg_ref, du_ref) = reference::swiglu::swiglu_backward(&gate, &up, &dout)?;
    let tol = gradient_tolerance(dtype, 8, 2.0);
    let parts = vec![(compare(&dg, &dg_ref, tol), vec![tokens, d]), (compare(&du, &du_ref, tol), vec![tokens, d])];
    let shape = format!(
        "{tokens}x{d} {layout:?}{}{}",
        if in_place { " in place" } else { "" },
        if pad > 0 { format!(" pad {pad}") } else { String::new() }
    );
    Ok(result("swiglu_backward", dtype, shape, parts, gaps, millis, vec![dg, du]))
}

/// The cases `verify` runs: every layout and dtype at decode and prefill widths, in place and
/// strided.
pub fn swiglu_backward_cases(quick: bool) -> Vec<SwiGluBackwardCase> {
    let (tokens, d) = if quick { (16, 1024) } else { (512, 14336) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        for layout in [SwiGluLayout::Separate, SwiGluLayout::GateThenUp, SwiGluLayout::Interleaved] {
            v.push(SwiGluBackwardCase::new(dtype, tokens, d, layout));
            v.push(SwiGluBackwardCase::new(dtype, 5, 1000, layout).in_place().strided(3));
        }
    }
    v
}

/// One cross-entropy case: `rows` rows of `vocab` logits (rows `pad` elements apart), every
/// `ignore_every`-th label -100 (0: none), labels i64 or i32, mean or sum, the gradient over the
/// logits (`in_place`) or into its own tensor; `grad_scale` the upstream gradient.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CrossEntropyCase {
    pub dtype: DType,
    pub rows: usize,
    pub vocab: usize,
    pub ignore_every: usize,
    pub i64_labels: bool,
    pub sum: bool,
    pub in_place: bool,
    pub pad: usize,
    pub grad_scale: f32,
    pub seed: u64,
}

impl CrossEntropyCase {
    pub fn new(dtype: DType, rows: usize, vocab: usize) -> Self {
        CrossEntropyCase {
            dtype,
            rows,
            vocab,
            ignore_every: 3,
            i64_labels: false,
            sum: false,
            in_place: false,
            pad: 0,
            grad_scale: 1.0,
            seed: 7,
        }
    }
}

/// The tolerance of one f32 log-sum-exp over `vocab` terms (the per-row loss and the mean).
pub fn cross_entropy_loss_tolerance(vocab: usize) -> Tolerance {
    let eps = 5.960464477539063e-8;
    Tolerance { atol: 8.0 * eps * (vocab as f64).sqrt().max(8.0), rtol: 8.0 * eps }
}

/// Runs `case` on `device` against [`reference::cross_entropy::cross_entropy`].
pub fn cross_entropy_case(device: &Device, case: CrossEntropyCase) -> Result<CaseResult> {
    use crate::ops::cross_entropy::{CrossEntropy, CrossEntropyOptions, Reduction};
    let CrossEntropyCase { dtype, rows, vocab, ignore_every, i64_labels, sum, in_place, pad, grad_scale, seed } = case;
    let mut rng = Rng::new(seed ^ (rows as u64) << 20 ^ (vocab as u64) << 40 ^ u64::from(sum));
    let logits = rng.normal_vec(rows * vocab, 3.0, dtype);
    let labels: Vec<i64> = (0..rows)
        .map(|t| if ignore_every > 0 && t % ignore_every == 1 { -100 } else { rng.below(vocab as u64) as i64 })
        .collect();
    let (xt, xfull) = rows_tensor(device, dtype, &logits, rows, vocab, pad)?;
    let lt = if i64_labels {
        Tensor::from_slice(device, &labels, &[rows])?
    } else {
        Tensor::from_slice(device, &labels.iter().map(|&l| l as i32).collect::<Vec<_>>(), &[rows])?
    };
    let gfull = Tensor::poisoned(device, dtype, &[rows, vocab + pad])?;
    let gt = if in_place { xt.clone() } else { gfull.narrow(1, 0, vocab)? };
    let loss = Tensor::poisoned(device, DType::F32, &[1])?;
    let ce = CrossEntropy::new(device, rows)?;
    let options = CrossEntropyOptions {
        reduction: if sum { Reduction::Sum } else { Reduction::Mean },
        grad_scale,
        ..Default::default()
    };
    let start = Instant::now();
    ce.forward(&xt, &lt, &loss, Some(&gt), &options)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    ce.check_labels()?;

    let want = reference::cross_entropy::cross_entropy(&logits, &labels, vocab, -100, !sum, f64::from(grad_scale))?;
    let (got_loss, got_rows, got_grad) = (loss.to_f64_vec()?, ce.row_losses(rows)?.to_f64_vec()?, gt.to_f64_vec()?);
    let lt = cross_entropy_loss_tolerance(vocab);
    let gscale = want.grad.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let parts = vec![
        (compare(&got_loss, &[want.loss], lt), vec![1]),
        (compare(&got_rows, &want.row_loss, lt), vec![rows]),
        (compare(&got_grad, &want.grad, gradient_tolerance(dtype, vocab, gscale)), vec![rows, vocab]),
    ];
    let gaps = gaps_poisoned(if in_place { &xfull } else { &gfull }, vocab)?;
    let shape = format!(
        "{rows}x{vocab} {}{}{}{}",
        if sum { "sum" } else { "mean" },
        if i64_labels { " i64" } else { "" },
        if in_place { " in place" } else { "" },
        if pad > 0 { format!(" pad {pad}") } else { String::new() }
    );
    Ok(result("cross_entropy", dtype, shape, parts, gaps, millis, vec![got_loss, got_grad]))
}

/// The cross-entropy cases `verify` runs: Llama 3's vocabulary (128256) and SmolLM2's (49152) at
/// a few rows, and small odd ones.
pub fn cross_entropy_cases(quick: bool) -> Vec<CrossEntropyCase> {
    let big = if quick { (4, 49_152) } else { (64, 128_256) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(CrossEntropyCase::new(dtype, big.0, big.1));
        v.push(CrossEntropyCase {
            in_place: true,
            i64_labels: true,
            sum: true,
            ..CrossEntropyCase::new(dtype, 9, 1001)
        });
        v.push(CrossEntropyCase { pad: 3, grad_scale: 0.5, ..CrossEntropyCase::new(dtype, 5, 256) });
    }
    v
}

/// One linear-backward case: `dx = dy W` and `dw = dyᵀ x` for `tokens` rows, `dw` in f32 (the
/// training layout) or the input dtype, `accumulate`: both added to random values.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinearBackwardCase {
    pub dtype: DType,
    pub tokens: usize,
    pub d_in: usize,
    pub d_out: usize,
    pub f32_dw: bool,
    pub accumulate: bool,
    pub seed: u64,
}

/// Runs `case` on `device` against [`reference::linear::linear_backward`].
pub fn linear_backward_case(device: &Device, case: LinearBackwardCase) -> Result<CaseResult> {
    use crate::dev::testing::linear_tolerance;
    let LinearBackwardCase { dtype, tokens, d_in, d_out, f32_dw, accumulate, seed } = case;
    let dw_dtype = if f32_dw { DType::F32 } else { dtype };
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (d_in as u64) << 40 ^ d_out as u64);
    let x = rng.normal_vec(tokens * d_in, 1.0, dtype);
    let dy = rng.normal_vec(tokens * d_out, 1.0, dtype);
    let w = rng.normal_vec(d_out * d_in, 1.0 / (d_in as f64).sqrt(), dtype);
    let (dx0, dw0) = (rng.normal_vec(tokens * d_in, 1.0, dtype), rng.normal_vec(d_out * d_in, 1.0, dw_dtype));
    let (xt, dyt) = (
        Tensor::from_f64(device, dtype, &x, &[tokens, d_in])?,
        Tensor::from_f64(device, dtype, &dy, &[tokens, d_out])?,
    );
    let wt = Tensor::from_f64(device, dtype, &w, &[d_out, d_in])?;
    let out = |init: &[f64], dt: DType, shape: &[usize]| {
        if accumulate { Tensor::from_f64(device, dt, init, shape) } else { Tensor::poisoned(device, dt, shape) }
    };
    let (dxt, dwt) = (out(&dx0, dtype, &[tokens, d_in])?, out(&dw0, dw_dtype, &[d_out, d_in])?);
    let start = Instant::now();
    ops::linear_backward_input(&dyt, &wt, &dxt, accumulate)?;
    ops::linear_backward_weight(&dyt, &xt, &dwt, accumulate)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let (mut dx, mut dw) = reference::linear::linear_backward(&dy, &x, &w, d_in, d_out)?;
    if accumulate {
        dx.iter_mut().zip(&dx0).for_each(|(a, b)| *a += b);
        dw.iter_mut().zip(&dw0).for_each(|(a, b)| *a += b);
    }
    let max = |v: &[f64]| v.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let (gx, gw) = (dxt.to_f64_vec()?, dwt.to_f64_vec()?);
    let parts = vec![
        (compare(&gx, &dx, linear_tolerance(dtype, d_out, max(&dy) * max(&w))), vec![tokens, d_in]),
        (compare(&gw, &dw, linear_tolerance(dw_dtype, tokens, max(&dy) * max(&x))), vec![d_out, d_in]),
    ];
    let shape = format!(
        "{tokens}x{d_in}x{d_out}{}{}",
        if f32_dw { " dw f32" } else { "" },
        if accumulate { " +=" } else { "" }
    );
    Ok(result("linear_backward", dtype, shape, parts, true, millis, vec![gx, gw]))
}

/// The linear-backward cases `verify` runs: a Llama 3 8B attention projection's shape (q_proj,
/// 4096 x 4096, a few rows; smaller when quick) and odd ones.
pub fn linear_backward_cases(quick: bool) -> Vec<LinearBackwardCase> {
    let big = if quick { (8, 256, 384) } else { (64, 4096, 4096) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        let c = LinearBackwardCase {
            dtype,
            tokens: big.0,
            d_in: big.1,
            d_out: big.2,
            f32_dw: true,
            accumulate: false,
            seed: 3,
        };
        v.push(c);
        v.push(LinearBackwardCase { tokens: 7, d_in: 33, d_out: 65, f32_dw: false, accumulate: true, ..c });
    }
    v
}

/// One embedding-backward case: `tokens` ids over a `vocab x hidden` table (few distinct ids, so
/// runs are long), `accumulate`: added to a random table.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct EmbeddingBackwardCase {
    pub dtype: DType,
    pub tokens: usize,
    pub vocab: usize,
    pub hidden: usize,
    pub accumulate: bool,
    pub seed: u64,
}

/// Runs `case` on `device` against [`reference::embedding::embedding_backward`].
pub fn embedding_backward_case(device: &Device, case: EmbeddingBackwardCase) -> Result<CaseResult> {
    use crate::ops::ErrorFlag;
    use crate::ops::embedding_backward::EmbeddingBackward;
    let EmbeddingBackwardCase { dtype, tokens, vocab, hidden, accumulate, seed } = case;
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (vocab as u64) << 40);
    let ids: Vec<i32> = (0..tokens).map(|_| rng.below(vocab.min(100) as u64) as i32).collect();
    let dy = rng.normal_vec(tokens * hidden, 1.0, dtype);
    let t0 = rng.normal_vec(vocab * hidden, 1.0, DType::F32);
    let (dyt, it) =
        (Tensor::from_f64(device, dtype, &dy, &[tokens, hidden])?, Tensor::from_slice(device, &ids, &[tokens])?);
    let tt = if accumulate {
        Tensor::from_f64(device, DType::F32, &t0, &[vocab, hidden])?
    } else {
        Tensor::poisoned(device, DType::F32, &[vocab, hidden])?
    };
    let errors = ErrorFlag::new(device)?;
    let bwd = EmbeddingBackward::new(device)?;
    let start = Instant::now();
    bwd.run(&dyt, &it, &tt, accumulate, &errors)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    errors.check("embedding_backward")?;
    let mut want = reference::embedding::embedding_backward(&dy, &ids, vocab, hidden)?;
    if accumulate {
        want.iter_mut().zip(&t0).for_each(|(a, b)| *a += b);
    }
    let got = tt.to_f64_vec()?;
    let tol = Tolerance { atol: 4.0 * (tokens as f64) * 5.960464477539063e-8 + 1e-6, rtol: 1e-6 };
    let parts = vec![(compare(&got, &want, tol), vec![vocab, hidden])];
    let shape = format!("{tokens} ids {vocab}x{hidden}{}", if accumulate { " +=" } else { "" });
    Ok(result("embedding_backward", dtype, shape, parts, true, millis, vec![got]))
}

/// The embedding-backward cases `verify` runs: SmolLM2's table (49152 x 576) and more tokens than
/// one sorted chunk; small odd ones.
pub fn embedding_backward_cases(quick: bool) -> Vec<EmbeddingBackwardCase> {
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        let c = EmbeddingBackwardCase { dtype, tokens: 5000, vocab: 49_152, hidden: 576, accumulate: false, seed: 2 };
        if !quick {
            v.push(c);
        }
        v.push(EmbeddingBackwardCase { tokens: 33, vocab: 70, hidden: 36, accumulate: true, ..c });
    }
    v
}

/// One AdamW case: `steps` steps of one parameter tensor of `numel` values (`param` dtype, with
/// an f32 master copy when `master`) from gradients of `grad` dtype, global-norm clipping at 1
/// and weight decay 0.1, against the f64 reference (`reference::optimizer::adamw_step`).
#[derive(Clone, Copy, Debug)]
pub struct AdamWCase {
    pub param: DType,
    pub grad: DType,
    pub master: bool,
    pub numel: usize,
    pub steps: usize,
}

/// Runs `case` on `device`: the parameter after the last step against the reference (and the
/// master copy, when there is one, against the reference's f32-exact values).
pub fn adamw_case(device: &Device, case: AdamWCase) -> Result<CaseResult> {
    use crate::ops::optimizer::{AdamW, AdamWConfig, Lr, ParamSlot};
    use reference::optimizer::{AdamWSpec, Slot, adamw_step};
    let AdamWCase { param: pt, grad: gt, master, numel: n, steps } = case;
    let config = AdamWConfig { weight_decay: 0.1, max_grad_norm: Some(1.0), ..AdamWConfig::default() };
    let spec = AdamWSpec {
        beta1: f64::from(config.beta1),
        beta2: f64::from(config.beta2),
        eps: f64::from(config.eps),
        weight_decay: f64::from(config.weight_decay),
        max_norm: config.max_grad_norm.map(f64::from),
    };
    let mut rng = Rng::new(0xada ^ (n as u64) << 8 ^ steps as u64);
    let p0 = rng.normal_vec(n, 1.0, pt);
    let param = Tensor::from_f64(device, pt, &p0, &[n])?;
    let grad = Tensor::zeros(device, gt, &[n])?;
    let m = if master { Some(Tensor::from_f64(device, DType::F32, &p0, &[n])?) } else { None };
    let opt = AdamW::new(device, &[ParamSlot { param: &param, grad: &grad, master: m.as_ref() }], config)?;
    let mut refs = vec![Slot { param: p0, m: vec![0.0; n], v: vec![0.0; n] }];
    let mut millis = 0.0;
    let lr_of = |step: usize| 1e-3 * (step + 1) as f32;
    for step in 0..steps {
        let lr = lr_of(step);
        let g = rng.normal_vec(n, 3.0, gt);
        grad.copy_from_f64(&g)?;
        let start = Instant::now();
        opt.step(Lr::Host(lr))?;
        device.synchronize()?;
        millis += start.elapsed().as_secs_f64() * 1e3;
        adamw_step(&mut refs, &[g], 1.0, step as u64, f64::from(lr), &spec);
    }
    // f32 math on f32 state: a few ulps per step; a parameter without a master is rounded to its
    // dtype every step (an error of u |p| at each, where |p| is at most the final value plus
    // the updates still to come: lr (|m/sqrt(v)| <= 3 + wd |p|) per step), one with a master
    // once at the end.
    let s = steps as f64;
    let p_max = refs[0].param.iter().fold(0.0f64, |a, v| a.max(v.abs())) + 1.0;
    let drift: f64 = (0..steps).map(|k| f64::from(lr_of(k)) * (3.0 + spec.weight_decay * p_max)).sum();
    let f32_tol = Tolerance { atol: 1e-6 * s, rtol: 1e-6 * s };
    let (want, tol) = if master {
        let want = refs[0].param.iter().map(|&v| crate::dtype::round_to(pt, v)).collect();
        (want, Tolerance { atol: f32_tol.atol, rtol: f32_tol.rtol + pt.unit_roundoff() })
    } else if pt == DType::F32 {
        (refs[0].param.clone(), f32_tol)
    } else {
        let u = pt.unit_roundoff();
        (refs[0].param.clone(), Tolerance { atol: s * u * drift, rtol: s * u * 1.01 })
    };
    let got = param.to_f64_vec()?;
    let mut comparison = compare(&got, &want, tol);
    let mut outputs = vec![got];
    if let Some(m) = &m {
        let master_values = m.to_f64_vec()?;
        let c = compare(&master_values, &refs[0].param, f32_tol);
        if !c.pass || c.worst_ratio > comparison.worst_ratio {
            comparison = c;
        }
        outputs.push(master_values);
    }
    Ok(CaseResult {
        op: format!("adamw step x{steps}{}", if master { " (f32 master)" } else { "" }),
        dtype: pt,
        shape: format!("{n} ({gt} grads, clip 1.0)"),
        pass: comparison.pass,
        comparison,
        worst_shape: vec![n],
        gaps_untouched: true,
        millis,
        outputs,
    })
}

/// The AdamW cases `verify` runs: each parameter dtype, with and without an f32 master, f32 and
/// 16-bit gradients, several chunks of the fused launch.
pub fn adamw_cases(quick: bool) -> Vec<AdamWCase> {
    let numel = if quick { 5000 } else { 1 << 20 };
    vec![
        AdamWCase { param: DType::F32, grad: DType::F32, master: false, numel, steps: 3 },
        AdamWCase { param: DType::BF16, grad: DType::BF16, master: true, numel, steps: 3 },
        AdamWCase { param: DType::BF16, grad: DType::BF16, master: false, numel: 4097, steps: 3 },
        AdamWCase { param: DType::F16, grad: DType::F32, master: false, numel: 4097, steps: 3 },
        AdamWCase { param: DType::F16, grad: DType::F16, master: true, numel: 9, steps: 3 },
    ]
}
