//! Java threads known from their start, not from the daemon's next read of the JVM's thread
//! list (every 500 ms): a thread that lives 300 ms would have its lock waits left out of the
//! lock profiles, and its walks out of native code could not resume at its last Java frame.
//!
//! HotSpot runs `JavaThread::run()` first in every thread it starts (application threads,
//! compiler and service threads), in that thread, before its first Java instruction. A uprobe
//! there (the daemon attaches it to each hooked libjvm file, `hotspot/libjvm_hooks.rs`) puts the
//! thread in `JAVA_THREADS` with its `JavaThread*` (`this`, the first argument). Threads
//! attached through JNI and the threads of a JVM found running are left to the list's reads.
//!
//! A process describes only itself this way: the entry's tid is the current task's, and its pid
//! the current process's. `JAVA_THREADS_STARTED` counts, per JVM, the entries made here and not
//! yet gone: at most `JAVA_THREADS_PER_TARGET`, so one JVM starting threads without end cannot
//! fill the map every JVM shares. An entry goes when its thread exits (`process_events.rs`).

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid,
    macros::{map, uprobe},
    maps::HashMap,
    programs::ProbeContext,
};
use profiler_common::{
    Counter, JavaThreadEntry, DEFAULT_MAX_JVMS, JAVA_THREADS_PER_TARGET, JAVA_THREAD_FROM_START,
};

use crate::memory::JAVA_THREADS;
use crate::{count, profiled, HOTSPOT_PROCS};

/// Host pid -> entries of `JAVA_THREADS` the hook made for that JVM's threads and that are still
/// there. Sized by the daemon at load time as `HOTSPOT_PROCS` (only JVMs there are hooked).
#[map]
static JAVA_THREADS_STARTED: HashMap<u32, u64> = HashMap::with_max_entries(DEFAULT_MAX_JVMS, 0);

/// `JavaThread::run()`: the current thread is a Java thread starting.
#[uprobe]
pub fn java_thread_start(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the user registers at the probed instruction.
    let java_thread = unsafe { (*ctx.regs).rdi };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Only JVMs the daemon made ready: their layout is what reads the entry.
    // SAFETY: only tested for presence.
    if java_thread == 0 || !profiled(pid) || unsafe { HOTSPOT_PROCS.get(&pid) }.is_none() {
        return 0;
    }
    describe(pid, tid, java_thread);
    0
}

#[inline(always)]
fn describe(pid: u32, tid: u32, java_thread: u64) {
    let entry = JavaThreadEntry {
        java_thread,
        pid,
        origin: JAVA_THREAD_FROM_START,
    };
    if let Some(existing) = JAVA_THREADS.get_ptr_mut(&tid) {
        // SAFETY: a value of the map, written in place (the daemon writes whole entries).
        let existing = unsafe { &mut *existing };
        if existing.pid == pid && existing.origin == JAVA_THREAD_FROM_START {
            // Counted already (a thread that runs the hook twice).
            existing.java_thread = java_thread;
            return;
        }
    }
    let started = match JAVA_THREADS_STARTED.get_ptr_mut(&pid) {
        Some(started) => started,
        None => {
            if JAVA_THREADS_STARTED.insert(&pid, &0, 0).is_err() {
                count(Counter::JavaThreadsStartRefused);
                return;
            }
            let Some(started) = JAVA_THREADS_STARTED.get_ptr_mut(&pid) else {
                return;
            };
            started
        }
    };
    // SAFETY: a value of the map, changed only by `add_atomically`.
    if unsafe { core::ptr::read_volatile(started) } >= u64::from(JAVA_THREADS_PER_TARGET)
        || JAVA_THREADS.insert(&tid, &entry, 0).is_err()
    {
        count(Counter::JavaThreadsStartRefused);
        return;
    }
    add_atomically(started, 1);
    count(Counter::JavaThreadsStarted);
}

/// The current thread (`tid` of `pid`) exits: its entry, if its JVM's, goes with it, and is no
/// longer counted. The JVM's count goes with its main thread.
#[inline(always)]
pub(crate) fn forget_exiting(pid: u32, tid: u32) {
    if let Some(entry) = JAVA_THREADS.get_ptr_mut(&tid) {
        // SAFETY: copied out at once.
        let entry = unsafe { *entry };
        if entry.pid == pid && JAVA_THREADS.remove(&tid).is_ok() {
            if entry.origin == JAVA_THREAD_FROM_START {
                if let Some(started) = JAVA_THREADS_STARTED.get_ptr_mut(&pid) {
                    add_atomically(started, u64::MAX);
                }
            }
        }
    }
    if pid == tid {
        let _ = JAVA_THREADS_STARTED.remove(&pid);
    }
}

/// `*value += delta` (wrapping) as one atomic instruction: threads of one JVM start and exit on
/// several CPUs at once. The BPF target has no atomic types, but its `lock` add, which the
/// kernel has always taken, is what this intrinsic becomes when its result is unused.
#[inline(always)]
fn add_atomically(value: *mut u64, delta: u64) {
    // SAFETY: `value` points into a map value, aligned and valid while this program runs.
    unsafe {
        core::intrinsics::atomic_xadd::<u64, u64, { core::intrinsics::AtomicOrdering::Relaxed }>(
            value, delta,
        )
    };
}
