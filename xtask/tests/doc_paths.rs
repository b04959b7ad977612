//! Every repository path the documentation names exists: README.md, ARCHITECTURE.md,
//! CONTRIBUTING.md, SECURITY.md, deploy/README.md and docs/*.md are read, and each backticked
//! span or relative link that looks like a path of this repository is looked up. A file that
//! moves takes its mentions with it, or this test names each one left behind (file and line).
//!
//! What counts as a repository path (a precise rule, so prose is never taken for one):
//! - a backticked span without whitespace, or a markdown link's target;
//! - not a URL (`://`), not absolute (`/proc/...`), not a glob (`*`), not a placeholder
//!   (`<pid>`, `$NODE_NAME`, `{a,b}`);
//! - a `path:line` or `path#anchor` suffix is stripped;
//! - with a `/`: its first component is an entry of one of the places paths are resolved
//!   against (below), so `samples/count` or `java/lang/Thread` are prose, `export/x.rs` is not;
//!   one that is only an entry of a crate's `src/` must end in a source file or a `/`
//!   (`off_cpu/nanoseconds` is a sample type, though `off_cpu/` is a module);
//! - without a `/`: a file name with a source extension (`.rs`, `.md`, `.toml`...).
//!
//! A link's target must exist relative to the document's directory, as a browser resolves it.
//! A backticked path with a `/` exists if it does relative to the repository root, to the
//! document's own directory, or to any crate's `src/` (the docs name the daemon's modules as
//! `export/remote_config.rs`); `src/...` relative to a crate's directory. A bare file name exists
//! if some file of the repository has that name.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};

/// Generated or local-only entries of the repository root: paths under them are not checked.
const NOT_IN_THE_REPOSITORY: &[&str] = &[".git", ".tools", "target", "profiles"];

/// Extensions of a bare file name that is checked.
const SOURCE_EXTENSIONS: &[&str] = &[
    "rs", "md", "toml", "c", "h", "service", "yaml", "yml", "sh", "proto", "py",
];

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask has a parent directory")
        .to_owned()
}

/// The documents whose paths are checked.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = [
        "README.md",
        "ARCHITECTURE.md",
        "CONTRIBUTING.md",
        "SECURITY.md",
        "deploy/README.md",
    ]
    .iter()
    .map(|name| root.join(name))
    .filter(|path| path.exists())
    .collect();
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    found.extend(docs);
    found
}

/// The crates' directories: the root's directories with a `Cargo.toml`.
fn crate_dirs(root: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = fs::read_dir(root)
        .expect("root")
        .map(|entry| entry.expect("entry").path())
        .filter(|path| path.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

/// Names of every file of the repository (for bare file names).
fn file_names(dir: &Path, root: &Path, names: &mut BTreeSet<String>) {
    for entry in fs::read_dir(dir).expect("dir") {
        let path = entry.expect("entry").path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if dir == root && NOT_IN_THE_REPOSITORY.contains(&name.as_str()) {
            continue;
        }
        if path.is_dir() {
            file_names(&path, root, names);
        } else {
            names.insert(name);
        }
    }
}

/// A candidate found in a document: the text and the line it starts on (1-based).
struct Mention {
    text: String,
    line: usize,
    /// A markdown link's target, which resolves against the document's directory only.
    link: bool,
}

/// Backticked spans and link targets, outside fenced code blocks.
fn mentions(text: &str) -> Vec<Mention> {
    let mut found = Vec::new();
    let mut in_fence = false;
    // Prose outside fences, each char with its line.
    let mut prose: Vec<(char, usize)> = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            // A fence ends any span: keep the parity of backticks per block of prose.
            prose.push(('\n', index + 1));
            continue;
        }
        if in_fence {
            continue;
        }
        prose.extend(line.chars().map(|c| (c, index + 1)));
        prose.push(('\n', index + 1));
    }
    let mut i = 0;
    while i < prose.len() {
        let (c, line) = prose[i];
        if c == '`' {
            // A code span: up to the next backtick.
            let end = prose[i + 1..]
                .iter()
                .position(|&(c, _)| c == '`')
                .map(|offset| i + 1 + offset);
            let Some(end) = end else { break };
            let span: String = prose[i + 1..end].iter().map(|&(c, _)| c).collect();
            found.push(Mention {
                text: span,
                line,
                link: false,
            });
            i = end + 1;
            continue;
        }
        if c == ']' && prose.get(i + 1).is_some_and(|&(c, _)| c == '(') {
            let end = prose[i + 2..]
                .iter()
                .position(|&(c, _)| c == ')' || c == '\n')
                .map(|offset| i + 2 + offset);
            if let Some(end) = end {
                let target: String = prose[i + 2..end].iter().map(|&(c, _)| c).collect();
                found.push(Mention {
                    text: target,
                    line,
                    link: true,
                });
                i = end + 1;
                continue;
            }
        }
        i += 1;
    }
    found
}

/// The path a mention names, if it looks like one: suffixes stripped, prose and URLs left out.
fn path_of(text: &str) -> Option<&str> {
    if text.is_empty()
        || text.chars().any(char::is_whitespace)
        || text.contains("://")
        || text.starts_with('/')
        || text.starts_with('~')
        || text.starts_with('#')
        || text.starts_with('-')
        || text.chars().any(|c| {
            matches!(
                c,
                '*' | '<' | '>' | '$' | '{' | '}' | '=' | '"' | '\'' | '|'
            )
        })
    {
        return None;
    }
    let text = text.split('#').next()?;
    // `path:line` or `path:line-line`.
    let text = match text.split_once(':') {
        Some((path, rest))
            if !rest.is_empty() && rest.chars().all(|c| c.is_ascii_digit() || c == '-') =>
        {
            path
        }
        Some(_) => return None,
        None => text,
    };
    (!text.is_empty()).then_some(text)
}

fn has_source_extension(name: &str) -> bool {
    name.rsplit_once('.')
        .is_some_and(|(stem, ext)| !stem.is_empty() && SOURCE_EXTENSIONS.contains(&ext))
}

/// The places a path with a `/` is resolved against.
fn bases(root: &Path, document_dir: &Path, crates: &[PathBuf], path: &str) -> Vec<PathBuf> {
    let mut bases = vec![root.to_owned(), document_dir.to_owned()];
    bases.extend(crates.iter().map(|dir| dir.join("src")));
    if path.starts_with("src/") {
        bases.extend(crates.iter().cloned());
    }
    bases
}

fn first_component(path: &str) -> &str {
    path.trim_start_matches("./")
        .split('/')
        .next()
        .unwrap_or_default()
}

/// Why `path` (named in a document in `document_dir`) is missing, or `None` when it exists or
/// is not a repository path.
fn missing(
    path: &str,
    root: &Path,
    document_dir: &Path,
    crates: &[PathBuf],
    names: &BTreeSet<String>,
) -> Option<String> {
    if !path.contains('/') {
        if !has_source_extension(path) || names.contains(path) {
            return None;
        }
        return Some("no file of the repository has this name".into());
    }
    let first = first_component(path);
    if first == ".." {
        return (!document_dir.join(path).exists())
            .then(|| "missing relative to the document's directory".into());
    }
    if first.is_empty() || first == "." {
        return None;
    }
    let bases = bases(root, document_dir, crates, path);
    // Only paths that start where a repository path would: prose like `samples/count` is not one.
    let anchored = bases.iter().any(|base| {
        base.join(first).exists() && !(base == root && NOT_IN_THE_REPOSITORY.contains(&first))
    });
    if !anchored {
        return None;
    }
    // Under a crate's `src/` alone, a module is named as a file or a directory (`export/x.rs`,
    // `off_cpu/`): `off_cpu/nanoseconds` is a sample type, not a path.
    let anchored_outside_src = [root, document_dir]
        .iter()
        .any(|base| base.join(first).exists() && !NOT_IN_THE_REPOSITORY.contains(&first));
    let last = path.rsplit('/').next().unwrap_or_default();
    if !(anchored_outside_src || path.ends_with('/') || has_source_extension(last)) {
        return None;
    }
    if bases.iter().any(|base| base.join(path).exists()) {
        return None;
    }
    Some("missing (relative to the repository root, the document's directory and every crate's src/)".into())
}

#[test]
fn every_repository_path_the_docs_name_exists() {
    let root = workspace_root();
    let crates = crate_dirs(&root);
    let mut names = BTreeSet::new();
    file_names(&root, &root, &mut names);
    let mut problems = Vec::new();
    let mut checked = 0;
    for document in documents(&root) {
        let text = fs::read_to_string(&document).expect("document");
        let document_dir = document.parent().expect("document dir");
        let shown = document
            .strip_prefix(&root)
            .unwrap_or(&document)
            .display()
            .to_string();
        for mention in mentions(&text) {
            let Some(path) = path_of(mention.text.trim()) else {
                continue;
            };
            checked += 1;
            let why = if mention.link {
                (!document_dir.join(path).exists())
                    .then(|| "link target missing relative to the document's directory".to_owned())
            } else {
                missing(path, &root, document_dir, &crates, &names)
            };
            if let Some(why) = why {
                problems.push(format!("{shown}:{}: `{path}`: {why}", mention.line));
            }
        }
    }
    assert!(
        checked > 100,
        "only {checked} paths found: is the scan broken?"
    );
    assert!(
        problems.is_empty(),
        "{} path(s) named in the docs do not exist:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn what_counts_as_a_path() {
    assert_eq!(
        path_of("export/remote_config.rs:42"),
        Some("export/remote_config.rs")
    );
    assert_eq!(
        path_of("docs/kernels.md#the-kernel-matrix"),
        Some("docs/kernels.md")
    );
    assert_eq!(path_of("https://example.com/a/b.rs"), None);
    assert_eq!(path_of("/proc/PID/maps"), None);
    assert_eq!(path_of("docs/hotspot-*.md"), None);
    assert_eq!(path_of("cargo xtask test"), None);
    assert_eq!(path_of("DIR/cpu-<time>.pb.gz"), None);
    assert_eq!(path_of("crate::b"), None);
    assert!(has_source_extension("daemon.rs"));
    assert!(!has_source_extension("libprofiler_jvmti.so"));
    let found = mentions("a `x/y.rs` and [link](docs/a.md#b)\n```\n`not/this.rs`\n```\n`c.rs`");
    let texts: Vec<(&str, usize)> = found.iter().map(|m| (m.text.as_str(), m.line)).collect();
    assert_eq!(texts, vec![("x/y.rs", 1), ("docs/a.md#b", 1), ("c.rs", 5)]);
}
