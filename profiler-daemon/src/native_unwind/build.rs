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
    if let Some(eh_frame) = file.section_by_name(".eh_frame") {
        let mut bases = BaseAddresses::default().set_eh_frame(eh_frame.address());
        if let Some(text) = section_address(".text") {
            bases = bases.set_text(text);
        }
        if let Some(got) = section_address(".got") {
            bases = bases.set_got(got);
        }
        let section = EhFrame::new(eh_frame.data()?, gimli::LittleEndian);
        let mut table = collect_rows(&section, &bases, limits)?;
        table.source = CfiSource::EhFrame;
        return Ok(table);
    }
    if let Some(debug_frame) = file.section_by_name(".debug_frame") {
        let mut section = DebugFrame::new(debug_frame.data()?, gimli::LittleEndian);
        section.set_address_size(8);
        let mut table = collect_rows(&section, &BaseAddresses::default(), limits)?;
        table.source = CfiSource::DebugFrame;
        return Ok(table);
    }
    Err(BuildError::NoCallFrameInfo)
}

/// One FDE row's range and compact rule, before sorting and merging.
#[derive(Clone, Copy, Debug)]
struct Span {
    start: u64,
    end: u64,
    row: CfiRow,
}

fn collect_rows<'a, S: UnwindSection<Reader<'a>>>(
    section: &S,
    bases: &BaseAddresses,
    limits: BuildLimits,
) -> Result<UnwindTable, BuildError> {
    let mut spans = Vec::new();
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
        let Ok(mut rows) = fde.rows(section, bases, &mut context) else {
            skipped_fdes += 1;
            continue;
        };
        loop {
            match rows.next_row() {
                Ok(Some(row)) => {
                    if spans.len() >= limits.max_rows {
                        return Err(BuildError::TooLarge {
                            max_rows: limits.max_rows,
                        });
                    }
                    spans.push(Span {
                        start: row.start_address(),
                        end: row.end_address(),
                        row: compact_rule(row, section),
                    });
                }
                Ok(None) => break,
                Err(_) => {
                    skipped_fdes += 1;
                    break;
                }
            }
        }
    }
    Ok(UnwindTable {
        rows: merge(spans)?,
        skipped_fdes,
        source: CfiSource::EhFrame,
    })
}

/// Sorted, gap-marked, merged rows: where one span ends and no other starts, a
/// [`CfaKind::None`] row says no rule applies.
fn merge(mut spans: Vec<Span>) -> Result<Vec<CfiRow>, BuildError> {
    spans.retain(|span| span.start < span.end);
    spans.sort_by_key(|span| span.start);
    let mut rows: Vec<CfiRow> = Vec::with_capacity(spans.len() + spans.len() / 4);
    let push = |rows: &mut Vec<CfiRow>, row: CfiRow| {
        match rows.last_mut() {
            // Two spans from the same address (overlapping FDEs): the later one wins.
            Some(last) if last.pc == row.pc => *last = row,
            Some(last) if last.same_rule(&row) => {}
            _ => rows.push(row),
        }
    };
    for (i, span) in spans.iter().enumerate() {
        let start = u32::try_from(span.start).map_err(|_| BuildError::AddressTooHigh {
            address: span.start,
        })?;
        push(
            &mut rows,
            CfiRow {
                pc: start,
                ..span.row
            },
        );
        let next_start = spans.get(i + 1).map(|next| next.start);
        if next_start.is_none_or(|next| next > span.end) {
            let end = u32::try_from(span.end)
                .map_err(|_| BuildError::AddressTooHigh { address: span.end })?;
            push(&mut rows, CfiRow::new(end, CfaKind::None, 0, RBP_UNCHANGED));
        }
    }
    Ok(rows)
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
            let Ok(offset) = u16::try_from(*offset) else {
                return unsupported;
            };
            match *register {
                RSP => (CfaKind::Rsp, offset),
                RBP => (CfaKind::Rbp, offset),
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
