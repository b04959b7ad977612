//! The daemon's configuration: an optional TOML file, overridden by command-line flags, checked
//! once at start. Every error names the field (and the flag) it is about.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::output::retention::Retention;
use crate::output::LocalOutput;

pub const DEFAULT_FREQUENCY_HZ: u64 = 19;
pub const MAX_FREQUENCY_HZ: u64 = 1000;
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_OUTPUT_DIR: &str = "profiles";
pub const DEFAULT_MAX_STACKS_PER_INTERVAL: usize = 200_000;
pub const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;

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
    pub annotate_frames: bool,
    pub local_output: LocalOutput,
    pub metrics_listen: Option<std::net::SocketAddr>,
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
        let local_output = LocalOutput {
            flame_graphs: file.flame_graphs.unwrap_or(true),
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
        Ok(Self {
            metrics_listen,
            local_output,
            annotate_frames: file.annotate_frames.unwrap_or(true),
            max_jvms,
            frequency_hz,
            interval: Duration::from_secs(interval_secs),
            duration: duration_secs.map(Duration::from_secs),
            output_dir,
            pids,
            max_stacks_per_interval,
        })
    }
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
}
