//! The daemon's own memory: its heap as its allocator (glibc's malloc) accounts for it (memory
//! handed out, and freed but kept: a resident set that grows while the first stays flat is the
//! allocator holding on to freed memory, not a structure of ours growing), freed pages handed
//! back, and its own binary's pages read only as its code runs.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

/// The daemon's allocator: glibc's malloc (see [`settle_allocator`]), with what each thread
/// allocated less what it freed counted in that thread, without a lock or an atomic: what
/// [`thread_net_allocated`] reads. The symbolizer charges what parsing and looking up a binary
/// kept to the cache budget that way, where asking malloc (`mallinfo2`, which walks every free
/// chunk of every arena) cost 7% of its time with 20 JVMs.
pub struct ThreadCountingAllocator;

#[global_allocator]
static ALLOCATOR: ThreadCountingAllocator = ThreadCountingAllocator;

thread_local! {
    /// Constant-initialised and without a destructor: usable from the allocator at any point
    /// of a thread's life.
    static THREAD_NET_ALLOCATED: Cell<i64> = const { Cell::new(0) };
}

#[inline]
fn count(bytes: i64) {
    let _ = THREAD_NET_ALLOCATED.try_with(|net| net.set(net.get().wrapping_add(bytes)));
}

// SAFETY: every call goes to `System` with its arguments unchanged; counting touches no heap.
unsafe impl GlobalAlloc for ThreadCountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract, passed on.
        let block = unsafe { System.alloc(layout) };
        if !block.is_null() {
            count(layout.size() as i64);
        }
        block
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: as above.
        let block = unsafe { System.alloc_zeroed(layout) };
        if !block.is_null() {
            count(layout.size() as i64);
        }
        block
    }

    unsafe fn dealloc(&self, block: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(block, layout) };
        count(-(layout.size() as i64));
    }

    unsafe fn realloc(&self, block: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let moved = unsafe { System.realloc(block, layout, new_size) };
        if !moved.is_null() {
            count(new_size as i64 - layout.size() as i64);
        }
        moved
    }
}

/// What the calling thread has allocated and not freed since it started (negative when it
/// freed more than it allocated: memory another thread allocated). Differences of it measure
/// what a piece of work on this thread kept.
pub fn thread_net_allocated() -> i64 {
    THREAD_NET_ALLOCATED.try_with(Cell::get).unwrap_or(0)
}

/// Bytes of the heap, summed over every malloc arena and its large mmapped blocks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Allocated and not yet freed.
    pub in_use_bytes: u64,
    /// Freed, kept by the allocator for reuse (part of it may be returned to the kernel and so
    /// not resident).
    pub free_bytes: u64,
}

/// The heap's figures now. `mallinfo2` locks each arena in turn: once per scrape, never on
/// the sampling path.
pub fn heap_stats() -> HeapStats {
    // SAFETY: no preconditions; returns a struct by value.
    let info = unsafe { libc::mallinfo2() };
    HeapStats {
        in_use_bytes: (info.uordblks + info.hblkhd) as u64,
        free_bytes: info.fordblks as u64,
    }
}

/// The `profiler_heap_bytes` family: [`heap_stats`] at each scrape.
pub struct HeapMetrics;

impl crate::metrics::families::MetricSource for HeapMetrics {
    fn encode(&self, out: &mut crate::metrics::families::Families) -> std::fmt::Result {
        use profiler_common::metric::{self, heap_state};
        let heap = heap_stats();
        out.gauges(
            metric::HEAP_BYTES,
            "The daemon's heap as its allocator counts it: in use, and freed but kept (a resident \
             set growing while in_use stays flat is the allocator's, not a growing structure).",
            crate::metrics::families::by(
                "state",
                [
                    (heap_state::IN_USE, heap.in_use_bytes),
                    (heap_state::FREE, heap.free_bytes),
                ],
            ),
        )
    }
}

/// Sets how glibc's malloc keeps memory, before the daemon starts a thread. Two of its defaults
/// cost the daemon tens of megabytes of memory freed but still resident:
/// - up to eight arenas per CPU, one for each thread that meets a locked one: each keeps its own
///   freed memory, fragmented apart from the others'. The daemon's threads allocate little but
///   off the sampling path, where two arenas are contention enough.
/// - a threshold for serving a block with its own mapping that rises to the largest such block
///   freed (up to 32 MiB): after the first large symbol table is freed, every later one is carved
///   from an arena, and its pages stay there, pinned by whatever small block lands beside them.
///   A fixed 256 KiB keeps large blocks in mappings of their own, unmapped when freed.
///
/// Side by side on a whole-host run with a cold release build (docs/benchmarks.md): the same
/// heap in use, 40 MB less anonymous memory. Tested in `tests/allocator.rs`, a process of its
/// own (the setting is process-wide).
pub fn settle_allocator() {
    // SAFETY: no preconditions; called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 256 << 10);
    }
}

/// Gives the kernel back the free pages of every arena (`malloc_trim`): glibc returns only the
/// top of an arena by itself, so pages freed below a live allocation stay resident until
/// reused. Walks the arenas' free chunks: a few milliseconds for a heap of 100 MB, done once per
/// interval.
pub fn release_free_pages() {
    // SAFETY: no preconditions.
    unsafe { libc::malloc_trim(0) };
}

/// Keeps only the pages of the daemon's own binary that its code uses resident. At exec the
/// kernel reads an executable ahead in large windows: all of the daemon's 14 MB of code (most
/// of it is an HTTP server, a gRPC stack and a Kubernetes client it runs rarely or never) and
/// megabytes of debug sections past it, page cache charged to the daemon's cgroup. So, once, at
/// start: its read-only mappings are read page by page from now on (`MADV_RANDOM`) and given
/// back (`MADV_PAGEOUT`), and the file's pages no mapping holds are dropped
/// (`POSIX_FADV_DONTNEED`); what the code runs faults back in. Best effort: a failure changes
/// nothing else.
///
/// The kernel still reads the code back in large chunks as it first runs (Linux 6.18: 12.3 of
/// the 13.6 MB of code cached again 0.3 s after the drop, 7 MB of it mapped), so the drop is
/// repeated after each interval ([`drop_unmapped_own_binary_pages`]).
pub fn read_own_binary_as_run() {
    let Ok(exe) = std::fs::read_link("/proc/self/exe") else {
        return;
    };
    let Ok(maps) = std::fs::read_to_string("/proc/self/maps") else {
        return;
    };
    for (start, end) in maps
        .lines()
        .filter_map(|line| own_read_only_mapping(line, &exe))
    {
        let (start, len) = (start as *mut libc::c_void, (end - start) as usize);
        // SAFETY: advice on read-only ranges of our own address space, which changes no
        // contents: file pages are read again on the next access, and anonymous ones (relocated
        // read-only data) are left alone without swap or come back from it.
        unsafe {
            libc::madvise(start, len, libc::MADV_RANDOM);
            libc::madvise(start, len, libc::MADV_PAGEOUT);
        }
    }
    drop_unmapped_pages_of(&exe);
}

/// Drops the page cache of the daemon's own binary that no mapping holds: the code read along
/// with what runs, and never run. Once an interval has passed, what the daemon runs is mapped
/// and stays; what goes is what the kernel read around it (about 6 MB of a one-JVM run's 25 MB
/// of page cache). One `posix_fadvise` call, after each interval.
pub fn drop_unmapped_own_binary_pages() {
    if let Ok(exe) = std::fs::read_link("/proc/self/exe") {
        drop_unmapped_pages_of(&exe);
    }
}

/// `POSIX_FADV_DONTNEED` on the whole of `path`: the kernel drops its clean pages that no
/// process maps. Best effort.
fn drop_unmapped_pages_of(path: &std::path::Path) {
    if let Ok(file) = std::fs::File::open(path) {
        // SAFETY: advice on a descriptor we own, for the whole file.
        unsafe {
            libc::posix_fadvise(
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
                0,
                libc::POSIX_FADV_DONTNEED,
            )
        };
    }
}

/// The address range of a `/proc/self/maps` line if it maps `exe` read-only (its writable
/// mappings hold its relocated data, anonymous once written).
fn own_read_only_mapping(line: &str, exe: &std::path::Path) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    if fields.next()?.contains('w') {
        return None;
    }
    let path = &line[line.find('/')?..];
    if std::path::Path::new(path) != exe {
        return None;
    }
    let (start, end) = range.split_once('-')?;
    let start = u64::from_str_radix(start, 16).ok()?;
    let end = u64::from_str_radix(end, 16).ok()?;
    (end > start).then_some((start, end))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_read_only_mappings_are_found_by_path() {
        let exe = std::path::Path::new("/usr/bin/profiler-daemon");
        let line = "5581d6e00000-5581d7a00000 r-xp 00577000 fd:01 1234   /usr/bin/profiler-daemon";
        let found = own_read_only_mapping(line, exe);
        assert_eq!(found, Some((0x5581_d6e0_0000, 0x5581_d7a0_0000)));
        let data = "5581d7a00000-5581d7b00000 rw-p 01277000 fd:01 1234   /usr/bin/profiler-daemon";
        assert_eq!(own_read_only_mapping(data, exe), None);
        let other = "7f00d6e00000-7f00d7a00000 r-xp 00000000 fd:01 99   /usr/lib/libc.so.6";
        assert_eq!(own_read_only_mapping(other, exe), None);
        let anonymous = "7f00d6e00000-7f00d7a00000 r--p 00000000 00:00 0";
        assert_eq!(own_read_only_mapping(anonymous, exe), None);
    }

    /// The counts are the whole process's, and other tests allocate and free at the same time
    /// (tens of MB when they build unwind tables): a few tries, one of which must see both
    /// changes.
    #[test]
    fn a_live_allocation_counts_as_in_use_until_it_is_freed() {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = heap_stats();
            // Through `black_box`: an optimised build may drop an allocation nobody reads.
            let block = std::hint::black_box(vec![1u8; 64 << 20]);
            let during = heap_stats();
            drop(std::hint::black_box(block));
            let after = heap_stats();
            if during.in_use_bytes >= before.in_use_bytes + (48 << 20)
                && after.in_use_bytes + (48 << 20) <= during.in_use_bytes
            {
                return;
            }
            seen.push((before, during, after));
        }
        panic!("a 64 MiB block was never seen in use, then freed: {seen:?}");
    }
}
