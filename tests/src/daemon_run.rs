//! One way to run the daemon under test: [`DaemonRun`] says what to profile and how, then runs
//! the daemon to its end ([`DaemonRun::run`]: its exit status checked, its log returned) or
//! starts it in the background ([`DaemonRun::start`]).

use std::path::Path;
use std::process::Output;
use std::time::Duration;

use anyhow::Result;

use crate::background::BackgroundDaemon;
use crate::cgroup::MemoryCgroup;
use crate::run_daemon;

/// The arguments of one `profiler-daemon run`, built flag by flag.
#[derive(Clone, Debug, Default)]
pub struct DaemonRun {
    args: Vec<String>,
    /// What the background daemon logs (`RUST_LOG`); `info` if not set.
    log_filter: Option<String>,
}

/// A finished run: the daemon exited successfully with this log (its stderr).
#[derive(Debug)]
pub struct Finished {
    pub log: String,
    pub output: Output,
}

impl Finished {
    /// When the daemon first logged a line containing `message` (and the field `pid=<pid>`, if
    /// given), in nanoseconds since the Unix epoch: the clock of the profiles' `time_nanos`.
    pub fn logged_at_ns(&self, message: &str, pid: Option<u32>) -> Option<i64> {
        let pid_field = pid.map(|pid| format!("pid={pid}"));
        let line = self.log.lines().find(|line| {
            line.contains(message)
                && pid_field
                    .as_ref()
                    .is_none_or(|field| line.split_whitespace().any(|word| word == field))
        })?;
        logged_at_ns(line)
    }

    /// When the daemon pushed JVM `pid`'s layout (its Java frames walk from then on), in ns
    /// since the epoch, and how many ms after it began sampling.
    pub fn layout_pushed(&self, pid: u32) -> Option<(i64, i64)> {
        let pushed = self.logged_at_ns("JVM layout pushed", Some(pid))?;
        let sampling = self.logged_at_ns("daemon: sampling", None)?;
        Some((pushed, (pushed - sampling) / 1_000_000))
    }
}

/// When the daemon wrote this line of its log (its leading RFC 3339 time), in nanoseconds since
/// the Unix epoch: the clock of the profiles' `time_nanos`.
pub fn logged_at_ns(line: &str) -> Option<i64> {
    let stamp = humantime::parse_rfc3339(line.split_whitespace().next()?).ok()?;
    let since_epoch = stamp.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(since_epoch.as_nanos()).ok()
}

impl DaemonRun {
    pub fn new() -> Self {
        Self::default()
    }

    fn flag(mut self, name: &str, value: impl ToString) -> Self {
        self.args.push(name.to_owned());
        self.args.push(value.to_string());
        self
    }

    /// Profile this process (repeat for several).
    pub fn pid(self, pid: u32) -> Self {
        self.flag("--pid", pid)
    }

    pub fn pids(self, pids: impl IntoIterator<Item = u32>) -> Self {
        pids.into_iter().fold(self, Self::pid)
    }

    pub fn frequency(self, hz: u32) -> Self {
        self.flag("--frequency", hz)
    }

    /// Seconds per profile.
    pub fn interval(self, seconds: u64) -> Self {
        self.flag("--interval", seconds)
    }

    /// Seconds until the daemon stops by itself.
    pub fn duration(self, seconds: u64) -> Self {
        self.flag("--duration", seconds)
    }

    /// Where the local pprof files go.
    pub fn output(self, dir: &Path) -> Self {
        self.flag("--output", dir.to_str().expect("a UTF-8 output path"))
    }

    /// A configuration file.
    pub fn config(self, path: &Path) -> Self {
        self.flag("--config", path.to_str().expect("a UTF-8 config path"))
    }

    /// Serve metrics at `address`.
    pub fn metrics(self, address: std::net::SocketAddr) -> Self {
        self.flag("--metrics-listen", address)
    }

    /// No live stream (its port may be taken by a daemon another test left).
    pub fn no_stream(self) -> Self {
        self.flag("--grpc-listen", "off")
    }

    /// Serve the live profile stream at `address`, for subscribers.
    pub fn stream(self, address: &str) -> Self {
        self.flag("--grpc-listen", address)
    }

    /// Export every profile to the Pyroscope server at `url`.
    pub fn pyroscope(self, url: &str) -> Self {
        self.flag("--pyroscope", url)
    }

    pub fn otlp(self, url: &str) -> Self {
        self.flag("--otlp", url)
    }

    /// What a daemon started in the background logs, as a `RUST_LOG` value (`info` by
    /// default): a test that times what the daemon did logs the modules that say when.
    pub fn log_filter(mut self, filter: &str) -> Self {
        self.log_filter = Some(filter.to_owned());
        self
    }

    /// Any other argument.
    pub fn arg(mut self, arg: impl ToString) -> Self {
        self.args.push(arg.to_string());
        self
    }

    /// Runs the daemon until it exits (within `timeout`), asserting it exited successfully.
    pub fn run(self, timeout: Duration) -> Finished {
        let args = self.arg_strs();
        let output = run_daemon(&args, timeout).expect("the daemon runs");
        let log = String::from_utf8_lossy(&output.stderr).into_owned();
        assert!(
            output.status.success(),
            "daemon {args:?} failed ({}): {log}",
            output.status
        );
        Finished { log, output }
    }

    /// Starts the daemon in the background, logging to `log_dir/daemon.log`.
    pub fn start(self, log_dir: &Path) -> BackgroundDaemon {
        self.try_start(log_dir).expect("the daemon starts")
    }

    /// [`Self::start`], a failure returned: for a test that reports it beside other results.
    pub fn try_start(self, log_dir: &Path) -> Result<BackgroundDaemon> {
        BackgroundDaemon::start(&self.arg_strs(), self.log_filter_or_info(), log_dir)
    }

    /// [`Self::start`], the daemon in `cgroup` from its first instruction, so that all the
    /// memory it uses is charged there.
    pub fn start_in(self, cgroup: &MemoryCgroup, log_dir: &Path) -> BackgroundDaemon {
        BackgroundDaemon::start_in(
            Some(cgroup),
            &self.arg_strs(),
            self.log_filter_or_info(),
            log_dir,
        )
        .expect("the daemon starts")
    }

    fn log_filter_or_info(&self) -> &str {
        self.log_filter.as_deref().unwrap_or("info")
    }

    fn arg_strs(&self) -> Vec<&str> {
        self.args.iter().map(String::as_str).collect()
    }
}
