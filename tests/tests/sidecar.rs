//! The JVMTI sidecar end to end (JDK 11, 17, 21, 25): `profiler-daemon attach` loads the agent
//! into a running JVM, in the host namespace and in a mount namespace with a private /tmp; the
//! agent's records decode and name an inlined chain with its source lines; a JVM started with
//! -XX:+DisableAttachMechanism is refused with a clear message and keeps running.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use profiler_jvmti::channel::{Reader, Update};
use profiler_jvmti::record::{CompiledMethod, Record};
use profiler_tests::*;

/// The agent library: `PROFILER_AGENT`, else beside the daemon binary (`cargo xtask test`
/// builds both into target/debug).
fn agent_library() -> PathBuf {
    let path = std::env::var_os("PROFILER_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| daemon_binary().with_file_name("libprofiler_jvmti.so"));
    assert!(
        path.exists(),
        "no agent at {} (cargo xtask test builds it)",
        path.display()
    );
    path
}

/// Starts `command` (a JVM running Workloads), waits for "ready" and keeps draining its stdout
/// (SIGQUIT thread dumps go there).
fn start(command: &mut Command) -> Workload {
    let mut child = command.stdout(Stdio::piped()).spawn().expect("JVM starts");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("reads");
    let jvm = Workload(child);
    assert_eq!(line.trim(), "ready");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    jvm
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
/// inlineMiddle < inlineOuter with the expected lines, every method of it named and with its
/// Method*, and (2) generated stubs were replayed.
fn wait_for_inline_chain(records: &Path, timeout: Duration) -> Seen {
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
                    chain = chain.or_else(|| inline_chain(&method, &expected));
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

fn inline_chain(method: &CompiledMethod, expected: &[u32; 3]) -> Option<String> {
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
                    && m.method_ptr != 0
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
    for jdk in jdks() {
        let jvm = start_workloads(&jdk, &classes, &[]);
        // Let the JIT compile the hot chain first: the agent must replay existing code.
        std::thread::sleep(Duration::from_secs(2));
        let output = attach(jvm.pid());
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "JDK {}: {}",
            jdk.major,
            String::from_utf8_lossy(&output.stderr)
        );
        let millis = attach_millis(&stdout);
        let records = PathBuf::from(format!(
            "/proc/{0}/root/tmp/.jvm-profiler-{0}/records",
            jvm.pid()
        ));
        let seen = wait_for_inline_chain(&records, Duration::from_secs(20));
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
    for jdk in jdks() {
        let mut jvm = start_workloads(&jdk, &classes, &["-XX:+DisableAttachMechanism"]);
        let started = Instant::now();
        let output = attach(jvm.pid());
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
            "JDK {}: refused after {:?}: {}",
            jdk.major,
            started.elapsed(),
            stderr.trim()
        );
    }
}

#[test]
fn a_jvm_in_its_own_mount_namespace_with_a_private_tmp_is_attached() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 25).expect("JDK 25");
    let jdk_home = jdk
        .java
        .parent()
        .and_then(|bin| bin.parent())
        .expect("JDK home");
    // As in hotspot.rs: stage the JDK and classes under /run, then hide the host's /tmp behind
    // a tmpfs, so neither the agent's path nor the JVM's /tmp exist outside the namespace.
    let script = format!(
        "set -e; mkdir -p /run/profiler-sidecar-classes /run/profiler-sidecar-jdk; \
         mount --bind {classes} /run/profiler-sidecar-classes; \
         mount --bind {jdk} /run/profiler-sidecar-jdk; \
         mount -t tmpfs tmpfs /tmp; mkdir /tmp/jdk /tmp/classes; \
         mount --bind /run/profiler-sidecar-jdk /tmp/jdk; \
         mount --bind /run/profiler-sidecar-classes /tmp/classes; \
         exec /tmp/jdk/bin/java -cp /tmp/classes Workloads inline-worker",
        classes = classes.display(),
        jdk = jdk_home.display()
    );
    let jvm = start(Command::new("unshare").args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-c",
        &script,
    ]));
    std::thread::sleep(Duration::from_secs(2));
    let output = attach(jvm.pid());
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        stdout.contains("agent /tmp/jvm-profiler-agent-"),
        "the agent is copied into the JVM's /tmp: {stdout}"
    );
    let inside = PathBuf::from(format!(".jvm-profiler-{}/records", jvm.pid()));
    assert!(
        !Path::new("/tmp").join(&inside).exists(),
        "the records must live in the JVM's private /tmp"
    );
    let records = PathBuf::from(format!("/proc/{}/root/tmp", jvm.pid())).join(&inside);
    let seen = wait_for_inline_chain(&records, Duration::from_secs(20));
    println!(
        "JDK 25 in its own mount namespace: attached in {} ms; chain {}",
        attach_millis(&stdout),
        seen.chain
    );
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
    for jdk in jdks() {
        let jvm = start_workloads(&jdk, &classes, &[]);
        let pid = jvm.pid().to_string();
        // The same JVM, first from memory only, then with the agent attached.
        let mut results = Vec::new();
        for with_agent in [false, true] {
            if with_agent {
                let output = attach(jvm.pid());
                assert!(
                    output.status.success(),
                    "JDK {}: {}",
                    jdk.major,
                    String::from_utf8_lossy(&output.stderr)
                );
            }
            let out = dir
                .path()
                .join(format!("profiles-{}-{with_agent}", jdk.major));
            let output = run_daemon(
                &[
                    "--pid",
                    &pid,
                    "--duration",
                    "6",
                    "--interval",
                    "6",
                    "--grpc-listen",
                    "off",
                    "--output",
                    out.to_str().expect("utf-8"),
                ],
                Duration::from_secs(60),
            )
            .expect("daemon runs");
            assert!(
                output.status.success(),
                "daemon failed on JDK {}",
                jdk.major
            );
            let log = String::from_utf8_lossy(&output.stderr);
            let used = log.contains("java frames named from the sidecar agent's records")
                && log.contains(&format!("pid={pid}"));
            assert_eq!(
                used, with_agent,
                "JDK {}: sidecar use in the log",
                jdk.major
            );
            results.push(inline_chain_share(&out, jvm.pid()));
        }
        let [(m_samples, m_chain, m_java, m_lines), (s_samples, s_chain, s_java, s_lines)] =
            results[..]
        else {
            unreachable!()
        };
        println!(
            "JDK {}: inline-worker samples with the exact inlined chain and lines: memory only \
             {m_chain}/{m_samples}, with the sidecar {s_chain}/{s_samples}; Java frames with a \
             line: memory only {m_lines}/{m_java}, with the sidecar {s_lines}/{s_java}",
            jdk.major
        );
        assert!(s_samples > 0, "JDK {}: no inline-worker samples", jdk.major);
        assert!(
            s_chain as f64 >= 0.5 * s_samples as f64,
            "JDK {}: the sidecar named the inlined chain in {s_chain}/{s_samples} samples",
            jdk.major
        );
    }
}

#[test]
fn attach_auto_loads_the_agent_unless_denied() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    for deny in [false, true] {
        let jvm = start_workloads(&jdk, &classes, &[]);
        let pid = jvm.pid().to_string();
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
        let output = run_daemon(
            &[
                "--config",
                config.to_str().expect("utf-8"),
                "--pid",
                &pid,
                "--duration",
                "8",
                "--interval",
                "8",
                "--output",
                out.to_str().expect("utf-8"),
            ],
            Duration::from_secs(60),
        )
        .expect("daemon runs");
        assert!(output.status.success(), "daemon failed");
        let log = String::from_utf8_lossy(&output.stderr);
        let records = PathBuf::from(format!(
            "/proc/{0}/root/tmp/.jvm-profiler-{0}/records",
            jvm.pid()
        ));
        if deny {
            assert!(
                !log.contains("sidecar: agent loaded"),
                "denied JVM attached"
            );
            assert!(!records.exists());
        } else {
            assert!(
                log.contains("sidecar: agent loaded"),
                "no attach in the log"
            );
            assert!(records.exists());
            assert!(
                log.contains("java frames named from the sidecar agent's records"),
                "the sidecar was not used"
            );
        }
    }
}

#[test]
fn class_churn_with_the_agent_loaded_keeps_the_jvm_alive_and_the_records_bounded() {
    const CAP: u64 = 256 * 1024;
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Churn.java"], dir.path()).expect("javac");
    let agent = format!("-agentpath:{}=max_bytes={CAP}", agent_library().display());
    for jdk in jdks() {
        let mut jvm = start(
            Command::new(&jdk.java)
                .arg(&agent)
                .arg("-cp")
                .arg(&classes)
                .arg("Churn"),
        );
        let records = PathBuf::from(format!(
            "/proc/{0}/root/tmp/.jvm-profiler-{0}/records",
            jvm.pid()
        ));
        let mut reader = Reader::new(records.clone());
        let (mut generations, mut loads, mut unloads, mut largest) = (0u32, 0u64, 0u64, 0u64);
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(20) {
            std::thread::sleep(Duration::from_secs(1));
            assert!(
                jvm.0.try_wait().expect("try_wait").is_none(),
                "JDK {} died with the agent loaded",
                jdk.major
            );
            largest = largest.max(std::fs::metadata(&records).map(|m| m.len()).unwrap_or(0));
            for update in reader.poll().expect("records decode") {
                match update {
                    Update::NewGeneration(header) => {
                        generations = generations.max(header.generation)
                    }
                    Update::Record(Record::CompiledMethodLoad(_)) => loads += 1,
                    Update::Record(Record::CompiledMethodUnload { .. }) => unloads += 1,
                    Update::Record(_) => {}
                }
            }
        }
        let rss = std::fs::read_to_string(format!("/proc/{}/status", jvm.pid()))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .map(str::to_owned)
            })
            .unwrap_or_default();
        println!(
            "JDK {}: 20 s of class churn with the agent: {loads} loads and {unloads} unloads \
             read, generation {generations}, largest records file {largest} bytes (cap {CAP}), \
             JVM {rss}",
            jdk.major
        );
        // Unloads depend on when the JVM flushes code (none within 20 s on JDK 11): counted only.
        assert!(loads > 0, "JDK {}: no compiled methods read", jdk.major);
        // A generation is its replay (the live code) plus at most twice the cap.
        assert!(
            largest < 4 * 1024 * 1024,
            "JDK {}: records grew to {largest} bytes",
            jdk.major
        );
        // SIGTERM: an orderly exit, after which the agent removed its files.
        // SAFETY: plain kill(2) on our child.
        unsafe { libc::kill(jvm.pid() as libc::pid_t, libc::SIGTERM) };
        jvm.0.wait().expect("JVM exits");
        let own_tmp_dir = PathBuf::from(format!("/tmp/.jvm-profiler-{}", jvm.pid()));
        assert!(
            !own_tmp_dir.exists(),
            "JDK {}: the agent left {} behind",
            jdk.major,
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
    let pid = jvm.pid().to_string();
    let output = run_daemon(
        &[
            "--config",
            config.to_str().expect("utf-8"),
            "--pid",
            &pid,
            "--frequency",
            "99",
            "--duration",
            "10",
            "--interval",
            "10",
            "--output",
            out.to_str().expect("utf-8"),
        ],
        Duration::from_secs(60),
    )
    .expect("daemon runs");
    assert!(output.status.success(), "daemon failed");
    let log = String::from_utf8_lossy(&output.stderr);
    assert!(
        log.contains("sidecar: cannot load the agent")
            && log.contains("attach mechanism disabled or not responding"),
        "the refusal is not explained in the log"
    );
    let named = profiles_of(&out, jvm.pid())
        .expect("profiles")
        .iter()
        .flat_map(|(_, profile)| {
            profile
                .sample
                .iter()
                .flat_map(|sample| sample_frames(profile, sample))
                .map(|frame| frame.name)
                .collect::<Vec<_>>()
        })
        .filter(|name| name.starts_with("Workloads."))
        .count();
    assert!(named > 0, "no Java frame named from the JVM's memory");
}
