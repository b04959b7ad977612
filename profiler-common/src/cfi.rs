//! Native unwind tables: each executable file's DWARF call frame information (`.eh_frame`, or
//! `.debug_frame`), reduced by the daemon to the few rules x86_64 compilers emit, as rows the
//! BPF walker binary-searches by pc.
//!
//! A row holds from its `pc` to the next row's. On x86_64 the return address is always the word
//! below the CFA (the caller's sp after the return), so a row says only how to find the CFA and
//! where the caller's rbp was saved.

/// How a row finds the CFA (the caller's sp once this frame returns), or why it cannot.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CfaKind {
    /// No call frame information covers this pc (between functions, or code the tables omit):
    /// the walker falls back to frame pointers.
    None = 0,
    /// CFA = rsp + `cfa_offset`.
    Rsp = 1,
    /// CFA = rbp + `cfa_offset` (a function that keeps a frame pointer).
    Rbp = 2,
    /// A PLT stub's expression: CFA = rsp + 8, plus 8 once the stub has pushed its argument
    /// (pc & 15 >= 11): what GCC and binutils emit for `.plt` sections.
    Plt = 3,
    /// The outermost frame: the return address is undefined (`_start`, a thread's start).
    Outermost = 4,
    /// A rule this table cannot express (another register, a general expression, a signal
    /// frame): the walker falls back to frame pointers.
    Unsupported = 5,
}

impl CfaKind {
    pub const fn from_u8(value: u8) -> Option<Self> {
        match value {
            0 => Some(Self::None),
            1 => Some(Self::Rsp),
            2 => Some(Self::Rbp),
            3 => Some(Self::Plt),
            4 => Some(Self::Outermost),
            5 => Some(Self::Unsupported),
            _ => None,
        }
    }
}

/// `CfiRow::rbp_slot` when rbp is not saved in this frame (it still holds the caller's value).
pub const RBP_UNCHANGED: i8 = 0;

/// One row of a file's unwind table, 8 bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CfiRow {
    /// Where the row starts: an ELF virtual address of the file (the daemon refuses files whose
    /// code lies above 4 GiB).
    pub pc: u32,
    /// Bytes added to the CFA's register ([`CfaKind::Rsp`], [`CfaKind::Rbp`]).
    pub cfa_offset: u16,
    /// Where the caller's rbp is saved, in 8-byte words from the CFA (e.g. -2: at CFA - 16), or
    /// [`RBP_UNCHANGED`].
    pub rbp_slot: i8,
    /// A [`CfaKind`].
    pub kind: u8,
}

impl CfiRow {
    pub const fn new(pc: u32, kind: CfaKind, cfa_offset: u16, rbp_slot: i8) -> Self {
        Self {
            pc,
            cfa_offset,
            rbp_slot,
            kind: kind as u8,
        }
    }

    pub const fn kind(&self) -> Option<CfaKind> {
        CfaKind::from_u8(self.kind)
    }

    /// Whether `other` unwinds the same way (rows that do are merged).
    pub const fn same_rule(&self, other: &Self) -> bool {
        self.kind == other.kind
            && self.cfa_offset == other.cfa_offset
            && self.rbp_slot == other.rbp_slot
    }
}

/// The row covering `pc` among `len` rows sorted by `pc`, read through `row_at` (a BPF map or a
/// slice): the last row starting at or before `pc`. A bounded binary search: at most
/// [`CFI_SEARCH_STEPS`] probes, enough for 2^24 rows.
#[inline(always)]
pub fn find_cfi_row(
    len: u32,
    pc: u32,
    mut row_at: impl FnMut(u32) -> Option<CfiRow>,
) -> Option<CfiRow> {
    let (mut low, mut high) = (0u32, len);
    // Invariant: rows below `low` start at or before pc; rows from `high` start after it.
    let mut step = 0;
    while low < high && step < CFI_SEARCH_STEPS {
        let mid = low + (high - low) / 2;
        if row_at(mid)?.pc <= pc {
            low = mid + 1;
        } else {
            high = mid;
        }
        step += 1;
    }
    if low == 0 || low < high {
        return None;
    }
    row_at(low - 1)
}

/// Probes of [`find_cfi_row`].
pub const CFI_SEARCH_STEPS: u32 = 24;

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> [CfiRow; 4] {
        [
            CfiRow::new(0x1000, CfaKind::Rsp, 8, RBP_UNCHANGED),
            CfiRow::new(0x1004, CfaKind::Rsp, 16, -2),
            CfiRow::new(0x1010, CfaKind::Rbp, 16, -2),
            CfiRow::new(0x1040, CfaKind::None, 0, RBP_UNCHANGED),
        ]
    }

    fn find(pc: u32) -> Option<CfiRow> {
        let rows = rows();
        find_cfi_row(rows.len() as u32, pc, |i| rows.get(i as usize).copied())
    }

    #[test]
    fn the_row_is_the_last_one_starting_at_or_before_the_pc() {
        assert_eq!(find(0xfff), None);
        assert_eq!(find(0x1000), Some(rows()[0]));
        assert_eq!(find(0x1003), Some(rows()[0]));
        assert_eq!(find(0x1004), Some(rows()[1]));
        assert_eq!(find(0x103f), Some(rows()[2]));
        assert_eq!(find(0x1040), Some(rows()[3]));
        assert_eq!(find(u32::MAX), Some(rows()[3]));
    }

    #[test]
    fn every_pc_of_a_large_table_is_found_within_the_step_bound() {
        let rows: [CfiRow; 1000] =
            core::array::from_fn(|i| CfiRow::new(16 * i as u32, CfaKind::Rsp, i as u16, 0));
        for pc in (0..16_000).step_by(7) {
            let found = find_cfi_row(1000, pc, |i| rows.get(i as usize).copied());
            assert_eq!(found.map(|r| r.pc), Some(pc / 16 * 16));
        }
    }
}
