//! Folds sample records into per-process stack counts for one interval.
//!
//! This is the userspace hot path: one hash and one table probe per sample, no allocation once a
//! stack has been seen. Each distinct stack is stored once, as the record itself with its
//! per-sample fields (time, cpu) zeroed, in a per-process byte arena; records then read back
//! through the same [`SampleView`] parser.
//!
//! The key is the whole header but those fields: the thread (tid and `comm`) is part of it, so
//! the same stack on two threads of a pool is two entries, and profiles can name each thread.
//! That costs distinct stacks (at most one per thread running the stack, and in practice far
//! fewer: most threads of a JVM run few stacks), which `max_stacks_per_interval` bounds as
//! before.
//!
//! Memory: a new stack is stored only within its process's and user's share of the interval's
//! stack memory (`crate::stack_memory`); past it, or past `max_stacks_per_interval`, the
//! process's new stacks are folded into one entry without frames, which profiles show as
//! `[stacks past the bound]`.

use std::hash::{BuildHasher, Hasher};
use std::time::{Duration, SystemTime};

use hashbrown::{hash_map::Entry, DefaultHashBuilder, HashMap, HashTable};
use profiler_common::{SampleHeader, HEADER_BYTES};

pub use crate::profile_model::ProfileKind;
use crate::record::SampleView;
use crate::stack_memory::{SharedStackMemory, PROCESS_OVERHEAD_BYTES, STACK_OVERHEAD_BYTES};

/// One distinct stack of a process: where its record lives in the arena, and what it adds up to.
#[derive(Clone, Copy, Debug)]
struct StackSlot {
    start: usize,
    len: usize,
    totals: StackTotals,
}

/// What one stack adds up to over an interval: for CPU profiles, how often it was sampled; for
/// off-CPU profiles, how many of its waits were sampled, the waits and the time they stand for;
/// for allocation profiles, how many of its allocations were sampled, and the events and bytes
/// they stand for. Waits and allocations are weighted by the inverse of their sampling
/// probability (see `crate::off_cpu`, `crate::alloc`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackTotals {
    pub count: u64,
    pub blocked_ns: u64,
    pub runqueue_ns: u64,
    pub alloc_bytes: u64,
    /// The waits or allocations the samples stand for, in units of 1/[`EVENT_SCALE`].
    pub events: u64,
}

impl StackTotals {
    /// One CPU sample.
    pub const ONE_SAMPLE: Self = Self {
        count: 1,
        blocked_ns: 0,
        runqueue_ns: 0,
        alloc_bytes: 0,
        events: 0,
    };

    fn add(&mut self, other: &Self) {
        self.count += other.count;
        self.blocked_ns = self.blocked_ns.saturating_add(other.blocked_ns);
        self.runqueue_ns = self.runqueue_ns.saturating_add(other.runqueue_ns);
        self.alloc_bytes = self.alloc_bytes.saturating_add(other.alloc_bytes);
        self.events = self.events.saturating_add(other.events);
    }
}

/// Estimated events are summed in units of 1/`EVENT_SCALE` event: a wait or allocation sampled
/// with probability 1/5.24 counts 5.24, not 5.
pub const EVENT_SCALE: u64 = 1024;

/// `events` (in units of 1/[`EVENT_SCALE`]) as a whole number, rounded.
pub fn whole_events(events: u64) -> u64 {
    events.saturating_add(EVENT_SCALE / 2) / EVENT_SCALE
}

/// The stacks of one process during one interval.
#[derive(Default)]
pub struct ProcessStacks {
    table: HashTable<StackSlot>,
    arena: Vec<u8>,
    samples: u64,
    past_bound: Option<PastBound>,
}

/// The samples of a process's stacks that found no memory: a header-only record (the first
/// such sample's, without its thread) and what they add up to.
struct PastBound {
    record: Vec<u8>,
    totals: StackTotals,
}

impl ProcessStacks {
    /// What the stacks that found no memory add up to, as a record without frames.
    pub fn past_bound(&self) -> Option<(SampleView<'_>, StackTotals)> {
        let past = self.past_bound.as_ref()?;
        let view = SampleView::parse(&past.record).ok()?;
        Some((view, past.totals))
    }

    fn fold_past_bound(&mut self, header: &SampleHeader, totals: &StackTotals) {
        self.samples += totals.count;
        match &mut self.past_bound {
            Some(past) => past.totals.add(totals),
            None => {
                let header = SampleHeader {
                    tid: 0,
                    comm: [0; profiler_common::COMM_LEN],
                    kernel_frames: 0,
                    user_frames: 0,
                    user_end: profiler_common::UnwindEnd::Complete as u8,
                    task_state: 0,
                    java_state: 0,
                    virtual_thread: 0,
                    ..*header
                };
                self.past_bound = Some(PastBound {
                    record: header_bytes(&header).to_vec(),
                    totals: *totals,
                });
            }
        }
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    #[cfg(test)]
    pub fn distinct_stacks(&self) -> usize {
        self.table.len()
    }

    /// Each distinct stack with what it adds up to.
    pub fn stacks(&self) -> impl Iterator<Item = (SampleView<'_>, StackTotals)> + '_ {
        self.table.iter().filter_map(|slot| {
            let bytes = &self.arena[slot.start..slot.start + slot.len];
            SampleView::parse(bytes)
                .ok()
                .map(|view| (view, slot.totals))
        })
    }
}

/// What one interval collected.
pub struct IntervalStacks {
    pub kind: ProfileKind,
    pub start: SystemTime,
    pub duration: Duration,
    pub processes: HashMap<u32, ProcessStacks>,
    /// Samples not kept at all: their process was new and its user's share of the stack memory
    /// (or the whole of it) was held.
    pub dropped_over_bound: u64,
    /// Samples folded into their process's `[stacks past the bound]` entry.
    pub past_bound: u64,
}

/// Outcome of [`Aggregator::add`], for the caller's bookkeeping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Added {
    /// The first sample of this process in the current interval.
    NewProcess,
    /// A stack not seen before in this interval (of a known process).
    NewStack,
    Folded,
    /// A new stack past its process's or user's memory share, or past `max_stacks`: folded
    /// into the process's `[stacks past the bound]` entry.
    PastBound {
        new_process: bool,
    },
    /// Not kept: a new process, and no memory for it.
    OverBound,
}

pub struct Aggregator {
    kind: ProfileKind,
    hasher: DefaultHashBuilder,
    processes: HashMap<u32, ProcessStacks>,
    distinct: usize,
    max_stacks: usize,
    memory: SharedStackMemory,
    dropped_over_bound: u64,
    past_bound: u64,
    start: SystemTime,
    keep_virtual_threads: bool,
}

impl Aggregator {
    /// `max_stacks` bounds the distinct stacks (over all processes) kept per interval.
    #[cfg(test)]
    pub fn new(max_stacks: usize) -> Self {
        Self::of_kind(ProfileKind::Cpu, max_stacks)
    }

    /// An aggregator of `kind`'s stacks, its memory unbounded but for `max_stacks`.
    #[cfg(test)]
    pub fn of_kind(kind: ProfileKind, max_stacks: usize) -> Self {
        Self::sharing(kind, max_stacks, SharedStackMemory::unbounded())
    }

    /// An aggregator of `kind`'s stacks whose memory is taken from `memory`, with the other
    /// aggregators' (`crate::stack_memory`).
    pub fn sharing(kind: ProfileKind, max_stacks: usize, memory: SharedStackMemory) -> Self {
        Self {
            kind,
            hasher: DefaultHashBuilder::default(),
            processes: HashMap::new(),
            distinct: 0,
            max_stacks,
            memory,
            dropped_over_bound: 0,
            past_bound: 0,
            start: SystemTime::now(),
            keep_virtual_threads: false,
        }
    }

    /// Whether the stacks of two virtual threads stay apart (the header's `virtual_thread`
    /// kept in the key). Off, they fold together, as the virtual threads one carrier runs do.
    pub fn keeping_virtual_threads(self, keep: bool) -> Self {
        Self {
            keep_virtual_threads: keep,
            ..self
        }
    }

    /// Folds one CPU sample.
    pub fn add(&mut self, sample: &SampleView<'_>) -> Added {
        self.add_totals(sample, &StackTotals::ONE_SAMPLE)
    }

    /// Folds a stack with what it adds (an off-CPU wait: its count and times).
    pub fn add_totals(&mut self, sample: &SampleView<'_>, totals: &StackTotals) -> Added {
        let header = normalized_header(&sample.header, self.keep_virtual_threads);
        let header_bytes = header_bytes(&header);
        let (kernel, user) = sample.stack_bytes();
        let hash = stack_hash(&self.hasher, header_bytes, kernel, user);

        let pid = sample.pid();
        let uid = sample.header.uid;
        let (process, new_process) = match self.processes.entry(pid) {
            Entry::Occupied(entry) => (entry.into_mut(), false),
            Entry::Vacant(entry) => {
                if self.memory.take(pid, uid, PROCESS_OVERHEAD_BYTES).is_err() {
                    self.dropped_over_bound += 1;
                    return Added::OverBound;
                }
                (entry.insert(ProcessStacks::default()), true)
            }
        };
        let arena = &process.arena;
        let found = process.table.find_mut(hash, |slot| {
            let stored = &arena[slot.start..slot.start + slot.len];
            stored.len() == header_bytes.len() + kernel.len() + user.len()
                && stored[..HEADER_BYTES] == *header_bytes
                && stored[HEADER_BYTES..HEADER_BYTES + kernel.len()] == *kernel
                && stored[HEADER_BYTES + kernel.len()..] == *user
        });
        let mut new_stack = false;
        let stored_bytes = header_bytes.len() + kernel.len() + user.len();
        if let Some(slot) = found {
            slot.totals.add(totals);
            process.samples += totals.count;
        } else if self.distinct >= self.max_stacks
            || self
                .memory
                .take(pid, uid, stored_bytes + STACK_OVERHEAD_BYTES)
                .is_err()
        {
            process.fold_past_bound(&sample.header, totals);
            self.past_bound += 1;
            return Added::PastBound { new_process };
        } else {
            let start = process.arena.len();
            process.arena.extend_from_slice(header_bytes);
            process.arena.extend_from_slice(kernel);
            process.arena.extend_from_slice(user);
            let slot = StackSlot {
                start,
                len: process.arena.len() - start,
                totals: *totals,
            };
            let arena = &process.arena;
            let hasher = &self.hasher;
            process.table.insert_unique(hash, slot, |slot| {
                let stored = &arena[slot.start..slot.start + slot.len];
                match SampleView::parse(stored) {
                    Ok(view) => {
                        let (kernel, user) = view.stack_bytes();
                        stack_hash(hasher, &stored[..HEADER_BYTES], kernel, user)
                    }
                    Err(_) => 0,
                }
            });
            process.samples += totals.count;
            self.distinct += 1;
            new_stack = true;
        }
        if new_process {
            Added::NewProcess
        } else if new_stack {
            Added::NewStack
        } else {
            Added::Folded
        }
    }

    /// Ends the current interval and starts the next one.
    pub fn take_interval(&mut self) -> IntervalStacks {
        let now = SystemTime::now();
        let interval = IntervalStacks {
            kind: self.kind,
            start: self.start,
            duration: now.duration_since(self.start).unwrap_or_default(),
            processes: std::mem::take(&mut self.processes),
            dropped_over_bound: std::mem::take(&mut self.dropped_over_bound),
            past_bound: std::mem::take(&mut self.past_bound),
        };
        self.distinct = 0;
        self.start = now;
        interval
    }
}

/// Hashes a stack from its pieces; stored stacks are re-hashed the same way when the table grows.
fn stack_hash(hasher: &DefaultHashBuilder, header: &[u8], kernel: &[u8], user: &[u8]) -> u64 {
    let mut hasher = hasher.build_hasher();
    hasher.write(header);
    hasher.write(kernel);
    hasher.write(user);
    hasher.finish()
}

/// The header with the fields that differ from sample to sample of one thread zeroed, so equal
/// stacks of the same thread fold together (an off-CPU wait's probability is in its weight),
/// and its virtual thread unless kept.
fn normalized_header(header: &SampleHeader, keep_virtual_thread: bool) -> SampleHeader {
    SampleHeader {
        ktime_ns: 0,
        cpu: 0,
        weight: 0,
        virtual_thread: if keep_virtual_thread {
            header.virtual_thread
        } else {
            0
        },
        ..*header
    }
}

fn header_bytes(header: &SampleHeader) -> &[u8] {
    // SAFETY: SampleHeader is plain old data of HEADER_BYTES bytes.
    unsafe { std::slice::from_raw_parts(header as *const SampleHeader as *const u8, HEADER_BYTES) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::tests::encode;
    use crate::stack_memory::SharedStackMemory;
    use profiler_common::UnwindEnd;

    fn add(aggregator: &mut Aggregator, bytes: &[u8]) -> Added {
        aggregator.add(&SampleView::parse(bytes).expect("valid record"))
    }

    /// `record` as sampled on thread `tid`, at time `ktime_ns` on `cpu`.
    fn on_thread(mut record: Vec<u8>, tid: u32, ktime_ns: u64, cpu: u32) -> Vec<u8> {
        let put = |record: &mut Vec<u8>, offset: usize, bytes: &[u8]| {
            record[offset..offset + bytes.len()].copy_from_slice(bytes)
        };
        put(
            &mut record,
            std::mem::offset_of!(SampleHeader, tid),
            &tid.to_ne_bytes(),
        );
        put(
            &mut record,
            std::mem::offset_of!(SampleHeader, ktime_ns),
            &ktime_ns.to_ne_bytes(),
        );
        put(
            &mut record,
            std::mem::offset_of!(SampleHeader, cpu),
            &cpu.to_ne_bytes(),
        );
        record
    }

    #[test]
    fn virtual_threads_stay_apart_only_when_kept() {
        let stack = encode(7, "ForkJoinPool-1-", &[], &[1, 2, 3], UnwindEnd::Complete);
        let running = |id: u64| {
            let mut record = stack.clone();
            let at = std::mem::offset_of!(SampleHeader, virtual_thread);
            record[at..at + 8].copy_from_slice(&id.to_ne_bytes());
            record
        };
        for (keep, distinct) in [(false, 1), (true, 2)] {
            let mut aggregator = Aggregator::new(100).keeping_virtual_threads(keep);
            for id in [5, 6, 5] {
                add(&mut aggregator, &running(id));
            }
            let interval = aggregator.take_interval();
            let seven = &interval.processes[&7];
            assert_eq!((seven.samples(), seven.distinct_stacks()), (3, distinct));
            let ids: Vec<u64> = seven
                .stacks()
                .map(|(view, _)| view.header.virtual_thread)
                .collect();
            assert!(ids.iter().all(|id| (*id != 0) == keep), "{ids:?}");
        }
    }

    #[test]
    fn threads_stay_apart_and_time_and_cpu_fold() {
        let mut aggregator = Aggregator::new(100);
        let stack = encode(7, "pool-1", &[], &[1, 2, 3], UnwindEnd::Complete);
        // Thread 70 at two times on two CPUs, thread 71 with the same name and stack.
        assert_eq!(
            add(&mut aggregator, &on_thread(stack.clone(), 70, 1, 0)),
            Added::NewProcess
        );
        assert_eq!(
            add(&mut aggregator, &on_thread(stack.clone(), 70, 2, 1)),
            Added::Folded
        );
        assert_eq!(
            add(&mut aggregator, &on_thread(stack.clone(), 71, 3, 0)),
            Added::NewStack
        );
        assert_eq!(
            add(&mut aggregator, &on_thread(stack, 71, 4, 3)),
            Added::Folded
        );
        let interval = aggregator.take_interval();
        let seven = &interval.processes[&7];
        assert_eq!((seven.samples(), seven.distinct_stacks()), (4, 2));
        let mut by_tid: Vec<(u32, u64, u32, u64)> = seven
            .stacks()
            .map(|(view, totals)| {
                (
                    view.header.tid,
                    view.header.ktime_ns,
                    view.header.cpu,
                    totals.count,
                )
            })
            .collect();
        by_tid.sort();
        assert_eq!(by_tid, vec![(70, 0, 0, 2), (71, 0, 0, 2)]);
    }

    #[test]
    fn per_thread_stacks_count_against_the_bound() {
        let mut aggregator = Aggregator::new(2);
        let stack = encode(1, "t", &[], &[1], UnwindEnd::Complete);
        for tid in 10..13 {
            add(&mut aggregator, &on_thread(stack.clone(), tid, 0, 0));
        }
        let interval = aggregator.take_interval();
        assert_eq!((interval.dropped_over_bound, interval.past_bound), (0, 1));
        assert_eq!(interval.processes[&1].distinct_stacks(), 2);
    }

    #[test]
    fn folds_identical_stacks_and_separates_different_ones() {
        let mut aggregator = Aggregator::new(100);
        let a = encode(7, "main", &[], &[1, 2, 3], UnwindEnd::Complete);
        let b = encode(7, "main", &[], &[1, 2, 4], UnwindEnd::Complete);
        let other_thread = encode(7, "worker", &[], &[1, 2, 3], UnwindEnd::Complete);
        let other_process = encode(8, "main", &[], &[1, 2, 3], UnwindEnd::Complete);
        assert_eq!(add(&mut aggregator, &a), Added::NewProcess);
        assert_eq!(add(&mut aggregator, &a), Added::Folded);
        assert_eq!(add(&mut aggregator, &b), Added::NewStack);
        assert_eq!(add(&mut aggregator, &other_thread), Added::NewStack);
        assert_eq!(add(&mut aggregator, &other_process), Added::NewProcess);

        let interval = aggregator.take_interval();
        let seven = &interval.processes[&7];
        assert_eq!(seven.samples(), 4);
        assert_eq!(seven.distinct_stacks(), 3);
        let mut counts: Vec<(Vec<u64>, u64)> = seven
            .stacks()
            .map(|(view, totals)| (view.user_frames().map(|f| f.addr()).collect(), totals.count))
            .collect();
        counts.sort();
        assert_eq!(
            counts,
            vec![(vec![1, 2, 3], 1), (vec![1, 2, 3], 2), (vec![1, 2, 4], 1)]
        );
        assert_eq!(interval.processes[&8].samples(), 1);

        // The next interval starts empty.
        assert!(aggregator.take_interval().processes.is_empty());
    }

    #[test]
    fn kernel_and_user_frames_are_not_confused() {
        let mut aggregator = Aggregator::new(100);
        // Same ips, split differently between kernel and user: two stacks.
        add(
            &mut aggregator,
            &encode(1, "t", &[5], &[], UnwindEnd::Complete),
        );
        add(
            &mut aggregator,
            &encode(1, "t", &[], &[5], UnwindEnd::Complete),
        );
        assert_eq!(
            aggregator.take_interval().processes[&1].distinct_stacks(),
            2
        );
    }

    #[test]
    fn counts_what_is_over_the_bound() {
        let mut aggregator = Aggregator::new(2);
        for leaf in 0..5 {
            add(
                &mut aggregator,
                &encode(1, "t", &[], &[leaf], UnwindEnd::Complete),
            );
        }
        // Stacks already known still fold past the bound.
        assert_eq!(
            add(
                &mut aggregator,
                &encode(1, "t", &[], &[0], UnwindEnd::Complete)
            ),
            Added::Folded
        );
        let interval = aggregator.take_interval();
        assert_eq!((interval.dropped_over_bound, interval.past_bound), (0, 3));
        // Every sample is kept: two stacks, one of them sampled twice, and the three past the
        // bound in the process's entry without frames.
        let process = &interval.processes[&1];
        assert_eq!(process.samples(), 6);
        let (past, totals) = process.past_bound().expect("an entry past the bound");
        assert_eq!(totals.count, 3);
        assert_eq!((past.header.user_frames, past.header.tid), (0, 0));
    }

    /// `record` as a process of `uid`.
    fn of_user(mut record: Vec<u8>, uid: u32) -> Vec<u8> {
        let at = std::mem::offset_of!(SampleHeader, uid);
        record[at..at + 4].copy_from_slice(&uid.to_ne_bytes());
        record
    }

    #[test]
    fn a_user_past_its_memory_share_leaves_room_to_the_others() {
        // Room for about 20 stacks of 3 frames in all: a user may hold 10, a process 5.
        let one_stack = HEADER_BYTES + 3 * profiler_common::USER_FRAME_BYTES + STACK_OVERHEAD_BYTES;
        let memory = SharedStackMemory::new(20 * one_stack + 4 * PROCESS_OVERHEAD_BYTES);
        let mut cpu = Aggregator::sharing(ProfileKind::Cpu, 1_000, memory.clone());
        let mut alloc = Aggregator::sharing(ProfileKind::Alloc, 1_000, memory.clone());
        // The attacker (uid 1000): two processes, 100 distinct stacks each, in both kinds.
        for pid in [10, 11] {
            for leaf in 0..100 {
                let stack = of_user(
                    encode(pid, "a", &[], &[1, 2, leaf], UnwindEnd::Complete),
                    1000,
                );
                add(&mut cpu, &stack);
                add(&mut alloc, &stack);
            }
        }
        // The victim (uid 2000) still gets its stacks in.
        for leaf in 0..5 {
            let stack = of_user(
                encode(20, "v", &[], &[7, 8, leaf], UnwindEnd::Complete),
                2000,
            );
            assert!(matches!(
                add(&mut cpu, &stack),
                Added::NewProcess | Added::NewStack
            ));
        }
        assert!(memory.held() <= 20 * one_stack + 4 * PROCESS_OVERHEAD_BYTES);
        let interval = cpu.take_interval();
        let victim = &interval.processes[&20];
        assert_eq!((victim.distinct_stacks(), victim.samples()), (5, 5));
        assert!(victim.past_bound().is_none());
        // Every attacker sample is still counted, most of them without their frames.
        let attacker: u64 = [10, 11]
            .iter()
            .map(|pid| interval.processes[pid].samples())
            .sum();
        assert_eq!(attacker, 200);
        assert!(interval.past_bound >= 180, "{}", interval.past_bound);
    }
}
