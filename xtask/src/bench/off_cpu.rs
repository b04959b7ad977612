//! Section 7: what off-CPU profiling costs. Two threads on one CPU ping-pong a byte through
//! pipes (every round trip is two context switches: the worst case for a program on
//! `sched_switch`); their
//! round trips per second are measured in pairs of windows under a whole-host daemon without
//! and with `--off-cpu` (its default settings), and the BPF run time of the switch
//! program per run with those settings and with stacks never taken (a period so long that no
//! switch is sampled), side by side in one run.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::daemon::Ready;
use super::measure::{bpf_stats, daemon_program, BpfStats, BpfStatsPaused};
use super::scenarios::Bench;
use super::statistics::median;
use super::table::{verdict, Row};

/// The throughput loss target at the default settings (the issue's).
const MAX_LOSS_PCT: f64 = 3.0;
/// The off-CPU switch program's name, as the kernel keeps it (15 bytes at most).
const SWITCH_PROGRAM: &str = "off_cpu_switch";

pub(super) struct OffCpuCost {
    /// Round trips per second: (without the daemon, with it), one pair per round.
    pairs: Vec<(f64, f64)>,
    /// Per run of the switch program, default settings (stacks taken as sampled).
    ns_per_switch: f64,
    /// Per run with no stack ever taken.
    ns_per_switch_unsampled: f64,
    /// Switch program runs per second with the default settings, and walks (stacks sent).
    switches_per_second: f64,
    walks_per_second: f64,
    window: Duration,
}

/// Runs the workload for `window` and returns its round trips per second.
pub(super) fn round_trips(binary: &Path, window: Duration) -> Result<f64> {
    let output =
        super::super::output(Command::new(binary).arg(format!("{:.1}", window.as_secs_f64())))?;
    output
        .trim()
        .parse()
        .with_context(|| format!("ping-pong printed {output:?}"))
}

/// The daemon's off-CPU switch program, through its file descriptors.
fn switch_program(daemon_pid: u32) -> Result<u32> {
    daemon_program(daemon_pid, SWITCH_PROGRAM)
}

impl Bench {
    pub(super) fn measure_off_cpu_cost(&self, binary: &Path) -> Result<OffCpuCost> {
        let window = self.plan.window;
        let mut pairs = Vec::new();
        let (mut ns_per_switch, mut switches_per_second, mut walks_per_second) =
            (Vec::new(), Vec::new(), Vec::new());
        for round in 0..self.plan.pairs {
            self.progress(format_args!("off-CPU cost: round {}", round + 1));
            // The same daemon without off-CPU profiling is the baseline, so that the pair
            // differs by off-CPU profiling alone; which side goes first alternates (drift).
            let mut without = 0.0;
            if round % 2 == 0 {
                without = self.round_trips_under_cpu_daemon(binary, window)?;
            }
            let daemon = self.start_daemon(
                99,
                15,
                &[],
                Ready::Sampling { jvms: 0 },
                &["--off-cpu".to_owned()],
            )?;
            let program = switch_program(daemon.process.pid())?;
            // The kernel's run-time statistics cost two clock reads per program run, a cost
            // of their own on every switch: off while throughput is measured.
            let with = {
                let _off = BpfStatsPaused::pause()?;
                round_trips(binary, window)?
            };
            let before: BpfStats = bpf_stats(program)?;
            let sampled_before = daemon.fresh_metrics()?.get(SAMPLED)?;
            round_trips(binary, window)?;
            let after = bpf_stats(program)?;
            let sampled_after = daemon.fresh_metrics()?.get(SAMPLED)?;
            daemon.stop()?;
            if round % 2 == 1 {
                without = self.round_trips_under_cpu_daemon(binary, window)?;
            }
            let runs = after.run_cnt.saturating_sub(before.run_cnt) as f64;
            let nanos = after.run_time_ns.saturating_sub(before.run_time_ns) as f64;
            ns_per_switch.push(nanos / runs.max(1.0));
            switches_per_second.push(runs / window.as_secs_f64());
            walks_per_second.push((sampled_after - sampled_before) / window.as_secs_f64());
            pairs.push((without, with));
        }
        // Stacks never taken: the cost of the bookkeeping alone.
        let daemon = self.start_daemon(
            99,
            15,
            &[],
            Ready::Sampling { jvms: 0 },
            &[
                "--off-cpu".to_owned(),
                "--config".to_owned(),
                self.never_sampled_config()?.display().to_string(),
            ],
        )?;
        let program = switch_program(daemon.process.pid())?;
        let before = bpf_stats(program)?;
        round_trips(binary, window)?;
        let after = bpf_stats(program)?;
        daemon.stop()?;
        let ns_per_switch_unsampled = after.run_time_ns.saturating_sub(before.run_time_ns) as f64
            / (after.run_cnt.saturating_sub(before.run_cnt) as f64).max(1.0);
        Ok(OffCpuCost {
            pairs,
            ns_per_switch: median(ns_per_switch.into_iter()),
            ns_per_switch_unsampled,
            switches_per_second: median(switches_per_second.into_iter()),
            walks_per_second: median(walks_per_second.into_iter()),
            window,
        })
    }

    /// Round trips per second under a whole-host daemon without off-CPU profiling (its CPU
    /// sampling at 99 Hz, as with it).
    fn round_trips_under_cpu_daemon(&self, binary: &Path, window: Duration) -> Result<f64> {
        let daemon = self.start_daemon(99, 15, &[], Ready::Sampling { jvms: 0 }, &[])?;
        let rate = {
            let _off = BpfStatsPaused::pause()?;
            round_trips(binary, window)
        };
        daemon.stop()?;
        rate
    }

    /// A config whose period is so long that only a thread's first switch is sampled.
    fn never_sampled_config(&self) -> Result<PathBuf> {
        let path = self.work_dir.join("off-cpu-unsampled.toml");
        fs::write(&path, "off_cpu_period_us = 10000000\n")
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

const SAMPLED: &str = profiler_common::metric::OFF_CPU_WAITS_SAMPLED;

impl OffCpuCost {
    pub(super) fn rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        let losses: Vec<f64> = self
            .pairs
            .iter()
            .map(|(without, with)| (1.0 - with / without) * 100.0)
            .collect();
        let loss = median(losses.iter().copied());
        rows.push(Row {
            section: "7",
            measurement: "ping-pong throughput lost to off-CPU profiling".into(),
            setting: format!(
                "2 threads on one CPU through pipes, {} pairs of {:.0} s windows: whole-host daemon at 99 Hz without and with `--off-cpu` (defaults)",
                self.pairs.len(),
                self.window.as_secs_f64()
            ),
            result: format!(
                "{loss:.1}% (median of pairs: {}; {:.0} -> {:.0} round trips/s)",
                losses
                    .iter()
                    .map(|l| format!("{l:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                median(self.pairs.iter().map(|p| p.0)),
                median(self.pairs.iter().map(|p| p.1))
            ),
            target: verdict(loss <= MAX_LOSS_PCT, &format!("<= {MAX_LOSS_PCT}%")),
        });
        rows.push(Row {
            section: "7",
            measurement: "BPF run time per context switch".into(),
            setting: format!(
                "{:.0} switches/s, {:.0} stacks taken/s",
                self.switches_per_second, self.walks_per_second
            ),
            result: format!(
                "{:.0} ns with the default period; {:.0} ns when no stack is taken",
                self.ns_per_switch, self.ns_per_switch_unsampled
            ),
            target: "-".into(),
        });
        if loss > MAX_LOSS_PCT {
            notes.push(format!(
                "7: ping-pong throughput lost {loss:.1}% (per pair: {}). Every switch of the host \
                 runs the switch program (its run time is in the next row), and this workload \
                 puts two of them in each round trip's critical path.",
                losses
                    .iter()
                    .map(|l| format!("{l:.1}%"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
    }
}
