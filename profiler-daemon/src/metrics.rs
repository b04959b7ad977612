//! Operational metrics on a local HTTP endpoint (`metrics_listen`, e.g. `127.0.0.1:9464`, path
//! `/metrics`), in the OpenMetrics text format Prometheus scrapes.
//!
//! The values are kept where they are counted (the BPF program's per-CPU counters, the threads'
//! atomics); the sampling loop publishes a snapshot of its own once a second. Each component
//! encodes its own families ([`families::MetricSource`]); the daemon hands the endpoint the list
//! of them. A scrape encodes them through `prometheus-client` (a collector: typed counters,
//! gauges and label sets, no copy kept per metric) and `axum` serves it, within the connection
//! bounds of [`connections`]; scrapes never touch the hot path. The page encoded is served again
//! until the next snapshot (for at most [`PAGE_REUSE`]), so a flood of scrapes costs no encoding.

pub mod connections;
pub mod families;
pub mod peer_uid;

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

use families::{Families, MetricSource};

/// How long an encoded page is served again at most: the snapshot changes once a second, and
/// the values read live (export, endpoint) may lag as long.
pub const PAGE_REUSE: Duration = Duration::from_secs(1);

/// A page encoded when the sources had published `published` snapshots.
struct Page {
    published: u64,
    encoded_at: Instant,
    text: Bytes,
}

/// The endpoint's page: its sources' families, in the order of the list, then its own.
#[derive(Clone)]
pub struct Metrics {
    sources: Arc<[Arc<dyn MetricSource>]>,
    page: Arc<Mutex<Option<Page>>>,
    /// Connections the endpoint itself closed.
    pub closed_connections: Arc<connections::ClosedConnections>,
}

impl Metrics {
    pub fn new(sources: Vec<Arc<dyn MetricSource>>) -> Self {
        Self {
            sources: sources.into(),
            page: Arc::default(),
            closed_connections: Arc::default(),
        }
    }

    /// Snapshots the sources published so far: a page of an earlier count is stale.
    fn published(&self) -> u64 {
        self.sources
            .iter()
            .fold(0, |sum, source| sum.wrapping_add(source.published()))
    }

    /// The page a scrape gets: the one encoded for the current snapshot if under
    /// [`PAGE_REUSE`] old, else a new one (shared, not copied, by the scrapes that get it).
    pub fn page(&self) -> Result<Bytes, fmt::Error> {
        let published = self.published();
        // Held while encoding: scrapes arriving meanwhile wait for this page, not encode theirs.
        let mut page = self.page.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(page) = page
            .as_ref()
            .filter(|page| page.published == published && page.encoded_at.elapsed() < PAGE_REUSE)
        {
            return Ok(page.text.clone());
        }
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry())?;
        let text = Bytes::from(text);
        *page = Some(Page {
            published,
            encoded_at: Instant::now(),
            text: text.clone(),
        });
        Ok(text)
    }

    /// A registry whose one collector encodes these metrics on each scrape.
    pub fn registry(&self) -> Registry {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(PageCollector(self.clone())));
        registry
    }

    /// The OpenMetrics text a scrape gets (the tests read it).
    #[cfg(test)]
    pub fn render(&self) -> String {
        let mut text = String::new();
        // Writing to a String fails only if a label set's encoding does, and ours cannot.
        let _ = prometheus_client::encoding::text::encode(&mut text, &self.registry());
        text
    }
}

/// Encodes the sources' families on each scrape (see the module header).
struct PageCollector(Metrics);

impl fmt::Debug for PageCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("PageCollector")
    }
}

impl Collector for PageCollector {
    fn encode(&self, encoder: DescriptorEncoder) -> fmt::Result {
        let mut out = Families::new(encoder);
        for source in self.0.sources.iter() {
            source.encode(&mut out)?;
        }
        self.0.closed_connections.encode(&mut out)
    }
}

/// Serves `/metrics` (and `/`) until the task is dropped.
pub async fn serve(listener: TcpListener, metrics: Metrics) {
    use axum::http::header::CONTENT_TYPE;
    use axum::routing::get;

    let pages = metrics.clone();
    let scrape = move || {
        let page = pages.page();
        async move {
            match page {
                Ok(body) => (
                    axum::http::StatusCode::OK,
                    [(CONTENT_TYPE, OPENMETRICS_CONTENT_TYPE)],
                    body,
                ),
                Err(_) => (
                    axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                    [(CONTENT_TYPE, "text/plain")],
                    Bytes::new(),
                ),
            }
        }
    };
    let app = axum::Router::new()
        .route("/metrics", get(scrape.clone()))
        .route("/", get(scrape));
    let closed = metrics.closed_connections.clone();
    connections::serve(listener, app, connections::LIMITS, closed).await;
}

/// What Prometheus is told it scrapes.
const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// A source with a published count and a counter read live.
    #[derive(Default)]
    struct Fake {
        records: AtomicU64,
        published: AtomicU64,
        profiles_written: AtomicU64,
    }

    impl Fake {
        fn publish(&self, records: u64) {
            self.records.store(records, Ordering::Relaxed);
            self.published.fetch_add(1, Ordering::Release);
        }
    }

    impl MetricSource for Fake {
        fn encode(&self, out: &mut Families) -> fmt::Result {
            let get = |value: &AtomicU64| value.load(Ordering::Relaxed);
            out.counter("profiler_records_total", "Records.", get(&self.records))?;
            out.counter(
                "profiler_profiles_written_total",
                "Written.",
                get(&self.profiles_written),
            )
        }

        fn published(&self) -> u64 {
            self.published.load(Ordering::Acquire)
        }
    }

    fn with_fake() -> (Metrics, Arc<Fake>) {
        let fake = Arc::new(Fake::default());
        (Metrics::new(vec![fake.clone()]), fake)
    }

    #[test]
    fn a_page_is_encoded_once_per_snapshot() {
        let (metrics, fake) = with_fake();
        fake.publish(1);
        let first = metrics.page().expect("encodes");
        // Counted live, but the page is the one already encoded: the same bytes, not a copy.
        fake.profiles_written.fetch_add(5, Ordering::Relaxed);
        let again = metrics.page().expect("encodes");
        assert_eq!(first.as_ptr(), again.as_ptr());
        assert!(std::str::from_utf8(&again)
            .expect("utf-8")
            .contains("\nprofiler_profiles_written_total 0\n"));
        // A new snapshot: a new page, with what was counted meanwhile.
        fake.publish(2);
        let next = metrics.page().expect("encodes");
        let text = std::str::from_utf8(&next).expect("utf-8");
        assert!(text.contains("\nprofiler_records_total 2\n"), "{text}");
        assert!(
            text.contains("\nprofiler_profiles_written_total 5\n"),
            "{text}"
        );
    }

    #[test]
    fn the_endpoint_s_own_families_come_last() {
        let (metrics, _) = with_fake();
        let text = metrics.render();
        let closed = text
            .find("# TYPE profiler_metrics_connections_closed counter")
            .expect("the endpoint's family");
        assert!(text.find("profiler_records").expect("the source's") < closed);
        // OpenMetrics: one terminator, at the end.
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test]
    async fn serves_the_text_over_http() {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let address = listener.local_addr().expect("address");
        let (metrics, fake) = with_fake();
        fake.publish(7);
        let server = tokio::spawn(serve(listener, metrics));
        let get = |path: &'static str| async move {
            let mut stream = tokio::net::TcpStream::connect(address)
                .await
                .expect("connect");
            let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
            stream.write_all(request.as_bytes()).await.expect("write");
            let mut response = String::new();
            stream.read_to_string(&mut response).await.expect("read");
            response
        };
        let response = get("/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200 OK"), "{response}");
        assert!(
            response.contains("application/openmetrics-text"),
            "{response}"
        );
        assert!(
            response.contains("\nprofiler_records_total 7\n"),
            "{response}"
        );
        assert!(get("/nothing").await.starts_with("HTTP/1.1 404"));
        server.abort();
    }
}
