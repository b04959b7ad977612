//! The JVMs of this host, each inspected once and shared: the JVM tracker finds them and pushes
//! their layouts into the BPF maps, the symbolizer names their frames, and both hold the same
//! [`Jvm`]. Inspecting a JVM reads libjvm's symbols and its VMStructs tables; one directory does
//! that once per JVM instead of once per reader and keeps the two views of a JVM the same. A
//! layout is never shared between JVMs (see [`Jvm::inspect`]).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};

use super::jvm::{Jvm, JvmError};
use super::remote::RemoteMemory;
use crate::process::ProcessInfo;
use crate::process_key::ProcessKey;

/// Cheap to clone: clones share one directory.
#[derive(Clone, Default)]
pub struct JvmDirectory(Arc<Mutex<Directory>>);

#[derive(Default)]
struct Directory {
    /// By pid, with the process's identity: a reused pid is another process.
    jvms: HashMap<u32, (ProcessKey, Arc<Jvm>)>,
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

    /// Forgets an exited process (either reader may say so first; the other keeps its `Arc`).
    pub fn forget(&self, pid: u32) {
        self.lock().jvms.remove(&pid);
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
