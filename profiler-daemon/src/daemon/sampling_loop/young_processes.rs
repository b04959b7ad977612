//! The processes the sampling loop met in its last seconds, named to the symbolizer again.
//!
//! A process is named to the symbolizer (`Work::ProcessSeen`) at its first sample of each
//! interval, which reads its mappings then: a short-lived one may be gone by the interval's
//! end. What a process maps changes most in its first seconds (a launcher script execs `java`,
//! which loads libjvm, then the JDK's own libraries), so for a while after the loop first met it
//! the loop names it again, once a [`RETELL_GAP`] while it is sampled, in one batch per drain:
//! the symbolizer reads it again if it was young when read (`process::ProcessTable::observe`).
//! A process that exits before the interval's end then still has its frames named.

use std::time::{Duration, Instant};

use hashbrown::HashMap;

/// How long after the loop first met a process its new stacks may name it again.
const RETELL_WINDOW: Duration = Duration::from_secs(10);
/// The least time between two namings of one process.
const RETELL_GAP: Duration = Duration::from_secs(1);

/// When the loop first met each process sampled this interval or the last, and last named it.
#[derive(Default)]
pub(super) struct YoungProcesses {
    met: HashMap<u32, Met>,
}

struct Met {
    first: Instant,
    last_told: Instant,
    /// Sampled in the current interval.
    seen: bool,
}

impl YoungProcesses {
    /// `pid`'s first sample of an interval, named to the symbolizer at `now`.
    pub(super) fn told(&mut self, pid: u32, now: Instant) {
        let met = self.met.entry(pid).or_insert(Met {
            first: now,
            last_told: now,
            seen: true,
        });
        met.last_told = now;
        met.seen = true;
    }

    /// The processes to name again at `now` (noted as named): met less than
    /// [`RETELL_WINDOW`] ago, sampled this interval, named last [`RETELL_GAP`] ago or more.
    pub(super) fn due(&mut self, now: Instant) -> Vec<u32> {
        let mut due = Vec::new();
        for (&pid, met) in &mut self.met {
            if met.seen
                && now.duration_since(met.first) < RETELL_WINDOW
                && now.duration_since(met.last_told) >= RETELL_GAP
            {
                met.last_told = now;
                due.push(pid);
            }
        }
        due
    }

    /// An interval ends: processes not sampled in it are forgotten (met again, they count as
    /// new), the others kept for the next.
    pub(super) fn end_interval(&mut self) {
        self.met.retain(|_, met| std::mem::take(&mut met.seen));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_young_process_is_named_again_once_a_gap_while_in_its_window() {
        let mut young = YoungProcesses::default();
        let start = Instant::now();
        young.told(7, start);
        assert!(young.due(start + Duration::from_millis(500)).is_empty());
        assert_eq!(young.due(start + Duration::from_millis(1000)), [7]);
        assert!(young.due(start + Duration::from_millis(1500)).is_empty());
        assert_eq!(young.due(start + Duration::from_millis(2100)), [7]);
        assert!(young.due(start + RETELL_WINDOW).is_empty());
    }

    #[test]
    fn an_old_process_is_not_young_again_at_its_next_interval() {
        let mut young = YoungProcesses::default();
        let start = Instant::now();
        young.told(7, start);
        young.end_interval();
        // Its first sample of the next interval, past the window: named as every interval, not
        // met anew.
        young.told(7, start + RETELL_WINDOW);
        assert!(young.due(start + RETELL_WINDOW + RETELL_GAP).is_empty());
        // Not sampled in an interval: not named again, then forgotten, and new when met again.
        young.end_interval();
        young.told(8, start + RETELL_WINDOW);
        assert_eq!(young.due(start + RETELL_WINDOW + RETELL_GAP), [8]);
        young.end_interval();
        young.told(7, start + 3 * RETELL_WINDOW);
        assert_eq!(young.due(start + 3 * RETELL_WINDOW + RETELL_GAP), [7]);
    }
}
