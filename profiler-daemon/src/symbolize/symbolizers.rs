//! Every name source behind one dispatch. A profile's addresses are named in one batch per
//! source ([`Symbolizers::prepare`]: kernel, native), then each user frame by its kind
//! ([`ProcessFrames::user`], a `match` over [`FrameKind`]): native frames from the batch, Java
//! frames by the JVM's symbolizer, once per distinct frame of the profile.

use std::sync::Arc;

use hashbrown::HashMap;
use profiler_common::{FrameKind, UserFrame};

use super::java::JavaSymbolizer;
use super::kernel::KernelSymbolizer;
use super::name_guard::{self, NameOrigin, RefusedNames};
use super::native::NativeSymbolizer;
use super::ResolvedFrame;
use crate::aggregate::ProcessStacks;
use crate::frame_kind::ShownKind;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::remote::ProcessMemory;
use crate::java_names::UnnamedCounts;
use crate::process::ProcessTable;

/// The symbolizers, kept across intervals so their caches pay off.
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
    /// Append frame-kind suffixes (`_[j]`, `_[i]`, `_[0]`, `_[1]`, `_[k]`).
    pub annotate: bool,
}

/// How a user frame is told apart from the profile's others (its location), and what names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserFrameKey {
    /// A native frame, by the address looked up (see [`lookup_address`]).
    Native(u64),
    /// A HotSpot frame as the BPF unwinder recorded it; the top frame resolves differently from
    /// a return address, hence `top`.
    Java {
        kind: u8,
        addr: u64,
        aux: u32,
        cookie: u32,
        top: bool,
    },
}

/// One profile's kernel and native frames, named in one batch per source.
pub struct ProcessFrames {
    pid: u32,
    kernel: HashMap<u64, Arc<ResolvedFrame>>,
    native: HashMap<u64, Arc<ResolvedFrame>>,
    unknown: ResolvedFrame,
}

impl Symbolizers {
    pub fn new(annotate: bool) -> Self {
        Self {
            native: NativeSymbolizer::new(),
            kernel: KernelSymbolizer::new(),
            java: JavaSymbolizer::new(annotate),
            java_unnamed: Arc::default(),
            refused_names: Arc::default(),
            jvms: JvmDirectory::default(),
            annotate,
        }
    }

    /// Names every kernel and native address of `stacks` (each distinct one once, one lookup
    /// per source), and makes sure the JVM is known if a Java frame is there.
    pub fn prepare(
        &mut self,
        pid: u32,
        stacks: &ProcessStacks,
        processes: &mut ProcessTable,
    ) -> ProcessFrames {
        let mut kernel_addrs: Vec<u64> = Vec::new();
        let mut native_addrs: Vec<u64> = Vec::new();
        let mut has_java = false;
        for (view, _) in stacks.stacks() {
            kernel_addrs.extend(view.kernel_ips());
            for (index, frame) in view.user_frames().enumerate() {
                match user_frame_key(index, &frame) {
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
        ProcessFrames {
            pid,
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
        for pid in self.java.pids() {
            if processes.get(pid).is_none() {
                self.java.remove(pid);
                self.jvms.forget(pid);
            }
        }
    }
}

impl ProcessFrames {
    /// The kernel frame at `ip`, with its kind's suffix if frames are annotated.
    pub fn kernel(&self, ip: u64, annotate: bool) -> ResolvedFrame {
        let frame = self.kernel.get(&ip).map_or(&self.unknown, |f| f.as_ref());
        if annotate {
            with_suffix(frame, ShownKind::Kernel.suffix())
        } else {
            frame.clone()
        }
    }

    /// The name of user frame `frame` (`key` from [`user_frame_key`]), by its kind, past the
    /// [`name_guard`]. Java markers are counted in `symbolizers.java_unnamed`, refused names in
    /// `symbolizers.refused_names`: call once per distinct frame of a profile, as it shows them.
    pub fn user(
        &self,
        symbolizers: &mut Symbolizers,
        key: UserFrameKey,
        frame: &UserFrame,
    ) -> ResolvedFrame {
        let (named, origin) = match key {
            UserFrameKey::Native(addr) => (
                self.native
                    .get(&addr)
                    .map_or(&self.unknown, |f| f.as_ref())
                    .clone(),
                NameOrigin::SymbolTable,
            ),
            UserFrameKey::Java { top, .. } => {
                let named = symbolizers.java.resolve(self.pid, frame, top);
                symbolizers.java_unnamed.add_all(&named.unnamed);
                (named.frame, NameOrigin::Memory)
            }
        };
        name_guard::guard(named, origin, &symbolizers.refused_names)
    }
}

/// What tells user frame `index` of a stack (0: the interrupted instruction) apart, by its
/// kind. A native return address points after its call: one byte back is inside the call.
pub fn user_frame_key(index: usize, frame: &UserFrame) -> UserFrameKey {
    match frame.kind() {
        Some(FrameKind::Native) => UserFrameKey::Native(lookup_address(index, frame.addr)),
        // A kind BPF never writes goes to the Java symbolizer too, which shows it as the
        // `bad_frame_kind` marker.
        Some(FrameKind::Interpreted | FrameKind::Compiled | FrameKind::AllocatedClass) | None => {
            UserFrameKey::Java {
                kind: frame.kind,
                addr: frame.addr,
                aux: frame.aux,
                cookie: frame.cookie,
                top: index == 0,
            }
        }
    }
}

/// The address to look up for user frame `index`: frame 0 is the interrupted instruction, the
/// others are return addresses, which point after the call; one byte back is inside the call.
fn lookup_address(index: usize, addr: u64) -> u64 {
    if index == 0 {
        addr
    } else {
        addr.saturating_sub(1)
    }
}

/// The frame with `suffix` on its function names.
fn with_suffix(frame: &ResolvedFrame, suffix: &str) -> ResolvedFrame {
    let mut frame = frame.clone();
    for line in &mut frame.lines {
        line.function.push_str(suffix);
    }
    frame
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
