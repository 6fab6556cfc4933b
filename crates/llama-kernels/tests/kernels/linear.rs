//! Dense matrix products (`ops::linear`): parity with the f64 reference for every dtype, strided
//! inputs and outputs, bias and accumulation, the view level against the tensor level, the
//! counting hook, and one test per validation error.

use crate::common;

use half::bf16;
use llama_kernels::dev::testing::linear_tolerance;
use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::rows_tensor;
use llama_kernels::ops::linear::{linear, linear_add, linear_add_on, linear_on, plan};
use llama_kernels::reference;
use llama_kernels::{DType, Device, Error, Tensor, TensorView, TensorViewMut};

struct Case {
    dtype: DType,
    tokens: usize,
    d_in: usize,
    d_out: usize,
    bias: bool,
    accumulate: bool,
    /// Extra elements per row of x and y (strided rows).
    pad: usize,
}

fn run(device: &Device, c: &Case) {
    let mut rng = Rng::new((c.tokens * 31 + c.d_in * 7 + c.d_out) as u64);
    let x = rng.normal_vec(c.tokens * c.d_in, 1.0, c.dtype);
    let w = rng.normal_vec(c.d_out * c.d_in, 1.0 / (c.d_in as f64).sqrt(), c.dtype);
    let b = rng.normal_vec(c.d_out, 0.5, c.dtype);
    let y0 = rng.normal_vec(c.tokens * c.d_out, 1.0, c.dtype);
    let (xt, _) = rows_tensor(device, c.dtype, &x, c.tokens, c.d_in, c.pad).unwrap();
    let wt = Tensor::from_f64(device, c.dtype, &w, &[c.d_out, c.d_in]).unwrap();
    let bt = Tensor::from_f64(device, c.dtype, &b, &[c.d_out]).unwrap();
    let (yt, yfull) = if c.accumulate {
        rows_tensor(device, c.dtype, &y0, c.tokens, c.d_out, c.pad).unwrap()
    } else {
        let full = Tensor::poisoned(device, c.dtype, &[c.tokens, c.d_out + c.pad]).unwrap();
        (full.narrow(1, 0, c.d_out).unwrap(), full)
    };
    let bias = c.bias.then_some(&bt);
    if c.accumulate { linear_add(&xt, &wt, bias, &yt) } else { linear(&xt, &wt, bias, &yt) }.unwrap();
    let mut expected = reference::linear::linear(&x, &w, c.bias.then_some(b.as_slice()), c.d_in, c.d_out).unwrap();
    if c.accumulate {
        expected.iter_mut().zip(&y0).for_each(|(e, y)| *e += y);
    }
    let xmax = x.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let wmax = w.iter().fold(0.0f64, |m, v| m.max(v.abs()));
    let got = yt.to_f64_vec().unwrap();
    let cmp = compare(&got, &expected, linear_tolerance(c.dtype, c.d_in, xmax * wmax));
    assert!(cmp.pass, "{:?} {}x{}x{}: {}", c.dtype, c.tokens, c.d_in, c.d_out, cmp.describe(&[c.tokens, c.d_out]));
    if c.pad > 0 && !c.accumulate {
        assert!(llama_kernels::dev::verify::gaps_poisoned(&yfull, c.d_out).unwrap(), "wrote outside its rows");
    }
}

#[test]
fn linear_matches_the_reference_for_every_dtype_and_layout() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (tokens, d_in, d_out) in [(1, 64, 32), (7, 129, 65), (33, 256, 384)] {
                for (bias, accumulate, pad) in [(false, false, 0), (true, false, 3), (false, true, 5), (true, true, 0)]
                {
                    run(&device, &Case { dtype, tokens, d_in, d_out, bias, accumulate, pad });
                }
            }
        }
    }
}

#[test]
fn linear_rounds_once_like_f32_accumulation() {
    // 256 products of 1 + 2^-8 (bf16-exact): the f32 sum is exact, the bf16 result is one rounding of it.
    let d = Device::emulated();
    let v = 1.0 + 1.0 / 256.0;
    let x = Tensor::from_f64(&d, DType::BF16, &vec![v; 256], &[1, 256]).unwrap();
    let w = Tensor::from_f64(&d, DType::BF16, &vec![1.0; 256], &[1, 256]).unwrap();
    let y = Tensor::poisoned(&d, DType::BF16, &[1, 1]).unwrap();
    linear(&x, &w, None, &y).unwrap();
    assert_eq!(y.to_vec::<bf16>().unwrap()[0], bf16::from_f64(256.0 * v));
}

#[test]
fn view_level_matches_the_tensor_level_bit_for_bit() {
    let d = Device::emulated();
    let mut rng = Rng::new(5);
    let (t, k, n) = (5, 96, 40);
    let x: Vec<bf16> = (0..t * k).map(|_| bf16::from_f64(rng.normal())).collect();
    let w: Vec<bf16> = (0..n * k).map(|_| bf16::from_f64(0.1 * rng.normal())).collect();
    let b: Vec<bf16> = (0..n).map(|_| bf16::from_f64(rng.normal())).collect();
    let (xt, wt, bt) = (
        Tensor::from_slice(&d, &x, &[t, k]).unwrap(),
        Tensor::from_slice(&d, &w, &[n, k]).unwrap(),
        Tensor::from_slice(&d, &b, &[n]).unwrap(),
    );
    let yt = Tensor::poisoned(&d, DType::BF16, &[t, n]).unwrap();
    linear(&xt, &wt, Some(&bt), &yt).unwrap();
    let mut y = vec![bf16::NAN; t * n];
    {
        let (xv, wv, bv) = (
            TensorView::host(&x, &[t, k]).unwrap(),
            TensorView::host(&w, &[n, k]).unwrap(),
            TensorView::host(&b, &[n]).unwrap(),
        );
        let mut yv = TensorViewMut::host(&mut y, &[t, n]).unwrap();
        linear_on(&d, &xv, &wv, Some(&bv), &mut yv).unwrap();
    }
    assert_eq!(y, yt.to_vec::<bf16>().unwrap());
    // Accumulating twice the same product on top of y.
    let before = y.clone();
    {
        let (xv, wv) = (TensorView::host(&x, &[t, k]).unwrap(), TensorView::host(&w, &[n, k]).unwrap());
        let mut yv = TensorViewMut::host(&mut y, &[t, n]).unwrap();
        linear_add_on(&d, &xv, &wv, None, &mut yv).unwrap();
    }
    assert_ne!(y, before);
}

#[test]
fn a_planned_product_allocates_nothing_and_never_waits() {
    for d in common::devices() {
        plan(&d, DType::BF16, 64).unwrap();
        let x = Tensor::zeros(&d, DType::BF16, &[16, 64]).unwrap();
        let w = Tensor::zeros(&d, DType::BF16, &[32, 64]).unwrap();
        let b = Tensor::zeros(&d, DType::BF16, &[32]).unwrap();
        let y = Tensor::zeros(&d, DType::BF16, &[16, 32]).unwrap();
        linear(&x, &w, Some(&b), &y).unwrap(); // the first call on this stream
        let before = d.counters();
        for _ in 0..3 {
            linear(&x, &w, Some(&b), &y).unwrap();
            linear_add(&x, &w, None, &y).unwrap();
        }
        let after = d.counters();
        assert_eq!(after.launches - before.launches, 6);
        assert_eq!(after.allocations, before.allocations);
        assert_eq!(after.synchronizations, before.synchronizations);
        assert_eq!(after.pageable_uploads, before.pageable_uploads);
        assert_eq!(after.downloads, before.downloads);
    }
}

#[test]
fn empty_batches_are_no_ops() {
    let d = Device::emulated();
    let x = Tensor::zeros(&d, DType::F32, &[0, 8]).unwrap();
    let w = Tensor::zeros(&d, DType::F32, &[4, 8]).unwrap();
    let y = Tensor::zeros(&d, DType::F32, &[0, 4]).unwrap();
    let before = d.counters().launches;
    linear(&x, &w, None, &y).unwrap();
    assert_eq!(d.counters().launches, before);
}

fn tensors(d: &Device) -> (Tensor, Tensor, Tensor) {
    (
        Tensor::zeros(d, DType::BF16, &[4, 8]).unwrap(),
        Tensor::zeros(d, DType::BF16, &[6, 8]).unwrap(),
        Tensor::zeros(d, DType::BF16, &[4, 6]).unwrap(),
    )
}

#[test]
fn rejects_mismatched_dtypes() {
    let d = Device::emulated();
    let (x, _, y) = tensors(&d);
    let w = Tensor::zeros(&d, DType::F16, &[6, 8]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::DTypeMismatch { what: "weight", .. })));
}

#[test]
fn rejects_integer_inputs() {
    let d = Device::emulated();
    let x = Tensor::zeros(&d, DType::I32, &[4, 8]).unwrap();
    let w = Tensor::zeros(&d, DType::I32, &[6, 8]).unwrap();
    let y = Tensor::zeros(&d, DType::I32, &[4, 6]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::UnsupportedDType { what: "x", .. })));
}

#[test]
fn rejects_a_weight_that_is_not_a_matrix() {
    let d = Device::emulated();
    let (x, _, y) = tensors(&d);
    let w = Tensor::zeros(&d, DType::BF16, &[6, 8, 1]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::ShapeMismatch { what: "weight", .. })));
}

#[test]
fn rejects_x_with_the_wrong_width() {
    let d = Device::emulated();
    let (_, w, y) = tensors(&d);
    let x = Tensor::zeros(&d, DType::BF16, &[4, 7]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::ShapeMismatch { what: "x", .. })));
}

#[test]
fn rejects_y_with_the_wrong_shape() {
    let d = Device::emulated();
    let (x, w, _) = tensors(&d);
    let y = Tensor::zeros(&d, DType::BF16, &[4, 5]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::ShapeMismatch { what: "y", .. })));
}

#[test]
fn rejects_a_bias_of_the_wrong_length() {
    let d = Device::emulated();
    let (x, w, y) = tensors(&d);
    let b = Tensor::zeros(&d, DType::BF16, &[5]).unwrap();
    assert!(matches!(linear(&x, &w, Some(&b), &y), Err(Error::ShapeMismatch { what: "bias", .. })));
}

#[test]
fn rejects_a_non_contiguous_last_dimension() {
    let d = Device::emulated();
    let (_, w, y) = tensors(&d);
    let full = Tensor::zeros(&d, DType::BF16, &[4, 16]).unwrap();
    let x = full.as_strided(&[4, 8], &[16, 2], 0).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::BadLayout { what: "x", .. })));
}

#[test]
fn rejects_an_output_overlapping_an_input() {
    let d = Device::emulated();
    let buf = Tensor::zeros(&d, DType::BF16, &[4, 16]).unwrap();
    let w = Tensor::zeros(&d, DType::BF16, &[8, 8]).unwrap();
    let x = buf.narrow(1, 0, 8).unwrap();
    let y = buf.narrow(1, 4, 8).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::Overlap { .. })));
}

#[test]
fn rejects_tensors_of_another_device() {
    let (d1, d2) = (Device::emulated(), Device::emulated());
    let (x, _, y) = tensors(&d1);
    let w = Tensor::zeros(&d2, DType::BF16, &[6, 8]).unwrap();
    assert!(matches!(linear(&x, &w, None, &y), Err(Error::DeviceMismatch { .. })));
}

#[test]
fn tolerance_can_fail() {
    let t = linear_tolerance(DType::BF16, 64, 1.0);
    let c = compare(&[1.0 + 4.0 * DType::BF16.unit_roundoff()], &[1.0], t);
    assert!(!c.pass, "a 2-ulp error must fail: {t:?}");
    let _ = Tolerance::rounded_output(DType::BF16);
}

#[test]
fn row_strides_past_cublas_32_bit_sizes_are_refused_on_every_target() {
    // Two rows of x 2^31 elements apart (a 4 GiB buffer, of which only the two rows are ever
    // touched: emulated memory is mapped lazily). CUDA refused this (cuBLAS takes 32-bit leading
    // dimensions) while the emulated target ran it; both refuse now, with the same error.
    for d in common::devices() {
        let full = Tensor::zeros(&d, DType::BF16, &[(1 << 31) + 8]).unwrap();
        let x = full.as_strided(&[2, 8], &[1 << 31, 1], 0).unwrap();
        let w = Tensor::zeros(&d, DType::BF16, &[6, 8]).unwrap();
        let y = Tensor::poisoned(&d, DType::BF16, &[2, 6]).unwrap();
        match linear(&x, &w, None, &y) {
            Err(Error::InvalidArgument { name, why, .. }) => {
                assert_eq!(name, "x row stride", "{why}");
                assert!(why.contains("32-bit"), "{why}");
            }
            other => panic!("{d:?}: {other:?}"),
        }
        // 2^31 - 1 is the largest accepted (small integers: the product is exact in bf16).
        let x = full.as_strided(&[2, 8], &[(1 << 31) - 1, 1], 0).unwrap();
        let xs: Vec<f64> = (0..16).map(|i| f64::from(i % 5) - 2.0).collect();
        let ws: Vec<f64> = (0..48).map(|i| f64::from(i % 3) - 1.0).collect();
        // (Row by row through the base buffer: a copy into the strided view would touch its span.)
        full.narrow(0, 0, 8).unwrap().copy_from_f64(&xs[..8]).unwrap();
        full.narrow(0, (1 << 31) - 1, 8).unwrap().copy_from_f64(&xs[8..]).unwrap();
        let w = Tensor::from_f64(&d, DType::BF16, &ws, &[6, 8]).unwrap();
        linear(&x, &w, None, &y).unwrap();
        let want: Vec<f64> = (0..12).map(|i| (0..8).map(|j| xs[(i / 6) * 8 + j] * ws[(i % 6) * 8 + j]).sum()).collect();
        assert_eq!(y.to_f64_vec().unwrap(), want);
    }
}
