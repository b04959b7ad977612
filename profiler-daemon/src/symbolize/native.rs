//! User-space addresses in ELF files to function names, files, lines and inlined calls
//! (symtab, dynsym and DWARF, through blazesym).
//!
//! Results are cached per binary, identified by its GNU build-id when it has one (so the same
//! library in many processes or containers is parsed once), else by device and inode. Binaries
//! are files of profiled processes: each is opened by [`ProcessInfo::open_mapped_file`] (the very
//! file mapped, never a link or special file) and handed to blazesym as `/proc/self/fd/N`, so
//! blazesym reads exactly what was checked.
//!
//! A stripped binary is named from its separate debug file where the host has one: looked up by
//! build-id only, under the daemon's own debug directories (`/usr/lib/debug/.build-id/xx/yyyy.debug`,
//! what Debian's `-dbgsym` packages install), never by a debug link name the binary chose.
//!
//! Each binary has its own blazesym symbolizer, so that it can be dropped whole: its mapped file
//! and parsed DWARF, and the frames resolved from it, are charged to the [`CacheBudget`] and the
//! least recently used binaries are evicted while the budget is exceeded (they are parsed again
//! if they show up again).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolizer};
use hashbrown::HashMap;
use object::read::ReadCache;

use super::cache_budget::{self, CacheBudget, CacheStats};
use super::{from_blazesym, ResolvedFrame};
use crate::native_unwind::mapping::{address_of_offset, load_segments, LoadSegment};
use crate::process::{Backing, Mapping, ProcessInfo};
use crate::untrusted;
use crate::vdso::VdsoImage;

/// Where separate debug files are looked up by build-id (the host's, not a container's).
pub const DEFAULT_DEBUG_DIRS: [&str; 1] = ["/usr/lib/debug"];

/// Bound on binaries known (their identities, a few hundred bytes each, stay after eviction);
/// past it everything starts over.
const MAX_BINARIES: usize = 16_384;
/// What one cached frame is charged: the `Arc`, its lines and names, and the map entry.
const FRAME_BYTES: u64 = 256;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum BinaryKey {
    BuildId(Vec<u8>),
    File { dev: u64, inode: u64 },
}

struct Binary {
    /// Index into `NativeSymbolizer::binaries`.
    id: u32,
    /// Whether blazesym may read its DWARF: not when the file names other files (debug links),
    /// which blazesym would open by a path the file's author chose (a FIFO would block it).
    debug_syms: bool,
    /// The file's name in the process's namespace, for frames that cannot be named.
    module: Arc<str>,
    /// Its separate debug file, when it has no usable DWARF of its own and the host has one.
    debug_file: Option<DebugFile>,
    /// Its own symbolizer (mapped file, parsed symbols and DWARF), while cached.
    symbolizer: Option<Symbolizer>,
    /// File offset -> frame, while cached.
    frames: HashMap<u64, Arc<ResolvedFrame>>,
    /// Bytes charged to the budget for the two above.
    charged: u64,
    /// When it was last used (a `NativeSymbolizer::clock` value).
    last_used: u64,
}

/// A binary's separate debug file: same build-id, same segments, symbols and DWARF.
struct DebugFile {
    path: PathBuf,
    /// The binary's loadable segments: file offsets in the binary to addresses in both files.
    segments: Vec<LoadSegment>,
}

pub struct NativeSymbolizer {
    /// (dev, inode) -> binary; the cheap identity from /proc/PID/maps.
    by_file: HashMap<(u64, u64), u32>,
    /// Build-id (or file) identity -> binary id.
    keys: HashMap<BinaryKey, u32>,
    binaries: Vec<Binary>,
    unknown_anonymous: Arc<ResolvedFrame>,
    budget: CacheBudget,
    /// Advances once per `resolve` call: the LRU order.
    clock: u64,
    /// Where debug files are looked up by build-id.
    debug_dirs: Vec<PathBuf>,
}

impl Default for NativeSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl NativeSymbolizer {
    pub fn new() -> Self {
        Self::with_budget(cache_budget::DEFAULT_LIMIT_BYTES)
    }

    /// A symbolizer whose caches hold at most about `limit_bytes`.
    pub fn with_budget(limit_bytes: u64) -> Self {
        Self::with_budget_stats(limit_bytes, Arc::default())
    }

    /// The same, publishing its figures into `stats`.
    pub fn with_budget_stats(limit_bytes: u64, stats: Arc<CacheStats>) -> Self {
        Self {
            by_file: HashMap::new(),
            keys: HashMap::new(),
            binaries: Vec::new(),
            unknown_anonymous: Arc::new(ResolvedFrame::named("[unknown]", None)),
            budget: CacheBudget::with_stats(limit_bytes, stats),
            clock: 0,
            debug_dirs: DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// Looks debug files up under `dirs` instead of [`DEFAULT_DEBUG_DIRS`].
    pub fn with_debug_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.debug_dirs = dirs;
        self
    }

    /// Frames cached over all binaries.
    pub fn cached_frames(&self) -> usize {
        self.binaries.iter().map(|b| b.frames.len()).sum()
    }

    /// The budget's counters, for the metrics endpoint.
    pub fn cache_stats(&self) -> Arc<CacheStats> {
        self.budget.stats()
    }

    /// Resolves addresses of `process`. Entries are `None` where the address is in no known
    /// mapping (the caller may refresh the mappings and ask again).
    pub fn resolve(
        &mut self,
        process: &ProcessInfo,
        addrs: &[u64],
    ) -> Vec<Option<Arc<ResolvedFrame>>> {
        if self.binaries.len() > MAX_BINARIES {
            self.forget_all();
        }
        self.clock += 1;
        let mut out: Vec<Option<Arc<ResolvedFrame>>> = vec![None; addrs.len()];
        // binary id -> (indexes into `addrs`, file offsets, a mapping of it) still to symbolize.
        let mut pending: HashMap<u32, (Vec<usize>, Vec<u64>, &Mapping)> = HashMap::new();

        for (index, &addr) in addrs.iter().enumerate() {
            let Some(mapping) = process.mapping(addr) else {
                continue;
            };
            match &mapping.backing {
                Backing::File { .. } => {
                    let binary = self.binary(process, mapping);
                    let offset = mapping.file_offset(addr);
                    let entry = &mut self.binaries[binary as usize];
                    entry.last_used = self.clock;
                    match entry.frames.get(&offset) {
                        Some(frame) => out[index] = Some(frame.clone()),
                        None => {
                            let entry = pending
                                .entry(binary)
                                .or_insert_with(|| (Vec::new(), Vec::new(), mapping));
                            entry.0.push(index);
                            entry.1.push(offset);
                        }
                    }
                }
                Backing::Vdso => {
                    let offset = addr - mapping.start;
                    let function = VdsoImage::of_this_host()
                        .filter(|image| image.is_mapped_by(mapping))
                        .and_then(|image| image.function_at(offset));
                    let name = match function {
                        Some(function) => function.to_owned(),
                        None => format!("[vdso]+{offset:#x}"),
                    };
                    out[index] = Some(Arc::new(ResolvedFrame::named(
                        name,
                        Some(Arc::from("[vdso]")),
                    )))
                }
                Backing::Anonymous => out[index] = Some(self.unknown_anonymous.clone()),
            }
        }

        for (binary, (indexes, offsets, mapping)) in pending {
            let (frames, grown) =
                cache_budget::measure(|| self.symbolize_binary(process, mapping, binary, &offsets));
            let entry = &mut self.binaries[binary as usize];
            let mut charge = grown;
            for ((index, offset), frame) in indexes.into_iter().zip(offsets).zip(frames) {
                if entry.frames.insert(offset, frame.clone()).is_none() {
                    charge += FRAME_BYTES;
                }
                out[index] = Some(frame);
            }
            entry.charged += charge;
            self.budget.charge(charge);
        }
        self.evict_over_budget();
        out
    }

    /// Drops the least recently used binaries' caches while over the budget (the results of
    /// this call are already out: even a binary bigger than the whole budget is symbolized,
    /// then dropped).
    fn evict_over_budget(&mut self) {
        if !self.budget.over() {
            return;
        }
        let mut cached: Vec<(u64, u32)> = self
            .binaries
            .iter()
            .filter(|b| b.charged > 0 || b.symbolizer.is_some())
            .map(|b| (b.last_used, b.id))
            .collect();
        cached.sort_unstable();
        for (_, id) in cached {
            if !self.budget.over() {
                break;
            }
            let entry = &mut self.binaries[id as usize];
            entry.symbolizer = None;
            entry.frames = HashMap::new();
            let charged = std::mem::take(&mut entry.charged);
            self.budget.release(charged);
        }
    }

    /// Forgets every binary (their number passed its bound).
    fn forget_all(&mut self) {
        for entry in &mut self.binaries {
            let charged = std::mem::take(&mut entry.charged);
            self.budget.release(charged);
        }
        self.binaries.clear();
        self.by_file.clear();
        self.keys.clear();
    }

    /// The binary id of a mapped file, reading its build-id the first time it is seen.
    fn binary(&mut self, process: &ProcessInfo, mapping: &Mapping) -> u32 {
        let Backing::File { path, dev, inode } = &mapping.backing else {
            unreachable!("only file mappings have binaries");
        };
        let (dev, inode) = (*dev, *inode);
        if let Some(&id) = self.by_file.get(&(dev, inode)) {
            return id;
        }
        let file = process.open_mapped_file(mapping).ok();
        let build_id = file.as_ref().and_then(|file| {
            blazesym::helper::read_elf_build_id(&untrusted::fd_path(file))
                .ok()
                .flatten()
                .map(|id| id.to_vec())
        });
        // DWARF is read only from a file that names no other files and whose debug sections
        // fit the budget: parsing them holds about their size, and a budget is only a bound if
        // one binary cannot pass it alone (past it, names come from the symbol tables).
        let facts = file.as_ref().and_then(|file| inspect_elf(file).ok());
        let debug_syms = matches!(facts, Some(ElfFacts { names_other_files: false, debug_bytes })
                if debug_bytes <= self.budget.limit() / 2);
        let has_own_dwarf = debug_syms && facts.is_some_and(|facts| facts.debug_bytes > 0);
        let debug_file = match (&file, &build_id) {
            (Some(file), Some(build_id)) if !has_own_dwarf => {
                self.find_debug_file(build_id).and_then(|path| {
                    let reads = untrusted::BoundedReads::new(
                        ReadCache::new(file.try_clone().ok()?),
                        1 << 20,
                    );
                    let elf = object::File::parse(&reads).ok()?;
                    Some(DebugFile {
                        path,
                        segments: load_segments(&elf),
                    })
                })
            }
            _ => None,
        };
        let key = match build_id {
            Some(build_id) if !build_id.is_empty() => BinaryKey::BuildId(build_id),
            _ => BinaryKey::File { dev, inode },
        };
        let next_id = self.binaries.len() as u32;
        let id = *self.keys.entry(key).or_insert(next_id);
        if id == next_id {
            self.binaries.push(Binary {
                id,
                debug_syms,
                module: Arc::from(path.to_string_lossy().as_ref()),
                debug_file,
                symbolizer: None,
                frames: HashMap::new(),
                charged: 0,
                last_used: self.clock,
            });
        }
        self.by_file.insert((dev, inode), id);
        id
    }

    /// The debug file of build-id `build_id` under the debug directories: a regular file (the
    /// directories are the host's, root's to write), of the same build-id, whose DWARF fits half
    /// the budget.
    fn find_debug_file(&self, build_id: &[u8]) -> Option<PathBuf> {
        let (first, rest) = build_id.split_first()?;
        if rest.len() < 4 {
            return None;
        }
        let rest: String = rest.iter().map(|byte| format!("{byte:02x}")).collect();
        self.debug_dirs.iter().find_map(|dir| {
            let path = dir
                .join(".build-id")
                .join(format!("{first:02x}"))
                .join(format!("{rest}.debug"));
            debug_file_fits(&path, build_id, self.budget.limit() / 2).then_some(path)
        })
    }

    fn symbolize_binary(
        &mut self,
        process: &ProcessInfo,
        mapping: &Mapping,
        binary: u32,
        offsets: &[u64],
    ) -> Vec<Arc<ResolvedFrame>> {
        let entry = &self.binaries[binary as usize];
        debug_assert_eq!(entry.id, binary);
        let module = entry.module.clone();
        let debug_syms = entry.debug_syms;
        let named_by_offset = || {
            offsets
                .iter()
                .map(|offset| {
                    Arc::new(ResolvedFrame::named(
                        module_offset(&module, *offset),
                        Some(module.clone()),
                    ))
                })
                .collect()
        };
        let file = match process.open_mapped_file(mapping) {
            Ok(file) => file,
            Err(refused) => {
                tracing::debug!(pid = process.pid, module = %module, %refused, "binary not opened");
                return named_by_offset();
            }
        };
        // A debug file is read for the binary: its addresses are the binary's, found from the
        // file offsets through the binary's segments.
        let (source, addresses);
        let input = match &self.binaries[binary as usize].debug_file {
            Some(debug_file) => {
                let mut elf = Elf::new(debug_file.path.clone());
                elf.debug_syms = true;
                source = Source::Elf(elf);
                addresses = offsets
                    .iter()
                    .map(|offset| address_of_offset(&debug_file.segments, *offset).unwrap_or(0))
                    .collect::<Vec<u64>>();
                Input::VirtOffset(&addresses[..])
            }
            None => {
                // blazesym caches parsed files by path and checks the inode behind it on every
                // use, so a descriptor number reused for another file is never mistaken for
                // this one.
                let mut elf = Elf::new(untrusted::fd_path(&file));
                elf.debug_syms = debug_syms;
                source = Source::Elf(elf);
                Input::FileOffset(offsets)
            }
        };
        let symbolizer = self.binaries[binary as usize]
            .symbolizer
            .get_or_insert_with(new_blazesym);
        match symbolizer.symbolize(&source, input) {
            Ok(results) => offsets
                .iter()
                .zip(results.iter())
                .map(|(offset, result)| {
                    Arc::new(from_blazesym(result, Some(module.clone()), || {
                        module_offset(&module, *offset)
                    }))
                })
                .collect(),
            Err(err) => {
                tracing::debug!(pid = process.pid, module = %module, %err, "cannot symbolize");
                named_by_offset()
            }
        }
    }
}

/// Whether `path` is a regular file with build-id `build_id` and at most `max_debug_bytes` of
/// DWARF (what parsing it holds in memory).
fn debug_file_fits(path: &Path, build_id: &[u8], max_debug_bytes: u64) -> bool {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Non-blocking: even in the host's debug directories, a FIFO must not stall the symbolizer.
    let Ok(file) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
    else {
        return false;
    };
    if !file.metadata().is_ok_and(|meta| meta.is_file()) {
        return false;
    }
    let same_build_id = blazesym::helper::read_elf_build_id(path)
        .ok()
        .flatten()
        .is_some_and(|id| *id == *build_id);
    same_build_id && inspect_elf(&file).is_ok_and(|facts| facts.debug_bytes <= max_debug_bytes)
}

/// `sh_flags` of a section whose bytes start with an `Elf64_Chdr` (type, reserved, uncompressed
/// size, alignment) followed by the compressed data.
const SHF_COMPRESSED: u64 = 0x800;

/// Sections through which an ELF file names other files to read its debug information from.
const LINK_SECTIONS: [&[u8]; 3] = [b".gnu_debuglink", b".gnu_debugaltlink", b".debug_sup"];

/// What the section headers of an ELF file say about its debug information.
#[derive(Debug, PartialEq, Eq)]
struct ElfFacts {
    /// It has a debug link section (see [`LINK_SECTIONS`]).
    names_other_files: bool,
    /// Total size of its `.debug_*` sections.
    debug_bytes: u64,
}

/// Reads [`ElfFacts`] from the section headers only (bounded reads: the file is untrusted).
/// Errors for what is not a 64-bit little-endian ELF.
fn inspect_elf(file: &std::fs::File) -> std::io::Result<ElfFacts> {
    use std::os::unix::fs::FileExt as _;
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_owned());
    let mut header = [0u8; 64];
    file.read_exact_at(&mut header, 0)?;
    // ELFCLASS64, ELFDATA2LSB.
    if &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let u16_at = |b: &[u8], at: usize| u16::from_le_bytes([b[at], b[at + 1]]) as u64;
    let u32_at = |b: &[u8], at: usize| {
        let mut word = [0u8; 4];
        word.copy_from_slice(&b[at..at + 4]);
        u32::from_le_bytes(word) as u64
    };
    let u64_at = |b: &[u8], at: usize| {
        let mut word = [0u8; 8];
        word.copy_from_slice(&b[at..at + 8]);
        u64::from_le_bytes(word)
    };
    let (shoff, entsize, count, names_index) = (
        u64_at(&header, 0x28),
        u16_at(&header, 0x3a),
        u16_at(&header, 0x3c),
        u16_at(&header, 0x3e),
    );
    if count == 0 {
        return Ok(ElfFacts {
            names_other_files: false,
            debug_bytes: 0,
        });
    }
    if entsize < 64 || names_index >= count {
        return Err(bad("bad section header table"));
    }
    // At most 65535 entries of a bounded size.
    let mut table = vec![0u8; (count * entsize.min(256)) as usize];
    file.read_exact_at(&mut table, shoff)?;
    let section = |index: u64| &table[(index * entsize.min(256)) as usize..][..64];
    let names = section(names_index);
    let (names_offset, names_size) = (u64_at(names, 0x18), u64_at(names, 0x20));
    let mut strings = vec![0u8; names_size.min(1 << 20) as usize];
    file.read_exact_at(&mut strings, names_offset)?;
    let mut facts = ElfFacts {
        names_other_files: false,
        debug_bytes: 0,
    };
    for index in 0..count {
        let header = section(index);
        let name_at = u32_at(header, 0) as usize;
        let name = strings.get(name_at..).unwrap_or_default();
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        facts.names_other_files |= LINK_SECTIONS.contains(&name);
        if name.starts_with(b".debug_") {
            // A compressed section (Debian's debug files) is parsed from its uncompressed
            // bytes, several times its size on disk: count those, as its header states them.
            let bytes = if u64_at(header, 0x08) & SHF_COMPRESSED != 0 {
                let mut chdr = [0u8; 24];
                file.read_exact_at(&mut chdr, u64_at(header, 0x18))?;
                u64_at(&chdr, 0x08)
            } else {
                u64_at(header, 0x20)
            };
            facts.debug_bytes = facts.debug_bytes.saturating_add(bytes);
        }
    }
    Ok(facts)
}

fn new_blazesym() -> Symbolizer {
    Symbolizer::builder()
        .enable_code_info(true)
        .enable_inlined_fns(true)
        .enable_demangling(true)
        .build()
}

/// `libfoo.so+0x1234`: the name pprof shows for an address no symbol covers.
fn module_offset(module: &str, offset: u64) -> String {
    let name = module.rsplit('/').next().unwrap_or(module);
    format!("{name}+{offset:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[inline(never)]
    fn a_function_with_a_distinct_name() -> u64 {
        std::hint::black_box(42)
    }

    #[test]
    fn resolves_a_function_of_this_test_binary() {
        let process = ProcessInfo::read(std::process::id()).expect("own process");
        let addr = a_function_with_a_distinct_name as *const () as u64 + 1;
        // A budget the test binary's DWARF fits in (a debug build carries hundreds of MB).
        let mut symbolizer = NativeSymbolizer::with_budget(u64::MAX);
        let frames = symbolizer.resolve(&process, &[addr, 0]);
        let frame = frames[0].as_ref().expect("mapped");
        assert!(
            frame.function().contains("a_function_with_a_distinct_name"),
            "got {:?}",
            frame
        );
        assert!(
            frame.lines.last().expect("a line").line > 0,
            "DWARF gives a line: {frame:?}"
        );
        assert!(frames[1].is_none(), "address 0 is in no mapping");

        // A second lookup is served from the per-binary cache.
        let cached = symbolizer.cached_frames();
        let again = symbolizer.resolve(&process, &[addr]);
        assert_eq!(again[0], frames[0]);
        assert_eq!(symbolizer.cached_frames(), cached);
    }

    #[test]
    fn debug_link_sections_are_found_in_the_section_headers() {
        // This test binary embeds its DWARF and names no other file.
        let me = std::fs::File::open("/proc/self/exe").expect("own executable");
        let facts = inspect_elf(&me).expect("an ELF file");
        assert!(!facts.names_other_files);
        assert!(facts.debug_bytes > 1 << 20, "a debug build: {facts:?}");
        // Debian's libc is stripped and links its debug file.
        let process = ProcessInfo::read(std::process::id()).expect("own process");
        let libc = process
            .mappings
            .iter()
            .find(|m| matches!(&m.backing, Backing::File { path, .. } if path.to_string_lossy().contains("libc.so")))
            .expect("libc is mapped");
        let libc = process.open_mapped_file(libc).expect("libc opens");
        assert!(inspect_elf(&libc).expect("an ELF file").names_other_files);
        let not_elf = tempfile::tempfile().expect("tempfile");
        assert!(inspect_elf(&not_elf).is_err());
    }

    #[test]
    fn over_its_budget_the_least_recently_used_binary_is_evicted_and_results_stay_right() {
        let process = ProcessInfo::read(std::process::id()).expect("own process");
        let here = a_function_with_a_distinct_name as *const () as u64 + 1;
        let libc_addr = libc::getpid as *const () as u64;
        // Without debug files: libc's name from its debug file (libc6-dbg) would differ from its
        // `.dynsym` name under the tight budget below, where no DWARF fits.
        let mut symbolizer = NativeSymbolizer::with_budget(u64::MAX).with_debug_dirs(Vec::new());
        let stats = symbolizer.cache_stats();
        let first = symbolizer.resolve(&process, &[here, libc_addr]);
        let charged = stats
            .charged_bytes
            .load(std::sync::atomic::Ordering::Relaxed);
        assert!(charged >= 2 * FRAME_BYTES, "charged {charged}");
        assert_eq!(
            stats.evictions.load(std::sync::atomic::Ordering::Relaxed),
            0
        );

        // A budget nothing fits in: every call's binaries are dropped after use, the oldest
        // first, and the frames are still named.
        let mut tight = NativeSymbolizer::with_budget(1).with_debug_dirs(Vec::new());
        let stats = tight.cache_stats();
        let again = tight.resolve(&process, &[here]);
        let function = |frames: &[Option<Arc<ResolvedFrame>>]| {
            frames[0].as_ref().map(|f| f.function().to_owned())
        };
        // Named from the symbol table: this binary's DWARF is far larger than the budget.
        assert_eq!(function(&again), function(&first));
        assert_eq!(again[0].as_ref().map(|f| f.lines[0].line), Some(0));
        assert_eq!(tight.cached_frames(), 0);
        assert!(stats.evictions.load(std::sync::atomic::Ordering::Relaxed) >= 1);
        assert_eq!(
            stats
                .charged_bytes
                .load(std::sync::atomic::Ordering::Relaxed),
            0
        );
        let libc_again = tight.resolve(&process, &[libc_addr]);
        assert_eq!(function(&libc_again), function(&first[1..]));
    }

    /// Compressed DWARF counts at its uncompressed size: what parsing it holds.
    #[test]
    fn compressed_debug_sections_count_at_their_uncompressed_size() {
        use object::{Object as _, ObjectSection as _};
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("program.c");
        // Forty functions with locals: enough DWARF for compression to matter.
        let functions: String = (0..40)
            .map(|i| {
                format!(
                    "int f{i}(int n) {{ int total_{i} = 0; for (int k = 0; k < n; k++) \
                     total_{i} += k * {i}; return total_{i}; }}\n"
                )
            })
            .collect();
        std::fs::write(
            &source,
            format!(
                "{functions}int main(int argc, char **argv) {{ (void)argv; return f1(argc); }}\n"
            ),
        )
        .expect("source written");
        let build = |name: &str, flags: &[&str]| {
            let binary = dir.path().join(name);
            let status = std::process::Command::new("cc")
                .args(["-g", "-O1"])
                .args(flags)
                .arg("-o")
                .arg(&binary)
                .arg(&source)
                .status()
                .expect("cc runs");
            assert!(status.success());
            let file = std::fs::File::open(&binary).expect("opens");
            let facts = inspect_elf(&file).expect("an ELF file");
            let data = std::fs::read(&binary).expect("readable");
            let on_disk: u64 = object::File::parse(&*data)
                .expect("ELF")
                .sections()
                .filter(|s| s.name().is_ok_and(|n| n.starts_with(".debug_")))
                .filter_map(|s| s.file_range().map(|(_, size)| size))
                .sum();
            (facts.debug_bytes, on_disk)
        };
        let (plain, plain_on_disk) = build("plain", &[]);
        let (compressed, compressed_on_disk) = build("compressed", &["-gz=zlib"]);
        assert_eq!(
            plain, plain_on_disk,
            "uncompressed sections count as they are"
        );
        assert!(
            compressed_on_disk * 3 / 2 < plain,
            "compressed on disk: {compressed_on_disk} of {plain}"
        );
        // The same DWARF, give or take what the linker relaxes differently.
        assert!(
            compressed.abs_diff(plain) * 50 < plain,
            "compressed counts {compressed}, uncompressed {plain}"
        );
    }

    /// A stripped program whose debug file sits under a debug directory by build-id is named
    /// from it, with lines; without the directory it is not.
    #[test]
    fn a_stripped_binary_is_named_from_its_debug_file_by_build_id() {
        use object::{Object as _, ObjectSymbol as _};
        let dir = tempfile::tempdir().expect("tempdir");
        let source = dir.path().join("stripped.c");
        std::fs::write(
            &source,
            "#include <unistd.h>\n\
             __attribute__((noinline)) void a_function_only_the_debug_file_names(void) {\n\
                 for (;;) pause();\n\
             }\n\
             int main(void) { a_function_only_the_debug_file_names(); return 0; }\n",
        )
        .expect("source written");
        let binary = dir.path().join("stripped");
        let debug = dir.path().join("stripped.debug");
        let run = |command: &mut std::process::Command| {
            let status = command.status().expect("a build tool runs (gcc, binutils)");
            assert!(status.success(), "{command:?}");
        };
        run(std::process::Command::new("cc")
            .args(["-g", "-O1", "-Wl,--build-id", "-o"])
            .arg(&binary)
            .arg(&source));
        run(std::process::Command::new("objcopy")
            .arg("--only-keep-debug")
            .arg(&binary)
            .arg(&debug));
        run(std::process::Command::new("strip")
            .arg("--strip-all")
            .arg(&binary));
        let build_id = blazesym::helper::read_elf_build_id(&binary)
            .expect("readable")
            .expect("a build-id")
            .to_vec();
        let debug_dirs = dir.path().join("debug");
        let by_id = debug_dirs
            .join(".build-id")
            .join(format!("{:02x}", build_id[0]));
        std::fs::create_dir_all(&by_id).expect("debug directory");
        let rest: String = build_id[1..].iter().map(|b| format!("{b:02x}")).collect();
        std::fs::copy(&debug, by_id.join(format!("{rest}.debug"))).expect("debug file placed");

        // The function's address in the running program, from the debug file's symbols.
        let debug_data = std::fs::read(&debug).expect("debug file");
        let debug_elf = object::File::parse(&*debug_data).expect("ELF");
        let address = debug_elf
            .symbols()
            .find(|s| s.name() == Ok("a_function_only_the_debug_file_names"))
            .expect("the symbol in the debug file")
            .address();
        let mut child = std::process::Command::new(&binary).spawn().expect("starts");
        std::thread::sleep(std::time::Duration::from_millis(200));
        let process = ProcessInfo::read(child.id()).expect("the child");
        let binary_data = std::fs::read(&binary).expect("binary");
        let segments = load_segments(&object::File::parse(&*binary_data).expect("ELF"));
        let segment = segments
            .iter()
            .find(|s| s.address <= address && address < s.address + s.file_size)
            .expect("a segment holds the function");
        let offset = address - segment.address + segment.file_offset;
        let mapping = process
            .mappings
            .iter()
            .find(|m| m.offset <= offset && offset < m.offset + (m.end - m.start))
            .expect("the function's page is mapped");
        let pc = mapping.start + (offset - mapping.offset) + 1;

        let named = |dirs: Vec<PathBuf>| {
            let mut symbolizer = NativeSymbolizer::with_budget(u64::MAX).with_debug_dirs(dirs);
            symbolizer.resolve(&process, &[pc])[0]
                .as_ref()
                .map(|frame| (frame.function().to_owned(), frame.lines[0].line))
        };
        let with_debug_file = named(vec![debug_dirs]);
        let without = named(Vec::new());
        let _ = child.kill();
        let _ = child.wait();
        let (function, line) = with_debug_file.expect("mapped");
        assert_eq!(function, "a_function_only_the_debug_file_names");
        assert!(line > 0, "DWARF lines from the debug file");
        assert_ne!(
            without.map(|(function, _)| function).as_deref(),
            Some("a_function_only_the_debug_file_names")
        );
    }

    #[test]
    fn unknown_offsets_keep_the_module() {
        assert_eq!(
            module_offset("/usr/lib/libfoo.so.1", 0x1234),
            "libfoo.so.1+0x1234"
        );
    }
}
