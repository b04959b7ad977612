//! Each JVM's count of the code blobs it frees, so that the walk can use a code blob it
//! remembers from earlier samples without reading it again to prove it still in place
//! (`profiler_unwind::recent_blobs`): a blob proven while the count was `n` is still there while
//! the count is `n`.
//!
//! Every blob HotSpot frees from its code cache (nmethods unloaded or swept, stubs, the
//! compiler's scratch buffers) goes through `CodeCache::free(CodeBlob*)`, which the daemon
//! hooks in each libjvm whose `.symtab` has it (JDK 11 and later builds that keep `.symtab`).
//! The hook runs before the blob's memory is given back, so the count moves before anything
//! can be put where the blob was. Only JVMs the daemon gave an entry count; the daemon clears
//! `counting` before it takes the hook away, so a JVM whose frees go uncounted is never trusted.
//!
//! A JVM can call the function as often as it likes: it only makes the walks of its own
//! samples prove their blobs again, as they do without the count.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, uprobe},
    maps::HashMap,
    programs::ProbeContext,
};
use profiler_common::{CodeFreeCount, CODE_FREE_STEP, DEFAULT_MAX_JVMS};

/// Host pid -> its count. Sized by the daemon at load time as `HOTSPOT_PROCS`.
#[map]
pub(crate) static CODE_FREES: HashMap<u32, CodeFreeCount> =
    HashMap::with_max_entries(DEFAULT_MAX_JVMS, 0);

/// `CodeCache::free(CodeBlob*)`: the current JVM frees a code blob.
#[uprobe]
pub fn code_freed(_ctx: ProbeContext) -> u32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    if let Some(entry) = CODE_FREES.get_ptr_mut(&pid) {
        // SAFETY: `count` lies in the map value, aligned; code is freed on several CPUs at
        // once (compiler threads, the collector's workers), hence the atomic add.
        unsafe {
            core::intrinsics::atomic_xadd::<u32, u32, { core::intrinsics::AtomicOrdering::Relaxed }>(
                core::ptr::addr_of_mut!((*entry).count),
                CODE_FREE_STEP,
            )
        };
    }
    0
}

/// The count of code frees now of JVM `pid` (its `instance`), if it is counted.
#[inline(always)]
pub(crate) fn counted(pid: u32, instance: u32) -> Option<u32> {
    // SAFETY: a map value, read by fields; the hook may add to `count` meanwhile.
    let entry = unsafe { CODE_FREES.get(&pid) }?;
    if entry.counting == 0 || entry.instance != instance {
        return None;
    }
    // SAFETY: a reference into the map value, read once.
    Some(unsafe { core::ptr::read_volatile(&entry.count) })
}

/// The current process exits: its entry goes with it (its pid may be a later process's).
#[inline(always)]
pub(crate) fn forget_exiting(pid: u32, tid: u32) {
    if pid == tid {
        let _ = CODE_FREES.remove(&pid);
    }
}
