//! Fake JVMs against the root daemon (SECURITY.md): processes of an unprivileged user that load a
//! real libjvm.so without starting a VM (tests/workloads/fake_jvm.c) and write, in their own
//! memory, what the daemon reads of a JVM. They must never change how another user's JVM is
//! profiled: its Java thread map entries, its layout, how soon its layout is pushed.

use std::io::BufRead as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use profiler_daemon::pprof::proto;
use profiler_tests::hostile::{
    allocation_event_symbols, unprivileged_user, AttackContext, HostileRun, Scenario, User,
};
use profiler_tests::*;

/// How long a fake JVM lives at most (the tests kill them sooner).
const FAKE_LIFETIME_SECS: &str = "120";
/// The JNI library's frameless leaf (gcc may name its clone `native_spin.constprop.0`).
const NATIVE_LEAF: &str = "native_spin";
/// The Java frames below the JNI library: found only through the thread's `JavaFrameAnchor`.
const JAVA_CALLERS: [&str; 2] = ["JniCallback.javaCaller", "JniCallback.main"];
/// How soon a JVM's layout must be pushed after its start, fake JVMs or not.
const LAYOUT_BOUND_MS: u64 = 1000;
/// The JVM tracker's period (profiler-daemon's hotspot/tracker.rs `TICK_PERIOD`).
const TRACKER_TICK_MS: u64 = 500;
/// Spin.java's Java methods: every name its frames may have.
const SPIN_METHODS: [&str; 3] = ["Spin.work", "Spin.lambda$main$0", "Spin.main"];

/// A fake JVM run by `user`: `fake_jvm LIBJVM SECONDS MODE ARGS...`, once it printed "ready".
fn start_fake(user: User, binary: &Path, libjvm: &Path, mode: &str, args: &[String]) -> Workload {
    let mut child = user
        .command(binary)
        .arg(libjvm)
        .arg(FAKE_LIFETIME_SECS)
        .arg(mode)
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .expect("the fake JVM starts");
    let stdout = child.stdout.take().expect("stdout");
    let fake = Workload(child);
    let mut line = String::new();
    std::io::BufReader::new(stdout)
        .read_line(&mut line)
        .expect("reads");
    assert_eq!(line.trim(), "ready", "fake_jvm {mode} set itself up");
    eprintln!("fake_jvm {mode}: pid {}", fake.pid());
    fake
}

/// A temporary directory every user can read and enter (the fakes run as another user).
fn readable_tempdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    dir
}

/// `since_process_start_ms` of the daemon's "JVM layout pushed" line for `pid`, if logged.
fn layout_pushed_ms(log: &str, pid: u32) -> Option<u64> {
    let pid_field = format!("pid={pid}");
    log.lines()
        .filter(|line| line.contains("JVM layout pushed"))
        .find(|line| line.split_whitespace().any(|word| word == pid_field))?
        .split_whitespace()
        .find_map(|word| word.strip_prefix("since_process_start_ms="))?
        .parse()
        .ok()
}

/// Waits until the daemon has pushed `pid`'s layout; returns its `since_process_start_ms`.
fn wait_for_layout(context: &AttackContext, pid: u32, timeout: Duration) -> u64 {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(ms) = layout_pushed_ms(&context.daemon_log(), pid) {
            return ms;
        }
        assert!(
            Instant::now() < deadline,
            "the daemon never pushed the layout of pid {pid}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Asserts the daemon exited cleanly after SIGTERM and no thread of it panicked.
#[track_caller]
fn assert_daemon_fine(run: &HostileRun) {
    assert!(run.exit.success(), "the daemon's exit: {}", run.exit);
    assert!(!run.log.contains("panicked"), "a daemon thread panicked");
}

/// tests/workloads/jni_callback.c without frame pointers and without unwind tables (no
/// `.eh_frame` rows, no `.debug_frame`): no walk gets from its frames to the Java frames below
/// them, so those are found only through the thread's `JAVA_THREADS` entry and its anchor.
fn frameless_jni_library(dir: &Path) -> PathBuf {
    compile_jni_callback(
        dir,
        &[
            "-O2",
            "-fomit-frame-pointer",
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
        ],
    )
}

/// Of `pid`'s samples in the library's leaf, in the profiles of `[from, to)`: how many, and how
/// many show the Java callers below the library.
fn java_callers_behind_native(
    dir: &Path,
    pid: u32,
    from: SystemTime,
    to: Option<SystemTime>,
) -> (i64, i64) {
    let nanos = |at: SystemTime| {
        at.duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_nanos() as i64
    };
    let (from, to) = (nanos(from), to.map_or(i64::MAX, nanos));
    let (mut samples, mut with_callers, mut shown) = (0, 0, 0);
    for (_, profile) in profiles_of(dir, pid).expect("profiles readable") {
        if profile.time_nanos < from || profile.time_nanos + profile.duration_nanos > to {
            continue;
        }
        for sample in &profile.sample {
            let names: Vec<String> = sample_frames(&profile, sample)
                .iter()
                .map(|frame| base_name(&frame.name).to_owned())
                .collect();
            if !names
                .first()
                .is_some_and(|leaf| leaf.starts_with(NATIVE_LEAF))
            {
                continue;
            }
            samples += count(sample);
            if JAVA_CALLERS
                .iter()
                .all(|caller| names.contains(&caller.to_string()))
            {
                with_callers += count(sample);
            } else if shown < 2 {
                shown += 1;
                eprintln!("pid {pid}: a native_spin sample without its Java callers: {names:?}");
            }
        }
    }
    (samples, with_callers)
}

/// The victims of the thread-map attack and the time windows their samples are counted in.
struct ThreadMapRun {
    victim: u32,
    before: (SystemTime, SystemTime),
    stolen: (SystemTime, SystemTime),
    late_victim: u32,
    after_fill: SystemTime,
}

/// A fake JVM lists a root JVM's tids as its own Java threads (the old daemon wrote its fake
/// `JavaThread*` over the victim's `JAVA_THREADS` entries), then another lists 65,536 made-up
/// tids (the old daemon filled the map, so a JVM started later got no entries). Both times the
/// victim, a JVM calling a JNI library that has neither frame pointers nor unwind tables, must
/// keep its Java frames below the library's: they are found only through its own entries.
#[test]
fn a_fake_jvm_cannot_steal_or_fill_another_users_java_thread_map_entries() {
    let started = Instant::now();
    let user = unprivileged_user();
    let jdk = jdk(17);
    let libjvm = jdk.libjvm();
    let dir = readable_tempdir();
    let fake_jvm = compile_c_with("fake_jvm.c", dir.path(), &["-O1", "-g", "-ldl"]).expect("gcc");
    let classes = compile_java(&["JniCallback.java"], dir.path()).expect("javac");
    let property = format!("-Djni.lib={}", frameless_jni_library(dir.path()).display());
    let scenario = Scenario::new(Duration::from_secs(1))
        .whole_host()
        .interval_secs(1)
        .daemon_args(&["--frequency", "499"]);
    let (run, (measured, mut running)) = scenario.run(|context: &AttackContext| {
        let start_victim = || {
            let victim = start_java(&jdk, &classes, "JniCallback", &[&property]).expect("JVM");
            wait_for_layout(context, victim.pid(), Duration::from_secs(20));
            victim
        };

        // Unattacked first: the victim's own entries give its Java frames.
        let victim = start_victim();
        let clean_from = SystemTime::now();
        std::thread::sleep(Duration::from_secs(4));
        let tids: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", victim.pid()))
            .expect("the victim's tasks")
            .map(|task| {
                task.expect("a task")
                    .file_name()
                    .into_string()
                    .expect("tid")
            })
            .collect();
        let clean_to = SystemTime::now();
        let thief = start_fake(user, &fake_jvm, &libjvm, "threads", &tids);
        wait_for_layout(context, thief.pid(), Duration::from_secs(20));
        let stolen_from = SystemTime::now();
        std::thread::sleep(Duration::from_secs(4));
        let stolen_to = SystemTime::now();
        drop(thief);

        // A fake JVM listing 65,536 tids no process has, then a JVM started after it.
        let filler = start_fake(user, &fake_jvm, &libjvm, "fill", &[]);
        wait_for_layout(context, filler.pid(), Duration::from_secs(20));
        let late_victim = start_victim();
        let after_fill = SystemTime::now();
        std::thread::sleep(Duration::from_secs(4));
        let measured = ThreadMapRun {
            victim: victim.pid(),
            before: (clean_from, clean_to),
            stolen: (stolen_from, stolen_to),
            late_victim: late_victim.pid(),
            after_fill,
        };
        (measured, [victim, filler, late_victim])
    });
    assert_daemon_fine(&run);
    for process in &mut running {
        let status = process.0.try_wait().expect("try_wait");
        assert!(status.is_none(), "pid {} died: {status:?}", process.pid());
    }
    let profiles = run.output.join("profiles");
    let share = |(samples, with_callers): (i64, i64)| with_callers as f64 / samples.max(1) as f64;
    let windows = [
        (
            "before any fake JVM",
            java_callers_behind_native(
                &profiles,
                measured.victim,
                measured.before.0,
                Some(measured.before.1),
            ),
        ),
        (
            "while a fake JVM lists its tids",
            java_callers_behind_native(
                &profiles,
                measured.victim,
                measured.stolen.0,
                Some(measured.stolen.1),
            ),
        ),
        (
            "started after a fake JVM listed 65,536 tids",
            java_callers_behind_native(&profiles, measured.late_victim, measured.after_fill, None),
        ),
    ];
    for (window, tally) in windows {
        println!(
            "{window}: Java callers in {} of {} native_spin samples ({:.1}%)",
            tally.1,
            tally.0,
            100.0 * share(tally)
        );
    }
    for (window, tally) in windows {
        // A few hundred on an idle machine; fewer when other work shares the CPUs.
        assert!(tally.0 >= 50, "{window}: only {} samples", tally.0);
        assert!(
            share(tally) >= 0.95,
            "{window}: the Java frames behind the JNI library are in only {} of {} samples",
            tally.1,
            tally.0
        );
    }
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}

/// The distinct names of `pid`'s Java frames whose class is Spin.
fn spin_frames(profiles: &Path, pid: u32) -> std::collections::BTreeSet<String> {
    frame_names(&profiles_of(profiles, pid).expect("profiles readable"))
        .iter()
        .map(|name| base_name(name).to_owned())
        .filter(|name| name.starts_with("Spin."))
        .collect()
}

/// Asserts Spin's profiles name its hot method and no frame by a name Spin.java lacks.
#[track_caller]
fn assert_spin_named_right(profiles: &Path, pid: u32) {
    let names = spin_frames(profiles, pid);
    println!("Spin's frames: {names:?}");
    let wrong: Vec<&String> = names
        .iter()
        .filter(|name| !SPIN_METHODS.contains(&name.as_str()))
        .collect();
    assert!(wrong.is_empty(), "Spin's frames named {wrong:?}");
    assert!(names.contains("Spin.work"), "Spin.work never named");
}

/// A fake JVM of another user maps the very libjvm.so of JDK 17 (same file, same build-id) but
/// points its VMStructs at a table whose ConstMethod name and signature indexes are swapped, and
/// is inspected first. A real JDK 17 JVM of root inspected after it must have its own layout: its
/// frames named by their methods (`Spin.work`), never by their signatures (`Spin.(J)J`), as when
/// layouts were cached by build-id. Both are named with `--pid`, the fake first, so that no
/// other JDK 17 JVM of the host is inspected before it.
#[test]
fn a_fake_libjvm_with_a_real_build_id_does_not_poison_other_jvms_layouts() {
    let started = Instant::now();
    let user = unprivileged_user();
    let jdk = jdk(17);
    let dir = readable_tempdir();
    let fake_jvm = compile_c_with("fake_jvm.c", dir.path(), &["-O1", "-g", "-ldl"]).expect("gcc");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let poisoner = start_fake(user, &fake_jvm, &jdk.libjvm(), "poison", &[]);
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
    let (poisoner_pid, jvm_pid) = (poisoner.pid().to_string(), jvm.pid().to_string());
    let scenario = Scenario::new(Duration::from_secs(6)).daemon_args(&[
        "--pid",
        &poisoner_pid,
        "--pid",
        &jvm_pid,
        "--frequency",
        "99",
    ]);
    let (run, ()) = scenario.run(|context: &AttackContext| {
        wait_for_layout(context, poisoner.pid(), Duration::from_secs(20));
        wait_for_layout(context, jvm.pid(), Duration::from_secs(20));
    });
    assert_daemon_fine(&run);
    let pushed_at = |pid: &str| {
        run.log
            .find(&format!("JVM layout pushed pid={pid} "))
            .expect("layout pushed")
    };
    assert!(
        pushed_at(&poisoner_pid) < pushed_at(&jvm_pid),
        "the fake JVM was inspected first"
    );
    assert_spin_named_right(&run.output.join("profiles"), jvm.pid());
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}

/// Ten fake JVMs of another user whose VMStructs struct table has no end and a new 255-byte
/// name in every entry: the old daemon read each to its cap at every tick (a few hundred
/// milliseconds each), so a real JVM started after them waited seconds for its layout. It must
/// be pushed within a second of the JVM's start (or a tick more than without the fakes), the
/// daemon unharmed (memory, SIGTERM, the bystander) beside a run without them.
#[test]
fn fake_jvms_do_not_delay_a_real_jvms_layout() {
    const FAKES: usize = 10;
    let started = Instant::now();
    let user = unprivileged_user();
    let jdk = jdk(17);
    let libjvm = jdk.libjvm();
    let dir = readable_tempdir();
    let fake_jvm = compile_c_with("fake_jvm.c", dir.path(), &["-O1", "-g", "-ldl"]).expect("gcc");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let scenario = Scenario::new(Duration::from_secs(10)).whole_host();
    // The real JVM, started once the fakes (if any) are there: its layout's delay, its pid, and
    // what must live until the daemon has stopped.
    let real_jvm = |context: &AttackContext, fakes: usize| {
        let running: Vec<Workload> = (0..fakes)
            .map(|_| start_fake(user, &fake_jvm, &libjvm, "hostile", &[]))
            .collect();
        if fakes > 0 {
            // Found by the tracker's young checks (200 ms, 500 ms, 1 s after their exec).
            std::thread::sleep(Duration::from_millis(1500));
        }
        let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
        let ms = wait_for_layout(context, jvm.pid(), Duration::from_secs(30));
        (ms, jvm.pid(), (running, jvm))
    };
    let (baseline, (baseline_ms, ..)) = scenario.run(|context| real_jvm(context, 0));
    let (attacked, (attacked_ms, pid, _running)) = scenario.run(|context| real_jvm(context, FAKES));
    println!(
        "the real JVM's layout pushed {attacked_ms} ms after its start beside {FAKES} fake JVMs \
         ({baseline_ms} ms without them)"
    );
    attacked.assert_unharmed(&baseline);
    // A layout is pushed at a tracker tick once the VM has initialised: on a loaded machine even
    // the run without fakes may take a tick more than usual, and that much more is allowed.
    let bound = LAYOUT_BOUND_MS.max(baseline_ms + TRACKER_TICK_MS);
    assert!(
        attacked_ms < bound,
        "the real JVM's layout was pushed {attacked_ms} ms after its start ({baseline_ms} ms \
         without the fake JVMs; bound {bound} ms)"
    );
    assert_spin_named_right(&attacked.output.join("profiles"), pid);
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}

/// A fake JVM of another user calls libjvm's allocation events itself, with garbage: classes
/// that are not there (null, unmapped, random bytes) and threads that are not either. The daemon
/// (`--alloc`, whole host) hooks that file, JDK 17's, which a real JVM of root runs too. The
/// daemon must stay unharmed; the fake's allocation samples must show the unreadable-class
/// marker, never a class name; the real JVM must keep its Java names.
#[test]
fn garbage_given_to_the_allocation_events_names_no_class_and_harms_nothing() {
    let started = Instant::now();
    let user = unprivileged_user();
    let jdk = jdk(17);
    let libjvm = jdk.libjvm();
    let dir = readable_tempdir();
    let fake_jvm = compile_c_with("fake_jvm.c", dir.path(), &["-O1", "-g", "-ldl"]).expect("gcc");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let (in_new_tlab, outside_tlab) = allocation_event_symbols(&libjvm);
    let events = [format!("{in_new_tlab:x}"), format!("{outside_tlab:x}")];
    let scenario = Scenario::new(Duration::from_secs(10))
        .whole_host()
        .daemon_args(&["--alloc"]);
    let (run, (fake_pid, jvm_pid, _running)) = scenario.run(|context: &AttackContext| {
        let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");
        let fake = start_fake(user, &fake_jvm, &libjvm, "alloc", &events);
        wait_for_layout(context, fake.pid(), Duration::from_secs(20));
        wait_for_layout(context, jvm.pid(), Duration::from_secs(20));
        (fake.pid(), jvm.pid(), (fake, jvm))
    });
    assert_daemon_fine(&run);
    let profiles = run.output.join("profiles");
    let alloc_profiles: Vec<proto::Profile> = profiles_of(&profiles, fake_pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("alloc-"))
        })
        .map(|(_, profile)| profile)
        .collect();
    let classes_shown: std::collections::BTreeMap<String, usize> = alloc_profiles
        .iter()
        .flat_map(|profile| {
            profile.sample.iter().filter_map(move |sample| {
                sample_frames(profile, sample)
                    .first()
                    .map(|leaf| leaf.name.clone())
            })
        })
        .fold(Default::default(), |mut counts, name| {
            *counts.entry(name).or_default() += 1;
            counts
        });
    println!("the fake's allocation samples, by innermost frame: {classes_shown:?}");
    assert!(
        !classes_shown.is_empty(),
        "the fake's calls were never sampled (were the hooks attached?): {}",
        run.log
            .lines()
            .filter(|line| line.contains("allocation"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let named: Vec<&String> = classes_shown
        .keys()
        .filter(|name| !name.starts_with("[unknown allocated class: "))
        .collect();
    assert!(named.is_empty(), "garbage classes were named: {named:?}");
    assert_spin_named_right(&profiles, jvm_pid);
    println!("took {:.1} s", started.elapsed().as_secs_f64());
}
