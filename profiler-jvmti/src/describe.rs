//! Building a record inside a JVMTI callback, within a byte budget.
//!
//! The counts of what a `CompiledMethodLoad` describes are capped ([`MAX_PCS`] and the like),
//! but a huge method could still make a compiler thread build hundreds of megabytes before the
//! record format's own limit refused the result. So the encoded size is tracked while the record
//! is built, each piece charged before it is copied (strings measured in the JVM's memory, line
//! tables and inline chains by their counts), and the record is given up as soon as it would pass
//! [`MAX_RECORD_BYTES`]. What the agent holds for one record is then bounded by about twice that
//! (the record being built, then its encoding).

use std::collections::HashMap;
use std::ffi::c_void;

use profiler_jvmti_records::record::{
    self, CompiledMethod, InlineFrame, LineEntry, MethodInfo, PcInfo, Record,
};

use crate::ffi::{self, JMethodId, Jvmti, LineNumberEntry};

/// Bounds on what one CompiledMethodLoad may make us describe: a corrupt or huge inline table
/// must not make a JVM thread loop or allocate without limit.
pub const MAX_PCS: usize = 200_000;
pub const MAX_FRAMES_PER_PC: usize = 256;
pub const MAX_METHODS: usize = 4096;
const MAX_CMLR_RECORDS: usize = 16;

/// The most one encoded record may take: the format's limit on a body, and its length prefix.
pub const MAX_RECORD_BYTES: usize = record::MAX_RECORD_LEN + 4;

// Encoded sizes, as `record::encode` lays them out.
/// Length prefix, kind, code address and size, method count, pc count.
const COMPILED_FIXED: usize = 4 + 1 + 8 + 4 + 4 + 4;
/// `method_ptr`, the length prefixes of its four strings, line count.
const METHOD_FIXED: usize = 8 + 4 * 4 + 4;
const LINE: usize = 4 + 4;
/// pc, frame count.
const PC_FIXED: usize = 8 + 4;
const FRAME: usize = 4 + 4;
/// Length prefix, kind, address, size, name length.
const DYNAMIC_CODE_FIXED: usize = 4 + 1 + 8 + 4 + 4;

/// The record would pass its budget: it is dropped.
#[derive(Debug, PartialEq, Eq)]
pub struct OverBudget;

/// The encoded bytes a record being built will take, against a limit.
pub struct Budget {
    used: usize,
    limit: usize,
}

impl Budget {
    pub fn new(limit: usize) -> Self {
        Self { used: 0, limit }
    }

    pub fn used(&self) -> usize {
        self.used
    }

    pub fn charge(&mut self, bytes: usize) -> Result<(), OverBudget> {
        match self.used.checked_add(bytes) {
            Some(used) if used <= self.limit => {
                self.used = used;
                Ok(())
            }
            _ => Err(OverBudget),
        }
    }

    /// Copies a string from the JVM (modified UTF-8, decoded lossily as readers do) once its
    /// encoded length is paid for.
    pub fn string(&mut self, bytes: &[u8]) -> Result<String, OverBudget> {
        self.charge(lossy_len(bytes))?;
        Ok(String::from_utf8_lossy(bytes).into_owned())
    }

    /// Copies a line number table once its encoded length is paid for.
    pub fn lines(&mut self, entries: &[LineNumberEntry]) -> Result<Vec<LineEntry>, OverBudget> {
        self.charge(entries.len().saturating_mul(LINE))?;
        Ok(entries
            .iter()
            .map(|e| LineEntry {
                bci: u32::try_from(e.start_location).unwrap_or(0),
                line: u32::try_from(e.line_number).unwrap_or(0),
            })
            .collect())
    }
}

/// `String::from_utf8_lossy(bytes).len()`, without building it: every invalid sequence
/// becomes one U+FFFD (3 bytes).
fn lossy_len(bytes: &[u8]) -> usize {
    bytes
        .utf8_chunks()
        .map(|chunk| chunk.valid().len() + if chunk.invalid().is_empty() { 0 } else { 3 })
        .sum()
}

/// Where method descriptions come from: JVMTI in the agent, a fake in tests.
pub trait MethodSource {
    /// The `Method*` behind `method`, or 0 when it must not be read.
    fn method_ptr(&self, method: JMethodId) -> u64;

    /// Fills `info` (all but `method_ptr`) with what the JVM says of `method`, paying `budget`
    /// for each piece before copying it.
    fn describe(
        &self,
        method: JMethodId,
        info: &mut MethodInfo,
        budget: &mut Budget,
    ) -> Result<(), OverBudget>;
}

/// `*(Method**)jmethodID` when `enabled` (a JVM version where a jmethodID is that: see
/// [`crate::version`]); 0 otherwise, without touching `method`.
pub fn method_ptr(method: JMethodId, enabled: bool) -> u64 {
    if !enabled || method.is_null() {
        return 0;
    }
    // SAFETY: on the JVM versions `enabled` is given for, a jmethodID handed to us by JVMTI
    // points to a word holding the Method*, which the JVM never frees.
    unsafe { std::ptr::read_volatile(method as *const u64) }
}

/// The JVM, through JVMTI.
pub struct JvmtiSource<'a> {
    pub jvmti: &'a Jvmti,
    pub method_ptrs: bool,
}

impl MethodSource for JvmtiSource<'_> {
    fn method_ptr(&self, method: JMethodId) -> u64 {
        method_ptr(method, self.method_ptrs)
    }

    fn describe(
        &self,
        method: JMethodId,
        info: &mut MethodInfo,
        budget: &mut Budget,
    ) -> Result<(), OverBudget> {
        if let Some((name, signature)) = self.jvmti.method_name(method) {
            info.name = budget.string(name.bytes())?;
            info.signature = budget.string(signature.bytes())?;
        }
        if let Some(class) = self.jvmti.declaring_class(method) {
            if let Some(signature) = self.jvmti.class_signature(class) {
                info.class_signature = budget.string(signature.bytes())?;
            }
            if let Some(file) = self.jvmti.source_file_name(class) {
                info.source_file = budget.string(file.bytes())?;
            }
        }
        if let Some(table) = self.jvmti.line_number_table(method) {
            info.lines = budget.lines(table.entries())?;
        }
        Ok(())
    }
}

fn describe_method(
    source: &impl MethodSource,
    method: JMethodId,
    budget: &mut Budget,
) -> Result<MethodInfo, OverBudget> {
    budget.charge(METHOD_FIXED)?;
    let mut info = MethodInfo {
        method_ptr: source.method_ptr(method),
        ..MethodInfo::default()
    };
    source.describe(method, &mut info, budget)?;
    Ok(info)
}

/// The encoded `CompiledMethodLoad` record of a compiled method, or [`OverBudget`] as soon as
/// it would take more than `limit` bytes.
///
/// # Safety
/// `compile_info` is null or the chain of `jvmtiCompiledMethodLoadRecordHeader`s JVMTI passed to
/// the current CompiledMethodLoad callback.
pub unsafe fn compiled_method_load(
    source: &impl MethodSource,
    method: JMethodId,
    code_size: u32,
    code_addr: u64,
    compile_info: *const c_void,
    limit: usize,
) -> Result<Vec<u8>, OverBudget> {
    let mut budget = Budget::new(limit);
    budget.charge(COMPILED_FIXED)?;
    let mut methods = vec![describe_method(source, method, &mut budget)?];
    let mut index: HashMap<usize, u32> = HashMap::from([(method as usize, 0)]);
    let mut pcs = Vec::new();
    let mut header = compile_info as *const ffi::CmlrHeader;
    for _ in 0..MAX_CMLR_RECORDS {
        if header.is_null() {
            break;
        }
        // SAFETY: compile_info is null or a chain of record headers valid during the callback.
        let h = unsafe { &*header };
        if h.kind == ffi::CMLR_INLINE_INFO && h.major == 1 {
            // SAFETY: an INLINE_INFO header starts a jvmtiCompiledMethodLoadInlineRecord.
            let rec = unsafe { &*(header as *const ffi::CmlrInlineRecord) };
            let numpcs = usize::try_from(rec.numpcs).unwrap_or(0).min(MAX_PCS);
            for i in 0..numpcs {
                if rec.pcinfo.is_null() {
                    break;
                }
                // SAFETY: pcinfo has numpcs entries.
                let pc = unsafe { &*rec.pcinfo.add(i) };
                let depth = usize::try_from(pc.numstackframes)
                    .unwrap_or(0)
                    .min(MAX_FRAMES_PER_PC);
                budget.charge(PC_FIXED)?;
                let mut frames = Vec::with_capacity(depth);
                for j in 0..depth {
                    if pc.methods.is_null() || pc.bcis.is_null() {
                        break;
                    }
                    // SAFETY: methods and bcis have numstackframes entries.
                    let (m, bci) = unsafe { (*pc.methods.add(j), *pc.bcis.add(j)) };
                    let slot = match index.get(&(m as usize)) {
                        Some(slot) => *slot,
                        None if methods.len() < MAX_METHODS => {
                            let slot = methods.len() as u32;
                            methods.push(describe_method(source, m, &mut budget)?);
                            index.insert(m as usize, slot);
                            slot
                        }
                        None => break,
                    };
                    budget.charge(FRAME)?;
                    frames.push(InlineFrame { method: slot, bci });
                }
                pcs.push(PcInfo {
                    pc: pc.pc as u64,
                    frames,
                });
            }
        }
        header = h.next;
    }
    drop(index);
    encode_exact(
        &Record::CompiledMethodLoad(CompiledMethod {
            code_addr,
            code_size,
            methods,
            pcs,
        }),
        &budget,
    )
}

/// The encoded `DynamicCode` record of a stub, or [`OverBudget`] if its name is too long.
pub fn dynamic_code(
    addr: u64,
    size: u32,
    name: &[u8],
    limit: usize,
) -> Result<Vec<u8>, OverBudget> {
    let mut budget = Budget::new(limit);
    budget.charge(DYNAMIC_CODE_FIXED)?;
    let name = budget.string(name)?;
    encode_exact(&Record::DynamicCode { addr, size, name }, &budget)
}

/// The encoded `ThreadStart` record of native thread `tid` named `name` (modified UTF-8 from
/// JVMTI, read lossily), cut to [`record::MAX_THREAD_NAME_BYTES`] on a character boundary.
pub fn thread_start(tid: u32, name: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    record::encode(
        &Record::ThreadStart {
            tid,
            name: thread_name(name),
        },
        &mut bytes,
    );
    bytes
}

/// The encoded `LiveThread` record of the thread whose `JavaThread*` is `java_thread`, its
/// name as in [`thread_start`].
pub fn live_thread(java_thread: u64, name: &[u8]) -> Vec<u8> {
    let mut bytes = Vec::new();
    record::encode(
        &Record::LiveThread {
            java_thread,
            name: thread_name(name),
        },
        &mut bytes,
    );
    bytes
}

/// A JVM thread name read lossily, cut to [`record::MAX_THREAD_NAME_BYTES`] on a character
/// boundary.
fn thread_name(name: &[u8]) -> String {
    let name = String::from_utf8_lossy(name);
    let mut end = name.len().min(record::MAX_THREAD_NAME_BYTES);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    name[..end].to_owned()
}

/// Encodes into a buffer of the size `budget` counted, allocated once (and fallibly: a failed
/// allocation drops the record rather than aborting the JVM).
fn encode_exact(record: &Record, budget: &Budget) -> Result<Vec<u8>, OverBudget> {
    let mut bytes = Vec::new();
    bytes
        .try_reserve_exact(budget.used())
        .map_err(|_| OverBudget)?;
    record::encode(record, &mut bytes);
    debug_assert_eq!(bytes.len(), budget.used(), "size estimate off");
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::ptr::null;
    use std::rc::Rc;

    struct FakeMethod {
        name: Rc<[u8]>,
        lines: Vec<LineNumberEntry>,
    }

    /// Methods by jmethodID (small integers, never dereferenced).
    #[derive(Default)]
    struct Fake {
        methods: HashMap<usize, FakeMethod>,
        described: Cell<usize>,
    }

    impl Fake {
        fn add(&mut self, id: usize, name: &Rc<[u8]>, lines: &[(i64, i32)]) -> JMethodId {
            self.methods.insert(
                id,
                FakeMethod {
                    name: Rc::clone(name),
                    lines: lines
                        .iter()
                        .map(|&(start_location, line_number)| LineNumberEntry {
                            start_location,
                            line_number,
                        })
                        .collect(),
                },
            );
            id as JMethodId
        }
    }

    impl MethodSource for Fake {
        fn method_ptr(&self, method: JMethodId) -> u64 {
            0x1000 + method as u64
        }

        fn describe(
            &self,
            method: JMethodId,
            info: &mut MethodInfo,
            budget: &mut Budget,
        ) -> Result<(), OverBudget> {
            self.described.set(self.described.get() + 1);
            let Some(fake) = self.methods.get(&(method as usize)) else {
                return Ok(());
            };
            info.name = budget.string(&fake.name)?;
            info.signature = budget.string(b"(JI)J")?;
            info.class_signature = budget.string(b"LWorkloads;")?;
            info.source_file = budget.string(b"Workloads.java")?;
            info.lines = budget.lines(&fake.lines)?;
            Ok(())
        }
    }

    /// An inline record whose pcs all share one chain (`methods`, `bcis`).
    struct Inline {
        _methods: Vec<JMethodId>,
        _bcis: Vec<i32>,
        _pcs: Vec<ffi::PcStackInfo>,
        record: ffi::CmlrInlineRecord,
    }

    fn inline_record(numpcs: usize, chain: &[(JMethodId, i32)]) -> Box<Inline> {
        let methods: Vec<JMethodId> = chain.iter().map(|c| c.0).collect();
        let bcis: Vec<i32> = chain.iter().map(|c| c.1).collect();
        let pcs: Vec<ffi::PcStackInfo> = (0..numpcs)
            .map(|i| ffi::PcStackInfo {
                pc: (0x7f00_1000 + 4 * i) as *const c_void,
                numstackframes: chain.len() as i32,
                methods: methods.as_ptr(),
                bcis: bcis.as_ptr(),
            })
            .collect();
        let record = ffi::CmlrInlineRecord {
            header: ffi::CmlrHeader {
                kind: ffi::CMLR_INLINE_INFO,
                major: 1,
                minor: 0,
                next: null(),
            },
            numpcs: numpcs as i32,
            pcinfo: pcs.as_ptr(),
        };
        Box::new(Inline {
            _methods: methods,
            _bcis: bcis,
            _pcs: pcs,
            record,
        })
    }

    fn build(
        fake: &Fake,
        root: JMethodId,
        inline: &Inline,
        limit: usize,
    ) -> Result<Vec<u8>, OverBudget> {
        let info = &inline.record as *const ffi::CmlrInlineRecord as *const c_void;
        // SAFETY: `info` is a well-formed inline record alive for the call.
        unsafe { compiled_method_load(fake, root, 512, 0x7f00_1000, info, limit) }
    }

    #[test]
    fn a_record_is_sized_exactly_and_kept_within_its_budget() {
        let mut fake = Fake::default();
        let outer = fake.add(1, &Rc::from(&b"inlineOuter"[..]), &[(0, 140)]);
        let middle = fake.add(2, &Rc::from(&b"inlineMiddle"[..]), &[(0, 136), (6, 137)]);
        let inner = fake.add(3, &Rc::from(&b"inlineInner"[..]), &[]);
        let inline = inline_record(2, &[(inner, 7), (middle, 3), (outer, 1)]);
        let bytes = build(&fake, outer, &inline, MAX_RECORD_BYTES).expect("fits");
        let (decoded, used) = record::decode(&bytes).expect("decodes").expect("complete");
        assert_eq!(used, bytes.len());
        let Some(Record::CompiledMethodLoad(method)) = decoded else {
            panic!("{decoded:?}")
        };
        let names: Vec<_> = method.methods.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(names, ["inlineOuter", "inlineInner", "inlineMiddle"]);
        assert_eq!(method.methods[0].method_ptr, 0x1001);
        assert_eq!(method.methods[2].lines[1], LineEntry { bci: 6, line: 137 });
        assert_eq!(method.pcs.len(), 2);
        assert_eq!(
            method.pcs[1].frames,
            [
                InlineFrame { method: 1, bci: 7 },
                InlineFrame { method: 2, bci: 3 },
                InlineFrame { method: 0, bci: 1 },
            ]
        );
        // The estimate is exact: a budget of exactly the size fits, one byte less does not.
        assert!(build(&fake, outer, &inline, bytes.len()).is_ok());
        assert_eq!(
            build(&fake, outer, &inline, bytes.len() - 1),
            Err(OverBudget)
        );
    }

    #[test]
    fn a_huge_method_is_given_up_at_the_budget_before_it_is_built() {
        // The agent's budget is 16 MiB; 1 MiB here keeps this test's memory small (other tests
        // measure the heap) and shows the same: building stops where the budget runs out.
        const LIMIT: usize = 1 << 20;
        // Names of 64 KiB each: 16 of them fill the budget; the other 240 are never copied.
        let mut fake = Fake::default();
        let name: Rc<[u8]> = vec![b'm'; 64 << 10].into();
        let chain: Vec<(JMethodId, i32)> =
            (1..=256).map(|id| (fake.add(id, &name, &[]), 0)).collect();
        let inline = inline_record(1, &chain);
        assert_eq!(build(&fake, chain[0].0, &inline, LIMIT), Err(OverBudget));
        assert!(
            fake.described.get() <= 17,
            "{} methods described",
            fake.described.get()
        );
        assert!(build(&fake, chain[0].0, &inline, 32 * LIMIT).is_ok());

        // The most pcs allowed, each with the deepest chain: 400 MB if built.
        let mut fake = Fake::default();
        let name: Rc<[u8]> = Rc::from(&b"m"[..]);
        let chain: Vec<(JMethodId, i32)> = (1..=MAX_FRAMES_PER_PC)
            .map(|id| (fake.add(id, &name, &[(0, 1)]), 0))
            .collect();
        let inline = inline_record(MAX_PCS, &chain);
        assert_eq!(build(&fake, chain[0].0, &inline, LIMIT), Err(OverBudget));
        assert_eq!(
            build(&fake, chain[0].0, &inline, MAX_RECORD_BYTES),
            Err(OverBudget)
        );

        // A line table past the budget is refused before it is copied.
        let mut fake = Fake::default();
        let table: Vec<(i64, i32)> = (0..(LIMIT / 8) as i64).map(|i| (i, i as i32)).collect();
        let root = fake.add(1, &name, &table);
        let inline = inline_record(0, &[]);
        assert_eq!(build(&fake, root, &inline, LIMIT), Err(OverBudget));
        assert!(build(&fake, root, &inline, 2 * LIMIT).is_ok());
    }

    #[test]
    fn modified_utf8_is_charged_as_it_will_be_encoded() {
        for bytes in [
            &b"plain"[..],
            "caf\u{e9}".as_bytes(),
            // Modified UTF-8: NUL as C0 80, a supplementary character as two surrogates.
            b"a\xc0\x80b",
            b"\xed\xa0\xbd\xed\xb8\x80",
            b"\xff\xfe",
            b"",
        ] {
            assert_eq!(
                lossy_len(bytes),
                String::from_utf8_lossy(bytes).len(),
                "{bytes:?}"
            );
            let encoded = dynamic_code(1, 2, bytes, MAX_RECORD_BYTES).expect("fits");
            let (record, used) = record::decode(&encoded)
                .expect("decodes")
                .expect("complete");
            assert_eq!(used, encoded.len());
            assert!(matches!(
                record,
                Some(Record::DynamicCode {
                    addr: 1,
                    size: 2,
                    ..
                })
            ));
        }
        assert_eq!(dynamic_code(1, 2, &[b'x'; 100], 120), Err(OverBudget));
    }

    #[test]
    fn method_ptrs_are_not_read_when_disabled() {
        // A dangling "jmethodID": reading it would fault; disabled, it is never touched.
        let dangling = 0x10 as JMethodId;
        assert_eq!(method_ptr(dangling, false), 0);
        let word: u64 = 0xdead_beef;
        assert_eq!(
            method_ptr(&word as *const u64 as JMethodId, true),
            0xdead_beef
        );
        assert_eq!(method_ptr(std::ptr::null_mut(), true), 0);
    }

    #[test]
    fn thread_names_are_cut_on_a_character_boundary() {
        let decode = |bytes: Vec<u8>| record::decode(&bytes).expect("decodes").expect("whole");
        let (record, _) = decode(thread_start(9, b"http-nio-8080-exec-12"));
        assert_eq!(
            record,
            Some(Record::ThreadStart {
                tid: 9,
                name: "http-nio-8080-exec-12".into()
            })
        );
        let long = "\u{e9}".repeat(record::MAX_THREAD_NAME_BYTES);
        let (record, _) = decode(thread_start(9, long.as_bytes()));
        let Some(Record::ThreadStart { name, .. }) = record else {
            panic!("not a thread start")
        };
        assert_eq!(name.len(), record::MAX_THREAD_NAME_BYTES);
        assert!(name.chars().all(|c| c == '\u{e9}'));
        let (record, _) = decode(live_thread(0x7f00_2800, long.as_bytes()));
        let Some(Record::LiveThread { java_thread, name }) = record else {
            panic!("not a live thread")
        };
        assert_eq!(java_thread, 0x7f00_2800);
        assert_eq!(name.len(), record::MAX_THREAD_NAME_BYTES);
    }
}
