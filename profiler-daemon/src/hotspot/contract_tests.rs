//! The daemon and the BPF walker agree on one process: the walker's synthetic JVM
//! (`profiler_unwind::fakes`) is described by VMStructs as HotSpot would export them, the daemon
//! derives its layout and the record BPF reads (`hotspot_proc`) from those, and reads the same
//! memory as it reads a JVM's (`remote.rs` reads the fake as a process). A layout change on either side fails here, without root or a JVM:
//! the record must be the one the walker's tests use, the walk with it must give the same frames,
//! and each interpreted frame's cookie must be the one the daemon computes for its method. The
//! record's equality covers every offset, flag and constant `hotspot_proc` writes, for both
//! layout generations (JDK 17's pointers, JDK 23's offsets).

use std::collections::HashMap;
use std::sync::Arc;

use profiler_common::{FrameKind, HotspotProc, UnwindEnd};
use profiler_unwind::fakes::{self, InterpreterFrame, Jvm as FakeJvm, Layout};

use super::jvm::{CodeCacheInfo, CodeHeapInfo, Jvm};
use super::layout::{FrameFacts, JvmLayout, JvmVersion};
use super::names::read_identity;
use super::unwind_info::hotspot_proc;
use super::vmstructs::{self, VmStructs};

/// The VMStructs a HotSpot of `layout`'s generation would export for the fake's record `hs`:
/// each field the record holds at the offset the record gives, with its HotSpot type; the
/// fields the record does not use at offsets of their own.
pub(super) fn vmstructs_of(hs: &HotspotProc, layout: Layout) -> VmStructs {
    let offsets = layout == Layout::Offsets;
    let mut fields: Vec<(&str, u64, &str)> = vec![
        (
            "HeapBlock::Header::_used",
            hs.heap_block_used.into(),
            "bool",
        ),
        ("HeapBlock::Header::_length", 0, "size_t"),
        ("CodeBlob::_size", hs.blob_size.into(), "int"),
        ("CodeBlob::_frame_size", hs.blob_frame_size.into(), "int"),
        ("nmethod::_compile_id", hs.nmethod_compile_id.into(), "int"),
        (
            "nmethod::_orig_pc_offset",
            hs.nmethod_orig_pc_offset.into(),
            "int",
        ),
        (
            "Method::_constMethod",
            hs.method_const_method.into(),
            "ConstMethod*",
        ),
        (
            "ConstMethod::_code_size",
            hs.const_method_code_size.into(),
            "u2",
        ),
        (
            "ConstMethod::_constants",
            hs.const_method_constants.into(),
            "ConstantPool*",
        ),
        (
            "ConstantPool::_pool_holder",
            hs.constant_pool_holder.into(),
            "InstanceKlass*",
        ),
        ("Klass::_name", hs.klass_name.into(), "Symbol*"),
        ("Symbol::_length", hs.symbol_length.into(), "u2"),
        ("Symbol::_body", hs.symbol_body.into(), "u1"),
        (
            "JavaThread::_anchor",
            hs.java_thread_anchor.into(),
            "JavaFrameAnchor",
        ),
        (
            "JavaThread::_thread_state",
            hs.java_thread_state.into(),
            "JavaThreadState",
        ),
        (
            "JavaThread::_current_pending_monitor",
            hs.java_thread_pending_monitor.into(),
            "ObjectMonitor*",
        ),
        (
            "JavaThread::_current_waiting_monitor",
            hs.java_thread_waiting_monitor.into(),
            "ObjectMonitor*",
        ),
        (
            "Thread::_allocated_bytes",
            hs.thread_allocated_bytes.into(),
            "jlong",
        ),
        (
            "JavaFrameAnchor::_last_Java_sp",
            hs.anchor_sp.into(),
            "intptr_t*",
        ),
        (
            "JavaFrameAnchor::_last_Java_pc",
            hs.anchor_pc.into(),
            "address",
        ),
        (
            "JavaFrameAnchor::_last_Java_fp",
            hs.anchor_fp.into(),
            "intptr_t*",
        ),
        (
            "JavaCallWrapper::_anchor",
            hs.call_wrapper_anchor.into(),
            "JavaFrameAnchor",
        ),
    ];
    if offsets {
        fields.extend([
            ("CodeBlob::_code_offset", hs.blob_code.into(), "int"),
            (
                "CodeBlob::_frame_complete_offset",
                hs.blob_frame_complete.into(),
                "int16_t",
            ),
            ("nmethod::_method", hs.nmethod_method.into(), "Method*"),
            (
                "nmethod::_deopt_handler_entry_offset",
                hs.nmethod_deopt_handler.into(),
                "int",
            ),
            (
                "nmethod::_verified_entry_offset",
                hs.nmethod_verified_entry.into(),
                "uint16_t",
            ),
            ("nmethod::_scopes_data_offset", 0x300, "int"),
        ]);
    } else {
        fields.extend([
            ("CodeBlob::_code_begin", hs.blob_code.into(), "address"),
            (
                "CodeBlob::_frame_complete_offset",
                hs.blob_frame_complete.into(),
                "int",
            ),
            (
                "CompiledMethod::_method",
                hs.nmethod_method.into(),
                "Method*",
            ),
            (
                "CompiledMethod::_deopt_handler_begin",
                hs.nmethod_deopt_handler.into(),
                "address",
            ),
            (
                "nmethod::_verified_entry_point",
                hs.nmethod_verified_entry.into(),
                "address",
            ),
            ("CompiledMethod::_scopes_data_begin", 0x300, "address"),
        ]);
    }
    // Fields the daemon needs that the record does not carry: anywhere, apart.
    let unused_by_bpf = [
        "CodeCache::_heaps",
        "CodeCache::_low_bound",
        "CodeCache::_high_bound",
        "GrowableArrayBase::_len",
        "GrowableArray<int>::_data",
        "CodeHeap::_memory",
        "CodeHeap::_segmap",
        "CodeHeap::_log2_segment_size",
        "VirtualSpace::_low_boundary",
        "VirtualSpace::_high_boundary",
        "VirtualSpace::_low",
        "VirtualSpace::_high",
        "CodeBlob::_name",
        "CodeBlob::_header_size",
        "CodeBlob::_data_offset",
        "nmethod::_comp_level",
        "nmethod::_scopes_pcs_offset",
        "Method::_code",
        "ConstMethod::_flags._flags",
        "ConstMethod::_name_index",
        "ConstMethod::_signature_index",
        "ConstMethod::_method_idnum",
        "InstanceKlass::_constants",
        "InstanceKlass::_methods",
        "Thread::_osthread",
        "OSThread::_thread_id",
        "AbstractInterpreter::_code",
        "StubQueue::_stub_buffer",
        "StubQueue::_buffer_limit",
        "StubRoutines::_call_stub_return_address",
        "PcDesc::_pc_offset",
        "PcDesc::_scope_decode_offset",
        "Abstract_VM_Version::_s_vm_release",
        "Abstract_VM_Version::_vm_major_version",
        "Abstract_VM_Version::_vm_minor_version",
        "Abstract_VM_Version::_vm_security_version",
    ];
    for (index, name) in unused_by_bpf.into_iter().enumerate() {
        fields.push((name, 0x1000 + 8 * index as u64, "int"));
    }
    let mut tables = VmStructs::default();
    for (name, offset, type_string) in fields {
        tables.fields.insert(
            name.to_owned(),
            vmstructs::Field {
                offset,
                static_offset: None,
                type_string: Some(type_string.to_owned()),
            },
        );
    }
    let sizes: HashMap<&str, u64> = [
        ("CodeBlob", 128),
        ("nmethod", 256),
        ("Method", 32),
        ("ConstMethod", hs.const_method_size.into()),
        ("ConstantPool", 32),
        ("HeapBlock", hs.heap_block_size.into()),
        ("PcDesc", 16),
    ]
    .into();
    for (name, size) in sizes {
        tables.types.insert(
            name.to_owned(),
            vmstructs::TypeInfo {
                size,
                superclass: None,
            },
        );
    }
    for (name, value) in [
        ("_thread_in_native", hs.thread_in_native),
        ("_thread_in_vm", hs.thread_in_vm),
        ("_thread_blocked", hs.thread_blocked),
    ] {
        tables.int_constants.insert(name.to_owned(), value.into());
    }
    tables.int_constants.insert(
        "frame::entry_frame_call_wrapper_offset".to_owned(),
        hs.entry_frame_call_wrapper_slot.into(),
    );
    tables
}

/// The daemon's view of the fake JVM, from its VMStructs: the JVM and its code cache.
pub(super) fn daemon_view(fake: &FakeJvm, layout: Layout) -> (Jvm, CodeCacheInfo) {
    let hs = &fake.hs;
    let version = JvmVersion {
        major: 25,
        minor: 0,
        security: 0,
        release: "25-fake".to_owned(),
    };
    let jvm = Jvm {
        pid: 1,
        libjvm_path: "/fake/libjvm.so".to_owned(),
        build_id: None,
        bias: 0,
        // Not in VMStructs: the fake's interpreter frame slots.
        facts: FrameFacts {
            interpreter_method_slot: fakes::METHOD_SLOT,
            interpreter_bcp_slot: fakes::BCP_SLOT,
            unsigned5_excludes_zero: true,
        },
        version,
        layout: Arc::new(
            JvmLayout::from_vmstructs(&vmstructs_of(hs, layout)).expect("a complete layout"),
        ),
    };
    let heap = hs.heaps[0];
    let code = CodeCacheInfo {
        low_bound: hs.code_low,
        high_bound: hs.code_high,
        heaps: vec![CodeHeapInfo {
            low: heap.low,
            high: heap.high,
            committed_high: heap.high,
            segmap: heap.segmap,
            log2_segment_size: heap.log2_segment_size,
        }],
        interpreter_low: hs.interpreter_low,
        interpreter_high: hs.interpreter_high,
        call_stub_return_address: hs.call_stub_return,
        class_mirror_klass: Some(hs.class_mirror_klass),
    };
    (jvm, code)
}

#[test]
fn the_daemon_derives_the_walkers_record_from_vmstructs() {
    for layout in [Layout::Pointers, Layout::Offsets] {
        let fake = FakeJvm::new(layout);
        let (jvm, code) = daemon_view(&fake, layout);
        let derived =
            hotspot_proc(&jvm, &code, fakes::FAKE_INSTANCE).expect("the layout fits the record");
        assert_eq!(
            derived,
            fake.hs,
            "pointers layout: {}",
            layout == Layout::Pointers
        );
    }
}

#[test]
fn walks_with_the_derived_record_name_methods_the_daemon_verifies() {
    for layout in [Layout::Pointers, Layout::Offsets] {
        let mut fake = FakeJvm::new(layout);
        let (jvm, code) = daemon_view(&fake, layout);
        let derived = hotspot_proc(&jvm, &code, fakes::FAKE_INSTANCE).expect("fits");

        // leaf (interpreted) <- caller (interpreted) <- the call stub <- native entry frames.
        let leaf = fake.add_method(b"com/example/Leaf", 0xabcd_0001, 40);
        let caller = fake.add_method(b"com/example/a/very/long/package/Caller", 0x1234_0001, 60);
        let (sp, fp1) = (fakes::STACK + 0x8000, fakes::STACK + 0x8100);
        let (fp2, stub_fp) = (fakes::STACK + 0x8300, fakes::STACK + 0x8500);
        fake.interpreter_frame(
            fp1,
            InterpreterFrame {
                method: leaf,
                bcp: leaf.code + 3,
                sender_sp: fp1 + 16,
                saved_fp: fp2,
                return_address: fakes::INTERPRETER_LOW + 0x800,
            },
        );
        fake.interpreter_frame(
            fp2,
            InterpreterFrame {
                method: caller,
                bcp: caller.code + 17,
                sender_sp: fp2 + 16,
                saved_fp: stub_fp,
                return_address: fakes::CALL_STUB_RETURN,
            },
        );
        fake.entry_frames(stub_fp);
        let regs = fakes::regs(fakes::INTERPRETER_LOW + 0x100, sp, fp1);

        let with_derived = fakes::walk_process(&fake.memory, Some(&derived), 4242, regs);
        let with_fakes_own = fake.walk(4242, regs);
        assert_eq!(with_derived, with_fakes_own);
        let (frames, end) = with_derived;
        assert_eq!(end, UnwindEnd::Complete);

        let interpreted: Vec<_> = frames
            .iter()
            .filter(|f| f.kind() == Some(FrameKind::Interpreted))
            .collect();
        assert_eq!(interpreted.len(), 2, "{frames:?}");
        for (frame, method) in interpreted.iter().zip([leaf, caller]) {
            assert_eq!(frame.addr(), method.addr);
            let identity = read_identity(&jvm, &fake.memory, frame.addr()).expect("identity read");
            assert_eq!(
                identity.cookie, frame.cookie,
                "the daemon's cookie for the walker's method"
            );
        }
    }
}

#[test]
fn an_offset_past_the_bpf_records_16_bits_is_refused_by_name() {
    let fake = FakeJvm::new(Layout::Offsets);
    let mut tables = vmstructs_of(&fake.hs, Layout::Offsets);
    if let Some(anchor) = tables.fields.get_mut("JavaThread::_anchor") {
        anchor.offset = 0x1_0000;
    }
    let (mut jvm, code) = daemon_view(&fake, Layout::Offsets);
    jvm.layout = Arc::new(JvmLayout::from_vmstructs(&tables).expect("a complete layout"));
    let err = hotspot_proc(&jvm, &code, fakes::FAKE_INSTANCE).expect_err("does not fit");
    assert_eq!(err.what, "JavaThread::_anchor");
}
