//! The walker over synthetic stacks: one test (or a few) per kind of frame it handles, each a
//! stack of several frames whose exact recorded frames and end are asserted, then the ways a
//! walk fails. See `fake.rs` for the fake process.

mod cfi;
mod frozen;
mod mounted;

use crate::fakes::*;
use crate::UserRegs;
use profiler_common::{UnwindEnd, UserFrame};

/// Recorded prologues and epilogues (JDK 25, see `x86_frames`'s tests).
/// Bang, `push rbp`, `sub rsp, 0x20`, entry barrier: a 6-word frame, complete 26 bytes in.
const BANG_PUSH_SUB_BARRIER: &str =
    "89 84 24 00 c0 fe ff 55 48 83 ec 20 41 81 7f 20 01 00 00 00 0f 85 c8 01 00 00 48 3b f2";
/// `sub rsp, 0x18`, `mov [rsp+0x10], rbp`, entry barrier: a 4-word frame, complete 17 bytes in.
const SUB_MOV_BARRIER: &str = "48 83 ec 18 48 89 6c 24 10 41 81 7f 20 01 00 00 00";
/// `add rsp, 0x70` (0), `pop rbp` (4), `cmp rsp, [r15+0x28]` (5), `ja` (9), `ret` (15): the
/// epilogue of a 16-word frame.
const EPILOGUE: &str = "48 83 c4 70 5d 49 3b 67 28 0f 87 2a 0a 00 00 c3";

const TID: u32 = 4242;
/// A pc in the interpreter (a return address into an invoke bytecode's template).
const INTERPRETER_PC: u64 = INTERPRETER_LOW + 0x800;

/// An interpreted frame whose sp is `sp` (the caller_sp of the frame above it), called from the
/// call stub: its fp, and the frames the walker records from it on.
fn interpreted_caller(jvm: &mut Jvm, sp: u64) -> (u64, Vec<UserFrame>) {
    let method = jvm.add_method(b"com/example/Main", 0x5a5a_0001, 64);
    let fp = sp + 0x80;
    let stub_fp = fp + 0x100;
    jvm.interpreter_frame(
        fp,
        InterpreterFrame {
            method,
            bcp: method.code + 21,
            sender_sp: fp + 16,
            saved_fp: stub_fp,
            return_address: CALL_STUB_RETURN,
        },
    );
    let mut frames = vec![method.frame(21)];
    frames.extend(jvm.entry_frames(stub_fp));
    (fp, frames)
}

fn expect(
    walked: (Vec<UserFrame>, UnwindEnd),
    first: &[UserFrame],
    rest: &[UserFrame],
    end: UnwindEnd,
) {
    let expected: Vec<UserFrame> = first.iter().chain(rest).copied().collect();
    assert_eq!(walked.0, expected);
    assert_eq!(walked.1, end);
}

// Native frames.

#[test]
fn native_frames_follow_the_frame_pointer_chain_to_its_end() {
    // Not a JVM. The second frame's fp is 8 bytes before a page end: its pair is read across
    // the page boundary, outside the stack window.
    let mut memory = FakeMemory::default();
    memory.map(STACK, (STACK_TOP - STACK) as usize);
    let (f1, f2, f3) = (STACK + 0x9f00, STACK + 0x9ff8, STACK + 0xa100);
    for (fp, saved, ret) in [
        (f1, f2, 0x5555_0000_0200),
        (f2, f3, 0x5555_0000_0300),
        (f3, 0, 0x5555_0000_0400),
    ] {
        memory.put_u64(fp, saved);
        memory.put_u64(fp + 8, ret);
    }
    let walked = walk_process(&memory, None, TID, regs(0x5555_0000_0100, f1 - 0x40, f1));
    let expected = [0x100, 0x200, 0x300, 0x400].map(|pc| native(0x5555_0000_0000 + pc));
    expect(walked, &expected, &[], UnwindEnd::Complete);
}

#[test]
fn a_frame_pointer_that_goes_down_the_stack_is_not_followed() {
    let mut memory = FakeMemory::default();
    memory.map(STACK, (STACK_TOP - STACK) as usize);
    let fp = STACK + 0x8000;
    memory.put_u64(fp, fp - 0x100);
    memory.put_u64(fp + 8, 0x5555_0000_0200);
    let walked = walk_process(&memory, None, TID, regs(0x5555_0000_0100, fp - 0x40, fp));
    expect(
        walked,
        &[native(0x5555_0000_0100)],
        &[],
        UnwindEnd::NotMonotonic,
    );
}

// Interpreted frames and the call stub.

/// Every length of class name, its `Symbol` in the middle of memory or ending where its mapping
/// ends (a read past the name fails there), gives the cookie computed from the name itself.
#[test]
fn interpreted_frames_are_named_by_class_names_of_every_length() {
    for len in [1, 16, 40, 41, 42, 43, 44, 50, 100, 300] {
        let name: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        for at_mapping_end in [false, true] {
            let mut jvm = Jvm::new(Layout::Pointers);
            let method = if at_mapping_end {
                jvm.add_method_named_at_mapping_end(&name, 0x4242_0000 + len, 30)
            } else {
                jvm.add_method(&name, 0x4242_0000 + len, 30)
            };
            let (sp, fp) = (STACK + 0x8000, STACK + 0x8100);
            let stub_fp = STACK + 0x8300;
            jvm.interpreter_frame(
                fp,
                InterpreterFrame {
                    method,
                    bcp: method.code + 5,
                    sender_sp: fp + 16,
                    saved_fp: stub_fp,
                    return_address: CALL_STUB_RETURN,
                },
            );
            let natives = jvm.entry_frames(stub_fp);
            let mut start = regs(INTERPRETER_LOW + 0x500, sp, fp);
            start.r13 = method.code + 9;
            let walked = jvm.walk(TID, start);
            expect(walked, &[method.frame(9)], &natives, UnwindEnd::Complete);
        }
    }
}

#[test]
fn interpreted_frames_then_the_call_stub_into_native_code() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let leaf = jvm.add_method(b"com/example/Leaf", 0xabcd_0001, 40);
    let caller = jvm.add_method(b"com/example/a/very/long/package/Caller", 0x1234_0001, 60);
    let (sp1, fp1) = (STACK + 0x8000, STACK + 0x8100);
    let fp2 = STACK + 0x8300;
    let stub_fp = STACK + 0x8500;
    jvm.interpreter_frame(
        fp1,
        InterpreterFrame {
            method: leaf,
            // The saved bcp lags: the live one is in r13 for the top frame.
            bcp: leaf.code + 3,
            sender_sp: fp1 + 16,
            saved_fp: fp2,
            return_address: INTERPRETER_PC,
        },
    );
    jvm.interpreter_frame(
        fp2,
        InterpreterFrame {
            method: caller,
            bcp: caller.code + 17,
            sender_sp: fp2 + 16,
            saved_fp: stub_fp,
            return_address: CALL_STUB_RETURN,
        },
    );
    let natives = jvm.entry_frames(stub_fp);
    let mut start = regs(INTERPRETER_LOW + 0x500, sp1, fp1);
    start.r13 = leaf.code + 7;
    let walked = jvm.walk(TID, start);
    // The call stub itself is not recorded.
    expect(
        walked,
        &[leaf.frame(7), caller.frame(17)],
        &natives,
        UnwindEnd::Complete,
    );
}

#[test]
fn recursion_reuses_an_interpreted_cookie_and_alternation_does_not_mix_them() {
    // A, A, B, A: the walk keeps the last method's cookie; each frame must still carry its own.
    let mut jvm = Jvm::new(Layout::Offsets);
    let a = jvm.add_method(b"com/example/Recursive", 0x5555_0001, 40);
    let b = jvm.add_method(b"com/example/Other", 0x6666_0001, 40);
    let fps = [
        STACK + 0x8100,
        STACK + 0x8300,
        STACK + 0x8500,
        STACK + 0x8700,
    ];
    let stub_fp = STACK + 0x8900;
    let methods = [a, a, b, a];
    for (index, (fp, method)) in fps.iter().zip(methods).enumerate() {
        let last = index == fps.len() - 1;
        jvm.interpreter_frame(
            *fp,
            InterpreterFrame {
                method,
                bcp: method.code + index as u64,
                sender_sp: fp + 16,
                saved_fp: if last { stub_fp } else { fps[index + 1] },
                return_address: if last {
                    CALL_STUB_RETURN
                } else {
                    INTERPRETER_PC
                },
            },
        );
    }
    let natives = jvm.entry_frames(stub_fp);
    let mut start = regs(INTERPRETER_LOW + 0x500, STACK + 0x8000, fps[0]);
    start.r13 = a.code;
    let walked = jvm.walk(TID, start);
    expect(
        walked,
        &[a.frame(0), a.frame(1), b.frame(2), a.frame(3)],
        &natives,
        UnwindEnd::Complete,
    );
}

#[test]
fn an_implausible_bcp_is_recorded_as_an_unknown_bci() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let leaf = jvm.add_method(b"Leaf", 0x0101_0001, 10);
    let fp = STACK + 0x8100;
    let stub_fp = STACK + 0x8400;
    jvm.interpreter_frame(
        fp,
        InterpreterFrame {
            method: leaf,
            bcp: leaf.code + 10,
            sender_sp: fp + 16,
            saved_fp: stub_fp,
            return_address: CALL_STUB_RETURN,
        },
    );
    let natives = jvm.entry_frames(stub_fp);
    // r13 is not in the method's code either (a template that reused it).
    let mut start = regs(INTERPRETER_LOW + 0x500, STACK + 0x8000, fp);
    start.r13 = 0x1234;
    let walked = jvm.walk(TID, start);
    expect(walked, &[leaf.frame(NO_BCI)], &natives, UnwindEnd::Complete);
}

#[test]
fn a_method_entered_from_compiled_code_before_its_frame_is_built() {
    // The interpreter's entry, called through the c2i adapter: the arguments below the
    // compiled caller's sp, the return address into the caller at sp, rbp still the caller's
    // general register, rbx the Method*, r13 the caller's sp.
    let mut jvm = Jvm::new(Layout::Pointers);
    let caller = jvm.add_blob(&BlobSpec::nmethod(6, 31));
    let entered = jvm.add_method(b"com/example/Cold", 0x7777_0001, 12);
    let sender_sp = STACK + 0x8000;
    let sp = sender_sp - 0x20;
    jvm.memory.put_u64(sp, caller.pc(0x90));
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sender_sp + 6 * 8);
    jvm.compiled_frame(sender_sp, 6, interp_fp, INTERPRETER_PC);
    let mut start = regs(INTERPRETER_LOW + 0x100, sp, 0x42);
    start.r13 = sender_sp;
    start.rbx = entered.addr;
    let walked = jvm.walk(TID, start);
    expect(
        walked,
        &[entered.frame(NO_BCI), caller.frame(0x90)],
        &rest,
        UnwindEnd::Complete,
    );
    // Without a return address into compiled code at sp, nothing says where the frame is.
    jvm.memory.put_u64(sp, 0x1234);
    let walked = jvm.walk(TID, start);
    expect(walked, &[], &[], UnwindEnd::BadJavaFrame);
}

// Compiled frames.

#[test]
fn compiled_frames_with_complete_frames_into_an_interpreted_caller() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 101));
    let b = jvm.add_blob(&BlobSpec::nmethod(4, 202));
    let sp0 = STACK + 0x8000;
    let sp1 = jvm.compiled_frame(sp0, 6, 0x1111, b.pc(0x123));
    let sp2 = sp1 + 4 * 8;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sp2);
    jvm.compiled_frame(sp1, 4, interp_fp, INTERPRETER_PC);
    // rbp holds whatever the compiled code left there.
    let walked = jvm.walk(TID, regs(a.pc(0x80), sp0, 0x7));
    expect(
        walked,
        &[a.frame(0x80), b.frame(0x123)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn a_compiled_frame_called_from_the_call_stub() {
    let mut jvm = Jvm::new(Layout::Offsets);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 7));
    let sp = STACK + 0x8000;
    let stub_fp = sp + 0x200;
    jvm.compiled_frame(sp, 6, stub_fp, CALL_STUB_RETURN);
    let natives = jvm.entry_frames(stub_fp);
    let walked = jvm.walk(TID, regs(a.pc(0x44), sp, 0));
    expect(walked, &[a.frame(0x44)], &natives, UnwindEnd::Complete);
}

/// A top nmethod sampled at `offset` in its prologue: `frame_size` words once built, and how
/// the stack looks then (`stack`: sp -> words written from it; `fp`: rbp at the sample).
fn prologue_case(
    layout: Layout,
    prologue: &str,
    frame_size: i32,
    frame_complete: i32,
    offset: u64,
    state: &str,
) {
    let mut jvm = Jvm::new(layout);
    let spec = BlobSpec {
        frame_complete,
        code: &[(0x20, prologue)],
        ..BlobSpec::nmethod(frame_size, 55)
    };
    let p = jvm.add_blob(&spec);
    let sp = STACK + 0x8000;
    let words = match state {
        "nothing pushed" => 1,
        "rbp pushed" => 2,
        "built" | "built, rbp live" => frame_size as u64,
        _ => unreachable!("{state}"),
    };
    let caller_sp = sp + words * 8;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, caller_sp);
    jvm.memory.put_u64(caller_sp - 8, INTERPRETER_PC);
    let fp_at_sample = match state {
        // rbp still holds the caller's fp.
        "nothing pushed" | "built, rbp live" => interp_fp,
        _ => {
            jvm.memory.put_u64(caller_sp - 16, interp_fp);
            0xdead
        }
    };
    let walked = jvm.walk(TID, regs(p.pc(offset), sp, fp_at_sample));
    expect(walked, &[p.frame(offset)], &rest, UnwindEnd::Complete);
}

#[test]
fn a_compiled_method_sampled_before_its_prologue_pushed_rbp() {
    // On the stack bang at the verified entry, and in the unverified entry before it.
    for layout in [Layout::Pointers, Layout::Offsets] {
        prologue_case(
            layout,
            BANG_PUSH_SUB_BARRIER,
            6,
            0x3a,
            0x20,
            "nothing pushed",
        );
        prologue_case(
            layout,
            BANG_PUSH_SUB_BARRIER,
            6,
            0x3a,
            0x10,
            "nothing pushed",
        );
        // On `push rbp` itself.
        prologue_case(
            layout,
            BANG_PUSH_SUB_BARRIER,
            6,
            0x3a,
            0x27,
            "nothing pushed",
        );
    }
}

#[test]
fn a_compiled_method_sampled_after_its_prologue_pushed_rbp() {
    for layout in [Layout::Pointers, Layout::Offsets] {
        // On `sub rsp`: rbp pushed, the frame not yet allocated.
        prologue_case(layout, BANG_PUSH_SUB_BARRIER, 6, 0x3a, 0x28, "rbp pushed");
        // On the entry barrier, before `_frame_complete_offset`: the frame is built.
        prologue_case(layout, BANG_PUSH_SUB_BARRIER, 6, 0x3a, 0x2c, "built");
        // Without a bang: allocated, rbp not yet stored in it.
        prologue_case(layout, SUB_MOV_BARRIER, 4, 0x31, 0x24, "built, rbp live");
        prologue_case(layout, SUB_MOV_BARRIER, 4, 0x31, 0x29, "built");
    }
}

/// A top nmethod with a 16-word frame sampled at `offset` into [`EPILOGUE`] (placed at 0x100).
fn epilogue_case(offset: u64, state: &str) {
    let mut jvm = Jvm::new(Layout::Pointers);
    let spec = BlobSpec {
        code: &[(0x100, EPILOGUE)],
        ..BlobSpec::nmethod(16, 77)
    };
    let e = jvm.add_blob(&spec);
    let sp = STACK + 0x8000;
    let words = match state {
        "whole" => 16,
        "rbp pushed" => 2,
        "nothing pushed" => 1,
        _ => unreachable!("{state}"),
    };
    let caller_sp = sp + words * 8;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, caller_sp);
    jvm.memory.put_u64(caller_sp - 8, INTERPRETER_PC);
    let fp_at_sample = if state == "nothing pushed" {
        interp_fp
    } else {
        jvm.memory.put_u64(caller_sp - 16, interp_fp);
        0xdead
    };
    let walked = jvm.walk(TID, regs(e.pc(0x100 + offset), sp, fp_at_sample));
    expect(
        walked,
        &[e.frame(0x100 + offset)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn a_compiled_method_sampled_in_its_epilogue() {
    epilogue_case(0, "whole"); // add rsp
    epilogue_case(4, "rbp pushed"); // pop rbp
    epilogue_case(5, "nothing pushed"); // cmp rsp, [r15+0x28] (the return poll)
    epilogue_case(9, "nothing pushed"); // ja (the return poll)
    epilogue_case(15, "nothing pushed"); // ret
}

#[test]
fn words_pushed_below_a_compiled_frame_are_skipped() {
    // B pushed two words beyond its fixed size (an intrinsic spilling registers): its
    // nominal return slot holds a spilled value, the return address is two words higher.
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let b = jvm.add_blob(&BlobSpec::nmethod(4, 2));
    let sp0 = STACK + 0x8000;
    let sp1 = jvm.compiled_frame(sp0, 6, 0, b.pc(0x90));
    let nominal = sp1 + 4 * 8;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, nominal + 16);
    jvm.compiled_frame(sp1, 4, 0x42, 0x4141);
    jvm.compiled_frame(sp1, 6, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(
        walked,
        &[a.frame(0x60), b.frame(0x90)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn recursion_reuses_the_cached_blob_with_the_right_offsets() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let r = jvm.add_blob(&BlobSpec::nmethod(2, 9));
    let sp0 = STACK + 0x8000;
    let mut sp = sp0;
    for _ in 0..4 {
        sp = jvm.compiled_frame(sp, 2, 0, r.pc(0x70));
    }
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sp + 16);
    jvm.compiled_frame(sp, 2, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(r.pc(0x50), sp0, 0));
    let mut first = vec![r.frame(0x50)];
    first.extend([r.frame(0x70); 4]);
    expect(walked, &first, &rest, UnwindEnd::Complete);
}

// Blobs remembered across walks (`recent_blobs`).

/// A two-blob compiled stack into an interpreted caller: the top blob, its caller, the regs
/// and every frame recorded.
fn two_compiled_frames(jvm: &mut Jvm) -> (Blob, Blob, UserRegs, Vec<UserFrame>) {
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 101));
    let b = jvm.add_blob(&BlobSpec::nmethod(4, 202));
    let sp0 = STACK + 0x8000;
    let sp1 = jvm.compiled_frame(sp0, 6, 0, b.pc(0x123));
    let (interp_fp, rest) = interpreted_caller(jvm, sp1 + 4 * 8);
    jvm.compiled_frame(sp1, 4, interp_fp, INTERPRETER_PC);
    let mut frames = vec![a.frame(0x150), b.frame(0x123)];
    frames.extend(rest);
    (a, b, regs(a.pc(0x150), sp0, 0), frames)
}

/// The segment map's byte for the segment holding `pc`.
fn segment_map_byte(pc: u64) -> u64 {
    SEGMAP + ((pc - HEAP_LOW) >> LOG2_SEGMENT)
}

#[test]
fn a_later_walk_of_the_same_jvm_takes_its_blobs_from_earlier_walks() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let (a, b, start, frames) = two_compiled_frames(&mut jvm);
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // The map bytes of the pcs' segments now say "not in a blob": only a remembered blob can
    // be found (its own first segment still marks a block start).
    for pc in [a.pc(0x150), b.pc(0x123)] {
        jvm.memory.put_u8(segment_map_byte(pc), 0xff);
    }
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // Another JVM at the same addresses (a restart that took the same pid and layout) does not
    // get this one's blobs.
    let mut restarted = jvm.hs;
    restarted.instance = FAKE_INSTANCE + 1;
    let walked = walk_process(&jvm.memory, Some(&restarted), TID, start);
    expect(walked, &[], &[], UnwindEnd::NoCodeBlob);
}

#[test]
fn a_remembered_blob_freed_is_not_used() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let (a, _, start, frames) = two_compiled_frames(&mut jvm);
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // Freed, its header and the segment map left as they were.
    jvm.free_blob(&a);
    expect(jvm.walk(TID, start), &[], &[], UnwindEnd::NoCodeBlob);
}

#[test]
fn a_remembered_blob_is_used_unread_while_no_code_is_freed_and_proven_once_some_is() {
    let mut jvm = Jvm::new(Layout::Offsets);
    jvm.memory.code_frees.set(Some(2));
    let (a, _, start, frames) = two_compiled_frames(&mut jvm);
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // Freed and replaced in place without the count moving (the hook would have moved it):
    // the remembered blob is used as it was, unread. This is what the count saves.
    jvm.free_blob(&a);
    let again = jvm.add_blob_at(a.addr - 16, &BlobSpec::nmethod(6, 303));
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // The count moved: the remembered blob is proven, found replaced, and the new one found.
    jvm.memory.code_frees.set(Some(4));
    let mut expected = vec![again.frame(0x150)];
    expected.extend_from_slice(&frames[1..]);
    expect(jvm.walk(TID, start), &expected, &[], UnwindEnd::Complete);
    // Found at count 4, so trusted at 4; not once frees stop being counted.
    jvm.free_blob(&again);
    expect(jvm.walk(TID, start), &expected, &[], UnwindEnd::Complete);
    jvm.memory.code_frees.set(None);
    expect(jvm.walk(TID, start), &[], &[], UnwindEnd::NoCodeBlob);
}

#[test]
fn a_remembered_blob_replaced_at_its_address_gives_way_to_the_new_one() {
    let mut jvm = Jvm::new(Layout::Offsets);
    let (a, b, start, frames) = two_compiled_frames(&mut jvm);
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    // Another nmethod compiled into the same block: its own compile id, the same frame.
    jvm.free_blob(&a);
    let again = jvm.add_blob_at(a.addr - 16, &BlobSpec::nmethod(6, 303));
    assert_eq!(again.addr, a.addr);
    let mut expected = vec![again.frame(0x150)];
    expected.extend_from_slice(&frames[1..]);
    expect(jvm.walk(TID, start), &expected, &[], UnwindEnd::Complete);
    assert_ne!(expected[0], frames[0], "the compile id tells them apart");
    let _ = b;
}

/// A stack whose top blob `a` is freed into one free block with `spacer` before it (HotSpot
/// marks it free, then merges it); returns the jvm, `a`, the walk's start and its frames.
fn freed_and_merged() -> (Jvm, Blob, UserRegs, Vec<UserFrame>) {
    let mut jvm = Jvm::new(Layout::Pointers);
    let spacer = jvm.add_blob(&BlobSpec::nmethod(6, 50));
    let (a, _, start, frames) = two_compiled_frames(&mut jvm);
    expect(jvm.walk(TID, start), &frames, &[], UnwindEnd::Complete);
    jvm.free_blob(&spacer);
    let spacer_segments = (a.addr - spacer.addr) >> LOG2_SEGMENT;
    jvm.free_blob_merged(&a, spacer_segments);
    (jvm, a, start, frames)
}

#[test]
fn a_remembered_blob_merged_into_free_space_gives_way_to_code_placed_inside_it() {
    let (mut jvm, a, start, frames) = freed_and_merged();
    // A new nmethod placed two segments into `a`'s old block, past its header, which keeps
    // its bytes but for the used flag.
    let small = BlobSpec {
        code_len: 0x200,
        ..BlobSpec::nmethod(6, 404)
    };
    let inside = jvm.add_blob_at(a.addr - 16 + (2 << LOG2_SEGMENT), &small);
    assert!(
        inside.code_begin + 0x200 < a.code_begin + 0x400,
        "inside `a`'s old block"
    );
    let offset = a.pc(0x150) - inside.code_begin;
    assert!(offset >= 0x40, "past the new nmethod's frame_complete");
    let mut expected = vec![inside.frame(offset)];
    expected.extend_from_slice(&frames[1..]);
    expect(jvm.walk(TID, start), &expected, &[], UnwindEnd::Complete);
}

#[test]
fn a_remembered_blob_whose_header_new_code_covers_gives_way_to_that_code() {
    let (mut jvm, a, start, frames) = freed_and_merged();
    // A new nmethod from two segments before `a`'s old block: its code runs over the old
    // header (every byte of it nonzero, the used flag's too).
    let over = BlobSpec {
        code_len: 0x600,
        ..BlobSpec::nmethod(6, 505)
    };
    let covering = jvm.add_blob_at(a.addr - 16 - (2 << LOG2_SEGMENT), &over);
    let old_header = a.addr - 16;
    assert!(covering.code_begin <= old_header && a.pc(0x150) < covering.code_begin + 0x600);
    for word in 0..0x180 / 8 {
        jvm.memory
            .put_u64(old_header + word * 8, 0x9090_9090_9090_9090);
    }
    let offset = a.pc(0x150) - covering.code_begin;
    let mut expected = vec![covering.frame(offset)];
    expected.extend_from_slice(&frames[1..]);
    expect(jvm.walk(TID, start), &expected, &[], UnwindEnd::Complete);
}

// Stubs.

#[test]
fn a_frameless_vtable_stub_on_top() {
    // A vtable or itable stub pushes nothing: the return address into its compiled caller is
    // at sp.
    let mut jvm = Jvm::new(Layout::Pointers);
    let stub = jvm.add_blob(&BlobSpec::stub());
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 31));
    let sp = STACK + 0x8000;
    jvm.memory.put_u64(sp, a.pc(0x99));
    let caller_sp = sp + 8 + 6 * 8;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, caller_sp);
    jvm.compiled_frame(sp + 8, 6, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(stub.pc(0x10), sp, 0));
    expect(
        walked,
        &[stub.frame(0x10), a.frame(0x99)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn a_stub_with_an_rbp_frame_on_top() {
    // `push rbp; mov rbp, rsp`: the saved rbp at sp is a stack address, not code.
    let mut jvm = Jvm::new(Layout::Pointers);
    let stub = jvm.add_blob(&BlobSpec::stub());
    let sp = STACK + 0x8000;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sp + 16);
    jvm.fp_frame(sp, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(stub.pc(0x30), sp, sp));
    expect(walked, &[stub.frame(0x30)], &rest, UnwindEnd::Complete);
}

#[test]
fn native_code_called_from_a_stub_with_an_rbp_frame() {
    // A native function (frame pointers) called by a stub that keeps rbp as a frame pointer,
    // called from compiled code.
    let mut jvm = Jvm::new(Layout::Offsets);
    let stub = jvm.add_blob(&BlobSpec::stub());
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 12));
    let native_fp = STACK + 0x8000;
    let stub_fp = STACK + 0x8040;
    jvm.fp_frame(native_fp, stub_fp, stub.pc(0x48));
    jvm.fp_frame(stub_fp, 0x31, a.pc(0x1c0));
    let a_sp = stub_fp + 16;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, a_sp + 6 * 8);
    jvm.compiled_frame(a_sp, 6, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(LIBC_READ, native_fp - 0x20, native_fp));
    expect(
        walked,
        &[native(LIBC_READ), stub.frame(0x48), a.frame(0x1c0)],
        &rest,
        UnwindEnd::Complete,
    );
}

/// A stub like C1's runtime stubs, which records no frame-complete offset: `frame_size` words
/// (-1 when it builds no frame).
fn c1_runtime_stub(jvm: &mut Jvm, frame_size: i32) -> Blob {
    jvm.add_blob(&BlobSpec {
        frame_size,
        frame_complete: -1,
        ..BlobSpec::stub()
    })
}

#[test]
fn a_stub_that_pushed_registers_returns_past_them_to_the_call_into_it() {
    type_check_stub_case(STACK + 0x8000, CallerOfCaller::Interpreter);
    // Its saved registers at the end of a page, the return address on the next one.
    type_check_stub_case(STACK + 0x8ff0, CallerOfCaller::Interpreter);
}

#[test]
fn the_stubs_caller_returns_past_the_stubs_arguments_to_a_compiled_caller() {
    type_check_stub_case(STACK + 0x8000, CallerOfCaller::Compiled);
}

/// Who called the caller of the stub in [`type_check_stub_case`].
enum CallerOfCaller {
    Interpreter,
    Compiled,
}

/// C1's `slow_subtype_check` sampled with sp at `sp`: the caller pushes two arguments and calls
/// the stub, which pushes four registers and builds no frame; rbp is the compiled caller's
/// general register. One saved register holds a code address that does not follow a call into
/// the stub, and so does the caller's spill slot where its frame size, taken from the pushed
/// arguments, puts its return address.
fn type_check_stub_case(sp: u64, caller_of_caller: CallerOfCaller) {
    let mut jvm = Jvm::new(Layout::Offsets);
    let stub = c1_runtime_stub(&mut jvm, -1);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 31));
    let return_address = jvm.call_instruction(a.pc(0x94), stub.pc(0));
    let saved = [0x7, a.pc(0x40), 0x1234, 0x5678];
    for (index, value) in saved.iter().enumerate() {
        jvm.memory.put_u64(sp + index as u64 * 8, *value);
    }
    jvm.memory.put_u64(sp + 32, return_address);
    let arguments = sp + 40;
    jvm.memory.put_u64(arguments, 0x8_0000_1000);
    jvm.memory.put_u64(arguments + 8, 0x8_0000_2000);
    let a_sp = arguments + 16;
    let b_sp = a_sp + 6 * 8;
    let (interp_fp, mut rest) = interpreted_caller(&mut jvm, b_sp + 4 * 8);
    match caller_of_caller {
        CallerOfCaller::Interpreter => {
            jvm.compiled_frame(a_sp, 6, interp_fp, INTERPRETER_PC);
        }
        CallerOfCaller::Compiled => {
            let b = jvm.add_blob(&BlobSpec::nmethod(4, 32));
            let into_a = jvm.call_instruction(b.pc(0x50), a.pc(0));
            jvm.compiled_frame(a_sp, 6, 0x43, into_a);
            jvm.compiled_frame(b_sp, 4, interp_fp, INTERPRETER_PC);
            rest.insert(0, b.frame(0x55));
        }
    }
    jvm.memory.put_u64(a_sp + 3 * 8, stub.pc(0x10));
    let walked = jvm.walk(TID, regs(stub.pc(0x30), sp, 0x42));
    expect(
        walked,
        &[stub.frame(0x30), a.frame(0x99)],
        &rest,
        UnwindEnd::Complete,
    );
}

/// C1's `counter_overflow` sampled on top at `offset`, its sp `pushed` words below the return
/// address and its rbp `fp` (given the return address's slot).
fn counter_overflow_case(offset: u64, pushed: u64, fp: impl Fn(u64) -> u64) {
    let mut jvm = Jvm::new(Layout::Offsets);
    let stub = c1_runtime_stub(&mut jvm, 40);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 31));
    let return_address = jvm.call_instruction(a.pc(0x94), stub.pc(0));
    let return_slot = STACK + 0x8200;
    let a_sp = return_slot + 8;
    jvm.memory.put_u64(return_slot, return_address);
    jvm.memory.put_u64(return_slot - 8, 0x42);
    let (interp_fp, rest) = interpreted_caller(&mut jvm, a_sp + 6 * 8);
    jvm.compiled_frame(a_sp, 6, interp_fp, INTERPRETER_PC);
    let sp = return_slot - pushed * 8;
    let walked = jvm.walk(TID, regs(stub.pc(offset), sp, fp(return_slot)));
    expect(
        walked,
        &[stub.frame(offset), a.frame(0x99)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn a_stub_without_a_frame_complete_offset_is_walked_by_rbp_while_it_saves_registers() {
    // `enter` done, registers half saved: sp is neither at the frame's start nor its end.
    counter_overflow_case(0x18, 12, |return_slot| return_slot - 8);
}

#[test]
fn a_stub_without_a_frame_complete_offset_sampled_before_it_pushed_rbp() {
    // At its first instruction: nothing pushed, rbp still the caller's.
    counter_overflow_case(0, 0, |_| 0x42);
    // `push rbp` done, `mov rbp, rsp` not yet.
    counter_overflow_case(1, 1, |_| 0x42);
}

// Deoptimization.

/// A compiled frame A returning into the deopt handler of nmethod D, whose frame keeps the pc
/// it had at `orig_pc`.
fn deopt_case(layout: Layout, orig_pc: impl Fn(&Blob) -> u64, recorded_offset: u64) {
    let mut jvm = Jvm::new(layout);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let spec = BlobSpec {
        deopt_handler: Some(0x300),
        orig_pc_offset: 8,
        ..BlobSpec::nmethod(6, 2)
    };
    let d = jvm.add_blob(&spec);
    let sp0 = STACK + 0x8000;
    let sp1 = jvm.compiled_frame(sp0, 6, 0, d.pc(0x300));
    jvm.memory.put_u64(sp1 + 8, orig_pc(&d));
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sp1 + 6 * 8);
    jvm.compiled_frame(sp1, 6, interp_fp, INTERPRETER_PC);
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(
        walked,
        &[a.frame(0x60), d.frame(recorded_offset)],
        &rest,
        UnwindEnd::Complete,
    );
}

#[test]
fn a_deoptimized_frame_is_recorded_at_its_original_pc() {
    deopt_case(Layout::Pointers, |d| d.pc(0x1a4), 0x1a4);
    deopt_case(Layout::Offsets, |d| d.pc(0x1a4), 0x1a4);
}

#[test]
fn a_deoptimized_frame_with_an_implausible_original_pc_keeps_the_handler() {
    deopt_case(Layout::Pointers, |_| 0x1234, 0x300);
}

// Threads in native or VM code, resumed at their JavaFrameAnchor.

const THREAD_IN_NATIVE: u32 = 4;
const THREAD_IN_VM: u32 = 6;
const THREAD_BLOCKED: u32 = 10;
const THREAD_IN_JAVA: u32 = 8;

/// A thread in `state` sampled in a libc function without frame pointers (rbp unreadable), its
/// anchor at a compiled frame of A whose pc is at `anchor_offset` in A (None: the anchor's pc is
/// 0 and the return address at sp - 8 is at 0x1b0). Returns the walk and the frames expected
/// if it resumes at the anchor.
fn anchor_case(
    state: u32,
    anchor_offset: Option<u64>,
    registered: bool,
) -> ((Vec<UserFrame>, UnwindEnd), Vec<UserFrame>) {
    anchor_case_in(Jvm::new(Layout::Pointers), state, anchor_offset, registered)
}

fn anchor_case_in(
    mut jvm: Jvm,
    state: u32,
    anchor_offset: Option<u64>,
    registered: bool,
) -> ((Vec<UserFrame>, UnwindEnd), Vec<UserFrame>) {
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 3));
    let sp = STACK + 0x8000;
    let (interp_fp, rest) = interpreted_caller(&mut jvm, sp + 6 * 8);
    jvm.compiled_frame(sp, 6, interp_fp, INTERPRETER_PC);
    jvm.memory.put_u64(sp - 8, a.pc(0x1b0));
    if registered {
        let pc = anchor_offset.map_or(0, |offset| a.pc(offset));
        jvm.add_java_thread(TID, state, (sp, pc, 0x99));
    }
    let walked = jvm.walk(TID, regs(LIBC_READ, sp - 0x100, 0x10));
    let mut expected = vec![native(LIBC_READ), a.frame(anchor_offset.unwrap_or(0x1b0))];
    expected.extend(rest);
    (walked, expected)
}

#[test]
fn a_thread_in_native_or_vm_code_resumes_at_its_java_frame_anchor() {
    for state in [THREAD_IN_NATIVE, THREAD_IN_VM, THREAD_BLOCKED] {
        let (walked, expected) = anchor_case(state, Some(0x158), true);
        expect(walked, &expected, &[], UnwindEnd::Complete);
    }
}

#[test]
fn a_blocked_thread_is_told_apart_by_the_monitor_it_waits_for() {
    use profiler_common::JavaState;
    let mut jvm = Jvm::new(Layout::Pointers);
    jvm.add_java_thread(TID, THREAD_BLOCKED, (0, 0, 0));
    let thread = Jvm::java_thread_of(TID);
    let state = |jvm: &Jvm| crate::waiting_state(&jvm.hs, &jvm.memory, thread);
    assert_eq!(state(&jvm), JavaState::Blocked, "parked or sleeping");
    jvm.set_thread_monitors(TID, 0x7000_1000, 0);
    assert_eq!(state(&jvm), JavaState::MonitorEnter);
    jvm.set_thread_monitors(TID, 0, 0x7000_2000);
    assert_eq!(state(&jvm), JavaState::MonitorWait);
    // A JVM without the fields: blocked, whatever the thread's memory holds there.
    jvm.set_thread_monitors(TID, 0x7000_1000, 0x7000_2000);
    jvm.hs.java_thread_pending_monitor = u16::MAX;
    jvm.hs.java_thread_waiting_monitor = u16::MAX;
    assert_eq!(state(&jvm), JavaState::Blocked);
    // Only a blocked thread is looked at: one in native code with a stale field is in native.
    let mut native = Jvm::new(Layout::Pointers);
    native.add_java_thread(TID, THREAD_IN_NATIVE, (0, 0, 0));
    native.set_thread_monitors(TID, 0x7000_1000, 0);
    assert_eq!(state(&native), JavaState::InNative);
}

#[test]
fn thread_states_are_the_ones_the_jvm_exports() {
    // A build whose in-native value is 5: 5 resumes at the anchor, HotSpot's usual 4 does not.
    let mut jvm = Jvm::new(Layout::Pointers);
    jvm.hs.thread_in_native = 5;
    let (walked, expected) = anchor_case_in(jvm, 5, Some(0x158), true);
    expect(walked, &expected, &[], UnwindEnd::Complete);
    let mut jvm = Jvm::new(Layout::Pointers);
    jvm.hs.thread_in_native = 5;
    let (walked, _) = anchor_case_in(jvm, THREAD_IN_NATIVE, Some(0x158), true);
    expect(walked, &[native(LIBC_READ)], &[], UnwindEnd::ReadFailed);
}

#[test]
fn an_anchor_without_a_pc_takes_the_return_address_below_its_sp() {
    let (walked, expected) = anchor_case(THREAD_IN_NATIVE, None, true);
    expect(walked, &expected, &[], UnwindEnd::Complete);
}

#[test]
fn a_thread_in_java_code_or_unknown_is_not_resumed() {
    // In Java code the anchor is stale; without a JavaThread there is none: the native walk's
    // own end stands.
    for (state, registered) in [(THREAD_IN_JAVA, true), (THREAD_IN_NATIVE, false)] {
        let (walked, _) = anchor_case(state, Some(0x158), registered);
        expect(walked, &[native(LIBC_READ)], &[], UnwindEnd::ReadFailed);
    }
}

#[test]
fn the_anchor_is_not_used_once_java_frames_were_walked() {
    // A compiled frame returned into native code whose frame pointers lead nowhere: the anchor
    // (which describes an older Java frame) must not be used.
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 3));
    let sp = STACK + 0x8000;
    jvm.compiled_frame(sp, 6, 0x10, 0x5555_0000_0abc);
    jvm.add_java_thread(TID, THREAD_IN_NATIVE, (sp, a.pc(0x158), 0));
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp, 0));
    expect(
        walked,
        &[a.frame(0x60), native(0x5555_0000_0abc)],
        &[],
        UnwindEnd::ReadFailed,
    );
}

// How walks fail.

#[test]
fn a_frame_whose_caller_is_unmapped_is_kept_and_ends_the_walk_as_a_failed_java_read() {
    // B's frame runs past the end of the mapped stack: B is known (its blob and pc), its
    // caller is not.
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let b = jvm.add_blob(&BlobSpec::nmethod(8, 2));
    let sp0 = STACK_TOP - 6 * 8 - 4 * 8;
    jvm.compiled_frame(sp0, 6, 0, b.pc(0x90));
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(
        walked,
        &[a.frame(0x60), b.frame(0x90)],
        &[],
        UnwindEnd::JavaReadFailed,
    );
}

#[test]
fn a_stub_on_top_whose_rbp_is_not_a_frame_pointer_is_still_recorded() {
    // A stub entered from compiled code, which uses rbp as a general register: the stub's own
    // frame is known, the way to its caller is not.
    let mut jvm = Jvm::new(Layout::Pointers);
    let stub = jvm.add_blob(&BlobSpec::stub());
    let sp = STACK + 0x8000;
    jvm.memory.put_u64(sp, 0x1234);
    let walked = jvm.walk(TID, regs(stub.pc(0x30), sp, 0x42));
    expect(walked, &[stub.frame(0x30)], &[], UnwindEnd::JavaReadFailed);
}

#[test]
fn an_unmapped_method_ends_the_walk_as_a_failed_java_read() {
    // An interpreted frame (under a compiled one) whose Method* points nowhere.
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let method = jvm.add_method(b"Gone", 1, 8);
    let sp0 = STACK + 0x8000;
    let sp1 = sp0 + 6 * 8;
    let fp = sp1 + 0x40;
    jvm.compiled_frame(sp0, 6, fp, INTERPRETER_PC);
    jvm.interpreter_frame(
        fp,
        InterpreterFrame {
            method: Method {
                addr: 0x1000,
                ..method
            },
            bcp: 0,
            sender_sp: fp + 16,
            saved_fp: 0,
            return_address: 0,
        },
    );
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(walked, &[a.frame(0x60)], &[], UnwindEnd::JavaReadFailed);
}

#[test]
fn an_unreadable_frame_pointer_ends_a_native_walk_as_a_failed_read() {
    let mut memory = FakeMemory::default();
    memory.map(STACK, 0x1000);
    let fp = STACK + 0xf00;
    memory.put_u64(fp, STACK + 0x2000);
    memory.put_u64(fp + 8, 0x5555_0000_0200);
    memory.unmap(STACK + 0x2000);
    let walked = walk_process(&memory, None, TID, regs(0x5555_0000_0100, fp - 0x40, fp));
    expect(
        walked,
        &[native(0x5555_0000_0100), native(0x5555_0000_0200)],
        &[],
        UnwindEnd::ReadFailed,
    );
}

#[test]
fn a_return_address_into_the_code_cache_but_no_blob_ends_the_walk() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    // Below the code heap (no heap covers it), and in free segments of the heap.
    for garbage in [CODE_LOW + 0x9800, HEAP_HIGH - 0x1000] {
        let sp0 = STACK + 0x8000;
        jvm.compiled_frame(sp0, 6, 0, garbage);
        let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
        expect(walked, &[a.frame(0x60)], &[], UnwindEnd::NoCodeBlob);
    }
}

#[test]
fn a_garbage_return_address_outside_the_code_cache_is_one_native_frame() {
    // Not code at all: recorded as a native frame, whose frame pointer (the compiled frame's
    // saved rbp, garbage) cannot be read.
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let sp0 = STACK + 0x8000;
    jvm.compiled_frame(sp0, 6, 0x42, 0x1234);
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(
        walked,
        &[a.frame(0x60), native(0x1234)],
        &[],
        UnwindEnd::ReadFailed,
    );
}

#[test]
fn a_frame_size_over_the_bound_is_a_bad_java_frame() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let a = jvm.add_blob(&BlobSpec::nmethod(6, 1));
    let huge = jvm.add_blob(&BlobSpec::nmethod(4097, 2));
    let sp0 = STACK + 0x8000;
    jvm.compiled_frame(sp0, 6, 0, huge.pc(0x80));
    let walked = jvm.walk(TID, regs(a.pc(0x60), sp0, 0));
    expect(walked, &[a.frame(0x60)], &[], UnwindEnd::BadJavaFrame);
    // On top too.
    let walked = jvm.walk(TID, regs(huge.pc(0x80), sp0, 0));
    expect(walked, &[], &[], UnwindEnd::BadJavaFrame);
}

#[test]
fn an_interpreted_frame_below_its_sp_is_a_bad_java_frame() {
    let jvm = Jvm::new(Layout::Pointers);
    let sp = STACK + 0x8000;
    let walked = jvm.walk(TID, regs(INTERPRETER_LOW + 0x500, sp, sp - 0x10));
    expect(walked, &[], &[], UnwindEnd::BadJavaFrame);
}

#[test]
fn a_stack_deeper_than_the_record_is_cut_at_max_depth() {
    let mut jvm = Jvm::new(Layout::Pointers);
    let r = jvm.add_blob(&BlobSpec::nmethod(2, 9));
    let sp0 = STACK + 0x100;
    let mut sp = sp0;
    for _ in 0..1100 {
        sp = jvm.compiled_frame(sp, 2, 0, r.pc(0x70));
    }
    let (frames, end) = jvm.walk(TID, regs(r.pc(0x50), sp0, 0));
    assert_eq!(end, UnwindEnd::MaxDepth);
    assert_eq!(frames.len(), profiler_common::MAX_USER_FRAMES);
    assert_eq!(frames[0], r.frame(0x50));
    assert!(frames[1..].iter().all(|frame| *frame == r.frame(0x70)));
}
