//! The `run` command: the pipeline around the sampling loop, built and shut down here (the
//! composition root): the sampler, the JVM tracker and unwind tables' threads (`threads`), the
//! worker, the sinks, then the loop (`sampling_loop`) until a signal or the run's duration.
//!
//! ```text
//! BPF ring buffer --drain every 250 ms--> Aggregator --interval--> Worker thread --> pprof files
//!                                            \--first sample of a pid--> Worker (reads /proc)
//! Worker --> sinks: local files, Pyroscope exporter task, live-stream server (see `sink`)
//! ```

mod metric_sources;
mod sampling_loop;
mod threads;

use std::sync::atomic::Ordering;
use std::sync::mpsc::sync_channel;

use profiler_common::Counter;

use crate::config::Config;
use crate::export::grpc::ExporterError;
use crate::export::otlp::OtlpSink;
use crate::export::pyroscope::PyroscopeSink;
use crate::export::stream::StreamSink;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::libjvm_hooks::LibjvmHooks;
use crate::hotspot::thread_directory::ThreadDirectory;
use crate::kernel_features::BpfObject;
use crate::metrics::Metrics;
use crate::native_unwind;
use crate::output::LocalFiles;
use crate::privileges::{self, MissingPrivileges};
use crate::sampler::{AllocSampling, KernelCounters, OffCpuSampling, Sampler, SamplerError};
use crate::sidecar::{Attacher, AttachesStarted};
use crate::sink::{Sink, SinkTasks};
use crate::symbolize::java_reader::MemoryNameCaches;
use metric_sources::Counters;
use sampling_loop::{LoopSettings, Outbox, SamplingLoop, Until};
use threads::{
    spawn_java_reader, spawn_jvm_tracker, spawn_unwind_tables, spawn_worker, SharedWithWorker,
};

/// Work items queued for the worker before the loop starts dropping them.
const WORK_QUEUE: usize = 4096;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Privileges(#[from] MissingPrivileges),
    #[error("{0}")]
    Sampler(#[from] SamplerError),
    #[error(transparent)]
    ObjectOverride(#[from] crate::kernel_features::BadObjectOverride),
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

/// The longest sampling waits for the JVM tracker's first pass (reading `/proc` and each JVM
/// found; tens of milliseconds on a node of a few JVMs).
const FIRST_TRACKER_TICK_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

pub async fn run(config: Config) -> Result<RunSummary, DaemonError> {
    privileges::check()?;
    raise_open_files_limit();
    let metrics = Counters::default();
    metrics
        .worker
        .alloc_profiling
        .store(config.alloc.is_some(), std::sync::atomic::Ordering::Relaxed);
    // Before the sampler: a bad output directory or a taken stream address stops the start.
    let (sinks, sink_tasks) = build_sinks(&config, &metrics).await?;
    let table_budget = native_unwind::loader::table_budget(config.cache_budget_bytes);
    let choice = crate::kernel_features::choose_object()?;
    // Lock profiles are made of off-CPU waits: they sample them too.
    let off_cpu = config
        .off_cpu
        .map(|off_cpu| off_cpu.period)
        .or(config.lock.map(|_| crate::off_cpu::DEFAULT_OFF_CPU_PERIOD))
        .map(|period| OffCpuSampling {
            period_ns: period.as_nanos() as u64,
            monitor_waits: config.lock.is_some(),
            virtual_thread_waits: config.virtual_thread_waits,
        });
    let alloc = config.alloc.map(|alloc| AllocSampling {
        interval_bytes: alloc.interval_bytes,
        agent: config.attach.agent_path(),
    });
    let start = |object| {
        Sampler::start(
            object,
            config.frequency_hz,
            &config.pids,
            config.max_jvms,
            native_unwind::loader::block_capacity(table_budget),
            off_cpu,
            alloc.clone(),
        )
    };
    let mut sampler = match start(choice.object) {
        // A kernel whose probes promise the default object and whose verifier still refuses
        // it (a backport half done) gets the older path rather than no profiles.
        Err(err)
            if choice.object == BpfObject::Default
                && !choice.forced
                && !err.is_permission_denied() =>
        {
            tracing::warn!(%err, "the default BPF object was refused; loading the compat one");
            crate::kernel_features::record_fallback();
            start(BpfObject::Compat)?
        }
        started => started?,
    };
    // The tracker attaches and releases the libjvm hooks (thread start, allocation events),
    // with handles of its own on the programs, as it finds JVMs and sees them exit.
    // Handles of their own need CAP_SYS_ADMIN (the kernel's program-by-id lookup): without it,
    // threads are still found by the thread lists' reads; allocation profiling cannot go on.
    let libjvm_hooks = match sampler.hook_programs() {
        Ok(programs) => {
            Some(LibjvmHooks::new(programs).with_code_frees(sampler.take_code_frees()?))
        }
        Err(err) if config.alloc.is_none() => {
            tracing::warn!(
                %err,
                "libjvm hooks unavailable: Java threads are found by their JVMs' thread list \
                 reads alone (every 500 ms)"
            );
            None
        }
        Err(err) => return Err(err.into()),
    };
    let java_threads = ThreadDirectory::default();
    // Each JVM inspected once, for the tracker and the symbolizer both.
    let jvms = JvmDirectory::default();
    // The tracker decides which JVMs get the sidecar agent; the symbolizer expects their records.
    let attaches = AttachesStarted::default();
    let hotspot_maps = sampler.take_hotspot_maps()?;
    // The tracker starts and stops the ended threads' counts; the worker reads them.
    let exit_counts = hotspot_maps.exits.clone();
    let mut tracker = spawn_jvm_tracker(
        hotspot_maps,
        sampler.take_process_events()?,
        config.max_jvms as usize,
        config.pids.clone(),
        (java_threads.clone(), jvms.clone()),
        match config.alloc {
            Some(alloc) => Attacher::new(config.attach.clone(), attaches.clone())
                .with_allocation_sampling(alloc.interval_bytes),
            None => Attacher::new(config.attach.clone(), attaches.clone()),
        },
        libjvm_hooks,
    )?;

    let unwind_tables = spawn_unwind_tables(
        sampler.take_unwind_maps()?,
        table_budget,
        metrics.unwind_tables.clone(),
    )?;
    // Targets named on the command line get their tables before their first sample.
    if !config.pids.is_empty() {
        let _ = unwind_tables.try_send(config.pids.clone());
    }
    // Sampling starts once the tracker has pushed the layouts of the JVMs already running
    // (their first samples would otherwise walk compiled code as native code), and after every
    // other program loaded (the verifier takes up to a second for some).
    tracker.first_tick(FIRST_TRACKER_TICK_WAIT).await;
    sampler.start_sampling()?;
    tracing::info!(
        frequency_hz = config.frequency_hz,
        cpus = sampler.cpus(),
        interval_s = config.interval.as_secs(),
        output = %config.output_dir.display(),
        pids = ?config.pids,
        "sampling"
    );
    if let Some(address) = config.metrics_listen {
        let listener = crate::metrics::connections::listen(address)
            .map_err(|source| DaemonError::Metrics { address, source })?;
        tracing::info!(%address, "serving metrics at /metrics");
        let sources = metrics.sources(tracker.shared_counts());
        tokio::spawn(crate::metrics::serve(listener, Metrics::new(sources)));
    }

    let (work_tx, work_rx) = sync_channel(WORK_QUEUE);
    let memory_names = MemoryNameCaches::default();
    let (java_frames, java_reader) = spawn_java_reader(
        (memory_names.clone(), jvms.clone()),
        work_tx.clone(),
        metrics.worker.java_reader.clone(),
    )?;
    let pods = match &config.kubernetes_node {
        Some(node) => start_pod_watch(node.clone()).await,
        None => None,
    };
    let worker = spawn_worker(
        &config,
        (sinks, metrics.worker.clone()),
        // The unwind tables take their share of the one budget; the symbolization caches the
        // rest.
        config.cache_budget_bytes - table_budget,
        SharedWithWorker {
            java_threads,
            jvms,
            memory_names,
            attaches,
            pods,
            exit_counts,
            kernel_names: sampler.take_kernel_names(),
            unwind_tables: unwind_tables.clone(),
        },
        work_rx,
    )?;
    let frequency_hz = config.frequency_hz;

    let until = Until {
        stop_at: config.duration.map(|d| tokio::time::Instant::now() + d),
        interval: config.interval,
    };
    let outbox = Outbox {
        work: work_tx,
        java_frames,
        unwind_tables,
    };
    let settings = LoopSettings {
        max_stacks_per_interval: config.max_stacks_per_interval,
        virtual_thread_ids: config.virtual_thread_ids,
        stack_memory_bytes: config.stack_memory_bytes,
        off_cpu: config.off_cpu,
        lock: config.lock,
        alloc: config.alloc,
    };
    let ended = SamplingLoop::new(sampler, outbox, tracker, settings)
        .run(until, &metrics.sampling, &metrics.worker, frequency_hz)
        .await?;
    // The sampler is detached and the work queue closed: the worker writes the last interval.
    ended.tracker.stop();
    worker
        .join()
        .map_err(|_| DaemonError::Worker("panicked".into()))?;
    let _ = java_reader.join();
    // Every profile is now queued: deliver what can be within the grace period.
    sink_tasks.finish().await;
    let summary = RunSummary {
        records: ended.stats.records,
        malformed_records: ended.stats.malformed,
        dropped_work: ended.stats.dropped_work,
        intervals: ended.intervals,
        profiles_written: metrics
            .worker
            .profiles_written
            .load(std::sync::atomic::Ordering::Relaxed),
        kernel: ended.kernel,
    };
    log_totals(&summary, &metrics);
    Ok(summary)
}

/// The run's last log lines: what was sampled and written, and what each remote sink exported.
fn log_totals(summary: &RunSummary, metrics: &Counters) {
    let kernel = summary.kernel;
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
    for (sink, export) in metrics.export.sinks() {
        let get = |counter: &std::sync::atomic::AtomicU64| counter.load(Ordering::Relaxed);
        tracing::info!(
            sink,
            exported_profiles = get(&export.exported_profiles),
            exported_requests = get(&export.exported_requests),
            retries = get(&export.failed_attempts),
            dropped_queue_full = get(&export.dropped_queue_full),
            dropped_at_shutdown = get(&export.dropped_at_shutdown),
            rejected = get(&export.rejected),
            "export totals"
        );
    }
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
    metrics: &Counters,
) -> Result<(Vec<Box<dyn Sink>>, SinkTasks), DaemonError> {
    let mut tasks = SinkTasks::default();
    let local = LocalFiles::new(
        &config.output_dir,
        config.local_output,
        metrics.worker.clone(),
    )
    .map_err(|source| DaemonError::Output {
        path: config.output_dir.clone(),
        source,
    })?;
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(local)];
    if let Some(pyroscope) = &config.pyroscope {
        let sink = PyroscopeSink::start(pyroscope, metrics.export.clone(), &mut tasks)?;
        sinks.push(Box::new(sink));
    }
    if let Some(otlp) = &config.otlp {
        let sink = OtlpSink::start(
            otlp,
            config.kubernetes_node.as_deref(),
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
