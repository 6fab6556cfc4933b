//! Regenerates the kernel crate's `kernels/prebuilt/`: the PTX, cubins and `ptxas -v` reports
//! of every kernel family in one zstd-compressed tar, and the manifest
//! (`cargo xtask regen-kernels`); and unpacks the archive (`cargo xtask unpack-prebuilt`).
//!
//! It compiles with the very code `build.rs` uses (`build/device_code.rs`), with the pinned nvcc
//! (`scripts/setup.sh`). When the manifest already matches the sources, the settings and the nvcc
//! version, and every file in the archive is intact, it does nothing (`--force` rebuilds anyway).
//! The archive is rewritten only when a file in it changes. `--check`: only report whether the
//! committed copy is fresh (an error if not).
//!
//! The archive is deterministic for a given zstd: entries sorted by name, no folders, mode 0644,
//! owner 0, time 0. Its bytes are not hashed anywhere (the manifest hashes the files in it), so
//! another zstd version writing other bytes changes nothing that is checked.

use std::path::{Path, PathBuf};

use crate::device_code::{self, MANIFEST_PATH, Manifest, PINNED_NVCC_RELEASE, PREBUILT_ARCHIVE, Toolchain};

/// zstd's strongest level, with a window that spans the whole archive: the PTX of sm_90 and
/// sm_80 and the cubins built from them repeat each other across files.
const ZSTD_LEVEL: i32 = 19;
const ZSTD_WINDOW_LOG: u32 = 26;

/// Rebuilds the committed copy when it is stale (or always, with `force`); with `check`, only
/// says whether it is fresh (an error when not).
pub fn run(force: bool, check: bool) -> Result<(), String> {
    let root = crate::kernel_crate();
    let root = root.as_path();
    // The pinned toolchain of scripts/setup.sh first, whatever else is installed.
    let nvcc = match device_code::project_toolchain_bin(root).map(|b| b.join("nvcc")).filter(|p| p.is_file()) {
        Some(nvcc) => nvcc,
        None => device_code::find_nvcc(root)?.ok_or("nvcc not found: run scripts/setup.sh first")?,
    };
    let tc = Toolchain::new(nvcc)?;
    if tc.nvcc_release != PINNED_NVCC_RELEASE {
        return Err(format!(
            "{} is `{}`; the prebuilt copy is made with `{PINNED_NVCC_RELEASE}` \
             (scripts/setup.sh installs it; `cargo xtask regen-kernels` uses it)",
            tc.nvcc.display(),
            tc.nvcc_release
        ));
    }
    let families = device_code::families(root)?;
    let stale = staleness(root, &tc, &families);
    if check {
        return match stale {
            None => {
                println!("regen-kernels: {PREBUILT_ARCHIVE} is fresh");
                Ok(())
            }
            Some(why) => Err(format!("{PREBUILT_ARCHIVE} is stale:\n{why}run {}", device_code::REGENERATE)),
        };
    }
    if let (None, false) = (&stale, force) {
        println!("regen-kernels: {PREBUILT_ARCHIVE} is up to date ({}); nothing to do", tc.short_release());
        return Ok(());
    }
    if let Some(why) = &stale {
        print!("regen-kernels: rebuilding, because:\n{why}");
    }

    // Build into a scratch folder, then pack it.
    let scratch = scratch("regen-kernels");
    let started = std::time::Instant::now();
    for w in device_code::build_all(&tc, root, &scratch, &families)? {
        println!("regen-kernels: warning: {w}");
    }
    let manifest = Manifest::describe(&tc, root, &scratch, &families)?;
    let root_bytes = root.canonicalize().unwrap_or_else(|_| root.to_path_buf()).to_string_lossy().into_owned();
    for f in device_code::output_files(&families) {
        let bytes = std::fs::read(scratch.join(&f)).map_err(|e| format!("cannot read {f}: {e}"))?;
        // The output must not depend on where the checkout is.
        if contains(&bytes, root_bytes.as_bytes()) {
            return Err(format!("{f} contains the checkout path {root_bytes}: the normalization missed it"));
        }
    }
    let old = std::fs::read_to_string(root.join(MANIFEST_PATH)).ok().and_then(|t| Manifest::parse(&t).ok());
    let same_files = old.is_some_and(|m| m.outputs == manifest.outputs) && stale_files(root, &families).is_none();
    let mut written = Vec::new();
    if !same_files {
        let archive = pack(&scratch, &device_code::output_files(&families))?;
        std::fs::write(root.join(PREBUILT_ARCHIVE), &archive)
            .map_err(|e| format!("cannot write {PREBUILT_ARCHIVE}: {e}"))?;
        written.push(format!("{PREBUILT_ARCHIVE} ({} bytes)", archive.len()));
    }
    if write_if_changed(&root.join(MANIFEST_PATH), manifest.render().as_bytes())? {
        written.push(MANIFEST_PATH.to_string());
    }
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "regen-kernels: {} families x {} archs built in {:.1} s with {}; written: {}",
        families.len(),
        device_code::ARCHS.len(),
        started.elapsed().as_secs_f64(),
        tc.short_release(),
        if written.is_empty() { "nothing".to_string() } else { written.join(", ") }
    );
    Ok(())
}

/// Unpacks every file of the committed archive into `dest` (checked against the manifest).
pub fn unpack(dest: &Path) -> Result<(), String> {
    let root = crate::kernel_crate();
    let families = device_code::families(&root)?;
    device_code::unpack_verified(&root, dest, &families).map_err(|p| device_code::describe(&p))?;
    Ok(())
}

/// The files `names` under `dir` as a deterministic tar, compressed with zstd.
pub fn pack(dir: &Path, names: &[String]) -> Result<Vec<u8>, String> {
    let mut names = names.to_vec();
    names.sort();
    let mut tar = tar::Builder::new(Vec::new());
    for name in &names {
        let bytes = std::fs::read(dir.join(name)).map_err(|e| format!("cannot read {name}: {e}"))?;
        let mut header = tar::Header::new_ustar();
        header.set_size(bytes.len() as u64);
        header.set_mode(0o644);
        header.set_mtime(0);
        header.set_uid(0);
        header.set_gid(0);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, bytes.as_slice()).map_err(|e| format!("tar {name}: {e}"))?;
    }
    let tarball = tar.into_inner().map_err(|e| format!("tar: {e}"))?;
    let mut encoder = zstd::Encoder::new(Vec::new(), ZSTD_LEVEL).map_err(|e| format!("zstd: {e}"))?;
    encoder.long_distance_matching(true).map_err(|e| format!("zstd: {e}"))?;
    encoder.window_log(ZSTD_WINDOW_LOG).map_err(|e| format!("zstd: {e}"))?;
    std::io::Write::write_all(&mut encoder, &tarball).map_err(|e| format!("zstd: {e}"))?;
    encoder.finish().map_err(|e| format!("zstd: {e}"))
}

/// A fresh folder under the repository's target folder.
fn scratch(name: &str) -> PathBuf {
    let dir = crate::repo_root().join("target").join(name);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Why the files in the committed archive are not those the manifest lists, or None.
fn stale_files(root: &Path, families: &[String]) -> Option<String> {
    let manifest = std::fs::read_to_string(root.join(MANIFEST_PATH)).map_err(|e| e.to_string());
    let manifest = match manifest.and_then(|t| Manifest::parse(&t)) {
        Ok(m) => m,
        Err(e) => return Some(format!("    {MANIFEST_PATH}: {e}\n")),
    };
    let dir = scratch("regen-kernels-check");
    let unpacked = device_code::unpack_prebuilt(root, &dir, families);
    let mut problems: Vec<String> = match unpacked {
        Ok(extra) => device_code::check_outputs(&dir, &manifest, families)
            .iter()
            .map(|p| p.to_string())
            .chain(extra.into_iter().map(|f| format!("not produced by any family: {f}")))
            .collect(),
        Err(e) => vec![e],
    };
    let _ = std::fs::remove_dir_all(&dir);
    problems.sort();
    if problems.is_empty() { None } else { Some(problems.iter().map(|p| format!("    {p}\n")).collect()) }
}

/// Why the committed copy is not what this toolchain would make, or None.
fn staleness(root: &Path, tc: &Toolchain, families: &[String]) -> Option<String> {
    let mut problems: Vec<String> = match device_code::check_manifest(root) {
        Ok(text) => match Manifest::parse(&text) {
            Ok(m) if m.nvcc_version != tc.nvcc_version || m.ptxas_version != tc.ptxas_version => {
                vec![format!("nvcc/ptxas version: manifest {} / {}", m.nvcc_version, m.ptxas_version)]
            }
            Ok(_) => Vec::new(),
            Err(e) => vec![e],
        },
        Err(problems) => problems.iter().map(|p| p.to_string()).collect(),
    };
    problems = problems.into_iter().map(|p| format!("    {p}\n")).collect();
    if problems.is_empty() {
        return stale_files(root, families);
    }
    Some(problems.concat())
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}

fn write_if_changed(path: &Path, bytes: &[u8]) -> Result<bool, String> {
    if std::fs::read(path).is_ok_and(|old| old == bytes) {
        return Ok(false);
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    std::fs::write(path, bytes).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(true)
}
