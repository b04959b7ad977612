//! HotSpot frames, by the per-JVM layout the daemon pushed into `HOTSPOT_PROCS`: interpreted
//! frames (interpreter code range), compiled frames and stubs (code blobs found through their
//! heap's segment map, sized by `CodeBlob::_frame_size`), the call stub back into native code, and
//! threads in native or VM code resumed at their `JavaFrameAnchor`; and the class of an allocated
//! object, for allocation records. Every loop is bounded and every read checked; a frame that
//! does not make sense ends the walk with a reason.

use profiler_common::{
    class_name_cookie, hotspot_flags, interpreted_cookie, name_tail, name_tail_start, FrameKind,
    HotspotProc, JavaState, UnwindEnd, UserFrame, BCI_UNKNOWN, MAX_CODE_HEAPS, MAX_USER_FRAMES,
    NAME_TAIL_BYTES, NO_SYMBOL_HASH,
};

use crate::memory::{
    field_i16, field_i32, field_u64, read_u64, FrameSink, JavaThreads, StackWindow, UserMemory,
};
use crate::recent_blobs::{still_in_place, RecentBlobTable, RecentBlobs};
use crate::state::{frame, BlobCache, FreesSeen, Walk, END_UNSET, STUB_CALLER, STUB_ON_TOP};
use crate::x86_frames::{
    epilogue_state, prologue_state, FrameState, EPILOGUE_BEFORE, EPILOGUE_BYTES, PROLOGUE_BYTES,
};

/// Bound on segment-map hops to a blob's start (HotSpot blobs need at most a few; OTel uses 12).
const SEGMAP_HOPS: u32 = 16;
/// Largest compiled frame accepted, in words (SafepointBlob has a few hundred).
const MAX_FRAME_WORDS: i64 = 4096;
/// Slots searched above a compiled frame for a return address when words were pushed below it
/// (OTel's unwinder looks as far).
const MAX_EXTRA_WORDS: u64 = 6;
/// Bytes of a CodeBlob header read at once (every field we use lies below this).
const BLOB_HEADER_BYTES: usize = crate::memory::SCRATCH_BYTES;
/// Words above a stub's sp searched for its return address: the registers a frameless stub
/// saves with `push` (C1's `slow_subtype_check` saves four, and on JDK 24+ spills three more
/// into an aligned area below them).
const MAX_STUB_SAVED_WORDS: u64 = 12;
/// `call rel32`: how compiled code and the interpreter call a target in the code cache.
const CALL_REL32: u8 = 0xe8;

/// A JVM thread whose native frames led nowhere (code without frame pointers) before any Java
/// frame: if it is in native or VM code, its `JavaFrameAnchor` holds its last Java frame.
/// Returns true if the walk continues from there.
#[inline(always)]
pub(crate) fn resume_at_anchor<P: UserMemory + JavaThreads>(walk: &mut Walk, process: &P) -> bool {
    if walk.is_jvm == 0 || walk.java_seen != 0 {
        return false;
    }
    walk.java_seen = 1;
    let Some(thread) = process.java_thread(walk.tid) else {
        return false;
    };
    jump_to_anchor(walk, process, thread)
}

/// Moves the walk to the last Java frame of the Java thread `thread` (its `JavaThread*`) if
/// the thread is out of Java code, where its `JavaFrameAnchor` is valid. True if it moved.
#[inline(always)]
pub(crate) fn jump_to_anchor<M: UserMemory>(walk: &mut Walk, process: &M, thread: u64) -> bool {
    let hs = &walk.hotspot;
    // Out of Java code, the anchor is valid.
    if !matches!(
        java_state(hs, process, thread),
        JavaState::InNative | JavaState::InVm | JavaState::Blocked
    ) {
        return false;
    }
    let anchor = thread + hs.java_thread_anchor as u64;
    // The anchor's sp is written last: once it is set, pc and fp are valid.
    let Ok(sp) = read_u64(process, anchor + hs.anchor_sp as u64) else {
        return false;
    };
    if sp == 0 {
        return false;
    }
    let pc = match read_u64(process, anchor + hs.anchor_pc as u64) {
        Ok(0) | Err(_) => read_u64(process, sp - 8).unwrap_or(0),
        Ok(pc) => pc,
    };
    let fp = if hs.anchor_fp == u16::MAX {
        0
    } else {
        read_u64(process, anchor + hs.anchor_fp as u64).unwrap_or(0)
    };
    if pc == 0 {
        return false;
    }
    walk.pc = pc;
    walk.sp = sp;
    walk.fp = fp;
    true
}

/// What a Java thread (`thread`: its `JavaThread*`) is doing in the JVM, from its
/// `_thread_state` compared with the JVM's own state values (pushed with its layout).
#[inline(always)]
pub fn java_state<M: UserMemory>(hs: &HotspotProc, memory: &M, thread: u64) -> JavaState {
    match memory.read_u32(thread.wrapping_add(hs.java_thread_state as u64)) {
        Ok(state) if state == hs.thread_in_native as u32 => JavaState::InNative,
        Ok(state) if state == hs.thread_in_vm as u32 => JavaState::InVm,
        Ok(state) if state == hs.thread_blocked as u32 => JavaState::Blocked,
        Ok(_) => JavaState::InJava,
        Err(_) => JavaState::Unknown,
    }
}

/// What a Java thread leaving the CPU waits for: [`java_state`], with a blocked thread told
/// apart by the monitor it waits to enter or waits on, if any (the JVM keeps both in the thread
/// while it blocks; the serviceability agent's deadlock detection reads the same fields).
#[inline(always)]
pub fn waiting_state<M: UserMemory>(hs: &HotspotProc, memory: &M, thread: u64) -> JavaState {
    waiting_for(hs, memory, thread).0
}

/// [`waiting_state`], and the monitor a thread in [`JavaState::MonitorEnter`] waits to enter (0
/// otherwise): what tells the blocks of one wait from the next wait's.
#[inline(always)]
pub fn waiting_for<M: UserMemory>(hs: &HotspotProc, memory: &M, thread: u64) -> (JavaState, u64) {
    let state = java_state(hs, memory, thread);
    if state != JavaState::Blocked {
        return (state, 0);
    }
    monitor_state(hs, memory, thread)
}

/// What a thread that waits in the VM waits for, by its monitor fields alone: a monitor's entry
/// (and that monitor), `Object.wait`, or else [`JavaState::Blocked`] (a park, a sleep). Also
/// what a virtual thread unmounting waits for, whose thread state says nothing of it.
#[inline(always)]
pub fn monitor_state<M: UserMemory>(hs: &HotspotProc, memory: &M, thread: u64) -> (JavaState, u64) {
    let monitor_at = |offset: u16| {
        if offset == u16::MAX {
            return 0;
        }
        memory
            .read_u64(thread.wrapping_add(offset as u64))
            .unwrap_or(0)
    };
    let pending = monitor_at(hs.java_thread_pending_monitor);
    if pending != 0 {
        (JavaState::MonitorEnter, pending)
    } else if monitor_at(hs.java_thread_waiting_monitor) != 0 {
        (JavaState::MonitorWait, 0)
    } else {
        (JavaState::Blocked, 0)
    }
}

/// One HotSpot frame: interpreted (the interpreter's code range), the call stub (skipped), or a
/// code blob found through its heap's segment map (nmethods and stubs).
#[inline(always)]
pub(crate) fn java_step<M: UserMemory + RecentBlobs>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    top: bool,
) -> Result<UserFrame, UnwindEnd> {
    let hs = &walk.hotspot;
    let (pc, sp) = (walk.pc, walk.sp);
    if pc >= hs.interpreter_low && pc < hs.interpreter_high {
        return interpreted_step(walk, window, memory, top);
    }
    if pc == hs.call_stub_return {
        // The call stub is an rbp frame; its caller is native code (JavaCalls::call_helper).
        walk.skip = 1;
        follow_rbp(walk, window, memory)?;
        return Ok(frame(FrameKind::Native, pc, 0, 0));
    }
    // Deep stacks repeat blobs (recursion, loops over the same callees): the last blob found is
    // kept, and a pc inside it skips the segment map and header reads. Samples repeat them too:
    // earlier walks' blobs are tried next, each proven still in place first.
    let cached = &walk.blob_cache;
    if cached.blob == 0 || pc < cached.code_begin || pc >= cached.end {
        // Found in place in the walk's state: the BPF program's stack has no room for copies.
        if let Err(end) = recent_or_read_blob(
            &walk.hotspot,
            memory,
            pc,
            (&mut walk.blob_cache, &mut walk.code_frees),
        ) {
            walk.blob_cache.blob = 0;
            return Err(end);
        }
    }
    let blob = &walk.blob_cache;
    let (blob_address, code_begin, end, compile_id) =
        (blob.blob, blob.code_begin, blob.end, blob.compile_id);
    let (frame_size, frame_complete) = (blob.frame_size as i64, blob.frame_complete as i64);
    let (deopt_handler, orig_pc_offset) = (blob.deopt_handler, blob.orig_pc_offset);
    if code_begin == 0 || pc < code_begin || frame_size > MAX_FRAME_WORDS {
        return Err(UnwindEnd::BadJavaFrame);
    }
    // A frame being deoptimized returns into its nmethod's deopt handler; the pc it had (which
    // the debug info describes) was saved in the frame.
    let mut described_pc = pc;
    if !top && deopt_handler != 0 && pc == deopt_handler {
        if let Ok(original) = window.u64(memory, sp.wrapping_add(orig_pc_offset as i64 as u64)) {
            if original >= code_begin && original < end {
                described_pc = original;
            }
        }
    }
    let offset = described_pc - code_begin;
    let recorded = frame(FrameKind::Compiled, blob_address, offset as u32, compile_id);

    // The frame is known even when its caller cannot be found from it (a stub on top whose
    // rbp is a compiled caller's general register, a stack read that fails): it is recorded,
    // and the walk ends after it with the reason, rather than losing the sample's every frame.
    if top && !(frame_size > 0 && frame_complete >= 0) {
        // A stub whose blob does not say how far its frame is built at this pc (C1's runtime
        // stubs record no frame-complete offset; frameless stubs push registers): the walk's
        // driver moves to its caller before the next step (`unwind_top_stub`).
        walk.stub_pending = STUB_ON_TOP;
        return Ok(recorded);
    }
    if walk.stub_caller != 0 && frame_size > 0 && walk.frozen.chunk == 0 {
        // The caller of that stub: before the next step (`unwind_stub_caller`, its blob left
        // in `blob_cache`), for the same reason.
        walk.stub_pending = STUB_CALLER;
        return Ok(recorded);
    }
    let moved = if top && offset as i64 >= frame_complete {
        // The top frame may be in its epilogue, its frame partly or wholly popped already.
        let state = epilogue_state_at(memory, pc).unwrap_or(FrameState::Built);
        unwind_compiled(walk, window, memory, state, frame_size as u64)
    } else if frame_size > 0 && !top {
        unwind_compiled(walk, window, memory, FrameState::Built, frame_size as u64)
    } else if frame_size > 0 {
        // The top frame is still in its prologue (or its nmethod entry barrier): decode the
        // prologue from the verified entry point; a blob without one (a stub) falls back to
        // "rbp is pushed in the last instructions before frame_complete".
        let state = prologue_state_at(
            &walk.hotspot,
            memory,
            blob_address,
            code_begin,
            frame_complete as u64,
            pc,
        )
        .unwrap_or(if offset as i64 >= frame_complete - 4 {
            FrameState::RbpPushed
        } else {
            FrameState::NothingPushed
        });
        unwind_compiled(walk, window, memory, state, frame_size as u64)
    } else {
        // Stubs and adapters without a fixed frame keep rbp as a frame pointer.
        follow_rbp(walk, window, memory)
    };
    if let Err(end) = moved {
        walk.end = end as u8;
    }
    Ok(recorded)
}

/// Steps compiled frames below the top whose every part is the common case, at most
/// `max_frames` of them: the blob already held (the walk's last blob, or a remembered one
/// proven at the JVM's current count of code frees: no read), a fixed frame, and the caller's
/// saved rbp and return address (a code address) in the stack window. Most frames of a deep
/// Java stack are so; this loop skips what `java_step` checks for the rest (interpreted frames,
/// stubs, deoptimization, frozen frames, reads) and, in the BPF program, the call of a whole
/// step per frame (see `crate::walk::unwind_step`).
///
/// Each frame is recorded into `sink` and the walk moved to its caller as `java_step` would
/// have; it stops, the walk at the first frame that is not so, or with its end set when the
/// frames reach the record's bound. True if the walk ended.
#[inline(always)]
pub(crate) fn simple_compiled_frames<M: UserMemory + RecentBlobs, S: FrameSink>(
    walk: &mut Walk,
    window: &StackWindow,
    memory: &M,
    sink: &mut S,
    max_frames: u32,
) -> bool {
    let ordinary_walk = walk.is_jvm != 0
        && walk.frames != 0
        && walk.end == END_UNSET
        && walk.stub_pending == 0
        && walk.stub_caller == 0
        && walk.frozen.chunk == 0
        && walk.frozen.next == 0;
    if !ordinary_walk {
        return false;
    }
    // The table is had once for all the frames (in the BPF program, a per-CPU map lookup): a
    // stack of distinct methods recalls a blob at nearly every frame.
    memory
        .with_recent_blobs(|table| {
            simple_compiled_frames_with(walk, window, memory, table, sink, max_frames)
        })
        .unwrap_or(false)
}

/// [`simple_compiled_frames`] with the table of remembered blobs at hand.
#[inline(always)]
fn simple_compiled_frames_with<M: UserMemory + RecentBlobs, S: FrameSink>(
    walk: &mut Walk,
    window: &StackWindow,
    memory: &M,
    table: &mut RecentBlobTable,
    sink: &mut S,
    max_frames: u32,
) -> bool {
    // Copied once: the loop's own stores (the record, the blob cache) could alias them.
    let hs = &walk.hotspot;
    let code = (hs.code_low, hs.code_high);
    let interpreter = (hs.interpreter_low, hs.interpreter_high);
    let (call_stub_return, return_barrier, instance) =
        (hs.call_stub_return, hs.frozen.return_barrier, hs.instance);
    let (mut pc, mut sp, mut fp, mut frames) = (walk.pc, walk.sp, walk.fp, walk.frames);
    let mut ended = false;
    for _ in 0..max_frames {
        if !is_code(code, pc)
            || is_code(interpreter, pc)
            || pc == call_stub_return
            || pc == return_barrier
        {
            break;
        }
        let cached = &walk.blob_cache;
        if cached.blob == 0 || pc < cached.code_begin || pc >= cached.end {
            let Some(frees) = walk.code_frees.get(|| memory.code_frees(instance)) else {
                break;
            };
            if !table.recall_proven_into(instance, pc, frees, &mut walk.blob_cache) {
                break;
            }
        }
        let blob = &walk.blob_cache;
        let frame_size = blob.frame_size as i64;
        let at_deopt_handler = blob.deopt_handler != 0 && pc == blob.deopt_handler;
        if blob.code_begin == 0
            || frame_size <= 0
            || frame_size > MAX_FRAME_WORDS
            || at_deopt_handler
        {
            break;
        }
        let caller_sp = sp + frame_size as u64 * 8;
        let Some([saved_fp, return_address]) = window.pair_if_held(caller_sp - 16) else {
            break;
        };
        if !is_code(code, return_address) {
            break;
        }
        let recorded = frame(
            FrameKind::Compiled,
            blob.blob,
            (pc - blob.code_begin) as u32,
            blob.compile_id,
        );
        if !sink.record(frames, recorded) {
            ended = true;
            break;
        }
        frames += 1;
        (pc, sp, fp) = (return_address, caller_sp, saved_fp);
        if frames as usize >= MAX_USER_FRAMES {
            ended = true;
            break;
        }
    }
    if frames != walk.frames {
        walk.java_seen = 1;
    }
    (walk.pc, walk.sp, walk.fp, walk.frames) = (pc, sp, fp, frames);
    if ended {
        walk.end = UnwindEnd::MaxDepth as u8;
    }
    ended
}

/// Moves the walk from the stub recorded on top by `java_step` (its blob in `walk.blob_cache`)
/// to its caller: by the return address of the call into it if one is found, else as its blob
/// says (a fixed frame whole unless in its epilogue; a frameless stub's return address at sp;
/// rbp as a frame pointer).
///
/// Not part of the step that recorded the stub: the walk's driver runs it before the next
/// step. The BPF program does so at its callback's entry, where the verifier goes through the
/// search's loop once, not once for every path through a step: inside `java_step` the search
/// took the sampling program from 152,000 verified instructions to 397,000 (a second more to
/// load), at the callback's entry to 192,000.
#[inline(always)]
pub(crate) fn unwind_top_stub<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<(), UnwindEnd> {
    let blob = &walk.blob_cache;
    let (code_begin, end, frame_size) = (blob.code_begin, blob.end, blob.frame_size as i64);
    if unwind_called_stub(walk, window, memory, (code_begin, end)) {
        return Ok(());
    }
    if frame_size > 0 {
        let state = epilogue_state_at(memory, walk.pc).unwrap_or(FrameState::Built);
        return unwind_compiled(walk, window, memory, state, frame_size as u64);
    }
    let sp = walk.sp;
    let at_sp = window.u64(memory, sp).unwrap_or(0);
    if is_code((walk.hotspot.code_low, walk.hotspot.code_high), at_sp) {
        // A frameless stub: vtable and itable stubs jump on to their target and push nothing,
        // so the return address into their (compiled or interpreted) caller is at sp. A stub
        // that built an rbp frame has the saved rbp there instead, never a code address.
        walk.pc = at_sp;
        walk.sp = sp + 8;
        return Ok(());
    }
    // Other stubs and adapters without a fixed frame keep rbp as a frame pointer.
    follow_rbp(walk, window, memory)
}

/// Moves the walk from an rbp frame to its caller: the saved rbp and the return address at
/// rbp, the caller's sp above them.
#[inline(always)]
fn follow_rbp<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<(), UnwindEnd> {
    let fp = walk.fp;
    let slot = window.pair(memory, fp)?;
    walk.sp = fp + 16;
    walk.fp = slot[0];
    walk.pc = slot[1];
    Ok(())
}

/// Moves the walk from a stub sampled on top to its caller, found by its return address: the
/// one that follows a direct call into the stub's blob (`blob` is its code as (begin, end)).
/// Looked for at rbp (a stub that built an rbp frame, as C1's `counter_overflow` does), then
/// in the first words above sp (before its frame is built or after it is taken down, or a
/// stub that only pushes registers). False, the walk unchanged, when neither is found (a stub
/// entered by a jump, or called through a register).
#[inline(always)]
fn unwind_called_stub<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    blob: (u64, u64),
) -> bool {
    let (sp, fp) = (walk.sp, walk.fp);
    let code_range = (walk.hotspot.code_low, walk.hotspot.code_high);
    if fp > sp && fp - sp < MAX_FRAME_WORDS as u64 * 8 {
        if let Ok(slot) = window.pair(memory, fp) {
            if returns_from_call_into(memory, code_range, slot[1], blob) {
                walk.fp = slot[0];
                walk.pc = slot[1];
                walk.sp = fp + 16;
                walk.stub_caller = 1;
                return true;
            }
        }
    }
    for words in 0..MAX_STUB_SAVED_WORDS {
        let slot = sp + words * 8;
        // Read through the window: the words may run on into the next page.
        let Ok(value) = window.u64(memory, slot) else {
            return false;
        };
        if returns_from_call_into(memory, code_range, value, blob) {
            walk.pc = value;
            walk.sp = slot + 8;
            walk.stub_caller = 1;
            return true;
        }
    }
    false
}

/// Moves the walk from the compiled caller of a stub found by its return address (recorded by
/// `java_step`, its blob in `walk.blob_cache`) to its own caller. Such a
/// caller may have pushed the stub's arguments below its fixed frame (C1 code pushes
/// `slow_subtype_check`'s two), so the word its frame size points at can be one of its own
/// spill slots, and a spill slot can hold a code address: the return address is the first word
/// from there that a call into the frame's code precedes (or one into the interpreter or the
/// call stub, which push their return addresses). None found (code unreadable): the first
/// code address, as for any compiled frame.
#[inline(always)]
pub(crate) fn unwind_stub_caller<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<(), UnwindEnd> {
    let frame_words = walk.blob_cache.frame_size as u64;
    let fixed_top = walk.sp + frame_words * 8;
    for words in 0..=MAX_EXTRA_WORDS {
        let caller_sp = fixed_top + words * 8;
        let Ok(slot) = window.pair(memory, caller_sp - 16) else {
            break;
        };
        if is_return_address(&walk.hotspot, memory, slot[1]) {
            walk.fp = slot[0];
            walk.pc = slot[1];
            walk.sp = caller_sp;
            return Ok(());
        }
    }
    unwind_compiled(walk, window, memory, FrameState::Built, frame_words)
}

/// True if `address` is where Java code returns to: the interpreter or the call stub (they push
/// the return address and jump), or code just after a call instruction (`call rel32`, or
/// `call` through a register or memory: megamorphic and runtime calls).
#[inline(always)]
fn is_return_address<M: UserMemory>(hs: &HotspotProc, memory: &M, address: u64) -> bool {
    if (address >= hs.interpreter_low && address < hs.interpreter_high)
        || address == hs.call_stub_return
    {
        return true;
    }
    if !is_code((hs.code_low, hs.code_high), address) {
        return false;
    }
    let Ok(before) = memory.read_u64(address - 8) else {
        return false;
    };
    // Byte i of the eight before `address` (byte 7 the last).
    let byte = |i: u32| (before >> (8 * i)) as u8;
    // ModRM's reg field 2 (`call`), mod and rm as each form needs.
    let call_modrm = |modrm: u8, mode: u8| modrm >> 6 == mode && (modrm >> 3) & 7 == 2;
    byte(3) == CALL_REL32
        // call reg (ff /2, mod 11)
        || (byte(6) == 0xff && call_modrm(byte(7), 3))
        // call [reg] (mod 00, no SIB, not rip-relative)
        || (byte(6) == 0xff && call_modrm(byte(7), 0) && !matches!(byte(7) & 7, 4 | 5))
        // call [reg + disp8] (mod 01, no SIB)
        || (byte(5) == 0xff && call_modrm(byte(6), 1) && byte(6) & 7 != 4)
        // call [base + index + disp8] (mod 01 with a SIB byte)
        || (byte(4) == 0xff && byte(5) == 0x54)
        // call [rip + disp32] (mod 00, rm 101) or [reg + disp32] (mod 10, no SIB)
        || (byte(2) == 0xff && (byte(3) == 0x15 || (call_modrm(byte(3), 2) && byte(3) & 7 != 4)))
}

/// True if `return_address` is in the code cache and follows a `call rel32` whose target lies
/// in `blob` (begin, end): a return address into the caller of that blob's code, not a saved
/// register that happens to hold a code address.
#[inline(always)]
fn returns_from_call_into<M: UserMemory>(
    memory: &M,
    code_range: (u64, u64),
    return_address: u64,
    blob: (u64, u64),
) -> bool {
    if !is_code(code_range, return_address) {
        return false;
    }
    // The 8 bytes before it, little-endian: the call's opcode in the fourth, its displacement
    // in the last four.
    let Ok(before) = memory.read_u64(return_address - 8) else {
        return false;
    };
    if (before >> 24) as u8 != CALL_REL32 {
        return false;
    }
    let displacement = (before >> 32) as u32 as i32;
    let target = return_address.wrapping_add(displacement as i64 as u64);
    target >= blob.0 && target < blob.1
}

/// True for an address in the JVM's code cache (compiled code, stubs, the interpreter), given
/// as (low, high).
#[inline(always)]
fn is_code(range: (u64, u64), addr: u64) -> bool {
    addr >= range.0 && addr < range.1
}

/// Moves the walk from a compiled frame of `frame_size` words, as far built as `state` says,
/// to its caller.
#[inline(always)]
fn unwind_compiled<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    state: FrameState,
    frame_size: u64,
) -> Result<(), UnwindEnd> {
    let sp = walk.sp;
    match state {
        FrameState::NothingPushed => {
            walk.pc = window.u64(memory, sp)?;
            walk.sp = sp + 8;
        }
        FrameState::RbpPushed => {
            let slot = window.pair(memory, sp)?;
            walk.fp = slot[0];
            walk.pc = slot[1];
            walk.sp = sp + 16;
        }
        FrameState::BuiltRbpLive => {
            let caller_sp = sp + frame_size * 8;
            walk.pc = window.u64(memory, caller_sp - 8)?;
            walk.sp = caller_sp;
        }
        FrameState::Built => {
            // Fixed size, return address and saved rbp at its top.
            let mut caller_sp = sp + frame_size * 8;
            let mut slot = window.pair(memory, caller_sp - 16)?;
            let code_range = (walk.hotspot.code_low, walk.hotspot.code_high);
            if !is_code(code_range, slot[1]) {
                caller_sp += extra_pushed_words(window, code_range, caller_sp) * 8;
                slot = window.pair(memory, caller_sp - 16)?;
            }
            walk.fp = slot[0];
            walk.pc = slot[1];
            walk.sp = caller_sp;
        }
    }
    Ok(())
}

/// Words pushed below a compiled frame beyond its fixed size (intrinsics that spill a register
/// with `push`, method-handle call sites): the caller of a compiled method is always Java code
/// or the call stub, so the first of the next slots holding a code-cache address is taken as
/// the return address. 0 when none is found (the walk then ends on the bad address).
#[inline(always)]
fn extra_pushed_words(window: &mut StackWindow, code_range: (u64, u64), caller_sp: u64) -> u64 {
    for words in 1..=MAX_EXTRA_WORDS {
        match window.word_if_held(caller_sp + words * 8 - 8) {
            Some(value) if is_code(code_range, value) => return words,
            Some(_) => {}
            None => return 0,
        }
    }
    0
}

/// Whether the instruction at the top frame's `pc` belongs to an epilogue, and how much of the
/// frame it left. None: not an epilogue (or the code is unreadable): the frame is whole.
#[inline(always)]
fn epilogue_state_at<M: UserMemory>(memory: &M, pc: u64) -> Option<FrameState> {
    let code = memory
        .read_array::<EPILOGUE_BYTES>(pc - EPILOGUE_BEFORE as u64)
        .ok()?;
    epilogue_state(&code)
}

/// How far the top frame of an nmethod sampled before `frame_complete` has built its frame,
/// from the instructions at its verified entry point. None for blobs that are not nmethods
/// (their "entry point" does not decode as a prologue) or when the layout has no entry point.
#[inline(always)]
fn prologue_state_at<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    blob: u64,
    code_begin: u64,
    frame_complete: u64,
    pc: u64,
) -> Option<FrameState> {
    if hs.nmethod_verified_entry == u16::MAX {
        return None;
    }
    let field = blob + hs.nmethod_verified_entry as u64;
    let entry = if hs.flags & hotspot_flags::VERIFIED_ENTRY_OFFSET != 0 {
        code_begin + memory.read_u16(field).ok()? as u64
    } else {
        memory.read_u64(field).ok()?
    };
    if entry < code_begin || entry >= code_begin + frame_complete {
        return None;
    }
    let bytes = memory.read_array::<PROLOGUE_BYTES>(entry).ok()?;
    let state = prologue_state(&bytes, pc.saturating_sub(entry))?;
    if pc < entry {
        // The unverified entry (inline-cache check) before it pushes nothing.
        return Some(FrameState::NothingPushed);
    }
    Some(state)
}

/// The blob containing `pc`, into `out`: remembered by an earlier walk and still in place (no
/// code freed since it was proven, or proven now), or found and read now (and remembered).
#[inline(always)]
fn recent_or_read_blob<M: UserMemory + RecentBlobs>(
    hs: &HotspotProc,
    memory: &M,
    pc: u64,
    (out, seen): (&mut BlobCache, &mut FreesSeen),
) -> Result<(), UnwindEnd> {
    let instance = hs.instance;
    // Before any proof or read of this walk (see `recent_blobs`).
    let frees = seen.get(|| memory.code_frees(instance));
    let recalled = memory.with_recent_blobs(|table| {
        let Some(index) = table.recall_into(instance, pc, out) else {
            return false;
        };
        if table.proven_at(index, frees) {
            return true;
        }
        if !still_in_place(hs, memory, out, &mut table.span) {
            return false;
        }
        table.mark_proven(index, frees);
        true
    });
    if recalled == Some(true) {
        return Ok(());
    }
    read_blob(hs, memory, pc, out)?;
    memory.with_recent_blobs(|table| table.remember(instance, pc, out, frees));
    Ok(())
}

/// Finds the blob containing `pc` and reads its header into `out`.
#[inline(always)]
fn read_blob<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    pc: u64,
    out: &mut BlobCache,
) -> Result<(), UnwindEnd> {
    let blob = find_blob(hs, memory, pc)?;
    let fields = memory.with_scratch(|buffer| {
        if !memory.read_into(blob, buffer) {
            return None;
        }
        // SAFETY: the read filled every byte.
        let header = unsafe { &*(buffer as *const _ as *const [u8; BLOB_HEADER_BYTES]) };
        let code_begin = if hs.flags & hotspot_flags::CODE_OFFSET != 0 {
            blob.wrapping_add(field_i32(header, hs.blob_code as usize) as i64 as u64)
        } else {
            field_u64(header, hs.blob_code as usize)
        };
        let frame_complete = if hs.flags & hotspot_flags::FRAME_COMPLETE_16 != 0 {
            field_i16(header, hs.blob_frame_complete as usize) as i32
        } else {
            field_i32(header, hs.blob_frame_complete as usize)
        };
        let size = field_i32(header, hs.blob_size as usize);
        let frame_size = field_i32(header, hs.blob_frame_size as usize);
        Some((code_begin, frame_complete, size, frame_size))
    });
    let Some(Some((code_begin, frame_complete, size, frame_size))) = fields else {
        return Err(UnwindEnd::JavaReadFailed);
    };
    // A stub has no compile id, and userspace checks it.
    let compile_id = memory
        .read_u32(blob + hs.nmethod_compile_id as u64)
        .unwrap_or(0);
    // Meaningless for stubs, which never match them.
    let deopt_handler = if hs.flags & hotspot_flags::DEOPT_HANDLER_OFFSET != 0 {
        let offset = memory
            .read_u32(blob + hs.nmethod_deopt_handler as u64)
            .unwrap_or(0) as i32;
        if offset > 0 {
            blob + offset as u64
        } else {
            0
        }
    } else {
        memory
            .read_u64(blob + hs.nmethod_deopt_handler as u64)
            .unwrap_or(0)
    };
    let orig_pc_offset = memory
        .read_u32(blob + hs.nmethod_orig_pc_offset as u64)
        .unwrap_or(0) as i32;
    *out = BlobCache {
        blob,
        code_begin,
        end: blob.wrapping_add(size.max(0) as u64),
        frame_size,
        frame_complete,
        compile_id,
        orig_pc_offset,
        deopt_handler,
    };
    Ok(())
}

/// The cookie of an interpreted frame of `const_method` (see [`interpreted_cookie`]): its
/// class's name `Symbol` gives the hash word and the name's tail. A part that cannot be read
/// counts as zeros: the daemon's recomputation then differs and the frame shows as unknown.
#[inline(always)]
fn method_cookie<M: UserMemory>(hs: &HotspotProc, memory: &M, const_method: u64) -> u32 {
    let constants = read_u64(memory, const_method + hs.const_method_constants as u64).unwrap_or(0);
    method_cookie_of(hs, memory, const_method, constants)
}

/// [`method_cookie`] of a `ConstMethod` whose `ConstantPool*` (`constants`) was read already.
#[inline(always)]
fn method_cookie_of<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    const_method: u64,
    constants: u64,
) -> u32 {
    let name = read_u64(memory, constants + hs.constant_pool_holder as u64)
        .and_then(|holder| read_u64(memory, holder + hs.klass_name as u64))
        .unwrap_or(0);
    let name = symbol_identity(hs, memory, name);
    interpreted_cookie(const_method, name.hash_word, name.tail)
}

/// Bytes read at once from the start of a `ConstMethod`: its code size and `ConstantPool*`
/// both lie within them on JDK 8 to 27, so one read of the sampled process (a helper call and
/// likely a cache miss) is made where two were. More of the method's metadata follows, so a
/// read this long runs off a mapping only in rare cases; a failed one is made again as the two
/// short reads. (A `Symbol`'s header and name tail read the same way took 40 bytes more of
/// `unwind_steps`' BPF stack, and 96 of the allocation hook's, where the chain of stacks must
/// stay within 512 bytes: they are read apart.)
const CONST_METHOD_SPAN_BYTES: usize = 64;

/// A `ConstMethod`'s code size (bytes of bytecode) and `ConstantPool*`, in one read (into the
/// scratch buffer) when both lie in its first [`CONST_METHOD_SPAN_BYTES`]. The constant pool is
/// 0 if it cannot be read (the frame's cookie then shows it as unknown); a code size that
/// cannot be read ends the walk.
#[inline(always)]
fn const_method_fields<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    const_method: u64,
) -> Result<(u64, u64), UnwindEnd> {
    let (size_at, constants_at) = (
        hs.const_method_code_size as usize,
        hs.const_method_constants as usize,
    );
    if size_at + 2 <= CONST_METHOD_SPAN_BYTES && constants_at + 8 <= CONST_METHOD_SPAN_BYTES {
        let fields = memory.with_scratch(|buffer| {
            let dst = buffer.get_mut(..CONST_METHOD_SPAN_BYTES)?;
            if !memory.read_into(const_method, dst) {
                return None;
            }
            // SAFETY: the read filled the span's every byte.
            let span = unsafe { &*(buffer as *const _ as *const [u8; CONST_METHOD_SPAN_BYTES]) };
            Some((
                field_i16(span, size_at) as u16 as u64,
                field_u64(span, constants_at),
            ))
        });
        if let Some(Some(fields)) = fields {
            return Ok(fields);
        }
    }
    let code_size = memory
        .read_u16(const_method + size_at as u64)
        .map_err(|_| UnwindEnd::JavaReadFailed)? as u64;
    let constants = read_u64(memory, const_method + constants_at as u64).unwrap_or(0);
    Ok((code_size, constants))
}

/// What tells a `Symbol` from another made later at its address: its random hash word, its
/// length and its last bytes (zeros for what cannot be read).
#[derive(Clone, Copy, Default)]
struct SymbolIdentity {
    hash_word: u32,
    len: u16,
    tail: [u64; 2],
}

#[inline(always)]
fn symbol_identity<M: UserMemory>(hs: &HotspotProc, memory: &M, symbol: u64) -> SymbolIdentity {
    let mut identity = SymbolIdentity::default();
    if symbol == 0 {
        return identity;
    }
    // Read as one word and taken apart by shifts: indexing a stack array by a variable offset
    // can compile to pointer arithmetic the verifier refuses.
    if let Ok(header) = memory.read_u64(symbol) {
        if hs.symbol_hash_word != NO_SYMBOL_HASH {
            identity.hash_word = header_field(header, hs.symbol_hash_word, 4) as u32;
        }
        identity.len = header_field(header, hs.symbol_length, 2) as u16;
        let start = symbol + hs.symbol_body as u64 + name_tail_start(identity.len);
        if let Ok(bytes) = memory.read_array::<NAME_TAIL_BYTES>(start) {
            identity.tail = name_tail(bytes, identity.len);
        }
    }
    identity
}

/// The frame naming the class `klass` (a `Klass*`) of an allocated object: its name's `Symbol*`,
/// length and [`class_name_cookie`], read now, while the class surely exists (the allocating
/// thread holds an instance). A name that cannot be read gives a null `Symbol*`, which the
/// daemon shows as an unreadable class: the sample is kept.
#[inline(always)]
pub fn allocated_class_frame<M: UserMemory>(hs: &HotspotProc, memory: &M, klass: u64) -> UserFrame {
    let symbol = read_u64(memory, klass.wrapping_add(hs.klass_name as u64)).unwrap_or(0);
    let name = symbol_identity(hs, memory, symbol);
    frame(
        FrameKind::AllocatedClass,
        symbol,
        name.len as u32,
        class_name_cookie(symbol, name.hash_word, name.tail),
    )
}

/// Bytes at the start of a `Symbol` that hold its hash word and length (both below 8).
const SYMBOL_HEADER_BYTES: u64 = 8;

/// The little-endian field of `bytes` (2 or 4) bytes at `offset` in a `Symbol`'s first word; 0
/// if it does not fit in that word.
#[inline(always)]
fn header_field(header: u64, offset: u16, bytes: u64) -> u64 {
    let at = offset as u64 & (SYMBOL_HEADER_BYTES - 1);
    if at + bytes > SYMBOL_HEADER_BYTES {
        return 0;
    }
    (header >> (at * 8)) & ((1 << (bytes * 8)) - 1)
}

/// An interpreter frame: Method* and bcp from fixed slots below fp (the live bcp from r13 for
/// the interrupted frame); the caller's sp is the saved sender sp.
#[inline(always)]
pub(crate) fn interpreted_step<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    top: bool,
) -> Result<UserFrame, UnwindEnd> {
    let hs = &walk.hotspot;
    let (sp, fp) = (walk.sp, walk.fp);
    if fp < sp || fp - sp > 1 << 20 {
        if top {
            if let Some(entered) = interpreter_entry_step(walk, window, memory) {
                return Ok(entered);
            }
        }
        return Err(UnwindEnd::BadJavaFrame);
    }
    let method = window.u64(memory, slot_address(fp, hs.interpreter_method_slot))?;
    let const_method = read_u64(memory, method + hs.method_const_method as u64)?;
    let (code_size, constants) = const_method_fields(hs, memory, const_method)?;
    let code_start = const_method + hs.const_method_size as u64;
    let in_code = |bcp: u64| bcp >= code_start && bcp < code_start + code_size.max(1);
    let saved_bcp = window
        .u64(memory, slot_address(fp, hs.interpreter_bcp_slot))
        .unwrap_or(0);
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
    let cookie = if walk.cookie_const_method == const_method {
        walk.cookie
    } else {
        method_cookie_of(hs, memory, const_method, constants)
    };
    let recorded = frame(FrameKind::Interpreted, method, bci, cookie);
    walk.cookie = cookie;
    walk.cookie_const_method = const_method;

    // As for compiled frames: a frame whose caller cannot be read is still recorded.
    let (slot, sender_sp) = match (
        window.pair(memory, fp),
        window.u64(memory, fp.wrapping_sub(8)),
    ) {
        (Ok(slot), Ok(sender_sp)) => (slot, sender_sp),
        (Err(end), _) | (_, Err(end)) => {
            walk.end = end as u8;
            return Ok(recorded);
        }
    };
    walk.fp = slot[0];
    walk.pc = slot[1];
    walk.sp = sender_sp;
    Ok(recorded)
}

/// A top frame caught in the interpreter's entry to a method called from compiled code, before
/// the entry built its frame: rbp is still a general register of the compiled caller (so the
/// frame pointer makes no sense), the return address into the caller is at sp (before the entry
/// pops it, and again once it pushed it back), rbx holds the `Method*` and r13 the caller's sp
/// (HotSpot's x86_64 c2i adapter and interpreter entry). The method is recorded, its bci
/// unknown, and the walk goes on in the caller. None when the stack does not look so.
#[inline(always)]
fn interpreter_entry_step<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Option<UserFrame> {
    let hs = &walk.hotspot;
    let (sp, sender_sp, method) = (walk.sp, walk.r13, walk.rbx);
    let return_address = window.u64(memory, sp).ok()?;
    let into_interpreter =
        return_address >= hs.interpreter_low && return_address < hs.interpreter_high;
    if !is_code((hs.code_low, hs.code_high), return_address)
        || into_interpreter
        || sender_sp < sp
        || sender_sp - sp > 1 << 20
        || sender_sp & 7 != 0
    {
        return None;
    }
    let const_method = read_u64(memory, method.wrapping_add(hs.method_const_method as u64)).ok()?;
    let cookie = method_cookie(hs, memory, const_method);
    walk.pc = return_address;
    walk.sp = sender_sp;
    Some(frame(FrameKind::Interpreted, method, BCI_UNKNOWN, cookie))
}

#[inline(always)]
fn slot_address(fp: u64, slot: i8) -> u64 {
    fp.wrapping_add((slot as i64 * 8) as u64)
}

/// The CodeBlob containing `pc`, through its heap's segment map (HotSpot's
/// `CodeHeap::find_start`): each map byte says how many segments back the block starts.
#[inline(always)]
fn find_blob<M: UserMemory>(hs: &HotspotProc, memory: &M, pc: u64) -> Result<u64, UnwindEnd> {
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
        let hop = memory
            .read_u8(heap.segmap + index)
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
    let used = memory
        .read_u8(block + hs.heap_block_used as u64)
        .map_err(|_| UnwindEnd::JavaReadFailed)?;
    if used == 0 {
        return Err(UnwindEnd::NoCodeBlob);
    }
    Ok(block + hs.heap_block_size as u64)
}
