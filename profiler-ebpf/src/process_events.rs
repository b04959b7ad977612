//! Process events for the daemon's JVM tracker: which processes exec a new program and which
//! exit, so that it reads `/proc` for those only instead of rescanning every process. They also
//! drop the process's native unwind tables at once.
//!
//! Raw tracepoints run in the context of the process concerned, so the current task's ids are
//! the event's. The daemon polls this ring on its own timer: no wake-up per event.

use aya_ebpf::{
    helpers::bpf_get_current_pid_tgid, macros::map, macros::raw_tracepoint, maps::RingBuf,
    programs::RawTracePointContext,
};
use profiler_common::{
    budget::Producer, Counter, ProcessEvent, ProcessEventKind, PROCESS_EVENT_RING_BYTES,
};

use crate::memory::CFI_PROCS;
use crate::{alloc, budget, code_frees, thread_exit, thread_start, thread_state};
use crate::{count, BPF_RB_NO_WAKEUP};

#[map]
static PROCESS_EVENTS: RingBuf = RingBuf::with_byte_size(PROCESS_EVENT_RING_BYTES, 0);

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn process_exec(_ctx: RawTracePointContext) -> i32 {
    let pid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // The old program's unwind tables must not walk the new one's stacks.
    let _ = CFI_PROCS.remove(&pid);
    send(ProcessEventKind::Exec, pid);
    0
}

/// Runs for every exiting thread; only the main thread's exit stands for the process.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn process_exit(_ctx: RawTracePointContext) -> i32 {
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    // Its off-CPU state goes with it: counted, for the threads-tracked gauge.
    if thread_state::forget_current(tid) {
        count(Counter::OffCpuThreadsGone);
    }
    // Its Java thread entry too: a tid is reused by a later thread, maybe of another process.
    thread_start::forget_exiting(pid, tid);
    thread_exit::forget_exiting(pid, tid);
    code_frees::forget_exiting(pid, tid);
    alloc::forget_exiting(tid);
    if pid == tid {
        let _ = CFI_PROCS.remove(&pid);
        send(ProcessEventKind::Exit, pid);
    }
    0
}

#[inline(always)]
fn send(kind: ProcessEventKind, pid: u32) {
    // With `--pid` the tracker watches only the pids named: no events (the programs still run,
    // for the unwind tables above).
    // SAFETY: a read-only global the loader may have rewritten; volatile so it is not folded.
    if unsafe { core::ptr::read_volatile(&crate::FILTER_PIDS) } != 0 {
        return;
    }
    // What the event costs in the ring: its 8 bytes and the ring's 8-byte header.
    const EVENT_RING_BYTES: usize = 2 * core::mem::size_of::<ProcessEvent>();
    if !budget::admit(
        Producer::ProcessEvents,
        pid,
        budget::current_uid(),
        EVENT_RING_BYTES,
    ) {
        return;
    }
    let event = ProcessEvent {
        kind: kind as u32,
        pid,
    };
    if PROCESS_EVENTS
        .output::<ProcessEvent>(&event, BPF_RB_NO_WAKEUP)
        .is_err()
    {
        count(Counter::ProcessEventsLost);
    }
}
