//! Native unwind tables for the BPF walker: an ELF file's DWARF call frame information reduced to
//! the rows of [`profiler_common::cfi`] ([`build`]), split into the compact blocks the BPF maps
//! hold ([`blocks`]).
//!
//! A crate of its own so that it is optimised in every build: the daemon builds the table of a
//! 190 MB library while the program that maps it is running, and the sooner it is loaded the
//! fewer of that program's stacks stop short (see `docs/native-unwinding.md`).

pub mod blocks;
pub mod build;

pub use blocks::{split_into_blocks, TableBlocks};
pub use build::{build_table, BuildError, BuildLimits, CfiSource, UnwindTable};
