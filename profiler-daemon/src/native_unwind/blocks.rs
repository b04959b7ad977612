//! A table's rows as the BPF maps hold them: blocks of [`CFI_BLOCK_ROWS`] rows (one hash map
//! value each, so map memory follows the tables loaded) and an index of each block's first pc.

use profiler_common::cfi::{CfiBlock, CfiRow, CfiTableIndex, CFI_BLOCK_ROWS, MAX_CFI_BLOCKS};

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
    if rows.is_empty() || rows.len() > MAX_CFI_BLOCKS * CFI_BLOCK_ROWS {
        return None;
    }
    let mut index = Box::new(CfiTableIndex {
        blocks: 0,
        last_block_rows: 0,
        first_pcs: [0; MAX_CFI_BLOCKS],
    });
    let mut blocks = Vec::with_capacity(rows.len().div_ceil(CFI_BLOCK_ROWS));
    for (number, chunk) in rows.chunks(CFI_BLOCK_ROWS).enumerate() {
        let mut block = Box::new(CfiBlock {
            rows: [CfiRow::default(); CFI_BLOCK_ROWS],
        });
        block.rows[..chunk.len()].copy_from_slice(chunk);
        index.first_pcs[number] = chunk[0].pc;
        index.last_block_rows = chunk.len() as u32;
        blocks.push(block);
    }
    index.blocks = blocks.len() as u32;
    Some(TableBlocks { index, blocks })
}

#[cfg(test)]
mod tests {
    use profiler_common::cfi::{find_cfi_row, find_cfi_row_in_table, CfaKind, Transparent};

    use super::*;

    #[test]
    fn the_blocks_give_the_rows_a_flat_search_gives() {
        // Three blocks and a bit, rows 16 bytes apart with distinct rules.
        let rows: Vec<CfiRow> = (0..3 * CFI_BLOCK_ROWS + 17)
            .map(|i| CfiRow::new(0x1000 + 16 * i as u32, CfaKind::Rsp, (i % 500) as u16, 0))
            .collect();
        let table = split_into_blocks(&rows).expect("fits");
        assert_eq!(table.index.blocks, 4);
        assert_eq!(table.index.last_block_rows, 17);
        let last_pc = rows.last().expect("rows").pc;
        for pc in (0..last_pc + 64).step_by(5) {
            let flat = find_cfi_row(rows.len() as u32, pc, |i| rows.get(i as usize).copied());
            let blocked = find_cfi_row_in_table(&table.index, pc, &mut Transparent, |block| {
                table.blocks.get(block as usize).map(|b| &**b)
            });
            assert_eq!(blocked, flat, "pc {pc:#x}");
        }
    }

    #[test]
    fn empty_and_oversized_tables_are_not_split() {
        assert!(split_into_blocks(&[]).is_none());
        let too_many = vec![CfiRow::default(); MAX_CFI_BLOCKS * CFI_BLOCK_ROWS + 1];
        assert!(split_into_blocks(&too_many).is_none());
    }
}
