//! Finds JVMs as they start and exit, and keeps the BPF map of their unwinding layouts current.
//!
//! Every scan (twice a second) lists /proc. A process seen for the first time is checked for a
//! mapped libjvm.so; one that is not a JVM yet is checked again while it is young (the launcher
//! maps libjvm a moment after exec) or when its name changes (exec). A JVM is read as soon as its
//! VM has initialised (code heaps set up; until then it is "pending" and retried each scan), its
//! layout pushed into the `HOTSPOT_PROCS` map, refreshed every few seconds, and removed when the
//! process exits. Pids are recycled quickly (pid_max is often 32768): a process is identified by
//! pid and start time. Each JVM's Java threads also go to a [`ThreadDirectory`], for the
//! symbolizer to find a thread's tid by its `JavaThread*`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::HotspotProc;

use super::jvm::{Jvm, JvmError, LayoutCache};
use super::remote::ProcessMemory;
use super::thread_directory::ThreadDirectory;
use super::unwind_info::hotspot_proc;
use crate::process::ProcessInfo;

/// How often /proc is scanned.
pub const SCAN_PERIOD: Duration = Duration::from_millis(500);
/// How often a JVM's Java threads are read in full even if its thread list looks unchanged.
const FULL_THREAD_READ: Duration = Duration::from_secs(10);
/// A non-JVM process is re-checked while younger than this.
const YOUNG: Duration = Duration::from_secs(30);
/// A pending JVM is retried at every scan this many times, then every [`SLOW_RETRY_EVERY`].
const FAST_RETRIES: u32 = 20;
const SLOW_RETRY_EVERY: u32 = 20;
/// `task_struct` flag of kernel threads (`PF_KTHREAD`), in /proc/PID/stat's `flags`.
const PF_KTHREAD: u32 = 0x0020_0000;
/// A ready JVM's code cache is re-read this often.
const REFRESH: Duration = Duration::from_secs(5);

/// Where layouts and Java threads go: the BPF maps, or a fake in tests.
pub trait LayoutSink {
    fn put(&mut self, pid: u32, proc_info: &HotspotProc) -> Result<(), String>;
    fn remove(&mut self, pid: u32);
    /// `tid` is a host tid.
    fn put_thread(&mut self, tid: u32, java_thread: u64) -> Result<(), String>;
    fn remove_thread(&mut self, tid: u32);
}

/// The two BPF maps the tracker writes.
pub struct BpfMaps {
    pub procs: BpfHashMap<MapData, u32, HotspotProc>,
    pub threads: BpfHashMap<MapData, u32, u64>,
}

impl LayoutSink for BpfMaps {
    fn put(&mut self, pid: u32, proc_info: &HotspotProc) -> Result<(), String> {
        self.procs
            .insert(pid, *proc_info, 0)
            .map_err(|err| err.to_string())
    }

    fn remove(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
    }

    fn put_thread(&mut self, tid: u32, java_thread: u64) -> Result<(), String> {
        self.threads
            .insert(tid, java_thread, 0)
            .map_err(|err| err.to_string())
    }

    fn remove_thread(&mut self, tid: u32) {
        let _ = self.threads.remove(&tid);
    }
}

enum State {
    NotJvm {
        comm: String,
    },
    /// A JVM still starting (or briefly unreadable): retried each scan.
    Pending {
        jvm: Option<Box<Jvm>>,
        attempts: u32,
        last_error: String,
    },
    Ready {
        jvm: Box<Jvm>,
        pushed: Box<HotspotProc>,
        refreshed: Instant,
        /// Java threads pushed: host tid -> JavaThread*.
        threads: HashMap<u32, u64>,
        /// The ThreadsSMR list `threads` was read from, and when the set was last read in full.
        thread_list: Option<u64>,
        threads_read: Instant,
        /// Whether the JVM lives in another pid namespace (fixed for a process's life).
        other_pid_namespace: Option<bool>,
    },
    /// Not readable for good (layout missing a field, no permission): not retried.
    Failed,
    /// Over the `max_jvms` bound.
    OverBound,
}

struct Tracked {
    start_time: u64,
    state: State,
}

/// Tallies exported with the daemon's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackerCounts {
    pub jvms_ready: u64,
    pub jvms_pending: u64,
    pub jvms_failed: u64,
    pub jvms_over_bound: u64,
    pub layouts_cached: u64,
    /// Entries of the BPF JVM map, and its capacity (`max_jvms`).
    pub jvm_map_capacity: u64,
    /// Java threads in the BPF thread map.
    pub java_threads: u64,
    /// Java threads that could not be pushed (map full): their Java frames are not unwound.
    pub java_threads_not_pushed: u64,
}

pub struct JvmTracker<S: LayoutSink> {
    sink: S,
    max_jvms: usize,
    /// Only these pids, if not empty.
    pids: Vec<u32>,
    tracked: HashMap<u32, Tracked>,
    layouts: LayoutCache,
    boot_time: Option<u64>,
    ticks_per_second: u64,
    threads_not_pushed: u64,
    directory: ThreadDirectory,
    own_pid: u32,
}

impl<S: LayoutSink> JvmTracker<S> {
    pub fn new(sink: S, max_jvms: usize, pids: Vec<u32>) -> Self {
        Self {
            sink,
            max_jvms,
            pids,
            tracked: HashMap::new(),
            layouts: LayoutCache::default(),
            boot_time: procfs::boot_time_secs().ok(),
            ticks_per_second: procfs::ticks_per_second(),
            threads_not_pushed: 0,
            directory: ThreadDirectory::default(),
            own_pid: std::process::id(),
        }
    }

    /// Publishes each JVM's Java threads to `directory` too.
    pub fn with_directory(mut self, directory: ThreadDirectory) -> Self {
        self.directory = directory;
        self
    }

    pub fn counts(&self) -> TrackerCounts {
        let mut counts = TrackerCounts {
            layouts_cached: self.layouts.len() as u64,
            jvm_map_capacity: self.max_jvms as u64,
            java_threads_not_pushed: self.threads_not_pushed,
            ..Default::default()
        };
        for tracked in self.tracked.values() {
            match &tracked.state {
                State::Ready { threads, .. } => {
                    counts.jvms_ready += 1;
                    counts.java_threads += threads.len() as u64;
                }
                State::Pending { .. } => counts.jvms_pending += 1,
                State::Failed => counts.jvms_failed += 1,
                State::OverBound => counts.jvms_over_bound += 1,
                State::NotJvm { .. } => {}
            }
        }
        counts
    }

    /// One pass over /proc.
    pub fn scan(&mut self) {
        // With `--pid`, only those: enumerating /proc opens every process's directory.
        let processes: Vec<procfs::process::Process> = if self.pids.is_empty() {
            let Ok(all) = procfs::process::all_processes() else {
                return;
            };
            all.flatten().collect()
        } else {
            self.pids
                .iter()
                .filter_map(|pid| procfs::process::Process::new(*pid as i32).ok())
                .collect()
        };
        let mut alive = HashMap::new();
        for process in processes {
            let pid = process.pid as u32;
            if pid == self.own_pid {
                // This daemon maps libjvm.so when it symbolizes a JVM, but runs none.
                continue;
            }
            let Ok(stat) = process.stat() else { continue };
            if stat.flags & PF_KTHREAD != 0 {
                // Never a JVM; its name changes with the work it runs.
                continue;
            }
            alive.insert(pid, ());
            let known = self
                .tracked
                .get(&pid)
                .is_some_and(|t| t.start_time == stat.starttime);
            if !known {
                if let Some(old) = self.tracked.remove(&pid) {
                    self.forget(pid, old);
                }
                self.tracked.insert(
                    pid,
                    Tracked {
                        start_time: stat.starttime,
                        state: State::NotJvm {
                            comm: String::new(),
                        },
                    },
                );
                self.check(pid, &stat.comm, stat.starttime, true);
            } else {
                self.check(pid, &stat.comm, stat.starttime, false);
            }
        }
        let gone: Vec<u32> = self
            .tracked
            .keys()
            .filter(|pid| !alive.contains_key(pid))
            .copied()
            .collect();
        for pid in gone {
            if let Some(old) = self.tracked.remove(&pid) {
                self.forget(pid, old);
            }
        }
    }

    fn forget(&mut self, pid: u32, old: Tracked) {
        self.directory.remove(pid);
        if let State::Ready { threads, .. } = old.state {
            self.sink.remove(pid);
            for tid in threads.keys() {
                self.sink.remove_thread(*tid);
            }
            tracing::info!(pid, "JVM exited: layout removed");
        }
    }

    fn age(&self, start_time: u64) -> Duration {
        let Some(boot) = self.boot_time else {
            return Duration::ZERO;
        };
        let started = boot as f64 + start_time as f64 / self.ticks_per_second as f64;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        Duration::from_secs_f64((now - started).max(0.0))
    }

    fn check(&mut self, pid: u32, comm: &str, start_time: u64, first: bool) {
        let age = self.age(start_time);
        let ready_count = self
            .tracked
            .values()
            .filter(|t| matches!(t.state, State::Ready { .. }))
            .count();
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        match &mut tracked.state {
            State::Failed | State::OverBound => {}
            State::NotJvm { comm: last_comm } => {
                let changed = last_comm != comm;
                if !(first || changed || age < YOUNG) {
                    return;
                }
                *last_comm = comm.to_owned();
                let Ok(process) = ProcessInfo::read(pid) else {
                    return;
                };
                if super::libjvm::LibJvmMapping::find(&process).is_none() {
                    return;
                }
                tracked.state = State::Pending {
                    jvm: None,
                    attempts: 0,
                    last_error: String::new(),
                };
                self.advance(pid, age, ready_count);
            }
            State::Pending { attempts, .. } => {
                // A JVM starts in well under FAST_RETRIES scans; one that does not (or a
                // process that only looks like one) is retried seldom after that.
                if *attempts >= FAST_RETRIES && (*attempts - FAST_RETRIES) % SLOW_RETRY_EVERY != 0
                {
                    *attempts += 1;
                    return;
                }
                self.advance(pid, age, ready_count)
            }
            State::Ready { refreshed, .. } => {
                if refreshed.elapsed() >= REFRESH {
                    self.refresh(pid);
                }
                self.sync_threads(pid);
            }
        }
    }

    /// Moves a pending JVM towards ready.
    fn advance(&mut self, pid: u32, age: Duration, ready_count: usize) {
        let memory = ProcessMemory::new(pid);
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        let State::Pending {
            jvm,
            attempts,
            last_error,
        } = &mut tracked.state
        else {
            return;
        };
        *attempts += 1;
        if jvm.is_none() {
            let process = match ProcessInfo::read(pid) {
                Ok(process) => process,
                Err(_) => return,
            };
            match Jvm::inspect(&process, &memory, &mut self.layouts) {
                Ok(found) => *jvm = Some(Box::new(found)),
                Err(err) => {
                    if is_final(&err) {
                        tracing::warn!(pid, %err, "cannot read this JVM's layout: its Java frames will stay unnamed");
                        tracked.state = State::Failed;
                    } else {
                        if *attempts % 20 == 1 {
                            tracing::debug!(pid, attempts = *attempts, %err, "JVM not readable yet");
                        }
                        *last_error = err.to_string();
                    }
                    return;
                }
            }
        }
        let Some(found) = jvm.as_ref() else { return };
        let code = match found.code_cache(&memory) {
            Ok(code) => code,
            Err(err) => {
                *last_error = err.to_string();
                if *attempts % 20 == 0 {
                    tracing::debug!(pid, attempts = *attempts, %err, "JVM not ready yet");
                }
                return;
            }
        };
        let proc_info = match hotspot_proc(found, &code) {
            Ok(proc_info) => proc_info,
            Err(err) => {
                tracing::warn!(pid, %err, "JVM layout does not fit the BPF unwinder");
                tracked.state = State::Failed;
                return;
            }
        };
        if ready_count >= self.max_jvms {
            tracing::warn!(
                pid,
                max_jvms = self.max_jvms,
                "too many JVMs: this one's Java frames will stay unnamed"
            );
            tracked.state = State::OverBound;
            return;
        }
        if let Err(err) = self.sink.put(pid, &proc_info) {
            tracing::warn!(pid, %err, "cannot push JVM layout to BPF");
            return;
        }
        let Some(jvm) = jvm.take() else { return };
        tracing::info!(
            pid,
            version = %jvm.version.release,
            since_process_start_ms = age.as_millis() as u64,
            code_heaps = code.heaps.len(),
            "JVM layout pushed"
        );
        tracked.state = State::Ready {
            jvm,
            pushed: Box::new(proc_info),
            refreshed: Instant::now(),
            threads: HashMap::new(),
            thread_list: None,
            threads_read: Instant::now(),
            other_pid_namespace: None,
        };
        self.sync_threads(pid);
    }

    /// Brings the BPF map of this JVM's Java threads up to date (threads start and end often).
    /// Skipped while the JVM's thread list is the one read last time, but for a full read every
    /// [`FULL_THREAD_READ`] in case a new list was allocated where the old one was.
    fn sync_threads(&mut self, pid: u32) {
        let memory = ProcessMemory::new(pid);
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        let State::Ready {
            jvm,
            threads,
            thread_list,
            threads_read,
            other_pid_namespace,
            ..
        } = &mut tracked.state
        else {
            return;
        };
        let list = jvm.java_thread_list(&memory).ok().flatten();
        if list.is_some() && list == *thread_list && threads_read.elapsed() < FULL_THREAD_READ {
            self.directory.confirm(pid);
            return;
        }
        let Ok(current) = jvm.java_threads(&memory) else {
            return;
        };
        self.directory.publish(
            pid,
            current.iter().map(|&(ns_tid, thread)| (thread, ns_tid)),
        );
        *thread_list = list;
        *threads_read = Instant::now();
        if other_pid_namespace.is_none() {
            *other_pid_namespace = in_other_pid_namespace(pid);
        }
        let to_host = if *other_pid_namespace == Some(true) {
            host_tids(pid)
        } else {
            None
        };
        let current: HashMap<u32, u64> = current
            .into_iter()
            .filter_map(|(ns_tid, thread)| {
                let host = match &to_host {
                    Some(map) => *map.get(&ns_tid)?,
                    None => ns_tid,
                };
                Some((host, thread))
            })
            .collect();
        for (tid, thread) in &current {
            if threads.get(tid) != Some(thread) {
                if let Err(err) = self.sink.put_thread(*tid, *thread) {
                    self.threads_not_pushed += 1;
                    tracing::debug!(pid, tid, %err, "cannot push Java thread");
                }
            }
        }
        for tid in threads.keys() {
            if !current.contains_key(tid) {
                self.sink.remove_thread(*tid);
            }
        }
        *threads = current;
    }

    /// Re-reads a ready JVM's code cache and updates the map if it changed.
    fn refresh(&mut self, pid: u32) {
        let memory = ProcessMemory::new(pid);
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        let State::Ready {
            jvm,
            pushed,
            refreshed,
            ..
        } = &mut tracked.state
        else {
            return;
        };
        *refreshed = Instant::now();
        let Ok(code) = jvm.code_cache(&memory) else {
            return;
        };
        let Ok(proc_info) = hotspot_proc(jvm, &code) else {
            return;
        };
        if proc_info != **pushed && self.sink.put(pid, &proc_info).is_ok() {
            **pushed = proc_info;
            tracing::debug!(pid, "JVM code cache changed: layout updated");
        }
    }
}

/// Whether `pid` lives in another pid namespace than the daemon (a container); `None` if
/// either namespace cannot be read.
fn in_other_pid_namespace(pid: u32) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/ns/pid").ok()?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    Some(ours.ino() != theirs.ino() || ours.dev() != theirs.dev())
}

/// For a process in another pid namespace, its tids as it sees them mapped to host tids (from
/// `NSpid` in /proc/PID/task/*/status).
fn host_tids(pid: u32) -> Option<HashMap<u32, u32>> {
    let mut map = HashMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let task = entry.file_name();
        let Ok(status) = crate::untrusted::read_proc_text(
            pid,
            &format!("task/{}/status", task.to_string_lossy()),
            crate::untrusted::MAX_PROC_FILE,
        ) else {
            continue;
        };
        let Some(line) = status.lines().find_map(|l| l.strip_prefix("NSpid:")) else {
            continue;
        };
        let ids: Vec<u32> = line
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        if let (Some(host), Some(inner)) = (ids.first(), ids.last()) {
            map.insert(*inner, *host);
        }
    }
    Some(map)
}

/// Errors that retrying will not fix.
fn is_final(err: &JvmError) -> bool {
    matches!(
        err,
        JvmError::Layout(_) | JvmError::LibJvm(super::libjvm::LibJvmError::MissingSymbol { .. })
    ) || err.is_permission_denied()
}
