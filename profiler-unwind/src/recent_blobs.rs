//! Code blobs found by earlier walks, kept across samples: a deep Java stack's frames are mostly
//! compiled methods the last samples walked too, and finding a blob from a pc costs the segment
//! map's hops, the heap block's header and the blob's fields (six or more dependent reads of the
//! sampled process), where proving a remembered one still in place costs three.
//!
//! # Why a remembered blob can be trusted
//!
//! An entry is tagged with its JVM's [`instance`](profiler_common::HotspotProc::instance), not
//! its pid: a pid is reused by the next process, an instance never. Within a JVM, the blob found
//! for a pc changes only when the code cache frees it and puts other code there, so before an
//! entry is used, three facts of the sampled process are read again (see [`still_in_place`]):
//!
//! - the segment map still marks a block start at the blob's block: a freed block merged into
//!   the free block before it, and code placed anywhere in that free block, change it;
//! - that block is in use: a freed one not merged keeps its old header bytes;
//! - the blob's compile id is the remembered one: HotSpot never gives two nmethods the same
//!   id, so a new nmethod placed at the very same address differs.
//!
//! A stub has no compile id; the word read in its place is as stable as the stub, and stubs
//! live as long as the JVM but for rare adapter buffers.
//!
//! The table is direct-mapped and per CPU (the BPF side keeps one, for the sampling walks): a
//! walk only ever reads and writes its own CPU's, and nothing else on that CPU walks with it, so
//! entries are never torn by a concurrent writer.

use crate::memory::UserMemory;
use crate::state::BlobCache;
use profiler_common::HotspotProc;

/// log2 of [`RECENT_BLOBS`]: the most a per-CPU map value holds (32 KiB, the kernel's per-CPU
/// allocation unit). A 200-frame stack of distinct compiled methods fits with some collisions
/// (256 entries kept about half of them).
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

/// Code blobs earlier walks on this CPU found, direct-mapped by (JVM instance, pc).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecentBlobTable {
    pub entries: [RecentBlob; RECENT_BLOBS],
}

const _: () = assert!(core::mem::size_of::<RecentBlobTable>() <= 32 << 10);

impl RecentBlobTable {
    pub const EMPTY: Self = Self {
        entries: [RecentBlob {
            instance: 0,
            _reserved: 0,
            blob: BlobCache::EMPTY,
        }; RECENT_BLOBS],
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
/// module's documentation): three reads of the sampled process.
#[inline(always)]
pub(crate) fn still_in_place<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    blob: &BlobCache,
) -> bool {
    let block = blob.blob.wrapping_sub(hs.heap_block_size as u64);
    memory.read_u8(blob.segment_map_entry) == Ok(0)
        && memory
            .read_u8(block.wrapping_add(hs.heap_block_used as u64))
            .is_ok_and(|used| used != 0)
        && memory.read_u32(blob.blob.wrapping_add(hs.nmethod_compile_id as u64))
            == Ok(blob.compile_id)
}
