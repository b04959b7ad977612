//! A mounted virtual thread's frames frozen in its stack chunks: the walk goes from the return
//! barrier into the chunks of the mounted continuation and back to the carrier at its entry,
//! and never into a chunk of another continuation.

use super::{expect, INTERPRETER_PC, TID};
use crate::fakes::*;
use profiler_common::{UnwindEnd, UserFrame};

/// A virtual thread mounted on the carrier thread `TID`: its thawed top frame (compiled)
/// returns into the return barrier; frozen in its chunk are an interpreted frame and, below
/// it, a compiled one; then the continuation's entry (enterSpecial) and the carrier's call
/// stub. `chunk_cont` is the continuation the chunk says it belongs to.
struct Mounted {
    jvm: Jvm,
    top: Blob,
    sp: u64,
    /// The continuation mounted, and the chunk of its frames.
    cont: u64,
    chunk: u64,
    /// What the walk records: the thawed frame, the frozen ones, enterSpecial and the natives
    /// under the call stub.
    thawed: Vec<UserFrame>,
    frozen: Vec<UserFrame>,
    carrier: Vec<UserFrame>,
}

fn mounted(chunk_cont: Option<u64>) -> Mounted {
    let mut jvm = Jvm::new(Layout::Offsets);
    let top = jvm.add_blob(&BlobSpec::nmethod(4, 11));
    let frozen_compiled = jvm.add_blob(&BlobSpec::nmethod(4, 22));
    let enter_special = jvm.add_blob(&BlobSpec::nmethod(10, 33));
    let barrier = jvm.add_blob(&BlobSpec::stub()).pc(0x10);
    jvm.with_virtual_threads(barrier, enter_special.pc(0x60));
    let method = jvm.add_method(b"com/example/Task", 0x5a5a_0002, 64);

    // The carrier's stack: the thawed frame right below the entry, the entry's saved rbp and
    // return address into the call stub above it.
    let sp = STACK + 0x8000;
    let entry = jvm.compiled_frame(sp, 4, 0x1234, barrier);
    let stub_fp = entry + 0x200;
    jvm.fp_frame(entry + 64, stub_fp, CALL_STUB_RETURN);
    let natives = jvm.entry_frames(stub_fp);

    // The chunk: the interpreted frame at word 4, its links relative; the compiled frame
    // after it ends at the chunk's bottom (two words of arguments above).
    let cont = JAVA_HEAP + 0x100;
    let chunk = JAVA_HEAP + 0x1000;
    let start = chunk + 48;
    let s0 = start + 4 * 8;
    let fp0 = s0 + 10 * 8;
    let s1 = fp0 + 16;
    let end = s1 + 4 * 8;
    let bottom = ((end - start) / 8) as i32;
    jvm.stack_chunk(
        chunk,
        &ChunkSpec {
            cont: chunk_cont.unwrap_or(cont),
            parent: 0,
            size: bottom + 2,
            sp: 4,
            bottom,
            pc: INTERPRETER_PC,
        },
    );
    let m = &mut jvm.memory;
    // The top frame's fp, relative to the slot holding it.
    m.put_u64(s0 - 16, (fp0 - (s0 - 16)) / 8);
    m.put_u64(fp0 - 3 * 8, method.addr);
    m.put_u64(fp0 - 8 * 8, method.code + 5);
    // Sender sp (fp + 2 words) and locals (fp + 3 words), relative to fp.
    m.put_u64(fp0 - 8, 2);
    m.put_u64(fp0 - 7 * 8, 3);
    m.put_u64(fp0 + 8, frozen_compiled.pc(0x90));
    // The bottom frame's return address is not a link: the walk leaves the chunk at its end.
    jvm.compiled_frame(s1, 4, 0, barrier);
    jvm.mount(TID, entry, cont, chunk);

    let mut carrier = vec![enter_special.frame(0x60)];
    carrier.extend(natives);
    Mounted {
        jvm,
        top,
        sp,
        cont,
        chunk,
        thawed: vec![top.frame(0x80)],
        frozen: vec![method.frame(5), frozen_compiled.frame(0x90)],
        carrier,
    }
}

impl Mounted {
    /// Walks the carrier from the thawed top frame.
    fn walk(&self) -> (Vec<UserFrame>, UnwindEnd) {
        self.jvm.walk(TID, regs(self.top.pc(0x80), self.sp, 0x7))
    }

    /// What a walk records after the thawed frame when it goes through every frozen frame.
    fn frozen_then_carrier(&self) -> Vec<UserFrame> {
        self.frozen.iter().chain(&self.carrier).copied().collect()
    }
}

#[test]
fn the_walk_goes_through_the_frozen_frames_back_to_the_carrier() {
    let mounted = mounted(None);
    let walked = mounted.walk();
    let rest = mounted.frozen_then_carrier();
    expect(walked, &mounted.thawed, &rest, UnwindEnd::Complete);
}

#[test]
fn an_emptied_tail_leads_to_its_parent() {
    let mut mounted = mounted(None);
    let tail = JAVA_HEAP + 0x800;
    mounted.jvm.stack_chunk(
        tail,
        &ChunkSpec {
            cont: mounted.cont,
            parent: mounted.chunk,
            size: 8,
            sp: 8,
            bottom: 8,
            pc: 0,
        },
    );
    mounted.jvm.mount(TID, mounted.sp + 32, mounted.cont, tail);
    let walked = mounted.walk();
    let rest = mounted.frozen_then_carrier();
    expect(walked, &mounted.thawed, &rest, UnwindEnd::Complete);
}

#[test]
fn a_chunk_of_another_continuation_is_never_walked() {
    let mounted = mounted(Some(JAVA_HEAP + 0x200));
    let walked = mounted.walk();
    expect(walked, &mounted.thawed, &[], UnwindEnd::FrozenFramesUnread);
}

#[test]
fn a_chunk_whose_top_pc_disagrees_is_not_walked() {
    let mut mounted = mounted(None);
    // A thaw rewrote the frames but not yet the chunk's pc.
    mounted
        .jvm
        .memory
        .put_u64(mounted.chunk + 48 + 3 * 8, INTERPRETER_PC + 0x40);
    let walked = mounted.walk();
    expect(walked, &mounted.thawed, &[], UnwindEnd::FrozenFramesUnread);
}

#[test]
fn a_thread_without_a_mounted_continuation_stops_at_the_barrier() {
    let mut mounted = mounted(None);
    let thread = Jvm::java_thread_of(TID);
    mounted.jvm.memory.put_u64(thread + 0x180, 0);
    let walked = mounted.walk();
    expect(walked, &mounted.thawed, &[], UnwindEnd::FrozenFramesUnread);
}
