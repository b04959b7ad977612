//! Where built profiles go. Every output is a [`Sink`]: the local files (`output`), Grafana
//! Pyroscope and the live stream (`export`). Each is built from its own config section, next to
//! its code; `daemon.rs` (`build_sinks`) builds those the config asks for, and the worker hands
//! every profile of an interval to each sink in turn, then tells them the interval is over. A
//! new output (OTLP, say) is one more `Sink` and one more line in `build_sinks`.
//!
//! Sinks run on the symbolizer thread and must not block it: a sink that does network I/O hands
//! profiles to a task of its own through a bounded queue, and counts what it drops.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// The sinks' tasks (an exporter, a server), stopped through one signal at shutdown; each gets
/// its own grace period to deliver what is queued.
pub struct SinkTasks {
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

impl Default for SinkTasks {
    fn default() -> Self {
        Self {
            shutdown: watch::channel(false).0,
            tasks: Vec::new(),
        }
    }
}

impl SinkTasks {
    /// Starts a sink's task; `task` gets the receiver that turns true at shutdown.
    pub fn spawn<F>(&mut self, task: impl FnOnce(watch::Receiver<bool>) -> F)
    where
        F: Future<Output = ()> + Send + 'static,
    {
        self.tasks
            .push(tokio::spawn(task(self.shutdown.subscribe())));
    }

    /// Tells every task to stop and waits for them.
    pub async fn finish(self) {
        let _ = self.shutdown.send(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
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
