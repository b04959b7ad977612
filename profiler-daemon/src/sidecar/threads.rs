//! Full Java thread names from the sidecar agent, by native thread id.
//!
//! The kernel keeps 15 bytes of a thread's name (`comm`): `http-nio-8080-exec-12` is sampled as
//! `http-nio-8080-e`, like every other thread of its pool. The agent writes a
//! [`Record::ThreadStart`](profiler_jvmti_records::record::Record::ThreadStart) (tid from
//! `gettid()` on the new thread, full Java name) for each thread started while it is loaded, and
//! a `ThreadEnd` when it ends; this map keeps them, bounded, per JVM.
//!
//! A name is only used when the sampled `comm` confirms it: HotSpot names a Java thread's native
//! thread after the first 15 bytes of its Java name, so `comm` must be exactly that prefix.
//! That rules out a tid the kernel reused for another thread whose end the agent missed, a
//! thread renamed since (`Thread.setName` on the thread itself renames its native thread
//! too), and threads the JVM did not name (the `main` thread runs as `java`): those keep
//! `comm`.
//!
//! Threads that started before the agent (a dynamic attach, e.g. an application server's pool
//! threads) or before VM init have no `ThreadStart`: the agent lists the live threads with a
//! [`Record::LiveThread`](profiler_jvmti_records::record::Record::LiveThread) each, naming
//! a thread by its `JavaThread*`. Those wait here, pending, until the JVM tracker's
//! [`JvmThreads`] (the JVM's own thread list: `JavaThread*` -> tid) says which tid runs the
//! thread, and only a set known current after the record was read resolves them: a
//! `JavaThread*` is reused memory once its thread ends. A listed name never replaces a
//! `ThreadStart` name of the same tid (the thread itself said that one), and is used under the
//! same `comm` rule; a `ThreadEnd` removes it like any other. A pointer that set does not
//! know belongs to a thread that has ended: dropped. One the tracker never resolves (a JVM it
//! does not read) is dropped after [`PENDING_FOR`].
//!
//! The agent's tids are those of the JVM's pid namespace; samples carry host tids. For a JVM in
//! its own pid namespace, a host tid is translated once through `/proc/PID/task/TID/status`
//! (`NSpid`), and remembered.
//!
//! Names are the JVM user's input: cut to [`MAX_THREAD_NAME_BYTES`] on a character boundary,
//! control characters replaced by `?`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use profiler_jvmti_records::record::MAX_THREAD_NAME_BYTES;

use crate::hotspot::thread_directory::JvmThreads;
pub use crate::profile_model::NameSource;
use crate::untrusted;

/// Bound on names kept per JVM (live threads; a JVM with more is rare). Past it new threads
/// keep their `comm` until others end.
pub const MAX_THREADS: usize = 16_384;
/// Bound on remembered host -> namespace tid translations per JVM; cleared when reached.
const MAX_TRANSLATIONS: usize = 16_384;
/// A task's status file is small; anything longer is refused.
const MAX_STATUS_BYTES: usize = 64 << 10;
/// How long a listed thread waits for the tracker to know its `JavaThread*`.
pub const PENDING_FOR: Duration = Duration::from_secs(60);

/// A thread's full name, and whether it came from a `ThreadStart` (else from a listing).
struct Known {
    name: Box<str>,
    started: bool,
}

/// A listed thread whose tid is not known yet.
struct Pending {
    name: Box<str>,
    /// When the daemon read its record.
    read_at: Instant,
}

/// The thread names of one JVM.
pub struct ThreadNames {
    /// Host pid, to translate host tids; None when the JVM shares the daemon's pid namespace.
    translate_in: Option<u32>,
    /// Namespace tid -> sanitized name.
    names: HashMap<u32, Known>,
    /// Listed threads by `JavaThread*`, until their tid is known.
    pending: HashMap<u64, Pending>,
    /// [`JvmThreads::current_at`] of the set `pending` was last resolved against, unless a
    /// thread was listed since.
    resolved_at: Option<Instant>,
    /// Host tid -> namespace tid (None: the task is gone or unreadable).
    translated: HashMap<u32, Option<u32>>,
    /// Names not kept because the map was full.
    pub refused: u64,
}

impl ThreadNames {
    /// For the JVM of host pid `pid`, whose pid in its own namespace is `nspid`.
    pub fn new(pid: u32, nspid: u32) -> Self {
        Self {
            translate_in: (pid != nspid).then_some(pid),
            names: HashMap::new(),
            pending: HashMap::new(),
            resolved_at: None,
            translated: HashMap::new(),
            refused: 0,
        }
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.names.len()
    }

    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Thread `tid` (namespace tid) started, or was replayed, under `name`.
    pub fn started(&mut self, tid: u32, name: &str) {
        self.insert(tid, name, true);
    }

    fn insert(&mut self, tid: u32, name: &str, started: bool) {
        if self.names.len() >= MAX_THREADS && !self.names.contains_key(&tid) {
            self.refused += 1;
            return;
        }
        let name = sanitize(name).into_boxed_str();
        self.names.insert(tid, Known { name, started });
    }

    pub fn ended(&mut self, tid: u32) {
        self.names.remove(&tid);
    }

    /// The agent listed the thread whose `JavaThread*` is `java_thread` under `name`; its tid
    /// is found by [`Self::resolve`].
    pub fn listed(&mut self, java_thread: u64, name: &str, read_at: Instant) {
        if java_thread == 0 {
            return;
        }
        if self.pending.len() >= MAX_THREADS && !self.pending.contains_key(&java_thread) {
            self.refused += 1;
            return;
        }
        let name = sanitize(name).into_boxed_str();
        self.pending.insert(java_thread, Pending { name, read_at });
        self.resolved_at = None;
    }

    /// Listed threads waiting for their tid.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Gives the listed threads the tids `threads` (the JVM's thread list) says run them: see
    /// the module documentation. Cheap when nothing changed since the last call.
    pub fn resolve(&mut self, threads: &JvmThreads, now: Instant) {
        if self.pending.is_empty() || self.resolved_at == Some(threads.current_at) {
            return;
        }
        self.resolved_at = Some(threads.current_at);
        let pending = std::mem::take(&mut self.pending);
        for (java_thread, listed) in pending {
            if threads.current_at < listed.read_at {
                // The set may predate the record: the pointer may have been another thread's.
                if now.saturating_duration_since(listed.read_at) < PENDING_FOR {
                    self.pending.insert(java_thread, listed);
                }
                continue;
            }
            let Some(&tid) = threads.by_java_thread.get(&java_thread) else {
                // Not among the threads alive after it was listed: it has ended.
                continue;
            };
            if self.names.get(&tid).is_some_and(|known| known.started) {
                continue;
            }
            self.insert(tid, &listed.name, false);
        }
    }

    /// Another agent instance: what the previous one said no longer holds.
    #[cfg(test)]
    pub fn clear(&mut self) {
        self.names.clear();
        self.pending.clear();
        self.resolved_at = None;
        self.translated.clear();
    }

    /// The name of host thread `host_tid` sampled as `comm`: the agent's full name when `comm`
    /// confirms it, else `comm` itself.
    pub fn name_of(&mut self, host_tid: u32, comm: &str) -> (String, NameSource) {
        let full = self
            .namespace_tid(host_tid)
            .and_then(|tid| self.names.get(&tid))
            .filter(|known| confirms(comm, &known.name));
        match full {
            Some(known) => (known.name.to_string(), NameSource::Sidecar),
            None => (comm.to_string(), NameSource::Comm),
        }
    }

    fn namespace_tid(&mut self, host_tid: u32) -> Option<u32> {
        if self.names.is_empty() {
            return None;
        }
        let Some(pid) = self.translate_in else {
            return Some(host_tid);
        };
        if let Some(&known) = self.translated.get(&host_tid) {
            return known;
        }
        if self.translated.len() >= MAX_TRANSLATIONS {
            self.translated.clear();
        }
        let tid =
            untrusted::read_proc_text(pid, &format!("task/{host_tid}/status"), MAX_STATUS_BYTES)
                .ok()
                .and_then(|status| innermost_nspid(&status));
        self.translated.insert(host_tid, tid);
        tid
    }
}

/// The last id of the `NSpid:` line of a status file: the id in the innermost namespace.
fn innermost_nspid(status: &str) -> Option<u32> {
    let ids = crate::proc_status::parse(status)?.nspid?;
    u32::try_from(*ids.last()?).ok()
}

/// Whether the kernel's `comm` is what HotSpot makes of `name` when it names the native
/// thread. A name of up to 15 bytes is kept whole. A longer one is cut to its first 15 bytes
/// before JDK 26, and from JDK 26 on abbreviated to its first 7 bytes, `..` and its last 6
/// (`ForkJoinPool-1-worker-2` -> `ForkJoi..rker-2`, so the trailing number survives). Either
/// cut may split a character: `comm` is read lossily, so the expected form is too.
fn confirms(comm: &str, name: &str) -> bool {
    const COMM_BYTES: usize = profiler_common::COMM_LEN - 1;
    const HEAD_BYTES: usize = 7;
    const TAIL_BYTES: usize = 6;
    if comm.is_empty() {
        return false;
    }
    let bytes = name.as_bytes();
    if bytes.len() <= COMM_BYTES {
        return comm == name;
    }
    let cut = String::from_utf8_lossy(&bytes[..COMM_BYTES]);
    let abbreviated = [
        &bytes[..HEAD_BYTES],
        b"..",
        &bytes[bytes.len() - TAIL_BYTES..],
    ]
    .concat();
    comm == cut || comm == String::from_utf8_lossy(&abbreviated)
}

/// `name` bounded to [`MAX_THREAD_NAME_BYTES`] (on a character boundary) with control
/// characters replaced by `?` (the rule of every output: [`crate::printable`]).
pub fn sanitize(name: &str) -> String {
    crate::printable::printable_within(name, MAX_THREAD_NAME_BYTES).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_name_is_used_when_comm_confirms_it() {
        let mut names = ThreadNames::new(7, 7);
        names.started(100, "http-nio-8080-exec-12");
        names.started(101, "short");
        names.started(102, "main");
        assert_eq!(
            names.name_of(100, "http-nio-8080-e"),
            ("http-nio-8080-exec-12".into(), NameSource::Sidecar)
        );
        assert_eq!(
            names.name_of(101, "short"),
            ("short".into(), NameSource::Sidecar)
        );
        // The main thread's native name is not its Java name.
        assert_eq!(
            names.name_of(102, "java"),
            ("java".into(), NameSource::Comm)
        );
        // A reused tid, or a thread renamed since: comm disagrees.
        assert_eq!(
            names.name_of(100, "GC Thread#0"),
            ("GC Thread#0".into(), NameSource::Comm)
        );
        // A name shorter than 15 bytes must match exactly.
        assert_eq!(names.name_of(101, "sho"), ("sho".into(), NameSource::Comm));
        // Unknown thread.
        assert_eq!(
            names.name_of(5, "worker"),
            ("worker".into(), NameSource::Comm)
        );
        names.ended(100);
        assert_eq!(names.name_of(100, "http-nio-8080-e").1, NameSource::Comm);
    }

    #[test]
    fn a_comm_cut_inside_a_character_still_confirms() {
        // 14 ASCII bytes and a 2-byte character: comm keeps its first byte, read lossily.
        let name = "pool-worker-ab\u{e9}-1";
        let comm = String::from_utf8_lossy(&name.as_bytes()[..15]).into_owned();
        let mut names = ThreadNames::new(1, 1);
        names.started(3, name);
        assert_eq!(names.name_of(3, &comm), (name.into(), NameSource::Sidecar));
    }

    #[test]
    fn jdk_26_abbreviated_native_names_confirm() {
        let mut names = ThreadNames::new(1, 1);
        names.started(3, "ForkJoinPool-1-worker-2");
        names.started(4, "\u{e9}-unicode-name-long-\u{e4}\u{e4}\u{e4}\u{e4}");
        assert_eq!(
            names.name_of(3, "ForkJoi..rker-2"),
            ("ForkJoinPool-1-worker-2".into(), NameSource::Sidecar)
        );
        // As JDK 26 names it (seen on a live JVM).
        assert_eq!(
            names.name_of(4, "\u{e9}-unic..\u{e4}\u{e4}\u{e4}").1,
            NameSource::Sidecar
        );
        // Another thread's abbreviation does not.
        assert_eq!(names.name_of(3, "ForkJoi..rker-3").1, NameSource::Comm);
        // Nor does a name exactly 15 bytes long abbreviated (HotSpot keeps those whole).
        names.started(5, "exactly15chars!");
        assert_eq!(names.name_of(5, "exactl..chars!").1, NameSource::Comm);
    }

    #[test]
    fn names_are_bounded_and_sanitized() {
        assert_eq!(sanitize("a\nb\u{1b}[31mc"), "a?b?[31mc");
        let long = "\u{e9}".repeat(MAX_THREAD_NAME_BYTES);
        let cut = sanitize(&long);
        assert!(cut.len() <= MAX_THREAD_NAME_BYTES && cut.len() >= MAX_THREAD_NAME_BYTES - 1);
        assert!(cut.chars().all(|c| c == '\u{e9}'));

        let mut names = ThreadNames::new(1, 1);
        for tid in 0..MAX_THREADS as u32 + 10 {
            names.started(tid, "t");
        }
        assert_eq!((names.len(), names.refused), (MAX_THREADS, 10));
        // A known thread may still be renamed when full.
        names.started(0, "u");
        assert_eq!(names.name_of(0, "u").1, NameSource::Sidecar);
        names.clear();
        assert!(names.is_empty());
    }

    fn set(at: Instant, threads: &[(u64, u32)]) -> JvmThreads {
        JvmThreads {
            by_java_thread: std::sync::Arc::new(threads.iter().copied().collect()),
            current_at: at,
        }
    }

    #[test]
    fn a_listed_thread_is_named_once_a_current_thread_list_gives_its_tid() {
        let t0 = Instant::now();
        let read = t0 + Duration::from_secs(1);
        let mut names = ThreadNames::new(7, 7);
        names.listed(0x7000, "http-nio-8080-exec-12", read);
        names.listed(0, "no pointer", read);
        assert_eq!(names.pending(), 1);
        assert_eq!(names.name_of(40, "http-nio-8080-e").1, NameSource::Comm);
        // A set read before the record may show a previous owner of the pointer: it waits.
        names.resolve(&set(t0, &[(0x7000, 41)]), read);
        assert_eq!(names.pending(), 1);
        assert_eq!(names.name_of(41, "http-nio-8080-e").1, NameSource::Comm);
        // Known current after it was read: resolved, and used under the comm rule.
        let later = read + Duration::from_millis(500);
        names.resolve(&set(later, &[(0x7000, 40), (0x8000, 42)]), later);
        assert_eq!(names.pending(), 0);
        assert_eq!(
            names.name_of(40, "http-nio-8080-e"),
            ("http-nio-8080-exec-12".into(), NameSource::Sidecar)
        );
        assert_eq!(names.name_of(40, "renamed").1, NameSource::Comm);
        // It ends like any other.
        names.ended(40);
        assert_eq!(names.name_of(40, "http-nio-8080-e").1, NameSource::Comm);
    }

    #[test]
    fn a_pointer_the_current_list_does_not_know_has_ended() {
        let read = Instant::now();
        let later = read + Duration::from_millis(300);
        let mut names = ThreadNames::new(7, 7);
        names.listed(0x7000, "batch-importer-thread-1", read);
        names.resolve(&set(later, &[(0x9000, 50)]), later);
        assert_eq!(names.pending(), 0);
        assert_eq!(names.name_of(50, "batch-importer-").1, NameSource::Comm);
    }

    #[test]
    fn a_listed_name_never_replaces_a_thread_start_name() {
        // The pointer of a listed pool thread that ended was reused by a newer pool thread,
        // which named itself in its ThreadStart: same first 15 bytes, so comm cannot tell.
        let read = Instant::now();
        let later = read + Duration::from_millis(300);
        let mut names = ThreadNames::new(7, 7);
        names.started(60, "http-nio-8080-exec-12");
        names.listed(0x7000, "http-nio-8080-exec-1", read);
        names.resolve(&set(later, &[(0x7000, 60)]), later);
        assert_eq!(
            names.name_of(60, "http-nio-8080-e").0,
            "http-nio-8080-exec-12"
        );
        // A ThreadStart replaces a listed name (a later listing of the same thread does too).
        names.listed(0x7100, "scheduler-worker-3", later);
        let last = later + Duration::from_millis(300);
        names.resolve(&set(last, &[(0x7100, 61)]), last);
        assert_eq!(names.name_of(61, "scheduler-worke").0, "scheduler-worker-3");
        names.started(61, "scheduler-worker-4");
        assert_eq!(names.name_of(61, "scheduler-worke").0, "scheduler-worker-4");
        names.listed(0x7100, "scheduler-worker-5", last);
        let next = last + Duration::from_millis(300);
        names.resolve(&set(next, &[(0x7100, 61)]), next);
        assert_eq!(names.name_of(61, "scheduler-worke").0, "scheduler-worker-4");
    }

    #[test]
    fn listed_threads_are_bounded_sanitized_and_expire() {
        let read = Instant::now();
        let mut names = ThreadNames::new(7, 7);
        names.listed(0x10, "evil\n\u{1b}[2Jname-that-is-long", read);
        let later = read + Duration::from_millis(300);
        names.resolve(&set(later, &[(0x10, 70)]), later);
        assert_eq!(
            names.name_of(70, "evil??[2Jname-t"),
            ("evil??[2Jname-that-is-long".into(), NameSource::Sidecar)
        );
        // The same set again is not looked at twice; a thread listed since is.
        names.listed(0x20, "waiting-for-a-newer-list", later);
        names.resolve(&set(read, &[(0x20, 71)]), later);
        assert_eq!(names.pending(), 1);
        names.resolve(&set(read, &[(0x20, 71)]), later + PENDING_FOR);
        assert_eq!(names.pending(), 1, "the same set is not looked at again");
        names.listed(0x30, "another", later + PENDING_FOR / 2);
        names.resolve(&set(read, &[]), later + PENDING_FOR);
        assert_eq!(names.pending(), 1, "0x20 expired, 0x30 waits");
        for pointer in 1..=MAX_THREADS as u64 + 5 {
            names.listed(pointer << 8, "t", later);
        }
        assert_eq!(names.pending(), MAX_THREADS);
        assert_eq!(names.refused, 6);
        names.clear();
        assert_eq!(names.pending(), 0);
    }

    #[test]
    fn the_innermost_namespace_tid_is_read_from_nspid() {
        use crate::proc_status::test_status;
        assert_eq!(
            innermost_nspid(&test_status(&["NSpid:\t4711\t12"])),
            Some(12)
        );
        assert_eq!(innermost_nspid(&test_status(&["NSpid:\t4711"])), Some(4711));
        assert_eq!(innermost_nspid("Name:\tx\n"), None);
    }
}
