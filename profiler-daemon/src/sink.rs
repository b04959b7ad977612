//! Where built profiles go. Every output is a [`Sink`]: the local files (`output`), Grafana
//! Pyroscope and the live stream (`export`). Each is built from its own config section, next to
//! its code, by [`build`]; the worker hands every profile of an interval to each sink in turn and
//! then tells them the interval is over. A new output (OTLP, say) is one more `Sink` and one more
//! line in [`build`].
//!
//! Sinks run on the symbolizer thread and must not block it: a sink that does network I/O hands
//! profiles to a task of its own through a bounded queue, and counts what it drops.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::config::Config;
use crate::export::pyroscope::{ExporterError, PyroscopeSink};
use crate::export::stream::StreamSink;
use crate::metrics::Metrics;
use crate::output::LocalFiles;
use crate::profiles::{BuiltProfile, ProfileKind};

/// One process's profile of one interval, as every sink receives it.
pub struct SinkProfile<'a> {
    pub kind: ProfileKind,
    pub start: SystemTime,
    pub duration: Duration,
    /// The profile with its per-sample thread list (Pyroscope builds its own variant from it).
    pub built: &'a BuiltProfile,
    /// `built.profile`, gzipped once for the sinks that keep or send it as is.
    pub gzipped: &'a Arc<[u8]>,
    pub service_name: &'a str,
    /// The series labels: `__name__` first, then sorted (see `ProcessIdentity::labels`).
    pub labels: &'a [(String, String)],
}

/// An output of built profiles.
pub trait Sink: Send {
    /// For logs.
    fn name(&self) -> &'static str;
    /// Takes one profile. Never blocks (see the module header); failures are the sink's to
    /// count and log.
    fn accept(&mut self, profile: &SinkProfile<'_>);
    /// Every profile of the interval has been given: flush batches, enforce retention.
    fn end_interval(&mut self) {}
}

/// Stops the sinks' tasks at shutdown: they get their grace period to deliver what is queued.
pub struct SinkTasks {
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl SinkTasks {
    pub async fn finish(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// What the sinks need besides their own config sections.
pub struct SinkContext<'a> {
    pub metrics: &'a Metrics,
    /// Told when the sinks' tasks should stop.
    pub stopped: watch::Receiver<bool>,
    /// Tasks the sinks start, awaited at shutdown.
    pub tasks: &'a mut Vec<JoinHandle<()>>,
}

#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot use the output directory {path}: {source}")]
    Output {
        path: std::path::PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Pyroscope(#[from] ExporterError),
    #[error("cannot serve the live profile stream on {address}: {source}")]
    Stream {
        address: std::net::SocketAddr,
        source: std::io::Error,
    },
}

/// The sinks `config` asks for, in the order they receive profiles, and their shutdown handle.
/// Needs the tokio runtime (the network sinks start tasks).
pub async fn build(
    config: &Config,
    metrics: &Metrics,
) -> Result<(Vec<Box<dyn Sink>>, SinkTasks), SinkError> {
    let (shutdown, stopped) = watch::channel(false);
    let mut tasks = Vec::new();
    let mut context = SinkContext {
        metrics,
        stopped,
        tasks: &mut tasks,
    };
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(LocalFiles::new(
        &config.output_dir,
        config.local_output,
        metrics.worker.clone(),
    )?)];
    if let Some(pyroscope) = &config.pyroscope {
        sinks.push(Box::new(PyroscopeSink::start(pyroscope, &mut context)?));
    }
    if let Some(listen) = config.grpc_listen {
        if let Some(stream) = StreamSink::start(listen, &mut context).await? {
            sinks.push(Box::new(stream));
        }
    }
    Ok((sinks, SinkTasks { shutdown, tasks }))
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    /// A sink that counts what it is given, for tests of the worker.
    #[derive(Clone, Default)]
    pub struct Counted {
        pub profiles: Arc<AtomicUsize>,
        pub intervals: Arc<AtomicUsize>,
    }

    impl Sink for Counted {
        fn name(&self) -> &'static str {
            "counted"
        }

        fn accept(&mut self, _: &SinkProfile<'_>) {
            self.profiles.fetch_add(1, Ordering::Relaxed);
        }

        fn end_interval(&mut self) {
            self.intervals.fetch_add(1, Ordering::Relaxed);
        }
    }
}
