//! The independent reference: layers built and run by Hugging Face transformers itself
//! (`scripts/make_hf_fixtures.sh`, pinned torch and transformers, f32, eager attention), loaded
//! through the same checkpoint loader as any model, and compared with the f64 reference
//! composer and with the block composer on the device (every layer, dense and MoE).
//!
//! The device runs each fixture batch (two sequences of 12 tokens from position 0) as a varlen
//! prefill of 7 and 12 tokens, a chunked prefill of 3 tokens after sequence 0's cached prefix,
//! and two decode steps: the same outputs Hugging Face computes in one pass.

use crate::common;

use std::path::{Path, PathBuf};

use llama_kernels::dev::testing::{Tolerance, compare};
use llama_kernels::reference::block as rb;
use llama_kernels::{DType, Tensor};
use llama_model::Checkpoint;
use llama_model::block::{DecoderLayer, KvCache, LayerWorkspace};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/hf").join(name)
}

/// `layers.N.input` / `layers.N.output` of `io.safetensors`: ([batch, seq, hidden], values).
fn io(dir: &Path, name: &str) -> (Vec<usize>, Vec<f64>) {
    let bytes = std::fs::read(dir.join("io.safetensors")).expect("io.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("valid safetensors");
    let t = st.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.dtype(), safetensors::Dtype::F32);
    let v = t.data().chunks_exact(4).map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]]))).collect();
    (t.shape().to_vec(), v)
}

fn rms(v: &[f64]) -> f64 {
    (v.iter().map(|x| x * x).sum::<f64>() / v.len().max(1) as f64).sqrt()
}

/// f32 end to end against PyTorch's f32 layer: both round every stage to f32, in different
/// orders, so a few f32 ulps of the output's size.
fn tolerance(expected: &[f64]) -> Tolerance {
    Tolerance { atol: 2e-5 * rms(expected), rtol: 1e-4 }
}

/// The steps the device runs per batch: (slot, new tokens).
const STEPS: [&[(usize, usize)]; 4] = [&[(0, 7), (1, 12)], &[(0, 3)], &[(0, 1)], &[(0, 1)]];

fn check_model(name: &str, expect_layers: usize) {
    let dir = fixture(name);
    let ckpt = Checkpoint::open(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(ckpt.config().num_layers(), expect_layers);
    for device in common::devices() {
        for index in 0..expect_layers {
            let (spec, host) = ckpt.layer(index, DType::F32).unwrap_or_else(|e| panic!("{name} layer {index}: {e}"));
            let (shape, x) = io(&dir, &format!("layers.{index}.input"));
            let (_, y) = io(&dir, &format!("layers.{index}.output"));
            let (batch, seq, h) = (shape[0], shape[1], shape[2]);
            assert_eq!(h, spec.hidden);
            let row = |b: usize, t: usize| &x[(b * seq + t) * h..(b * seq + t + 1) * h];

            // The f64 reference composer, every layer (this checks its MoE semantics too).
            let rl = rb::RefLayer::new(spec, &host).expect("reference layer");
            for b in 0..batch {
                let mut cache = rb::RefCache::new(1);
                let tr =
                    rb::forward(&rl, &mut cache, &[(0, seq)], &x[b * seq * h..(b + 1) * seq * h]).expect("reference");
                let expected = &y[b * seq * h..(b + 1) * seq * h];
                let c = compare(tr.get("output").expect("output"), expected, tolerance(expected));
                assert!(
                    c.pass,
                    "{name} layer {index} ({}) reference vs transformers: {}",
                    spec.describe(),
                    c.describe(&[seq, h])
                );
            }

            // The device composer, in prefill / chunked prefill / decode steps.
            let layer = DecoderLayer::new(&device, DType::F32, spec, &host).expect("upload");
            let mut cache = KvCache::for_layers(&device, DType::F32, &[spec], 2, seq).expect("cache");
            let mut ws = LayerWorkspace::plan(&device, DType::F32, &[spec], 2 * seq, &cache).expect("workspace");
            let mut got = vec![f64::NAN; batch * seq * h];
            for batch_steps in STEPS {
                let step = ws.begin_step(&mut cache, batch_steps).expect("step");
                let mut input = Vec::new();
                for s in &step.seqs {
                    for t in s.start..s.start + s.new {
                        input.extend_from_slice(row(s.slot, t));
                    }
                }
                let hidden = Tensor::from_f64(&device, DType::F32, &input, &[step.tokens, h]).expect("hidden");
                layer
                    .forward(&mut ws, &cache, 0, &step, &hidden)
                    .unwrap_or_else(|e| panic!("{name} layer {index}: {e}"));
                cache.commit(&step).expect("commit");
                let out = hidden.to_f64_vec().expect("download");
                for s in &step.seqs {
                    for (i, t) in (s.start..s.start + s.new).enumerate() {
                        let dst = (s.slot * seq + t) * h;
                        got[dst..dst + h].copy_from_slice(&out[(s.offset + i) * h..(s.offset + i + 1) * h]);
                    }
                }
            }
            let c = compare(&got, &y, tolerance(&y));
            assert!(
                c.pass,
                "{name} layer {index} ({}) device vs transformers: {}",
                spec.describe(),
                c.describe(&[batch, seq, h])
            );
            eprintln!("{name} layer {index} ({}): device vs transformers max abs {:.2e}", spec.describe(), c.max_abs);
        }
    }
}

#[test]
fn llama3_layer_matches_transformers() {
    check_model("llama3", 1);
}

#[test]
fn llama4_layers_match_transformers() {
    check_model("llama4", 4);
}
