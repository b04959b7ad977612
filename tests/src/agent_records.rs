//! Where a test JVM's sidecar agent keeps its records: the directory named after its pid, or,
//! when a directory of another user holds that name (pids are reused, and JVMs killed by
//! earlier tests leave theirs), the agent's fallback next to it.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use profiler_jvmti_records::channel::{fallback_dir_prefix, records_dir, RECORDS_FILE};

/// The name of `pid`'s own records directory in its /tmp.
fn own_dir_name(pid: u32) -> PathBuf {
    records_dir(pid)
        .file_name()
        .map(PathBuf::from)
        .expect("a directory name")
}

/// The records file of JVM `pid` (a JVM in our pid namespace), as the daemon would pick it:
/// the JVM user's own directory of that pid, else the newest fallback of that user. The
/// default path when neither exists (yet).
pub fn agent_records_file(pid: u32) -> PathBuf {
    let tmp = PathBuf::from(format!("/proc/{pid}/root/tmp"));
    let own = tmp.join(own_dir_name(pid));
    let Ok(jvm_uid) = std::fs::metadata(format!("/proc/{pid}")).map(|meta| meta.uid()) else {
        return own.join(RECORDS_FILE);
    };
    if std::fs::symlink_metadata(&own).is_ok_and(|meta| meta.is_dir() && meta.uid() == jvm_uid) {
        return own.join(RECORDS_FILE);
    }
    let fallback = fallback_dir_prefix(pid);
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
        .map_or_else(|| own.join(RECORDS_FILE), |(_, dir)| dir.join(RECORDS_FILE))
}

/// The records directories in our /tmp named after `pid`: its own and fallbacks.
pub fn agent_records_dirs(pid: u32) -> Vec<PathBuf> {
    let own = own_dir_name(pid);
    let fallback = fallback_dir_prefix(pid);
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/tmp")
        .expect("/tmp")
        .flatten()
        .filter(|entry| {
            let name = entry.file_name();
            Path::new(&name) == own || name.to_string_lossy().starts_with(&fallback)
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
