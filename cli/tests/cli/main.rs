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
