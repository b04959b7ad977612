//! How the `/metrics` endpoint holds its connections: any local user can connect to it, so
//! connections must not be a way to take the daemon's descriptors (each one is a descriptor, and
//! a daemon out of descriptors can open no `/proc` file: it stops profiling).
//!
//! At most [`Limits::max_connections`] are served at once; past that a new connection is closed
//! as soon as it is accepted (so the backlog drains and it costs no descriptor). A served one
//! must send its request headers within [`Limits::header_read`] (hyper's timer, also between the
//! requests of a kept-alive connection), and is closed after [`Limits::lifetime`] whatever it does
//! (a client reading its answer a byte at a time). A scraper sends its request at once and reads
//! a few kilobytes back: it meets none of these bounds.
//!
//! `axum::serve` offers neither a limit nor timeouts, hence this accept loop around hyper's own
//! HTTP/1 connection driver.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

/// The bounds on the endpoint's connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read: Duration,
    pub lifetime: Duration,
}

/// The daemon's bounds: a few Prometheus servers and curious users fit many times over, and 64
/// descriptors are a small part of even systemd's default soft limit of 1024.
pub const LIMITS: Limits = Limits {
    max_connections: 64,
    header_read: Duration::from_secs(5),
    lifetime: Duration::from_secs(10),
};

/// Connections the endpoint closed itself, by `profiler_common::metric::metrics_connections_closed`
/// reason.
#[derive(Debug, Default)]
pub struct ClosedConnections {
    pub over_limit: AtomicU64,
    pub timed_out: AtomicU64,
}

/// Serves `app` on `listener` within `limits` until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    closed: Arc<ClosedConnections>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: retrying at once would spin;
                // a pause lets the daemon's other work finish and release some.
                tracing::debug!(%error, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            closed.over_limit.fetch_add(1, Ordering::Relaxed);
            drop(stream);
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let closed = closed.clone();
        tokio::spawn(async move {
            let connection = http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read)
                .serve_connection(TokioIo::new(stream), service);
            let timed_out = match tokio::time::timeout(limits.lifetime, connection).await {
                Ok(Ok(())) => false,
                Ok(Err(error)) => error.is_timeout(),
                Err(_elapsed) => true,
            };
            if timed_out {
                closed.timed_out.fetch_add(1, Ordering::Relaxed);
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use tokio::net::TcpStream;

    /// Reads until the server closes; true if it did within `within`.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buffer = Vec::new();
        tokio::time::timeout(within, stream.read_to_end(&mut buffer))
            .await
            .is_ok()
    }

    #[tokio::test]
    async fn idle_connections_cannot_hold_the_endpoint() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let limits = Limits {
            max_connections: 2,
            header_read: Duration::from_millis(300),
            lifetime: Duration::from_secs(5),
        };
        let closed = Arc::new(ClosedConnections::default());
        let app = axum::Router::new().route("/", axum::routing::get(|| async { "up" }));
        let server = tokio::spawn(serve(listener, app, limits, closed.clone()));

        // Two idle connections take both slots; a third is closed at once.
        let mut idle = Vec::new();
        for _ in 0..2 {
            idle.push(TcpStream::connect(address).await.expect("connect"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut over = TcpStream::connect(address).await.expect("connect");
        assert!(closed_within(&mut over, Duration::from_millis(200)).await);
        assert_eq!(closed.over_limit.load(Ordering::Relaxed), 1);

        // Without a request within the header timeout, the idle ones are closed...
        for stream in &mut idle {
            assert!(closed_within(stream, Duration::from_secs(2)).await);
        }
        assert_eq!(closed.timed_out.load(Ordering::Relaxed), 2);

        // ...and a client that sends one is served.
        let mut client = TcpStream::connect(address).await.expect("connect");
        client
            .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .expect("write");
        let mut response = String::new();
        client.read_to_string(&mut response).await.expect("read");
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(response.ends_with("up"), "{response}");
        server.abort();
    }
}
