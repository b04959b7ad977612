//! The sampling loop: drains the BPF ring buffers into the interval's aggregates (a ring and an
//! aggregate per kind: CPU samples, allocations, waits), hands new stacks' Java
//! frames and each finished interval to the worker, and tells the JVM tracker and the unwind
//! tables' loader which processes it saw. It never blocks on the worker: if its queue is full,
//! work is dropped and counted.

pub(super) mod metrics;
mod prefetched;
mod young_processes;

use std::sync::atomic::Ordering;
use std::sync::mpsc::{SyncSender, TrySendError};
use std::time::{Duration, Instant};

use profiler_common::{Counter, OffCpuEnd, SampleKind, UnwindEnd, VirtualWaitEnd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::signal::unix::{signal, SignalKind};

use super::threads::TrackerThread;
use super::DaemonError;
use crate::aggregate::{Added, Aggregator, IntervalStacks};
use crate::alloc::AllocConfig;
use crate::lock::{LockAggregators, LockConfig};
use crate::off_cpu::metrics::OffCpuSnapshot;
use crate::off_cpu::{JoinedWait, OffCpuConfig, OffCpuJoiner, OffCpuStats};
use crate::profile_model::ProfileKind;
use crate::record::SampleView;
use crate::sampler::{KernelCounters, Sampler};
use crate::stack_memory::SharedStackMemory;
use crate::symbolize::java_reader::JavaFrameSeen;
use crate::worker::Work;
use crate::worker_metrics::WorkerCounters;
use metrics::{LoopMetrics, Snapshot};
use prefetched::PrefetchedFrames;
use young_processes::YoungProcesses;

/// How often the ring buffer is drained when it does not fill up: each drain is a wake-up of an
/// otherwise idle daemon. Bursts do not wait for it: the BPF side wakes us when the ring is a
/// quarter full (at 1000 Hz on 64 CPUs and 1 KiB records, after about 30 ms).
const DRAIN_PERIOD: Duration = Duration::from_millis(250);
/// After a drain that found nothing (an idle host, or `--pid` targets that sleep), the next one
/// comes this late: on a virtual machine a wake-up costs about 0.1 ms of CPU, and an idle
/// daemon's CPU is mostly its wake-ups. The first samples after a quiet spell wait at most this.
const IDLE_DRAIN_PERIOD: Duration = Duration::from_secs(1);
/// At start-up (the first [`PERISHING_FOR`]), when most new stacks come from JVMs met for the
/// first time, a drain that finds Java frames not met before this interval is followed by
/// another this soon, so that their methods are read while they exist.
const STARTUP_JAVA_DRAIN_PERIOD: Duration = Duration::from_millis(50);
/// While Java names perish (the Java name reader found methods of new stacks already unloaded
/// within [`PERISHING_FOR`]), the same, sooner: under class churn a class lives a few hundred
/// milliseconds after its last sample (measured: 50 ms lost about 6% of a churning JVM's
/// samples to unknown frames, 10 ms about 1%). Otherwise the slower period costs no names and
/// saves the wake-ups.
const PERISHING_JAVA_DRAIN_PERIOD: Duration = Duration::from_millis(10);
const PERISHING_FOR: Duration = Duration::from_secs(30);
/// How often the metrics endpoint's snapshot is refreshed, at the next wake-up after it is due
/// (no wake-up of its own: at most [`IDLE_DRAIN_PERIOD`] late).
const METRICS_PERIOD: Duration = Duration::from_secs(1);

/// Counts what the sampling loop saw.
#[derive(Default)]
pub(super) struct LoopStats {
    pub(super) records: u64,
    pub(super) malformed: u64,
    pub(super) dropped_work: u64,
    /// How user stack walks ended, indexed by `UnwindEnd` (this interval).
    unwind_ends: [u64; UnwindEnd::ALL.len()],
    /// The same, over the whole run.
    unwind_ends_total: [u64; UnwindEnd::ALL.len()],
    dropped_over_stack_bound: u64,
    /// Samples folded into their process's `[stacks past the bound]` entry.
    past_bound: u64,
    /// Interval ends put off because the worker had not taken the last interval yet.
    intervals_deferred: u64,
    /// Drains the BPF side asked for (the ring was filling up).
    ring_wakeups: u64,
    /// Records of the off-CPU ring (waits' stacks and ends).
    off_cpu_records: u64,
    /// What the off-CPU joiner counted, as of the last interval.
    off_cpu: OffCpuStats,
    off_cpu_open_waits: u64,
    /// Whether off-CPU profiling is on.
    off_cpu_on: bool,
}

/// How close to the run's end an interval's end may be and still be its last: what is left
/// of the run is not worth an interval (and a profile per process and kind) of its own.
const DURATION_SLACK: Duration = Duration::from_millis(200);

/// When the loop ends: at a signal, or after the run's duration.
pub(super) struct Until {
    /// When the run's `--duration` is over, if it has one.
    pub(super) stop_at: Option<tokio::time::Instant>,
    /// How long each profile covers.
    pub(super) interval: Duration,
}

/// Where the loop's finds go: the worker (new processes, intervals), the Java name reader (the
/// Java frames of new stacks) and the unwind tables' loader (new processes). Never waited on: a
/// full queue drops the item, counted.
pub(super) struct Outbox {
    pub(super) work: SyncSender<Work>,
    pub(super) java_frames: SyncSender<Vec<JavaFrameSeen>>,
    pub(super) unwind_tables: SyncSender<Vec<u32>>,
}

/// What the loop folds and how much memory its stacks may take.
pub(super) struct LoopSettings {
    pub(super) max_stacks_per_interval: usize,
    /// Stacks of virtual threads kept apart per virtual thread.
    pub(super) virtual_thread_ids: bool,
    pub(super) stack_memory_bytes: usize,
    pub(super) off_cpu: Option<OffCpuConfig>,
    pub(super) lock: Option<LockConfig>,
    pub(super) alloc: Option<AllocConfig>,
}

/// The interval's aggregates: one per kind of record.
struct Folds {
    cpu: Aggregator,
    off_cpu: Option<OffCpu>,
    alloc: Option<Alloc>,
}

/// The loop's state: what it drains, where it folds, whom it tells.
pub(super) struct SamplingLoop {
    sampler: Sampler,
    folds: Folds,
    outbox: Outbox,
    tracker: TrackerThread,
    stats: LoopStats,
    last_counters: KernelCounters,
    intervals: u64,
    /// The memory every aggregator's stacks take from.
    stack_memory: SharedStackMemory,
    /// The Java frames this interval's drains sent the worker to read.
    prefetched: PrefetchedFrames,
    /// The processes met in the last seconds, named to the symbolizer again.
    young: YoungProcesses,
}

/// What the loop leaves when it ends: the sampler detached (no new samples while the last
/// interval is written), the tracker still running, and the figures of the run.
pub(super) struct Ended {
    pub(super) tracker: TrackerThread,
    pub(super) stats: LoopStats,
    pub(super) kernel: KernelCounters,
    pub(super) intervals: u64,
}

impl SamplingLoop {
    pub(super) fn new(
        sampler: Sampler,
        outbox: Outbox,
        tracker: TrackerThread,
        settings: LoopSettings,
    ) -> Self {
        let stats = LoopStats {
            off_cpu_on: sampler.off_cpu(),
            ..LoopStats::default()
        };
        let memory = SharedStackMemory::new(settings.stack_memory_bytes);
        Self {
            folds: Folds::new(&settings, &memory),
            stack_memory: memory,
            last_counters: sampler.counters(),
            sampler,
            outbox,
            tracker,
            stats,
            intervals: 0,
            prefetched: PrefetchedFrames::new(),
            young: YoungProcesses::default(),
        }
    }

    /// Runs until SIGTERM, SIGINT or the end of the run's duration, then ends the interval
    /// under way.
    pub(super) async fn run(
        mut self,
        until: Until,
        loop_metrics: &LoopMetrics,
        worker: &WorkerCounters,
        frequency_hz: u64,
    ) -> Result<Ended, DaemonError> {
        let mut sigterm = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
        let mut sigint = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
        let stop = async {
            match until.stop_at {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::pin!(stop);
        let mut drain = tokio::time::interval(DRAIN_PERIOD);
        drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let wakeups = self
            .sampler
            .ring_wakeups()
            .map_err(DaemonError::RingWakeups)?;
        let watch = |fd: std::os::fd::OwnedFd| {
            // SAFETY: the descriptor is owned by the AsyncFd, so it stays open and the same.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }
                .map_err(|err| DaemonError::RingWakeups(err.into()))
        };
        let ring_wakeups = [Some(wakeups.samples), wakeups.alloc, wakeups.off_cpu]
            .into_iter()
            .flatten()
            .map(watch)
            .collect::<Result<Vec<_>, _>>()?;
        let mut flush =
            tokio::time::interval_at(tokio::time::Instant::now() + until.interval, until.interval);
        let mut last_misses = 0;
        let started = tokio::time::Instant::now();
        let mut missed_at: Option<tokio::time::Instant> = None;
        let mut published: Option<tokio::time::Instant> = None;
        let cpus = self.sampler.cpus();

        loop {
            if published.is_none_or(|at| at.elapsed() >= METRICS_PERIOD) {
                published = Some(tokio::time::Instant::now());
                loop_metrics.publish(self.snapshot(cpus, frequency_hz));
            }
            let finishing = tokio::select! {
                _ = drain.tick() => false,
                () = ring_filling(&ring_wakeups) => {
                    self.stats.ring_wakeups += 1;
                    drain.reset();
                    false
                }
                _ = flush.tick() => {
                    self.drain();
                    // The worker has not taken the last interval yet (a slow write, a burst of
                    // new stacks to name): this one goes on, within its memory bound, rather
                    // than queue a second one beside it.
                    if worker.intervals_pending.load(Ordering::Relaxed) > 0 {
                        self.stats.intervals_deferred += 1;
                        continue;
                    }
                    self.end_interval(&worker.intervals_pending);
                    // The run's duration ends with this interval (its timer would fire a few
                    // milliseconds later): no near-empty interval after it.
                    if until.stop_at.is_some_and(|at| {
                        at.saturating_duration_since(tokio::time::Instant::now()) < DURATION_SLACK
                    }) {
                        tracing::info!("duration reached");
                        break;
                    }
                    continue;
                }
                _ = sigterm.recv() => { tracing::info!("SIGTERM: writing the current interval, then exiting"); true }
                _ = sigint.recv() => { tracing::info!("SIGINT: writing the current interval, then exiting"); true }
                _ = &mut stop => { tracing::info!("duration reached"); true }
            };
            let records_before = self.stats.records;
            let found = self.drain();
            let misses = worker.java_reader.misses.load(Ordering::Relaxed);
            if misses != last_misses {
                last_misses = misses;
                missed_at = Some(tokio::time::Instant::now());
            }
            drain.reset_after(next_drain(Drained {
                records: self.stats.records != records_before,
                new_java_stacks: found.new_java_stacks,
                new_java_frames: found.new_java_frames,
                names_perishing: missed_at.is_some_and(|at| at.elapsed() < PERISHING_FOR),
                starting: started.elapsed() < PERISHING_FOR,
            }));
            if finishing {
                self.end_interval(&worker.intervals_pending);
                break;
            }
        }
        let kernel = self.sampler.counters();
        Ok(Ended {
            tracker: self.tracker,
            stats: self.stats,
            kernel,
            intervals: self.intervals,
        })
    }

    /// Takes every record in the rings; returns what it found. The JVMs of new stacks with Java
    /// frames are told to the tracker, which decides the sidecar agent's attach.
    fn drain(&mut self) -> Found {
        let found = self.folds.drain(
            &mut self.sampler,
            &self.outbox,
            &mut self.stats,
            (&mut self.prefetched, &mut self.young),
        );
        let new_java_stacks = !found.java_pids.is_empty();
        if new_java_stacks {
            self.tracker.tell_java_sampled(found.java_pids);
        }
        Found {
            new_java_stacks,
            new_java_frames: found.new_java_frames,
        }
    }

    /// Hands the interval's aggregates to the worker and starts the next interval.
    fn end_interval(&mut self, pending: &std::sync::atomic::AtomicU64) {
        let counters = self.sampler.counters();
        let since = counters.since(&self.last_counters);
        let intervals = self
            .folds
            .take_intervals(&since, &self.tracker, &mut self.stats);
        // Taken back by the worker once written.
        pending.fetch_add(1, Ordering::Relaxed);
        if !self.outbox.send(Work::Interval(intervals), &mut self.stats) {
            pending.fetch_sub(1, Ordering::Relaxed);
        }
        self.stack_memory.start_interval();
        self.prefetched.forget();
        self.young.end_interval();
        self.last_counters = counters;
        self.intervals += 1;
    }

    fn snapshot(&self, cpus: usize, frequency_hz: u64) -> Snapshot {
        let stats = &self.stats;
        Snapshot {
            kernel: self.sampler.counters(),
            records: stats.records,
            malformed_records: stats.malformed,
            dropped_work: stats.dropped_work,
            dropped_over_stack_bound: stats.dropped_over_stack_bound,
            past_stack_bound: stats.past_bound,
            intervals_deferred: stats.intervals_deferred,
            ring_wakeups: stats.ring_wakeups,
            unwind_ends: stats.unwind_ends_total,
            intervals: self.intervals,
            cpus,
            frequency_hz,
            off_cpu: stats.off_cpu_on.then_some(OffCpuSnapshot {
                joined: stats.off_cpu,
                open_waits: stats.off_cpu_open_waits,
            }),
            alloc: self.folds.alloc.is_some(),
        }
    }
}

/// Waits until one of the rings' descriptors turns readable (the BPF side woke us: that ring
/// is a quarter full), and clears its readiness: edge-triggered, the next wake-up comes with
/// the next fill, after this drain.
async fn ring_filling(wakeups: &[AsyncFd<std::os::fd::OwnedFd>]) {
    std::future::poll_fn(|context| {
        for fd in wakeups {
            if let std::task::Poll::Ready(ready) = fd.poll_read_ready(context) {
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                return std::task::Poll::Ready(());
            }
        }
        std::task::Poll::Pending
    })
    .await
}

/// Most Java frames in one batch for the Java name reader (16 bytes each): a drain that finds
/// more new stacks sends several, and the reader queue's bound applies to them.
const MAX_PREFETCH_FRAMES: usize = 16 * 1024;

/// What a drain found, and in which phase of the daemon.
#[derive(Clone, Copy, Debug)]
struct Drained {
    records: bool,
    /// New stacks with Java frames were found.
    new_java_stacks: bool,
    /// Java frames not met before this interval were found (and sent to be read).
    new_java_frames: bool,
    names_perishing: bool,
    starting: bool,
}

/// How long until the next drain. While names perish, every new frame is read within
/// [`STARTUP_JAVA_DRAIN_PERIOD`] at most, even after a drain without one: the slow periods would
/// let an nmethod be freed (and its `Method*`s reused) before its first sample is named.
fn next_drain(drained: Drained) -> Duration {
    match drained {
        // Under churn, a new class generation's first samples come in new stacks: each such
        // drain keeps the next one close, found frames new or not.
        Drained {
            names_perishing: true,
            new_java_stacks: true,
            ..
        } => PERISHING_JAVA_DRAIN_PERIOD,
        Drained {
            names_perishing: true,
            ..
        }
        | Drained {
            starting: true,
            new_java_frames: true,
            ..
        } => STARTUP_JAVA_DRAIN_PERIOD,
        Drained { records: false, .. } => IDLE_DRAIN_PERIOD,
        _ => DRAIN_PERIOD,
    }
}

/// Off-CPU profiling's state in the sampling loop: waits whose end has not come, and the
/// interval's folded waits; with lock profiling, its folded lock waits too.
struct OffCpu {
    joiner: OffCpuJoiner,
    aggregator: Aggregator,
    /// Whether off-CPU profiles are asked for (lock profiles alone sample waits too).
    write_profiles: bool,
    lock: Option<LockAggregators>,
}

/// Allocation profiling's state in the sampling loop: the interval's folded allocations and
/// what weighs them (the JVM tracker attaches the hooks).
struct Alloc {
    config: AllocConfig,
    aggregator: Aggregator,
}

impl Folds {
    fn new(settings: &LoopSettings, memory: &SharedStackMemory) -> Self {
        let max_stacks = settings.max_stacks_per_interval;
        let keep_ids = settings.virtual_thread_ids;
        let aggregator = |kind| {
            Aggregator::sharing(kind, max_stacks, memory.clone()).keeping_virtual_threads(keep_ids)
        };
        let (off_cpu, lock) = (settings.off_cpu, settings.lock);
        Self {
            cpu: aggregator(ProfileKind::Cpu),
            off_cpu: (off_cpu.is_some() || lock.is_some()).then(|| OffCpu {
                joiner: OffCpuJoiner::new(off_cpu.map_or(0, |o| o.min_wait.as_nanos() as u64)),
                aggregator: aggregator(ProfileKind::OffCpu),
                write_profiles: off_cpu.is_some(),
                lock: lock.map(|lock| {
                    LockAggregators::sharing(lock, max_stacks, memory.clone())
                        .keeping_virtual_threads(keep_ids)
                }),
            }),
            alloc: settings.alloc.map(|config| Alloc {
                config,
                aggregator: aggregator(ProfileKind::Alloc),
            }),
        }
    }

    /// Folds every record of the rings; returns what the other threads must hear of.
    fn drain(
        &mut self,
        sampler: &mut Sampler,
        outbox: &Outbox,
        stats: &mut LoopStats,
        (prefetched, young): (&mut PrefetchedFrames, &mut YoungProcesses),
    ) -> DrainFinds {
        let mut found = FoundInDrain {
            prefetched,
            young,
            java_frames: Vec::new(),
            new_java_frames: false,
            java_pids: Vec::new(),
            new_processes: Vec::new(),
        };
        let Self {
            cpu: aggregator,
            off_cpu,
            alloc,
        } = self;
        sampler.drain(|bytes| {
            stats.records += 1;
            let Some(view) = parse_record(bytes, stats) else {
                return;
            };
            if SampleKind::from_u8(view.header.kind) != Some(SampleKind::Cpu) {
                stats.malformed += 1;
                return;
            }
            if let Some(end) = view.user_end() {
                stats.unwind_ends[end as usize] += 1;
                stats.unwind_ends_total[end as usize] += 1;
            }
            let added = aggregator.add(&view);
            found.note(&view, added, outbox, stats);
        });
        if let Some(alloc) = alloc {
            sampler.drain_alloc(|bytes| {
                stats.records += 1;
                let Some(view) = parse_record(bytes, stats) else {
                    return;
                };
                let totals = match SampleKind::from_u8(view.header.kind) {
                    Some(SampleKind::AllocInNewTlab | SampleKind::AllocOutsideTlab) => {
                        alloc.config.weigh(view.header.weight)
                    }
                    Some(SampleKind::AllocSampled) => {
                        alloc.config.weigh_sampled(view.header.weight)
                    }
                    _ => {
                        stats.malformed += 1;
                        return;
                    }
                };
                let added = alloc.aggregator.add_totals(&view, &totals);
                found.note(&view, added, outbox, stats);
            });
        }
        if let Some(off_cpu) = off_cpu {
            let OffCpu {
                joiner,
                aggregator,
                lock,
                ..
            } = off_cpu;
            sampler.drain_off_cpu(|bytes| {
                stats.off_cpu_records += 1;
                // A wait's end (a thread's, or a virtual thread's): folded with its stack.
                let mut fold = |view: &SampleView<'_>, added, wait: &JoinedWait| {
                    found.note(view, added, outbox, stats);
                    if let Some(lock) = lock.as_mut() {
                        lock.fold(view, wait);
                    }
                };
                if let Some(end) = OffCpuEnd::from_bytes(bytes) {
                    joiner.end(&end, aggregator, &mut fold);
                    return;
                }
                if let Some(end) = VirtualWaitEnd::from_bytes(bytes) {
                    joiner.virtual_end(&end, aggregator, &mut fold);
                    return;
                }
                if let Some(view) = parse_record(bytes, stats) {
                    joiner.stack(&view, bytes);
                }
            });
        }
        found.finish(outbox, stats)
    }

    /// Takes the interval's aggregates (CPU first, then off-CPU, lock and allocation ones as
    /// asked), logging what each sampled, and tells the tracker which processes were sampled.
    fn take_intervals(
        &mut self,
        kernel: &KernelCounters,
        tracker: &TrackerThread,
        stats: &mut LoopStats,
    ) -> Vec<IntervalStacks> {
        let interval = self.cpu.take_interval();
        tracker.tell_sampled(interval.processes.keys().copied().collect());
        let jvms = tracker.counts();
        stats.count_bounds(&interval);
        tracing::info!(
            processes = interval.processes.len(),
            samples = kernel.get(Counter::Samples),
            sent = kernel.get(Counter::Sent),
            idle = kernel.get(Counter::Idle),
            filtered = kernel.get(Counter::Filtered),
            ring_full = kernel.get(Counter::RingFull),
            kernel_stack_failed = kernel.get(Counter::KernelStackFailed),
            user_stack_truncated = kernel.get(Counter::UserStackTruncated),
            malformed_records = stats.malformed,
            dropped_work = stats.dropped_work,
            unwind_ends = %format_unwind_ends(&stats.unwind_ends),
            jvms_ready = jvms.jvms_ready,
            jvms_pending = jvms.jvms_pending,
            jvms_failed = jvms.jvms_failed,
            jvms_over_bound = jvms.jvms_over_bound,
            "interval sampled"
        );
        stats.unwind_ends = Default::default();
        let mut intervals = vec![interval];
        if let Some(off_cpu) = &mut self.off_cpu {
            let interval = off_cpu.aggregator.take_interval();
            // Waits whose end was lost would stay open for good: forget those of exited processes
            // (a check per process with open waits, once an interval).
            off_cpu
                .joiner
                .forget_waits_of_exited(crate::process_key::ProcessKey::of_live);
            stats.off_cpu = off_cpu.joiner.stats;
            stats.off_cpu_open_waits = off_cpu.joiner.open_waits() as u64;
            tracing::info!(
                processes = interval.processes.len(),
                switches = kernel.get(Counter::OffCpuSwitches),
                sampled = kernel.get(Counter::OffCpuSampled),
                ring_full = kernel.get(Counter::OffCpuRingFull),
                no_storage = kernel.get(Counter::OffCpuNoStorage),
                open_waits = stats.off_cpu_open_waits,
                "off-CPU interval sampled"
            );
            stats.past_bound += interval.past_bound;
            if off_cpu.write_profiles {
                intervals.push(interval);
            }
            if let Some(lock) = &mut off_cpu.lock {
                for aggregator in [&mut lock.mutex, &mut lock.block] {
                    let interval = aggregator.take_interval();
                    stats.count_bounds(&interval);
                    intervals.push(interval);
                }
            }
        }
        if let Some(alloc) = &mut self.alloc {
            let interval = alloc.aggregator.take_interval();
            stats.count_bounds(&interval);
            tracing::info!(
                processes = interval.processes.len(),
                events = kernel.get(Counter::AllocEvents),
                sampler_events = kernel.get(Counter::AllocSamplerEvents),
                sampler_first_skipped = kernel.get(Counter::AllocSamplerFirstSkipped),
                sampled = kernel.get(Counter::AllocSampled),
                ring_full = kernel.get(Counter::AllocRingFull),
                nested = kernel.get(Counter::AllocNested),
                walks_from_hook = kernel.get(Counter::AllocWalkFromHook),
                "allocation interval sampled"
            );
            intervals.push(interval);
        }
        intervals
    }
}

/// Parses a ring record; a malformed one is counted (and the first logged).
fn parse_record<'a>(bytes: &'a [u8], stats: &mut LoopStats) -> Option<SampleView<'a>> {
    match SampleView::parse(bytes) {
        Ok(view) => Some(view),
        Err(err) => {
            stats.malformed += 1;
            if stats.malformed == 1 {
                tracing::warn!(%err, "malformed sample record (further ones are only counted)");
            }
            None
        }
    }
}

/// What one drain found that the other threads must hear of: new processes, and the Java
/// frames of new stacks not sent before this interval.
struct FoundInDrain<'a> {
    prefetched: &'a mut PrefetchedFrames,
    young: &'a mut YoungProcesses,
    java_frames: Vec<JavaFrameSeen>,
    /// Whether any frame went into `java_frames` in this drain (some may be sent already).
    new_java_frames: bool,
    /// The processes of the new stacks with Java frames (JVMs whose Java frames unwind).
    java_pids: Vec<u32>,
    new_processes: Vec<u32>,
}

/// What a drain found that decides when the next one comes.
struct Found {
    new_java_stacks: bool,
    new_java_frames: bool,
}

/// What a drain's folds tell the loop.
struct DrainFinds {
    /// The processes of the new stacks with Java frames, sorted.
    java_pids: Vec<u32>,
    /// Whether any of their Java frames was not met before this interval.
    new_java_frames: bool,
}

impl FoundInDrain<'_> {
    fn note(
        &mut self,
        view: &SampleView<'_>,
        added: Added,
        outbox: &Outbox,
        stats: &mut LoopStats,
    ) {
        if matches!(
            added,
            Added::NewProcess | Added::PastBound { new_process: true }
        ) {
            outbox.send(Work::ProcessSeen(view.pid()), stats);
            self.new_processes.push(view.pid());
            self.young.told(view.pid(), Instant::now());
        }
        // The Java frames of a new stack are read soon, in one batch per drain: the methods of
        // short-lived classes may be unloaded (their memory reused) before the interval ends.
        if matches!(added, Added::NewProcess | Added::NewStack) {
            let pid = view.pid();
            let mut java = false;
            for (key, frame) in view.keyed_user_frames() {
                if !key.is_java() {
                    continue;
                }
                java = true;
                if self.prefetched.first_time(pid, frame.addr(), frame.cookie) {
                    self.java_frames.push(JavaFrameSeen { pid, frame });
                    self.new_java_frames = true;
                }
            }
            if java && self.java_pids.last() != Some(&pid) {
                self.java_pids.push(pid);
            }
            if self.java_frames.len() >= MAX_PREFETCH_FRAMES {
                let frames = std::mem::take(&mut self.java_frames);
                outbox.send_java_frames(frames, stats);
            }
        }
    }

    /// Sends what is left; returns what the loop must hear of.
    fn finish(mut self, outbox: &Outbox, stats: &mut LoopStats) -> DrainFinds {
        // A full queue means the loader is behind (building tables): these processes come again
        // at their first sample of the next interval.
        if !self.new_processes.is_empty() {
            self.new_processes.sort_unstable();
            self.new_processes.dedup();
            let _ = outbox.unwind_tables.try_send(self.new_processes);
        }
        let young = self.young.due(Instant::now());
        if !young.is_empty() {
            outbox.send(Work::YoungProcessesSeen(young), stats);
        }
        if !self.java_frames.is_empty() {
            outbox.send_java_frames(self.java_frames, stats);
        }
        self.java_pids.sort_unstable();
        self.java_pids.dedup();
        DrainFinds {
            java_pids: self.java_pids,
            new_java_frames: self.new_java_frames,
        }
    }
}

impl LoopStats {
    /// What an interval's aggregator could not keep, or kept without frames.
    fn count_bounds(&mut self, interval: &IntervalStacks) {
        self.dropped_over_stack_bound += interval.dropped_over_bound;
        self.past_bound += interval.past_bound;
    }
}

fn format_unwind_ends(ends: &[u64; UnwindEnd::ALL.len()]) -> String {
    UnwindEnd::ALL
        .iter()
        .map(|end| format!("{}={}", end.name(), ends[*end as usize]))
        .collect::<Vec<_>>()
        .join(",")
}

impl Outbox {
    /// Queues `item` for the worker; false (and counted) when the queue is full or gone.
    fn send(&self, item: Work, stats: &mut LoopStats) -> bool {
        queued(self.work.try_send(item), "symbolizer", stats)
    }

    /// Queues Java frames for the reader; dropped (and counted) when its queue is full or gone:
    /// they are read when their profile is built, if their methods still exist.
    fn send_java_frames(&self, frames: Vec<JavaFrameSeen>, stats: &mut LoopStats) {
        queued(self.java_frames.try_send(frames), "Java name reader", stats);
    }
}

/// Whether a queue took its item; a drop is counted in `dropped_work`.
fn queued<T>(sent: Result<(), TrySendError<T>>, queue: &str, stats: &mut LoopStats) -> bool {
    match sent {
        Ok(()) => return true,
        Err(TrySendError::Full(_)) => {
            stats.dropped_work += 1;
            // Counted every time, logged at 1, 2, 4, 8... drops: never a log line per sample.
            if stats.dropped_work.is_power_of_two() {
                tracing::warn!(
                    dropped = stats.dropped_work,
                    "{queue} queue full: work dropped"
                );
            }
        }
        Err(TrySendError::Disconnected(_)) => stats.dropped_work += 1,
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(records: bool, new_java: bool, names_perishing: bool) -> Drained {
        Drained {
            records,
            new_java_stacks: new_java,
            new_java_frames: new_java,
            names_perishing,
            starting: false,
        }
    }

    #[test]
    fn perishing_names_keep_drains_fast_even_after_an_empty_drain() {
        assert_eq!(
            next_drain(drained(true, true, true)),
            PERISHING_JAVA_DRAIN_PERIOD
        );
        assert_eq!(
            next_drain(drained(true, false, true)),
            STARTUP_JAVA_DRAIN_PERIOD
        );
        assert_eq!(
            next_drain(drained(false, false, true)),
            STARTUP_JAVA_DRAIN_PERIOD
        );
    }

    #[test]
    fn known_frames_in_new_stacks_keep_drains_fast_only_while_names_perish() {
        let known_frames = |names_perishing, starting| Drained {
            records: true,
            new_java_stacks: true,
            new_java_frames: false,
            names_perishing,
            starting,
        };
        // Churn: a new generation's first samples must be read within 10 ms.
        assert_eq!(
            next_drain(known_frames(true, false)),
            PERISHING_JAVA_DRAIN_PERIOD
        );
        // Start-up: only frames not read yet bring the next drain closer.
        assert_eq!(next_drain(known_frames(false, true)), DRAIN_PERIOD);
    }

    #[test]
    fn quiet_drains_slow_down() {
        assert_eq!(next_drain(drained(true, false, false)), DRAIN_PERIOD);
        assert_eq!(next_drain(drained(false, false, false)), IDLE_DRAIN_PERIOD);
        let starting = Drained {
            starting: true,
            ..drained(true, true, false)
        };
        assert_eq!(next_drain(starting), STARTUP_JAVA_DRAIN_PERIOD);
        let starting_quiet = Drained {
            starting: true,
            ..drained(false, false, false)
        };
        assert_eq!(next_drain(starting_quiet), IDLE_DRAIN_PERIOD);
    }
}
