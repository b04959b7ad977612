//! The floor of section 7: a BPF program that does nothing, on the `sched_switch` tracepoint.
//! What it costs a context switch is what any program there costs on this kernel and CPU (the
//! tracepoint's call, the BPF dispatch, the speculative-execution mitigations on each call and
//! return), before a single instruction of the profiler's own runs: the part of the off-CPU
//! cost no change to the switch program can remove.
//!
//! Loaded with the daemon's bare `bpf(2)` wrapper rather than its aya loader, so that the bench
//! measures the bare hook on any build: a raw-tracepoint program (the dispatch the daemon's BTF
//! tracepoint program also goes through) of two instructions, `r0 = 0; exit`.

use std::ffi::CStr;
use std::fs;
use std::os::fd::{AsRawFd as _, OwnedFd};

use anyhow::{bail, Context as _, Result};

use super::bpf_syscall::{bpf, insn, ProgSpec, BPF_PROG_LOAD, EXIT, MOV64_IMM};

/// `bpf(2)`'s command that attaches to a raw tracepoint, and the program type (uapi
/// `linux/bpf.h`).
const BPF_RAW_TRACEPOINT_OPEN: libc::c_long = 17;
const BPF_PROG_TYPE_RAW_TRACEPOINT: u32 = 17;

/// The name the kernel shows for it (bpftool, fdinfo).
const NAME: &str = "bench_floor";

/// The do-nothing program, attached to `sched_switch` until dropped.
pub(super) struct EmptySwitchProgram {
    /// The attachment: closing it detaches the program.
    _link: OwnedFd,
    program: OwnedFd,
}

/// `BPF_RAW_TRACEPOINT_OPEN`'s attributes.
#[repr(C)]
struct RawTracepointSpec {
    name: u64,
    prog_fd: u32,
    _pad: u32,
}

impl EmptySwitchProgram {
    pub(super) fn attach() -> Result<Self> {
        let program_text = [insn(MOV64_IMM, 0, 0, 0, 0), insn(EXIT, 0, 0, 0, 0)];
        let license: &CStr = c"GPL";
        let tracepoint: &CStr = c"sched_switch";
        let mut prog_name = [0u8; 16];
        prog_name[..NAME.len()].copy_from_slice(NAME.as_bytes());
        let program = bpf(
            BPF_PROG_LOAD,
            &mut ProgSpec {
                prog_type: BPF_PROG_TYPE_RAW_TRACEPOINT,
                insn_cnt: program_text.len() as u32,
                insns: program_text.as_ptr() as u64,
                license: license.as_ptr() as u64,
                prog_name,
                ..ProgSpec::default()
            },
        )
        .context("loading the empty switch program")?;
        let link = bpf(
            BPF_RAW_TRACEPOINT_OPEN,
            &mut RawTracepointSpec {
                name: tracepoint.as_ptr() as u64,
                prog_fd: program.as_raw_fd() as u32,
                _pad: 0,
            },
        )
        .context("attaching the empty program to sched_switch")?;
        Ok(Self {
            _link: link,
            program,
        })
    }

    /// The program's id, for its run-time statistics: from its descriptor's fdinfo.
    pub(super) fn id(&self) -> Result<u32> {
        let path = format!("/proc/self/fdinfo/{}", self.program.as_raw_fd());
        let info = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        match info.lines().find_map(|l| l.strip_prefix("prog_id:")) {
            Some(id) => Ok(id.trim().parse()?),
            None => bail!("{path} names no program id"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel takes the program and the attachment (the tests run as root), and its id is
    /// found for its statistics.
    #[test]
    fn the_empty_program_attaches_and_has_an_id() {
        let program = EmptySwitchProgram::attach().expect("attached");
        let id = program.id().expect("an id");
        assert!(id > 0);
        let link = format!("/proc/self/fdinfo/{}", program._link.as_raw_fd());
        let info = fs::read_to_string(&link).expect("the link's fdinfo");
        assert!(info.contains(&format!("prog_id:\t{id}")), "{info}");
    }
}
