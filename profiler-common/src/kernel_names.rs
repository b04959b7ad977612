//! The query and answer of the `kernel_names` program: kernel addresses named by the kernel's
//! own symbol lookup, on demand, so the daemon needs no copy of the kernel's symbol table.

/// Addresses named per run of the program.
pub const KERNEL_NAMES_PER_RUN: usize = 64;

/// Bytes kept of each name, its NUL included: the kernel's symbol names stay under 128 bytes
/// but for a few (generated and Rust ones), and a module's adds ` [module]`. A longer one comes
/// back cut.
pub const KERNEL_NAME_BYTES: usize = 256;

/// The addresses to name, 0 past the last.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNameQuery {
    pub addrs: [u64; KERNEL_NAMES_PER_RUN],
}

/// Each address's name as `%ps` prints it (`function` or `function [module]`, or `0x...` for
/// an address in no symbol), NUL-terminated.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNameAnswer {
    pub names: [[u8; KERNEL_NAME_BYTES]; KERNEL_NAMES_PER_RUN],
}
