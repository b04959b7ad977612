//! The walker's view of the sampled process (see `profiler_unwind`), in the kernel: reads of user
//! memory with `bpf_probe_read_user`, Java threads from `JAVA_THREADS`, and the per-CPU window the
//! thread's stack is read through. None of these reads can fault; a failed one is a value.

use core::ffi::c_void;
use core::mem::MaybeUninit;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated as gen},
    macros::map,
    maps::{HashMap, PerCpuArray},
};
use profiler_common::cfi::CfiRow;
use profiler_common::MAX_JAVA_THREADS;
use profiler_unwind::{JavaThreads, NativeTables, ReadError, StackWindow, UserMemory};

#[map]
pub(crate) static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// Host tid -> `JavaThread*` of every Java thread of the JVMs in `HOTSPOT_PROCS`; written by the
/// daemon. Lets the walk resume at a thread's last Java frame when native code without frame
/// pointers (a JNI library, libc) hides the way back.
#[map]
pub(crate) static JAVA_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_JAVA_THREADS, 0);

/// The sampled process, as the current task sees it.
pub(crate) struct CurrentTask;

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

/// Native unwind tables are not loaded into the kernel yet (docs/native-unwinding.md): every
/// native frame takes the frame-pointer step, as before the tables existed.
impl NativeTables for CurrentTask {
    #[inline(always)]
    fn cfi_row(&self, _pc: u64) -> Option<CfiRow> {
        None
    }
}

impl JavaThreads for CurrentTask {
    #[inline(always)]
    fn java_thread(&self, tid: u32) -> Option<u64> {
        // SAFETY: the value is copied out at once.
        unsafe { JAVA_THREADS.get(&tid) }.copied()
    }
}
