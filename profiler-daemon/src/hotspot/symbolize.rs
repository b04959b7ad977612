//! Java frames to class, method, signature, source file, line and inlined frames, from the
//! JVM's memory (no agent needed).
//!
//! - Interpreted frames carry a `Method*` and a bci: names come from the method's constant pool,
//!   the line from the `ConstMethod`'s compressed line number table.
//! - Compiled frames carry a `CodeBlob*` and a pc offset: for an nmethod, the `PcDesc` of that pc
//!   gives a scope chain (innermost first) of (Method*, bci) pairs: the inlined frames. Other
//!   blobs (stubs, adapters) are named by `CodeBlob::_name`.
//!
//! With the JVMTI sidecar loaded (see `crate::sidecar`), a compiled frame whose nmethod the agent
//! reported (same code start and `Method*`) takes its inline chain, names and lines from the
//! agent's records instead; anything else still comes from memory.
//!
//! Everything read is validated and cached per (Method*, cookie) and (CodeBlob*, compile id),
//! per process: a cookie mismatch means the memory was reused, and the frame is shown as
//! unknown rather than misnamed. Hidden and lambda classes lose their `+0x...` address suffix so
//! names stay stable (low cardinality) across runs.

use std::collections::HashMap;
use std::sync::Arc;

use profiler_common::{FrameKind, UserFrame, BCI_UNKNOWN};

use super::jvm::Jvm;
use super::remote::{ReadError, RemoteMemory};
use super::unsigned5::Reader;
use crate::sidecar::SidecarIndex;
use crate::symbolize::{ResolvedFrame, SourceLine};

/// Bounds on what is read from a JVM for one method or nmethod.
const MAX_SYMBOL: usize = 65_535;
const MAX_LINE_TABLE: usize = 64 * 1024;
const MAX_DEBUG_INFO: usize = 1 << 20;
const MAX_SCOPE_DEPTH: usize = 64;
/// Cached entries per JVM before the caches start over.
const MAX_CACHED: usize = 100_000;

/// How a Java frame ran, shown as async-profiler's suffixes when annotation is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JavaFrameKind {
    Interpreted,
    /// C1 (tiers 1 to 3).
    C1,
    /// C2 (tier 4), or any other compiler.
    Jit,
    Inlined,
}

impl JavaFrameKind {
    pub fn suffix(self) -> &'static str {
        match self {
            Self::Interpreted => "_[0]",
            Self::C1 => "_[1]",
            Self::Jit => "_[j]",
            Self::Inlined => "_[i]",
        }
    }
}

/// A method's names and line table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MethodInfo {
    /// `java.lang.Thread`
    pub class: String,
    pub name: String,
    /// `(Ljava/lang/Runnable;)V`
    pub signature: String,
    /// `java/lang/Thread.java`
    pub file: Option<String>,
    /// (start bci, line), sorted by bci.
    pub lines: Vec<(u32, u32)>,
}

impl MethodInfo {
    pub fn line_of(&self, bci: u32) -> u32 {
        let index = self.lines.partition_point(|(start, _)| *start <= bci);
        if index == 0 {
            return self.lines.first().map_or(0, |(_, line)| *line);
        }
        self.lines[index - 1].1
    }
}

/// What a code blob is.
#[derive(Clone, Debug)]
enum BlobInfo {
    Nmethod {
        method: u64,
        comp_level: i32,
        /// Where its instructions start (the sidecar's key).
        code_begin: u64,
        /// (pc offset, scope decode offset), sorted by pc offset.
        pcs: Vec<(i32, i32)>,
        scopes: Vec<u8>,
        metadata: Vec<u64>,
        /// Its methods' names, read with the blob (when its first sample arrives): later, a
        /// `Method*` of an unloaded class may belong to another one.
        names: HashMap<u64, Option<Arc<MethodInfo>>>,
    },
    Stub {
        name: String,
    },
}

/// Per-JVM state: its layout and caches.
struct JvmSymbols<M: RemoteMemory> {
    jvm: Jvm,
    memory: M,
    methods: HashMap<(u64, u32), Option<Arc<MethodInfo>>>,
    blobs: HashMap<(u64, u32), Option<Arc<BlobInfo>>>,
    /// The agent's records, if this is a live process whose namespace pid is known.
    sidecar: Option<SidecarIndex>,
    /// Whether a frame was named from the sidecar yet (logged once per JVM).
    sidecar_used: bool,
}

/// The sidecar agents' own reports, summed over the JVMs tracked.
#[derive(Clone, Debug, Default)]
pub struct SidecarTotals {
    /// Agents that reported their stats.
    pub agents: u64,
    pub heap_live_bytes: u64,
    /// Records the agents could not write since the previous call.
    pub new_dropped_records: u64,
    /// JVMs whose records file was last refused or unreadable, by reason.
    pub refused: std::collections::BTreeMap<&'static str, u64>,
}

/// Resolves Java frames of many JVMs.
pub struct JavaSymbolizer<M: RemoteMemory> {
    jvms: HashMap<u32, JvmSymbols<M>>,
    /// Append async-profiler style kind suffixes (`_[j]`, `_[i]`, `_[0]`, `_[1]`).
    annotate: bool,
}

impl<M: RemoteMemory> JavaSymbolizer<M> {
    pub fn new(annotate: bool) -> Self {
        Self {
            jvms: HashMap::new(),
            annotate,
        }
    }

    pub fn has(&self, pid: u32) -> bool {
        self.jvms.contains_key(&pid)
    }

    pub fn add(&mut self, jvm: Jvm, memory: M) {
        let sidecar = crate::sidecar::attach::Target::of(jvm.pid)
            .ok()
            .map(|target| SidecarIndex::new(target.pid, target.nspid, target.euid));
        self.jvms.insert(
            jvm.pid,
            JvmSymbols {
                jvm,
                memory,
                methods: HashMap::new(),
                blobs: HashMap::new(),
                sidecar,
                sidecar_used: false,
            },
        );
    }

    /// Nmethods the sidecar agent reported in `pid` (0 without an agent).
    pub fn sidecar_nmethods(&mut self, pid: u32) -> usize {
        let Some(sidecar) = self.jvms.get_mut(&pid).and_then(|j| j.sidecar.as_mut()) else {
            return 0;
        };
        sidecar.refresh();
        sidecar.len()
    }

    /// The Java thread names the sidecar agent reported in `pid`, if it has an agent.
    pub fn thread_names(&mut self, pid: u32) -> Option<&mut crate::sidecar::threads::ThreadNames> {
        let sidecar = self.jvms.get_mut(&pid)?.sidecar.as_mut()?;
        sidecar.refresh();
        Some(&mut sidecar.threads)
    }

    /// What the sidecar agents of all JVMs report about themselves.
    pub fn sidecar_totals(&mut self) -> SidecarTotals {
        let mut totals = SidecarTotals::default();
        for sidecar in self.jvms.values_mut().filter_map(|j| j.sidecar.as_mut()) {
            sidecar.refresh();
            if let Some(stats) = sidecar.agent_stats() {
                totals.agents += 1;
                totals.heap_live_bytes += stats.heap_live_bytes;
            }
            totals.new_dropped_records += sidecar.take_new_drops();
            if let Some(reason) = sidecar.refused() {
                *totals.refused.entry(reason).or_default() += 1;
            }
        }
        totals
    }

    pub fn remove(&mut self, pid: u32) {
        self.jvms.remove(&pid);
    }

    pub fn pids(&self) -> Vec<u32> {
        self.jvms.keys().copied().collect()
    }

    /// Resolves one Java frame of `pid`. `top` is true for the interrupted frame (its pc is
    /// not a return address).
    pub fn resolve(&mut self, pid: u32, frame: &UserFrame, top: bool) -> ResolvedFrame {
        let annotate = self.annotate;
        let Some(jvm) = self.jvms.get_mut(&pid) else {
            return ResolvedFrame::named("[unknown java frame]", None);
        };
        if jvm.methods.len() > MAX_CACHED || jvm.blobs.len() > MAX_CACHED {
            jvm.methods.clear();
            jvm.blobs.clear();
        }
        match FrameKind::from_u8(frame.kind) {
            Some(FrameKind::Interpreted) => {
                let method = jvm.method(frame.addr, Some(frame.cookie));
                let bci = (frame.aux != BCI_UNKNOWN).then_some(frame.aux);
                ResolvedFrame {
                    lines: vec![java_line(
                        method.as_deref(),
                        bci,
                        JavaFrameKind::Interpreted,
                        annotate,
                    )],
                    module: None,
                }
            }
            Some(FrameKind::Compiled) => jvm.compiled(frame, top, annotate),
            _ => ResolvedFrame::named("[unknown java frame]", None),
        }
    }
}

/// One line of a Java frame.
fn java_line(
    method: Option<&MethodInfo>,
    bci: Option<u32>,
    kind: JavaFrameKind,
    annotate: bool,
) -> SourceLine {
    let suffix = if annotate { kind.suffix() } else { "" };
    match method {
        Some(method) => SourceLine {
            function: format!("{}.{}{suffix}", method.class, method.name),
            system_name: Some(format!(
                "{}.{}{}",
                method.class, method.name, method.signature
            )),
            file: method.file.clone(),
            line: bci.map_or(0, |bci| method.line_of(bci)),
        },
        None => SourceLine {
            function: format!("[unknown java method]{suffix}"),
            system_name: None,
            file: None,
            line: 0,
        },
    }
}

impl<M: RemoteMemory> JvmSymbols<M> {
    fn method(&mut self, method: u64, cookie: Option<u32>) -> Option<Arc<MethodInfo>> {
        let key = (method, cookie.unwrap_or(0));
        if let Some(cached) = self.methods.get(&key) {
            return cached.clone();
        }
        let info = read_method(&self.jvm, &self.memory, method, cookie)
            .ok()
            .map(Arc::new);
        self.methods.insert(key, info.clone());
        info
    }

    /// Names the methods of a freshly read nmethod: its own and every one its scopes name,
    /// each verified by its identity as it is now (while the nmethod lives, its methods do).
    fn with_names(&mut self, mut blob: BlobInfo) -> BlobInfo {
        if let BlobInfo::Nmethod {
            method,
            pcs,
            scopes,
            metadata,
            names,
            ..
        } = &mut blob
        {
            let mut wanted = vec![*method];
            for (pc_offset, _) in pcs.iter() {
                for (scope_method, _) in scope_chain(
                    pcs,
                    scopes,
                    metadata,
                    *pc_offset,
                    false,
                    self.jvm.facts.unsigned5_excludes_zero,
                ) {
                    wanted.push(scope_method);
                }
            }
            wanted.sort_unstable();
            wanted.dedup();
            for scope_method in wanted {
                let info = read_identity(&self.jvm, &self.memory, scope_method)
                    .ok()
                    .and_then(|identity| self.method(scope_method, Some(identity.cookie)));
                names.insert(scope_method, info);
            }
        }
        blob
    }

    fn compiled(&mut self, frame: &UserFrame, top: bool, annotate: bool) -> ResolvedFrame {
        let key = (frame.addr, frame.cookie);
        let blob = match self.blobs.get(&key) {
            Some(cached) => cached.clone(),
            None => {
                let info = read_blob(&self.jvm, &self.memory, frame.addr, frame.cookie)
                    .ok()
                    .map(|blob| Arc::new(self.with_names(blob)));
                self.blobs.insert(key, info.clone());
                info
            }
        };
        match blob.as_deref() {
            Some(BlobInfo::Stub { name }) => ResolvedFrame::named(format!("[{name}]"), None),
            Some(BlobInfo::Nmethod {
                method,
                comp_level,
                code_begin,
                pcs,
                scopes,
                metadata,
                names,
            }) => {
                let kind = if (1..=3).contains(comp_level) {
                    JavaFrameKind::C1
                } else {
                    JavaFrameKind::Jit
                };
                let root = names.get(method).cloned().flatten();
                if let Some(resolved) = self.sidecar_frame(
                    *code_begin,
                    *method,
                    root.as_deref(),
                    frame.aux,
                    top,
                    kind,
                    annotate,
                ) {
                    return resolved;
                }
                let chain = scope_chain(
                    pcs,
                    scopes,
                    metadata,
                    frame.aux as i32,
                    top,
                    self.jvm.facts.unsigned5_excludes_zero,
                );
                let mut lines = Vec::with_capacity(chain.len().max(1));
                let outer = chain.len().saturating_sub(1);
                for (index, (scope_method, bci)) in chain.iter().enumerate() {
                    let info = names.get(scope_method).cloned().flatten();
                    let frame_kind = if index == outer {
                        kind
                    } else {
                        JavaFrameKind::Inlined
                    };
                    lines.push(java_line(
                        info.as_deref(),
                        (*bci >= 0).then_some(*bci as u32),
                        frame_kind,
                        annotate,
                    ));
                }
                if lines.is_empty() {
                    // No debug info at this pc (e.g. in the prologue): the method alone.
                    lines.push(java_line(root.as_deref(), None, kind, annotate));
                }
                ResolvedFrame {
                    lines,
                    module: None,
                }
            }
            None => ResolvedFrame::named("[unknown compiled frame]", None),
        }
    }
}

impl<M: RemoteMemory> JvmSymbols<M> {
    /// The frame from the agent's records, if it reported this very nmethod (same code start
    /// and Method*; code reuse changes at least one) and has a chain at this pc.
    #[allow(clippy::too_many_arguments)]
    fn sidecar_frame(
        &mut self,
        code_begin: u64,
        method: u64,
        root: Option<&MethodInfo>,
        pc_offset: u32,
        top: bool,
        kind: JavaFrameKind,
        annotate: bool,
    ) -> Option<ResolvedFrame> {
        let sidecar = self.sidecar.as_mut()?;
        sidecar.refresh();
        let nmethod = sidecar.nmethod(code_begin)?;
        if nmethod.method_ptr != method || pc_offset > nmethod.code_size {
            return None;
        }
        // Code and metadata addresses are reused by same-shape classes of a later generation,
        // and the agent's unload record may not have been read yet: the record must name the
        // method memory names for this very nmethod (read when its first sample arrived).
        let recorded = nmethod.root()?;
        let root = root?;
        if recorded.class != root.class
            || recorded.name != root.name
            || recorded.signature != root.signature
        {
            return None;
        }
        let chain = nmethod.chain(pc_offset, top);
        if chain.is_empty() {
            return None;
        }
        if !self.sidecar_used {
            self.sidecar_used = true;
            tracing::info!(
                pid = self.jvm.pid,
                nmethods = sidecar.len(),
                "java frames named from the sidecar agent's records"
            );
        }
        let outer = chain.len() - 1;
        let lines = chain
            .iter()
            .enumerate()
            .map(|(index, (info, bci))| {
                let frame_kind = if index == outer {
                    kind
                } else {
                    JavaFrameKind::Inlined
                };
                java_line(Some(info), u32::try_from(*bci).ok(), frame_kind, annotate)
            })
            .collect();
        Some(ResolvedFrame {
            lines,
            module: None,
        })
    }
}

/// The (Method*, bci) chain at a pc offset, innermost first.
fn scope_chain(
    pcs: &[(i32, i32)],
    scopes: &[u8],
    metadata: &[u64],
    pc_offset: i32,
    top: bool,
    excludes_zero: bool,
) -> Vec<(u64, i32)> {
    // A return address matches its call's PcDesc exactly. A sampled pc lies inside the region a
    // PcDesc ends: take the first one past it (as AsyncGetCallTrace's pc_desc_near(pc + 1)).
    let index = if top {
        pcs.partition_point(|(offset, _)| *offset <= pc_offset)
    } else {
        pcs.partition_point(|(offset, _)| *offset < pc_offset)
    };
    let Some(&(_, mut decode_offset)) = pcs.get(index) else {
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

fn offset(jvm: &Jvm, key: &str) -> Result<u64, ReadError> {
    jvm.layout.offset(key).ok_or(ReadError::Null)
}

fn read_bytes(memory: &dyn RemoteMemory, address: u64, len: usize) -> Result<Vec<u8>, ReadError> {
    let mut bytes = vec![0; len];
    memory.read(address, &mut bytes)?;
    Ok(bytes)
}

fn read_symbol(jvm: &Jvm, memory: &dyn RemoteMemory, symbol: u64) -> Result<String, ReadError> {
    let symbol = symbol & !1;
    let length = match jvm.layout.offset("Symbol::_length") {
        Some(at) => memory.read_u16(symbol + at)? as usize,
        None => {
            (memory.read_u32(symbol + offset(jvm, "Symbol::_length_and_refcount")?)? >> 16) as usize
        }
    };
    if length > MAX_SYMBOL {
        return Err(ReadError::Short {
            addr: symbol,
            len: length,
            got: 0,
        });
    }
    let body = read_bytes(memory, symbol + offset(jvm, "Symbol::_body")?, length)?;
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// Constant pool slot `index` (a Symbol* for the UTF-8 entries names and signatures use).
fn constant_pool_symbol(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    cp: u64,
    index: u16,
) -> Result<String, ReadError> {
    let base = jvm.layout.size("ConstantPool").ok_or(ReadError::Null)?;
    let symbol = memory.read_ptr(cp + base + 8 * index as u64)?;
    read_symbol(jvm, memory, symbol)
}

/// `Busy$$Lambda$2+0x00007f8e84000c28` -> `Busy$$Lambda$2`: the address differs every run.
pub(crate) fn stable_class_name(internal: &str) -> String {
    let name = match internal.find("+0x") {
        Some(at) => &internal[..at],
        None => internal,
    };
    name.replace('/', ".")
}

/// The pointers from a `Method` to its class's name, and the cookie they give.
struct MethodIdentity {
    const_method: u64,
    cp: u64,
    holder: u64,
    class_symbol: u64,
    /// What BPF records for an interpreted frame of this method (see
    /// [`profiler_common::interpreted_cookie`]).
    cookie: u32,
}

fn read_identity(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    method: u64,
) -> Result<MethodIdentity, ReadError> {
    let const_method = memory.read_ptr(method + offset(jvm, "Method::_constMethod")?)?;
    let cp = memory.read_ptr(const_method + offset(jvm, "ConstMethod::_constants")?)?;
    let holder = memory.read_ptr(cp + offset(jvm, "ConstantPool::_pool_holder")?)?;
    let class_symbol = memory.read_ptr(holder + offset(jvm, "Klass::_name")?)?;
    let hash_at = super::unwind_info::symbol_hash_word(&jvm.layout);
    let hash_word = if hash_at == profiler_common::NO_SYMBOL_HASH {
        0
    } else {
        memory.read_u32(class_symbol + hash_at as u64)?
    };
    // The name's tail, read as BPF reads it (see `profiler_common::name_tail`).
    let length_at = super::unwind_info::symbol_length(&jvm.layout).ok_or(ReadError::Null)?;
    let length = memory.read_u16(class_symbol + length_at as u64)?;
    let mut tail_bytes = [0u8; profiler_common::NAME_TAIL_BYTES];
    memory.read(
        class_symbol + offset(jvm, "Symbol::_body")? + profiler_common::name_tail_start(length),
        &mut tail_bytes,
    )?;
    let tail = profiler_common::name_tail(tail_bytes, length);
    Ok(MethodIdentity {
        const_method,
        cp,
        holder,
        class_symbol,
        cookie: profiler_common::interpreted_cookie(const_method, hash_word, tail),
    })
}

fn read_method(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    method: u64,
    cookie: Option<u32>,
) -> Result<MethodInfo, ReadError> {
    let identity = read_identity(jvm, memory, method)?;
    if cookie.is_some_and(|cookie| cookie != identity.cookie) {
        // Another method holds this memory now: the sampled one cannot be named.
        return Err(ReadError::Null);
    }
    let MethodIdentity {
        const_method,
        cp,
        holder,
        class_symbol,
        ..
    } = identity;
    let internal_class = read_symbol(jvm, memory, class_symbol)?;
    let name_index = memory.read_u16(const_method + offset(jvm, "ConstMethod::_name_index")?)?;
    let signature_index =
        memory.read_u16(const_method + offset(jvm, "ConstMethod::_signature_index")?)?;
    let name = constant_pool_symbol(jvm, memory, cp, name_index)?;
    let signature = constant_pool_symbol(jvm, memory, cp, signature_index)?;

    let source_index = match jvm.layout.offset("ConstantPool::_source_file_name_index") {
        Some(at) => memory.read_u16(cp + at).ok(),
        None => jvm
            .layout
            .offset("InstanceKlass::_source_file_name_index")
            .and_then(|at| memory.read_u16(holder + at).ok()),
    };
    let file = source_index
        .filter(|i| *i != 0)
        .and_then(|i| constant_pool_symbol(jvm, memory, cp, i).ok())
        .map(|source| {
            // Qualify with the package directory, as pprof file names are paths.
            match internal_class.rfind('/') {
                Some(slash) => format!("{}/{source}", &internal_class[..slash]),
                None => source,
            }
        });
    let lines = read_line_table(jvm, memory, const_method).unwrap_or_default();
    Ok(MethodInfo {
        class: stable_class_name(&internal_class),
        name,
        signature,
        file,
        lines,
    })
}

fn read_line_table(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    const_method: u64,
) -> Result<Vec<(u32, u32)>, ReadError> {
    let flags_at = const_method + offset(jvm, "ConstMethod::_flags")?;
    let flags = match jvm.layout.width("ConstMethod::_flags") {
        Some(2) => memory.read_u16(flags_at)? as u32,
        _ => memory.read_u32(flags_at)?,
    };
    let has_table = jvm.layout.constant("has_linenumber_table").unwrap_or(1) as u32;
    if flags & has_table == 0 {
        return Ok(Vec::new());
    }
    let code_size = memory.read_u16(const_method + offset(jvm, "ConstMethod::_code_size")?)? as u64;
    let start = const_method + jvm.layout.size("ConstMethod").ok_or(ReadError::Null)? + code_size;
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
    table.sort_by_key(|(bci, _)| *bci);
    Ok(table)
}

fn read_blob(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    blob: u64,
    compile_id: u32,
) -> Result<BlobInfo, ReadError> {
    let layout = &jvm.layout;
    let name_ptr = memory.read_u64(blob + offset(jvm, "CodeBlob::_name")?)?;
    let name = memory.read_c_string(name_ptr, 128).unwrap_or_default();
    let is_nmethod = match layout.offset("CodeBlob::_kind") {
        // JDK 23+: CodeBlobKind::Nmethod is 1.
        Some(at) => memory.read_u8(blob + at)? == 1,
        None => name == "nmethod" || name == "native nmethod",
    };
    if !is_nmethod {
        return Ok(BlobInfo::Stub { name });
    }
    let id = memory.read_u32(blob + offset(jvm, "nmethod::_compile_id")?)?;
    if id != compile_id {
        // The blob was freed and reused since the sample.
        return Err(ReadError::Null);
    }
    let method = memory.read_ptr(blob + offset(jvm, "nmethod::_method")?)?;
    let comp_level = memory.read_i32(blob + offset(jvm, "nmethod::_comp_level")?)?;
    // A pointer up to JDK 17, an offset from the blob after (as the BPF unwinder reads it).
    let code_begin = match layout.offset("CodeBlob::_code_begin") {
        Some(at) => memory.read_ptr(blob + at)?,
        None => blob.wrapping_add(
            memory.read_i32(blob + offset(jvm, "CodeBlob::_code_offset")?)? as i64 as u64,
        ),
    };

    // Where the debug info is: inside the blob up to JDK 22, in C-heap "immutable data" after.
    let (pcs_begin, pcs_end, scopes_begin, scopes_end, metadata_begin, metadata_end) = match layout
        .offset("nmethod::_immutable_data")
    {
        Some(immutable_at) => {
            let immutable = memory.read_ptr(blob + immutable_at)?;
            let pcs = memory.read_i32(blob + offset(jvm, "nmethod::_scopes_pcs_offset")?)? as u64;
            let scopes =
                memory.read_i32(blob + offset(jvm, "nmethod::_scopes_data_offset")?)? as u64;
            let size =
                memory.read_i32(blob + offset(jvm, "nmethod::_immutable_data_size")?)? as u64;
            let mutable = memory.read_ptr(blob + offset(jvm, "CodeBlob::_mutable_data")?)?;
            let relocation =
                memory.read_i32(blob + offset(jvm, "CodeBlob::_relocation_size")?)? as u64;
            let mutable_size =
                memory.read_i32(blob + offset(jvm, "CodeBlob::_mutable_data_size")?)? as u64;
            (
                immutable + pcs,
                immutable + scopes,
                immutable + scopes,
                immutable + size,
                mutable + relocation,
                mutable + mutable_size,
            )
        }
        None => {
            let pcs = memory.read_i32(blob + offset(jvm, "nmethod::_scopes_pcs_offset")?)? as u64;
            let deps =
                memory.read_i32(blob + offset(jvm, "nmethod::_dependencies_offset")?)? as u64;
            let scopes_begin =
                memory.read_ptr(blob + offset(jvm, "nmethod::_scopes_data_begin")?)?;
            let metadata =
                memory.read_i32(blob + offset(jvm, "nmethod::_metadata_offset")?)? as u64;
            (
                blob + pcs,
                blob + deps,
                scopes_begin,
                blob + pcs,
                blob + metadata,
                scopes_begin,
            )
        }
    };
    let length = |begin: u64, end: u64| -> Result<usize, ReadError> {
        let len = end.checked_sub(begin).ok_or(ReadError::Null)? as usize;
        if len > MAX_DEBUG_INFO {
            return Err(ReadError::Short {
                addr: begin,
                len,
                got: 0,
            });
        }
        Ok(len)
    };
    let pc_desc_size = layout.size("PcDesc").unwrap_or(16) as usize;
    let pcs_bytes = read_bytes(memory, pcs_begin, length(pcs_begin, pcs_end)?)?;
    let pc_offset_at = offset(jvm, "PcDesc::_pc_offset")? as usize;
    let scope_at = offset(jvm, "PcDesc::_scope_decode_offset")? as usize;
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
    Ok(BlobInfo::Nmethod {
        method,
        comp_level,
        code_begin,
        pcs,
        scopes,
        metadata,
        names: HashMap::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hidden_class_addresses_are_dropped() {
        assert_eq!(
            stable_class_name("Busy$$Lambda$2+0x00007f8e84000c28"),
            "Busy$$Lambda$2"
        );
        assert_eq!(
            stable_class_name("Busy$$Lambda+0x0000000800000c28"),
            "Busy$$Lambda"
        );
        assert_eq!(stable_class_name("java/lang/Thread"), "java.lang.Thread");
    }

    #[test]
    fn lines_come_from_the_last_entry_at_or_before_the_bci() {
        let method = MethodInfo {
            class: "A".into(),
            name: "m".into(),
            signature: "()V".into(),
            file: None,
            lines: vec![(0, 10), (7, 11), (14, 12)],
        };
        assert_eq!(method.line_of(0), 10);
        assert_eq!(method.line_of(6), 10);
        assert_eq!(method.line_of(7), 11);
        assert_eq!(method.line_of(100), 12);
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
