//! The daemon's configuration: an optional TOML file, overridden by command-line flags, checked
//! once at start. Every error names the field (and the flag) it is about.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::alloc::AllocConfig;
use crate::export::remote_config::{RemoteConfig, RemoteFile, OTLP, PYROSCOPE};
use crate::export::stream::GrpcListen;
use crate::identity::ServiceNaming;
use crate::lock::LockConfig;
use crate::off_cpu::OffCpuConfig;
use crate::output::LocalOutput;
use crate::thread_roots::ThreadRoots;
use crate::virtual_thread_roots::VirtualThreadRoots;

pub use crate::config_error::{invalid, ConfigError};
pub use crate::kubernetes::Environment;

pub const DEFAULT_FREQUENCY_HZ: u64 = 19;
pub const MAX_FREQUENCY_HZ: u64 = 1000;
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(15);
pub const DEFAULT_OUTPUT_DIR: &str = "profiles";
pub const DEFAULT_MAX_STACKS_PER_INTERVAL: usize = 200_000;
pub const DEFAULT_GRPC_LISTEN: &str = "127.0.0.1:4980";

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
    /// Permission bits of the profile files, octal (default "0600": the daemon's user only);
    /// the output directory, when the daemon creates it, gets the same plus search where read
    /// is granted ("0640" -> 0750).
    pub output_mode: Option<String>,
    /// Only these processes (host pids); empty or absent means every process.
    pub pids: Option<Vec<u32>>,
    /// Bound on distinct stacks kept per interval (memory bound); samples past it are counted.
    pub max_stacks_per_interval: Option<usize>,
    /// Memory for one interval's distinct stacks, all profile kinds together, in MiB (default
    /// 32); one user's processes may hold half, one process a quarter (`stack_memory.rs`).
    pub stack_memory_mib: Option<u64>,
    /// Bound on JVMs whose Java frames are unwound; JVMs past it are counted and logged.
    pub max_jvms: Option<u32>,
    /// Memory for caches the daemon can rebuild (parsed binaries and their symbols), in MiB;
    /// past it the least recently used are evicted (default 96).
    pub cache_budget_mib: Option<u64>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. "127.0.0.1:9464"; default: off).
    pub metrics_listen: Option<String>,
    /// Write an SVG flame graph beside each pprof file (default false: `view` draws them).
    pub flame_graphs: Option<bool>,
    /// Delete local profiles older than this (default 86400: one day; 0 keeps them forever).
    pub retention_max_age_secs: Option<u64>,
    /// Delete the oldest local profiles past this many bytes (default 1 GiB; 0: no limit).
    pub retention_max_bytes: Option<u64>,
    /// How flame graphs (Pyroscope's and the local SVGs) show threads: "merged" (default: no
    /// thread frame), "pool" (each stack rooted at its thread pool, `[http-nio-8080-exec-*]`)
    /// or "thread" (rooted at its thread, `[http-nio-8080-exec-12 tid=4242]`). Local pprof
    /// files and the live stream label every sample with its thread whatever this says.
    pub threads: Option<String>,
    /// What a virtual thread's stack is shown on: "logical" (default: its own frames alone,
    /// rooted at `java.lang.VirtualThread.run`, as jstack and JFR show it) or "carrier" (above
    /// the frames of the carrier thread that ran it, under a `[carrier <name>]` frame).
    pub virtual_threads: Option<String>,
    /// Local pprof files and the live stream: label each sample taken for a virtual thread
    /// with its id (`virtual_thread_id`, its `Thread.threadId()`). Default false: with a
    /// virtual thread per request or task, every sample and wait of each is a stack of its
    /// own, which fills the interval's stack memory (docs/java.md, "Virtual threads").
    pub virtual_thread_ids: Option<bool>,
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
    pub pyroscope: Option<RemoteFile>,
    /// Export OTLP profiles (an OpenTelemetry Collector, or a backend that takes them).
    pub otlp: Option<RemoteFile>,
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
    /// Off-CPU and lock profiles: the waits of unmounted virtual threads too (default true),
    /// from hooks on their unmounts and mounts in libjvm, which cost each unmount a few
    /// microseconds of its carrier's time (docs/java.md, "Where virtual threads wait").
    pub virtual_thread_waits: Option<bool>,
    /// Java allocation profiles too: where Java threads allocate and how much (default false).
    pub alloc: Option<bool>,
    /// Allocation: about one sample per this many bytes allocated (default 524288, 512 KiB,
    /// as async-profiler's and Alloy's). Lower: more precise for small sites, more costly.
    pub alloc_interval_bytes: Option<u64>,
    /// Java lock profiles too: where Java threads wait for monitors and parks (default false;
    /// it samples waits as off-CPU profiling does).
    pub lock: Option<bool>,
    /// Lock profiles: leave out waits shorter than this many milliseconds (default 10, as
    /// Alloy's; 0 keeps every wait).
    pub lock_threshold_ms: Option<u64>,
}

/// Flags that override the file.
#[derive(Debug, Default)]
pub struct Overrides {
    pub frequency: Option<u64>,
    pub interval_secs: Option<u64>,
    pub duration_secs: Option<u64>,
    pub output_dir: Option<PathBuf>,
    pub output_mode: Option<String>,
    pub pids: Vec<u32>,
    pub metrics_listen: Option<String>,
    pub pyroscope_url: Option<String>,
    pub otlp_url: Option<String>,
    pub grpc_listen: Option<String>,
    pub attach: Option<String>,
    pub off_cpu: bool,
    /// `--alloc` (`Some(None)`) or `--alloc=BYTES`.
    pub alloc: Option<Option<u64>>,
    /// `--lock` (`Some(None)`) or `--lock=DURATION`.
    pub lock: Option<Option<Duration>>,
    pub threads: Option<String>,
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
    /// Bytes for one interval's distinct stacks.
    pub stack_memory_bytes: usize,
    pub max_jvms: u32,
    /// Bytes for the symbolization caches.
    pub cache_budget_bytes: u64,
    pub annotate_frames: bool,
    /// How Pyroscope's profiles and the local flame graphs show threads.
    pub threads: ThreadRoots,
    /// What virtual threads' stacks are shown on.
    pub virtual_threads: VirtualThreadRoots,
    /// Samples of virtual threads keep their virtual thread's id (local outputs).
    pub virtual_thread_ids: bool,
    pub local_output: LocalOutput,
    pub metrics_listen: Option<SocketAddr>,
    pub grpc_listen: Option<GrpcListen>,
    pub naming: ServiceNaming,
    pub labels: BTreeMap<String, String>,
    pub pyroscope: Option<RemoteConfig>,
    pub otlp: Option<RemoteConfig>,
    pub attach: crate::sidecar::AttachPolicy,
    /// The node whose pods label processes, when Kubernetes metadata is on.
    pub kubernetes_node: Option<String>,
    /// Off-CPU profiling, when on.
    pub off_cpu: Option<OffCpuConfig>,
    /// Java allocation profiling, when on.
    pub alloc: Option<AllocConfig>,
    /// Java lock profiling, when on.
    pub lock: Option<LockConfig>,
    /// With off-CPU or lock profiling: virtual threads' waits hooked too.
    pub virtual_thread_waits: bool,
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
    /// Checks `file` with `flags` over it; `environment` gives the defaults that depend on the
    /// host (see [`Environment`]).
    pub fn resolve(
        file: FileConfig,
        flags: Overrides,
        environment: &Environment,
    ) -> Result<Self, ConfigError> {
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
        let stack_memory_mib = file
            .stack_memory_mib
            .unwrap_or((crate::stack_memory::DEFAULT_STACK_MEMORY_BYTES >> 20) as u64);
        if !(1..=65_536).contains(&stack_memory_mib) {
            return Err(ConfigError::Invalid {
                field: "stack_memory_mib",
                flag: None,
                reason: format!("{stack_memory_mib} is outside 1..=65536"),
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
        let off_cpu = OffCpuConfig::resolve(
            flags.off_cpu || file.off_cpu.unwrap_or(false),
            file.off_cpu_period_us,
            file.off_cpu_min_wait_us,
        )?;
        let alloc = AllocConfig::resolve(flags.alloc, file.alloc, file.alloc_interval_bytes)?;
        let lock = LockConfig::resolve(flags.lock, file.lock, file.lock_threshold_ms)?;
        if file.virtual_thread_waits.is_some() && off_cpu.is_none() && lock.is_none() {
            return Err(ConfigError::Invalid {
                field: "virtual_thread_waits",
                flag: None,
                reason: "set, but neither off-CPU nor lock profiling is on".to_owned(),
            });
        }
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
        let metrics_listen = match flags.metrics_listen.or(file.metrics_listen) {
            None => None,
            Some(text) => Some(text.parse().map_err(|err| ConfigError::Invalid {
                field: "metrics_listen",
                flag: Some("metrics-listen"),
                reason: format!("{text:?} is not an address:port ({err})"),
            })?),
        };
        let grpc_listen = GrpcListen::resolve(flags.grpc_listen.or(file.grpc_listen))?;
        let naming = ServiceNaming::resolve(file.service_name, file.service_names)?;
        let labels = file.labels.unwrap_or_default();
        crate::identity::check_labels(&labels)?;
        let threads = match flags.threads.or(file.threads) {
            None => ThreadRoots::default(),
            Some(text) => ThreadRoots::from_name(&text).ok_or_else(|| ConfigError::Invalid {
                field: "threads",
                flag: Some("threads"),
                reason: format!("{text:?} is not {}", ThreadRoots::VALUES),
            })?,
        };
        let virtual_threads = match file.virtual_threads {
            None => VirtualThreadRoots::default(),
            Some(text) => {
                VirtualThreadRoots::from_name(&text).ok_or_else(|| ConfigError::Invalid {
                    field: "virtual_threads",
                    flag: None,
                    reason: format!("{text:?} is not {}", VirtualThreadRoots::VALUES),
                })?
            }
        };
        let pyroscope = match (flags.pyroscope_url, file.pyroscope) {
            (None, None) => None,
            (url, table) => Some(RemoteConfig::resolve(
                &PYROSCOPE,
                url,
                table.unwrap_or_default(),
            )?),
        };
        let otlp = match (flags.otlp_url, file.otlp) {
            (None, None) => None,
            (url, table) => Some(RemoteConfig::resolve(
                &OTLP,
                url,
                table.unwrap_or_default(),
            )?),
        };
        let output_mode =
            match flags.output_mode.or(file.output_mode) {
                None => None,
                Some(text) => Some(crate::output::parse_mode(&text).map_err(|reason| {
                    ConfigError::Invalid {
                        field: "output_mode",
                        flag: Some("output-mode"),
                        reason,
                    }
                })?),
            };
        let local_output = LocalOutput::resolve(
            file.flame_graphs,
            file.retention_max_age_secs,
            file.retention_max_bytes,
            output_mode,
        );
        let attach = crate::sidecar::AttachPolicy::resolve(
            flags.attach,
            file.attach,
            file.attach_allow,
            file.attach_deny,
            file.agent_path,
        )?;
        let kubernetes_node =
            crate::kubernetes::node_to_watch(file.kubernetes, file.node_name, environment)?;
        Ok(Self {
            kubernetes_node,
            attach,
            grpc_listen,
            naming,
            labels,
            pyroscope,
            otlp,
            metrics_listen,
            local_output,
            annotate_frames: file.annotate_frames.unwrap_or(true),
            threads,
            virtual_threads,
            virtual_thread_ids: file.virtual_thread_ids.unwrap_or(false),
            off_cpu,
            alloc,
            lock,
            virtual_thread_waits: file.virtual_thread_waits.unwrap_or(true),
            max_jvms,
            cache_budget_bytes: cache_budget_mib << 20,
            frequency_hz,
            interval: Duration::from_secs(interval_secs),
            duration: duration_secs.map(Duration::from_secs),
            output_dir,
            pids,
            max_stacks_per_interval,
            stack_memory_bytes: (stack_memory_mib << 20) as usize,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::grpc::Auth;
    use crate::export::remote_config::DEFAULT_MAX_BACKOFF;

    #[test]
    fn defaults_when_nothing_is_given() {
        let config = Config::resolve(
            FileConfig::default(),
            Overrides::default(),
            &Environment::default(),
        )
        .expect("valid");
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
        let config = Config::resolve(file, flags, &Environment::default()).expect("valid");
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
        let err = Config::resolve(FileConfig::default(), flags, &Environment::default())
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
        let err = Config::resolve(file, Overrides::default(), &Environment::default())
            .expect_err("zero")
            .to_string();
        assert!(err.contains("interval_secs"), "{err}");

        // A key with no flag is named alone.
        let file = FileConfig {
            max_jvms: Some(0),
            ..Default::default()
        };
        let err = Config::resolve(file, Overrides::default(), &Environment::default())
            .expect_err("no JVMs")
            .to_string();
        assert!(err.starts_with("invalid `max_jvms`:"), "{err}");

        let flags = Overrides {
            pids: vec![0],
            ..Default::default()
        };
        let err = Config::resolve(FileConfig::default(), flags, &Environment::default())
            .expect_err("pid 0")
            .to_string();
        assert!(err.contains("--pid"), "{err}");
    }

    fn resolve_text(text: &str) -> Result<Config, String> {
        let file = FileConfig::parse(text)?;
        Config::resolve(file, Overrides::default(), &Environment::default())
            .map_err(|err| err.to_string())
    }

    #[test]
    fn flame_graphs_are_drawn_only_when_asked() {
        let local = resolve_text("").expect("valid");
        assert!(!local.local_output.flame_graphs);
        let asked = resolve_text("flame_graphs = true\n").expect("valid");
        assert!(asked.local_output.flame_graphs);
        let exported =
            resolve_text("flame_graphs = true\n[pyroscope]\nurl = \"http://127.0.0.1:4040\"\n")
                .expect("valid");
        assert!(exported.local_output.flame_graphs);
    }

    #[test]
    fn pyroscope_table_is_checked_field_by_field() {
        let config = resolve_text(
            "[pyroscope]\nurl = \"https://profiles.example.com\"\ntenant_id = \"t1\"\nusername = \"42\"\npassword = \"pw\"\n",
        )
        .expect("valid");
        let pyroscope = config.pyroscope.expect("enabled");
        assert_eq!(
            pyroscope.target.auth,
            Some(Auth::Basic {
                username: "42".into(),
                password: "pw".into()
            })
        );
        assert_eq!(pyroscope.delivery.max_backoff, DEFAULT_MAX_BACKOFF);
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
    fn threads_are_merged_unless_asked_for() {
        assert_eq!(
            resolve_text("").expect("valid").threads,
            ThreadRoots::Merged
        );
        assert_eq!(
            resolve_text("threads = \"pool\"").expect("valid").threads,
            ThreadRoots::Pool
        );
        assert_eq!(
            resolve_text("threads = \"thread\"").expect("valid").threads,
            ThreadRoots::Thread
        );
        let flags = Overrides {
            threads: Some("thread".into()),
            ..Default::default()
        };
        let file = FileConfig::parse("threads = \"pool\"").expect("parses");
        let config = Config::resolve(file, flags, &Environment::default()).expect("valid");
        assert_eq!(config.threads, ThreadRoots::Thread, "the flag wins");
        let err = resolve_text("threads = \"per-thread\"").expect_err("unknown value");
        assert!(
            err.contains("`threads`") && err.contains("--threads") && err.contains("\"pool\""),
            "{err}"
        );
        let err = resolve_text("threads = true").expect_err("not a string");
        assert!(err.contains("threads"), "{err}");
    }

    #[test]
    fn the_old_per_thread_series_key_names_its_replacement() {
        let url = "[pyroscope]\nurl = \"http://x\"\n";
        for value in ["true", "false", "\"yes\""] {
            let err = resolve_text(&format!("{url}per_thread_series = {value}"))
                .expect_err("replaced key");
            assert!(
                err.contains("`pyroscope.per_thread_series`")
                    && err.contains("`threads`")
                    && err.contains("threads = \"thread\""),
                "{err}"
            );
        }
    }

    #[test]
    fn the_otlp_table_is_checked_as_pyroscope_s_and_names_its_own_fields() {
        let config = resolve_text(
            "[otlp]\nurl = \"https://otel.example.com:4317\"\nbearer_token = \"t\"\nqueue_max_profiles = 10\n",
        )
        .expect("valid");
        let otlp = config.otlp.expect("enabled");
        assert_eq!(otlp.target.auth, Some(Auth::Bearer("t".into())));
        assert_eq!(otlp.delivery.queue.max_profiles, 10);
        assert!(config.pyroscope.is_none());
        for (text, field) in [
            ("[otlp]\nurl = \"ftp://x\"", "`otlp.url` (flag --otlp)"),
            (
                "[otlp]\nurl = \"http://x\"\nusername = \"u\"",
                "`otlp.password`",
            ),
            (
                "[otlp]\nurl = \"http://x\"\nmax_backoff_secs = 0",
                "`otlp.max_backoff_secs`",
            ),
        ] {
            let err = resolve_text(text).expect_err(text);
            assert!(err.contains(field), "{text}: {err}");
        }
        let flags = Overrides {
            otlp_url: Some("http://127.0.0.1:4317".into()),
            ..Default::default()
        };
        let config =
            Config::resolve(FileConfig::default(), flags, &Environment::default()).expect("valid");
        assert_eq!(
            config.otlp.expect("enabled").target.url,
            "http://127.0.0.1:4317"
        );
    }

    #[test]
    fn the_pyroscope_flag_alone_enables_export() {
        let flags = Overrides {
            pyroscope_url: Some("http://127.0.0.1:4040".into()),
            ..Default::default()
        };
        let config =
            Config::resolve(FileConfig::default(), flags, &Environment::default()).expect("valid");
        assert_eq!(
            config.pyroscope.expect("enabled").target.url,
            "http://127.0.0.1:4040"
        );
        assert!(Config::resolve(
            FileConfig::default(),
            Overrides::default(),
            &Environment::default()
        )
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
    fn kubernetes_metadata_is_on_in_a_pod_for_its_node() {
        let resolve = |text: &str, environment: &Environment| {
            let file = FileConfig::parse(text).expect("parses");
            Config::resolve(file, Overrides::default(), environment).map(|c| c.kubernetes_node)
        };
        let mut pod = Environment {
            in_kubernetes: true,
            node_name: Some("node-env".into()),
            host_name: Some("host".into()),
        };
        assert_eq!(
            resolve("", &pod).expect("valid").as_deref(),
            Some("node-env")
        );
        assert_eq!(
            resolve("node_name = \"node-file\"", &pod)
                .expect("valid")
                .as_deref(),
            Some("node-file")
        );
        assert_eq!(resolve("kubernetes = false", &pod).expect("valid"), None);
        pod.node_name = None;
        assert_eq!(resolve("", &pod).expect("valid").as_deref(), Some("host"));
        pod.host_name = None;
        let err = resolve("", &pod).expect_err("no node name anywhere");
        assert!(err.to_string().contains("`node_name`"), "{err}");
        // Outside a cluster, off unless asked for.
        assert_eq!(resolve("", &Environment::default()).expect("valid"), None);
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

    #[test]
    fn output_is_private_unless_a_mode_is_set() {
        let config = resolve_text("").expect("valid");
        assert_eq!(config.local_output.file_mode, 0o600);
        let config = resolve_text("output_mode = \"0640\"").expect("valid");
        assert_eq!(config.local_output.file_mode, 0o640);
        let flags = Overrides {
            output_mode: Some("644".into()),
            ..Default::default()
        };
        let file = FileConfig::parse("output_mode = \"0640\"").expect("parses");
        let config = Config::resolve(file, flags, &Environment::default()).expect("valid");
        assert_eq!(config.local_output.file_mode, 0o644);
        for bad in ["0o1644", "0400", "rw", "999"] {
            let err = resolve_text(&format!("output_mode = \"{bad}\"")).expect_err(bad);
            assert!(
                err.contains("`output_mode`") && err.contains("--output-mode"),
                "{err}"
            );
        }
    }
}
