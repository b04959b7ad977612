//! Where built profiles go besides the local files: Grafana Pyroscope (`pyroscope`, through a
//! bounded queue) and the daemon's own live stream (`stream`). Pyroscope gets a variant without
//! high-cardinality sample labels, the stream the local files' profile (see `crate::profiles`).
//!
//! ```text
//! Worker --interval--> Exports --batches by label set--> ExportQueue --> Pyroscope exporter task
//!                             \--each profile--> broadcast --> one task per stream subscriber
//! ```
//! The worker never waits on either: the queue drops its oldest batch when full (counted), and a
//! subscriber too slow for the broadcast misses profiles (counted, and told).

pub mod identity;
pub mod pyroscope;
pub mod queue;
pub mod stream;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::broadcast;

use queue::{ExportQueue, PushBatch};

/// The generated protobuf and gRPC code.
pub mod proto {
    #![allow(clippy::all)]
    pub mod types {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/types.v1.rs"));
        }
    }
    pub mod push {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/push.v1.rs"));
        }
    }
    pub mod profiler {
        pub mod v1 {
            include!(concat!(env!("OUT_DIR"), "/profiler.v1.rs"));
        }
    }
}

/// One process's profile of one interval, as exported.
#[derive(Debug)]
pub struct ExportedProfile {
    pub pid: u32,
    pub service_name: String,
    /// Sorted, `__name__` first (see `ProcessIdentity::labels`).
    pub labels: Vec<(String, String)>,
    pub start: SystemTime,
    pub duration: Duration,
    /// What Pyroscope gets: threads as root frames, no string sample labels unless
    /// `per_thread_series` (see `crate::profiles`).
    pub pprof_gzip: Arc<[u8]>,
    /// What the live stream gets: the local files' profile, with `pid`, `comm`, `thread_name`,
    /// `thread_name_source` and `thread_id` sample labels. Its subscribers receive one
    /// process's profiles at a time, not series a label could multiply.
    pub labelled_pprof_gzip: Arc<[u8]>,
}

/// How many profiles the live stream buffers for its slowest subscriber.
const STREAM_BUFFER: usize = 256;

/// The exporters a profile is handed to; cheap to clone into the worker.
#[derive(Clone, Default)]
pub struct Exports {
    pub queue: Option<Arc<ExportQueue>>,
    pub stream: Option<broadcast::Sender<Arc<ExportedProfile>>>,
    /// Extra static labels for every exported profile (`[pyroscope] labels`).
    pub extra_labels: BTreeMap<String, String>,
    /// How profiles exported to Pyroscope show threads.
    pub threads: crate::profiles::ExportThreads,
}

impl Exports {
    /// A broadcast channel for the live stream; subscribers call `subscribe` on the sender.
    pub fn stream_channel() -> broadcast::Sender<Arc<ExportedProfile>> {
        broadcast::channel(STREAM_BUFFER).0
    }

    pub fn is_enabled(&self) -> bool {
        self.queue.is_some() || self.stream.is_some()
    }

    /// Hands over an interval's profiles: to the stream one by one, to Pyroscope as one batch per
    /// label set (a service's processes share one series). Never blocks.
    pub fn publish_interval(&self, profiles: Vec<Arc<ExportedProfile>>) {
        if let Some(stream) = &self.stream {
            for profile in &profiles {
                // An error only means nobody is subscribed.
                let _ = stream.send(profile.clone());
            }
        }
        if let Some(queue) = &self.queue {
            for batch in batches_by_labels(profiles) {
                queue.push(batch);
            }
        }
    }
}

/// Groups profiles that share all their labels, in the order of first appearance.
fn batches_by_labels(profiles: Vec<Arc<ExportedProfile>>) -> Vec<PushBatch> {
    let mut batches: Vec<PushBatch> = Vec::new();
    for profile in profiles {
        match batches.iter_mut().find(|b| b.labels == profile.labels) {
            Some(batch) => batch.profiles.push(profile),
            None => batches.push(PushBatch {
                labels: profile.labels.clone(),
                profiles: vec![profile],
            }),
        }
    }
    batches
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(pid: u32, service: &str) -> Arc<ExportedProfile> {
        Arc::new(ExportedProfile {
            pid,
            service_name: service.into(),
            labels: vec![("service_name".into(), service.into())],
            start: SystemTime::UNIX_EPOCH,
            duration: Duration::from_secs(1),
            pprof_gzip: Arc::from(vec![1u8, 2, 3]),
            labelled_pprof_gzip: Arc::from(vec![1u8, 2, 3]),
        })
    }

    #[test]
    fn a_service_s_processes_share_one_batch() {
        let batches = batches_by_labels(vec![profile(1, "a"), profile(2, "b"), profile(3, "a")]);
        assert_eq!(batches.len(), 2);
        let pids: Vec<u32> = batches[0].profiles.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![1, 3]);
        assert_eq!(batches[1].profiles[0].pid, 2);
    }
}
