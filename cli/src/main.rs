//! `llama-kernels`: the command-line front end.
//!
//! ```text
//! llama-kernels verify [--target cuda|emulated] [--quick|--full]
//!                      [--checkpoint DIR [--layers 0,3] [--dtype bf16|f16|f32]]
//!                      [--model GGUF_OR_DIR [--weights stored|dense|nf4]]
//! llama-kernels generate --model GGUF_OR_DIR --prompt TEXT [--chat] [--max-new-tokens N]
//!                        [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S]
//!                        [--dtype f32|bf16|f16] [--target cuda|emulated] [--weights stored|dense|nf4]
//! llama-kernels info [--perf [--json]]
//! ```
//!
//! `generate` loads a model with its tokenizer, chat template and stop ids, and streams the reply
//! to stdout (`--chat`: the prompt as one user turn of the chat template; temperature 0, the
//! default, is greedy; the dtype defaults to f32 for GGUF files and bf16 for checkpoint
//! directories; `--weights` picks how the projections run: `stored`, the default, keeps a GGUF
//! file's quantized projections packed, `dense` dequantizes them at load, `nf4` quantizes a dense
//! checkpoint at load); stderr gets the prompt and generated token counts, the time to first token and
//! the decode speed.
//!
//! `verify` runs decoder layers (built-in Llama 3 and Llama 4 configs with seeded random
//! weights, or the layers of a Hugging Face checkpoint directory) through the block composer on
//! the best target present (CUDA, else emulated) and prints a stage-by-stage table against the
//! f64 reference composer, then the whole model of `--model` (a GGUF file or a checkpoint
//! directory; by default the SmolLM2-135M-Instruct GGUF that `scripts/setup.sh` fetches) on a
//! built-in prompt and two decode steps (every layer stage-local, the next-token distributions
//! by KL divergence), then every op against its reference and prints the per-op table; it exits
//! non-zero if any row fails. `info` prints the target, the device, the PTX
//! architecture, where the device code came from (compiled by nvcc, or the prebuilt copy) and
//! each kernel's registers and spills; `info --perf` prints the static performance report, a model
//! of the sm_90 SASS on an H200 (predictions, not measurements), and `info --perf --json` the same
//! report as one JSON document: `kernels` (module, kernel, shape, bound, `predicted` {value, unit,
//! text}, `predicted_fraction_of_copy` for memory-bound kernels or `predicted_tflops` for matrix
//! ones, resources, blocks and warps per SM), `calibration` (each peer's published figure against
//! the model: peer, kind, workload, unit, published, predicted, error, source) and
//! `"measured": false`.
//! A build with external device code (`LLK_DEVICE_CODE_LOCATION=external`) reads it from
//! `$LLK_DEVICE_CODE_DIR`; `info` names that folder and fails, saying why, when it cannot be used.

use std::process::ExitCode;

use llama_kernels::backend;
use llama_kernels::dev::verify::block as verify_block;
use llama_kernels::dev::{inspect, verify};
use llama_kernels::model::WeightFormat;
use llama_kernels::{DType, Device, Target};

const USAGE: &str = "usage: llama-kernels generate --model PATH --prompt TEXT [--chat] [--max-new-tokens N] [--temperature T] [--top-k K] [--top-p P] [--min-p P] [--seed S] [--dtype f32|bf16|f16] [--target cuda|emulated] [--weights stored|dense|nf4]\n       llama-kernels verify [--target cuda|emulated] [--quick|--full] [--checkpoint DIR [--layers 0,3] [--dtype bf16|f16|f32]] [--model GGUF_OR_DIR [--weights stored|dense|nf4]]\n       llama-kernels info [--perf [--json]]";

fn pick_device(target: Option<&str>) -> Result<Device, String> {
    match target {
        None => Ok(Device::best()),
        Some("cuda") => Device::cuda(0).map_err(|e| e.to_string()),
        Some("emulated") => Ok(Device::emulated()),
        Some(other) => Err(format!("unknown target `{other}` (cuda, emulated)")),
    }
}

/// `<|im_start|>user\nWhat is the capital of France?` in SmolLM2's vocabulary (byte-level BPE):
/// the built-in prompt of `verify`'s model check, followed by two decode steps.
/// The question `verify` asks the model after checking it.
const CHAT_PROMPT: &str = "What is the capital of France?";

const MODEL_PROMPT: [u32; 10] = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47];

/// `--weights`: how the projections run.
fn weight_format(value: Option<&str>) -> Result<WeightFormat, String> {
    match value {
        None | Some("stored") => Ok(WeightFormat::AsStored),
        Some("dense") => Ok(WeightFormat::Dense),
        Some("nf4") => Ok(WeightFormat::Nf4),
        Some(other) => Err(format!("unknown --weights `{other}` (stored, dense, nf4)")),
    }
}

/// The whole model of a GGUF file or checkpoint directory against the f64 reference.
fn check_model_file(
    device: &Device,
    path: &std::path::Path,
    dtype: DType,
    weights: WeightFormat,
) -> llama_kernels::Result<verify::model::ModelReport> {
    let mut host = llama_kernels::model::HostModel::open(path, dtype)?;
    host.set_weight_format(weights, dtype)?;
    let vocab = host.vocab() as u32;
    // Ids of another vocabulary are folded into this one (the check needs valid ids, not text).
    let prompt: Vec<u32> = MODEL_PROMPT.iter().map(|&t| t % vocab).collect();
    verify::model::check_model(device, &host, dtype, &[prompt, vec![2 % vocab], vec![198 % vocab]])
}

/// `generate`: the reply to `--prompt` streamed to stdout, counts and speeds on stderr.
fn generate(flag_value: &dyn Fn(&str) -> Option<String>, chat: bool) -> Result<(), String> {
    let path = flag_value("--model").ok_or("--model PATH is required (a GGUF file or a checkpoint directory)")?;
    let path = std::path::PathBuf::from(path);
    let prompt = flag_value("--prompt").ok_or("--prompt TEXT is required")?;
    let num = |name: &str, default: f64| -> Result<f64, String> {
        flag_value(name)
            .map_or(Ok(default), |v| v.parse::<f64>().map_err(|_| format!("{name} takes a number, not `{v}`")))
    };
    let max_new = num("--max-new-tokens", 64.0)? as usize;
    let sampling = llama_kernels::model::SamplingConfig {
        temperature: num("--temperature", 0.0)? as f32,
        top_k: num("--top-k", 0.0)? as i32,
        top_p: num("--top-p", 1.0)? as f32,
        min_p: num("--min-p", 0.0)? as f32,
    };
    let seed = num("--seed", 0.0)? as u64;
    let dtype = match flag_value("--dtype").as_deref() {
        None => llama_kernels::model::default_dtype(&path),
        Some("f32") => DType::F32,
        Some("bf16") => DType::BF16,
        Some("f16") => DType::F16,
        Some(other) => return Err(format!("unknown dtype `{other}` (f32, bf16, f16)")),
    };
    let weights = weight_format(flag_value("--weights").as_deref())?;
    let device = pick_device(flag_value("--target").as_deref())?;
    let mut tm = llama_kernels::model::TextModel::open_with(&device, &path, dtype, (4096, 256), weights)
        .map_err(|e| e.to_string())?;
    let ids = tm.prompt_ids(&prompt, chat).map_err(|e| e.to_string())?;
    if ids.len() + max_new > 4096 {
        return Err(format!("{} prompt tokens + {max_new} new exceed the 4096-token plan", ids.len()));
    }
    use std::io::Write;
    let mut out = std::io::stdout();
    let (_, g) = tm
        .generate(&ids, max_new, sampling, seed, &mut |piece| {
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        })
        .map_err(|e| e.to_string())?;
    println!();
    let decoded = g.tokens.len().saturating_sub(1);
    let per_s = if g.decode_time.as_secs_f64() > 0.0 { decoded as f64 / g.decode_time.as_secs_f64() } else { 0.0 };
    eprintln!(
        "{} ({dtype}, {}): {} prompt tokens, {} generated ({:?}); time to first token {:.3} s, decode {per_s:.2} tokens/s",
        path.display(),
        device.target(),
        ids.len(),
        g.tokens.len(),
        g.reason,
        g.time_to_first_token.as_secs_f64()
    );
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let flag_value = |name: &str| args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str);
    match args.first().map(String::as_str) {
        Some("verify") => {
            let device = match pick_device(flag_value("--target")) {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("verify: {e}");
                    return ExitCode::FAILURE;
                }
            };
            // Full-size shapes on a GPU; shapes small enough for the emulator otherwise.
            let quick = if args.iter().any(|a| a == "--full") {
                false
            } else {
                args.iter().any(|a| a == "--quick") || device.target() == Target::Emulated
            };
            println!("target: {} ({})", device.target(), device.description());
            if let Some(reason) = Device::cuda_unavailable_reason().filter(|_| device.target() == Target::Emulated) {
                println!("note: {reason}");
            }
            // The block stage table: built-in layers, or a checkpoint's.
            let blocks = match flag_value("--checkpoint") {
                Some(dir) => {
                    let layers: Result<Vec<usize>, _> = flag_value("--layers")
                        .map(|l| l.split(',').filter(|s| !s.is_empty()).map(|s| s.trim().parse::<usize>()).collect())
                        .unwrap_or(Ok(Vec::new()));
                    let Ok(layers) = layers else {
                        eprintln!("verify: --layers takes comma-separated layer indices (0,3)");
                        return ExitCode::FAILURE;
                    };
                    let dtype = match flag_value("--dtype").unwrap_or("bf16") {
                        "bf16" => DType::BF16,
                        "f16" => DType::F16,
                        "f32" => DType::F32,
                        other => {
                            eprintln!("verify: unknown dtype `{other}` (bf16, f16, f32)");
                            return ExitCode::FAILURE;
                        }
                    };
                    println!("\nblocks: checkpoint {dir}, layers {layers:?} (all when empty), {dtype}");
                    verify_block::run_checkpoint(&device, std::path::Path::new(dir), &layers, dtype)
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
            let model = match flag_value("--model") {
                Some(p) => Some(std::path::PathBuf::from(p)),
                None => match llama_kernels::dev::testing::test_model_path() {
                    Ok(p) => Some(p),
                    Err(why) => {
                        println!(
                            "
model: not checked ({why})"
                        );
                        None
                    }
                },
            };
            let mut model_failed = None;
            if let Some(path) = model {
                let dtype = match flag_value("--dtype").unwrap_or("bf16") {
                    "f16" => DType::F16,
                    "f32" => DType::F32,
                    _ => DType::BF16,
                };
                println!(
                    "
model: {} ({dtype}, weights {}), {} prompt tokens then 2 decode steps",
                    path.display(),
                    flag_value("--weights").unwrap_or("stored"),
                    MODEL_PROMPT.len()
                );
                let weights = match weight_format(flag_value("--weights")) {
                    Ok(w) => w,
                    Err(e) => {
                        eprintln!("verify: {e}");
                        return ExitCode::FAILURE;
                    }
                };
                match check_model_file(&device, &path, dtype, weights) {
                    Ok(report) => {
                        print!("{}", report.describe(dtype));
                        if !report.pass {
                            model_failed = Some(format!("model {}: outside tolerance", path.display()));
                        }
                    }
                    Err(e) => model_failed = Some(format!("model {}: {e}", path.display())),
                }
                // Then a short reply, greedy, in the model's default dtype.
                let reply = (|| -> llama_kernels::Result<String> {
                    let dtype = llama_kernels::model::default_dtype(&path);
                    let mut tm = llama_kernels::model::TextModel::open(&device, &path, dtype, 256, 128)?;
                    let ids = tm.prompt_ids(CHAT_PROMPT, tm.template.is_some())?;
                    let sampling = llama_kernels::model::SamplingConfig::GREEDY;
                    let (text, g) = tm.generate(&ids, 16, sampling, 0, &mut |_| {})?;
                    Ok(format!("{text:?} ({dtype}, {} tokens, {:?})", g.tokens.len(), g.reason))
                })();
                match reply {
                    Ok(r) => println!("reply to {CHAT_PROMPT:?}: {r}"),
                    Err(e) => model_failed = Some(format!("model {}: generate: {e}", path.display())),
                }
            }

            println!("\nops:");
            let results = verify::run_all(&device, quick);
            print!("{}", verify::table(&results));
            let mut failed: Vec<String> = results
                .iter()
                .filter_map(|r| match r {
                    Ok(c) if c.pass => None,
                    Ok(c) => Some(c.describe()),
                    Err((case, e)) => Some(format!("{case}: {e}")),
                })
                .collect();
            println!("{} of {} cases passed", results.len() - failed.len(), results.len());
            failed.extend(verify_block::failures(&blocks));
            failed.extend(model_failed);
            for f in &failed {
                println!("FAILED: {f}");
            }
            if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some("generate") => {
            let owned = |name: &str| flag_value(name).map(str::to_string);
            match generate(&owned, args.iter().any(|a| a == "--chat")) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("generate: {e}");
                    ExitCode::FAILURE
                }
            }
        }
        Some("info") if args.iter().any(|a| a == "--perf") && args.iter().any(|a| a == "--json") => {
            println!("{}", inspect::perf_json::report_json_text());
            ExitCode::SUCCESS
        }
        Some("info") if args.iter().any(|a| a == "--perf") => {
            print!("{}", inspect::perf::report());
            if let Some(occupancy) = inspect::perf::driver_occupancy(&Device::best()) {
                print!("\n{occupancy}");
            }
            ExitCode::SUCCESS
        }
        Some("info") => {
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
            let resources = match inspect::all_resources(arch) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("llama-kernels info: {e}");
                    return ExitCode::FAILURE;
                }
            };
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
            ExitCode::SUCCESS
        }
        _ => {
            eprintln!("{USAGE}");
            ExitCode::FAILURE
        }
    }
}
