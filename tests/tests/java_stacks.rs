//! Java stacks end to end on JDK 11, 17, 21 and 25 with default flags: CPU shares, complete
//! stacks to the thread's root, deep recursion, inlined frames, lines, native code under Java.

use std::collections::HashMap;
use std::time::Duration;

use profiler_tests::*;

/// Line range [first, last] of a method in the workload's source, by its declaration.
fn method_lines(source: &str, declaration: &str) -> (i64, i64) {
    let lines: Vec<&str> = source.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.contains(declaration))
        .expect("declaration in source");
    let end = (start..lines.len())
        .find(|&i| lines[i] == "    }")
        .expect("method end");
    (start as i64 + 1, end as i64 + 1)
}

/// Samples of `profiles` by leaf kind: for each sample whose frames' base names `leaf_of` gives
/// a kind, its count, and how much of it has the frames `whole` asks for. The first few
/// samples that do not are printed, after `what`.
fn tally_by_leaf(
    profiles: &[(std::path::PathBuf, profiler_daemon::pprof::proto::Profile)],
    leaf_of: impl Fn(&[String]) -> Option<&'static str>,
    whole: impl Fn(&[String]) -> bool,
    what: &str,
) -> HashMap<&'static str, (i64, i64)> {
    let mut tallies: HashMap<&str, (i64, i64)> = HashMap::new();
    let mut shown = 0;
    for (_, profile) in profiles {
        for sample in &profile.sample {
            let names = sample_base_names(profile, sample);
            let Some(leaf) = leaf_of(&names) else {
                continue;
            };
            let tally = tallies.entry(leaf).or_default();
            tally.0 += count(sample);
            if whole(&names) {
                tally.1 += count(sample);
            } else if shown < 3 {
                shown += 1;
                eprintln!("{what}: {names:?}");
            }
        }
    }
    tallies
}

#[test]
fn java_stacks_on_every_jdk() {
    let runs: Vec<JavaStacksRun> = jdks_with_8()
        .into_iter()
        .map(|jdk| JavaStacksRun { jdk, options: &[] })
        .collect();
    java_stacks_of(&runs);
}

/// The same workload and checks on the JVM options users' services run with, which change
/// what the walker and the name reader meet: object headers (compact on JDK 25, uncompressed
/// pointers), every collector, one compiler tier only, the interpreter only, one code heap
/// instead of three, a small code cache.
#[test]
fn java_stacks_under_jvm_options() {
    let jdk = |major: u32| {
        jdks()
            .into_iter()
            .find(|jdk| jdk.major == major)
            .unwrap_or_else(|| panic!("JDK {major}"))
    };
    let option_sets: &[(u32, &[&str])] = &[
        (25, &["-XX:+UseCompactObjectHeaders"]),
        // (No class data sharing archive matches these: its warning would go to stdout.)
        (
            25,
            &[
                "-XX:-UseCompressedOops",
                "-XX:-UseCompressedClassPointers",
                "-Xlog:cds=off",
            ],
        ),
        (25, &["-XX:+UseShenandoahGC"]),
        (21, &["-XX:+UseZGC", "-XX:+ZGenerational"]),
        (25, &["-XX:-TieredCompilation"]),
        (17, &["-XX:+UseParallelGC"]),
        (17, &["-XX:TieredStopAtLevel=1", "-XX:-SegmentedCodeCache"]),
        (25, &["-Xint"]),
        (21, &["-XX:ReservedCodeCacheSize=16m", "-Xss16m"]),
    ];
    let runs: Vec<JavaStacksRun> = option_sets
        .iter()
        .map(|(major, options)| JavaStacksRun {
            jdk: jdk(*major),
            options,
        })
        .collect();
    java_stacks_of(&runs);
}

/// One JVM of [`java_stacks_of`]: its JDK and the options it starts with.
struct JavaStacksRun {
    jdk: Jdk,
    options: &'static [&'static str],
}

/// Runs `Workloads` on each of `runs`, two JVMs at a time under one daemon, and checks their
/// stacks ([`check_java_stacks`]).
fn java_stacks_of(runs: &[JavaStacksRun]) {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let source = std::fs::read_to_string(
        workloads_dir()
            .parent()
            .expect("tests dir")
            .join("java/Workloads.java"),
    )
    .expect("source");
    let deep_leaf_lines = method_lines(&source, "static long deepLeaf");
    let mut report = Vec::new();

    // Two JVMs at a time under one daemon (each gets half the CPUs: about 1,900 split samples
    // each, against the 500 asked for): the group's longest wait is the JIT's warm-up and the
    // sampling window, paid once per pair.
    for (index, pair) in runs.chunks(2).enumerate() {
        let jvms: Vec<_> = pair
            .iter()
            .map(|run| {
                start_java(&run.jdk, &classes, "Workloads", run.options).unwrap_or_else(|e| {
                    panic!("JDK {} {:?}: JVM starts: {e:#}", run.jdk.major, run.options)
                })
            })
            .collect();
        // Let the JIT compile the hot paths, as in a long-running service.
        std::thread::sleep(Duration::from_secs(4));
        let out = dir.path().join(format!("profiles-{index}"));
        let finished = DaemonRun::new()
            .pids(jvms.iter().map(|jvm| jvm.pid()))
            .frequency(997)
            .interval(15)
            .duration(8)
            .output(&out)
            .run(Duration::from_secs(90));
        let unwind_ends: Vec<String> = finished
            .log
            .lines()
            .filter_map(|l| l.split("unwind_ends=").nth(1))
            .filter_map(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
            .collect();
        let pids: Vec<u32> = jvms.iter().map(|jvm| jvm.pid()).collect();
        drop(jvms);
        for (run, pid) in pair.iter().zip(pids) {
            let profiles = profiles_of(&out, pid).expect("profiles readable");
            report.push(check_java_stacks(
                run,
                &profiles,
                deep_leaf_lines,
                &unwind_ends,
            ));
        }
    }
    eprintln!("--- summary ---\n{}", report.join("\n"));
}

/// The assertions of [`java_stacks_on_every_jdk`] on one JVM's profiles; its report line.
/// `unwind_ends` are the daemon's counts of how walks ended, per interval (of every JVM it
/// sampled).
fn check_java_stacks(
    run: &JavaStacksRun,
    profiles: &[(std::path::PathBuf, profiler_daemon::pprof::proto::Profile)],
    deep_leaf_lines: (i64, i64),
    unwind_ends: &[String],
) -> String {
    let jvm = if run.options.is_empty() {
        format!("JDK {}", run.jdk.major)
    } else {
        format!("JDK {} {}", run.jdk.major, run.options.join(" "))
    };
    assert!(!profiles.is_empty(), "no profile for {jvm}");
    // Java functions: `pkg.Class.method` (with its kind), the signature in the system name,
    // the source file with its package path.
    let (_, first) = &profiles[0];
    let deep_leaf = first
        .function
        .iter()
        .find(|f| base_name(&first.string_table[f.name as usize]) == "Workloads.deepLeaf")
        .expect("a deepLeaf function");
    assert_eq!(
        first.string_table[deep_leaf.system_name as usize],
        "Workloads.deepLeaf(J)J"
    );
    assert_eq!(
        first.string_table[deep_leaf.filename as usize],
        "Workloads.java"
    );

    // Per thread: samples, and samples whose stack contains each function.
    let mut thread_samples: HashMap<String, i64> = HashMap::new();
    let mut contains: HashMap<(String, String), i64> = HashMap::new();
    let (mut rooted, mut java_thread_samples) = (0i64, 0i64);
    let mut unrooted: HashMap<String, i64> = HashMap::new();
    let (mut deep_leaf, mut deep_complete) = (0i64, 0i64);
    let (mut inline_samples, mut with_inlined) = (0i64, 0i64);
    let (mut zip_samples, mut zip_native_under_java) = (0i64, 0i64);
    let (mut leaf_line_checked, mut leaf_line_right, mut leaf_line_unknown) = (0i64, 0i64, 0i64);
    for (_, profile) in profiles {
        for sample in &profile.sample {
            let n = count(sample);
            let thread = label(profile, sample, "thread_name")
                .unwrap_or_default()
                .to_owned();
            let frames = sample_frames(profile, sample);
            *thread_samples.entry(thread.clone()).or_default() += n;
            for frame in &frames {
                *contains
                    .entry((thread.clone(), base_name(&frame.name).to_owned()))
                    .or_default() += 0;
            }
            let mut seen = std::collections::HashSet::new();
            for frame in &frames {
                if seen.insert(base_name(&frame.name).to_owned()) {
                    *contains
                        .entry((thread.clone(), base_name(&frame.name).to_owned()))
                        .or_default() += n;
                }
            }
            if !thread.ends_with("-worker") {
                continue;
            }
            java_thread_samples += n;
            let reaches_root = frames
                .iter()
                .any(|f| base_name(&f.name) == "java.lang.Thread.run");
            if reaches_root {
                rooted += n;
            } else {
                // By their innermost and two outermost frames: where the walks stopped.
                let names: Vec<&str> = frames.iter().map(|f| f.name.as_str()).collect();
                let outer = names.len().saturating_sub(2);
                let key = format!(
                    "{thread}: {} .. {}",
                    names.first().copied().unwrap_or(""),
                    names[outer..].join(" < ")
                );
                *unrooted.entry(key).or_default() += n;
            }
            match thread.as_str() {
                "deep-worker"
                    if frames
                        .first()
                        .is_some_and(|f| base_name(&f.name) == "Workloads.deepLeaf") =>
                {
                    deep_leaf += n;
                    let depth = frames
                        .iter()
                        .filter(|f| base_name(&f.name) == "Workloads.recurse")
                        .count();
                    if depth == 201 && reaches_root {
                        deep_complete += n;
                    }
                    leaf_line_checked += n;
                    let line = frames[0].line;
                    if line == 0 {
                        leaf_line_unknown += n;
                    } else if line >= deep_leaf_lines.0 && line <= deep_leaf_lines.1 {
                        leaf_line_right += n;
                    }
                }
                "inline-worker" => {
                    inline_samples += n;
                    if frames
                        .iter()
                        .any(|f| f.name.ends_with("_[i]") && f.name.contains("Workloads.inline"))
                    {
                        with_inlined += n;
                    }
                }
                "zip-worker" => {
                    zip_samples += n;
                    let first_java = frames.iter().position(|f| {
                        f.name.starts_with("java.") || f.name.starts_with("Workloads.")
                    });
                    if first_java.is_some_and(|i| {
                        i > 0
                            && frames[..i].iter().any(|f| {
                                f.name.contains("libz")
                                    || f.name.contains("deflate")
                                    || f.name.contains("crc32")
                                    || f.name.contains("adler")
                            })
                    }) && reaches_root
                    {
                        zip_native_under_java += n;
                    }
                }
                _ => {}
            }
        }
    }

    // The truth is 60/30/10 between the three methods: shares among the samples in any of
    // them (the driver loop's own few samples belong to none).
    let in_split = |f: &str| {
        contains
            .get(&("split-worker".to_owned(), format!("Workloads.{f}")))
            .copied()
            .unwrap_or(0)
    };
    let split_total = in_split("splitA") + in_split("splitB") + in_split("splitC");
    let share = |f: &str| in_split(f) as f64 / split_total.max(1) as f64;
    let (a, b, c) = (share("splitA"), share("splitB"), share("splitC"));
    let error = ((a - 0.6).abs()).max((b - 0.3).abs()).max((c - 0.1).abs());
    let root_reach = rooted as f64 / java_thread_samples.max(1) as f64;
    let line = format!(
            "{jvm}: split {:.1}/{:.1}/{:.1}% over {split_total} samples (max error {:.1} pp); root reach {:.1}% of {java_thread_samples}; \
             200-deep complete {deep_complete}/{deep_leaf}; inlined frames in {with_inlined}/{inline_samples}; \
             native zip under Java {zip_native_under_java}/{zip_samples}; deepLeaf line right {leaf_line_right}/{leaf_line_checked} (unknown {leaf_line_unknown}); unwind ends {}",
            a * 100.0, b * 100.0, c * 100.0, error * 100.0, root_reach * 100.0, unwind_ends.join(" | ")
        );
    eprintln!("{line}");

    for name in ["split-worker", "deep-worker", "inline-worker", "zip-worker"] {
        assert!(
            thread_samples.get(name).copied().unwrap_or(0) > 50,
            "{jvm}: thread {name} missing or barely sampled: {thread_samples:?}",
        );
    }
    assert!(split_total > 500, "{jvm}: too few split samples",);
    assert!(
        error <= 0.03,
        "{jvm}: split {a:.3}/{b:.3}/{c:.3} off by more than 3 pp",
    );
    let mut unrooted: Vec<(String, i64)> = unrooted.into_iter().collect();
    unrooted.sort_by_key(|(_, n)| -n);
    unrooted.truncate(6);
    assert!(
        root_reach >= 0.95,
        "{jvm}: only {:.1}% of Java thread samples reach Thread.run; the others most often: {unrooted:#?}",
        root_reach * 100.0
    );
    assert!(
        deep_leaf > 50 && deep_complete as f64 >= 0.95 * deep_leaf as f64,
        "{jvm}: 200-deep stacks incomplete: {deep_complete}/{deep_leaf}",
    );
    // The interpreter inlines nothing.
    let inlined_wanted = if run.options.contains(&"-Xint") {
        0.0
    } else {
        0.5
    };
    assert!(
        with_inlined as f64 >= inlined_wanted * inline_samples as f64,
        "{jvm}: inlined frames missing: {with_inlined}/{inline_samples}",
    );
    assert!(
        zip_native_under_java as f64 >= 0.5 * zip_samples as f64,
        "{jvm}: native zip frames under Java: {zip_native_under_java}/{zip_samples}",
    );
    assert!(
        leaf_line_checked - leaf_line_right - leaf_line_unknown <= leaf_line_checked / 20,
        "{jvm}: deepLeaf lines: {leaf_line_right} of {leaf_line_checked} in \
             {deep_leaf_lines:?}, {leaf_line_unknown} unknown, the rest wrong",
    );
    // C2 puts a safepoint in a counted loop only where it strip-mines loops: from JDK 10, and
    // with the collectors that ask for it (G1, Shenandoah, ZGC), not with the parallel or
    // serial ones. Elsewhere a pc inside deepLeaf's loop has no debug information, and its
    // line is unknown (as in HotSpot's own stack walks).
    let no_loop_safepoints = run.jdk.major <= 8
        || run
            .options
            .iter()
            .any(|o| *o == "-XX:+UseParallelGC" || *o == "-XX:+UseSerialGC");
    let known_wanted = if no_loop_safepoints { 0.0 } else { 0.95 };
    assert!(
        leaf_line_right as f64 >= known_wanted * leaf_line_checked as f64,
        "{jvm}: deepLeaf lines {leaf_line_right}/{leaf_line_checked} in {deep_leaf_lines:?}",
    );
    line
}

#[test]
fn class_churn_and_deoptimization_crash_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Churn.java"], dir.path()).expect("javac");
    let mut report = Vec::new();
    // Every JDK at once, one daemon for all (the time of one run, not of one per JDK).
    let mut jvms: Vec<(Jdk, Workload)> = jdks()
        .into_iter()
        .map(|jdk| {
            let jvm = start_java(&jdk, &classes, "Churn", &[]).expect("JVM starts");
            (jdk, jvm)
        })
        .collect();
    let out = dir.path().join("churn");
    DaemonRun::new()
        .pids(jvms.iter().map(|(_, jvm)| jvm.pid()))
        .frequency(499)
        .interval(4)
        .duration(8)
        .output(&out)
        .run(Duration::from_secs(60));
    for (jdk, jvm) in &mut jvms {
        assert!(
            jvm.0.try_wait().expect("JVM status").is_none(),
            "JDK {}: the JVM died under profiling",
            jdk.major
        );

        let profiles = profiles_of(&out, jvm.pid()).expect("profiles readable");
        let (mut total, mut unknown, mut churn, mut deopt) = (0i64, 0i64, 0i64, 0i64);
        // Samples with an unnamed Java frame, by their first marker (the reason says which read
        // failed).
        let mut markers = std::collections::BTreeMap::new();
        // Frames where generated code ran used to be `[]` (a freed stub's name read as empty).
        let bad_names: Vec<String> = profiles
            .iter()
            .flat_map(|(_, profile)| profiler_tests::frame_checks::bad_frame_names(profile))
            .collect();
        for (_, profile) in &profiles {
            for sample in &profile.sample {
                let n = count(sample);
                total += n;
                match label(profile, sample, "thread_name") {
                    Some("churn-worker") => churn += n,
                    Some("deopt-worker") => deopt += n,
                    _ => {}
                }
                if let Some(marker) = sample_frames(profile, sample).iter().find(|f| {
                    f.name.contains("[unknown java") || f.name.contains("[unknown compiled")
                }) {
                    unknown += n;
                    *markers.entry(marker.name.clone()).or_insert(0i64) += n;
                }
            }
        }
        let line = format!("JDK {}: {total} samples, churn-worker {churn}, deopt-worker {deopt}, with an unnamed Java frame {unknown} {markers:?}, bad frame names {}", jdk.major, bad_names.len());
        eprintln!("{line}");
        report.push(line);
        assert!(
            bad_names.is_empty(),
            "JDK {}: frame names no profile may show: {:#?}",
            jdk.major,
            &bad_names[..bad_names.len().min(10)]
        );
        assert!(
            churn > 100 && deopt > 100,
            "JDK {}: workers not sampled",
            jdk.major
        );
        // A GC every few hundred milliseconds unloads the generated classes, some before their
        // samples are read: those frames must show as unknown (never misnamed, never a crash).
        // The daemon drains every 10 ms while it sees names perish, reads new frames on a
        // thread of their own, and reads a frame read too late again every 25 ms (a new class
        // often holds the same method at the same address). Six JVMs churning at once on a
        // debug build: 0 unknown in 4 runs (0-5.2% while the reads waited behind profile
        // writing, 0-4.7% without the retries; 11-20% when failures were cached for good).
        // The JVMTI sidecar is what names them all.
        assert!(
            (unknown as f64) < 0.05 * total as f64,
            "JDK {}: {unknown} of {total} samples have unnamed Java frames",
            jdk.major
        );
    }
    eprintln!("--- summary ---\n{}", report.join("\n"));
}

/// Java -> a JNI library without frame pointers -> Java (JDK 17): the library's own frames
/// appear between the Java frames above and below them, where the walk used to jump from the
/// library to the thread's `JavaFrameAnchor` and lose them.
#[test]
fn jni_library_frames_without_frame_pointers_sit_between_java_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["JniCallback.java"], dir.path()).expect("javac");
    let library = compile_jni_callback(dir.path(), &["-O2", "-g", "-fomit-frame-pointer"]);
    let jdk = jdks()
        .into_iter()
        .find(|jdk| jdk.major == 17)
        .expect("JDK 17");
    let property = format!("-Djni.lib={}", library.display());
    let jvm = start_java(&jdk, &classes, "JniCallback", &[&property]).expect("JVM starts");
    std::thread::sleep(Duration::from_secs(3));
    let out = dir.path().join("profiles");
    DaemonRun::new()
        .pid(jvm.pid())
        .frequency(499)
        .interval(3)
        .duration(9)
        .output(&out)
        .run(Duration::from_secs(90));
    // The first interval's first samples come before libjvm's table is built (about half a
    // second in a debug build): the steady state is measured.
    let mut profiles = profiles_of(&out, jvm.pid()).expect("profiles readable");
    profiles.sort_by_key(|(_, profile)| profile.time_nanos);
    assert!(profiles.len() >= 3, "{} profiles", profiles.len());
    profiles.remove(0);

    // Per leaf (the library's spin, the Java callback): samples, and those whose stack has the
    // library's frames and, below them, the Java caller.
    let tallies = tally_by_leaf(
        &profiles,
        |names| {
            ["native_spin", "JniCallback.javaCallback"]
                .into_iter()
                .find(|leaf| names.first().is_some_and(|name| name == leaf))
        },
        |names| {
            let position = |wanted: &str| names.iter().position(|name| name == wanted);
            match (
                position("native_middle"),
                position("Java_JniCallback_nativeOuter"),
                position("JniCallback.javaCaller"),
                position("JniCallback.main"),
            ) {
                (Some(middle), Some(outer), Some(caller), Some(main)) => {
                    middle < outer && outer < caller && caller < main
                }
                _ => false,
            }
        },
        "a stack without the library's frames in place",
    );
    for leaf in ["native_spin", "JniCallback.javaCallback"] {
        let (samples, whole) = tallies.get(leaf).copied().unwrap_or_default();
        eprintln!("{leaf}: {whole} of {samples} samples with the library's frames between Java's");
        assert!(samples > 200, "{leaf}: too few samples ({samples})");
        assert!(
            whole as f64 >= 0.95 * samples as f64,
            "{leaf}: only {whole} of {samples} samples have the library's frames in place"
        );
    }
}

/// C1's runtime stubs sampled on top (`slow_subtype_check` pushes registers and builds no
/// frame; `counter_overflow` builds an rbp frame while it saves every register; neither
/// records a frame-complete offset) on JDK 17 and the newest JDK, whose type-check stub spills
/// more: each such sample goes on to the Java method that called the stub and down to the
/// thread's root. The walk used to take rbp, a compiled caller's general register there, as a
/// frame pointer: most of these samples jumped to `JavaCalls::call_helper`, their Java frames
/// silently gone.
#[test]
fn c1_runtime_stubs_on_top_return_to_their_java_caller() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["C1Stubs.java"], dir.path()).expect("javac");
    let all = jdks();
    let newest = all.iter().map(|jdk| jdk.major).max().expect("a JDK");
    for jdk in all
        .into_iter()
        .filter(|jdk| jdk.major == 17 || jdk.major == newest)
    {
        let jvm = start_java(&jdk, &classes, "C1Stubs", &["-XX:TieredStopAtLevel=3"])
            .expect("JVM starts");
        // Past the first compilations, and libjvm's unwind table built.
        std::thread::sleep(Duration::from_secs(2));
        let out = dir.path().join(format!("profiles-{}", jdk.major));
        DaemonRun::new()
            .pid(jvm.pid())
            .frequency(499)
            .interval(4)
            .duration(8)
            .output(&out)
            .run(Duration::from_secs(90));
        let profiles = profiles_of(&out, jvm.pid()).expect("profiles readable");

        // Per stub: samples with it on top, and those whose next frame is a Java method of the
        // workload and whose stack reaches the thread's root.
        let tallies = tally_by_leaf(
            &profiles,
            |names| {
                // The stub's frame ("[counter_overflow Runtime1 stub]" on JDK 17), not the VM
                // function it calls.
                ["slow_subtype_check", "counter_overflow"]
                    .into_iter()
                    .find(|stub| {
                        names
                            .first()
                            .is_some_and(|leaf| leaf.starts_with('[') && leaf.contains(stub))
                    })
            },
            |names| {
                names
                    .get(1)
                    .is_some_and(|caller| caller.starts_with("C1Stubs."))
                    && names.iter().any(|name| name == "java.lang.Thread.run")
            },
            &format!("JDK {}: a stub whose caller is lost", jdk.major),
        );
        let (mut samples, mut whole) = (0, 0);
        for (stub, (on_top, with_caller)) in &tallies {
            eprintln!(
                "JDK {}: {stub} on top in {on_top} samples, {with_caller} with its Java caller and root",
                jdk.major
            );
            samples += on_top;
            whole += with_caller;
        }
        let type_checks = tallies.get("slow_subtype_check").map_or(0, |t| t.0);
        assert!(
            type_checks >= 100,
            "JDK {}: too few samples in slow_subtype_check ({type_checks})",
            jdk.major
        );
        assert!(
            whole as f64 >= 0.95 * samples as f64,
            "JDK {}: only {whole} of {samples} samples in C1's runtime stubs keep their Java caller",
            jdk.major
        );
    }
}

/// A JVM running before the daemon starts, profiled with every kind of profile on (whose
/// programs take the verifier most of a second to load): its first samples already have their
/// Java frames. Sampling used to start before the other programs loaded and before the JVM's
/// layout was read, and for that while (1.2 s here) every sample of compiled code was one
/// unnamed native frame: 59% of the worker threads' samples of a 3-second run were rooted.
#[test]
fn samples_have_java_frames_from_the_daemons_first_moment() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Workloads.java"], dir.path()).expect("javac");
    let jdk = jdks()
        .into_iter()
        .find(|jdk| jdk.major == 17)
        .expect("JDK 17");
    let jvm = start_java(&jdk, &classes, "Workloads", &[]).expect("JVM starts");
    std::thread::sleep(Duration::from_secs(4));
    let out = dir.path().join("profiles");
    DaemonRun::new()
        .pid(jvm.pid())
        .frequency(997)
        .interval(15)
        .duration(3)
        .output(&out)
        .arg("--off-cpu")
        .arg("--lock")
        .arg("--alloc")
        .run(Duration::from_secs(60));
    let profiles = profiles_of(&out, jvm.pid()).expect("profiles readable");
    let (mut worker_samples, mut rooted) = (0i64, 0i64);
    let mut shown = 0;
    for (path, profile) in &profiles {
        let cpu_profile = path
            .file_name()
            .and_then(|name| name.to_str())
            .is_some_and(|name| name.starts_with("cpu-"));
        if !cpu_profile {
            continue;
        }
        for sample in &profile.sample {
            let thread = label(profile, sample, "thread_name").unwrap_or_default();
            if !thread.ends_with("-worker") {
                continue;
            }
            let n = count(sample);
            worker_samples += n;
            let names = sample_base_names(profile, sample);
            if names.iter().any(|name| name == "java.lang.Thread.run") {
                rooted += n;
            } else if shown < 5 {
                shown += 1;
                eprintln!("{thread}: {names:?}");
            }
        }
    }
    let share = rooted as f64 / worker_samples.max(1) as f64;
    eprintln!(
        "{rooted} of {worker_samples} worker samples rooted at Thread.run ({:.2}%)",
        share * 100.0
    );
    assert!(worker_samples > 2000, "too few samples: {worker_samples}");
    assert!(
        share >= 0.97,
        "only {:.2}% of the worker threads' samples reach Thread.run",
        share * 100.0
    );
}

/// A JVM started while the daemon profiles the whole host: its layout is read within a
/// fraction of a second of its start, so that even a short-lived JVM's samples have their Java
/// frames. The tracker used to look at new processes twice a second only, and a new JVM's
/// first 0.8 s of samples walked its code as native code.
#[test]
fn a_jvm_started_under_the_daemon_has_java_frames_from_its_first_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks()
        .into_iter()
        .find(|jdk| jdk.major == 17)
        .expect("JDK 17");
    let out = dir.path().join("profiles");
    let daemon = DaemonRun::new()
        .frequency(499)
        .interval(60)
        .output(&out)
        .start(dir.path());
    daemon
        .wait_for_log("sampling", Duration::from_secs(30))
        .expect("the daemon samples");
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    std::thread::sleep(Duration::from_secs(2));
    let pid = jvm.pid();
    drop(jvm);
    std::thread::sleep(Duration::from_secs(1));
    daemon.terminate();
    let (status, _) = daemon.wait(Duration::from_secs(30)).expect("daemon exits");
    assert!(status.success(), "{status}");

    let profiles = profiles_of(&out, pid).expect("profiles readable");
    let (mut worker, mut with_java) = (0i64, 0i64);
    for (_, profile) in &profiles {
        for sample in &profile.sample {
            if label(profile, sample, "thread_name") != Some("spin-worker") {
                continue;
            }
            let n = count(sample);
            worker += n;
            let names = sample_base_names(profile, sample);
            if names.iter().any(|name| name == "Spin.work") {
                with_java += n;
            }
        }
    }
    let share = with_java as f64 / worker.max(1) as f64;
    eprintln!(
        "{with_java} of {worker} spin-worker samples in Spin.work ({:.1}%)",
        share * 100.0
    );
    assert!(worker > 300, "too few samples: {worker}");
    assert!(
        share >= 0.95,
        "only {:.1}% of the new JVM's worker samples have their Java frames",
        share * 100.0
    );
}
