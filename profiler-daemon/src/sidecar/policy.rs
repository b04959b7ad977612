//! When the daemon loads the sidecar agent into a JVM it found: `attach = "auto"` (with optional
//! allow and deny lists matched against the command line) or `"never"` (the default: the agent
//! changes the JVM, and JDK 21+ print a warning on dynamic loads, so it is opt-in).
//!
//! Attaching blocks for up to several seconds (a JVM without attach listener), so each attach
//! runs on its own short-lived thread, a few at a time, at most once per JVM. JVMs that already
//! have an agent (records file present: `-agentpath:` or an earlier attach) are left alone.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::config_error::{invalid, ConfigError};
use crate::process::ProcessInfo;

/// Attaches running at once.
const MAX_IN_FLIGHT: usize = 2;

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

    fn agent_path(&self) -> Option<PathBuf> {
        self.agent.clone().or_else(|| {
            std::env::current_exe()
                .ok()
                .map(|exe| exe.with_file_name("libprofiler_jvmti.so"))
        })
    }
}

/// Applies the policy to the JVMs the symbolizer meets.
#[derive(Default)]
pub struct Attacher {
    policy: AttachPolicy,
    /// (pid, start time) of JVMs already considered: one attempt per JVM.
    tried: HashSet<(u32, u64)>,
    /// Pids an attach was started for: their agent's records are expected soon.
    started: HashSet<u32>,
    in_flight: Arc<AtomicUsize>,
}

impl Attacher {
    pub fn new(policy: AttachPolicy) -> Self {
        Self {
            policy,
            ..Self::default()
        }
    }

    /// Starts an attach to `process` (a JVM) if the policy wants one and none was tried.
    pub fn consider(&mut self, process: &ProcessInfo) {
        if self.policy.mode == AttachMode::Never
            || self.tried.contains(&(process.pid, process.start_time))
        {
            return;
        }
        if self.in_flight.load(Ordering::Acquire) >= MAX_IN_FLIGHT {
            // Tried again at its next symbolization.
            return;
        }
        self.tried.insert((process.pid, process.start_time));
        let pid = process.pid;
        if !self.policy.allows(&process.command_line.join(" ")) {
            tracing::debug!(
                pid,
                "sidecar: attach not allowed by attach_allow/attach_deny"
            );
            return;
        }
        let Ok(target) = super::attach::Target::of(pid) else {
            return;
        };
        let records = target.host_path(
            &profiler_jvmti_records::channel::records_dir(target.nspid)
                .join(profiler_jvmti_records::channel::RECORDS_FILE),
        );
        if records.exists() {
            tracing::info!(pid, "sidecar: agent already loaded");
            return;
        }
        let Some(agent) = self.policy.agent_path() else {
            return;
        };
        let in_flight = self.in_flight.clone();
        in_flight.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name("sidecar-attach".into())
            .spawn({
                let in_flight = in_flight.clone();
                move || {
                    match super::attach(pid, &agent, "") {
                        Ok(attached) => tracing::info!(
                            pid,
                            elapsed_ms = attached.elapsed.as_millis() as u64,
                            agent = %attached.agent_path.display(),
                            "sidecar: agent loaded"
                        ),
                        Err(err) => tracing::warn!(
                            pid,
                            "sidecar: cannot load the agent ({err:#}); Java frames are named \
                             from the JVM's memory"
                        ),
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

    /// Whether an attach to `pid` was started (it may still be under way, or have failed).
    pub fn started(&self, pid: u32) -> bool {
        self.started.contains(&pid)
    }

    /// Forgets JVMs that exited (pids are reused).
    pub fn retain(&mut self, alive: impl Fn(u32) -> bool) {
        self.tried.retain(|(pid, _)| alive(*pid));
        self.started.retain(|pid| alive(*pid));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
