//! The channel between the JVMTI sidecar agent (`profiler-jvmti`, which writes) and the daemon
//! (which reads): an append-only records file in the JVM's own `/tmp`,
//! `/tmp/.jvm-profiler-<nspid>/records` (see [`channel`]).
//!
//! A file was chosen over a socket because it needs no agent thread serving clients, costs the
//! JVM nothing when nobody reads, works across mount namespaces (the daemon opens it as
//! `/proc/PID/root/tmp/...`) and lets the daemon read incrementally from the offset it reached.
//! Each record is length-prefixed ([`record`]); the file starts with a versioned header carrying
//! a generation number. When the file passes its size cap the agent writes a fresh file, renames
//! it over `records` (a new inode and generation) and replays the code that is still alive into
//! it, so one generation is always complete on its own and the disk use stays bounded. The
//! daemon notices the inode change and starts over from the new file.
//!
//! A crate of its own so that the agent, a `cdylib`, can count its own heap with a global
//! allocator without imposing it on the daemon and the tests, which link this crate.
//!
//! The codec is written by hand (little-endian fields, length-prefixed strings) rather than with
//! a serialization crate: the agent encodes inside the JVM it is loaded in, where every
//! dependency is code and heap the JVM pays for, and the daemon decodes a file another user can
//! write, so each length is checked against what is left before it is used, which is easiest to
//! see in code this small. Both sides are tested against each other, and the reader with
//! truncated records, unknown kinds and garbage ([`record`]'s tests).

pub mod channel;
pub mod record;
