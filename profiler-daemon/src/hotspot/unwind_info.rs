//! The BPF-side description of a JVM ([`HotspotProc`]), built from its layout and runtime state.

use profiler_common::{hotspot_flags, CodeHeapRange, HotspotProc, MAX_CODE_HEAPS};

use super::jvm::{CodeCacheInfo, Jvm};
use super::layout::{Constant, Field, TypeSize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} ({value}) does not fit the BPF layout")]
pub struct DoesNotFit {
    pub what: &'static str,
    pub value: i64,
}

pub fn hotspot_proc(jvm: &Jvm, code: &CodeCacheInfo) -> Result<HotspotProc, DoesNotFit> {
    let layout = &jvm.layout;
    let offset = |field: Field| -> Result<u16, DoesNotFit> {
        let value = layout.offset(field).ok_or(DoesNotFit {
            what: field.key(),
            value: -1,
        })?;
        u16::try_from(value).map_err(|_| DoesNotFit {
            what: field.key(),
            value: value as i64,
        })
    };
    let mut heaps = [CodeHeapRange::default(); MAX_CODE_HEAPS];
    for (slot, heap) in heaps.iter_mut().zip(&code.heaps) {
        *slot = CodeHeapRange {
            low: heap.low,
            high: heap.high,
            segmap: heap.segmap,
            log2_segment_size: heap.log2_segment_size,
            _reserved: 0,
        };
    }
    let code_offset = layout.offset(Field::CodeBlobCodeOffset).is_some()
        && layout.offset(Field::CodeBlobCodeBegin).is_none();
    let mut flags = 0;
    if code_offset {
        flags |= hotspot_flags::CODE_OFFSET;
    }
    if layout.width(Field::CodeBlobFrameCompleteOffset) == Some(2) {
        flags |= hotspot_flags::FRAME_COMPLETE_16;
    }
    if layout.offset(Field::NmethodDeoptHandlerBegin).is_none() {
        flags |= hotspot_flags::DEOPT_HANDLER_OFFSET;
    }
    if layout.offset(Field::NmethodVerifiedEntryPoint).is_none() {
        flags |= hotspot_flags::VERIFIED_ENTRY_OFFSET;
    }
    if layout.width(Field::HeapBlockUsed) == Some(4) {
        flags |= hotspot_flags::HEAP_BLOCK_USED_32;
    }
    let call_wrapper = layout
        .constant(Constant::EntryFrameCallWrapperOffset)
        .unwrap_or(-6);
    // Every constant has an x86_64 default in the layout: a missing one is a programming error.
    let thread_state = |constant: Constant| {
        let value = layout.constant(constant).unwrap_or(-1);
        u8::try_from(value).map_err(|_| DoesNotFit {
            what: constant.key(),
            value,
        })
    };
    Ok(HotspotProc {
        code_low: code.low_bound,
        code_high: code.high_bound,
        interpreter_low: code.interpreter_low,
        interpreter_high: code.interpreter_high,
        call_stub_return: code.call_stub_return_address,
        heaps,
        heap_count: code.heaps.len().min(MAX_CODE_HEAPS) as u8,
        flags,
        interpreter_method_slot: jvm.facts.interpreter_method_slot,
        interpreter_bcp_slot: jvm.facts.interpreter_bcp_slot,
        entry_frame_call_wrapper_slot: i8::try_from(call_wrapper).map_err(|_| DoesNotFit {
            what: "frame::entry_frame_call_wrapper_offset",
            value: call_wrapper,
        })?,
        thread_in_native: thread_state(Constant::ThreadInNative)?,
        thread_in_vm: thread_state(Constant::ThreadInVm)?,
        thread_blocked: thread_state(Constant::ThreadBlocked)?,
        heap_block_size: layout
            .size(TypeSize::HeapBlock)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or(DoesNotFit {
                what: "sizeof(HeapBlock)",
                value: -1,
            })?,
        heap_block_used: offset(Field::HeapBlockUsed)?,
        blob_size: offset(Field::CodeBlobSize)?,
        blob_frame_size: offset(Field::CodeBlobFrameSize)?,
        blob_frame_complete: offset(Field::CodeBlobFrameCompleteOffset)?,
        blob_code: if code_offset {
            offset(Field::CodeBlobCodeOffset)?
        } else {
            offset(Field::CodeBlobCodeBegin)?
        },
        nmethod_compile_id: offset(Field::NmethodCompileId)?,
        nmethod_method: offset(Field::NmethodMethod)?,
        method_const_method: offset(Field::MethodConstMethod)?,
        java_thread_anchor: offset(Field::JavaThreadAnchor)?,
        java_thread_state: offset(Field::JavaThreadThreadState)?,
        anchor_sp: offset(Field::JavaFrameAnchorLastJavaSp)?,
        anchor_pc: offset(Field::JavaFrameAnchorLastJavaPc)?,
        anchor_fp: layout
            .offset(Field::JavaFrameAnchorLastJavaFp)
            .map_or(Ok(u16::MAX), |_| offset(Field::JavaFrameAnchorLastJavaFp))?,
        call_wrapper_anchor: offset(Field::JavaCallWrapperAnchor)?,
        const_method_size: layout
            .size(TypeSize::ConstMethod)
            .and_then(|s| u16::try_from(s).ok())
            .ok_or(DoesNotFit {
                what: "sizeof(ConstMethod)",
                value: -1,
            })?,
        const_method_code_size: offset(Field::ConstMethodCodeSize)?,
        nmethod_deopt_handler: match layout.offset(Field::NmethodDeoptHandlerBegin) {
            Some(_) => offset(Field::NmethodDeoptHandlerBegin)?,
            None => offset(Field::NmethodDeoptHandlerOffset)?,
        },
        nmethod_orig_pc_offset: offset(Field::NmethodOrigPcOffset)?,
        const_method_constants: offset(Field::ConstMethodConstants)?,
        constant_pool_holder: offset(Field::ConstantPoolPoolHolder)?,
        klass_name: offset(Field::KlassName)?,
        symbol_hash_word: symbol_hash_word(layout),
        symbol_length: symbol_length(layout).ok_or(DoesNotFit {
            what: Field::SymbolLength.key(),
            value: -1,
        })?,
        symbol_body: offset(Field::SymbolBody)?,
        _reserved2: [0; 2],
        nmethod_verified_entry: match (
            layout.offset(Field::NmethodVerifiedEntryPoint),
            layout.offset(Field::NmethodVerifiedEntryOffset),
        ) {
            (Some(_), _) => offset(Field::NmethodVerifiedEntryPoint)?,
            (None, Some(_)) => offset(Field::NmethodVerifiedEntryOffset)?,
            (None, None) => u16::MAX,
        },
    })
}

/// Where a `Symbol`'s 16-bit length is: `_length`, or the upper half of the little-endian
/// `_length_and_refcount` word.
pub fn symbol_length(layout: &super::layout::JvmLayout) -> Option<u16> {
    let at = match layout.offset(Field::SymbolLength) {
        Some(at) => at,
        None => layout.offset(Field::SymbolLengthAndRefcount)? + 2,
    };
    u16::try_from(at).ok().filter(|at| *at < 8)
}

/// Where a `Symbol`'s hash word is: JDK 11 and later start a symbol with `_hash_and_refcount`
/// (hash in the upper 16 bits, refcount below), then `_length` at 4, which VMStructs gives.
pub fn symbol_hash_word(layout: &super::layout::JvmLayout) -> u16 {
    match layout.offset(Field::SymbolLength) {
        Some(4) => 0,
        _ => profiler_common::NO_SYMBOL_HASH,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Arc;

    use super::*;
    use crate::hotspot::jvm::CodeHeapInfo;
    use crate::hotspot::layout::{FrameFacts, JvmLayout, JvmVersion};
    use crate::hotspot::vmstructs::{self, VmStructs};

    /// The VMStructs of a made-up JVM: every field the daemon may ask for at an offset of its
    /// own (`field offsets` below), with the types HotSpot declares, in the layout of JDK 17
    /// (pointers) or of JDK 23 and later (offsets from the blob).
    fn vmstructs(offsets_layout: bool) -> (VmStructs, HashMap<&'static str, u64>) {
        let mut fields: Vec<(&'static str, &'static str)> = vec![
            ("CodeCache::_heaps", "GrowableArray<CodeHeap*>*"),
            ("CodeCache::_low_bound", "address"),
            ("CodeCache::_high_bound", "address"),
            ("GrowableArrayBase::_len", "int"),
            ("GrowableArray<int>::_data", "int*"),
            ("CodeHeap::_memory", "VirtualSpace"),
            ("CodeHeap::_segmap", "VirtualSpace"),
            ("CodeHeap::_log2_segment_size", "int"),
            ("VirtualSpace::_low_boundary", "char*"),
            ("VirtualSpace::_high_boundary", "char*"),
            ("VirtualSpace::_low", "char*"),
            ("VirtualSpace::_high", "char*"),
            ("HeapBlock::Header::_length", "size_t"),
            ("HeapBlock::Header::_used", "bool"),
            ("CodeBlob::_name", "const char*"),
            ("CodeBlob::_size", "int"),
            ("CodeBlob::_header_size", "int"),
            ("CodeBlob::_data_offset", "int"),
            ("CodeBlob::_frame_size", "int"),
            ("nmethod::_compile_id", "int"),
            ("nmethod::_comp_level", "CompLevel"),
            ("nmethod::_orig_pc_offset", "int"),
            ("nmethod::_scopes_pcs_offset", "int"),
            ("Method::_constMethod", "ConstMethod*"),
            ("Method::_code", "nmethod*"),
            ("ConstMethod::_constants", "ConstantPool*"),
            ("ConstMethod::_flags._flags", "u4"),
            ("ConstMethod::_code_size", "u2"),
            ("ConstMethod::_name_index", "u2"),
            ("ConstMethod::_signature_index", "u2"),
            ("ConstMethod::_method_idnum", "u2"),
            ("ConstantPool::_pool_holder", "InstanceKlass*"),
            ("InstanceKlass::_constants", "ConstantPool*"),
            ("InstanceKlass::_methods", "Array<Method*>*"),
            ("Klass::_name", "Symbol*"),
            ("Symbol::_length", "u2"),
            ("Symbol::_body", "u1"),
            ("JavaThread::_anchor", "JavaFrameAnchor"),
            ("JavaThread::_thread_state", "JavaThreadState"),
            ("Thread::_osthread", "OSThread*"),
            ("OSThread::_thread_id", "pid_t"),
            ("JavaFrameAnchor::_last_Java_sp", "intptr_t*"),
            ("JavaFrameAnchor::_last_Java_pc", "address"),
            ("JavaFrameAnchor::_last_Java_fp", "intptr_t*"),
            ("JavaCallWrapper::_anchor", "JavaFrameAnchor"),
            ("AbstractInterpreter::_code", "StubQueue*"),
            ("StubQueue::_stub_buffer", "address"),
            ("StubQueue::_buffer_limit", "int"),
            ("StubRoutines::_call_stub_return_address", "address"),
            ("PcDesc::_pc_offset", "int"),
            ("PcDesc::_scope_decode_offset", "int"),
            ("Abstract_VM_Version::_s_vm_release", "const char*"),
            ("Abstract_VM_Version::_vm_major_version", "int"),
            ("Abstract_VM_Version::_vm_minor_version", "int"),
            ("Abstract_VM_Version::_vm_security_version", "int"),
        ];
        if offsets_layout {
            fields.extend([
                ("CodeBlob::_code_offset", "int"),
                ("CodeBlob::_frame_complete_offset", "int16_t"),
                ("CodeBlob::_kind", "CodeBlobKind"),
                ("nmethod::_method", "Method*"),
                ("nmethod::_scopes_data_offset", "int"),
                ("nmethod::_deopt_handler_entry_offset", "int"),
                ("nmethod::_verified_entry_offset", "uint16_t"),
            ]);
        } else {
            fields.extend([
                ("CodeBlob::_code_begin", "address"),
                ("CodeBlob::_frame_complete_offset", "int"),
                ("CompiledMethod::_method", "Method*"),
                ("CompiledMethod::_scopes_data_begin", "address"),
                ("CompiledMethod::_deopt_handler_begin", "address"),
                ("nmethod::_verified_entry_point", "address"),
            ]);
        }
        let mut tables = VmStructs::default();
        let mut offsets = HashMap::new();
        for (index, (name, type_string)) in fields.into_iter().enumerate() {
            // Distinct, and small enough for the BPF record's 16-bit offsets; a `Symbol`'s
            // fields where HotSpot has them (the walker reads its first 8 bytes as a header).
            let offset = match name {
                "Symbol::_length" => 4,
                "Symbol::_body" => 6,
                _ => 8 + 8 * index as u64,
            };
            offsets.insert(name, offset);
            tables.fields.insert(
                name.to_owned(),
                vmstructs::Field {
                    offset,
                    static_offset: None,
                    type_string: Some(type_string.to_owned()),
                },
            );
        }
        for (name, size) in [
            ("CodeBlob", 96),
            ("nmethod", 256),
            ("Method", 88),
            ("ConstMethod", 56),
            ("ConstantPool", 80),
            ("HeapBlock", 8),
            ("PcDesc", 16),
        ] {
            tables.types.insert(
                name.to_owned(),
                vmstructs::TypeInfo {
                    size,
                    superclass: None,
                },
            );
        }
        tables
            .int_constants
            .insert("_thread_in_native".to_owned(), 4);
        tables.int_constants.insert("_thread_in_vm".to_owned(), 6);
        tables
            .int_constants
            .insert("_thread_blocked".to_owned(), 10);
        (tables, offsets)
    }

    fn jvm(tables: &VmStructs) -> Jvm {
        let version = JvmVersion {
            major: 25,
            minor: 0,
            security: 1,
            release: "25.0.1".to_owned(),
        };
        Jvm {
            pid: 1,
            libjvm_path: "/fake/libjvm.so".to_owned(),
            build_id: None,
            bias: 0x7f00_0000_0000,
            facts: FrameFacts::for_version(&version),
            version,
            layout: Arc::new(JvmLayout::from_vmstructs(tables).expect("layout")),
        }
    }

    fn code() -> CodeCacheInfo {
        CodeCacheInfo {
            low_bound: 0x7e00_0000_0000,
            high_bound: 0x7e00_1000_0000,
            heaps: vec![CodeHeapInfo {
                low: 0x7e00_0000_0000,
                high: 0x7e00_1000_0000,
                committed_high: 0x7e00_0100_0000,
                segmap: 0x7d00_0000_0000,
                log2_segment_size: 7,
            }],
            interpreter_low: 0x7e00_0000_1000,
            interpreter_high: 0x7e00_0000_9000,
            call_stub_return_address: 0x7e00_0000_a040,
        }
    }

    /// Every offset the BPF walker reads comes from the VMStructs field it means, whatever
    /// the layout generation, and the flags say which generation it is.
    #[test]
    fn the_bpf_record_takes_each_offset_from_its_vmstructs_field() {
        for offsets_layout in [false, true] {
            let (tables, at) = vmstructs(offsets_layout);
            let hs = hotspot_proc(&jvm(&tables), &code()).expect("fits");
            let field = |name: &str| at[name] as u16;
            let expected_by_bpf_name = [
                (
                    "heap_block_used",
                    hs.heap_block_used,
                    field("HeapBlock::Header::_used"),
                ),
                ("blob_size", hs.blob_size, field("CodeBlob::_size")),
                (
                    "blob_frame_size",
                    hs.blob_frame_size,
                    field("CodeBlob::_frame_size"),
                ),
                (
                    "blob_frame_complete",
                    hs.blob_frame_complete,
                    field("CodeBlob::_frame_complete_offset"),
                ),
                (
                    "nmethod_compile_id",
                    hs.nmethod_compile_id,
                    field("nmethod::_compile_id"),
                ),
                (
                    "method_const_method",
                    hs.method_const_method,
                    field("Method::_constMethod"),
                ),
                (
                    "java_thread_anchor",
                    hs.java_thread_anchor,
                    field("JavaThread::_anchor"),
                ),
                (
                    "java_thread_state",
                    hs.java_thread_state,
                    field("JavaThread::_thread_state"),
                ),
                (
                    "anchor_sp",
                    hs.anchor_sp,
                    field("JavaFrameAnchor::_last_Java_sp"),
                ),
                (
                    "anchor_pc",
                    hs.anchor_pc,
                    field("JavaFrameAnchor::_last_Java_pc"),
                ),
                (
                    "anchor_fp",
                    hs.anchor_fp,
                    field("JavaFrameAnchor::_last_Java_fp"),
                ),
                (
                    "call_wrapper_anchor",
                    hs.call_wrapper_anchor,
                    field("JavaCallWrapper::_anchor"),
                ),
                (
                    "const_method_code_size",
                    hs.const_method_code_size,
                    field("ConstMethod::_code_size"),
                ),
                (
                    "nmethod_orig_pc_offset",
                    hs.nmethod_orig_pc_offset,
                    field("nmethod::_orig_pc_offset"),
                ),
                (
                    "const_method_constants",
                    hs.const_method_constants,
                    field("ConstMethod::_constants"),
                ),
                (
                    "constant_pool_holder",
                    hs.constant_pool_holder,
                    field("ConstantPool::_pool_holder"),
                ),
                ("klass_name", hs.klass_name, field("Klass::_name")),
                ("symbol_body", hs.symbol_body, field("Symbol::_body")),
                ("heap_block_size", hs.heap_block_size, 8),
                ("const_method_size", hs.const_method_size, 56),
            ];
            for (bpf_name, got, expected) in expected_by_bpf_name {
                assert_eq!(
                    got, expected,
                    "{bpf_name} (offsets layout: {offsets_layout})"
                );
            }
            let generation_fields = if offsets_layout {
                [
                    ("blob_code", hs.blob_code, field("CodeBlob::_code_offset")),
                    (
                        "nmethod_method",
                        hs.nmethod_method,
                        field("nmethod::_method"),
                    ),
                    (
                        "nmethod_deopt_handler",
                        hs.nmethod_deopt_handler,
                        field("nmethod::_deopt_handler_entry_offset"),
                    ),
                    (
                        "nmethod_verified_entry",
                        hs.nmethod_verified_entry,
                        field("nmethod::_verified_entry_offset"),
                    ),
                ]
            } else {
                [
                    ("blob_code", hs.blob_code, field("CodeBlob::_code_begin")),
                    (
                        "nmethod_method",
                        hs.nmethod_method,
                        field("CompiledMethod::_method"),
                    ),
                    (
                        "nmethod_deopt_handler",
                        hs.nmethod_deopt_handler,
                        field("CompiledMethod::_deopt_handler_begin"),
                    ),
                    (
                        "nmethod_verified_entry",
                        hs.nmethod_verified_entry,
                        field("nmethod::_verified_entry_point"),
                    ),
                ]
            };
            for (bpf_name, got, expected) in generation_fields {
                assert_eq!(
                    got, expected,
                    "{bpf_name} (offsets layout: {offsets_layout})"
                );
            }
            let generation_flags = hotspot_flags::CODE_OFFSET
                | hotspot_flags::FRAME_COMPLETE_16
                | hotspot_flags::DEOPT_HANDLER_OFFSET
                | hotspot_flags::VERIFIED_ENTRY_OFFSET;
            let expected_flags = if offsets_layout { generation_flags } else { 0 };
            assert_eq!(hs.flags & generation_flags, expected_flags);
            // `HeapBlock::_used` is a bool in both.
            assert_eq!(hs.flags & hotspot_flags::HEAP_BLOCK_USED_32, 0);
            // Constants and runtime state.
            assert_eq!(
                (hs.thread_in_native, hs.thread_in_vm, hs.thread_blocked),
                (4, 6, 10)
            );
            assert_eq!(hs.entry_frame_call_wrapper_slot, -6);
            assert_eq!(
                (hs.interpreter_method_slot, hs.interpreter_bcp_slot),
                (-3, -8)
            );
            assert_eq!(
                (hs.code_low, hs.interpreter_low, hs.call_stub_return),
                (
                    code().low_bound,
                    code().interpreter_low,
                    code().call_stub_return_address
                )
            );
            assert_eq!((hs.heap_count, hs.heaps[0].log2_segment_size), (1, 7));
            // `Symbol::_length` at 4: the 32-bit hash and refcount word before it.
            assert_eq!((hs.symbol_length, hs.symbol_hash_word), (4, 0));
        }
    }

    #[test]
    fn an_offset_past_the_bpf_records_16_bits_is_refused_by_name() {
        let (mut tables, _) = vmstructs(true);
        if let Some(anchor) = tables.fields.get_mut("JavaThread::_anchor") {
            anchor.offset = 0x1_0000;
        }
        let err = hotspot_proc(&jvm(&tables), &code()).expect_err("does not fit");
        assert_eq!(err.what, "JavaThread::_anchor");
    }
}
