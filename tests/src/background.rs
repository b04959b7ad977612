//! The daemon running in the background while a test changes the world around it (stops a
//! server, starts subscribers), with its log in a file so that a full pipe never blocks it.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context as _, Result};

use crate::cgroup::MemoryCgroup;
use crate::daemon_binary;

pub struct BackgroundDaemon {
    child: Child,
    log: PathBuf,
}

impl BackgroundDaemon {
    /// Starts `profiler-daemon run ARGS`, logging to `log_dir/daemon.log` what `log_filter` (a
    /// `RUST_LOG` value) lets through. Tests start it with [`DaemonRun`](crate::DaemonRun),
    /// which builds ARGS and calls this.
    pub(crate) fn start(args: &[&str], log_filter: &str, log_dir: &Path) -> Result<Self> {
        Self::start_in(None, args, log_filter, log_dir)
    }

    /// The same, the daemon a member of `cgroup` from its first instruction (a shell joins it,
    /// then execs the daemon), so that every byte it is charged is charged there.
    pub(crate) fn start_in(
        cgroup: Option<&MemoryCgroup>,
        args: &[&str],
        log_filter: &str,
        log_dir: &Path,
    ) -> Result<Self> {
        let log = log_dir.join("daemon.log");
        let file = std::fs::File::create(&log)?;
        let mut command = match cgroup {
            None => Command::new(daemon_binary()),
            Some(cgroup) => {
                let mut shell = Command::new("sh");
                shell
                    .args(["-c", "echo $$ > \"$0\" && exec \"$@\""])
                    .arg(cgroup.procs_file())
                    .arg(daemon_binary());
                shell
            }
        };
        let child = command
            .arg("run")
            .args(args)
            .env("RUST_LOG", log_filter)
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .context("starting the daemon")?;
        Ok(Self { child, log })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `text` (at most `timeout`).
    pub fn wait_for_log(&self, text: &str, timeout: Duration) -> Result<()> {
        let deadline = Instant::now() + timeout;
        while !self.log().contains(text) {
            if Instant::now() > deadline {
                bail!("daemon log never showed {text:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(())
    }

    /// Sends SIGTERM (the daemon writes its last interval and exits).
    pub fn terminate(&self) {
        // SAFETY: kill has no memory preconditions; the pid is our child's.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
    }

    /// Waits for the daemon to exit (at most `timeout`) and returns its status and full log.
    pub fn wait(mut self, timeout: Duration) -> Result<(ExitStatus, String)> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait()? {
                let log = self.log();
                eprintln!("--- daemon log ---\n{log}");
                return Ok((status, log));
            }
            if Instant::now() > deadline {
                bail!("daemon did not exit within {timeout:?}:\n{}", self.log());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for BackgroundDaemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
