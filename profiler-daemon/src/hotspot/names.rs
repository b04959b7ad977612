//! Java names from the JVM's memory (no agent needed): one of the name sources of
//! [`crate::java_names`].
//!
//! - Interpreted frames carry a `Method*` and a bci: names come from the method's constant pool,
//!   the line from the `ConstMethod`'s compressed line number table.
//! - Compiled frames carry a `CodeBlob*` and a pc offset: for an nmethod, the `PcDesc` of that pc
//!   (by [`crate::java_names::record_at`]) gives a scope chain (innermost first) of
//!   (Method*, bci) pairs: the inlined frames. Other blobs (stubs, adapters) are named by
//!   `CodeBlob::_name`, once proven still the blob sampled ([`super::code_proof`]).
//!
//! Everything read is validated and cached per (Method*, cookie) and (CodeBlob*, compile id): a
//! cookie or compile id mismatch means the memory was reused, and the read fails with the
//! [`UnnamedReason`] saying so rather than give another method's name. Every read is bounded,
//! and every `Symbol` read as a name must be one ([`super::symbol`]).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use profiler_common::{FrameKind, UserFrame};

use super::code_proof::{field_at, nmethod_alive, offset, read_blob_name, stub_alive, BlobHeader};
use super::jvm::Jvm;
use super::layout::{Constant, Field, TypeSize};
use super::remote::{ReadError, RemoteMemory};
use super::symbol::{self, SymbolIdentity};
use super::unsigned5::Reader;
use crate::java_names::{
    record_at, CodeNames, MethodInfo, MethodName, NmethodNames, UnnamedReason,
};

/// Bounds on what is read from a JVM for one method or nmethod.
const MAX_LINE_TABLE: usize = 64 * 1024;
const MAX_DEBUG_INFO: usize = 1 << 20;
const MAX_SCOPE_DEPTH: usize = 64;
/// Cached entries per JVM before the caches start over.
const MAX_CACHED: usize = 100_000;
/// How long a failed read stands before it is tried again. A failure is not final: the memory
/// of an unloaded class is soon given to a class loaded anew, and under class churn that is
/// often the same method again at the same address (same cookie). Kept for good, one failure
/// would name every later frame at that address unknown.
const RETRY_FAILED_AFTER: Duration = Duration::from_millis(500);

/// A cached read: successes stand until the caches start over, failures for
/// [`RETRY_FAILED_AFTER`].
struct Cached<T> {
    value: Result<T, UnnamedReason>,
    read_at: Instant,
}

impl<T: Clone> Cached<T> {
    fn new(value: Result<T, UnnamedReason>) -> Self {
        Self {
            value,
            read_at: Instant::now(),
        }
    }

    /// The cached value, unless it is a failure old enough to try again at `now`.
    fn current(&self, now: Instant) -> Option<Result<T, UnnamedReason>> {
        let stands =
            self.value.is_ok() || now.saturating_duration_since(self.read_at) < RETRY_FAILED_AFTER;
        stands.then(|| self.value.clone())
    }
}

impl From<ReadError> for UnnamedReason {
    fn from(_: ReadError) -> Self {
        Self::Unreadable
    }
}

/// What a code blob is.
#[derive(Clone, Debug)]
pub enum BlobInfo {
    Nmethod(MemoryNmethod),
    Stub {
        name: String,
        /// Bytes from its code's start to its end: a sampled pc offset past it was in
        /// another blob.
        code_span: u64,
    },
}

/// An nmethod's identity and debug info as read from memory.
#[derive(Clone, Debug)]
pub struct MemoryNmethod {
    method: u64,
    comp_level: i32,
    /// Where its instructions start (the sidecar's key).
    pub code_begin: u64,
    /// (pc offset, scope decode offset), sorted by pc offset.
    pcs: Vec<(i32, i32)>,
    scopes: Vec<u8>,
    metadata: Vec<u64>,
    excludes_zero: bool,
    /// Its methods' names, read with the blob (when its first sample arrives): later, a
    /// `Method*` of an unloaded class may belong to another one.
    names: HashMap<u64, MethodName>,
}

impl BlobInfo {
    /// What the naming policy needs to know of it.
    pub fn names(&self) -> CodeNames<'_> {
        match self {
            Self::Stub { name, .. } => CodeNames::Stub { name },
            Self::Nmethod(nmethod) => CodeNames::Nmethod(NmethodNames {
                method: nmethod.method,
                comp_level: nmethod.comp_level,
                names: &nmethod.names,
            }),
        }
    }
}

impl MemoryNmethod {
    /// The (Method*, bci) chain at `pc_offset`, innermost first; `top` for the interrupted
    /// frame.
    pub fn chain(&self, pc_offset: u32, top: bool) -> Vec<(u64, i32)> {
        scope_chain(
            &self.pcs,
            &self.scopes,
            &self.metadata,
            pc_offset as i32,
            top,
            self.excludes_zero,
        )
    }
}

/// One JVM's memory as a name source, with its caches.
pub struct MemoryNames<M: RemoteMemory> {
    jvm: Arc<Jvm>,
    memory: M,
    methods: HashMap<(u64, u32), Cached<Arc<MethodInfo>>>,
    blobs: HashMap<(u64, u32), Cached<Arc<BlobInfo>>>,
    /// Allocated classes' internal names, by (`Symbol*`, cookie).
    classes: HashMap<(u64, u32), Cached<Arc<str>>>,
}

impl<M: RemoteMemory> MemoryNames<M> {
    pub fn new(jvm: Arc<Jvm>, memory: M) -> Self {
        Self {
            jvm,
            memory,
            methods: HashMap::new(),
            blobs: HashMap::new(),
            classes: HashMap::new(),
        }
    }

    /// The internal name (`java/lang/String`, `[I`) in the `Symbol` at `symbol`, if it is still
    /// the one whose identity gives `cookie` (see [`profiler_common::class_name_cookie`]) and
    /// whose length BPF recorded as `length`.
    pub fn class_name(
        &mut self,
        symbol: u64,
        cookie: u32,
        length: u32,
    ) -> Result<Arc<str>, UnnamedReason> {
        let key = (symbol, cookie);
        if let Some(cached) = self
            .classes
            .get(&key)
            .and_then(|c| c.current(Instant::now()))
        {
            return cached;
        }
        let name = read_class_name(&self.jvm, &self.memory, symbol, cookie, length).map(Arc::from);
        self.classes.insert(key, Cached::new(name.clone()));
        name
    }

    pub fn pid(&self) -> u32 {
        self.jvm.pid
    }

    /// Forgets a failed read of `frame`'s method, code or class name (a success stands), so
    /// that the next ask reads memory again.
    pub fn forget_failure(&mut self, frame: &UserFrame) {
        let key = (frame.addr(), frame.cookie);
        match frame.kind() {
            Some(FrameKind::Interpreted) => forget_failure(&mut self.methods, key),
            Some(FrameKind::Compiled) => forget_failure(&mut self.blobs, key),
            Some(FrameKind::AllocatedClass) => forget_failure(&mut self.classes, key),
            Some(FrameKind::Native) | None => {}
        }
    }

    /// Starts the caches over once either holds too many entries.
    pub fn bound_caches(&mut self) {
        if self.methods.len() > MAX_CACHED
            || self.blobs.len() > MAX_CACHED
            || self.classes.len() > MAX_CACHED
        {
            self.methods.clear();
            self.blobs.clear();
            self.classes.clear();
        }
    }

    /// The method at `method`, if it is still the one whose identity gives `cookie` (see
    /// [`profiler_common::interpreted_cookie`]).
    pub fn method(&mut self, method: u64, cookie: u32) -> MethodName {
        let key = (method, cookie);
        if let Some(cached) = self
            .methods
            .get(&key)
            .and_then(|c| c.current(Instant::now()))
        {
            return cached;
        }
        let info = read_method(&self.jvm, &self.memory, method, cookie).map(Arc::new);
        self.methods.insert(key, Cached::new(info.clone()));
        info
    }

    /// The code blob at `blob` sampled at `pc_offset` from its code's start, if it is still
    /// the one sampled: an nmethod still holding compilation `compile_id` (the sample's
    /// cookie), or another blob proven by [`stub_alive`] with that cookie.
    pub fn code(
        &mut self,
        blob: u64,
        compile_id: u32,
        pc_offset: u32,
    ) -> Result<Arc<BlobInfo>, UnnamedReason> {
        let key = (blob, compile_id);
        let cached = self.blobs.get(&key).and_then(|c| c.current(Instant::now()));
        let info = match cached {
            Some(cached) => cached,
            None => {
                let info = read_blob(&self.jvm, &self.memory, blob, compile_id)
                    .map(|blob| self.with_names(blob))
                    // The names were read while the nmethod lived only if it still does now
                    // (see `nmethod_alive`); otherwise a `Method*` may have held a later
                    // class's method.
                    .and_then(|read| match read {
                        BlobInfo::Nmethod(_) => {
                            nmethod_alive(&self.jvm, &self.memory, blob, compile_id)
                                .map(|()| Arc::new(read))
                        }
                        BlobInfo::Stub { .. } => Ok(Arc::new(read)),
                    });
                self.blobs.insert(key, Cached::new(info.clone()));
                info
            }
        };
        let info = info?;
        if let BlobInfo::Stub { code_span, .. } = info.as_ref() {
            if u64::from(pc_offset) >= *code_span {
                // The pc was in another blob, which this memory held then.
                return Err(UnnamedReason::CodeReused);
            }
        }
        Ok(info)
    }

    /// Names the methods of a freshly read nmethod: its own and every one its scopes name,
    /// each verified by its identity as it is now (while the nmethod lives, its methods do).
    fn with_names(&mut self, mut blob: BlobInfo) -> BlobInfo {
        if let BlobInfo::Nmethod(nmethod) = &mut blob {
            let mut wanted = vec![nmethod.method];
            for (pc_offset, _) in nmethod.pcs.iter() {
                for (scope_method, _) in scope_chain(
                    &nmethod.pcs,
                    &nmethod.scopes,
                    &nmethod.metadata,
                    *pc_offset,
                    false,
                    nmethod.excludes_zero,
                ) {
                    wanted.push(scope_method);
                }
            }
            wanted.sort_unstable();
            wanted.dedup();
            for scope_method in wanted {
                let info = read_identity(&self.jvm, &self.memory, scope_method)
                    .and_then(|identity| self.method(scope_method, identity.cookie));
                nmethod.names.insert(scope_method, info);
            }
        }
        blob
    }
}

/// The (Method*, bci) chain at a pc offset, innermost first.
fn forget_failure<T>(cache: &mut HashMap<(u64, u32), Cached<T>>, key: (u64, u32)) {
    if cache.get(&key).is_some_and(|cached| cached.value.is_err()) {
        cache.remove(&key);
    }
}

fn scope_chain(
    pcs: &[(i32, i32)],
    scopes: &[u8],
    metadata: &[u64],
    pc_offset: i32,
    top: bool,
    excludes_zero: bool,
) -> Vec<(u64, i32)> {
    let Some(&(_, mut decode_offset)) = record_at(pcs, i64::from(pc_offset), top, |(offset, _)| {
        i64::from(*offset)
    }) else {
        return Vec::new();
    };
    let mut chain = Vec::new();
    while decode_offset > 0 && chain.len() < MAX_SCOPE_DEPTH {
        let mut reader = Reader::new(scopes, decode_offset as usize, excludes_zero);
        let (Some(sender), Some(method_index), Some(bci_plus_one)) =
            (reader.read_u32(), reader.read_u32(), reader.read_u32())
        else {
            break;
        };
        let method = match (method_index as usize)
            .checked_sub(1)
            .and_then(|i| metadata.get(i))
        {
            Some(&method) if method != 0 => method,
            _ => break,
        };
        chain.push((method, bci_plus_one as i32 - 1));
        // Senders are written before their callees: offsets strictly decrease.
        if sender as i32 >= decode_offset {
            break;
        }
        decode_offset = sender as i32;
    }
    chain
}

fn read_bytes(memory: &dyn RemoteMemory, address: u64, len: usize) -> Result<Vec<u8>, ReadError> {
    let mut bytes = vec![0; len];
    memory.read(address, &mut bytes)?;
    Ok(bytes)
}

/// The name in constant pool slot `index` (a Symbol* for the UTF-8 entries names and
/// signatures use). Nothing recorded says which symbol it must be: it must be a name, stable
/// while read, and the method's identity is checked again after (see `read_method`).
fn constant_pool_symbol(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    cp: u64,
    index: u16,
) -> Result<String, UnnamedReason> {
    let base = jvm
        .layout
        .size(TypeSize::ConstantPool)
        .ok_or(UnnamedReason::MissingField)?;
    let symbol = memory.read_ptr(cp.wrapping_add(base).wrapping_add(8 * index as u64))?;
    symbol::read_name(jvm, memory, symbol, None, UnnamedReason::MethodReused)
}

/// The pointers from a `Method` to its class's name, and the cookie they give.
pub(super) struct MethodIdentity {
    const_method: u64,
    cp: u64,
    holder: u64,
    class_symbol: u64,
    /// The identity of its class's name, which the cookie is made of.
    class_name: SymbolIdentity,
    /// What BPF records for an interpreted frame of this method (see
    /// [`profiler_common::interpreted_cookie`]).
    pub(super) cookie: u32,
}

/// Reads `method`'s identity as BPF reads it (the contract tests compare the two).
pub(super) fn read_identity(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    method: u64,
) -> Result<MethodIdentity, UnnamedReason> {
    let const_method = memory.read_ptr(field_at(jvm, method, Field::MethodConstMethod)?)?;
    let cp = memory.read_ptr(field_at(jvm, const_method, Field::ConstMethodConstants)?)?;
    let holder = memory.read_ptr(field_at(jvm, cp, Field::ConstantPoolPoolHolder)?)?;
    let class_symbol = memory.read_ptr(field_at(jvm, holder, Field::KlassName)?)?;
    let class_name = symbol::read_identity(jvm, memory, class_symbol)?;
    Ok(MethodIdentity {
        const_method,
        cp,
        holder,
        class_symbol,
        class_name,
        cookie: profiler_common::interpreted_cookie(
            const_method,
            class_name.hash_word,
            class_name.tail,
        ),
    })
}

/// The name in `symbol` if its identity still gives the sampled `cookie` and has the sampled
/// `length`, checked again after the name is read (the class may be unloaded meanwhile).
pub(super) fn read_class_name(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    symbol: u64,
    cookie: u32,
    length: u32,
) -> Result<String, UnnamedReason> {
    if symbol == 0 {
        // BPF could not read the class's name.
        return Err(UnnamedReason::Unreadable);
    }
    let identity = symbol::read_identity(jvm, memory, symbol)?;
    let sampled = profiler_common::class_name_cookie(symbol, identity.hash_word, identity.tail)
        == cookie
        && u32::from(identity.length) == length;
    if !sampled {
        return Err(UnnamedReason::ClassReused);
    }
    symbol::read_name(
        jvm,
        memory,
        symbol,
        Some(&identity),
        UnnamedReason::ClassReused,
    )
}

fn read_method(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    method: u64,
    cookie: u32,
) -> Result<MethodInfo, UnnamedReason> {
    let identity = read_identity(jvm, memory, method)?;
    if cookie != identity.cookie {
        // Another method holds this memory now: the sampled one cannot be named.
        return Err(UnnamedReason::MethodReused);
    }
    let MethodIdentity {
        const_method,
        cp,
        holder,
        class_symbol,
        class_name,
        ..
    } = identity;
    // The class's name must be the symbol the cookie was made of.
    let internal_class = symbol::read_name(
        jvm,
        memory,
        class_symbol,
        Some(&class_name),
        UnnamedReason::MethodReused,
    )?;
    let name_index = memory.read_u16(field_at(jvm, const_method, Field::ConstMethodNameIndex)?)?;
    let signature_index = memory.read_u16(field_at(
        jvm,
        const_method,
        Field::ConstMethodSignatureIndex,
    )?)?;
    let name = constant_pool_symbol(jvm, memory, cp, name_index)?;
    let signature = constant_pool_symbol(jvm, memory, cp, signature_index)?;

    let source_index = match jvm.layout.offset(Field::ConstantPoolSourceFileNameIndex) {
        Some(at) => memory.read_u16(cp.wrapping_add(at)).ok(),
        None => jvm
            .layout
            .offset(Field::InstanceKlassSourceFileNameIndex)
            .and_then(|at| memory.read_u16(holder + at).ok()),
    };
    let file = source_index
        .filter(|i| *i != 0)
        .and_then(|i| constant_pool_symbol(jvm, memory, cp, i).ok());
    let lines = read_line_table(jvm, memory, const_method).unwrap_or_default();
    // The class may have been unloaded while its names were read, and the memory given to
    // another one: the names stand only if the identity is still the sampled one.
    if read_identity(jvm, memory, method)?.cookie != cookie {
        return Err(UnnamedReason::MethodReused);
    }
    Ok(MethodInfo::from_internal(
        &internal_class,
        name,
        signature,
        file.as_deref(),
        lines,
    ))
}

fn read_line_table(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    const_method: u64,
) -> Result<Vec<(u32, u32)>, UnnamedReason> {
    let flags_at = field_at(jvm, const_method, Field::ConstMethodFlags)?;
    let flags = match jvm.layout.width(Field::ConstMethodFlags) {
        Some(2) => memory.read_u16(flags_at)? as u32,
        _ => memory.read_u32(flags_at)?,
    };
    let has_table = jvm
        .layout
        .constant(Constant::HasLinenumberTable)
        .unwrap_or(1) as u32;
    if flags & has_table == 0 {
        return Ok(Vec::new());
    }
    let code_size =
        memory.read_u16(field_at(jvm, const_method, Field::ConstMethodCodeSize)?)? as u64;
    let start = const_method
        .wrapping_add(
            jvm.layout
                .size(TypeSize::ConstMethod)
                .ok_or(UnnamedReason::MissingField)?,
        )
        .wrapping_add(code_size);
    // The table's length is not stored: read a page's worth (at most to the page end first).
    let first = (4096 - (start % 4096) as usize).max(64);
    let mut bytes = read_bytes(memory, start, first).or_else(|_| read_bytes(memory, start, 64))?;
    let mut table = Vec::new();
    loop {
        let mut reader = Reader::new(&bytes, 0, jvm.facts.unsigned5_excludes_zero);
        let (mut bci, mut line) = (0i64, 0i64);
        table.clear();
        let mut complete = false;
        while let Some(byte) = reader.read_byte() {
            match byte {
                0 => {
                    complete = true;
                    break;
                }
                0xff => {
                    let (Some(dbci), Some(dline)) = (reader.read_signed(), reader.read_signed())
                    else {
                        break;
                    };
                    bci += dbci as i64;
                    line += dline as i64;
                }
                packed => {
                    bci += (packed >> 3) as i64;
                    line += (packed & 7) as i64;
                }
            }
            table.push((
                bci.clamp(0, u32::MAX as i64) as u32,
                line.clamp(0, u32::MAX as i64) as u32,
            ));
        }
        if complete || bytes.len() >= MAX_LINE_TABLE {
            break;
        }
        // The table goes on past what was read: read more.
        let more = read_bytes(memory, start + bytes.len() as u64, 4096)?;
        bytes.extend(more);
    }
    Ok(table)
}

fn read_blob(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    blob: u64,
    compile_id: u32,
) -> Result<BlobInfo, UnnamedReason> {
    let layout = &jvm.layout;
    let header = BlobHeader::read(jvm, memory, blob)?;
    if !header.is_nmethod(memory) {
        // Proven the blob sampled before its name is read, and after (it may be freed
        // meanwhile): a freed or reused blob's name pointer is anything.
        stub_alive(jvm, memory, blob, compile_id, &header)?;
        let name = read_blob_name(memory, header.name)?;
        stub_alive(jvm, memory, blob, compile_id, &header)?;
        let code_span = header.code_span(blob).ok_or(UnnamedReason::CodeReused)?;
        return Ok(BlobInfo::Stub { name, code_span });
    }
    nmethod_alive(jvm, memory, blob, compile_id)?;
    let method = memory.read_ptr(field_at(jvm, blob, Field::NmethodMethod)?)?;
    let comp_level = memory.read_i32(field_at(jvm, blob, Field::NmethodCompLevel)?)?;
    let code_begin = header.code_begin;

    // Where the debug info is: inside the blob up to JDK 22, in C-heap "immutable data" after.
    // Sums of values read from the JVM wrap (a freed blob holds anything): a range that makes
    // no sense is refused by `length` below.
    let (pcs_begin, pcs_end, scopes_begin, scopes_end, metadata_begin, metadata_end) = match layout
        .offset(Field::NmethodImmutableData)
    {
        Some(immutable_at) => {
            let immutable = memory.read_ptr(blob.wrapping_add(immutable_at))?;
            let pcs = memory.read_i32(field_at(jvm, blob, Field::NmethodScopesPcsOffset)?)? as u64;
            let scopes =
                memory.read_i32(field_at(jvm, blob, Field::NmethodScopesDataOffset)?)? as u64;
            let size =
                memory.read_i32(field_at(jvm, blob, Field::NmethodImmutableDataSize)?)? as u64;
            let mutable = memory.read_ptr(field_at(jvm, blob, Field::CodeBlobMutableData)?)?;
            let relocation =
                memory.read_i32(field_at(jvm, blob, Field::CodeBlobRelocationSize)?)? as u64;
            let mutable_size =
                memory.read_i32(field_at(jvm, blob, Field::CodeBlobMutableDataSize)?)? as u64;
            (
                immutable.wrapping_add(pcs),
                immutable.wrapping_add(scopes),
                immutable.wrapping_add(scopes),
                immutable.wrapping_add(size),
                mutable.wrapping_add(relocation),
                mutable.wrapping_add(mutable_size),
            )
        }
        None => {
            let pcs = memory.read_i32(field_at(jvm, blob, Field::NmethodScopesPcsOffset)?)? as u64;
            let deps =
                memory.read_i32(field_at(jvm, blob, Field::NmethodDependenciesOffset)?)? as u64;
            let scopes_begin = match layout.offset(Field::NmethodScopesDataBegin) {
                Some(at) => memory.read_ptr(blob.wrapping_add(at))?,
                // JDK 8: an offset from the blob, as the other sections'.
                None => blob.wrapping_add(memory.read_i32(field_at(
                    jvm,
                    blob,
                    Field::NmethodScopesDataOffset,
                )?)? as u64),
            };
            let metadata =
                memory.read_i32(field_at(jvm, blob, Field::NmethodMetadataOffset)?)? as u64;
            (
                blob.wrapping_add(pcs),
                blob.wrapping_add(deps),
                scopes_begin,
                blob.wrapping_add(pcs),
                blob.wrapping_add(metadata),
                scopes_begin,
            )
        }
    };
    let length = |begin: u64, end: u64| -> Result<usize, UnnamedReason> {
        let len = end.checked_sub(begin).ok_or(UnnamedReason::Unreadable)? as usize;
        if len > MAX_DEBUG_INFO {
            return Err(UnnamedReason::OverBound);
        }
        Ok(len)
    };
    let pc_desc_size = layout.size(TypeSize::PcDesc).unwrap_or(16) as usize;
    let pcs_bytes = read_bytes(memory, pcs_begin, length(pcs_begin, pcs_end)?)?;
    let pc_offset_at = offset(jvm, Field::PcDescPcOffset)? as usize;
    let scope_at = offset(jvm, Field::PcDescScopeDecodeOffset)? as usize;
    let mut pcs: Vec<(i32, i32)> = pcs_bytes
        .chunks_exact(pc_desc_size.max(8))
        .filter_map(|desc| {
            let pc = i32::from_le_bytes(desc.get(pc_offset_at..pc_offset_at + 4)?.try_into().ok()?);
            let scope = i32::from_le_bytes(desc.get(scope_at..scope_at + 4)?.try_into().ok()?);
            Some((pc, scope))
        })
        .collect();
    pcs.sort_by_key(|(pc, _)| *pc);
    let scopes = read_bytes(memory, scopes_begin, length(scopes_begin, scopes_end)?)?;
    let metadata = read_bytes(
        memory,
        metadata_begin,
        length(metadata_begin, metadata_end)?,
    )?
    .chunks_exact(8)
    .map(|word| u64::from_le_bytes(word.try_into().unwrap_or_default()))
    .collect();
    Ok(BlobInfo::Nmethod(MemoryNmethod {
        method,
        comp_level,
        code_begin,
        pcs,
        scopes,
        metadata,
        excludes_zero: jvm.facts.unsigned5_excludes_zero,
        names: HashMap::new(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_reads_are_tried_again_and_names_stand() {
        let failed = Cached::<u32>::new(Err(UnnamedReason::Unreadable));
        let named = Cached::new(Ok(7));
        let soon = failed.read_at + RETRY_FAILED_AFTER / 2;
        let later = failed.read_at + RETRY_FAILED_AFTER;
        assert_eq!(failed.current(soon), Some(Err(UnnamedReason::Unreadable)));
        assert_eq!(
            failed.current(later),
            None,
            "a failure must not stand for good"
        );
        assert_eq!(named.current(later + RETRY_FAILED_AFTER * 100), Some(Ok(7)));
    }

    #[test]
    fn scope_chains_follow_senders_innermost_first() {
        // Scope stream (pre-JDK 20 encoding, all values < 192 so one byte each):
        // offset 1: sender 0, method 1, bci+1 = 6   (outer, bci 5)
        // offset 4: sender 1, method 2, bci+1 = 3   (inner, bci 2)
        let scopes = vec![0, 0, 1, 6, 1, 2, 3];
        let metadata = vec![0xAAAA, 0xBBBB];
        let pcs = vec![(-1, 0), (10, 4), (20, 1)];
        // A return address at 10 matches exactly; a sampled pc at 15 takes the next PcDesc (20).
        assert_eq!(
            scope_chain(&pcs, &scopes, &metadata, 10, false, false),
            vec![(0xBBBB, 2), (0xAAAA, 5)]
        );
        assert_eq!(
            scope_chain(&pcs, &scopes, &metadata, 15, true, false),
            vec![(0xAAAA, 5)]
        );
        // Past the last PcDesc: nothing known.
        assert!(scope_chain(&pcs, &scopes, &metadata, 25, true, false).is_empty());
    }
}
