//! Java allocation profiles (`--alloc`): the setting, and what each sampled allocation weighs.
//!
//! The BPF side (`profiler-ebpf/src/alloc.rs`) takes an allocation event of `w` bytes (a new
//! TLAB's size, or an object allocated outside TLABs) with probability `p = min(1, w / I)`, `I`
//! being the interval set here. A taken event then stands for `w / p = max(w, I)` bytes and
//! `1 / p = max(1, I / w)` events, so that the expected totals of a stack are exactly the bytes
//! and events its allocations made. "Objects" in the profiles are these estimated events: an
//! object for allocations outside TLABs, a TLAB refill for the others (as JFR and
//! async-profiler count them).
//!
//! A JVM whose sidecar agent runs HotSpot's own sampler (`alloc_interval`, JDK 11+) sends
//! instead one event per object the sampler picked, with the object's size
//! ([`AllocConfig::weigh_sampled`]): real objects, each stack's bytes in proportion to what
//! it allocated whatever the TLABs and the threads' lifetimes.

use profiler_common::{ALLOC_INTERVAL_BYTES, ALLOC_WEIGHT_UNIT};

use crate::aggregate::{StackTotals, EVENT_SCALE};
use crate::config_error::{invalid, ConfigError};

/// The bounds on the interval: below 4 KiB most TLAB refills would be walked; above 1 GiB
/// a profile would hold almost nothing.
const MIN_INTERVAL: u64 = 4 << 10;
const MAX_INTERVAL: u64 = 1 << 30;

/// `alloc = true` (or `--alloc[=BYTES]`) and its interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocConfig {
    pub interval_bytes: u64,
}

impl AllocConfig {
    /// The allocation section (`alloc`, `alloc_interval_bytes`), with the flag: `--alloc`
    /// turns it on, `--alloc=BYTES` also sets the interval. `None` when off, and then the
    /// interval must not be set.
    pub fn resolve(
        flag: Option<Option<u64>>,
        on: Option<bool>,
        interval_bytes: Option<u64>,
    ) -> Result<Option<Self>, ConfigError> {
        let on = flag.is_some() || on.unwrap_or(false);
        let interval = flag.flatten().or(interval_bytes);
        if !on {
            if interval_bytes.is_some() {
                return Err(invalid(
                    "alloc_interval_bytes",
                    "set, but allocation profiling is off (`alloc = true` or --alloc turns it on)",
                ));
            }
            return Ok(None);
        }
        let interval_bytes = interval.unwrap_or(ALLOC_INTERVAL_BYTES);
        if !(MIN_INTERVAL..=MAX_INTERVAL).contains(&interval_bytes) {
            return Err(invalid(
                "alloc_interval_bytes",
                format!("{interval_bytes} bytes is outside {MIN_INTERVAL}..={MAX_INTERVAL}"),
            ));
        }
        Ok(Some(Self { interval_bytes }))
    }

    /// What one sampled event weighs; `weight` is the record's (its size in heap words).
    pub fn weigh(&self, weight: u32) -> StackTotals {
        let size = (u64::from(weight) * ALLOC_WEIGHT_UNIT).max(1);
        let interval = self.interval_bytes;
        let (bytes, events) = if size >= interval {
            (size, EVENT_SCALE)
        } else {
            (interval, interval * EVENT_SCALE / size)
        };
        StackTotals {
            count: 1,
            alloc_bytes: bytes,
            events,
            ..StackTotals::default()
        }
    }
}

impl AllocConfig {
    /// What an object HotSpot's sampler picked weighs; `weight` is its size in heap words. The
    /// sampler draws points about `interval` bytes apart at random (exponentially spaced) in
    /// each thread's allocations and samples an object holding one or more of them, once: an
    /// object of `size` bytes is picked with odds `1 - exp(-size / interval)`, so it stands for
    /// `size` over those odds in bytes, and their inverse in objects (JDK 11's to 27's
    /// `ThreadHeapSampler`; the agent is given the daemon's interval).
    pub fn weigh_sampled(&self, weight: u32) -> StackTotals {
        let size = (u64::from(weight) * ALLOC_WEIGHT_UNIT).max(1) as f64;
        // 1 - exp(-x), without losing small x to rounding.
        let odds = -(-size / self.interval_bytes as f64).exp_m1();
        StackTotals {
            count: 1,
            alloc_bytes: (size / odds).round() as u64,
            events: (EVENT_SCALE as f64 / odds).round() as u64,
            ..StackTotals::default()
        }
    }
}

/// `--alloc`'s value: bytes, with an optional `k`, `m` or `g` (binary units).
pub fn parse_bytes(value: &str) -> Result<u64, String> {
    let value = value.trim();
    let (digits, unit) = match value.char_indices().find(|(_, c)| !c.is_ascii_digit()) {
        Some((at, _)) => (&value[..at], &value[at..]),
        None => (value, ""),
    };
    let number: u64 = digits
        .parse()
        .map_err(|_| format!("{value:?} is not a number of bytes (e.g. 524288, 512k, 1m)"))?;
    let shift = match unit.to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        _ => return Err(format!("{value:?}: unknown unit {unit:?} (k, m or g)")),
    };
    number
        .checked_mul(1 << shift)
        .ok_or_else(|| format!("{value:?} is too large"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(interval_bytes: u64) -> AllocConfig {
        AllocConfig { interval_bytes }
    }

    #[test]
    fn an_object_the_jvms_sampler_picked_weighs_the_inverse_of_its_odds() {
        let alloc = config(512 << 10);
        // Small: odds about size / interval, so it stands for about one interval of bytes.
        let small = alloc.weigh_sampled(32 / 8);
        assert!(
            (small.alloc_bytes as i64 - (512 << 10) - 16).abs() <= 1,
            "{small:?}"
        );
        let objects = small.events as f64 / EVENT_SCALE as f64;
        assert!(
            (objects / ((512 << 10) as f64 / 32.0) - 1.0).abs() < 1e-4,
            "{objects}"
        );
        // As large as the interval: odds 1 - 1/e.
        let even = alloc.weigh_sampled((512 << 10) / 8);
        let odds = 1.0 - (-1.0f64).exp();
        assert_eq!(even.alloc_bytes, ((512 << 10) as f64 / odds).round() as u64);
        // Far larger: always picked, it stands for itself.
        let large = alloc.weigh_sampled((64 << 20) / 8);
        assert_eq!(large.alloc_bytes, 64 << 20);
        assert_eq!(large.events, EVENT_SCALE);
        assert_eq!(large.count, 1);
    }

    #[test]
    fn a_sampled_event_weighs_its_inverse_probability() {
        let alloc = config(512 << 10);
        // 64 KiB: sampled with p = 1/8, so it stands for 512 KiB and 8 events.
        let small = alloc.weigh((64 << 10) / 8);
        assert_eq!(small.alloc_bytes, 512 << 10);
        assert_eq!(small.events, 8 * EVENT_SCALE);
        // 8 MiB: always sampled, it stands for itself.
        let large = alloc.weigh((8 << 20) / 8);
        assert_eq!(large.alloc_bytes, 8 << 20);
        assert_eq!(large.events, EVENT_SCALE);
        // 100 KB: 5.24 events, kept to 1/1024.
        let odd = alloc.weigh(100_000 / 8);
        assert_eq!(odd.events, (512 << 10) * EVENT_SCALE / 100_000);
        assert_eq!(odd.count, 1);
    }

    #[test]
    fn expected_weights_equal_what_was_allocated() {
        // The expectation over the BPF draw, p = min(1, w / I), of the weight given when taken.
        let alloc = config(512 << 10);
        for size in [16u64, 4096, 100_000, 512 << 10, 3 << 20] {
            let p = (size as f64 / alloc.interval_bytes as f64).min(1.0);
            let totals = alloc.weigh((size / 8) as u32);
            let expected_bytes = p * totals.alloc_bytes as f64;
            let expected_events = p * totals.events as f64 / EVENT_SCALE as f64;
            assert!((expected_bytes / size as f64 - 1.0).abs() < 1e-9, "{size}");
            assert!(
                (expected_events - 1.0).abs() < 0.01,
                "{size}: {expected_events}"
            );
        }
    }

    #[test]
    fn the_setting_needs_the_switch_and_a_sane_interval() {
        let resolved = |flag, on, interval| AllocConfig::resolve(flag, on, interval).ok();
        assert_eq!(resolved(None, None, None), Some(None));
        assert_eq!(
            resolved(Some(None), None, None),
            Some(Some(config(ALLOC_INTERVAL_BYTES)))
        );
        assert_eq!(
            resolved(Some(Some(65536)), None, Some(1 << 20)),
            Some(Some(config(65536))),
            "the flag's value wins"
        );
        assert_eq!(
            resolved(None, Some(true), Some(1 << 20)),
            Some(Some(config(1 << 20)))
        );
        let off = AllocConfig::resolve(None, Some(false), Some(1 << 20)).expect_err("off");
        assert!(off.to_string().contains("alloc_interval_bytes"), "{off}");
        let tiny = AllocConfig::resolve(Some(Some(100)), None, None).expect_err("too small");
        assert!(tiny.to_string().contains("alloc_interval_bytes"), "{tiny}");
        assert_eq!(parse_bytes("512k"), Ok(512 << 10));
        assert_eq!(parse_bytes("65536"), Ok(65536));
        assert_eq!(parse_bytes("2M"), Ok(2 << 20));
        assert!(parse_bytes("12q").is_err());
        assert!(parse_bytes("k").is_err());
    }
}
