//! The Grafana Pyroscope sink: each interval's profiles, their remote variant as pprof, grouped into
//! series by label set and sent with `push.v1.PusherService/Push` through the buffered sink
//! (`export::buffered`: queue, retries, shutdown).

use std::sync::atomic::Ordering;
use std::sync::Arc;

use tonic::transport::Channel;

use super::buffered::{BufferedSink, Delivered, SendFailure, Transport};
use super::counters::ExportCounters;
use super::grpc::{ExporterError, GrpcClient};
use super::proto::push::v1::{
    pusher_service_client::PusherServiceClient, PushRequest, RawProfileSeries, RawSample,
};
use super::queue::QueuedBatch;
use super::remote_config::{RemoteConfig, PYROSCOPE};
use super::{label_pairs, ExportedProfile};
use crate::pprof::encode_gzipped;
use crate::sink::{Sink, SinkProfile, SinkTasks};

/// The sink's name in metrics and logs, as its config section's.
const SINK: &str = PYROSCOPE.name;

/// Profiles sent together as one `RawProfileSeries`: they share every label.
#[derive(Debug)]
pub struct PushBatch {
    pub labels: Vec<(String, String)>,
    pub profiles: Vec<Arc<ExportedProfile>>,
}

impl QueuedBatch for PushBatch {
    fn profiles(&self) -> usize {
        self.profiles.len()
    }

    fn bytes(&self) -> usize {
        self.profiles.iter().map(|p| p.pprof_gzip.len()).sum()
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

/// Pyroscope as a sink: each interval's profiles, in Pyroscope's variant, go to the export
/// queue as one batch per label set (a service's processes share one series) for the
/// exporter task to send.
pub struct PyroscopeSink {
    buffered: BufferedSink<PushBatch>,
    interval: Vec<Arc<ExportedProfile>>,
    counters: Arc<ExportCounters>,
}

impl PyroscopeSink {
    /// Starts the delivery task; connects lazily, so an unreachable server is not an error.
    pub fn start(
        config: &RemoteConfig,
        counters: Arc<ExportCounters>,
        tasks: &mut SinkTasks,
    ) -> Result<Self, ExporterError> {
        let transport = PyroscopeTransport::new(config)?;
        tracing::info!(url = %config.target.url, "exporting to pyroscope");
        let buffered = BufferedSink::start(
            SINK,
            config.target.url.clone(),
            transport,
            config.delivery,
            &counters,
            tasks,
        );
        Ok(Self {
            buffered,
            interval: Vec::new(),
            counters,
        })
    }
}

impl Sink for PyroscopeSink {
    fn accept(&mut self, profile: &SinkProfile<'_>) {
        let encoded = profile.remote_pprof().map_err(|err| err.to_string());
        match encoded.and_then(|pprof| encode_gzipped(&pprof).map_err(|err| err.to_string())) {
            Ok(bytes) => {
                let exported = ExportedProfile::new(profile, Arc::from(bytes));
                self.interval.push(Arc::new(exported));
            }
            Err(err) => {
                self.counters.encode_errors.fetch_add(1, Ordering::Relaxed);
                let pid = profile.profile.pid;
                tracing::error!(pid, %err, "cannot encode the exported profile");
            }
        }
    }

    fn end_interval(&mut self) {
        for batch in batches_by_labels(std::mem::take(&mut self.interval)) {
            self.buffered.push(batch);
        }
    }
}

/// Sends push requests to one Pyroscope server.
pub struct PyroscopeTransport {
    grpc: GrpcClient,
    client: PusherServiceClient<Channel>,
}

impl PyroscopeTransport {
    /// Prepares the client; connects lazily, so an unreachable server is not an error here.
    pub fn new(config: &RemoteConfig) -> Result<Self, ExporterError> {
        let grpc = GrpcClient::new(SINK, &config.target)?;
        let client = PusherServiceClient::new(grpc.channel.clone());
        Ok(Self { grpc, client })
    }
}

impl Transport for PyroscopeTransport {
    type Batch = PushBatch;

    async fn send(&mut self, batches: &[Arc<PushBatch>]) -> Result<Delivered, SendFailure> {
        let request = self.grpc.request(push_request(batches));
        match self.client.push(request).await {
            Ok(_) => Ok(Delivered::default()),
            Err(status) => Err(self.grpc.failure(&status)),
        }
    }
}

/// One series per batch.
fn push_request(batches: &[Arc<PushBatch>]) -> PushRequest {
    PushRequest {
        series: batches
            .iter()
            .map(|batch| RawProfileSeries {
                labels: label_pairs(&batch.labels),
                samples: batch
                    .profiles
                    .iter()
                    .map(|profile| RawSample {
                        raw_profile: profile.pprof_gzip.to_vec(),
                        id: String::new(),
                    })
                    .collect(),
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

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
