//! Libjvm hooks (thread start, allocation events) as a budget every user shares (SECURITY.md,
//! docs/allocation-profiling.md).
//! An unprivileged user runs fake JVMs (tests/workloads/fake_jvm.c), each mapping its own copy
//! of JDK 17's libjvm.so in a tmpfs of the user's own user and mount namespace (no host path
//! reaches it), against the root daemon with `--alloc`: each copy is a distinct file to hook.
//! The user's JVMs hold at most their share of the hook cap, another user's JVM is hooked
//! regardless, a file whose JVMs all exited is released (and the memory its mount pinned with
//! it), and SIGTERM is prompt with the whole cap attached.

use std::io::BufRead as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use profiler_tests::hostile::{unprivileged_user, Scenario, User, SIGTERM_BOUND};
use profiler_tests::metrics_endpoint::free_local_address;
use profiler_tests::*;

/// profiler-daemon's `hotspot::libjvm_hooks::MAX_HOOKED_FILES` and `USER_SHARE`.
const MAX_HOOKED_FILES: u64 = 12;
const USER_SHARE: u64 = MAX_HOOKED_FILES / 2;
const INTERVAL_SECS: u64 = 2;
/// The attacker's fake JVMs: more than the cap.
const ATTACKER_FAKES: usize = MAX_HOOKED_FILES as usize + 4;
/// How long a fake JVM lives at most (the tests stop them sooner).
const FAKE_LIFETIME_SECS: u32 = 120;
/// How long the daemon may take to inspect and hook a batch of fake JVMs (they take
/// milliseconds each; the tracker gives one user's pending JVMs its spare time).
const SETTLE: Duration = Duration::from_secs(60);

/// Fake JVMs run together in a user and mount namespace of their own, each mapping its own
/// copy of a libjvm.so on a tmpfs mounted there; killed (the whole process group) when dropped.
struct FakeJvms {
    child: Child,
}

impl FakeJvms {
    /// `count` fake JVMs run by `user` (root if `None`), each file `pad_mib` MiB larger than the
    /// libjvm it copies (bytes written, so the tmpfs holds them in memory); the tmpfs is mounted
    /// on `mount_point`, in their namespace only. Returns once every one printed "ready".
    fn start(
        user: Option<User>,
        fake_jvm: &Path,
        libjvm: &Path,
        count: usize,
        pad_mib: usize,
        mount_point: &Path,
    ) -> Self {
        std::fs::create_dir_all(mount_point).expect("mkdir");
        let script = format!(
            "set -e; T={mount}; mount -t tmpfs -o size=16g tmpfs \"$T\"; i=0; \
             while [ $i -lt {count} ]; do \
               mkdir \"$T/$i\"; cp {libjvm} \"$T/$i/libjvm.so\"; \
               if [ {pad_mib} -gt 0 ]; then head -c {pad_mib}M /dev/zero >> \"$T/$i/libjvm.so\"; fi; \
               {fake} \"$T/$i/libjvm.so\" {FAKE_LIFETIME_SECS} threads > \"$T/$i/out\" 2>&1 & \
               i=$((i + 1)); \
             done; \
             i=0; while [ $i -lt {count} ]; do \
               until grep -q ready \"$T/$i/out\"; do \
                 if grep -q fake_jvm \"$T/$i/out\"; then cat \"$T/$i/out\"; exit 1; fi; sleep 0.05; \
               done; i=$((i + 1)); \
             done; echo ready; wait",
            mount = mount_point.display(),
            libjvm = libjvm.display(),
            fake = fake_jvm.display(),
        );
        let mut command = match user {
            Some(user) => {
                let mut command = Command::new("setpriv");
                command
                    .arg(format!("--reuid={}", user.uid))
                    .arg(format!("--regid={}", user.gid))
                    .args(["--clear-groups", "unshare"]);
                command
            }
            None => Command::new("unshare"),
        };
        command
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .process_group(0);
        let mut child = command.spawn().expect("the fake JVMs start");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reads");
        let fakes = Self { child };
        assert_eq!(line.trim(), "ready", "{count} fake JVMs set themselves up");
        fakes
    }
}

impl Drop for FakeJvms {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our child's process group, which only our fakes are in.
        unsafe { libc::kill(-(self.child.id() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// The daemon's metrics once `done` holds for them; panics after [`SETTLE`], saying `what`.
fn wait_for_metrics(
    address: std::net::SocketAddr,
    what: &str,
    done: impl Fn(&Hooks) -> bool,
) -> Hooks {
    let deadline = Instant::now() + SETTLE;
    loop {
        let hooks = Hooks::scrape(address);
        if done(&hooks) {
            return hooks;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: never so; last {hooks:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The daemon's hook figures.
#[derive(Debug)]
struct Hooks {
    hooked_files: u64,
    waiting_files: u64,
    jvms_hooked: u64,
}

impl Hooks {
    fn scrape(address: std::net::SocketAddr) -> Self {
        let text = scrape_metrics(address).expect("metrics");
        let value = |name: &str| metric_value(&text, name).unwrap_or(0);
        Self {
            hooked_files: value("profiler_libjvm_hooked_files"),
            waiting_files: value("profiler_libjvm_waiting_files"),
            jvms_hooked: value("profiler_libjvm_hook_jvms_total{hooked=\"true\"}"),
        }
    }
}

/// The fake JVM binary, built in `dir`.
fn fake_jvm_in(dir: &Path) -> PathBuf {
    compile_c_with("fake_jvm.c", dir, &["-O1", "-g", "-ldl"]).expect("gcc fake_jvm.c")
}

/// Bytes allocated that `pid`'s alloc profiles in `dir` account for.
fn profiled_alloc_bytes(dir: &Path, pid: u32) -> i64 {
    profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("alloc-"))
        })
        .map(|(_, profile)| {
            let bytes: Vec<usize> = profile
                .sample_type
                .iter()
                .enumerate()
                .filter(|(_, kind)| profile.string_table[kind.unit as usize] == "bytes")
                .map(|(index, _)| index)
                .collect();
            profile
                .sample
                .iter()
                .flat_map(|sample| bytes.iter().map(|index| sample.value[*index]))
                .sum::<i64>()
        })
        .sum()
}

/// The pids the daemon logged "events hooked" for, as often as it did.
fn hooked_pids(log: &str) -> Vec<u32> {
    log.lines()
        .filter(|line| line.contains("allocation profiling: events hooked"))
        .filter_map(|line| {
            line.split_whitespace()
                .find_map(|word| word.strip_prefix("pid="))?
                .parse()
                .ok()
        })
        .collect()
}

/// More fake JVMs than the cap, each its own libjvm file, hold only their user's share; a root
/// JVM started afterwards, on a JDK build first run then, is hooked and gets allocation
/// profiles. Root's own fake JVMs then fill the rest of the cap, and SIGTERM detaches every
/// hook within the bound (64 files took 15 s: the cap is what bounds it). Each JVM is hooked,
/// logged and counted once.
#[test]
fn a_users_fake_jvms_hold_their_share_of_the_hooks_and_another_users_jvm_is_hooked() {
    let user = unprivileged_user();
    let jdk = jdk(17);
    let libjvm = jdk.libjvm();
    let address = free_local_address().expect("a free port");
    // One sample per 16 MiB: the victim's few samples keep the last interval's writing short,
    // so that SIGTERM's time is the hooks'.
    let scenario = Scenario::new(Duration::from_secs(1))
        .whole_host()
        .interval_secs(INTERVAL_SECS)
        .daemon_args(&["--alloc=16m", "--metrics-listen", &address.to_string()]);
    let (run, (_attacker, _root_fakes, victim, (hooks, counted_pids))) = scenario.run(|context| {
        let fake_jvm = fake_jvm_in(context.scratch);
        let classes = compile_java(&["AllocSplit.java"], context.scratch).expect("javac");
        // Without a share, they would fill the cap and leave the victim unhooked.
        let attacker = FakeJvms::start(
            Some(user),
            &fake_jvm,
            &libjvm,
            ATTACKER_FAKES,
            0,
            &context.scratch.join("attacker"),
        );
        let held = wait_for_metrics(address, "the attacker holds its share", |hooks| {
            hooks.hooked_files == USER_SHARE
                && hooks.waiting_files == ATTACKER_FAKES as u64 - USER_SHARE
        });
        println!("the attacker's {ATTACKER_FAKES} fake JVMs: {held:?}");

        let victim = start_java(&jdk, &classes, "AllocSplit", &["-Xmx256m"]).expect("JDK 17");
        wait_for_metrics(address, "the victim's libjvm is hooked", |hooks| {
            hooks.hooked_files == USER_SHARE + 1
        });
        // Two intervals end after its hook: one of them whole.
        std::thread::sleep(Duration::from_secs(2 * INTERVAL_SECS + 1));

        // Root's fake JVMs: root holds its share too, with the victim's file, so the cap fills.
        let root_fakes = FakeJvms::start(
            None,
            &fake_jvm,
            &libjvm,
            USER_SHARE as usize - 1,
            0,
            &context.scratch.join("root"),
        );
        wait_for_metrics(address, "the cap is full", |hooks| {
            hooks.hooked_files == MAX_HOOKED_FILES
        });
        // Nothing is hooked anymore (the rest wait): the count and the log settle.
        std::thread::sleep(Duration::from_secs(1));
        let full = Hooks::scrape(address);
        let counted_pids = hooked_pids(&context.daemon_log()).len();
        println!("cap full: {full:?}");
        (attacker, root_fakes, victim, (full, counted_pids))
    });
    println!(
        "SIGTERM to exit with {} files hooked: {:?}",
        hooks.hooked_files, run.sigterm_to_exit
    );
    assert!(run.exit.success(), "the daemon's exit: {}", run.exit);
    assert!(!run.log.contains("panicked"), "a daemon thread panicked");
    assert!(
        run.sigterm_to_exit < SIGTERM_BOUND,
        "the daemon took {:?} to exit after SIGTERM with {} libjvm files hooked",
        run.sigterm_to_exit,
        hooks.hooked_files
    );
    let bytes = profiled_alloc_bytes(&run.output.join("profiles"), victim.pid());
    println!("the victim's profiled allocations: {} MB", bytes >> 20);
    assert!(bytes > 0, "the victim's allocations were not profiled");

    let mut pids = hooked_pids(&run.log);
    let logged = pids.len();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(
        logged,
        pids.len(),
        "a JVM was logged \"events hooked\" twice"
    );
    assert!(
        pids.contains(&victim.pid()),
        "the victim was not logged hooked"
    );
    assert_eq!(
        hooks.jvms_hooked, counted_pids as u64,
        "profiler_libjvm_hook_jvms_total{{hooked=\"true\"}} against the JVMs logged hooked then"
    );
}

/// `Shmem` of /proc/meminfo, in bytes: what tmpfs files hold.
fn shmem_bytes() -> u64 {
    let meminfo = std::fs::read_to_string("/proc/meminfo").expect("meminfo");
    let kib: u64 = meminfo
        .lines()
        .find_map(|line| line.strip_prefix("Shmem:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .expect("Shmem in /proc/meminfo");
    kib << 10
}

/// Four hooked libjvm files of 280 MB on the attacker's own tmpfs: once its JVMs exit, the
/// daemon releases their hooks and descriptors within two intervals, and with them the mount
/// and its memory (which no process of the attacker's holds anymore).
#[test]
fn memory_pinned_through_hooked_files_is_released_within_two_intervals_of_their_exit() {
    const FILES: usize = 4;
    const PAD_MIB: usize = 256;
    let user = unprivileged_user();
    let libjvm = jdk(17).libjvm();
    let address = free_local_address().expect("a free port");
    let scenario = Scenario::new(Duration::from_secs(1))
        .whole_host()
        .interval_secs(INTERVAL_SECS)
        .daemon_args(&["--alloc", "--metrics-listen", &address.to_string()]);
    let (run, released_after) = scenario.run(|context| {
        let fake_jvm = fake_jvm_in(context.scratch);
        let before = Hooks::scrape(address).hooked_files;
        let shmem_before = shmem_bytes();
        let attacker = FakeJvms::start(
            Some(user),
            &fake_jvm,
            &libjvm,
            FILES,
            PAD_MIB,
            &context.scratch.join("pinned"),
        );
        wait_for_metrics(address, "the attacker's files are hooked", |hooks| {
            hooks.hooked_files == before + FILES as u64
        });
        let pinned = shmem_bytes().saturating_sub(shmem_before);
        // Shmem moves with the rest of the host too: most of the files' bytes suffice.
        assert!(
            pinned >= (FILES * PAD_MIB) as u64 * (9 << 20) / 10,
            "the attacker's files hold {} MB of shared memory, {} MB expected",
            pinned >> 20,
            FILES * PAD_MIB
        );
        drop(attacker);
        let exited = Instant::now();
        let bound = Duration::from_secs(2 * INTERVAL_SECS);
        loop {
            let hooked = Hooks::scrape(address).hooked_files;
            let still = shmem_bytes().saturating_sub(shmem_before);
            if hooked == before && still < pinned / 10 {
                break exited.elapsed();
            }
            assert!(
                exited.elapsed() < bound,
                "{bound:?} after the attacker's exit: {hooked} files hooked ({before} before), \
                 {} MB of its {} MB still pinned",
                still >> 20,
                pinned >> 20
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    });
    println!("pinned memory released {released_after:?} after the attacker's exit");
    assert!(run.exit.success(), "the daemon's exit: {}", run.exit);
    assert!(!run.log.contains("panicked"), "a daemon thread panicked");
    assert!(
        run.log
            .contains("libjvm hooks: released, no JVM runs this libjvm anymore"),
        "the release was not logged"
    );
}
