//! Proof that a code blob is still the one a sample recorded, before anything read from it
//! names a frame. The daemon reads a blob well after the sample (milliseconds to seconds), and
//! meanwhile the code cache frees blobs (nmethods unloaded with their classes, deoptimized
//! code, temporary buffers) and gives their memory to new ones: the sampled `CodeBlob*` may
//! then point at a free block, or into the middle of another blob, where every field read is
//! whatever bytes lie there.
//!
//! - An nmethod: its heap block is in use, its compile id is the sampled one, and it is not
//!   unloaded or a zombie ([`nmethod_alive`]).
//! - Any other blob (a stub, adapter or buffer), which has no compile id: its heap block is in
//!   use, the word BPF recorded as its cookie (the 32 bits at `nmethod::_compile_id`'s offset,
//!   when they are inside the blob) is still there, the sampled pc is inside it, and its
//!   header (name pointer, size, kind, code start) reads the same before and after its name
//!   ([`stub_alive`]).
//! - A blob's name ([`read_blob_name`]) is bounded, and must be a name: printable ASCII, not
//!   empty (every HotSpot blob name is a string literal or built from a signature).

use super::jvm::Jvm;
use super::layout::{Field, TypeSize};
use super::remote::{ReadError, RemoteMemory};
use crate::java_names::UnnamedReason;

/// Longest blob name read. HotSpot's are short literals ("I2C/C2I adapters", "vtable
/// chunks", "C2 Runtime new_instance"); upcall stubs' carry a signature.
pub const MAX_BLOB_NAME: usize = 1024;

/// `CodeBlobKind::Nmethod` (JDK 23+).
const NMETHOD_KIND: u8 = 1;

/// The fields of a blob's header that naming relies on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BlobHeader {
    /// `CodeBlob::_name`.
    pub name: u64,
    /// `CodeBlob::_size`, from the blob's start.
    pub size: i32,
    /// `CodeBlob::_kind` (JDK 23+).
    pub kind: Option<u8>,
    pub code_begin: u64,
}

impl BlobHeader {
    pub fn read(jvm: &Jvm, memory: &dyn RemoteMemory, blob: u64) -> Result<Self, UnnamedReason> {
        let layout = &jvm.layout;
        let name = memory.read_u64(field_at(jvm, blob, Field::CodeBlobName)?)?;
        let size = memory.read_i32(field_at(jvm, blob, Field::CodeBlobSize)?)?;
        let kind = match layout.offset(Field::CodeBlobKind) {
            Some(at) => Some(memory.read_u8(blob.wrapping_add(at))?),
            None => None,
        };
        // A pointer up to JDK 17, an offset from the blob after (as the BPF unwinder reads it).
        let code_begin = match layout.offset(Field::CodeBlobCodeBegin) {
            Some(at) => memory.read_ptr(blob.wrapping_add(at))?,
            None => blob.wrapping_add(memory.read_i32(field_at(
                jvm,
                blob,
                Field::CodeBlobCodeOffset,
            )?)? as i64 as u64),
        };
        Ok(Self {
            name,
            size,
            kind,
            code_begin,
        })
    }

    /// Whether the header says "nmethod": its kind (JDK 23+), else its name (read only then).
    pub fn is_nmethod(&self, memory: &dyn RemoteMemory) -> bool {
        match self.kind {
            Some(kind) => kind == NMETHOD_KIND,
            None => matches!(
                read_blob_name(memory, self.name).as_deref(),
                Ok("nmethod" | "native nmethod")
            ),
        }
    }

    /// Bytes from the code's start to the blob's end: the pc offsets inside it. `None` if the
    /// header makes no sense (a blob's code starts inside it).
    pub fn code_span(&self, blob: u64) -> Option<u64> {
        let end = blob.checked_add(u64::try_from(self.size).ok()?)?;
        (self.code_begin >= blob && self.code_begin <= end).then(|| end - self.code_begin)
    }
}

pub(super) fn offset(jvm: &Jvm, field: Field) -> Result<u64, UnnamedReason> {
    jvm.layout.offset(field).ok_or(UnnamedReason::MissingField)
}

/// Where `field` of the JVM structure at `base` is. `base` was read from the JVM and may be
/// anything: the sum wraps, and a wrapped address fails its read.
pub(super) fn field_at(jvm: &Jvm, base: u64, field: Field) -> Result<u64, UnnamedReason> {
    Ok(base.wrapping_add(offset(jvm, field)?))
}

/// Whether the code heap block holding `blob` is in use (a freed block keeps its bytes).
fn block_used(jvm: &Jvm, memory: &dyn RemoteMemory, blob: u64) -> Result<bool, UnnamedReason> {
    let layout = &jvm.layout;
    let block = blob
        .checked_sub(
            layout
                .size(TypeSize::HeapBlock)
                .ok_or(UnnamedReason::MissingField)?,
        )
        .ok_or(UnnamedReason::Unreadable)?;
    let used_at = field_at(jvm, block, Field::HeapBlockUsed)?;
    Ok(match layout.width(Field::HeapBlockUsed) {
        Some(4) => memory.read_u32(used_at)? != 0,
        _ => memory.read_u8(used_at)? != 0,
    })
}

/// Whether the nmethod at `blob` still is compilation `compile_id` and alive: its code-heap
/// block is in use, and (up to JDK 19) it is neither unloaded nor a zombie. A freed blob keeps
/// its compile id until the memory is reused, and an nmethod's `Method*`s are freed with its
/// classes: HotSpot frees or unloads the nmethod first, in the same safepoint, so names read
/// between two passing checks belong to this compilation.
pub fn nmethod_alive(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    blob: u64,
    compile_id: u32,
) -> Result<(), UnnamedReason> {
    let used = block_used(jvm, memory, blob)?;
    let id = memory.read_u32(field_at(jvm, blob, Field::NmethodCompileId)?)?;
    // `signed char` in every JDK: 3 and 4 are unloaded and zombie (JDK 11-19); JDK 20+ has no
    // state past not_entrant (2); JDK 8 has no not_used state, so zombie is 2 and unloaded 3.
    let first_dead_state = if jvm.version.major <= 8 { 2 } else { 3 };
    let dead_state = match jvm.layout.offset(Field::NmethodState) {
        Some(at) => (memory.read_u8(blob.wrapping_add(at))? as i8) >= first_dead_state,
        None => false,
    };
    if !used || id != compile_id || dead_state {
        // Freed, unloaded, or reused by another blob since the sample.
        return Err(UnnamedReason::CodeReused);
    }
    Ok(())
}

/// Whether the blob at `blob`, which is no nmethod, is still the one sampled with `cookie` at
/// `pc_offset`, its header as `header` was read: see the module's documentation. Checked both
/// before and after its name is read, so that a name read from a blob freed meanwhile is not
/// used.
pub fn stub_alive(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    blob: u64,
    cookie: u32,
    header: &BlobHeader,
) -> Result<(), UnnamedReason> {
    if !block_used(jvm, memory, blob)? || BlobHeader::read(jvm, memory, blob)? != *header {
        return Err(UnnamedReason::CodeReused);
    }
    let Some(_) = header.code_span(blob) else {
        return Err(UnnamedReason::CodeReused);
    };
    // BPF recorded the 32 bits where an nmethod has its compile id. Inside a stub they are its
    // own bytes (header fields or code), which stay while it lives; past its end they belong
    // to the next block, which may change while this one lives: not a proof then.
    let cookie_at = offset(jvm, Field::NmethodCompileId)?;
    if cookie_at + 4 <= header.size as u64
        && memory.read_u32(blob.wrapping_add(cookie_at))? != cookie
    {
        return Err(UnnamedReason::CodeReused);
    }
    Ok(())
}

/// A blob's name at `name`: at most [`MAX_BLOB_NAME`] bytes of printable ASCII. An unreadable
/// pointer is [`UnnamedReason::Unreadable`], a name without an end within the bound
/// [`UnnamedReason::OverBound`], bytes that are no blob name [`UnnamedReason::BadName`].
pub fn read_blob_name(memory: &dyn RemoteMemory, name: u64) -> Result<String, UnnamedReason> {
    let text = match memory.read_c_string(name, MAX_BLOB_NAME) {
        Ok(text) => text,
        Err(ReadError::Unterminated { .. }) => return Err(UnnamedReason::OverBound),
        Err(_) => return Err(UnnamedReason::Unreadable),
    };
    let printable_ascii = |b: u8| (0x20..0x7f).contains(&b);
    if text.is_empty() || !text.bytes().all(printable_ascii) {
        return Err(UnnamedReason::BadName);
    }
    Ok(text)
}
