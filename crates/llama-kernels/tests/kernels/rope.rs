//! RoPE parity against the f64 reference (emulated, and CUDA when present), the rotation's
//! invariants, Llama 3.1 scaling at its band edges, schedule independence, and every error.

use crate::common;

use approx::assert_relative_eq;
use llama_kernels::dev::testing::{Rng, compare};
use llama_kernels::dev::verify::{RopeCase, rope_case, rope_tolerance};
use llama_kernels::ops::rope::{Llama3Scaling, MAX_ROTARY_DIM, Rope, RopeConfig, RopeLayout};
use llama_kernels::reference::rope::{inv_freq, llama3_scale};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: RopeCase) {
    let r = rope_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

fn config(head_dim: usize, layout: RopeLayout) -> RopeConfig {
    RopeConfig { layout, ..RopeConfig::llama3_1(head_dim) }
}

#[test]
fn both_layouts_gqa_ratios_head_dims_and_edge_positions() {
    // 8 tokens: the first six sit at positions 0, 1, 8191, 8192, 30000 and 131071.
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
                for head_dim in [64, 128] {
                    for (q_heads, kv_heads) in [(2, 2), (8, 2), (8, 1)] {
                        assert_pass(&device, RopeCase::new(dtype, 8, q_heads, kv_heads, config(head_dim, layout)));
                    }
                }
            }
        }
    }
}

#[test]
fn partial_rotary_unscaled_theta_i64_positions_and_fused_qkv() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
                // rotary 50 of 64: not a whole number of 16-byte vectors, so the fallback runs.
                for (head_dim, rotary_dim) in [(64, 50), (128, 64), (128, 96), (96, 96)] {
                    let cfg = RopeConfig { rotary_dim, theta: 10_000.0, scaling: None, ..config(head_dim, layout) };
                    assert_pass(&device, RopeCase::new(dtype, 7, 4, 2, cfg));
                }
                let case = RopeCase {
                    i64_positions: true,
                    fused_qkv: true,
                    ..RopeCase::new(dtype, 9, 8, 2, config(128, layout))
                };
                assert_pass(&device, case);
            }
        }
    }
}

#[test]
fn llama4_scout_with_qk_norm_and_partial_norm() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            assert_pass(&device, RopeCase::new(dtype, 8, 40, 8, RopeConfig::llama4_scout(128)));
            // The norm covers the pass-through dims too.
            let cfg = RopeConfig { rotary_dim: 64, ..RopeConfig::llama4_scout(128) };
            assert_pass(&device, RopeCase::new(dtype, 5, 4, 1, cfg));
        }
    }
}

#[test]
fn many_tokens_walk_all_heads_in_one_block() {
    // >= 2 x SMs tokens: one block per token walks the 48 heads in passes (fewer tokens split the
    // heads over grid.y instead; the other tests cover that).
    for device in common::devices() {
        for dtype in [DType::BF16, DType::F32] {
            assert_pass(&device, RopeCase::new(dtype, 300, 40, 8, RopeConfig::llama4_scout(128)));
            assert_pass(
                &device,
                RopeCase::new(dtype, 300, 32, 8, RopeConfig { rotary_dim: 50, ..RopeConfig::llama3_1(64) }),
            );
        }
    }
}

#[test]
fn ragged_batches_and_decode_offsets() {
    // Three sequences: a prefill from 0, a continuation after a 1000-token prefix, and decode
    // steps far out; positions of a batch need not be sorted or contiguous.
    let positions: Vec<i64> = (0..5).chain(1000..1003).chain([131_071, 70_000, 9]).collect();
    let tokens = positions.len();
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
                let cfg = config(128, layout);
                let rope = Rope::new(&device, cfg).unwrap();
                let mut rng = Rng::new(11);
                let (qh, kh) = (4, 1);
                let q = rng.normal_vec(tokens * qh * 128, 1.0, dtype);
                let k = rng.normal_vec(tokens * kh * 128, 1.0, dtype);
                let qt = Tensor::from_f64(&device, dtype, &q, &[tokens, qh, 128]).unwrap();
                let kt = Tensor::from_f64(&device, dtype, &k, &[tokens, kh, 128]).unwrap();
                let pt = Tensor::from_slice(&device, &positions, &[tokens]).unwrap();
                rope.apply(&qt, Some(&kt), &pt).unwrap();
                let tol = rope_tolerance(dtype);
                let cq = compare(
                    &qt.to_f64_vec().unwrap(),
                    &llama_kernels::reference::rope::rope(&q, qh, &positions, &cfg).unwrap(),
                    tol,
                );
                let ck = compare(
                    &kt.to_f64_vec().unwrap(),
                    &llama_kernels::reference::rope::rope(&k, kh, &positions, &cfg).unwrap(),
                    tol,
                );
                assert!(
                    cq.pass && ck.pass,
                    "{dtype} {layout:?}: q {}; k {}",
                    cq.describe(&[tokens, qh, 128]),
                    ck.describe(&[tokens, kh, 128])
                );
            }
        }
    }
}

#[test]
fn rotation_preserves_pair_norms_and_depends_only_on_relative_position() {
    // f32, no scaling: rotate one q vector at p and one k vector at n for several (p, n) with the
    // same difference; the dot products must agree, and every pair keeps its norm.
    let d = 128;
    for device in common::devices() {
        for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
            let cfg = RopeConfig { scaling: None, ..config(d, layout) };
            let rope = Rope::new(&device, cfg).unwrap();
            let mut rng = Rng::new(21);
            let qv = rng.normal_vec(d, 1.0, DType::F32);
            let kv = rng.normal_vec(d, 1.0, DType::F32);
            let pairs: [(i64, i64); 4] = [(10, 3), (1007, 1000), (65_543, 65_536), (131_071, 131_064)];
            let tokens = pairs.len();
            let q_all: Vec<f64> = (0..tokens).flat_map(|_| qv.clone()).collect();
            let k_all: Vec<f64> = (0..tokens).flat_map(|_| kv.clone()).collect();
            let qt = Tensor::from_f64(&device, DType::F32, &q_all, &[tokens, 1, d]).unwrap();
            let kt = Tensor::from_f64(&device, DType::F32, &k_all, &[tokens, 1, d]).unwrap();
            let pq = Tensor::from_slice(&device, &pairs.map(|p| p.0), &[tokens]).unwrap();
            let pk = Tensor::from_slice(&device, &pairs.map(|p| p.1), &[tokens]).unwrap();
            rope.apply(&qt, None, &pq).unwrap();
            rope.apply(&kt, None, &pk).unwrap();
            let (qr, kr) = (qt.to_f64_vec().unwrap(), kt.to_f64_vec().unwrap());
            let pair_of = |i: usize| match layout {
                RopeLayout::Interleaved => (2 * i, 2 * i + 1),
                RopeLayout::HalfSplit => (i, i + d / 2),
            };
            for t in 0..tokens {
                for i in 0..d / 2 {
                    let (a, b) = pair_of(i);
                    let before = qv[a].hypot(qv[b]);
                    let after = qr[t * d + a].hypot(qr[t * d + b]);
                    assert!(
                        (before - after).abs() <= 2e-6 * before.max(1.0),
                        "token {t} pair {i}: |q| {before} -> {after}"
                    );
                }
            }
            let dots: Vec<f64> = (0..tokens).map(|t| (0..d).map(|j| qr[t * d + j] * kr[t * d + j]).sum()).collect();
            for dot in &dots {
                // Same p - n: same dot product, up to f32 rounding of the rotated vectors.
                assert_relative_eq!(*dot, dots[0], epsilon = 1e-4, max_relative = 1e-4);
            }
        }
    }
}

#[test]
fn llama31_scaling_at_band_edges() {
    let s = Llama3Scaling::LLAMA_3_1;
    let two_pi = 2.0 * std::f64::consts::PI;
    let low_edge = s.original_max_position_embeddings / s.low_freq_factor; // 8192: longer waves are scaled
    let high_edge = s.original_max_position_embeddings / s.high_freq_factor; // 2048: shorter waves kept
    let f_at = |wavelen: f64| two_pi / wavelen;
    // Just outside each edge: the plain rule.
    assert_eq!(llama3_scale(f_at(low_edge * 1.0001), &s), f_at(low_edge * 1.0001) / 8.0);
    assert_eq!(llama3_scale(f_at(high_edge * 0.9999), &s), f_at(high_edge * 0.9999));
    // At each edge, the smooth band meets the plain rule (continuity), and is monotone between.
    assert_relative_eq!(llama3_scale(f_at(low_edge), &s), f_at(low_edge) / 8.0, max_relative = 1e-12);
    assert_relative_eq!(llama3_scale(f_at(high_edge), &s), f_at(high_edge), max_relative = 1e-12);
    let mut last_ratio = 0.0;
    for k in 0..=100 {
        let w = high_edge + (low_edge - high_edge) * k as f64 / 100.0;
        let ratio = f_at(w) / llama3_scale(f_at(w), &s); // 1 at the high edge .. 8 at the low edge
        assert!((1.0 - 1e-12..=8.0 + 1e-12).contains(&ratio) && ratio >= last_ratio - 1e-12, "w {w}: ratio {ratio}");
        last_ratio = ratio;
    }
    // The full Llama 3.1 table (head_dim 128, theta 500000) has all three bands.
    let f = inv_freq(&RopeConfig::llama3_1(128));
    let plain = inv_freq(&RopeConfig { scaling: None, ..RopeConfig::llama3_1(128) });
    let (mut low, mut mid, mut high) = (0, 0, 0);
    for (a, b) in f.iter().zip(&plain) {
        let w = two_pi / b;
        if w > low_edge {
            assert_eq!(*a, b / 8.0);
            low += 1;
        } else if w < high_edge {
            assert_eq!(a, b);
            high += 1;
        } else {
            assert!(*a < *b && *a > b / 8.0);
            mid += 1;
        }
    }
    assert!(low > 0 && mid > 0 && high > 0, "bands {low} {mid} {high}");
    // Llama 4 Scout: low == high frequency factor, no middle band, no NaN.
    let scout = inv_freq(&RopeConfig::llama4_scout(128));
    assert!(scout.iter().all(|v| v.is_finite() && *v > 0.0));
    let plain4 = inv_freq(&RopeConfig { scaling: None, ..RopeConfig::llama4_scout(128) });
    for (a, b) in scout.iter().zip(&plain4) {
        assert!(*a == *b || *a == b / 16.0, "{a} vs {b}");
    }
}

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        for cfg in [
            RopeConfig::llama3_1(128),
            RopeConfig::llama4_scout(128),
            RopeConfig { rotary_dim: 50, ..RopeConfig::llama4_scout(64) },
        ] {
            let case = RopeCase::new(dtype, 6, 8, 2, cfg);
            common::assert_schedules_agree(&format!("{case:?}"), |d| rope_case(d, case));
        }
    }
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let bad_config = |cfg: RopeConfig, name: &str| {
        let e = Rope::new(&d, cfg).unwrap_err();
        assert!(matches!(&e, Error::InvalidArgument { name: n, .. } if *n == name), "{name}: {e}");
    };
    let base = RopeConfig::llama3_1(128);
    bad_config(RopeConfig { rotary_dim: 63, ..base }, "rotary_dim"); // odd
    bad_config(RopeConfig { rotary_dim: 130, ..base }, "rotary_dim"); // > head_dim
    bad_config(RopeConfig { head_dim: 1024, rotary_dim: MAX_ROTARY_DIM + 2, ..base }, "rotary_dim"); // too large
    bad_config(RopeConfig { theta: 0.0, ..base }, "theta");
    bad_config(RopeConfig { theta: -1.0, ..base }, "theta");
    bad_config(RopeConfig { theta: f64::NAN, ..base }, "theta");
    let sc = Llama3Scaling::LLAMA_3_1;
    bad_config(RopeConfig { scaling: Some(Llama3Scaling { factor: 0.0, ..sc }), ..base }, "factor");
    bad_config(RopeConfig { scaling: Some(Llama3Scaling { low_freq_factor: -1.0, ..sc }), ..base }, "low_freq_factor");
    bad_config(RopeConfig { scaling: Some(Llama3Scaling { high_freq_factor: 0.0, ..sc }), ..base }, "high_freq_factor");
    bad_config(
        RopeConfig { scaling: Some(Llama3Scaling { original_max_position_embeddings: 0.0, ..sc }), ..base },
        "original_max_position_embeddings",
    );
    bad_config(
        RopeConfig { scaling: Some(Llama3Scaling { low_freq_factor: 4.0, high_freq_factor: 1.0, ..sc }), ..base },
        "high_freq_factor",
    );
    bad_config(RopeConfig { qk_norm_eps: Some(0.0), ..base }, "qk_norm_eps");

    let rope = Rope::new(&d, base).unwrap();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let q = t(DType::BF16, &[4, 8, 128]);
    let k = t(DType::BF16, &[4, 2, 128]);
    let pos = t(DType::I32, &[4]);
    rope.apply(&q, Some(&k), &pos).unwrap();
    // q/k head_dim mismatch, and q not matching the config.
    let e = rope.apply(&q, Some(&t(DType::BF16, &[4, 2, 64])), &pos).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "k", .. }), "{e}");
    let e = rope.apply(&t(DType::BF16, &[4, 8, 64]), None, &pos).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "q", .. }), "{e}");
    // q/k token counts differ.
    let e = rope.apply(&q, Some(&t(DType::BF16, &[3, 2, 128])), &pos).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "k", .. }), "{e}");
    // Positions of the wrong length, or dtype.
    let e = rope.apply(&q, Some(&k), &t(DType::I32, &[5])).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "positions", .. }), "{e}");
    let e = rope.apply(&q, Some(&k), &t(DType::F32, &[4])).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "positions", .. }), "{e}");
    // q/k dtype mismatch.
    let e = rope.apply(&q, Some(&t(DType::F16, &[4, 2, 128])), &pos).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "k", .. }), "{e}");
    // q and k overlapping (k is a view of q's first heads).
    let e = rope.apply(&q, Some(&q.narrow(1, 0, 2).unwrap()), &pos).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // head_dim not contiguous.
    let wide = t(DType::BF16, &[4, 8, 256]);
    let e = rope.apply(&wide.as_strided(&[4, 8, 128], &[2048, 256, 2], 0).unwrap(), None, &pos).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "q", .. }), "{e}");
    // Too few dimensions.
    let e = rope.apply(&t(DType::BF16, &[4, 128]), None, &pos).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "q", .. }), "{e}");
}

#[test]
fn angle_error_stays_within_the_documented_bound_up_to_2_pow_24() {
    // Unit pairs (1, 0) rotated in f32 at positions spread over [0, 2^24): the result is
    // (cos, sin) of p * f_i, which the f64 reference knows to ~1e-15. kernels/rope.cu documents a
    // reduced-angle error of ~1e-7 rad plus ~1 ulp of polynomial: allow 3e-7 (seen: 7e-8).
    let d = 128;
    let device = Device::emulated();
    for layout in [RopeLayout::Interleaved, RopeLayout::HalfSplit] {
        let cfg = RopeConfig { layout, ..RopeConfig::llama3_1(d) };
        let rope = Rope::new(&device, cfg).unwrap();
        let mut rng = Rng::new(5);
        let positions: Vec<i64> =
            (0..64).map(|i| if i < 4 { (1 << 24) - 1 - i } else { rng.below(1 << 24) as i64 }).collect();
        let tokens = positions.len();
        let mut x = vec![0.0f64; tokens * d];
        for t in 0..tokens {
            for i in 0..d / 2 {
                let a = if layout == RopeLayout::Interleaved { 2 * i } else { i };
                x[t * d + a] = 1.0;
            }
        }
        let xt = Tensor::from_f64(&device, DType::F32, &x, &[tokens, 1, d]).unwrap();
        let pt = Tensor::from_slice(&device, &positions, &[tokens]).unwrap();
        rope.apply(&xt, None, &pt).unwrap();
        let got = xt.to_f64_vec().unwrap();
        let expected = llama_kernels::reference::rope::rope(&x, 1, &positions, &cfg).unwrap();
        let worst = got.iter().zip(&expected).map(|(g, e)| (g - e).abs()).fold(0.0, f64::max);
        assert!(worst <= 3e-7, "{layout:?}: worst rotation error {worst:e} at positions below 2^24");
    }
}
