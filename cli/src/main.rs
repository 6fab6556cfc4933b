//! `llama-kernels`: the command-line front end.
//!
//! ```text
//! llama-kernels verify [--target cuda|emulated] [--quick|--full]
//! llama-kernels info
//! ```
//!
//! `verify` runs every op on the best target present (CUDA, else emulated) against the f64
//! reference and prints a table; it exits non-zero if any case fails. `info` prints the target,
//! the device, the PTX architecture, where the device code came from (compiled by nvcc, or the
//! prebuilt copy) and each kernel's registers and spills.

use std::process::ExitCode;

use llama_kernels::{Device, Target, inspect, verify};

const USAGE: &str =
    "usage: llama-kernels verify [--target cuda|emulated] [--quick|--full]\n       llama-kernels info [--perf]";

fn pick_device(target: Option<&str>) -> Result<Device, String> {
    match target {
        None => Ok(Device::best()),
        Some("cuda") => Device::cuda(0).map_err(|e| e.to_string()),
        Some("emulated") => Ok(Device::emulated()),
        Some(other) => Err(format!("unknown target `{other}` (cuda, emulated)")),
    }
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
            let results = verify::run_all(&device, quick);
            print!("{}", verify::table(&results));
            let failed: Vec<String> = results
                .iter()
                .filter_map(|r| match r {
                    Ok(c) if c.pass => None,
                    Ok(c) => Some(c.describe()),
                    Err((case, e)) => Some(format!("{case}: {e}")),
                })
                .collect();
            println!("{} of {} cases passed", results.len() - failed.len(), results.len());
            for f in &failed {
                println!("FAILED: {f}");
            }
            if failed.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE }
        }
        Some("info") if args.iter().any(|a| a == "--perf") => {
            print!("{}", inspect::perf::report());
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
            let isa = llama_kernels::backend::kernel_modules()
                .next()
                .and_then(|m| m.ptx_sm90.lines().find_map(|l| l.trim().strip_prefix(".version ")))
                .unwrap_or("?");
            println!("ptx:    {arch} (embedded: sm_90, sm_80; PTX ISA {isa})");
            println!("device code: {}", llama_kernels::backend::DEVICE_CODE_ORIGIN);
            println!("\n{:<32} {:>5} {:>12} {:>11} {:>10}", "kernel", "regs", "spill st/ld", "stack B", "smem B");
            for (module, kernels) in inspect::all_resources(arch) {
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
