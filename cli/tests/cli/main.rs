//! The command line as a user runs it: argument errors are named by clap before anything is
//! loaded, with exit status 2 and the offending option in the message.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_llama-kernels")).args(args).output().expect("the CLI binary runs")
}

#[test]
fn every_command_has_help() {
    for cmd in ["verify", "generate", "finetune", "info"] {
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

/// The test model scripts/setup.sh fetches (SmolLM2-135M-Instruct, Q4_1), if present.
fn test_model() -> Option<String> {
    let path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../.cache/models/SmolLM2-135M-Instruct.Q4_1.gguf");
    path.is_file().then(|| path.display().to_string())
}

#[test]
fn finetune_trains_qlora_on_smollm2_and_generate_uses_the_adapter() {
    let Some(model) = test_model() else {
        eprintln!("skipped: the test model is not fetched (scripts/setup.sh)");
        return;
    };
    let data =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/llama-model/tests/fixtures/train/chat.jsonl");
    let dir = std::env::temp_dir().join(format!("llk-cli-finetune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (out_dir, log) = (dir.join("adapter"), dir.join("log.jsonl"));
    let (out_s, log_s, data_s) = (out_dir.display().to_string(), log.display().to_string(), data.display().to_string());
    // QLoRA (the default NF4 base) in bf16 on the emulator: two steps of up to 96 tokens.
    let args = [
        "finetune",
        "--model",
        &model,
        "--data",
        &data_s,
        "--out",
        &out_s,
        "--steps",
        "2",
        "--batch-tokens",
        "96",
        "--lr",
        "1e-3",
        "--target",
        "emulated",
        "--quiet",
        "--log",
        &log_s,
    ];
    let out = run(&args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("base nf4") && err.contains("adapter written"), "{err}");
    let lines: Vec<serde_json::Value> =
        std::fs::read_to_string(&log).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2);
    assert!(lines.iter().all(|l| l["loss"].as_f64().is_some_and(f64::is_finite) && l["skipped"] == false), "{lines:?}");
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("adapter_config.json")).unwrap()).unwrap();
    assert_eq!((config["peft_type"].as_str(), config["r"].as_u64()), (Some("LORA"), Some(16)));
    assert!(out_dir.join("adapter_model.safetensors").is_file());
    // generate runs with the adapter merged into the base.
    let args = [
        "generate",
        "--model",
        &model,
        "--adapter",
        &out_s,
        "--prompt",
        "What is the capital of France?",
        "--chat",
        "--max-new-tokens",
        "3",
        "--target",
        "emulated",
    ];
    let out = run(&args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // A data file that is not JSON lines, and r = 0: named errors, nothing written.
    let bad = dir.join("bad.jsonl");
    std::fs::write(&bad, "{\"text\": \"fine\"}\nnot json\n").unwrap();
    let none = dir.join("none");
    let none_s = none.display().to_string();
    let bad_s = bad.display().to_string();
    let out = run(&["finetune", "--model", &model, "--data", &bad_s, "--out", &none_s, "--target", "emulated"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("line 2"), "{err}");
    let out = run(&[
        "finetune", "--model", &model, "--data", &data_s, "--out", &none_s, "--lora-r", "0", "--target", "emulated",
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(1) && err.contains("lora r"), "{err}");
    assert!(!none.exists());
    std::fs::remove_dir_all(&dir).unwrap();
}
