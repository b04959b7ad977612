//! Section 7: what off-CPU profiling costs. Two threads pinned to one CPU ping-pong a byte
//! through pipes (every round trip is two context switches, each in its critical path: the worst
//! case for a program on `sched_switch`). Their round trips per second are measured in rounds,
//! each a whole-host daemon without `--off-cpu` and one with it (its defaults), the order
//! alternating, several short windows per daemon; under the first daemon, windows also with a
//! BPF program that does nothing attached to `sched_switch` ([`switch_floor`]): what any program
//! there costs, the floor under the switch program's own cost. Rounds go on until the loss's 95%
//! interval is under a point wide (or a cap). Then the BPF run time of the switch program per
//! run, with those settings, with stacks never taken (a period so long that no switch is
//! sampled), and of the empty program, side by side. With `--baseline-daemon`, each round also
//! measures an older build with `--off-cpu` (its switch program), in turns with this one.
//!
//! [`switch_floor`]: super::switch_floor

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::daemon::{Daemon, Ready};
use super::measure::{bpf_stats, daemon_program, BpfStatsPaused};
use super::scenarios::Bench;
use super::statistics::{mean_ci95, median};
use super::switch_floor::EmptySwitchProgram;
use super::table::{verdict, Row};

/// The throughput loss target at the default settings (the issue's).
const MAX_LOSS_PCT: f64 = 1.0;
/// The off-CPU switch program's name, as the kernel keeps it (15 bytes at most).
const SWITCH_PROGRAM: &str = "off_cpu_switch";
/// One window of the ping-pong: short, so that a round's windows see the same machine.
const WINDOW: Duration = Duration::from_secs(1);
/// Windows per daemon (and per state of the empty program) in a round; their median is the
/// round's figure.
const WINDOWS: usize = 3;
/// Rounds stop once the loss's 95% interval is narrower than this, in points...
const INTERVAL_WIDTH_PCT: f64 = 1.0;
/// ... after at least the plan's pairs of rounds, and at most this many times as many.
const MAX_ROUNDS_PER_PAIR: usize = 3;
/// After a daemon is ready: its start-up scan of the host's processes behind it.
const SETTLE: Duration = Duration::from_secs(1);

/// One round's round trips per second (medians of its windows).
#[derive(Clone, Copy, Debug)]
struct Round {
    /// Under the daemon without `--off-cpu`.
    without: f64,
    /// Under the same daemon with the empty program on `sched_switch`.
    empty_program: f64,
    /// Under the daemon with `--off-cpu`.
    with: f64,
    /// Under the baseline build with `--off-cpu`, if one is compared.
    with_baseline: Option<f64>,
}

impl Round {
    fn loss_pct(&self) -> f64 {
        (1.0 - self.with / self.without) * 100.0
    }

    fn floor_pct(&self) -> f64 {
        (1.0 - self.empty_program / self.without) * 100.0
    }

    fn baseline_loss_pct(&self) -> Option<f64> {
        self.with_baseline
            .map(|with| (1.0 - with / self.without) * 100.0)
    }
}

pub(super) struct OffCpuCost {
    rounds: Vec<Round>,
    /// Per run of the switch program, default settings (stacks taken as sampled).
    ns_per_switch: f64,
    /// Per run with no stack ever taken.
    ns_per_switch_unsampled: f64,
    /// Per run of the empty program.
    ns_per_empty_run: f64,
    /// Switch program runs per second with the default settings, and walks (stacks sent).
    switches_per_second: f64,
    walks_per_second: f64,
    /// The baseline build compared, and its switch program's run time per run.
    baseline: Option<(PathBuf, f64)>,
}

/// Runs the workload for `window`, both threads on `cpu`, and returns its round trips per
/// second.
pub(super) fn round_trips(binary: &Path, cpu: usize, window: Duration) -> Result<f64> {
    let output = super::super::output(
        Command::new(binary)
            .arg(format!("{:.1}", window.as_secs_f64()))
            .arg(cpu.to_string()),
    )?;
    output
        .trim()
        .parse()
        .with_context(|| format!("ping-pong printed {output:?}"))
}

/// The daemon's off-CPU switch program, through its file descriptors.
fn switch_program(daemon_pid: u32) -> Result<u32> {
    daemon_program(daemon_pid, SWITCH_PROGRAM)
}

/// BPF run time per run of a program over one window of the ping-pong (the statistics on).
struct RunTime {
    ns_per_run: f64,
    runs_per_second: f64,
}

impl Bench {
    pub(super) fn measure_off_cpu_cost(&self, baseline: Option<&Path>) -> Result<OffCpuCost> {
        let min_rounds = self.plan.pairs.max(2);
        let max_rounds = min_rounds * MAX_ROUNDS_PER_PAIR;
        let mut rounds = Vec::new();
        let (mut ns_per_switch, mut switches_per_second, mut walks_per_second) =
            (Vec::new(), Vec::new(), Vec::new());
        let (mut ns_per_empty_run, mut baseline_ns_per_switch) = (Vec::new(), Vec::new());
        while rounds.len() < min_rounds
            || (rounds.len() < max_rounds && !narrow_enough(&rounds, Round::loss_pct))
        {
            let round = rounds.len();
            self.progress(format_args!("off-CPU cost: round {}", round + 1));
            // Whether the daemon without off-CPU profiling goes first, and the empty program
            // before or after its bare windows, alternate (drift).
            let without_first = round % 2 == 0;
            let empty_first = round % 4 >= 2;
            let mut without_off_cpu = None;
            if without_first {
                without_off_cpu = Some(self.measure_without_off_cpu(empty_first)?);
            }
            // The two builds with off-CPU profiling take turns too.
            let mut with_baseline = None;
            if let Some(binary) = baseline.filter(|_| without_first) {
                let (rate, run_time) = self.measure_baseline_off_cpu(binary)?;
                with_baseline = Some(rate);
                baseline_ns_per_switch.push(run_time.ns_per_run);
            }
            let daemon =
                self.start_settled_daemon(self.daemon_binary(), &["--off-cpu".to_owned()])?;
            let program = switch_program(daemon.process.pid())?;
            let with = self.pingpong_windows()?;
            let sampled_before = daemon.fresh_metrics()?.get(SAMPLED)?;
            let run_time = self.pingpong_run_time(program)?;
            let sampled_after = daemon.fresh_metrics()?.get(SAMPLED)?;
            daemon.stop()?;
            if let Some(binary) = baseline.filter(|_| !without_first) {
                let (rate, run_time) = self.measure_baseline_off_cpu(binary)?;
                with_baseline = Some(rate);
                baseline_ns_per_switch.push(run_time.ns_per_run);
            }
            ns_per_switch.push(run_time.ns_per_run);
            switches_per_second.push(run_time.runs_per_second);
            walks_per_second.push((sampled_after - sampled_before) / WINDOW.as_secs_f64());
            let (without, empty_program, empty_run) = match without_off_cpu {
                Some(measured) => measured,
                None => self.measure_without_off_cpu(empty_first)?,
            };
            ns_per_empty_run.push(empty_run);
            rounds.push(Round {
                without,
                empty_program,
                with,
                with_baseline,
            });
        }
        // Stacks never taken: the cost of the bookkeeping alone.
        let daemon = self.start_settled_daemon(
            self.daemon_binary(),
            &[
                "--off-cpu".to_owned(),
                "--config".to_owned(),
                self.never_sampled_config()?.display().to_string(),
            ],
        )?;
        let unsampled = self.pingpong_run_time(switch_program(daemon.process.pid())?)?;
        daemon.stop()?;
        Ok(OffCpuCost {
            rounds,
            ns_per_switch: median(ns_per_switch.into_iter()),
            ns_per_switch_unsampled: unsampled.ns_per_run,
            ns_per_empty_run: median(ns_per_empty_run.into_iter()),
            switches_per_second: median(switches_per_second.into_iter()),
            walks_per_second: median(walks_per_second.into_iter()),
            baseline: baseline.map(|binary| {
                (
                    binary.to_owned(),
                    median(baseline_ns_per_switch.into_iter()),
                )
            }),
        })
    }

    /// The ping-pong's round trips per second under the baseline build with `--off-cpu`, and
    /// its switch program's run time.
    fn measure_baseline_off_cpu(&self, binary: &Path) -> Result<(f64, RunTime)> {
        let daemon = self.start_settled_daemon(binary, &["--off-cpu".to_owned()])?;
        let program = switch_program(daemon.process.pid())?;
        let rate = self.pingpong_windows()?;
        let run_time = self.pingpong_run_time(program)?;
        daemon.stop()?;
        Ok((rate, run_time))
    }

    /// A whole-host daemon (`binary`) at 99 Hz with `extra_args`, ready and past its start-up
    /// scan.
    fn start_settled_daemon(&self, binary: &Path, extra_args: &[String]) -> Result<Daemon> {
        let ready = Ready::Sampling { jvms: 0 };
        let daemon = self.start_daemon_binary(binary, 99, 15, &[], ready, extra_args)?;
        thread::sleep(SETTLE);
        Ok(daemon)
    }

    /// Under a daemon without off-CPU profiling (its CPU sampling at 99 Hz, as with it): round
    /// trips per second bare and with the empty program on `sched_switch` (that one first if
    /// `empty_first`), and the empty program's run time per run.
    fn measure_without_off_cpu(&self, empty_first: bool) -> Result<(f64, f64, f64)> {
        let daemon = self.start_settled_daemon(self.daemon_binary(), &[])?;
        let mut bare = None;
        if !empty_first {
            bare = Some(self.pingpong_windows()?);
        }
        let empty = EmptySwitchProgram::attach()?;
        let with_empty = self.pingpong_windows()?;
        let empty_run = self.pingpong_run_time(empty.id()?)?;
        drop(empty);
        let bare = match bare {
            Some(bare) => bare,
            None => self.pingpong_windows()?,
        };
        daemon.stop()?;
        Ok((bare, with_empty, empty_run.ns_per_run))
    }

    /// The ping-pong's median round trips per second over [`WINDOWS`] windows, the kernel's BPF
    /// statistics off (they cost two clock reads on every switch).
    fn pingpong_windows(&self) -> Result<f64> {
        let _off = BpfStatsPaused::pause()?;
        let rates = (0..WINDOWS)
            .map(|_| round_trips(&self.pingpong, self.pingpong_cpu(), WINDOW))
            .collect::<Result<Vec<f64>>>()?;
        Ok(median(rates.into_iter()))
    }

    /// The CPU the ping-pong's threads are pinned to: the last.
    pub(super) fn pingpong_cpu(&self) -> usize {
        self.cpus.saturating_sub(1)
    }

    /// `program`'s BPF run time per run over one ping-pong window, the statistics on.
    fn pingpong_run_time(&self, program: u32) -> Result<RunTime> {
        let before = bpf_stats(program)?;
        round_trips(&self.pingpong, self.pingpong_cpu(), WINDOW)?;
        let after = bpf_stats(program)?;
        let runs = after.run_cnt.saturating_sub(before.run_cnt) as f64;
        let nanos = after.run_time_ns.saturating_sub(before.run_time_ns) as f64;
        Ok(RunTime {
            ns_per_run: nanos / runs.max(1.0),
            runs_per_second: runs / WINDOW.as_secs_f64(),
        })
    }

    /// A config whose period is so long that only a thread's first switch is sampled.
    fn never_sampled_config(&self) -> Result<PathBuf> {
        let path = self.work_dir.join("off-cpu-unsampled.toml");
        fs::write(&path, "off_cpu_period_us = 10000000\n")
            .with_context(|| format!("writing {}", path.display()))?;
        Ok(path)
    }
}

/// Whether the 95% interval of `loss` over `rounds` is narrower than [`INTERVAL_WIDTH_PCT`].
fn narrow_enough(rounds: &[Round], loss: fn(&Round) -> f64) -> bool {
    let losses: Vec<f64> = rounds.iter().map(loss).collect();
    2.0 * mean_ci95(&losses).1 < INTERVAL_WIDTH_PCT
}

const SAMPLED: &str = profiler_common::metric::OFF_CPU_WAITS_SAMPLED;

impl OffCpuCost {
    pub(super) fn rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        let losses: Vec<f64> = self.rounds.iter().map(Round::loss_pct).collect();
        let floors: Vec<f64> = self.rounds.iter().map(Round::floor_pct).collect();
        let own: Vec<f64> = self
            .rounds
            .iter()
            .map(|r| r.loss_pct() - r.floor_pct())
            .collect();
        let (loss, loss_half) = mean_ci95(&losses);
        let (floor, floor_half) = mean_ci95(&floors);
        let (own_loss, own_half) = mean_ci95(&own);
        let per_round = |values: &[f64]| {
            values
                .iter()
                .map(|l| format!("{l:.1}"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let setting = format!(
            "2 threads pinned to one CPU through pipes, {} rounds of {WINDOWS} x {:.0} s windows per side under a whole-host daemon at 99 Hz",
            self.rounds.len(),
            WINDOW.as_secs_f64()
        );
        rows.push(Row {
            section: "7",
            measurement: "ping-pong throughput lost to off-CPU profiling".into(),
            setting: format!("{setting}, without and with `--off-cpu` (defaults)"),
            result: format!(
                "{loss:.1} ± {loss_half:.1}% (95% interval of the mean; per round: {}; {:.0} -> {:.0} round trips/s)",
                per_round(&losses),
                median(self.rounds.iter().map(|r| r.without)),
                median(self.rounds.iter().map(|r| r.with))
            ),
            target: verdict(loss <= MAX_LOSS_PCT, &format!("<= {MAX_LOSS_PCT}%")),
        });
        rows.push(Row {
            section: "7",
            measurement: "... of which any program on `sched_switch` costs (the floor)".into(),
            setting: format!("{setting}: without `--off-cpu`, bare and with a BPF program that does nothing on `sched_switch`"),
            result: format!(
                "{floor:.1} ± {floor_half:.1}% (per round: {}); the switch program's own part: {own_loss:.1} ± {own_half:.1} points",
                per_round(&floors)
            ),
            target: "-".into(),
        });
        rows.push(Row {
            section: "7",
            measurement: "BPF run time per context switch".into(),
            setting: format!(
                "{:.0} switches/s, {:.0} stacks taken/s; the kernel's statistics (two clock reads per run, in every figure)",
                self.switches_per_second, self.walks_per_second
            ),
            result: format!(
                "{:.0} ns with the default period; {:.0} ns when no stack is taken; the empty program {:.0} ns",
                self.ns_per_switch, self.ns_per_switch_unsampled, self.ns_per_empty_run
            ),
            target: "-".into(),
        });
        if let Some((binary, baseline_ns)) = &self.baseline {
            let baseline_losses: Vec<f64> = self
                .rounds
                .iter()
                .filter_map(Round::baseline_loss_pct)
                .collect();
            // This build against the baseline, per round: how much less of the rate it takes.
            let against: Vec<f64> = self
                .rounds
                .iter()
                .filter_map(|r| Some(r.loss_pct() - r.baseline_loss_pct()?))
                .collect();
            let (baseline_loss, baseline_half) = mean_ci95(&baseline_losses);
            let (difference, difference_half) = mean_ci95(&against);
            rows.push(Row {
                section: "7",
                measurement: "... side by side: the baseline build with `--off-cpu`".into(),
                setting: format!("{}, in the same rounds, in turns with this build", binary.display()),
                result: format!(
                    "loss {baseline_loss:.1} ± {baseline_half:.1}% (per round: {}), {baseline_ns:.0} ns per switch; this build's loss minus the baseline's: {difference:+.1} ± {difference_half:.1} points",
                    per_round(&baseline_losses)
                ),
                target: "-".into(),
            });
        }
        if loss > MAX_LOSS_PCT {
            notes.push(format!(
                "7: ping-pong throughput lost {loss:.1} ± {loss_half:.1}% (per round: {}). Every \
                 switch of the host runs the switch program, and this workload puts two of them \
                 in each round trip's critical path (about {:.1} us). A program that does nothing \
                 there already costs {floor:.1} ± {floor_half:.1}%: the tracepoint and the BPF \
                 dispatch on this kernel and CPU; the switch program's own part is \
                 {own_loss:.1} ± {own_half:.1} points.",
                per_round(&losses),
                1e6 / median(self.rounds.iter().map(|r| r.without)),
            ));
        }
    }
}
