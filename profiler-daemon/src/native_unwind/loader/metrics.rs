//! The unwind tables' families: what the loader holds in the BPF maps, what it built and
//! evicted, and what it left to frame pointers.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use profiler_common::metric;

use super::{NotLoaded, TableStats};
use crate::metrics::families::{reasons, Families, MetricSource};

fn get(value: &AtomicU64) -> u64 {
    value.load(Ordering::Relaxed)
}

impl MetricSource for TableStats {
    fn encode(&self, out: &mut Families) -> fmt::Result {
        out.gauge(
            metric::UNWIND_TABLES,
            "Native unwind tables loaded in the BPF maps (one per distinct .eh_frame).",
            get(&self.tables),
        )?;
        out.gauge(
            metric::UNWIND_TABLE_BYTES,
            "Memory of the unwind tables in the BPF maps (charged to the daemon's cgroup, not in its RSS).",
            get(&self.bytes),
        )?;
        out.gauge(
            metric::UNWIND_TABLE_LIMIT_BYTES,
            "The unwind tables' budget (half of cache_budget_mib).",
            get(&self.limit_bytes),
        )?;
        out.gauge(
            metric::UNWIND_TABLE_PROCESSES,
            "Processes whose executable mappings are in the BPF maps with their tables.",
            get(&self.processes),
        )?;
        self.encode_work(out)
    }
}

impl TableStats {
    /// What building and keeping the tables within their budget cost, and what it left out.
    fn encode_work(&self, out: &mut Families) -> fmt::Result {
        out.counter(
            metric::UNWIND_TABLE_BUILDS,
            "Unwind tables built from a file's call frame information.",
            get(&self.builds),
        )?;
        out.counter(
            metric::UNWIND_TABLE_BUILD_MILLISECONDS,
            "Time spent building unwind tables.",
            get(&self.build_micros) / 1_000,
        )?;
        out.counter(
            metric::UNWIND_TABLE_EVICTIONS,
            "Unwind tables dropped to make room within the budget.",
            get(&self.evictions),
        )?;
        out.counters(
            metric::UNWIND_TABLES_NOT_LOADED,
            "Files or mappings left to frame pointers, by reason.",
            reasons(
                NotLoaded::ALL
                    .iter()
                    .map(|reason| (reason.name(), self.not_loaded(*reason))),
            ),
        )
    }
}
