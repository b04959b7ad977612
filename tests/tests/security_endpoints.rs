//! Local users against the daemon's endpoints and its attach path (SECURITY.md, "Hazards
//! closed"), the hostile side always the unprivileged `profiler-test` user: the metrics endpoint
//! under a flood of idle connections and of pipelined scrapes (the real daemon beside a
//! bystander, tests/src/hostile.rs),
//! and `profiler-daemon attach` against a JVM that mounted a root-owned directory on its /tmp
//! and against a socket squatted at a JVM's attach path.

use std::io::{BufRead as _, Read as _};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::hostile::{unprivileged_user, Scenario, User};
use profiler_tests::*;

/// More connections than the daemon's hard limit on open files in the scenario below.
const HOG_CONNECTIONS: u32 = 5000;

/// The soft limit of the daemon's `Max open files` in `/proc/PID/limits`.
fn open_files_limit(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/limits"))
        .expect("limits")
        .lines()
        .find_map(|line| line.strip_prefix("Max open files"))
        .and_then(|values| values.split_whitespace().next()?.parse().ok())
        .expect("Max open files")
}

/// Scrapes `address` until it answers, for at most `within`.
fn scrape_within(address: std::net::SocketAddr, within: Duration) -> anyhow::Result<String> {
    let deadline = Instant::now() + within;
    loop {
        match scrape_metrics(address) {
            Ok(page) => return Ok(page),
            Err(err) if Instant::now() > deadline => return Err(err),
            Err(_) => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

#[test]
fn idle_connections_to_metrics_cannot_take_the_daemons_descriptors() {
    let user = unprivileged_user();
    let address = free_local_address().expect("a free port");
    let scenario = Scenario::new(Duration::from_secs(10))
        .daemon_args(&["--metrics-listen", &address.to_string()])
        // systemd's default soft limit, and a hard one below what the attacker opens: the
        // daemon raises its soft limit, but only the endpoint's connection limit can save it.
        .open_files(1024, 4096);
    let baseline = scenario.run_baseline();
    let (attacked, (_hog, held, scraped, limit)) = scenario.run(|context| {
        let hog = compile_c("connection_hog.c", context.scratch).expect("gcc");
        // Root grants the descriptors (prlimit), then the user runs the attack.
        let mut hog = Command::new("prlimit")
            .arg(format!("--nofile={0}:{0}", HOG_CONNECTIONS + 100))
            .args(["--", "setpriv"])
            .arg(format!("--reuid={}", user.uid))
            .arg(format!("--regid={}", user.gid))
            .arg("--clear-groups")
            .arg(hog)
            .args(["127.0.0.1", &address.port().to_string()])
            .arg(HOG_CONNECTIONS.to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the attacker starts");
        let mut line = String::new();
        std::io::BufReader::new(hog.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the attacker reports");
        let held: u32 = line
            .trim()
            .strip_prefix("holding ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("the attacker said {line:?}"));
        // Idle connections are closed after the header timeout (5 s): a scrape gets through.
        let scraped = scrape_within(address, Duration::from_secs(8));
        (
            Workload(hog),
            held,
            scraped,
            open_files_limit(context.daemon_pid),
        )
    });
    println!("the attacker opened {held} connections, the daemon's soft limit was {limit}");
    let page = scraped.expect("/metrics answers during the attack");
    attacked.assert_unharmed(&baseline);
    assert_eq!(
        limit, 4096,
        "the daemon raised its soft limit to the hard one"
    );
    let over_limit = labelled(metric::METRICS_CONNECTIONS_CLOSED, "reason", "over_limit");
    assert!(
        metric_value(&page, &over_limit).is_some_and(|n| n > 0),
        "{over_limit} in:\n{page}"
    );
}

/// CPU time (user and system) `pid` has used so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the daemon runs");
    // The fields after the command name (which may hold spaces) in parentheses.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .expect("a stat line")
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// The daemon's share of one CPU while `during` runs; what `during` returned.
fn cpu_share_during<T>(pid: u32, during: impl FnOnce() -> T) -> (f64, T) {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let (start, ticks) = (Instant::now(), cpu_ticks(pid));
    let result = during();
    let used = (cpu_ticks(pid) - ticks) as f64 / ticks_per_second;
    (used / start.elapsed().as_secs_f64(), result)
}

/// How long the flood lasts.
const FLOOD: Duration = Duration::from_secs(8);

#[test]
fn a_users_pipelined_scrapes_leave_the_operator_its_scrapes_and_the_daemon_its_cpu() {
    let user = unprivileged_user();
    let address = free_local_address().expect("a free port");
    let scenario = Scenario::new(Duration::from_secs(12))
        .daemon_args(&["--metrics-listen", &address.to_string()]);
    let (attacked, (quiet, flooded, scrapes, flood)) = scenario.run(|context| {
        let pid = context.daemon_pid;
        let (quiet, ()) = cpu_share_during(pid, || std::thread::sleep(Duration::from_secs(1)));
        let flood = compile_c("scrape_flood.c", context.scratch).expect("gcc");
        let flood = user
            .command(flood)
            .args(["127.0.0.1", &address.port().to_string(), "1000"])
            .arg(FLOOD.as_secs().to_string())
            .stdout(Stdio::piped())
            .spawn()
            .expect("the attacker starts");
        // Root scrapes as a Prometheus server would, only more often, while the flood lasts.
        let (flooded, scrapes) = cpu_share_during(pid, || {
            std::thread::sleep(Duration::from_millis(500));
            let mut scrapes = Vec::new();
            while scrapes.len() < 20 {
                let start = Instant::now();
                let page = scrape_metrics(address);
                scrapes.push((page.is_ok(), start.elapsed()));
                std::thread::sleep(Duration::from_millis(200));
            }
            scrapes
        });
        let report = flood.wait_with_output().expect("the attacker ends");
        (
            quiet,
            flooded,
            scrapes,
            String::from_utf8_lossy(&report.stdout).trim().to_owned(),
        )
    });
    let answered = scrapes.iter().filter(|(ok, _)| *ok).count();
    let mut latencies: Vec<Duration> = scrapes.iter().map(|(_, took)| *took).collect();
    latencies.sort_unstable();
    println!(
        "daemon CPU: {:.1}% of a core quiet, {:.1}% under the flood; root's scrapes: {answered} \
         of {} answered, latency median {:?}, max {:?}; the attacker: {flood}",
        quiet * 100.0,
        flooded * 100.0,
        scrapes.len(),
        latencies[latencies.len() / 2],
        latencies[latencies.len() - 1],
    );
    assert!(
        attacked.exit.success(),
        "the daemon's exit: {}",
        attacked.exit
    );
    assert!(!attacked.log.contains("panicked"), "a thread panicked");
    assert!(
        attacked.bystander_intervals >= attacked.expected_intervals,
        "the bystander was profiled in {} intervals of {}",
        attacked.bystander_intervals,
        attacked.expected_intervals
    );
    assert!(
        answered * 10 >= scrapes.len() * 9,
        "root's scrapes: {answered} of {} answered",
        scrapes.len()
    );
    // The attacker's answers are paced (connections::LIMITS: 8 at once, then 4 a second), however
    // many connections and requests it sends; it ran FLOOD from its start, one second spare.
    let answers: u64 = flood
        .split_whitespace()
        .skip_while(|word| *word != "answers")
        .nth(1)
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("the attacker said {flood:?}"));
    let paced = 8 + 4 * (FLOOD.as_secs() + 1);
    assert!(
        answers <= paced,
        "the attacker got {answers} answers, pacing allows {paced}"
    );
}

/// The workloads, compiled into `dir`, readable by every user.
fn readable_classes(dir: &Path) -> PathBuf {
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let classes = compile_java(&["Workloads.java"], dir).expect("javac");
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(dir)
        .status()
        .expect("chmod -R");
    assert!(status.success());
    classes
}

/// `profiler-daemon attach PID` with the agent under test.
fn attach(pid: u32) -> Output {
    let output = Command::new(daemon_binary())
        .args(["attach", &pid.to_string(), "--agent"])
        .arg(agent_library())
        .output()
        .expect("profiler-daemon runs");
    eprintln!(
        "attach {pid}: {}\n{}",
        String::from_utf8_lossy(&output.stdout).trim(),
        String::from_utf8_lossy(&output.stderr).trim()
    );
    output
}

fn alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn no_agent_copy_is_written_as_root_into_a_directory_a_jvm_mounted_on_its_tmp() {
    let user = unprivileged_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = readable_classes(dir.path());
    // A directory root owns and only root may write, standing for the host's /etc.
    let roots = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(roots.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let modified = || {
        let meta = std::fs::metadata(roots.path()).expect("stat");
        (meta.mtime(), meta.mtime_nsec())
    };
    let before = modified();

    // The JVM's user, in user and mount namespaces of its own, mounts it on the JVM's /tmp. The
    // classes (in the host's /tmp) are bound first where that mount does not hide them.
    let script = format!(
        "mount -t tmpfs tmpfs /mnt && mkdir /mnt/classes && mount --bind . /mnt/classes && \
         mount --bind {} /tmp && \
         exec {} -XX:-UsePerfData -cp /mnt/classes Workloads split-worker",
        roots.path().display(),
        jdk(17).java.display()
    );
    let jvm = spawn_until_ready(
        user.command("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
            .current_dir(&classes),
    );
    let pid = jvm.pid();
    let output = attach(pid);
    // Nothing was ever created there: a file created and removed since would have changed the
    // directory's modification time.
    let left: Vec<_> = std::fs::read_dir(roots.path())
        .expect("list")
        .flatten()
        .map(|entry| entry.file_name())
        .collect();
    assert!(left.is_empty(), "files left: {left:?}");
    assert_eq!(modified(), before, "a file was created in the directory");
    // The copy would be written as the JVM's user, who cannot write there: a clean refusal.
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "the attach cannot work here");
    assert!(
        stderr.contains("cannot copy the agent into the JVM's /tmp as the JVM's user")
            && stderr.contains("Permission denied"),
        "a clear message: {stderr}"
    );
    assert!(alive(pid), "the JVM runs on");
}

/// A squatter's socket at a JVM's attach path: removed when the test ends, pass or fail.
struct Squatter {
    process: Workload,
    socket: PathBuf,
}

impl Squatter {
    /// `user` binds `/tmp/.java_pid<pid>` before the JVM `pid` does, open to everyone.
    fn take(user: User, pid: u32, scratch: &Path) -> Self {
        let binary = compile_c("socket_squatter.c", scratch).expect("gcc");
        let socket = PathBuf::from(format!("/tmp/.java_pid{pid}"));
        let mut child = user
            .command(binary)
            .arg(&socket)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the squatter starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.as_mut().expect("stdout"))
            .read_line(&mut line)
            .expect("reads");
        assert_eq!(line.trim(), "listening");
        Self {
            process: Workload(child),
            socket,
        }
    }

    /// Stops the squatter; the requests it got (their sizes), one line each.
    fn requests(mut self) -> Vec<String> {
        let _ = self.process.0.kill();
        let mut report = String::new();
        if let Some(stdout) = self.process.0.stdout.as_mut() {
            stdout.read_to_string(&mut report).expect("reads");
        }
        report.lines().map(str::to_owned).collect()
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
}

#[test]
fn a_socket_squatted_at_a_jvms_attach_path_gets_no_request() {
    let user = unprivileged_user();
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = readable_classes(dir.path());
    let jvm_of = |as_user: Option<User>| {
        let mut command = Command::new(jdk(17).java);
        command
            .args(["-cp"])
            .arg(&classes)
            .args(["Workloads", "split-worker"])
            .current_dir("/tmp");
        if let Some(user) = as_user {
            command.uid(user.uid).gid(user.gid);
        }
        spawn_until_ready(&mut command)
    };
    // Another user's socket at a root JVM's path (refused for its owner), and a socket of the
    // JVM's own user that another of its processes listens on (refused for its peer).
    for (victim, case) in [
        (jvm_of(None), "another user's socket"),
        (jvm_of(Some(user)), "another process's listener"),
    ] {
        let pid = victim.pid();
        let squatter = Squatter::take(user, pid, dir.path());
        let output = attach(pid);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            !output.status.success() && !stdout.contains("attached"),
            "{case}: the forged reply was taken: {stdout}"
        );
        let expected = match case {
            "another user's socket" => {
                format!("belongs to uid {}, not to the JVM's user", user.uid)
            }
            _ => format!("is not JVM {pid}"),
        };
        assert!(
            stderr.contains(&expected),
            "{case}: a clear message: {stderr}"
        );
        let requests = squatter.requests();
        assert!(
            requests.iter().all(|line| line == "request of 0 bytes"),
            "{case}: the squatter got a request: {requests:?}"
        );
        assert!(alive(pid), "{case}: the JVM runs on");
    }
}
