//! The kernel matrix: the daemon on the kernels users' nodes run, Debian's own kernel of each of
//! its last three releases (5.10, 6.1, 6.12; `cargo xtask test` installs them under
//! `.tools/kernels/`, see xtask/src/debian_kernels.rs), each booted under QEMU.
//!
//! The guest: QEMU's TCG (KVM's device exists on these machines, but a nested guest hangs), a
//! busybox initramfs that loads the kernel's own virtio and 9p modules, mounts this machine's
//! filesystem read-only over 9p and a results directory read-write, and runs a script in a
//! chroot of it. The script runs, at once, `profiler-daemon check`, the test daemon with every
//! profile kind against a JVM running a workload per kind (CPU split, locks, allocations; JDK
//! 17, tests/java/KernelMatrix.java), and a second one against a native program built without
//! frame pointers.
//!
//! Per kernel: every program loads, with the object the kernel's features call for (compat on
//! 5.10, the default one from 6.1); the Java split has its Java root; the frameless native leaf
//! keeps its callers; off-CPU, lock and allocation profiles hold their workloads' sites. Each
//! row also prints the BPF time per run of the sampling programs (`bpf_stats_enabled`; emulated
//! CPUs, so only comparable between rows).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};
use profiler_daemon::pprof::proto;
use profiler_tests::{
    base_name, compile_c_with, compile_java, count, daemon_binary, jdks, profiles_of,
    sample_frames, skip_or_fail,
};

/// How long a guest may take, boot to power-off, before it counts as hung (rows take 70 to
/// 105 s; a hung one is run once more, so the bound is also what a hang costs the run).
const GUEST_TIMEOUT: Duration = Duration::from_secs(180);

#[test]
fn kernel_5_10_compat_object() {
    matrix_row("5.10", "compat");
}

#[test]
fn kernel_6_1_default_object() {
    matrix_row("6.1", "default");
}

#[test]
fn kernel_6_12_default_object() {
    matrix_row("6.12", "default");
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// A kernel installed by xtask: its image, release and guest modules.
struct Kernel {
    vmlinuz: PathBuf,
    release: String,
    modules: Vec<PathBuf>,
}

fn installed_kernel(series: &str) -> Option<Kernel> {
    let dir = workspace_root().join(".tools/kernels").join(series);
    if !dir.join(".installed").exists() {
        return None;
    }
    let release = std::fs::read_to_string(dir.join("release"))
        .ok()?
        .trim()
        .to_owned();
    let mut modules: Vec<PathBuf> = std::fs::read_dir(dir.join("modules"))
        .ok()?
        .filter_map(|entry| Some(entry.ok()?.path()))
        .collect();
    modules.sort();
    Some(Kernel {
        vmlinuz: dir.join("vmlinuz"),
        release,
        modules,
    })
}

fn matrix_row(series: &str, expected_object: &str) {
    let Some(kernel) = installed_kernel(series) else {
        skip_or_fail(
            "kernel-matrix",
            &format!("kernel {series} is not installed under .tools/kernels (cargo xtask test installs it)"),
        );
        return;
    };
    for tool in ["qemu-system-x86_64", "cpio"] {
        if Command::new("sh")
            .arg("-c")
            .arg(format!("command -v {tool}"))
            .stdout(Stdio::null())
            .status()
            .map_or(true, |s| !s.success())
        {
            skip_or_fail("kernel-matrix", &format!("{tool} is missing"));
            return;
        }
    }
    // Kept when the test fails, for the guest's logs; removed at its end otherwise.
    let work = tempfile::tempdir().expect("a temporary directory").keep();
    eprintln!("kernel {series}: guest files in {}", work.display());
    // The guest mounts it as its /mnt: everything it runs and writes is here.
    let results = work.join("results");
    std::fs::create_dir_all(&results).expect("the results directory");
    prepare_guest(&results).expect("the guest's script and workloads");
    let initramfs = build_initramfs(&work, &kernel).expect("the initramfs");
    let read = |name: &str| std::fs::read_to_string(results.join(name)).unwrap_or_default();
    let started = Instant::now();
    let mut console = String::new();
    for attempt in 1..=2 {
        let booted = boot(&kernel, &initramfs, &results);
        // Emulated timings vary widely: once (5.10, in a full test run) a daemon that had
        // sampled its whole duration had not written its first interval four minutes later,
        // where the same row otherwise takes about a minute in all. The first attempt's log is
        // printed, and the row runs once more.
        let timed_out = matches!(&booted, Err(err) if err.is::<GuestTimedOut>());
        if attempt == 1 && timed_out {
            eprintln!(
                "kernel {series}: the guest ran past {GUEST_TIMEOUT:?}; its daemon's log:\n{}\nonce more",
                tail(&read("daemon.log"), 20)
            );
        }
        console = match booted {
            Ok(console) => console,
            Err(_) if attempt == 1 && timed_out => String::new(),
            Err(err) => panic!("kernel {series}: {err}. Guest log:\n{}", read("guest.log")),
        };
        // Under emulation HotSpot now and then crashes in its own JIT code before any profiling
        // touches it (seen once: SIGSEGV at a C1 method's entry, 6 s after start). The daemon
        // changes a JVM's execution only through its allocation hooks: a JVM that crashed
        // before they were attached is the emulator's, and the row runs once more.
        let jvm_crashed = read("jvm.out").contains("A fatal error has been detected");
        let hooked = read("daemon.log").contains("events hooked");
        // Emulated kernels also crash now and then while booting, before our script has
        // started (seen once: an int3 oops patching `sched_clock_cpu` on 6.12, 1.3 s in).
        let boot_crashed = read("guest.log").is_empty() && console.contains("Kernel panic");
        // Or when the kernel patches its own code with the int3 protocol (static keys switched
        // on as the daemon attaches its tracepoints) and another emulated CPU runs the int3
        // after the patch's handler is gone (seen once: in `__schedule` on 6.12, 53 s in). A
        // BPF program cannot write kernel code: the oops is the emulator's.
        let patch_crashed = console.contains("Oops: int3");
        if attempt == 2 || !(timed_out || boot_crashed || patch_crashed || (jvm_crashed && !hooked))
        {
            break;
        }
        // (A timeout was said above, with the daemon's log.)
        if boot_crashed {
            eprintln!("kernel {series}: the emulated kernel crashed while booting; once more");
        } else if patch_crashed {
            eprintln!(
                "kernel {series}: the emulated kernel hit an int3 in its own patched code; once more"
            );
        } else if jvm_crashed && !hooked {
            eprintln!("kernel {series}: the JVM crashed before any hook was attached; once more");
        }
        for entry in std::fs::read_dir(&results).expect("the results directory") {
            let path = entry.expect("an entry").path();
            let keep = ["guest.sh", "classes", "native_split"]
                .iter()
                .any(|name| path.file_name().is_some_and(|n| n == *name));
            if !keep {
                let _ = std::fs::remove_dir_all(&path).or_else(|_| std::fs::remove_file(&path));
            }
        }
    }
    let took = started.elapsed();
    eprintln!(
        "kernel {series} ({}): guest ran {:.0} s",
        kernel.release,
        took.as_secs_f64()
    );
    let guest_log = read("guest.log");
    eprintln!("kernel {series}: the guest's steps\n{guest_log}");
    assert!(
        console.contains("MATRIX-EXIT 0"),
        "kernel {series}: the guest did not finish its script. Console:\n{}\nGuest log:\n{guest_log}",
        tail(&console, 40)
    );
    assert_eq!(
        read("release").trim(),
        kernel.release,
        "kernel {series}: the guest ran another kernel"
    );

    // Every program loads, with the object this kernel calls for.
    let check = read("check.log");
    eprintln!("kernel {series}: profiler-daemon check\n{check}");
    assert_eq!(
        read("check.rc").trim(),
        "0",
        "kernel {series}: check failed:\n{check}"
    );
    assert!(
        check.contains(&format!("BPF object: {expected_object} ")),
        "kernel {series}: expected the {expected_object} object:\n{check}"
    );
    // Every program of the object: sampling, off-CPU (2), process events (2), the libjvm hooks
    // (thread start and end, code frees, two allocation events, the sampler's), virtual
    // threads (3), and the kernel's symbol lookup where the kernel has `bpf_snprintf` (5.13).
    let loaded = check.lines().filter(|l| l.starts_with("  ok ")).count();
    let kernel_lookup = series != "5.10";
    assert_eq!(
        loaded,
        14 + usize::from(kernel_lookup),
        "kernel {series}: programs loaded:\n{check}"
    );
    if !kernel_lookup {
        assert!(
            check.contains("  without  kernel_names: kernel frames are named from /proc/kallsyms"),
            "kernel {series}: the kernel_names program's fallback not reported:\n{check}"
        );
    }

    let daemon_log = read("daemon.log");
    assert_eq!(
        read("daemon.rc").trim(),
        "0",
        "kernel {series}: the daemon failed:\n{}",
        tail(&daemon_log, 40)
    );
    let profiles = results.join("profiles");
    let pid = |name: &str| -> u32 {
        read(&format!("{name}.pid"))
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("kernel {series}: no pid for {name}:\n{guest_log}"))
    };

    // CPU: the Java split, rooted at the thread's entry.
    let java = kind_samples(&profiles, pid("jvm"), "cpu");
    let split: Vec<&Vec<String>> = java
        .iter()
        .filter(|frames| frames.iter().any(|f| f.starts_with("Workloads.split")))
        .collect();
    let rooted = with_frame(&split, "java.lang.Thread.run");
    eprintln!(
        "kernel {series}: Java split {} samples, {:.1}% rooted at Thread.run",
        split.len(),
        100.0 * rooted as f64 / split.len().max(1) as f64,
    );
    // Few samples: the guest's two emulated CPUs run the JVM's threads and a native program.
    assert!(
        split.len() >= 50,
        "kernel {series}: {} Java split samples ({} CPU samples of the JVM); the daemon's log:\n{}",
        split.len(),
        java.len(),
        tail(&daemon_log, 40)
    );
    assert!(
        rooted as f64 >= 0.95 * split.len() as f64,
        "kernel {series}: only {rooted} of {} Java split samples reach Thread.run",
        split.len()
    );
    // splitA's share of the split: 60%, within three standard deviations and 10 points (the
    // emulated CPU's timer interrupts land where its translated blocks end).
    let share_a = with_frame(&split, "Workloads.splitA") as f64 / split.len() as f64;
    let sigma = (0.6 * 0.4 / split.len() as f64).sqrt();
    eprintln!(
        "kernel {series}: splitA {:.1}% of the split (60%)",
        100.0 * share_a
    );
    assert!(
        (share_a - 0.6).abs() <= 3.0 * sigma + 0.1,
        "kernel {series}: splitA has {:.1}% of {} split samples, not ~60%",
        100.0 * share_a,
        split.len()
    );

    // CPU: a frameless native leaf keeps its callers (the unwind tables).
    assert_eq!(
        read("native.rc").trim(),
        "0",
        "kernel {series}: the native run failed:\n{}",
        tail(&read("native.log"), 30)
    );
    let native = last_interval_samples(&results.join("native-profiles"), pid("native"));
    let leaves: Vec<&Vec<String>> = native
        .iter()
        .filter(|frames| frames.iter().any(|f| f == "hot_a" || f == "hot_b"))
        .collect();
    let with_main = with_frame(&leaves, "main");
    eprintln!(
        "kernel {series}: native leaf {} samples, {:.1}% reach main",
        leaves.len(),
        100.0 * with_main as f64 / leaves.len().max(1) as f64
    );
    assert!(
        leaves.len() >= 30,
        "kernel {series}: {} native leaf samples",
        leaves.len()
    );
    assert!(
        with_main as f64 >= 0.95 * leaves.len() as f64,
        "kernel {series}: only {with_main} of {} frameless leaf samples reach main",
        leaves.len()
    );

    // Off-CPU, lock and allocation profiles, each with its workload's sites.
    let lock = pid("jvm");
    for (kind, site) in [
        ("offcpu", "LockSplit.sleepSite"),
        ("mutex", "LockSplit.monitorSite"),
        ("block", "LockSplit.parkSite"),
    ] {
        let samples = kind_samples(&profiles, lock, kind);
        let at_site = with_frame(&samples, site);
        eprintln!(
            "kernel {series}: {kind}: {} samples, {at_site} at {site}",
            samples.len()
        );
        assert!(at_site > 0, "kernel {series}: no {kind} sample at {site}");
    }
    // Kernel frames are named, by the kernel's lookup or from /proc/kallsyms: an off-CPU
    // stack starts in the scheduler.
    let off_cpu = kind_samples(&profiles, lock, "offcpu");
    let in_scheduler = with_frame(&off_cpu, "__schedule");
    eprintln!(
        "kernel {series}: offcpu: {in_scheduler} of {} samples in __schedule",
        off_cpu.len()
    );
    assert!(
        in_scheduler as f64 >= 0.9 * off_cpu.len() as f64,
        "kernel {series}: {in_scheduler} of {} off-CPU samples have a `__schedule` frame",
        off_cpu.len()
    );
    let alloc = kind_samples(&profiles, pid("jvm"), "alloc");
    let seventy = with_frame(&alloc, "AllocSplit.siteSeventy");
    eprintln!(
        "kernel {series}: alloc: {} samples, {seventy} at siteSeventy",
        alloc.len()
    );
    assert!(
        seventy > 0,
        "kernel {series}: no allocation sample at siteSeventy"
    );

    // The BPF time per run of the programs, as the kernel measured it during the run.
    report_bpf_time(series, "run", &read("progs.json"));
    let _ = std::fs::remove_dir_all(&work);
}

/// How many of `samples` (each a stack's frame names) have a frame named `name`.
fn with_frame<S: AsRef<[String]>>(samples: &[S], name: &str) -> usize {
    samples
        .iter()
        .filter(|frames| frames.as_ref().iter().any(|f| f == name))
        .count()
}

/// Each sample's frame names (base names), of `pid`'s profiles of one kind. A CPU profile's
/// stack counts once per sample it stands for; other kinds' once (their values are weights).
fn kind_samples(dir: &Path, pid: u32, kind: &str) -> Vec<Vec<String>> {
    samples_of(kind_profiles(dir, pid, kind), kind == "cpu")
}

/// As [`kind_samples`] (CPU), of the last interval's profile only.
fn last_interval_samples(dir: &Path, pid: u32) -> Vec<Vec<String>> {
    let mut profiles = kind_profiles(dir, pid, "cpu");
    let last = profiles.pop();
    samples_of(last.into_iter().collect(), true)
}

/// `pid`'s profiles of one kind, oldest first (their names start with the kind and the time).
fn kind_profiles(dir: &Path, pid: u32, kind: &str) -> Vec<(PathBuf, proto::Profile)> {
    let prefix = format!("{kind}-");
    profiles_of(dir, pid)
        .unwrap_or_default()
        .into_iter()
        .filter(|(path, _)| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect()
}

fn samples_of(profiles: Vec<(PathBuf, proto::Profile)>, by_count: bool) -> Vec<Vec<String>> {
    let mut samples = Vec::new();
    for (_, profile) in profiles {
        for sample in &profile.sample {
            let frames: Vec<String> = sample_frames(&profile, sample)
                .into_iter()
                .map(|frame| base_name(&frame.name).to_owned())
                .collect();
            let times = if by_count {
                count(sample).clamp(0, 100_000) as usize
            } else {
                1
            };
            samples.extend(std::iter::repeat_n(frames, times));
        }
    }
    samples
}

fn report_bpf_time(series: &str, which: &str, progs_json: &str) {
    let Ok(serde_json::Value::Array(programs)) = serde_json::from_str(progs_json) else {
        panic!("kernel {series}: no program list from bpftool ({which}): {progs_json:?}");
    };
    let mut reported = 0;
    let listed = programs.len();
    for program in programs {
        let name = program["name"].as_str().unwrap_or_default();
        let (Some(ns), Some(runs)) = (program["run_time_ns"].as_u64(), program["run_cnt"].as_u64())
        else {
            continue;
        };
        if runs > 0
            && ["sample_cpu", "off_cpu_switch", "alloc_in_new_tlab"]
                .iter()
                // bpftool shows the kernel's copy of a name: 15 characters at most.
                .any(|full| !name.is_empty() && full.starts_with(name))
        {
            eprintln!(
                "kernel {series}: {which}: {name} {:.1} us per run ({runs} runs; TCG, not hardware speed)",
                ns as f64 / runs as f64 / 1000.0
            );
            reported += 1;
        }
    }
    if reported == 0 {
        eprintln!(
            "kernel {series}: {which}: no sampling program with run times among the {listed} bpftool listed:\n{}",
            progs_json.chars().take(2000).collect::<String>()
        );
    }
}

/// The workloads, compiled once for every row: `classes/` and `native_split`.
fn built_workloads() -> &'static Path {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        let dir = tempfile::tempdir().expect("a temporary directory").keep();
        compile_java(
            &[
                "KernelMatrix.java",
                "Workloads.java",
                "LockSplit.java",
                "AllocSplit.java",
            ],
            &dir,
        )
        .expect("javac");
        compile_c_with(
            "native_split.c",
            &dir,
            &["-O2", "-g", "-fomit-frame-pointer"],
        )
        .expect("gcc");
        dir
    })
}

/// Writes what the guest runs, its script and the compiled workloads, into the results share
/// (the guest mounts its own tmpfs over the host's /tmp, where the test's directories are).
fn prepare_guest(results: &Path) -> Result<()> {
    let jdk = jdks()
        .into_iter()
        .find(|jdk| jdk.major == 17)
        .context("JDK 17")?;
    let built = built_workloads();
    let classes_dir = results.join("classes");
    std::fs::create_dir_all(&classes_dir)?;
    for entry in std::fs::read_dir(built.join("classes"))? {
        let entry = entry?;
        std::fs::copy(entry.path(), classes_dir.join(entry.file_name()))?;
    }
    std::fs::copy(built.join("native_split"), results.join("native_split"))?;
    let daemon = daemon_binary();
    let java = jdk.java.display().to_string();
    let classes = "/mnt/classes";
    let native = "/mnt/native_split";
    // Each step's time since boot goes to guest.log, printed by the test.
    //
    // The emulated CPUs verify the programs slowly (20 to 40 times the host's 0.7 s of kernel
    // time), so the three loads (`check`, the JVM's daemon, the native program's daemon) run at
    // once on the guest's two CPUs while the workloads wait for their daemon to sample: the JVM
    // for a file, the native program stopped. The native program has a daemon of its own: on
    // emulated CPUs libjvm's tables take tens of seconds to build, and its small table would
    // wait behind them. Its last interval is asserted on: the first holds the samples taken
    // before its table was loaded.
    let script = format!(
        r#"R=/mnt
D={daemon}
at() {{ echo "$1 at $(cut -d' ' -f1 /proc/uptime) s"; }}
uname -r > $R/release
start() {{ name=$1; shift; "$@" > $R/$name.out 2>&1 & echo $! > $R/$name.pid; }}
start native {native} 300
kill -STOP $(cat $R/native.pid)
start jvm {java} -Xmx128m -cp {classes} KernelMatrix $R/go
run() {{ log=$1; shift; "$@" > $R/$log.log 2>&1 & echo $! > $R/$log.child; wait $!; echo $? > $R/$log.rc; }}
# The workloads only (the whole host's other processes cost symbolizing time on emulated CPUs),
# and a small table budget (the compat object's preallocated blocks are filled at start).
echo 'cache_budget_mib = 24' > $R/config.toml
# The kernel's BPF run-time statistics, on before any program loads.
echo 1 > /proc/sys/kernel/bpf_stats_enabled
at loading
run check $D check &
CHECK=$!
run daemon $D run --config $R/config.toml --pid $(cat $R/jvm.pid) --frequency 99 --interval 8 --duration 60 --output $R/profiles --off-cpu --alloc --lock=1ms &
DAEMON=$!
run native $D run --config $R/config.toml --pid $(cat $R/native.pid) --frequency 99 --interval 5 --duration 10 --output $R/native-profiles &
NATIVE=$!
# Each workload goes once its daemon samples.
sampling() {{ grep -q 'daemon: sampling' $R/$1.log; }}
i=0
until [ -e $R/go ] && [ -e $R/native.go ]; do
    [ $i -lt 300 ] || {{ echo "the daemons did not start sampling"; exit 1; }}
    if [ ! -e $R/native.go ]; then
        if sampling native; then
            kill -CONT $(cat $R/native.pid); touch $R/native.go; at "native program sampled"
        elif ! kill -0 $NATIVE; then echo "the native program's daemon exited"; exit 1; fi
    fi
    if [ ! -e $R/go ]; then
        if sampling daemon; then touch $R/go; at "JVM sampled"
        elif ! kill -0 $DAEMON; then echo "the JVM's daemon exited"; exit 1; fi
    fi
    sleep 0.5; i=$((i+1))
done
i=0
while [ "$(grep -c '^ready' $R/jvm.out)" != 3 ] && [ $i -lt 60 ]; do
    kill -0 $(cat $R/jvm.pid) || {{ echo "the JVM exited"; exit 1; }}
    sleep 1; i=$((i+1))
done
at "workloads ready after $i s"
# The JVM's daemon samples the workloads 6 s from the moment they are all ready, however long
# the emulated CPUs took to get there (once 13 s of its 16): the programs' run times are read
# meanwhile, then it is stopped as a service would be (its last interval written; 12 s of
# samples took the emulated CPUs 30 s more to name).
sleep 5
bpftool -j prog show > $R/progs.json
sleep 1
kill -TERM $(cat $R/daemon.child)
wait $CHECK $DAEMON $NATIVE
at end
kill $(cat $R/jvm.pid) $(cat $R/native.pid)
exit 0
"#,
        daemon = daemon.display(),
    );
    std::fs::write(results.join("guest.sh"), script)?;
    Ok(())
}

/// The initramfs: a static busybox, the kernel's modules, and `/init`.
fn build_initramfs(work: &Path, kernel: &Kernel) -> Result<PathBuf> {
    let root = work.join("initramfs");
    for dir in ["bin", "dev", "proc", "sys", "host", "mods"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    std::fs::copy("/bin/busybox", root.join("bin/busybox"))
        .context("a static busybox at /bin/busybox (busybox-static)")?;
    for module in &kernel.modules {
        let name = module.file_name().context("a module's file name")?;
        std::fs::copy(module, root.join("mods").join(name))?;
    }
    let init = root.join("init");
    std::fs::write(&init, INIT)?;
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    let image = work.join("initramfs.cpio");
    let status = Command::new("sh")
        .arg("-c")
        .arg("cd \"$0\" && find . | cpio -o -H newc --quiet > \"$1\"")
        .arg(&root)
        .arg(&image)
        .status()?;
    if !status.success() {
        bail!("cpio failed");
    }
    Ok(image)
}

/// The guest's first process: modules (in passes, so that each finds what it depends on loaded),
/// the host's root and the results share, the filesystems the daemon and JVMs need, the script.
const INIT: &str = r#"#!/bin/busybox sh
/bin/busybox --install -s /bin
mount -t proc proc /proc; mount -t sysfs sysfs /sys; mount -t devtmpfs dev /dev
for pass in 1 2 3; do for m in /mods/*.ko; do insmod $m 2>/dev/null; done; done
if ! mount -t 9p -o trans=virtio,version=9p2000.L,ro,msize=262144 host /host; then
    echo "MATRIX: mounting the host failed"; poweroff -f
fi
mount -t 9p -o trans=virtio,version=9p2000.L,msize=262144 results /host/mnt
mount -t proc proc /host/proc; mount -t sysfs sysfs /host/sys; mount -t devtmpfs dev /host/dev
mount -t tmpfs tmp /host/tmp; mount -t tmpfs run /host/run
mkdir -p /host/dev/shm; mount -t tmpfs shm /host/dev/shm
mount -t bpf bpf /host/sys/fs/bpf; mount -t tracefs tracefs /host/sys/kernel/tracing
mount -t debugfs debugfs /host/sys/kernel/debug
chroot /host /bin/sh /mnt/guest.sh > /host/mnt/guest.log 2>&1
echo "MATRIX-EXIT $?"
poweroff -f
"#;

/// The guest did not power off within [`GUEST_TIMEOUT`].
#[derive(Debug)]
struct GuestTimedOut;

impl std::fmt::Display for GuestTimedOut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the guest ran past {GUEST_TIMEOUT:?}")
    }
}

impl std::error::Error for GuestTimedOut {}

/// Boots the guest and returns its console once it powers off.
fn boot(kernel: &Kernel, initramfs: &Path, results: &Path) -> Result<String> {
    // A file, not a pipe: QEMU would block on a full pipe while this waits for it.
    let console_path = initramfs.with_extension("console");
    let console = std::fs::File::create(&console_path)?;
    let mut child = Command::new("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "3G"])
        .args(["-nographic", "-no-reboot", "-kernel"])
        .arg(&kernel.vmlinuz)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyS0 quiet panic=-1"])
        .arg("-virtfs")
        .arg("local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap")
        .arg("-virtfs")
        .arg(format!(
            "local,path={},mount_tag=results,security_model=none",
            results.display()
        ))
        .stdin(Stdio::null())
        .stdout(console.try_clone()?)
        .stderr(console)
        .spawn()
        .context("starting qemu-system-x86_64")?;
    let deadline = Instant::now() + GUEST_TIMEOUT;
    loop {
        if child.try_wait()?.is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(GuestTimedOut.into());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(String::from_utf8_lossy(&std::fs::read(&console_path)?).into_owned())
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
