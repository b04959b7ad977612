//! The walker's view of the sampled process (see `profiler_unwind`), in the kernel: reads of user
//! memory with `bpf_probe_read_user`, Java threads from `JAVA_THREADS`, native unwind tables from
//! the `CFI_*` maps, and the per-CPU window the thread's stack is read through. None of these
//! reads can fault; a failed one is a value.

use core::cell::Cell;
use core::ffi::c_void;
use core::mem::MaybeUninit;

use aya_ebpf::{
    bindings::BPF_F_NO_PREALLOC,
    helpers::{bpf_probe_read_user, generated as gen},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::cfi::{
    cfi_block_key, find_cfi_mapping, find_cfi_row_in_table, CfiBlock, CfiProcess, CfiRow,
    CfiTableIndex, Opaque, DEFAULT_CFI_BLOCKS, MAX_CFI_PROCESSES, MAX_CFI_TABLES,
};
use profiler_common::MAX_JAVA_THREADS;
use profiler_unwind::{JavaThreads, NativeTables, ReadError, StackWindow, UserMemory};

#[map]
pub(crate) static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// Host tid -> `JavaThread*` of every Java thread of the JVMs in `HOTSPOT_PROCS`; written by the
/// daemon. Lets the walk resume at a thread's last Java frame when native code without frame
/// pointers (a JNI library, libc) hides the way back.
#[map]
pub(crate) static JAVA_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_JAVA_THREADS, 0);

/// Native unwind tables, written by the daemon (`native_unwind::loader`): per process, its
/// executable mappings that have a table (pid -> [`CfiProcess`]); per table, which block holds a
/// pc; the blocks of rows. Hash maps without preallocation, so that their memory (charged to the
/// daemon's cgroup) follows the tables loaded; the daemon bounds it (`cache_budget_mib`).
/// A process's entry is removed here when it execs or exits (`process_events.rs`): the daemon
/// cannot be quick enough to keep another program's stacks from being walked by its old tables.
#[map]
pub(crate) static CFI_PROCS: HashMap<u32, CfiProcess> =
    HashMap::with_max_entries(MAX_CFI_PROCESSES, BPF_F_NO_PREALLOC);

#[map]
static CFI_TABLES: HashMap<u32, CfiTableIndex> =
    HashMap::with_max_entries(MAX_CFI_TABLES, BPF_F_NO_PREALLOC);

/// Sized by the daemon at load time from its memory budget.
#[map]
static CFI_BLOCKS: HashMap<u64, CfiBlock> =
    HashMap::with_max_entries(DEFAULT_CFI_BLOCKS, BPF_F_NO_PREALLOC);

/// A per-CPU word the table searches pass their bounds through (see `cfi::Opaque`).
#[map]
static CFI_OPAQUE: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

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

/// The sampled process, as the current task sees it.
pub(crate) struct CurrentTask {
    pid: u32,
    /// Its mappings with unwind tables and the searches' slot, once looked up: at the first
    /// native frame of a batch of steps, so that Java frames pay no lookup.
    cfi: Cell<CfiLookup>,
}

#[derive(Clone, Copy)]
enum CfiLookup {
    NotYet,
    None,
    Found(&'static CfiProcess, *mut u32),
}

impl CurrentTask {
    #[inline(always)]
    pub(crate) fn new(pid: u32) -> Self {
        Self {
            pid,
            cfi: Cell::new(CfiLookup::NotYet),
        }
    }

    /// The process's mappings with tables, looked up once per batch of steps.
    #[inline(always)]
    fn cfi(&self) -> Option<(&'static CfiProcess, *mut u32)> {
        let lookup = match self.cfi.get() {
            CfiLookup::NotYet => {
                let lookup = match (CFI_PROCS.get_ptr(&self.pid), CFI_OPAQUE.get_ptr_mut(0)) {
                    (Some(found), Some(slot)) => {
                        // Through an opaque copy: otherwise the compiler may compute field
                        // addresses from the lookup's result before its null check, which the
                        // verifier refuses.
                        let found = core::hint::black_box(found);
                        // SAFETY: non-null, a map value only read; the daemon replaces entries
                        // whole.
                        CfiLookup::Found(unsafe { &*found }, slot)
                    }
                    _ => CfiLookup::None,
                };
                self.cfi.set(lookup);
                lookup
            }
            known => known,
        };
        match lookup {
            CfiLookup::Found(process, slot) => Some((process, slot)),
            _ => None,
        }
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
/// row (docs/native-unwinding.md). Every step is a bounded binary search.
impl NativeTables for CurrentTask {
    #[inline(always)]
    fn cfi_row(&self, pc: u64) -> Option<CfiRow> {
        let (process, slot) = self.cfi()?;
        let opaque = &mut OpaqueSlot(slot);
        let mapping = find_cfi_mapping(process, pc, opaque)?;
        let address = u32::try_from(pc.wrapping_sub(mapping.bias)).ok()?;
        // SAFETY: the values are only read; the daemon writes a table's blocks before its index,
        // and its index before any process refers to it.
        let index = unsafe { CFI_TABLES.get(&mapping.table) }?;
        find_cfi_row_in_table(index, address, opaque, |block| unsafe {
            CFI_BLOCKS.get(&cfi_block_key(mapping.table, block))
        })
    }
}

impl JavaThreads for CurrentTask {
    #[inline(always)]
    fn java_thread(&self, tid: u32) -> Option<u64> {
        // SAFETY: the value is copied out at once.
        unsafe { JAVA_THREADS.get(&tid) }.copied()
    }
}
