//! The JVMTI sidecar end to end (JDK 11, 17, 21, 25): `profiler-daemon attach` loads the agent
//! into a running JVM, in the host namespace and in a mount namespace with a private /tmp; the
//! agent's records decode and name an inlined chain with its source lines; a JVM started with
//! -XX:+DisableAttachMechanism is refused with a clear message and keeps running; `attach =
//! "auto"` loads the agent (unless denied), into a fallback directory when another user holds
//! the JVM's pid's, and a thread that ran before it is named in full; the records of a killed
//! JVM are removed by the daemon; a minute of class churn with the agent loaded, on every JDK at
//! once and profiled, keep the JVMs alive and the agent's heap and files bounded; the agent's
//! allocation sampler callback can take the daemon's uprobe.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use profiler_jvmti_records::channel::{Reader, Update, Writer, RECORDS_FILE};
use profiler_jvmti_records::record::{AgentStats, CompiledMethod, Record};
use profiler_tests::*;

/// Starts `command` (a JVM running Workloads), waits for "ready" and keeps draining its stdout
/// (SIGQUIT thread dumps go there).
fn start(command: &mut Command) -> Workload {
    spawn_until_ready(command)
}

fn start_workloads(jdk: &Jdk, classes: &Path, jvm_args: &[&str]) -> Workload {
    start(
        Command::new(&jdk.java)
            .args(jvm_args)
            .arg("-cp")
            .arg(classes)
            .args(["Workloads", "inline-worker"]),
    )
}

/// The workloads started on every test JDK at once (their start-ups overlap).
fn start_on_every_jdk(classes: &Path, jvm_args: &[&str]) -> Vec<(Jdk, Workload)> {
    jdks()
        .into_iter()
        .map(|jdk| {
            let jvm = start_workloads(&jdk, classes, jvm_args);
            (jdk, jvm)
        })
        .collect()
}

fn attach(pid: u32) -> Output {
    Command::new(daemon_binary())
        .args(["attach", &pid.to_string(), "--agent"])
        .arg(agent_library())
        .output()
        .expect("profiler-daemon runs")
}

/// "attached to JVM PID in N ms ...": N.
fn attach_millis(stdout: &str) -> u64 {
    stdout
        .split_once(" in ")
        .and_then(|(_, rest)| rest.split_once(" ms"))
        .and_then(|(n, _)| n.parse().ok())
        .unwrap_or_else(|| panic!("no attach time in {stdout:?}"))
}

/// Source lines of the three inlined calls in Workloads.java, innermost first.
fn expected_inline_lines() -> [u32; 3] {
    let source =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("java/Workloads.java"))
            .expect("Workloads.java");
    let line_of = |needle: &str| {
        source
            .lines()
            .position(|line| line.contains(needle))
            .map(|i| i as u32 + 1)
            .unwrap_or_else(|| panic!("{needle} not in Workloads.java"))
    };
    [
        line_of("return OPS[i % 3].apply(x) + 1;"),
        line_of("return inlineInner(x, i) ^ 5;"),
        line_of("return inlineMiddle(x, i) + 3;"),
    ]
}

/// What the records showed once the inlined chain and the stubs appeared.
struct Seen {
    compiled_methods: usize,
    stubs: usize,
    chain: String,
}

/// Reads the records until (1) a compiled method has a pc whose chain is inlineInner <
/// inlineMiddle < inlineOuter with the expected lines, every method of it named, with its
/// Method* if `method_ptrs` and without one otherwise, and (2) generated stubs were replayed.
fn wait_for_inline_chain(records: &Path, method_ptrs: bool, timeout: Duration) -> Seen {
    let expected = expected_inline_lines();
    let mut reader = Reader::new(records.to_path_buf());
    let (mut compiled_methods, mut stubs, mut chain) = (0, 0, None);
    let deadline = Instant::now() + timeout;
    loop {
        for update in reader.poll().expect("records decode") {
            match update {
                Update::NewGeneration(header) => {
                    assert_eq!(header.version, 1);
                    (compiled_methods, stubs, chain) = (0, 0, None);
                }
                Update::Record(Record::CompiledMethodLoad(method)) => {
                    compiled_methods += 1;
                    chain = chain.or_else(|| inline_chain(&method, &expected, method_ptrs));
                }
                Update::Record(Record::DynamicCode { .. }) => stubs += 1,
                Update::Record(_) => {}
            }
        }
        if let Some(chain) = chain.as_ref().filter(|_| stubs > 0) {
            return Seen {
                compiled_methods,
                stubs,
                chain: chain.clone(),
            };
        }
        assert!(
            Instant::now() < deadline,
            "no inlineInner < inlineMiddle < inlineOuter chain (or no stubs) in {} after \
             {timeout:?} ({compiled_methods} compiled methods, {stubs} stubs, chain {chain:?})",
            records.display()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn inline_chain(method: &CompiledMethod, expected: &[u32; 3], method_ptrs: bool) -> Option<String> {
    let names = ["inlineInner", "inlineMiddle", "inlineOuter"];
    for pc in &method.pcs {
        let frames: Vec<_> = pc
            .frames
            .iter()
            .map(|f| (&method.methods[f.method as usize], f.bci))
            .collect();
        let start = frames.iter().position(|(m, _)| m.name == names[0])?;
        let window = frames.get(start..start + 3)?;
        let matches = window
            .iter()
            .zip(names)
            .zip(expected)
            .all(|(((m, bci), name), line)| {
                m.name == name
                    && m.class_signature == "LWorkloads;"
                    && m.signature == "(JI)J"
                    && m.source_file == "Workloads.java"
                    && (m.method_ptr != 0) == method_ptrs
                    && m.line_of(*bci) == Some(*line)
            });
        if matches {
            return Some(
                window
                    .iter()
                    .map(|(m, bci)| format!("{}@{bci}:{}", m.name, m.line_of(*bci).unwrap_or(0)))
                    .collect::<Vec<_>>()
                    .join(" < "),
            );
        }
    }
    None
}

#[test]
fn the_sidecar_attaches_to_a_running_jvm_and_records_inline_chains_on_every_jdk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    // Every JDK's JVM at once; let the JIT compile the hot chain first: the agent must replay
    // existing code.
    let jvms = start_on_every_jdk(&classes, &[]);
    std::thread::sleep(Duration::from_secs(2));
    for (jdk, jvm) in jvms {
        let output = attach(jvm.pid());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "JDK {}: {}",
            jdk.major,
            String::from_utf8_lossy(&output.stderr)
        );
        let millis = attach_millis(&stdout);
        let records = agent_records_file(jvm.pid());
        let seen = wait_for_inline_chain(
            &records,
            jdk.agent_reads_method_ptrs(),
            Duration::from_secs(20),
        );
        // Attaching again is harmless: the agent is already recording.
        let again = attach(jvm.pid());
        assert!(
            again.status.success(),
            "second attach on JDK {}: {}",
            jdk.major,
            String::from_utf8_lossy(&again.stderr)
        );
        let rss = std::fs::read_to_string(format!("/proc/{}/status", jvm.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        println!(
            "JDK {}: attached in {millis} ms (second attach {} ms); {} compiled methods and {} \
             stubs recorded; chain {}; records {} bytes; JVM RSS {}",
            jdk.major,
            attach_millis(&String::from_utf8_lossy(&again.stdout)),
            seen.compiled_methods,
            seen.stubs,
            seen.chain,
            std::fs::metadata(&records).map(|m| m.len()).unwrap_or(0),
            rss.split_whitespace().skip(1).collect::<Vec<_>>().join(" "),
        );
    }
}

#[test]
fn attach_to_a_jvm_with_disable_attach_mechanism_fails_clearly() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let mut jvms = start_on_every_jdk(&classes, &["-XX:+DisableAttachMechanism"]);
    // Each refusal waits out the attach timeout: all JDKs at once, not one after the other.
    let started = Instant::now();
    let outputs: Vec<(Output, Duration)> = std::thread::scope(|scope| {
        let attaching: Vec<_> = jvms
            .iter()
            .map(|(_, jvm)| {
                let pid = jvm.pid();
                scope.spawn(move || (attach(pid), started.elapsed()))
            })
            .collect();
        attaching
            .into_iter()
            .map(|handle| handle.join().expect("attach thread"))
            .collect()
    });
    for ((jdk, jvm), (output, took)) in jvms.iter_mut().zip(outputs) {
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "JDK {}: {stderr}", jdk.major);
        assert!(
            stderr.contains("attach mechanism disabled or not responding")
                && stderr.contains("DisableAttachMechanism"),
            "JDK {}: {stderr}",
            jdk.major
        );
        // The SIGQUIT only made it print a thread dump.
        assert!(
            jvm.0.try_wait().expect("try_wait").is_none(),
            "JDK {} died",
            jdk.major
        );
        println!(
            "JDK {}: refused after {took:?}: {}",
            jdk.major,
            stderr.trim()
        );
    }
}

#[test]
fn a_stale_attach_socket_left_by_a_dead_process_is_replaced() {
    // A JVM killed without cleaning up leaves /tmp/.java_pid<PID>; a later JVM with that pid
    // must still be attached (the stale socket refuses connections).
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let mut jvm = start_workloads(&jdk, &classes, &[]);
    let socket = format!("/tmp/.java_pid{}", jvm.pid());
    let _ = std::fs::remove_file(&socket);
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("a socket file"));
    assert!(
        std::os::unix::net::UnixStream::connect(&socket).is_err(),
        "the planted socket is stale"
    );
    let output = attach(jvm.pid());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        jvm.0.try_wait().expect("try_wait").is_none(),
        "the JVM survived"
    );
    println!("{}", String::from_utf8_lossy(&output.stdout).trim());
}

#[test]
fn a_jvm_in_its_own_mount_namespace_with_a_private_tmp_is_attached() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 25).expect("JDK 25");
    // As in hotspot.rs: neither the agent's path nor the JVM's /tmp exist outside the namespace.
    let jvm = start(&mut in_private_tmp_namespace(
        &jdk,
        &classes,
        "profiler-sidecar",
        "Workloads inline-worker",
    ));
    std::thread::sleep(Duration::from_secs(2));
    let output = attach(jvm.pid());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("agent /tmp/.jvm-profiler-agent-"),
        "the agent is copied into the JVM's /tmp: {stdout}"
    );
    let inside = PathBuf::from(format!(".jvm-profiler-{}/records", jvm.pid()));
    assert!(
        !Path::new("/tmp").join(&inside).exists(),
        "the records must live in the JVM's private /tmp"
    );
    let records = PathBuf::from(format!("/proc/{}/root/tmp", jvm.pid())).join(&inside);
    let seen = wait_for_inline_chain(&records, true, Duration::from_secs(20));
    println!(
        "JDK 25 in its own mount namespace: attached in {} ms; chain {}",
        attach_millis(&stdout),
        seen.chain
    );
}

/// Profiles `pids` with one daemon for `seconds` once it has pushed every one's JVM layout, into
/// `out`, keeping only the profiles of intervals that started after that (a debug daemon takes
/// seconds to read six JVMs' layouts on two busy CPUs; names before that are not the point).
/// Returns the daemon's log.
fn profile_once_named(pids: &[u32], out: &Path, seconds: u64, log_dir: &Path) -> String {
    let daemon = DaemonRun::new()
        .pids(pids.iter().copied())
        .frequency(99)
        .interval(2)
        .no_stream()
        .output(out)
        .start(log_dir);
    for pid in pids {
        daemon
            .wait_for_log(
                &format!("JVM layout pushed pid={pid} "),
                Duration::from_secs(60),
            )
            .expect("every JVM's layout pushed");
    }
    let named_from = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_nanos() as i64;
    std::thread::sleep(Duration::from_secs(seconds));
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed");
    for pid in pids {
        for (path, profile) in profiles_of(out, *pid).expect("profiles") {
            if profile.time_nanos < named_from {
                std::fs::remove_file(&path).expect("early profile removed");
            }
        }
    }
    log
}

/// Over the inline-worker's samples of the profiles in `dir`: (samples, samples whose stack has
/// inlineInner < inlineMiddle < inlineOuter with the right lines, Java frames, Java frames
/// with a line).
fn inline_chain_share(dir: &Path, pid: u32) -> (i64, i64, i64, i64) {
    let expected = expected_inline_lines();
    let base = |name: &str| name.split("_[").next().unwrap_or(name).to_owned();
    let (mut samples, mut with_chain, mut java, mut java_with_line) = (0, 0, 0, 0);
    for (_, profile) in profiles_of(dir, pid).expect("profiles") {
        for sample in &profile.sample {
            if label(&profile, sample, "thread_name") != Some("inline-worker") {
                continue;
            }
            let n = count(sample);
            samples += n;
            let frames = sample_frames(&profile, sample);
            for frame in frames
                .iter()
                .filter(|f| f.name.starts_with("Workloads") || f.name.starts_with("java."))
            {
                java += n;
                if frame.line > 0 {
                    java_with_line += n;
                }
            }
            let found = frames.windows(3).any(|w| {
                w.iter()
                    .zip([
                        "Workloads.inlineInner",
                        "Workloads.inlineMiddle",
                        "Workloads.inlineOuter",
                    ])
                    .zip(expected)
                    .all(|((f, name), line)| base(&f.name) == name && f.line == line as i64)
            });
            if found {
                with_chain += n;
            }
        }
    }
    (samples, with_chain, java, java_with_line)
}

#[test]
fn the_daemon_names_inlined_frames_from_the_sidecar_and_reports_both_paths() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    // Every JDK's JVM at once, profiled by one daemon: first from memory only, then with the
    // agent attached to each (the time of a run, not of one run per JDK).
    let jvms = start_on_every_jdk(&classes, &[]);
    let pids: Vec<u32> = jvms.iter().map(|(_, jvm)| jvm.pid()).collect();
    let mut results: Vec<Vec<(i64, i64, i64, i64)>> = vec![Vec::new(); jvms.len()];
    for with_agent in [false, true] {
        if with_agent {
            for (jdk, jvm) in &jvms {
                let output = attach(jvm.pid());
                assert!(
                    output.status.success(),
                    "JDK {}: {}",
                    jdk.major,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
        }
        let out = dir.path().join(format!("profiles-{with_agent}"));
        let log = profile_once_named(&pids, &out, 6, dir.path());
        for (index, (jdk, jvm)) in jvms.iter().enumerate() {
            let used = log.lines().any(|line| {
                line.contains("java frames named from the sidecar agent's records")
                    && line.contains(&format!("pid={}", jvm.pid()))
            });
            assert_eq!(
                used,
                with_agent && jdk.agent_reads_method_ptrs(),
                "JDK {}: sidecar use in the log",
                jdk.major
            );
            results[index].push(inline_chain_share(&out, jvm.pid()));
        }
    }
    for ((jdk, _), results) in jvms.iter().zip(results) {
        let [(m_samples, m_chain, m_java, m_lines), (s_samples, s_chain, s_java, s_lines)] =
            results[..]
        else {
            unreachable!()
        };
        println!(
            "JDK {}: inline-worker samples with the exact inlined chain and lines: memory only \
             {m_chain}/{m_samples}, with the agent loaded {s_chain}/{s_samples} (its records \
             used: {}); Java frames with a line: memory only {m_lines}/{m_java}, with the agent \
             {s_lines}/{s_java}",
            jdk.major,
            jdk.agent_reads_method_ptrs()
        );
        let share = |part: i64, whole: i64| part as f64 / whole.max(1) as f64;
        assert!(
            m_samples > 0 && s_samples > 0,
            "JDK {}: inline-worker samples: {m_samples} from memory only, {s_samples} with the \
             sidecar",
            jdk.major
        );
        // The hot leaf is called (megamorphic, never inlined) from inside the inlined chain, so
        // nearly every sample has the chain with its call lines, exact on both paths even
        // without DebugNonSafepoints (98 to 100% measured on JDK 11 to 25).
        assert!(
            share(m_chain, m_samples) >= 0.8,
            "JDK {}: the JVM's memory named the inlined chain in {m_chain}/{m_samples} samples",
            jdk.major
        );
        assert!(
            share(s_chain, s_samples) >= 0.8,
            "JDK {}: the sidecar named the inlined chain in {s_chain}/{s_samples} samples",
            jdk.major
        );
        // Every Java frame has a line but those of hidden lambda classes (no source file):
        // 2 or 3 of the 7 or 8 frames of each stack (62 to 87% measured, on both paths).
        for (path, samples, lines, java) in [
            ("memory", m_samples, m_lines, m_java),
            ("sidecar", s_samples, s_lines, s_java),
        ] {
            assert!(
                java >= samples && share(lines, java) >= 0.5,
                "JDK {}: {path} path: {lines}/{java} Java frames with a line in {samples} samples",
                jdk.major
            );
        }
        // Preferring the sidecar's records must never name fewer frames than memory alone.
        assert!(
            share(s_chain, s_samples) >= share(m_chain, m_samples) - 0.1
                && share(s_lines, s_java) >= share(m_lines, m_java) - 0.1,
            "JDK {}: the sidecar path did worse than memory only",
            jdk.major
        );
    }
}

/// A pool thread's Java name, longer than the kernel's 15 bytes (`http-nio-8080-e`).
const POOL_THREAD: &str = "http-nio-8080-exec-12";

/// The attached JVM's pool thread started long before the agent: it has no ThreadStart, only
/// the agent's listing of live threads by `JavaThread*`.
#[test]
fn attach_auto_loads_the_agent_unless_denied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java", "Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    for deny in [false, true] {
        let jvm = if deny {
            start_workloads(&jdk, &classes, &[])
        } else {
            let thread_name = format!("-Dspin.thread={POOL_THREAD}");
            start_java(&jdk, &classes, "Spin", &[&thread_name]).expect("JVM starts")
        };
        let jvm_pid = jvm.pid();
        let config = dir.path().join(format!("config-{deny}.toml"));
        let deny_list = if deny {
            r#"["Workloads"]"#
        } else {
            r#"["kafka"]"#
        };
        std::fs::write(
            &config,
            format!("attach = \"auto\"\nattach_deny = {deny_list}\ngrpc_listen = \"off\"\n"),
        )
        .expect("config");
        let out = dir.path().join(format!("profiles-{deny}"));
        // An earlier JVM with this pid (pids are reused) may have left its agent's records.
        remove_agent_records_dirs(jvm.pid());
        // The attached JVM's pid is held by another user's directory, with a dead JVM's
        // records in it: the agent writes into a fallback, and the daemon finds it.
        let squatted = PathBuf::from(format!("/tmp/.jvm-profiler-{}", jvm.pid()));
        if !deny {
            let started_ns = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_nanos() as u64
                - 3_600_000_000_000;
            let theirs = Writer::create(&squatted, jvm.pid(), started_ns, 1 << 20)
                .expect("a dead JVM's records");
            drop(theirs);
            for path in [squatted.join(RECORDS_FILE), squatted.clone()] {
                std::os::unix::fs::chown(&path, Some(65534), Some(65534)).expect("chown");
            }
        }
        let log = DaemonRun::new()
            .config(&config)
            .pid(jvm.pid())
            .duration(8)
            .interval(8)
            .output(&out)
            .run(Duration::from_secs(60))
            .log;
        let records = agent_records_dirs(jvm.pid());
        if deny {
            assert!(
                !log.contains("sidecar: agent loaded"),
                "denied JVM attached"
            );
            assert!(records.is_empty(), "{records:?}");
        } else {
            assert!(
                log.contains("sidecar: agent loaded"),
                "no attach in the log"
            );
            let fallback: Vec<_> = records.iter().filter(|dir| **dir != squatted).collect();
            assert_eq!(fallback.len(), 1, "one fallback directory: {records:?}");
            assert!(fallback[0].join(RECORDS_FILE).exists());
            assert!(
                log.contains("sidecar: the agent writes into a fallback directory"),
                "the fallback is not logged"
            );
            assert!(
                log.contains("java frames named from the sidecar agent's records"),
                "the sidecar was not used"
            );
            let (mut full, mut other) = (0, Vec::new());
            for (_, profile) in profiles_of(&out, jvm.pid()).expect("profiles") {
                for sample in &profile.sample {
                    let name = label(&profile, sample, "thread_name");
                    let source = label(&profile, sample, "thread_name_source");
                    if name == Some(POOL_THREAD) {
                        assert_eq!(source, Some("sidecar"), "{POOL_THREAD}'s name source");
                        full += count(sample);
                    } else {
                        other.push((name.map(str::to_owned), source.map(str::to_owned)));
                    }
                }
            }
            other.sort();
            other.dedup();
            println!("{POOL_THREAD}: {full} samples under its full name; others: {other:?}");
            assert!(
                full > 0,
                "the pool thread that ran before the attach is named in full"
            );
        }
        drop(jvm);
        remove_agent_records_dirs(jvm_pid);
    }
}

/// A JVM killed with SIGKILL cannot remove its agent's records: the daemon, which loaded the
/// agent, removes them once the JVM is gone (what it took on the JVM's behalf, it gives back).
#[test]
fn the_records_of_a_killed_jvm_are_removed_by_the_daemon() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let mut jvm = start_workloads(&jdk, &classes, &[]);
    let pid = jvm.pid();
    remove_agent_records_dirs(pid);
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "attach = \"auto\"\ngrpc_listen = \"off\"\n").expect("config");
    let daemon = DaemonRun::new()
        .config(&config)
        .pid(pid)
        .interval(2)
        .output(&dir.path().join("profiles"))
        .start(dir.path());
    daemon
        .wait_for_log(
            "java frames named from the sidecar agent's records",
            Duration::from_secs(60),
        )
        .expect("the agent's records are read");
    let records = records_dir_in_our_tmp(&agent_records_file(pid));
    assert!(records.join(RECORDS_FILE).exists(), "{}", records.display());

    jvm.0.kill().expect("SIGKILL");
    jvm.0.wait().expect("JVM exits");
    let removed = daemon.wait_for_log(
        "sidecar: removed the records a killed JVM's agent left",
        Duration::from_secs(30),
    );
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed:\n{log}");
    assert!(removed.is_ok(), "no removal logged:\n{log}");
    assert!(!records.exists(), "{} left behind", records.display());
}

/// The directory of `records` (a path through `/proc/PID/root` of a JVM that shares our /tmp)
/// as our /tmp names it: still a name once the JVM is gone.
fn records_dir_in_our_tmp(records: &Path) -> PathBuf {
    let dir = records
        .parent()
        .and_then(Path::file_name)
        .expect("a records directory");
    Path::new("/tmp").join(dir)
}

/// How long the churn soak runs: `PROFILER_SOAK_SECS`, default a minute.
fn soak_duration() -> Duration {
    let secs = std::env::var("PROFILER_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    Duration::from_secs(secs)
}

/// One churning JVM of the soak and what was read from its agent so far.
struct Churning {
    jdk: u32,
    jvm: Workload,
    records: PathBuf,
    reader: Reader,
    generations: u32,
    loads: u64,
    unloads: u64,
    largest_file: u64,
    stats: Option<AgentStats>,
    /// VmRSS (kB) halfway through the soak, and at the end.
    rss_kb_halfway: Option<u64>,
}

impl Churning {
    fn read_records(&mut self) {
        self.largest_file = self
            .largest_file
            .max(std::fs::metadata(&self.records).map_or(0, |m| m.len()));
        for update in self.reader.poll().expect("records decode") {
            match update {
                Update::NewGeneration(header) => {
                    self.generations = self.generations.max(header.generation)
                }
                Update::Record(Record::CompiledMethodLoad(_)) => self.loads += 1,
                Update::Record(Record::CompiledMethodUnload { .. }) => self.unloads += 1,
                Update::Record(Record::AgentStats(stats)) => self.stats = Some(stats),
                Update::Record(_) => {}
            }
        }
    }
}

fn vm_rss_kb(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Half a minute (`PROFILER_SOAK_SECS`) of class churn and deoptimization with the agent
/// loaded, on every JDK at once, while the daemon profiles them: no JVM dies, the records file
/// stays bounded through its rotations, the agent's own heap (it counts every byte it allocates
/// and reports it) stays small, the daemon sums the agents' reports in its metrics and still
/// names the JVMs' frames.
#[test]
fn class_churn_with_the_agent_loaded_keeps_jvms_alive_and_agent_memory_bounded() {
    // Small enough that every JDK's agent rotates its records at least twice in the soak's
    // half minute (JDK 11 and 17 write the least, and reached generation 6 in a minute).
    const CAP: u64 = 64 * 1024;
    // The agent holds nothing between events: what it holds is the records being built.
    const MAX_LIVE_HEAP: u64 = 4 << 20;
    const MAX_PEAK_HEAP: u64 = 64 << 20;
    let soak = soak_duration();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Churn.java"], dir.path()).expect("javac");
    let agent = format!("-agentpath:{}=max_bytes={CAP}", agent_library().display());
    let mut churning: Vec<Churning> = jdks()
        .iter()
        .map(|jdk| {
            let jvm = start(
                Command::new(&jdk.java)
                    .arg(&agent)
                    .args(["-Xmx256m", "-cp"])
                    .arg(&classes)
                    .arg("Churn"),
            );
            let records = agent_records_file(jvm.pid());
            Churning {
                jdk: jdk.major,
                jvm,
                reader: Reader::new(records.clone()),
                records,
                generations: 0,
                loads: 0,
                unloads: 0,
                largest_file: 0,
                stats: None,
                rss_kb_halfway: None,
            }
        })
        .collect();

    let metrics = free_local_address().expect("a free port");
    let output = dir.path().join("profiles");
    let daemon = DaemonRun::new()
        .frequency(49)
        .interval(10)
        .metrics(metrics)
        .output(&output)
        .pids(churning.iter().map(|one| one.jvm.pid()))
        .start(dir.path());

    let started = Instant::now();
    while started.elapsed() < soak {
        std::thread::sleep(Duration::from_secs(5));
        for one in &mut churning {
            assert!(
                one.jvm.0.try_wait().expect("try_wait").is_none(),
                "JDK {} died after {:?} with the agent loaded",
                one.jdk,
                started.elapsed()
            );
            one.read_records();
            if one.rss_kb_halfway.is_none() && started.elapsed() >= soak / 2 {
                one.rss_kb_halfway = vm_rss_kb(one.jvm.pid());
            }
        }
    }
    let page = scrape_metrics(metrics).expect("daemon metrics");
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(60)).expect("daemon exits");
    assert!(status.success(), "daemon failed: {log}");

    for one in &mut churning {
        one.read_records();
        let pid = one.jvm.pid();
        let stats = one
            .stats
            .unwrap_or_else(|| panic!("JDK {}: the agent never reported its stats", one.jdk));
        println!(
            "JDK {}: {:?} of class churn with the agent: {} loads and {} unloads read, \
             generation {}, largest records file {} bytes (cap {CAP}); agent heap {} bytes live, \
             {} peak; {} records written, {} dropped; JVM VmRSS {} kB halfway, {} kB at the end",
            one.jdk,
            soak,
            one.loads,
            one.unloads,
            one.generations,
            one.largest_file,
            stats.heap_live_bytes,
            stats.heap_peak_bytes,
            stats.records_written,
            stats.records_dropped,
            one.rss_kb_halfway.unwrap_or(0),
            vm_rss_kb(pid).unwrap_or(0),
        );
        assert!(one.loads > 0, "JDK {}: no compiled methods read", one.jdk);
        // The cap forces rotations; each replays the live code into a fresh file.
        assert!(one.generations >= 2, "JDK {}: never rotated", one.jdk);
        // A generation is its replay (the live code) plus at most twice the cap.
        assert!(
            one.largest_file < 4 << 20,
            "JDK {}: records grew to {} bytes",
            one.jdk,
            one.largest_file
        );
        assert!(
            stats.heap_live_bytes < MAX_LIVE_HEAP && stats.heap_peak_bytes < MAX_PEAK_HEAP,
            "JDK {}: the agent holds {} bytes (peak {})",
            one.jdk,
            stats.heap_live_bytes,
            stats.heap_peak_bytes
        );
        // The daemon named this JVM's churning frames.
        let profiles = profiles_of(&output, pid).expect("profiles");
        let named = frame_names(&profiles)
            .iter()
            .any(|name| name.starts_with("Churn"));
        assert!(
            named,
            "JDK {}: no Churn frame in {} profiles",
            one.jdk,
            profiles.len()
        );
    }
    let agents = metric_value(&page, metric::SIDECAR_AGENTS);
    assert_eq!(agents, Some(churning.len() as u64), "{page}");
    let heap = metric_value(&page, metric::SIDECAR_AGENT_HEAP_BYTES).unwrap_or(0);
    assert!(
        heap > 0 && heap < churning.len() as u64 * MAX_LIVE_HEAP,
        "{page}"
    );
    // Cumulative counts: the page (scraped first) cannot report more drops than the agents'
    // last stats records, read after it, add up to.
    let dropped: u64 = churning
        .iter()
        .filter_map(|one| one.stats)
        .map(|stats| stats.records_dropped)
        .sum();
    let reported = metric_value(&page, metric::SIDECAR_DROPPED_RECORDS);
    assert!(
        reported.is_some_and(|n| n <= dropped),
        "{reported:?} dropped records reported, the agents counted {dropped}: {page}"
    );

    for one in churning {
        // SIGTERM: an orderly exit, after which the agent removed its files.
        let pid = one.jvm.pid();
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        let mut jvm = one.jvm;
        jvm.0.wait().expect("JVM exits");
        let own_tmp_dir = records_dir_in_our_tmp(&one.records);
        assert!(
            !own_tmp_dir.exists(),
            "JDK {}: the agent left {} behind",
            one.jdk,
            own_tmp_dir.display()
        );
    }
}

#[test]
fn a_refused_attach_is_logged_and_frames_are_still_named_from_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let jvm = start_workloads(&jdk, &classes, &["-XX:+DisableAttachMechanism"]);
    let config = dir.path().join("config.toml");
    std::fs::write(&config, "attach = \"auto\"\ngrpc_listen = \"off\"\n").expect("config");
    let out = dir.path().join("profiles");
    let log = DaemonRun::new()
        .config(&config)
        .pid(jvm.pid())
        .frequency(99)
        .duration(10)
        .interval(10)
        .output(&out)
        .run(Duration::from_secs(60))
        .log;
    assert!(
        log.contains("sidecar: cannot load the agent")
            && log.contains("attach mechanism disabled or not responding"),
        "the refusal is not explained in the log"
    );
    let named = frame_names(&profiles_of(&out, jvm.pid()).expect("profiles"))
        .iter()
        .filter(|name| name.starts_with("Workloads."))
        .count();
    assert!(named > 0, "no Java frame named from the JVM's memory");
}

/// The agent on a JVM version it does not know (forced with its `assume_unknown_version`
/// option, loaded with the JVM by `-agentpath:`) must not read `Method*` from jmethodIDs (on JDK
/// 26 and later that read can crash a compiler thread): the JVM stays alive, the records say so
/// in the agent's status, every `method_ptr` is 0, and the daemon still names the Java frames,
/// from the JVM's memory. On the same JDK, an agent attached without the option reads the JVM's
/// version in the live phase and does read `Method*`.
#[test]
fn an_agent_on_an_unknown_jvm_version_reads_no_method_ptrs_and_frames_are_named_from_memory() {
    use profiler_jvmti_records::record::{AgentStatus, STATUS_ASSUMED_UNKNOWN_VERSION};

    /// Everything in a records file so far: the last status, the compiled-method loads, and the
    /// `method_ptr` of every unload.
    fn read_all(records: &Path) -> (Option<AgentStatus>, Vec<CompiledMethod>, Vec<u64>) {
        let (mut status, mut loads, mut unloads) = (None, Vec::new(), Vec::new());
        let mut reader = Reader::new(records.to_path_buf());
        loop {
            let updates = reader.poll().expect("records decode");
            if updates.is_empty() {
                return (status, loads, unloads);
            }
            for update in updates {
                match update {
                    Update::NewGeneration(_) => {
                        (status, loads, unloads) = (None, Vec::new(), Vec::new());
                    }
                    Update::Record(Record::AgentStatus(s)) => status = Some(s),
                    Update::Record(Record::CompiledMethodLoad(method)) => loads.push(method),
                    Update::Record(Record::CompiledMethodUnload { method_ptr, .. }) => {
                        unloads.push(method_ptr)
                    }
                    Update::Record(_) => {}
                }
            }
        }
    }

    fn records_of(pid: u32) -> PathBuf {
        agent_records_file(pid)
    }

    /// Waits until the records hold a status and a compiled method of the workload's hot chain.
    fn wait_for_workload_code(records: &Path, major: u32) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, loads, _) = read_all(records);
            let compiled = loads.iter().any(|m| {
                m.methods
                    .iter()
                    .any(|i| i.class_signature == "LWorkloads;" && i.name == "inlineOuter")
            });
            if status.is_some() && compiled {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "JDK {major}: no status or no compiled inlineOuter in {} ({} loads, status \
                 {status:?})",
                records.display(),
                loads.len()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let option = format!(
        "-agentpath:{}=assume_unknown_version",
        agent_library().display()
    );
    // Every JDK at once, in two phases (the time of one, not of one per JDK).
    let unknown = start_on_every_jdk(&classes, &[&option]);
    for (jdk, jvm) in &unknown {
        wait_for_workload_code(&records_of(jvm.pid()), jdk.major);
    }
    let out = dir.path().join("profiles-unknown");
    let pids: Vec<u32> = unknown.iter().map(|(_, jvm)| jvm.pid()).collect();
    let log = profile_once_named(&pids, &out, 6, dir.path());

    let mut reports = Vec::new();
    for (jdk, mut jvm) in unknown {
        let pid = jvm.pid();
        assert!(
            jvm.0.try_wait().expect("try_wait").is_none(),
            "JDK {} died with the agent on an unknown version",
            jdk.major
        );
        let (status, loads, unloads) = read_all(&records_of(pid));
        let status = status.unwrap_or_else(|| panic!("JDK {}: no status record", jdk.major));
        assert!(
            status.recording() && !status.method_ptrs(),
            "JDK {}: {status:?}",
            jdk.major
        );
        assert_ne!(
            status.flags & STATUS_ASSUMED_UNKNOWN_VERSION,
            0,
            "{status:?}"
        );
        assert!(status.error.is_empty(), "JDK {}: {status:?}", jdk.major);
        // The version it saw is still reported.
        assert_eq!(status.jvm_feature_version, jdk.major, "{status:?}");
        assert!(!loads.is_empty(), "JDK {}: no compiled methods", jdk.major);
        let with_ptr = loads
            .iter()
            .flat_map(|m| &m.methods)
            .filter(|i| i.method_ptr != 0)
            .count();
        assert_eq!(
            with_ptr, 0,
            "JDK {}: Method* read although the version is unknown",
            jdk.major
        );
        assert!(
            unloads.iter().all(|&p| p == 0),
            "JDK {}: an unload with a Method*",
            jdk.major
        );

        // The daemon did not take these records (no Method* to check them against) and named
        // the workload's frames from the JVM's memory.
        assert!(
            !log.lines().any(|line| {
                line.contains("java frames named from the sidecar agent's records")
                    && line.contains(&format!("pid={pid}"))
            }),
            "JDK {}: records without Method* were used",
            jdk.major
        );
        let (samples, with_chain, java, java_with_line) = inline_chain_share(&out, pid);
        let names = frame_names(&profiles_of(&out, pid).expect("profiles"));
        let workload_frames = names
            .iter()
            .filter(|name| name.starts_with("Workloads.inline"))
            .count();
        assert!(
            samples > 0 && workload_frames > 0,
            "JDK {}: no inline-worker frame named ({samples} samples)",
            jdk.major
        );
        reports.push(format!(
            "JDK {}: unknown version: {} compiled methods, {} unloads, all without Method*; \
             status {:?}; daemon named {with_chain}/{samples} inline-worker samples with the \
             inlined chain and {java_with_line}/{java} Java frames with a line from memory.",
            jdk.major,
            loads.len(),
            unloads.len(),
            status.jvm_version,
        ));
        exits_cleanly(&jdk, "unknown", jvm);
    }

    // Control: the same JDKs with the agent attached plainly (the live phase) read Method*
    // where the agent's version gate allows (11 to 25) and, on a version it knows to be
    // different (26 and later), none, without assuming anything.
    let known = start_on_every_jdk(&classes, &[]);
    for ((jdk, jvm), report) in known.into_iter().zip(reports) {
        let reads = jdk.agent_reads_method_ptrs();
        let output = attach(jvm.pid());
        assert!(
            output.status.success(),
            "JDK {}: {}",
            jdk.major,
            String::from_utf8_lossy(&output.stderr)
        );
        let known_records = records_of(jvm.pid());
        wait_for_workload_code(&known_records, jdk.major);
        let (known_status, known_loads, _) = read_all(&known_records);
        let known_status = known_status.expect("status");
        assert!(
            known_status.recording()
                && known_status.method_ptrs() == reads
                && known_status.jvm_feature_version == jdk.major
                && known_status.flags & STATUS_ASSUMED_UNKNOWN_VERSION == 0,
            "JDK {}: {known_status:?}",
            jdk.major
        );
        assert!(
            known_loads.iter().all(|m| m
                .methods
                .first()
                .is_some_and(|i| (i.method_ptr != 0) == reads)),
            "JDK {}: a compiled method {} its Method*",
            jdk.major,
            if reads { "without" } else { "with" }
        );
        println!(
            "{report} Attached plainly: {} compiled methods, Method* read: {reads}, status {:?}",
            known_loads.len(),
            known_status.jvm_version,
        );
        exits_cleanly(&jdk, "known", jvm);
    }

    /// An orderly exit removes the agent's files (VM death takes the writer from the agent's
    /// thread).
    fn exits_cleanly(jdk: &Jdk, what: &str, mut jvm: Workload) {
        let pid = jvm.pid();
        let own_tmp_dir = records_dir_in_our_tmp(&agent_records_file(pid));
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
        jvm.0.wait().expect("JVM exits");
        assert!(
            !own_tmp_dir.exists(),
            "JDK {} ({what} version): the agent left {} behind",
            jdk.major,
            own_tmp_dir.display()
        );
    }
}

/// The daemon hooks the agent's allocation sampler callback with a uprobe, which an x86 kernel
/// refuses on an instruction with a `lock` or segment prefix (an optimised atomic add compiled
/// that way once; the daemon then fell back to TLAB events for every JVM): the callback's
/// first byte, in the agent library the daemon ships beside itself, is none of them.
#[test]
fn the_agents_sampler_callback_starts_with_an_instruction_a_uprobe_can_take() {
    use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
    const CALLBACK: &str = "jvm_profiler_sampled_object_alloc";
    const BAD_PREFIXES: [u8; 7] = [0xf0, 0x26, 0x2e, 0x36, 0x3e, 0x64, 0x65];
    let library = agent_library();
    let bytes = std::fs::read(&library).expect("the agent library is built");
    let file = object::File::parse(&*bytes).expect("an ELF file");
    let symbol = file
        .dynamic_symbols()
        .find(|symbol| symbol.name() == Ok(CALLBACK))
        .unwrap_or_else(|| panic!("{} exports no {CALLBACK}", library.display()));
    let section = file
        .section_by_index(symbol.section_index().expect("a defined symbol"))
        .expect("its section");
    let code = section.data().expect("its bytes");
    let first = code[(symbol.address() - section.address()) as usize];
    assert!(
        !BAD_PREFIXES.contains(&first),
        "{CALLBACK} starts with byte {first:#04x} in {}: no uprobe can be put there",
        library.display()
    );
}
