//! Lock profiles end to end (`--lock`): LockSplit's threads wait to enter a contended monitor
//! (`monitorSite`) and to take a contended `ReentrantLock` (`parkSite`), each measuring its own
//! waits; on every JDK at once, the daemon's `mutex-*` profiles must put the monitor's waiting
//! time and number of waits under `monitorSite`, and its `block-*` profiles the lock's under
//! `parkSite`, each within 10% of that truth, with stacks rooted at the thread's entry. Threads
//! that sleep (`sleepSite`) or wait in `Object.wait` (`waitSite`) are in neither profile, and
//! neither site is in the other's.

use std::collections::HashMap;
use std::time::Duration;

use profiler_daemon::pprof::proto;
use profiler_tests::*;

/// A small fixed heap; the `*Site` methods never inlined, so each site is a frame of its own;
/// `quiet`, so that the JVM's stdout starts with the workload's "ready".
const JVM_ARGS: &[&str] = &[
    "-Xms64m",
    "-Xmx64m",
    "-XX:CompileCommand=quiet",
    "-XX:CompileCommand=dontinline,LockSplit::*Site",
];

/// The daemon's lock option: waits under 1 ms are left out of the profiles, as the workload
/// leaves them out of its counts (its waits are 10 to 50 ms: the threshold only drops what
/// neither side counts).
const LOCK: &str = "--lock=1ms";

/// The lock profiles' sample types (type, unit), in order.
const SAMPLE_TYPES: [(&str, &str); 2] = [("contentions", "count"), ("delay", "nanoseconds")];
const CONTENTIONS: usize = 0;
const DELAY: usize = 1;

/// One lock site of tests/java/LockSplit.java.
struct Site {
    /// Its name in the workload's `LOCK` lines (`<key>_ns`, `<key>_waits`).
    key: &'static str,
    /// The method that waits: a sample whose stack has it is the site's.
    method: &'static str,
    /// The profile its waits belong in: the files' prefix and the period type.
    profile: &'static str,
    /// Its threads' names, but their number.
    threads: &'static str,
}

const SITES: [Site; 2] = [
    Site {
        key: "monitor",
        method: "LockSplit.monitorSite",
        profile: "mutex",
        threads: "lock-monitor-",
    },
    Site {
        key: "park",
        method: "LockSplit.parkSite",
        profile: "block",
        threads: "lock-park-",
    },
];

/// Methods whose threads wait for no lock (`Thread.sleep`, `Object.wait` on an object nobody
/// else locks): in neither profile.
const NOT_LOCKS: [&str; 2] = ["LockSplit.sleepSite", "LockSplit.waitSite"];

/// The frame a rooted stack reaches: the entry of the workload's threads (as in java_stacks.rs,
/// off_cpu.rs and alloc.rs).
const ROOT: &str = "java.lang.Thread.run";

/// The keys of LockSplit's `LOCK <epoch ns> monitor_ns=<ns> monitor_waits=<n> park_ns=<ns>
/// park_waits=<n>` lines: nanoseconds and waits over 1 ms per site (`<key>_ns`, `<key>_waits`
/// of [`SITES`]), cumulative.
const TOTALS: &[&str] = &["monitor_ns", "monitor_waits", "park_ns", "park_waits"];

// Which profiles of one kind (`mutex` or `block`) are compared, over which window. A wait is
// in the profile of the interval in which it ends, if the daemon saw it begin: the first
// interval in which the daemon profiles a JVM lacks the waits that began before it started
// (their stacks were never taken), so that interval's profile is left out. The later ones
// cover whole intervals back to back, and exactly: the daemon drains an interval's records
// just before ending it, and its bounds are the daemon's wall clock, as the workload's
// `Instant.now()` is. A waiting thread adds its wait to its totals as soon as it has the lock,
// microseconds after the wait's end, and the totals are stamped every 100 ms: about 5 waits of
// about 30 ms per site between two lines, so interpolating at each bound errs by about a wait
// (30 ms of 20 s waited per site over 14 s: 0.2%), as does the count (one of about 700).
//
// So: `pid`'s `kind` profiles in `dir` but the first, checked back to back, and their span;
// or what is wrong with them (one JDK's failure, reported with the others').
// The window is taken by `profiler_tests::measured_truth::whole_intervals`.

/// What the profiles of one kind say, per site (as [`SITES`]) and in all.
#[derive(Debug, Default)]
struct Measured {
    /// Delay (ns), contentions and samples under each site's method.
    delay: [i64; 2],
    contentions: [i64; 2],
    samples: [usize; 2],
    /// Of each site's delay, what its own threads waited (by the `thread_name` label).
    own_threads_delay: [i64; 2],
    /// Each site's delay by the `java_state` label.
    java_states: [HashMap<String, i64>; 2],
    /// Samples under each of [`NOT_LOCKS`].
    not_lock_samples: [usize; 2],
    delay_total: i64,
    rooted_delay: i64,
    /// Delay whose stack does not reach [`ROOT`], by its innermost frames.
    unrooted: HashMap<String, i64>,
}

impl Measured {
    /// The Java state most of `site`'s delay was in.
    fn main_java_state(&self, site: usize) -> &str {
        self.java_states[site]
            .iter()
            .max_by_key(|(_, ns)| **ns)
            .map_or("none", |(state, _)| state.as_str())
    }
}

fn measure(profiles: &[proto::Profile], kind: &str, major: u32) -> Measured {
    let mut measured = Measured::default();
    for profile in profiles {
        let name = |index: i64| profile.string_table[index as usize].as_str();
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (name(t.r#type), name(t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES, "JDK {major}: {kind} sample types");
        let period = profile.period_type.as_ref().expect("a period type");
        assert_eq!(
            (name(period.r#type), name(period.unit)),
            (kind, "count"),
            "JDK {major}: {kind} period type"
        );
        for sample in &profile.sample {
            let delay = sample.value[DELAY];
            let frames: Vec<String> = sample_frames(profile, sample)
                .iter()
                .map(|frame| base_name(&frame.name).to_owned())
                .collect();
            let has = |method: &str| frames.iter().any(|f| f == method);
            measured.delay_total += delay;
            if has(ROOT) {
                measured.rooted_delay += delay;
            } else {
                let innermost: Vec<&str> = frames.iter().take(6).map(String::as_str).collect();
                *measured.unrooted.entry(innermost.join(";")).or_default() += delay;
            }
            for (count, method) in measured.not_lock_samples.iter_mut().zip(NOT_LOCKS) {
                if has(method) {
                    *count += 1;
                }
            }
            let Some(index) = SITES.iter().position(|site| has(site.method)) else {
                continue;
            };
            measured.delay[index] += delay;
            measured.contentions[index] += sample.value[CONTENTIONS];
            measured.samples[index] += 1;
            if label(profile, sample, "thread_name")
                .is_some_and(|thread| thread.starts_with(SITES[index].threads))
            {
                measured.own_threads_delay[index] += delay;
            }
            *measured.java_states[index]
                .entry(
                    label(profile, sample, "java_state")
                        .unwrap_or("none")
                        .to_owned(),
                )
                .or_default() += delay;
        }
    }
    measured
}

fn share(part: i64, whole: i64) -> f64 {
    part as f64 / whole.max(1) as f64
}

/// One kind of lock profile of one JVM: its whole-interval profiles, their window, what they
/// say.
struct Profiled {
    kind: &'static str,
    profiles: usize,
    window: Window,
    measured: Measured,
}

#[test]
fn lock_delays_per_site_match_the_truth_on_every_jdk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["LockSplit.java"], dir.path()).expect("javac");
    let mut splits: Vec<MeasuringJvm> = jdks()
        .into_iter()
        .map(|jdk| MeasuringJvm::start(jdk, JVM_ARGS, &classes, "LockSplit", "LOCK", TOTALS))
        .collect();
    let out = dir.path().join("profiles");
    let seconds = 20;
    DaemonRun::new()
        .pids(splits.iter().map(|split| split.jvm.pid()))
        .frequency(19)
        .interval(2)
        .duration(seconds)
        .no_stream()
        .output(&out)
        .arg(LOCK)
        .run(Duration::from_secs(seconds + 60));

    for split in &mut splits {
        split.assert_alive("lock profiling");
    }

    let mut failures = Vec::new();
    for split in &splits {
        let major = split.jdk.major;
        let profiled: Result<Vec<Profiled>, String> = ["mutex", "block"]
            .into_iter()
            .map(|kind| {
                let (profiles, window) = whole_intervals(&out, split.jvm.pid(), major, kind)?;
                Ok(Profiled {
                    kind,
                    profiles: profiles.len(),
                    window,
                    measured: measure(&profiles, kind, major),
                })
            })
            .collect();
        let profiled = match profiled {
            Ok(profiled) => profiled,
            Err(failure) => {
                println!("{failure}");
                failures.push(failure);
                continue;
            }
        };
        let of_kind = |kind: &str| {
            profiled
                .iter()
                .find(|p| p.kind == kind)
                .expect("both kinds profiled")
        };
        let delay: i64 = profiled.iter().map(|p| p.measured.delay_total).sum();
        let rooted = share(
            profiled.iter().map(|p| p.measured.rooted_delay).sum(),
            delay,
        );
        let spans: Vec<String> = profiled
            .iter()
            .map(|p| {
                format!(
                    "{} {} profiles over {:.1} s",
                    p.profiles,
                    p.kind,
                    p.window.seconds()
                )
            })
            .collect();
        println!(
            "JDK {major}: {}; {:.2}% of {:.1} s of delay rooted\n  \
             {:<8} {:<6} {:>12} {:>9} {:>8} {:>11} {:>8} {:>8} {:>12} java_state",
            spans.join(", "),
            rooted * 100.0,
            delay as f64 / 1e9,
            "site",
            "kind",
            "profiled ms",
            "true ms",
            "error",
            "profiled n",
            "true n",
            "error",
            "own threads"
        );
        for (index, site) in SITES.iter().enumerate() {
            let own = of_kind(site.profile);
            let truth = split.truth(own.window);
            let got = &own.measured;
            let (expected_ns, expected_waits) = (
                truth.get(&format!("{}_ns", site.key)),
                truth.get(&format!("{}_waits", site.key)),
            );
            let delay_error = got.delay[index] as f64 / expected_ns - 1.0;
            let count_error = got.contentions[index] as f64 / expected_waits - 1.0;
            let own_threads = share(got.own_threads_delay[index], got.delay[index]);
            println!(
                "  {:<8} {:<6} {:>12.1} {:>9.1} {:>+7.2}% {:>11} {:>8.1} {:>+7.2}% {:>11.2}% {}",
                site.key,
                site.profile,
                got.delay[index] as f64 / 1e6,
                expected_ns / 1e6,
                delay_error * 100.0,
                got.contentions[index],
                expected_waits,
                count_error * 100.0,
                own_threads * 100.0,
                got.main_java_state(index)
            );
            // The profile's delay is the waits' time off the CPU (blocked, then runnable until
            // running again); the thread's measure adds the little it ran meanwhile: HotSpot's
            // brief spin before parking, the way in and out of the park.
            if delay_error.abs() > 0.1 {
                failures.push(format!(
                    "JDK {major}: {:.1} ms of {} delay under {} over {:.1} s, its threads waited \
                     {:.1} ms ({:+.1}%)",
                    got.delay[index] as f64 / 1e6,
                    site.profile,
                    site.method,
                    own.window.seconds(),
                    expected_ns / 1e6,
                    delay_error * 100.0
                ));
            }
            if count_error.abs() > 0.1 {
                failures.push(format!(
                    "JDK {major}: {} {} contentions under {} over {:.1} s, its threads waited \
                     {expected_waits:.1} times ({:+.1}%)",
                    got.contentions[index],
                    site.profile,
                    site.method,
                    own.window.seconds(),
                    count_error * 100.0
                ));
            }
            if got.delay[index] > 0 && own_threads < 0.99 {
                failures.push(format!(
                    "JDK {major}: {:.2}% of {}'s {} delay has a thread_name label {}*",
                    own_threads * 100.0,
                    site.method,
                    site.profile,
                    site.threads
                ));
            }
            // The other profile has none of this site's waits.
            for other in profiled.iter().filter(|p| p.kind != site.profile) {
                let samples = other.measured.samples[index];
                if samples > 0 {
                    failures.push(format!(
                        "JDK {major}: {samples} {} samples under {} ({:.1} ms), whose waits are \
                         {} waits",
                        other.kind,
                        site.method,
                        other.measured.delay[index] as f64 / 1e6,
                        site.profile
                    ));
                }
            }
        }
        for p in &profiled {
            for (method, &samples) in NOT_LOCKS.iter().zip(&p.measured.not_lock_samples) {
                if samples > 0 {
                    failures.push(format!(
                        "JDK {major}: {samples} {} samples under {method}, which waits for no lock",
                        p.kind
                    ));
                }
            }
        }
        let mut unrooted: Vec<(&String, &i64)> =
            profiled.iter().flat_map(|p| &p.measured.unrooted).collect();
        unrooted.sort_by_key(|(_, ns)| -**ns);
        for (innermost, ns) in unrooted.iter().take(3) {
            println!("    {:.1} ms not rooted: {innermost}", **ns as f64 / 1e6);
        }
        if rooted < 0.99 {
            failures.push(format!(
                "JDK {major}: {:.2}% of the lock profiles' delay reaches {ROOT}",
                rooted * 100.0
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
