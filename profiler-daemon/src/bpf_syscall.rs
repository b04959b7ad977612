//! The `bpf(2)` system call, bare: for the few programs and maps loaded without aya, the
//! kernel feature probes (`kernel_features.rs`) and the bench's do-nothing program on
//! `sched_switch` (`xtask/src/bench/switch_floor.rs`, which includes this file by path).

use std::ffi::c_void;
use std::os::fd::{FromRawFd as _, OwnedFd};

/// `bpf(2)`'s command that loads a program (uapi `linux/bpf.h`).
pub(crate) const BPF_PROG_LOAD: libc::c_long = 5;

/// `BPF_PROG_LOAD`'s attributes, as far as our callers set them.
#[repr(C)]
#[derive(Default)]
pub(crate) struct ProgSpec {
    pub(crate) prog_type: u32,
    pub(crate) insn_cnt: u32,
    pub(crate) insns: u64,
    pub(crate) license: u64,
    pub(crate) log_level: u32,
    pub(crate) log_size: u32,
    pub(crate) log_buf: u64,
    pub(crate) kern_version: u32,
    pub(crate) prog_flags: u32,
    pub(crate) prog_name: [u8; 16],
    pub(crate) prog_ifindex: u32,
    pub(crate) expected_attach_type: u32,
}

/// `bpf(command, attr)` for a command that returns a new file descriptor.
pub(crate) fn bpf<T>(command: libc::c_long, attr: &mut T) -> std::io::Result<OwnedFd> {
    // SAFETY: `attr` is the command's attribute struct (a prefix of `union bpf_attr`; the
    // kernel zero-extends what it is not given), alive for the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut T as *mut c_void,
            std::mem::size_of::<T>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a new file descriptor the kernel gave us.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// An eBPF instruction: opcode, registers, offset, immediate.
pub(crate) const fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> u64 {
    (code as u64)
        | ((dst as u64 & 0xf) << 8)
        | ((src as u64 & 0xf) << 12)
        | ((off as u16 as u64) << 16)
        | ((imm as u32 as u64) << 32)
}
pub(crate) const MOV64_IMM: u8 = 0xb7;
pub(crate) const CALL: u8 = 0x85;
pub(crate) const EXIT: u8 = 0x95;
