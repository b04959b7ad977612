//! Floods by an unprivileged local user against root's daemon, run under the shipped unit's own
//! limits (`MemoryMax=256M`, `CPUQuota=50%`, as cgroups of the test's own), each against the
//! same run without the attack (SECURITY.md, "Every event source is a shared budget"):
//!
//! - **allocations**: a fake JVM of the test user calls its own hooked allocation event from
//!   four threads as fast as they can, 1 to 900 frames deep, a new class pointer each call, every
//!   call always sampled (1 GiB);
//! - **deep waits** (`--lock`, `--off-cpu`): 100 threads of the test user sleep 5 ms at a time,
//!   each time 1 to 900 frames deep.
//!
//! Each time the daemon must live (no OOM kill, a clean exit within 5 s of SIGTERM), its memory
//! charged must peak a third below the unit's limit, the budgets must be what stopped the flood
//! (their refusal counters move), and the victim, a JVM of root, must keep at least 90% of what
//! the unattacked run profiled of it (relative to its own measured truth: allocated bytes or
//! monitor waits), and a JVM of root spinning on a core at least 90% of its CPU samples per CPU
//! second.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use profiler_daemon::pprof::proto;
use profiler_tests::cgroup::MemoryCgroup;
use profiler_tests::cpu_quota::CpuQuota;
use profiler_tests::hostile::{allocation_event_symbols, unprivileged_user};
use profiler_tests::*;

/// The systemd unit's limits (deploy/systemd/profiler.service).
const MEMORY_MAX: u64 = 256 << 20;
const CPU_QUOTA_PERCENT: u64 = 50;
/// How long the victim is profiled after the attack starts.
const RUN: Duration = Duration::from_secs(16);
const INTERVAL_SECS: u64 = 2;
const FREQUENCY_HZ: u32 = 49;
/// What the victim must keep of the unattacked run's share of its truth.
const VICTIM_KEEPS: f64 = 0.9;

/// The attacks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flood {
    Allocations,
    DeepWaits,
}

impl Flood {
    fn daemon_args(self) -> &'static [&'static str] {
        match self {
            Self::Allocations => &["--alloc"],
            Self::DeepWaits => &["--lock=1ms", "--off-cpu"],
        }
    }

    /// The victim's workload, the truth its lines carry and the profiles compared with it.
    fn victim(self) -> VictimWorkload {
        match self {
            Self::Allocations => VictimWorkload {
                main_class: "AllocSplit",
                jvm_args: &["-Xms256m", "-Xmx256m", "-XX:CompileCommand=quiet"],
                prefix: "ALLOC",
                keys: &["seventy", "thirty", "large", "arrays"],
                truth_keys: &["seventy", "thirty", "large"],
                profile: "alloc",
                // In-new-TLAB bytes and outside-TLAB bytes.
                columns: &[1, 3],
            },
            Self::DeepWaits => VictimWorkload {
                main_class: "LockSplit",
                jvm_args: &["-Xms64m", "-Xmx64m", "-XX:CompileCommand=quiet"],
                prefix: "LOCK",
                keys: &["monitor_ns", "monitor_waits", "park_ns", "park_waits"],
                truth_keys: &["monitor_ns"],
                profile: "mutex",
                // The delay.
                columns: &[1],
            },
        }
    }

    /// The `producer` label of the budget that must stop it.
    fn producer(self) -> &'static str {
        match self {
            Self::Allocations => "alloc",
            Self::DeepWaits => "off_cpu",
        }
    }
}

struct VictimWorkload {
    main_class: &'static str,
    jvm_args: &'static [&'static str],
    prefix: &'static str,
    keys: &'static [&'static str],
    truth_keys: &'static [&'static str],
    profile: &'static str,
    columns: &'static [usize],
}

/// What one run measured.
struct FloodRun {
    /// The victim's profiled total of the flood's kind, over its measured truth.
    victim_share: f64,
    /// The spinning JVM's CPU samples per second of its CPU time, over the frequency.
    victim_cpu_share: f64,
    peak_charged: u64,
    oom_kills: u64,
    exit: ExitStatus,
    sigterm_to_exit: Duration,
    metrics: BTreeMap<String, f64>,
}

impl FloodRun {
    fn over_budget(&self, producer: &str) -> f64 {
        self.metrics
            .iter()
            .filter(|(name, _)| {
                name.starts_with(metric::RECORDS_OVER_BUDGET)
                    && name.contains(&format!("producer=\"{producer}\""))
            })
            .map(|(_, value)| value)
            .sum()
    }

    fn metric(&self, name: &str) -> f64 {
        self.metrics.get(name).copied().unwrap_or(0.0)
    }
}

/// The victim's user and system time, sampled every 100 ms with the wall clock, to interpolate
/// at a profile window's bounds as its truth is.
struct CpuClock {
    readings: Arc<Mutex<Vec<(i64, f64)>>>,
}

impl CpuClock {
    fn start(pid: u32) -> Self {
        let readings = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&readings);
        std::thread::spawn(move || {
            // SAFETY: sysconf has no preconditions.
            let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
            while let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
                let after_comm = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
                let fields: Vec<&str> = after_comm.split_whitespace().collect();
                // utime and stime are the 14th and 15th fields; 12th and 13th after the comm.
                let cpu = fields
                    .get(11..13)
                    .map(|f| f.iter().filter_map(|v| v.parse::<f64>().ok()).sum::<f64>())
                    .unwrap_or(0.0);
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("clock")
                    .as_nanos() as i64;
                sink.lock().expect("readings").push((now, cpu / ticks));
                std::thread::sleep(Duration::from_millis(100));
            }
        });
        Self { readings }
    }

    /// CPU seconds the process used within `window`.
    fn within(&self, window: Window) -> f64 {
        let readings = self.readings.lock().expect("readings");
        let at = |nanos: i64| {
            let next = readings.partition_point(|(at, _)| *at <= nanos);
            assert!(
                next > 0 && next < readings.len(),
                "no CPU readings around the window"
            );
            let ((t0, c0), (t1, c1)) = (readings[next - 1], readings[next]);
            c0 + (c1 - c0) * (nanos - t0) as f64 / (t1 - t0).max(1) as f64
        };
        at(window.end) - at(window.start)
    }
}

/// `pid`'s profiles of `prefix` in `dir` but the first (partial), and the window they cover.
fn whole_intervals(dir: &Path, pid: u32, prefix: &str) -> (Vec<proto::Profile>, Window) {
    let mut profiles: Vec<proto::Profile> = profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
        })
        .map(|(_, profile)| profile)
        .collect();
    profiles.sort_by_key(|p| p.time_nanos);
    // At least one whole interval after the first: under the CPU quota the worker may still be
    // writing when an interval ends, and the next one then goes on (longer, as contiguous).
    assert!(
        profiles.len() >= 2,
        "{} {prefix} profiles of the victim, at least 2 expected",
        profiles.len()
    );
    profiles.remove(0);
    let last = profiles.last().expect("profiles");
    let window = Window {
        start: profiles[0].time_nanos,
        end: last.time_nanos + last.duration_nanos,
    };
    (profiles, window)
}

fn sum_columns(profiles: &[proto::Profile], columns: &[usize]) -> f64 {
    profiles
        .iter()
        .flat_map(|profile| &profile.sample)
        .map(|sample| {
            columns
                .iter()
                .map(|&column| sample.value.get(column).copied().unwrap_or(0) as f64)
                .sum::<f64>()
        })
        .sum()
}

/// Runs the daemon under the unit's limits against the victim for [`RUN`], with the flood when
/// `attack` is set.
fn run(flood: Flood, attack: bool) -> FloodRun {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(
        dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .expect("chmod");
    let workload = flood.victim();
    let classes = compile_java(
        &[&format!("{}.java", workload.main_class), "Spin.java"],
        dir.path(),
    )
    .expect("javac");
    let jdk = jdk(17);
    let mut victim = MeasuringJvm::start(
        jdk.clone(),
        workload.jvm_args,
        &classes,
        workload.main_class,
        workload.prefix,
        workload.keys,
    );
    let victim_pid = victim.jvm.pid();
    let spinner = start_java(&jdk, &classes, "Spin", &[]).expect("the spinning JVM starts");
    let cpu = CpuClock::start(spinner.pid());

    let memory = MemoryCgroup::create("profiler-floods", MEMORY_MAX).expect("memory cgroup");
    let quota = CpuQuota::create("profiler-floods", CPU_QUOTA_PERCENT).expect("CPU cgroup");
    let out = dir.path().join("profiles");
    let address = free_local_address().expect("a free port");
    let mut daemon_run = DaemonRun::new()
        .frequency(FREQUENCY_HZ)
        .interval(INTERVAL_SECS)
        .no_stream()
        .output(&out)
        .metrics(address);
    for arg in flood.daemon_args() {
        daemon_run = daemon_run.arg(arg);
    }
    let daemon = daemon_run.start_in(&memory, dir.path());
    quota
        .add(daemon.pid())
        .expect("the daemon joins the CPU cgroup");
    daemon
        .wait_for_log("interval sampled", Duration::from_secs(60))
        .expect("the daemon samples");

    let _attacker = attack.then(|| start_attacker(flood, dir.path()));
    let started = Instant::now();
    std::thread::sleep(RUN);
    let metrics = metrics_endpoint::scrape(address)
        .map(|text| metrics_endpoint::parse(&text))
        .unwrap_or_default();
    let peak_charged = memory.peak().expect("memory peak");
    let oom_kills = memory.oom_kills().expect("OOM kills");
    let terminated = Instant::now();
    daemon.terminate();
    let (exit, _log) = daemon
        .wait(Duration::from_secs(60))
        .expect("the daemon exits");
    let sigterm_to_exit = terminated.elapsed();
    victim.assert_alive("the flood");

    let (profiles, window) = whole_intervals(&out, victim_pid, workload.profile);
    let truth = victim.truth(window);
    let true_total: f64 = workload.truth_keys.iter().map(|key| truth.get(key)).sum();
    let victim_share = sum_columns(&profiles, workload.columns) / true_total.max(1.0);
    let (cpu_profiles, cpu_window) = whole_intervals(&out, spinner.pid(), "cpu");
    let cpu_seconds = cpu.within(cpu_window);
    let victim_cpu_share =
        sum_columns(&cpu_profiles, &[0]) / (cpu_seconds * f64::from(FREQUENCY_HZ)).max(1.0);
    println!(
        "{flood:?}, {}: victim {:.1}% of its truth, spinner {:.1}% of its CPU samples ({:.1} CPU s), \
         peak charged {} MB, OOM kills {oom_kills}, SIGTERM to exit {:.2} s, over budget \
         {:.0}, past the stack bound {:.0}, intervals put off {:.0} ({:.0} s)",
        if attack { "attacked" } else { "baseline" },
        victim_share * 100.0,
        victim_cpu_share * 100.0,
        cpu_seconds,
        peak_charged >> 20,
        sigterm_to_exit.as_secs_f64(),
        metrics
            .iter()
            .filter(|(name, _)| name.starts_with(metric::RECORDS_OVER_BUDGET))
            .map(|(_, value)| value)
            .sum::<f64>(),
        metrics
            .get(metric::SAMPLES_PAST_STACK_BOUND)
            .copied()
            .unwrap_or(0.0),
        metrics
            .get(metric::INTERVALS_DEFERRED)
            .copied()
            .unwrap_or(0.0),
        started.elapsed().as_secs_f64(),
    );
    FloodRun {
        victim_share,
        victim_cpu_share,
        peak_charged,
        oom_kills,
        exit,
        sigterm_to_exit,
        metrics,
    }
}

/// Starts the flood as the unprivileged test user; it ends by itself after the run.
fn start_attacker(flood: Flood, dir: &Path) -> Workload {
    let user = unprivileged_user();
    let lifetime = (RUN.as_secs() + 30).to_string();
    let flags = ["-O1", "-g", "-fno-omit-frame-pointer", "-pthread", "-ldl"];
    let mut command = match flood {
        Flood::Allocations => {
            let binary = compile_c_with("fake_jvm.c", dir, &flags).expect("gcc fake_jvm.c");
            let jdk = jdk(17);
            let libjvm = jdk.libjvm();
            let (in_new_tlab, outside_tlab) = allocation_event_symbols(&libjvm);
            let mut command = user.command(&binary);
            command
                .arg(&libjvm)
                .arg(&lifetime)
                .arg("alloc_flood")
                .arg(format!("{in_new_tlab:x}"))
                .arg(format!("{outside_tlab:x}"))
                .arg("4");
            command
        }
        Flood::DeepWaits => {
            let binary =
                compile_c_with("deep_sleepers.c", dir, &flags).expect("gcc deep_sleepers.c");
            let mut command = user.command(&binary);
            command.arg("100").arg(&lifetime);
            command
        }
    };
    spawn_until_ready(command.stdout(Stdio::piped()))
}

/// The attacked run against the baseline: the daemon lived within the unit's limits and the
/// victim kept its profile.
fn assert_withstood(flood: Flood, baseline: &FloodRun, attacked: &FloodRun) {
    assert!(
        attacked.exit.success(),
        "the daemon's exit: {}",
        attacked.exit
    );
    assert_eq!(attacked.oom_kills, 0, "the daemon was OOM-killed");
    assert!(
        attacked.sigterm_to_exit < Duration::from_secs(5),
        "SIGTERM to exit took {:?}",
        attacked.sigterm_to_exit
    );
    assert!(
        attacked.peak_charged < MEMORY_MAX * 2 / 3,
        "the daemon's memory peaked at {} MB, not a third below the unit's {} MB",
        attacked.peak_charged >> 20,
        MEMORY_MAX >> 20
    );
    assert!(
        attacked.over_budget(flood.producer()) > 0.0,
        "the {} budget never refused a record: was there a flood?",
        flood.producer()
    );
    assert_eq!(
        baseline.over_budget(flood.producer()),
        0.0,
        "the unattacked run hit the {} budget",
        flood.producer()
    );
    assert!(
        attacked.victim_share >= VICTIM_KEEPS * baseline.victim_share,
        "the victim's {} profile kept {:.1}% of its truth under the flood, {:.1}% without",
        flood.victim().profile,
        attacked.victim_share * 100.0,
        baseline.victim_share * 100.0
    );
    assert!(
        attacked.victim_cpu_share >= VICTIM_KEEPS * baseline.victim_cpu_share,
        "the spinning JVM kept {:.1}% of its CPU samples under the flood, {:.1}% without",
        attacked.victim_cpu_share * 100.0,
        baseline.victim_cpu_share * 100.0
    );
    // The daemon itself reports what it refused and what it kept without frames.
    let refused_or_bounded =
        attacked.over_budget(flood.producer()) + attacked.metric(metric::SAMPLES_PAST_STACK_BOUND);
    assert!(refused_or_bounded > 0.0);
}

#[test]
fn an_allocation_flood_leaves_the_daemon_and_the_victims_profile_whole() {
    let baseline = run(Flood::Allocations, false);
    let attacked = run(Flood::Allocations, true);
    assert_withstood(Flood::Allocations, &baseline, &attacked);
}

#[test]
fn a_flood_of_deep_waits_leaves_the_daemon_and_the_victims_lock_profile_whole() {
    let baseline = run(Flood::DeepWaits, false);
    let attacked = run(Flood::DeepWaits, true);
    assert_withstood(Flood::DeepWaits, &baseline, &attacked);
}
