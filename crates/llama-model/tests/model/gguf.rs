//! The GGUF reader: metadata of every value type and tensors of every decoded type round-trip
//! through files written here (values chosen exactly representable, so decoding must be exact),
//! and hostile files (every truncation of a valid one, huge counts and lengths, bad ranks,
//! offsets past the end or misaligned, unknown types) are named errors, never panics or huge
//! allocations.

use std::path::PathBuf;

use half::{bf16, f16};
use llama_model::Error;
use llama_model::formats::gguf::{GgmlType, GgufFile, GgufValue};

/// A GGUF v3 writer for tests: metadata as (key, type id, encoded value), tensors as
/// (name, GGUF-order dims, type id, data bytes).
#[derive(Default)]
pub(crate) struct Writer {
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

pub(crate) fn gguf_str(s: &str) -> Vec<u8> {
    let mut v = (s.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(s.as_bytes());
    v
}

impl Writer {
    pub(crate) fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.kv.push((key.into(), ty, value));
        self
    }
    pub(crate) fn tensor(mut self, name: &str, dims: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), dims.to_vec(), ty, data));
        self
    }
    pub(crate) fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            out.extend(gguf_str(k));
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(v);
        }
        let mut data = Vec::new();
        for (name, dims, ty, bytes) in &self.tensors {
            // Aligned starts; no padding after the last tensor (so every cut of the data shows).
            while data.len() % 32 != 0 {
                data.push(0);
            }
            out.extend(gguf_str(name));
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend_from_slice(&d.to_le_bytes());
            }
            out.extend_from_slice(&ty.to_le_bytes());
            out.extend_from_slice(&(data.len() as u64).to_le_bytes());
            data.extend_from_slice(bytes);
        }
        while out.len() % 32 != 0 {
            out.push(0);
        }
        out.extend(data);
        out
    }
}

pub(crate) fn write(name: &str, bytes: &[u8]) -> PathBuf {
    let path = std::env::temp_dir().join(format!("llk-gguf-{name}-{}.gguf", std::process::id()));
    std::fs::write(&path, bytes).unwrap();
    path
}

fn f16_bytes(x: f32) -> [u8; 2] {
    f16::from_f32(x).to_le_bytes()
}

/// Q4_1 blocks of 32 from (d, m, nibbles); the decoded values are q * d + m.
fn q4_1(blocks: &[(f32, f32, [u8; 32])]) -> (Vec<u8>, Vec<f32>) {
    let (mut bytes, mut values) = (Vec::new(), Vec::new());
    for (d, m, q) in blocks {
        bytes.extend(f16_bytes(*d));
        bytes.extend(f16_bytes(*m));
        bytes.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
        values.extend(q.iter().map(|&q| f32::from(q) * d + m));
    }
    (bytes, values)
}

fn sample() -> (Writer, Vec<(&'static str, Vec<f32>)>) {
    let f32s: Vec<f32> = (0..12).map(|i| i as f32 * 0.25 - 1.0).collect();
    let halves: Vec<f32> = (0..64).map(|i| (i as f32 - 32.0) / 8.0).collect();
    let q8: Vec<(f32, [i8; 32])> = vec![(0.5, std::array::from_fn(|i| i as i8 - 16)), (-0.125, [127; 32])];
    let mut q8_bytes = Vec::new();
    let mut q8_vals = Vec::new();
    for (d, q) in &q8 {
        q8_bytes.extend(f16_bytes(*d));
        q8_bytes.extend(q.iter().map(|&v| v as u8));
        q8_vals.extend(q.iter().map(|&v| f32::from(v) * d));
    }
    let q4_0: [u8; 32] = std::array::from_fn(|i| (i * 7 % 16) as u8);
    let mut q4_0_bytes = f16_bytes(0.25).to_vec();
    q4_0_bytes.extend((0..16).map(|j| q4_0[j] | (q4_0[j + 16] << 4)));
    let q4_0_vals: Vec<f32> = q4_0.iter().map(|&q| (f32::from(q) - 8.0) * 0.25).collect();
    let (q4_1_bytes, q4_1_vals) = q4_1(&[
        (0.5, -1.0, std::array::from_fn(|i| (i % 16) as u8)),
        (2.0, 0.75, std::array::from_fn(|i| (15 - i % 16) as u8)),
    ]);
    let w = Writer::default()
        .kv("general.architecture", 8, gguf_str("llama"))
        .kv("u8", 0, vec![200])
        .kv("i8", 1, vec![0xfe])
        .kv("u16", 2, 60000u16.to_le_bytes().to_vec())
        .kv("i16", 3, (-3i16).to_le_bytes().to_vec())
        .kv("u32", 4, 7u32.to_le_bytes().to_vec())
        .kv("i32", 5, (-9i32).to_le_bytes().to_vec())
        .kv("f32", 6, 1.5f32.to_le_bytes().to_vec())
        .kv("bool", 7, vec![1])
        .kv("u64", 10, u64::MAX.to_le_bytes().to_vec())
        .kv("i64", 11, i64::MIN.to_le_bytes().to_vec())
        .kv("f64", 12, 0.1f64.to_le_bytes().to_vec())
        .kv("tokens", 9, {
            let mut v = 8u32.to_le_bytes().to_vec();
            v.extend(2u64.to_le_bytes());
            v.extend(gguf_str("<s>"));
            v.extend(gguf_str("é"));
            v
        })
        .tensor("f32", &[4, 3], 0, f32s.iter().flat_map(|x| x.to_le_bytes()).collect())
        .tensor("f16", &[32, 2], 1, halves.iter().flat_map(|&x| f16_bytes(x)).collect())
        .tensor("bf16", &[32, 2], 30, halves.iter().flat_map(|&x| bf16::from_f32(x).to_le_bytes()).collect())
        .tensor("q8_0", &[64, 1], 8, q8_bytes)
        .tensor("q4_0", &[32], 2, q4_0_bytes)
        .tensor("q4_1", &[32, 2], 3, q4_1_bytes)
        .tensor("iq2_xxs", &[256, 1], 16, vec![0; 66]);
    let expected = vec![
        ("f32", f32s),
        ("f16", halves.clone()),
        ("bf16", halves),
        ("q8_0", q8_vals),
        ("q4_0", q4_0_vals),
        ("q4_1", q4_1_vals),
    ];
    (w, expected)
}

#[test]
fn metadata_and_tensors_round_trip_exactly() {
    let (w, expected) = sample();
    let path = write("round-trip", &w.bytes());
    let g = GgufFile::open(&path).unwrap();
    let m = g.metadata();
    assert_eq!(g.version(), 3);
    assert_eq!(m["general.architecture"].as_str(), Some("llama"));
    assert_eq!(m["u8"], GgufValue::U64(200));
    assert_eq!(m["i8"], GgufValue::I64(-2));
    assert_eq!(m["u16"].as_u64(), Some(60000));
    assert_eq!(m["i16"], GgufValue::I64(-3));
    assert_eq!(m["u32"].as_u64(), Some(7));
    assert_eq!(m["i32"], GgufValue::I64(-9));
    assert_eq!(m["f32"].as_f64(), Some(1.5));
    assert_eq!(m["bool"], GgufValue::Bool(true));
    assert_eq!(m["u64"].as_u64(), Some(u64::MAX));
    assert_eq!(m["i64"], GgufValue::I64(i64::MIN));
    assert_eq!(m["f64"].as_f64(), Some(0.1));
    assert_eq!(m["tokens"], GgufValue::Array(vec![GgufValue::Str("<s>".into()), GgufValue::Str("é".into())]));
    // Shapes come back slowest-varying first (PyTorch order).
    assert_eq!(g.tensor("f32").unwrap().shape, vec![3, 4]);
    assert_eq!(g.tensor("q4_1").unwrap().dtype, GgmlType::Q4_1);
    for (name, want) in expected {
        let got = g.dequantize(name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let same = got.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name}: {got:?} != {want:?}");
    }
    // A known type this reader does not decode is a named error.
    match g.dequantize("iq2_xxs") {
        Err(Error::Checkpoint { tensor, why }) => {
            assert!(tensor == "iq2_xxs" && why.contains("IQ2_XXS is not decoded"), "{why}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(g.dequantize("absent"), Err(Error::Checkpoint { .. })));
    let _ = std::fs::remove_file(path);
}

#[test]
fn every_truncation_of_a_valid_file_is_a_named_error() {
    let (w, _) = sample();
    let bytes = w.bytes();
    let path = std::env::temp_dir().join(format!("llk-gguf-trunc-{}.gguf", std::process::id()));
    // The header and directory end before the data section; cutting the data is caught by the
    // tensors' ranges.
    for len in (0..bytes.len()).step_by(7) {
        std::fs::write(&path, &bytes[..len]).unwrap();
        match GgufFile::open(&path) {
            Err(Error::Io { .. } | Error::Checkpoint { .. }) => {}
            other => panic!("{len} of {} bytes: {other:?}", bytes.len()),
        }
    }
    let _ = std::fs::remove_file(path);
}

fn header(tensors: u64, kv: u64) -> Vec<u8> {
    let mut v = b"GGUF".to_vec();
    v.extend(3u32.to_le_bytes());
    v.extend(tensors.to_le_bytes());
    v.extend(kv.to_le_bytes());
    v
}

fn refused(name: &str, bytes: Vec<u8>, needle: &str) {
    let path = write(name, &bytes);
    match GgufFile::open(&path) {
        Err(Error::Io { why, .. } | Error::Checkpoint { why, .. }) => assert!(why.contains(needle), "{name}: {why}"),
        other => panic!("{name}: {other:?}"),
    }
    let _ = std::fs::remove_file(path);
}

#[test]
fn hostile_headers_are_refused_before_allocating() {
    refused("magic", b"GGML\x03\0\0\0".to_vec(), "magic");
    let mut v1 = b"GGUF".to_vec();
    v1.extend(1u32.to_le_bytes());
    refused("version", v1, "version 1");
    refused("tensor-count", header(u64::MAX, 0), "tensor count");
    refused("kv-count", header(0, 1 << 60), "metadata count");
    let mut long_key = header(0, 1);
    long_key.extend(u64::MAX.to_le_bytes());
    long_key.extend([0u8; 16]);
    refused("key-length", long_key, "string byte count");
    let mut big_array = header(0, 1);
    big_array.extend(gguf_str("a"));
    big_array.extend(9u32.to_le_bytes());
    big_array.extend(4u32.to_le_bytes());
    big_array.extend((1u64 << 40).to_le_bytes());
    refused("array-length", big_array, "array element count");
    let mut bad_type = header(0, 1);
    bad_type.extend(gguf_str("a"));
    bad_type.extend(99u32.to_le_bytes());
    bad_type.extend([0u8; 16]);
    refused("value-type", bad_type, "unknown metadata value type 99");
    let dup = Writer::default().kv("k", 4, 1u32.to_le_bytes().to_vec()).kv("k", 4, 2u32.to_le_bytes().to_vec());
    refused("duplicate", dup.bytes(), "appears twice");
    let rank5 = Writer::default().tensor("t", &[1, 1, 1, 1, 1], 0, vec![0; 4]);
    refused("rank", rank5.bytes(), "rank 5");
    let align =
        Writer::default().kv("general.alignment", 4, 3u32.to_le_bytes().to_vec()).tensor("t", &[1], 0, vec![0; 4]);
    refused("alignment", align.bytes(), "power of two");
    // A tensor whose data would run past the end, and one whose dimensions overflow.
    let past = Writer::default().tensor("t", &[1 << 20], 0, vec![0; 4]);
    refused("past-end", past.bytes(), "past the end");
    let overflow = Writer::default().tensor("t", &[u64::MAX / 2, 4], 0, vec![0; 4]);
    refused("overflow", overflow.bytes(), "overflows");
    let blocks = Writer::default().tensor("t", &[31], 8, vec![0; 34]);
    refused("blocks", blocks.bytes(), "whole blocks");
    // Not a regular file.
    let dir = std::env::temp_dir().join(format!("llk-gguf-dir-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    assert!(matches!(GgufFile::open(&dir), Err(Error::Io { why, .. }) if why.contains("not a regular file")));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn misaligned_offsets_are_refused() {
    // One tensor at offset 4 (the writer aligns to 32): patch the directory entry's offset.
    let w = Writer::default().tensor("t", &[8], 0, vec![0; 64]);
    let mut bytes = w.bytes();
    let at = 4 + 4 + 8 + 8 + (8 + 1) + 4 + 8 + 4; // header, name, rank, one dim, type
    bytes[at..at + 8].copy_from_slice(&4u64.to_le_bytes());
    refused("misaligned", bytes, "not a multiple of the alignment");
}

#[test]
fn a_real_model_decodes_like_llama_cpps_reader() {
    // Needs a GGUF file and its decoding by the `gguf` package (scripts/gguf_reference.py).
    let (Ok(model), Ok(reference)) = (std::env::var("LLK_TEST_GGUF"), std::env::var("LLK_TEST_GGUF_REF")) else {
        eprintln!("note: LLK_TEST_GGUF / LLK_TEST_GGUF_REF not set; the real-model comparison did not run");
        return;
    };
    let g = GgufFile::open(&model).unwrap();
    let mut compared = 0;
    for entry in std::fs::read_dir(&reference).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".f32")) else {
            continue;
        };
        let want: Vec<f32> = std::fs::read(&path)
            .unwrap()
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        let got = g.dequantize(name).unwrap();
        assert_eq!(got.len(), want.len(), "{name}");
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!(differ, 0, "{name}: {differ} of {} values differ from the gguf package", want.len());
        println!(
            "{name}: {:?} {:?}, {} values, bit-identical",
            g.tensor(name).unwrap().dtype,
            g.tensor(name).unwrap().shape,
            got.len()
        );
        compared += 1;
    }
    assert!(compared > 0, "no .f32 files in {reference}");
}

#[test]
fn quantized_types_decode_like_the_gguf_package() {
    // Random blocks of every decoded quantized type and their decoding by llama.cpp's Python
    // reader (scripts/make_quant_fixtures.py), as tensors of 4 x 256 values, bit for bit.
    let fixture: serde_json::Value =
        serde_json::from_str(include_str!("../fixtures/gguf/quants.json")).expect("the fixture is JSON");
    let hex = |s: &str| -> Vec<u8> {
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
    };
    let mut w = Writer::default();
    let mut expected = Vec::new();
    let types = [
        ("Q4_K", 12),
        ("Q5_K", 13),
        ("Q6_K", 14),
        ("Q5_0", 6),
        ("Q5_1", 7),
        ("Q2_K", 10),
        ("Q3_K", 11),
        ("IQ4_NL", 20),
        ("IQ4_XS", 23),
    ];
    for (name, id) in types {
        let blocks = hex(fixture[name]["blocks"].as_str().unwrap());
        let values: Vec<f32> = hex(fixture[name]["values"].as_str().unwrap())
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        w = w.tensor(name, &[256, 4], id, blocks);
        expected.push((name, values));
    }
    let path = write("quants", &w.bytes());
    let g = GgufFile::open(&path).unwrap();
    let mut packed_types = 0;
    for (name, want) in expected {
        assert_eq!(g.tensor(name).unwrap().shape, vec![4, 256]);
        assert_eq!(g.tensor(name).unwrap().dtype.name(), name);
        let got = g.dequantize(name).unwrap();
        let differ = got.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
        assert_eq!((got.len(), differ), (1024, 0), "{name}: {differ} values differ from the gguf package");
        // The types kept packed: repacked into the kernels' layout, the specification the
        // kernels are checked against dequantizes to the same values.
        if g.tensor(name).unwrap().dtype.quant_format().is_some() {
            let packed = g.packed(name).unwrap().dequantize();
            let differ = packed.iter().zip(&want).filter(|(a, b)| a.to_bits() != b.to_bits()).count();
            assert_eq!((packed.len(), differ), (1024, 0), "{name} packed: {differ} values differ");
            packed_types += 1;
        }
    }
    assert_eq!(packed_types, 5, "Q4_K, Q5_K, Q6_K, Q5_0 and Q5_1 are kept packed");
    let _ = std::fs::remove_file(path);
}

#[test]
fn duplicate_tensor_names_are_refused() {
    let dup = Writer::default().tensor("t", &[8], 0, vec![0; 32]).tensor("t", &[8], 0, vec![0; 32]);
    refused("duplicate-tensor", dup.bytes(), "`t` appears twice");
}

#[test]
fn metadata_values_are_bounded_in_total() {
    use llama_model::formats::gguf::{MAX_ARRAY, MAX_METADATA_VALUES};
    // Byte arrays of the largest accepted length until the total passes the cap: each value
    // would cost 32 bytes parsed, 1 GiB for a 32 MiB file.
    let arrays = MAX_METADATA_VALUES / MAX_ARRAY + 1;
    let mut w = Writer::default();
    for i in 0..arrays {
        let mut v = 0u32.to_le_bytes().to_vec();
        v.extend(MAX_ARRAY.to_le_bytes());
        v.resize(v.len() + MAX_ARRAY as usize, 7);
        w = w.kv(&format!("a{i}"), 9, v);
    }
    refused("metadata-total", w.bytes(), "metadata values");
}

#[test]
fn a_file_truncated_while_open_is_a_named_error() {
    let (w, _) = sample();
    let bytes = w.bytes();
    let path = write("truncated", &bytes);
    let file = GgufFile::open(&path).unwrap();
    assert!(file.dequantize("q4_1").is_ok());
    // Another process truncates the file: a mapped read would raise SIGBUS here.
    std::fs::OpenOptions::new().write(true).open(&path).unwrap().set_len(bytes.len() as u64 - 100).unwrap();
    match file.dequantize("q4_1") {
        Err(Error::Checkpoint { tensor, why }) => assert!(tensor == "q4_1" && why.contains("truncated"), "{why}"),
        other => panic!("{other:?}"),
    }
    let _ = std::fs::remove_file(path);
}

/// A llama GGUF with the required hyper-parameters and `extra` metadata (no tensors: the
/// hyper-parameters are read first).
fn llama_meta(extra: &[(&str, u32, Vec<u8>)]) -> Vec<u8> {
    let mut w = Writer::default()
        .kv("general.architecture", 8, gguf_str("llama"))
        .kv("llama.embedding_length", 4, 256u32.to_le_bytes().to_vec())
        .kv("llama.block_count", 4, 1u32.to_le_bytes().to_vec())
        .kv("llama.feed_forward_length", 4, 128u32.to_le_bytes().to_vec());
    let has_heads = extra.iter().any(|(k, ..)| *k == "llama.attention.head_count");
    if !has_heads {
        w = w.kv("llama.attention.head_count", 4, 4u32.to_le_bytes().to_vec());
    }
    for (k, ty, v) in extra {
        w = w.kv(k, *ty, v.clone());
    }
    w.bytes()
}

#[test]
fn present_but_invalid_hyper_parameters_are_named_errors() {
    use llama_kernels::DType;
    use llama_model::model::HostModel;
    let f32v = |x: f32| x.to_le_bytes().to_vec();
    let cases: Vec<(&str, u32, Vec<u8>, &str)> = vec![
        ("llama.rope.freq_base", 6, f32v(f32::NAN), "positive finite"),
        ("llama.rope.freq_base", 6, f32v(f32::INFINITY), "positive finite"),
        ("llama.rope.freq_base", 6, f32v(-1.0), "positive finite"),
        ("llama.rope.freq_base", 8, gguf_str("500000"), "a string"),
        ("llama.attention.layer_norm_rms_epsilon", 6, f32v(f32::NAN), "positive finite"),
        ("llama.attention.layer_norm_rms_epsilon", 6, f32v(f32::NEG_INFINITY), "positive finite"),
        ("llama.attention.head_count", 6, f32v(4.0), "integer"),
        ("llama.attention.head_count_kv", 8, gguf_str("2"), "integer"),
        ("llama.attention.key_length", 6, f32v(16.0), "integer"),
        ("llama.rope.scaling.type", 4, 1u32.to_le_bytes().to_vec(), "a string"),
    ];
    for (key, ty, value, needle) in cases {
        let path = write("hparams", &llama_meta(&[(key, ty, value)]));
        match HostModel::from_gguf(&path, DType::F32) {
            Err(Error::Config { field, why }) => {
                assert_eq!(field, key);
                assert!(why.contains(needle), "{key}: {why}");
            }
            other => panic!("{key}: {:?}", other.err()),
        }
        let _ = std::fs::remove_file(path);
    }
    // Absent keys take their documented defaults: the load goes on to the (missing) tensors.
    let path = write("hparams-defaults", &llama_meta(&[]));
    match HostModel::from_gguf(&path, DType::F32) {
        Err(Error::Checkpoint { tensor, .. }) => assert!(tensor.starts_with("blk.0."), "{tensor}"),
        other => panic!("{:?}", other.err()),
    }
    let _ = std::fs::remove_file(path);
}
