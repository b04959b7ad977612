//! Section 1: what profiling costs the profiled program, with a confidence interval.
//!
//! On this kind of machine (a 2-vCPU VM) a CPU-bound program's rate drifts by 3-5% from one
//! second to the next whatever is running, at every time scale measured (0.2 to 4 s windows),
//! and per CPU-second as much as per second: the host's neighbours, not our process. Comparing
//! a run with a freshly started profiler against a run without one cannot see a 0.5% cost
//! through that.
//!
//! So the profiler is started once per setting and its sampling of the workload switched on and
//! off many times ([`SamplingSwitch`]: our daemon through its BPF map of target pids, `perf
//! record` through its control fifos). A pair is two
//! adjacent windows, one on and one off (their order alternates), each a whole number of the
//! workload's own 100 ms reports long, switched as a report arrives. The loss of a pair is
//! `1 - on/off`; hundreds of short pairs give a mean whose 95% confidence interval is narrow,
//! because drift slower than a pair cancels within it. The same switch works for `perf record`,
//! the peer.
//!
//! What it measures is the cost in the program's own time: the sampling interrupts, the BPF
//! program run in them, what they do to its caches, and the daemon's per-sample work when it
//! preempts the program. The daemon's background work (the JVM tracker, profile building) runs
//! whether sampling is on or not: section 3 measures it.

use std::fs::{self, File};
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::path::Path;

use anyhow::{bail, Context as _, Result};

use super::measure::CpuReading;
use super::processes::Workload;
use super::scenarios::{Bench, Profiler, Program, Running};
use super::statistics::{mean_ci95, median, min_max, thousands};
use super::table::{verdict, Row};
use super::{FREQUENCIES, TARGET_HZ};

/// The most the profiled program may lose at 99 Hz (median of the pairs), in %.
const MAX_LOSS_PCT: f64 = 0.5;
/// The widest 95% confidence interval of the mean loss that tells 0.5% from 1%, in points.
const MAX_CI_WIDTH_PP: f64 = 1.0;

pub(super) struct Overhead {
    pub program: Program,
    pub threads: usize,
    /// The program's rate in the windows without sampling of the target setting, ops/s.
    pub baseline_ops: Vec<f64>,
    pub settings: Vec<SettingOverhead>,
}

pub(super) struct SettingOverhead {
    pub profiler: Profiler,
    /// Throughput lost in each pair's sampling window against its other window, in %.
    pub losses: Vec<f64>,
    /// CPU the profiler used in % of the machine: its BPF program while sampling, and its
    /// process over the whole measurement (sampling half of it).
    pub bpf_pct: f64,
    pub process_pct: f64,
}

impl SettingOverhead {
    fn median_loss(&self) -> f64 {
        median(self.losses.iter().copied())
    }
}

impl Bench {
    pub(super) fn measure_overheads(&self) -> Result<Vec<Overhead>> {
        let mut programs: Vec<Program> = self.jdks.iter().cloned().map(Program::Java).collect();
        programs.push(Program::Native);
        programs
            .iter()
            .map(|program| self.measure_overhead(program))
            .collect()
    }

    fn measure_overhead(&self, program: &Program) -> Result<Overhead> {
        let mut settings: Vec<Profiler> = FREQUENCIES.map(Profiler::Daemon).to_vec();
        settings.push(Profiler::Perf(TARGET_HZ));
        let jvms = usize::from(matches!(program, Program::Java(_)));
        let workload = self.start_throughput(program, self.cpus)?;
        std::thread::sleep(self.plan.warmup);

        let mut baseline_ops = Vec::new();
        let mut results = Vec::new();
        for profiler in settings {
            let pairs = if profiler == Profiler::Daemon(TARGET_HZ) {
                self.plan.switched_pairs_at_target
            } else {
                self.plan.switched_pairs
            };
            let running = self.attach(profiler, &workload, jvms)?;
            let mut switch = match &running {
                Running::Daemon(daemon) => {
                    SamplingSwitch::for_daemon(daemon.process.pid(), workload.pid())
                }
                Running::Perf(_) => {
                    let (control, ack) = self.perf_control_fifos();
                    SamplingSwitch::for_perf(&control, &ack)
                }
                Running::Off => bail!("no profiler to switch"),
            }
            .with_context(|| format!("switching {}", profiler.label()))?;
            let before = self.cpu_reading(&running)?;
            let switched = switch_pairs(&workload, &mut switch, pairs, self.plan.switched_reports)?;
            let after = self.cpu_reading(&running)?;
            // Killed, not stopped: their output is not used (section 3 measures a full run).
            drop(switch);
            drop(running);

            let (bpf_pct, process_pct) = match (before, after) {
                (Some(before), Some(after)) => cpu_used(&before, &after, &switched, self.cpus),
                _ => (0.0, 0.0),
            };
            let setting = SettingOverhead {
                profiler,
                losses: switched.losses(),
                bpf_pct,
                process_pct,
            };
            let (mean, half) = mean_ci95(&setting.losses);
            self.progress(format_args!(
                "1. {}, {}: loss median {:.2}%, mean {mean:.2}% +- {half:.2} over {} pairs",
                program.label(),
                profiler.label(),
                setting.median_loss(),
                setting.losses.len()
            ));
            if profiler == Profiler::Daemon(TARGET_HZ) {
                baseline_ops = switched.pairs.iter().map(|pair| pair.off).collect();
            }
            results.push(setting);
        }
        Ok(Overhead {
            program: program.clone(),
            threads: self.cpus,
            baseline_ops,
            settings: results,
        })
    }
}

/// One pair of adjacent windows: the program's rate with sampling on and off, ops/s.
struct Pair {
    on: f64,
    off: f64,
}

struct Switched {
    pairs: Vec<Pair>,
    /// Seconds sampling was on, and in all.
    on_seconds: f64,
    seconds: f64,
}

impl Switched {
    fn losses(&self) -> Vec<f64> {
        self.pairs
            .iter()
            .map(|pair| (1.0 - pair.on / pair.off) * 100.0)
            .collect()
    }
}

/// `pairs` pairs of windows `reports` reports long, sampling on first in every other pair, so
/// that a steady drift adds as much to the off windows as to the on ones.
fn switch_pairs(
    workload: &Workload,
    switch: &mut SamplingSwitch,
    pairs: usize,
    reports: u64,
) -> Result<Switched> {
    let mut measured = Vec::with_capacity(pairs);
    let (mut on_nanos, mut all_nanos) = (0u64, 0u64);
    let mut start = workload.report_after(1)?;
    let mut sampling = true;
    for index in 0..pairs {
        let mut pair = Pair { on: 0.0, off: 0.0 };
        for on in [index % 2 == 0, index % 2 == 1] {
            if on != sampling {
                switch.switch(on)?;
                sampling = on;
            }
            let end = workload.report_after(reports)?;
            let nanos = end.nanos.saturating_sub(start.nanos);
            all_nanos += nanos;
            if on {
                on_nanos += nanos;
                pair.on = start.rate_until(&end);
            } else {
                pair.off = start.rate_until(&end);
            }
            start = end;
        }
        measured.push(pair);
    }
    if !sampling {
        switch.switch(true)?;
    }
    Ok(Switched {
        pairs: measured,
        on_seconds: on_nanos as f64 / 1e9,
        seconds: all_nanos as f64 / 1e9,
    })
}

/// CPU the profiler used, in % of the machine: its BPF program per second of sampling, and
/// its process per second of the whole measurement.
fn cpu_used(
    before: &CpuReading,
    after: &CpuReading,
    switched: &Switched,
    cpus: usize,
) -> (f64, f64) {
    let used = after.since(before);
    let machine_pct = |cores: f64| cores / cpus as f64 * 100.0;
    let bpf_seconds = used.bpf_cores * used.seconds;
    (
        machine_pct(bpf_seconds / switched.on_seconds.max(1e-9)),
        machine_pct(used.process_cores * used.seconds / switched.seconds.max(1e-9)),
    )
}

/// Switches one profiler's sampling of the workload on and off while it runs.
enum SamplingSwitch {
    /// Our daemon samples `--pid` targets listed in its BPF map `TARGET_PIDS`: taking the
    /// workload out of it sends its samples down the program's short filtered path (section 2:
    /// about 0.4 us, 0.004% of the machine at 99 Hz), putting it back samples it again. The map
    /// is reached through a duplicate of the daemon's descriptor (`pidfd_getfd`).
    Daemon { targets: OwnedFd, pid: u32 },
    /// `perf record --control`: "enable" and "disable" through its fifos, each acknowledged.
    Perf { control: File, ack: File },
}

/// `TARGET_PIDS`'s value type in the BPF program (`HashMap<u32, u8>`).
const TARGET_PRESENT: u8 = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// Where `struct bpf_map_info` holds the map's name (after type, id, key and value sizes,
/// max_entries and flags), and the name's size.
const MAP_INFO_NAME_OFFSET: usize = 24;
const MAP_NAME_BYTES: usize = 16;
/// How long perf may take to acknowledge a command.
const ACK_TIMEOUT_MS: libc::c_int = 2000;

impl SamplingSwitch {
    fn for_daemon(daemon_pid: u32, workload_pid: u32) -> Result<Self> {
        let targets = daemon_map(daemon_pid, "TARGET_PIDS")?;
        Ok(Self::Daemon {
            targets,
            pid: workload_pid,
        })
    }

    fn for_perf(control: &Path, ack: &Path) -> Result<Self> {
        // Read and write: opening a fifo so never waits for the other side.
        let open = |path: &Path| {
            fs::OpenOptions::new()
                .read(true)
                .write(true)
                .open(path)
                .with_context(|| format!("opening {}", path.display()))
        };
        Ok(Self::Perf {
            control: open(control)?,
            ack: open(ack)?,
        })
    }

    /// Sampling on or off; the windows of two adjacent pairs share a state (on-off, off-on),
    /// so the caller skips a switch to the state already set.
    fn switch(&mut self, on: bool) -> Result<()> {
        match self {
            Self::Daemon { targets, pid } => {
                let key = *pid;
                let value = TARGET_PRESENT;
                // Map fd, key pointer, then (an update only: the kernel wants the rest zero
                // for a delete) value pointer and flags (0: insert or replace).
                let mut attr = [0u64; 4];
                attr[0] = targets.as_raw_fd() as u64;
                attr[1] = &key as *const u32 as u64;
                let command = if on {
                    attr[2] = &value as *const u8 as u64;
                    BPF_MAP_UPDATE_ELEM
                } else {
                    BPF_MAP_DELETE_ELEM
                };
                // SAFETY: a bpf_attr for an element command, its pointers to locals that outlive
                // the call.
                let result = unsafe {
                    libc::syscall(
                        libc::SYS_bpf,
                        command,
                        attr.as_mut_ptr(),
                        size_of_val(&attr),
                    )
                };
                if result != 0 {
                    bail!(
                        "switching the daemon's TARGET_PIDS: {}",
                        std::io::Error::last_os_error()
                    );
                }
                Ok(())
            }
            Self::Perf { control, ack } => {
                control.write_all(if on { b"enable\n" } else { b"disable\n" })?;
                let mut poll = libc::pollfd {
                    fd: ack.as_raw_fd(),
                    events: libc::POLLIN,
                    revents: 0,
                };
                // SAFETY: one pollfd, owned here.
                if unsafe { libc::poll(&mut poll, 1, ACK_TIMEOUT_MS) } != 1 {
                    bail!("perf record did not acknowledge a control command");
                }
                let mut reply = [0u8; 16];
                let read = ack.read(&mut reply)?;
                if !reply[..read].starts_with(b"ack") {
                    bail!(
                        "perf record answered {:?}",
                        String::from_utf8_lossy(&reply[..read])
                    );
                }
                Ok(())
            }
        }
    }
}

/// A duplicate of the descriptor of process `pid`'s BPF map called `name`.
fn daemon_map(pid: u32, name: &str) -> Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags; the result is checked before use.
    let pidfd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::c_int, 0) };
    if pidfd < 0 {
        bail!("pidfd_open({pid}): {}", std::io::Error::last_os_error());
    }
    // SAFETY: a new descriptor owned by nobody else.
    let pidfd = unsafe { OwnedFd::from_raw_fd(pidfd as RawFd) };
    let dir = format!("/proc/{pid}/fd");
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {dir}"))? {
        let entry = entry?;
        let is_map = fs::read_link(entry.path())
            .is_ok_and(|target| target.to_string_lossy() == "anon_inode:bpf-map");
        let Some(number) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<i32>().ok())
        else {
            continue;
        };
        if !is_map {
            continue;
        }
        // SAFETY: pidfd_getfd takes a pidfd, a descriptor number in that process and flags.
        let fd = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), number, 0) };
        if fd < 0 {
            continue; // closed since it was listed
        }
        // SAFETY: a new descriptor owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        if map_name(&fd)? == name {
            return Ok(fd);
        }
    }
    bail!("process {pid} holds no BPF map {name}")
}

fn map_name(fd: &OwnedFd) -> Result<String> {
    let mut info = [0u8; 128];
    let mut attr = [0u64; 2];
    attr[0] = fd.as_raw_fd() as u64 | ((info.len() as u64) << 32);
    attr[1] = info.as_mut_ptr() as u64;
    // SAFETY: a bpf_attr for BPF_OBJ_GET_INFO_BY_FD (fd, info length, pointer to `info`).
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            size_of_val(&attr),
        )
    };
    if result != 0 {
        bail!(
            "reading a BPF map's info: {}",
            std::io::Error::last_os_error()
        );
    }
    let name = &info[MAP_INFO_NAME_OFFSET..MAP_INFO_NAME_OFFSET + MAP_NAME_BYTES];
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    Ok(String::from_utf8_lossy(&name[..end]).into_owned())
}

pub(super) fn rows(overheads: &[Overhead], rows: &mut Vec<Row>, notes: &mut Vec<String>) {
    for overhead in overheads {
        let measurement = format!(
            "throughput, {} ({} threads)",
            overhead.program.label(),
            overhead.threads
        );
        let (lo, hi) = min_max(&overhead.baseline_ops);
        rows.push(Row {
            section: "1",
            measurement: measurement.clone(),
            setting: Profiler::Off.label(),
            result: format!(
                "{} ops/s (median of the windows without sampling at {TARGET_HZ} Hz; {} to {})",
                thousands(median(overhead.baseline_ops.iter().copied())),
                thousands(lo),
                thousands(hi)
            ),
            target: String::new(),
        });
        for setting in &overhead.settings {
            let loss = setting.median_loss();
            let (mean, half) = mean_ci95(&setting.losses);
            let cpu_used = match setting.profiler {
                Profiler::Perf(_) => format!("perf process {:.2}%", setting.process_pct),
                _ => format!(
                    "BPF {:.2}% while sampling, daemon {:.2}% over the run",
                    setting.bpf_pct, setting.process_pct
                ),
            };
            let checked = setting.profiler == Profiler::Daemon(TARGET_HZ);
            let loss_met = loss <= MAX_LOSS_PCT;
            let ci_met = 2.0 * half < MAX_CI_WIDTH_PP;
            rows.push(Row {
                section: "1",
                measurement: measurement.clone(),
                setting: setting.profiler.label(),
                result: format!(
                    "loss {loss:.2}% (median of {} pairs); mean {mean:.2}%, 95% CI {:.2} to {:.2} \
                     (width {:.2} pp); CPU used: {cpu_used}",
                    setting.losses.len(),
                    mean - half,
                    mean + half,
                    2.0 * half
                ),
                target: if checked {
                    format!(
                        "{}; {}",
                        verdict(loss_met, &format!("median <= {MAX_LOSS_PCT}%")),
                        verdict(ci_met, &format!("CI < {MAX_CI_WIDTH_PP} pp"))
                    )
                } else {
                    String::new()
                },
            });
            if checked && !(loss_met && ci_met) {
                notes.push(note(&overhead.program, setting, mean, half));
            }
        }
    }
}

fn note(program: &Program, setting: &SettingOverhead, mean: f64, half: f64) -> String {
    let loss = setting.median_loss();
    let used = setting.bpf_pct;
    let cause = if 2.0 * half >= MAX_CI_WIDTH_PP {
        format!(
            "the 95% confidence interval ({:.2} to {:.2}) is {:.2} points wide: the machine was \
             noisier than the pairs can average out; more pairs would narrow it",
            mean - half,
            mean + half,
            2.0 * half
        )
    } else if used >= loss / 2.0 {
        format!(
            "the BPF program's run time in the profiled threads ({used:.2}% of the machine while \
             sampling; see section 2) is most of it: cheaper unwinding per sample would fix it"
        )
    } else {
        format!(
            "the BPF program's run time ({used:.2}% of the machine) explains less than half of \
             it: the rest is the sampling interrupts and what they do to the program's caches, \
             or the daemon's per-sample work preempting it (section 3)"
        )
    };
    format!(
        "{} at {}: median loss {loss:.2}%; {cause}.",
        program.label(),
        setting.profiler.label()
    )
}
