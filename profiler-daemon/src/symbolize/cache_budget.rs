//! One memory budget for the caches the daemon can rebuild (today: parsed binaries and their
//! resolved frames; native unwind tables will be charged to it too), so that a host where new
//! large binaries keep appearing cannot grow the daemon without bound.
//!
//! A cache charges what an entry costs when it fills it, and evicts its least recently used
//! entries whole while the total is over the limit. What an entry costs is measured, not
//! guessed: blazesym reports no sizes, so what the work that filled the entry kept on the heap
//! (counted by the daemon's allocator, in the thread that did the work) and the growth of the
//! daemon's resident file pages (`/proc/self/statm`) are charged to it. The heap is counted by
//! the allocator rather than by the resident set: a parse that reuses memory freed earlier holds
//! it all the same. The figures are published as metrics.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::own_memory::thread_net_allocated;

/// Default limit: leaves room for the rest of the daemon under a DaemonSet's 256 MiB.
pub const DEFAULT_LIMIT_BYTES: u64 = 96 << 20;

/// Counters shared with the metrics endpoint.
#[derive(Debug, Default)]
pub struct CacheStats {
    pub limit_bytes: AtomicU64,
    pub charged_bytes: AtomicU64,
    pub evictions: AtomicU64,
}

/// The budget itself: a limit and a running total, owned by the (single) symbolizer thread.
#[derive(Debug)]
pub struct CacheBudget {
    limit: u64,
    charged: u64,
    stats: Arc<CacheStats>,
}

impl CacheBudget {
    #[cfg(test)]
    pub fn new(limit: u64) -> Self {
        Self::with_stats(limit, Arc::default())
    }

    /// A budget that publishes into `stats` (shared with the metrics endpoint).
    pub fn with_stats(limit: u64, stats: Arc<CacheStats>) -> Self {
        stats.limit_bytes.store(limit, Ordering::Relaxed);
        Self {
            limit,
            charged: 0,
            stats,
        }
    }

    #[cfg(test)]
    pub fn stats(&self) -> Arc<CacheStats> {
        self.stats.clone()
    }

    pub fn charge(&mut self, bytes: u64) {
        self.charged = self.charged.saturating_add(bytes);
        self.publish();
    }

    /// Gives back what an evicted entry was charged.
    pub fn release(&mut self, bytes: u64) {
        self.charged = self.charged.saturating_sub(bytes);
        self.stats.evictions.fetch_add(1, Ordering::Relaxed);
        self.publish();
    }

    #[cfg(test)]
    pub fn over(&self) -> bool {
        self.charged > self.limit
    }

    pub fn charged(&self) -> u64 {
        self.charged
    }

    pub fn limit(&self) -> u64 {
        self.limit
    }

    fn publish(&self) {
        self.stats
            .charged_bytes
            .store(self.charged, Ordering::Relaxed);
    }
}

/// The daemon's file pages resident now (statm's shared pages: the binaries it maps), in bytes
/// (0 if it cannot be read).
fn resident_file_bytes() -> u64 {
    let Ok(statm) = std::fs::read_to_string("/proc/self/statm") else {
        return 0;
    };
    let pages: u64 = statm
        .split_whitespace()
        .nth(2)
        .and_then(|field| field.parse().ok())
        .unwrap_or(0);
    // SAFETY: sysconf has no memory preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
    pages * page
}

/// Measures what `work` made the daemon hold: the heap it allocated on this thread and kept
/// (the allocator's count, even where it reused memory freed earlier, which a resident-set
/// measure would not see) plus the growth of the daemon's resident file pages (the binaries it
/// mapped), never negative.
pub fn measure<T>(work: impl FnOnce() -> T) -> (T, u64) {
    let (files_before, heap_before) = (resident_file_bytes(), thread_net_allocated());
    let result = work();
    let files = resident_file_bytes().saturating_sub(files_before);
    let heap = thread_net_allocated().saturating_sub(heap_before).max(0) as u64;
    (result, files + heap)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_and_releases_are_counted_against_the_limit() {
        let mut budget = CacheBudget::new(100);
        let stats = budget.stats();
        budget.charge(60);
        assert!(!budget.over());
        budget.charge(60);
        assert!(budget.over());
        assert_eq!(stats.charged_bytes.load(Ordering::Relaxed), 120);
        budget.release(60);
        assert!(!budget.over());
        assert_eq!(stats.evictions.load(Ordering::Relaxed), 1);
        assert_eq!(stats.limit_bytes.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn kept_heap_and_mapped_file_pages_are_measured() {
        const SIZE: usize = 32 << 20;
        // What the work kept on this thread is charged, whatever other threads free meanwhile
        // (other tests run in parallel); what it allocated and freed is not. (The file pages'
        // part may grow a little on its own: the daemon's code faulting in.)
        let (kept, grown) = measure(|| vec![1u8; SIZE]);
        drop(kept);
        assert!(grown >= SIZE as u64, "heap: grew {grown} bytes");
        let (_, grown) = measure(|| drop(vec![1u8; SIZE]));
        assert!(grown < SIZE as u64 / 4, "heap: grew {grown} bytes");
        let before = thread_net_allocated();
        let kept = vec![1u8; SIZE];
        assert_eq!(thread_net_allocated() - before, SIZE as i64);
        drop(kept);
        assert_eq!(thread_net_allocated(), before);

        let file = tempfile::tempfile().expect("a file");
        file.set_len(SIZE as u64).expect("sized");
        let grown = (0..3)
            .map(|_| {
                // SAFETY: a fresh shared mapping of the file, read within its length and
                // unmapped once measured.
                unsafe {
                    let (mapping, grown) = measure(|| {
                        let mapping = libc::mmap(
                            std::ptr::null_mut(),
                            SIZE,
                            libc::PROT_READ,
                            libc::MAP_SHARED,
                            std::os::fd::AsRawFd::as_raw_fd(&file),
                            0,
                        );
                        assert_ne!(mapping, libc::MAP_FAILED);
                        for offset in (0..SIZE).step_by(4096) {
                            std::ptr::read_volatile(mapping.cast::<u8>().add(offset));
                        }
                        mapping
                    });
                    libc::munmap(mapping, SIZE);
                    grown
                }
            })
            .max()
            .unwrap_or(0);
        assert!(grown >= 24 << 20, "file pages: grew {grown} bytes");
    }
}
