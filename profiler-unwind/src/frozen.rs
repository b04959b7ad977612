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

use profiler_common::{hotspot_flags, FrozenFramesLayout, HotspotProc, UnwindEnd, UserFrame};

use crate::hotspot::java_step;
use crate::memory::{field_i32, field_u64, read_u64, JavaThreads, StackWindow, UserMemory};
use crate::recent_blobs::RecentBlobs;
use crate::state::{Walk, END_UNSET};

/// `ContinuationEntry::_cont` (an uncompressed oop: the entry lives on the thread's stack).
const ENTRY_CONT: u64 = 16;
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
    /// The mounted continuation, which every chunk walked must belong to.
    pub cont: u64,
    /// The continuation's entry on the carrier's stack, where the walk returns after its
    /// chunks.
    pub entry: u64,
    /// Chunks entered in this walk.
    pub chunks: u32,
    pub _reserved: u32,
}

/// The fields of a chunk the walk reads.
struct ChunkHeader {
    size: i32,
    sp: i32,
    bottom: i32,
    pc: u64,
    parent: u64,
    cont: u64,
}

/// Whether the walk's next frame is the return barrier: the frame below it is frozen (a barrier
/// sampled on top is a thaw in progress, walked as a stub).
#[inline(always)]
pub(crate) fn at_return_barrier(walk: &Walk) -> bool {
    let barrier = walk.hotspot.frozen.return_barrier;
    barrier != 0 && walk.pc == barrier && walk.frames != 0
}

/// Moves the walk from the return barrier to the newest frame frozen in the thread's mounted
/// continuation. False, the walk unchanged, when its chunks are not the mounted
/// continuation's or cannot be read.
#[inline(always)]
pub(crate) fn enter_frozen_frames<P: UserMemory + JavaThreads>(
    walk: &mut Walk,
    window: &mut StackWindow,
    process: &P,
) -> bool {
    let layout = walk.hotspot.frozen;
    let Some(thread) = process.java_thread(walk.tid) else {
        return false;
    };
    let Ok(entry) = read_u64(process, thread + layout.java_thread_cont_entry as u64) else {
        return false;
    };
    // The barrier's caller is the continuation mounted here only if its frame ends just below
    // the entry (everything strictly below an entry belongs to its continuation).
    if entry == 0 || walk.sp > entry || entry - walk.sp > MAX_ENTRY_GAP {
        return false;
    }
    let Ok(cont) = read_u64(process, entry + ENTRY_CONT) else {
        return false;
    };
    let Some(tail) = read_oop(
        &walk.hotspot,
        process,
        cont + layout.continuation_tail as u64,
    ) else {
        return false;
    };
    if cont == 0 {
        return false;
    }
    walk.frozen = FrozenWalk {
        chunk: 0,
        end: 0,
        parent: 0,
        cont,
        entry,
        chunks: 0,
        _reserved: 0,
    };
    enter_chunk(walk, window, process, tail)
}

/// One frozen frame: records it and moves to its caller, in this chunk, the next one, or back
/// on the carrier after the last.
#[inline(always)]
pub(crate) fn frozen_step<M: UserMemory + RecentBlobs>(
    walk: &mut Walk,
    window: &mut StackWindow,
    memory: &M,
) -> Result<UserFrame, UnwindEnd> {
    let end = walk.frozen.end;
    if is_interpreted(&walk.hotspot, walk.pc) {
        let fp = walk.fp;
        let locals = window.u64(memory, fp.wrapping_sub(LOCALS_SLOT))?;
        // Records the frame; its links read as on a thread stack are offsets here.
        let frame = crate::hotspot::interpreted_step(walk, window, memory, false)?;
        if walk.end != END_UNSET {
            return Ok(frame);
        }
        let caller_usp = relative(fp, walk.sp);
        let caller_sp = fp + 16;
        // The bottom frame's locals (its arguments) reach the chunk's bottom.
        if relative(fp, locals).wrapping_add(8) >= end {
            leave_chunk(walk, window, memory);
        } else {
            move_to(walk, window, memory, caller_sp, caller_usp);
        }
        return Ok(frame);
    }
    let (low, high) = (walk.hotspot.code_low, walk.hotspot.code_high);
    if walk.pc < low || walk.pc >= high {
        return Err(UnwindEnd::BadJavaFrame);
    }
    // A compiled frame: its fixed size from its unextended sp.
    walk.sp = walk.fp;
    let frame = java_step(walk, window, memory, false)?;
    if walk.end != END_UNSET {
        return Ok(frame);
    }
    if walk.blob_cache.frame_size <= 0 {
        // A blob without a fixed frame (its rbp links are not kept in a chunk).
        walk.end = UnwindEnd::BadJavaFrame as u8;
        return Ok(frame);
    }
    let caller_sp = walk.sp;
    if caller_sp.wrapping_add(16) >= end {
        leave_chunk(walk, window, memory);
    } else {
        move_to(walk, window, memory, caller_sp, caller_sp);
    }
    Ok(frame)
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

/// After a chunk's last frame: the next chunk's first, or the continuation's entry frame on the
/// carrier (the walk then goes on as if nothing had been frozen), or its caller if the entry
/// frame's code is not known.
#[inline(always)]
fn leave_chunk<M: UserMemory>(walk: &mut Walk, window: &mut StackWindow, memory: &M) {
    let parent = walk.frozen.parent;
    if parent != 0 && enter_chunk(walk, window, memory, parent) {
        return;
    }
    let entry = walk.frozen.entry;
    walk.frozen.chunk = 0;
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
        let Some(header) = read_chunk(&walk.hotspot, memory, chunk) else {
            return false;
        };
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
        // The top frame's pc is kept twice: in the chunk, and as the return address just
        // below its frame. A chunk being rewritten has them differ.
        match window.u64(memory, sp - 8) {
            Ok(pc) if pc == header.pc && pc != 0 => {}
            _ => return false,
        }
        let fp = if is_interpreted(&walk.hotspot, header.pc) {
            match interpreted_fp(window, memory, sp) {
                Ok(fp) => fp,
                Err(_) => return false,
            }
        } else {
            sp
        };
        walk.frozen.chunk = chunk;
        walk.frozen.end = start + header.bottom as u64 * 8;
        walk.frozen.parent = header.parent;
        walk.pc = header.pc;
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

/// The chunk fields the walk needs, in one read of the chunk's start.
#[inline(always)]
fn read_chunk<M: UserMemory>(hs: &HotspotProc, memory: &M, chunk: u64) -> Option<ChunkHeader> {
    let layout: &FrozenFramesLayout = &hs.frozen;
    let compressed = hs.flags & hotspot_flags::COMPRESSED_OOPS != 0;
    let header = memory.with_scratch(|buffer| {
        if !memory.read_into(chunk, buffer) {
            return None;
        }
        // SAFETY: the read filled every byte.
        let bytes = unsafe { &*(buffer as *const _ as *const [u8; crate::memory::SCRATCH_BYTES]) };
        let oop = |offset: u16| {
            if compressed {
                decode(layout, field_i32(bytes, offset as usize) as u32)
            } else {
                wide(hs, field_u64(bytes, offset as usize))
            }
        };
        Some(ChunkHeader {
            size: field_i32(bytes, layout.chunk_size as usize),
            sp: field_i32(bytes, layout.chunk_sp as usize),
            bottom: field_i32(bytes, layout.chunk_bottom as usize),
            pc: field_u64(bytes, layout.chunk_pc as usize),
            parent: oop(layout.chunk_parent),
            cont: oop(layout.chunk_cont),
        })
    });
    header.flatten()
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
fn wide(hs: &HotspotProc, reference: u64) -> u64 {
    if hs.flags & hotspot_flags::ZGC_COLORED_OOPS == 0 {
        return reference;
    }
    // The remapped bit set in the colour says how far the address is shifted.
    let shift = match (reference >> 12) & 0xf {
        1 => 13,
        2 => 14,
        4 => 15,
        8 => 16,
        _ => return 0,
    };
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
