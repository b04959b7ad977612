//! Code blobs found by earlier walks, kept across samples: a deep Java stack's frames are mostly
//! compiled methods the last samples walked too, and finding a blob from a pc costs the segment
//! map's hops, the heap block's header and the blob's fields (six or more dependent reads of the
//! sampled process), where proving a remembered one still in place costs one.
//!
//! # Why a remembered blob can be trusted
//!
//! An entry is tagged with its JVM's [`instance`](profiler_common::HotspotProc::instance), not
//! its pid: a pid is reused by the next process, an instance never. Within a JVM, the blob found
//! for a pc changes only when the code cache frees it and puts other code there. Before an entry
//! is used, the bytes from its heap block's header to the blob's compile id are read again, in
//! one read (see [`still_in_place`]), and must say:
//!
//! - the block is in use: HotSpot marks a block free the moment it frees it
//!   (`CodeHeap::add_to_freelist`), before merging it into a free neighbour, and a merge leaves
//!   the old header's bytes as they were;
//! - the blob's size, frame size and compile id are the remembered ones: HotSpot never gives two
//!   nmethods the same id, so a new nmethod placed at the very same address differs; and code
//!   placed over the old header (a block carved from free space that covers it) would have to
//!   repeat all four fields byte for byte.
//!
//! HotSpot carves a new block from the end of a free block, whose own header stays where it was,
//! so the header of a freed blob is either still there (marked free), rewritten as a new block's
//! (a new blob, its own fields), or overwritten by a new blob's contents.
//!
//! A stub has no compile id; the word read in its place is as stable as the stub, and stubs
//! live as long as the JVM but for rare adapter buffers.
//!
//! # When the read can be skipped
//!
//! Where the daemon hooked the JVM's `CodeCache::free` (`profiler-ebpf/src/code_frees.rs`),
//! the JVM's count of freed blobs moves before any blob's memory is given back. Each entry
//! keeps the count it was last proven (or found) at, read before that proof: while the count
//! is still that, nothing was freed since, and the entry is used without a read. A walk reads
//! the count once, before its first blob ([`crate::state::FreesSeen`]). The read is what a deep stack of
//! distinct compiled methods spends most on: the blob's header is a cache miss per frame,
//! since the code running in it never touches it.
//!
//! The table is per CPU (the BPF side keeps one, for the sampling walks), each blob in one of
//! two entries: a walk only ever reads and writes its own CPU's, and nothing else on that CPU
//! walks with it, so entries are never torn by a concurrent writer.

use core::mem::MaybeUninit;

use crate::memory::{field_i32, UserMemory};
use crate::state::BlobCache;
use profiler_common::HotspotProc;

/// log2 of [`RECENT_BLOBS`]: with the span buffer, the most a per-CPU map value holds (32 KiB,
/// the kernel's per-CPU allocation unit). A 200-frame stack of distinct compiled methods fits
/// with some collisions (256 entries kept about half of them).
const RECENT_BLOB_BITS: u32 = 9;

/// Entries of a [`RecentBlobTable`]: 32 KiB.
pub const RECENT_BLOBS: usize = 1 << RECENT_BLOB_BITS;

/// Addresses of one cache line map to one entry: a blob's nearby call sites share it.
const PC_GRANULE_BITS: u32 = 6;

/// The proof stamp of an entry found or proven while its JVM's frees were not counted: odd,
/// so never a count ([`profiler_common::CODE_FREE_STEP`] keeps counts even).
const UNCOUNTED: u32 = 1;

/// A blob an earlier walk found, with the JVM it belongs to (`instance` 0: empty) and when it
/// was last found or used (the table's `clock` then).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentBlob {
    pub instance: u32,
    pub stamp: u32,
    pub blob: BlobCache,
}

/// Bytes of a block's header and blob fields [`still_in_place`] reads back, at most: the
/// compile id is 212 to 324 bytes into an nmethod (JDK 11 to 27), its block header 8 or 16
/// bytes before it. A power of two, so that field offsets are bounded by a mask.
pub const BLOB_SPAN_BYTES: usize = 512;

/// Code blobs earlier walks on this CPU found, each kept in one of two entries its (JVM
/// instance, pc) hashes to, and the buffer a remembered blob's fields are read back into (the
/// BPF program's stack has no room for it).
///
/// Two places per blob, not one: a deep stack walked sample after sample repeats its blobs in
/// the same order, so two of them sharing their only entry would evict each other on every
/// walk (with one place, 200 distinct blobs in 512 entries lost about a fifth of their lookups
/// that way). A new blob takes a free or stale entry of its two, else the one used least
/// recently.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecentBlobTable {
    pub entries: [RecentBlob; RECENT_BLOBS],
    /// Each entry's JVM's count of code frees when its blob was last found or proven, or
    /// [`UNCOUNTED`].
    pub proven: [u32; RECENT_BLOBS],
    /// Counts the blobs remembered: the stamp of an entry found or used now.
    pub clock: u32,
    pub _reserved: u32,
    pub span: [u8; BLOB_SPAN_BYTES],
}

const _: () = assert!(core::mem::size_of::<RecentBlobTable>() <= 32 << 10);

impl RecentBlobTable {
    pub const EMPTY: Self = Self {
        entries: [RecentBlob {
            instance: 0,
            stamp: 0,
            blob: BlobCache::EMPTY,
        }; RECENT_BLOBS],
        proven: [UNCOUNTED; RECENT_BLOBS],
        clock: 0,
        _reserved: 0,
        span: [0; BLOB_SPAN_BYTES],
    };

    /// The two entries a blob at `pc` of JVM `instance` may be kept in: the top bits of two
    /// multiplicative hashes of both.
    #[inline(always)]
    fn candidates(instance: u32, pc: u64) -> [usize; 2] {
        let key = (pc >> PC_GRANULE_BITS) as u32 ^ instance.wrapping_mul(0x9e37_79b9);
        let top = |hash: u32| (hash >> (32 - RECENT_BLOB_BITS)) as usize & (RECENT_BLOBS - 1);
        [
            top(key.wrapping_mul(0x85eb_ca6b)),
            top(key.wrapping_mul(0xc2b2_ae35)),
        ]
    }

    /// Whether `entry` holds a blob of JVM `instance` that covers `pc`.
    #[inline(always)]
    fn covers(entry: &RecentBlob, instance: u32, pc: u64) -> bool {
        let blob = &entry.blob;
        entry.instance == instance && blob.blob != 0 && pc >= blob.code_begin && pc < blob.end
    }

    /// The entry holding a blob of JVM `instance` that covers `pc`, if one does.
    #[inline(always)]
    fn find(&self, instance: u32, pc: u64) -> Option<usize> {
        if instance == 0 {
            return None;
        }
        Self::candidates(instance, pc).into_iter().find(|&index| {
            self.entries
                .get(index)
                .is_some_and(|entry| Self::covers(entry, instance, pc))
        })
    }

    /// Copies entry `index`'s blob into `out`, and marks it used now.
    #[inline(always)]
    fn use_entry(&mut self, index: usize, out: &mut BlobCache) {
        let clock = self.clock;
        if let Some(entry) = self.entries.get_mut(index) {
            entry.stamp = clock;
            *out = entry.blob;
        }
    }

    /// Copies the blob remembered for `pc` of JVM `instance`, not yet proven still in place,
    /// into `out`; its entry's index, or None (and `out` untouched) if there is none.
    #[inline(always)]
    pub fn recall_into(&mut self, instance: u32, pc: u64, out: &mut BlobCache) -> Option<usize> {
        let index = self.find(instance, pc)?;
        self.use_entry(index, out);
        Some(index)
    }

    /// Copies the blob remembered for `pc` of JVM `instance` into `out` only if it was proven
    /// at the count of code frees `frees` (nothing freed since): true if it was. Otherwise
    /// `out` is untouched: it still holds a blob that is known good.
    #[inline(always)]
    pub fn recall_proven_into(
        &mut self,
        instance: u32,
        pc: u64,
        frees: u32,
        out: &mut BlobCache,
    ) -> bool {
        match self.find(instance, pc) {
            Some(index) if self.proven_at(index, Some(frees)) => {
                self.use_entry(index, out);
                true
            }
            _ => false,
        }
    }

    /// Whether entry `index` was proven at the count of code frees `frees` (its JVM's now):
    /// nothing was freed since, and its blob is still in place.
    #[inline(always)]
    pub fn proven_at(&self, index: usize, frees: Option<u32>) -> bool {
        match (frees, self.proven.get(index)) {
            (Some(frees), Some(proven)) => *proven == frees,
            _ => false,
        }
    }

    /// Entry `index` was proven (or found) at the count of code frees `frees`, read before.
    #[inline(always)]
    pub fn mark_proven(&mut self, index: usize, frees: Option<u32>) {
        if let Some(proven) = self.proven.get_mut(index) {
            *proven = frees.unwrap_or(UNCOUNTED);
        }
    }

    /// Remembers `blob`, just found for `pc` of JVM `instance` (whose count of code frees was
    /// `frees` before it was read): in the entry of its two that is empty or holds an older
    /// blob for `pc` (freed since), else in the one used least recently.
    #[inline(always)]
    pub fn remember(&mut self, instance: u32, pc: u64, blob: &BlobCache, frees: Option<u32>) {
        if instance == 0 {
            return;
        }
        self.clock = self.clock.wrapping_add(1);
        let clock = self.clock;
        let [first, second] = Self::candidates(instance, pc);
        let (Some(a), Some(b)) = (self.entries.get(first), self.entries.get(second)) else {
            return;
        };
        let free_or_stale =
            |entry: &RecentBlob| entry.instance == 0 || Self::covers(entry, instance, pc);
        let age = |entry: &RecentBlob| clock.wrapping_sub(entry.stamp);
        let index = if free_or_stale(a) {
            first
        } else if free_or_stale(b) || age(b) > age(a) {
            second
        } else {
            first
        };
        if let Some(entry) = self.entries.get_mut(index) {
            *entry = RecentBlob {
                instance,
                stamp: clock,
                blob: *blob,
            };
        }
        self.mark_proven(index, frees);
    }
}

impl Default for RecentBlobTable {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Where the walk keeps its [`RecentBlobTable`] (the BPF side: a per-CPU map slot), and the
/// sampled JVM's count of code frees.
pub trait RecentBlobs {
    /// Runs `use_table` on the table; None if there is none.
    fn with_recent_blobs<R>(&self, use_table: impl FnOnce(&mut RecentBlobTable) -> R) -> Option<R>;

    /// The count of the code blobs the sampled JVM (its `instance`) freed, if they are counted.
    fn code_frees(&self, instance: u32) -> Option<u32>;
}

/// Whether `blob`, found earlier in this JVM, is still the blob at its address (see the
/// module's documentation): one read of the sampled process, into `span`. False also when the
/// JVM's layout puts the compile id beyond [`BLOB_SPAN_BYTES`] (the blob is then found anew).
#[inline(always)]
pub(crate) fn still_in_place<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    blob: &BlobCache,
    span: &mut [u8; BLOB_SPAN_BYTES],
) -> bool {
    let header = hs.heap_block_size as usize;
    let len = header + hs.nmethod_compile_id as usize + 4;
    if len > BLOB_SPAN_BYTES {
        return false;
    }
    let Some(dst) = span.get_mut(..len) else {
        return false;
    };
    // SAFETY: the same bytes seen as possibly uninitialised; a read only ever writes bytes.
    let dst = unsafe { &mut *(dst as *mut [u8] as *mut [MaybeUninit<u8>]) };
    if !memory.read_into(blob.blob.wrapping_sub(header as u64), dst) {
        return false;
    }
    let used = span[hs.heap_block_used as usize & (BLOB_SPAN_BYTES - 1)];
    let size = field_i32(span, header + hs.blob_size as usize);
    let frame_size = field_i32(span, header + hs.blob_frame_size as usize);
    let compile_id = field_i32(span, header + hs.nmethod_compile_id as usize) as u32;
    used != 0
        && size as i64 as u64 == blob.end.wrapping_sub(blob.blob)
        && frame_size == blob.frame_size
        && compile_id == blob.compile_id
}

#[cfg(test)]
mod tests {
    use super::*;

    const JVM: u32 = 7;

    fn blob_at(code_begin: u64) -> BlobCache {
        BlobCache {
            blob: code_begin - 0x80,
            code_begin,
            end: code_begin + 0x40,
            compile_id: code_begin as u32,
            ..BlobCache::EMPTY
        }
    }

    /// Blobs (one 64-byte line of code each) whose first entry is `first`'s, and their second
    /// entries, differing from each other's.
    fn sharing_first_entry(count: usize) -> Vec<u64> {
        let first = RecentBlobTable::candidates(JVM, 0x1000)[0];
        let mut seconds = Vec::new();
        let mut pcs = Vec::new();
        for pc in (0x1000u64..0x1000 + (64 << 20)).step_by(64) {
            let [a, b] = RecentBlobTable::candidates(JVM, pc);
            if a == first && b != first && !seconds.contains(&b) {
                seconds.push(b);
                pcs.push(pc);
            }
            if pcs.len() == count {
                return pcs;
            }
        }
        panic!("no {count} lines share a first entry with distinct second ones");
    }

    fn recalled(table: &mut RecentBlobTable, pc: u64) -> Option<BlobCache> {
        let mut out = BlobCache::EMPTY;
        table.recall_into(JVM, pc, &mut out).map(|_| out)
    }

    #[test]
    fn two_blobs_whose_first_entries_collide_both_stay() {
        let mut table = Box::new(RecentBlobTable::EMPTY);
        let pcs = sharing_first_entry(2);
        for _ in 0..3 {
            for &pc in &pcs {
                if recalled(&mut table, pc).is_none() {
                    table.remember(JVM, pc, &blob_at(pc), None);
                }
            }
        }
        for &pc in &pcs {
            assert_eq!(recalled(&mut table, pc), Some(blob_at(pc)));
        }
        assert_eq!(table.clock, 2, "each found once");
    }

    /// Blob `c` remembered when both its entries are taken: its first by `a` (remembered at
    /// clock 1), its second by another JVM's blob last used at `other_stamp`. Whether `a` is
    /// still recalled after.
    fn a_stays_after_c_when_the_other_was_used_at(other_stamp: u32) -> bool {
        let mut table = Box::new(RecentBlobTable::EMPTY);
        let [a, c] = sharing_first_entry(2)[..] else {
            unreachable!()
        };
        table.remember(JVM, a, &blob_at(a), None);
        let c_second = RecentBlobTable::candidates(JVM, c)[1];
        table.entries[c_second] = RecentBlob {
            instance: JVM + 1,
            stamp: other_stamp,
            blob: blob_at(0x40_0000),
        };
        table.remember(JVM, c, &blob_at(c), None);
        assert_eq!(recalled(&mut table, c), Some(blob_at(c)));
        recalled(&mut table, a).is_some()
    }

    #[test]
    fn a_new_blob_takes_the_place_used_least_recently() {
        assert!(a_stays_after_c_when_the_other_was_used_at(0));
        assert!(!a_stays_after_c_when_the_other_was_used_at(2));
    }

    #[test]
    fn a_blob_found_anew_replaces_its_stale_copy() {
        let mut table = Box::new(RecentBlobTable::EMPTY);
        let [a, b] = sharing_first_entry(2)[..] else {
            unreachable!()
        };
        table.remember(JVM, a, &blob_at(a), None);
        table.remember(JVM, b, &blob_at(b), None);
        // `a` freed and compiled again at the same place: its new blob replaces the old copy
        // rather than evicting `b`.
        let again = BlobCache {
            compile_id: 99,
            ..blob_at(a)
        };
        table.remember(JVM, a, &again, None);
        assert_eq!(recalled(&mut table, a), Some(again));
        assert_eq!(recalled(&mut table, b), Some(blob_at(b)));
    }

    #[test]
    fn an_entry_is_trusted_only_at_the_count_it_was_proven_at() {
        let mut table = Box::new(RecentBlobTable::EMPTY);
        let pc = 0x1000;
        table.remember(JVM, pc, &blob_at(pc), Some(8));
        let mut out = BlobCache::EMPTY;
        let index = table.recall_into(JVM, pc, &mut out).expect("remembered");
        assert!(table.proven_at(index, Some(8)));
        // A free since: proven again before use.
        assert!(!table.proven_at(index, Some(10)));
        // Frees not counted (the hook away): never trusted.
        assert!(!table.proven_at(index, None));
        // Proven at the new count: trusted at it, not at the old one.
        table.mark_proven(index, Some(10));
        assert!(table.proven_at(index, Some(10)));
        assert!(!table.proven_at(index, Some(8)));
        // Found while frees were not counted: no count matches its stamp.
        table.mark_proven(index, None);
        for count in (0..64).step_by(profiler_common::CODE_FREE_STEP as usize) {
            assert!(!table.proven_at(index, Some(count)));
        }
    }
}
