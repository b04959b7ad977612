//! Allocation profiles end to end (`--alloc`): AllocSplit's three sites, one thread each, measure
//! their own allocated bytes with the JVM's per-thread counter; on every JDK at once, the
//! daemon's `alloc-*` profiles must put each site's bytes under its method within 5% of that
//! truth, with the allocated class as the innermost frame, small objects in new TLABs and 8 MiB
//! arrays outside them, and stacks rooted at the thread's entry. The large arrays, always
//! sampled, are also counted: their estimated number is the number allocated.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use profiler_daemon::pprof::proto;
use profiler_tests::*;

/// A small fixed heap; the `site*` methods never inlined, so each site is a frame of its own;
/// `quiet`, so that the JVM's stdout starts with the workload's "ready".
const JVM_ARGS: &[&str] = &[
    "-Xms256m",
    "-Xmx256m",
    "-XX:CompileCommand=quiet",
    "-XX:CompileCommand=dontinline,AllocSplit::site*",
];

/// The alloc profiles' sample types (type, unit), in order.
const SAMPLE_TYPES: [(&str, &str); 4] = [
    ("alloc_in_new_tlab_objects", "count"),
    ("alloc_in_new_tlab_bytes", "bytes"),
    ("alloc_outside_tlab_objects", "count"),
    ("alloc_outside_tlab_bytes", "bytes"),
];
const IN_NEW_TLAB_OBJECTS: usize = 0;
const IN_NEW_TLAB_BYTES: usize = 1;
const OUTSIDE_TLAB_OBJECTS: usize = 2;
const OUTSIDE_TLAB_BYTES: usize = 3;

/// One allocation site of tests/java/AllocSplit.java.
struct Site {
    /// Its name in the workload's `ALLOC` lines.
    key: &'static str,
    /// The method that allocates: a sample whose stack has it is the site's.
    method: &'static str,
    /// The class it allocates, as the innermost frame names it.
    class: &'static str,
    /// Whether its objects are too large for a TLAB.
    outside_tlab: bool,
}

const SITES: [Site; 3] = [
    Site {
        key: "seventy",
        method: "AllocSplit.siteSeventy",
        class: "AllocSplit$Seventy",
        outside_tlab: false,
    },
    Site {
        key: "thirty",
        method: "AllocSplit.siteThirty",
        class: "long[]",
        outside_tlab: false,
    },
    Site {
        key: "large",
        method: "AllocSplit.siteLarge",
        class: "byte[]",
        outside_tlab: true,
    },
];

/// The frames a rooted stack reaches: the entry of the site threads (as in java_stacks.rs and
/// off_cpu.rs) and of the main thread, which prints the totals.
const ROOTS: [&str; 2] = ["java.lang.Thread.run", "AllocSplit.main"];

/// The keys of AllocSplit's `ALLOC <epoch ns> seventy=<bytes> thirty=<bytes> large=<bytes>
/// arrays=<count>` lines: bytes per site (as [`SITES`]) and the large site's arrays, cumulative.
const TOTALS: &[&str] = &["seventy", "thirty", "large", "arrays"];

/// Which profiles are compared, over which window. The hooks take a JVM's allocations once the
/// daemon has pushed its layout, partway through the interval of its first alloc profile, whose
/// span (from the interval's start) is longer than what it counted: it is left out. The later
/// ones cover whole intervals back to back, and exactly: the daemon drains an interval's records
/// just before ending it, and its bounds are the daemon's wall clock, as the workload's
/// `Instant.now()` is. The workload's totals are stamped every 100 ms, each thread's at most a
/// batch (a few ms of its allocation) old, at steady rates: interpolated at both bounds, they
/// err by far less than 0.1% over a window of seconds.
///
/// So: `pid`'s alloc profiles in `dir` but the first, asserted back to back, and their span.
fn whole_intervals(dir: &Path, pid: u32, major: u32) -> (Vec<proto::Profile>, Window) {
    let mut profiles: Vec<proto::Profile> = profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("alloc-"))
        })
        .map(|(_, profile)| profile)
        .collect();
    profiles.sort_by_key(|p| p.time_nanos);
    assert!(
        profiles.len() >= 4,
        "JDK {major}: {} alloc profiles, at least 4 expected (the first partial)",
        profiles.len()
    );
    profiles.remove(0);
    for pair in profiles.windows(2) {
        let end = pair[0].time_nanos + pair[0].duration_nanos;
        assert!(
            (pair[1].time_nanos - end).abs() < 1_000_000,
            "JDK {major}: an alloc profile starts at {} ns, its predecessor ended at {end} ns: \
             an interval is missing",
            pair[1].time_nanos
        );
    }
    let last = profiles.last().expect("profiles");
    let window = Window {
        start: profiles[0].time_nanos,
        end: last.time_nanos + last.duration_nanos,
    };
    (profiles, window)
}

/// One site's samples: bytes, those outside TLABs, those whose innermost frame is the site's
/// class, and the estimated objects allocated outside TLABs.
#[derive(Debug, Default)]
struct SiteSamples {
    bytes: i64,
    outside_tlab_bytes: i64,
    class_bytes: i64,
    outside_tlab_objects: i64,
}

/// What the alloc profiles of one JVM say.
#[derive(Debug, Default)]
struct Measured {
    sites: [SiteSamples; 3],
    bytes: i64,
    rooted_bytes: i64,
    /// Bytes whose stack reaches no root, by their innermost frames.
    unrooted: HashMap<String, i64>,
    /// Samples with values in both the in-new-TLAB and the outside-TLAB columns, or in neither.
    mixed_samples: usize,
}

fn measure(profiles: &[proto::Profile], major: u32) -> Measured {
    let mut measured = Measured::default();
    for profile in profiles {
        let name = |index: i64| profile.string_table[index as usize].as_str();
        let types: Vec<(&str, &str)> = profile
            .sample_type
            .iter()
            .map(|t| (name(t.r#type), name(t.unit)))
            .collect();
        assert_eq!(types, SAMPLE_TYPES, "JDK {major}: alloc sample types");
        let period = profile.period_type.as_ref().expect("a period type");
        assert_eq!(
            (name(period.r#type), name(period.unit)),
            ("space", "bytes"),
            "JDK {major}: alloc period type"
        );
        for sample in &profile.sample {
            let value = |column: usize| sample.value[column];
            let in_new_tlab = value(IN_NEW_TLAB_OBJECTS) != 0 || value(IN_NEW_TLAB_BYTES) != 0;
            let outside_tlab = value(OUTSIDE_TLAB_OBJECTS) != 0 || value(OUTSIDE_TLAB_BYTES) != 0;
            if in_new_tlab == outside_tlab {
                measured.mixed_samples += 1;
            }
            let bytes = value(IN_NEW_TLAB_BYTES) + value(OUTSIDE_TLAB_BYTES);
            let frames: Vec<String> = sample_frames(profile, sample)
                .iter()
                .map(|frame| base_name(&frame.name).to_owned())
                .collect();
            measured.bytes += bytes;
            if frames.iter().any(|f| ROOTS.contains(&f.as_str())) {
                measured.rooted_bytes += bytes;
            } else {
                let innermost: Vec<&str> = frames.iter().take(4).map(String::as_str).collect();
                *measured.unrooted.entry(innermost.join(";")).or_default() += bytes;
            }
            let Some(index) = SITES
                .iter()
                .position(|site| frames.iter().any(|f| f == site.method))
            else {
                continue;
            };
            let site = &mut measured.sites[index];
            site.bytes += bytes;
            site.outside_tlab_bytes += value(OUTSIDE_TLAB_BYTES);
            site.outside_tlab_objects += value(OUTSIDE_TLAB_OBJECTS);
            if frames.first().is_some_and(|f| f == SITES[index].class) {
                site.class_bytes += bytes;
            }
        }
    }
    measured
}

fn share(part: i64, whole: i64) -> f64 {
    part as f64 / whole.max(1) as f64
}

/// Profiles `splits` with one daemon run (`--alloc` with `alloc`), `seconds` long, 2 s
/// intervals, and returns each JVM's whole-interval profiles and their window.
fn profile(
    splits: &mut [MeasuringJvm],
    alloc: &str,
    seconds: u64,
    out: &Path,
) -> Vec<(Vec<proto::Profile>, Window)> {
    DaemonRun::new()
        .pids(splits.iter().map(|split| split.jvm.pid()))
        .frequency(19)
        .interval(2)
        .duration(seconds)
        .no_stream()
        .output(out)
        .arg(alloc)
        .run(Duration::from_secs(seconds + 60));
    splits
        .iter_mut()
        .map(|split| {
            split.assert_alive("allocation profiling");
            whole_intervals(out, split.jvm.pid(), split.jdk.major)
        })
        .collect()
}

#[test]
fn allocation_bytes_per_site_match_the_truth_on_every_jdk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["AllocSplit.java"], dir.path()).expect("javac");
    let mut splits: Vec<MeasuringJvm> = jdks()
        .into_iter()
        .map(|jdk| MeasuringJvm::start(jdk, JVM_ARGS, &classes, "AllocSplit", "ALLOC", TOTALS))
        .collect();
    let out = dir.path().join("profiles");
    let profiled = profile(&mut splits, "--alloc=65536", 20, &out);

    let mut failures = Vec::new();
    for (split, (profiles, window)) in splits.iter().zip(profiled) {
        let major = split.jdk.major;
        let truth = split.truth(window);
        let measured = measure(&profiles, major);
        let rooted = share(measured.rooted_bytes, measured.bytes);
        println!(
            "JDK {major}: {} alloc profiles over {:.1} s; {:.2}% of {:.1} MB rooted\n  \
             {:<8} {:>12} {:>9} {:>8} {:>13} {:>15}",
            profiles.len(),
            window.seconds(),
            rooted * 100.0,
            measured.bytes as f64 / 1e6,
            "site",
            "profiled MB",
            "true MB",
            "error",
            "leaf class",
            "outside TLAB"
        );
        for (site, got) in SITES.iter().zip(&measured.sites) {
            let expected = truth.get(site.key);
            let error = got.bytes as f64 / expected - 1.0;
            let class = share(got.class_bytes, got.bytes);
            let outside = share(got.outside_tlab_bytes, got.bytes);
            println!(
                "  {:<8} {:>12.1} {:>9.1} {:>+7.2}% {:>12.2}% {:>14.2}%",
                site.key,
                got.bytes as f64 / 1e6,
                expected / 1e6,
                error * 100.0,
                class * 100.0,
                outside * 100.0
            );
            // A new TLAB's bytes count whole when it is taken, the thread's counter counts what
            // it used: the TLABs' unused ends (at each GC; 0.5% of the small sites' bytes with
            // -Xlog:gc+tlab=trace on JDK 17) are the profiles' only bias.
            if error.abs() > 0.05 {
                failures.push(format!(
                    "JDK {major}: {:.1} MB profiled under {} over {:.1} s, its thread allocated \
                     {:.1} MB ({:+.1}%)",
                    got.bytes as f64 / 1e6,
                    site.method,
                    window.seconds(),
                    expected / 1e6,
                    error * 100.0
                ));
            }
            if class < 0.99 {
                failures.push(format!(
                    "JDK {major}: {:.2}% of {}'s bytes have {} as their innermost frame",
                    class * 100.0,
                    site.method,
                    site.class
                ));
            }
            // A small object goes outside a TLAB only when no new TLAB could be had (a full
            // heap, until the GC it triggers).
            let (in_columns, wanted, columns) = if site.outside_tlab {
                (outside, 0.99, "outside_tlab")
            } else {
                (1.0 - outside, 0.95, "in_new_tlab")
            };
            if in_columns < wanted {
                failures.push(format!(
                    "JDK {major}: {:.2}% of {}'s bytes are in the {columns} columns",
                    in_columns * 100.0,
                    site.method
                ));
            }
        }
        let mut unrooted: Vec<_> = measured.unrooted.iter().collect();
        unrooted.sort_by_key(|(_, bytes)| -**bytes);
        for (innermost, bytes) in unrooted.iter().take(3) {
            println!("    {:.1} MB not rooted: {innermost}", **bytes as f64 / 1e6);
        }
        if rooted < 0.99 {
            failures.push(format!(
                "JDK {major}: {:.2}% of the alloc samples' bytes reach {ROOTS:?}",
                rooted * 100.0
            ));
        }
        if measured.mixed_samples > 0 {
            failures.push(format!(
                "JDK {major}: {} samples with values in both the in_new_tlab and the \
                 outside_tlab columns, or in neither",
                measured.mixed_samples
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Each 8 MiB array is larger than the default sampling interval (512 KiB, `--alloc` without a
/// value), so each is sampled with probability 1 and counted as one object.
#[test]
fn objects_are_the_estimated_count_of_events() {
    let all: Vec<u32> = jdks().iter().map(|jdk| jdk.major).collect();
    let wanted = majors_from_env("PROFILER_ALLOC_JDKS", &[major_of_the_day(&all)]);
    println!("JDKs {wanted:?} (PROFILER_ALLOC_JDKS chooses)");
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["AllocSplit.java"], dir.path()).expect("javac");
    let mut splits: Vec<MeasuringJvm> = jdks()
        .into_iter()
        .filter(|jdk| wanted.contains(&jdk.major))
        .map(|jdk| MeasuringJvm::start(jdk, JVM_ARGS, &classes, "AllocSplit", "ALLOC", TOTALS))
        .collect();
    assert!(!splits.is_empty(), "no test JDK among {wanted:?}");
    let out = dir.path().join("profiles");
    let profiled = profile(&mut splits, "--alloc", 14, &out);

    let large = SITES
        .iter()
        .position(|site| site.outside_tlab)
        .expect("the large site");
    for (split, (profiles, window)) in splits.iter().zip(profiled) {
        let major = split.jdk.major;
        let arrays = split.truth(window).get("arrays");
        let estimated = measure(&profiles, major).sites[large].outside_tlab_objects;
        let error = estimated as f64 / arrays - 1.0;
        println!(
            "JDK {major}: {estimated} objects outside TLABs under {} over {:.1} s, {arrays:.1} \
             arrays allocated ({:+.2}%)",
            SITES[large].method,
            window.seconds(),
            error * 100.0
        );
        assert!(
            error.abs() <= 0.05,
            "JDK {major}: {estimated} objects estimated outside TLABs under {}, {arrays:.1} \
             arrays of 8 MiB allocated over {:.1} s",
            SITES[large].method,
            window.seconds()
        );
    }
}
