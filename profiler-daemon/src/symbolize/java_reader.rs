//! Java names read ahead, on a thread of their own: the methods and code of a new stack's Java
//! frames are read as soon as the sampling loop meets them, into the per-JVM caches the
//! symbolizer later names from.
//!
//! Under class churn a method or nmethod is freed tens of milliseconds after its last sample.
//! Read by the symbolizer, these reads waited behind whatever it was doing: writing an
//! interval's profiles takes 0.2-0.9 s in a debug build with six JVMs, and every churned method
//! sampled meanwhile was gone when its turn came (up to 5% of a churning JVM's samples named
//! unknown). Here nothing but reads waits in front of them.
//!
//! An interpreted frame (or allocated class) read too late, its class already unloaded, is read
//! again every [`RETRY_EVERY`] for [`RETRY_FOR`]: under class churn the same class is soon
//! loaded again with its method at the same address and the same cookie, and the samples of
//! every such generation share one stack (same `Method*`, same cookie), named once when the
//! profile is built. Without the retries that name came from a single read at that moment, and
//! a whole stack of 40-60 samples went unnamed whenever no generation was alive then. A compiled
//! frame is never read again: no later nmethod has its compile id, so a second read can only
//! find it deader, and reading a dying nmethod over and over is how a name of the class that
//! took its methods' memory could slip through (once seen, JDK 26, while retries included them).
//!
//! [`MemoryNameCaches`] is what both threads share: each JVM's [`MemoryNames`] behind its own
//! lock, taken per frame on either side, so a read ahead waits at most for one frame's naming.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use profiler_common::{FrameKind, UserFrame};

use crate::hotspot::jvm::Jvm;
use crate::hotspot::jvm_directory::JvmDirectory;
use crate::hotspot::names::MemoryNames;
use crate::hotspot::remote::{ProcessMemory, RemoteMemory};
use crate::java_names::UnnamedReason;

/// How often frames whose read came too late are read again.
const RETRY_EVERY: Duration = Duration::from_millis(25);
/// For how long: past the end of the interval they were sampled in, most often.
const RETRY_FOR: Duration = Duration::from_secs(5);
/// Most frames read again at once: each costs a read that fails, at most a few system calls.
const MAX_RETRIED: usize = 256;

/// A Java frame of a newly seen stack.
#[derive(Clone, Copy)]
pub struct JavaFrameSeen {
    pub pid: u32,
    pub frame: UserFrame,
}

/// One JVM's memory name caches, shared.
pub struct SharedMemoryNames<M: RemoteMemory>(Arc<Mutex<MemoryNames<M>>>);

impl<M: RemoteMemory> Clone for SharedMemoryNames<M> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<M: RemoteMemory> SharedMemoryNames<M> {
    /// The caches, for one frame's naming or reading. A panic while they were held (caught by
    /// the thread's own guard) leaves whole entries or none: they stay usable.
    pub fn lock(&self) -> MutexGuard<'_, MemoryNames<M>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Each JVM's memory name caches, by pid, with the inspection they were made for. Cheap to
/// clone: clones share them.
pub struct MemoryNameCaches<M: RemoteMemory>(Arc<Mutex<ByPid<M>>>);

type ByPid<M> = HashMap<u32, (Arc<Jvm>, SharedMemoryNames<M>)>;

impl<M: RemoteMemory> Clone for MemoryNameCaches<M> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

impl<M: RemoteMemory> Default for MemoryNameCaches<M> {
    fn default() -> Self {
        Self(Arc::default())
    }
}

impl<M: RemoteMemory> MemoryNameCaches<M> {
    fn map(&self) -> MutexGuard<'_, ByPid<M>> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The caches of `jvm`: the ones held for this same inspection of its process, else new
    /// ones (a pid reused by another JVM gets caches of its own); true if they are new.
    pub fn of(&self, jvm: Arc<Jvm>, memory: impl FnOnce() -> M) -> (SharedMemoryNames<M>, bool) {
        let mut map = self.map();
        if let Some((inspected, names)) = map.get(&jvm.pid) {
            if Arc::ptr_eq(inspected, &jvm) {
                return (names.clone(), false);
            }
        }
        let names = SharedMemoryNames(Arc::new(Mutex::new(MemoryNames::new(
            jvm.clone(),
            memory(),
        ))));
        map.insert(jvm.pid, (jvm, names.clone()));
        (names, true)
    }

    /// Every JVM's caches, with the inspection they were made for.
    pub fn entries(&self) -> Vec<(Arc<Jvm>, SharedMemoryNames<M>)> {
        self.map().values().cloned().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }

    pub fn remove(&self, pid: u32) {
        self.map().remove(&pid);
    }

    pub fn pids(&self) -> Vec<u32> {
        self.map().keys().copied().collect()
    }
}

/// Reads what naming `frame` takes (its method, or its code blob and the methods inlined in
/// it) into `names`, without naming it. False if it came too late: the method or code was
/// already freed or reused.
pub fn read_ahead<M: RemoteMemory>(names: &mut MemoryNames<M>, frame: &UserFrame) -> bool {
    names.bound_caches();
    let missed = match frame.kind() {
        Some(FrameKind::Interpreted) => names.method(frame.addr(), frame.cookie).err(),
        Some(FrameKind::Compiled) => names.code(frame.addr(), frame.cookie, frame.aux).err(),
        Some(FrameKind::AllocatedClass) => names
            .class_name(frame.addr(), frame.cookie, frame.aux)
            .err(),
        Some(FrameKind::Native) | None => None,
    };
    !matches!(
        missed,
        Some(
            UnnamedReason::Unreadable
                | UnnamedReason::MethodReused
                | UnnamedReason::CodeReused
                | UnnamedReason::ClassReused
                | UnnamedReason::BadName
        )
    )
}

/// What the reader counts (shared with the sampling loop and the metrics endpoint).
#[derive(Debug, Default)]
pub struct ReaderCounters {
    /// Frames whose method or code was already gone or reused when read: names perishing
    /// (class unloading), so the sampling loop drains sooner.
    pub misses: AtomicU64,
    /// Panics caught (each cost one batch of frames).
    pub panics: AtomicU64,
}

/// A frame whose read came too late, to be read again.
struct Missed {
    names: SharedMemoryNames<ProcessMemory>,
    frame: UserFrame,
    since: Instant,
}

/// The reader thread's state.
pub struct JavaReader {
    caches: MemoryNameCaches<ProcessMemory>,
    /// Where a JVM met first by its frames is found (the tracker inspected it before pushing
    /// the layout its frames were unwound with).
    jvms: JvmDirectory,
    /// Called for each JVM met first here: the symbolizer is told, to read its agent's records
    /// while the interval runs (it would otherwise sleep until the interval's end).
    on_new_jvm: Box<dyn Fn() + Send>,
    counters: Arc<ReaderCounters>,
}

impl JavaReader {
    pub fn new(
        caches: MemoryNameCaches<ProcessMemory>,
        jvms: JvmDirectory,
        on_new_jvm: Box<dyn Fn() + Send>,
        counters: Arc<ReaderCounters>,
    ) -> Self {
        Self {
            caches,
            jvms,
            on_new_jvm,
            counters,
        }
    }

    /// Reads each batch of frames as it comes, and the frames read too late again, until the
    /// sending side is dropped.
    pub fn run(self, batches: Receiver<Vec<JavaFrameSeen>>) {
        let mut missed = Vec::new();
        let mut retried = Instant::now();
        loop {
            // No timer while nothing is to be read again.
            let batch = if missed.is_empty() {
                batches.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                batches.recv_timeout(RETRY_EVERY)
            };
            let batch = match batch {
                Ok(frames) => Some(frames),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => break,
            };
            // Reads of what profiled processes wrote: a bug that input trips costs this
            // batch, not the thread.
            let read = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                if let Some(frames) = batch {
                    self.read(frames, &mut missed);
                }
                if retried.elapsed() >= RETRY_EVERY {
                    retried = Instant::now();
                    self.read_again(&mut missed);
                }
            }));
            if read.is_err() {
                self.counters.panics.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    "the Java name reader panicked (a bug; please report it with the log above): \
                     that batch of frames is named when its profile is built"
                );
            }
        }
    }

    fn read(&self, mut frames: Vec<JavaFrameSeen>, missed: &mut Vec<Missed>) {
        // New stacks share most of their frames.
        frames.sort_unstable_by_key(|seen| (seen.pid, seen.frame.addr(), seen.frame.cookie));
        frames.dedup_by_key(|seen| (seen.pid, seen.frame.addr(), seen.frame.cookie));
        let mut jvm: Option<(u32, Option<SharedMemoryNames<ProcessMemory>>)> = None;
        for JavaFrameSeen { pid, frame } in frames {
            if jvm.as_ref().is_none_or(|(known, _)| *known != pid) {
                let names = self.jvms.get(pid).map(|inspected| {
                    let (names, new) = self.caches.of(inspected, || ProcessMemory::new(pid));
                    if new {
                        (self.on_new_jvm)();
                    }
                    names
                });
                jvm = Some((pid, names));
            }
            let Some((_, Some(names))) = &jvm else {
                continue;
            };
            // One frame per lock: the symbolizer names from the same caches meanwhile.
            if !read_ahead(&mut names.lock(), &frame) {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                let another_may_come = matches!(
                    frame.kind(),
                    Some(FrameKind::Interpreted | FrameKind::AllocatedClass)
                );
                if another_may_come && missed.len() < MAX_RETRIED {
                    missed.push(Missed {
                        names: names.clone(),
                        frame,
                        since: Instant::now(),
                    });
                }
            }
        }
    }

    /// Reads the missed frames again, keeping those that still miss for [`RETRY_FOR`].
    fn read_again(&self, missed: &mut Vec<Missed>) {
        missed.retain(|entry| {
            let mut names = entry.names.lock();
            names.forget_failure(&entry.frame);
            !read_ahead(&mut names, &entry.frame) && entry.since.elapsed() < RETRY_FOR
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use profiler_unwind::fakes::{FakeMemory, Layout};

    use super::*;
    use crate::hotspot::naming_tests::{daemon_jvm, with_stub};
    use crate::hotspot::remote::ReadError;
    use crate::symbolize::java::JavaSymbolizer;

    /// The fake's memory until the test says it is gone (an unloaded class's metaspace,
    /// uncommitted: every read fails).
    struct UntilGone<'a> {
        memory: &'a FakeMemory,
        gone: &'a AtomicBool,
    }

    impl RemoteMemory for UntilGone<'_> {
        fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
            if self.gone.load(Ordering::Relaxed) {
                // EFAULT, as process_vm_readv says.
                return Err(ReadError::Failed {
                    addr,
                    len: buf.len(),
                    errno: 14,
                });
            }
            self.memory.read(addr, buf)
        }
    }

    /// What the Java name reader reads ahead, the symbolizer names from once the memory is
    /// gone; a new inspection of the same pid (another process) starts from empty caches.
    #[test]
    fn frames_read_ahead_are_named_after_their_memory_is_gone() {
        let layout = Layout::Pointers;
        let (fake, stub) = with_stub(layout, b"vtable chunks");
        let jvm = daemon_jvm(&fake, layout, false);
        let gone = AtomicBool::new(false);
        let memory = || UntilGone {
            memory: &fake.memory,
            gone: &gone,
        };
        let frame = stub.frame(0x10);
        let caches = MemoryNameCaches::default();
        let (ahead, new) = caches.of(jvm.clone(), memory);
        assert!(new, "the first inspection of a pid gets caches of its own");
        assert!(read_ahead(&mut ahead.lock(), &frame), "read while alive");
        gone.store(true, Ordering::Relaxed);

        let name_of = |symbolizer: &mut JavaSymbolizer<UntilGone>| {
            let named = symbolizer.resolve(jvm.pid, &frame, false);
            (named.frame.lines[0].function.clone(), named.unnamed)
        };
        let mut symbolizer = JavaSymbolizer::default();
        symbolizer.share_memory_names(caches.clone());
        symbolizer.add(jvm.clone(), memory());
        assert_eq!(
            name_of(&mut symbolizer),
            ("[vtable chunks]".to_owned(), vec![])
        );

        // Another process under the same pid: its own caches, which read nothing now.
        let other = daemon_jvm(&fake, layout, false);
        assert!(caches.of(other.clone(), memory).1, "new caches");
        let mut symbolizer = JavaSymbolizer::default();
        symbolizer.share_memory_names(caches.clone());
        symbolizer.add(other, memory());
        assert_eq!(
            name_of(&mut symbolizer).1,
            vec![UnnamedReason::Unreadable],
            "nothing read ahead for this one"
        );

        // The memory holds the frame's code again (a class loaded anew at the same address): the
        // failure stands until the reader forgets it to read again.
        gone.store(false, Ordering::Relaxed);
        let (again, new) = caches.of(daemon_jvm(&fake, layout, false), memory);
        assert!(new);
        gone.store(true, Ordering::Relaxed);
        assert!(!read_ahead(&mut again.lock(), &frame), "too late");
        gone.store(false, Ordering::Relaxed);
        assert!(!read_ahead(&mut again.lock(), &frame), "the failure stands");
        again.lock().forget_failure(&frame);
        assert!(read_ahead(&mut again.lock(), &frame), "read again");
    }
}
