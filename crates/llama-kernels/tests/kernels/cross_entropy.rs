//! Cross-entropy (`ops::cross_entropy`): loss, per-row losses and the gradient against the f64
//! reference for every dtype, Llama's vocabularies, ignored rows, i32/i64 labels, mean and sum,
//! in place and strided; bit-identical under every schedule; PyTorch float64 autograd; the
//! documented edge cases (no counted row, a bad label, a NaN logit); validation errors.

use crate::common;

use llama_kernels::dev::testing::{Tolerance, compare};
use llama_kernels::dev::verify::{CrossEntropyCase, cross_entropy_case};
use llama_kernels::ops::cross_entropy::{CrossEntropy, CrossEntropyOptions, Reduction};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: CrossEntropyCase) {
    let r = cross_entropy_case(device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
    assert!(r.pass, "{}", r.describe());
}

#[test]
fn loss_and_gradient_match_the_reference() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (rows, vocab) in [(1, 8), (7, 1000), (5, 4099), (33, 256), (2, 49_152)] {
                for (sum, in_place, i64_labels, pad) in
                    [(false, false, false, 0), (true, true, true, 0), (false, false, true, 5)]
                {
                    let case = CrossEntropyCase {
                        sum,
                        in_place,
                        i64_labels,
                        pad,
                        grad_scale: if sum { 0.25 } else { 1.0 },
                        ..CrossEntropyCase::new(dtype, rows, vocab)
                    };
                    assert_pass(&device, case);
                }
            }
        }
    }
}

#[test]
fn llama3_vocabulary() {
    for device in common::devices() {
        assert_pass(&device, CrossEntropyCase::new(DType::BF16, 3, 128_256));
    }
}

#[test]
fn schedules_give_bit_identical_results() {
    for case in [
        CrossEntropyCase::new(DType::BF16, 6, 3000),
        CrossEntropyCase { sum: true, ..CrossEntropyCase::new(DType::F32, 5, 777) },
    ] {
        common::assert_schedules_agree(&format!("{case:?}"), |d| cross_entropy_case(d, case));
    }
}

#[test]
fn loss_and_gradient_match_pytorch_autograd_in_float64() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let device = Device::emulated();
    let mut checked = 0;
    for c in fixture["cases"].as_array().unwrap().iter().filter(|c| c["op"] == "cross_entropy") {
        let (rows, vocab) = (c["rows"].as_u64().unwrap() as usize, c["vocab"].as_u64().unwrap() as usize);
        let labels: Vec<i64> = c["labels"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap()).collect();
        let get = |k: &str| crate::rms_norm_backward::f64s(c[k].as_str().unwrap());
        let logits = Tensor::from_f64(&device, DType::F32, &get("logits"), &[rows, vocab]).unwrap();
        let lt = Tensor::from_slice(&device, &labels, &[rows]).unwrap();
        let (loss, grad) = (
            Tensor::poisoned(&device, DType::F32, &[1]).unwrap(),
            Tensor::poisoned(&device, DType::F32, &[rows, vocab]).unwrap(),
        );
        let reduction = if c["reduction"] == "sum" { Reduction::Sum } else { Reduction::Mean };
        let ce = CrossEntropy::new(&device, rows).unwrap();
        ce.forward(&logits, &lt, &loss, Some(&grad), &CrossEntropyOptions { reduction, ..Default::default() }).unwrap();
        let want = c["loss"].as_f64().unwrap();
        let got = loss.to_f64_vec().unwrap()[0];
        assert!((got - want).abs() < 1e-5 * want.abs().max(1.0), "{reduction:?}: loss {got} vs torch {want}");
        let cmp = compare(&grad.to_f64_vec().unwrap(), &get("dlogits"), Tolerance { atol: 1e-6, rtol: 1e-5 });
        assert!(cmp.pass, "{reduction:?}: {}", cmp.describe(&[rows, vocab]));
        checked += 1;
    }
    assert_eq!(checked, 2);
}

#[test]
fn every_label_ignored_gives_a_nan_mean_and_zero_gradients() {
    let d = Device::emulated();
    let logits = Tensor::from_f64(&d, DType::F32, &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let labels = Tensor::from_slice(&d, &[-100i32, -100], &[2]).unwrap();
    let (loss, grad) =
        (Tensor::poisoned(&d, DType::F32, &[1]).unwrap(), Tensor::poisoned(&d, DType::F32, &[2, 3]).unwrap());
    let ce = CrossEntropy::new(&d, 4).unwrap();
    ce.forward(&logits, &labels, &loss, Some(&grad), &CrossEntropyOptions::default()).unwrap();
    assert!(loss.to_f64_vec().unwrap()[0].is_nan());
    assert!(grad.to_f64_vec().unwrap().iter().all(|&g| g == 0.0));
    let sum = CrossEntropyOptions { reduction: Reduction::Sum, ..Default::default() };
    ce.forward(&logits, &labels, &loss, Some(&grad), &sum).unwrap();
    assert_eq!(loss.to_f64_vec().unwrap()[0], 0.0);
}

#[test]
fn a_bad_label_is_flagged_and_its_loss_is_nan() {
    let d = Device::emulated();
    let logits = Tensor::from_f64(&d, DType::BF16, &[0.0; 8], &[2, 4]).unwrap();
    let (loss, grad) =
        (Tensor::poisoned(&d, DType::F32, &[1]).unwrap(), Tensor::poisoned(&d, DType::BF16, &[2, 4]).unwrap());
    let ce = CrossEntropy::new(&d, 2).unwrap();
    for bad in [4i64, -1, i64::MAX] {
        let labels = Tensor::from_slice(&d, &[1i64, bad], &[2]).unwrap();
        ce.forward(&logits, &labels, &loss, Some(&grad), &CrossEntropyOptions::default()).unwrap();
        let rows = ce.row_losses(2).unwrap().to_f64_vec().unwrap();
        assert!((rows[0] - 4f64.ln()).abs() < 1e-6 && rows[1].is_nan(), "{rows:?}");
        assert!(loss.to_f64_vec().unwrap()[0].is_nan());
        assert!(grad.to_f64_vec().unwrap()[4..].iter().all(|&g| g == 0.0));
        let e = ce.check_labels().unwrap_err();
        assert!(e.to_string().contains("label"), "{e}");
        ce.check_labels().unwrap(); // read and cleared
    }
}

#[test]
fn a_nan_logit_makes_its_row_nan() {
    let d = Device::emulated();
    let logits = Tensor::from_f64(&d, DType::F32, &[0.0, f64::NAN, 0.0, 0.0, 1.0, 2.0], &[2, 3]).unwrap();
    let labels = Tensor::from_slice(&d, &[0i32, 2], &[2]).unwrap();
    let loss = Tensor::poisoned(&d, DType::F32, &[1]).unwrap();
    let ce = CrossEntropy::new(&d, 2).unwrap();
    ce.forward(&logits, &labels, &loss, None, &CrossEntropyOptions::default()).unwrap();
    let rows = ce.row_losses(2).unwrap().to_f64_vec().unwrap();
    assert!(rows[0].is_nan() && rows[1].is_finite(), "{rows:?}");
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let ce = CrossEntropy::new(&d, 4).unwrap();
    let (x, loss) = (t(DType::BF16, &[4, 10]), t(DType::F32, &[1]));
    let labels = Tensor::from_slice(&d, &[0i32, 1, 2, 3], &[4]).unwrap();
    let o = CrossEntropyOptions::default();
    let e = ce.forward(&x, &t(DType::F32, &[4]), &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "labels", .. }), "{e}");
    let e = ce.forward(&x, &t(DType::I32, &[2, 2]), &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "labels", .. }), "{e}");
    let e = ce.forward(&t(DType::BF16, &[3, 10]), &labels, &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "labels", .. }), "{e}");
    let e = ce.forward(&t(DType::BF16, &[40]), &labels, &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "logits", .. }), "{e}");
    let e = ce.forward(&x, &labels, &loss, Some(&t(DType::F32, &[4, 10])), &o).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "grad", .. }), "{e}");
    let e = ce.forward(&x, &labels, &loss, Some(&t(DType::BF16, &[4, 9])), &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "grad", .. }), "{e}");
    let e = ce.forward(&x, &labels, &t(DType::BF16, &[1]), None, &o).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "loss", .. }), "{e}");
    let e = ce.forward(&x, &labels, &t(DType::F32, &[2]), None, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "loss", .. }), "{e}");
    let e = ce.forward(&t(DType::I32, &[4, 10]), &labels, &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    let e = ce.forward(&t(DType::BF16, &[4, 0]), &labels, &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "vocab", .. }), "{e}");
    let e = ce.forward(&x, &labels, &loss, None, &CrossEntropyOptions { grad_scale: f32::NAN, ..o }).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "grad_scale", .. }), "{e}");
    let five = Tensor::from_slice(&d, &[0i32; 5], &[5]).unwrap();
    let e = ce.forward(&t(DType::BF16, &[5, 10]), &five, &loss, None, &o).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "rows", .. }), "{e}");
    let wide = t(DType::BF16, &[4, 11]);
    let e = ce
        .forward(&wide.narrow(1, 0, 10).unwrap(), &labels, &loss, Some(&wide.narrow(1, 1, 10).unwrap()), &o)
        .unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // An empty batch: the mean of nothing.
    let none = Tensor::from_slice(&d, &[0i32; 0], &[0]).unwrap();
    ce.forward(&t(DType::BF16, &[0, 10]), &none, &loss, None, &o).unwrap();
    assert!(loss.to_f64_vec().unwrap()[0].is_nan());
}

#[test]
fn fused_lm_head_matches_the_plain_composition_and_the_reference() {
    use llama_kernels::dev::testing::{Rng, linear_tolerance};
    use llama_kernels::dtype::round_to;
    use llama_kernels::ops::cross_entropy::{FusedLinearCrossEntropy, LmHeadGrads};
    use llama_kernels::ops::{linear, linear_backward_input, linear_backward_weight};
    use llama_kernels::reference;
    let d = Device::emulated();
    for dtype in DType::FLOATS {
        for (tokens, width, vocab, chunk, accumulate) in
            [(9, 64, 1000, 4, false), (5, 32, 257, 8, true), (16, 48, 128, 16, false)]
        {
            let mut rng = Rng::new((tokens * 1000 + vocab) as u64);
            let h = rng.normal_vec(tokens * width, 1.0, dtype);
            let w = rng.normal_vec(vocab * width, 3.0 / (width as f64).sqrt(), dtype);
            let dw0 = rng.normal_vec(vocab * width, 1.0, DType::F32);
            let labels: Vec<i32> =
                (0..tokens).map(|t| if t % 4 == 2 { -100 } else { rng.below(vocab as u64) as i32 }).collect();
            let (ht, wt) = (
                Tensor::from_f64(&d, dtype, &h, &[tokens, width]).unwrap(),
                Tensor::from_f64(&d, dtype, &w, &[vocab, width]).unwrap(),
            );
            let lt = Tensor::from_slice(&d, &labels, &[tokens]).unwrap();
            let o = CrossEntropyOptions::default();

            let fused = FusedLinearCrossEntropy::new(&d, dtype, vocab, tokens, chunk).unwrap();
            let (loss, dh) = (
                Tensor::poisoned(&d, DType::F32, &[1]).unwrap(),
                Tensor::poisoned(&d, dtype, &[tokens, width]).unwrap(),
            );
            let dw = Tensor::from_f64(&d, DType::F32, &dw0, &[vocab, width]).unwrap();
            let grads = LmHeadGrads { d_hidden: Some(&dh), d_weight: Some(&dw), accumulate_weight: accumulate };
            fused.forward(&ht, &wt, &lt, &loss, grads, &o).unwrap();

            // The plain composition: the full logits, the loss over them, the two products.
            let logits = Tensor::poisoned(&d, dtype, &[tokens, vocab]).unwrap();
            linear(&ht, &wt, None, &logits).unwrap();
            let (loss2, dh2) = (
                Tensor::poisoned(&d, DType::F32, &[1]).unwrap(),
                Tensor::poisoned(&d, dtype, &[tokens, width]).unwrap(),
            );
            CrossEntropy::new(&d, tokens).unwrap().forward(&logits, &lt, &loss2, Some(&logits), &o).unwrap();
            linear_backward_input(&logits, &wt, &dh2, false).unwrap();
            let bits = |t: &Tensor| t.to_f64_vec().unwrap().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&loss), bits(&loss2), "{dtype} {tokens}x{vocab}: loss");
            assert_eq!(bits(&dh), bits(&dh2), "{dtype} {tokens}x{vocab}: d_hidden");
            let dw2 = Tensor::from_f64(&d, DType::F32, &dw0, &[vocab, width]).unwrap();
            linear_backward_weight(&logits, &ht, &dw2, accumulate).unwrap();

            // The f64 reference: logits rounded once to the dtype (as Hugging Face computes them).
            let exact = reference::linear::linear(&h, &w, None, width, vocab).unwrap();
            let lref: Vec<f64> = exact.iter().map(|&v| round_to(dtype, v)).collect();
            let labels64: Vec<i64> = labels.iter().map(|&l| i64::from(l)).collect();
            let want = reference::cross_entropy::cross_entropy(&lref, &labels64, vocab, -100, true, 1.0).unwrap();
            let lmax = lref.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            // A logit rounded the other way moves a row's loss by at most 2 ulps of it.
            let margin = 2.0 * dtype.unit_roundoff() * 2.0 * lmax;
            let got = loss.to_f64_vec().unwrap()[0];
            assert!((got - want.loss).abs() <= 1e-5 * want.loss.abs() + margin, "{dtype}: loss {got} vs {}", want.loss);
            let dl: Vec<f64> = want.grad.iter().map(|&g| round_to(dtype, g)).collect();
            let (dh_ref, dw_ref) = reference::linear::linear_backward(&dl, &h, &w, width, vocab).unwrap();
            let dmax = dl.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let wmax = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let hmax = h.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let cmp = compare(&dh.to_f64_vec().unwrap(), &dh_ref, linear_tolerance(dtype, vocab, dmax * wmax));
            assert!(cmp.pass, "{dtype} d_hidden: {}", cmp.describe(&[tokens, width]));
            let dw_want: Vec<f64> =
                dw_ref.iter().zip(&dw0).map(|(g, w0)| if accumulate { g + w0 } else { *g }).collect();
            let tol = linear_tolerance(DType::F32, tokens, dmax * hmax);
            let cmp = compare(&dw.to_f64_vec().unwrap(), &dw_want, tol);
            assert!(cmp.pass, "{dtype} d_weight: {}", cmp.describe(&[vocab, width]));
            let cmp = compare(&dw.to_f64_vec().unwrap(), &dw2.to_f64_vec().unwrap(), tol);
            assert!(cmp.pass, "{dtype} d_weight vs one product: {}", cmp.describe(&[vocab, width]));
        }
    }
}

#[test]
fn fused_lm_head_validation_and_empty_batches() {
    use llama_kernels::ops::cross_entropy::{FusedLinearCrossEntropy, LmHeadGrads};
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let f = FusedLinearCrossEntropy::new(&d, DType::BF16, 50, 8, 4).unwrap();
    let (h, w, loss) = (t(DType::BF16, &[6, 16]), t(DType::BF16, &[50, 16]), t(DType::F32, &[1]));
    let labels = Tensor::from_slice(&d, &[1i32, 2, 3, 4, 5, -100], &[6]).unwrap();
    let o = CrossEntropyOptions::default();
    let none = LmHeadGrads::default();
    let e = f.forward(&h, &t(DType::BF16, &[49, 16]), &labels, &loss, none, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "weight", .. }), "{e}");
    let e = f.forward(&t(DType::F32, &[6, 16]), &w, &labels, &loss, none, &o).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "hidden", .. }), "{e}");
    let e = f.forward(&h, &w, &labels.narrow(0, 0, 5).unwrap(), &loss, none, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "labels", .. }), "{e}");
    let bad = LmHeadGrads { d_hidden: Some(&t(DType::BF16, &[6, 15])), ..none };
    let e = f.forward(&h, &w, &labels, &loss, bad, &o).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "d_hidden", .. }), "{e}");
    let nine = Tensor::from_slice(&d, &[0i32; 9], &[9]).unwrap();
    let e = f.forward(&t(DType::BF16, &[9, 16]), &w, &nine, &loss, none, &o).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "rows", .. }), "{e}");
    let e = FusedLinearCrossEntropy::new(&d, DType::BF16, 50, 8, 0).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "chunk_rows", .. }), "{e}");
    assert_eq!(FusedLinearCrossEntropy::chunk_rows_for(128_256, DType::BF16, 64 << 20), 256);
    // No tokens: the mean is NaN and d_weight is zeroed.
    let dw = Tensor::poisoned(&d, DType::F32, &[50, 16]).unwrap();
    let empty = Tensor::from_slice(&d, &[0i32; 0], &[0]).unwrap();
    f.forward(&t(DType::BF16, &[0, 16]), &w, &empty, &loss, LmHeadGrads { d_weight: Some(&dw), ..none }, &o).unwrap();
    assert!(loss.to_f64_vec().unwrap()[0].is_nan());
    assert!(dw.to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
    f.forward(&h, &w, &labels, &loss, none, &o).unwrap();
    assert!(loss.to_f64_vec().unwrap()[0].is_finite());
}
