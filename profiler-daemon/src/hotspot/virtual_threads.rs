//! What a walker of mounted virtual threads needs to know about one JVM (JDK 21 and later), as
//! far as the daemon reads it today: shown by `jvm-info`, for the BPF walker to come
//! (docs/virtual-threads.md).
//!
//! The Java field offsets of `jdk.internal.vm.StackChunk` and `Continuation`, where a chunk's
//! frames start, and the return-barrier stub's address are in no JDK's VMStructs: HotSpot
//! computes them at start (from the classes' field layouts, which object header modes change)
//! into static variables, which libjvm's `.symtab` names. They are read here from the JVM's
//! memory at those symbols' addresses, so they are this JVM's, whatever its flags.

use std::fs::File;

use object::read::ReadCache;
use object::{Object as _, ObjectSymbol as _, SymbolKind};
use serde::Serialize;

use super::libjvm_hooks::MAX_BYTES_READ;
use super::remote::RemoteMemory;
use crate::untrusted::BoundedReads;

/// The statics read, by their mangled names in `.symtab`.
const STATICS: [(&str, Static); 12] = [
    (
        "_ZN26jdk_internal_vm_StackChunk14_parent_offsetE",
        Static::ChunkParent,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk12_size_offsetE",
        Static::ChunkSize,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk10_sp_offsetE",
        Static::ChunkSp,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk14_bottom_offsetE",
        Static::ChunkBottom,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk10_pc_offsetE",
        Static::ChunkPc,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk13_flags_offsetE",
        Static::ChunkFlags,
    ),
    (
        "_ZN26jdk_internal_vm_StackChunk12_cont_offsetE",
        Static::ChunkCont,
    ),
    (
        "_ZN23InstanceStackChunkKlass16_offset_of_stackE",
        Static::ChunkStack,
    ),
    (
        "_ZN28jdk_internal_vm_Continuation12_tail_offsetE",
        Static::ContinuationTail,
    ),
    ("_ZN16java_lang_Thread11_tid_offsetE", Static::ThreadTid),
    (
        "_ZN12StubRoutines19_cont_returnBarrierE",
        Static::ReturnBarrier,
    ),
    ("_ZN17ContinuationEntry10_return_pcE", Static::EntryReturnPc),
];

#[derive(Clone, Copy)]
enum Static {
    ChunkParent,
    ChunkSize,
    ChunkSp,
    ChunkBottom,
    ChunkPc,
    ChunkFlags,
    ChunkCont,
    ChunkStack,
    ContinuationTail,
    ThreadTid,
    ReturnBarrier,
    EntryReturnPc,
}

/// Byte offsets in a `jdk.internal.vm.StackChunk` object (`None`: not in this libjvm's
/// `.symtab`, or unreadable).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StackChunkOffsets {
    pub parent: Option<i32>,
    pub size: Option<i32>,
    pub sp: Option<i32>,
    pub bottom: Option<i32>,
    pub pc: Option<i32>,
    pub flags: Option<i32>,
    pub cont: Option<i32>,
    /// Where the chunk's frames start (`InstanceStackChunkKlass::_offset_of_stack`); `sp`,
    /// `bottom` and `size` count words from there.
    pub stack: Option<i32>,
}

/// What the daemon knows of a JVM's virtual threads.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VirtualThreadLayout {
    /// `JavaThread::_cont_entry` (VMStructs from JDK 25; not exported by JDK 21).
    pub cont_entry: Option<u64>,
    pub stack_chunk: StackChunkOffsets,
    /// `jdk.internal.vm.Continuation.tail`: the continuation's newest chunk.
    pub continuation_tail: Option<i32>,
    /// `java.lang.Thread.tid`: a virtual thread's id.
    pub thread_tid: Option<i32>,
    /// The return-barrier stub: the return address of the oldest frame thawed onto the
    /// carrier's stack while older ones stay frozen in the chunk (0 until generated).
    pub return_barrier: Option<u64>,
    /// `ContinuationEntry::_return_pc`: that frame's return address when nothing is frozen.
    pub entry_return_pc: Option<u64>,
}

impl VirtualThreadLayout {
    /// Reads the layout of the JVM whose libjvm is `file`, loaded at `bias` in the process
    /// `memory` reads; `cont_entry` is the VMStructs offset if the JVM exports it.
    pub fn read(
        file: File,
        bias: u64,
        cont_entry: Option<u64>,
        memory: &impl RemoteMemory,
    ) -> Result<Self, String> {
        let reader = BoundedReads::new(ReadCache::new(file), MAX_BYTES_READ);
        let elf = object::File::parse(&reader).map_err(|err| err.to_string())?;
        let mut addresses: [Option<u64>; STATICS.len()] = [None; STATICS.len()];
        let mut symbols = elf.symbols().peekable();
        if symbols.peek().is_none() {
            return Err("no .symtab (a stripped libjvm)".into());
        }
        for symbol in symbols {
            if symbol.kind() != SymbolKind::Data {
                continue;
            }
            let Ok(name) = symbol.name() else { continue };
            if let Some(index) = STATICS.iter().position(|(wanted, _)| *wanted == name) {
                addresses[index] = Some(symbol.address());
            }
        }
        let mut layout = Self {
            cont_entry,
            ..Self::default()
        };
        for ((_, which), address) in STATICS.iter().zip(addresses) {
            let Some(address) = address.map(|address| address.wrapping_add(bias)) else {
                continue;
            };
            let int = || memory.read_i32(address).ok();
            let chunk = &mut layout.stack_chunk;
            match which {
                Static::ChunkParent => chunk.parent = int(),
                Static::ChunkSize => chunk.size = int(),
                Static::ChunkSp => chunk.sp = int(),
                Static::ChunkBottom => chunk.bottom = int(),
                Static::ChunkPc => chunk.pc = int(),
                Static::ChunkFlags => chunk.flags = int(),
                Static::ChunkCont => chunk.cont = int(),
                Static::ChunkStack => chunk.stack = int(),
                Static::ContinuationTail => layout.continuation_tail = int(),
                Static::ThreadTid => layout.thread_tid = int(),
                Static::ReturnBarrier => layout.return_barrier = memory.read_u64(address).ok(),
                Static::EntryReturnPc => layout.entry_return_pc = memory.read_u64(address).ok(),
            }
        }
        Ok(layout)
    }
}
