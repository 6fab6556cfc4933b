//! The import graph of a crate's `src/`: layers depend only on the layers below them, and no
//! file-level import circle exists. The checks of `xtask/tests/module_graph.rs` run it on every
//! crate of the workspace; the compiler guards the walls between crates.
//!
//! Nodes are the files of `src/` (each a module). An edge `a -> b` means that `a` names an item
//! of `b`: a `use` tree or a path through `crate::`, `super::` or `self::`. A path that ends at a
//! re-export (`pub use x::Y;` in a facade `mod.rs`) is followed to the module that defines the
//! item, so a facade is never a shortcut around the layering. Comments and string literals are
//! ignored; so are `mod` declarations (a parent declaring a child is not a dependency).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};

/// One crate's layering: its top-level modules, lowest layer first. A module may use only
/// modules at or before its own position; within one module the file graph must be acyclic.
#[derive(Clone, Copy, Debug)]
pub struct Layers {
    /// The crate's folder, relative to the repository root.
    pub dir: &'static str,
    /// Its top-level modules, lowest first.
    pub layers: &'static [&'static str],
    /// The specification the other modules are checked against, and the only modules that may
    /// import it; `None`: no such rule.
    pub reference: Option<(&'static str, &'static [&'static str])>,
}

/// Every crate of the workspace whose modules are layered.
pub const CRATES: [Layers; 4] = [
    Layers {
        dir: "crates/llama-kernels",
        layers: &[
            "dtype",
            "target",
            "error",
            "ffi",
            "spec",
            "reference",
            "backend",
            "tensor",
            "launch",
            "kernels",
            "ops",
            "dev",
        ],
        // The implementation is checked against the specification, never calls it.
        reference: Some(("reference", &["dev"])),
    },
    Layers {
        dir: "crates/llama-model",
        layers: &["error", "formats", "text", "block", "model", "train", "dev"],
        reference: None,
    },
    Layers { dir: "crates/llama-kernels-candle", layers: &["bridge", "ops", "unfused", "nn"], reference: None },
    Layers {
        dir: "crates/llama-kernels-inspect",
        layers: &[
            "h200",
            "sass",
            "kernel_spec",
            "memory_model",
            "attention_model",
            "wgmma_model",
            "qlinear_model",
            "backward_model",
            "coverage",
            "smem",
            "layer_model",
            "hopper_report",
            "perf",
            "perf_json",
        ],
        reference: None,
    },
];

/// One module: its path (`["ops", "attention"]`), its explicit re-exports (name -> absolute
/// path) and glob re-exports, and the paths it names.
#[derive(Default, Debug)]
pub struct Module {
    pub reexports: HashMap<String, Vec<String>>,
    pub globs: Vec<Vec<String>>,
    pub uses: Vec<Vec<String>>,
}

/// Removes comments, string and char literals, keeping line structure.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i] as char;
        if c == '/' && i + 1 < b.len() && b[i + 1] == b'/' {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if c == '/' && i + 1 < b.len() && b[i + 1] == b'*' {
            i += 2;
            while i + 1 < b.len() && !(b[i] == b'*' && b[i + 1] == b'/') {
                i += 1;
            }
            i += 2;
        } else if c == 'r' && i + 1 < b.len() && (b[i + 1] == b'"' || b[i + 1] == b'#') && !ident(b, i) {
            // Raw string r"..." or r#"..."#.
            let mut j = i + 1;
            let mut hashes = 0;
            while j < b.len() && b[j] == b'#' {
                hashes += 1;
                j += 1;
            }
            if j < b.len() && b[j] == b'"' {
                j += 1;
                let close: String = std::iter::once('"').chain(std::iter::repeat_n('#', hashes)).collect();
                match src[j..].find(&close) {
                    Some(k) => i = j + k + close.len(),
                    None => i = b.len(),
                }
                out.push_str("\"\"");
            } else {
                out.push(c);
                i += 1;
            }
        } else if c == '"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == '\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || (b[i + 1] == b'\\' && i + 3 < b.len())) {
            // A char literal ('a', '\n', '\''); lifetimes ('a) are left alone.
            let mut j = i + 1;
            if b[j] == b'\\' {
                j += 1;
                while j < b.len() && b[j] != b'\'' {
                    j += 1;
                }
            } else {
                j += 1;
            }
            if j < b.len() && b[j] == b'\'' {
                i = j + 1;
                out.push_str("' '");
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// Whether the byte before `i` continues an identifier.
fn ident(b: &[u8], i: usize) -> bool {
    i > 0 && (b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_')
}

/// Expands a `use` tree (`a::{b, c::{d, e as f}}`) into (path, alias) pairs; `*` stays a segment.
fn expand(tree: &str, prefix: &[String], out: &mut Vec<(Vec<String>, Option<String>)>) {
    let tree = tree.trim();
    if tree.is_empty() {
        return;
    }
    if let Some(open) = tree.find('{') {
        let head = tree[..open].trim().trim_end_matches("::");
        let mut base = prefix.to_vec();
        base.extend(head.split("::").filter(|s| !s.is_empty()).map(|s| s.trim().to_string()));
        let inner = &tree[open + 1..tree.rfind('}').unwrap_or(tree.len())];
        let mut depth = 0;
        let mut start = 0;
        for (k, ch) in inner.char_indices() {
            match ch {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    expand(&inner[start..k], &base, out);
                    start = k + 1;
                }
                _ => {}
            }
        }
        expand(&inner[start..], &base, out);
        return;
    }
    let (path, alias) = match tree.split_once(" as ") {
        Some((p, a)) => (p.trim(), Some(a.trim().to_string())),
        None => (tree, None),
    };
    let mut v = prefix.to_vec();
    v.extend(path.split("::").map(|s| s.trim().to_string()).filter(|s| !s.is_empty()));
    if v.last().is_some_and(|s| s == "self") {
        v.pop();
    }
    out.push((v, alias));
}

/// Makes `path` absolute (from the crate root) as seen from module `here`. A path that starts
/// with a plain name is relative to `here` (a child module, `use attention::X;`); one into another
/// crate (`std::`, `cudarc::`) then names no module below `here` and resolves to `here` itself,
/// which is not an edge.
fn absolute(path: &[String], here: &[String]) -> Option<Vec<String>> {
    let mut cur: Vec<String> = here.to_vec();
    let mut rest = path;
    match rest.first().map(String::as_str) {
        Some("crate") | Some("$crate") => {
            cur.clear();
            rest = &rest[1..];
        }
        Some("self") => rest = &rest[1..],
        Some("super") => {
            while rest.first().is_some_and(|s| s == "super") {
                cur.pop()?;
                rest = &rest[1..];
            }
        }
        _ => {}
    }
    cur.extend(rest.iter().cloned());
    Some(cur)
}

/// Every `crate::` / `super::` / `self::` path in non-`use` code (`crate::ops::rms_norm(..)`).
fn inline_paths(code: &str) -> Vec<Vec<String>> {
    let b = code.as_bytes();
    let mut v = Vec::new();
    for start in ["crate::", "super::", "self::"] {
        let mut from = 0;
        while let Some(k) = code[from..].find(start) {
            let i = from + k;
            from = i + start.len();
            if ident(b, i) || (i > 0 && b[i - 1] == b'$' && start != "crate::") {
                continue;
            }
            let mut j = i;
            while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_' || b[j] == b':') {
                j += 1;
            }
            let seg: Vec<String> = code[i..j].split("::").filter(|s| !s.is_empty()).map(str::to_string).collect();
            v.push(seg);
        }
    }
    v
}

/// Parses one file: its `use` items (re-exports among them) and inline paths. Items inside an
/// inline `mod name { .. }` (unit tests) resolve `super::` against the file itself.
pub fn parse(src: &str, here: &[String]) -> Module {
    let code = strip(src);
    let mut m = Module::default();
    // `use` statements, possibly spanning lines.
    let mut rest = code.as_str();
    let mut uses_text = Vec::new();
    while let Some(k) = find_use(rest) {
        let after = &rest[k..];
        let end = after.find(';').unwrap_or(after.len());
        let stmt = &after[..end];
        let public = stmt.starts_with("pub");
        let body = stmt[stmt.find("use ").map_or(0, |u| u + 4)..].trim();
        uses_text.push((k + (code.len() - rest.len()), end));
        let mut items = Vec::new();
        expand(body, &[], &mut items);
        let inline_mod = inside_inline_mod(&code, k + (code.len() - rest.len()));
        for (path, alias) in items {
            let scope: Vec<String> =
                if inline_mod { here.iter().cloned().chain(["<inline>".to_string()]).collect() } else { here.to_vec() };
            let Some(abs) = absolute(&path, &scope) else { continue };
            let abs: Vec<String> = abs.into_iter().filter(|s| s != "<inline>").collect();
            if public && !inline_mod {
                if abs.last().is_some_and(|s| s == "*") {
                    m.globs.push(abs[..abs.len() - 1].to_vec());
                } else if let Some(name) = alias.clone().or_else(|| abs.last().cloned()) {
                    m.reexports.insert(name, abs.clone());
                }
            }
            let mut target = abs;
            if target.last().is_some_and(|s| s == "*") {
                target.pop();
            }
            m.uses.push(target);
        }
        rest = &after[end..];
    }
    // Inline paths outside `use` statements.
    let mut masked = code.clone().into_bytes();
    for (start, len) in uses_text {
        for x in &mut masked[start..start + len] {
            if *x != b'\n' {
                *x = b' ';
            }
        }
    }
    let masked = String::from_utf8(masked).unwrap_or_default();
    for (line_start, line) in line_offsets(&masked) {
        for p in inline_paths(line) {
            let inline_mod = inside_inline_mod(&code, line_start);
            let scope: Vec<String> =
                if inline_mod { here.iter().cloned().chain(["<inline>".to_string()]).collect() } else { here.to_vec() };
            if let Some(abs) = absolute(&p, &scope) {
                m.uses.push(abs.into_iter().filter(|s| s != "<inline>").collect());
            }
        }
    }
    m
}

fn line_offsets(s: &str) -> impl Iterator<Item = (usize, &str)> {
    let mut off = 0;
    s.split_inclusive('\n').map(move |l| {
        let o = off;
        off += l.len();
        (o, l)
    })
}

/// The offset of the next `use`/`pub use`/`pub(crate) use` statement start.
fn find_use(s: &str) -> Option<usize> {
    let b = s.as_bytes();
    let mut from = 0;
    while let Some(k) = s[from..].find("use ") {
        let i = from + k;
        from = i + 4;
        if ident(b, i) {
            continue;
        }
        // Walk back over a visibility (`pub`, `pub(crate)`, `pub(super)`).
        let line_start = s[..i].rfind('\n').map_or(0, |n| n + 1);
        let lead = s[line_start..i].trim();
        if lead.is_empty() {
            return Some(i);
        }
        if lead == "pub" || (lead.starts_with("pub(") && lead.ends_with(')')) {
            return Some(line_start + (s[line_start..].len() - s[line_start..].trim_start().len()));
        }
    }
    None
}

/// Whether byte `at` lies inside an inline `mod name {` block.
fn inside_inline_mod(code: &str, at: usize) -> bool {
    let b = code.as_bytes();
    let mut from = 0;
    while let Some(k) = code[from..].find("mod ") {
        let i = from + k;
        from = i + 4;
        if ident(b, i) || i > at {
            if i > at {
                break;
            }
            continue;
        }
        let mut j = i + 4;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        while j < b.len() && b[j] == b' ' {
            j += 1;
        }
        if j < b.len() && b[j] == b'{' {
            let mut depth = 0;
            let mut e = j;
            while e < b.len() {
                match b[e] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                e += 1;
            }
            if j < at && at < e {
                return true;
            }
        }
    }
    false
}

/// Every `.rs` file under `src/` as a module path.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        let Ok(entries) = std::fs::read_dir(dir) else { return };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }
    let mut files = Vec::new();
    walk(src, &mut files);
    let mut map = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(src).unwrap_or(&f);
        let mut parts: Vec<String> = rel.iter().map(|s| s.to_string_lossy().into_owned()).collect();
        let last = parts.pop().unwrap_or_default();
        let stem = last.trim_end_matches(".rs").to_string();
        if stem != "mod" && stem != "lib" {
            parts.push(stem);
        }
        map.insert(parts, f);
    }
    map
}

/// The module that defines what `path` names: the longest module prefix, with re-exports
/// followed (explicit first, then globs).
pub fn resolve(path: &[String], mods: &BTreeMap<Vec<String>, Module>, depth: usize) -> Option<Vec<String>> {
    if depth > 16 {
        return None;
    }
    let mut k = path.len();
    while k > 0 && !mods.contains_key(&path[..k]) {
        k -= 1;
    }
    let owner = path[..k].to_vec();
    let m = mods.get(&owner)?;
    if k < path.len() {
        let name = &path[k];
        if let Some(target) = m.reexports.get(name) {
            let mut t = target.clone();
            t.extend(path[k + 1..].iter().cloned());
            if t != path {
                return resolve(&t, mods, depth + 1).or(Some(owner));
            }
        }
        for g in &m.globs {
            let mut t = g.clone();
            t.extend(path[k..].iter().cloned());
            if let Some(r) = resolve(&t, mods, depth + 1)
                && r != *g
            {
                return Some(r);
            }
        }
    }
    Some(owner)
}

/// A module path as written (`ops::attention`; `lib` for the crate root).
pub fn show(m: &[String]) -> String {
    if m.is_empty() { "lib".into() } else { m.join("::") }
}

/// A crate's module graph: each module (a file of `src/`) and the modules it names.
pub type Graph = BTreeMap<Vec<String>, BTreeSet<Vec<String>>>;

/// The graph of the crate whose sources are in `src`.
pub fn graph(src: &Path) -> Graph {
    let files = modules(src);
    let mut mods = BTreeMap::new();
    for (m, f) in &files {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        mods.insert(m.clone(), parse(&text, m));
    }
    let mut edges: Graph = BTreeMap::new();
    for (m, module) in &mods {
        let set = edges.entry(m.clone()).or_default();
        for u in &module.uses {
            let Some(to) = resolve(u, &mods, 0) else { continue };
            // The crate root is a facade of re-exports and macros; a file's own items are not
            // an edge.
            if to.is_empty() || to == *m {
                continue;
            }
            set.insert(to);
        }
    }
    edges
}

impl Layers {
    /// The graph of this crate's `src/`.
    pub fn graph(&self) -> Graph {
        graph(&crate::repo_root().join(self.dir).join("src"))
    }

    /// The position of `m`'s top-level module in the layers.
    pub fn layer_of(&self, m: &[String]) -> Option<usize> {
        m.first().and_then(|top| self.layers.iter().position(|l| l == top))
    }

    /// Every edge that goes up the layers, and every module outside them.
    pub fn violations(&self, edges: &Graph) -> Vec<String> {
        let mut bad = Vec::new();
        for (from, tos) in edges {
            if from.is_empty() {
                continue;
            }
            let Some(lf) = self.layer_of(from) else {
                bad.push(format!("{} is not in the layers", show(from)));
                continue;
            };
            for to in tos {
                match self.layer_of(to) {
                    Some(lt) if lt <= lf => {}
                    Some(_) => bad.push(format!("{} -> {}", show(from), show(to))),
                    None => bad.push(format!("{} -> {} (not in the layers)", show(from), show(to))),
                }
            }
        }
        bad
    }

    /// Every import of the specification by a module not allowed to make one.
    pub fn reference_imports(&self, edges: &Graph) -> Vec<String> {
        let Some((reference, users)) = self.reference else { return Vec::new() };
        edges
            .iter()
            .filter(|(from, _)| !from.first().is_some_and(|f| f == reference || users.contains(&f.as_str())))
            .flat_map(|(from, tos)| {
                tos.iter()
                    .filter(|to| to.first().is_some_and(|t| t == reference))
                    .map(move |to| format!("{} -> {}", show(from), show(to)))
            })
            .collect()
    }
}

/// The import cycles of `edges` (strongly connected components of more than one module).
pub fn cycles(edges: &Graph) -> Vec<String> {
    // Tarjan's strongly connected components.
    struct St<'a> {
        edges: &'a Graph,
        index: HashMap<&'a Vec<String>, usize>,
        low: HashMap<&'a Vec<String>, usize>,
        stack: Vec<&'a Vec<String>>,
        on: BTreeSet<&'a Vec<String>>,
        next: usize,
        sccs: Vec<Vec<&'a Vec<String>>>,
    }
    fn visit<'a>(s: &mut St<'a>, v: &'a Vec<String>) {
        s.index.insert(v, s.next);
        s.low.insert(v, s.next);
        s.next += 1;
        s.stack.push(v);
        s.on.insert(v);
        if let Some(tos) = s.edges.get(v) {
            for w in tos {
                let Some((w, _)) = s.edges.get_key_value(w) else { continue };
                if !s.index.contains_key(w) {
                    visit(s, w);
                    let lw = s.low[w];
                    if let Some(lv) = s.low.get_mut(v) {
                        *lv = (*lv).min(lw);
                    }
                } else if s.on.contains(w) {
                    let iw = s.index[w];
                    if let Some(lv) = s.low.get_mut(v) {
                        *lv = (*lv).min(iw);
                    }
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w);
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                s.sccs.push(comp);
            }
        }
    }
    let mut s = St {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        sccs: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v) {
            visit(&mut s, v);
        }
    }
    s.sccs.iter().map(|c| c.iter().map(|m| show(m)).collect::<Vec<_>>().join(" <-> ")).collect()
}
