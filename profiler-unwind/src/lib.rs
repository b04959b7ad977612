//! The user stack walker, one frame per step: frame-pointer steps for native code, and HotSpot's
//! rules for interpreted frames, compiled methods, stubs, the call stub and a thread's
//! `JavaFrameAnchor`. The BPF program (`profiler-ebpf`) runs it in the kernel; host unit tests run
//! the very same code over synthetic memory.
//!
//! # Why it is shared, and how
//!
//! A perf-event BPF program cannot run under `cargo test` (the kernel's `BPF_PROG_TEST_RUN` does
//! not support perf-event programs), so the walk cannot be tested by running the program. It is
//! written once here instead, `no_std` and generic over where memory comes from:
//!
//! - [`UserMemory`]: fixed-size reads of the sampled process (`u8` to `u64`, byte arrays, a
//!   slice). The BPF side implements it with `bpf_probe_read_user`; tests with a map of address
//!   ranges to bytes.
//! - [`JavaThreads`]: host tid -> `JavaThread*` (the BPF side's `JAVA_THREADS` map).
//! - [`FrameSink`]: where recorded frames go (the BPF side's per-CPU sample record; a `Vec` in
//!   tests).
//! - [`StackWindow`]: the page-sized copy of the thread's stack that stack reads go through, the
//!   same code on both sides (the BPF side keeps it in a per-CPU map).
//!
//! Everything is `#[inline(always)]`, so the BPF program compiles to the same shape as when this
//! code lived in it: the verifier sees no new calls, only the trait methods' bodies inlined.
//!
//! This crate is apart from `profiler-common` on purpose: that crate is the byte contract between
//! the kernel and the daemon (record layouts, numbers that never change), which the daemon
//! links; this one is an algorithm only the BPF program and its tests use.
#![cfg_attr(not(any(test, feature = "fakes")), no_std)]

mod frozen;
mod hotspot;
mod memory;
mod mounted;
mod native;
mod recent_blobs;
mod state;
mod walk;
pub mod x86_frames;

#[cfg(any(test, feature = "fakes"))]
pub mod fakes;
#[cfg(test)]
mod tests;

pub use hotspot::{allocated_class_frame, java_state, monitor_state, waiting_for, waiting_state};
pub use memory::{
    FrameSink, JavaThreads, NativeTables, ReadError, StackWindow, UserMemory, SCRATCH_BYTES,
    STACK_WINDOW_BYTES,
};
pub use mounted::{mounted_thread, mounted_virtual_tid, MountedThread};
pub use recent_blobs::{RecentBlob, RecentBlobTable, RecentBlobs, RECENT_BLOBS};
pub use state::{BlobCache, ChunkHeader, FreesSeen, FrozenWalk, UserRegs, Walk, END_UNSET};
pub use walk::{
    settle_top_stub, simple_frames, start_at_anchor, unwind_step, walk_stack, MAX_WALK_STEPS,
};
