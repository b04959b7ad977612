//! Java allocation profiling: uprobes on HotSpot's allocation events.
//!
//! HotSpot calls `AllocTracer::send_allocation_in_new_tlab(Klass*, HeapWord*, size_t tlab_size,
//! size_t alloc_size, JavaThread*)` each time a thread takes a new TLAB, and
//! `send_allocation_outside_tlab(Klass*, HeapWord*, size_t alloc_size, JavaThread*)` for an
//! object allocated outside any TLAB, whether or not JFR records them. The daemon attaches
//! these programs to both, in each libjvm file its JVMs run (docs/allocation-profiling.md).
//!
//! Weights: an event stands for the bytes its thread allocated since its previous event, read
//! from HotSpot's own per-thread counter (`Thread::_allocated_bytes`, which takes in a TLAB's
//! bytes when the TLAB is retired, an object outside TLABs at once): a refill stands for the
//! TLAB just filled, an object outside TLABs for itself. Every byte a thread allocated is then
//! in at most one event's weight, whatever its lifetime: a thread that ends early is not
//! weighed for a TLAB it never filled, and a thread's first TLAB weighs nothing until filled.
//! What is not seen: the TLAB a thread holds when it exits (retired after its last event).
//! The counter's last value is kept per thread (`ALLOC_THREADS`, an LRU map by tid): a thread
//! the hook started with (`thread_start.rs`) counts from zero; a thread that ran before the
//! hooks counts from its first event (its earlier bytes are not this profile's). A layout
//! without the counter weighs an event by the hook's size argument (the new TLAB's size).
//!
//! Sampling: an event of `w` bytes is taken with probability `p = min(1, w /
//! ALLOC_INTERVAL_BYTES)`, drawn here; the daemon weighs a taken event by `w / p` bytes and
//! `1 / p` events, so the expected totals are the bytes the threads allocated in the TLABs they
//! retired and outside TLABs, and the events that carried bytes. Nothing a thread does changes another's odds.
//!
//! The record: the allocated class's name (a frame the daemon names later, with a cookie that
//! proves it is still the same `Symbol`), then the thread's stack from its last Java frame (its
//! `JavaFrameAnchor`, valid while the thread is in the VM), so the VM's allocation path above it
//! is not walked; failing that, from the hook's caller.
//!
//! HotSpot's own sampler (JDK 11+, turned on by the sidecar agent's `alloc_interval` option):
//! `alloc_sampled` runs at the agent's `SampledObjectAlloc` callback, once per object the JVM
//! picked (points about one interval of bytes apart at random, wherever the bytes go: no TLAB
//! boundary decides which stack is seen, so small and large objects, short and long threads
//! are all seen in proportion). Every such event is taken, weighed by its object's size (the
//! daemon turns that into the inverse of its odds). A JVM's first such event marks it
//! ([`ALLOC_SAMPLED_JVMS`]): its TLAB events are left out from then on, or its bytes would
//! count twice.
//!
//! These programs run in the allocating thread's context with interrupts on, so the CPU sampler
//! can fire inside them: they walk with their own per-CPU state ([`WalkSlot::AllocHook`]), and
//! a per-CPU guard skips (and counts) a hook that finds another one under way on its CPU (a
//! preempted one).

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_user, generated as gen},
    macros::{map, uprobe},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::ProbeContext,
};
use profiler_common::{
    budget::Producer, hotspot_flags, Counter, HotspotProc, SampleKind, ALLOC_INTERVAL_BYTES,
    ALLOC_RING_BYTES, ALLOC_THREAD_SLOTS, ALLOC_WEIGHT_UNIT, DEFAULT_MAX_JVMS,
    JAVA_THREAD_FROM_START,
};
use profiler_unwind::{allocated_class_frame, UserRegs};

use crate::budget;
use crate::memory::{CurrentTask, JAVA_THREADS};
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

/// What an allocating thread's counter said at its last event.
#[derive(Clone, Copy)]
#[repr(C)]
struct AllocThread {
    java_thread: u64,
    allocated: u64,
    pid: u32,
    _pad: u32,
}

/// Host tid -> [`AllocThread`]. An LRU map: an exited thread's entry makes room for the next
/// one without cleanup; a live thread evicted (over `ALLOC_THREAD_SLOTS` allocating at once)
/// counts again from its next event. Sized 1 by the daemon without `--alloc`.
#[map]
static ALLOC_THREADS: LruHashMap<u32, AllocThread> =
    LruHashMap::with_max_entries(ALLOC_THREAD_SLOTS, 0);

/// JVMs whose allocations HotSpot's sampler reports (pid -> the JVM's `HotspotProc::instance`,
/// so that a reused pid is not taken for the JVM that had it). An LRU map: a JVM evicted (over
/// `DEFAULT_MAX_JVMS` sampling at once) is marked again by its next sampled object.
#[map]
static ALLOC_SAMPLED_JVMS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(DEFAULT_MAX_JVMS, 0);

/// Threads (host tid -> pid) whose JVM's sampler reported an object already, for the JVMs whose
/// sampler reports each thread's first allocation by rule ([`hotspot_flags::SAMPLER_TAKES_FIRST`]).
/// An entry goes when its thread exits (`process_events.rs`); a live thread evicted (over
/// `ALLOC_THREAD_SLOTS` sampled at once) has one more report skipped. Sized 1 without `--alloc`.
#[map]
static SAMPLER_THREADS: LruHashMap<u32, u32> = LruHashMap::with_max_entries(ALLOC_THREAD_SLOTS, 0);

/// Non-zero while a hook walks on this CPU (an allocation hook, or a virtual thread's unmount:
/// they share the [`WalkSlot::AllocHook`] state; [`begin_hook_walk`]).
#[map]
static ALLOC_BUSY: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

#[uprobe]
pub fn alloc_in_new_tlab(ctx: ProbeContext) -> u32 {
    // SAFETY: a uprobe's context is the user registers at the probed instruction.
    let regs = unsafe { &*ctx.regs };
    // (Klass*, HeapWord*, tlab_size, alloc_size, JavaThread*)
    on_tlab_event(regs, SampleKind::AllocInNewTlab, regs.rdx, regs.r8);
    0
}

#[uprobe]
pub fn alloc_outside_tlab(ctx: ProbeContext) -> u32 {
    // SAFETY: as above.
    let regs = unsafe { &*ctx.regs };
    // (Klass*, HeapWord*, alloc_size, JavaThread*)
    on_tlab_event(regs, SampleKind::AllocOutsideTlab, regs.rdx, regs.rcx);
    0
}

/// The sidecar agent's `jvm_profiler_sampled_object_alloc(jvmtiEnv*, JNIEnv*, jthread,
/// jobject object, jclass klass, jlong size)`: HotSpot's sampler picked `object`.
#[uprobe]
pub fn alloc_sampled(ctx: ProbeContext) -> u32 {
    // SAFETY: as above.
    let regs = unsafe { &*ctx.regs };
    let pid_tgid = bpf_get_current_pid_tgid();
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if !profiled(pid) {
        return 0;
    }
    // SAFETY: the value is only read, during this program.
    let Some(hotspot) = (unsafe { HOTSPOT_PROCS.get(&pid) }) else {
        return 0;
    };
    count(Counter::AllocSamplerEvents);
    if hotspot.class_mirror_klass == u16::MAX
        || alloc_sampler_report_is_forced(u32::from(hotspot.flags), pid, tid) != 0
    {
        return 0;
    }
    // The thread's JavaThread*, whose last Java frame the walk starts from: the JVM's thread
    // list or the thread-start hook put it in the map.
    // SAFETY: copied out at once.
    let java_thread = match unsafe { JAVA_THREADS.get(&tid) } {
        Some(entry) if entry.pid == pid => entry.java_thread,
        _ => 0,
    };
    // `klass` is a JNI local reference: the address of a slot holding the class's mirror (a
    // `java.lang.Class`), which holds the `Klass*`.
    // SAFETY: checked reads of user memory.
    let klass = unsafe { bpf_probe_read_user(regs.r8 as *const u64) }
        .ok()
        .and_then(|mirror| {
            // SAFETY: as above.
            unsafe {
                bpf_probe_read_user((mirror + u64::from(hotspot.class_mirror_klass)) as *const u64)
            }
            .ok()
        })
        .unwrap_or(0);
    let instance = hotspot.instance;
    // SAFETY: copied out at once.
    if unsafe { ALLOC_SAMPLED_JVMS.get(&pid) } != Some(&instance) {
        let _ = ALLOC_SAMPLED_JVMS.insert(&pid, &instance, 0);
    }
    walk_allocation(
        regs,
        pid_tgid,
        SampleKind::AllocSampled,
        regs.r9,
        klass,
        java_thread,
        hotspot,
    );
    0
}

/// Whether this report is the thread's first from a sampler that reports every thread's first
/// allocation by rule: that object was not drawn, so it stands for nothing but itself, and
/// weighing it as a draw would put one interval of bytes on the site of every thread's first
/// allocation. The reports after it are the sampler's draws. `flags` are the JVM's
/// `HotspotProc::flags`.
///
/// A global function (exported, not inlined), checked once on its own by the verifier, so that
/// its branches do not multiply the paths it checks through the walk after it (as
/// `unwind_steps`; inlined, the 5.10 guest of the kernel matrix once ran past its five minutes).
#[inline(never)]
#[no_mangle]
pub extern "C" fn alloc_sampler_report_is_forced(flags: u32, pid: u32, tid: u32) -> u32 {
    if flags & u32::from(hotspot_flags::SAMPLER_TAKES_FIRST) == 0 {
        return 0;
    }
    // SAFETY: copied out at once.
    if unsafe { SAMPLER_THREADS.get(&tid) } == Some(&pid) {
        return 0;
    }
    let _ = SAMPLER_THREADS.insert(&tid, &pid, 0);
    count(Counter::AllocSamplerFirstSkipped);
    1
}

/// The current thread exits: a later thread with its tid is a new one to the sampler.
#[inline(always)]
pub(crate) fn forget_exiting(tid: u32) {
    let _ = SAMPLER_THREADS.remove(&tid);
}

/// A TLAB event: drawn by its weight, left out for a JVM whose sampler reports its allocations.
#[inline(always)]
fn on_tlab_event(regs: &pt_regs, kind: SampleKind, size: u64, java_thread: u64) {
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
    // SAFETY: copied out at once.
    if unsafe { ALLOC_SAMPLED_JVMS.get(&pid) } == Some(&hotspot.instance) {
        return;
    }
    let size = allocated_since_last_event(hotspot, pid_tgid, java_thread).unwrap_or(size);
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
    walk_allocation(regs, pid_tgid, kind, size, regs.rdi, java_thread, hotspot);
}

/// Walks and sends a taken allocation event, unless another hook walks on this CPU.
#[inline(always)]
fn walk_allocation(
    regs: &pt_regs,
    pid_tgid: u64,
    kind: SampleKind,
    size: u64,
    klass: u64,
    java_thread: u64,
    hotspot: &HotspotProc,
) {
    if begin_hook_walk(Counter::AllocNested) {
        sample_allocation(regs, pid_tgid, kind, size, klass, java_thread, hotspot);
        end_hook_walk();
    }
}

/// Takes this CPU's hook walk state ([`WalkSlot::AllocHook`], which the hooks share): false,
/// counted as `nested`, if another hook walks on this CPU (a preempted one). A taken state is
/// given back with [`end_hook_walk`]. (Not a function taking the walk as a closure: the
/// compiler made that a BPF function of its own, whose stack frame took the program past the
/// 512 bytes its calls may use.)
#[inline(always)]
pub(crate) fn begin_hook_walk(nested: Counter) -> bool {
    let Some(busy) = ALLOC_BUSY.get_ptr_mut(0) else {
        return false;
    };
    // SAFETY: a per-CPU slot; a hook preempted on this CPU left it set, which is what it tells.
    unsafe {
        if *busy != 0 {
            count(nested);
            return false;
        }
        *busy = 1;
    }
    true
}

#[inline(always)]
pub(crate) fn end_hook_walk() {
    if let Some(busy) = ALLOC_BUSY.get_ptr_mut(0) {
        // SAFETY: as above.
        unsafe { *busy = 0 };
    }
}

/// The registers of a hooked function's caller, at the hook on its first instruction: the
/// return address on top of the stack, rbp still the caller's. A walk starting there sees
/// every frame as a caller's.
#[inline(always)]
pub(crate) fn hook_caller(regs: &pt_regs) -> UserRegs {
    // SAFETY: a checked read of user memory.
    let return_address = unsafe { bpf_probe_read_user(regs.rsp as *const u64) }.unwrap_or(0);
    UserRegs {
        ip: return_address,
        sp: regs.rsp.wrapping_add(8),
        fp: regs.rbp,
        r13: 0,
        rbx: 0,
        entered_kernel: false,
    }
}

/// What the thread allocated since its previous event, by HotSpot's counter; `None` if the
/// counter cannot be read.
#[inline(always)]
fn allocated_since_last_event(
    hotspot: &HotspotProc,
    pid_tgid: u64,
    java_thread: u64,
) -> Option<u64> {
    let offset = hotspot.thread_allocated_bytes;
    if offset == u16::MAX || java_thread == 0 {
        return None;
    }
    // SAFETY: a checked read of user memory.
    let allocated: u64 =
        unsafe { bpf_probe_read_user((java_thread + u64::from(offset)) as *const u64) }.ok()?;
    let (pid, tid) = ((pid_tgid >> 32) as u32, pid_tgid as u32);
    if let Some(last) = ALLOC_THREADS.get_ptr_mut(&tid) {
        // SAFETY: a value of the map; only this thread's events write it.
        let last = unsafe { &mut *last };
        if last.pid == pid && last.java_thread == java_thread && allocated >= last.allocated {
            let since = allocated - last.allocated;
            last.allocated = allocated;
            return Some(since);
        }
    }
    // The thread's first event seen. Started since the hooks: everything it allocated is ours.
    // SAFETY: copied out at once.
    let started_hooked = unsafe { JAVA_THREADS.get(&tid) }.is_some_and(|entry| {
        entry.pid == pid
            && entry.java_thread == java_thread
            && entry.origin == JAVA_THREAD_FROM_START
    });
    let first = AllocThread {
        java_thread,
        allocated,
        pid,
        _pad: 0,
    };
    let _ = ALLOC_THREADS.insert(&tid, &first, 0);
    Some(if started_hooked { allocated } else { 0 })
}

#[inline(always)]
fn sample_allocation(
    regs: &pt_regs,
    pid_tgid: u64,
    kind: SampleKind,
    size: u64,
    klass: u64,
    java_thread: u64,
    hotspot: &HotspotProc,
) {
    let pid = (pid_tgid >> 32) as u32;
    let task = CurrentTask::new(pid, WalkSlot::AllocHook as u32);
    let class = allocated_class_frame(hotspot, &task, klass);
    let Some(record) = SCRATCH.get_ptr_mut(WalkSlot::AllocHook as u32) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: this slot's record, used by one hook at a time on this CPU (the guard).
    let record = unsafe { &mut *record };
    let origin = RecordOrigin {
        kind,
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        task_state: 0,
        java_state: 0,
        weight: (size / ALLOC_WEIGHT_UNIT).min(u64::from(u32::MAX)) as u32,
        flags: 0,
        virtual_thread: 0,
    };
    let start = WalkStart {
        user: Some(hook_caller(regs)),
        slot: WalkSlot::AllocHook,
        allocated: Some((class, java_thread)),
        anchor: 0,
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
