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
//! and parsed DWARF, and the frames resolved from it, are charged to the [`CacheBudget`] and,
//! while the budget is exceeded, binaries are evicted (and parsed again if they show up again):
//! the least recently used of the user whose processes' binaries hold the most, so that a user
//! running many large binaries evicts their own first, not everyone else's.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolizer};
use hashbrown::HashMap;

use super::cache_budget::{self, CacheBudget, CacheStats};
use super::elf_facts::{ElfFacts, FileStamp};
use super::{from_blazesym, ResolvedFrame};
use crate::native_unwind::mapping::{address_of_offset, LoadSegment};
use crate::process::{Backing, Mapping, ProcessInfo};
use crate::secret_hash::{Digest, SecretKeys};
use crate::untrusted;
use crate::vdso::VdsoImage;

/// Where separate debug files are looked up by build-id (the host's, not a container's).
pub const DEFAULT_DEBUG_DIRS: [&str; 1] = ["/usr/lib/debug"];

/// Bound on binaries known (their identities, a few hundred bytes each, stay after eviction);
/// past it everything starts over.
const MAX_BINARIES: usize = 16_384;
/// Bound on (process, file) identities remembered; past it they are identified again.
const MAX_PROCESS_FILES: usize = 65_536;
/// What one cached frame is charged: the `Arc`, its lines and names, and the map entry.
const FRAME_BYTES: u64 = 256;

/// The identity under which a binary's names are shared (see [`super::elf_facts`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum BinaryKey {
    /// A digest of what its names come from: shared by every file with the same.
    Names(Digest),
    /// Its headers could not be read or hashed: this very file only.
    File(FileStamp),
    /// It could not be opened: named by offset, this mapped inode only.
    Unopened { dev: u64, inode: u64 },
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
    /// Its GNU build-id in hex, for the profiles' mappings (see [`shown_build_id`]).
    build_id: Option<Arc<str>>,
    /// Its own symbolizer (mapped file, parsed symbols and DWARF), while cached.
    symbolizer: Option<Symbolizer>,
    /// File offset -> frame, while cached.
    frames: HashMap<u64, Arc<ResolvedFrame>>,
    /// Bytes charged to the budget for the two above.
    charged: u64,
    /// What its first parse is expected to hold ([`ElfFacts::parse_estimate`]): made room for
    /// in the budget before it, so that the cache stays within its limit even while a binary
    /// larger than the room left is parsed.
    parse_estimate: u64,
    /// When it was last used (a `NativeSymbolizer::clock` value).
    last_used: u64,
    /// The user whose process last had it symbolized: whose share its charge counts against.
    user: u32,
}

/// What a new binary is named from, as its headers were read: a [`Binary`]'s fields of that
/// name.
struct NameSources {
    debug_syms: bool,
    debug_file: Option<DebugFile>,
    build_id: Option<Arc<str>>,
    parse_estimate: u64,
}

impl NameSources {
    /// A file whose headers could not be read: its symbol tables, if blazesym reads any.
    const SYMBOLS_ONLY: Self = Self {
        debug_syms: false,
        debug_file: None,
        build_id: None,
        parse_estimate: 0,
    };
}

/// A binary's separate debug file: same build-id, same segments, symbols and DWARF.
struct DebugFile {
    path: PathBuf,
    /// Whether its DWARF is read (it fits [`NativeSymbolizer::dwarf_bound`]); else its symbol
    /// table alone names the binary's functions, still better than the binary's own.
    dwarf: bool,
    /// Its identity: names read from it are shared under it (the host's debug directories are
    /// root's, so its path is trusted).
    stamp: FileStamp,
    /// The binary's loadable segments: file offsets in the binary to addresses in both files.
    segments: Vec<LoadSegment>,
}

pub struct NativeSymbolizer {
    /// (pid, start time, dev, inode) -> binary: each process's files, identified once.
    by_process_file: HashMap<(u32, u64, u64, u64), u32>,
    /// (file stamp, path shown) -> binary: a file's headers are read and hashed once.
    by_stamp: HashMap<(FileStamp, Arc<str>), u32>,
    /// Names identity -> binary id.
    keys: HashMap<BinaryKey, u32>,
    /// The secret names identities are keyed with.
    secret: SecretKeys,
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
            by_process_file: HashMap::new(),
            by_stamp: HashMap::new(),
            keys: HashMap::new(),
            secret: SecretKeys::new(),
            binaries: Vec::new(),
            unknown_anonymous: Arc::new(ResolvedFrame::named("[unknown]", None)),
            budget: CacheBudget::with_stats(limit_bytes, stats),
            clock: 0,
            debug_dirs: DEFAULT_DEBUG_DIRS.iter().map(PathBuf::from).collect(),
        }
    }

    /// Looks debug files up under `dirs` instead of [`DEFAULT_DEBUG_DIRS`].
    #[cfg(test)]
    pub fn with_debug_dirs(mut self, dirs: Vec<PathBuf>) -> Self {
        self.debug_dirs = dirs;
        self
    }

    /// Frames cached over all binaries.
    #[cfg(test)]
    pub fn cached_frames(&self) -> usize {
        self.binaries.iter().map(|b| b.frames.len()).sum()
    }

    /// The budget's counters, for the metrics endpoint.
    #[cfg(test)]
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
                    entry.user = process.uid;
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
            let entry = &self.binaries[binary as usize];
            if entry.symbolizer.is_none() {
                self.make_room_for(entry.parse_estimate);
            }
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

    /// Drops binaries' caches while over the budget (the results of this call are already out:
    /// even a binary bigger than the whole budget is symbolized, then dropped).
    fn evict_over_budget(&mut self) {
        self.make_room_for(0);
    }

    /// Drops binaries' caches until `bytes` more fit in the budget, or none is left to drop:
    /// the least recently used binary of the user whose binaries are charged the most.
    fn make_room_for(&mut self, bytes: u64) {
        while self.budget.charged().saturating_add(bytes) > self.budget.limit() {
            let mut by_user: HashMap<u32, u64> = HashMap::new();
            for binary in self
                .binaries
                .iter()
                .filter(|b| b.charged > 0 || b.symbolizer.is_some())
            {
                *by_user.entry(binary.user).or_default() += binary.charged;
            }
            let Some(heaviest) = by_user
                .into_iter()
                .max_by_key(|(user, charged)| (*charged, *user))
                .map(|(user, _)| user)
            else {
                return;
            };
            let Some(victim) = self
                .binaries
                .iter()
                .filter(|b| b.user == heaviest && (b.charged > 0 || b.symbolizer.is_some()))
                .min_by_key(|b| b.last_used)
                .map(|b| b.id)
            else {
                return;
            };
            let entry = &mut self.binaries[victim as usize];
            entry.symbolizer = None;
            entry.frames = HashMap::new();
            let charged = std::mem::take(&mut entry.charged);
            self.budget.release(charged);
        }
    }

    /// Forgets the processes `alive` (by pid and start time) says are gone, and drops the
    /// caches of every binary none of the others maps. A cached binary holds its file mapped:
    /// a file on a tmpfs, or deleted, keeps its memory while it does, so a user's file would
    /// stay in memory on the daemon's account after the user's processes are gone.
    pub fn forget_exited(&mut self, alive: impl Fn(u32, u64) -> bool) {
        self.by_process_file
            .retain(|&(pid, start_time, _, _), _| alive(pid, start_time));
        let in_use: std::collections::HashSet<u32> =
            self.by_process_file.values().copied().collect();
        for entry in &mut self.binaries {
            if entry.symbolizer.is_some() && !in_use.contains(&entry.id) {
                entry.symbolizer = None;
                entry.frames = HashMap::new();
                let charged = std::mem::take(&mut entry.charged);
                self.budget.release(charged);
            }
        }
    }

    /// Forgets every binary (their number passed its bound).
    fn forget_all(&mut self) {
        for entry in &mut self.binaries {
            let charged = std::mem::take(&mut entry.charged);
            self.budget.release(charged);
        }
        self.binaries.clear();
        self.by_process_file.clear();
        self.by_stamp.clear();
        self.keys.clear();
    }

    /// The binary id of a mapped file of `process`, identified the first time the process is
    /// seen mapping it.
    fn binary(&mut self, process: &ProcessInfo, mapping: &Mapping) -> u32 {
        let Backing::File { dev, inode, .. } = &mapping.backing else {
            unreachable!("only file mappings have binaries");
        };
        // Per process, not per inode: a file deleted and its inode number given to another
        // file must not keep the first one's names.
        let memo = (process.pid, process.start_time, *dev, *inode);
        if let Some(&id) = self.by_process_file.get(&memo) {
            return id;
        }
        let id = self.identify(process, mapping);
        if self.by_process_file.len() >= MAX_PROCESS_FILES {
            self.by_process_file.clear();
        }
        self.by_process_file.insert(memo, id);
        id
    }

    /// Reads a mapped file's headers (bounded) and finds or makes its binary. Whether blazesym
    /// may read its DWARF is decided here, per file: DWARF is read only from a file that names
    /// no other files and whose debug sections inflate as claimed within the budget (parsing
    /// them holds about their size, and a budget is only a bound if one binary cannot pass it
    /// alone); past it, names come from the symbol tables.
    fn identify(&mut self, process: &ProcessInfo, mapping: &Mapping) -> u32 {
        let Backing::File { path, dev, inode } = &mapping.backing else {
            unreachable!("only file mappings have binaries");
        };
        let module: Arc<str> = Arc::from(path.to_string_lossy().as_ref());
        let unopened = BinaryKey::Unopened {
            dev: *dev,
            inode: *inode,
        };
        let Ok(file) = process.open_mapped_file(mapping) else {
            return self.intern(unopened, module, NameSources::SYMBOLS_ONLY);
        };
        let Ok(stamp) = FileStamp::of(&file) else {
            return self.intern(unopened, module, NameSources::SYMBOLS_ONLY);
        };
        if let Some(&id) = self.by_stamp.get(&(stamp, module.clone())) {
            return id;
        }
        let started = std::time::Instant::now();
        let id = match ElfFacts::read(&file) {
            Ok(facts) => {
                let debug_syms = facts.dwarf_fits(&file, self.dwarf_bound());
                let has_own_dwarf = debug_syms && facts.debug_bytes > 0;
                let found = match &facts.build_id {
                    Some(build_id) if !has_own_dwarf => self.find_debug_file(build_id),
                    _ => None,
                };
                let parse_estimate = found.as_ref().map_or_else(
                    || facts.parse_estimate(debug_syms),
                    |(_, _, _, estimate)| *estimate,
                );
                let debug_file = found.map(|(path, stamp, dwarf, _)| DebugFile {
                    path,
                    dwarf,
                    stamp,
                    segments: facts.segments.clone(),
                });
                let key = match &debug_file {
                    Some(debug_file) => BinaryKey::Names(facts.debug_file_key(
                        &self.secret,
                        &module,
                        &debug_file.stamp,
                        debug_file.dwarf,
                    )),
                    None => facts
                        .names_key(&file, &self.secret, &module, debug_syms)
                        .map_or(BinaryKey::File(stamp), BinaryKey::Names),
                };
                let build_id = facts.build_id.as_deref().and_then(shown_build_id);
                let sources = NameSources {
                    debug_syms,
                    debug_file,
                    build_id,
                    parse_estimate,
                };
                self.intern(key, module.clone(), sources)
            }
            Err(_) => self.intern(
                BinaryKey::File(stamp),
                module.clone(),
                NameSources::SYMBOLS_ONLY,
            ),
        };
        tracing::debug!(
            pid = process.pid,
            module = %module,
            binary = id,
            took_us = started.elapsed().as_micros() as u64,
            "binary identified (headers read, names keyed)"
        );
        self.by_stamp.insert((stamp, module), id);
        id
    }

    /// The binary of `key`, made if new.
    fn intern(&mut self, key: BinaryKey, module: Arc<str>, sources: NameSources) -> u32 {
        let next_id = self.binaries.len() as u32;
        let id = *self.keys.entry(key).or_insert(next_id);
        if id == next_id {
            self.binaries.push(Binary {
                id,
                debug_syms: sources.debug_syms,
                module,
                debug_file: sources.debug_file,
                build_id: sources.build_id,
                symbolizer: None,
                frames: HashMap::new(),
                charged: 0,
                parse_estimate: sources.parse_estimate,
                last_used: self.clock,
                user: u32::MAX,
            });
        }
        id
    }

    /// The most uncompressed DWARF a file may have for it to be read: a sixteenth of the budget
    /// (6 MiB of the default 96). Parsed DWARF holds about 1.6 times its size, and the lines and
    /// inlined functions it gives are worth a tenth of the budget, not more: libc's debug file
    /// (10 MB of DWARF) alone was 16 MB of a one-JVM daemon's 50. Past the bound, names come
    /// from the symbol tables.
    fn dwarf_bound(&self) -> u64 {
        self.budget.limit() / 16
    }

    /// The debug file of build-id `build_id` under the debug directories: a regular file (the
    /// directories are the host's, root's to write) of the same build-id, and whether its DWARF
    /// fits [`Self::dwarf_bound`].
    fn find_debug_file(&self, build_id: &[u8]) -> Option<(PathBuf, FileStamp, bool, u64)> {
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
            let (stamp, dwarf, parse_estimate) =
                debug_file_of(&path, build_id, self.dwarf_bound())?;
            Some((path, stamp, dwarf, parse_estimate))
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
        let build_id = entry.build_id.clone();
        let debug_syms = entry.debug_syms;
        let named_by_offset = || {
            offsets
                .iter()
                .map(|offset| {
                    let frame =
                        ResolvedFrame::named(module_offset(&module, *offset), Some(module.clone()));
                    Arc::new(frame.with_build_id(build_id.clone()))
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
                elf.debug_syms = debug_file.dwarf;
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
                    let frame = from_blazesym(result, Some(module.clone()), || {
                        module_offset(&module, *offset)
                    });
                    Arc::new(frame.with_build_id(build_id.clone()))
                })
                .collect(),
            Err(err) => {
                tracing::debug!(pid = process.pid, module = %module, %err, "cannot symbolize");
                named_by_offset()
            }
        }
    }
}

/// A build-id as profiles show it: hex, if its length is one a linker writes (8 to 64 bytes;
/// GNU ld's sha1 is 20). A file claims it; another length is not shown.
fn shown_build_id(build_id: &[u8]) -> Option<Arc<str>> {
    if !(8..=64).contains(&build_id.len()) {
        return None;
    }
    let hex: String = build_id.iter().map(|byte| format!("{byte:02x}")).collect();
    Some(Arc::from(hex))
}

/// The stamp of `path` if it is a regular file with build-id `build_id` that names no other
/// files, whether its DWARF fits `max_debug_bytes`, and what parsing it is expected to hold.
fn debug_file_of(
    path: &Path,
    build_id: &[u8],
    max_debug_bytes: u64,
) -> Option<(FileStamp, bool, u64)> {
    use std::os::unix::fs::OpenOptionsExt as _;
    // Non-blocking: even in the host's debug directories, a FIFO must not stall the symbolizer.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    if !file.metadata().is_ok_and(|meta| meta.is_file()) {
        return None;
    }
    let facts = ElfFacts::read(&file).ok()?;
    if facts.build_id.as_deref() != Some(build_id) || facts.names_other_files {
        return None;
    }
    let dwarf = facts.trusted_dwarf_fits(max_debug_bytes);
    Some((
        FileStamp::of(&file).ok()?,
        dwarf,
        facts.parse_estimate(dwarf),
    ))
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
    use crate::native_unwind::mapping::load_segments;
    use std::sync::atomic::Ordering;

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
    fn a_binary_no_live_process_maps_is_let_go_and_its_charge_given_back() {
        let process = ProcessInfo::read(std::process::id()).expect("own process");
        let addr = a_function_with_a_distinct_name as *const () as u64 + 1;
        let mut symbolizer = NativeSymbolizer::with_budget(u64::MAX);
        let named = symbolizer.resolve(&process, &[addr]);
        let stats = symbolizer.cache_stats();
        assert!(stats.charged_bytes.load(Ordering::Relaxed) > 0);

        // Still mapped by a live process: kept.
        symbolizer.forget_exited(|_, _| true);
        assert!(symbolizer.cached_frames() > 0);
        assert!(symbolizer.binaries.iter().any(|b| b.symbolizer.is_some()));

        // Its process gone: the file is no longer held, nothing is charged for it.
        symbolizer.forget_exited(|_, _| false);
        assert_eq!(symbolizer.cached_frames(), 0);
        assert!(symbolizer.binaries.iter().all(|b| b.symbolizer.is_none()));
        assert_eq!(stats.charged_bytes.load(Ordering::Relaxed), 0);

        // A process mapping it again gets the same names.
        assert_eq!(symbolizer.resolve(&process, &[addr]), named);
    }

    #[test]
    fn debug_link_sections_are_found_in_the_section_headers() {
        // This test binary embeds its DWARF and names no other file.
        let me = std::fs::File::open("/proc/self/exe").expect("own executable");
        let facts = ElfFacts::read(&me).expect("an ELF file");
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
        assert!(
            ElfFacts::read(&libc)
                .expect("an ELF file")
                .names_other_files
        );
        let not_elf = tempfile::tempfile().expect("tempfile");
        assert!(ElfFacts::read(&not_elf).is_err());
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
        // Named from the symbol table: this binary's DWARF is far larger than the budget. (With
        // line tables only, as the tests build it, DWARF names it without its module path.)
        for named in [function(&again), function(&first)] {
            assert!(
                named
                    .as_deref()
                    .is_some_and(|name| name.ends_with("a_function_with_a_distinct_name")),
                "{named:?}"
            );
        }
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
        let build_id = ElfFacts::read(&std::fs::File::open(&binary).expect("opens"))
            .expect("an ELF file")
            .build_id
            .expect("a build-id");
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
        let pc = process
            .mappings
            .iter()
            .find_map(|m| m.address_of(offset))
            .expect("the function's page is mapped")
            + 1;

        let named = |dirs: Vec<PathBuf>, budget: u64| {
            let mut symbolizer = NativeSymbolizer::with_budget(budget).with_debug_dirs(dirs);
            symbolizer.resolve(&process, &[pc])[0]
                .as_ref()
                .map(|frame| (frame.function().to_owned(), frame.lines[0].line))
        };
        let with_debug_file = named(vec![debug_dirs.clone()], u64::MAX);
        // A budget whose DWARF bound the debug file's DWARF passes: its symbols still name
        // the function, without lines.
        let symbols_only = named(vec![debug_dirs], 16);
        let without = named(Vec::new(), u64::MAX);
        let _ = child.kill();
        let _ = child.wait();
        let (function, line) = with_debug_file.expect("mapped");
        assert_eq!(function, "a_function_only_the_debug_file_names");
        assert!(line > 0, "DWARF lines from the debug file");
        assert_eq!(
            symbols_only,
            Some(("a_function_only_the_debug_file_names".to_owned(), 0))
        );
        assert_ne!(
            without.map(|(function, _)| function).as_deref(),
            Some("a_function_only_the_debug_file_names")
        );
    }

    impl NativeSymbolizer {
        /// A binary of `user`'s whose cache was charged `charged` bytes, last used at `last_used`.
        fn add_cached(&mut self, user: u32, charged: u64, last_used: u64) {
            self.binaries.push(Binary {
                id: self.binaries.len() as u32,
                debug_syms: false,
                module: Arc::from("/m"),
                debug_file: None,
                build_id: None,
                symbolizer: None,
                frames: HashMap::new(),
                charged,
                parse_estimate: 0,
                last_used,
                user,
            });
            self.budget.charge(charged);
        }
    }

    /// Over the budget, the user whose binaries are charged the most loses theirs first, least
    /// recently used first; the other user keeps theirs.
    #[test]
    fn over_its_budget_the_heaviest_users_binaries_are_evicted_first() {
        let mut symbolizer = NativeSymbolizer::with_budget(1000);
        // (user, charged, last used): user 7 holds 900 bytes in three binaries, user 8 holds 300.
        for (user, charged, last_used) in [(7, 300, 1), (8, 300, 0), (7, 300, 2), (7, 300, 3)] {
            symbolizer.add_cached(user, charged, last_used);
        }
        symbolizer.evict_over_budget();
        let still_charged: Vec<u64> = symbolizer.binaries.iter().map(|b| b.charged).collect();
        // 1200 > 1000: user 7's least recently used binary goes, not user 8's older one.
        assert_eq!(still_charged, vec![0, 300, 300, 300]);
    }

    /// Before a binary's first parse, binaries are evicted until what it is expected to hold
    /// fits: the cache never holds its limit plus a large binary at once.
    #[test]
    fn room_is_made_for_a_parse_before_it() {
        let mut symbolizer = NativeSymbolizer::with_budget(1000);
        for last_used in [2, 0, 1] {
            symbolizer.add_cached(7, 300, last_used);
        }
        symbolizer.make_room_for(500);
        let still_charged: Vec<u64> = symbolizer.binaries.iter().map(|b| b.charged).collect();
        // 900 + 500 > 1000: the two least recently used go, 300 + 500 fits.
        assert_eq!(still_charged, vec![300, 0, 0]);
        // Nothing left to evict for a parse larger than the budget: it goes ahead.
        symbolizer.make_room_for(5000);
        assert_eq!(symbolizer.budget.charged(), 0);
    }

    #[test]
    fn unknown_offsets_keep_the_module() {
        assert_eq!(
            module_offset("/usr/lib/libfoo.so.1", 0x1234),
            "libfoo.so.1+0x1234"
        );
    }
}
