//! Native unwinding without frame pointers: each executable file's call frame information,
//! reduced to compact tables ([`profiler_common::cfi`]) the BPF walker searches by pc
//! (docs/native-unwinding.md).
//!
//! - [`build`]: a file's `.eh_frame` (or `.debug_frame`) to rows, with gimli, bounded;
//! - [`mapping`]: where a process maps a file (the load bias) and the key tables are shared by;
//! - [`blocks`]: rows as the BPF maps hold them;
//! - [`loader`]: the thread that keeps the maps current for the processes sampled, under the
//!   memory budget.

pub mod blocks;
pub mod build;
pub mod loader;
pub mod mapping;

pub use build::{build_table, BuildError, BuildLimits, CfiSource, UnwindTable};
pub use mapping::{load_bias, CodeMapping, TableKey, TableKeys};
