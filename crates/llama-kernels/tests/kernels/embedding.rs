//! The embedding lookup against the reference (emulated, and CUDA when present): every dtype, the
//! 16-byte and the scalar path (odd widths, strided rows of the table and the output), repeated
//! and boundary ids, ids outside the vocabulary (zero rows, flagged on the device, never read),
//! schedules bit for bit, and a named error for each bad host-visible input; the lookup from a
//! packed table of every format equals the dense lookup of its dequantized rows, bit for bit.

use crate::common;

use llama_kernels::dev::testing::Rng;
use llama_kernels::dev::verify::random_packed;
use llama_kernels::dtype::round_to;
use llama_kernels::ops::ErrorFlag;
use llama_kernels::ops::embedding::{embedding, embedding_packed};
use llama_kernels::ops::qlinear::QWeight;
use llama_kernels::reference;
use llama_kernels::spec::quant::QuantFormat;
use llama_kernels::{DType, Device, Error, Tensor};

/// Table `[vocab, width]` viewed as `[vocab, hidden]` (width >= hidden: strided rows).
fn table(d: &Device, dtype: DType, vocab: usize, hidden: usize, width: usize, seed: u64) -> (Tensor, Vec<f64>) {
    let mut rng = Rng::new(seed);
    let all = rng.normal_vec(vocab * width, 1.0, dtype);
    let t = Tensor::from_f64(d, dtype, &all, &[vocab, width]).unwrap().narrow(1, 0, hidden).unwrap();
    let values = (0..vocab).flat_map(|r| all[r * width..r * width + hidden].to_vec()).collect();
    (t, values)
}

fn check(d: &Device, dtype: DType, vocab: usize, hidden: usize, width: usize, ids: &[i32]) -> Vec<f64> {
    let (t, values) = table(d, dtype, vocab, hidden, width, (vocab * 31 + hidden) as u64);
    let idt = Tensor::from_slice(d, ids, &[ids.len()]).unwrap();
    // The output: rows of a wider poisoned buffer when width > hidden.
    let out = Tensor::poisoned(d, dtype, &[ids.len(), width]).unwrap().narrow(1, 0, hidden).unwrap();
    let errors = ErrorFlag::new(d).unwrap();
    embedding(&t, &idt, &out, &errors).unwrap();
    let ids64: Vec<i64> = ids.iter().map(|&i| i64::from(i)).collect();
    let (want, bad) = reference::embedding::embedding(&values, hidden, &ids64).unwrap();
    let got = out.to_f64_vec().unwrap();
    assert!(
        got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
        "{dtype} vocab {vocab} hidden {hidden} width {width} on {d:?}: rows differ"
    );
    match (errors.check("embedding"), bad) {
        (Ok(()), false) => {}
        (Err(Error::DeviceReported { what, .. }), true) => assert!(what.contains("token id"), "{what}"),
        (r, bad) => panic!("flag {r:?}, reference bad ids {bad}"),
    }
    got
}

#[test]
fn every_dtype_both_paths_and_strided_rows_match_the_reference() {
    for d in common::devices() {
        for dtype in DType::FLOATS {
            let ids = [0, 7, 7, 99, 3, 50];
            check(&d, dtype, 100, 64, 64, &ids); // 16-byte path
            check(&d, dtype, 100, 64, 72, &ids); // strided rows, still 16-byte aligned
            check(&d, dtype, 100, 37, 37, &ids); // odd width: scalar path
            check(&d, dtype, 100, 40, 41, &ids); // strides that break the vectors
        }
        // More tokens than one grid row of blocks covers, and a Llama-sized row.
        let many: Vec<i32> = (0..700).map(|i| i * 37 % 97).collect();
        check(&d, DType::BF16, 97, 576, 576, &many);
    }
}

#[test]
fn ids_outside_the_vocabulary_give_zero_rows_and_raise_the_flag() {
    for d in common::devices() {
        for dtype in [DType::BF16, DType::F32] {
            let got = check(&d, dtype, 50, 64, 64, &[3, 50, -1, i32::MAX, i32::MIN, 49]);
            // Rows 1..=4 are the bad ids: zeros (the reference says so too; this is not the check).
            assert!(got[64..5 * 64].iter().all(|&x| x == 0.0));
        }
    }
}

#[test]
fn schedules_agree_bit_for_bit() {
    let ids: Vec<i32> = (0..40).map(|i| i * 13 % 60).collect();
    let runs: Vec<Vec<f64>> =
        common::schedule_devices().iter().map(|d| check(d, DType::F16, 60, 200, 200, &ids)).collect();
    assert!(runs.iter().all(|r| r == &runs[0]));
}

#[test]
fn every_validation_error_is_named() {
    let d = Device::emulated();
    let t = Tensor::zeros(&d, DType::BF16, &[10, 64]).unwrap();
    let ids = Tensor::from_slice(&d, &[1i32, 2], &[2]).unwrap();
    let out = Tensor::zeros(&d, DType::BF16, &[2, 64]).unwrap();
    let errors = ErrorFlag::new(&d).unwrap();
    embedding(&t, &ids, &out, &errors).unwrap();
    let e = embedding(&t, &Tensor::from_slice(&d, &[1i64, 2], &[2]).unwrap(), &out, &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "ids", .. }), "{e}");
    let e = embedding(&t, &ids, &Tensor::zeros(&d, DType::F16, &[2, 64]).unwrap(), &errors).unwrap_err();
    assert!(matches!(e, Error::DTypeMismatch { what: "out", .. }), "{e}");
    let e = embedding(&t, &ids, &Tensor::zeros(&d, DType::BF16, &[3, 64]).unwrap(), &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "out", .. }), "{e}");
    let e = embedding(&t, &ids, &Tensor::zeros(&d, DType::BF16, &[2, 63]).unwrap(), &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "out", .. }), "{e}");
    let e = embedding(&t.reshape(&[640]).unwrap(), &ids, &out, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "table", .. }), "{e}");
    let ids2 = Tensor::from_slice(&d, &[1i32, 2, 3, 4], &[2, 2]).unwrap();
    let e = embedding(&t, &ids2, &out, &errors).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { what: "ids", .. }), "{e}");
    let e = embedding(&Tensor::zeros(&d, DType::I32, &[10, 64]).unwrap(), &ids, &out, &errors).unwrap_err();
    assert!(matches!(e, Error::UnsupportedDType { .. }), "{e}");
    // The output inside the table.
    let e = embedding(&t, &ids, &t.narrow(0, 0, 2).unwrap(), &errors).unwrap_err();
    assert!(matches!(e, Error::Overlap { .. }), "{e}");
    // Empty: nothing to do.
    let none = Tensor::from_slice(&d, &[] as &[i32], &[0]).unwrap();
    embedding(&t, &none, &Tensor::zeros(&d, DType::BF16, &[0, 64]).unwrap(), &errors).unwrap();
    errors.check("embedding").unwrap();
}

#[test]
fn packed_tables_give_the_dequantized_rows_rounded_bit_for_bit() {
    for d in common::devices() {
        for format in QuantFormat::ALL {
            let (vocab, hidden) = (37, if format.default_block() == 32 { 96 } else { 256 });
            let mut rng = Rng::new(format as u64 + 11);
            let packed = random_packed(&mut rng, format, vocab, hidden).unwrap();
            let dense = packed.dequantize();
            let table = QWeight::new(&d, &packed).unwrap();
            let ids = [0i32, 36, 5, 5, 17, -1, 37, 2];
            let idt = Tensor::from_slice(&d, &ids, &[ids.len()]).unwrap();
            for (dtype, width) in [(DType::F32, hidden), (DType::BF16, hidden + 8), (DType::F16, hidden + 3)] {
                // Rows of a wider poisoned buffer: 16-byte stores, or (odd width) one by one.
                let out = Tensor::poisoned(&d, dtype, &[ids.len(), width]).unwrap().narrow(1, 0, hidden).unwrap();
                let errors = ErrorFlag::new(&d).unwrap();
                embedding_packed(&table, &idt, &out, &errors).unwrap();
                let got = out.to_f64_vec().unwrap();
                for (t, &id) in ids.iter().enumerate() {
                    let row = &got[t * hidden..][..hidden];
                    let want: Vec<f64> = match usize::try_from(id).ok().filter(|&i| i < vocab) {
                        Some(i) => {
                            dense[i * hidden..][..hidden].iter().map(|&v| round_to(dtype, f64::from(v))).collect()
                        }
                        None => vec![0.0; hidden],
                    };
                    assert!(
                        row.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{format} {dtype} id {id} on {d:?}: the row differs"
                    );
                }
                assert!(matches!(errors.check("embedding"), Err(Error::DeviceReported { .. })), "{format}: ids -1, 37");
            }
            let bad_ids = Tensor::from_slice(&d, &[1.0f32], &[1]).unwrap();
            let out = Tensor::zeros(&d, DType::F32, &[1, hidden]).unwrap();
            let errors = ErrorFlag::new(&d).unwrap();
            assert!(matches!(embedding_packed(&table, &bad_ids, &out, &errors), Err(Error::DTypeMismatch { .. })));
            let short = Tensor::zeros(&d, DType::F32, &[ids.len(), hidden - 32]).unwrap();
            assert!(matches!(embedding_packed(&table, &idt, &short, &errors), Err(Error::ShapeMismatch { .. })));
        }
    }
}
