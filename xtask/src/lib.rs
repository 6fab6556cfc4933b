//! Repository tasks of llama-kernels (`cargo xtask --help`), and the code the repository-wide
//! checks in `xtask/tests/` share with them.
//!
//! * [`params_mirror`]: the bindgen mirrors of the kernel crate's C headers.
//! * [`regen_kernels`]: the committed prebuilt device code.
//! * [`module_graph`]: the import graph of a crate's modules, against its layers.

#[path = "../../crates/llama-kernels/build/device_code.rs"]
pub mod device_code;
pub mod module_graph;
pub mod params_mirror;
pub mod regen_kernels;

use std::path::PathBuf;

/// The README's and `docs/`'s code blocks, compiled (and run, unless marked `no_run`) as
/// doctests.
#[cfg(doctest)]
mod docs {
    #[doc = include_str!("../../README.md")]
    struct Readme;
    #[doc = include_str!("../../docs/device-code.md")]
    struct DeviceCode;
    #[doc = include_str!("../../docs/emulator.md")]
    struct Emulator;
    #[doc = include_str!("../../docs/engine.md")]
    struct Engine;
    #[doc = include_str!("../../docs/gpu.md")]
    struct Gpu;
    #[doc = include_str!("../../docs/layout.md")]
    struct Layout;
    #[doc = include_str!("../../docs/models.md")]
    struct Models;
    #[doc = include_str!("../../docs/ops.md")]
    struct Ops;
    #[doc = include_str!("../../docs/performance.md")]
    struct Performance;
    #[doc = include_str!("../../docs/shared-memory.md")]
    struct SharedMemory;
    #[doc = include_str!("../../docs/testing.md")]
    struct Testing;
    #[doc = include_str!("../../docs/training.md")]
    struct Training;
    #[doc = include_str!("../../docs/verify.md")]
    struct Verify;
}

/// The repository root (the workspace).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The kernel crate's root (`crates/llama-kernels`): where `kernels/`, `build/` and the params
/// mirror live.
pub fn kernel_crate() -> PathBuf {
    repo_root().join("crates/llama-kernels")
}

/// Regenerates the params mirrors (`--check`: only says whether they are fresh).
pub fn regen_params(check: bool) -> Result<(), String> {
    let root = kernel_crate();
    params_mirror::point_at_project_libclang();
    let mut stale = Vec::new();
    for (header, out) in params_mirror::MIRRORS {
        let text = params_mirror::generate(&root, header)?;
        let path = root.join(out);
        let committed = std::fs::read_to_string(&path).unwrap_or_default();
        if committed == text {
            println!("regen-params: {out} is fresh");
        } else if check {
            stale.push(out);
        } else {
            std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            println!("regen-params: {header} -> {out}");
        }
    }
    if stale.is_empty() { Ok(()) } else { Err(format!("stale: {}; run cargo xtask regen-params", stale.join(", "))) }
}
