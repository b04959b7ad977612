//! Off-CPU profiles end to end: a JVM whose threads run, sleep, wait for a monitor and wait for
//! a socket, each measuring its own wall time, CPU time and run-queue delay; the daemon's
//! `offcpu-*` profiles must put each waiting thread's blocked time (wall - CPU - run-queue
//! delay) under its waiting method within 10%, with complete Java stacks, and next to nothing
//! under the thread that only runs. Also: `go tool pprof` reads the files, Pyroscope gets
//! `off_cpu` profiles, and a JVM that exits with threads off CPU leaves no per-thread state
//! (task storage, counted by the daemon) and no open wait unjoined.
//!
//! JDK 17 and 25 are asserted; `PROFILER_OFF_CPU_JDKS=11,17,21,25` runs (and asserts) others.

use std::collections::HashMap;
use std::io::BufRead as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_daemon::pprof::proto;
use profiler_tests::receiver::{recorded_pushes, Receiver};
use profiler_tests::*;

/// Seconds the workload's threads run.
const WORKLOAD_SECS: &str = "15";

/// What one thread of the workload measured of itself.
#[derive(Debug)]
struct Truth {
    name: String,
    tid: u32,
    wall_ns: i64,
    cpu_ns: i64,
    runqueue_ns: i64,
}

impl Truth {
    fn blocked_ns(&self) -> i64 {
        self.wall_ns - self.cpu_ns - self.runqueue_ns
    }
}

/// Per thread, from the off-CPU profiles: blocked time in all, blocked time under `method`,
/// sampled waits, and those whose stack reaches `Thread.run`.
#[derive(Debug, Default)]
struct Measured {
    blocked_ns: i64,
    blocked_under_method_ns: i64,
    runqueue_ns: i64,
    waits: i64,
    rooted_waits: i64,
    /// Waits whose stack does not reach `Thread.run`, by their innermost frames.
    unrooted: HashMap<String, i64>,
    /// Blocked time by the `java_state` label.
    by_java_state: HashMap<String, i64>,
}

impl Measured {
    /// The Java state most of the blocked time was spent in.
    fn main_java_state(&self) -> &str {
        self.by_java_state
            .iter()
            .max_by_key(|(_, ns)| **ns)
            .map_or("none", |(state, _)| state.as_str())
    }
}

/// Where each waiting thread waits, as the JVM says.
fn expected_java_state(thread: &str) -> &'static str {
    match thread {
        // Sockets are read in native code (JNI).
        "offcpu-reader" => "in_native",
        // Waiting for the monitor the holder keeps: the JVM records the monitor it waits for.
        "offcpu-blocked" => "monitor_enter",
        _ => "blocked",
    }
}

/// Each thread's waiting method (the workload's loop it waits in).
fn waiting_method(thread: &str) -> &'static str {
    match thread {
        "offcpu-spinner" => "OffCpu.spinLoop",
        "offcpu-sleeper" => "OffCpu.sleepLoop",
        "offcpu-blocked" => "OffCpu.blockedLoop",
        "offcpu-reader" => "OffCpu.readLoop",
        other => panic!("unknown thread {other}"),
    }
}

/// The `offcpu-*` profiles of `pid` in `dir`.
fn off_cpu_profiles(dir: &Path, pid: u32) -> Vec<(PathBuf, proto::Profile)> {
    profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("offcpu-"))
        })
        .collect()
}

fn value_index(profile: &proto::Profile, kind: &str) -> usize {
    profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.r#type as usize] == kind)
        .unwrap_or_else(|| panic!("no {kind} sample type"))
}

fn measure(profiles: &[(PathBuf, proto::Profile)], truths: &[Truth]) -> HashMap<u32, Measured> {
    let mut measured: HashMap<u32, Measured> = HashMap::new();
    for (_, profile) in profiles {
        let (blocked, runqueue, samples) = (
            value_index(profile, "off_cpu"),
            value_index(profile, "runqueue"),
            value_index(profile, "samples"),
        );
        for sample in &profile.sample {
            let Some(tid) = num_label(profile, sample, "thread_id") else {
                continue;
            };
            let Some(truth) = truths.iter().find(|t| t.tid as i64 == tid) else {
                continue;
            };
            let frames = sample_frames(profile, sample);
            let has = |method: &str| frames.iter().any(|f| base_name(&f.name) == method);
            let entry = measured.entry(truth.tid).or_default();
            entry.blocked_ns += sample.value[blocked];
            entry.runqueue_ns += sample.value[runqueue];
            *entry
                .by_java_state
                .entry(
                    label(profile, sample, "java_state")
                        .unwrap_or("none")
                        .to_owned(),
                )
                .or_default() += sample.value[blocked];
            entry.waits += sample.value[samples];
            if has(waiting_method(&truth.name)) {
                entry.blocked_under_method_ns += sample.value[blocked];
            }
            if has("java.lang.Thread.run") {
                entry.rooted_waits += sample.value[samples];
            } else {
                let signature: Vec<&str> = frames
                    .iter()
                    .filter(|f| !f.name.ends_with("_[k]"))
                    .map(|f| f.name.as_str())
                    .collect();
                *entry.unrooted.entry(signature.join(";")).or_default() += sample.value[samples];
            }
        }
    }
    measured
}

/// The type of the daemon's (newest) `OFF_CPU_THREADS` map, as bpftool names it.
fn off_cpu_map_type() -> String {
    let maps = Command::new("bpftool")
        .args(["map", "show", "--json"])
        .output()
        .expect("bpftool runs (cargo xtask test installs it)");
    let maps: serde_json::Value = serde_json::from_slice(&maps.stdout).expect("bpftool's JSON");
    maps.as_array()
        .expect("a list of maps")
        .iter()
        .filter(|m| m["name"] == "OFF_CPU_THREADS")
        .max_by_key(|m| m["id"].as_u64())
        .and_then(|m| m["type"].as_str())
        .expect("the daemon's OFF_CPU_THREADS map")
        .to_owned()
}

/// Runs the workload on `jdk` to its end; returns its pid, each thread's truth, and the
/// daemon's count of threads it tracks while the workload's threads ran.
fn run_workload(jdk: &Jdk, classes: &Path, metrics: SocketAddr) -> (u32, Vec<Truth>, u64) {
    let mut child = Command::new(&jdk.java)
        .arg("-cp")
        .arg(classes)
        .args(["OffCpu", WORKLOAD_SECS])
        .stdout(Stdio::piped())
        .spawn()
        .expect("JVM starts");
    let pid = child.id();
    let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut truths = Vec::new();
    let mut tracked = 0;
    for line in stdout.lines() {
        let line = line.expect("workload output");
        if line == "ready" {
            // Its threads start 3 s after "ready" (its output waits in the pipe meanwhile).
            std::thread::sleep(Duration::from_secs(5));
            tracked = off_cpu_threads(metrics);
        }
        let fields: Vec<&str> = line.split_whitespace().collect();
        if fields.first() == Some(&"result") && fields.len() == 6 {
            truths.push(Truth {
                name: fields[1].to_owned(),
                tid: fields[2].parse().expect("tid"),
                wall_ns: fields[3].parse().expect("wall"),
                cpu_ns: fields[4].parse().expect("cpu"),
                runqueue_ns: fields[5].parse().expect("run-queue delay"),
            });
        }
    }
    assert!(
        child.wait().expect("JVM exits").success(),
        "JDK {} workload failed",
        jdk.major
    );
    assert_eq!(truths.len(), 4, "JDK {}: every thread reports", jdk.major);
    (pid, truths, tracked)
}

fn asserted_jdks() -> Vec<Jdk> {
    let wanted = majors_from_env("PROFILER_OFF_CPU_JDKS", &[17, 25]);
    jdks()
        .into_iter()
        .filter(|jdk| wanted.contains(&jdk.major))
        .collect()
}

fn off_cpu_threads(metrics: SocketAddr) -> u64 {
    let text = scrape_metrics(metrics).expect("metrics");
    metric_value(&text, profiler_common::metric::OFF_CPU_THREADS).expect("off-CPU threads metric")
}

#[test]
fn off_cpu_time_lands_on_the_waiting_method() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["OffCpu.java"], dir.path()).expect("javac");
    let out = dir.path().join("profiles");
    let receiver = Receiver::start(0, &dir.path().join("received"), &[]).expect("receiver");
    let metrics = free_local_address().expect("port");
    let daemon = DaemonRun::new()
        .arg("--off-cpu")
        .frequency(99)
        .interval(5)
        .output(&out)
        .pyroscope(&receiver.url())
        .metrics(metrics)
        .start(dir.path());
    daemon
        .wait_for_log("off-CPU interval sampled", Duration::from_secs(60))
        .expect("the daemon samples off-CPU time");
    // The metrics are published at the loop's next wake-up after the interval.
    std::thread::sleep(Duration::from_secs(2));
    let threads_before = off_cpu_threads(metrics);

    let mut runs = Vec::new();
    let mut tracked = Vec::new();
    for jdk in asserted_jdks() {
        let (pid, truths, threads) = run_workload(&jdk, &classes, metrics);
        tracked.push((jdk.major, threads));
        runs.push((jdk.major, pid, truths));
    }
    let map_type = off_cpu_map_type();
    // Two intervals: every wait has ended and been written.
    std::thread::sleep(Duration::from_secs(11));
    let threads_after = off_cpu_threads(metrics);
    let text = scrape_metrics(metrics).expect("metrics");
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed:\n{log}");

    let mut failures = Vec::new();
    for (major, pid, truths) in &runs {
        let profiles = off_cpu_profiles(&out, *pid);
        assert!(!profiles.is_empty(), "JDK {major}: no off-CPU profile");
        let mut measured = measure(&profiles, truths);
        for truth in truths {
            let got = measured.remove(&truth.tid).unwrap_or_default();
            let expected = truth.blocked_ns();
            let under = got.blocked_under_method_ns as f64 / expected.max(1) as f64;
            let rooted = got.rooted_waits as f64 / got.waits.max(1) as f64;
            println!(
                "JDK {major} {:<15} wall {:>6} ms cpu {:>6} ms run-queue {:>5} ms (ours {:>5} ms) \
                 blocked {:>6} ms; ours {:>6} ms, under {} {:>5.1}%; waits {:>5}, rooted {:>5.1}%, \
                 mostly {}",
                truth.name,
                truth.wall_ns / 1_000_000,
                truth.cpu_ns / 1_000_000,
                truth.runqueue_ns / 1_000_000,
                got.runqueue_ns / 1_000_000,
                expected / 1_000_000,
                got.blocked_ns / 1_000_000,
                waiting_method(&truth.name),
                under * 100.0,
                got.waits,
                rooted * 100.0,
                got.main_java_state()
            );
            if truth.name == "offcpu-spinner" {
                // Only preempted: no blocked time to speak of.
                if got.blocked_ns > truth.wall_ns / 20 {
                    failures.push(format!(
                        "JDK {major}: the spinning thread shows {} ms blocked of {} ms",
                        got.blocked_ns / 1_000_000,
                        truth.wall_ns / 1_000_000
                    ));
                }
                continue;
            }
            if !(0.9..=1.1).contains(&under) {
                failures.push(format!(
                    "JDK {major}: {} blocked {} ms under {}, truth {} ms",
                    truth.name,
                    got.blocked_under_method_ns / 1_000_000,
                    waiting_method(&truth.name),
                    expected / 1_000_000
                ));
            }
            let mut unrooted: Vec<_> = got.unrooted.iter().collect();
            unrooted.sort_by_key(|(_, n)| -**n);
            for (signature, n) in unrooted.iter().take(3) {
                println!("    {n} waits not rooted: {signature}");
            }
            if got.main_java_state() != expected_java_state(&truth.name) {
                failures.push(format!(
                    "JDK {major}: {} waits mostly {} ({:?}), expected {}",
                    truth.name,
                    got.main_java_state(),
                    got.by_java_state,
                    expected_java_state(&truth.name)
                ));
            }
            if rooted < 0.95 {
                failures.push(format!(
                    "JDK {major}: {} has {:.1}% of its waits rooted at Thread.run",
                    truth.name,
                    rooted * 100.0
                ));
            }
        }
    }

    // The reference reader takes the files and their sample types.
    let (_, pid, _) = &runs[0];
    let (path, _) = off_cpu_profiles(&out, *pid)
        .into_iter()
        .next()
        .expect("a profile");
    let top = go_pprof_top(&path).expect("go tool pprof reads it");
    assert!(
        top.contains("off_cpu"),
        "pprof shows the off_cpu type:\n{top}"
    );

    // Pyroscope gets them as `off_cpu` profiles whose sample type is off_cpu/nanoseconds.
    let pushes = recorded_pushes(&receiver.record_dir).expect("records");
    let off_cpu_series: Vec<_> = pushes
        .iter()
        .flat_map(|push| &push.series)
        .filter(|series| series.label("__name__") == Some("off_cpu"))
        .collect();
    assert!(!off_cpu_series.is_empty(), "no off_cpu series pushed");
    let raw = std::fs::read(&off_cpu_series[0].profiles[0]).expect("raw profile");
    let pushed = profiler_daemon::pprof::decode(&raw).expect("pushed profile decodes");
    let first_type = &pushed.sample_type[0];
    assert_eq!(
        (
            pushed.string_table[first_type.r#type as usize].as_str(),
            pushed.string_table[first_type.unit as usize].as_str()
        ),
        ("off_cpu", "nanoseconds")
    );
    assert!(pushes
        .iter()
        .flat_map(|push| &push.series)
        .any(|series| series.label("__name__") == Some("process_cpu")));

    // JVMs that exited with threads off CPU (the holder and answerer sleep and read till the
    // end) leave nothing behind: their threads' state went with them.
    println!(
        "off-CPU threads tracked on the host: {threads_before} before the JVMs, {threads_after} after"
    );
    // Per-thread state is task storage, which the kernel frees with each thread.
    assert_eq!(map_type, "task_storage");
    for (major, running) in tracked {
        println!("JDK {major}: {running} threads tracked while its threads ran");
        assert!(
            running >= threads_before + 15,
            "JDK {major}: the JVM's threads are tracked while it runs"
        );
    }
    // The host's own threads come and go meanwhile (kernel workers, the receiver's and the
    // daemon's pools: up to about 10 here); two JVMs' threads would be over 50.
    assert!(
        threads_after <= threads_before + 20,
        "threads of exited JVMs still counted: {threads_before} before, {threads_after} after"
    );
    let unmatched = metric_value(
        &text,
        &labelled(
            profiler_common::metric::OFF_CPU_WAITS_NOT_PROFILED,
            "reason",
            "unmatched_end",
        ),
    )
    .unwrap_or(0);
    let waits = metric_value(&text, profiler_common::metric::OFF_CPU_WAITS).unwrap_or(0);
    println!("off-CPU waits joined: {waits}, ends without their stack: {unmatched}");
    assert!(waits > 0);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
