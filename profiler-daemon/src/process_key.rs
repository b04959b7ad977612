//! One process's identity for its whole life: its pid and its start time.
//!
//! Pids are recycled quickly (`pid_max` is often 32,768), so a pid alone names whichever process
//! has it now. What the daemon keeps about a process (its mappings, its JVM, its unwind tables,
//! its open off-CPU waits) belongs to one [`ProcessKey`] and is forgotten once that key no longer
//! runs. An exec keeps pid and start time: the components that keep what an exec changes
//! (mappings, JVM layout) also follow the exec events or the mappings themselves.

use procfs::process::Stat;
use procfs::FromRead as _;

use crate::untrusted;

/// `/proc/PID/stat`, bounded.
pub fn read_stat(pid: u32) -> procfs::ProcResult<Stat> {
    let bytes = untrusted::read_proc_file(pid, "stat", 64 << 10)?;
    Stat::from_read(&bytes[..])
}

/// A process: its pid and its start time (clock ticks after boot, from `/proc/PID/stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ProcessKey {
    pub pid: u32,
    pub start_time: u64,
}

impl ProcessKey {
    /// The process that has `pid` now, if any.
    pub fn of_live(pid: u32) -> Option<Self> {
        read_stat(pid).ok().map(|stat| Self {
            pid,
            start_time: stat.starttime,
        })
    }

    /// Whether this very process still runs (not another one given its pid).
    pub fn is_running(&self) -> bool {
        Self::of_live(self.pid).is_some_and(|live| live == *self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_given_to_another_process_is_another_key() {
        let ours = ProcessKey::of_live(std::process::id()).expect("we run");
        assert!(ours.is_running());
        // What the daemon remembered of a process that had our pid before us.
        let earlier = ProcessKey {
            start_time: ours.start_time.wrapping_sub(1),
            ..ours
        };
        assert!(!earlier.is_running());
        let mut child = std::process::Command::new("true").spawn().expect("spawn");
        let key = ProcessKey::of_live(child.id());
        child.wait().expect("reaped");
        if let Some(key) = key {
            assert!(!key.is_running(), "reaped: gone");
        }
    }
}
