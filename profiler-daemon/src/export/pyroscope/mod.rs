//! The Grafana Pyroscope sink: each interval's profiles, in Pyroscope's variant, grouped into
//! series by label set and sent with `push.v1.PusherService/Push` through the buffered sink
//! (`export::buffered`: queue, retries, shutdown).

pub mod config;
pub mod profile;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use super::buffered::{BufferedSink, Delivery, SendFailure, Transport};
use super::counters::ExportCounters;
use super::proto::push::v1::{
    pusher_service_client::PusherServiceClient, PushRequest, RawProfileSeries, RawSample,
};
use super::queue::QueuedBatch;
use super::{label_pairs, ExportedProfile};
use crate::pprof::encode_gzipped;
use crate::sink::{Sink, SinkProfile, SinkTasks};
use crate::thread_roots::ThreadRoots;

/// The sink's name in metrics and logs.
const SINK: &str = "pyroscope";

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
    threads: ThreadRoots,
    interval: Vec<Arc<ExportedProfile>>,
    counters: Arc<ExportCounters>,
}

impl PyroscopeSink {
    /// Starts the delivery task; connects lazily, so an unreachable server is not an error.
    /// `threads` is how exported stacks show their thread.
    pub fn start(
        config: &PyroscopeConfig,
        threads: ThreadRoots,
        counters: Arc<ExportCounters>,
        tasks: &mut SinkTasks,
    ) -> Result<Self, ExporterError> {
        let transport = PyroscopeTransport::new(config)?;
        tracing::info!(url = %config.url, "exporting to pyroscope");
        let buffered = BufferedSink::start(
            SINK,
            config.url.clone(),
            transport,
            config.delivery,
            &counters,
            tasks,
        );
        Ok(Self {
            buffered,
            threads,
            interval: Vec::new(),
            counters,
        })
    }
}

impl Sink for PyroscopeSink {
    fn name(&self) -> &'static str {
        SINK
    }

    fn accept(&mut self, profile: &SinkProfile<'_>) {
        match encode_gzipped(&profile::export_profile(profile.built, self.threads)) {
            Ok(bytes) => {
                let exported = ExportedProfile::new(profile, Arc::from(bytes));
                self.interval.push(Arc::new(exported));
            }
            Err(err) => {
                self.counters.encode_errors.fetch_add(1, Ordering::Relaxed);
                let pid = profile.built.pid;
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

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    Basic { username: String, password: String },
    Bearer(String),
}

/// The checked `[pyroscope]` configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PyroscopeConfig {
    /// `http://` (plaintext HTTP/2) or `https://` (TLS, system roots plus `ca_file`).
    pub url: String,
    pub tenant_id: Option<String>,
    pub auth: Option<Auth>,
    /// Extra CA certificates (PEM), e.g. for a private CA.
    pub ca_file: Option<PathBuf>,
    /// Bound on each push, connection included.
    pub timeout: Duration,
    /// The queue bound and retry settings.
    pub delivery: Delivery,
}

#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("pyroscope url {url:?}: {reason}")]
    Url { url: String, reason: String },
    #[error("pyroscope ca_file {path}: {source}")]
    CaFile {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("pyroscope: {0} is not a valid header value")]
    Header(&'static str),
}

/// Sends push requests to one Pyroscope server.
pub struct PyroscopeTransport {
    client: PusherServiceClient<Channel>,
    headers: MetadataMap,
}

impl PyroscopeTransport {
    /// Prepares the client; connects lazily, so an unreachable server is not an error here.
    pub fn new(config: &PyroscopeConfig) -> Result<Self, ExporterError> {
        let url_error = |reason: String| ExporterError::Url {
            url: config.url.clone(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(config.url.clone())
            .map_err(|err| url_error(err.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT.min(config.timeout))
            .timeout(config.timeout)
            .user_agent(concat!("jvm-profiler/", env!("CARGO_PKG_VERSION")))
            .map_err(|err| url_error(err.to_string()))?;
        if config.url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_native_roots();
            if let Some(path) = &config.ca_file {
                let pem = std::fs::read(path).map_err(|source| ExporterError::CaFile {
                    path: path.clone(),
                    source,
                })?;
                tls = tls.ca_certificate(Certificate::from_pem(pem));
            }
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|err| url_error(format!("TLS set-up: {err}")))?;
        }
        Ok(Self {
            client: PusherServiceClient::new(endpoint.connect_lazy()),
            headers: request_headers(config)?,
        })
    }
}

impl Transport for PyroscopeTransport {
    type Batch = PushBatch;

    async fn send(&mut self, batches: &[Arc<PushBatch>]) -> Result<(), SendFailure> {
        let mut request = tonic::Request::new(push_request(batches));
        *request.metadata_mut() = self.headers.clone();
        match self.client.push(request).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == Code::InvalidArgument => Err(SendFailure::Refused {
                error: describe(&status),
            }),
            Err(status) => {
                let error = describe(&status);
                let hint = hint(&status, &error);
                Err(SendFailure::Retry { error, hint })
            }
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

/// The tenant and authorization headers sent with every push.
fn request_headers(config: &PyroscopeConfig) -> Result<MetadataMap, ExporterError> {
    use base64::Engine as _;
    let mut headers = MetadataMap::new();
    if let Some(tenant) = &config.tenant_id {
        let value = AsciiMetadataValue::try_from(tenant.as_str())
            .map_err(|_| ExporterError::Header("tenant_id"))?;
        headers.insert("x-scope-orgid", value);
    }
    let authorization = match &config.auth {
        None => None,
        Some(Auth::Basic { username, password }) => Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
        )),
        Some(Auth::Bearer(token)) => Some(format!("Bearer {token}")),
    };
    if let Some(authorization) = authorization {
        let mut value = AsciiMetadataValue::try_from(authorization.as_str())
            .map_err(|_| ExporterError::Header("the credentials"))?;
        value.set_sensitive(true);
        headers.insert("authorization", value);
    }
    Ok(headers)
}

/// The status and the chain of causes under it (a refused connection, a TLS error...).
fn describe(status: &tonic::Status) -> String {
    let mut text = format!("{:?}: {}", status.code(), status.message());
    let mut source = std::error::Error::source(status);
    while let Some(cause) = source {
        // Transport errors repeat their cause's text at each level: keep each once.
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// What the operator most likely has to fix, from the failure.
fn hint(status: &tonic::Status, described: &str) -> &'static str {
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => {
            " (check the [pyroscope] credentials and tenant_id)"
        }
        _ if described.contains("invalid peer certificate") => {
            " (the server's certificate is not trusted: set [pyroscope] ca_file to its CA)"
        }
        // A TLS client reading a plaintext answer, or the other way round.
        _ if described.contains("InvalidContentType")
            || described.contains("frame with invalid size") =>
        {
            " (TLS mismatch: check http:// versus https:// in the url)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::queue::QueueBound;
    use std::time::SystemTime;

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

    fn config(auth: Option<Auth>, tenant: Option<&str>) -> PyroscopeConfig {
        PyroscopeConfig {
            url: "http://127.0.0.1:1".into(),
            tenant_id: tenant.map(str::to_string),
            auth,
            ca_file: None,
            timeout: Duration::from_secs(1),
            delivery: Delivery {
                queue: QueueBound {
                    max_profiles: 1,
                    max_bytes: 1,
                },
                max_backoff: Duration::from_secs(1),
                shutdown_grace: Duration::from_secs(1),
            },
        }
    }

    #[test]
    fn basic_auth_and_tenant_headers() {
        let auth = Auth::Basic {
            username: "123".into(),
            password: "secret".into(),
        };
        let headers = request_headers(&config(Some(auth), Some("team-a"))).expect("valid");
        assert_eq!(
            headers.get("authorization").expect("set"),
            "Basic MTIzOnNlY3JldA=="
        );
        assert_eq!(headers.get("x-scope-orgid").expect("set"), "team-a");
        let headers =
            request_headers(&config(Some(Auth::Bearer("t0k".into())), None)).expect("valid");
        assert_eq!(headers.get("authorization").expect("set"), "Bearer t0k");
        assert!(headers.get("x-scope-orgid").is_none());
    }

    #[test]
    fn headers_with_line_breaks_are_refused() {
        let err = request_headers(&config(None, Some("a\nb"))).expect_err("invalid");
        assert!(err.to_string().contains("tenant_id"), "{err}");
    }
}
