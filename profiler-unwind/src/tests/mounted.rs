//! Which virtual thread a carrier has mounted: its `Thread.tid` when `_vthread` is a virtual
//! thread, none when it is the carrier's own thread object (however its reference is coloured).

use super::TID;
use crate::fakes::*;
use crate::{mounted_thread, MountedThread};

/// `JavaThread::_vthread` and `_threadObj` in the fake threads, and `Thread.tid`.
const VTHREAD: u16 = 0x1a0;
const THREAD_OBJ: u16 = 0x1a8;
const THREAD_TID: u16 = 16;
/// The thread objects' handles (OopStorage slots) and the objects.
const VTHREAD_SLOT: u64 = JAVA_HEAP + 0x100;
const THREAD_OBJ_SLOT: u64 = JAVA_HEAP + 0x108;
const CARRIER_OBJECT: u64 = JAVA_HEAP + 0x1000;
const VIRTUAL_OBJECT: u64 = JAVA_HEAP + 0x2000;
const CONTINUATION: u64 = JAVA_HEAP + 0x3000;
const ENTRY: u64 = STACK + 0x8000;

/// A carrier (tid 5) whose `_vthread` slot holds `current`.
fn carrier(current: u64) -> Jvm {
    let mut jvm = Jvm::new(Layout::Offsets);
    jvm.with_virtual_threads(CODE_LOW + 0xb000, 0);
    jvm.hs.frozen.thread_tid = THREAD_TID;
    jvm.hs.frozen.java_thread_vthread = VTHREAD;
    jvm.hs.frozen.java_thread_thread_obj = THREAD_OBJ;
    jvm.mount(TID, ENTRY, CONTINUATION, JAVA_HEAP + 0x4000);
    let thread = Jvm::java_thread_of(TID);
    let m = &mut jvm.memory;
    m.put_u64(thread + VTHREAD as u64, VTHREAD_SLOT);
    m.put_u64(thread + THREAD_OBJ as u64, THREAD_OBJ_SLOT);
    m.put_u64(THREAD_OBJ_SLOT, CARRIER_OBJECT);
    m.put_u64(VTHREAD_SLOT, current);
    m.put_u64(CARRIER_OBJECT + THREAD_TID as u64, 5);
    m.put_u64(VIRTUAL_OBJECT + THREAD_TID as u64, 77);
    jvm
}

#[test]
fn a_mounted_virtual_thread_is_known_by_its_tid() {
    let jvm = carrier(VIRTUAL_OBJECT);
    let mounted = mounted_thread(&jvm.hs, &jvm.memory, Jvm::java_thread_of(TID));
    assert_eq!(
        mounted,
        Some(MountedThread {
            virtual_tid: Some(77),
            continuation: CONTINUATION,
        })
    );
}

#[test]
fn the_carriers_own_thread_object_is_no_virtual_thread() {
    let jvm = carrier(CARRIER_OBJECT);
    let thread = Jvm::java_thread_of(TID);
    let mounted = mounted_thread(&jvm.hs, &jvm.memory, thread).expect("readable");
    assert_eq!(mounted.virtual_tid, None);
    assert_eq!(mounted.continuation, CONTINUATION);
    // The same object through another reference (single-generation ZGC's colours): told by
    // its tid, not its address.
    let mut jvm = carrier(JAVA_HEAP + 0x5000);
    jvm.memory
        .put_u64(JAVA_HEAP + 0x5000 + THREAD_TID as u64, 5);
    let mounted = mounted_thread(&jvm.hs, &jvm.memory, thread).expect("readable");
    assert_eq!(mounted.virtual_tid, None);
}

#[test]
fn unreadable_thread_objects_identify_nothing() {
    // A handle into unmapped memory.
    let jvm = carrier(0xdead_0000_0000);
    assert_eq!(
        mounted_thread(&jvm.hs, &jvm.memory, Jvm::java_thread_of(TID)),
        None
    );
    // A layout without the fields.
    let mut jvm = carrier(VIRTUAL_OBJECT);
    jvm.hs.frozen.java_thread_vthread = 0;
    assert_eq!(
        mounted_thread(&jvm.hs, &jvm.memory, Jvm::java_thread_of(TID)),
        None
    );
}
