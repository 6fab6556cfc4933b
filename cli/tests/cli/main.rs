//! The command line as a user runs it: argument errors are named by clap before anything is
//! loaded, with exit status 2 and the offending option in the message.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llama-kernels")).args(args).output().expect("the CLI binary runs")
}

#[test]
fn every_command_has_help() {
    for cmd in ["verify", "generate", "info"] {
        let out = run(&[cmd, "--help"]);
        assert!(out.status.success(), "{cmd} --help: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"), "{cmd} --help printed no usage");
    }
}

#[test]
fn counts_out_of_range_are_named_errors() {
    // A model path that does not exist: the count must be refused before the model is opened.
    let missing = "/nonexistent/model.gguf";
    for value in ["0", "4097", "18446744073709551615", "99999999999999999999999", "-1"] {
        let arg = format!("--max-new-tokens={value}");
        let out = run(&["generate", "--model", missing, "--prompt", "hi", &arg]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--max-new-tokens {value}: {err}");
        assert!(err.contains("--max-new-tokens"), "--max-new-tokens {value}: {err}");
        assert!(!err.contains("panicked"), "--max-new-tokens {value}: {err}");
    }
}

/// A fixture GGUF file of the model crate (see its tests/fixtures/gguf_arch).
fn fixture(name: &str) -> String {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/llama-model/tests/fixtures/gguf_arch");
    root.join(name).join("model.gguf").display().to_string()
}

#[test]
fn info_model_names_the_architecture_and_how_each_type_runs() {
    let out = run(&["info", "--model", &fixture("llama4_q5")]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("architecture: llama4 (4 layers"), "{text}");
    assert!(text.contains("MoE layers (4 experts of 32, top 2, shared expert): [1, 3]"), "{text}");
    for line in ["packed on the device (q5_0)", "packed on the device (q5_1)", "packed on the device (q5_k)"] {
        assert!(text.contains(line), "{line}: {text}");
    }
    let out = run(&["info", "--model", "/nonexistent/model.gguf"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

#[test]
fn generate_runs_a_llama4_gguf_on_the_emulated_target() {
    let model = fixture("llama4_q5");
    let args = ["generate", "--model", &model, "--prompt", "the cat", "--max-new-tokens", "4", "--target", "emulated"];
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("4 generated") || err.contains("generated (Stop"), "{err}");
    assert!(!String::from_utf8_lossy(&out.stdout).trim().is_empty(), "{out:?}");
}
