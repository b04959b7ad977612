//! Native frames: by the file's unwind table where one covers the pc (`.eh_frame` reduced by the
//! daemon, see `profiler_common::cfi`), else by the frame-pointer chain (`[fp]` is the caller's
//! fp, [fp + 8] the return address).

use profiler_common::cfi::{CfaKind, CfiRow, RBP_UNCHANGED};
use profiler_common::{FrameKind, UnwindEnd, UserFrame};

use crate::memory::{NativeTables, StackWindow, UserMemory};
use crate::state::{frame, Walk};

/// One native frame: its table's rule if it has one, else frame pointers.
#[inline(always)]
pub(crate) fn native_step<M: UserMemory + NativeTables>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<UserFrame, UnwindEnd> {
    let recorded = frame(FrameKind::Native, walk.pc, 0, 0);
    // A caller's pc is a return address, just past its call: the call's own row is the one
    // before it (the return address may be the first byte of the next function).
    let lookup = if walk.frames == 0 {
        walk.pc
    } else {
        walk.pc.wrapping_sub(1)
    };
    if let Some(row) = memory.cfi_row(lookup, &mut walk.cfi) {
        match row.kind() {
            Some(CfaKind::Rsp | CfaKind::Rbp | CfaKind::Plt | CfaKind::Rsp16) => {
                cfi_step(walk, window, memory, row);
                return Ok(recorded);
            }
            Some(CfaKind::Outermost) => {
                walk.end = UnwindEnd::Complete as u8;
                return Ok(recorded);
            }
            // No rule here, or one the table cannot express: frame pointers may still work.
            _ => {}
        }
    }
    frame_pointer_step(walk, window, memory);
    Ok(recorded)
}

/// A step by an unwind table row: the CFA from rsp or rbp, the return address just below it,
/// the caller's rbp from its slot.
#[inline(always)]
fn cfi_step<M: UserMemory>(walk: &mut Walk, window: &mut StackWindow, memory: &M, row: CfiRow) {
    let offset = row.cfa_offset as u64;
    let cfa = match row.kind() {
        Some(CfaKind::Rbp) => walk.fp.wrapping_add(offset),
        Some(CfaKind::Rsp16) => walk.sp.wrapping_add(offset * 16),
        Some(CfaKind::Plt) => {
            // The entry's `push` has run once the pc is at or past the threshold.
            let pushed = if walk.pc & 15 >= offset { 8 } else { 0 };
            walk.sp.wrapping_add(8 + pushed)
        }
        _ => walk.sp.wrapping_add(offset),
    };
    // The caller's frame is above this one: a CFA at or below sp is a wrong rule or a wrong sp.
    if cfa <= walk.sp || cfa < 8 {
        walk.end = UnwindEnd::NotMonotonic as u8;
        return;
    }
    let Ok(return_address) = window.u64(memory, cfa - 8) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return;
    };
    let fp = if row.rbp_slot == RBP_UNCHANGED {
        walk.fp
    } else {
        let slot = cfa.wrapping_add((row.rbp_slot as i64 * 8) as u64);
        match window.u64(memory, slot) {
            Ok(fp) => fp,
            Err(_) => {
                walk.end = UnwindEnd::ReadFailed as u8;
                return;
            }
        }
    };
    if return_address == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return;
    }
    walk.sp = cfa;
    walk.pc = return_address;
    walk.fp = fp;
}

/// A frame-pointer step: `[fp]` is the caller's saved fp, `[fp + 8]` the return address.
#[inline(always)]
fn frame_pointer_step<M: UserMemory>(walk: &mut Walk, window: &mut StackWindow, memory: &M) {
    if walk.fp == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return;
    }
    let Ok(slot) = window.pair(memory, walk.fp) else {
        walk.end = UnwindEnd::ReadFailed as u8;
        return;
    };
    let (saved_fp, return_address) = (slot[0], slot[1]);
    if return_address == 0 {
        walk.end = UnwindEnd::Complete as u8;
        return;
    }
    // In a JVM, a native frame's caller may be JIT code that does not keep rbp as a frame
    // pointer: the chain is then only checked once we are back in native code.
    let caller_in_java = walk.is_jvm != 0
        && return_address >= walk.hotspot.code_low
        && return_address < walk.hotspot.code_high;
    if !caller_in_java && saved_fp != 0 && saved_fp <= walk.fp {
        walk.end = UnwindEnd::NotMonotonic as u8;
        return;
    }
    walk.sp = walk.fp + 16;
    walk.pc = return_address;
    walk.fp = saved_fp;
}
