//! The Grafana Pyroscope exporter: one task that sends the export queue's batches, oldest first,
//! with `push.v1.PusherService/Push`, retrying with capped exponential backoff.
//!
//! One request is in flight at a time, and its batches leave the queue only once the server
//! accepted them (or refused them for good), so an outage delays profiles without reordering or
//! duplicating them.

pub mod config;
pub mod profile;

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use super::proto::push::v1::{
    pusher_service_client::PusherServiceClient, PushRequest, RawProfileSeries, RawSample,
};
use super::queue::{ExportCounters, ExportQueue, PushBatch, QueueBound};
use super::{batches_by_labels, label_pairs, ExportedProfile};
use crate::pprof::encode_gzipped;
use crate::sink::{Sink, SinkProfile, SinkTasks};
use crate::thread_roots::ThreadRoots;

/// Pyroscope as a sink: each interval's profiles, in Pyroscope's variant, go to the export
/// queue as one batch per label set (a service's processes share one series) for the
/// exporter task to send.
pub struct PyroscopeSink {
    queue: Arc<ExportQueue>,
    threads: ThreadRoots,
    interval: Vec<Arc<ExportedProfile>>,
    counters: Arc<ExportCounters>,
}

impl PyroscopeSink {
    /// Starts the exporter task; connects lazily, so an unreachable server is not an error.
    /// `threads` is how exported stacks show their thread.
    pub fn start(
        config: &PyroscopeConfig,
        threads: ThreadRoots,
        counters: Arc<ExportCounters>,
        tasks: &mut SinkTasks,
    ) -> Result<Self, ExporterError> {
        let queue = Arc::new(ExportQueue::new(config.queue, counters.clone()));
        let exporter = PyroscopeExporter::new(config, queue.clone(), counters.clone())?;
        tracing::info!(url = %config.url, "exporting to pyroscope");
        tasks.spawn(|stopped| exporter.run(stopped));
        Ok(Self {
            queue,
            threads,
            interval: Vec::new(),
            counters,
        })
    }
}

impl Sink for PyroscopeSink {
    fn name(&self) -> &'static str {
        "pyroscope"
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
            self.queue.push(batch);
        }
    }
}

/// First wait after a failed push; doubled after each failure up to `max_backoff`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(250);
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
    pub queue: QueueBound,
    pub max_backoff: Duration,
    /// How long queued profiles are still tried at shutdown.
    pub shutdown_grace: Duration,
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

pub struct PyroscopeExporter {
    client: PusherServiceClient<Channel>,
    headers: MetadataMap,
    queue: Arc<ExportQueue>,
    counters: Arc<ExportCounters>,
    url: String,
    max_backoff: Duration,
    shutdown_grace: Duration,
}

/// How a failed push is handled.
enum Failure {
    /// Worth retrying: the server is down, slow, overloaded, or refused our credentials (which
    /// an operator may fix without restarting us).
    Retry(tonic::Status),
    /// The server will never take this batch (a malformed profile, for instance).
    Refused(tonic::Status),
}

impl PyroscopeExporter {
    /// Prepares the client; connects lazily, so an unreachable server is not an error here.
    pub fn new(
        config: &PyroscopeConfig,
        queue: Arc<ExportQueue>,
        counters: Arc<ExportCounters>,
    ) -> Result<Self, ExporterError> {
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
            queue,
            counters,
            url: config.url.clone(),
            max_backoff: config.max_backoff,
            shutdown_grace: config.shutdown_grace,
        })
    }

    /// Sends batches until `shutdown` turns true, then for at most the grace period while
    /// profiles remain; what is left after it is counted as dropped.
    pub async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut deadline: Option<Instant> = None;
        let mut backoff = INITIAL_BACKOFF;
        let mut failures_in_a_row: u64 = 0;
        loop {
            if deadline.is_some() && self.queue.is_empty() {
                break;
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                break;
            }
            let batches = tokio::select! {
                batches = self.queue.next() => batches,
                _ = shutdown.changed(), if deadline.is_none() => {
                    deadline = Some(Instant::now() + self.shutdown_grace);
                    continue;
                }
                _ = sleep_until_deadline(deadline) => break,
            };
            let outcome = tokio::select! {
                outcome = self.push(&batches) => outcome,
                _ = sleep_until_deadline(deadline) => break,
            };
            match outcome {
                Ok(()) => {
                    if failures_in_a_row > 0 {
                        tracing::info!(
                            url = %self.url,
                            failed_attempts = failures_in_a_row,
                            "pyroscope: delivering again"
                        );
                    }
                    failures_in_a_row = 0;
                    backoff = INITIAL_BACKOFF;
                    self.counted_as_delivered(&batches);
                    self.queue.done_with_in_flight();
                }
                Err(Failure::Refused(status)) => {
                    let profiles = profile_count(&batches);
                    self.counters
                        .rejected
                        .fetch_add(profiles, Ordering::Relaxed);
                    tracing::error!(
                        url = %self.url,
                        error = %describe(&status),
                        profiles,
                        "pyroscope refused profiles: dropped"
                    );
                    self.queue.done_with_in_flight();
                }
                Err(Failure::Retry(status)) => {
                    failures_in_a_row += 1;
                    self.counters
                        .failed_attempts
                        .fetch_add(1, Ordering::Relaxed);
                    // The first failure and then every power of two: an outage is visible
                    // without a line per retry.
                    if failures_in_a_row.is_power_of_two() {
                        let error = describe(&status);
                        tracing::warn!(
                            url = %self.url,
                            %error,
                            failed_attempts = failures_in_a_row,
                            queued_profiles = self.queue.len(),
                            retry_in_ms = backoff.as_millis() as u64,
                            "pyroscope push failed, retrying{}",
                            hint(&status, &error)
                        );
                    }
                    let wake = Instant::now() + backoff;
                    let wake = deadline.map_or(wake, |at| wake.min(at));
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake) => {}
                        _ = shutdown.changed(), if deadline.is_none() => {
                            deadline = Some(Instant::now() + self.shutdown_grace);
                        }
                    }
                    backoff = (backoff * 2).min(self.max_backoff);
                }
            }
        }
        if !self.queue.is_empty() {
            let abandoned = self.queue.abandon();
            tracing::warn!(
                url = %self.url,
                profiles = abandoned,
                "shutdown: profiles not delivered to pyroscope within the grace period"
            );
        }
    }

    async fn push(&mut self, batches: &[Arc<PushBatch>]) -> Result<(), Failure> {
        let mut request = tonic::Request::new(push_request(batches));
        *request.metadata_mut() = self.headers.clone();
        match self.client.push(request).await {
            Ok(_) => Ok(()),
            Err(status) => Err(match status.code() {
                Code::InvalidArgument => Failure::Refused(status),
                _ => Failure::Retry(status),
            }),
        }
    }

    fn counted_as_delivered(&self, batches: &[Arc<PushBatch>]) {
        let c = &self.counters;
        c.exported_requests.fetch_add(1, Ordering::Relaxed);
        c.exported_profiles
            .fetch_add(profile_count(batches), Ordering::Relaxed);
        let bytes: usize = batches.iter().map(|batch| batch.bytes()).sum();
        c.exported_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

async fn sleep_until_deadline(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn profile_count(batches: &[Arc<PushBatch>]) -> u64 {
    batches
        .iter()
        .map(|batch| batch.profiles.len() as u64)
        .sum()
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

    fn config(auth: Option<Auth>, tenant: Option<&str>) -> PyroscopeConfig {
        PyroscopeConfig {
            url: "http://127.0.0.1:1".into(),
            tenant_id: tenant.map(str::to_string),
            auth,
            ca_file: None,
            timeout: Duration::from_secs(1),
            queue: QueueBound {
                max_profiles: 1,
                max_bytes: 1,
            },
            max_backoff: Duration::from_secs(1),
            shutdown_grace: Duration::from_secs(1),
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
