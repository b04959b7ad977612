//! How the `/metrics` endpoint holds its connections: any local user can connect to it, so
//! connections must not be a way to take the daemon's descriptors (each one is a descriptor, and
//! a daemon out of descriptors can open no `/proc` file: it stops profiling), its CPU, or the
//! operator's scrapes.
//!
//! At most [`Limits::max_connections`] are served at once; past that a new connection is closed
//! as soon as it is accepted (so the backlog drains and it costs no descriptor). A served one
//! must send its request headers within [`Limits::header_read`] (hyper's timer, also between the
//! requests of a kept-alive connection), and is closed after [`Limits::lifetime`] whatever it does
//! (a client reading its answer a byte at a time). A scraper sends its request at once and reads
//! a few kilobytes back: it meets none of these bounds.
//!
//! Connections are told apart by who holds the peer's socket ([`peer_uid`]): the operator (root
//! and the daemon's own uid), each other local uid, and one shared class for the rest (remote
//! hosts, other network namespaces, sockets already closed). Each class but the operator's
//! holds at most [`Limits::per_class`] connections and all of them together leave
//! [`Limits::operator_reserved`] free, so one user's flood fills its own share only. Their
//! requests are paced ([`Limits::paced`]): past a burst, a request waits its turn (holding
//! only its own class's connection), so pipelined scrapes cost a bounded CPU whatever the
//! number of connections.
//!
//! `axum::serve` offers neither a limit nor timeouts, hence this accept loop around hyper's own
//! HTTP/1 connection driver.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::time::Instant;

use super::families::{reasons, Families, MetricSource};
use super::peer_uid::SockDiag;

/// The bounds on the endpoint's connections.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_read: Duration,
    pub lifetime: Duration,
    /// Connections one class other than the operator's may hold.
    pub per_class: usize,
    /// Connections only the operator may take.
    pub operator_reserved: usize,
    /// Requests of a class other than the operator's: a burst, then one per period.
    pub paced: Pace,
    /// Connections refused: past this pace the accept loop waits. A client that reconnects as
    /// soon as it is refused would otherwise cost the daemon a core; the handshake is the
    /// kernel's, so the others' connections wait in the listen queue, not fail.
    pub refusals: Pace,
}

/// A token bucket: `burst` requests at once, then one per `period`.
#[derive(Clone, Copy, Debug)]
pub struct Pace {
    pub burst: u32,
    pub period: Duration,
}

/// The daemon's bounds: a few Prometheus servers and curious users fit many times over, and 64
/// descriptors are a small part of even systemd's default soft limit of 1024. A scraper asks
/// every 15 s or so; 4 pages a second per class (the page changes once a second) is plenty.
pub const LIMITS: Limits = Limits {
    max_connections: 64,
    header_read: Duration::from_secs(5),
    lifetime: Duration::from_secs(10),
    per_class: 8,
    operator_reserved: 16,
    paced: Pace {
        burst: 8,
        period: Duration::from_millis(250),
    },
    // 4,000 a second: a few percent of a core; a full listen queue (4096) drains in a second.
    refusals: Pace {
        burst: 1000,
        period: Duration::from_micros(250),
    },
};

/// Connections the endpoint closed itself, by `profiler_common::metric::metrics_connections_closed`
/// reason.
#[derive(Debug, Default)]
pub struct ClosedConnections {
    /// Over the total or over the class's share.
    pub over_limit: AtomicU64,
    pub timed_out: AtomicU64,
}

impl MetricSource for ClosedConnections {
    fn encode(&self, out: &mut Families) -> std::fmt::Result {
        use profiler_common::metric::{self, metrics_connections_closed as closed};
        let get = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        out.counters(
            metric::METRICS_CONNECTIONS_CLOSED,
            "Connections to this endpoint it closed itself, by reason.",
            reasons([
                (closed::OVER_LIMIT, get(&self.over_limit)),
                (closed::TIMED_OUT, get(&self.timed_out)),
            ]),
        )
    }
}

/// Who a connection's peer is, as far as the endpoint's shares go.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Class {
    /// Root or the daemon's own uid, on this host.
    Operator,
    /// Another local uid.
    User(u32),
    /// Remote hosts, other network namespaces, or a peer the kernel could not name.
    Shared,
}

impl Class {
    /// The class of `uid` (the peer's socket's owner, if known) for a daemon running as
    /// `own_uid`.
    pub fn of(uid: Option<u32>, own_uid: u32) -> Self {
        match uid {
            Some(uid) if uid == 0 || uid == own_uid => Self::Operator,
            Some(uid) => Self::User(uid),
            None => Self::Shared,
        }
    }
}

/// A class's connections now and when its next paced request may go.
#[derive(Debug)]
struct ClassState {
    connections: usize,
    requests: Bucket,
}

/// The connections held, by class; each class's pace. Entries go once a class has no
/// connection and its bucket is full again.
#[derive(Debug)]
struct Shares {
    limits: Limits,
    classes: HashMap<Class, ClassState>,
    total: usize,
}

/// Classes tracked at most; past it a new uid counts as [`Class::Shared`] (only distinct uids
/// with connections or a recent burst are tracked, so this takes thousands of uids).
const MAX_CLASSES: usize = 1024;

impl Shares {
    fn new(limits: Limits) -> Self {
        Self {
            limits,
            classes: HashMap::new(),
            total: 0,
        }
    }

    /// Takes a connection for `class` if its share and the total allow it; the class it was
    /// counted in.
    fn admit(&mut self, mut class: Class, now: Instant) -> Option<Class> {
        let limits = self.limits;
        if self.total >= limits.max_connections {
            return None;
        }
        if class != Class::Operator {
            let others = self.total - self.held(Class::Operator);
            if others + limits.operator_reserved >= limits.max_connections {
                return None;
            }
            if !self.classes.contains_key(&class) && self.classes.len() >= MAX_CLASSES {
                self.classes.retain(|_, state| {
                    state.connections > 0 || state.requests.next > state.requests.full_at(now)
                });
                if self.classes.len() >= MAX_CLASSES {
                    class = Class::Shared;
                }
            }
            if self.held(class) >= limits.per_class {
                return None;
            }
        }
        // A class new (or forgotten) has its whole burst.
        let state = self.classes.entry(class).or_insert(ClassState {
            connections: 0,
            requests: Bucket::new(limits.paced, now),
        });
        state.connections += 1;
        self.total += 1;
        Some(class)
    }

    fn held(&self, class: Class) -> usize {
        self.classes
            .get(&class)
            .map_or(0, |state| state.connections)
    }

    fn release(&mut self, class: Class, now: Instant) {
        self.total -= 1;
        if let Some(state) = self.classes.get_mut(&class) {
            state.connections -= 1;
            if state.connections == 0 && state.requests.next <= state.requests.full_at(now) {
                self.classes.remove(&class);
            }
        }
    }

    /// When a request of `class` arriving `now` may be answered (its turn taken).
    fn turn(&mut self, class: Class, now: Instant) -> Instant {
        match self.classes.get_mut(&class) {
            Some(state) if class != Class::Operator => state.requests.turn(now),
            _ => now,
        }
    }
}

/// A [`Pace`]'s state: when its next event may happen.
#[derive(Debug)]
struct Bucket {
    pace: Pace,
    next: Instant,
}

impl Bucket {
    /// Full at `now`.
    fn new(pace: Pace, now: Instant) -> Self {
        let mut bucket = Self { pace, next: now };
        bucket.next = bucket.full_at(now);
        bucket
    }

    /// The `next` of a full bucket at `now`.
    fn full_at(&self, now: Instant) -> Instant {
        now.checked_sub(self.pace.period * self.pace.burst.saturating_sub(1))
            .unwrap_or(now)
    }

    /// When an event arriving `now` may happen (its turn taken).
    fn turn(&mut self, now: Instant) -> Instant {
        let turn = self.next.max(self.full_at(now));
        self.next = turn + self.pace.period;
        turn.max(now)
    }
}

/// A connection's place in the shares, given back when it ends.
struct Held {
    shares: Arc<Mutex<Shares>>,
    class: Class,
}

impl Held {
    fn shares(&self) -> std::sync::MutexGuard<'_, Shares> {
        self.shares.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let class = self.class;
        self.shares().release(class, Instant::now());
    }
}

/// The peer's class: its socket's owner, if the kernel's socket diagnostics tell it.
fn classify(diag: Option<&mut SockDiag>, local: SocketAddr, peer: SocketAddr) -> Class {
    // SAFETY: geteuid cannot fail.
    let own_uid = unsafe { libc::geteuid() };
    Class::of(diag.and_then(|diag| diag.peer_uid(local, peer)), own_uid)
}

/// The endpoint's listening socket at `address`. Its backlog is the deepest the kernel allows
/// (`net.core.somaxconn` caps it; 4096 by default) rather than the usual 128: a flood of
/// connects fills the queue of those not yet accepted, and past it the kernel drops every new
/// connection's SYN, the operator's too (retried 1 s, then 3 s later).
pub fn listen(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(i32::MAX as u32)
}

/// Makes closing `stream` send a reset: a refused connection leaves no socket behind in
/// TIME_WAIT, whose number a client that keeps reconnecting would otherwise drive up.
fn reset_on_close(stream: &tokio::net::TcpStream) {
    use std::os::fd::AsRawFd as _;
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket and option of the size given. Best effort: a plain close otherwise.
    unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        );
    }
}

/// Serves `app` on `listener` within `limits` until the task is dropped.
pub async fn serve(
    listener: TcpListener,
    app: axum::Router,
    limits: Limits,
    closed: Arc<ClosedConnections>,
) {
    let shares = Arc::new(Mutex::new(Shares::new(limits)));
    let mut refused = Bucket::new(limits.refusals, Instant::now());
    let mut diag = match SockDiag::open() {
        Ok(diag) => Some(diag),
        Err(error) => {
            tracing::warn!(
                %error,
                "metrics endpoint: no socket diagnostics (NETLINK_SOCK_DIAG), so local users \
                 cannot be told apart: every connection shares one class"
            );
            None
        }
    };
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                // Out of descriptors (EMFILE, ENFILE) or memory: retrying at once would spin;
                // a pause lets the daemon's other work finish and release some.
                tracing::debug!(%error, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let full = {
            let shares = shares.lock().unwrap_or_else(PoisonError::into_inner);
            shares.total >= limits.max_connections
        };
        let class = match stream.local_addr() {
            // No lookup when nobody could be admitted: a reconnecting flood costs less.
            Ok(local) if !full => classify(diag.as_mut(), local, peer),
            _ => Class::Shared,
        };
        let admitted = shares
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .admit(class, Instant::now());
        let Some(class) = admitted else {
            closed.over_limit.fetch_add(1, Ordering::Relaxed);
            reset_on_close(&stream);
            drop(stream);
            let now = Instant::now();
            let turn = refused.turn(now);
            if turn > now {
                tokio::time::sleep_until(turn).await;
            }
            continue;
        };
        let held = Arc::new(Held {
            shares: shares.clone(),
            class,
        });
        let router = TowerToHyperService::new(app.clone());
        let paced = held.clone();
        // Each request waits for its class's turn (no CPU while waiting), then is served.
        let service = hyper::service::service_fn(move |request| {
            let turn = paced.shares().turn(paced.class, Instant::now());
            let answer = hyper::service::Service::call(&router, request);
            async move {
                tokio::time::sleep_until(turn).await;
                answer.await
            }
        });
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
            drop(held);
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
            ..LIMITS
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

    fn small() -> Limits {
        Limits {
            max_connections: 6,
            per_class: 2,
            operator_reserved: 2,
            paced: Pace {
                burst: 2,
                period: Duration::from_secs(1),
            },
            ..LIMITS
        }
    }

    #[test]
    fn each_user_holds_its_share_and_the_operator_keeps_room() {
        let mut shares = Shares::new(small());
        let now = Instant::now();
        let (a, b, c) = (Class::User(1000), Class::User(1001), Class::User(1002));
        for class in [a, a, b, b] {
            assert_eq!(shares.admit(class, now), Some(class));
        }
        // A third connection of a user is over its share; a third user is over what the
        // users may take together (6 - 2 reserved).
        assert_eq!(shares.admit(a, now), None);
        assert_eq!(shares.admit(c, now), None);
        assert_eq!(shares.admit(Class::Shared, now), None);
        // The operator takes the reserved room, then nothing is left.
        for _ in 0..2 {
            assert_eq!(shares.admit(Class::Operator, now), Some(Class::Operator));
        }
        assert_eq!(shares.admit(Class::Operator, now), None);
        // A user's connection ending makes room for another user.
        shares.release(b, now);
        assert_eq!(shares.admit(c, now), Some(c));
        assert_eq!(shares.total, 6);
    }

    #[test]
    fn the_operator_may_take_every_connection() {
        let mut shares = Shares::new(small());
        let now = Instant::now();
        for _ in 0..6 {
            assert_eq!(shares.admit(Class::Operator, now), Some(Class::Operator));
        }
        assert_eq!(shares.admit(Class::User(1000), now), None);
    }

    #[test]
    fn requests_past_a_burst_wait_their_turn_and_reconnecting_does_not_refill() {
        let mut shares = Shares::new(small());
        let now = Instant::now();
        let user = Class::User(1000);
        shares.admit(user, now);
        let second = Duration::from_secs(1);
        // A burst of two at once, then one a second.
        assert_eq!(shares.turn(user, now), now);
        assert_eq!(shares.turn(user, now), now);
        assert_eq!(shares.turn(user, now), now + second);
        assert_eq!(shares.turn(user, now), now + 2 * second);
        // Closing and reconnecting keeps the debt.
        shares.release(user, now);
        shares.admit(user, now);
        assert_eq!(shares.turn(user, now), now + 3 * second);
        // The operator is never paced, and an idle class refills to its burst only.
        assert_eq!(shares.turn(Class::Operator, now), now);
        let later = now + 60 * second;
        assert_eq!(shares.turn(user, later), later);
        assert_eq!(shares.turn(user, later), later);
        assert_eq!(shares.turn(user, later), later + second);
        // A class with no connection and a full bucket is forgotten.
        shares.release(user, later + 3 * second);
        assert!(shares.classes.is_empty());
    }

    #[test]
    fn peers_are_classed_by_their_uid() {
        assert_eq!(Class::of(Some(0), 997), Class::Operator);
        assert_eq!(Class::of(Some(997), 997), Class::Operator);
        assert_eq!(Class::of(Some(1000), 997), Class::User(1000));
        assert_eq!(Class::of(None, 0), Class::Shared);
    }
}
