//! Whole models through `model::Model` (bf16): time to first token and decode speed.
//!
//! Models:
//! - **SmolLM2-135M-Instruct**, the real GGUF (`.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf`,
//!   or the file `LLK_MODEL` names): 30 layers, hidden 576, 9 q / 3 kv heads, vocab 49152, tied
//!   head. The loader keeps its Q4_1 projections and Q8_0 LM head packed (`ops::qlinear`), with
//!   bf16 activations. When the file is absent (the GPU machine gets only what the device tool
//!   carries, 64 MiB, and the file is 98 MB), the same shapes with random dense bf16 weights are
//!   timed instead, and the rows say so: the same shapes, but dense projections, so not the
//!   packed model's times.
//! - **Llama 3 8B shapes** with random weights (hidden 4096, 32 q / 8 kv heads, head_dim 128,
//!   intermediate 14336, vocab 128256, untied head): the first `LLK_BENCH_LLAMA_LAYERS` layers
//!   (default 2; 32 needs about 32 GB of host memory and a minute of set-up), then an
//!   estimate for all 32 layers: the measured time plus the missing layers at the measured mean
//!   time per layer (CUDA events recorded after each layer of a step). Rows marked `est.`.
//!
//! Measured, per model:
//! - `prefill P` (P = 128, 512, 2048 prompt tokens, one sequence, one step): the time to first
//!   token as `Model::generate` reports it (wall clock: the prefill step, the sampling kernel
//!   and the read-back of the chosen id; mean of 3 after a warm-up), and the step's GPU time.
//! - `decode b1 ctx512` / `decode b32 ctx512`: one new token per sequence per step after a
//!   512-token prompt in each of 1 or 32 cache slots (`Model::step` with one `(slot, [token])`
//!   per sequence); mean over 32 steps, wall clock (the host waits once, at the end) and GPU
//!   time (events). Tokens/s = batch / step time. Bytes per step: the weights (bf16) and the K/V
//!   read; GB/s and its fraction of the device-to-device copy bandwidth measured in the same run.
//! - `generate b1 ctx512`: `Model::generate` for 33 tokens (greedy, the chosen id read back after
//!   every step, as a real decode loop does); tokens/s over the 32 after the first.
//!
//! Random weights are drawn in parallel, uniform with a trained layer's scale (1/sqrt(fan in)).
//! No criterion statistics: a decode step changes the cache it runs on, so each measurement is a
//! plain timed loop and is printed as such. Without a GPU this prints the models and what it
//! would measure, and exits 0.

#[path = "../../llama-kernels/benches/common/mod.rs"]
mod common;
mod random;

use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use llama_kernels::{DType, Device};
use llama_model::Result;
use llama_model::block::LayerSpec;
use llama_model::dev::testing::test_model_path;
use llama_model::model::{GenerateOptions, HostModel, Logits, Model, ModelPlan, SamplingConfig};
use random::{LLAMA3_8B, LLAMA3_LAYERS, LLAMA3_VOCAB, SMOLLM2, SMOLLM2_VOCAB, random_host};

const PROMPTS: [usize; 3] = [128, 512, 2048];
const CONTEXT: usize = 512;
const DECODE_STEPS: usize = 32;
const BATCHES: [usize; 2] = [1, 32];
const DTYPE: DType = DType::BF16;

/// A model to time: its name, how many layers run, and how many the full model has.
struct Spec {
    name: String,
    layers: usize,
    full_layers: usize,
}

/// Bytes of bf16 weights one step reads: every layer's projections and norms, the final norm and
/// the LM head (the embedding when tied), for `layers` layers like `spec`.
fn weight_bytes(spec: &LayerSpec, layers: usize, vocab: usize) -> f64 {
    let (h, i) = (spec.hidden as f64, spec.intermediate() as f64);
    let qd = (spec.q_heads * spec.head_dim) as f64;
    let layer = h * spec.qkv_dim() as f64 + qd * h + 3.0 * h * i + 2.0 * h;
    2.0 * (layers as f64 * layer + h + vocab as f64 * h)
}

/// K and V bytes a decode step reads: `batch` sequences of `context` tokens, `layers` layers.
fn kv_bytes(spec: &LayerSpec, layers: usize, batch: usize, context: usize) -> f64 {
    (2 * batch * context * layers * spec.kv_heads * spec.head_dim * DTYPE.size()) as f64
}

/// GPU time of one step, split by events recorded after each layer.
struct Marks {
    total_ms: f64,
    /// Mean over the layers (the first includes the embedding lookup).
    per_layer_ms: f64,
    /// After the last layer: the row gather, final norm and LM head.
    head_ms: f64,
}

fn marked_step(device: &Device, model: &mut Model, batch: &[(usize, &[u32])]) -> Result<Marks> {
    let stream =
        device.cuda_stream().cloned().ok_or_else(|| llama_kernels::Error::CudaUnavailable("no stream".into()))?;
    let ctx = stream.context().clone();
    let event = || ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT));
    let start = cuda(event())?;
    cuda(start.record(&stream))?;
    let mut marks = Vec::new();
    model.step_observed(batch, Logits::Last, &mut |_, _| {
        let e = cuda(event())?;
        cuda(e.record(&stream))?;
        marks.push(e);
        Ok(())
    })?;
    let stop = cuda(event())?;
    cuda(stop.record(&stream))?;
    cuda(stop.synchronize())?;
    let last = marks.last().unwrap_or(&start);
    let layers_ms = f64::from(cuda(start.elapsed_ms(last))?);
    Ok(Marks {
        total_ms: f64::from(cuda(start.elapsed_ms(&stop))?),
        per_layer_ms: layers_ms / marks.len().max(1) as f64,
        head_ms: f64::from(cuda(last.elapsed_ms(&stop))?),
    })
}

struct Row {
    name: String,
    tokens: usize,
    wall_ms: f64,
    gpu_ms: f64,
    per_layer_ms: f64,
    head_ms: f64,
    /// Tokens per wall-clock second: prompt tokens / TTFT for a prefill, batch / step time for decode.
    tokens_per_s: f64,
    /// Bytes a decode step reads (0 for a prefill), and of them per layer (weights and K/V).
    bytes: f64,
    layer_bytes: f64,
}

impl Row {
    /// This row with `extra` more layers at the measured mean time per layer.
    fn estimate(&self, name: String, extra: usize) -> Row {
        let add = extra as f64 * self.per_layer_ms;
        let wall_ms = self.wall_ms + add;
        Row {
            name,
            tokens: self.tokens,
            wall_ms,
            gpu_ms: self.gpu_ms + add,
            per_layer_ms: self.per_layer_ms,
            head_ms: self.head_ms,
            tokens_per_s: self.tokens as f64 / (wall_ms * 1e-3),
            bytes: self.bytes + extra as f64 * self.layer_bytes,
            layer_bytes: self.layer_bytes,
        }
    }
}

/// Token ids spread over the vocabulary.
fn prompt(len: usize, vocab: usize, salt: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + salt * 104_729 + 13) % vocab) as u32).collect()
}

fn run_model(device: &Device, spec: &Spec, host: HostModel, quick: bool) -> Result<Vec<Row>> {
    let vocab = host.vocab();
    let layer_spec = host.layers[0].0;
    let t0 = Instant::now();
    let max_prompt = *PROMPTS.iter().max().unwrap_or(&CONTEXT);
    let plan = ModelPlan { slots: BATCHES[BATCHES.len() - 1], max_len: max_prompt + 256, max_tokens: max_prompt };
    let mut model = Model::new(device, &host, DTYPE, plan)?;
    drop(host);
    device.synchronize()?;
    println!("{}: uploaded and planned ({plan:?}) in {:.1} s", spec.name, t0.elapsed().as_secs_f64());
    let (reps, steps) = if quick { (1, 2) } else { (3, DECODE_STEPS) };
    let mut rows = Vec::new();

    let one = |n: usize| GenerateOptions {
        max_new_tokens: n,
        stop: Default::default(),
        sampling: SamplingConfig::GREEDY,
        seed: 0,
    };
    for &p in PROMPTS.iter().filter(|&&p| !quick || p == 128) {
        let ids = prompt(p, vocab, p);
        model.generate(0, &ids, &one(1), &mut |_| true)?; // warm-up
        let mut ttft = 0.0;
        for _ in 0..reps {
            ttft += model.generate(0, &ids, &one(1), &mut |_| true)?.time_to_first_token.as_secs_f64() * 1e3;
        }
        let ttft = ttft / reps as f64;
        let m = marked_step(device, &mut model, &[(0, &ids)])?;
        model.clear(0);
        rows.push(Row {
            name: format!("{} prefill {p}", spec.name),
            tokens: p,
            wall_ms: ttft,
            gpu_ms: m.total_ms,
            per_layer_ms: m.per_layer_ms,
            head_ms: m.head_ms,
            tokens_per_s: p as f64 / (ttft * 1e-3),
            bytes: 0.0,
            layer_bytes: 0.0,
        });
    }

    for &b in &BATCHES {
        // A CONTEXT-token prompt in each of b slots, prefilled as many sequences per step as fit.
        let prompts: Vec<Vec<u32>> = (0..b).map(|s| prompt(CONTEXT, vocab, s)).collect();
        let per_step = (plan.max_tokens / CONTEXT).max(1);
        for first in (0..b).step_by(per_step) {
            let batch: Vec<(usize, &[u32])> =
                (first..(first + per_step).min(b)).map(|s| (s, prompts[s].as_slice())).collect();
            model.step(&batch, Logits::Last)?;
        }
        let tokens: Vec<[u32; 1]> = (0..b).map(|s| [(s * 31 % vocab) as u32]).collect();
        let batch: Vec<(usize, &[u32])> = tokens.iter().enumerate().map(|(s, t)| (s, t.as_slice())).collect();
        for _ in 0..2 {
            model.step(&batch, Logits::Last)?;
        }
        device.synchronize()?;
        let start = Instant::now();
        let gpu_ms = device
            .time_with_events(steps, || model.step(&batch, Logits::Last).map(|_| ()))?
            .ok_or_else(|| llama_kernels::Error::CudaUnavailable("CUDA events".into()))?;
        let wall_ms = start.elapsed().as_secs_f64() * 1e3 / steps as f64;
        let m = marked_step(device, &mut model, &batch)?;
        let context = model.len(0);
        for s in 0..b {
            model.clear(s);
        }
        rows.push(Row {
            name: format!("{} decode b{b} ctx{CONTEXT}", spec.name),
            tokens: b,
            wall_ms,
            gpu_ms: gpu_ms / steps as f64,
            per_layer_ms: m.per_layer_ms,
            head_ms: m.head_ms,
            tokens_per_s: b as f64 / (wall_ms * 1e-3),
            bytes: weight_bytes(&layer_spec, spec.layers, vocab) + kv_bytes(&layer_spec, spec.layers, b, context),
            layer_bytes: weight_bytes(&layer_spec, 1, 0) - weight_bytes(&layer_spec, 0, 0)
                + kv_bytes(&layer_spec, 1, b, context),
        });
    }

    // The decode loop as a caller runs it: sample on the device, read the id back, step.
    let ids = prompt(CONTEXT, vocab, 7);
    let g = model.generate(0, &ids, &one(steps + 1), &mut |_| true)?;
    let n = g.tokens.len().saturating_sub(1).max(1);
    let per_token_ms = g.decode_time.as_secs_f64() * 1e3 / n as f64;
    let decode_layer_ms =
        rows.iter().find(|r| r.name.ends_with(&format!("decode b1 ctx{CONTEXT}"))).map_or(f64::NAN, |r| r.per_layer_ms);
    rows.push(Row {
        name: format!("{} generate b1 ctx{CONTEXT}", spec.name),
        tokens: 1,
        wall_ms: per_token_ms,
        gpu_ms: f64::NAN,
        per_layer_ms: decode_layer_ms,
        head_ms: f64::NAN,
        tokens_per_s: 1e3 / per_token_ms,
        bytes: 0.0,
        layer_bytes: 0.0,
    });

    if spec.layers < spec.full_layers {
        let extra = spec.full_layers - spec.layers;
        let full = format!("{} est. {} layers", spec.name.split(' ').next().unwrap_or(""), spec.full_layers);
        let estimates: Vec<Row> = rows
            .iter()
            .map(|r| {
                let kind = r.name.split_once(" layers ").map_or(r.name.as_str(), |(_, k)| k);
                r.estimate(format!("{full} {kind}"), extra)
            })
            .collect();
        rows.extend(estimates);
    }
    Ok(rows)
}

fn print_rows(rows: &[Row], copy_gbs: f64) {
    println!(
        "\nModel summary (bf16; wall = host clock: TTFT for prefill rows, per step for decode, per token for \
         generate; GPU = CUDA events; per layer = mean event interval per layer; head = final norm + LM head)"
    );
    println!(
        "{:<46} {:>6} {:>10} {:>10} {:>10} {:>9} {:>11} {:>8} {:>7}",
        "case", "tokens", "wall ms", "GPU ms", "layer ms", "head ms", "tokens/s", "GB/s", "% copy"
    );
    let ms = |v: f64| if v.is_finite() { format!("{v:.3}") } else { "-".into() };
    for r in rows {
        let (gbs, pct) = if r.bytes > 0.0 {
            let gbs = r.bytes / (r.gpu_ms * 1e-3) / 1e9;
            (format!("{gbs:.0}"), format!("{:.1}%", 100.0 * gbs / copy_gbs))
        } else {
            ("-".into(), "-".into())
        };
        println!(
            "{:<46} {:>6} {:>10} {:>10} {:>10} {:>9} {:>11.1} {:>8} {:>7}",
            r.name,
            r.tokens,
            ms(r.wall_ms),
            ms(r.gpu_ms),
            ms(r.per_layer_ms),
            ms(r.head_ms),
            r.tokens_per_s,
            gbs,
            pct
        );
    }
}

fn llama_layers() -> usize {
    std::env::var("LLK_BENCH_LLAMA_LAYERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| (1..=LLAMA3_LAYERS).contains(n))
        .unwrap_or(2)
}

fn main() {
    let quick = std::env::args().any(|a| a == "--test");
    let llama = llama_layers();
    let gguf = test_model_path();
    let Some(device) = common::gpu_or_explain("model bench") else {
        println!(
            "\nWould time (bf16): prefill of {PROMPTS:?} prompt tokens (TTFT), decode at batch {BATCHES:?} after a"
        );
        println!("{CONTEXT}-token prompt ({DECODE_STEPS} steps), and generate at batch 1, for:");
        match &gguf {
            Ok(p) => println!("  SmolLM2-135M-Instruct from {}", p.display()),
            Err(why) => println!("  SmolLM2-135M shapes with random weights ({why})"),
        }
        println!(
            "  Llama 3 8B shapes with random weights, {llama} of {LLAMA3_LAYERS} layers, scaled to {LLAMA3_LAYERS}"
        );
        return;
    };
    let copy_gbs = common::copy_bandwidth_gbs(&device);
    let mut rows = Vec::new();
    let mut failed = false;

    let t0 = Instant::now();
    let (smol, host) = match &gguf {
        Ok(path) => {
            (Spec { name: "smollm2-135m gguf".into(), layers: 30, full_layers: 30 }, HostModel::open(path, DTYPE))
        }
        Err(why) => {
            println!(
                "note: {why}: timing SmolLM2-135M's shapes with random weights instead (rows `smollm2-135m random`)"
            );
            (
                Spec { name: "smollm2-135m random".into(), layers: 30, full_layers: 30 },
                random_host(SMOLLM2, SMOLLM2_VOCAB, true, 1),
            )
        }
    };
    match host {
        Ok(h) => {
            println!("{}: host weights in {:.1} s", smol.name, t0.elapsed().as_secs_f64());
            match run_model(&device, &smol, h, quick) {
                Ok(r) => rows.extend(r),
                Err(e) => {
                    println!("{}: FAILED: {e}", smol.name);
                    failed = true;
                }
            }
        }
        Err(e) => {
            println!("{}: cannot load: {e}", smol.name);
            failed = true;
        }
    }

    let t0 = Instant::now();
    let name = format!("llama3-8b random {llama}/{LLAMA3_LAYERS} layers");
    let config = LLAMA3_8B.replace("LAYERS", &llama.to_string());
    match random_host(&config, LLAMA3_VOCAB, false, 2) {
        Ok(h) => {
            println!("{name}: host weights drawn in {:.1} s", t0.elapsed().as_secs_f64());
            let spec = Spec { name: name.clone(), layers: llama, full_layers: LLAMA3_LAYERS };
            match run_model(&device, &spec, h, quick) {
                Ok(r) => rows.extend(r),
                Err(e) => {
                    println!("{name}: FAILED: {e}");
                    failed = true;
                }
            }
        }
        Err(e) => {
            println!("{name}: cannot build: {e}");
            failed = true;
        }
    }
    print_rows(&rows, copy_gbs);
    if llama < LLAMA3_LAYERS {
        println!(
            "\n`est. {LLAMA3_LAYERS} layers` rows: the measured {llama}-layer times plus {} layers at the measured mean \
             time per layer (the same for every layer of a dense Llama); set LLK_BENCH_LLAMA_LAYERS=32 to run them all.",
            LLAMA3_LAYERS - llama
        );
    }
    if failed {
        std::process::exit(1);
    }
}

/// A CUDA driver call's result as this crate's.
fn cuda<T>(r: std::result::Result<T, cudarc::driver::DriverError>) -> Result<T> {
    r.map_err(|e| llama_kernels::Error::from(e).into())
}
