//! Allocation profiles from HotSpot's sampler, scaled to the bytes the JVM counted.
//!
//! HotSpot's sampler draws its sample points from one generator that every new thread reseeds
//! from its own address (docs/allocation-profiling.md, "HotSpot's sampler"): on a JVM that
//! starts threads all the time, a few runs of distances between points recur, and a profile's
//! total drifts from the bytes allocated by up to a tenth, a different way each run (and more
//! before JDK 25, whose sampler skips bytes). HotSpot also counts those bytes exactly: each
//! thread's retired TLABs and objects outside them, its current TLAB's used part, and what
//! ended threads allocated ([`Jvm::allocated_bytes`]). So at each interval the worker reads
//! that count for every JVM whose allocations the sampler reports, and scales the interval's
//! profile by the count's growth over the profile's bytes: the samples say where the bytes
//! went (each stack's share is unchanged), the count says how many there were.
//!
//! The counts are read when the worker takes the interval, before it names anything (a few
//! milliseconds after the interval's end); consecutive readings telescope, so over a run of
//! intervals only the first and the last reading's delays show. A JVM's first profile is not
//! scaled (nothing to count from), nor is one whose factor is outside [`MIN_FACTOR`,
//! `MAX_FACTOR`]: the readings are the process's memory, and a JVM that writes garbage there
//! changes its own profile's scale by two at most. Before JDK 14 the JVM does not add up what its
//! ended threads allocated: a hook on their end does (`hotspot::thread_exits`), once in place.
//! Without that count (the hook not placed, a libjvm without `.symtab`), profiles are left as
//! sampled.

use std::collections::HashMap;

use crate::hotspot::jvm::Jvm;
use crate::hotspot::remote::{ProcessMemory, RemoteMemory as _};
use crate::hotspot::thread_exits::ExitCounts;
use crate::hotspot::virtual_threads::StaticsByFile;
use crate::process_key::ProcessKey;

/// Factors outside these bounds are not applied: the sampler's drift is a tenth or two, not a
/// half.
const MIN_FACTOR: f64 = 0.5;
const MAX_FACTOR: f64 = 2.0;

/// Threads a JVM may list beyond the tasks the kernel shows for it (threads starting or ending
/// while both are read).
const THREAD_LIST_SLACK: usize = 64;

/// What became of one JVM's profile.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scaled {
    /// Multiplied by this factor.
    By(f64),
    /// Its first reading: counted from here on.
    FirstReading,
    /// The factor was out of bounds: left as sampled.
    Refused,
    /// No count to be had (JDK 11, no `.symtab`, unreadable memory): left as sampled.
    NoCount,
}

/// Each scaled JVM's last count, by pid.
#[derive(Default)]
pub struct AllocScale {
    statics: StaticsByFile,
    /// The thread-exit hook's counts, for JVMs without a count of their ended threads.
    exit_counts: Option<ExitCounts>,
    last: HashMap<u32, (ProcessKey, u64)>,
}

impl AllocScale {
    pub fn with_exit_counts(exit_counts: Option<ExitCounts>) -> Self {
        Self {
            exit_counts,
            ..Self::default()
        }
    }

    /// `jvm`'s count of the bytes its threads allocated, read now; None where it has none.
    pub fn count(&mut self, jvm: &Jvm) -> Option<u64> {
        let memory = ProcessMemory::new(jvm.pid);
        // What the ended threads allocated first (see `Jvm::allocated_bytes`): the JVM's own
        // sum (JDK 14+), else its thread-exit hook's, if the hook is in place.
        let exited = match self.statics.of(jvm.pid).ok()?.exited_allocated_bytes() {
            Some(exited_at) => memory.read_u64(jvm.bias.wrapping_add(exited_at)).ok()?,
            None => self.exit_counts.as_ref()?.exited_bytes(jvm.pid)?,
        };
        let tasks = std::fs::read_dir(format!("/proc/{}/task", jvm.pid))
            .ok()?
            .count();
        jvm.allocated_bytes(&memory, exited, tasks + THREAD_LIST_SLACK)
            .ok()
    }

    /// The factor by which the interval's profile of `pid` (the process `key`), whose bytes add
    /// up to `sampled_bytes`, is scaled, its JVM's count being `count` at the interval's end.
    pub fn scale(
        &mut self,
        pid: u32,
        key: ProcessKey,
        count: Option<u64>,
        sampled_bytes: u64,
    ) -> Scaled {
        let Some(count) = count else {
            self.last.remove(&pid);
            return Scaled::NoCount;
        };
        match self.last.insert(pid, (key, count)) {
            Some((known, previous)) if known == key => factor(previous, count, sampled_bytes),
            _ => Scaled::FirstReading,
        }
    }

    /// Notes the count of a scaled JVM that had no allocation profile this interval, so that
    /// its next profile's factor covers its own interval only.
    pub fn note(&mut self, pid: u32, key: ProcessKey, count: Option<u64>) {
        match count {
            Some(count) => {
                self.last.insert(pid, (key, count));
            }
            None => {
                self.last.remove(&pid);
            }
        }
    }

    /// The JVMs scaled so far (their pids).
    pub fn scaled_pids(&self) -> Vec<u32> {
        self.last.keys().copied().collect()
    }

    /// Forgets the JVMs `alive` says are gone.
    pub fn forget_exited(&mut self, alive: impl Fn(u32) -> bool) {
        self.last.retain(|pid, _| alive(*pid));
    }
}

/// What a profile whose bytes add up to `sampled_bytes` is scaled by, the JVM's count having
/// gone from `previous` to `count` over its interval.
fn factor(previous: u64, count: u64, sampled_bytes: u64) -> Scaled {
    let Some(grown) = count.checked_sub(previous) else {
        return Scaled::Refused;
    };
    if sampled_bytes == 0 {
        return Scaled::Refused;
    }
    let factor = grown as f64 / sampled_bytes as f64;
    if (MIN_FACTOR..=MAX_FACTOR).contains(&factor) {
        Scaled::By(factor)
    } else {
        Scaled::Refused
    }
}

/// Scales every value of an allocation profile's samples (objects and bytes) by `factor`.
pub fn apply(profile: &mut crate::profile_model::SymbolizedProfile, factor: f64) {
    for sample in &mut profile.samples {
        for value in &mut sample.values {
            *value = (*value as f64 * factor).round() as i64;
        }
    }
}

/// The bytes an allocation profile's samples add up to: its values whose unit is bytes (in and
/// outside TLABs), as its kind's sample types say.
pub fn sampled_bytes(profile: &crate::profile_model::SymbolizedProfile) -> u64 {
    let types = profile.kind.sample_types().values;
    let byte_columns: Vec<usize> = (0..types.len())
        .filter(|&index| types[index].unit == "bytes")
        .collect();
    profile
        .samples
        .iter()
        .flat_map(|sample| byte_columns.iter().map(|&index| sample.values[index]))
        .map(|value| value.max(0) as u64)
        .fold(0u64, u64::saturating_add)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_grown_over_the_interval_is_what_the_samples_add_up_to() {
        assert_eq!(factor(1_000, 11_000, 10_000), Scaled::By(1.0));
        assert_eq!(factor(1_000, 10_000, 10_000), Scaled::By(0.9));
        assert_eq!(factor(0, 11_000, 10_000), Scaled::By(1.1));
    }

    #[test]
    fn a_count_that_disagrees_with_the_samples_by_more_than_twice_is_not_applied() {
        // Garbage in the JVM's memory, or a count that went back.
        assert_eq!(factor(0, 30_000, 10_000), Scaled::Refused);
        assert_eq!(factor(0, 4_000, 10_000), Scaled::Refused);
        assert_eq!(factor(5_000, 4_000, 10_000), Scaled::Refused);
        // Bytes counted, none sampled: nothing to scale.
        assert_eq!(factor(0, 4_000, 0), Scaled::Refused);
    }

    #[test]
    fn every_value_is_scaled_and_the_bytes_are_the_two_byte_columns() {
        use crate::profile_model::{ProfileKind, Sample, SymbolizedProfile};
        let mut profile = SymbolizedProfile::new(
            ProfileKind::Alloc,
            1,
            std::time::SystemTime::UNIX_EPOCH,
            std::time::Duration::from_secs(1),
        );
        profile.samples.push(Sample {
            frames: Vec::new(),
            values: [2, 1_000, 1, 300],
            thread: None,
            wait: None,
        });
        assert_eq!(sampled_bytes(&profile), 1_300);
        apply(&mut profile, 1.5);
        assert_eq!(profile.samples[0].values, [3, 1_500, 2, 450]);
    }
}
