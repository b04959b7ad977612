//! What the walker of mounted virtual threads needs to know about one JVM (JDK 21 and later):
//! read once per JVM, shown by `jvm-info`, and pushed to the BPF walker as
//! [`FrozenFramesLayout`] (docs/virtual-threads.md).
//!
//! The Java field offsets of `jdk.internal.vm.StackChunk` and `Continuation`, where a chunk's
//! frames start, and the return-barrier stub's address are in no JDK's VMStructs: HotSpot
//! computes them at start (from the classes' field layouts, which object header modes change)
//! into static variables, which libjvm's `.symtab` names. They are read here from the JVM's
//! memory at those symbols' addresses, so they are this JVM's, whatever its flags.

use std::collections::HashMap;
use std::fs::File;
use std::sync::Arc;

use object::elf::{FileHeader64, Sym64, SHT_PROGBITS, SHT_SYMTAB, STT_FUNC, STT_OBJECT};
use object::read::elf::{FileHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, ReadRef, StringTable};
use object::LittleEndian;
use profiler_common::FrozenFramesLayout;
use serde::Serialize;

use super::jvm::Jvm;
use super::layout::Field;
use super::libjvm::LibJvmMapping;
use super::libjvm_hooks::MAX_BYTES_READ;
use super::remote::RemoteMemory;
use crate::untrusted::BoundedReads;

/// The first JDK with virtual threads.
pub const FIRST_VIRTUAL_THREADS_JDK: u32 = 21;

/// Libjvm files whose statics are remembered; past it the cache starts over (a host runs a
/// handful of JDKs).
const MAX_FILES_REMEMBERED: usize = 32;

/// [`LibjvmStatics`] by libjvm file: the JVMs of one JDK share one `.symtab` pass. Keyed by the
/// file's device and inode as the kernel reports the mapping, not by what the file claims (its
/// build id): a process cannot make its own file stand for another's.
#[derive(Default)]
pub struct StaticsByFile {
    found: HashMap<(u64, u64), Result<Arc<LibjvmStatics>, String>>,
}

impl StaticsByFile {
    /// The statics of the libjvm process `pid` runs: remembered, or found now (a failure is
    /// remembered too: a stripped libjvm is not parsed again).
    pub fn of(&mut self, pid: u32) -> Result<Arc<LibjvmStatics>, String> {
        let mapping =
            LibJvmMapping::find_in(pid).ok_or_else(|| "its libjvm mapping is gone".to_owned())?;
        let Some(file) = mapping.file_identity() else {
            return LibjvmStatics::of_mapping(pid, &mapping).map(Arc::new);
        };
        if let Some(found) = self.found.get(&file) {
            return found.clone();
        }
        let found = LibjvmStatics::of_mapping(pid, &mapping).map(Arc::new);
        if self.found.len() >= MAX_FILES_REMEMBERED {
            self.found.clear();
        }
        self.found.insert(file, found.clone());
        found
    }
}

/// `jvm`'s virtual-thread layout, from its libjvm's `.symtab` and its memory (for `jvm-info`;
/// the tracker keeps each JVM's statics).
pub fn layout_of(jvm: &Jvm, memory: &impl RemoteMemory) -> Result<VirtualThreadLayout, String> {
    let mapping =
        LibJvmMapping::find_in(jvm.pid).ok_or_else(|| "its libjvm mapping is gone".to_owned())?;
    let statics = LibjvmStatics::of_mapping(jvm.pid, &mapping)?;
    Ok(VirtualThreadLayout::of(jvm, &statics, memory))
}

/// The statics read, by their mangled names in `.symtab`.
const STATICS: [(&str, Static); 21] = [
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
    ("UseCompressedOops", Static::UseCompressedOops),
    ("_ZN14CompressedOops5_baseE", Static::NarrowOopBase),
    ("_ZN14CompressedOops6_shiftE", Static::NarrowOopShift),
    // JDK 21 and earlier: one `NarrowPtrStruct` (its `_base`, then the 32-bit `_shift`).
    ("_ZN14CompressedOops11_narrow_oopE", Static::NarrowOop),
    ("UseZGC", Static::UseZgc),
    // The functions that unmount a virtual thread, as this JVM's collector and reference width
    // chose them among their instantiations: a yield's, and (JDK 24+) one from inside the VM.
    ("_ZL12freeze_entry", Static::FreezeEntry),
    ("_ZL20freeze_preempt_entry", Static::FreezePreemptEntry),
    // JDK 21 to 23: ZGC's generational mode is a choice (the only one from JDK 24).
    ("ZGenerational", Static::ZgcGenerational),
    // Not the virtual threads': what the JVM's ended threads allocated (JDK 21+, and JDK 17
    // builds with the backport), for the allocation profiles' scale (`alloc_scale`).
    (
        "_ZN13ThreadService23_exited_allocated_bytesE",
        Static::ExitedAllocatedBytes,
    ),
];

/// `Continuation::pin(JavaThread*)`: its first load from the thread is of `_cont_entry`, the
/// offset JDK 21's VMStructs does not export.
const CONTINUATION_PIN: &str = "_ZN12Continuation3pinEP10JavaThread";
/// Bytes of `Continuation::pin` searched for that load.
const PIN_BYTES: u64 = 32;

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
    UseCompressedOops,
    NarrowOopBase,
    NarrowOopShift,
    NarrowOop,
    UseZgc,
    ZgcGenerational,
    FreezeEntry,
    FreezePreemptEntry,
    ExitedAllocatedBytes,
}

/// Where the statics of [`STATICS`] are in one libjvm file (link-time addresses), and the
/// `_cont_entry` offset its code uses: found in one pass over its `.symtab`, the same for every
/// JVM that maps the file.
#[derive(Clone, Debug, Default)]
pub struct LibjvmStatics {
    addresses: [Option<u64>; STATICS.len()],
    /// `JavaThread::_cont_entry` as `Continuation::pin` loads it.
    cont_entry_in_code: Option<u64>,
}

impl LibjvmStatics {
    /// Where `ThreadService::_exited_allocated_bytes` is (a link-time address), if libjvm has it.
    pub fn exited_allocated_bytes(&self) -> Option<u64> {
        STATICS
            .iter()
            .zip(self.addresses)
            .find_map(|((_, which), address)| {
                matches!(which, Static::ExitedAllocatedBytes)
                    .then_some(address)
                    .flatten()
            })
    }

    /// Finds them in the libjvm file `mapping` is of, opened through process `pid`.
    fn of_mapping(pid: u32, mapping: &LibJvmMapping) -> Result<Self, String> {
        let file = mapping
            .open(pid)
            .map_err(|refused| format!("cannot open its libjvm: {refused}"))?;
        Self::find(file)
    }

    /// Finds them in `file`, a libjvm.
    pub fn find(file: File) -> Result<Self, String> {
        let reader = BoundedReads::new(ReadCache::new(file), MAX_BYTES_READ);
        Self::find_in(&reader)
    }

    fn find_in<'data, R: ReadRef<'data>>(data: R) -> Result<Self, String> {
        let header = FileHeader64::<LittleEndian>::parse(data).map_err(|err| err.to_string())?;
        let endian = header.endian().map_err(|err| err.to_string())?;
        let sections = header
            .sections(endian, data)
            .map_err(|err| err.to_string())?;
        let symtab = sections
            .iter()
            .find(|section| section.sh_type(endian) == SHT_SYMTAB)
            .ok_or("no .symtab (a stripped libjvm)")?;
        // Each section is read whole, once: names looked up one by one through the bounded
        // reader would each be charged a read.
        let symbols: &[Sym64<LittleEndian>] = symtab
            .data_as_array(endian, data)
            .map_err(|_| "its .symtab cannot be read")?;
        let names = sections
            .section(object::SectionIndex(symtab.sh_link(endian) as usize))
            .and_then(|strtab| strtab.data(endian, data))
            .map_err(|_| "its .strtab cannot be read")?;
        let strings = StringTable::new(names, 0, names.len() as u64);
        let mut statics = Self::default();
        let mut pin = None;
        for symbol in symbols {
            let kind = symbol.st_type();
            if kind != STT_OBJECT && kind != STT_FUNC {
                continue;
            }
            let Ok(name) = symbol.name(endian, strings) else {
                continue;
            };
            if kind == STT_FUNC {
                if name == CONTINUATION_PIN.as_bytes() {
                    pin = Some(symbol.st_value(endian));
                }
                continue;
            }
            if let Some(index) = STATICS
                .iter()
                .position(|(wanted, _)| wanted.as_bytes() == name)
            {
                statics.addresses[index] = Some(symbol.st_value(endian));
            }
        }
        // Its code, from the section that holds it.
        statics.cont_entry_in_code = pin.and_then(|address| {
            let text = sections.iter().find(|section| {
                let start = section.sh_addr(endian);
                section.sh_type(endian) == SHT_PROGBITS
                    && address >= start
                    && address + PIN_BYTES <= start + section.sh_size(endian)
            })?;
            let offset = address - text.sh_addr(endian) + text.sh_offset(endian);
            let code = data.read_bytes_at(offset, PIN_BYTES).ok()?;
            first_load_from_first_argument(code)
        });
        Ok(statics)
    }
}

/// The displacement of the first `mov disp32(%rdi), %r64` in `code` (REX.W `8b`, ModRM mod 2
/// with rm = rdi): how a method taking a `JavaThread*` loads one of its fields. An 8-aligned
/// offset inside a plausible `JavaThread`, or None.
fn first_load_from_first_argument(code: &[u8]) -> Option<u64> {
    code.windows(7).find_map(|bytes| {
        let rex_w = bytes[0] & 0xf8 == 0x48;
        let load_from_rdi_disp32 = bytes[1] == 0x8b && bytes[2] & 0xc7 == 0x87;
        if !(rex_w && load_from_rdi_disp32) {
            return None;
        }
        let offset = u32::from_le_bytes([bytes[3], bytes[4], bytes[5], bytes[6]]) as u64;
        (offset.is_multiple_of(8) && (256..8192).contains(&offset)).then_some(offset)
    })
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
    /// `JavaThread::_cont_entry`: from VMStructs (JDK 25 on), else as libjvm's code loads it.
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
    /// `UseCompressedOops`, and how a compressed reference decodes: `base + (narrow << shift)`.
    pub compressed_oops: Option<bool>,
    pub narrow_oop_base: Option<u64>,
    pub narrow_oop_shift: Option<i32>,
    /// `UseZGC`, and `ZGenerational` where the flag exists (JDK 21 to 23).
    pub zgc: Option<bool>,
    pub zgc_generational: Option<bool>,
    /// `JavaThread::_vthread` and `_threadObj`: which virtual thread a carrier has mounted.
    pub java_thread_vthread: Option<u64>,
    pub java_thread_thread_obj: Option<u64>,
    /// The functions that unmount a virtual thread in this JVM (addresses in the process; 0
    /// until set at the VM's start): a yield's, and one from inside the VM (JDK 24+).
    pub freeze_entry: Option<u64>,
    pub freeze_preempt_entry: Option<u64>,
}

impl VirtualThreadLayout {
    /// The layout of `jvm`, whose libjvm's statics are `statics`, read through `memory`.
    pub fn of(jvm: &Jvm, statics: &LibjvmStatics, memory: &impl RemoteMemory) -> Self {
        let cont_entry = jvm.layout.offset(Field::JavaThreadContEntry);
        Self {
            java_thread_vthread: jvm.layout.offset(Field::JavaThreadVthread),
            java_thread_thread_obj: jvm.layout.offset(Field::JavaThreadThreadObj),
            ..Self::read(statics, jvm.bias, cont_entry, memory)
        }
    }

    /// The unmounting functions this JVM calls (addresses in the process).
    pub fn unmount_functions(&self) -> [u64; 2] {
        [
            self.freeze_entry.unwrap_or(0),
            self.freeze_preempt_entry.unwrap_or(0),
        ]
    }

    /// Reads the layout of a JVM whose libjvm (`statics`) is loaded at `bias` in the process
    /// `memory` reads; `cont_entry` is the VMStructs offset if the JVM exports it.
    fn read(
        statics: &LibjvmStatics,
        bias: u64,
        cont_entry: Option<u64>,
        memory: &impl RemoteMemory,
    ) -> Self {
        let mut layout = Self {
            cont_entry: cont_entry.or(statics.cont_entry_in_code),
            ..Self::default()
        };
        for ((_, which), address) in STATICS.iter().zip(statics.addresses) {
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
                Static::UseCompressedOops => {
                    layout.compressed_oops = memory.read_u8(address).ok().map(|on| on != 0)
                }
                Static::NarrowOopBase => layout.narrow_oop_base = memory.read_u64(address).ok(),
                Static::NarrowOopShift => layout.narrow_oop_shift = int(),
                Static::UseZgc => layout.zgc = memory.read_u8(address).ok().map(|on| on != 0),
                Static::ZgcGenerational => {
                    layout.zgc_generational = memory.read_u8(address).ok().map(|on| on != 0)
                }
                Static::FreezeEntry => layout.freeze_entry = memory.read_u64(address).ok(),
                Static::FreezePreemptEntry => {
                    layout.freeze_preempt_entry = memory.read_u64(address).ok()
                }
                Static::ExitedAllocatedBytes => {}
                Static::NarrowOop => {
                    layout.narrow_oop_base = memory.read_u64(address).ok();
                    layout.narrow_oop_shift = memory.read_i32(address + 8).ok();
                }
            }
        }
        layout
    }

    /// The BPF walker's part of it, when it has every piece (else the walker leaves this JVM's
    /// frozen frames alone, as it did before): the offsets must fit their fields, and the return
    /// barrier be generated.
    pub fn frozen_frames(&self) -> Option<FrozenFramesLayout> {
        let chunk = &self.stack_chunk;
        let field = |offset: Option<i32>| offset.and_then(|at| u16::try_from(at).ok());
        let compressed = self.compressed_oops?;
        Some(FrozenFramesLayout {
            return_barrier: self.return_barrier.filter(|pc| *pc != 0)?,
            entry_return_pc: self.entry_return_pc.unwrap_or(0),
            narrow_oop_base: if compressed { self.narrow_oop_base? } else { 0 },
            java_thread_cont_entry: self.cont_entry.and_then(|at| u16::try_from(at).ok())?,
            continuation_tail: field(self.continuation_tail)?,
            chunk_parent: field(chunk.parent)?,
            chunk_size: field(chunk.size)?,
            chunk_sp: field(chunk.sp)?,
            chunk_bottom: field(chunk.bottom)?,
            chunk_pc: field(chunk.pc)?,
            chunk_cont: field(chunk.cont)?,
            chunk_stack: field(chunk.stack)?,
            narrow_oop_shift: if compressed {
                self.narrow_oop_shift
                    .and_then(|shift| u8::try_from(shift).ok())?
            } else {
                0
            },
            _reserved: 0,
            // Not needed to walk: without them, waits of virtual threads are not keyed.
            thread_tid: field(self.thread_tid).unwrap_or(0),
            java_thread_vthread: self
                .java_thread_vthread
                .and_then(|at| u16::try_from(at).ok())
                .unwrap_or(0),
            java_thread_thread_obj: self
                .java_thread_thread_obj
                .and_then(|at| u16::try_from(at).ok())
                .unwrap_or(0),
            _reserved_tail: [0; 3],
        })
    }

    /// Whether references are compressed (`hotspot_flags::COMPRESSED_OOPS`).
    pub fn oops_compressed(&self) -> bool {
        self.compressed_oops == Some(true)
    }

    /// Whether references are generational ZGC's coloured pointers
    /// (`hotspot_flags::ZGC_COLORED_OOPS`): ZGC without the choice of mode, or with it made.
    /// Single-generation ZGC's coloured pointers are addresses as they are (its heap is mapped
    /// at every colour).
    pub fn oops_zgc_colored(&self) -> bool {
        self.zgc == Some(true) && self.zgc_generational != Some(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cont_entry_offset_is_read_from_the_first_load_off_the_thread() {
        // JDK 26's `Continuation::pin`: endbr64, push rbp, mov rbp,rsp (padding), then
        // `mov 0x5f8(%rdi),%rdx`, `test %rdx,%rdx`.
        let pin = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x48, 0x8b, 0x97, 0xf8, 0x05, 0x00, 0x00, 0x48, 0x85, 0xd2,
        ];
        assert_eq!(first_load_from_first_argument(&pin), Some(0x5f8));
        // JDK 21's loads through r8 (`mov 0x530(%rdi),%r8`: REX.WR).
        let pin_21 = [0x4c, 0x8b, 0x87, 0x30, 0x05, 0x00, 0x00];
        assert_eq!(first_load_from_first_argument(&pin_21), Some(0x530));
        // A load from another register, or an offset no JavaThread field has, is not taken.
        let from_rsi = [0x48, 0x8b, 0x96, 0xf8, 0x05, 0x00, 0x00];
        assert_eq!(first_load_from_first_argument(&from_rsi), None);
        let unaligned = [0x48, 0x8b, 0x97, 0xf9, 0x05, 0x00, 0x00];
        assert_eq!(first_load_from_first_argument(&unaligned), None);
    }

    #[test]
    fn the_walker_gets_a_layout_only_when_every_piece_is_known() {
        let complete = VirtualThreadLayout {
            cont_entry: Some(1560),
            stack_chunk: StackChunkOffsets {
                parent: Some(40),
                size: Some(12),
                sp: Some(24),
                bottom: Some(28),
                pc: Some(16),
                flags: Some(36),
                cont: Some(44),
                stack: Some(48),
            },
            continuation_tail: Some(32),
            thread_tid: Some(24),
            return_barrier: Some(0x7f00_0000_1000),
            entry_return_pc: None,
            compressed_oops: Some(true),
            narrow_oop_base: Some(0),
            narrow_oop_shift: Some(3),
            zgc: Some(false),
            zgc_generational: None,
            java_thread_vthread: Some(1128),
            java_thread_thread_obj: Some(1120),
            freeze_entry: None,
            freeze_preempt_entry: None,
        };
        let frozen = complete.frozen_frames().expect("complete");
        assert_eq!(frozen.chunk_cont, 44);
        assert_eq!(frozen.narrow_oop_shift, 3);
        // enterSpecial not generated yet: the walker resumes at its caller.
        assert_eq!(frozen.entry_return_pc, 0);
        let without = |edit: fn(&mut VirtualThreadLayout)| {
            let mut layout = complete.clone();
            edit(&mut layout);
            layout.frozen_frames()
        };
        assert!(without(|l| l.cont_entry = None).is_none());
        assert!(without(|l| l.stack_chunk.parent = None).is_none());
        assert!(without(|l| l.return_barrier = Some(0)).is_none());
        assert!(without(|l| l.compressed_oops = None).is_none());
        assert!(without(|l| l.stack_chunk.sp = Some(-1)).is_none());
        // Without compressed references, no base or shift is needed.
        let wide = without(|l| {
            l.compressed_oops = Some(false);
            l.narrow_oop_shift = None;
        });
        assert_eq!(wide.map(|f| f.narrow_oop_shift), Some(0));
    }
}
