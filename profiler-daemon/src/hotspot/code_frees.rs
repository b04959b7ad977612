//! The code-free hook's counts (`profiler-ebpf/src/code_frees.rs`): each hooked JVM's count
//! of the code blobs it frees, which lets the walk use the blobs it remembers unread while the
//! count stands still. The hooks' owner ([`super::libjvm_hooks::LibjvmHooks`]) starts a JVM's
//! count once `CodeCache::free` is hooked in its libjvm and pauses it before the hook is
//! taken away: a count that says "counting" must have seen every free.

use std::collections::HashSet;

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::{CodeFreeCount, CODE_FREE_RESTART};

/// Most JVMs remembered as lost (each removal that stood for a failed pause; none seen).
const MAX_LOST: usize = 4096;

/// The `CODE_FREES` map.
pub struct CodeFreeCounts {
    map: BpfHashMap<MapData, u32, CodeFreeCount>,
    /// JVMs (pid, instance) whose count had to be removed rather than paused: a count started
    /// anew could pass through values their walks were stamped with, so they are not counted
    /// again.
    lost: HashSet<(u32, u32)>,
}

impl CodeFreeCounts {
    pub fn new(map: BpfHashMap<MapData, u32, CodeFreeCount>) -> Self {
        Self {
            map,
            lost: HashSet::new(),
        }
    }

    /// JVM `pid` (its `instance`) has its code frees hooked: counted from now on. A count
    /// paused before moves on past every value it had, so that no blob proven then is trusted
    /// for the frees missed meanwhile.
    pub fn start(&mut self, pid: u32, instance: u32) {
        if self.lost.contains(&(pid, instance)) {
            return;
        }
        let count = match self.map.get(&pid, 0) {
            Ok(entry) if entry.instance == instance && entry.counting != 0 => return,
            Ok(entry) if entry.instance == instance => entry.count.wrapping_add(CODE_FREE_RESTART),
            _ => 0,
        };
        let entry = CodeFreeCount {
            count,
            counting: 1,
            instance,
            _reserved: 0,
        };
        if let Err(err) = self.map.insert(pid, entry, 0) {
            tracing::debug!(pid, %err, "code frees: not counted (its walks prove every blob)");
        }
    }

    /// JVM `pid`'s hook is about to be taken away: its count stops standing for its frees.
    pub fn pause(&mut self, pid: u32) {
        if let Ok(mut entry) = self.map.get(&pid, 0) {
            entry.counting = 0;
            if self.map.insert(pid, entry, 0).is_err() {
                // Gone rather than left counting, and never counted again.
                let _ = self.map.remove(&pid);
                if self.lost.len() < MAX_LOST {
                    self.lost.insert((pid, entry.instance));
                }
            }
        }
    }
}
