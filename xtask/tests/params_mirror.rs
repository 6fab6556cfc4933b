//! The committed Rust mirrors of the kernel crate's C headers (`src/ffi/params.rs`,
//! `src/ffi/emu_abi.rs`) match the headers. Always: the SHA-256 stamped into each mirror equals
//! the header's. When libclang is available (scripts/setup.sh installs it): regenerating with
//! bindgen reproduces the file exactly.

use xtask::params_mirror;

#[test]
fn committed_mirrors_are_fresh() {
    let root = xtask::kernel_crate();
    params_mirror::point_at_project_libclang();
    let libclang = std::env::var_os("LIBCLANG_PATH").is_some();
    for (header, out) in params_mirror::MIRRORS {
        let committed = std::fs::read_to_string(root.join(out)).expect("read committed mirror");
        let digest = params_mirror::header_digest(&root.join(header)).expect("read the header");
        let stamp = params_mirror::stamp_line(header, &digest);
        assert_eq!(
            committed.lines().next(),
            Some(stamp.as_str()),
            "{out} is stale: {header} changed; run cargo xtask regen-params"
        );
        if libclang {
            let fresh = params_mirror::generate(&root, header).expect("bindgen");
            assert!(
                fresh == committed,
                "{out} differs from bindgen's output for {header}; run cargo xtask regen-params"
            );
        } else {
            eprintln!("note: libclang not found; checked {out} by its SHA-256 stamp only");
        }
    }
}
