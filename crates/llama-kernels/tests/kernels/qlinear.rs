//! Linear layers over packed weights (`ops::qlinear`): the device dequantization of every
//! format equals the specification bit for bit (and the specification equals llama.cpp's and the
//! `gguf` package's, `tests/gguf.rs`), every path (the tensor-core GEMV and the CUDA-core GEMV,
//! split along `in` or not, the tensor-core GEMM, the dequantize-and-GEMM fallback) matches the
//! f64 reference of its weights for every row
//! count from 1 to 17 and a few larger, with partial tiles, strided and accumulating, schedules
//! agree bit for bit, and each bad input is a named error.

use crate::common;

use llama_kernels::dev::testing::Rng;
use llama_kernels::dev::verify::{QLinearCase, qdequant_case, qlinear_case, random_packed};
use llama_kernels::ops::qlinear::{
    QPath, QScratch, QWeight, WeightValues, gemm_splits, gemv_split, has_mma_gemv, mma_gemv_splits, qlinear,
    qlinear_add,
};
use llama_kernels::spec::quant::{NF4_CODE, PackedWeight, QuantFormat, QuantLayout};
use llama_kernels::{DType, Device, Error, Tensor};

#[test]
fn device_dequantization_equals_the_specification_for_every_format() {
    for device in common::devices() {
        for format in QuantFormat::ALL {
            let r = qdequant_case(&device, format, 13, 512).unwrap();
            assert!(r.pass, "{}", r.describe());
        }
    }
}

#[test]
fn every_row_count_from_1_to_17_and_larger_matches_the_reference() {
    let device = Device::emulated();
    for format in QuantFormat::ALL {
        for rows in (1..=17).chain([33, 70]) {
            let dtype = [DType::BF16, DType::F16, DType::F32][rows % 3];
            let case =
                QLinearCase { format, dtype, rows, n: 21, k: 256, pad: 8 * (rows % 2), accumulate: rows % 4 == 1 };
            let r = qlinear_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
}

#[test]
fn every_dtype_and_odd_widths_match_the_reference() {
    for device in common::devices() {
        for format in QuantFormat::ALL {
            for dtype in DType::FLOATS {
                // pad 5 leaves rows misaligned (the dequantize-and-GEMM fallback), pad 8 aligned.
                for (rows, n, k, pad) in [(1, 67, 768, 8), (4, 5, 512, 5), (2, 9, 256, 5), (19, 67, 256, 0)] {
                    let case = QLinearCase { format, dtype, rows, n, k, pad, accumulate: false };
                    let r = qlinear_case(&device, case).unwrap();
                    assert!(r.pass, "{case:?}: {}", r.describe());
                }
            }
        }
    }
}

#[test]
fn the_tensor_core_gemm_handles_partial_tiles_k_tails_strides_and_accumulation() {
    let device = Device::emulated();
    for format in QuantFormat::ALL {
        let k = if format.default_block() == 32 { 160 } else { 256 }; // 160: half a 64-deep step left over
        for (i, (rows, n)) in [(17, 128), (64, 133), (65, 8), (130, 300)].into_iter().enumerate() {
            let dtype = [DType::BF16, DType::F16][i % 2];
            let (pad, accumulate) = [(0, false), (8, true), (16, false), (8, false)][i];
            assert!(matches!(QPath::choose(format, dtype, rows, true, [n, k]), QPath::Gemm { .. }));
            let case = QLinearCase { format, dtype, rows, n, k, pad, accumulate };
            let r = qlinear_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
}

#[test]
fn split_k_gemm_matches_the_reference_with_empty_splits_tails_and_accumulation() {
    // Decode rows (5 to 16, and up to one 64-row block) on tensor cores, `in` split over grid.z so
    // that a narrow weight still fills the GPU: Llama 3 8B's k/v projection at 8 rows splits 16
    // ways; the f32 partials are added in order by the reduce kernel.
    assert_eq!(gemm_splits(8, 1024, 4096), 16);
    assert_eq!(gemm_splits(8, 4096, 4096), 16);
    assert_eq!(gemm_splits(8, 14336, 4096), 5);
    assert_eq!(gemm_splits(65, 1024, 4096), 1, "beyond one row block: no split");
    let device = Device::emulated();
    for format in QuantFormat::ALL {
        // 2080 = 32.5 steps of 64: 8 splits of 5 steps, the last one empty, a half step of tail.
        let k_tail = if format.default_block() == 32 { 2080 } else { 2048 };
        for (i, (rows, n, k)) in [(9, 9, 512), (12, 130, k_tail), (16, 7, 1024), (40, 3, 768)].into_iter().enumerate() {
            let dtype = [DType::BF16, DType::F16][i % 2];
            let path = QPath::choose(format, dtype, rows, true, [n, k]);
            assert!(matches!(path, QPath::Gemm { k_splits: 2.. }), "{path}");
            let case = QLinearCase { format, dtype, rows, n, k, pad: 8 * (i % 2), accumulate: i % 3 == 1 };
            let r = qlinear_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
    // A split product needs a scratch for its partials.
    let mut rng = Rng::new(3);
    let w = QWeight::new(&device, &random_packed(&mut rng, QuantFormat::Q4_0, 9, 512).unwrap()).unwrap();
    let (x, y) = (
        Tensor::zeros(&device, DType::BF16, &[12, 512]).unwrap(),
        Tensor::zeros(&device, DType::BF16, &[12, 9]).unwrap(),
    );
    assert!(matches!(qlinear(&x, &w, &y, None), Err(Error::InvalidArgument { name: "scratch", .. })));
    qlinear(&x, &w, &y, Some(&QScratch::new(&device, DType::BF16, &[&w]).unwrap())).unwrap();
}

#[test]
fn split_k_gemv_matches_the_reference_and_depends_on_the_shape_only() {
    // Llama 3 8B: the 4096-wide projections need no split, its 1024-wide k/v projections two
    // warps per feature; a narrow weight with a long row four; a short row none.
    assert_eq!(gemv_split(4096, 4096), 1);
    assert_eq!(gemv_split(1024, 4096), 2);
    assert_eq!(gemv_split(37, 8192), 4);
    assert_eq!(gemv_split(37, 256), 1);
    let device = Device::emulated();
    for format in QuantFormat::ALL {
        for (rows, n, k, dtype) in
            [(1, 5, 4096, DType::BF16), (3, 9, 2048, DType::F16), (16, 6, 8192, DType::F32), (4, 7, 4096, DType::BF16)]
        {
            if has_mma_gemv(format, dtype) {
                continue; // the tensor-core GEMV's own test below
            }
            assert!(matches!(QPath::choose(format, dtype, rows, true, [n, k]), QPath::Gemv { split: 2.. }));
            let case = QLinearCase { format, dtype, rows, n, k, pad: 8, accumulate: rows == 3 };
            let r = qlinear_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
}

#[test]
fn tensor_core_gemv_matches_the_exact_reference_with_splits_tails_strides_and_accumulation() {
    // Llama 3 8B's shapes: the 4096-wide projections split `in` twice, the 1024-wide k/v
    // projections four times, the 14336-wide gate/up not at all; narrow weights as deep as
    // they allow; a short row never.
    assert_eq!(mma_gemv_splits(4096, 4096), 2);
    assert_eq!(mma_gemv_splits(1024, 4096), 4);
    assert_eq!(mma_gemv_splits(14336, 4096), 1);
    assert_eq!(mma_gemv_splits(37, 8192), 8);
    assert_eq!(mma_gemv_splits(37, 512), 1);
    let device = Device::emulated();
    for format in QuantFormat::ALL.into_iter().filter(|&f| has_mma_gemv(f, DType::BF16)) {
        // 544 = 17 chunks: four groups of 4 and a tail of one (the 32-blocks formats).
        let k_tail = if format.default_block() == 32 { 544 } else { 768 };
        for (i, (rows, n, k)) in
            [(1, 37, 8192), (8, 16, k_tail), (3, 33, 4096), (5, 21, 512), (2, 130, k_tail), (7, 9, 2080)]
                .into_iter()
                .enumerate()
        {
            let dtype = [DType::BF16, DType::F16][i % 2];
            if k % format.default_block() != 0 {
                continue;
            }
            let path = QPath::choose(format, dtype, rows, true, [n, k]);
            assert!(matches!(path, QPath::MmaGemv { .. }), "{path}");
            let exact = if format == QuantFormat::NF4 { WeightValues::RoundedCodeBook } else { WeightValues::Exact };
            assert_eq!(path.weight_values(format), exact);
            let case = QLinearCase { format, dtype, rows, n, k, pad: 8 * (i % 2), accumulate: i % 3 == 1 };
            let r = qlinear_case(&device, case).unwrap();
            assert!(r.pass, "{case:?}: {}", r.describe());
        }
    }
    // A split product needs a scratch for its partials; 9 rows take the GEMM instead.
    let mut rng = Rng::new(5);
    let w = QWeight::new(&device, &random_packed(&mut rng, QuantFormat::Q4_K, 37, 8192).unwrap()).unwrap();
    let x = Tensor::zeros(&device, DType::BF16, &[2, 8192]).unwrap();
    let y = Tensor::zeros(&device, DType::BF16, &[2, 37]).unwrap();
    assert!(matches!(qlinear(&x, &w, &y, None), Err(Error::InvalidArgument { name: "scratch", .. })));
    qlinear(&x, &w, &y, Some(&QScratch::new(&device, DType::BF16, &[&w]).unwrap())).unwrap();
    assert!(matches!(QPath::choose(QuantFormat::Q4_K, DType::BF16, 9, true, [37, 8192]), QPath::Gemm { .. }));
}

#[test]
fn schedules_agree_bit_for_bit() {
    for format in [QuantFormat::Q4_1, QuantFormat::Q4_K, QuantFormat::Q6_K, QuantFormat::NF4] {
        // The GEMV (tensor-core for the first three, split or not), the tensor-core GEMM (bf16)
        // and the dequantize path (f32).
        for (rows, n, k, dtype) in
            [(3, 9, 512, DType::BF16), (2, 5, 4096, DType::BF16), (18, 9, 512, DType::BF16), (18, 9, 512, DType::F32)]
        {
            let case = QLinearCase { format, dtype, rows, n, k, pad: 8, accumulate: true };
            common::assert_schedules_agree(&format!("{case:?}"), |d| qlinear_case(d, case));
        }
    }
}

#[test]
fn packing_keeps_the_values_and_rows_permute_and_concatenate() {
    let mut rng = Rng::new(5);
    for format in QuantFormat::ALL {
        let a = random_packed(&mut rng, format, 6, 256).unwrap();
        let b = random_packed(&mut rng, format, 3, 256).unwrap();
        let (da, db) = (a.dequantize(), b.dequantize());
        let both = PackedWeight::concat_rows(&[&a, &b]).unwrap();
        assert_eq!(both.dequantize(), [da.clone(), db].concat(), "{format}: concat");
        let perm = [5, 0, 4, 1, 3, 2];
        let p = a.permute_rows(&perm).unwrap().dequantize();
        for (i, &src) in perm.iter().enumerate() {
            assert_eq!(p[i * 256..][..256], da[src * 256..][..256], "{format}: row {i}");
        }
        assert!(a.permute_rows(&[0, 0, 1, 2, 3, 4]).is_err(), "{format}: a repeated row is not a permutation");
    }
    // NF4 from bitsandbytes' own storage order (element 2j in the high nibble of byte j).
    let packed: Vec<u8> = (0..64u8).map(|i| (i % 16) << 4 | (15 - i % 16)).collect();
    let w = PackedWeight::from_nf4(2, 64, 64, &packed, &[2.0, 0.5], NF4_CODE).unwrap();
    let d = w.dequantize();
    assert_eq!(d[0], NF4_CODE[0] * 2.0);
    assert_eq!(d[1], NF4_CODE[15] * 2.0);
    assert_eq!(d[64 + 2], NF4_CODE[1] * 0.5);
    // Quantizing then dequantizing NF4 lands on the nearest code of each scaled value.
    let dense: Vec<f32> = (0..128).map(|i| (i as f32 - 60.0) / 17.0).collect();
    let q = PackedWeight::quantize_nf4(2, 64, 64, &dense).unwrap().dequantize();
    for (blk, (qs, xs)) in q.chunks(64).zip(dense.chunks(64)).enumerate() {
        let absmax = xs.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (&got, &x) in qs.iter().zip(xs) {
            let best = NF4_CODE
                .iter()
                .map(|c| c * absmax)
                .fold(f32::INFINITY, |b, c| if (c - x).abs() < (b - x).abs() { c } else { b });
            assert!((got - x).abs() <= (best - x).abs() + 1e-6, "block {blk}: {x} -> {got}, nearest {best}");
        }
    }
}

#[test]
fn bad_inputs_are_named_errors() {
    let d = Device::emulated();
    let mut rng = Rng::new(9);
    let w = QWeight::new(&d, &random_packed(&mut rng, QuantFormat::Q4_0, 8, 64).unwrap()).unwrap();
    let x = Tensor::zeros(&d, DType::BF16, &[2, 64]).unwrap();
    let y = Tensor::zeros(&d, DType::BF16, &[2, 8]).unwrap();
    qlinear(&x, &w, &y, None).unwrap();
    let bad_x = Tensor::zeros(&d, DType::BF16, &[2, 65]).unwrap();
    assert!(matches!(qlinear(&bad_x, &w, &y, None), Err(Error::ShapeMismatch { what: "x", .. })));
    let bad_y = Tensor::zeros(&d, DType::BF16, &[2, 9]).unwrap();
    assert!(matches!(qlinear(&x, &w, &bad_y, None), Err(Error::ShapeMismatch { what: "y", .. })));
    let y32 = Tensor::zeros(&d, DType::F32, &[2, 8]).unwrap();
    assert!(matches!(qlinear(&x, &w, &y32, None), Err(Error::DTypeMismatch { .. })));
    let ids = Tensor::zeros(&d, DType::I32, &[2, 64]).unwrap();
    assert!(matches!(qlinear(&ids, &w, &y, None), Err(Error::UnsupportedDType { .. })));
    // Misaligned rows (the GEMV reads 16-byte vectors) and more rows than the GEMV takes need a
    // scratch of the activation dtype.
    let wide = Tensor::zeros(&d, DType::BF16, &[2, 65]).unwrap();
    let misaligned = wide.narrow(1, 1, 64).unwrap();
    assert!(matches!(qlinear(&misaligned, &w, &y, None), Err(Error::InvalidArgument { name: "scratch", .. })));
    let s = QScratch::new(&d, DType::BF16, &[&w]).unwrap();
    qlinear(&misaligned, &w, &y, Some(&s)).unwrap();
    // 20 rows of bf16 take the tensor-core GEMM (no scratch); 20 rows of f32 the dequantize path.
    let (x20, y20) =
        (Tensor::zeros(&d, DType::BF16, &[20, 64]).unwrap(), Tensor::zeros(&d, DType::BF16, &[20, 8]).unwrap());
    qlinear(&x20, &w, &y20, None).unwrap();
    let f32_scratch = QScratch::new(&d, DType::F32, &[&w]).unwrap();
    assert!(matches!(qlinear(&misaligned, &w, &y, Some(&f32_scratch)), Err(Error::DTypeMismatch { .. })));
    let (x20f, y20f) =
        (Tensor::zeros(&d, DType::F32, &[20, 64]).unwrap(), Tensor::zeros(&d, DType::F32, &[20, 8]).unwrap());
    assert!(matches!(qlinear(&x20f, &w, &y20f, None), Err(Error::InvalidArgument { name: "scratch", .. })));
    qlinear(&x20f, &w, &y20f, Some(&f32_scratch)).unwrap();
    // y overlapping x.
    let buf = Tensor::zeros(&d, DType::BF16, &[2, 72]).unwrap();
    let (xv, yv) = (buf.narrow(1, 0, 64).unwrap(), buf.narrow(1, 60, 8).unwrap());
    assert!(qlinear_add(&xv, &w, &yv, None).is_err());
    // Layouts: a block the format does not have, columns not a whole number of blocks.
    assert!(QuantLayout::new(QuantFormat::Q4_K, 32, 4, 256).is_err());
    assert!(QuantLayout::new(QuantFormat::Q8_0, 32, 4, 48).is_err());
    assert!(QuantLayout::new(QuantFormat::NF4, 48, 4, 96).is_err());
    assert!(PackedWeight::from_gguf_blocks(QuantFormat::Q4_1, 2, 64, &[0u8; 79]).is_err());
    assert!(PackedWeight::from_nf4(2, 64, 64, &[0u8; 63], &[1.0, 1.0], NF4_CODE).is_err());
}
