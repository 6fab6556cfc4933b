//! bitsandbytes NF4 (`spec::quant_nf4`, `block::bnb`): weights quantized, serialized and
//! dequantized by bitsandbytes 0.49.2 itself (tests/fixtures/nf4/bnb_nf4.json, made by
//! scripts/make_nf4_fixtures.py) dequantize to bitsandbytes' f32 bits exactly, in the
//! specification and on the device, from the plain and the double-quantized statistics; a
//! checkpoint holding the tensors under bitsandbytes' own names loads through
//! `Checkpoint::packed`; and each malformed input is a named error.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use llama_kernels::ops::qlinear::{QWeight, dequantize};
use llama_kernels::spec::quant::{NF4_CODE, PackedWeight};
use llama_kernels::spec::quant_nf4::{BNB_NESTED_BLOCK, resolve_nested_absmax};
use llama_kernels::{DType, Device, Error as KernelError};
use llama_model::Checkpoint;
use llama_model::Error;
use llama_model::dev::verify::block::LLAMA3_SMALL;
use llama_model::formats::bnb::{NestedState, QuantState, load_nf4};
use safetensors::tensor::{Dtype, TensorView, serialize};
use serde_json::Value;

const FIXTURE: &str = include_str!("../fixtures/nf4/bnb_nf4.json");
const W: &str = "model.layers.0.self_attn.q_proj.weight";

/// One stored tensor: safetensors dtype, shape, bytes.
#[derive(Clone)]
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

struct Case {
    name: String,
    rows: usize,
    cols: usize,
    block: usize,
    /// The state dict of bitsandbytes' `Linear4bit`, keys relative to the layer (`weight`, ...).
    tensors: BTreeMap<String, Raw>,
    state: Value,
    dequantized: Vec<u32>,
    resolved_absmax: Option<Vec<u32>>,
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

fn cases() -> Vec<Case> {
    let doc: Value = serde_json::from_str(FIXTURE).unwrap();
    assert_eq!(doc["versions"]["bitsandbytes"], "0.49.2");
    let n = |c: &Value, k: &str| c[k].as_u64().unwrap() as usize;
    doc["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            rows: n(c, "rows"),
            cols: n(c, "cols"),
            block: n(c, "blocksize"),
            tensors: c["tensors"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, t)| {
                    let dtype = match t["dtype"].as_str().unwrap() {
                        "U8" => Dtype::U8,
                        "F32" => Dtype::F32,
                        other => panic!("fixture dtype {other}"),
                    };
                    let shape = t["shape"].as_array().unwrap().iter().map(|d| d.as_u64().unwrap() as usize).collect();
                    (k.clone(), Raw { dtype, shape, bytes: unhex(t["hex"].as_str().unwrap()) })
                })
                .collect(),
            state: c["quant_state"].clone(),
            dequantized: bits(&f32s(&unhex(c["dequantized"].as_str().unwrap()))),
            resolved_absmax: c.get("resolved_absmax").map(|h| bits(&f32s(&unhex(h.as_str().unwrap())))),
        })
        .collect()
}

/// The case's weight in the kernels' layout, built from the stored pieces with the spec alone.
fn packed_from_pieces(c: &Case) -> PackedWeight {
    let t = |k: &str| &c.tensors[k].bytes;
    let absmax = match &c.resolved_absmax {
        None => f32s(t("weight.absmax")),
        Some(want) => {
            let map: [f32; 256] = f32s(t("weight.nested_quant_map")).try_into().unwrap();
            let nested_block = c.state["nested_blocksize"].as_u64().unwrap() as usize;
            assert_eq!(nested_block, BNB_NESTED_BLOCK);
            let offset = c.state["nested_offset"].as_f64().unwrap() as f32;
            let got =
                resolve_nested_absmax(t("weight.absmax"), &f32s(t("weight.nested_absmax")), &map, nested_block, offset)
                    .unwrap();
            assert_eq!(&bits(&got), want, "{}: resolved absmax", c.name);
            got
        }
    };
    let code: [f32; 16] = f32s(t("weight.quant_map")).try_into().unwrap();
    assert_eq!(bits(&code), bits(&NF4_CODE), "{}: bitsandbytes' quant_map is NF4_CODE", c.name);
    PackedWeight::from_nf4(c.rows, c.cols, c.block, t("weight"), &absmax, code).unwrap()
}

#[test]
fn the_specification_dequantizes_bitsandbytes_weights_bit_for_bit() {
    let cases = cases();
    assert_eq!(cases.len(), 5);
    for c in &cases {
        let w = packed_from_pieces(c);
        assert_eq!(bits(&w.dequantize()), c.dequantized, "{}", c.name);
    }
    // The last case's 272 absmax codes span two nested blocks (256 and a partial 16).
    let last = &cases[4];
    assert_eq!(last.tensors["weight.nested_absmax"].shape, [2]);
    assert_eq!(last.tensors["weight.absmax"].shape, [272]);
}

#[test]
fn the_device_dequantizes_bitsandbytes_weights_bit_for_bit() {
    let device = Device::emulated();
    for c in cases() {
        let w = QWeight::new(&device, &packed_from_pieces(&c)).unwrap();
        let d = dequantize(&w, DType::F32).unwrap().to_vec::<f32>().unwrap();
        assert_eq!(bits(&d), c.dequantized, "{}", c.name);
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("llk-nf4-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Writes a checkpoint directory: config.json and one safetensors file of `tensors` (full names).
fn write_checkpoint(dir: &Path, tensors: &BTreeMap<String, Raw>) {
    std::fs::write(dir.join("config.json"), LLAMA3_SMALL).unwrap();
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, t)| (n.clone(), TensorView::new(t.dtype, t.shape.clone(), &t.bytes).unwrap()))
        .collect();
    std::fs::write(dir.join("model.safetensors"), serialize(views, None).unwrap()).unwrap();
}

/// The case's tensors under `W` (bitsandbytes' names: `W`, `W.absmax`, ...), plus a dense one.
fn named(c: &Case) -> BTreeMap<String, Raw> {
    let mut m: BTreeMap<String, Raw> =
        c.tensors.iter().map(|(k, t)| (format!("{}{}", W.trim_end_matches("weight"), k), t.clone())).collect();
    let ones = 1f32.to_le_bytes().repeat(256);
    m.insert("model.layers.0.input_layernorm.weight".into(), Raw { dtype: Dtype::F32, shape: vec![256], bytes: ones });
    m
}

#[test]
fn a_checkpoint_with_bitsandbytes_names_loads_packed() {
    let dir = temp_dir("load");
    for c in cases() {
        // The names are bitsandbytes' own (from Linear4bit.state_dict() in the fixture).
        let mut keys: Vec<&str> = c.tensors.keys().map(|k| k.as_str()).collect();
        keys.sort();
        let nested = c.resolved_absmax.is_some();
        let mut want = vec!["weight", "weight.absmax", "weight.quant_map", "weight.quant_state.bitsandbytes__nf4"];
        if nested {
            want.extend(["weight.nested_absmax", "weight.nested_quant_map"]);
        }
        want.sort();
        assert_eq!(keys, want, "{}", c.name);

        write_checkpoint(&dir, &named(&c));
        let ckpt = Checkpoint::open(&dir).unwrap();
        let w = ckpt.packed(W).unwrap().expect("an NF4 weight");
        assert_eq!(w, packed_from_pieces(&c), "{}", c.name);
        assert_eq!(bits(&w.dequantize()), c.dequantized, "{}", c.name);
        let full = load_nf4(&ckpt, W).unwrap().unwrap();
        let offset = c.state.get("nested_offset").map(|o| o.as_f64().unwrap() as f32);
        assert_eq!(
            full.state,
            QuantState {
                blocksize: c.block,
                dtype: DType::F32,
                rows: c.rows,
                cols: c.cols,
                nested: offset.map(|offset| NestedState { blocksize: 256, offset }),
            },
            "{}",
            c.name
        );
        // A dense tensor and an absent one are not packed weights.
        assert_eq!(ckpt.packed("model.layers.0.input_layernorm.weight").unwrap(), None);
        assert_eq!(ckpt.packed("model.layers.0.mlp.up_proj.weight").unwrap(), None);
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn malformed_bitsandbytes_weights_are_named_errors() {
    let dir = temp_dir("bad");
    let cases = cases();
    let base = named(&cases[1]); // [8, 256], blocks of 64, double-quantized
    let plain = named(&cases[0]);
    let state_key = format!("{W}.quant_state.bitsandbytes__nf4");
    let state: Value = cases[1].state.clone();
    let load = |tensors: &BTreeMap<String, Raw>| {
        write_checkpoint(&dir, tensors);
        Checkpoint::open(&dir).unwrap().packed(W)
    };
    let with = |edit: &dyn Fn(&mut BTreeMap<String, Raw>)| {
        let mut t = base.clone();
        edit(&mut t);
        load(&t)
    };
    let with_json_bytes = |bytes: Vec<u8>| {
        with(&|t| {
            t.insert(state_key.clone(), Raw { dtype: Dtype::U8, shape: vec![bytes.len()], bytes: bytes.clone() });
        })
    };
    let with_state = |edit: &dyn Fn(&mut serde_json::Map<String, Value>)| {
        let mut s = state.as_object().unwrap().clone();
        edit(&mut s);
        with_json_bytes(serde_json::to_vec(&s).unwrap())
    };
    // `tensor` is named and `why` says `needle`.
    let named_err = |r: llama_model::Result<Option<PackedWeight>>, tensor: &str, needle: &str| match r {
        Err(Error::Checkpoint { tensor: t, why }) if t == tensor && why.contains(needle) => {}
        other => panic!("expected a checkpoint error on {tensor} saying `{needle}`, got {other:?}"),
    };
    let absmax = format!("{W}.absmax");

    assert!(load(&base).unwrap().is_some(), "the unedited weight loads");
    named_err(with_state(&|s| drop(s.insert("quant_type".into(), "int4".into()))), &state_key, "quant_type");
    assert!(matches!(
        with_state(&|s| drop(s.insert("quant_type".into(), "fp4".into()))),
        Err(Error::Unsupported { .. })
    ));
    let fp4 = with(&|t| {
        let s = t.remove(&state_key).unwrap();
        t.insert(format!("{W}.quant_state.bitsandbytes__fp4"), s);
    });
    assert!(matches!(fp4, Err(Error::Unsupported { .. })), "{fp4:?}");
    named_err(with_json_bytes(vec![b'{', 0xff, 0xfe, b'}']), &state_key, "not UTF-8");
    named_err(with_json_bytes(b"{\"quant_type\": nf4".to_vec()), &state_key, "not JSON");
    named_err(with_json_bytes(b"[1, 2]".to_vec()), &state_key, "not a JSON object");
    named_err(with_json_bytes(vec![b' '; 70_000]), &state_key, "at most");
    named_err(with_state(&|s| drop(s.insert("packing_format_for_cpu".into(), true.into()))), &state_key, "unknown");
    named_err(with_state(&|s| drop(s.remove("blocksize"))), &state_key, "no `blocksize`");
    named_err(with_state(&|s| drop(s.insert("blocksize".into(), (1u64 << 40).into()))), &state_key, "blocksize");
    named_err(with_state(&|s| drop(s.insert("blocksize".into(), 48.into()))), &state_key, "blocksize 48");
    named_err(with_state(&|s| drop(s.insert("blocksize".into(), (-64).into()))), &state_key, "not a non-negative");
    named_err(with_state(&|s| drop(s.insert("dtype".into(), "int8".into()))), &state_key, "dtype");
    named_err(with_state(&|s| drop(s.insert("shape".into(), serde_json::json!([2048])))), &state_key, "shape");
    // bitsandbytes could write this one ([64, 32] in blocks of 64): its blocks span two rows.
    named_err(with_state(&|s| drop(s.insert("shape".into(), serde_json::json!([64, 32])))), &state_key, "across rows");
    // The shape disagrees with the stored codes (twice as many elements).
    named_err(with_state(&|s| drop(s.insert("shape".into(), serde_json::json!([8, 512])))), W, "expected U8");
    named_err(with_state(&|s| drop(s.remove("nested_offset"))), &state_key, "must come together");
    named_err(with_state(&|s| drop(s.insert("nested_dtype".into(), "float16".into()))), &state_key, "nested_dtype");
    named_err(with_state(&|s| drop(s.insert("nested_blocksize".into(), 0.into()))), &state_key, "nested_blocksize");
    named_err(with_state(&|s| drop(s.insert("nested_offset".into(), 1e39.into()))), &state_key, "not a finite");
    // Companion tensors: missing, wrong counts, wrong dtypes, a map that is not NF4's.
    named_err(with(&|t| drop(t.remove(&absmax))), &absmax, "missing");
    named_err(with(&|t| drop(t.remove(&format!("{W}.quant_map")))), &format!("{W}.quant_map"), "missing");
    let nested_map = format!("{W}.nested_quant_map");
    named_err(with(&|t| drop(t.remove(&nested_map))), &nested_map, "missing");
    named_err(
        with(&|t| {
            let a = t.get_mut(&absmax).unwrap();
            a.bytes.pop();
            a.shape = vec![a.bytes.len()];
        }),
        &absmax,
        "expected U8 [32]",
    );
    let nested_absmax = format!("{W}.nested_absmax");
    named_err(
        with(&|t| {
            let a = t.get_mut(&nested_absmax).unwrap();
            a.bytes.extend_from_slice(&1f32.to_le_bytes());
            a.shape = vec![2];
        }),
        &nested_absmax,
        "expected F32 [1]",
    );
    named_err(
        with(&|t| {
            let a = t.get_mut(&format!("{W}.quant_map")).unwrap();
            a.bytes[4..8].copy_from_slice(&(-0.7f32).to_le_bytes());
        }),
        &format!("{W}.quant_map"),
        "code 1",
    );
    named_err(
        with(&|t| {
            let a = t.get_mut(&nested_absmax).unwrap();
            a.bytes.copy_from_slice(&f32::INFINITY.to_le_bytes());
        }),
        &absmax,
        "not finite",
    );
    // Transposed storage ([1, n / 2]: bitsandbytes would transpose its output).
    named_err(with(&|t| t.get_mut(W).unwrap().shape = vec![1, 1024]), W, "expected U8");
    // An absmax without its quant state; nested tensors without nested fields.
    named_err(with(&|t| drop(t.remove(&state_key))), &state_key, "missing");
    named_err(
        with(&|t| {
            let mut p = plain.clone();
            p.insert(nested_absmax.clone(), t[&nested_absmax].clone());
            *t = p;
        }),
        &nested_absmax,
        "no nested_* fields",
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn resolving_nested_absmax_checks_its_counts() {
    let map = [0.5f32; 256];
    assert_eq!(resolve_nested_absmax(&[0, 1, 2], &[2.0], &map, 256, 0.25).unwrap(), [1.25; 3]);
    assert!(matches!(resolve_nested_absmax(&[0; 3], &[2.0], &map, 0, 0.0), Err(KernelError::InvalidArgument { .. })));
    assert!(matches!(
        resolve_nested_absmax(&[0; 257], &[2.0], &map, 256, 0.0),
        Err(KernelError::InvalidArgument { .. })
    ));
    assert!(matches!(
        resolve_nested_absmax(&[0; 3], &[2.0, 1.0], &map, 256, 0.0),
        Err(KernelError::InvalidArgument { .. })
    ));
}
