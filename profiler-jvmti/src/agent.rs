//! The agent itself: entry points, event callbacks and the replay thread.
//!
//! Options (comma-separated, all optional): `dir=PATH` (default `/tmp/.jvm-profiler-<pid>`),
//! `max_bytes=N` (size cap of one generation, default 32 MiB).

use std::collections::HashMap;
use std::ffi::{c_char, c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use profiler_jvmti_records::channel::{self, Writer};
use profiler_jvmti_records::record::{
    self, AgentStats, CompiledMethod, InlineFrame, LineEntry, MethodInfo, PcInfo, Record,
};

use crate::ffi::{self, JInt, JMethodId, JavaVm, Jvmti, JvmtiEnv, Vm};
use crate::heap;

/// Bounds on what one CompiledMethodLoad may make us encode: a corrupt or huge inline table
/// must not make a JVM thread allocate without limit.
const MAX_PCS: usize = 200_000;
const MAX_FRAMES_PER_PC: usize = 256;
const MAX_METHODS: usize = 4096;
const MAX_CMLR_RECORDS: usize = 16;
/// How often the agent reports its heap and record counts (only when they changed).
const STATS_EVERY: Duration = Duration::from_secs(5);

struct Agent {
    jvmti: Jvmti,
    vm: Vm,
    /// None once the JVM is dying or the file could not be written at all.
    writer: Mutex<Option<Writer>>,
    rotate_wanted: AtomicBool,
    stopped: AtomicBool,
    written: AtomicU64,
    dropped: AtomicU64,
}

static AGENT: OnceLock<Agent> = OnceLock::new();

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
    guard(0, || {
        if let Err(message) = start(vm, options, false) {
            eprintln!("jvm-profiler-agent: not started: {message}");
        }
        0
    })
}

/// Dynamic attach entry point. A non-zero result is reported to the attaching daemon.
///
/// # Safety
/// Called by the JVM with a valid `JavaVM*` and options string (or null).
#[no_mangle]
pub unsafe extern "C" fn Agent_OnAttach(
    vm: *mut JavaVm,
    options: *const c_char,
    _: *mut c_void,
) -> JInt {
    guard(1, || match start(vm, options, true) {
        Ok(()) => 0,
        Err(message) => {
            eprintln!("jvm-profiler-agent: not started: {message}");
            1
        }
    })
}

/// Runs `f`, turning a panic into `default`: unwinding into the JVM is undefined behaviour.
fn guard<R>(default: R, f: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(default)
}

fn start(vm: *mut JavaVm, options: *const c_char, live: bool) -> Result<(), String> {
    if AGENT.get().is_some() {
        // Attached twice (the same library is only loaded once): already recording.
        return Ok(());
    }
    if vm.is_null() {
        return Err("no JavaVM".into());
    }
    let options = if options.is_null() {
        String::new()
    } else {
        // SAFETY: the JVM passes a NUL-terminated string.
        unsafe { CStr::from_ptr(options) }
            .to_string_lossy()
            .into_owned()
    };
    // SAFETY: getpid has no preconditions; inside the JVM's pid namespace it is the nspid.
    let pid = unsafe { libc::getpid() } as u32;
    let mut dir = channel::records_dir(pid);
    let mut max_bytes = channel::DEFAULT_MAX_BYTES;
    for option in options.split(',').filter(|o| !o.is_empty()) {
        match option.split_once('=') {
            Some(("dir", value)) => dir = PathBuf::from(value),
            Some(("max_bytes", value)) => {
                max_bytes = value
                    .parse()
                    .map_err(|_| format!("bad max_bytes {value:?}"))?
            }
            _ => return Err(format!("unknown option {option:?}")),
        }
    }

    let vm = Vm(vm);
    let jvmti = vm.jvmti_env().ok_or("no JVMTI 1.2 environment")?;
    let started_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let writer = Writer::create(&dir, pid, started_ns, max_bytes)
        .map_err(|err| format!("{}: {err}", dir.display()))?;

    let mut caps = ffi::Capabilities::default();
    caps.bits[0] = ffi::CAN_GET_SOURCE_FILE_NAME
        | ffi::CAN_GET_LINE_NUMBERS
        | ffi::CAN_GENERATE_COMPILED_METHOD_LOAD_EVENTS;
    let err = jvmti.add_capabilities(&caps);
    if err != ffi::JVMTI_ERROR_NONE {
        writer.remove();
        return Err(format!("AddCapabilities failed ({err})"));
    }
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
    let err = jvmti.set_event_callbacks(&callbacks);
    if err != ffi::JVMTI_ERROR_NONE {
        writer.remove();
        return Err(format!("SetEventCallbacks failed ({err})"));
    }

    let agent = Agent {
        jvmti: Jvmti(jvmti.0),
        vm,
        writer: Mutex::new(Some(writer)),
        rotate_wanted: AtomicBool::new(false),
        stopped: AtomicBool::new(false),
        written: AtomicU64::new(0),
        dropped: AtomicU64::new(0),
    };
    if AGENT.set(agent).is_err() {
        return Ok(());
    }
    let mut events = vec![
        ffi::EVENT_VM_DEATH,
        ffi::EVENT_COMPILED_METHOD_LOAD,
        ffi::EVENT_COMPILED_METHOD_UNLOAD,
        ffi::EVENT_DYNAMIC_CODE_GENERATED,
    ];
    if !live {
        // The replay thread needs a live VM to attach to.
        events.push(ffi::EVENT_VM_INIT);
    }
    for event in events {
        let err = jvmti.enable_event(event);
        if err != ffi::JVMTI_ERROR_NONE {
            return Err(format!("enabling event {event} failed ({err})"));
        }
    }
    if live {
        spawn_replay_thread(true);
    }
    Ok(())
}

unsafe extern "C" fn on_vm_init(_: *mut JvmtiEnv, _: *mut c_void, _: ffi::JThread) {
    // Loaded at startup: nothing is compiled yet, so no initial replay.
    guard((), || spawn_replay_thread(false))
}

unsafe extern "C" fn on_vm_death(_: *mut JvmtiEnv, _: *mut c_void) {
    guard((), || {
        let Some(agent) = AGENT.get() else { return };
        agent.stopped.store(true, Ordering::Release);
        let mut writer = agent.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(writer) = writer.take() {
            writer.remove();
        }
    })
}

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
        let compiled = describe_compiled(&agent.jvmti, method, code_size, code_addr, compile_info);
        agent.append(&Record::CompiledMethodLoad(compiled));
    })
}

unsafe extern "C" fn on_compiled_method_unload(
    _: *mut JvmtiEnv,
    method: JMethodId,
    code_addr: *const c_void,
) {
    guard((), || {
        let Some(agent) = active() else { return };
        agent.append(&Record::CompiledMethodUnload {
            method_ptr: method_ptr(method),
            code_addr: code_addr as u64,
        });
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
            String::new()
        } else {
            // SAFETY: JVMTI passes a NUL-terminated name.
            unsafe { CStr::from_ptr(name) }
                .to_string_lossy()
                .into_owned()
        };
        agent.append(&Record::DynamicCode {
            addr: addr as u64,
            size: length.max(0) as u32,
            name,
        });
    })
}

fn active() -> Option<&'static Agent> {
    AGENT
        .get()
        .filter(|agent| !agent.stopped.load(Ordering::Acquire))
}

impl Agent {
    /// Encodes outside the lock; holds it for one write.
    fn append(&self, record: &Record) {
        let mut bytes = Vec::new();
        record::encode(record, &mut bytes);
        if bytes.len() > record::MAX_RECORD_LEN {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(writer) = writer.as_mut() else {
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return;
        };
        match writer.append(&bytes) {
            Ok(full) => {
                self.written.fetch_add(1, Ordering::Relaxed);
                if full {
                    self.rotate_wanted.store(true, Ordering::Release);
                }
            }
            Err(_) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                self.rotate_wanted.store(true, Ordering::Release);
            }
        }
    }

    /// (records written, records dropped) so far.
    fn counts(&self) -> (u64, u64) {
        (
            self.written.load(Ordering::Relaxed),
            self.dropped.load(Ordering::Relaxed),
        )
    }

    /// Appends a stats record if anything was written or dropped since `last`; returns the
    /// counts after it.
    fn report_stats(&self, last: (u64, u64)) -> (u64, u64) {
        if self.counts() == last {
            return last;
        }
        self.write_stats()
    }

    /// Appends a stats record; returns the counts after it.
    fn write_stats(&self) -> (u64, u64) {
        let (written, dropped) = self.counts();
        self.append(&Record::AgentStats(AgentStats {
            heap_live_bytes: heap::live_bytes(),
            heap_peak_bytes: heap::peak_bytes(),
            records_written: written,
            records_dropped: dropped,
        }));
        self.counts()
    }

    /// Replays every live nmethod and stub into the current generation.
    fn replay(&self) {
        let _ = self.jvmti.generate_events(ffi::EVENT_COMPILED_METHOD_LOAD);
        let _ = self
            .jvmti
            .generate_events(ffi::EVENT_DYNAMIC_CODE_GENERATED);
        let mut writer = self.writer.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(writer) = writer.as_mut() {
            writer.mark_baseline();
        }
    }
}

/// The agent's own thread: the initial replay after a dynamic attach (so the attach returns at
/// once), the replay after each rotation and the stats records. GenerateEvents needs a thread
/// attached to the VM, and must not run inside an event callback.
fn spawn_replay_thread(initial_replay: bool) {
    let _ = std::thread::Builder::new()
        .name("jvm-profiler-sidecar".into())
        .spawn(move || {
            guard((), || {
                let Some(agent) = AGENT.get() else { return };
                if !agent
                    .vm
                    .attach_current_thread_as_daemon(c"jvm-profiler-sidecar")
                {
                    return;
                }
                if initial_replay {
                    agent.replay();
                }
                let mut reported = agent.write_stats();
                let mut last_report = Instant::now();
                // Never detaches: at VM exit the process ends with this daemon thread, and
                // detaching from a VM that is being destroyed is not safe.
                loop {
                    std::thread::sleep(Duration::from_millis(100));
                    if agent.stopped.load(Ordering::Acquire) {
                        continue;
                    }
                    if last_report.elapsed() >= STATS_EVERY {
                        reported = agent.report_stats(reported);
                        last_report = Instant::now();
                    }
                    if !agent.rotate_wanted.swap(false, Ordering::AcqRel) {
                        continue;
                    }
                    let rotated = {
                        let mut writer = agent.writer.lock().unwrap_or_else(|p| p.into_inner());
                        writer.as_mut().is_some_and(|w| w.rotate().is_ok())
                    };
                    if rotated {
                        agent.replay();
                        // Every generation carries the stats: a reader may skip older ones.
                        reported = agent.write_stats();
                        // At most one rotation a second, whatever the compilation rate.
                        std::thread::sleep(Duration::from_secs(1));
                    } else {
                        // Disk full or /tmp gone: try again later, dropping records meanwhile.
                        std::thread::sleep(Duration::from_secs(5));
                        agent.rotate_wanted.store(true, Ordering::Release);
                    }
                }
            })
        });
}

/// `*(Method**)jmethodID`: true on JDK 25 and older (not on 26, JDK-8268406). 0 if unknown.
fn method_ptr(method: JMethodId) -> u64 {
    if method.is_null() {
        return 0;
    }
    // SAFETY: a jmethodID handed to us by JVMTI points to a word the JVM never frees.
    unsafe { std::ptr::read_volatile(method as *const u64) }
}

fn describe_method(jvmti: &Jvmti, method: JMethodId) -> MethodInfo {
    let mut info = MethodInfo {
        method_ptr: method_ptr(method),
        ..MethodInfo::default()
    };
    if let Some((name, signature)) = jvmti.method_name(method) {
        info.name = name;
        info.signature = signature;
    }
    if let Some(class) = jvmti.declaring_class(method) {
        info.class_signature = jvmti.class_signature(class).unwrap_or_default();
        info.source_file = jvmti.source_file_name(class).unwrap_or_default();
    }
    info.lines = jvmti
        .line_number_table(method)
        .into_iter()
        .map(|(start, line)| LineEntry {
            bci: u32::try_from(start).unwrap_or(0),
            line: u32::try_from(line).unwrap_or(0),
        })
        .collect();
    info
}

fn describe_compiled(
    jvmti: &Jvmti,
    method: JMethodId,
    code_size: JInt,
    code_addr: *const c_void,
    compile_info: *const c_void,
) -> CompiledMethod {
    let mut methods = vec![describe_method(jvmti, method)];
    let mut index: HashMap<usize, u32> = HashMap::from([(method as usize, 0)]);
    let mut pcs = Vec::new();
    let mut header = compile_info as *const ffi::CmlrHeader;
    for _ in 0..MAX_CMLR_RECORDS {
        if header.is_null() {
            break;
        }
        // SAFETY: compile_info is null or a chain of record headers valid during the callback.
        let h = unsafe { &*header };
        if h.kind == ffi::CMLR_INLINE_INFO && h.major == 1 {
            // SAFETY: an INLINE_INFO header starts a jvmtiCompiledMethodLoadInlineRecord.
            let rec = unsafe { &*(header as *const ffi::CmlrInlineRecord) };
            let numpcs = usize::try_from(rec.numpcs).unwrap_or(0).min(MAX_PCS);
            for i in 0..numpcs {
                if rec.pcinfo.is_null() {
                    break;
                }
                // SAFETY: pcinfo has numpcs entries.
                let pc = unsafe { &*rec.pcinfo.add(i) };
                let depth = usize::try_from(pc.numstackframes)
                    .unwrap_or(0)
                    .min(MAX_FRAMES_PER_PC);
                let mut frames = Vec::with_capacity(depth);
                for j in 0..depth {
                    if pc.methods.is_null() || pc.bcis.is_null() {
                        break;
                    }
                    // SAFETY: methods and bcis have numstackframes entries.
                    let (m, bci) = unsafe { (*pc.methods.add(j), *pc.bcis.add(j)) };
                    let slot = match index.get(&(m as usize)) {
                        Some(slot) => *slot,
                        None if methods.len() < MAX_METHODS => {
                            let slot = methods.len() as u32;
                            methods.push(describe_method(jvmti, m));
                            index.insert(m as usize, slot);
                            slot
                        }
                        None => break,
                    };
                    frames.push(InlineFrame { method: slot, bci });
                }
                pcs.push(PcInfo {
                    pc: pc.pc as u64,
                    frames,
                });
            }
        }
        header = h.next;
    }
    CompiledMethod {
        code_addr: code_addr as u64,
        code_size: code_size.max(0) as u32,
        methods,
        pcs,
    }
}
