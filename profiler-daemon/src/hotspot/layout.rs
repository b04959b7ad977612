//! The per-JVM layout: every VMStructs field, type size and constant the unwinder and the
//! symbolizer use, found by name with alternates for renamed fields (feature detection, not
//! version tables).
//!
//! Handled layout changes (see docs in the repository's notes): `GenericGrowableArray` renamed
//! `GrowableArrayBase` (JDK 17); CodeBlob's `_code_begin` pointer replaced by a `_code_offset`
//! int (JDK 23+); `CompiledMethod` fields moved into `nmethod` (JDK 23+); scopes in immutable
//! data (JDK 23+); `Symbol::_length` vs `_length_and_refcount`; `ConstMethod::_flags` becoming
//! `ConstMethod::_flags._flags`; the source file index moving from `InstanceKlass` to
//! `ConstantPool` (JDK 15+); `_osthread` moving from `JavaThread` to `Thread` (JDK 25); the
//! thread list moving to `ThreadsSMRSupport` (JDK 10+).
//!
//! Not exported by VMStructs, hence fixed here per architecture (x86_64): the interpreter frame
//! slots of Method* (fp - 3 words) and bcp (fp - 8 words from JDK 9, - 7 before), and whether
//! UNSIGNED5 streams exclude the zero byte (JDK 20+).

use std::collections::BTreeMap;

use serde::Serialize;

use super::vmstructs::VmStructs;

/// A wanted field: the field it is, and the VMStructs names it may have, newest first.
struct WantedField {
    field: Field,
    names: &'static [&'static str],
    required: bool,
}

/// Declares [`Field`] (one variant per wanted field, with its key: the name jvm-info shows) and
/// `FIELDS`, the table `JvmLayout::from_vmstructs` resolves, from one list.
macro_rules! wanted_fields {
    ($($variant:ident = $key:literal, $need:ident, [$($name:literal),+ $(,)?];)*) => {
        /// A field of the layout, by the name the rest of the daemon uses.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Field {
            $($variant,)*
        }

        impl Field {
            /// Its key, e.g. `"CodeBlob::_code_offset"`.
            pub const fn key(self) -> &'static str {
                match self {
                    $(Self::$variant => $key,)*
                }
            }
        }

        const FIELDS: &[WantedField] = &[
            $(WantedField {
                field: Field::$variant,
                names: &[$($name),+],
                required: wanted_fields!(@required $need),
            },)*
        ];
    };
    (@required required) => { true };
    (@required optional) => { false };
}

// Fields, by the name the rest of the daemon uses: `Variant = "key", required or optional,
// [VMStructs names, newest first]`. The variants are `Field`s, so a field is asked for by a name
// the compiler checks.
wanted_fields! {
    // Code cache: where JIT code is, and its segment maps.
    // Segmented code cache (JDK 9+): an array of heaps and the bounds of all of them.
    CodeCacheHeaps = "CodeCache::_heaps", optional, ["CodeCache::_heaps"];
    CodeCacheLowBound = "CodeCache::_low_bound", optional, ["CodeCache::_low_bound"];
    CodeCacheHighBound = "CodeCache::_high_bound", optional, ["CodeCache::_high_bound"];
    GrowableArrayLen = "GrowableArray::_len", optional, ["GrowableArrayBase::_len", "GenericGrowableArray::_len"];
    GrowableArrayData = "GrowableArray::_data", optional, ["GrowableArray<int>::_data"];
    // JDK 8: one heap, whose reserved range is the code cache's bounds.
    CodeCacheHeap = "CodeCache::_heap", optional, ["CodeCache::_heap"];
    CodeHeapMemory = "CodeHeap::_memory", required, ["CodeHeap::_memory"];
    CodeHeapSegmap = "CodeHeap::_segmap", required, ["CodeHeap::_segmap"];
    CodeHeapLog2SegmentSize = "CodeHeap::_log2_segment_size", required, ["CodeHeap::_log2_segment_size"];
    VirtualSpaceLowBoundary = "VirtualSpace::_low_boundary", required, ["VirtualSpace::_low_boundary"];
    VirtualSpaceHighBoundary = "VirtualSpace::_high_boundary", required, ["VirtualSpace::_high_boundary"];
    VirtualSpaceLow = "VirtualSpace::_low", required, ["VirtualSpace::_low"];
    VirtualSpaceHigh = "VirtualSpace::_high", required, ["VirtualSpace::_high"];
    HeapBlockLength = "HeapBlock::_length", required, ["HeapBlock::Header::_length"];
    HeapBlockUsed = "HeapBlock::_used", required, ["HeapBlock::Header::_used"];
    // CodeBlob and nmethod: frame sizes for the unwinder, debug info for the symbolizer.
    CodeBlobName = "CodeBlob::_name", required, ["CodeBlob::_name"];
    CodeBlobSize = "CodeBlob::_size", required, ["CodeBlob::_size"];
    CodeBlobHeaderSize = "CodeBlob::_header_size", required, ["CodeBlob::_header_size"];
    CodeBlobFrameCompleteOffset = "CodeBlob::_frame_complete_offset", required, ["CodeBlob::_frame_complete_offset"];
    CodeBlobDataOffset = "CodeBlob::_data_offset", required, ["CodeBlob::_data_offset"];
    CodeBlobFrameSize = "CodeBlob::_frame_size", required, ["CodeBlob::_frame_size"];
    CodeBlobCodeBegin = "CodeBlob::_code_begin", optional, ["CodeBlob::_code_begin"];
    CodeBlobCodeOffset = "CodeBlob::_code_offset", optional, ["CodeBlob::_code_offset"];
    CodeBlobKind = "CodeBlob::_kind", optional, ["CodeBlob::_kind"];
    CodeBlobMutableData = "CodeBlob::_mutable_data", optional, ["CodeBlob::_mutable_data"];
    CodeBlobRelocationSize = "CodeBlob::_relocation_size", optional, ["CodeBlob::_relocation_size"];
    NmethodMethod = "nmethod::_method", required, ["nmethod::_method", "CompiledMethod::_method"];
    NmethodCompileId = "nmethod::_compile_id", required, ["nmethod::_compile_id"];
    NmethodCompLevel = "nmethod::_comp_level", required, ["nmethod::_comp_level"];
    NmethodOrigPcOffset = "nmethod::_orig_pc_offset", required, ["nmethod::_orig_pc_offset"];
    NmethodScopesPcsOffset = "nmethod::_scopes_pcs_offset", required, ["nmethod::_scopes_pcs_offset"];
    NmethodScopesDataBegin = "nmethod::_scopes_data_begin", optional, ["CompiledMethod::_scopes_data_begin"];
    NmethodScopesDataOffset = "nmethod::_scopes_data_offset", optional, ["nmethod::_scopes_data_offset"];
    NmethodImmutableData = "nmethod::_immutable_data", optional, ["nmethod::_immutable_data"];
    // Up to JDK 19, an unloaded nmethod stays in the code heap (state 3 or 4) after its
    // classes' metadata is freed.
    NmethodState = "nmethod::_state", optional, ["nmethod::_state"];
    NmethodImmutableDataSize = "nmethod::_immutable_data_size", optional, ["nmethod::_immutable_data_size"];
    CodeBlobMutableDataSize = "CodeBlob::_mutable_data_size", optional, ["CodeBlob::_mutable_data_size"];
    NmethodMetadataOffset = "nmethod::_metadata_offset", optional, ["nmethod::_metadata_offset"];
    NmethodDependenciesOffset = "nmethod::_dependencies_offset", optional, ["nmethod::_dependencies_offset"];
    NmethodDeoptHandlerBegin = "nmethod::_deopt_handler_begin", optional, ["CompiledMethod::_deopt_handler_begin"];
    NmethodDeoptHandlerOffset = "nmethod::_deopt_handler_offset", optional, ["nmethod::_deopt_handler_entry_offset", "nmethod::_deopt_handler_offset", "nmethod::_deoptimize_offset"];
    NmethodVerifiedEntryPoint = "nmethod::_verified_entry_point", optional, ["nmethod::_verified_entry_point"];
    NmethodVerifiedEntryOffset = "nmethod::_verified_entry_offset", optional, ["nmethod::_verified_entry_offset"];
    // Method metadata: names, lines.
    MethodConstMethod = "Method::_constMethod", required, ["Method::_constMethod"];
    MethodCode = "Method::_code", required, ["Method::_code"];
    ConstMethodConstants = "ConstMethod::_constants", required, ["ConstMethod::_constants"];
    ConstMethodFlags = "ConstMethod::_flags", required, ["ConstMethod::_flags._flags", "ConstMethod::_flags"];
    ConstMethodCodeSize = "ConstMethod::_code_size", required, ["ConstMethod::_code_size"];
    ConstMethodNameIndex = "ConstMethod::_name_index", required, ["ConstMethod::_name_index"];
    ConstMethodSignatureIndex = "ConstMethod::_signature_index", required, ["ConstMethod::_signature_index"];
    ConstMethodMethodIdnum = "ConstMethod::_method_idnum", required, ["ConstMethod::_method_idnum"];
    ConstantPoolPoolHolder = "ConstantPool::_pool_holder", required, ["ConstantPool::_pool_holder"];
    ConstantPoolSourceFileNameIndex = "ConstantPool::_source_file_name_index", optional, ["ConstantPool::_source_file_name_index"];
    InstanceKlassSourceFileNameIndex = "InstanceKlass::_source_file_name_index", optional, ["InstanceKlass::_source_file_name_index"];
    InstanceKlassConstants = "InstanceKlass::_constants", required, ["InstanceKlass::_constants"];
    InstanceKlassMethods = "InstanceKlass::_methods", required, ["InstanceKlass::_methods"];
    KlassName = "Klass::_name", required, ["Klass::_name"];
    SymbolLength = "Symbol::_length", optional, ["Symbol::_length"];
    SymbolLengthAndRefcount = "Symbol::_length_and_refcount", optional, ["Symbol::_length_and_refcount"];
    SymbolBody = "Symbol::_body", required, ["Symbol::_body"];
    // Threads: the last Java frame of threads in native or VM code.
    JavaThreadAnchor = "JavaThread::_anchor", required, ["JavaThread::_anchor"];
    // The innermost mounted continuation's entry frame (JDK 25+ export it; not JDK 21).
    JavaThreadContEntry = "JavaThread::_cont_entry", optional, ["JavaThread::_cont_entry"];
    // The thread object current on a thread (a mounted virtual thread), and its own (JDK 19+).
    JavaThreadVthread = "JavaThread::_vthread", optional, ["JavaThread::_vthread"];
    JavaThreadThreadObj = "JavaThread::_threadObj", optional, ["JavaThread::_threadObj"];
    JavaThreadThreadState = "JavaThread::_thread_state", required, ["JavaThread::_thread_state"];
    // What a blocked thread waits for: a monitor's entry, or `Object.wait` (lock profiles).
    JavaThreadCurrentPendingMonitor = "JavaThread::_current_pending_monitor", optional, ["JavaThread::_current_pending_monitor", "Thread::_current_pending_monitor"];
    JavaThreadCurrentWaitingMonitor = "JavaThread::_current_waiting_monitor", optional, ["JavaThread::_current_waiting_monitor", "Thread::_current_waiting_monitor"];
    // What a thread allocated (allocation samples' weights).
    ThreadAllocatedBytes = "Thread::_allocated_bytes", optional, ["Thread::_allocated_bytes", "JavaThread::_allocated_bytes"];
    // A thread's current TLAB, whose used part `_allocated_bytes` counts only when it is retired
    // (the allocation profiles' scale, `alloc_scale`).
    ThreadTlab = "Thread::_tlab", optional, ["Thread::_tlab", "JavaThread::_tlab"];
    TlabStart = "ThreadLocalAllocBuffer::_start", optional, ["ThreadLocalAllocBuffer::_start"];
    TlabTop = "ThreadLocalAllocBuffer::_top", optional, ["ThreadLocalAllocBuffer::_top"];
    // Where a `java.lang.Class` object holds its `Klass*` (a static int: the offset is its value).
    JavaLangClassKlassOffset = "java_lang_Class::_klass_offset", optional, ["java_lang_Class::_klass_offset"];
    ThreadOsthread = "Thread::_osthread", required, ["Thread::_osthread", "JavaThread::_osthread"];
    OSThreadThreadId = "OSThread::_thread_id", required, ["OSThread::_thread_id"];
    JavaFrameAnchorLastJavaSp = "JavaFrameAnchor::_last_Java_sp", required, ["JavaFrameAnchor::_last_Java_sp"];
    JavaFrameAnchorLastJavaPc = "JavaFrameAnchor::_last_Java_pc", required, ["JavaFrameAnchor::_last_Java_pc"];
    JavaFrameAnchorLastJavaFp = "JavaFrameAnchor::_last_Java_fp", optional, ["JavaFrameAnchor::_last_Java_fp"];
    JavaCallWrapperAnchor = "JavaCallWrapper::_anchor", required, ["JavaCallWrapper::_anchor"];
    ThreadsSMRSupportJavaThreadList = "ThreadsSMRSupport::_java_thread_list", optional, ["ThreadsSMRSupport::_java_thread_list"];
    ThreadsListLength = "ThreadsList::_length", optional, ["ThreadsList::_length"];
    ThreadsListThreads = "ThreadsList::_threads", optional, ["ThreadsList::_threads"];
    ThreadsThreadList = "Threads::_thread_list", optional, ["Threads::_thread_list"];
    JavaThreadNext = "JavaThread::_next", optional, ["JavaThread::_next"];
    // The interpreter's code and the call stub: where Java frames start and end.
    AbstractInterpreterCode = "AbstractInterpreter::_code", required, ["AbstractInterpreter::_code"];
    StubQueueStubBuffer = "StubQueue::_stub_buffer", required, ["StubQueue::_stub_buffer"];
    StubQueueBufferLimit = "StubQueue::_buffer_limit", required, ["StubQueue::_buffer_limit"];
    StubRoutinesCallStubReturnAddress = "StubRoutines::_call_stub_return_address", required, ["StubRoutines::_call_stub_return_address"];
    // Compiled-code debug info.
    PcDescPcOffset = "PcDesc::_pc_offset", required, ["PcDesc::_pc_offset"];
    PcDescScopeDecodeOffset = "PcDesc::_scope_decode_offset", required, ["PcDesc::_scope_decode_offset"];
    // Version.
    VmRelease = "Abstract_VM_Version::_s_vm_release", required, ["Abstract_VM_Version::_s_vm_release"];
    VmMajorVersion = "Abstract_VM_Version::_vm_major_version", required, ["Abstract_VM_Version::_vm_major_version"];
    VmMinorVersion = "Abstract_VM_Version::_vm_minor_version", required, ["Abstract_VM_Version::_vm_minor_version"];
    // Absent in JDK 8, whose major and minor are HotSpot's own (25 and the update).
    VmSecurityVersion = "Abstract_VM_Version::_vm_security_version", optional, ["Abstract_VM_Version::_vm_security_version"];
}

/// The fields a segmented code cache (JDK 9+) is read through; without them, JDK 8's single
/// `CodeCache::_heap`.
const SEGMENTED_CODE_CACHE: [Field; 5] = [
    Field::CodeCacheHeaps,
    Field::CodeCacheLowBound,
    Field::CodeCacheHighBound,
    Field::GrowableArrayLen,
    Field::GrowableArrayData,
];

/// A type whose size the layout holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TypeSize {
    CodeBlob,
    Nmethod,
    Method,
    ConstMethod,
    ConstantPool,
    HeapBlock,
    PcDesc,
}

/// Type sizes: (the type, our name, VMStructs names).
const SIZES: &[(TypeSize, &str, &[&str])] = &[
    (TypeSize::CodeBlob, "CodeBlob", &["CodeBlob"]),
    (TypeSize::Nmethod, "nmethod", &["nmethod"]),
    (TypeSize::Method, "Method", &["Method"]),
    (TypeSize::ConstMethod, "ConstMethod", &["ConstMethod"]),
    (TypeSize::ConstantPool, "ConstantPool", &["ConstantPool"]),
    (TypeSize::HeapBlock, "HeapBlock", &["HeapBlock"]),
    (TypeSize::PcDesc, "PcDesc", &["PcDesc"]),
];

/// An int constant the layout holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Constant {
    EntryFrameCallWrapperOffset,
    InterpreterFrameSenderSpOffset,
    InterpreterFrameLastSpOffset,
    InvocationEntryBci,
    ThreadInNative,
    ThreadInVm,
    ThreadInJava,
    ThreadBlocked,
    HasLinenumberTable,
}

impl Constant {
    /// Its key, e.g. `"_thread_in_native"`.
    pub fn key(self) -> &'static str {
        CONSTANTS
            .iter()
            .find(|(constant, ..)| *constant == self)
            .map_or("?", |(_, key, ..)| key)
    }
}

/// Int constants: (the constant, our name, VMStructs names, the value to use when a build does
/// not export it: x86_64 facts).
const CONSTANTS: &[(Constant, &str, &[&str], Option<i64>)] = &[
    (
        Constant::EntryFrameCallWrapperOffset,
        "frame::entry_frame_call_wrapper_offset",
        &["frame::entry_frame_call_wrapper_offset"],
        Some(-6),
    ),
    (
        Constant::InterpreterFrameSenderSpOffset,
        "frame::interpreter_frame_sender_sp_offset",
        &["frame::interpreter_frame_sender_sp_offset"],
        Some(-1),
    ),
    (
        Constant::InterpreterFrameLastSpOffset,
        "frame::interpreter_frame_last_sp_offset",
        &["frame::interpreter_frame_last_sp_offset"],
        Some(-2),
    ),
    (
        Constant::InvocationEntryBci,
        "InvocationEntryBci",
        &["InvocationEntryBci"],
        Some(-1),
    ),
    (
        Constant::ThreadInNative,
        "_thread_in_native",
        &["_thread_in_native"],
        Some(4),
    ),
    (
        Constant::ThreadInVm,
        "_thread_in_vm",
        &["_thread_in_vm"],
        Some(6),
    ),
    (
        Constant::ThreadInJava,
        "_thread_in_Java",
        &["_thread_in_Java"],
        Some(8),
    ),
    (
        Constant::ThreadBlocked,
        "_thread_blocked",
        &["_thread_blocked"],
        Some(10),
    ),
    (
        Constant::HasLinenumberTable,
        "has_linenumber_table",
        &[
            "ConstMethodFlags::_misc_has_linenumber_table",
            "ConstMethod::_has_linenumber_table",
        ],
        Some(1),
    ),
];

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("VMStructs lacks {key} (looked for {tried})")]
    MissingField { key: &'static str, tried: String },
    #[error("VMStructs lacks the size of {0}")]
    MissingType(&'static str),
    #[error("VMStructs has neither CodeBlob::_code_begin nor CodeBlob::_code_offset")]
    NoCodeStart,
    #[error("VMStructs has neither Symbol::_length nor Symbol::_length_and_refcount")]
    NoSymbolLength,
    #[error("VMStructs has neither CodeCache::_heaps with its bounds and GrowableArray fields nor CodeCache::_heap")]
    NoCodeCache,
}

/// One resolved field.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ResolvedField {
    /// The VMStructs name that matched.
    pub name: String,
    /// Offset in the type, or for statics the address relative to libjvm's load bias.
    pub offset: u64,
    pub is_static: bool,
    pub type_string: Option<String>,
}

/// Everything needed from one JVM's VMStructs (read from each JVM itself, never shared).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JvmLayout {
    pub fields: BTreeMap<&'static str, ResolvedField>,
    pub sizes: BTreeMap<&'static str, u64>,
    pub constants: BTreeMap<&'static str, i64>,
}

impl JvmLayout {
    pub fn from_vmstructs(tables: &VmStructs) -> Result<Self, LayoutError> {
        let mut fields = BTreeMap::new();
        for wanted in FIELDS {
            let found = wanted
                .names
                .iter()
                .find_map(|name| tables.fields.get(*name).map(|f| (name, f)));
            match found {
                Some((name, field)) => {
                    fields.insert(
                        wanted.field.key(),
                        ResolvedField {
                            name: (*name).to_owned(),
                            offset: field.static_offset.unwrap_or(field.offset),
                            is_static: field.static_offset.is_some(),
                            type_string: field.type_string.clone(),
                        },
                    );
                }
                None if wanted.required => {
                    return Err(LayoutError::MissingField {
                        key: wanted.field.key(),
                        tried: wanted.names.join(", "),
                    })
                }
                None => {}
            }
        }
        if !fields.contains_key(Field::CodeBlobCodeBegin.key())
            && !fields.contains_key(Field::CodeBlobCodeOffset.key())
        {
            return Err(LayoutError::NoCodeStart);
        }
        let has = |field: Field| fields.contains_key(field.key());
        if !SEGMENTED_CODE_CACHE.into_iter().all(has) && !has(Field::CodeCacheHeap) {
            return Err(LayoutError::NoCodeCache);
        }
        if !fields.contains_key(Field::SymbolLength.key())
            && !fields.contains_key(Field::SymbolLengthAndRefcount.key())
        {
            return Err(LayoutError::NoSymbolLength);
        }
        let mut sizes = BTreeMap::new();
        for (_, key, names) in SIZES {
            let size = names
                .iter()
                .find_map(|name| tables.type_size(name))
                .ok_or(LayoutError::MissingType(key))?;
            sizes.insert(*key, size);
        }
        let mut constants = BTreeMap::new();
        for (_, key, names, default) in CONSTANTS {
            let value = names
                .iter()
                .find_map(|name| tables.int_constants.get(*name).copied())
                .or(*default);
            if let Some(value) = value {
                constants.insert(*key, value);
            }
        }
        Ok(Self {
            fields,
            sizes,
            constants,
        })
    }

    /// The offset of `field` (for statics, its address relative to libjvm's load bias); `None`
    /// for an optional field this JVM does not have.
    pub fn offset(&self, field: Field) -> Option<u64> {
        self.fields.get(field.key()).map(|f| f.offset)
    }

    /// Whether this JVM has `field` (an optional one may be absent).
    pub fn has(&self, field: Field) -> bool {
        self.fields.contains_key(field.key())
    }

    /// Whether the code cache is segmented (JDK 9+: an array of heaps), else one heap (JDK 8).
    pub fn segmented_code_cache(&self) -> bool {
        SEGMENTED_CODE_CACHE
            .into_iter()
            .all(|field| self.has(field))
    }

    pub fn size(&self, type_size: TypeSize) -> Option<u64> {
        let (_, key, _) = SIZES.iter().find(|(t, ..)| *t == type_size)?;
        self.sizes.get(key).copied()
    }

    pub fn constant(&self, constant: Constant) -> Option<i64> {
        self.constants.get(constant.key()).copied()
    }

    /// Width in bytes of an integer field, from its VMStructs type string.
    pub fn width(&self, field: Field) -> Option<u8> {
        let type_string = self.fields.get(field.key())?.type_string.as_deref()?;
        Some(match type_string {
            "u1" | "uint8_t" | "int8_t" | "bool" | "char" | "jbyte" | "CodeBlobKind" => 1,
            "u2" | "uint16_t" | "int16_t" | "jchar" | "jshort" | "unsigned short" | "short" => 2,
            "u4" | "uint32_t" | "int32_t" | "int" | "jint" | "uint" | "unsigned int" => 4,
            _ => 8,
        })
    }
}

/// The JVM version, read from `Abstract_VM_Version` statics.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct JvmVersion {
    pub major: u32,
    pub minor: u32,
    pub security: u32,
    /// e.g. `17.0.15+6-Debian-1deb12u1`.
    pub release: String,
}

/// Facts VMStructs does not export, fixed per version (x86_64).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct FrameFacts {
    /// Method* slot of an interpreter frame, in words from fp.
    pub interpreter_method_slot: i8,
    /// bcp slot of an interpreter frame, in words from fp.
    pub interpreter_bcp_slot: i8,
    /// UNSIGNED5 excludes the zero byte (JDK-8292758, JDK 20+): subtract 1 from each byte.
    pub unsigned5_excludes_zero: bool,
}

impl FrameFacts {
    pub fn for_version(version: &JvmVersion) -> Self {
        Self {
            interpreter_method_slot: -3,
            interpreter_bcp_slot: if version.major <= 8 { -7 } else { -8 },
            unsigned5_excludes_zero: version.major >= 20,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hotspot::vmstructs;

    /// VMStructs with every wanted field under the name at `pick` in its list (the newest name,
    /// or the oldest with `usize::MAX`), at an offset unique to the field, and every size.
    fn tables(pick: usize) -> VmStructs {
        let mut tables = VmStructs::default();
        for (index, wanted) in FIELDS.iter().enumerate() {
            let name = wanted.names[pick.min(wanted.names.len() - 1)];
            tables.fields.insert(
                name.to_owned(),
                vmstructs::Field {
                    offset: 8 * index as u64,
                    static_offset: None,
                    type_string: Some("int".to_owned()),
                },
            );
        }
        for (_, _, names) in SIZES {
            tables.types.insert(
                names[0].to_owned(),
                vmstructs::TypeInfo {
                    size: 16,
                    superclass: None,
                },
            );
        }
        tables
    }

    #[test]
    fn every_field_is_found_by_its_newest_or_oldest_name() {
        for pick in [0, usize::MAX] {
            let layout = JvmLayout::from_vmstructs(&tables(pick)).expect("layout");
            for (index, wanted) in FIELDS.iter().enumerate() {
                assert_eq!(
                    layout.offset(wanted.field),
                    Some(8 * index as u64),
                    "{}",
                    wanted.field.key()
                );
                assert_eq!(layout.width(wanted.field), Some(4));
            }
            assert_eq!(layout.size(TypeSize::PcDesc), Some(16));
            // Constants a build does not export take their x86_64 value.
            assert_eq!(layout.constant(Constant::ThreadInNative), Some(4));
            assert_eq!(
                Constant::EntryFrameCallWrapperOffset.key(),
                "frame::entry_frame_call_wrapper_offset"
            );
        }
    }

    #[test]
    fn fields_have_distinct_keys_and_a_missing_required_one_is_named() {
        let mut keys: Vec<&str> = FIELDS.iter().map(|w| w.field.key()).collect();
        keys.sort_unstable();
        let count = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), count, "two fields share a key");

        let mut tables = tables(0);
        tables.fields.remove("JavaThread::_anchor");
        assert_eq!(
            JvmLayout::from_vmstructs(&tables),
            Err(LayoutError::MissingField {
                key: "JavaThread::_anchor",
                tried: "JavaThread::_anchor".to_owned(),
            })
        );
        // An optional field missing is `None`, not an error.
        let mut tables = self::tables(0);
        tables.fields.remove("nmethod::_state");
        let layout = JvmLayout::from_vmstructs(&tables).expect("layout");
        assert_eq!(layout.offset(Field::NmethodState), None);
    }
}
