//! Keeps the local output bounded: profiles older than a maximum age are deleted, then the oldest
//! ones until the directory's profiles fit a byte budget. Only files this daemon writes
//! (`cpu-*`, `offcpu-*`, `alloc-*`, `mutex-*` and `block-*`, `.pb.gz` and `.svg`) are ever
//! touched.
//!
//! The policy is applied at the end of every interval, to a ledger of the files rather than to
//! a listing of the directory: a day of 20 JVMs' profiles is tens of thousands of files, and
//! listing and measuring them every interval cost more than writing the interval's profiles
//! (34,000 files: about 0.1 s, every 15 s). The directory is listed when the ledger starts and
//! again every [`RELIST_EVERY`], which brings in what others changed there meanwhile (files
//! deleted by hand, a previous run's).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How often the ledger is checked against the directory.
pub const RELIST_EVERY: Duration = Duration::from_secs(600);

/// Most files the ledger holds (about 100 bytes each): past them, the oldest are deleted as if
/// over the byte budget. A directory of more profiles than this is more than `view` reads in a
/// reasonable time anyway; 20 JVMs' pprof files and flame graphs of a day within the default
/// 1 GiB are about 40,000.
pub const MAX_FILES: usize = 200_000;

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

/// The daemon's files in the output directory, oldest first, and their total size.
#[derive(Debug)]
pub struct Ledger {
    dir: PathBuf,
    retention: Retention,
    /// (modified, file name) -> bytes, in the order files go. Ties fall to the name, which
    /// starts with the interval's UTC time. A name written again (only within its interval: a
    /// pid reused with the same process name) has two entries until the next listing: counted
    /// twice, and the file goes with the older one, of the same interval.
    files: BTreeMap<(SystemTime, Box<str>), u64>,
    total: u64,
    max_files: usize,
    listed: Option<Instant>,
}

impl Ledger {
    /// A ledger of `dir`, listed at its first [`Ledger::enforce`].
    pub fn new(dir: &Path, retention: Retention) -> Self {
        Self {
            dir: dir.to_owned(),
            retention,
            files: BTreeMap::new(),
            total: 0,
            max_files: MAX_FILES,
            listed: None,
        }
    }

    /// Notes a file the daemon just wrote in its directory.
    pub fn wrote(&mut self, name: &str, modified: SystemTime, bytes: u64) {
        if let Some(previous) = self.files.insert((modified, name.into()), bytes) {
            self.total -= previous;
        }
        self.total += bytes;
    }

    /// Applies the retention policy as of `now`: deletes what is too old, then the oldest files
    /// while over the byte budget (or [`MAX_FILES`]).
    pub fn enforce(&mut self, now: SystemTime) -> std::io::Result<Removed> {
        if self.listed.is_none_or(|at| at.elapsed() >= RELIST_EVERY) {
            self.relist(now)?;
        }
        let mut removed = Removed::default();
        while let Some(((modified, _), _)) = self.files.first_key_value() {
            let too_old = self
                .retention
                .max_age
                .is_some_and(|age| now.duration_since(*modified).unwrap_or_default() > age);
            let over_budget = self.retention.max_bytes.is_some_and(|max| self.total > max)
                || self.files.len() > self.max_files;
            if !too_old && !over_budget {
                break;
            }
            let Some(((_, name), bytes)) = self.files.pop_first() else {
                break;
            };
            self.total -= bytes;
            let path = self.dir.join(&*name);
            match std::fs::remove_file(&path) {
                Ok(()) => {
                    removed.files += 1;
                    removed.bytes += bytes;
                }
                // Deleted by someone else: gone all the same.
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                // Kept, but out of the ledger until the next listing.
                Err(err) => tracing::debug!(path = %path.display(), %err, "retention: not deleted"),
            }
        }
        Ok(removed)
    }

    /// Replaces the ledger with what the directory holds.
    fn relist(&mut self, now: SystemTime) -> std::io::Result<()> {
        let entries = std::fs::read_dir(&self.dir)?;
        self.files.clear();
        self.total = 0;
        for entry in entries {
            let Ok(entry) = entry else { continue };
            let name = entry.file_name();
            let Some(name) = name.to_str().filter(|name| super::file_name::is_ours(name)) else {
                continue;
            };
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            if metadata.is_file() {
                self.wrote(name, metadata.modified().unwrap_or(now), metadata.len());
            }
        }
        self.listed = Some(Instant::now());
        Ok(())
    }
}

/// Applies `retention` to `dir` as of `now`, from a listing of it.
#[cfg(test)]
fn enforce(dir: &Path, retention: Retention, now: SystemTime) -> std::io::Result<Removed> {
    Ledger::new(dir, retention).enforce(now)
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

    #[test]
    fn the_ledger_deletes_what_it_was_told_of_without_listing_again() {
        let dir = tempfile::tempdir().expect("tempdir");
        let hour = Duration::from_secs(3600);
        write(dir.path(), "cpu-1-a.pb.gz", 100, 3 * hour);
        let mut ledger = Ledger::new(
            dir.path(),
            Retention {
                max_age: Some(2 * hour),
                max_bytes: Some(250),
            },
        );
        // The first enforcement lists the directory: the old file goes.
        let removed = ledger.enforce(SystemTime::now()).expect("enforces");
        assert_eq!(
            removed,
            Removed {
                files: 1,
                bytes: 100
            }
        );

        // Files written since are known from the ledger alone: one put in the directory by
        // someone else (not listed again before RELIST_EVERY) is not counted.
        write(dir.path(), "cpu-9-stranger.pb.gz", 1_000, Duration::ZERO);
        for (name, age) in [
            ("cpu-2-b.pb.gz", 30),
            ("cpu-3-c.pb.gz", 20),
            ("cpu-4-d.pb.gz", 10),
        ] {
            write(dir.path(), name, 100, Duration::from_secs(age));
            let modified = SystemTime::now() - Duration::from_secs(age);
            ledger.wrote(name, modified, 100);
        }
        // 300 bytes known, budget 250: the oldest goes; one deleted by hand meanwhile is gone
        // all the same, without an error.
        std::fs::remove_file(dir.path().join("cpu-3-c.pb.gz")).expect("removes");
        let removed = ledger.enforce(SystemTime::now()).expect("enforces");
        assert_eq!(
            removed,
            Removed {
                files: 1,
                bytes: 100
            }
        );
        assert_eq!(
            names(dir.path()),
            vec!["cpu-4-d.pb.gz", "cpu-9-stranger.pb.gz"]
        );
    }

    #[test]
    fn past_its_file_bound_the_ledger_deletes_the_oldest() {
        let dir = tempfile::tempdir().expect("tempdir");
        for (i, name) in ["cpu-1.pb.gz", "cpu-2.pb.gz", "cpu-3.pb.gz", "cpu-4.pb.gz"]
            .iter()
            .enumerate()
        {
            write(dir.path(), name, 10, Duration::from_secs(100 - i as u64));
        }
        let mut ledger = Ledger::new(
            dir.path(),
            Retention {
                max_age: None,
                max_bytes: None,
            },
        );
        ledger.max_files = 3;
        let removed = ledger.enforce(SystemTime::now()).expect("enforces");
        assert_eq!(
            removed,
            Removed {
                files: 1,
                bytes: 10
            }
        );
        assert_eq!(
            names(dir.path()),
            vec!["cpu-2.pb.gz", "cpu-3.pb.gz", "cpu-4.pb.gz"]
        );
    }
}
