//! Workloads that measure their own truth: a JVM that prints "ready", then every 100 ms a line
//! `<PREFIX> <epoch ns> key=value ...` of cumulative totals (bytes it allocated, time it
//! waited...). The lines are read in the background, and the totals are interpolated at the
//! bounds of the window a test's profiles cover, to compare with what the profiles say.

use std::collections::BTreeMap;
use std::io::BufRead as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::{Jdk, Workload};

/// A span of wall-clock time, in nanoseconds since the epoch.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub start: i64,
    pub end: i64,
}

impl Window {
    pub fn seconds(&self) -> f64 {
        (self.end - self.start) as f64 / 1e9
    }
}

/// A workload's cumulative totals at one moment (wall clock, nanoseconds since the epoch).
#[derive(Clone, Debug)]
pub struct Totals {
    pub at: i64,
    values: BTreeMap<&'static str, f64>,
}

impl Totals {
    /// `<prefix> <epoch ns> key=value ...`, with every one of `keys`.
    fn parse(prefix: &str, keys: &[&'static str], line: &str) -> Option<Self> {
        let mut fields = line
            .strip_prefix(prefix)?
            .strip_prefix(' ')?
            .split_whitespace();
        let at = fields.next()?.parse().ok()?;
        let printed: BTreeMap<&str, f64> = fields
            .filter_map(|field| {
                let (key, value) = field.split_once('=')?;
                Some((key, value.parse().ok()?))
            })
            .collect();
        let values = keys
            .iter()
            .map(|&key| Some((key, *printed.get(key)?)))
            .collect::<Option<_>>()?;
        Some(Self { at, values })
    }

    /// The total named `key` (one of the keys the workload was started with).
    pub fn get(&self, key: &str) -> f64 {
        *self
            .values
            .get(key)
            .unwrap_or_else(|| panic!("no total named {key:?}"))
    }

    /// The totals at `at`, between these and `next`'s (each total's rate is steady in between).
    fn towards(&self, next: &Self, at: i64) -> Self {
        let part = (at - self.at) as f64 / (next.at - self.at) as f64;
        Self {
            at,
            values: self
                .values
                .iter()
                .map(|(&key, &from)| (key, from + (next.get(key) - from) * part))
                .collect(),
        }
    }

    /// What was added from `earlier` to these.
    fn since(&self, earlier: &Self) -> Self {
        Self {
            at: self.at,
            values: self
                .values
                .iter()
                .map(|(&key, &value)| (key, value - earlier.get(key)))
                .collect(),
        }
    }
}

/// A running workload JVM and every totals line it has printed.
pub struct MeasuringJvm {
    pub jdk: Jdk,
    pub jvm: Workload,
    prefix: &'static str,
    printed: Arc<Mutex<Vec<Totals>>>,
}

impl MeasuringJvm {
    /// Starts `java JVM_ARGS -cp CLASSES MAIN_CLASS` on `jdk`, waits for its "ready" line, and
    /// keeps its lines starting with `prefix` that carry every one of `keys`.
    pub fn start(
        jdk: Jdk,
        jvm_args: &[&str],
        classes: &Path,
        main_class: &str,
        prefix: &'static str,
        keys: &'static [&'static str],
    ) -> Self {
        let mut child = Command::new(&jdk.java)
            .args(jvm_args)
            .arg("-cp")
            .arg(classes)
            .arg(main_class)
            .stdout(Stdio::piped())
            .spawn()
            .expect("JVM starts");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let jvm = Workload(child);
        let first = lines.next().and_then(Result::ok).unwrap_or_default();
        assert_eq!(first, "ready", "JDK {}: the workload starts", jdk.major);
        let printed = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&printed);
        std::thread::spawn(move || {
            for totals in lines
                .map_while(Result::ok)
                .filter_map(|line| Totals::parse(prefix, keys, &line))
            {
                sink.lock().expect("totals").push(totals);
            }
        });
        Self {
            jdk,
            jvm,
            prefix,
            printed,
        }
    }

    /// What the workload added within `window`, each bound interpolated between the lines
    /// printed around it; waits for the first line after the window's end.
    pub fn truth(&self, window: Window) -> Totals {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            {
                let printed = self.printed.lock().expect("totals");
                if printed.last().is_some_and(|last| last.at > window.end) {
                    let at = |nanos: i64| {
                        let next = printed.partition_point(|t| t.at <= nanos);
                        assert!(
                            next > 0,
                            "JDK {}: the profiles start before the workload's first totals",
                            self.jdk.major
                        );
                        printed[next - 1].towards(&printed[next], nanos)
                    };
                    return at(window.end).since(&at(window.start));
                }
            }
            assert!(
                Instant::now() < deadline,
                "JDK {}: no {} line printed after the profiles' end",
                self.jdk.major,
                self.prefix
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Fails the test if the JVM died (under `what`).
    pub fn assert_alive(&mut self, what: &str) {
        assert!(
            self.jvm.0.try_wait().expect("JVM status").is_none(),
            "JDK {}: the JVM died under {what}",
            self.jdk.major
        );
    }
}

/// `pid`'s `kind` profiles (`mutex`, `alloc`...) in `dir` but the first, which lacks what
/// began before the daemon saw the process, checked back to back (each starting within 1 ms of
/// its predecessor's end), and the window they span; or what is wrong with them (one JDK's
/// failure, for the caller to report with the others').
pub fn whole_intervals(
    dir: &Path,
    pid: u32,
    major: u32,
    kind: &str,
) -> Result<(Vec<profiler_daemon::pprof::proto::Profile>, Window), String> {
    let prefix = format!("{kind}-");
    let mut profiles: Vec<profiler_daemon::pprof::proto::Profile> = crate::profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .map(|(_, profile)| profile)
        .collect();
    profiles.sort_by_key(|p| p.time_nanos);
    if profiles.len() < 4 {
        return Err(format!(
            "JDK {major}: {} {kind} profiles in {}, at least 4 expected (the first partial)",
            profiles.len(),
            dir.display()
        ));
    }
    profiles.remove(0);
    for pair in profiles.windows(2) {
        let end = pair[0].time_nanos + pair[0].duration_nanos;
        if (pair[1].time_nanos - end).abs() >= 1_000_000 {
            return Err(format!(
                "JDK {major}: a {kind} profile starts at {} ns, its predecessor ended at {end} \
                 ns: an interval is missing",
                pair[1].time_nanos
            ));
        }
    }
    let last = profiles.last().expect("profiles");
    let window = Window {
        start: profiles[0].time_nanos,
        end: last.time_nanos + last.duration_nanos,
    };
    Ok((profiles, window))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_parse_interpolate_and_subtract() {
        const KEYS: &[&str] = &["a", "b"];
        let first = Totals::parse("T", KEYS, "T 1000 a=10 b=0 c=5").expect("parses");
        let second = Totals::parse("T", KEYS, "T 2000 b=100 a=30").expect("parses");
        assert!(
            Totals::parse("T", KEYS, "T 3000 a=1").is_none(),
            "b missing"
        );
        assert!(
            Totals::parse("T", KEYS, "TX 3000 a=1 b=2").is_none(),
            "other prefix"
        );
        let middle = first.towards(&second, 1250);
        assert_eq!((middle.get("a"), middle.get("b")), (15.0, 25.0));
        let added = second.since(&middle);
        assert_eq!(
            (added.at, added.get("a"), added.get("b")),
            (2000, 15.0, 75.0)
        );
    }
}
