//! One buffered sink for every remote backend (Pyroscope, OTLP): the worker pushes batches into
//! the sink's own bounded queue and never waits; the sink's delivery task sends them oldest
//! first, one request at a time, retries failures with capped exponential backoff and jitter,
//! and at shutdown keeps trying for a grace period before counting what is left as dropped.
//! A backend only says how one request is sent (`Transport`).
//!
//! A request's batches leave the queue only once the backend accepted them (or refused them
//! for good), so an outage delays profiles without reordering or duplicating them.

use std::future::Future;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use super::counters::{ExportCounters, SinkCounters};
use super::queue::{ExportQueue, QueueBound, QueuedBatch};
use crate::sink::SinkTasks;

/// How one backend sends a request.
pub trait Transport: Send + 'static {
    type Batch: QueuedBatch;

    /// Sends one request made of `batches` (oldest first).
    fn send(
        &mut self,
        batches: &[Arc<Self::Batch>],
    ) -> impl Future<Output = Result<Delivered, SendFailure>> + Send;
}

/// A request the backend took, whole or in part.
#[derive(Debug, Default)]
pub struct Delivered {
    /// Profiles the backend took the request but refused, by its own count (OTLP's partial
    /// success); counted as rejected.
    pub rejected: u64,
}

/// How a failed request is handled.
#[derive(Debug)]
pub enum SendFailure {
    /// Worth retrying: the backend is down, slow, overloaded, or refused our credentials (which
    /// an operator may fix without restarting us). `hint` says what to check, if anything.
    Retry { error: String, hint: String },
    /// The backend will never take these batches (a malformed profile, for instance).
    Refused { error: String },
}

/// The queue bound and retry settings of one remote sink.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Delivery {
    pub queue: QueueBound,
    /// Longest wait between retries.
    pub max_backoff: Duration,
    /// How long queued profiles are still tried at shutdown.
    pub shutdown_grace: Duration,
}

/// The first wait after a failed request; doubled after each failure up to `max_backoff`.
const INITIAL_BACKOFF: Duration = Duration::from_millis(250);

/// Capped exponential backoff with jitter. Each wait is drawn from the upper half of the current
/// step: the daemons of a fleet that lost the same backend at the same moment spread their
/// retries instead of reconnecting in lockstep, and no wait is shorter than half the step.
#[derive(Debug)]
struct Backoff {
    step: Duration,
    max: Duration,
}

impl Backoff {
    fn new(max: Duration) -> Self {
        Self {
            step: INITIAL_BACKOFF.min(max),
            max,
        }
    }

    fn next_wait(&mut self) -> Duration {
        let step = self.step;
        self.step = (step * 2).min(self.max);
        step / 2 + step.mul_f64(fastrand::f64() / 2.0)
    }

    fn reset(&mut self) {
        self.step = INITIAL_BACKOFF.min(self.max);
    }
}

/// The worker's side of a remote sink: its queue.
pub struct BufferedSink<B> {
    queue: Arc<ExportQueue<B>>,
}

impl<B: QueuedBatch> BufferedSink<B> {
    /// Starts the delivery task of the sink `name` (its label in the metrics and logs), which
    /// sends to `url` through `transport`.
    pub fn start<T: Transport<Batch = B>>(
        name: &'static str,
        url: String,
        transport: T,
        delivery: Delivery,
        counters: &ExportCounters,
        tasks: &mut SinkTasks,
    ) -> Self {
        let counters = counters.sink(name);
        let queue = Arc::new(ExportQueue::new(name, delivery.queue, counters.clone()));
        let task = DeliveryTask {
            name,
            url,
            transport,
            queue: queue.clone(),
            counters,
            backoff: Backoff::new(delivery.max_backoff),
            shutdown_grace: delivery.shutdown_grace,
        };
        tasks.spawn(|stopped| task.run(stopped));
        Self { queue }
    }

    /// Queues a batch; never waits (past the bound the oldest batches are dropped, counted).
    pub fn push(&self, batch: B) {
        self.queue.push(batch);
    }
}

struct DeliveryTask<T: Transport> {
    name: &'static str,
    url: String,
    transport: T,
    queue: Arc<ExportQueue<T::Batch>>,
    counters: Arc<SinkCounters>,
    backoff: Backoff,
    shutdown_grace: Duration,
}

impl<T: Transport> DeliveryTask<T> {
    /// Sends batches until `shutdown` turns true, then for at most the grace period while
    /// profiles remain; what is left after it is counted as dropped.
    async fn run(mut self, mut shutdown: watch::Receiver<bool>) {
        let mut deadline: Option<Instant> = None;
        let mut failures_in_a_row: u64 = 0;
        loop {
            if deadline.is_some() && self.queue.is_empty() {
                break;
            }
            if deadline.is_some_and(|at| Instant::now() >= at) {
                break;
            }
            let batches = tokio::select! {
                batches = self.queue.next() => batches,
                _ = shutdown.changed(), if deadline.is_none() => {
                    deadline = Some(Instant::now() + self.shutdown_grace);
                    continue;
                }
                _ = sleep_until(deadline) => break,
            };
            let outcome = tokio::select! {
                outcome = self.transport.send(&batches) => outcome,
                _ = sleep_until(deadline) => break,
            };
            match outcome {
                Ok(delivered) => {
                    if failures_in_a_row > 0 {
                        tracing::info!(
                            sink = self.name,
                            url = %self.url,
                            failed_attempts = failures_in_a_row,
                            "delivering again"
                        );
                    }
                    failures_in_a_row = 0;
                    self.backoff.reset();
                    self.count_delivered(&batches);
                    self.counters
                        .rejected
                        .fetch_add(delivered.rejected, Ordering::Relaxed);
                    self.queue.done_with_in_flight();
                }
                Err(SendFailure::Refused { error }) => {
                    let profiles = profile_count(&batches);
                    self.counters
                        .rejected
                        .fetch_add(profiles, Ordering::Relaxed);
                    tracing::error!(
                        sink = self.name,
                        url = %self.url,
                        %error,
                        profiles,
                        "the backend refused profiles: dropped"
                    );
                    self.queue.done_with_in_flight();
                }
                Err(SendFailure::Retry { error, hint }) => {
                    failures_in_a_row += 1;
                    self.counters
                        .failed_attempts
                        .fetch_add(1, Ordering::Relaxed);
                    let wait = self.backoff.next_wait();
                    // The first failure and then every power of two: an outage is visible
                    // without a line per retry.
                    if failures_in_a_row.is_power_of_two() {
                        tracing::warn!(
                            sink = self.name,
                            url = %self.url,
                            %error,
                            failed_attempts = failures_in_a_row,
                            queued_profiles = self.queue.len(),
                            retry_in_ms = wait.as_millis() as u64,
                            "export failed, retrying{hint}"
                        );
                    }
                    let wake = Instant::now() + wait;
                    let wake = deadline.map_or(wake, |at| wake.min(at));
                    tokio::select! {
                        _ = tokio::time::sleep_until(wake) => {}
                        _ = shutdown.changed(), if deadline.is_none() => {
                            deadline = Some(Instant::now() + self.shutdown_grace);
                        }
                    }
                }
            }
        }
        if !self.queue.is_empty() {
            let abandoned = self.queue.abandon();
            tracing::warn!(
                sink = self.name,
                url = %self.url,
                profiles = abandoned,
                "shutdown: profiles not delivered within the grace period"
            );
        }
    }

    fn count_delivered(&self, batches: &[Arc<T::Batch>]) {
        let c = &self.counters;
        c.exported_requests.fetch_add(1, Ordering::Relaxed);
        c.exported_profiles
            .fetch_add(profile_count(batches), Ordering::Relaxed);
        let bytes: usize = batches.iter().map(|batch| batch.bytes()).sum();
        c.exported_bytes.fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn profile_count<B: QueuedBatch>(batches: &[Arc<B>]) -> u64 {
    batches.iter().map(|batch| batch.profiles() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn waits_double_up_to_the_cap_and_stay_in_the_steps_upper_half() {
        let mut backoff = Backoff::new(Duration::from_secs(2));
        let steps_ms = [250, 500, 1000, 2000, 2000];
        for step_ms in steps_ms {
            let wait = backoff.next_wait().as_secs_f64() * 1000.0;
            let step = step_ms as f64;
            assert!(
                wait >= step / 2.0 && wait <= step,
                "{wait} ms for a {step} ms step"
            );
        }
        backoff.reset();
        assert!(backoff.next_wait() <= INITIAL_BACKOFF);
    }

    #[test]
    fn waits_of_two_daemons_differ() {
        let waits = |_| {
            let mut backoff = Backoff::new(Duration::from_secs(60));
            (0..8).map(|_| backoff.next_wait()).collect::<Vec<_>>()
        };
        assert_ne!(waits(0), waits(1), "the jitter spreads retries");
    }

    struct Batch(u32);

    impl QueuedBatch for Batch {
        fn profiles(&self) -> usize {
            1
        }
        fn bytes(&self) -> usize {
            10
        }
    }

    /// Fails the first `failures` requests (retryably), refuses batch 13, takes the rest.
    struct Flaky {
        failures: usize,
        delivered: Arc<Mutex<Vec<u32>>>,
    }

    impl Transport for Flaky {
        type Batch = Batch;

        async fn send(&mut self, batches: &[Arc<Batch>]) -> Result<Delivered, SendFailure> {
            if self.failures > 0 {
                self.failures -= 1;
                return Err(SendFailure::Retry {
                    error: "down".into(),
                    hint: String::new(),
                });
            }
            if batches.iter().any(|b| b.0 == 13) {
                return Err(SendFailure::Refused {
                    error: "bad".into(),
                });
            }
            let mut delivered = self.delivered.lock().expect("lock");
            delivered.extend(batches.iter().map(|b| b.0));
            Ok(Delivered::default())
        }
    }

    fn delivery(max_profiles: usize) -> Delivery {
        Delivery {
            queue: QueueBound {
                max_profiles,
                max_bytes: usize::MAX,
            },
            max_backoff: Duration::from_millis(20),
            shutdown_grace: Duration::from_millis(500),
        }
    }

    #[tokio::test]
    async fn retries_deliver_in_order_and_refusals_are_counted_not_retried() {
        let delivered = Arc::new(Mutex::new(Vec::new()));
        let counters = ExportCounters::default();
        let mut tasks = SinkTasks::default();
        let transport = Flaky {
            failures: 3,
            delivered: delivered.clone(),
        };
        let sink = BufferedSink::start(
            "test",
            "http://x".into(),
            transport,
            delivery(100),
            &counters,
            &mut tasks,
        );
        sink.push(Batch(1));
        tokio::time::sleep(Duration::from_millis(50)).await;
        sink.push(Batch(13));
        tokio::time::sleep(Duration::from_millis(50)).await;
        sink.push(Batch(2));
        tasks.finish().await;
        let sink_counters = counters.sink("test");
        let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
        assert_eq!(*delivered.lock().expect("lock"), [1, 2]);
        assert_eq!(get(&sink_counters.failed_attempts), 3);
        assert_eq!(get(&sink_counters.rejected), 1);
        assert_eq!(get(&sink_counters.exported_profiles), 2);
        assert_eq!(get(&sink_counters.dropped_at_shutdown), 0);
        assert_eq!(get(&sink_counters.queued_profiles), 0);
    }

    #[tokio::test]
    async fn what_the_grace_period_cannot_deliver_is_counted_as_dropped() {
        let counters = ExportCounters::default();
        let mut tasks = SinkTasks::default();
        let transport = Flaky {
            failures: usize::MAX,
            delivered: Arc::default(),
        };
        let sink = BufferedSink::start(
            "down",
            "http://x".into(),
            transport,
            delivery(2),
            &counters,
            &mut tasks,
        );
        for id in 1..=5 {
            sink.push(Batch(id));
        }
        let started = Instant::now();
        tasks.finish().await;
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "the grace period bounds shutdown"
        );
        let sink_counters = counters.sink("down");
        // 1 went in flight at once; 2 and 3 made room for 4 and 5 (bound 2: one in flight,
        // one waiting), so at shutdown two remain.
        let dropped_full = sink_counters.dropped_queue_full.load(Ordering::Relaxed);
        let dropped_shutdown = sink_counters.dropped_at_shutdown.load(Ordering::Relaxed);
        assert_eq!(
            dropped_full + dropped_shutdown,
            5,
            "every profile is counted once"
        );
        assert_eq!(sink_counters.exported_profiles.load(Ordering::Relaxed), 0);
    }
}
