//! HotSpot introspection on live JVMs (JDK 11, 17, 21, 25, default flags): `jvm-info`, JVMs in
//! their own mount namespace, and the daemon picking up JVMs that start after it.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::*;
use serde_json::Value;

/// Waits until jvm-info reports a ready code cache.
fn ready_info(pid: u32, timeout: Duration) -> Value {
    let deadline = Instant::now() + timeout;
    loop {
        let info = jvm_info_json(pid).expect("jvm-info works on a JVM");
        if !info["code_cache"].is_null() {
            return info;
        }
        assert!(
            Instant::now() < deadline,
            "code cache never ready: {}",
            info["not_ready"]
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn field(info: &Value, key: &str) -> u64 {
    info["layout"]["fields"][key]["offset"]
        .as_u64()
        .unwrap_or_else(|| panic!("no field {key} in {}", info["layout"]))
}

/// Offsets recorded in docs/hotspot-vmstructs.md for the builds this project's machines carry, checked
/// against what jvm-info derived from that build's VMStructs.
fn known_offsets(major: u64) -> &'static [(&'static str, u64)] {
    match major {
        8 => &[
            ("CodeBlob::_frame_size", 44),
            ("nmethod::_compile_id", 204),
            ("JavaThread::_anchor", 576),
            ("CodeHeap::_log2_segment_size", 248),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 8),
        ],
        11 => &[
            ("CodeBlob::_frame_size", 28),
            ("nmethod::_compile_id", 324),
            ("JavaThread::_anchor", 808),
            ("CodeHeap::_log2_segment_size", 256),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        17 => &[
            ("CodeBlob::_frame_size", 28),
            ("nmethod::_compile_id", 304),
            ("JavaThread::_anchor", 656),
            ("CodeHeap::_log2_segment_size", 256),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        21 => &[
            ("CodeBlob::_frame_size", 88),
            ("nmethod::_compile_id", 308),
            ("JavaThread::_anchor", 920),
            ("CodeHeap::_log2_segment_size", 248),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        25 => &[
            ("CodeBlob::_frame_size", 44),
            ("nmethod::_compile_id", 212),
            ("JavaThread::_anchor", 1152),
            ("CodeHeap::_log2_segment_size", 248),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        26 => &[
            ("CodeBlob::_frame_size", 44),
            ("nmethod::_compile_id", 212),
            ("JavaThread::_anchor", 1128),
            ("CodeHeap::_log2_segment_size", 248),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        27 => &[
            ("CodeBlob::_frame_size", 44),
            ("nmethod::_compile_id", 204),
            ("JavaThread::_anchor", 1128),
            ("CodeHeap::_log2_segment_size", 248),
            ("Method::_constMethod", 8),
            ("Symbol::_body", 6),
        ],
        // A JDK added to the matrix gets its row here and in the document.
        _ => panic!("no offsets recorded for JDK {major} in docs/hotspot-vmstructs.md"),
    }
}

/// The virtual-thread layout recorded in docs/virtual-threads.md for the builds this project's
/// machines carry (default flags: compressed oops; JDK 27's compact object headers on), checked
/// against what jvm-info read from that JVM's statics: StackChunk parent, size, sp, bottom, pc,
/// flags, cont, where its frames start; Continuation.tail; Thread.tid; and
/// `JavaThread::_cont_entry` from VMStructs (`None`: not exported).
fn known_virtual_thread_layout(major: u64) -> Option<([i64; 10], Option<u64>)> {
    let compressed_oops = [40, 12, 24, 28, 16, 36, 44, 48, 32, 24];
    match major {
        8..=17 => None,
        21 => Some((compressed_oops, Some(1328))),
        25 => Some((compressed_oops, Some(1560))),
        26 => Some((compressed_oops, Some(1528))),
        27 => Some(([36, 16, 20, 24, 8, 32, 40, 48, 28, 16], Some(1456))),
        _ => panic!("no virtual-thread layout recorded for JDK {major} in docs/virtual-threads.md"),
    }
}

/// jvm-info's virtual-thread layout of `info`, in [`known_virtual_thread_layout`]'s order.
fn virtual_thread_layout(info: &Value) -> ([i64; 10], Option<u64>) {
    let layout = &info["virtual_threads"]["Ok"];
    let chunk = &layout["stack_chunk"];
    let keys = [
        "parent", "size", "sp", "bottom", "pc", "flags", "cont", "stack",
    ];
    let mut values = [-1; 10];
    for (value, key) in values.iter_mut().zip(keys) {
        *value = chunk[key].as_i64().unwrap_or(-1);
    }
    values[8] = layout["continuation_tail"].as_i64().unwrap_or(-1);
    values[9] = layout["thread_tid"].as_i64().unwrap_or(-1);
    (values, layout["cont_entry"].as_u64())
}

#[test]
fn jvm_info_reads_every_jdk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    for jdk in jdks_with_8() {
        let started = Instant::now();
        let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
        let info = ready_info(jvm.pid(), Duration::from_secs(20));
        let release = info["version"]["release"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        eprintln!(
            "JDK {}: {release}, ready after {:?}",
            jdk.major,
            started.elapsed()
        );
        assert_eq!(
            info["version"]["major"].as_u64(),
            Some(jdk.major as u64),
            "{release}"
        );

        for (key, expected) in known_offsets(jdk.major as u64) {
            assert_eq!(
                field(&info, key),
                *expected,
                "JDK {} ({release}) {key}",
                jdk.major
            );
        }
        let heap_block = info["layout"]["sizes"]["HeapBlock"].as_u64();
        assert_eq!(
            heap_block,
            Some(if jdk.major >= 25 { 8 } else { 16 }),
            "sizeof(HeapBlock) on {release}"
        );
        // Renamed fields resolve through their alternates.
        let growable = info["layout"]["fields"]["GrowableArray::_len"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            growable,
            if jdk.major <= 11 {
                "GenericGrowableArray::_len"
            } else {
                "GrowableArrayBase::_len"
            }
        );
        let method = info["layout"]["fields"]["nmethod::_method"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        assert_eq!(
            method,
            // `CompiledMethod` existed from JDK 9 to 22.
            if jdk.major >= 23 || jdk.major <= 8 {
                "nmethod::_method"
            } else {
                "CompiledMethod::_method"
            }
        );

        // Default flags: a segmented code cache, three heaps of 128-byte segments (JDK 8: one
        // heap of 64-byte segments), and the interpreter and call stub inside the code cache.
        let code = &info["code_cache"];
        let heaps = code["heaps"].as_array().expect("heaps");
        let (heap_count, log2_segment) = if jdk.major <= 8 { (1, 6) } else { (3, 7) };
        assert_eq!(heaps.len(), heap_count, "{code}");
        let (low, high) = (
            code["low_bound"].as_u64().unwrap_or(0),
            code["high_bound"].as_u64().unwrap_or(0),
        );
        for heap in heaps {
            assert_eq!(heap["log2_segment_size"].as_u64(), Some(log2_segment));
            assert!(
                heap["low"].as_u64() >= Some(low) && heap["high"].as_u64() <= Some(high),
                "{heap}"
            );
        }
        let inside = |key: &str| code[key].as_u64().is_some_and(|a| low <= a && a < high);
        assert!(
            inside("interpreter_low") && inside("call_stub_return_address"),
            "{code}"
        );
        assert_eq!(
            info["facts"]["interpreter_bcp_slot"].as_i64(),
            Some(if jdk.major <= 8 { -7 } else { -8 })
        );
        assert_eq!(
            info["facts"]["unsigned5_excludes_zero"].as_bool(),
            Some(jdk.major >= 20)
        );

        // Virtual threads (JDK 21+): the statics the JVM computed at start, read through its
        // libjvm's `.symtab`; the return-barrier stub is JIT-area code.
        match known_virtual_thread_layout(jdk.major as u64) {
            None => assert!(
                info["virtual_threads"].is_null(),
                "JDK {}: {}",
                jdk.major,
                info["virtual_threads"]
            ),
            Some(expected) => {
                assert_eq!(
                    virtual_thread_layout(&info),
                    expected,
                    "JDK {} ({release}): {}",
                    jdk.major,
                    info["virtual_threads"]
                );
                let barrier = info["virtual_threads"]["Ok"]["return_barrier"].as_u64();
                assert!(
                    barrier.is_some_and(|pc| low <= pc && pc < high),
                    "JDK {}: return barrier {barrier:?} outside the code cache [{low:#x}, {high:#x})",
                    jdk.major
                );
            }
        }
    }
}

#[test]
fn jvm_info_errors_are_clear() {
    let sleeper = Workload::spawn(Command::new("sleep").arg("30")).expect("sleep starts");
    let output = Command::new(daemon_binary())
        .args(["jvm-info", &sleeper.pid().to_string()])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("not a HotSpot JVM") && stderr.contains("sleep"),
        "{stderr}"
    );

    // A pid that does not exist (above the default pid_max of 32768 and 4194304 alike).
    let output = Command::new(daemon_binary())
        .args(["jvm-info", "4194305"])
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("no process with pid 4194305"), "{stderr}");

    // Another user (nobody) cannot read a root JVM.
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let output = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
            "--",
        ])
        .arg(daemon_binary())
        .args(["jvm-info", &jvm.pid().to_string()])
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("permission denied") && stderr.contains("CAP_SYS_PTRACE"),
        "{stderr}"
    );
}

#[test]
fn a_jvm_in_its_own_mount_namespace_is_read() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 21).expect("JDK 21");
    // A private /tmp (tmpfs) holding the JDK and the classes: neither path exists outside the
    // namespace, so the daemon must go through /proc/PID/root.
    let mut child = in_private_tmp_namespace(&jdk, &classes, "profiler-test", "Spin")
        .stdout(Stdio::piped())
        .spawn()
        .expect("unshare runs");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("reads");
    let jvm = Workload(child);
    assert_eq!(line.trim(), "ready");
    assert!(
        !std::path::Path::new("/tmp/jdk/bin/java").exists(),
        "the JDK path must be private to the namespace"
    );

    let info = ready_info(jvm.pid(), Duration::from_secs(20));
    assert_eq!(info["version"]["major"].as_u64(), Some(21));
    assert_eq!(
        info["libjvm_path"].as_str(),
        Some("/tmp/jdk/lib/server/libjvm.so")
    );
}

#[test]
fn the_daemon_picks_up_a_jvm_started_after_it_and_forgets_it_at_exit() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 25).expect("JDK 25");
    let mut daemon = Command::new(daemon_binary())
        .args(["run", "--duration", "30", "--output"])
        .arg(dir.path().join("profiles"))
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stderr(Stdio::piped())
        .spawn()
        .expect("daemon starts");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel::<String>();
    let stderr = daemon.stderr.take().expect("stderr");
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if lines_tx.send(line).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_secs(2));

    let spawned = Instant::now();
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let pid = jvm.pid();
    // When did its code cache exist? Poll it ourselves, from the start.
    let info = ready_info(pid, Duration::from_secs(20));
    let code_cache_ready = spawned.elapsed();
    assert!(!info["code_cache"].is_null());

    let wanted = format!("pid={pid}");
    let pushed = wait_for_line(
        &lines_rx,
        |l| l.contains("JVM layout pushed") && l.contains(&wanted),
        Duration::from_secs(15),
    )
    .expect("the daemon logs the JVM's layout push");
    let pushed_after = spawned.elapsed();
    let since_start: u64 = pushed
        .split("since_process_start_ms=")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|ms| ms.parse().ok())
        .expect("since_process_start_ms in the log line");
    eprintln!(
        "JVM code cache ready after {code_cache_ready:?}; daemon pushed its layout {since_start} ms after process start (seen at {pushed_after:?})"
    );
    assert!(
        since_start <= code_cache_ready.as_millis() as u64 + 2000,
        "layout pushed {since_start} ms after start, code cache ready at {code_cache_ready:?}"
    );

    drop(jvm);
    wait_for_line(
        &lines_rx,
        |l| l.contains("JVM exited: layout removed") && l.contains(&wanted),
        Duration::from_secs(5),
    )
    .expect("the layout is removed when the JVM exits");
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGTERM) };
    assert!(daemon.wait().expect("daemon exits").success());
}

fn wait_for_line(
    lines: &std::sync::mpsc::Receiver<String>,
    matches: impl Fn(&str) -> bool,
    timeout: Duration,
) -> Option<String> {
    let deadline = Instant::now() + timeout;
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match lines.recv_timeout(left) {
            Ok(line) if matches(&line) => return Some(line),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

#[test]
fn jvms_past_the_bound_are_counted_not_pushed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let first = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let second = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let config = dir.path().join("profiler.toml");
    std::fs::write(&config, "max_jvms = 1\n").expect("writes config");
    let log = DaemonRun::new()
        .config(&config)
        .pids([first.pid(), second.pid()])
        .duration(3)
        .interval(2)
        .output(&dir.path().join("profiles"))
        .run(Duration::from_secs(30))
        .log;
    assert_eq!(log.matches("JVM layout pushed").count(), 1, "{log}");
    assert_eq!(log.matches("too many JVMs").count(), 1, "{log}");
    assert!(
        log.contains("jvms_ready=1") && log.contains("jvms_over_bound=1"),
        "{log}"
    );
}
