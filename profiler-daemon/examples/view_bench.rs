//! What `profiler-daemon view` costs over an hour of a busy host's local files: 50 JVM-like
//! processes, one CPU profile each every 10 s (18,000 files), then the view's wall time and
//! peak RSS (`wait4`'s `ru_maxrss`) for a few selections. Prints a Markdown table; figures are
//! for docs/benchmarks.md, never asserted.
//!
//! ```sh
//! cargo build --release -p profiler-daemon --example view_bench
//! target/release/examples/view_bench [DIR]   # DIR: where the files go (default: a temp dir)
//! ```
//!
//! The files are generated, not profiled, so the run needs no root and is repeatable: each
//! process has 4,000 Java-like functions and 1,500 stacks 15 to 80 frames deep (sharing their
//! outer frames, as a service's stacks do); each interval samples 300 of them (a power law
//! picks the hot ones) over 20 pool threads, labelled as the daemon labels local samples.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use profiler_daemon::output::file_name::file_stem;
use profiler_daemon::pprof::{encode, encode_gzipped};
use profiler_daemon::profile_model::{
    Frame, FrameKind, NameSource, ProfileKind, Sample, SampleThread, SymbolizedProfile,
};

const PROCESSES: u32 = 50;
const INTERVAL_SECS: u64 = 10;
const INTERVALS: u64 = 360;
const FUNCTIONS: usize = 4_000;
const STACKS: usize = 1_500;
const SAMPLES_PER_FILE: usize = 300;
const THREADS: u32 = 20;

/// xorshift64*: reproducible without a dependency.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Skewed towards 0: a few hot stacks, a long tail.
    fn hot(&mut self, n: usize) -> usize {
        let uniform = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((uniform.powi(3)) * n as f64) as usize % n
    }
}

/// One process's stacks: function indexes, root first.
fn stacks_of(process: u32) -> Vec<Vec<usize>> {
    let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ u64::from(process + 1));
    let trunks: Vec<Vec<usize>> = (0..40)
        .map(|_| {
            let depth = 10 + random.below(20);
            (0..depth).map(|_| random.below(FUNCTIONS)).collect()
        })
        .collect();
    (0..STACKS)
        .map(|_| {
            let mut stack = trunks[random.below(trunks.len())].clone();
            let cut = 5 + random.below(stack.len() - 5);
            stack.truncate(cut);
            let leaves = 10 + random.below(60);
            stack.extend((0..leaves).map(|_| random.below(FUNCTIONS)));
            stack
        })
        .collect()
}

fn function_name(process: u32, index: usize) -> String {
    format!(
        "com.example.service{process}.module{}.Class{}.method{index}_[j]",
        index % 37,
        index % 211
    )
}

/// Writes the files (or finds them written by an earlier run: generating takes minutes).
fn generate(dir: &Path, start: SystemTime) -> (usize, u64) {
    let written: Vec<u64> = std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.file_name().to_string_lossy().ends_with(".pb.gz"))
                .filter_map(|e| e.metadata().ok().map(|m| m.len()))
                .collect()
        })
        .unwrap_or_default();
    if written.len() == (u64::from(PROCESSES) * INTERVALS) as usize {
        return (written.len(), written.iter().sum());
    }
    std::fs::create_dir_all(dir).expect("creates the directory");
    let (mut files, mut bytes) = (0, 0);
    for process in 0..PROCESSES {
        let stacks = stacks_of(process);
        let names: Vec<Frame> = (0..FUNCTIONS)
            .map(|index| Frame::marker(FrameKind::Native, function_name(process, index)))
            .collect();
        let pid = 10_000 + process;
        let service = format!("service-{process}");
        let mut random = Random(u64::from(process) * 7919 + 1);
        for interval in 0..INTERVALS {
            let time = start + Duration::from_secs(interval * INTERVAL_SECS);
            let duration = Duration::from_secs(INTERVAL_SECS);
            let mut profile = SymbolizedProfile::new(ProfileKind::Cpu, pid, time, duration);
            (profile.comm, profile.period) = ("java".into(), 1_000_000_000 / 19);
            profile.frames = std::sync::Arc::new(names.clone());
            for _ in 0..SAMPLES_PER_FILE {
                let stack = &stacks[random.hot(STACKS)];
                let tid = pid + 1 + random.below(THREADS as usize) as u32;
                let thread = profile.add_thread(SampleThread {
                    tid,
                    name: format!("http-nio-8080-exec-{}", tid - pid),
                    source: NameSource::Sidecar,
                    virtual_thread: None,
                });
                let count = 1 + random.below(3) as i64;
                profile.samples.push(Sample {
                    frames: stack.iter().rev().map(|&f| f as u32).collect(),
                    values: [count, count * profile.period, 0, 0],
                    thread: Some(thread),
                    wait: None,
                });
            }
            let gzipped = encode_gzipped(&encode(&profile, true)).expect("encodes");
            let name = file_stem(ProfileKind::Cpu, time, pid, "java", &service);
            std::fs::write(dir.join(format!("{name}.pb.gz")), &gzipped).expect("writes");
            files += 1;
            bytes += gzipped.len() as u64;
        }
    }
    (files, bytes)
}

/// Runs the view; returns its wall time, peak RSS in bytes and summary line.
fn measure(daemon: &Path, args: &[&str], output: &Path) -> (Duration, u64, String) {
    let started = Instant::now();
    // Reaped by `wait4` below, which gives its resource usage (std's `wait` does not).
    #[allow(clippy::zombie_processes)]
    let child = Command::new(daemon)
        .arg("view")
        .args(args)
        .arg("-o")
        .arg(output)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("view starts");
    let pid = child.id() as libc::pid_t;
    let stderr = child.stderr;
    let summary = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut stderr) = stderr {
            let _ = std::io::Read::read_to_string(&mut stderr, &mut text);
        }
        text
    });
    let mut status = 0;
    // SAFETY: an all-zero rusage is valid; wait4 fills it for our own child.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (std's handle is never waited on).
    let waited = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    let took = started.elapsed();
    assert_eq!(waited, pid, "wait4");
    let summary = summary.join().unwrap_or_default();
    assert!(
        std::process::ExitStatus::from_raw(status).success(),
        "view {args:?} failed: {summary}"
    );
    (
        took,
        usage.ru_maxrss as u64 * 1024,
        summary.trim().to_owned(),
    )
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("view-bench"));
    let daemon = std::env::current_exe()
        .expect("own path")
        .parent()
        .and_then(Path::parent)
        .expect("target/release")
        .join("profiler-daemon");
    assert!(
        daemon.exists(),
        "build the daemon first: {}",
        daemon.display()
    );
    let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
    let generated = Instant::now();
    let (files, bytes) = generate(&dir, start);
    eprintln!(
        "generated {files} files, {:.0} MB, in {:.0} s",
        bytes as f64 / 1e6,
        generated.elapsed().as_secs_f64()
    );
    // Page cache warm, as after a day of writing: one pass untimed.
    let output = dir.join("view.svg");
    let _ = measure(&daemon, &["--dir", dir.to_str().expect("utf-8")], &output);

    let half = humantime::format_rfc3339_seconds(
        start + Duration::from_secs(INTERVALS * INTERVAL_SECS / 2),
    )
    .to_string();
    let first = humantime::format_rfc3339_seconds(start).to_string();
    let dir_arg = dir.to_str().expect("utf-8");
    let cases: [(&str, Vec<&str>); 5] = [
        ("whole host, threads merged", vec!["--dir", dir_arg]),
        (
            "whole host, threads by pool",
            vec!["--dir", dir_arg, "--threads", "pool"],
        ),
        (
            "whole host, per thread",
            vec!["--dir", dir_arg, "--threads", "thread"],
        ),
        (
            "one service",
            vec!["--dir", dir_arg, "--service", "service-7"],
        ),
        (
            "whole host, second half-hour against the first",
            vec!["--dir", dir_arg, "--from", &half, "--before-from", &first],
        ),
    ];
    println!(
        "{files} files ({PROCESSES} processes x {INTERVALS} intervals of {INTERVAL_SECS} s), \
         {:.0} MB gzipped, {SAMPLES_PER_FILE} samples of stacks 15-80 frames deep per file\n",
        bytes as f64 / 1e6
    );
    println!("| view | wall time | peak RSS | summary |\n|---|---|---|---|");
    for (case, args) in cases {
        let (took, rss, summary) = measure(&daemon, &args, &output);
        println!(
            "| {case} | {:.1} s | {:.0} MB | {} |",
            took.as_secs_f64(),
            rss as f64 / 1e6,
            summary.replace('|', "/")
        );
    }
}
