//! The `verify` cases of dropout and the LoRA branch, against [`reference::dropout`] and
//! [`reference::lora`].
//!
//! The LoRA branch stores `xs`, `h`, `dh` and `dh A` in the activation dtype between its
//! launches, as peft does in bf16, so each output carries up to four roundings of its terms. Its
//! tolerance is the classical forward-error bound of a product chain: `4u` times the same
//! computation on the absolute values (`|B| |A| |xs|` for `y`, and so on), plus the output's own
//! rounding. A wrong mask, scaling or transpose moves an output by the size of its terms, far
//! past that bound.

use std::time::Instant;

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::dropout::{Dropout, dropout, dropout_on};
use crate::ops::lora::{LoraAdapter, LoraConfig, LoraGrads, LoraScratch, lora_backward, lora_forward};
use crate::reference;
use crate::tensor::{Tensor, TensorViewMut};

/// One dropout case: `rows` rows of `cols` (`pad` elements apart beyond their width), drop
/// probability `p`, an extra `scale`, `accumulate`: added to a random output.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct DropoutCase {
    pub dtype: DType,
    pub rows: usize,
    pub cols: usize,
    pub p: f64,
    pub scale: f64,
    pub accumulate: bool,
    pub pad: usize,
    pub seed: u64,
}

impl DropoutCase {
    pub fn new(dtype: DType, rows: usize, cols: usize, p: f64) -> Self {
        DropoutCase { dtype, rows, cols, p, scale: 1.0, accumulate: false, pad: 0, seed: 11 }
    }
}

/// Runs `case` on `device` against [`reference::dropout::dropout`]: the values within one
/// rounding, and the mask exactly (an element is zero exactly where the reference drops it).
pub fn dropout_case(device: &Device, case: DropoutCase) -> Result<CaseResult> {
    let DropoutCase { dtype, rows, cols, p, scale, accumulate, pad, seed } = case;
    let mut rng = Rng::new(seed ^ (rows as u64) << 20 ^ (cols as u64) << 40);
    // No zero inputs, so a zero output means a dropped element.
    let x: Vec<f64> = rng.uniform_vec(rows * cols, 0.5, 2.0, dtype);
    let out0 = rng.normal_vec(rows * cols, 1.0, dtype);
    let mask = Dropout { p, seed: seed.wrapping_mul(0x9E37_79B9_7F4A_7C15), stream: 3 };
    let (xt, _) = rows_tensor(device, dtype, &x, rows, cols, pad)?;
    let (ot, ofull) = rows_tensor(device, dtype, &out0, rows, cols, pad)?;
    let start = Instant::now();
    if accumulate {
        dropout_on(device, &xt.view(), &mut TensorViewMut::of_tensor(&ot), &mask, scale, true)?;
    } else {
        dropout(&xt, &ot, &mask, scale)?;
    }
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let got = ot.to_f64_vec()?;
    let mut want = reference::dropout::dropout(&x, cols, &mask, scale)?;
    let mut mask_exact = true;
    for (e, w) in want.iter_mut().enumerate() {
        let kept = reference::dropout::keeps(&mask, e / cols, e % cols);
        if accumulate {
            *w += out0[e];
        } else {
            mask_exact &= kept == (got[e] != 0.0);
        }
    }
    let tol = Tolerance::rounded_output(dtype);
    let parts = vec![(compare(&got, &want, tol), vec![rows, cols])];
    let shape = format!(
        "{rows}x{cols} p {p} x{scale}{}{}",
        if accumulate { " +=" } else { "" },
        if pad > 0 { format!(" pad {pad}") } else { String::new() }
    );
    Ok(result("dropout", dtype, shape, parts, gaps_poisoned(&ofull, cols)? && mask_exact, millis, vec![got]))
}

/// The dropout cases `verify` runs: each dtype, peft's 0.05 and a heavy 0.5, both access
/// paths, accumulating and strided.
pub fn dropout_cases(quick: bool) -> Vec<DropoutCase> {
    let (rows, cols) = if quick { (16, 1024) } else { (512, 4096) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(DropoutCase::new(dtype, rows, cols, 0.05));
        v.push(DropoutCase { scale: 2.0, pad: 3, ..DropoutCase::new(dtype, 7, 333, 0.5) });
        v.push(DropoutCase { accumulate: true, ..DropoutCase::new(dtype, 5, 64, 0.1) });
    }
    v
}

/// One LoRA case: the branch of an adapter of rank `cfg.r` on a `d_out x d_in` projection over
/// `tokens` rows, forward into a random base output and backward (weight gradients in f32 or the
/// dtype, written or `accumulate`d; the input gradient added to a random base gradient).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LoraCase {
    pub dtype: DType,
    pub tokens: usize,
    pub d_in: usize,
    pub d_out: usize,
    pub cfg: LoraConfig,
    pub f32_grads: bool,
    pub accumulate: bool,
    pub seed: u64,
}

impl LoraCase {
    pub fn new(dtype: DType, tokens: usize, d_in: usize, d_out: usize, cfg: LoraConfig) -> Self {
        LoraCase { dtype, tokens, d_in, d_out, cfg, f32_grads: true, accumulate: false, seed: 13 }
    }
}

/// Runs `case` on `device` against [`reference::lora`]: `y`, `dA`, `dB` and `dx`.
pub fn lora_case(device: &Device, case: LoraCase) -> Result<CaseResult> {
    let LoraCase { dtype, tokens, d_in, d_out, cfg, f32_grads, accumulate, seed } = case;
    let r = cfg.r;
    let gdt = if f32_grads { DType::F32 } else { dtype };
    let mut rng = Rng::new(seed ^ (tokens as u64) << 20 ^ (d_in as u64) << 36 ^ (d_out as u64) << 48 ^ r as u64);
    let bound = LoraConfig::a_init_bound(d_in);
    let x = rng.normal_vec(tokens * d_in, 1.0, dtype);
    let a = rng.uniform_vec(r * d_in, -bound, bound, dtype);
    // B is trained away from peft's zeros: a typical magnitude after some steps.
    let b = rng.normal_vec(d_out * r, 0.1, dtype);
    let (y0, dy, dx0) = (
        rng.normal_vec(tokens * d_out, 1.0, dtype),
        rng.normal_vec(tokens * d_out, 1.0, dtype),
        rng.normal_vec(tokens * d_in, 1.0, dtype),
    );
    let (da0, db0) = (rng.normal_vec(r * d_in, 0.1, gdt), rng.normal_vec(d_out * r, 0.1, gdt));
    let up = |v: &[f64], dt: DType, shape: &[usize]| Tensor::from_f64(device, dt, v, shape);
    let (xt, at, bt) = (up(&x, dtype, &[tokens, d_in])?, up(&a, dtype, &[r, d_in])?, up(&b, dtype, &[d_out, r])?);
    let (yt, dyt, dxt) =
        (up(&y0, dtype, &[tokens, d_out])?, up(&dy, dtype, &[tokens, d_out])?, up(&dx0, dtype, &[tokens, d_in])?);
    let grad = |init: &[f64], shape: &[usize]| {
        if accumulate { up(init, gdt, shape) } else { Tensor::poisoned(device, gdt, shape) }
    };
    let (dat, dbt) = (grad(&da0, &[r, d_in])?, grad(&db0, &[d_out, r])?);
    let scratch = LoraScratch::new(device, dtype, tokens, d_in, r)?;
    let adapter = LoraAdapter { cfg, a: &at, b: &bt, seed: seed ^ 0xA5A5, stream: 42 };
    let start = Instant::now();
    lora_forward(&adapter, &xt, &yt, &scratch)?;
    lora_backward(&adapter, &xt, &dyt, &LoraGrads { da: &dat, db: &dbt, accumulate }, Some(&dxt), &scratch)?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;

    let mask = Dropout { p: cfg.dropout, seed: adapter.seed, stream: adapter.stream };
    let shape2 = [d_out, d_in];
    let mut y = reference::lora::lora_forward(&x, &a, &b, &cfg, &mask, shape2)?;
    let mut g = reference::lora::lora_backward(&dy, &x, &a, &b, &cfg, &mask, shape2)?;
    let add = |v: &mut [f64], init: &[f64]| v.iter_mut().zip(init).for_each(|(a, b)| *a += b);
    add(&mut y, &y0);
    add(&mut g.dx, &dx0);
    if accumulate {
        add(&mut g.da, &da0);
        add(&mut g.db, &db0);
    }
    // The same chains over absolute values bound the roundings' effect.
    let abs = |v: &[f64]| v.iter().map(|v| v.abs()).collect::<Vec<_>>();
    let acfg = LoraConfig { alpha: cfg.alpha.abs(), ..cfg };
    let (xa, aa, ba, dya) = (abs(&x), abs(&a), abs(&b), abs(&dy));
    let yb = reference::lora::lora_forward(&xa, &aa, &ba, &acfg, &mask, shape2)?;
    let gb = reference::lora::lora_backward(&dya, &xa, &aa, &ba, &acfg, &mask, shape2)?;
    let u = dtype.unit_roundoff();
    let tol = |dt: DType, bound: &[f64]| {
        let base = Tolerance::rounded_output(dt);
        Tolerance { atol: base.atol + 4.0 * u * bound.iter().fold(0.0f64, |m, v| m.max(*v)), rtol: base.rtol }
    };
    let (gy, gda, gdb, gdx) = (yt.to_f64_vec()?, dat.to_f64_vec()?, dbt.to_f64_vec()?, dxt.to_f64_vec()?);
    let parts = vec![
        (compare(&gy, &y, tol(dtype, &yb)), vec![tokens, d_out]),
        (compare(&gda, &g.da, tol(gdt, &gb.da)), vec![r, d_in]),
        (compare(&gdb, &g.db, tol(gdt, &gb.db)), vec![d_out, r]),
        (compare(&gdx, &g.dx, tol(dtype, &gb.dx)), vec![tokens, d_in]),
    ];
    let shape = format!(
        "{tokens}x{d_in}->{d_out} r{r} a{} p{}{}{}{}",
        cfg.alpha,
        cfg.dropout,
        if cfg.rslora { " rs" } else { "" },
        if f32_grads { " f32 grads" } else { "" },
        if accumulate { " +=" } else { "" }
    );
    Ok(result("lora", dtype, shape, parts, true, millis, vec![gy, gda, gdb, gdx]))
}

/// The LoRA cases `verify` runs: peft's QLoRA adapter (r 16, alpha 32, dropout 0.05) on a Llama 3
/// 8B q_proj (smaller when quick) in each dtype, and odd shapes with rsLoRA, no dropout and
/// accumulated gradients in the dtype.
pub fn lora_cases(quick: bool) -> Vec<LoraCase> {
    let (tokens, d_in, d_out) = if quick { (16, 256, 192) } else { (256, 4096, 4096) };
    let mut v = Vec::new();
    for dtype in DType::FLOATS {
        v.push(LoraCase::new(dtype, tokens, d_in, d_out, LoraConfig::QLORA));
        let odd = LoraConfig { r: 3, alpha: 7.0, dropout: 0.0, rslora: true };
        v.push(LoraCase { f32_grads: false, accumulate: true, ..LoraCase::new(dtype, 9, 70, 33, odd) });
    }
    v
}
