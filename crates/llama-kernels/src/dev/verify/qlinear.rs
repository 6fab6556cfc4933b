//! The packed linear layers' `verify` cases: each format and activation dtype through every
//! [`QPath`] (the GEMV, split or not, the tensor-core GEMM, the dequantize-and-GEMM fallback),
//! against the f64 reference
//! product over the dequantized weight ([`PackedWeight::dequantize`]); and the device
//! dequantization against that specification, bit for bit.

use std::time::Instant;

use super::common::*;
use crate::backend::Device;
use crate::dev::testing::linear_tolerance;
use crate::dev::testing::{Rng, Tolerance, compare};
use crate::dtype::DType;
use crate::error::Result;
use crate::ops::qlinear::{QPath, QScratch, QWeight, dequantize, qlinear, qlinear_add};
use crate::ops::qlinear_backward::qlinear_backward_input;
use crate::reference;
use crate::spec::quant::{PackedWeight, QuantFormat};
use crate::tensor::Tensor;

/// A random weight of `format`: GGUF blocks of random values with scales of a trained layer's
/// size (f16, about 1/(16 sqrt(cols)), minimums and sub-block scales random), or a normal
/// weight quantized to NF4 in blocks of 64.
pub fn random_packed(rng: &mut Rng, format: QuantFormat, rows: usize, cols: usize) -> Result<PackedWeight> {
    let scale = 1.0 / (16.0 * (cols as f64).sqrt());
    let f16_bytes = |rng: &mut Rng, s: f64| half::f16::from_f64((rng.uniform() * 0.9 + 0.1) * s).to_le_bytes();
    let Some(block_bytes) = format.gguf_block_bytes() else {
        let data: Vec<f32> =
            rng.normal_vec(rows * cols, 1.0 / (cols as f64).sqrt(), DType::F32).iter().map(|&v| v as f32).collect();
        return PackedWeight::quantize_nf4(rows, cols, 64, &data);
    };
    let blocks = rows * cols / format.default_block();
    let mut raw = Vec::with_capacity(blocks * block_bytes);
    for _ in 0..blocks {
        let mut b: Vec<u8> = (0..block_bytes).map(|_| rng.below(256) as u8).collect();
        match format {
            QuantFormat::Q8_0 => b[..2].copy_from_slice(&f16_bytes(rng, scale / 8.0)),
            QuantFormat::Q4_0 => b[..2].copy_from_slice(&f16_bytes(rng, scale)),
            QuantFormat::Q5_0 => b[..2].copy_from_slice(&f16_bytes(rng, scale / 2.0)),
            QuantFormat::Q4_1 | QuantFormat::Q5_1 => {
                let s = if format == QuantFormat::Q4_1 { scale } else { scale / 2.0 };
                b[..2].copy_from_slice(&f16_bytes(rng, s));
                b[2..4].copy_from_slice(&(-half::f16::from_f64(8.0 * scale * rng.uniform())).to_le_bytes());
            }
            QuantFormat::Q4_K | QuantFormat::Q5_K => {
                let s = if format == QuantFormat::Q4_K { scale } else { scale / 2.0 };
                b[..2].copy_from_slice(&f16_bytes(rng, s / 32.0));
                b[2..4].copy_from_slice(&f16_bytes(rng, scale / 4.0));
            }
            QuantFormat::Q6_K | QuantFormat::NF4 => b[208..210].copy_from_slice(&f16_bytes(rng, scale / 256.0)),
        }
        raw.extend_from_slice(&b);
    }
    PackedWeight::from_gguf_blocks(format, rows, cols, &raw)
}

/// One case: `rows` activation rows of `k` features through a `[n, k]` packed weight, rows of
/// x and y `pad` elements apart beyond their width, `y +=` when `accumulate`.
#[derive(Clone, Copy, Debug)]
pub struct QLinearCase {
    pub format: QuantFormat,
    pub dtype: DType,
    pub rows: usize,
    pub n: usize,
    pub k: usize,
    pub pad: usize,
    pub accumulate: bool,
}

/// Runs `case` on `device` against the reference: the product with the dequantized weight
/// rounded to the activation dtype (what both the GEMV and the prefill path multiply by).
pub fn qlinear_case(device: &Device, case: QLinearCase) -> Result<CaseResult> {
    let QLinearCase { format, dtype, rows, n, k, pad, accumulate } = case;
    let mut rng = Rng::new((rows as u64) << 40 ^ (n as u64) << 20 ^ k as u64 ^ format as u64);
    let packed = random_packed(&mut rng, format, n, k)?;
    let w = QWeight::new(device, &packed)?;
    let scratch = QScratch::new(device, dtype, &[&w])?;
    let x = rng.normal_vec(rows * k, 1.0, dtype);
    let y0 = rng.normal_vec(rows * n, 1.0, dtype);
    let (xt, _) = rows_tensor(device, dtype, &x, rows, k, pad)?;
    let (yt, yfull) = if accumulate {
        rows_tensor(device, dtype, &y0, rows, n, pad)?
    } else {
        let full = Tensor::poisoned(device, dtype, &[rows, n + pad])?;
        (full.narrow(1, 0, n)?, full)
    };
    let start = Instant::now();
    if accumulate { qlinear_add(&xt, &w, &yt, Some(&scratch)) } else { qlinear(&xt, &w, &yt, Some(&scratch)) }?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    // The path's weights (module docs of ops::qlinear).
    let path = QPath::choose(format, dtype, rows, (k + pad) % dtype.vec16() == 0, [n, k]);
    let wd = path.weight_values(format).of(&packed, dtype);
    let mut expected = reference::linear::linear(&x, &wd, None, k, n)?;
    if accumulate {
        expected.iter_mut().zip(&y0).for_each(|(e, y)| *e += y);
    }
    let xmax = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let wmax = wd.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let got = yt.to_f64_vec()?;
    let comparison = compare(&got, &expected, linear_tolerance(dtype, k, xmax * wmax));
    let gaps = accumulate || gaps_poisoned(&yfull, n)?;
    Ok(CaseResult {
        op: format!("qlinear {format}{}", if accumulate { " +=" } else { "" }),
        dtype,
        shape: format!("{rows}x{k} @ {n}x{k} ({path}){}", if pad > 0 { " strided" } else { "" }),
        pass: comparison.pass && gaps,
        comparison,
        worst_shape: vec![rows, n],
        gaps_untouched: gaps,
        millis,
        outputs: vec![got],
    })
}

/// The input gradient of `case` (`dx (+)= dy W`, [`qlinear_backward_input`]): `rows` rows of
/// `dy` (`n` wide) through the `[n, k]` weight into `dx` (`k` wide), both `pad` elements apart
/// beyond their width, against the f64 product with the weight the path multiplies by.
pub fn qlinear_backward_input_case(device: &Device, case: QLinearCase) -> Result<CaseResult> {
    let QLinearCase { format, dtype, rows, n, k, pad, accumulate } = case;
    let mut rng = Rng::new(0xb4c ^ (rows as u64) << 40 ^ (n as u64) << 20 ^ k as u64 ^ format as u64);
    let packed = random_packed(&mut rng, format, n, k)?;
    let w = QWeight::new(device, &packed)?;
    let scratch = QScratch::new(device, dtype, &[&w])?;
    let dy = rng.normal_vec(rows * n, 1.0, dtype);
    let dx0 = rng.normal_vec(rows * k, 1.0, dtype);
    let (dyt, _) = rows_tensor(device, dtype, &dy, rows, n, pad)?;
    let (dxt, dxfull) = if accumulate {
        rows_tensor(device, dtype, &dx0, rows, k, pad)?
    } else {
        let full = Tensor::poisoned(device, dtype, &[rows, k + pad])?;
        (full.narrow(1, 0, k)?, full)
    };
    let start = Instant::now();
    qlinear_backward_input(&dyt, &w, &dxt, accumulate, Some(&scratch))?;
    device.synchronize()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let path = QPath::for_input_grad(dtype, (n + pad) % dtype.vec16() == 0);
    let wd = path.weight_values(format).of(&packed, dtype);
    let mut expected = reference::linear::linear_backward_input(&dy, &wd, k, n)?;
    if accumulate {
        expected.iter_mut().zip(&dx0).for_each(|(e, d)| *e += d);
    }
    let dymax = dy.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let wmax = wd.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let got = dxt.to_f64_vec()?;
    let comparison = compare(&got, &expected, linear_tolerance(dtype, n, dymax * wmax));
    let gaps = accumulate || gaps_poisoned(&dxfull, k)?;
    Ok(CaseResult {
        op: format!("qlinear backward dx {format}{}", if accumulate { " +=" } else { "" }),
        dtype,
        shape: format!("{rows}x{n} @ {n}x{k} ({path}){}", if pad > 0 { " strided" } else { "" }),
        pass: comparison.pass && gaps,
        comparison,
        worst_shape: vec![rows, k],
        gaps_untouched: gaps,
        millis,
        outputs: vec![got],
    })
}

/// The input-gradient cases `verify` runs: per format and dtype, a prefill-sized gradient with
/// partial row and column blocks and an output width (n) that is not a multiple of 8 (the
/// activations' last step is a partial copy), a strided accumulating one, and rows that are not
/// 16-byte aligned (the dequantize path); not `quick`: NF4 through a Llama-sized 1024 x 4096
/// projection.
pub fn qlinear_backward_input_cases(quick: bool) -> Vec<QLinearCase> {
    let mut v = Vec::new();
    for format in QuantFormat::ALL {
        let k = if format.default_block() == 32 { 160 } else { 256 };
        for dtype in DType::FLOATS {
            v.push(QLinearCase { format, dtype, rows: 70, n: 75, k, pad: 0, accumulate: false });
            v.push(QLinearCase { format, dtype, rows: 9, n: 64, k: 2 * k, pad: 8, accumulate: true });
            v.push(QLinearCase { format, dtype, rows: 5, n: 40, k, pad: 3, accumulate: false });
        }
    }
    if !quick {
        for dtype in [DType::BF16, DType::F16] {
            v.push(QLinearCase {
                format: QuantFormat::NF4,
                dtype,
                rows: 64,
                n: 1024,
                k: 4096,
                pad: 0,
                accumulate: true,
            });
        }
    }
    v
}

/// The device dequantization of a random `[n, k]` weight against the specification, exactly.
pub fn qdequant_case(device: &Device, format: QuantFormat, n: usize, k: usize) -> Result<CaseResult> {
    let mut rng = Rng::new(0xd0 ^ (n as u64) << 16 ^ k as u64 ^ format as u64);
    let packed = random_packed(&mut rng, format, n, k)?;
    let w = QWeight::new(device, &packed)?;
    let start = Instant::now();
    let got = dequantize(&w, DType::F32)?.to_f64_vec()?;
    let millis = start.elapsed().as_secs_f64() * 1e3;
    let expected: Vec<f64> = packed.dequantize().iter().map(|&v| f64::from(v)).collect();
    let comparison = compare(&got, &expected, Tolerance { atol: 0.0, rtol: 0.0 });
    Ok(CaseResult {
        op: format!("dequantize {format}"),
        dtype: DType::F32,
        shape: format!("{n}x{k}"),
        pass: comparison.pass,
        comparison,
        worst_shape: vec![n, k],
        gaps_untouched: true,
        millis,
        outputs: vec![got],
    })
}

/// The cases `verify` runs: per format and dtype a decode GEMV (Llama 3 8B's k/v projection,
/// split along `in`, when not `quick`), a strided accumulating GEMV of an odd width, decode rows
/// that are not 16-byte aligned (the fallback), and prefill products (the tensor-core GEMM for
/// bf16 and f16: one with partial row and column blocks and a k tail of half a step, one strided
/// and accumulating, split along `in`) and 8 decode rows at the GEMV's shape (bf16 and f16: the
/// split-K tensor-core GEMM).
pub fn qlinear_cases(quick: bool) -> Vec<QLinearCase> {
    let (n, k) = if quick { (75, 512) } else { (1024, 4096) };
    let mut v = Vec::new();
    for format in QuantFormat::ALL {
        // In features: half a 64-deep GEMM step past a multiple of it where the block allows.
        let k_tail = if format.default_block() == 32 { 544 } else { 768 };
        for dtype in DType::FLOATS {
            v.push(QLinearCase { format, dtype, rows: 1, n, k, pad: 0, accumulate: false });
            v.push(QLinearCase { format, dtype, rows: 7, n: 37, k: 256, pad: 8, accumulate: true });
            v.push(QLinearCase { format, dtype, rows: 3, n: 37, k: 256, pad: 3, accumulate: false });
            v.push(QLinearCase { format, dtype, rows: 70, n: 133, k: k_tail, pad: 0, accumulate: false });
            v.push(QLinearCase { format, dtype, rows: 20, n: 45, k: 512, pad: 8, accumulate: true });
            v.push(QLinearCase { format, dtype, rows: 8, n, k, pad: 0, accumulate: false });
        }
    }
    v
}
