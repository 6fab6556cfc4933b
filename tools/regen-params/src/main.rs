//! Regenerates the committed Rust mirrors of `kernels/params.h` and `kernels/emu/emu_abi.h`.
//! Run through `scripts/regen-params.sh`; needs libclang (the project toolchain has one).

#[path = "../../params_mirror.rs"]
mod params_mirror;

use std::path::PathBuf;

fn main() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().unwrap_or_else(|e| {
        eprintln!("regen-params: cannot find the crate root: {e}");
        std::process::exit(1);
    });
    params_mirror::point_at_project_libclang(&root);
    for (header, out) in params_mirror::MIRRORS {
        let text = params_mirror::generate(&root, header).unwrap_or_else(|e| {
            eprintln!("regen-params: {e}");
            std::process::exit(1);
        });
        if let Err(e) = std::fs::write(root.join(out), text) {
            eprintln!("regen-params: cannot write {out}: {e}");
            std::process::exit(1);
        }
        println!("regen-params: {header} -> {out}");
    }
}
