//! The whole page, every source on it: the families' names, help texts, labels and types.

use std::sync::atomic::{AtomicU64, Ordering};

use profiler_common::metric::{self, export_dropped, not_profiled};
use profiler_common::{Counter, UnwindEnd};

use super::*;
use crate::daemon::sampling_loop::metrics::Snapshot;
use crate::metrics::Metrics;
use crate::off_cpu::metrics::OffCpuSnapshot;

/// The daemon's sources, and the tracker's counts (shared by its thread in a run).
#[derive(Default)]
struct Sources {
    counters: Counters,
    tracker: Arc<Mutex<TrackerCounts>>,
}

impl Sources {
    fn endpoint(&self) -> Metrics {
        Metrics::new(self.counters.sources(self.tracker.clone()))
    }

    fn rendered(&self, snapshot: Snapshot) -> String {
        self.counters.sampling.publish(snapshot);
        self.endpoint().render()
    }
}

fn rendered(snapshot: Snapshot) -> String {
    Sources::default().rendered(snapshot)
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

/// Probes of a made-up kernel, for `profiler_kernel_feature`.
fn choose_kernel_features() {
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
}

fn tracker_counts(v: &mut Values) -> TrackerCounts {
    let mut j = TrackerCounts::default();
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
        &mut j.jvms_libjvm_hooked,
        &mut j.jvms_libjvm_not_hooked,
        &mut j.libjvm_hooked_files,
        &mut j.libjvm_waiting_files,
        &mut j.libjvm_hook_attach_failures,
    ] {
        *field = v.next();
    }
    j
}

/// The sampling loop's snapshot, after the kernel counters and unwind ends.
fn loop_snapshot(v: &mut Values, snapshot: &mut Snapshot) {
    let s = snapshot;
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
    s.cpus = v.next() as usize;
    s.alloc = true;
    s.off_cpu = Some(OffCpuSnapshot {
        joined: crate::off_cpu::OffCpuStats {
            waits: v.next(),
            filtered_short: v.next(),
            unmatched_ends: v.next(),
            over_open_bound: v.next(),
            over_stack_bound: v.next(),
            virtual_withdrawn: v.next(),
        },
        open_waits: v.next(),
    });
}

fn worker_counters(v: &mut Values, w: &WorkerCounters) {
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
        &w.java_reader.misses,
        &w.intervals_pending,
        &w.alloc_profiles_scaled,
        &w.alloc_profiles_not_scaled,
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
    v.store(&w.java_reader.panics);
}

fn export_counters(v: &mut Values, e: &ExportCounters) {
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
}

fn table_stats(v: &mut Values, t: &TableStats) {
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
}

/// Every source populated with distinct values: the page's lines, sorted, the heap's values
/// (read live) masked.
fn every_family_page() -> String {
    choose_kernel_features();
    let mut v = Values(100);
    let sources = Sources::default();
    let mut snapshot = Snapshot::default();
    // Descending: the gauge of threads with storage is tracked minus gone.
    for value in snapshot.kernel.0.iter_mut().rev() {
        *value = v.next();
    }
    for value in &mut snapshot.unwind_ends {
        *value = v.next();
    }
    *sources.tracker.lock().expect("counts") = tracker_counts(&mut v);
    loop_snapshot(&mut v, &mut snapshot);
    worker_counters(&mut v, &sources.counters.worker);
    sources
        .counters
        .worker
        .alloc_profiling
        .store(true, Ordering::Relaxed);
    export_counters(&mut v, &sources.counters.export);
    table_stats(&mut v, &sources.counters.unwind_tables);
    let metrics = sources.endpoint();
    v.store(&metrics.closed_connections.over_limit);
    v.store(&metrics.closed_connections.timed_out);
    sources.counters.sampling.publish(snapshot);
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

/// Every family, help text, label and type of the page, each sample with a value of its own:
/// renaming or moving a metric shows here (`metrics_page.golden`; `PROFILER_BLESS_METRICS=1`
/// writes it anew, to review).
#[test]
fn every_family_is_on_the_page_as_before() {
    let page = every_family_page();
    let expected = include_str!("metrics_page.golden");
    if std::env::var_os("PROFILER_BLESS_METRICS").is_some() {
        std::fs::write(
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/src/daemon/metric_sources/metrics_page.golden"
            ),
            &page,
        )
        .expect("write");
    }
    assert_eq!(page, expected);
}

/// Off-CPU and allocation profiling off: their families are not on the page, every other one
/// is.
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
    let expected: Vec<String> = types(include_str!("metrics_page.golden"))
        .into_iter()
        .filter(|line| {
            !line.starts_with("# TYPE profiler_off_cpu_")
                && !line.starts_with("# TYPE profiler_virtual_thread_")
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
    let sources = Sources::default();
    sources
        .tracker
        .lock()
        .expect("counts")
        .java_thread_map_capacity = 16_384;
    let text = sources.rendered(snapshot);
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
    let sources = Sources::default();
    sources.counters.export.sink("pyroscope");
    sources.counters.export.sink("otlp");
    let text = sources.endpoint().render();
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
