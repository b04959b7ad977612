//! Where a test JVM's sidecar agent keeps its records: the directory named after its pid, or,
//! when a directory of another user holds that name (pids are reused, and JVMs killed by
//! earlier tests leave theirs), the agent's fallback next to it.

use std::os::unix::fs::MetadataExt as _;
use std::path::PathBuf;

/// The records file of JVM `pid` (a JVM in our pid namespace), as the daemon would pick it:
/// the JVM user's own directory of that pid, else the newest fallback of that user. The
/// default path when neither exists (yet).
pub fn agent_records_file(pid: u32) -> PathBuf {
    let tmp = PathBuf::from(format!("/proc/{pid}/root/tmp"));
    let own = tmp.join(format!(".jvm-profiler-{pid}"));
    let Ok(jvm_uid) = std::fs::metadata(format!("/proc/{pid}")).map(|meta| meta.uid()) else {
        return own.join("records");
    };
    if std::fs::symlink_metadata(&own).is_ok_and(|meta| meta.is_dir() && meta.uid() == jvm_uid) {
        return own.join("records");
    }
    let fallback = format!(".jvm-profiler-{pid}-");
    std::fs::read_dir(&tmp)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(&fallback))
        .filter_map(|entry| {
            let meta = entry.metadata().ok()?;
            (meta.is_dir() && meta.uid() == jvm_uid).then(|| (meta.mtime(), entry.path()))
        })
        .max()
        .map_or_else(|| own.join("records"), |(_, dir)| dir.join("records"))
}

/// The records directories in our /tmp named after `pid`: its own and fallbacks.
pub fn agent_records_dirs(pid: u32) -> Vec<PathBuf> {
    let own = format!(".jvm-profiler-{pid}");
    let fallback = format!(".jvm-profiler-{pid}-");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/tmp")
        .expect("/tmp")
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            name == own || name.starts_with(&fallback)
        })
        .map(|entry| entry.path())
        .collect();
    dirs.sort();
    dirs
}

/// Removes what [`agent_records_dirs`] lists: what dead JVMs with this pid left.
pub fn remove_agent_records_dirs(pid: u32) {
    for dir in agent_records_dirs(pid) {
        let _ = std::fs::remove_dir_all(dir);
    }
}
