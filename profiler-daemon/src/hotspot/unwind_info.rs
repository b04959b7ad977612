//! The BPF-side description of a JVM ([`HotspotProc`]), built from its layout and runtime state.

use profiler_common::{hotspot_flags, CodeHeapRange, HotspotProc, MAX_CODE_HEAPS};

use super::jvm::{CodeCacheInfo, Jvm};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} ({value}) does not fit the BPF layout")]
pub struct DoesNotFit {
    pub what: &'static str,
    pub value: i64,
}

pub fn hotspot_proc(jvm: &Jvm, code: &CodeCacheInfo) -> Result<HotspotProc, DoesNotFit> {
    let layout = &jvm.layout;
    let offset = |key: &'static str| -> Result<u16, DoesNotFit> {
        let value = layout.offset(key).ok_or(DoesNotFit {
            what: key,
            value: -1,
        })?;
        u16::try_from(value).map_err(|_| DoesNotFit {
            what: key,
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
    let code_offset = layout.offset("CodeBlob::_code_offset").is_some()
        && layout.offset("CodeBlob::_code_begin").is_none();
    let mut flags = 0;
    if code_offset {
        flags |= hotspot_flags::CODE_OFFSET;
    }
    if layout.width("CodeBlob::_frame_complete_offset") == Some(2) {
        flags |= hotspot_flags::FRAME_COMPLETE_16;
    }
    if layout.offset("nmethod::_deopt_handler_begin").is_none() {
        flags |= hotspot_flags::DEOPT_HANDLER_OFFSET;
    }
    if layout.offset("nmethod::_verified_entry_point").is_none() {
        flags |= hotspot_flags::VERIFIED_ENTRY_OFFSET;
    }
    if layout.width("HeapBlock::_used") == Some(4) {
        flags |= hotspot_flags::HEAP_BLOCK_USED_32;
    }
    let call_wrapper = layout
        .constant("frame::entry_frame_call_wrapper_offset")
        .unwrap_or(-6);
    // Every constant has an x86_64 default in the layout: a missing one is a programming error.
    let thread_state = |key: &'static str| {
        let value = layout.constant(key).unwrap_or(-1);
        u8::try_from(value).map_err(|_| DoesNotFit { what: key, value })
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
        thread_in_native: thread_state("_thread_in_native")?,
        thread_in_vm: thread_state("_thread_in_vm")?,
        thread_blocked: thread_state("_thread_blocked")?,
        heap_block_size: layout
            .size("HeapBlock")
            .and_then(|s| u16::try_from(s).ok())
            .ok_or(DoesNotFit {
                what: "sizeof(HeapBlock)",
                value: -1,
            })?,
        heap_block_used: offset("HeapBlock::_used")?,
        blob_size: offset("CodeBlob::_size")?,
        blob_frame_size: offset("CodeBlob::_frame_size")?,
        blob_frame_complete: offset("CodeBlob::_frame_complete_offset")?,
        blob_code: if code_offset {
            offset("CodeBlob::_code_offset")?
        } else {
            offset("CodeBlob::_code_begin")?
        },
        nmethod_compile_id: offset("nmethod::_compile_id")?,
        nmethod_method: offset("nmethod::_method")?,
        method_const_method: offset("Method::_constMethod")?,
        java_thread_anchor: offset("JavaThread::_anchor")?,
        java_thread_state: offset("JavaThread::_thread_state")?,
        anchor_sp: offset("JavaFrameAnchor::_last_Java_sp")?,
        anchor_pc: offset("JavaFrameAnchor::_last_Java_pc")?,
        anchor_fp: layout
            .offset("JavaFrameAnchor::_last_Java_fp")
            .map_or(Ok(u16::MAX), |_| offset("JavaFrameAnchor::_last_Java_fp"))?,
        call_wrapper_anchor: offset("JavaCallWrapper::_anchor")?,
        const_method_size: layout
            .size("ConstMethod")
            .and_then(|s| u16::try_from(s).ok())
            .ok_or(DoesNotFit {
                what: "sizeof(ConstMethod)",
                value: -1,
            })?,
        const_method_code_size: offset("ConstMethod::_code_size")?,
        nmethod_deopt_handler: match layout.offset("nmethod::_deopt_handler_begin") {
            Some(_) => offset("nmethod::_deopt_handler_begin")?,
            None => offset("nmethod::_deopt_handler_offset")?,
        },
        nmethod_orig_pc_offset: offset("nmethod::_orig_pc_offset")?,
        const_method_constants: offset("ConstMethod::_constants")?,
        constant_pool_holder: offset("ConstantPool::_pool_holder")?,
        klass_name: offset("Klass::_name")?,
        symbol_hash_word: symbol_hash_word(layout),
        symbol_length: symbol_length(layout).ok_or(DoesNotFit {
            what: "Symbol::_length",
            value: -1,
        })?,
        symbol_body: offset("Symbol::_body")?,
        _reserved2: [0; 2],
        nmethod_verified_entry: match (
            layout.offset("nmethod::_verified_entry_point"),
            layout.offset("nmethod::_verified_entry_offset"),
        ) {
            (Some(_), _) => offset("nmethod::_verified_entry_point")?,
            (None, Some(_)) => offset("nmethod::_verified_entry_offset")?,
            (None, None) => u16::MAX,
        },
    })
}

/// Where a `Symbol`'s 16-bit length is: `_length`, or the upper half of the little-endian
/// `_length_and_refcount` word.
pub fn symbol_length(layout: &super::layout::JvmLayout) -> Option<u16> {
    let at = match layout.offset("Symbol::_length") {
        Some(at) => at,
        None => layout.offset("Symbol::_length_and_refcount")? + 2,
    };
    u16::try_from(at).ok().filter(|at| *at < 8)
}

/// Where a `Symbol`'s hash word is: JDK 11 and later start a symbol with `_hash_and_refcount`
/// (hash in the upper 16 bits, refcount below), then `_length` at 4, which VMStructs gives.
pub fn symbol_hash_word(layout: &super::layout::JvmLayout) -> u16 {
    match layout.offset("Symbol::_length") {
        Some(4) => 0,
        _ => profiler_common::NO_SYMBOL_HASH,
    }
}
