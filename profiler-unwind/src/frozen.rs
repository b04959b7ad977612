//! The frames of a mounted virtual thread that are still frozen in its stack chunks (JDK 21+).
//!
//! When a virtual thread is mounted, HotSpot copies (thaws) only its newest frames back onto
//! the carrier's stack; the oldest thawed frame returns into the return-barrier stub, and the
//! frames below it stay in `jdk.internal.vm.StackChunk` objects on the Java heap until they
//! are returned into. A walk that reaches the barrier therefore continues in the chunks: the
//! continuation mounted on the thread (`JavaThread::_cont_entry`), its newest chunk
//! (`Continuation.tail`), each chunk's frames from its `sp` to its `bottom`, then the older
//! chunks by `parent`, and finally back on the carrier at the continuation's entry frame
//! (`enterSpecial`), as if nothing had been frozen. Every chunk must belong to the mounted
//! continuation (its `cont` field), so a frame of another virtual thread is never named.
//!
//! In a chunk, compiled frames keep their thread-stack layout (a fixed size from their code
//! blob), while interpreted frames hold their links relative to their own addresses. While the
//! walk is in a chunk, `Walk::fp` holds the current frame's frame pointer if it is interpreted,
//! its unextended sp if it is compiled (its saved-rbp slot may hold an oop there). The layout
//! facts are in docs/virtual-threads.md (sections 1.3, 2.3, 2.4 and 3).

use profiler_common::{hotspot_flags, FrozenFramesLayout, HotspotProc, UnwindEnd};

use crate::memory::{read_u64, JavaThreads, StackWindow, UserMemory};
use crate::state::{ChunkHeader, Walk};

/// `ContinuationEntry::_cont` (an uncompressed oop: the entry lives on the thread's stack).
pub(crate) const ENTRY_CONT: u64 = 16;
/// `ContinuationEntry::size()`: enterSpecial's frame pointer is the entry plus this.
const ENTRY_SIZE: u64 = 64;
/// How far below the entry the barrier's frame may end: the bottom frame's stack arguments
/// and an alignment word lie between them.
const MAX_ENTRY_GAP: u64 = 256;
/// An interpreter frame's locals slot, in bytes below fp (x86_64, JDK 21+): in a chunk it holds
/// them relative to fp, as the caller's sp slot (read by the interpreted step) does.
const LOCALS_SLOT: u64 = 7 * 8;
/// Chunks one walk enters at most: a continuation gains one each time a freeze cannot reuse its
/// tail (the old one needs GC barriers), so long chains are rare.
const MAX_CHUNKS: u32 = 16;
/// Largest chunk stack accepted, in words (a bound against garbage, far above real stacks).
const MAX_CHUNK_WORDS: i32 = 1 << 20;

/// Moves the walk into frozen frames if it is due to: at the return barrier (the frame below it
/// is frozen; a barrier sampled on top is a thaw in progress, walked as a stub), into the newest
/// chunk of the thread's mounted continuation; after a chunk, into its parent. Ok if it did, or
/// was not due, or the parent holds nothing of the mounted continuation (the walk is then at
/// the carrier); an error if the barrier's chunks cannot be read or are not the mounted
/// continuation's.
#[inline(always)]
pub(crate) fn enter_frozen_frames<P: UserMemory + JavaThreads>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
) -> Result<(), UnwindEnd> {
    let parent = walk.frozen.next;
    let chunk = if parent != 0 {
        walk.frozen.next = 0;
        parent
    } else if at_return_barrier(walk) {
        mounted_tail(walk, process).ok_or(UnwindEnd::FrozenFramesUnread)?
    } else {
        return Ok(());
    };
    if enter_chunk(walk, window, process, chunk) || parent != 0 {
        Ok(())
    } else {
        Err(UnwindEnd::FrozenFramesUnread)
    }
}

#[inline(always)]
fn at_return_barrier(walk: &Walk) -> bool {
    let barrier = walk.hotspot.frozen.return_barrier;
    walk.is_jvm != 0 && barrier != 0 && walk.pc == barrier && walk.frames != 0
}

/// The newest chunk of the continuation mounted on the walk's thread, whose entry must be just
/// above the barrier's frame (everything strictly below an entry belongs to its continuation).
#[inline(always)]
fn mounted_tail<P: UserMemory + JavaThreads>(walk: &mut Walk, process: &P) -> Option<u64> {
    let thread = process.java_thread(walk.tid)?;
    let cont_entry = walk.hotspot.frozen.java_thread_cont_entry as u64;
    let entry = read_u64(process, thread + cont_entry).ok()?;
    if entry == 0 || walk.sp > entry || entry - walk.sp > MAX_ENTRY_GAP {
        return None;
    }
    let cont = read_u64(process, entry + ENTRY_CONT).ok()?;
    if cont == 0 {
        return None;
    }
    let tail_field = cont + walk.hotspot.frozen.continuation_tail as u64;
    let tail = read_oop(&walk.hotspot, process, tail_field)?;
    walk.frozen.cont = cont;
    walk.frozen.entry = entry;
    Some(tail)
}

/// Before the step of a frozen frame: a compiled frame is stepped from its unextended sp; an
/// interpreted one's fp and locals are kept (the step reads them as a stack frame's, and its
/// locals tell the chunk's last frame).
#[inline(always)]
pub(crate) fn frozen_before<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<(), UnwindEnd> {
    if is_interpreted(&walk.hotspot, walk.pc) {
        let fp = walk.fp;
        walk.frozen.locals = window.u64(memory, fp.wrapping_sub(LOCALS_SLOT))?;
        walk.frozen.fp = fp;
        walk.frozen.interpreted = 1;
        return Ok(());
    }
    walk.frozen.interpreted = 0;
    walk.sp = walk.fp;
    Ok(())
}

/// After the step of a frozen frame (which recorded it and read its caller's links as a stack
/// frame's): the caller in this chunk, its links made absolute; or, after the chunk's last
/// frame, the next chunk's first or the carrier.
#[inline(always)]
pub(crate) fn frozen_after<M: UserMemory>(walk: &mut Walk, window: &mut StackWindow, memory: &M) {
    let end = walk.frozen.end;
    if walk.frozen.interpreted != 0 {
        let fp = walk.frozen.fp;
        // The step read the sender sp slot, relative to fp here.
        let caller_usp = relative(fp, walk.sp);
        // The bottom frame's locals (its arguments) reach the chunk's bottom.
        if relative(fp, walk.frozen.locals).wrapping_add(8) >= end {
            leave_chunk(walk, window, memory);
        } else {
            move_to(walk, window, memory, fp + 16, caller_usp);
        }
        return;
    }
    if walk.blob_cache.frame_size <= 0 {
        // A blob without a fixed frame (its rbp links are not kept in a chunk).
        walk.end = UnwindEnd::BadJavaFrame as u8;
        return;
    }
    let caller_sp = walk.sp;
    if caller_sp.wrapping_add(16) >= end {
        leave_chunk(walk, window, memory);
    } else {
        move_to(walk, window, memory, caller_sp, caller_sp);
    }
}

/// Moves the walk to the frame at `sp` in the chunk (its return address just below), whose
/// unextended sp is `usp` if it is compiled.
#[inline(always)]
fn move_to<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    sp: u64,
    usp: u64,
) {
    let pc = walk.pc;
    walk.sp = sp;
    walk.fp = if is_interpreted(&walk.hotspot, pc) {
        match interpreted_fp(window, memory, sp) {
            Ok(fp) => fp,
            Err(end) => {
                walk.end = end as u8;
                return;
            }
        }
    } else {
        usp
    };
}

/// After a chunk's last frame: the continuation's entry frame on the carrier (the walk then
/// goes on as if nothing had been frozen), or its caller if the entry frame's code is not known;
/// the next step first enters the chunk's parent, if it has one.
#[inline(always)]
fn leave_chunk<M: UserMemory>(walk: &mut Walk, window: &mut StackWindow, memory: &M) {
    walk.frozen.next = walk.frozen.parent;
    walk.frozen.chunk = 0;
    let entry = walk.frozen.entry;
    let entry_pc = walk.hotspot.frozen.entry_return_pc;
    if entry_pc != 0 {
        walk.pc = entry_pc;
        walk.sp = entry;
        walk.fp = entry + ENTRY_SIZE;
        return;
    }
    // Where enterSpecial is not known yet (JDK 21 makes it on first use): at its caller, from
    // the saved rbp and return address above the entry.
    match window.pair(memory, entry + ENTRY_SIZE) {
        Ok([fp, pc]) => {
            walk.fp = fp;
            walk.pc = pc;
            walk.sp = entry + ENTRY_SIZE + 16;
        }
        Err(end) => walk.end = end as u8,
    }
}

/// Moves the walk to the newest frame of `chunk`, or of its parent when it is empty (a
/// continuation keeps an emptied tail for its next freeze). False, the walk unchanged but for
/// the chunk count, when neither holds frames of the mounted continuation.
#[inline(always)]
fn enter_chunk<M: UserMemory>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
    chunk: u64,
) -> bool {
    let mut chunk = chunk;
    for _ in 0..2 {
        if chunk == 0 || walk.frozen.chunks >= MAX_CHUNKS {
            return false;
        }
        walk.frozen.chunks += 1;
        if !read_chunk(&walk.hotspot, memory, chunk, &mut walk.frozen.header) {
            return false;
        }
        let header = &walk.frozen.header;
        if header.cont != walk.frozen.cont
            || header.sp < 0
            || header.sp > header.bottom
            || header.bottom > header.size
            || header.size > MAX_CHUNK_WORDS
        {
            return false;
        }
        if header.sp == header.bottom {
            chunk = header.parent;
            continue;
        }
        let start = chunk + walk.hotspot.frozen.chunk_stack as u64;
        let sp = start + header.sp as u64 * 8;
        let pc = header.pc;
        // The top frame's pc is kept twice: in the chunk, and as the return address just
        // below its frame. A chunk being rewritten has them differ.
        match window.u64(memory, sp - 8) {
            Ok(below) if below == pc && pc != 0 => {}
            _ => return false,
        }
        let fp = if is_interpreted(&walk.hotspot, pc) {
            match interpreted_fp(window, memory, sp) {
                Ok(fp) => fp,
                Err(_) => return false,
            }
        } else {
            sp
        };
        let header = &walk.frozen.header;
        walk.frozen.end = start + header.bottom as u64 * 8;
        walk.frozen.parent = header.parent;
        walk.frozen.chunk = chunk;
        walk.pc = pc;
        walk.sp = sp;
        walk.fp = fp;
        return true;
    }
    false
}

/// The frame pointer of the interpreted frame at `sp` in a chunk: its callee's saved-rbp slot,
/// just below `sp` next to the return address, holds it relative to the slot itself.
#[inline(always)]
fn interpreted_fp<M: UserMemory>(
    window: &mut StackWindow,
    memory: &M,
    sp: u64,
) -> Result<u64, UnwindEnd> {
    let slot = sp - 16;
    let offset = window.u64(memory, slot)?;
    Ok(relative(slot, offset))
}

/// `base` plus `words` (a signed word count, as a chunk's relative links are).
#[inline(always)]
fn relative(base: u64, words: u64) -> u64 {
    base.wrapping_add((words as i64).wrapping_mul(8) as u64)
}

#[inline(always)]
fn is_interpreted(hs: &HotspotProc, pc: u64) -> bool {
    pc >= hs.interpreter_low && pc < hs.interpreter_high
}

/// The chunk fields the walk needs, into `out`. False if one cannot be read. Field by field:
/// one read of the chunk's start into the scratch buffer took its closure's captures onto the
/// BPF program's stack, 48 bytes it does not have.
#[inline(always)]
fn read_chunk<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    chunk: u64,
    out: &mut ChunkHeader,
) -> bool {
    let layout: &FrozenFramesLayout = &hs.frozen;
    let int = |at: u16| memory.read_u32(chunk + at as u64).map(|v| v as i32);
    let (Ok(size), Ok(sp), Ok(bottom), Ok(pc)) = (
        int(layout.chunk_size),
        int(layout.chunk_sp),
        int(layout.chunk_bottom),
        memory.read_u64(chunk + layout.chunk_pc as u64),
    ) else {
        return false;
    };
    let (Some(parent), Some(cont)) = (
        read_oop(hs, memory, chunk + layout.chunk_parent as u64),
        read_oop(hs, memory, chunk + layout.chunk_cont as u64),
    ) else {
        return false;
    };
    out.size = size;
    out.sp = sp;
    out.bottom = bottom;
    out.pc = pc;
    out.parent = parent;
    out.cont = cont;
    true
}

/// The reference held at `at` (a field of a heap object).
#[inline(always)]
fn read_oop<M: UserMemory>(hs: &HotspotProc, memory: &M, at: u64) -> Option<u64> {
    if hs.flags & hotspot_flags::COMPRESSED_OOPS != 0 {
        Some(decode(&hs.frozen, memory.read_u32(at).ok()?))
    } else {
        Some(wide(hs, memory.read_u64(at).ok()?))
    }
}

/// An uncompressed reference's address: itself, or a ZGC coloured pointer's address.
#[inline(always)]
pub(crate) fn wide(hs: &HotspotProc, reference: u64) -> u64 {
    if hs.flags & hotspot_flags::ZGC_COLORED_OOPS == 0 {
        return reference;
    }
    // The remapped bit set in the colour (one of bits 12 to 15) says how far the address is
    // shifted: 13 to 16. Its index, without branches (the bit is one of 1, 2, 4, 8): (n >> 1)
    // - (n >> 3) is 0, 1, 2, 3. Any other colour gives an address the chunk checks refuse.
    let remapped = (reference >> 12) & 0xf;
    let shift = 13 + (remapped >> 1) - (remapped >> 3);
    reference >> shift
}

/// A compressed reference's address (0 stays null).
#[inline(always)]
fn decode(layout: &FrozenFramesLayout, narrow: u32) -> u64 {
    if narrow == 0 {
        return 0;
    }
    layout
        .narrow_oop_base
        .wrapping_add((narrow as u64) << (layout.narrow_oop_shift & 31))
}
