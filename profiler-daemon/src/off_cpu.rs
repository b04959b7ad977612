//! Off-CPU profiles: joins each sampled wait's stack with its end, weights it, and folds it.
//!
//! The BPF side (`profiler-ebpf/src/off_cpu.rs`) sends a wait's stack when the thread leaves the
//! CPU and the wait's length when it comes back, through one ring that keeps their order. A
//! thread has at most one wait open, so the stacks waiting for their ends are kept per thread.
//! A virtual thread's wait (`profiler-ebpf/src/virtual_waits.rs`) is sent the same way, from
//! its unmount to its next mount, under the carrier's tid: a carrier unmounts many virtual
//! threads and waits itself meanwhile, so such a wait is kept by its tid and start together.
//!
//! Weighting: a switch is sampled with a probability `p` decided before the wait's length is
//! known (from the thread's past only), so counting each sampled wait's time `1 / p` times
//! gives every stack's expected total exactly (the Horvitz-Thompson estimator). The minimum
//! wait filter is applied to what comes back, and is a filter: it drops short waits by design.

pub mod metrics;

use std::time::Duration;

use hashbrown::HashMap;
use profiler_common::{
    sample_flags, OffCpuEnd, SampleHeader, VirtualWaitEnd, OFF_CPU_PROBABILITY_ONE,
};

use crate::aggregate::{Added, Aggregator, StackTotals};
use crate::config_error::{invalid, ConfigError};
use crate::process_key::ProcessKey;
use crate::record::SampleView;

pub const DEFAULT_OFF_CPU_PERIOD: Duration = Duration::from_millis(5);

/// `off_cpu = true` and its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuConfig {
    pub period: Duration,
    pub min_wait: Duration,
}

impl OffCpuConfig {
    /// The off-CPU section (`off_cpu`, `off_cpu_period_us`, `off_cpu_min_wait_us`): `None`
    /// when off, and then its parameters must not be set.
    pub fn resolve(
        on: bool,
        period_us: Option<u64>,
        min_wait_us: Option<u64>,
    ) -> Result<Option<Self>, ConfigError> {
        if !on {
            for (field, set) in [
                ("off_cpu_period_us", period_us.is_some()),
                ("off_cpu_min_wait_us", min_wait_us.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        field,
                        "set, but off-CPU profiling is off (`off_cpu = true` or --off-cpu turns it on)",
                    ));
                }
            }
            return Ok(None);
        }
        let period_us = period_us.unwrap_or(DEFAULT_OFF_CPU_PERIOD.as_micros() as u64);
        if !(1..=10_000_000).contains(&period_us) {
            return Err(invalid(
                "off_cpu_period_us",
                format!("{period_us} us is outside 1..=10000000 us"),
            ));
        }
        let min_wait_us = min_wait_us.unwrap_or(0);
        if min_wait_us > 3_600_000_000 {
            return Err(invalid(
                "off_cpu_min_wait_us",
                format!("{min_wait_us} us is over an hour"),
            ));
        }
        Ok(Some(Self {
            period: Duration::from_micros(period_us),
            min_wait: Duration::from_micros(min_wait_us),
        }))
    }
}

/// Most waits kept open at once (one per thread off CPU whose switch was sampled), and most
/// bytes of their stacks (a parked thread's wait stays open until it wakes: a node with
/// thousands of idle pool threads keeps a stack for each, a few KB apiece); past either, new
/// waits are dropped and counted.
pub const MAX_OPEN_WAITS: usize = profiler_common::MAX_OPEN_OFF_CPU_WAITS as usize;
pub const MAX_OPEN_WAIT_BYTES: usize = 32 << 20;
/// Most bytes the open waits of one user's threads may hold: half, so that a user whose
/// threads wait deep in their stacks by the thousand leaves the other half to everyone else.
pub const MAX_OPEN_WAIT_BYTES_PER_USER: usize = MAX_OPEN_WAIT_BYTES / 2;

/// Buffers kept for reuse by the next waits: no allocation per wait in the steady state.
const SPARE_BUFFERS: usize = 256;

/// What the joiner saw, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuStats {
    /// Waits whose stack and end were joined and folded.
    pub waits: u64,
    /// Waits shorter than the minimum, dropped by the filter.
    pub filtered_short: u64,
    /// Ends without their stack (its record was lost or the daemon started mid-wait).
    pub unmatched_ends: u64,
    /// Stacks dropped because `MAX_OPEN_WAITS` were open.
    pub over_open_bound: u64,
    /// Folded waits over the interval's distinct-stack bound.
    pub over_stack_bound: u64,
    /// Virtual threads' stacks withdrawn: their unmount failed (they were pinned), or their
    /// mount was never seen.
    pub virtual_withdrawn: u64,
}

/// Which wait an open stack is: a thread's (`virtual_start` 0), or a virtual thread's, by its
/// carrier's tid and its start.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct WaitKey {
    tid: u32,
    virtual_start: u64,
}

impl WaitKey {
    fn of(header: &SampleHeader) -> Self {
        Self {
            tid: header.tid,
            virtual_start: if header.flags & sample_flags::VIRTUAL_THREAD != 0 {
                header.ktime_ns
            } else {
                0
            },
        }
    }
}

struct OpenWait {
    out_ktime_ns: u64,
    probability: u32,
    /// The stack's record, as the ring carried it.
    record: Vec<u8>,
}

pub struct OffCpuJoiner {
    open: HashMap<WaitKey, OpenWait>,
    /// The processes with open waits at the last check, by pid.
    processes: HashMap<u32, ProcessKey>,
    /// Bytes the open waits' records hold (their buffers' capacity), in all and by user.
    open_bytes: usize,
    open_bytes_by_user: HashMap<u32, usize>,
    spare: Vec<Vec<u8>>,
    min_wait_ns: u64,
    pub stats: OffCpuStats,
}

impl OffCpuJoiner {
    pub fn new(min_wait_ns: u64) -> Self {
        Self {
            open: HashMap::new(),
            processes: HashMap::new(),
            open_bytes: 0,
            open_bytes_by_user: HashMap::new(),
            spare: Vec::new(),
            min_wait_ns,
            stats: OffCpuStats::default(),
        }
    }

    /// Waits open now.
    pub fn open_waits(&self) -> usize {
        self.open.len()
    }

    /// A wait's stack: kept until its end comes.
    pub fn stack(&mut self, view: &SampleView<'_>, bytes: &[u8]) {
        let header = &view.header;
        let tid = WaitKey::of(header);
        let held = self.open.get(&tid).map_or(0, |wait| wait.record.capacity());
        let uid = header.uid;
        // A tid's open wait is its user's (a thread keeps its user across a wait's stack and
        // the next: what it held is given back below, whoever it was).
        let user_held = self.open_bytes_by_user.get(&uid).copied().unwrap_or(0);
        if (held == 0 && self.open.len() >= MAX_OPEN_WAITS)
            || self.open_bytes - held + bytes.len() > MAX_OPEN_WAIT_BYTES
            || user_held.saturating_sub(held) + bytes.len() > MAX_OPEN_WAIT_BYTES_PER_USER
        {
            self.stats.over_open_bound += 1;
            return;
        }
        if let Some(wait) = self.open.get(&tid) {
            release(&mut self.open_bytes_by_user, uid_of(&wait.record), held);
        }
        let spare = &mut self.spare;
        let wait = self.open.entry(tid).or_insert_with(|| OpenWait {
            out_ktime_ns: 0,
            probability: 0,
            record: spare.pop().unwrap_or_default(),
        });
        wait.out_ktime_ns = header.ktime_ns;
        wait.probability = header.weight;
        wait.record.clear();
        wait.record.extend_from_slice(bytes);
        self.open_bytes = self.open_bytes - held + wait.record.capacity();
        *self.open_bytes_by_user.entry(uid).or_insert(0) += wait.record.capacity();
    }

    /// A wait's end: folds the wait into `aggregator` if its stack is here, and tells `folded`
    /// the stack, what the aggregator said (for the caller's bookkeeping of new processes and
    /// stacks) and the wait itself (for profiles derived from waits, `crate::lock`). Returns
    /// what the aggregator said too.
    pub fn end(
        &mut self,
        end: &OffCpuEnd,
        aggregator: &mut Aggregator,
        folded: impl FnMut(&SampleView<'_>, Added, &JoinedWait),
    ) -> Option<Added> {
        let key = WaitKey {
            tid: end.tid,
            virtual_start: 0,
        };
        self.end_of(key, end, aggregator, folded)
    }

    /// A virtual thread's wait end: as [`Self::end`], or, for an unmount that failed, drops its
    /// stack.
    pub fn virtual_end(
        &mut self,
        end: &VirtualWaitEnd,
        aggregator: &mut Aggregator,
        folded: impl FnMut(&SampleView<'_>, Added, &JoinedWait),
    ) -> Option<Added> {
        let key = WaitKey {
            tid: end.tid,
            virtual_start: end.out_ktime_ns,
        };
        if end.flags & sample_flags::UNMOUNT_FAILED != 0 {
            if let Some(wait) = self.open.remove(&key) {
                self.stats.virtual_withdrawn += 1;
                self.close(wait);
            }
            return None;
        }
        self.end_of(key, &end.as_off_cpu_end(), aggregator, folded)
    }

    /// Gives back what an open wait held.
    fn close(&mut self, wait: OpenWait) {
        self.open_bytes -= wait.record.capacity();
        release(
            &mut self.open_bytes_by_user,
            uid_of(&wait.record),
            wait.record.capacity(),
        );
        if self.spare.len() < SPARE_BUFFERS {
            self.spare.push(wait.record);
        }
    }

    fn end_of(
        &mut self,
        key: WaitKey,
        end: &OffCpuEnd,
        aggregator: &mut Aggregator,
        mut folded: impl FnMut(&SampleView<'_>, Added, &JoinedWait),
    ) -> Option<Added> {
        let matches = self
            .open
            .get(&key)
            .is_some_and(|wait| wait.out_ktime_ns == end.out_ktime_ns);
        if !matches {
            self.stats.unmatched_ends += 1;
            return None;
        }
        let wait = self.open.remove(&key)?;
        let added = if end.blocked_ns.saturating_add(end.runqueue_ns) < self.min_wait_ns {
            self.stats.filtered_short += 1;
            None
        } else {
            match SampleView::parse(&wait.record) {
                Ok(view) => {
                    let totals = weighted(end, wait.probability);
                    let added = aggregator.add_totals(&view, &totals);
                    if added == Added::OverBound {
                        self.stats.over_stack_bound += 1;
                    } else {
                        self.stats.waits += 1;
                    }
                    let joined = JoinedWait {
                        totals,
                        wait_ns: end.blocked_ns.saturating_add(end.runqueue_ns),
                        end: *end,
                        probability: wait.probability,
                    };
                    folded(&view, added, &joined);
                    Some(added)
                }
                // Parsed once already when it arrived.
                Err(_) => None,
            }
        };
        self.close(wait);
        added
    }

    /// Forgets the waits of processes that are gone (their ends will never come: a lost
    /// record). `live` gives the process that has a pid now; a pid given to another process
    /// since the last call loses its waits too (some may be the new process's: they are
    /// sampled again).
    pub fn forget_waits_of_exited(&mut self, mut live: impl FnMut(u32) -> Option<ProcessKey>) {
        let mut keep_pid: HashMap<u32, bool> = HashMap::new();
        let mut seen: HashMap<u32, ProcessKey> = HashMap::new();
        let mut released = 0;
        let last_seen = &self.processes;
        let by_user = &mut self.open_bytes_by_user;
        self.open.retain(|_, wait| {
            let pid = pid_of(&wait.record);
            let keep = *keep_pid.entry(pid).or_insert_with(|| match live(pid) {
                Some(key) => {
                    seen.insert(pid, key);
                    last_seen.get(&pid).is_none_or(|before| *before == key)
                }
                None => false,
            });
            if !keep {
                released += wait.record.capacity();
                release(by_user, uid_of(&wait.record), wait.record.capacity());
            }
            keep
        });
        self.open_bytes -= released;
        self.processes = seen;
    }
}

/// One wait joined with its end: what it adds to its stack, and how long it was.
#[derive(Clone, Copy, Debug)]
pub struct JoinedWait {
    pub totals: StackTotals,
    /// Blocked and run-queue time.
    pub wait_ns: u64,
    /// The end as the BPF side sent it, and the probability the wait was sampled with.
    pub end: OffCpuEnd,
    pub probability: u32,
}

impl JoinedWait {
    /// What this block adds to a profile of waits to enter a monitor that counts only whole
    /// waits of at least `threshold_ns` (a wait is its blocks, and the spins between them:
    /// `OffCpuEnd::monitor_wait_*`). The block that takes the whole wait past the threshold
    /// brings the wait's time so far and counts it once; the blocks after it bring their own
    /// time and the spin before them; blocks before it, nothing. Weighted as the block was
    /// sampled (which block brings what depends on the wait alone, not on the sampling: the
    /// totals stay unbiased). `None` if this block adds nothing.
    pub fn whole_monitor_wait(&self, threshold_ns: u64) -> Option<StackTotals> {
        let end = &self.end;
        let start = end.monitor_wait_start_ns;
        if start == 0 {
            return None;
        }
        let before = end.monitor_wait_before_ns;
        let through = end
            .out_ktime_ns
            .saturating_add(self.wait_ns)
            .saturating_sub(start)
            .max(before);
        if through < threshold_ns {
            return None;
        }
        // Counted by an earlier block (with a zero threshold, the first block counts it).
        let counted_before = before > 0 && before >= threshold_ns;
        let delay = if counted_before {
            through - before
        } else {
            through
        };
        // The run-queue part of this block stays run-queue; the rest is waiting.
        let runqueue = end.runqueue_ns.min(delay);
        let totals = weighted(
            &OffCpuEnd {
                blocked_ns: delay - runqueue,
                runqueue_ns: runqueue,
                ..*end
            },
            self.probability,
        );
        Some(StackTotals {
            events: if counted_before { 0 } else { totals.events },
            ..totals
        })
    }
}

fn pid_of(record: &[u8]) -> u32 {
    header_u32(record, std::mem::offset_of!(SampleHeader, pid))
}

fn uid_of(record: &[u8]) -> u32 {
    header_u32(record, std::mem::offset_of!(SampleHeader, uid))
}

fn header_u32(record: &[u8], at: usize) -> u32 {
    record
        .get(at..at + 4)
        .and_then(|bytes| bytes.try_into().ok())
        .map_or(0, u32::from_ne_bytes)
}

/// Gives back `bytes` a user's open waits held (the entry goes with its last byte).
fn release(by_user: &mut HashMap<u32, usize>, uid: u32, bytes: usize) {
    if let Some(held) = by_user.get_mut(&uid) {
        *held = held.saturating_sub(bytes);
        if *held == 0 {
            by_user.remove(&uid);
        }
    }
}

/// One sampled wait as its stack's totals: its times divided by the probability it was sampled
/// with (in units of 2^-`OFF_CPU_PROBABILITY_BITS`).
fn weighted(end: &OffCpuEnd, probability: u32) -> StackTotals {
    let probability = u128::from(probability.clamp(1, OFF_CPU_PROBABILITY_ONE));
    let scale = |ns: u64| -> u64 {
        let scaled = u128::from(ns) * u128::from(OFF_CPU_PROBABILITY_ONE) / probability;
        u64::try_from(scaled).unwrap_or(u64::MAX)
    };
    StackTotals {
        count: 1,
        blocked_ns: scale(end.blocked_ns),
        runqueue_ns: scale(end.runqueue_ns),
        events: scale(crate::aggregate::EVENT_SCALE),
        ..StackTotals::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile_model::ProfileKind;
    use crate::record::tests::encode;
    use profiler_common::{SampleKind, UnwindEnd};

    /// A wait's stack record of thread `tid` of pid 7, left the CPU at `out`.
    fn wait_stack(tid: u32, out: u64, probability: u32, leaf: u64) -> Vec<u8> {
        wait_stack_of(tid, out, probability, &[leaf, 0x20])
    }

    /// The same with these user frames.
    fn wait_stack_of(tid: u32, out: u64, probability: u32, user: &[u64]) -> Vec<u8> {
        let mut record = encode(7, "pool", &[0xffff_1000], user, UnwindEnd::Complete);
        // SAFETY: the record starts with a whole header.
        let header = unsafe { &mut *(record.as_mut_ptr() as *mut SampleHeader) };
        header.tid = tid;
        header.ktime_ns = out;
        header.kind = SampleKind::OffCpu as u8;
        header.task_state = 1;
        header.java_state = 3;
        header.weight = probability;
        record
    }

    fn end(tid: u32, out: u64, blocked_ns: u64, runqueue_ns: u64) -> OffCpuEnd {
        OffCpuEnd {
            out_ktime_ns: out,
            blocked_ns,
            runqueue_ns,
            pid: 7,
            tid,
            monitor_wait_start_ns: 0,
            monitor_wait_before_ns: 0,
        }
    }

    /// Block `index` of one monitor wait that started at 1 s: blocks of 1, 2 and 3 ms, each
    /// after 100 us of spinning, all sampled with probability one half.
    fn monitor_block(index: usize) -> JoinedWait {
        const MS: u64 = 1_000_000;
        const SPIN: u64 = 100_000;
        let start = 1_000 * MS;
        let lengths = [MS, 2 * MS, 3 * MS];
        let out = start + lengths[..index].iter().sum::<u64>() + SPIN * index as u64;
        let before = out - start - if index == 0 { 0 } else { SPIN };
        let end = OffCpuEnd {
            monitor_wait_start_ns: start,
            monitor_wait_before_ns: before,
            ..end(3, out, lengths[index] - 10_000, 10_000)
        };
        JoinedWait {
            totals: weighted(&end, OFF_CPU_PROBABILITY_ONE / 2),
            wait_ns: lengths[index],
            end,
            probability: OFF_CPU_PROBABILITY_ONE / 2,
        }
    }

    /// (delay, contentions) block by block, unweighted, at `threshold_ns`.
    fn whole_wait_shares(threshold_ns: u64) -> Vec<Option<(u64, u64)>> {
        (0..3)
            .map(|index| {
                monitor_block(index)
                    .whole_monitor_wait(threshold_ns)
                    .map(|t| ((t.blocked_ns + t.runqueue_ns) / 2, t.events / 2))
            })
            .collect()
    }

    #[test]
    fn a_monitor_wait_is_counted_once_whole_when_it_passes_the_threshold() {
        const MS: u64 = 1_000_000;
        let one = crate::aggregate::EVENT_SCALE;
        // 2 ms: the first block (1 ms) alone is under it; the second takes the wait to 3.1 ms
        // and brings all of it, the spin included; the third brings itself and its spin.
        assert_eq!(
            whole_wait_shares(2 * MS),
            vec![None, Some((3_100_000, one)), Some((3_100_000, 0))]
        );
        // No threshold: the first block counts the wait.
        assert_eq!(
            whole_wait_shares(0),
            vec![Some((MS, one)), Some((2_100_000, 0)), Some((3_100_000, 0))]
        );
        // 10 ms: the whole wait (6.2 ms) never gets there.
        assert_eq!(whole_wait_shares(10 * MS), vec![None, None, None]);
        // Not a monitor wait: nothing of this kind.
        let mut park = monitor_block(0);
        park.end.monitor_wait_start_ns = 0;
        assert_eq!(park.whole_monitor_wait(0), None);
    }

    fn offer(joiner: &mut OffCpuJoiner, record: &[u8]) {
        let view = SampleView::parse(record).expect("valid");
        joiner.stack(&view, record);
    }

    fn totals(aggregator: &mut Aggregator) -> Vec<(u64, StackTotals)> {
        let interval = aggregator.take_interval();
        let mut all: Vec<_> = interval
            .processes
            .get(&7)
            .map(|p| {
                p.stacks()
                    .map(|(view, totals)| {
                        (view.user_frames().next().map_or(0, |f| f.addr()), totals)
                    })
                    .collect()
            })
            .unwrap_or_default();
        all.sort_by_key(|(leaf, _)| *leaf);
        all
    }

    #[test]
    fn waits_are_weighted_by_the_inverse_of_their_probability() {
        let mut joiner = OffCpuJoiner::new(0);
        let mut aggregator = Aggregator::of_kind(ProfileKind::OffCpu, 100);
        // Sampled for sure: 5 ms blocked, 1 ms in the run queue.
        offer(
            &mut joiner,
            &wait_stack(70, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        joiner.end(
            &end(70, 100, 5_000_000, 1_000_000),
            &mut aggregator,
            |_, _, _| {},
        );
        // Sampled with probability 1/4: counts four times its time.
        offer(
            &mut joiner,
            &wait_stack(71, 200, OFF_CPU_PROBABILITY_ONE / 4, 0x10),
        );
        joiner.end(&end(71, 200, 1_000, 0), &mut aggregator, |_, _, _| {});
        assert_eq!(joiner.stats.waits, 2);
        assert_eq!(joiner.open_waits(), 0);
        let folded = totals(&mut aggregator);
        // Two threads: two stacks.
        assert_eq!(folded.len(), 2);
        let sum = folded
            .iter()
            .fold(StackTotals::default(), |mut sum, (_, t)| {
                sum.count += t.count;
                sum.blocked_ns += t.blocked_ns;
                sum.runqueue_ns += t.runqueue_ns;
                sum.events += t.events;
                sum
            });
        assert_eq!(
            sum,
            StackTotals {
                count: 2,
                blocked_ns: 5_004_000,
                runqueue_ns: 1_000_000,
                // One wait, and one that stands for four.
                events: 5 * crate::aggregate::EVENT_SCALE,
                ..StackTotals::default()
            }
        );
    }

    #[test]
    fn an_end_joins_only_its_own_wait() {
        let mut joiner = OffCpuJoiner::new(0);
        let mut aggregator = Aggregator::of_kind(ProfileKind::OffCpu, 100);
        offer(
            &mut joiner,
            &wait_stack(70, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        // An end of another wait of the same thread (its stack was lost): not joined.
        assert_eq!(
            joiner.end(&end(70, 50, 10, 0), &mut aggregator, |_, _, _| {}),
            None
        );
        // An end of a thread with nothing open.
        assert_eq!(
            joiner.end(&end(99, 100, 10, 0), &mut aggregator, |_, _, _| {}),
            None
        );
        assert_eq!(joiner.stats.unmatched_ends, 2);
        // A new stack of the thread replaces its open wait (the old end was lost).
        offer(
            &mut joiner,
            &wait_stack(70, 300, OFF_CPU_PROBABILITY_ONE, 0x30),
        );
        assert_eq!(joiner.open_waits(), 1);
        assert_eq!(
            joiner.end(&end(70, 300, 10, 0), &mut aggregator, |_, _, _| {}),
            Some(Added::NewProcess)
        );
        let folded = totals(&mut aggregator);
        assert_eq!(folded.len(), 1);
        assert_eq!(folded[0].0, 0x30);
    }

    #[test]
    fn short_waits_are_filtered_and_counted() {
        let mut joiner = OffCpuJoiner::new(1_000_000);
        let mut aggregator = Aggregator::of_kind(ProfileKind::OffCpu, 100);
        offer(
            &mut joiner,
            &wait_stack(70, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        assert_eq!(
            joiner.end(
                &end(70, 100, 600_000, 300_000),
                &mut aggregator,
                |_, _, _| {}
            ),
            None
        );
        offer(
            &mut joiner,
            &wait_stack(70, 200, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        assert!(joiner
            .end(
                &end(70, 200, 600_000, 400_000),
                &mut aggregator,
                |_, _, _| {}
            )
            .is_some());
        assert_eq!(joiner.stats.filtered_short, 1);
        assert_eq!(joiner.stats.waits, 1);
    }

    #[test]
    fn waits_of_exited_processes_are_forgotten() {
        let mut joiner = OffCpuJoiner::new(0);
        offer(
            &mut joiner,
            &wait_stack(70, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        offer(
            &mut joiner,
            &wait_stack(71, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        assert!(joiner.open_bytes > 0);
        joiner
            .forget_waits_of_exited(|pid| (pid != 7).then_some(ProcessKey { pid, start_time: 1 }));
        assert_eq!(joiner.open_waits(), 0);
        assert_eq!(joiner.open_bytes, 0);
    }

    /// Pid 7 is given to another process between two checks: the first one's waits, whose ends
    /// will never come, are forgotten.
    #[test]
    fn waits_of_a_process_whose_pid_was_reused_are_forgotten() {
        let mut joiner = OffCpuJoiner::new(0);
        offer(
            &mut joiner,
            &wait_stack(70, 100, OFF_CPU_PROBABILITY_ONE, 0x10),
        );
        let first = ProcessKey {
            pid: 7,
            start_time: 1,
        };
        joiner.forget_waits_of_exited(|_| Some(first));
        assert_eq!(joiner.open_waits(), 1, "still running");
        let second = ProcessKey {
            pid: 7,
            start_time: 2,
        };
        joiner.forget_waits_of_exited(|_| Some(second));
        assert_eq!(joiner.open_waits(), 0);
        assert_eq!(joiner.open_bytes, 0);
    }

    #[test]
    fn open_waits_are_bounded_in_bytes_and_per_user() {
        let mut joiner = OffCpuJoiner::new(0);
        // Deep stacks (a Java thread parked under a framework), so the bytes bind first.
        let frames = [0x10; 300];
        let of_user = |tid: u32, out: u64, uid: u32| {
            let mut record = wait_stack_of(tid, out, OFF_CPU_PROBABILITY_ONE, &frames);
            let at = std::mem::offset_of!(SampleHeader, uid);
            record[at..at + 4].copy_from_slice(&uid.to_ne_bytes());
            record
        };
        let size = of_user(0, 100, 0).len();
        let fit = (MAX_OPEN_WAIT_BYTES_PER_USER / size) as u32;
        assert!(2 * (fit as usize) < MAX_OPEN_WAITS);
        // One user's threads hold its half at most...
        for tid in 0..fit + 10 {
            offer(&mut joiner, &of_user(tid, 100, 1000));
        }
        assert_eq!(joiner.stats.over_open_bound, 10);
        // ...and another's still find theirs, up to the whole bound.
        for tid in 100_000..100_000 + fit + 10 {
            offer(&mut joiner, &of_user(tid, 100, 2000));
        }
        assert_eq!(joiner.stats.over_open_bound, 20);
        assert!(joiner.open_bytes <= MAX_OPEN_WAIT_BYTES);
        // A thread's next wait takes its own slot: not refused at the bound.
        offer(&mut joiner, &of_user(0, 200, 1000));
        assert_eq!(joiner.stats.over_open_bound, 20);
        let mut aggregator = Aggregator::of_kind(ProfileKind::OffCpu, 100);
        assert!(joiner
            .end(&end(0, 200, 10, 0), &mut aggregator, |_, _, _| {})
            .is_some());
        assert_eq!(joiner.open_waits(), 2 * fit as usize - 1);
        // What an ended wait held is its user's again.
        offer(&mut joiner, &of_user(fit + 20, 300, 1000));
        assert_eq!(joiner.stats.over_open_bound, 20);
    }
}
