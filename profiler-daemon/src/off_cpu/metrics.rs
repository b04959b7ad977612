//! Off-CPU profiling's families: the switches the BPF side saw and sampled, and what became of
//! the sampled waits.

use std::fmt;

use profiler_common::{metric, Counter};

use super::OffCpuStats;
use crate::metrics::families::{reasons, Families};

/// What off-CPU profiling counted, as the sampling loop publishes it.
#[derive(Clone, Copy, Debug, Default)]
pub struct OffCpuSnapshot {
    pub joined: OffCpuStats,
    pub open_waits: u64,
}

impl OffCpuSnapshot {
    /// The families, with the BPF programs' counters read through `kernel`.
    pub fn encode(&self, out: &mut Families, kernel: impl Fn(Counter) -> u64) -> fmt::Result {
        let k = kernel;
        out.counter(
            metric::OFF_CPU_SWITCHES,
            "Switches off the CPU of profiled threads.",
            k(Counter::OffCpuSwitches),
        )?;
        out.counter(
            metric::OFF_CPU_WAITS_SAMPLED,
            "Switches whose stack was taken (the others are accounted for by the weights).",
            k(Counter::OffCpuSampled),
        )?;
        out.counter(
            metric::OFF_CPU_WAITS,
            "Sampled waits joined with their end and put in off-CPU profiles.",
            self.joined.waits,
        )?;
        let lost = self.joined;
        out.counters(
            metric::OFF_CPU_WAITS_NOT_PROFILED,
            "Waits left out of off-CPU profiles, by reason (filtered_short is the minimum-wait filter).",
            reasons([
                (Counter::OffCpuRingFull.name(), k(Counter::OffCpuRingFull)),
                (Counter::OffCpuNoStorage.name(), k(Counter::OffCpuNoStorage)),
                ("unmatched_end", lost.unmatched_ends),
                ("filtered_short", lost.filtered_short),
                ("over_open_bound", lost.over_open_bound),
                ("over_stack_bound", lost.over_stack_bound),
            ]),
        )?;
        out.gauge(
            metric::OFF_CPU_OPEN_WAITS,
            "Sampled waits whose thread has not run again yet.",
            self.open_waits,
        )?;
        out.gauge(
            metric::OFF_CPU_THREADS,
            "Threads with off-CPU task storage now (it goes when they exit).",
            k(Counter::OffCpuThreadsTracked).saturating_sub(k(Counter::OffCpuThreadsGone)),
        )?;
        out.counters(
            metric::VIRTUAL_THREAD_UNMOUNTS,
            "Unmounts of virtual threads from their carriers in profiled JVMs (off-CPU or lock \
             profiling), by outcome: unmounted, pinned (the freeze failed: the virtual thread \
             stayed mounted), unseen (another hook was walking on the CPU, or the virtual \
             thread could not be identified).",
            [
                (
                    "unmounted",
                    k(Counter::VirtualUnmounts)
                        .saturating_sub(k(Counter::VirtualUnmountsFailed))
                        .saturating_sub(k(Counter::VirtualUnmountsUnseen)),
                ),
                ("pinned", k(Counter::VirtualUnmountsFailed)),
                ("unseen", k(Counter::VirtualUnmountsUnseen)),
            ]
            .map(|(outcome, value)| ([("outcome", outcome)], value)),
        )?;
        out.counter(
            metric::VIRTUAL_THREAD_UNMOUNTS_SAMPLED,
            "Of those, the unmounts whose stack was taken (their waits end at the next mount).",
            k(Counter::VirtualUnmountsSampled),
        )?;
        out.counter(
            metric::VIRTUAL_THREAD_MOUNTS,
            "Mounts of virtual threads on carriers in profiled JVMs.",
            k(Counter::VirtualMounts),
        )?;
        out.counter(
            metric::VIRTUAL_THREAD_WAITS_ENDED,
            "Of those, the mounts that ended a sampled wait.",
            k(Counter::VirtualWaitsEnded),
        )?;
        out.counter(
            metric::VIRTUAL_THREAD_STACKS_WITHDRAWN,
            "Virtual threads' stacks taken at an unmount that failed (pinned) or whose mount was \
             never seen: dropped, no wait began.",
            self.joined.virtual_withdrawn,
        )
    }
}
