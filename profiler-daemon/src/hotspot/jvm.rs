//! One live JVM: where its libjvm is, its version and layout, and the runtime state the BPF
//! unwinder needs (code heaps, interpreter, call stub), read from its memory.

use std::sync::Arc;

use serde::Serialize;

use super::layout::{Field, FrameFacts, JvmLayout, JvmVersion, LayoutError};
use super::libjvm::{read_exported_symbols, LibJvmError, LibJvmMapping};
use super::remote::{ReadError, RemoteMemory};
use super::vmstructs::{self, VmStructsError};
use crate::process::ProcessInfo;

/// Most code heaps followed per JVM (HotSpot has 1 or 3).
pub use profiler_common::MAX_CODE_HEAPS;

#[derive(Debug, thiserror::Error)]
pub enum JvmError {
    #[error(transparent)]
    LibJvm(#[from] LibJvmError),
    #[error(transparent)]
    VmStructs(#[from] VmStructsError),
    #[error(transparent)]
    Layout(#[from] LayoutError),
    #[error("reading JVM state: {0}")]
    Read(#[from] ReadError),
    /// The VM has not finished starting: code heaps or the interpreter are not set up yet.
    #[error("JVM not initialised yet ({0})")]
    NotReady(&'static str),
    #[error("implausible JVM state: {0}")]
    Implausible(String),
}

impl JvmError {
    /// EPERM/EACCES reading the process: the daemon lacks ptrace rights over it.
    pub fn is_permission_denied(&self) -> bool {
        let read = match self {
            Self::Read(err) => err,
            Self::VmStructs(VmStructsError::Read(err)) => err,
            _ => return false,
        };
        matches!(read, ReadError::Failed { errno, .. } if *errno == libc::EPERM || *errno == libc::EACCES)
    }
}

/// A JVM whose layout is known.
#[derive(Clone, Debug, Serialize)]
pub struct Jvm {
    pub pid: u32,
    pub libjvm_path: String,
    pub build_id: Option<String>,
    /// libjvm's load bias in this process.
    pub bias: u64,
    pub version: JvmVersion,
    pub facts: FrameFacts,
    pub layout: Arc<JvmLayout>,
}

/// One code heap's address ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct CodeHeapInfo {
    /// Reserved range: code of this heap is always inside it.
    pub low: u64,
    pub high: u64,
    /// End of the committed part.
    pub committed_high: u64,
    /// The heap's segment map (one byte per segment).
    pub segmap: u64,
    pub log2_segment_size: u32,
}

/// The runtime state the unwinder needs; valid once the VM has initialised.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CodeCacheInfo {
    pub low_bound: u64,
    pub high_bound: u64,
    pub heaps: Vec<CodeHeapInfo>,
    pub interpreter_low: u64,
    pub interpreter_high: u64,
    pub call_stub_return_address: u64,
    /// The value of `java_lang_Class::_klass_offset`: where a class's mirror holds its
    /// `Klass*` (for the allocation sampler's events); `None` if absent or implausible.
    pub class_mirror_klass: Option<u16>,
}

impl Jvm {
    /// Finds libjvm in `process` and reads its layout from the process's own VMStructs.
    ///
    /// Never from another JVM's: VMStructs live in the process's memory, which its owner can
    /// rewrite, so no property of the libjvm file (its build-id, its bytes) makes one process's
    /// layout safe to use for another. Reading it costs a few milliseconds per JVM.
    pub fn inspect(process: &ProcessInfo, memory: &dyn RemoteMemory) -> Result<Self, JvmError> {
        let mapping = LibJvmMapping::find_in(process.pid).ok_or(LibJvmError::NotAJvm)?;
        let symbols = read_exported_symbols(process, &mapping)?;
        let bias = mapping.start.wrapping_sub(symbols.first_segment_vaddr);
        let tables = vmstructs::read(memory, &symbols, bias)?;
        let layout = Arc::new(JvmLayout::from_vmstructs(&tables)?);
        let version = read_version(memory, &layout, bias)?;
        Ok(Self {
            pid: process.pid,
            libjvm_path: mapping.path.to_string_lossy().into_owned(),
            build_id: symbols
                .build_id
                .as_ref()
                .map(|id| id.iter().map(|b| format!("{b:02x}")).collect()),
            bias,
            facts: FrameFacts::for_version(&version),
            version,
            layout,
        })
    }

    fn static_address(&self, field: Field) -> Result<u64, JvmError> {
        let offset = self.offset(field)?;
        Ok(self.bias.wrapping_add(offset))
    }

    fn offset(&self, field: Field) -> Result<u64, JvmError> {
        self.layout
            .offset(field)
            .ok_or_else(|| JvmError::Implausible(format!("no {}", field.key())))
    }

    /// Where `field` of the JVM structure at `base` is. `base` was read from the JVM and may
    /// be anything: the sum wraps, and a wrapped address fails its read.
    fn field_at(&self, base: u64, field: Field) -> Result<u64, JvmError> {
        Ok(base.wrapping_add(self.offset(field)?))
    }

    /// Reads the code heaps, the interpreter range and the call stub's return address.
    pub fn code_cache(&self, memory: &dyn RemoteMemory) -> Result<CodeCacheInfo, JvmError> {
        let (heaps, low_bound, high_bound) = if self.layout.segmented_code_cache() {
            let heaps = self.segmented_heaps(memory)?;
            let low_bound = memory.read_u64(self.static_address(Field::CodeCacheLowBound)?)?;
            let high_bound = memory.read_u64(self.static_address(Field::CodeCacheHighBound)?)?;
            (heaps, low_bound, high_bound)
        } else {
            // JDK 8: one heap; the code cache's bounds are its reserved range.
            let heap = memory.read_u64(self.static_address(Field::CodeCacheHeap)?)?;
            if heap == 0 {
                return Err(JvmError::NotReady("CodeCache::_heap is null"));
            }
            let heap = self.code_heap(memory, heap, 0)?;
            (vec![heap], heap.low, heap.high)
        };
        let interpreter = memory.read_u64(self.static_address(Field::AbstractInterpreterCode)?)?;
        if interpreter == 0 {
            return Err(JvmError::NotReady("interpreter not generated yet"));
        }
        let interpreter_low =
            memory.read_ptr(self.field_at(interpreter, Field::StubQueueStubBuffer)?)?;
        let interpreter_size =
            memory.read_i32(self.field_at(interpreter, Field::StubQueueBufferLimit)?)?;
        let call_stub_return_address =
            memory.read_u64(self.static_address(Field::StubRoutinesCallStubReturnAddress)?)?;
        if call_stub_return_address == 0 {
            return Err(JvmError::NotReady("call stub not generated yet"));
        }
        if interpreter_size <= 0 {
            return Err(JvmError::Implausible(format!(
                "interpreter size {interpreter_size}"
            )));
        }
        Ok(CodeCacheInfo {
            low_bound,
            high_bound,
            heaps,
            interpreter_low,
            interpreter_high: interpreter_low + interpreter_size as u64,
            call_stub_return_address,
            class_mirror_klass: self.class_mirror_klass(memory),
        })
    }

    /// `java_lang_Class::_klass_offset`'s value: set while the VM starts (before its code cache
    /// is usable), a small offset into an object. Anything else is not believed.
    fn class_mirror_klass(&self, memory: &dyn RemoteMemory) -> Option<u16> {
        let address = self.static_address(Field::JavaLangClassKlassOffset).ok()?;
        let offset = memory.read_i32(address).ok()?;
        u16::try_from(offset)
            .ok()
            .filter(|offset| (8..1024).contains(offset) && offset % 8 == 0)
    }

    /// The heaps of a segmented code cache (JDK 9+), sorted by address.
    fn segmented_heaps(&self, memory: &dyn RemoteMemory) -> Result<Vec<CodeHeapInfo>, JvmError> {
        let heaps_array = memory.read_u64(self.static_address(Field::CodeCacheHeaps)?)?;
        if heaps_array == 0 {
            return Err(JvmError::NotReady("CodeCache::_heaps is null"));
        }
        let count = memory.read_i32(self.field_at(heaps_array, Field::GrowableArrayLen)?)?;
        if count <= 0 {
            return Err(JvmError::NotReady("no code heap yet"));
        }
        if count as usize > MAX_CODE_HEAPS {
            return Err(JvmError::Implausible(format!("{count} code heaps")));
        }
        let data = memory.read_ptr(self.field_at(heaps_array, Field::GrowableArrayData)?)?;
        let mut heaps = Vec::with_capacity(count as usize);
        for index in 0..count as u64 {
            let heap = memory.read_ptr(data.wrapping_add(8 * index))?;
            heaps.push(self.code_heap(memory, heap, index)?);
        }
        heaps.sort_by_key(|h| h.low);
        Ok(heaps)
    }

    /// One `CodeHeap`: its reserved and committed range and its segment map.
    fn code_heap(
        &self,
        memory: &dyn RemoteMemory,
        heap: u64,
        index: u64,
    ) -> Result<CodeHeapInfo, JvmError> {
        let memory_field = self.offset(Field::CodeHeapMemory)?;
        let segmap_field = self.offset(Field::CodeHeapSegmap)?;
        let low = memory.read_u64(self.field_at(
            heap.wrapping_add(memory_field),
            Field::VirtualSpaceLowBoundary,
        )?)?;
        let high = memory.read_u64(self.field_at(
            heap.wrapping_add(memory_field),
            Field::VirtualSpaceHighBoundary,
        )?)?;
        let committed_high = memory
            .read_u64(self.field_at(heap.wrapping_add(memory_field), Field::VirtualSpaceHigh)?)?;
        let segmap = memory
            .read_u64(self.field_at(heap.wrapping_add(segmap_field), Field::VirtualSpaceLow)?)?;
        let log2_segment_size =
            memory.read_i32(self.field_at(heap, Field::CodeHeapLog2SegmentSize)?)?;
        if low == 0 || high <= low || segmap == 0 || !(4..=16).contains(&log2_segment_size) {
            return Err(JvmError::Implausible(format!(
                "code heap {index}: [{low:#x}, {high:#x}) segmap {segmap:#x} log2 segment {log2_segment_size}"
            )));
        }
        Ok(CodeHeapInfo {
            low,
            high,
            committed_high,
            segmap,
            log2_segment_size: log2_segment_size as u32,
        })
    }
}

/// Most Java threads read from one JVM's thread list.
const MAX_THREADS: usize = 65_536;
/// Most bytes of a thread read for its allocation counters: `_allocated_bytes` sits next to the
/// TLAB in `Thread` (JDK 11 to 27).
const MAX_ALLOCATED_SPAN: usize = 256;
/// A TLAB's used part past this is garbage (a thread ending while it is read): HotSpot's TLABs
/// stay far below it.
const MAX_TLAB_BYTES: u64 = 1 << 30;

/// Offsets in a `JavaThread` of its allocation counters (see [`Jvm::allocated_bytes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocationCounters {
    /// `Thread::_allocated_bytes`.
    pub allocated_at: u64,
    /// Its TLAB's `_start` and `_top`.
    pub start_at: u64,
    pub top_at: u64,
}

impl Jvm {
    /// The address of the JVM's current ThreadsSMR list (JDK 10+), `None` before it. HotSpot
    /// publishes a new list whenever a Java thread starts or exits, so an unchanged address
    /// means, almost always, an unchanged set of threads: one read instead of two per thread.
    pub fn java_thread_list(&self, memory: &dyn RemoteMemory) -> Result<Option<u64>, JvmError> {
        match self.layout.offset(Field::ThreadsSMRSupportJavaThreadList) {
            Some(list_at) => Ok(Some(memory.read_ptr(self.bias.wrapping_add(list_at))?)),
            None => Ok(None),
        }
    }

    /// The JVM's Java threads: (tid in the JVM's pid namespace, `JavaThread*`). Uses the
    /// ThreadsSMR list (JDK 10+) or the older linked list. A list longer than `max_threads`
    /// (the caller knows how many threads the process has) is refused before it is read: the
    /// list is the process's memory, and each entry costs two reads.
    pub fn java_threads(
        &self,
        memory: &dyn RemoteMemory,
        max_threads: usize,
    ) -> Result<Vec<(u32, u64)>, JvmError> {
        let threads = self.java_thread_pointers(memory, max_threads)?;
        let osthread_at = self.offset(Field::ThreadOsthread)?;
        let tid_at = self.offset(Field::OSThreadThreadId)?;
        let mut out = Vec::with_capacity(threads.len());
        for thread in threads {
            let Ok(osthread) = memory.read_ptr(thread.wrapping_add(osthread_at)) else {
                continue;
            };
            let Ok(tid) = memory.read_u32(osthread.wrapping_add(tid_at)) else {
                continue;
            };
            if tid != 0 {
                out.push((tid, thread));
            }
        }
        Ok(out)
    }

    /// What the JVM's threads allocated, by HotSpot's own counters: `exited`, what the threads
    /// that ended allocated (read first by the caller: a thread that ends between the two reads
    /// is then missed once, not counted twice), and for every live Java thread its retired TLABs
    /// and objects allocated outside them (`_allocated_bytes`) and its current TLAB's used
    /// part. A list longer than `max_threads` is refused, as in [`Self::java_threads`].
    /// None of these is read atomically: a TLAB retired while it is read may count twice or not
    /// at all, a thread that ends meanwhile likewise.
    pub fn allocated_bytes(
        &self,
        memory: &dyn RemoteMemory,
        exited: u64,
        max_threads: usize,
    ) -> Result<u64, JvmError> {
        let AllocationCounters {
            allocated_at,
            start_at,
            top_at,
        } = self.allocation_counters()?;
        // The three words in one read per thread.
        let first = allocated_at.min(start_at).min(top_at);
        let span = (allocated_at.max(start_at).max(top_at) + 8 - first) as usize;
        if span > MAX_ALLOCATED_SPAN {
            return Err(JvmError::Implausible(format!(
                "a thread's allocation counters span {span} bytes"
            )));
        }
        let word = |bytes: &[u8], at: u64| {
            let at = (at - first) as usize;
            u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap_or_default())
        };
        let mut total = exited;
        let mut bytes = [0u8; MAX_ALLOCATED_SPAN];
        for thread in self.java_thread_pointers(memory, max_threads)? {
            // Left out if unreadable: a thread that ended while the list was read.
            if memory
                .read(thread.wrapping_add(first), &mut bytes[..span])
                .is_err()
            {
                continue;
            }
            let (start, top) = (word(&bytes, start_at), word(&bytes, top_at));
            let used = top
                .checked_sub(start)
                .filter(|used| *used <= MAX_TLAB_BYTES)
                .unwrap_or(0);
            total = total
                .saturating_add(word(&bytes, allocated_at))
                .saturating_add(used);
        }
        Ok(total)
    }

    /// Where a thread's allocation counters are in its `JavaThread`.
    pub fn allocation_counters(&self) -> Result<AllocationCounters, JvmError> {
        let tlab_at = self.offset(Field::ThreadTlab)?;
        Ok(AllocationCounters {
            allocated_at: self.offset(Field::ThreadAllocatedBytes)?,
            start_at: self.field_at(tlab_at, Field::TlabStart)?,
            top_at: self.field_at(tlab_at, Field::TlabTop)?,
        })
    }

    /// The `JavaThread*` of every thread on the JVM's thread list (see [`Self::java_threads`]).
    fn java_thread_pointers(
        &self,
        memory: &dyn RemoteMemory,
        max_threads: usize,
    ) -> Result<Vec<u64>, JvmError> {
        let max_threads = max_threads.min(MAX_THREADS);
        let layout = &self.layout;
        let threads: Vec<u64> = if let Some(list_at) =
            layout.offset(Field::ThreadsSMRSupportJavaThreadList)
        {
            let list = memory.read_ptr(self.bias.wrapping_add(list_at))?;
            let length = memory.read_u32(self.field_at(list, Field::ThreadsListLength)?)? as usize;
            if length > max_threads {
                return Err(JvmError::Implausible(format!("{length} Java threads")));
            }
            if length == 0 {
                return Ok(Vec::new());
            }
            let array = memory.read_ptr(self.field_at(list, Field::ThreadsListThreads)?)?;
            let mut bytes = vec![0u8; length * 8];
            memory.read(array, &mut bytes)?;
            bytes
                .chunks_exact(8)
                .map(|w| u64::from_le_bytes(w.try_into().unwrap_or_default()))
                .collect()
        } else {
            let next = self.offset(Field::JavaThreadNext)?;
            let mut thread = memory.read_u64(self.static_address(Field::ThreadsThreadList)?)?;
            let mut threads = Vec::new();
            while thread != 0 && threads.len() < max_threads {
                threads.push(thread);
                thread = memory.read_u64(thread.wrapping_add(next))?;
            }
            threads
        };
        Ok(threads)
    }
}

fn read_version(
    memory: &dyn RemoteMemory,
    layout: &JvmLayout,
    bias: u64,
) -> Result<JvmVersion, JvmError> {
    let address = |field: Field| -> Result<u64, JvmError> {
        layout
            .offset(field)
            .map(|o| bias.wrapping_add(o))
            .ok_or_else(|| JvmError::Implausible(format!("no {}", field.key())))
    };
    let release_ptr = memory.read_ptr(address(Field::VmRelease)?)?;
    let release = memory.read_c_string(release_ptr, 128)?;
    let major = memory.read_u32(address(Field::VmMajorVersion)?)?;
    let minor = memory.read_u32(address(Field::VmMinorVersion)?)?;
    if !layout.has(Field::VmSecurityVersion) {
        // JDK 8 numbers HotSpot on its own: "25.504-b01" is JDK 8 update 504. Anything else
        // without a security version is a layout the frame facts do not know.
        if major != 25 {
            return Err(JvmError::Implausible(format!(
                "HotSpot {major}.{minor} without a security version"
            )));
        }
        return Ok(JvmVersion {
            major: 8,
            minor: 0,
            security: minor,
            release,
        });
    }
    Ok(JvmVersion {
        major,
        minor,
        security: memory.read_u32(address(Field::VmSecurityVersion)?)?,
        release,
    })
}
