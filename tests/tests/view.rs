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

/// The retention policy on a directory the daemon finds with files in it: its own profiles past
/// the age go at the first interval's end, then the oldest past the byte budget as it writes;
/// a file that is not one of its profiles stays, however old.
#[test]
fn retention_deletes_old_profiles_then_the_oldest_past_the_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let busy = Workload::spawn(
        Command::new(compile_c("native_split.c", dir.path()).expect("compiles")).arg("30"),
    )
    .expect("starts");
    let out = dir.path().join("profiles");
    std::fs::create_dir(&out).expect("creates the output directory");
    let aged = |name: &str, bytes: usize, age: Duration| {
        let path = out.join(name);
        std::fs::write(&path, vec![0u8; bytes]).expect("writes");
        std::fs::File::options()
            .write(true)
            .open(&path)
            .expect("opens")
            .set_modified(std::time::SystemTime::now() - age)
            .expect("sets its time");
    };
    let day = Duration::from_secs(24 * 3600);
    aged("cpu-20261101T000000Z-1-old.pb.gz", 1000, 2 * day);
    aged("cpu-20261101T000000Z-1-old.svg", 1000, 2 * day);
    aged("notes.txt", 1000, 30 * day);
    // Recent, but the oldest of the daemon's files: the first to go past the budget.
    aged(
        "cpu-20261201T000000Z-2-recent.pb.gz",
        100_000,
        Duration::from_secs(3600),
    );
    let budget = 150_000u64;
    let config = dir.path().join("retention.toml");
    std::fs::write(
        &config,
        // Flame graphs too (off by default): the budget counts them with the pprof files.
        format!(
            "flame_graphs = true\nretention_max_age_secs = 86400\nretention_max_bytes = {budget}\n"
        ),
    )
    .expect("writes the config");

    let finished = DaemonRun::new()
        .pid(busy.pid())
        .frequency(499)
        .interval(1)
        .duration(6)
        .no_stream()
        .config(&config)
        .output(&out)
        .run(Duration::from_secs(60));

    let names: Vec<String> = std::fs::read_dir(&out)
        .expect("lists")
        .map(|entry| {
            entry
                .expect("entry")
                .file_name()
                .into_string()
                .expect("utf-8")
        })
        .collect();
    let ours: Vec<&String> = names
        .iter()
        .filter(|name| ProfileFileName::parse(name).is_some() || name.ends_with(".svg"))
        .collect();
    let bytes: u64 = ours
        .iter()
        .map(|name| std::fs::metadata(out.join(name)).expect("stat").len())
        .sum();
    eprintln!("left: {names:?} ({bytes} bytes of profiles)");
    assert!(
        names.contains(&"notes.txt".to_owned()),
        "a file not ours was deleted"
    );
    assert!(
        !names.iter().any(|name| name.contains("-old.")),
        "profiles past the age were kept: {names:?}"
    );
    assert!(
        !names.iter().any(|name| name.contains("-recent.")),
        "the oldest profile was kept past the byte budget: {names:?}"
    );
    assert!(
        finished.log.contains("retention: old profiles deleted"),
        "no deletion logged: {}",
        finished.log
    );
    // The budget holds after each interval's files are written; the daemon's last interval
    // (written as it stops) may add a pprof file and a flame graph.
    let newest_interval: u64 = ours
        .iter()
        .filter(|name| name.contains(&format!("-{}-", busy.pid())))
        .map(|name| std::fs::metadata(out.join(name)).expect("stat").len())
        .max()
        .unwrap_or(0);
    assert!(
        bytes <= budget + 2 * newest_interval,
        "{bytes} bytes of profiles left, budget {budget}"
    );
    assert!(
        ours.len() >= 2,
        "the newest profiles were deleted too: {names:?}"
    );
}
