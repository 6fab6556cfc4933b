//! Linear backward (`dx = dy W`, `dw = dyᵀ x`): parity with the f64 reference for every dtype,
//! strided rows, accumulation and f32 outputs; the reference against the forward by the adjoint
//! identity; empty batches; validation errors.

use llama_kernels::dev::testing::{Rng, compare, linear_tolerance};
use llama_kernels::dev::verify::{gaps_poisoned, rows_tensor};
use llama_kernels::ops::{linear_backward_input, linear_backward_weight};
use llama_kernels::reference::linear::{linear, linear_backward};
use llama_kernels::{DType, Device, Error, Tensor};

#[derive(Clone, Copy, Debug)]
struct Case {
    dtype: DType,
    /// Of dx and dw: `dtype` or f32.
    out: DType,
    tokens: usize,
    d_in: usize,
    d_out: usize,
    accumulate: bool,
    pad: usize,
}

fn run(device: &Device, c: Case) {
    let mut rng = Rng::new((c.tokens * 131 + c.d_in * 7 + c.d_out) as u64 ^ u64::from(c.accumulate) << 40);
    let x = rng.normal_vec(c.tokens * c.d_in, 1.0, c.dtype);
    let dy = rng.normal_vec(c.tokens * c.d_out, 1.0, c.dtype);
    let w = rng.normal_vec(c.d_out * c.d_in, 1.0 / (c.d_in as f64).sqrt(), c.dtype);
    let dx0 = rng.normal_vec(c.tokens * c.d_in, 1.0, c.out);
    let dw0 = rng.normal_vec(c.d_out * c.d_in, 1.0, c.out);
    let (xt, _) = rows_tensor(device, c.dtype, &x, c.tokens, c.d_in, c.pad).unwrap();
    let (dyt, _) = rows_tensor(device, c.dtype, &dy, c.tokens, c.d_out, c.pad).unwrap();
    let wt = Tensor::from_f64(device, c.dtype, &w, &[c.d_out, c.d_in]).unwrap();
    let out = |init: &[f64], rows: usize, cols: usize| {
        if c.accumulate {
            rows_tensor(device, c.out, init, rows, cols, c.pad).unwrap()
        } else {
            let full = Tensor::poisoned(device, c.out, &[rows, cols + c.pad]).unwrap();
            (full.narrow(1, 0, cols).unwrap(), full)
        }
    };
    let (dxt, dxfull) = out(&dx0, c.tokens, c.d_in);
    let (dwt, dwfull) = out(&dw0, c.d_out, c.d_in);
    linear_backward_input(&dyt, &wt, &dxt, c.accumulate).unwrap();
    linear_backward_weight(&dyt, &xt, &dwt, c.accumulate).unwrap();
    let (mut dx, mut dw) = linear_backward(&dy, &x, &w, c.d_in, c.d_out).unwrap();
    if c.accumulate {
        dx.iter_mut().zip(&dx0).for_each(|(e, v)| *e += v);
        dw.iter_mut().zip(&dw0).for_each(|(e, v)| *e += v);
    }
    let max = |v: &[f64]| v.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let checks = [
        ("dx", &dxt, &dx, c.d_out, max(&dy) * max(&w), [c.tokens, c.d_in], &dxfull),
        ("dw", &dwt, &dw, c.tokens, max(&dy) * max(&x), [c.d_out, c.d_in], &dwfull),
    ];
    for (what, got, want, k, scale, shape, full) in checks {
        let cmp = compare(&got.to_f64_vec().unwrap(), want, linear_tolerance(c.out, k, scale));
        assert!(cmp.pass, "{c:?} {what}: {}", cmp.describe(&shape));
        if c.pad > 0 && !c.accumulate {
            assert!(gaps_poisoned(full, shape[1]).unwrap(), "{c:?}: {what} written outside its rows");
        }
    }
}

#[test]
fn gradients_match_the_reference_for_every_dtype_layout_and_output() {
    let device = Device::emulated();
    for dtype in DType::FLOATS {
        for out in [dtype, DType::F32] {
            for (tokens, d_in, d_out) in [(1, 64, 32), (7, 96, 40), (33, 128, 256), (5, 1, 3), (3, 7, 1)] {
                for accumulate in [false, true] {
                    for pad in [0, 3] {
                        run(&device, Case { dtype, out, tokens, d_in, d_out, accumulate, pad });
                    }
                }
            }
        }
    }
}

#[test]
fn the_reference_is_the_adjoint_of_the_forward() {
    // <dy, x Wᵀ> = <dx, x> = <dw, W> for the reference's dx and dw: both are linear in their
    // argument, so this identity pins each down independently of the loop that computes it.
    let (tokens, d_in, d_out) = (5, 12, 7);
    let mut rng = Rng::new(9);
    let x = rng.normal_vec(tokens * d_in, 1.0, DType::F32);
    let w = rng.normal_vec(d_out * d_in, 1.0, DType::F32);
    let dy = rng.normal_vec(tokens * d_out, 1.0, DType::F32);
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a * b).sum::<f64>();
    let y = linear(&x, &w, None, d_in, d_out).unwrap();
    let (dx, dw) = linear_backward(&dy, &x, &w, d_in, d_out).unwrap();
    let l = dot(&dy, &y);
    assert!((dot(&dx, &x) - l).abs() < 1e-12 * l.abs().max(1.0), "{} vs {l}", dot(&dx, &x));
    assert!((dot(&dw, &w) - l).abs() < 1e-12 * l.abs().max(1.0), "{} vs {l}", dot(&dw, &w));
    // And each entry of dx against a unit perturbation of x (exact for a linear map).
    for i in 0..x.len() {
        let mut xp = x.clone();
        xp[i] += 1.0;
        let d = dot(&dy, &linear(&xp, &w, None, d_in, d_out).unwrap()) - l;
        assert!((d - dx[i]).abs() < 1e-12 * d.abs().max(1.0), "dx[{i}]");
    }
}

#[test]
fn an_empty_batch_zeroes_dw_or_leaves_it() {
    let d = Device::emulated();
    let dy = Tensor::zeros(&d, DType::BF16, &[0, 8]).unwrap();
    let x = Tensor::zeros(&d, DType::BF16, &[0, 4]).unwrap();
    let dw = Tensor::poisoned(&d, DType::F32, &[8, 4]).unwrap();
    linear_backward_weight(&dy, &x, &dw, false).unwrap();
    assert!(dw.to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
    let ones = Tensor::from_f64(&d, DType::F32, &[1.0; 32], &[8, 4]).unwrap();
    linear_backward_weight(&dy, &x, &ones, true).unwrap();
    assert!(ones.to_f64_vec().unwrap().iter().all(|&v| v == 1.0));
    let w = Tensor::zeros(&d, DType::BF16, &[8, 4]).unwrap();
    linear_backward_input(&dy, &w, &x, false).unwrap();
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let (dy, x, w) = (t(DType::BF16, &[4, 8]), t(DType::BF16, &[4, 6]), t(DType::BF16, &[8, 6]));
    let (dx, dw) = (t(DType::BF16, &[4, 6]), t(DType::F32, &[8, 6]));
    let e = linear_backward_input(&dy, &t(DType::BF16, &[8, 6, 1]), &dx, false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "weight", .. }), "{e}");
    let e = linear_backward_input(&dy, &t(DType::BF16, &[7, 6]), &dx, false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "dy", .. }), "{e}");
    let e = linear_backward_input(&dy, &w, &t(DType::BF16, &[3, 6]), false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "dx", .. }), "{e}");
    let e = linear_backward_input(&dy, &w, &t(DType::F16, &[4, 6]), false).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "dx", .. }), "{e}");
    let e = linear_backward_input(&dy, &t(DType::F32, &[8, 6]), &dx, false).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "weight", .. }), "{e}");
    let e = linear_backward_input(&dy, &w, &dy.narrow(1, 0, 6).unwrap(), false).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let e = linear_backward_weight(&dy, &t(DType::BF16, &[5, 6]), &dw, false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "x", .. }), "{e}");
    let e = linear_backward_weight(&dy, &x, &t(DType::F32, &[8, 5]), false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "x", .. }), "{e}");
    let e = linear_backward_weight(&dy, &x, &t(DType::F32, &[48]), false).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "dw", .. }), "{e}");
    let e = linear_backward_weight(&t(DType::I32, &[4, 8]), &x, &dw, false).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    let e = linear_backward_weight(&dy, &x, &t(DType::F16, &[8, 6]), false).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "dw", .. }), "{e}");
    linear_backward_input(&dy, &w, &dx, true).unwrap();
    linear_backward_weight(&dy, &x, &dw, true).unwrap();
}

#[test]
fn the_verify_rows_pass() {
    use llama_kernels::dev::verify::{linear_backward_case, linear_backward_cases};
    for device in crate::common::devices() {
        for case in linear_backward_cases(true) {
            let r = linear_backward_case(&device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            assert!(r.pass, "{}", r.describe());
        }
    }
}
