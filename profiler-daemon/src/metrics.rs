//! Operational metrics in Prometheus' text exposition format, on a local HTTP endpoint
//! (`metrics_listen`, e.g. `127.0.0.1:9464`, path `/metrics`).
//!
//! The sampling loop publishes a snapshot once a second; scrapes read the last snapshot and never
//! touch the hot path. The HTTP side is deliberately tiny: one GET per connection.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use profiler_common::metric::{self, bpf_map, export_dropped, jvm_state, not_profiled};
use profiler_common::{Counter, UnwindEnd};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::export::queue::ExportCounters;
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
    /// Panics caught in the worker (each cost one work item; the symbolizers start over).
    pub panics: AtomicU64,
    /// Java frames of new stacks whose method or code was already gone or reused when the
    /// worker read it: names perishing (class unloading), so the loop drains sooner.
    pub java_prefetch_misses: AtomicU64,
}

/// What one scrape reports.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub kernel: KernelCounters,
    pub records: u64,
    pub malformed_records: u64,
    pub dropped_work: u64,
    pub dropped_over_stack_bound: u64,
    /// Drains the BPF side asked for because the ring buffer was filling up.
    pub ring_wakeups: u64,
    pub unwind_ends: [u64; UnwindEnd::ALL.len()],
    pub jvms: TrackerCounts,
    pub intervals: u64,
    pub cpus: usize,
    pub frequency_hz: u64,
    /// Off-CPU profiling, when on.
    pub off_cpu: Option<OffCpuSnapshot>,
}

/// What off-CPU profiling counted.
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuSnapshot {
    pub joined: crate::off_cpu::OffCpuStats,
    pub open_waits: u64,
}

#[derive(Clone, Default)]
pub struct Metrics {
    snapshot: Arc<Mutex<Snapshot>>,
    pub worker: Arc<WorkerCounters>,
    pub export: Arc<ExportCounters>,
    pub unwind_tables: Arc<crate::native_unwind::loader::TableStats>,
}

impl Metrics {
    pub fn publish(&self, snapshot: Snapshot) {
        if let Ok(mut current) = self.snapshot.lock() {
            *current = snapshot;
        }
    }

    pub fn render(&self) -> String {
        let snapshot = self.snapshot.lock().map(|s| s.clone()).unwrap_or_default();
        let mut text = render(&snapshot, &self.worker);
        render_unwind_tables(&mut text, &self.unwind_tables);
        render_export(&mut text, &self.export);
        text
    }
}

/// One metric: `samples` are (labels, value), labels empty or as [`labelled`] writes them.
fn metric<L: AsRef<str>>(
    out: &mut String,
    name: &str,
    kind: &str,
    help: &str,
    samples: &[(L, u64)],
) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    for (labels, value) in samples {
        let labels = labels.as_ref();
        if labels.is_empty() {
            let _ = writeln!(out, "{name} {value}");
        } else {
            let _ = writeln!(out, "{name}{{{labels}}} {value}");
        }
    }
}

/// Samples of one label `key`, each (value of the label, count).
fn labelled(key: &str, samples: &[(&str, u64)]) -> Vec<(String, u64)> {
    samples
        .iter()
        .map(|(value, count)| (format!("{key}=\"{value}\""), *count))
        .collect()
}

fn render_off_cpu(out: &mut String, s: &Snapshot, off_cpu: &OffCpuSnapshot) {
    let k = |c: Counter| s.kernel.get(c);
    metric(
        out,
        metric::OFF_CPU_SWITCHES,
        "counter",
        "Switches off the CPU of profiled threads.",
        &[("", k(Counter::OffCpuSwitches))],
    );
    metric(
        out,
        metric::OFF_CPU_WAITS_SAMPLED,
        "counter",
        "Switches whose stack was taken (the others are accounted for by the weights).",
        &[("", k(Counter::OffCpuSampled))],
    );
    metric(
        out,
        metric::OFF_CPU_WAITS,
        "counter",
        "Sampled waits joined with their end and put in off-CPU profiles.",
        &[("", off_cpu.joined.waits)],
    );
    let lost = off_cpu.joined;
    metric(
        out,
        metric::OFF_CPU_WAITS_NOT_PROFILED,
        "counter",
        "Waits left out of off-CPU profiles, by reason (filtered_short is the minimum-wait filter).",
        &labelled(
            "reason",
            &[
                (Counter::OffCpuRingFull.name(), k(Counter::OffCpuRingFull)),
                (Counter::OffCpuNoStorage.name(), k(Counter::OffCpuNoStorage)),
                ("unmatched_end", lost.unmatched_ends),
                ("filtered_short", lost.filtered_short),
                ("over_open_bound", lost.over_open_bound),
                ("over_stack_bound", lost.over_stack_bound),
            ],
        ),
    );
    metric(
        out,
        metric::OFF_CPU_OPEN_WAITS,
        "gauge",
        "Sampled waits whose thread has not run again yet.",
        &[("", off_cpu.open_waits)],
    );
    metric(
        out,
        metric::OFF_CPU_THREADS,
        "gauge",
        "Threads with off-CPU task storage now (it goes when they exit).",
        &[(
            "",
            k(Counter::OffCpuThreadsTracked).saturating_sub(k(Counter::OffCpuThreadsGone)),
        )],
    );
}

pub fn render(s: &Snapshot, worker: &WorkerCounters) -> String {
    let mut out = String::new();
    let k = |c: Counter| s.kernel.get(c);
    metric(
        &mut out,
        metric::BPF_SAMPLES,
        "counter",
        "Runs of the BPF sampling program.",
        &[("", k(Counter::Samples))],
    );
    metric(
        &mut out,
        metric::BPF_SAMPLES_SENT,
        "counter",
        "Samples sent to the daemon.",
        &[("", k(Counter::Sent))],
    );
    let dropped = labelled(
        "reason",
        &[
            (Counter::Idle.name(), k(Counter::Idle)),
            (Counter::Filtered.name(), k(Counter::Filtered)),
            (Counter::RingFull.name(), k(Counter::RingFull)),
            (Counter::ScratchMissing.name(), k(Counter::ScratchMissing)),
            (not_profiled::MALFORMED, s.malformed_records),
            (not_profiled::WORK_QUEUE_FULL, s.dropped_work),
            (not_profiled::STACK_BOUND, s.dropped_over_stack_bound),
        ],
    );
    metric(
        &mut out,
        metric::SAMPLES_NOT_PROFILED,
        "counter",
        "Samples not in any profile, by reason (idle and filtered are expected).",
        &dropped,
    );
    metric(
        &mut out,
        metric::RING_WAKEUPS,
        "counter",
        "Ring-buffer drains before the drain period because the ring was a quarter full; often means the ring is small for the sample rate.",
        &[("", s.ring_wakeups)],
    );
    metric(
        &mut out,
        metric::KERNEL_STACK_FAILURES,
        "counter",
        "Kernel stacks bpf_get_stack could not read.",
        &[("", k(Counter::KernelStackFailed))],
    );
    let ends: Vec<(&str, u64)> = UnwindEnd::ALL
        .iter()
        .map(|end| (end.name(), s.unwind_ends[*end as usize]))
        .collect();
    let ends = labelled("reason", &ends);
    metric(
        &mut out,
        metric::UNWIND_ENDS,
        "counter",
        "How user stack walks ended, by reason.",
        &ends,
    );
    metric(
        &mut out,
        metric::RECORDS,
        "counter",
        "Sample records read from the ring buffer.",
        &[("", s.records)],
    );
    metric(
        &mut out,
        metric::INTERVALS,
        "counter",
        "Profiling intervals completed.",
        &[("", s.intervals)],
    );
    metric(
        &mut out,
        metric::PROFILES_WRITTEN,
        "counter",
        "pprof files written.",
        &[("", worker.profiles_written.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::THREAD_PANICS,
        "counter",
        "Panics caught in the daemon's threads, by thread (a bug: each cost one work item or \
         tick; the thread goes on with fresh state).",
        &labelled(
            "thread",
            &[
                ("symbolizer", worker.panics.load(Ordering::Relaxed)),
                ("jvm_tracker", s.jvms.panics),
            ],
        ),
    );
    metric(
        &mut out,
        metric::PROFILE_WRITE_ERRORS,
        "counter",
        "pprof files that could not be written.",
        &[("", worker.write_errors.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::SIDECAR_AGENTS,
        "gauge",
        "JVMs whose sidecar agent reports to the daemon.",
        &[("", worker.sidecar_agents.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::SIDECAR_AGENT_HEAP_BYTES,
        "gauge",
        "Heap the sidecar agents hold, summed over the JVMs.",
        &[("", worker.sidecar_agent_heap_bytes.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::SIDECAR_DROPPED_RECORDS,
        "counter",
        "Records sidecar agents could not write (their JVM's /tmp full or gone).",
        &[("", worker.sidecar_dropped_records.load(Ordering::Relaxed))],
    );
    let cache = &worker.symbol_cache;
    metric(
        &mut out,
        metric::SYMBOL_CACHE_BYTES,
        "gauge",
        "Memory charged to the symbolization caches (parsed binaries, resolved frames).",
        &[("", cache.charged_bytes.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::SYMBOL_CACHE_LIMIT_BYTES,
        "gauge",
        "The caches' budget (cache_budget_mib); past it the least recently used are evicted.",
        &[("", cache.limit_bytes.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::SYMBOL_CACHE_EVICTIONS,
        "counter",
        "Binaries whose cached symbols were dropped to stay within the budget.",
        &[("", cache.evictions.load(Ordering::Relaxed))],
    );
    let refused: Vec<(&str, u64)> = crate::sidecar::index::REFUSAL_REASONS
        .iter()
        .zip(&worker.sidecar_records_refused)
        .map(|(reason, count)| (*reason, count.load(Ordering::Relaxed)))
        .collect();
    let refused = labelled("reason", &refused);
    metric(
        &mut out,
        metric::SIDECAR_RECORDS_REFUSED,
        "gauge",
        "JVMs whose sidecar records file was not read, by reason (a link, special file, foreign \
         owner or oversized file in the JVM's /tmp; frames are then named from memory).",
        &refused,
    );
    let unnamed: Vec<(&str, u64)> = crate::java_names::UnnamedReason::ALL
        .iter()
        .map(|reason| (reason.name(), worker.java_unnamed.get(*reason)))
        .collect();
    let unnamed = labelled("reason", &unnamed);
    metric(
        &mut out,
        metric::JAVA_PREFETCH_MISSES,
        "counter",
        "Java frames of new stacks whose method or code was gone or reused by the time it was \
         read (class unloading); while they occur the ring is drained every 10 to 50 ms.",
        &[("", worker.java_prefetch_misses.load(Ordering::Relaxed))],
    );
    metric(
        &mut out,
        metric::JAVA_FRAMES_UNNAMED,
        "counter",
        "Java frames shown as an unknown marker instead of a name, by reason; counted once per \
         distinct frame of each profile (process and interval), not per sample.",
        &unnamed,
    );
    metric(
        &mut out,
        metric::JVMS,
        "gauge",
        "JVMs by state (ready: layout in the BPF map).",
        &labelled(
            "state",
            &[
                (jvm_state::READY, s.jvms.jvms_ready),
                (jvm_state::PENDING, s.jvms.jvms_pending),
                (jvm_state::FAILED, s.jvms.jvms_failed),
                (jvm_state::OVER_BOUND, s.jvms.jvms_over_bound),
            ],
        ),
    );
    metric(
        &mut out,
        metric::BPF_MAP_ENTRIES,
        "gauge",
        "Entries of the BPF maps the daemon fills.",
        &labelled(
            "map",
            &[
                (bpf_map::HOTSPOT_PROCS, s.jvms.jvms_ready),
                (bpf_map::JAVA_THREADS, s.jvms.java_threads),
            ],
        ),
    );
    metric(
        &mut out,
        metric::BPF_MAP_CAPACITY,
        "gauge",
        "Capacity of the BPF maps the daemon fills.",
        &labelled(
            "map",
            &[
                (bpf_map::HOTSPOT_PROCS, s.jvms.jvm_map_capacity),
                (bpf_map::JAVA_THREADS, s.jvms.java_thread_map_capacity),
            ],
        ),
    );
    metric(
        &mut out,
        metric::JAVA_THREADS_NOT_PUSHED,
        "counter",
        "Java threads left out of the BPF map (full): their Java frames are not unwound.",
        &[("", s.jvms.java_threads_not_pushed)],
    );
    metric(
        &mut out,
        metric::PROCESS_EVENTS,
        "counter",
        "Process events the JVM tracker took from the BPF tracepoints, by kind (whole-host mode).",
        &labelled(
            "kind",
            &[("exec", s.jvms.exec_events), ("exit", s.jvms.exit_events)],
        ),
    );
    metric(
        &mut out,
        metric::PROCESS_EVENTS_LOST,
        "counter",
        "Process events lost to a full ring buffer (the next /proc rescan makes up for them).",
        &[("", k(Counter::ProcessEventsLost))],
    );
    metric(
        &mut out,
        metric::PROC_RESCANS,
        "counter",
        "Full listings of /proc by the JVM tracker (once a minute, besides events).",
        &[("", s.jvms.rescans)],
    );
    if let Some(off_cpu) = &s.off_cpu {
        render_off_cpu(&mut out, s, off_cpu);
    }
    metric(
        &mut out,
        metric::CPUS,
        "gauge",
        "CPUs sampled.",
        &[("", s.cpus as u64)],
    );
    metric(
        &mut out,
        metric::FREQUENCY_HERTZ,
        "gauge",
        "Sampling frequency per CPU.",
        &[("", s.frequency_hz)],
    );
    out
}

fn render_unwind_tables(out: &mut String, t: &crate::native_unwind::loader::TableStats) {
    use crate::native_unwind::loader::NotLoaded;
    let get = |value: &AtomicU64| value.load(Ordering::Relaxed);
    metric(
        out,
        metric::UNWIND_TABLES,
        "gauge",
        "Native unwind tables loaded in the BPF maps (one per distinct .eh_frame).",
        &[("", get(&t.tables))],
    );
    metric(
        out,
        metric::UNWIND_TABLE_BYTES,
        "gauge",
        "Memory of the unwind tables in the BPF maps (charged to the daemon's cgroup, not in its RSS).",
        &[("", get(&t.bytes))],
    );
    metric(
        out,
        metric::UNWIND_TABLE_LIMIT_BYTES,
        "gauge",
        "The unwind tables' budget (a third of cache_budget_mib).",
        &[("", get(&t.limit_bytes))],
    );
    metric(
        out,
        metric::UNWIND_TABLE_PROCESSES,
        "gauge",
        "Processes whose executable mappings are in the BPF maps with their tables.",
        &[("", get(&t.processes))],
    );
    metric(
        out,
        metric::UNWIND_TABLE_BUILDS,
        "counter",
        "Unwind tables built from a file's call frame information.",
        &[("", get(&t.builds))],
    );
    metric(
        out,
        metric::UNWIND_TABLE_BUILD_MILLISECONDS,
        "counter",
        "Time spent building unwind tables.",
        &[("", get(&t.build_micros) / 1_000)],
    );
    metric(
        out,
        metric::UNWIND_TABLE_EVICTIONS,
        "counter",
        "Unwind tables dropped to make room within the budget.",
        &[("", get(&t.evictions))],
    );
    let reasons: Vec<(&str, u64)> = NotLoaded::ALL
        .iter()
        .map(|reason| (reason.name(), t.not_loaded(*reason)))
        .collect();
    metric(
        out,
        metric::UNWIND_TABLES_NOT_LOADED,
        "counter",
        "Files or mappings left to frame pointers, by reason.",
        &labelled("reason", &reasons),
    );
}

fn render_export(out: &mut String, c: &ExportCounters) {
    let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
    metric(
        out,
        metric::EXPORT_PROFILES,
        "counter",
        "Profiles delivered to Pyroscope.",
        &[("", get(&c.exported_profiles))],
    );
    metric(
        out,
        metric::EXPORT_REQUESTS,
        "counter",
        "Push requests Pyroscope accepted.",
        &[("", get(&c.exported_requests))],
    );
    metric(
        out,
        metric::EXPORT_BYTES,
        "counter",
        "Gzipped profile bytes delivered to Pyroscope.",
        &[("", get(&c.exported_bytes))],
    );
    metric(
        out,
        metric::EXPORT_RETRIES,
        "counter",
        "Push attempts that failed and were retried.",
        &[("", get(&c.failed_attempts))],
    );
    metric(
        out,
        metric::EXPORT_DROPPED_PROFILES,
        "counter",
        "Profiles never delivered to Pyroscope, by reason.",
        &labelled(
            "reason",
            &[
                (
                    export_dropped::EXPORT_QUEUE_FULL,
                    get(&c.dropped_queue_full),
                ),
                (export_dropped::SHUTDOWN, get(&c.dropped_at_shutdown)),
                (export_dropped::REJECTED, get(&c.rejected)),
            ],
        ),
    );
    metric(
        out,
        metric::EXPORT_QUEUE_PROFILES,
        "gauge",
        "Profiles waiting for Pyroscope (or being sent).",
        &[("", get(&c.queued_profiles))],
    );
    metric(
        out,
        metric::EXPORT_QUEUE_BYTES,
        "gauge",
        "Bytes of profiles waiting for Pyroscope.",
        &[("", get(&c.queued_bytes))],
    );
    metric(
        out,
        metric::STREAM_SUBSCRIBERS,
        "gauge",
        "Live-stream subscribers connected.",
        &[("", get(&c.stream_subscribers))],
    );
    metric(
        out,
        metric::STREAM_SKIPPED_PROFILES,
        "counter",
        "Profiles live-stream subscribers missed because they read too slowly.",
        &[("", get(&c.stream_skipped))],
    );
}

/// Serves `/metrics` until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Metrics) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            continue;
        };
        let metrics = metrics.clone();
        tokio::spawn(async move {
            let mut request = vec![0u8; 4096];
            let Ok(Ok(len)) =
                tokio::time::timeout(std::time::Duration::from_secs(5), stream.read(&mut request))
                    .await
            else {
                return;
            };
            let request = String::from_utf8_lossy(&request[..len]);
            let response = if request.starts_with("GET /metrics ") || request.starts_with("GET / ")
            {
                let body = metrics.render();
                format!(
                    "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
                    .to_owned()
            };
            let _ = stream.write_all(response.as_bytes()).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_counters_with_reasons() {
        let mut snapshot = Snapshot {
            records: 5,
            ..Default::default()
        };
        snapshot.kernel.0[Counter::RingFull as usize] = 3;
        snapshot.unwind_ends[UnwindEnd::NoCodeBlob as usize] = 2;
        snapshot.jvms.java_thread_map_capacity = 16_384;
        let text = render(&snapshot, &WorkerCounters::default());
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
        assert!(
            text.contains("profiler_bpf_map_capacity{map=\"java_threads\"} 16384"),
            "{text}"
        );
    }

    #[test]
    fn every_reason_of_the_contract_is_a_label() {
        let text = render(&Snapshot::default(), &WorkerCounters::default());
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
        let mut export = String::new();
        render_export(&mut export, &ExportCounters::default());
        assert!(
            export.contains("profiler_export_dropped_profiles_total{reason=\"queue_full\"} 0"),
            "{export}"
        );
    }
}
