//! The JVMs of this host, each inspected once and shared: the JVM tracker finds them and pushes
//! their layouts into the BPF maps, the symbolizer names their frames, and both hold the same
//! [`Jvm`]. Inspecting a JVM reads libjvm's symbols and its VMStructs tables; one directory does
//! that once per JVM instead of once per reader and keeps the two views of a JVM the same. A
//! layout is never shared between JVMs (see [`Jvm::inspect`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use super::jvm::{Jvm, JvmError};
use super::remote::RemoteMemory;
use crate::process::ProcessInfo;
use crate::process_key::ProcessKey;
use crate::profile_model::ProfileKind;

/// Cheap to clone: clones share one directory.
#[derive(Clone, Default)]
pub struct JvmDirectory(Arc<Mutex<Directory>>);

#[derive(Default)]
struct Directory {
    /// By pid, with the process's identity: a reused pid is another process.
    jvms: HashMap<u32, (ProcessKey, Arc<Jvm>)>,
    /// By pid, when the daemon began to see each kind of its events (see [`Watched`]).
    watched: HashMap<u32, Watched>,
}

/// When the daemon began to see a JVM's events: its waits as lock waits once its layout was
/// pushed (its threads are known, its thread-start hook attached), its allocations once its
/// libjvm's allocation hooks were. A profile of the interval in which that happened covers only
/// what came after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Watched {
    locks: Option<SystemTime>,
    allocations: Option<SystemTime>,
}

impl JvmDirectory {
    /// The JVM `process` runs: the one already inspected, or inspected now and remembered.
    /// Processes that are not JVMs (or not readable yet) are not remembered.
    pub fn inspect(
        &self,
        process: &ProcessInfo,
        memory: &dyn RemoteMemory,
    ) -> Result<Arc<Jvm>, JvmError> {
        let mut directory = self.lock();
        if let Some((key, jvm)) = directory.jvms.get(&process.pid) {
            if *key == process.key() {
                return Ok(jvm.clone());
            }
        }
        let jvm = Arc::new(Jvm::inspect(process, memory)?);
        directory
            .jvms
            .insert(process.pid, (process.key(), jvm.clone()));
        Ok(jvm)
    }

    /// The JVM inspected as `pid`, if any: for readers that meet a JVM only by its frames
    /// (whose layout, pushed by the tracker, says it was inspected).
    pub fn get(&self, pid: u32) -> Option<Arc<Jvm>> {
        self.lock().jvms.get(&pid).map(|(_, jvm)| jvm.clone())
    }

    /// Forgets an exited process (either reader may say so first; the other keeps its `Arc`).
    pub fn forget(&self, pid: u32) {
        let mut directory = self.lock();
        directory.jvms.remove(&pid);
        directory.watched.remove(&pid);
    }

    /// The JVM `pid`'s layout was pushed at `at`: its lock waits are seen from then.
    pub fn watch_locks_since(&self, pid: u32, at: SystemTime) {
        self.lock().watched.entry(pid).or_default().locks = Some(at);
    }

    /// The JVM `pid`'s allocation hooks were attached at `at`.
    pub fn watch_allocations_since(&self, pid: u32, at: SystemTime) {
        self.lock().watched.entry(pid).or_default().allocations = Some(at);
    }

    /// What a `kind` profile of `pid` over `start` and `duration` covers: from when its events
    /// were first seen, if that was within it.
    pub fn covered(
        &self,
        pid: u32,
        kind: ProfileKind,
        start: SystemTime,
        duration: Duration,
    ) -> (SystemTime, Duration) {
        let watched = self.lock().watched.get(&pid).copied().unwrap_or_default();
        let since = match kind {
            ProfileKind::Mutex | ProfileKind::Block => watched.locks,
            ProfileKind::Alloc => watched.allocations,
            _ => None,
        };
        let end = start + duration;
        match since {
            Some(since) if since > start && since < end => {
                (since, end.duration_since(since).unwrap_or_default())
            }
            _ => (start, duration),
        }
    }

    /// JVMs known now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.lock().jvms.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// A panic while the lock was held leaves nothing half-written that matters here (an
    /// insert or a removal either happened or not), so the directory stays usable.
    fn lock(&self) -> MutexGuard<'_, Directory> {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A JVM hooked 250 ms into an interval: its first allocation and lock profiles claim only
    /// what followed; the next intervals, and its CPU profiles, whole.
    #[test]
    fn a_first_profile_covers_only_what_came_after_the_hooks() {
        let directory = JvmDirectory::default();
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_000);
        let interval = Duration::from_secs(10);
        let hooked = start + Duration::from_millis(250);
        directory.watch_allocations_since(7, hooked);
        directory.watch_locks_since(7, hooked);
        for kind in [ProfileKind::Alloc, ProfileKind::Mutex, ProfileKind::Block] {
            assert_eq!(
                directory.covered(7, kind, start, interval),
                (hooked, Duration::from_millis(9_750)),
                "{kind:?}"
            );
            let next = start + interval;
            assert_eq!(directory.covered(7, kind, next, interval), (next, interval));
        }
        assert_eq!(
            directory.covered(7, ProfileKind::Cpu, start, interval),
            (start, interval)
        );
        assert_eq!(
            directory.covered(8, ProfileKind::Alloc, start, interval),
            (start, interval)
        );
        directory.forget(7);
        assert_eq!(
            directory.covered(7, ProfileKind::Alloc, start, interval),
            (start, interval)
        );
    }
    use crate::hotspot::remote::ProcessMemory;

    #[test]
    fn a_process_that_is_not_a_jvm_is_not_remembered() {
        let directory = JvmDirectory::default();
        let shared = directory.clone();
        let ourselves = ProcessInfo::read(std::process::id()).expect("our own /proc entry");
        let memory = ProcessMemory::new(std::process::id());
        assert!(shared.inspect(&ourselves, &memory).is_err());
        assert!(directory.is_empty());
    }
}
