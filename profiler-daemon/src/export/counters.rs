//! Tallies of the export side, for the metrics endpoint: one set per remote sink (labelled by
//! the sink's name), and the live stream's.

use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

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
