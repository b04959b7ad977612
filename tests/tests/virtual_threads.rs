//! Virtual threads, end to end, on every JDK that has them (21, 25, 26, 27 at once, and 25
//! once more with ZGC, whose references are coloured pointers):
//! `VirtualDeep` runs 40 virtual threads that recurse 120 frames deep and then loop doing CPU
//! work and parking for a millisecond, so each is continued with most of its frames still
//! frozen in its stack chunk; 28 take the `alpha` path, 12 the disjoint `beta` path, and each
//! counts its rounds of work. Profiled at 99 Hz, each JVM's virtual threads' CPU samples must:
//!
//! - reach `java.lang.VirtualThread.run`, their root by default (`virtual_threads =
//!   "logical"`), in >= 99% of the samples, through all 120 recursive frames;
//! - never mix the two paths (a frame of another virtual thread named in a sample);
//! - split between the paths as the threads' own rounds do, within the samples' noise;
//! - with `virtual_thread_ids = true`, carry their virtual thread's id (>= 99%, but where JDK 21
//!   runs them as the carrier), no id on both paths, none on a platform thread's sample.
//!
//! Then once more on one JDK with `virtual_threads = "carrier"`: the stacks go on under
//! `[carrier <thread name>]` down to the carrier's `ForkJoinWorkerThread.run`. And on JDK 21,
//! where a virtual thread waiting inside `synchronized` pins its carrier (`VirtualPinned`): its
//! off-CPU, lock and allocation samples carry its whole stack too.
//!
//! Waits of unmounted virtual threads (`VirtualWaits`: 24 virtual threads 40 frames deep
//! sleeping, contending for a `ReentrantLock` and for a monitor; JDK 21, 25, 26, 27, and 25 with a
//! virtual thread per round): per site, the `block` and `mutex` profiles' wait time within 15%
//! of the workload's own measure, >= 99% of the stacks whole, and off-CPU samples labelled
//! `state="unmounted"` and with their virtual thread's id.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use profiler_daemon::pprof::proto;
use profiler_tests::*;

/// The JDKs with virtual threads.
const MAJORS: [u32; 4] = [21, 25, 26, 27];
/// The recursion below each virtual thread's work.
const DEPTH: usize = 120;
/// The JVMs' whole run, and the daemon's window within it.
const JVM_SECONDS: u64 = 36;
const DAEMON_SECONDS: u64 = 20;
const FREQUENCY: u32 = 99;

const ROOTED_TARGET: f64 = 0.99;
/// The split is held to the samples' noise: three standard deviations of a share estimated
/// from that many samples (about 6 pp for 500), plus 1 pp for what the workload's own count
/// leaves out (its rounds include the time before and after the daemon's window).
fn split_tolerance_pp(share: f64, samples: i64) -> f64 {
    300.0 * (share * (1.0 - share) / samples.max(1) as f64).sqrt() + 1.0
}

/// What a JVM's virtual threads' CPU samples show.
#[derive(Debug, Default)]
struct Figures {
    /// Samples in either path's frames.
    samples: i64,
    /// Of those, ending at `VirtualThread.run` with every recursive frame.
    rooted_whole: i64,
    /// Of those, with frames of both paths.
    mixed: i64,
    /// In `alphaWork` and in `betaWork`.
    alpha_work: i64,
    beta_work: i64,
    /// Of the virtual threads' samples, those run as their carrier, and of the others, those
    /// without a `virtual_thread_id` label.
    as_carrier: i64,
    unlabelled: i64,
    /// The paths each labelled virtual thread was seen in (bit 0 alpha, bit 1 beta): a virtual
    /// thread takes one path, so two mean a sample named after another virtual thread.
    paths_by_id: HashMap<i64, u8>,
    /// Samples of threads that are no carriers labelled with a virtual thread.
    labelled_elsewhere: i64,
}

fn figures(profiles: &[(std::path::PathBuf, proto::Profile)]) -> Figures {
    let mut figures = Figures::default();
    for (_, profile) in profiles {
        for sample in &profile.sample {
            let names = sample_base_names(profile, sample);
            let has = |method: &str| names.iter().any(|n| n == &format!("VirtualDeep.{method}"));
            let steps = |method: &str| {
                names
                    .iter()
                    .filter(|n| *n == &format!("VirtualDeep.{method}"))
                    .count()
            };
            let (alpha, beta) = (has("alphaStep"), has("betaStep"));
            let id = num_label(profile, sample, "virtual_thread_id");
            if !alpha && !beta {
                let carrier = label(profile, sample, "thread_name")
                    .is_some_and(|name| name.starts_with("ForkJoi"));
                if id.is_some() && !carrier {
                    figures.labelled_elsewhere += count(sample);
                }
                continue;
            }
            let count = count(sample);
            figures.samples += count;
            if runs_as_carrier(&names) {
                figures.as_carrier += count;
            } else if id.is_none() {
                figures.unlabelled += count;
            }
            if let Some(id) = id {
                *figures.paths_by_id.entry(id).or_default() |=
                    u8::from(alpha) | u8::from(beta) << 1;
            }
            if alpha && beta {
                figures.mixed += count;
            }
            let whole = steps("alphaStep").max(steps("betaStep")) > DEPTH;
            if whole && names.last().map(String::as_str) == Some("java.lang.VirtualThread.run") {
                figures.rooted_whole += count;
            }
            if has("alphaWork") {
                figures.alpha_work += count;
            }
            if has("betaWork") {
                figures.beta_work += count;
            }
        }
    }
    figures
}

/// Whether a virtual thread's stack runs as its carrier there: JDK 21 schedules and cancels a
/// timed park's wake-up with the carrier current (`switchToCarrierThread`), so
/// `Thread.currentThread()` is the carrier, and so is the thread a sample there is labelled with.
fn runs_as_carrier(names: &[String]) -> bool {
    names.iter().any(|n| {
        n == "java.lang.VirtualThread.scheduleUnpark" || n == "java.lang.VirtualThread.cancel"
    })
}

/// The alpha threads' share of the rounds, from the workload's results file.
fn true_alpha_share(results: &Path) -> f64 {
    let text = std::fs::read_to_string(results).expect("the workload wrote its rounds");
    let words: Vec<&str> = text.split_whitespace().collect();
    let number = |at: usize| -> f64 { words[at].parse().expect("a count") };
    let (alpha, beta) = (number(2), number(4));
    alpha / (alpha + beta)
}

struct RunningJvm {
    major: u32,
    /// The JVM's flags, to tell the runs apart.
    flags: &'static [&'static str],
    workload: Workload,
    results: std::path::PathBuf,
}

fn start_jvms(
    classes: &Path,
    dir: &Path,
    runs: &[(u32, &'static [&'static str])],
) -> Vec<RunningJvm> {
    runs.iter()
        .enumerate()
        .map(|(index, &(major, flags))| {
            let results = dir.join(format!("rounds-{index}"));
            let (seconds, depth) = (JVM_SECONDS.to_string(), DEPTH.to_string());
            let args = [
                seconds.as_str(),
                depth.as_str(),
                results.to_str().expect("utf-8"),
            ];
            let workload = start_java_with_args(&jdk(major), classes, "VirtualDeep", flags, &args)
                .expect("JVM starts");
            RunningJvm {
                major,
                flags,
                workload,
                results,
            }
        })
        .collect()
}

#[test]
fn mounted_virtual_threads_are_walked_whole_to_their_root() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["VirtualDeep.java"], dir.path()).expect("javac");
    let majors = majors_from_env("PROFILER_VIRTUAL_THREAD_JDKS", &MAJORS);
    let mut runs: Vec<(u32, &'static [&'static str])> =
        majors.iter().map(|&major| (major, &[][..])).collect();
    if majors.contains(&25) {
        runs.push((25, &["-XX:+UseZGC"]));
    }
    let mut jvms = start_jvms(&classes, dir.path(), &runs);
    let out = dir.path().join("profiles");
    let config = config_file(dir.path(), "virtual_thread_ids = true\n");
    let run = DaemonRun::new()
        .pids(jvms.iter().map(|jvm| jvm.workload.pid()))
        .frequency(FREQUENCY)
        .duration(DAEMON_SECONDS)
        .no_stream()
        .config(&config)
        .output(&out)
        .run(Duration::from_secs(DAEMON_SECONDS + 60));

    let mut failures = Vec::new();
    for jvm in &mut jvms {
        let pid = jvm.workload.pid();
        let status = jvm.workload.0.wait().expect("the JVM ends");
        let label = format!("JDK {} {:?}", jvm.major, jvm.flags);
        assert!(status.success(), "{label}: the workload failed");
        let profiles: Vec<_> = profiles_of(&out, pid)
            .expect("profiles")
            .into_iter()
            .filter(|(path, _)| file_name(path).starts_with("cpu-"))
            .collect();
        let figures = figures(&profiles);
        let truth = true_alpha_share(&jvm.results);
        let worked = (figures.alpha_work + figures.beta_work).max(1) as f64;
        let ours = figures.alpha_work as f64 / worked;
        let rooted = figures.rooted_whole as f64 / figures.samples.max(1) as f64;
        let own = (figures.samples - figures.as_carrier).max(1) as f64;
        let labelled = 1.0 - figures.unlabelled as f64 / own;
        let ids_on_both_paths = figures.paths_by_id.values().filter(|p| **p == 3).count();
        eprintln!(
            "{label}: {:.2}% labelled with a virtual_thread_id ({} run as the carrier), {} ids ({ids_on_both_paths} on both paths), {} samples of other threads labelled",
            100.0 * labelled,
            figures.as_carrier,
            figures.paths_by_id.len(),
            figures.labelled_elsewhere,
        );
        // Every virtual thread but the few the window's samples miss.
        if labelled < ROOTED_TARGET
            || figures.paths_by_id.len() < 30
            || ids_on_both_paths != 0
            || figures.labelled_elsewhere != 0
        {
            failures.push(format!(
                "{label}: virtual_thread_id on {:.2}% of the samples, {} ids, {ids_on_both_paths} on both paths, {} samples of other threads labelled",
                100.0 * labelled,
                figures.paths_by_id.len(),
                figures.labelled_elsewhere
            ));
        }
        eprintln!(
            "{label}: {} virtual-thread samples, {:.2}% rooted at VirtualThread.run through all {DEPTH} frames, {} mixing the paths; alpha share {:.1}% (workload: {:.1}%)",
            figures.samples,
            100.0 * rooted,
            figures.mixed,
            100.0 * ours,
            100.0 * truth,
        );
        if figures.samples < 100 {
            failures.push(format!(
                "{label}: {} virtual-thread samples (under 100)",
                figures.samples
            ));
            continue;
        }
        if rooted < ROOTED_TARGET {
            failures.push(format!(
                "{label}: {:.2}% rooted whole (target {}%)",
                100.0 * rooted,
                100.0 * ROOTED_TARGET
            ));
        }
        if figures.mixed != 0 {
            failures.push(format!(
                "{label}: {} samples name frames of both paths",
                figures.mixed
            ));
        }
        let tolerance = split_tolerance_pp(truth, figures.alpha_work + figures.beta_work);
        if (100.0 * (ours - truth)).abs() > tolerance {
            failures.push(format!(
                "{label}: alpha share {:.1}% against the workload's {:.1}% (noise: {tolerance:.1} pp)",
                100.0 * ours,
                100.0 * truth
            ));
        }
    }
    assert!(
        run.log.contains("frozen_frames_unread="),
        "the interval log counts walks stopped at frozen frames"
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn carrier_mode_keeps_the_carrier_under_a_named_frame() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["VirtualDeep.java"], dir.path()).expect("javac");
    let major = major_of_the_day(&MAJORS);
    let mut jvms = start_jvms(&classes, dir.path(), &[(major, &[])]);
    let jvm = &mut jvms[0];
    let config = config_file(dir.path(), "virtual_threads = \"carrier\"\n");
    let out = dir.path().join("profiles");
    DaemonRun::new()
        .pid(jvm.workload.pid())
        .frequency(FREQUENCY)
        .duration(8)
        .no_stream()
        .config(&config)
        .output(&out)
        .run(Duration::from_secs(60));
    let profiles: Vec<_> = profiles_of(&out, jvm.workload.pid())
        .expect("profiles")
        .into_iter()
        .filter(|(path, _)| file_name(path).starts_with("cpu-"))
        .collect();
    let _ = jvm.workload.0.kill();
    let (mut samples, mut carried) = (0, 0);
    for (_, profile) in &profiles {
        for sample in &profile.sample {
            let names = sample_base_names(profile, sample);
            if !names.iter().any(|n| n == "VirtualDeep.alphaWork") {
                continue;
            }
            samples += count(sample);
            let Some(run) = names
                .iter()
                .position(|n| n == "java.lang.VirtualThread.run")
            else {
                continue;
            };
            let marker = names.get(run + 1).map(String::as_str).unwrap_or("");
            let carrier_root = names
                .iter()
                .any(|n| n == "java.util.concurrent.ForkJoinWorkerThread.run");
            // The carrier's native name: cut to 15 bytes before JDK 26, abbreviated after.
            let carrier_named = ["[carrier ForkJoinPool-", "[carrier ForkJoi..rker-"]
                .iter()
                .any(|form| marker.starts_with(form));
            if carrier_named && carrier_root {
                carried += count(sample);
            }
        }
    }
    eprintln!("JDK {major}: {carried} of {samples} alphaWork samples under [carrier ...] down to ForkJoinWorkerThread.run");
    assert!(samples >= 50, "JDK {major}: {samples} alphaWork samples");
    assert!(
        carried as f64 >= ROOTED_TARGET * samples as f64,
        "JDK {major}: {carried} of {samples} samples under a carrier frame"
    );
}

#[test]
fn pinned_waits_and_allocations_carry_the_virtual_threads_whole_stack() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["VirtualPinned.java"], dir.path()).expect("javac");
    let jvm = start_java_with_args(&jdk(21), &classes, "VirtualPinned", &[], &["20"])
        .expect("JVM starts");
    let out = dir.path().join("profiles");
    let config = config_file(dir.path(), "virtual_thread_ids = true\n");
    DaemonRun::new()
        .pid(jvm.pid())
        .frequency(FREQUENCY)
        .duration(14)
        .no_stream()
        .config(&config)
        .output(&out)
        .arg("--off-cpu")
        .arg("--lock=1ms")
        .arg("--alloc")
        .run(Duration::from_secs(80));
    let profiles = profiles_of(&out, jvm.pid()).expect("profiles");
    let mut failures = Vec::new();
    // Per profile kind, the site its samples are counted at.
    for (kind, site) in [
        ("offcpu-", "VirtualPinned.pinnedSite"),
        ("mutex-", "VirtualPinned.pinnedSite"),
        ("alloc-", "VirtualPinned.allocSite"),
    ] {
        let (mut samples, mut rooted, mut with_id) = (0, 0, 0);
        for (_, profile) in profiles
            .iter()
            .filter(|(path, _)| file_name(path).starts_with(kind))
        {
            for sample in &profile.sample {
                let names = sample_base_names(profile, sample);
                if !names.iter().any(|n| n == site) {
                    continue;
                }
                samples += 1;
                let as_carrier = runs_as_carrier(&names);
                with_id += usize::from(
                    as_carrier || num_label(profile, sample, "virtual_thread_id").is_some(),
                );
                let depth = names
                    .iter()
                    .filter(|n| *n == "VirtualPinned.descend")
                    .count();
                let root = names.last().map(String::as_str);
                if depth > 60 && root == Some("java.lang.VirtualThread.run") {
                    rooted += 1;
                }
            }
        }
        eprintln!("JDK 21 {kind}: {rooted} of {samples} stacks at {site} rooted at VirtualThread.run through all 60 frames, {with_id} with a virtual_thread_id");
        if samples < 5
            || (rooted as f64) < ROOTED_TARGET * samples as f64
            || (with_id as f64) < ROOTED_TARGET * samples as f64
        {
            failures.push(format!(
                "{kind}: {rooted} of {samples} stacks at {site} whole, {with_id} labelled"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A daemon configuration file in `dir` holding `text`.
fn config_file(dir: &Path, text: &str) -> std::path::PathBuf {
    let config = dir.join("profiler.toml");
    std::fs::write(&config, text).expect("config written");
    config
}

fn file_name(path: &Path) -> &str {
    path.file_name().and_then(|n| n.to_str()).unwrap_or("")
}

/// Waits of virtual threads per site, against the workload's own measure (within 15%).
const WAIT_TOLERANCE: f64 = 0.15;

/// `VirtualWaits`' sites, the profile their waits go to, and the JDKs on which the virtual
/// thread unmounts there (JDK 21 pins its carrier on a monitor: that wait is the carrier's, seen
/// by the off-CPU program with the virtual thread's stack).
const WAIT_SITES: [(&str, &str); 3] = [
    ("sleepSite", "block-"),
    ("lockSite", "block-"),
    ("monitorSite", "mutex-"),
];

/// The workload's own wait time per site, in nanoseconds.
fn measured_waits(results: &Path) -> HashMap<String, f64> {
    let text = std::fs::read_to_string(results).expect("the workload wrote its waits");
    text.lines()
        .filter_map(|line| {
            let (site, nanos) = line.split_once(' ')?;
            Some((site.to_owned(), nanos.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn waits_of_unmounted_virtual_threads_are_profiled_per_site() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["VirtualWaits.java"], dir.path()).expect("javac");
    let majors = majors_from_env("PROFILER_VIRTUAL_THREAD_JDKS", &[21, 25, 26, 27]);
    // Each JDK with long-lived virtual threads, and JDK 25 once more with a virtual thread per
    // round (every wait among a virtual thread's first: sampled by its carrier's time).
    let mut runs: Vec<(u32, &str)> = majors.iter().map(|&major| (major, "")).collect();
    if majors.contains(&25) {
        runs.push((25, "per-task"));
    }
    let seconds = 12;
    let jvms: Vec<(String, Workload, std::path::PathBuf)> = runs
        .iter()
        .enumerate()
        .map(|(index, &(major, mode))| {
            let results = dir.path().join(format!("waits-{index}"));
            let seconds = seconds.to_string();
            let args = [seconds.as_str(), results.to_str().expect("utf-8"), mode];
            let workload = start_java_with_args(&jdk(major), &classes, "VirtualWaits", &[], &args)
                .expect("JVM starts");
            (format!("{major} {mode}"), workload, results)
        })
        .collect();
    let out = dir.path().join("profiles");
    // Labelled with their virtual threads' ids, every sampled wait of a virtual thread per task
    // is a stack of its own: room for them all.
    let config = config_file(
        dir.path(),
        "virtual_thread_ids = true\nstack_memory_mib = 1024\n",
    );
    // Longer than the workloads: every wait they measure ends while the daemon runs.
    let finished = DaemonRun::new()
        .pids(jvms.iter().map(|(_, workload, _)| workload.pid()))
        .frequency(FREQUENCY)
        .duration(seconds + 8)
        .no_stream()
        .config(&config)
        .output(&out)
        .arg("--off-cpu")
        .arg("--lock=0")
        .run(Duration::from_secs(seconds + 70));
    let mut failures = Vec::new();
    for (major, mut workload, results) in jvms {
        let pid = workload.pid();
        // The waits a JVM makes before the daemon has read it are not seen as its virtual
        // threads': how soon that was, for a ratio under target.
        if let Some((_, after_ms)) = finished.layout_pushed(pid) {
            println!("JDK {major}: layout pushed {after_ms} ms after sampling began");
        }
        assert!(
            workload.0.wait().expect("the JVM ends").success(),
            "JDK {major}: the workload failed"
        );
        let measured = measured_waits(&results);
        let profiles = profiles_of(&out, pid).expect("profiles");
        for (site, kind) in WAIT_SITES {
            let method = format!("VirtualWaits.{site}");
            let (mut waited_ns, mut samples, mut rooted) = (0i64, 0, 0);
            for (_, profile) in profiles
                .iter()
                .filter(|(path, _)| file_name(path).starts_with(kind))
            {
                for sample in &profile.sample {
                    let names = sample_base_names(profile, sample);
                    if !names.contains(&method) {
                        continue;
                    }
                    samples += 1;
                    waited_ns += sample.value.get(1).copied().unwrap_or(0);
                    let depth = names
                        .iter()
                        .filter(|n| *n == "VirtualWaits.descend")
                        .count();
                    if depth > 40
                        && names.last().map(String::as_str) == Some("java.lang.VirtualThread.run")
                    {
                        rooted += 1;
                    } else if samples - rooted <= 3 {
                        // Where the walk stopped: its innermost frames and its outermost.
                        let outer = names.len().saturating_sub(3);
                        eprintln!(
                            "JDK {major} {site}: not whole ({depth} descend frames): {:?} .. {:?}",
                            &names[..names.len().min(4)],
                            &names[outer..]
                        );
                    }
                }
            }
            let truth = measured.get(site).copied().unwrap_or(0.0);
            let ratio = waited_ns as f64 / truth.max(1.0);
            eprintln!(
                "JDK {major} {site}: {kind} {:.2} s, the workload's {:.2} s (ratio {ratio:.3}); {rooted} of {samples} stacks rooted at VirtualThread.run through all 40 frames",
                waited_ns as f64 / 1e9,
                truth / 1e9
            );
            if samples < 5 || (ratio - 1.0).abs() > WAIT_TOLERANCE {
                failures.push(format!(
                    "JDK {major} {site}: {kind} wait ratio {ratio:.3} over {samples} stacks"
                ));
            }
            if (rooted as f64) < ROOTED_TARGET * samples as f64 {
                failures.push(format!(
                    "JDK {major} {site}: {rooted} of {samples} stacks whole"
                ));
            }
        }
        // The off-CPU profile has them too, labelled as unmounted, and with the virtual
        // thread's id.
        let (mut unmounted, mut with_id) = (0, 0);
        for (_, profile) in profiles
            .iter()
            .filter(|(path, _)| file_name(path).starts_with("offcpu-"))
        {
            for sample in &profile.sample {
                if label(profile, sample, "state") == Some("unmounted") {
                    unmounted += 1;
                    with_id +=
                        usize::from(num_label(profile, sample, "virtual_thread_id").is_some());
                }
            }
        }
        eprintln!("JDK {major}: {with_id} of {unmounted} unmounted off-CPU stacks with a virtual_thread_id");
        if unmounted == 0 {
            failures.push(format!("JDK {major}: no off-CPU sample labelled unmounted"));
        }
        if (with_id as f64) < ROOTED_TARGET * unmounted as f64 {
            failures.push(format!(
                "JDK {major}: {with_id} of {unmounted} unmounted stacks with a virtual_thread_id"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The link-time address of `name` in the ELF file `library`.
fn symbol_address(library: &Path, name: &str) -> u64 {
    use object::{Object as _, ObjectSymbol as _};
    let bytes = std::fs::read(library).expect("libjvm read");
    let elf = object::File::parse(&*bytes).expect("libjvm parsed");
    elf.symbols()
        .find(|symbol| symbol.name() == Ok(name))
        .map(|symbol| symbol.address())
        .unwrap_or_else(|| panic!("{name} in {}", library.display()))
}

/// Where `library` is loaded in process `pid` (its first mapping's start, offset 0).
fn load_base(pid: u32, library: &Path) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("maps");
    let wanted = library.canonicalize().expect("libjvm path");
    maps.lines()
        .find(|line| line.ends_with(wanted.to_str().expect("utf-8")))
        .and_then(|line| u64::from_str_radix(line.split('-').next()?, 16).ok())
        .expect("libjvm mapped")
}

/// A JVM's statics are its owner's to write: one that names, as its unmounting function, an
/// address inside a real one (a breakpoint there would split an instruction of every JVM of that
/// JDK, whoever runs it) gets no unmount hook, and runs on unharmed.
#[test]
fn a_jvm_naming_a_false_unmounting_function_gets_no_hook() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["VirtualWaits.java"], dir.path()).expect("javac");
    let jdk = jdk(25);
    let results = dir.path().join("waits");
    let mut workload = start_java_with_args(
        &jdk,
        &classes,
        "VirtualWaits",
        &[],
        &["6", results.to_str().expect("utf-8")],
    )
    .expect("JVM starts");
    let pid = workload.pid();
    let library = jdk.libjvm();
    let base = load_base(pid, &library);
    let freeze = symbol_address(
        &library,
        "_Z6freezeI6ConfigIL8oop_kind0E12G1BarrierSetEEiP10JavaThreadPl",
    );
    let entry = symbol_address(&library, "_ZL12freeze_entry");
    {
        use std::os::unix::fs::FileExt as _;
        let memory = std::fs::OpenOptions::new()
            .write(true)
            .open(format!("/proc/{pid}/mem"))
            .expect("the JVM's memory");
        // Three bytes into the function: inside its first instructions.
        memory
            .write_all_at(&(base + freeze + 3).to_le_bytes(), base + entry)
            .expect("freeze_entry written");
    }
    let out = dir.path().join("profiles");
    let run = DaemonRun::new()
        .pid(pid)
        .frequency(FREQUENCY)
        .duration(6)
        .no_stream()
        .output(&out)
        .arg("--off-cpu")
        .run(Duration::from_secs(60));
    let status = workload.0.wait().expect("the JVM ends");
    assert!(status.success(), "the JVM failed: {status}");
    assert!(
        std::fs::read_to_string(&results).is_ok_and(|text| text.contains("sleepSite")),
        "the workload ran to its end"
    );
    assert!(
        run.log
            .contains("names an unmounting function its libjvm's .symtab does not have"),
        "the false function was refused:\n{}",
        run.log
    );
}
