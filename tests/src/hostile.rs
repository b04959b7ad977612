//! Hostile scenarios end to end: the real daemon runs while a test's attacker (processes of
//! another user, as a rule) goes at it, beside a *bystander*, an innocent root process spinning in
//! [`BYSTANDER_FUNCTION`], whose profiles show whether profiling went on for everyone else.
//!
//! A [`Scenario`] is run twice, once without the attack (the baseline) and once with it; the
//! [`HostileRun`]s it returns are measurements only, and [`HostileRun::assert_unharmed`] compares
//! them: the daemon exited cleanly and promptly on SIGTERM, its memory stayed near the baseline,
//! and the bystander was profiled in every interval. A run takes its `run_for` plus the daemon's
//! start and stop, a few seconds: scenarios should keep `run_for` around 10 s.

use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::{compile_c, daemon_binary, frame_names, profiles_of, Workload};

/// The function the bystander spends its time in.
pub const BYSTANDER_FUNCTION: &str = "bystander_spin";
/// The unprivileged account `cargo xtask setup --tests` creates: the attacker.
pub const UNPRIVILEGED_USER: &str = "profiler-test";
/// How long the daemon may take from SIGTERM to exit: writing the last interval, no exporter.
pub const SIGTERM_BOUND: Duration = Duration::from_secs(5);
/// How much more memory an attacked daemon may reach than its baseline.
pub const RSS_ALLOWANCE_BYTES: u64 = 20 << 20;

/// A user to run hostile processes as.
#[derive(Clone, Copy, Debug)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
}

impl User {
    /// `program` to be run as this user (supplementary groups dropped).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new(program);
        command.uid(self.uid).gid(self.gid);
        command
    }
}

/// [`UNPRIVILEGED_USER`]; panics if it does not exist.
pub fn unprivileged_user() -> User {
    let id = |flag: &str| -> u32 {
        let output = Command::new("id")
            .args([flag, UNPRIVILEGED_USER])
            .output()
            .expect("id runs");
        assert!(
            output.status.success(),
            "no user {UNPRIVILEGED_USER}: `cargo xtask setup --tests` creates it"
        );
        String::from_utf8_lossy(&output.stdout)
            .trim()
            .parse()
            .expect("a numeric id")
    };
    let user = User {
        uid: id("-u"),
        gid: id("-g"),
    };
    assert_ne!(user.uid, 0, "{UNPRIVILEGED_USER} must not be root");
    user
}

/// How the daemon runs in a scenario; the same for the baseline and the attacked run.
#[derive(Clone, Debug)]
pub struct Scenario {
    daemon_args: Vec<String>,
    interval_secs: u64,
    run_for: Duration,
    open_files: Option<(u64, u64)>,
    whole_host: bool,
}

/// What the attack closure gets once the daemon is up.
pub struct AttackContext<'a> {
    pub daemon_pid: u32,
    pub bystander_pid: u32,
    /// A directory every user can read and enter, for the attacker's programs.
    pub scratch: &'a Path,
    log: &'a Path,
}

impl AttackContext<'_> {
    /// The daemon's log so far.
    pub fn daemon_log(&self) -> String {
        std::fs::read_to_string(self.log).unwrap_or_default()
    }
}

/// What one run measured.
#[derive(Debug)]
pub struct HostileRun {
    pub exit: ExitStatus,
    pub sigterm_to_exit: Duration,
    /// The daemon's `VmHWM`, read just before SIGTERM.
    pub peak_rss_bytes: u64,
    /// Intervals whose bystander profile names [`BYSTANDER_FUNCTION`].
    pub bystander_intervals: usize,
    /// The intervals the bystander must appear in: all but the first of the run.
    pub expected_intervals: usize,
    pub log: String,
    /// The run's directory (kept): the daemon's log and its profiles in `profiles/`.
    pub output: PathBuf,
}

impl Scenario {
    /// The daemon with `--interval 2`, profiling the bystander only, for `run_for` after it is
    /// up.
    pub fn new(run_for: Duration) -> Self {
        Self {
            daemon_args: Vec::new(),
            interval_secs: 2,
            run_for,
            open_files: None,
            whole_host: false,
        }
    }

    /// More arguments for `profiler-daemon run`.
    pub fn daemon_args(mut self, args: &[&str]) -> Self {
        self.daemon_args
            .extend(args.iter().map(|arg| (*arg).to_owned()));
        self
    }

    pub fn interval_secs(mut self, secs: u64) -> Self {
        self.interval_secs = secs;
        self
    }

    /// Starts the daemon with these soft and hard limits on open files (`prlimit`).
    pub fn open_files(mut self, soft: u64, hard: u64) -> Self {
        self.open_files = Some((soft, hard));
        self
    }

    /// Profiles every process, not only the bystander: for attacks the daemon must discover
    /// (processes started after it).
    pub fn whole_host(mut self) -> Self {
        self.whole_host = true;
        self
    }

    /// The run without an attack.
    pub fn run_baseline(&self) -> HostileRun {
        self.run(|_| ()).0
    }

    /// Starts the bystander and the daemon; once the daemon is up, calls `attack`, which starts
    /// the hostile processes, may check the daemon while it is attacked, and returns what must
    /// stay alive until the daemon has stopped (its processes, what it observed). After
    /// `run_for` from the daemon being up (or after `attack` returned, if later), reads the
    /// daemon's peak memory, stops it with SIGTERM and reads what it wrote.
    pub fn run<A>(&self, attack: impl FnOnce(&AttackContext) -> A) -> (HostileRun, A) {
        let root = tempfile::Builder::new()
            .prefix("hostile-")
            .tempdir()
            .expect("tempdir")
            .keep();
        let profiles = root.join("profiles");
        let scratch = root.join("scratch");
        for dir in [&profiles, &scratch] {
            std::fs::create_dir(dir).expect("mkdir");
        }
        for dir in [&root, &scratch] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let bystander_binary = compile_c("bystander.c", &scratch).expect("gcc bystander.c");
        let bystander = Workload::spawn(
            Command::new(bystander_binary).arg((self.run_for.as_secs() + 120).to_string()),
        )
        .expect("the bystander starts");

        let mut args = vec![
            "--interval".to_owned(),
            self.interval_secs.to_string(),
            "--output".to_owned(),
            profiles.to_str().expect("utf-8").to_owned(),
        ];
        if !self.whole_host {
            args.extend(["--pid".to_owned(), bystander.pid().to_string()]);
        }
        args.extend(self.daemon_args.iter().cloned());
        let log = root.join("daemon.log");
        let mut daemon = Daemon::start(&args, self.open_files, &log);
        daemon.wait_until_sampling();
        let up = Instant::now();

        let context = AttackContext {
            daemon_pid: daemon.pid(),
            bystander_pid: bystander.pid(),
            scratch: &scratch,
            log: &log,
        };
        let attacker = attack(&context);
        std::thread::sleep(self.run_for.saturating_sub(up.elapsed()));

        let peak_rss_bytes = peak_rss_bytes(daemon.pid());
        let (exit, sigterm_to_exit) = daemon.terminate();
        let log_text = std::fs::read_to_string(&log).unwrap_or_default();
        eprintln!("--- daemon log ({}) ---\n{log_text}", log.display());
        let run = HostileRun {
            exit,
            sigterm_to_exit,
            peak_rss_bytes,
            bystander_intervals: intervals_naming(&profiles, bystander.pid(), BYSTANDER_FUNCTION),
            expected_intervals: (self.run_for.as_secs() / self.interval_secs).saturating_sub(1)
                as usize,
            log: log_text,
            output: root,
        };
        (run, attacker)
    }
}

impl HostileRun {
    /// Asserts that the attack did not harm the daemon, compared with `baseline` (the same
    /// scenario unattacked): a successful exit within [`SIGTERM_BOUND`] of SIGTERM, no panic,
    /// a peak RSS within [`RSS_ALLOWANCE_BYTES`] of the baseline's, and the bystander profiled
    /// in every interval after the first.
    #[track_caller]
    pub fn assert_unharmed(&self, baseline: &HostileRun) {
        println!(
            "attacked: exit {}, SIGTERM to exit {:?}, peak RSS {} MB (baseline {} MB), \
             bystander in {} intervals of {} expected (baseline {}); output in {}",
            self.exit,
            self.sigterm_to_exit,
            self.peak_rss_bytes >> 20,
            baseline.peak_rss_bytes >> 20,
            self.bystander_intervals,
            self.expected_intervals,
            baseline.bystander_intervals,
            self.output.display()
        );
        assert!(self.exit.success(), "the daemon's exit: {}", self.exit);
        assert!(
            self.sigterm_to_exit < SIGTERM_BOUND,
            "the daemon took {:?} to exit after SIGTERM",
            self.sigterm_to_exit
        );
        assert!(!self.log.contains("panicked"), "a thread panicked");
        assert!(
            self.peak_rss_bytes <= baseline.peak_rss_bytes + RSS_ALLOWANCE_BYTES,
            "peak RSS {} MB, baseline {} MB",
            self.peak_rss_bytes >> 20,
            baseline.peak_rss_bytes >> 20
        );
        assert!(
            self.bystander_intervals >= self.expected_intervals,
            "the bystander was profiled in {} intervals, expected {} (baseline: {})",
            self.bystander_intervals,
            self.expected_intervals,
            baseline.bystander_intervals
        );
    }
}

/// Intervals (profile files) of `pid` in `dir` with a frame named `function`.
fn intervals_naming(dir: &Path, pid: u32, function: &str) -> usize {
    profiles_of(dir, pid)
        .expect("profiles readable")
        .into_iter()
        .filter(|profile| {
            frame_names(std::slice::from_ref(profile))
                .iter()
                .any(|name| name.contains(function))
        })
        .count()
}

/// `VmHWM` of `pid`, in bytes.
fn peak_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("daemon alive");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmHWM:"))
        .and_then(|value| value.split_whitespace().next()?.parse().ok())
        .expect("VmHWM in /proc/PID/status");
    kib << 10
}

/// `profiler-daemon run`, logging to a file (a full pipe would block it), killed if dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(args: &[String], open_files: Option<(u64, u64)>, log: &Path) -> Self {
        // prlimit sets the limits, then execs the daemon: the same pid.
        let mut command = match open_files {
            Some((soft, hard)) => {
                let mut prlimit = Command::new("prlimit");
                prlimit
                    .arg(format!("--nofile={soft}:{hard}"))
                    .arg("--")
                    .arg(daemon_binary());
                prlimit
            }
            None => Command::new(daemon_binary()),
        };
        let child = command
            .arg("run")
            .args(args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).expect("log file"))
            .spawn()
            .expect("the daemon starts");
        Self {
            child,
            log: log.to_owned(),
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_until_sampling(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            if log.contains("sampling") {
                return;
            }
            let exited = self.child.try_wait().expect("try_wait");
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "the daemon never started sampling ({exited:?}):\n{log}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGTERM, then its exit status and how long it took (killed after 30 s).
    fn terminate(&mut self) -> (ExitStatus, Duration) {
        let sent = Instant::now();
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe { libc::kill(self.pid() as libc::pid_t, libc::SIGTERM) };
        while sent.elapsed() < Duration::from_secs(30) {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return (status, sent.elapsed());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        (self.child.wait().expect("wait"), sent.elapsed())
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A copy of `binary` at `out` whose debug link sections (`.gnu_debuglink`,
/// `.gnu_debugaltlink`) name `target`: a binary's author chooses the files they name.
pub fn with_debug_links_to(binary: &Path, target: &Path, out: &Path) {
    let mut section = target.to_str().expect("utf-8").as_bytes().to_vec();
    section.push(0);
    section.extend_from_slice(&[0xab; 20]);
    let section_file = out.with_extension("link");
    std::fs::write(&section_file, &section).expect("section");
    let status = Command::new("objcopy")
        .arg(format!(
            "--add-section=.gnu_debugaltlink={}",
            section_file.display()
        ))
        .arg(format!(
            "--add-section=.gnu_debuglink={}",
            section_file.display()
        ))
        .arg(binary)
        .arg(out)
        .status()
        .expect("objcopy (binutils)");
    assert!(status.success());
}

/// The values (addresses relative to where the file loads) of a libjvm's two allocation events,
/// for a fake JVM that calls them itself.
pub fn allocation_event_symbols(libjvm: &Path) -> (u64, u64) {
    use object::{Object as _, ObjectSymbol as _};
    let bytes = std::fs::read(libjvm).expect("libjvm readable");
    let elf = object::File::parse(&*bytes).expect("libjvm parses");
    let value = |prefix: &str| {
        elf.symbols()
            .find(|symbol| symbol.name().is_ok_and(|name| name.starts_with(prefix)))
            .map(|symbol| symbol.address())
            .unwrap_or_else(|| panic!("libjvm has {prefix}"))
    };
    (
        value("_ZN11AllocTracer27send_allocation_in_new_tlabE"),
        value("_ZN11AllocTracer28send_allocation_outside_tlabE"),
    )
}
