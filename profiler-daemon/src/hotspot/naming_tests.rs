//! Naming from memory that changed since the sample, on the walker's synthetic JVM
//! (`profiler_unwind::fakes`, described to the daemon by `contract_tests`' VMStructs): a stub
//! blob freed or reused, a blob name pointer into unmapped memory, names that are garbage, and
//! `Symbol`s whose length and bytes are garbage each give their reason, never a name.

use std::sync::Arc;

use profiler_unwind::fakes::{BlobSpec, FakeMemory, Jvm as FakeJvm, Layout};

use super::contract_tests::{daemon_view, vmstructs_of};
use super::jvm::Jvm;
use super::layout::JvmLayout;
use super::names::{read_class_name, BlobInfo, MemoryNames};
use super::remote::{ReadError, RemoteMemory};
use super::symbol;
use super::vmstructs;
use crate::java_names::UnnamedReason;

/// Where the fake blobs' `CodeBlob::_name` is: inside their 128-byte header, apart from the
/// fields the walker uses.
const NAME_AT: u64 = 72;
/// Where `CodeBlob::_kind` is, for the JDK 23+ layout.
const KIND_AT: u64 = 80;
/// Blob names and symbols, apart from the fake's other regions.
const STRINGS: u64 = 0x4000_0000_0000;
const SYMBOLS: u64 = 0x4100_0000_0000;
/// Never mapped.
const UNMAPPED: u64 = 0x4200_0000_0000;

/// The fake's memory, lent to a [`MemoryNames`] while the test still changes it in between.
struct Lent<'a>(&'a FakeMemory);

impl RemoteMemory for Lent<'_> {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        self.0.read(addr, buf)
    }
}

/// The daemon's view of `fake`, with blob names (and, with `kind`, blob kinds) in VMStructs.
pub(crate) fn daemon_jvm(fake: &FakeJvm, layout: Layout, kind: bool) -> Arc<Jvm> {
    let mut tables = vmstructs_of(&fake.hs, layout);
    tables
        .fields
        .get_mut("CodeBlob::_name")
        .expect("named")
        .offset = NAME_AT;
    if kind {
        tables.fields.insert(
            "CodeBlob::_kind".to_owned(),
            vmstructs::Field {
                offset: KIND_AT,
                static_offset: None,
                type_string: Some("CodeBlobKind".to_owned()),
            },
        );
    }
    let (mut jvm, _) = daemon_view(fake, layout);
    jvm.layout = Arc::new(JvmLayout::from_vmstructs(&tables).expect("a complete layout"));
    Arc::new(jvm)
}

/// A fake JVM with one stub named `name` (its bytes as they are, NUL after), its cookie as BPF
/// records it (the compile id word: 0 in a stub).
pub(crate) fn with_stub(layout: Layout, name: &[u8]) -> (FakeJvm, profiler_unwind::fakes::Blob) {
    let mut fake = FakeJvm::new(layout);
    // A page, as in a process: names are read in chunks up to the page's end.
    let mut bytes = name.to_vec();
    bytes.resize(4096, 0);
    fake.memory.add(STRINGS, bytes);
    let stub = fake.add_blob(&BlobSpec::stub());
    fake.memory.put_u64(stub.addr + NAME_AT, STRINGS);
    fake.memory.put_u8(stub.addr + KIND_AT, 4); // CodeBlobKind::Vtable
    (fake, stub)
}

fn stub_name(
    fake: &FakeJvm,
    jvm: &Arc<Jvm>,
    blob: u64,
    cookie: u32,
    pc: u32,
) -> Result<String, UnnamedReason> {
    let mut names = MemoryNames::new(jvm.clone(), Lent(&fake.memory));
    match names.code(blob, cookie, pc)?.as_ref() {
        BlobInfo::Stub { name, .. } => Ok(name.clone()),
        BlobInfo::Nmethod(_) => panic!("a stub read as an nmethod"),
    }
}

#[test]
fn a_live_stub_is_named_by_its_blob_on_either_layout() {
    for (layout, kind) in [(Layout::Pointers, false), (Layout::Offsets, true)] {
        let (fake, stub) = with_stub(layout, b"vtable chunks");
        let jvm = daemon_jvm(&fake, layout, kind);
        assert_eq!(
            stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x10),
            Ok("vtable chunks".to_owned())
        );
    }
}

#[test]
fn a_freed_stub_blob_is_code_reused_not_named() {
    for (layout, kind) in [(Layout::Pointers, false), (Layout::Offsets, true)] {
        let (mut fake, stub) = with_stub(layout, b"vtable chunks");
        let jvm = daemon_jvm(&fake, layout, kind);
        // Freed: its bytes, name pointer included, are left as they were.
        fake.free_blob(&stub);
        assert_eq!(
            stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x10),
            Err(UnnamedReason::CodeReused)
        );
    }
}

#[test]
fn a_stub_whose_memory_holds_another_blob_is_code_reused() {
    let layout = Layout::Pointers;
    let (mut fake, stub) = with_stub(layout, b"vtable chunks");
    let jvm = daemon_jvm(&fake, layout, false);
    // The block was given to an nmethod, which left the old name pointer in place: the word
    // BPF recorded as the stub's cookie is the nmethod's compile id now.
    let block = stub.addr - 16;
    fake.add_blob_at(block, &BlobSpec::nmethod(4, 0x77));
    fake.memory.put_u64(stub.addr + NAME_AT, STRINGS);
    assert_eq!(
        stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x10),
        Err(UnnamedReason::CodeReused)
    );
    // A pc past the blob was in another one, which this address held then.
    let (fake, stub) = with_stub(layout, b"vtable chunks");
    assert_eq!(
        stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x7f),
        Ok("vtable chunks".to_owned())
    );
    assert_eq!(
        stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x80),
        Err(UnnamedReason::CodeReused)
    );
}

#[test]
fn a_name_pointer_to_unmapped_memory_is_unreadable_never_empty() {
    for (layout, kind) in [(Layout::Pointers, false), (Layout::Offsets, true)] {
        let (mut fake, stub) = with_stub(layout, b"vtable chunks");
        let jvm = daemon_jvm(&fake, layout, kind);
        for pointer in [UNMAPPED, 0] {
            fake.memory.put_u64(stub.addr + NAME_AT, pointer);
            assert_eq!(
                stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x10),
                Err(UnnamedReason::Unreadable),
                "name at {pointer:#x}"
            );
        }
    }
}

#[test]
fn a_blob_name_that_is_no_name_gives_its_reason() {
    let layout = Layout::Offsets;
    for (bytes, reason) in [
        (&b""[..], UnnamedReason::BadName),
        (&b"\x01\x02\xff\xfe"[..], UnnamedReason::BadName),
        (&b"vtable\x1b[2J"[..], UnnamedReason::BadName),
        (&[b'a'; 2000][..], UnnamedReason::OverBound),
    ] {
        let (fake, stub) = with_stub(layout, bytes);
        let jvm = daemon_jvm(&fake, layout, true);
        assert_eq!(
            stub_name(&fake, &jvm, stub.addr, stub.compile_id, 0x10),
            Err(reason),
            "{bytes:x?}"
        );
    }
}

/// A `Symbol` at `at` as the fake layout has it: hash word at 0, length at 4, body at 6.
fn put_symbol(memory: &mut FakeMemory, at: u64, hash_word: u32, length: u16, body: &[u8]) {
    let mut bytes = vec![0; 6];
    bytes[..4].copy_from_slice(&hash_word.to_le_bytes());
    bytes[4..6].copy_from_slice(&length.to_le_bytes());
    bytes.extend_from_slice(body);
    // Room past the body for the tail read of a short name.
    bytes.extend_from_slice(&[0; 16]);
    memory.add(at, bytes);
}

/// The cookie BPF records for the class name `Symbol` at `symbol`, as it reads it now.
fn class_cookie(jvm: &Jvm, memory: &FakeMemory, symbol: u64) -> (u32, u32) {
    let identity = symbol::read_identity(jvm, &Lent(memory), symbol).expect("readable");
    (
        profiler_common::class_name_cookie(symbol, identity.hash_word, identity.tail),
        u32::from(identity.length),
    )
}

#[test]
fn a_symbol_whose_length_and_bytes_are_garbage_is_bad_name() {
    let layout = Layout::Offsets;
    let fake = FakeJvm::new(layout);
    let jvm = daemon_jvm(&fake, layout, true);
    let mut memory = FakeMemory::default();
    let good = SYMBOLS;
    put_symbol(&mut memory, good, 0xbeef_0001, 20, b"NameChurn$G0042Outer");
    let (cookie, length) = class_cookie(&jvm, &memory, good);
    assert_eq!(
        read_class_name(&jvm, &Lent(&memory), good, cookie, length).as_deref(),
        Ok("NameChurn$G0042Outer")
    );

    // Freed metaspace where a symbol was: a length of 32,000 and bytes of other classes'
    // data (names, pointers, zeros). Its identity is what BPF would have read too, so the
    // cookie matches: only the bytes tell.
    let garbage = SYMBOLS + 0x1_0000;
    let mut body = Vec::new();
    while body.len() < 32_000 {
        body.extend_from_slice(b"ChurnG000J\0\0\x07\x10\x7f\0\0hotG001E");
        body.extend_from_slice(&0x7f12_3456_7890u64.to_le_bytes());
    }
    body.truncate(32_000);
    put_symbol(&mut memory, garbage, 0x1234_5678, 32_000, &body);
    let (cookie, length) = class_cookie(&jvm, &memory, garbage);
    assert_eq!(
        read_class_name(&jvm, &Lent(&memory), garbage, cookie, length),
        Err(UnnamedReason::BadName)
    );
    // Read as a method's name (nothing recorded to compare with), the same.
    assert_eq!(
        symbol::read_name(
            &jvm,
            &Lent(&memory),
            garbage,
            None,
            UnnamedReason::MethodReused
        ),
        Err(UnnamedReason::BadName)
    );
    // Printable bytes of the right shape, but a length other than the sample's: another symbol.
    let (cookie, length) = class_cookie(&jvm, &memory, good);
    assert_eq!(
        read_class_name(&jvm, &Lent(&memory), good, cookie, length + 1),
        Err(UnnamedReason::ClassReused)
    );
    // A body running into unmapped memory, and a symbol pointer to unmapped memory.
    let cut = SYMBOLS + 0x2_0000;
    memory.add(cut, {
        let mut b = 0u32.to_le_bytes().to_vec();
        b.extend_from_slice(&60_000u16.to_le_bytes());
        b.extend_from_slice(&[b'a'; 64]);
        b
    });
    for symbol in [cut, UNMAPPED] {
        assert_eq!(
            symbol::read_name(
                &jvm,
                &Lent(&memory),
                symbol,
                None,
                UnnamedReason::MethodReused
            ),
            Err(UnnamedReason::Unreadable),
            "{symbol:#x}"
        );
    }
}

#[test]
fn a_symbol_that_is_not_the_expected_one_is_reused() {
    let layout = Layout::Offsets;
    let fake = FakeJvm::new(layout);
    let jvm = daemon_jvm(&fake, layout, true);
    let mut memory = FakeMemory::default();
    put_symbol(
        &mut memory,
        SYMBOLS,
        0xbeef_0001,
        20,
        b"NameChurn$G0042Outer",
    );
    let sampled = symbol::read_identity(&jvm, &Lent(&memory), SYMBOLS).expect("readable");
    // The next generation's name at the same address, with the same hash by chance.
    memory.write(SYMBOLS + 6, b"NameChurn$G0043Outer");
    assert_eq!(
        symbol::read_name(
            &jvm,
            &Lent(&memory),
            SYMBOLS,
            Some(&sampled),
            UnnamedReason::ClassReused
        ),
        Err(UnnamedReason::ClassReused)
    );
    // Its reference count changing is no other symbol.
    memory.write(SYMBOLS + 6, b"NameChurn$G0042Outer");
    memory.put_u32(SYMBOLS, 0xbeef_0002);
    assert_eq!(
        symbol::read_name(
            &jvm,
            &Lent(&memory),
            SYMBOLS,
            Some(&sampled),
            UnnamedReason::ClassReused
        )
        .as_deref(),
        Ok("NameChurn$G0042Outer")
    );
}

#[test]
fn metadata_pointers_at_the_top_of_the_address_space_give_a_reason_never_a_panic() {
    // A method read while its class is unloaded: each pointer on the way to its class name may
    // be garbage, up to the last bytes of the address space, where adding a field's offset
    // overflows (the debug build panicked on it in the Java name reader).
    let layout = Layout::Offsets;
    let mut fake = FakeJvm::new(layout);
    let jvm = daemon_jvm(&fake, layout, true);
    let method = fake.add_method(b"Garbage", 0xbeef_0002, 4);
    let hs = fake.hs;
    let word = |memory: &FakeMemory, at: u64| Lent(memory).read_u64(at).expect("mapped");
    let const_method = word(&fake.memory, method.addr + hs.method_const_method as u64);
    let pool = word(
        &fake.memory,
        const_method + hs.const_method_constants as u64,
    );
    let klass = word(&fake.memory, pool + hs.constant_pool_holder as u64);
    assert!(super::names::read_identity(&jvm, &Lent(&fake.memory), method.addr).is_ok());
    let slots = [
        method.addr + hs.method_const_method as u64,
        const_method + hs.const_method_constants as u64,
        pool + hs.constant_pool_holder as u64,
        klass + hs.klass_name as u64,
    ];
    for slot in slots {
        let was = word(&fake.memory, slot);
        fake.memory.put_u64(slot, u64::MAX - 3);
        assert!(super::names::read_identity(&jvm, &Lent(&fake.memory), method.addr).is_err());
        fake.memory.put_u64(slot, was);
    }
    assert!(super::names::read_identity(&jvm, &Lent(&fake.memory), u64::MAX - 3).is_err());
}
