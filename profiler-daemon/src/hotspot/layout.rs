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

/// A wanted field: its name in our layout and the VMStructs names it may have, newest first.
struct WantedField {
    key: &'static str,
    names: &'static [&'static str],
    required: bool,
}

const fn required(key: &'static str, names: &'static [&'static str]) -> WantedField {
    WantedField {
        key,
        names,
        required: true,
    }
}

const fn optional(key: &'static str, names: &'static [&'static str]) -> WantedField {
    WantedField {
        key,
        names,
        required: false,
    }
}

/// Fields, by the name the rest of the daemon uses.
const FIELDS: &[WantedField] = &[
    // Code cache: where JIT code is, and its segment maps.
    required("CodeCache::_heaps", &["CodeCache::_heaps"]),
    required("CodeCache::_low_bound", &["CodeCache::_low_bound"]),
    required("CodeCache::_high_bound", &["CodeCache::_high_bound"]),
    required(
        "GrowableArray::_len",
        &["GrowableArrayBase::_len", "GenericGrowableArray::_len"],
    ),
    required("GrowableArray::_data", &["GrowableArray<int>::_data"]),
    required("CodeHeap::_memory", &["CodeHeap::_memory"]),
    required("CodeHeap::_segmap", &["CodeHeap::_segmap"]),
    required(
        "CodeHeap::_log2_segment_size",
        &["CodeHeap::_log2_segment_size"],
    ),
    required(
        "VirtualSpace::_low_boundary",
        &["VirtualSpace::_low_boundary"],
    ),
    required(
        "VirtualSpace::_high_boundary",
        &["VirtualSpace::_high_boundary"],
    ),
    required("VirtualSpace::_low", &["VirtualSpace::_low"]),
    required("VirtualSpace::_high", &["VirtualSpace::_high"]),
    required("HeapBlock::_length", &["HeapBlock::Header::_length"]),
    required("HeapBlock::_used", &["HeapBlock::Header::_used"]),
    // CodeBlob and nmethod: frame sizes for the unwinder, debug info for the symbolizer.
    required("CodeBlob::_name", &["CodeBlob::_name"]),
    required("CodeBlob::_size", &["CodeBlob::_size"]),
    required("CodeBlob::_header_size", &["CodeBlob::_header_size"]),
    required(
        "CodeBlob::_frame_complete_offset",
        &["CodeBlob::_frame_complete_offset"],
    ),
    required("CodeBlob::_data_offset", &["CodeBlob::_data_offset"]),
    required("CodeBlob::_frame_size", &["CodeBlob::_frame_size"]),
    optional("CodeBlob::_code_begin", &["CodeBlob::_code_begin"]),
    optional("CodeBlob::_code_offset", &["CodeBlob::_code_offset"]),
    optional("CodeBlob::_kind", &["CodeBlob::_kind"]),
    optional("CodeBlob::_mutable_data", &["CodeBlob::_mutable_data"]),
    optional(
        "CodeBlob::_relocation_size",
        &["CodeBlob::_relocation_size"],
    ),
    required(
        "nmethod::_method",
        &["nmethod::_method", "CompiledMethod::_method"],
    ),
    required("nmethod::_compile_id", &["nmethod::_compile_id"]),
    required("nmethod::_comp_level", &["nmethod::_comp_level"]),
    required("nmethod::_orig_pc_offset", &["nmethod::_orig_pc_offset"]),
    required(
        "nmethod::_scopes_pcs_offset",
        &["nmethod::_scopes_pcs_offset"],
    ),
    optional(
        "nmethod::_scopes_data_begin",
        &["CompiledMethod::_scopes_data_begin"],
    ),
    optional(
        "nmethod::_scopes_data_offset",
        &["nmethod::_scopes_data_offset"],
    ),
    optional("nmethod::_immutable_data", &["nmethod::_immutable_data"]),
    // Up to JDK 19, an unloaded nmethod stays in the code heap (state 3 or 4) after its
    // classes' metadata is freed.
    optional("nmethod::_state", &["nmethod::_state"]),
    optional(
        "nmethod::_immutable_data_size",
        &["nmethod::_immutable_data_size"],
    ),
    optional(
        "CodeBlob::_mutable_data_size",
        &["CodeBlob::_mutable_data_size"],
    ),
    optional("nmethod::_metadata_offset", &["nmethod::_metadata_offset"]),
    optional(
        "nmethod::_dependencies_offset",
        &["nmethod::_dependencies_offset"],
    ),
    optional(
        "nmethod::_deopt_handler_begin",
        &["CompiledMethod::_deopt_handler_begin"],
    ),
    optional(
        "nmethod::_deopt_handler_offset",
        &[
            "nmethod::_deopt_handler_entry_offset",
            "nmethod::_deopt_handler_offset",
        ],
    ),
    optional(
        "nmethod::_verified_entry_point",
        &["nmethod::_verified_entry_point"],
    ),
    optional(
        "nmethod::_verified_entry_offset",
        &["nmethod::_verified_entry_offset"],
    ),
    // Method metadata: names, lines.
    required("Method::_constMethod", &["Method::_constMethod"]),
    required("Method::_code", &["Method::_code"]),
    required("ConstMethod::_constants", &["ConstMethod::_constants"]),
    required(
        "ConstMethod::_flags",
        &["ConstMethod::_flags._flags", "ConstMethod::_flags"],
    ),
    required("ConstMethod::_code_size", &["ConstMethod::_code_size"]),
    required("ConstMethod::_name_index", &["ConstMethod::_name_index"]),
    required(
        "ConstMethod::_signature_index",
        &["ConstMethod::_signature_index"],
    ),
    required(
        "ConstMethod::_method_idnum",
        &["ConstMethod::_method_idnum"],
    ),
    required(
        "ConstantPool::_pool_holder",
        &["ConstantPool::_pool_holder"],
    ),
    optional(
        "ConstantPool::_source_file_name_index",
        &["ConstantPool::_source_file_name_index"],
    ),
    optional(
        "InstanceKlass::_source_file_name_index",
        &["InstanceKlass::_source_file_name_index"],
    ),
    required("InstanceKlass::_constants", &["InstanceKlass::_constants"]),
    required("InstanceKlass::_methods", &["InstanceKlass::_methods"]),
    required("Klass::_name", &["Klass::_name"]),
    optional("Symbol::_length", &["Symbol::_length"]),
    optional(
        "Symbol::_length_and_refcount",
        &["Symbol::_length_and_refcount"],
    ),
    required("Symbol::_body", &["Symbol::_body"]),
    // Threads: the last Java frame of threads in native or VM code.
    required("JavaThread::_anchor", &["JavaThread::_anchor"]),
    required("JavaThread::_thread_state", &["JavaThread::_thread_state"]),
    required(
        "Thread::_osthread",
        &["Thread::_osthread", "JavaThread::_osthread"],
    ),
    required("OSThread::_thread_id", &["OSThread::_thread_id"]),
    required(
        "JavaFrameAnchor::_last_Java_sp",
        &["JavaFrameAnchor::_last_Java_sp"],
    ),
    required(
        "JavaFrameAnchor::_last_Java_pc",
        &["JavaFrameAnchor::_last_Java_pc"],
    ),
    optional(
        "JavaFrameAnchor::_last_Java_fp",
        &["JavaFrameAnchor::_last_Java_fp"],
    ),
    required("JavaCallWrapper::_anchor", &["JavaCallWrapper::_anchor"]),
    optional(
        "ThreadsSMRSupport::_java_thread_list",
        &["ThreadsSMRSupport::_java_thread_list"],
    ),
    optional("ThreadsList::_length", &["ThreadsList::_length"]),
    optional("ThreadsList::_threads", &["ThreadsList::_threads"]),
    optional("Threads::_thread_list", &["Threads::_thread_list"]),
    optional("JavaThread::_next", &["JavaThread::_next"]),
    // The interpreter's code and the call stub: where Java frames start and end.
    required(
        "AbstractInterpreter::_code",
        &["AbstractInterpreter::_code"],
    ),
    required("StubQueue::_stub_buffer", &["StubQueue::_stub_buffer"]),
    required("StubQueue::_buffer_limit", &["StubQueue::_buffer_limit"]),
    required(
        "StubRoutines::_call_stub_return_address",
        &["StubRoutines::_call_stub_return_address"],
    ),
    // Compiled-code debug info.
    required("PcDesc::_pc_offset", &["PcDesc::_pc_offset"]),
    required(
        "PcDesc::_scope_decode_offset",
        &["PcDesc::_scope_decode_offset"],
    ),
    // Version.
    required(
        "Abstract_VM_Version::_s_vm_release",
        &["Abstract_VM_Version::_s_vm_release"],
    ),
    required(
        "Abstract_VM_Version::_vm_major_version",
        &["Abstract_VM_Version::_vm_major_version"],
    ),
    required(
        "Abstract_VM_Version::_vm_minor_version",
        &["Abstract_VM_Version::_vm_minor_version"],
    ),
    required(
        "Abstract_VM_Version::_vm_security_version",
        &["Abstract_VM_Version::_vm_security_version"],
    ),
];

/// Type sizes: (our name, VMStructs names).
const SIZES: &[(&str, &[&str])] = &[
    ("CodeBlob", &["CodeBlob"]),
    ("nmethod", &["nmethod"]),
    ("Method", &["Method"]),
    ("ConstMethod", &["ConstMethod"]),
    ("ConstantPool", &["ConstantPool"]),
    ("HeapBlock", &["HeapBlock"]),
    ("PcDesc", &["PcDesc"]),
];

/// Int constants, with the value to use when a build does not export it (x86_64 facts).
const CONSTANTS: &[(&str, &[&str], Option<i64>)] = &[
    (
        "frame::entry_frame_call_wrapper_offset",
        &["frame::entry_frame_call_wrapper_offset"],
        Some(-6),
    ),
    (
        "frame::interpreter_frame_sender_sp_offset",
        &["frame::interpreter_frame_sender_sp_offset"],
        Some(-1),
    ),
    (
        "frame::interpreter_frame_last_sp_offset",
        &["frame::interpreter_frame_last_sp_offset"],
        Some(-2),
    ),
    ("InvocationEntryBci", &["InvocationEntryBci"], Some(-1)),
    ("_thread_in_native", &["_thread_in_native"], Some(4)),
    ("_thread_in_vm", &["_thread_in_vm"], Some(6)),
    ("_thread_in_Java", &["_thread_in_Java"], Some(8)),
    ("_thread_blocked", &["_thread_blocked"], Some(10)),
    (
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
                        wanted.key,
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
                        key: wanted.key,
                        tried: wanted.names.join(", "),
                    })
                }
                None => {}
            }
        }
        if !fields.contains_key("CodeBlob::_code_begin")
            && !fields.contains_key("CodeBlob::_code_offset")
        {
            return Err(LayoutError::NoCodeStart);
        }
        if !fields.contains_key("Symbol::_length")
            && !fields.contains_key("Symbol::_length_and_refcount")
        {
            return Err(LayoutError::NoSymbolLength);
        }
        let mut sizes = BTreeMap::new();
        for (key, names) in SIZES {
            let size = names
                .iter()
                .find_map(|name| tables.type_size(name))
                .ok_or(LayoutError::MissingType(key))?;
            sizes.insert(*key, size);
        }
        let mut constants = BTreeMap::new();
        for (key, names, default) in CONSTANTS {
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

    /// The offset of a field this layout resolved. Keys are the `FIELDS` keys; asking for one
    /// that is not there is a programming error, answered with `None`.
    pub fn offset(&self, key: &str) -> Option<u64> {
        self.fields.get(key).map(|f| f.offset)
    }

    pub fn size(&self, key: &str) -> Option<u64> {
        self.sizes.get(key).copied()
    }

    pub fn constant(&self, key: &str) -> Option<i64> {
        self.constants.get(key).copied()
    }

    /// Width in bytes of an integer field, from its VMStructs type string.
    pub fn width(&self, key: &str) -> Option<u8> {
        let type_string = self.fields.get(key)?.type_string.as_deref()?;
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
