//! Local output: one gzipped pprof file (and optionally an SVG flame graph) per process per
//! interval, under a retention policy, named as `file_name` says; `view` merges them back into
//! one flame graph per service, process or host.
//!
//! Files are written under a temporary name and renamed, so a reader never sees half a file.
//! They are the daemon's user's alone by default (0600, in a directory created 0700): profiles
//! name every process's functions, threads and services, and the daemon sees every user's.

pub mod file_name;
pub mod flamegraph;
pub mod retention;
pub mod view;

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::pprof::proto;
use crate::profile_model::ProfileKind;
use crate::sink::{Sink, SinkProfile};
use crate::thread_roots::ThreadRoots;
use crate::worker_metrics::WorkerCounters;
use file_name::file_stem;
use retention::{Ledger, Removed, Retention};

/// What the local output writes, and how long it keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalOutput {
    pub flame_graphs: bool,
    pub retention: Retention,
    /// Permission bits of the files written (see [`directory_mode`] for the directory).
    pub file_mode: u32,
}

pub const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;
/// The daemon's user only.
pub const DEFAULT_FILE_MODE: u32 = 0o600;

/// `output_mode` as written (octal: `"0640"`, `"640"` or `"0o640"`): permission bits only, and
/// the owner must keep read and write (the daemon rereads and deletes its files).
pub fn parse_mode(text: &str) -> Result<u32, String> {
    let digits = text.strip_prefix("0o").unwrap_or(text);
    let mode = match u32::from_str_radix(digits, 8) {
        Ok(mode) if !digits.is_empty() && !digits.starts_with('+') => mode,
        _ => return Err(format!("{text:?} is not an octal mode such as \"0640\"")),
    };
    if mode > 0o777 {
        return Err(format!(
            "{text:?}: only permission bits (at most 0777), no setuid, setgid or sticky bit"
        ));
    }
    if mode & 0o600 != 0o600 {
        return Err(format!(
            "{text:?} must let the owner read and write (0600 at least)"
        ));
    }
    Ok(mode)
}

/// The mode of an output directory the daemon creates for files of `file_mode`: the same,
/// plus search (x) wherever read is granted (0600 -> 0700, 0640 -> 0750).
pub fn directory_mode(file_mode: u32) -> u32 {
    file_mode | (file_mode & 0o444) >> 2
}

impl LocalOutput {
    /// The local output's keys: `flame_graphs` (default off: an SVG per process per interval
    /// tells nothing its pprof file beside it does not, and drawing them was a seventh of the
    /// daemon's CPU with 20 JVMs; `profiler-daemon view` draws any window of them on demand),
    /// `retention_max_age_secs` and `retention_max_bytes` (0: no bound).
    pub fn resolve(
        flame_graphs: Option<bool>,
        retention_max_age_secs: Option<u64>,
        retention_max_bytes: Option<u64>,
        file_mode: Option<u32>,
    ) -> Self {
        let max_age = retention_max_age_secs.unwrap_or(DEFAULT_RETENTION_AGE.as_secs());
        let max_bytes = retention_max_bytes.unwrap_or(DEFAULT_RETENTION_BYTES);
        Self {
            flame_graphs: flame_graphs.unwrap_or(false),
            retention: Retention {
                max_age: (max_age > 0).then(|| Duration::from_secs(max_age)),
                max_bytes: (max_bytes > 0).then_some(max_bytes),
            },
            file_mode: file_mode.unwrap_or(DEFAULT_FILE_MODE),
        }
    }
}

pub struct LocalWriter {
    dir: PathBuf,
    options: LocalOutput,
    /// The files written (and found at start), for the retention policy.
    ledger: Ledger,
}

/// One profile as the local output writes it.
pub struct LocalProfile<'a> {
    pub kind: ProfileKind,
    pub start: SystemTime,
    pub pid: u32,
    pub comm: &'a str,
    pub service: &'a str,
    pub profile: &'a proto::Profile,
    /// `profile`, encoded.
    pub gzipped: &'a [u8],
    /// How the flame graph shows threads (the pprof file labels every sample with its thread).
    pub threads: ThreadRoots,
}

impl LocalWriter {
    /// Creates `dir` (and its missing parents) with [`directory_mode`] if it does not exist; an
    /// existing one is left as it is (it may be shared), with a warning if others may list it.
    pub fn new(dir: &Path, options: LocalOutput) -> std::io::Result<Self> {
        let mode = directory_mode(options.file_mode);
        match std::fs::metadata(dir) {
            Ok(existing) => {
                let wider = existing.permissions().mode() & 0o777 & !mode;
                if wider & 0o077 != 0 {
                    tracing::warn!(
                        dir = %dir.display(),
                        mode = format!("{:04o}", existing.permissions().mode() & 0o7777),
                        files = format!("{:04o}", options.file_mode),
                        "the output directory lets other users list the profiles' names \
                         (pids, process and service names); its files are written with the \
                         files' mode"
                    );
                }
            }
            Err(_) => {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(mode)
                    .create(dir)?;
                // The umask may have taken bits the mode asks for.
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))?;
            }
        }
        Ok(Self {
            dir: dir.to_owned(),
            options,
            ledger: Ledger::new(dir, options.retention),
        })
    }

    /// Writes `<kind>-<UTC time>-<pid>-<comm>@<service>.pb.gz` (see [`file_name`]) and, with
    /// flame graphs on, `.svg`; returns the pprof file's path.
    pub fn write(&mut self, local: &LocalProfile<'_>) -> std::io::Result<PathBuf> {
        let LocalProfile {
            kind,
            start,
            pid,
            comm,
            service,
            profile,
            gzipped,
            threads,
        } = *local;
        let stem = file_stem(kind, start, pid, comm, service);
        let path = self.write_atomically(&format!("{stem}.pb.gz"), gzipped)?;
        // A flame graph of nothing is no use (and inferno refuses it).
        if self.options.flame_graphs && !profile.sample.is_empty() {
            let title = format!(
                "{}: {comm} (pid {pid}), {}",
                kind.title(),
                humantime::format_rfc3339_seconds(start)
            );
            let count_name = kind.counted();
            if let Some(svg) = flamegraph::render_svg(profile, threads, &title, count_name)? {
                self.write_atomically(&format!("{stem}.svg"), &svg)?;
            }
        }
        Ok(path)
    }

    fn write_atomically(&mut self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.dir.join(name);
        let temporary = self.dir.join(format!(".{name}.tmp"));
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(self.options.file_mode)
            // A link put in the directory is never written through.
            .custom_flags(libc::O_NOFOLLOW)
            .open(&temporary)?;
        // Whatever the umask, and a leftover temporary file's mode, the file gets the mode set.
        file.set_permissions(std::fs::Permissions::from_mode(self.options.file_mode))?;
        file.write_all(bytes)?;
        drop(file);
        std::fs::rename(&temporary, &path)?;
        self.ledger
            .wrote(name, SystemTime::now(), bytes.len() as u64);
        Ok(path)
    }

    /// Deletes what the retention policy no longer keeps.
    pub fn enforce_retention(&mut self) -> std::io::Result<Removed> {
        self.ledger.enforce(SystemTime::now())
    }
}

/// The local output as a sink: counts what it writes and what it cannot, and enforces the
/// retention policy at the end of each interval.
pub struct LocalFiles {
    writer: LocalWriter,
    counters: Arc<WorkerCounters>,
}

impl LocalFiles {
    pub fn new(
        dir: &Path,
        options: LocalOutput,
        counters: Arc<WorkerCounters>,
    ) -> std::io::Result<Self> {
        let writer = LocalWriter::new(dir, options)?;
        Ok(Self { writer, counters })
    }
}

impl Sink for LocalFiles {
    fn accept(&mut self, shared: &SinkProfile<'_>) {
        let profile = shared.profile;
        let written = shared
            .local_pprof()
            .map_err(|err| err.to_string())
            .and_then(|local| {
                self.writer
                    .write(&LocalProfile {
                        kind: profile.kind,
                        start: profile.start,
                        pid: profile.pid,
                        comm: &profile.comm,
                        service: shared.service_name,
                        profile: &local.profile,
                        gzipped: &local.gzipped,
                        threads: shared.presentation.threads,
                    })
                    .map_err(|err| err.to_string())
            });
        match written {
            Ok(_) => self
                .counters
                .profiles_written
                .fetch_add(1, Ordering::Relaxed),
            Err(err) => {
                tracing::error!(pid = profile.pid, %err, "cannot write profile");
                self.counters.write_errors.fetch_add(1, Ordering::Relaxed)
            }
        };
    }

    fn end_interval(&mut self) {
        match self.writer.enforce_retention() {
            Ok(removed) if removed.files > 0 => tracing::info!(
                files = removed.files,
                bytes = removed.bytes,
                "retention: old profiles deleted"
            ),
            Ok(_) => {}
            Err(err) => tracing::warn!(%err, "retention: cannot clean the output directory"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile_model::testing::cpu_profile;

    #[test]
    fn writes_a_readable_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = LocalOutput {
            flame_graphs: true,
            retention: Retention {
                max_age: None,
                max_bytes: None,
            },
            file_mode: DEFAULT_FILE_MODE,
        };
        let mut writer =
            LocalWriter::new(&dir.path().join("out"), options).expect("creates the directory");
        let profile = crate::pprof::encode(&cpu_profile(&[(&["main"], 3, None)]), true);
        let path = writer
            .write(&LocalProfile {
                kind: ProfileKind::Cpu,
                start: SystemTime::now(),
                pid: 1,
                comm: "x",
                service: "svc/x",
                profile: &profile,
                gzipped: &crate::pprof::encode_gzipped(&profile).expect("encodes"),
                threads: ThreadRoots::Pool,
            })
            .expect("writes");
        let name = path.file_name().and_then(|n| n.to_str()).expect("utf-8");
        let parsed = file_name::ProfileFileName::parse(name).expect("a profile's name");
        assert_eq!((parsed.pid, parsed.comm), (1, "x"));
        assert_eq!(parsed.service_name().as_deref(), Some("svc/x"));
        let back = crate::pprof::decode(&std::fs::read(&path).expect("reads")).expect("decodes");
        assert_eq!(back, profile);
        let svg = path.to_string_lossy().replace(".pb.gz", ".svg");
        assert!(std::fs::read_to_string(svg)
            .expect("a flame graph beside it")
            .contains("<svg"));
    }

    fn mode_of(path: &Path) -> u32 {
        std::fs::metadata(path).expect("stat").permissions().mode() & 0o7777
    }

    /// Writes one small profile with `file_mode` into `dir`; the pprof file's path.
    fn write_one(dir: &Path, file_mode: u32) -> PathBuf {
        let options = LocalOutput {
            flame_graphs: true,
            retention: Retention {
                max_age: None,
                max_bytes: None,
            },
            file_mode,
        };
        let mut writer = LocalWriter::new(dir, options).expect("the directory");
        let profile = crate::pprof::encode(&cpu_profile(&[(&["main"], 3, None)]), true);
        writer
            .write(&LocalProfile {
                kind: ProfileKind::Cpu,
                start: SystemTime::now(),
                pid: 1,
                comm: "x",
                service: "svc/x",
                profile: &profile,
                gzipped: &crate::pprof::encode_gzipped(&profile).expect("encodes"),
                threads: ThreadRoots::Pool,
            })
            .expect("writes")
    }

    #[test]
    fn output_is_the_owners_alone_unless_a_mode_is_set() {
        let root = tempfile::tempdir().expect("tempdir");
        // Private by default, whatever the umask lets through (tests run with 022 or 002).
        let dir = root.path().join("private/profiles");
        let path = write_one(&dir, DEFAULT_FILE_MODE);
        assert_eq!(mode_of(&dir), 0o700);
        assert_eq!(mode_of(&path), 0o600);
        let svg = PathBuf::from(path.to_string_lossy().replace(".pb.gz", ".svg"));
        assert_eq!(mode_of(&svg), 0o600);
        // A mode set: for a group of readers.
        let dir = root.path().join("shared");
        let path = write_one(&dir, 0o640);
        assert_eq!((mode_of(&dir), mode_of(&path)), (0o750, 0o640));
        // An existing directory is left as it is; its files still get the mode.
        let existing = root.path().join("existing");
        std::fs::create_dir(&existing).expect("mkdir");
        std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let path = write_one(&existing, DEFAULT_FILE_MODE);
        assert_eq!((mode_of(&existing), mode_of(&path)), (0o755, 0o600));
    }

    #[test]
    fn a_leftover_temporary_file_gets_the_mode_and_a_link_is_not_followed() {
        let root = tempfile::tempdir().expect("tempdir");
        let dir = root.path().join("out");
        let options = LocalOutput {
            flame_graphs: false,
            retention: Retention {
                max_age: None,
                max_bytes: None,
            },
            file_mode: DEFAULT_FILE_MODE,
        };
        let mut writer = LocalWriter::new(&dir, options).expect("the directory");
        // A world-readable temporary file left by a crash is reused with the mode.
        let leftover = dir.join(".a.pb.gz.tmp");
        std::fs::write(&leftover, b"old").expect("write");
        std::fs::set_permissions(&leftover, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let path = writer.write_atomically("a.pb.gz", b"new").expect("writes");
        assert_eq!(mode_of(&path), 0o600);
        assert_eq!(std::fs::read(&path).expect("read"), b"new");
        // A link at a temporary name: the write fails rather than write through it.
        let target = root.path().join("target");
        std::fs::write(&target, b"").expect("write");
        std::os::unix::fs::symlink(&target, dir.join(".b.pb.gz.tmp")).expect("symlink");
        let error = writer
            .write_atomically("b.pb.gz", b"profile")
            .expect_err("a link is refused");
        assert_eq!(error.raw_os_error(), Some(libc::ELOOP), "{error}");
        assert_eq!(std::fs::read(&target).expect("read"), b"");
    }

    #[test]
    fn modes_are_octal_permission_bits_the_owner_can_read_and_write() {
        assert_eq!(parse_mode("0600"), Ok(0o600));
        assert_eq!(parse_mode("640"), Ok(0o640));
        assert_eq!(parse_mode("0o644"), Ok(0o644));
        for bad in [
            "",
            "0o",
            "rw-r-----",
            "0680",
            "+600",
            "4600",
            "0400",
            "0200",
            "-600",
        ] {
            assert!(parse_mode(bad).is_err(), "{bad:?}");
        }
        assert_eq!(directory_mode(0o600), 0o700);
        assert_eq!(directory_mode(0o640), 0o750);
        assert_eq!(directory_mode(0o644), 0o755);
        assert_eq!(directory_mode(0o660), 0o770);
    }
}
