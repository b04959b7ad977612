//! JVMTI sidecar for the profiler: an agent loaded into a JVM (`-agentpath:` or dynamic attach)
//! that records what the JIT produced, so the daemon can name compiled frames exactly.
//!
//! # Options
//!
//! `-agentpath:/path/libprofiler_jvmti.so=OPTIONS`, or the options of a dynamic attach:
//! comma-separated, all optional ([`options`]):
//!
//! - `dir=PATH`: the records directory (default `/tmp/.jvm-profiler-<pid>`);
//! - `max_bytes=N`: size cap of one generation of the records file (default 32 MiB);
//! - `assume_unknown_version`: behave as on a JVM version the agent does not know (for tests
//!   of that path): no `Method*` is read, every `method_ptr` is 0.
//!
//! An unknown or malformed option stops the agent before it does anything.
//!
//! # What it records
//!
//! For every compiled method (JVMTI `CompiledMethodLoad`, replayed with `GenerateEvents` for code
//! that existed before the agent loaded): code address and size, the `Method*` behind each
//! jmethodID (only on the JVM versions where that is what a jmethodID points to: [`version`]),
//! the inline records (pc -> chain of (method, bci), innermost first) and, per method involved,
//! class signature, name, signature, source file and line number table. Names are resolved
//! inside the callback because jmethodIDs can go stale once a class unloads.
//! `CompiledMethodUnload` and `DynamicCodeGenerated` (stubs) are recorded too, and the agent's
//! own state: an `AgentStatus` record (recording or not and why, whether `Method*` is read, the
//! JVM version it saw) and `AgentStats` records (its heap, records written and dropped).
//!
//! # Channel to the daemon
//!
//! An append-only records file in the JVM's own `/tmp`, rotated past a size cap; its format,
//! writer and reader are in `profiler-jvmti-records`.
//!
//! # Safety towards the JVM
//!
//! - Every entry point catches panics; nothing is unwrapped.
//! - `Method*` is read from a jmethodID only on HotSpot 11 to 25, the versions where that holds
//!   and that were tested; on any other version, or one it cannot read, the agent records with
//!   `method_ptr = 0` (the daemon then names those frames from the JVM's memory).
//! - Start-up never leaves a callback pointing into an unloaded library: failures before the
//!   callbacks are installed are reported to the JVM (which may unload the agent); failures
//!   after leave the agent loaded and inert, and are reported in the records ([`agent`]).
//! - JVM threads never wait for I/O: they encode a record and push it to a bounded queue
//!   ([`queue`]), dropping and counting it when full; the agent's own thread does every write,
//!   rotation and replay.
//! - Each record is built within a byte budget (the format's 16 MiB record limit), charged as
//!   it is built, so a huge method cannot make a compiler thread allocate without bound
//!   ([`describe`]).
//! - The agent keeps no per-method state, so its memory does not grow with the number of
//!   compilations. It counts its own heap ([`heap`]) and reports it, with the records it wrote
//!   and dropped, in a stats record every few seconds.

mod agent;
mod describe;
mod ffi;
mod heap;
mod options;
mod queue;
mod version;
