//! What a JVM's ended threads allocated, where the JVM does not count it itself.
//!
//! Allocation profiles from HotSpot's sampler are scaled to the JVM's own count of the bytes
//! its threads allocated (the daemon's `alloc_scale.rs`): every live thread's counters, read
//! from its `JavaThread`, plus what the ended ones allocated, which HotSpot adds up in
//! `ThreadService::_exited_allocated_bytes` from JDK 14. Before that, an ended thread's bytes
//! go with it. So in those JVMs the daemon hooks `Threads::remove(JavaThread*)`, which every
//! ending Java thread runs (its TLAB retired already, its counters final, the thread still on
//! the JVM's list), and the hook adds that thread's bytes to its JVM's entry of
//! `EXITED_ALLOCATIONS`. Only JVMs the daemon gave an entry (with the offsets to read) count.
//!
//! A JVM can call the function with anything: the reads are of its own memory, and the sum is
//! its own entry's, whose growth the daemon bounds before it scales that JVM's profile by it.

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_probe_read_user},
    macros::{map, uprobe},
    maps::HashMap,
    programs::ProbeContext,
};
use profiler_common::{Counter, ExitedAllocation, DEFAULT_MAX_JVMS};

use crate::count;

/// Host pid -> its ended threads' bytes. Sized by the daemon at load time as `HOTSPOT_PROCS`.
#[map]
pub(crate) static EXITED_ALLOCATIONS: HashMap<u32, ExitedAllocation> =
    HashMap::with_max_entries(DEFAULT_MAX_JVMS, 0);

/// Larger TLAB used parts are garbage (HotSpot's TLABs are at most a few megabytes).
const MAX_TLAB_BYTES: u64 = 1 << 30;

/// `Threads::remove(JavaThread*)`: the current thread (the argument) is about to leave its
/// JVM's thread list.
#[uprobe]
pub fn java_thread_exit(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the user registers at the probed instruction.
    let java_thread = unsafe { (*ctx.regs).rdi };
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    let Some(entry) = EXITED_ALLOCATIONS.get_ptr_mut(&pid) else {
        return 0;
    };
    // SAFETY: a value of the map; the offsets are the daemon's and never change.
    let (allocated_at, start_at, top_at) = unsafe {
        (
            (*entry).allocated_bytes_offset,
            (*entry).tlab_start_offset,
            (*entry).tlab_top_offset,
        )
    };
    let word = |offset: u32| {
        // SAFETY: a checked read of the current process's memory.
        unsafe { bpf_probe_read_user((java_thread + u64::from(offset)) as *const u64) }
    };
    let (Ok(allocated), Ok(start), Ok(top)) = (word(allocated_at), word(start_at), word(top_at))
    else {
        count(Counter::ThreadExitsUnread);
        return 0;
    };
    // A retired TLAB has no start or top: its bytes are in `allocated` already.
    let used = top
        .checked_sub(start)
        .filter(|used| *used <= MAX_TLAB_BYTES)
        .unwrap_or(0);
    // SAFETY: `exited_bytes` lies in the map value, aligned; threads end on several CPUs at
    // once, hence the atomic add (the BPF target's `lock` add, taken by every kernel).
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            core::ptr::addr_of_mut!((*entry).exited_bytes),
            allocated.wrapping_add(used),
        )
    };
    count(Counter::ThreadExitsCounted);
    0
}

/// The current process exits: its entry goes with it (its pid may be a later process's).
#[inline(always)]
pub(crate) fn forget_exiting(pid: u32, tid: u32) {
    if pid == tid {
        let _ = EXITED_ALLOCATIONS.remove(&pid);
    }
}
