//! The hand-off between JVM threads and the agent's own thread: encoded records, bounded in
//! bytes and in count. Pushing never waits for I/O: the lock is held for one `VecDeque` push or
//! one swap of the whole queue, and a record that does not fit is refused (the caller drops and
//! counts it).

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Default bounds: what a few seconds of a stalled file system may hold back.
pub const MAX_QUEUED_BYTES: usize = 8 << 20;
pub const MAX_QUEUED_RECORDS: usize = 65_536;

pub struct Queue {
    state: Mutex<State>,
    /// Signalled when the queue goes from empty to not empty.
    not_empty: Condvar,
    max_bytes: usize,
    max_records: usize,
}

#[derive(Default)]
struct State {
    records: VecDeque<Vec<u8>>,
    bytes: usize,
}

impl Queue {
    pub fn new(max_bytes: usize, max_records: usize) -> Self {
        Self {
            state: Mutex::new(State::default()),
            not_empty: Condvar::new(),
            max_bytes,
            max_records: max_records.max(1),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while holding it; a poisoned lock still guards consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `record`, or gives it back when the queue is full. An empty queue takes any one
    /// record, so a record larger than the byte bound (up to the record format's own limit,
    /// which its builder enforces) is not refused forever.
    pub fn push(&self, record: Vec<u8>) -> Result<(), Vec<u8>> {
        let was_empty = {
            let mut state = self.lock();
            let was_empty = state.records.is_empty();
            let fits = state.bytes.saturating_add(record.len()) <= self.max_bytes
                && state.records.len() < self.max_records;
            if !(was_empty || fits) {
                return Err(record);
            }
            state.bytes += record.len();
            state.records.push_back(record);
            was_empty
        };
        if was_empty {
            self.not_empty.notify_one();
        }
        Ok(())
    }

    /// Everything queued, in order; the queue is left empty.
    pub fn take_all(&self) -> VecDeque<Vec<u8>> {
        let mut state = self.lock();
        state.bytes = 0;
        std::mem::take(&mut state.records)
    }

    /// Waits until something is queued, at most `timeout`.
    pub fn wait(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        let mut state = self.lock();
        while state.records.is_empty() {
            let Some(left) = deadline.checked_duration_since(Instant::now()) else {
                return;
            };
            if left.is_zero() {
                return;
            }
            state = self
                .not_empty
                .wait_timeout(state, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// (records, bytes) queued now.
    pub fn len(&self) -> (usize, usize) {
        let state = self.lock();
        (state.records.len(), state.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_full_queue_refuses_records_until_drained() {
        let queue = Queue::new(100, 3);
        assert!(queue.push(vec![1; 60]).is_ok());
        // Over the byte bound: refused, and given back.
        assert_eq!(queue.push(vec![2; 41]), Err(vec![2; 41]));
        assert!(queue.push(vec![3; 40]).is_ok());
        assert_eq!(queue.len(), (2, 100));
        assert!(queue.push(Vec::new()).is_ok());
        // Over the count bound.
        assert!(queue.push(Vec::new()).is_err());
        let taken: Vec<_> = queue.take_all().into_iter().collect();
        assert_eq!(taken, [vec![1; 60], vec![3; 40], Vec::new()]);
        assert_eq!(queue.len(), (0, 0));
        // An empty queue takes one oversized record, then nothing more.
        assert!(queue.push(vec![4; 500]).is_ok());
        assert!(queue.push(vec![5; 1]).is_err());
    }

    #[test]
    fn a_waiting_drainer_wakes_when_a_record_arrives() {
        let queue = Arc::new(Queue::new(1 << 20, 100));
        let pusher = {
            let queue = Arc::clone(&queue);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                queue.push(vec![1]).expect("room");
            })
        };
        let started = Instant::now();
        let mut got = Vec::new();
        while got.is_empty() && started.elapsed() < Duration::from_secs(10) {
            queue.wait(Duration::from_secs(5));
            got.extend(queue.take_all());
        }
        assert_eq!(got, [vec![1]]);
        // Woken by the push, not by the timeout.
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
        pusher.join().expect("pusher");
        // Nothing queued: returns after the timeout.
        let started = Instant::now();
        queue.wait(Duration::from_millis(20));
        assert!(started.elapsed() >= Duration::from_millis(20));
    }
}
