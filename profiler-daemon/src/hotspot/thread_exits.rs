//! The thread-exit hook's counts (`profiler-ebpf/src/thread_exit.rs`): what the ended threads of
//! a JVM that does not add them up itself (before JDK 14) allocated. The tracker starts a JVM's
//! count when the hook is placed in its libjvm, with the offsets of the counters the hook reads,
//! and stops it when the hook or the JVM goes; the worker reads it to scale that JVM's
//! allocation profile (`crate::alloc_scale`). A JVM without an entry is not counted: its hook is
//! not in place, and its ended threads' bytes are missing.

use std::sync::{Arc, Mutex};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::ExitedAllocation;

use crate::hotspot::jvm::AllocationCounters;

/// The `EXITED_ALLOCATIONS` map, shared by the tracker (which writes entries) and the worker
/// (which reads them).
#[derive(Clone)]
pub struct ExitCounts(Arc<Mutex<BpfHashMap<MapData, u32, ExitedAllocation>>>);

impl ExitCounts {
    pub fn new(map: BpfHashMap<MapData, u32, ExitedAllocation>) -> Self {
        Self(Arc::new(Mutex::new(map)))
    }

    /// Counts the ended threads of JVM `pid` from now on, reading `counters` from each; a
    /// count already under way is kept.
    pub fn start(&self, pid: u32, counters: AllocationCounters) -> Result<(), String> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let wanted = entry(counters).ok_or("counter offsets past 4 GiB")?;
        if map
            .get(&pid, 0)
            .is_ok_and(|known| same_offsets(&known, &wanted))
        {
            return Ok(());
        }
        map.insert(pid, wanted, 0).map_err(|err| err.to_string())
    }

    /// Stops counting JVM `pid`'s ended threads.
    pub fn stop(&self, pid: u32) {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let _ = map.remove(&pid);
    }

    /// What the ended threads of JVM `pid` allocated since its count started; None if it is
    /// not counted.
    pub fn exited_bytes(&self, pid: u32) -> Option<u64> {
        let map = self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        map.get(&pid, 0).ok().map(|entry| entry.exited_bytes)
    }
}

fn entry(counters: AllocationCounters) -> Option<ExitedAllocation> {
    Some(ExitedAllocation {
        allocated_bytes_offset: u32::try_from(counters.allocated_at).ok()?,
        tlab_start_offset: u32::try_from(counters.start_at).ok()?,
        tlab_top_offset: u32::try_from(counters.top_at).ok()?,
        _reserved: 0,
        exited_bytes: 0,
    })
}

fn same_offsets(a: &ExitedAllocation, b: &ExitedAllocation) -> bool {
    (
        a.allocated_bytes_offset,
        a.tlab_start_offset,
        a.tlab_top_offset,
    ) == (
        b.allocated_bytes_offset,
        b.tlab_start_offset,
        b.tlab_top_offset,
    )
}
