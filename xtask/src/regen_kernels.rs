//! Regenerates the kernel crate's `kernels/prebuilt/`: PTX, cubins and `ptxas -v` reports of
//! every kernel family, and the manifest (`cargo xtask regen-kernels`).
//!
//! It compiles with the very code `build.rs` uses (`build/device_code.rs`), with the pinned nvcc
//! (`scripts/setup.sh`). When the manifest already matches the sources, the settings and the nvcc
//! version, and every file is intact, it does nothing (`--force` rebuilds anyway). Files whose
//! bytes do not change are not rewritten; files of removed families are deleted.
//! `--check`: only report whether the committed copy is fresh (exit 1 if not).

use std::path::Path;

use crate::device_code::{self, MANIFEST_PATH, Manifest, PINNED_NVCC_RELEASE, PREBUILT_DIR, Toolchain};

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
    let families = device_code::families(&root)?;
    let prebuilt = root.join(PREBUILT_DIR);

    let stale = staleness(&root, &tc, &families);
    if check {
        return match stale {
            None => {
                println!("regen-kernels: {PREBUILT_DIR} is fresh");
                Ok(())
            }
            Some(why) => Err(format!("{PREBUILT_DIR} is stale:\n{why}run {}", device_code::REGENERATE)),
        };
    }
    if let (None, false) = (&stale, force) {
        println!("regen-kernels: {PREBUILT_DIR} is up to date ({}); nothing to do", tc.short_release());
        return Ok(());
    }
    if let Some(why) = &stale {
        print!("regen-kernels: rebuilding, because:\n{why}");
    }

    // Build into a scratch folder, then copy what changed.
    let scratch = crate::repo_root().join("target/regen-kernels");
    let _ = std::fs::remove_dir_all(&scratch);
    let started = std::time::Instant::now();
    for w in device_code::build_all(&tc, &root, &scratch, &families)? {
        println!("regen-kernels: warning: {w}");
    }
    let manifest = Manifest::describe(&tc, &root, &scratch, &families)?;
    let root_bytes = root.to_string_lossy().into_owned();
    let mut written = 0;
    for f in device_code::output_files(&families) {
        let bytes = std::fs::read(scratch.join(&f)).map_err(|e| format!("cannot read {f}: {e}"))?;
        // The output must not depend on where the checkout is.
        if contains(&bytes, root_bytes.as_bytes()) {
            return Err(format!("{f} contains the checkout path {root_bytes}: the normalization missed it"));
        }
        written += write_if_changed(&prebuilt.join(&f), &bytes)? as usize;
    }
    let removed = remove_unlisted(&prebuilt, &device_code::output_files(&families))?;
    written += write_if_changed(&root.join(MANIFEST_PATH), manifest.render().as_bytes())? as usize;
    let _ = std::fs::remove_dir_all(&scratch);
    println!(
        "regen-kernels: {} families x {} archs built in {:.1} s with {}; {written} files written, {removed} removed",
        families.len(),
        device_code::ARCHS.len(),
        started.elapsed().as_secs_f64(),
        tc.short_release()
    );
    Ok(())
}

/// Why the committed copy is not what this toolchain would make, or None.
fn staleness(root: &Path, tc: &Toolchain, families: &[String]) -> Option<String> {
    let problems = match device_code::verify_prebuilt(root) {
        Ok(text) => match Manifest::parse(&text) {
            Ok(m) if m.nvcc_version != tc.nvcc_version || m.ptxas_version != tc.ptxas_version => {
                vec![format!("nvcc/ptxas version: manifest {} / {}", m.nvcc_version, m.ptxas_version)]
            }
            Ok(_) => Vec::new(),
            Err(e) => vec![e],
        },
        Err(problems) => problems.iter().map(|p| p.to_string()).collect(),
    };
    let mut problems = problems;
    // Files that no family produces any more.
    if let Ok(extra) = unlisted(&root.join(PREBUILT_DIR), &device_code::output_files(families)) {
        problems.extend(extra.into_iter().map(|f| format!("not produced by any family: {PREBUILT_DIR}/{f}")));
    }
    if problems.is_empty() { None } else { Some(problems.iter().map(|p| format!("    {p}\n")).collect()) }
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

/// Files under `<prebuilt>/<arch>/` that are not in `keep`.
fn unlisted(prebuilt: &Path, keep: &[String]) -> Result<Vec<String>, String> {
    let mut v = Vec::new();
    let Ok(rd) = std::fs::read_dir(prebuilt) else { return Ok(v) };
    for dir in rd.flatten().filter(|e| e.path().is_dir()) {
        let arch = dir.file_name().to_string_lossy().into_owned();
        let files = std::fs::read_dir(dir.path()).map_err(|e| format!("cannot read {}: {e}", dir.path().display()))?;
        for f in files.flatten() {
            let rel = format!("{arch}/{}", f.file_name().to_string_lossy());
            if !keep.contains(&rel) {
                v.push(rel);
            }
        }
    }
    v.sort();
    Ok(v)
}

fn remove_unlisted(prebuilt: &Path, keep: &[String]) -> Result<usize, String> {
    let extra = unlisted(prebuilt, keep)?;
    for f in &extra {
        std::fs::remove_file(prebuilt.join(f)).map_err(|e| format!("cannot remove {f}: {e}"))?;
    }
    Ok(extra.len())
}
