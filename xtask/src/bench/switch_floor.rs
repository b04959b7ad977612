//! The floor of section 7: a BPF program that does nothing, on the `sched_switch` tracepoint.
//! What it costs a context switch is what any program there costs on this kernel and CPU (the
//! tracepoint's call, the BPF dispatch, the speculative-execution mitigations on each call and
//! return), before a single instruction of the profiler's own runs: the part of the off-CPU
//! cost no change to the switch program can remove.
//!
//! Loaded here with two `bpf(2)` calls rather than through the daemon's loader, so that the
//! bench measures the bare hook on any build: a raw-tracepoint program (the dispatch the
//! daemon's BTF tracepoint program also goes through) of two instructions, `r0 = 0; exit`.

use std::ffi::CStr;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

use anyhow::{bail, Result};

/// `bpf(2)` commands and the program type (uapi `linux/bpf.h`).
const BPF_PROG_LOAD: libc::c_int = 5;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_int = 15;
const BPF_RAW_TRACEPOINT_OPEN: libc::c_int = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// `r0 = 0` (`BPF_ALU64 | BPF_MOV | BPF_K`), then `exit` (`BPF_JMP | BPF_EXIT`): eight bytes
/// each, the opcode in the lowest.
const PROGRAM: [u64; 2] = [0xb7, 0x95];

/// The name the kernel shows for it (bpftool, fdinfo).
pub(super) const NAME: &str = "bench_floor";

/// The do-nothing program, attached to `sched_switch` until dropped.
pub(super) struct EmptySwitchProgram {
    /// The attachment: closing it detaches the program.
    _link: OwnedFd,
    program: OwnedFd,
}

/// The leading fields of `BPF_PROG_LOAD`'s attribute; the kernel reads the rest as zero.
#[repr(C)]
#[derive(Default)]
struct ProgLoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
}

#[repr(C)]
struct RawTracepointOpenAttr {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

#[repr(C)]
struct InfoByFdAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The leading fields of `struct bpf_prog_info`, all that is asked for.
#[repr(C)]
#[derive(Default)]
struct ProgInfoHead {
    prog_type: u32,
    id: u32,
}

/// `bpf(cmd, attr)`: the descriptor or value it returns.
fn bpf<T>(cmd: libc::c_int, attr: &mut T, what: &str) -> Result<libc::c_long> {
    // SAFETY: `attr` is a live, initialized attribute of the layout `cmd` expects, its
    // pointers to memory that outlives the call, and its size the one passed.
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd,
            attr as *mut T as *mut libc::c_void,
            std::mem::size_of::<T>(),
        )
    };
    if result < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(result)
}

impl EmptySwitchProgram {
    pub(super) fn attach() -> Result<Self> {
        let license: &CStr = c"GPL";
        let tracepoint: &CStr = c"sched_switch";
        let mut name = [0u8; 16];
        name[..NAME.len()].copy_from_slice(NAME.as_bytes());
        let mut load = ProgLoadAttr {
            prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
            insn_cnt: PROGRAM.len() as u32,
            insns: PROGRAM.as_ptr() as u64,
            license: license.as_ptr() as u64,
            prog_name: name,
            ..Default::default()
        };
        let fd = bpf(BPF_PROG_LOAD, &mut load, "loading the empty switch program")?;
        // SAFETY: a descriptor the kernel just returned, owned by nothing else.
        let program = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        let mut open = RawTracepointOpenAttr {
            name: tracepoint.as_ptr() as u64,
            prog_fd: program.as_raw_fd() as u32,
            _pad: 0,
        };
        let fd = bpf(
            BPF_RAW_TRACEPOINT_OPEN,
            &mut open,
            "attaching the empty program to sched_switch",
        )?;
        // SAFETY: as above.
        let link = unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) };
        Ok(Self {
            _link: link,
            program,
        })
    }

    /// The program's id, for its run-time statistics.
    pub(super) fn id(&self) -> Result<u32> {
        let mut info = ProgInfoHead::default();
        let mut attr = InfoByFdAttr {
            bpf_fd: self.program.as_raw_fd() as u32,
            info_len: std::mem::size_of::<ProgInfoHead>() as u32,
            info: &mut info as *mut ProgInfoHead as u64,
        };
        bpf(
            BPF_OBJ_GET_INFO_BY_FD,
            &mut attr,
            "reading the empty program's id",
        )?;
        Ok(info.id)
    }
}
