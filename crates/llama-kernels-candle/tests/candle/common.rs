//! Seeded inputs, the f64 comparison and per-dtype tolerances.

use candle::{DType, Device, Tensor, Var};

/// A seeded tensor of uniform values in `[-scale, scale)`, in `dtype`.
pub fn rand(seed: u64, shape: &[usize], dtype: DType, scale: f64) -> Tensor {
    let n: usize = shape.iter().product();
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<f64> = (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) * scale
        })
        .collect();
    Tensor::from_vec(data, shape, &Device::Cpu).and_then(|t| t.to_dtype(dtype)).unwrap()
}

/// A trainable copy of `t` (same dtype).
pub fn var(t: &Tensor) -> Var {
    Var::from_tensor(t).unwrap()
}

/// The largest difference between `got` and `want` as a fraction of `want`'s largest magnitude
/// (both read in f64): a relative error over the whole tensor, so that near-zero entries do not
/// dominate.
pub fn rel_err(got: &Tensor, want: &Tensor) -> f64 {
    assert_eq!(got.dims(), want.dims(), "shapes differ");
    let g: Vec<f64> = got.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap();
    let w: Vec<f64> = want.flatten_all().unwrap().to_dtype(DType::F64).unwrap().to_vec1().unwrap();
    let scale = w.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    g.iter()
        .zip(&w)
        .map(|(a, b)| if a.is_nan() || b.is_nan() { f64::INFINITY } else { (a - b).abs() })
        .fold(0f64, f64::max)
        / scale
}

/// The tolerance of a computation that rounds its output once in `dtype` (plus f32 accumulation):
/// a few units in the last place, relative to the tensor's largest value.
pub fn tol(dtype: DType) -> f64 {
    match dtype {
        DType::F32 => 2e-6,
        DType::F16 => 1.5e-3,
        DType::BF16 => 1.2e-2,
        _ => unreachable!("float dtypes only"),
    }
}

/// Asserts `got` is within `tol` of `want` (relative to `want`'s largest magnitude), naming what.
#[track_caller]
pub fn check(what: &str, got: &Tensor, want: &Tensor, tol: f64) -> f64 {
    let e = rel_err(got, want);
    eprintln!("{what}: {e:.2e}");
    assert!(e <= tol, "{what}: relative error {e:.3e} > {tol:.1e}");
    e
}

/// The three float dtypes the kernels take.
pub const FLOATS: [DType; 3] = [DType::F32, DType::F16, DType::BF16];
