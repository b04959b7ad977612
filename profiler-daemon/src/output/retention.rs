//! Keeps the local output bounded: profiles older than a maximum age are deleted, then the oldest
//! ones until the directory's profiles fit a byte budget. Only files this daemon writes
//! (`cpu-*`, `offcpu-*` and `alloc-*`, `.pb.gz` and `.svg`) are ever touched.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retention {
    pub max_age: Option<Duration>,
    pub max_bytes: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub files: u64,
    pub bytes: u64,
}

/// Applies `retention` to `dir` as of `now`.
pub fn enforce(dir: &Path, retention: Retention, now: SystemTime) -> std::io::Result<Removed> {
    let mut files: Vec<(SystemTime, PathBuf, u64)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        if !name.to_str().is_some_and(super::file_name::is_ours) {
            continue;
        }
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if metadata.is_file() {
            files.push((
                metadata.modified().unwrap_or(now),
                entry.path(),
                metadata.len(),
            ));
        }
    }
    // Oldest first; the name (which starts with the UTC time) breaks ties.
    files.sort();
    let mut total: u64 = files.iter().map(|(_, _, len)| len).sum();
    let mut removed = Removed::default();
    for (modified, path, len) in files {
        let too_old = retention
            .max_age
            .is_some_and(|age| now.duration_since(modified).unwrap_or_default() > age);
        let over_budget = retention.max_bytes.is_some_and(|max| total > max);
        if !too_old && !over_budget {
            // Everything after this file is newer, and the budget holds.
            if retention.max_bytes.is_none_or(|max| total <= max) {
                break;
            }
            continue;
        }
        if std::fs::remove_file(&path).is_ok() {
            total -= len;
            removed.files += 1;
            removed.bytes += len;
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;

    fn write(dir: &Path, name: &str, len: usize, age: Duration) {
        let path = dir.join(name);
        std::fs::write(&path, vec![0u8; len]).expect("writes");
        let modified = SystemTime::now() - age;
        File::options()
            .write(true)
            .open(&path)
            .expect("opens")
            .set_modified(modified)
            .expect("sets mtime");
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .expect("lists")
            .map(|e| e.expect("entry").file_name().into_string().expect("utf-8"))
            .collect();
        names.sort();
        names
    }

    #[test]
    fn removes_what_is_too_old_then_the_oldest_over_budget() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hour = Duration::from_secs(3600);
        write(dir.path(), "cpu-1-old.pb.gz", 100, 30 * hour);
        write(dir.path(), "cpu-2-a@svc.pb.gz", 100, 3 * hour);
        write(dir.path(), "cpu-2-a@svc.svg", 100, 3 * hour);
        write(dir.path(), "cpu-3-b.pb.gz", 100, 2 * hour);
        write(dir.path(), "cpu-4-c@svc.pb.gz", 100, hour);
        write(dir.path(), "notes.txt", 10_000, 40 * hour);

        let removed = enforce(
            dir.path(),
            Retention {
                max_age: Some(24 * hour),
                max_bytes: Some(250),
            },
            SystemTime::now(),
        )
        .expect("enforces");
        assert_eq!(
            removed,
            Removed {
                files: 3,
                bytes: 300
            }
        );
        // Newest kept within 250 bytes; files that are not ours are never touched.
        assert_eq!(
            names(dir.path()),
            vec!["cpu-3-b.pb.gz", "cpu-4-c@svc.pb.gz", "notes.txt"]
        );
    }

    #[test]
    fn no_limits_remove_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        write(
            dir.path(),
            "cpu-1.pb.gz",
            100,
            Duration::from_secs(1_000_000),
        );
        let removed = enforce(
            dir.path(),
            Retention {
                max_age: None,
                max_bytes: None,
            },
            SystemTime::now(),
        )
        .expect("ok");
        assert_eq!(removed, Removed::default());
    }
}
