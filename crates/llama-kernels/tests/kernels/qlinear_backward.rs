//! The input gradient through a packed weight (`ops::qlinear_backward`): `dx (+)= dy W` for every
//! format and dtype on both paths (the tensor-core GEMM from the packed bytes, bands dequantized
//! for the dense GEMM) against the f64 product with the weight the path multiplies by, with
//! partial tiles, output widths that are not a multiple of 8, strides and accumulation; it is
//! the exact gradient of the forward's product (a central difference of the f64 forward);
//! schedules agree bit for bit; an empty depth zeroes `dx`; each bad input is a named error.

use crate::common;

use llama_kernels::dev::testing::Rng;
use llama_kernels::dev::verify::{
    QLinearCase, qlinear_backward_input_case, qlinear_backward_input_cases, random_packed,
};
use llama_kernels::ops::qlinear::{QPath, QScratch, QWeight, qlinear};
use llama_kernels::ops::qlinear_backward::qlinear_backward_input;
use llama_kernels::reference;
use llama_kernels::spec::quant::QuantFormat;
use llama_kernels::{DType, Device, Error, Tensor};

#[test]
fn every_format_and_dtype_matches_the_reference_on_both_paths() {
    let device = Device::emulated();
    for case in qlinear_backward_input_cases(true) {
        let r = qlinear_backward_input_case(&device, case).unwrap();
        assert!(r.pass, "{case:?}: {}", r.describe());
    }
}

#[test]
fn the_tensor_core_path_handles_partial_tiles_narrow_depths_strides_and_accumulation() {
    let device = Device::emulated();
    for format in [QuantFormat::NF4, QuantFormat::Q4_K, QuantFormat::Q8_0] {
        let k = if format.default_block() == 32 { 96 } else { 256 };
        // (rows, n = the depth, k = dx's width): one row; a depth under one step and not a
        // multiple of 8 (a partial copy of dy's row); two blocks of dx's columns with a partial
        // one; 65 rows (a second row block of one row).
        for (i, (rows, n, k)) in [(1, 13, k), (17, 7, 2 * k), (65, 130, k), (33, 64, 3 * k)].into_iter().enumerate() {
            let dtype = [DType::BF16, DType::F16][i % 2];
            let pad = [0, 8, 16, 0][i];
            assert_eq!(QPath::for_input_grad(dtype, true), QPath::Gemm { k_splits: 1 });
            let case = QLinearCase { format, dtype, rows, n, k, pad, accumulate: i % 2 == 1 };
            let r = qlinear_backward_input_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
}

#[test]
fn the_gradient_is_the_derivative_of_the_forward_product() {
    // The f64 reference of dx = dy W against a central difference of <dy, x W^T> in x, so the
    // reference cannot share a transposition bug with the kernel.
    let mut rng = Rng::new(41);
    let (tokens, d_in, d_out) = (3, 64, 5);
    let w = random_packed(&mut rng, QuantFormat::NF4, d_out, d_in).unwrap();
    let wd: Vec<f64> = w.dequantize().iter().map(|&v| f64::from(v)).collect();
    let x = rng.normal_vec(tokens * d_in, 1.0, DType::F32);
    let dy = rng.normal_vec(tokens * d_out, 1.0, DType::F32);
    let dx = reference::linear::linear_backward_input(&dy, &wd, d_in, d_out).unwrap();
    let loss = |x: &[f64]| {
        let y = reference::linear::linear(x, &wd, None, d_in, d_out).unwrap();
        y.iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>()
    };
    let err = common::central_difference_error(&x, &dx, loss);
    assert!(err < 1e-6, "dx vs central difference: {err:e}");
}

#[test]
fn schedules_agree_bit_for_bit() {
    for (format, dtype, pad) in
        [(QuantFormat::NF4, DType::BF16, 8), (QuantFormat::Q6_K, DType::F16, 0), (QuantFormat::Q4_0, DType::F32, 8)]
    {
        let k = if format.default_block() == 32 { 160 } else { 256 };
        let case = QLinearCase { format, dtype, rows: 66, n: 70, k, pad, accumulate: true };
        common::assert_schedules_agree(&format!("{case:?}"), |d| qlinear_backward_input_case(d, case));
    }
}

#[test]
fn the_gradient_of_the_forward_gemm_uses_its_weight_values() {
    // The forward's GEMM and the input gradient multiply by the same rounded weights: with dy a
    // one-hot row, dx is that row of W as the forward saw it (x = e_i gives y = column i).
    let d = Device::emulated();
    let mut rng = Rng::new(5);
    let (d_out, d_in) = (24, 128);
    let w = QWeight::new(&d, &random_packed(&mut rng, QuantFormat::NF4, d_out, d_in).unwrap()).unwrap();
    // Identity activations: d_in rows (the forward's tensor-core GEMM) and d_out rows.
    let eye = |n: usize| {
        let v: Vec<f64> = (0..n * n).map(|i| f64::from(i / n == i % n)).collect();
        Tensor::from_f64(&d, DType::BF16, &v, &[n, n]).unwrap()
    };
    assert!(matches!(QPath::choose(QuantFormat::NF4, DType::BF16, d_in, true, [d_out, d_in]), QPath::Gemm { .. }));
    let y = Tensor::zeros(&d, DType::BF16, &[d_in, d_out]).unwrap();
    qlinear(&eye(d_in), &w, &y, None).unwrap(); // y[i][o] = W[o][i]
    let dx = Tensor::zeros(&d, DType::BF16, &[d_out, d_in]).unwrap();
    qlinear_backward_input(&eye(d_out), &w, &dx, false, None).unwrap(); // dx[o][i] = W[o][i]
    let (y, dx) = (y.to_f64_vec().unwrap(), dx.to_f64_vec().unwrap());
    for o in 0..d_out {
        for i in 0..d_in {
            assert_eq!(dx[o * d_in + i], y[i * d_out + o], "W[{o}][{i}]");
        }
    }
}

#[test]
fn an_empty_depth_zeroes_dx_and_bad_inputs_are_named_errors() {
    let d = Device::emulated();
    let mut rng = Rng::new(9);
    // out = 0: dx = dy W = 0 on both paths; accumulating leaves dx as it is.
    let empty = QWeight::new(&d, &random_packed(&mut rng, QuantFormat::Q4_0, 0, 64).unwrap()).unwrap();
    for dtype in [DType::BF16, DType::F32] {
        let s = QScratch::new(&d, dtype, &[&empty]).unwrap();
        let dy = Tensor::zeros(&d, dtype, &[3, 0]).unwrap();
        let dx = Tensor::from_f64(&d, dtype, &[1.5; 3 * 64], &[3, 64]).unwrap();
        qlinear_backward_input(&dy, &empty, &dx, true, Some(&s)).unwrap();
        assert!(dx.to_f64_vec().unwrap().iter().all(|&v| v == 1.5), "{dtype}: accumulate over no depth");
        qlinear_backward_input(&dy, &empty, &dx, false, Some(&s)).unwrap();
        assert!(dx.to_f64_vec().unwrap().iter().all(|&v| v == 0.0), "{dtype}: dx = 0 over no depth");
    }

    let w = QWeight::new(&d, &random_packed(&mut rng, QuantFormat::NF4, 8, 64).unwrap()).unwrap();
    let dy = Tensor::zeros(&d, DType::BF16, &[2, 8]).unwrap();
    let dx = Tensor::zeros(&d, DType::BF16, &[2, 64]).unwrap();
    qlinear_backward_input(&dy, &w, &dx, false, None).unwrap();
    let bad_dy = Tensor::zeros(&d, DType::BF16, &[2, 9]).unwrap();
    assert!(matches!(
        qlinear_backward_input(&bad_dy, &w, &dx, false, None),
        Err(Error::ShapeMismatch { what: "dy", .. })
    ));
    let bad_dx = Tensor::zeros(&d, DType::BF16, &[3, 64]).unwrap();
    assert!(matches!(
        qlinear_backward_input(&dy, &w, &bad_dx, false, None),
        Err(Error::ShapeMismatch { what: "dx", .. })
    ));
    let dx32 = Tensor::zeros(&d, DType::F32, &[2, 64]).unwrap();
    assert!(matches!(qlinear_backward_input(&dy, &w, &dx32, false, None), Err(Error::DTypeMismatch { .. })));
    let ids = Tensor::zeros(&d, DType::I32, &[2, 8]).unwrap();
    assert!(matches!(qlinear_backward_input(&ids, &w, &dx, false, None), Err(Error::UnsupportedDType { .. })));
    // f32, or dy rows off 16-byte boundaries: the dequantize path, which needs a scratch of the dtype.
    let (dy32, s32) = (Tensor::zeros(&d, DType::F32, &[2, 8]).unwrap(), QScratch::new(&d, DType::F32, &[&w]).unwrap());
    assert!(matches!(
        qlinear_backward_input(&dy32, &w, &dx32, false, None),
        Err(Error::InvalidArgument { name: "scratch", .. })
    ));
    qlinear_backward_input(&dy32, &w, &dx32, false, Some(&s32)).unwrap();
    let wide = Tensor::zeros(&d, DType::BF16, &[2, 9]).unwrap();
    let misaligned = wide.narrow(1, 1, 8).unwrap();
    assert!(matches!(
        qlinear_backward_input(&misaligned, &w, &dx, false, None),
        Err(Error::InvalidArgument { name: "scratch", .. })
    ));
    assert!(matches!(
        qlinear_backward_input(&misaligned, &w, &dx, false, Some(&s32)),
        Err(Error::DTypeMismatch { .. })
    ));
    let s16 = QScratch::new(&d, DType::BF16, &[&w]).unwrap();
    qlinear_backward_input(&misaligned, &w, &dx, false, Some(&s16)).unwrap();
    // dx overlapping dy.
    let buf = Tensor::zeros(&d, DType::BF16, &[2, 72]).unwrap();
    let (dyv, dxv) = (buf.narrow(1, 0, 8).unwrap(), buf.narrow(1, 4, 64).unwrap());
    assert!(qlinear_backward_input(&dyv, &w, &dxv, true, None).is_err());
    // A weight on another device.
    let other = Device::emulated();
    let w_other = QWeight::new(&other, &random_packed(&mut rng, QuantFormat::NF4, 8, 64).unwrap()).unwrap();
    assert!(matches!(qlinear_backward_input(&dy, &w_other, &dx, false, None), Err(Error::DeviceMismatch { .. })));
}
