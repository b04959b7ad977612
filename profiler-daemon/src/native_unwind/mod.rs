//! Native unwinding without frame pointers: each executable file's call frame information,
//! reduced to compact tables ([`profiler_common::cfi`]) the BPF walker searches by pc.
//!
//! In progress (see docs/native-unwinding.md): the table builder, the mapping bias and the
//! tables' sharing key are done and tested; loading tables into BPF maps under the memory
//! budget, the per-process mappings map and the walker's CFI step come next.

pub mod build;
pub mod mapping;

pub use build::{build_table, BuildError, BuildLimits, CfiSource, UnwindTable};
pub use mapping::{load_bias, CodeMapping, TableKey, TableKeys};
