//! End to end on native code: real BPF program, real workloads, the daemon binary as users run it.

use std::process::Command;
use std::time::Duration;

use profiler_tests::*;

/// Shares of the process's samples whose stack contains `function`.
fn inclusive_share(
    profiles: &[(std::path::PathBuf, profiler_daemon::pprof::proto::Profile)],
    function: &str,
) -> f64 {
    let (mut with, mut total) = (0i64, 0i64);
    for (_, profile) in profiles {
        for sample in &profile.sample {
            total += count(sample);
            if sample_frames(profile, sample)
                .iter()
                .any(|frame| frame.name == function)
            {
                with += count(sample);
            }
        }
    }
    with as f64 / total.max(1) as f64
}

#[test]
fn native_cpu_split_is_measured_and_stacks_reach_main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = compile_c("native_split.c", dir.path()).expect("compiles");
    let workload = Workload::spawn(Command::new(&binary).arg("30")).expect("starts");
    let out = dir.path().join("profiles");
    let pid = workload.pid().to_string();
    let output = run_daemon(
        &[
            "--pid",
            &pid,
            "--frequency",
            "199",
            "--interval",
            "3",
            "--duration",
            "6",
            "--output",
            out.to_str().expect("utf-8"),
        ],
        Duration::from_secs(60),
    )
    .expect("daemon runs");
    assert!(output.status.success(), "daemon failed: {output:?}");

    let profiles = profiles_of(&out, workload.pid()).expect("profiles readable");
    assert!(
        profiles.len() >= 2,
        "one profile per interval: got {}",
        profiles.len()
    );
    let total: i64 = profiles
        .iter()
        .flat_map(|(_, p)| p.sample.iter())
        .map(count)
        .sum();
    // 199 Hz for ~6 s of a busy process on one CPU.
    assert!(total > 600, "too few samples: {total}");

    let a = inclusive_share(&profiles, "hot_a");
    let b = inclusive_share(&profiles, "hot_b");
    let main = inclusive_share(&profiles, "main");
    eprintln!(
        "shares: hot_a {:.1}% hot_b {:.1}% main {:.1}% over {total} samples",
        a * 100.0,
        b * 100.0,
        main * 100.0
    );
    assert!(
        (a - 0.70).abs() <= 0.05,
        "hot_a share {a:.3}, expected 0.70 +- 0.05"
    );
    assert!(
        (b - 0.30).abs() <= 0.05,
        "hot_b share {b:.3}, expected 0.30 +- 0.05"
    );
    assert!(main >= 0.95, "only {main:.3} of stacks reach main");

    // The caller of hot_a in those stacks is main: the walk is in order.
    let (_, profile) = &profiles[0];
    let sample = profile
        .sample
        .iter()
        .find(|s| {
            sample_frames(profile, s)
                .first()
                .is_some_and(|frame| frame.name == "hot_a")
        })
        .expect("a sample with hot_a as leaf");
    let names: Vec<String> = sample_frames(profile, sample)
        .into_iter()
        .map(|frame| frame.name)
        .collect();
    assert_eq!(
        &names[..2],
        &["hot_a".to_string(), "main".to_string()],
        "stack {names:?}"
    );

    // Labels and the file format.
    assert_eq!(label(profile, sample, "pid"), Some(pid.as_str()));
    assert_eq!(label(profile, sample, "comm"), Some("native_split"));
    assert_eq!(label(profile, sample, "thread_name"), Some("native_split"));
    assert!(profile.time_nanos > 0 && profile.duration_nanos > 0);
    assert_eq!(profile.period, 1_000_000_000 / 199);
    assert_eq!(sample.value[1], sample.value[0] * profile.period);
    // A flame graph beside each profile, for a look without pprof tooling.
    let svg = profiles[0].0.to_string_lossy().replace(".pb.gz", ".svg");
    let svg = std::fs::read_to_string(&svg).expect("an SVG flame graph beside the profile");
    assert!(
        svg.contains("<title>hot_a (") && svg.contains("<title>main ("),
        "flame graph lacks the workload's frames"
    );
    let top = go_pprof_top(&profiles[0].0).expect("go tool pprof reads the file");
    assert!(
        top.contains("hot_a") && top.contains("hot_b"),
        "pprof -top output:\n{top}"
    );
}

#[test]
fn kernel_frames_appear_under_user_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = compile_c("syscall_heavy.c", dir.path()).expect("compiles");
    let workload = Workload::spawn(Command::new(&binary).arg("30")).expect("starts");
    let out = dir.path().join("profiles");
    let pid = workload.pid().to_string();
    let output = run_daemon(
        &[
            "--pid",
            &pid,
            "--frequency",
            "199",
            "--duration",
            "4",
            "--output",
            out.to_str().expect("utf-8"),
        ],
        Duration::from_secs(60),
    )
    .expect("daemon runs");
    assert!(output.status.success(), "daemon failed: {output:?}");

    let profiles = profiles_of(&out, workload.pid()).expect("profiles readable");
    let (mut total, mut in_kernel, mut in_kernel_with_user) = (0i64, 0i64, 0i64);
    for (_, profile) in &profiles {
        for sample in &profile.sample {
            let frames = sample_frames(profile, sample);
            total += count(sample);
            if !frames
                .first()
                .is_some_and(|frame| is_kernel_address(frame.address))
            {
                continue;
            }
            in_kernel += count(sample);
            // Kernel frames first, then user frames down to main: the user registers of a
            // sample taken in the kernel come from the task's saved pt_regs.
            let first_user = frames
                .iter()
                .position(|frame| !is_kernel_address(frame.address));
            let user: Vec<&str> = first_user
                .map(|i| {
                    frames[i..]
                        .iter()
                        .map(|frame| frame.name.as_str())
                        .collect()
                })
                .unwrap_or_default();
            let all_user_after = first_user.is_some_and(|i| {
                frames[i..]
                    .iter()
                    .all(|frame| !is_kernel_address(frame.address))
            });
            if all_user_after && user.contains(&"read_loop") && user.contains(&"main") {
                in_kernel_with_user += count(sample);
            }
        }
    }
    eprintln!("{in_kernel} of {total} samples in the kernel, {in_kernel_with_user} of them with the user stack to main");
    assert!(total > 300, "too few samples: {total}");
    assert!(
        in_kernel as f64 >= 0.5 * total as f64,
        "a read loop on /dev/zero is mostly kernel time"
    );
    assert!(
        in_kernel_with_user as f64 >= 0.9 * in_kernel as f64,
        "kernel samples lack their user stack"
    );

    // Kernel frames are named from kallsyms.
    let (path, _) = &profiles[0];
    let top = go_pprof_top(path).expect("go tool pprof reads the file");
    assert!(
        top.contains("read_zero") || top.contains("clear_user") || top.contains("ksys_read"),
        "pprof -top:\n{top}"
    );
}

#[test]
fn sigint_writes_the_current_interval_before_exiting() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = compile_c("native_split.c", dir.path()).expect("compiles");
    let workload = Workload::spawn(Command::new(&binary).arg("30")).expect("starts");
    let out = dir.path().join("profiles");
    let mut daemon = Command::new(daemon_binary())
        .args([
            "run",
            "--pid",
            &workload.pid().to_string(),
            "--interval",
            "600",
            "--output",
        ])
        .arg(&out)
        .spawn()
        .expect("daemon starts");
    std::thread::sleep(Duration::from_secs(3));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(daemon.id() as i32, libc::SIGINT) };
    let status = daemon.wait().expect("daemon exits");
    assert!(status.success(), "{status}");
    let profiles = profiles_of(&out, workload.pid()).expect("readable");
    assert_eq!(
        profiles.len(),
        1,
        "the unfinished interval is written on SIGINT"
    );
    assert!(profiles[0].1.sample.iter().map(count).sum::<i64>() > 10);
}

#[test]
fn bad_configuration_exits_2_naming_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("bad.toml");
    std::fs::write(&config, "frequency = 99\nintervall_secs = 5\n").expect("writes");
    let output = Command::new(daemon_binary())
        .args(["run", "--config"])
        .arg(&config)
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("intervall_secs"), "{stderr}");

    let output = Command::new(daemon_binary())
        .args(["run", "--frequency", "5000"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--frequency"), "{stderr}");

    let output = Command::new(daemon_binary())
        .args(["run", "--frequency", "fast"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--frequency"));
}

#[test]
fn without_privileges_exits_2_naming_them() {
    // Drop every capability for the child with setpriv (util-linux), keeping uid 0 otherwise.
    let output = Command::new("setpriv")
        .args(["--inh-caps=-all", "--bounding-set=-all", "--"])
        .arg(daemon_binary())
        .args(["run", "--duration", "1", "--output"])
        .arg(std::env::temp_dir().join("profiler-noprivs"))
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("CAP_BPF") && stderr.contains("CAP_PERFMON"),
        "{stderr}"
    );
}

#[test]
fn metrics_endpoint_reports_what_the_sampler_counted() {
    let dir = tempfile::tempdir().expect("tempdir");
    let binary = compile_c("native_split.c", dir.path()).expect("compiles");
    let workload = Workload::spawn(Command::new(&binary).arg("30")).expect("starts");
    let address = free_local_address().expect("a free port");
    let mut daemon = Command::new(daemon_binary())
        .args([
            "run",
            "--pid",
            &workload.pid().to_string(),
            "--frequency",
            "99",
            "--duration",
            "6",
            "--metrics-listen",
            &address.to_string(),
            "--output",
        ])
        .arg(dir.path().join("profiles"))
        .spawn()
        .expect("daemon starts");
    std::thread::sleep(Duration::from_secs(3));
    let response = scrape_metrics(address).expect("metrics endpoint answers");
    let samples = metric_value(&response, metric::BPF_SAMPLES_SENT).expect("samples metric");
    assert!(samples > 50, "{response}");
    let end = |end: UnwindEnd| {
        metric_value(
            &response,
            &labelled(metric::UNWIND_ENDS, "reason", end.name()),
        )
        .unwrap_or_else(|| panic!("no unwind end {end:?}: {response}"))
    };
    // Every sample the daemon read ended its user walk somewhere (the snapshot's sent counter
    // also counts the ring's undrained tail). For this frame-pointer workload, spinning in user
    // space, that is the end of a native stack: glibc's start-up code past main
    // (`not_monotonic`, `read_failed`) or a zero frame pointer (`complete`); never the depth
    // bound, a missing user context or a Java reason.
    let all_ends: u64 = UnwindEnd::ALL.map(end).iter().sum();
    let native_ends =
        end(UnwindEnd::Complete) + end(UnwindEnd::NotMonotonic) + end(UnwindEnd::ReadFailed);
    assert!(all_ends > 50 && all_ends <= samples, "{response}");
    assert_eq!(native_ends, all_ends, "{response}");
    assert_eq!(
        metric_value(
            &response,
            &labelled(
                metric::SAMPLES_NOT_PROFILED,
                "reason",
                Counter::RingFull.name()
            )
        ),
        Some(0),
        "{response}"
    );
    assert!(daemon.wait().expect("exits").success());

    // A bad address is a usage error naming the flag.
    let output = Command::new(daemon_binary())
        .args(["run", "--metrics-listen", "localhost"])
        .output()
        .expect("runs");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--metrics-listen"));
}
