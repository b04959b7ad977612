//! Java lock profiles (`--lock`): where Java threads wait for locks, and how long, from the
//! off-CPU profiler's waits (docs/lock-profiling.md).
//!
//! - **mutex**: waits of threads blocked entering a contended monitor (`synchronized`). The BPF
//!   side tells them by the thread's own record of the monitor it waits for
//!   (`JavaState::MonitorEnter`), so neither `Object.wait` nor `Thread.sleep` counts.
//! - **block**: waits of threads parked by `Unsafe.park` (`LockSupport.park`: `ReentrantLock`,
//!   `Semaphore`, conditions, executors' queues), told by that Java frame when the profile is
//!   named; other blocked waits (`Thread.sleep`, safepoints) are left out then. A virtual
//!   thread parks by unmounting (`VirtualThread.park`, `parkNanos`: its sleeps too), from
//!   unmount to mount.
//!
//! Both count each wait once (`contentions`, weighted as off-CPU waits are) and its blocked and
//! run-queue time (`delay`). Waits shorter than the threshold are left out: a filter, as
//! async-profiler's and Alloy's, that keeps profiles of heavy, brief contention small. A
//! monitor wait is whole: from its first block to its last, with the spins between (a thread
//! woken without the monitor blocks again; `JoinedWait::whole_monitor_wait`); a park is one
//! block, `Unsafe.park` to its return.

use std::time::Duration;

use profiler_common::JavaState;

use crate::aggregate::{Added, Aggregator};
use crate::config_error::{invalid, ConfigError};
use crate::off_cpu::JoinedWait;
use crate::profile_model::{Frame, ProfileKind, SymbolizedProfile};
use crate::record::SampleView;
use crate::stack_memory::SharedStackMemory;

/// The default threshold (as Alloy's `--lock 10ms`).
pub const DEFAULT_THRESHOLD: Duration = Duration::from_millis(10);

/// `lock = true` (or `--lock[=DURATION]`) and its threshold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LockConfig {
    pub threshold: Duration,
}

impl LockConfig {
    /// The lock section (`lock`, `lock_threshold_ms`) with the flag: `--lock` turns it on,
    /// `--lock=DURATION` also sets the threshold. `None` when off, and then the threshold
    /// must not be set.
    pub fn resolve(
        flag: Option<Option<Duration>>,
        on: Option<bool>,
        threshold_ms: Option<u64>,
    ) -> Result<Option<Self>, ConfigError> {
        let on = flag.is_some() || on.unwrap_or(false);
        if !on {
            if threshold_ms.is_some() {
                return Err(invalid(
                    "lock_threshold_ms",
                    "set, but lock profiling is off (`lock = true` or --lock turns it on)",
                ));
            }
            return Ok(None);
        }
        let threshold = flag
            .flatten()
            .or(threshold_ms.map(Duration::from_millis))
            .unwrap_or(DEFAULT_THRESHOLD);
        if threshold > Duration::from_secs(3600) {
            return Err(invalid(
                "lock_threshold_ms",
                format!("{threshold:?} is over an hour"),
            ));
        }
        Ok(Some(Self { threshold }))
    }
}

/// The interval's lock waits, folded as they end.
pub struct LockAggregators {
    threshold_ns: u64,
    pub mutex: Aggregator,
    pub block: Aggregator,
}

impl LockAggregators {
    /// Aggregators whose memory is taken from `memory` (`crate::stack_memory`).
    pub fn sharing(config: LockConfig, max_stacks: usize, memory: SharedStackMemory) -> Self {
        Self {
            threshold_ns: config.threshold.as_nanos() as u64,
            mutex: Aggregator::sharing(ProfileKind::Mutex, max_stacks, memory.clone()),
            block: Aggregator::sharing(ProfileKind::Block, max_stacks, memory),
        }
    }

    /// See [`Aggregator::keeping_virtual_threads`].
    pub fn keeping_virtual_threads(self, keep: bool) -> Self {
        Self {
            mutex: self.mutex.keeping_virtual_threads(keep),
            block: self.block.keeping_virtual_threads(keep),
            ..self
        }
    }

    /// Folds one joined off-CPU wait if it is a lock wait at least the threshold long: a
    /// monitor's entry into the mutex profile, another blocked wait into the block profile's
    /// candidates (whose parks are told apart by their frames when named).
    pub fn fold(&mut self, view: &SampleView<'_>, wait: &JoinedWait) -> Option<Added> {
        match JavaState::from_u8(view.header.java_state) {
            // Followed across its blocks by the BPF side: the threshold is on the whole wait.
            Some(JavaState::MonitorEnter) if wait.end.monitor_wait_start_ns != 0 => {
                let totals = wait.whole_monitor_wait(self.threshold_ns)?;
                Some(self.mutex.add_totals(view, &totals))
            }
            Some(JavaState::MonitorEnter) if wait.wait_ns >= self.threshold_ns => {
                Some(self.mutex.add_totals(view, &wait.totals))
            }
            Some(JavaState::Blocked) if wait.wait_ns >= self.threshold_ns => {
                Some(self.block.add_totals(view, &wait.totals))
            }
            _ => None,
        }
    }
}

/// The Java frames a parked thread waits under (`LockSupport.park` calls one of them; on a
/// virtual thread it calls `VirtualThread.park`, and `Thread.sleep` `VirtualThread.parkNanos`).
const PARK_METHODS: [&str; 4] = [
    "jdk.internal.misc.Unsafe.park",
    "sun.misc.Unsafe.park",
    "java.lang.VirtualThread.park",
    "java.lang.VirtualThread.parkNanos",
];

/// Whether a Java frame runs the park a block profile's stacks must have.
fn is_park(frame: &Frame) -> bool {
    frame.kind.is_jvm()
        && frame
            .lines
            .iter()
            .any(|line| PARK_METHODS.contains(&line.function.as_str()))
}

/// Keeps the samples of a block profile whose stacks go through a park: a thread blocked but
/// not parked (`Thread.sleep`, a safepoint) waits for no lock.
pub fn keep_parked(profile: &mut SymbolizedProfile) {
    let parks: Vec<bool> = profile.frames.iter().map(is_park).collect();
    profile.samples.retain(|sample| {
        let parks_at = |id: &u32| parks.get(*id as usize).copied().unwrap_or(false);
        sample.frames.iter().any(parks_at)
    });
}

/// `--lock`'s value: a duration (`10ms`, `1s`, `500us`, or `0`).
pub fn parse_duration(value: &str) -> Result<Duration, String> {
    if value.trim() == "0" {
        return Ok(Duration::ZERO);
    }
    humantime::parse_duration(value.trim())
        .map_err(|err| format!("{value:?} is not a duration such as 10ms or 1s ({err})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_needs_the_switch_and_a_sane_threshold() {
        let resolved = |flag, on, ms| LockConfig::resolve(flag, on, ms).ok();
        assert_eq!(resolved(None, None, None), Some(None));
        assert_eq!(
            resolved(Some(None), None, None),
            Some(Some(LockConfig {
                threshold: DEFAULT_THRESHOLD
            }))
        );
        assert_eq!(
            resolved(Some(Some(Duration::ZERO)), None, Some(50)),
            Some(Some(LockConfig {
                threshold: Duration::ZERO
            })),
            "the flag's value wins"
        );
        assert_eq!(
            resolved(None, Some(true), Some(50)),
            Some(Some(LockConfig {
                threshold: Duration::from_millis(50)
            }))
        );
        let off = LockConfig::resolve(None, None, Some(5)).expect_err("off");
        assert!(off.to_string().contains("lock_threshold_ms"), "{off}");
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("ten").is_err());
    }

    #[test]
    fn block_profiles_keep_the_stacks_through_a_park_of_any_java_kind() {
        use crate::profile_model::{FrameKind, Sample};
        use std::time::{Duration, SystemTime};

        let mut profile = SymbolizedProfile::new(
            ProfileKind::Block,
            1,
            SystemTime::UNIX_EPOCH,
            Duration::ZERO,
        );
        let frame = |kind, name: &str| Frame::marker(kind, name);
        let ids = [
            frame(FrameKind::Jit, "jdk.internal.misc.Unsafe.park"),
            frame(FrameKind::Interpreted, "sun.misc.Unsafe.park"),
            frame(
                FrameKind::Inlined,
                "java.util.concurrent.locks.LockSupport.park",
            ),
            frame(FrameKind::Jit, "jdk.internal.misc.Unsafe.parkNanos"),
            // A native function of that name is not Java's park.
            frame(FrameKind::Native, "jdk.internal.misc.Unsafe.park"),
        ]
        .map(|frame| profile.add_frame(frame));
        for id in ids {
            profile.samples.push(Sample {
                frames: vec![id],
                values: [1, id as i64, 0, 0],
                thread: None,
                wait: None,
            });
        }
        keep_parked(&mut profile);
        let kept: Vec<i64> = profile.samples.iter().map(|s| s.values[1]).collect();
        assert_eq!(kept, [0, 1]);
    }
}
