//! The `run` command: the sampling loop and the pipeline around it.
//!
//! ```text
//! BPF ring buffer --drain every 250 ms--> Aggregator --interval--> Worker thread --> pprof files
//!                                            \--first sample of a pid--> Worker (reads /proc)
//! Worker --> sinks: local files, Pyroscope exporter task, live-stream server (see `sink`)
//! ```
//! The loop never blocks on the worker: if its queue is full, work is dropped and counted.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender, TrySendError};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use aya::maps::{MapData, RingBuf};
use profiler_common::{Counter, FrameKind, OffCpuEnd, UnwindEnd};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use tokio::signal::unix::{signal, SignalKind};

use crate::aggregate::{Added, Aggregator};
use crate::config::Config;
use crate::export::pyroscope::{ExporterError, PyroscopeSink};
use crate::export::stream::StreamSink;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::thread_directory::ThreadDirectory;
use crate::hotspot::tracker::{self, JvmTracker, TrackerCounts};
use crate::metrics::{Metrics, OffCpuSnapshot, Snapshot};
use crate::native_unwind;
use crate::off_cpu::{OffCpuJoiner, OffCpuStats};
use crate::output::LocalFiles;
use crate::privileges::{self, MissingPrivileges};
use crate::profiles::ProfileKind;
use crate::record::SampleView;
use crate::sampler::{KernelCounters, OffCpuSampling, Sampler, SamplerError};
use crate::sink::{Sink, SinkTasks};
use crate::worker::{JavaFrameSeen, Work, Worker};

/// How often the ring buffer is drained when it does not fill up: each drain is a wake-up of an
/// otherwise idle daemon. Bursts do not wait for it: the BPF side wakes us when the ring is a
/// quarter full (at 1000 Hz on 64 CPUs and 1 KiB records, after about 30 ms).
const DRAIN_PERIOD: Duration = Duration::from_millis(250);
/// After a drain that found nothing (an idle host, or `--pid` targets that sleep), the next one
/// comes this late: on a virtual machine a wake-up costs about 0.1 ms of CPU, and an idle
/// daemon's CPU is mostly its wake-ups. The first samples after a quiet spell wait at most this.
const IDLE_DRAIN_PERIOD: Duration = Duration::from_secs(1);
/// At start-up (the first [`PERISHING_FOR`]), when most new stacks come from JVMs met for the
/// first time, a drain that finds new Java stacks is followed by another this soon, so that
/// their methods are read while they exist.
const STARTUP_JAVA_DRAIN_PERIOD: Duration = Duration::from_millis(50);
/// While Java names perish (the worker found methods of new stacks already unloaded within
/// [`PERISHING_FOR`]), the same, sooner: under class churn a class lives a few hundred
/// milliseconds after its last sample (measured: 50 ms lost about 6% of a churning JVM's
/// samples to unknown frames, 10 ms about 1%). Otherwise the slower period costs no names and
/// saves the wake-ups.
const PERISHING_JAVA_DRAIN_PERIOD: Duration = Duration::from_millis(10);
const PERISHING_FOR: Duration = Duration::from_secs(30);
/// How often the metrics endpoint's snapshot is refreshed, at the next wake-up after it is due
/// (no wake-up of its own: at most [`IDLE_DRAIN_PERIOD`] late).
const METRICS_PERIOD: Duration = Duration::from_secs(1);
/// Work items queued for the worker before the loop starts dropping them.
const WORK_QUEUE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Privileges(#[from] MissingPrivileges),
    #[error("{0}")]
    Sampler(#[from] SamplerError),
    #[error("waiting on the sample ring buffer: {0}")]
    RingWakeups(std::io::Error),
    #[error("signal handler: {0}")]
    Signal(std::io::Error),
    #[error("worker thread: {0}")]
    Worker(String),
    #[error("metrics endpoint {address}: {source}")]
    Metrics {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("output directory {path}: {source}")]
    Output {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error("profile stream (grpc_listen) {address}: {source}")]
    Stream {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Exporter(#[from] ExporterError),
}

impl DaemonError {
    /// Missing privileges exit with 2, like a usage error: the command cannot work as invoked.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Privileges(_) => 2,
            Self::Sampler(err) if err.is_permission_denied() => 2,
            _ => 1,
        }
    }
}

/// What a run did, for the final log line and for tests.
#[derive(Debug, Default)]
pub struct RunSummary {
    pub records: u64,
    pub malformed_records: u64,
    pub dropped_work: u64,
    pub intervals: u64,
    pub profiles_written: u64,
    pub kernel: KernelCounters,
}

/// Counts what the sampling loop saw.
#[derive(Default)]
struct LoopStats {
    records: u64,
    malformed: u64,
    dropped_work: u64,
    /// How user stack walks ended, indexed by `UnwindEnd` (this interval).
    unwind_ends: [u64; UnwindEnd::ALL.len()],
    /// The same, over the whole run.
    unwind_ends_total: [u64; UnwindEnd::ALL.len()],
    dropped_over_stack_bound: u64,
    /// Drains the BPF side asked for (the ring was filling up).
    ring_wakeups: u64,
    /// Records of the off-CPU ring (waits' stacks and ends).
    off_cpu_records: u64,
    /// What the off-CPU joiner counted, as of the last interval.
    off_cpu: OffCpuStats,
    off_cpu_open_waits: u64,
    /// Whether off-CPU profiling is on.
    off_cpu_on: bool,
}

pub async fn run(config: Config) -> Result<RunSummary, DaemonError> {
    privileges::check()?;
    raise_open_files_limit();
    let metrics = Metrics::default();
    // Before the sampler: a bad output directory or a taken stream address stops the start.
    let (sinks, sink_tasks) = build_sinks(&config, &metrics).await?;
    let table_budget = native_unwind::loader::table_budget(config.cache_budget_bytes);
    let mut sampler = Sampler::start(
        config.frequency_hz,
        &config.pids,
        config.max_jvms,
        native_unwind::loader::block_capacity(table_budget),
        config.off_cpu.map(|off_cpu| OffCpuSampling {
            period_ns: off_cpu.period.as_nanos() as u64,
        }),
    )?;
    let java_threads = ThreadDirectory::default();
    // Each JVM inspected once, for the tracker and the symbolizer both.
    let jvms = JvmDirectory::default();
    let tracker = spawn_jvm_tracker(
        sampler.take_hotspot_maps()?,
        sampler.take_process_events()?,
        config.max_jvms as usize,
        config.pids.clone(),
        (java_threads.clone(), jvms.clone()),
    )?;
    tracing::info!(
        frequency_hz = config.frequency_hz,
        cpus = sampler.cpus(),
        interval_s = config.interval.as_secs(),
        output = %config.output_dir.display(),
        pids = ?config.pids,
        "sampling"
    );

    let unwind_tables = spawn_unwind_tables(
        sampler.take_unwind_maps()?,
        table_budget,
        metrics.unwind_tables.clone(),
    )?;
    // Targets named on the command line get their tables before their first sample.
    if !config.pids.is_empty() {
        let _ = unwind_tables.try_send(config.pids.clone());
    }
    if let Some(address) = config.metrics_listen {
        let listener = tokio::net::TcpListener::bind(address)
            .await
            .map_err(|source| DaemonError::Metrics { address, source })?;
        tracing::info!(%address, "serving metrics at /metrics");
        tokio::spawn(crate::metrics::serve(listener, metrics.clone()));
    }

    let (work_tx, work_rx) = sync_channel(WORK_QUEUE);
    let (frequency_hz, annotate) = (config.frequency_hz, config.annotate_frames);
    let worker_counters = metrics.worker.clone();
    let naming = config.naming.clone();
    let extra_labels = config.labels.clone();
    let attach = config.attach.clone();
    // The unwind tables take their share of the one budget; the symbolization caches the rest.
    let cache_budget = config.cache_budget_bytes - table_budget;
    // Built on its own thread: blazesym's symbolizer is not Send.
    let pods = match &config.kubernetes_node {
        Some(node) => start_pod_watch(node.clone()).await,
        None => None,
    };
    let worker = std::thread::Builder::new()
        .name("symbolizer".into())
        .spawn(move || {
            Worker::new(sinks, naming, frequency_hz, annotate, worker_counters)
                .with_cache_budget(cache_budget)
                .with_attach(attach)
                .with_thread_directory(java_threads)
                .with_jvms(jvms)
                .with_pods_if(pods)
                .with_extra_labels(extra_labels)
                .run(work_rx)
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;

    let mut sigterm = signal(SignalKind::terminate()).map_err(DaemonError::Signal)?;
    let mut sigint = signal(SignalKind::interrupt()).map_err(DaemonError::Signal)?;
    let stop_at = config.duration.map(|d| tokio::time::Instant::now() + d);
    let stop = async {
        match stop_at {
            Some(at) => tokio::time::sleep_until(at).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(stop);

    let mut aggregator = Aggregator::new(config.max_stacks_per_interval);
    let mut off_cpu = config.off_cpu.map(|off_cpu| OffCpu {
        joiner: OffCpuJoiner::new(off_cpu.min_wait.as_nanos() as u64),
        aggregator: Aggregator::of_kind(ProfileKind::OffCpu, config.max_stacks_per_interval),
    });
    let mut stats = LoopStats {
        off_cpu_on: sampler.off_cpu(),
        ..LoopStats::default()
    };
    let mut drain = tokio::time::interval(DRAIN_PERIOD);
    drain.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let ring_wakeups = sampler
        .ring_wakeups()
        .and_then(|fd| {
            // SAFETY: the descriptor is owned by the AsyncFd, so it stays open and the same.
            unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(Into::into)
        })
        .map_err(DaemonError::RingWakeups)?;
    let mut flush = tokio::time::interval_at(
        tokio::time::Instant::now() + config.interval,
        config.interval,
    );
    let mut last_counters = sampler.counters();
    let mut intervals = 0;
    let mut last_misses = 0;
    let started = tokio::time::Instant::now();
    let mut missed_at: Option<tokio::time::Instant> = None;
    let mut published: Option<tokio::time::Instant> = None;
    let cpus = sampler.cpus();

    loop {
        if published.is_none_or(|at| at.elapsed() >= METRICS_PERIOD) {
            published = Some(tokio::time::Instant::now());
            metrics.publish(snapshot(
                &stats,
                sampler.counters(),
                tracker.counts(),
                intervals,
                cpus,
                frequency_hz,
            ));
        }
        let finishing = tokio::select! {
            _ = drain.tick() => false,
            ready = ring_wakeups.readable() => {
                // Edge-triggered: the next wake-up comes with the next fill, after this drain.
                if let Ok(mut guard) = ready {
                    guard.clear_ready();
                }
                stats.ring_wakeups += 1;
                drain.reset();
                false
            }
            _ = flush.tick() => {
                drain_ring(&mut sampler, &mut aggregator, off_cpu.as_mut(), &work_tx, &unwind_tables, &mut stats);
                let counters = sampler.counters();
                end_interval(&mut aggregator, off_cpu.as_mut(), &work_tx, &mut stats, &counters.since(&last_counters), &tracker);
                last_counters = counters;
                intervals += 1;
                continue;
            }
            _ = sigterm.recv() => { tracing::info!("SIGTERM: writing the current interval, then exiting"); true }
            _ = sigint.recv() => { tracing::info!("SIGINT: writing the current interval, then exiting"); true }
            _ = &mut stop => { tracing::info!("duration reached"); true }
        };
        let records_before = stats.records;
        let found_java = drain_ring(
            &mut sampler,
            &mut aggregator,
            off_cpu.as_mut(),
            &work_tx,
            &unwind_tables,
            &mut stats,
        );
        let misses = metrics.worker.java_prefetch_misses.load(Ordering::Relaxed);
        if misses != last_misses {
            last_misses = misses;
            missed_at = Some(tokio::time::Instant::now());
        }
        drain.reset_after(next_drain(Drained {
            records: stats.records != records_before,
            new_java_stacks: found_java,
            names_perishing: missed_at.is_some_and(|at| at.elapsed() < PERISHING_FOR),
            starting: started.elapsed() < PERISHING_FOR,
        }));
        if finishing {
            let counters = sampler.counters();
            end_interval(
                &mut aggregator,
                off_cpu.as_mut(),
                &work_tx,
                &mut stats,
                &counters.since(&last_counters),
                &tracker,
            );
            intervals += 1;
            break;
        }
    }

    // Detach the sampler first: no new samples while the last interval is written.
    let kernel = sampler.counters();
    drop(sampler);
    tracker.stop();
    drop(work_tx);
    worker
        .join()
        .map_err(|_| DaemonError::Worker("panicked".into()))?;
    // Every profile is now queued: deliver what can be within the grace period.
    sink_tasks.finish().await;
    let summary = RunSummary {
        records: stats.records,
        malformed_records: stats.malformed,
        dropped_work: stats.dropped_work,
        intervals,
        profiles_written: metrics
            .worker
            .profiles_written
            .load(std::sync::atomic::Ordering::Relaxed),
        kernel,
    };
    tracing::info!(
        records = summary.records,
        malformed = summary.malformed_records,
        dropped_work = summary.dropped_work,
        profiles = summary.profiles_written,
        bpf_samples = kernel.get(Counter::Samples),
        bpf_sent = kernel.get(Counter::Sent),
        bpf_ring_full = kernel.get(Counter::RingFull),
        "stopped"
    );
    if config.pyroscope.is_some() {
        let export = &metrics.export;
        let get = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        tracing::info!(
            exported_profiles = get(&export.exported_profiles),
            exported_requests = get(&export.exported_requests),
            retries = get(&export.failed_attempts),
            dropped_queue_full = get(&export.dropped_queue_full),
            dropped_at_shutdown = get(&export.dropped_at_shutdown),
            rejected = get(&export.rejected),
            "pyroscope export totals"
        );
    }
    Ok(summary)
}

/// Raises the soft limit on open files to the hard one: services start with a soft limit of
/// 1024 (systemd's default), and a daemon out of descriptors opens no `/proc` file, so profiles
/// nothing. The hard limit is what whoever started the daemon granted.
fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills our struct.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return;
    }
    let soft = limit.rlim_cur;
    limit.rlim_cur = limit.rlim_max;
    // SAFETY: setrlimit reads our struct; raising the soft limit up to the hard one needs no
    // privilege.
    if soft < limit.rlim_max && unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) } != 0 {
        tracing::warn!(
            soft,
            hard = limit.rlim_max,
            error = %std::io::Error::last_os_error(),
            "cannot raise the open-files limit"
        );
        return;
    }
    tracing::info!(open_files = limit.rlim_max, was = soft, "open-files limit");
}

/// The sinks `config` asks for, in the order they receive profiles, and their tasks.
async fn build_sinks(
    config: &Config,
    metrics: &Metrics,
) -> Result<(Vec<Box<dyn Sink>>, SinkTasks), DaemonError> {
    let mut tasks = SinkTasks::default();
    let local = LocalFiles::new(
        &config.output_dir,
        config.local_output,
        config.threads,
        metrics.worker.clone(),
    )
    .map_err(|source| DaemonError::Output {
        path: config.output_dir.clone(),
        source,
    })?;
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(local)];
    if let Some(pyroscope) = &config.pyroscope {
        let sink = PyroscopeSink::start(
            pyroscope,
            config.threads,
            metrics.export.clone(),
            &mut tasks,
        )?;
        sinks.push(Box::new(sink));
    }
    if let Some(listen) = config.grpc_listen {
        let stream = StreamSink::start(listen, metrics.export.clone(), &mut tasks)
            .await
            .map_err(|source| DaemonError::Stream {
                address: listen.address,
                source,
            })?;
        sinks.extend(stream.map(|stream| Box::new(stream) as Box<dyn Sink>));
    }
    Ok((sinks, tasks))
}

/// Watches this node's pods, for the Kubernetes labels of processes. An unreachable API server
/// or missing credentials only cost the labels: logged, never fatal.
async fn start_pod_watch(node: String) -> Option<crate::kubernetes::SharedPodIndex> {
    match kube::Client::try_default().await {
        Ok(client) => {
            let pods = crate::kubernetes::SharedPodIndex::default();
            tracing::info!(%node, "kubernetes: watching this node's pods");
            tokio::spawn(crate::kubernetes::watch_node_pods(
                client,
                node,
                pods.clone(),
            ));
            Some(pods)
        }
        Err(err) => {
            tracing::warn!(%err, "kubernetes: no API client (no in-cluster config or kubeconfig); profiles keep container ids only");
            None
        }
    }
}

/// The JVM tracker's thread, stopped through a flag.
struct TrackerThread {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<TrackerCounts>>,
    /// The pids of each interval's samples.
    sampled: SyncSender<Vec<u32>>,
    handle: std::thread::JoinHandle<()>,
}

impl TrackerThread {
    fn counts(&self) -> TrackerCounts {
        self.counts.lock().map(|c| *c).unwrap_or_default()
    }

    /// Tells the tracker which processes were sampled (it checks those it does not know).
    fn tell_sampled(&self, pids: Vec<u32>) {
        // A full queue means the tracker is behind: it will see these at its next rescan.
        let _ = self.sampled.try_send(pids);
    }

    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.handle.join();
    }
}

/// The unwind tables' loader thread (`native_unwind::loader`); it ends when the sender is
/// dropped.
fn spawn_unwind_tables(
    maps: native_unwind::loader::BpfTableMaps,
    budget_bytes: u64,
    stats: Arc<native_unwind::loader::TableStats>,
) -> Result<SyncSender<Vec<u32>>, DaemonError> {
    let (sampled, sampled_rx) = sync_channel::<Vec<u32>>(16);
    std::thread::Builder::new()
        .name("unwind-tables".into())
        .spawn(move || {
            native_unwind::loader::UnwindTables::new(maps, budget_bytes, stats).run(sampled_rx)
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;
    Ok(sampled)
}

fn spawn_jvm_tracker(
    maps: tracker::BpfMaps,
    mut process_events: RingBuf<MapData>,
    max_jvms: usize,
    pids: Vec<u32>,
    (threads, jvms): (ThreadDirectory, JvmDirectory),
) -> Result<TrackerThread, DaemonError> {
    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(Mutex::new(TrackerCounts::default()));
    let (sampled, sampled_rx) = sync_channel::<Vec<u32>>(4);
    let (stop_flag, shared_counts) = (stop.clone(), counts.clone());
    let handle = std::thread::Builder::new()
        .name("jvm-tracker".into())
        .spawn(move || {
            let mut tracker = JvmTracker::new(maps, max_jvms, pids)
                .with_directory(threads)
                .with_jvms(jvms);
            let mut events = Vec::new();
            let mut panics = 0;
            while !stop_flag.load(Ordering::Relaxed) {
                // Reading an empty ring is two loads from shared memory: no syscall.
                events.clear();
                while let Some(item) = process_events.next() {
                    if let Some(event) = profiler_common::ProcessEvent::from_bytes(&item) {
                        events.push(event);
                    }
                }
                let sampled: Vec<u32> = sampled_rx.try_iter().flatten().collect();
                // The tracker reads every JVM's memory and /proc entries: a bug that input
                // trips costs this tick, not the node's JVM tracking.
                let ticked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    tracker.tick(&events, &sampled)
                }));
                if ticked.is_err() {
                    panics += 1;
                    tracing::error!(
                        "the JVM tracker panicked (a bug; please report it with the log above): \
                         that tick is lost, tracking goes on"
                    );
                }
                if let Ok(mut counts) = shared_counts.lock() {
                    *counts = TrackerCounts {
                        panics,
                        ..tracker.counts()
                    };
                }
                std::thread::sleep(tracker::TICK_PERIOD);
            }
        })
        .map_err(|err| DaemonError::Worker(err.to_string()))?;
    Ok(TrackerThread {
        stop,
        counts,
        sampled,
        handle,
    })
}

/// Most Java frames in one prefetch message (24 bytes each): a drain that finds more new stacks
/// sends several, and the worker queue's bound applies to them as to any work.
const MAX_PREFETCH_FRAMES: usize = 16 * 1024;

/// Takes every record in the ring; true if new stacks with Java frames were found.
/// What a drain found, and in which phase of the daemon.
#[derive(Clone, Copy, Debug)]
struct Drained {
    records: bool,
    new_java_stacks: bool,
    names_perishing: bool,
    starting: bool,
}

/// How long until the next drain. While names perish, every new stack is read within
/// [`STARTUP_JAVA_DRAIN_PERIOD`] at most, even after a drain without one: the slow periods would
/// let an nmethod be freed (and its `Method*`s reused) before its first sample is named.
fn next_drain(drained: Drained) -> Duration {
    match drained {
        Drained {
            names_perishing: true,
            new_java_stacks: true,
            ..
        } => PERISHING_JAVA_DRAIN_PERIOD,
        Drained {
            names_perishing: true,
            ..
        }
        | Drained {
            starting: true,
            new_java_stacks: true,
            ..
        } => STARTUP_JAVA_DRAIN_PERIOD,
        Drained { records: false, .. } => IDLE_DRAIN_PERIOD,
        _ => DRAIN_PERIOD,
    }
}

/// Off-CPU profiling's state in the sampling loop: waits whose end has not come, and the
/// interval's folded waits.
struct OffCpu {
    joiner: OffCpuJoiner,
    aggregator: Aggregator,
}

fn drain_ring(
    sampler: &mut Sampler,
    aggregator: &mut Aggregator,
    off_cpu: Option<&mut OffCpu>,
    work: &SyncSender<Work>,
    unwind_tables: &SyncSender<Vec<u32>>,
    stats: &mut LoopStats,
) -> bool {
    let mut found = FoundInDrain::default();
    sampler.drain(|bytes| {
        stats.records += 1;
        let Some(view) = parse_record(bytes, stats) else {
            return;
        };
        if let Some(end) = view.user_end() {
            stats.unwind_ends[end as usize] += 1;
            stats.unwind_ends_total[end as usize] += 1;
        }
        let added = aggregator.add(&view);
        found.note(&view, added, work, stats);
    });
    if let Some(off_cpu) = off_cpu {
        let OffCpu { joiner, aggregator } = off_cpu;
        sampler.drain_off_cpu(|bytes| {
            stats.off_cpu_records += 1;
            if let Some(end) = OffCpuEnd::from_bytes(bytes) {
                joiner.end(&end, aggregator, |view, added| {
                    found.note(view, added, work, stats)
                });
                return;
            }
            if let Some(view) = parse_record(bytes, stats) {
                joiner.stack(&view, bytes);
            }
        });
    }
    found.finish(work, unwind_tables, stats)
}

/// Parses a ring record; a malformed one is counted (and the first logged).
fn parse_record<'a>(bytes: &'a [u8], stats: &mut LoopStats) -> Option<SampleView<'a>> {
    match SampleView::parse(bytes) {
        Ok(view) => Some(view),
        Err(err) => {
            stats.malformed += 1;
            if stats.malformed == 1 {
                tracing::warn!(%err, "malformed sample record (further ones are only counted)");
            }
            None
        }
    }
}

/// What one drain found that the other threads must hear of: new processes, and the Java
/// frames of new stacks.
#[derive(Default)]
struct FoundInDrain {
    java_frames: Vec<JavaFrameSeen>,
    new_processes: Vec<u32>,
    sent_java: bool,
}

impl FoundInDrain {
    fn note(
        &mut self,
        view: &SampleView<'_>,
        added: Added,
        work: &SyncSender<Work>,
        stats: &mut LoopStats,
    ) {
        if added == Added::NewProcess {
            send(work, Work::ProcessSeen(view.pid()), stats);
            self.new_processes.push(view.pid());
        }
        // The Java frames of a new stack are read soon, in one batch per drain: the methods of
        // short-lived classes may be unloaded (their memory reused) before the interval ends.
        if matches!(added, Added::NewProcess | Added::NewStack) {
            let pid = view.pid();
            self.java_frames.extend(
                view.user_frames()
                    .filter(|frame| frame.kind() != Some(FrameKind::Native))
                    .map(|frame| JavaFrameSeen { pid, frame }),
            );
            if self.java_frames.len() >= MAX_PREFETCH_FRAMES {
                self.sent_java = true;
                send(
                    work,
                    Work::PrefetchJava(std::mem::take(&mut self.java_frames)),
                    stats,
                );
            }
        }
    }

    /// Sends what is left; true if new stacks with Java frames were found.
    fn finish(
        mut self,
        work: &SyncSender<Work>,
        unwind_tables: &SyncSender<Vec<u32>>,
        stats: &mut LoopStats,
    ) -> bool {
        // A full queue means the loader is behind (building tables): these processes come again
        // at their first sample of the next interval.
        if !self.new_processes.is_empty() {
            self.new_processes.sort_unstable();
            self.new_processes.dedup();
            let _ = unwind_tables.try_send(self.new_processes);
        }
        let found_java = self.sent_java || !self.java_frames.is_empty();
        if !self.java_frames.is_empty() {
            send(work, Work::PrefetchJava(self.java_frames), stats);
        }
        found_java
    }
}

fn end_interval(
    aggregator: &mut Aggregator,
    off_cpu: Option<&mut OffCpu>,
    work: &SyncSender<Work>,
    stats: &mut LoopStats,
    kernel: &KernelCounters,
    tracker: &TrackerThread,
) {
    let interval = aggregator.take_interval();
    tracker.tell_sampled(interval.processes.keys().copied().collect());
    let jvms = tracker.counts();
    stats.dropped_over_stack_bound += interval.dropped_over_bound;
    tracing::info!(
        processes = interval.processes.len(),
        samples = kernel.get(Counter::Samples),
        sent = kernel.get(Counter::Sent),
        idle = kernel.get(Counter::Idle),
        filtered = kernel.get(Counter::Filtered),
        ring_full = kernel.get(Counter::RingFull),
        kernel_stack_failed = kernel.get(Counter::KernelStackFailed),
        user_stack_truncated = kernel.get(Counter::UserStackTruncated),
        malformed_records = stats.malformed,
        dropped_work = stats.dropped_work,
        unwind_ends = %format_unwind_ends(&stats.unwind_ends),
        jvms_ready = jvms.jvms_ready,
        jvms_pending = jvms.jvms_pending,
        jvms_failed = jvms.jvms_failed,
        jvms_over_bound = jvms.jvms_over_bound,
        "interval sampled"
    );
    stats.unwind_ends = Default::default();
    let mut intervals = vec![interval];
    if let Some(off_cpu) = off_cpu {
        let interval = off_cpu.aggregator.take_interval();
        // Waits whose end was lost would stay open for good: forget those of exited processes
        // (a check per process with open waits, once an interval).
        off_cpu
            .joiner
            .forget_waits_of_exited(crate::process_key::ProcessKey::of_live);
        stats.off_cpu = off_cpu.joiner.stats;
        stats.off_cpu_open_waits = off_cpu.joiner.open_waits() as u64;
        tracing::info!(
            processes = interval.processes.len(),
            switches = kernel.get(Counter::OffCpuSwitches),
            sampled = kernel.get(Counter::OffCpuSampled),
            ring_full = kernel.get(Counter::OffCpuRingFull),
            no_storage = kernel.get(Counter::OffCpuNoStorage),
            open_waits = stats.off_cpu_open_waits,
            "off-CPU interval sampled"
        );
        intervals.push(interval);
    }
    send(work, Work::Interval(intervals), stats);
}

fn snapshot(
    stats: &LoopStats,
    kernel: KernelCounters,
    jvms: TrackerCounts,
    intervals: u64,
    cpus: usize,
    frequency_hz: u64,
) -> Snapshot {
    Snapshot {
        kernel,
        records: stats.records,
        malformed_records: stats.malformed,
        dropped_work: stats.dropped_work,
        dropped_over_stack_bound: stats.dropped_over_stack_bound,
        ring_wakeups: stats.ring_wakeups,
        unwind_ends: stats.unwind_ends_total,
        jvms,
        intervals,
        cpus,
        frequency_hz,
        off_cpu: stats.off_cpu_on.then_some(OffCpuSnapshot {
            joined: stats.off_cpu,
            open_waits: stats.off_cpu_open_waits,
        }),
    }
}

fn format_unwind_ends(ends: &[u64; UnwindEnd::ALL.len()]) -> String {
    UnwindEnd::ALL
        .iter()
        .map(|end| format!("{}={}", end.name(), ends[*end as usize]))
        .collect::<Vec<_>>()
        .join(",")
}

fn send(work: &SyncSender<Work>, item: Work, stats: &mut LoopStats) {
    match work.try_send(item) {
        Ok(()) => {}
        Err(TrySendError::Full(_)) => {
            stats.dropped_work += 1;
            // Counted every time, logged at 1, 2, 4, 8... drops: never a log line per sample.
            if stats.dropped_work.is_power_of_two() {
                tracing::warn!(
                    dropped = stats.dropped_work,
                    "symbolizer queue full: work dropped"
                );
            }
        }
        Err(TrySendError::Disconnected(_)) => stats.dropped_work += 1,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drained(records: bool, new_java_stacks: bool, names_perishing: bool) -> Drained {
        Drained {
            records,
            new_java_stacks,
            names_perishing,
            starting: false,
        }
    }

    #[test]
    fn perishing_names_keep_drains_fast_even_after_an_empty_drain() {
        assert_eq!(
            next_drain(drained(true, true, true)),
            PERISHING_JAVA_DRAIN_PERIOD
        );
        assert_eq!(
            next_drain(drained(true, false, true)),
            STARTUP_JAVA_DRAIN_PERIOD
        );
        assert_eq!(
            next_drain(drained(false, false, true)),
            STARTUP_JAVA_DRAIN_PERIOD
        );
    }

    #[test]
    fn quiet_drains_slow_down() {
        assert_eq!(next_drain(drained(true, false, false)), DRAIN_PERIOD);
        assert_eq!(next_drain(drained(false, false, false)), IDLE_DRAIN_PERIOD);
        let starting = Drained {
            starting: true,
            ..drained(true, true, false)
        };
        assert_eq!(next_drain(starting), STARTUP_JAVA_DRAIN_PERIOD);
        let starting_quiet = Drained {
            starting: true,
            ..drained(false, false, false)
        };
        assert_eq!(next_drain(starting_quiet), IDLE_DRAIN_PERIOD);
    }
}
