//! The sampling loop's families: what it read from the rings and did with it, the BPF
//! programs' counters as it last read them, and off-CPU profiling's. It publishes a snapshot
//! once a second ([`LoopMetrics::publish`]); scrapes encode the last one.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use profiler_common::metric::{self, not_profiled};
use profiler_common::{Counter, UnwindEnd};

use crate::metrics::families::{reasons, Families, MetricSource};
use crate::off_cpu::metrics::OffCpuSnapshot;
use crate::sampler::KernelCounters;

/// What one scrape reports.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pub kernel: KernelCounters,
    pub records: u64,
    pub malformed_records: u64,
    pub dropped_work: u64,
    pub dropped_over_stack_bound: u64,
    /// Samples kept in `[stacks past the bound]` entries (`crate::stack_memory`).
    pub past_stack_bound: u64,
    pub intervals_deferred: u64,
    /// Drains the BPF side asked for because the ring buffer was filling up.
    pub ring_wakeups: u64,
    pub unwind_ends: [u64; UnwindEnd::ALL.len()],
    pub intervals: u64,
    pub cpus: usize,
    pub frequency_hz: u64,
    /// Off-CPU profiling, when on.
    pub off_cpu: Option<OffCpuSnapshot>,
    /// Whether allocation profiling is on (the allocation hooks' counters are on the page).
    pub alloc: bool,
}

/// The last snapshot the loop published.
#[derive(Debug, Default)]
pub struct LoopMetrics {
    snapshot: Mutex<Snapshot>,
    /// Snapshots published so far.
    published: AtomicU64,
}

impl LoopMetrics {
    pub fn publish(&self, snapshot: Snapshot) {
        if let Ok(mut current) = self.snapshot.lock() {
            *current = snapshot;
        }
        self.published.fetch_add(1, Ordering::Release);
    }
}

impl MetricSource for LoopMetrics {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        let s = self.snapshot.lock().map(|s| s.clone()).unwrap_or_default();
        s.kernel.encode(out, s.alloc)?;
        encode_samples(out, &s)?;
        encode_bounds(out, &s)?;
        if let Some(off_cpu) = &s.off_cpu {
            off_cpu.encode(out, |c| s.kernel.get(c))?;
        }
        out.gauge(metric::CPUS, "CPUs sampled.", s.cpus as u64)?;
        out.gauge(
            metric::FREQUENCY_HERTZ,
            "Sampling frequency per CPU.",
            s.frequency_hz,
        )
    }

    fn published(&self) -> u64 {
        self.published.load(Ordering::Acquire)
    }
}

/// What became of the samples: read, walked, dropped, folded into intervals.
fn encode_samples(out: &mut Families, s: &Snapshot) -> fmt::Result {
    let k = |c: Counter| s.kernel.get(c);
    out.counters(
        metric::SAMPLES_NOT_PROFILED,
        "Samples not in any profile, by reason (idle and filtered are expected).",
        reasons([
            (Counter::Idle.name(), k(Counter::Idle)),
            (Counter::Filtered.name(), k(Counter::Filtered)),
            (Counter::RingFull.name(), k(Counter::RingFull)),
            (Counter::ScratchMissing.name(), k(Counter::ScratchMissing)),
            (not_profiled::MALFORMED, s.malformed_records),
            (not_profiled::WORK_QUEUE_FULL, s.dropped_work),
            (not_profiled::STACK_BOUND, s.dropped_over_stack_bound),
        ]),
    )?;
    out.counter(
        metric::RING_WAKEUPS,
        "Ring-buffer drains before the drain period because the ring was a quarter full; often means the ring is small for the sample rate.",
        s.ring_wakeups,
    )?;
    out.counters(
        metric::UNWIND_ENDS,
        "How user stack walks ended, by reason.",
        reasons(
            UnwindEnd::ALL
                .iter()
                .map(|end| (end.name(), s.unwind_ends[*end as usize])),
        ),
    )?;
    out.counter(
        metric::RECORDS,
        "Sample records read from the ring buffer.",
        s.records,
    )?;
    out.counter(
        metric::INTERVALS,
        "Profiling intervals completed.",
        s.intervals,
    )
}

/// What the daemon bounds on behalf of every user: the interval's stack memory, the worker's
/// one interval in hand (the BPF side's emit budgets are the sampler's, `sampler::metrics`).
fn encode_bounds(out: &mut Families, s: &Snapshot) -> fmt::Result {
    out.counter(
        metric::SAMPLES_PAST_STACK_BOUND,
        "Samples kept in their process's [stacks past the bound] frame: the interval's stack \
         memory share of their process or user was held (stack_memory_mib).",
        s.past_stack_bound,
    )?;
    out.counter(
        metric::INTERVALS_DEFERRED,
        "Interval ends put off because the worker was still writing the last interval.",
        s.intervals_deferred,
    )
}
