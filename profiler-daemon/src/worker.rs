//! The symbolizing side of the pipeline, on its own thread: reads new processes as they appear,
//! and at each interval turns each process's folded stacks into its symbolized profile
//! (`crate::profiles`) and hands it to every sink. Kept off the sampling loop so that
//! slow symbol loading never delays draining the ring buffer.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use profiler_common::SampleKind;

use crate::aggregate::IntervalStacks;
use crate::alloc_scale::{self, AllocScale, Scaled};
use crate::hotspot::remote::ProcessMemory;
use crate::hotspot::thread_exits::ExitCounts;
use crate::identity::ServiceNaming;
use crate::process::ProcessTable;
use crate::profile_model::ProfileKind;
use crate::profile_model::SymbolizedProfile;
use crate::profiles::{self, ProfileRequest};
use crate::sink::{Presentation, Sink, SinkProfile};
use crate::symbolize::symbolizers::Symbolizers;
use crate::virtual_thread_roots::root_virtual_threads;
use crate::worker_metrics::WorkerCounters;

pub enum Work {
    /// A process had its first sample of the interval: read its mappings while it is alive.
    ProcessSeen(u32),
    /// Processes the sampling loop met in the last seconds, sampled since: each is read again
    /// if what it maps may have changed (see `process`).
    YoungProcessesSeen(Vec<u32>),
    /// Panics in the worker: how the tests check that a panic costs one work item, not the
    /// node's profiling.
    #[cfg(test)]
    Panic,
    /// An interval's stacks: the CPU ones, then the off-CPU ones when that is on. One item,
    /// so that processes that exited during the interval are forgotten after all its profiles
    /// are built (an off-CPU wait is folded when it ends, often just before its process exits).
    Interval(Vec<IntervalStacks>),
    /// The Java name reader met a JVM first: its agent's records are read from now on.
    JavaProcessMet,
}

/// How often the agents' records are read while the interval runs. Reading them first when a
/// profile is built would be too late for the threads an agent lists by `JavaThread*`: those
/// resolve only against a thread set the tracker read after the record.
const READ_SIDECARS_EVERY: Duration = Duration::from_millis(500);

pub struct Worker {
    processes: ProcessTable,
    symbolizers: Symbolizers,
    /// Where profiles go, in order (see `sink`).
    sinks: Vec<Box<dyn Sink>>,
    naming: ServiceNaming,
    /// Labels every profile's series carries besides its process's own (`labels`).
    extra_labels: std::collections::BTreeMap<String, String>,
    pods: Option<crate::kubernetes::SharedPodIndex>,
    frequency_hz: u64,
    alloc_interval_bytes: u64,
    presentation: Presentation,
    /// Shared with the metrics endpoint.
    counters: Arc<WorkerCounters>,
    /// What the symbolizers were built with, to build them anew after a panic.
    cache_budget: Option<u64>,
    thread_directory: Option<crate::hotspot::thread_directory::ThreadDirectory>,
    /// The JVMs the tracker started loading the sidecar agent into.
    attaches: crate::sidecar::AttachesStarted,
    /// Each JVM's last count of its allocated bytes, for its next allocation profile's scale.
    alloc_scale: AllocScale,
    /// The unwind tables' loader, told of a process whose mappings changed since it was first
    /// read (a young process's libraries, an exec).
    unwind_tables: Option<std::sync::mpsc::SyncSender<Vec<u32>>>,
}

impl Worker {
    pub fn new(
        sinks: Vec<Box<dyn Sink>>,
        naming: ServiceNaming,
        frequency_hz: u64,
        presentation: Presentation,
        counters: Arc<WorkerCounters>,
    ) -> Self {
        Self {
            processes: ProcessTable::default(),
            symbolizers: counted_symbolizers(&counters),
            sinks,
            naming,
            extra_labels: Default::default(),
            pods: None,
            frequency_hz,
            alloc_interval_bytes: profiler_common::ALLOC_INTERVAL_BYTES,
            presentation,
            counters,
            cache_budget: None,
            thread_directory: None,
            attaches: Default::default(),
            alloc_scale: AllocScale::default(),
            unwind_tables: None,
        }
    }

    /// Tells the unwind tables' loader of the processes read again (see `process`).
    pub fn telling_unwind_tables(mut self, loader: std::sync::mpsc::SyncSender<Vec<u32>>) -> Self {
        self.unwind_tables = Some(loader);
        self
    }

    /// The ended threads' allocations of JVMs that do not count them (before JDK 14).
    pub fn with_exit_counts(mut self, exit_counts: Option<ExitCounts>) -> Self {
        self.alloc_scale = AllocScale::with_exit_counts(exit_counts);
        self
    }

    /// The allocation sampling interval, allocation profiles' period (`--alloc=BYTES`).
    pub fn with_alloc_interval(mut self, bytes: u64) -> Self {
        self.alloc_interval_bytes = bytes;
        self
    }

    /// Labels the series of every profile with these too (the config's `labels`).
    pub fn with_extra_labels(mut self, labels: std::collections::BTreeMap<String, String>) -> Self {
        self.extra_labels = labels;
        self
    }

    /// Labels processes of Kubernetes pods with their pod's metadata, when there is a watch.
    pub fn with_pods_if(mut self, pods: Option<crate::kubernetes::SharedPodIndex>) -> Self {
        self.pods = pods;
        self
    }

    /// Names kernel frames with the kernel's own lookup, where its program loaded.
    pub fn with_kernel_names(
        mut self,
        program: Option<crate::sampler::kernel_names::KernelNameProgram>,
    ) -> Self {
        self.symbolizers.kernel = crate::symbolize::kernel::KernelSymbolizer::with_program(program);
        self
    }

    /// Bounds the symbolization caches to about `limit_bytes` (published in the counters).
    pub fn with_cache_budget(mut self, limit_bytes: u64) -> Self {
        self.cache_budget = Some(limit_bytes);
        self.symbolizers.native = crate::symbolize::native::NativeSymbolizer::with_budget_stats(
            limit_bytes,
            self.counters.symbol_cache.clone(),
        );
        self
    }

    /// Shares the JVM tracker's inspected JVMs, so that each is inspected once.
    pub fn with_jvms(mut self, jvms: crate::hotspot::jvm_directory::JvmDirectory) -> Self {
        self.symbolizers.jvms = jvms;
        self
    }

    /// Names Java frames from the caches the Java name reader fills.
    pub fn with_memory_names(
        mut self,
        caches: crate::symbolize::java_reader::MemoryNameCaches<ProcessMemory>,
    ) -> Self {
        self.symbolizers.java.share_memory_names(caches);
        self
    }

    /// Names threads the sidecar agents list by `JavaThread*` from the JVM tracker's reads.
    pub fn with_thread_directory(
        mut self,
        threads: crate::hotspot::thread_directory::ThreadDirectory,
    ) -> Self {
        self.symbolizers.java.set_thread_directory(threads.clone());
        self.thread_directory = Some(threads);
        self
    }

    /// Reads the records of the agents the tracker started attaching more often, until they come.
    pub fn expecting_agents(mut self, attaches: crate::sidecar::AttachesStarted) -> Self {
        self.attaches = attaches;
        self
    }

    /// Runs until the sending side is dropped.
    pub fn run(mut self, work: Receiver<Work>) {
        let mut sidecars_read = Instant::now();
        loop {
            // No timer without JVMs: an idle node's daemon wakes only for work.
            let item = if self.symbolizers.java.is_empty() {
                work.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                work.recv_timeout(READ_SIDECARS_EVERY)
            };
            let item = match item {
                Ok(item) => Some(item),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            let read_sidecars = sidecars_read.elapsed() >= READ_SIDECARS_EVERY;
            if read_sidecars {
                sidecars_read = Instant::now();
            }
            // Everything here reads what profiled processes wrote (their memory, files and
            // records): a bug that input trips must cost this item, not the node's profiling.
            let handled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if let Some(item) = item {
                    self.handle(item);
                }
                if read_sidecars {
                    let attaches = &self.attaches;
                    self.symbolizers
                        .java
                        .read_sidecars(|pid| attaches.contains(pid));
                }
            }));
            if handled.is_err() {
                self.counters.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    "the symbolizer panicked (a bug; please report it with the log above): its \
                     caches start over and it goes on; that work item is lost"
                );
                self.restart_symbolizers();
            }
        }
    }

    fn handle(&mut self, item: Work) {
        match item {
            Work::ProcessSeen(pid) => self.observe_processes(&[pid]),
            Work::YoungProcessesSeen(pids) => self.observe_processes(&pids),
            Work::JavaProcessMet => self.symbolizers.java.adopt_read_jvms(),
            Work::Interval(intervals) => {
                let counters = self.counters.clone();
                // Given back even if writing panics: the loop would put off intervals for good.
                let _taken = IntervalTaken(&counters.intervals_pending);
                self.write_intervals(intervals);
            }
            #[cfg(test)]
            Work::Panic => panic!("a test asked the worker to panic"),
        }
    }

    /// Reads the processes `pids` unless known and current; those read again (what they map
    /// may have changed) go to the unwind tables' loader too.
    fn observe_processes(&mut self, pids: &[u32]) {
        let read_again: Vec<u32> = pids
            .iter()
            .copied()
            .filter(|&pid| self.processes.observe(pid))
            .collect();
        if let (Some(loader), false) = (&self.unwind_tables, read_again.is_empty()) {
            // A full queue: the loader reads them again at their next interval's first sample.
            let _ = loader.try_send(read_again);
        }
    }

    /// Builds the symbolizers and the process table anew, as configured: after a panic their
    /// state may be half updated.
    fn restart_symbolizers(&mut self) {
        let mut symbolizers = counted_symbolizers(&self.counters);
        if let Some(limit_bytes) = self.cache_budget {
            symbolizers.native = crate::symbolize::native::NativeSymbolizer::with_budget_stats(
                limit_bytes,
                self.counters.symbol_cache.clone(),
            );
        }
        if let Some(threads) = &self.thread_directory {
            symbolizers.java.set_thread_directory(threads.clone());
        }
        // The directory is shared with the tracker, the Java name caches with the reader: the
        // fresh symbolizers keep using them (each cache entry is whole or absent).
        symbolizers.jvms = self.symbolizers.jvms.clone();
        symbolizers.kernel = crate::symbolize::kernel::KernelSymbolizer::with_program(
            self.symbolizers.kernel.take_program(),
        );
        symbolizers
            .java
            .share_memory_names(self.symbolizers.java.memory_names());
        self.symbolizers = symbolizers;
        self.processes = ProcessTable::default();
    }

    fn write_intervals(&mut self, intervals: Vec<IntervalStacks>) {
        let began = Instant::now();
        let counts = self.read_allocation_counts(&intervals);
        for interval in &intervals {
            let (profiles, samples) = self.write_profiles(interval, &counts);
            tracing::info!(
                kind = interval.kind.file_prefix(),
                profiles,
                samples,
                dropped_over_stack_bound = interval.dropped_over_bound,
                unreadable_processes = self.processes.unreadable,
                elapsed_ms = began.elapsed().as_millis() as u64,
                "interval written"
            );
        }
        for sink in &mut self.sinks {
            sink.end_interval();
        }
        self.processes.forget_exited();
        self.symbolizers.forget_exited(&self.processes);
        // The interval's stack tables and profiles, and whatever the exited processes held, are
        // freed now: their pages go back to the kernel rather than stay resident in the arena.
        crate::own_memory::release_free_pages();
        crate::own_memory::drop_unmapped_own_binary_pages();
        let sidecars = self.symbolizers.java.sidecar_totals();
        self.counters
            .sidecar_agents
            .store(sidecars.agents, Ordering::Relaxed);
        self.counters
            .sidecar_agent_heap_bytes
            .store(sidecars.heap_live_bytes, Ordering::Relaxed);
        self.counters
            .sidecar_dropped_records
            .fetch_add(sidecars.new_dropped_records, Ordering::Relaxed);
        for (reason, gauge) in crate::sidecar::index::REFUSAL_REASONS
            .iter()
            .zip(&self.counters.sidecar_records_refused)
        {
            gauge.store(
                sidecars.refused.get(reason).copied().unwrap_or(0),
                Ordering::Relaxed,
            );
        }
    }

    /// Builds the profiles of one interval's stacks and hands each to every sink; returns how
    /// many were built and the samples they hold.
    fn write_profiles(
        &mut self,
        interval: &IntervalStacks,
        counts: &HashMap<u32, Option<u64>>,
    ) -> (u64, u64) {
        let (mut built, mut samples) = (0, 0);
        for (&pid, stacks) in &interval.processes {
            samples += stacks.samples();
            // A JVM's first lock or allocation profile covers only what came after its hooks.
            let (start, duration) = self.symbolizers.jvms.covered(
                pid,
                interval.kind,
                interval.start,
                interval.duration,
            );
            let request = ProfileRequest {
                kind: interval.kind,
                pid,
                comm: self.processes.get(pid).map(|info| info.comm.clone()),
                stacks,
                frequency_hz: self.frequency_hz,
                alloc_interval_bytes: self.alloc_interval_bytes,
                start,
                duration,
            };
            let mut names = self.symbolizers.names_of(pid, stacks, &mut self.processes);
            let mut profile = profiles::build(request, &mut names);
            if interval.kind == ProfileKind::Alloc {
                if let Some(&count) = counts.get(&pid) {
                    self.scale_allocations(pid, count, &mut profile);
                }
            }
            if interval.kind == ProfileKind::Block {
                crate::lock::keep_parked(&mut profile);
            }
            root_virtual_threads(&mut profile, self.presentation.virtual_threads);
            built += 1;
            let identity = {
                let pods = self.pods.as_ref().and_then(|pods| pods.read().ok());
                self.naming
                    .identify(self.processes.get(pid), &profile.comm, pods.as_deref())
            };
            let labels = identity.labels(&self.extra_labels, interval.kind.pyroscope_name());
            let shared =
                SinkProfile::new(&profile, &identity.service_name, &labels, self.presentation);
            for sink in &mut self.sinks {
                sink.accept(&shared);
            }
        }
        if interval.kind == ProfileKind::Alloc {
            // The JVMs counted without a profile this interval: their next one starts here.
            for (&pid, &count) in counts {
                if let (false, Some(process)) = (
                    interval.processes.contains_key(&pid),
                    self.processes.get(pid),
                ) {
                    self.alloc_scale.note(pid, process.key(), count);
                }
            }
            let processes = &self.processes;
            self.alloc_scale
                .forget_exited(|pid| processes.get(pid).is_some());
        }
        (built, samples)
    }

    /// Each JVM's count of its allocated bytes (`alloc_scale`), read first thing, as close to
    /// the interval's end as can be: those whose allocation profile comes from HotSpot's
    /// sampler, and those counted before.
    fn read_allocation_counts(
        &mut self,
        intervals: &[IntervalStacks],
    ) -> HashMap<u32, Option<u64>> {
        let mut counts = HashMap::new();
        let Some(alloc) = intervals.iter().find(|i| i.kind == ProfileKind::Alloc) else {
            return counts;
        };
        let from_sampler = alloc.processes.iter().filter_map(|(&pid, stacks)| {
            stacks
                .stacks()
                .any(|(view, _)| {
                    SampleKind::from_u8(view.header.kind) == Some(SampleKind::AllocSampled)
                })
                .then_some(pid)
        });
        let pids: Vec<u32> = from_sampler.chain(self.alloc_scale.scaled_pids()).collect();
        for pid in pids {
            if counts.contains_key(&pid) {
                continue;
            }
            let Some(process) = self.processes.get(pid) else {
                continue;
            };
            let count = self
                .symbolizers
                .jvms
                .inspect(process, &ProcessMemory::new(pid))
                .ok()
                .and_then(|jvm| self.alloc_scale.count(&jvm));
            counts.insert(pid, count);
        }
        counts
    }

    /// Scales `pid`'s allocation profile from HotSpot's sampler to the bytes its JVM counted,
    /// `count` at the interval's end (`alloc_scale`).
    fn scale_allocations(&mut self, pid: u32, count: Option<u64>, profile: &mut SymbolizedProfile) {
        let Some(process) = self.processes.get(pid) else {
            return;
        };
        let sampled = alloc_scale::sampled_bytes(profile);
        match self.alloc_scale.scale(pid, process.key(), count, sampled) {
            Scaled::By(factor) => {
                alloc_scale::apply(profile, factor);
                self.counters
                    .alloc_profiles_scaled
                    .fetch_add(1, Ordering::Relaxed);
            }
            Scaled::Refused => {
                self.counters
                    .alloc_profiles_not_scaled
                    .fetch_add(1, Ordering::Relaxed);
                tracing::debug!(
                    pid,
                    sampled,
                    count,
                    "allocation profile's scale out of bounds: left as sampled"
                );
            }
            Scaled::FirstReading | Scaled::NoCount => {}
        }
    }
}

/// Symbolizers that count their markers and refused names in `counters`.
fn counted_symbolizers(counters: &WorkerCounters) -> Symbolizers {
    Symbolizers {
        java_unnamed: counters.java_unnamed.clone(),
        refused_names: counters.refused_names.clone(),
        ..Symbolizers::default()
    }
}

/// Takes an interval off the count of those pending when dropped (saturating: tests hand
/// intervals to the worker without the sampling loop's count).
struct IntervalTaken<'a>(&'a std::sync::atomic::AtomicU64);

impl Drop for IntervalTaken<'_> {
    fn drop(&mut self) {
        let _ = self
            .0
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::sync_channel;

    use super::*;
    use crate::sink::testing::Counted;

    #[test]
    fn a_panic_costs_one_work_item_and_the_worker_goes_on() {
        let counters = Arc::new(WorkerCounters::default());
        let shared = counters.clone();
        let sink = Counted::default();
        let intervals = sink.intervals.clone();
        let (work, work_rx) = sync_channel(8);
        // Built on its own thread, as the daemon does: blazesym's symbolizer is not Send.
        let thread = std::thread::spawn(move || {
            Worker::new(
                vec![Box::new(sink)],
                ServiceNaming::default(),
                99,
                Presentation::default(),
                shared,
            )
            .with_cache_budget(1 << 20)
            .run(work_rx)
        });
        work.send(Work::Panic).expect("worker alive");
        work.send(Work::ProcessSeen(std::process::id()))
            .expect("worker alive after a panic");
        work.send(Work::Panic).expect("worker alive");
        work.send(Work::Interval(Vec::new()))
            .expect("worker alive after two panics");
        drop(work);
        thread.join().expect("the worker thread ends normally");
        assert_eq!(counters.panics.load(Ordering::Relaxed), 2);
        // The sinks still hear of intervals.
        assert_eq!(intervals.load(Ordering::Relaxed), 1);
    }
}
