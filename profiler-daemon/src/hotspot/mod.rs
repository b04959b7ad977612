//! HotSpot introspection from outside the JVM: find JVMs, read their VMStructs tables, derive
//! each JVM's layout, and describe it to the BPF unwinder.
//!
//! Sources: HotSpot's `vmStructs.cpp` (what is exported), `heap.{hpp,cpp}` (code heaps and
//! segment maps), `frame_x86.hpp` (interpreter frame slots), `nmethod.hpp`. What the daemon
//! relies on, and the offsets seen on JDK 11, 17, 21 and 25: `docs/hotspot-vmstructs.md`,
//! `docs/hotspot-unwinding.md`, `docs/java-naming.md`.
//!
//! - [`remote`]: bounded reads of the target's memory (`process_vm_readv`, or a fake).
//! - [`libjvm`]: libjvm.so in a process, and its exported `gHotSpot*` symbols.
//! - [`vmstructs`]: the four tables, parsed defensively.
//! - [`layout`]: the fields we need, by name with alternates (no version tables).
//! - [`jvm`]: one JVM: version, layout, code heaps, interpreter, call stub.
//! - [`jvm_directory`]: each JVM inspected once, shared by the tracker and the symbolizer.
//! - [`unwind_info`]: the `#[repr(C)]` record the BPF side reads.
//! - [`tracker`]: JVMs coming and going, pushed to and removed from the BPF map.
//! - [`tracker_metrics`]: the tracker's families on the metrics endpoint.
//! - [`thread_directory`]: each JVM's Java threads by `JavaThread*`, as the tracker read them.
//! - [`thread_exits`]: what the ended threads of JVMs before JDK 14 allocated, from their hook.
//! - [`names`]: Java names from the JVM's memory, a name source of [`crate::java_names`].
//! - [`symbol`]: `Symbol`s read as names, verified and refused when they are none.
//! - [`code_proof`]: that a sampled code blob is still the one sampled, before it names a frame.
//!
//! Not supported yet: JDK 8's single code heap layout (`CodeCache::_heap`), aarch64.

pub mod code_frees;
pub mod code_proof;
pub mod jvm;
pub mod jvm_directory;
pub mod layout;
pub mod libjvm;
pub mod libjvm_hooks;
pub mod names;
pub mod remote;
pub mod symbol;
pub mod thread_directory;
pub mod thread_exits;
pub mod tracker;
pub mod tracker_metrics;
pub mod unsigned5;
pub mod unwind_info;
pub mod virtual_threads;
pub mod vmstructs;

#[cfg(test)]
mod contract_tests;
/// Its fake JVM with a stub is the Java name reader's test fixture too.
#[cfg(test)]
pub(crate) mod naming_tests;
