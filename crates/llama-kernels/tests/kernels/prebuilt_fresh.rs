//! The committed prebuilt device code (`kernels/prebuilt/`) is fresh, and the check that guards
//! it can fail.
//!
//! * Always: the manifest's input hashes match the sources, its commands match
//!   `build/device_code.rs`, and every file in the committed archive matches its hash.
//! * When this build compiled the kernels from source with the manifest's nvcc: every embedded
//!   PTX, cubin and ptxas report equals the committed copy byte for byte. Otherwise (a prebuilt
//!   build, or another nvcc) the test says why it compared the hashes only.
//! * When nvcc is present: the device build gives the same bytes from two copies of the sources
//!   at different paths with different file times (the determinism that makes the byte-for-byte
//!   comparison meaningful on every machine).
//! * The checks name what differs: a modified, added or removed source, a modified or missing
//!   prebuilt file, a changed build command.

#[path = "../../build/device_code.rs"]
mod device_code;

use std::path::{Path, PathBuf};

use device_code::{MANIFEST_PATH, Manifest, PREBUILT_ARCHIVE, Problem, REGENERATE};
use llama_kernels::backend::{DEVICE_CODE_ORIGIN, kernel_modules};

/// A line on the test's stderr even when the harness captures output (it captures only the
/// print macros), so that CI logs say what was compared.
fn report(line: &str) {
    use std::io::Write as _;
    let _ = writeln!(std::io::stderr(), "prebuilt_fresh: {line}");
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifest() -> Manifest {
    let text = std::fs::read_to_string(root().join(MANIFEST_PATH)).expect("read kernels/prebuilt/manifest.txt");
    Manifest::parse(&text).expect("parse the manifest")
}

/// The committed archive unpacked (once per test run, every family).
fn committed() -> &'static Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = scratch("committed");
        let families = device_code::families(&root()).expect("families");
        device_code::unpack_prebuilt(&root(), &dir, &families).expect("unpack the committed archive");
        dir
    })
}

/// A fresh folder under the test target's temp dir.
fn scratch(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("prebuilt_fresh-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("create a scratch folder");
    dir
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().expect("parent")).expect("create folder");
    std::fs::copy(from, to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
}

/// The inputs of the device build (and one host-only file) copied under `dir`.
fn copy_sources(dir: &Path) {
    let root = root();
    for f in device_code::input_files(&root).expect("inputs") {
        copy(&root.join(&f), &dir.join(&f));
    }
    copy(&root.join("kernels/emu/emu_types.h"), &dir.join("kernels/emu/emu_types.h"));
}

#[test]
fn manifest_matches_the_sources_and_the_build() {
    let families = device_code::families(&root()).expect("families");
    let dir = scratch("verified");
    if let Err(problems) = device_code::unpack_verified(&root(), &dir, &families) {
        panic!(
            "{PREBUILT_ARCHIVE} is stale:\n{}run {REGENERATE} and commit the result",
            device_code::describe(&problems)
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn embedded_device_code_equals_the_committed_copy() {
    let m = manifest();
    let built_by = env!("LLK_NVCC_VERSION");
    if DEVICE_CODE_ORIGIN.starts_with("prebuilt") {
        // The embedded files are copies of the committed ones: this only checks the copy.
        report(&format!(
            "this build used the prebuilt device code ({DEVICE_CODE_ORIGIN}): nothing was compiled to \
             compare with, so the committed copy is checked against the sources by its manifest hashes only \
             (the embedded files are only checked to be copies of it)"
        ));
    } else if built_by != m.nvcc_version {
        report(&format!(
            "this build's nvcc is `{built_by}`, the manifest's is `{}`: their output may differ, so the \
             committed copy is checked by its manifest hashes only",
            m.nvcc_version
        ));
        return;
    }
    let families = device_code::families(&root()).expect("families");
    let embedded: Vec<_> = kernel_modules().expect("the device code").collect();
    assert_eq!(embedded.iter().map(|m| m.name.to_string()).collect::<Vec<_>>(), families, "embedded families");
    let prebuilt = committed();
    let mut differ = Vec::new();
    for module in &embedded {
        let files: [(&str, &[u8]); 6] = [
            ("sm_90/{}.ptx", module.ptx_sm90.as_bytes()),
            ("sm_80/{}.ptx", module.ptx_sm80.as_bytes()),
            ("sm_90/{}.cubin", module.cubin_sm90),
            ("sm_80/{}.cubin", module.cubin_sm80),
            ("sm_90/{}.ptxas.txt", module.ptxas_sm90.as_bytes()),
            ("sm_80/{}.ptxas.txt", module.ptxas_sm80.as_bytes()),
        ];
        for (pattern, bytes) in files {
            let rel = pattern.replace("{}", module.name);
            match std::fs::read(prebuilt.join(&rel)) {
                Ok(committed) if committed == bytes => {}
                Ok(_) => differ.push(format!("{PREBUILT_ARCHIVE}:{rel} differs from this build's")),
                Err(e) => differ.push(format!("{PREBUILT_ARCHIVE}:{rel}: {e}")),
            }
        }
    }
    assert!(
        differ.is_empty(),
        "the committed device code is not what {DEVICE_CODE_ORIGIN} builds:\n  {}\nrun {REGENERATE} and commit the result",
        differ.join("\n  ")
    );
    report(&format!("embedded device code equals {PREBUILT_ARCHIVE} byte for byte ({} families)", embedded.len()));
}

#[test]
fn the_device_build_does_not_depend_on_the_checkout() {
    let root = root();
    let Some(nvcc) = device_code::find_nvcc(&root).ok().flatten() else {
        report("no nvcc (run scripts/setup.sh): the determinism of the device build is not checked here");
        return;
    };
    let tc = device_code::Toolchain::new(nvcc).expect("nvcc and ptxas");
    let dir = scratch("paths");
    let (a, b) = (dir.join("a"), dir.join("some/deeper/checkout"));
    copy_sources(&a);
    copy_sources(&b);
    // Different modification times too: ptxas would record them if it could find the files.
    let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000_000);
    for f in device_code::input_files(&b).expect("inputs") {
        std::fs::File::options().write(true).open(b.join(&f)).and_then(|h| h.set_modified(old)).expect("set mtime");
    }
    let same_nvcc = tc.nvcc_version == manifest().nvcc_version;
    for (family, arch) in [("swiglu", "sm_90"), ("selftest", "sm_80")] {
        for r in [&a, &b] {
            device_code::build_one(&tc, r, &r.join("out"), family, arch).expect("device build");
        }
        for ext in device_code::OUTPUT_EXTS {
            let rel = format!("{arch}/{family}.{ext}");
            let (x, y) = (std::fs::read(a.join("out").join(&rel)), std::fs::read(b.join("out").join(&rel)));
            let x = x.expect("built file");
            assert!(x == y.expect("built file"), "{rel} differs between two checkouts of the same sources");
            let text = String::from_utf8_lossy(&x);
            assert!(!text.contains(&*a.to_string_lossy()), "{rel} names the checkout path");
            if same_nvcc {
                let committed = std::fs::read(committed().join(&rel)).expect("committed file");
                assert!(x == committed, "{rel} built from a copy differs from {PREBUILT_ARCHIVE}:{rel}");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_changed_source_is_named() {
    let m = manifest();
    let dir = scratch("sources");
    copy_sources(&dir);
    assert_eq!(device_code::check_inputs(&dir, &m), vec![], "an exact copy of the sources matches");

    // Host-only files are no input of the device build.
    std::fs::write(dir.join("kernels/emu/emu_types.h"), "// changed\n").expect("write");
    assert_eq!(device_code::check_inputs(&dir, &m), vec![]);

    // One changed byte changes the hash.
    let path = dir.join("kernels/rms_norm.cu");
    let original = std::fs::read(&path).expect("read");
    let mut modified = original.clone();
    modified.extend_from_slice(b"// a comment\n");
    assert_ne!(device_code::sha256_hex(&original), device_code::sha256_hex(&modified));
    std::fs::write(&path, &modified).expect("write");
    std::fs::write(dir.join("kernels/common/extra.cuh"), "#pragma once\n").expect("write");
    std::fs::remove_file(dir.join("kernels/params.h")).expect("remove");

    let problems = device_code::check_inputs(&dir, &m);
    assert_eq!(
        problems,
        vec![
            Problem::Added("kernels/common/extra.cuh".into()),
            Problem::Changed("kernels/rms_norm.cu".into()),
            Problem::Missing("kernels/params.h".into()),
        ]
    );
    let text = device_code::describe(&problems);
    for line in ["changed:  kernels/rms_norm.cu", "added:    kernels/common/extra.cuh", "missing:  kernels/params.h"] {
        assert!(text.contains(line), "{text}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_modified_prebuilt_file_or_build_command_is_named() {
    let m = manifest();
    let root = root();
    let families = device_code::families(&root).expect("families");
    let dir = scratch("outputs");
    for f in device_code::output_files(&families) {
        copy(&committed().join(&f), &dir.join(&f));
    }
    assert_eq!(device_code::check_outputs(&dir, &m, &families), vec![]);
    let cubin = dir.join("sm_80/swiglu.cubin");
    let mut bytes = std::fs::read(&cubin).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    std::fs::write(&cubin, bytes).expect("write");
    std::fs::remove_file(dir.join("sm_90/rope.ptx")).expect("remove");
    assert_eq!(
        device_code::check_outputs(&dir, &m, &families),
        vec![Problem::OutputMissing("sm_90/rope.ptx".into()), Problem::OutputChanged("sm_80/swiglu.cubin".into())]
    );

    let mut changed = m.clone();
    changed.nvcc_command.push_str(" -G");
    let problems = device_code::check_settings(&changed);
    assert!(matches!(problems.as_slice(), [Problem::Setting { key: "nvcc-command", .. }]), "{problems:?}");
    assert_eq!(device_code::check_settings(&m), vec![]);

    // The manifest reads back what it writes.
    assert_eq!(Manifest::parse(&m.render()).expect("parse"), m);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn ptx_paths_and_timings_are_normalized() {
    let kernels = vec!["/home/me/llk/kernels".to_string()];
    let tops = vec!["/opt/cuda/bin/..".to_string(), "/opt/cuda".to_string()];
    let ptx = "\t.file\t1 \"/home/me/llk/kernels/rms_norm.cu\"\n\
               \t.file\t2 \"/home/me/llk/kernels/common/llk.cuh\", 1700000000, 1234\n\
               \t.file\t3 \"/opt/cuda/bin/..//include/cuda_bf16.hpp\"\n\
               \t.file\t4 \"/opt/cuda/targets/x86_64-linux/include/cuda_fp16.hpp\"\n\
               \t.file\t5 \"/usr/include/stdint.h\"\n\
               \tmov.u32 %r1, 0; // .file \"/home/me\" stays\n";
    let want = "\t.file\t1 \"kernels/rms_norm.cu\"\n\
                \t.file\t2 \"kernels/common/llk.cuh\"\n\
                \t.file\t3 \"cuda/include/cuda_bf16.hpp\"\n\
                \t.file\t4 \"cuda/include/cuda_fp16.hpp\"\n\
                \t.file\t5 \"/usr/include/stdint.h\"\n\
                \tmov.u32 %r1, 0; // .file \"/home/me\" stays\n";
    assert_eq!(device_code::normalize_ptx(ptx, &kernels, &tops), want);
    let report =
        "ptxas info    : Used 10 registers\nptxas info    : Compile time = 12.5 ms\nptxas info    : 0 bytes gmem\n";
    assert_eq!(
        device_code::normalize_report(report),
        "ptxas info    : Used 10 registers\nptxas info    : 0 bytes gmem\n"
    );
}
