//! RMSNorm backward (plain and fused residual-add): parity with the f64 reference's gradients on
//! every dtype, path and layout; bit-identical gradients under every emulated schedule (dw is
//! reduced without atomics); the reference itself against finite differences and against
//! PyTorch autograd in float64 (`scripts/make_autograd_fixtures.py`); each validation error.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{RmsNormBackwardCase, rms_norm_backward_case};
use llama_kernels::ops::rms_norm_backward::{dw_scratch_len, max_hidden};
use llama_kernels::ops::{self, WeightGrad};
use llama_kernels::reference::rms_norm::{rms_norm, rms_norm_backward};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: RmsNormBackwardCase) {
    let r = rms_norm_backward_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {:?}", r.describe(), device);
}

#[test]
fn gradients_match_the_reference_on_every_dtype_path_and_layout() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (rows, hidden) in [(1, 8), (7, 768), (83, 769), (300, 64), (1025, 40), (2, 4096), (3, 8192)] {
                assert_pass(&device, RmsNormBackwardCase::new(dtype, rows, hidden));
            }
            // Strided rows (pad 8 keeps the 16-byte path, pad 3 forces the scalar one), the fused
            // variant's d_residual, dw accumulated into a given gradient.
            for (rows, hidden, pad) in [(9, 4096, 8), (9, 4096, 3), (5, 1000, 3), (3, 8192, 8)] {
                assert_pass(&device, RmsNormBackwardCase::new(dtype, rows, hidden).strided(pad).fused());
                assert_pass(&device, RmsNormBackwardCase::new(dtype, rows, hidden).strided(pad).accumulating());
            }
            // The widest row each path keeps in registers.
            assert_pass(&device, RmsNormBackwardCase::new(dtype, 2, max_hidden(dtype)));
            assert_pass(&device, RmsNormBackwardCase::new(dtype, 2, 4095).fused());
        }
    }
}

#[test]
fn schedules_give_bit_identical_gradients() {
    for dtype in DType::FLOATS {
        for (rows, hidden, pad) in [(70, 4096, 0), (13, 769, 3), (2000, 16, 0)] {
            let case = RmsNormBackwardCase::new(dtype, rows, hidden).strided(pad).fused().accumulating();
            common::assert_schedules_agree(&format!("{case:?}"), |d| rms_norm_backward_case(d, case));
        }
    }
}

/// `sum(dy * rms_norm(x))` and its f64 gradients, for finite differences.
fn loss(x: &[f64], w: &[f64], dy: &[f64], hidden: usize) -> f64 {
    rms_norm(x, w, hidden, 1e-5).unwrap().iter().zip(dy).map(|(y, d)| y * d).sum()
}

#[test]
fn the_reference_agrees_with_central_differences() {
    let (rows, hidden) = (3, 17);
    let mut rng = Rng::new(11);
    let x = rng.normal_vec(rows * hidden, 1.0, DType::F32);
    let w = rng.uniform_vec(hidden, 0.5, 1.5, DType::F32);
    let dy = rng.normal_vec(rows * hidden, 1.0, DType::F32);
    let (dx, dw) = rms_norm_backward(&x, &w, &dy, hidden, 1e-5).unwrap();
    let worst = common::central_difference_error(&x, &dx, |x| loss(x, &w, &dy, hidden))
        .max(common::central_difference_error(&w, &dw, |w| loss(&x, w, &dy, hidden)));
    println!("largest |central difference - reference gradient|: {worst:.2e}");
    assert!(worst < 1e-7, "{worst}");
}

pub(crate) fn f64s(text: &str) -> Vec<f64> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let mut bytes = Vec::new();
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk.iter().filter(|&&c| c != b'=').count();
        let v = chunk[..n].iter().fold(0u32, |acc, &c| acc << 6 | u32::from(value(c))) << (6 * (4 - n));
        bytes.extend_from_slice(&v.to_be_bytes()[1..n]);
    }
    bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn gradients_match_pytorch_autograd_in_float64() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let device = Device::emulated();
    let mut checked = 0;
    for c in
        fixture["cases"].as_array().unwrap().iter().filter(|c| c["op"] == "rms_norm" || c["op"] == "fused_add_rms_norm")
    {
        let (rows, hidden) = (c["rows"].as_u64().unwrap() as usize, c["hidden"].as_u64().unwrap() as usize);
        let get = |k: &str| f64s(c[k].as_str().unwrap());
        let fused = c["op"] == "fused_add_rms_norm";
        let (x, w, dy) = (get("x"), get("w"), get("dy"));
        let up = |v: &[f64], shape: &[usize]| Tensor::from_f64(&device, DType::F32, v, shape).unwrap();
        // The fused forward stores s = x + residual; the backward takes s.
        let s: Vec<f64> = if fused { x.iter().zip(get("residual")).map(|(a, b)| a + b).collect() } else { x.clone() };
        let (st, wt, dyt) = (up(&s, &[rows, hidden]), up(&w, &[hidden]), up(&dy, &[rows, hidden]));
        let drt = fused.then(|| up(&get("d_residual"), &[rows, hidden]));
        let dxt = Tensor::poisoned(&device, DType::F32, &[rows, hidden]).unwrap();
        let dwt = Tensor::poisoned(&device, DType::F32, &[hidden]).unwrap();
        let scratch = Tensor::poisoned(&device, DType::F32, &[dw_scratch_len(rows, hidden)]).unwrap();
        let grad = WeightGrad { dw: &dwt, scratch: &scratch, accumulate: false };
        ops::rms_norm_backward(&dyt, &st, &wt, c["eps"].as_f64().unwrap() as f32, &dxt, drt.as_ref(), Some(grad))
            .unwrap();
        // f32 inputs (the f64 values rounded) and f32 arithmetic against float64 autograd.
        let tol = Tolerance { atol: 2e-5, rtol: 2e-5 };
        let (dx, dw) = (dxt.to_f64_vec().unwrap(), dwt.to_f64_vec().unwrap());
        let cx = compare(&dx, &get("dx"), tol);
        assert!(cx.pass, "{} {rows}x{hidden} dx: {}", c["op"], cx.describe(&[rows, hidden]));
        if fused {
            let cr = compare(&dx, &get("dresidual"), tol);
            assert!(cr.pass, "dresidual: {}", cr.describe(&[rows, hidden]));
        }
        let cw = compare(&dw, &get("dw"), tol);
        assert!(cw.pass, "{} dw: {}", c["op"], cw.describe(&[hidden]));
        checked += 1;
    }
    assert_eq!(checked, 5);
}

#[test]
fn in_place_without_dw_and_empty_batches() {
    let device = Device::emulated();
    let (rows, hidden) = (6, 256);
    let mut rng = Rng::new(3);
    let (x, w, dy) = (
        rng.normal_vec(rows * hidden, 1.0, DType::BF16),
        rng.uniform_vec(hidden, 0.5, 1.5, DType::BF16),
        rng.normal_vec(rows * hidden, 1.0, DType::BF16),
    );
    let up = |v: &[f64], shape: &[usize]| Tensor::from_f64(&device, DType::BF16, v, shape).unwrap();
    let (xt, wt, dyt) = (up(&x, &[2, 3, hidden]), up(&w, &[hidden]), up(&dy, &[2, 3, hidden]));
    ops::rms_norm_backward(&dyt, &xt, &wt, 1e-5, &dyt, None, None).unwrap(); // dx is dy
    let (want, _) = rms_norm_backward(&x, &w, &dy, hidden, 1e-5).unwrap();
    let c = compare(&dyt.to_f64_vec().unwrap(), &want, Tolerance::rounded_output(DType::BF16));
    assert!(c.pass, "{}", c.describe(&[rows, hidden]));
    // No rows: dx untouched, dw zeroed (or kept when accumulating).
    let empty = Tensor::zeros(&device, DType::BF16, &[0, hidden]).unwrap();
    let scratch = Tensor::zeros(&device, DType::F32, &[dw_scratch_len(0, hidden)]).unwrap();
    for accumulate in [false, true] {
        let dw = Tensor::from_f64(&device, DType::F32, &vec![2.5; hidden], &[hidden]).unwrap();
        let grad = WeightGrad { dw: &dw, scratch: &scratch, accumulate };
        ops::rms_norm_backward(&empty, &empty, &wt, 1e-5, &empty.clone(), None, Some(grad)).unwrap();
        let want = if accumulate { 2.5 } else { 0.0 };
        assert!(dw.to_f64_vec().unwrap().iter().all(|&v| v == want), "accumulate {accumulate}");
    }
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let (x, dy, dx, w) =
        (t(DType::BF16, &[4, 64]), t(DType::BF16, &[4, 64]), t(DType::BF16, &[4, 64]), t(DType::BF16, &[64]));
    let (dw, scratch) = (t(DType::F32, &[64]), t(DType::F32, &[dw_scratch_len(4, 64)]));
    let grad = || Some(WeightGrad { dw: &dw, scratch: &scratch, accumulate: false });
    let run =
        |dy: &Tensor, x: &Tensor, w: &Tensor, eps: f32, dx: &Tensor, dr: Option<&Tensor>, g: Option<WeightGrad<'_>>| {
            ops::rms_norm_backward(dy, x, w, eps, dx, dr, g).unwrap_err()
        };
    let e = run(&t(DType::BF16, &[4, 63]), &x, &w, 1e-5, &dx, None, None);
    assert!(matches!(e, Error::ShapeMismatch { what: "dy", .. }), "{e}");
    let e = run(&dy, &x, &t(DType::BF16, &[65]), 1e-5, &dx, None, None);
    assert!(matches!(e, Error::ShapeMismatch { what: "weight", .. }), "{e}");
    let e = run(&dy, &x, &w, 1e-5, &dx, Some(&t(DType::BF16, &[3, 64])), None);
    assert!(matches!(e, Error::ShapeMismatch { what: "d_residual", .. }), "{e}");
    let e = run(&dy, &x, &w, 1e-5, &t(DType::F16, &[4, 64]), None, None);
    assert!(matches!(e, Error::DTypeMismatch { what: "dx", .. }), "{e}");
    let bf16_dw = t(DType::BF16, &[64]);
    let e = run(&dy, &x, &w, 1e-5, &dx, None, Some(WeightGrad { dw: &bf16_dw, scratch: &scratch, accumulate: false }));
    assert!(matches!(e, Error::DTypeMismatch { what: "dw", .. }), "{e}");
    let small = t(DType::F32, &[63]);
    let e = run(&dy, &x, &w, 1e-5, &dx, None, Some(WeightGrad { dw: &dw, scratch: &small, accumulate: false }));
    assert!(matches!(e, Error::InvalidArgument { name: "dw scratch", .. }), "{e}");
    for eps in [f32::NAN, 0.0, -1.0] {
        let e = run(&dy, &x, &w, eps, &dx, None, grad());
        assert!(matches!(e, Error::InvalidArgument { name: "eps", .. }), "{eps}: {e}");
    }
    let wide = max_hidden(DType::BF16) + 8;
    let e = run(
        &t(DType::BF16, &[1, wide]),
        &t(DType::BF16, &[1, wide]),
        &t(DType::BF16, &[wide]),
        1e-5,
        &t(DType::BF16, &[1, wide]),
        None,
        None,
    );
    assert!(matches!(e, Error::InvalidArgument { name: "hidden", .. }), "{e}");
    let e = run(&dy, &x, &w, 1e-5, &x.clone(), None, None);
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let xi = t(DType::I32, &[4, 64]);
    let e = run(&xi, &xi, &t(DType::I32, &[64]), 1e-5, &t(DType::I32, &[4, 64]), None, None);
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    ops::rms_norm_backward(&dy, &x, &w, 1e-5, &dx, None, grad()).unwrap();
}
