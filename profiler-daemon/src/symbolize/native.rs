//! User-space addresses in ELF files to function names, files, lines and inlined calls
//! (symtab, dynsym and DWARF, through blazesym).
//!
//! Results are cached per binary, identified by its GNU build-id when it has one (so the same
//! library in many processes or containers is parsed once), else by device and inode. Binaries
//! are files of profiled processes: each is opened by [`ProcessInfo::open_mapped_file`] (the very
//! file mapped, never a link or special file) and handed to blazesym as `/proc/self/fd/N`, so
//! blazesym reads exactly what was checked.

use std::sync::Arc;

use blazesym::symbolize::{source::Elf, source::Source, Input, Symbolizer};
use hashbrown::HashMap;

use super::{from_blazesym, ResolvedFrame};
use crate::process::{Backing, Mapping, ProcessInfo};
use crate::untrusted;

/// Bounds on what is cached; past them the caches start over, so memory stays bounded on hosts
/// that run many distinct binaries.
const MAX_BINARIES: usize = 2_048;
const MAX_CACHED_FRAMES: usize = 500_000;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum BinaryKey {
    BuildId(Vec<u8>),
    File { dev: u64, inode: u64 },
}

struct Binary {
    /// Index into `NativeSymbolizer::keys`, the per-binary part of the frame cache key.
    id: u32,
    /// Whether blazesym may read its DWARF: not when the file names other files (debug links),
    /// which blazesym would open by a path the file's author chose (a FIFO would block it).
    debug_syms: bool,
    /// The file's name in the process's namespace, for frames that cannot be named.
    module: Arc<str>,
}

pub struct NativeSymbolizer {
    symbolizer: Symbolizer,
    /// (dev, inode) -> binary; the cheap identity from /proc/PID/maps.
    by_file: HashMap<(u64, u64), u32>,
    /// Build-id (or file) identity -> binary id.
    keys: HashMap<BinaryKey, u32>,
    binaries: Vec<Binary>,
    frames: HashMap<(u32, u64), Arc<ResolvedFrame>>,
    unknown_anonymous: Arc<ResolvedFrame>,
}

impl Default for NativeSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl NativeSymbolizer {
    pub fn new() -> Self {
        Self {
            symbolizer: new_blazesym(),
            by_file: HashMap::new(),
            keys: HashMap::new(),
            binaries: Vec::new(),
            frames: HashMap::new(),
            unknown_anonymous: Arc::new(ResolvedFrame::named("[unknown]", None)),
        }
    }

    /// Resolves addresses of `process`. Entries are `None` where the address is in no known
    /// mapping (the caller may refresh the mappings and ask again).
    pub fn resolve(
        &mut self,
        process: &ProcessInfo,
        addrs: &[u64],
    ) -> Vec<Option<Arc<ResolvedFrame>>> {
        if self.binaries.len() > MAX_BINARIES || self.frames.len() > MAX_CACHED_FRAMES {
            *self = Self::new();
        }
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
                    match self.frames.get(&(binary, offset)) {
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
                    out[index] = Some(Arc::new(ResolvedFrame::named(
                        format!("[vdso]+{:#x}", addr - mapping.start),
                        Some(Arc::from("[vdso]")),
                    )))
                }
                Backing::Anonymous => out[index] = Some(self.unknown_anonymous.clone()),
            }
        }

        for (binary, (indexes, offsets, mapping)) in pending {
            let frames = self.symbolize_binary(process, mapping, binary, &offsets);
            for ((index, offset), frame) in indexes.into_iter().zip(offsets).zip(frames) {
                self.frames.insert((binary, offset), frame.clone());
                out[index] = Some(frame);
            }
        }
        out
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
        let debug_syms = file
            .as_ref()
            .is_some_and(|file| matches!(names_other_files(file), Ok(false)));
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
            });
        }
        self.by_file.insert((dev, inode), id);
        id
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
        // blazesym caches parsed files by path and checks the inode behind it on every use, so a
        // descriptor number reused for another file is never mistaken for this one.
        let mut elf = Elf::new(untrusted::fd_path(&file));
        elf.debug_syms = debug_syms;
        let source = Source::Elf(elf);
        match self
            .symbolizer
            .symbolize(&source, Input::FileOffset(offsets))
        {
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

/// Sections through which an ELF file names other files to read its debug information from.
const LINK_SECTIONS: [&[u8]; 3] = [b".gnu_debuglink", b".gnu_debugaltlink", b".debug_sup"];

/// Whether the ELF file `file` has a debug link section, read from its section headers only
/// (bounded reads: the file is untrusted). Errors for what is not a 64-bit little-endian ELF.
fn names_other_files(file: &std::fs::File) -> std::io::Result<bool> {
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
        return Ok(false);
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
    Ok((0..count).any(|index| {
        let name_at = u32_at(section(index), 0) as usize;
        let name = strings.get(name_at..).unwrap_or_default();
        let name = &name[..name.iter().position(|b| *b == 0).unwrap_or(name.len())];
        LINK_SECTIONS.contains(&name)
    }))
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
        let mut symbolizer = NativeSymbolizer::new();
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
        let cached = symbolizer.frames.len();
        let again = symbolizer.resolve(&process, &[addr]);
        assert_eq!(again[0], frames[0]);
        assert_eq!(symbolizer.frames.len(), cached);
    }

    #[test]
    fn debug_link_sections_are_found_in_the_section_headers() {
        // This test binary embeds its DWARF and names no other file.
        let me = std::fs::File::open("/proc/self/exe").expect("own executable");
        assert!(!names_other_files(&me).expect("an ELF file"));
        // Debian's libc is stripped and links its debug file.
        let process = ProcessInfo::read(std::process::id()).expect("own process");
        let libc = process
            .mappings
            .iter()
            .find(|m| matches!(&m.backing, Backing::File { path, .. } if path.to_string_lossy().contains("libc.so")))
            .expect("libc is mapped");
        let libc = process.open_mapped_file(libc).expect("libc opens");
        assert!(names_other_files(&libc).expect("an ELF file"));
        let not_elf = tempfile::tempfile().expect("tempfile");
        assert!(names_other_files(&not_elf).is_err());
    }

    #[test]
    fn unknown_offsets_keep_the_module() {
        assert_eq!(
            module_offset("/usr/lib/libfoo.so.1", 0x1234),
            "libfoo.so.1+0x1234"
        );
    }
}
