//! Fuzzes the decoder of the sidecar's records file, which a profiled (untrusted) process
//! writes and the daemon reads: arbitrary bytes, valid records built from arbitrary field values
//! (exact round trips), the same records mutated (bit flips, truncations, huge length and count
//! fields, concatenations, inserted garbage), file headers, and `channel::Reader` following a
//! file of fuzzed records behind a valid header.
//!
//! Every decode must return without panicking, never claim more bytes than it was given, return
//! records whose vectors and strings the input could hold, and allocate at most a small multiple
//! of its input (a counting global allocator measures each call), so a corrupt length or count
//! can never make the daemon reserve gigabytes.
//!
//! Over a million cases in all (the figures go to stderr at the end, also without `--nocapture`);
//! one test, the strategies in parallel threads: `cargo test -p profiler-jvmti-records --test
//! fuzz_decoder`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

use profiler_jvmti_records::channel::{ReadError, Reader, Update};
use profiler_jvmti_records::record::{
    self, AgentStats, AgentStatus, CompiledMethod, DecodeError, FileHeader, InlineFrame, LineEntry,
    MethodInfo, PcInfo, Record, HEADER_LEN, MAX_RECORD_LEN, VERSION,
};

// ---------------------------------------------------------------------------------------------
// Allocation accounting: the bytes one thread holds, and their peak, while a window is open.

struct CountingAllocator;

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

thread_local! {
    static MEASURING: Cell<bool> = const { Cell::new(false) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
    static PEAK: Cell<isize> = const { Cell::new(0) };
    static LARGEST: Cell<usize> = const { Cell::new(0) };
}

/// Larger requests while a decode is measured are refused (the test then aborts with "memory
/// allocation of N bytes failed"), rather than left to the machine's overcommit.
const REFUSED: usize = 1 << 30;

/// True (after saying why, without allocating) if a measured decode asks for `size` bytes.
fn refused(size: usize) -> bool {
    if size < REFUSED || !MEASURING.try_with(Cell::get).unwrap_or(false) {
        return false;
    }
    let message =
        b"fuzz_decoder: a decode asked for over 1 GiB: a length or count taken on trust\n";
    // SAFETY: writes a static buffer to stderr.
    unsafe { libc::write(2, message.as_ptr().cast(), message.len()) };
    true
}

fn note_alloc(size: usize) {
    let _ = LIVE.try_with(|live| {
        let now = live.get().saturating_add(size as isize);
        live.set(now);
        let _ = PEAK.try_with(|peak| peak.set(peak.get().max(now)));
    });
    let _ = LARGEST.try_with(|largest| largest.set(largest.get().max(size)));
}

fn note_free(size: usize) {
    let _ = LIVE.try_with(|live| live.set(live.get().saturating_sub(size as isize)));
}

// SAFETY: every call goes to the system allocator unchanged; the counters only observe it.
unsafe impl GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { System.alloc(layout) };
        if !ptr.is_null() {
            note_alloc(layout.size());
        }
        ptr
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if refused(layout.size()) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        let ptr = unsafe { System.alloc_zeroed(layout) };
        if !ptr.is_null() {
            note_alloc(layout.size());
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) };
        note_free(layout.size());
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if refused(new_size) {
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's contract, passed on.
        let new = unsafe { System.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            note_free(layout.size());
            note_alloc(new_size);
        }
        new
    }
}

/// Runs `f` and returns its result with the peak of bytes it held at once and the largest
/// single allocation it asked for (this thread only).
fn measured<T>(f: impl FnOnce() -> T) -> (T, usize, usize) {
    LIVE.with(|c| c.set(0));
    PEAK.with(|c| c.set(0));
    LARGEST.with(|c| c.set(0));
    MEASURING.with(|c| c.set(true));
    let result = f();
    MEASURING.with(|c| c.set(false));
    let peak = PEAK.with(Cell::get).max(0) as usize;
    let largest = LARGEST.with(Cell::get);
    (result, peak, largest)
}

// ---------------------------------------------------------------------------------------------
// The properties every decode must have.

/// Allocation allowed for decoding `n` input bytes. The decoder checks every count against the
/// bytes left (an element takes at least 8 to 20 bytes of input and at most 128 in memory), and
/// lossy UTF-8 turns one invalid byte into a 3-byte replacement character: a few times the input,
/// never what a length field claims.
fn allocation_bound(n: usize) -> usize {
    16 * n + 1024
}

/// Smallest encoding of each element, as the format defines it.
const MIN_METHOD: usize = 8 + 4 * 4 + 4;
const MIN_PC: usize = 8 + 4;
const MIN_PAIR: usize = 8;

/// Largest peak-allocation to input ratio seen, in thousandths (reported at the end).
static WORST_RATIO_MILLI: AtomicU64 = AtomicU64::new(0);

/// Decodes the record at the start of `bytes` and checks what any decode must satisfy.
#[allow(clippy::type_complexity)]
fn checked_decode(
    bytes: &[u8],
) -> Result<Result<Option<(Option<Record>, usize)>, DecodeError>, TestCaseError> {
    let (result, peak, largest) = measured(|| record::decode(bytes));
    let bound = allocation_bound(bytes.len());
    prop_assert!(
        peak <= bound && largest <= bound,
        "decoding {} bytes held {peak} bytes at once (largest allocation {largest}): over {bound}",
        bytes.len()
    );
    if !bytes.is_empty() {
        let ratio = (peak as u64 * 1000) / bytes.len() as u64;
        WORST_RATIO_MILLI.fetch_max(ratio, Ordering::Relaxed);
    }
    match &result {
        Ok(Some((record, used))) => {
            prop_assert!(
                *used >= 5,
                "a record is a length and a kind at least: {used}"
            );
            prop_assert!(*used <= bytes.len(), "used {used} of {} bytes", bytes.len());
            prop_assert!(*used <= 4 + MAX_RECORD_LEN);
            if let Some(record) = record {
                check_bounded_by(record, *used)?;
            }
        }
        Ok(None) => {
            // Incomplete: only possible if the claimed body is not all there.
            if bytes.len() >= 4 {
                let claimed = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
                prop_assert!(
                    4 + claimed as usize > bytes.len(),
                    "incomplete although {claimed} body bytes are there"
                );
            }
        }
        Err(DecodeError::TooLong(n)) => prop_assert!(*n > MAX_RECORD_LEN),
        Err(_) => {}
    }
    Ok(result)
}

/// A decoded record's contents must fit in the `used` bytes it came from.
fn check_bounded_by(record: &Record, used: usize) -> Result<(), TestCaseError> {
    match record {
        Record::CompiledMethodLoad(method) => {
            let mut min = 1 + 8 + 4 + 4 + 4 + method.methods.len() * MIN_METHOD;
            for info in &method.methods {
                min += info.lines.len() * MIN_PAIR;
                for s in [
                    &info.class_signature,
                    &info.name,
                    &info.signature,
                    &info.source_file,
                ] {
                    // Lossy UTF-8: at most 3 bytes out per byte in.
                    prop_assert!(s.len() <= 3 * used);
                }
            }
            min += method.pcs.len() * MIN_PC;
            for pc in &method.pcs {
                min += pc.frames.len() * MIN_PAIR;
                for frame in &pc.frames {
                    prop_assert!((frame.method as usize) < method.methods.len());
                }
            }
            prop_assert!(
                4 + min <= used,
                "a record of {used} bytes decoded into {} methods and {} pcs",
                method.methods.len(),
                method.pcs.len()
            );
        }
        Record::DynamicCode { name, .. } => prop_assert!(name.len() <= 3 * used),
        Record::AgentStatus(status) => {
            prop_assert!(status.jvm_version.len() + status.error.len() <= 3 * used);
        }
        Record::ThreadStart { name, .. } | Record::LiveThread { name, .. } => {
            prop_assert!(name.len() <= 3 * used)
        }
        Record::CompiledMethodUnload { .. } | Record::AgentStats(_) | Record::ThreadEnd { .. } => {}
    }
    Ok(())
}

/// Decodes `bytes` record after record as the reader does, until it runs out or fails; returns
/// the records and whether it stopped on an error.
fn decode_all(bytes: &[u8]) -> Result<(Vec<Record>, bool), TestCaseError> {
    let mut offset = 0;
    let mut records = Vec::new();
    loop {
        match checked_decode(&bytes[offset..])? {
            Ok(Some((record, used))) => {
                offset += used;
                records.extend(record);
            }
            Ok(None) => return Ok((records, false)),
            Err(_) => return Ok((records, true)),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Strategies.

fn text() -> impl Strategy<Value = String> {
    vec(any::<char>(), 0..10).prop_map(String::from_iter)
}

fn method_info() -> impl Strategy<Value = MethodInfo> {
    (
        any::<u64>(),
        text(),
        text(),
        text(),
        text(),
        vec(any::<(u32, u32)>(), 0..5),
    )
        .prop_map(
            |(method_ptr, class_signature, name, signature, source_file, lines)| MethodInfo {
                method_ptr,
                class_signature,
                name,
                signature,
                source_file,
                lines: lines
                    .into_iter()
                    .map(|(bci, line)| LineEntry { bci, line })
                    .collect(),
            },
        )
}

fn compiled_method() -> impl Strategy<Value = CompiledMethod> {
    (any::<u64>(), any::<u32>(), vec(method_info(), 1..4)).prop_flat_map(
        |(code_addr, code_size, methods)| {
            let count = methods.len() as u32;
            let frame =
                (0..count, any::<i32>()).prop_map(|(method, bci)| InlineFrame { method, bci });
            let pc =
                (any::<u64>(), vec(frame, 0..4)).prop_map(|(pc, frames)| PcInfo { pc, frames });
            vec(pc, 0..4).prop_map(move |pcs| CompiledMethod {
                code_addr,
                code_size,
                methods: methods.clone(),
                pcs,
            })
        },
    )
}

fn any_record() -> impl Strategy<Value = Record> {
    prop_oneof![
        3 => compiled_method().prop_map(Record::CompiledMethodLoad),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(method_ptr, code_addr)| {
            Record::CompiledMethodUnload { method_ptr, code_addr }
        }),
        1 => (any::<u64>(), any::<u32>(), text())
            .prop_map(|(addr, size, name)| Record::DynamicCode { addr, size, name }),
        1 => any::<[u64; 4]>().prop_map(|[a, b, c, d]| Record::AgentStats(AgentStats {
            heap_live_bytes: a,
            heap_peak_bytes: b,
            records_written: c,
            records_dropped: d,
        })),
        1 => (any::<u32>(), any::<u32>(), text(), text()).prop_map(
            |(flags, jvm_feature_version, jvm_version, error)| {
                Record::AgentStatus(AgentStatus {
                    flags,
                    jvm_feature_version,
                    jvm_version,
                    error,
                })
            }
        ),
        1 => (any::<u32>(), text()).prop_map(|(tid, name)| Record::ThreadStart { tid, name }),
        1 => any::<u32>().prop_map(|tid| Record::ThreadEnd { tid }),
        1 => (any::<u64>(), text())
            .prop_map(|(java_thread, name)| Record::LiveThread { java_thread, name }),
    ]
}

fn encoded(records: &[Record]) -> Vec<u8> {
    let mut bytes = Vec::new();
    for record in records {
        record::encode(record, &mut bytes);
    }
    bytes
}

/// Values a corrupt length or count field could hold.
fn huge_u32() -> impl Strategy<Value = u32> {
    prop_oneof![
        Just(u32::MAX),
        Just(u32::MAX / 2),
        Just(0x8000_0000),
        Just(MAX_RECORD_LEN as u32),
        Just(MAX_RECORD_LEN as u32 + 1),
        Just(MAX_RECORD_LEN as u32 - 1),
        Just(1 << 20),
        Just(0),
        Just(1),
        any::<u32>(),
    ]
}

#[derive(Clone, Debug)]
enum Mutation {
    FlipBit {
        at: usize,
        bit: u8,
    },
    Truncate {
        at: usize,
    },
    /// Overwrites 4 bytes (a length or count field, if it lands on one).
    SetU32 {
        at: usize,
        value: u32,
    },
    /// Rewrites the record's own length prefix.
    SetLength {
        value: u32,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    /// Appends a copy of a slice of the input (concatenated and overlapping records).
    Repeat {
        from: usize,
        len: usize,
    },
    Append {
        bytes: Vec<u8>,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        4 => (at, 0u8..8).prop_map(|(at, bit)| Mutation::FlipBit { at, bit }),
        2 => at.prop_map(|at| Mutation::Truncate { at }),
        4 => (at, huge_u32()).prop_map(|(at, value)| Mutation::SetU32 { at, value }),
        2 => huge_u32().prop_map(|value| Mutation::SetLength { value }),
        1 => (at, vec(any::<u8>(), 1..8))
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        1 => (at, any::<usize>()).prop_map(|(from, len)| Mutation::Repeat { from, len }),
        1 => vec(any::<u8>(), 1..16).prop_map(|bytes| Mutation::Append { bytes }),
    ]
}

fn mutate(bytes: &mut Vec<u8>, mutation: &Mutation) {
    let len = bytes.len();
    match mutation {
        Mutation::FlipBit { at, bit } if len > 0 => bytes[at % len] ^= 1 << bit,
        Mutation::Truncate { at } => bytes.truncate(at % (len + 1)),
        Mutation::SetU32 { at, value } if len >= 4 => {
            let at = at % (len - 3);
            bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
        }
        Mutation::SetLength { value } if len >= 4 => {
            bytes[..4].copy_from_slice(&value.to_le_bytes())
        }
        Mutation::Insert { at, bytes: new } => {
            let at = at % (len + 1);
            bytes.splice(at..at, new.iter().copied());
        }
        Mutation::Repeat { from, len: n } if len > 0 => {
            let from = from % len;
            let n = n % (len - from + 1);
            bytes.extend_from_within(from..from + n);
        }
        Mutation::Append { bytes: new } => bytes.extend_from_slice(new),
        _ => {}
    }
}

/// Arbitrary bytes behind a plausible header: a length near the rest's, a known kind or not.
fn structured_garbage() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![Just(0i64), -3i64..4, Just(1 << 20)],
        0u8..7,
        vec(any::<u8>(), 0..200),
    )
        .prop_map(|(delta, kind, rest)| {
            let body_len = (rest.len() as i64 + 1 + delta).clamp(0, u32::MAX as i64) as u32;
            let mut bytes = body_len.to_le_bytes().to_vec();
            bytes.push(kind);
            bytes.extend(rest);
            bytes
        })
}

// ---------------------------------------------------------------------------------------------
// Runs.

/// Runs `cases` cases of `strategy` through `test`; returns the cases run.
fn run<S: Strategy>(
    name: &'static str,
    cases: u32,
    strategy: S,
    test: impl Fn(S::Value) -> Result<(), TestCaseError>,
) -> (&'static str, u64, f64) {
    let started = Instant::now();
    let ran = AtomicU64::new(0);
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        // Shrinking a failure of a million-case run can take long; a few thousand steps find
        // a small enough input.
        max_shrink_iters: 4096,
        ..Config::default()
    });
    let result = runner.run(&strategy, |value| {
        ran.fetch_add(1, Ordering::Relaxed);
        test(value)
    });
    if let Err(err) = result {
        panic!("{name}: {err}");
    }
    (name, ran.into_inner(), started.elapsed().as_secs_f64())
}

fn arbitrary_bytes() -> (&'static str, u64, f64) {
    run(
        "arbitrary bytes (0..=256)",
        400_000,
        vec(any::<u8>(), 0..=256),
        |bytes| {
            decode_all(&bytes)?;
            // A file header is the first 32 bytes of the same untrusted file.
            match FileHeader::decode(&bytes) {
                Ok(header) => {
                    prop_assert!(bytes.len() >= HEADER_LEN && bytes[..8] == record::MAGIC);
                    prop_assert_eq!(header.version, VERSION);
                }
                Err(DecodeError::Truncated) => prop_assert!(bytes.len() < HEADER_LEN),
                Err(_) => {}
            }
            Ok(())
        },
    )
}

fn garbage_behind_a_plausible_length() -> (&'static str, u64, f64) {
    run(
        "garbage behind a plausible length and kind",
        200_000,
        structured_garbage(),
        |bytes| decode_all(&bytes).map(|_| ()),
    )
}

fn valid_records_round_trip() -> (&'static str, u64, f64) {
    run(
        "valid records, concatenated: exact round trip",
        150_000,
        vec(any_record(), 1..4),
        |records| {
            let bytes = encoded(&records);
            let (decoded, failed) = decode_all(&bytes)?;
            prop_assert!(!failed);
            prop_assert_eq!(&decoded, &records);
            // Every strict prefix is incomplete or a whole number of records, never an error.
            let cut = bytes.len() / 2;
            let (prefix, failed) = decode_all(&bytes[..cut])?;
            prop_assert!(!failed);
            prop_assert_eq!(&prefix[..], &records[..prefix.len()]);
            Ok(())
        },
    )
}

fn mutated_records() -> (&'static str, u64, f64) {
    run(
        "valid records, mutated",
        250_000,
        (vec(any_record(), 1..4), vec(mutation(), 1..4)),
        |(records, mutations)| {
            let mut bytes = encoded(&records);
            for mutation in &mutations {
                mutate(&mut bytes, mutation);
            }
            decode_all(&bytes).map(|_| ())
        },
    )
}

fn file_headers() -> (&'static str, u64, f64) {
    run(
        "file headers, valid and mutated",
        50_000,
        (
            any::<(u32, u32, u32, u64)>(),
            prop::option::of((0..HEADER_LEN, 0u8..8)),
            0..=HEADER_LEN + 4,
        ),
        |((version, generation, pid, started_ns), flip, len)| {
            let header = FileHeader {
                version,
                generation,
                pid,
                started_ns,
            };
            let mut bytes = header.encode().to_vec();
            match FileHeader::decode(&bytes) {
                Ok(decoded) => prop_assert_eq!(decoded, header),
                Err(err) => {
                    prop_assert_eq!(err, DecodeError::UnsupportedVersion(version));
                    prop_assert_ne!(version, VERSION);
                }
            }
            if let Some((at, bit)) = flip {
                bytes[at] ^= 1 << bit;
            }
            bytes.resize(len, 0);
            let _ = FileHeader::decode(&bytes);
            Ok(())
        },
    )
}

/// A records file: a valid header (sometimes corrupted) and fuzzed records, written in two
/// parts with a poll after each, as an agent appending while the daemon reads.
fn reader_over_fuzzed_files() -> (&'static str, u64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let file_number = AtomicU64::new(0);
    run(
        "channel::Reader over a fuzzed records file",
        2_000,
        (
            vec(any_record(), 0..6),
            vec(mutation(), 0..3),
            any::<usize>(),
            prop::option::of((0..HEADER_LEN, 0u8..8)),
        ),
        |(records, mutations, split, header_flip)| {
            let header = FileHeader {
                version: VERSION,
                generation: 7,
                pid: 42,
                started_ns: 1,
            };
            let mut head = header.encode();
            if let Some((at, bit)) = header_flip {
                head[at] ^= 1 << bit;
            }
            let mut body = encoded(&records);
            for mutation in &mutations {
                mutate(&mut body, mutation);
            }
            let split = split % (body.len() + 1);
            let path = dir.path().join(format!(
                "records-{}",
                file_number.fetch_add(1, Ordering::Relaxed)
            ));
            let mut file = std::fs::File::create(&path).expect("create");
            file.write_all(&head).expect("write");
            file.write_all(&body[..split]).expect("write");
            let mut reader = Reader::new(path.clone());
            // A poll that fails returns nothing, the generation it may have started included;
            // only a decode error (never I/O or the size bound here) may fail it.
            let mut updates = Vec::new();
            let mut failed = false;
            for second in [false, true] {
                if second {
                    file.write_all(&body[split..]).expect("write");
                }
                match reader.poll() {
                    Ok(got) => updates.extend(got),
                    Err(ReadError::Format(_)) => {
                        failed = true;
                        break;
                    }
                    Err(err) => return Err(TestCaseError::fail(format!("poll: {err}"))),
                }
                if updates.is_empty() {
                    // A successful first poll reads the header, written before it.
                    return Err(TestCaseError::fail("no generation after the first poll"));
                }
            }
            std::fs::remove_file(&path).expect("remove");

            let header = FileHeader::decode(&head);
            let (expected, corrupt) = decode_all(&body)?;
            let Ok(header) = header else {
                prop_assert!(failed && updates.is_empty(), "a bad header was accepted");
                return Ok(());
            };
            if updates.is_empty() {
                prop_assert!(failed && corrupt, "the first poll failed on a valid file");
                return Ok(());
            }
            // The records the reader returned are those sequential decoding finds, in order
            // (all of them unless the file is corrupt, when it stops with an error).
            let mut got = updates.into_iter();
            prop_assert!(
                matches!(got.next(), Some(Update::NewGeneration(h)) if h == header),
                "the first update is not the generation's header"
            );
            let got: Vec<Record> = got
                .map(|u| match u {
                    Update::Record(record) => Ok(record),
                    Update::NewGeneration(_) => Err(TestCaseError::fail("second generation")),
                })
                .collect::<Result<_, _>>()?;
            prop_assert!(got.len() <= expected.len());
            prop_assert_eq!(&got[..], &expected[..got.len()]);
            prop_assert_eq!(failed, corrupt);
            if !corrupt {
                prop_assert_eq!(got.len(), expected.len());
            }
            Ok(())
        },
    )
}

/// The cases that matter most, explicitly: a short input claiming a huge body or count.
#[test]
fn short_inputs_claiming_huge_lengths_allocate_nothing_big() {
    // A 20-byte input whose length prefix claims just under the 16 MiB limit: incomplete.
    let mut bytes = ((MAX_RECORD_LEN - 1) as u32).to_le_bytes().to_vec();
    bytes.resize(20, 0xff);
    let (result, peak, _) = measured(|| record::decode(&bytes));
    assert_eq!(result, Ok(None));
    assert!(peak <= allocation_bound(bytes.len()), "{peak}");
    // Past the limit: an error, not a wait for 4 GiB.
    bytes[..4].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        record::decode(&bytes),
        Err(DecodeError::TooLong(u32::MAX as usize))
    );
    // Complete records whose method, line, pc, frame counts or string lengths claim 4 billion.
    let method = Record::CompiledMethodLoad(CompiledMethod {
        code_addr: 1,
        code_size: 2,
        methods: vec![MethodInfo {
            name: "m".into(),
            lines: vec![LineEntry { bci: 0, line: 1 }],
            ..MethodInfo::default()
        }],
        pcs: vec![PcInfo {
            pc: 3,
            frames: vec![InlineFrame { method: 0, bci: 4 }],
        }],
    });
    let valid = encoded(&[method]);
    for at in 5..valid.len() - 3 {
        let mut corrupt = valid.clone();
        corrupt[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let (_, peak, largest) = measured(|| record::decode(&corrupt));
        assert!(
            peak <= allocation_bound(corrupt.len()),
            "u32::MAX at {at}: {peak} bytes held (largest allocation {largest})"
        );
    }
}

#[test]
fn a_million_fuzzed_inputs_decode_without_panics_overreads_or_huge_allocations() {
    let started = Instant::now();
    // Two cores on the reference machine: two threads, the strategies split about evenly.
    let results: Vec<(&str, u64, f64)> = std::thread::scope(|scope| {
        let first = scope.spawn(|| {
            vec![
                arbitrary_bytes(),
                valid_records_round_trip(),
                reader_over_fuzzed_files(),
            ]
        });
        let second = scope.spawn(|| {
            vec![
                mutated_records(),
                garbage_behind_a_plausible_length(),
                file_headers(),
            ]
        });
        let mut all = first
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        all.extend(
            second
                .join()
                .unwrap_or_else(|e| std::panic::resume_unwind(e)),
        );
        all
    });
    // Straight to stderr, past the test harness's capture: CI logs show the figures.
    let mut report = String::new();
    let mut total = 0;
    for (name, cases, secs) in &results {
        report += &format!("fuzz_decoder: {cases:>8} cases in {secs:6.1} s: {name}\n");
        total += cases;
    }
    report += &format!(
        "fuzz_decoder: {total} cases in all in {:.1} s; peak allocation at most {:.2}x the input\n",
        started.elapsed().as_secs_f64(),
        WORST_RATIO_MILLI.load(Ordering::Relaxed) as f64 / 1000.0
    );
    let _ = std::io::stderr().write_all(report.as_bytes());
    assert!(total >= 1_000_000, "only {total} cases ran");
}
