//! RoPE backward: the transpose rotation and the qk-norm's backward in both layouts, partial
//! rotary, Llama 3.1 scaling, GQA and fused QKV views, both access paths, against the f64
//! reference; forward then backward is the identity; bit-identical under every schedule; the
//! reference against central differences and PyTorch float64 autograd; validation errors.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{RopeCase, rope_case};
use llama_kernels::ops::rope::{Rope, RopeConfig, RopeLayout, Saved};
use llama_kernels::reference::rope::{rope, rope_backward};
use llama_kernels::{DType, Device, Error, Tensor};

const LAYOUTS: [RopeLayout; 2] = [RopeLayout::Interleaved, RopeLayout::HalfSplit];

fn assert_pass(device: &Device, case: RopeCase) {
    let r = rope_case(device, case.backward()).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

fn with_layout(config: RopeConfig, layout: RopeLayout) -> RopeConfig {
    RopeConfig { layout, ..config }
}

#[test]
fn gradients_match_the_reference_in_every_variant() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in LAYOUTS {
                for base in [RopeConfig::llama3_1(128), RopeConfig::llama4_scout(128)] {
                    for (q_heads, kv_heads) in [(2, 2), (8, 1)] {
                        assert_pass(&device, RopeCase::new(dtype, 8, q_heads, kv_heads, with_layout(base, layout)));
                    }
                    // Partial rotary (50 of 64 takes the scalar path): the norm covers the
                    // pass-through dims too.
                    let partial = RopeConfig { head_dim: 64, rotary_dim: 50, ..with_layout(base, layout) };
                    assert_pass(&device, RopeCase::new(dtype, 7, 4, 2, partial));
                    let fused = RopeCase {
                        fused_qkv: true,
                        i64_positions: true,
                        ..RopeCase::new(dtype, 5, 4, 2, with_layout(base, layout))
                    };
                    assert_pass(&device, fused);
                }
            }
        }
    }
}

#[test]
fn many_tokens_and_head_dim_64() {
    for device in common::devices() {
        for dtype in [DType::BF16, DType::F32] {
            assert_pass(&device, RopeCase::new(dtype, 300, 40, 8, RopeConfig::llama4_scout(128)));
            assert_pass(&device, RopeCase::new(dtype, 40, 9, 3, RopeConfig::llama3_1(64)));
        }
    }
}

#[test]
fn schedules_give_bit_identical_gradients() {
    for config in [RopeConfig::llama3_1(128), RopeConfig::llama4_scout(128)] {
        let case = RopeCase::new(DType::BF16, 6, 8, 2, config).backward();
        common::assert_schedules_agree(&format!("{case:?}"), |d| rope_case(d, case));
    }
}

#[test]
fn forward_then_backward_is_the_identity_without_a_norm() {
    // R^T R = I: the kernel's backward angle is exactly the negated forward angle, so in f32 the
    // round trip returns the input to within a few roundings.
    let device = Device::emulated();
    let (tokens, heads, d) = (6, 4, 128);
    for layout in LAYOUTS {
        let cfg = with_layout(RopeConfig::llama3_1(d), layout);
        let rope = Rope::new(&device, cfg).unwrap();
        let x = Rng::new(8).normal_vec(tokens * heads * d, 1.0, DType::F32);
        let t = Tensor::from_f64(&device, DType::F32, &x, &[tokens, heads, d]).unwrap();
        let p = Tensor::from_slice(&device, &[0i32, 1, 8191, 131_071, 1 << 23, 16_777_215], &[tokens]).unwrap();
        rope.apply(&t, None, &p).unwrap();
        rope.backward(&t, None, &p, None).unwrap();
        let cmp = compare(&t.to_f64_vec().unwrap(), &x, Tolerance { atol: 1e-6, rtol: 1e-6 });
        assert!(cmp.pass, "{layout:?}: {}", cmp.describe(&[tokens, heads, d]));
    }
}

#[test]
fn the_reference_agrees_with_central_differences() {
    let (tokens, heads, d) = (3, 2, 16);
    let positions = [0i64, 5, 131_071];
    let mut rng = Rng::new(6);
    let (x, dy) =
        (rng.normal_vec(tokens * heads * d, 1.0, DType::F32), rng.normal_vec(tokens * heads * d, 1.0, DType::F32));
    let mut worst: f64 = 0.0;
    for layout in LAYOUTS {
        for base in [RopeConfig::llama3_1(d), RopeConfig::llama4_scout(d)] {
            for rotary_dim in [d, 10] {
                let cfg = RopeConfig { rotary_dim, ..with_layout(base, layout) };
                let dx = rope_backward(&dy, Some(&x), heads, &positions, &cfg).unwrap();
                let loss = |x: &[f64]| {
                    rope(x, heads, &positions, &cfg).unwrap().iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>()
                };
                worst = worst.max(common::central_difference_error(&x, &dx, loss));
            }
        }
    }
    println!("largest |central difference - reference gradient|: {worst:.2e}");
    assert!(worst < 1e-7, "{worst}");
}

#[test]
fn gradients_match_pytorch_autograd_in_float64() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let device = Device::emulated();
    let mut checked = 0;
    for c in fixture["cases"].as_array().unwrap().iter().filter(|c| c["op"] == "rope") {
        let n = |k: &str| c[k].as_u64().unwrap() as usize;
        let (tokens, heads, d) = (n("tokens"), n("heads"), n("head_dim"));
        let get = |k: &str| crate::rms_norm_backward::f64s(c[k].as_str().unwrap());
        let layout = if c["layout"] == "interleaved" { RopeLayout::Interleaved } else { RopeLayout::HalfSplit };
        let cfg = RopeConfig {
            head_dim: d,
            rotary_dim: d,
            theta: c["theta"].as_f64().unwrap(),
            layout,
            scaling: None,
            qk_norm_eps: c["qk_norm_eps"].as_f64().map(|e| e as f32),
        };
        let positions: Vec<i64> = c["positions"].as_array().unwrap().iter().map(|p| p.as_i64().unwrap()).collect();
        let rope = Rope::new(&device, cfg).unwrap();
        let x = Tensor::from_f64(&device, DType::F32, &get("x"), &[tokens, heads, d]).unwrap();
        let g = Tensor::from_f64(&device, DType::F32, &get("dy"), &[tokens, heads, d]).unwrap();
        let p = Tensor::from_slice(&device, &positions, &[tokens]).unwrap();
        rope.backward(&g, None, &p, Some(Saved { q: &x, k: None })).unwrap();
        // The inputs are rounded to f32 on upload; the gradients are O(1).
        let cmp = compare(&g.to_f64_vec().unwrap(), &get("dx"), Tolerance { atol: 4e-6, rtol: 4e-6 });
        assert!(cmp.pass, "{layout:?} norm {:?}: {}", cfg.qk_norm_eps, cmp.describe(&[tokens, heads, d]));
        checked += 1;
    }
    assert_eq!(checked, 4);
}

fn saved<'a>(q: &'a Tensor, k: Option<&'a Tensor>) -> Option<Saved<&'a Tensor>> {
    Some(Saved { q, k })
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let norm = Rope::new(&d, RopeConfig::llama4_scout(64)).unwrap();
    let plain = Rope::new(&d, RopeConfig::llama3_1(64)).unwrap();
    let (dq, dk) = (t(DType::BF16, &[3, 4, 64]), t(DType::BF16, &[3, 1, 64]));
    let (q, k) = (t(DType::BF16, &[3, 4, 64]), t(DType::BF16, &[3, 1, 64]));
    let p = Tensor::from_slice(&d, &[0i32, 1, 2], &[3]).unwrap();

    let e = norm.backward(&dq, Some(&dk), &p, None).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "saved", .. }), "{e}");
    let e = norm.backward(&dq, Some(&dk), &p, saved(&q, None)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "saved k", .. }), "{e}");
    let e = norm.backward(&dq, None, &p, saved(&q, Some(&k))).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "saved k", .. }), "{e}");
    let e = norm.backward(&dq, Some(&dk), &p, saved(&t(DType::BF16, &[3, 2, 64]), Some(&k))).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "saved q", .. }), "{e}");
    let e = norm.backward(&dq, Some(&dk), &p, saved(&t(DType::F32, &[3, 4, 64]), Some(&k))).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "saved q", .. }), "{e}");
    let e = norm.backward(&dq, Some(&dk), &p, saved(&dq, Some(&k))).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let e = norm.backward(&dq, Some(&dk), &p, saved(&q, Some(&dk))).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let e = plain.backward(&t(DType::BF16, &[3, 4, 32]), None, &p, None).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "q", .. }), "{e}");
    let e = plain.backward(&dq, None, &t(DType::F32, &[3]), None).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { what: "positions", .. }), "{e}");
    // Without a norm nothing is saved, and what is passed is not read.
    plain.backward(&dq, Some(&dk), &p, None).unwrap();
    plain.backward(&dq, Some(&dk), &p, saved(&t(DType::F32, &[1]), None)).unwrap();
    norm.backward(&dq, Some(&dk), &p, saved(&q, Some(&k))).unwrap();
    // An empty batch is a no-op.
    let none = Tensor::from_slice(&d, &[0i32; 0], &[0]).unwrap();
    norm.backward(&t(DType::BF16, &[0, 4, 64]), None, &none, saved(&t(DType::BF16, &[0, 4, 64]), None)).unwrap();
}
