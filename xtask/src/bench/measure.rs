//! What a process and a BPF program used: CPU time, memory, BPF run time and run count.

use std::collections::BTreeSet;
use std::fs;
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context as _, Result};

/// A process's CPU time in seconds: the nanoseconds each live thread ran
/// (`/proc/PID/task/TID/schedstat`, first field), not /proc/PID/stat's 10 ms ticks, which
/// cannot tell 0.1% of a core from 0.3% over a short window. Threads that exited are not
/// counted: the daemon's threads live as long as it does.
pub(super) fn process_cpu_seconds(pid: u32) -> Result<f64> {
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

/// CPU time in seconds of a process's live threads whose name (`comm`) starts with `prefix`,
/// as [`process_cpu_seconds`] counts it.
pub(super) fn threads_cpu_seconds(pid: u32, prefix: &str) -> Result<f64> {
    let tasks = format!("/proc/{pid}/task");
    let mut nanos: u64 = 0;
    for entry in fs::read_dir(&tasks).with_context(|| format!("listing {tasks}"))? {
        let dir = entry?.path();
        // A thread may end between the listing and the reads.
        let (Ok(comm), Ok(text)) = (
            fs::read_to_string(dir.join("comm")),
            fs::read_to_string(dir.join("schedstat")),
        ) else {
            continue;
        };
        if !comm.starts_with(prefix) {
            continue;
        }
        let ran: u64 = text
            .split_whitespace()
            .next()
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("malformed {}/schedstat", dir.display()))?;
        nanos += ran;
    }
    Ok(nanos as f64 / 1e9)
}

/// System (kernel mode) CPU time in seconds of a process's live threads whose name starts with
/// `prefix`: the `stime` field of /proc/PID/task/TID/stat. The kernel splits a thread's run time
/// between user and system at its timer ticks, so this is a sampled figure, and in clock ticks
/// (`sysconf(_SC_CLK_TCK)`, 10 ms): read over seconds, and summed over windows.
pub(super) fn threads_system_seconds(pid: u32, prefix: &str) -> Result<f64> {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks_per_second <= 0 {
        bail!("sysconf(_SC_CLK_TCK) failed");
    }
    let tasks = format!("/proc/{pid}/task");
    let mut ticks: u64 = 0;
    for entry in fs::read_dir(&tasks).with_context(|| format!("listing {tasks}"))? {
        let path = entry?.path().join("stat");
        // A thread may end between the listing and the read.
        let Ok(stat) = fs::read_to_string(&path) else {
            continue;
        };
        // "TID (COMM) STATE ...": the name may hold spaces and parentheses, so fields are
        // counted from the last ')'; stime is field 15, the 13th after the name.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            bail!("malformed {}", path.display());
        };
        if !stat[open + 1..close].starts_with(prefix) {
            continue;
        }
        let stime: u64 = stat[close + 1..]
            .split_whitespace()
            .nth(12)
            .and_then(|field| field.parse().ok())
            .with_context(|| format!("malformed {}", path.display()))?;
        ticks += stime;
    }
    Ok(ticks as f64 / ticks_per_second as f64)
}

/// Peak resident set size (VmHWM) in MB (10^6 bytes, the unit of the target).
pub(super) fn peak_rss_mb(pid: u32) -> Result<f64> {
    status_mb(pid, "VmHWM:")
}

/// Resident set size now (VmRSS) in MB.
pub(super) fn rss_mb(pid: u32) -> Result<f64> {
    status_mb(pid, "VmRSS:")
}

/// A `kB` field of /proc/PID/status, in MB.
pub(super) fn status_mb(pid: u32, field: &str) -> Result<f64> {
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
pub(super) struct BpfStats {
    pub(super) run_time_ns: u64,
    pub(super) run_cnt: u64,
}

pub(super) fn bpftool_prog(id: u32) -> Result<serde_json::Value> {
    let text = super::super::output(Command::new("bpftool").args([
        "prog",
        "show",
        "id",
        &id.to_string(),
        "--json",
    ]))?;
    serde_json::from_str(&text).with_context(|| format!("parsing bpftool's JSON for program {id}"))
}

pub(super) fn bpf_stats(id: u32) -> Result<BpfStats> {
    let prog = bpftool_prog(id)?;
    // bpftool leaves both fields out while they are zero.
    let field = |name: &str| prog.get(name).and_then(|v| v.as_u64()).unwrap_or(0);
    Ok(BpfStats {
        run_time_ns: field("run_time_ns"),
        run_cnt: field("run_cnt"),
    })
}

/// The id of the daemon's BPF program called `name`, found through its file descriptors. The
/// kernel keeps 15 bytes of a program's name (bpftool may print the whole name from BTF), so
/// names are compared on those.
pub(super) fn daemon_program(daemon_pid: u32, name: &str) -> Result<u32> {
    let kept = &name[..name.len().min(BPF_NAME_BYTES)];
    let dir = format!("/proc/{daemon_pid}/fdinfo");
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        // A descriptor may close between listing and reading: skip it.
        let Ok(info) = fs::read_to_string(entry?.path()) else {
            continue;
        };
        for id in info.lines().filter_map(|l| l.strip_prefix("prog_id:")) {
            let id: u32 = id.trim().parse()?;
            let prog = bpftool_prog(id)?;
            if prog
                .get("name")
                .and_then(|n| n.as_str())
                .is_some_and(|n| n.starts_with(kept))
            {
                return Ok(id);
            }
        }
    }
    bail!("the daemon (pid {daemon_pid}) holds no {name} program")
}

/// The bytes of a BPF program's name the kernel keeps (BPF_OBJ_NAME_LEN less its NUL).
const BPF_NAME_BYTES: usize = 15;

/// The id of the daemon's perf_event program, found through the daemon's own file descriptors so
/// that BPF programs of other profilers on the machine (tests, perf) are never mistaken for it.
pub(super) fn sampling_program(daemon_pid: u32) -> Result<u32> {
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
pub(super) struct BpfStatsEnabled {
    previous: String,
}

pub(super) const BPF_STATS_SYSCTL: &str = "/proc/sys/kernel/bpf_stats_enabled";

impl BpfStatsEnabled {
    pub(super) fn switch_on() -> Result<Self> {
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

/// Turns the kernel's BPF run-time statistics off until dropped (the bench keeps them on): they
/// cost two clock reads per program run, which matters where a program runs in a measured
/// program's critical path (a context switch, an allocation hook).
pub(super) struct BpfStatsPaused;

impl BpfStatsPaused {
    pub(super) fn pause() -> Result<Self> {
        fs::write(BPF_STATS_SYSCTL, "0")
            .with_context(|| format!("pausing BPF statistics ({BPF_STATS_SYSCTL})"))?;
        Ok(Self)
    }
}

impl Drop for BpfStatsPaused {
    fn drop(&mut self) {
        let _ = fs::write(BPF_STATS_SYSCTL, "1");
    }
}

/// A profiler process's CPU time and its BPF program's run time at one moment.
#[derive(Clone, Copy)]
pub(super) struct CpuReading {
    pub(super) at: Instant,
    pub(super) process_seconds: f64,
    pub(super) bpf: BpfStats,
}

/// CPU used between two readings, in cores (1.0 = one core busy all the time).
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct CpuUse {
    pub(super) seconds: f64,
    pub(super) process_cores: f64,
    pub(super) bpf_cores: f64,
    pub(super) bpf_runs: u64,
    pub(super) bpf_ns_per_run: f64,
}

impl CpuReading {
    pub(super) fn since(&self, earlier: &CpuReading) -> CpuUse {
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
