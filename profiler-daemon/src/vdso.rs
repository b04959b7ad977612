//! The kernel's vDSO: the small shared object the kernel maps into every process (the fast
//! `clock_gettime`, `gettimeofday`, `getcpu`). It is not a file, so neither the unwind tables
//! nor the symbolizer find it on disk; but every process on a node maps the same image, the
//! running kernel's, so the daemon reads its own copy once and uses it for all of them: its call
//! frame information for the unwind tables (its helpers keep no frame pointer, so a sample in one
//! would hide its caller) and its dynamic symbols for names.
//!
//! The image comes from the daemon's own memory, never from a profiled process: a process may
//! write to its private copy, and must not choose the rules or names used for others.

use std::os::unix::fs::FileExt as _;
use std::sync::OnceLock;

use object::{Object as _, ObjectSymbol as _};

use crate::process::{self, Backing, Mapping};

/// The largest image read (the x86_64 vDSO is two pages).
const MAX_IMAGE_BYTES: u64 = 1 << 20;

/// The vDSO image and its named functions.
pub struct VdsoImage {
    bytes: Vec<u8>,
    /// (start, end, name) of each function symbol, sorted by start; offsets in the image.
    functions: Vec<(u64, u64, String)>,
}

impl VdsoImage {
    /// The image the daemon's own process maps, read once.
    pub fn of_this_host() -> Option<&'static VdsoImage> {
        static IMAGE: OnceLock<Option<VdsoImage>> = OnceLock::new();
        IMAGE.get_or_init(Self::read_own).as_ref()
    }

    fn read_own() -> Option<VdsoImage> {
        let mappings = process::read_mappings(std::process::id()).ok()?;
        let mapping = mappings
            .iter()
            .find(|m| matches!(m.backing, Backing::Vdso))?;
        let len = mapping.end.checked_sub(mapping.start)?;
        if len == 0 || len > MAX_IMAGE_BYTES {
            return None;
        }
        let mut bytes = vec![0; len as usize];
        let memory = std::fs::File::open("/proc/self/mem").ok()?;
        memory.read_exact_at(&mut bytes, mapping.start).ok()?;
        Some(Self::from_bytes(bytes))
    }

    fn from_bytes(bytes: Vec<u8>) -> VdsoImage {
        let mut functions = Vec::new();
        if let Ok(elf) = object::File::parse(&*bytes) {
            for symbol in elf.dynamic_symbols() {
                let (Ok(name), true) = (symbol.name(), symbol.kind() == object::SymbolKind::Text)
                else {
                    continue;
                };
                if symbol.size() > 0 {
                    let start = symbol.address();
                    functions.push((start, start + symbol.size(), name.to_owned()));
                }
            }
        }
        // Aliases share an address (`clock_gettime` and `__vdso_clock_gettime`): the `__vdso_`
        // name is kept, as other tools show it.
        functions.sort_by(|a, b| {
            (a.0, !a.2.starts_with("__vdso_")).cmp(&(b.0, !b.2.starts_with("__vdso_")))
        });
        functions.dedup_by_key(|f| f.0);
        VdsoImage { bytes, functions }
    }

    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// Whether `mapping` (a process's `[vdso]`) holds this image: the same kernel maps the same
    /// image, but a process of another ABI would map another one.
    pub fn is_mapped_by(&self, mapping: &Mapping) -> bool {
        matches!(mapping.backing, Backing::Vdso)
            && mapping.end.checked_sub(mapping.start) == Some(self.bytes.len() as u64)
    }

    /// The function holding `offset` (from the image's start), if a symbol covers it: the
    /// vDSO's internal helpers have none, and get no name rather than their neighbour's.
    pub fn function_at(&self, offset: u64) -> Option<&str> {
        let index = self.functions.partition_point(|f| f.0 <= offset);
        let (start, end, name) = self.functions.get(index.checked_sub(1)?)?;
        (*start <= offset && offset < *end).then_some(name.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_daemons_own_vdso_is_read_with_its_cfi_and_functions() {
        let image = VdsoImage::of_this_host().expect("a vDSO in this process");
        let elf = object::File::parse(image.bytes()).expect("an ELF image");
        assert!(
            object::Object::section_by_name(&elf, ".eh_frame").is_some(),
            "the vDSO has call frame information"
        );
        let (start, end, name) = image
            .functions
            .iter()
            .find(|f| f.2.contains("clock_gettime"))
            .expect("clock_gettime in the vDSO's symbols");
        assert_eq!(name, "__vdso_clock_gettime", "the __vdso_ alias is kept");
        assert_eq!(image.function_at(*start), Some(name.as_str()));
        assert_eq!(image.function_at(end - 1), Some(name.as_str()));
        assert_ne!(image.function_at(*end), Some(name.as_str()));
        assert_eq!(image.function_at(u64::MAX), None);
        // The ELF header is no function.
        assert_eq!(image.function_at(0), None);
    }

    #[test]
    fn a_mapping_of_another_size_is_not_this_image() {
        let image = VdsoImage::of_this_host().expect("a vDSO in this process");
        let len = image.bytes().len() as u64;
        let mapping = |len: u64, backing: Backing| Mapping {
            start: 0x7000_0000,
            end: 0x7000_0000 + len,
            offset: 0,
            backing,
        };
        assert!(image.is_mapped_by(&mapping(len, Backing::Vdso)));
        assert!(!image.is_mapped_by(&mapping(len + 4096, Backing::Vdso)));
        assert!(!image.is_mapped_by(&mapping(len, Backing::Anonymous)));
    }
}
