//! Which Java frames the sampling loop already sent the Java name reader to read early
//! (`symbolize::java_reader`) this interval: a frame of a new stack is sent only the first time
//! it is met.
//!
//! New stacks keep coming long after their frames are all known (a busy JVM's stacks vary in
//! their mix of the same methods), and each drain that found a frame to read was followed by
//! another 50 ms later at start-up: with 20 JVMs, those drains were a sixth of the daemon's CPU
//! in its first 40 s, for frames the reader had read already. Forgotten at each interval's end,
//! so that a frame whose read was lost (a full queue, a JVM not ready yet) is sent again then.

/// Entries of the table: 128 KiB. A frame whose entry another frame took is sent again, which
/// costs the reader a cache lookup, nothing more.
const SLOTS: usize = 1 << 14;

/// Keys of the Java frames sent, each in the one slot its key hashes to (0: empty).
pub(super) struct PrefetchedFrames {
    slots: Box<[u64; SLOTS]>,
}

impl PrefetchedFrames {
    pub(super) fn new() -> Self {
        Self {
            slots: Box::new([0; SLOTS]),
        }
    }

    /// True the first time the frame `(addr, cookie)` of process `pid` is met since the last
    /// [`PrefetchedFrames::forget`] (as far as its slot remembers), and notes it.
    pub(super) fn first_time(&mut self, pid: u32, addr: u64, cookie: u32) -> bool {
        let key = key(pid, addr, cookie);
        let slot = &mut self.slots[(key >> (64 - SLOTS.trailing_zeros())) as usize];
        if *slot == key {
            return false;
        }
        *slot = key;
        true
    }

    /// Forgets every frame: a new interval.
    pub(super) fn forget(&mut self) {
        self.slots.fill(0);
    }
}

/// A 64-bit mix of the frame's identity, never 0. What tells Java frames apart for naming is
/// the process, the `Method*` or code blob, and the cookie (the reader dedups the same way).
fn key(pid: u32, addr: u64, cookie: u32) -> u64 {
    let mut hash = addr.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    hash ^= (u64::from(pid) << 32 | u64::from(cookie)).wrapping_mul(0xc2b2_ae3d_27d4_eb4f);
    hash ^= hash >> 29;
    hash.wrapping_mul(0xbf58_476d_1ce4_e5b9).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_frame_is_sent_once_per_interval() {
        let mut sent = PrefetchedFrames::new();
        assert!(sent.first_time(10, 0x7f00_0000_1000, 7));
        assert!(!sent.first_time(10, 0x7f00_0000_1000, 7));
        // Another process, blob or compile id is another frame.
        assert!(sent.first_time(11, 0x7f00_0000_1000, 7));
        assert!(sent.first_time(10, 0x7f00_0000_1040, 7));
        assert!(sent.first_time(10, 0x7f00_0000_1000, 8));
        sent.forget();
        assert!(sent.first_time(10, 0x7f00_0000_1000, 7));
    }
}
