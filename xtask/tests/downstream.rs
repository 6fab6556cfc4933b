//! A crate that depends on llama-kernels and llama-model builds and runs where there is no CUDA
//! at all.
//!
//! Packages both crates as crates.io would (`cargo package`), checks what the kernel crate's
//! package holds and its size, unpacks both, and builds a scratch crate that depends on them by
//! path (the model crate's dependency on the kernel crate patched to the unpacked package), with
//! `NVCC`, `CUDA_HOME` and `CUDA_PATH` unset and no nvcc on `PATH` (an unpacked package is not in
//! a repository checkout, so it finds no project toolchain). The build must take the prebuilt
//! device code; the scratch program runs one op of each family on the emulated target and checks
//! the results against plain Rust, then runs a small model through the model crate and checks
//! that decoding a token against the paged cache gives the logits of a prefill of the same
//! tokens.
//!
//! Its own target folder (`<target>/tmp/downstream/target`) keeps the main build unlocked and
//! makes a rerun faster; the first run compiles the crate and its dependencies again.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::Instant;

use xtask::device_code;

/// crates.io's limit on a .crate file is 10 MB; the kernel crate keeps headroom below it for the
/// kernels to come.
const MAX_CRATE_BYTES: u64 = 8 * 1024 * 1024;

fn cargo() -> Command {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    // Nothing of the outer build leaks into the nested ones.
    for var in [
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET_DIR",
        "LLK_DEVICE_CODE",
        "LLK_DEVICE_CODE_LOCATION",
        "LLK_DEVICE_CODE_DIR",
        "RUSTC_WRAPPER",
    ] {
        c.env_remove(var);
    }
    c
}

/// A line on the test's stderr even when the harness captures output (it captures only the
/// print macros): the measurements belong in every CI log.
fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "downstream: {line}");
}

fn show(out: &Output) -> String {
    format!(
        "{}\n--- stdout\n{}\n--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs cargo with `--offline` (the registry cache has every dependency), and online if that fails.
fn cargo_offline_first(what: &str, configure: impl Fn(&mut Command)) -> (Output, bool) {
    let mut offline = cargo();
    configure(&mut offline);
    let out = offline.arg("--offline").output().unwrap_or_else(|e| panic!("{what}: cannot run cargo: {e}"));
    if out.status.success() {
        return (out, true);
    }
    report(&format!("{what} --offline failed, retrying online:\n{}", String::from_utf8_lossy(&out.stderr)));
    let mut online = cargo();
    configure(&mut online);
    (online.output().unwrap_or_else(|e| panic!("{what}: cannot run cargo: {e}")), false)
}

/// PATH without any folder that holds an nvcc.
fn path_without_nvcc() -> OsString {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let kept: Vec<PathBuf> = std::env::split_paths(&path).filter(|d| !d.join("nvcc").exists()).collect();
    std::env::join_paths(kept).unwrap_or_default()
}

#[test]
fn a_dependent_crate_builds_from_the_package_without_cuda() {
    let repo = xtask::repo_root();
    let root = xtask::kernel_crate();
    let work = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("downstream");
    // xtask shares the workspace version with the packaged crates.
    let version = env!("CARGO_PKG_VERSION");
    for stale in ["package-target/package", "unpacked", "scratch"] {
        let _ = std::fs::remove_dir_all(work.join(stale));
    }
    std::fs::create_dir_all(&work).expect("create the work folder");

    // 1. What the package holds.
    let (out, _) = cargo_offline_first("cargo package --list", |c| {
        c.current_dir(&root)
            .args(["package", "--list", "--allow-dirty", "-p", "llama-kernels", "--manifest-path"])
            .arg(repo.join("Cargo.toml"));
    });
    assert!(out.status.success(), "cargo package --list failed: {}", show(&out));
    let listed: Vec<String> = String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect();
    let mut required: Vec<String> =
        ["Cargo.toml", "build.rs", "build/device_code.rs", "build/manifest.rs", device_code::MANIFEST_PATH]
            .iter()
            .map(|s| s.to_string())
            .collect();
    required.extend(device_code::input_files(&root).expect("inputs"));
    required.push(device_code::PREBUILT_ARCHIVE.to_string());
    required.extend(
        ["kernels/emu/emu_runtime.h", "kernels/emu/emu_types.h", "kernels/emu/emu_exports.cc"].map(String::from),
    );
    let missing: Vec<&String> = required.iter().filter(|f| !listed.contains(f)).collect();
    assert!(missing.is_empty(), "cargo package leaves out {missing:?}; check `include` in Cargo.toml");
    let junk: Vec<&String> = listed
        .iter()
        .filter(|f| f.starts_with("target/") || f.starts_with(".toolchain/") || f.starts_with("tests/"))
        .collect();
    assert!(junk.is_empty(), "cargo package includes {junk:?}");

    // 2. The packages, and their sizes.
    let package_target = work.join("package-target");
    let (out, _) = cargo_offline_first("cargo package", |c| {
        c.current_dir(&repo)
            .args(["package", "--no-verify", "--allow-dirty", "-p", "llama-kernels", "-p", "llama-model"])
            .arg("--manifest-path")
            .arg(repo.join("Cargo.toml"))
            .arg("--target-dir")
            .arg(&package_target);
    });
    assert!(out.status.success(), "cargo package failed: {}", show(&out));
    let krate = |name: &str| package_target.join(format!("package/{name}-{version}.crate"));
    let size_of =
        |name: &str| std::fs::metadata(krate(name)).unwrap_or_else(|e| panic!("no {name} package: {e}")).len();
    let (size, model_size) = (size_of("llama-kernels"), size_of("llama-model"));
    report(&format!(
        "packages: llama-kernels {:.2} MB ({size} bytes), llama-model {:.2} MB; crates.io allows 10 MB",
        size as f64 / 1e6,
        model_size as f64 / 1e6
    ));
    assert!(
        size <= MAX_CRATE_BYTES,
        "the kernel crate's package is {size} bytes, over its {MAX_CRATE_BYTES}-byte budget"
    );

    // 3. Unpack them (with fresh modification times: a package whose build script changed must
    //    rerun it in the reused target folder), and a scratch crate that depends on both.
    let unpacked = work.join("unpacked");
    std::fs::create_dir_all(&unpacked).expect("create unpacked/");
    for name in ["llama-kernels", "llama-model"] {
        let out = Command::new("tar").arg("xzmf").arg(krate(name)).arg("-C").arg(&unpacked).output().expect("run tar");
        assert!(out.status.success(), "tar failed: {}", show(&out));
    }
    let package = unpacked.join(format!("llama-kernels-{version}"));
    let model_package = unpacked.join(format!("llama-model-{version}"));
    assert!(device_code::repository_root(&package).is_none(), "the unpacked package looks like a checkout");
    let scratch = work.join("scratch");
    std::fs::create_dir_all(scratch.join("src")).expect("create scratch/");
    std::fs::write(
        scratch.join("Cargo.toml"),
        format!(
            "[package]\nname = \"downstream-check\"\nversion = \"0.0.0\"\nedition = \"2024\"\npublish = false\n\n\
             [dependencies]\nllama-kernels = {{ path = {:?} }}\nllama-model = {{ path = {:?} }}\nhalf = \"2\"\n\n\
             [patch.crates-io]\nllama-kernels = {{ path = {:?} }}\n\n[workspace]\n",
            package.to_string_lossy(),
            model_package.to_string_lossy(),
            package.to_string_lossy()
        ),
    )
    .expect("write scratch/Cargo.toml");
    // The versions this repository is tested with (and has in the registry cache).
    std::fs::copy(repo.join("Cargo.lock"), scratch.join("Cargo.lock")).expect("copy Cargo.lock");
    std::fs::write(scratch.join("src/main.rs"), SCRATCH_MAIN).expect("write scratch/src/main.rs");

    // 4. Build it without any CUDA.
    let target = work.join("target");
    let warm = target.join("debug").exists();
    let started = Instant::now();
    let (out, offline) = cargo_offline_first("cargo build (downstream)", |c| {
        c.current_dir(&scratch)
            .args(["build", "--manifest-path"])
            .arg(scratch.join("Cargo.toml"))
            .env("CARGO_TARGET_DIR", &target)
            .env("PATH", path_without_nvcc())
            .env_remove("NVCC")
            .env_remove("CUDA_HOME")
            .env_remove("CUDA_PATH");
    });
    let seconds = started.elapsed().as_secs_f64();
    assert!(out.status.success(), "the dependent crate does not build without CUDA: {}", show(&out));
    let compiled =
        String::from_utf8_lossy(&out.stderr).lines().filter(|l| l.trim_start().starts_with("Compiling ")).count();
    report(&format!(
        "build of a dependent crate without nvcc: {seconds:.1} s, {compiled} crates compiled ({}, {})",
        if warm { "target folder reused from an earlier run" } else { "cold target folder" },
        if offline { "offline" } else { "online" }
    ));

    // 5. Run it.
    let out = Command::new(target.join("debug/downstream-check")).output().expect("run the scratch program");
    let stdout = String::from_utf8_lossy(&out.stdout);
    print!("{stdout}");
    assert!(out.status.success(), "the scratch program failed: {}", show(&out));
    assert!(
        stdout.contains("origin: prebuilt (kernels/prebuilt, manifest "),
        "the build without nvcc did not use the prebuilt device code: {stdout}"
    );
    assert!(stdout.contains("downstream: all ops match"), "{stdout}");
    assert!(stdout.contains("downstream: the model decodes what it prefills"), "{stdout}");
    report(&format!(
        "the dependent crate ran every op family and a model on the emulated target; its {}",
        stdout.lines().next().unwrap_or("")
    ));
}

/// The scratch program: one op of each family on the emulated target, against plain Rust.
const SCRATCH_MAIN: &str = r##"
use half::bf16;
use llama_kernels::{DType, Device, Tensor, ops};

fn check(what: &str, got: &[f32], want: &[f64], tol: f64) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    let mut worst = (0.0f64, 0usize);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let err = (f64::from(*g) - w).abs() / (1.0 + w.abs());
        let err = if err.is_nan() { f64::INFINITY } else { err };
        if err > worst.0 {
            worst = (err, i);
        }
    }
    assert!(worst.0 <= tol, "{what}: element {} is {} (want {}); error {:e} > {tol:e}", worst.1, got[worst.1], want[worst.1], worst.0);
    println!("{what}: ok (worst error {:.1e})", worst.0);
}

fn values(n: usize, seed: f32) -> Vec<f32> {
    (0..n).map(|i| ((i as f32 + seed) * 0.7311).sin()).collect()
}

fn main() -> llama_kernels::Result<()> {
    println!("origin: {}", llama_kernels::backend::DEVICE_CODE_ORIGIN);
    for m in llama_kernels::backend::kernel_modules()? {
        assert!(m.ptx_sm90.contains(".target sm_90") && m.ptx_sm80.contains(".target sm_80"), "{}: PTX", m.name);
        assert!(m.cubin_sm90.starts_with(b"\x7fELF") && m.cubin_sm80.starts_with(b"\x7fELF"), "{}: cubins", m.name);
    }
    let device = Device::emulated();

    // RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
    let (rows, hidden, eps) = (3, 96, 1e-5f32);
    let (x, w) = (values(rows * hidden, 1.0), values(hidden, 2.0));
    let y = Tensor::zeros(&device, DType::F32, &[rows, hidden])?;
    ops::rms_norm(&Tensor::from_slice(&device, &x, &[rows, hidden])?, &Tensor::from_slice(&device, &w, &[hidden])?, eps, &y)?;
    let mut want = Vec::new();
    for r in x.chunks(hidden) {
        let ms = r.iter().map(|v| f64::from(*v).powi(2)).sum::<f64>() / hidden as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        want.extend(r.iter().zip(&w).map(|(v, w)| f64::from(*v) * inv * f64::from(*w)));
    }
    check("rms_norm", &y.to_vec::<f32>()?, &want, 1e-5);

    // RoPE, half-split pairs (i, i + d/2) rotated by position * theta^(-2i/d).
    let (tokens, heads, d, theta) = (4, 2, 64, 10_000.0f64);
    let config = ops::RopeConfig { head_dim: d, rotary_dim: d, theta, layout: ops::RopeLayout::HalfSplit, scaling: None, qk_norm_eps: None };
    let rope = ops::Rope::new(&device, config)?;
    let q = values(tokens * heads * d, 3.0);
    let qt = Tensor::from_slice(&device, &q, &[tokens, heads, d])?;
    let positions: Vec<i32> = vec![0, 1, 7, 1000];
    rope.apply(&qt, None, &Tensor::from_slice(&device, &positions, &[tokens])?)?;
    let mut want = vec![0.0f64; q.len()];
    for t in 0..tokens {
        for h in 0..heads {
            let base = (t * heads + h) * d;
            for i in 0..d / 2 {
                let angle = f64::from(positions[t]) * theta.powf(-2.0 * i as f64 / d as f64);
                let (a, b) = (f64::from(q[base + i]), f64::from(q[base + i + d / 2]));
                want[base + i] = a * angle.cos() - b * angle.sin();
                want[base + i + d / 2] = b * angle.cos() + a * angle.sin();
            }
        }
    }
    check("rope", &qt.to_vec::<f32>()?, &want, 1e-5);

    // SwiGLU: silu(gate) * up.
    let (rows, dim) = (5, 40);
    let (gate, up) = (values(rows * dim, 4.0), values(rows * dim, 5.0));
    let out = Tensor::zeros(&device, DType::F32, &[rows, dim])?;
    let (g, u) = (Tensor::from_slice(&device, &gate, &[rows, dim])?, Tensor::from_slice(&device, &up, &[rows, dim])?);
    ops::swiglu(ops::GateUp::Separate { gate: &g, up: &u }, &out)?;
    let want: Vec<f64> = gate.iter().zip(&up).map(|(g, u)| {
        let g = f64::from(*g);
        g / (1.0 + (-g).exp()) * f64::from(*u)
    }).collect();
    check("swiglu", &out.to_vec::<f32>()?, &want, 1e-5);

    // Causal GQA attention in bf16 (the tensor-core kernel): 4 q heads over 2 kv heads.
    let (n, qh, kvh, d) = (9, 4, 2, 64);
    let to_bf16 = |v: Vec<f32>| v.into_iter().map(bf16::from_f32).collect::<Vec<_>>();
    let (q, k, v) = (to_bf16(values(n * qh * d, 6.0)), to_bf16(values(n * kvh * d, 7.0)), to_bf16(values(n * kvh * d, 8.0)));
    let out = Tensor::zeros(&device, DType::BF16, &[n, qh, d])?;
    let opts = ops::AttentionOptions { mask: ops::AttentionMask::Causal, ..Default::default() };
    let (qt, kt, vt) = (
        Tensor::from_slice(&device, &q, &[n, qh, d])?,
        Tensor::from_slice(&device, &k, &[n, kvh, d])?,
        Tensor::from_slice(&device, &v, &[n, kvh, d])?,
    );
    let cu = [0, n as i32];
    let call = ops::AttentionTensors {
        q: &qt,
        kv: ops::KvTensors::Contiguous { k: &kt, v: &vt },
        cu_seqlens: ops::Offsets::Host { q: &cu, k: &cu },
        out: &out,
        lse: None,
    };
    ops::AttentionWorkspace::new(&device).forward(call, &opts)?;
    let f = |x: bf16| f64::from(x.to_f32());
    let scale = 1.0 / (d as f64).sqrt();
    let mut want = vec![0.0f64; n * qh * d];
    for t in 0..n {
        for h in 0..qh {
            let kv = h / (qh / kvh);
            let scores: Vec<f64> = (0..=t)
                .map(|j| (0..d).map(|c| f(q[(t * qh + h) * d + c]) * f(k[(j * kvh + kv) * d + c])).sum::<f64>() * scale)
                .collect();
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = scores.iter().map(|s| (s - max).exp()).sum();
            for c in 0..d {
                want[(t * qh + h) * d + c] =
                    scores.iter().enumerate().map(|(j, s)| (s - max).exp() / sum * f(v[(j * kvh + kv) * d + c])).sum();
            }
        }
    }
    let got: Vec<f32> = out.to_vec::<bf16>()?.into_iter().map(bf16::to_f32).collect();
    check("attention", &got, &want, 1e-2);

    println!("downstream: all ops match");
    check_model().map_err(|e| llama_kernels::Error::Unsupported { what: format!("the model check failed: {e}") })
}

/// A two-layer Llama 3 model with deterministic weights: the logits of the last token after a
/// prefill of four tokens, against those of a prefill of three and a decode of the fourth
/// through the paged cache; and a chat template's exact rendering.
fn check_model() -> llama_model::Result<()> {
    use llama_model::block::{HostLayerWeights, HostTensor};
    use llama_model::model::{HostModel, Logits, Model, ModelPlan};

    let config = llama_model::ModelConfig::from_json(r#"{
        "model_type": "llama", "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1,
        "head_dim": 32, "intermediate_size": 96, "num_hidden_layers": 2, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0}"#)?;
    let tensor = |shape: &[usize], seed: f32| -> llama_kernels::Result<HostTensor> {
        let n: usize = shape.iter().product();
        let scale = 1.0 / (*shape.last().unwrap_or(&1) as f32).sqrt();
        HostTensor::new(shape, (0..n).map(|i| ((i as f32 + seed) * 0.7311).sin() * scale + if shape.len() == 1 { 1.0 } else { 0.0 }).collect())
    };
    let mut layers = Vec::new();
    for l in 0..config.num_layers() {
        let spec = config.layer(l)?;
        let mut k = 0.0f32;
        let w = HostLayerWeights::from_source(&spec, |_, shape| {
            k += 1.0;
            tensor(shape, k * 13.0 + l as f32)
        })?;
        layers.push((spec, w));
    }
    let (vocab, hidden) = (40, 64);
    let host = HostModel {
        config, layers,
        embed: tensor(&[vocab, hidden], 5.0)?, norm: tensor(&[hidden], 6.0)?, lm_head: None,
        eps: 1e-5, lm_head_packed: None,
    };
    let device = Device::emulated();
    let plan = ModelPlan { slots: 1, max_len: 16, max_tokens: 8 };
    let tokens = [3u32, 17, 29, 8];
    let mut once = Model::new(&device, &host, DType::F32, plan)?;
    let whole: Vec<f32> = once.step(&[(0, &tokens)], Logits::Last)?.to_vec()?;
    let mut twice = Model::new(&device, &host, DType::F32, plan)?;
    twice.step(&[(0, &tokens[..3])], Logits::Last)?;
    let stepped: Vec<f32> = twice.step(&[(0, &tokens[3..])], Logits::Last)?.to_vec()?;
    assert_eq!(whole.len(), vocab);
    assert!(whole.iter().all(|v| v.is_finite()), "non-finite logits: {whole:?}");
    let spread = whole.iter().cloned().fold(f32::MIN, f32::max) - whole.iter().cloned().fold(f32::MAX, f32::min);
    assert!(spread > 1e-3, "the logits do not depend on the token: {whole:?}");
    let worst = whole.iter().zip(&stepped).map(|(a, b)| (a - b).abs()).fold(0.0f32, f32::max);
    assert!(worst <= 1e-4 * (1.0 + spread), "prefill and decode disagree by {worst}: {whole:?} vs {stepped:?}");
    println!("model: prefill and decode agree (worst difference {worst:.1e}, logit spread {spread:.2})");

    let template = llama_model::ChatTemplate::new(
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}",
        None,
        None,
    )?;
    let text = template.render(&[llama_model::text::Message::new("user", "hi")], false)?;
    assert_eq!(text, "<user>hi");
    println!("downstream: the model decodes what it prefills");
    Ok(())
}
"##;
