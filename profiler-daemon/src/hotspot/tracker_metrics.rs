//! The JVM tracker's families: the JVMs it found and pushed to the BPF maps, the process events
//! and listings it worked from, and the libjvm hooks it attached.

use std::fmt;
use std::sync::{Arc, Mutex};

use profiler_common::metric::{self, bpf_map, jvm_state};

use super::tracker::TrackerCounts;
use crate::metrics::families::{by, Families, MetricSource};

/// The tracker's counts as its thread last shared them.
pub struct TrackerMetrics {
    pub counts: Arc<Mutex<TrackerCounts>>,
}

impl MetricSource for TrackerMetrics {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        let counts = self.counts.lock().map(|c| *c).unwrap_or_default();
        counts.encode_jvms(out)?;
        counts.encode_processes(out)?;
        counts.encode_libjvm_hooks(out)
    }
}

impl TrackerCounts {
    /// The JVMs by state, and the BPF maps' entries.
    fn encode_jvms(&self, out: &mut Families) -> fmt::Result {
        out.gauges(
            metric::JVMS,
            "JVMs by state (ready: layout in the BPF map).",
            by(
                "state",
                [
                    (jvm_state::READY, self.jvms_ready),
                    (jvm_state::PENDING, self.jvms_pending),
                    (jvm_state::FAILED, self.jvms_failed),
                    (jvm_state::OVER_BOUND, self.jvms_over_bound),
                ],
            ),
        )?;
        out.gauges(
            metric::BPF_MAP_ENTRIES,
            "Entries of the BPF maps the daemon fills.",
            by(
                "map",
                [
                    (bpf_map::HOTSPOT_PROCS, self.jvms_ready),
                    (bpf_map::JAVA_THREADS, self.java_threads),
                ],
            ),
        )?;
        out.gauges(
            metric::BPF_MAP_CAPACITY,
            "Capacity of the BPF maps the daemon fills.",
            by(
                "map",
                [
                    (bpf_map::HOTSPOT_PROCS, self.jvm_map_capacity),
                    (bpf_map::JAVA_THREADS, self.java_thread_map_capacity),
                ],
            ),
        )?;
        out.counter(
            metric::JAVA_THREADS_NOT_PUSHED,
            "Java threads left out of the BPF map (full): their Java frames are not unwound.",
            self.java_threads_not_pushed,
        )
    }

    /// What the tracker learnt processes from: events and /proc listings.
    fn encode_processes(&self, out: &mut Families) -> fmt::Result {
        out.counters(
            metric::PROCESS_EVENTS,
            "Process events the JVM tracker took from the BPF tracepoints, by kind (whole-host mode).",
            by("kind", [("exec", self.exec_events), ("exit", self.exit_events)]),
        )?;
        out.counter(
            metric::PROC_RESCANS,
            "Full listings of /proc by the JVM tracker (once a minute, besides events).",
            self.rescans,
        )
    }

    fn encode_libjvm_hooks(&self, out: &mut Families) -> fmt::Result {
        out.counters(
            metric::LIBJVM_HOOK_JVMS,
            "JVMs that became ready, by whether their libjvm was hooked (thread start; allocation events with --alloc).",
            by(
                "hooked",
                [
                    ("true", self.jvms_libjvm_hooked),
                    ("false", self.jvms_libjvm_not_hooked),
                ],
            ),
        )?;
        out.counter(
            metric::LIBJVM_HOOK_ATTACH_FAILURES,
            "Libjvm files whose hooks could not be attached (see the log).",
            self.libjvm_hook_attach_failures,
        )?;
        out.gauge(
            metric::LIBJVM_HOOKED_FILES,
            "Libjvm files hooked now (released once none of their JVMs runs).",
            self.libjvm_hooked_files,
        )?;
        out.gauge(
            metric::LIBJVM_WAITING_FILES,
            "Libjvm files of ready JVMs waiting for room under the hook cap or their user's share.",
            self.libjvm_waiting_files,
        )
    }
}
