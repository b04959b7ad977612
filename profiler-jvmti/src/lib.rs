//! JVMTI sidecar for the profiler: an agent loaded into a JVM (`-agentpath:` or dynamic attach)
//! that records what the JIT produced, so the daemon can name compiled frames exactly.
//!
//! # What it records
//!
//! For every compiled method (JVMTI `CompiledMethodLoad`, replayed with `GenerateEvents` for code
//! that existed before the agent loaded): code address and size, the `Method*` behind each
//! jmethodID, the inline records (pc -> chain of (method, bci), innermost first) and, per method
//! involved, class signature, name, signature, source file and line number table. Names are
//! resolved inside the callback because jmethodIDs can go stale once a class unloads.
//! `CompiledMethodUnload` and `DynamicCodeGenerated` (stubs) are recorded too.
//!
//! # Channel to the daemon
//!
//! An append-only records file in the JVM's own `/tmp`, rotated past a size cap; its format,
//! writer and reader are in `profiler-jvmti-records`.
//!
//! # Safety towards the JVM
//!
//! Every entry point catches panics; nothing is unwrapped. JVM threads only encode a record and
//! hold a mutex for one `write(2)`; replays run on the agent's own daemon thread. The agent keeps
//! no per-method state, so its memory does not grow with the number of compilations. If the
//! file cannot be written the records are dropped and counted; the JVM never waits on the daemon.
//! The agent counts its own heap ([`heap`]) and reports it, with the records it wrote and
//! dropped, in a stats record every few seconds.

mod agent;
mod ffi;
mod heap;
