//! The committed Rust mirrors of the C headers (src/ffi/params.rs, src/ffi/emu_abi.rs) must match
//! the headers. Always: the SHA-256 stamped into each mirror equals the header's. When libclang is
//! available (scripts/setup.sh installs it): regenerating with bindgen reproduces the file exactly.

#[path = "../tools/params_mirror.rs"]
mod params_mirror;

use std::path::PathBuf;

#[test]
fn committed_mirrors_are_fresh() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    params_mirror::point_at_project_libclang(&root);
    let libclang = std::env::var_os("LIBCLANG_PATH").is_some();
    for (header, out) in params_mirror::MIRRORS {
        let committed = std::fs::read_to_string(root.join(out)).expect("read committed mirror");
        let stamp = params_mirror::stamp_line(header, &params_mirror::header_digest(&root.join(header)));
        assert_eq!(
            committed.lines().next(),
            Some(stamp.as_str()),
            "{out} is stale: {header} changed; run scripts/regen-params.sh"
        );
        if libclang {
            let fresh = params_mirror::generate(&root, header).expect("bindgen");
            assert!(
                fresh == committed,
                "{out} differs from bindgen's output for {header}; run scripts/regen-params.sh"
            );
        } else {
            eprintln!("note: libclang not found; checked {out} by its SHA-256 stamp only");
        }
    }
}
