//! `finetune`: LoRA / QLoRA on a JSON-lines data set, the adapter written in peft's format.

use std::io::Write;
use std::path::PathBuf;
use std::time::Instant;

use clap::{Args, ValueEnum};
use indicatif::{ProgressBar, ProgressStyle};
use llama_kernels::DType;
use llama_kernels::ops::optimizer::{AdamWConfig, LossScaling};
use llama_kernels::spec::lora::LoraConfig;
use llama_model::formats::peft::{Adapter, AdapterConfig, Projection};
use llama_model::model::{TextParts, WeightFormat};
use llama_model::train::{Batch, Encoder, LoraTrainer, LrSchedule, Schedule, TrainConfig, TrainPlan, micro_batches};

use super::{DTypeArg, TargetArg, pick_device};

/// The base model's weights during training.
#[derive(Clone, Copy, ValueEnum, Default)]
pub enum BaseWeights {
    /// QLoRA: every projection NF4 (bitsandbytes' blocks of 64), quantized at load.
    #[default]
    Nf4,
    /// Every projection dense in the run dtype.
    Dense,
    /// As the file stores them (a GGUF file's packed formats).
    Stored,
}

/// The learning-rate schedule after the warm-up.
#[derive(Clone, Copy, ValueEnum, Default)]
pub enum ScheduleArg {
    Constant,
    Linear,
    #[default]
    Cosine,
}

#[derive(Args)]
pub struct FinetuneArgs {
    /// A GGUF file or a checkpoint directory.
    #[arg(long, value_name = "GGUF_OR_DIR")]
    model: PathBuf,
    /// Training data, JSON lines: {"text": ...} or {"messages": [{"role", "content"}, ...]}.
    #[arg(long, value_name = "JSONL")]
    data: PathBuf,
    /// Where the adapter goes (adapter_config.json, adapter_model.safetensors); written only
    /// when training completes.
    #[arg(long, value_name = "ADAPTER_DIR")]
    out: PathBuf,
    /// The base's weights during training.
    #[arg(long, value_enum, default_value = "nf4")]
    base_weights: BaseWeights,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    lora_r: usize,
    /// LoRA alpha (the adapter's output is scaled by alpha / r).
    #[arg(long, default_value_t = 32.0)]
    lora_alpha: f64,
    /// Dropout on the adapter's input.
    #[arg(long, default_value_t = 0.05)]
    lora_dropout: f64,
    /// Scale by alpha / sqrt(r) (rsLoRA).
    #[arg(long)]
    rslora: bool,
    /// Adapted projections, comma-separated (q, k, v, o, gate, up, down).
    #[arg(long, value_delimiter = ',', default_value = "q,k,v,o,gate,up,down")]
    targets: Vec<String>,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Optimizer steps.
    #[arg(long, default_value_t = 100)]
    steps: usize,
    /// Tokens per micro-batch (examples packed, no padding); also the longest example.
    #[arg(long, default_value_t = 2048)]
    batch_tokens: usize,
    /// Gradient checkpointing: keep only each layer's input and recompute its forward before its
    /// backward (less memory, about a third more compute; the same gradients).
    #[arg(long)]
    recompute: bool,
    /// Micro-batches per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Warm-up steps.
    #[arg(long, default_value_t = 0)]
    warmup: usize,
    /// The schedule after the warm-up.
    #[arg(long, value_enum, default_value = "cosine")]
    schedule: ScheduleArg,
    /// Clip the gradients' global norm (0: no clipping).
    #[arg(long, default_value_t = 1.0)]
    max_grad_norm: f32,
    /// AdamW's decoupled weight decay.
    #[arg(long, default_value_t = 0.0)]
    weight_decay: f32,
    /// Seeds the adapter's initialization and every dropout mask.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The run dtype (f16 trains with dynamic loss scaling).
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DTypeArg,
    /// Where to run (default: the GPU if one is usable, else the emulator).
    #[arg(long, value_enum)]
    target: Option<TargetArg>,
    /// A loss log, one JSON object per step (step, loss, lr, grad_norm, tokens, seconds).
    #[arg(long, value_name = "FILE")]
    log: Option<PathBuf>,
    /// No progress bar (the log lines go to stderr instead).
    #[arg(long)]
    quiet: bool,
}

/// `finetune`: trains, then writes the adapter; every failure before that leaves `--out` as it was.
pub fn run(args: &FinetuneArgs) -> Result<(), String> {
    let err = |e: llama_model::Error| e.to_string();
    if args.steps == 0 || args.batch_tokens == 0 || args.grad_accum == 0 {
        return Err("--steps, --batch-tokens and --grad-accum must be at least 1".into());
    }
    let targets = args
        .targets
        .iter()
        .map(|t| {
            Projection::parse(t.trim())
                .ok_or_else(|| format!("--targets: unknown projection {t:?} (q, k, v, o, gate, up, down)"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let lora = LoraConfig { r: args.lora_r, alpha: args.lora_alpha, dropout: args.lora_dropout, rslora: args.rslora };
    let config = AdapterConfig::new(lora, &targets, Some(args.model.display().to_string())).map_err(err)?;
    let dtype = DType::from(args.dtype);
    let device = pick_device(args.target)?;
    let TextParts { mut host, tokenizer, template, stop: _ } = TextParts::open(&args.model, dtype).map_err(err)?;
    let weights = match args.base_weights {
        BaseWeights::Nf4 => WeightFormat::Nf4,
        BaseWeights::Dense => WeightFormat::Dense,
        BaseWeights::Stored => WeightFormat::AsStored,
    };
    host.set_weight_format(weights, dtype).map_err(err)?;
    let eos =
        template.as_ref().and_then(|t| t.eos_token()).and_then(|e| tokenizer.encode_literal(e, false).ok()).and_then(
            |ids| match ids[..] {
                [id] => Some(id),
                _ => None,
            },
        );
    let encoder = Encoder { tokenizer: &tokenizer, template: template.as_ref(), eos, max_len: args.batch_tokens };
    let examples = encoder.read_jsonl(&args.data).map_err(err)?;
    let batches: Vec<Batch> = micro_batches(&examples, args.batch_tokens, usize::MAX)
        .iter()
        .map(|b| Batch::pack(b, host.vocab()))
        .collect::<Result<_, _>>()
        .map_err(err)?;
    let max_seqs = batches.iter().map(|b| b.seq_lens.len()).max().unwrap_or(1);
    let adapter = Adapter::init(config, &host.config, args.seed).map_err(err)?;
    let adamw = AdamWConfig {
        weight_decay: args.weight_decay,
        max_grad_norm: (args.max_grad_norm > 0.0).then_some(args.max_grad_norm),
        loss_scaling: (dtype == DType::F16).then_some(LossScaling::default()),
        ..AdamWConfig::default()
    };
    let train = TrainConfig { adamw, grad_accum: args.grad_accum, seed: args.seed };
    let plan = TrainPlan { max_tokens: args.batch_tokens, max_seqs, recompute: args.recompute };
    let mut trainer = LoraTrainer::new(&device, &host, dtype, &adapter, train, plan).map_err(err)?;
    let schedule = LrSchedule {
        peak: args.lr,
        warmup: args.warmup,
        total: args.steps,
        kind: match args.schedule {
            ScheduleArg::Constant => Schedule::Constant,
            ScheduleArg::Linear => Schedule::Linear,
            ScheduleArg::Cosine => Schedule::Cosine,
        },
    };
    let mut log = match &args.log {
        Some(p) => Some(std::fs::File::create(p).map_err(|e| format!("{}: {e}", p.display()))?),
        None => None,
    };
    eprintln!(
        "finetune: {} ({dtype}, {}, base {}), {} examples in {} micro-batches of up to {} tokens; LoRA r {} alpha {} dropout {} on {:?}",
        args.model.display(),
        device.target(),
        match args.base_weights {
            BaseWeights::Nf4 => "nf4",
            BaseWeights::Dense => "dense",
            BaseWeights::Stored => "as stored",
        },
        examples.len(),
        batches.len(),
        args.batch_tokens,
        lora.r,
        lora.alpha,
        lora.dropout,
        targets.iter().map(|p| p.module()).collect::<Vec<_>>()
    );
    let bar = if args.quiet { ProgressBar::hidden() } else { ProgressBar::new(args.steps as u64) };
    bar.set_style(
        ProgressStyle::with_template("{bar:30} step {pos}/{len} {msg} [{elapsed} < {eta}]")
            .map_err(|e| e.to_string())?,
    );
    let start = Instant::now();
    let (mut tokens, mut next) = (0usize, 0usize);
    for step in 0..args.steps {
        let mut loss = 0.0f64;
        for _ in 0..args.grad_accum {
            let b = &batches[next % batches.len()];
            next += 1;
            trainer.micro_step(b).map_err(err)?;
            loss += f64::from(trainer.loss().map_err(err)?) / args.grad_accum as f64;
            tokens += b.tokens();
        }
        let lr = schedule.lr(step);
        let stats = trainer.step(lr).map_err(err)?;
        let secs = start.elapsed().as_secs_f64();
        let line = serde_json::json!({
            "step": step + 1, "loss": loss, "lr": lr, "grad_norm": stats.grad_norm,
            "skipped": stats.found_inf, "loss_scale": stats.loss_scale, "tokens": tokens, "seconds": secs,
        });
        if let Some(f) = log.as_mut() {
            writeln!(f, "{line}").map_err(|e| e.to_string())?;
        }
        if args.quiet {
            eprintln!("{line}");
        }
        bar.set_message(format!("loss {loss:.4} lr {lr:.2e} {:.0} tok/s", tokens as f64 / secs.max(1e-9)));
        bar.inc(1);
    }
    bar.finish();
    trainer.adapter().map_err(err)?.save(&args.out).map_err(err)?;
    eprintln!(
        "finetune: {} steps, {tokens} tokens in {:.1} s ({:.0} tokens/s); adapter written to {}",
        args.steps,
        start.elapsed().as_secs_f64(),
        tokens as f64 / start.elapsed().as_secs_f64().max(1e-9),
        args.out.display()
    );
    Ok(())
}
