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
//!   fabric in [`TEST_SUPPORT`].
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
    ("soft", &["wire", "verbs", "sys"]),
    ("hw", &["verbs"]),
    ("cm", &["wire", "verbs", "timer"]),
    ("mad", &["wire", "verbs", "cm", "choice"]),
    ("ipoib", &["wire", "verbs", "timer", "cm", "choice"]),
    ("driver", &["sys", "verbs", "mad", "ipoib"]),
    ("sim", &["verbs", "soft", "mad", "ipoib"]),
    (
        "daemon",
        &[
            "wire", "sys", "verbs", "soft", "hw", "cm", "mad", "ipoib", "driver",
        ],
    ),
    (
        "tools",
        &[
            "wire", "verbs", "soft", "hw", "cm", "mad", "driver", "daemon",
        ],
    ),
];

/// What unit tests of any layer may import besides their layer's own dependencies: the
/// simulated fabric and the provider it runs.
const TEST_SUPPORT: &[&str] = &["sim", "soft"];

/// One module file and whether the whole file is test code.
struct ModuleFile {
    top: String,
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
    const ATTR: &str = "#[cfg(test)]";
    let (mut lib, mut test) = (String::new(), String::new());
    let mut rest = code;
    while let Some(at) = rest.find(ATTR) {
        lib.push_str(&rest[..at]);
        let item = &rest[at..];
        let mut depth = 0usize;
        let mut end = item.len();
        for (k, ch) in item.char_indices().skip(ATTR.len()) {
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
        todo.push((name.clone(), src.clone(), name, test_only));
    }
    while let Some((name, dir, top, test_only)) = todo.pop() {
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
            todo.push((child, dir.join(&name), top.clone(), test_only || child_test));
        }
        files.push(ModuleFile {
            top,
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
