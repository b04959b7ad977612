//! The walker's view of the sampled process (see `profiler_unwind`), in the kernel: reads of user
//! memory with `bpf_probe_read_user`, Java threads from `JAVA_THREADS`, native unwind tables from
//! the `CFI_*` maps, and the per-CPU window the thread's stack is read through. None of these
//! reads can fault; a failed one is a value.

use core::ffi::c_void;
use core::mem::MaybeUninit;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated as gen},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::cfi::{
    cfi_block_key, find_cfi_row_cached, CfiBlock, CfiCache, CfiProcess, CfiRow, CfiRowCache,
    CfiTableIndex, Opaque, DEFAULT_CFI_BLOCKS, MAX_CFI_PROCESSES, MAX_CFI_TABLES,
};
use profiler_common::{JavaThreadEntry, MAX_JAVA_THREADS};
use profiler_unwind::{
    JavaThreads, NativeTables, ReadError, RecentBlobTable, RecentBlobs, UserMemory, SCRATCH_BYTES,
};

/// The buffers `UserMemory::with_scratch` lends, one per [`WalkSlot`](crate::WalkSlot).
#[map]
static SCRATCH_BUFFER: PerCpuArray<[u8; SCRATCH_BYTES]> =
    PerCpuArray::with_max_entries(crate::WALK_SLOTS, 0);

/// Host tid -> `JavaThread*` (and its JVM's pid) of every Java thread of the JVMs in `HOTSPOT_PROCS`; written by the
/// daemon. Lets the walk resume at a thread's last Java frame when native code without frame
/// pointers (a JNI library, libc) hides the way back. Not preallocated: preallocated, its
/// 65,536 slots were 5.8 MB of the daemon's charged memory however few threads were in it.
#[map]
pub(crate) static JAVA_THREADS: HashMap<u32, JavaThreadEntry> =
    HashMap::with_max_entries(MAX_JAVA_THREADS, crate::DAEMON_MAP_FLAGS);

/// Native unwind tables, written by the daemon (`native_unwind::loader`): per process, its
/// executable mappings that have a table (pid -> [`CfiProcess`]); per table, which block holds a
/// pc; the blocks of rows. Hash maps without preallocation, so that their memory (charged to the
/// daemon's cgroup) follows the tables loaded; the daemon bounds it (`cache_budget_mib`).
/// A process's entry is removed here when it execs or exits (`process_events.rs`): the daemon
/// cannot be quick enough to keep another program's stacks from being walked by its old tables.
#[map]
pub(crate) static CFI_PROCS: HashMap<u32, CfiProcess> =
    HashMap::with_max_entries(MAX_CFI_PROCESSES, crate::DAEMON_MAP_FLAGS);

#[map]
static CFI_TABLES: HashMap<u32, CfiTableIndex> =
    HashMap::with_max_entries(MAX_CFI_TABLES, crate::DAEMON_MAP_FLAGS);

/// Sized by the daemon at load time from its memory budget.
#[map]
static CFI_BLOCKS: HashMap<u64, CfiBlock> =
    HashMap::with_max_entries(DEFAULT_CFI_BLOCKS, crate::DAEMON_MAP_FLAGS);

/// Rows found by earlier walks on this CPU (see `cfi::CfiRowCache`).
#[map]
static CFI_ROW_CACHE: PerCpuArray<CfiRowCache> =
    PerCpuArray::with_max_entries(crate::WALK_SLOTS, 0);

/// Code blobs found by earlier walks on this CPU (see `profiler_unwind::RecentBlobTable`): one
/// table, 32 KiB per CPU, for the sampling walks ([`WalkSlot::Interrupt`](crate::WalkSlot)).
/// The allocation hooks' walks, which a sample may interrupt on the same CPU (a write torn
/// between the two would describe no blob), have none: their slot is past the map's end, and
/// they find every blob anew.
#[map]
static RECENT_BLOBS: PerCpuArray<RecentBlobTable> = PerCpuArray::with_max_entries(1, 0);

/// A per-CPU word the table searches pass their bounds through (see `cfi::Opaque`).
#[map]
static CFI_OPAQUE: PerCpuArray<u32> = PerCpuArray::with_max_entries(crate::WALK_SLOTS, 0);

/// [`Opaque`] through the `CFI_OPAQUE` slot.
struct OpaqueSlot(*mut u32);

impl Opaque for OpaqueSlot {
    #[inline(always)]
    fn opaque(&mut self, value: u32) -> u32 {
        // SAFETY: a per-CPU map slot, used by this program on this CPU only; volatile so the
        // compiler keeps the round trip through memory.
        unsafe {
            self.0.write_volatile(value);
            self.0.read_volatile()
        }
    }
}

/// The sampled process, as the current task sees it, walked with the per-CPU state of `slot`
/// (a [`WalkSlot`](crate::WalkSlot)).
pub(crate) struct CurrentTask {
    pid: u32,
    slot: u32,
}

impl CurrentTask {
    #[inline(always)]
    pub(crate) fn new(pid: u32, slot: u32) -> Self {
        Self { pid, slot }
    }

    /// The process's mappings with tables: looked up only when a native frame falls outside the
    /// mapping the walk's cache holds, so Java frames and most native frames pay nothing.
    #[inline(always)]
    fn cfi_process(&self) -> Option<&'static CfiProcess> {
        let found = CFI_PROCS.get_ptr(&self.pid)?;
        // Through an opaque copy: otherwise the compiler may compute field addresses from the
        // lookup's result before its null check, which the verifier refuses.
        let found = core::hint::black_box(found);
        // SAFETY: non-null, a map value only read; the daemon replaces entries whole.
        Some(unsafe { &*found })
    }
}

impl UserMemory for CurrentTask {
    #[inline(always)]
    fn read_u8(&self, addr: u64) -> Result<u8, ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const u8) }.map_err(ReadError)
    }

    #[inline(always)]
    fn read_u16(&self, addr: u64) -> Result<u16, ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const u16) }.map_err(ReadError)
    }

    #[inline(always)]
    fn read_u32(&self, addr: u64) -> Result<u32, ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const u32) }.map_err(ReadError)
    }

    #[inline(always)]
    fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const u64) }.map_err(ReadError)
    }

    #[inline(always)]
    fn read_pair(&self, addr: u64) -> Result<[u64; 2], ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const [u64; 2]) }.map_err(ReadError)
    }

    #[inline(always)]
    fn read_array<const N: usize>(&self, addr: u64) -> Result<[u8; N], ReadError> {
        // SAFETY: a checked read of user memory.
        unsafe { bpf_probe_read_user(addr as *const [u8; N]) }.map_err(ReadError)
    }

    #[inline(always)]
    fn with_scratch<R>(
        &self,
        use_buffer: impl FnOnce(&mut [MaybeUninit<u8>; SCRATCH_BYTES]) -> R,
    ) -> Option<R> {
        let buffer = SCRATCH_BUFFER.get_ptr_mut(self.slot)?;
        // SAFETY: a per-CPU map value of this walk's slot, used by one walk at a time on this
        // CPU; bytes seen as possibly uninitialised.
        Some(use_buffer(unsafe {
            &mut *(buffer as *mut [MaybeUninit<u8>; SCRATCH_BYTES])
        }))
    }

    #[inline(always)]
    fn read_into(&self, addr: u64, dst: &mut [MaybeUninit<u8>]) -> bool {
        // SAFETY: a checked read of user memory into `dst`, of its length.
        let read = unsafe {
            gen::bpf_probe_read_user(
                dst.as_mut_ptr() as *mut c_void,
                dst.len() as u32,
                addr as *const c_void,
            )
        };
        read >= 0
    }
}

/// The row covering a pc: the process's mapping holding it, that mapping's table, the block, the
/// row (docs/native-unwinding.md). Every step is a bounded binary search, skipped when the walk's
/// cache already covers the pc.
impl NativeTables for CurrentTask {
    #[inline(always)]
    fn cfi_row(&self, pc: u64, cache: &mut CfiCache) -> Option<CfiRow> {
        let slot = CFI_OPAQUE.get_ptr_mut(self.slot)?;
        // SAFETY: a per-CPU map value, used by one program at a time on this CPU.
        let rows = unsafe { &mut *CFI_ROW_CACHE.get_ptr_mut(self.slot)? };
        // SAFETY: the values are only read; the daemon writes a table's blocks before its index,
        // and its index before any process refers to it.
        find_cfi_row_cached(
            cache,
            rows,
            pc,
            &mut OpaqueSlot(slot),
            || self.cfi_process(),
            |table| unsafe { CFI_TABLES.get(&table) },
            |table, block| unsafe { CFI_BLOCKS.get(&cfi_block_key(table, block)) },
        )
    }
}

impl RecentBlobs for CurrentTask {
    #[inline(always)]
    fn with_recent_blobs<R>(&self, use_table: impl FnOnce(&mut RecentBlobTable) -> R) -> Option<R> {
        let table = RECENT_BLOBS.get_ptr_mut(self.slot)?;
        // SAFETY: a per-CPU map value, used only by the sampling walks, one at a time on this
        // CPU (see `RECENT_BLOBS`).
        Some(use_table(unsafe { &mut *table }))
    }

    #[inline(always)]
    fn code_frees(&self, instance: u32) -> Option<u32> {
        crate::code_frees::counted(self.pid, instance)
    }
}

impl JavaThreads for CurrentTask {
    #[inline(always)]
    fn java_thread(&self, tid: u32) -> Option<u64> {
        // SAFETY: the value is copied out at once.
        let entry = unsafe { JAVA_THREADS.get(&tid) }.copied()?;
        // Only the JVM that listed the thread may lend its state: a tid reused by another
        // process keeps a stale entry until the tracker's next read.
        (entry.pid == self.pid).then_some(entry.java_thread)
    }
}
