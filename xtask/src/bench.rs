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
//! 7. Off-CPU profiling: a context-switch-heavy program's throughput without and with it, with
//!    a do-nothing program on the same hook for the floor ([`switch_floor`]), and the BPF run
//!    time per switch ([`off_cpu`]).
//! 8. Allocation profiling: an allocation-heavy JVM's throughput without and with `--alloc`, the
//!    hooks' hits per second and their cost per hit, split on small TLABs into a cost per hit
//!    and per stack taken with the default interval and a small one ([`alloc`]).
//!
//! 10. Only with `--section soak`: the daemon's memory over an hour (`--soak-minutes`) of
//!     whole-host profiling with process churn, read every minute ([`soak`]).
//!
//! Every figure is measured and compared with the targets; nothing is asserted.
//!
//! `--section bpf` runs section 2 alone (written to `target/bench/`); with `--baseline-daemon
//! PATH` it measures an older daemon binary, and so the BPF program it embeds, side by side with
//! this one in alternating windows on the same workload processes, and prints the ratios.
//! `--section off-cpu` with `--baseline-daemon PATH` puts the older build's switch program in
//! the same rounds as this one's.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

// The tests' memory cgroup helper and /metrics client, shared by path: xtask does not depend on
// the tests crate. Only part of the cgroup helper is used here.
#[path = "../../tests/src/cgroup.rs"]
#[allow(dead_code)]
mod cgroup;
#[path = "../../tests/src/metrics_endpoint.rs"]
mod metrics_endpoint;
// The daemon's bare bpf(2) wrapper, for section 7's do-nothing program; shared by path too.
#[path = "../../profiler-daemon/src/bpf_syscall.rs"]
#[allow(dead_code)]
mod bpf_syscall;

use anyhow::{bail, Context as _, Result};

mod alloc;
mod daemon;
mod export;
mod jvms;
mod lock;
mod measure;
mod off_cpu;
mod overhead;
mod processes;
mod report;
mod results;
mod scenarios;
mod soak;
mod statistics;
mod switch_floor;
mod table;

use measure::BpfStatsEnabled;
use report::{load_average, BpfReport, BpfResult, Machine, Report};
use scenarios::Bench;
use table::{write_rows, Row};

/// Debian packages the bench runs (binary, package).
const BENCH_PACKAGES: &[(&str, &str)] = &[("perf", "linux-perf"), ("bpftool", "bpftool")];

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

/// Sections 1 and 2: the daemon's default interval, so that windows fall between profile writes
/// (what building profiles costs is measured in section 3).
const SAMPLING_INTERVAL_SECS: u32 = 15;
/// Sections 3 and 4: a profile every 5 s, three times the default rate, so every window holds
/// profile builds.
const COST_INTERVAL_SECS: u32 = 15;

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
    /// on the same workload processes. Needs `--section bpf`, or `--section export`: the daemon's
    /// CPU and memory exporting to Pyroscope and OTLP at once, side by side; or `--section
    /// jvms`: its CPU with 20 small JVMs; or `--section off-cpu`: the ping-pong's loss under
    /// both builds' switch programs, in the same rounds.
    #[arg(long, value_name = "PATH", requires = "section")]
    baseline_daemon: Option<PathBuf>,
    /// How long section 10 (`--section soak`) runs.
    #[arg(long, value_name = "MINUTES", default_value_t = 60)]
    soak_minutes: u64,
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
    /// 6: what exporting to Pyroscope and OTLP costs, side by side.
    Export,
    /// 3, side by side: the daemon's CPU with 20 small JVMs, writing into an empty output
    /// directory and into one holding a day's files (needs `--baseline-daemon`).
    Jvms,
    /// 7: what off-CPU profiling costs a program that switches often.
    OffCpu,
    /// 8: what allocation profiling costs a program that allocates about 1 GB/s.
    Alloc,
    /// 9: what lock profiling costs a program that switches often and one whose threads
    /// contend for locks.
    Lock,
    /// 10: the daemon's memory over a long whole-host run with process churn (`--soak-minutes`;
    /// not part of the full run, which it would make an hour longer).
    Soak,
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
    /// Section 8: the window per setting (`pairs` rounds on the realistic program), and the
    /// rounds on small TLABs (whose windows are half as long).
    alloc_window: Duration,
    alloc_small_tlab_rounds: usize,
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
    alloc_window: Duration::from_secs(8),
    alloc_small_tlab_rounds: 2,
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
    alloc_window: Duration::from_secs(4),
    alloc_small_tlab_rounds: 1,
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
        Some(Section::Alloc) => return run_alloc_section(&bench, args),
        Some(Section::Lock) => return run_lock_section(&bench, args),
        Some(Section::Export) => return run_export_section(&bench, args),
        Some(Section::Soak) => return run_soak_section(&bench, args),
        Some(Section::Jvms) => return run_jvms_section(&bench, args),
        None => {}
    }

    let overhead = bench.measure_overheads()?;
    let bpf = bench.measure_bpf_costs()?;
    let (runs, export) = bench.measure_daemon_costs(|bench, pids| bench.measure_export(pids))?;
    let agent = bench.measure_agent_cost()?;
    let off_cpu = bench.measure_off_cpu_cost(None)?;
    let alloc = bench.measure_alloc_cost()?;
    let lock = bench.measure_lock_cost()?;

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
        alloc,
        lock,
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
    // The sections people keep by hand (readings of runs, side-by-side comparisons) stay.
    let kept = fs::read_to_string(&path)
        .map(|old| kept_by_hand(&old).to_owned())
        .unwrap_or_default();
    let markdown = if kept.is_empty() {
        markdown
    } else {
        format!("{}\n\n{kept}", markdown.trim_end())
    };
    fs::write(&path, markdown).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("bench: wrote {}", path.display());
    Ok(())
}

/// The part of a benchmarks file from its first section kept by hand (a `## ` heading that
/// says "kept by hand") to its end; empty if there is none.
fn kept_by_hand(text: &str) -> &str {
    let mut at = 0;
    for line in text.split_inclusive('\n') {
        if line.starts_with("## ") && line.contains("(kept by hand)") {
            return &text[at..];
        }
        at += line.len();
    }
    ""
}

/// Section 7 alone; written to target/bench/.
fn run_off_cpu_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    if let Some(baseline) = args.baseline_daemon.as_deref().filter(|b| !b.is_file()) {
        bail!("no baseline daemon at {}", baseline.display());
    }
    let cost = bench.measure_off_cpu_cost(args.baseline_daemon.as_deref())?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    cost.rows(&mut rows, &mut notes);
    write_section(bench, args, "off-cpu", &rows, &notes, "")
}

/// Section 8 alone; written to target/bench/.
fn run_alloc_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let cost = bench.measure_alloc_cost()?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    cost.rows(&mut rows, &mut notes);
    let method = format!("\n## How it measures\n\n{}\n", cost.method());
    write_section(bench, args, "alloc", &rows, &notes, &method)
}

/// Section 9 alone; written to target/bench/.
fn run_lock_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let cost = bench.measure_lock_cost()?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    cost.rows(&mut rows, &mut notes);
    let method = format!("\n## How it measures\n\n{}\n", cost.method());
    write_section(bench, args, "lock", &rows, &notes, &method)
}

/// Section 10, which only runs alone; written to target/bench/.
fn run_soak_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let soak = bench.measure_soak(args.soak_minutes)?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    soak.rows(&mut rows, &mut notes);
    let method = format!(
        "\n## Readings\n\n{}\n## How it measures\n\n{}\n",
        soak.readings_table(),
        soak::method()
    );
    write_section(bench, args, "soak", &rows, &notes, &method)
}

/// Section 6 alone, with section 3's small JVMs; written to target/bench/.
fn run_export_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let mut rows = Vec::new();
    if let Some(baseline) = &args.baseline_daemon {
        if !baseline.is_file() {
            bail!("no baseline daemon at {}", baseline.display());
        }
        let compared =
            bench.with_small_jvms(|bench, pids| bench.compare_export_costs(pids, baseline))?;
        compared.rows(&mut rows);
        return write_section(bench, args, "export-vs-baseline", &rows, &[], "");
    }
    let export = bench.with_small_jvms(|bench, pids| bench.measure_export(pids))?;
    export.rows(&mut rows);
    let method = format!(
        "\n## How it measures\n\n{}\n",
        export::method(bench.plan.cost_window)
    );
    write_section(bench, args, "export", &rows, &[], &method)
}

/// Section 3's small JVMs, this build against a baseline daemon; written to target/bench/.
fn run_jvms_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let Some(baseline) = &args.baseline_daemon else {
        bail!("--section jvms compares two daemons: give --baseline-daemon PATH");
    };
    if !baseline.is_file() {
        bail!("no baseline daemon at {}", baseline.display());
    }
    let compared = bench.with_small_jvms(|bench, pids| bench.compare_jvm_costs(pids, baseline))?;
    let mut rows = Vec::new();
    compared.rows(&mut rows);
    let method = format!(
        "\n## How it measures\n\n{}\n",
        jvms::method(bench.plan.cost_window)
    );
    write_section(bench, args, "jvms-vs-baseline", &rows, &[], &method)
}

/// Section 1 alone; written to target/bench/.
fn run_overhead_section(bench: &Bench, args: &BenchArgs) -> Result<()> {
    let overheads = bench.measure_overheads()?;
    let (mut rows, mut notes) = (Vec::new(), Vec::new());
    overhead::rows(&overheads, &mut rows, &mut notes);
    write_section(bench, args, "overhead", &rows, &notes, "")
}

/// Prints a section's table (and `method`, Markdown after it) and writes them to
/// target/bench/`stem`.md (`stem`-quick.md).
fn write_section(
    bench: &Bench,
    args: &BenchArgs,
    stem: &str,
    rows: &[Row],
    notes: &[String],
    method: &str,
) -> Result<()> {
    let mut markdown = String::new();
    write_rows(&mut markdown, rows, notes);
    markdown.push_str(method);
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

#[cfg(test)]
mod tests {
    #[test]
    fn sections_kept_by_hand_are_found_from_the_first_one() {
        let text = "# Benchmarks\n| a |\n## Missed targets\nx\n## Notes (kept by hand)\ny\n\
                    ## More (kept by hand)\nz\n";
        assert_eq!(
            super::kept_by_hand(text),
            "## Notes (kept by hand)\ny\n## More (kept by hand)\nz\n"
        );
        assert_eq!(super::kept_by_hand("# Benchmarks\n## Missed targets\n"), "");
    }
}
