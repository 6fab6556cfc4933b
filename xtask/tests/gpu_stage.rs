//! The GPU stage (`scripts/gpu-stage.sh`) fits what the device tool carries (64 MiB), checked
//! without building it: `gpu-stage.sh --dry-run` lists what a stage holds (the device code
//! unpacked from the prebuilt archive and compressed as a stage does, the compute-sanitizer
//! wheel at the size pinned in `scripts/gpu-stage-wheel.txt`, every binary at its budget) and
//! applies the same budget check that ends a real stage. The check itself can fail: over-budget listings are rejected, each
//! with a message that names the sizes. No network, no cargo build; a few seconds of xz.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    xtask::repo_root()
}

fn stage_script(args: &[&str]) -> Output {
    Command::new("bash")
        .arg(root().join("scripts/gpu-stage.sh"))
        .args(args)
        .current_dir(root())
        .output()
        .expect("run bash scripts/gpu-stage.sh")
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// A line on the test's stderr even when the harness captures output, for the CI log.
fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "gpu_stage: {line}");
}

fn check_listing(name: &str, listing: &str) -> Output {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu_stage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    let path = dir.join(format!("{name}.txt"));
    std::fs::write(&path, listing).expect("write a listing");
    let out = stage_script(&["--check-listing", path.to_str().expect("UTF-8 path")]);
    let _ = std::fs::remove_file(&path);
    out
}

const MIB: u64 = 1024 * 1024;

/// A listing like a real stage's: 21 binaries of 4.5 MiB (stripped), `bin_xz` bytes of them compressed.
fn listing(bin_xz: u64, wheel: u64, biggest_binary: u64) -> String {
    let mut s = String::from("# a stage\n");
    s.push_str(&format!("{biggest_binary} bin.tar.xz:bin/llama-kernels\n"));
    for i in 0..20 {
        s.push_str(&format!("{} bin.tar.xz:bin/test-{i}\n", 4 * MIB + MIB / 2));
    }
    s.push_str(&format!("{bin_xz} bin.tar.xz\n"));
    s.push_str(&format!("{} device-code.tar.xz\n", 4 * MIB));
    s.push_str(&format!("{wheel} nvidia_cuda_sanitizer_api.whl\n"));
    s.push_str("3800 gpu-run.sh\n");
    s
}

#[test]
fn the_dry_run_stage_fits_the_budget() {
    // The device code the stage would carry, unpacked here (the script would run
    // `cargo xtask unpack-prebuilt`, a nested cargo).
    let dc = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("gpu_stage-dc-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dc);
    xtask::regen_kernels::unpack(&dc).expect("unpack the prebuilt device code");
    let out = Command::new("bash")
        .arg(root().join("scripts/gpu-stage.sh"))
        .arg("--dry-run")
        .env("LLK_PREBUILT_UNPACKED", &dc)
        .current_dir(root())
        .output()
        .expect("run bash scripts/gpu-stage.sh");
    let _ = std::fs::remove_dir_all(&dc);
    let log = text(&out);
    assert!(out.status.success(), "gpu-stage.sh --dry-run: the stage would not fit:\n{log}");
    let summary = log.lines().last().unwrap_or_default();
    assert!(summary.contains("within budget"), "{log}");
    report(summary);
    // What it counted: the device code once, the wheel, and every staged binary.
    assert!(log.contains(" device-code.tar.xz\n"), "{log}");
    assert!(log.contains(".whl\n"), "{log}");
    let binaries = log.lines().filter(|l| l.starts_with("- bin.tar.xz:bin/")).count();
    let benches: usize = ["crates/llama-kernels", "crates/llama-model"]
        .iter()
        .map(|c| {
            std::fs::read_to_string(root().join(c).join("Cargo.toml")).expect("Cargo.toml").matches("[[bench]]").count()
        })
        .sum();
    assert!(binaries > benches + 1, "{binaries} binaries for {benches} benches:\n{log}");
}

#[test]
fn every_staged_test_exists() {
    let script = std::fs::read_to_string(root().join("scripts/gpu-stage.sh")).expect("read gpu-stage.sh");
    let line = script.lines().find(|l| l.starts_with("readonly gpu_tests=")).expect("the gpu_tests line");
    let names = line.split('"').nth(1).expect("a quoted list");
    for name in names.split_whitespace() {
        let main = ["llama-kernels", "llama-model"].map(|c| root().join(format!("crates/{c}/tests/{name}/main.rs")));
        assert!(main.iter().any(|m| Path::new(m).is_file()), "gpu-stage.sh stages a test `{name}` that no crate has");
    }
}

#[test]
fn a_listing_within_budget_passes() {
    let out = check_listing("ok", &listing(12 * MIB, 14_009_903, 4 * MIB));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("within budget"), "{}", text(&out));
}

#[test]
fn a_stage_over_budget_is_rejected() {
    let out = check_listing("total", &listing(12 * MIB, 50 * MIB, 4 * MIB));
    let log = text(&out);
    assert!(!out.status.success(), "a 66 MiB stage passed:\n{log}");
    assert!(log.contains("over its 60.0 MiB budget"), "{log}");
}

#[test]
fn a_binary_that_embeds_the_device_code_is_rejected() {
    // 43 MB: what each binary weighed when it embedded the PTX and cubins.
    let out = check_listing("binary", &listing(12 * MIB, 14_009_903, 43_000_000));
    let log = text(&out);
    assert!(!out.status.success(), "a 43 MB binary passed:\n{log}");
    assert!(log.contains("bin.tar.xz:bin/llama-kernels is 41.0 MiB, over the 16.0 MiB budget per binary"), "{log}");
}

#[test]
fn binaries_that_compress_worse_than_their_budget_are_rejected() {
    let out = check_listing("xz", &listing(40 * MIB, 1000, 4 * MIB));
    let log = text(&out);
    assert!(!out.status.success(), "40 MiB for 21 binaries passed:\n{log}");
    assert!(log.contains("bin.tar.xz is 40.0 MiB for 21 binaries"), "{log}");
}

#[test]
fn a_malformed_listing_is_rejected() {
    let out = check_listing("malformed", "12MiB bin.tar.xz\n- device-code.tar.xz\n");
    let log = text(&out);
    assert!(!out.status.success(), "{log}");
    assert!(log.contains("bad listing line 1") && log.contains("device-code.tar.xz has no size"), "{log}");
    // Binaries inside an archive that the listing does not have.
    let out = check_listing("orphans", "100 bin.tar.xz:bin/a\n");
    assert!(
        !out.status.success() && text(&out).contains("bin.tar.xz holds 1 binaries but is not listed"),
        "{}",
        text(&out)
    );
}
