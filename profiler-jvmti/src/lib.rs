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
//! An append-only file in the JVM's own `/tmp`: `/tmp/.jvm-profiler-<nspid>/records` (see
//! [`channel`]). A file was chosen over a socket because it needs no agent thread serving
//! clients, costs the JVM nothing when nobody reads, works across mount namespaces (the daemon
//! opens it as `/proc/PID/root/tmp/...`) and lets the daemon read incrementally from the offset
//! it reached. Each record is length-prefixed ([`record`]); the file starts with a versioned
//! header carrying a generation number. When the file passes its size cap the agent writes a
//! fresh file, renames it over `records` (a new inode and generation) and replays the code
//! that is still alive into it, so one generation is always complete on its own and the disk
//! use stays bounded. The daemon notices the inode change and starts over from the new file.
//!
//! # Safety towards the JVM
//!
//! Every entry point catches panics; nothing is unwrapped. JVM threads only encode a record and
//! hold a mutex for one `write(2)`; replays run on the agent's own daemon thread. The agent keeps
//! no per-method state, so its memory does not grow with the number of compilations. If the
//! file cannot be written the records are dropped and counted; the JVM never waits on the daemon.

pub mod channel;
pub mod record;

mod agent;
mod ffi;
