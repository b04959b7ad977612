//! The walk's state and one step of it: record the current frame, move to its caller, and when
//! the native frames of a JVM thread lead nowhere, resume at its `JavaFrameAnchor`.

use profiler_common::cfi::CfiCache;
use profiler_common::{FrameKind, HotspotProc, UnwindEnd, UserFrame, MAX_USER_FRAMES};

use crate::hotspot::{java_step, resume_at_anchor, BlobCache};
use crate::memory::{FrameSink, JavaThreads, NativeTables, StackWindow, UserMemory};
use crate::native::native_step;

/// Marks [`Walk::end`] as "not decided yet".
pub const END_UNSET: u8 = u8::MAX;

/// Steps of a walk: frames recorded plus the few that are skipped (the call stub).
pub const MAX_WALK_STEPS: u32 = MAX_USER_FRAMES as u32 + 16;

/// The registers a user stack walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The interpreter keeps the live bcp in r13 (x86_64).
    pub r13: u64,
}

/// State of a user stack walk. The BPF program keeps it in a per-CPU map, so that its
/// `bpf_loop` callback reaches it (and the JVM's layout copied into it) with one lookup.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct Walk {
    /// The frame to unwind next: its pc, sp and fp.
    pub pc: u64,
    pub sp: u64,
    pub fp: u64,
    /// r13 at the sample (the interpreter's bcp, for the top frame).
    pub r13: u64,
    /// Frames recorded so far.
    pub frames: u32,
    /// The `UnwindEnd` once the walk has stopped, else [`END_UNSET`].
    pub end: u8,
    /// Non-zero when `hotspot` describes this process.
    pub is_jvm: u8,
    /// Non-zero when the current frame is not recorded (the call stub).
    pub skip: u8,
    /// Non-zero once a Java frame was walked, or the thread's anchor was used.
    pub java_seen: u8,
    /// Host tid of the sampled thread.
    pub tid: u32,
    /// The cookie of the last interpreted method of this walk, and its `ConstMethod*` (0 for
    /// none): recursion and loops repeat methods, and a cookie costs five dependent reads.
    pub cookie: u32,
    pub cookie_const_method: u64,
    /// The last code blob read during this walk.
    pub blob_cache: BlobCache,
    /// The last native unwind table lookup of this walk.
    pub cfi: CfiCache,
    pub hotspot: HotspotProc,
}

impl Walk {
    /// Prepares a walk of thread `tid` from `regs`; `hotspot` describes its process if it is a
    /// JVM.
    #[inline(always)]
    pub fn start(&mut self, tid: u32, regs: UserRegs, hotspot: Option<&HotspotProc>) {
        self.frames = 0;
        self.end = END_UNSET;
        self.skip = 0;
        self.java_seen = 0;
        self.tid = tid;
        self.blob_cache.blob = 0;
        self.cfi.clear();
        self.cookie_const_method = 0;
        self.pc = regs.ip;
        self.sp = regs.sp;
        self.fp = regs.fp;
        self.r13 = regs.r13;
        match hotspot {
            Some(hotspot) => {
                copy_layout(&mut self.hotspot, hotspot);
                self.is_jvm = 1;
            }
            None => self.is_jvm = 0,
        }
    }

    /// After the last step: a walk that never decided its end was cut at the step bound.
    #[inline(always)]
    pub fn finish(&mut self) {
        if self.end == END_UNSET {
            self.end = UnwindEnd::MaxDepth as u8;
        }
    }
}

/// One unwinding step: records the current frame, then moves to its caller. True to stop.
#[inline(always)]
pub fn unwind_step<P: UserMemory + JavaThreads + NativeTables, S: FrameSink>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
    sink: &mut S,
) -> bool {
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
        java_step(walk, window, process, top)
    } else {
        native_step(walk, window, process)
    };
    let frame = match step {
        Ok(frame) => frame,
        Err(end) => {
            walk.end = end as u8;
            return true;
        }
    };
    if walk.skip == 0 {
        if !sink.record(walk.frames, frame) {
            walk.end = UnwindEnd::MaxDepth as u8;
            return true;
        }
        walk.frames += 1;
        if walk.frames as usize >= MAX_USER_FRAMES {
            walk.end = UnwindEnd::MaxDepth as u8;
            return true;
        }
    }
    if walk.end != END_UNSET
        && walk.end != UnwindEnd::MaxDepth as u8
        && resume_at_anchor(walk, process)
    {
        walk.end = END_UNSET;
    }
    if walk.end != END_UNSET {
        return true;
    }
    false
}

/// A whole walk, for host use: the BPF program runs the same steps from a `bpf_loop`
/// callback instead (a plain loop this long would not pass the verifier).
pub fn walk_stack<P: UserMemory + JavaThreads + NativeTables, S: FrameSink>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
    sink: &mut S,
) {
    for _ in 0..MAX_WALK_STEPS {
        if unwind_step(walk, window, process, sink) {
            break;
        }
    }
    walk.finish();
}

#[inline(always)]
pub(crate) fn frame(kind: FrameKind, addr: u64, aux: u32, cookie: u32) -> UserFrame {
    UserFrame::new(kind, addr, aux, cookie)
}

/// Copies a JVM's layout word by word. A plain struct copy becomes, in the BPF program, a call
/// to a byte-at-a-time `memmove`: about 1,900 instructions for its 232 bytes, 0.4 us of every
/// Java sample. Volatile accesses keep the compiler from turning this loop back into one.
#[inline(always)]
fn copy_layout(dst: &mut HotspotProc, src: &HotspotProc) {
    const WORDS: usize = core::mem::size_of::<HotspotProc>() / 8;
    const _: () = assert!(
        core::mem::size_of::<HotspotProc>().is_multiple_of(8)
            && core::mem::align_of::<HotspotProc>() == 8
    );
    let dst = dst as *mut HotspotProc as *mut u64;
    let src = src as *const HotspotProc as *const u64;
    for word in 0..WORDS {
        // SAFETY: both point to a whole HotspotProc, 8-aligned, `WORDS` words long.
        unsafe { dst.add(word).write_volatile(src.add(word).read_volatile()) };
    }
}
