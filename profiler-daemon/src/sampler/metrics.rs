//! The families of the BPF programs' own counters ([`KernelCounters`]), as the sampling loop
//! last read them.

use std::fmt;

use profiler_common::budget::Producer;
use profiler_common::{metric, Counter};

use super::KernelCounters;
use crate::metrics::families::{reasons, Families};

impl KernelCounters {
    /// The families counted by the BPF programs alone; the allocation hooks' when they are
    /// loaded.
    pub fn encode(&self, out: &mut Families, alloc: bool) -> fmt::Result {
        let k = |c: Counter| self.get(c);
        out.counter(
            metric::BPF_SAMPLES,
            "Runs of the BPF sampling program.",
            k(Counter::Samples),
        )?;
        out.counter(
            metric::BPF_SAMPLES_SENT,
            "Samples sent to the daemon.",
            k(Counter::Sent),
        )?;
        out.counter(
            metric::KERNEL_STACK_FAILURES,
            "Kernel stacks bpf_get_stack could not read.",
            k(Counter::KernelStackFailed),
        )?;
        out.counter(
            metric::PROCESS_EVENTS_LOST,
            "Process events lost to a full ring buffer (the next /proc rescan makes up for them).",
            k(Counter::ProcessEventsLost),
        )?;
        out.counter(
            metric::JAVA_THREADS_STARTED,
            "Java threads described to the BPF side by the thread-start hook as they started.",
            k(Counter::JavaThreadsStarted),
        )?;
        out.counter(
            metric::JAVA_THREAD_STARTS_REFUSED,
            "Java thread starts not described (their JVM had 16384 described by the hook, or the \
             map was full): the thread list's reads find them later.",
            k(Counter::JavaThreadsStartRefused),
        )?;
        self.encode_budgets(out)?;
        if alloc {
            self.encode_alloc(out)?;
        }
        Ok(())
    }

    /// The emit budgets' refusals, by producer and by whose share was spent.
    fn encode_budgets(&self, out: &mut Families) -> fmt::Result {
        let name = |producer: Producer| match producer {
            Producer::Cpu => "cpu",
            Producer::Alloc => "alloc",
            Producer::OffCpu => "off_cpu",
            Producer::ProcessEvents => "process_events",
        };
        out.counters(
            metric::RECORDS_OVER_BUDGET,
            "Records the BPF programs refused because their process or their user had spent its \
             share of that producer's emit budget (docs/scale.md, \"Emit budgets\").",
            Producer::ALL.into_iter().flat_map(|producer| {
                let (process, user) = producer.refusal_counters();
                [("process", process), ("user", user)].map(|(budget, counter)| {
                    let labels = [("producer", name(producer)), ("budget", budget)];
                    (labels, self.get(counter))
                })
            }),
        )
    }

    fn encode_alloc(&self, out: &mut Families) -> fmt::Result {
        let k = |c: Counter| self.get(c);
        out.counter(
            metric::ALLOC_EVENTS,
            "Allocation events (TLAB refills, allocations outside TLABs) of profiled JVMs.",
            k(Counter::AllocEvents),
        )?;
        out.counter(
            metric::ALLOC_SAMPLER_EVENTS,
            "Objects HotSpot's own allocation sampler reported in profiled JVMs (the sidecar \
             agent with alloc_interval): each is walked, and those JVMs' TLAB events are left out.",
            k(Counter::AllocSamplerEvents),
        )?;
        out.counter(
            metric::ALLOC_SAMPLER_FIRST_SKIPPED,
            "Of those, each thread's first where the JVM's sampler reports it by rule, not by \
             chance (before JDK 25): not weighed, or every thread's first allocation site would \
             take an interval of bytes.",
            k(Counter::AllocSamplerFirstSkipped),
        )?;

        out.counter(
            metric::ALLOC_SAMPLED,
            "Allocation events sampled and sent (the others are accounted for by the weights).",
            k(Counter::AllocSampled),
        )?;
        out.counters(
            metric::ALLOC_NOT_PROFILED,
            "Sampled allocation events lost, by reason (alloc_nested: another hook was under way \
             on the CPU).",
            reasons([Counter::AllocRingFull, Counter::AllocNested].map(|c| (c.name(), k(c)))),
        )?;
        out.counter(
            metric::ALLOC_WALKS_FROM_HOOK,
            "Sampled allocations walked from the hook's caller: the thread's last Java frame was \
             not usable.",
            k(Counter::AllocWalkFromHook),
        )?;
        out.counter(
            metric::ALLOC_THREAD_EXITS_COUNTED,
            "Java threads ending in JVMs before JDK 14 whose allocated bytes the thread-exit hook \
             added up, for their allocation profiles' totals.",
            k(Counter::ThreadExitsCounted),
        )?;
        out.counter(
            metric::ALLOC_THREAD_EXITS_UNREAD,
            "Of those threads, the ones whose counters could not be read (their JVM's allocation \
             profile counts a little short).",
            k(Counter::ThreadExitsUnread),
        )
    }
}
