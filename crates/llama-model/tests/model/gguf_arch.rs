//! Whole GGUF models of both architectures against Hugging Face transformers
//! (`scripts/make_hf_fixtures.sh --arch`: tiny random models saved as safetensors and converted
//! to GGUF as llama.cpp's converter does; see `scripts/make_gguf_arch_fixtures.py`):
//!
//! - `llama31`: a `llama` file with `rope_freqs.weight` (Llama 3.1 scaling). The loader must
//!   recover Meta's parameters from the factors, load the same model as the safetensors copy,
//!   and give transformers' next-token distributions over a 160-token prompt, where the scaled
//!   pairs' angles are far from the unscaled ones (the same weights without scaling are the
//!   control: its KL from transformers is decades above the bound).
//! - `llama4`: a `llama4` file (MoE with a shared expert on layers 1 and 3, NoPE layer 3,
//!   chunked attention, qk norm, Scout scaling from `rope_freqs.weight`): the same layer specs
//!   and weights, bit for bit, as the safetensors copy through our checkpoint loader (the
//!   expert tensors reassembled from llama.cpp's split and transposed ones), and transformers'
//!   logits at every position.
//!
//! transformers' own GGUF loader is no reference here: it reads `llama` files without their
//! `rope_freqs` (the model it builds is unscaled) and has no `llama4` (the fixtures record both).

use std::path::{Path, PathBuf};

use llama_kernels::spec::rope::Llama3Scaling;
use llama_kernels::{DType, Device};
use llama_model::model::{HostModel, Logits, Model, ModelPlan};
use serde_json::Value;

use super::gguf_hf::{f32s, kl};

/// Largest KL(transformers || ours) at any position, in nats. Both sides run f32 with
/// different summation orders: measured 1.6e-12 (llama31) and printed by each test; the
/// llama31 control (no scaling) is 3.1e-3.
const KL_TOLERANCE: f64 = 1e-8;

fn folder(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/gguf_arch").join(name)
}

fn reference(name: &str) -> Value {
    let path = folder(name).join("reference.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn prompt(r: &Value) -> Vec<u32> {
    r["prompt"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect()
}

fn logits(r: &Value, key: &str) -> (Vec<f64>, usize) {
    let shape: Vec<usize> = r[key]["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    let values: Vec<f64> = f32s(r[key]["f32_le"].as_str().unwrap()).into_iter().map(f64::from).collect();
    assert_eq!(values.len(), shape[0] * shape[1], "{key}");
    (values, shape[1])
}

/// Every position's logits of `host` on `ids` (one prefill on the emulated target, f32).
fn run(host: &HostModel, ids: &[u32]) -> Vec<f64> {
    let d = Device::emulated();
    let plan = ModelPlan { slots: 1, max_len: ids.len() + 8, max_tokens: ids.len() };
    let mut m = Model::new(&d, host, DType::F32, plan).unwrap();
    m.step(&[(0, ids)], Logits::All).unwrap().to_f64_vec().unwrap()
}

/// The largest KL(reference || ours) over positions, and where.
fn worst_kl(reference: &[f64], ours: &[f64], vocab: usize) -> (f64, usize) {
    assert_eq!(reference.len(), ours.len());
    reference
        .chunks_exact(vocab)
        .zip(ours.chunks_exact(vocab))
        .enumerate()
        .map(|(i, (r, o))| (kl(r, o), i))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a })
}

/// Both loads of a fixture model: the GGUF file and the safetensors checkpoint.
fn both(name: &str) -> (HostModel, HostModel) {
    let dir = folder(name);
    let gguf = HostModel::from_gguf(dir.join("model.gguf"), DType::F32).unwrap();
    let hf = HostModel::from_checkpoint(&dir, DType::F32).unwrap();
    (gguf, hf)
}

/// The two loads hold the same model: equal layer specs, and every tensor bit for bit.
fn assert_same_model(gguf: &HostModel, hf: &HostModel) {
    assert_eq!(gguf.layers.len(), hf.layers.len());
    for (i, ((gs, gw), (hs, hw))) in gguf.layers.iter().zip(&hf.layers).enumerate() {
        assert_eq!(gs, hs, "layer {i} spec");
        let (gn, hn) = (gw.named(gs), hw.named(hs));
        assert_eq!(gn.len(), hn.len(), "layer {i}: tensor count");
        for ((name, g), (hname, h)) in gn.iter().zip(&hn) {
            assert_eq!(name, hname);
            assert_eq!(g.shape, h.shape, "layer {i} {name}");
            let diff = g.data.iter().zip(&h.data).position(|(a, b)| a.to_bits() != b.to_bits());
            assert_eq!(diff, None, "layer {i} {name}: first differing element");
        }
    }
    for (what, g, h) in
        [("embed", &gguf.embed, &hf.embed), ("norm", &gguf.norm, &hf.norm), ("lm_head", gguf.lm_head(), hf.lm_head())]
    {
        assert_eq!(g.shape, h.shape, "{what}");
        assert!(g.data.iter().zip(&h.data).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
    }
}

#[test]
fn llama31_rope_freqs_give_back_metas_scaling_and_hugging_faces_logits() {
    let r = reference("llama31");
    let (gguf, hf) = both("llama31");
    for (spec, _) in &gguf.layers {
        let rope = spec.rope.expect("every llama layer has RoPE");
        assert_eq!(rope.scaling, Some(Llama3Scaling::LLAMA_3_1), "layer {}", spec.index);
    }
    assert_same_model(&gguf, &hf);

    let ids = prompt(&r);
    let (want, vocab) = logits(&r, "logits");
    let (unscaled, _) = logits(&r, "logits_unscaled");
    let ours = run(&gguf, &ids);
    let (kl_ours, at) = worst_kl(&want, &ours, vocab);
    let (kl_control, control_at) = worst_kl(&want, &unscaled, vocab);
    let max_diff = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!(
        "llama31 ({} tokens): worst KL(transformers || ours) {kl_ours:.3e} at position {at}, max |logit \
         difference| {max_diff:.3e}; without the scaling the KL reaches {kl_control:.3e} (position {control_at})",
        ids.len()
    );
    assert!(kl_ours < KL_TOLERANCE, "KL {kl_ours:e} >= {KL_TOLERANCE:e} at position {at}");
    assert!(kl_control > 1e3 * KL_TOLERANCE, "the control is too close ({kl_control:e}): the check could not fail");
}

#[test]
fn llama4_gguf_is_the_safetensors_model_and_gives_hugging_faces_logits() {
    let r = reference("llama4");
    let (gguf, hf) = both("llama4");
    assert_eq!(gguf.layers.len(), 4);
    let nope: Vec<bool> = gguf.layers.iter().map(|(s, _)| s.rope.is_none()).collect();
    assert_eq!(nope, [false, false, false, true], "llama.cpp's NoPE layers: (i + 1) % 4 == 0");
    let moe: Vec<bool> =
        gguf.layers.iter().map(|(s, _)| matches!(s.ffn, llama_kernels::spec::layer::FfnSpec::Moe { .. })).collect();
    assert_eq!(moe, [false, true, false, true], "interleave_moe_layer_step 2");
    assert_eq!(gguf.layers[0].0.rope.and_then(|c| c.scaling), Some(Llama3Scaling::LLAMA_4_SCOUT));
    assert!(gguf.layers[3].0.temperature.is_some(), "NoPE layers tune the attention temperature");
    assert_same_model(&gguf, &hf);

    let ids = prompt(&r);
    let (want, vocab) = logits(&r, "logits");
    let ours = run(&gguf, &ids);
    let (kl_ours, at) = worst_kl(&want, &ours, vocab);
    let max_diff = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!(
        "llama4 ({} tokens): worst KL(transformers || ours) {kl_ours:.3e} at position {at}, max |logit \
         difference| {max_diff:.3e}",
        ids.len()
    );
    assert!(kl_ours < KL_TOLERANCE, "KL {kl_ours:e} >= {KL_TOLERANCE:e} at position {at}");
}

/// The 5-bit fixtures: projections packed in Q5_0, Q5_1 and Q5_K (the types a Q5_K_M file
/// mixes), experts and the embedding in Q8_0 and Q5 (dequantized at load), against transformers
/// on the values the gguf package decodes from the same blocks.
#[test]
fn q5_files_of_both_architectures_run_packed_and_give_hugging_faces_logits() {
    use llama_kernels::spec::quant::QuantFormat;
    for name in ["llama31_q5", "llama4_q5"] {
        let r = reference(name);
        let host = HostModel::from_gguf(folder(name).join("model.gguf"), DType::F32).unwrap();
        let mut formats: Vec<QuantFormat> =
            host.layers.iter().flat_map(|(_, w)| w.packed.values().map(|p| p.layout().format())).collect();
        formats.extend(host.lm_head_packed.as_ref().map(|p| p.layout().format()));
        formats.sort_by_key(|f| f.name());
        formats.dedup();
        assert_eq!(formats, [QuantFormat::Q5_0, QuantFormat::Q5_1, QuantFormat::Q5_K], "{name}: packed formats");
        let ids = prompt(&r);
        let (want, vocab) = logits(&r, "logits");
        let ours = run(&host, &ids);
        let (kl_ours, at) = worst_kl(&want, &ours, vocab);
        let max_diff = ours.iter().zip(&want).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
        println!(
            "{name} ({} tokens, types {}): worst KL(transformers || ours) {kl_ours:.3e} at position {at}, max |logit \
             difference| {max_diff:.3e}",
            ids.len(),
            r["types"]
        );
        assert!(kl_ours < KL_TOLERANCE, "{name}: KL {kl_ours:e} >= {KL_TOLERANCE:e} at position {at}");
    }
}

/// Every fixture generates through its own vocabulary: greedy, the first token is the argmax of
/// transformers' last-position logits, and the reply is text of the vocabulary.
#[test]
fn every_fixture_file_generates_text() {
    use llama_model::model::{SamplingConfig, TextModel};
    let d = Device::emulated();
    for name in ["llama31", "llama4", "llama31_q5", "llama4_q5"] {
        let r = reference(name);
        let ids = prompt(&r);
        let (want, vocab) = logits(&r, "logits");
        let last = &want[want.len() - vocab..];
        let argmax = (0..vocab).fold(0, |b, i| if last[i] > last[b] { i } else { b });
        let mut tm = TextModel::open(&d, &folder(name).join("model.gguf"), DType::F32, ids.len() + 16, 256).unwrap();
        let (text, g) = tm.generate(&ids, 6, SamplingConfig::GREEDY, 0, &mut |_| {}).unwrap();
        println!("{name}: {:?} -> {text:?} ({:?})", g.tokens, g.reason);
        assert_eq!(g.tokens.first().map(|&t| t as usize), Some(argmax), "{name}: first generated token");
        assert!(!text.is_empty(), "{name}");
        let hello = tm.prompt_ids("the cat sat", false).unwrap();
        assert!(!hello.is_empty() && hello.iter().all(|&t| (t as usize) < vocab), "{name}: {hello:?}");
    }
}

// ------------------------------------------------------------------ malformed files

use super::gguf::{Writer, gguf_str, write};
use llama_model::Error;
use llama_model::formats::gguf::{GgufFile, GgufValue};
use llama_model::model::gguf::rope_freqs;

/// A metadata value as GGUF bytes: (type id, encoding).
fn encode(v: &GgufValue) -> (u32, Vec<u8>) {
    match v {
        GgufValue::U64(x) => (10, x.to_le_bytes().to_vec()),
        GgufValue::I64(x) => (11, x.to_le_bytes().to_vec()),
        GgufValue::F64(x) => (12, x.to_le_bytes().to_vec()),
        GgufValue::Bool(b) => (7, vec![u8::from(*b)]),
        GgufValue::Str(s) => (8, gguf_str(s)),
        GgufValue::Array(a) => {
            let ty = a.first().map_or(4, |x| encode(x).0);
            let mut out = ty.to_le_bytes().to_vec();
            out.extend_from_slice(&(a.len() as u64).to_le_bytes());
            a.iter().for_each(|x| out.extend(encode(x).1));
            (9, out)
        }
    }
}

/// A fixture's GGUF file rewritten (every tensor as f32) after `edit` changed its metadata and
/// tensors (name, shape slowest-first, values).
fn rewritten(
    name: &str,
    edit: impl FnOnce(&mut Vec<(String, GgufValue)>, &mut Vec<(String, Vec<usize>, Vec<f32>)>),
) -> PathBuf {
    let src = GgufFile::open(folder(name).join("model.gguf")).unwrap();
    let mut meta: Vec<(String, GgufValue)> = src.metadata().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let mut tensors: Vec<(String, Vec<usize>, Vec<f32>)> =
        src.tensors().iter().map(|t| (t.name.clone(), t.shape.clone(), src.dequantize(&t.name).unwrap())).collect();
    edit(&mut meta, &mut tensors);
    let mut w = Writer::default();
    for (k, v) in &meta {
        let (ty, bytes) = encode(v);
        w = w.kv(k, ty, bytes);
    }
    for (n, shape, data) in &tensors {
        let dims: Vec<u64> = shape.iter().rev().map(|&d| d as u64).collect();
        w = w.tensor(n, &dims, 0, data.iter().flat_map(|x| x.to_le_bytes()).collect());
    }
    // Tests run in parallel in one process: each rewrite gets its own file.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    write(&format!("arch-{name}-{n}"), &w.bytes())
}

fn load_err(path: &Path) -> Error {
    let r = HostModel::from_gguf(path, DType::F32);
    let _ = std::fs::remove_file(path);
    match r {
        Err(e) => e,
        Ok(_) => panic!("{} loaded", path.display()),
    }
}

fn set(meta: &mut [(String, GgufValue)], key: &str, v: GgufValue) {
    meta.iter_mut().find(|(k, _)| k == key).unwrap_or_else(|| panic!("{key}")).1 = v;
}

fn tensor<'a>(t: &'a mut [(String, Vec<usize>, Vec<f32>)], name: &str) -> &'a mut (String, Vec<usize>, Vec<f32>) {
    t.iter_mut().find(|(n, ..)| n == name).unwrap_or_else(|| panic!("{name}"))
}

#[test]
fn the_rewriter_keeps_a_loadable_model() {
    // The control for the cases below: a rewrite without edits loads as the original does.
    let path = rewritten("llama4", |_, _| {});
    let host = HostModel::from_gguf(&path, DType::F32).unwrap();
    let _ = std::fs::remove_file(&path);
    assert_same_model(&host, &both("llama4").1);
}

#[test]
fn rope_freqs_that_are_not_llama31_scaling_are_named_errors() {
    // One smooth-band factor moved by 1e-4 (about 800 ulps): no Llama 3.1 bands give it.
    let path = rewritten("llama31", |_, t| tensor(t, "rope_freqs.weight").2[16] *= 1.0001);
    match load_err(&path) {
        Error::Unsupported { what } => {
            assert!(what.contains("rope_freqs.weight") && what.contains("pair 16"), "{what}")
        }
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama31", |_, t| {
        let f = tensor(t, "rope_freqs.weight");
        f.1 = vec![31];
        f.2.pop();
    });
    match load_err(&path) {
        Error::Checkpoint { tensor, why } => {
            assert!(tensor == "rope_freqs.weight" && why.contains("32 rotary pairs"), "{why}")
        }
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama31", |_, t| tensor(t, "rope_freqs.weight").2[3] = f32::NAN);
    match load_err(&path) {
        Error::Checkpoint { tensor, why } => {
            assert!(tensor == "rope_freqs.weight" && why.contains("factor 3"), "{why}")
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn malformed_llama4_files_are_named_errors() {
    let path = rewritten("llama4", |_, t| t.retain(|(n, ..)| n != "blk.1.ffn_up_exps.weight"));
    match load_err(&path) {
        Error::Checkpoint { tensor, .. } => assert_eq!(tensor, "blk.1.ffn_up_exps.weight"),
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama4", |_, t| {
        let d = tensor(t, "blk.3.ffn_down_exps.weight");
        d.1 = vec![4, 32, 64]; // the Hugging Face orientation, not llama.cpp's [E, h, I]
    });
    match load_err(&path) {
        Error::Checkpoint { tensor, why } => {
            assert!(tensor == "blk.3.ffn_down_exps.weight" && why.contains("[4, 64, 32]"), "{why}")
        }
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama4", |m, _| m.push(("llama4.attention.sliding_window".into(), GgufValue::U64(4096))));
    match load_err(&path) {
        Error::Unsupported { what } => assert!(what.contains("sliding_window 4096"), "{what}"),
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama4", |m, _| set(m, "llama4.expert_count", GgufValue::U64(0)));
    assert!(matches!(load_err(&path), Error::Unsupported { what } if what.contains("expert_count 0")));
    let path = rewritten("llama4", |m, _| m.retain(|(k, _)| k != "llama4.interleave_moe_layer_step"));
    match load_err(&path) {
        Error::Config { field, why } => {
            assert_eq!((field.as_str(), why.as_str()), ("llama4.interleave_moe_layer_step", "missing"))
        }
        e => panic!("{e:?}"),
    }
    let path = rewritten("llama4", |m, _| set(m, "general.architecture", GgufValue::Str("llama5".into())));
    assert!(matches!(load_err(&path), Error::Unsupported { what } if what.contains("`llama5`")));
}

#[test]
fn a_llama4_file_with_sliding_window_zero_has_rope_and_global_attention_everywhere() {
    // llama.cpp's MobileLLM case: `attention.sliding_window` 0 turns chunking and NoPE off.
    let path = rewritten("llama4", |m, _| m.push(("llama4.attention.sliding_window".into(), GgufValue::U64(0))));
    let host = HostModel::from_gguf(&path, DType::F32).unwrap();
    let _ = std::fs::remove_file(&path);
    for (spec, _) in &host.layers {
        assert!(spec.rope.is_some(), "layer {}", spec.index);
        assert_eq!(spec.mask, llama_kernels::spec::attention::AttentionMask::Causal, "layer {}", spec.index);
    }
}

/// llama.cpp's converter arithmetic for Llama 3.1 factors, in f32 as `torch.float32` does it.
fn converter_factors(theta: f32, dim: usize, factor: f32, low: f32, high: f32, old: f32) -> Vec<f32> {
    (0..dim / 2)
        .map(|i| {
            let freq = 1.0 / theta.powf((2 * i) as f32 / dim as f32);
            let wavelen = 2.0 * std::f32::consts::PI / freq;
            if wavelen < old / high {
                1.0
            } else if wavelen > old / low {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect()
}

#[test]
fn recovery_finds_each_published_scaling_and_fits_other_bands() {
    for (factor, head_dim) in [(8.0, 128), (32.0, 64), (32.0, 128)] {
        let g = converter_factors(500_000.0, head_dim, factor, 1.0, 4.0, 8192.0);
        let s = rope_freqs::recover(&g, 500_000.0, head_dim, 8192.0).unwrap().unwrap();
        let want = Llama3Scaling { factor: f64::from(factor), ..Llama3Scaling::LLAMA_3_1 };
        assert_eq!(s, want, "factor {factor}, head_dim {head_dim}");
    }
    let g = converter_factors(500_000.0, 128, 16.0, 1.0, 1.0, 8192.0);
    let s = rope_freqs::recover(&g, 500_000.0, 128, 8192.0).unwrap().unwrap();
    assert_eq!(s, Llama3Scaling::LLAMA_4_SCOUT);
    // Bands no Meta model uses (low 2, high 8, theta 10 000, head_dim 128: 9 pairs in the band)
    // are fitted through the band's outermost pairs.
    let g = converter_factors(10_000.0, 128, 4.0, 2.0, 8.0, 8192.0);
    let s = rope_freqs::recover(&g, 10_000.0, 128, 8192.0).unwrap().unwrap();
    assert_eq!(s.factor, 4.0);
    assert!((s.low_freq_factor - 2.0).abs() < 1e-4 && (s.high_freq_factor - 8.0).abs() < 1e-3, "{s:?}");
    // All ones is no scaling at all.
    assert_eq!(rope_freqs::recover(&[1.0; 32], 500_000.0, 64, 8192.0).unwrap(), None);
}
