//! When the daemon loads the sidecar agent into a JVM it found: `attach = "auto"` (with optional
//! allow and deny lists matched against the command line) or `"never"` (the default: the agent
//! changes the JVM, and JDK 21+ print a warning on dynamic loads, so it is opt-in).
//!
//! The JVM tracker decides, from its view of the host's JVMs: a JVM is considered once its
//! layout is ready and its samples show Java frames (JVMs that have samples: an idle JVM is
//! never changed). The symbolizer only learns, through [`AttachesStarted`], which JVMs'
//! records to expect.
//!
//! Attaching blocks for up to several seconds (a JVM without attach listener), so each attach
//! runs on its own short-lived thread, a few at a time, at most once per JVM; only an attach
//! refused because the JVM's socket was someone else's is tried again, later (the other user's
//! socket may be gone by then). JVMs that already have an agent (its records file present:
//! `-agentpath:` or an earlier attach) are left alone.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::attach::{NotTheJvmsSocket, Target};
use super::records_location::RecordsLocation;
use crate::config_error::{invalid, ConfigError};

/// Attaches running at once.
const MAX_IN_FLIGHT: usize = 2;
/// How long after an attach refused for a socket that was not the JVM's it is tried again, and
/// how many times.
const RETRY_AFTER: Duration = Duration::from_secs(60);
const MAX_ATTEMPTS: u32 = 4;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum AttachMode {
    Auto,
    #[default]
    Never,
}

impl std::str::FromStr for AttachMode {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "never" => Ok(Self::Never),
            other => Err(format!("{other:?} is neither \"auto\" nor \"never\"")),
        }
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AttachPolicy {
    pub mode: AttachMode,
    /// If not empty, only JVMs whose command line contains one of these.
    pub allow: Vec<String>,
    /// JVMs whose command line contains one of these are never attached (wins over `allow`).
    pub deny: Vec<String>,
    /// The agent library [default: libprofiler_jvmti.so beside the daemon executable].
    pub agent: Option<PathBuf>,
}

impl AttachPolicy {
    /// The attach keys: `attach` (or `--attach`, which wins), `attach_allow`, `attach_deny`,
    /// `agent_path`.
    pub fn resolve(
        flag: Option<String>,
        mode: Option<String>,
        allow: Option<Vec<String>>,
        deny: Option<Vec<String>>,
        agent: Option<PathBuf>,
    ) -> Result<Self, ConfigError> {
        let mode = match (flag, mode) {
            (Some(flag), _) => flag.parse().map_err(|reason| ConfigError::Invalid {
                field: "attach",
                flag: Some("attach"),
                reason,
            })?,
            (None, Some(value)) => value.parse().map_err(|reason| invalid("attach", reason))?,
            (None, None) => AttachMode::Never,
        };
        let policy = Self {
            mode,
            allow: allow.unwrap_or_default(),
            deny: deny.unwrap_or_default(),
            agent,
        };
        if policy
            .allow
            .iter()
            .chain(&policy.deny)
            .any(String::is_empty)
        {
            return Err(invalid("attach_allow", "empty patterns match everything"));
        }
        Ok(policy)
    }

    /// Whether a JVM with this command line may get the agent.
    pub fn allows(&self, command_line: &str) -> bool {
        self.mode == AttachMode::Auto
            && !self.deny.iter().any(|p| command_line.contains(p.as_str()))
            && (self.allow.is_empty()
                || self.allow.iter().any(|p| command_line.contains(p.as_str())))
    }

    pub(crate) fn agent_path(&self) -> Option<PathBuf> {
        self.agent.clone().or_else(|| {
            std::env::current_exe()
                .ok()
                .map(|exe| exe.with_file_name("libprofiler_jvmti.so"))
        })
    }
}

/// A JVM: its pid and start time (pids are reused).
type JvmKey = (u32, u64);

/// Applies the policy to the JVMs the tracker reports sampled.
#[derive(Default)]
pub struct Attacher {
    policy: AttachPolicy,
    /// JVMs already considered, and the attaches started for each.
    tried: HashMap<JvmKey, u32>,
    /// JVMs to try again, and from when: set by the attach threads.
    retries: Retries,
    started: AttachesStarted,
    in_flight: Arc<AtomicUsize>,
    /// The options each agent is loaded with (`alloc_interval=N` with allocation profiles).
    agent_options: String,
}

/// The pids an attach was started for (it may still be under way, or have failed): their
/// agent's records are expected soon. Written by the tracker's [`Attacher`], read by the
/// symbolizer, which looks for records more often while one is expected.
#[derive(Clone, Default)]
pub struct AttachesStarted(Arc<Mutex<HashSet<u32>>>);

impl AttachesStarted {
    pub fn contains(&self, pid: u32) -> bool {
        self.0.lock().is_ok_and(|started| started.contains(&pid))
    }

    fn insert(&self, pid: u32) {
        if let Ok(mut started) = self.0.lock() {
            started.insert(pid);
        }
    }

    fn remove(&self, pid: u32) {
        if let Ok(mut started) = self.0.lock() {
            started.remove(&pid);
        }
    }
}

/// When JVMs whose attach was refused for a socket that was not theirs may be tried again.
#[derive(Clone, Default)]
struct Retries(Arc<Mutex<HashMap<JvmKey, Instant>>>);

impl Retries {
    fn schedule(&self, jvm: JvmKey, at: Instant) {
        if let Ok(mut due) = self.0.lock() {
            due.insert(jvm, at);
        }
    }

    /// Whether `jvm`'s retry is due at `now` (then it is taken: one retry per schedule).
    fn take_due(&self, jvm: JvmKey, now: Instant) -> bool {
        let Ok(mut due) = self.0.lock() else {
            return false;
        };
        match due.get(&jvm) {
            Some(at) if *at <= now => {
                due.remove(&jvm);
                true
            }
            _ => false,
        }
    }

    fn forget(&self, pid: u32) {
        if let Ok(mut due) = self.0.lock() {
            due.retain(|(due_pid, _), _| *due_pid != pid);
        }
    }
}

/// Whether the JVM's agent already writes its records (`-agentpath`, or an earlier attach): a
/// regular file of the JVM's user at its records path, written by an agent of this process (not
/// left by a dead process with the same pid). Looked for as the records are read
/// ([`RecordsLocation`]): a link, FIFO or file of another user planted there does not count, and
/// nothing there can make the look block.
fn agent_records_present(target: &Target) -> bool {
    RecordsLocation::new(target.pid, target.nspid, target.euid)
        .open(u64::MAX)
        .is_ok_and(|file| file.is_some())
}

impl Attacher {
    pub fn new(policy: AttachPolicy, started: AttachesStarted) -> Self {
        Self {
            policy,
            started,
            ..Self::default()
        }
    }

    /// Agents are loaded with HotSpot's allocation sampler on, one object per about
    /// `interval_bytes` (the allocation profiles' interval): `profiler-ebpf/src/alloc.rs`.
    pub fn with_allocation_sampling(mut self, interval_bytes: u64) -> Self {
        // SetHeapSamplingInterval takes an int; the configured bound (1 GiB) fits.
        let interval = interval_bytes.min(i32::MAX as u64);
        self.agent_options = format!("alloc_interval={interval}");
        self
    }

    /// Starts an attach to the JVM `pid` (started at `start_time`, in clock ticks since boot,
    /// of JDK `major`) if the policy wants one and none was tried (or a retry is due).
    pub fn consider(&mut self, pid: u32, start_time: u64, major: u32) {
        let jvm = (pid, start_time);
        if self.policy.mode == AttachMode::Never
            || (self.tried.contains_key(&jvm) && !self.retries.take_due(jvm, Instant::now()))
        {
            return;
        }
        if major <= 8 {
            // Its agent would record no `Method*` (the daemon names its frames from memory
            // anyway), and enabling compiled-method events can crash 8u before 382
            // (JDK-8305165). Declined once per JVM.
            self.tried.insert(jvm, 0);
            tracing::info!(
                pid,
                "sidecar: not attaching to this JVM: JDK 8, its frames are named from its memory"
            );
            return;
        }
        if self.in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            // Tried again when it is next sampled.
            return;
        }
        let attempts = self.tried.entry(jvm).or_insert(0);
        *attempts += 1;
        let attempt = *attempts;
        if !self
            .policy
            .allows(&crate::process::read_command_line(pid).join(" "))
        {
            tracing::debug!(
                pid,
                "sidecar: attach not allowed by attach_allow/attach_deny"
            );
            return;
        }
        let Ok(target) = Target::of(pid) else {
            return;
        };
        if agent_records_present(&target) {
            tracing::info!(pid, "sidecar: agent already loaded");
            return;
        }
        let Some(agent) = self.policy.agent_path() else {
            return;
        };
        let in_flight = self.in_flight.clone();
        in_flight.fetch_add(1, Ordering::AcqRel);
        let retries = self.retries.clone();
        let options = self.agent_options.clone();
        let spawned = std::thread::Builder::new()
            .name("sidecar-attach".into())
            .spawn({
                let in_flight = in_flight.clone();
                move || {
                    match super::attach(pid, &agent, &options) {
                        Ok(attached) => tracing::info!(
                            pid,
                            elapsed_ms = attached.elapsed.as_millis() as u64,
                            agent = %attached.agent_path.display(),
                            "sidecar: agent loaded"
                        ),
                        Err(err) => {
                            let retry = err.downcast_ref::<NotTheJvmsSocket>().is_some()
                                && attempt < MAX_ATTEMPTS;
                            if retry {
                                retries.schedule(jvm, Instant::now() + RETRY_AFTER);
                            }
                            tracing::warn!(
                                pid,
                                attempt,
                                retry_in_s = retry.then_some(RETRY_AFTER.as_secs()),
                                "sidecar: cannot load the agent ({err:#}); Java frames are \
                                 named from the JVM's memory"
                            );
                        }
                    }
                    in_flight.fetch_sub(1, Ordering::AcqRel);
                }
            });
        match spawned {
            Ok(_) => {
                self.started.insert(pid);
            }
            Err(_) => {
                in_flight.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    /// Forgets the JVMs `alive` no longer knows (by pid and start time: pids are reused).
    pub fn retain(&mut self, alive: impl Fn(u32, u64) -> bool) {
        let (retries, started) = (&self.retries, &self.started);
        self.tried.retain(|&(pid, start_time), _| {
            let keep = alive(pid, start_time);
            if !keep {
                retries.forget(pid);
                started.remove(pid);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    #[test]
    fn a_retry_is_due_once_at_its_time() {
        let retries = Retries::default();
        let now = Instant::now();
        let jvm = (42, 7);
        assert!(!retries.take_due(jvm, now), "nothing scheduled");
        retries.schedule(jvm, now + RETRY_AFTER);
        assert!(!retries.take_due(jvm, now), "not yet");
        assert!(retries.take_due(jvm, now + RETRY_AFTER));
        assert!(!retries.take_due(jvm, now + RETRY_AFTER), "taken");
        retries.schedule(jvm, now);
        retries.forget(42);
        assert!(!retries.take_due(jvm, now), "forgotten with its JVM");
    }

    #[test]
    fn only_the_jvm_users_own_records_file_means_an_agent() {
        // Our own process stands for the JVM, with an nspid no process has, so that its records
        // directory is this test's alone.
        // SAFETY: a plain getter.
        let euid = unsafe { libc::geteuid() };
        let target = Target {
            pid: std::process::id(),
            nspid: 4_000_000 + std::process::id() % 100_000,
            euid,
            egid: 0,
        };
        let dir = profiler_jvmti_records::channel::records_dir(target.nspid);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).expect("records dir");
        let records = dir.join(profiler_jvmti_records::channel::RECORDS_FILE);

        assert!(!agent_records_present(&target), "no file");
        // Links to a file the JVM's user owns, to a FIFO: planted, not an agent's.
        let elsewhere = dir.join("elsewhere");
        std::fs::write(&elsewhere, b"").expect("file");
        std::os::unix::fs::symlink(&elsewhere, &records).expect("symlink");
        assert!(!agent_records_present(&target), "a link");
        std::fs::remove_file(&records).expect("rm");
        let fifo = std::ffi::CString::new(records.to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert!(!agent_records_present(&target), "a FIFO, and no wait on it");
        std::fs::remove_file(&records).expect("rm");
        // Another user's file.
        std::fs::write(&records, b"").expect("file");
        std::fs::set_permissions(&records, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = std::ffi::CString::new(records.to_str().expect("utf-8")).expect("path");
        // SAFETY: a valid path.
        let chowned = unsafe { libc::chown(path.as_ptr(), euid + 1, u32::MAX) } == 0;
        if chowned {
            assert!(!agent_records_present(&target), "another user's file");
            // SAFETY: a valid path.
            assert_eq!(unsafe { libc::chown(path.as_ptr(), euid, u32::MAX) }, 0);
        }
        assert!(agent_records_present(&target), "the JVM user's own file");
        std::fs::remove_dir_all(&dir).expect("cleanup");
    }

    #[test]
    fn a_jdk_8_jvm_is_declined_until_it_exits() {
        let started = AttachesStarted::default();
        let policy = AttachPolicy {
            mode: AttachMode::Auto,
            ..AttachPolicy::default()
        };
        let mut attacher = Attacher::new(policy, started.clone());
        // A pid no process has: no attach could start either; what is checked is that the JVM
        // is recorded as tried (declined once) and nothing starts.
        let (pid, start_time) = (u32::MAX - 7, 42);
        attacher.consider(pid, start_time, 8);
        attacher.consider(pid, start_time, 8);
        assert!(!started.contains(pid));
        assert!(attacher.tried.contains_key(&(pid, start_time)));
        attacher.retain(|_, _| false);
        assert!(!attacher.tried.contains_key(&(pid, start_time)));
    }

    #[test]
    fn deny_wins_and_an_empty_allow_list_allows_all() {
        let policy = AttachPolicy {
            mode: AttachMode::Auto,
            allow: vec![],
            deny: vec!["kafka".into()],
            agent: None,
        };
        assert!(policy.allows("java -jar app.jar"));
        assert!(!policy.allows("java kafka.Kafka server.properties"));
        let policy = AttachPolicy {
            allow: vec!["app.jar".into()],
            ..policy
        };
        assert!(policy.allows("java -jar app.jar"));
        assert!(!policy.allows("java -jar other.jar"));
        let never = AttachPolicy {
            mode: AttachMode::Never,
            ..policy
        };
        assert!(!never.allows("java -jar app.jar"));
        assert_eq!("auto".parse(), Ok(AttachMode::Auto));
        assert!("always".parse::<AttachMode>().is_err());
    }
}
