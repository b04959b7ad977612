//! Operational metrics on a local HTTP endpoint (`metrics_listen`, e.g. `127.0.0.1:9464`, path
//! `/metrics`), in the OpenMetrics text format Prometheus scrapes.
//!
//! The values are kept where they are counted (the BPF program's per-CPU counters, the threads'
//! atomics); the sampling loop publishes a snapshot of its own once a second. A scrape encodes them
//! through `prometheus-client` (a collector: typed counters, gauges and label sets, no copy kept
//! per metric) and `axum` serves it, within the connection bounds of [`connections`]; scrapes
//! never touch the hot path. The page encoded is served again until the next snapshot (for at
//! most [`PAGE_REUSE`]), so a flood of scrapes costs no encoding.

pub mod connections;
pub mod peer_uid;

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;

use profiler_common::metric::{
    self, bpf_map, export_dropped, heap_state, jvm_state, metrics_connections_closed, not_profiled,
};
use profiler_common::{Counter, UnwindEnd};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use crate::export::counters::{ExportCounters, SinkCounters};
use crate::hotspot::tracker::TrackerCounts;
use crate::sampler::KernelCounters;

/// Tallies the symbolizing worker keeps.
#[derive(Debug, Default)]
pub struct WorkerCounters {
    pub profiles_written: AtomicU64,
    pub write_errors: AtomicU64,
    /// From the sidecar agents' stats records (see `profiler-jvmti`).
    pub sidecar_agents: AtomicU64,
    pub sidecar_agent_heap_bytes: AtomicU64,
    pub sidecar_dropped_records: AtomicU64,
    /// The symbolization caches' memory budget.
    pub symbol_cache: Arc<crate::symbolize::cache_budget::CacheStats>,
    /// JVMs whose records file was last refused, per `sidecar::index::REFUSAL_REASONS`.
    pub sidecar_records_refused: [AtomicU64; crate::sidecar::index::REFUSAL_REASONS.len()],
    /// Java marker frames put in profiles, by reason.
    pub java_unnamed: Arc<crate::java_names::UnnamedCounts>,
    /// User frame names refused on their way into a profile, by reason.
    pub refused_names: Arc<crate::symbolize::name_guard::RefusedNames>,
    /// Panics caught in the worker (each cost one work item; the symbolizers start over).
    pub panics: AtomicU64,
    /// Java frames of new stacks whose method or code was already gone or reused when the
    /// worker read it: names perishing (class unloading), so the loop drains sooner.
    pub java_prefetch_misses: AtomicU64,
    /// Intervals handed to the worker and not written yet: the sampling loop puts off the next
    /// one while there is one (`daemon::sampling_loop`).
    pub intervals_pending: AtomicU64,
}

/// What one scrape reports.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub kernel: KernelCounters,
    pub records: u64,
    pub malformed_records: u64,
    pub dropped_work: u64,
    pub dropped_over_stack_bound: u64,
    /// Samples kept in `[stacks past the bound]` entries (`crate::stack_memory`).
    pub past_stack_bound: u64,
    pub intervals_deferred: u64,
    /// Drains the BPF side asked for because the ring buffer was filling up.
    pub ring_wakeups: u64,
    pub unwind_ends: [u64; UnwindEnd::ALL.len()],
    pub jvms: TrackerCounts,
    pub intervals: u64,
    pub cpus: usize,
    pub frequency_hz: u64,
    /// Off-CPU profiling, when on.
    pub off_cpu: Option<OffCpuSnapshot>,
    /// Allocation profiling, when on: libjvm files whose hooks could not be attached.
    pub alloc_hook_attach_failures: Option<u64>,
}

/// What off-CPU profiling counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuSnapshot {
    pub joined: crate::off_cpu::OffCpuStats,
    pub open_waits: u64,
}

/// How long an encoded page is served again at most: the snapshot changes once a second, and
/// the values read live (export, endpoint) may lag as long.
pub const PAGE_REUSE: Duration = Duration::from_secs(1);

/// A page encoded for the snapshot published `published`-th.
struct Page {
    published: u64,
    encoded_at: Instant,
    text: Bytes,
}

#[derive(Clone, Default)]
pub struct Metrics {
    snapshot: Arc<Mutex<Snapshot>>,
    /// Snapshots published so far: a page of an earlier one is stale.
    published: Arc<AtomicU64>,
    page: Arc<Mutex<Option<Page>>>,
    pub worker: Arc<WorkerCounters>,
    pub export: Arc<ExportCounters>,
    pub unwind_tables: Arc<crate::native_unwind::loader::TableStats>,
    /// Connections the endpoint itself closed.
    pub closed_connections: Arc<connections::ClosedConnections>,
}

impl Metrics {
    pub fn publish(&self, snapshot: Snapshot) {
        if let Ok(mut current) = self.snapshot.lock() {
            *current = snapshot;
        }
        self.published.fetch_add(1, Ordering::Release);
    }

    /// The page a scrape gets: the one encoded for the current snapshot if under
    /// [`PAGE_REUSE`] old, else a new one (shared, not copied, by the scrapes that get it).
    pub fn page(&self) -> Result<Bytes, fmt::Error> {
        let published = self.published.load(Ordering::Acquire);
        // Held while encoding: scrapes arriving meanwhile wait for this page, not encode theirs.
        let mut page = self.page.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(page) = page
            .as_ref()
            .filter(|page| page.published == published && page.encoded_at.elapsed() < PAGE_REUSE)
        {
            return Ok(page.text.clone());
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry())?;
        let text = Bytes::from(text);
        *page = Some(Page {
            published,
            encoded_at: Instant::now(),
            text: text.clone(),
        });
        Ok(text)
    }

    /// A registry whose one collector encodes these metrics on each scrape.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(DaemonCollector(self.clone())));
        registry
    }

    /// The OpenMetrics text a scrape gets.
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String fails only if a label set's encoding does, and ours cannot.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }
}

/// The label sets of labelled families: the key is the field's name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Reason {
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct KernelFeature {
    feature: &'static str,
    mode: &'static str,
}

/// A remote sink's families: by sink (`pyroscope`, `otlp`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Sink {
    sink: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct SinkReason {
    sink: &'static str,
    reason: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Hooked {
    hooked: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Thread {
    thread: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct State {
    state: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct Map {
    map: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct OverBudget {
    producer: &'static str,
    budget: &'static str,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, EncodeLabelSet)]
struct EventKind {
    kind: &'static str,
}

/// The families of one scrape, written in order.
struct Families<'a>(DescriptorEncoder<'a>);

/// A counter family is declared without its `_total`: the encoder adds it to the samples, so
/// the names users query are the constants of `profiler_common::metric`.
fn family_name(name: &str) -> &str {
    name.strip_suffix("_total").unwrap_or(name)
}

impl Families<'_> {
    fn counter(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let family =
            self.0
                .encode_descriptor(family_name(name), help, None, MetricType::Counter)?;
        ConstCounter::new(value).encode(family)
    }

    fn gauge(&mut self, name: &str, help: &str, value: u64) -> fmt::Result {
        let family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        ConstGauge::new(value).encode(family)
    }

    fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        let mut family =
            self.0
                .encode_descriptor(family_name(name), help, None, MetricType::Counter)?;
        for (labels, value) in samples {
            ConstCounter::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }

    fn gauges<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        samples: impl IntoIterator<Item = (L, u64)>,
    ) -> fmt::Result {
        let mut family = self
            .0
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, value) in samples {
            ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
        }
        Ok(())
    }
}

fn reasons<const N: usize>(samples: [(&'static str, u64); N]) -> [(Reason, u64); N] {
    samples.map(|(reason, value)| (Reason { reason }, value))
}

/// Encodes the daemon's metrics on each scrape (see the module header).
struct DaemonCollector(Metrics);

impl fmt::Debug for DaemonCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DaemonCollector")
    }
}

impl Collector for DaemonCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let metrics = &self.0;
        let snapshot = metrics
            .snapshot
            .lock()
            .map(|s| s.clone())
            .unwrap_or_default();
        let mut out = Families(encoder);
        out.gauges(
            profiler_common::metric::KERNEL_FEATURE,
            "BPF features of this kernel as probed at start (mode present or missing), and the BPF object loaded (feature=\"object\")",
            crate::kernel_features::metric_labels()
                .into_iter()
                .map(|(feature, mode)| (KernelFeature { feature, mode }, 1)),
        )?;
        encode_sampling(&mut out, &snapshot, &metrics.worker, &metrics.export)?;
        encode_bounds(&mut out, &snapshot)?;
        encode_unwind_tables(&mut out, &metrics.unwind_tables)?;
        encode_export(&mut out, &metrics.export)?;
        encode_endpoint(&mut out, &metrics.closed_connections)
    }
}

fn encode_alloc(out: &mut Families, s: &Snapshot, attach_failures: u64) -> fmt::Result {
    let k = |c: Counter| s.kernel.get(c);
    out.counter(
        metric::ALLOC_EVENTS,
        "Allocation events (TLAB refills, allocations outside TLABs) of profiled JVMs.",
        k(Counter::AllocEvents),
    )?;
    out.counter(
        metric::ALLOC_SAMPLED,
        "Allocation events sampled and sent (the others are accounted for by the weights).",
        k(Counter::AllocSampled),
    )?;
    out.counters(
        metric::ALLOC_NOT_PROFILED,
        "Sampled allocation events lost, by reason (alloc_nested: another hook was under way \
         on the CPU).",
        reasons([
            (Counter::AllocRingFull.name(), k(Counter::AllocRingFull)),
            (Counter::AllocNested.name(), k(Counter::AllocNested)),
        ]),
    )?;
    out.counter(
        metric::ALLOC_WALKS_FROM_HOOK,
        "Sampled allocations walked from the hook's caller: the thread's last Java frame was \
         not usable.",
        k(Counter::AllocWalkFromHook),
    )?;
    out.counters(
        metric::ALLOC_JVMS,
        "JVMs that became ready, by whether their allocation events were hooked.",
        [
            (Hooked { hooked: "true" }, s.jvms.jvms_alloc_hooked),
            (Hooked { hooked: "false" }, s.jvms.jvms_alloc_not_hooked),
        ],
    )?;
    out.counter(
        metric::ALLOC_HOOK_ATTACH_FAILURES,
        "Libjvm files whose allocation hooks could not be attached (see the log).",
        attach_failures,
    )?;
    out.gauge(
        metric::ALLOC_HOOKED_FILES,
        "Libjvm files hooked now (released once none of their JVMs runs).",
        s.jvms.alloc_hooked_files,
    )?;
    out.gauge(
        metric::ALLOC_WAITING_FILES,
        "Libjvm files of ready JVMs waiting for room under the hook cap or their user's share.",
        s.jvms.alloc_waiting_files,
    )
}

fn encode_off_cpu(out: &mut Families, s: &Snapshot, off_cpu: &OffCpuSnapshot) -> fmt::Result {
    let k = |c: Counter| s.kernel.get(c);
    out.counter(
        metric::OFF_CPU_SWITCHES,
        "Switches off the CPU of profiled threads.",
        k(Counter::OffCpuSwitches),
    )?;
    out.counter(
        metric::OFF_CPU_WAITS_SAMPLED,
        "Switches whose stack was taken (the others are accounted for by the weights).",
        k(Counter::OffCpuSampled),
    )?;
    out.counter(
        metric::OFF_CPU_WAITS,
        "Sampled waits joined with their end and put in off-CPU profiles.",
        off_cpu.joined.waits,
    )?;
    let lost = off_cpu.joined;
    out.counters(
        metric::OFF_CPU_WAITS_NOT_PROFILED,
        "Waits left out of off-CPU profiles, by reason (filtered_short is the minimum-wait filter).",
        reasons([
            (Counter::OffCpuRingFull.name(), k(Counter::OffCpuRingFull)),
            (Counter::OffCpuNoStorage.name(), k(Counter::OffCpuNoStorage)),
            ("unmatched_end", lost.unmatched_ends),
            ("filtered_short", lost.filtered_short),
            ("over_open_bound", lost.over_open_bound),
            ("over_stack_bound", lost.over_stack_bound),
        ]),
    )?;
    out.gauge(
        metric::OFF_CPU_OPEN_WAITS,
        "Sampled waits whose thread has not run again yet.",
        off_cpu.open_waits,
    )?;
    out.gauge(
        metric::OFF_CPU_THREADS,
        "Threads with off-CPU task storage now (it goes when they exit).",
        k(Counter::OffCpuThreadsTracked).saturating_sub(k(Counter::OffCpuThreadsGone)),
    )
}

fn encode_sampling(
    out: &mut Families,
    s: &Snapshot,
    worker: &WorkerCounters,
    export: &ExportCounters,
) -> fmt::Result {
    let k = |c: Counter| s.kernel.get(c);
    let load = |value: &AtomicU64| value.load(Ordering::Relaxed);
    out.counter(
        metric::BPF_SAMPLES,
        "Runs of the BPF sampling program.",
        k(Counter::Samples),
    )?;
    out.counter(
        metric::BPF_SAMPLES_SENT,
        "Samples sent to the daemon.",
        k(Counter::Sent),
    )?;
    out.counters(
        metric::SAMPLES_NOT_PROFILED,
        "Samples not in any profile, by reason (idle and filtered are expected).",
        reasons([
            (Counter::Idle.name(), k(Counter::Idle)),
            (Counter::Filtered.name(), k(Counter::Filtered)),
            (Counter::RingFull.name(), k(Counter::RingFull)),
            (Counter::ScratchMissing.name(), k(Counter::ScratchMissing)),
            (not_profiled::MALFORMED, s.malformed_records),
            (not_profiled::WORK_QUEUE_FULL, s.dropped_work),
            (not_profiled::STACK_BOUND, s.dropped_over_stack_bound),
        ]),
    )?;
    out.counter(
        metric::RING_WAKEUPS,
        "Ring-buffer drains before the drain period because the ring was a quarter full; often means the ring is small for the sample rate.",
        s.ring_wakeups,
    )?;
    out.counter(
        metric::KERNEL_STACK_FAILURES,
        "Kernel stacks bpf_get_stack could not read.",
        k(Counter::KernelStackFailed),
    )?;
    out.counters(
        metric::UNWIND_ENDS,
        "How user stack walks ended, by reason.",
        UnwindEnd::ALL.iter().map(|end| {
            let reason = Reason { reason: end.name() };
            (reason, s.unwind_ends[*end as usize])
        }),
    )?;
    out.counter(
        metric::RECORDS,
        "Sample records read from the ring buffer.",
        s.records,
    )?;
    out.counter(
        metric::INTERVALS,
        "Profiling intervals completed.",
        s.intervals,
    )?;
    out.counter(
        metric::PROFILES_WRITTEN,
        "pprof files written.",
        load(&worker.profiles_written),
    )?;
    out.counters(
        metric::THREAD_PANICS,
        "Panics caught in the daemon's threads, by thread (a bug: each cost one work item or \
         tick; the thread goes on with fresh state).",
        [
            (
                Thread {
                    thread: "symbolizer",
                },
                load(&worker.panics),
            ),
            (
                Thread {
                    thread: "jvm_tracker",
                },
                s.jvms.panics,
            ),
        ],
    )?;
    out.counter(
        metric::PROFILE_WRITE_ERRORS,
        "pprof files that could not be written (or, for Pyroscope, encoded).",
        load(&worker.write_errors) + load(&export.encode_errors),
    )?;
    out.gauge(
        metric::SIDECAR_AGENTS,
        "JVMs whose sidecar agent reports to the daemon.",
        load(&worker.sidecar_agents),
    )?;
    out.gauge(
        metric::SIDECAR_AGENT_HEAP_BYTES,
        "Heap the sidecar agents hold, summed over the JVMs.",
        load(&worker.sidecar_agent_heap_bytes),
    )?;
    out.counter(
        metric::SIDECAR_DROPPED_RECORDS,
        "Records sidecar agents could not write (their JVM's /tmp full or gone).",
        load(&worker.sidecar_dropped_records),
    )?;
    let cache = &worker.symbol_cache;
    out.gauge(
        metric::SYMBOL_CACHE_BYTES,
        "Memory charged to the symbolization caches (parsed binaries, resolved frames).",
        load(&cache.charged_bytes),
    )?;
    out.gauge(
        metric::SYMBOL_CACHE_LIMIT_BYTES,
        "The caches' budget (cache_budget_mib); past it the least recently used are evicted.",
        load(&cache.limit_bytes),
    )?;
    out.counter(
        metric::SYMBOL_CACHE_EVICTIONS,
        "Binaries whose cached symbols were dropped to stay within the budget.",
        load(&cache.evictions),
    )?;
    let heap = crate::own_memory::heap_stats();
    out.gauges(
        metric::HEAP_BYTES,
        "The daemon's heap as its allocator counts it: in use, and freed but kept (a resident \
         set growing while in_use stays flat is the allocator's, not a growing structure).",
        [
            (heap_state::IN_USE, heap.in_use_bytes),
            (heap_state::FREE, heap.free_bytes),
        ]
        .map(|(state, bytes)| (State { state }, bytes)),
    )?;
    out.gauges(
        metric::SIDECAR_RECORDS_REFUSED,
        "JVMs whose sidecar records file was not read, by reason (a link, special file, foreign \
         owner or oversized file in the JVM's /tmp; frames are then named from memory).",
        crate::sidecar::index::REFUSAL_REASONS
            .iter()
            .zip(&worker.sidecar_records_refused)
            .map(|(reason, count)| (Reason { reason }, load(count))),
    )?;
    out.counter(
        metric::JAVA_PREFETCH_MISSES,
        "Java frames of new stacks whose method or code was gone or reused by the time it was \
         read (class unloading); while they occur the ring is drained every 10 to 50 ms.",
        load(&worker.java_prefetch_misses),
    )?;
    out.counters(
        metric::JAVA_FRAMES_UNNAMED,
        "Java frames shown as an unknown marker instead of a name, by reason; counted once per \
         distinct frame of each profile (process and interval), not per sample.",
        crate::java_names::UnnamedReason::ALL.iter().map(|reason| {
            let count = worker.java_unnamed.get(*reason);
            (
                Reason {
                    reason: reason.name(),
                },
                count,
            )
        }),
    )?;
    out.counters(
        metric::FRAME_NAMES_REFUSED,
        "User frame names refused on their way into a profile (empty, over 4 KB, or with \
         control or replacement characters: garbage a name source let through), by reason; \
         shown as a [refused frame name: REASON] marker instead.",
        crate::symbolize::name_guard::Refusal::ALL
            .iter()
            .map(|refusal| {
                (
                    Reason {
                        reason: refusal.name(),
                    },
                    worker.refused_names.get(*refusal),
                )
            }),
    )?;
    out.gauges(
        metric::JVMS,
        "JVMs by state (ready: layout in the BPF map).",
        [
            (jvm_state::READY, s.jvms.jvms_ready),
            (jvm_state::PENDING, s.jvms.jvms_pending),
            (jvm_state::FAILED, s.jvms.jvms_failed),
            (jvm_state::OVER_BOUND, s.jvms.jvms_over_bound),
        ]
        .map(|(state, count)| (State { state }, count)),
    )?;
    out.gauges(
        metric::BPF_MAP_ENTRIES,
        "Entries of the BPF maps the daemon fills.",
        [
            (bpf_map::HOTSPOT_PROCS, s.jvms.jvms_ready),
            (bpf_map::JAVA_THREADS, s.jvms.java_threads),
        ]
        .map(|(map, count)| (Map { map }, count)),
    )?;
    out.gauges(
        metric::BPF_MAP_CAPACITY,
        "Capacity of the BPF maps the daemon fills.",
        [
            (bpf_map::HOTSPOT_PROCS, s.jvms.jvm_map_capacity),
            (bpf_map::JAVA_THREADS, s.jvms.java_thread_map_capacity),
        ]
        .map(|(map, count)| (Map { map }, count)),
    )?;
    out.counter(
        metric::JAVA_THREADS_NOT_PUSHED,
        "Java threads left out of the BPF map (full): their Java frames are not unwound.",
        s.jvms.java_threads_not_pushed,
    )?;
    out.counters(
        metric::PROCESS_EVENTS,
        "Process events the JVM tracker took from the BPF tracepoints, by kind (whole-host mode).",
        [
            (EventKind { kind: "exec" }, s.jvms.exec_events),
            (EventKind { kind: "exit" }, s.jvms.exit_events),
        ],
    )?;
    out.counter(
        metric::PROCESS_EVENTS_LOST,
        "Process events lost to a full ring buffer (the next /proc rescan makes up for them).",
        k(Counter::ProcessEventsLost),
    )?;
    out.counter(
        metric::PROC_RESCANS,
        "Full listings of /proc by the JVM tracker (once a minute, besides events).",
        s.jvms.rescans,
    )?;
    if let Some(off_cpu) = &s.off_cpu {
        encode_off_cpu(out, s, off_cpu)?;
    }
    if let Some(attach_failures) = s.alloc_hook_attach_failures {
        encode_alloc(out, s, attach_failures)?;
    }
    out.gauge(metric::CPUS, "CPUs sampled.", s.cpus as u64)?;
    out.gauge(
        metric::FREQUENCY_HERTZ,
        "Sampling frequency per CPU.",
        s.frequency_hz,
    )
}

/// What the daemon bounds on behalf of every user: the BPF side's emit budgets, the interval's
/// stack memory, the worker's one interval in hand.
fn encode_bounds(out: &mut Families, s: &Snapshot) -> fmt::Result {
    use profiler_common::budget::Producer;
    out.counter(
        metric::SAMPLES_PAST_STACK_BOUND,
        "Samples kept in their process's [stacks past the bound] frame: the interval's stack \
         memory share of their process or user was held (stack_memory_mib).",
        s.past_stack_bound,
    )?;
    out.counter(
        metric::INTERVALS_DEFERRED,
        "Interval ends put off because the worker was still writing the last interval.",
        s.intervals_deferred,
    )?;
    let name = |producer: Producer| match producer {
        Producer::Cpu => "cpu",
        Producer::Alloc => "alloc",
        Producer::OffCpu => "off_cpu",
        Producer::ProcessEvents => "process_events",
    };
    out.counters(
        metric::RECORDS_OVER_BUDGET,
        "Records the BPF programs refused because their process or their user had spent its \
         share of that producer's emit budget (docs/scale.md, \"Emit budgets\").",
        Producer::ALL.into_iter().flat_map(|producer| {
            let (process, user) = producer.refusal_counters();
            [("process", process), ("user", user)].map(|(budget, counter)| {
                let labels = OverBudget {
                    producer: name(producer),
                    budget,
                };
                (labels, s.kernel.get(counter))
            })
        }),
    )
}

fn encode_unwind_tables(
    out: &mut Families,
    t: &crate::native_unwind::loader::TableStats,
) -> fmt::Result {
    use crate::native_unwind::loader::NotLoaded;
    let get = |value: &AtomicU64| value.load(Ordering::Relaxed);
    out.gauge(
        metric::UNWIND_TABLES,
        "Native unwind tables loaded in the BPF maps (one per distinct .eh_frame).",
        get(&t.tables),
    )?;
    out.gauge(
        metric::UNWIND_TABLE_BYTES,
        "Memory of the unwind tables in the BPF maps (charged to the daemon's cgroup, not in its RSS).",
        get(&t.bytes),
    )?;
    out.gauge(
        metric::UNWIND_TABLE_LIMIT_BYTES,
        "The unwind tables' budget (a third of cache_budget_mib).",
        get(&t.limit_bytes),
    )?;
    out.gauge(
        metric::UNWIND_TABLE_PROCESSES,
        "Processes whose executable mappings are in the BPF maps with their tables.",
        get(&t.processes),
    )?;
    out.counter(
        metric::UNWIND_TABLE_BUILDS,
        "Unwind tables built from a file's call frame information.",
        get(&t.builds),
    )?;
    out.counter(
        metric::UNWIND_TABLE_BUILD_MILLISECONDS,
        "Time spent building unwind tables.",
        get(&t.build_micros) / 1_000,
    )?;
    out.counter(
        metric::UNWIND_TABLE_EVICTIONS,
        "Unwind tables dropped to make room within the budget.",
        get(&t.evictions),
    )?;
    out.counters(
        metric::UNWIND_TABLES_NOT_LOADED,
        "Files or mappings left to frame pointers, by reason.",
        NotLoaded::ALL.iter().map(|reason| {
            let count = t.not_loaded(*reason);
            (
                Reason {
                    reason: reason.name(),
                },
                count,
            )
        }),
    )
}

fn encode_export(out: &mut Families, c: &ExportCounters) -> fmt::Result {
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    let sinks = c.sinks();
    // One sample per remote sink of each family.
    let per_sink = |value: fn(&SinkCounters) -> &AtomicU64| {
        sinks
            .iter()
            .map(move |(sink, counters)| (Sink { sink }, get(value(counters))))
    };
    out.counters(
        metric::EXPORT_PROFILES,
        "Profiles delivered, by remote sink.",
        per_sink(|c| &c.exported_profiles),
    )?;
    out.counters(
        metric::EXPORT_REQUESTS,
        "Requests the backend accepted, by remote sink.",
        per_sink(|c| &c.exported_requests),
    )?;
    out.counters(
        metric::EXPORT_BYTES,
        "Encoded profile bytes delivered, by remote sink.",
        per_sink(|c| &c.exported_bytes),
    )?;
    out.counters(
        metric::EXPORT_RETRIES,
        "Requests that failed and were retried, by remote sink.",
        per_sink(|c| &c.failed_attempts),
    )?;
    out.counters(
        metric::EXPORT_DROPPED_PROFILES,
        "Profiles never delivered, by remote sink and reason.",
        sinks.iter().flat_map(|(sink, c)| {
            [
                (
                    export_dropped::EXPORT_QUEUE_FULL,
                    get(&c.dropped_queue_full),
                ),
                (export_dropped::SHUTDOWN, get(&c.dropped_at_shutdown)),
                (export_dropped::REJECTED, get(&c.rejected)),
            ]
            .map(|(reason, value)| (SinkReason { sink, reason }, value))
        }),
    )?;
    out.gauges(
        metric::EXPORT_QUEUE_PROFILES,
        "Profiles waiting for the backend (or being sent), by remote sink.",
        per_sink(|c| &c.queued_profiles),
    )?;
    out.gauges(
        metric::EXPORT_QUEUE_BYTES,
        "Bytes of profiles waiting for the backend, by remote sink.",
        per_sink(|c| &c.queued_bytes),
    )?;
    out.gauge(
        metric::STREAM_SUBSCRIBERS,
        "Live-stream subscribers connected.",
        get(&c.stream_subscribers),
    )?;
    out.counter(
        metric::STREAM_SKIPPED_PROFILES,
        "Profiles live-stream subscribers missed because they read too slowly.",
        get(&c.stream_skipped),
    )
}

fn encode_endpoint(out: &mut Families, closed: &connections::ClosedConnections) -> fmt::Result {
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    out.counters(
        metric::METRICS_CONNECTIONS_CLOSED,
        "Connections to this endpoint it closed itself, by reason.",
        reasons([
            (
                metrics_connections_closed::OVER_LIMIT,
                get(&closed.over_limit),
            ),
            (
                metrics_connections_closed::TIMED_OUT,
                get(&closed.timed_out),
            ),
        ]),
    )
}

/// Serves `/metrics` (and `/`) until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Metrics) {
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;

    let pages = metrics.clone();
    let scrape = move || {
        let page = pages.page();
        async move {
            match page {
                Ok(body) => (
                    axum::http::StatusCode::OK,
                    [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                    body,
                ),
                Err(_) => (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    [(CONTENT_TYPE, "text/plain")],
                    Bytes::new(),
                ),
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(scrape.clone()))
        .route("/", get(scrape));
    let closed = metrics.closed_connections.clone();
    connections::serve(listener, app, connections::LIMITS, closed).await;
}

/// What Prometheus is told it scrapes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(snapshot: Snapshot) -> String {
        let metrics = Metrics::default();
        metrics.publish(snapshot);
        metrics.render()
    }

    /// Distinct non-zero values, one per call.
    struct Values(u64);

    impl Values {
        fn next(&mut self) -> u64 {
            self.0 += 1;
            self.0
        }

        fn store(&mut self, counter: &AtomicU64) {
            counter.store(self.next(), Ordering::Relaxed);
        }
    }

    /// Every source populated with distinct values: the page's lines, the heap's values (read
    /// live) masked.
    fn every_family_page() -> String {
        use crate::kernel_features::{choose_for, Feature, KernelFeatures, Probe};
        let _ = choose_for(KernelFeatures {
            probes: vec![
                Probe {
                    feature: Feature::RingBuffer,
                    present: true,
                },
                Probe {
                    feature: Feature::BpfLoop,
                    present: false,
                },
            ],
        });
        let mut v = Values(100);
        let mut snapshot = Snapshot::default();
        // Descending: the gauge of threads with storage is tracked minus gone.
        for value in snapshot.kernel.0.iter_mut().rev() {
            *value = v.next();
        }
        for value in &mut snapshot.unwind_ends {
            *value = v.next();
        }
        let j = &mut snapshot.jvms;
        for field in [
            &mut j.jvms_ready,
            &mut j.jvms_pending,
            &mut j.jvms_failed,
            &mut j.jvms_over_bound,
            &mut j.jvm_map_capacity,
            &mut j.java_threads,
            &mut j.java_thread_map_capacity,
            &mut j.java_threads_not_pushed,
            &mut j.exec_events,
            &mut j.exit_events,
            &mut j.rescans,
            &mut j.panics,
            &mut j.jvms_alloc_hooked,
            &mut j.jvms_alloc_not_hooked,
            &mut j.alloc_hooked_files,
            &mut j.alloc_waiting_files,
            &mut j.alloc_hook_attach_failures,
        ] {
            *field = v.next();
        }
        let s = &mut snapshot;
        for field in [
            &mut s.records,
            &mut s.malformed_records,
            &mut s.dropped_work,
            &mut s.dropped_over_stack_bound,
            &mut s.past_stack_bound,
            &mut s.intervals_deferred,
            &mut s.ring_wakeups,
            &mut s.intervals,
            &mut s.frequency_hz,
        ] {
            *field = v.next();
        }
        snapshot.cpus = v.next() as usize;
        snapshot.alloc_hook_attach_failures = Some(snapshot.jvms.alloc_hook_attach_failures);
        snapshot.off_cpu = Some(OffCpuSnapshot {
            joined: crate::off_cpu::OffCpuStats {
                waits: v.next(),
                filtered_short: v.next(),
                unmatched_ends: v.next(),
                over_open_bound: v.next(),
                over_stack_bound: v.next(),
            },
            open_waits: v.next(),
        });
        let metrics = Metrics::default();
        let w = &metrics.worker;
        for counter in [
            &w.profiles_written,
            &w.write_errors,
            &w.sidecar_agents,
            &w.sidecar_agent_heap_bytes,
            &w.sidecar_dropped_records,
            &w.symbol_cache.limit_bytes,
            &w.symbol_cache.charged_bytes,
            &w.symbol_cache.evictions,
            &w.panics,
            &w.java_prefetch_misses,
            &w.intervals_pending,
        ] {
            v.store(counter);
        }
        for counter in &w.sidecar_records_refused {
            v.store(counter);
        }
        for (times, reason) in crate::java_names::UnnamedReason::ALL.iter().enumerate() {
            for _ in 0..=times {
                w.java_unnamed.add(*reason);
            }
        }
        for (times, refusal) in crate::symbolize::name_guard::Refusal::ALL
            .iter()
            .enumerate()
        {
            for _ in 0..=times {
                w.refused_names.add(*refusal);
            }
        }
        let e = &metrics.export;
        for sink in ["pyroscope", "otlp"] {
            let c = e.sink(sink);
            for counter in [
                &c.exported_profiles,
                &c.exported_requests,
                &c.exported_bytes,
                &c.failed_attempts,
                &c.dropped_queue_full,
                &c.dropped_at_shutdown,
                &c.rejected,
                &c.queued_profiles,
                &c.queued_bytes,
            ] {
                v.store(counter);
            }
        }
        for counter in [&e.stream_subscribers, &e.stream_skipped, &e.encode_errors] {
            v.store(counter);
        }
        let t = &metrics.unwind_tables;
        for counter in [
            &t.tables,
            &t.bytes,
            &t.limit_bytes,
            &t.processes,
            &t.builds,
            &t.evictions,
        ] {
            v.store(counter);
        }
        t.build_micros.store(v.next() * 1_000, Ordering::Relaxed);
        for counter in &t.not_loaded {
            v.store(counter);
        }
        v.store(&metrics.closed_connections.over_limit);
        v.store(&metrics.closed_connections.timed_out);
        metrics.publish(snapshot);
        every_line_sorted(&metrics.render())
    }

    /// The page's lines, sorted (the families' order is not part of the contract), the heap's
    /// values masked.
    fn every_line_sorted(text: &str) -> String {
        let heap = format!("{}{{", metric::HEAP_BYTES);
        let mut lines: Vec<String> = text
            .lines()
            .map(|line| match line.rsplit_once(' ') {
                Some((key, _)) if line.starts_with(&heap) => format!("{key} HEAP"),
                _ => line.to_owned(),
            })
            .collect();
        lines.sort_unstable();
        lines.join("\n") + "\n"
    }

    /// Every family, help text, label and type of the page, each sample with a value of its
    /// own: renaming or moving a metric shows here (`every_family.txt`).
    #[test]
    fn every_family_is_on_the_page_as_before() {
        let page = every_family_page();
        let expected = include_str!("daemon/metrics_page.golden");
        if std::env::var_os("PROFILER_BLESS_METRICS").is_some() {
            std::fs::write(
                concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/src/daemon/metrics_page.golden"
                ),
                &page,
            )
            .expect("write");
        }
        assert_eq!(page, expected);
    }

    /// Off-CPU and allocation profiling off: their families are not on the page, every other
    /// one is.
    #[test]
    fn families_of_profiling_off_are_not_on_the_page() {
        let types = |text: &str| -> Vec<String> {
            let mut types: Vec<String> = text
                .lines()
                .filter(|line| line.starts_with("# TYPE "))
                .map(str::to_owned)
                .collect();
            types.sort_unstable();
            types
        };
        let expected: Vec<String> = types(include_str!("daemon/metrics_page.golden"))
            .into_iter()
            .filter(|line| {
                !line.starts_with("# TYPE profiler_off_cpu_")
                    && !line.starts_with("# TYPE profiler_alloc_")
            })
            .collect();
        assert_eq!(types(&rendered(Snapshot::default())), expected);
    }

    #[test]
    fn renders_counters_with_reasons() {
        let mut snapshot = Snapshot {
            records: 5,
            ..Default::default()
        };
        snapshot.kernel.0[Counter::RingFull as usize] = 3;
        snapshot.unwind_ends[UnwindEnd::NoCodeBlob as usize] = 2;
        snapshot.jvms.java_thread_map_capacity = 16_384;
        let text = rendered(snapshot);
        assert!(
            text.contains("profiler_samples_not_profiled_total{reason=\"ring_full\"} 3"),
            "{text}"
        );
        assert!(
            text.contains("profiler_unwind_ends_total{reason=\"no_code_blob\"} 2"),
            "{text}"
        );
        assert!(text.contains("profiler_records_total 5"), "{text}");
        assert!(
            text.contains("profiler_java_frames_unnamed_total{reason=\"method_reused\"} 0"),
            "{text}"
        );
        assert!(text.contains("# TYPE profiler_jvms gauge"), "{text}");
        assert!(text.contains("# TYPE profiler_records counter"), "{text}");
        assert!(
            text.contains("profiler_bpf_map_capacity{map=\"java_threads\"} 16384"),
            "{text}"
        );
        // OpenMetrics: one terminator, at the end.
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn every_metric_name_is_a_sample_once() {
        let text = rendered(Snapshot {
            off_cpu: Some(OffCpuSnapshot::default()),
            ..Default::default()
        });
        let families: Vec<&str> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .filter_map(|line| line.split(' ').next())
            .collect();
        let mut distinct = families.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(
            distinct.len(),
            families.len(),
            "a family twice: {families:?}"
        );
        for name in [
            metric::BPF_SAMPLES,
            metric::OFF_CPU_THREADS,
            metric::UNWIND_TABLE_BUILD_MILLISECONDS,
            metric::STREAM_SKIPPED_PROFILES,
            metric::CPUS,
        ] {
            assert!(
                text.lines()
                    .any(|line| line.starts_with(&format!("{name} "))),
                "{name} in {text}"
            );
        }
    }

    #[test]
    fn every_reason_of_the_contract_is_a_label() {
        let text = rendered(Snapshot::default());
        let has = |name: &str, key: &str, value: &str| {
            assert!(
                text.contains(&format!("{name}{{{key}=\"{value}\"}} 0")),
                "{name} {value} in {text}"
            );
        };
        for end in UnwindEnd::ALL {
            has(metric::UNWIND_ENDS, "reason", end.name());
        }
        for counter in [
            Counter::Idle,
            Counter::Filtered,
            Counter::RingFull,
            Counter::ScratchMissing,
        ] {
            has(metric::SAMPLES_NOT_PROFILED, "reason", counter.name());
        }
        for reason in [
            not_profiled::MALFORMED,
            not_profiled::WORK_QUEUE_FULL,
            not_profiled::STACK_BOUND,
        ] {
            has(metric::SAMPLES_NOT_PROFILED, "reason", reason);
        }
        for reason in crate::java_names::UnnamedReason::ALL {
            has(metric::JAVA_FRAMES_UNNAMED, "reason", reason.name());
        }
        // The two queues have different reasons: samples for the worker, profiles for export.
        assert!(!text.contains("profiler_samples_not_profiled_total{reason=\"queue_full\"}"));
        // Remote sinks' families have one sample per sink started, labelled by it.
        assert!(!text.contains("profiler_export_dropped_profiles_total{"));
        let metrics = Metrics::default();
        metrics.export.sink("pyroscope");
        metrics.export.sink("otlp");
        let text = metrics.render();
        for sink in ["pyroscope", "otlp"] {
            for reason in [
                export_dropped::EXPORT_QUEUE_FULL,
                export_dropped::SHUTDOWN,
                export_dropped::REJECTED,
            ] {
                let key = format!(
                    "profiler_export_dropped_profiles_total{{sink=\"{sink}\",reason=\"{reason}\"}} 0"
                );
                assert!(text.contains(&key), "{key} in {text}");
            }
            let key = format!("profiler_export_queue_profiles{{sink=\"{sink}\"}} 0");
            assert!(text.contains(&key), "{key} in {text}");
        }
    }

    #[test]
    fn a_page_is_encoded_once_per_snapshot() {
        let metrics = Metrics::default();
        metrics.publish(Snapshot {
            records: 1,
            ..Default::default()
        });
        let first = metrics.page().expect("encodes");
        // Counted live, but the page is the one already encoded: the same bytes, not a copy.
        metrics
            .worker
            .profiles_written
            .fetch_add(5, Ordering::Relaxed);
        let again = metrics.page().expect("encodes");
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert!(std::str::from_utf8(&again)
            .expect("utf-8")
            .contains("\nprofiler_profiles_written_total 0\n"));
        // A new snapshot: a new page, with what was counted meanwhile.
        metrics.publish(Snapshot {
            records: 2,
            ..Default::default()
        });
        let next = metrics.page().expect("encodes");
        let text = std::str::from_utf8(&next).expect("utf-8");
        assert!(text.contains("\nprofiler_records_total 2\n"), "{text}");
        assert!(
            text.contains("\nprofiler_profiles_written_total 5\n"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn serves_the_text_over_http() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let metrics = Metrics::default();
        metrics.publish(Snapshot {
            records: 7,
            ..Default::default()
        });
        let server = tokio::spawn(serve(listener, metrics));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(address)
                .await
                .expect("connect");
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut response = String::new();
            stream.read_to_string(&mut response).await.expect("read");
            response
        };
        let response = get("/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(
            response.contains("application/openmetrics-text"),
            "{response}"
        );
        assert!(
            response.contains("\nprofiler_records_total 7\n"),
            "{response}"
        );
        assert!(get("/nothing").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
