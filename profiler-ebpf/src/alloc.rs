//! Java allocation profiling: uprobes on HotSpot's allocation events.
//!
//! HotSpot calls `AllocTracer::send_allocation_in_new_tlab(Klass*, HeapWord*, size_t tlab_size,
//! size_t alloc_size, JavaThread*)` each time a thread takes a new TLAB, and
//! `send_allocation_outside_tlab(Klass*, HeapWord*, size_t alloc_size, JavaThread*)` for an
//! object allocated outside any TLAB, whether or not JFR records them. The daemon attaches
//! these programs to both, in each libjvm file its JVMs run (docs/allocation-profiling.md).
//!
//! Sampling: an event of `w` bytes (the new TLAB's size, or the object's) is taken with
//! probability `p = min(1, w / ALLOC_INTERVAL_BYTES)`, drawn here; the daemon weighs a taken
//! event by `w / p` bytes and `1 / p` events, so the expected totals are exactly the bytes and
//! events the JVM had. No per-thread state: nothing a thread does changes another's odds.
//!
//! The record: the allocated class's name (a frame the daemon names later, with a cookie that
//! proves it is still the same `Symbol`), then the thread's stack from its last Java frame (its
//! `JavaFrameAnchor`, valid while the thread is in the VM), so the VM's allocation path above it
//! is not walked; failing that, from the hook's caller.
//!
//! These programs run in the allocating thread's context with interrupts on, so the CPU sampler
//! can fire inside them: they walk with their own per-CPU state ([`WalkSlot::AllocHook`]), and
//! a per-CPU guard skips (and counts) a hook that finds another one under way on its CPU (a
//! preempted one).

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated as gen},
    macros::{map, uprobe},
    maps::{PerCpuArray, RingBuf},
    programs::ProbeContext,
};
use profiler_common::{
    budget::Producer, Counter, SampleKind, ALLOC_INTERVAL_BYTES, ALLOC_RING_BYTES,
    ALLOC_WEIGHT_UNIT,
};
use profiler_unwind::{allocated_class_frame, UserRegs};

use crate::budget;
use crate::memory::CurrentTask;
use crate::{
    count, fill_record, profiled, send_to, RecordOrigin, WalkSlot, WalkStart, HOTSPOT_PROCS,
    SCRATCH,
};

/// Set by the daemon at load time (`--alloc=BYTES`).
#[no_mangle]
static ALLOC_INTERVAL: u64 = ALLOC_INTERVAL_BYTES;

/// Sampled allocations: a ring of their own, so that no allocator can take the CPU samples'
/// room (nor the reverse).
#[map]
static ALLOC_SAMPLES: RingBuf = RingBuf::with_byte_size(ALLOC_RING_BYTES, 0);

/// Non-zero while an allocation hook walks on this CPU.
#[map]
static ALLOC_BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn alloc_in_new_tlab(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the user registers at the probed instruction.
    let regs = unsafe { &*ctx.regs };
    // (Klass*, HeapWord*, tlab_size, alloc_size, JavaThread*)
    on_allocation(regs, SampleKind::AllocInNewTlab, regs.rdx, regs.r8);
    0
}

#[uprobe]
pub fn alloc_outside_tlab(ctx: ProbeContext) -> u32 {
    // SAFETY: as above.
    let regs = unsafe { &*ctx.regs };
    // (Klass*, HeapWord*, alloc_size, JavaThread*)
    on_allocation(regs, SampleKind::AllocOutsideTlab, regs.rdx, regs.rcx);
    0
}

#[inline(always)]
fn on_allocation(regs: &pt_regs, kind: SampleKind, size: u64, java_thread: u64) {
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if !profiled(pid) {
        return;
    }
    // Only JVMs whose layout the daemon pushed: the class's name is read with it.
    // SAFETY: the value is only read, during this program.
    let Some(hotspot) = (unsafe { HOTSPOT_PROCS.get(&pid) }) else {
        return;
    };
    count(Counter::AllocEvents);
    // SAFETY: a global the loader sets once; read-only afterwards.
    let interval = unsafe { core::ptr::read_volatile(&ALLOC_INTERVAL) }.max(1);
    if size < interval {
        // A uniform draw in [0, interval): below `size` with probability size / interval.
        // SAFETY: helper without preconditions.
        let draw = (u64::from(unsafe { gen::bpf_get_prandom_u32() }) * interval) >> 32;
        if draw >= size {
            return;
        }
    }
    let Some(busy) = ALLOC_BUSY.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU slot; a hook preempted on this CPU left it set, which is what it tells.
    unsafe {
        if *busy != 0 {
            count(Counter::AllocNested);
            return;
        }
        *busy = 1;
    }
    sample_allocation(regs, pid_tgid, kind, size, java_thread, hotspot);
    // SAFETY: as above.
    unsafe { *busy = 0 };
}

#[inline(always)]
fn sample_allocation(
    regs: &pt_regs,
    pid_tgid: u64,
    kind: SampleKind,
    size: u64,
    java_thread: u64,
    hotspot: &profiler_common::HotspotProc,
) {
    let pid = (pid_tgid >> 32) as u32;
    let task = CurrentTask::new(pid, WalkSlot::AllocHook as u32);
    let class = allocated_class_frame(hotspot, &task, regs.rdi);
    let Some(record) = SCRATCH.get_ptr_mut(WalkSlot::AllocHook as u32) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: this slot's record, used by one hook at a time on this CPU (the guard).
    let record = unsafe { &mut *record };
    // At the hook's first instruction its caller's frame is intact: the return address on top
    // of the stack, rbp still the caller's. Starting there, every frame is a caller's.
    // SAFETY: a checked read of user memory.
    let return_address = unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0);
    let caller = UserRegs {
        ip: return_address,
        sp: regs.rsp.wrapping_add(8),
        fp: regs.rbp,
        r13: 0,
        rbx: 0,
        entered_kernel: false,
    };
    let origin = RecordOrigin {
        kind,
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        task_state: 0,
        java_state: 0,
        weight: (size / ALLOC_WEIGHT_UNIT).min(u64::from(u32::MAX)) as u32,
    };
    let start = WalkStart {
        user: Some(caller),
        slot: WalkSlot::AllocHook,
        allocated: Some((class, java_thread)),
    };
    let Some(bytes) = fill_record(record, pid_tgid, start, 0, origin) else {
        return;
    };
    if !budget::admit(Producer::Alloc, pid, budget::current_uid(), bytes.len()) {
        return;
    }
    match send_to(&ALLOC_SAMPLES, bytes, u64::from(ALLOC_RING_BYTES / 4)) {
        Ok(()) => count(Counter::AllocSampled),
        Err(()) => count(Counter::AllocRingFull),
    }
}
