//! The agent itself: entry points, event callbacks and the agent's own thread.
//!
//! Options: see [`crate::options`].
//!
//! # Start-up
//!
//! Everything that can fail without leaving anything behind comes first: options, the JVM's
//! version, capabilities, the records file. A failure there returns an error (on a dynamic attach
//! HotSpot then unloads the library, which nothing points into yet) and gives the JVMTI
//! environment back. Then the callbacks are installed and the events enabled; from the moment
//! the callbacks are handed to the JVM the library must stay loaded, so any later failure
//! (enabling an event, starting the agent's thread, a panic) leaves the agent loaded and inert:
//! its events are disabled, its callbacks return at once, the JVM is told all went well, and the
//! failure is written into the records as an [`AgentStatus`] for the daemon.
//!
//! # Threads
//!
//! JVM threads (compiler threads, the GC, whoever loads or unloads code) only build and encode a
//! record and push it to a bounded [`Queue`]: they never wait for I/O, and a record that does not
//! fit is dropped and counted. The agent's thread (`jvm-profiler-sidecar`) does every write,
//! rotation and replay. Replays (`GenerateEvents`) call the callbacks on the agent's thread
//! itself: those push to the same queue, and drain it there when it fills, never wait on it.
//!
//! # Thread names
//!
//! ThreadStart runs on the new thread: its callback writes a `ThreadStart` record with
//! `gettid()` and the thread's full Java name, ThreadEnd a `ThreadEnd`; the daemon uses them to
//! name threads beyond the kernel's 15 bytes. The agent's thread keeps the live ones (from the
//! records it writes, bounded) and replays them into every generation.
//!
//! Threads that started before the agent (a dynamic attach) or before VM init had no
//! ThreadStart, and JVMTI gives no native thread id of another thread. So when its thread
//! starts, and into every generation, the agent lists the live threads (`GetAllThreads`) and
//! writes a `LiveThread` record for each: its full name and its `JavaThread*`, read through
//! JNI from the `long eetop` field of `java.lang.Thread` (JDK 11 to 25 have it; 0 once the
//! thread has exited, and such threads are skipped). The daemon finds the native thread of a
//! `JavaThread*` in the JVM's own thread list. A JVM without the field gets no such records.

use std::ffi::{c_char, c_void, CStr};
use std::io::Write as _;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock, TryLockError};
use std::time::{Duration, Instant};

use profiler_jvmti_records::channel::{self, Writer};
use profiler_jvmti_records::record::{
    self, AgentStats, AgentStatus, Record, STATUS_ASSUMED_UNKNOWN_VERSION, STATUS_METHOD_PTRS,
    STATUS_RECORDING,
};

use crate::describe::{self, JvmtiSource, MAX_RECORD_BYTES};
use crate::ffi::{self, JInt, JMethodId, JavaVm, Jni, Jvmti, JvmtiEnv, Vm};
use crate::heap;
use crate::options::Options;
use crate::queue::{Queue, MAX_QUEUED_BYTES, MAX_QUEUED_RECORDS};
use crate::version;

/// How often the agent reports its heap and record counts (only when they changed).
const STATS_EVERY: Duration = Duration::from_secs(5);
/// How long the agent's thread sleeps when nothing is queued (a push wakes it at once).
const IDLE_WAIT: Duration = Duration::from_millis(100);
/// At most one rotation a second, whatever the compilation rate; after a failed one, wait.
const ROTATE_EVERY: Duration = Duration::from_secs(1);
const ROTATE_RETRY: Duration = Duration::from_secs(5);
/// How long VM death waits for the agent's thread to finish a write before removing the files
/// without it.
const DEATH_WAIT: Duration = Duration::from_secs(1);
/// Bound on live threads whose names are replayed into each generation.
const MAX_TRACKED_THREADS: usize = 16_384;
/// Local references the listing of live threads expects to hold at once (a hint: more fit).
const LISTING_LOCAL_REFS: ffi::JInt = 64;

/// Events whose callbacks do work; disabled when the agent turns inert. VM death stays enabled
/// so that the files are still removed at exit.
const WORK_EVENTS: [JInt; 7] = [
    ffi::EVENT_COMPILED_METHOD_LOAD,
    ffi::EVENT_COMPILED_METHOD_UNLOAD,
    ffi::EVENT_DYNAMIC_CODE_GENERATED,
    ffi::EVENT_VM_INIT,
    ffi::EVENT_THREAD_START,
    ffi::EVENT_THREAD_END,
    ffi::EVENT_SAMPLED_OBJECT_ALLOC,
];

struct Agent {
    jvmti: Jvmti,
    vm: Vm,
    /// Whether `method_ptr` fields are read from jmethodIDs (a JVM version the agent knows).
    method_ptrs: bool,
    /// Records on their way from JVM threads to the agent's thread.
    queue: Queue,
    /// Only the agent's thread writes (and `start`, before that thread exists; VM death takes
    /// it). None once the JVM is dying.
    writer: Mutex<Option<Writer>>,
    dir: PathBuf,
    status: Mutex<AgentStatus>,
    /// `pthread_self()` of the agent's thread, 0 until it runs.
    agent_thread: AtomicU64,
    rotate_wanted: AtomicBool,
    /// Callbacks return at once: the JVM is dying, or the agent gave up (inert).
    stopped: AtomicBool,
    /// The JVM is dying: whoever holds the writer next removes the files.
    dying: AtomicBool,
    written: AtomicU64,
    dropped: AtomicU64,
    /// Encoded `ThreadStart` records of live threads by tid, for replays; only the agent's
    /// thread uses it.
    threads: Mutex<std::collections::HashMap<u32, Vec<u8>>>,
    /// Whether the JVM was found without `java.lang.Thread.eetop` (logged once).
    no_eetop_logged: AtomicBool,
}

static AGENT: OnceLock<Agent> = OnceLock::new();
/// Set just before the callbacks are handed to the JVM: from then on the library must never be
/// unloaded, so the entry points must not report failure.
static CALLBACKS_INSTALLED: AtomicBool = AtomicBool::new(false);

/// `-agentpath:` entry point. Always returns 0: a failing profiler agent must not stop the JVM.
///
/// # Safety
/// Called by the JVM with a valid `JavaVM*` and options string (or null).
#[no_mangle]
pub unsafe extern "C" fn Agent_OnLoad(
    vm: *mut JavaVm,
    options: *const c_char,
    _: *mut c_void,
) -> JInt {
    let _ = entry(vm, options, false);
    0
}

/// Dynamic attach entry point. A non-zero result is reported to the attaching daemon, and makes
/// HotSpot unload the library: only returned when no callback was installed.
///
/// # Safety
/// Called by the JVM with a valid `JavaVM*` and options string (or null).
#[no_mangle]
pub unsafe extern "C" fn Agent_OnAttach(
    vm: *mut JavaVm,
    options: *const c_char,
    _: *mut c_void,
) -> JInt {
    match entry(vm, options, true) {
        Ok(()) => 0,
        Err(()) if CALLBACKS_INSTALLED.load(Ordering::Acquire) => 0,
        Err(()) => 1,
    }
}

/// Starts the agent; Err if it did not start (the reason went to stderr). Never unwinds.
fn entry(vm: *mut JavaVm, options: *const c_char, live: bool) -> Result<(), ()> {
    match catch_unwind(AssertUnwindSafe(|| start(vm, options, live))) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(message)) => {
            log(&format!("not started: {message}"));
            Err(())
        }
        Err(_) => {
            log("not started: internal error");
            guard((), || {
                if let Some(agent) = AGENT.get() {
                    agent.go_inert("internal error while starting");
                }
            });
            Err(())
        }
    }
}

/// One line on the JVM's stderr; never fails (`eprintln!` panics when stderr is gone).
fn log(message: &str) {
    let _ = writeln!(std::io::stderr(), "jvm-profiler-agent: {message}");
}

/// Runs `f`, turning a panic into `default`: unwinding into the JVM is undefined behaviour.
fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

/// Err only while nothing points into this library (no callback installed).
fn start(vm: *mut JavaVm, options: *const c_char, live: bool) -> Result<(), String> {
    let options = if options.is_null() {
        String::new()
    } else {
        // SAFETY: the JVM passes a NUL-terminated string.
        unsafe { CStr::from_ptr(options) }
            .to_string_lossy()
            .into_owned()
    };
    if let Some(agent) = AGENT.get() {
        // Attached again (the same library is only loaded once): already there, and only the
        // allocation sampler can be asked for anew (a daemon started with `--alloc` after
        // one without it).
        if let Some(interval) = Options::parse(&options)?.alloc_interval {
            agent.sample_allocations(interval);
        }
        return Ok(());
    }
    // Panics are caught at every entry point; one line on the JVM's stderr says what happened
    // (this library has its own copy of std, so the hook is the agent's alone).
    std::panic::set_hook(Box::new(|info| log(&format!("internal error: {info}"))));
    if vm.is_null() {
        return Err("no JavaVM".into());
    }
    let options = Options::parse(&options)?;
    let vm = Vm(vm);
    let jvmti = vm.jvmti_env().ok_or("no JVMTI 1.2 environment")?;

    // Everything that can fail without side effects (or whose side effects are undone here).
    let (writer, jvm) = match prepare(&jvmti, &options) {
        Ok(prepared) => prepared,
        Err(message) => {
            jvmti.dispose();
            return Err(message);
        }
    };
    let method_ptrs = jvm.method_ptrs && !options.assume_unknown_version;
    let mut flags = 0;
    if method_ptrs {
        flags |= STATUS_METHOD_PTRS;
    }
    if options.assume_unknown_version {
        flags |= STATUS_ASSUMED_UNKNOWN_VERSION;
    }
    let dir = writer.dir().to_path_buf();
    let agent = Agent {
        jvmti,
        vm,
        method_ptrs,
        queue: Queue::new(MAX_QUEUED_BYTES, MAX_QUEUED_RECORDS),
        writer: Mutex::new(Some(writer)),
        dir,
        status: Mutex::new(AgentStatus {
            flags,
            jvm_feature_version: jvm.feature.unwrap_or(0),
            jvm_version: jvm.description,
            error: String::new(),
        }),
        agent_thread: AtomicU64::new(0),
        rotate_wanted: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        dying: AtomicBool::new(false),
        written: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
        threads: Mutex::new(std::collections::HashMap::new()),
        no_eetop_logged: AtomicBool::new(false),
    };
    if let Err(agent) = AGENT.set(agent) {
        // Lost a race with another start of this library, which owns the same files.
        agent.jvmti.dispose();
        return Ok(());
    }
    let Some(agent) = AGENT.get() else {
        return Err("agent state lost".into());
    };

    // From here on the JVM may call into this library: never report failure.
    CALLBACKS_INSTALLED.store(true, Ordering::Release);
    let mut callbacks = ffi::EventCallbacks::new();
    callbacks.set(
        ffi::EVENT_VM_INIT,
        on_vm_init as ffi::VmInitFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_VM_DEATH,
        on_vm_death as ffi::VmDeathFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_COMPILED_METHOD_LOAD,
        on_compiled_method_load as ffi::CompiledMethodLoadFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_COMPILED_METHOD_UNLOAD,
        on_compiled_method_unload as ffi::CompiledMethodUnloadFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_DYNAMIC_CODE_GENERATED,
        on_dynamic_code_generated as ffi::DynamicCodeGeneratedFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_THREAD_START,
        on_thread_start as ffi::ThreadEventFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_THREAD_END,
        on_thread_end as ffi::ThreadEventFn as *const c_void,
    );
    callbacks.set(
        ffi::EVENT_SAMPLED_OBJECT_ALLOC,
        jvm_profiler_sampled_object_alloc as ffi::SampledObjectAllocFn as *const c_void,
    );
    let err = agent.jvmti.set_event_callbacks(&callbacks);
    if err != ffi::JVMTI_ERROR_NONE {
        agent.go_inert(&format!("SetEventCallbacks failed ({err})"));
        return Ok(());
    }
    // VM death first: once anything is enabled, the files are removed at exit.
    let mut events = vec![
        ffi::EVENT_VM_DEATH,
        ffi::EVENT_COMPILED_METHOD_LOAD,
        ffi::EVENT_COMPILED_METHOD_UNLOAD,
        ffi::EVENT_DYNAMIC_CODE_GENERATED,
        ffi::EVENT_THREAD_START,
        ffi::EVENT_THREAD_END,
    ];
    if !live {
        // The agent's thread needs a live VM to attach to.
        events.push(ffi::EVENT_VM_INIT);
    }
    for event in events {
        let err = agent.jvmti.enable_event(event);
        if err != ffi::JVMTI_ERROR_NONE {
            agent.go_inert(&format!("enabling event {event} failed ({err})"));
            return Ok(());
        }
    }
    agent.update_status(|status| status.flags |= STATUS_RECORDING);
    if let Some(interval) = options.alloc_interval {
        agent.sample_allocations(interval);
    }
    if live {
        if let Err(err) = spawn_agent_thread(true) {
            agent.go_inert(&format!("cannot start its thread: {err}"));
            return Ok(());
        }
    }
    agent.write_status();
    Ok(())
}

/// The JVM's version and the records file, or why not.
fn prepare(jvmti: &Jvmti, options: &Options) -> Result<(Writer, version::JvmVersion), String> {
    // Readable in the OnLoad phase too: the VM sets these before it loads agents.
    let spec = jvmti.system_property(c"java.vm.specification.version");
    let vm_version = jvmti.system_property(c"java.vm.version");
    let vm_name = jvmti.system_property(c"java.vm.name");
    let jvm = version::judge(spec.as_deref(), vm_version.as_deref(), vm_name.as_deref());

    let mut caps = ffi::Capabilities::default();
    caps.bits[0] = ffi::CAN_GET_SOURCE_FILE_NAME
        | ffi::CAN_GET_LINE_NUMBERS
        | ffi::CAN_GENERATE_COMPILED_METHOD_LOAD_EVENTS;
    let err = jvmti.add_capabilities(&caps);
    if err != ffi::JVMTI_ERROR_NONE {
        return Err(format!("AddCapabilities failed ({err})"));
    }

    // SAFETY: getpid has no preconditions; inside the JVM's pid namespace it is the nspid.
    let pid = unsafe { libc::getpid() } as u32;
    let started_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let writer = match &options.dir {
        Some(dir) => Writer::create(dir, pid, started_ns, options.max_bytes)
            .map_err(|err| format!("{}: {err}", dir.display()))?,
        // The daemon's place, or a fallback of ours when another user holds it.
        None => Writer::create_for_pid(pid, started_ns, options.max_bytes)
            .map_err(|err| format!("records: {err}"))?,
    };
    Ok((writer, jvm))
}

unsafe extern "C" fn on_vm_init(_: *mut JvmtiEnv, _: *mut c_void, _: ffi::JThread) {
    // Loaded at startup: nothing is compiled yet, so no initial replay.
    guard((), || {
        let Some(agent) = active() else { return };
        if let Err(err) = spawn_agent_thread(false) {
            agent.go_inert(&format!("cannot start its thread: {err}"));
        }
    })
}

unsafe extern "C" fn on_vm_death(_: *mut JvmtiEnv, _: *mut c_void) {
    guard((), || {
        let Some(agent) = AGENT.get() else { return };
        agent.stopped.store(true, Ordering::Release);
        agent.dying.store(true, Ordering::Release);
        // The agent's thread holds the writer for one write or rotation at a time: wait for
        // that, but not for a hung file system.
        let deadline = Instant::now() + DEATH_WAIT;
        loop {
            let mut writer = match agent.writer.try_lock() {
                Ok(writer) => writer,
                Err(TryLockError::Poisoned(p)) => p.into_inner(),
                Err(TryLockError::WouldBlock) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1));
                    continue;
                }
                Err(TryLockError::WouldBlock) => {
                    // The agent's thread is stuck in a write: the file system hangs, and so
                    // may removing the files. Do it on a thread of its own, waited for as long
                    // again at most; the agent's thread removes them too once its write returns.
                    let dir = agent.dir.clone();
                    let (done, removed) = std::sync::mpsc::channel();
                    let remover = std::thread::Builder::new()
                        .name("jvm-profiler-cleanup".into())
                        .spawn(move || {
                            channel::remove_records(&dir);
                            let _ = done.send(());
                        });
                    if remover.is_ok() {
                        let _ = removed.recv_timeout(DEATH_WAIT);
                    }
                    break;
                }
            };
            if let Some(writer) = writer.take() {
                writer.remove();
            }
            break;
        }
        drop(agent.queue.take_all());
    })
}

/// HotSpot's allocation sampler calls this for each sampled object, on the allocating thread
/// (in native state, its last Java frame recorded). It does nothing here: the daemon's BPF
/// program (`profiler-ebpf/src/alloc.rs`) runs at its first instruction, a uprobe on this
/// exported name, and reads the arguments from their registers (the class in `r8`, the size in
/// `r9`) and the thread's stack from outside the JVM. The count keeps the body its own (no
/// other function folded into this address).
///
/// Its first instruction is a `nop`: x86 kernels refuse a uprobe on an instruction with a
/// `lock` prefix, which the count's atomic add would otherwise be in an optimised build.
#[no_mangle]
#[inline(never)]
pub unsafe extern "C" fn jvm_profiler_sampled_object_alloc(
    _: *mut JvmtiEnv,
    _: *mut c_void,
    _: ffi::JThread,
    _: ffi::JObject,
    _: ffi::JObject,
    _: ffi::JLong,
) {
    // SAFETY: an instruction that does nothing.
    unsafe { std::arch::asm!("nop", options(nomem, nostack, preserves_flags)) };
    SAMPLED_ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

/// Objects [`jvm_profiler_sampled_object_alloc`] was called for (read in a debugger).
static SAMPLED_ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

unsafe extern "C" fn on_compiled_method_load(
    _: *mut JvmtiEnv,
    method: JMethodId,
    code_size: JInt,
    code_addr: *const c_void,
    _map_length: JInt,
    _map: *const c_void,
    compile_info: *const c_void,
) {
    guard((), || {
        let Some(agent) = active() else { return };
        let source = JvmtiSource {
            jvmti: &agent.jvmti,
            method_ptrs: agent.method_ptrs,
        };
        // SAFETY: compile_info is what JVMTI passed to this callback.
        let encoded = unsafe {
            describe::compiled_method_load(
                &source,
                method,
                code_size.max(0) as u32,
                code_addr as u64,
                compile_info,
                MAX_RECORD_BYTES,
            )
        };
        agent.submit(encoded.ok());
    })
}

unsafe extern "C" fn on_compiled_method_unload(
    _: *mut JvmtiEnv,
    method: JMethodId,
    code_addr: *const c_void,
) {
    guard((), || {
        let Some(agent) = active() else { return };
        let mut bytes = Vec::new();
        record::encode(
            &Record::CompiledMethodUnload {
                method_ptr: describe::method_ptr(method, agent.method_ptrs),
                code_addr: code_addr as u64,
            },
            &mut bytes,
        );
        agent.submit(Some(bytes));
    })
}

unsafe extern "C" fn on_dynamic_code_generated(
    _: *mut JvmtiEnv,
    name: *const c_char,
    addr: *const c_void,
    length: JInt,
) {
    guard((), || {
        let Some(agent) = active() else { return };
        let name = if name.is_null() {
            &[][..]
        } else {
            // SAFETY: JVMTI passes a NUL-terminated name.
            unsafe { CStr::from_ptr(name) }.to_bytes()
        };
        let encoded =
            describe::dynamic_code(addr as u64, length.max(0) as u32, name, MAX_RECORD_BYTES);
        agent.submit(encoded.ok());
    })
}

unsafe extern "C" fn on_thread_start(_: *mut JvmtiEnv, _: *mut c_void, thread: ffi::JThread) {
    guard((), || {
        let Some(agent) = active() else { return };
        // Before VM init (GetThreadInfo is live-phase only) there is no name: nothing written.
        let Some(name) = agent.jvmti.thread_name(thread) else {
            return;
        };
        agent.submit(Some(describe::thread_start(current_tid(), name.bytes())));
    })
}

unsafe extern "C" fn on_thread_end(_: *mut JvmtiEnv, _: *mut c_void, _: ffi::JThread) {
    guard((), || {
        let Some(agent) = active() else { return };
        let mut bytes = Vec::new();
        record::encode(&Record::ThreadEnd { tid: current_tid() }, &mut bytes);
        agent.submit(Some(bytes));
    })
}

/// The calling thread's id in the JVM's pid namespace.
fn current_tid() -> u32 {
    // SAFETY: gettid has no preconditions and cannot fail.
    unsafe { libc::syscall(libc::SYS_gettid) as u32 }
}

fn active() -> Option<&'static Agent> {
    AGENT
        .get()
        .filter(|agent| !agent.stopped.load(Ordering::Acquire))
}

/// `pthread_self()`, as a number (never 0 on Linux: it is the thread's control block).
fn current_thread() -> u64 {
    // SAFETY: pthread_self has no preconditions.
    unsafe { libc::pthread_self() as u64 }
}

impl Agent {
    fn on_agent_thread(&self) -> bool {
        self.agent_thread.load(Ordering::Relaxed) == current_thread()
    }

    /// Hands an encoded record (None: it was too big to build) to the agent's thread. On a JVM
    /// thread this never waits: a full queue drops the record. On the agent's own thread (a
    /// replay) the queue is drained here instead, before it fills, so JVM threads keep room.
    fn submit(&self, encoded: Option<Vec<u8>>) {
        let Some(bytes) = encoded else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        if !self.on_agent_thread() {
            if self.queue.push(bytes).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
            return;
        }
        let pushed = match self.queue.push(bytes) {
            Ok(()) => Ok(()),
            Err(bytes) => {
                self.drain();
                self.queue.push(bytes)
            }
        };
        if pushed.is_err() {
            self.dropped.fetch_add(1, Ordering::Relaxed);
        }
        let (records, bytes) = self.queue.len();
        if records >= MAX_QUEUED_RECORDS / 4 || bytes >= MAX_QUEUED_BYTES / 4 {
            self.drain();
        }
    }

    /// The writer, unless the JVM is dying (then the files are removed, once).
    fn writer(&self) -> Option<MutexGuard<'_, Option<Writer>>> {
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if self.dying.load(Ordering::Acquire) {
            if let Some(writer) = writer.take() {
                writer.remove();
            }
            return None;
        }
        writer.is_some().then_some(writer)
    }

    /// Writes one encoded record (agent's thread, or `start` before it exists).
    fn write(&self, bytes: &[u8]) {
        let result = self
            .writer()
            .and_then(|mut writer| writer.as_mut().map(|w| w.append(bytes)));
        match result {
            Some(Ok(full)) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                if full {
                    self.rotate_wanted.store(true, Ordering::Release);
                }
            }
            Some(Err(_)) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.rotate_wanted.store(true, Ordering::Release);
            }
            None => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn write_record(&self, record: &Record) {
        let mut bytes = Vec::new();
        record::encode(record, &mut bytes);
        self.write(&bytes);
    }

    /// Writes what is queued, in order (agent's thread).
    fn drain(&self) {
        for bytes in self.queue.take_all() {
            self.track_thread(&bytes);
            self.write(&bytes);
        }
    }

    /// Keeps the live threads' records for replays, from the records written (agent's thread).
    fn track_thread(&self, bytes: &[u8]) {
        let Some(event) = record::thread_event(bytes) else {
            return;
        };
        let mut threads = self.threads.lock().unwrap_or_else(|p| p.into_inner());
        match event {
            Record::ThreadStart { tid, .. }
                if threads.len() < MAX_TRACKED_THREADS || threads.contains_key(&tid) =>
            {
                threads.insert(tid, bytes.to_vec());
            }
            Record::ThreadEnd { tid } => {
                threads.remove(&tid);
            }
            _ => {}
        }
    }

    fn update_status(&self, update: impl FnOnce(&mut AgentStatus)) {
        update(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    fn write_status(&self) {
        let status = self
            .status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        self.write_record(&Record::AgentStatus(status));
    }

    /// Turns HotSpot's allocation sampler on (JDK 11 and later), `interval` bytes apart on
    /// average: each sampled object calls [`jvm_profiler_sampled_object_alloc`]. A JVM that
    /// cannot (JDK 8, or the capability refused) is told on its stderr and keeps working; the
    /// daemon then weighs its allocations by its TLAB events.
    fn sample_allocations(&self, interval: i32) {
        if self.stopped.load(Ordering::Acquire) {
            return;
        }
        let mut caps = ffi::Capabilities::default();
        caps.bits[1] = ffi::CAN_GENERATE_SAMPLED_OBJECT_ALLOC_EVENTS;
        let err = self.jvmti.add_capabilities(&caps);
        if err != ffi::JVMTI_ERROR_NONE {
            log(&format!(
                "no allocation sampling: the JVM has no sampler ({err})"
            ));
            return;
        }
        let err = self.jvmti.set_heap_sampling_interval(interval);
        if err != ffi::JVMTI_ERROR_NONE {
            log(&format!(
                "no allocation sampling: SetHeapSamplingInterval failed ({err})"
            ));
            return;
        }
        let err = self.jvmti.enable_event(ffi::EVENT_SAMPLED_OBJECT_ALLOC);
        if err != ffi::JVMTI_ERROR_NONE {
            log(&format!(
                "no allocation sampling: enabling the event failed ({err})"
            ));
        }
    }

    /// Stops recording for good but stays loaded: work events off, callbacks return at once,
    /// the reason in the records. The JVM may still call a callback that started before.
    fn go_inert(&self, reason: &str) {
        self.stopped.store(true, Ordering::Release);
        for event in WORK_EVENTS {
            // Errors (an event that was never enabled, a thread not attached) change nothing:
            // the callbacks return at once anyway.
            let _ = self.jvmti.disable_event(event);
        }
        drop(self.queue.take_all());
        self.update_status(|status| {
            status.flags &= !STATUS_RECORDING;
            status.error = reason.to_owned();
        });
        self.write_status();
        log(&format!("stopped recording: {reason}"));
    }

    /// (records written, records dropped) so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// Writes a stats record if anything was written or dropped since `last`; returns the
    /// counts after it.
    fn report_stats(&self, last: (u64, u64)) -> (u64, u64) {
        if self.counts() == last {
            return last;
        }
        self.write_stats()
    }

    /// Writes a stats record; returns the counts after it.
    fn write_stats(&self) -> (u64, u64) {
        let (written, dropped) = self.counts();
        self.write_record(&Record::AgentStats(AgentStats {
            heap_live_bytes: heap::live_bytes(),
            heap_peak_bytes: heap::peak_bytes(),
            records_written: written,
            records_dropped: dropped,
        }));
        self.counts()
    }

    /// Writes a `LiveThread` record for every live Java thread whose `JavaThread*` it can read
    /// (agent's thread): see the module documentation.
    fn list_live_threads(&self, jni: &Jni) {
        // GetAllThreads and GetThreadInfo hand out local references, which a thread that never
        // returns to Java keeps until it pops a frame.
        if !jni.push_local_frame(LISTING_LOCAL_REFS) {
            return;
        }
        guard((), || self.list_live_threads_in_frame(jni));
        jni.pop_local_frame();
    }

    fn list_live_threads_in_frame(&self, jni: &Jni) {
        let eetop = jni
            .find_class(c"java/lang/Thread")
            .and_then(|class| jni.field_id(class, c"eetop", c"J"));
        let Some(eetop) = eetop else {
            if !self.no_eetop_logged.swap(true, Ordering::Relaxed) {
                log("java.lang.Thread has no eetop field: threads started before the agent keep their kernel names");
            }
            return;
        };
        let Some(threads) = self.jvmti.all_threads() else {
            return;
        };
        for &thread in threads.threads().iter().take(MAX_TRACKED_THREADS) {
            // SAFETY: `eetop` is a long field of java.lang.Thread, `thread` a Thread.
            let java_thread = unsafe { jni.long_field(thread, eetop) }.unwrap_or(0);
            // 0: the thread has exited (or not started).
            if java_thread != 0 {
                if let Some(name) = self.jvmti.thread_name(thread) {
                    self.write(&describe::live_thread(java_thread as u64, name.bytes()));
                }
            }
            jni.delete_local_ref(thread);
        }
    }

    /// Replays every live nmethod and stub into the current generation (agent's thread: the
    /// callbacks run here, and push to the queue, which is drained as it fills and at the end),
    /// then the live threads.
    fn replay(&self, jni: &Jni) {
        // What is queued now is growth of the generation, not the replay.
        self.drain();
        if let Some(mut writer) = self.writer() {
            if let Some(writer) = writer.as_mut() {
                writer.begin_replay();
            }
        }
        let _ = self.jvmti.generate_events(ffi::EVENT_COMPILED_METHOD_LOAD);
        let _ = self
            .jvmti
            .generate_events(ffi::EVENT_DYNAMIC_CODE_GENERATED);
        self.drain();
        // JVMTI has no replay of thread starts: the agent's own list.
        let threads: Vec<Vec<u8>> = self
            .threads
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .cloned()
            .collect();
        for bytes in threads {
            self.write(&bytes);
        }
        self.list_live_threads(jni);
        if let Some(mut writer) = self.writer() {
            if let Some(writer) = writer.as_mut() {
                writer.mark_baseline();
            }
        }
    }

    fn rotate(&self) -> bool {
        self.writer()
            .is_some_and(|mut writer| writer.as_mut().is_some_and(|w| w.rotate().is_ok()))
    }

    /// The agent's thread: the initial replay after a dynamic attach (so the attach returns at
    /// once), then draining the queue, the stats, and rotations with their replays.
    fn run(&self, initial_replay: bool) {
        self.agent_thread.store(current_thread(), Ordering::Relaxed);
        // GenerateEvents needs a thread attached to the VM.
        let Some(jni) = self
            .vm
            .attach_current_thread_as_daemon(c"jvm-profiler-sidecar")
        else {
            // Without replays a generation would lack the code compiled before it.
            self.go_inert("cannot attach its thread to the VM");
            return;
        };
        // Attached: this thread must not end (see below), even after a panic.
        guard((), || self.work(&jni, initial_replay));
        guard((), || self.go_inert("internal error in the agent's thread"));
        loop {
            std::thread::sleep(Duration::from_secs(60));
        }
    }

    /// The agent thread's work; returns only by panicking.
    fn work(&self, jni: &Jni, initial_replay: bool) {
        if !self.stopped.load(Ordering::Acquire) {
            if initial_replay {
                self.replay(jni);
            } else {
                // Loaded at startup: the threads that started before VM init have no name.
                self.list_live_threads(jni);
            }
        }
        self.write_status();
        let mut reported = self.write_stats();
        let mut last_report = Instant::now();
        let mut next_rotation = Instant::now();
        // Never detaches: at VM exit the process ends with this daemon thread, and detaching
        // from a VM that is being destroyed is not safe.
        loop {
            self.queue.wait(IDLE_WAIT);
            if self.stopped.load(Ordering::Acquire) {
                // Dying or inert: nothing more is written (a dying JVM's files go now).
                drop(self.queue.take_all());
                drop(self.writer());
                std::thread::sleep(Duration::from_secs(1));
                continue;
            }
            self.drain();
            if last_report.elapsed() >= STATS_EVERY {
                reported = self.report_stats(reported);
                last_report = Instant::now();
            }
            if Instant::now() < next_rotation || !self.rotate_wanted.swap(false, Ordering::AcqRel) {
                continue;
            }
            if self.rotate() {
                self.replay(jni);
                // Every generation carries the status and stats: a reader may skip older ones.
                self.write_status();
                reported = self.write_stats();
                next_rotation = Instant::now() + ROTATE_EVERY;
            } else {
                // Disk full or /tmp gone: try again later, dropping records meanwhile.
                self.rotate_wanted.store(true, Ordering::Release);
                next_rotation = Instant::now() + ROTATE_RETRY;
            }
        }
    }
}

fn spawn_agent_thread(initial_replay: bool) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("jvm-profiler-sidecar".into())
        .spawn(move || {
            guard((), || {
                if let Some(agent) = AGENT.get() {
                    agent.run(initial_replay);
                }
            })
        })
        .map(drop)
}
