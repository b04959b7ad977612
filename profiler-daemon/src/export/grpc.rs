//! The gRPC side the remote sinks share: the connection (plaintext or TLS with extra CAs), the
//! tenant and authorization headers, and how a failed call is classified and explained.

use std::path::PathBuf;
use std::time::Duration;

use tonic::metadata::{AsciiMetadataValue, MetadataMap};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint};
use tonic::Code;

use super::buffered::SendFailure;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Auth {
    Basic { username: String, password: String },
    Bearer(String),
}

/// Where a remote sink sends, and as whom.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrpcTarget {
    /// `http://` (plaintext HTTP/2) or `https://` (TLS, system roots plus `ca_file`).
    pub url: String,
    /// Sent as `X-Scope-OrgID` (multi-tenant Pyroscope, Grafana's OTLP gateway).
    pub tenant_id: Option<String>,
    pub auth: Option<Auth>,
    /// Extra CA certificates (PEM), e.g. for a private CA.
    pub ca_file: Option<PathBuf>,
    /// Bound on each request, connection included.
    pub timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("{section} url {url:?}: {reason}")]
    Url {
        section: &'static str,
        url: String,
        reason: String,
    },
    #[error("{section} ca_file {path}: {source}")]
    CaFile {
        section: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{section}: {what} is not a valid header value")]
    Header {
        section: &'static str,
        what: &'static str,
    },
}

/// A lazily connected channel to one backend, and the headers every request carries.
pub struct GrpcClient {
    pub channel: Channel,
    headers: MetadataMap,
    /// The config section, for hints (`[pyroscope]`).
    section: &'static str,
}

impl GrpcClient {
    /// Prepares the channel; connects lazily, so an unreachable server is not an error here.
    pub fn new(section: &'static str, target: &GrpcTarget) -> Result<Self, ExporterError> {
        let url_error = |reason: String| ExporterError::Url {
            section,
            url: target.url.clone(),
            reason,
        };
        let mut endpoint = Endpoint::from_shared(target.url.clone())
            .map_err(|err| url_error(err.to_string()))?
            .connect_timeout(CONNECT_TIMEOUT.min(target.timeout))
            .timeout(target.timeout)
            .user_agent(concat!("jvm-profiler/", env!("CARGO_PKG_VERSION")))
            .map_err(|err| url_error(err.to_string()))?;
        if target.url.starts_with("https://") {
            let mut tls = ClientTlsConfig::new().with_native_roots();
            if let Some(path) = &target.ca_file {
                let pem = std::fs::read(path).map_err(|source| ExporterError::CaFile {
                    section,
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
            channel: endpoint.connect_lazy(),
            headers: request_headers(section, target)?,
            section,
        })
    }

    /// `message` as a request with the tenant and authorization headers.
    pub fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        *request.metadata_mut() = self.headers.clone();
        request
    }

    /// How a failed call is handled: refused for good when the server says the request is
    /// invalid, else retried, with a hint at what the operator most likely has to fix.
    pub fn failure(&self, status: &tonic::Status) -> SendFailure {
        let error = describe(status);
        if status.code() == Code::InvalidArgument {
            return SendFailure::Refused { error };
        }
        let hint = hint(self.section, status, &error);
        SendFailure::Retry { error, hint }
    }
}

/// The tenant and authorization headers sent with every request.
fn request_headers(
    section: &'static str,
    target: &GrpcTarget,
) -> Result<MetadataMap, ExporterError> {
    use base64::Engine as _;
    let mut headers = MetadataMap::new();
    if let Some(tenant) = &target.tenant_id {
        let value =
            AsciiMetadataValue::try_from(tenant.as_str()).map_err(|_| ExporterError::Header {
                section,
                what: "tenant_id",
            })?;
        headers.insert("x-scope-orgid", value);
    }
    let authorization = match &target.auth {
        None => None,
        Some(Auth::Basic { username, password }) => Some(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"))
        )),
        Some(Auth::Bearer(token)) => Some(format!("Bearer {token}")),
    };
    if let Some(authorization) = authorization {
        let mut value = AsciiMetadataValue::try_from(authorization.as_str()).map_err(|_| {
            ExporterError::Header {
                section,
                what: "the credentials",
            }
        })?;
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
fn hint(section: &str, status: &tonic::Status, described: &str) -> String {
    match status.code() {
        Code::Unauthenticated | Code::PermissionDenied => {
            format!(" (check the [{section}] credentials and tenant_id)")
        }
        _ if described.contains("invalid peer certificate") => {
            format!(" (the server's certificate is not trusted: set [{section}] ca_file to its CA)")
        }
        // A TLS client reading a plaintext answer, or the other way round.
        _ if described.contains("InvalidContentType")
            || described.contains("frame with invalid size") =>
        {
            " (TLS mismatch: check http:// versus https:// in the url)".to_owned()
        }
        _ => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(auth: Option<Auth>, tenant: Option<&str>) -> GrpcTarget {
        GrpcTarget {
            url: "http://127.0.0.1:1".into(),
            tenant_id: tenant.map(str::to_string),
            auth,
            ca_file: None,
            timeout: Duration::from_secs(1),
        }
    }

    #[test]
    fn basic_auth_and_tenant_headers() {
        let auth = Auth::Basic {
            username: "123".into(),
            password: "secret".into(),
        };
        let headers =
            request_headers("pyroscope", &target(Some(auth), Some("team-a"))).expect("valid");
        assert_eq!(
            headers.get("authorization").expect("set"),
            "Basic MTIzOnNlY3JldA=="
        );
        assert_eq!(headers.get("x-scope-orgid").expect("set"), "team-a");
        let bearer = target(Some(Auth::Bearer("t0k".into())), None);
        let headers = request_headers("otlp", &bearer).expect("valid");
        assert_eq!(headers.get("authorization").expect("set"), "Bearer t0k");
        assert!(headers.get("x-scope-orgid").is_none());
    }

    #[test]
    fn headers_with_line_breaks_are_refused() {
        let err = request_headers("otlp", &target(None, Some("a\nb"))).expect_err("invalid");
        assert!(err.to_string().contains("otlp: tenant_id"), "{err}");
    }

    #[tokio::test]
    async fn invalid_requests_are_refused_and_credentials_retried_with_a_hint() {
        let client = GrpcClient::new("otlp", &target(None, None)).expect("client");
        assert!(matches!(
            client.failure(&tonic::Status::invalid_argument("bad profile")),
            SendFailure::Refused { .. }
        ));
        match client.failure(&tonic::Status::unauthenticated("no")) {
            SendFailure::Retry { hint, .. } => assert!(hint.contains("[otlp]"), "{hint}"),
            other => panic!("{other:?}"),
        }
    }
}
