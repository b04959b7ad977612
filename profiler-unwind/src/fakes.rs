//! A synthetic JVM process for the walker: memory as address ranges of bytes, and a code cache,
//! metadata and threads laid out by a [`HotspotProc`] built here. Nothing is read from a real
//! process; instruction bytes come from the recordings in `x86_frames`'s tests.
//!
//! Compiled for this crate's tests and, with the `fakes` feature, for the daemon's: its contract
//! tests derive the same `HotspotProc` from VMStructs and read this very memory the way the
//! daemon reads a JVM's, so the walker and the daemon are tested against one process.

use core::mem::MaybeUninit;
use std::cell::RefCell;

use profiler_common::cfi::{find_cfi_row, CfiCache, CfiRow};
use profiler_common::{
    hotspot_flags, interpreted_cookie, name_tail, name_tail_start, CodeHeapRange, FrameKind,
    FrozenFramesLayout, HotspotProc, UnwindEnd, UserFrame, BCI_UNKNOWN, NAME_TAIL_BYTES,
};

use crate::state::frame;
use crate::{
    walk_stack, FrameSink, JavaThreads, NativeTables, ReadError, RecentBlobTable, RecentBlobs,
    StackWindow, UserMemory, UserRegs, Walk, SCRATCH_BYTES,
};

/// Memory of the fake process: disjoint regions, each readable as a whole.
#[derive(Default)]
pub struct FakeMemory {
    regions: Vec<(u64, Vec<u8>)>,
    threads: Vec<(u32, u64)>,
    /// Native code with unwind tables: (start, end, bias, rows), as the daemon would load them.
    tables: Vec<(u64, u64, u64, Vec<CfiRow>)>,
    /// Kept across walks, as the BPF side's per-CPU table is.
    recent_blobs: RefCell<Box<RecentBlobTable>>,
    /// The JVM's count of code frees the walks read (None: not counted).
    pub code_frees: std::cell::Cell<Option<u32>>,
}

impl FakeMemory {
    /// Maps `len` zero bytes at `start`.
    pub fn map(&mut self, start: u64, len: usize) {
        assert!(
            self.regions
                .iter()
                .all(|(s, b)| start + len as u64 <= *s || start >= s + b.len() as u64),
            "overlapping regions at {start:#x}"
        );
        self.regions.push((start, vec![0; len]));
    }

    /// Maps `bytes` at `start`.
    pub fn add(&mut self, start: u64, bytes: Vec<u8>) {
        self.map(start, bytes.len());
        self.write(start, &bytes);
    }

    /// Maps `bytes` at `start`, over whatever is there: they take precedence.
    pub fn overlay(&mut self, start: u64, bytes: Vec<u8>) {
        self.regions.insert(0, (start, bytes));
    }

    /// Unmaps the region that starts at `start`.
    pub fn unmap(&mut self, start: u64) {
        self.regions.retain(|(s, _)| *s != start);
    }

    fn region(&self, addr: u64, len: usize) -> Option<&[u8]> {
        self.regions.iter().find_map(|(start, bytes)| {
            let at = addr.checked_sub(*start)? as usize;
            bytes.get(at..at.checked_add(len)?)
        })
    }

    pub fn write(&mut self, addr: u64, data: &[u8]) {
        let slot = self
            .regions
            .iter_mut()
            .find_map(|(start, bytes)| {
                let at = addr.checked_sub(*start)? as usize;
                bytes.get_mut(at..at + data.len())
            })
            .unwrap_or_else(|| panic!("write of {} bytes at {addr:#x}: not mapped", data.len()));
        slot.copy_from_slice(data);
    }

    pub fn put_u8(&mut self, addr: u64, value: u8) {
        self.write(addr, &[value]);
    }

    pub fn put_u16(&mut self, addr: u64, value: u16) {
        self.write(addr, &value.to_le_bytes());
    }

    pub fn put_u32(&mut self, addr: u64, value: u32) {
        self.write(addr, &value.to_le_bytes());
    }

    pub fn put_u64(&mut self, addr: u64, value: u64) {
        self.write(addr, &value.to_le_bytes());
    }

    pub fn add_thread(&mut self, tid: u32, java_thread: u64) {
        self.threads.push((tid, java_thread));
    }

    /// Code at [start, end) whose pcs minus `bias` are the addresses `rows` cover.
    pub fn add_table(&mut self, start: u64, end: u64, bias: u64, rows: Vec<CfiRow>) {
        self.tables.push((start, end, bias, rows));
    }

    fn bytes<const N: usize>(&self, addr: u64) -> Result<[u8; N], ReadError> {
        let mut out = [0u8; N];
        let bytes = self.region(addr, N).ok_or(ReadError(-14))?;
        out.copy_from_slice(bytes);
        Ok(out)
    }
}

impl UserMemory for FakeMemory {
    fn read_u8(&self, addr: u64) -> Result<u8, ReadError> {
        self.bytes::<1>(addr).map(u8::from_le_bytes)
    }

    fn read_u16(&self, addr: u64) -> Result<u16, ReadError> {
        self.bytes(addr).map(u16::from_le_bytes)
    }

    fn read_u32(&self, addr: u64) -> Result<u32, ReadError> {
        self.bytes(addr).map(u32::from_le_bytes)
    }

    fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        self.bytes(addr).map(u64::from_le_bytes)
    }

    fn read_pair(&self, addr: u64) -> Result<[u64; 2], ReadError> {
        Ok([self.read_u64(addr)?, self.read_u64(addr + 8)?])
    }

    fn read_array<const N: usize>(&self, addr: u64) -> Result<[u8; N], ReadError> {
        self.bytes(addr)
    }

    fn with_scratch<R>(
        &self,
        use_buffer: impl FnOnce(&mut [MaybeUninit<u8>; SCRATCH_BYTES]) -> R,
    ) -> Option<R> {
        Some(use_buffer(&mut [MaybeUninit::uninit(); SCRATCH_BYTES]))
    }

    fn read_into(&self, addr: u64, dst: &mut [MaybeUninit<u8>]) -> bool {
        match self.region(addr, dst.len()) {
            Some(bytes) => {
                for (to, from) in dst.iter_mut().zip(bytes) {
                    to.write(*from);
                }
                true
            }
            None => false,
        }
    }
}

impl NativeTables for FakeMemory {
    // Searched directly: the cache is `profiler_common::cfi`'s, tested there against this search.
    fn cfi_row(&self, pc: u64, _cache: &mut CfiCache) -> Option<CfiRow> {
        let (_, _, bias, rows) = self
            .tables
            .iter()
            .find(|(start, end, _, _)| *start <= pc && pc < *end)?;
        let pc = u32::try_from(pc - bias).ok()?;
        find_cfi_row(rows.len() as u32, pc, |i| rows.get(i as usize).copied())
    }
}

impl RecentBlobs for FakeMemory {
    fn with_recent_blobs<R>(&self, use_table: impl FnOnce(&mut RecentBlobTable) -> R) -> Option<R> {
        Some(use_table(&mut self.recent_blobs.borrow_mut()))
    }

    fn code_frees(&self, _instance: u32) -> Option<u32> {
        self.code_frees.get()
    }
}

impl JavaThreads for FakeMemory {
    fn java_thread(&self, tid: u32) -> Option<u64> {
        self.threads
            .iter()
            .find_map(|&(t, thread)| (t == tid).then_some(thread))
    }
}

/// Frames as the BPF program's sample record would hold them.
#[derive(Default)]
pub struct Frames(pub Vec<UserFrame>);

impl FrameSink for Frames {
    fn record(&mut self, index: u32, frame: UserFrame) -> bool {
        assert_eq!(index as usize, self.0.len(), "frames recorded in order");
        self.0.push(frame);
        true
    }
}

/// Where things are in the fake process.
pub const CODE_LOW: u64 = 0x7f00_0000_0000;
pub const CODE_HIGH: u64 = CODE_LOW + 0x10_0000;
pub const INTERPRETER_LOW: u64 = CODE_LOW + 0x1000;
pub const INTERPRETER_HIGH: u64 = CODE_LOW + 0x9000;
/// `StubRoutines::_call_stub_return_address` (not in any blob: the walker tests it first).
pub const CALL_STUB_RETURN: u64 = CODE_LOW + 0xa040;
pub const HEAP_LOW: u64 = CODE_LOW + 0x1_0000;
pub const HEAP_HIGH: u64 = CODE_HIGH;
pub const LOG2_SEGMENT: u32 = 7;
pub const SEGMAP: u64 = 0x7e00_0000_0000;
const METADATA: u64 = 0x6000_0000_0000;
/// Where [`Jvm::add_method_named_at_mapping_end`] maps its symbols, a page each.
const SYMBOLS_AT_END: u64 = 0x6100_0000_0000;
const THREADS: u64 = 0x5000_0000_0000;
/// The thread's stack: 16 pages, the walk runs towards `STACK_TOP`.
pub const STACK: u64 = 0x7ffc_0000_0000;
pub const STACK_TOP: u64 = STACK + 0x1_0000;
/// Native code (never read: native frames are walked by frame pointer only).
pub const CALL_HELPER: u64 = 0x5555_0000_1234;
pub const THREAD_START: u64 = 0x5555_0000_5678;
pub const LIBC_READ: u64 = 0x7f55_0001_2345;

/// The fake JVM's [`HotspotProc::instance`].
pub const FAKE_INSTANCE: u32 = 1;

/// Offsets of the fake layout (chosen here; the real ones come from VMStructs).
const BLOB_HEADER: u64 = 128;
const HEAP_BLOCK_HEADER: u64 = 16;
pub const METHOD_SLOT: i8 = -3;
pub const BCP_SLOT: i8 = -7;
const JAVA_THREAD_STATE: u64 = 0x80;
const JAVA_THREAD_PENDING_MONITOR: u64 = 0x88;
const JAVA_THREAD_WAITING_MONITOR: u64 = 0x90;
const JAVA_THREAD_ALLOCATED_BYTES: u64 = 0x98;
const JAVA_THREAD_ANCHOR: u64 = 0x100;
const CONST_METHOD_SIZE: u64 = 48;

/// Which generation of the `CodeBlob`/`nmethod` layout the fake JVM has.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Layout {
    /// JDK 17: `_code_begin`, `_deopt_handler_begin` and `_verified_entry_point` are pointers,
    /// `_frame_complete_offset` 32 bits.
    Pointers,
    /// JDK 23+: 32-bit code and deopt handler offsets, 16-bit frame-complete and verified
    /// entry offsets.
    Offsets,
}

/// A code blob placed in the fake code cache.
#[derive(Clone, Copy)]
pub struct Blob {
    pub addr: u64,
    pub code_begin: u64,
    pub compile_id: u32,
}

impl Blob {
    pub fn pc(&self, offset: u64) -> u64 {
        self.code_begin + offset
    }

    /// The frame the walker records for a pc at `offset`.
    pub fn frame(&self, offset: u64) -> UserFrame {
        frame(
            FrameKind::Compiled,
            self.addr,
            offset as u32,
            self.compile_id,
        )
    }
}

/// What to put in a blob.
pub struct BlobSpec<'a> {
    pub code_len: u64,
    /// In words, the return address and saved rbp included; 0 for stubs without a fixed frame.
    pub frame_size: i32,
    pub frame_complete: i32,
    pub compile_id: u32,
    /// From the code's start.
    pub verified_entry: Option<u64>,
    pub deopt_handler: Option<u64>,
    pub orig_pc_offset: i32,
    /// Instruction bytes at offsets from the code's start.
    pub code: &'a [(u64, &'a str)],
}

impl BlobSpec<'_> {
    /// A stub: no fixed frame, no nmethod fields.
    pub fn stub() -> Self {
        Self {
            code_len: 0x80,
            frame_size: 0,
            frame_complete: 0,
            compile_id: 0,
            verified_entry: None,
            deopt_handler: None,
            orig_pc_offset: 0,
            code: &[],
        }
    }

    /// An nmethod with a frame of `frame_size` words, complete at 0x40.
    pub fn nmethod(frame_size: i32, compile_id: u32) -> Self {
        Self {
            code_len: 0x400,
            frame_size,
            frame_complete: 0x40,
            compile_id,
            verified_entry: Some(0x20),
            deopt_handler: None,
            orig_pc_offset: 0,
            code: &[],
        }
    }
}

/// A `Method` in the fake metaspace.
#[derive(Clone, Copy)]
pub struct Method {
    pub addr: u64,
    /// Where its bytecodes start.
    pub code: u64,
    pub cookie: u32,
}

impl Method {
    pub fn frame(&self, bci: u32) -> UserFrame {
        frame(FrameKind::Interpreted, self.addr, bci, self.cookie)
    }
}

pub fn native(pc: u64) -> UserFrame {
    frame(FrameKind::Native, pc, 0, 0)
}

/// The fake JVM: its memory, its layout, and bump allocators for blobs and metadata.
pub struct Jvm {
    pub memory: FakeMemory,
    pub hs: HotspotProc,
    layout: Layout,
    next_block: u64,
    next_metadata: u64,
    /// Mappings made by [`Jvm::add_method_named_at_mapping_end`].
    symbols_at_end: u64,
}

impl Jvm {
    pub fn new(layout: Layout) -> Self {
        let mut memory = FakeMemory::default();
        memory.map(CODE_LOW, (CODE_HIGH - CODE_LOW) as usize);
        let segments = ((HEAP_HIGH - HEAP_LOW) >> LOG2_SEGMENT) as usize;
        memory.map(SEGMAP, segments);
        memory.write(SEGMAP, &vec![0xff; segments]);
        memory.map(METADATA, 0x1_0000);
        memory.map(THREADS, 0x1000);
        memory.map(STACK, (STACK_TOP - STACK) as usize);
        let offsets = layout == Layout::Offsets;
        let flags = if offsets {
            hotspot_flags::CODE_OFFSET
                | hotspot_flags::FRAME_COMPLETE_16
                | hotspot_flags::DEOPT_HANDLER_OFFSET
                | hotspot_flags::VERIFIED_ENTRY_OFFSET
        } else {
            0
        };
        let mut heaps = [CodeHeapRange::default(); profiler_common::MAX_CODE_HEAPS];
        heaps[0] = CodeHeapRange {
            low: HEAP_LOW,
            high: HEAP_HIGH,
            segmap: SEGMAP,
            log2_segment_size: LOG2_SEGMENT,
            _reserved: 0,
        };
        let hs = HotspotProc {
            code_low: CODE_LOW,
            code_high: CODE_HIGH,
            interpreter_low: INTERPRETER_LOW,
            interpreter_high: INTERPRETER_HIGH,
            call_stub_return: CALL_STUB_RETURN,
            breakpoints: [0; profiler_common::MAX_BREAKPOINTS],
            heaps,
            heap_count: 1,
            flags,
            interpreter_method_slot: METHOD_SLOT,
            interpreter_bcp_slot: BCP_SLOT,
            entry_frame_call_wrapper_slot: -6,
            thread_in_native: 4,
            thread_in_vm: 6,
            thread_blocked: 10,
            heap_block_size: HEAP_BLOCK_HEADER as u16,
            heap_block_used: 8,
            blob_size: 4,
            blob_frame_size: 12,
            blob_frame_complete: 8,
            blob_code: 16,
            nmethod_compile_id: 40,
            nmethod_method: 32,
            method_const_method: 8,
            java_thread_anchor: JAVA_THREAD_ANCHOR as u16,
            java_thread_state: JAVA_THREAD_STATE as u16,
            java_thread_pending_monitor: JAVA_THREAD_PENDING_MONITOR as u16,
            java_thread_waiting_monitor: JAVA_THREAD_WAITING_MONITOR as u16,
            anchor_sp: 0,
            anchor_pc: 8,
            anchor_fp: 16,
            call_wrapper_anchor: 0,
            const_method_size: CONST_METHOD_SIZE as u16,
            const_method_code_size: 16,
            nmethod_deopt_handler: 48,
            nmethod_orig_pc_offset: 56,
            const_method_constants: 8,
            constant_pool_holder: 24,
            klass_name: 16,
            symbol_hash_word: 0,
            symbol_length: 4,
            symbol_body: 6,
            nmethod_verified_entry: 64,
            thread_allocated_bytes: JAVA_THREAD_ALLOCATED_BYTES as u16,
            class_mirror_klass: 96,

            instance: FAKE_INSTANCE,
            frozen: FrozenFramesLayout::default(),
        };
        Self {
            memory,
            hs,
            layout,
            next_block: HEAP_LOW,
            next_metadata: METADATA,
            symbols_at_end: 0,
        }
    }

    /// Places a blob in the code heap: a used `HeapBlock`, its segments marked in the map as
    /// HotSpot does (0 at the block's first segment, then the distance back to it).
    pub fn add_blob(&mut self, spec: &BlobSpec) -> Blob {
        let block = self.next_block;
        self.next_block += Self::segments(spec) << LOG2_SEGMENT;
        self.add_blob_at(block, spec)
    }

    fn segments(spec: &BlobSpec) -> u64 {
        let segments =
            (HEAP_BLOCK_HEADER + BLOB_HEADER + spec.code_len).div_ceil(1 << LOG2_SEGMENT);
        assert!(segments < 0xff, "a fake blob spans under 255 segments");
        segments
    }

    /// Places a blob at the heap block `block`, over whatever was there: the code cache
    /// reusing freed space.
    pub fn add_blob_at(&mut self, block: u64, spec: &BlobSpec) -> Blob {
        let size = BLOB_HEADER + spec.code_len;
        let segments = Self::segments(spec);
        let first = (block - HEAP_LOW) >> LOG2_SEGMENT;
        for i in 0..segments {
            self.memory.put_u8(SEGMAP + first + i, i as u8);
        }
        let m = &mut self.memory;
        m.put_u64(block, segments);
        m.put_u8(block + self.hs.heap_block_used as u64, 1);
        let blob = block + HEAP_BLOCK_HEADER;
        let code_begin = blob + BLOB_HEADER;
        let hs = &self.hs;
        m.put_u32(blob + hs.blob_size as u64, size as u32);
        m.put_u32(blob + hs.blob_frame_size as u64, spec.frame_size as u32);
        m.put_u32(blob + hs.nmethod_compile_id as u64, spec.compile_id);
        m.put_u32(
            blob + hs.nmethod_orig_pc_offset as u64,
            spec.orig_pc_offset as u32,
        );
        match self.layout {
            Layout::Pointers => {
                m.put_u64(blob + hs.blob_code as u64, code_begin);
                m.put_u32(
                    blob + hs.blob_frame_complete as u64,
                    spec.frame_complete as u32,
                );
                if let Some(handler) = spec.deopt_handler {
                    m.put_u64(blob + hs.nmethod_deopt_handler as u64, code_begin + handler);
                }
                if let Some(entry) = spec.verified_entry {
                    m.put_u64(blob + hs.nmethod_verified_entry as u64, code_begin + entry);
                }
            }
            Layout::Offsets => {
                m.put_u32(blob + hs.blob_code as u64, BLOB_HEADER as u32);
                m.put_u16(
                    blob + hs.blob_frame_complete as u64,
                    spec.frame_complete as u16,
                );
                if let Some(handler) = spec.deopt_handler {
                    let from_blob = BLOB_HEADER + handler;
                    m.put_u32(blob + hs.nmethod_deopt_handler as u64, from_blob as u32);
                }
                if let Some(entry) = spec.verified_entry {
                    m.put_u16(blob + hs.nmethod_verified_entry as u64, entry as u16);
                }
            }
        }
        for (offset, hex) in spec.code {
            m.write(code_begin + offset, &hex_bytes(hex));
        }
        Blob {
            addr: blob,
            code_begin,
            compile_id: spec.compile_id,
        }
    }

    /// Frees `blob`'s heap block as `CodeHeap::deallocate` does: marked unused, its bytes left
    /// as they were.
    pub fn free_blob(&mut self, blob: &Blob) {
        let block = blob.addr - HEAP_BLOCK_HEADER;
        self.memory
            .put_u8(block + self.hs.heap_block_used as u64, 0);
    }

    /// Frees `blob` into the free block that ends where it starts, as HotSpot does: its header
    /// marked free, then its segments in the map lead back to that block's start, `back`
    /// segments before it; its header's other bytes stay.
    pub fn free_blob_merged(&mut self, blob: &Blob, back: u64) {
        self.free_blob(blob);
        let first = (blob.addr - HEAP_BLOCK_HEADER - HEAP_LOW) >> LOG2_SEGMENT;
        let segments = self
            .memory
            .read_u64(blob.addr - HEAP_BLOCK_HEADER)
            .expect("mapped");
        for i in 0..segments {
            self.memory.put_u8(SEGMAP + first + i, (back + i) as u8);
        }
    }

    fn alloc_metadata(&mut self, len: u64) -> u64 {
        let at = self.next_metadata;
        self.next_metadata += len.next_multiple_of(16);
        at
    }

    /// A method of class `class_name` (its `Symbol` hash word `hash_word`) with `code_size`
    /// bytes of bytecode.
    pub fn add_method(&mut self, class_name: &[u8], hash_word: u32, code_size: u16) -> Method {
        let symbol = self.alloc_metadata(6 + class_name.len() as u64);
        self.add_method_named_by(symbol, class_name, hash_word, code_size)
    }

    /// As [`Jvm::add_method`], the class name's `Symbol` ending where a mapping of its own ends
    /// (a name shorter than the tail the walker reads is padded to it): a read of more bytes
    /// than the symbol holds fails.
    pub fn add_method_named_at_mapping_end(
        &mut self,
        class_name: &[u8],
        hash_word: u32,
        code_size: u16,
    ) -> Method {
        let symbol_bytes =
            self.hs.symbol_body as u64 + class_name.len().max(NAME_TAIL_BYTES) as u64;
        let mapping = SYMBOLS_AT_END + self.symbols_at_end * 0x2000;
        self.symbols_at_end += 1;
        self.memory.map(mapping, 0x1000);
        let symbol = mapping + 0x1000 - symbol_bytes;
        self.add_method_named_by(symbol, class_name, hash_word, code_size)
    }

    fn add_method_named_by(
        &mut self,
        symbol: u64,
        class_name: &[u8],
        hash_word: u32,
        code_size: u16,
    ) -> Method {
        let klass = self.alloc_metadata(32);
        let pool = self.alloc_metadata(32);
        let const_method = self.alloc_metadata(CONST_METHOD_SIZE + code_size as u64);
        let method = self.alloc_metadata(32);
        let hs = self.hs;
        let m = &mut self.memory;
        m.put_u32(symbol + hs.symbol_hash_word as u64, hash_word);
        m.put_u16(symbol + hs.symbol_length as u64, class_name.len() as u16);
        m.write(symbol + hs.symbol_body as u64, class_name);
        m.put_u64(klass + hs.klass_name as u64, symbol);
        m.put_u64(pool + hs.constant_pool_holder as u64, klass);
        m.put_u64(const_method + hs.const_method_constants as u64, pool);
        m.put_u16(const_method + hs.const_method_code_size as u64, code_size);
        m.put_u64(method + hs.method_const_method as u64, const_method);
        Method {
            addr: method,
            code: const_method + CONST_METHOD_SIZE,
            cookie: interpreted_cookie(const_method, hash_word, tail_of(class_name)),
        }
    }

    /// An interpreter frame at `fp`: the `Method*`, the saved bcp (`bci` into the method's code,
    /// or a raw value), the sender sp, the caller's fp and the return address.
    pub fn interpreter_frame(&mut self, fp: u64, frame: InterpreterFrame) {
        let m = &mut self.memory;
        m.put_u64(fp, frame.saved_fp);
        m.put_u64(fp + 8, frame.return_address);
        m.put_u64(fp - 8, frame.sender_sp);
        m.put_u64(slot(fp, METHOD_SLOT), frame.method.addr);
        m.put_u64(slot(fp, BCP_SLOT), frame.bcp);
    }

    /// A compiled frame of `frame_size` words at `sp` (saved rbp and return address at its top);
    /// returns the caller's sp.
    pub fn compiled_frame(
        &mut self,
        sp: u64,
        frame_size: u64,
        saved_fp: u64,
        return_address: u64,
    ) -> u64 {
        let caller_sp = sp + frame_size * 8;
        self.memory.put_u64(caller_sp - 16, saved_fp);
        self.memory.put_u64(caller_sp - 8, return_address);
        caller_sp
    }

    /// A `call rel32` to `target` at `at`; returns the return address (the next instruction).
    pub fn call_instruction(&mut self, at: u64, target: u64) -> u64 {
        let return_address = at + 5;
        let displacement = target.wrapping_sub(return_address) as i64;
        let displacement = i32::try_from(displacement).expect("a call within 2 GiB");
        self.memory.put_u8(at, 0xe8);
        self.memory.put_u32(at + 1, displacement as u32);
        return_address
    }

    /// A frame-pointer frame at `fp` (the call stub's, or native code's).
    pub fn fp_frame(&mut self, fp: u64, saved_fp: u64, return_address: u64) {
        self.memory.put_u64(fp, saved_fp);
        self.memory.put_u64(fp + 8, return_address);
    }

    /// The call stub's frame at `fp` and the two native frames above it (`JavaCalls::call_helper`
    /// and the thread's start, whose saved fp is null): what every Java stack ends with. Returns
    /// the frames the walker records for them.
    pub fn entry_frames(&mut self, fp: u64) -> Vec<UserFrame> {
        let helper_fp = fp + 0x100;
        let start_fp = fp + 0x200;
        self.fp_frame(fp, helper_fp, CALL_HELPER);
        self.fp_frame(helper_fp, start_fp, THREAD_START);
        self.fp_frame(start_fp, 0, 0);
        vec![native(CALL_HELPER), native(THREAD_START)]
    }

    /// A Java thread of host tid `tid` in `state`, its anchor holding (sp, pc, fp).
    pub fn add_java_thread(&mut self, tid: u32, state: u32, anchor: (u64, u64, u64)) {
        let thread = Self::java_thread_of(tid);
        let hs = self.hs;
        let a = thread + hs.java_thread_anchor as u64;
        let m = &mut self.memory;
        m.put_u32(thread + hs.java_thread_state as u64, state);
        m.put_u64(a + hs.anchor_sp as u64, anchor.0);
        m.put_u64(a + hs.anchor_pc as u64, anchor.1);
        m.put_u64(a + hs.anchor_fp as u64, anchor.2);
        m.add_thread(tid, thread);
    }

    /// The `JavaThread*` of the thread `add_java_thread` made for `tid`.
    pub fn java_thread_of(tid: u32) -> u64 {
        THREADS + tid as u64 * 0x200 % 0x800
    }

    /// Makes the Java thread of `tid` wait to enter the monitor at `pending`, or wait on the one
    /// at `waiting` (0: none).
    pub fn set_thread_monitors(&mut self, tid: u32, pending: u64, waiting: u64) {
        let thread = Self::java_thread_of(tid);
        let hs = self.hs;
        let m = &mut self.memory;
        m.put_u64(thread + hs.java_thread_pending_monitor as u64, pending);
        m.put_u64(thread + hs.java_thread_waiting_monitor as u64, waiting);
    }

    /// Walks thread `tid` from `regs` as the BPF program would.
    pub fn walk(&self, tid: u32, regs: UserRegs) -> (Vec<UserFrame>, UnwindEnd) {
        walk_process(&self.memory, Some(&self.hs), tid, regs)
    }
}

/// The Java heap of a JVM with virtual threads: where continuations and stack chunks are.
pub const JAVA_HEAP: u64 = 0x1000_0000;
/// `JavaThread::_cont_entry` in the fake threads.
const JAVA_THREAD_CONT_ENTRY: u64 = 0x180;
/// Where a fake chunk's frames start, and its fields (JDK 21-26's offsets).
const CHUNK_STACK: u64 = 48;

/// A stack chunk to place on the fake heap ([`Jvm::stack_chunk`]).
pub struct ChunkSpec {
    pub cont: u64,
    pub parent: u64,
    /// Words of stack, and the frames' span in them.
    pub size: i32,
    pub sp: i32,
    pub bottom: i32,
    /// The top frame's pc (also written just below its frame).
    pub pc: u64,
}

impl Jvm {
    /// Turns on the virtual-thread layout, with `return_barrier` and `entry_return_pc` as the
    /// stubs' pcs, compressed references decoded with shift 3, and JDK 9+'s bcp slot (the
    /// locals slot above it is where a chunk's interpreted frames keep theirs).
    pub fn with_virtual_threads(&mut self, return_barrier: u64, entry_return_pc: u64) {
        self.memory.map(JAVA_HEAP, 0x2_0000);
        self.hs.flags |= hotspot_flags::COMPRESSED_OOPS;
        self.hs.interpreter_bcp_slot = -8;
        self.hs.frozen = FrozenFramesLayout {
            return_barrier,
            entry_return_pc,
            narrow_oop_base: 0,
            java_thread_cont_entry: JAVA_THREAD_CONT_ENTRY as u16,
            continuation_tail: 32,
            chunk_parent: 40,
            chunk_size: 12,
            chunk_sp: 24,
            chunk_bottom: 28,
            chunk_pc: 16,
            chunk_cont: 44,
            chunk_stack: CHUNK_STACK as u16,
            narrow_oop_shift: 3,
            ..FrozenFramesLayout::default()
        };
    }

    /// A compressed reference to `address`.
    pub fn narrow(address: u64) -> u32 {
        u32::try_from(address >> 3).expect("a heap address below 32 GiB")
    }

    /// Mounts the continuation `cont` (whose newest chunk is `tail`) on the thread of `tid`
    /// with its entry at `entry` on the stack.
    pub fn mount(&mut self, tid: u32, entry: u64, cont: u64, tail: u64) {
        let thread = Self::java_thread_of(tid);
        self.memory.add_thread(tid, thread);
        self.memory.put_u64(thread + JAVA_THREAD_CONT_ENTRY, entry);
        self.memory.put_u64(entry + 16, cont);
        let tail_field = cont + self.hs.frozen.continuation_tail as u64;
        self.memory.put_u32(tail_field, Self::narrow(tail));
    }

    /// Places a chunk at `chunk`; returns where its frames start (word 0 of its stack).
    pub fn stack_chunk(&mut self, chunk: u64, spec: &ChunkSpec) -> u64 {
        let layout = self.hs.frozen;
        let m = &mut self.memory;
        m.put_u32(chunk + layout.chunk_size as u64, spec.size as u32);
        m.put_u32(chunk + layout.chunk_sp as u64, spec.sp as u32);
        m.put_u32(chunk + layout.chunk_bottom as u64, spec.bottom as u32);
        m.put_u64(chunk + layout.chunk_pc as u64, spec.pc);
        m.put_u32(
            chunk + layout.chunk_parent as u64,
            Self::narrow(spec.parent),
        );
        m.put_u32(chunk + layout.chunk_cont as u64, Self::narrow(spec.cont));
        let start = chunk + CHUNK_STACK;
        m.put_u64(start + spec.sp as u64 * 8 - 8, spec.pc);
        start
    }
}

/// What an interpreter frame holds.
pub struct InterpreterFrame {
    pub method: Method,
    pub bcp: u64,
    pub sender_sp: u64,
    pub saved_fp: u64,
    pub return_address: u64,
}

/// Walks `memory` from `regs`, `hotspot` describing the process if it is a JVM.
pub fn walk_process(
    memory: &FakeMemory,
    hotspot: Option<&HotspotProc>,
    tid: u32,
    regs: UserRegs,
) -> (Vec<UserFrame>, UnwindEnd) {
    let mut walk = Walk::default();
    let mut window = Box::new(StackWindow::new());
    let mut frames = Frames::default();
    walk.start(tid, regs, hotspot);
    walk_stack(&mut walk, &mut window, memory, &mut frames);
    let end = UnwindEnd::from_u8(walk.end).expect("the walk ends with an UnwindEnd");
    assert_eq!(walk.frames as usize, frames.0.len());
    (frames.0, end)
}

pub fn regs(ip: u64, sp: u64, fp: u64) -> UserRegs {
    UserRegs {
        ip,
        sp,
        fp,
        r13: 0,
        rbx: 0,
        entered_kernel: false,
    }
}

fn slot(fp: u64, slot: i8) -> u64 {
    fp.wrapping_add((slot as i64 * 8) as u64)
}

/// A class name's tail as [`interpreted_cookie`] takes it, computed from the name itself.
fn tail_of(name: &[u8]) -> [u64; 2] {
    let start = name_tail_start(name.len() as u16) as usize;
    let mut bytes = [0u8; NAME_TAIL_BYTES];
    for (slot, byte) in bytes.iter_mut().zip(&name[start..]) {
        *slot = *byte;
    }
    name_tail(bytes, name.len() as u16)
}

pub fn hex_bytes(hex: &str) -> Vec<u8> {
    hex.split_whitespace()
        .map(|byte| u8::from_str_radix(byte, 16).expect("a hex byte"))
        .collect()
}

/// The bci the walker records when the bcp is implausible.
pub const NO_BCI: u32 = BCI_UNKNOWN;
