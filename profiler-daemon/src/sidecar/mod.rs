//! The JVMTI sidecar from the daemon's side: loading the agent (`profiler-jvmti`) into running
//! JVMs ([`attach`](mod@attach), when [`policy`] says so) and keeping what it recorded at hand for the Java
//! symbolizer ([`index`], from the file [`records_location`] finds), and the Java thread names it reported ([`threads`]).

pub mod attach;
pub mod index;
pub mod policy;
pub mod records_location;
pub mod threads;

pub use attach::attach;
pub use index::SidecarIndex;
pub use policy::{AttachPolicy, Attacher, AttachesStarted};
