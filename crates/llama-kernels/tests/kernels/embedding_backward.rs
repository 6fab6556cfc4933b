//! Embedding backward: the table gradient against the f64 reference for every dtype, repeated
//! and absent ids, several sort chunks, accumulation, strided rows and both access paths;
//! bit-identical under every schedule; bad ids flagged; validation errors.

use crate::common;

use llama_kernels::dev::testing::{Rng, Tolerance, compare};
use llama_kernels::dev::verify::rows_tensor;
use llama_kernels::ops::ErrorFlag;
use llama_kernels::ops::embedding_backward::{CHUNK, EmbeddingBackward};
use llama_kernels::reference::embedding::embedding_backward;
use llama_kernels::{DType, Device, Error, Tensor};

/// Runs one case and returns the table gradient's bits.
fn run(
    device: &Device,
    dtype: DType,
    tokens: usize,
    vocab: usize,
    hidden: usize,
    accumulate: bool,
    pad: usize,
) -> Vec<u64> {
    let mut rng = Rng::new((tokens * 7 + vocab * 13 + hidden) as u64);
    // Few distinct ids, so runs are long; id 0 and vocab - 1 always present.
    let ids: Vec<i32> = (0..tokens)
        .map(|t| {
            if t == 0 {
                0
            } else if t == 1 {
                vocab as i32 - 1
            } else {
                rng.below(vocab.min(37) as u64) as i32
            }
        })
        .collect();
    let dy = rng.normal_vec(tokens * hidden, 1.0, dtype);
    let t0 = rng.normal_vec(vocab * hidden, 1.0, DType::F32);
    let (dyt, _) = rows_tensor(device, dtype, &dy, tokens, hidden, pad).unwrap();
    let it = Tensor::from_slice(device, &ids, &[tokens]).unwrap();
    let (tt, tfull) = if accumulate {
        rows_tensor(device, DType::F32, &t0, vocab, hidden, pad).unwrap()
    } else {
        let full = Tensor::poisoned(device, DType::F32, &[vocab, hidden + pad]).unwrap();
        (full.narrow(1, 0, hidden).unwrap(), full)
    };
    let errors = ErrorFlag::new(device).unwrap();
    EmbeddingBackward::new(device).unwrap().run(&dyt, &it, &tt, accumulate, &errors).unwrap();
    errors.check("embedding_backward").unwrap();
    let mut want = embedding_backward(&dy, &ids, vocab, hidden).unwrap();
    if accumulate {
        want.iter_mut().zip(&t0).for_each(|(w, a)| *w += a);
    }
    let got = tt.to_f64_vec().unwrap();
    // f32 sums of at most `tokens` terms of magnitude ~1 (and the accumulated value).
    let tol = Tolerance { atol: 4.0 * (tokens as f64) * 6e-8 + 1e-6, rtol: 1e-6 };
    let cmp = compare(&got, &want, tol);
    assert!(
        cmp.pass,
        "{dtype} {tokens} tokens {vocab}x{hidden} acc {accumulate} pad {pad}: {}",
        cmp.describe(&[vocab, hidden])
    );
    if pad > 0 && !accumulate {
        assert!(llama_kernels::dev::verify::gaps_poisoned(&tfull, hidden).unwrap(), "wrote outside its rows");
    }
    got.iter().map(|v| v.to_bits()).collect()
}

#[test]
fn table_gradient_matches_the_reference() {
    for device in common::devices() {
        for dtype in DType::FLOATS {
            for (tokens, vocab, hidden) in [(1, 5, 8), (9, 50, 64), (300, 1000, 36), (77, 40, 13)] {
                for (accumulate, pad) in [(false, 0), (true, 0), (false, 4)] {
                    run(&device, dtype, tokens, vocab, hidden, accumulate, pad);
                }
            }
        }
    }
}

#[test]
fn several_sort_chunks() {
    // More tokens than one sorted chunk: the later chunks add to the rows of their ids.
    let d = Device::emulated();
    run(&d, DType::BF16, 2 * CHUNK + 5, 300, 16, false, 0);
    run(&d, DType::F32, CHUNK + 1, 40, 8, true, 3);
}

#[test]
fn schedules_give_bit_identical_gradients() {
    let runs: Vec<Vec<u64>> =
        common::schedule_devices().iter().map(|d| run(d, DType::BF16, 200, 64, 40, false, 0)).collect();
    assert!(runs.windows(2).all(|w| w[0] == w[1]));
}

#[test]
fn bad_ids_add_nothing_and_are_flagged() {
    let d = Device::emulated();
    let dy = Tensor::from_f64(&d, DType::F32, &[1.0; 12], &[3, 4]).unwrap();
    let ids = Tensor::from_slice(&d, &[1i32, 7, -1], &[3]).unwrap();
    let table = Tensor::poisoned(&d, DType::F32, &[5, 4]).unwrap();
    let errors = ErrorFlag::new(&d).unwrap();
    EmbeddingBackward::new(&d).unwrap().run(&dy, &ids, &table, false, &errors).unwrap();
    let got = table.to_f64_vec().unwrap();
    assert_eq!(got.iter().sum::<f64>(), 4.0, "{got:?}");
    assert!(got[4..8].iter().all(|&v| v == 1.0));
    let e = errors.check("embedding_backward").unwrap_err();
    assert!(e.to_string().contains("token id"), "{e}");
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = |dtype, shape: &[usize]| Tensor::zeros(&d, dtype, shape).unwrap();
    let bwd = EmbeddingBackward::new(&d).unwrap();
    let errors = ErrorFlag::new(&d).unwrap();
    let ids = Tensor::from_slice(&d, &[0i32, 1], &[2]).unwrap();
    let (dy, table) = (t(DType::BF16, &[2, 8]), t(DType::F32, &[10, 8]));
    let e = bwd.run(&dy, &ids, &t(DType::BF16, &[10, 8]), false, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "d_table", .. }), "{e}");
    let e = bwd.run(&dy, &t(DType::I64, &[2]), &table, false, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "ids", .. }), "{e}");
    let e = bwd.run(&t(DType::BF16, &[2, 7]), &ids, &table, false, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "d_out", .. }), "{e}");
    let e = bwd.run(&dy, &ids, &t(DType::F32, &[80]), false, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "d_table", .. }), "{e}");
    let e = bwd.run(&t(DType::I32, &[2, 8]), &ids, &table, false, &errors).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    // No tokens: the table is zeroed (or left when accumulating).
    let none = Tensor::from_slice(&d, &[0i32; 0], &[0]).unwrap();
    let p = Tensor::poisoned(&d, DType::F32, &[10, 8]).unwrap();
    bwd.run(&t(DType::BF16, &[0, 8]), &none, &p, false, &errors).unwrap();
    assert!(p.to_f64_vec().unwrap().iter().all(|&v| v == 0.0));
}

#[test]
fn the_verify_rows_pass() {
    use llama_kernels::dev::verify::{EmbeddingBackwardCase, embedding_backward_case, embedding_backward_cases};
    for device in common::devices() {
        // The quick rows, and one full-size row (SmolLM2's table, more tokens than one chunk).
        let full = EmbeddingBackwardCase {
            dtype: DType::BF16,
            tokens: 5000,
            vocab: 49_152,
            hidden: 576,
            accumulate: false,
            seed: 2,
        };
        for case in embedding_backward_cases(true).into_iter().chain([full]) {
            let r = embedding_backward_case(&device, case).unwrap_or_else(|e| panic!("{case:?}: {e}"));
            assert!(r.pass, "{}", r.describe());
        }
    }
}
