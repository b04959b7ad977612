//! The daemon's memory on a busy host: profiling the whole machine while large debug binaries
//! run, a tight `cache_budget_mib` keeps its symbolization caches, and so its resident memory,
//! bounded, while their frames are still named. The budget (2 MiB) is small enough that this
//! run evicts on any machine: the test binary's symbol table alone is larger. The daemon runs in
//! a memory cgroup of its own with a limit, as in a container, so what the kernel charges it
//! (resident memory, page cache of the binaries it reads, BPF maps) is measured and held: the
//! run must end without an OOM kill.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use profiler_tests::cgroup::MemoryCgroup;
use profiler_tests::*;

/// The daemon's memory cgroup limit: the DaemonSet gives the release build 256 MiB; this is a
/// debug build, whose own part is about 60-80 MB.
const CGROUP_LIMIT_MIB: u64 = 192;

/// A unit test of the daemon's library that spins in its own (debug, ~300 MB) binary: proptest
/// over arbitrary remote memory, [`SPINNING_CASES`] cases (about a second: the daemon's code is
/// built at opt-level 1, where proptest's default 256 cases take 10 ms and the process is gone
/// before the daemon reads its mappings).
const SPINNING_TEST: &str = "hotspot::vmstructs::tests::arbitrary_memory_never_panics";
const SPINNING_CASES: &str = "20000";

/// The daemon library's unit-test binary, beside this test's own (`cargo xtask test` builds
/// both): a large binary full of DWARF.
fn large_debug_binary() -> PathBuf {
    let deps = std::env::current_exe()
        .expect("own path")
        .parent()
        .expect("deps directory")
        .to_path_buf();
    let mut candidates: Vec<PathBuf> = std::fs::read_dir(&deps)
        .expect("deps directory")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("profiler_daemon-") && !n.contains('.'))
        })
        .collect();
    candidates.sort_by_key(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok());
    candidates
        .into_iter()
        .rev()
        .find(|binary| {
            Command::new(binary)
                .args(["--list", SPINNING_TEST])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(SPINNING_TEST))
        })
        .expect("the daemon library's unit tests are built (cargo xtask test builds them)")
}

fn peak_rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        })
        .expect("VmHWM")
}

#[test]
fn a_tight_cache_budget_bounds_memory_on_a_whole_host_run() {
    let binary = large_debug_binary();
    let size_mb = std::fs::metadata(&binary).expect("size").len() >> 20;
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("config.toml");
    let budget_mib = 2;
    std::fs::write(&config, format!("cache_budget_mib = {budget_mib}\n")).expect("config");
    let out = dir.path().join("profiles");
    let metrics = free_local_address().expect("a free port");
    let cgroup = MemoryCgroup::create("profiler-footprint", CGROUP_LIMIT_MIB << 20)
        .expect("a memory cgroup (cgroup v2 or v1's memory controller)");
    let daemon = DaemonRun::new()
        .config(&config)
        .frequency(99)
        .interval(2)
        .output(&out)
        .metrics(metrics)
        .start_in(&cgroup, dir.path());
    std::thread::sleep(Duration::from_secs(2));
    let mut pids = Vec::new();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_secs(8) {
        let child = Command::new(&binary)
            .args(["--exact", SPINNING_TEST])
            .env("PROPTEST_CASES", SPINNING_CASES)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("test binary runs");
        pids.push(child.id());
        let status = Workload(child).0.wait().expect("waits");
        assert!(status.success());
    }
    // Two intervals more, so the last runs are symbolized.
    std::thread::sleep(Duration::from_secs(5));
    let page = scrape_metrics(metrics).expect("metrics");
    let peak_kb = peak_rss_kb(daemon.pid());
    let (anon_key, file_key) = if cgroup.is_v2() {
        ("anon", "file")
    } else {
        ("rss", "cache")
    };
    let anon = cgroup.stat(anon_key).expect("anonymous memory charged");
    let file = cgroup.stat(file_key).expect("page cache charged");
    daemon.terminate();
    let (status, _) = daemon.wait(Duration::from_secs(30)).expect("daemon exits");
    let charged_peak = cgroup.peak().expect("cgroup peak");
    let oom_kills = cgroup.oom_kills().expect("cgroup OOM kills");
    assert_eq!(
        oom_kills, 0,
        "the daemon was OOM-killed in {CGROUP_LIMIT_MIB} MiB"
    );
    assert!(status.success());

    let charged = metric_value(&page, metric::SYMBOL_CACHE_BYTES).expect("cache bytes");
    let evictions = metric_value(&page, metric::SYMBOL_CACHE_EVICTIONS).expect("evictions");
    let limit = metric_value(&page, metric::SYMBOL_CACHE_LIMIT_BYTES).expect("limit");
    // One budget: the unwind tables' share and the symbolization caches' add up to it.
    let table_limit =
        metric_value(&page, metric::UNWIND_TABLE_LIMIT_BYTES).expect("unwind table limit");
    let table_bytes = metric_value(&page, metric::UNWIND_TABLE_BYTES).expect("unwind table bytes");
    assert_eq!(limit + table_limit, budget_mib << 20);
    assert!(
        table_bytes <= table_limit,
        "unwind tables {table_bytes} > their limit {table_limit}"
    );
    assert!(charged <= limit, "charged {charged} > limit {limit}");
    assert!(
        evictions > 0,
        "a whole host does not fit in {budget_mib} MiB"
    );
    // Without the budget this run holds 350+ MB of parsed DWARF (the binary is ~300 MB); the
    // daemon's own part is about 60-80 MB in a debug build.
    assert!(
        peak_kb < (budget_mib + 128) << 10,
        "peak RSS {} MB with a {budget_mib} MiB budget",
        peak_kb >> 10
    );
    // The processes' leaf frames are named (the big binary's from its symbol table at least:
    // its DWARF is larger than the budget), not left as `module+0x...` offsets. Samples with no
    // frame in a known mapping at all are left out: the daemon read the process's mappings at
    // its first sample, before it exec'd the test binary (its main thread, which alone would show
    // the new name, sleeps), and the process was gone when the interval was symbolized. They say
    // nothing about the budget (a known limit of short-lived programs: ARCHITECTURE.md,
    // "Design").
    let mut named = 0;
    let mut total = 0;
    let mut unmapped = 0;
    for pid in &pids {
        for (_, profile) in profiles_of(&out, *pid).expect("profiles") {
            for sample in &profile.sample {
                let frames = sample_frames(&profile, sample);
                if frames
                    .iter()
                    .all(|f| f.name == "[unknown]" || f.name.ends_with("_[k]"))
                {
                    unmapped += count(sample);
                    continue;
                }
                total += count(sample);
                if frames
                    .first()
                    .is_some_and(|leaf| !leaf.name.contains("+0x") && leaf.name != "[unknown]")
                {
                    named += count(sample);
                }
            }
        }
    }
    assert!(total > 50, "{total} samples of the test binary");
    assert!(
        named * 4 > total * 3,
        "{named} of {total} samples have a named leaf"
    );
    println!(
        "whole host with a {budget_mib} MiB cache budget and a {size_mb} MB debug binary: peak RSS \
         {} MB, {evictions} evictions, {charged} bytes charged at the end, {named}/{total} samples \
         with a named leaf ({unmapped} more in no known mapping); its memory cgroup (limit {CGROUP_LIMIT_MIB} MiB): peak {} MB charged, \
         {} MB anonymous and {} MB page cache at the end, {oom_kills} OOM kills",
        peak_kb >> 10,
        charged_peak >> 20,
        anon >> 20,
        file >> 20
    );
}
