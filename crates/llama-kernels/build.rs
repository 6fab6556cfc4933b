//! Builds every kernel family in `kernels/*.cu` two ways:
//!
//! * device code: PTX for sm_90 and sm_80, the cubins ptxas assembles from it and ptxas's `-v`
//!   reports (registers, spills, shared memory), embedded in the crate (`kernels.rs` in OUT_DIR);
//! * host code: the same sources compiled with the system C++ compiler against the emulation
//!   runtime (`kernels/emu/`), always with optimization, into a static library.
//!
//! The device code comes from one of two places, and the build says which
//! (`LLK_DEVICE_CODE_ORIGIN`, shown by `llama-kernels info`):
//!
//! * **source**: nvcc and ptxas compile `kernels/*.cu` here. nvcc is looked up in `$NVCC`,
//!   `$CUDA_HOME`/`$CUDA_PATH`, the project toolchain of `scripts/setup.sh`, `PATH`, then
//!   `/usr/local/cuda`.
//! * **prebuilt**: the committed copy in `kernels/prebuilt/` (one zstd-compressed archive and its
//!   manifest), used when no nvcc is found, and only when its manifest's hashes match the current
//!   sources and build settings and every file unpacked from it matches its hash.
//!
//! `LLK_DEVICE_CODE=source` requires nvcc; `LLK_DEVICE_CODE=prebuilt` uses the committed copy even
//! when nvcc exists (still checked). How the device code is compiled, and the manifest, live in
//! `build/device_code.rs`, which `cargo xtask regen-kernels` shares.
//! The host code needs no CUDA install at all.
//!
//! Where the device code goes (`LLK_DEVICE_CODE_LOCATION`):
//!
//! * **embedded** (the default): the bytes are in the crate (`include_str!`/`include_bytes!`);
//! * **external**: only each file's path, size and SHA-256 are embedded (about 40 MB less in
//!   every binary that links the crate). At run time the library reads the files, on first use,
//!   from the folder named by `LLK_DEVICE_CODE_DIR`, in the layout of `kernels/prebuilt/`
//!   (`sm_90/<family>.ptx` ...), and checks each against its hash; an unset variable, a missing
//!   file or a different one is an error (`Error::DeviceCode`), not a panic. The build writes
//!   the list of files as `device-code.sha256` (`sha256sum` format) into OUT_DIR, next to the
//!   files: that folder is what to ship (`scripts/gpu-stage.sh` does). The emulated target needs
//!   none of the files.

#[path = "build/device_code.rs"]
mod device_code;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use device_code::{Manifest, REGENERATE, Toolchain};

/// The family of emulator self-test kernels, left out of builds without the `dev` feature.
const SELFTEST_FAMILY: &str = "selftest";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Auto,
    Source,
    Prebuilt,
}

fn main() {
    if let Err(message) = run() {
        // A clear message and a failed build, without a panic's backtrace hint.
        eprintln!("\nerror: llama-kernels build script:\n{message}\n");
        std::process::exit(1);
    }
}

fn env_path(var: &str) -> Result<PathBuf, String> {
    std::env::var_os(var).map(PathBuf::from).ok_or_else(|| format!("{var} is not set (is this run by cargo?)"))
}

fn run() -> Result<(), String> {
    let root = env_path("CARGO_MANIFEST_DIR")?;
    let out = env_path("OUT_DIR")?;
    let kernels = root.join("kernels");

    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "LLK_DEVICE_CODE", "LLK_DEVICE_CODE_LOCATION", "LLK_HOST_CXXFLAGS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=build/device_code.rs");
    println!("cargo:rerun-if-changed=build/manifest.rs");
    // A folder is scanned recursively: every file under kernels/, the prebuilt copy included.
    println!("cargo:rerun-if-changed=kernels");

    let mode = match std::env::var("LLK_DEVICE_CODE").as_deref() {
        Err(_) | Ok("") | Ok("auto") => Mode::Auto,
        Ok("source") => Mode::Source,
        Ok("prebuilt") => Mode::Prebuilt,
        Ok(other) => return Err(format!("LLK_DEVICE_CODE={other} is not one of: source, prebuilt, auto")),
    };
    let external = match std::env::var("LLK_DEVICE_CODE_LOCATION").as_deref() {
        Err(_) | Ok("") | Ok("embedded") => false,
        Ok("external") => true,
        Ok(other) => return Err(format!("LLK_DEVICE_CODE_LOCATION={other} is not one of: embedded, external")),
    };
    // The emulator self-test kernels (selftest.cu) are test support: built only with the `dev`
    // feature (this crate's own tests, benches and command-line front end).
    let dev = std::env::var_os("CARGO_FEATURE_DEV").is_some();
    let families: Vec<String> =
        device_code::families(&root)?.into_iter().filter(|f| dev || f != SELFTEST_FAMILY).collect();

    let nvcc = match mode {
        // A forced prebuilt build still points LLK_CUDA_BIN at a toolchain when there is one.
        Mode::Prebuilt => device_code::find_nvcc(&root).ok().flatten(),
        _ => device_code::find_nvcc(&root)?,
    };
    let (origin, cuda_bin) = match (mode, nvcc) {
        (Mode::Source | Mode::Auto, Some(nvcc)) => {
            let tc = Toolchain::new(nvcc)?;
            for w in device_code::build_all(&tc, &root, &out, &families)? {
                println!("cargo:warning={w}");
            }
            let bin = tc.nvcc.parent().map(Path::to_path_buf).unwrap_or_default();
            println!("cargo:rustc-env=LLK_NVCC_VERSION={}", tc.nvcc_version);
            (format!("source (nvcc {}, {})", tc.nvcc.display(), tc.short_release()), bin)
        }
        (Mode::Source, None) => {
            return Err("LLK_DEVICE_CODE=source, but nvcc was not found.\n\
                 Point the build at nvcc (NVCC=/path/to/nvcc or CUDA_HOME=/usr/local/cuda), run\n\
                 scripts/setup.sh in a checkout of the repository (installs the pinned nvcc 13.0 into\n\
                 ./.toolchain), or unset LLK_DEVICE_CODE to use the prebuilt device code."
                .into());
        }
        (Mode::Auto | Mode::Prebuilt, nvcc) => {
            // The committed archive, unpacked where the module table expects the files.
            let manifest = device_code::unpack_verified(&root, &out, &families).map_err(|problems| {
                let why = if mode == Mode::Prebuilt {
                    "LLK_DEVICE_CODE=prebuilt, but the prebuilt device code"
                } else {
                    "nvcc was not found, and the prebuilt device code"
                };
                format!(
                    "{why} in kernels/prebuilt/ does not match\n\
                     the kernel sources and build settings:\n{}\n\
                     Either regenerate it, in a checkout of the llama-kernels repository:\n\
                     \x20   {REGENERATE}\n\
                     or compile the kernels here: point the build at nvcc (NVCC=/path/to/nvcc or\n\
                     CUDA_HOME=/usr/local/cuda; in a checkout, scripts/setup.sh installs the pinned nvcc 13.0\n\
                     into ./.toolchain){}.",
                    device_code::describe(&problems),
                    if mode == Mode::Prebuilt { ", and unset LLK_DEVICE_CODE" } else { "" }
                )
            })?;
            println!("cargo:rustc-env=LLK_NVCC_VERSION=");
            let bin = match nvcc.and_then(|n| n.parent().map(Path::to_path_buf)) {
                Some(bin) => bin,
                None => device_code::project_toolchain_bin(&root).filter(|local| local.is_dir()).unwrap_or_default(),
            };
            (format!("prebuilt (kernels/prebuilt, manifest {})", Manifest::short_hash(&manifest)), bin)
        }
    };

    build_host(&kernels, &families)?;

    let external_files = if external {
        Some(describe_external(&out, &families)?)
    } else {
        // No list of files to ship is left from an earlier external build of this folder.
        let _ = std::fs::remove_file(out.join("device-code.sha256"));
        None
    };
    let origin = if external {
        format!("{origin}; external: read at run time from $LLK_DEVICE_CODE_DIR, checked by SHA-256")
    } else {
        origin
    };
    std::fs::write(out.join("kernels.rs"), generated_module_table(&families, external_files.as_ref()))
        .map_err(|e| format!("cannot write {}: {e}", out.join("kernels.rs").display()))?;
    println!("cargo:rustc-env=LLK_CUDA_BIN={}", cuda_bin.display());
    println!("cargo:rustc-env=LLK_DEVICE_CODE_ORIGIN={origin}");
    println!("cargo:rustc-env=LLK_KERNEL_BUILD_DIR={}", out.display());
    Ok(())
}

/// The same sources through the emulation runtime, optimized in every profile.
fn build_host(kernels: &Path, families: &[String]) -> Result<(), String> {
    let mut host = cc::Build::new();
    host.cpp(true)
        .std("c++20")
        .opt_level(3)
        .debug(false)
        .include(kernels)
        .flag("-x")
        .flag("c++")
        .flag("-fno-strict-aliasing") // kernels reinterpret 16-byte vectors as elements
        .flag("-ftls-model=initial-exec") // __shared__ is thread_local: keep its access cheap
        .flag("-fstack-clash-protection") // big frames probe their pages: an overflow hits a canary or the guard
        .flag("-ffp-contract=off") // a * b + c rounds twice, as __fmul_rn / __fadd_rn promise, never one fma
        .flag("-Wno-unused-parameter")
        .flag("-Wno-unused-function")
        .flag("-Wno-unknown-pragmas")
        .flag("-Wno-unused-variable")
        .warnings(true);
    // Every index into a fixed-size array (static __shared__, local) is checked; the handler in
    // kernels/emu/emu_checks.cc fails the launch. No sanitizer runtime is linked.
    if host.get_compiler().is_like_clang() {
        host.flag("-fsanitize=array-bounds").flag("-fno-sanitize-recover=array-bounds");
    } else {
        host.flag("-fsanitize=bounds").flag("-fno-sanitize-recover=bounds");
    }
    if let Ok(extra) = std::env::var("LLK_HOST_CXXFLAGS") {
        for f in extra.split_whitespace() {
            host.flag(f);
        }
    }
    for family in families {
        host.file(kernels.join(format!("{family}.cu")));
    }
    host.file(kernels.join("emu/emu_exports.cc"));
    host.file(kernels.join("emu/emu_checks.cc"));
    host.try_compile("llama_kernels_emu").map_err(|e| format!("compiling the emulated kernels failed: {e}"))
}

/// Size and SHA-256 of every device-code file in `out`, by path relative to it; also written to
/// `out/device-code.sha256` in `sha256sum` format (what `scripts/gpu-stage.sh` stages).
fn describe_external(out: &Path, families: &[String]) -> Result<BTreeMap<String, (u64, String)>, String> {
    let mut files = BTreeMap::new();
    let mut list = String::new();
    for f in device_code::output_files(families) {
        let path = out.join(&f);
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        // The library hands PTX and reports out as text: check here, where a failure is a build error.
        if !f.ends_with(".cubin") && std::str::from_utf8(&bytes).is_err() {
            return Err(format!("{} is not UTF-8", path.display()));
        }
        files.insert(f, (bytes.len() as u64, device_code::sha256_hex(&bytes)));
    }
    for (f, (_, sha)) in &files {
        let _ = writeln!(list, "{sha}  {f}");
    }
    let list_path = out.join("device-code.sha256");
    std::fs::write(&list_path, list).map_err(|e| format!("cannot write {}: {e}", list_path.display()))?;
    Ok(files)
}

/// The six files of a family's external device code, `(arch, extension)`, in the order of
/// `DeviceCode::External` (emitted into `kernels.rs` as `DEVICE_FILE_ORDER`: one list for both).
const DEVICE_FILE_ORDER: [(&str, &str); 6] = [
    ("sm_90", "ptx"),
    ("sm_80", "ptx"),
    ("sm_90", "cubin"),
    ("sm_80", "cubin"),
    ("sm_90", "ptxas.txt"),
    ("sm_80", "ptxas.txt"),
];

/// The module table (`kernels.rs`): the device code embedded, or, with `external`, the size and
/// hash of each file.
fn generated_module_table(families: &[String], external: Option<&BTreeMap<String, (u64, String)>>) -> String {
    let mut s = String::from("// @generated by build.rs from the kernels/*.cu files.\n");
    let _ = writeln!(s, "const EXTERNAL: bool = {};\n", external.is_some());
    let _ = writeln!(s, "#[allow(dead_code)]\nconst DEVICE_FILE_ORDER: [(&str, &str); 6] = {DEVICE_FILE_ORDER:?};\n");
    s.push_str("unsafe extern \"C\" {\n");
    for f in families {
        let _ = writeln!(s, "    fn llk_emu_kernels_{f}(count: *mut u64) -> *const crate::ffi::emu_abi::LlkEmuKernel;");
    }
    s.push_str("}\n\n/// Every kernel family, in file-name order.\npub(crate) static MODULES: &[ModuleSource] = &[\n");
    for f in families {
        let code = match external {
            None => {
                let file =
                    |arch: &str, ext: &str| format!("include_str!(concat!(env!(\"OUT_DIR\"), \"/{arch}/{f}.{ext}\"))");
                let bin = |arch: &str| format!("include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{arch}/{f}.cubin\"))");
                format!(
                    "DeviceCode::Embedded(DeviceFiles {{\n            ptx_sm90: {},\n            ptx_sm80: {},\n            \
                     cubin_sm90: {},\n            cubin_sm80: {},\n            \
                     ptxas_sm90: {},\n            ptxas_sm80: {},\n        }})",
                    file("sm_90", "ptx"),
                    file("sm_80", "ptx"),
                    bin("sm_90"),
                    bin("sm_80"),
                    file("sm_90", "ptxas.txt"),
                    file("sm_80", "ptxas.txt"),
                )
            }
            Some(files) => {
                let mut v = String::from("DeviceCode::External([\n");
                for (arch, ext) in DEVICE_FILE_ORDER {
                    let path = format!("{arch}/{f}.{ext}");
                    let (bytes, sha) = files.get(&path).cloned().unwrap_or_default();
                    let _ = writeln!(
                        v,
                        "            ExternalFile {{ path: \"{path}\", bytes: {bytes}, sha256: \"{sha}\" }},"
                    );
                }
                v.push_str("        ])");
                v
            }
        };
        let _ = writeln!(
            s,
            "    ModuleSource {{\n        name: \"{f}\",\n        code: {code},\n        emu_table: llk_emu_kernels_{f},\n    }},"
        );
    }
    s.push_str("];\n");
    s
}
