//! `cargo xtask`: the repository's tasks.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Repository tasks of llama-kernels.
#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Regenerates the Rust mirrors of kernels/params.h and kernels/emu/emu_abi.h with bindgen
    /// (libclang from scripts/setup.sh, or LIBCLANG_PATH).
    RegenParams {
        /// Only say whether the committed mirrors are fresh (fails when not).
        #[arg(long)]
        check: bool,
    },
    /// Regenerates kernels/prebuilt/ (PTX, cubins, ptxas reports, manifest) with the pinned nvcc
    /// of scripts/setup.sh; does nothing when the manifest already matches.
    RegenKernels {
        /// Rebuild even when the manifest matches.
        #[arg(long, conflicts_with = "check")]
        force: bool,
        /// Only say whether the committed copy is fresh (fails when not).
        #[arg(long)]
        check: bool,
    },
    /// Unpacks the committed device code (kernels/prebuilt/device-code.tar.zst) into DIR, each
    /// file checked against the manifest.
    UnpackPrebuilt {
        /// Where the sm_90/ and sm_80/ folders go.
        dir: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let (name, result) = match Cli::parse().task {
        Task::RegenParams { check } => ("regen-params", xtask::regen_params(check)),
        Task::RegenKernels { force, check } => ("regen-kernels", xtask::regen_kernels::run(force, check)),
        Task::UnpackPrebuilt { dir } => ("unpack-prebuilt", xtask::regen_kernels::unpack(&dir)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
