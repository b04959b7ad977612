//! The few JNI and JVMTI entry points the agent uses, declared by hand.
//!
//! Function-table slots and struct layouts are those of `jni.h`, `jvmti.h` (JVMTI 1.2, stable
//! since JDK 6) and `jvmticmlr.h`. JVMTI slots are given 1-based, as the specification numbers
//! them.

use std::ffi::{c_char, c_void};

pub type JInt = i32;
pub type JLong = i64;
pub type JMethodId = *mut c_void;
pub type JClass = *mut c_void;
pub type JThread = *mut c_void;
pub type JObject = *mut c_void;
pub type JFieldId = *mut c_void;
pub type JvmtiError = u32;

pub const JNI_OK: JInt = 0;
pub const JNI_VERSION_1_8: JInt = 0x0001_0008;
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

/// `jvmtiCapabilities`: 128 bits, filled from the least significant bit of the first word.
#[repr(C)]
#[derive(Default)]
pub struct Capabilities {
    pub bits: [u32; 4],
}

pub const CAN_GET_SOURCE_FILE_NAME: u32 = 1 << 11;
pub const CAN_GET_LINE_NUMBERS: u32 = 1 << 12;
pub const CAN_GENERATE_COMPILED_METHOD_LOAD_EVENTS: u32 = 1 << 27;

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

/// `jvmtiEnv` / `JavaVM`: a pointer to a function table.
#[repr(C)]
pub struct JvmtiEnv {
    pub functions: *const *const c_void,
}

#[repr(C)]
pub struct JavaVm {
    pub functions: *const *const c_void,
}

/// `jvmtiThreadInfo`. `thread_group` and `context_class_loader` are JNI local references, freed
/// when the event callback that asked for them returns.
#[repr(C)]
pub struct ThreadInfo {
    pub name: *mut c_char,
    pub priority: JInt,
    pub is_daemon: u8,
    pub thread_group: *mut c_void,
    pub context_class_loader: *mut c_void,
}

/// `JavaVMAttachArgs`.
#[repr(C)]
pub struct AttachArgs {
    pub version: JInt,
    pub name: *const c_char,
    pub group: *mut c_void,
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

/// The head of `jvmtiEventCallbacks` up to DynamicCodeGenerated (event 70); slot `i` is event
/// `50 + i`. JVMTI accepts a prefix of the struct (`size_of_callbacks`).
#[repr(C)]
pub struct EventCallbacks {
    pub slots: [*const c_void; 21],
}

impl EventCallbacks {
    pub fn new() -> Self {
        Self {
            slots: [std::ptr::null(); 21],
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

/// Typed access to the JVMTI function table.
pub struct Jvmti(pub *mut JvmtiEnv);

// SAFETY: a jvmtiEnv may be used from any thread attached to the VM (JVMTI specification).
unsafe impl Send for Jvmti {}
// SAFETY: as above.
unsafe impl Sync for Jvmti {}

macro_rules! slot {
    ($env:expr, $n:expr, $ty:ty) => {{
        // SAFETY: the caller holds a live jvmtiEnv whose table has at least 155 slots; slot $n
        // has type $ty per jvmti.h.
        let f = unsafe { *(*$env).functions.add($n - 1) };
        if f.is_null() {
            None
        } else {
            // SAFETY: non-null function pointer of the documented type.
            Some(unsafe { std::mem::transmute::<*const c_void, $ty>(f) })
        }
    }};
}

type SetEventNotificationModeFn =
    unsafe extern "C" fn(*mut JvmtiEnv, JInt, JInt, JThread, ...) -> JvmtiError;
type DeallocateFn = unsafe extern "C" fn(*mut JvmtiEnv, *mut u8) -> JvmtiError;
type GetClassSignatureFn =
    unsafe extern "C" fn(*mut JvmtiEnv, JClass, *mut *mut c_char, *mut *mut c_char) -> JvmtiError;
type GetSourceFileNameFn =
    unsafe extern "C" fn(*mut JvmtiEnv, JClass, *mut *mut c_char) -> JvmtiError;
type GetMethodNameFn = unsafe extern "C" fn(
    *mut JvmtiEnv,
    JMethodId,
    *mut *mut c_char,
    *mut *mut c_char,
    *mut *mut c_char,
) -> JvmtiError;
type GetMethodDeclaringClassFn =
    unsafe extern "C" fn(*mut JvmtiEnv, JMethodId, *mut JClass) -> JvmtiError;
type GetLineNumberTableFn = unsafe extern "C" fn(
    *mut JvmtiEnv,
    JMethodId,
    *mut JInt,
    *mut *mut LineNumberEntry,
) -> JvmtiError;
type GetSystemPropertyFn =
    unsafe extern "C" fn(*mut JvmtiEnv, *const c_char, *mut *mut c_char) -> JvmtiError;
type DisposeEnvironmentFn = unsafe extern "C" fn(*mut JvmtiEnv) -> JvmtiError;
type SetEventCallbacksFn =
    unsafe extern "C" fn(*mut JvmtiEnv, *const EventCallbacks, JInt) -> JvmtiError;
type GenerateEventsFn = unsafe extern "C" fn(*mut JvmtiEnv, JInt) -> JvmtiError;
type GetThreadInfoFn = unsafe extern "C" fn(*mut JvmtiEnv, JThread, *mut ThreadInfo) -> JvmtiError;
type AddCapabilitiesFn = unsafe extern "C" fn(*mut JvmtiEnv, *const Capabilities) -> JvmtiError;
type GetAllThreadsFn =
    unsafe extern "C" fn(*mut JvmtiEnv, *mut JInt, *mut *mut JThread) -> JvmtiError;

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
        match slot!(self.0, 2, SetEventNotificationModeFn) {
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
        if let Some(f) = slot!(self.0, 47, DeallocateFn) {
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
        let f = slot!(self.0, 9, GetThreadInfoFn)?;
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
        let f = slot!(self.0, 4, GetAllThreadsFn)?;
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
        let f = slot!(self.0, 48, GetClassSignatureFn)?;
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
        let f = slot!(self.0, 50, GetSourceFileNameFn)?;
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
        let f = slot!(self.0, 64, GetMethodNameFn)?;
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
        let f = slot!(self.0, 65, GetMethodDeclaringClassFn)?;
        let mut class = std::ptr::null_mut();
        // SAFETY: as above.
        let err = unsafe { f(self.0, method, &mut class) };
        (err == JVMTI_ERROR_NONE && !class.is_null()).then_some(class)
    }

    /// The method's line table; None when it has none.
    pub fn line_number_table(&self, method: JMethodId) -> Option<LineTable<'_>> {
        let f = slot!(self.0, 70, GetLineNumberTableFn)?;
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
        let f = slot!(self.0, 131, GetSystemPropertyFn)?;
        let mut value = std::ptr::null_mut();
        // SAFETY: live env, NUL-terminated name, out-pointer.
        let err = unsafe { f(self.0, name.as_ptr(), &mut value) };
        let value = self.string(value)?;
        (err == JVMTI_ERROR_NONE).then(|| String::from_utf8_lossy(value.bytes()).into_owned())
    }

    /// Gives the environment back (`DisposeEnvironment`), with its capabilities: for an agent
    /// that failed before installing any callback.
    pub fn dispose(&self) -> JvmtiError {
        match slot!(self.0, 127, DisposeEnvironmentFn) {
            // SAFETY: live env, not used afterwards by the caller.
            Some(f) => unsafe { f(self.0) },
            None => MISSING,
        }
    }

    pub fn set_event_callbacks(&self, callbacks: &EventCallbacks) -> JvmtiError {
        match slot!(self.0, 122, SetEventCallbacksFn) {
            // SAFETY: JVMTI copies the callbacks; the size is that of our prefix.
            Some(f) => unsafe {
                f(
                    self.0,
                    callbacks,
                    std::mem::size_of::<EventCallbacks>() as JInt,
                )
            },
            None => MISSING,
        }
    }

    pub fn generate_events(&self, event: JInt) -> JvmtiError {
        match slot!(self.0, 123, GenerateEventsFn) {
            // SAFETY: live env, called from an attached thread in the live phase.
            Some(f) => unsafe { f(self.0, event) },
            None => MISSING,
        }
    }

    pub fn add_capabilities(&self, caps: &Capabilities) -> JvmtiError {
        match slot!(self.0, 142, AddCapabilitiesFn) {
            // SAFETY: live env, valid capabilities struct.
            Some(f) => unsafe { f(self.0, caps) },
            None => MISSING,
        }
    }
}

type GetEnvFn = unsafe extern "C" fn(*mut JavaVm, *mut *mut c_void, JInt) -> JInt;
type AttachFn = unsafe extern "C" fn(*mut JavaVm, *mut *mut c_void, *mut AttachArgs) -> JInt;

/// `JavaVM` invocation interface (0-based slots: GetEnv 6, AttachCurrentThreadAsDaemon 7).
pub struct Vm(pub *mut JavaVm);

// SAFETY: the JavaVM pointer is valid process-wide for the VM's lifetime.
unsafe impl Send for Vm {}
// SAFETY: as above.
unsafe impl Sync for Vm {}

impl Vm {
    fn function(&self, index: usize) -> *const c_void {
        // SAFETY: the invocation interface has 8 slots.
        unsafe { *(*self.0).functions.add(index) }
    }

    pub fn jvmti_env(&self) -> Option<Jvmti> {
        let f = self.function(6);
        if f.is_null() {
            return None;
        }
        // SAFETY: slot 6 is GetEnv.
        let f: GetEnvFn = unsafe { std::mem::transmute::<*const c_void, GetEnvFn>(f) };
        let mut env = std::ptr::null_mut();
        // SAFETY: valid VM pointer and out-pointer.
        let rc = unsafe { f(self.0, &mut env, JVMTI_VERSION_1_2) };
        (rc == JNI_OK && !env.is_null()).then(|| Jvmti(env.cast()))
    }

    /// Attaches the calling native thread as a daemon thread named `name`; its JNI
    /// environment, valid on this thread only.
    pub fn attach_current_thread_as_daemon(&self, name: &std::ffi::CStr) -> Option<Jni> {
        let f = self.function(7);
        if f.is_null() {
            return None;
        }
        // SAFETY: slot 7 is AttachCurrentThreadAsDaemon.
        let f: AttachFn = unsafe { std::mem::transmute::<*const c_void, AttachFn>(f) };
        let mut args = AttachArgs {
            version: JNI_VERSION_1_8,
            name: name.as_ptr(),
            group: std::ptr::null_mut(),
        };
        let mut env = std::ptr::null_mut();
        // SAFETY: valid VM pointer, out-pointer and args.
        let rc = unsafe { f(self.0, &mut env, &mut args) };
        (rc == JNI_OK && !env.is_null()).then(|| Jni(env.cast()))
    }
}

/// `JNIEnv`: a pointer to a function table (0-based slots, as `jni.h` lists them).
#[repr(C)]
pub struct JniEnv {
    pub functions: *const *const c_void,
}

type FindClassFn = unsafe extern "C" fn(*mut JniEnv, *const c_char) -> JClass;
type ExceptionClearFn = unsafe extern "C" fn(*mut JniEnv);
type PushLocalFrameFn = unsafe extern "C" fn(*mut JniEnv, JInt) -> JInt;
type PopLocalFrameFn = unsafe extern "C" fn(*mut JniEnv, JObject) -> JObject;
type DeleteLocalRefFn = unsafe extern "C" fn(*mut JniEnv, JObject);
type GetFieldIdFn =
    unsafe extern "C" fn(*mut JniEnv, JClass, *const c_char, *const c_char) -> JFieldId;
type GetLongFieldFn = unsafe extern "C" fn(*mut JniEnv, JObject, JFieldId) -> JLong;
type ExceptionCheckFn = unsafe extern "C" fn(*mut JniEnv) -> u8;

/// A JNI environment: only used on the thread it belongs to (not `Send`).
pub struct Jni(*mut JniEnv);

macro_rules! jni_slot {
    ($env:expr, $n:expr, $ty:ty) => {{
        // SAFETY: the caller holds its own thread's live JNIEnv, whose table (JNI 1.8) has
        // more than 229 slots; slot $n has type $ty per jni.h.
        let f = unsafe { *(*$env).functions.add($n) };
        if f.is_null() {
            None
        } else {
            // SAFETY: non-null function pointer of the documented type.
            Some(unsafe { std::mem::transmute::<*const c_void, $ty>(f) })
        }
    }};
}

impl Jni {
    /// Clears a pending exception, if any (a failed lookup throws one).
    fn clear_exception(&self) {
        let pending = jni_slot!(self.0, 228, ExceptionCheckFn)
            // SAFETY: live env of this thread.
            .is_some_and(|f| unsafe { f(self.0) } != 0);
        if pending {
            if let Some(f) = jni_slot!(self.0, 17, ExceptionClearFn) {
                // SAFETY: as above.
                unsafe { f(self.0) };
            }
        }
    }

    /// Opens a frame for at least `capacity` local references; false if the JVM could not
    /// (then nothing is to be popped).
    pub fn push_local_frame(&self, capacity: JInt) -> bool {
        let Some(f) = jni_slot!(self.0, 19, PushLocalFrameFn) else {
            return false;
        };
        // SAFETY: live env of this thread.
        let ok = unsafe { f(self.0, capacity) } == JNI_OK;
        if !ok {
            self.clear_exception();
        }
        ok
    }

    /// Frees every local reference made since the matching [`Self::push_local_frame`].
    pub fn pop_local_frame(&self) {
        if let Some(f) = jni_slot!(self.0, 20, PopLocalFrameFn) {
            // SAFETY: live env of this thread, a frame pushed by it; no result kept.
            unsafe { f(self.0, std::ptr::null_mut()) };
        }
    }

    pub fn delete_local_ref(&self, object: JObject) {
        if object.is_null() {
            return;
        }
        if let Some(f) = jni_slot!(self.0, 23, DeleteLocalRefFn) {
            // SAFETY: live env of this thread, a local reference of it.
            unsafe { f(self.0, object) };
        }
    }

    /// The class `name` (JVM form, e.g. `java/lang/Thread`) as a local reference; None (and no
    /// pending exception) if it cannot be found.
    pub fn find_class(&self, name: &std::ffi::CStr) -> Option<JClass> {
        let f = jni_slot!(self.0, 6, FindClassFn)?;
        // SAFETY: live env of this thread, NUL-terminated name.
        let class = unsafe { f(self.0, name.as_ptr()) };
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
        let f = jni_slot!(self.0, 94, GetFieldIdFn)?;
        // SAFETY: live env of this thread, a class reference, NUL-terminated strings.
        let field = unsafe { f(self.0, class, name.as_ptr(), signature.as_ptr()) };
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
        let f = jni_slot!(self.0, 101, GetLongFieldFn)?;
        // SAFETY: live env of this thread; the caller vouches for object and field.
        Some(unsafe { f(self.0, object, field) })
    }
}
