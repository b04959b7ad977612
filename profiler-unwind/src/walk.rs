//! One step of a walk: record the current frame, move to its caller, and when the native frames
//! of a JVM thread lead nowhere, resume at its `JavaFrameAnchor`; and a whole walk for the host.

use profiler_common::{UnwindEnd, MAX_USER_FRAMES};

use crate::frozen::{enter_frozen_frames, frozen_after, frozen_before};
use crate::hotspot::{
    java_step, jump_to_anchor, resume_at_anchor, simple_compiled_frames, unwind_stub_caller,
    unwind_top_stub,
};
use crate::memory::{FrameSink, JavaThreads, NativeTables, StackWindow, UserMemory};
use crate::native::native_step;
use crate::recent_blobs::RecentBlobs;
use crate::state::{Walk, END_UNSET, STUB_ON_TOP};

/// Steps of a walk: frames recorded plus the few that are skipped (the call stub).
pub const MAX_WALK_STEPS: u32 = MAX_USER_FRAMES as u32 + 16;

/// Compiled frames [`simple_frames`] takes at most: in the BPF program, each step is a call of
/// a global function, whose lookups and checks cost more than such a frame itself.
const SIMPLE_FRAMES_PER_STEP: u32 = 8;

/// One unwinding step: records the current frame, then moves to its caller. True to stop.
#[inline(always)]
pub fn unwind_step<P: UserMemory + JavaThreads + NativeTables + RecentBlobs, S: FrameSink>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
    sink: &mut S,
) -> bool {
    if walk.stub_pending != 0 {
        // The top frame's caller is found first ([`settle_top_stub`]).
        return false;
    }
    if walk.pc == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return true;
    }
    let top = walk.frames == 0;
    walk.skip = 0;
    // A mounted virtual thread's frames frozen in its stack chunks go through the same steps as
    // those on a stack, their links made absolute before and after (`crate::frozen`): one copy of the
    // steps keeps the BPF program within what 5.10's verifier explores in time.
    if walk.frozen.chunk == 0 {
        if let Err(end) = enter_frozen_frames(walk, window, process) {
            walk.end = end as u8;
            return true;
        }
    }
    // In a chunk now (`walk.frozen.chunk`, which the step leaves alone) if the frame is frozen.
    if walk.frozen.chunk != 0 {
        if let Err(end) = frozen_before(walk, window, process) {
            walk.end = end as u8;
            return true;
        }
    }
    let in_code_cache =
        walk.is_jvm != 0 && walk.pc >= walk.hotspot.code_low && walk.pc < walk.hotspot.code_high;
    if in_code_cache {
        walk.java_seen = 1;
    }
    let step = if in_code_cache {
        java_step(walk, window, process, top)
    } else if walk.frozen.chunk != 0 {
        Err(UnwindEnd::BadJavaFrame)
    } else {
        native_step(walk, window, process)
    };
    // Only the frame right after a stub is its caller.
    walk.stub_caller = 0;
    let frame = match step {
        Ok(frame) => frame,
        Err(end) => {
            walk.end = end as u8;
            return true;
        }
    };
    if walk.frozen.chunk != 0 && walk.end == END_UNSET {
        frozen_after(walk, window, process);
    }
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

/// After a step, the frames that need no more than the common case of a compiled frame, in one
/// go (see `simple_compiled_frames`). True to stop. A step of its own, not the end of
/// [`unwind_step`]: in the BPF program it is a global function of its own, whose loop the
/// verifier checks once and whose stack does not add to `unwind_step`'s (inlined there, the
/// loop took the allocation hook's program past the 512 bytes of stack, and 5.10's and 6.1's
/// off-CPU program too, and its verification from 0.08 to 0.55 million instructions).
#[inline(always)]
pub fn simple_frames<P: UserMemory + RecentBlobs, S: FrameSink>(
    walk: &mut Walk,
    window: &StackWindow,
    process: &P,
    sink: &mut S,
) -> bool {
    if walk.end != END_UNSET {
        return true;
    }
    simple_compiled_frames(walk, window, process, sink, SIMPLE_FRAMES_PER_STEP)
}

/// Moves the walk from a stub recorded on top, or from that stub's caller, to the next caller,
/// if a step left that to do (`Walk::stub_pending`); to be run before each step. True to stop
/// (the caller was not found).
#[inline(always)]
pub fn settle_top_stub<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> bool {
    let pending = walk.stub_pending;
    if pending == 0 {
        return false;
    }
    walk.stub_pending = 0;
    let moved = if pending == STUB_ON_TOP {
        unwind_top_stub(walk, window, memory)
    } else {
        unwind_stub_caller(walk, window, memory)
    };
    if let Err(end) = moved {
        walk.end = end as u8;
        return true;
    }
    false
}

/// Starts a walk prepared by [`Walk::start`] at the last Java frame of `thread` (the current
/// thread's `JavaThread*`, as a hook in the JVM was handed it) instead of at the registers, when
/// the thread is in the VM or native code: the VM's frames above that Java frame are then not
/// walked. `frames` frames count as recorded already (the caller puts them first), so the walk's
/// first frame is read as a caller's (its pc a return address), not as an interrupted one's.
/// False, and the walk unchanged but for `frames`, when the thread's anchor is not usable.
#[inline(always)]
pub fn start_at_anchor<M: UserMemory>(
    walk: &mut Walk,
    process: &M,
    thread: u64,
    frames: u32,
) -> bool {
    walk.frames = frames;
    if walk.is_jvm == 0 || thread == 0 {
        return false;
    }
    let moved = jump_to_anchor(walk, process, thread);
    if moved {
        walk.java_seen = 1;
    }
    moved
}

/// A whole walk, for host use: the BPF program runs the same steps from a `bpf_loop`
/// callback instead (a plain loop this long would not pass the verifier).
pub fn walk_stack<P: UserMemory + JavaThreads + NativeTables + RecentBlobs, S: FrameSink>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
    sink: &mut S,
) {
    for _ in 0..MAX_WALK_STEPS {
        if settle_top_stub(walk, window, process)
            || unwind_step(walk, window, process, sink)
            || simple_frames(walk, window, process, sink)
        {
            break;
        }
    }
    walk.finish();
}
