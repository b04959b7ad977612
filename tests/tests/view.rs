//! End to end on `profiler-daemon view`: the real daemon profiles two programs for a few
//! intervals, then `view` merges its files into one flame graph selected by pid, by service or
//! by process name, and draws a differential flame graph of two windows.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use profiler_daemon::output::file_name::ProfileFileName;
use profiler_tests::*;

/// Runs `profiler-daemon view` with `args`; returns its summary line (stderr) and the SVG.
fn view(args: &[&str], svg: &Path) -> (String, String) {
    let output = Command::new(daemon_binary())
        .arg("view")
        .args(args)
        .arg("-o")
        .arg(svg)
        .output()
        .expect("view runs");
    let summary = String::from_utf8_lossy(&output.stderr).into_owned();
    eprintln!("view {args:?}: {summary}");
    assert!(output.status.success(), "view {args:?} failed: {summary}");
    (
        summary,
        std::fs::read_to_string(svg).expect("the SVG is written"),
    )
}

/// The number before " files read" in a summary line.
fn files_read(summary: &str) -> usize {
    summary
        .split(" files read")
        .next()
        .and_then(|head| head.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no file count in {summary:?}"))
}

#[test]
fn merges_stored_profiles_by_pid_service_and_process_and_diffs_two_windows() {
    let dir = tempfile::tempdir().expect("tempdir");
    let native = Workload::spawn(
        Command::new(compile_c("native_split.c", dir.path()).expect("compiles")).arg("30"),
    )
    .expect("starts");
    let pool = Workload::spawn(
        Command::new(compile_c("thread_pool.c", dir.path()).expect("compiles")).arg("30"),
    )
    .expect("starts");
    let out = dir.path().join("profiles");
    let (native_pid, pool_pid) = (native.pid().to_string(), pool.pid().to_string());
    let output = run_daemon(
        &[
            "--pid",
            &native_pid,
            "--pid",
            &pool_pid,
            "--frequency",
            "99",
            "--interval",
            "1",
            "--duration",
            "5",
            "--grpc-listen",
            "off",
            "--output",
            out.to_str().expect("utf-8"),
        ],
        Duration::from_secs(60),
    )
    .expect("daemon runs");
    assert!(output.status.success(), "daemon failed");
    let dir_arg = out.to_str().expect("utf-8");

    // The daemon's file names carry the service, which is what --service selects by.
    let mut native_starts = Vec::new();
    for entry in std::fs::read_dir(&out).expect("output") {
        let name = entry.expect("entry").file_name();
        let name = name.to_str().expect("utf-8");
        if let Some(parsed) = ProfileFileName::parse(name) {
            let service = parsed.service_name().expect("a service in the name");
            assert!(
                ["native_split", "thread_pool"].contains(&service.as_ref()),
                "{name}"
            );
            if parsed.pid == native.pid() {
                native_starts.push(parsed.start);
            }
        }
    }
    native_starts.sort();
    assert!(native_starts.len() >= 4, "{native_starts:?}");

    let svg = dir.path().join("view.svg");
    let (summary, by_pid) = view(&["--dir", dir_arg, "--pid", &native_pid], &svg);
    assert!(by_pid.contains("main") && by_pid.contains("hot_a"));
    assert!(!by_pid.contains("pool_task"), "only the pid asked for");
    assert_eq!(files_read(&summary), native_starts.len());

    let (_, by_service) = view(
        &["--dir", dir_arg, "--service", "thread_pool", "--from", "1h"],
        &svg,
    );
    assert!(by_service.contains("pool_task") && !by_service.contains("hot_a"));
    assert!(
        !by_service.contains("pool-worker"),
        "threads merged by default"
    );

    let (_, by_process) = view(
        &[
            "--dir",
            dir_arg,
            "--process",
            "thread_pool",
            "--threads",
            "pool",
        ],
        &svg,
    );
    assert!(by_process.contains("[pool-worker-*]") && !by_process.contains("hot_b"));

    // Everything: both programs in one picture, each under its service.
    let (_, host) = view(&["--dir", dir_arg], &svg);
    assert!(host.contains("hot_a") && host.contains("pool_task"));
    for root in ["<title>[native_split] (", "<title>[thread_pool] ("] {
        assert!(host.contains(root), "{root} roots its process's stacks");
    }

    // The second half of the run against the first.
    let middle = native_starts[native_starts.len() / 2];
    let (first, middle) = (
        humantime::format_rfc3339_seconds(native_starts[0]).to_string(),
        humantime::format_rfc3339_seconds(middle).to_string(),
    );
    let diff_svg = dir.path().join("diff.svg");
    let (summary, diff) = view(
        &[
            "--dir",
            dir_arg,
            "--pid",
            &native_pid,
            "--from",
            &middle,
            "--before-from",
            &first,
        ],
        &diff_svg,
    );
    assert!(summary.contains("before:"), "{summary}");
    // native_split's `main` is in every one of its samples, of both windows.
    assert!(diff.contains("CPU change") && diff.contains("main"));
    // Each frame's title gives its change: `; +1.23%)`, `; -0.40%)` or `; 0.00%)`.
    assert!(
        diff.contains("%; +") || diff.contains("%; -") || diff.contains("%; 0.00%"),
        "differential titles"
    );

    // An empty selection is an error that says what is there.
    let output = Command::new(daemon_binary())
        .args(["view", "--dir", dir_arg, "--service", "nobody", "-o"])
        .arg(&svg)
        .output()
        .expect("view runs");
    let message = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success() && message.contains("no cpu profile"),
        "{message}"
    );
}
