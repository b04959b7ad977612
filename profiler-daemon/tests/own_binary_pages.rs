//! The daemon's own binary in the page cache (`own_memory::drop_unmapped_own_binary_pages`),
//! in a test process of its own: the test binary stands for the daemon's, and no other test
//! reads it meanwhile.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;

/// The share of `file`'s pages from `offset` to `end` that are in the page cache (`mincore`
/// on a mapping of them, which faults nothing in).
fn cached_share(file: &File, offset: u64, end: u64) -> f64 {
    let len = (end - offset) as usize;
    // SAFETY: a fresh read-only mapping of our own descriptor, unmapped below; never read.
    let at = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            file.as_raw_fd(),
            offset as libc::off_t,
        )
    };
    assert_ne!(at, libc::MAP_FAILED, "the file maps");
    let pages = len.div_ceil(4096);
    let mut resident = vec![0u8; pages];
    // SAFETY: `resident` has one byte per page of the mapping.
    let status = unsafe { libc::mincore(at, len, resident.as_mut_ptr()) };
    // SAFETY: the mapping made above, of `len` bytes.
    unsafe { libc::munmap(at, len) };
    assert_eq!(status, 0, "mincore");
    resident.iter().filter(|&&page| page & 1 != 0).count() as f64 / pages as f64
}

#[test]
fn the_pages_of_the_own_binary_that_no_mapping_holds_are_dropped() {
    let exe = std::fs::read_link("/proc/self/exe").expect("own binary");
    let file = File::open(&exe).expect("opens");
    // Just linked, its pages may still be dirty, which no advice drops: written back first.
    file.sync_all().expect("fsync");
    let len = file.metadata().expect("metadata").len();
    // The last 4 MiB of a debug build: DWARF and section headers, which no process maps.
    let tail = 4 << 20;
    assert!(len > 4 * tail, "a debug build: {len} bytes");
    let offset = (len - tail) & !4095;
    let mut bytes = vec![0u8; (len - offset) as usize];
    file.read_exact_at(&mut bytes, offset).expect("reads");
    let before = cached_share(&file, offset, len);
    assert!(before > 0.9, "{before} of the tail cached after reading it");

    profiler_daemon::own_memory::drop_unmapped_own_binary_pages();

    let after = cached_share(&file, offset, len);
    assert!(after < 0.1, "{after} of the tail still cached");
}
