//! Native frames: the frame-pointer chain ([fp] is the caller's fp, [fp + 8] the return address).

use profiler_common::{FrameKind, UnwindEnd, UserFrame};

use crate::memory::{StackWindow, UserMemory};
use crate::walk::{frame, Walk};

/// A frame-pointer step: [fp] is the caller's saved fp, [fp + 8] the return address.
#[inline(always)]
pub(crate) fn native_step<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<UserFrame, UnwindEnd> {
    let recorded = frame(FrameKind::Native, walk.pc, 0, 0);
    if walk.fp == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return Ok(recorded);
    }
    let Ok(slot) = window.pair(memory, walk.fp) else {
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
