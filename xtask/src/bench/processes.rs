//! The processes the bench starts: killed when dropped, and the workloads with their ops
//! reports.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

const STOP_TIMEOUT: Duration = Duration::from_secs(60);
pub(super) const POLL: Duration = Duration::from_millis(50);

const SIGINT: i32 = 2;

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, signal: i32) -> i32;
}

/// A child process killed (and reaped) when dropped: nothing the bench starts outlives it, even
/// when a measurement fails half-way.
pub(super) struct Guarded {
    name: String,
    pub(super) child: Child,
}

impl Guarded {
    pub(super) fn spawn(name: &str, command: &mut Command) -> Result<Self> {
        let child = command
            .spawn()
            .with_context(|| format!("starting {name}: {command:?}"))?;
        Ok(Self {
            name: name.to_owned(),
            child,
        })
    }

    pub(super) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(super) fn exit_status(&mut self) -> Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .with_context(|| format!("checking on {}", self.name))
    }

    /// SIGINT, then waits: an orderly stop (the daemon writes its last interval and exits).
    pub(super) fn interrupt(mut self) -> Result<ExitStatus> {
        let pid = i32::try_from(self.pid()).context("pid out of range")?;
        // SAFETY: kill has no memory preconditions; the pid is our own child, not yet reaped.
        if unsafe { libc_kill(pid, SIGINT) } != 0 {
            bail!(
                "sending SIGINT to {}: {}",
                self.name,
                std::io::Error::last_os_error()
            );
        }
        let deadline = Instant::now() + STOP_TIMEOUT;
        loop {
            if let Some(status) = self.exit_status()? {
                return Ok(status);
            }
            if Instant::now() > deadline {
                bail!(
                    "{} did not exit within {STOP_TIMEOUT:?} of SIGINT",
                    self.name
                );
            }
            thread::sleep(POLL);
        }
    }
}

impl Drop for Guarded {
    fn drop(&mut self) {
        // Does nothing for a child already reaped by `interrupt`.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Cumulative operations and the workload's clock, printed together as "ops COUNT NANOS".
#[derive(Clone, Copy, Debug)]
pub(super) struct OpsReport {
    ops: u64,
    pub(super) nanos: u64,
}

impl OpsReport {
    /// Operations per second from this report to a later one.
    pub(super) fn rate_until(&self, later: &OpsReport) -> f64 {
        later.ops.saturating_sub(self.ops) as f64 * 1e9
            / later.nanos.saturating_sub(self.nanos).max(1) as f64
    }

    fn parse(line: &str) -> Option<Self> {
        let mut fields = line.strip_prefix("ops ")?.split_whitespace();
        Some(Self {
            ops: fields.next()?.parse().ok()?,
            nanos: fields.next()?.parse().ok()?,
        })
    }
}

/// A workload program (xtask/bench): ready once it printed "ready"; then a thread keeps its
/// latest ops report (and drains its output, so it never blocks on a full pipe).
pub(super) struct Workload {
    process: Guarded,
    stdout: Option<BufReader<ChildStdout>>,
    reports: Arc<Reports>,
}

/// The latest report and how many came before it, with a signal for each new one.
#[derive(Default)]
struct Reports {
    latest: Mutex<(u64, Option<OpsReport>)>,
    arrived: Condvar,
}

/// How long a workload may go without a report (it prints one every 100 ms).
const REPORT_TIMEOUT: Duration = Duration::from_secs(2);

impl Workload {
    pub(super) fn spawn(name: &str, mut command: Command) -> Result<Self> {
        command.stdout(Stdio::piped());
        let mut process = Guarded::spawn(name, &mut command)?;
        let stdout = process
            .child
            .stdout
            .take()
            .context("workload has no stdout")?;
        Ok(Self {
            process,
            stdout: Some(BufReader::new(stdout)),
            reports: Arc::default(),
        })
    }

    pub(super) fn start(name: &str, command: Command) -> Result<Self> {
        let mut workload = Self::spawn(name, command)?;
        workload.wait_ready()?;
        Ok(workload)
    }

    pub(super) fn wait_ready(&mut self) -> Result<()> {
        let mut stdout = self
            .stdout
            .take()
            .context("waited twice for the same workload")?;
        let mut line = String::new();
        stdout
            .read_line(&mut line)
            .with_context(|| format!("reading the output of {}", self.process.name))?;
        if line.trim() != "ready" {
            bail!("{} did not start: it printed {line:?}", self.process.name);
        }
        let reports = Arc::clone(&self.reports);
        thread::spawn(move || follow_reports(stdout, &reports));
        Ok(())
    }

    pub(super) fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Throughput over about `window`, from two of the workload's own reports.
    pub(super) fn ops_per_second(&self, window: Duration) -> Result<f64> {
        let first = self.latest_report()?;
        thread::sleep(window);
        let last = self.latest_report()?;
        if last.nanos <= first.nanos {
            bail!("{} stopped reporting", self.process.name);
        }
        Ok(first.rate_until(&last))
    }

    fn latest_report(&self) -> Result<OpsReport> {
        let (_, latest) = *self
            .reports
            .latest
            .lock()
            .map_err(|_| anyhow!("report lock poisoned"))?;
        latest.with_context(|| format!("{} printed no ops report", self.process.name))
    }

    /// Waits for the report `count` reports after the latest one, and returns it just as it
    /// arrives, so that what the caller does next lines up with the workload's own clock.
    pub(super) fn report_after(&self, count: u64) -> Result<OpsReport> {
        let lock_error = || anyhow!("report lock poisoned");
        let mut latest = self.reports.latest.lock().map_err(|_| lock_error())?;
        let wanted = latest.0 + count;
        let deadline = Instant::now() + REPORT_TIMEOUT * count as u32;
        while latest.0 < wanted {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{} stopped reporting", self.process.name);
            }
            latest = self
                .reports
                .arrived
                .wait_timeout(latest, left)
                .map_err(|_| lock_error())?
                .0;
        }
        latest
            .1
            .with_context(|| format!("{} printed no ops report", self.process.name))
    }
}

pub(super) fn make_fifo(path: &Path) -> Result<()> {
    use std::os::unix::ffi::OsStrExt as _;
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path and a mode.
    if unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) } != 0 {
        bail!(
            "mkfifo {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn follow_reports(stdout: BufReader<ChildStdout>, reports: &Reports) {
    for line in stdout.lines().map_while(Result::ok) {
        if let Some(report) = OpsReport::parse(&line) {
            if let Ok(mut latest) = reports.latest.lock() {
                *latest = (latest.0 + 1, Some(report));
            }
            reports.arrived.notify_all();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_ops_reports() {
        let report = OpsReport::parse("ops 1200 5000000000").expect("a report");
        assert_eq!((report.ops, report.nanos), (1200, 5_000_000_000));
        assert!(OpsReport::parse("ready").is_none());
        assert!(OpsReport::parse("ops 12").is_none());
    }
}
