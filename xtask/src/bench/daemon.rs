//! A daemon started for a measurement: waiting until it is ready, its metrics, and what it used
//! over a window.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use profiler_common::{metric, Counter};

use super::cgroup::MemoryCgroup;
use super::measure::{bpf_stats, process_cpu_seconds, CpuReading, CpuUse};
use super::metrics_endpoint::{self, labelled};
use super::processes::{Guarded, POLL};

const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The daemon's metrics, keyed by name with labels (`name{label="value"}`).
pub(super) struct Metrics(BTreeMap<String, f64>);

pub(super) const SAMPLES: &str = metric::BPF_SAMPLES;
pub(super) const SAMPLES_SENT: &str = metric::BPF_SAMPLES_SENT;
pub(super) const RECORDS: &str = metric::RECORDS;
pub(super) const PROFILES_WRITTEN: &str = metric::PROFILES_WRITTEN;
const INTERVALS: &str = metric::INTERVALS;

fn jvms_ready() -> String {
    labelled(metric::JVMS, "state", metric::jvm_state::READY)
}

/// Where samples or work can be lost, in pipeline order, with what each loss means.
pub(super) fn loss_metrics() -> [(String, &'static str); 7] {
    let not_profiled = |reason| labelled(metric::SAMPLES_NOT_PROFILED, "reason", reason);
    [
        (
            not_profiled(Counter::ScratchMissing.name()),
            "BPF per-CPU scratch missing",
        ),
        (not_profiled(Counter::RingFull.name()), "ring buffer full"),
        (
            not_profiled(metric::not_profiled::MALFORMED),
            "malformed records",
        ),
        (
            not_profiled(metric::not_profiled::WORK_QUEUE_FULL),
            "symbolizer queue full",
        ),
        (
            not_profiled(metric::not_profiled::STACK_BOUND),
            "stack table full (max_stacks_per_interval)",
        ),
        (
            labelled(metric::JVMS, "state", metric::jvm_state::OVER_BOUND),
            "JVM map full (max_jvms)",
        ),
        (
            metric::PROFILE_WRITE_ERRORS.to_owned(),
            "profile write errors",
        ),
    ]
}

impl Metrics {
    fn parse(text: &str) -> Self {
        Self(metrics_endpoint::parse(text))
    }

    pub(super) fn get(&self, key: &str) -> Result<f64> {
        self.0
            .get(key)
            .copied()
            .with_context(|| format!("the daemon's /metrics has no `{key}`"))
    }
}

pub(super) fn scrape(address: SocketAddr) -> Result<Metrics> {
    Ok(Metrics::parse(&metrics_endpoint::scrape(address)?))
}

/// A running `profiler-daemon run`, stopped with SIGINT (or killed, if dropped).
pub(super) struct Daemon {
    pub(super) process: Guarded,
    pub(super) metrics: SocketAddr,
    pub(super) program: u32,
    pub(super) log: PathBuf,
    /// Its own memory cgroup (it is started in it), for what the kernel charges it.
    pub(super) cgroup: MemoryCgroup,
    /// Its output directory, its own (two daemons may run at once), removed when it stops.
    pub(super) output: PathBuf,
}

/// The daemon's CPU and counters over one window.
pub(super) struct DaemonWindow {
    pub(super) cpu: CpuUse,
    metrics_before: Metrics,
    pub(super) metrics_after: Metrics,
    /// The most its cgroup was charged at the window's once-a-second readings, in MB.
    pub(super) charged_mb: f64,
}

impl DaemonWindow {
    pub(super) fn delta(&self, key: &str) -> Result<f64> {
        Ok(self.metrics_after.get(key)? - self.metrics_before.get(key)?)
    }
}

/// What a freshly started daemon must have done before it is measured.
#[derive(Clone, Copy, Debug)]
pub(super) enum Ready {
    /// `jvms` JVMs ready (their layout in the BPF maps) and samples counted.
    Sampling { jvms: usize },
    /// Also its first profile written, so start-up work (the first symbolization, with cold
    /// caches) is behind it.
    Profiling { jvms: usize },
    /// Also [`SETTLED_AFTER_INTERVALS`] intervals completed: the daemon's start-up period, in
    /// which it drains every 50 ms after new Java stacks (`daemon.rs`), is behind it.
    Settled { jvms: usize },
}

/// Intervals (15 s each) after which the daemon's 30 s start-up period is over.
const SETTLED_AFTER_INTERVALS: f64 = 2.0;

impl Daemon {
    pub(super) fn wait_until(&mut self, ready: Ready) -> Result<()> {
        let (jvms, profiles_needed, intervals_needed) = match ready {
            Ready::Sampling { jvms } => (jvms, 0.0, 0.0),
            Ready::Profiling { jvms } => (jvms, 1.0, 0.0),
            Ready::Settled { jvms } => (jvms, 1.0, SETTLED_AFTER_INTERVALS),
        };
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut last_seen = String::from("no metrics yet");
        loop {
            if let Some(status) = self.process.exit_status()? {
                bail!(
                    "the daemon exited during start-up ({status}); see {}",
                    self.log.display()
                );
            }
            if let Ok(metrics) = scrape(self.metrics) {
                let ready = metrics.get(&jvms_ready())?;
                let samples = metrics.get(SAMPLES)?;
                let profiles = metrics.get(PROFILES_WRITTEN)?;
                let intervals = metrics.get(INTERVALS)?;
                if ready >= jvms as f64
                    && samples > 0.0
                    && profiles >= profiles_needed
                    && intervals >= intervals_needed
                {
                    return Ok(());
                }
                last_seen = format!(
                    "{ready} of {jvms} JVMs ready, {samples} samples, {profiles} profiles written, {intervals} intervals"
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "the daemon was not profiling after {READY_TIMEOUT:?} ({last_seen}); see {}",
                    self.log.display()
                );
            }
            thread::sleep(POLL);
        }
    }

    pub(super) fn cpu_reading(&self) -> Result<CpuReading> {
        Ok(CpuReading {
            at: Instant::now(),
            process_seconds: process_cpu_seconds(self.process.pid())?,
            bpf: bpf_stats(self.program)?,
        })
    }

    /// Metrics just after the daemon published them (it does once a second), so that two of
    /// them a known time apart cover that time to within a poll.
    pub(super) fn fresh_metrics(&self) -> Result<Metrics> {
        let first = scrape(self.metrics)?;
        let before = first.get(SAMPLES)?;
        let deadline = Instant::now() + Duration::from_millis(2500);
        loop {
            thread::sleep(Duration::from_millis(20));
            let metrics = scrape(self.metrics)?;
            if metrics.get(SAMPLES)? != before || Instant::now() > deadline {
                return Ok(metrics);
            }
        }
    }

    /// What the daemon did over `window`, from now.
    pub(super) fn measure(&self, window: Duration) -> Result<DaemonWindow> {
        let metrics_before = self.fresh_metrics()?;
        let before = self.cpu_reading()?;
        let end = Instant::now() + window;
        let mut charged: u64 = 0;
        while let Some(left) = end.checked_duration_since(Instant::now()) {
            charged = charged.max(self.cgroup.current()?);
            thread::sleep(left.min(Duration::from_secs(1)));
        }
        charged = charged.max(self.cgroup.current()?);
        let metrics_after = self.fresh_metrics()?;
        let after = self.cpu_reading()?;
        Ok(DaemonWindow {
            cpu: after.since(&before),
            metrics_before,
            metrics_after,
            charged_mb: charged as f64 / 1e6,
        })
    }

    /// The most its cgroup was charged so far, in MB.
    pub(super) fn peak_charged_mb(&self) -> Result<f64> {
        Ok(self.cgroup.peak()? as f64 / 1e6)
    }

    pub(super) fn stop(self) -> Result<()> {
        let log = self.log.clone();
        let output = self.output.clone();
        let status = self.process.interrupt()?;
        if !status.success() {
            bail!("the daemon failed ({status}); see {}", log.display());
        }
        let _ = std::fs::remove_dir_all(&output);
        Ok(())
    }
}

/// The CPU each of `daemons`, running at once over the same workload, used over one `window`:
/// the workload's drift is then in every one's figure alike, where daemons run in turns would
/// each see their own stretch of it.
pub(super) fn cpu_at_once(daemons: &[&Daemon], window: Duration) -> Result<Vec<CpuUse>> {
    let before = daemons
        .iter()
        .map(|daemon| daemon.cpu_reading())
        .collect::<Result<Vec<_>>>()?;
    thread::sleep(window);
    daemons
        .iter()
        .zip(&before)
        .map(|(daemon, before)| Ok(daemon.cpu_reading()?.since(before)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_prometheus_text_with_labels() {
        let text = "# HELP x y\n# TYPE x counter\nprofiler_records_total 42\n\
                    profiler_jvms{state=\"ready\"} 3\n";
        let metrics = Metrics::parse(text);
        assert_eq!(metrics.get(RECORDS).expect("records"), 42.0);
        assert_eq!(metrics.get(&jvms_ready()).expect("jvms"), 3.0);
        assert!(metrics.get("missing").is_err());
    }
}
