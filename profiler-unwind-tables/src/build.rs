//! Builds a file's unwind table ([`CfiRow`]s) from its DWARF call frame information with
//! `gimli`: `.eh_frame` where the file has one (every shared library and executable built with
//! unwind tables, the default on x86_64), `.debug_frame` otherwise.
//!
//! The file comes from a profiled process (any container's binaries, read as root): it is
//! untrusted. Parsing is bounded by the rows kept ([`BuildLimits`]); a malformed FDE is skipped
//! (its range falls back to frame pointers) and counted, never a panic.

use gimli::{
    BaseAddresses, CfaRule, CieOrFde, DebugFrame, EhFrame, Register, RegisterRule, UnwindContext,
    UnwindSection, UnwindTableRow,
};
use object::{Object as _, ObjectSection as _, ReadRef};
use profiler_common::cfi::{CfaKind, CfiRow, RBP_UNCHANGED};

type Reader<'a> = gimli::EndianSlice<'a, gimli::LittleEndian>;

/// x86_64 DWARF register numbers.
const RBP: Register = Register(6);
const RSP: Register = Register(7);
const RETURN_ADDRESS: Register = Register(16);

/// The CFA expression GCC and binutils give `.plt` entries: rsp + 8, plus 8 once the entry's
/// `push` has run: `breg7 8; breg16 0; lit15; and; lit<N>; ge; lit3; shl; plus` (N = 11, or 10
/// in some linkers' layouts).
const PLT_EXPRESSION_HEAD: [u8; 6] = [0x77, 0x08, 0x80, 0x00, 0x3f, 0x1a];
const PLT_EXPRESSION_TAIL: [u8; 4] = [0x2a, 0x33, 0x24, 0x22];
const DW_OP_LIT0: u8 = 0x30;

/// Bounds on one file's table.
#[derive(Clone, Copy, Debug)]
pub struct BuildLimits {
    /// Rows kept before the build gives up (8 bytes each in the BPF map).
    pub max_rows: usize,
}

impl Default for BuildLimits {
    fn default() -> Self {
        // libjvm, the largest file on a JVM host, has about 600 K rows.
        Self { max_rows: 4 << 20 }
    }
}

/// A built table, sorted by `pc`, adjacent rows with the same rule merged.
#[derive(Debug, Default)]
pub struct UnwindTable {
    pub rows: Vec<CfiRow>,
    /// FDEs that could not be parsed or evaluated (their code falls back to frame pointers).
    pub skipped_fdes: usize,
    /// Which section the rows come from.
    pub source: CfiSource,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CfiSource {
    #[default]
    EhFrame,
    DebugFrame,
}

#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("not an ELF file: {0}")]
    Elf(#[from] object::Error),
    #[error("not x86_64 code")]
    NotX86_64,
    #[error("no .eh_frame or .debug_frame section")]
    NoCallFrameInfo,
    #[error("call frame information unreadable: {0}")]
    Cfi(#[from] gimli::Error),
    #[error("more than {max_rows} unwind rows")]
    TooLarge { max_rows: usize },
    #[error("code above 4 GiB (address {address:#x})")]
    AddressTooHigh { address: u64 },
}

/// The unwind table of the ELF file in `data` (a slice, or reads of the file: only its headers
/// and call frame information are read).
pub fn build_table<'data, R: ReadRef<'data>>(
    data: R,
    limits: BuildLimits,
) -> Result<UnwindTable, BuildError> {
    let file = object::File::parse(data)?;
    if file.architecture() != object::Architecture::X86_64 {
        return Err(BuildError::NotX86_64);
    }
    let section_address = |name: &str| file.section_by_name(name).map(|s| s.address());
    let plts = plt_sections(&file);
    if let Some(eh_frame) = file.section_by_name(".eh_frame") {
        let mut bases = BaseAddresses::default().set_eh_frame(eh_frame.address());
        if let Some(text) = section_address(".text") {
            bases = bases.set_text(text);
        }
        if let Some(got) = section_address(".got") {
            bases = bases.set_got(got);
        }
        let section = EhFrame::new(eh_frame.data()?, gimli::LittleEndian);
        let mut table = collect_rows(&section, &bases, limits, &plts)?;
        table.source = CfiSource::EhFrame;
        return Ok(table);
    }
    if let Some(debug_frame) = file.section_by_name(".debug_frame") {
        let mut section = DebugFrame::new(debug_frame.data()?, gimli::LittleEndian);
        section.set_address_size(8);
        let mut table = collect_rows(&section, &BaseAddresses::default(), limits, &plts)?;
        table.source = CfiSource::DebugFrame;
        return Ok(table);
    }
    Err(BuildError::NoCallFrameInfo)
}

/// Code some linkers leave without call frame information: lld writes no FDE for its PLT
/// (binutils does, as the [`CfaKind::Plt`] expression), and a sample in a PLT stub, between a
/// call and the function it reaches, then lost every caller (0.3-0.8% of rustc's samples, in
/// libLLVM's `.plt`). The stubs' rules are fixed by the ABI, so where no FDE covers a PLT
/// section, it gets them:
/// - `.plt`: 16-byte entries, `jmp *GOT` (6 bytes), then for lazy binding `push $n` and
///   `jmp PLT0`: CFA = rsp + 8 until the push and rsp + 16 after it (`pc & 15 >= 11`), which is
///   binutils' expression; the first entry (lazy binding's resolver call) pushes first, and is
///   only run once per symbol;
/// - `.plt.sec` and `.plt.got`: `jmp *GOT` (after `endbr64`), CFA = rsp + 8 throughout.
fn plt_sections<'data, R: ReadRef<'data>>(file: &object::File<'data, R>) -> Vec<FdeRange> {
    [
        (".plt", CfiRow::new(0, CfaKind::Plt, 11, RBP_UNCHANGED)),
        (".plt.sec", CfiRow::new(0, CfaKind::Rsp, 8, RBP_UNCHANGED)),
        (".plt.got", CfiRow::new(0, CfaKind::Rsp, 8, RBP_UNCHANGED)),
    ]
    .into_iter()
    .filter_map(|(name, rule)| {
        let section = file.section_by_name(name)?;
        let start = u32::try_from(section.address()).ok()?;
        let end = u32::try_from(section.address().checked_add(section.size())?).ok()?;
        (start < end).then_some(FdeRange { start, end, rule })
    })
    .collect()
}

/// Code an FDE of the file would cover, with one rule.
#[derive(Clone, Copy, Debug)]
struct FdeRange {
    start: u32,
    end: u32,
    rule: CfiRow,
}

/// Where one FDE's rows are in the rows collected, and the code it covers.
#[derive(Clone, Copy, Debug)]
struct FdeRows {
    start: u32,
    end: u32,
    first: u32,
    len: u32,
}

/// The rows of every FDE of `section`: each FDE's rows are in order and merged as they are read
/// (consecutive rows of one function often differ only in registers the table does not keep),
/// then the FDEs are put in address order. Sorting FDEs, not rows, keeps the build of a 190 MB
/// library's 1.4 M rows near the time gimli takes to evaluate them (sorting 3 M rows took a
/// third of it).
///
/// `fallbacks` are added as FDEs of their own where no FDE of the section overlaps them.
fn collect_rows<'a, S: UnwindSection<Reader<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    limits: BuildLimits,
    fallbacks: &[FdeRange],
) -> Result<UnwindTable, BuildError> {
    let mut rows: Vec<CfiRow> = Vec::new();
    let mut fdes: Vec<FdeRows> = Vec::new();
    let mut skipped_fdes = 0;
    let mut context = Box::new(UnwindContext::new());
    let mut entries = section.entries(bases);
    // A broken entry header ends the walk through the section: what was read stands.
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else {
            continue;
        };
        let Ok(fde) = partial.parse(S::cie_from_offset) else {
            skipped_fdes += 1;
            continue;
        };
        let Ok(mut fde_rows) = fde.rows(section, bases, &mut context) else {
            skipped_fdes += 1;
            continue;
        };
        let first = rows.len();
        let mut end = None;
        loop {
            match fde_rows.next_row() {
                Ok(Some(row)) if row.start_address() >= row.end_address() => {}
                Ok(Some(row)) => {
                    let pc = file_address(row.start_address())?;
                    end = Some(file_address(row.end_address())?);
                    let rule = compact_rule(row, section);
                    if rows.len() > first && rows.last().is_some_and(|last| last.same_rule(&rule)) {
                        continue;
                    }
                    if rows.len() >= limits.max_rows {
                        return Err(BuildError::TooLarge {
                            max_rows: limits.max_rows,
                        });
                    }
                    rows.push(CfiRow { pc, ..rule });
                }
                Ok(None) => break,
                Err(_) => {
                    skipped_fdes += 1;
                    break;
                }
            }
        }
        if let Some(end) = end {
            fdes.push(FdeRows {
                start: rows[first].pc,
                end,
                first: first as u32,
                len: (rows.len() - first) as u32,
            });
        }
    }
    for fallback in fallbacks {
        if !fdes
            .iter()
            .any(|fde| fde.start < fallback.end && fallback.start < fde.end)
        {
            fdes.push(FdeRows {
                start: fallback.start,
                end: fallback.end,
                first: rows.len() as u32,
                len: 1,
            });
            rows.push(CfiRow {
                pc: fallback.start,
                ..fallback.rule
            });
        }
    }
    Ok(UnwindTable {
        rows: merge(&rows, fdes),
        skipped_fdes,
        source: CfiSource::EhFrame,
    })
}

/// An address of the file as rows hold it.
fn file_address(address: u64) -> Result<u32, BuildError> {
    u32::try_from(address).map_err(|_| BuildError::AddressTooHigh { address })
}

/// The table: the FDEs' rows put in address order, gap-marked and merged. Where one FDE ends and no
/// other starts, a [`CfaKind::None`] row says no rule applies. Overlapping FDEs (a malformed or
/// hostile file) leave the table sorted: a row before the last one kept is dropped, and of two
/// rows at one address the later wins.
fn merge(collected: &[CfiRow], mut fdes: Vec<FdeRows>) -> Vec<CfiRow> {
    // Linkers usually lay FDEs out in address order; a stable sort keeps the later of two FDEs
    // starting at the same address last, and so the one that wins.
    if !fdes.is_sorted_by_key(|fde| fde.start) {
        fdes.sort_by_key(|fde| fde.start);
    }
    let mut rows: Vec<CfiRow> = Vec::with_capacity(collected.len() + fdes.len() / 4);
    let push = |rows: &mut Vec<CfiRow>, row: CfiRow| match rows.last_mut() {
        Some(last) if row.pc < last.pc => {}
        Some(last) if last.pc == row.pc => *last = row,
        Some(last) if last.same_rule(&row) => {}
        _ => rows.push(row),
    };
    for (i, fde) in fdes.iter().enumerate() {
        let first = fde.first as usize;
        for row in &collected[first..first + fde.len as usize] {
            push(&mut rows, *row);
        }
        if fdes.get(i + 1).is_none_or(|next| next.start > fde.end) {
            push(
                &mut rows,
                CfiRow::new(fde.end, CfaKind::None, 0, RBP_UNCHANGED),
            );
        }
    }
    rows
}

/// A row's rule in the table's terms.
pub(crate) fn compact_rule<'a, S: UnwindSection<Reader<'a>>>(
    row: &UnwindTableRow<usize>,
    section: &S,
) -> CfiRow {
    let unsupported = CfiRow::new(0, CfaKind::Unsupported, 0, RBP_UNCHANGED);
    // `None`: no rule given, the ABI's default (callee-saved rbp keeps its value).
    match row.register(RETURN_ADDRESS) {
        Some(RegisterRule::Undefined) => {
            return CfiRow::new(0, CfaKind::Outermost, 0, RBP_UNCHANGED)
        }
        Some(RegisterRule::Offset(-8)) => {}
        _ => return unsupported,
    }
    let rbp_slot = match row.register(RBP) {
        None | Some(RegisterRule::Undefined | RegisterRule::SameValue) => RBP_UNCHANGED,
        Some(RegisterRule::Offset(offset)) if offset % 8 == 0 && offset != 0 => {
            match i8::try_from(offset / 8) {
                Ok(slot) => slot,
                Err(_) => return unsupported,
            }
        }
        _ => return unsupported,
    };
    let (kind, cfa_offset) = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            match (*register, u16::try_from(*offset)) {
                (RSP, Ok(offset)) => (CfaKind::Rsp, offset),
                (RBP, Ok(offset)) => (CfaKind::Rbp, offset),
                // A frame over 64 KiB, counted in 16 bytes where it divides (at its call sites).
                (RSP, Err(_)) if *offset % 16 == 0 => match u16::try_from(*offset / 16) {
                    Ok(units) => (CfaKind::Rsp16, units),
                    Err(_) => return unsupported,
                },
                _ => return unsupported,
            }
        }
        CfaRule::Expression(expression) => {
            let Ok(bytes) = expression.get(section) else {
                return unsupported;
            };
            match plt_threshold(bytes.0.slice()) {
                Some(threshold) => (CfaKind::Plt, threshold),
                None => return unsupported,
            }
        }
    };
    CfiRow::new(0, kind, cfa_offset, rbp_slot)
}

/// The `pc & 15` threshold of a PLT entry's CFA expression, if `bytes` is one.
fn plt_threshold(bytes: &[u8]) -> Option<u16> {
    let (head, rest) = bytes.split_at_checked(PLT_EXPRESSION_HEAD.len())?;
    let (&lit, tail) = rest.split_first()?;
    let threshold = lit.checked_sub(DW_OP_LIT0).filter(|n| *n < 32)?;
    (head == PLT_EXPRESSION_HEAD && tail == PLT_EXPRESSION_TAIL).then_some(threshold as u16)
}

#[cfg(test)]
mod tests;
