//! The sampling program: runs on a CPU-clock perf event on every CPU and sends one record per
//! sample (pid, tid, cpu, thread name, kernel stack, user stack) through a ring buffer.
//!
//! The user stack is walked here, a frame per call of a global function in a loop, rather than
//! with `bpf_get_stack(BPF_F_USER_STACK)`: the HotSpot unwinder extends this walk with
//! per-frame rules that the kernel's frame-pointer walker cannot apply. The walk itself is
//! `profiler_unwind` (shared with its host tests); this program gives it user memory, the
//! `JAVA_THREADS` map and the sample record (`memory.rs`, `RecordFrames`).
//!
//! Two objects are built from this crate, and the daemon loads the one the kernel takes
//! (`profiler-daemon/src/kernel_features.rs`): the default one for kernels with task storage,
//! `bpf_task_pt_regs` and non-preallocated hash maps in perf-event programs (6.1+), and the
//! `compat` one (5.10+): preallocated maps, per-thread state in a hash (`thread_state.rs`), the
//! user registers of an in-kernel sample found from the task's kernel stack at an offset read
//! from the kernel's BTF. Both walk with a loop of calls to a global function (`unwind_steps`),
//! which the verifier checks once, not per call: no `bpf_loop` (5.17+) needed.
//!
//! Aggregation happens in the daemon. One record per sample keeps the kernel side simple and
//! its cost flat; at the rates this profiler runs (19 to 1000 Hz per CPU) the ring buffer carries
//! well under a megabyte per second per CPU, and the daemon folds identical stacks with one
//! hash lookup per record.
#![no_std]
#![no_main]
// `atomic_xadd`: the BPF target has no atomic types (thread_start.rs).
#![allow(internal_features)]
#![feature(core_intrinsics)]

mod alloc;
mod budget;
mod code_frees;
mod kernel_names;
mod memory;
mod off_cpu;
mod process_events;
mod task_fields;
mod thread_exit;
mod thread_start;
mod thread_state;
mod virtual_waits;

use memory::CurrentTask;

use core::{ffi::c_void, mem::offset_of, ptr::read_volatile};

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, generated as gen,
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    budget::{Producer, CPU_UNCHARGED_RECORD_BYTES},
    Counter, HotspotProc, SampleHeader, SampleKind, SampleRecord, UnwindEnd, UserFrame, COMM_LEN,
    DEFAULT_MAX_JVMS, DEFAULT_SAMPLE_RING_BYTES, FRAMES_BYTES, HEADER_BYTES, KERNEL_FRAME_BYTES,
    MAX_KERNEL_FRAMES, MAX_TARGET_PIDS, MAX_USER_FRAMES, RECORD_BYTES, USER_FRAME_BYTES,
};
use profiler_unwind::{
    settle_top_stub, simple_frames, start_at_anchor, unwind_step, FrameSink, JavaThreads,
    StackWindow, UserRegs, Walk, END_UNSET, MAX_WALK_STEPS,
};

/// The flags of the maps the daemon fills. Not preallocated where the kernel lets perf-event
/// programs use such maps (6.1+): their charged memory then follows the entries in them, not
/// their bounds. Before, the kernel refuses them there, and the daemon sizes them small.
#[cfg(not(feature = "compat"))]
pub(crate) const DAEMON_MAP_FLAGS: u32 = aya_ebpf::bindings::BPF_F_NO_PREALLOC;
#[cfg(feature = "compat")]
pub(crate) const DAEMON_MAP_FLAGS: u32 = 0;

/// Set by the daemon at load time: non-zero when only the pids in `TARGET_PIDS` are sampled.
#[no_mangle]
pub(crate) static FILTER_PIDS: u8 = 0;

/// Set by the daemon at load time with the ring's size: filled this far, the ring wakes the
/// daemon instead of waiting for its next drain (a quarter of the ring).
#[no_mangle]
static RING_WAKEUP_BYTES: u64 = DEFAULT_SAMPLE_RING_BYTES as u64 / 4;

/// Sized by the daemon at load time (`profiler_common::sample_ring_bytes`).
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(DEFAULT_SAMPLE_RING_BYTES, 0);

/// Which per-CPU walk state (record, walk, stack window, table caches) a program uses. The
/// sampler and the off-CPU switch program never run at once on one CPU (see [`fill_record`]).
/// The allocation hook runs in a task's context with interrupts on: the sampler can fire in
/// the middle of it, so it has a slot of its own (and a guard against a preempted hook, see
/// `alloc.rs`).
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub(crate) enum WalkSlot {
    Interrupt = 0,
    AllocHook = 1,
}

/// Entries of every per-CPU walk state map: one per [`WalkSlot`].
pub(crate) const WALK_SLOTS: u32 = 2;

#[map]
pub(crate) static SCRATCH: PerCpuArray<SampleRecord> = PerCpuArray::with_max_entries(WALK_SLOTS, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT as u32, 0);

#[map]
static TARGET_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGET_PIDS, DAEMON_MAP_FLAGS);

/// Per-JVM unwinding layouts, keyed by host pid; written by the daemon's JVM tracker. The size
/// is set at load time from the `max_jvms` setting.
#[map]
pub(crate) static HOTSPOT_PROCS: HashMap<u32, HotspotProc> =
    HashMap::with_max_entries(DEFAULT_MAX_JVMS, DAEMON_MAP_FLAGS);

/// x86_64: the low two bits of `cs` are the privilege level; 3 is user mode.
const USER_MODE_CS_MASK: u64 = 3;
/// `bpf_ringbuf_output` flags (uapi `BPF_RB_*`) and the `bpf_ringbuf_query` item read.
pub(crate) const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;

#[inline(always)]
pub(crate) fn count(counter: Counter) {
    if let Some(value) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU slot; nothing else on this CPU runs this program concurrently.
        unsafe { *value += 1 };
    }
}

#[perf_event]
pub fn sample_cpu(ctx: PerfEventContext) -> u32 {
    try_sample_cpu(&ctx);
    0
}

/// Where the interrupted task was in user space. A sample that landed in user mode has the user
/// registers in the perf context; one that landed in the kernel finds them at the top of the
/// task's kernel stack. Kernel threads have none.
#[inline(always)]
fn user_regs(ctx: &PerfEventContext) -> Option<UserRegs> {
    // SAFETY: the perf-event context is readable; the verifier checks the access.
    let regs = unsafe { &(*ctx.ctx).regs };
    if regs.cs & USER_MODE_CS_MASK == USER_MODE_CS_MASK {
        return Some(UserRegs {
            ip: regs.rip,
            sp: regs.rsp,
            fp: regs.rbp,
            r13: regs.r13,
            rbx: regs.rbx,
            entered_kernel: false,
        });
    }
    saved_user_regs()
}

/// The current task's user registers as it entered the kernel (the top of its kernel stack).
/// Read as the two runs of fields the walk uses, not the whole `pt_regs`: 168 bytes of stack
/// the programs cannot spare (see `unwind_steps`).
#[inline(always)]
pub(crate) fn saved_user_regs() -> Option<UserRegs> {
    let regs = user_pt_regs()?;
    const LOW: usize = offset_of!(pt_regs, r13);
    const HIGH: usize = offset_of!(pt_regs, rip);
    const _: () =
        assert!(offset_of!(pt_regs, rbx) == LOW + 24 && offset_of!(pt_regs, rbp) == LOW + 16);
    const _: () =
        assert!(offset_of!(pt_regs, cs) == HIGH + 8 && offset_of!(pt_regs, rsp) == HIGH + 24);
    // SAFETY: checked reads of kernel memory.
    let (low, high) = unsafe {
        (
            bpf_probe_read_kernel((regs + LOW as u64) as *const [u64; 4]).ok()?,
            bpf_probe_read_kernel((regs + HIGH as u64) as *const [u64; 4]).ok()?,
        )
    };
    let [r13, _r12, rbp, rbx] = low;
    let [rip, cs, _flags, rsp] = high;
    if cs & USER_MODE_CS_MASK != USER_MODE_CS_MASK || rip == 0 {
        return None;
    }
    Some(UserRegs {
        ip: rip,
        sp: rsp,
        fp: rbp,
        r13,
        rbx,
        entered_kernel: true,
    })
}

/// Where the current task's user registers are saved.
#[cfg(not(feature = "compat"))]
#[inline(always)]
fn user_pt_regs() -> Option<u64> {
    // SAFETY: helpers with no preconditions.
    Some(unsafe { gen::bpf_task_pt_regs(gen::bpf_get_current_task_btf()) } as u64)
}

/// Set by the daemon at load time (compat object): where `task_struct::stack` is, from the
/// kernel's BTF. Zero: not found, and in-kernel samples have no user stack.
#[cfg(feature = "compat")]
#[no_mangle]
static TASK_STACK_OFFSET: u64 = 0;

/// x86_64's kernel stack size (`THREAD_SIZE`, without KASAN); the user registers are saved at
/// its top, as `task_pt_regs` finds them on the kernels without FRED (6.9+) that need this path.
#[cfg(feature = "compat")]
const KERNEL_STACK_BYTES: u64 = 16 * 1024;

/// Where the current task's user registers are saved, before `bpf_task_pt_regs` (5.15).
#[cfg(feature = "compat")]
#[inline(always)]
fn user_pt_regs() -> Option<u64> {
    // SAFETY: a global the loader sets once; read-only afterwards.
    let offset = unsafe { read_volatile(&TASK_STACK_OFFSET) };
    if offset == 0 {
        return None;
    }
    // SAFETY: helper without preconditions; a checked read of kernel memory.
    let stack: u64 = unsafe {
        let task = gen::bpf_get_current_task();
        bpf_probe_read_kernel((task + offset) as *const u64).ok()?
    };
    Some(stack + KERNEL_STACK_BYTES - core::mem::size_of::<pt_regs>() as u64)
}

fn try_sample_cpu(ctx: &PerfEventContext) {
    count(Counter::Samples);
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 {
        count(Counter::Idle);
        return;
    }
    if !profiled(pid) {
        count(Counter::Filtered);
        return;
    }
    let Some(record) = SCRATCH.get_ptr_mut(WalkSlot::Interrupt as u32) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: a per-CPU map value, used by this program on this CPU only.
    let record = unsafe { &mut *record };

    let user = user_regs(ctx);
    // SAFETY: see `user_regs`.
    let in_kernel = unsafe { (*ctx.ctx).regs.cs } & USER_MODE_CS_MASK != USER_MODE_CS_MASK;
    let kernel_bytes = if in_kernel {
        kernel_stack(ctx.as_ptr(), record, 0)
    } else {
        0
    };
    let origin = RecordOrigin {
        kind: SampleKind::Cpu,
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        task_state: 0,
        java_state: 0,
        weight: 0,
        flags: 0,
        virtual_thread: 0,
    };
    let start = WalkStart {
        user,
        slot: WalkSlot::Interrupt,
        allocated: None,
        anchor: 0,
    };
    let Some(bytes) = fill_record(record, pid_tgid, start, kernel_bytes, origin) else {
        return;
    };
    if bytes.len() > CPU_UNCHARGED_RECORD_BYTES
        && !budget::admit(Producer::Cpu, pid, budget::current_uid(), bytes.len())
    {
        return;
    }
    // SAFETY: a global the loader sets once; read-only afterwards.
    let wakeup_bytes = unsafe { read_volatile(&RING_WAKEUP_BYTES) };
    match send_to(&SAMPLES, bytes, wakeup_bytes) {
        Ok(()) => count(Counter::Sent),
        Err(()) => count(Counter::RingFull),
    }
}

/// Sends a record to the daemon through `ring`. It drains on a slow timer; it is woken early
/// only when the ring holds `wakeup_bytes` or more.
#[inline(always)]
pub(crate) fn send_to(ring: &RingBuf, bytes: &[u8], wakeup_bytes: u64) -> Result<(), ()> {
    let wakeup = if ring.query(BPF_RB_AVAIL_DATA) >= wakeup_bytes {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    ring.output::<[u8]>(bytes, wakeup).map_err(|_| ())
}

/// Whether `pid` is profiled: every process, or one of the `--pid` targets.
#[inline(always)]
pub(crate) fn profiled(pid: u32) -> bool {
    // SAFETY: a read-only global the loader may have rewritten; volatile so it is not folded.
    let filter = unsafe { read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is only tested for presence.
    filter == 0 || unsafe { TARGET_PIDS.get(&pid) }.is_some()
}

/// What a record stands for, for its header.
pub(crate) struct RecordOrigin {
    pub kind: SampleKind,
    pub ktime_ns: u64,
    pub task_state: u8,
    pub java_state: u8,
    pub weight: u32,
    /// `sample_flags` bits.
    pub flags: u32,
    /// The virtual thread the record is for, when its taker knows (the unmount hook); 0: the
    /// one mounted on the thread, if any, is read after the walk.
    pub virtual_thread: u64,
}

/// Where a walk starts, and with which per-CPU state.
pub(crate) struct WalkStart {
    /// The registers to walk from (none: no user stack).
    pub user: Option<UserRegs>,
    pub slot: WalkSlot,
    /// Allocation records: the allocated class's frame, which goes first, and the thread's
    /// `JavaThread*`, whose last Java frame the walk starts at when it can.
    pub allocated: Option<(UserFrame, u64)>,
    /// Other records: a `JavaThread*` whose last Java frame the walk starts at when it can (0:
    /// none; the walk starts at `user`).
    pub anchor: u64,
}

/// Walks the current task's user stack (from `start`) into `record` after its `kernel_bytes`
/// of kernel stack, fills the header, and returns the bytes to send. The CPU sampler and the
/// off-CPU switch program share their per-CPU record and walk state ([`WalkSlot::Interrupt`]):
/// they never run at once on one CPU (the perf event's interrupt cannot fire inside the
/// scheduler, which runs with interrupts off).
#[inline(always)]
pub(crate) fn fill_record(
    record: &mut SampleRecord,
    pid_tgid: u64,
    start: WalkStart,
    kernel_bytes: usize,
    origin: RecordOrigin,
) -> Option<&[u8]> {
    let pid = (pid_tgid >> 32) as u32;
    let slot = start.slot as u32;
    let Some(state) = WALK.get_ptr_mut(slot) else {
        count(Counter::ScratchMissing);
        return None;
    };
    // SAFETY: a per-CPU map value, used by one program at a time on this CPU (see above).
    let state = unsafe { &mut *state };
    state.base = kernel_bytes as u32;
    state.pid = pid;
    state.window.clear();
    let walk = &mut state.walk;
    match start.user {
        Some(regs) => {
            // SAFETY: the value is copied out at once.
            walk.start(pid_tgid as u32, regs, unsafe { HOTSPOT_PROCS.get(&pid) });
            if let Some((class, java_thread)) = start.allocated {
                let mut frames = RecordFrames {
                    record: &mut *record,
                    base: state.base,
                };
                frames.record(0, class);
                let task = CurrentTask::new(pid, slot);
                if !start_at_anchor(walk, &task, java_thread, 1) {
                    count(Counter::AllocWalkFromHook);
                }
            } else if start.anchor != 0 {
                let task = CurrentTask::new(pid, slot);
                start_at_anchor(walk, &task, start.anchor, 0);
            }
            for _ in 0..MAX_WALK_STEPS.div_ceil(CALLS_PER_CHECK) {
                let mut done = 0;
                for _ in 0..CALLS_PER_CHECK {
                    done |= unwind_steps(slot);
                    done |= simple_compiled_steps(slot);
                }
                if done != 0 {
                    break;
                }
            }
            walk.finish();
            if walk.end == UnwindEnd::MaxDepth as u8 {
                count(Counter::UserStackTruncated);
            }
        }
        None => {
            walk.frames = 0;
            walk.end = UnwindEnd::NoUserContext as u8;
            // The slot's layout is an earlier walk's, of another process maybe: not this one's.
            walk.is_jvm = 0;
        }
    }

    let user_frames = (walk.frames as usize).min(MAX_USER_FRAMES);
    let tid = pid_tgid as u32;
    let virtual_thread = if origin.virtual_thread != 0 {
        origin.virtual_thread
    } else if walk.is_jvm != 0 && walk.hotspot.frozen.java_thread_vthread != 0 {
        mounted_virtual_thread(pid, tid, slot)
    } else {
        0
    };
    record.header = SampleHeader {
        ktime_ns: origin.ktime_ns,
        pid,
        tid,
        // SAFETY: helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        kernel_frames: (kernel_bytes / KERNEL_FRAME_BYTES) as u16,
        user_frames: user_frames as u16,
        user_end: walk.end,
        kind: origin.kind as u8,
        task_state: origin.task_state,
        java_state: origin.java_state,
        weight: origin.weight,
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
        uid: budget::current_uid(),
        flags: origin.flags,
        virtual_thread,
    };

    // Through `black_box`: the compiler proves this bound from the two above and drops the
    // check, in forms older verifiers (6.1) cannot follow to the ring buffer's size argument.
    let len = core::hint::black_box(HEADER_BYTES + kernel_bytes + user_frames * USER_FRAME_BYTES);
    if len > RECORD_BYTES {
        return None;
    }
    // SAFETY: `len` is within the record, which is plain bytes.
    Some(unsafe { core::slice::from_raw_parts(record as *const SampleRecord as *const u8, len) })
}

/// The id of the virtual thread mounted on Java thread `tid` of JVM `pid`, 0 if none (or not
/// known), with the layout the walk in `slot` copied. A global function (exported, not
/// inlined): the verifier checks its reads once, not on every path through the walk's callers.
#[inline(never)]
#[no_mangle]
pub extern "C" fn mounted_virtual_thread(pid: u32, tid: u32, slot: u32) -> u64 {
    let Some(state) = WALK.get_ptr(slot) else {
        return 0;
    };
    let task = CurrentTask::new(pid, slot);
    let Some(thread) = task.java_thread(tid) else {
        return 0;
    };
    // SAFETY: a per-CPU map value, only read; its walk has ended.
    let hotspot = unsafe { &(*state).walk.hotspot };
    profiler_unwind::mounted_virtual_tid(hotspot, &task, thread)
        .flatten()
        .unwrap_or(0)
}

/// Copies the current task's kernel stack to the start of the record's frame area and returns
/// how many bytes it used. `ctx` is the program's context (`bpf_get_stack` takes the registers
/// from it); the innermost `skip` frames are left out (`BPF_F_SKIP_FIELD_MASK`).
#[inline(always)]
pub(crate) fn kernel_stack(ctx: *mut c_void, record: &mut SampleRecord, skip: u64) -> usize {
    // SAFETY: the destination has room for MAX_KERNEL_FRAMES ips.
    let written = unsafe {
        gen::bpf_get_stack(
            ctx,
            record.frames.as_mut_ptr() as *mut c_void,
            (MAX_KERNEL_FRAMES * KERNEL_FRAME_BYTES) as u32,
            skip & 0xff,
        )
    };
    if written < 0 {
        count(Counter::KernelStackFailed);
        return 0;
    }
    (written as usize).min(MAX_KERNEL_FRAMES * KERNEL_FRAME_BYTES) & !(KERNEL_FRAME_BYTES - 1)
}

/// The walk of the current sample, in a per-CPU map so the step function reaches it (and
/// the JVM's layout copied into it, and the stack window) with one array lookup: the step runs
/// once per frame, and what it needs to start is a cost of every frame.
#[repr(C)]
struct SampleWalk {
    walk: Walk,
    /// Byte offset in the record's frame area where user frames start.
    base: u32,
    /// The sampled process (its tgid), so that a step needs no helper call to know it.
    pid: u32,
    window: StackWindow,
}

#[map]
static WALK: PerCpuArray<SampleWalk> = PerCpuArray::with_max_entries(WALK_SLOTS, 0);

/// Calls of [`unwind_steps`] between two checks of whether the walk ended. The verifier checks
/// the code after the loop once per way out of it (the loop's counter differs on each), so
/// checking after every call made the off-CPU program, whose code after the walk is long, too
/// big for 5.10's verifier; a call after the walk ended returns at once.
const CALLS_PER_CHECK: u32 = 8;

/// One unwinding step of the walk in `slot` (a [`WalkSlot`]); 1 once the walk has ended.
///
/// A global function (exported, not inlined): the verifier checks it once, on its own, rather
/// than at every call, so a loop of calls walks hundreds of frames on kernels without
/// `bpf_loop`. Its stack adds to its caller's within the 512 bytes of kernels before private
/// BPF stacks (6.12 refused 288 + 456 bytes): the blob header it reads lives in a map
/// (`UserMemory::with_scratch`), as the user registers' copy in the callers does not.
/// One step per call: with two, 6.1 and 5.10 refused a compiler spill slot read on the first
/// step before any write.
#[inline(never)]
#[no_mangle]
pub extern "C" fn unwind_steps(slot: u32) -> i32 {
    let Some((state, record)) = walk_in_progress(slot) else {
        return 1;
    };
    let mut frames = RecordFrames {
        record,
        base: state.base,
    };
    let task = CurrentTask::new(state.pid, slot);
    let (walk, window) = (&mut state.walk, &mut state.window);
    // Before the steps, not in them: see `settle_top_stub`.
    (settle_top_stub(walk, window, &task) || unwind_step(walk, window, &task, &mut frames)) as i32
}

/// After each [`unwind_steps`], the compiled frames that follow in the common case, several
/// in one call (`profiler_unwind::simple_frames`); 1 once the walk has ended. A global
/// function of its own for the same reasons: its loop is checked once, and its stack is not
/// added to `unwind_steps`'.
#[inline(never)]
#[no_mangle]
pub extern "C" fn simple_compiled_steps(slot: u32) -> i32 {
    let Some((state, record)) = walk_in_progress(slot) else {
        return 1;
    };
    let mut frames = RecordFrames {
        record,
        base: state.base,
    };
    let task = CurrentTask::new(state.pid, slot);
    simple_frames(&mut state.walk, &state.window, &task, &mut frames) as i32
}

/// The walk in `slot` and the record its user frames go to; None if the walk has ended, or
/// cannot go on (then ended).
///
/// Not a closure taking the step: LLVM made such a closure a function of its own, whose
/// frame then added to the chain of stacks the verifier sums (32 bytes from the limit on
/// 5.10).
#[inline(always)]
fn walk_in_progress(slot: u32) -> Option<(&'static mut SampleWalk, &'static mut SampleRecord)> {
    // SAFETY: per-CPU state of this sample.
    let state = unsafe { &mut *WALK.get_ptr_mut(slot)? };
    if state.walk.end != END_UNSET {
        return None;
    }
    let Some(record) = SCRATCH.get_ptr_mut(slot) else {
        state.walk.end = UnwindEnd::ReadFailed as u8;
        return None;
    };
    // SAFETY: a per-CPU map value, used by this program on this CPU only.
    Some((state, unsafe { &mut *record }))
}

/// The user frames of the sample record, after its kernel frames.
struct RecordFrames<'a> {
    record: &'a mut SampleRecord,
    /// Byte offset in the record's frame area where user frames start.
    base: u32,
}

impl FrameSink for RecordFrames<'_> {
    #[inline(always)]
    fn record(&mut self, index: u32, frame: UserFrame) -> bool {
        let offset = self.base as usize + index as usize * USER_FRAME_BYTES;
        if offset > FRAMES_BYTES - USER_FRAME_BYTES || !offset.is_multiple_of(8) {
            return false;
        }
        // SAFETY: `offset` is bounds-checked against the frame area above, and 8-aligned like
        // the frame area itself (after the 64-byte header of an 8-aligned map value): stored
        // as three words, where an unaligned store was 24 byte stores.
        unsafe {
            let slot = self.record.frames.as_mut_ptr().add(offset) as *mut UserFrame;
            slot.write(frame);
        }
        true
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
