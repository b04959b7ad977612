//! The BPF-side description of a JVM ([`HotspotProc`]), built from its layout and runtime state.

use profiler_common::{
    hotspot_flags, CodeHeapRange, FrozenFramesLayout, HotspotProc, MAX_CODE_HEAPS,
};

use super::jvm::{CodeCacheInfo, Jvm};
use super::layout::{Constant, Field, TypeSize};

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{what} ({value}) does not fit the BPF layout")]
pub struct DoesNotFit {
    pub what: &'static str,
    pub value: i64,
}

/// The first JDK whose allocation sampler draws a thread's first sample point at random
/// (`ThreadHeapSampler`'s constructor picks it); before, a thread starts with none to go and its
/// first allocation checked is reported whatever its size (measured: JDK 21 and 25).
const FIRST_RANDOM_FIRST_SAMPLE: u32 = 25;

/// The record of `jvm`, with `code` its code cache now; `instance` tells this JVM from every other
/// the daemon pushes (see [`HotspotProc::instance`]).
pub fn hotspot_proc(
    jvm: &Jvm,
    code: &CodeCacheInfo,
    instance: u32,
) -> Result<HotspotProc, DoesNotFit> {
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
    if jvm.version.major < FIRST_RANDOM_FIRST_SAMPLE {
        flags |= hotspot_flags::SAMPLER_TAKES_FIRST;
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
        // Set by the tracker once the JVM's allocation hooks are known.
        breakpoints: [0; profiler_common::MAX_BREAKPOINTS],
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
        java_thread_pending_monitor: layout
            .offset(Field::JavaThreadCurrentPendingMonitor)
            .map_or(Ok(u16::MAX), |_| {
                offset(Field::JavaThreadCurrentPendingMonitor)
            })?,
        java_thread_waiting_monitor: layout
            .offset(Field::JavaThreadCurrentWaitingMonitor)
            .map_or(Ok(u16::MAX), |_| {
                offset(Field::JavaThreadCurrentWaitingMonitor)
            })?,
        nmethod_verified_entry: match (
            layout.offset(Field::NmethodVerifiedEntryPoint),
            layout.offset(Field::NmethodVerifiedEntryOffset),
        ) {
            (Some(_), _) => offset(Field::NmethodVerifiedEntryPoint)?,
            (None, Some(_)) => offset(Field::NmethodVerifiedEntryOffset)?,
            (None, None) => u16::MAX,
        },
        thread_allocated_bytes: layout
            .offset(Field::ThreadAllocatedBytes)
            .map_or(Ok(u16::MAX), |_| offset(Field::ThreadAllocatedBytes))?,
        class_mirror_klass: code.class_mirror_klass.unwrap_or(u16::MAX),

        instance,
        // Set by the tracker once it read the JVM's virtual-thread layout.
        frozen: FrozenFramesLayout::default(),
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
