//! The sampling program: runs on a CPU-clock perf event on every CPU and sends one record per
//! sample (pid, tid, cpu, thread name, kernel stack, user stack) through a ring buffer.
//!
//! The user stack is walked here, frame by frame in a `bpf_loop` callback, rather than with
//! `bpf_get_stack(BPF_F_USER_STACK)`: the HotSpot unwinder extends this walk with per-frame
//! rules that the kernel's frame-pointer walker cannot apply.
//!
//! Aggregation happens in the daemon. One record per sample keeps the kernel side simple and
//! its cost flat; at the rates this profiler runs (19 to 1000 Hz per CPU) the ring buffer carries
//! well under a megabyte per second per CPU, and the daemon folds identical stacks with one
//! hash lookup per record.
#![no_std]
#![no_main]

use core::{ffi::c_void, mem::size_of, ptr::read_volatile};

use aya_ebpf::{
    bindings::pt_regs,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_user, generated as gen,
    },
    macros::{map, perf_event},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::PerfEventContext,
    EbpfContext,
};
use profiler_common::{
    Counter, FrameKind, HotspotProc, SampleHeader, SampleRecord, UnwindEnd, UserFrame, COMM_LEN,
    DEFAULT_MAX_JVMS, FRAMES_BYTES, HEADER_BYTES, KERNEL_FRAME_BYTES, MAX_KERNEL_FRAMES,
    MAX_TARGET_PIDS, MAX_USER_FRAMES, RECORD_BYTES, SAMPLE_RING_BYTES, USER_FRAME_BYTES,
};

/// Set by the daemon at load time: non-zero when only the pids in `TARGET_PIDS` are sampled.
#[no_mangle]
static FILTER_PIDS: u8 = 0;

#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(SAMPLE_RING_BYTES, 0);

#[map]
static SCRATCH: PerCpuArray<SampleRecord> = PerCpuArray::with_max_entries(1, 0);

#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(Counter::COUNT, 0);

#[map]
static TARGET_PIDS: HashMap<u32, u8> = HashMap::with_max_entries(MAX_TARGET_PIDS, 0);

/// Per-JVM unwinding layouts, keyed by host pid; written by the daemon's JVM tracker. The size
/// is set at load time from the `max_jvms` setting.
#[map]
static HOTSPOT_PROCS: HashMap<u32, HotspotProc> = HashMap::with_max_entries(DEFAULT_MAX_JVMS, 0);

/// x86_64: the low two bits of `cs` are the privilege level; 3 is user mode.
const USER_MODE_CS_MASK: u64 = 3;
/// The daemon drains the ring on a timer: no wake-up per sample.
const BPF_RB_NO_WAKEUP: u64 = 1;
/// Marks `Walk::end` as "not decided yet".
const END_UNSET: u8 = u8::MAX;

#[inline(always)]
fn count(counter: Counter) {
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

/// The registers the user stack walk starts from.
struct UserRegs {
    ip: u64,
    fp: u64,
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
            fp: regs.rbp,
        });
    }
    // SAFETY: helpers with no preconditions; the read is checked by the kernel.
    let saved = unsafe {
        let task = gen::bpf_get_current_task_btf();
        let regs = gen::bpf_task_pt_regs(task) as *const pt_regs;
        bpf_probe_read_kernel(regs).ok()?
    };
    if saved.cs & USER_MODE_CS_MASK != USER_MODE_CS_MASK || saved.rip == 0 {
        return None;
    }
    Some(UserRegs {
        ip: saved.rip,
        fp: saved.rbp,
    })
}

fn try_sample_cpu(ctx: &PerfEventContext) {
    count(Counter::Samples);
    let pid_tgid = bpf_get_current_pid_tgid();
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 {
        count(Counter::Idle);
        return;
    }
    // SAFETY: a read-only global the loader may have rewritten; volatile so it is not folded.
    let filter = unsafe { read_volatile(&FILTER_PIDS) };
    // SAFETY: the value is only tested for presence.
    if filter != 0 && unsafe { TARGET_PIDS.get(&pid) }.is_none() {
        count(Counter::Filtered);
        return;
    }
    let Some(record) = SCRATCH.get_ptr_mut(0) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: a per-CPU map value, used by this program on this CPU only.
    let record = unsafe { &mut *record };

    let user = user_regs(ctx);
    let kernel_bytes = kernel_stack(ctx, record);

    let mut walk = Walk {
        pc: 0,
        fp: 0,
        base: kernel_bytes as u32,
        frames: 0,
        end: END_UNSET,
        pending_end: END_UNSET,
    };
    match user {
        Some(regs) => {
            walk.pc = regs.ip;
            walk.fp = regs.fp;
            // SAFETY: bpf_loop calls `unwind_step` with our context pointer, which outlives it.
            unsafe {
                gen::bpf_loop(
                    MAX_USER_FRAMES as u32,
                    unwind_step as *mut c_void,
                    &mut walk as *mut Walk as *mut c_void,
                    0,
                )
            };
            if walk.end == END_UNSET {
                walk.end = UnwindEnd::MaxDepth as u8;
            }
            if walk.end == UnwindEnd::MaxDepth as u8 {
                count(Counter::UserStackTruncated);
            }
        }
        None => walk.end = UnwindEnd::NoUserContext as u8,
    }

    let user_frames = (walk.frames as usize).min(MAX_USER_FRAMES);
    record.header = SampleHeader {
        // SAFETY: helper without preconditions.
        ktime_ns: unsafe { bpf_ktime_get_ns() },
        pid,
        tid: pid_tgid as u32,
        // SAFETY: helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        kernel_frames: (kernel_bytes / KERNEL_FRAME_BYTES) as u16,
        user_frames: user_frames as u16,
        user_end: walk.end,
        _reserved: [0; 7],
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    };

    let len = HEADER_BYTES + kernel_bytes + user_frames * USER_FRAME_BYTES;
    if len > RECORD_BYTES {
        return;
    }
    // SAFETY: `len` is within the record, which is plain bytes.
    let bytes =
        unsafe { core::slice::from_raw_parts(record as *const SampleRecord as *const u8, len) };
    match SAMPLES.output::<[u8]>(bytes, BPF_RB_NO_WAKEUP) {
        Ok(()) => count(Counter::Sent),
        Err(_) => count(Counter::RingFull),
    }
}

/// Copies the kernel stack (if the sample landed in the kernel) to the start of the record's
/// frame area and returns how many bytes it used.
#[inline(always)]
fn kernel_stack(ctx: &PerfEventContext, record: &mut SampleRecord) -> usize {
    // SAFETY: see `user_regs`.
    let in_kernel = unsafe { (*ctx.ctx).regs.cs } & USER_MODE_CS_MASK != USER_MODE_CS_MASK;
    if !in_kernel {
        return 0;
    }
    // SAFETY: the destination has room for MAX_KERNEL_FRAMES ips.
    let written = unsafe {
        gen::bpf_get_stack(
            ctx.as_ptr(),
            record.frames.as_mut_ptr() as *mut c_void,
            (MAX_KERNEL_FRAMES * KERNEL_FRAME_BYTES) as u32,
            0,
        )
    };
    if written < 0 {
        count(Counter::KernelStackFailed);
        return 0;
    }
    (written as usize).min(MAX_KERNEL_FRAMES * KERNEL_FRAME_BYTES) & !(KERNEL_FRAME_BYTES - 1)
}

/// State of the user stack walk, shared with the `bpf_loop` callback.
#[repr(C)]
struct Walk {
    /// The frame to record next.
    pc: u64,
    /// The frame pointer of the frame that `pc` belongs to.
    fp: u64,
    /// Byte offset in the record's frame area where user frames start.
    base: u32,
    /// Frames recorded so far.
    frames: u32,
    /// The `UnwindEnd` once the walk has stopped, else `END_UNSET`.
    end: u8,
    /// An end decided one frame early: record `pc`, then stop with it.
    pending_end: u8,
}

/// One frame-pointer step: records `pc`, then moves to the caller. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn unwind_step(index: u64, ctx: *mut c_void) -> i64 {
    // SAFETY: `ctx` is the `Walk` passed to bpf_loop.
    let walk = unsafe { &mut *(ctx as *mut Walk) };
    let Some(record) = SCRATCH.get_ptr_mut(0) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return 1;
    };
    let offset = walk.base as usize + index as usize * USER_FRAME_BYTES;
    if offset > FRAMES_BYTES - USER_FRAME_BYTES {
        walk.end = UnwindEnd::MaxDepth as u8;
        return 1;
    }
    let frame = UserFrame {
        addr: walk.pc,
        aux: 0,
        cookie: 0,
        kind: FrameKind::Native as u8,
        _reserved: [0; 7],
    };
    // SAFETY: `offset` is bounds-checked against the frame area above.
    unsafe {
        let slot = (*record).frames.as_mut_ptr().add(offset) as *mut UserFrame;
        slot.write_unaligned(frame);
    }
    walk.frames = index as u32 + 1;

    if walk.pending_end != END_UNSET {
        walk.end = walk.pending_end;
        return 1;
    }
    if walk.fp == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return 1;
    }
    // [fp] is the caller's saved frame pointer, [fp + 8] the return address into the caller.
    // SAFETY: a checked read of user memory.
    let Ok(slot) = (unsafe { bpf_probe_read_user(walk.fp as *const [u64; 2]) }) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return 1;
    };
    let (saved_fp, return_address) = (slot[0], slot[1]);
    if return_address == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return 1;
    }
    if saved_fp != 0 && saved_fp <= walk.fp {
        walk.pending_end = UnwindEnd::NotMonotonic as u8;
    }
    walk.pc = return_address;
    walk.fp = saved_fp;
    0
}

const _: () = assert!(size_of::<Walk>() == 32);

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
