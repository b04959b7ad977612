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

use core::{ffi::c_void, ptr::read_volatile};

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
    hotspot_flags, Counter, FrameKind, HotspotProc, SampleHeader, SampleRecord, UnwindEnd,
    UserFrame, BCI_UNKNOWN, COMM_LEN, DEFAULT_MAX_JVMS, FRAMES_BYTES, HEADER_BYTES,
    KERNEL_FRAME_BYTES, MAX_CODE_HEAPS, MAX_JAVA_THREADS, MAX_KERNEL_FRAMES, MAX_TARGET_PIDS,
    MAX_USER_FRAMES, RECORD_BYTES, SAMPLE_RING_BYTES, USER_FRAME_BYTES,
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

/// Host tid -> `JavaThread*` of every Java thread of the JVMs above; written by the daemon. Lets
/// the walk resume at a thread's last Java frame when native code without frame pointers (a
/// JNI library, libc) hides the way back.
#[map]
static JAVA_THREADS: HashMap<u32, u64> = HashMap::with_max_entries(MAX_JAVA_THREADS, 0);

/// `JavaThread::_thread_state` values of a thread outside Java code, whose anchor is valid.
const THREAD_IN_NATIVE: u32 = 4;
const THREAD_IN_VM: u32 = 6;
const THREAD_BLOCKED: u32 = 10;

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
    sp: u64,
    fp: u64,
    /// The interpreter keeps the live bcp in r13 (x86_64).
    r13: u64,
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
        sp: saved.rsp,
        fp: saved.rbp,
        r13: saved.r13,
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

    let Some(walk) = WALK.get_ptr_mut(0) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: a per-CPU map value, used by this program on this CPU only.
    let walk = unsafe { &mut *walk };
    walk.base = kernel_bytes as u32;
    walk.frames = 0;
    walk.end = END_UNSET;
    walk.skip = 0;
    walk.java_seen = 0;
    walk.tid = pid_tgid as u32;
    walk.blob_cache.blob = 0;
    if let Some(window) = STACK_WINDOW.get_ptr_mut(0) {
        // SAFETY: a per-CPU map value, used by this program on this CPU only.
        unsafe { (*window).len = 0 };
    }
    match user {
        Some(regs) => {
            walk.pc = regs.ip;
            walk.sp = regs.sp;
            walk.fp = regs.fp;
            walk.r13 = regs.r13;
            // SAFETY: the value is copied out at once.
            match unsafe { HOTSPOT_PROCS.get(&pid) } {
                Some(hotspot) => {
                    walk.hotspot = *hotspot;
                    walk.is_jvm = 1;
                }
                None => walk.is_jvm = 0,
            }
            // SAFETY: bpf_loop calls `unwind_steps`, which finds its state in WALK.
            unsafe {
                gen::bpf_loop(
                    MAX_WALK_STEPS.div_ceil(STEPS_PER_CALLBACK),
                    unwind_steps as *mut c_void,
                    core::ptr::null_mut(),
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

/// State of the user stack walk, in a per-CPU map so the `bpf_loop` callback reaches it (and
/// the JVM's layout copied into it) with one array lookup.
#[repr(C)]
struct Walk {
    /// The frame to unwind next: its pc, sp and fp.
    pc: u64,
    sp: u64,
    fp: u64,
    /// r13 at the sample (the interpreter's bcp, for the top frame).
    r13: u64,
    /// Byte offset in the record's frame area where user frames start.
    base: u32,
    /// Frames recorded so far.
    frames: u32,
    /// The `UnwindEnd` once the walk has stopped, else `END_UNSET`.
    end: u8,
    /// Non-zero when `hotspot` describes this process.
    is_jvm: u8,
    /// Non-zero when the current frame is not recorded (the call stub).
    skip: u8,
    /// Non-zero once a Java frame was walked, or the thread's anchor was used.
    java_seen: u8,
    _reserved: [u8; 4],
    /// Host tid of the sampled thread.
    tid: u32,
    _reserved2: u32,
    /// The last code blob read during this walk.
    blob_cache: BlobCache,
    hotspot: HotspotProc,
}

#[map]
static WALK: PerCpuArray<Walk> = PerCpuArray::with_max_entries(1, 0);

/// Steps of the walk: frames recorded plus the few that are skipped.
const MAX_WALK_STEPS: u32 = MAX_USER_FRAMES as u32 + 16;
/// Bound on segment-map hops to a blob's start (HotSpot blobs need at most a few; OTel uses 12).
const SEGMAP_HOPS: u32 = 16;
/// Largest compiled frame accepted, in words (SafepointBlob has a few hundred).
const MAX_FRAME_WORDS: i64 = 4096;
/// Bytes of a CodeBlob header read at once (every field we use lies below this).
const BLOB_HEADER_BYTES: usize = 128;

/// A copy of the part of the sampled thread's stack the walk is in: frames are contiguous, so one
/// read of up to a page serves many frames (a deep Java stack costs a few reads, not hundreds).
#[repr(C)]
struct StackWindow {
    base: u64,
    len: u64,
    bytes: [u8; STACK_WINDOW_BYTES],
}

const STACK_WINDOW_BYTES: usize = 4096;

#[map]
static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// The two words at `addr` on the sampled thread's stack, through the window.
#[inline(always)]
fn stack_pair(window: &mut StackWindow, addr: u64) -> Result<[u64; 2], UnwindEnd> {
    if addr < window.base || addr.wrapping_add(16) > window.base.wrapping_add(window.len) {
        // Refill from `addr` to the end of its page: never crosses into an unmapped page.
        let len = 4096 - (addr & 0xfff);
        if len < 16 {
            return read_pair(addr);
        }
        let len = (len as usize).min(STACK_WINDOW_BYTES);
        // SAFETY: a checked read of user memory into the window, `len` bounded by its size.
        let read = unsafe {
            gen::bpf_probe_read_user(
                window.bytes.as_mut_ptr() as *mut c_void,
                len as u32,
                addr as *const c_void,
            )
        };
        if read < 0 {
            window.len = 0;
            return Err(UnwindEnd::JavaReadFailed);
        }
        window.base = addr;
        window.len = len as u64;
    }
    let at = (addr - window.base) as usize;
    if at > STACK_WINDOW_BYTES - 16 {
        return Err(UnwindEnd::JavaReadFailed);
    }
    let word = |at: usize| {
        let b = &window.bytes;
        u64::from_le_bytes([
            b[at],
            b[at + 1],
            b[at + 2],
            b[at + 3],
            b[at + 4],
            b[at + 5],
            b[at + 6],
            b[at + 7],
        ])
    };
    Ok([word(at), word(at + 8)])
}

#[inline(always)]
fn stack_u64(window: &mut StackWindow, addr: u64) -> Result<u64, UnwindEnd> {
    stack_pair(window, addr).map(|pair| pair[0])
}

/// Frames unwound per `bpf_loop` iteration: amortises the callback and map lookups.
const STEPS_PER_CALLBACK: u32 = 4;

/// `STEPS_PER_CALLBACK` unwinding steps. Returns 1 to stop the loop.
#[inline(never)]
extern "C" fn unwind_steps(_index: u64, _ctx: *mut c_void) -> i64 {
    let Some(walk) = WALK.get_ptr_mut(0) else {
        return 1;
    };
    // SAFETY: per-CPU state of this sample.
    let walk = unsafe { &mut *walk };
    let Some(record) = SCRATCH.get_ptr_mut(0) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return 1;
    };
    // SAFETY: a per-CPU map value, used by this program on this CPU only.
    let record = unsafe { &mut *record };
    let Some(window) = STACK_WINDOW.get_ptr_mut(0) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return 1;
    };
    // SAFETY: as above.
    let window = unsafe { &mut *window };
    for _ in 0..STEPS_PER_CALLBACK {
        if unwind_step(walk, record, window) {
            return 1;
        }
    }
    0
}

/// One unwinding step: records the current frame, then moves to its caller. True to stop.
#[inline(always)]
fn unwind_step(walk: &mut Walk, record: &mut SampleRecord, window: &mut StackWindow) -> bool {
    if walk.pc == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return true;
    }
    let top = walk.frames == 0;
    let in_code_cache =
        walk.is_jvm != 0 && walk.pc >= walk.hotspot.code_low && walk.pc < walk.hotspot.code_high;
    walk.skip = 0;
    if in_code_cache {
        walk.java_seen = 1;
    }
    let step = if in_code_cache {
        java_step(walk, window, top)
    } else {
        native_step(walk, window)
    };
    let frame = match step {
        Ok(frame) => frame,
        Err(end) => {
            walk.end = end as u8;
            return true;
        }
    };
    if walk.skip == 0 {
        let offset = walk.base as usize + walk.frames as usize * USER_FRAME_BYTES;
        if offset > FRAMES_BYTES - USER_FRAME_BYTES {
            walk.end = UnwindEnd::MaxDepth as u8;
            return true;
        }
        // SAFETY: `offset` is bounds-checked against the frame area above.
        unsafe {
            let slot = record.frames.as_mut_ptr().add(offset) as *mut UserFrame;
            slot.write_unaligned(frame);
        }
        walk.frames += 1;
        if walk.frames as usize >= MAX_USER_FRAMES {
            walk.end = UnwindEnd::MaxDepth as u8;
            return true;
        }
    }
    if walk.end != END_UNSET && walk.end != UnwindEnd::MaxDepth as u8 && resume_at_anchor(walk) {
        walk.end = END_UNSET;
    }
    if walk.end != END_UNSET {
        return true;
    }
    false
}

/// A JVM thread whose native frames led nowhere (code without frame pointers) before any Java
/// frame: if it is in native or VM code, its `JavaFrameAnchor` holds its last Java frame.
/// Returns true if the walk continues from there.
#[inline(always)]
fn resume_at_anchor(walk: &mut Walk) -> bool {
    if walk.is_jvm == 0 || walk.java_seen != 0 {
        return false;
    }
    walk.java_seen = 1;
    // SAFETY: the value is copied out at once.
    let Some(&thread) = (unsafe { JAVA_THREADS.get(&walk.tid) }) else {
        return false;
    };
    let hs = &walk.hotspot;
    // SAFETY: checked reads of user memory.
    let state =
        unsafe { bpf_probe_read_user((thread + hs.java_thread_state as u64) as *const u32) }
            .unwrap_or(0);
    if state != THREAD_IN_NATIVE && state != THREAD_IN_VM && state != THREAD_BLOCKED {
        return false;
    }
    let anchor = thread + hs.java_thread_anchor as u64;
    // The anchor's sp is written last: once it is set, pc and fp are valid.
    let Ok(sp) = read_u64(anchor + hs.anchor_sp as u64) else {
        return false;
    };
    if sp == 0 {
        return false;
    }
    let pc = match read_u64(anchor + hs.anchor_pc as u64) {
        Ok(0) | Err(_) => read_u64(sp - 8).unwrap_or(0),
        Ok(pc) => pc,
    };
    let fp = if hs.anchor_fp == u16::MAX {
        0
    } else {
        read_u64(anchor + hs.anchor_fp as u64).unwrap_or(0)
    };
    if pc == 0 {
        return false;
    }
    walk.pc = pc;
    walk.sp = sp;
    walk.fp = fp;
    true
}

#[inline(always)]
fn frame(kind: FrameKind, addr: u64, aux: u32, cookie: u32) -> UserFrame {
    UserFrame {
        addr,
        aux,
        cookie,
        kind: kind as u8,
        _reserved: [0; 7],
    }
}

#[inline(always)]
fn read_u64(addr: u64) -> Result<u64, UnwindEnd> {
    // SAFETY: a checked read of user memory.
    unsafe { bpf_probe_read_user(addr as *const u64) }.map_err(|_| UnwindEnd::JavaReadFailed)
}

/// A frame-pointer step: [fp] is the caller's saved fp, [fp + 8] the return address.
#[inline(always)]
fn native_step(walk: &mut Walk, window: &mut StackWindow) -> Result<UserFrame, UnwindEnd> {
    let recorded = frame(FrameKind::Native, walk.pc, 0, 0);
    if walk.fp == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return Ok(recorded);
    }
    let Ok(slot) = stack_pair(window, walk.fp) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return Ok(recorded);
    };
    let (saved_fp, return_address) = (slot[0], slot[1]);
    if return_address == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return Ok(recorded);
    }
    // In a JVM, a native frame's caller may be JIT code that does not keep rbp as a frame
    // pointer: the chain is then only checked once we are back in native code.
    let caller_in_java = walk.is_jvm != 0
        && return_address >= walk.hotspot.code_low
        && return_address < walk.hotspot.code_high;
    if !caller_in_java && saved_fp != 0 && saved_fp <= walk.fp {
        walk.end = UnwindEnd::NotMonotonic as u8;
        return Ok(recorded);
    }
    walk.sp = walk.fp + 16;
    walk.pc = return_address;
    walk.fp = saved_fp;
    Ok(recorded)
}

/// One HotSpot frame: interpreted (the interpreter's code range), the call stub (skipped), or a
/// code blob found through its heap's segment map (nmethods and stubs).
#[inline(always)]
fn java_step(walk: &mut Walk, window: &mut StackWindow, top: bool) -> Result<UserFrame, UnwindEnd> {
    let hs = &walk.hotspot;
    let (pc, sp, fp) = (walk.pc, walk.sp, walk.fp);
    if pc >= hs.interpreter_low && pc < hs.interpreter_high {
        return interpreted_step(walk, window, top);
    }
    if pc == hs.call_stub_return {
        // The call stub is an rbp frame; its caller is native code (JavaCalls::call_helper).
        walk.skip = 1;
        let slot = stack_pair(window, fp)?;
        walk.sp = fp + 16;
        walk.fp = slot[0];
        walk.pc = slot[1];
        return Ok(frame(FrameKind::Native, pc, 0, 0));
    }
    // Deep stacks repeat blobs (recursion, loops over the same callees): the last blob found is
    // kept, and a pc inside it skips the segment map and header reads.
    let cached = walk.blob_cache;
    let blob = if cached.blob != 0 && pc >= cached.code_begin && pc < cached.end {
        cached
    } else {
        let found = read_blob(hs, pc)?;
        walk.blob_cache = found;
        found
    };
    let BlobCache {
        blob: blob_address,
        code_begin,
        end,
        frame_size,
        frame_complete,
        compile_id,
        deopt_handler,
        orig_pc_offset,
    } = blob;
    let (frame_size, frame_complete) = (frame_size as i64, frame_complete as i64);
    if code_begin == 0 || pc < code_begin || frame_size > MAX_FRAME_WORDS {
        return Err(UnwindEnd::BadJavaFrame);
    }
    // A frame being deoptimized returns into its nmethod's deopt handler; the pc it had (which
    // the debug info describes) was saved in the frame.
    let mut described_pc = pc;
    if !top && deopt_handler != 0 && pc == deopt_handler {
        if let Ok(original) = stack_u64(window, sp.wrapping_add(orig_pc_offset as i64 as u64)) {
            if original >= code_begin && original < end {
                described_pc = original;
            }
        }
    }
    let offset = described_pc - code_begin;
    let recorded = frame(FrameKind::Compiled, blob_address, offset as u32, compile_id);

    if top
        && frame_size > 0
        && offset as i64 >= frame_complete
        && epilogue_step(walk, window, pc, sp)?
    {
        // Handled: the top frame was in its epilogue, its frame already popped.
    } else if frame_size > 0 && (!top || offset as i64 >= frame_complete) {
        // A complete compiled frame: fixed size, return address and saved rbp on top of it.
        let caller_sp = sp + frame_size as u64 * 8;
        let slot = stack_pair(window, caller_sp - 16)?;
        walk.fp = slot[0];
        walk.pc = slot[1];
        walk.sp = caller_sp;
    } else if frame_size > 0 {
        // The top frame is still in its prologue: the return address is at sp, or above the
        // pushed rbp once `push rbp` has run (the last instructions before frame_complete).
        if offset as i64 >= frame_complete - 4 {
            let slot = stack_pair(window, sp)?;
            walk.fp = slot[0];
            walk.pc = slot[1];
            walk.sp = sp + 16;
        } else {
            walk.pc = stack_u64(window, sp)?;
            walk.sp = sp + 8;
        }
    } else {
        // Stubs and adapters without a fixed frame keep rbp as a frame pointer.
        let slot = stack_pair(window, fp)?;
        walk.sp = fp + 16;
        walk.fp = slot[0];
        walk.pc = slot[1];
    }
    Ok(recorded)
}

/// The top compiled frame may be in its epilogue (`add rsp, N; pop rbp; [safepoint poll]; ret`)
/// with its frame already popped: recognise the instruction at pc. Returns true if it was, with
/// the walk moved to the caller.
#[inline(always)]
fn epilogue_step(
    walk: &mut Walk,
    window: &mut StackWindow,
    pc: u64,
    sp: u64,
) -> Result<bool, UnwindEnd> {
    // SAFETY: a checked read of user memory (the code at pc).
    let Ok(code) = (unsafe { bpf_probe_read_user(pc as *const [u8; 4]) }) else {
        return Ok(false);
    };
    let at_ret = code[0] == 0xc3;
    let at_pop_rbp = code[0] == 0x5d;
    // Safepoint polls after `pop rbp`: `cmp rsp, [r15 + disp]` (JDK 17+), or
    // `mov r10, [r15 + disp]` then `test [r10], eax` (older).
    let at_poll = (code[0] == 0x49 && code[1] == 0x3b && (code[2] == 0x67 || code[2] == 0xa7))
        || (code[0] == 0x4d && code[1] == 0x8b && code[2] == 0x57)
        || (code[0] == 0x41 && code[1] == 0x85 && code[2] == 0x02);
    if at_pop_rbp {
        let slot = stack_pair(window, sp)?;
        walk.fp = slot[0];
        walk.pc = slot[1];
        walk.sp = sp + 16;
        return Ok(true);
    }
    if at_ret || at_poll {
        walk.pc = stack_u64(window, sp)?;
        walk.sp = sp + 8;
        return Ok(true);
    }
    Ok(false)
}

/// What the unwinder needs of one code blob; also the walk's one-entry cache.
#[repr(C)]
#[derive(Clone, Copy)]
struct BlobCache {
    blob: u64,
    code_begin: u64,
    /// End of the blob (`blob + _size`).
    end: u64,
    frame_size: i32,
    frame_complete: i32,
    compile_id: u32,
    orig_pc_offset: i32,
    /// Where a deoptimized frame returns to (0 if unknown).
    deopt_handler: u64,
}

/// Finds the blob containing `pc` and reads its header.
#[inline(always)]
fn read_blob(hs: &HotspotProc, pc: u64) -> Result<BlobCache, UnwindEnd> {
    let blob = find_blob(hs, pc)?;
    let mut header = [0u8; BLOB_HEADER_BYTES];
    // SAFETY: a checked read of user memory into a stack buffer.
    let read = unsafe {
        gen::bpf_probe_read_user(
            header.as_mut_ptr() as *mut c_void,
            BLOB_HEADER_BYTES as u32,
            blob as *const c_void,
        )
    };
    if read < 0 {
        return Err(UnwindEnd::JavaReadFailed);
    }
    let code_begin = if hs.flags & hotspot_flags::CODE_OFFSET != 0 {
        blob.wrapping_add(header_i32(&header, hs.blob_code) as i64 as u64)
    } else {
        header_u64(&header, hs.blob_code)
    };
    let frame_complete = if hs.flags & hotspot_flags::FRAME_COMPLETE_16 != 0 {
        header_i16(&header, hs.blob_frame_complete) as i32
    } else {
        header_i32(&header, hs.blob_frame_complete)
    };
    let size = header_i32(&header, hs.blob_size);
    // SAFETY: a checked read of user memory; a stub has no compile id, and userspace checks it.
    let compile_id =
        unsafe { bpf_probe_read_user((blob + hs.nmethod_compile_id as u64) as *const u32) }
            .unwrap_or(0);
    // SAFETY: checked reads of user memory; meaningless for stubs, which never match them.
    let deopt_handler = if hs.flags & hotspot_flags::DEOPT_HANDLER_OFFSET != 0 {
        let offset =
            unsafe { bpf_probe_read_user((blob + hs.nmethod_deopt_handler as u64) as *const i32) }
                .unwrap_or(0);
        if offset > 0 {
            blob + offset as u64
        } else {
            0
        }
    } else {
        unsafe { bpf_probe_read_user((blob + hs.nmethod_deopt_handler as u64) as *const u64) }
            .unwrap_or(0)
    };
    // SAFETY: as above.
    let orig_pc_offset =
        unsafe { bpf_probe_read_user((blob + hs.nmethod_orig_pc_offset as u64) as *const i32) }
            .unwrap_or(0);
    Ok(BlobCache {
        blob,
        code_begin,
        end: blob.wrapping_add(size.max(0) as u64),
        frame_size: header_i32(&header, hs.blob_frame_size),
        frame_complete,
        compile_id,
        orig_pc_offset,
        deopt_handler,
    })
}

/// An interpreter frame: Method* and bcp from fixed slots below fp (the live bcp from r13 for
/// the interrupted frame); the caller's sp is the saved sender sp.
#[inline(always)]
fn interpreted_step(
    walk: &mut Walk,
    window: &mut StackWindow,
    top: bool,
) -> Result<UserFrame, UnwindEnd> {
    let hs = &walk.hotspot;
    let (sp, fp) = (walk.sp, walk.fp);
    if fp < sp || fp - sp > 1 << 20 {
        return Err(UnwindEnd::BadJavaFrame);
    }
    let method = stack_u64(window, slot_address(fp, hs.interpreter_method_slot))?;
    let const_method = read_u64(method + hs.method_const_method as u64)?;
    // SAFETY: a checked read of user memory.
    let code_size = unsafe {
        bpf_probe_read_user((const_method + hs.const_method_code_size as u64) as *const u16)
    }
    .map_err(|_| UnwindEnd::JavaReadFailed)? as u64;
    let code_start = const_method + hs.const_method_size as u64;
    let in_code = |bcp: u64| bcp >= code_start && bcp < code_start + code_size.max(1);
    let saved_bcp = stack_u64(window, slot_address(fp, hs.interpreter_bcp_slot)).unwrap_or(0);
    let bcp = if top && in_code(walk.r13) {
        walk.r13
    } else {
        saved_bcp
    };
    let bci = if in_code(bcp) {
        (bcp - code_start) as u32
    } else {
        BCI_UNKNOWN
    };
    let recorded = frame(
        FrameKind::Interpreted,
        method,
        bci,
        (const_method >> 3) as u32,
    );

    let slot = stack_pair(window, fp)?;
    let sender_sp = stack_u64(window, fp.wrapping_sub(8))?;
    walk.fp = slot[0];
    walk.pc = slot[1];
    walk.sp = sender_sp;
    Ok(recorded)
}

#[inline(always)]
fn slot_address(fp: u64, slot: i8) -> u64 {
    fp.wrapping_add((slot as i64 * 8) as u64)
}

#[inline(always)]
fn read_pair(addr: u64) -> Result<[u64; 2], UnwindEnd> {
    // SAFETY: a checked read of user memory.
    unsafe { bpf_probe_read_user(addr as *const [u64; 2]) }.map_err(|_| UnwindEnd::JavaReadFailed)
}

#[inline(always)]
fn header_u64(header: &[u8; BLOB_HEADER_BYTES], offset: u16) -> u64 {
    let at = (offset as usize) & (BLOB_HEADER_BYTES - 1);
    if at + 8 > BLOB_HEADER_BYTES {
        return 0;
    }
    u64::from_le_bytes([
        header[at],
        header[at + 1],
        header[at + 2],
        header[at + 3],
        header[at + 4],
        header[at + 5],
        header[at + 6],
        header[at + 7],
    ])
}

#[inline(always)]
fn header_i32(header: &[u8; BLOB_HEADER_BYTES], offset: u16) -> i32 {
    let at = (offset as usize) & (BLOB_HEADER_BYTES - 1);
    if at + 4 > BLOB_HEADER_BYTES {
        return 0;
    }
    i32::from_le_bytes([header[at], header[at + 1], header[at + 2], header[at + 3]])
}

#[inline(always)]
fn header_i16(header: &[u8; BLOB_HEADER_BYTES], offset: u16) -> i16 {
    let at = (offset as usize) & (BLOB_HEADER_BYTES - 1);
    if at + 2 > BLOB_HEADER_BYTES {
        return 0;
    }
    i16::from_le_bytes([header[at], header[at + 1]])
}

/// The CodeBlob containing `pc`, through its heap's segment map (HotSpot's
/// `CodeHeap::find_start`): each map byte says how many segments back the block starts.
#[inline(always)]
fn find_blob(hs: &HotspotProc, pc: u64) -> Result<u64, UnwindEnd> {
    let mut heap = None;
    for i in 0..MAX_CODE_HEAPS {
        if i < hs.heap_count as usize && pc >= hs.heaps[i].low && pc < hs.heaps[i].high {
            heap = Some(hs.heaps[i]);
        }
    }
    let Some(heap) = heap else {
        return Err(UnwindEnd::NoCodeBlob);
    };
    let shift = heap.log2_segment_size & 31;
    let mut index = (pc - heap.low) >> shift;
    let mut found = false;
    for _ in 0..SEGMAP_HOPS {
        // SAFETY: a checked read of user memory.
        let hop = unsafe { bpf_probe_read_user((heap.segmap + index) as *const u8) }
            .map_err(|_| UnwindEnd::JavaReadFailed)?;
        if hop == 0xff {
            return Err(UnwindEnd::NoCodeBlob);
        }
        if hop == 0 {
            found = true;
            break;
        }
        if (hop as u64) > index {
            return Err(UnwindEnd::NoCodeBlob);
        }
        index -= hop as u64;
    }
    if !found {
        return Err(UnwindEnd::NoCodeBlob);
    }
    let block = heap.low + (index << shift);
    // SAFETY: a checked read of user memory.
    let used = unsafe { bpf_probe_read_user((block + hs.heap_block_used as u64) as *const u8) }
        .map_err(|_| UnwindEnd::JavaReadFailed)?;
    if used == 0 {
        return Err(UnwindEnd::NoCodeBlob);
    }
    Ok(block + hs.heap_block_size as u64)
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
