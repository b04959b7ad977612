//! Where a process's executable mapping puts a file's code: the bias between the process's pcs
//! and the file's ELF virtual addresses (what unwind table rows hold), and the key a file's table
//! is shared under.
//!
//! The key is a hash of the call frame information itself (its bytes and where the file says it
//! lies), keyed with a secret drawn at start-up: a table is shared only by files whose unwind
//! input is identical, so a container that ships a fake binary under a host library's path or
//! build-id gets a table of its own, and cannot craft a collision with a key it does not know.

use object::{Object as _, ObjectSection as _, ObjectSegment as _, ReadRef};

use crate::secret_hash::{Digest, SecretKeys};

/// One executable mapping of a file in a process, as `/proc/PID/maps` lists it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeMapping {
    pub start: u64,
    pub end: u64,
    /// Offset in the file of the byte mapped at `start`.
    pub file_offset: u64,
}

/// A loadable segment of an ELF file: where its bytes are in the file and in its address space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadSegment {
    pub file_offset: u64,
    pub file_size: u64,
    pub address: u64,
}

/// The loadable segments of `file`.
pub fn load_segments<'data, R: ReadRef<'data>>(file: &object::File<'data, R>) -> Vec<LoadSegment> {
    file.segments()
        .map(|segment| {
            let (file_offset, file_size) = segment.file_range();
            LoadSegment {
                file_offset,
                file_size,
                address: segment.address(),
            }
        })
        .collect()
}

/// `pc - bias` is the file's ELF virtual address of a pc in `mapping` of the ELF file `file`,
/// or `None` if no loadable segment of the file holds the mapped offset.
#[cfg(test)]
pub fn load_bias<'data, R: ReadRef<'data>>(
    file: &object::File<'data, R>,
    mapping: CodeMapping,
) -> Option<u64> {
    load_bias_in(&load_segments(file), mapping)
}

/// [`load_bias`] from the file's segments.
pub fn load_bias_in(segments: &[LoadSegment], mapping: CodeMapping) -> Option<u64> {
    // The loader maps a segment from the page its p_offset is in, so a mapping of a segment
    // starts at that page: its first bytes may be the end of the segment before (lld puts
    // code at 0x11a0c00 of a file whose read-only segment ends at 0x11a0bc4, in the same
    // page). The segment whose first page starts the mapping is the one mapped (the last, for
    // segments sharing a page: code follows headers); else, for a mapping split later
    // (mprotect), the segment holding its offset. Its byte p_offset lies at p_vaddr + bias, so
    // the byte at `file_offset` lies at file_offset - p_offset + p_vaddr + bias = start.
    let offset = mapping.file_offset;
    let address = match segments
        .iter()
        .rev()
        .find(|segment| segment.file_offset & !(PAGE - 1) == offset)
    {
        Some(segment) => offset
            .wrapping_sub(segment.file_offset)
            .wrapping_add(segment.address),
        None => address_of_offset(segments, offset)?,
    };
    Some(mapping.start.wrapping_sub(address))
}

/// The page size mappings are aligned to on x86_64.
const PAGE: u64 = 4096;

/// The ELF virtual address of the byte at `offset` in a file with `segments`.
pub fn address_of_offset(segments: &[LoadSegment], offset: u64) -> Option<u64> {
    segments.iter().find_map(|segment| {
        let end = segment.file_offset.saturating_add(segment.file_size.max(1));
        (segment.file_offset <= offset && offset < end)
            .then(|| offset - segment.file_offset + segment.address)
    })
}

/// The identity of a file's unwind input: equal keys, equal tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableKey(pub u64, pub u64);

/// Hashes unwind input with a secret per-daemon key ([`SecretKeys`]).
#[derive(Clone, Debug, Default)]
pub struct TableKeys {
    secret: SecretKeys,
}

impl TableKeys {
    pub fn new() -> Self {
        Self::default()
    }

    /// The key of `file`'s unwind table: its `.eh_frame` (or `.debug_frame`) bytes and
    /// address, and the section addresses its pointers are relative to. `None` without call
    /// frame information.
    pub fn key<'data, R: ReadRef<'data>>(&self, file: &object::File<'data, R>) -> Option<TableKey> {
        let section = file
            .section_by_name(".eh_frame")
            .or_else(|| file.section_by_name(".debug_frame"))?;
        let bytes = section.data().ok()?;
        let address = |name: &str| file.section_by_name(name).map_or(0, |s| s.address());
        let mut hasher = self.secret.hasher();
        hasher.write_bytes(section.name().unwrap_or("").as_bytes());
        hasher.write_u64(section.address());
        hasher.write_u64(address(".text"));
        hasher.write_u64(address(".got"));
        hasher.write_bytes(bytes);
        let Digest(first, second) = hasher.finish();
        Some(TableKey(first, second))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// librustc_driver's layout (lld): its code starts mid-page, in the page where the
    /// read-only segment before it ends, and a second code segment is 2 MiB aligned.
    #[test]
    fn a_code_mapping_starting_in_the_page_of_the_segment_before_gets_its_own_bias() {
        let segments = [
            LoadSegment {
                file_offset: 0,
                file_size: 0x11a_0bc4,
                address: 0,
            },
            LoadSegment {
                file_offset: 0x11a_0c00,
                file_size: 0x3b1_c9c0,
                address: 0x11a_1c00,
            },
            LoadSegment {
                file_offset: 0x500_0000,
                file_size: 0x2be_2b8c,
                address: 0x500_0000,
            },
        ];
        let first = CodeMapping {
            start: 0x7f6b_557a_1000,
            end: 0x7f6b_592b_f000,
            file_offset: 0x11a_0000,
        };
        let bias = load_bias_in(&segments, first).expect("a bias");
        // The first byte of code (file offset 0x11a0c00) is at vaddr 0x11a1c00.
        assert_eq!(first.start + 0xc00 - bias, 0x11a_1c00);
        let second = CodeMapping {
            start: 0x7f6b_5960_0000,
            end: 0x7f6b_5c1e_3000,
            file_offset: 0x500_0000,
        };
        let bias = load_bias_in(&segments, second).expect("a bias");
        assert_eq!(second.start + 0x129_5400 - bias, 0x629_5400);
        // A mapping split by mprotect starts inside its segment.
        let split = CodeMapping {
            start: first.start + 0x10_0000,
            end: first.end,
            file_offset: 0x12a_0000,
        };
        let bias = load_bias_in(&segments, split).expect("a bias");
        assert_eq!(split.start - bias, 0x12a_1000);
    }

    /// This process's executable mappings of `path`.
    fn own_code_mappings(path: &str) -> Vec<CodeMapping> {
        std::fs::read_to_string("/proc/self/maps")
            .expect("maps")
            .lines()
            .filter(|line| line.ends_with(path))
            .filter_map(|line| {
                let mut fields = line.split_whitespace();
                let (start, end) = fields.next()?.split_once('-')?;
                let perms = fields.next()?;
                let offset = fields.next()?;
                if !perms.contains('x') {
                    return None;
                }
                Some(CodeMapping {
                    start: u64::from_str_radix(start, 16).ok()?,
                    end: u64::from_str_radix(end, 16).ok()?,
                    file_offset: u64::from_str_radix(offset, 16).ok()?,
                })
            })
            .collect()
    }

    #[test]
    fn a_libc_function_maps_back_to_its_symbol_address() {
        let path = std::fs::canonicalize("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let path = path.to_str().expect("utf-8");
        let data = std::fs::read(path).expect("readable");
        let file = object::File::parse(&*data).expect("ELF");
        let mappings = own_code_mappings(path);
        assert!(!mappings.is_empty(), "this test links libc dynamically");
        let getpid = libc::getpid as *const () as u64;
        let mapping = mappings
            .iter()
            .find(|m| m.start <= getpid && getpid < m.end)
            .expect("getpid in libc's code");
        let bias = load_bias(&file, *mapping).expect("a segment holds the mapping");
        let symbol = file
            .dynamic_symbols()
            .find(|s| object::ObjectSymbol::name(s) == Ok("getpid"))
            .expect("getpid in .dynsym");
        assert_eq!(getpid - bias, object::ObjectSymbol::address(&symbol));
    }

    #[test]
    fn tables_are_shared_only_by_identical_unwind_input() {
        let keys = TableKeys::new();
        let libc = std::fs::read("/lib/x86_64-linux-gnu/libc.so.6").expect("libc");
        let key = |data: &[u8]| keys.key(&object::File::parse(data).expect("ELF"));
        assert_eq!(key(&libc), key(&libc.clone()));
        // Same build-id, same path, one byte of .eh_frame changed: another table.
        let file = object::File::parse(&*libc).expect("ELF");
        let (offset, size) = file
            .section_by_name(".eh_frame")
            .and_then(|s| s.file_range())
            .expect(".eh_frame");
        let mut changed = libc.clone();
        changed[(offset + size / 2) as usize] ^= 1;
        assert_ne!(key(&libc), key(&changed));
        // Another daemon (another secret) keys the same file differently.
        let other = TableKeys::new();
        assert_ne!(key(&libc), other.key(&file));
    }
}
