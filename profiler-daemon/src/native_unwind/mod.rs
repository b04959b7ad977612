//! Native unwinding without frame pointers: each executable file's call frame information,
//! reduced to compact tables ([`profiler_common::cfi`]) the BPF walker searches by pc
//! (docs/native-unwinding.md).
//!
//! - `profiler_unwind_tables`: a file's `.eh_frame` (or `.debug_frame`) to rows, with gimli,
//!   bounded, and the rows as the BPF maps hold them (a crate of its own, optimised in every
//!   build);
//! - [`mapping`]: where a process maps a file (the load bias) and the key tables are shared by;
//! - [`loader`]: the thread that keeps the maps current for the processes sampled, under the
//!   memory budget.

pub mod loader;
pub mod mapping;

use profiler_unwind_tables::{build_table, split_into_blocks, CfiSource};

/// What the daemon's table of one file is: for `profiler-daemon unwind-info` and the bench.
#[derive(Debug)]
pub struct TableReport {
    pub file_bytes: u64,
    pub rows: usize,
    /// The compact blocks and their index, as loaded.
    pub map_bytes: u64,
    pub blocks: u32,
    pub build: std::time::Duration,
    pub unsupported_rows: usize,
    pub skipped_fdes: usize,
    pub source: CfiSource,
}

impl std::fmt::Display for TableReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let flat_bytes =
            self.rows as u64 * std::mem::size_of::<profiler_common::cfi::CfiRow>() as u64;
        write!(
            f,
            "{} MB file, {} rows from {}, {} KiB in the BPF maps in {} blocks ({:.2} bytes per \
             row; {} KiB as flat 8-byte rows), built in {} ms; {} rows left to frame pointers \
             (rules a row cannot express), {} FDEs skipped",
            self.file_bytes >> 20,
            self.rows,
            match self.source {
                CfiSource::EhFrame => ".eh_frame",
                CfiSource::DebugFrame => ".debug_frame",
            },
            self.map_bytes >> 10,
            self.blocks,
            self.map_bytes as f64 / self.rows.max(1) as f64,
            flat_bytes >> 10,
            self.build.as_millis(),
            self.unsupported_rows,
            self.skipped_fdes,
        )
    }
}

/// Builds `path`'s table as the loader does (the same bounded reads and limits) and reports it.
pub fn describe(path: &std::path::Path) -> Result<TableReport, String> {
    let file = std::fs::File::open(path).map_err(|err| err.to_string())?;
    let file_bytes = file.metadata().map_err(|err| err.to_string())?.len();
    let reads = crate::untrusted::BoundedReads::new(
        object::read::ReadCache::new(file),
        loader::MAX_READ_BYTES,
    );
    let started = std::time::Instant::now();
    let table = build_table(&reads, loader::build_limits()).map_err(|err| err.to_string())?;
    let blocks = split_into_blocks(&table.rows).ok_or("no rows, or too many")?;
    Ok(TableReport {
        file_bytes,
        rows: table.rows.len(),
        map_bytes: blocks.map_bytes(),
        blocks: blocks.index.blocks,
        build: started.elapsed(),
        unsupported_rows: table
            .rows
            .iter()
            .filter(|row| row.kind() == Some(profiler_common::cfi::CfaKind::Unsupported))
            .count(),
        skipped_fdes: table.skipped_fdes,
        source: table.source,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn describes_libc_and_refuses_what_is_not_elf() {
        let report = super::describe(std::path::Path::new("/lib/x86_64-linux-gnu/libc.so.6"))
            .expect("libc's table");
        assert!(report.rows > 10_000, "{report}");
        // Compact: 4 bytes a row, and the rules, the index and the last block's room.
        assert!(report.map_bytes >= report.rows as u64 * 4, "{report}");
        assert!(report.map_bytes < report.rows as u64 * 6, "{report}");
        assert!(super::describe(std::path::Path::new("/proc/self/status")).is_err());
    }
}
