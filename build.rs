//! Builds every kernel family in `kernels/*.cu` two ways:
//!
//! * to PTX with nvcc, for sm_90 and sm_80, embedded in the crate with `include_str!`; ptxas then
//!   assembles each PTX to a cubin and its `-v` report (registers, spills, shared memory) is kept
//!   next to it, embedded too, so that tests and `llama-kernels info` can read it;
//! * for the host with the system C++ compiler against the emulation runtime
//!   (`kernels/emu/`), always with optimization, into a static library.
//!
//! The list of families is the list of `.cu` files in `kernels/`: nothing is kept by hand.
//! nvcc is looked up in this order: `$NVCC`, `$CUDA_HOME`/`$CUDA_PATH`, the project-local toolchain
//! that `scripts/setup.sh` installs, `PATH`, then `/usr/local/cuda`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

const ARCHS: [&str; 2] = ["sm_90", "sm_80"];

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let kernels = root.join("kernels");

    for var in ["NVCC", "CUDA_HOME", "CUDA_PATH", "LLK_HOST_CXXFLAGS"] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");
    rerun_if_changed_tree(&kernels);

    let nvcc = find_nvcc(&root).unwrap_or_else(|| {
        panic!(
            "\n\nllama-kernels: nvcc was not found.\n\
             It is needed to build the CUDA kernels (even on a machine without a GPU).\n\
             Either run `scripts/setup.sh`, which installs the pinned CUDA 13.0 nvcc wheels from PyPI\n\
             into ./.toolchain (no GPU, no root needed), or point the build at a CUDA install with\n\
             NVCC=/path/to/nvcc or CUDA_HOME=/usr/local/cuda.\n\n"
        )
    });
    let cuda_bin = nvcc.parent().expect("nvcc has a parent folder").to_path_buf();
    let ptxas = cuda_bin.join("ptxas");

    let families = kernel_families(&kernels);
    assert!(!families.is_empty(), "no kernels/*.cu files found");

    // Device code: nvcc -ptx and ptxas -v for every (family, arch), in parallel.
    let jobs: Vec<(String, &str)> = families.iter().flat_map(|f| ARCHS.iter().map(move |a| (f.clone(), *a))).collect();
    std::thread::scope(|s| {
        let handles: Vec<_> = jobs
            .iter()
            .map(|(family, arch)| {
                let (nvcc, ptxas, kernels, out) = (&nvcc, &ptxas, &kernels, &out);
                s.spawn(move || build_ptx(nvcc, ptxas, kernels, out, family, arch))
            })
            .collect();
        for h in handles {
            h.join().expect("a PTX build thread panicked");
        }
    });

    // Host code: the same sources through the emulation runtime, optimized in every profile.
    let mut host = cc::Build::new();
    host.cpp(true)
        .std("c++20")
        .opt_level(3)
        .debug(false)
        .include(&kernels)
        .flag("-x")
        .flag("c++")
        .flag("-fno-strict-aliasing") // kernels reinterpret 16-byte vectors as elements
        .flag("-ftls-model=initial-exec") // __shared__ is thread_local: keep its access cheap
        .flag("-fstack-clash-protection") // big frames probe their pages: an overflow hits a canary or the guard
        .flag("-Wno-unused-parameter")
        .flag("-Wno-unused-function")
        .flag("-Wno-unknown-pragmas")
        .flag("-Wno-unused-variable")
        .warnings(true);
    if let Ok(extra) = std::env::var("LLK_HOST_CXXFLAGS") {
        for f in extra.split_whitespace() {
            host.flag(f);
        }
    }
    for family in &families {
        host.file(kernels.join(format!("{family}.cu")));
    }
    host.file(kernels.join("emu/emu_exports.cc"));
    host.compile("llama_kernels_emu");

    std::fs::write(out.join("kernels.rs"), generated_module_table(&families)).expect("write kernels.rs");
    println!("cargo:rustc-env=LLK_CUDA_BIN={}", cuda_bin.display());
    println!("cargo:rustc-env=LLK_DEVICE_CODE_ORIGIN=source (nvcc {})", nvcc.display());
    println!("cargo:rustc-env=LLK_KERNEL_BUILD_DIR={}", out.display());
}

/// `kernels/<family>.cu` stems, sorted.
fn kernel_families(kernels: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(kernels)
        .expect("read kernels/")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .collect();
    v.sort();
    for f in &v {
        assert!(
            f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "kernel file name {f}.cu must be a C identifier"
        );
    }
    v
}

fn rerun_if_changed_tree(dir: &Path) {
    println!("cargo:rerun-if-changed={}", dir.display());
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                rerun_if_changed_tree(&p);
            } else {
                println!("cargo:rerun-if-changed={}", p.display());
            }
        }
    }
}

fn find_nvcc(root: &Path) -> Option<PathBuf> {
    let is_exe = |p: &Path| p.is_file();
    if let Ok(p) = std::env::var("NVCC") {
        let p = PathBuf::from(p);
        if is_exe(&p) {
            return Some(p);
        }
        panic!("NVCC={} does not exist", p.display());
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Ok(home) = std::env::var(var) {
            let p = PathBuf::from(home).join("bin/nvcc");
            if is_exe(&p) {
                return Some(p);
            }
        }
    }
    let local = root.join(".toolchain/python/nvidia/cu13/bin/nvcc");
    if is_exe(&local) {
        return Some(local);
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if is_exe(&p) {
                return Some(p);
            }
        }
    }
    let system = PathBuf::from("/usr/local/cuda/bin/nvcc");
    is_exe(&system).then_some(system)
}

fn run(cmd: &mut Command, what: &str) -> std::process::Output {
    let output = cmd.output().unwrap_or_else(|e| panic!("{what}: could not run {:?}: {e}", cmd.get_program()));
    if !output.status.success() {
        panic!(
            "{what} failed ({}):\n{}\n{}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    output
}

fn build_ptx(nvcc: &Path, ptxas: &Path, kernels: &Path, out: &Path, family: &str, arch: &str) {
    let dir = out.join(arch);
    std::fs::create_dir_all(&dir).expect("create PTX folder");
    let src = kernels.join(format!("{family}.cu"));
    let ptx = dir.join(format!("{family}.ptx"));
    run(
        Command::new(nvcc)
            .args(["-ptx", "-O3", "-std=c++17", "-lineinfo", "-DNDEBUG"])
            .arg(format!("-arch={arch}"))
            .arg("-I")
            .arg(kernels)
            .arg(&src)
            .arg("-o")
            .arg(&ptx),
        &format!("nvcc {family}.cu for {arch}"),
    );
    let report = run(
        Command::new(ptxas)
            .args(["-v", "-O3"])
            .arg(format!("-arch={arch}"))
            .arg(&ptx)
            .arg("-o")
            .arg(dir.join(format!("{family}.cubin"))),
        &format!("ptxas {family}.ptx for {arch}"),
    );
    std::fs::write(dir.join(format!("{family}.ptxas.txt")), &report.stderr).expect("write ptxas report");
}

fn generated_module_table(families: &[String]) -> String {
    let mut s = String::from("// @generated by build.rs from the kernels/*.cu files.\n");
    s.push_str("unsafe extern \"C\" {\n");
    for f in families {
        let _ =
            writeln!(s, "    fn llk_emu_kernels_{f}(count: *mut u64) -> *const crate::backend::emu_abi::LlkEmuKernel;");
    }
    s.push_str("}\n\n/// Every kernel family, in file-name order.\npub(crate) static MODULES: &[ModuleSource] = &[\n");
    for f in families {
        let file = |arch: &str, ext: &str| format!("include_str!(concat!(env!(\"OUT_DIR\"), \"/{arch}/{f}.{ext}\"))");
        let bin = |arch: &str| format!("include_bytes!(concat!(env!(\"OUT_DIR\"), \"/{arch}/{f}.cubin\"))");
        let _ = writeln!(
            s,
            "    ModuleSource {{\n        name: \"{f}\",\n        ptx_sm90: {},\n        ptx_sm80: {},\n        \
             cubin_sm90: {},\n        cubin_sm80: {},\n        \
             ptxas_sm90: {},\n        ptxas_sm80: {},\n        emu_table: llk_emu_kernels_{f},\n    }},",
            file("sm_90", "ptx"),
            file("sm_80", "ptx"),
            bin("sm_90"),
            bin("sm_80"),
            file("sm_90", "ptxas.txt"),
            file("sm_80", "ptxas.txt"),
        );
    }
    s.push_str("];\n");
    s
}
