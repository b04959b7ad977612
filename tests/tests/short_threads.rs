//! Threads that live briefly, end to end (`--lock`, `--alloc`, CPU): ShortThreads starts a
//! thread every 30 ms that lives 100 ms, 300 ms, 1 s or 3 s; each contends on a shared monitor
//! (`monitorSite`) and a shared `ReentrantLock` (`parkSite`), allocates at two sites
//! (`allocSmall`, `allocLarge`) and spends about 0.3 ms of CPU in a JNI call each round,
//! measuring its own waits and bytes. On JDK 11, 17, 21, 25 and 27 at once, the JVMs started
//! once and the daemon run three times (`--lock=0`, `--lock=2ms`, `--lock=10ms`, each with
//! `--alloc`):
//!
//! - each kind's lock profiles (`mutex-*`: the monitor, `block-*`: the lock) must put that
//!   lock's waiting time under its site within 5% of the time the threads waited in waits at or
//!   over the same threshold, the threshold applying to the whole wait;
//! - the alloc profiles, from HotSpot's own sampler (the sidecar agent, loaded with the JVM
//!   and `alloc_interval`; TLABs of a fixed size, see `ALLOC_SHARE_PP`), must give each site its
//!   share of the bytes within 3 pp (4.5 on JDK 11), and the total within 5% where the daemon
//!   scales the profiles to the JVM's own count (JDK 14+; 30% on JDK 11);
//! - of the short threads' CPU samples in the JNI call, >= 99% must reach `Thread.run` (in the
//!   whole intervals that began an interval after the daemon had read the JVM).
//!
//! What makes short threads hard: a thread's first milliseconds are its whole life here, so
//! whatever the daemon learns of a thread late (its Java identity), or weighs by what the thread
//! is about to do (a new TLAB's size), or splits (a wait made of several blocks) shows at once.

use std::collections::HashMap;
use std::time::Duration;

use profiler_daemon::pprof::proto;
use profiler_tests::*;

/// The JDKs covered: the long-term releases and the newest.
const MAJORS: [u32; 5] = [11, 17, 21, 25, 27];

/// A fixed heap of a size services run with; TLABs of a fixed 512 KiB (see `ALLOC_SHARE_PP`);
/// the sites never inlined, so each is a frame of its own; `quiet`, so that the JVM's stdout
/// starts with the workload's "ready". The JNI library's path is added.
const JVM_ARGS: &[&str] = &[
    "-Xms256m",
    "-Xmx256m",
    "-XX:CompileCommand=quiet",
    "-XX:CompileCommand=dontinline,ShortThreads::*Site",
    "-XX:CompileCommand=dontinline,ShortThreads::alloc*",
    "-XX:TLABSize=512k",
    "-XX:-ResizeTLAB",
];

/// Each daemon run: 2 s intervals, so that 24 s give 11 whole ones after the first, partial one
/// (about 22 s compared per threshold; three runs and the JVMs' start take about 1.5 minutes).
const SECONDS: u64 = 24;
const INTERVAL: u64 = 2;
/// 99 Hz: the JNI call holds about 6% of a CPU per JVM, about 400 samples over the runs.
const FREQUENCY: u32 = 99;
/// One sample per 64 KiB allocated: each JVM allocates about 12 MB/s, so about 180 samples a
/// second, thousands per site over the runs.
const ALLOC: &str = "--alloc=64k";
const ALLOC_INTERVAL_BYTES: u64 = 64 << 10;

/// The targets.
const LOCK_TIME_ERROR: f64 = 0.05;
/// Each site's share of the bytes, and the total against the truth, with HotSpot's allocation
/// sampler (the agent's `alloc_interval`).
///
/// HotSpot's sampler under-samples an object allocated outside the thread's TLAB (one that
/// does not fit in what is left of it): it checks that object against a countdown that has not
/// yet counted the bytes allocated in the TLAB since the last check, and the point it misses
/// lands on the next object that takes the TLAB's slow path. With this heap's adaptive TLABs
/// (tens of KB among ~37 threads) the 16 KiB arrays often go outside, and the small arrays' site
/// got +0.1 to +4.4 pp on JDK 25 and 27 and +4 to +10 pp on JDK 11 to 21; with TLABs of a fixed
/// 512 KiB, where they fit, every JDK's shares were within -1.8 to +2.8 pp (two runs). That
/// bias is HotSpot's (async-profiler's default allocation mode uses the same sampler), so the
/// TLABs are fixed here and the test holds the daemon's part (weights, the first-report skip,
/// short threads' identity) on every JDK.
///
/// The sampler has a second weakness: its sample points' distances come from one generator that
/// each new thread reseeds from its address, and ended threads' addresses come back, so a few
/// runs of distances recur. With every round the same size the small site's share was off by
/// -4.5 to +5.1 pp, a different way each run (CI, 2026-12-03); with the rounds' sizes drawn at
/// random (tests/java/ShortThreads.java) six runs gave -1.8 to +1.5 pp on every JDK (standard
/// deviation 0.9 pp), hence the 3 pp.
const ALLOC_SHARE_PP: f64 = 3.0;
/// JDK 11's sampler is less even: over eleven runs its small site's share was -3.1 to -0.1 pp
/// off, -1.5 on average (JDK 17 to 27: -1.7 to +1.5, about 0 on average).
const JDK11_SHARE_PP: f64 = 4.5;
/// Totals: the daemon scales each interval's profile to the bytes the JVM counted (what its
/// live threads allocated, and its ended threads: `ThreadService::_exited_allocated_bytes` from
/// JDK 14, the daemon's thread-exit hook before): the 5%. Measured 0.982 to 0.999 on
/// JDK 17 to 27, 0.991 on JDK 11; unscaled, the sampler's recurring distances made them 0.91 to
/// 1.09 on JDK 25 and 27, 0.79 to 1.06 on 17 and 21, 0.77 to 0.97 on 11.
const ALLOC_TOTAL_ERROR: f64 = 0.05;
/// Where the shares are held to the 3 pp (JDK 11's sampler: [`JDK11_SHARE_PP`]).
const EVEN_SAMPLER_FROM_JDK: u32 = 14;
const JNI_ROOTED: f64 = 0.99;
/// The daemon's first moments on a JVM are its start-up's: its layout, then the unwind tables of
/// the JNI library, which come in turn after the JDK's (the library's table came in the first
/// interval after the layout: samples ending in `jni_CallStaticLongMethod`). The JNI figure
/// starts one interval after the layout. Layouts came 0.08 to 0.32 s after sampling began, with
/// the five JVMs keeping both CPUs busy; up to 3.8 s in a full test run while the tracker read
/// each JVM's libjvm symbol tables before the next JVM's layout (its tick now pushes every
/// layout first).
const SETTLING_NS: i64 = INTERVAL as i64 * 1_000_000_000;
/// Fewer JNI samples than this would say little: the harness failed.
const JNI_MIN_SAMPLES: usize = 100;

/// One daemon run's lock threshold.
struct Threshold {
    /// The daemon's option.
    flag: &'static str,
    /// Its suffix in the workload's `SHORT` lines (`monitor_ns_<key>`, `monitor_waits_<key>`).
    key: &'static str,
}

const THRESHOLDS: [Threshold; 3] = [
    Threshold {
        flag: "--lock=0",
        key: "0",
    },
    Threshold {
        flag: "--lock=2ms",
        key: "2ms",
    },
    Threshold {
        flag: "--lock=10ms",
        key: "10ms",
    },
];

/// One lock of tests/java/ShortThreads.java.
struct LockKind {
    /// Its name in the workload's `SHORT` lines.
    key: &'static str,
    /// The method that waits: a sample whose stack has it is this lock's.
    method: &'static str,
    /// The profile its waits belong in: the files' prefix.
    profile: &'static str,
}

const LOCK_KINDS: [LockKind; 2] = [
    LockKind {
        key: "monitor",
        method: "ShortThreads.monitorSite",
        profile: "mutex",
    },
    LockKind {
        key: "park",
        method: "ShortThreads.parkSite",
        profile: "block",
    },
];

/// One allocation site: its name in the `SHORT` lines and its method.
struct AllocSite {
    key: &'static str,
    method: &'static str,
}

const ALLOC_SITES: [AllocSite; 2] = [
    AllocSite {
        key: "small",
        method: "ShortThreads.allocSmall",
    },
    AllocSite {
        key: "large",
        method: "ShortThreads.allocLarge",
    },
];

/// The frames of the JNI call: the library's (tests/workloads/jni_callback.c), the native
/// method, and the Java method the library calls back, which nothing else calls. A sample with
/// any of them is in the JNI call, whether or not the walk got through the library.
const JNI_FRAMES: [&str; 5] = [
    "native_spin",
    "native_middle",
    "Java_JniCallback_nativeOuter",
    "JniCallback.nativeOuter",
    "JniCallback.javaCallback",
];

/// The short threads' names: `short-<n>`.
const SHORT_THREAD: &str = "short-";

/// The frame a rooted stack reaches: the short threads' entry.
const ROOT: &str = "java.lang.Thread.run";

/// The keys of ShortThreads' `SHORT <epoch ns> ...` lines, all cumulative: per lock and
/// threshold the nanoseconds waited and the waits at or over it, the bytes of each allocation
/// site, the threads started and the JNI calls made.
const TOTALS: &[&str] = &[
    "monitor_ns_0",
    "monitor_waits_0",
    "monitor_ns_2ms",
    "monitor_waits_2ms",
    "monitor_ns_10ms",
    "monitor_waits_10ms",
    "park_ns_0",
    "park_waits_0",
    "park_ns_2ms",
    "park_waits_2ms",
    "park_ns_10ms",
    "park_waits_10ms",
    "small",
    "large",
    "started",
    "jni",
];

// Which profiles of one kind (`mutex`, `block`, `alloc`, `cpu`) are compared, over which
// window. The first interval in which the daemon profiles a JVM is partial (waits that began
// before it started were never seen to begin, the allocation hooks are attached partway
// through, the first CPU samples come before the JVM's layout is read), so its profile is left
// out. The later ones cover whole intervals back to back, and exactly: the daemon drains an
// interval's records just before ending it, and its bounds are the daemon's wall clock, as the
// workload's `Instant.now()` is. A wait is in the profile of the interval in which it ends, and
// the waiting thread adds it to the truth microseconds after its end; an allocation is counted
// by the truth at the end of its batch (at most a millisecond later). The truth is stamped
// every 100 ms and interpolated at each bound: it errs there by about one wait (the longest are
// tens of ms, of 13 to 17 s waited per lock over 22 s at threshold 0, 2 to 6 s at 10 ms: under
// 1%) and one round of allocations (at most 106 KB of about 250 MB).
//
// So: `pid`'s `kind` profiles in `dir` but the first, checked back to back, and their span;
// or what is wrong with them (one JDK's failure, reported with the others').
// The window is taken by `profiler_tests::measured_truth::whole_intervals`.

/// The column of `profile`'s samples whose type is `name`.
fn column(profile: &proto::Profile, name: &str) -> usize {
    profile
        .sample_type
        .iter()
        .position(|t| profile.string_table[t.r#type as usize] == name)
        .unwrap_or_else(|| panic!("no sample type {name:?}"))
}

/// Each sample of `profiles` with its frames' base names, innermost first.
fn samples_with_frames(
    profiles: &[proto::Profile],
) -> impl Iterator<Item = (&proto::Profile, &proto::Sample, Vec<String>)> {
    profiles.iter().flat_map(|profile| {
        profile.sample.iter().map(move |sample| {
            let frames = sample_frames(profile, sample)
                .iter()
                .map(|frame| base_name(&frame.name).to_owned())
                .collect();
            (profile, sample, frames)
        })
    })
}

/// One lock at one threshold: what its profiles say and what its threads measured.
#[derive(Debug, Default)]
struct LockFigures {
    profiles: usize,
    seconds: f64,
    delay_ns: i64,
    contentions: i64,
    true_ns: f64,
    true_waits: f64,
}

impl LockFigures {
    fn ratio(&self) -> f64 {
        self.delay_ns as f64 / self.true_ns.max(1.0)
    }
}

fn measure_lock(
    profiles: &[proto::Profile],
    window: Window,
    kind: &LockKind,
    threshold: &Threshold,
    truth: &Totals,
) -> LockFigures {
    let mut figures = LockFigures {
        profiles: profiles.len(),
        seconds: window.seconds(),
        true_ns: truth.get(&format!("{}_ns_{}", kind.key, threshold.key)),
        true_waits: truth.get(&format!("{}_waits_{}", kind.key, threshold.key)),
        ..LockFigures::default()
    };
    for (profile, sample, frames) in samples_with_frames(profiles) {
        if frames.iter().any(|f| f == kind.method) {
            figures.delay_ns += sample.value[column(profile, "delay")];
            figures.contentions += sample.value[column(profile, "contentions")];
        }
    }
    figures
}

/// The alloc profiles of every run of one JVM, summed, and the truth over the same windows.
#[derive(Debug, Default)]
struct AllocFigures {
    profiles: usize,
    seconds: f64,
    /// Bytes under each of [`ALLOC_SITES`], and what each site allocated.
    bytes: [i64; 2],
    true_bytes: [f64; 2],
    /// Bytes of the whole JVM in the profiles.
    all_bytes: i64,
}

impl AllocFigures {
    fn add(&mut self, profiles: &[proto::Profile], window: Window, truth: &Totals) {
        self.profiles += profiles.len();
        self.seconds += window.seconds();
        for (true_bytes, site) in self.true_bytes.iter_mut().zip(&ALLOC_SITES) {
            *true_bytes += truth.get(site.key);
        }
        for (profile, sample, frames) in samples_with_frames(profiles) {
            let bytes = sample.value[column(profile, "alloc_in_new_tlab_bytes")]
                + sample.value[column(profile, "alloc_outside_tlab_bytes")];
            self.all_bytes += bytes;
            if let Some(site) = ALLOC_SITES
                .iter()
                .position(|site| frames.iter().any(|f| f == site.method))
            {
                self.bytes[site] += bytes;
            }
        }
    }

    fn total(&self) -> i64 {
        self.bytes.iter().sum()
    }

    fn true_total(&self) -> f64 {
        self.true_bytes.iter().sum()
    }

    /// Each site's share of the two sites' bytes, in percent: profiled, true.
    fn shares(&self, site: usize) -> (f64, f64) {
        (
            100.0 * self.bytes[site] as f64 / self.total().max(1) as f64,
            100.0 * self.true_bytes[site] / self.true_total().max(1.0),
        )
    }
}

/// The short threads' CPU samples in the JNI call, over every run of one JVM.
#[derive(Debug, Default)]
struct JniFigures {
    profiles: usize,
    samples: usize,
    rooted: usize,
    /// Samples in the JNI call whose thread is not a short one (or has no name).
    other_threads: usize,
    /// Samples that do not reach [`ROOT`], by their innermost and outermost frames.
    unrooted: HashMap<String, usize>,
    /// The same samples by the whole interval they fell in (1 is the first, `run` the threshold):
    /// whether they gather at a run's start or are spread.
    unrooted_at: HashMap<(&'static str, usize), usize>,
    /// Per run, how long after the daemon began sampling it pushed this JVM's layout.
    ready_after_ms: Vec<i64>,
    /// Whole intervals left out because they began before that or within [`SETTLING_NS`] of
    /// it: until the daemon has read the JVM, its Java frames are walked as native ones (its
    /// start's business, measured in tests/tests/hostile_jvms.rs, not the short threads').
    before_ready: usize,
}

impl JniFigures {
    /// Adds the samples of one run's whole intervals that began [`SETTLING_NS`] after the JVM
    /// was read (`ready_ns`; none if it never was).
    fn add(&mut self, profiles: &[proto::Profile], run: &'static str, ready_ns: Option<i64>) {
        for (index, profile) in profiles.iter().enumerate() {
            let settled = ready_ns.map(|ready| ready + SETTLING_NS);
            if settled.is_none_or(|settled| profile.time_nanos < settled) {
                self.before_ready += 1;
                continue;
            }
            self.profiles += 1;
            self.add_profile(profile, (run, index + 1));
        }
    }

    fn add_profile(&mut self, profile: &proto::Profile, interval: (&'static str, usize)) {
        for (profile, sample, frames) in samples_with_frames(std::slice::from_ref(profile)) {
            if !frames.iter().any(|f| JNI_FRAMES.contains(&f.as_str())) {
                continue;
            }
            let samples = count(sample) as usize;
            if !label(profile, sample, "thread_name").is_some_and(|t| t.starts_with(SHORT_THREAD)) {
                self.other_threads += samples;
                continue;
            }
            self.samples += samples;
            if frames.iter().any(|f| f == ROOT) {
                self.rooted += samples;
            } else {
                let innermost: Vec<&str> = frames.iter().take(6).map(String::as_str).collect();
                let outermost: Vec<&str> = frames
                    .iter()
                    .rev()
                    .take(2)
                    .rev()
                    .map(String::as_str)
                    .collect();
                let key = format!("{} ... {}", innermost.join(";"), outermost.join(";"));
                *self.unrooted.entry(key).or_default() += samples;
                *self.unrooted_at.entry(interval).or_default() += samples;
            }
        }
    }

    fn rooted_share(&self) -> f64 {
        self.rooted as f64 / self.samples.max(1) as f64
    }
}

/// Everything measured of one JVM: per lock and threshold, the alloc and JNI figures summed
/// over the runs, and what could not be measured.
#[derive(Debug, Default)]
struct JvmFigures {
    lock: [[Option<LockFigures>; 3]; 2],
    alloc: AllocFigures,
    jni: JniFigures,
    /// Short threads started in the monitor's windows.
    threads_started: f64,
    /// Failures besides the figures' targets: the harness's, and the daemon's hold of the JVM
    /// (read late, or dropped while it ran).
    other_failures: Vec<String>,
}

/// [`MAJORS`] among the test JDKs (all of them, unless `PROFILER_TEST_JDKS` chooses others).
fn test_jdks() -> Vec<Jdk> {
    let chosen: Vec<Jdk> = jdks()
        .into_iter()
        .filter(|jdk| MAJORS.contains(&jdk.major))
        .collect();
    assert!(!chosen.is_empty(), "no test JDK among {MAJORS:?}");
    chosen
}

#[test]
fn short_threads_locks_allocations_and_jni_stacks_match_the_truth_on_every_jdk() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes =
        compile_java(&["ShortThreads.java", "JniCallback.java"], dir.path()).expect("javac");
    let library = compile_jni_callback(dir.path(), &["-O2", "-g", "-fomit-frame-pointer"]);
    let property = format!("-Djni.lib={}", library.display());
    // The sidecar agent with HotSpot's allocation sampler on, at the daemon's interval, from
    // the JVM's start: every alloc profile compared is the sampler's (the daemon's own attach,
    // `--attach auto`, turns it on in a running JVM: tests/tests/alloc_hooks.rs).
    let agent = format!(
        "-agentpath:{}=alloc_interval={ALLOC_INTERVAL_BYTES}",
        agent_library().display()
    );
    let mut jvms: Vec<MeasuringJvm> = test_jdks()
        .into_iter()
        .map(|jdk| {
            let mut jvm_args: Vec<&str> = JVM_ARGS.to_vec();
            jvm_args.push(&property);
            jvm_args.push(&agent);
            // JDK 24 and later warn on stderr when a class path class loads a library, unless
            // allowed; JDK 11 knows no such option.
            if jdk.major >= 24 {
                jvm_args.push("--enable-native-access=ALL-UNNAMED");
            }
            MeasuringJvm::start(jdk, &jvm_args, &classes, "ShortThreads", "SHORT", TOTALS)
        })
        .collect();
    let mut figures: Vec<JvmFigures> = jvms.iter().map(|_| JvmFigures::default()).collect();

    // One JVM per JDK for all three runs: the workload is the same whatever the threshold, and
    // its truth has every threshold's totals.
    for (t, threshold) in THRESHOLDS.iter().enumerate() {
        let out = dir.path().join(format!("profiles-{}", threshold.key));
        let finished = DaemonRun::new()
            .pids(jvms.iter().map(|jvm| jvm.jvm.pid()))
            .frequency(FREQUENCY)
            .interval(INTERVAL)
            .duration(SECONDS)
            .no_stream()
            .output(&out)
            .arg(ALLOC)
            .arg(threshold.flag)
            .run(Duration::from_secs(SECONDS + 60));
        for (jvm, figures) in jvms.iter_mut().zip(&mut figures) {
            jvm.assert_alive(threshold.flag);
            let (pid, major) = (jvm.jvm.pid(), jvm.jdk.major);
            let pushed = finished.layout_pushed(pid);
            let ready_ns = pushed.map(|(at, _)| at);
            figures
                .jni
                .ready_after_ms
                .extend(pushed.map(|(_, after_ms)| after_ms));
            // A live JVM's layout is pushed once and kept: dropped and pushed again, its Java
            // frames would be walked as native ones in between.
            if finished
                .logged_at_ns("JVM exited: layout removed", Some(pid))
                .is_some()
            {
                figures.other_failures.push(format!(
                    "JDK {major}: the daemon ({}) removed the layout of JVM {pid} while it ran",
                    threshold.flag
                ));
            }
            for (k, kind) in LOCK_KINDS.iter().enumerate() {
                match whole_intervals(&out, pid, major, kind.profile) {
                    Ok((profiles, window)) => {
                        let truth = jvm.truth(window);
                        if k == 0 {
                            figures.threads_started += truth.get("started");
                        }
                        figures.lock[k][t] =
                            Some(measure_lock(&profiles, window, kind, threshold, &truth));
                    }
                    Err(failure) => figures.other_failures.push(failure),
                }
            }
            match whole_intervals(&out, pid, major, "alloc") {
                Ok((profiles, window)) => {
                    let truth = jvm.truth(window);
                    figures.alloc.add(&profiles, window, &truth);
                }
                Err(failure) => figures.other_failures.push(failure),
            }
            match whole_intervals(&out, pid, major, "cpu") {
                Ok((profiles, _)) => figures.jni.add(&profiles, threshold.key, ready_ns),
                Err(failure) => figures.other_failures.push(failure),
            }
        }
    }

    let mut failures = Vec::new();
    for (jvm, figures) in jvms.iter().zip(&figures) {
        failures.extend(report(jvm.jdk.major, figures));
    }
    summary(&jvms, &figures);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// One line per JDK, every figure a target applies to: lock time ours / truth per kind and
/// threshold, the small site's share of the alloc bytes (ours - true, pp; the large site's is
/// its opposite), the alloc total ours / truth, the JNI samples' share rooted.
fn summary(jvms: &[MeasuringJvm], figures: &[JvmFigures]) {
    let mut header = format!("{:<6}", "JDK");
    for kind in &LOCK_KINDS {
        for threshold in &THRESHOLDS {
            header += &format!(" {:>12}", format!("{} {}", kind.key, threshold.key));
        }
    }
    println!(
        "summary (targets: lock ratio 1 +- {LOCK_TIME_ERROR}, share +- {ALLOC_SHARE_PP} pp \
         from JDK {EVEN_SAMPLER_FROM_JDK}, alloc total 1 +- {ALLOC_TOTAL_ERROR}, JNI rooted >= {:.0}%):\n{header} {:>11} {:>11} \
         {:>10}",
        JNI_ROOTED * 100.0,
        "small pp",
        "alloc total",
        "JNI rooted"
    );
    for (jvm, figures) in jvms.iter().zip(figures) {
        let mut line = format!("{:<6}", jvm.jdk.major);
        for lock in figures.lock.iter().flatten() {
            line += &match lock {
                Some(lock) => format!(" {:>12.3}", lock.ratio()),
                None => format!(" {:>12}", "-"),
            };
        }
        let alloc = &figures.alloc;
        let (ours, truth) = alloc.shares(0);
        println!(
            "{line} {:>+11.2} {:>11.3} {:>9.2}%",
            ours - truth,
            alloc.total() as f64 / alloc.true_total().max(1.0),
            figures.jni.rooted_share() * 100.0
        );
    }
}

/// Prints one JVM's figures as a table, and returns the targets it missed (and what could not
/// be measured).
fn report(major: u32, figures: &JvmFigures) -> Vec<String> {
    let mut failures = figures.other_failures.clone();
    println!(
        "JDK {major}: {:.0} short threads started in the {} windows; true n at 0 counts every \
         entry, contended or not",
        figures.threads_started, LOCK_KINDS[0].profile
    );
    println!(
        "  {:<8} {:<6} {:>9} {:>9} {:>12} {:>11} {:>7} {:>12} {:>9}",
        "lock",
        "thresh",
        "profiles",
        "window s",
        "profiled ms",
        "true ms",
        "ratio",
        "profiled n",
        "true n"
    );
    for (kind, per_threshold) in LOCK_KINDS.iter().zip(&figures.lock) {
        for (threshold, lock) in THRESHOLDS.iter().zip(per_threshold) {
            let Some(lock) = lock else {
                println!("  {:<8} {:<6} (no profiles)", kind.key, threshold.key);
                continue;
            };
            println!(
                "  {:<8} {:<6} {:>9} {:>9.1} {:>12.1} {:>11.1} {:>7.3} {:>12} {:>9.0}",
                kind.key,
                threshold.key,
                format!("{} {}", lock.profiles, kind.profile),
                lock.seconds,
                lock.delay_ns as f64 / 1e6,
                lock.true_ns / 1e6,
                lock.ratio(),
                lock.contentions,
                lock.true_waits
            );
            // The profiles' delay is the waits' time off the CPU; the threads' measure adds
            // the little they ran meanwhile (HotSpot's spin before parking, the way in and out
            // of the park): within the target on long-lived threads (lock.rs: 0.4%).
            if (lock.ratio() - 1.0).abs() > LOCK_TIME_ERROR {
                failures.push(format!(
                    "JDK {major}: {:.1} ms of {} delay under {} over {:.1} s with {}, its \
                     threads waited {:.1} ms in waits of {} or more (ratio {:.3}, target \
                     1 +- {LOCK_TIME_ERROR})",
                    lock.delay_ns as f64 / 1e6,
                    kind.profile,
                    kind.method,
                    lock.seconds,
                    threshold.flag,
                    lock.true_ns / 1e6,
                    threshold.key,
                    lock.ratio()
                ));
            }
        }
    }

    let alloc = &figures.alloc;
    println!(
        "  {:<8} {:>12} {:>9} {:>14} {:>11} {:>8}   ({} alloc profiles over {:.1} s; {:.1} MB \
         in the JVM's profiles)",
        "alloc",
        "profiled MB",
        "true MB",
        "profiled share",
        "true share",
        "diff",
        alloc.profiles,
        alloc.seconds,
        alloc.all_bytes as f64 / 1e6
    );
    let share_pp = if major >= EVEN_SAMPLER_FROM_JDK {
        ALLOC_SHARE_PP
    } else {
        JDK11_SHARE_PP
    };
    let total_error = ALLOC_TOTAL_ERROR;
    for (index, site) in ALLOC_SITES.iter().enumerate() {
        let (ours, truth) = alloc.shares(index);
        println!(
            "  {:<8} {:>12.1} {:>9.1} {:>13.2}% {:>10.2}% {:>+6.2}pp",
            site.key,
            alloc.bytes[index] as f64 / 1e6,
            alloc.true_bytes[index] / 1e6,
            ours,
            truth,
            ours - truth
        );
        if (ours - truth).abs() > share_pp {
            failures.push(format!(
                "JDK {major}: {} holds {ours:.2}% of the profiled bytes, {truth:.2}% of what \
                 the sites allocated (at most {share_pp} pp apart)",
                site.key
            ));
        }
    }
    let total_ratio = alloc.total() as f64 / alloc.true_total().max(1.0);
    println!(
        "  {:<8} {:>12.1} {:>9.1}   ratio {total_ratio:.3}",
        "total",
        alloc.total() as f64 / 1e6,
        alloc.true_total() / 1e6
    );
    if (total_ratio - 1.0).abs() > total_error {
        failures.push(format!(
            "JDK {major}: {:.1} MB profiled under the two sites over {:.1} s, they allocated \
             {:.1} MB (ratio {total_ratio:.3}, 1 +- {total_error})",
            alloc.total() as f64 / 1e6,
            alloc.seconds,
            alloc.true_total() / 1e6
        ));
    }

    let jni = &figures.jni;
    println!(
        "  JNI: {} CPU samples of {SHORT_THREAD}* threads in the call ({} cpu profiles), \
         {:.2}% rooted at {ROOT}; {} samples in the call on other or unnamed threads; \
         layout pushed {:?} ms after sampling began, {} whole intervals left out (begun within an interval of it)",
        jni.samples,
        jni.profiles,
        jni.rooted_share() * 100.0,
        jni.other_threads,
        jni.ready_after_ms,
        jni.before_ready
    );
    let mut unrooted: Vec<(&String, &usize)> = jni.unrooted.iter().collect();
    unrooted.sort_by_key(|(_, samples)| std::cmp::Reverse(**samples));
    for (innermost, samples) in unrooted.iter().take(3) {
        println!("    {samples} not rooted: {innermost}");
    }
    if !jni.unrooted_at.is_empty() {
        let mut at: Vec<_> = jni.unrooted_at.iter().collect();
        at.sort();
        let at: Vec<String> = at
            .iter()
            .map(|((run, interval), samples)| format!("{run}#{interval}: {samples}"))
            .collect();
        println!(
            "    not rooted by run and whole interval: {}",
            at.join(", ")
        );
    }
    if jni.samples < JNI_MIN_SAMPLES {
        failures.push(format!(
            "JDK {major}: {} CPU samples of the short threads in the JNI call, at least \
             {JNI_MIN_SAMPLES} expected",
            jni.samples
        ));
    } else if jni.rooted_share() < JNI_ROOTED {
        failures.push(format!(
            "JDK {major}: {:.2}% of {} CPU samples of the short threads in the JNI call reach \
             {ROOT} (target >= {:.0}%)",
            jni.rooted_share() * 100.0,
            jni.samples,
            JNI_ROOTED * 100.0
        ));
    }
    failures
}
