//! Hostile local users against the root daemon (SECURITY.md): JVMs run as the unprivileged
//! `profiler-test` user (created by `cargo xtask test`), which plants links, FIFOs and huge files
//! where the daemon looks, and a planted library where the agent copy goes.

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use profiler_tests::hostile::{unprivileged_user, with_debug_links_to, User};
use profiler_tests::*;

/// The unprivileged account `cargo xtask test` creates.
fn test_user() -> User {
    unprivileged_user()
}

/// Workloads compiled into a directory the test user can read.
fn classes(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let classes = compile_java(&["Workloads.java"], dir).expect("javac");
    Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .status()
        .expect("chmod -R");
    classes
}

/// A JVM of `user` running `workers` in `cwd`, once it printed "ready".
fn start_jvm_as(user: User, classes: &Path, cwd: &Path, workers: &[&str]) -> Workload {
    spawn_until_ready(
        Command::new(jdk(17).java)
            .arg("-cp")
            .arg(classes)
            .arg("Workloads")
            .args(workers)
            .current_dir(cwd)
            .uid(user.uid)
            .gid(user.gid),
    )
}

fn agent_library() -> PathBuf {
    let path = daemon_binary().with_file_name("libprofiler_jvmti.so");
    assert!(
        path.exists(),
        "no agent at {} (cargo xtask test builds it)",
        path.display()
    );
    path
}

fn attach(pid: u32) -> std::process::Output {
    Command::new(daemon_binary())
        .args(["attach", &pid.to_string(), "--agent"])
        .arg(agent_library())
        .output()
        .expect("profiler-daemon runs")
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Owner, mode and content of a file, to show it untouched.
fn fingerprint(path: &Path) -> (u32, u32, Vec<u8>) {
    let meta = std::fs::metadata(path).expect("metadata");
    (meta.uid(), meta.mode(), std::fs::read(path).expect("read"))
}

fn chown_link(path: &Path, user: User) {
    let status = Command::new("chown")
        .arg("-h")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(path)
        .status()
        .expect("chown");
    assert!(status.success());
}

/// Removes a planted path when the test ends, pass or fail.
struct Planted(PathBuf);

impl Drop for Planted {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

#[test]
fn a_symlinked_attach_trigger_never_touches_the_file_it_points_to() {
    let user = test_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = classes(dir.path());
    let home = dir.path().join("home");
    std::fs::create_dir(&home).expect("mkdir");
    Command::new("chown")
        .arg(format!("{}:{}", user.uid, user.gid))
        .arg(&home)
        .status()
        .expect("chown");
    // A root-only file the user must never get to change.
    let secret_dir = tempfile::tempdir().expect("secret dir");
    let secret = secret_dir.path().join("secret");
    std::fs::write(&secret, b"root's own data\n").expect("write");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let before = fingerprint(&secret);

    let jvm = start_jvm_as(user, &classes, &home, &["split-worker"]);
    let pid = jvm.pid();
    // The user plants the trigger name as a link to the secret, in its working directory and
    // in /tmp (both places HotSpot looks).
    let in_cwd = Planted(home.join(format!(".attach_pid{pid}")));
    let in_tmp = Planted(PathBuf::from(format!("/tmp/.attach_pid{pid}")));
    for link in [&in_cwd.0, &in_tmp.0] {
        std::os::unix::fs::symlink(&secret, link).expect("symlink");
        chown_link(link, user);
    }

    // Both places taken: the attach fails, saying why, and touches nothing.
    let output = attach(pid);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "attach cannot start the listener");
    assert!(
        stderr.contains("cannot create the attach trigger file"),
        "a clear message: {stderr}"
    );
    assert_eq!(fingerprint(&secret), before, "the secret is untouched");
    assert!(alive(pid));

    // The /tmp link gone: the child creates the trigger there as the JVM's user, and the attach
    // works; the link in the working directory still leads nowhere.
    drop(in_tmp);
    let output = attach(pid);
    assert!(
        output.status.success(),
        "attach through /tmp: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(fingerprint(&secret), before, "the secret is untouched");
    assert!(std::fs::symlink_metadata(&in_cwd.0).is_ok_and(|m| m.file_type().is_symlink()));
    assert!(alive(pid));
    println!(
        "planted trigger links: refused clearly, then attached through /tmp: {}",
        String::from_utf8_lossy(&output.stdout).trim()
    );
}

#[test]
fn a_stale_socket_of_another_user_at_the_jvms_attach_name_is_cleared_and_the_attach_works() {
    let user = test_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = classes(dir.path());
    let jvm = start_jvm_as(user, &classes, Path::new("/tmp"), &["split-worker"]);
    let pid = jvm.pid();
    // What a root process with the same pid, killed, leaves behind: its socket file, nobody
    // listening. The JVM's user cannot replace it in the sticky /tmp.
    let stale = Planted(PathBuf::from(format!("/tmp/.java_pid{pid}")));
    let _ = std::fs::remove_file(&stale.0);
    drop(std::os::unix::net::UnixListener::bind(&stale.0).expect("bind"));
    let inode = std::fs::symlink_metadata(&stale.0)
        .expect("the stale socket")
        .ino();

    let output = attach(pid);
    assert!(
        output.status.success(),
        "attach past a stale root socket: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let now = std::fs::symlink_metadata(&stale.0).expect("the JVM's socket");
    assert_ne!(now.ino(), inode, "the stale socket was replaced");
    assert_eq!(now.uid(), user.uid, "by the JVM's own");
    assert!(alive(pid));
    println!(
        "stale root socket at /tmp/.java_pid{pid}: cleared, attached: {}",
        String::from_utf8_lossy(&output.stdout).trim()
    );
}

#[test]
fn the_attach_child_closes_the_daemons_descriptors_and_drops_its_rights_before_acting() {
    let user = test_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = classes(dir.path());
    let jvm = start_jvm_as(user, &classes, Path::new("/tmp"), &["split-worker"]);
    let trace = dir.path().join("strace.log");
    let output = Command::new("strace")
        .args([
            "-f",
            "-qq",
            "-e",
            "trace=close_range,setresuid,setresgid,setgroups,capset,openat,kill",
        ])
        .arg("-o")
        .arg(&trace)
        .arg(daemon_binary())
        .args(["attach", &jvm.pid().to_string(), "--agent"])
        .arg(agent_library())
        .output()
        .expect("strace runs (cargo xtask test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let log = std::fs::read_to_string(&trace).expect("trace");
    // The child's calls, in order: close the rest, become the JVM's user, drop capabilities,
    // then create the trigger and signal the JVM.
    let position = |needle: &str| {
        log.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in the trace:\n{log}"))
    };
    let closed = position("close_range(");
    let uid = position(&format!("setresuid({0}, {0}, {0})", user.uid));
    let caps = position("capset(");
    let trigger = position(&format!(".attach_pid{}", jvm.pid()));
    let signal = position(&format!("kill({}, SIGQUIT)", jvm.pid()));
    assert!(
        closed < uid && uid < caps && caps < trigger && trigger < signal,
        "{log}"
    );
    let trigger_line = log[trigger..].lines().next().unwrap_or_default();
    assert!(
        trigger_line.contains("O_EXCL") && trigger_line.contains("O_NOFOLLOW"),
        "{trigger_line}"
    );
}

#[test]
fn hostile_records_files_never_stall_profiling() {
    let user = test_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = classes(dir.path());
    let out = dir.path().join("profiles");
    std::fs::create_dir(&out).expect("mkdir");

    // Three JVMs of the user, each with something hostile at its records path.
    let jvms: Vec<Workload> = (0..3)
        .map(|_| start_jvm_as(user, &classes, Path::new("/tmp"), &["split-worker"]))
        .collect();
    let mut planted = Vec::new();
    for (jvm, kind) in jvms.iter().zip(["fifo", "dev_zero", "sparse"]) {
        let records_dir = PathBuf::from(format!("/tmp/.jvm-profiler-{}", jvm.pid()));
        // A dead JVM with this pid may have left its directory (pids are reused).
        remove_agent_records_dirs(jvm.pid());
        std::fs::create_dir(&records_dir).expect("records dir");
        let records = records_dir.join("records");
        match kind {
            "fifo" => assert!(Command::new("mkfifo")
                .arg(&records)
                .status()
                .expect("mkfifo")
                .success()),
            "dev_zero" => std::os::unix::fs::symlink("/dev/zero", &records).expect("symlink"),
            _ => std::fs::File::create(&records)
                .and_then(|f| f.set_len(10 << 30))
                .expect("sparse file"),
        }
        chown_link(&records, user);
        chown_link(&records_dir, user);
        std::fs::set_permissions(&records_dir, std::fs::Permissions::from_mode(0o700))
            .expect("chmod");
        planted.push(Planted(records));
        planted.push(Planted(records_dir));
    }

    let metrics = free_local_address().expect("a free port");
    let daemon = DaemonRun::new()
        .frequency(49)
        .interval(1)
        .output(&out)
        .metrics(metrics)
        .pids(jvms.iter().map(|jvm| jvm.pid()))
        .start(dir.path());
    let run = Duration::from_secs(10);
    std::thread::sleep(run);
    let page = scrape_metrics(metrics).expect("metrics");
    let peak_rss_kb = std::fs::read_to_string(format!("/proc/{}/status", daemon.pid()))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        })
        .expect("the daemon's VmHWM");
    let stop = Instant::now();
    daemon.terminate();
    let (status, log) = daemon.wait(Duration::from_secs(30)).expect("daemon exits");
    let stopped_in = stop.elapsed();
    assert!(status.success(), "daemon exit: {status}");
    // No exporter is configured: stopping takes the last interval's writing only, well within
    // the default shutdown_grace_secs (5 s).
    assert!(
        stopped_in < Duration::from_secs(5),
        "stopped in {stopped_in:?}"
    );
    assert!(
        peak_rss_kb < 128 * 1024,
        "daemon peak RSS {peak_rss_kb} kB >= 128 MB"
    );

    for (reason, expected) in [("not_regular", 1), ("link", 1), ("too_large", 1)] {
        let name = labelled(metric::SIDECAR_RECORDS_REFUSED, "reason", reason);
        assert_eq!(
            metric_value(&page, &name),
            Some(expected),
            "{name} in:\n{page}"
        );
    }
    assert_eq!(
        log.matches("sidecar records not read").count(),
        3,
        "one log line per hostile JVM:\n{log}"
    );
    // Every JVM's profiles kept coming, one per interval.
    for jvm in &jvms {
        let profiles = profiles_of(&out, jvm.pid()).expect("profiles");
        assert!(
            profiles.len() as u64 >= run.as_secs() - 3,
            "JVM {}: {} profiles in {run:?}",
            jvm.pid(),
            profiles.len()
        );
        let names = frame_names(&profiles);
        assert!(
            names.iter().any(|n| n.contains("Workloads.split")),
            "JVM {} frames named from memory",
            jvm.pid()
        );
    }
    println!(
        "hostile records files: daemon peak RSS {} MB, stopped in {stopped_in:?}, profiles every \
         interval for all three JVMs",
        peak_rss_kb / 1024
    );
}

/// The name the agent copy had before copies became fresh and unique: what an attacker who
/// read the old code would plant.
fn old_copy_name(agent: &[u8]) -> String {
    let hash = agent.iter().fold(0xcbf2_9ce4_8422_2325u64, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    format!("jvm-profiler-agent-0.1.0-{hash:016x}.so")
}

#[test]
fn a_planted_agent_copy_is_never_loaded() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = classes(dir.path());
    // A JVM in its own mount namespace with a private /tmp: the daemon copies the agent there.
    let jvm = spawn_until_ready(&mut in_private_tmp_namespace(
        &jdk(17),
        &classes,
        "profiler-security",
        "Workloads split-worker",
    ));
    let pid = jvm.pid();

    // Plant a library where the old code would have looked, of the agent's very length.
    let agent = std::fs::read(agent_library()).expect("agent");
    let their_tmp = PathBuf::from(format!("/proc/{pid}/root/tmp"));
    let planted = their_tmp.join(old_copy_name(&agent));
    std::fs::write(&planted, vec![0u8; agent.len()]).expect("plant");

    let output = attach(pid);
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    // What the JVM mapped is our agent, byte for byte, under a fresh name.
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let mapping = maps
        .lines()
        .find(|l| l.contains("jvm-profiler-agent"))
        .unwrap_or_else(|| panic!("the agent is mapped:\n{maps}"));
    assert!(
        mapping.contains("/tmp/.jvm-profiler-agent-") && !mapping.contains(&old_copy_name(&agent)),
        "{mapping}"
    );
    let range = mapping.split_whitespace().next().expect("range");
    let mapped = std::fs::read(format!("/proc/{pid}/map_files/{range}")).expect("map_files");
    assert!(mapped == agent, "the mapped library is the daemon's agent");
    // The copy is gone once loaded; the planted file is untouched.
    let left: Vec<String> = std::fs::read_dir(&their_tmp)
        .expect("their /tmp")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".jvm-profiler-agent-"))
        .collect();
    assert!(left.is_empty(), "copies left behind: {left:?}");
    assert_eq!(
        std::fs::read(&planted).expect("planted"),
        vec![0u8; agent.len()]
    );
    assert!(alive(pid));
}

#[test]
fn a_binary_whose_debug_links_name_a_fifo_is_still_symbolized() {
    let user = test_user();
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let binary = compile_c("native_split.c", dir.path()).expect("gcc");
    // The author of a binary chooses the files its debug links name: here a FIFO nobody writes.
    let fifo = dir.path().join("debug-fifo");
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo")
        .success());
    let linked = dir.path().join("native_split_linked");
    with_debug_links_to(&binary, &fifo, &linked);
    let workload = Workload::spawn(Command::new(&linked).arg("30").uid(user.uid).gid(user.gid))
        .expect("workload starts");
    let out = dir.path().join("profiles");
    std::fs::create_dir(&out).expect("mkdir");
    // The daemon exits on its own: nothing blocked it.
    DaemonRun::new()
        .pid(workload.pid())
        .frequency(49)
        .interval(1)
        .duration(4)
        .output(&out)
        .run(Duration::from_secs(30));
    let profiles = profiles_of(&out, workload.pid()).expect("profiles");
    assert!(profiles.len() >= 3, "{} profiles in 4 s", profiles.len());
    let names = frame_names(&profiles);
    assert!(
        names.iter().any(|n| n.contains("hot_a")),
        "symbols from the binary's own symbol table: {names:?}"
    );
}
