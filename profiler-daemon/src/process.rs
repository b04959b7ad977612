//! What the daemon knows about each sampled process: its name, its memory mappings and how to
//! reach its files.
//!
//! A process is read from /proc when its first sample arrives, because short-lived processes
//! may be gone by the time the interval is symbolized. Files are opened through
//! `/proc/PID/root/<path>` so that processes in other mount namespaces (containers) work.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use hashbrown::HashMap;
use procfs::process::{MMapPath, Process};

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
    /// Whether the process sees the same root directory as the daemon, so that its files can
    /// still be opened by their plain path after it exits.
    pub shares_our_root: bool,
    /// Executable mappings, sorted by address.
    pub mappings: Vec<Mapping>,
}

impl ProcessInfo {
    /// Reads a live process. Fails if it has already exited.
    pub fn read(pid: u32) -> procfs::ProcResult<Self> {
        let process = Process::new(pid as i32)?;
        let stat = process.stat()?;
        let mappings = read_mappings(&process)?;
        let shares_our_root = same_file(&process.root().unwrap_or_default(), Path::new("/"));
        Ok(Self {
            pid,
            comm: stat.comm.clone(),
            command_line: process.cmdline().unwrap_or_default(),
            executable: process.exe().ok(),
            container: crate::container::read(pid).ok().flatten(),
            start_time: stat.starttime,
            shares_our_root,
            mappings,
        })
    }

    pub fn mapping(&self, addr: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.end <= addr);
        self.mappings.get(index).filter(|m| m.contains(addr))
    }

    /// Paths that open `path` (a path in the process's namespace) from the daemon, best first.
    pub fn host_paths(&self, path: &Path) -> Vec<PathBuf> {
        if path.to_string_lossy().ends_with(" (deleted)") {
            // Removed or replaced on disk (a package upgrade): only the mapping still reaches
            // the file the process runs; a new file at the old path would give wrong names.
            return self
                .mappings
                .iter()
                .filter(|m| matches!(&m.backing, Backing::File { path: p, .. } if p == path))
                .map(|m| {
                    PathBuf::from(format!(
                        "/proc/{}/map_files/{:x}-{:x}",
                        self.pid, m.start, m.end
                    ))
                })
                .take(1)
                .collect();
        }
        let relative = path.strip_prefix("/").unwrap_or(path);
        let mut paths = vec![PathBuf::from(format!("/proc/{}/root", self.pid)).join(relative)];
        if self.shares_our_root {
            paths.push(path.to_path_buf());
        }
        paths
    }
}

fn read_mappings(process: &Process) -> procfs::ProcResult<Vec<Mapping>> {
    let mut mappings: Vec<Mapping> = process
        .maps()?
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
    /// Called on a process's first sample of an interval: reads it if unknown, or if the pid
    /// now belongs to another process.
    pub fn observe(&mut self, pid: u32) {
        if let Some(known) = self.processes.get(&pid) {
            match Process::new(pid as i32).and_then(|p| p.stat()) {
                Ok(stat) if stat.starttime == known.start_time => return,
                Ok(_) => {}
                // Gone: keep what we knew, it is needed to symbolize its last samples.
                Err(_) => return,
            }
        }
        match ProcessInfo::read(pid) {
            Ok(info) => {
                self.processes.insert(pid, info);
            }
            Err(err) => {
                self.unreadable += 1;
                tracing::debug!(pid, %err, "process exited before it could be read");
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
                if fresh.start_time == known.start_time {
                    *known = fresh;
                }
            }
        }
        self.processes.get(&pid)
    }

    /// Forgets processes that have exited. Called after an interval is symbolized, so the last
    /// samples of a process still find its mappings.
    pub fn forget_exited(&mut self) {
        self.processes.retain(|&pid, info| {
            Process::new(pid as i32)
                .and_then(|p| p.stat())
                .map(|stat| stat.starttime == info.start_time)
                .unwrap_or(false)
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn host_paths_go_through_the_process_root() {
        let info = ProcessInfo {
            pid: 12,
            comm: "x".into(),
            command_line: vec![],
            executable: None,
            container: None,
            start_time: 0,
            shares_our_root: false,
            mappings: vec![],
        };
        assert_eq!(
            info.host_paths(Path::new("/usr/lib/libc.so.6")),
            vec![PathBuf::from("/proc/12/root/usr/lib/libc.so.6")]
        );
    }
}
