//! The daemon's live stream: a gRPC service (`profiler.v1.ProfileStream`) that sends each new
//! profile to every subscriber whose filter (pids, service names) it matches.
//!
//! Each subscriber has its own task reading the broadcast channel, so a slow subscriber only
//! loses its own profiles (counted, and reported to it in `skipped_before`).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::{ReceiverStream, TcpListenerStream};
use tonic::{Request, Response, Status};

use super::counters::ExportCounters;
use super::proto::profiler::v1::profile_stream_server::{ProfileStream, ProfileStreamServer};
use super::proto::profiler::v1::{ProfileMessage, SubscribeRequest};
use super::{label_pairs, ExportedProfile};
use crate::config_error::ConfigError;
use crate::sink::{Sink, SinkProfile, SinkTasks};

/// How many profiles the live stream buffers for its slowest subscriber.
const STREAM_BUFFER: usize = 256;

/// Where the live stream listens, and whether the address was asked for (a busy default port
/// is only a warning).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrpcListen {
    pub address: std::net::SocketAddr,
    pub explicit: bool,
}

/// The live stream as a sink: each profile goes to the broadcast channel the subscribers'
/// tasks read.
pub struct StreamSink {
    profiles: broadcast::Sender<Arc<ExportedProfile>>,
}

impl GrpcListen {
    /// `grpc_listen`: off unless asked for, since the stream is not authenticated and profiles
    /// name every process's functions and threads (SECURITY.md).
    pub fn resolve(text: Option<String>) -> Result<Option<Self>, ConfigError> {
        match text.as_deref() {
            None | Some("off") | Some("") => Ok(None),
            Some(text) => Ok(Some(GrpcListen {
                address: text.parse().map_err(|err| ConfigError::Invalid {
                    field: "grpc_listen",
                    flag: Some("grpc-listen"),
                    reason: format!("{text:?} is not an address:port or \"off\" ({err})"),
                })?,
                explicit: true,
            })),
        }
    }
}

impl StreamSink {
    /// Serves the stream at `listen`; `None` when the default address is taken (logged: only
    /// an address asked for is worth failing the start).
    pub async fn start(
        listen: GrpcListen,
        counters: Arc<ExportCounters>,
        tasks: &mut SinkTasks,
    ) -> std::io::Result<Option<Self>> {
        let listener = match tokio::net::TcpListener::bind(listen.address).await {
            Ok(listener) => listener,
            Err(err) if listen.explicit => return Err(err),
            Err(err) => {
                tracing::warn!(
                    address = %listen.address,
                    %err,
                    "live profile stream not served (set grpc_listen to another address, or \"off\")"
                );
                return Ok(None);
            }
        };
        tracing::info!(address = %listen.address, "serving the live profile stream (gRPC)");
        let profiles = broadcast::channel(STREAM_BUFFER).0;
        let sent = profiles.clone();
        tasks.spawn(|stopped| serve(listener, sent, counters, stopped));
        Ok(Some(Self { profiles }))
    }
}

impl Sink for StreamSink {
    fn accept(&mut self, profile: &SinkProfile<'_>) {
        // The local files count a profile that cannot be encoded.
        let Ok(local) = profile.local_pprof() else {
            return;
        };
        let exported = ExportedProfile::new(profile, local.gzipped.clone());
        // An error only means nobody is subscribed.
        let _ = self.profiles.send(Arc::new(exported));
    }
}

/// Messages buffered per subscriber connection before its task waits (and the broadcast lags).
const SUBSCRIBER_BUFFER: usize = 16;
/// At shutdown, how long subscribers get to receive the last profiles.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

pub struct StreamService {
    profiles: broadcast::Sender<Arc<ExportedProfile>>,
    counters: Arc<ExportCounters>,
    shutdown: watch::Receiver<bool>,
}

/// Serves the stream on `listener` until `shutdown` turns true; subscribers then get what was
/// already published and their streams end.
pub async fn serve(
    listener: tokio::net::TcpListener,
    profiles: broadcast::Sender<Arc<ExportedProfile>>,
    counters: Arc<ExportCounters>,
    shutdown: watch::Receiver<bool>,
) {
    let service = StreamService {
        profiles,
        counters: counters.clone(),
        shutdown: shutdown.clone(),
    };
    let mut stop = shutdown;
    let stopped = async move {
        let _ = stop.wait_for(|stop| *stop).await;
        // Let subscriber tasks flush and end their streams before connections close; without
        // subscribers, stop at once.
        let deadline = tokio::time::Instant::now() + SHUTDOWN_GRACE;
        while counters.stream_subscribers.load(Ordering::Relaxed) > 0
            && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let served = tonic::transport::Server::builder()
        .add_service(ProfileStreamServer::new(service))
        .serve_with_incoming_shutdown(TcpListenerStream::new(listener), stopped)
        .await;
    if let Err(err) = served {
        tracing::error!(%err, "profile stream server failed");
    }
}

struct Filter {
    pids: Vec<u32>,
    services: Vec<String>,
}

impl Filter {
    fn matches(&self, profile: &ExportedProfile) -> bool {
        (self.pids.is_empty() || self.pids.contains(&profile.pid))
            && (self.services.is_empty() || self.services.contains(&profile.service_name))
    }
}

#[tonic::async_trait]
impl ProfileStream for StreamService {
    type SubscribeStream = ReceiverStream<Result<ProfileMessage, Status>>;

    async fn subscribe(
        &self,
        request: Request<SubscribeRequest>,
    ) -> Result<Response<Self::SubscribeStream>, Status> {
        let peer = request.remote_addr();
        let request = request.into_inner();
        let filter = Filter {
            pids: request.pids,
            services: request.service_names,
        };
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let profiles = self.profiles.subscribe();
        tracing::info!(?peer, pids = ?filter.pids, services = ?filter.services, "stream subscriber");
        tokio::spawn(forward(
            profiles,
            filter,
            tx,
            self.counters.clone(),
            self.shutdown.clone(),
        ));
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// One subscriber's task: broadcast -> filter -> its connection.
async fn forward(
    mut profiles: broadcast::Receiver<Arc<ExportedProfile>>,
    filter: Filter,
    tx: mpsc::Sender<Result<ProfileMessage, Status>>,
    counters: Arc<ExportCounters>,
    mut shutdown: watch::Receiver<bool>,
) {
    counters.stream_subscribers.fetch_add(1, Ordering::Relaxed);
    let mut skipped: u64 = 0;
    let mut finishing = false;
    loop {
        let received = if finishing {
            // Shutting down: what is already published, then the end of the stream.
            match profiles.try_recv() {
                Ok(profile) => Ok(profile),
                Err(broadcast::error::TryRecvError::Lagged(n)) => {
                    Err(broadcast::error::RecvError::Lagged(n))
                }
                Err(_) => break,
            }
        } else {
            tokio::select! {
                received = profiles.recv() => received,
                _ = tx.closed() => break,
                _ = shutdown.wait_for(|stop| *stop) => { finishing = true; continue; }
            }
        };
        match received {
            Ok(profile) if filter.matches(&profile) => {
                if tx.send(Ok(message(&profile, skipped))).await.is_err() {
                    break;
                }
                skipped = 0;
            }
            Ok(_) => {}
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                skipped += missed;
                counters.stream_skipped.fetch_add(missed, Ordering::Relaxed);
            }
            Err(broadcast::error::RecvError::Closed) => break,
        }
    }
    counters.stream_subscribers.fetch_sub(1, Ordering::Relaxed);
}

fn message(profile: &ExportedProfile, skipped_before: u64) -> ProfileMessage {
    ProfileMessage {
        pid: profile.pid,
        service_name: profile.service_name.clone(),
        labels: label_pairs(&profile.labels),
        start_unix_nanos: profile
            .start
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i64),
        duration_nanos: profile.duration.as_nanos() as i64,
        pprof_gzip: profile.pprof_gzip.to_vec(),
        skipped_before,
    }
}
