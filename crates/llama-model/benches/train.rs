//! The LoRA / QLoRA training step (`train::LoraTrainer`, bf16) at Llama 3 8B's shapes with random
//! weights: tokens per second and device memory.
//!
//! Runs: peft's QLoRA recipe (the base quantized to NF4 in blocks of 64; LoRA r 16, alpha 32,
//! dropout 0.05 on all seven projections), the same with each layer's forward recomputed before
//! its backward (gradient checkpointing), and the same adapter on a dense bf16 base; micro-batches
//! of 2048 tokens (one sequence) and 4096 (two sequences of 2048, packed). Each run times
//! `micro_step` + `step` (forward, fused LM-head loss, backward, AdamW; the loss and the
//! optimizer's statistics read back, as a training loop does): one warm-up, then the mean of 3,
//! wall clock. The model has the first `LLK_BENCH_LLAMA_LAYERS` layers (default 2); the time of
//! 32 layers is estimated from runs with that many layers and one fewer (the difference is one
//! layer's time), marked `est.`. Memory: the device memory the trainer takes (free memory
//! before and after building it: weights, adapters, optimizer state, saved activations and
//! workspaces). Each run also prints a summary row (`qlora-nf4-step bf16 1x2048 llama3-8b-2l  <us>`)
//! for scripts/torch_compare.py, whose qlora section times peft + bitsandbytes on the same shapes.
//! Without a GPU this prints what it would measure and exits 0.

#[path = "../../llama-kernels/benches/common/mod.rs"]
mod common;
mod random;

use std::time::Instant;

use llama_kernels::ops::optimizer::AdamWConfig;
use llama_kernels::spec::lora::LoraConfig;
use llama_kernels::{DType, Device};
use llama_model::Result;
use llama_model::formats::peft::{Adapter, AdapterConfig, Projection};
use llama_model::model::HostModel;
use llama_model::train::{Batch, Example, LoraTrainer, TrainConfig, TrainPlan};
use random::{LLAMA3_8B, LLAMA3_LAYERS, LLAMA3_VOCAB, random_host};

const DTYPE: DType = DType::BF16;
const BATCHES: [(usize, usize); 2] = [(2048, 1), (4096, 2)];

fn layers() -> usize {
    std::env::var("LLK_BENCH_LLAMA_LAYERS").ok().and_then(|v| v.parse().ok()).filter(|&n| n >= 2).unwrap_or(2)
}

/// Free memory of `device`'s GPU, in bytes (0 if it cannot be read).
fn free_bytes(device: &Device) -> usize {
    let bound = device.cuda_stream().is_some_and(|s| s.context().bind_to_thread().is_ok());
    if !bound {
        return 0;
    }
    cudarc::driver::result::mem_get_info().map(|(free, _)| free).unwrap_or(0)
}

/// Mean seconds of one training step over 3 (after a warm-up), and the trainer's device bytes.
fn time_step(device: &Device, host: &HostModel, tokens: usize, seqs: usize, recompute: bool) -> Result<(f64, usize)> {
    let cfg = AdapterConfig::new(LoraConfig::QLORA, &Projection::ALL, None)?;
    let adapter = Adapter::init(cfg, &host.config, 1)?;
    let train = TrainConfig {
        adamw: AdamWConfig { max_grad_norm: Some(1.0), ..AdamWConfig::default() },
        grad_accum: 1,
        seed: 0,
    };
    device.synchronize()?;
    let before = free_bytes(device);
    let mut t = LoraTrainer::new(
        device,
        host,
        DTYPE,
        &adapter,
        train,
        TrainPlan { max_tokens: tokens, max_seqs: seqs, recompute },
    )?;
    device.synchronize()?;
    let taken = before.saturating_sub(free_bytes(device));
    let examples: Vec<Example> = (0..seqs)
        .map(|s| Example::text((0..tokens / seqs).map(|i| ((i * 7919 + s * 104_729) % LLAMA3_VOCAB) as u32).collect()))
        .collect();
    let batch = Batch::pack(&examples, host.vocab())?;
    let mut step = || -> Result<()> {
        t.micro_step(&batch)?;
        let loss = t.loss()?;
        let stats = t.step(2e-4)?;
        if !loss.is_finite() || stats.found_inf {
            return Err(llama_model::Error::invalid("train bench", "loss", loss, "not finite"));
        }
        Ok(())
    };
    step()?;
    let start = Instant::now();
    for _ in 0..3 {
        step()?;
    }
    Ok((start.elapsed().as_secs_f64() / 3.0, taken))
}

fn main() {
    let n = layers();
    let Some(device) = common::gpu_or_explain("train bench") else {
        println!("\nWould time (bf16) one LoRA training step (forward, loss, backward, AdamW) of micro-batches of");
        println!(
            "{BATCHES:?} (tokens, sequences) at Llama 3 8B's shapes, random weights, {n} and {} layers, scaled to",
            n - 1
        );
        println!("{LLAMA3_LAYERS}: QLoRA (NF4 base) and a dense bf16 base; LoRA r 16 on all seven projections.");
        return;
    };
    println!(
        "{:<34} {:>7} {:>12} {:>12} {:>12} {:>12}",
        "run", "tokens", "step s", "tokens/s", "est. 32L s", "device GiB"
    );
    for (base, nf4, recompute) in
        [("qlora nf4", true, false), ("qlora nf4 recompute", true, true), ("lora dense", false, false)]
    {
        for (tokens, seqs) in BATCHES {
            let mut times = Vec::new();
            let mut memory = 0;
            for layers in [n - 1, n] {
                let config = LLAMA3_8B.replace("LAYERS", &layers.to_string());
                let run = random_host(&config, LLAMA3_VOCAB, false, 7).and_then(|mut host| {
                    if nf4 {
                        host.quantize_nf4(64, DTYPE)?;
                    }
                    time_step(&device, &host, tokens, seqs, recompute)
                });
                match run {
                    Ok((secs, bytes)) => {
                        times.push(secs);
                        memory = bytes;
                    }
                    Err(e) => {
                        println!("{base} {tokens}x{seqs}: {e}");
                        break;
                    }
                }
            }
            if let [fewer, all] = times[..] {
                let est = all + (LLAMA3_LAYERS - n) as f64 * (all - fewer);
                println!(
                    "{:<34} {:>7} {:>12.4} {:>12.0} {:>12.3} {:>12.2}",
                    format!("{base} {n} layers ({seqs} seq)"),
                    tokens,
                    all,
                    tokens as f64 / all,
                    est,
                    memory as f64 / (1u64 << 30) as f64
                );
                println!(
                    "{:<34} {:>7} {:>12} {:>12.0}  (est.)",
                    format!("{base} 32 layers"),
                    tokens,
                    "",
                    tokens as f64 / est
                );
            }
        }
    }
}
