//! The crate's layers point one way.
//!
//! Reads every module file reachable from `src/lib.rs` (following `mod name;` declarations),
//! collects the `crate::<module>` paths in its code (comments, doc links and string literals
//! are stripped first; grouped imports `crate::{a, b::c}` count each member), and checks that
//!
//! - every top-level module is declared in [`LAYERS`], bottom up, and each declared
//!   dependency of a layer is a layer below it (so the declared order itself has no cycle);
//! - every edge of the library's code (`#[cfg(test)]` items and modules left out) is one its
//!   layer declares, and the measured graph is acyclic;
//! - unit tests (`#[cfg(test)]` code) import only what their layer may, plus the test
//!   fabric in [`TEST_SUPPORT`];
//! - inside every module with submodules, the graph among them (each child with everything
//!   below it, and the module's own file) is acyclic, except for the modules listed in
//!   [`KNOWN_SUBMODULE_CYCLES`]: paths through `super::`, `self::`, `crate::` and the
//!   module's own children count, re-exports do not.
//!
//! Adding an upward import, a new top-level module without a layer, or a cycle fails here.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The top-level modules bottom up, each with the modules its library code may import.
/// A layer may only name layers above it in this list.
const LAYERS: &[(&str, &[&str])] = &[
    ("wire", &[]),
    ("sys", &[]),
    ("timer", &[]),
    ("choice", &[]),
    ("verbs", &["wire"]),
    ("sa", &["wire"]),
    ("soft", &["wire", "verbs", "sys", "sa"]),
    ("hw", &["verbs"]),
    ("cm", &["wire", "verbs", "timer"]),
    ("mad", &["wire", "sys", "verbs", "cm", "choice"]),
    ("ipoib", &["wire", "verbs", "timer", "sa", "cm", "choice"]),
    (
        "driver",
        &["wire", "sys", "verbs", "sa", "cm", "hw", "mad", "ipoib"],
    ),
    ("sim", &["verbs", "soft", "mad", "ipoib"]),
    ("setting", &["wire", "verbs", "soft"]),
    (
        "daemon",
        &[
            "wire", "sys", "verbs", "soft", "hw", "cm", "mad", "ipoib", "driver", "setting",
        ],
    ),
    (
        "tools",
        &[
            "wire", "sys", "verbs", "soft", "hw", "sa", "cm", "mad", "ipoib", "driver", "setting",
        ],
    ),
];

/// What unit tests of any layer may import besides their layer's own dependencies: the
/// simulated fabric and the provider it runs.
const TEST_SUPPORT: &[&str] = &["sim", "soft"];

/// One module file, its module path below `crate`, and whether the whole file is test code.
struct ModuleFile {
    top: String,
    module: Vec<String>,
    path: PathBuf,
    test_only: bool,
}

/// Where a module's graph edges came from: (from, to) -> files.
type Edges = BTreeMap<(String, String), BTreeSet<String>>;

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Replaces comments, string and char literals with blanks; keeps everything else.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < b.len() {
        let c = b[i];
        let prev_ident = i > 0 && ident(b[i - 1]);
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            out.push(' ');
        } else if !prev_ident && raw_string_start(&b[i..]).is_some() {
            let (open, hashes) = raw_string_start(&b[i..]).unwrap();
            i += open;
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if c == b'"' || (!prev_ident && b[i..].starts_with(b"b\"")) {
            i += if c == b'"' { 1 } else { 2 };
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if c == b'\'' {
            // A char literal ('x', '\n', '\u{..}'); otherwise a lifetime, kept.
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&x| x == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                std::str::from_utf8(&b[i + 1..])
                    .ok()
                    .and_then(|s| s.chars().next())
                    .filter(|ch| ch.len_utf8() > 1 && b.get(i + 1 + ch.len_utf8()) == Some(&b'\''))
                    .map(|ch| i + 1 + ch.len_utf8())
            };
            match end {
                Some(e) => {
                    i = e + 1;
                    out.push_str("' '");
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// `r"`, `r#"`, `br##"`, ...: the length of the opening and the number of `#`.
fn raw_string_start(b: &[u8]) -> Option<(usize, usize)> {
    let mut i = usize::from(b.first() == Some(&b'b'));
    if b.get(i) != Some(&b'r') {
        return None;
    }
    i += 1;
    let hashes = b[i..].iter().take_while(|&&c| c == b'#').count();
    i += hashes;
    (b.get(i) == Some(&b'"')).then_some((i + 1, hashes))
}

/// Splits stripped code into library code and `#[cfg(test)]` code: an item under
/// `#[cfg(test)]` runs to its first `;` or to the end of its first `{ .. }` block.
fn split_cfg_test(code: &str) -> (String, String) {
    split_attr(code, "#[cfg(test)]")
}

/// Splits stripped code into the items without the attribute `attr` and those with it (as
/// [`split_cfg_test`] does for `#[cfg(test)]`).
fn split_attr(code: &str, attr: &str) -> (String, String) {
    let (mut lib, mut test) = (String::new(), String::new());
    let mut rest = code;
    while let Some(at) = rest.find(attr) {
        lib.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, ch) in item.char_indices().skip(attr.len()) {
            match ch {
                '{' => depth += 1,
                '}' => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        test.push_str(&item[..end]);
        rest = &item[end..];
    }
    lib.push_str(rest);
    (lib, test)
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The top-level modules named by `crate::` (and `$crate::`) paths in `code`.
fn crate_refs(code: &str) -> BTreeSet<String> {
    let mut refs = BTreeSet::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("crate") {
        let at = from + pos;
        from = at + "crate".len();
        let before = code[..at].chars().next_back();
        if before.is_some_and(is_ident) {
            continue;
        }
        let after = code[from..].trim_start();
        let Some(path) = after.strip_prefix("::") else {
            continue;
        };
        let path = path.trim_start();
        if let Some(group) = path.strip_prefix('{') {
            // The first identifier of each top-level member of the group.
            let mut depth = 1;
            let mut expect = true;
            let mut chars = group.char_indices().peekable();
            while let Some((k, ch)) = chars.next() {
                match ch {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => expect = true,
                    c if expect && depth == 1 && is_ident(c) => {
                        let name: String =
                            group[k..].chars().take_while(|&c| is_ident(c)).collect();
                        for _ in 1..name.len() {
                            chars.next();
                        }
                        refs.insert(name);
                        expect = false;
                    }
                    _ => {}
                }
            }
        } else {
            let name: String = path.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                refs.insert(name);
            }
        }
    }
    refs.remove("self");
    refs
}

/// `mod name;` declarations in stripped code: (name, whether under `#[cfg(test)]`).
fn mod_decls(code: &str) -> Vec<(String, bool)> {
    let mut decls = Vec::new();
    let mut from = 0;
    while let Some(pos) = code[from..].find("mod ") {
        let at = from + pos;
        from = at + 4;
        if code[..at].chars().next_back().is_some_and(is_ident) {
            continue;
        }
        let rest = code[from..].trim_start();
        let name: String = rest.chars().take_while(|&c| is_ident(c)).collect();
        if name.is_empty() || !rest[name.len()..].trim_start().starts_with(';') {
            continue;
        }
        // The attributes and visibility before `mod` on the same item.
        let line_start = code[..at].rfind([';', '}', '{']).map_or(0, |p| p + 1);
        let head = &code[line_start..at];
        decls.push((name, head.contains("#[cfg(test)]")));
    }
    decls
}

/// Every module file reachable from `src/lib.rs`.
fn module_files() -> Vec<ModuleFile> {
    let src = src_dir();
    let mut files = Vec::new();
    // (file, directory its child modules live in, top-level module, test only)
    let mut todo = Vec::new();
    for (name, test_only) in mod_decls(&strip(&read(&src.join("lib.rs")))) {
        todo.push((name.clone(), src.clone(), vec![name], test_only));
    }
    while let Some((name, dir, module, test_only)) = todo.pop() {
        let flat = dir.join(format!("{name}.rs"));
        let nested = dir.join(&name).join("mod.rs");
        let path = if flat.exists() { flat } else { nested };
        assert!(
            path.exists(),
            "module {name} in {} has no file",
            dir.display()
        );
        let code = strip(&read(&path));
        for (child, child_test) in mod_decls(&code) {
            let mut child_module = module.clone();
            child_module.push(child.clone());
            todo.push((
                child,
                dir.join(&name),
                child_module,
                test_only || child_test,
            ));
        }
        files.push(ModuleFile {
            top: module[0].clone(),
            module,
            path,
            test_only,
        });
    }
    files
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The measured graph: (library edges, unit-test edges).
fn measure() -> (Edges, Edges) {
    let (mut lib, mut test) = (Edges::new(), Edges::new());
    let src = src_dir();
    for file in module_files() {
        let code = strip(&read(&file.path));
        let (lib_code, test_code) = if file.test_only {
            (String::new(), code)
        } else {
            split_cfg_test(&code)
        };
        let shown = file
            .path
            .strip_prefix(&src)
            .unwrap_or(&file.path)
            .display()
            .to_string();
        for (code, edges) in [(&lib_code, &mut lib), (&test_code, &mut test)] {
            for to in crate_refs(code) {
                if to != file.top {
                    edges
                        .entry((file.top.clone(), to))
                        .or_default()
                        .insert(shown.clone());
                }
            }
        }
    }
    (lib, test)
}

fn declared(module: &str) -> Option<&'static [&'static str]> {
    LAYERS
        .iter()
        .find(|(m, _)| *m == module)
        .map(|(_, deps)| *deps)
}

#[test]
fn the_declared_layers_point_down() {
    for (rank, (module, deps)) in LAYERS.iter().enumerate() {
        for dep in *deps {
            let below = LAYERS[..rank].iter().any(|(m, _)| m == dep);
            assert!(
                below,
                "layer {module} declares {dep}, which is not below it"
            );
        }
    }
}

#[test]
fn every_top_level_module_has_a_layer() {
    let src = src_dir();
    let tops: BTreeSet<String> = mod_decls(&strip(&read(&src.join("lib.rs"))))
        .into_iter()
        .map(|(name, _)| name)
        .collect();
    for top in &tops {
        assert!(
            declared(top).is_some(),
            "module {top} has no entry in LAYERS"
        );
    }
    for (module, _) in LAYERS {
        assert!(
            tops.contains(*module),
            "LAYERS names {module}, which lib.rs does not declare"
        );
    }
}

#[test]
fn every_source_file_is_a_module() {
    let mut reached: BTreeSet<PathBuf> = module_files().into_iter().map(|f| f.path).collect();
    reached.insert(src_dir().join("lib.rs"));
    reached.insert(src_dir().join("main.rs"));
    let mut stack = vec![src_dir()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                assert!(
                    reached.contains(&path),
                    "{} is no module of the crate",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn library_imports_follow_the_layers() {
    let (lib, _) = measure();
    let mut upward = Vec::new();
    for ((from, to), files) in &lib {
        let allowed = declared(from).is_some_and(|deps| deps.contains(&to.as_str()));
        if !allowed {
            upward.push(format!("{from} -> {to} ({files:?})"));
        }
    }
    assert!(
        upward.is_empty(),
        "imports outside the layers:\n{}",
        upward.join("\n")
    );
}

#[test]
fn unit_tests_import_their_layer_and_the_test_fabric() {
    let (_, test) = measure();
    let mut outside = Vec::new();
    for ((from, to), files) in &test {
        let allowed = declared(from).is_some_and(|deps| deps.contains(&to.as_str()))
            || TEST_SUPPORT.contains(&to.as_str());
        if !allowed {
            outside.push(format!("{from} -> {to} ({files:?})"));
        }
    }
    assert!(
        outside.is_empty(),
        "unit-test imports outside the layers:\n{}",
        outside.join("\n")
    );
}

#[test]
fn the_library_graph_is_acyclic() {
    let (lib, _) = measure();
    let mut deps: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in lib.keys() {
        deps.entry(from).or_default().insert(to);
        deps.entry(to).or_default();
    }
    // Kahn's algorithm: repeatedly remove modules whose dependencies are all removed.
    let mut order = Vec::new();
    while let Some(&next) = deps
        .iter()
        .find(|(_, ds)| ds.iter().all(|d| order.contains(d)))
        .map(|(m, _)| m)
    {
        order.push(next);
        deps.remove(next);
    }
    assert!(
        deps.is_empty(),
        "import cycle among {:?}",
        deps.keys().collect::<Vec<_>>()
    );
    let graph: Vec<String> = order
        .iter()
        .map(|m| {
            let to: Vec<&str> = lib
                .keys()
                .filter(|(f, _)| f == m)
                .map(|(_, t)| t.as_str())
                .collect();
            format!("{m} -> {}", to.join(", "))
        })
        .collect();
    println!("{}", graph.join("\n"));
}

#[test]
fn the_scanner_reads_paths_and_skips_comments() {
    let code = strip(
        "use crate::{wire::{a, b}, verbs::C};\n// crate::tools\n/// [x](crate::sim::X)\n\
         let s = \"crate::daemon\"; let c = '\\''; fn f<'a>() { crate::cm::go() }\n\
         #[cfg(test)]\nmod tests { use crate::sim::Fabric; }\npub(crate) fn g() {}",
    );
    let (lib, test) = split_cfg_test(&code);
    let names = |s: &str| crate_refs(s).into_iter().collect::<Vec<_>>();
    assert_eq!(names(&lib), ["cm", "verbs", "wire"]);
    assert_eq!(names(&test), ["sim"]);
}

/// Modules whose submodules still import each other in a cycle (debt: the test prints their
/// cycles). Each must still have one, so a fixed module leaves this list; every other
/// module's submodule graph, `soft`'s among them, is acyclic.
const KNOWN_SUBMODULE_CYCLES: &[&str] = &[];

/// The node of a module's own file (`mod.rs`, or `name.rs` with child modules) in the graph
/// of its submodules.
const OWN_FILE: &str = "(own file)";

/// A token of stripped code, as far as paths need.
#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    PathSep,
    Open,
    Close,
    Comma,
    Star,
    Other(char),
}

fn tokens(code: &str) -> Vec<Tok> {
    let mut out = Vec::new();
    let mut chars = code.char_indices().peekable();
    while let Some((k, c)) = chars.next() {
        if is_ident(c) {
            let name: String = code[k..].chars().take_while(|&c| is_ident(c)).collect();
            for _ in 1..name.len() {
                chars.next();
            }
            out.push(Tok::Ident(name));
        } else if c == ':' && chars.peek().is_some_and(|&(_, n)| n == ':') {
            chars.next();
            out.push(Tok::PathSep);
        } else if !c.is_whitespace() {
            out.push(match c {
                '{' => Tok::Open,
                '}' => Tok::Close,
                ',' => Tok::Comma,
                '*' => Tok::Star,
                '$' => continue,
                c => Tok::Other(c),
            });
        }
    }
    out
}

/// Reads the path (or use tree) starting at `t[i]`, pushing every path it names (a group
/// `a::{b, c::d}` names `a::b` and `a::c::d`) onto `out`; returns the index after it.
fn use_tree(t: &[Tok], mut i: usize, mut prefix: Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    loop {
        match t.get(i) {
            Some(Tok::Ident(s)) => {
                prefix.push(s.clone());
                i += 1;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match t.get(i) {
                        None => return i,
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        _ => {
                            let before = i;
                            i = use_tree(t, i, prefix.clone(), out);
                            if i == before {
                                i += 1;
                            }
                        }
                    }
                }
            }
            Some(Tok::Star) => {
                out.push(prefix);
                return i + 1;
            }
            _ => {
                out.push(prefix);
                return i;
            }
        }
        if t.get(i) == Some(&Tok::PathSep) {
            i += 1;
        } else {
            out.push(prefix);
            return i;
        }
    }
}

/// The modules that the code of module `at` names by path: `crate::`, `super::` and `self::`
/// paths, and paths through `at`'s own child modules; each resolved to the deepest module of
/// `modules` it reaches. Visibilities (`pub(super)`, `pub(in crate::x)`) name no module.
fn module_refs(
    at: &[String],
    code: &str,
    modules: &BTreeSet<Vec<String>>,
) -> BTreeSet<Vec<String>> {
    let t = tokens(code);
    let child = |name: &str| {
        let mut m = at.to_vec();
        m.push(name.to_string());
        modules.contains(&m)
    };
    let mut refs = BTreeSet::new();
    for i in 0..t.len() {
        let Tok::Ident(name) = &t[i] else { continue };
        let prev = |back: usize| i.checked_sub(back).map(|k| &t[k]);
        let visibility = matches!(
            (prev(2), prev(1)),
            (Some(Tok::Ident(p)), Some(Tok::Other('('))) if p == "pub"
        ) || matches!(
            (prev(2), prev(1)),
            (Some(Tok::Other('(')), Some(Tok::Ident(p))) if p == "in"
        );
        let starts = matches!(name.as_str(), "crate" | "super" | "self")
            || (child(name) && t.get(i + 1) == Some(&Tok::PathSep));
        if !starts || visibility || prev(1) == Some(&Tok::PathSep) {
            continue;
        }
        let mut paths = Vec::new();
        use_tree(&t, i, Vec::new(), &mut paths);
        for path in paths {
            let mut segs = path.iter().map(String::as_str);
            let mut cur: Vec<String> = match segs.next() {
                Some("crate") => Vec::new(),
                Some("super") => at[..at.len().saturating_sub(1)].to_vec(),
                Some("self") => at.to_vec(),
                Some(c) => [at, &[c.to_string()]].concat(),
                None => continue,
            };
            for seg in segs {
                match seg {
                    "super" => {
                        cur.pop();
                    }
                    "self" => {}
                    name => {
                        cur.push(name.to_string());
                        if !modules.contains(&cur) {
                            cur.pop();
                            break;
                        }
                    }
                }
            }
            refs.insert(cur);
        }
    }
    refs
}

/// `code` without its re-exports (`pub use ..;`, `pub(crate) use ..;`): they are the module's
/// surface, not what its code depends on, so a facade `mod.rs` that re-exports its children
/// while they use its shared items is no cycle.
fn drop_reexports(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("pub") {
        let boundary = !rest[..at].chars().next_back().is_some_and(is_ident);
        let mut tail = rest[at + 3..].trim_start();
        if tail.starts_with('(') {
            tail = tail[tail.find(')').map_or(tail.len(), |k| k + 1)..].trim_start();
        }
        let is_use = tail.starts_with("use") && !tail[3..].starts_with(is_ident);
        if boundary && is_use {
            out.push_str(&rest[..at]);
            let end = tail.find(';').map_or(tail.len(), |k| k + 1);
            rest = &tail[end..];
        } else {
            out.push_str(&rest[..at + 3]);
            rest = &rest[at + 3..];
        }
    }
    out.push_str(rest);
    out
}

/// For every module with submodules, the graph among them: (module, (from, to) -> files).
/// A node is a child module with everything below it, or [`OWN_FILE`]. Library code only:
/// test-only files, `#[cfg(test)]` / `#[cfg(doc)]` items and re-exports are left out.
fn submodule_graphs() -> BTreeMap<Vec<String>, Edges> {
    let files = module_files();
    let mut modules: BTreeSet<Vec<String>> = files.iter().map(|f| f.module.clone()).collect();
    modules.insert(Vec::new());
    let lib_rs = ModuleFile {
        top: String::new(),
        module: Vec::new(),
        path: src_dir().join("lib.rs"),
        test_only: false,
    };
    let src = src_dir();
    let mut graphs: BTreeMap<Vec<String>, Edges> = BTreeMap::new();
    for file in files.iter().chain([&lib_rs]).filter(|f| !f.test_only) {
        let (code, _) = split_cfg_test(&strip(&read(&file.path)));
        let (code, _) = split_attr(&code, "#[cfg(doc)]");
        let code = drop_reexports(&code);
        let shown = file
            .path
            .strip_prefix(&src)
            .unwrap_or(&file.path)
            .display()
            .to_string();
        let from = &file.module;
        for to in module_refs(from, &code, &modules) {
            let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
            if common == from.len() && common == to.len() {
                continue;
            }
            let node = |m: &[String]| m.get(common).map_or(OWN_FILE.to_string(), Clone::clone);
            graphs
                .entry(from[..common].to_vec())
                .or_default()
                .entry((node(from), node(&to)))
                .or_default()
                .insert(shown.clone());
        }
    }
    graphs
}

/// The nodes of `edges` that lie on a cycle, grouped by strongly connected component.
fn cycles(edges: &Edges) -> Vec<BTreeSet<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges.keys() {
        next.entry(from).or_default().insert(to);
    }
    let reach = |start: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![start];
        while let Some(n) = stack.pop() {
            for &m in next.get(n).into_iter().flatten() {
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let reached: BTreeMap<&str, BTreeSet<&str>> = next.keys().map(|&n| (n, reach(n))).collect();
    let mut out: Vec<BTreeSet<String>> = Vec::new();
    for (&n, r) in &reached {
        if !r.contains(n) || out.iter().any(|c| c.contains(n)) {
            continue;
        }
        let component = r
            .iter()
            .filter(|m| reached.get(*m).is_some_and(|back| back.contains(n)))
            .map(|m| m.to_string())
            .collect();
        out.push(component);
    }
    out
}

/// A readable account of `module`'s cycles: each component with the edges inside it.
fn describe_cycles(module: &[String], edges: &Edges) -> String {
    let name = if module.is_empty() {
        "crate".to_string()
    } else {
        module.join("::")
    };
    let mut lines = Vec::new();
    for component in cycles(edges) {
        lines.push(format!("{name}: cycle among {component:?}"));
        for ((from, to), files) in edges {
            if component.contains(from) && component.contains(to) {
                lines.push(format!("  {from} -> {to} ({files:?})"));
            }
        }
    }
    lines.join("\n")
}

#[test]
fn every_module_s_submodules_import_one_way() {
    let graphs = submodule_graphs();
    let mut found = Vec::new();
    let mut fixed = Vec::new();
    for (module, edges) in &graphs {
        let known = KNOWN_SUBMODULE_CYCLES.contains(&module.join("::").as_str());
        let has = !cycles(edges).is_empty();
        if has && !known {
            found.push(describe_cycles(module, edges));
        } else if has {
            println!("known debt:\n{}", describe_cycles(module, edges));
        } else if known {
            fixed.push(module.join("::"));
        }
    }
    assert!(
        found.is_empty(),
        "submodule import cycles:\n{}",
        found.join("\n")
    );
    assert!(
        fixed.is_empty(),
        "no longer cyclic, remove from KNOWN_SUBMODULE_CYCLES: {fixed:?}"
    );
}

#[test]
fn the_submodule_scanner_resolves_relative_paths_and_finds_cycles() {
    let m = |s: &str| -> Vec<String> {
        s.split("::")
            .filter(|p| !p.is_empty())
            .map(String::from)
            .collect()
    };
    let modules: BTreeSet<Vec<String>> = ["", "a", "a::b", "a::c", "a::c::d", "x"]
        .iter()
        .map(|s| m(s))
        .collect();
    let code = strip(
        "use super::{b::Thing, c::{self, d::E}, Own};\nuse crate::x::Y;\n\
         pub(super) fn f() {} pub(in crate::a) struct S; fn g() { self.h(); std::mem::take(); }\n\
         // super::b::Hidden\n",
    );
    let refs: Vec<Vec<String>> = module_refs(&m("a::c"), &code, &modules)
        .into_iter()
        .collect();
    assert_eq!(
        refs,
        [m("a"), m("a::b"), m("a::c"), m("a::c::d"), m("x")],
        "super::Own is the parent's own file; visibilities name nothing"
    );
    let own = strip("pub use c::d::E; mod b; use b::Thing; fn f() -> c::d::F { c::d::f() }");
    let refs: Vec<Vec<String>> = module_refs(&m("a"), &own, &modules).into_iter().collect();
    assert_eq!(refs, [m("a::b"), m("a::c::d")]);
    let facade =
        drop_reexports("pub use c::d::E;\npub(crate) use b::{X, Y};\nuse b::Z; republic();");
    assert_eq!(facade, "\n\nuse b::Z; republic();");

    // A planted cycle: b -> c -> (own file) -> b; d hangs below and is on none.
    let mut edges = Edges::new();
    for (from, to) in [("b", "c"), ("c", OWN_FILE), (OWN_FILE, "b"), ("c", "d")] {
        edges
            .entry((from.to_string(), to.to_string()))
            .or_default()
            .insert("f.rs".to_string());
    }
    let found = cycles(&edges);
    let expected: BTreeSet<String> = ["b", "c", OWN_FILE].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, [expected]);
    edges.remove(&(OWN_FILE.to_string(), "b".to_string()));
    assert!(cycles(&edges).is_empty());
}
