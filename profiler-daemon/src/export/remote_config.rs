//! The sections of the remote sinks (`[pyroscope]`, `[otlp]`): one table as written and one
//! set of checks for both, each error naming the section's own field and flag.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::buffered::Delivery;
use super::grpc::{Auth, GrpcTarget};
use super::queue::QueueBound;
use crate::config_error::{invalid, ConfigError};

pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_QUEUE_MAX_PROFILES: usize = 4096;
pub const DEFAULT_QUEUE_MAX_BYTES: usize = 64 << 20;
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(5);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// A remote sink's section: its name (also its url's flag, `--pyroscope`), and its fields'
/// names as errors show them.
#[derive(Debug)]
pub struct Section {
    pub name: &'static str,
    url: &'static str,
    per_thread_series: &'static str,
    password: &'static str,
    password_file: &'static str,
    username: &'static str,
    bearer_token: &'static str,
    bearer_token_file: &'static str,
    ca_file: &'static str,
    tenant_id: &'static str,
    timeout_secs: &'static str,
    queue_max_profiles: &'static str,
    queue_max_bytes: &'static str,
    max_backoff_secs: &'static str,
    shutdown_grace_secs: &'static str,
}

/// The `Section` of the table `$name`, whose url the flag `--$name` sets.
macro_rules! section {
    ($name:literal) => {
        Section {
            name: $name,
            url: concat!($name, ".url"),
            per_thread_series: concat!($name, ".per_thread_series"),
            password: concat!($name, ".password"),
            password_file: concat!($name, ".password_file"),
            username: concat!($name, ".username"),
            bearer_token: concat!($name, ".bearer_token"),
            bearer_token_file: concat!($name, ".bearer_token_file"),
            ca_file: concat!($name, ".ca_file"),
            tenant_id: concat!($name, ".tenant_id"),
            timeout_secs: concat!($name, ".timeout_secs"),
            queue_max_profiles: concat!($name, ".queue_max_profiles"),
            queue_max_bytes: concat!($name, ".queue_max_bytes"),
            max_backoff_secs: concat!($name, ".max_backoff_secs"),
            shutdown_grace_secs: concat!($name, ".shutdown_grace_secs"),
        }
    };
}

pub const PYROSCOPE: Section = section!("pyroscope");
pub const OTLP: Section = section!("otlp");

/// A remote sink's checked section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    pub target: GrpcTarget,
    /// The queue bound and retry settings.
    pub delivery: Delivery,
}

/// A remote sink's table (`[pyroscope]`, `[otlp]`).
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct RemoteFile {
    /// `http://host:4040` (plaintext HTTP/2) or `https://...` (TLS).
    pub url: Option<String>,
    /// Sent as the `X-Scope-OrgID` header (multi-tenant Pyroscope, Grafana's OTLP gateway).
    pub tenant_id: Option<String>,
    /// Basic auth (Grafana Cloud: the stack's user id and an access token).
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Bound on each request in seconds (default 10).
    pub timeout_secs: Option<u64>,
    /// Profiles kept while the backend is unreachable (default 4096); the oldest go first.
    pub queue_max_profiles: Option<usize>,
    /// Bytes of profiles kept while unreachable (default 64 MiB): gzipped pprof for
    /// Pyroscope, pprof's encoded size for OTLP.
    pub queue_max_bytes: Option<usize>,
    /// Longest wait between retries in seconds (default 5).
    pub max_backoff_secs: Option<u64>,
    /// How long queued profiles are still tried at shutdown in seconds (default 5).
    pub shutdown_grace_secs: Option<u64>,
    /// Replaced by the top-level `threads` key; read (of any type) only to say so.
    pub per_thread_series: Option<RemovedKey>,
}

/// A key no longer read: any value is taken, so that the check can name what replaced it
/// rather than fail as an unknown key.
#[derive(Debug, PartialEq, Eq)]
pub struct RemovedKey;

impl<'de> Deserialize<'de> for RemovedKey {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        serde::de::IgnoredAny::deserialize(deserializer).map(|_| RemovedKey)
    }
}

/// Reads a secret from a file (a mounted Kubernetes secret, typically), without its final
/// newline.
fn read_secret(field: &'static str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| invalid(field, format!("cannot read {}: {err}", path.display())))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

impl RemoteConfig {
    /// Checks the `section` table; `flag_url` is its flag (`--pyroscope`), which wins over `url`.
    pub fn resolve(
        section: &Section,
        flag_url: Option<String>,
        file: RemoteFile,
    ) -> Result<Self, ConfigError> {
        let url = flag_url.or(file.url).ok_or_else(|| ConfigError::Invalid {
            field: section.url,
            flag: Some(section.name),
            reason: format!("missing (the [{}] table needs a url)", section.name),
        })?;
        let uri: tonic::transport::Uri = url.parse().map_err(|err| ConfigError::Invalid {
            field: section.url,
            flag: Some(section.name),
            reason: format!("{url:?} is not a URL ({err})"),
        })?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => {
                return Err(ConfigError::Invalid {
                    field: section.url,
                    flag: Some(section.name),
                    reason: format!("{url:?} must start with http:// or https://"),
                })
            }
        };
        if uri.host().is_none_or(str::is_empty) {
            return Err(ConfigError::Invalid {
                field: section.url,
                flag: Some(section.name),
                reason: format!("{url:?} has no host"),
            });
        }
        if file.per_thread_series.is_some() {
            return Err(invalid(
                section.per_thread_series,
                "replaced by the top-level key `threads` (for every output, before any table): \
                 threads = \"thread\" roots each stack at its thread, threads = \"pool\" at \
                 its thread pool; the default merges threads",
            ));
        }
        let password = match (file.password, file.password_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    section.password_file,
                    "give password or password_file, not both",
                ))
            }
            (Some(password), None) => Some(password),
            (None, Some(path)) => Some(read_secret(section.password_file, &path)?),
            (None, None) => None,
        };
        let token = match (file.bearer_token, file.bearer_token_file) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    section.bearer_token_file,
                    "give bearer_token or bearer_token_file, not both",
                ))
            }
            (Some(token), None) => Some(token),
            (None, Some(path)) => Some(read_secret(section.bearer_token_file, &path)?),
            (None, None) => None,
        };
        let auth = match (file.username, password, token) {
            (None, None, None) => None,
            (Some(username), Some(password), None) => Some(Auth::Basic { username, password }),
            (None, None, Some(token)) => Some(Auth::Bearer(token)),
            (Some(_), None, None) => {
                return Err(invalid(
                    section.password,
                    "username needs a password (or password_file)",
                ))
            }
            (None, Some(_), None) => {
                return Err(invalid(section.username, "a password needs a username"))
            }
            (_, _, Some(_)) => {
                return Err(invalid(
                    section.bearer_token,
                    "use basic auth (username, password) or a bearer token, not both",
                ))
            }
        };
        if file.ca_file.is_some() && !https {
            return Err(invalid(section.ca_file, "needs an https:// url"));
        }
        if let Some(path) = &file.ca_file {
            std::fs::metadata(path).map_err(|err| {
                invalid(
                    section.ca_file,
                    format!("cannot read {}: {err}", path.display()),
                )
            })?;
        }
        if let Some(tenant) = &file.tenant_id {
            if tenant.is_empty() || !tenant.chars().all(|c| c.is_ascii_graphic()) {
                return Err(invalid(
                    section.tenant_id,
                    format!("{tenant:?} must be printable ASCII without spaces"),
                ));
            }
        }
        let seconds = |field: &'static str,
                       value: Option<u64>,
                       default: Duration,
                       range: std::ops::RangeInclusive<u64>| {
            let secs = value.unwrap_or(default.as_secs());
            if range.contains(&secs) {
                Ok(Duration::from_secs(secs))
            } else {
                Err(invalid(
                    field,
                    format!("{secs} s is outside {}..={} s", range.start(), range.end()),
                ))
            }
        };
        let queue = QueueBound {
            max_profiles: file
                .queue_max_profiles
                .unwrap_or(DEFAULT_QUEUE_MAX_PROFILES),
            max_bytes: file.queue_max_bytes.unwrap_or(DEFAULT_QUEUE_MAX_BYTES),
        };
        if queue.max_profiles == 0 {
            return Err(invalid(section.queue_max_profiles, "must be at least 1"));
        }
        if queue.max_bytes < 1 << 20 {
            return Err(invalid(section.queue_max_bytes, "must be at least 1 MiB"));
        }
        Ok(RemoteConfig {
            target: GrpcTarget {
                url,
                tenant_id: file.tenant_id,
                auth,
                ca_file: file.ca_file,
                timeout: seconds(
                    section.timeout_secs,
                    file.timeout_secs,
                    DEFAULT_EXPORT_TIMEOUT,
                    1..=300,
                )?,
            },
            delivery: Delivery {
                queue,
                max_backoff: seconds(
                    section.max_backoff_secs,
                    file.max_backoff_secs,
                    DEFAULT_MAX_BACKOFF,
                    1..=60,
                )?,
                shutdown_grace: seconds(
                    section.shutdown_grace_secs,
                    file.shutdown_grace_secs,
                    DEFAULT_SHUTDOWN_GRACE,
                    0..=600,
                )?,
            },
        })
    }
}
