//! Section 6: export to Pyroscope and OTLP. The daemon profiles the small JVMs of section 3 with
//! a 1 s interval (the most profiles per second a user would configure) and pushes them to the
//! tests' Pyroscope stand-in (`tests/receiver/pyroscope_receiver.py`, Python grpcio, which writes
//! each profile to disk): profiles built and exported per second and the daemon's CPU while it
//! exports; then the receiver goes away until the export queue reaches its bound (the
//! exporter's memory at the bound), comes back, and the backlog's delivery is timed. Then the
//! same JVMs are profiled by a daemon exporting OTLP to the tests' OTLP receiver
//! (`tests/receiver/otlp_receiver.py`, which reads every request through its dictionary), for
//! the same window: the two exports' costs side by side.

use std::fs;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use profiler_common::metric;

use super::daemon::{scrape, Metrics, Ready, PROFILES_WRITTEN};
use super::measure::{rss_mb, CpuUse};
use super::metrics_endpoint::{free_local_address, labelled};
use super::processes::Guarded;
use super::scenarios::Bench;
use super::statistics::thousands;
use super::table::Row;

const EXPORT_HZ: u32 = 99;
const EXPORT_INTERVAL_SECS: u32 = 1;
/// `queue_max_profiles` for the outage: small enough to be reached in seconds.
const QUEUE_BOUND: u64 = 200;
/// The daemon's default `queue_max_profiles` and `queue_max_bytes`, for the extrapolation.
const DEFAULT_QUEUE_PROFILES: f64 = 4096.0;
const DEFAULT_QUEUE_MB: f64 = 64.0 * 1024.0 * 1024.0 / 1e6;
/// How long the outage may take to fill the queue, and the backlog to drain.
const FILL_TIMEOUT: Duration = Duration::from_secs(60);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// Export counters are read live at each scrape (not once a second): fine polling is exact.
const FINE_POLL: Duration = Duration::from_millis(10);

/// A remote-sink family's sample of the Pyroscope sink.
fn pyroscope(name: &str) -> String {
    labelled(name, "sink", "pyroscope")
}

fn dropped_queue_full() -> String {
    format!(
        "{}{{sink=\"pyroscope\",reason=\"{}\"}}",
        metric::EXPORT_DROPPED_PROFILES,
        metric::export_dropped::EXPORT_QUEUE_FULL
    )
}

pub(super) struct ExportRun {
    jvms: usize,
    /// Steady state, receiver up.
    cpu: CpuUse,
    built_per_second: f64,
    exported_per_second: f64,
    requests_per_second: f64,
    kilobytes_per_second: f64,
    rss_mb_steady: f64,
    /// Receiver down until the queue is at its bound.
    queued_at_bound: f64,
    queued_mb_at_bound: f64,
    dropped_at_bound: f64,
    rss_mb_at_bound: f64,
    outage_seconds: f64,
    /// Receiver back: the backlog's delivery.
    backlog_delivered: f64,
    backlog_requests: f64,
    /// From the receiver's return to the first delivery (the exporter's retry wait), and to
    /// the whole backlog's.
    first_delivery_seconds: f64,
    drain_seconds: f64,
    /// The OTLP export's steady state, for the same JVMs and window.
    otlp: OtlpRun,
}

struct OtlpRun {
    cpu: CpuUse,
    built_per_second: f64,
    exported_per_second: f64,
    requests_per_second: f64,
    /// Of the profiles' pprof encoding, which is what the queue's byte bound counts (the
    /// request on the wire is gzipped).
    kilobytes_per_second: f64,
    rss_mb: f64,
}

/// A receiver of the tests (the Pyroscope stand-in, the OTLP receiver), killed when dropped.
struct Receiver {
    _process: Guarded,
}

impl Receiver {
    fn start(root: &Path, port: u16, record_dir: &Path) -> Result<Self> {
        let proto_root = root.join("profiler-daemon/proto");
        let proto_args = ["--proto-root".as_ref(), proto_root.as_os_str()];
        Self::spawn(root, "pyroscope_receiver.py", &proto_args, port, record_dir)
    }

    fn start_otlp(root: &Path, port: u16, record_dir: &Path) -> Result<Self> {
        Self::spawn(root, "otlp_receiver.py", &[], port, record_dir)
    }

    fn spawn(
        root: &Path,
        script: &str,
        args: &[&std::ffi::OsStr],
        port: u16,
        record_dir: &Path,
    ) -> Result<Self> {
        if record_dir.exists() {
            fs::remove_dir_all(record_dir)
                .with_context(|| format!("clearing {}", record_dir.display()))?;
        }
        let mut command = Command::new("python3");
        command
            .arg(root.join("tests/receiver").join(script))
            .args(args)
            .arg("--record-dir")
            .arg(record_dir)
            .args(["--port", &port.to_string()])
            // grpcio, grpcio-tools and opentelemetry-proto, installed there by
            // `cargo xtask setup --tests`.
            .env("PYTHONPATH", root.join(".tools/python"))
            .stdout(Stdio::piped());
        let mut process = Guarded::spawn(script, &mut command)?;
        let stdout = process.child.stdout.take().context("receiver stdout")?;
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        if !line.starts_with("listening on ") {
            bail!("{script} did not start: it printed {line:?}");
        }
        Ok(Self { _process: process })
    }
}

impl Bench {
    pub(super) fn measure_export(&self, pids: &[u32]) -> Result<ExportRun> {
        let root = self
            .work_dir
            .parent()
            .and_then(Path::parent)
            .context("workspace root")?;
        let address = free_local_address()?;
        let record_dir = self.work_dir.join("receiver");
        let config = self.work_dir.join("export.toml");
        fs::write(
            &config,
            format!(
                "[pyroscope]\nurl = \"http://{address}\"\nqueue_max_profiles = {QUEUE_BOUND}\n\
                 # Retry within a second once the receiver is back.\nmax_backoff_secs = 1\n"
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;

        let receiver = Receiver::start(root, address.port(), &record_dir)?;
        let extra = ["--config".to_owned(), config.display().to_string()];
        let ready = Ready::Profiling { jvms: pids.len() };
        let daemon = self.start_daemon(EXPORT_HZ, EXPORT_INTERVAL_SECS, pids, ready, &extra)?;
        let exported = pyroscope(metric::EXPORT_PROFILES);
        let requests = pyroscope(metric::EXPORT_REQUESTS);
        let queued = pyroscope(metric::EXPORT_QUEUE_PROFILES);
        let window = daemon.measure(self.plan.cost_window)?;
        let per_second = |key: &str| -> Result<f64> { Ok(window.delta(key)? / window.cpu.seconds) };
        let daemon_pid = daemon.process.pid();
        let rss_mb_steady = rss_mb(daemon_pid)?;
        let (built_per_second, exported_per_second) =
            (per_second(PROFILES_WRITTEN)?, per_second(&exported)?);
        self.progress(format_args!(
            "6. export, {} JVMs: {built_per_second:.1} profiles/s built, \
             {exported_per_second:.1} exported, daemon {:.2}% of a core",
            pids.len(),
            window.cpu.process_cores * 100.0
        ));

        drop(receiver);
        let outage = Instant::now();
        let at_bound = wait_for(daemon.metrics, FILL_TIMEOUT, |m| {
            Ok(m.get(&queued)? >= QUEUE_BOUND as f64 && m.get(&dropped_queue_full())? > 0.0)
        })
        .context("the export queue never reached its bound")?;
        let rss_mb_at_bound = rss_mb(daemon_pid)?;
        let outage_seconds = outage.elapsed().as_secs_f64();

        let before = scrape(daemon.metrics)?;
        let _receiver = Receiver::start(root, address.port(), &record_dir)?;
        let back = Instant::now();
        wait_for(daemon.metrics, DRAIN_TIMEOUT, |m| {
            Ok(m.get(&exported)? > before.get(&exported)?)
        })
        .context("nothing was delivered after the receiver came back")?;
        let first_delivery_seconds = back.elapsed().as_secs_f64();
        // Drained: what was queued at the bound has gone (new profiles keep arriving, one
        // interval's worth at a time).
        let drained = wait_for(daemon.metrics, DRAIN_TIMEOUT, |m| {
            Ok(m.get(&exported)? - before.get(&exported)? >= before.get(&queued)?)
        })
        .context("the backlog was not delivered")?;
        let drain_seconds = back.elapsed().as_secs_f64();
        daemon.stop()?;
        let otlp = self.measure_otlp_export(root, pids)?;

        let run = ExportRun {
            jvms: pids.len(),
            cpu: window.cpu,
            built_per_second,
            exported_per_second,
            requests_per_second: per_second(&requests)?,
            kilobytes_per_second: per_second(&pyroscope(metric::EXPORT_BYTES))? / 1e3,
            rss_mb_steady,
            queued_at_bound: at_bound.get(&queued)?,
            queued_mb_at_bound: at_bound.get(&pyroscope(metric::EXPORT_QUEUE_BYTES))? / 1e6,
            dropped_at_bound: at_bound.get(&dropped_queue_full())?,
            rss_mb_at_bound,
            outage_seconds,
            backlog_delivered: drained.get(&exported)? - before.get(&exported)?,
            backlog_requests: drained.get(&requests)? - before.get(&requests)?,
            first_delivery_seconds,
            drain_seconds,
            otlp,
        };
        self.progress(format_args!(
            "6. export outage: {} profiles ({:.2} MB) queued at the bound, RSS {:.0} MB; \
             {} delivered within {:.2} s of the receiver's return",
            run.queued_at_bound,
            run.queued_mb_at_bound,
            run.rss_mb_at_bound,
            run.backlog_delivered,
            run.drain_seconds
        ));
        Ok(run)
    }
}

impl Bench {
    /// The same JVMs exported as OTLP for one cost window.
    fn measure_otlp_export(&self, root: &Path, pids: &[u32]) -> Result<OtlpRun> {
        let address = free_local_address()?;
        let config = self.work_dir.join("export-otlp.toml");
        fs::write(&config, format!("[otlp]\nurl = \"http://{address}\"\n"))
            .with_context(|| format!("writing {}", config.display()))?;
        let _receiver =
            Receiver::start_otlp(root, address.port(), &self.work_dir.join("otlp-receiver"))?;
        let extra = ["--config".to_owned(), config.display().to_string()];
        let ready = Ready::Profiling { jvms: pids.len() };
        let daemon = self.start_daemon(EXPORT_HZ, EXPORT_INTERVAL_SECS, pids, ready, &extra)?;
        let window = daemon.measure(self.plan.cost_window)?;
        let per_second = |key: &str| -> Result<f64> { Ok(window.delta(key)? / window.cpu.seconds) };
        let otlp = |name| labelled(name, "sink", "otlp");
        let run = OtlpRun {
            cpu: window.cpu,
            built_per_second: per_second(PROFILES_WRITTEN)?,
            exported_per_second: per_second(&otlp(metric::EXPORT_PROFILES))?,
            requests_per_second: per_second(&otlp(metric::EXPORT_REQUESTS))?,
            kilobytes_per_second: per_second(&otlp(metric::EXPORT_BYTES))? / 1e3,
            rss_mb: rss_mb(daemon.process.pid())?,
        };
        daemon.stop()?;
        self.progress(format_args!(
            "6. OTLP export, {} JVMs: {:.1} profiles/s exported, daemon {:.2}% of a core",
            pids.len(),
            run.exported_per_second,
            run.cpu.process_cores * 100.0
        ));
        Ok(run)
    }
}

/// How section 6 measures, for the report (`cost_window`: section 3's window).
pub(super) fn method(cost_window: Duration) -> String {
    format!(
        "6. The daemon profiles section 3's small JVMs at {EXPORT_HZ} Hz with a \
         {EXPORT_INTERVAL_SECS} s interval and exports to the tests' Pyroscope stand-in \
         (`tests/receiver/pyroscope_receiver.py`: Python grpcio, writing every profile it \
         receives to disk, so it is the slower side), measured for {} s as in section 3 (export \
         counters from `/metrics`). Then the receiver is killed until the queue is at its bound \
         (`queue_max_profiles = {QUEUE_BOUND}`) and has dropped a profile (RSS as `VmRSS`, queue \
         bytes from `profiler_export_queue_bytes`), started again on the same port, and the \
         time until the profiles queued at that moment are delivered is taken from the live \
         export counters, polled every 10 ms. Then a daemon exporting OTLP profiles to the \
         tests' OTLP receiver (`tests/receiver/otlp_receiver.py`: Python grpcio on the official \
         stubs, reading every request through its dictionary) profiles the same JVMs for the \
         same window. `cargo xtask bench --section export` runs this section alone (its JVMs \
         started and warmed up as in section 3).",
        cost_window.as_secs()
    )
}

/// Scrapes every [`FINE_POLL`] until `done` holds; returns that scrape.
fn wait_for(
    address: std::net::SocketAddr,
    timeout: Duration,
    done: impl Fn(&Metrics) -> Result<bool>,
) -> Result<Metrics> {
    let deadline = Instant::now() + timeout;
    loop {
        let metrics = scrape(address)?;
        if done(&metrics)? {
            return Ok(metrics);
        }
        if Instant::now() > deadline {
            bail!("not within {timeout:?}");
        }
        thread::sleep(FINE_POLL);
    }
}

impl ExportRun {
    pub(super) fn rows(&self, rows: &mut Vec<Row>) {
        let setting = format!(
            "{} JVMs, {EXPORT_HZ} Hz, {EXPORT_INTERVAL_SECS} s interval",
            self.jvms
        );
        rows.push(Row {
            section: "6",
            measurement: "export to Pyroscope (Python grpcio stand-in)".to_owned(),
            setting: setting.clone(),
            result: format!(
                "{:.1} profiles/s built, {:.1} exported in {:.1} requests/s ({} KB/s gzipped \
                 pprof); daemon {:.2}% of a core, RSS {:.0} MB",
                self.built_per_second,
                self.exported_per_second,
                self.requests_per_second,
                thousands(self.kilobytes_per_second),
                self.cpu.process_cores * 100.0,
                self.rss_mb_steady
            ),
            target: String::new(),
        });
        let otlp = &self.otlp;
        rows.push(Row {
            section: "6",
            measurement: "export OTLP profiles (Python grpcio receiver, official stubs)".to_owned(),
            setting: setting.clone(),
            result: format!(
                "{:.1} profiles/s built, {:.1} exported in {:.1} requests/s ({} KB/s of pprof, \
                 gzipped on the wire); daemon {:.2}% of a core ({:.2} for Pyroscope), RSS {:.0} MB",
                otlp.built_per_second,
                otlp.exported_per_second,
                otlp.requests_per_second,
                thousands(otlp.kilobytes_per_second),
                otlp.cpu.process_cores * 100.0,
                self.cpu.process_cores * 100.0,
                otlp.rss_mb
            ),
            target: String::new(),
        });
        let per_profile_kb = self.queued_mb_at_bound * 1e3 / self.queued_at_bound.max(1.0);
        let default_bound_mb =
            (per_profile_kb * DEFAULT_QUEUE_PROFILES / 1e3).min(DEFAULT_QUEUE_MB);
        rows.push(Row {
            section: "6",
            measurement: "exporter memory at the queue bound (receiver down)".to_owned(),
            setting: format!("{setting}, queue_max_profiles = {QUEUE_BOUND}"),
            result: format!(
                "bound reached after {:.1} s: {:.0} profiles queued in {:.2} MB ({per_profile_kb:.1} KB \
                 each), {:.0} dropped and counted; daemon RSS {:.0} MB ({:+.0} MB); the default \
                 bound (4096 profiles, 64 MiB) would hold {default_bound_mb:.0} MB of these",
                self.outage_seconds,
                self.queued_at_bound,
                self.queued_mb_at_bound,
                self.dropped_at_bound,
                self.rss_mb_at_bound,
                self.rss_mb_at_bound - self.rss_mb_steady
            ),
            target: "bounded".to_owned(),
        });
        rows.push(Row {
            section: "6",
            measurement: "backlog delivered after the outage".to_owned(),
            setting: "receiver back on the same port, max_backoff_secs = 1".to_owned(),
            result: format!(
                "{:.0} profiles in {:.0} requests; first delivered {:.2} s after the receiver \
                 was back (the retry wait), all {:.2} s after",
                self.backlog_delivered,
                self.backlog_requests,
                self.first_delivery_seconds,
                self.drain_seconds,
            ),
            target: String::new(),
        });
    }
}

/// One daemon's window exporting to Pyroscope and OTLP at once (section 6 side by side).
struct BothSinksWindow {
    cpu_cores: f64,
    built_per_second: f64,
    rss_mb: f64,
    charged_mb: f64,
}

/// Section 6 side by side: the baseline daemon (A) and this build's (B) exporting the same
/// JVMs to Pyroscope and OTLP at once (the remote variant shared by both sinks), in windows
/// that alternate A B, B A, ... so that drift falls on both alike.
pub(super) struct ExportComparison {
    jvms: usize,
    windows: [Vec<BothSinksWindow>; 2],
}

impl Bench {
    pub(super) fn compare_export_costs(
        &self,
        pids: &[u32],
        baseline: &Path,
    ) -> Result<ExportComparison> {
        let root = self
            .work_dir
            .parent()
            .and_then(Path::parent)
            .context("workspace root")?;
        let (pyroscope, otlp) = (free_local_address()?, free_local_address()?);
        let config = self.work_dir.join("export-both.toml");
        fs::write(
            &config,
            format!(
                "[pyroscope]\nurl = \"http://{pyroscope}\"\n\n[otlp]\nurl = \"http://{otlp}\"\n"
            ),
        )
        .with_context(|| format!("writing {}", config.display()))?;
        let _pyroscope = Receiver::start(root, pyroscope.port(), &self.work_dir.join("receiver"))?;
        let _otlp = Receiver::start_otlp(root, otlp.port(), &self.work_dir.join("otlp-receiver"))?;
        let extra = ["--config".to_owned(), config.display().to_string()];
        let daemons = [baseline, self.daemon_binary()];
        let mut windows: [Vec<BothSinksWindow>; 2] = [Vec::new(), Vec::new()];
        // Twice section 2's rounds: a daemon's CPU varies more from window to window than the
        // BPF program's run time.
        let rounds = 2 * self.plan.bpf_rounds;
        for round in 0..rounds {
            for k in 0..2 {
                let side = (k + round) % 2;
                let ready = Ready::Profiling { jvms: pids.len() };
                let daemon = self.start_daemon_binary(
                    daemons[side],
                    EXPORT_HZ,
                    EXPORT_INTERVAL_SECS,
                    pids,
                    ready,
                    &extra,
                )?;
                let window = daemon.measure(self.plan.cost_window)?;
                let measured = BothSinksWindow {
                    cpu_cores: window.cpu.process_cores,
                    built_per_second: window.delta(PROFILES_WRITTEN)? / window.cpu.seconds,
                    rss_mb: rss_mb(daemon.process.pid())?,
                    charged_mb: window.charged_mb,
                };
                daemon.stop()?;
                self.progress(format_args!(
                    "6. both sinks, round {}/{}, {}: {:.2}% of a core, {:.1} profiles/s, RSS \
                     {:.0} MB",
                    round + 1,
                    rounds,
                    super::results::SIDES[side],
                    measured.cpu_cores * 100.0,
                    measured.built_per_second,
                    measured.rss_mb
                ));
                windows[side].push(measured);
            }
        }
        Ok(ExportComparison {
            jvms: pids.len(),
            windows,
        })
    }
}

impl ExportComparison {
    pub(super) fn rows(&self, rows: &mut Vec<Row>) {
        let setting = format!(
            "{} JVMs, {EXPORT_HZ} Hz, {EXPORT_INTERVAL_SECS} s interval, Pyroscope + OTLP",
            self.jvms
        );
        let median_of = |side: usize, value: fn(&BothSinksWindow) -> f64| {
            super::statistics::median(self.windows[side].iter().map(value))
        };
        type Measure = (&'static str, fn(&BothSinksWindow) -> f64, &'static str);
        let measures: [Measure; 4] = [
            (
                "daemon CPU, % of a core",
                |w| w.cpu_cores * 100.0,
                "B/A <= 1.05",
            ),
            (
                "profiles built per second",
                |w| w.built_per_second,
                "B/A ~ 1",
            ),
            ("daemon RSS, MB", |w| w.rss_mb, "B/A <= 1.05"),
            (
                "memory charged (cgroup peak in window), MB",
                |w| w.charged_mb,
                "B/A <= 1.05",
            ),
        ];
        for (measurement, value, target) in measures {
            let (a, b) = (median_of(0, value), median_of(1, value));
            rows.push(Row {
                section: "6. export, A/B",
                measurement: measurement.to_owned(),
                setting: setting.clone(),
                result: format!(
                    "A {a:.2}, B {b:.2}: B/A {:.2} (medians of {} windows each)",
                    b / a,
                    self.windows[0].len()
                ),
                target: target.to_owned(),
            });
        }
    }
}
