//! The daemon's top-level modules import one another without cycles: each can be read, tested and
//! replaced knowing only the modules below it (ARCHITECTURE.md, "Checking the module graph").
//!
//! The graph comes from the sources: module `a` depends on `b` when code of `a` (outside its unit
//! tests and comments) names `crate::b`. Shared leaf modules (`config_error`, `resolved_frame`)
//! are how two modules share a type without depending on each other.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// Top-level module name -> its source files.
fn modules(src: &Path) -> BTreeMap<String, Vec<PathBuf>> {
    let mut modules = BTreeMap::new();
    for entry in fs::read_dir(src).expect("src/") {
        let path = entry.expect("entry").path();
        let name = path
            .file_stem()
            .and_then(|stem| stem.to_str())
            .expect("utf-8 name")
            .to_owned();
        if name == "lib" || name == "main" {
            continue;
        }
        let files = modules.entry(name).or_insert_with(Vec::new);
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    modules
}

fn rust_files(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in fs::read_dir(dir).expect("module dir") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, files);
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
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

/// The top-level modules `text` names as `crate::name`.
fn named_modules<'a>(text: &str, known: &'a BTreeSet<&'a str>) -> BTreeSet<&'a str> {
    let mut named = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        let rest = &text[at + "crate::".len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if let Some(module) = known.get(&rest[..end]) {
            named.insert(*module);
        }
    }
    named
}

/// A cycle through `start`, if any, by depth-first search.
fn cycle_from<'a>(
    graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
    start: &'a str,
) -> Option<Vec<&'a str>> {
    fn visit<'a>(
        graph: &BTreeMap<&'a str, BTreeSet<&'a str>>,
        node: &'a str,
        start: &'a str,
        path: &mut Vec<&'a str>,
        seen: &mut BTreeSet<&'a str>,
    ) -> bool {
        for &next in graph.get(node).into_iter().flatten() {
            if next == start {
                path.push(next);
                return true;
            }
            if seen.insert(next) {
                path.push(next);
                if visit(graph, next, start, path, seen) {
                    return true;
                }
                path.pop();
            }
        }
        false
    }
    let mut path = vec![start];
    visit(graph, start, start, &mut path, &mut BTreeSet::new()).then_some(path)
}

#[test]
fn top_level_modules_import_each_other_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = modules(&src);
    let names: BTreeSet<&str> = modules.keys().map(String::as_str).collect();
    assert!(
        names.len() > 20,
        "found only {names:?} under {}",
        src.display()
    );
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (name, files) in &modules {
        let depends = graph.entry(name.as_str()).or_default();
        for file in files {
            let text = fs::read_to_string(file).expect("source file");
            depends.extend(named_modules(&code(&text), &names));
        }
        depends.remove(name.as_str());
    }
    let cycles: Vec<String> = names
        .iter()
        .filter_map(|name| cycle_from(&graph, name))
        .map(|cycle| cycle.join(" -> "))
        .collect();
    assert!(cycles.is_empty(), "import cycles: {cycles:#?}");
}

#[test]
fn the_checker_finds_a_cycle() {
    let known: BTreeSet<&str> = ["a", "b", "c"].into_iter().collect();
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    graph.insert("a", named_modules(&code("use crate::b::X;\n"), &known));
    graph.insert(
        "b",
        named_modules(&code("fn f() { crate::c::g() }\n// crate::a\n"), &known),
    );
    graph.insert(
        "c",
        named_modules(
            &code("use std::x;\n#[cfg(test)]\nmod tests {\n use crate::a;\n}\n"),
            &known,
        ),
    );
    assert_eq!(
        cycle_from(&graph, "a"),
        None,
        "comments and tests do not count"
    );
    graph.get_mut("c").expect("c").insert("a");
    assert_eq!(cycle_from(&graph, "a"), Some(vec!["a", "b", "c", "a"]));
}
