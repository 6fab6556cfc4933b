//! Generates the Rust mirror of the C headers shared with the kernels, with bindgen.
//!
//! Used by `cargo xtask regen-params` (which writes the files) and by `tests/params_mirror.rs`
//! (which fails when the committed files are stale). It lives in xtask, which does not depend on
//! the kernel crate, so that it builds even when the kernel crate does not (a header changed
//! and the mirror is stale). Each generated file starts with the SHA-256 of its header, so
//! staleness is also caught on machines without libclang.

use std::path::Path;

/// (header, generated Rust file), relative to the kernel crate's root ([`crate::kernel_crate`]).
pub const MIRRORS: [(&str, &str); 2] =
    [("kernels/params.h", "src/ffi/params.rs"), ("kernels/emu/emu_abi.h", "src/ffi/emu_abi.rs")];

/// libclang from the project toolchain (`scripts/setup.sh` installs the PyPI `libclang` wheel
/// into the repository's `.toolchain`), unless LIBCLANG_PATH is already set.
pub fn point_at_project_libclang() {
    if std::env::var_os("LIBCLANG_PATH").is_none() {
        let local = crate::repo_root().join(".toolchain/python/clang/native");
        if local.join("libclang.so").exists() {
            // SAFETY: called at start-up of a single-threaded tool/test before any other thread reads the environment.
            unsafe { std::env::set_var("LIBCLANG_PATH", local) };
        }
    }
}

/// The SHA-256 of the header at `header`.
pub fn header_digest(header: &Path) -> Result<String, String> {
    let bytes = std::fs::read(header).map_err(|e| format!("cannot read {}: {e}", header.display()))?;
    Ok(sha256_hex(&bytes))
}

/// The first line of a generated file: `// @generated from <header> sha256:<hex>`.
pub fn stamp_line(header_rel: &str, digest: &str) -> String {
    format!("// @generated from {header_rel} sha256:{digest} by `cargo xtask regen-params`; do not edit.")
}

/// Runs bindgen on one header and returns the full text of the Rust mirror.
pub fn generate(root: &Path, header_rel: &str) -> Result<String, String> {
    let header = root.join(header_rel);
    let bindings = bindgen::Builder::default()
        .header(header.to_string_lossy())
        .allowlist_file(regex_escape(&header.to_string_lossy()))
        .rustified_enum(".*")
        .prepend_enum_name(false)
        .derive_default(true)
        .derive_debug(true)
        .derive_copy(true)
        .layout_tests(true)
        .use_core()
        .generate_comments(true)
        .raw_line("#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals, dead_code)]")
        .raw_line("#![allow(clippy::all)]")
        .generate()
        .map_err(|e| format!("bindgen failed on {header_rel}: {e}"))?;
    Ok(format!("{}\n{}", stamp_line(header_rel, &header_digest(&header)?), bindings))
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '/' || c == '_' { c.to_string() } else { format!("\\{c}") })
        .collect()
}

/// The SHA-256 of `data`, lowercase hex.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::{Digest, Sha256};
    Sha256::digest(data).iter().map(|b| format!("{b:02x}")).collect()
}
