//! The JVMTI sidecar from the daemon's side: loading the agent (`profiler-jvmti`) into running
//! JVMs ([`attach`]) and keeping what it recorded at hand for the Java symbolizer ([`index`]).

pub mod attach;
pub mod index;

pub use attach::{attach, Attached};
pub use index::SidecarIndex;
