//! Reads of the sampled process's memory. The thread's stack goes through a per-CPU window: frames
//! are contiguous, so one read of up to a page serves many frames (a deep Java stack costs a few
//! reads, not hundreds). Any failed read ends the walk with a reason; none can fault.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{bpf_probe_read_user, generated as gen},
    macros::map,
    maps::PerCpuArray,
};
use profiler_common::UnwindEnd;

/// A copy of the part of the sampled thread's stack the walk is in: frames are contiguous, so one
/// read of up to a page serves many frames (a deep Java stack costs a few reads, not hundreds).
#[repr(C)]
pub(crate) struct StackWindow {
    pub(crate) base: u64,
    pub(crate) len: u64,
    bytes: [u8; STACK_WINDOW_BYTES],
}

const STACK_WINDOW_BYTES: usize = 4096;

#[map]
pub(crate) static STACK_WINDOW: PerCpuArray<StackWindow> = PerCpuArray::with_max_entries(1, 0);

/// The two words at `addr` on the sampled thread's stack, through the window.
#[inline(always)]
pub(crate) fn stack_pair(window: &mut StackWindow, addr: u64) -> Result<[u64; 2], UnwindEnd> {
    if addr < window.base || addr.wrapping_add(16) > window.base.wrapping_add(window.len) {
        // Refill from `addr` to the end of its page: never crosses into an unmapped page.
        let len = 4096 - (addr & 0xfff);
        if len < 16 {
            return read_pair(addr);
        }
        let len = (len as usize).min(STACK_WINDOW_BYTES);
        // SAFETY: a checked read of user memory into the window, `len` bounded by its size.
        let read = unsafe {
            gen::bpf_probe_read_user(
                window.bytes.as_mut_ptr() as *mut c_void,
                len as u32,
                addr as *const c_void,
            )
        };
        if read < 0 {
            window.len = 0;
            return Err(UnwindEnd::JavaReadFailed);
        }
        window.base = addr;
        window.len = len as u64;
    }
    let at = (addr - window.base) as usize;
    if at > STACK_WINDOW_BYTES - 16 {
        return Err(UnwindEnd::JavaReadFailed);
    }
    let word = |at: usize| {
        let b = &window.bytes;
        u64::from_le_bytes([
            b[at],
            b[at + 1],
            b[at + 2],
            b[at + 3],
            b[at + 4],
            b[at + 5],
            b[at + 6],
            b[at + 7],
        ])
    };
    Ok([word(at), word(at + 8)])
}

impl StackWindow {
    /// The word at `addr` if the window already holds it: no read of user memory.
    #[inline(always)]
    pub(crate) fn word_if_held(&self, addr: u64) -> Option<u64> {
        if addr < self.base || addr.wrapping_add(8) > self.base.wrapping_add(self.len) {
            return None;
        }
        let at = (addr - self.base) as usize;
        if at > STACK_WINDOW_BYTES - 8 {
            return None;
        }
        let b = &self.bytes;
        Some(u64::from_le_bytes([
            b[at],
            b[at + 1],
            b[at + 2],
            b[at + 3],
            b[at + 4],
            b[at + 5],
            b[at + 6],
            b[at + 7],
        ]))
    }
}

#[inline(always)]
pub(crate) fn stack_u64(window: &mut StackWindow, addr: u64) -> Result<u64, UnwindEnd> {
    stack_pair(window, addr).map(|pair| pair[0])
}

#[inline(always)]
pub(crate) fn read_u64(addr: u64) -> Result<u64, UnwindEnd> {
    // SAFETY: a checked read of user memory.
    unsafe { bpf_probe_read_user(addr as *const u64) }.map_err(|_| UnwindEnd::JavaReadFailed)
}

#[inline(always)]
pub(crate) fn read_pair(addr: u64) -> Result<[u64; 2], UnwindEnd> {
    // SAFETY: a checked read of user memory.
    unsafe { bpf_probe_read_user(addr as *const [u64; 2]) }.map_err(|_| UnwindEnd::JavaReadFailed)
}
