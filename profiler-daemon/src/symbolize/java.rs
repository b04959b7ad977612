//! Java frames, per JVM: keeps each JVM's name sources (its memory, and the sidecar agent's
//! records when the agent is loaded) and asks [`crate::java_names`]' policy to name each frame.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use profiler_common::{FrameKind, UserFrame, BCI_UNKNOWN};

use crate::hotspot::jvm::Jvm;
use crate::hotspot::names::BlobInfo;
use crate::hotspot::remote::RemoteMemory;
use crate::hotspot::thread_directory::ThreadDirectory;
use crate::java_names::{policy, CodePc, Named, Unnamed, UnnamedReason};
use crate::sidecar::SidecarIndex;
use crate::symbolize::java_reader::{MemoryNameCaches, SharedMemoryNames};

/// One JVM's name sources.
struct JvmSources<M: RemoteMemory> {
    /// Shared with the Java name reader, which fills them ahead.
    memory: SharedMemoryNames<M>,
    /// The agent's records, if this is a live process whose namespace pid is known.
    sidecar: Option<SidecarIndex>,
    /// Whether a frame was named from the sidecar yet (logged once per JVM).
    sidecar_used: bool,
}

/// The sidecar agents' own reports, summed over the JVMs tracked.
#[derive(Clone, Debug, Default)]
pub struct SidecarTotals {
    /// Agents that reported their stats.
    pub agents: u64,
    pub heap_live_bytes: u64,
    /// Records the agents could not write since the previous call.
    pub new_dropped_records: u64,
    /// JVMs whose records file was last refused or unreadable, by reason.
    pub refused: BTreeMap<&'static str, u64>,
}

/// Resolves Java frames of many JVMs.
pub struct JavaSymbolizer<M: RemoteMemory> {
    jvms: HashMap<u32, JvmSources<M>>,
    /// Every JVM's memory name caches, shared with the Java name reader.
    memory: MemoryNameCaches<M>,
    /// Each JVM's Java threads as the JVM tracker read them (empty without a tracker).
    threads: ThreadDirectory,
}

impl<M: RemoteMemory> Default for JavaSymbolizer<M> {
    fn default() -> Self {
        Self {
            jvms: HashMap::new(),
            memory: MemoryNameCaches::default(),
            threads: ThreadDirectory::default(),
        }
    }
}

impl<M: RemoteMemory> JavaSymbolizer<M> {
    /// Finds the tids of threads the sidecar agents list by `JavaThread*` in `threads`.
    pub fn set_thread_directory(&mut self, threads: ThreadDirectory) {
        self.threads = threads;
    }

    /// Names from `caches`, which the Java name reader fills.
    pub fn share_memory_names(&mut self, caches: MemoryNameCaches<M>) {
        self.memory = caches;
    }

    /// The caches it names from.
    pub fn memory_names(&self) -> MemoryNameCaches<M> {
        self.memory.clone()
    }

    /// True while neither it nor the reader knows a JVM.
    pub fn is_empty(&self) -> bool {
        self.jvms.is_empty() && self.memory.is_empty()
    }

    pub fn has(&self, pid: u32) -> bool {
        self.jvms.contains_key(&pid)
    }

    pub fn add(&mut self, jvm: Arc<Jvm>, memory: M) {
        let pid = jvm.pid;
        let (memory, _) = self.memory.of(jvm, || memory);
        self.jvms.insert(pid, JvmSources::new(pid, memory));
    }

    /// Takes in the JVMs the Java name reader met first (their frames come before their first
    /// profile is built), so that their agents' records are read while the interval runs.
    pub fn adopt_read_jvms(&mut self) {
        for (jvm, memory) in self.memory.entries() {
            self.jvms
                .entry(jvm.pid)
                .or_insert_with(|| JvmSources::new(jvm.pid, memory));
        }
    }

    /// The Java thread names the sidecar agent reported in `pid`, if it has an agent; threads
    /// it listed by `JavaThread*` are given their tids from the JVM tracker's latest read.
    pub fn thread_names(&mut self, pid: u32) -> Option<&mut crate::sidecar::threads::ThreadNames> {
        let sidecar = self.jvms.get_mut(&pid)?.sidecar.as_mut()?;
        sidecar.refresh();
        if sidecar.threads.pending() > 0 {
            if let Some(threads) = self.threads.get(pid) {
                sidecar.threads.resolve(&threads, std::time::Instant::now());
            }
        }
        Some(&mut sidecar.threads)
    }

    /// Reads the new records of the JVMs whose agent is loaded, or `expected` to be soon (each
    /// index limits how often it reads), and looks once for the records of each new JVM (its
    /// agent may have been loaded before the daemon met it). Others are looked at when their
    /// profile is built: looking for an agent that nobody loads costs a path walk per JVM.
    pub fn read_sidecars(&mut self, expected: impl Fn(u32) -> bool) {
        for (&pid, jvm) in &mut self.jvms {
            if let Some(sidecar) = jvm.sidecar.as_mut() {
                if sidecar.active || sidecar.never_read() || expected(pid) {
                    sidecar.refresh();
                }
            }
        }
    }

    /// What the sidecar agents of all JVMs report about themselves.
    pub fn sidecar_totals(&mut self) -> SidecarTotals {
        let mut totals = SidecarTotals::default();
        for sidecar in self.jvms.values_mut().filter_map(|j| j.sidecar.as_mut()) {
            sidecar.refresh();
            if let Some(stats) = sidecar.agent_stats() {
                totals.agents += 1;
                totals.heap_live_bytes += stats.heap_live_bytes;
            }
            totals.new_dropped_records += sidecar.take_new_drops();
            if let Some(reason) = sidecar.refused() {
                *totals.refused.entry(reason).or_default() += 1;
            }
        }
        totals
    }

    /// Forgets JVM `pid`, which exited.
    pub fn remove(&mut self, pid: u32) {
        self.memory.remove(pid);
        if let Some(sidecar) = self.jvms.remove(&pid).and_then(|jvm| jvm.sidecar) {
            sidecar.jvm_exited();
        }
    }

    /// The JVMs it or the reader holds anything of.
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.jvms.keys().copied().collect();
        pids.extend(self.memory.pids());
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Names one Java frame of `pid`. `top` is true for the interrupted frame (its pc is not a
    /// return address). Misses are marker lines, listed in [`Named::unnamed`] for the caller
    /// to count.
    pub fn resolve(&mut self, pid: u32, frame: &UserFrame, top: bool) -> Named {
        let Some(jvm) = self.jvms.get_mut(&pid) else {
            return Named::unknown(Unnamed::Frame, UnnamedReason::NoJvm);
        };
        match frame.kind() {
            Some(FrameKind::Interpreted) => {
                let method = {
                    let mut memory = jvm.memory.lock();
                    memory.bound_caches();
                    memory.method(frame.addr(), frame.cookie)
                };
                let bci = (frame.aux != BCI_UNKNOWN).then_some(frame.aux);
                policy::interpreted(method.as_deref().map_err(|r| *r), bci)
            }
            Some(FrameKind::Compiled) => jvm.compiled(frame, top),
            Some(FrameKind::AllocatedClass) => {
                let name = {
                    let mut memory = jvm.memory.lock();
                    memory.bound_caches();
                    memory.class_name(frame.addr(), frame.cookie, frame.aux)
                };
                policy::allocated_class(name.as_deref().map_err(|r| *r))
            }
            Some(FrameKind::Native) | None => {
                Named::unknown(Unnamed::Frame, UnnamedReason::BadFrameKind)
            }
        }
    }
}

impl<M: RemoteMemory> JvmSources<M> {
    fn new(pid: u32, memory: SharedMemoryNames<M>) -> Self {
        let sidecar = crate::sidecar::attach::Target::of(pid)
            .ok()
            .map(|target| SidecarIndex::new(target.pid, target.nspid, target.euid));
        Self {
            memory,
            sidecar,
            sidecar_used: false,
        }
    }

    fn compiled(&mut self, frame: &UserFrame, top: bool) -> Named {
        let code = {
            let mut memory = self.memory.lock();
            memory.bound_caches();
            memory.code(frame.addr(), frame.cookie, frame.aux)
        };
        // The agent's record of the nmethod at the same code start, if any.
        let recorded = match (code.as_deref(), self.sidecar.as_mut()) {
            (Ok(BlobInfo::Nmethod(nmethod)), Some(sidecar)) => {
                sidecar.refresh();
                sidecar.nmethod(nmethod.code_begin).cloned()
            }
            _ => None,
        };
        let pc = CodePc {
            offset: frame.aux,
            top,
        };
        let named = policy::compiled(
            code.as_deref().map(BlobInfo::names).map_err(|r| *r),
            recorded.as_deref(),
            || match code.as_deref() {
                Ok(BlobInfo::Nmethod(nmethod)) => nmethod.chain(pc.offset, pc.top),
                _ => Vec::new(),
            },
            pc,
        );
        if named.from_sidecar && !self.sidecar_used {
            self.sidecar_used = true;
            tracing::info!(
                pid = self.memory.lock().pid(),
                nmethods = self.sidecar.as_ref().map_or(0, SidecarIndex::len),
                "java frames named from the sidecar agent's records"
            );
        }
        named
    }
}
