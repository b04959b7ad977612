//! The daemon's configuration: an optional TOML file, overridden by command-line flags, checked
//! once at start. Every error names the field (and the flag) it is about.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::export::identity::ServiceNaming;
use crate::export::pyroscope::{Auth, PyroscopeConfig};
use crate::export::queue::QueueBound;
use crate::export::stream::GrpcListen;
use crate::output::retention::Retention;
use crate::output::LocalOutput;

pub const DEFAULT_FREQUENCY_HZ: u64 = 19;
pub const MAX_FREQUENCY_HZ: u64 = 1000;
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_OUTPUT_DIR: &str = "profiles";
pub const DEFAULT_MAX_STACKS_PER_INTERVAL: usize = 200_000;
pub const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:4980";
pub const DEFAULT_EXPORT_TIMEOUT: Duration = Duration::from_secs(10);
pub const DEFAULT_QUEUE_MAX_PROFILES: usize = 4096;
pub const DEFAULT_QUEUE_MAX_BYTES: usize = 64 << 20;
pub const DEFAULT_MAX_BACKOFF: Duration = Duration::from_secs(5);
pub const DEFAULT_SHUTDOWN_GRACE: Duration = Duration::from_secs(5);

/// The configuration file, as written by the user. All fields are optional.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    /// Samples per second per CPU.
    pub frequency: Option<u64>,
    /// Seconds between two profiles of a process.
    pub interval_secs: Option<u64>,
    /// Stop after this many seconds (default: run until signalled).
    pub duration_secs: Option<u64>,
    /// Where profiles are written.
    pub output_dir: Option<PathBuf>,
    /// Only these processes (host pids); empty or absent means every process.
    pub pids: Option<Vec<u32>>,
    /// Bound on distinct stacks kept per interval (memory bound); samples past it are counted.
    pub max_stacks_per_interval: Option<usize>,
    /// Bound on JVMs whose Java frames are unwound; JVMs past it are counted and logged.
    pub max_jvms: Option<u32>,
    /// Memory for caches the daemon can rebuild (parsed binaries and their symbols), in MiB;
    /// past it the least recently used are evicted (default 96).
    pub cache_budget_mib: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. "127.0.0.1:9464"; default: off).
    pub metrics_listen: Option<String>,
    /// Write an SVG flame graph beside each pprof file (default true).
    pub flame_graphs: Option<bool>,
    /// Delete local profiles older than this (default 86400: one day; 0 keeps them forever).
    pub retention_max_age_secs: Option<u64>,
    /// Delete the oldest local profiles past this many bytes (default 1 GiB; 0: no limit).
    pub retention_max_bytes: Option<u64>,
    /// Suffix frame names with their kind, as async-profiler does: `_[j]` JIT-compiled, `_[1]`
    /// C1, `_[i]` inlined, `_[0]` interpreted, `_[k]` kernel. Default true.
    pub annotate_frames: Option<bool>,
    /// Serve the live profile stream (gRPC) here, e.g. "127.0.0.1:4980"; "off" (the default)
    /// disables it.
    pub grpc_listen: Option<String>,
    /// Every process's `service_name` (a host running a single application).
    pub service_name: Option<String>,
    /// Program name (JVM main class, jar or module; else executable name) -> `service_name`.
    pub service_names: Option<BTreeMap<String, String>>,
    /// Extra labels on every exported profile (Pyroscope and the live stream).
    pub labels: Option<BTreeMap<String, String>>,
    /// Export to Grafana Pyroscope.
    pub pyroscope: Option<PyroscopeFile>,
    /// Load the JVMTI sidecar agent into JVMs: "auto" or "never" (default).
    pub attach: Option<String>,
    /// With `attach = "auto"`: only JVMs whose command line contains one of these.
    pub attach_allow: Option<Vec<String>>,
    /// Never JVMs whose command line contains one of these (wins over `attach_allow`).
    pub attach_deny: Option<Vec<String>>,
    /// The agent library (default: libprofiler_jvmti.so beside the daemon executable).
    pub agent_path: Option<PathBuf>,
    /// Label processes of Kubernetes pods with pod metadata from the API server (default: on
    /// when running in a cluster, i.e. `KUBERNETES_SERVICE_HOST` is set).
    pub kubernetes: Option<bool>,
    /// This node's name, whose pods are watched (default: `$NODE_NAME`, else the host name).
    pub node_name: Option<String>,
    /// Off-CPU profiles too: where threads wait and for how long (default false).
    pub off_cpu: Option<bool>,
    /// Off-CPU: a thread's waits are sampled about once per this many microseconds of its
    /// time (default 5000): every wait after a run-and-wait cycle at least this long, shorter
    /// ones in proportion. Lower: more precise, more costly on threads that switch often.
    pub off_cpu_period_us: Option<u64>,
    /// Off-CPU: leave out waits shorter than this many microseconds (default 0: none). A
    /// filter: the time of the waits it drops is not in the profile.
    pub off_cpu_min_wait_us: Option<u64>,
}

/// The `[pyroscope]` table.
#[derive(Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct PyroscopeFile {
    /// `http://host:4040` (plaintext) or `https://...` (TLS).
    pub url: Option<String>,
    /// Sent as the `X-Scope-OrgID` header (multi-tenant Pyroscope).
    pub tenant_id: Option<String>,
    /// Basic auth (Grafana Cloud: the stack's user id and an access token).
    pub username: Option<String>,
    pub password: Option<String>,
    pub password_file: Option<PathBuf>,
    pub bearer_token: Option<String>,
    pub bearer_token_file: Option<PathBuf>,
    /// Extra CA certificates (PEM) trusted besides the system's.
    pub ca_file: Option<PathBuf>,
    /// Bound on each push in seconds (default 10).
    pub timeout_secs: Option<u64>,
    /// Profiles kept while Pyroscope is unreachable (default 4096); the oldest go first.
    pub queue_max_profiles: Option<usize>,
    /// Bytes of gzipped profiles kept while unreachable (default 64 MiB).
    pub queue_max_bytes: Option<usize>,
    /// Longest wait between retries in seconds (default 5).
    pub max_backoff_secs: Option<u64>,
    /// How long queued profiles are still tried at shutdown in seconds (default 5).
    pub shutdown_grace_secs: Option<u64>,
    /// Add a string `thread_name` label to every sample: one series per thread name (default
    /// false: the thread is the root frame of each stack, `[name tid=N]`, and no sample label
    /// splits series).
    pub per_thread_series: Option<bool>,
}

/// Flags that override the file.
#[derive(Debug, Default)]
pub struct Overrides {
    pub frequency: Option<u64>,
    pub interval_secs: Option<u64>,
    pub duration_secs: Option<u64>,
    pub output_dir: Option<PathBuf>,
    pub pids: Vec<u32>,
    pub metrics_listen: Option<String>,
    pub pyroscope_url: Option<String>,
    pub grpc_listen: Option<String>,
    pub attach: Option<String>,
    pub off_cpu: bool,
}

/// The checked configuration the daemon runs with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    pub frequency_hz: u64,
    pub interval: Duration,
    pub duration: Option<Duration>,
    pub output_dir: PathBuf,
    pub pids: Vec<u32>,
    pub max_stacks_per_interval: usize,
    pub max_jvms: u32,
    /// Bytes for the symbolization caches.
    pub cache_budget_bytes: u64,
    pub annotate_frames: bool,
    pub local_output: LocalOutput,
    pub metrics_listen: Option<SocketAddr>,
    pub grpc_listen: Option<GrpcListen>,
    pub naming: ServiceNaming,
    pub labels: BTreeMap<String, String>,
    pub pyroscope: Option<PyroscopeConfig>,
    pub attach: crate::sidecar::AttachPolicy,
    /// The node whose pods label processes, when Kubernetes metadata is on.
    pub kubernetes_node: Option<String>,
    /// Off-CPU profiling, when on.
    pub off_cpu: Option<OffCpuConfig>,
}

pub const DEFAULT_OFF_CPU_PERIOD: Duration = Duration::from_millis(5);

/// `off_cpu = true` and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuConfig {
    pub period: Duration,
    pub min_wait: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("config file {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("invalid `{field}`{}: {reason}", flag.map(|f| format!(" (flag --{f})")).unwrap_or_default())]
    Invalid {
        field: &'static str,
        /// The flag that sets it too, if any.
        flag: Option<&'static str>,
        reason: String,
    },
}

impl FileConfig {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parses TOML; the error message names the offending key and shows its line.
    pub fn parse(text: &str) -> Result<Self, String> {
        toml::from_str(text).map_err(|err| err.to_string())
    }
}

impl Config {
    pub fn resolve(file: FileConfig, flags: Overrides) -> Result<Self, ConfigError> {
        let frequency_hz = flags
            .frequency
            .or(file.frequency)
            .unwrap_or(DEFAULT_FREQUENCY_HZ);
        if !(1..=MAX_FREQUENCY_HZ).contains(&frequency_hz) {
            return Err(ConfigError::Invalid {
                field: "frequency",
                flag: Some("frequency"),
                reason: format!("{frequency_hz} Hz is outside 1..={MAX_FREQUENCY_HZ} Hz"),
            });
        }
        let interval_secs = flags
            .interval_secs
            .or(file.interval_secs)
            .unwrap_or(DEFAULT_INTERVAL.as_secs());
        if !(1..=3600).contains(&interval_secs) {
            return Err(ConfigError::Invalid {
                field: "interval_secs",
                flag: Some("interval"),
                reason: format!("{interval_secs} s is outside 1..=3600 s"),
            });
        }
        let duration_secs = flags.duration_secs.or(file.duration_secs);
        if duration_secs == Some(0) {
            return Err(ConfigError::Invalid {
                field: "duration_secs",
                flag: Some("duration"),
                reason: "must be at least 1 s (leave it out to run until signalled)".into(),
            });
        }
        let output_dir = flags
            .output_dir
            .or(file.output_dir)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_OUTPUT_DIR));
        if output_dir.as_os_str().is_empty() {
            return Err(ConfigError::Invalid {
                field: "output_dir",
                flag: Some("output"),
                reason: "must not be empty".into(),
            });
        }
        let pids = if flags.pids.is_empty() {
            file.pids.unwrap_or_default()
        } else {
            flags.pids
        };
        if let Some(&bad) = pids.iter().find(|&&pid| pid == 0) {
            return Err(ConfigError::Invalid {
                field: "pids",
                flag: Some("pid"),
                reason: format!("{bad} is not a process id"),
            });
        }
        if pids.len() > profiler_common::MAX_TARGET_PIDS as usize {
            return Err(ConfigError::Invalid {
                field: "pids",
                flag: Some("pid"),
                reason: format!("at most {} pids", profiler_common::MAX_TARGET_PIDS),
            });
        }
        let max_stacks_per_interval = file
            .max_stacks_per_interval
            .unwrap_or(DEFAULT_MAX_STACKS_PER_INTERVAL);
        if max_stacks_per_interval == 0 {
            return Err(ConfigError::Invalid {
                field: "max_stacks_per_interval",
                flag: None,
                reason: "must be at least 1".into(),
            });
        }
        let max_jvms = file.max_jvms.unwrap_or(profiler_common::DEFAULT_MAX_JVMS);
        if !(1..=65_536).contains(&max_jvms) {
            return Err(ConfigError::Invalid {
                field: "max_jvms",
                flag: None,
                reason: format!("{max_jvms} is outside 1..=65536"),
            });
        }
        let off_cpu = if flags.off_cpu || file.off_cpu.unwrap_or(false) {
            let period_us = file
                .off_cpu_period_us
                .unwrap_or(DEFAULT_OFF_CPU_PERIOD.as_micros() as u64);
            if !(1..=10_000_000).contains(&period_us) {
                return Err(ConfigError::Invalid {
                    field: "off_cpu_period_us",
                    flag: None,
                    reason: format!("{period_us} us is outside 1..=10000000 us"),
                });
            }
            let min_wait_us = file.off_cpu_min_wait_us.unwrap_or(0);
            if min_wait_us > 3_600_000_000 {
                return Err(ConfigError::Invalid {
                    field: "off_cpu_min_wait_us",
                    flag: None,
                    reason: format!("{min_wait_us} us is over an hour"),
                });
            }
            Some(OffCpuConfig {
                period: Duration::from_micros(period_us),
                min_wait: Duration::from_micros(min_wait_us),
            })
        } else {
            for (field, set) in [
                ("off_cpu_period_us", file.off_cpu_period_us.is_some()),
                ("off_cpu_min_wait_us", file.off_cpu_min_wait_us.is_some()),
            ] {
                if set {
                    return Err(ConfigError::Invalid {
                        field,
                        flag: None,
                        reason: "set, but off-CPU profiling is off (`off_cpu = true` or --off-cpu turns it on)".into(),
                    });
                }
            }
            None
        };
        let cache_budget_mib = file
            .cache_budget_mib
            .unwrap_or(crate::symbolize::cache_budget::DEFAULT_LIMIT_BYTES >> 20);
        if !(1..=1 << 20).contains(&cache_budget_mib) {
            return Err(ConfigError::Invalid {
                field: "cache_budget_mib",
                flag: None,
                reason: format!("{cache_budget_mib} is outside 1..=1048576"),
            });
        }
        let mut local_output = LocalOutput {
            // Set below, once it is known whether profiles go to a backend.
            flame_graphs: false,
            retention: Retention {
                max_age: Some(
                    file.retention_max_age_secs
                        .unwrap_or(DEFAULT_RETENTION_AGE.as_secs()),
                )
                .filter(|secs| *secs > 0)
                .map(Duration::from_secs),
                max_bytes: Some(file.retention_max_bytes.unwrap_or(DEFAULT_RETENTION_BYTES))
                    .filter(|b| *b > 0),
            },
        };
        let metrics_listen = match flags.metrics_listen.or(file.metrics_listen) {
            None => None,
            Some(text) => Some(text.parse().map_err(|err| ConfigError::Invalid {
                field: "metrics_listen",
                flag: Some("metrics-listen"),
                reason: format!("{text:?} is not an address:port ({err})"),
            })?),
        };
        let explicit_grpc = flags.grpc_listen.or(file.grpc_listen);
        // Off unless asked for: the stream is not authenticated, and profiles name every
        // process's functions and threads (SECURITY.md).
        let grpc_listen = match explicit_grpc.as_deref() {
            None | Some("off") | Some("") => None,
            Some(text) => Some(GrpcListen {
                address: text.parse().map_err(|err| ConfigError::Invalid {
                    field: "grpc_listen",
                    flag: Some("grpc-listen"),
                    reason: format!("{text:?} is not an address:port or \"off\" ({err})"),
                })?,
                explicit: explicit_grpc.is_some(),
            }),
        };
        let naming = ServiceNaming {
            override_name: check_service_name("service_name", file.service_name)?,
            by_program: file.service_names.unwrap_or_default(),
        };
        if naming
            .by_program
            .values()
            .any(|name| name.trim().is_empty())
        {
            return Err(invalid("service_names", "service names must not be empty"));
        }
        let labels = file.labels.unwrap_or_default();
        check_labels(&labels)?;
        let flame_graphs = file.flame_graphs;
        let pyroscope = match (flags.pyroscope_url, file.pyroscope) {
            (None, None) => None,
            (url, table) => Some(resolve_pyroscope(url, table.unwrap_or_default())?),
        };
        // An SVG per process per interval costs CPU; with a backend, people look there.
        local_output.flame_graphs = flame_graphs.unwrap_or(pyroscope.is_none());
        let attach = crate::sidecar::AttachPolicy {
            mode: match (flags.attach, file.attach) {
                (Some(flag), _) => flag.parse().map_err(|reason| ConfigError::Invalid {
                    field: "attach",
                    flag: Some("attach"),
                    reason,
                })?,
                (None, Some(value)) => value.parse().map_err(|reason| invalid("attach", reason))?,
                (None, None) => crate::sidecar::AttachMode::Never,
            },
            allow: file.attach_allow.unwrap_or_default(),
            deny: file.attach_deny.unwrap_or_default(),
            agent: file.agent_path,
        };
        if attach
            .allow
            .iter()
            .chain(&attach.deny)
            .any(String::is_empty)
        {
            return Err(invalid("attach_allow", "empty patterns match everything"));
        }
        let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
        let kubernetes_node = if file.kubernetes.unwrap_or(in_cluster) {
            let node = file
                .node_name
                .or_else(|| std::env::var("NODE_NAME").ok())
                .or_else(host_name)
                .unwrap_or_default();
            if node.trim().is_empty() {
                return Err(invalid(
                    "node_name",
                    "unknown: set it, or NODE_NAME (the downward API's spec.nodeName)",
                ));
            }
            Some(node)
        } else {
            None
        };
        Ok(Self {
            kubernetes_node,
            attach,
            grpc_listen,
            naming,
            labels,
            pyroscope,
            metrics_listen,
            local_output,
            annotate_frames: file.annotate_frames.unwrap_or(true),
            off_cpu,
            max_jvms,
            cache_budget_bytes: cache_budget_mib << 20,
            frequency_hz,
            interval: Duration::from_secs(interval_secs),
            duration: duration_secs.map(Duration::from_secs),
            output_dir,
            pids,
            max_stacks_per_interval,
        })
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|name| name.trim().to_string())
}

fn invalid(field: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        flag: None,
        reason: reason.into(),
    }
}

fn check_service_name(
    field: &'static str,
    name: Option<String>,
) -> Result<Option<String>, ConfigError> {
    match name {
        Some(name) if name.trim().is_empty() => Err(invalid(field, "must not be empty")),
        name => Ok(name),
    }
}

/// Prometheus-style label names; names starting with `__` and `service_name` are ours.
fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (name, value) in labels {
        let mut chars = name.chars();
        let well_formed = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !well_formed {
            return Err(invalid(
                "labels",
                format!("{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ));
        }
        if name.starts_with("__") || name == "service_name" {
            return Err(invalid(
                "labels",
                format!("{name:?} is reserved (set `service_name` or `service_names` instead)"),
            ));
        }
        if value.is_empty() {
            return Err(invalid("labels", format!("{name:?} has an empty value")));
        }
    }
    Ok(())
}

/// Reads a secret from a file (a mounted Kubernetes secret, typically), without its final
/// newline.
fn read_secret(field: &'static str, path: &Path) -> Result<String, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|err| invalid(field, format!("cannot read {}: {err}", path.display())))?;
    Ok(text.trim_end_matches(['\n', '\r']).to_string())
}

fn resolve_pyroscope(
    flag_url: Option<String>,
    file: PyroscopeFile,
) -> Result<PyroscopeConfig, ConfigError> {
    let url = flag_url.or(file.url).ok_or_else(|| ConfigError::Invalid {
        field: "pyroscope.url",
        flag: Some("pyroscope"),
        reason: "missing (the [pyroscope] table needs a url)".into(),
    })?;
    let uri: tonic::transport::Uri = url.parse().map_err(|err| ConfigError::Invalid {
        field: "pyroscope.url",
        flag: Some("pyroscope"),
        reason: format!("{url:?} is not a URL ({err})"),
    })?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        _ => {
            return Err(ConfigError::Invalid {
                field: "pyroscope.url",
                flag: Some("pyroscope"),
                reason: format!("{url:?} must start with http:// or https://"),
            })
        }
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(ConfigError::Invalid {
            field: "pyroscope.url",
            flag: Some("pyroscope"),
            reason: format!("{url:?} has no host"),
        });
    }
    let password = match (file.password, file.password_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "pyroscope.password_file",
                "give password or password_file, not both",
            ))
        }
        (Some(password), None) => Some(password),
        (None, Some(path)) => Some(read_secret("pyroscope.password_file", &path)?),
        (None, None) => None,
    };
    let token = match (file.bearer_token, file.bearer_token_file) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "pyroscope.bearer_token_file",
                "give bearer_token or bearer_token_file, not both",
            ))
        }
        (Some(token), None) => Some(token),
        (None, Some(path)) => Some(read_secret("pyroscope.bearer_token_file", &path)?),
        (None, None) => None,
    };
    let auth = match (file.username, password, token) {
        (None, None, None) => None,
        (Some(username), Some(password), None) => Some(Auth::Basic { username, password }),
        (None, None, Some(token)) => Some(Auth::Bearer(token)),
        (Some(_), None, None) => {
            return Err(invalid(
                "pyroscope.password",
                "username needs a password (or password_file)",
            ))
        }
        (None, Some(_), None) => {
            return Err(invalid("pyroscope.username", "a password needs a username"))
        }
        (_, _, Some(_)) => {
            return Err(invalid(
                "pyroscope.bearer_token",
                "use basic auth (username, password) or a bearer token, not both",
            ))
        }
    };
    if file.ca_file.is_some() && !https {
        return Err(invalid("pyroscope.ca_file", "needs an https:// url"));
    }
    if let Some(path) = &file.ca_file {
        std::fs::metadata(path).map_err(|err| {
            invalid(
                "pyroscope.ca_file",
                format!("cannot read {}: {err}", path.display()),
            )
        })?;
    }
    if let Some(tenant) = &file.tenant_id {
        if tenant.is_empty() || !tenant.chars().all(|c| c.is_ascii_graphic()) {
            return Err(invalid(
                "pyroscope.tenant_id",
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
        return Err(invalid(
            "pyroscope.queue_max_profiles",
            "must be at least 1",
        ));
    }
    if queue.max_bytes < 1 << 20 {
        return Err(invalid(
            "pyroscope.queue_max_bytes",
            "must be at least 1 MiB",
        ));
    }
    Ok(PyroscopeConfig {
        url,
        tenant_id: file.tenant_id,
        auth,
        ca_file: file.ca_file,
        timeout: seconds(
            "pyroscope.timeout_secs",
            file.timeout_secs,
            DEFAULT_EXPORT_TIMEOUT,
            1..=300,
        )?,
        queue,
        max_backoff: seconds(
            "pyroscope.max_backoff_secs",
            file.max_backoff_secs,
            DEFAULT_MAX_BACKOFF,
            1..=60,
        )?,
        shutdown_grace: seconds(
            "pyroscope.shutdown_grace_secs",
            file.shutdown_grace_secs,
            DEFAULT_SHUTDOWN_GRACE,
            0..=600,
        )?,
        per_thread_series: file.per_thread_series.unwrap_or(false),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_when_nothing_is_given() {
        let config = Config::resolve(FileConfig::default(), Overrides::default()).expect("valid");
        assert_eq!(config.frequency_hz, 19);
        assert_eq!(config.interval, Duration::from_secs(15));
        assert_eq!(config.duration, None);
        assert_eq!(config.output_dir, PathBuf::from("profiles"));
        assert!(config.pids.is_empty());
    }

    #[test]
    fn flags_override_the_file() {
        let file = FileConfig::parse(
            "frequency = 99\ninterval_secs = 5\npids = [10, 11]\noutput_dir = \"/tmp/x\"",
        )
        .expect("parses");
        let flags = Overrides {
            frequency: Some(250),
            pids: vec![12],
            ..Default::default()
        };
        let config = Config::resolve(file, flags).expect("valid");
        assert_eq!(config.frequency_hz, 250);
        assert_eq!(config.interval, Duration::from_secs(5));
        assert_eq!(config.pids, vec![12]);
        assert_eq!(config.output_dir, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn unknown_keys_are_named() {
        let err = FileConfig::parse("frequncy = 99").expect_err("typo");
        assert!(err.contains("frequncy"), "{err}");
    }

    #[test]
    fn wrong_types_are_named() {
        let err = FileConfig::parse("interval_secs = \"fast\"").expect_err("wrong type");
        assert!(err.contains("interval_secs"), "{err}");
    }

    #[test]
    fn out_of_range_values_name_field_and_flag() {
        let flags = Overrides {
            frequency: Some(5000),
            ..Default::default()
        };
        let err = Config::resolve(FileConfig::default(), flags)
            .expect_err("too fast")
            .to_string();
        assert!(
            err.contains("`frequency`") && err.contains("--frequency"),
            "{err}"
        );

        let file = FileConfig {
            interval_secs: Some(0),
            ..Default::default()
        };
        let err = Config::resolve(file, Overrides::default())
            .expect_err("zero")
            .to_string();
        assert!(err.contains("interval_secs"), "{err}");

        // A key with no flag is named alone.
        let file = FileConfig {
            max_jvms: Some(0),
            ..Default::default()
        };
        let err = Config::resolve(file, Overrides::default())
            .expect_err("no JVMs")
            .to_string();
        assert!(err.starts_with("invalid `max_jvms`:"), "{err}");

        let flags = Overrides {
            pids: vec![0],
            ..Default::default()
        };
        let err = Config::resolve(FileConfig::default(), flags)
            .expect_err("pid 0")
            .to_string();
        assert!(err.contains("--pid"), "{err}");
    }

    fn resolve_text(text: &str) -> Result<Config, String> {
        let file = FileConfig::parse(text)?;
        Config::resolve(file, Overrides::default()).map_err(|err| err.to_string())
    }

    #[test]
    fn flame_graphs_are_drawn_by_default_only_without_a_backend() {
        let local = resolve_text("").expect("valid");
        assert!(local.local_output.flame_graphs);
        let exported =
            resolve_text("[pyroscope]\nurl = \"http://127.0.0.1:4040\"\n").expect("valid");
        assert!(!exported.local_output.flame_graphs);
        let asked =
            resolve_text("flame_graphs = true\n[pyroscope]\nurl = \"http://127.0.0.1:4040\"\n")
                .expect("valid");
        assert!(asked.local_output.flame_graphs);
    }

    #[test]
    fn pyroscope_table_is_checked_field_by_field() {
        let config = resolve_text(
            "[pyroscope]\nurl = \"https://profiles.example.com\"\ntenant_id = \"t1\"\nusername = \"42\"\npassword = \"pw\"\n",
        )
        .expect("valid");
        let pyroscope = config.pyroscope.expect("enabled");
        assert_eq!(
            pyroscope.auth,
            Some(Auth::Basic {
                username: "42".into(),
                password: "pw".into()
            })
        );
        assert_eq!(pyroscope.max_backoff, DEFAULT_MAX_BACKOFF);
        for (text, field) in [
            ("[pyroscope]\ntenant_id = \"x\"", "pyroscope.url"),
            ("[pyroscope]\nurl = \"ftp://x\"", "pyroscope.url"),
            ("[pyroscope]\nurl = \"http://x\"\nusername = \"u\"", "pyroscope.password"),
            (
                "[pyroscope]\nurl = \"http://x\"\nbearer_token = \"t\"\nusername = \"u\"\npassword = \"p\"",
                "pyroscope.bearer_token",
            ),
            ("[pyroscope]\nurl = \"http://x\"\nca_file = \"/etc/hostname\"", "pyroscope.ca_file"),
            ("[pyroscope]\nurl = \"http://x\"\nmax_backoff_secs = 600", "pyroscope.max_backoff_secs"),
            ("[pyroscope]\nurl = \"http://x\"\npassword_file = \"/nonexistent\"\nusername = \"u\"", "pyroscope.password_file"),
            ("[pyroscope]\nurl = \"http://x\"\ntenant_id = \"a b\"", "pyroscope.tenant_id"),
        ] {
            let err = resolve_text(text).expect_err(text);
            assert!(err.contains(&format!("`{field}`")), "{text}: {err}");
        }
        let err = resolve_text("[pyroscope]\nurl = \"http://x\"\ntoken = \"t\"")
            .expect_err("unknown key");
        assert!(err.contains("token"), "{err}");
    }

    #[test]
    fn per_thread_series_is_off_unless_asked_for() {
        let url = "[pyroscope]\nurl = \"http://x\"\n";
        let config = resolve_text(url).expect("valid");
        assert!(!config.pyroscope.expect("enabled").per_thread_series);
        let config = resolve_text(&format!("{url}per_thread_series = true")).expect("valid");
        assert!(config.pyroscope.expect("enabled").per_thread_series);
        let err = resolve_text(&format!("{url}per_thread_series = \"yes\"")).expect_err("string");
        assert!(err.contains("per_thread_series"), "{err}");
    }

    #[test]
    fn the_pyroscope_flag_alone_enables_export() {
        let flags = Overrides {
            pyroscope_url: Some("http://127.0.0.1:4040".into()),
            ..Default::default()
        };
        let config = Config::resolve(FileConfig::default(), flags).expect("valid");
        assert_eq!(
            config.pyroscope.expect("enabled").url,
            "http://127.0.0.1:4040"
        );
        assert!(Config::resolve(FileConfig::default(), Overrides::default())
            .expect("valid")
            .pyroscope
            .is_none());
    }

    #[test]
    fn grpc_listen_is_off_by_default_and_opens_where_asked() {
        assert!(resolve_text("").expect("valid").grpc_listen.is_none());
        let listen = resolve_text("grpc_listen = \"127.0.0.1:4980\"")
            .expect("valid")
            .grpc_listen
            .expect("on when asked");
        assert!(listen.address.ip().is_loopback() && listen.explicit);
        assert!(resolve_text("grpc_listen = \"off\"")
            .expect("valid")
            .grpc_listen
            .is_none());
        let err = resolve_text("grpc_listen = \"localhost\"").expect_err("no port");
        assert!(
            err.contains("grpc_listen") && err.contains("--grpc-listen"),
            "{err}"
        );
    }

    #[test]
    fn kubernetes_metadata_needs_a_node_name() {
        let config = resolve_text("kubernetes = true\nnode_name = \"node-a\"").expect("valid");
        assert_eq!(config.kubernetes_node.as_deref(), Some("node-a"));
        let config = resolve_text("kubernetes = false").expect("valid");
        assert_eq!(config.kubernetes_node, None);
        let err = resolve_text("kubernetes = true\nnode_name = \" \"").expect_err("blank");
        assert!(err.contains("`node_name`"), "{err}");
    }

    #[test]
    fn labels_and_service_names_are_checked() {
        let config = resolve_text(
            "service_name = \"shop\"\n[labels]\nenv = \"prod\"\n[service_names]\n\"com.x.Main\" = \"orders\"",
        )
        .expect("valid");
        assert_eq!(config.naming.override_name.as_deref(), Some("shop"));
        assert_eq!(config.labels["env"], "prod");
        for text in [
            "[labels]\n\"1x\" = \"a\"",
            "[labels]\n__name__ = \"a\"",
            "[labels]\nservice_name = \"a\"",
        ] {
            let err = resolve_text(text).expect_err(text);
            assert!(err.contains("`labels`"), "{err}");
        }
        let err = resolve_text("service_name = \" \"").expect_err("blank");
        assert!(err.contains("`service_name`"), "{err}");
    }
}
