//! The record format shared by the agent (encoder) and the daemon (decoder).
//!
//! A records file is a [`FileHeader`] followed by records. Every number is little-endian. A record
//! is `u32 body length`, then the body: `u8 kind` and the kind's fields. Strings are `u32 length`
//! and UTF-8 bytes (modified UTF-8 from the JVM is kept as is and decoded lossily). Readers skip
//! kinds they do not know, so new kinds can be added without a version bump; changing an
//! existing kind's layout needs a new [`VERSION`].

/// First bytes of a records file.
pub const MAGIC: [u8; 8] = *b"JVMPSIDE";
/// Format version written by this agent.
pub const VERSION: u32 = 1;
/// Size of [`FileHeader`] on disk.
pub const HEADER_LEN: usize = 32;
/// Largest record body accepted: bigger means corruption (the agent caps what it writes).
pub const MAX_RECORD_LEN: usize = 16 << 20;

const KIND_COMPILED_METHOD_LOAD: u8 = 1;
const KIND_COMPILED_METHOD_UNLOAD: u8 = 2;
const KIND_DYNAMIC_CODE: u8 = 3;
const KIND_AGENT_STATS: u8 = 4;
const KIND_AGENT_STATUS: u8 = 5;
const KIND_THREAD_START: u8 = 6;
const KIND_THREAD_END: u8 = 7;
const KIND_LIVE_THREAD: u8 = 8;

/// Longest thread name the agent writes, in bytes (longer ones are cut); readers bound what
/// they keep to this too.
pub const MAX_THREAD_NAME_BYTES: usize = 128;

/// Start of every records file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileHeader {
    pub version: u32,
    /// 1 for the first file an agent writes, +1 for every rotation.
    pub generation: u32,
    /// The JVM's pid in its own pid namespace.
    pub pid: u32,
    /// CLOCK_REALTIME nanoseconds when the agent started: tells two agent instances apart.
    pub started_ns: u64,
}

impl FileHeader {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut out = [0u8; HEADER_LEN];
        out[..8].copy_from_slice(&MAGIC);
        out[8..12].copy_from_slice(&self.version.to_le_bytes());
        out[12..16].copy_from_slice(&self.generation.to_le_bytes());
        out[16..20].copy_from_slice(&self.pid.to_le_bytes());
        // 20..24 reserved.
        out[24..32].copy_from_slice(&self.started_ns.to_le_bytes());
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        if bytes.len() < HEADER_LEN {
            return Err(DecodeError::Truncated);
        }
        if bytes[..8] != MAGIC {
            return Err(DecodeError::BadMagic);
        }
        let mut r = Cursor::new(&bytes[8..HEADER_LEN]);
        let version = r.u32()?;
        if version != VERSION {
            return Err(DecodeError::UnsupportedVersion(version));
        }
        let generation = r.u32()?;
        let pid = r.u32()?;
        r.u32()?;
        let started_ns = r.u64()?;
        Ok(Self {
            version,
            generation,
            pid,
            started_ns,
        })
    }
}

/// One line-table entry: from `bci` on, the source line is `line`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LineEntry {
    pub bci: u32,
    pub line: u32,
}

/// A Java method as JVMTI named it when the code was loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MethodInfo {
    /// The `Method*` behind the jmethodID (JDK 25 and older), 0 if unknown.
    pub method_ptr: u64,
    /// JVM form, e.g. `Ljava/lang/Thread;`.
    pub class_signature: String,
    pub name: String,
    /// e.g. `(JI)J`.
    pub signature: String,
    /// Empty if the class has no SourceFile attribute.
    pub source_file: String,
    /// Sorted by bci as the JVM gave them; empty without debug info.
    pub lines: Vec<LineEntry>,
}

impl MethodInfo {
    /// The source line of `bci`: the entry with the greatest start at or below it.
    pub fn line_of(&self, bci: i32) -> Option<u32> {
        let bci = u32::try_from(bci).ok()?;
        self.lines
            .iter()
            .filter(|entry| entry.bci <= bci)
            .max_by_key(|entry| entry.bci)
            .map(|entry| entry.line)
    }
}

/// One frame of an inline chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InlineFrame {
    /// Index into [`CompiledMethod::methods`].
    pub method: u32,
    pub bci: i32,
}

/// The inline chain at one pc of a compiled method.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PcInfo {
    pub pc: u64,
    /// Innermost (the method whose code runs at `pc`) first.
    pub frames: Vec<InlineFrame>,
}

/// A compiled method (nmethod) as `CompiledMethodLoad` described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledMethod {
    pub code_addr: u64,
    pub code_size: u32,
    /// Every method the chains refer to; the compiled (root) method is at index 0.
    pub methods: Vec<MethodInfo>,
    /// Sorted by pc as the JVM gave them; empty without inline records.
    pub pcs: Vec<PcInfo>,
}

impl CompiledMethod {
    pub fn root(&self) -> Option<&MethodInfo> {
        self.methods.first()
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    CompiledMethodLoad(CompiledMethod),
    /// The code at `code_addr` is gone; `method_ptr` as in [`MethodInfo::method_ptr`].
    CompiledMethodUnload {
        method_ptr: u64,
        code_addr: u64,
    },
    /// A stub or other generated code.
    DynamicCode {
        addr: u64,
        size: u32,
        name: String,
    },
    /// How the agent is doing, written every few seconds while it records.
    AgentStats(AgentStats),
    /// What the agent is doing and why: written when it starts, at the start of each
    /// generation and whenever it changes (the last one read is current).
    AgentStatus(AgentStatus),
    /// A Java thread runs as native thread `tid` (its id in the JVM's pid namespace, from
    /// `gettid()`) under `name` (its Java name as the JVM gave it, at most
    /// [`MAX_THREAD_NAME_BYTES`]). Written when the thread starts, and replayed into every
    /// generation for the threads alive.
    ///
    /// Encoded as kind 6: `u32 tid`, `str name`; fields may be appended later.
    ThreadStart {
        tid: u32,
        name: String,
    },
    /// Native thread `tid` (as in [`Record::ThreadStart`]) ended. Kind 7: `u32 tid`.
    ThreadEnd {
        tid: u32,
    },
    /// A Java thread that was alive when the agent listed the JVM's threads (when it loads, and
    /// into every generation), known by its HotSpot `JavaThread*` (the `eetop` field of its
    /// `java.lang.Thread`), since JVMTI gives no native thread id of another thread. Covers
    /// the threads that started before the agent (a dynamic attach) or before VM init, which
    /// have no [`Record::ThreadStart`]; threads that do have one are listed too. `name` as in
    /// [`Record::ThreadStart`].
    ///
    /// The daemon finds the thread's tid by the `JavaThread*` in the JVM's own thread list.
    /// A `JavaThread*` is the address of freed and reused memory once its thread ends: a
    /// reader must not trust the pair for longer than the thread lives, and must let a
    /// [`Record::ThreadStart`] of the same tid win.
    ///
    /// Encoded as kind 8: `u64 java_thread` (never 0), `str name`; fields may be appended
    /// later. Readers older than this kind skip it.
    LiveThread {
        java_thread: u64,
        name: String,
    },
}

/// The agent's own accounting, cumulative since it loaded.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Bytes of heap the agent holds now, and the most it ever held at once.
    pub heap_live_bytes: u64,
    pub heap_peak_bytes: u64,
    /// Records written, and records lost (too big, or the file could not be written).
    pub records_written: u64,
    pub records_dropped: u64,
}

/// [`AgentStatus::flags`]: the agent's callbacks are enabled and records flow. Without it the
/// agent is loaded but inert (see [`AgentStatus::error`]): nothing more will be recorded.
pub const STATUS_RECORDING: u32 = 1 << 0;
/// [`AgentStatus::flags`]: `method_ptr` fields hold the `Method*` behind each jmethodID. Without
/// it they are all 0 (a JVM version the agent does not know, where that read is not safe).
pub const STATUS_METHOD_PTRS: u32 = 1 << 1;
/// [`AgentStatus::flags`]: the agent was told (option `assume_unknown_version`) to treat the JVM
/// as a version it does not know.
pub const STATUS_ASSUMED_UNKNOWN_VERSION: u32 = 1 << 2;

/// The agent's state.
///
/// Encoded as kind 5: `u32 flags`, `u32 jvm_feature_version`, `str jvm_version`, `str error`.
/// Fields may be appended later: readers ignore bytes past the ones they know, so this kind's
/// layout can grow without a [`VERSION`] bump. Readers older than this kind skip it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AgentStatus {
    /// `STATUS_*` bits.
    pub flags: u32,
    /// The JVM's feature version as the agent read it (e.g. 17), 0 if it could not tell.
    pub jvm_feature_version: u32,
    /// The version properties the agent read, e.g. `17 (17.0.16+8-Debian-1deb12u1)`; empty if
    /// none could be read.
    pub jvm_version: String,
    /// Why the agent stopped recording (or could not start); empty while all is well.
    pub error: String,
}

impl AgentStatus {
    pub fn recording(&self) -> bool {
        self.flags & STATUS_RECORDING != 0
    }

    pub fn method_ptrs(&self) -> bool {
        self.flags & STATUS_METHOD_PTRS != 0
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DecodeError {
    Truncated,
    BadMagic,
    UnsupportedVersion(u32),
    TooLong(usize),
    Malformed(&'static str),
}

impl std::fmt::Display for DecodeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Truncated => write!(f, "truncated"),
            Self::BadMagic => write!(f, "not a sidecar records file"),
            Self::UnsupportedVersion(v) => write!(f, "unsupported records version {v}"),
            Self::TooLong(n) => write!(f, "record of {n} bytes is over the limit"),
            Self::Malformed(what) => write!(f, "malformed record: {what}"),
        }
    }
}

impl std::error::Error for DecodeError {}

/// Appends `record` (length prefix included) to `out`.
pub fn encode(record: &Record, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    match record {
        Record::CompiledMethodLoad(method) => {
            out.push(KIND_COMPILED_METHOD_LOAD);
            put_u64(out, method.code_addr);
            put_u32(out, method.code_size);
            put_u32(out, method.methods.len() as u32);
            for info in &method.methods {
                put_u64(out, info.method_ptr);
                put_str(out, &info.class_signature);
                put_str(out, &info.name);
                put_str(out, &info.signature);
                put_str(out, &info.source_file);
                put_u32(out, info.lines.len() as u32);
                for entry in &info.lines {
                    put_u32(out, entry.bci);
                    put_u32(out, entry.line);
                }
            }
            put_u32(out, method.pcs.len() as u32);
            for pc in &method.pcs {
                put_u64(out, pc.pc);
                put_u32(out, pc.frames.len() as u32);
                for frame in &pc.frames {
                    put_u32(out, frame.method);
                    put_u32(out, frame.bci as u32);
                }
            }
        }
        Record::CompiledMethodUnload {
            method_ptr,
            code_addr,
        } => {
            out.push(KIND_COMPILED_METHOD_UNLOAD);
            put_u64(out, *method_ptr);
            put_u64(out, *code_addr);
        }
        Record::DynamicCode { addr, size, name } => {
            out.push(KIND_DYNAMIC_CODE);
            put_u64(out, *addr);
            put_u32(out, *size);
            put_str(out, name);
        }
        Record::AgentStats(stats) => {
            out.push(KIND_AGENT_STATS);
            put_u64(out, stats.heap_live_bytes);
            put_u64(out, stats.heap_peak_bytes);
            put_u64(out, stats.records_written);
            put_u64(out, stats.records_dropped);
        }
        Record::AgentStatus(status) => {
            out.push(KIND_AGENT_STATUS);
            put_u32(out, status.flags);
            put_u32(out, status.jvm_feature_version);
            put_str(out, &status.jvm_version);
            put_str(out, &status.error);
        }
        Record::ThreadStart { tid, name } => {
            out.push(KIND_THREAD_START);
            put_u32(out, *tid);
            put_str(out, name);
        }
        Record::ThreadEnd { tid } => {
            out.push(KIND_THREAD_END);
            put_u32(out, *tid);
        }
        Record::LiveThread { java_thread, name } => {
            out.push(KIND_LIVE_THREAD);
            put_u64(out, *java_thread);
            put_str(out, name);
        }
    }
    let body = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&body.to_le_bytes());
}

/// Decodes the record at the start of `bytes`: `Ok(None)` if it is not complete yet, else the
/// record (`None` inside for a kind this reader does not know) and the bytes it took.
#[allow(clippy::type_complexity)]
pub fn decode(bytes: &[u8]) -> Result<Option<(Option<Record>, usize)>, DecodeError> {
    if bytes.len() < 4 {
        return Ok(None);
    }
    let body_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
    if body_len > MAX_RECORD_LEN {
        return Err(DecodeError::TooLong(body_len));
    }
    if body_len == 0 {
        return Err(DecodeError::Malformed("empty record"));
    }
    let Some(body) = bytes.get(4..4 + body_len) else {
        return Ok(None);
    };
    let mut r = Cursor::new(&body[1..]);
    let record = match body[0] {
        KIND_COMPILED_METHOD_LOAD => {
            let code_addr = r.u64()?;
            let code_size = r.u32()?;
            let method_count = r.count(20)?;
            let mut methods = Vec::with_capacity(method_count);
            for _ in 0..method_count {
                let method_ptr = r.u64()?;
                let class_signature = r.string()?;
                let name = r.string()?;
                let signature = r.string()?;
                let source_file = r.string()?;
                let line_count = r.count(8)?;
                let mut lines = Vec::with_capacity(line_count);
                for _ in 0..line_count {
                    lines.push(LineEntry {
                        bci: r.u32()?,
                        line: r.u32()?,
                    });
                }
                methods.push(MethodInfo {
                    method_ptr,
                    class_signature,
                    name,
                    signature,
                    source_file,
                    lines,
                });
            }
            let pc_count = r.count(12)?;
            let mut pcs = Vec::with_capacity(pc_count);
            for _ in 0..pc_count {
                let pc = r.u64()?;
                let frame_count = r.count(8)?;
                let mut frames = Vec::with_capacity(frame_count);
                for _ in 0..frame_count {
                    let method = r.u32()?;
                    if method as usize >= methods.len() {
                        return Err(DecodeError::Malformed("inline frame method index"));
                    }
                    frames.push(InlineFrame {
                        method,
                        bci: r.u32()? as i32,
                    });
                }
                pcs.push(PcInfo { pc, frames });
            }
            Some(Record::CompiledMethodLoad(CompiledMethod {
                code_addr,
                code_size,
                methods,
                pcs,
            }))
        }
        KIND_COMPILED_METHOD_UNLOAD => Some(Record::CompiledMethodUnload {
            method_ptr: r.u64()?,
            code_addr: r.u64()?,
        }),
        KIND_DYNAMIC_CODE => Some(Record::DynamicCode {
            addr: r.u64()?,
            size: r.u32()?,
            name: r.string()?,
        }),
        KIND_AGENT_STATS => Some(Record::AgentStats(AgentStats {
            heap_live_bytes: r.u64()?,
            heap_peak_bytes: r.u64()?,
            records_written: r.u64()?,
            records_dropped: r.u64()?,
        })),
        KIND_AGENT_STATUS => Some(Record::AgentStatus(AgentStatus {
            flags: r.u32()?,
            jvm_feature_version: r.u32()?,
            jvm_version: r.string()?,
            error: r.string()?,
        })),
        KIND_THREAD_START => Some(Record::ThreadStart {
            tid: r.u32()?,
            name: r.string()?,
        }),
        KIND_THREAD_END => Some(Record::ThreadEnd { tid: r.u32()? }),
        KIND_LIVE_THREAD => Some(Record::LiveThread {
            java_thread: r.u64()?,
            name: r.string()?,
        }),
        _ => None,
    };
    Ok(Some((record, 4 + body_len)))
}

/// The record at the start of `encoded` if it is a [`Record::ThreadStart`] or
/// [`Record::ThreadEnd`]; other kinds are not decoded (cheap to ask of every record).
pub fn thread_event(encoded: &[u8]) -> Option<Record> {
    match encoded.get(4) {
        Some(&KIND_THREAD_START) | Some(&KIND_THREAD_END) => decode(encoded).ok()??.0,
        _ => None,
    }
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_u64(out: &mut Vec<u8>, value: u64) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, value: &str) {
    put_u32(out, value.len() as u32);
    out.extend_from_slice(value.as_bytes());
}

/// Bounds-checked reads from a record body.
struct Cursor<'a> {
    bytes: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.bytes.len() < n {
            return Err(DecodeError::Malformed("field past the end"));
        }
        let (head, tail) = self.bytes.split_at(n);
        self.bytes = tail;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }

    /// An element count, checked against the bytes left (each element takes at least
    /// `min_size`), so a corrupt count cannot make us allocate gigabytes.
    fn count(&mut self, min_size: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        if n.saturating_mul(min_size) > self.bytes.len() {
            return Err(DecodeError::Malformed("count past the end"));
        }
        Ok(n)
    }

    fn string(&mut self) -> Result<String, DecodeError> {
        let n = self.u32()? as usize;
        Ok(String::from_utf8_lossy(self.take(n)?).into_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Record {
        Record::CompiledMethodLoad(CompiledMethod {
            code_addr: 0x7f00_1000,
            code_size: 512,
            methods: vec![
                MethodInfo {
                    method_ptr: 0x8000_0010,
                    class_signature: "LWorkloads;".into(),
                    name: "inlineOuter".into(),
                    signature: "(JI)J".into(),
                    source_file: "Workloads.java".into(),
                    lines: vec![LineEntry { bci: 0, line: 140 }],
                },
                MethodInfo {
                    name: "inlineMiddle".into(),
                    lines: vec![
                        LineEntry { bci: 0, line: 136 },
                        LineEntry { bci: 6, line: 137 },
                    ],
                    ..MethodInfo::default()
                },
            ],
            pcs: vec![PcInfo {
                pc: 0x7f00_1040,
                frames: vec![
                    InlineFrame { method: 1, bci: 7 },
                    InlineFrame { method: 0, bci: 3 },
                ],
            }],
        })
    }

    #[test]
    fn records_round_trip() {
        let records = [
            sample(),
            Record::CompiledMethodUnload {
                method_ptr: 1,
                code_addr: 2,
            },
            Record::DynamicCode {
                addr: 3,
                size: 4,
                name: "vectorizedMismatch".into(),
            },
            Record::AgentStats(AgentStats {
                heap_live_bytes: 5,
                heap_peak_bytes: 6,
                records_written: 7,
                records_dropped: 8,
            }),
            Record::AgentStatus(AgentStatus {
                flags: STATUS_RECORDING | STATUS_METHOD_PTRS,
                jvm_feature_version: 17,
                jvm_version: "17 (17.0.16+8-Debian-1deb12u1)".into(),
                error: String::new(),
            }),
            Record::AgentStatus(AgentStatus {
                flags: STATUS_ASSUMED_UNKNOWN_VERSION,
                jvm_feature_version: 0,
                jvm_version: String::new(),
                error: "enabling event 68 failed (98)".into(),
            }),
            Record::ThreadStart {
                tid: 4242,
                name: "http-nio-8080-exec-12".into(),
            },
            Record::ThreadEnd { tid: 4242 },
            Record::LiveThread {
                java_thread: 0x7f3a_5c01_2800,
                name: "http-nio-8080-exec-3".into(),
            },
        ];
        let mut bytes = Vec::new();
        for record in &records {
            encode(record, &mut bytes);
        }
        let mut offset = 0;
        for record in &records {
            let (decoded, used) = decode(&bytes[offset..])
                .expect("decodes")
                .expect("complete");
            assert_eq!(decoded.as_ref(), Some(record));
            offset += used;
        }
        assert_eq!(offset, bytes.len());
    }

    #[test]
    fn a_status_record_is_skipped_by_old_readers_and_may_grow() {
        let status = AgentStatus {
            flags: STATUS_RECORDING,
            jvm_feature_version: 25,
            jvm_version: "25 (25+36-LTS)".into(),
            error: String::new(),
        };
        let mut bytes = Vec::new();
        encode(&Record::AgentStatus(status.clone()), &mut bytes);
        assert_eq!(bytes[4], 5, "kind");
        // What a reader without this kind does: skip the body by its length.
        let body_len = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]) as usize;
        assert_eq!(4 + body_len, bytes.len());
        // A later agent appends a field: this reader still decodes what it knows, and takes
        // the whole record.
        bytes.extend_from_slice(&7u64.to_le_bytes());
        let grown = (body_len + 8) as u32;
        bytes[..4].copy_from_slice(&grown.to_le_bytes());
        assert_eq!(
            decode(&bytes),
            Ok(Some((Some(Record::AgentStatus(status)), bytes.len())))
        );
        // Cut inside its strings: malformed, not a panic.
        let mut cut = Vec::new();
        encode(
            &Record::AgentStatus(AgentStatus {
                error: "x".repeat(10),
                ..AgentStatus::default()
            }),
            &mut cut,
        );
        let short = (cut.len() - 4 - 3) as u32;
        cut[..4].copy_from_slice(&short.to_le_bytes());
        cut.truncate(cut.len() - 3);
        assert!(decode(&cut).is_err());
    }

    #[test]
    fn thread_events_are_picked_out_without_decoding_other_kinds() {
        let mut start = Vec::new();
        let thread = Record::ThreadStart {
            tid: 7,
            name: "worker".into(),
        };
        encode(&thread, &mut start);
        assert_eq!(thread_event(&start), Some(thread));
        let mut end = Vec::new();
        encode(&Record::ThreadEnd { tid: 7 }, &mut end);
        assert_eq!(thread_event(&end), Some(Record::ThreadEnd { tid: 7 }));
        let mut other = Vec::new();
        encode(&sample(), &mut other);
        assert_eq!(thread_event(&other), None);
        // Listed threads are not tracked by tid: the agent lists them anew for each generation.
        let mut listed = Vec::new();
        encode(
            &Record::LiveThread {
                java_thread: 0x1000,
                name: "worker".into(),
            },
            &mut listed,
        );
        assert_eq!(listed[4], 8, "kind");
        assert_eq!(thread_event(&listed), None);
        assert_eq!(thread_event(&[]), None);
    }

    #[test]
    fn an_incomplete_record_waits_for_more() {
        let mut bytes = Vec::new();
        encode(&sample(), &mut bytes);
        for cut in 0..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn unknown_kinds_are_skipped_and_garbage_is_rejected() {
        let bytes = [2, 0, 0, 0, 99, 7];
        assert_eq!(decode(&bytes), Ok(Some((None, 6))));
        let mut corrupt = Vec::new();
        encode(&sample(), &mut corrupt);
        corrupt[4 + 1 + 8 + 4] = 0xff; // method count
        assert!(decode(&corrupt).is_err());
        assert!(decode(&[0xff, 0xff, 0xff, 0x7f]).is_err());
    }

    #[test]
    fn line_of_takes_the_last_entry_at_or_below_the_bci() {
        let Record::CompiledMethodLoad(method) = sample() else {
            unreachable!()
        };
        let middle = &method.methods[1];
        assert_eq!(middle.line_of(0), Some(136));
        assert_eq!(middle.line_of(5), Some(136));
        assert_eq!(middle.line_of(9), Some(137));
        assert_eq!(middle.line_of(-1), None);
    }

    #[test]
    fn header_round_trips_and_checks_magic_and_version() {
        let header = FileHeader {
            version: VERSION,
            generation: 3,
            pid: 42,
            started_ns: 1234,
        };
        let bytes = header.encode();
        assert_eq!(FileHeader::decode(&bytes), Ok(header));
        let mut other = bytes;
        other[8] = 9;
        assert_eq!(
            FileHeader::decode(&other),
            Err(DecodeError::UnsupportedVersion(9))
        );
        other[0] = b'X';
        assert_eq!(FileHeader::decode(&other), Err(DecodeError::BadMagic));
    }
}
