//! SwiGLU parity against the f64 reference (emulated, and CUDA when present), every input form,
//! schedule independence, and every error.

use crate::common;

use llama_kernels::dev::verify::{SwiGluCase, SwiGluInput, swiglu_case};
use llama_kernels::ops::swiglu::{GateUp, swiglu};
use llama_kernels::{DType, Device, Error, Tensor};

fn assert_pass(device: &Device, case: SwiGluCase) {
    let r = swiglu_case(device, case).unwrap_or_else(|e| panic!("{case:?} on {device:?}: {e}"));
    assert!(r.pass, "{} on {device:?}", r.describe());
}

#[test]
fn packed_separate_and_interleaved_all_dtypes() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for input in [SwiGluInput::Separate, SwiGluInput::GateThenUp, SwiGluInput::Interleaved] {
                // 769 is odd: no 16-byte vectors, so the fallback runs; 14336 is Llama 3 8B's ffn.
                for (tokens, d) in [(1, 14336), (5, 769), (33, 1024), (3, 8)] {
                    assert_pass(&device, SwiGluCase::new(dtype, tokens, d, input));
                }
            }
        }
    }
}

#[test]
fn strided_and_in_place() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for pad in [0, 3, 8] {
                assert_pass(&device, SwiGluCase { pad, ..SwiGluCase::new(dtype, 7, 1024, SwiGluInput::Separate) });
                assert_pass(&device, SwiGluCase { pad, ..SwiGluCase::new(dtype, 7, 256, SwiGluInput::Interleaved) });
            }
            assert_pass(
                &device,
                SwiGluCase { in_place: true, ..SwiGluCase::new(dtype, 9, 1024, SwiGluInput::Separate) },
            );
            assert_pass(
                &device,
                SwiGluCase { in_place: true, ..SwiGluCase::new(dtype, 9, 769, SwiGluInput::GateThenUp) },
            );
        }
    }
}

#[test]
fn many_tokens_wrap_the_grid() {
    // More than 65535 tokens: grid.y is capped and the kernel walks the rest.
    let device = Device::emulated();
    assert_pass(&device, SwiGluCase::new(DType::BF16, 70_000, 8, SwiGluInput::GateThenUp));
}

#[test]
fn schedules_agree_bit_for_bit() {
    for dtype in DType::FLOATS {
        for input in [SwiGluInput::Separate, SwiGluInput::GateThenUp, SwiGluInput::Interleaved] {
            let case = SwiGluCase::new(dtype, 4, 1000, input);
            common::assert_schedules_agree(&format!("{case:?}"), |d| swiglu_case(d, case));
        }
    }
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let g = t(DType::BF16, &[4, 64]);
    let u = t(DType::BF16, &[4, 64]);
    let out = t(DType::BF16, &[4, 64]);
    swiglu(GateUp::Separate { gate: &g, up: &u }, &out).unwrap();
    // Gate and up shapes disagree.
    let e = swiglu(GateUp::Separate { gate: &g, up: &t(DType::BF16, &[4, 65]) }, &out).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "up", .. }), "{e}");
    // Output shape disagrees.
    let e = swiglu(GateUp::Separate { gate: &g, up: &u }, &t(DType::BF16, &[3, 64])).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "out", .. }), "{e}");
    let e = swiglu(GateUp::GateThenUp(&t(DType::BF16, &[4, 128])), &t(DType::BF16, &[4, 128])).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "out", .. }), "{e}");
    // Packed width odd.
    for packed in [GateUp::GateThenUp(&t(DType::BF16, &[4, 129])), GateUp::Interleaved(&t(DType::BF16, &[4, 129]))] {
        let e = swiglu(packed, &out).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { what: "gate_up", .. }), "{e}");
    }
    // Dtype mismatches and unsupported dtypes.
    let e = swiglu(GateUp::Separate { gate: &g, up: &t(DType::F16, &[4, 64]) }, &out).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "up", .. }), "{e}");
    let e = swiglu(GateUp::Separate { gate: &g, up: &u }, &t(DType::F32, &[4, 64])).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "out", .. }), "{e}");
    let e = swiglu(GateUp::Interleaved(&t(DType::I32, &[4, 128])), &out).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    // Output overlapping up, or an interleaved input (no in-place form there).
    let e = swiglu(GateUp::Separate { gate: &g, up: &u }, &u).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    let packed = t(DType::BF16, &[4, 128]);
    let e = swiglu(GateUp::Interleaved(&packed), &packed.narrow(1, 0, 64).unwrap()).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // Non-contiguous last dimension.
    let wide = t(DType::BF16, &[4, 128]);
    let e =
        swiglu(GateUp::Separate { gate: &wide.as_strided(&[4, 64], &[128, 2], 0).unwrap(), up: &u }, &out).unwrap_err();
    assert!(matches!(e, Error::BadLayout { what: "gate", .. }), "{e}");
}
