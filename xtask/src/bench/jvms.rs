//! Section 3 side by side (`--section jvms --baseline-daemon PATH`): the daemon's CPU with 20
//! small JVMs, this build against an older one, both daemons running at once over the same
//! JVMs and measured over the same window (daemons in turns each saw their own stretch of the
//! JVMs' drift: two runs of one build differed by half). Each round runs the pair twice:
//! writing into an empty output directory, and into one holding what a day of profiling leaves
//! there (the local output's retention policy runs over it every interval).

use std::fs;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::Duration;

use anyhow::{Context as _, Result};

use super::daemon::{cpu_at_once, Ready};
use super::results::SIDES;
use super::scenarios::Bench;
use super::statistics::median;
use super::table::Row;
use super::{COST_INTERVAL_SECS, TARGET_HZ};

/// Files of earlier intervals in the "after a day" runs: about what 1 GiB (the default
/// retention budget) holds of small JVMs' profiles and flame graphs.
const EARLIER_FILES: usize = 30_000;
/// Each earlier file's size.
const EARLIER_FILE_BYTES: usize = 4096;

/// The output directory's state a run starts with.
const STATES: [&str; 2] = ["empty output directory", "30,000 earlier files"];

pub(super) struct JvmsComparison {
    jvms: usize,
    /// [output state][side]: the daemon's CPU, in cores, per run.
    cores: [[Vec<f64>; 2]; 2],
}

impl Bench {
    pub(super) fn compare_jvm_costs(
        &self,
        pids: &[u32],
        baseline: &Path,
    ) -> Result<JvmsComparison> {
        let earlier = self.earlier_files()?;
        let daemons = [baseline, self.daemon_binary()];
        let mut cores: [[Vec<f64>; 2]; 2] = Default::default();
        let rounds = self.plan.bpf_rounds;
        for round in 0..rounds {
            for state in 0..2 {
                // Both started, the first of each round alternating, then measured together.
                let mut started = Vec::new();
                for k in 0..2 {
                    let side = (k + round) % 2;
                    let ready = Ready::Settled { jvms: pids.len() };
                    let daemon = self.start_daemon_over(
                        daemons[side],
                        TARGET_HZ,
                        COST_INTERVAL_SECS,
                        pids,
                        ready,
                        &[],
                        (state == 1).then_some(earlier.as_path()),
                    )?;
                    started.push((side, daemon));
                }
                thread::sleep(Duration::from_millis(500));
                let measured = cpu_at_once(
                    &started.iter().map(|(_, daemon)| daemon).collect::<Vec<_>>(),
                    self.plan.cost_window,
                )?;
                for ((side, daemon), cpu) in started.into_iter().zip(measured) {
                    daemon.stop()?;
                    self.progress(format_args!(
                        "3. {} JVMs, {}, round {}/{rounds}, {}: {:.3}% of a core",
                        pids.len(),
                        STATES[state],
                        round + 1,
                        SIDES[side],
                        cpu.process_cores * 100.0
                    ));
                    cores[state][side].push(cpu.process_cores);
                }
            }
        }
        Ok(JvmsComparison {
            jvms: pids.len(),
            cores,
        })
    }

    /// A directory of [`EARLIER_FILES`] profile files named as the daemon names them, written
    /// anew (so that none is past the retention's age).
    fn earlier_files(&self) -> Result<PathBuf> {
        let dir = self.work_dir.join("earlier-profiles");
        fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let bytes = vec![0u8; EARLIER_FILE_BYTES];
        for i in 0..EARLIER_FILES / 2 {
            // 20 JVMs, one profile each per 15 s interval: the names of a day's intervals.
            let (interval, pid) = (i / 20, 4000 + i % 20);
            let (hour, minute, second) = (interval / 240, interval / 4 % 60, interval % 4 * 15);
            let stem = format!("cpu-20261201T{hour:02}{minute:02}{second:02}Z-{pid}-java");
            for suffix in ["pb.gz", "svg"] {
                fs::write(dir.join(format!("{stem}.{suffix}")), &bytes)?;
            }
        }
        Ok(dir)
    }
}

impl JvmsComparison {
    pub(super) fn rows(&self, rows: &mut Vec<Row>) {
        for (state, cores) in STATES.iter().zip(&self.cores) {
            let (a, b) = (
                median(cores[0].iter().map(|c| c * 100.0)),
                median(cores[1].iter().map(|c| c * 100.0)),
            );
            // The two daemons of a round shared their window: their ratio is the paired figure.
            let ratios: Vec<f64> = cores[0].iter().zip(&cores[1]).map(|(a, b)| b / a).collect();
            let (low, high) = ratios.iter().fold((f64::MAX, f64::MIN), |(low, high), r| {
                (low.min(*r), high.max(*r))
            });
            rows.push(Row {
                section: "3. many JVMs, A/B",
                measurement: "daemon CPU, % of a core".to_owned(),
                setting: format!(
                    "{} small JVMs, {TARGET_HZ} Hz, {COST_INTERVAL_SECS} s interval, {state}",
                    self.jvms
                ),
                result: format!(
                    "A {a:.3}, B {b:.3} (medians of {} runs each); B/A of each round's pair: \
                     median {:.2}, {low:.2} to {high:.2}",
                    cores[0].len(),
                    median(ratios.iter().copied()),
                ),
                target: "B <= 0.5".to_owned(),
            });
        }
    }
}

/// How section 3's comparison measures, for the written report.
pub(super) fn method(window: Duration) -> String {
    format!(
        "Each run starts both daemons (`--pid` for each of the JVMs, local output with its \
         default flame graphs, each its own directory), waits until each has written its \
         profiles of two intervals (the start-up period behind it), then reads both daemons' CPU \
         time over the same {} s. The JVMs run throughout; which daemon starts first alternates. \"{}\": the output directory \
         starts with {EARLIER_FILES} files of {EARLIER_FILE_BYTES} bytes named as a day of 20 \
         JVMs' profiles and flame graphs, every one inside the default retention (a day, 1 GiB).",
        window.as_secs(),
        STATES[1],
    )
}
