//! The daemon's background threads beside the sampling loop: the JVM tracker and the unwind
//! tables' loader, each spawned with the BPF maps it owns, the symbolizer, and the Java name
//! reader that fills the symbolizer's Java caches ahead.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};

use aya::maps::{MapData, RingBuf};

use super::DaemonError;
use crate::config::Config;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::libjvm_hooks::LibjvmHooks;
use crate::hotspot::remote::ProcessMemory;
use crate::hotspot::thread_directory::ThreadDirectory;
use crate::hotspot::thread_exits::ExitCounts;
use crate::hotspot::tracker::{self, JvmTracker, TrackerCounts};
use crate::kubernetes::SharedPodIndex;
use crate::metrics::families::{by, Families, MetricSource};
use crate::native_unwind;
use crate::sampler::kernel_names::KernelNameProgram;
use crate::sidecar::{Attacher, AttachesStarted};
use crate::sink::Sink;
use crate::symbolize::java_reader::{JavaFrameSeen, JavaReader, MemoryNameCaches, ReaderCounters};
use crate::worker::{Work, Worker};
use crate::worker_metrics::WorkerCounters;

/// What the symbolizer shares with the other threads.
pub(super) struct SharedWithWorker {
    /// The JVMs' Java threads, as the tracker reads them.
    pub(super) java_threads: ThreadDirectory,
    /// Each JVM inspected once, by the tracker or the symbolizer.
    pub(super) jvms: JvmDirectory,
    /// The Java name caches the reader fills ahead.
    pub(super) memory_names: MemoryNameCaches<ProcessMemory>,
    /// The JVMs the tracker started loading the sidecar agent into.
    pub(super) attaches: AttachesStarted,
    /// The unwind tables' loader, for the processes whose mappings changed.
    pub(super) unwind_tables: SyncSender<Vec<u32>>,
    /// Kubernetes pods' metadata, when watched.
    pub(super) pods: Option<SharedPodIndex>,
    /// The ended threads' allocations of JVMs before JDK 14, with `--alloc`.
    pub(super) exit_counts: Option<ExitCounts>,
    /// The kernel's own symbol lookup, where its program loaded.
    pub(super) kernel_names: Option<KernelNameProgram>,
}

/// The symbolizer thread (`worker.rs`), on a thread of its own (blazesym's symbolizer is not
/// `Send`); it ends when the work queue's sender is dropped.
pub(super) fn spawn_worker(
    config: &Config,
    (sinks, counters): (Vec<Box<dyn Sink>>, Arc<WorkerCounters>),
    cache_budget: u64,
    shared: SharedWithWorker,
    work: Receiver<Work>,
) -> Result<std::thread::JoinHandle<()>, DaemonError> {
    let frequency_hz = config.frequency_hz;
    let presentation = crate::sink::Presentation {
        annotate_frames: config.annotate_frames,
        threads: config.threads,
        virtual_threads: config.virtual_threads,
    };
    let (naming, extra_labels) = (config.naming.clone(), config.labels.clone());
    let alloc_interval = config
        .alloc
        .map_or(profiler_common::ALLOC_INTERVAL_BYTES, |alloc| {
            alloc.interval_bytes
        });
    std::thread::Builder::new()
        .name("symbolizer".into())
        .spawn(move || {
            Worker::new(sinks, naming, frequency_hz, presentation, counters)
                .with_cache_budget(cache_budget)
                .expecting_agents(shared.attaches)
                .with_thread_directory(shared.java_threads)
                .with_jvms(shared.jvms)
                .with_memory_names(shared.memory_names)
                .with_pods_if(shared.pods)
                .with_extra_labels(extra_labels)
                .with_alloc_interval(alloc_interval)
                .with_exit_counts(shared.exit_counts)
                .with_kernel_names(shared.kernel_names)
                .telling_unwind_tables(shared.unwind_tables)
                .run(work)
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))
}

/// Runs one tick of the JVM tracker; 1 if it panicked (logged), else 0. The tracker reads every
/// JVM's memory and /proc entries: a bug that input trips costs this tick, not the node's JVM
/// tracking.
fn guarded_tick(tick: impl FnOnce()) -> u64 {
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(tick)).is_ok() {
        return 0;
    }
    tracing::error!(
        "the JVM tracker panicked (a bug; please report it with the log above): that tick is \
         lost, tracking goes on"
    );
    1
}

/// Replaces `events` with what the process events' ring holds (reading an empty ring is two
/// loads from shared memory: no syscall).
fn take_process_events(
    ring: &mut RingBuf<MapData>,
    events: &mut Vec<profiler_common::ProcessEvent>,
) {
    events.clear();
    while let Some(item) = ring.next() {
        if let Some(event) = profiler_common::ProcessEvent::from_bytes(&item) {
            events.push(event);
        }
    }
}

/// Batches of Java frames queued for the reader before the loop starts dropping them.
const JAVA_READER_QUEUE: usize = 1024;

/// The Java name reader (`symbolize::java_reader`); it ends when the sender is dropped.
pub(super) fn spawn_java_reader(
    (caches, jvms): (MemoryNameCaches<ProcessMemory>, JvmDirectory),
    symbolizer: SyncSender<Work>,
    counters: Arc<ReaderCounters>,
) -> Result<(SyncSender<Vec<JavaFrameSeen>>, std::thread::JoinHandle<()>), DaemonError> {
    let (frames, frames_rx) = sync_channel(JAVA_READER_QUEUE);
    let handle = std::thread::Builder::new()
        .name("java-reader".into())
        .spawn(move || {
            // A full queue: the symbolizer meets the JVM when it builds its profile.
            let tell = Box::new(move || {
                let _ = symbolizer.try_send(Work::JavaProcessMet);
            });
            JavaReader::new(caches, jvms, tell, counters).run(frames_rx)
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;
    Ok((frames, handle))
}

/// The JVM tracker's thread, stopped through a flag.
pub(super) struct TrackerThread {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<TrackerCounts>>,
    /// The pids of each interval's samples.
    sampled: SyncSender<Vec<u32>>,
    /// The pids of new stacks with Java frames, each drain.
    java_sampled: SyncSender<Vec<u32>>,
    /// Fires once the tracker's first tick has ended.
    first_tick: Option<tokio::sync::oneshot::Receiver<()>>,
    handle: std::thread::JoinHandle<()>,
}

impl TrackerThread {
    /// Waits, at most `bound`, for the tracker's first tick to end: by then it has pushed the
    /// layouts of the JVMs it found running (those of `--pid`, or the host's on its first
    /// scan). Returns at once after the first call.
    pub(super) async fn first_tick(&mut self, bound: std::time::Duration) {
        if let Some(first_tick) = self.first_tick.take() {
            if tokio::time::timeout(bound, first_tick).await.is_err() {
                tracing::info!(
                    waited_ms = bound.as_millis() as u64,
                    "the JVM tracker's first pass is still running: sampling starts; samples of \
                     JVMs it has not read yet show their compiled code as unknown native frames"
                );
            }
        }
    }

    pub(super) fn counts(&self) -> TrackerCounts {
        self.counts.lock().map(|c| *c).unwrap_or_default()
    }

    /// The counts as the tracker's thread shares them after each tick (for the metrics).
    pub(super) fn shared_counts(&self) -> Arc<Mutex<TrackerCounts>> {
        self.counts.clone()
    }

    /// Tells the tracker which processes were sampled (it checks those it does not know).
    pub(super) fn tell_sampled(&self, pids: Vec<u32>) {
        // A full queue means the tracker is behind: it will see these at its next rescan.
        let _ = self.sampled.try_send(pids);
    }

    /// Tells the tracker which JVMs have new stacks with Java frames: the JVMs the sidecar
    /// agent may be loaded into.
    pub(super) fn tell_java_sampled(&self, pids: Vec<u32>) {
        // A full queue: the same JVMs come again with their next new stacks.
        let _ = self.java_sampled.try_send(pids);
    }

    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
    }
}

/// The panics caught in the threads beside the sampling loop: each one's own count, a family
/// of their own.
pub(super) struct ThreadPanics {
    pub(super) worker: Arc<WorkerCounters>,
    pub(super) tracker: Arc<Mutex<TrackerCounts>>,
}

impl MetricSource for ThreadPanics {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        let tracker = self.tracker.lock().map_or(0, |counts| counts.panics);
        out.counters(
            profiler_common::metric::THREAD_PANICS,
            "Panics caught in the daemon's threads, by thread (a bug: each cost one work item or \
             tick; the thread goes on with fresh state).",
            by(
                "thread",
                [
                    ("symbolizer", self.worker.panics.load(Ordering::Relaxed)),
                    (
                        "java_reader",
                        self.worker.java_reader.panics.load(Ordering::Relaxed),
                    ),
                    ("jvm_tracker", tracker),
                ],
            ),
        )
    }
}

/// The unwind tables' loader thread (`native_unwind::loader`); it ends when the sender is
/// dropped.
pub(super) fn spawn_unwind_tables(
    maps: native_unwind::loader::BpfTableMaps,
    budget_bytes: u64,
    stats: Arc<native_unwind::loader::TableStats>,
) -> Result<SyncSender<Vec<u32>>, DaemonError> {
    let (sampled, sampled_rx) = sync_channel::<Vec<u32>>(16);
    std::thread::Builder::new()
        .name("unwind-tables".into())
        .spawn(move || {
            native_unwind::loader::UnwindTables::new(maps, budget_bytes, stats).run(sampled_rx)
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;
    Ok(sampled)
}

pub(super) fn spawn_jvm_tracker(
    maps: tracker::BpfMaps,
    mut process_events: RingBuf<MapData>,
    max_jvms: usize,
    pids: Vec<u32>,
    (threads, jvms): (ThreadDirectory, JvmDirectory),
    mut attacher: Attacher,
    libjvm_hooks: Option<LibjvmHooks>,
) -> Result<TrackerThread, DaemonError> {
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Mutex::new(TrackerCounts::default()));
    let (sampled, sampled_rx) = sync_channel::<Vec<u32>>(4);
    let (java_sampled, java_sampled_rx) = sync_channel::<Vec<u32>>(64);
    let (first_ticked, first_tick) = tokio::sync::oneshot::channel();
    let mut first_ticked = Some(first_ticked);
    let (stop_flag, shared_counts) = (stop.clone(), counts.clone());
    let handle = std::thread::Builder::new()
        .name("jvm-tracker".into())
        .spawn(move || {
            let mut tracker = JvmTracker::new(maps, max_jvms, pids)
                .with_directory(threads)
                .with_jvms(jvms)
                .with_libjvm_hooks(libjvm_hooks);
            let mut events = Vec::new();
            let mut panics = 0;
            while !stop_flag.load(Ordering::Relaxed) {
                take_process_events(&mut process_events, &mut events);
                let sampled: Vec<u32> = sampled_rx.try_iter().flatten().collect();
                let java_sampled: Vec<u32> = java_sampled_rx.try_iter().flatten().collect();
                panics += guarded_tick(|| {
                    tracker.tick(&events, &sampled);
                    attach_sampled_jvms(&tracker, &mut attacher, java_sampled);
                });
                if let Ok(mut counts) = shared_counts.lock() {
                    *counts = TrackerCounts {
                        panics,
                        ..tracker.counts()
                    };
                }
                if let Some(first_ticked) = first_ticked.take() {
                    let _ = first_ticked.send(());
                }
                // Until the next tick, quick ones: new processes are looked at within
                // QUICK_TICK_PERIOD of their exec.
                let next_tick = std::time::Instant::now() + tracker::TICK_PERIOD;
                loop {
                    let left = next_tick.saturating_duration_since(std::time::Instant::now());
                    if left.is_zero() || stop_flag.load(Ordering::Relaxed) {
                        break;
                    }
                    if !tracker.wants_quick_ticks() {
                        std::thread::sleep(left);
                        break;
                    }
                    std::thread::sleep(left.min(tracker::QUICK_TICK_PERIOD));
                    take_process_events(&mut process_events, &mut events);
                    panics += guarded_tick(|| tracker.quick_tick(&events));
                }
            }
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;
    Ok(TrackerThread {
        stop,
        counts,
        first_tick: Some(first_tick),
        sampled,
        java_sampled,
        handle,
    })
}

/// The attach decision, from the tracker's view: a JVM whose layout is ready and whose samples
/// show Java frames is offered to the attacher (which applies the policy, once per JVM).
fn attach_sampled_jvms<S: tracker::LayoutSink>(
    tracker: &JvmTracker<S>,
    attacher: &mut Attacher,
    mut pids: Vec<u32>,
) {
    // First forget the JVMs that exited, so that a reused pid is a new JVM.
    attacher.retain(|pid, start_time| tracker.ready_jvm(pid) == Some(start_time));
    pids.sort_unstable();
    pids.dedup();
    for pid in pids {
        if let (Some(start_time), Some(major)) =
            (tracker.ready_jvm(pid), tracker.ready_jvm_major(pid))
        {
            attacher.consider(pid, start_time, major);
        }
    }
}
