//! `llama-kernels`: the command-line front end (`llama-kernels --help`, and `--help` after each
//! command).
//!
//! * `verify` runs decoder layers (built-in Llama 3 and Llama 4 configs with seeded random
//!   weights, or the layers of a Hugging Face checkpoint directory) through the block composer
//!   on the best target present (CUDA, else emulated) and prints a stage-by-stage table against
//!   the f64 reference composer; then the whole model of `--model` (a GGUF file or a checkpoint
//!   directory; by default the SmolLM2-135M-Instruct GGUF that `scripts/setup.sh` fetches) on a
//!   built-in prompt and two decode steps (every layer stage-local, the next-token distributions
//!   by KL divergence) and its greedy reply to a question; then every op against its reference.
//!   It exits non-zero if any row fails.
//! * `generate` loads a model with its tokenizer, chat template and stop ids, and streams the
//!   reply to stdout; stderr gets the prompt and generated token counts, the time to first
//!   token and the decode speed.
//! * `finetune` trains a LoRA adapter (QLoRA by default: an NF4 base) on a JSON-lines data set
//!   with a progress bar and an optional loss log, and writes it in peft's format; `generate
//!   --adapter` runs with it.
//! * `info` prints the target, the device, the PTX architecture, where the device code came
//!   from and each kernel's registers and spills; `info --model FILE` a GGUF file's
//!   architecture, configuration, tensor types and how each runs (packed or dequantized); `info --perf` the static performance report (a
//!   model of the sm_90 SASS on an H200: predictions, not measurements), `--json` the same as
//!   one JSON document. A build with external device code (`LLK_DEVICE_CODE_LOCATION=external`)
//!   reads it from `$LLK_DEVICE_CODE_DIR`; `info` names that folder and fails, saying why, when
//!   it cannot be used.

mod finetune;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};
use llama_kernels::dev::verify;
use llama_kernels::{DType, Device, Target, backend};
use llama_kernels_inspect as inspect;
use llama_model::dev::verify::block as verify_block;
use llama_model::dev::verify::model as verify_model;
use llama_model::model::{SamplingConfig, TextModel, WeightFormat, default_dtype};

/// Hand-written CUDA kernels for Llama, checked against an f64 reference on a GPU or on the
/// emulated target.
#[derive(Parser)]
#[command(name = "llama-kernels", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Check decoder layers stage by stage, a whole model, and every op against the f64
    /// reference; print the tables; exit non-zero on any failure.
    Verify(VerifyArgs),
    /// Generate text with a model (a GGUF file, or a checkpoint directory with tokenizer.json):
    /// the reply streams to stdout; counts and speeds go to stderr.
    Generate(GenerateArgs),
    /// Train a LoRA adapter (QLoRA: an NF4 base by default) on JSON lines of {"text"} or chat
    /// {"messages"} (the loss on assistant turns only) and write it in peft's format.
    Finetune(finetune::FinetuneArgs),
    /// Print the target, the device, where the device code came from and each kernel's
    /// resources; or, with --perf, the static performance report.
    Info(InfoArgs),
}

/// Where kernels run.
#[derive(Clone, Copy, ValueEnum)]
enum TargetArg {
    /// The GPU (device 0).
    Cuda,
    /// The same kernels on the CPU, through the emulator.
    Emulated,
}

/// A run dtype.
#[derive(Clone, Copy, ValueEnum)]
enum DTypeArg {
    F32,
    Bf16,
    F16,
}

impl From<DTypeArg> for DType {
    fn from(d: DTypeArg) -> DType {
        match d {
            DTypeArg::F32 => DType::F32,
            DTypeArg::Bf16 => DType::BF16,
            DTypeArg::F16 => DType::F16,
        }
    }
}

/// How a model's projections run.
#[derive(Clone, Copy, ValueEnum, Default)]
enum WeightsArg {
    /// As the file stores them (a GGUF file's quantized projections packed).
    #[default]
    Stored,
    /// Every projection dense in the run dtype (dequantized at load).
    Dense,
    /// Every projection packed in NF4 (a dense checkpoint quantized at load).
    Nf4,
}

impl From<WeightsArg> for WeightFormat {
    fn from(w: WeightsArg) -> WeightFormat {
        match w {
            WeightsArg::Stored => WeightFormat::AsStored,
            WeightsArg::Dense => WeightFormat::Dense,
            WeightsArg::Nf4 => WeightFormat::Nf4,
        }
    }
}

#[derive(Args)]
struct VerifyArgs {
    /// Where to run (default: the GPU if one is usable, else the emulator).
    #[arg(long, value_enum)]
    target: Option<TargetArg>,
    /// Shapes small enough for the emulator (the default there).
    #[arg(long, conflicts_with = "full")]
    quick: bool,
    /// Full-size shapes, even on the emulator.
    #[arg(long)]
    full: bool,
    /// The layers of a Hugging Face checkpoint directory instead of the built-in ones.
    #[arg(long, value_name = "DIR")]
    checkpoint: Option<PathBuf>,
    /// Layer indices of --checkpoint, comma-separated (default: all).
    #[arg(long, value_delimiter = ',', requires = "checkpoint")]
    layers: Vec<usize>,
    /// The run dtype of the checkpoint layers and of the model check.
    #[arg(long, value_enum, default_value = "bf16")]
    dtype: DTypeArg,
    /// The model to check (a GGUF file or a checkpoint directory; default: the test model
    /// scripts/setup.sh fetches).
    #[arg(long, value_name = "GGUF_OR_DIR")]
    model: Option<PathBuf>,
    /// How the model's projections run.
    #[arg(long, value_enum, default_value = "stored")]
    weights: WeightsArg,
}

/// Tokens of context `generate` plans for (prompt and reply together).
const CONTEXT: usize = 4096;

#[derive(Args)]
struct GenerateArgs {
    /// A GGUF file or a checkpoint directory.
    #[arg(long, value_name = "GGUF_OR_DIR")]
    model: PathBuf,
    /// The prompt.
    #[arg(long)]
    prompt: String,
    /// The prompt as one user turn of the model's chat template.
    #[arg(long)]
    chat: bool,
    /// Tokens to generate at most (1 to 4096, the context `generate` plans; prompt and reply
    /// together must fit it).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..=CONTEXT as i64))]
    max_new_tokens: u32,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep the k most likely tokens (0: all).
    #[arg(long, default_value_t = 0)]
    top_k: i32,
    /// Keep the most likely tokens whose probabilities sum to p.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Drop tokens less likely than min-p times the most likely one.
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// The sampler's seed.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// The run dtype (default: f32 for GGUF files, bf16 for checkpoint directories).
    #[arg(long, value_enum)]
    dtype: Option<DTypeArg>,
    /// Where to run (default: the GPU if one is usable, else the emulator).
    #[arg(long, value_enum)]
    target: Option<TargetArg>,
    /// How the projections run.
    #[arg(long, value_enum, default_value = "stored")]
    weights: WeightsArg,
    /// A LoRA adapter directory in peft's format (from `finetune` or peft), merged into the base.
    #[arg(long, value_name = "ADAPTER_DIR")]
    adapter: Option<PathBuf>,
}

#[derive(Args)]
struct InfoArgs {
    /// A GGUF file: print its architecture, configuration, the tensor types it holds and how
    /// each runs (packed on the device or dequantized at load), without loading it.
    #[arg(long, value_name = "FILE", conflicts_with = "perf")]
    model: Option<PathBuf>,
    /// The static performance report (predictions of a model of the sm_90 SASS on an H200).
    #[arg(long)]
    perf: bool,
    /// The performance report as one JSON document.
    #[arg(long, requires = "perf")]
    json: bool,
}

fn pick_device(target: Option<TargetArg>) -> Result<Device, String> {
    match target {
        None => Ok(Device::best()),
        Some(TargetArg::Cuda) => Device::cuda(0).map_err(|e| e.to_string()),
        Some(TargetArg::Emulated) => Ok(Device::emulated()),
    }
}

/// The question `verify` asks the model after checking it.
const CHAT_PROMPT: &str = "What is the capital of France?";

/// `<|im_start|>user\nWhat is the capital of France?` in SmolLM2's vocabulary (byte-level BPE):
/// the built-in prompt of `verify`'s model check, followed by two decode steps.
const MODEL_PROMPT: [u32; 10] = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47];

/// The whole model of a GGUF file or checkpoint directory against the f64 reference.
fn check_model_file(
    device: &Device,
    path: &Path,
    dtype: DType,
    weights: WeightFormat,
) -> llama_model::Result<verify_model::ModelReport> {
    let mut host = llama_model::HostModel::open(path, dtype)?;
    host.set_weight_format(weights, dtype)?;
    let vocab = host.vocab() as u32;
    // Ids of another vocabulary are folded into this one (the check needs valid ids, not text).
    let prompt: Vec<u32> = MODEL_PROMPT.iter().map(|&t| t % vocab).collect();
    verify_model::check_model(device, &host, dtype, &[prompt, vec![2 % vocab], vec![198 % vocab]])
}

/// `verify`: the block, model and op tables; the failures, named.
fn run_verify(args: &VerifyArgs) -> Result<Vec<String>, String> {
    let device = pick_device(args.target)?;
    // Full-size shapes on a GPU; shapes small enough for the emulator otherwise.
    let quick = !args.full && (args.quick || device.target() == Target::Emulated);
    println!("target: {} ({})", device.target(), device.description());
    if let Some(reason) = Device::cuda_unavailable_reason().filter(|_| device.target() == Target::Emulated) {
        println!("note: {reason}");
    }
    let dtype = DType::from(args.dtype);
    // The block stage table: built-in layers, or a checkpoint's.
    let blocks = match &args.checkpoint {
        Some(dir) => {
            println!("\nblocks: checkpoint {}, layers {:?} (all when empty), {dtype}", dir.display(), args.layers);
            verify_block::run_checkpoint(&device, dir, &args.layers, dtype)
        }
        None => {
            println!(
                "\nblocks: built-in Llama 3 and Llama 4 layers, seeded random weights; a varlen prefill, a chunked prefill after a cached prefix, decode steps"
            );
            verify_block::run_blocks(&device, quick)
        }
    };
    print!("{}", verify_block::stage_table(&blocks));
    let (block_total, block_passed) = verify_block::counts(&blocks);
    println!("{block_passed} of {block_total} stage rows passed");

    // The whole model: --model PATH, else the test model when scripts/setup.sh fetched it.
    let model = match &args.model {
        Some(p) => Some(p.clone()),
        None => match llama_model::dev::testing::test_model_path() {
            Ok(p) => Some(p),
            Err(why) => {
                println!("\nmodel: not checked ({why})");
                None
            }
        },
    };
    let mut failed = Vec::new();
    if let Some(path) = model {
        let weights = WeightFormat::from(args.weights);
        println!(
            "\nmodel: {} ({dtype}, weights {}), {} prompt tokens then 2 decode steps",
            path.display(),
            args.weights.to_possible_value().map_or_else(String::new, |v| v.get_name().to_string()),
            MODEL_PROMPT.len()
        );
        match check_model_file(&device, &path, dtype, weights) {
            Ok(report) => {
                print!("{}", report.describe(dtype));
                if !report.pass {
                    failed.push(format!("model {}: outside tolerance", path.display()));
                }
            }
            Err(e) => failed.push(format!("model {}: {e}", path.display())),
        }
        // Then a short reply, greedy, in the model's default dtype.
        let reply = (|| -> llama_model::Result<String> {
            let dtype = default_dtype(&path);
            let mut tm = TextModel::open(&device, &path, dtype, 256, 128)?;
            let ids = tm.prompt_ids(CHAT_PROMPT, tm.template.is_some())?;
            let (text, g) = tm.generate(&ids, 16, SamplingConfig::GREEDY, 0, &mut |_| {})?;
            Ok(format!("{text:?} ({dtype}, {} tokens, {:?})", g.tokens.len(), g.reason))
        })();
        match reply {
            Ok(r) => println!("reply to {CHAT_PROMPT:?}: {r}"),
            Err(e) => failed.push(format!("model {}: generate: {e}", path.display())),
        }
    }

    println!("\nops:");
    let results = verify::run_all(&device, quick);
    print!("{}", verify::table(&results));
    let mut op_failed: Vec<String> = results
        .iter()
        .filter_map(|r| match r {
            Ok(c) if c.pass => None,
            Ok(c) => Some(c.describe()),
            Err((case, e)) => Some(format!("{case}: {e}")),
        })
        .collect();
    println!("{} of {} cases passed", results.len() - op_failed.len(), results.len());
    op_failed.extend(verify_block::failures(&blocks));
    op_failed.extend(failed);
    Ok(op_failed)
}

/// `generate`: the reply to `--prompt` streamed to stdout, counts and speeds on stderr.
fn run_generate(args: &GenerateArgs) -> Result<(), String> {
    let sampling =
        SamplingConfig { temperature: args.temperature, top_k: args.top_k, top_p: args.top_p, min_p: args.min_p };
    let dtype = args.dtype.map_or_else(|| default_dtype(&args.model), DType::from);
    let device = pick_device(args.target)?;
    let sizes = (CONTEXT, 256);
    let mut tm =
        TextModel::open_with_adapter(&device, &args.model, dtype, sizes, args.weights.into(), args.adapter.as_deref())
            .map_err(|e| e.to_string())?;
    let ids = tm.prompt_ids(&args.prompt, args.chat).map_err(|e| e.to_string())?;
    let max_new = args.max_new_tokens as usize;
    if ids.len().saturating_add(max_new) > CONTEXT {
        return Err(format!("{} prompt tokens + {max_new} new exceed the {CONTEXT}-token plan", ids.len()));
    }
    use std::io::Write;
    let mut out = std::io::stdout();
    let (_, g) = tm
        .generate(&ids, max_new, sampling, args.seed, &mut |piece| {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        })
        .map_err(|e| e.to_string())?;
    println!();
    let decoded = g.tokens.len().saturating_sub(1);
    let per_s = if g.decode_time.as_secs_f64() > 0.0 { decoded as f64 / g.decode_time.as_secs_f64() } else { 0.0 };
    eprintln!(
        "{} ({dtype}, {}): {} prompt tokens, {} generated ({:?}); time to first token {:.3} s, decode {per_s:.2} tokens/s",
        args.model.display(),
        device.target(),
        ids.len(),
        g.tokens.len(),
        g.reason,
        g.time_to_first_token.as_secs_f64()
    );
    Ok(())
}

/// `info`: the device, the device code and each kernel's resources, or the performance report.
fn run_info(args: &InfoArgs) -> Result<(), String> {
    if let Some(path) = &args.model {
        let file = llama_model::formats::gguf::GgufFile::open(path).map_err(|e| e.to_string())?;
        let report = llama_model::model::gguf::plan::FileReport::of(&file).map_err(|e| e.to_string())?;
        println!("model: {}", path.display());
        print!("{report}");
        return Ok(());
    }
    if args.json {
        println!("{}", inspect::perf_json::report_json_text());
        return Ok(());
    }
    if args.perf {
        print!("{}", inspect::perf::report());
        if let Some(occupancy) = inspect::perf::driver_occupancy(&Device::best()) {
            print!("\n{occupancy}");
        }
        return Ok(());
    }
    let device = Device::best();
    println!("target: {}", device.target());
    println!("device: {}", device.description());
    if let Some(reason) = Device::cuda_unavailable_reason() {
        println!("cuda:   {reason}");
    }
    let arch = device.ptx_arch().unwrap_or("sm_90");
    println!("device code: {}", backend::DEVICE_CODE_ORIGIN);
    if backend::DEVICE_CODE_EXTERNAL {
        let dir = std::env::var(backend::DEVICE_CODE_DIR_VAR).unwrap_or_else(|_| "(not set)".into());
        println!("device code dir: {}={dir}", backend::DEVICE_CODE_DIR_VAR);
    }
    let resources = inspect::all_resources(arch).map_err(|e| e.to_string())?;
    let isa = resources
        .first()
        .and_then(|(m, _)| m.ptx_sm90.lines().find_map(|l| l.trim().strip_prefix(".version ")))
        .unwrap_or("?");
    let built = if backend::DEVICE_CODE_EXTERNAL { "external" } else { "embedded" };
    println!("ptx:    {arch} ({built}: sm_90, sm_80; PTX ISA {isa})");
    println!("\n{:<32} {:>5} {:>12} {:>11} {:>10}", "kernel", "regs", "spill st/ld", "stack B", "smem B");
    for (module, kernels) in resources {
        println!("[{}]", module.name);
        for k in kernels {
            println!(
                "{:<32} {:>5} {:>12} {:>11} {:>10}",
                k.name,
                k.registers,
                format!("{}/{}", k.spill_stores, k.spill_loads),
                k.stack_bytes,
                k.smem_bytes
            );
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match &cli.command {
        Command::Verify(args) => match run_verify(args) {
            Ok(failed) => {
                for f in &failed {
                    println!("FAILED: {f}");
                }
                if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
            }
            Err(e) => {
                eprintln!("verify: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Generate(args) => match run_generate(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("generate: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Finetune(args) => match finetune::run(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("finetune: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Info(args) => match run_info(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("llama-kernels info: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
