//! What the bench measured, as data: section 2's BPF costs, the daemon's cost runs (sections 3
//! and 4), and the agent's cost (section 5), with section 2's rows of the table.

use super::measure::CpuUse;
use super::statistics::{median, min_max, thousands};
use super::table::{verdict, Row, MAX_BPF_US_200_FRAMES};
use super::{MAX_HZ, NATIVE_DEPTH, TARGET_JAVA_DEPTH};

/// What section 2 profiles.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum BpfWorkload {
    /// A sleeping process: every run takes the filtered path.
    Sleeper,
    /// The C throughput workload.
    Native,
    /// `deep_native.c`: one thread per CPU 30 frames deep, built with frame pointers, or without
    /// them (walked by the unwind tables).
    NativeDeep { unwind_tables: bool },
    /// `Bench.java deep`: one thread per CPU recursing `depth` frames, then spinning in a leaf.
    Java { depth: u32, interpreted: bool },
    /// `Bench.java distinct`: one thread per CPU down a chain of `depth` distinct methods, each
    /// its own compiled method (a code blob per frame), then spinning in the leaf.
    JavaDistinct { depth: u32 },
}

impl BpfWorkload {
    pub(super) fn label(self, jdk: u32) -> String {
        match self {
            BpfWorkload::Sleeper => "filtered path (other processes, idle CPUs)".to_owned(),
            BpfWorkload::Native => "native stack (C workload)".to_owned(),
            BpfWorkload::NativeDeep {
                unwind_tables: false,
            } => format!("{NATIVE_DEPTH}-frame native stack, frame pointers"),
            BpfWorkload::NativeDeep {
                unwind_tables: true,
            } => format!("{NATIVE_DEPTH}-frame native stack, unwind tables (no frame pointers)"),
            BpfWorkload::Java {
                depth,
                interpreted: false,
            } => format!("{depth}-frame Java stack (JDK {jdk})"),
            BpfWorkload::Java {
                depth,
                interpreted: true,
            } => format!("{depth}-frame interpreted Java stack (JDK {jdk}, -Xint)"),
            BpfWorkload::JavaDistinct { depth } => {
                format!("{depth}-frame Java stack of {depth} distinct compiled methods (JDK {jdk})")
            }
        }
    }

    /// Frames of a JIT-compiled Java stack (what the target is stated for).
    fn compiled_java_depth(self) -> Option<u32> {
        match self {
            BpfWorkload::Java {
                depth,
                interpreted: false,
            }
            | BpfWorkload::JavaDistinct { depth } => Some(depth),
            _ => None,
        }
    }
}

/// The BPF program's runs over one window.
#[derive(Clone, Copy, Debug)]
pub(super) struct BpfWindow {
    pub(super) runs: u64,
    pub(super) ns_per_run: f64,
    /// Share of the runs that sampled the profiled process (the rest: other processes, idle).
    pub(super) profiled_share: f64,
}

/// Below this share of the runs, the workload's own cost cannot be told from the filtered runs'.
const MIN_PROFILED_SHARE: f64 = 0.05;

pub(super) struct BpfCost {
    pub(super) label: String,
    workload: BpfWorkload,
    pub(super) window: BpfWindow,
    /// Per sample of the workload: the window's run time minus its filtered runs (at the
    /// separately measured filtered cost), over the workload's runs.
    pub(super) ns_per_sample: Option<f64>,
}

impl BpfCost {
    pub(super) fn new(
        workload: BpfWorkload,
        label: &str,
        window: BpfWindow,
        filtered_ns: f64,
    ) -> Self {
        let runs = window.runs as f64;
        let profiled_runs = runs * window.profiled_share;
        let ns_per_sample = (window.profiled_share >= MIN_PROFILED_SHARE).then(|| {
            (window.ns_per_run * runs - (runs - profiled_runs) * filtered_ns) / profiled_runs
        });
        Self {
            label: label.to_owned(),
            workload,
            window,
            ns_per_sample,
        }
    }

    pub(super) fn us_per_sample_text(&self) -> String {
        match self.ns_per_sample {
            Some(ns) => format!("{:.2} us", ns / 1000.0),
            None => "n/a".to_owned(),
        }
    }
}

pub(super) struct BpfCosts {
    /// Runs on other processes' samples and idle CPUs.
    pub(super) filtered: BpfWindow,
    pub(super) stacks: Vec<BpfCost>,
}

impl BpfCosts {
    pub(super) fn rows(&self, rows: &mut Vec<Row>, notes: &mut Vec<String>) {
        let filtered = &self.filtered;
        rows.push(Row {
            section: "2",
            measurement: "BPF run time per sample".to_owned(),
            setting: "filtered path (other processes, idle CPUs)".to_owned(),
            result: format!(
                "{:.2} us ({} runs)",
                filtered.ns_per_run / 1000.0,
                thousands(filtered.runs as f64)
            ),
            target: String::new(),
        });
        for cost in &self.stacks {
            let checked = cost.workload.compiled_java_depth() == Some(TARGET_JAVA_DEPTH);
            let met = cost
                .ns_per_sample
                .is_some_and(|ns| ns / 1000.0 <= MAX_BPF_US_200_FRAMES);
            rows.push(Row {
                section: "2",
                measurement: "BPF run time per sample".to_owned(),
                setting: format!("{}, {MAX_HZ} Hz", cost.label),
                result: format!(
                    "{} per sample of the workload (all {} runs: {:.2} us, workload share {:.0}%)",
                    cost.us_per_sample_text(),
                    thousands(cost.window.runs as f64),
                    cost.window.ns_per_run / 1000.0,
                    cost.window.profiled_share * 100.0
                ),
                target: if checked {
                    verdict(met, &format!("<= {MAX_BPF_US_200_FRAMES} us"))
                } else {
                    String::new()
                },
            });
            if checked && !met {
                notes.push(self.note(cost));
            }
        }
    }

    fn note(&self, deepest: &BpfCost) -> String {
        let Some(deepest_ns) = deepest.ns_per_sample else {
            return format!(
                "{}: the workload had {:.0}% of the BPF runs, too few to separate its cost from \
                 the filtered runs'; rerun on a quieter machine.",
                deepest.label,
                deepest.window.profiled_share * 100.0
            );
        };
        let deepest_depth = deepest.workload.compiled_java_depth();
        let shallow = self
            .stacks
            .iter()
            .filter_map(|c| Some((c.workload.compiled_java_depth()?, c.ns_per_sample?)))
            .find(|(depth, _)| Some(*depth) < deepest_depth);
        let slope = match (shallow, deepest_depth) {
            (Some((depth, ns)), Some(deepest_depth)) => format!(
                " (about {:.0} ns per extra Java frame, against the {depth}-frame stack)",
                (deepest_ns - ns) / f64::from(deepest_depth - depth)
            ),
            _ => String::new(),
        };
        format!(
            "{}: {:.1} us per sample. The cost grows with the frames walked{slope}: each JIT \
             frame is a code-blob lookup through the code heap's segment map plus reads of the \
             thread's stack. Would fix it: caching code-blob lookups across samples (a BPF LRU \
             map keyed by pc), or a lower bound on the Java walk's depth.",
            deepest.label,
            deepest_ns / 1000.0
        )
    }
}

/// Sides of a section-2 comparison, in the order of `BpfComparison`'s arrays.
pub(super) const SIDES: [&str; 2] = ["A (baseline)", "B (this build)"];

/// One row of section 2 measured with the baseline daemon (index 0) and this build's (1).
pub(super) struct BpfComparison {
    pub(super) label: String,
    /// Per window, in round order: ns per sample of the workload (the filtered row: per run);
    /// None where the workload's share of the runs was too small to tell.
    pub(super) ns: [Vec<Option<f64>>; 2],
    /// Median workload share of the runs.
    pub(super) shares: [f64; 2],
}

impl BpfComparison {
    pub(super) fn median_ns(&self, side: usize) -> Option<f64> {
        let known: Vec<f64> = self.ns[side].iter().flatten().copied().collect();
        (!known.is_empty()).then(|| median(known.into_iter()))
    }

    /// B over A, of the medians.
    fn ratio(&self) -> Option<f64> {
        Some(self.median_ns(1)? / self.median_ns(0)?)
    }

    /// B over A per round (the two windows of a round are adjacent): the spread of the ratio.
    fn round_ratios(&self) -> Vec<f64> {
        self.ns[0]
            .iter()
            .zip(&self.ns[1])
            .filter_map(|(a, b)| Some((*b)? / (*a)?))
            .collect()
    }

    /// "median us (min-max over windows)" of one side.
    pub(super) fn side_text(&self, side: usize) -> String {
        let known: Vec<f64> = self.ns[side].iter().flatten().copied().collect();
        let Some(mid) = self.median_ns(side) else {
            return "n/a".to_owned();
        };
        let (lo, hi) = min_max(&known);
        let missing = self.ns[side].len() - known.len();
        let missing = if missing > 0 {
            format!(", {missing} window(s) n/a")
        } else {
            String::new()
        };
        format!(
            "{:.2} ({:.2}-{:.2}{missing})",
            mid / 1000.0,
            lo / 1000.0,
            hi / 1000.0
        )
    }

    pub(super) fn ratio_text(&self) -> String {
        let Some(ratio) = self.ratio() else {
            return "n/a".to_owned();
        };
        let (lo, hi) = min_max(&self.round_ratios());
        format!("{ratio:.2} ({lo:.2}-{hi:.2})")
    }

    pub(super) fn summary(&self) -> String {
        format!(
            "{}: A {} us, B {} us, B/A {}",
            self.label,
            self.side_text(0),
            self.side_text(1),
            self.ratio_text()
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub(super) struct Scenario {
    pub(super) hz: u32,
    pub(super) jvms: usize,
    pub(super) busy_cpus: usize,
}

impl Scenario {
    pub(super) fn label(&self) -> String {
        format!("{} Hz, {}", self.hz, self.load_label())
    }

    /// What runs, without the frequency.
    pub(super) fn load_label(&self) -> String {
        if self.jvms == 0 {
            return "whole host, idle (no workload, no --pid)".to_owned();
        }
        let jvms = if self.jvms == 1 {
            "1 JVM".to_owned()
        } else {
            format!("{} small JVMs", self.jvms)
        };
        let cpus = if self.busy_cpus == 1 { "CPU" } else { "CPUs" };
        format!("{jvms}, {} busy {cpus}", self.busy_cpus)
    }
}

pub(super) struct CostRun {
    pub(super) scenario: Scenario,
    pub(super) cpu: CpuUse,
    pub(super) peak_rss_mb: f64,
    /// The most its memory cgroup was charged: RSS, page cache of the files it read, BPF maps.
    /// Includes loading, when the kernel's verifier briefly charges about 30 MB.
    pub(super) peak_charged_mb: f64,
    /// The most it was charged during the measured window (after start-up): what
    /// the memory targets are judged on.
    pub(super) charged_mb: f64,
    pub(super) records_per_second: f64,
    pub(super) profiles_per_second: f64,
    /// Nonzero loss counters over the daemon's life, "meaning: count".
    pub(super) losses: Vec<String>,
}

/// Section 5: what the JVMTI sidecar agent costs the JVM it is loaded in, from pairs of fresh
/// JVMs (an agent cannot be unloaded, so each window has its own JVM).
pub(super) struct AgentCost {
    pub(super) jdk: u32,
    pub(super) threads: usize,
    /// Throughput loss with the agent, per pair, in percent.
    pub(super) losses: Vec<f64>,
    /// JVM peak RSS with the agent minus without, per pair, in MB.
    pub(super) rss_deltas_mb: Vec<f64>,
    /// Size of the agent's records file at the end of each agent window, in MB.
    pub(super) records_mb: Vec<f64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares_medians_and_pairs_rounds() {
        let row = BpfComparison {
            label: "test".to_owned(),
            ns: [
                vec![Some(1000.0), Some(1200.0), Some(1100.0)],
                vec![Some(2000.0), None, Some(2400.0)],
            ],
            shares: [0.9, 0.9],
        };
        assert_eq!(row.median_ns(0), Some(1100.0));
        assert_eq!(row.median_ns(1), Some(2200.0));
        assert!((row.ratio().expect("both sides") - 2.0).abs() < 1e-9);
        // The round without a B figure has no ratio.
        assert_eq!(row.round_ratios().len(), 2);
        assert_eq!(row.side_text(1), "2.20 (2.00-2.40, 1 window(s) n/a)");
        assert_eq!(row.ratio_text(), "2.00 (2.00-2.18)");
    }

    #[test]
    fn takes_filtered_runs_out_of_the_bpf_average() {
        // Half the runs at 1 us (filtered), half at 9 us (workload): average 5 us.
        let window = BpfWindow {
            runs: 1000,
            ns_per_run: 5000.0,
            profiled_share: 0.5,
        };
        let cost = BpfCost::new(BpfWorkload::Native, "test", window, 1000.0);
        let ns = cost.ns_per_sample.expect("share high enough");
        assert!((ns - 9000.0).abs() < 1e-6);
    }
}
