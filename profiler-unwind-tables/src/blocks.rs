//! A table's rows as the BPF maps hold them: compact blocks (one hash map value each, so map
//! memory follows the tables loaded), each with its rules once and 4-byte rows naming them, and
//! an index of each block's first pc. A block is cut where it is full, where the next row lies
//! past its offsets' reach, or where the next row's rule would be one too many.

use hashbrown::HashMap;
use profiler_common::cfi::{
    pack_row, CfiBlock, CfiRow, CfiRule, CfiTableIndex, CFI_BLOCK_ROWS, CFI_BLOCK_RULES,
    CFI_ROW_OFFSET_BITS, MAX_CFI_BLOCKS,
};

/// A table split for the maps.
pub struct TableBlocks {
    pub index: Box<CfiTableIndex>,
    pub blocks: Vec<Box<CfiBlock>>,
}

impl TableBlocks {
    /// Bytes the table takes in the maps (values only; the kernel adds a small header per
    /// element).
    pub fn map_bytes(&self) -> u64 {
        (std::mem::size_of::<CfiTableIndex>() + self.blocks.len() * std::mem::size_of::<CfiBlock>())
            as u64
    }
}

/// Splits sorted `rows` into blocks; `None` for an empty table or one of more than
/// [`MAX_CFI_BLOCKS`] blocks.
pub fn split_into_blocks(rows: &[CfiRow]) -> Option<TableBlocks> {
    if rows.is_empty() {
        return None;
    }
    let mut index = Box::new(CfiTableIndex {
        blocks: 0,
        _reserved: 0,
        first_pcs: [0; MAX_CFI_BLOCKS],
    });
    let mut blocks = Vec::with_capacity(rows.len().div_ceil(CFI_BLOCK_ROWS));
    let mut rest = rows;
    while let Some(first) = rest.first() {
        let slot = index.first_pcs.get_mut(blocks.len())?;
        *slot = first.pc;
        let (block, taken) = fill_block(rest);
        blocks.push(block);
        rest = &rest[taken..];
    }
    index.blocks = blocks.len() as u32;
    Some(TableBlocks { index, blocks })
}

/// A block of the first rows of `rows` (at least one), and how many it took.
fn fill_block(rows: &[CfiRow]) -> (Box<CfiBlock>, usize) {
    let mut block = Box::new(CfiBlock {
        len: 0,
        _reserved: 0,
        rules: [CfiRule::default(); CFI_BLOCK_RULES],
        rows: [0; CFI_BLOCK_ROWS],
    });
    let first_pc = rows[0].pc;
    let mut rules: HashMap<CfiRule, u8> = HashMap::new();
    let mut taken = 0;
    for row in rows.iter().take(CFI_BLOCK_ROWS) {
        let offset = row.pc - first_pc;
        if offset >> CFI_ROW_OFFSET_BITS != 0 {
            break;
        }
        let rule = CfiRule::of(row);
        let index = match rules.get(&rule) {
            Some(&index) => index,
            None if rules.len() < CFI_BLOCK_RULES => {
                let index = rules.len() as u8;
                block.rules[index as usize] = rule;
                rules.insert(rule, index);
                index
            }
            None => break,
        };
        block.rows[taken] = pack_row(offset, index);
        taken += 1;
    }
    block.len = taken as u32;
    (block, taken)
}

#[cfg(test)]
mod tests {
    use profiler_common::cfi::{
        find_cfi_mapping, find_cfi_row, find_cfi_row_cached, find_cfi_row_in_table, CfaKind,
        CfiCache, CfiMapping, CfiProcess, CfiRowCache, Transparent, MAX_CFI_MAPPINGS,
    };

    use super::*;

    /// `rows` split, checked against a flat search at every few bytes of their range.
    fn assert_blocks_find_what_a_flat_search_finds(rows: &[CfiRow]) -> TableBlocks {
        let table = split_into_blocks(rows).expect("fits");
        let last_pc = rows.last().expect("rows").pc;
        let step = (last_pc as usize / 200_000).max(5);
        for pc in (0..last_pc + 64).step_by(step) {
            let flat = find_cfi_row(rows.len() as u32, pc, |i| rows.get(i as usize).copied());
            let blocked = find_cfi_row_in_table(&table.index, pc, &mut Transparent, |block| {
                table.blocks.get(block as usize).map(|b| &**b)
            });
            assert_eq!(blocked, flat, "pc {pc:#x}");
        }
        table
    }

    #[test]
    fn blocks_are_cut_when_full_when_offsets_run_out_and_at_the_rule_bound() {
        // Full: three blocks and a bit, rows 16 bytes apart, a handful of rules.
        let rule = |i: usize| (i % 5) as u16 * 8;
        let rows: Vec<CfiRow> = (0..3 * CFI_BLOCK_ROWS + 17)
            .map(|i| CfiRow::new(0x1000 + 16 * i as u32, CfaKind::Rsp, rule(i), 0))
            .collect();
        let table = assert_blocks_find_what_a_flat_search_finds(&rows);
        assert_eq!(table.index.blocks, 4);
        assert_eq!(table.blocks[3].len, 17);
        assert_eq!(table.blocks[0].rows.len(), CFI_BLOCK_ROWS);
        // Rows of 1,000 distinct rules: a block at most 256 of them.
        let rows: Vec<CfiRow> = (0..3000)
            .map(|i| CfiRow::new(0x1000 + 16 * i as u32, CfaKind::Rsp, (i % 1000) as u16, 0))
            .collect();
        let table = assert_blocks_find_what_a_flat_search_finds(&rows);
        assert_eq!(table.blocks[0].len as usize, CFI_BLOCK_RULES);
        // Rows 5 MiB apart: a block spans at most 16 MiB of code, its offsets' reach.
        let rows: Vec<CfiRow> = (0..10)
            .map(|i| CfiRow::new(0x1000 + (5 << 20) * i as u32, CfaKind::Rsp, 8, 0))
            .collect();
        let table = assert_blocks_find_what_a_flat_search_finds(&rows);
        assert_eq!(table.blocks[0].len, 4);
        assert_eq!(table.index.blocks, 3);
    }

    #[test]
    fn the_blocks_give_the_rows_a_flat_search_gives() {
        // Rows 4 to 67 bytes apart, 500 distinct rules.
        let mut pc = 0x1000u32;
        let rows: Vec<CfiRow> = (0..3 * CFI_BLOCK_ROWS + 17)
            .map(|i| {
                let row = CfiRow::new(pc, CfaKind::Rsp, (i % 500) as u16, (i % 3) as i8 - 2);
                pc += 4 + (i * 31 % 64) as u32;
                row
            })
            .collect();
        let table = split_into_blocks(&rows).expect("fits");
        let last_pc = rows.last().expect("rows").pc;
        for pc in (0..last_pc + 64).step_by(5) {
            let flat = find_cfi_row(rows.len() as u32, pc, |i| rows.get(i as usize).copied());
            let blocked = find_cfi_row_in_table(&table.index, pc, &mut Transparent, |block| {
                table.blocks.get(block as usize).map(|b| &**b)
            });
            assert_eq!(blocked, flat, "pc {pc:#x}");
        }
    }

    /// A process of `mappings` files, each with a table of `rows` rows split as the maps hold
    /// them; returns the process entry, the tables (ids 100, 101...) and their flat rows.
    fn process_with_tables(
        mappings: usize,
        rows: usize,
    ) -> (Box<CfiProcess>, Vec<TableBlocks>, Vec<Vec<CfiRow>>) {
        let mut process = Box::new(CfiProcess {
            count: mappings as u32,
            _reserved: 0,
            mappings: [CfiMapping::default(); MAX_CFI_MAPPINGS],
        });
        let (mut tables, mut flat) = (Vec::new(), Vec::new());
        for m in 0..mappings {
            // Rows 4 to 67 bytes apart from 0x1000, rules varied; the mapping spans them all.
            let mut pc = 0x1000u32;
            let table_rows: Vec<CfiRow> = (0..rows)
                .map(|i| {
                    let row = CfiRow::new(pc, CfaKind::Rsp, ((i * 7 + m) % 300) as u16, 0);
                    pc += 4 + ((i * 31 + m * 17) % 64) as u32;
                    row
                })
                .collect();
            let start = 0x10_0000_0000u64 * (m as u64 + 1);
            process.mappings[m] = CfiMapping {
                start,
                end: start + pc as u64 + 0x100,
                bias: start,
                table: 100 + m as u32,
                _reserved: 0,
            };
            tables.push(split_into_blocks(&table_rows).expect("fits"));
            flat.push(table_rows);
        }
        (process, tables, flat)
    }

    proptest::proptest! {
        /// The BPF walker's cached lookup gives what a direct search of the mapping's flat rows
        /// gives, for any sequence of pcs: jumps between mappings and blocks, repeats, pcs
        /// outside every table.
        #[test]
        fn a_cached_lookup_finds_what_a_direct_search_finds(
            steps in proptest::collection::vec((0usize..4, 0u32..0x2_0000, 0u32..8), 1..200),
        ) {
            let (process, tables, flat) = process_with_tables(3, 2 * CFI_BLOCK_ROWS + 100);
            let mut cache = CfiCache::default();
            let mut rows = Box::new(CfiRowCache::EMPTY);
            let mut last = 0u64;
            for (mapping, offset, near) in steps {
                // Mapping 3 does not exist: a pc outside every table. `near` revisits the last pc.
                let pc = if near == 0 && last != 0 {
                    last + offset as u64 % 64
                } else {
                    0x10_0000_0000u64 * (mapping as u64 + 1) + offset as u64
                };
                last = pc;
                let expected = find_cfi_mapping(&process, pc, &mut Transparent).and_then(|m| {
                    let rows = &flat[(m.table - 100) as usize];
                    let address = u32::try_from(pc - m.bias).ok()?;
                    find_cfi_row(rows.len() as u32, address, |i| rows.get(i as usize).copied())
                });
                // A walk's cache lasts one walk; the CPU's row cache outlives it.
                if near == 7 {
                    cache.clear();
                }
                let table_of = |table: u32| tables.get(table.checked_sub(100)? as usize);
                let found = find_cfi_row_cached(
                    &mut cache,
                    &mut rows,
                    pc,
                    &mut Transparent,
                    || Some(&*process),
                    |table| table_of(table).map(|t| &*t.index),
                    |table, block| table_of(table)?.blocks.get(block as usize).map(|b| &**b),
                );
                proptest::prop_assert_eq!(found, expected, "pc {:#x}", pc);
            }
        }
    }

    #[test]
    fn empty_and_oversized_tables_are_not_split() {
        assert!(split_into_blocks(&[]).is_none());
        // Every row a new rule: blocks of 256 rows, one more than the index holds.
        let too_many: Vec<CfiRow> = (0..(MAX_CFI_BLOCKS + 1) * CFI_BLOCK_RULES)
            .map(|i| CfiRow::new(16 * i as u32, CfaKind::Rsp, (i % 60_000) as u16, 0))
            .collect();
        assert!(split_into_blocks(&too_many).is_none());
        assert!(split_into_blocks(&too_many[..MAX_CFI_BLOCKS * CFI_BLOCK_RULES]).is_some());
    }
}
