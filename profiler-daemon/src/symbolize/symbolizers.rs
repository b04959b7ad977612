//! Every name source behind one dispatch. A profile's addresses are named in one batch per
//! source ([`Symbolizers::names_of`]: kernel, native), then each user frame by its kind
//! ([`ProcessNames`], the profile builder's [`ProfileNames`]): native frames from the batch,
//! Java frames by the JVM's symbolizer, once per distinct frame of the profile.

use std::sync::Arc;

use hashbrown::HashMap;
use profiler_common::UserFrame;

use super::java::JavaSymbolizer;
use super::kernel::KernelSymbolizer;
use super::name_guard::{self, NameOrigin, RefusedNames};
use super::native::NativeSymbolizer;
use super::ResolvedFrame;
use crate::aggregate::ProcessStacks;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::remote::ProcessMemory;
use crate::java_names::UnnamedCounts;
use crate::process::ProcessTable;
use crate::profile_model::{Frame, FrameKind, NameSource};
use crate::profiles::ProfileNames;
use crate::record::UserFrameKey;

/// The symbolizers, kept across intervals so their caches pay off.
#[derive(Default)]
pub struct Symbolizers {
    pub native: NativeSymbolizer,
    pub kernel: KernelSymbolizer,
    pub java: JavaSymbolizer<ProcessMemory>,
    /// Java marker frames put in profiles, by reason (shared with the metrics endpoint).
    pub java_unnamed: Arc<UnnamedCounts>,
    /// User frame names refused on their way into a profile, by reason (shared with the
    /// metrics endpoint).
    pub refused_names: Arc<RefusedNames>,
    /// The host's JVMs as inspected once, shared with the JVM tracker (see `with_jvms`).
    pub jvms: JvmDirectory,
}

/// One profile's names: its kernel and native frames named in one batch per source, Java
/// frames and threads asked of the Java symbolizer.
pub struct ProcessNames<'a> {
    pid: u32,
    symbolizers: &'a mut Symbolizers,
    kernel: HashMap<u64, Arc<ResolvedFrame>>,
    native: HashMap<u64, Arc<ResolvedFrame>>,
    unknown: ResolvedFrame,
}

impl Symbolizers {
    /// The names of `pid`'s profile of `stacks`: every kernel and native address named now
    /// (each distinct one once, one lookup per source), and the JVM made known if a Java
    /// frame is there.
    pub fn names_of<'a>(
        &'a mut self,
        pid: u32,
        stacks: &ProcessStacks,
        processes: &mut ProcessTable,
    ) -> ProcessNames<'a> {
        let mut kernel_addrs: Vec<u64> = Vec::new();
        let mut native_addrs: Vec<u64> = Vec::new();
        let mut has_java = false;
        for (view, _) in stacks.stacks() {
            kernel_addrs.extend(view.kernel_ips());
            for (key, _) in view.keyed_user_frames() {
                match key {
                    UserFrameKey::Native(addr) => native_addrs.push(addr),
                    UserFrameKey::Java { .. } => has_java = true,
                }
            }
        }
        kernel_addrs.sort_unstable();
        kernel_addrs.dedup();
        native_addrs.sort_unstable();
        native_addrs.dedup();
        let kernel = kernel_addrs
            .iter()
            .copied()
            .zip(self.kernel.resolve(&kernel_addrs))
            .collect();
        let native = resolve_native(pid, &native_addrs, processes, &mut self.native);
        if has_java {
            self.ensure_jvm(pid, processes);
        }
        ProcessNames {
            pid,
            symbolizers: self,
            kernel,
            native,
            unknown: ResolvedFrame::named("[unknown]", None),
        }
    }

    /// Makes sure the Java symbolizer knows the JVM `pid`; false if it cannot be read.
    pub fn ensure_jvm(&mut self, pid: u32, processes: &ProcessTable) -> bool {
        if self.java.has(pid) {
            return true;
        }
        let Some(info) = processes.get(pid) else {
            return false;
        };
        let memory = ProcessMemory::new(pid);
        match self.jvms.inspect(info, &memory) {
            Ok(jvm) => {
                self.java.add(jvm, memory);
                true
            }
            Err(err) => {
                tracing::debug!(pid, %err, "cannot read JVM for symbolization");
                false
            }
        }
    }

    /// Forgets per-process state of processes the table no longer knows.
    pub fn forget_exited(&mut self, processes: &ProcessTable) {
        self.native.forget_exited(|pid, start_time| {
            processes
                .get(pid)
                .is_some_and(|process| process.start_time == start_time)
        });
        for pid in self.java.pids() {
            if processes.get(pid).is_none() {
                self.java.remove(pid);
                self.jvms.forget(pid);
            }
        }
    }
}

impl ProfileNames for ProcessNames<'_> {
    fn kernel(&mut self, ip: u64) -> Frame {
        let frame = self.kernel.get(&ip).map_or(&self.unknown, |f| f.as_ref());
        Frame::new(FrameKind::Kernel, ip, frame.clone())
    }

    /// By the frame's kind, past the [`name_guard`]. Java markers are counted in
    /// `java_unnamed`, refused names in `refused_names`.
    fn user(&mut self, key: UserFrameKey, frame: &UserFrame) -> Frame {
        let symbolizers = &mut *self.symbolizers;
        let (kind, named, origin) = match key {
            UserFrameKey::Native(addr) => {
                let named = self.native.get(&addr).map_or(&self.unknown, |f| f.as_ref());
                (FrameKind::Native, named.clone(), NameOrigin::SymbolTable)
            }
            UserFrameKey::Java { top, .. } => {
                let named = symbolizers.java.resolve(self.pid, frame, top);
                symbolizers.java_unnamed.add_all(&named.unnamed);
                (named.kind, named.frame, NameOrigin::Memory)
            }
        };
        let named = name_guard::guard(named, origin, &symbolizers.refused_names);
        // The address looked up; Java frames have none of their own in the process's mappings.
        let address = match key {
            UserFrameKey::Native(addr) => addr,
            UserFrameKey::Java { .. } => 0,
        };
        Frame::new(kind, address, named)
    }

    fn thread(&mut self, tid: u32, comm: &str) -> (String, NameSource) {
        match self.symbolizers.java.thread_names(self.pid) {
            Some(names) => names.name_of(tid, comm),
            None => (comm.to_owned(), NameSource::Comm),
        }
    }
}

/// Names `addrs` of process `pid` from its mappings, read again once if some lie outside them
/// (the process mapped more since: dlopen, JIT).
fn resolve_native(
    pid: u32,
    addrs: &[u64],
    processes: &mut ProcessTable,
    native: &mut NativeSymbolizer,
) -> HashMap<u64, Arc<ResolvedFrame>> {
    let mut resolved = HashMap::with_capacity(addrs.len());
    let Some(info) = processes.get(pid) else {
        return resolved;
    };
    let frames = native.resolve(info, addrs);
    let mut unmapped = Vec::new();
    for (&addr, frame) in addrs.iter().zip(frames) {
        match frame {
            Some(frame) => {
                resolved.insert(addr, frame);
            }
            None => unmapped.push(addr),
        }
    }
    if !unmapped.is_empty() {
        if let Some(info) = processes.refresh(pid) {
            for (addr, frame) in unmapped.iter().zip(native.resolve(info, &unmapped)) {
                if let Some(frame) = frame {
                    resolved.insert(*addr, frame);
                }
            }
        }
    }
    resolved
}
