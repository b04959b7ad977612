//! Where symbolized profiles go. Every output is a [`Sink`]: the local files (`output`), Grafana
//! Pyroscope, OTLP and the live stream (`export`). Each is built from its own config section,
//! next to its code; `daemon.rs` (`build_sinks`) builds those the config asks for, and the
//! worker hands every profile of an interval to each sink in turn, then tells them the interval
//! is over. A new output is one more `Sink` and one more line in `build_sinks`.
//!
//! Every sink encodes the same [`SymbolizedProfile`]; what several of them need is made once,
//! on the first one's request ([`SinkProfile::local_pprof`], [`SinkProfile::remote_variant`]).
//!
//! Sinks run on the symbolizer thread and must not block it: a sink that does network I/O hands
//! profiles to a task of its own through a bounded queue, and counts what it drops.

use std::cell::OnceCell;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::pprof::{self, proto};
use crate::profile_model::SymbolizedProfile;
use crate::remote_variant::remote_variant;
use crate::thread_roots::ThreadRoots;
use crate::virtual_thread_roots::VirtualThreadRoots;

/// How profiles are shown, the same for every sink.
#[derive(Clone, Copy, Debug, Default)]
pub struct Presentation {
    /// Frame names with their kind's suffix where names are written for people (pprof, SVG).
    pub annotate_frames: bool,
    /// How the remote sinks' stacks and the local flame graphs show their thread.
    pub threads: ThreadRoots,
    /// What virtual threads' stacks are shown on (applied as profiles are built).
    pub virtual_threads: VirtualThreadRoots,
}

/// One process's profile of one interval, as every sink receives it.
pub struct SinkProfile<'a> {
    pub profile: &'a SymbolizedProfile,
    pub service_name: &'a str,
    /// The series labels: `__name__` first, then sorted (see `ProcessIdentity::labels`).
    pub labels: &'a [(String, String)],
    pub presentation: Presentation,
    encoded: Encoded,
}

/// The local files' pprof: what the files and the live stream carry.
pub struct LocalPprof {
    pub profile: proto::Profile,
    /// `profile`, gzipped once for the sinks that keep or send it as is.
    pub gzipped: Arc<[u8]>,
}

/// What sinks share, made on the first request.
#[derive(Default)]
struct Encoded {
    local: OnceCell<std::io::Result<LocalPprof>>,
    remote: OnceCell<Arc<SymbolizedProfile>>,
}

impl<'a> SinkProfile<'a> {
    pub fn new(
        profile: &'a SymbolizedProfile,
        service_name: &'a str,
        labels: &'a [(String, String)],
        presentation: Presentation,
    ) -> Self {
        Self {
            profile,
            service_name,
            labels,
            presentation,
            encoded: Encoded::default(),
        }
    }

    /// The profile as the local files hold it: every sample labelled with its thread.
    pub fn local_pprof(&self) -> Result<&LocalPprof, &std::io::Error> {
        self.encoded
            .local
            .get_or_init(|| {
                let profile = pprof::encode(self.profile, self.presentation.annotate_frames);
                let gzipped = pprof::encode_gzipped(&profile)?;
                Ok(LocalPprof {
                    profile,
                    gzipped: Arc::from(gzipped),
                })
            })
            .as_ref()
    }

    /// The profile as the remote sinks send it (`crate::remote_variant`).
    pub fn remote_variant(&self) -> &Arc<SymbolizedProfile> {
        self.encoded
            .remote
            .get_or_init(|| Arc::new(remote_variant(self.profile, self.presentation.threads)))
    }

    /// [`Self::remote_variant`] as pprof, from the local pprof's tables (the names are the
    /// same: none is interned twice).
    pub fn remote_pprof(&self) -> Result<proto::Profile, &std::io::Error> {
        let local = self.local_pprof()?;
        let annotate = self.presentation.annotate_frames;
        Ok(pprof::encode_variant(
            self.remote_variant(),
            &local.profile,
            annotate,
        ))
    }
}

/// An output of symbolized profiles.
pub trait Sink: Send {
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
        fn accept(&mut self, _: &SinkProfile<'_>) {
            self.profiles.fetch_add(1, Ordering::Relaxed);
        }

        fn end_interval(&mut self) {
            self.intervals.fetch_add(1, Ordering::Relaxed);
        }
    }
}
