//! The state of a user stack walk, which every kind of step reads and moves: the registers it
//! starts from, the frame it is at, its caches, and the JVM layout it walks with. A leaf of the
//! crate: the steps (`native`, `hotspot`, `frozen`) and their driver (`walk`) depend on it, it
//! on none of them.

use profiler_common::cfi::CfiCache;

use profiler_common::{FrameKind, HotspotProc, UnwindEnd, UserFrame};

/// Marks [`Walk::end`] as "not decided yet".
pub const END_UNSET: u8 = u8::MAX;
/// [`Walk::stub_pending`]'s values.
pub const STUB_ON_TOP: u8 = 1;
pub const STUB_CALLER: u8 = 2;

/// The registers a user stack walk starts from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub fp: u64,
    /// The interpreter keeps the live bcp in r13 (x86_64), and the caller's sp there on entry.
    pub r13: u64,
    /// The `Method*` on entry to the interpreter.
    pub rbx: u64,
    /// The registers the thread entered the kernel with, the sample taken there (in a system
    /// call, a fault, a breakpoint's trap), not those of user code interrupted.
    pub entered_kernel: bool,
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
    /// r13 and rbx at the sample (the interpreter's bcp, or on its entry the caller's sp and
    /// the `Method*`; for the top frame).
    pub r13: u64,
    pub rbx: u64,
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
    /// What the walk has to settle before its next step ([`crate::settle_top_stub`]):
    /// [`STUB_ON_TOP`], the top frame is a stub whose blob does not describe its frame (in
    /// `blob_cache`), recorded, its caller not found yet; [`STUB_CALLER`], that caller is a
    /// compiled frame, recorded (its blob in `blob_cache`), whose own caller is to be found (it
    /// may have pushed the stub's arguments). 0: nothing.
    pub stub_pending: u8,
    /// Non-zero while the current frame is the caller of a stub, found by the return address
    /// of its call into the stub.
    pub stub_caller: u8,
    /// Host tid of the sampled thread.
    pub tid: u32,
    /// The cookie of the last interpreted method of this walk, and its `ConstMethod*` (0 for
    /// none): recursion and loops repeat methods, and a cookie costs five dependent reads.
    pub cookie: u32,
    pub cookie_const_method: u64,
    /// The last code blob read during this walk.
    pub blob_cache: BlobCache,
    /// The JVM's count of code frees, read before this walk's first blob.
    pub code_frees: FreesSeen,
    /// The last native unwind table lookup of this walk.
    pub cfi: CfiCache,
    /// Where the walk is in a mounted virtual thread's frozen frames, if it is.
    pub frozen: FrozenWalk,
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
        self.stub_pending = 0;
        self.stub_caller = 0;
        self.tid = tid;
        self.blob_cache.blob = 0;
        self.code_frees.state = FreesSeen::UNREAD;
        self.cfi.clear();
        self.frozen.chunk = 0;
        self.frozen.next = 0;
        self.frozen.chunks = 0;
        self.cookie_const_method = 0;
        self.pc = regs.ip;
        if let Some(hotspot) = hotspot {
            if regs.entered_kernel && in_trap_of(hotspot, regs.ip) {
                // The probed instruction has not run: the walk starts at it, where the unwind
                // tables describe the frame as it is (one byte on, they would have it run).
                self.pc = regs.ip - 1;
            }
        }
        self.sp = regs.sp;
        self.fp = regs.fp;
        self.r13 = regs.r13;
        self.rbx = regs.rbx;
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

/// The sampled JVM's count of code frees as one walk read it: once, before the walk's first
/// blob is recalled or read, so that every proof and read of the walk comes after it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FreesSeen {
    pub count: u32,
    /// [`FreesSeen::UNREAD`], [`FreesSeen::COUNTED`] or [`FreesSeen::UNCOUNTED`].
    pub state: u32,
}

impl FreesSeen {
    pub const UNREAD: u32 = 0;
    pub const COUNTED: u32 = 1;
    pub const UNCOUNTED: u32 = 2;

    /// The count, read now (by `read`) if this walk has not yet.
    #[inline(always)]
    pub fn get(&mut self, read: impl FnOnce() -> Option<u32>) -> Option<u32> {
        if self.state == Self::UNREAD {
            match read() {
                Some(count) => {
                    self.count = count;
                    self.state = Self::COUNTED;
                }
                None => self.state = Self::UNCOUNTED,
            }
        }
        (self.state == Self::COUNTED).then_some(self.count)
    }
}

/// Where a walk is in the frozen frames of a mounted virtual thread.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct FrozenWalk {
    /// The chunk walked (its address), 0 while the walk is on a thread's stack.
    pub chunk: u64,
    /// Where its frames end (`bottom`).
    pub end: u64,
    /// Its parent chunk, walked next (0: none).
    pub parent: u64,
    /// A parent chunk to enter at the next step, the walk being at the carrier meanwhile (one
    /// place enters chunks: each inlined copy costs the BPF program stack it does not have).
    pub next: u64,
    /// The mounted continuation, which every chunk walked must belong to.
    pub cont: u64,
    /// The continuation's entry on the carrier's stack, where the walk returns after its
    /// chunks.
    pub entry: u64,
    /// Chunks entered in this walk.
    pub chunks: u32,
    /// Non-zero while the frame being stepped is interpreted: its fp and locals, kept from
    /// before its step (which reads their raw, relative values) for after it.
    pub interpreted: u32,
    pub fp: u64,
    pub locals: u64,
    /// The last chunk header read.
    pub header: ChunkHeader,
}

/// The fields of a chunk the walk reads. Kept in the walk's state, like everything of the
/// frozen-frame walk: the BPF program's stack (512 bytes with the callers') has no room for
/// them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ChunkHeader {
    pub size: i32,
    pub sp: i32,
    pub bottom: i32,
    pub _reserved: u32,
    pub pc: u64,
    pub parent: u64,
    pub cont: u64,
}

/// Whether `pc`, that of a thread that entered the kernel, is one byte past one of the daemon's
/// breakpoints in the process: the `int3` trapped, and the kernel had not yet set the pc back to
/// the probed instruction (it does before the probe's program runs).
#[inline(always)]
fn in_trap_of(hotspot: &HotspotProc, pc: u64) -> bool {
    let probed = pc.wrapping_sub(1);
    pc != 0
        && hotspot
            .breakpoints
            .iter()
            .any(|&at| at != 0 && at == probed)
}

/// What the unwinder needs of one code blob; also the walk's one-entry cache.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlobCache {
    pub blob: u64,
    pub code_begin: u64,
    /// End of the blob (`blob + _size`).
    pub end: u64,
    pub frame_size: i32,
    pub frame_complete: i32,
    pub compile_id: u32,
    pub orig_pc_offset: i32,
    /// Where a deoptimized frame returns to (0 if unknown).
    pub deopt_handler: u64,
}

impl BlobCache {
    pub const EMPTY: Self = Self {
        blob: 0,
        code_begin: 0,
        end: 0,
        frame_size: 0,
        frame_complete: 0,
        compile_id: 0,
        orig_pc_offset: 0,
        deopt_handler: 0,
    };
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
