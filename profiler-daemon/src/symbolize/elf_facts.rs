//! What a profiled process's ELF file claims about its names, read with bounded reads before
//! anything believes it, and the identity under which its names may be shared.
//!
//! blazesym trusts the files it is given: it inflates a compressed section into a buffer of the
//! size the section's header claims (a claim of 1 TiB aborts the daemon), keeps inflating past
//! that claim, and opens whatever files a debug link names (a FIFO blocks it for good). The file
//! belongs to a profiled process, so its headers are read here first, through `object` over
//! [`BoundedReads`], and blazesym may read its DWARF only when they show that to be
//! safe ([`ElfFacts::dwarf_fits`]): no debug links, and DWARF whose inflated size is known,
//! checked by inflating it into nothing, and within the budget.
//!
//! Names are shared between processes only under [`ElfFacts::names_key`]: a secret-keyed digest
//! of the bytes they are derived from (load segments, symbol and string tables, DWARF when it is
//! read) and of the path they are shown under. A build-id is a claim any file can copy; equal
//! digests mean equal names.

use std::fs::File;
use std::io::{self, Read as _};
use std::os::unix::fs::FileExt as _;

use object::elf::{self, FileHeader64};
use object::read::elf::{FileHeader as _, ProgramHeader as _, SectionHeader as _};
use object::read::ReadCache;
use object::Endianness;

use crate::native_unwind::mapping::LoadSegment;
use crate::secret_hash::{Digest, SecretKeys};
use crate::untrusted::BoundedReads;

/// Bytes `object` may read to parse headers, notes and the section name table.
const HEADER_READ_BUDGET: u64 = 32 << 20;
/// Sections through which an ELF file names other files to read its debug information from.
const LINK_SECTIONS: [&str; 3] = [".gnu_debuglink", ".gnu_debugaltlink", ".debug_sup"];
/// Sections names come from without DWARF (symbol tables, and the MiniDebugInfo blazesym would
/// inflate if it could: hashed as it is).
const SYMBOL_SECTIONS: [&str; 5] = [".symtab", ".strtab", ".dynsym", ".dynstr", ".gnu_debugdata"];
/// Pieces in which section bytes are read to be hashed.
const HASH_CHUNK: usize = 1 << 20;

/// A section's bytes in the file.
#[derive(Clone, Debug, PartialEq, Eq)]
struct SectionBytes {
    name: String,
    address: u64,
    offset: u64,
    size: u64,
}

/// A compressed `.debug_*` section: where its compressed bytes are and what it claims.
#[derive(Clone, Debug, PartialEq, Eq)]
struct CompressedSection {
    /// Compressed with zlib, the one format blazesym inflates.
    zlib: bool,
    offset: u64,
    compressed_size: u64,
    claimed_size: u64,
}

/// What the headers of an ELF file say, read bounded.
#[derive(Clone, Debug)]
pub struct ElfFacts {
    /// Its GNU build-id note, if any (a claim: used only to find the host's debug file).
    pub build_id: Option<Vec<u8>>,
    /// It has a debug link section (see [`LINK_SECTIONS`]): blazesym would open what it names.
    pub names_other_files: bool,
    /// What parsing its DWARF holds: its `.debug_*` sections at their uncompressed sizes, as
    /// their headers claim them.
    pub debug_bytes: u64,
    /// A section blazesym cannot inflate safely: compressed with another format than zlib.
    unsupported_compression: bool,
    compressed_debug: Vec<CompressedSection>,
    debug_sections: Vec<SectionBytes>,
    symbol_sections: Vec<SectionBytes>,
    /// Its loadable segments (file offsets to addresses: how cached frames are keyed).
    pub segments: Vec<LoadSegment>,
}

impl ElfFacts {
    /// Reads the headers of `file`: the file, section and program headers, the section names
    /// and the notes, nothing else (not its symbol tables, which `object`'s whole-file parser
    /// would read). Errors for what is not a 64-bit ELF file readable within the read budget.
    pub fn read(file: &File) -> io::Result<Self> {
        let invalid = |err: object::read::Error| io::Error::new(io::ErrorKind::InvalidData, err);
        let reads = BoundedReads::new(ReadCache::new(file.try_clone()?), HEADER_READ_BUDGET);
        let data = &reads;
        let header = FileHeader64::<Endianness>::parse(data).map_err(invalid)?;
        let endian = header.endian().map_err(invalid)?;
        let segments = header
            .program_headers(endian, data)
            .map_err(invalid)?
            .iter()
            .filter(|segment| segment.p_type(endian) == elf::PT_LOAD)
            .map(|segment| LoadSegment {
                file_offset: segment.p_offset(endian),
                file_size: segment.p_filesz(endian),
                address: segment.p_vaddr(endian),
            })
            .collect();
        let sections = header.sections(endian, data).map_err(invalid)?;
        let mut facts = Self {
            build_id: None,
            names_other_files: false,
            debug_bytes: 0,
            unsupported_compression: false,
            compressed_debug: Vec::new(),
            debug_sections: Vec::new(),
            symbol_sections: Vec::new(),
            segments,
        };
        for section in sections.iter() {
            let Ok(name) = sections.section_name(endian, section) else {
                continue;
            };
            let name = String::from_utf8_lossy(name);
            if facts.build_id.is_none() && section.sh_type(endian) == elf::SHT_NOTE {
                facts.build_id = build_id_note(section, endian, data);
            }
            facts.names_other_files |= LINK_SECTIONS.contains(&name.as_ref());
            let bytes = section
                .file_range(endian)
                .map(|(offset, size)| SectionBytes {
                    name: name.clone().into_owned(),
                    address: section.sh_addr(endian),
                    offset,
                    size,
                });
            if SYMBOL_SECTIONS.contains(&name.as_ref()) {
                facts.symbol_sections.extend(bytes.clone());
            }
            if !name.starts_with(".debug_") {
                continue;
            }
            facts.debug_sections.extend(bytes);
            match section.compression(endian, data) {
                Ok(None) => {
                    facts.debug_bytes = facts.debug_bytes.saturating_add(section.sh_size(endian));
                }
                Ok(Some((chdr, offset, compressed_size))) => {
                    let claimed_size = chdr.ch_size.get(endian);
                    facts.debug_bytes = facts.debug_bytes.saturating_add(claimed_size);
                    let zlib = chdr.ch_type.get(endian) == elf::ELFCOMPRESS_ZLIB;
                    facts.unsupported_compression |= !zlib;
                    facts.compressed_debug.push(CompressedSection {
                        zlib,
                        offset,
                        compressed_size,
                        claimed_size,
                    });
                }
                Err(_) => facts.unsupported_compression = true,
            }
        }
        Ok(facts)
    }

    /// Whether a trusted file's (the host's debug directories are root's) DWARF claims at most
    /// `max_bytes`: its claims are believed, nothing is inflated to check them.
    pub fn trusted_dwarf_fits(&self, max_bytes: u64) -> bool {
        !self.names_other_files && !self.unsupported_compression && self.debug_bytes <= max_bytes
    }

    /// About what symbolizing this file holds once parsed: its symbol and string tables (mapped,
    /// and indexed), and with `with_dwarf` its DWARF at 1.6 times its size (measured on libc's
    /// debug file: 10 MB of DWARF, 16 MB parsed).
    pub fn parse_estimate(&self, with_dwarf: bool) -> u64 {
        let symbols: u64 = self
            .symbol_sections
            .iter()
            .map(|section| section.size)
            .sum();
        let dwarf = if with_dwarf {
            self.debug_bytes.saturating_mul(8) / 5
        } else {
            0
        };
        symbols.saturating_add(dwarf)
    }

    /// Whether blazesym may parse this file's DWARF with at most `max_bytes` of it: the file
    /// names no other files, and every compressed debug section is zlib that inflates to
    /// exactly the size it claims (inflated into nothing here, so a bomb costs CPU time bounded
    /// by the budget, never memory).
    pub fn dwarf_fits(&self, file: &File, max_bytes: u64) -> bool {
        if self.names_other_files || self.unsupported_compression || self.debug_bytes > max_bytes {
            return false;
        }
        self.compressed_debug
            .iter()
            .all(|section| inflates_as_claimed(file, section).unwrap_or(false))
    }

    /// The identity under which names read from this file are shared: a digest, under the
    /// daemon's secret, of the path they are shown under, its loadable segments, its symbol and
    /// string tables and, when `with_dwarf`, its DWARF.
    pub fn names_key(
        &self,
        file: &File,
        keys: &SecretKeys,
        shown_as: &str,
        with_dwarf: bool,
    ) -> io::Result<Digest> {
        let mut hasher = keys.hasher();
        hasher.write_bytes(shown_as.as_bytes());
        self.hash_segments(&mut hasher);
        let mut chunk = Vec::new();
        let sections = self
            .symbol_sections
            .iter()
            .chain(self.debug_sections.iter().filter(|_| with_dwarf));
        hasher.write_u64(u64::from(with_dwarf));
        for section in sections {
            hasher.write_bytes(section.name.as_bytes());
            hasher.write_u64(section.address);
            hasher.write_u64(section.size);
            let mut offset = section.offset;
            let end = section.offset.saturating_add(section.size);
            while offset < end {
                let take = (end - offset).min(HASH_CHUNK as u64) as usize;
                chunk.resize(take, 0);
                file.read_exact_at(&mut chunk, offset)?;
                hasher.write_raw(&chunk);
                offset += take as u64;
            }
        }
        Ok(hasher.finish())
    }

    /// The identity of names read for this file from a separate debug file (the host's, by
    /// build-id): the debug file's own identity, and this file's segments, through which its
    /// offsets become the debug file's addresses.
    pub fn debug_file_key(
        &self,
        keys: &SecretKeys,
        shown_as: &str,
        debug_file: &FileStamp,
        with_dwarf: bool,
    ) -> Digest {
        let mut hasher = keys.hasher();
        hasher.write_bytes(shown_as.as_bytes());
        self.hash_segments(&mut hasher);
        hasher.write_bytes(if with_dwarf {
            b"debug file with DWARF".as_slice()
        } else {
            b"debug file, symbols".as_slice()
        });
        for value in debug_file.values() {
            hasher.write_u64(value);
        }
        hasher.finish()
    }

    fn hash_segments(&self, hasher: &mut crate::secret_hash::SecretHasher) {
        hasher.write_u64(self.segments.len() as u64);
        for segment in &self.segments {
            hasher.write_u64(segment.file_offset);
            hasher.write_u64(segment.file_size);
            hasher.write_u64(segment.address);
        }
    }
}

/// A file's identity and version on the host: a file rewritten in place, or a new file given a
/// freed inode number, has another stamp (the change time cannot be set by users).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub dev: u64,
    pub inode: u64,
    pub size: u64,
    pub modified_ns: i128,
    pub changed_ns: i128,
}

impl FileStamp {
    pub fn of(file: &File) -> io::Result<Self> {
        use std::os::unix::fs::MetadataExt as _;
        let meta = file.metadata()?;
        let ns = |secs: i64, nanos: i64| i128::from(secs) * 1_000_000_000 + i128::from(nanos);
        Ok(Self {
            dev: meta.dev(),
            inode: meta.ino(),
            size: meta.size(),
            modified_ns: ns(meta.mtime(), meta.mtime_nsec()),
            changed_ns: ns(meta.ctime(), meta.ctime_nsec()),
        })
    }

    fn values(&self) -> [u64; 5] {
        [
            self.dev,
            self.inode,
            self.size,
            self.modified_ns as u64,
            self.changed_ns as u64,
        ]
    }
}

/// The GNU build-id in a note section, if it holds one.
fn build_id_note(
    section: &elf::SectionHeader64<Endianness>,
    endian: Endianness,
    data: &BoundedReads,
) -> Option<Vec<u8>> {
    let mut notes = section.notes(endian, data).ok()??;
    while let Ok(Some(note)) = notes.next() {
        if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
            return Some(note.desc().to_vec());
        }
    }
    None
}

/// Whether a compressed section inflates to exactly its claimed size: streamed from the file
/// and inflated into nothing, so checking holds a few pages whatever the section claims.
fn inflates_as_claimed(file: &File, section: &CompressedSection) -> io::Result<bool> {
    if !section.zlib {
        return Ok(false);
    }
    let compressed = io::BufReader::new(FileRange {
        file,
        offset: section.offset,
        end: section.offset.saturating_add(section.compressed_size),
    });
    let mut inflated =
        flate2::read::ZlibDecoder::new(compressed).take(section.claimed_size.saturating_add(1));
    let produced = io::copy(&mut inflated, &mut io::sink())?;
    Ok(produced == section.claimed_size)
}

/// A range of a file, read in place.
struct FileRange<'a> {
    file: &'a File,
    offset: u64,
    end: u64,
}

impl io::Read for FileRange<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.end.saturating_sub(self.offset);
        let take = (buf.len() as u64).min(left) as usize;
        if take == 0 {
            return Ok(0);
        }
        let read = self.file.read_at(&mut buf[..take], self.offset)?;
        self.offset += read as u64;
        Ok(read)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::{Object as _, ObjectSection as _};

    /// `sh_flags` of a section whose bytes start with an `Elf64_Chdr`.
    const SHF_COMPRESSED: u64 = 0x800;

    /// Builds a C program with `cc` and `flags`, in `dir`.
    fn build(dir: &std::path::Path, name: &str, flags: &[&str]) -> std::path::PathBuf {
        let source = dir.join("program.c");
        if !source.exists() {
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
                format!("{functions}int main(int argc, char **argv) {{ (void)argv; return f1(argc); }}\n"),
            )
            .expect("source written");
        }
        let binary = dir.join(name);
        let status = std::process::Command::new("cc")
            .args(["-g", "-O1", "-Wl,--build-id"])
            .args(flags)
            .arg("-o")
            .arg(&binary)
            .arg(&source)
            .status()
            .expect("cc runs");
        assert!(status.success());
        binary
    }

    /// The file offset and header of section `name` (64-bit little-endian ELF).
    fn section_header_offset(data: &[u8], name: &str) -> usize {
        let elf = object::File::parse(data).expect("ELF");
        let index = elf
            .section_by_name(name)
            .unwrap_or_else(|| panic!("no {name}"))
            .index()
            .0;
        let shoff = u64::from_le_bytes(data[0x28..0x30].try_into().expect("in bounds")) as usize;
        let entsize = u16::from_le_bytes(data[0x3a..0x3c].try_into().expect("in bounds")) as usize;
        shoff + index * entsize
    }

    #[test]
    fn a_plain_build_is_read_and_its_dwarf_fits() {
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = build(dir.path(), "plain", &[]);
        let file = File::open(&binary).expect("opens");
        let facts = ElfFacts::read(&file).expect("an ELF file");
        assert!(facts.build_id.as_ref().is_some_and(|id| id.len() >= 16));
        assert!(!facts.names_other_files);
        assert!(facts.debug_bytes > 0);
        assert!(facts.dwarf_fits(&file, u64::MAX));
        assert!(!facts.dwarf_fits(&file, facts.debug_bytes - 1));
    }

    #[test]
    fn compressed_dwarf_counts_at_its_claimed_size_and_must_inflate_to_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = build(dir.path(), "compressed", &["-gz=zlib"]);
        let file = File::open(&binary).expect("opens");
        let facts = ElfFacts::read(&file).expect("an ELF file");
        assert!(!facts.compressed_debug.is_empty());
        assert!(
            facts.dwarf_fits(&file, u64::MAX),
            "honest claims inflate as claimed"
        );

        // `.debug_info` claims 1 TiB: counted as such, refused, and nothing that large is
        // ever allocated.
        let mut data = std::fs::read(&binary).expect("readable");
        let header = section_header_offset(&data, ".debug_info");
        let chdr = u64::from_le_bytes(
            data[header + 0x18..header + 0x20]
                .try_into()
                .expect("in bounds"),
        ) as usize;
        data[chdr + 8..chdr + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let huge = dir.path().join("huge");
        std::fs::write(&huge, &data).expect("written");
        let file = File::open(&huge).expect("opens");
        let facts = ElfFacts::read(&file).expect("still an ELF file");
        assert!(facts.debug_bytes >= 1 << 40);
        assert!(
            !facts.dwarf_fits(&file, u64::MAX >> 1),
            "inflates to less than it claims"
        );
        assert!(!facts.dwarf_fits(&file, 1 << 30), "over the budget");

        // A claim smaller than what the section inflates to (a zlib bomb's way past a
        // budget): refused too.
        data[chdr + 8..chdr + 16].copy_from_slice(&16u64.to_le_bytes());
        std::fs::write(&huge, &data).expect("written");
        let file = File::open(&huge).expect("opens");
        let facts = ElfFacts::read(&file).expect("still an ELF file");
        assert!(!facts.dwarf_fits(&file, u64::MAX));
    }

    #[test]
    fn a_compressed_note_section_claiming_a_tebibyte_is_read_bounded() {
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = build(dir.path(), "note", &[]);
        let mut data = std::fs::read(&binary).expect("readable");
        // The build-id note becomes a compressed section claiming 1 TiB (what blazesym
        // inflated before): its flag set and its first bytes an Elf64_Chdr.
        let header = section_header_offset(&data, ".note.gnu.build-id");
        let flags = u64::from_le_bytes(
            data[header + 0x08..header + 0x10]
                .try_into()
                .expect("in bounds"),
        );
        data[header + 0x08..header + 0x10].copy_from_slice(&(flags | SHF_COMPRESSED).to_le_bytes());
        let offset = u64::from_le_bytes(
            data[header + 0x18..header + 0x20]
                .try_into()
                .expect("in bounds"),
        ) as usize;
        let mut chdr = [0u8; 24];
        chdr[0..4].copy_from_slice(&1u32.to_le_bytes());
        chdr[8..16].copy_from_slice(&(1u64 << 40).to_le_bytes());
        data[offset..offset + 24].copy_from_slice(&chdr);
        let hostile = dir.path().join("hostile");
        std::fs::write(&hostile, &data).expect("written");
        let file = File::open(&hostile).expect("opens");
        let facts = ElfFacts::read(&file).expect("still an ELF file");
        assert_eq!(
            facts.build_id, None,
            "no note parses from the compressed bytes"
        );
    }

    #[test]
    fn names_keys_differ_when_the_symbols_the_path_or_the_secret_differ() {
        let dir = tempfile::tempdir().expect("tempdir");
        let binary = build(dir.path(), "plain", &["-Wl,--build-id=0x1234567890abcdef"]);
        let data = std::fs::read(&binary).expect("readable");
        // The same file, one symbol renamed in .strtab: same build-id, same size.
        let renamed = dir.path().join("renamed");
        let mut changed = data.clone();
        let at = changed
            .windows(3)
            .rposition(|w| w == b"f17")
            .expect("the symbol's name");
        changed[at] = b'g';
        std::fs::write(&renamed, &changed).expect("written");
        let keys = SecretKeys::new();
        let key = |path: &std::path::Path, shown_as: &str, keys: &SecretKeys| {
            let file = File::open(path).expect("opens");
            let facts = ElfFacts::read(&file).expect("an ELF file");
            facts
                .names_key(&file, keys, shown_as, false)
                .expect("hashed")
        };
        let copy = dir.path().join("copy");
        std::fs::copy(&binary, &copy).expect("copied");
        assert_eq!(key(&binary, "/x", &keys), key(&copy, "/x", &keys));
        assert_ne!(key(&binary, "/x", &keys), key(&renamed, "/x", &keys));
        assert_ne!(key(&binary, "/x", &keys), key(&binary, "/y", &keys));
        assert_ne!(
            key(&binary, "/x", &keys),
            key(&binary, "/x", &SecretKeys::new())
        );
    }
}
