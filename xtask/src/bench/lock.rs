//! Section 9: what lock profiling costs. Two programs, each measured in rounds of windows under a
//! fresh whole-host daemon at 99 Hz without and with `--lock` (its defaults; it turns off-CPU
//! profiling on, whose switch program is where most of the cost is), the order alternating per
//! round: section 7's ping-pong (two threads on one CPU, two context switches per round trip, no
//! Java) and a JDK 17 program whose threads take turns on one monitor and one ReentrantLock
//! (`xtask/bench/Contention.java`: three workers per CPU, every turn with waiters, a share of
//! the waits above the 10 ms threshold). Per window: the program's own rate, the daemon's CPU,
//! and with `--lock` the context switches its switch program saw per second (every one starts a
//! wait it may measure: what its work grows with; the lock profiles keep the waits of Java
//! threads over the threshold).
//!
//! And what the thread-start hook costs a JVM that starts threads back to back
//! (`xtask/bench/ThreadChurn.java`: one thread starting a thread that does nothing, joining
//! it, and again): its starts per second with no daemon and under a whole-host daemon at 99 Hz
//! (defaults: the hook is attached with or without `--lock`), the cost per start the
//! difference of their inverses.

use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};

use super::daemon::{Daemon, Ready};
use super::measure::{process_cpu_seconds, BpfStatsPaused};
use super::processes::Workload;
use super::scenarios::Bench;
use super::statistics::{median, thousands};
use super::table::Row;
use super::TARGET_HZ;

/// Workers per CPU of the contention program: with more workers than CPUs, every turn has
/// waiters.
const WORKERS_PER_CPU: usize = 3;
/// Hashing rounds per turn, held and outside the lock: about 1 ms on the bench's machine, so
/// that a waiter behind a few holders and the CPUs' other threads waits milliseconds.
const HOLD_WORK: u32 = 400_000;
/// After a daemon is ready: its first stacks named before measuring.
const SETTLE: Duration = Duration::from_millis(500);
/// The daemon's counter of switches off the CPU (read from its BPF counters as it serves
/// `/metrics`, so current within a window).
const SWITCHES: &str = profiler_common::metric::OFF_CPU_SWITCHES;

/// One window: the program's rate, the daemon's CPU in cores, switches seen per second.
#[derive(Clone, Copy, Debug, Default)]
struct Window {
    rate: f64,
    daemon_cores: f64,
    switches_per_second: f64,
}

/// One program's rounds: (without `--lock`, with it).
struct Series {
    name: &'static str,
    unit: &'static str,
    rounds: Vec<(Window, Window)>,
}

pub(super) struct LockCost {
    pingpong: Series,
    contention: Series,
    /// Rounds of the thread-start workload's rate: (no daemon, daemon).
    thread_starts: Vec<(f64, f64)>,
    window: Duration,
    threads: usize,
    jdk: u32,
}

impl Bench {
    pub(super) fn measure_lock_cost(&self) -> Result<LockCost> {
        let window = self.plan.window;
        let pingpong = self.measure_lock_series(
            "ping-pong (2 threads on one CPU through pipes)",
            "round trips/s",
            window,
            |window| super::off_cpu::round_trips(&self.pingpong, self.pingpong_cpu(), window),
            None,
        )?;
        let jdk = &self.jdks[0];
        let threads = WORKERS_PER_CPU * self.cpus;
        let workload = Workload::start(
            "contending JVM",
            self.java_class_command(
                jdk,
                &[],
                "Contention",
                &[threads.to_string(), HOLD_WORK.to_string()],
            ),
        )?;
        thread::sleep(self.plan.warmup);
        let contention = self.measure_lock_series(
            "Java lock turns (monitor and ReentrantLock)",
            "turns/s",
            window,
            |window| workload.ops_per_second(window),
            Some(&workload),
        )?;
        drop(workload);
        let thread_starts = self.measure_thread_starts(window)?;
        Ok(LockCost {
            pingpong,
            contention,
            thread_starts,
            window,
            threads,
            jdk: jdk.major,
        })
    }

    /// Rounds of the thread-start workload's rate with no daemon and under one (the order
    /// alternating per round).
    fn measure_thread_starts(&self, window: Duration) -> Result<Vec<(f64, f64)>> {
        let jdk = &self.jdks[0];
        let workload = Workload::start(
            "thread-starting JVM",
            self.java_class_command(jdk, &[], "ThreadChurn", &["1".to_owned()]),
        )?;
        thread::sleep(self.plan.warmup);
        let mut rounds = Vec::new();
        for round in 0..self.plan.pairs {
            let mut pair = (0.0, 0.0);
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for profiled in order {
                let rate = if profiled {
                    let daemon =
                        self.start_daemon(TARGET_HZ, 15, &[], Ready::Sampling { jvms: 1 }, &[])?;
                    thread::sleep(SETTLE);
                    let rate = workload.ops_per_second(window)?;
                    drop(daemon);
                    rate
                } else {
                    workload.ops_per_second(window)?
                };
                self.progress(format_args!(
                    "9. thread starts, round {}/{}, {}: {} starts/s",
                    round + 1,
                    self.plan.pairs,
                    if profiled { "daemon" } else { "no daemon" },
                    thousands(rate)
                ));
                if profiled {
                    pair.1 = rate;
                } else {
                    pair.0 = rate;
                }
            }
            rounds.push(pair);
        }
        Ok(rounds)
    }

    fn measure_lock_series(
        &self,
        name: &'static str,
        unit: &'static str,
        window: Duration,
        rate: impl Fn(Duration) -> Result<f64>,
        jvm: Option<&Workload>,
    ) -> Result<Series> {
        let mut rounds = Vec::new();
        for round in 0..self.plan.pairs {
            let mut pair = (Window::default(), Window::default());
            let order = if round % 2 == 0 {
                [false, true]
            } else {
                [true, false]
            };
            for lock in order {
                let args: Vec<String> = if lock {
                    vec!["--lock".to_owned()]
                } else {
                    Vec::new()
                };
                let jvms = usize::from(jvm.is_some());
                let mut daemon =
                    self.start_daemon(TARGET_HZ, 15, &[], Ready::Sampling { jvms }, &args)?;
                let w = measure_window(&mut daemon, &rate, window, lock)?;
                self.progress(format_args!(
                    "9. lock, {name}, round {}/{}, {}: {} {unit}, daemon {:.1}% of a core, {:.0} \
                     switches/s seen",
                    round + 1,
                    self.plan.pairs,
                    if lock { "with --lock" } else { "without" },
                    thousands(w.rate),
                    w.daemon_cores * 100.0,
                    w.switches_per_second
                ));
                if lock {
                    pair.1 = w;
                } else {
                    pair.0 = w;
                }
            }
            rounds.push(pair);
        }
        Ok(Series { name, unit, rounds })
    }
}

/// The program's rate over `window` under `daemon`, with the BPF statistics off (they add two
/// clock reads to every program run, every context switch here).
fn measure_window(
    daemon: &mut Daemon,
    rate: &impl Fn(Duration) -> Result<f64>,
    window: Duration,
    lock: bool,
) -> Result<Window> {
    let _off = BpfStatsPaused::pause()?;
    thread::sleep(SETTLE);
    let switches_before = if lock {
        daemon.fresh_metrics()?.get(SWITCHES)?
    } else {
        0.0
    };
    let daemon_before = process_cpu_seconds(daemon.process.pid())?;
    let started = Instant::now();
    let measured = rate(window)?;
    let seconds = started.elapsed().as_secs_f64();
    let daemon_cores = (process_cpu_seconds(daemon.process.pid())? - daemon_before) / seconds;
    let switches_per_second = if lock {
        (daemon.fresh_metrics()?.get(SWITCHES)? - switches_before) / seconds
    } else {
        0.0
    };
    if let Some(status) = daemon.process.exit_status()? {
        bail!(
            "the daemon exited during the window ({status}); see {}",
            daemon.log.display()
        );
    }
    Ok(Window {
        rate: measured,
        daemon_cores,
        switches_per_second,
    })
}

impl Series {
    fn losses(&self) -> Vec<f64> {
        self.rounds
            .iter()
            .map(|(without, with)| (1.0 - with.rate / without.rate) * 100.0)
            .collect()
    }

    fn row(&self, window: Duration) -> Row {
        let losses = self.losses();
        let with = |f: fn(&(Window, Window)) -> f64| median(self.rounds.iter().map(f));
        Row {
            section: "9",
            measurement: format!("{} lost to lock profiling", self.name),
            setting: format!(
                "{} pairs of {:.0} s windows: whole-host daemon at 99 Hz without and with `--lock` (defaults)",
                self.rounds.len(),
                window.as_secs_f64()
            ),
            result: format!(
                "{:.1}% (median of pairs: {}; {} -> {} {}); daemon {:.2}% -> {:.2}% of a core; {:.0} switches/s seen by `--lock`",
                median(losses.iter().copied()),
                losses
                    .iter()
                    .map(|l| format!("{l:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                thousands(with(|p| p.0.rate)),
                thousands(with(|p| p.1.rate)),
                self.unit,
                with(|p| p.0.daemon_cores) * 100.0,
                with(|p| p.1.daemon_cores) * 100.0,
                with(|p| p.1.switches_per_second),
            ),
            target: "-".into(),
        }
    }
}

impl LockCost {
    pub(super) fn rows(&self, rows: &mut Vec<Row>, _notes: &mut Vec<String>) {
        rows.push(self.pingpong.row(self.window));
        rows.push(self.contention.row(self.window));
        rows.push(self.thread_start_row());
    }

    /// What a Java thread's start and end cost more under the daemon (its thread-start hook,
    /// the entry made and removed), in microseconds: the median of rounds.
    fn thread_start_row(&self) -> Row {
        let costs: Vec<f64> = self
            .thread_starts
            .iter()
            .map(|(without, with)| (1.0 / with - 1.0 / without) * 1e6)
            .collect();
        Row {
            section: "9",
            measurement: "cost per Java thread start (thread-start hook)".into(),
            setting: format!(
                "{} pairs of {:.0} s windows: one thread starting and joining do-nothing threads, \
                 no daemon and a whole-host daemon at 99 Hz (defaults), JDK {}",
                self.thread_starts.len(),
                self.window.as_secs_f64(),
                self.jdk
            ),
            result: format!(
                "{:.1} us per start (median of pairs: {}; {} -> {} starts/s)",
                median(costs.iter().copied()),
                costs
                    .iter()
                    .map(|c| format!("{c:.1}"))
                    .collect::<Vec<_>>()
                    .join(", "),
                thousands(median(self.thread_starts.iter().map(|p| p.0))),
                thousands(median(self.thread_starts.iter().map(|p| p.1))),
            ),
            target: "-".into(),
        }
    }

    /// How section 9 measures, for the report's method list.
    pub(super) fn method(&self) -> String {
        format!(
            "9. Section 7's ping-pong, and `xtask/bench/Contention.java` on JDK {} ({} workers \
             taking turns on one monitor and one ReentrantLock, {HOLD_WORK} hashing rounds held \
             and as many outside per turn), each for {} rounds of a {:.0} s window under a fresh \
             whole-host daemon at 99 Hz without and with `--lock` (order alternating per round; \
             BPF statistics off); loss = 1 - with/without per round, the median of rounds; the \
             daemon's CPU from its threads' run time; switches from its `{SWITCHES}` counter. \
             `xtask/bench/ThreadChurn.java` (one thread starting do-nothing threads and joining \
             each) for as many rounds with no daemon and under a whole-host daemon at 99 Hz \
             (defaults), order alternating: the cost per start is 1/rate with the daemon \
             minus 1/rate without, the median of rounds.",
            self.jdk,
            self.threads,
            self.pingpong.rounds.len(),
            self.window.as_secs_f64()
        )
    }
}
