//! Native unwind tables: each executable file's DWARF call frame information (`.eh_frame`, or
//! `.debug_frame`), reduced by the daemon to the few rules x86_64 compilers emit, as rows the
//! BPF walker binary-searches by pc.
//!
//! A row holds from its `pc` to the next row's. On x86_64 the return address is always the word
//! below the CFA (the caller's sp after the return), so a row says only how to find the CFA and
//! where the caller's rbp was saved: its rule.
//!
//! The maps hold rows compactly ([`CfiBlock`]): real code repeats a few hundred rules, so a block
//! keeps each distinct rule once and a row is 4 bytes, its pc as an offset from the block's
//! first pc and its rule as an index into the block's rules. The walker decodes the row it finds
//! back into a [`CfiRow`].

crate::labelled_enum! {
    /// How a row finds the CFA (the caller's sp once this frame returns), or why it cannot.
    #[derive(PartialOrd, Ord)]
    pub enum CfaKind: u8, from_u8 {
        /// No call frame information covers this pc (between functions, or code the tables omit):
        /// the walker falls back to frame pointers.
        None = 0 => "none",
        /// CFA = rsp + `cfa_offset`.
        Rsp = 1 => "rsp",
        /// CFA = rbp + `cfa_offset` (a function that keeps a frame pointer).
        Rbp = 2 => "rbp",
        /// A PLT stub's expression: CFA = rsp + 8, plus 8 once the stub has pushed its argument
        /// (pc & 15 >= 11): what GCC and binutils emit for `.plt` sections.
        Plt = 3 => "plt",
        /// The outermost frame: the return address is undefined (`_start`, a thread's start).
        Outermost = 4 => "outermost",
        /// A rule this table cannot express (another register, a general expression, a signal
        /// frame): the walker falls back to frame pointers.
        Unsupported = 5 => "unsupported",
        /// CFA = rsp + 16 x `cfa_offset`: a stack frame over 64 KiB (a large local buffer; rustc's
        /// compiler closure takes 527 KiB), whose offset does not fit [`CfiRow::cfa_offset`].
        /// At a call site rsp is 16-byte aligned, so the offset of every row a caller's walk
        /// uses is a multiple of 16; rows in the middle of a push sequence are not (those stay
        /// [`CfaKind::Unsupported`]).
        Rsp16 = 6 => "rsp16",
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
    /// Bytes added to the CFA's register ([`CfaKind::Rsp`], [`CfaKind::Rbp`]; 16-byte units for
    /// [`CfaKind::Rsp16`]).
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

/// How a row unwinds, without its pc: what a [`CfiBlock`] keeps once for all its rows that share
/// it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CfiRule {
    pub cfa_offset: u16,
    pub rbp_slot: i8,
    pub kind: u8,
}

impl CfiRule {
    pub const fn of(row: &CfiRow) -> Self {
        Self {
            cfa_offset: row.cfa_offset,
            rbp_slot: row.rbp_slot,
            kind: row.kind,
        }
    }

    /// The row of this rule starting at `pc`.
    pub const fn at(&self, pc: u32) -> CfiRow {
        CfiRow {
            pc,
            cfa_offset: self.cfa_offset,
            rbp_slot: self.rbp_slot,
            kind: self.kind,
        }
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
    let index = last_at_or_before(len, CFI_SEARCH_STEPS, &mut Transparent, |i| {
        row_at(i).map(|row| row.pc <= pc)
    })?;
    row_at(index)
}

/// Probes of [`find_cfi_row`].
pub const CFI_SEARCH_STEPS: u32 = 24;

/// Hides a search's bounds from the BPF verifier between probes.
///
/// The verifier follows every path through a loop and prunes a path only when an earlier one
/// reached the same point with bounds that include its own. A binary search's bounds differ on
/// every path, so three nested searches per frame exceed its budget of a million instructions.
/// Written to memory and read back (a per-CPU map slot), they are unknown values again at each
/// probe, and every path after the first prunes. The host passes them through unchanged.
pub trait Opaque {
    fn opaque(&mut self, value: u32) -> u32;
}

/// [`Opaque`] for the host: values unchanged.
pub struct Transparent;

impl Opaque for Transparent {
    #[inline(always)]
    fn opaque(&mut self, value: u32) -> u32 {
        value
    }
}

/// The index of the last of `len` sorted entries for which `at_or_before` holds, by a binary
/// search of at most `steps` probes (the BPF verifier needs a bound it can see). `None` if it
/// holds for none, if an entry cannot be read, or if `steps` did not suffice.
#[inline(always)]
fn last_at_or_before(
    len: u32,
    steps: u32,
    opaque: &mut impl Opaque,
    mut at_or_before: impl FnMut(u32) -> Option<bool>,
) -> Option<u32> {
    let (mut low, mut high) = (0u32, len);
    // Invariant: entries below `low` are at or before the key; from `high` they are after it.
    let mut step = 0;
    while step < steps {
        low = opaque.opaque(low);
        high = opaque.opaque(high);
        if low >= high {
            break;
        }
        let mid = low + (high - low) / 2;
        if at_or_before(mid)? {
            low = mid + 1;
        } else {
            high = mid;
        }
        step += 1;
    }
    if low == 0 || low < high {
        return None;
    }
    Some(low - 1)
}

/// Rules one block holds at most: its rows name them by a one-byte index.
pub const CFI_BLOCK_RULES: usize = 256;

/// Rows one block holds at most: a block is 64 KiB (one BPF hash map value, so that map memory
/// grows with the tables loaded instead of being reserved up front): a header, the rules, the
/// rows.
pub const CFI_BLOCK_ROWS: usize = (65536 - 8 - 4 * CFI_BLOCK_RULES) / 4;

/// Bits of a packed row holding its pc's offset from the block's first pc: a block covers at
/// most 16 MiB of code (a block is cut where the next row is farther).
pub const CFI_ROW_OFFSET_BITS: u32 = 24;

/// A row as a block holds it: the offset of its pc from the block's first pc, then its rule's
/// index.
#[inline(always)]
pub const fn pack_row(offset: u32, rule: u8) -> u32 {
    (offset << 8) | rule as u32
}

/// Blocks one table may have (a table of more rows is not loaded): about 16 M rows, more than the
/// largest binaries seen (a 190 MB `libLLVM` has about 1.4 M).
pub const MAX_CFI_BLOCKS: usize = 1024;

/// A block of a table's rows (`CFI_BLOCKS`, keyed by [`cfi_block_key`]), 64 KiB.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CfiBlock {
    /// Rows in use, from the first.
    pub len: u32,
    pub _reserved: u32,
    pub rules: [CfiRule; CFI_BLOCK_RULES],
    /// Sorted; each a [`pack_row`].
    pub rows: [u32; CFI_BLOCK_ROWS],
}

impl CfiBlock {
    /// Row `index` of the block whose first pc is `first_pc`.
    #[inline(always)]
    pub fn row(&self, index: u32, first_pc: u32) -> Option<CfiRow> {
        let packed = *self.rows.get(index as usize)?;
        let rule = self.rules.get((packed & 0xff) as usize)?;
        Some(rule.at(first_pc.wrapping_add(packed >> 8)))
    }

    /// Where row `index` starts, as an offset from the block's first pc.
    #[inline(always)]
    pub fn row_offset(&self, index: u32) -> Option<u32> {
        Some(*self.rows.get(index as usize)? >> 8)
    }
}

/// The key of block `block` of table `table` in `CFI_BLOCKS`.
#[inline(always)]
pub const fn cfi_block_key(table: u32, block: u32) -> u64 {
    ((table as u64) << 32) | block as u64
}

/// A table's index (`CFI_TABLES`, keyed by table id): which block holds a pc.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CfiTableIndex {
    /// Blocks in use (at least 1).
    pub blocks: u32,
    pub _reserved: u32,
    /// The first row's pc of each block.
    pub first_pcs: [u32; MAX_CFI_BLOCKS],
}

/// Tables loaded at once (`CFI_TABLES`' size).
pub const MAX_CFI_TABLES: u32 = 8192;

/// Processes with tables at once (`CFI_PROCS`' size).
pub const MAX_CFI_PROCESSES: u32 = 16384;

/// `CFI_BLOCKS`' size in the object; the daemon sets it from its memory budget at load time.
pub const DEFAULT_CFI_BLOCKS: u32 = 1024;

/// Executable mappings with a table kept per process (more are left to frame pointers, and
/// counted by the daemon).
pub const MAX_CFI_MAPPINGS: usize = 256;

/// One executable mapping of a process whose file has a table.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfiMapping {
    pub start: u64,
    pub end: u64,
    /// `pc - bias` is the file's ELF virtual address that rows hold.
    pub bias: u64,
    /// The table's id (`CFI_TABLES`).
    pub table: u32,
    pub _reserved: u32,
}

/// A process's mappings with tables (`CFI_PROCS`, keyed by pid), sorted by `start`, not
/// overlapping.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CfiProcess {
    pub count: u32,
    pub _reserved: u32,
    pub mappings: [CfiMapping; MAX_CFI_MAPPINGS],
}

/// The mapping of `process` holding `pc`: at most [`CFI_MAPPING_SEARCH_STEPS`] probes.
#[inline(always)]
pub fn find_cfi_mapping(
    process: &CfiProcess,
    pc: u64,
    opaque: &mut impl Opaque,
) -> Option<CfiMapping> {
    let count = (process.count as usize).min(MAX_CFI_MAPPINGS) as u32;
    let index = last_at_or_before(count, CFI_MAPPING_SEARCH_STEPS, opaque, |i| {
        process.mappings.get(i as usize).map(|m| m.start <= pc)
    })?;
    let mapping = *process.mappings.get(index as usize)?;
    (pc < mapping.end).then_some(mapping)
}

/// Probes of [`find_cfi_mapping`] (2^9 > [`MAX_CFI_MAPPINGS`]).
pub const CFI_MAPPING_SEARCH_STEPS: u32 = 9;

/// The block of `index` whose rows cover `pc` (the last one starting at or before it): at most
/// [`CFI_BLOCK_SEARCH_STEPS`] probes.
#[inline(always)]
pub fn find_cfi_block(index: &CfiTableIndex, pc: u32, opaque: &mut impl Opaque) -> Option<u32> {
    let blocks = (index.blocks as usize).min(MAX_CFI_BLOCKS) as u32;
    last_at_or_before(blocks, CFI_BLOCK_SEARCH_STEPS, opaque, |i| {
        index.first_pcs.get(i as usize).map(|first| *first <= pc)
    })
}

/// Probes of [`find_cfi_block`] (2^11 > [`MAX_CFI_BLOCKS`]).
pub const CFI_BLOCK_SEARCH_STEPS: u32 = 11;

/// The row of `block`, whose first pc is `first_pc`, covering `pc`: at most
/// [`CFI_BLOCK_ROW_SEARCH_STEPS`] probes.
#[inline(always)]
pub fn find_cfi_row_in_block(
    block: &CfiBlock,
    first_pc: u32,
    pc: u32,
    opaque: &mut impl Opaque,
) -> Option<CfiRow> {
    let len = (block.len as usize).min(CFI_BLOCK_ROWS) as u32;
    let offset = pc.checked_sub(first_pc)?;
    let index = last_at_or_before(len, CFI_BLOCK_ROW_SEARCH_STEPS, opaque, |i| {
        block.row_offset(i).map(|row| row <= offset)
    })?;
    block.row(index, first_pc)
}

/// Probes of [`find_cfi_row_in_block`] (2^14 > [`CFI_BLOCK_ROWS`]).
pub const CFI_BLOCK_ROW_SEARCH_STEPS: u32 = 14;

/// The rows of the table whose blocks are `index`, covering `pc`: its block, then the row in it.
/// `block_at` reads a block by number (the BPF map, or a slice in tests).
#[inline(always)]
pub fn find_cfi_row_in_table<'a>(
    index: &CfiTableIndex,
    pc: u32,
    opaque: &mut impl Opaque,
    block_at: impl FnOnce(u32) -> Option<&'a CfiBlock>,
) -> Option<CfiRow> {
    let block = find_cfi_block(index, pc, opaque)?;
    let first_pc = *index.first_pcs.get(block as usize)?;
    find_cfi_row_in_block(block_at(block)?, first_pc, pc, opaque)
}

/// What a walk remembers of its last table lookup, so that the next native frame, usually in the
/// same file and often in the same block or row (recursion, loops), skips the searches and map
/// lookups that found them. Kept in the walk's per-CPU state: it outlives a `bpf_loop` callback,
/// and holds numbers and address ranges only (a map value pointer cannot be stored).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfiCache {
    /// The mapping of the last lookup (`end == 0`: none yet).
    pub mapping: CfiMapping,
    /// The block of that mapping's table last used, and the file addresses it covers,
    /// `[block_start, block_end)` (`block_end == 0`: none).
    pub block: u32,
    pub _reserved_block: u32,
    pub block_start: u32,
    pub block_end: u32,
    /// The row last found and where the next row starts (`row_end == 0`: none).
    pub row: CfiRow,
    pub row_end: u32,
    pub _reserved: u32,
}

impl CfiCache {
    /// Forgets everything: at the start of each walk (another process, or tables rewritten).
    #[inline(always)]
    pub fn clear(&mut self) {
        self.mapping.end = 0;
        self.block_end = 0;
        self.row_end = 0;
    }
}

/// log2 of [`CFI_ROW_CACHE_ENTRIES`].
const CFI_ROW_CACHE_BITS: u32 = 10;

/// Entries of a [`CfiRowCache`].
pub const CFI_ROW_CACHE_ENTRIES: usize = 1 << CFI_ROW_CACHE_BITS;

/// A row found for an address in a table, and where the next row starts (`table == 0`: empty;
/// the daemon's table ids start at 1).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CfiCachedRow {
    pub table: u32,
    pub end: u32,
    pub row: CfiRow,
}

/// Rows that earlier walks on this CPU found, direct-mapped by (table, address): a profiled
/// program's stacks repeat the same return addresses sample after sample, and a hit costs a few
/// instructions instead of a hash lookup and a binary search. An entry stays right for as long as
/// it is held: a table id always names the same rows (the daemon never reuses one), and an entry
/// only answers for addresses inside its row. 16 KiB per CPU (`CFI_ROW_CACHE`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct CfiRowCache {
    pub entries: [CfiCachedRow; CFI_ROW_CACHE_ENTRIES],
}

impl CfiRowCache {
    pub const EMPTY: Self = Self {
        entries: [CfiCachedRow {
            table: 0,
            end: 0,
            row: CfiRow::new(0, CfaKind::None, 0, RBP_UNCHANGED),
        }; CFI_ROW_CACHE_ENTRIES],
    };

    /// The entry for `address` of `table`: a multiplicative hash of both, its top bits.
    #[inline(always)]
    fn index(table: u32, address: u32) -> usize {
        let hash = (address ^ table.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b);
        (hash >> (32 - CFI_ROW_CACHE_BITS)) as usize & (CFI_ROW_CACHE_ENTRIES - 1)
    }
}

/// The row covering `pc` in the current process, as [`find_cfi_mapping`] then
/// [`find_cfi_row_in_table`] would find it, with what `cache` (this walk's) and `rows` (this
/// CPU's earlier walks') already hold: the process's mappings (`process`), a table's index
/// (`index_of`) and a block (`block_at`, by table and block number) are only read when neither
/// covers `pc`.
#[inline(always)]
pub fn find_cfi_row_cached<'a>(
    cache: &mut CfiCache,
    rows: &mut CfiRowCache,
    pc: u64,
    opaque: &mut impl Opaque,
    process: impl FnOnce() -> Option<&'a CfiProcess>,
    index_of: impl FnOnce(u32) -> Option<&'a CfiTableIndex>,
    block_at: impl FnOnce(u32, u32) -> Option<&'a CfiBlock>,
) -> Option<CfiRow> {
    if pc < cache.mapping.start || pc >= cache.mapping.end {
        cache.mapping = find_cfi_mapping(process()?, pc, opaque)?;
        cache.block_end = 0;
        cache.row_end = 0;
    }
    let address = u32::try_from(pc.wrapping_sub(cache.mapping.bias)).ok()?;
    if cache.row.pc <= address && address < cache.row_end {
        return Some(cache.row);
    }
    let table = cache.mapping.table;
    let slot = CfiRowCache::index(table, address);
    let cached = *rows.entries.get(slot)?;
    if cached.table == table && cached.row.pc <= address && address < cached.end {
        cache.row = cached.row;
        cache.row_end = cached.end;
        return Some(cached.row);
    }
    if address < cache.block_start || address >= cache.block_end {
        let index = index_of(cache.mapping.table)?;
        let found = find_cfi_block(index, address, opaque)?;
        // Laundered: else the compiler drops the bounds checks below as implied by the
        // search's and by each other, in forms the verifier cannot follow.
        let block = opaque.opaque(found);
        let next = opaque.opaque(found + 1);
        let blocks = (index.blocks as usize).min(MAX_CFI_BLOCKS) as u32;
        let last = next >= blocks;
        cache.block = block;
        cache.block_start = *index.first_pcs.get(block as usize)?;
        cache.block_end = if last {
            u32::MAX
        } else {
            // Laundered again: the compiler folds this bounds check into `last`'s, a comparison
            // of two registers whose bound older verifiers (6.1) do not carry over.
            *index.first_pcs.get(opaque.opaque(next) as usize)?
        };
        cache.row_end = 0;
    }
    let block = block_at(cache.mapping.table, cache.block)?;
    let len = (block.len as usize).min(CFI_BLOCK_ROWS) as u32;
    let first_pc = cache.block_start;
    let offset = address.checked_sub(first_pc)?;
    // The row after the one found is the search's final upper bound: the last probe that was
    // past `address` read it (none did if the row found is the block's last).
    let mut next_pc = cache.block_end;
    let row = last_at_or_before(len, CFI_BLOCK_ROW_SEARCH_STEPS, opaque, |i| {
        let row_offset = block.row_offset(i)?;
        if row_offset > offset {
            next_pc = first_pc.wrapping_add(row_offset);
        }
        Some(row_offset <= offset)
    })?;
    cache.row = block.row(opaque.opaque(row), first_pc)?;
    cache.row_end = next_pc;
    *rows.entries.get_mut(slot)? = CfiCachedRow {
        table,
        end: next_pc,
        row: cache.row,
    };
    Some(cache.row)
}

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
