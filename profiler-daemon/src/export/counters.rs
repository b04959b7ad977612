//! Tallies of the export side, for the metrics endpoint: one set per remote sink (labelled by
//! the sink's name), and the live stream's.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use profiler_common::metric::{self, export_dropped};

use crate::metrics::families::{by, Families, Label, MetricSource};

/// What one buffered remote sink (Pyroscope, OTLP) delivered, retried and dropped.
#[derive(Debug, Default)]
pub struct SinkCounters {
    pub exported_profiles: AtomicU64,
    pub exported_requests: AtomicU64,
    pub exported_bytes: AtomicU64,
    /// Send attempts that failed and will be retried.
    pub failed_attempts: AtomicU64,
    /// Profiles dropped because the sink's queue was full.
    pub dropped_queue_full: AtomicU64,
    /// Profiles still queued when the shutdown grace period ran out.
    pub dropped_at_shutdown: AtomicU64,
    /// Profiles the backend refused for good (invalid argument): never retried.
    pub rejected: AtomicU64,
    pub queued_profiles: AtomicU64,
    pub queued_bytes: AtomicU64,
}

#[derive(Debug, Default)]
pub struct ExportCounters {
    /// The remote sinks' counters, by sink name, in the order they started.
    sinks: Mutex<Vec<(&'static str, Arc<SinkCounters>)>>,
    pub stream_subscribers: AtomicU64,
    /// Profiles live-stream subscribers missed because they read too slowly.
    pub stream_skipped: AtomicU64,
    /// Profiles whose exported variant could not be encoded (counted with the local files
    /// that could not be written).
    pub encode_errors: AtomicU64,
}

impl ExportCounters {
    /// The counters of the remote sink `name`, created on first use.
    pub fn sink(&self, name: &'static str) -> Arc<SinkCounters> {
        let mut sinks = self.sinks.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, counters)) = sinks.iter().find(|(sink, _)| *sink == name) {
            return counters.clone();
        }
        let counters = Arc::new(SinkCounters::default());
        sinks.push((name, counters.clone()));
        counters
    }

    /// Every remote sink's counters, by name.
    pub fn sinks(&self) -> Vec<(&'static str, Arc<SinkCounters>)> {
        self.sinks.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn get(counter: &AtomicU64) -> u64 {
    counter.load(Ordering::Relaxed)
}

/// The families: the remote sinks' by sink (`pyroscope`, `otlp`), then the live stream's.
impl MetricSource for ExportCounters {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        let sinks = self.sinks();
        encode_delivered(out, &sinks)?;
        encode_dropped_and_queued(out, &sinks)?;
        out.gauge(
            metric::STREAM_SUBSCRIBERS,
            "Live-stream subscribers connected.",
            get(&self.stream_subscribers),
        )?;
        out.counter(
            metric::STREAM_SKIPPED_PROFILES,
            "Profiles live-stream subscribers missed because they read too slowly.",
            get(&self.stream_skipped),
        )
    }
}

type Sinks = [(&'static str, Arc<SinkCounters>)];

/// One sample per remote sink: `value` of its counters.
fn per_sink(
    sinks: &Sinks,
    value: fn(&SinkCounters) -> &AtomicU64,
) -> impl Iterator<Item = (Label, u64)> + '_ {
    by(
        "sink",
        sinks.iter().map(move |(sink, c)| (*sink, get(value(c)))),
    )
}

fn encode_delivered(out: &mut Families, sinks: &Sinks) -> fmt::Result {
    out.counters(
        metric::EXPORT_PROFILES,
        "Profiles delivered, by remote sink.",
        per_sink(sinks, |c| &c.exported_profiles),
    )?;
    out.counters(
        metric::EXPORT_REQUESTS,
        "Requests the backend accepted, by remote sink.",
        per_sink(sinks, |c| &c.exported_requests),
    )?;
    out.counters(
        metric::EXPORT_BYTES,
        "Encoded profile bytes delivered, by remote sink.",
        per_sink(sinks, |c| &c.exported_bytes),
    )?;
    out.counters(
        metric::EXPORT_RETRIES,
        "Requests that failed and were retried, by remote sink.",
        per_sink(sinks, |c| &c.failed_attempts),
    )
}

fn encode_dropped_and_queued(out: &mut Families, sinks: &Sinks) -> fmt::Result {
    out.counters(
        metric::EXPORT_DROPPED_PROFILES,
        "Profiles never delivered, by remote sink and reason.",
        sinks.iter().flat_map(|(sink, c)| {
            [
                (export_dropped::EXPORT_QUEUE_FULL, &c.dropped_queue_full),
                (export_dropped::SHUTDOWN, &c.dropped_at_shutdown),
                (export_dropped::REJECTED, &c.rejected),
            ]
            .map(|(reason, value)| ([("sink", *sink), ("reason", reason)], get(value)))
        }),
    )?;
    out.gauges(
        metric::EXPORT_QUEUE_PROFILES,
        "Profiles waiting for the backend (or being sent), by remote sink.",
        per_sink(sinks, |c| &c.queued_profiles),
    )?;
    out.gauges(
        metric::EXPORT_QUEUE_BYTES,
        "Bytes of profiles waiting for the backend, by remote sink.",
        per_sink(sinks, |c| &c.queued_bytes),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_sink_has_its_own_counters() {
        let counters = ExportCounters::default();
        counters
            .sink("pyroscope")
            .exported_profiles
            .fetch_add(3, Ordering::Relaxed);
        counters
            .sink("otlp")
            .exported_profiles
            .fetch_add(1, Ordering::Relaxed);
        let sinks = counters.sinks();
        let names: Vec<&str> = sinks.iter().map(|(name, _)| *name).collect();
        assert_eq!(names, ["pyroscope", "otlp"]);
        assert_eq!(sinks[0].1.exported_profiles.load(Ordering::Relaxed), 3);
        assert_eq!(
            counters
                .sink("pyroscope")
                .exported_profiles
                .load(Ordering::Relaxed),
            3
        );
    }
}
