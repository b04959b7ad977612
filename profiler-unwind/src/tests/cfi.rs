//! Native frames walked by unwind table rows (`profiler_common::cfi`), with frame pointers as
//! the fallback where no row applies.

use profiler_common::cfi::{CfaKind, CfiRow, RBP_UNCHANGED};
use profiler_common::UnwindEnd;

use super::expect;
use super::TID;
use crate::fakes::*;
use crate::UserRegs;

/// A library mapped at `LIB` whose ELF addresses start at 0 (bias = LIB).
const LIB: u64 = 0x7f10_0000_0000;
/// An executable without a table (frame pointers only).
const MAIN_RETURN: u64 = 0x40_1234;

fn row(pc: u32, kind: CfaKind, cfa_offset: u16, rbp_slot: i8) -> CfiRow {
    CfiRow::new(pc, kind, cfa_offset, rbp_slot)
}

/// The library's table: a frameless leaf, a function that pushes rbx (no frame pointer), one
/// that builds an rbp frame, a gap, `_start`, a PLT entry.
fn library_rows() -> Vec<CfiRow> {
    vec![
        // leaf: 0x1000..0x1010, nothing pushed.
        row(0x1000, CfaKind::Rsp, 8, RBP_UNCHANGED),
        // hot: 0x1100..0x1140, `push rbx` then the body, `pop rbx` at 0x1130.
        row(0x1101, CfaKind::Rsp, 16, RBP_UNCHANGED),
        row(0x1130, CfaKind::Rsp, 8, RBP_UNCHANGED),
        // run_loop: 0x1200..0x1240, `push rbp; mov rbp, rsp`.
        row(0x1201, CfaKind::Rsp, 16, -2),
        row(0x1204, CfaKind::Rbp, 16, -2),
        row(0x1240, CfaKind::None, 0, RBP_UNCHANGED),
        // _start: the outermost frame.
        row(0x1300, CfaKind::Outermost, 0, RBP_UNCHANGED),
        row(0x1310, CfaKind::None, 0, RBP_UNCHANGED),
        // A PLT entry: push at +6, jump at +11.
        row(0x2000, CfaKind::Plt, 11, RBP_UNCHANGED),
        row(0x2010, CfaKind::None, 0, RBP_UNCHANGED),
    ]
}

/// leaf <- hot <- run_loop <- main (frame pointers, no table) <- _start. Returns the memory,
/// the registers at the sample, and the frames a table walk records.
fn frameless_stack(with_tables: bool) -> (FakeMemory, UserRegs, Vec<u64>) {
    let mut memory = FakeMemory::default();
    memory.map(STACK, (STACK_TOP - STACK) as usize);
    if with_tables {
        memory.add_table(LIB, LIB + 0x10_0000, LIB, library_rows());
    }
    let s = STACK + 0x8000;
    // leaf (sp = s): returns into hot.
    memory.put_u64(s, LIB + 0x1120);
    // hot (sp = s + 8): rbx pushed at s + 8, returns into run_loop.
    memory.put_u64(s + 8, 0xdead);
    memory.put_u64(s + 16, LIB + 0x1220);
    // run_loop (sp = s + 24): locals, then its rbp frame at s + 32: main's fp and the return.
    let main_fp = STACK + 0x9000;
    memory.put_u64(s + 32, main_fp);
    memory.put_u64(s + 40, MAIN_RETURN);
    // main (frame pointers): returns into _start.
    memory.put_u64(main_fp, 0);
    memory.put_u64(main_fp + 8, LIB + 0x1305);
    let regs = regs(LIB + 0x1008, s, s + 32);
    let frames = vec![
        LIB + 0x1008,
        LIB + 0x1120,
        LIB + 0x1220,
        MAIN_RETURN,
        LIB + 0x1305,
    ];
    (memory, regs, frames)
}

#[test]
fn a_frameless_leaf_keeps_its_callers_with_tables() {
    let (memory, regs, frames) = frameless_stack(true);
    let walked = walk_process(&memory, None, TID, regs);
    expect(walked, &frames.map_native(), &[], UnwindEnd::Complete);
}

#[test]
fn without_tables_frame_pointers_skip_the_frameless_callers() {
    // What every frame-pointer profiler shows: the leaf, then straight to run_loop's caller.
    let (memory, regs, frames) = frameless_stack(false);
    let walked = walk_process(&memory, None, TID, regs);
    let skipped = [frames[0], frames[3], frames[4]];
    expect(walked, &skipped.map(native), &[], UnwindEnd::Complete);
}

#[test]
fn return_addresses_take_the_row_of_their_call() {
    // hot ends with a call (to a function that does not return): its return address is the
    // first byte of run_loop, whose row (CFA = rsp + 8) is not the call's (CFA = rsp + 16, rbx
    // pushed). The call's row must apply.
    let rows = vec![
        row(0x1000, CfaKind::Rsp, 8, RBP_UNCHANGED),
        row(0x1101, CfaKind::Rsp, 16, RBP_UNCHANGED),
        row(0x1200, CfaKind::Rsp, 8, RBP_UNCHANGED),
        row(0x1201, CfaKind::Rsp, 16, -2),
        row(0x1204, CfaKind::Rbp, 16, -2),
        row(0x1240, CfaKind::None, 0, RBP_UNCHANGED),
        row(0x1300, CfaKind::Outermost, 0, RBP_UNCHANGED),
    ];
    let (mut memory, regs, mut frames) = frameless_stack(false);
    memory.add_table(LIB, LIB + 0x10_0000, LIB, rows);
    let s = STACK + 0x8000;
    memory.put_u64(s, LIB + 0x1200);
    frames[1] = LIB + 0x1200;
    let walked = walk_process(&memory, None, TID, regs);
    expect(walked, &frames.map_native(), &[], UnwindEnd::Complete);
}

#[test]
fn plt_entries_unwind_before_and_after_their_push() {
    for (offset, cfa) in [(0x2004u64, 8u64), (0x200b, 16)] {
        let mut memory = FakeMemory::default();
        memory.map(STACK, (STACK_TOP - STACK) as usize);
        memory.add_table(LIB, LIB + 0x10_0000, LIB, library_rows());
        let s = STACK + 0x8000;
        memory.put_u64(s + cfa - 8, LIB + 0x1305);
        let walked = walk_process(&memory, None, TID, regs(LIB + offset, s, 0));
        expect(
            walked,
            &[native(LIB + offset), native(LIB + 0x1305)],
            &[],
            UnwindEnd::Complete,
        );
    }
}

#[test]
fn a_rule_whose_caller_is_not_above_ends_the_walk() {
    // run_loop's rbp rule with an rbp below sp: the CFA would go down the stack.
    let mut memory = FakeMemory::default();
    memory.map(STACK, (STACK_TOP - STACK) as usize);
    memory.add_table(LIB, LIB + 0x10_0000, LIB, library_rows());
    let s = STACK + 0x8000;
    let walked = walk_process(&memory, None, TID, regs(LIB + 0x1210, s, s - 0x100));
    expect(
        walked,
        &[native(LIB + 0x1210)],
        &[],
        UnwindEnd::NotMonotonic,
    );
}

trait MapNative {
    fn map_native(&self) -> Vec<profiler_common::UserFrame>;
}

impl MapNative for Vec<u64> {
    fn map_native(&self) -> Vec<profiler_common::UserFrame> {
        self.iter().map(|pc| native(*pc)).collect()
    }
}

/// A thread of a JVM trapped at a breakpoint on `run_loop`'s first instruction (`push rbp`,
/// not yet run), sampled in the kernel before the kernel set its pc back: pc one byte on, the
/// return address into main on top of the stack, rbp still main's. `breakpoints` are the
/// process's, as the daemon pushed them.
fn trapped_at_run_loop(
    breakpoints: [u64; profiler_common::MAX_BREAKPOINTS],
    entered_kernel: bool,
) -> (Vec<profiler_common::UserFrame>, UnwindEnd) {
    let mut memory = FakeMemory::default();
    memory.map(STACK, (STACK_TOP - STACK) as usize);
    memory.add_table(LIB, LIB + 0x10_0000, LIB, library_rows());
    let s = STACK + 0x8000;
    memory.put_u64(s, MAIN_RETURN);
    let main_fp = STACK + 0x9000;
    memory.put_u64(main_fp, 0);
    memory.put_u64(main_fp + 8, LIB + 0x1305);
    let jvm = profiler_common::HotspotProc {
        breakpoints,
        ..Default::default()
    };
    let regs = UserRegs {
        entered_kernel,
        ..regs(LIB + 0x1201, s, main_fp)
    };
    walk_process(&memory, Some(&jvm), TID, regs)
}

#[test]
fn a_thread_trapped_at_a_breakpoint_is_walked_from_the_probed_instruction() {
    let frames = vec![LIB + 0x1200, MAIN_RETURN, LIB + 0x1305];
    let walked = trapped_at_run_loop([0, LIB + 0x1200, 0, 0, 0], true);
    expect(walked, &frames.map_native(), &[], UnwindEnd::Complete);
    // Without the breakpoint listed, the row one byte on has rbp pushed: the walk goes astray.
    let (astray, _) = trapped_at_run_loop([0; profiler_common::MAX_BREAKPOINTS], true);
    assert_ne!(astray, frames.map_native());
}

#[test]
fn a_pc_one_byte_past_a_breakpoint_in_user_code_is_taken_as_it_is() {
    // Interrupted in user code, one byte past the breakpoint is the next instruction, the
    // probed one emulated: the pc is where the thread is.
    let (walked, _) = trapped_at_run_loop([LIB + 0x1200, 0, 0, 0, 0], false);
    assert_eq!(walked.first(), Some(&native(LIB + 0x1201)));
}

/// A caller with a stack frame over 64 KiB (a 70,000-byte buffer; rustc's compiler closure
/// takes 527 KiB): its row counts the CFA's offset in 16 bytes ([`CfaKind::Rsp16`]), and the
/// walk goes on past it to its own caller.
#[test]
fn a_caller_with_a_frame_over_64_kib_keeps_its_own_caller() {
    const BIG_STACK: u64 = 0x7ffd_0000_0000;
    // CFA - sp at the big function's call site: a multiple of 16, over 65,535.
    const BIG_FRAME: u64 = 70_000;
    let mut memory = FakeMemory::default();
    memory.map(BIG_STACK, 0x2_0000);
    memory.add_table(
        LIB,
        LIB + 0x10_0000,
        LIB,
        vec![
            // leaf: 0x1000..0x1010, nothing pushed.
            row(0x1000, CfaKind::Rsp, 8, RBP_UNCHANGED),
            // big: 0x1100..0x1140, its frame built, rbp saved at CFA - 16.
            row(0x1100, CfaKind::Rsp16, (BIG_FRAME / 16) as u16, -2),
            row(0x1140, CfaKind::None, 0, RBP_UNCHANGED),
            // _start: the outermost frame.
            row(0x1300, CfaKind::Outermost, 0, RBP_UNCHANGED),
            row(0x1310, CfaKind::None, 0, RBP_UNCHANGED),
        ],
    );
    let s = BIG_STACK + 0x100;
    // leaf (sp = s): returns into big.
    memory.put_u64(s, LIB + 0x1120);
    // big (sp = s + 8): its return address just below its CFA, the caller's rbp below that.
    let cfa = s + 8 + BIG_FRAME;
    memory.put_u64(cfa - 8, LIB + 0x1305);
    memory.put_u64(cfa - 16, 0);
    let walked = walk_process(&memory, None, TID, regs(LIB + 0x1008, s, 0));
    let frames = vec![LIB + 0x1008, LIB + 0x1120, LIB + 0x1305];
    expect(walked, &frames.map_native(), &[], UnwindEnd::Complete);
}
