//! Local output: one gzipped pprof file (and optionally an SVG flame graph) per process per
//! interval, under a retention policy, named as `file_name` says; `view` merges them back into
//! one flame graph per service, process or host.
//!
//! Files are written under a temporary name and renamed, so a reader never sees half a file.

pub mod file_name;
pub mod flamegraph;
pub mod retention;
pub mod view;

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use crate::metrics::WorkerCounters;
use crate::pprof::proto;
use crate::profiles::ProfileKind;
use crate::sink::{Sink, SinkProfile};
use crate::thread_roots::ThreadRoots;
use file_name::file_stem;
use retention::{Removed, Retention};

/// What the local output writes, and how long it keeps it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalOutput {
    pub flame_graphs: bool,
    pub retention: Retention,
}

pub const DEFAULT_RETENTION_AGE: Duration = Duration::from_secs(24 * 3600);
pub const DEFAULT_RETENTION_BYTES: u64 = 1 << 30;

impl LocalOutput {
    /// The local output's keys: `flame_graphs` (default: on only without a backend, since an
    /// SVG per process per interval costs CPU and with a backend people look there),
    /// `retention_max_age_secs` and `retention_max_bytes` (0: no bound).
    pub fn resolve(
        flame_graphs: Option<bool>,
        retention_max_age_secs: Option<u64>,
        retention_max_bytes: Option<u64>,
        has_backend: bool,
    ) -> Self {
        let max_age = retention_max_age_secs.unwrap_or(DEFAULT_RETENTION_AGE.as_secs());
        let max_bytes = retention_max_bytes.unwrap_or(DEFAULT_RETENTION_BYTES);
        Self {
            flame_graphs: flame_graphs.unwrap_or(!has_backend),
            retention: Retention {
                max_age: (max_age > 0).then(|| Duration::from_secs(max_age)),
                max_bytes: (max_bytes > 0).then_some(max_bytes),
            },
        }
    }
}

pub struct LocalWriter {
    dir: PathBuf,
    options: LocalOutput,
    /// How the flame graphs show threads (the pprof files label every sample with its thread).
    threads: ThreadRoots,
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
}

impl LocalWriter {
    pub fn new(dir: &Path, options: LocalOutput, threads: ThreadRoots) -> std::io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        Ok(Self {
            dir: dir.to_owned(),
            options,
            threads,
        })
    }

    /// Writes `<kind>-<UTC time>-<pid>-<comm>@<service>.pb.gz` (see [`file_name`]) and, with
    /// flame graphs on, `.svg`; returns the pprof file's path.
    pub fn write(&self, local: &LocalProfile<'_>) -> std::io::Result<PathBuf> {
        let LocalProfile {
            kind,
            start,
            pid,
            comm,
            service,
            profile,
            gzipped,
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
            if let Some(svg) = flamegraph::render_svg(profile, self.threads, &title, count_name)? {
                self.write_atomically(&format!("{stem}.svg"), &svg)?;
            }
        }
        Ok(path)
    }

    fn write_atomically(&self, name: &str, bytes: &[u8]) -> std::io::Result<PathBuf> {
        let path = self.dir.join(name);
        let temporary = self.dir.join(format!(".{name}.tmp"));
        std::fs::write(&temporary, bytes)?;
        std::fs::rename(&temporary, &path)?;
        Ok(path)
    }

    /// Deletes what the retention policy no longer keeps.
    pub fn enforce_retention(&self) -> std::io::Result<Removed> {
        retention::enforce(&self.dir, self.options.retention, SystemTime::now())
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
        threads: ThreadRoots,
        counters: Arc<WorkerCounters>,
    ) -> std::io::Result<Self> {
        let writer = LocalWriter::new(dir, options, threads)?;
        Ok(Self { writer, counters })
    }
}

impl Sink for LocalFiles {
    fn name(&self) -> &'static str {
        "local files"
    }

    fn accept(&mut self, profile: &SinkProfile<'_>) {
        let built = profile.built;
        let written = self.writer.write(&LocalProfile {
            kind: profile.kind,
            start: profile.start,
            pid: built.pid,
            comm: &built.comm,
            service: profile.service_name,
            profile: &built.profile,
            gzipped: profile.gzipped,
        });
        match written {
            Ok(_) => self
                .counters
                .profiles_written
                .fetch_add(1, Ordering::Relaxed),
            Err(err) => {
                tracing::error!(pid = built.pid, %err, "cannot write profile");
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

    #[test]
    fn writes_a_readable_profile() {
        let dir = tempfile::tempdir().expect("tempdir");
        let options = LocalOutput {
            flame_graphs: true,
            retention: Retention {
                max_age: None,
                max_bytes: None,
            },
        };
        let writer = LocalWriter::new(&dir.path().join("out"), options, ThreadRoots::Pool)
            .expect("creates the directory");
        let mut builder = crate::pprof::ProfileBuilder::new_cpu(
            19,
            SystemTime::now(),
            std::time::Duration::from_secs(1),
        );
        let frame = crate::symbolize::ResolvedFrame::named("main", None);
        let location = builder.location(crate::pprof::LocationKey::User(1), 1, &frame);
        builder.add_sample(vec![location], 3, &[]);
        let profile = builder.finish();
        let path = writer
            .write(&LocalProfile {
                kind: ProfileKind::Cpu,
                start: SystemTime::now(),
                pid: 1,
                comm: "x",
                service: "svc/x",
                profile: &profile,
                gzipped: &crate::pprof::encode_gzipped(&profile).expect("encodes"),
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
}
