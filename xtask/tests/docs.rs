//! Every page of `docs/` is compiled as doctests (`xtask/src/lib.rs` includes each one), and the
//! README stays a front page.

#[test]
fn every_docs_page_is_a_doctest() {
    let lib = std::fs::read_to_string(xtask::repo_root().join("xtask/src/lib.rs")).expect("read xtask/src/lib.rs");
    let dir = xtask::repo_root().join("docs");
    let mut pages = 0;
    for entry in std::fs::read_dir(&dir).expect("read docs/").flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.ends_with(".md") {
            pages += 1;
            let include = format!("include_str!(\"../../docs/{name}\")");
            assert!(lib.contains(&include), "docs/{name} is not among xtask's doctests: add `#[doc = {include}]`");
        }
    }
    assert!(pages >= 5, "{pages} pages in docs/");
}

#[test]
fn the_readme_is_at_most_250_lines() {
    let readme = std::fs::read_to_string(xtask::repo_root().join("README.md")).expect("read README.md");
    let lines = readme.lines().count();
    assert!(lines <= 250, "README.md has {lines} lines: move details to docs/");
    // Every page it links exists.
    for link in readme.split("](docs/").skip(1) {
        let page = link.split(')').next().unwrap_or_default();
        assert!(xtask::repo_root().join("docs").join(page).is_file(), "README links docs/{page}, which does not exist");
    }
}
