//! Where virtual threads wait: uprobes on HotSpot's unmount (freeze) and mount (thaw) of a
//! virtual thread, with off-CPU or lock profiling on (docs/virtual-threads.md).
//!
//! A virtual thread that parks, sleeps, blocks on I/O or (JDK 24+) on a monitor is frozen into
//! its stack chunk and its carrier goes on with other work: no context switch says it waits.
//! The freeze runs on the carrier with the virtual thread's frames still on its stack, so its
//! entry (`virtual_unmount`, on the function `freeze_entry` or `freeze_preempt_entry` holds)
//! walks them from the thread's last Java frame, as the off-CPU program walks a thread leaving
//! its CPU, and sends the stack through the same ring. Its return (`virtual_unmount_result`)
//! says whether it froze: a pinned virtual thread stays mounted (its carrier then blocks, which
//! the off-CPU program sees), and its stack is withdrawn with an end marked
//! [`sample_flags::UNMOUNT_FAILED`]. The next mount of the virtual thread
//! (`Continuation::prepare_thaw(thread, false)`, `virtual_mount`) sends the wait's end.
//!
//! Identity: a wait is keyed by the virtual thread's `Thread.tid` (`profiler_unwind::mounted`).
//! JDK 21 to 23 freeze with the carrier's thread object current, so there the carrier's last
//! mount tells which virtual thread it runs, if the same continuation is still mounted; else
//! the wait is keyed by the continuation object's address, which a collection may move before
//! the mount (the wait's end is then lost, and its stack dropped with its process's).
//!
//! Sampling, as the off-CPU program's: an unmount is taken with probability max(cycle,
//! average) / period from the virtual thread's own past (its unmount-to-unmount cycles), so
//! that weighting each by its inverse keeps every stack's total unbiased. A virtual thread's
//! first unmount has no past: most are started per task (a request), so taking every first
//! unmount would walk a stack per task; its cycle is taken as the time since its carrier's last
//! mount or unmount, about how long it has run, which is known before the wait too, and at
//! least 1/[`FIRST_UNMOUNT_SHARE`] of the period: a task that runs microseconds before it
//! first waits would otherwise be taken so rarely that each taken wait stands for hundreds,
//! and a site reached only there would be noisy.

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{map, uprobe, uretprobe},
    maps::LruHashMap,
    programs::{ProbeContext, RetProbeContext},
};
use profiler_common::{
    budget::Producer, sample_flags, Counter, HotspotProc, SampleKind, VirtualWaitEnd,
    OFF_CPU_RING_BYTES, VIRTUAL_CARRIER_SLOTS, VIRTUAL_WAIT_END_BYTES, VIRTUAL_WAIT_SLOTS,
};
use profiler_unwind::{monitor_state, mounted_thread};

use crate::alloc::{begin_hook_walk, end_hook_walk, hook_caller};
use crate::budget;
use crate::memory::CurrentTask;
use crate::off_cpu::{
    kernel_draw, next_average, sampled_wait, CYCLE_CAP_PERIODS, OFF_CPU_EVENTS, OFF_CPU_PERIOD_NS,
};
use crate::{
    count, fill_record, profiled, send_to, RecordOrigin, WalkSlot, WalkStart, BPF_RB_NO_WAKEUP,
    HOTSPOT_PROCS, SCRATCH,
};

/// A virtual thread's first unmount is taken with probability at least 1/this.
const FIRST_UNMOUNT_SHARE: u64 = 16;

/// [`VirtualKey::kind`]: the id is a `Thread.tid`, or a continuation's address.
const KEY_TID: u32 = 1;
const KEY_CONTINUATION: u32 = 2;

#[repr(C)]
#[derive(Clone, Copy)]
struct VirtualKey {
    pid: u32,
    kind: u32,
    id: u64,
}

/// A virtual thread's past and open wait.
#[repr(C)]
#[derive(Clone, Copy)]
struct VirtualWait {
    /// The open wait's stack record (its `ktime_ns`; 0: none open).
    out_ns: u64,
    last_unmount_ns: u64,
    average_cycle_ns: u64,
    /// The carrier it unmounted from: the wait's records carry its tid.
    carrier_tid: u32,
    _pad: u32,
}

/// An unmount under way on a carrier, between the freeze's entry and its return.
#[repr(C)]
#[derive(Clone, Copy)]
struct Unmounting {
    key: VirtualKey,
    now: u64,
    /// The stack record sent (its `ktime_ns`; 0: not sampled).
    out_ns: u64,
    average_cycle_ns: u64,
}

/// The virtual thread a carrier mounted last (read at JDK 21-23's unmounts), and when the
/// carrier last mounted or unmounted one.
#[repr(C)]
#[derive(Clone, Copy)]
struct Mounted {
    pid: u32,
    _pad: u32,
    tid: u64,
    continuation: u64,
    event_ns: u64,
}

/// Virtual threads by key. An LRU map: an evicted one's open wait loses its end (and its stack
/// goes with its process's), its sampling starts over. Sized 1 by the daemon unless it hooks
/// unmounts.
#[map]
static VIRTUAL_WAITS: LruHashMap<VirtualKey, VirtualWait> =
    LruHashMap::with_max_entries(VIRTUAL_WAIT_SLOTS, 0);

/// Unmounts under way, by carrier tid.
#[map]
static UNMOUNTING: LruHashMap<u32, Unmounting> =
    LruHashMap::with_max_entries(VIRTUAL_CARRIER_SLOTS, 0);

/// Each carrier's last mount, by carrier tid.
#[map]
static MOUNTED: LruHashMap<u32, Mounted> = LruHashMap::with_max_entries(VIRTUAL_CARRIER_SLOTS, 0);

/// `freeze(JavaThread*, intptr_t* sp)` or `freeze_preempt(JavaThread*, intptr_t* sp)`: the
/// current carrier starts unmounting its virtual thread.
#[uprobe]
pub fn virtual_unmount(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the user registers at the probed instruction.
    let regs = unsafe { &*ctx.regs };
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if !profiled(pid) {
        return 0;
    }
    // SAFETY: the value is only read, during this program.
    let Some(hotspot) = (unsafe { HOTSPOT_PROCS.get(&pid) }) else {
        return 0;
    };
    count(Counter::VirtualUnmounts);
    if begin_hook_walk(Counter::VirtualUnmountsUnseen) {
        unmount(regs, pid_tgid, hotspot);
        end_hook_walk();
    }
    0
}

/// The unmount's return: 0 when the virtual thread froze.
#[uretprobe]
pub fn virtual_unmount_result(ctx: RetProbeContext) -> u32 {
    let result: u32 = ctx.ret();
    let tid = bpf_get_current_pid_tgid() as u32;
    // SAFETY: copied out at once.
    let Some(unmounting) = (unsafe { UNMOUNTING.get(&tid) }).copied() else {
        return 0;
    };
    let _ = UNMOUNTING.remove(&tid);
    if result != 0 {
        count(Counter::VirtualUnmountsFailed);
        if unmounting.out_ns != 0 {
            send_end(unmounting.out_ns, 0, unmounting.key.pid, tid, true);
        }
        return 0;
    }
    // SAFETY: copied out at once.
    if let Some(before) = unsafe { VIRTUAL_WAITS.get(&unmounting.key) } {
        // An open wait whose mount was never seen: its stack is withdrawn.
        if before.out_ns != 0 {
            send_end(
                before.out_ns,
                0,
                unmounting.key.pid,
                before.carrier_tid,
                true,
            );
        }
    }
    let wait = VirtualWait {
        out_ns: unmounting.out_ns,
        last_unmount_ns: unmounting.now,
        average_cycle_ns: unmounting.average_cycle_ns,
        carrier_tid: tid,
        _pad: 0,
    };
    let _ = VIRTUAL_WAITS.insert(&unmounting.key, &wait, 0);
    // The carrier is free from here: the next virtual thread it starts runs from now.
    match MOUNTED.get_ptr_mut(&tid) {
        // SAFETY: a value of the map, this carrier's: only its own hooks write it.
        Some(last) => unsafe { (*last).event_ns = unmounting.now },
        None => {
            let free = Mounted {
                pid: unmounting.key.pid,
                _pad: 0,
                tid: 0,
                continuation: 0,
                event_ns: unmounting.now,
            };
            let _ = MOUNTED.insert(&tid, &free, 0);
        }
    }
    0
}

/// `Continuation::prepare_thaw(JavaThread*, bool return_barrier)`: with `false`, a virtual
/// thread is mounted on the current carrier (with `true`, a mounted one thaws more frames).
#[uprobe]
pub fn virtual_mount(ctx: ProbeContext) -> u32 {
    // SAFETY: as above.
    let regs = unsafe { &*ctx.regs };
    if regs.rsi & 0xff != 0 {
        return 0;
    }
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !profiled(pid) {
        return 0;
    }
    // SAFETY: the value is only read, during this program.
    let Some(hotspot) = (unsafe { HOTSPOT_PROCS.get(&pid) }) else {
        return 0;
    };
    count(Counter::VirtualMounts);
    let task = CurrentTask::new(pid, WalkSlot::AllocHook as u32);
    let Some(mounted) = mounted_thread(hotspot, &task, regs.rdi) else {
        return 0;
    };
    let Some(virtual_tid) = mounted.virtual_tid else {
        return 0;
    };
    let mount = Mounted {
        pid,
        _pad: 0,
        tid: virtual_tid,
        continuation: mounted.continuation,
        // SAFETY: helper without preconditions.
        event_ns: unsafe { bpf_ktime_get_ns() },
    };
    let _ = MOUNTED.insert(&tid, &mount, 0);
    let by_tid = VirtualKey {
        pid,
        kind: KEY_TID,
        id: virtual_tid,
    };
    if end_wait(&by_tid) || mounted.continuation == 0 {
        return 0;
    }
    let by_continuation = VirtualKey {
        pid,
        kind: KEY_CONTINUATION,
        id: mounted.continuation,
    };
    if end_wait(&by_continuation) {
        // Its past goes on under its tid from here.
        let _ = VIRTUAL_WAITS.remove(&by_continuation);
    }
    0
}

/// Ends `key`'s open wait, if any: true if it had one.
#[inline(always)]
fn end_wait(key: &VirtualKey) -> bool {
    let Some(wait) = VIRTUAL_WAITS.get_ptr_mut(key) else {
        return false;
    };
    // SAFETY: a value of the map; its virtual thread is mounted here, so no other program
    // writes it now.
    let wait = unsafe { &mut *wait };
    let out = wait.out_ns;
    if out == 0 {
        return false;
    }
    wait.out_ns = 0;
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    send_end(
        out,
        now.saturating_sub(out),
        key.pid,
        wait.carrier_tid,
        false,
    );
    count(Counter::VirtualWaitsEnded);
    true
}

/// Sends a virtual thread's wait end (or, `failed`, the withdrawal of its stack).
#[inline(always)]
fn send_end(out_ns: u64, blocked_ns: u64, pid: u32, carrier_tid: u32, failed: bool) {
    let flags = if failed {
        sample_flags::VIRTUAL_THREAD | sample_flags::UNMOUNT_FAILED
    } else {
        sample_flags::VIRTUAL_THREAD
    };
    let end = VirtualWaitEnd {
        out_ktime_ns: out_ns,
        blocked_ns,
        pid,
        tid: carrier_tid,
        flags,
        _reserved: 0,
    };
    if OFF_CPU_EVENTS
        .output::<VirtualWaitEnd>(&end, BPF_RB_NO_WAKEUP)
        .is_err()
    {
        count(Counter::OffCpuRingFull);
    }
}

/// The virtual thread the carrier `java_thread` unmounts, keyed.
#[inline(always)]
fn unmounting_key(
    hotspot: &HotspotProc,
    task: &CurrentTask,
    java_thread: u64,
    pid: u32,
    tid: u32,
) -> Option<VirtualKey> {
    let mounted = mounted_thread(hotspot, task, java_thread)?;
    if let Some(id) = mounted.virtual_tid {
        return Some(VirtualKey {
            pid,
            kind: KEY_TID,
            id,
        });
    }
    if mounted.continuation == 0 {
        return None;
    }
    // SAFETY: copied out at once.
    let last = unsafe { MOUNTED.get(&tid) }.copied();
    Some(match last {
        Some(last) if last.pid == pid && last.continuation == mounted.continuation => VirtualKey {
            pid,
            kind: KEY_TID,
            id: last.tid,
        },
        _ => VirtualKey {
            pid,
            kind: KEY_CONTINUATION,
            id: mounted.continuation,
        },
    })
}

#[inline(always)]
fn unmount(regs: &pt_regs, pid_tgid: u64, hotspot: &HotspotProc) {
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    let java_thread = regs.rdi;
    let task = CurrentTask::new(pid, WalkSlot::AllocHook as u32);
    let Some(key) = unmounting_key(hotspot, &task, java_thread, pid, tid) else {
        count(Counter::VirtualUnmountsUnseen);
        return;
    };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // SAFETY: a global the loader sets once; read-only afterwards.
    let period = unsafe { core::ptr::read_volatile(&OFF_CPU_PERIOD_NS) }.max(1);
    // SAFETY: copied out at once.
    let past = unsafe { VIRTUAL_WAITS.get(&key) }.copied();
    let cap = period * CYCLE_CAP_PERIODS;
    let (first, cycle, average) = match past {
        Some(past) if past.last_unmount_ns != 0 => {
            let cycle = now.wrapping_sub(past.last_unmount_ns).min(cap);
            (false, cycle, next_average(past.average_cycle_ns, cycle))
        }
        _ => {
            // Its first unmount: how long it has run, by its carrier's last event.
            // SAFETY: copied out at once.
            match unsafe { MOUNTED.get(&tid) }.copied() {
                Some(last) if last.pid == pid && last.event_ns != 0 && last.event_ns <= now => {
                    let cycle = (now - last.event_ns)
                        .max(period / FIRST_UNMOUNT_SHARE)
                        .min(cap);
                    (false, cycle, cycle)
                }
                _ => (true, 0, 0),
            }
        }
    };
    let sampled = sampled_wait(first, cycle, average, period, kernel_draw);
    let out_ns = if let Some(probability) = sampled {
        // Its id, where the key is it (else the sample has none rather than the carrier's).
        let virtual_thread = if key.kind == KEY_TID { key.id } else { 0 };
        send_stack(
            regs,
            pid_tgid,
            hotspot,
            java_thread,
            now,
            probability,
            virtual_thread,
        )
    } else {
        0
    };
    let unmounting = Unmounting {
        key,
        now,
        out_ns,
        average_cycle_ns: average,
    };
    let _ = UNMOUNTING.insert(&tid, &unmounting, 0);
}

/// Walks and sends the unmounting virtual thread's stack; its `ktime_ns`, or 0 if not sent.
#[inline(always)]
fn send_stack(
    regs: &pt_regs,
    pid_tgid: u64,
    hotspot: &HotspotProc,
    java_thread: u64,
    now: u64,
    probability: u32,
    virtual_thread: u64,
) -> u64 {
    let pid = (pid_tgid >> 32) as u32;
    let Some(record) = SCRATCH.get_ptr_mut(WalkSlot::AllocHook as u32) else {
        count(Counter::ScratchMissing);
        return 0;
    };
    // SAFETY: this slot's record, used by one hook at a time on this CPU (the guard).
    let record = unsafe { &mut *record };
    // What it waits for: a monitor's entry (a preempted freeze, JDK 24+), `Object.wait`, or
    // else a park (a sleep and blocking I/O park too).
    let task = CurrentTask::new(pid, WalkSlot::AllocHook as u32);
    let (java_state, _) = monitor_state(hotspot, &task, java_thread);
    let origin = RecordOrigin {
        kind: SampleKind::OffCpu,
        ktime_ns: now,
        task_state: 0,
        java_state: java_state as u8,
        weight: probability,
        flags: sample_flags::VIRTUAL_THREAD,
        virtual_thread,
    };
    let start = WalkStart {
        // Where the walk falls back to when the thread's last Java frame is not usable.
        user: Some(hook_caller(regs)),
        slot: WalkSlot::AllocHook,
        allocated: None,
        anchor: java_thread,
    };
    let Some(bytes) = fill_record(record, pid_tgid, start, 0, origin) else {
        return 0;
    };
    let charged = bytes.len() + VIRTUAL_WAIT_END_BYTES;
    if !budget::admit(Producer::OffCpu, pid, budget::current_uid(), charged) {
        return 0;
    }
    if send_to(&OFF_CPU_EVENTS, bytes, u64::from(OFF_CPU_RING_BYTES / 4)).is_err() {
        count(Counter::OffCpuRingFull);
        return 0;
    }
    count(Counter::VirtualUnmountsSampled);
    now
}
