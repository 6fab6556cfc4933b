//! Dropout and the LoRA branch: every dtype and both access paths against the f64 reference
//! (the mask exactly), bit-identical under every schedule, the mask's rate and independence
//! across streams, the reference's gradients against central differences, and validation errors.

use crate::common;

use llama_kernels::dev::testing::Rng;
use llama_kernels::dev::verify::{DropoutCase, LoraCase, dropout_case, lora_case};
use llama_kernels::ops::dropout::{Dropout, dropout};
use llama_kernels::ops::lora::{LoraAdapter, LoraConfig, LoraGrads, LoraScratch, lora_backward, lora_forward};
use llama_kernels::reference::dropout::keeps;
use llama_kernels::reference::lora;
use llama_kernels::{DType, Device, Error, Tensor};

#[test]
fn dropout_matches_the_reference_and_its_mask_exactly() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            // (rows, cols, pad): vector rows, odd widths on the scalar path, strided rows.
            for (rows, cols, pad) in [(1, 8, 0), (6, 1000, 0), (5, 257, 3), (3, 64, 8)] {
                for (p, scale, accumulate) in
                    [(0.0, 1.0, false), (0.05, 2.0, false), (0.5, 1.0, true), (0.9, 0.5, false)]
                {
                    let case = DropoutCase { scale, accumulate, pad, ..DropoutCase::new(dtype, rows, cols, p) };
                    let r = dropout_case(&device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                    assert!(r.pass, "{case:?}: {}", r.describe());
                }
            }
        }
    }
}

#[test]
fn the_mask_drops_at_its_rate_and_streams_are_independent() {
    let (rows, cols) = (64, 1024);
    let n = (rows * cols) as f64;
    for p in [0.05, 0.1, 0.5] {
        let (a, b) = (Dropout { p, seed: 9, stream: 0 }, Dropout { p, seed: 9, stream: 1 });
        let (mut dropped, mut both) = (0usize, 0usize);
        for t in 0..rows {
            for i in 0..cols {
                let (ka, kb) = (keeps(&a, t, i), keeps(&b, t, i));
                dropped += usize::from(!ka);
                both += usize::from(!ka && !kb);
            }
        }
        // Binomial counts: within 5 standard deviations.
        let sd = (n * p * (1.0 - p)).sqrt();
        assert!((dropped as f64 - n * p).abs() < 5.0 * sd, "p {p}: dropped {dropped} of {n}");
        let (pb, sdb) = (p * p, (n * p * p * (1.0 - p * p)).sqrt());
        assert!((both as f64 - n * pb).abs() < 5.0 * sdb, "p {p}: both streams dropped {both}");
    }
    assert!((0..4096).all(|i| keeps(&Dropout::NONE, 0, i)), "p = 0 keeps everything");
}

#[test]
fn dropout_schedules_and_access_paths_agree_bit_for_bit() {
    let case = DropoutCase { pad: 0, ..DropoutCase::new(DType::BF16, 9, 520, 0.3) };
    common::assert_schedules_agree(&format!("{case:?}"), |d| dropout_case(d, case));
    // The same mask on the vector path (aligned rows) and the scalar path (a row offset by one
    // element): the mask is a function of (row, column), not of the access width.
    let device = Device::emulated();
    let mask = Dropout { p: 0.25, seed: 77, stream: 5 };
    let (rows, cols) = (4, 64);
    let x = Tensor::from_f64(&device, DType::F16, &vec![1.0; rows * (cols + 1)], &[rows, cols + 1]).unwrap();
    let (aligned, shifted) = (x.narrow(1, 0, cols).unwrap(), x.narrow(1, 1, cols).unwrap());
    let out = |src: &Tensor| {
        let o = Tensor::poisoned(&device, DType::F16, &[rows, cols]).unwrap();
        dropout(src, &o, &mask, 1.0).unwrap();
        o.to_f64_vec().unwrap()
    };
    assert_eq!(out(&aligned), out(&shifted));
}

#[test]
fn lora_matches_the_reference() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (tokens, d_in, d_out, cfg) in [
                (8, 64, 48, LoraConfig::QLORA),
                (5, 70, 33, LoraConfig { r: 3, alpha: 7.0, dropout: 0.0, rslora: true }),
                (1, 128, 8, LoraConfig { r: 8, alpha: -4.0, dropout: 0.5, rslora: false }),
            ] {
                for (f32_grads, accumulate) in [(true, false), (false, true)] {
                    let case = LoraCase { f32_grads, accumulate, ..LoraCase::new(dtype, tokens, d_in, d_out, cfg) };
                    let r = lora_case(&device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                    assert!(r.pass, "{case:?}: {}", r.describe());
                }
            }
        }
    }
}

#[test]
fn lora_schedules_give_bit_identical_results() {
    let case = LoraCase::new(DType::BF16, 12, 96, 40, LoraConfig::QLORA);
    common::assert_schedules_agree(&format!("{case:?}"), |d| lora_case(d, case));
}

#[test]
fn the_lora_reference_agrees_with_central_differences() {
    let (tokens, d_in, d_out) = (3, 10, 7);
    let cfg = LoraConfig { r: 4, alpha: 6.0, dropout: 0.3, rslora: false };
    let mask = Dropout { p: cfg.dropout, seed: 5, stream: 2 };
    let mut rng = Rng::new(21);
    let (x, a, b, dy) = (
        rng.normal_vec(tokens * d_in, 1.0, DType::F32),
        rng.normal_vec(cfg.r * d_in, 0.5, DType::F32),
        rng.normal_vec(d_out * cfg.r, 0.5, DType::F32),
        rng.normal_vec(tokens * d_out, 1.0, DType::F32),
    );
    let shape = [d_out, d_in];
    let g = lora::lora_backward(&dy, &x, &a, &b, &cfg, &mask, shape).unwrap();
    let loss = |x: &[f64], a: &[f64], b: &[f64]| {
        let y = lora::lora_forward(x, a, b, &cfg, &mask, shape).unwrap();
        y.iter().zip(&dy).map(|(y, d)| y * d).sum::<f64>()
    };
    let worst = common::central_difference_error(&x, &g.dx, |v| loss(v, &a, &b))
        .max(common::central_difference_error(&a, &g.da, |v| loss(&x, v, &b)))
        .max(common::central_difference_error(&b, &g.db, |v| loss(&x, &a, v)));
    println!("largest |central difference - reference gradient|: {worst:.2e}");
    assert!(worst < 1e-7, "{worst}");
    // With B = 0 (peft's initialization) the first step's dA is exactly zero.
    let zero_b = vec![0.0; b.len()];
    let g0 = lora::lora_backward(&dy, &x, &a, &zero_b, &cfg, &mask, shape).unwrap();
    assert!(g0.da.iter().all(|&v| v == 0.0) && g0.db.iter().any(|&v| v != 0.0));
}

#[test]
fn bad_arguments_are_named_errors() {
    let device = Device::emulated();
    let dt = DType::BF16;
    let t = |shape: &[usize]| Tensor::zeros(&device, dt, shape).unwrap();
    let (x, y, a, b) = (t(&[4, 32]), t(&[4, 16]), t(&[2, 32]), t(&[16, 2]));
    let scratch = LoraScratch::new(&device, dt, 4, 32, 2).unwrap();
    let cfg = LoraConfig { r: 2, alpha: 4.0, dropout: 0.1, rslora: false };
    let ad = |cfg: LoraConfig, a, b| LoraAdapter { cfg, a, b, seed: 0, stream: 0 };
    let invalid = |e: Error| matches!(e, Error::InvalidArgument { .. });
    let shape = |e: Error| matches!(e, Error::ShapeMismatch { .. });
    assert!(invalid(lora_forward(&ad(LoraConfig { r: 0, ..cfg }, &a, &b), &x, &y, &scratch).unwrap_err()));
    assert!(invalid(lora_forward(&ad(LoraConfig { dropout: 1.0, ..cfg }, &a, &b), &x, &y, &scratch).unwrap_err()));
    assert!(invalid(lora_forward(&ad(LoraConfig { alpha: f64::NAN, ..cfg }, &a, &b), &x, &y, &scratch).unwrap_err()));
    // A of the wrong rank, B of the wrong width, x of the wrong width, y of other rows.
    let (a3, b3) = (t(&[3, 32]), t(&[16, 3]));
    assert!(shape(lora_forward(&ad(cfg, &a3, &b), &x, &y, &scratch).unwrap_err()));
    assert!(shape(lora_forward(&ad(cfg, &a, &b3), &x, &y, &scratch).unwrap_err()));
    assert!(shape(lora_forward(&ad(cfg, &a, &b), &t(&[4, 31]), &y, &scratch).unwrap_err()));
    assert!(shape(lora_forward(&ad(cfg, &a, &b), &x, &t(&[5, 16]), &scratch).unwrap_err()));
    // A scratch too small for the call.
    let small = LoraScratch::new(&device, dt, 2, 32, 2).unwrap();
    assert!(invalid(lora_forward(&ad(cfg, &a, &b), &x, &y, &small).unwrap_err()));
    // Mixed dtypes.
    let a32 = Tensor::zeros(&device, DType::F32, &[2, 32]).unwrap();
    assert!(matches!(lora_forward(&ad(cfg, &a32, &b), &x, &y, &scratch).unwrap_err(), Error::DTypeMismatch { .. }));
    // Gradients of the wrong shape.
    let (bad_da, db) = (t(&[2, 31]), t(&[16, 2]));
    let grads = LoraGrads { da: &bad_da, db: &db, accumulate: false };
    assert!(shape(lora_backward(&ad(cfg, &a, &b), &x, &y, &grads, None, &scratch).unwrap_err()));
    // Dropout: p outside [0, 1), a scale that overflows f32.
    let o = t(&[4, 32]);
    assert!(invalid(dropout(&x, &o, &Dropout { p: -0.1, ..Dropout::NONE }, 1.0).unwrap_err()));
    assert!(invalid(dropout(&x, &o, &Dropout { p: 0.5, ..Dropout::NONE }, 1e39).unwrap_err()));
    // In place through two tensors over the same memory is an overlap, not a race.
    assert!(dropout(&x, &x, &Dropout::NONE, 1.0).is_err());
}
