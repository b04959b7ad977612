//! The network sinks: Grafana Pyroscope (`pyroscope`) and OTLP profiles (`otlp`), the remote
//! sinks, and the daemon's own live stream (`stream`). The remote sinks encode the variant
//! without high-cardinality sample labels (`crate::remote_variant`), made once for both; the
//! stream sends the local files' pprof. No sink imports another.
//!
//! ```text
//! Worker --> PyroscopeSink --batches by label set--> BufferedSink: queue --> delivery task
//!        \--> OtlpSink --one batch per interval-----> BufferedSink: queue --> delivery task
//!        \--> StreamSink --each profile--> broadcast --> one task per stream subscriber
//! ```
//! The worker never waits on either: a remote sink's queue drops its oldest batch when full
//! (counted), and a subscriber too slow for the broadcast misses profiles (counted, and told).

pub mod buffered;
pub mod counters;
pub mod grpc;
pub mod otlp;
pub mod pyroscope;
pub mod queue;
pub mod remote_config;
pub mod stream;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

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
    /// OTLP, nested as its packages are: the generated code names other packages by
    /// relative paths.
    #[allow(dead_code)] // The request's other messages are not all built.
    pub mod opentelemetry {
        pub mod proto {
            pub mod common {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.common.v1.rs"
                    ));
                }
            }
            pub mod resource {
                pub mod v1 {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.resource.v1.rs"
                    ));
                }
            }
            pub mod profiles {
                pub mod v1development {
                    include!(concat!(
                        env!("OUT_DIR"),
                        "/opentelemetry.proto.profiles.v1development.rs"
                    ));
                }
            }
            pub mod collector {
                pub mod profiles {
                    pub mod v1development {
                        include!(concat!(
                            env!("OUT_DIR"),
                            "/opentelemetry.proto.collector.profiles.v1development.rs"
                        ));
                    }
                }
            }
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
    /// The remote variant (no sample labels, threads merged or rooted as the `threads` setting
    /// asks) or, for the live stream, the local files' profile with `pid`, `comm` and thread
    /// sample labels: its subscribers receive one process's profiles at a time, not series a
    /// label could multiply. See `crate::pprof::encode`.
    pub pprof_gzip: Arc<[u8]>,
}

impl ExportedProfile {
    /// `profile` as exported, with `pprof_gzip` as its payload.
    pub fn new(profile: &SinkProfile<'_>, pprof_gzip: Arc<[u8]>) -> Self {
        Self {
            pid: profile.profile.pid,
            service_name: profile.service_name.to_owned(),
            labels: profile.labels.to_vec(),
            start: profile.profile.start,
            duration: profile.profile.duration,
            pprof_gzip,
        }
    }
}

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
