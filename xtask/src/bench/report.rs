//! The report: the machine it ran on, each section's rows of the table, and the Markdown written
//! to `docs/benchmarks.md` or `target/bench/`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;

use anyhow::{Context as _, Result};

use super::overhead::{self, Overhead};
use super::results::{AgentCost, BpfComparison, BpfCosts, CostRun};
use super::scenarios::Jdk;
use super::statistics::{median, min_max, thousands, CpuFit};
use super::table::{verdict, write_rows, Row};
use super::{
    alloc, export, lock, off_cpu, Plan, COST_INTERVAL_SECS, MAX_HZ, QUICK, SMALL_JVMS,
    SMALL_JVM_FLAGS, TARGET_HZ,
};

/// Where and on what the bench ran.
pub(super) struct Machine {
    kernel: String,
    cpu_model: String,
    cpus: usize,
    memory_gib: f64,
    jdks: Vec<(u32, String)>,
    revision: String,
    load_at_start: String,
}

impl Machine {
    pub(super) fn describe(root: &Path, jdks: &[Jdk]) -> Result<Self> {
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
        let revision = super::super::output(
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
pub(super) fn load_average() -> Result<String> {
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

/// What `--section bpf` measured.
pub(super) enum BpfResult {
    Single(BpfCosts),
    Compared {
        baseline: PathBuf,
        rows: Vec<BpfComparison>,
    },
}

/// Section 2 run alone.
pub(super) struct BpfReport {
    pub(super) machine: Machine,
    pub(super) plan: Plan,
    pub(super) minutes: f64,
    pub(super) load_at_end: String,
    pub(super) cpus: usize,
    pub(super) result: BpfResult,
}

impl BpfReport {
    pub(super) fn to_markdown(&self) -> String {
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

pub(super) struct Report {
    pub(super) machine: Machine,
    pub(super) plan: Plan,
    pub(super) minutes: f64,
    pub(super) load_at_end: String,
    pub(super) cpus: usize,
    pub(super) overhead: Vec<Overhead>,
    pub(super) bpf: BpfCosts,
    pub(super) runs: Vec<CostRun>,
    pub(super) agent: AgentCost,
    pub(super) export: export::ExportRun,
    pub(super) off_cpu: off_cpu::OffCpuCost,
    pub(super) alloc: alloc::AllocCost,
    pub(super) lock: lock::LockCost,
}

/// The targets.
const MAX_CHARGED_MB_1_JVM: f64 = 40.0;
const MAX_CHARGED_MB_20_JVMS: f64 = 64.0;
const MAX_DAEMON_CPU_PCT_1_JVM: f64 = 0.3;
const MAX_DAEMON_CPU_PCT_20_JVMS: f64 = 0.5;
const MAX_DAEMON_CPU_PCT_IDLE: f64 = 0.1;

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
         JIT-compiled after {warmup} s, or with `-Xint` (interpreted frames only); and \
         `Bench.java distinct`, a chain of 200 distinct methods generated by the bench and kept \
         apart (`-XX:CompileCommand=dontinline`), each its own compiled method after {warmup} s: \
         a code blob per frame, as in a framework's request stack.",
        bpf = plan.bpf_window.as_secs(),
        warmup = (plan.warmup / 2).as_secs(),
    )
}

impl Report {
    pub(super) fn to_markdown(&self) -> String {
        let mut rows = Vec::new();
        let mut notes = Vec::new();
        overhead::rows(&self.overhead, &mut rows, &mut notes);
        self.bpf_rows(&mut rows, &mut notes);
        self.cost_rows(&mut rows, &mut notes);
        self.scaling_rows(&mut rows);
        self.agent_rows(&mut rows);
        self.export.rows(&mut rows);
        self.off_cpu.rows(&mut rows, &mut notes);
        self.alloc.rows(&mut rows, &mut notes);
        self.lock.rows(&mut rows, &mut notes);

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
        let _ = writeln!(out, "{}", self.alloc.method());
        let _ = writeln!(out, "{}", self.lock.method());
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
             {export_method}\n\
             7. `xtask/bench/pingpong.c` (two threads passing a byte through two pipes, both \
             pinned to the last CPU: two context switches per round trip, each in its critical \
             path) in rounds: 3 windows of 1 s under a fresh whole-host daemon at 99 Hz without \
             `--off-cpu`, 3 more with a do-nothing BPF program on `sched_switch` (the floor any \
             program there costs), 3 under a fresh daemon with `--off-cpu` (defaults), each \
             figure the median of its windows, the daemons' and the empty program's order \
             alternating; the kernel's BPF statistics off (they add two clock reads to every \
             switch); at least {agent_pairs} rounds, more (up to three times as many) until the \
             loss's 95% interval is under a point wide. A further window with the statistics \
             on gives the run time per run of the switch program and of the empty one, and one \
             more daemon with `off_cpu_period_us` = 10 s (no stack ever taken) the cost of its \
             bookkeeping alone.\n",
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
            export_method = export::method(p.cost_window),
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
                let fit = cpu_fit(&runs)?;
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
            .and_then(|runs| cpu_fit(runs));
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

/// The daemon's CPU fitted against its sample rate over `runs`.
fn cpu_fit(runs: &[&CostRun]) -> Option<CpuFit> {
    let points: Vec<(f64, f64)> = runs
        .iter()
        .map(|run| (run.records_per_second, run.cpu.process_cores))
        .collect();
    CpuFit::of(&points)
}

fn cpu_note(run: &CostRun, runs: &[CostRun]) -> String {
    let series: Vec<&CostRun> = runs
        .iter()
        .filter(|r| {
            r.scenario.jvms == run.scenario.jvms && r.scenario.busy_cpus == run.scenario.busy_cpus
        })
        .collect();
    let split = match cpu_fit(&series) {
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
