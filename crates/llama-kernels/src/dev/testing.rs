//! Test support shared by the test suite, `verify` and the benchmarks: a seeded random number
//! generator, per-dtype tolerances, and an element-wise comparison that names the worst element.

use crate::dtype::{DType, round_to};
use crate::spec::layer::{FfnSpec, LayerSpec};
use crate::spec::weights::{HostFfn, HostLayerWeights, HostTensor};

/// SplitMix64: small, fast, seedable, and identical on every machine.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in [0, 1).
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }
    /// Uniform integer in [0, n).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }
    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.uniform().max(f64::MIN_POSITIVE);
        let u2 = self.uniform();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }
    /// `n` normal values with standard deviation `std`, rounded to `dtype` (what a tensor of that
    /// dtype stores, so references see exactly the kernel's inputs).
    pub fn normal_vec(&mut self, n: usize, std: f64, dtype: DType) -> Vec<f64> {
        (0..n).map(|_| crate::dtype::round_to(dtype, std * self.normal())).collect()
    }
    /// `n` values uniform in [lo, hi), rounded to `dtype`.
    pub fn uniform_vec(&mut self, n: usize, lo: f64, hi: f64, dtype: DType) -> Vec<f64> {
        (0..n).map(|_| crate::dtype::round_to(dtype, self.range(lo, hi))).collect()
    }
}

/// An element passes when `|got - expected| <= atol + rtol * |expected|`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Tolerance {
    pub atol: f64,
    pub rtol: f64,
}

impl Tolerance {
    /// For results rounded once to `dtype` after f32 arithmetic of modest depth: two units of
    /// roundoff of the storage type (one ulp), plus f32 accumulation error.
    pub fn rounded_output(dtype: DType) -> Tolerance {
        match dtype {
            DType::F32 => Tolerance { atol: 1e-6, rtol: 2e-6 },
            _ => Tolerance { atol: 1e-5, rtol: 2.0 * dtype.unit_roundoff() + 1e-5 },
        }
    }
}

/// Tolerance of a matrix product's output: the output rounding plus f32 accumulation over `k`
/// terms of size up to `scale` (max |x| x max |w|).
pub fn linear_tolerance(dtype: DType, k: usize, scale: f64) -> Tolerance {
    let base = Tolerance::rounded_output(dtype);
    let acc = 2.0 * (k as f64).sqrt() * (k as f64) * scale * 5.960464477539063e-8;
    Tolerance { atol: base.atol + acc, rtol: base.rtol }
}

/// The outcome of comparing a kernel's output with the reference.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// Elements compared.
    pub count: usize,
    pub max_abs: f64,
    /// Largest `|got - expected| / |expected|` over elements with `|expected| >= 1e-3 * rms`.
    pub max_rel: f64,
    /// The element with the largest error relative to its tolerance: (flat index, got, expected).
    pub worst: Option<(usize, f64, f64)>,
    /// Largest error / allowed error; <= 1 passes.
    pub worst_ratio: f64,
    pub pass: bool,
}

impl Comparison {
    /// A one-line summary naming the worst element, with its multi-index in `shape`.
    pub fn describe(&self, shape: &[usize]) -> String {
        match self.worst {
            Some((i, got, exp)) => format!(
                "max abs {:.3e}, max rel {:.3e}; worst at {:?}: got {got:e}, expected {exp:e} ({:.2}x tolerance)",
                self.max_abs,
                self.max_rel,
                unravel(i, shape),
                self.worst_ratio
            ),
            None => format!("{} elements, nothing to compare", self.count),
        }
    }
}

/// Multi-index of flat index `i` in a row-major `shape`.
pub fn unravel(mut i: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for d in (0..shape.len()).rev() {
        let n = shape[d].max(1);
        idx[d] = i % n;
        i /= n;
    }
    idx
}

/// Compares element-wise. NaN or infinity where the reference is finite fails (infinitely bad);
/// a length mismatch fails.
pub fn compare(got: &[f64], expected: &[f64], tol: Tolerance) -> Comparison {
    let n = got.len().min(expected.len());
    let rms = (expected.iter().map(|v| v * v).sum::<f64>() / expected.len().max(1) as f64).sqrt();
    let rel_floor = (1e-3 * rms).max(f64::MIN_POSITIVE);
    let mut c = Comparison {
        count: n,
        max_abs: 0.0,
        max_rel: 0.0,
        worst: None,
        worst_ratio: 0.0,
        pass: got.len() == expected.len(),
    };
    for i in 0..n {
        let (g, e) = (got[i], expected[i]);
        let err = if g == e {
            0.0
        } else if g.is_finite() && e.is_finite() {
            (g - e).abs()
        } else {
            f64::INFINITY
        };
        let allowed = tol.atol + tol.rtol * e.abs();
        let ratio = if err == 0.0 { 0.0 } else { err / allowed };
        c.max_abs = c.max_abs.max(err);
        if e.abs() >= rel_floor {
            c.max_rel = c.max_rel.max(err / e.abs());
        }
        if c.worst.is_none() || ratio > c.worst_ratio {
            c.worst = Some((i, g, e));
            c.worst_ratio = ratio;
        }
    }
    c.pass &= c.worst_ratio <= 1.0;
    c
}

// ----------------------------------------------------------------------------- random weights

impl HostTensor {
    /// Seeded normal values with standard deviation `std`, rounded to `dtype`.
    pub fn random(rng: &mut Rng, shape: &[usize], std: f64, dtype: DType) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor { shape: shape.to_vec(), data: (0..n).map(|_| round_to(dtype, std * rng.normal()) as f32).collect() }
    }
    /// Seeded values uniform in [lo, hi), rounded to `dtype` (norm weights).
    pub fn uniform(rng: &mut Rng, shape: &[usize], lo: f64, hi: f64, dtype: DType) -> HostTensor {
        let n: usize = shape.iter().product();
        HostTensor {
            shape: shape.to_vec(),
            data: (0..n).map(|_| round_to(dtype, lo + (hi - lo) * rng.uniform()) as f32).collect(),
        }
    }
}

impl HostLayerWeights {
    /// Seeded random weights for `spec`, scaled so activations stay of order one (projections
    /// with standard deviation `1 / sqrt(fan_in)`, norm weights in [0.5, 1.5)).
    pub fn random(spec: &LayerSpec, dtype: DType, seed: u64) -> HostLayerWeights {
        let mut rng = Rng::new(seed ^ (spec.index as u64) << 32);
        let (h, d) = (spec.hidden, spec.head_dim);
        let (qd, kvd) = (spec.q_heads * d, spec.kv_heads * d);
        let s = |fan_in: usize| 1.0 / (fan_in as f64).sqrt();
        let input_norm = HostTensor::uniform(&mut rng, &[h], 0.5, 1.5, dtype);
        let q_proj = HostTensor::random(&mut rng, &[qd, h], s(h), dtype);
        let k_proj = HostTensor::random(&mut rng, &[kvd, h], s(h), dtype);
        let v_proj = HostTensor::random(&mut rng, &[kvd, h], s(h), dtype);
        let o_proj = HostTensor::random(&mut rng, &[h, qd], s(qd), dtype);
        let attn_bias = spec.attention_bias.then(|| {
            [
                HostTensor::random(&mut rng, &[qd], 0.1, dtype),
                HostTensor::random(&mut rng, &[kvd], 0.1, dtype),
                HostTensor::random(&mut rng, &[kvd], 0.1, dtype),
                HostTensor::random(&mut rng, &[h], 0.1, dtype),
            ]
        });
        let post_norm = HostTensor::uniform(&mut rng, &[h], 0.5, 1.5, dtype);
        let ffn = match spec.ffn {
            FfnSpec::Dense { intermediate: i, bias } => HostFfn::Dense {
                gate: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                up: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                down: HostTensor::random(&mut rng, &[h, i], s(i), dtype),
                bias: bias.then(|| {
                    [
                        HostTensor::random(&mut rng, &[i], 0.1, dtype),
                        HostTensor::random(&mut rng, &[i], 0.1, dtype),
                        HostTensor::random(&mut rng, &[h], 0.1, dtype),
                    ]
                }),
            },
            FfnSpec::Moe { experts: e, intermediate: i, .. } => HostFfn::Moe {
                router: HostTensor::random(&mut rng, &[e, h], s(h), dtype),
                experts_gate_up: HostTensor::random(&mut rng, &[e, h, 2 * i], s(h), dtype),
                experts_down: HostTensor::random(&mut rng, &[e, i, h], s(i), dtype),
                shared_gate: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                shared_up: HostTensor::random(&mut rng, &[i, h], s(h), dtype),
                shared_down: HostTensor::random(&mut rng, &[h, i], s(i), dtype),
            },
        };
        HostLayerWeights {
            input_norm,
            q_proj,
            k_proj,
            v_proj,
            o_proj,
            attn_bias,
            post_norm,
            ffn,
            packed: Default::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_fails_on_error_nan_and_length() {
        let tol = Tolerance { atol: 1e-6, rtol: 1e-3 };
        assert!(compare(&[1.0, 2.0], &[1.0, 2.001], tol).pass);
        let bad = compare(&[1.0, 2.0, 3.0], &[1.0, 2.1, 3.0], tol);
        assert!(!bad.pass);
        assert_eq!(bad.worst.map(|w| w.0), Some(1));
        assert!(!compare(&[f64::NAN], &[1.0], tol).pass);
        assert!(!compare(&[1.0], &[1.0, 2.0], tol).pass);
        assert_eq!(unravel(7, &[2, 3, 2]), vec![1, 0, 1]);
    }

    #[test]
    fn rng_is_seeded_and_roughly_normal() {
        let a: Vec<u64> = {
            let mut r = Rng::new(1);
            (0..4).map(|_| r.next_u64()).collect()
        };
        let b: Vec<u64> = {
            let mut r = Rng::new(1);
            (0..4).map(|_| r.next_u64()).collect()
        };
        assert_eq!(a, b);
        let mut r = Rng::new(2);
        let v: Vec<f64> = (0..20000).map(|_| r.normal()).collect();
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / v.len() as f64;
        assert!(mean.abs() < 0.03 && (var - 1.0).abs() < 0.05, "mean {mean} var {var}");
    }
}
