//! The daemon's metrics: the counters it shares with the components that keep them, and the
//! list of metric sources the endpoint encodes, in the order of the page.

use std::sync::{Arc, Mutex};

use super::sampling_loop::metrics::LoopMetrics;
use super::threads::ThreadPanics;
use crate::export::counters::ExportCounters;
use crate::hotspot::tracker::TrackerCounts;
use crate::hotspot::tracker_metrics::TrackerMetrics;
use crate::kernel_features::FeatureMetrics;
use crate::metrics::families::MetricSource;
use crate::native_unwind::loader::TableStats;
use crate::own_memory::HeapMetrics;
use crate::worker_metrics::{WorkerCounters, WorkerMetrics};

/// The counters shared with the threads and tasks that count them, created before them.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) worker: Arc<WorkerCounters>,
    pub(super) export: Arc<ExportCounters>,
    pub(super) unwind_tables: Arc<TableStats>,
    /// The snapshot the sampling loop publishes.
    pub(super) sampling: Arc<LoopMetrics>,
}

impl Counters {
    /// Every source of the page: these counters, the JVM tracker's `tracker` counts, and those
    /// read at each scrape.
    pub(super) fn sources(&self, tracker: Arc<Mutex<TrackerCounts>>) -> Vec<Arc<dyn MetricSource>> {
        vec![
            Arc::new(FeatureMetrics),
            self.sampling.clone(),
            Arc::new(WorkerMetrics {
                counters: self.worker.clone(),
                export: self.export.clone(),
            }),
            Arc::new(ThreadPanics {
                worker: self.worker.clone(),
                tracker: tracker.clone(),
            }),
            Arc::new(HeapMetrics),
            Arc::new(TrackerMetrics { counts: tracker }),
            self.unwind_tables.clone(),
            self.export.clone(),
        ]
    }
}

#[cfg(test)]
mod tests;
