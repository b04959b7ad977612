//! Turns one process's folded stacks into a symbolized pprof profile.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use hashbrown::HashMap;
use profiler_common::UnwindEnd;

use crate::aggregate::ProcessStacks;
use crate::hotspot::jvm::{Jvm, LayoutCache};
use crate::hotspot::remote::ProcessMemory;
use crate::java_names::UnnamedCounts;
use crate::pprof::{proto, LocationKey, ProfileBuilder};
use crate::process::ProcessTable;
use crate::record::comm_to_string;
use crate::symbolize::java::JavaSymbolizer;
use crate::symbolize::kernel::KernelSymbolizer;
use crate::symbolize::native::NativeSymbolizer;
use crate::symbolize::ResolvedFrame;
use profiler_common::FrameKind;

/// The symbolizers, kept across intervals so their caches pay off.
pub struct Symbolizers {
    pub native: NativeSymbolizer,
    pub kernel: KernelSymbolizer,
    pub java: JavaSymbolizer<ProcessMemory>,
    /// Java marker frames put in profiles, by reason (shared with the metrics endpoint).
    pub java_unnamed: Arc<UnnamedCounts>,
    /// VMStructs layouts by libjvm build-id, for JVMs met by the Java symbolizer.
    pub layouts: LayoutCache,
    /// Append frame-kind suffixes (`_[j]`, `_[i]`, `_[0]`, `_[1]`, `_[k]`).
    pub annotate: bool,
    /// Loads the sidecar agent into JVMs, if the configuration asks for it.
    pub attacher: crate::sidecar::Attacher,
}

impl Symbolizers {
    pub fn new(annotate: bool) -> Self {
        Self {
            native: NativeSymbolizer::new(),
            kernel: KernelSymbolizer::new(),
            java: JavaSymbolizer::new(annotate),
            java_unnamed: Arc::default(),
            layouts: LayoutCache::default(),
            annotate,
            attacher: crate::sidecar::Attacher::default(),
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
        match Jvm::inspect(info, &memory, &mut self.layouts) {
            Ok(jvm) => {
                self.java.add(jvm, memory);
                self.attacher.consider(info);
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
        self.attacher.retain(|pid| processes.get(pid).is_some());
        for pid in self.java.pids() {
            if processes.get(pid).is_none() {
                self.java.remove(pid);
            }
        }
    }
}

pub struct ProfileRequest<'a> {
    pub pid: u32,
    pub stacks: &'a ProcessStacks,
    pub frequency_hz: u64,
    pub start: SystemTime,
    pub duration: Duration,
}

pub struct BuiltProfile {
    pub pid: u32,
    pub comm: String,
    pub profile: proto::Profile,
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

pub fn build(
    request: ProfileRequest<'_>,
    processes: &mut ProcessTable,
    symbolizers: &mut Symbolizers,
) -> BuiltProfile {
    let ProfileRequest {
        pid,
        stacks,
        frequency_hz,
        start,
        duration,
    } = request;

    // Every distinct address once, then one batched lookup per source.
    let mut kernel_addrs: Vec<u64> = Vec::new();
    let mut user_addrs: Vec<u64> = Vec::new();
    let mut thread_comm: Option<String> = None;
    let mut has_java = false;
    for (view, _) in stacks.stacks() {
        kernel_addrs.extend(view.kernel_ips());
        for (index, frame) in view.user_frames().enumerate() {
            if frame.kind == FrameKind::Native as u8 {
                user_addrs.push(lookup_address(index, frame.addr));
            } else {
                has_java = true;
            }
        }
        if thread_comm.is_none() {
            thread_comm = Some(comm_to_string(view.thread_name()));
        }
    }
    kernel_addrs.sort_unstable();
    kernel_addrs.dedup();
    user_addrs.sort_unstable();
    user_addrs.dedup();

    let kernel_frames: HashMap<u64, Arc<ResolvedFrame>> = kernel_addrs
        .iter()
        .copied()
        .zip(symbolizers.kernel.resolve(&kernel_addrs))
        .collect();
    let user_frames = resolve_user(pid, &user_addrs, processes, &mut symbolizers.native);
    if has_java {
        symbolizers.ensure_jvm(pid, processes);
    }

    let comm = processes
        .get(pid)
        .map(|info| info.comm.clone())
        .or(thread_comm)
        .unwrap_or_default();
    let pid_label = pid.to_string();

    let mut builder = ProfileBuilder::new_cpu(frequency_hz, start, duration);
    let unknown = ResolvedFrame::named("[unknown]", None);
    for (view, count) in stacks.stacks() {
        let mut locations = Vec::with_capacity(
            view.header.kernel_frames as usize + view.header.user_frames as usize + 1,
        );
        for ip in view.kernel_ips() {
            let key = LocationKey::Kernel(ip);
            let id = builder.location_with(key, ip, || {
                let frame = kernel_frames.get(&ip).map_or(&unknown, |f| f.as_ref());
                if symbolizers.annotate {
                    with_suffix(frame, "_[k]")
                } else {
                    frame.clone()
                }
            });
            locations.push(id);
        }
        for (index, user) in view.user_frames().enumerate() {
            if user.kind == FrameKind::Native as u8 {
                let addr = lookup_address(index, user.addr);
                let frame = user_frames.get(&addr).map_or(&unknown, |f| f.as_ref());
                locations.push(builder.location(LocationKey::User(addr), addr, frame));
            } else {
                let top = index == 0;
                let key = LocationKey::Java {
                    kind: user.kind,
                    addr: user.addr,
                    aux: user.aux,
                    cookie: user.cookie,
                    top,
                };
                let java = &mut symbolizers.java;
                let unnamed = &symbolizers.java_unnamed;
                // Counted once per location of the profile, as it shows them (not per sample).
                locations.push(builder.location_with(key, 0, || {
                    let named = java.resolve(pid, &user, top);
                    unnamed.add_all(&named.unnamed);
                    named.frame
                }));
            }
        }
        if let Some(marker) = truncation_marker(view.user_end()) {
            let frame = ResolvedFrame::named(format!("[truncated: {}]", marker.name()), None);
            locations.push(builder.location(LocationKey::Marker(marker as u8), 0, &frame));
        }
        let thread_name = comm_to_string(view.thread_name());
        builder.add_sample(
            locations,
            count,
            &[
                ("pid", &pid_label),
                ("comm", &comm),
                ("thread_name", &thread_name),
            ],
        );
    }
    BuiltProfile {
        pid,
        comm,
        profile: builder.finish(),
    }
}

/// Which stack ends deserve a visible marker at the root. A frame-pointer walk that runs into
/// code built without frame pointers (libc's start-up code, typically) ends with a failed or
/// non-monotonic read: that is the normal end of native stacks, counted but not marked. A walk
/// cut by the depth bound, or stopped by a Java frame it could not unwind, is marked, so the
/// missing outer frames are visible instead of silently gone.
fn truncation_marker(end: Option<UnwindEnd>) -> Option<UnwindEnd> {
    match end? {
        end @ (UnwindEnd::MaxDepth
        | UnwindEnd::NoCodeBlob
        | UnwindEnd::BadJavaFrame
        | UnwindEnd::JavaReadFailed) => Some(end),
        UnwindEnd::Complete
        | UnwindEnd::ReadFailed
        | UnwindEnd::NotMonotonic
        | UnwindEnd::NoUserContext => None,
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

fn resolve_user(
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
    // Addresses outside the mappings we read: the process has mapped more since (dlopen, JIT).
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn java_unwind_failures_and_depth_cuts_are_marked() {
        assert_eq!(
            truncation_marker(Some(UnwindEnd::MaxDepth)),
            Some(UnwindEnd::MaxDepth)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::NoCodeBlob)),
            Some(UnwindEnd::NoCodeBlob)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::BadJavaFrame)),
            Some(UnwindEnd::BadJavaFrame)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::JavaReadFailed)),
            Some(UnwindEnd::JavaReadFailed)
        );
        assert_eq!(truncation_marker(Some(UnwindEnd::NotMonotonic)), None);
        assert_eq!(truncation_marker(Some(UnwindEnd::Complete)), None);
        assert_eq!(truncation_marker(None), None);
    }
}
