//! How `cargo xtask test` builds and runs: everything built in one cargo selection (one feature
//! set, so nothing is built twice), the end-to-end groups (tests/tests/*.rs) run one at a time
//! from their executables, each timed, and a failed group's panic messages repeated at the end
//! of the output, where a CI log's tail shows them.

use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};

/// Lines kept per panic: the message and the start of its backtrace or assertion values.
const LINES_PER_PANIC: usize = 12;
/// Panics kept per failed group.
const PANICS_PER_GROUP: usize = 4;
/// Tests named in the summary, the slowest of every group's: where CI's time goes.
const SLOWEST_TESTS: usize = 15;

/// The steps before the groups, timed: what CI spends besides the tests themselves.
pub struct Phases {
    started: Instant,
    last: Instant,
    ended: Vec<(&'static str, Duration)>,
}

impl Phases {
    pub fn start() -> Self {
        let now = Instant::now();
        Self {
            started: now,
            last: now,
            ended: Vec::new(),
        }
    }

    /// Ends the phase running since the last one ended.
    pub fn end(&mut self, name: &'static str) {
        let now = Instant::now();
        self.ended.push((name, now - self.last));
        self.last = now;
    }
}

/// How one group ended.
pub struct GroupRun {
    pub name: String,
    pub took: Duration,
    pub passed: bool,
    /// The panic messages of a failed group, each a few lines.
    pub panics: Vec<String>,
    /// Each test's name and time, as its output showed them.
    pub tests: Vec<(String, Duration)>,
}

/// The packages every cargo command of a test run selects. Cargo unifies features over the
/// selected packages (and their dev-dependencies when tests are built), so a second selection
/// would build the daemon and much of its dependency tree again, a minute or more from clean.
pub const SELECTION: [&str; 3] = ["--workspace", "--exclude", "profiler-ebpf"];

/// A test executable cargo built.
pub struct TestExecutable {
    /// The target's name: for the end-to-end crate, the group (`java_names`, `real_apps`).
    pub name: String,
    /// `lib`, `bin` or `test`.
    pub kind: String,
    /// The Cargo.toml of its package.
    pub manifest: PathBuf,
    pub path: PathBuf,
}

/// Builds, in one selection, the daemon, the agent and every test executable, and lists the
/// executables. The daemon binary is built with the features the tests' dependencies add: a
/// debug build that differs from a plain `cargo build` only in code the tests use.
pub fn build(root: &Path) -> Result<Vec<TestExecutable>> {
    let status = Command::new("cargo")
        .current_dir(root)
        .arg("build")
        .args(SELECTION)
        .args(["--lib", "--bin", "profiler-daemon", "--tests"])
        .status()
        .context("starting cargo build")?;
    anyhow::ensure!(
        status.success(),
        "cargo build of the test run failed: {status}"
    );
    let output = Command::new("cargo")
        .current_dir(root)
        .arg("test")
        .args(SELECTION)
        .args(["--no-run", "--message-format=json-render-diagnostics"])
        .stderr(Stdio::inherit())
        .output()
        .context("starting cargo test --no-run")?;
    anyhow::ensure!(
        output.status.success(),
        "cargo test --no-run failed: {}",
        output.status
    );
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(test_executable)
        .collect())
}

/// The test executable a `compiler-artifact` message of `cargo --message-format=json` names.
fn test_executable(line: &str) -> Option<TestExecutable> {
    let message: serde_json::Value = serde_json::from_str(line).ok()?;
    if message["reason"] != "compiler-artifact" || message["profile"]["test"] != true {
        return None;
    }
    Some(TestExecutable {
        name: message["target"]["name"].as_str()?.to_owned(),
        kind: message["target"]["kind"][0].as_str()?.to_owned(),
        manifest: PathBuf::from(message["manifest_path"].as_str()?),
        path: PathBuf::from(message["executable"].as_str()?),
    })
}

/// The end-to-end crate's test executables: its library's unit tests, and the groups.
pub fn end_to_end(root: &Path, executables: Vec<TestExecutable>) -> Vec<TestExecutable> {
    let manifest = root.join("tests/Cargo.toml");
    let mut ours: Vec<TestExecutable> = executables
        .into_iter()
        .filter(|e| e.manifest == manifest)
        .collect();
    ours.sort_by(|a, b| a.name.cmp(&b.name));
    ours
}

/// Runs one group's test executable, its output passed through as it comes and kept to find the
/// panics in.
pub fn run_group(command: &mut Command, name: &str) -> Result<GroupRun> {
    let started = Instant::now();
    let mut child = command
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting the {name} tests"))?;
    let kept = Arc::new(Mutex::new(Vec::new()));
    let stdout = child.stdout.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    let out = pass_through(stdout, false, kept.clone());
    let err = pass_through(stderr, true, kept.clone());
    let status = child.wait().context("waiting for cargo test")?;
    let _ = out.join();
    let _ = err.join();
    let passed = status.success();
    let lines = kept.lock().unwrap_or_else(|e| e.into_inner());
    let panics = if passed {
        Vec::new()
    } else {
        let texts: Vec<String> = lines.iter().map(|(_, text)| text.clone()).collect();
        panic_excerpts(&texts)
    };
    Ok(GroupRun {
        name: name.to_owned(),
        took: started.elapsed(),
        passed,
        panics,
        tests: test_times(&lines),
    })
}

/// A line of a group's output and when it was complete (its newline came).
type TimedLine = (Instant, String);

/// Copies a child's stream to ours line by line, keeping each line and when it was complete.
/// The two streams interleave by line, which is all a reader of the log needs.
fn pass_through(
    mut stream: impl Read + Send + 'static,
    to_stderr: bool,
    kept: Arc<Mutex<Vec<TimedLine>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        let mut line = Vec::new();
        let emit = |line: &[u8]| {
            let _ = if to_stderr {
                std::io::stderr().write_all(line)
            } else {
                std::io::stdout().write_all(line)
            };
            let text = String::from_utf8_lossy(line).trim_end().to_owned();
            kept.lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((Instant::now(), text));
        };
        loop {
            let read = match stream.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(read) => read,
            };
            for piece in chunk[..read].split_inclusive(|byte| *byte == b'\n') {
                line.extend_from_slice(piece);
                if piece.ends_with(b"\n") {
                    emit(&line);
                    line.clear();
                }
            }
        }
        if !line.is_empty() {
            emit(&line);
        }
    })
}

/// Each test's time, the groups running one test at a time: from the end of the one before
/// (or the group's `running N tests` line) to its own verdict (`ok`, `FAILED`, `ignored`).
///
/// Not from its `test NAME ... ` line: libtest writes that without a newline to a
/// line-buffered stdout, so it comes out when the test first prints a line to stdout, or with
/// its verdict, whichever is first. The verdict ends the line, on its own if the test printed.
fn test_times(lines: &[TimedLine]) -> Vec<(String, Duration)> {
    const VERDICTS: [&str; 3] = ["ok", "FAILED", "ignored"];
    let mut times = Vec::new();
    let mut since: Option<Instant> = None;
    let mut name: Option<&str> = None;
    for (at, text) in lines {
        if text.starts_with("running ") && (text.ends_with(" tests") || text.ends_with(" test")) {
            since = Some(*at);
            continue;
        }
        let mut rest = text.as_str();
        if let Some((test, after)) = text
            .strip_prefix("test ")
            .and_then(|r| r.split_once(" ... "))
        {
            name = Some(test);
            rest = after;
        }
        let verdict = VERDICTS
            .iter()
            .any(|v| rest == *v || rest.starts_with(&format!("{v} <")));
        if !verdict {
            continue;
        }
        if let (Some(test), Some(from)) = (name.take(), since) {
            times.push((test.to_owned(), at.saturating_duration_since(from)));
        }
        since = Some(*at);
    }
    times
}

/// Each `thread '...' panicked at` line and the lines after it, up to the next blank line.
fn panic_excerpts(lines: &[String]) -> Vec<String> {
    let mut panics = Vec::new();
    for (at, line) in lines.iter().enumerate() {
        if !line.contains("panicked at ") {
            continue;
        }
        let excerpt: Vec<&str> = lines[at..]
            .iter()
            .take(LINES_PER_PANIC)
            .take_while(|l| !l.is_empty())
            .map(String::as_str)
            .collect();
        panics.push(excerpt.join("\n"));
        if panics.len() == PANICS_PER_GROUP {
            break;
        }
    }
    panics
}

/// The closing summary: each group's time and verdict, then the failed groups' panics.
pub fn print_summary(groups: &[GroupRun], phases: &Phases) {
    eprintln!("\nbefore the end-to-end groups:");
    for (name, took) in &phases.ended {
        eprintln!("  {name:<40} {:>7.1} s", took.as_secs_f64());
    }
    eprintln!("end-to-end test groups (tests/tests/*.rs):");
    for group in groups {
        let verdict = if group.passed { "ok" } else { "FAILED" };
        eprintln!(
            "  {:<18} {:>7.1} s  {verdict}",
            group.name,
            group.took.as_secs_f64()
        );
    }
    let total: Duration = groups.iter().map(|g| g.took).sum();
    eprintln!(
        "  {:<18} {:>7.1} s; whole command {:.1} min",
        "all groups",
        total.as_secs_f64(),
        phases.started.elapsed().as_secs_f64() / 60.0
    );
    let mut tests: Vec<(&str, &str, Duration)> = groups
        .iter()
        .flat_map(|g| {
            g.tests
                .iter()
                .map(|(test, took)| (g.name.as_str(), test.as_str(), *took))
        })
        .collect();
    tests.sort_by_key(|(_, _, took)| std::cmp::Reverse(*took));
    eprintln!("slowest tests:");
    for (group, test, took) in tests.iter().take(SLOWEST_TESTS) {
        eprintln!("  {:>7.1} s  {group}: {test}", took.as_secs_f64());
    }
    for group in groups.iter().filter(|g| !g.passed) {
        eprintln!("\n{} failed:", group.name);
        if group.panics.is_empty() {
            eprintln!("  (no panic message: see the group's output above)");
        }
        for panic in &group.panics {
            for line in panic.lines() {
                eprintln!("  {line}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_executables_are_read_from_cargo_messages() {
        let line = r#"{"reason":"compiler-artifact","manifest_path":"/r/tests/Cargo.toml","target":{"kind":["test"],"name":"java_names"},"profile":{"test":true},"executable":"/r/target/debug/deps/java_names-1"}"#;
        let executable = test_executable(line).expect("a test executable");
        assert_eq!(executable.name, "java_names");
        assert_eq!(executable.kind, "test");
        assert_eq!(
            executable.path,
            PathBuf::from("/r/target/debug/deps/java_names-1")
        );
        let plain_build = line.replace(r#""test":true"#, r#""test":false"#);
        assert!(test_executable(&plain_build).is_none());
        assert!(test_executable(r#"{"reason":"build-finished","success":true}"#).is_none());
    }

    #[test]
    fn each_test_lasts_from_the_verdict_before_it_to_its_own() {
        let start = Instant::now();
        let at = |secs: u64| start + Duration::from_secs(secs);
        let lines: Vec<TimedLine> = [
            (0, "running 3 tests"),
            // Printed to stdout: its name comes out with its first line, its verdict alone.
            (1, "test first ... output of the first"),
            (2, "ok"),
            // Printed only to stderr: its name comes out with its verdict.
            (3, "--- daemon log ---"),
            (5, "test second ... ok"),
            (6, "test third ... FAILED"),
            (9, "test result: FAILED. 2 passed; 1 failed"),
        ]
        .iter()
        .map(|(secs, text)| (at(*secs), text.to_string()))
        .collect();
        assert_eq!(
            test_times(&lines),
            [
                ("first".to_owned(), Duration::from_secs(2)),
                ("second".to_owned(), Duration::from_secs(3)),
                ("third".to_owned(), Duration::from_secs(1)),
            ]
        );
    }

    #[test]
    fn panics_are_cut_at_the_blank_line_after_them() {
        let lines: Vec<String> = [
            "JDK 8: fine",
            "thread 'names' panicked at tests/tests/java_names.rs:250:5:",
            "[\"JDK 27 (memory): 16.0% unnamed\"]",
            "",
            "failures:",
            "thread 'other' panicked at x.rs:1:1:",
            "boom",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(
            panic_excerpts(&lines),
            [
                "thread 'names' panicked at tests/tests/java_names.rs:250:5:\n[\"JDK 27 (memory): 16.0% unnamed\"]",
                "thread 'other' panicked at x.rs:1:1:\nboom",
            ]
        );
    }
}
