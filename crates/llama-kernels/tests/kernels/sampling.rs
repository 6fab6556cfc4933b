//! Token sampling (kernels/sampling.cu) against the f64 reference (emulated, and CUDA when
//! present): greedy is the argmax, every sampled token is in the reference's filtered set, the
//! empirical distribution over many draws matches the filtered distribution, reproducibility and
//! batch independence, the Philox stream bit for bit, schedules, device-side errors and every
//! validation error.

use crate::common;

use llama_kernels::dev::testing::Rng;
use llama_kernels::dev::verify::{
    SampleCase, TOKEN_POISON, random_config, random_row, run_sample, sample_case, token_allowed,
};
use llama_kernels::ops::ErrorFlag;
use llama_kernels::ops::sampling::{SamplingBatch, SamplingTensors, sample};
use llama_kernels::reference::sampling::{self as reference, Filtered};
use llama_kernels::spec::sampling::SamplingConfig;
use llama_kernels::{DType, Device, Error, Tensor};

fn cfg(temperature: f32, top_k: i32, top_p: f32, min_p: f32) -> SamplingConfig {
    SamplingConfig { temperature, top_k, top_p, min_p }
}

/// Runs rows that all use the same config, seed 7 and offsets 0, 1, 2, ...
fn run_same(device: &Device, dtype: DType, rows: &[Vec<f64>], c: SamplingConfig) -> Vec<i32> {
    let n = rows.len();
    let offsets: Vec<u64> = (0..n as u64).collect();
    let run = run_sample(device, dtype, rows, &vec![c; n], &vec![7; n], &offsets, 0).unwrap();
    run.flag.unwrap();
    run.tokens
}

#[test]
fn greedy_is_the_argmax_ties_to_the_lowest_index() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            let mut rng = Rng::new(1);
            for (vocab, pad) in [(1, 0), (7, 3), (1000, 0), (4099, 5), (50_000, 0)] {
                let rows: Vec<Vec<f64>> = (0..5).map(|_| random_row(&mut rng, vocab, 3.0, dtype, true)).collect();
                let configs = vec![SamplingConfig::GREEDY; rows.len()];
                let run = run_sample(&device, dtype, &rows, &configs, &[1; 5], &[0; 5], pad).unwrap();
                run.flag.unwrap();
                for (r, row) in rows.iter().enumerate() {
                    let Filtered::Argmax(want) = reference::filter(row, &SamplingConfig::GREEDY) else { panic!() };
                    assert_eq!(run.tokens[r], want as i32, "{dtype} vocab {vocab} row {r} on {device:?}");
                }
            }
            // Explicit ties, -0 and +0 (equal), NaN (as -inf) and +inf.
            let rows = vec![
                vec![1.0, 3.0, 2.0, 3.0],
                vec![-0.0, 0.0, -1.0, f64::NAN],
                vec![f64::NAN, f64::NEG_INFINITY, -5.0, -5.0],
                vec![1.0, f64::INFINITY, f64::INFINITY, 2.0],
            ];
            assert_eq!(run_same(&device, dtype, &rows, SamplingConfig::GREEDY), [1, 0, 2, 1], "{dtype}");
        }
    }
}

#[test]
fn sampled_tokens_lie_in_the_filtered_set() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (batch, vocab, pad, seed) in [(96, 300, 0, 1), (24, 4099, 3, 2), (2, 50_000, 0, 3)] {
                let case = SampleCase { pad, seed, ..SampleCase::new(dtype, batch, vocab) };
                let r = sample_case(&device, case).unwrap();
                assert!(r.pass, "{} on {device:?}", r.describe());
                eprintln!("{}", r.shape);
            }
        }
    }
}

#[test]
fn sampled_tokens_are_the_reference_draw_for_the_same_random_word() {
    // The kernel's f32 weights differ from the reference's f64 ones by rounding, so the same
    // random word can land on a neighbour only within ~1e-6 of a boundary, and a filter boundary
    // can only move where rounding decides it: nearly every row must agree exactly.
    let device = Device::emulated();
    let mut rng = Rng::new(99);
    let (batch, vocab) = (400, 257);
    let rows: Vec<Vec<f64>> = (0..batch).map(|_| random_row(&mut rng, vocab, 2.0, DType::F32, false)).collect();
    let configs: Vec<SamplingConfig> = (0..batch).map(|_| random_config(&mut rng, vocab)).collect();
    let seeds: Vec<u64> = (0..batch).map(|_| rng.next_u64()).collect();
    let offsets: Vec<u64> = (0..batch).map(|_| rng.next_u64()).collect();
    let run = run_sample(&device, DType::F32, &rows, &configs, &seeds, &offsets, 0).unwrap();
    run.flag.unwrap();
    let differ: Vec<usize> = (0..batch)
        .filter(|&r| run.tokens[r] != reference::sample(&rows[r], &configs[r], seeds[r], offsets[r]))
        .collect();
    assert!(differ.len() <= 2, "rows {differ:?} differ from the reference draw");
}

/// Pearson's chi-square of `counts` against `probs` (both over the same tokens), pooling the
/// tokens with an expected count below 5 into one cell. Returns (statistic, degrees of freedom).
fn chi_square(counts: &[u64], probs: &[f64], n: u64) -> (f64, usize) {
    let (mut stat, mut cells) = (0.0, 0usize);
    let (mut pooled_obs, mut pooled_exp) = (0.0, 0.0);
    for (&c, &p) in counts.iter().zip(probs) {
        let e = p * n as f64;
        if e < 5.0 {
            pooled_obs += c as f64;
            pooled_exp += e;
        } else {
            stat += (c as f64 - e).powi(2) / e;
            cells += 1;
        }
    }
    if pooled_exp > 0.0 {
        stat += (pooled_obs - pooled_exp).powi(2) / pooled_exp.max(1e-300);
        cells += 1;
    }
    (stat, cells.saturating_sub(1))
}

#[test]
fn the_empirical_distribution_matches_the_filtered_one() {
    // One row drawn n times (offsets 0..n): the counts must match the reference's filtered
    // distribution. Deterministic (seeded), so a failure is a real one; the bound is the
    // chi-square quantile far in the tail (df + 6 sqrt(2 df), p < 1e-6 or so), and no token
    // outside the support may appear at all.
    let device = Device::emulated();
    let mut rng = Rng::new(5);
    let cases = [
        (DType::F32, 200, cfg(1.0, 0, 1.0, 0.0), 1.5),
        (DType::BF16, 200, cfg(0.7, 40, 0.9, 0.0), 2.0),
        (DType::F16, 300, cfg(1.3, 0, 0.8, 0.02), 2.0),
        (DType::F32, 120, cfg(0.9, 10, 1.0, 0.1), 1.0),
        (DType::BF16, 2500, cfg(1.0, 100, 0.95, 0.01), 2.0),
    ];
    for (dtype, vocab, c, scale) in cases {
        let row = random_row(&mut rng, vocab, scale, dtype, true);
        let Filtered::Distribution(probs) = reference::filter(&row, &c) else { panic!() };
        let n = if vocab > 1000 { 1500 } else { 4000 };
        let tokens = run_same(&device, dtype, &vec![row.clone(); n], c);
        let mut counts = vec![0u64; vocab];
        for &t in &tokens {
            assert!(t >= 0 && probs[t as usize] > 0.0, "{dtype} {c:?}: token {t} outside the support");
            counts[t as usize] += 1;
        }
        let (stat, df) = chi_square(&counts, &probs, n as u64);
        let bound = df as f64 + 6.0 * (2.0 * df as f64).sqrt() + 10.0;
        let support = probs.iter().filter(|&&p| p > 0.0).count();
        eprintln!("{dtype} vocab {vocab} {c:?}: support {support}, chi-square {stat:.1} on {df} df (bound {bound:.1})");
        assert!(stat <= bound, "{dtype} {c:?}: chi-square {stat:.1} on {df} df exceeds {bound:.1}");
        // Total variation, as a second, cruder bound.
        let tv: f64 = counts.iter().zip(&probs).map(|(&k, &p)| (k as f64 / n as f64 - p).abs()).sum::<f64>() / 2.0;
        assert!(tv < 0.5 * (support as f64 / n as f64).sqrt() + 0.02, "{dtype} {c:?}: total variation {tv}");
    }
}

#[test]
fn the_random_word_is_philox_bit_for_bit() {
    // Equal logits over a power-of-two vocabulary: the kernel's fixed-point mass is exactly
    // vocab * 2^40, so the token is the top log2(vocab) bits of the 64-bit Philox word.
    for device in common::devices() {
        let vocab = 1024;
        let rows = vec![vec![0.25; vocab]; 64];
        let seeds: Vec<u64> = (0..64u64).map(|i| i.wrapping_mul(0x9E37_79B9_7F4A_7C15)).collect();
        let offsets: Vec<u64> = (0..64u64).map(|i| i << 29 | i).collect();
        let configs = vec![SamplingConfig::default(); 64];
        let run = run_sample(&device, DType::F32, &rows, &configs, &seeds, &offsets, 0).unwrap();
        for r in 0..64 {
            let want = (reference::random_word(seeds[r], offsets[r]) >> 54) as i32;
            assert_eq!(run.tokens[r], want, "row {r} on {device:?}");
        }
    }
}

#[test]
fn reproducible_and_independent_of_the_batch() {
    for device in common::devices() {
        let dtype = DType::BF16;
        let mut rng = Rng::new(11);
        let vocab = 3000;
        let rows: Vec<Vec<f64>> = (0..6).map(|_| random_row(&mut rng, vocab, 2.0, dtype, false)).collect();
        let configs: Vec<SamplingConfig> =
            [cfg(1.0, 0, 1.0, 0.0), cfg(0.8, 50, 0.9, 0.0), cfg(1.2, 0, 0.7, 0.05), cfg(0.0, 0, 1.0, 0.0)]
                .into_iter()
                .cycle()
                .take(6)
                .collect();
        let seeds = [3u64, 3, 4, 5, u64::MAX, 1 << 40];
        let offsets = [0u64, 1, 2, 3, 4, u64::MAX];
        let all = run_sample(&device, dtype, &rows, &configs, &seeds, &offsets, 0).unwrap();
        all.flag.unwrap();
        // Same launch again: same tokens.
        let again = run_sample(&device, dtype, &rows, &configs, &seeds, &offsets, 7).unwrap();
        assert_eq!(all.tokens, again.tokens, "a second (strided) launch differs on {device:?}");
        // Each row alone, and the rows reversed next to unrelated ones.
        for r in 0..6 {
            let one = run_sample(
                &device,
                dtype,
                &rows[r..r + 1],
                &configs[r..r + 1],
                &seeds[r..r + 1],
                &offsets[r..r + 1],
                0,
            )
            .unwrap();
            assert_eq!(one.tokens[0], all.tokens[r], "row {r} alone on {device:?}");
        }
        let mut mixed_rows: Vec<Vec<f64>> = rows.iter().rev().cloned().collect();
        mixed_rows.push(random_row(&mut rng, vocab, 5.0, dtype, true));
        let mut mixed_cfg: Vec<SamplingConfig> = configs.iter().rev().cloned().collect();
        mixed_cfg.push(cfg(2.0, 3, 0.5, 0.5));
        let mut s: Vec<u64> = seeds.iter().rev().cloned().collect();
        s.push(99);
        let mut o: Vec<u64> = offsets.iter().rev().cloned().collect();
        o.push(99);
        let mixed = run_sample(&device, dtype, &mixed_rows, &mixed_cfg, &s, &o, 0).unwrap();
        let back: Vec<i32> = mixed.tokens[..6].iter().rev().cloned().collect();
        assert_eq!(back, all.tokens, "batch composition changed a token on {device:?}");
        // A different offset moves the draw (over many rows, surely some token).
        let moved: Vec<u64> = offsets.iter().map(|o| o.wrapping_add(1)).collect();
        let other = run_sample(&device, dtype, &rows, &configs, &seeds, &moved, 0).unwrap();
        assert_ne!(other.tokens, all.tokens, "the offset is not used on {device:?}");
    }
}

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        for (batch, vocab) in [(12, 700), (3, 5000)] {
            let case = SampleCase::new(dtype, batch, vocab);
            common::assert_schedules_agree(&format!("{case:?}"), |d| sample_case(d, case));
        }
    }
}

#[test]
fn large_vocabularies() {
    // Llama 4 / Gemma-sized rows (262144) and the vocabulary bound's neighbourhood of 2^17 + 1.
    let device = Device::emulated();
    let mut rng = Rng::new(21);
    for (dtype, vocab) in [(DType::BF16, 262_144), (DType::F16, 131_073)] {
        let rows: Vec<Vec<f64>> = (0..2).map(|_| random_row(&mut rng, vocab, 3.0, dtype, true)).collect();
        let configs = [cfg(0.9, 40, 0.95, 0.0), cfg(1.0, 0, 0.6, 0.05)];
        let run = run_sample(&device, dtype, &rows, &configs, &[1, 2], &[3, 4], 0).unwrap();
        run.flag.unwrap();
        for r in 0..2 {
            assert!(token_allowed(&rows[r], &configs[r], run.tokens[r]), "{dtype} vocab {vocab} row {r}");
        }
    }
}

#[test]
fn device_errors_give_minus_one_and_a_named_flag() {
    for device in common::devices() {
        let good = vec![0.5, 1.0, -1.0, 2.0];
        let rows = vec![good.clone(), vec![f64::NAN, f64::NEG_INFINITY, f64::NAN, f64::NEG_INFINITY], good.clone()];
        // All -inf / NaN: no candidate, whether greedy or not; the rows around it are fine.
        for c in [SamplingConfig::GREEDY, cfg(1.0, 2, 0.9, 0.1)] {
            let run = run_sample(&device, DType::F32, &rows, &[c; 3], &[1; 3], &[0, 1, 2], 0).unwrap();
            assert_eq!(run.tokens[1], -1);
            assert!(run.tokens[0] >= 0 && run.tokens[2] >= 0, "{:?}", run.tokens);
            let e = run.flag.unwrap_err();
            assert!(matches!(&e, Error::DeviceReported { what, .. } if what.contains("all -inf or NaN")), "{e}");
        }
        // Each parameter out of its domain.
        for bad in [
            cfg(-1.0, 0, 1.0, 0.0),
            cfg(f32::NAN, 0, 1.0, 0.0),
            cfg(f32::INFINITY, 0, 1.0, 0.0),
            cfg(1.0, -1, 1.0, 0.0),
            cfg(1.0, 0, 1.5, 0.0),
            cfg(1.0, 0, -0.1, 0.0),
            cfg(1.0, 0, f32::NAN, 0.0),
            cfg(1.0, 0, 1.0, 1.01),
            cfg(1.0, 0, 1.0, -0.5),
        ] {
            assert!(!bad.is_valid());
            let rows = vec![good.clone(), good.clone()];
            let run =
                run_sample(&device, DType::F32, &rows, &[SamplingConfig::GREEDY, bad], &[1; 2], &[0; 2], 0).unwrap();
            assert_eq!(run.tokens, [3, -1], "{bad:?}");
            let e = run.flag.unwrap_err();
            assert!(
                matches!(&e, Error::DeviceReported { what, .. } if what.contains("bad sampling parameters")),
                "{e}"
            );
        }
        // The flag was read and cleared: a good run after a bad one reports nothing.
        let run = run_sample(&device, DType::F32, &[good.clone()], &[SamplingConfig::GREEDY], &[0], &[0], 0).unwrap();
        assert_eq!(run.tokens, [3]);
        run.flag.unwrap();
    }
}

#[test]
fn boundary_semantics_match_the_reference() {
    let device = Device::emulated();
    let row = vec![1.0, 3.0, 3.0, 2.0, f64::NAN, -1.0, 3.0, 0.0];
    for c in [
        cfg(1.0, 1, 1.0, 0.0),   // top-1 keeps the three tied maxima
        cfg(1.0, 4, 1.0, 0.0),   // ties at the 3rd kept; the 4th is 2.0
        cfg(1.0, 0, 0.0, 0.0),   // top-p 0: the first of the sorted order only (index 1)
        cfg(1.0, 0, 0.5, 0.0),   // top-p cuts the tie group of the maxima in index order
        cfg(1.0, 0, 1.0, 0.9),   // min-p keeps the maxima only
        cfg(1e-30, 0, 1.0, 0.0), // a tiny temperature: the maxima share the mass
        cfg(1.0, 100, 0.999, 1.0),
    ] {
        let Filtered::Distribution(p) = reference::filter(&row, &c) else { panic!() };
        let n = 600;
        let tokens = run_same(&device, DType::F32, &vec![row.clone(); n], c);
        let mut seen = vec![false; row.len()];
        for &t in &tokens {
            assert!(p[t as usize] > 0.0, "{c:?}: token {t} outside the support {p:?}");
            seen[t as usize] = true;
        }
        // Every token of the support (all have probability >= 1/8 here) is drawn.
        for (i, &q) in p.iter().enumerate() {
            assert_eq!(seen[i], q > 0.0, "{c:?}: token {i} (p {q})");
        }
    }
    // +inf logits share all the mass; finite ones get none.
    let row = vec![1.0, f64::INFINITY, 0.0, f64::INFINITY];
    let tokens = run_same(&device, DType::F32, &vec![row; 200], cfg(1.0, 0, 1.0, 0.0));
    assert!(tokens.iter().all(|&t| t == 1 || t == 3) && tokens.contains(&1) && tokens.contains(&3));
}

#[test]
fn tokens_are_poisoned_first_and_always_written() {
    // The harness poisons tokens with 0x5a bytes; every row must be overwritten.
    let device = Device::emulated();
    let poison = i32::from_ne_bytes([TOKEN_POISON; 4]);
    let mut rng = Rng::new(3);
    let rows: Vec<Vec<f64>> = (0..40).map(|_| random_row(&mut rng, 100, 2.0, DType::F16, true)).collect();
    let configs: Vec<SamplingConfig> = (0..40).map(|_| random_config(&mut rng, 100)).collect();
    let run = run_sample(&device, DType::F16, &rows, &configs, &[5; 40], &[6; 40], 2).unwrap();
    assert!(run.tokens.iter().all(|&t| t != poison && (0..100).contains(&t)), "{:?}", run.tokens);
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let logits = t(DType::BF16, &[4, 64]);
    let temp = t(DType::F32, &[4]);
    let tokens = t(DType::I32, &[4]);
    let errors = ErrorFlag::new(&d).unwrap();
    fn p(temperature: &Tensor) -> SamplingTensors<'_> {
        SamplingTensors { temperature, top_k: None, top_p: None, min_p: None, seeds: None, offsets: None }
    }
    sample(&logits, &p(&temp), &tokens, &errors).unwrap();
    errors.check_sampling().unwrap();
    // Dtypes.
    let e = sample(&t(DType::I32, &[4, 64]), &p(&temp), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "logits", .. }), "{e}");
    let e = sample(&logits, &p(&temp), &t(DType::I64, &[4]), &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "tokens", .. }), "{e}");
    let e = sample(&logits, &p(&t(DType::F16, &[4])), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "temperature", .. }), "{e}");
    let bad_k = t(DType::F32, &[4]);
    let e = sample(&logits, &SamplingTensors { top_k: Some(&bad_k), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "top_k", .. }), "{e}");
    let i32s = t(DType::I32, &[4]);
    let e = sample(&logits, &SamplingTensors { top_p: Some(&i32s), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "top_p", .. }), "{e}");
    let e = sample(&logits, &SamplingTensors { min_p: Some(&i32s), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "min_p", .. }), "{e}");
    let e = sample(&logits, &SamplingTensors { seeds: Some(&i32s), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "seeds", .. }), "{e}");
    let e = sample(&logits, &SamplingTensors { offsets: Some(&i32s), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "offsets", .. }), "{e}");
    // Shapes: one entry per row.
    let e = sample(&logits, &p(&temp), &t(DType::I32, &[5]), &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "tokens", .. }), "{e}");
    let e = sample(&logits, &p(&temp), &t(DType::I32, &[4, 1]), &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "tokens", .. }), "{e}");
    let e = sample(&logits, &p(&t(DType::F32, &[3])), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "temperature", .. }), "{e}");
    let long = t(DType::I64, &[5]);
    let e = sample(&logits, &SamplingTensors { seeds: Some(&long), ..p(&temp) }, &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "seeds", .. }), "{e}");
    // Layouts: strided per-row arrays, a non-contiguous last dimension of the logits.
    let wide = t(DType::F32, &[8]);
    let e = sample(&logits, &p(&wide.as_strided(&[4], &[2], 0).unwrap()), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "temperature", .. }), "{e}");
    let wide_tokens = t(DType::I32, &[8]);
    let e = sample(&logits, &p(&temp), &wide_tokens.as_strided(&[4], &[2], 0).unwrap(), &errors).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "tokens", .. }), "{e}");
    let big = t(DType::BF16, &[4, 128]);
    let e = sample(&big.as_strided(&[4, 64], &[128, 2], 0).unwrap(), &p(&temp), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "logits", .. }), "{e}");
    // An empty vocabulary with rows; no rows at all is a no-op.
    let e = sample(&t(DType::F32, &[4, 0]), &p(&temp), &tokens, &errors).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "vocab", .. }), "{e}");
    sample(&t(DType::F32, &[0, 64]), &p(&t(DType::F32, &[0])), &t(DType::I32, &[0]), &errors).unwrap();
    // Tokens overlapping an input (an i32 view of the same buffer as top_k).
    let ks = t(DType::I32, &[4]);
    let e = sample(&logits, &SamplingTensors { top_k: Some(&ks), ..p(&temp) }, &ks, &errors).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // Host-side batch arrays: one entry per row.
    let e = SamplingBatch::new(&d, &[SamplingConfig::GREEDY; 2], &[0], &[0, 0]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "seeds", .. }), "{e}");
    let b = SamplingBatch::new(&d, &[SamplingConfig::GREEDY; 2], &[0; 2], &[0; 2]).unwrap();
    let e = b.set(&[SamplingConfig::GREEDY; 3], &[0; 3], &[0; 3]).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "configs", .. }), "{e}");
    // The error flag on another device.
    if let Ok(cuda) = Device::cuda(0) {
        let other = ErrorFlag::new(&cuda).unwrap();
        let e = sample(&logits, &p(&temp), &tokens, &other).unwrap_err();
        assert!(matches!(e, Error::DeviceMismatch { .. }), "{e}");
    }
}

#[test]
fn one_launch_no_allocation_no_host_wait() {
    // Capturable: with the arrays in place, a call queues one kernel and nothing else.
    let d = Device::emulated();
    let logits = Tensor::from_slice(&d, &[0.5f32, 2.0, -1.0, 2.0, 0.0, 1.0, 3.0, -2.0], &[2, 4]).unwrap();
    let params = SamplingBatch::new(&d, &[cfg(0.8, 2, 0.9, 0.05); 2], &[1, 2], &[3, 4]).unwrap();
    let tokens = Tensor::zeros(&d, DType::I32, &[2]).unwrap();
    let errors = ErrorFlag::new(&d).unwrap();
    let before = d.counters();
    sample(&logits, &params.tensors(), &tokens, &errors).unwrap();
    let after = d.counters();
    assert_eq!(after.launches - before.launches, 1);
    assert_eq!(after.allocations, before.allocations);
    assert_eq!(after.pageable_uploads + after.pinned_uploads, before.pageable_uploads + before.pinned_uploads);
    assert_eq!(after.downloads, before.downloads);
    assert_eq!(after.synchronizations, before.synchronizations);
}

#[test]
fn weightless_and_non_finite_tokens_are_never_drawn() {
    let device = Device::emulated();
    // top-k beyond the finite tokens: the k-th largest is -inf, so everything is "kept", but
    // -inf and NaN weigh nothing. A gap of 100 is below the 2^-40 fixed-point floor.
    let row = vec![5.0, f64::NEG_INFINITY, f64::NAN, 4.0, -95.0, f64::NEG_INFINITY];
    for c in [cfg(1.0, 5, 1.0, 0.0), cfg(1.0, 0, 0.9999, 0.0), cfg(2.0, 0, 1.0, 0.0)] {
        let tokens = run_same(&device, DType::F32, &vec![row.clone(); 300], c);
        assert!(tokens.iter().all(|&t| t == 0 || t == 3), "{c:?}: {tokens:?}");
        assert!(tokens.contains(&0) && tokens.contains(&3), "{c:?}");
    }
    // A tiny temperature leaves only the max.
    let tokens = run_same(&device, DType::BF16, &vec![vec![1.0, 1.0078125, 0.5, 1.0]; 50], cfg(1e-6, 0, 1.0, 0.0));
    assert!(tokens.iter().all(|&t| t == 1), "{tokens:?}");
}
