//! What the walker needs from where it runs: reads of the sampled process's memory, the
//! JavaThread of a tid, native unwind tables, and somewhere to put frames. The thread's stack is read through a
//! window: frames are contiguous, so one read of up to a page serves many frames (a deep Java
//! stack costs a few reads, not hundreds).

use core::mem::MaybeUninit;

use profiler_common::cfi::{CfiCache, CfiRow};
use profiler_common::{UnwindEnd, UserFrame};

/// A read of the sampled process's memory that failed (unmapped, paged out); on the BPF side,
/// the helper's error code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReadError(pub i32);

/// Reads of the sampled process's memory. Any read may fail, never fault. The BPF side
/// implements them with `bpf_probe_read_user`.
///
/// The results are `Result<T, ReadError>` rather than `Option<T>` on purpose: that is the layout
/// of aya's `bpf_probe_read_user` result (`Result<T, i32>`), a byte array 4-aligned beside the
/// error. In an `Option` the array sits at offset 1: the BPF program then copied it byte by byte
/// (7% more instructions) and indexed one such copy in a way the verifier refused.
pub trait UserMemory {
    fn read_u8(&self, addr: u64) -> Result<u8, ReadError>;
    fn read_u16(&self, addr: u64) -> Result<u16, ReadError>;
    fn read_u32(&self, addr: u64) -> Result<u32, ReadError>;
    fn read_u64(&self, addr: u64) -> Result<u64, ReadError>;
    /// Two consecutive words at `addr`, in one read.
    fn read_pair(&self, addr: u64) -> Result<[u64; 2], ReadError>;
    /// `N` bytes at `addr`.
    fn read_array<const N: usize>(&self, addr: u64) -> Result<[u8; N], ReadError>;
    /// Fills `dst` from `addr`; true if all of it was read (`dst` is then initialised),
    /// false if any of it could not be (`dst` is then unspecified). Uninitialised on entry:
    /// zeroing a buffer first costs the BPF program a byte-at-a-time `memset` call.
    fn read_into(&self, addr: u64, dst: &mut [MaybeUninit<u8>]) -> bool;
    /// Lends a buffer of [`SCRATCH_BYTES`] that the implementation owns: a BPF program's
    /// stack is 512 bytes for the program and every function it calls, so a buffer that size
    /// lives in a per-CPU map there (on the stack, it made the walk's stack too deep for kernels
    /// before BPF private stacks). `None` if there is none.
    fn with_scratch<R>(
        &self,
        use_buffer: impl FnOnce(&mut [MaybeUninit<u8>; SCRATCH_BYTES]) -> R,
    ) -> Option<R>;
}

/// Bytes of the buffer [`UserMemory::with_scratch`] lends: a code blob's header.
pub const SCRATCH_BYTES: usize = 128;

/// The `JavaThread*` of a thread, by host tid (the daemon's view of the JVM's threads).
pub trait JavaThreads {
    fn java_thread(&self, tid: u32) -> Option<u64>;
}

/// The sampled process's native unwind tables (see `profiler_common::cfi`).
pub trait NativeTables {
    /// The row covering `pc`, an address in the process, if a table of its file is loaded.
    /// `cache` is the walk's memory of its last lookup (`profiler_common::cfi::CfiCache`).
    fn cfi_row(&self, pc: u64, cache: &mut CfiCache) -> Option<CfiRow>;
}

/// Where the walk puts the frames it records.
pub trait FrameSink {
    /// Stores frame number `index` (innermost first); false if there is no room for it.
    fn record(&mut self, index: u32, frame: UserFrame) -> bool;
}

/// Bytes of the stack a [`StackWindow`] holds: one page.
pub const STACK_WINDOW_BYTES: usize = 4096;

/// A copy of the part of the sampled thread's stack the walk is in.
///
/// Held as words, read at 8-byte aligned addresses only (stack slots are): a word is then one
/// load in the BPF program, where a byte array cost 8 loads and 14 shifts and ors per word
/// (the compiler cannot assume alignment in a byte array). An unaligned address, which only a
/// corrupt frame pointer gives, is read from memory directly.
#[repr(C)]
pub struct StackWindow {
    pub base: u64,
    pub len: u64,
    pub words: [u64; STACK_WINDOW_WORDS],
}

const STACK_WINDOW_WORDS: usize = STACK_WINDOW_BYTES / 8;

impl StackWindow {
    /// An empty window (the BPF side finds its window in a per-CPU map and calls
    /// [`StackWindow::clear`] instead).
    pub const fn new() -> Self {
        Self {
            base: 0,
            len: 0,
            words: [0; STACK_WINDOW_WORDS],
        }
    }

    /// Forgets what the window holds: a new sample, maybe of another thread.
    #[inline(always)]
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// The word at `addr` if the window already holds it: no read of user memory.
    #[inline(always)]
    pub fn word_if_held(&self, addr: u64) -> Option<u64> {
        if addr & 7 != 0
            || addr < self.base
            || addr.wrapping_add(8) > self.base.wrapping_add(self.len)
        {
            return None;
        }
        self.word_at(addr - self.base, STACK_WINDOW_BYTES as u64 - 8)
    }

    /// The two words at `addr` if the window already holds them: one check for both (the
    /// simple compiled loop takes a caller's pair at every frame).
    #[inline(always)]
    pub fn pair_if_held(&self, addr: u64) -> Option<[u64; 2]> {
        if addr & 7 != 0
            || addr < self.base
            || addr.wrapping_add(16) > self.base.wrapping_add(self.len)
        {
            return None;
        }
        let at = addr - self.base;
        if at > STACK_WINDOW_BYTES as u64 - 16 {
            return None;
        }
        // Masked as in `word_at`, so that the verifier keeps the bound.
        let at = (at & !7) as usize;
        // SAFETY: `at + 16 <= STACK_WINDOW_BYTES`, 8-aligned in an array of words.
        Some(unsafe {
            let first = (self.words.as_ptr() as *const u8).add(at).cast::<u64>();
            [first.read(), first.add(1).read()]
        })
    }

    /// The word at byte offset `at` if `at <= last`. `at` is checked as a byte offset, and
    /// aligned by masking: the verifier then knows the load stays in the window (an index
    /// shifted back into an offset loses that bound).
    #[inline(always)]
    fn word_at(&self, at: u64, last: u64) -> Option<u64> {
        if at > last {
            return None;
        }
        let at = (at & !7) as usize;
        // SAFETY: `at + 8 <= STACK_WINDOW_BYTES` (callers pass `last` at most that minus 8),
        // and 8-aligned in an array of words.
        Some(unsafe {
            (self.words.as_ptr() as *const u8)
                .add(at)
                .cast::<u64>()
                .read()
        })
    }

    /// The two words at `addr` on the sampled thread's stack, refilling the window from `addr`
    /// to the end of its page when it does not hold them.
    #[inline(always)]
    pub fn pair<M: UserMemory>(&mut self, memory: &M, addr: u64) -> Result<[u64; 2], UnwindEnd> {
        if addr & 7 != 0 {
            return read_pair(memory, addr);
        }
        if addr < self.base || addr.wrapping_add(16) > self.base.wrapping_add(self.len) {
            // Refill from `addr` to the end of its page: never crosses into an unmapped page.
            let len = 4096 - (addr & 0xfff);
            if len < 16 {
                return read_pair(memory, addr);
            }
            let len = (len as usize).min(STACK_WINDOW_BYTES);
            let Some(dst) = self.words.get_mut(..len / 8) else {
                return Err(UnwindEnd::JavaReadFailed);
            };
            // SAFETY: the words as bytes, `len` of them (a multiple of 8: `addr` is aligned).
            let dst = unsafe {
                core::slice::from_raw_parts_mut(dst.as_mut_ptr() as *mut MaybeUninit<u8>, len)
            };
            if !memory.read_into(addr, dst) {
                self.len = 0;
                return Err(UnwindEnd::JavaReadFailed);
            }
            self.base = addr;
            self.len = len as u64;
        }
        let at = addr - self.base;
        let last = STACK_WINDOW_BYTES as u64 - 16;
        match (self.word_at(at, last), self.word_at(at + 8, last + 8)) {
            (Some(first), Some(second)) => Ok([first, second]),
            _ => Err(UnwindEnd::JavaReadFailed),
        }
    }

    /// The word at `addr` on the sampled thread's stack (see [`StackWindow::pair`]).
    #[inline(always)]
    pub fn u64<M: UserMemory>(&mut self, memory: &M, addr: u64) -> Result<u64, UnwindEnd> {
        self.pair(memory, addr).map(|pair| pair[0])
    }
}

impl Default for StackWindow {
    fn default() -> Self {
        Self::new()
    }
}

/// The word at `addr`, outside the stack window.
#[inline(always)]
pub(crate) fn read_u64<M: UserMemory>(memory: &M, addr: u64) -> Result<u64, UnwindEnd> {
    memory.read_u64(addr).map_err(|_| UnwindEnd::JavaReadFailed)
}

/// The two words at `addr`, outside the stack window (a pair the window cannot hold: it
/// straddles a page boundary).
#[inline(always)]
fn read_pair<M: UserMemory>(memory: &M, addr: u64) -> Result<[u64; 2], UnwindEnd> {
    memory
        .read_pair(addr)
        .map_err(|_| UnwindEnd::JavaReadFailed)
}

/// The little-endian 64-bit field at byte `offset` of `bytes` (a power-of-two length:
/// the mask is what bounds the index for the verifier); 0 if it would run past the end. The
/// masked offset goes through `black_box` so that the compiler cannot turn the end check into
/// `at == N - 1`, which verifiers before 6.x do not learn a bound from.
#[inline(always)]
pub(crate) fn field_u64<const N: usize>(bytes: &[u8; N], offset: usize) -> u64 {
    let at = core::hint::black_box(offset & (N - 1));
    if at > N - 8 {
        return 0;
    }
    u64::from_le_bytes([
        bytes[at],
        bytes[at + 1],
        bytes[at + 2],
        bytes[at + 3],
        bytes[at + 4],
        bytes[at + 5],
        bytes[at + 6],
        bytes[at + 7],
    ])
}

/// See [`field_u64`].
#[inline(always)]
pub(crate) fn field_i32<const N: usize>(bytes: &[u8; N], offset: usize) -> i32 {
    let at = core::hint::black_box(offset & (N - 1));
    if at > N - 4 {
        return 0;
    }
    i32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}

/// See [`field_u64`].
#[inline(always)]
pub(crate) fn field_i16<const N: usize>(bytes: &[u8; N], offset: usize) -> i16 {
    let at = core::hint::black_box(offset & (N - 1));
    if at > N - 2 {
        return 0;
    }
    i16::from_le_bytes([bytes[at], bytes[at + 1]])
}
