//! The network sinks: Grafana Pyroscope (`pyroscope`, through a bounded queue) and the daemon's
//! own live stream (`stream`). Pyroscope gets a variant without high-cardinality sample labels,
//! the stream the local files' profile (see `crate::profiles`).
//!
//! ```text
//! Worker --> PyroscopeSink --batches by label set--> ExportQueue --> Pyroscope exporter task
//!        \--> StreamSink --each profile--> broadcast --> one task per stream subscriber
//! ```
//! The worker never waits on either: the queue drops its oldest batch when full (counted), and a
//! subscriber too slow for the broadcast misses profiles (counted, and told).

pub mod pyroscope;
pub mod queue;
pub mod stream;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use queue::PushBatch;

use crate::sink::SinkProfile;

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
    /// Pyroscope's variant (no sample labels, threads merged or rooted as the `threads`
    /// setting asks) or, for the live stream, the local files' profile with `pid`,
    /// `comm` and thread sample labels: its subscribers receive one process's profiles at a
    /// time, not series a label could multiply. See `crate::profiles`.
    pub pprof_gzip: Arc<[u8]>,
}

impl ExportedProfile {
    /// `profile` as exported, with `pprof_gzip` as its payload.
    pub fn new(profile: &SinkProfile<'_>, pprof_gzip: Arc<[u8]>) -> Self {
        Self {
            pid: profile.built.pid,
            service_name: profile.service_name.to_owned(),
            labels: profile.labels.to_vec(),
            start: profile.start,
            duration: profile.duration,
            pprof_gzip,
        }
    }
}

/// Groups profiles that share all their labels, in the order of first appearance.
/// Label pairs as the protocols (Pyroscope's push, the live stream) carry them.
fn label_pairs(labels: &[(String, String)]) -> Vec<proto::types::v1::LabelPair> {
    labels
        .iter()
        .map(|(name, value)| proto::types::v1::LabelPair {
            name: name.clone(),
            value: value.clone(),
        })
        .collect()
}

pub(crate) fn batches_by_labels(profiles: Vec<Arc<ExportedProfile>>) -> Vec<PushBatch> {
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
