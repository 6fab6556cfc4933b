//! The manifest of the committed device code (`kernels/prebuilt/manifest.txt`, its format in
//! `device_code.rs`'s docs): writing and parsing it, checking it against the sources, these
//! settings and the unpacked files, and unpacking the prebuilt archive.

use super::*;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Manifest {
    pub format: String,
    pub nvcc_release: String,
    pub nvcc_version: String,
    pub ptxas_version: String,
    pub archs: String,
    pub nvcc_command: String,
    pub ptxas_command: String,
    pub normalization: String,
    /// sha256 by path relative to the crate root.
    pub inputs: BTreeMap<String, String>,
    /// sha256 by path inside the archive ([`PREBUILT_ARCHIVE`]).
    pub outputs: BTreeMap<String, String>,
}

const HEADER: &str = "\
# llama-kernels: prebuilt device code (PTX, cubins, ptxas -v reports) of kernels/*.cu.
# Written by `cargo xtask regen-kernels`; do not edit. Format: build/device_code.rs.
# build.rs uses these files when it finds no nvcc (or LLK_DEVICE_CODE=prebuilt), and only when
# every input hash and the commands below match the current sources and build/device_code.rs.
";

impl Manifest {
    /// The manifest of the files in `built` (an output folder of [`build_all`]).
    pub fn describe(tc: &Toolchain, root: &Path, built: &Path, families: &[String]) -> Result<Manifest, String> {
        let mut outputs = BTreeMap::new();
        for f in output_files(families) {
            outputs.insert(f.clone(), sha256_hex(&read(&built.join(&f))?));
        }
        Ok(Manifest {
            format: FORMAT.into(),
            nvcc_release: tc.nvcc_release.clone(),
            nvcc_version: tc.nvcc_version.clone(),
            ptxas_version: tc.ptxas_version.clone(),
            archs: ARCHS.join(" "),
            nvcc_command: nvcc_command(),
            ptxas_command: ptxas_command(),
            normalization: NORMALIZATION.into(),
            inputs: hash_inputs(root)?,
            outputs,
        })
    }

    pub fn render(&self) -> String {
        let mut s = String::from(HEADER);
        for (k, v) in [
            ("format", &self.format),
            ("nvcc-release", &self.nvcc_release),
            ("nvcc-version", &self.nvcc_version),
            ("ptxas-version", &self.ptxas_version),
            ("archs", &self.archs),
            ("nvcc-command", &self.nvcc_command),
            ("ptxas-command", &self.ptxas_command),
            ("normalization", &self.normalization),
        ] {
            s.push_str(&format!("{k} {v}\n"));
        }
        for (path, sha) in &self.inputs {
            s.push_str(&format!("input {sha} {path}\n"));
        }
        for (path, sha) in &self.outputs {
            s.push_str(&format!("output {sha} {path}\n"));
        }
        s
    }

    pub fn parse(text: &str) -> Result<Manifest, String> {
        let mut m = Manifest::default();
        for (i, line) in text.lines().enumerate() {
            let line = line.trim_end();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let bad = |why: &str| format!("{MANIFEST_PATH} line {}: {why}: {line}", i + 1);
            let (key, value) = line.split_once(' ').ok_or_else(|| bad("expected `key value`"))?;
            let field = match key {
                "format" => &mut m.format,
                "nvcc-release" => &mut m.nvcc_release,
                "nvcc-version" => &mut m.nvcc_version,
                "ptxas-version" => &mut m.ptxas_version,
                "archs" => &mut m.archs,
                "nvcc-command" => &mut m.nvcc_command,
                "ptxas-command" => &mut m.ptxas_command,
                "normalization" => &mut m.normalization,
                "input" | "output" => {
                    let (sha, path) = value.split_once(' ').ok_or_else(|| bad("expected `<sha256> <path>`"))?;
                    if sha.len() != 64 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
                        return Err(bad("not a sha256"));
                    }
                    let map = if key == "input" { &mut m.inputs } else { &mut m.outputs };
                    map.insert(path.to_string(), sha.to_string());
                    continue;
                }
                _ => return Err(bad("unknown key")),
            };
            *field = value.to_string();
        }
        if m.format != FORMAT {
            return Err(format!("{MANIFEST_PATH}: format `{}`, expected `{FORMAT}`", m.format));
        }
        Ok(m)
    }

    /// First 16 hex digits of the manifest's SHA-256, as shown in the device-code origin.
    pub fn short_hash(text: &str) -> String {
        sha256_hex(text.as_bytes())[..16].to_string()
    }
}

/// One reason why the prebuilt copy cannot be used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Problem {
    /// The manifest is missing or unreadable.
    Manifest(String),
    /// An input's hash differs from the manifest's.
    Changed(String),
    /// An input that the manifest does not list.
    Added(String),
    /// An input in the manifest that no longer exists.
    Missing(String),
    /// A build setting differs from the one the copy was made with.
    Setting { key: &'static str, manifest: String, current: String },
    /// A generated file that is missing (or not in the manifest).
    OutputMissing(String),
    /// A generated file whose hash differs from the manifest's.
    OutputChanged(String),
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Problem::Manifest(e) => write!(f, "manifest: {e}"),
            Problem::Changed(p) => write!(f, "changed:  {p}"),
            Problem::Added(p) => write!(f, "added:    {p}"),
            Problem::Missing(p) => write!(f, "missing:  {p}"),
            Problem::Setting { key, manifest, current } => {
                write!(f, "{key} changed:\n      manifest: {manifest}\n      build:    {current}")
            }
            Problem::OutputMissing(p) => write!(f, "prebuilt file missing: {PREBUILT_ARCHIVE}:{p}"),
            Problem::OutputChanged(p) => write!(f, "prebuilt file modified: {PREBUILT_ARCHIVE}:{p}"),
        }
    }
}

/// The inputs under `root` against the manifest's hashes.
pub fn check_inputs(root: &Path, m: &Manifest) -> Vec<Problem> {
    let current = match hash_inputs(root) {
        Ok(c) => c,
        Err(e) => return vec![Problem::Manifest(e)],
    };
    let mut v = Vec::new();
    for (path, sha) in &current {
        match m.inputs.get(path) {
            None => v.push(Problem::Added(path.clone())),
            Some(s) if s != sha => v.push(Problem::Changed(path.clone())),
            Some(_) => {}
        }
    }
    for path in m.inputs.keys().filter(|p| !current.contains_key(*p)) {
        v.push(Problem::Missing(path.clone()));
    }
    v
}

/// The manifest's build settings against this module's.
pub fn check_settings(m: &Manifest) -> Vec<Problem> {
    let mut v = Vec::new();
    for (key, manifest, current) in [
        ("archs", &m.archs, ARCHS.join(" ")),
        ("nvcc-command", &m.nvcc_command, nvcc_command()),
        ("ptxas-command", &m.ptxas_command, ptxas_command()),
        ("normalization", &m.normalization, NORMALIZATION.to_string()),
    ] {
        if *manifest != current {
            v.push(Problem::Setting { key, manifest: manifest.clone(), current });
        }
    }
    v
}

/// The generated files in `dir` (the archive unpacked by [`unpack_prebuilt`]) against the
/// manifest.
pub fn check_outputs(dir: &Path, m: &Manifest, families: &[String]) -> Vec<Problem> {
    let mut v = Vec::new();
    for f in output_files(families) {
        match (m.outputs.get(&f), std::fs::read(dir.join(&f))) {
            (Some(sha), Ok(bytes)) => {
                if sha256_hex(&bytes) != *sha {
                    v.push(Problem::OutputChanged(f));
                }
            }
            _ => v.push(Problem::OutputMissing(f)),
        }
    }
    v
}

/// Unpacks the committed archive under `root` into `dest`: the files of `families` (each once;
/// a file missing from the archive is left for [`check_outputs`] to name). Entries are written
/// only under `dest` and only by the names [`output_files`] gives; returns the other entries'
/// names (files of families not built here, such as the self-tests; or left over), unwritten.
pub fn unpack_prebuilt(root: &Path, dest: &Path, families: &[String]) -> Result<Vec<String>, String> {
    use std::io::Read as _;
    let path = root.join(PREBUILT_ARCHIVE);
    let file = std::fs::File::open(&path).map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    let bad = |e: &dyn fmt::Display| format!("{}: {e}", path.display());
    let zstd = ruzstd::decoding::StreamingDecoder::new(std::io::BufReader::new(file)).map_err(|e| bad(&e))?;
    let wanted: std::collections::BTreeSet<String> = output_files(families).into_iter().collect();
    let mut written = std::collections::BTreeSet::new();
    let mut others = Vec::new();
    let mut archive = tar::Archive::new(zstd);
    for entry in archive.entries().map_err(|e| bad(&e))? {
        let entry = entry.map_err(|e| bad(&e))?;
        let name = entry.path().map_err(|e| bad(&e))?.to_string_lossy().into_owned();
        if !entry.header().entry_type().is_file() || !wanted.contains(&name) || written.contains(&name) {
            others.push(name);
            continue;
        }
        let size = entry.size();
        if size > MAX_PREBUILT_FILE {
            return Err(bad(&format!("{name} is {size} bytes, over {MAX_PREBUILT_FILE}")));
        }
        let mut bytes = Vec::with_capacity(size as usize);
        entry.take(MAX_PREBUILT_FILE).read_to_end(&mut bytes).map_err(|e| bad(&e))?;
        // `name` is one of output_files(): `<arch>/<family>.<ext>`, never absolute or `..`.
        let to = dest.join(&name);
        if let Some(dir) = to.parent() {
            std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        std::fs::write(&to, bytes).map_err(|e| format!("cannot write {}: {e}", to.display()))?;
        written.insert(name);
    }
    Ok(others)
}

/// The committed copy's manifest checked against the sources under `root` and this module's
/// settings: Ok(manifest text) when its files may be used.
pub fn check_manifest(root: &Path) -> Result<String, Vec<Problem>> {
    let text = std::fs::read_to_string(root.join(MANIFEST_PATH))
        .map_err(|e| vec![Problem::Manifest(format!("cannot read {MANIFEST_PATH}: {e}"))])?;
    let m = Manifest::parse(&text).map_err(|e| vec![Problem::Manifest(e)])?;
    let mut problems = check_inputs(root, &m);
    problems.extend(check_settings(&m));
    if problems.is_empty() { Ok(text) } else { Err(problems) }
}

/// Checks the committed copy under `root` and unpacks the files of `families` into `dest`,
/// checking each against the manifest: Ok(manifest text) when they can be used.
pub fn unpack_verified(root: &Path, dest: &Path, families: &[String]) -> Result<String, Vec<Problem>> {
    let text = check_manifest(root)?;
    let m = Manifest::parse(&text).map_err(|e| vec![Problem::Manifest(e)])?;
    unpack_prebuilt(root, dest, families).map_err(|e| vec![Problem::Manifest(e)])?;
    let problems = check_outputs(dest, &m, families);
    if problems.is_empty() { Ok(text) } else { Err(problems) }
}

/// The problems, one per line, indented.
pub fn describe(problems: &[Problem]) -> String {
    problems.iter().map(|p| format!("    {p}\n")).collect()
}
