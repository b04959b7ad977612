//! The OTLP profiles sink: each process's profile of an interval (its remote variant: no
//! sample labels, threads as the `threads` setting says) becomes OTLP profiles of one resource
//! (the process, with semantic-convention attributes); an interval's are queued as one batch and
//! sent with
//! `opentelemetry.proto.collector.profiles.v1development.ProfilesService/Export` through the
//! buffered sink (`export::buffered`). A request's profiles share one dictionary (`convert`).

mod convert;

use std::sync::Arc;

use tonic::codec::CompressionEncoding;
use tonic::transport::Channel;

use super::buffered::{BufferedSink, Delivered, SendFailure, Transport};
use super::counters::ExportCounters;
use super::grpc::{ExporterError, GrpcClient};
use super::proto::opentelemetry::proto::collector::profiles::v1development::{
    profiles_service_client::ProfilesServiceClient, ExportProfilesServiceRequest,
};
use super::proto::opentelemetry::proto::common::v1::{
    any_value, AnyValue, InstrumentationScope, KeyValue,
};
use super::proto::opentelemetry::proto::profiles::v1development::{
    ResourceProfiles, ScopeProfiles,
};
use super::proto::opentelemetry::proto::resource::v1::Resource;
use super::queue::QueuedBatch;
use super::remote_config::{RemoteConfig, OTLP};
use crate::profile_model::SymbolizedProfile;
use crate::sink::{Sink, SinkProfile, SinkTasks};

/// The sink's name in metrics and logs, as its config section's.
const SINK: &str = OTLP.name;

/// Our series labels and the resource attributes the semantic conventions name for them.
/// `__name__` is left out: the profile's sample types say what it measures.
const ATTRIBUTE_OF_LABEL: [(&str, &str); 7] = [
    ("service_name", "service.name"),
    ("process_executable_name", "process.executable.name"),
    ("__container_id__", "container.id"),
    ("namespace", "k8s.namespace.name"),
    ("pod", "k8s.pod.name"),
    ("container", "k8s.container.name"),
    ("node", "k8s.node.name"),
];

/// One process's profile of one interval, with its resource's attributes.
struct ProcessProfile {
    attributes: Vec<KeyValue>,
    profile: Arc<SymbolizedProfile>,
    /// About its size: what the queue's byte bound counts.
    bytes: usize,
}

/// One interval's profiles: queued, sent and dropped together, so that an interval is one
/// request whose processes share the dictionary.
pub struct OtlpBatch {
    processes: Vec<ProcessProfile>,
}

impl QueuedBatch for OtlpBatch {
    fn profiles(&self) -> usize {
        self.processes.len()
    }

    fn bytes(&self) -> usize {
        self.processes.iter().map(|process| process.bytes).sum()
    }
}

fn string_attribute(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        key_strindex: 0,
    }
}

/// The resource attributes of `profile`'s process: `process.pid`, the host, and its labels
/// under their semantic-convention names (other labels, the `[labels]` table's, as they are).
fn resource_attributes(profile: &SinkProfile<'_>, host_name: Option<&str>) -> Vec<KeyValue> {
    let mut attributes = vec![KeyValue {
        key: "process.pid".to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::IntValue(i64::from(profile.profile.pid))),
        }),
        key_strindex: 0,
    }];
    if let Some(host_name) = host_name {
        attributes.push(string_attribute("host.name", host_name));
    }
    for (label, value) in profile.labels {
        if label == "__name__" {
            continue;
        }
        let key = ATTRIBUTE_OF_LABEL
            .iter()
            .find(|(ours, _)| ours == label)
            .map_or(label.as_str(), |(_, attribute)| attribute);
        attributes.push(string_attribute(key, value));
    }
    attributes
}

/// OTLP as a sink: each interval's profiles go to the queue as one batch.
pub struct OtlpSink {
    buffered: BufferedSink<OtlpBatch>,
    host_name: Option<String>,
    interval: Vec<ProcessProfile>,
}

impl OtlpSink {
    /// Starts the delivery task; connects lazily, so an unreachable receiver is not an error.
    /// `node` is the Kubernetes node the daemon watches, the host's name in a pod (whose own
    /// host name is the pod's).
    pub fn start(
        config: &RemoteConfig,
        node: Option<&str>,
        counters: Arc<ExportCounters>,
        tasks: &mut SinkTasks,
    ) -> Result<Self, ExporterError> {
        let grpc = GrpcClient::new(SINK, &config.target)?;
        let transport = OtlpTransport {
            // Gzipped on the wire (every gRPC server takes it): an OTLP request is plain
            // protobuf, where Pyroscope's carries gzipped pprof.
            client: ProfilesServiceClient::new(grpc.channel.clone())
                .send_compressed(CompressionEncoding::Gzip),
            grpc,
            partial_rejections: 0,
        };
        tracing::info!(url = %config.target.url, "exporting OTLP profiles");
        let buffered = BufferedSink::start(
            SINK,
            config.target.url.clone(),
            transport,
            config.delivery,
            &counters,
            tasks,
        );
        let host_name = match node {
            Some(node) => Some(node.to_owned()),
            None => std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_owned())
                .filter(|name| !name.is_empty()),
        };
        Ok(Self {
            buffered,
            host_name,
            interval: Vec::new(),
        })
    }
}

impl Sink for OtlpSink {
    fn accept(&mut self, profile: &SinkProfile<'_>) {
        let variant = profile.remote_variant().clone();
        self.interval.push(ProcessProfile {
            attributes: resource_attributes(profile, self.host_name.as_deref()),
            bytes: variant.approximate_bytes(),
            profile: variant,
        });
    }

    fn end_interval(&mut self) {
        if !self.interval.is_empty() {
            let processes = std::mem::take(&mut self.interval);
            self.buffered.push(OtlpBatch { processes });
        }
    }
}

/// Sends export requests to one OTLP receiver.
struct OtlpTransport {
    grpc: GrpcClient,
    client: ProfilesServiceClient<Channel>,
    /// Responses that rejected part of a request: logged at the 1st, 2nd, 4th... (never a
    /// line per request).
    partial_rejections: u64,
}

impl Transport for OtlpTransport {
    type Batch = OtlpBatch;

    async fn send(&mut self, batches: &[Arc<OtlpBatch>]) -> Result<Delivered, SendFailure> {
        let request = self.grpc.request(export_request(batches));
        let response = match self.client.export(request).await {
            Ok(response) => response.into_inner(),
            Err(status) => return Err(self.grpc.failure(&status)),
        };
        let Some(partial) = response.partial_success else {
            return Ok(Delivered::default());
        };
        let rejected = u64::try_from(partial.rejected_profiles).unwrap_or(0);
        if rejected > 0 {
            self.partial_rejections += 1;
            if self.partial_rejections.is_power_of_two() {
                tracing::warn!(
                    rejected_profiles = rejected,
                    message = %partial.error_message,
                    "the OTLP receiver rejected part of a request"
                );
            }
        }
        Ok(Delivered { rejected })
    }
}

/// One resource per process and interval, one dictionary for the request.
fn export_request(batches: &[Arc<OtlpBatch>]) -> ExportProfilesServiceRequest {
    let mut dictionary = convert::Dictionary::default();
    let scope = InstrumentationScope {
        name: "jvm-profiler".to_owned(),
        version: env!("CARGO_PKG_VERSION").to_owned(),
        ..Default::default()
    };
    let resource_profiles = batches
        .iter()
        .flat_map(|batch| &batch.processes)
        .map(|process| ResourceProfiles {
            resource: Some(Resource {
                attributes: process.attributes.clone(),
                ..Default::default()
            }),
            scope_profiles: vec![ScopeProfiles {
                scope: Some(scope.clone()),
                profiles: dictionary.profiles(&process.profile),
                schema_url: String::new(),
            }],
            schema_url: String::new(),
        })
        .collect();
    ExportProfilesServiceRequest {
        resource_profiles,
        dictionary: Some(dictionary.finish()),
    }
}
