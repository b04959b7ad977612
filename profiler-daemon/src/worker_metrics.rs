//! The symbolizing worker's counters (`worker.rs`, and the local files it writes through
//! `output`), and the families they make on the metrics endpoint.

use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use profiler_common::metric;

use crate::export::counters::ExportCounters;
use crate::java_names::UnnamedReason;
use crate::metrics::families::{reasons, Families, MetricSource};
use crate::sidecar::index::REFUSAL_REASONS;
use crate::symbolize::name_guard::Refusal;

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
    pub sidecar_records_refused: [AtomicU64; REFUSAL_REASONS.len()],
    /// Java marker frames put in profiles, by reason.
    pub java_unnamed: Arc<crate::java_names::UnnamedCounts>,
    /// User frame names refused on their way into a profile, by reason.
    pub refused_names: Arc<crate::symbolize::name_guard::RefusedNames>,
    /// Panics caught in the symbolizer (each cost one work item; the symbolizers start over).
    pub panics: AtomicU64,
    /// The Java name reader's counts.
    pub java_reader: Arc<crate::symbolize::java_reader::ReaderCounters>,
    /// Intervals handed to the worker and not written yet: the sampling loop puts off the next
    /// one while there is one (`daemon::sampling_loop`).
    pub intervals_pending: AtomicU64,
    /// Allocation profiles from HotSpot's sampler scaled to the JVM's count of its bytes, and
    /// those left as sampled because the factor was out of bounds (`alloc_scale`).
    pub alloc_profiles_scaled: AtomicU64,
    pub alloc_profiles_not_scaled: AtomicU64,
    /// Whether allocation profiling is on: the two above are on the page only then.
    pub alloc_profiling: AtomicBool,
}

/// The worker's families: its counters, with the profiles its remote sinks could not encode
/// counted among the files it could not write. (Its panics are with the other threads',
/// `daemon::threads`.)
pub struct WorkerMetrics {
    pub counters: Arc<WorkerCounters>,
    pub export: Arc<ExportCounters>,
}

fn load(value: &AtomicU64) -> u64 {
    value.load(Ordering::Relaxed)
}

impl MetricSource for WorkerMetrics {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        let worker = &*self.counters;
        out.counter(
            metric::PROFILES_WRITTEN,
            "pprof files written.",
            load(&worker.profiles_written),
        )?;
        out.counter(
            metric::PROFILE_WRITE_ERRORS,
            "pprof files that could not be written (or, for Pyroscope, encoded).",
            load(&worker.write_errors) + load(&self.export.encode_errors),
        )?;
        if worker.alloc_profiling.load(Ordering::Relaxed) {
            encode_alloc_scale(out, worker)?;
        }
        encode_sidecar(out, worker)?;
        encode_symbol_cache(out, worker)?;
        encode_names(out, worker)
    }
}

fn encode_alloc_scale(out: &mut Families, worker: &WorkerCounters) -> fmt::Result {
    out.counter(
        metric::ALLOC_PROFILES_SCALED,
        "Allocation profiles from HotSpot's sampler scaled to the bytes their JVM counted.",
        load(&worker.alloc_profiles_scaled),
    )?;
    out.counter(
        metric::ALLOC_PROFILES_NOT_SCALED,
        "Allocation profiles from HotSpot's sampler left as sampled: the JVM's count and \
             the samples disagreed by more than twice (garbage in its memory?).",
        load(&worker.alloc_profiles_not_scaled),
    )
}

fn encode_sidecar(out: &mut Families, worker: &WorkerCounters) -> fmt::Result {
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
    out.gauges(
        metric::SIDECAR_RECORDS_REFUSED,
        "JVMs whose sidecar records file was not read, by reason (a link, special file, foreign \
         owner or oversized file in the JVM's /tmp; frames are then named from memory).",
        reasons(
            REFUSAL_REASONS
                .into_iter()
                .zip(worker.sidecar_records_refused.iter().map(load)),
        ),
    )
}

fn encode_symbol_cache(out: &mut Families, worker: &WorkerCounters) -> fmt::Result {
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
    )
}

/// The Java and user frames the worker could not name.
fn encode_names(out: &mut Families, worker: &WorkerCounters) -> fmt::Result {
    out.counter(
        metric::JAVA_PREFETCH_MISSES,
        "Java frames of new stacks whose method or code was gone or reused by the time it was \
         read (class unloading); while they occur the ring is drained every 10 to 50 ms.",
        load(&worker.java_reader.misses),
    )?;
    out.counters(
        metric::JAVA_FRAMES_UNNAMED,
        "Java frames shown as an unknown marker instead of a name, by reason; counted once per \
         distinct frame of each profile (process and interval), not per sample.",
        reasons(
            UnnamedReason::ALL
                .iter()
                .map(|reason| (reason.name(), worker.java_unnamed.get(*reason))),
        ),
    )?;
    out.counters(
        metric::FRAME_NAMES_REFUSED,
        "User frame names refused on their way into a profile (empty, over 4 KB, or with \
         control or replacement characters: garbage a name source let through), by reason; \
         shown as a [refused frame name: REASON] marker instead.",
        reasons(
            Refusal::ALL
                .iter()
                .map(|refusal| (refusal.name(), worker.refused_names.get(*refusal))),
        ),
    )
}
