//! Which virtual thread a carrier thread has mounted: what the unmount and mount hooks key a
//! virtual thread's wait by (`profiler-ebpf/src/virtual_waits.rs`).
//!
//! `JavaThread::_vthread` is the thread object current on the carrier: the virtual thread while
//! it is mounted, else the carrier's own (`_threadObj`). Its `tid` field is the virtual thread's
//! id, which moves with no garbage collection. JDK 21 to 23 switch `_vthread` back to the
//! carrier before they freeze, so an unmount there sees only the mounted continuation (the
//! object `ContinuationEntry::_cont` points to), which a collection may move.

use profiler_common::HotspotProc;

use crate::frozen::{wide, ENTRY_CONT};
use crate::memory::{read_u64, UserMemory};

/// The virtual thread mounted on a carrier, as far as the carrier's `JavaThread` tells.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MountedThread {
    /// The virtual thread's `Thread.tid`, if `_vthread` is a virtual thread (not the carrier).
    pub virtual_tid: Option<u64>,
    /// The mounted continuation (an uncompressed reference; 0: none mounted).
    pub continuation: u64,
}

/// What the carrier `thread` (a `JavaThread*`) has mounted; `None` if the JVM's layout lacks
/// the fields or the thread's objects cannot be read.
#[inline(always)]
pub fn mounted_thread<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    thread: u64,
) -> Option<MountedThread> {
    let virtual_tid = mounted_virtual_tid(hs, memory, thread)?;
    let entry_field = hs.frozen.java_thread_cont_entry as u64;
    let entry = read_u64(memory, thread + entry_field).unwrap_or(0);
    let continuation = if entry == 0 {
        0
    } else {
        read_u64(memory, entry + ENTRY_CONT).unwrap_or(0)
    };
    Some(MountedThread {
        virtual_tid,
        continuation,
    })
}

/// The id (`Thread.tid`) of the virtual thread mounted on the carrier `thread` (a
/// `JavaThread*`): `Some(None)` when the carrier runs as itself, `None` when the JVM's layout
/// lacks the fields or the thread's objects cannot be read.
#[inline(always)]
pub fn mounted_virtual_tid<M: UserMemory>(
    hs: &HotspotProc,
    memory: &M,
    thread: u64,
) -> Option<Option<u64>> {
    let layout = &hs.frozen;
    if layout.java_thread_vthread == 0 || layout.java_thread_thread_obj == 0 {
        return None;
    }
    // An `OopHandle` is the address of a slot holding a full-width reference.
    let object_of = |handle_field: u16| -> Option<u64> {
        let slot = read_u64(memory, thread + handle_field as u64).ok()?;
        Some(wide(hs, read_u64(memory, slot).ok()?))
    };
    let current = object_of(layout.java_thread_vthread)?;
    let carrier = object_of(layout.java_thread_thread_obj)?;
    if current == 0 || carrier == 0 || layout.thread_tid == 0 {
        return Some(None);
    }
    // Told apart by their ids, not their addresses: single-generation ZGC's references to one
    // object differ by their colour.
    let tid_of = |object: u64| read_u64(memory, object + layout.thread_tid as u64).ok();
    let tid = tid_of(current)?;
    Some((tid != tid_of(carrier)?).then_some(tid))
}
