//! Finding a process's libjvm.so and the `gHotSpot*` symbols that locate its VMStructs tables.

use std::fs::File;
use std::path::{Path, PathBuf};

use object::read::ReadCache;
use object::{Object, ObjectSegment, ObjectSymbol, ReadRef};

use crate::process::{Backing, Mapping, ProcessInfo};
use crate::untrusted::BoundedReads;

/// Most bytes read from one libjvm.so file (its headers, notes and dynamic symbol table take a
/// few hundred KB; the file is 20-30 MB stripped, hundreds of MB with debug info).
const MAX_BYTES_READ: u64 = 16 << 20;

/// The 24 exported symbols, in the order [`ExportedSymbols::values`] stores them.
pub const SYMBOL_NAMES: [&str; 24] = [
    "gHotSpotVMStructs",
    "gHotSpotVMStructEntryTypeNameOffset",
    "gHotSpotVMStructEntryFieldNameOffset",
    "gHotSpotVMStructEntryTypeStringOffset",
    "gHotSpotVMStructEntryIsStaticOffset",
    "gHotSpotVMStructEntryOffsetOffset",
    "gHotSpotVMStructEntryAddressOffset",
    "gHotSpotVMStructEntryArrayStride",
    "gHotSpotVMTypes",
    "gHotSpotVMTypeEntryTypeNameOffset",
    "gHotSpotVMTypeEntrySuperclassNameOffset",
    "gHotSpotVMTypeEntryIsOopTypeOffset",
    "gHotSpotVMTypeEntryIsIntegerTypeOffset",
    "gHotSpotVMTypeEntryIsUnsignedOffset",
    "gHotSpotVMTypeEntrySizeOffset",
    "gHotSpotVMTypeEntryArrayStride",
    "gHotSpotVMIntConstants",
    "gHotSpotVMIntConstantEntryNameOffset",
    "gHotSpotVMIntConstantEntryValueOffset",
    "gHotSpotVMIntConstantEntryArrayStride",
    "gHotSpotVMLongConstants",
    "gHotSpotVMLongConstantEntryNameOffset",
    "gHotSpotVMLongConstantEntryValueOffset",
    "gHotSpotVMLongConstantEntryArrayStride",
];

#[derive(Debug, thiserror::Error)]
pub enum LibJvmError {
    #[error("process does not map libjvm.so: not a HotSpot JVM")]
    NotAJvm,
    #[error("reading {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("parsing {path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("{path} lacks the exported symbol {symbol}")]
    MissingSymbol { path: PathBuf, symbol: &'static str },
}

/// Where libjvm.so is in one process.
#[derive(Clone, Debug)]
pub struct LibJvmMapping {
    /// The path in the process's mount namespace.
    pub path: PathBuf,
    /// Start of the mapping of file offset 0.
    pub start: u64,
    /// That mapping, to open the very file mapped.
    region: Mapping,
}

impl LibJvmMapping {
    /// Where process `pid` maps libjvm.so, if it runs it: one read of its maps, the cheap test
    /// of whether a process is a JVM.
    pub fn find_in(pid: u32) -> Option<Self> {
        let maps = crate::process::read_all_mappings(pid).ok()?;
        let maps = maps.0;
        let dev_of = |dev: (i32, i32)| libc::makedev(dev.0 as u32, dev.1 as u32);
        // A JVM runs the file's code; a program that only reads it (a symbolizer, this daemon)
        // maps it without execute.
        let runs_code_of = |dev: u64, inode: u64| {
            maps.iter().any(|map| {
                map.perms.contains(procfs::process::MMPermissions::EXECUTE)
                    && map.inode == inode
                    && dev_of(map.dev) == dev
            })
        };
        maps.iter().find_map(|map| match &map.pathname {
            procfs::process::MMapPath::Path(path)
                if map.offset == 0
                    && path.file_name().is_some_and(|n| n == "libjvm.so")
                    && runs_code_of(dev_of(map.dev), map.inode) =>
            {
                Some(Self {
                    region: Mapping {
                        start: map.address.0,
                        end: map.address.1,
                        offset: 0,
                        backing: Backing::File {
                            path: path.clone(),
                            dev: dev_of(map.dev),
                            inode: map.inode,
                        },
                    },
                    path: path.clone(),
                    start: map.address.0,
                })
            }
            _ => None,
        })
    }
}

impl LibJvmMapping {
    /// The file's identity on the host (device, inode): one per libjvm file, whatever the
    /// path or mount namespace a JVM reaches it by.
    pub fn file_identity(&self) -> Option<(u64, u64)> {
        match &self.region.backing {
            Backing::File { dev, inode, .. } => Some((*dev, *inode)),
            _ => None,
        }
    }

    /// Opens the very file process `pid` maps (as untrusted input, see
    /// [`crate::process::open_mapped_file`]).
    pub fn open(&self, pid: u32) -> Result<File, crate::untrusted::Refused> {
        crate::process::open_mapped_file(pid, crate::process::shares_our_root(pid), &self.region)
    }
}

/// What the libjvm file itself says: build-id, symbol values and where its first segment loads.
#[derive(Clone, Debug)]
pub struct ExportedSymbols {
    pub build_id: Option<Vec<u8>>,
    /// `p_vaddr` of the first loadable segment, page aligned: subtracted from the mapping start
    /// to get the load bias.
    pub first_segment_vaddr: u64,
    /// Link-time addresses of [`SYMBOL_NAMES`], same order.
    pub values: [u64; 24],
}

impl ExportedSymbols {
    /// Reads the file `file` (libjvm as mapped at `path`): only the headers, notes and dynamic
    /// symbols, a few hundred KB of a 20 MB file, and never more than [`MAX_BYTES_READ`].
    pub fn read(file: File, path: &Path) -> Result<Self, LibJvmError> {
        let reader = BoundedReads::new(ReadCache::new(file), MAX_BYTES_READ);
        Self::parse(&reader, path)
    }

    pub fn parse<'data, R: ReadRef<'data>>(data: R, path: &Path) -> Result<Self, LibJvmError> {
        let parse_error = |message: String| LibJvmError::Parse {
            path: path.to_owned(),
            message,
        };
        let file = object::File::parse(data).map_err(|err| parse_error(err.to_string()))?;
        let build_id = file.build_id().ok().flatten().map(<[u8]>::to_vec);
        let first_segment_vaddr = file
            .segments()
            .map(|segment| segment.address())
            .min()
            .ok_or_else(|| parse_error("no loadable segment".into()))?
            & !0xfff;
        let mut values = [0u64; 24];
        let mut found = [false; 24];
        for symbol in file.dynamic_symbols() {
            let Ok(name) = symbol.name() else { continue };
            if let Some(index) = SYMBOL_NAMES.iter().position(|wanted| *wanted == name) {
                values[index] = symbol.address();
                found[index] = true;
            }
        }
        if let Some(missing) = found.iter().position(|f| !f) {
            return Err(LibJvmError::MissingSymbol {
                path: path.to_owned(),
                symbol: SYMBOL_NAMES[missing],
            });
        }
        Ok(Self {
            build_id,
            first_segment_vaddr,
            values,
        })
    }
}

/// Reads the libjvm `process` maps (the very file mapped, opened as untrusted input).
pub fn read_exported_symbols(
    process: &ProcessInfo,
    mapping: &LibJvmMapping,
) -> Result<ExportedSymbols, LibJvmError> {
    let file = process
        .open_mapped_file(&mapping.region)
        .map_err(|refused| LibJvmError::Read {
            path: mapping.path.clone(),
            source: std::io::Error::other(refused),
        })?;
    ExportedSymbols::read(file, &mapping.path)
}

#[cfg(test)]
mod tests {
    use object::ObjectSection as _;

    use super::*;

    /// A shared library exporting the 24 symbols (values 100, 101, ...) and, in its data,
    /// `padding_mb` megabytes that reading the symbols must not touch.
    fn fake_libjvm(dir: &Path, padding_mb: usize) -> PathBuf {
        let mut source = String::new();
        for (index, name) in SYMBOL_NAMES.iter().enumerate() {
            source.push_str(&format!(
                "__attribute__((used)) long {name} = {};\n",
                100 + index
            ));
        }
        source.push_str(&format!(
            "__attribute__((used)) char padding[{padding_mb} << 20] = {{1}};\n"
        ));
        let c_file = dir.join("fake.c");
        std::fs::write(&c_file, source).expect("write the C source");
        let library = dir.join("libjvm.so");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-o"])
            .arg(&library)
            .arg(&c_file)
            .status()
            .expect("run cc (a C compiler is needed by the tests; `cargo xtask test` installs it)");
        assert!(status.success(), "cc failed");
        library
    }

    #[test]
    fn finds_the_symbols_reading_a_small_part_of_a_large_file() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), 2 * (MAX_BYTES_READ as usize >> 20));
        let size = std::fs::metadata(&library).expect("stat").len();
        assert!(size > 2 * MAX_BYTES_READ, "the fixture is {size} bytes");

        let file = File::open(&library).expect("open");
        let symbols = ExportedSymbols::read(file, &library).expect("symbols read");
        // Each symbol's value is its address in the file: check it holds the number 100 + i.
        let bytes = std::fs::read(&library).expect("read whole");
        let elf = object::File::parse(&*bytes).expect("parse");
        for (index, address) in symbols.values.iter().enumerate() {
            let section = elf
                .sections()
                .find(|s| (s.address()..s.address() + s.size()).contains(address))
                .expect("symbol in a section");
            let data = section.data().expect("section data");
            let at = (address - section.address()) as usize;
            let value = i64::from_ne_bytes(data[at..at + 8].try_into().expect("8 bytes"));
            assert_eq!(value, 100 + index as i64, "{}", SYMBOL_NAMES[index]);
        }
        assert!(symbols.build_id.is_some());
    }

    #[test]
    fn refuses_a_file_whose_headers_ask_for_more_than_the_budget() {
        let dir = tempfile::tempdir().expect("temporary directory");
        let library = fake_libjvm(dir.path(), 1);
        let file = File::open(&library).expect("open");
        let reader = BoundedReads::new(ReadCache::new(file), 512);
        let err = ExportedSymbols::parse(&reader, &library).expect_err("over the budget");
        assert!(matches!(err, LibJvmError::Parse { .. }), "{err}");
    }
}
