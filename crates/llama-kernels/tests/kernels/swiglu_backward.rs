//! SwiGLU backward: every layout (separate, gate-then-up, interleaved), in place over the saved
//! gate/up, strided rows and both access paths against the f64 reference; bit-identical under
//! every schedule; the reference against central differences and PyTorch float64 autograd;
//! validation errors.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::{SwiGluBackwardCase, SwiGluLayout, swiglu_backward_case};
use llama_kernels::ops::{self, GateUp};
use llama_kernels::reference::swiglu::{swiglu, swiglu_backward};
use llama_kernels::{DType, Device, Error, Tensor};

const LAYOUTS: [SwiGluLayout; 3] = [SwiGluLayout::Separate, SwiGluLayout::GateThenUp, SwiGluLayout::Interleaved];

#[test]
fn gradients_match_the_reference_in_every_layout() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for layout in LAYOUTS {
                for (tokens, d, pad) in [(1, 8, 0), (7, 1000, 0), (33, 256, 8), (5, 257, 3), (3, 14336, 0)] {
                    for in_place in [false, true] {
                        let mut case = SwiGluBackwardCase::new(dtype, tokens, d, layout).strided(pad);
                        if in_place {
                            case = case.in_place();
                        }
                        let r = swiglu_backward_case(&device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
                        assert!(r.pass, "{}", r.describe());
                    }
                }
            }
        }
    }
}

#[test]
fn schedules_give_bit_identical_gradients() {
    for layout in LAYOUTS {
        let case = SwiGluBackwardCase::new(DType::BF16, 9, 520, layout).strided(8);
        common::assert_schedules_agree(&format!("{case:?}"), |d| swiglu_backward_case(d, case));
    }
}

#[test]
fn the_reference_agrees_with_central_differences() {
    let mut rng = Rng::new(4);
    let (g, u, dy) =
        (rng.normal_vec(64, 3.0, DType::F32), rng.normal_vec(64, 1.0, DType::F32), rng.normal_vec(64, 1.0, DType::F32));
    let (dg, du) = swiglu_backward(&g, &u, &dy).unwrap();
    let loss = |g: &[f64], u: &[f64]| swiglu(g, u).unwrap().iter().zip(&dy).map(|(a, b)| a * b).sum::<f64>();
    let worst = common::central_difference_error(&g, &dg, |g| loss(g, &u)).max(common::central_difference_error(
        &u,
        &du,
        |u| loss(&g, u),
    ));
    println!("largest |central difference - reference gradient|: {worst:.2e}");
    assert!(worst < 1e-7, "{worst}");
}

#[test]
fn gradients_match_pytorch_autograd_in_float64() {
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/autograd/autograd.json")).expect("the fixture is JSON");
    let device = Device::emulated();
    let mut checked = 0;
    for c in fixture["cases"].as_array().unwrap().iter().filter(|c| c["op"] == "swiglu") {
        let (tokens, d) = (c["tokens"].as_u64().unwrap() as usize, c["d"].as_u64().unwrap() as usize);
        let get = |k: &str| crate::rms_norm_backward::f64s(c[k].as_str().unwrap());
        let up = |v: &[f64]| Tensor::from_f64(&device, DType::F32, v, &[tokens, d]).unwrap();
        let (gt, ut, dyt) = (up(&get("gate")), up(&get("up")), up(&get("d_out")));
        let (dgt, dut) = (
            Tensor::poisoned(&device, DType::F32, &[tokens, d]).unwrap(),
            Tensor::poisoned(&device, DType::F32, &[tokens, d]).unwrap(),
        );
        ops::swiglu_backward(&dyt, GateUp::Separate { gate: &gt, up: &ut }, GateUp::Separate { gate: &dgt, up: &dut })
            .unwrap();
        let tol = Tolerance { atol: 2e-6, rtol: 2e-6 };
        for (what, got, want) in [("d_gate", &dgt, "d_gate"), ("d_up", &dut, "d_up")] {
            let cmp = compare(&got.to_f64_vec().unwrap(), &get(want), tol);
            assert!(cmp.pass, "{what}: {}", cmp.describe(&[tokens, d]));
        }
        checked += 1;
    }
    assert_eq!(checked, 2);
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let (g, u, dy) = (t(DType::BF16, &[4, 64]), t(DType::BF16, &[4, 64]), t(DType::BF16, &[4, 64]));
    let (dg, du) = (t(DType::BF16, &[4, 64]), t(DType::BF16, &[4, 64]));
    let sep = |a, b| GateUp::Separate { gate: a, up: b };
    let e = ops::swiglu_backward(&t(DType::BF16, &[4, 63]), sep(&g, &u), sep(&dg, &du)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "d_out", .. }), "{e}");
    let short = t(DType::BF16, &[3, 64]);
    let e = ops::swiglu_backward(&dy, sep(&g, &u), sep(&dg, &short)).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "d_up", .. }), "{e}");
    let f32_grad = t(DType::F32, &[4, 64]);
    let e = ops::swiglu_backward(&dy, sep(&g, &u), sep(&f32_grad, &du)).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "d_gate", .. }), "{e}");
    let packed = t(DType::BF16, &[4, 128]);
    let e = ops::swiglu_backward(&dy, GateUp::Interleaved(&packed), sep(&dg, &du)).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { name: "grad", .. }), "{e}");
    let e = ops::swiglu_backward(&dy, sep(&g, &u), sep(&dy, &du)).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let dg2 = dg.clone();
    let e = ops::swiglu_backward(&dy, sep(&g, &u), sep(&dg, &dg2)).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let e = ops::swiglu_backward(&t(DType::I32, &[4, 64]), sep(&g, &u), sep(&dg, &du)).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    ops::swiglu_backward(&dy, sep(&g, &u), sep(&dg, &du)).unwrap();
    ops::swiglu_backward(&dy, GateUp::GateThenUp(&packed), GateUp::GateThenUp(&packed)).unwrap();
}
