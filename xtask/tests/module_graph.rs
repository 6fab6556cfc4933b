//! The layers of every crate of the workspace ([`xtask::module_graph`]): imports go only down
//! the layers, no file-level import cycle exists, the specification is imported only by the
//! verification harness; and the checker itself can fail.

use std::collections::BTreeMap;

use xtask::module_graph::{CRATES, cycles, parse, resolve, show};

#[test]
fn layers_depend_only_on_lower_layers() {
    for c in CRATES {
        let bad = c.violations(&c.graph());
        assert!(bad.is_empty(), "{}: imports that go up the layers ({}):\n{}", c.dir, bad.len(), bad.join("\n"));
    }
}

#[test]
fn only_dev_imports_the_reference() {
    for c in CRATES {
        let bad = c.reference_imports(&c.graph());
        assert!(bad.is_empty(), "{}: the implementation imports the specification:\n{}", c.dir, bad.join("\n"));
    }
}

#[test]
fn no_module_cycle() {
    for c in CRATES {
        let found = cycles(&c.graph());
        assert!(found.is_empty(), "{}: module import cycles:\n{}", c.dir, found.join("\n"));
    }
}

#[test]
fn every_crate_has_modules_in_every_layer() {
    // A layer list that names no module (a renamed folder) would silently check nothing.
    for c in CRATES {
        let g = c.graph();
        for layer in c.layers {
            assert!(g.keys().any(|m| m.first().is_some_and(|t| t == layer)), "{}: no module `{layer}`", c.dir);
        }
    }
}

#[test]
fn the_checker_sees_a_cycle_and_a_layer_violation() {
    // Two files that import each other, one through a re-export, and a spec file that reaches
    // up into ops: the parser must report both, or the tests above prove nothing.
    let a = parse("use crate::ops::b::Thing;\npub use self::inner::*;\n", &["ops".into(), "a".into()]);
    let b = parse(
        "//! crate::nothing here\nfn f() { let s = \"crate::ops::zzz\"; crate::ops::Alias::new(); }\n",
        &["ops".into(), "b".into()],
    );
    let ops = parse("pub use a::Alias;\n", &["ops".into()]);
    let mut mods = BTreeMap::new();
    mods.insert(vec!["ops".to_string()], ops);
    mods.insert(vec!["ops".to_string(), "a".to_string()], a);
    mods.insert(vec!["ops".to_string(), "b".to_string()], b);
    let to_b = resolve(&["ops".into(), "b".into(), "Thing".into()], &mods, 0);
    assert_eq!(to_b, Some(vec!["ops".to_string(), "b".to_string()]));
    let b_uses = &mods[&vec!["ops".to_string(), "b".to_string()]].uses;
    assert_eq!(b_uses.len(), 1, "comments and strings are not imports: {b_uses:?}");
    let alias = resolve(&b_uses[0], &mods, 0);
    assert_eq!(alias, Some(vec!["ops".to_string(), "a".to_string()]), "a re-export is followed to its source");
    let spec = parse("use crate::ops::rope::Rope;", &["spec".into(), "rope".into()]);
    assert_eq!(spec.uses, vec![vec!["ops".to_string(), "rope".to_string(), "Rope".to_string()]]);

    // The same edges through the checks: a spec -> ops edge goes up the kernel crate's layers,
    // ops -> reference breaks the reference rule, and a <-> b is a cycle.
    let kernels = CRATES[0];
    let mut g = xtask::module_graph::Graph::new();
    let m = |p: &[&str]| p.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    g.entry(m(&["spec", "rope"])).or_default().insert(m(&["ops", "rope"]));
    g.entry(m(&["ops", "a"])).or_default().insert(m(&["ops", "b"]));
    g.entry(m(&["ops", "b"])).or_default().insert(m(&["ops", "a"]));
    g.entry(m(&["ops", "b"])).or_default().insert(m(&["reference", "rope"]));
    assert_eq!(kernels.violations(&g), vec!["spec::rope -> ops::rope".to_string()]);
    assert_eq!(kernels.reference_imports(&g), vec!["ops::b -> reference::rope".to_string()]);
    assert_eq!(cycles(&g).len(), 1, "{:?}", cycles(&g));
}

#[test]
fn print_graph() {
    // Not an assertion: the graph by top-level module, for the reader (`-- --nocapture`).
    for c in CRATES {
        println!("{}:", c.dir);
        let mut top: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for (from, tos) in &c.graph() {
            let f = from.first().cloned().unwrap_or_else(|| "lib".into());
            for to in tos {
                let t = show(&to[..1.min(to.len())]);
                if t != f {
                    top.entry(f.clone()).or_default().insert(t);
                }
            }
        }
        for (f, ts) in &top {
            println!("  {f} -> {}", ts.iter().cloned().collect::<Vec<_>>().join(", "));
        }
    }
}
