//! End to end on export: the daemon pushes to a gRPC receiver that shares no code with it
//! (Python grpcio, stubs generated from our .proto files), exports OTLP profiles to a receiver
//! built on the official OTLP stubs, survives outages and bad endpoints, and streams profiles
//! live to subscribers. Exported profiles carry no sample labels (a string
//! one would split Pyroscope series); their stacks are merged across threads by default, rooted
//! at their thread pool with `threads = "pool"` (a 32-thread pool is one root) or at their
//! thread with `threads = "thread"`. Local files keep each sample's thread, with the full Java
//! name the sidecar agent reported.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use profiler_daemon::pprof::{decode, proto};
use profiler_tests::receiver::{check_otlp_protos, recorded_exports, recorded_pushes, Receiver};
use profiler_tests::*;

fn path_str(path: &Path) -> &str {
    path.to_str().expect("utf-8 path")
}

/// The run of the export tests: one 49 Hz, 1 s-interval profile of `pid` exported to `url`,
/// written locally to `out`, no live stream.
fn export_run(config: &Path, url: &str, pid: u32, out: &Path) -> DaemonRun {
    DaemonRun::new()
        .config(config)
        .pyroscope(url)
        .pid(pid)
        .frequency(49)
        .interval(1)
        .no_stream()
        .output(out)
}

/// The native workload (70% hot_a, 30% hot_b), running for `secs`.
fn native_workload(dir: &Path, secs: u32) -> Workload {
    let binary = dir.join("native_split");
    if !binary.exists() {
        compile_c("native_split.c", dir).expect("compiles");
    }
    Workload::spawn(Command::new(binary).arg(secs.to_string())).expect("starts")
}

/// Every raw profile the receiver got for processes of `service`, in arrival order, decoded.
fn received_profiles(record_dir: &Path, service: &str) -> Vec<(PathBuf, proto::Profile)> {
    let mut profiles = Vec::new();
    for push in recorded_pushes(record_dir).expect("records readable") {
        for series in push.series {
            if series.label("service_name") != Some(service) {
                continue;
            }
            for path in series.profiles {
                let bytes = std::fs::read(&path).expect("raw profile readable");
                assert!(
                    bytes.starts_with(&[0x1f, 0x8b]),
                    "raw_profile is gzipped: {}",
                    path.display()
                );
                let profile = decode(&bytes).expect("raw_profile is a pprof profile");
                profiles.push((path, profile));
            }
        }
    }
    profiles
}

/// Interval start times (`time_nanos`) of profiles, in the order given.
fn start_times(profiles: &[(PathBuf, proto::Profile)]) -> Vec<i64> {
    profiles.iter().map(|(_, p)| p.time_nanos).collect()
}

/// A pool thread's Java name, longer than the kernel's 15 bytes (`http-nio-8080-e`).
const POOL_THREAD: &str = "http-nio-8080-exec-12";

/// The name of a sample's outermost frame.
fn root_frame(profile: &proto::Profile, sample: &proto::Sample) -> String {
    sample_frames(profile, sample)
        .pop()
        .map(|frame| frame.name)
        .unwrap_or_default()
}

/// Checks that no sample of `profiles` has a label; returns root frame -> samples.
fn exported_roots(
    profiles: &[(PathBuf, proto::Profile)],
) -> std::collections::BTreeMap<String, i64> {
    let mut roots = std::collections::BTreeMap::new();
    for (path, profile) in profiles {
        for sample in &profile.sample {
            assert!(
                sample.label.is_empty(),
                "{}: exported samples carry no labels",
                path.display()
            );
            *roots.entry(root_frame(profile, sample)).or_insert(0) += count(sample);
        }
    }
    roots
}

/// The thread names local samples are labelled with.
fn local_thread_names(
    profiles: &[(PathBuf, proto::Profile)],
) -> std::collections::BTreeSet<String> {
    profiles
        .iter()
        .flat_map(|(_, profile)| {
            profile
                .sample
                .iter()
                .filter_map(|sample| label(profile, sample, "thread_name").map(str::to_owned))
        })
        .collect()
}

/// Checks that no root of `roots` names one of `threads` (merged: no thread frame).
fn assert_merged(
    roots: &std::collections::BTreeMap<String, i64>,
    threads: &std::collections::BTreeSet<String>,
) {
    assert!(!threads.is_empty(), "local samples name their threads");
    for root in roots.keys() {
        assert!(
            !threads
                .iter()
                .any(|thread| root.starts_with(&format!("[{thread}"))),
            "merged by default, but {root:?} roots a stack ({threads:?})"
        );
    }
}

/// The `name=value` fields of the daemon's "export totals" log line of the Pyroscope sink.
fn export_totals(log: &str) -> std::collections::HashMap<String, u64> {
    sink_totals(log, "pyroscope")
}

/// The `name=value` fields of the daemon's "export totals" log line of `sink`.
fn sink_totals(log: &str, sink: &str) -> std::collections::HashMap<String, u64> {
    let sink_field = format!("sink=\"{sink}\"");
    let line = log
        .lines()
        .rev()
        .find(|line| line.contains("export totals") && line.contains(&sink_field))
        .expect("the daemon logs its export totals");
    line.split_whitespace()
        .filter_map(|field| {
            let (name, value) = field.split_once('=')?;
            Some((name.to_owned(), value.parse().ok()?))
        })
        .collect()
}

#[test]
fn pushes_labelled_pprof_to_a_grpc_receiver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let native = native_workload(dir.path(), 60);
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    // The agent loaded at start sees the worker thread start, and reports its full name.
    let agent = format!("-agentpath:{}", agent_library().display());
    let thread_name = format!("-Dspin.thread={POOL_THREAD}");
    let java = start_java(&jdk, &classes, "Spin", &[&agent, &thread_name]).expect("JVM starts");
    let receiver = Receiver::start(0, &dir.path().join("received"), &[]).expect("receiver");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[labels]\nenv = \"test\"\n\n[pyroscope]\ntenant_id = \"team-a\"\nusername = \"42\"\npassword = \"secret\"\n",
    )
    .expect("config written");
    let out = dir.path().join("profiles");
    let (native_pid, java_pid) = (native.pid().to_string(), java.pid().to_string());
    let output = run_daemon(
        &[
            "--config",
            path_str(&config),
            "--pyroscope",
            &receiver.url(),
            "--pid",
            &native_pid,
            "--pid",
            &java_pid,
            "--frequency",
            "99",
            "--interval",
            "2",
            "--duration",
            "7",
            "--grpc-listen",
            "off",
            "--output",
            path_str(&out),
        ],
        Duration::from_secs(60),
    )
    .expect("daemon runs");
    assert!(output.status.success(), "daemon failed: {output:?}");

    let pushes = recorded_pushes(&receiver.record_dir).expect("records");
    assert!(!pushes.is_empty(), "nothing received");
    for push in &pushes {
        assert_eq!(
            push.headers.get("x-scope-orgid").and_then(|v| v.as_str()),
            Some("team-a")
        );
        // base64("42:secret")
        assert_eq!(
            push.headers.get("authorization").and_then(|v| v.as_str()),
            Some("Basic NDI6c2VjcmV0")
        );
        for series in &push.series {
            assert_eq!(series.label("__name__"), Some("process_cpu"));
            assert_eq!(series.label("env"), Some("test"));
        }
    }

    // The native program is named after its executable, the JVM after its main class.
    let native_profiles = received_profiles(&receiver.record_dir, "native_split");
    let java_profiles = received_profiles(&receiver.record_dir, "Spin");
    let local_native = profiles_of(&out, native.pid()).expect("local profiles");
    let local_java = profiles_of(&out, java.pid()).expect("local profiles");
    eprintln!(
        "received {} native and {} Java profiles in {} requests; {} and {} written locally",
        native_profiles.len(),
        java_profiles.len(),
        pushes.len(),
        local_native.len(),
        local_java.len()
    );
    assert_eq!(
        start_times(&native_profiles),
        start_times(&local_native),
        "every interval's profile is exported, in order"
    );
    assert_eq!(start_times(&java_profiles), start_times(&local_java));

    // The reference pprof reader takes what the receiver got, and sees the workload's hot spots.
    let (path, _) = native_profiles.last().expect("a native profile");
    let top = go_pprof_top(path).expect("go tool pprof reads the received profile");
    assert!(top.contains("hot_a"), "{top}");
    let java_names = frame_names(&java_profiles);
    assert!(
        java_names.iter().any(|name| name.contains("Spin.")),
        "Java frames named in the exported profile"
    );

    // Threads: merged in what is exported (no thread frame, no label); each local sample
    // labelled with its thread, the pool thread by its full Java name.
    let native_roots = exported_roots(&native_profiles);
    let java_roots = exported_roots(&java_profiles);
    eprintln!("exported roots: native {native_roots:?}, Java {java_roots:?}");
    assert_merged(&native_roots, &local_thread_names(&local_native));
    assert_merged(&java_roots, &local_thread_names(&local_java));
    let (mut full, mut by_comm) = (0, 0);
    let mut pool_tids = std::collections::BTreeSet::new();
    for (_, profile) in &local_java {
        for sample in &profile.sample {
            let name = label(profile, sample, "thread_name");
            let tid = num_label(profile, sample, "thread_id");
            assert!(
                label(profile, sample, "pid") == Some(java_pid.as_str())
                    && label(profile, sample, "comm").is_some()
                    && name.is_some()
                    && tid.is_some(),
                "local samples keep pid, comm, thread_name and add thread_id"
            );
            if name == Some(POOL_THREAD) {
                assert_eq!(
                    label(profile, sample, "thread_name_source"),
                    Some("sidecar")
                );
                pool_tids.extend(tid);
                full += count(sample);
            } else if name == Some(&POOL_THREAD[..15]) {
                assert_eq!(label(profile, sample, "thread_name_source"), Some("comm"));
                by_comm += count(sample);
            }
        }
    }
    let [pool_tid] = pool_tids.iter().copied().collect::<Vec<_>>()[..] else {
        panic!("one {POOL_THREAD} thread in the local labels: {pool_tids:?}")
    };
    assert!(
        Path::new(&format!("/proc/{}/task/{pool_tid}", java.pid())).exists(),
        "the label's tid {pool_tid} is a thread of the JVM"
    );
    println!(
        "{POOL_THREAD} (tid {pool_tid}): locally {full} samples with the sidecar's name, \
         {by_comm} with comm"
    );
    assert!(full > 0, "the pool thread is named in full");
}

/// The 32-thread pool workload (`pool-worker-0` to `-31`, in `pool_task`), running for `secs`.
fn thread_pool_workload(dir: &Path, secs: u32) -> Workload {
    let binary = compile_c("thread_pool.c", dir).expect("compiles");
    Workload::spawn(Command::new(binary).arg(secs.to_string())).expect("starts")
}

#[test]
fn a_thread_pool_is_one_root_when_asked_and_merged_by_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = thread_pool_workload(dir.path(), 60);
    let config = dir.path().join("config.toml");
    // Local flame graphs too: they show threads as the same setting says.
    std::fs::write(
        &config,
        "flame_graphs = true\n[pyroscope]\nshutdown_grace_secs = 5\n",
    )
    .expect("config written");
    for threads in ["merged", "pool"] {
        let record_dir = dir.path().join(format!("received-{threads}"));
        let receiver = Receiver::start(0, &record_dir, &[]).expect("receiver");
        let out = dir.path().join(threads);
        let mut daemon = export_run(&config, &receiver.url(), pool.pid(), &out).duration(3);
        if threads != "merged" {
            daemon = daemon.arg("--threads").arg(threads);
        }
        daemon.run(Duration::from_secs(60));
        drop(receiver);

        let local = profiles_of(&out, pool.pid()).expect("local profiles");
        let thread_names = local_thread_names(&local);
        let exported = received_profiles(&record_dir, "thread_pool");
        let roots = exported_roots(&exported);
        let (local_samples, exported_samples) = (
            local.iter().map(|(_, p)| p.sample.len()).sum::<usize>(),
            exported.iter().map(|(_, p)| p.sample.len()).sum::<usize>(),
        );
        eprintln!(
            "{threads}: {} threads sampled, {local_samples} local samples (stack, thread), \
             {exported_samples} exported; roots {roots:?}",
            thread_names.len()
        );
        assert!(
            thread_names.len() >= 8
                && thread_names
                    .iter()
                    .all(|name| name.starts_with("pool-worker-")),
            "local samples keep each pool thread: {thread_names:?}"
        );
        assert!(
            frame_names(&exported)
                .iter()
                .any(|name| name.contains("pool_task")),
            "{threads}: the pool's work is exported"
        );
        let svgs: Vec<String> = std::fs::read_dir(&out)
            .expect("output")
            .filter_map(|entry| {
                let path = entry.ok()?.path();
                (path.extension()? == "svg").then(|| std::fs::read_to_string(path).ok())?
            })
            .collect();
        assert!(!svgs.is_empty(), "{threads}: local flame graphs drawn");
        if threads == "merged" {
            assert_merged(&roots, &thread_names);
            assert!(
                exported_samples < local_samples,
                "threads merged: fewer samples than (stack, thread) pairs"
            );
            assert!(svgs.iter().all(|svg| !svg.contains("pool-worker")));
        } else {
            assert_eq!(
                roots.keys().collect::<Vec<_>>(),
                vec!["[pool-worker-*]"],
                "one root for the whole pool"
            );
            assert!(svgs.iter().all(|svg| svg.contains("[pool-worker-*]")));
        }
    }
}

#[test]
fn an_outage_delays_profiles_without_losing_reordering_or_duplicating_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = native_workload(dir.path(), 120);
    let record_dir = dir.path().join("received");
    let receiver = Receiver::start(0, &record_dir, &[]).expect("receiver");
    let port = receiver.port;
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "threads = \"thread\"\n[pyroscope]\nmax_backoff_secs = 2\nshutdown_grace_secs = 10\n",
    )
    .expect("config written");
    let out = dir.path().join("profiles");
    let pid = workload.pid();
    let daemon = export_run(&config, &receiver.url(), pid, &out).start(dir.path());
    daemon
        .wait_for_log("interval written", Duration::from_secs(30))
        .expect("daemon profiles");
    std::thread::sleep(Duration::from_secs(3));

    receiver.kill();
    // Seven or more retries at the 2 s backoff cap, 15 profiles queued.
    eprintln!("receiver down for 15 s");
    std::thread::sleep(Duration::from_secs(15));
    let receiver = Receiver::start(port, &record_dir, &[]).expect("receiver restarts");
    // Long enough for the backlog to drain (backoff is capped at 2 s) and a few live intervals.
    std::thread::sleep(Duration::from_secs(6));
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed");
    drop(receiver);

    let received_profiles = received_profiles(&record_dir, "native_split");
    // threads = "thread": each stack rooted at its thread, still no label.
    let mut rooted = 0;
    for (path, profile) in &received_profiles {
        for sample in &profile.sample {
            assert!(sample.label.is_empty(), "{}", path.display());
            assert_eq!(
                root_thread(profile, sample),
                Some(("native_split".to_string(), workload.pid()))
            );
            rooted += count(sample);
        }
    }
    eprintln!("threads = \"thread\": {rooted} samples under [native_split tid={pid}]");
    assert!(rooted > 0);
    let received = start_times(&received_profiles);
    let written = start_times(&profiles_of(&out, workload.pid()).expect("local profiles"));
    let totals = export_totals(&log);
    eprintln!(
        "written {} profiles, received {}; totals {totals:?}",
        written.len(),
        received.len()
    );
    assert!(
        written.len() >= 23,
        "one profile per second: {}",
        written.len()
    );
    assert_eq!(
        received, written,
        "every profile arrives once, in order, outage or not"
    );
    assert!(totals["retries"] > 0, "the outage was noticed");
    assert_eq!(totals["dropped_queue_full"], 0);
    assert_eq!(totals["dropped_at_shutdown"], 0);
}

#[test]
fn past_the_queue_bound_the_oldest_profiles_are_dropped_and_counted_exactly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = native_workload(dir.path(), 60);
    // Reserve a port, then leave it closed: the receiver only comes up later.
    let port = free_local_address().expect("free port").port();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[pyroscope]\nqueue_max_profiles = 3\nmax_backoff_secs = 1\nshutdown_grace_secs = 10\n",
    )
    .expect("config written");
    let out = dir.path().join("profiles");
    let record_dir = dir.path().join("received");
    let url = format!("http://127.0.0.1:{port}");
    let daemon = export_run(&config, &url, workload.pid(), &out).start(dir.path());
    daemon
        .wait_for_log("interval written", Duration::from_secs(30))
        .expect("daemon profiles");
    std::thread::sleep(Duration::from_secs(9));
    let receiver = Receiver::start(port, &record_dir, &[]).expect("receiver starts");
    std::thread::sleep(Duration::from_secs(4));
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed");
    drop(receiver);

    let received = start_times(&received_profiles(&record_dir, "native_split"));
    let written = start_times(&profiles_of(&out, workload.pid()).expect("local profiles"));
    let totals = export_totals(&log);
    eprintln!(
        "written {}, received {}, totals {totals:?}",
        written.len(),
        received.len()
    );
    let dropped = totals["dropped_queue_full"] as usize;
    assert!(dropped >= 5, "the bound was reached: {dropped} dropped");
    assert_eq!(totals["dropped_at_shutdown"], 0);
    assert_eq!(
        received.len() + dropped,
        written.len(),
        "drops are counted exactly"
    );
    // What arrived is a subsequence of what was written, in order, none twice.
    let mut remaining = written.iter();
    for time in &received {
        assert!(
            remaining.any(|w| w == time),
            "received {time} out of order or twice"
        );
    }
    // The newest profiles survive: the last one written is delivered.
    assert_eq!(received.last(), written.last());
}

#[test]
fn bad_endpoints_are_logged_and_counted_never_fatal() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = native_workload(dir.path(), 60);
    let refusing = Receiver::start(
        0,
        &dir.path().join("refusing"),
        &["--fail-with", "UNAUTHENTICATED"],
    )
    .expect("receiver");
    let plaintext = Receiver::start(0, &dir.path().join("plaintext"), &[]).expect("receiver");
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "[pyroscope]\nshutdown_grace_secs = 1\n").expect("config written");
    let cases = [
        // Nothing listens on port 1.
        ("refused", "http://127.0.0.1:1".to_string(), "Unavailable"),
        // TLS spoken to a plaintext HTTP/2 server.
        (
            "tls mismatch",
            format!("https://127.0.0.1:{}", plaintext.port),
            "TLS mismatch",
        ),
        ("401", refusing.url(), "check the [pyroscope] credentials"),
    ];
    for (case, url, expected) in cases {
        let out = dir.path().join(case.replace(' ', "-"));
        // The daemon must not fail: `run` asserts it exited successfully.
        let log = export_run(&config, &url, workload.pid(), &out)
            .duration(4)
            .run(Duration::from_secs(60))
            .log;
        assert!(log.contains(expected), "{case}: log lacks {expected:?}");
        let totals = export_totals(&log);
        let written = profiles_of(&out, workload.pid()).expect("local").len() as u64;
        assert!(totals["retries"] > 0, "{case}: failures counted");
        assert_eq!(totals["exported_profiles"], 0, "{case}");
        assert_eq!(
            totals["dropped_at_shutdown"], written,
            "{case}: every undelivered profile is counted"
        );
    }
    assert!(recorded_pushes(&dir.path().join("plaintext"))
        .expect("records")
        .is_empty());
}

#[test]
fn stream_subscribers_get_exactly_the_profiles_they_filter_for() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = native_workload(dir.path(), 60);
    let second = native_workload(dir.path(), 60);
    let port = free_local_address().expect("free port").port();
    let address = format!("127.0.0.1:{port}");
    let out = dir.path().join("profiles");
    let (first_pid, second_pid) = (first.pid().to_string(), second.pid().to_string());
    let daemon = DaemonRun::new()
        .pid(first.pid())
        .pid(second.pid())
        .frequency(49)
        .interval(1)
        .duration(8)
        .stream(&address)
        .output(&out)
        .start(dir.path());
    daemon
        .wait_for_log("serving the live profile stream", Duration::from_secs(30))
        .expect("stream served");
    let subscribe = |pid: &str, sink: &[&str]| {
        Command::new(daemon_binary())
            .args(["subscribe", &address, "--pid", pid])
            .args(sink)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("subscriber starts")
    };
    let (first_dir, second_dir) = (dir.path().join("first"), dir.path().join("second"));
    let first_sub = subscribe(&first_pid, &["--output", path_str(&first_dir)]);
    let second_sub = subscribe(&second_pid, &["--output", path_str(&second_dir)]);
    let top_sub = subscribe(&first_pid, &["--top", "3", "--count", "2"]);
    let (status, _) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success());
    // The daemon ends the streams when it stops: subscribers exit on their own.
    for (name, child) in [
        ("first", first_sub),
        ("second", second_sub),
        ("top", top_sub),
    ] {
        let output = child.wait_with_output().expect("subscriber exits");
        assert!(output.status.success(), "{name} subscriber failed");
        if name == "top" {
            let table = String::from_utf8_lossy(&output.stdout);
            eprintln!("{table}");
            assert_eq!(table.matches(" samples\n").count(), 2, "two profiles");
            assert!(table.contains("hot_a"), "{table}");
        }
    }

    for (sub_dir, pid, other) in [
        (&first_dir, first.pid(), second.pid()),
        (&second_dir, second.pid(), first.pid()),
    ] {
        let got = profiles_of(sub_dir, pid).expect("subscriber files");
        assert!(profiles_of(sub_dir, other).expect("readable").is_empty());
        let files = std::fs::read_dir(sub_dir).expect("dir").count();
        assert_eq!(files, got.len(), "only pid {pid}'s profiles");
        for (path, profile) in &got {
            for sample in &profile.sample {
                assert_eq!(
                    label(profile, sample, "pid"),
                    Some(pid.to_string().as_str()),
                    "{}",
                    path.display()
                );
                // The stream carries the local files' labels, thread_id included.
                assert_eq!(
                    num_label(profile, sample, "thread_id"),
                    Some(i64::from(pid))
                );
            }
        }
        let written = profiles_of(&out, pid).expect("local").len();
        eprintln!("pid {pid}: {} streamed, {written} written", got.len());
        // Subscribers connect a moment after the daemon starts: the first interval may pass.
        assert!(got.len() + 1 >= written && got.len() <= written && !got.is_empty());
    }
}

/// A CA and a server certificate for `localhost` and 127.0.0.1, made with openssl.
fn make_certificates(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let run = |args: &[&str]| {
        let status = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl {args:?}");
    };
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=profiler-test-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
        "-subj",
        "/CN=localhost",
    ]);
    std::fs::write(
        dir.join("san.cnf"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .expect("extension file");
    run(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "server.pem",
        "-days",
        "2",
        "-extfile",
        "san.cnf",
    ]);
    (
        dir.join("ca.pem"),
        dir.join("server.pem"),
        dir.join("server.key"),
    )
}

#[test]
fn tls_to_a_server_of_a_private_ca_needs_its_ca_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let workload = native_workload(dir.path(), 60);
    let (ca, cert, key) = make_certificates(dir.path());
    let record_dir = dir.path().join("received");
    let receiver = Receiver::start(
        0,
        &record_dir,
        &["--tls-cert", path_str(&cert), "--tls-key", path_str(&key)],
    )
    .expect("TLS receiver");
    let url = format!("https://localhost:{}", receiver.port);
    for (case, config_text) in [
        (
            "untrusted",
            "[pyroscope]\nshutdown_grace_secs = 1\n".to_string(),
        ),
        (
            "trusted",
            format!("[pyroscope]\nca_file = \"{}\"\n", path_str(&ca)),
        ),
    ] {
        let config = dir.path().join(format!("{case}.toml"));
        std::fs::write(&config, config_text).expect("config written");
        let out = dir.path().join(case);
        let log = export_run(&config, &url, workload.pid(), &out)
            .duration(3)
            .run(Duration::from_secs(60))
            .log;
        let totals = export_totals(&log);
        let written = profiles_of(&out, workload.pid()).expect("local").len() as u64;
        if case == "trusted" {
            assert_eq!(
                totals["exported_profiles"], written,
                "all delivered over TLS"
            );
        } else {
            assert!(log.contains("set [pyroscope] ca_file"), "untrusted: {log}");
            assert_eq!(totals["exported_profiles"], 0);
        }
    }
    assert!(!received_profiles(&record_dir, "native_split").is_empty());
}

#[test]
fn our_otlp_protos_are_the_official_ones() {
    let (report, matching) = check_otlp_protos().expect("the check runs");
    println!("{report}");
    assert!(
        matching,
        "our OTLP .proto files differ from opentelemetry-proto's:\n{report}"
    );
}

/// What the OTLP receiver got for one process: per profile start and sample type, the values'
/// total, and every frame name ("function|frame type") seen.
#[derive(Default)]
struct OtlpReceived {
    totals: std::collections::BTreeMap<(u64, String), i64>,
    frames: std::collections::BTreeSet<String>,
    /// How many times each profile start arrived (once per sample type).
    starts: std::collections::BTreeMap<u64, usize>,
    /// The files its frames are in, with their build-ids.
    mappings: std::collections::BTreeSet<(String, String)>,
}

fn otlp_received(records: &[serde_json::Value], pid: u32) -> OtlpReceived {
    let mut received = OtlpReceived::default();
    for record in records {
        for resource in record["resources"].as_array().expect("resources") {
            if resource["attributes"]["process.pid"].as_i64() != Some(i64::from(pid)) {
                continue;
            }
            for mapping in resource["mappings"].as_array().expect("mappings") {
                let field = |i: usize| mapping[i].as_str().expect("a string").to_owned();
                received.mappings.insert((field(0), field(1)));
            }
            for profile in resource["profiles"].as_array().expect("profiles") {
                let start = profile["time_unix_nano"].as_u64().expect("start");
                let sample_type = profile["sample_type"][0].as_str().expect("type").to_owned();
                *received.starts.entry(start).or_default() += 1;
                for stack in profile["stacks"].as_array().expect("stacks") {
                    *received
                        .totals
                        .entry((start, sample_type.clone()))
                        .or_default() += stack["value"].as_i64().expect("value");
                    for frame in stack["frames"].as_array().expect("frames") {
                        received
                            .frames
                            .insert(frame.as_str().expect("name").to_owned());
                    }
                }
            }
        }
    }
    received
}

/// The local profiles' totals per start and sample type, as `OtlpReceived::totals`, and how
/// many sample types each start has (CPU and off-CPU profiles of an interval share it).
fn local_totals(
    out: &Path,
    pid: u32,
) -> (
    std::collections::BTreeMap<(u64, String), i64>,
    std::collections::BTreeMap<u64, usize>,
) {
    let mut totals = std::collections::BTreeMap::new();
    let mut types = std::collections::BTreeMap::new();
    for (_, profile) in profiles_of(out, pid).expect("local profiles") {
        let start = profile.time_nanos as u64;
        for (index, sample_type) in profile.sample_type.iter().enumerate() {
            let name = profile.string_table[sample_type.r#type as usize].clone();
            let total: i64 = profile.sample.iter().map(|s| s.value[index]).sum();
            // A type without a value has an OTLP profile but no sample to add up.
            if total != 0 {
                totals.insert((start, name), total);
            }
            *types.entry(start).or_default() += 1;
        }
    }
    (totals, types)
}

#[test]
fn otlp_profiles_reach_a_receiver_of_the_official_protos_across_an_outage() {
    let dir = tempfile::tempdir().expect("tempdir");
    let native = native_workload(dir.path(), 60);
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 25).expect("JDK 25");
    let java = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let record_dir = dir.path().join("received");
    let receiver = Receiver::start_otlp(0, &record_dir, &[]).expect("receiver");
    let port = receiver.port;
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        // Frame names without their kind's suffix: OTLP types every frame all the same.
        "annotate_frames = false\n\n[labels]\nenv = \"test\"\n\n[otlp]\ntenant_id = \"team-a\"\n\
         bearer_token = \"t0k\"\nmax_backoff_secs = 1\nshutdown_grace_secs = 10\n",
    )
    .expect("config written");
    let out = dir.path().join("profiles");
    let daemon = DaemonRun::new()
        .config(&config)
        .otlp(&receiver.url())
        .pids([native.pid(), java.pid()])
        .frequency(99)
        .interval(1)
        .arg("--off-cpu")
        .no_stream()
        .output(&out)
        .start(dir.path());
    daemon
        .wait_for_log("interval written", Duration::from_secs(30))
        .expect("daemon profiles");
    std::thread::sleep(Duration::from_secs(3));
    receiver.kill();
    eprintln!("receiver down for 8 s");
    std::thread::sleep(Duration::from_secs(8));
    let receiver = Receiver::start_otlp(port, &record_dir, &[]).expect("receiver restarts");
    std::thread::sleep(Duration::from_secs(4));
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed");
    drop(receiver);

    let records = recorded_exports(&record_dir).expect("records");
    assert!(!records.is_empty(), "nothing received");
    for record in &records {
        assert_eq!(
            record["errors"],
            serde_json::json!([]),
            "the receiver read it whole"
        );
        assert_eq!(record["headers"]["x-scope-orgid"], "team-a");
        assert_eq!(record["headers"]["authorization"], "Bearer t0k");
        for resource in record["resources"].as_array().expect("resources") {
            let attributes = &resource["attributes"];
            for key in ["service.name", "process.executable.name", "host.name"] {
                assert!(attributes[key].is_string(), "{key} in {attributes}");
            }
            assert_eq!(attributes["env"], "test");
            assert_eq!(resource["scopes"][0][0], "jvm-profiler");
        }
    }
    let totals = sink_totals(&log, "otlp");
    eprintln!("{} requests; totals {totals:?}", records.len());
    assert!(totals["retries"] > 0, "the outage was noticed");
    assert_eq!(totals["dropped_queue_full"], 0);
    assert_eq!(totals["dropped_at_shutdown"], 0);
    assert_eq!(totals["rejected"], 0);

    // The JVM's threads wait (GC, compiler, the main thread joining): it has off-CPU
    // profiles; the native program only runs.
    let cpu_kinds: &[&str] = &["samples", "cpu"];
    let all_kinds: &[&str] = &["samples", "cpu", "off_cpu", "runqueue"];
    for (pid, service, frame, expected_kinds) in [
        (native.pid(), "native_split", "hot_a|native", cpu_kinds),
        (java.pid(), "Spin", "Spin.", all_kinds),
    ] {
        let received = otlp_received(&records, pid);
        let (local, local_types) = local_totals(&out, pid);
        let kinds: std::collections::BTreeSet<&str> = received
            .totals
            .keys()
            .map(|(_, kind)| kind.as_str())
            .collect();
        eprintln!(
            "{service}: {} intervals exported, {} written; sample types {kinds:?}; {} distinct \
             frames, e.g. {:?}",
            received.starts.len(),
            local_types.len(),
            received.frames.len(),
            received.frames.iter().take(8).collect::<Vec<_>>()
        );
        // Every interval arrives once per sample type of each of its profiles (CPU: samples
        // and cpu; off-CPU: off_cpu and runqueue), outage or not, and its values sum to the
        // local profiles'.
        assert_eq!(
            received.starts, local_types,
            "{service}: one OTLP profile per type"
        );
        assert_eq!(
            received.totals, local,
            "{service}: every interval, its totals"
        );
        assert!(
            local_types.len() >= 12,
            "{service}: {} intervals",
            local_types.len()
        );
        for kind in expected_kinds {
            assert!(kinds.contains(kind), "{service}: {kind} among {kinds:?}");
        }
        assert!(
            received.frames.iter().any(|name| name.contains(frame)),
            "{service}: {frame} among {:?}",
            received.frames
        );
        let untyped: Vec<&String> = received
            .frames
            .iter()
            .filter(|name| {
                name.rsplit_once('|')
                    .is_none_or(|(_, kind)| kind.is_empty())
            })
            .collect();
        assert!(
            untyped.is_empty(),
            "{service}: every location has a frame type; these have none: {untyped:?}"
        );
        let service_names: std::collections::BTreeSet<&str> = records
            .iter()
            .flat_map(|r| r["resources"].as_array().expect("resources"))
            .filter(|r| r["attributes"]["process.pid"].as_i64() == Some(i64::from(pid)))
            .filter_map(|r| r["attributes"]["service.name"].as_str())
            .collect();
        assert_eq!(service_names, [service].into());
    }
    // The native program's frames are in its file, whose build-id (gcc's sha1 note) comes along.
    let native_received = otlp_received(&records, native.pid());
    eprintln!("native_split's mappings: {:?}", native_received.mappings);
    assert!(
        native_received
            .mappings
            .iter()
            .any(|(file, build_id)| file.ends_with("/native_split")
                && build_id.len() == 40
                && build_id.chars().all(|c| c.is_ascii_hexdigit())),
        "{:?}",
        native_received.mappings
    );
    let java = otlp_received(&records, java.pid());
    assert!(
        java.frames
            .iter()
            .any(|name| name.starts_with("Spin.") && name.ends_with("|jvm")),
        "Java frames are of type jvm, named without their suffix: {:?}",
        java.frames
    );
}
