//! The JNI and JVMTI declarations the agent uses.
//!
//! - JNI (`JNIEnv`, `JavaVM`, their function tables and types) comes from `jni-sys`.
//! - The JVMTI function table is [`JvmtiInterface`], written from the JVMTI specification's
//!   "Function Table Layout" (each function's documented position, 1-based): every position up
//!   to 156 (SetHeapSamplingInterval, JDK 11) has a field named after its function (`reservedN`
//!   where the specification reserves it), typed where the agent calls it, `*const c_void`
//!   elsewhere. Compile-time asserts check the table's size and each used field's offset against
//!   its position, so a miscounted field fails the build.
//! - The rest is written by hand: from the specification, the few JVMTI types and constants used
//!   (event numbers, capability bits, `jvmtiThreadInfo`, `jvmtiLineNumberEntry`) and the prefix
//!   of `jvmtiEventCallbacks` the agent installs; from `jvmticmlr.h` (the specification leaves
//!   that format to the VM), the inline records `CompiledMethodLoad` hands over.

use std::ffi::{c_char, c_void};
use std::mem::{offset_of, size_of};

pub use jni_sys::{JNI_OK, JNI_VERSION_1_8};

pub type JInt = jni_sys::jint;
pub type JLong = jni_sys::jlong;
pub type JMethodId = jni_sys::jmethodID;
pub type JClass = jni_sys::jclass;
pub type JThread = jni_sys::jobject;
pub type JObject = jni_sys::jobject;
pub type JFieldId = jni_sys::jfieldID;
/// `jvmtiError`, a C enum.
pub type JvmtiError = u32;

pub const JVMTI_VERSION_1_2: JInt = 0x3001_0200;
pub const JVMTI_ERROR_NONE: JvmtiError = 0;
pub const JVMTI_ENABLE: JInt = 1;
pub const JVMTI_DISABLE: JInt = 0;

pub const EVENT_VM_INIT: JInt = 50;
pub const EVENT_VM_DEATH: JInt = 51;
pub const EVENT_THREAD_START: JInt = 52;
pub const EVENT_THREAD_END: JInt = 53;
pub const EVENT_COMPILED_METHOD_LOAD: JInt = 68;
pub const EVENT_COMPILED_METHOD_UNLOAD: JInt = 69;
pub const EVENT_DYNAMIC_CODE_GENERATED: JInt = 70;
pub const EVENT_SAMPLED_OBJECT_ALLOC: JInt = 86;

/// `jvmtiCapabilities`: 128 bits, filled from the least significant bit of the first word.
#[repr(C)]
#[derive(Default)]
pub struct Capabilities {
    pub bits: [u32; 4],
}

pub const CAN_GET_SOURCE_FILE_NAME: u32 = 1 << 11;
pub const CAN_GET_LINE_NUMBERS: u32 = 1 << 12;
pub const CAN_GENERATE_COMPILED_METHOD_LOAD_EVENTS: u32 = 1 << 27;
/// Capability 43, `can_generate_sampled_object_alloc_events` (JDK 11+): in the second word.
pub const CAN_GENERATE_SAMPLED_OBJECT_ALLOC_EVENTS: u32 = 1 << (43 - 32);

/// `jvmtiLineNumberEntry`.
#[repr(C)]
pub struct LineNumberEntry {
    pub start_location: JLong,
    pub line_number: JInt,
}

/// `jvmtiCompiledMethodLoadRecordHeader`.
#[repr(C)]
pub struct CmlrHeader {
    pub kind: JInt,
    pub major: JInt,
    pub minor: JInt,
    pub next: *const CmlrHeader,
}

pub const CMLR_INLINE_INFO: JInt = 2;

/// `PCStackInfo`.
#[repr(C)]
pub struct PcStackInfo {
    pub pc: *const c_void,
    pub numstackframes: JInt,
    pub methods: *const JMethodId,
    pub bcis: *const JInt,
}

/// `jvmtiCompiledMethodLoadInlineRecord`.
#[repr(C)]
pub struct CmlrInlineRecord {
    pub header: CmlrHeader,
    pub numpcs: JInt,
    pub pcinfo: *const PcStackInfo,
}

/// `jvmtiEnv`: what a `jvmtiEnv*` points to is a pointer to the function table.
pub type JvmtiEnv = *const JvmtiInterface;

/// `JavaVM` and `JNIEnv` (JNI's own function tables, from `jni-sys`).
pub type JavaVm = jni_sys::JavaVM;
pub type JniEnv = jni_sys::JNIEnv;

/// `jvmtiThreadInfo`. `thread_group` and `context_class_loader` are JNI local references, freed
/// when the event callback that asked for them returns.
#[repr(C)]
pub struct ThreadInfo {
    pub name: *mut c_char,
    pub priority: JInt,
    pub is_daemon: u8,
    pub thread_group: JObject,
    pub context_class_loader: JObject,
}

pub type VmInitFn = unsafe extern "C" fn(*mut JvmtiEnv, *mut c_void, JThread);
pub type VmDeathFn = unsafe extern "C" fn(*mut JvmtiEnv, *mut c_void);
/// ThreadStart and ThreadEnd: (env, JNIEnv, thread).
pub type ThreadEventFn = unsafe extern "C" fn(*mut JvmtiEnv, *mut c_void, JThread);
pub type CompiledMethodLoadFn = unsafe extern "C" fn(
    *mut JvmtiEnv,
    JMethodId,
    JInt,
    *const c_void,
    JInt,
    *const c_void,
    *const c_void,
);
pub type CompiledMethodUnloadFn = unsafe extern "C" fn(*mut JvmtiEnv, JMethodId, *const c_void);
pub type DynamicCodeGeneratedFn =
    unsafe extern "C" fn(*mut JvmtiEnv, *const c_char, *const c_void, JInt);
/// SampledObjectAlloc: (env, JNIEnv, thread, object, its class, its size in bytes).
pub type SampledObjectAllocFn =
    unsafe extern "C" fn(*mut JvmtiEnv, *mut c_void, JThread, JObject, JObject, JLong);

/// The head of `jvmtiEventCallbacks` up to SampledObjectAlloc (event 86); slot `i` is event
/// `50 + i`. JVMTI copies what it knows of a longer struct (JDK 8's ends before event 86).
#[repr(C)]
pub struct EventCallbacks {
    pub slots: [*const c_void; 37],
}

impl EventCallbacks {
    pub fn new() -> Self {
        Self {
            slots: [std::ptr::null(); 37],
        }
    }

    pub fn set(&mut self, event: JInt, callback: *const c_void) {
        if let Some(slot) = usize::try_from(event - EVENT_VM_INIT)
            .ok()
            .and_then(|i| self.slots.get_mut(i))
        {
            *slot = callback;
        }
    }
}

/// The JVMTI function table (`jvmtiInterface_1_`): one field per position of the
/// specification's "Function Table Layout", position `n` at offset `(n - 1)` words. Fields the
/// agent calls are typed (`None` if the VM left the slot null); the others are named after their
/// function (JDK 17's layout, plus SuspendAllVirtualThreads and ResumeAllVirtualThreads, which
/// JDK 21 put at the reserved positions 118 and 119) and left untyped.
///
/// Only ever read one field at a time through the environment (`(**env).deallocate`), never
/// borrowed whole: a VM's table ends at the last position it knows (156 since JDK 11, 155 in
/// JDK 8), and every position the agent reads is in all of them.
#[repr(C)]
pub struct JvmtiInterface {
    pub reserved1: *const c_void, // 1
    /// 2: `SetEventNotificationMode`.
    pub set_event_notification_mode: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            mode: JInt,
            event_type: JInt,
            event_thread: JThread,
            ...
        ) -> JvmtiError,
    >,
    pub get_all_modules: *const c_void, // 3
    /// 4: `GetAllThreads`.
    pub get_all_threads: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            threads_count_ptr: *mut JInt,
            threads_ptr: *mut *mut JThread,
        ) -> JvmtiError,
    >,
    pub suspend_thread: *const c_void,   // 5
    pub resume_thread: *const c_void,    // 6
    pub stop_thread: *const c_void,      // 7
    pub interrupt_thread: *const c_void, // 8
    /// 9: `GetThreadInfo`.
    pub get_thread_info: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            thread: JThread,
            info_ptr: *mut ThreadInfo,
        ) -> JvmtiError,
    >,
    pub get_owned_monitor_info: *const c_void,         // 10
    pub get_current_contended_monitor: *const c_void,  // 11
    pub run_agent_thread: *const c_void,               // 12
    pub get_top_thread_groups: *const c_void,          // 13
    pub get_thread_group_info: *const c_void,          // 14
    pub get_thread_group_children: *const c_void,      // 15
    pub get_frame_count: *const c_void,                // 16
    pub get_thread_state: *const c_void,               // 17
    pub get_current_thread: *const c_void,             // 18
    pub get_frame_location: *const c_void,             // 19
    pub notify_frame_pop: *const c_void,               // 20
    pub get_local_object: *const c_void,               // 21
    pub get_local_int: *const c_void,                  // 22
    pub get_local_long: *const c_void,                 // 23
    pub get_local_float: *const c_void,                // 24
    pub get_local_double: *const c_void,               // 25
    pub set_local_object: *const c_void,               // 26
    pub set_local_int: *const c_void,                  // 27
    pub set_local_long: *const c_void,                 // 28
    pub set_local_float: *const c_void,                // 29
    pub set_local_double: *const c_void,               // 30
    pub create_raw_monitor: *const c_void,             // 31
    pub destroy_raw_monitor: *const c_void,            // 32
    pub raw_monitor_enter: *const c_void,              // 33
    pub raw_monitor_exit: *const c_void,               // 34
    pub raw_monitor_wait: *const c_void,               // 35
    pub raw_monitor_notify: *const c_void,             // 36
    pub raw_monitor_notify_all: *const c_void,         // 37
    pub set_breakpoint: *const c_void,                 // 38
    pub clear_breakpoint: *const c_void,               // 39
    pub get_named_module: *const c_void,               // 40
    pub set_field_access_watch: *const c_void,         // 41
    pub clear_field_access_watch: *const c_void,       // 42
    pub set_field_modification_watch: *const c_void,   // 43
    pub clear_field_modification_watch: *const c_void, // 44
    pub is_modifiable_class: *const c_void,            // 45
    pub allocate: *const c_void,                       // 46
    /// 47: `Deallocate`.
    pub deallocate: Option<unsafe extern "C" fn(env: *mut JvmtiEnv, mem: *mut u8) -> JvmtiError>,
    /// 48: `GetClassSignature`.
    pub get_class_signature: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            klass: JClass,
            signature_ptr: *mut *mut c_char,
            generic_ptr: *mut *mut c_char,
        ) -> JvmtiError,
    >,
    pub get_class_status: *const c_void, // 49
    /// 50: `GetSourceFileName`.
    pub get_source_file_name: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            klass: JClass,
            source_name_ptr: *mut *mut c_char,
        ) -> JvmtiError,
    >,
    pub get_class_modifiers: *const c_void,        // 51
    pub get_class_methods: *const c_void,          // 52
    pub get_class_fields: *const c_void,           // 53
    pub get_implemented_interfaces: *const c_void, // 54
    pub is_interface: *const c_void,               // 55
    pub is_array_class: *const c_void,             // 56
    pub get_class_loader: *const c_void,           // 57
    pub get_object_hash_code: *const c_void,       // 58
    pub get_object_monitor_usage: *const c_void,   // 59
    pub get_field_name: *const c_void,             // 60
    pub get_field_declaring_class: *const c_void,  // 61
    pub get_field_modifiers: *const c_void,        // 62
    pub is_field_synthetic: *const c_void,         // 63
    /// 64: `GetMethodName`.
    pub get_method_name: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            method: JMethodId,
            name_ptr: *mut *mut c_char,
            signature_ptr: *mut *mut c_char,
            generic_ptr: *mut *mut c_char,
        ) -> JvmtiError,
    >,
    /// 65: `GetMethodDeclaringClass`.
    pub get_method_declaring_class: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            method: JMethodId,
            declaring_class_ptr: *mut JClass,
        ) -> JvmtiError,
    >,
    pub get_method_modifiers: *const c_void, // 66
    pub reserved67: *const c_void,           // 67
    pub get_max_locals: *const c_void,       // 68
    pub get_arguments_size: *const c_void,   // 69
    /// 70: `GetLineNumberTable`.
    pub get_line_number_table: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            method: JMethodId,
            entry_count_ptr: *mut JInt,
            table_ptr: *mut *mut LineNumberEntry,
        ) -> JvmtiError,
    >,
    pub get_method_location: *const c_void,          // 71
    pub get_local_variable_table: *const c_void,     // 72
    pub set_native_method_prefix: *const c_void,     // 73
    pub set_native_method_prefixes: *const c_void,   // 74
    pub get_bytecodes: *const c_void,                // 75
    pub is_method_native: *const c_void,             // 76
    pub is_method_synthetic: *const c_void,          // 77
    pub get_loaded_classes: *const c_void,           // 78
    pub get_class_loader_classes: *const c_void,     // 79
    pub pop_frame: *const c_void,                    // 80
    pub force_early_return_object: *const c_void,    // 81
    pub force_early_return_int: *const c_void,       // 82
    pub force_early_return_long: *const c_void,      // 83
    pub force_early_return_float: *const c_void,     // 84
    pub force_early_return_double: *const c_void,    // 85
    pub force_early_return_void: *const c_void,      // 86
    pub redefine_classes: *const c_void,             // 87
    pub get_version_number: *const c_void,           // 88
    pub get_capabilities: *const c_void,             // 89
    pub get_source_debug_extension: *const c_void,   // 90
    pub is_method_obsolete: *const c_void,           // 91
    pub suspend_thread_list: *const c_void,          // 92
    pub resume_thread_list: *const c_void,           // 93
    pub add_module_reads: *const c_void,             // 94
    pub add_module_exports: *const c_void,           // 95
    pub add_module_opens: *const c_void,             // 96
    pub add_module_uses: *const c_void,              // 97
    pub add_module_provides: *const c_void,          // 98
    pub is_modifiable_module: *const c_void,         // 99
    pub get_all_stack_traces: *const c_void,         // 100
    pub get_thread_list_stack_traces: *const c_void, // 101
    pub get_thread_local_storage: *const c_void,     // 102
    pub set_thread_local_storage: *const c_void,     // 103
    pub get_stack_trace: *const c_void,              // 104
    pub reserved105: *const c_void,                  // 105
    pub get_tag: *const c_void,                      // 106
    pub set_tag: *const c_void,                      // 107
    pub force_garbage_collection: *const c_void,     // 108
    pub iterate_over_objects_reachable_from_object: *const c_void, // 109
    pub iterate_over_reachable_objects: *const c_void, // 110
    pub iterate_over_heap: *const c_void,            // 111
    pub iterate_over_instances_of_class: *const c_void, // 112
    pub reserved113: *const c_void,                  // 113
    pub get_objects_with_tags: *const c_void,        // 114
    pub follow_references: *const c_void,            // 115
    pub iterate_through_heap: *const c_void,         // 116
    pub reserved117: *const c_void,                  // 117
    pub suspend_all_virtual_threads: *const c_void,  // 118
    pub resume_all_virtual_threads: *const c_void,   // 119
    pub set_jni_function_table: *const c_void,       // 120
    pub get_jni_function_table: *const c_void,       // 121
    /// 122: `SetEventCallbacks`.
    pub set_event_callbacks: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            callbacks: *const EventCallbacks,
            size_of_callbacks: JInt,
        ) -> JvmtiError,
    >,
    /// 123: `GenerateEvents`.
    pub generate_events:
        Option<unsafe extern "C" fn(env: *mut JvmtiEnv, event_type: JInt) -> JvmtiError>,
    pub get_extension_functions: *const c_void,      // 124
    pub get_extension_events: *const c_void,         // 125
    pub set_extension_event_callback: *const c_void, // 126
    /// 127: `DisposeEnvironment`.
    pub dispose_environment: Option<unsafe extern "C" fn(env: *mut JvmtiEnv) -> JvmtiError>,
    pub get_error_name: *const c_void,        // 128
    pub get_jlocation_format: *const c_void,  // 129
    pub get_system_properties: *const c_void, // 130
    /// 131: `GetSystemProperty`.
    pub get_system_property: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            property: *const c_char,
            value_ptr: *mut *mut c_char,
        ) -> JvmtiError,
    >,
    pub set_system_property: *const c_void, // 132
    pub get_phase: *const c_void,           // 133
    pub get_current_thread_cpu_timer_info: *const c_void, // 134
    pub get_current_thread_cpu_time: *const c_void, // 135
    pub get_thread_cpu_timer_info: *const c_void, // 136
    pub get_thread_cpu_time: *const c_void, // 137
    pub get_timer_info: *const c_void,      // 138
    pub get_time: *const c_void,            // 139
    pub get_potential_capabilities: *const c_void, // 140
    pub reserved141: *const c_void,         // 141
    /// 142: `AddCapabilities`.
    pub add_capabilities: Option<
        unsafe extern "C" fn(
            env: *mut JvmtiEnv,
            capabilities_ptr: *const Capabilities,
        ) -> JvmtiError,
    >,
    pub relinquish_capabilities: *const c_void,   // 143
    pub get_available_processors: *const c_void,  // 144
    pub get_class_version_numbers: *const c_void, // 145
    pub get_constant_pool: *const c_void,         // 146
    pub get_environment_local_storage: *const c_void, // 147
    pub set_environment_local_storage: *const c_void, // 148
    pub add_to_bootstrap_class_loader_search: *const c_void, // 149
    pub set_verbose_flag: *const c_void,          // 150
    pub add_to_system_class_loader_search: *const c_void, // 151
    pub retransform_classes: *const c_void,       // 152
    pub get_owned_monitor_stack_depth_info: *const c_void, // 153
    pub get_object_size: *const c_void,           // 154
    pub get_local_instance: *const c_void,        // 155
    /// 156: `SetHeapSamplingInterval` (JDK 11+; JDK 8's table ends before it).
    pub set_heap_sampling_interval:
        Option<unsafe extern "C" fn(env: *mut JvmtiEnv, sampling_interval: JInt) -> JvmtiError>,
}

/// Positions (1-based, as the specification numbers them) of the fields the agent calls.
const _: () = {
    const fn at(position: usize) -> usize {
        (position - 1) * size_of::<usize>()
    }
    assert!(size_of::<JvmtiInterface>() == 156 * size_of::<usize>());
    assert!(offset_of!(JvmtiInterface, set_event_notification_mode) == at(2));
    assert!(offset_of!(JvmtiInterface, get_all_threads) == at(4));
    assert!(offset_of!(JvmtiInterface, get_thread_info) == at(9));
    assert!(offset_of!(JvmtiInterface, deallocate) == at(47));
    assert!(offset_of!(JvmtiInterface, get_class_signature) == at(48));
    assert!(offset_of!(JvmtiInterface, get_source_file_name) == at(50));
    assert!(offset_of!(JvmtiInterface, get_method_name) == at(64));
    assert!(offset_of!(JvmtiInterface, get_method_declaring_class) == at(65));
    assert!(offset_of!(JvmtiInterface, get_line_number_table) == at(70));
    assert!(offset_of!(JvmtiInterface, set_event_callbacks) == at(122));
    assert!(offset_of!(JvmtiInterface, generate_events) == at(123));
    assert!(offset_of!(JvmtiInterface, dispose_environment) == at(127));
    assert!(offset_of!(JvmtiInterface, get_system_property) == at(131));
    assert!(offset_of!(JvmtiInterface, add_capabilities) == at(142));
    assert!(offset_of!(JvmtiInterface, set_heap_sampling_interval) == at(156));
};

/// Typed access to the JVMTI function table.
pub struct Jvmti(pub *mut JvmtiEnv);

// SAFETY: a jvmtiEnv may be used from any thread attached to the VM (JVMTI specification).
unsafe impl Send for Jvmti {}
// SAFETY: as above.
unsafe impl Sync for Jvmti {}

const MISSING: JvmtiError = u32::MAX;

/// A NUL-terminated string JVMTI allocated for us, freed (`Deallocate`) when dropped. Its bytes
/// can be measured before anything is copied.
pub struct JvmtiString<'a> {
    jvmti: &'a Jvmti,
    ptr: *mut c_char,
}

impl JvmtiString<'_> {
    /// The bytes before the NUL: modified UTF-8 as the JVM keeps it.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: non-null (checked at construction), NUL-terminated, alive until dropped.
        unsafe { std::ffi::CStr::from_ptr(self.ptr) }.to_bytes()
    }
}

impl Drop for JvmtiString<'_> {
    fn drop(&mut self) {
        self.jvmti.deallocate(self.ptr);
    }
}

/// A line number table JVMTI allocated for us, freed when dropped.
pub struct LineTable<'a> {
    jvmti: &'a Jvmti,
    ptr: *mut LineNumberEntry,
    len: usize,
}

impl LineTable<'_> {
    pub fn entries(&self) -> &[LineNumberEntry] {
        // SAFETY: JVMTI returned `len` entries at the non-null `ptr`, alive until dropped.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for LineTable<'_> {
    fn drop(&mut self) {
        self.jvmti.deallocate(self.ptr);
    }
}

/// The thread references `GetAllThreads` returned; the array is freed when dropped.
pub struct ThreadArray<'a> {
    jvmti: &'a Jvmti,
    ptr: *mut JThread,
    len: usize,
}

impl ThreadArray<'_> {
    pub fn threads(&self) -> &[JThread] {
        // SAFETY: JVMTI returned `len` references at the non-null `ptr`, alive until dropped.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl Drop for ThreadArray<'_> {
    fn drop(&mut self) {
        self.jvmti.deallocate(self.ptr);
    }
}

impl Jvmti {
    pub fn enable_event(&self, event: JInt) -> JvmtiError {
        self.set_event_mode(JVMTI_ENABLE, event)
    }

    pub fn disable_event(&self, event: JInt) -> JvmtiError {
        self.set_event_mode(JVMTI_DISABLE, event)
    }

    fn set_event_mode(&self, mode: JInt, event: JInt) -> JvmtiError {
        // SAFETY: a live env points to its table, which has every position read here (see
        // [`JvmtiInterface`]).
        match unsafe { (**self.0).set_event_notification_mode } {
            // SAFETY: live env; a null thread means all threads.
            Some(f) => unsafe { f(self.0, mode, event, std::ptr::null_mut()) },
            None => MISSING,
        }
    }

    /// Frees memory JVMTI allocated for us; null is fine.
    pub fn deallocate<T>(&self, ptr: *mut T) {
        if ptr.is_null() {
            return;
        }
        // SAFETY: as in `set_event_mode`.
        if let Some(f) = unsafe { (**self.0).deallocate } {
            // SAFETY: `ptr` came from a JVMTI call on this env.
            unsafe { f(self.0, ptr.cast()) };
        }
    }

    fn string(&self, ptr: *mut c_char) -> Option<JvmtiString<'_>> {
        (!ptr.is_null()).then_some(JvmtiString { jvmti: self, ptr })
    }

    /// The name of `thread` (`GetThreadInfo`; live phase, a thread attached to the VM). The
    /// info's local references are the calling thread's: freed when an event callback returns,
    /// else call it inside a [`Jni::push_local_frame`].
    pub fn thread_name(&self, thread: JThread) -> Option<JvmtiString<'_>> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_thread_info }?;
        let mut info = ThreadInfo {
            name: std::ptr::null_mut(),
            priority: 0,
            is_daemon: 0,
            thread_group: std::ptr::null_mut(),
            context_class_loader: std::ptr::null_mut(),
        };
        // SAFETY: live env, the event's thread reference, out-pointer to a jvmtiThreadInfo.
        let err = unsafe { f(self.0, thread, &mut info) };
        let name = self.string(info.name);
        if err == JVMTI_ERROR_NONE {
            name
        } else {
            None
        }
    }

    /// The JVM's live platform threads (`GetAllThreads`; live phase), as JNI local references
    /// of the calling thread: call it inside a [`Jni::push_local_frame`] on a thread that does
    /// not return to Java. The array is freed when dropped, not the references.
    pub fn all_threads(&self) -> Option<ThreadArray<'_>> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_all_threads }?;
        let mut count = 0;
        let mut threads = std::ptr::null_mut();
        // SAFETY: live env, out-pointers.
        let err = unsafe { f(self.0, &mut count, &mut threads) };
        if threads.is_null() {
            return None;
        }
        let array = ThreadArray {
            jvmti: self,
            ptr: threads,
            len: usize::try_from(count).unwrap_or(0),
        };
        (err == JVMTI_ERROR_NONE).then_some(array)
    }

    pub fn class_signature(&self, class: JClass) -> Option<JvmtiString<'_>> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_class_signature }?;
        let mut sig = std::ptr::null_mut();
        // SAFETY: live env, valid local class reference, out-pointer (generic not wanted).
        let err = unsafe { f(self.0, class, &mut sig, std::ptr::null_mut()) };
        let sig = self.string(sig);
        if err == JVMTI_ERROR_NONE {
            sig
        } else {
            None
        }
    }

    pub fn source_file_name(&self, class: JClass) -> Option<JvmtiString<'_>> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_source_file_name }?;
        let mut name = std::ptr::null_mut();
        // SAFETY: as above.
        let err = unsafe { f(self.0, class, &mut name) };
        let name = self.string(name);
        if err == JVMTI_ERROR_NONE {
            name
        } else {
            None
        }
    }

    /// (name, signature).
    pub fn method_name(&self, method: JMethodId) -> Option<(JvmtiString<'_>, JvmtiString<'_>)> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_method_name }?;
        let mut name = std::ptr::null_mut();
        let mut sig = std::ptr::null_mut();
        // SAFETY: live env, jmethodID from the current event.
        let err = unsafe { f(self.0, method, &mut name, &mut sig, std::ptr::null_mut()) };
        let (name, sig) = (self.string(name), self.string(sig));
        if err != JVMTI_ERROR_NONE {
            return None;
        }
        Some((name?, sig?))
    }

    pub fn declaring_class(&self, method: JMethodId) -> Option<JClass> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_method_declaring_class }?;
        let mut class = std::ptr::null_mut();
        // SAFETY: as above.
        let err = unsafe { f(self.0, method, &mut class) };
        (err == JVMTI_ERROR_NONE && !class.is_null()).then_some(class)
    }

    /// The method's line table; None when it has none.
    pub fn line_number_table(&self, method: JMethodId) -> Option<LineTable<'_>> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_line_number_table }?;
        let mut count = 0;
        let mut table = std::ptr::null_mut();
        // SAFETY: as above.
        let err = unsafe { f(self.0, method, &mut count, &mut table) };
        if table.is_null() {
            return None;
        }
        let table = LineTable {
            jvmti: self,
            ptr: table,
            len: usize::try_from(count).unwrap_or(0),
        };
        (err == JVMTI_ERROR_NONE).then_some(table)
    }

    /// A VM system property (`GetSystemProperty`: OnLoad and live phases). Only what the VM
    /// itself sets is there, e.g. `java.vm.specification.version` and `java.vm.version`, not
    /// what the class library adds later (`java.version`).
    pub fn system_property(&self, name: &std::ffi::CStr) -> Option<String> {
        // SAFETY: as in `set_event_mode`.
        let f = unsafe { (**self.0).get_system_property }?;
        let mut value = std::ptr::null_mut();
        // SAFETY: live env, NUL-terminated name, out-pointer.
        let err = unsafe { f(self.0, name.as_ptr(), &mut value) };
        let value = self.string(value)?;
        (err == JVMTI_ERROR_NONE).then(|| String::from_utf8_lossy(value.bytes()).into_owned())
    }

    /// Gives the environment back (`DisposeEnvironment`), with its capabilities: for an agent
    /// that failed before installing any callback.
    pub fn dispose(&self) -> JvmtiError {
        // SAFETY: as in `set_event_mode`.
        match unsafe { (**self.0).dispose_environment } {
            // SAFETY: live env, not used afterwards by the caller.
            Some(f) => unsafe { f(self.0) },
            None => MISSING,
        }
    }

    pub fn set_event_callbacks(&self, callbacks: &EventCallbacks) -> JvmtiError {
        // SAFETY: as in `set_event_mode`.
        match unsafe { (**self.0).set_event_callbacks } {
            // SAFETY: JVMTI copies the callbacks; the size is that of our prefix.
            Some(f) => unsafe { f(self.0, callbacks, size_of::<EventCallbacks>() as JInt) },
            None => MISSING,
        }
    }

    /// Sets the mean bytes between two sampled allocations of a thread. Only for a JVM that
    /// granted [`CAN_GENERATE_SAMPLED_OBJECT_ALLOC_EVENTS`]: older tables end before it.
    pub fn set_heap_sampling_interval(&self, bytes: JInt) -> JvmtiError {
        // SAFETY: as in `set_event_mode`; the capability proves the table reaches position 156.
        match unsafe { (**self.0).set_heap_sampling_interval } {
            // SAFETY: live env.
            Some(f) => unsafe { f(self.0, bytes) },
            None => MISSING,
        }
    }

    pub fn generate_events(&self, event: JInt) -> JvmtiError {
        // SAFETY: as in `set_event_mode`.
        match unsafe { (**self.0).generate_events } {
            // SAFETY: live env, called from an attached thread in the live phase.
            Some(f) => unsafe { f(self.0, event) },
            None => MISSING,
        }
    }

    pub fn add_capabilities(&self, caps: &Capabilities) -> JvmtiError {
        // SAFETY: as in `set_event_mode`.
        match unsafe { (**self.0).add_capabilities } {
            // SAFETY: live env, valid capabilities struct.
            Some(f) => unsafe { f(self.0, caps) },
            None => MISSING,
        }
    }
}

/// The `JavaVM` invocation interface.
pub struct Vm(pub *mut JavaVm);

// SAFETY: the JavaVM pointer is valid process-wide for the VM's lifetime.
unsafe impl Send for Vm {}
// SAFETY: as above.
unsafe impl Sync for Vm {}

impl Vm {
    /// The invocation interface as of JNI 1.4 (GetEnv is 1.2, AttachCurrentThreadAsDaemon 1.4;
    /// every JVM the agent runs on has both).
    fn functions(&self) -> &jni_sys::JNIInvokeInterface__1_4 {
        // SAFETY: the JVM passes a valid `JavaVM*`, whose table lives as long as the VM.
        unsafe { &(**self.0).v1_4 }
    }

    pub fn jvmti_env(&self) -> Option<Jvmti> {
        let mut env = std::ptr::null_mut();
        // SAFETY: valid VM pointer and out-pointer.
        let rc = unsafe { (self.functions().GetEnv)(self.0, &mut env, JVMTI_VERSION_1_2) };
        (rc == JNI_OK && !env.is_null()).then(|| Jvmti(env.cast()))
    }

    /// Attaches the calling native thread as a daemon thread named `name`; its JNI
    /// environment, valid on this thread only.
    pub fn attach_current_thread_as_daemon(&self, name: &std::ffi::CStr) -> Option<Jni> {
        let mut args = jni_sys::JavaVMAttachArgs {
            version: JNI_VERSION_1_8,
            // The VM only reads the name.
            name: name.as_ptr().cast_mut(),
            group: std::ptr::null_mut(),
        };
        let mut env = std::ptr::null_mut();
        // SAFETY: valid VM pointer, out-pointer and args.
        let rc = unsafe {
            (self.functions().AttachCurrentThreadAsDaemon)(self.0, &mut env, (&raw mut args).cast())
        };
        (rc == JNI_OK && !env.is_null()).then(|| Jni(env.cast()))
    }
}

/// A JNI environment: only used on the thread it belongs to (not `Send`).
pub struct Jni(*mut JniEnv);

impl Jni {
    /// The function table as of JNI 1.2, which has every function used here (the thread was
    /// attached asking for JNI 1.8).
    fn functions(&self) -> &jni_sys::JNINativeInterface__1_2 {
        // SAFETY: this thread's live JNIEnv, whose table lives as long as the VM.
        unsafe { &(**self.0).v1_2 }
    }

    /// Clears a pending exception, if any (a failed lookup throws one).
    fn clear_exception(&self) {
        let functions = self.functions();
        // SAFETY: live env of this thread.
        if unsafe { (functions.ExceptionCheck)(self.0) } {
            // SAFETY: as above.
            unsafe { (functions.ExceptionClear)(self.0) };
        }
    }

    /// Opens a frame for at least `capacity` local references; false if the JVM could not
    /// (then nothing is to be popped).
    pub fn push_local_frame(&self, capacity: JInt) -> bool {
        // SAFETY: live env of this thread.
        let ok = unsafe { (self.functions().PushLocalFrame)(self.0, capacity) } == JNI_OK;
        if !ok {
            self.clear_exception();
        }
        ok
    }

    /// Frees every local reference made since the matching [`Self::push_local_frame`].
    pub fn pop_local_frame(&self) {
        // SAFETY: live env of this thread, a frame pushed by it; no result kept.
        unsafe { (self.functions().PopLocalFrame)(self.0, std::ptr::null_mut()) };
    }

    pub fn delete_local_ref(&self, object: JObject) {
        if object.is_null() {
            return;
        }
        // SAFETY: live env of this thread, a local reference of it.
        unsafe { (self.functions().DeleteLocalRef)(self.0, object) };
    }

    /// The class `name` (JVM form, e.g. `java/lang/Thread`) as a local reference; None (and no
    /// pending exception) if it cannot be found.
    pub fn find_class(&self, name: &std::ffi::CStr) -> Option<JClass> {
        // SAFETY: live env of this thread, NUL-terminated name.
        let class = unsafe { (self.functions().FindClass)(self.0, name.as_ptr()) };
        if class.is_null() {
            self.clear_exception();
            return None;
        }
        Some(class)
    }

    /// The instance field `name` of type `signature` of `class`; None (and no pending
    /// exception: `NoSuchFieldError` is cleared) if it has none.
    pub fn field_id(
        &self,
        class: JClass,
        name: &std::ffi::CStr,
        signature: &std::ffi::CStr,
    ) -> Option<JFieldId> {
        // SAFETY: live env of this thread, a class reference, NUL-terminated strings.
        let field = unsafe {
            (self.functions().GetFieldID)(self.0, class, name.as_ptr(), signature.as_ptr())
        };
        if field.is_null() {
            self.clear_exception();
            return None;
        }
        Some(field)
    }

    /// The `long` field `field` of `object`.
    ///
    /// # Safety
    /// `field` must be a `long` instance field ID of `object`'s class (or a superclass).
    pub unsafe fn long_field(&self, object: JObject, field: JFieldId) -> Option<JLong> {
        // SAFETY: live env of this thread; the caller vouches for object and field.
        Some(unsafe { (self.functions().GetLongField)(self.0, object, field) })
    }
}
