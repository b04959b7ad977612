//! The JVMTI sidecar from the daemon's side: loading the agent (`profiler-jvmti`) into running
//! JVMs. Its records are read with `profiler_jvmti::channel::Reader`.

pub mod attach;

pub use attach::{attach, Attached};
