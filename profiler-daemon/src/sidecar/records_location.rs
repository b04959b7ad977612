//! Finding the records file of one JVM's agent in the JVM's `/tmp`: the directory named after its
//! pid, or the fallback directory its agent made when another user held that name
//! (`profiler_jvmti_records::channel`); never the records a dead process with the same pid left
//! there.
//!
//! Pids are reused and a JVM killed with SIGKILL leaves its records behind, so a records file
//! at the right path may be a previous process's: its header's start time (the agent's) then
//! predates this process's start, and it is treated as absent.

use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use profiler_jvmti_records::channel::{fallback_dir_prefix, records_dir, RECORDS_FILE};
use profiler_jvmti_records::record::{FileHeader, HEADER_LEN};

use crate::untrusted::{self, Refused};

/// A JVM's `/tmp` is listed only while the default path holds something unusable (a file of
/// another user, or a dead process's records): one second after the first listing, then ever
/// less often, at most this seldom. The first look may come just before an agent being loaded
/// makes its fallback directory.
const SCAN_EVERY: Duration = Duration::from_secs(30);
const FIRST_SCAN_GAP: Duration = Duration::from_secs(1);
/// Entries of a `/tmp` looked at per scan: its users can fill it.
const MAX_SCANNED_ENTRIES: usize = 100_000;
/// Clock steps the start-time comparison tolerates: records whose agent started more than this
/// before the process did are a previous process's.
const START_SLACK: Duration = Duration::from_secs(1);

/// Where one JVM's records are, remembered between looks.
pub struct RecordsLocation {
    pid: u32,
    nspid: u32,
    euid: u32,
    /// CLOCK_REALTIME nanoseconds at the process's start (to the clock tick), or 0 if unknown.
    process_started_ns: u64,
    /// The fallback directory (below `/tmp`) found by the last scan.
    fallback: Option<PathBuf>,
    last_scan: Option<Instant>,
    /// The time from the last scan to the next: doubled after each, up to [`SCAN_EVERY`].
    scan_gap: Duration,
    /// Whether the JVM's `/tmp` is ours (same mount): where the daemon can still reach its
    /// records once the JVM is gone.
    shares_our_tmp: bool,
    /// The records file opened last: its directory (below `/tmp`) and inode.
    last_opened: Option<OpenedRecords>,
}

/// Which records file was read: the one to remove if the JVM dies without removing it.
#[derive(Clone, Debug, PartialEq)]
struct OpenedRecords {
    dir: PathBuf,
    dev: u64,
    ino: u64,
}

impl RecordsLocation {
    /// For host pid `pid`, whose pid in its own namespace is `nspid` and whose effective uid
    /// (the owner the agent's files must have) is `euid`.
    pub fn new(pid: u32, nspid: u32, euid: u32) -> Self {
        Self {
            pid,
            nspid,
            euid,
            process_started_ns: process_started_ns(pid).unwrap_or(0),
            fallback: None,
            last_scan: None,
            scan_gap: FIRST_SCAN_GAP,
            shares_our_tmp: shares_our_tmp(pid),
            last_opened: None,
        }
    }

    /// The current records file, opened without following anything the JVM's user could plant
    /// (and never waited on); `Ok(None)` when there is none (yet).
    pub fn open(&mut self, max_size: u64) -> Result<Option<File>, Refused> {
        let opened = self.find(max_size)?;
        if let Some((dir, file)) = &opened {
            if let Ok(meta) = file.metadata() {
                self.last_opened = Some(OpenedRecords {
                    dir: dir.clone(),
                    dev: meta.dev(),
                    ino: meta.ino(),
                });
            }
        }
        Ok(opened.map(|(_, file)| file))
    }

    /// The records file and its directory (below `/tmp`).
    fn find(&mut self, max_size: u64) -> Result<Option<(PathBuf, File)>, Refused> {
        if let Some(dir) = self.fallback.clone() {
            match self.open_fresh(&dir.join(RECORDS_FILE), max_size) {
                Ok(Some(file)) => return Ok(Some((dir, file))),
                _ => self.fallback = None,
            }
        }
        let default_dir = PathBuf::from(
            records_dir(self.nspid)
                .strip_prefix("/tmp")
                .expect("records directories are below /tmp"),
        );
        let unusable = match self.open_fresh(&default_dir.join(RECORDS_FILE), max_size) {
            Ok(Some(file)) => return Ok(Some((default_dir, file))),
            // Most JVMs never load an agent: nothing to look for.
            Err(Refused::NotFound) => return Ok(None),
            // A dead process's records.
            Ok(None) => None,
            Err(refused) => Some(refused),
        };
        let now = Instant::now();
        if self
            .last_scan
            .is_none_or(|last| now >= last + self.scan_gap)
        {
            if self.last_scan.is_some() {
                self.scan_gap = (self.scan_gap * 2).min(SCAN_EVERY);
            }
            self.last_scan = Some(now);
            if let Some((dir, file)) = self.scan(max_size) {
                tracing::info!(
                    pid = self.pid,
                    dir = %Path::new("/tmp").join(&dir).display(),
                    "sidecar: the agent writes into a fallback directory (its pid's is another \
                     user's or a dead process's)"
                );
                self.fallback = Some(dir.clone());
                return Ok(Some((dir, file)));
            }
        }
        unusable.map_or(Ok(None), Err)
    }

    /// Once the JVM is gone: removes the records file read last, and its directory if that
    /// leaves it empty, when the JVM's agent could not (the JVM was killed). What the agent
    /// took on the JVM's behalf is given back. Only in our own `/tmp` (a container's goes with
    /// the container), and only that very inode: a process that has the pid since, and wrote
    /// its own records there, keeps them.
    pub fn remove_left_behind(&self) {
        let Some(opened) = self.last_opened.as_ref().filter(|_| self.shares_our_tmp) else {
            return;
        };
        match untrusted::remove_file_below_tmp(&opened.dir, RECORDS_FILE, (opened.dev, opened.ino))
        {
            Ok(true) => tracing::info!(
                pid = self.pid,
                dir = %Path::new("/tmp").join(&opened.dir).display(),
                "sidecar: removed the records a killed JVM's agent left"
            ),
            Ok(false) => {}
            Err(err) => tracing::debug!(pid = self.pid, %err, "sidecar: records left behind"),
        }
    }

    /// Opens `below_tmp` as the JVM user's records file: `Ok(None)` if it is a previous
    /// process's.
    fn open_fresh(&self, below_tmp: &Path, max_size: u64) -> Result<Option<File>, Refused> {
        let file = untrusted::open_in_tmp(
            self.pid,
            below_tmp,
            untrusted::Expect {
                owner: Some(self.euid),
                max_size,
            },
        )?;
        Ok(self.written_by_this_process(&file).then_some(file))
    }

    /// Whether the agent that wrote `file` runs in this process: its header names this pid and
    /// a start after the process's. A header not (yet) readable counts as this process's: the
    /// reader reports what is wrong with it.
    fn written_by_this_process(&self, file: &File) -> bool {
        header_of(file).is_none_or(|header| {
            header.pid == self.nspid
                && header
                    .started_ns
                    .saturating_add(START_SLACK.as_nanos() as u64)
                    >= self.process_started_ns
        })
    }

    /// The newest fallback directory (below `/tmp`) of this JVM's user whose records are this
    /// process's, and those records.
    fn scan(&self, max_size: u64) -> Option<(PathBuf, File)> {
        let tmp = untrusted::open_tmp_dir(self.pid).ok()?;
        // The O_PATH descriptor cannot be listed; its /proc/self/fd link reopens the very
        // directory (no path lookup in the JVM's namespace).
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", tmp.as_raw_fd())).ok()?;
        let prefix = fallback_dir_prefix(self.nspid);
        let mut newest: Option<(u64, PathBuf, File)> = None;
        for entry in entries.take(MAX_SCANNED_ENTRIES).flatten() {
            let name = entry.file_name();
            if !name.as_bytes().starts_with(prefix.as_bytes()) {
                continue;
            }
            // `file_type`/`metadata` of a directory entry do not follow links.
            let Ok(meta) = entry.metadata() else { continue };
            if !meta.is_dir() || meta.uid() != self.euid {
                continue;
            }
            let dir = PathBuf::from(&name);
            let Ok(Some(file)) = self.open_fresh(&dir.join(RECORDS_FILE), max_size) else {
                continue;
            };
            let started = header_of(&file).map_or(0, |header| header.started_ns);
            if newest.as_ref().is_none_or(|(best, ..)| started > *best) {
                newest = Some((started, dir, file));
            }
        }
        newest.map(|(_, dir, file)| (dir, file))
    }
}

/// The header of a records file, if it has a whole one.
fn header_of(file: &File) -> Option<FileHeader> {
    let mut bytes = [0u8; HEADER_LEN];
    file.read_exact_at(&mut bytes, 0).ok()?;
    FileHeader::decode(&bytes).ok()
}

/// Whether process `pid`'s `/tmp` is the very directory ours is.
fn shares_our_tmp(pid: u32) -> bool {
    let (Ok(theirs), Ok(ours)) = (
        untrusted::open_tmp_dir(pid).and_then(|tmp| Ok(File::from(tmp).metadata()?)),
        std::fs::metadata("/tmp"),
    ) else {
        return false;
    };
    (theirs.dev(), theirs.ino()) == (ours.dev(), ours.ino())
}

/// CLOCK_REALTIME nanoseconds at which process `pid` started, to the clock tick.
fn process_started_ns(pid: u32) -> Option<u64> {
    let stat = procfs::process::Process::new(pid as i32)
        .ok()?
        .stat()
        .ok()?;
    let ticks = procfs::ticks_per_second();
    let since_boot_ns = (stat.starttime as u128 * 1_000_000_000 / ticks as u128) as u64;
    // Boot time on the wall clock, from two clocks read together (`btime` has whole seconds).
    let boot_ns = clock_ns(libc::CLOCK_REALTIME)?.checked_sub(clock_ns(libc::CLOCK_BOOTTIME)?)?;
    Some(boot_ns + since_boot_ns)
}

fn clock_ns(clock: libc::clockid_t) -> Option<u64> {
    // SAFETY: all-zero is a valid timespec.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is valid for writes.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return None;
    }
    Some(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    use profiler_jvmti_records::channel::Writer;

    /// Our own process stands for the JVM, with an nspid no process has, so that its records
    /// directories are this test's alone (`test` tells the tests apart: they run together).
    fn location(euid: u32, test: u32) -> RecordsLocation {
        RecordsLocation::new(
            std::process::id(),
            4_100_000 + test * 100_000 + std::process::id() % 100_000,
            euid,
        )
    }

    /// A location for test number `test`, as root's JVM, with nothing of an earlier run left.
    fn fresh_location(test: u32) -> RecordsLocation {
        // SAFETY: a plain getter.
        let euid = unsafe { libc::geteuid() };
        let location = location(euid, test);
        remove_all(location.nspid);
        location
    }

    fn now_ns() -> u64 {
        clock_ns(libc::CLOCK_REALTIME).expect("clock")
    }

    fn remove_all(nspid: u32) {
        let _ = std::fs::remove_dir_all(records_dir(nspid));
        for entry in std::fs::read_dir("/tmp").expect("/tmp").flatten() {
            if entry
                .file_name()
                .as_bytes()
                .starts_with(fallback_dir_prefix(nspid).as_bytes())
            {
                let _ = std::fs::remove_dir_all(entry.path());
            }
        }
    }

    #[test]
    fn a_dead_process_s_records_are_absent_and_a_new_agent_s_are_found() {
        let mut location = fresh_location(0);
        let nspid = location.nspid;
        assert!(location.process_started_ns > 0);
        assert!(location.process_started_ns <= now_ns());
        assert!(
            location.open(u64::MAX).expect("open").is_none(),
            "nothing yet"
        );

        // Left by a process with this pid that ran before ours started.
        let before = location.process_started_ns - 5_000_000_000;
        let stale = Writer::create(&records_dir(nspid), nspid, before, 1 << 20).expect("stale");
        assert!(
            location.open(u64::MAX).expect("open").is_none(),
            "a dead process's"
        );
        drop(stale);

        // Our agent takes the directory over.
        let _fresh = Writer::create(&records_dir(nspid), nspid, now_ns(), 1 << 20).expect("new");
        assert!(location.open(u64::MAX).expect("open").is_some(), "ours");
        remove_all(nspid);
    }

    #[test]
    fn records_left_by_a_killed_jvm_are_removed_unless_replaced() {
        let mut location = fresh_location(2);
        let nspid = location.nspid;
        assert!(location.shares_our_tmp, "our own process shares our /tmp");
        let dir = records_dir(nspid);

        // Read, then replaced by a new process's agent (same user, same pid): kept.
        let first = Writer::create(&dir, nspid, now_ns(), 1 << 20).expect("records");
        assert!(location.open(u64::MAX).expect("open").is_some());
        let _second = Writer::create(&dir, nspid, now_ns(), 1 << 20).expect("records");
        location.remove_left_behind();
        assert!(
            dir.join(RECORDS_FILE).exists(),
            "another process's records removed"
        );
        drop(first);

        // Read, and the JVM is gone: removed, directory and all.
        assert!(location.open(u64::MAX).expect("open").is_some());
        location.remove_left_behind();
        assert!(!dir.exists(), "left behind");
        // Nothing to do a second time.
        location.remove_left_behind();
        remove_all(nspid);
    }

    #[test]
    fn the_fallback_directory_is_found_when_another_user_holds_the_pid_s() {
        // SAFETY: a plain getter.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "the tests run as root (they chown to another user)"
        );
        let mut location = fresh_location(1);
        let nspid = location.nspid;
        // Another user's directory, with records of that user's (dead) JVM.
        let other = 65534;
        let squatted = records_dir(nspid);
        let _theirs = Writer::create(&squatted, nspid, now_ns(), 1 << 20).expect("theirs");
        for path in [squatted.join(RECORDS_FILE), squatted.clone()] {
            std::os::unix::fs::chown(&path, Some(other), Some(other)).expect("chown");
        }
        // A fallback directory of that user does not count either.
        let decoy = PathBuf::from("/tmp").join(format!("{}decoy", fallback_dir_prefix(nspid)));
        let _decoy = Writer::create(&decoy, nspid, now_ns(), 1 << 20).expect("decoy");
        for path in [decoy.join(RECORDS_FILE), decoy.clone()] {
            std::os::unix::fs::chown(&path, Some(other), Some(other)).expect("chown");
        }
        assert!(
            matches!(location.open(u64::MAX), Err(Refused::WrongOwner { .. })),
            "no agent of ours yet"
        );

        let ours = Writer::create_for_pid(nspid, now_ns(), 1 << 20).expect("fallback");
        assert_ne!(ours.dir(), squatted.as_path());
        assert!(ours
            .dir()
            .to_string_lossy()
            .starts_with(&format!("/tmp/{}", fallback_dir_prefix(nspid))));
        // Found at the next scan (the first one found nothing).
        location.last_scan = None;
        let file = location.open(u64::MAX).expect("open").expect("found");
        let found =
            std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).expect("readlink");
        assert_eq!(found, ours.dir().join(RECORDS_FILE));
        // And remembered without a scan.
        assert!(location.open(u64::MAX).expect("open").is_some());
        remove_all(nspid);
    }
}
