//! What the daemon knows about each sampled process: its name, its memory mappings and how to
//! reach its files.
//!
//! A process is read from /proc when its first sample arrives, because short-lived processes
//! may be gone by the time the interval is symbolized. What a young process maps changes in
//! its first seconds (a launcher script execs `java`, which loads libjvm, then the JDK's own
//! libraries): it is read again at a sample at least a second later while it was young when
//! last read, and whenever its executable is another file (an exec).
//!
//! Its /proc files are read bounded, and its mapped files are opened as untrusted input (see
//! [`crate::untrusted`]): the very file mapped through `/proc/PID/map_files`, else its path
//! resolved inside the process's root without following links, so processes in other mount
//! namespaces (containers) work and none can make the daemon open something else.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hashbrown::HashMap;
use procfs::process::{MMapPath, MemoryMaps};
use procfs::FromBufRead as _;

use crate::process_key::ProcessKey;
use crate::untrusted::{self, Expect, Refused};

/// Largest ELF file opened for symbols (debug builds of big programs reach a few GB).
const MAX_ELF_BYTES: u64 = 8 << 30;
/// Largest command line kept.
const MAX_COMMAND_LINE: usize = 128 << 10;
/// A process younger than this when read is read again at a later sample: what it maps is
/// still settling.
const YOUNG_PROCESS: Duration = Duration::from_secs(10);
/// How long after its last read a young process is read again at the earliest.
const YOUNG_REREAD_GAP: Duration = Duration::from_secs(1);

/// One executable mapping of a process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of `start`.
    pub offset: u64,
    pub backing: Backing,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Backing {
    /// A file, by its path in the process's mount namespace and its identity on the host.
    File {
        path: PathBuf,
        dev: u64,
        inode: u64,
    },
    Vdso,
    /// Anonymous memory (JIT code, for instance) or a special mapping.
    Anonymous,
}

impl Mapping {
    pub fn contains(&self, addr: u64) -> bool {
        self.start <= addr && addr < self.end
    }

    pub fn file_offset(&self, addr: u64) -> u64 {
        addr - self.start + self.offset
    }

    /// Where this mapping puts file offset `offset`, if it maps it (as the kernel places a
    /// uprobe given by file offset).
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        let into = offset.checked_sub(self.offset)?;
        (into < self.end - self.start).then(|| self.start + into)
    }
}

#[derive(Clone, Debug)]
pub struct ProcessInfo {
    pub pid: u32,
    pub comm: String,
    /// Arguments, `argv[0]` first; empty for kernel threads or when unreadable.
    pub command_line: Vec<String>,
    /// The executable's path in the process's mount namespace, when readable.
    pub executable: Option<PathBuf>,
    /// Its container and pod, from its cgroup (kept after it exits, like the rest).
    pub container: Option<crate::container::ContainerInfo>,
    /// Start time in clock ticks since boot: tells a reused pid from the process we knew.
    pub start_time: u64,
    /// Its owner (of `/proc/PID`, its effective uid): whose share of the daemon's caches its
    /// binaries count against.
    pub uid: u32,
    /// Whether the process sees the same root directory as the daemon, so that its files can
    /// still be opened by their plain path after it exits.
    pub shares_our_root: bool,
    /// Executable mappings, sorted by address.
    pub mappings: Vec<Mapping>,
    /// When it was read, and whether it was younger than [`YOUNG_PROCESS`] then.
    pub read_at: Instant,
    pub young_when_read: bool,
}

impl ProcessInfo {
    /// Reads a live process. Fails if it has already exited.
    pub fn read(pid: u32) -> procfs::ProcResult<Self> {
        let stat = read_stat(pid)?;
        let mappings = read_mappings(pid)?;
        let shares_our_root = shares_our_root(pid);
        Ok(Self {
            pid,
            comm: stat.comm.clone(),
            command_line: read_command_line(pid),
            executable: std::fs::read_link(format!("/proc/{pid}/exe")).ok(),
            container: crate::container::read(pid).ok().flatten(),
            start_time: stat.starttime,
            uid: owner_uid(pid).unwrap_or(u32::MAX),
            shares_our_root,
            mappings,
            read_at: Instant::now(),
            // An age unknown counts as old: read again only after an exec.
            young_when_read: age(stat.starttime).is_some_and(|age| age < YOUNG_PROCESS),
        })
    }

    /// Whether what was read may be out of date for the live process with the same key: it
    /// was young when read, a while ago, or it runs another executable now (it exec'd).
    fn may_have_changed(&self) -> bool {
        if self.young_when_read && self.read_at.elapsed() >= YOUNG_REREAD_GAP {
            return true;
        }
        let executable = std::fs::read_link(format!("/proc/{}/exe", self.pid)).ok();
        executable.is_some() && executable != self.executable
    }

    /// This process's identity for its whole life.
    pub fn key(&self) -> ProcessKey {
        ProcessKey {
            pid: self.pid,
            start_time: self.start_time,
        }
    }

    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.end <= addr);
        self.mappings.get(index).filter(|m| m.contains(addr))
    }

    /// Opens the file behind `mapping` for reading its symbols: through `/proc/PID/map_files`
    /// (needs `CAP_CHECKPOINT_RESTORE`), else by its path inside the process's root, else (the
    /// process exited) by its path in ours if it shared our root. Never a link, a special file,
    /// a file on a filesystem the process's user serves, or one past the size bound.
    pub fn open_mapped_file(&self, mapping: &Mapping) -> Result<File, Refused> {
        open_mapped_file(self.pid, self.shares_our_root, mapping)
    }
}

/// [`ProcessInfo::open_mapped_file`] for a process known by its pid and whether it shares our
/// root.
pub fn open_mapped_file(
    pid: u32,
    shares_our_root: bool,
    mapping: &Mapping,
) -> Result<File, Refused> {
    let Backing::File { path, dev, .. } = &mapping.backing else {
        return Err(Refused::NotFound);
    };
    let expect = Expect {
        owner: None,
        max_size: MAX_ELF_BYTES,
    };
    match untrusted::open_mapped(pid, mapping.start, mapping.end, *dev, expect) {
        Ok(file) => return Ok(file),
        // What the file is, not how it was reached: another path finds the same.
        Err(
            refused @ (Refused::UserFilesystem(_)
            | Refused::NotRegular(_)
            | Refused::TooLarge { .. }),
        ) => return Err(refused),
        Err(_) => {}
    }
    if path.to_string_lossy().ends_with(" (deleted)") {
        // Removed or replaced on disk (a package upgrade): only the mapping still reaches
        // the file the process runs; a new file at the old path would give wrong names.
        return Err(Refused::NotFound);
    }
    untrusted::open_by_mapped_path(pid, path, *dev, shares_our_root, expect)
}

/// How long ago a process started `start_time` clock ticks after boot (`/proc/PID/stat`).
fn age(start_time: u64) -> Option<Duration> {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime fills our struct.
    if unsafe { libc::clock_gettime(libc::CLOCK_BOOTTIME, &mut now) } != 0 {
        return None;
    }
    let since_boot = Duration::new(now.tv_sec as u64, now.tv_nsec as u32);
    let started = Duration::from_secs_f64(start_time as f64 / procfs::ticks_per_second() as f64);
    Some(since_boot.saturating_sub(started))
}

/// The owner of `/proc/PID`: the process's effective uid (whose share of the daemon's budgets
/// its work counts against).
pub fn owner_uid(pid: u32) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}"))
        .ok()
        .map(|meta| meta.uid())
}

pub use crate::process_key::read_stat;

/// `/proc/PID/cmdline` as arguments, bounded (a process can make its own very long).
pub fn read_command_line(pid: u32) -> Vec<String> {
    let Ok(bytes) = untrusted::read_proc_file(pid, "cmdline", MAX_COMMAND_LINE) else {
        return Vec::new();
    };
    bytes
        .split(|b| *b == 0)
        .filter(|arg| !arg.is_empty())
        .map(|arg| String::from_utf8_lossy(arg).into_owned())
        .collect()
}

/// Every mapping of `pid` (`/proc/PID/maps`, bounded).
pub fn read_all_mappings(pid: u32) -> procfs::ProcResult<MemoryMaps> {
    let bytes = untrusted::read_proc_file(pid, "maps", untrusted::MAX_PROC_FILE)?;
    MemoryMaps::from_buf_read(&bytes[..])
}

/// The executable mappings of `pid`, sorted by address.
pub fn read_mappings(pid: u32) -> procfs::ProcResult<Vec<Mapping>> {
    let mut mappings: Vec<Mapping> = read_all_mappings(pid)?
        .into_iter()
        .filter(|map| map.perms.contains(procfs::process::MMPermissions::EXECUTE))
        .map(|map| Mapping {
            start: map.address.0,
            end: map.address.1,
            offset: map.offset,
            backing: match map.pathname {
                MMapPath::Path(path) => Backing::File {
                    path,
                    dev: libc::makedev(map.dev.0 as u32, map.dev.1 as u32),
                    inode: map.inode,
                },
                MMapPath::Vdso => Backing::Vdso,
                _ => Backing::Anonymous,
            },
        })
        .collect();
    mappings.sort_by_key(|m| m.start);
    Ok(mappings)
}

/// Whether process `pid` sees the same root directory as the daemon.
pub fn shares_our_root(pid: u32) -> bool {
    same_file(Path::new(&format!("/proc/{pid}/root")), Path::new("/"))
}

fn same_file(a: &Path, b: &Path) -> bool {
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Processes seen in samples, keyed by pid.
#[derive(Default)]
pub struct ProcessTable {
    processes: HashMap<u32, ProcessInfo>,
    /// Processes that exited before we could read them: samples still count, under a pid only.
    pub unreadable: u64,
}

impl ProcessTable {
    /// Called on a process's first sample of an interval, and again at later samples of a
    /// young one: reads it if unknown, if the pid now belongs to another process, or if what
    /// was read may be out of date (see the module's notes). True if it was read again (what
    /// it maps may have changed) where it was known.
    pub fn observe(&mut self, pid: u32) -> bool {
        let known = match self.processes.get(&pid) {
            Some(known) => match ProcessKey::of_live(pid) {
                Some(live) if live == known.key() && !known.may_have_changed() => return false,
                // Young, exec'd, or the pid was given to another process.
                Some(_) => true,
                // Gone: keep what we knew, it is needed to symbolize its last samples.
                None => return false,
            },
            None => false,
        };
        match ProcessInfo::read(pid) {
            Ok(info) => {
                self.processes.insert(pid, info);
                known
            }
            Err(err) => {
                self.unreadable += u64::from(!known);
                tracing::debug!(pid, %err, "process exited before it could be read");
                false
            }
        }
    }

    pub fn get(&self, pid: u32) -> Option<&ProcessInfo> {
        self.processes.get(&pid)
    }

    /// Re-reads the mappings of a live process (after a sampled address fell outside the known
    /// ones: a library loaded later, new JIT code).
    pub fn refresh(&mut self, pid: u32) -> Option<&ProcessInfo> {
        if let Some(known) = self.processes.get_mut(&pid) {
            if let Ok(fresh) = ProcessInfo::read(pid) {
                if fresh.key() == known.key() {
                    *known = fresh;
                }
            }
        }
        self.processes.get(&pid)
    }

    /// Forgets processes that have exited. Called after an interval is symbolized, so the last
    /// samples of a process still find its mappings.
    pub fn forget_exited(&mut self) {
        self.processes.retain(|_, info| info.key().is_running());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_offset_is_placed_where_the_mapping_holding_it_is() {
        let mapping = |start: u64, end: u64, offset: u64| Mapping {
            start,
            end,
            offset,
            backing: Backing::Anonymous,
        };
        // Code mapped from file offset 0x1000 (its first page of headers mapped elsewhere).
        let text = mapping(0x7f00_0000_1000, 0x7f00_0040_0000, 0x1000);
        let other = mapping(0x7f00_1000_0000, 0x7f00_1000_2000, 0x50_0000);
        let place = |offset| [&other, &text].iter().find_map(|m| m.address_of(offset));
        assert_eq!(place(0x2345), Some(0x7f00_0000_2345));
        assert_eq!(place(0x50_0010), Some(0x7f00_1000_0010));
        assert_eq!(place(0x800), None, "before the code mapping");
        assert_eq!(place(0x40_0000), None, "past its end");
        let address = text.address_of(0x2345).expect("mapped");
        assert_eq!(text.file_offset(address), 0x2345);
    }

    #[test]
    fn reads_our_own_process() {
        let me = ProcessInfo::read(std::process::id()).expect("own process is readable");
        assert!(me.shares_our_root);
        assert!(!me.mappings.is_empty());
        // The code of this very function is in a file-backed executable mapping.
        let here = reads_our_own_process as *const () as u64;
        let mapping = me.mapping(here).expect("test code is mapped");
        assert!(matches!(mapping.backing, Backing::File { .. }));
        assert!(me.mapping(0).is_none());
    }

    #[test]
    fn our_own_mapped_files_open_and_a_deleted_one_only_through_map_files() {
        let me = ProcessInfo::read(std::process::id()).expect("own process is readable");
        let here =
            our_own_mapped_files_open_and_a_deleted_one_only_through_map_files as *const () as u64;
        let mapping = me.mapping(here).expect("test code is mapped").clone();
        let file = me.open_mapped_file(&mapping).expect("our executable opens");
        assert!(file.metadata().expect("meta").len() > 0);
        let mut deleted = mapping.clone();
        deleted.start = 0x1000;
        deleted.end = 0x2000;
        if let Backing::File { path, .. } = &mut deleted.backing {
            *path = PathBuf::from(format!("{} (deleted)", path.display()));
        }
        assert!(me.open_mapped_file(&deleted).is_err());
        assert!(!read_command_line(std::process::id()).is_empty());
    }
}
