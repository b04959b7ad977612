//! Native unwinding without frame pointers: each executable file's call frame information,
//! reduced to compact tables ([`profiler_common::cfi`]) the BPF walker searches by pc.
//!
//! In progress (see docs/native-unwinding.md): the table builder is done and tested; loading
//! tables into BPF maps, the per-process mappings and the walker's CFI step come next.

pub mod build;

pub use build::{build_table, BuildError, BuildLimits, CfiSource, UnwindTable};
