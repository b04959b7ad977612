//! Section 10 (`--section soak`, run on its own): the daemon's memory over a long whole-host run
//! with process churn, the way a node's daemon lives for weeks. The daemon profiles the whole
//! host at 99 Hz while short-lived JVMs (one every 10 s, 5 s each: a new process, new code, new
//! Java names each time) and short native processes (three a second) come and go. Once a minute:
//! its resident set (anonymous and file-backed), the memory charged to its cgroup, its heap as
//! the allocator counts it (`profiler_heap_bytes`), and its bounded caches (symbols, unwind
//! tables). The verdict is on the peak and on the growth over the run's second half, when the
//! caches have had time to fill to their budgets: what still grows then is a leak.

use std::fmt::Write as _;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use profiler_common::metric;

use super::daemon::{scrape, Ready};
use super::measure::{peak_rss_mb, status_mb};
use super::metrics_endpoint::labelled;
use super::processes::Guarded;
use super::scenarios::Bench;
use super::table::{verdict, Row};

const SOAK_HZ: u32 = 99;
/// A new JVM this often, living this long.
const JVM_EVERY: Duration = Duration::from_secs(10);
const JVM_LIFETIME: Duration = Duration::from_secs(5);
/// Short native processes started per second.
const SHORT_PROCESSES_PER_SECOND: usize = 3;
const READING_EVERY: Duration = Duration::from_secs(60);
/// The targets: peak RSS with the default budget, growth over the second half.
const MAX_PEAK_RSS_MB: f64 = 160.0;
const MAX_SECOND_HALF_GROWTH: f64 = 0.05;

/// One minute's reading.
#[derive(Clone, Copy, Debug)]
struct Reading {
    minute: f64,
    rss_mb: f64,
    anon_mb: f64,
    file_mb: f64,
    charged_mb: f64,
    heap_in_use_mb: f64,
    heap_free_mb: f64,
    symbol_cache_mb: f64,
    unwind_tables_mb: f64,
}

pub(super) struct SoakRun {
    minutes: u64,
    readings: Vec<Reading>,
    peak_rss_mb: f64,
    jvms_started: usize,
    profiles_written: f64,
    dropped: f64,
}

impl Bench {
    /// Runs the daemon whole-host for `minutes` under churn, reading its memory every minute.
    pub(super) fn measure_soak(&self, minutes: u64) -> Result<SoakRun> {
        let mut daemon = self.start_daemon(SOAK_HZ, 15, &[], Ready::Sampling { jvms: 0 }, &[])?;
        daemon.wait_until(Ready::Profiling { jvms: 0 })?;
        let stop = Arc::new(AtomicBool::new(false));
        let jvms = self.churn_jvms(Arc::clone(&stop));
        let short = churn_short_processes(Arc::clone(&stop));
        let started = Instant::now();
        let end = started + Duration::from_secs(minutes * 60);
        let mut readings = Vec::new();
        let mut next = started;
        let result = (|| -> Result<()> {
            while Instant::now() < end {
                if let Some(status) = daemon.process.exit_status()? {
                    anyhow::bail!("the daemon exited during the soak ({status})");
                }
                if Instant::now() >= next {
                    let reading = read_memory(&daemon, started.elapsed())?;
                    self.progress(format_args!(
                        "10. soak minute {:.0}: RSS {:.1} MB (anon {:.1}, file {:.1}), heap in use {:.1} MB, free {:.1} MB",
                        reading.minute,
                        reading.rss_mb,
                        reading.anon_mb,
                        reading.file_mb,
                        reading.heap_in_use_mb,
                        reading.heap_free_mb
                    ));
                    readings.push(reading);
                    next += READING_EVERY;
                }
                thread::sleep(Duration::from_millis(500));
            }
            readings.push(read_memory(&daemon, started.elapsed())?);
            Ok(())
        })();
        stop.store(true, Ordering::Relaxed);
        let jvms_started = jvms.join().unwrap_or(0);
        let _ = short.join();
        result?;
        let metrics = scrape(daemon.metrics)?;
        let peak = peak_rss_mb(daemon.process.pid())?;
        let dropped = super::daemon::loss_metrics()
            .iter()
            .map(|(key, _)| metrics.get(key).unwrap_or(0.0))
            .sum();
        let profiles_written = metrics.get(super::daemon::PROFILES_WRITTEN)?;
        daemon.stop()?;
        Ok(SoakRun {
            minutes,
            readings,
            peak_rss_mb: peak,
            jvms_started,
            profiles_written,
            dropped,
        })
    }

    /// Starts a JVM every [`JVM_EVERY`], each killed after [`JVM_LIFETIME`], until `stop`;
    /// the thread returns how many it started.
    fn churn_jvms(&self, stop: Arc<AtomicBool>) -> thread::JoinHandle<usize> {
        // The command's parts, taken out: the thread cannot borrow the bench.
        let args = ["throughput".to_owned(), "1".to_owned(), "quiet".to_owned()];
        let template = self.java_class_command(&self.jdks[0], &[], "Bench", &args);
        let program = template.get_program().to_owned();
        let args: Vec<_> = template.get_args().map(|arg| arg.to_owned()).collect();
        thread::spawn(move || {
            let mut started = 0;
            while !stop.load(Ordering::Relaxed) {
                let mut command = Command::new(&program);
                command
                    .args(&args)
                    .stdout(Stdio::null())
                    .stderr(Stdio::null());
                if let Ok(jvm) = Guarded::spawn("churn JVM", &mut command) {
                    started += 1;
                    sleep_unless_stopped(&stop, JVM_LIFETIME);
                    drop(jvm);
                }
                sleep_unless_stopped(&stop, JVM_EVERY.saturating_sub(JVM_LIFETIME));
            }
            started
        })
    }
}

/// Starts [`SHORT_PROCESSES_PER_SECOND`] short shell loops a second until `stop`.
fn churn_short_processes(stop: Arc<AtomicBool>) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            for _ in 0..SHORT_PROCESSES_PER_SECOND {
                let _ = Command::new("sh")
                    .args(["-c", "i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done"])
                    .status();
            }
            thread::sleep(Duration::from_secs(1));
        }
    })
}

fn sleep_unless_stopped(stop: &AtomicBool, duration: Duration) {
    let end = Instant::now() + duration;
    while !stop.load(Ordering::Relaxed) && Instant::now() < end {
        thread::sleep(Duration::from_millis(100));
    }
}

fn read_memory(daemon: &super::daemon::Daemon, elapsed: Duration) -> Result<Reading> {
    let pid = daemon.process.pid();
    let metrics = scrape(daemon.metrics)?;
    let mb = |key: &str| metrics.get(key).map(|bytes| bytes / 1e6);
    Ok(Reading {
        minute: elapsed.as_secs_f64() / 60.0,
        rss_mb: status_mb(pid, "VmRSS:")?,
        anon_mb: status_mb(pid, "RssAnon:")?,
        file_mb: status_mb(pid, "RssFile:")?,
        charged_mb: daemon
            .cgroup
            .current()
            .context("reading the daemon's cgroup")? as f64
            / 1e6,
        heap_in_use_mb: mb(&labelled(
            metric::HEAP_BYTES,
            "state",
            metric::heap_state::IN_USE,
        ))?,
        heap_free_mb: mb(&labelled(
            metric::HEAP_BYTES,
            "state",
            metric::heap_state::FREE,
        ))?,
        symbol_cache_mb: mb(metric::SYMBOL_CACHE_BYTES)?,
        unwind_tables_mb: mb(metric::UNWIND_TABLE_BYTES)?,
    })
}

impl SoakRun {
    /// RSS growth from the reading nearest the run's middle to the last one, as a fraction.
    fn second_half_growth(&self) -> f64 {
        let (Some(last), Some(middle)) = (self.readings.last(), self.middle()) else {
            return 0.0;
        };
        (last.rss_mb - middle.rss_mb) / middle.rss_mb.max(1.0)
    }

    fn middle(&self) -> Option<&Reading> {
        let half = self.minutes as f64 / 2.0;
        self.readings
            .iter()
            .min_by(|a, b| (a.minute - half).abs().total_cmp(&(b.minute - half).abs()))
    }

    pub(super) fn rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        let setting = format!(
            "whole host, {SOAK_HZ} Hz, {} min: a JVM every {} s ({} started), {SHORT_PROCESSES_PER_SECOND} short processes a second",
            self.minutes,
            JVM_EVERY.as_secs(),
            self.jvms_started
        );
        let growth = self.second_half_growth();
        let (middle, last) = (self.middle().copied(), self.readings.last().copied());
        let peak_met = self.peak_rss_mb <= MAX_PEAK_RSS_MB;
        let growth_met = growth < MAX_SECOND_HALF_GROWTH;
        let result = match (middle, last) {
            (Some(middle), Some(last)) => format!(
                "peak RSS {:.0} MB; RSS {:.0} MB at minute {:.0}, {:.0} MB at the end ({:+.1}% over the second half); at the end: heap in use {:.0} MB, free {:.0} MB, symbol cache {:.0} MB, unwind tables {:.0} MB, charged {:.0} MB; {:.0} profiles written, {:.0} samples or profiles lost",
                self.peak_rss_mb,
                middle.rss_mb,
                middle.minute,
                last.rss_mb,
                growth * 100.0,
                last.heap_in_use_mb,
                last.heap_free_mb,
                last.symbol_cache_mb,
                last.unwind_tables_mb,
                last.charged_mb,
                self.profiles_written,
                self.dropped
            ),
            _ => "no readings".to_owned(),
        };
        rows.push(Row {
            section: "10",
            measurement: "daemon memory over a long run".to_owned(),
            setting,
            result,
            target: format!(
                "{}; {}",
                verdict(peak_met, &format!("peak <= {MAX_PEAK_RSS_MB:.0} MB")),
                verdict(growth_met, "second half < 5%")
            ),
        });
        if !peak_met || !growth_met {
            notes.push(format!(
                "Soak: peak RSS {:.0} MB (target {MAX_PEAK_RSS_MB:.0}), growth over the second half {:+.1}% (target < 5%); see the minute readings below.",
                self.peak_rss_mb,
                growth * 100.0
            ));
        }
    }

    /// The minute readings, as a Markdown table.
    pub(super) fn readings_table(&self) -> String {
        let mut out = String::from(
            "| minute | RSS MB | anonymous | file | charged | heap in use | heap free | symbol cache | unwind tables |\n|---|---|---|---|---|---|---|---|---|\n",
        );
        for r in &self.readings {
            let _ = writeln!(
                out,
                "| {:.0} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} | {:.1} |",
                r.minute,
                r.rss_mb,
                r.anon_mb,
                r.file_mb,
                r.charged_mb,
                r.heap_in_use_mb,
                r.heap_free_mb,
                r.symbol_cache_mb,
                r.unwind_tables_mb
            );
        }
        out
    }
}

/// How section 10 measures, for the report.
pub(super) fn method() -> String {
    format!(
        "The release daemon runs with its defaults (`cache_budget_mib` 96) on the whole host at {SOAK_HZ} Hz, in a memory cgroup of its own. Churn: a JDK 17 `Bench throughput 1` JVM started every {} s and killed after {} s (a new process with new code each time: its layout, threads, Java names, native symbols), and {SHORT_PROCESSES_PER_SECOND} short shell loops a second. Once a minute: VmRSS, RssAnon and RssFile from /proc/PID/status, the cgroup's charge, `profiler_heap_bytes` (glibc's `mallinfo2`: in use, freed but kept), `profiler_symbol_cache_bytes` and `profiler_unwind_table_bytes`. Peak RSS is VmHWM at the end; growth over the second half is RSS at the end against RSS at the reading nearest the middle.",
        JVM_EVERY.as_secs(),
        JVM_LIFETIME.as_secs()
    )
}
