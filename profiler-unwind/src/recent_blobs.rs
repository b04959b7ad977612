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
//! The table is direct-mapped and per CPU (the BPF side keeps one, for the sampling walks): a
//! walk only ever reads and writes its own CPU's, and nothing else on that CPU walks with it, so
//! entries are never torn by a concurrent writer.

use core::mem::MaybeUninit;

use crate::hotspot::field_i32;
use crate::memory::UserMemory;
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

/// A blob an earlier walk found, with the JVM it belongs to (`instance` 0: empty).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentBlob {
    pub instance: u32,
    pub _reserved: u32,
    pub blob: BlobCache,
}

/// Bytes of a block's header and blob fields [`still_in_place`] reads back, at most: the
/// compile id is 212 to 324 bytes into an nmethod (JDK 11 to 27), its block header 8 or 16
/// bytes before it. A power of two, so that field offsets are bounded by a mask.
pub const BLOB_SPAN_BYTES: usize = 512;

/// Code blobs earlier walks on this CPU found, direct-mapped by (JVM instance, pc), and the
/// buffer a remembered blob's fields are read back into (the BPF program's stack has no room
/// for it).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecentBlobTable {
    pub entries: [RecentBlob; RECENT_BLOBS],
    pub span: [u8; BLOB_SPAN_BYTES],
}

const _: () = assert!(core::mem::size_of::<RecentBlobTable>() <= 32 << 10);

impl RecentBlobTable {
    pub const EMPTY: Self = Self {
        entries: [RecentBlob {
            instance: 0,
            _reserved: 0,
            blob: BlobCache::EMPTY,
        }; RECENT_BLOBS],
        span: [0; BLOB_SPAN_BYTES],
    };

    /// The entry for `pc` of JVM `instance`: a multiplicative hash of both, its top bits.
    #[inline(always)]
    fn index(instance: u32, pc: u64) -> usize {
        let granule = (pc >> PC_GRANULE_BITS) as u32;
        let hash = (granule ^ instance.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b);
        (hash >> (32 - RECENT_BLOB_BITS)) as usize & (RECENT_BLOBS - 1)
    }

    /// Copies the blob remembered for `pc` of JVM `instance`, not yet proven still in place,
    /// into `out`; false (and `out` untouched) if there is none.
    #[inline(always)]
    pub fn recall_into(&self, instance: u32, pc: u64, out: &mut BlobCache) -> bool {
        if instance == 0 {
            return false;
        }
        let Some(entry) = self.entries.get(Self::index(instance, pc)) else {
            return false;
        };
        let blob = &entry.blob;
        if entry.instance != instance || blob.blob == 0 || pc < blob.code_begin || pc >= blob.end {
            return false;
        }
        *out = *blob;
        true
    }

    /// Remembers `blob`, just found for `pc` of JVM `instance`, in place of whatever shared
    /// its entry.
    #[inline(always)]
    pub fn remember(&mut self, instance: u32, pc: u64, blob: &BlobCache) {
        if instance == 0 {
            return;
        }
        if let Some(entry) = self.entries.get_mut(Self::index(instance, pc)) {
            entry.instance = instance;
            entry.blob = *blob;
        }
    }
}

impl Default for RecentBlobTable {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Where the walk keeps its [`RecentBlobTable`] (the BPF side: a per-CPU map slot).
pub trait RecentBlobs {
    /// Runs `use_table` on the table; None if there is none.
    fn with_recent_blobs<R>(&self, use_table: impl FnOnce(&mut RecentBlobTable) -> R) -> Option<R>;
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
