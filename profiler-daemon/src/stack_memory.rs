//! The memory the interval's distinct stacks may hold, shared by every profile kind's
//! aggregator (`crate::aggregate`): a bound decided by the daemon, not by what arrives.
//!
//! Stacks are what a profiled process controls: their depth (up to 1,024 frames, 24 KB a
//! record), their number (a distinct class or a distinct depth each time), their rate (up to
//! the emit budgets, `profiler_common::budget`). The bound is in bytes, so that deep stacks cost
//! what they weigh, and it is shared: one user's processes together may hold half of it, one
//! process a quarter, so a user flooding the daemon with distinct stacks leaves the other half
//! to everyone else. Past its share, a process's new stacks are folded into one entry of the
//! process, shown as a `[stacks past the bound]` frame: its samples, waits and bytes are still
//! counted, only where they came from is lost.

use std::sync::{Arc, Mutex};

use hashbrown::HashMap;

/// The default of `stack_memory_mib`.
pub const DEFAULT_STACK_MEMORY_BYTES: usize = 32 << 20;

/// What a stack costs besides its record's bytes: its slot in the process's table.
pub const STACK_OVERHEAD_BYTES: usize = 64;
/// What a process's first stack of the interval costs besides: its table and arena.
pub const PROCESS_OVERHEAD_BYTES: usize = 256;

/// Why a stack was not given memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Its process holds its share.
    Process,
    /// Its user's processes hold theirs.
    User,
    /// The whole bound is held.
    Total,
}

/// Bytes held by the current interval's stacks: in all, per user, per process.
#[derive(Debug)]
pub struct StackMemory {
    limit: usize,
    held: usize,
    by_user: HashMap<u32, usize>,
    by_process: HashMap<u32, usize>,
}

impl StackMemory {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            held: 0,
            by_user: HashMap::new(),
            by_process: HashMap::new(),
        }
    }

    /// The most one user's processes may hold.
    pub fn user_share(&self) -> usize {
        self.limit / 2
    }

    /// The most one process may hold.
    pub fn process_share(&self) -> usize {
        self.limit / 4
    }

    /// Takes `bytes` for a stack of `pid`, a process of `uid`, if every share allows it.
    pub fn take(&mut self, pid: u32, uid: u32, bytes: usize) -> Result<(), Refused> {
        let process = self.by_process.get(&pid).copied().unwrap_or(0);
        let user = self.by_user.get(&uid).copied().unwrap_or(0);
        if process + bytes > self.process_share() {
            return Err(Refused::Process);
        }
        if user + bytes > self.user_share() {
            return Err(Refused::User);
        }
        if self.held + bytes > self.limit {
            return Err(Refused::Total);
        }
        self.held += bytes;
        *self.by_process.entry(pid).or_insert(0) += bytes;
        *self.by_user.entry(uid).or_insert(0) += bytes;
        Ok(())
    }

    /// Bytes held now.
    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.held
    }

    /// A new interval: its stacks hold nothing yet (the last interval's go to the worker, and
    /// are freed once written).
    pub fn start_interval(&mut self) {
        self.held = 0;
        self.by_user.clear();
        self.by_process.clear();
    }
}

/// One [`StackMemory`] for every aggregator of the sampling loop. Locked only when a stack not
/// seen before in the interval arrives, never for one that folds.
#[derive(Clone, Debug)]
pub struct SharedStackMemory(Arc<Mutex<StackMemory>>);

impl SharedStackMemory {
    pub fn new(limit: usize) -> Self {
        Self(Arc::new(Mutex::new(StackMemory::new(limit))))
    }

    /// No bound (tests of aggregation alone).
    #[cfg(test)]
    pub fn unbounded() -> Self {
        Self::new(usize::MAX)
    }

    pub fn take(&self, pid: u32, uid: u32, bytes: usize) -> Result<(), Refused> {
        match self.0.lock() {
            Ok(mut memory) => memory.take(pid, uid, bytes),
            // Only a panic while holding it poisons it; the bound still holds.
            Err(poisoned) => poisoned.into_inner().take(pid, uid, bytes),
        }
    }

    #[cfg(test)]
    pub fn held(&self) -> usize {
        self.0.lock().map_or(0, |memory| memory.held())
    }

    pub fn start_interval(&self) {
        if let Ok(mut memory) = self.0.lock() {
            memory.start_interval();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_user_holds_half_and_one_process_a_quarter() {
        let mut memory = StackMemory::new(1000);
        // A process takes its quarter, then is refused.
        assert_eq!(memory.take(1, 100, 250), Ok(()));
        assert_eq!(memory.take(1, 100, 1), Err(Refused::Process));
        // Its user's second process takes another quarter; a third one finds the user's half
        // held.
        assert_eq!(memory.take(2, 100, 250), Ok(()));
        assert_eq!(memory.take(3, 100, 10), Err(Refused::User));
        // Another user still has room, up to the whole bound.
        assert_eq!(memory.take(4, 200, 250), Ok(()));
        assert_eq!(memory.take(5, 200, 250), Ok(()));
        assert_eq!(memory.take(6, 300, 1), Err(Refused::Total));
        assert_eq!(memory.held(), 1000);
        // The next interval starts empty.
        memory.start_interval();
        assert_eq!(memory.take(1, 100, 250), Ok(()));
        assert_eq!(memory.held(), 250);
    }
}
