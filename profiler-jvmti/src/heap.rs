//! The agent's own heap, counted: every allocation the agent's Rust code makes goes through
//! [`CountingAllocator`] (the JVM's own `malloc` calls do not), so the bytes the agent holds
//! are known exactly and reported to the daemon. Two relaxed atomic operations per allocation,
//! in callbacks that already allocate to build a record.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

static LIVE_BYTES: AtomicU64 = AtomicU64::new(0);
static PEAK_BYTES: AtomicU64 = AtomicU64::new(0);

/// The system allocator, with the bytes it handed out and not yet got back counted.
pub struct CountingAllocator;

fn grew(bytes: usize) {
    let live = LIVE_BYTES.fetch_add(bytes as u64, Ordering::Relaxed) + bytes as u64;
    PEAK_BYTES.fetch_max(live, Ordering::Relaxed);
}

fn shrank(bytes: usize) {
    LIVE_BYTES.fetch_sub(bytes as u64, Ordering::Relaxed);
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged; the counting
// touches only atomics and never allocates.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded as received.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            grew(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded as received.
        unsafe { System.dealloc(ptr, layout) };
        shrank(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: forwarded as received.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            // Counted as a release then an allocation, so the peak sees the new size.
            shrank(layout.size());
            grew(new_size);
        }
        new
    }
}

/// Bytes the agent holds now.
pub fn live_bytes() -> u64 {
    LIVE_BYTES.load(Ordering::Relaxed)
}

/// The most the agent ever held at once.
pub fn peak_bytes() -> u64 {
    PEAK_BYTES.load(Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_counted_while_held_and_released_after() {
        // Other tests' threads allocate too: only what this buffer adds is certain.
        let buffer: Vec<u8> = Vec::with_capacity(64 << 20);
        assert!(live_bytes() >= 64 << 20);
        assert!(peak_bytes() >= 64 << 20);
        let mut grown = buffer;
        grown.reserve_exact(128 << 20);
        assert!(live_bytes() >= 128 << 20);
        drop(grown);
        assert!(live_bytes() < 64 << 20);
        assert!(peak_bytes() >= 128 << 20);
    }
}
