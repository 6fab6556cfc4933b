//! The device build of llama-kernels: which files go in, how nvcc and ptxas turn them into PTX,
//! cubins and `ptxas -v` reports, and the manifest of the committed copy in `kernels/prebuilt/`.
//!
//! One module, three users, so that no flag is written twice:
//!
//! * `build.rs` compiles from source with [`build_all`], or unpacks the prebuilt copy with
//!   [`unpack_verified`], which refuses a copy whose manifest disagrees with the sources, these
//!   settings or the unpacked files;
//! * `cargo xtask regen-kernels` runs the same [`build_all`] and writes its output, packed, and a
//!   [`Manifest`] into `kernels/prebuilt/`;
//! * `cargo xtask regen-kernels --check` says whether the committed copy is fresh.
//!
//! The manifest (`kernels/prebuilt/manifest.txt`) is text, one `key value` per line; `#` starts
//! a comment line. Keys, in the order they are written:
//!
//! | key | value |
//! | --- | --- |
//! | `format` | `llama-kernels-prebuilt 1` |
//! | `nvcc-release` | nvcc's `Cuda compilation tools, release ...` line |
//! | `nvcc-version` | the last line of `nvcc --version` (`Build cuda_...`) |
//! | `ptxas-version` | the last line of `ptxas --version` |
//! | `archs` | the architectures, space-separated |
//! | `nvcc-command` | the nvcc command line, with `<arch>` and `<family>` placeholders |
//! | `ptxas-command` | the ptxas command line, likewise |
//! | `normalization` | what is rewritten between nvcc and ptxas, and in the report |
//! | `input` | `<sha256> <path>`: one per input of the device build, relative to the crate root |
//! | `output` | `<sha256> <path>`: one per generated file, its path inside the archive |
//!
//! The inputs are every file under `kernels/` except `kernels/emu/` (host-only), `kernels/prebuilt/`
//! and hidden files: the `.cu` files, `kernels/common/`, `kernels/params.h`.
//!
//! Determinism. The same sources give the same bytes in every checkout, because:
//! nvcc runs in the crate root on relative paths, with cicc's `--orig_src_path_name` set to the
//! relative source path (it seeds the hash in the names of anonymous-namespace symbols, otherwise
//! taken from the absolute path); the `.file` directives of `-lineinfo` are rewritten to
//! `kernels/...` and `cuda/include/...` (nvcc writes absolute paths); ptxas runs in an empty
//! folder, so that it cannot find those files and record their modification times in the cubin's
//! line table; and the `Compile time = ... ms` lines are dropped from the `ptxas -v` report.
//! One dependency remains outside our control: nvcc preprocesses with the host `gcc` (its
//! version is passed to cicc); no difference has been seen from it.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

#[path = "manifest.rs"]
mod manifest;
pub use manifest::*;

/// GPU architectures with embedded PTX and cubins.
pub const ARCHS: [&str; 2] = ["sm_90", "sm_80"];
/// The generated files of one family and architecture: `<family>.<ext>`.
pub const OUTPUT_EXTS: [&str; 3] = ["ptx", "cubin", "ptxas.txt"];
/// The committed copy, relative to the crate root.
pub const PREBUILT_DIR: &str = "kernels/prebuilt";
/// Its manifest, relative to the crate root.
pub const MANIFEST_PATH: &str = "kernels/prebuilt/manifest.txt";
/// Its files, relative to the crate root: one tar of `<arch>/<family>.<ext>` (the layout of an
/// output folder of [`build_all`]), compressed with zstd. Text that nvcc and ptxas write for two
/// architectures shares most of its bytes, and a long-window zstd finds them across files: the
/// archive is about a sixteenth of the files (gzip, what a registry package applies, a fifth).
pub const PREBUILT_ARCHIVE: &str = "kernels/prebuilt/device-code.tar.zst";
/// The largest file the archive may hold (the biggest real one is under 5 MiB).
const MAX_PREBUILT_FILE: u64 = 256 << 20;
/// The manifest's `format` value.
pub const FORMAT: &str = "llama-kernels-prebuilt 1";
/// The nvcc release the committed copy is made with (`scripts/setup.sh` installs it).
pub const PINNED_NVCC_RELEASE: &str = "Cuda compilation tools, release 13.0, V13.0.88";
/// How to regenerate the committed copy, in a checkout of the repository.
pub const REGENERATE: &str = "scripts/setup.sh && cargo xtask regen-kernels";

/// nvcc's flags, before `-arch`.
const NVCC_FLAGS: [&str; 4] = ["-ptx", "-O3", "-std=c++17", "-DNDEBUG"];
/// The architecture whose PTX and cubins may carry `-lineinfo`: the one the static performance
/// report reads.
pub const LINEINFO_ARCH: &str = "sm_90";
/// The families built with `-lineinfo` at [`LINEINFO_ARCH`]: those whose hot path the static
/// performance report reads from the line table (a report `Spec` with a `cold_source`, and the
/// Hopper kernels' wgmma loops: without the table it cannot analyze the kernel, and
/// `tests/perf_report.rs` fails). Line tables triple
/// a cubin, and the package
/// has to stay under crates.io's 10 MB, so the other families (and every sm_80 copy) go without;
/// compute-sanitizer then names their kernels and offsets but not source lines.
pub const LINEINFO_FAMILIES: [&str; 2] = ["attention", "attention_sm90"];

/// Whether `family` is built with `-lineinfo` for `arch`.
pub fn has_lineinfo(arch: &str, family: &str) -> bool {
    arch == LINEINFO_ARCH && LINEINFO_FAMILIES.contains(&family)
}
/// The families whose sm_90 code is built for sm_90a, the architecture-specific features of
/// compute capability 9.0 (wgmma, setmaxnreg): it runs on H100 and H200 only, and the crate
/// selects these kernels only there.
pub const SM90A_FAMILIES: [&str; 1] = ["attention_sm90"];

/// The `-arch` value for `family` in the `arch` slot: sm_90a for [`SM90A_FAMILIES`] at sm_90.
pub fn target_arch(arch: &str, family: &str) -> String {
    if arch == "sm_90" && SM90A_FAMILIES.contains(&family) { "sm_90a".to_string() } else { arch.to_string() }
}
/// ptxas's flags, before `-arch`.
const PTXAS_FLAGS: [&str; 2] = ["-v", "-O3"];
/// What happens between nvcc and ptxas (recorded in the manifest: a change makes the copy stale).
pub const NORMALIZATION: &str = "ptx .file paths -> kernels/... and cuda/include/... without timestamps; \
     ptxas runs in an empty folder; report without 'Compile time' lines";

/// The nvcc arguments for one family and architecture. nvcc runs in the crate root.
/// `pin_module_path`: pass the relative source path to cicc as `--orig_src_path_name` (see the
/// module docs); only a build whose nvcc rejects the option goes without.
pub fn nvcc_args(arch: &str, family: &str, out_ptx: &str, pin_module_path: bool) -> Vec<String> {
    let src = format!("kernels/{family}.cu");
    let mut v: Vec<String> = NVCC_FLAGS.iter().map(|s| s.to_string()).collect();
    if has_lineinfo(arch, family) {
        v.push("-lineinfo".to_string());
    }
    v.push(format!("-arch={}", target_arch(arch, family)));
    v.extend(["-I".to_string(), "kernels".to_string()]);
    if pin_module_path {
        v.extend(["-Xcicc", "--orig_src_path_name", "-Xcicc"].map(String::from));
        v.push(src.clone());
    }
    v.push(src);
    v.extend(["-o".to_string(), out_ptx.to_string()]);
    v
}

/// The ptxas arguments for one family and architecture.
pub fn ptxas_args(arch: &str, ptx: &str, cubin: &str) -> Vec<String> {
    let mut v: Vec<String> = PTXAS_FLAGS.iter().map(|s| s.to_string()).collect();
    v.push(format!("-arch={arch}"));
    v.extend([ptx.to_string(), "-o".to_string(), cubin.to_string()]);
    v
}

/// The manifest's `nvcc-command` value: one command per architecture, and the families that add
/// `-lineinfo`.
pub fn nvcc_command() -> String {
    let mut parts: Vec<String> = ARCHS
        .iter()
        .map(|a| format!("{a}: nvcc {}", nvcc_args(a, "<family>", "<family>.ptx", true).join(" ")))
        .collect();
    parts.push(format!("-lineinfo before -arch at {LINEINFO_ARCH} for: {}", LINEINFO_FAMILIES.join(", ")));
    parts.push(format!("-arch=sm_90a (nvcc and ptxas) at sm_90 for: {}", SM90A_FAMILIES.join(", ")));
    parts.join("; ")
}

/// The manifest's `ptxas-command` value.
pub fn ptxas_command() -> String {
    format!("ptxas {}", ptxas_args("<arch>", "<family>.ptx", "<family>.cubin").join(" "))
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// The kernel families: the `kernels/<family>.cu` stems, sorted.
pub fn families(root: &Path) -> Result<Vec<String>, String> {
    let dir = root.join("kernels");
    let rd = std::fs::read_dir(&dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut v = Vec::new();
    for entry in rd.flatten() {
        let p = entry.path();
        if p.is_file() && p.extension().is_some_and(|x| x == "cu") {
            let stem = p.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
            if stem.is_empty() || !stem.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(format!("kernel file name kernels/{stem}.cu must be a C identifier"));
            }
            v.push(stem);
        }
    }
    v.sort();
    if v.is_empty() {
        return Err(format!("no kernels/*.cu files in {}", dir.display()));
    }
    Ok(v)
}

/// Every input of the device build, relative to the crate root with `/` separators, sorted.
pub fn input_files(root: &Path) -> Result<Vec<String>, String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>) -> Result<(), String> {
        let rd = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        for entry in rd.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let rel = format!("{rel}/{name}");
            if name.starts_with('.') || rel == "kernels/emu" || rel == PREBUILT_DIR {
                continue;
            }
            let p = entry.path();
            if p.is_dir() {
                walk(&p, &rel, out)?;
            } else if p.is_file() {
                out.push(rel);
            }
        }
        Ok(())
    }
    let mut v = Vec::new();
    walk(&root.join("kernels"), "kernels", &mut v)?;
    v.sort();
    Ok(v)
}

/// SHA-256 of every input, by path.
pub fn hash_inputs(root: &Path) -> Result<BTreeMap<String, String>, String> {
    input_files(root)?.into_iter().map(|f| Ok((f.clone(), sha256_hex(&read(&root.join(&f))?)))).collect()
}

/// Every generated file, relative to the output folder: `<arch>/<family>.<ext>`.
pub fn output_files(families: &[String]) -> Vec<String> {
    let mut v = Vec::new();
    for arch in ARCHS {
        for f in families {
            for ext in OUTPUT_EXTS {
                v.push(format!("{arch}/{f}.{ext}"));
            }
        }
    }
    v
}

// ---------------------------------------------------------------------------------------------
// The toolchain.

/// Looks for nvcc: `$NVCC`, `$CUDA_HOME`/`$CUDA_PATH`, the project toolchain of
/// `scripts/setup.sh`, `PATH`, `/usr/local/cuda`. An `NVCC` that names no file is an error.
pub fn find_nvcc(root: &Path) -> Result<Option<PathBuf>, String> {
    if let Some(p) = std::env::var_os("NVCC").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() { Ok(Some(p)) } else { Err(format!("NVCC={} is not a file", p.display())) };
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(home) = std::env::var_os(var).filter(|p| !p.is_empty()) {
            let p = PathBuf::from(home).join("bin/nvcc");
            if p.is_file() {
                return Ok(Some(p));
            }
        }
    }
    if let Some(local) = project_toolchain_bin(root).map(|bin| bin.join("nvcc")).filter(|p| p.is_file()) {
        return Ok(Some(local));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let p = dir.join("nvcc");
            if p.is_file() {
                return Ok(Some(p));
            }
        }
    }
    let system = PathBuf::from("/usr/local/cuda/bin/nvcc");
    Ok(system.is_file().then_some(system))
}

/// The repository this crate is built in, when it is built in one (`<repo>/crates/llama-kernels`,
/// beside `<repo>/scripts/setup.sh`); `None` for a crate unpacked from its package.
pub fn repository_root(root: &Path) -> Option<PathBuf> {
    let crates = root.parent()?;
    let repo = crates.parent()?;
    (crates.file_name()? == "crates" && repo.join("scripts/setup.sh").is_file()).then(|| repo.to_path_buf())
}

/// Where `scripts/setup.sh` installs nvcc, ptxas and cuobjdump: `.toolchain` in the repository
/// root; `None` outside a repository checkout.
pub fn project_toolchain_bin(root: &Path) -> Option<PathBuf> {
    repository_root(root).map(|r| r.join(".toolchain/python/nvidia/cu13/bin"))
}

/// nvcc and the ptxas beside it, with their versions.
#[derive(Clone, Debug)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    pub ptxas: PathBuf,
    /// `Cuda compilation tools, release 13.0, V13.0.88`
    pub nvcc_release: String,
    /// The last line of `nvcc --version`.
    pub nvcc_version: String,
    /// The last line of `ptxas --version`.
    pub ptxas_version: String,
}

fn version_lines(tool: &Path) -> Result<Vec<String>, String> {
    let out = Command::new(tool)
        .arg("--version")
        .output()
        .map_err(|e| format!("cannot run {} --version: {e}", tool.display()))?;
    if !out.status.success() {
        return Err(format!("{} --version failed ({})", tool.display(), out.status));
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().map(|l| l.trim().to_string()).filter(|l| !l.is_empty()).collect())
}

impl Toolchain {
    pub fn new(nvcc: PathBuf) -> Result<Toolchain, String> {
        let bin = nvcc.parent().ok_or_else(|| format!("{} has no parent folder", nvcc.display()))?;
        let ptxas = bin.join("ptxas");
        if !ptxas.is_file() {
            return Err(format!("ptxas is not beside nvcc (looked for {})", ptxas.display()));
        }
        let lines = version_lines(&nvcc)?;
        let nvcc_release = lines.iter().find(|l| l.starts_with("Cuda compilation tools")).cloned().unwrap_or_default();
        let nvcc_version = lines.last().cloned().unwrap_or_default();
        let ptxas_version = version_lines(&ptxas)?.last().cloned().unwrap_or_default();
        Ok(Toolchain { nvcc, ptxas, nvcc_release, nvcc_version, ptxas_version })
    }

    /// `release 13.0, V13.0.88`
    pub fn short_release(&self) -> &str {
        self.nvcc_release.strip_prefix("Cuda compilation tools, ").unwrap_or(&self.nvcc_release)
    }

    fn bin(&self) -> &Path {
        self.nvcc.parent().unwrap_or(Path::new("."))
    }
}

// ---------------------------------------------------------------------------------------------
// Compiling.

fn run(cmd: &mut Command, what: &str) -> Result<std::process::Output, String> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run {}: {e}", cmd.get_program().to_string_lossy()))?;
    if !out.status.success() {
        return Err(format!(
            "{what} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(out)
}

/// Rewrites the `.file` directives of PTX to machine-independent paths (see the module docs).
/// `kernels_dirs`: the spellings of the crate's `kernels/` folder; `cuda_tops`: those of the
/// CUDA install's root (nvcc's `bin/..`).
pub fn normalize_ptx(ptx: &str, kernels_dirs: &[String], cuda_tops: &[String]) -> String {
    let mut out = String::with_capacity(ptx.len());
    for line in ptx.split_inclusive('\n') {
        match parse_file_directive(line) {
            Some((indent, number, path)) => {
                let stable = stable_path(path, kernels_dirs, cuda_tops);
                out.push_str(&format!("{indent}.file\t{number} \"{stable}\"\n"));
            }
            None => out.push_str(line),
        }
    }
    out
}

/// `<indent>.file <n> "<path>"[, <mtime>, <size>]` -> (indent, n, path).
fn parse_file_directive(line: &str) -> Option<(&str, &str, &str)> {
    let body = line.trim_start();
    let indent = &line[..line.len() - body.len()];
    let rest = body.strip_prefix(".file")?;
    if !rest.starts_with([' ', '\t']) {
        return None;
    }
    let rest = rest.trim_start();
    let (number, rest) = rest.split_once(|c: char| c.is_whitespace())?;
    let rest = rest.trim_start().strip_prefix('"')?;
    let (path, _) = rest.split_once('"')?;
    Some((indent, number, path))
}

fn stable_path(path: &str, kernels_dirs: &[String], cuda_tops: &[String]) -> String {
    for k in kernels_dirs {
        if let Some(rest) = path.strip_prefix(k.as_str()).filter(|r| r.starts_with('/')) {
            return format!("kernels/{}", rest.trim_start_matches('/'));
        }
    }
    for top in cuda_tops {
        if let Some(rest) = path.strip_prefix(top.as_str()).filter(|r| r.starts_with('/')) {
            let mut rest = rest.trim_start_matches('/');
            // A CUDA install keeps its headers in targets/<platform>/include.
            if let Some(r) = rest.strip_prefix("targets/") {
                rest = r.split_once('/').map_or(r, |(_, r)| r.trim_start_matches('/'));
            }
            return format!("cuda/{rest}");
        }
    }
    path.to_string()
}

/// A `ptxas -v` report without its timing lines.
pub fn normalize_report(report: &str) -> String {
    report.split_inclusive('\n').filter(|l| !l.contains("Compile time =")).collect()
}

fn spellings(p: &Path) -> Vec<String> {
    let mut v = vec![p.to_string_lossy().trim_end_matches('/').to_string()];
    if let Ok(c) = p.canonicalize() {
        let c = c.to_string_lossy().trim_end_matches('/').to_string();
        if !v.contains(&c) {
            v.push(c);
        }
    }
    v
}

/// Builds one family for one architecture into `<out>/<arch>/<family>.{ptx,cubin,ptxas.txt}`.
/// Returns a warning to show, if any.
pub fn build_one(tc: &Toolchain, root: &Path, out: &Path, family: &str, arch: &str) -> Result<Option<String>, String> {
    let dir = out.join(arch);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let raw = dir.join(format!("{family}.nvcc.ptx"));
    let ptx = dir.join(format!("{family}.ptx"));
    let cubin = dir.join(format!("{family}.cubin"));
    let what = format!("nvcc kernels/{family}.cu for {arch}");
    let raw_s = raw.to_string_lossy().into_owned();
    let mut warning = None;
    let nvcc =
        |pin: bool| run(Command::new(&tc.nvcc).current_dir(root).args(nvcc_args(arch, family, &raw_s, pin)), &what);
    if let Err(e) = nvcc(true) {
        // An nvcc whose cicc has no --orig_src_path_name: build without it (the names of
        // internal symbols then depend on the checkout's path; the code does not).
        if !e.contains("orig_src_path_name") {
            return Err(e);
        }
        nvcc(false)?;
        warning = Some(format!("{} rejects --orig_src_path_name: PTX built without it", tc.nvcc.display()));
    }
    let text = String::from_utf8(read(&raw)?).map_err(|_| format!("{} is not UTF-8", raw.display()))?;
    let kernels_dirs = spellings(&root.join("kernels"));
    let cuda_tops = [spellings(&tc.bin().join("..")), tc.bin().parent().map(spellings).unwrap_or_default()].concat();
    std::fs::write(&ptx, normalize_ptx(&text, &kernels_dirs, &cuda_tops))
        .map_err(|e| format!("cannot write {}: {e}", ptx.display()))?;
    let _ = std::fs::remove_file(&raw);
    // An empty working folder: ptxas must not find the sources the .file paths name.
    let empty = out.join(format!(".ptxas-cwd-{arch}-{family}"));
    std::fs::create_dir_all(&empty).map_err(|e| format!("cannot create {}: {e}", empty.display()))?;
    let report = run(
        Command::new(&tc.ptxas).current_dir(&empty).args(ptxas_args(
            &target_arch(arch, family),
            &ptx.to_string_lossy(),
            &cubin.to_string_lossy(),
        )),
        &format!("ptxas {family}.ptx for {arch}"),
    )?;
    let _ = std::fs::remove_dir(&empty);
    let report = normalize_report(&String::from_utf8_lossy(&report.stderr));
    let path = dir.join(format!("{family}.ptxas.txt"));
    std::fs::write(&path, report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(warning)
}

/// Builds every family for every architecture into `out`, in parallel. Returns the warnings.
pub fn build_all(tc: &Toolchain, root: &Path, out: &Path, families: &[String]) -> Result<Vec<String>, String> {
    let jobs: Vec<(&String, &str)> = families.iter().flat_map(|f| ARCHS.iter().map(move |a| (f, *a))).collect();
    let results: Vec<Result<Option<String>, String>> = std::thread::scope(|s| {
        let handles: Vec<_> =
            jobs.iter().map(|(family, arch)| s.spawn(move || build_one(tc, root, out, family, arch))).collect();
        handles.into_iter().map(|h| h.join().unwrap_or_else(|_| Err("a device build thread panicked".into()))).collect()
    });
    let mut warnings = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r {
            Ok(w) => warnings.extend(w),
            Err(e) => errors.push(e),
        }
    }
    warnings.dedup();
    if errors.is_empty() { Ok(warnings) } else { Err(errors.join("\n")) }
}
