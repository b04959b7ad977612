//! How far a compiled Java frame is built when a sample lands in its prologue or epilogue, read
//! from the x86_64 instructions HotSpot's compilers emit there. Pure functions over bytes copied
//! from the code cache: the BPF unwinder calls them on the top frame, and host tests feed them
//! instruction bytes recorded from live JVMs.
//!
//! HotSpot's x86_64 prologue (`MacroAssembler::verified_entry`) comes in two shapes:
//! - with a stack bang: `mov [rsp - N], eax` (bang), `push rbp`, `sub rsp, M`;
//! - without one (small leaf methods): `sub rsp, M`, `mov [rsp + M - 8], rbp`.
//!
//! Either may be followed by an nmethod entry barrier (`cmp dword [r15 + d], imm; jne`) before
//! `_frame_complete_offset`, so that offset alone does not say whether the frame is built. The
//! epilogue is `add rsp, M; pop rbp`, then a return safepoint poll (`cmp rsp, [r15 + d]; ja`
//! from JDK 17; `mov r10, [r15 + d]; test [r10], eax` in 11), then `ret`. The same
//! `mov r10`/`test` pair also polls inside loops, where the frame is whole: only a `pop rbp`
//! right before it makes it an epilogue.

/// Where the return address of a compiled frame is, by how much of the frame is on the stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameState {
    /// Nothing pushed yet, or everything popped: the return address is at sp and rbp holds the
    /// caller's value.
    NothingPushed,
    /// Only rbp is pushed: the saved rbp is at sp, the return address at sp + 8.
    RbpPushed,
    /// The whole frame (`_frame_size` words, the return address and saved rbp at its top).
    Built,
    /// The frame is allocated but rbp is not yet stored in it (prologue without a stack bang):
    /// the return address is at the frame's top and rbp still holds the caller's value.
    BuiltRbpLive,
}

/// Bytes read from the verified entry point to decode a prologue: the longest prologue before
/// the entry barrier is a bang (7), `push rbp` (1) and `sub rsp, imm32` (7).
pub const PROLOGUE_BYTES: usize = 32;

/// Bytes read around a pc to decode an epilogue: [`EPILOGUE_BEFORE`] before it, the rest from it.
pub const EPILOGUE_BYTES: usize = 16;
pub const EPILOGUE_BEFORE: usize = 8;

/// The frame's state at `pc_offset` bytes past the verified entry point whose first
/// [`PROLOGUE_BYTES`] are `entry`. None if the bytes are not a prologue HotSpot emits, or if
/// `pc_offset` is past the prologue (the frame is then [`FrameState::Built`], but the caller
/// knows that from `_frame_complete_offset` more reliably).
#[inline(always)]
pub fn prologue_state(entry: &[u8; PROLOGUE_BYTES], pc_offset: u64) -> Option<FrameState> {
    let mut at = 0usize;
    if entry[0] == 0x89 && entry[1] == 0x84 && entry[2] == 0x24 {
        // mov [rsp + disp32], eax: the stack bang.
        at = 7;
    }
    if entry[at] == 0x55 {
        // push rbp; then sub rsp, M (absent when the frame is only the return address and rbp).
        let push_at = at as u64;
        let sub_at = push_at + 1;
        if pc_offset <= push_at {
            return Some(FrameState::NothingPushed);
        }
        let sub_len = sub_rsp_len(entry, sub_at as usize);
        if sub_len == 0 || pc_offset <= sub_at {
            return Some(FrameState::RbpPushed);
        }
        return Some(FrameState::Built);
    }
    let sub_len = sub_rsp_len(entry, at);
    if sub_len == 0 || at != 0 {
        // A bang not followed by push rbp, or no known first instruction: not a prologue.
        return None;
    }
    let mov_at = sub_len as u64;
    if pc_offset == 0 {
        return Some(FrameState::NothingPushed);
    }
    let mov_len = mov_rbp_to_stack_len(entry, mov_at as usize);
    if mov_len == 0 {
        return None;
    }
    if pc_offset <= mov_at {
        return Some(FrameState::BuiltRbpLive);
    }
    Some(FrameState::Built)
}

/// The frame's state if the instruction at the sampled pc belongs to an epilogue; `code` holds
/// [`EPILOGUE_BEFORE`] bytes before the pc and the bytes from it. None: not an epilogue
/// instruction, the frame is whole.
#[inline(always)]
pub fn epilogue_state(code: &[u8; EPILOGUE_BYTES]) -> Option<FrameState> {
    const PC: usize = EPILOGUE_BEFORE;
    let at = |i: usize| code[PC + i];
    let before = |i: usize| code[PC - i];
    const POP_RBP: u8 = 0x5d;
    match at(0) {
        // ret
        0xc3 => return Some(FrameState::NothingPushed),
        // pop rbp
        POP_RBP => return Some(FrameState::RbpPushed),
        _ => {}
    }
    // The return poll's first instruction right after `pop rbp`: `cmp rsp, [r15 + d8/d32]`
    // (JDK 17+) or `mov r10, [r15 + d8/d32]` (JDK 11).
    let cmp_rsp_r15 = |modrm: u8| modrm == 0x67 || modrm == 0xa7;
    let mov_r10_r15 = |modrm: u8| modrm == 0x57 || modrm == 0x97;
    if before(1) == POP_RBP
        && ((at(0) == 0x49 && at(1) == 0x3b && cmp_rsp_r15(at(2)))
            || (at(0) == 0x4d && at(1) == 0x8b && mov_r10_r15(at(2))))
    {
        return Some(FrameState::NothingPushed);
    }
    // The poll's second instruction (`ja slow_path` or `test [r10], eax`) after `pop rbp` and
    // the first instruction with an 8- or 32-bit displacement.
    let is_ja = at(0) == 0x0f && at(1) == 0x87;
    let is_test_r10 = at(0) == 0x41 && at(1) == 0x85 && at(2) == 0x02;
    if !is_ja && !is_test_r10 {
        return None;
    }
    let first_is = |len: usize| {
        let start = PC - len;
        let (b0, b1, modrm) = (code[start], code[start + 1], code[start + 2]);
        let disp8 = len == 4 && (modrm == 0x67 || modrm == 0x57);
        let disp32 = len == 7 && (modrm == 0xa7 || modrm == 0x97);
        let opcode = if is_ja {
            b0 == 0x49 && b1 == 0x3b && cmp_rsp_r15(modrm)
        } else {
            b0 == 0x4d && b1 == 0x8b && mov_r10_r15(modrm)
        };
        code[start - 1] == POP_RBP && opcode && (disp8 || disp32)
    };
    if first_is(4) || first_is(7) {
        return Some(FrameState::NothingPushed);
    }
    None
}

/// Length of `sub rsp, imm8` (4) or `sub rsp, imm32` (7) at `at`, else 0.
#[inline(always)]
fn sub_rsp_len(code: &[u8; PROLOGUE_BYTES], at: usize) -> usize {
    if at + 3 > PROLOGUE_BYTES || code[at] != 0x48 || code[at + 2] != 0xec {
        return 0;
    }
    match code[at + 1] {
        0x83 => 4,
        0x81 => 7,
        _ => 0,
    }
}

/// Length of `mov [rsp + disp8], rbp` (5) or `mov [rsp + disp32], rbp` (8) at `at`, else 0.
#[inline(always)]
fn mov_rbp_to_stack_len(code: &[u8; PROLOGUE_BYTES], at: usize) -> usize {
    if at + 4 > PROLOGUE_BYTES || code[at] != 0x48 || code[at + 1] != 0x89 || code[at + 3] != 0x24 {
        return 0;
    }
    match code[at + 2] {
        0x6c => 5,
        0xac => 8,
        _ => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes<const N: usize>(hex: &str) -> [u8; N] {
        let mut out = [0u8; N];
        for (slot, byte) in out.iter_mut().zip(hex.split_whitespace()) {
            *slot = u8::from_str_radix(byte, 16).expect("a hex byte");
        }
        out
    }

    /// A C2 prologue recorded from JDK 25 (H2): bang, push rbp, sub rsp 0x20, entry barrier
    /// `cmp dword [r15+0x20], 1; jne`. Its `_frame_complete_offset` is 26 past the entry.
    const BANG_PUSH_SUB_BARRIER: &str =
        "89 84 24 00 c0 fe ff 55 48 83 ec 20 41 81 7f 20 01 00 00 00 0f 85 c8 01 00 00 48 3b f2";

    #[test]
    fn a_prologue_with_a_stack_bang_pushes_rbp_then_allocates() {
        let entry = bytes::<PROLOGUE_BYTES>(BANG_PUSH_SUB_BARRIER);
        assert_eq!(prologue_state(&entry, 0), Some(FrameState::NothingPushed));
        assert_eq!(prologue_state(&entry, 7), Some(FrameState::NothingPushed));
        assert_eq!(prologue_state(&entry, 8), Some(FrameState::RbpPushed));
        // At the entry barrier's cmp and jne (before `_frame_complete_offset`): built.
        assert_eq!(prologue_state(&entry, 12), Some(FrameState::Built));
        assert_eq!(prologue_state(&entry, 20), Some(FrameState::Built));
    }

    #[test]
    fn a_prologue_with_a_32_bit_frame_size_and_a_nop() {
        // JDK 25, `sub rsp, 0x80` then a nop and the barrier.
        let entry = bytes::<PROLOGUE_BYTES>(
            "89 84 24 00 c0 fe ff 55 48 81 ec 80 00 00 00 90 41 81 7f 20 01 00 00 00 0f 85",
        );
        assert_eq!(prologue_state(&entry, 8), Some(FrameState::RbpPushed));
        assert_eq!(prologue_state(&entry, 15), Some(FrameState::Built));
    }

    #[test]
    fn a_prologue_without_a_bang_allocates_then_stores_rbp() {
        let entry = bytes::<PROLOGUE_BYTES>("48 83 ec 18 48 89 6c 24 10 41 81 7f 20 01 00 00 00");
        assert_eq!(prologue_state(&entry, 0), Some(FrameState::NothingPushed));
        assert_eq!(prologue_state(&entry, 4), Some(FrameState::BuiltRbpLive));
        assert_eq!(prologue_state(&entry, 9), Some(FrameState::Built));
    }

    #[test]
    fn bytes_that_are_no_prologue_are_not_decoded() {
        let garbage = bytes::<PROLOGUE_BYTES>("44 8b 56 08 49 3b c2 0f 85 00 00 00 00");
        assert_eq!(prologue_state(&garbage, 3), None);
        let bang_only = bytes::<PROLOGUE_BYTES>("89 84 24 00 c0 fe ff 90 90");
        assert_eq!(prologue_state(&bang_only, 8), None);
    }

    /// Epilogues recorded from JDK 25: the bytes from pc - 8.
    #[test]
    fn the_return_poll_after_pop_rbp_is_an_epilogue() {
        // `add rsp, 0x70; pop rbp; cmp rsp, [r15+0x28]` | `ja`: sampled on the ja.
        let at_ja = bytes::<EPILOGUE_BYTES>("48 83 c4 70 5d 49 3b 67 28 0f 87 2a 0a 00 00 c3");
        let mut shifted = [0u8; EPILOGUE_BYTES];
        shifted[..EPILOGUE_BYTES - 1].copy_from_slice(&at_ja[1..]);
        assert_eq!(epilogue_state(&shifted), Some(FrameState::NothingPushed));
        // Sampled on the cmp, on pop rbp and on ret.
        let at_cmp = bytes::<EPILOGUE_BYTES>("00 00 00 48 83 c4 70 5d 49 3b 67 28 0f 87 2a 0a");
        assert_eq!(epilogue_state(&at_cmp), Some(FrameState::NothingPushed));
        let at_pop = bytes::<EPILOGUE_BYTES>("00 00 00 00 48 83 c4 70 5d 49 3b 67 28 0f 87 2a");
        assert_eq!(epilogue_state(&at_pop), Some(FrameState::RbpPushed));
        let at_ret = bytes::<EPILOGUE_BYTES>("5d 49 3b 67 28 0f 87 2a c3 00 00 00 00 00 00 00");
        assert_eq!(epilogue_state(&at_ret), Some(FrameState::NothingPushed));
        // A 32-bit displacement: `cmp rsp, [r15+0x100]; ja`.
        let wide = bytes::<EPILOGUE_BYTES>("5d 49 3b a7 00 01 00 00 0f 87 10 00 00 00 c3 00");
        assert_eq!(epilogue_state(&wide), Some(FrameState::NothingPushed));
    }

    #[test]
    fn a_loop_safepoint_poll_is_not_an_epilogue() {
        // `mov r10, [r15+0x30]` | `test [r10], eax` inside a loop (JDK 25, H2), frame whole.
        let at_test = bytes::<EPILOGUE_BYTES>("45 85 d2 0f 85 83 f9 ff 4d 8b 57 30 41 85 02 44");
        let mut shifted = [0u8; EPILOGUE_BYTES];
        shifted[..12].copy_from_slice(&at_test[4..]);
        // Now pc (index 8) is at `41 85 02`, preceded by `4d 8b 57 30` and not by pop rbp.
        assert_eq!(&shifted[8..11], &[0x41, 0x85, 0x02]);
        assert_eq!(epilogue_state(&shifted), None);
        let at_mov = bytes::<EPILOGUE_BYTES>("8b 48 2c 45 85 d2 0f 85 4d 8b 57 30 41 85 02 44");
        assert_eq!(epilogue_state(&at_mov), None);
        // A `ja` in a method body is not one either.
        let body_ja = bytes::<EPILOGUE_BYTES>("48 8b 5c 24 28 4c 3b c3 0f 87 45 00 00 00 8b c3");
        assert_eq!(epilogue_state(&body_ja), None);
    }

    #[test]
    fn the_jdk_11_return_poll_after_pop_rbp_is_an_epilogue() {
        // `pop rbp; mov r10, [r15+0x108]; test [r10], eax; ret`: sampled on the test.
        let at_test = bytes::<EPILOGUE_BYTES>("5d 4d 8b 97 08 01 00 00 41 85 02 c3 00 00 00 00");
        assert_eq!(epilogue_state(&at_test), Some(FrameState::NothingPushed));
        let at_mov = bytes::<EPILOGUE_BYTES>("00 00 00 48 83 c4 20 5d 4d 8b 97 08 01 00 00 41");
        assert_eq!(epilogue_state(&at_mov), Some(FrameState::NothingPushed));
    }
}
