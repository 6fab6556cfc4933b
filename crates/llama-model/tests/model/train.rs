//! LoRA training against peft + transformers in float64 (tests/fixtures/peft, from
//! scripts/make_peft_fixtures.py): the first step's loss and every adapter gradient, and the
//! losses of three AdamW steps; a same-seed run repeated bit for bit; bf16 and an NF4 base
//! (QLoRA) training the same adapter down; peft's zero-initialized B giving exactly zero dA.

use std::path::{Path, PathBuf};

use llama_kernels::dev::testing::{Tolerance, compare};
use llama_kernels::ops::optimizer::AdamWConfig;
use llama_kernels::spec::lora::LoraConfig;
use llama_kernels::{DType, Device};
use llama_model::formats::peft::{Adapter, AdapterConfig, Projection};
use llama_model::model::HostModel;
use llama_model::train::{Batch, Example, LoraTrainer, TrainConfig, TrainPlan};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peft")
}

fn reference() -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(fixture().join("reference.json")).unwrap()).unwrap()
}

fn batch(reference: &serde_json::Value, vocab: usize) -> Batch {
    let examples: Vec<Example> = reference["examples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| Example {
            ids: e["ids"].as_array().unwrap().iter().map(|v| v.as_u64().unwrap() as u32).collect(),
            labels: e["labels"].as_array().unwrap().iter().map(|v| v.as_i64().unwrap() as i32).collect(),
        })
        .collect();
    Batch::pack(&examples, vocab).unwrap()
}

/// Every adapter gradient of `t` against `want` (peft's, by tensor name, float64 base64):
/// f32 arithmetic through two layers, so relative to each tensor's largest gradient. Returns the
/// largest difference so measured.
fn check_gradients(t: &LoraTrainer, want: &serde_json::Value) -> f64 {
    let grads = t.gradients().unwrap();
    assert_eq!(grads.len(), 14);
    let mut worst = 0.0f64;
    for ((layer, p), (da, db)) in &grads {
        let [an, bn] = p.tensor_names(*layer);
        for (name, got) in [(an, da), (bn, db)] {
            let want: Vec<f64> = crate::gguf_hf::base64(want[&name].as_str().unwrap())
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs()));
            let tol = Tolerance { atol: 2e-5 * scale + 1e-7, rtol: 1e-4 };
            let cmp = compare(got, &want, tol);
            worst = worst.max(cmp.max_abs / scale);
            assert!(cmp.pass, "{name}: {}", cmp.describe(&[got.len()]));
        }
    }
    worst
}

fn config(seed: u64) -> TrainConfig {
    let adamw = AdamWConfig { weight_decay: 0.01, max_grad_norm: Some(1.0), ..AdamWConfig::default() };
    TrainConfig { adamw, grad_accum: 1, seed }
}

const PLAN: TrainPlan = TrainPlan { max_tokens: 32, max_seqs: 4, recompute: false };

fn trainer(host: &HostModel, dtype: DType, adapter: &Adapter, seed: u64) -> LoraTrainer {
    LoraTrainer::new(&Device::emulated(), host, dtype, adapter, config(seed), PLAN).unwrap()
}

#[test]
fn gradients_and_losses_match_peft_in_float64() {
    let r = reference();
    let host = HostModel::from_checkpoint(fixture().join("base"), DType::F32).unwrap();
    let adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    assert_eq!(adapter.config.targets, Projection::ALL);
    assert_eq!(adapter.config.lora, LoraConfig { r: 4, alpha: 8.0, dropout: 0.0, rslora: false });
    let b = batch(&r, host.vocab());
    let mut t = trainer(&host, DType::F32, &adapter, 0);
    t.micro_step(&b).unwrap();
    let loss = f64::from(t.loss().unwrap());
    let want = r["loss"].as_f64().unwrap();
    println!("loss {loss} against peft's {want}");
    assert!((loss - want).abs() < 1e-5 * want.abs(), "{loss} vs {want}");
    let worst = check_gradients(&t, &r["grads"]);
    println!("largest gradient difference / the tensor's largest gradient: {worst:.2e}");
    // Three AdamW steps (clipped to norm 1, weight decay 0.01) on the same batch.
    let lr = r["adamw"]["lr"].as_f64().unwrap() as f32;
    let losses: Vec<f64> = r["losses"].as_array().unwrap().iter().map(|v| v.as_f64().unwrap()).collect();
    let mut t = trainer(&host, DType::F32, &adapter, 0);
    for (k, want) in losses.iter().enumerate() {
        t.micro_step(&b).unwrap();
        let got = f64::from(t.loss().unwrap());
        println!("step {k}: loss {got} against peft's {want}");
        assert!((got - want).abs() < 1e-4 * want, "step {k}: {got} vs {want}");
        t.step(lr).unwrap();
    }
}

#[test]
fn a_same_seed_run_repeats_bit_for_bit_with_dropout() {
    let r = reference();
    let host = HostModel::from_checkpoint(fixture().join("base"), DType::F32).unwrap();
    let mut adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    adapter.config.lora.dropout = 0.1;
    let b = batch(&r, host.vocab());
    let run = |seed: u64| -> Vec<f32> {
        let mut t = trainer(&host, DType::BF16, &adapter, seed);
        (0..3)
            .map(|_| {
                t.micro_step(&b).unwrap();
                let l = t.loss().unwrap();
                t.step(1e-2).unwrap();
                l
            })
            .collect()
    };
    let (a, again, other) = (run(5), run(5), run(6));
    println!("seed 5: {a:?}; seed 6: {other:?}");
    assert_eq!(
        a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
        again.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
    );
    assert_ne!(a[1..], other[1..], "another seed draws other dropout masks");
}

#[test]
fn bf16_and_an_nf4_base_train_the_adapter_down() {
    let r = reference();
    let want = r["loss"].as_f64().unwrap();
    let mut host = HostModel::from_checkpoint(fixture().join("base"), DType::BF16).unwrap();
    let adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    let b = batch(&r, host.vocab());
    let mut dense = trainer(&host, DType::BF16, &adapter, 0);
    dense.micro_step(&b).unwrap();
    let first = f64::from(dense.loss().unwrap());
    println!("bf16 loss {first} against peft's float64 {want}");
    assert!((first - want).abs() < 0.02 * want, "{first} vs {want}");
    host.quantize_nf4(64, DType::BF16).unwrap();
    assert!(host.is_packed());
    let mut q = trainer(&host, DType::BF16, &adapter, 0);
    let mut losses = Vec::new();
    for _ in 0..4 {
        q.micro_step(&b).unwrap();
        losses.push(q.loss().unwrap());
        let stats = q.step(1e-2).unwrap();
        assert!(!stats.found_inf && stats.grad_norm.is_finite() && stats.grad_norm > 0.0, "{stats:?}");
    }
    println!("QLoRA (NF4 base, bf16) losses: {losses:?}");
    // NF4 moves the base by its quantization error: near the dense loss, then down.
    assert!((f64::from(losses[0]) - want).abs() < 0.1 * want, "{losses:?}");
    assert!(losses.windows(2).all(|w| w[1] < w[0]), "{losses:?}");
}

#[test]
fn peft_initialization_gives_an_exactly_zero_first_da() {
    let r = reference();
    let host = HostModel::from_checkpoint(fixture().join("base"), DType::F32).unwrap();
    let cfg = AdapterConfig::new(LoraConfig { r: 4, alpha: 8.0, dropout: 0.05, rslora: false }, &Projection::ALL, None)
        .unwrap();
    let adapter = Adapter::init(cfg, &host.config, 3).unwrap();
    let mut t = trainer(&host, DType::F32, &adapter, 0);
    t.micro_step(&batch(&r, host.vocab())).unwrap();
    for ((layer, p), (da, db)) in t.gradients().unwrap() {
        assert!(da.iter().all(|&v| v == 0.0), "layer {layer} {p:?}: dA of B = 0 must be 0");
        assert!(db.iter().any(|&v| v != 0.0), "layer {layer} {p:?}: dB is not");
    }
    // Saved and read back, the trained adapter is the trainer's.
    t.step(1e-2).unwrap();
    let trained = t.adapter().unwrap();
    let dir = std::env::temp_dir().join(format!("llk-train-{}", std::process::id()));
    trained.save(&dir).unwrap();
    assert_eq!(Adapter::load(&dir, &host.config, DType::F32).unwrap(), trained);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The mean loss of `b` through the inference model (every token's logits, on the host).
fn model_loss(model: &mut llama_model::model::Model, b: &Batch, vocab: usize) -> f64 {
    use llama_model::model::Logits;
    let (mut total, mut count, mut first) = (0.0f64, 0usize, 0usize);
    for (slot, &n) in b.seq_lens.iter().enumerate() {
        model.clear(slot);
        let ids: Vec<u32> = b.ids[first..first + n].iter().map(|&i| i as u32).collect();
        let logits = model.step(&[(slot, &ids)], Logits::All).unwrap().to_f64_vec().unwrap();
        for (row, &label) in b.labels[first..first + n].iter().enumerate() {
            if label < 0 {
                continue;
            }
            let l = &logits[row * vocab..(row + 1) * vocab];
            let max = l.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(v));
            let lse = max + l.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            total += lse - l[label as usize];
            count += 1;
        }
        first += n;
    }
    total / count as f64
}

#[test]
fn inference_with_the_adapter_gives_the_trained_models_loss() {
    use llama_model::model::{Model, ModelPlan};
    let r = reference();
    let plan = ModelPlan { slots: 2, max_len: 32, max_tokens: 32 };
    for nf4 in [false, true] {
        let mut host =
            HostModel::from_checkpoint(fixture().join(if nf4 { "base_nf4" } else { "base" }), DType::F32).unwrap();
        let mut adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
        // Trained with dropout; evaluated (and merged) without it.
        adapter.config.lora.dropout = 0.2;
        let b = batch(&r, host.vocab());
        let mut t = trainer(&host, DType::F32, &adapter, 0);
        t.micro_step(&b).unwrap();
        t.step(1e-2).unwrap();
        let trained = t.adapter().unwrap();
        let in_memory = f64::from(t.eval(&b).unwrap());
        // Attached unmerged: a packed base stays packed.
        let mut model = Model::new(&Device::emulated(), &host, DType::F32, plan).unwrap();
        let base_loss = model_loss(&mut model, &b, host.vocab());
        model.attach_adapter(&trained).unwrap();
        let unmerged = model_loss(&mut model, &b, host.vocab());
        // Merged into the weights (W + alpha/r B A): dense.
        host.merge_adapter(&trained, DType::F32).unwrap();
        assert!(!host.layers.iter().any(|(_, w)| !w.packed.is_empty()), "merged projections run dense");
        let merged =
            model_loss(&mut Model::new(&Device::emulated(), &host, DType::F32, plan).unwrap(), &b, host.vocab());
        println!(
            "{}: loss in memory {in_memory}, attached {unmerged}, merged {merged} (base alone {base_loss})",
            if nf4 { "NF4 base" } else { "dense base" }
        );
        assert!((unmerged - in_memory).abs() < 1e-5 * in_memory, "{unmerged} vs {in_memory}");
        assert!((merged - in_memory).abs() < 1e-5 * in_memory, "{merged} vs {in_memory}");
        assert!((base_loss - in_memory).abs() > 1e-2, "the adapter changes the loss");
    }
}

#[test]
fn f16_skips_overflowing_steps_and_lowers_its_loss_scale() {
    use llama_kernels::ops::optimizer::LossScaling;
    let r = reference();
    let host = HostModel::from_checkpoint(fixture().join("base"), DType::F16).unwrap();
    let adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    let b = batch(&r, host.vocab());
    // A first scale far past f16's range makes the scaled gradients overflow: GradScaler skips
    // those steps and halves the scale until they fit.
    let scaling = LossScaling { init_scale: 1e30, ..LossScaling::default() };
    let cfg = TrainConfig { adamw: AdamWConfig { loss_scaling: Some(scaling), ..config(0).adamw }, ..config(0) };
    let mut t = LoraTrainer::new(&Device::emulated(), &host, DType::F16, &adapter, cfg, PLAN).unwrap();
    let (mut skipped, mut losses) = (0, Vec::new());
    for _ in 0..120 {
        t.micro_step(&b).unwrap();
        losses.push(t.loss().unwrap());
        let stats = t.step(1e-2).unwrap();
        skipped += usize::from(stats.found_inf);
        if !stats.found_inf && losses.len() > 1 && skipped > 0 && t.loss_scale() < 1e30 {
            // Trained after the skips: two more steps must lower the loss.
            for _ in 0..2 {
                t.micro_step(&b).unwrap();
                losses.push(t.loss().unwrap());
                assert!(!t.step(1e-2).unwrap().found_inf);
            }
            break;
        }
    }
    println!(
        "f16: {skipped} skipped steps, loss scale now {}, losses {:?}",
        t.loss_scale(),
        &losses[losses.len() - 3..]
    );
    assert!(skipped > 0 && t.loss_scale() < 1e30);
    let n = losses.len();
    assert!(losses[n - 1] < losses[n - 3], "{losses:?}");
}

#[test]
fn json_lines_become_examples_with_the_loss_on_assistant_turns() {
    use llama_model::model::TextParts;
    use llama_model::train::{Encoder, IGNORE};
    let Ok(path) = llama_model::dev::testing::test_model_path() else {
        eprintln!("skipped: the test model is not fetched (scripts/setup.sh)");
        return;
    };
    let parts = TextParts::open(&path, DType::F32).unwrap();
    let enc = Encoder { tokenizer: &parts.tokenizer, template: parts.template.as_ref(), eos: None, max_len: 256 };
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/train/chat.jsonl");
    let examples = enc.read_jsonl(&data).unwrap();
    assert_eq!(examples.len(), 6);
    // The first: only the assistant's reply (and its end-of-turn marker) is trained.
    let ex = &examples[0];
    let trained: Vec<u32> = ex.ids.iter().zip(&ex.labels).filter(|(_, l)| **l != IGNORE).map(|(&i, _)| i).collect();
    let text = parts.tokenizer.decode(&trained, false).unwrap();
    assert!(text.starts_with("Paris is the capital of France."), "{text:?}");
    assert!(!text.contains("What is the capital"), "{text:?}");
    // Two assistant turns: both trained, the user turn between them not.
    let two = &examples[3];
    let trained = parts
        .tokenizer
        .decode(
            &two.ids.iter().zip(&two.labels).filter(|(_, l)| **l != IGNORE).map(|(&i, _)| i).collect::<Vec<_>>(),
            false,
        )
        .unwrap();
    assert!(
        trained.contains("Eleven") && trained.contains("Thirteen") && !trained.contains("And another"),
        "{trained:?}"
    );
    // A text line trains every token.
    assert!(examples[4].labels.iter().all(|&l| l != IGNORE));
    // Bad files: not JSON lines, a line of neither form, an example too long: named by line.
    let dir = std::env::temp_dir().join(format!("llk-data-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, why) in [
        ("bad.jsonl", "{\"text\": \"fine\"}\nnot json\n", "line 2"),
        ("neither.jsonl", "{\"prompt\": \"x\"}\n", "neither"),
        ("long.jsonl", &format!("{{\"text\": \"{}\"}}\n", "word ".repeat(400)), "longer than"),
        ("empty.jsonl", "\n\n", "no examples"),
    ] {
        std::fs::write(dir.join(name), text).unwrap();
        let e = enc.read_jsonl(&dir.join(name)).unwrap_err().to_string();
        assert!(e.contains(why), "{name}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn an_overflowing_bf16_run_names_the_layer() {
    let r = reference();
    let mut host = HostModel::from_checkpoint(fixture().join("base"), DType::BF16).unwrap();
    let adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    // Layer 1's down projection scaled past bf16's range: its output overflows.
    if let llama_kernels::spec::weights::HostFfn::Dense { down, .. } = &mut host.layers[1].1.ffn {
        down.data.iter_mut().for_each(|v| *v = 3e38);
    }
    let mut t = trainer(&host, DType::BF16, &adapter, 0);
    t.micro_step(&batch(&r, host.vocab())).unwrap();
    let e = t.loss().unwrap_err().to_string();
    assert!(e.contains("layer 1"), "{e}");
}

#[test]
fn recomputing_each_layer_gives_the_same_bits() {
    let r = reference();
    let host = HostModel::from_checkpoint(fixture().join("base"), DType::BF16).unwrap();
    let mut adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    adapter.config.lora.dropout = 0.1;
    let b = batch(&r, host.vocab());
    let run = |recompute: bool| {
        let plan = TrainPlan { recompute, ..PLAN };
        let mut t = LoraTrainer::new(&Device::emulated(), &host, DType::BF16, &adapter, config(3), plan).unwrap();
        let mut out = Vec::new();
        for _ in 0..2 {
            t.micro_step(&b).unwrap();
            out.push((t.loss().unwrap().to_bits(), t.gradients().unwrap()));
            t.step(1e-2).unwrap();
        }
        out
    };
    let (kept, recomputed) = (run(false), run(true));
    assert!(kept == recomputed, "recomputation changed a loss or a gradient");
}

#[test]
fn qlora_matches_peft_on_a_bitsandbytes_nf4_base() {
    let r = reference();
    // The base as bitsandbytes quantized and saved it (NF4, double quantization), kept packed.
    let host = HostModel::from_checkpoint(fixture().join("base_nf4"), DType::F32).unwrap();
    assert!(host.is_packed());
    let adapter = Adapter::load(fixture().join("adapter"), &host.config, DType::F32).unwrap();
    let mut t = trainer(&host, DType::F32, &adapter, 0);
    t.micro_step(&batch(&r, host.vocab())).unwrap();
    let (loss, want) = (f64::from(t.loss().unwrap()), r["qlora"]["loss"].as_f64().unwrap());
    println!("QLoRA loss {loss} against peft + bitsandbytes' {want}");
    assert!((loss - want).abs() < 1e-5 * want, "{loss} vs {want}");
    let worst = check_gradients(&t, &r["qlora"]["grads"]);
    println!("QLoRA: largest gradient difference / the tensor's largest gradient: {worst:.2e}");
}
