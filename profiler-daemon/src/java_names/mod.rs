//! Java frame naming, in one place: what a Java frame is called, from which source, and what is
//! shown when it cannot be named. "Names are never wrong": a frame that cannot be verified shows
//! as a marker naming the reason, never with another method's name.
//!
//! The name sources are inputs, and this module imports neither:
//!
//! - the JVM's memory (`crate::hotspot::names`): methods read by `Method*` and verified by their
//!   cookie, code blobs by `CodeBlob*` and compile id, nmethod scope chains from `PcDesc`s;
//! - the JVMTI sidecar agent's records (`crate::sidecar::index`), parsed into
//!   [`RecordedNmethod`]s.
//!
//! `crate::symbolize::java` keeps both per JVM and asks [`policy`] to name each frame.
//!
//! - [`method`]: [`MethodInfo`] and the normalisation every source applies (dotted class names
//!   without the per-run address of hidden classes, source files qualified with the package).
//! - [`pc`]: the pc-to-scope rule, for `PcDesc`s and the agent's pc records alike.
//! - [`recorded`]: the agent's view of an nmethod, as data.
//! - [`policy`]: memory or sidecar, verification, and the marker lines of misses.
//! - [`reason`]: [`UnnamedReason`], one per kind of miss: its name is in the marker
//!   (`[unknown java method: method_reused]`) and labels
//!   `profiler_java_frames_unnamed_total{reason}`, counted in [`UnnamedCounts`].

pub mod method;
pub mod pc;
pub mod policy;
pub mod reason;
pub mod recorded;

pub use method::{internal_of_signature, MethodInfo};
pub use pc::record_at;
pub use policy::{CodeNames, CodePc, MethodName, Named, NmethodNames};
pub use reason::{Unnamed, UnnamedCounts, UnnamedReason};
pub use recorded::RecordedNmethod;
