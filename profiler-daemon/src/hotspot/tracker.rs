//! Finds JVMs as they start and exit, and keeps the BPF map of their unwinding layouts current.
//!
//! The tracker learns about processes from events rather than by listing /proc: the BPF
//! tracepoints report each exec and exit, and the sampling loop reports the processes sampled
//! in each interval. It ticks twice a second ([`TICK_PERIOD`]), and in between takes the events
//! and looks at the processes starting every [`QUICK_TICK_PERIOD`] ([`JvmTracker::quick_tick`]:
//! until a JVM's layout is pushed, its samples have no Java frames, and a short-lived JVM's
//! first second is much of its life). It reads /proc only for:
//! - a process that just exec'd, checked for a mapped libjvm.so at growing ages (the launcher
//!   maps libjvm a moment after exec) while it is young;
//! - a sampled process it does not know, or has not checked for a minute (a program may load
//!   libjvm late, through the invocation API);
//! - the JVMs: a JVM is read as soon as its VM has initialised (code heaps set up; until then
//!   it is "pending" and retried), its layout pushed into the `HOTSPOT_PROCS` map, refreshed
//!   every few seconds, its Java threads kept current, and removed when the process exits.
//!   Until its layout is pushed a JVM's Java frames are walked as native code, so a tick pushes
//!   the layout of every JVM it found ready first, and only then gives each the slower rest
//!   (virtual threads' layout, Java threads, libjvm hooks).
//!
//! Every [`RESCAN_PERIOD`] it lists /proc anyway, for what events cannot tell: events lost to
//! a full ring (counted), and processes that were there before the daemon. With `--pid`, only
//! the processes named are looked at, every tick. Pids are recycled quickly (pid_max is often
//! 32768): a process is identified by pid and start time. Each JVM's Java threads also go to a
//! [`ThreadDirectory`], for the symbolizer to find a thread's tid by its `JavaThread*`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{HashMap as BpfHashMap, MapData};
use profiler_common::{
    hotspot_flags, HotspotProc, JavaThreadEntry, ProcessEvent, ProcessEventKind, BREAKPOINT_ALLOC,
    BREAKPOINT_THREAD_EXIT, JAVA_THREADS_PER_TARGET, JAVA_THREAD_FROM_LIST, JAVA_THREAD_FROM_START,
    MAX_BREAKPOINTS,
};

use super::jvm::{AllocationCounters, Jvm, JvmError};
use super::jvm_directory::JvmDirectory;
use super::libjvm_hooks::LibjvmHooks;
use super::remote::ProcessMemory;
use super::thread_directory::ThreadDirectory;
use super::thread_exits::ExitCounts;
use super::unwind_info::hotspot_proc;
use super::virtual_threads::{
    LibjvmStatics, StaticsByFile, VirtualThreadLayout, FIRST_VIRTUAL_THREADS_JDK,
};
use crate::process::ProcessInfo;
use crate::user_time::{UserTimeShares, WorkTimer};

/// How often the tracker wakes to take events and check what is due.
pub const TICK_PERIOD: Duration = Duration::from_millis(500);
/// How often every process is listed regardless of events.
pub const RESCAN_PERIOD: Duration = Duration::from_secs(60);
/// Threads a JVM's list may hold beyond the tasks /proc showed a moment before (threads start
/// and end between the two reads).
const THREAD_LIST_SLACK: usize = 64;
/// How often a JVM's Java threads are read in full even if its thread list looks unchanged.
const FULL_THREAD_READ: Duration = Duration::from_secs(10);
/// How often the tracker looks at the processes starting ([`JvmTracker::quick_tick`]).
pub const QUICK_TICK_PERIOD: Duration = Duration::from_millis(100);
/// Processes younger than this (since start or exec) are starting: their young checks and, if
/// JVMs, their retries come at quick ticks.
const STARTING: Duration = Duration::from_secs(2);
/// The ages (since start or exec) at which a process not yet a JVM is checked for libjvm.
const YOUNG_CHECKS: [Duration; 9] = [
    Duration::ZERO,
    Duration::from_millis(200),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_secs(2),
    Duration::from_secs(4),
    Duration::from_secs(8),
    Duration::from_secs(15),
    Duration::from_secs(30),
];
/// A pending JVM is retried at every tick this many times (quick ticks included: 40 in its
/// first two seconds), then every [`SLOW_RETRY_EVERY`].
const FAST_RETRIES: u32 = 60;
const SLOW_RETRY_EVERY: u32 = 20;
/// `task_struct` flag of kernel threads (`PF_KTHREAD`), in /proc/PID/stat's `flags`.
const PF_KTHREAD: u32 = 0x0020_0000;
/// A ready JVM's code cache is re-read this often.
const REFRESH: Duration = Duration::from_secs(5);
/// An inspection of a real JVM takes a few milliseconds; one that fails after this long is a
/// process whose VMStructs make the daemon work (garbage, or hostile), and is backed off.
const COSTLY_INSPECTION: Duration = Duration::from_millis(20);
/// The longest a process that only looks like a JVM waits between inspections.
const MAX_RETRY_DELAY: Duration = Duration::from_secs(600);
/// Inspection time each user's processes may take per [`INSPECTION_WINDOW`]: a user running
/// many fake JVMs delays only their own inspections, never another user's JVM.
const INSPECTION_SHARE: Duration = Duration::from_millis(200);
const INSPECTION_WINDOW: Duration = Duration::from_secs(5);
/// Past their share, a user's pending JVMs are inspected in each tick's spare time: after every
/// other process due in that tick, for at most this long. A node whose pods all run as one user
/// starts many JVMs at once; they are found in seconds, not one share per window, and still
/// never ahead of another user's JVM (which the next tick serves first).
const SPARE_TIME_PER_TICK: Duration = Duration::from_millis(100);

/// After `failures` costly failed inspections: 1 s, 2 s, 4 s... up to [`MAX_RETRY_DELAY`].
fn costly_retry_delay(failures: u32) -> Duration {
    Duration::from_secs(1u64 << failures.saturating_sub(1).min(10)).min(MAX_RETRY_DELAY)
}

/// Where layouts and Java threads go: the BPF maps, or a fake in tests.
pub trait LayoutSink {
    fn put(&mut self, pid: u32, proc_info: &HotspotProc) -> Result<(), String>;
    fn remove(&mut self, pid: u32);
    /// `tid` is a host tid of the JVM `pid`.
    fn put_thread(&mut self, tid: u32, pid: u32, java_thread: u64) -> Result<(), String>;
    fn remove_thread(&mut self, tid: u32);
    /// Counts the ended threads' bytes of JVM `pid`, whose thread-exit hook is in place, with
    /// its threads' `counters` (None: stops, the hook is gone).
    fn count_exits(&mut self, _pid: u32, _counters: Option<AllocationCounters>) {}
}

/// The BPF maps the tracker writes.
pub struct BpfMaps {
    pub procs: BpfHashMap<MapData, u32, HotspotProc>,
    pub threads: BpfHashMap<MapData, u32, JavaThreadEntry>,
    /// With allocation profiling.
    pub exits: Option<ExitCounts>,
}

impl LayoutSink for BpfMaps {
    fn put(&mut self, pid: u32, proc_info: &HotspotProc) -> Result<(), String> {
        self.procs
            .insert(pid, *proc_info, 0)
            .map_err(|err| err.to_string())
    }

    fn remove(&mut self, pid: u32) {
        let _ = self.procs.remove(&pid);
        self.count_exits(pid, None);
    }

    fn count_exits(&mut self, pid: u32, counters: Option<AllocationCounters>) {
        let Some(exits) = &self.exits else {
            return;
        };
        match counters {
            Some(counters) => {
                if let Err(err) = exits.start(pid, counters) {
                    tracing::debug!(pid, %err, "ended threads' allocations not counted");
                }
            }
            None => exits.stop(pid),
        }
    }

    fn put_thread(&mut self, tid: u32, pid: u32, java_thread: u64) -> Result<(), String> {
        // The thread-start hook described it already: its entry stays the hook's, which the
        // hook counts until the thread exits.
        if self.threads.get(&tid, 0).is_ok_and(|entry| {
            entry.pid == pid
                && entry.java_thread == java_thread
                && entry.origin == JAVA_THREAD_FROM_START
        }) {
            return Ok(());
        }
        let entry = JavaThreadEntry {
            java_thread,
            pid,
            origin: JAVA_THREAD_FROM_LIST,
        };
        self.threads
            .insert(tid, entry, 0)
            .map_err(|err| err.to_string())
    }

    fn remove_thread(&mut self, tid: u32) {
        // An entry of the thread-start hook goes when its thread exits (the BPF side uncounts
        // it then); the list may drop the thread a little before.
        if self
            .threads
            .get(&tid, 0)
            .is_ok_and(|entry| entry.origin == JAVA_THREAD_FROM_START)
        {
            return;
        }
        let _ = self.threads.remove(&tid);
    }
}

enum State {
    NotJvm {
        /// Its name at the last check: a change means an exec the events did not report.
        comm: String,
        /// When it started, or exec'd: the young checks are timed from it.
        born: Instant,
        /// Young checks done (an index into [`YOUNG_CHECKS`]).
        young_checks: usize,
        checked: Instant,
    },
    /// A JVM still starting (or briefly unreadable): retried each scan.
    Pending {
        jvm: Option<Arc<Jvm>>,
        attempts: u32,
        last_error: String,
        /// Inspections that failed after costing more than [`COSTLY_INSPECTION`]: a process
        /// that only looks like a JVM is retried ever more seldom.
        costly_failures: u32,
        /// Not retried before this.
        retry_at: Instant,
    },
    Ready {
        jvm: Arc<Jvm>,
        pushed: Box<HotspotProc>,
        refreshed: Instant,
        /// Java threads pushed: host tid -> JavaThread*.
        threads: HashMap<u32, u64>,
        /// The ThreadsSMR list `threads` was read from, and when the set was last read in full.
        thread_list: Option<u64>,
        threads_read: Instant,
        /// Whether the JVM lives in another pid namespace (fixed for a process's life).
        other_pid_namespace: Option<bool>,
        /// Its libjvm's virtual-thread statics (JDK 21+), to read its layout again while it is
        /// incomplete (JDK 21 generates the continuation entry on first use).
        frozen_statics: Option<Arc<LibjvmStatics>>,
    },
    /// Not readable for good (layout missing a field, no permission): not retried.
    Failed,
    /// Over the `max_jvms` bound.
    OverBound,
}

struct Tracked {
    start_time: u64,
    /// The owner of its `/proc` entry (its effective uid when it was first seen): whose share
    /// of the tracker's time its inspections take.
    uid: u32,
    state: State,
}

/// Whether the young check number `done` of a process born at `born` has come.
fn young_check_due(born: Instant, done: usize) -> bool {
    YOUNG_CHECKS
        .get(done)
        .is_some_and(|age| born.elapsed() >= *age)
}

impl Tracked {
    /// Whether it is starting: a process younger than [`STARTING`] (since its start or exec)
    /// not known as a JVM yet; `age` gives a process's age from its start time.
    fn starting(&self, age: impl Fn(u64) -> Duration) -> bool {
        match &self.state {
            State::NotJvm { born, .. } => born.elapsed() < STARTING,
            State::Pending { .. } => age(self.start_time) < STARTING,
            State::Ready { .. } | State::Failed | State::OverBound => false,
        }
    }

    /// Whether a tick should look at it without being told.
    fn due(&self) -> bool {
        match &self.state {
            State::NotJvm {
                born, young_checks, ..
            } => young_check_due(*born, *young_checks),
            State::Pending { .. } | State::Ready { .. } => true,
            State::Failed | State::OverBound => false,
        }
    }
}

/// Whose time an inspection takes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Share {
    /// Its user's share of the window, if not spent.
    Own,
    /// The tick's spare time, after everyone else's due work.
    Spare,
}

/// Why a process is looked at.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Visit {
    /// It just exec'd: its young checks are timed from now.
    Exec,
    /// A tick found it due, an exit event named it, `--pid` lists it, or the periodic listing
    /// of /proc met it.
    Due,
    /// It was sampled.
    Sampled,
}

/// Tallies exported with the daemon's counters.
#[derive(Clone, Copy, Debug, Default)]
pub struct TrackerCounts {
    pub jvms_ready: u64,
    pub jvms_pending: u64,
    pub jvms_failed: u64,
    pub jvms_over_bound: u64,
    /// Entries of the BPF JVM map, and its capacity (`max_jvms`).
    pub jvm_map_capacity: u64,
    /// Java threads in the BPF thread map, and its capacity.
    pub java_threads: u64,
    pub java_thread_map_capacity: u64,
    /// Java threads that could not be pushed (map full): their Java frames are not unwound.
    pub java_threads_not_pushed: u64,
    /// Process events taken from the BPF side, by kind.
    pub exec_events: u64,
    pub exit_events: u64,
    /// Full listings of /proc.
    pub rescans: u64,
    /// Panics caught around the tracker's ticks (counted by the thread that runs it).
    pub panics: u64,
    /// JVMs that became ready with their libjvm hooked (thread start, and allocation events
    /// with `--alloc`), and without (since the start); the hook budget's state.
    pub jvms_libjvm_hooked: u64,
    pub jvms_libjvm_not_hooked: u64,
    pub libjvm_hooked_files: u64,
    pub libjvm_waiting_files: u64,
    pub libjvm_hook_attach_failures: u64,
}

pub struct JvmTracker<S: LayoutSink> {
    sink: S,
    max_jvms: usize,
    /// Only these pids, if not empty.
    pids: Vec<u32>,
    tracked: HashMap<u32, Tracked>,
    jvms: JvmDirectory,
    boot_time: Option<u64>,
    ticks_per_second: u64,
    threads_not_pushed: u64,
    /// Host tid -> the JVM whose entry the thread map holds for it: a JVM removes only its own
    /// entries (a tid freed by one process and reused by another is the other's).
    thread_owners: HashMap<u32, u32>,
    inspection_budget: UserTimeShares,
    /// Pending JVMs (pid, age) refused in this tick because their user's share was spent.
    over_share: Vec<(u32, Duration)>,
    /// JVMs whose layout was pushed in this tick, to be finished at its end
    /// ([`JvmTracker::finish_made_ready`]).
    made_ready: Vec<u32>,
    directory: ThreadDirectory,
    own_pid: u32,
    rescanned: Option<Instant>,
    exec_events: u64,
    /// Whether a process may be starting: set by each tick and exec event, cleared by a quick
    /// tick that found none, so that quick ticks between starts look at no process.
    maybe_starting: bool,
    exit_events: u64,
    rescans: u64,
    /// Allocation profiling's hooks, found for each JVM that becomes ready (when it is on).
    libjvm_hooks: Option<LibjvmHooks>,
    /// The last `HotspotProc::instance` given to a JVM.
    last_instance: u32,
    /// Where each libjvm file keeps the statics of its virtual-thread layout.
    statics_by_file: StaticsByFile,
}

impl<S: LayoutSink> JvmTracker<S> {
    pub fn new(sink: S, max_jvms: usize, pids: Vec<u32>) -> Self {
        Self {
            sink,
            max_jvms,
            pids,
            tracked: HashMap::new(),
            jvms: JvmDirectory::default(),
            boot_time: procfs::boot_time_secs().ok(),
            ticks_per_second: procfs::ticks_per_second(),
            threads_not_pushed: 0,
            thread_owners: HashMap::new(),
            inspection_budget: UserTimeShares::new(INSPECTION_SHARE, INSPECTION_WINDOW),
            over_share: Vec::new(),
            made_ready: Vec::new(),
            directory: ThreadDirectory::default(),
            own_pid: std::process::id(),
            rescanned: None,
            exec_events: 0,
            maybe_starting: true,
            exit_events: 0,
            rescans: 0,
            last_instance: 0,
            statics_by_file: StaticsByFile::default(),
            libjvm_hooks: None,
        }
    }

    /// Finds the allocation events of each JVM's libjvm as it becomes ready.
    pub fn with_libjvm_hooks(mut self, hooks: Option<LibjvmHooks>) -> Self {
        self.libjvm_hooks = hooks;
        self
    }

    /// Shares the JVMs it inspects (and their layouts) with the symbolizer.
    pub fn with_jvms(mut self, jvms: JvmDirectory) -> Self {
        self.jvms = jvms;
        self
    }

    /// Publishes each JVM's Java threads to `directory` too.
    pub fn with_directory(mut self, directory: ThreadDirectory) -> Self {
        self.directory = directory;
        self
    }

    pub fn counts(&self) -> TrackerCounts {
        let mut counts = TrackerCounts {
            jvm_map_capacity: self.max_jvms as u64,
            java_thread_map_capacity: u64::from(profiler_common::java_thread_slots(
                self.pids.len(),
            )),
            java_threads_not_pushed: self.threads_not_pushed,
            exec_events: self.exec_events,
            exit_events: self.exit_events,
            rescans: self.rescans,
            jvms_libjvm_hooked: self.libjvm_hooks.as_ref().map_or(0, |h| h.jvms_hooked),
            jvms_libjvm_not_hooked: self.libjvm_hooks.as_ref().map_or(0, |h| h.jvms_not_hooked),
            libjvm_hooked_files: self
                .libjvm_hooks
                .as_ref()
                .map_or(0, |h| h.hooked_files() as u64),
            libjvm_waiting_files: self
                .libjvm_hooks
                .as_ref()
                .map_or(0, |h| h.waiting_files() as u64),
            libjvm_hook_attach_failures: self
                .libjvm_hooks
                .as_ref()
                .map_or(0, |h| h.attach_failures),
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

    /// One wake-up: takes the process events and the pids sampled since the last tick, and
    /// looks at what they name and at what is due.
    pub fn tick(&mut self, events: &[ProcessEvent], sampled: &[u32]) {
        // Processes met by this tick may be starting.
        self.maybe_starting = true;
        self.visit_due(events, sampled);
        self.use_spare_time();
        self.finish_made_ready();
        // Hooks released as their JVMs exit, and given to JVMs that waited for room.
        let hooked_late = self
            .libjvm_hooks
            .as_mut()
            .map(|h| h.tick())
            .unwrap_or_default();
        for (pid, breakpoints) in hooked_late {
            self.push_breakpoints(pid, breakpoints);
        }
    }

    /// Between ticks: takes the events, and looks at the processes starting that are due
    /// (young checks, pending JVMs), pushing the layout of any JVM found ready. Nothing else:
    /// the ready JVMs wait for the next tick.
    pub fn quick_tick(&mut self, events: &[ProcessEvent]) {
        if self.pids.is_empty() {
            self.take_events(events);
        }
        if !self.maybe_starting {
            return;
        }
        let starting = self.starting();
        self.maybe_starting = !starting.is_empty();
        for pid in starting {
            if self.tracked.get(&pid).is_some_and(Tracked::due) {
                self.visit(pid, Visit::Due);
            }
        }
        self.finish_made_ready();
    }

    /// Whether quick ticks have anything to look for: exec events (whole-host tracking), or
    /// a process that may be starting.
    pub fn wants_quick_ticks(&self) -> bool {
        self.pids.is_empty() || self.maybe_starting
    }

    fn starting(&self) -> Vec<u32> {
        self.tracked
            .iter()
            .filter(|(_, tracked)| tracked.starting(|start| self.age(start)))
            .map(|(pid, _)| *pid)
            .collect()
    }

    /// Looks at the processes that exec'd and exited (whole-host tracking).
    fn take_events(&mut self, events: &[ProcessEvent]) {
        for event in events {
            match ProcessEventKind::from_u32(event.kind) {
                Some(ProcessEventKind::Exec) => {
                    self.exec_events += 1;
                    self.maybe_starting = true;
                    // A new program: whatever the pid was before is gone.
                    if let Some(old) = self.tracked.remove(&event.pid) {
                        self.forget(event.pid, old);
                    }
                    self.visit(event.pid, Visit::Exec);
                }
                Some(ProcessEventKind::Exit) => {
                    self.exit_events += 1;
                    // Forgotten if gone; a zombie main thread with live threads stays.
                    if self.tracked.contains_key(&event.pid) {
                        self.visit(event.pid, Visit::Due);
                    }
                }
                None => {}
            }
        }
    }

    fn visit_due(&mut self, events: &[ProcessEvent], sampled: &[u32]) {
        if !self.pids.is_empty() {
            // No events with `--pid`: a ready JVM is kept current from its memory alone, and
            // /proc read again only when that fails (it exited, or its pid was reused).
            for pid in self.pids.clone() {
                if !(self.is_ready(pid) && self.keep_current(pid)) {
                    self.visit(pid, Visit::Due);
                }
            }
            return;
        }
        self.take_events(events);
        for &pid in sampled {
            self.visit(pid, Visit::Sampled);
        }
        if self
            .rescanned
            .is_none_or(|at| at.elapsed() >= RESCAN_PERIOD)
        {
            self.rescan();
            return;
        }
        let due: Vec<u32> = self
            .tracked
            .iter()
            .filter(|(_, tracked)| tracked.due())
            .map(|(pid, _)| *pid)
            .collect();
        for pid in due {
            // A ready JVM's exit comes as an event (or with the next rescan): no /proc read
            // here unless its memory cannot be read.
            if !(self.is_ready(pid) && self.keep_current(pid)) {
                self.visit(pid, Visit::Due);
            }
        }
    }

    /// Inspects the JVMs refused for their user's share in this tick, least-served user first,
    /// for at most [`SPARE_TIME_PER_TICK`].
    fn use_spare_time(&mut self) {
        let mut refused = std::mem::take(&mut self.over_share);
        if refused.is_empty() {
            return;
        }
        let spent_of = |tracker: &Self, pid: u32| {
            tracker
                .tracked
                .get(&pid)
                .map_or(Duration::MAX, |t| tracker.inspection_budget.spent(t.uid))
        };
        // A pid visited twice in the tick was refused twice.
        refused.sort_unstable_by_key(|(pid, _)| *pid);
        refused.dedup_by_key(|(pid, _)| *pid);
        refused.sort_by_cached_key(|(pid, _)| spent_of(self, *pid));
        let started = Instant::now();
        for (pid, age) in refused {
            if started.elapsed() >= SPARE_TIME_PER_TICK {
                break;
            }
            let ready_count = self.ready_count();
            self.advance(pid, age, ready_count, Share::Spare);
        }
    }

    fn ready_count(&self) -> usize {
        self.tracked
            .values()
            .filter(|t| matches!(t.state, State::Ready { .. }))
            .count()
    }

    /// The start time of `pid` if it is a JVM whose layout is ready (its Java frames unwind).
    pub fn ready_jvm(&self, pid: u32) -> Option<u64> {
        self.tracked
            .get(&pid)
            .filter(|tracked| matches!(tracked.state, State::Ready { .. }))
            .map(|tracked| tracked.start_time)
    }

    /// The JDK major version of `pid`'s JVM, once its layout is ready.
    pub fn ready_jvm_major(&self, pid: u32) -> Option<u32> {
        match &self.tracked.get(&pid)?.state {
            State::Ready { jvm, .. } => Some(jvm.version.major),
            _ => None,
        }
    }

    fn is_ready(&self, pid: u32) -> bool {
        self.tracked
            .get(&pid)
            .is_some_and(|tracked| matches!(tracked.state, State::Ready { .. }))
    }

    /// Lists every process: finds those no event announced and forgets those gone unannounced.
    fn rescan(&mut self) {
        self.rescanned = Some(Instant::now());
        self.rescans += 1;
        let Ok(all) = procfs::process::all_processes() else {
            return;
        };
        let mut alive = std::collections::HashSet::new();
        for process in all.flatten() {
            let pid = process.pid as u32;
            alive.insert(pid);
            self.visit(pid, Visit::Due);
        }
        let gone: Vec<u32> = self
            .tracked
            .keys()
            .filter(|pid| !alive.contains(*pid))
            .copied()
            .collect();
        for pid in gone {
            if let Some(old) = self.tracked.remove(&pid) {
                self.forget(pid, old);
            }
        }
    }

    /// Looks at one process: starts tracking it if new, forgets it if gone, and checks it.
    fn visit(&mut self, pid: u32, why: Visit) {
        if pid == self.own_pid {
            // This daemon maps libjvm.so when it symbolizes a JVM, but runs none.
            return;
        }
        let stat = match crate::process::read_stat(pid) {
            // A zombie without live threads has exited, only its parent has not reaped it yet:
            // what the daemon holds for it (its libjvm's hooks, its layout) goes now.
            Ok(stat) if !(stat.state == 'Z' && stat.num_threads <= 1) => stat,
            _ => {
                if let Some(old) = self.tracked.remove(&pid) {
                    self.forget(pid, old);
                }
                return;
            }
        };
        if stat.flags & PF_KTHREAD != 0 {
            // Never a JVM; its name changes with the work it runs.
            return;
        }
        let known = self
            .tracked
            .get(&pid)
            .is_some_and(|t| t.start_time == stat.starttime);
        if known {
            self.check(pid, &stat.comm, stat.starttime, why);
            return;
        }
        if let Some(old) = self.tracked.remove(&pid) {
            self.forget(pid, old);
        }
        let now = Instant::now();
        // The start time is the fork's (and /proc's clock is coarse): an exec is now.
        let born = match why {
            Visit::Exec => now,
            _ => now.checked_sub(self.age(stat.starttime)).unwrap_or(now),
        };
        self.tracked.insert(
            pid,
            Tracked {
                start_time: stat.starttime,
                uid: crate::process::owner_uid(pid).unwrap_or(u32::MAX),
                state: State::NotJvm {
                    comm: String::new(),
                    born,
                    young_checks: 0,
                    checked: now,
                },
            },
        );
        self.check(pid, &stat.comm, stat.starttime, why);
    }

    fn forget(&mut self, pid: u32, old: Tracked) {
        self.directory.remove(pid);
        self.jvms.forget(pid);
        if let Some(hooks) = &mut self.libjvm_hooks {
            hooks.forget(pid);
        }
        if let State::Ready { threads, .. } = old.state {
            self.sink.remove(pid);
            for tid in threads.keys() {
                self.remove_own_thread(pid, *tid);
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

    fn check(&mut self, pid: u32, comm: &str, start_time: u64, why: Visit) {
        let age = self.age(start_time);
        let ready_count = self.ready_count();
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        match &mut tracked.state {
            State::Failed | State::OverBound => {}
            State::NotJvm {
                comm: last_comm,
                born,
                young_checks,
                checked,
            } => {
                let first = last_comm.is_empty();
                let changed = !first && last_comm != comm;
                if changed {
                    // An exec the events did not report: young again.
                    *born = Instant::now();
                    *young_checks = 0;
                }
                let young_due = young_check_due(*born, *young_checks);
                let sampled_due = why == Visit::Sampled && checked.elapsed() >= RESCAN_PERIOD;
                if !(first || young_due || sampled_due) {
                    return;
                }
                // Past every young check whose time has come.
                while young_check_due(*born, *young_checks) {
                    *young_checks += 1;
                }
                *last_comm = comm.to_owned();
                *checked = Instant::now();
                // One read of its maps; the rest of /proc only for a JVM.
                if super::libjvm::LibJvmMapping::find_in(pid).is_none() {
                    return;
                }
                tracked.state = State::Pending {
                    jvm: None,
                    attempts: 0,
                    last_error: String::new(),
                    costly_failures: 0,
                    retry_at: Instant::now(),
                };
                self.advance(pid, age, ready_count, Share::Own);
            }
            State::Pending {
                attempts, retry_at, ..
            } => {
                if Instant::now() < *retry_at {
                    return;
                }
                // A JVM starts in well under FAST_RETRIES scans; one that does not (or a
                // process that only looks like one) is retried seldom after that.
                if *attempts >= FAST_RETRIES
                    && !(*attempts - FAST_RETRIES).is_multiple_of(SLOW_RETRY_EVERY)
                {
                    *attempts += 1;
                    return;
                }
                self.advance(pid, age, ready_count, Share::Own)
            }
            State::Ready { .. } => {
                self.keep_current(pid);
            }
        }
    }

    /// A ready JVM's layout (every [`REFRESH`]) and Java threads (every tick), brought up to
    /// date. False if its memory could not be read.
    fn keep_current(&mut self, pid: u32) -> bool {
        let refresh_due = self.tracked.get(&pid).is_some_and(|tracked| {
            matches!(&tracked.state, State::Ready { refreshed, .. } if refreshed.elapsed() >= REFRESH)
        });
        if refresh_due {
            self.refresh(pid);
        }
        self.sync_threads(pid)
    }

    /// Moves a pending JVM towards ready.
    fn advance(&mut self, pid: u32, age: Duration, ready_count: usize, share: Share) {
        let memory = ProcessMemory::new(pid);
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return;
        };
        let uid = tracked.uid;
        let State::Pending {
            jvm,
            attempts,
            last_error,
            costly_failures,
            retry_at,
        } = &mut tracked.state
        else {
            return;
        };
        if jvm.is_none() && share == Share::Own && !self.inspection_budget.allows(uid) {
            // This user's processes had their share of the tracker's time: in this tick's
            // spare time, if any is left once everyone else's are done.
            self.over_share.push((pid, age));
            return;
        }
        *attempts += 1;
        if jvm.is_none() {
            let process = match ProcessInfo::read(pid) {
                Ok(process) => process,
                Err(_) => return,
            };
            let timer = WorkTimer::start();
            let inspected = self.jvms.inspect(&process, &memory);
            let took = timer.elapsed();
            self.inspection_budget.charge(uid, took);
            match inspected {
                Ok(found) => *jvm = Some(found),
                Err(err) => {
                    if took >= COSTLY_INSPECTION {
                        *costly_failures += 1;
                        *retry_at = Instant::now() + costly_retry_delay(*costly_failures);
                    }
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
        // A JVM's instance is what the BPF walker's blobs remembered across samples are tagged
        // with: a new one for every JVM made ready (the pid may be a dead JVM's), never 0.
        self.last_instance = self.last_instance.checked_add(1).unwrap_or(1);
        let proc_info = match hotspot_proc(found, &code, self.last_instance) {
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
            frozen_statics: None,
        };
        self.made_ready.push(pid);
    }

    /// What a JVM made ready in this tick needs beyond its layout: its virtual threads' frozen
    /// frames (JDK 21 and later; read from its libjvm's `.symtab`, then pushed with the layout),
    /// its Java threads, and its libjvm hooks. Done once every layout of the tick is pushed:
    /// these take several times what a layout takes (two reads of libjvm's symbol table), and
    /// until its layout is in the map a JVM's Java frames are walked as native code. With five
    /// busy JVMs found at once, doing it all per JVM pushed the last layout 3 to 4 s late.
    fn finish_made_ready(&mut self) {
        for pid in std::mem::take(&mut self.made_ready) {
            let unmount_functions = self.add_virtual_threads_layout(pid);
            let Some(tracked) = self.tracked.get(&pid) else {
                continue;
            };
            let State::Ready { pushed, .. } = &tracked.state else {
                continue;
            };
            let key = (pid, tracked.uid, tracked.start_time, pushed.instance);
            self.sync_threads(pid);
            self.jvms
                .watch_locks_since(pid, std::time::SystemTime::now());
            if let Some(hooks) = &mut self.libjvm_hooks {
                let breakpoints = hooks.on_ready(key, unmount_functions);
                self.push_breakpoints(pid, breakpoints);
            }
        }
    }

    /// Reads a ready JVM's virtual-thread layout (JDK 21 and later) and pushes its layout with
    /// the frozen frames added; the functions that unmount a virtual thread, for the hooks.
    fn add_virtual_threads_layout(&mut self, pid: u32) -> [u64; 2] {
        let Some(Tracked {
            state:
                State::Ready {
                    jvm,
                    pushed,
                    frozen_statics,
                    ..
                },
            ..
        }) = self.tracked.get_mut(&pid)
        else {
            return [0; 2];
        };
        if jvm.version.major < FIRST_VIRTUAL_THREADS_JDK {
            return [0; 2];
        }
        let statics = match self.statics_by_file.of(pid) {
            Ok(statics) => statics,
            Err(why) => {
                tracing::info!(pid, %why, "virtual threads' frozen frames will not be walked");
                return [0; 2];
            }
        };
        let layout = VirtualThreadLayout::of(jvm, &statics, &ProcessMemory::new(pid));
        *frozen_statics = Some(statics);
        let mut proc_info = **pushed;
        if !add_frozen_frames(&mut proc_info, &layout) {
            tracing::debug!(
                pid,
                "virtual threads' layout incomplete (read again as the JVM runs)"
            );
        } else if self.sink.put(pid, &proc_info).is_ok() {
            **pushed = proc_info;
        }
        layout.unmount_functions()
    }

    /// Adds the daemon's breakpoints in a ready JVM to its layout in the BPF map: a thread
    /// caught in one's trap is walked from the probed instruction (see `HotspotProc`).
    fn push_breakpoints(&mut self, pid: u32, breakpoints: [u64; MAX_BREAKPOINTS]) {
        let Some(Tracked {
            state: State::Ready { pushed, jvm, .. },
            ..
        }) = self.tracked.get_mut(&pid)
        else {
            return;
        };
        if pushed.breakpoints == breakpoints {
            return;
        }
        if breakpoints[BREAKPOINT_ALLOC[0]] != 0 {
            self.jvms
                .watch_allocations_since(pid, std::time::SystemTime::now());
        }
        let mut proc_info = **pushed;
        proc_info.breakpoints = breakpoints;
        if self.sink.put(pid, &proc_info).is_ok() {
            **pushed = proc_info;
        }
        let exits = (breakpoints[BREAKPOINT_THREAD_EXIT] != 0)
            .then(|| jvm.allocation_counters().ok())
            .flatten();
        self.sink.count_exits(pid, exits);
    }

    /// Brings the BPF map of this JVM's Java threads up to date (threads start and end often).
    /// Skipped while the JVM's thread list is the one read last time, but for a full read every
    /// [`FULL_THREAD_READ`] in case a new list was allocated where the old one was. False if
    /// the JVM's memory could not be read.
    fn sync_threads(&mut self, pid: u32) -> bool {
        let memory = ProcessMemory::new(pid);
        let Some(tracked) = self.tracked.get_mut(&pid) else {
            return false;
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
            return false;
        };
        let Ok(list) = jvm.java_thread_list(&memory) else {
            return false;
        };
        if list.is_some() && list == *thread_list && threads_read.elapsed() < FULL_THREAD_READ {
            self.directory.confirm(pid);
            return true;
        }
        if other_pid_namespace.is_none() {
            *other_pid_namespace = in_other_pid_namespace(pid);
        }
        // The JVM's thread list is its memory, which its owner can write: a tid it lists is
        // believed only if it is one of its own threads, and a list longer than its threads
        // (with room for those starting or ending meanwhile) is not even read.
        let Some(own_tids) = own_host_tids(pid, *other_pid_namespace == Some(true)) else {
            return false;
        };
        let Ok(listed) = jvm.java_threads(&memory, own_tids.len() + THREAD_LIST_SLACK) else {
            return false;
        };
        let mut verified: Vec<(u32, u32, u64)> = listed
            .into_iter()
            .filter_map(|(ns_tid, thread)| Some((ns_tid, *own_tids.get(&ns_tid)?, thread)))
            .collect();
        if verified.len() > JAVA_THREADS_PER_TARGET as usize {
            self.threads_not_pushed += (verified.len() - JAVA_THREADS_PER_TARGET as usize) as u64;
            verified.truncate(JAVA_THREADS_PER_TARGET as usize);
        }
        self.directory.publish(
            pid,
            verified.iter().map(|&(ns_tid, _, thread)| (thread, ns_tid)),
        );
        *thread_list = list;
        *threads_read = Instant::now();
        let current: HashMap<u32, u64> = verified
            .into_iter()
            .map(|(_, host_tid, thread)| (host_tid, thread))
            .collect();
        let previous = std::mem::replace(threads, current.clone());
        for (tid, thread) in &current {
            let owned = self.thread_owners.get(tid) == Some(&pid);
            if owned && previous.get(tid) == Some(thread) {
                continue;
            }
            // The tid is this JVM's now (just checked): an entry another process left for it
            // is stale, and is replaced.
            match self.sink.put_thread(*tid, pid, *thread) {
                Ok(()) => {
                    self.thread_owners.insert(*tid, pid);
                }
                Err(err) => {
                    self.threads_not_pushed += 1;
                    tracing::debug!(pid, tid, %err, "cannot push Java thread");
                }
            }
        }
        for tid in previous.keys() {
            if !current.contains_key(tid) {
                self.remove_own_thread(pid, *tid);
            }
        }
        true
    }

    /// Removes the thread map's entry for `tid` if JVM `pid` wrote it.
    fn remove_own_thread(&mut self, pid: u32, tid: u32) {
        if self.thread_owners.get(&tid) == Some(&pid) {
            self.thread_owners.remove(&tid);
            self.sink.remove_thread(tid);
        }
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
            frozen_statics,
            ..
        } = &mut tracked.state
        else {
            return;
        };
        *refreshed = Instant::now();
        let Ok(code) = jvm.code_cache(&memory) else {
            return;
        };
        let Ok(mut proc_info) = hotspot_proc(jvm, &code, pushed.instance) else {
            return;
        };
        proc_info.breakpoints = pushed.breakpoints;
        proc_info.frozen = pushed.frozen;
        proc_info.flags |=
            pushed.flags & (hotspot_flags::COMPRESSED_OOPS | hotspot_flags::ZGC_COLORED_OOPS);
        if let Some(statics) = frozen_statics
            .as_ref()
            .filter(|_| proc_info.frozen.entry_return_pc == 0)
        {
            add_frozen_frames(
                &mut proc_info,
                &VirtualThreadLayout::of(jvm, statics, &memory),
            );
        }
        if proc_info != **pushed && self.sink.put(pid, &proc_info).is_ok() {
            **pushed = proc_info;
            tracing::debug!(pid, "JVM code cache changed: layout updated");
        }
    }
}

/// Adds to `proc_info` what the BPF walker needs to walk the frames of a JVM's mounted virtual
/// threads still frozen in their stack chunks, from its virtual-thread `layout`. False when the
/// layout is incomplete (not generated yet, or an offset that does not fit): the frozen frames
/// are then left out as before.
fn add_frozen_frames(proc_info: &mut HotspotProc, layout: &VirtualThreadLayout) -> bool {
    let Some(frozen) = layout.frozen_frames() else {
        return false;
    };
    proc_info.frozen = frozen;
    if layout.oops_compressed() {
        proc_info.flags |= hotspot_flags::COMPRESSED_OOPS;
    }
    if layout.oops_zgc_colored() {
        proc_info.flags |= hotspot_flags::ZGC_COLORED_OOPS;
    }
    true
}

/// Whether `pid` lives in another pid namespace than the daemon (a container); `None` if
/// either namespace cannot be read.
fn in_other_pid_namespace(pid: u32) -> Option<bool> {
    use std::os::unix::fs::MetadataExt;
    let ours = std::fs::metadata("/proc/self/ns/pid").ok()?;
    let theirs = std::fs::metadata(format!("/proc/{pid}/ns/pid")).ok()?;
    Some(ours.ino() != theirs.ino() || ours.dev() != theirs.dev())
}

/// The threads of `pid` (from /proc/PID/task), as the process sees their tids mapped to host
/// tids: the same numbers in our pid namespace, else through `NSpid` in each task's status.
fn own_host_tids(pid: u32, other_pid_namespace: bool) -> Option<HashMap<u32, u32>> {
    let mut map = HashMap::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task"))
        .ok()?
        .flatten()
    {
        let task = entry.file_name();
        let Some(host) = task.to_str().and_then(|t| t.parse::<u32>().ok()) else {
            continue;
        };
        if !other_pid_namespace {
            map.insert(host, host);
            continue;
        }
        let Ok(status) = crate::untrusted::read_proc_text(
            pid,
            &format!("task/{host}/status"),
            crate::untrusted::MAX_PROC_FILE,
        ) else {
            continue;
        };
        let Some(ids) = crate::proc_status::parse(&status).and_then(|s| s.nspid) else {
            continue;
        };
        if let (Some(&first), Some(&inner)) = (ids.first(), ids.last()) {
            if first as u32 == host {
                map.insert(inner as u32, host);
            }
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Records nothing: these tests meet no JVM.
    struct NoMaps;

    impl LayoutSink for NoMaps {
        fn put(&mut self, _: u32, _: &HotspotProc) -> Result<(), String> {
            Ok(())
        }
        fn remove(&mut self, _: u32) {}
        fn put_thread(&mut self, _: u32, _: u32, _: u64) -> Result<(), String> {
            Ok(())
        }
        fn remove_thread(&mut self, _: u32) {}
    }

    fn event(kind: ProcessEventKind, pid: u32) -> ProcessEvent {
        ProcessEvent {
            kind: kind as u32,
            pid,
        }
    }

    fn not_jvm(born: Instant, young_checks: usize) -> Tracked {
        Tracked {
            start_time: 0,
            uid: 0,
            state: State::NotJvm {
                comm: "x".into(),
                born,
                young_checks,
                checked: born,
            },
        }
    }

    #[test]
    fn young_processes_are_due_at_growing_ages_then_never() {
        let now = Instant::now();
        let at = |age_ms: u64| now - Duration::from_millis(age_ms);
        assert!(not_jvm(at(0), 0).due());
        assert!(!not_jvm(at(100), 1).due(), "second check at 200 ms");
        assert!(not_jvm(at(250), 1).due());
        assert!(!not_jvm(at(3_000), 5).due(), "sixth check at 4 s");
        assert!(not_jvm(at(31_000), YOUNG_CHECKS.len() - 1).due());
        assert!(
            !not_jvm(at(600_000), YOUNG_CHECKS.len()).due(),
            "checks done"
        );
    }

    #[test]
    fn events_start_and_end_tracking_without_listing_proc() {
        let mut tracker = JvmTracker::new(NoMaps, 4, Vec::new());
        // As if listed a moment ago: this test sees events only.
        tracker.rescanned = Some(Instant::now());
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        let pid = child.id();

        tracker.tick(&[event(ProcessEventKind::Exec, pid)], &[]);
        assert!(tracker.tracked.contains_key(&pid), "tracked after its exec");
        assert!(
            matches!(
                tracker.tracked[&pid].state,
                State::NotJvm {
                    young_checks: 1,
                    ..
                }
            ),
            "checked once, young"
        );

        child.kill().expect("kill");
        child.wait().expect("reap");
        tracker.tick(&[event(ProcessEventKind::Exit, pid)], &[]);
        assert!(
            !tracker.tracked.contains_key(&pid),
            "forgotten after its exit"
        );
        let counts = tracker.counts();
        assert_eq!((counts.exec_events, counts.exit_events), (1, 1));
        assert_eq!(counts.rescans, 0);
    }

    #[test]
    fn sampled_processes_are_tracked_and_kernel_threads_and_the_daemon_are_not() {
        let mut tracker = JvmTracker::new(NoMaps, 4, Vec::new());
        tracker.rescanned = Some(Instant::now());
        let own = std::process::id();
        // pid 2 is kthreadd, the kernel threads' parent, in the initial pid namespace.
        tracker.tick(&[event(ProcessEventKind::Exec, own)], &[2, 1]);
        assert!(!tracker.tracked.contains_key(&own));
        assert!(!tracker.tracked.contains_key(&2));
        assert!(
            tracker.tracked.contains_key(&1),
            "init, sampled, is tracked"
        );
    }

    /// Only a process's own threads are accepted from its thread list: ours are, another
    /// process's are not.
    #[test]
    fn a_processes_own_tids_are_its_tasks_only() {
        let ours = own_host_tids(std::process::id(), false).expect("our tasks");
        // SAFETY: gettid has no preconditions.
        let this_thread = unsafe { libc::gettid() } as u32;
        assert_eq!(ours.get(&this_thread), Some(&this_thread));
        let mut other = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("spawn sleep");
        assert!(!ours.contains_key(&other.id()), "another process's tid");
        let theirs = own_host_tids(other.id(), false).expect("its tasks");
        assert!(!theirs.contains_key(&this_thread));
        // Read through NSpid, as for a process in another pid namespace: the same here.
        assert_eq!(own_host_tids(other.id(), true), Some(theirs));
        let _ = other.kill();
        let _ = other.wait();
    }

    #[test]
    fn a_rescan_lists_every_process_once_a_period() {
        let mut tracker = JvmTracker::new(NoMaps, 4, Vec::new());
        tracker.tick(&[], &[]);
        assert_eq!(tracker.counts().rescans, 1);
        assert!(tracker.tracked.contains_key(&1));
        tracker.tick(&[], &[]);
        assert_eq!(tracker.counts().rescans, 1, "not again within the period");
    }
}
