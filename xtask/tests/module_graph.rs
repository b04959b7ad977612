//! Every crate's modules import one another without cycles, at every level: the top-level
//! modules of a crate, and the modules inside each directory module. Each can then be read,
//! tested and replaced knowing only the modules below it (ARCHITECTURE.md, "Checking the module
//! graph").
//!
//! The graph comes from the sources: sibling `a` depends on sibling `b` when code of `a` (its
//! file or the files under its directory, outside unit tests and comments) names `b` by a path
//! that reaches their parent: `crate::b` at the top level, `crate::parent::b`, or `super::b`
//! from `a`'s own file (`super::super::b` one directory down). A parent may use its children;
//! children sharing a type without depending on each other put it in a leaf sibling.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// The crates whose sources are checked (each with a `src/`).
const CRATES: &[&str] = &[
    "profiler-common",
    "profiler-daemon",
    "profiler-ebpf",
    "profiler-jvmti",
    "profiler-jvmti-records",
    "profiler-unwind",
    "tests",
    "xtask",
];

/// Files that are a module's own body rather than a child: the crate roots and `mod.rs`.
fn is_body(name: &str) -> bool {
    matches!(name, "lib.rs" | "main.rs" | "mod.rs")
}

/// A directory module: where its children are, and the path code names it by after `crate::`.
struct DirModule {
    dir: PathBuf,
    /// `["hotspot"]` for `src/hotspot/`; empty for `src/`.
    path: Vec<String>,
}

/// `src` and every directory below it.
fn dir_modules(src: &Path) -> Vec<DirModule> {
    let mut found = vec![DirModule {
        dir: src.to_owned(),
        path: Vec::new(),
    }];
    let mut index = 0;
    while index < found.len() {
        let (dir, path) = (found[index].dir.clone(), found[index].path.clone());
        for entry in fs::read_dir(&dir).expect("module dir") {
            let child = entry.expect("entry").path();
            if child.is_dir() {
                let mut child_path = path.clone();
                child_path.push(file_name(&child));
                found.push(DirModule {
                    dir: child,
                    path: child_path,
                });
            }
        }
        index += 1;
    }
    found
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .and_then(|n| n.to_str())
        .expect("utf-8 name")
        .to_owned()
}

/// The children of `module`: name -> (file, depth below the child: 0 for its own file) pairs.
fn children(module: &DirModule) -> BTreeMap<String, Vec<(PathBuf, usize)>> {
    let mut children: BTreeMap<String, Vec<(PathBuf, usize)>> = BTreeMap::new();
    for entry in fs::read_dir(&module.dir).expect("module dir") {
        let path = entry.expect("entry").path();
        let name = file_name(&path);
        if path.is_dir() {
            let files = children.entry(name).or_default();
            rust_files(&path, 0, files);
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if !is_body(&name) {
                children.entry(stem.to_owned()).or_default().push((path, 0));
            }
        }
    }
    children
}

/// Files under `dir` with their depth: `dir/x.rs` and `dir/mod.rs` are 1 and 0 below `dir`'s
/// own module file.
fn rust_files(dir: &Path, depth: usize, files: &mut Vec<(PathBuf, usize)>) {
    for entry in fs::read_dir(dir).expect("module dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, depth + 1, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            let below = if file_name(&path) == "mod.rs" {
                depth
            } else {
                depth + 1
            };
            files.push((path, below));
        }
    }
}

/// The code of a file without its unit tests and comments.
fn code(text: &str) -> String {
    let text = match text.find("#[cfg(test)]\nmod tests") {
        Some(tests) => &text[..tests],
        None => text,
    };
    text.lines()
        .map(|line| line.split("//").next().unwrap_or(""))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The names among `known` that `text` reaches through `prefix` (`crate::hotspot::`,
/// `super::`): `prefix name` and `prefix{name, other::thing}`.
fn named_after<'a>(text: &str, prefix: &str, known: &'a BTreeSet<String>) -> BTreeSet<&'a str> {
    let ident_end = |s: &str| {
        s.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len())
    };
    let mut named = BTreeSet::new();
    for (at, _) in text.match_indices(prefix) {
        // Not the tail of a longer path (`super::super::` is matched from its start).
        let before = &text[..at];
        if before.ends_with("::")
            || before.ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
        {
            continue;
        }
        let rest = &text[at + prefix.len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => {
                let group = &group[..group.find('}').unwrap_or(group.len())];
                group
                    .split(',')
                    .map(|item| {
                        let item = item.trim();
                        &item[..ident_end(item)]
                    })
                    .collect()
            }
            None => vec![&rest[..ident_end(rest)]],
        };
        for name in names {
            if let Some(module) = known.get(name) {
                named.insert(module.as_str());
            }
        }
    }
    named
}

/// Sibling -> the siblings its code names.
fn sibling_graph(module: &DirModule) -> BTreeMap<String, BTreeSet<String>> {
    let children = children(module);
    let known: BTreeSet<String> = children.keys().cloned().collect();
    let through_crate = format!(
        "crate::{}",
        module
            .path
            .iter()
            .map(|segment| format!("{segment}::"))
            .collect::<String>()
    );
    let mut graph = BTreeMap::new();
    for (name, files) in &children {
        let mut depends = BTreeSet::new();
        for (file, depth) in files {
            let text = code(&fs::read_to_string(file).expect("source file"));
            depends.extend(named_after(&text, &through_crate, &known));
            let through_super = "super::".repeat(depth + 1);
            depends.extend(named_after(&text, &through_super, &known));
        }
        depends.remove(name.as_str());
        graph.insert(
            name.clone(),
            depends.into_iter().map(str::to_owned).collect(),
        );
    }
    graph
}

/// A cycle through `start`, if any, by depth-first search.
fn cycle_from(graph: &BTreeMap<String, BTreeSet<String>>, start: &str) -> Option<Vec<String>> {
    fn visit(
        graph: &BTreeMap<String, BTreeSet<String>>,
        node: &str,
        start: &str,
        path: &mut Vec<String>,
        seen: &mut BTreeSet<String>,
    ) -> bool {
        for next in graph.get(node).into_iter().flatten() {
            if next == start {
                path.push(next.clone());
                return true;
            }
            if seen.insert(next.clone()) {
                path.push(next.clone());
                if visit(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start.to_owned()];
    visit(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn no_crate_has_an_import_cycle_at_any_level() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let mut cycles = Vec::new();
    let mut levels = 0;
    for krate in CRATES {
        let src = root.join(krate).join("src");
        assert!(src.is_dir(), "{} is not a directory", src.display());
        for module in dir_modules(&src) {
            let graph = sibling_graph(&module);
            levels += 1;
            for name in graph.keys() {
                if let Some(cycle) = cycle_from(&graph, name) {
                    cycles.push(format!(
                        "{krate}: crate::{}{}",
                        module
                            .path
                            .iter()
                            .map(|s| format!("{s}::"))
                            .collect::<String>(),
                        cycle.join(" -> ")
                    ));
                }
            }
        }
    }
    assert!(levels > 20, "only {levels} module levels found");
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_checker_finds_cycles_through_crate_super_and_groups() {
    let known: BTreeSet<String> = ["a", "b", "c", "d"].map(str::to_owned).into();
    let text = code("use super::{b, Thing};\nfn f() { crate::x::c::g() }\n// super::d\n");
    assert_eq!(
        named_after(&text, "super::", &known),
        ["b"].into_iter().collect::<BTreeSet<_>>()
    );
    assert_eq!(
        named_after(&text, "crate::x::", &known),
        ["c"].into_iter().collect::<BTreeSet<_>>()
    );
    // `super::super::a` is not `super::a`.
    assert!(named_after("use super::super::a;", "super::", &known).is_empty());
    assert_eq!(
        named_after("use super::super::a;", "super::super::", &known).len(),
        1
    );
    // Unit tests do not count.
    assert!(named_after(
        &code("#[cfg(test)]\nmod tests {\n use super::a;\n}\n"),
        "super::",
        &known
    )
    .is_empty());

    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    graph.insert("a".into(), ["b".into()].into());
    graph.insert("b".into(), ["c".into()].into());
    graph.insert("c".into(), BTreeSet::new());
    assert_eq!(cycle_from(&graph, "a"), None);
    graph.get_mut("c").expect("c").insert("a".into());
    assert_eq!(
        cycle_from(&graph, "a"),
        Some(["a", "b", "c", "a"].map(str::to_owned).to_vec())
    );
}
