//! The GGUF loader against an independent reference: Hugging Face transformers loading the same
//! SmolLM2-135M-Instruct GGUF (`scripts/make_hf_fixtures.sh --gguf`, pinned torch, transformers
//! and gguf, f32 on the CPU). transformers dequantizes with the `gguf` package and undoes
//! llama.cpp's q/k row permutation with its own code, so these tests check our `unpermute` (and
//! the whole load) against code we did not write:
//!
//! - rows of layers 0 and 29's q, k and v projections, bit for bit;
//! - the model's next-token distribution after a 5-token prompt, run on the emulated target in
//!   f32: KL divergence from transformers' at the last position, and the argmax at every one.
//!
//! They run whenever the test model is present (`scripts/setup.sh` fetches it) and check that it
//! is the file the fixture was made from.

use std::path::{Path, PathBuf};

use llama_kernels::{DType, Device};
use llama_model::block::HostTensor;
use llama_model::dev::testing::test_model_path;
use llama_model::formats::gguf::GgufFile;
use llama_model::model::{HostModel, Logits, Model, ModelPlan};
use llama_model::text::tokenizer::Tokenizer;
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Largest KL(transformers || ours) of the last-position distribution, in nats. Both sides are
/// f32 with different summation orders: measured 2.2e-11 (largest logit difference 4.1e-5).
/// With the unpermute skipped the KL is 6.1e-2 (and the argmax at position 3 changes), with the
/// forward permutation applied instead of its inverse 1.2, so this is five decades from each.
const KL_TOLERANCE: f64 = 1e-6;

fn fixture() -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf/smollm2_gguf/fixture.json");
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

/// The test model, checked against the fixture's sha256; `None` (with a printed note) when the
/// file is missing.
fn model_path(fx: &Value, what: &str) -> Option<PathBuf> {
    let path = match test_model_path() {
        Ok(p) => p,
        Err(why) => {
            eprintln!("note: {what} not run: {why}");
            return None;
        }
    };
    let found: String = Sha256::digest(std::fs::read(&path).unwrap()).iter().map(|b| format!("{b:02x}")).collect();
    let want = fx["versions"]["model_sha256"].as_str().unwrap();
    assert_eq!(found, want, "{} is not the file tests/fixtures/hf/smollm2_gguf was made from", path.display());
    Some(path)
}

/// Standard base64 (with padding), as Python's `base64.b64encode` writes it.
pub(crate) fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {:?}", c as char),
    };
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    for chunk in text.as_bytes().chunks(4) {
        let n = chunk.iter().filter(|&&c| c != b'=').count();
        let v = chunk[..n].iter().fold(0u32, |acc, &c| acc << 6 | u32::from(value(c))) << (6 * (4 - n));
        out.extend_from_slice(&v.to_be_bytes()[1..n]);
    }
    out
}

pub(crate) fn f32s(text: &str) -> Vec<f32> {
    base64(text).chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// `(layer, projection)` of a state-dict name `model.layers.N.self_attn.P.weight`.
fn parse_name(name: &str) -> (usize, &str) {
    let rest = name.strip_prefix("model.layers.").unwrap();
    let (layer, rest) = rest.split_once('.').unwrap();
    let proj = rest.strip_prefix("self_attn.").unwrap().strip_suffix(".weight").unwrap();
    (layer.parse().unwrap(), proj)
}

fn row(t: &HostTensor, r: usize) -> &[f32] {
    let cols = t.shape[1];
    &t.data[r * cols..(r + 1) * cols]
}

#[test]
fn q_k_and_v_rows_equal_hugging_faces_bit_for_bit() {
    let fx = fixture();
    let Some(path) = model_path(&fx, "GGUF rows against Hugging Face") else { return };
    let host = HostModel::from_gguf(&path, DType::F32).unwrap();
    let raw = GgufFile::open(&path).unwrap();
    let mut checked = 0;
    for entry in fx["rows"].as_array().unwrap() {
        let name = entry["tensor"].as_str().unwrap();
        let (layer, proj) = parse_name(name);
        let w = &host.layers[layer].1;
        let (ours, gguf) = match proj {
            "q_proj" => (&w.q_proj, "attn_q"),
            "k_proj" => (&w.k_proj, "attn_k"),
            "v_proj" => (&w.v_proj, "attn_v"),
            other => panic!("{name}: unexpected projection {other}"),
        };
        let shape: Vec<usize> =
            entry["shape"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
        assert_eq!(ours.shape, shape, "{name}");
        // The file's own (permuted) order, to show which rows the permutation moves.
        let permuted = raw.dequantize(&format!("blk.{layer}.{gguf}.weight")).unwrap();
        let cols = shape[1];
        let theirs = f32s(entry["f32_le"].as_str().unwrap());
        let rows = entry["rows"].as_array().unwrap();
        assert_eq!(theirs.len(), rows.len() * cols, "{name}");
        for (i, r) in rows.iter().enumerate() {
            let r = r.as_u64().unwrap() as usize;
            let hf = &theirs[i * cols..(i + 1) * cols];
            let mine = row(ours, r);
            let diff = mine.iter().zip(hf).position(|(a, b)| a.to_bits() != b.to_bits());
            if let Some(c) = diff {
                panic!(
                    "{name} row {r} column {c}: ours {} (GGUF row order: {}), Hugging Face {}",
                    mine[c],
                    permuted[r * cols + c],
                    hf[c]
                );
            }
            // Rows of q and k that are not fixed points of the permutation (0 and 63 of a head
            // are) differ in the file's order, so a missing unpermute fails the check above.
            let head_row = r % 64;
            let moved = proj != "v_proj" && head_row != 0 && head_row != 63;
            let unmoved = &permuted[r * cols..(r + 1) * cols] == hf;
            assert_eq!(
                unmoved,
                !moved,
                "{name} row {r}: the file's row order {} Hugging Face's",
                if unmoved { "equals" } else { "differs from" }
            );
            checked += 1;
        }
    }
    println!("{checked} rows equal Hugging Face's bit for bit ({})", fx["versions"]["transformers"]);
    assert_eq!(checked, 2 * (8 + 6 + 1));
}

#[test]
fn the_prompt_ids_are_what_our_tokenizer_gives() {
    let fx = fixture();
    let Some(path) = model_path(&fx, "GGUF prompt ids against Hugging Face") else { return };
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    let ids: Vec<u32> = fx["prompt"]["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    assert_eq!(tok.encode(fx["prompt"]["text"].as_str().unwrap(), true).unwrap(), ids);
}

/// KL(p || q) of the distributions of two logit vectors, in f64 from their log-softmax.
pub(crate) fn kl(p_logits: &[f64], q_logits: &[f64]) -> f64 {
    let log_softmax = |x: &[f64]| {
        let m = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lse = m + x.iter().map(|v| (v - m).exp()).sum::<f64>().ln();
        x.iter().map(|v| v - lse).collect::<Vec<f64>>()
    };
    let (lp, lq) = (log_softmax(p_logits), log_softmax(q_logits));
    lp.iter().zip(&lq).map(|(a, b)| a.exp() * (a - b)).sum()
}

fn argmax(x: &[f64]) -> usize {
    (0..x.len()).fold(0, |b, i| if x[i] > x[b] { i } else { b })
}

#[test]
fn the_next_token_distribution_matches_hugging_faces() {
    let fx = fixture();
    let Some(path) = model_path(&fx, "GGUF logits against Hugging Face") else { return };
    let ids: Vec<u32> = fx["prompt"]["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect();
    let vocab = fx["logits"]["vocab"].as_u64().unwrap() as usize;
    let hf_last: Vec<f64> = f32s(fx["logits"]["last_f32_le"].as_str().unwrap()).into_iter().map(f64::from).collect();
    let hf_argmax: Vec<usize> =
        fx["logits"]["argmax"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as usize).collect();
    assert_eq!((hf_last.len(), hf_argmax.len()), (vocab, ids.len()));

    let host = HostModel::from_gguf(&path, DType::F32).unwrap();
    let d = Device::emulated();
    let plan = ModelPlan { slots: 1, max_len: 16, max_tokens: 8 };
    let mut m = Model::new(&d, &host, DType::F32, plan).unwrap();
    let all = m.step(&[(0, &ids)], Logits::All).unwrap().to_f64_vec().unwrap();
    assert_eq!(all.len(), ids.len() * vocab);
    let ours: Vec<usize> = all.chunks_exact(vocab).map(argmax).collect();
    let last = &all[(ids.len() - 1) * vocab..];
    let kl = kl(&hf_last, last);
    let max_diff = last.iter().zip(&hf_last).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!(
        "prompt {ids:?}: argmax ours {ours:?}, Hugging Face {hf_argmax:?} (top-2 gaps {})",
        fx["logits"]["top2_gap"]
    );
    println!("last position: KL(Hugging Face || ours) {kl:.3e} nats, max |logit difference| {max_diff:.3e}");
    assert_eq!(ours, hf_argmax, "argmax per position");
    assert!(kl < KL_TOLERANCE, "KL {kl:e} >= {KL_TOLERANCE:e}");
}
