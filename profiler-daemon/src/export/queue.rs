//! The bounded queue between the worker (which builds profiles) and a remote sink's delivery
//! task (which may be stuck retrying an unreachable backend). Each remote sink has its own.
//!
//! Pushing never blocks: past the bound the oldest waiting batch is dropped and its profiles
//! counted. The batches being sent are never dropped, so a profile is either delivered or
//! counted as dropped, never both. A backlog goes out several batches per request, so it drains
//! quickly after an outage.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use super::counters::SinkCounters;

/// What a queue holds: profiles that go out together, of a known size.
pub trait QueuedBatch: Send + Sync + 'static {
    /// Profiles in the batch, as the drop counters count them.
    fn profiles(&self) -> usize;
    /// Encoded bytes, as the queue's and the requests' byte bounds count them.
    fn bytes(&self) -> usize;
}

/// Bounds on one request: a backlog is sent in requests of up to this many batches and, past the
/// first batch, this many bytes (gRPC servers refuse messages over 4 MiB by default).
const MAX_BATCHES_PER_REQUEST: usize = 64;
const MAX_BYTES_PER_REQUEST: usize = 3 << 20;

/// How much the queue holds before it drops its oldest batches.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueueBound {
    pub max_profiles: usize,
    pub max_bytes: usize,
}

struct State<B> {
    waiting: VecDeque<Arc<B>>,
    in_flight: Vec<Arc<B>>,
    profiles: usize,
    bytes: usize,
}

impl<B> Default for State<B> {
    fn default() -> Self {
        Self {
            waiting: VecDeque::new(),
            in_flight: Vec::new(),
            profiles: 0,
            bytes: 0,
        }
    }
}

pub struct ExportQueue<B> {
    state: Mutex<State<B>>,
    ready: Notify,
    bound: QueueBound,
    counters: Arc<SinkCounters>,
    /// The sink's name, for the log line about drops.
    sink: &'static str,
}

impl<B: QueuedBatch> ExportQueue<B> {
    pub fn new(sink: &'static str, bound: QueueBound, counters: Arc<SinkCounters>) -> Self {
        Self {
            state: Mutex::default(),
            ready: Notify::new(),
            bound,
            counters,
            sink,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State<B>> {
        // A panic while holding the lock leaves consistent data (plain pushes and pops).
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues a batch, dropping the oldest waiting ones past the bound.
    pub fn push(&self, batch: B) {
        let mut state = self.lock();
        state.profiles += batch.profiles();
        state.bytes += batch.bytes();
        state.waiting.push_back(Arc::new(batch));
        let mut dropped = 0;
        while state.profiles > self.bound.max_profiles || state.bytes > self.bound.max_bytes {
            let Some(oldest) = state.waiting.pop_front() else {
                break;
            };
            state.profiles -= oldest.profiles();
            state.bytes -= oldest.bytes();
            dropped += oldest.profiles() as u64;
        }
        self.publish_depth(&state);
        drop(state);
        if dropped > 0 {
            let before = self
                .counters
                .dropped_queue_full
                .fetch_add(dropped, Ordering::Relaxed);
            // Logged when the total crosses a power of two: never a line per interval.
            if (before + dropped).ilog2() != before.checked_ilog2().unwrap_or(u32::MAX) {
                tracing::warn!(
                    sink = self.sink,
                    dropped_total = before + dropped,
                    "export queue full: oldest profiles dropped"
                );
            }
        }
        self.ready.notify_one();
    }

    /// The batches of the next request: those whose sending failed, else the oldest waiting
    /// (several, within the per-request bounds). Waits for one.
    pub async fn next(&self) -> Vec<Arc<B>> {
        loop {
            {
                let mut state = self.lock();
                if !state.in_flight.is_empty() {
                    return state.in_flight.clone();
                }
                let mut bytes = 0;
                while let Some(batch) = state.waiting.front() {
                    let fits = state.in_flight.len() < MAX_BATCHES_PER_REQUEST
                        && (state.in_flight.is_empty()
                            || bytes + batch.bytes() <= MAX_BYTES_PER_REQUEST);
                    if !fits {
                        break;
                    }
                    bytes += batch.bytes();
                    let batch = state.waiting.pop_front().expect("front exists");
                    state.in_flight.push(batch);
                }
                if !state.in_flight.is_empty() {
                    return state.in_flight.clone();
                }
            }
            // `notify_one` leaves a permit when nobody waits, so a push between the check above
            // and this await is not missed.
            self.ready.notified().await;
        }
    }

    /// The batches returned by `next` were delivered (or refused for good): forget them.
    pub fn done_with_in_flight(&self) {
        let mut state = self.lock();
        for batch in std::mem::take(&mut state.in_flight) {
            state.profiles -= batch.profiles();
            state.bytes -= batch.bytes();
        }
        self.publish_depth(&state);
    }

    /// Profiles waiting or in flight.
    pub fn len(&self) -> usize {
        self.lock().profiles
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Shutdown with profiles still queued: empties the queue, counting them; returns how many.
    pub fn abandon(&self) -> u64 {
        let mut state = self.lock();
        let abandoned = state.profiles as u64;
        *state = State::default();
        self.publish_depth(&state);
        self.counters
            .dropped_at_shutdown
            .fetch_add(abandoned, Ordering::Relaxed);
        abandoned
    }

    fn publish_depth(&self, state: &State<B>) {
        self.counters
            .queued_profiles
            .store(state.profiles as u64, Ordering::Relaxed);
        self.counters
            .queued_bytes
            .store(state.bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One profile of `bytes` bytes, known by its pid.
    struct Batch {
        pid: u32,
        bytes: usize,
    }

    impl QueuedBatch for Batch {
        fn profiles(&self) -> usize {
            1
        }
        fn bytes(&self) -> usize {
            self.bytes
        }
    }

    fn batch(pid: u32, bytes: usize) -> Batch {
        Batch { pid, bytes }
    }

    fn queue(max_profiles: usize, max_bytes: usize) -> (ExportQueue<Batch>, Arc<SinkCounters>) {
        let counters = Arc::new(SinkCounters::default());
        let bound = QueueBound {
            max_profiles,
            max_bytes,
        };
        (ExportQueue::new("test", bound, counters.clone()), counters)
    }

    /// The pids of the next request's batches.
    fn next_now(queue: &ExportQueue<Batch>) -> Vec<u32> {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime")
            .block_on(queue.next())
            .iter()
            .map(|batch| batch.pid)
            .collect()
    }

    #[test]
    fn drops_the_oldest_past_the_bound_and_counts_them() {
        let (queue, counters) = queue(3, usize::MAX);
        for pid in 1..=5 {
            queue.push(batch(pid, 10));
        }
        assert_eq!(counters.dropped_queue_full.load(Ordering::Relaxed), 2);
        assert_eq!(queue.len(), 3);
        assert_eq!(next_now(&queue), vec![3, 4, 5]);
    }

    #[test]
    fn the_batch_in_flight_is_never_dropped() {
        let (queue, counters) = queue(2, usize::MAX);
        queue.push(batch(1, 10));
        assert_eq!(next_now(&queue), vec![1]);
        for pid in 2..=4 {
            queue.push(batch(pid, 10));
        }
        // 1 is being sent; 2 and 3 went to make room for 4.
        assert_eq!(counters.dropped_queue_full.load(Ordering::Relaxed), 2);
        // A failed send gets the same batches back.
        assert_eq!(next_now(&queue), vec![1]);
        queue.done_with_in_flight();
        assert_eq!(next_now(&queue), vec![4]);
        queue.done_with_in_flight();
        assert!(queue.is_empty());
        assert_eq!(counters.queued_profiles.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn a_backlog_goes_out_several_batches_per_request() {
        let (queue, _) = queue(1000, usize::MAX);
        for pid in 0..100 {
            queue.push(batch(pid, 10));
        }
        let first = next_now(&queue);
        assert_eq!(first, (0..64).collect::<Vec<u32>>());
        queue.done_with_in_flight();
        assert_eq!(next_now(&queue), (64..100).collect::<Vec<u32>>());
        // Large profiles: one per request past the byte bound, but never none.
        queue.done_with_in_flight();
        queue.push(batch(1, 2 << 20));
        queue.push(batch(2, 2 << 20));
        assert_eq!(next_now(&queue), vec![1]);
    }

    #[test]
    fn bytes_bound_the_queue_too() {
        let (queue, counters) = queue(100, 250);
        for pid in 1..=3 {
            queue.push(batch(pid, 100));
        }
        assert_eq!(counters.dropped_queue_full.load(Ordering::Relaxed), 1);
        assert_eq!(counters.queued_bytes.load(Ordering::Relaxed), 200);
        assert_eq!(queue.abandon(), 2);
        assert_eq!(counters.dropped_at_shutdown.load(Ordering::Relaxed), 2);
    }
}
