//! Finding a process's libjvm.so and the `gHotSpot*` symbols that locate its VMStructs tables.

use std::fs::File;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::process::{Backing, Mapping, ProcessInfo};

/// Largest libjvm.so read (about 20 MB stripped, a few hundred MB with debug info).
const MAX_LIBJVM_BYTES: u64 = 1 << 30;

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
    pub fn find(process: &ProcessInfo) -> Option<Self> {
        // Executable mappings only are kept by ProcessInfo; libjvm's first segment (offset 0)
        // is read-only, so look at the full maps for it.
        let maps = crate::process::read_all_mappings(process.pid).ok()?;
        maps.into_iter().find_map(|map| match map.pathname {
            procfs::process::MMapPath::Path(path)
                if map.offset == 0 && path.file_name().is_some_and(|n| n == "libjvm.so") =>
            {
                Some(Self {
                    region: Mapping {
                        start: map.address.0,
                        end: map.address.1,
                        offset: 0,
                        backing: Backing::File {
                            path: path.clone(),
                            dev: libc::makedev(map.dev.0 as u32, map.dev.1 as u32),
                            inode: map.inode,
                        },
                    },
                    path,
                    start: map.address.0,
                })
            }
            _ => None,
        })
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
    /// Reads the file `file` (libjvm as mapped at `path`), bounded in size.
    pub fn read(mut file: File, path: &Path) -> Result<Self, LibJvmError> {
        let read_error = |source| LibJvmError::Read {
            path: path.to_owned(),
            source,
        };
        let mut bytes = Vec::new();
        (&mut file)
            .take(MAX_LIBJVM_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(read_error)?;
        if bytes.len() as u64 > MAX_LIBJVM_BYTES {
            return Err(read_error(std::io::Error::other(format!(
                "over {MAX_LIBJVM_BYTES} bytes"
            ))));
        }
        Self::parse(&bytes, path)
    }

    pub fn parse(bytes: &[u8], path: &Path) -> Result<Self, LibJvmError> {
        let parse_error = |message: String| LibJvmError::Parse {
            path: path.to_owned(),
            message,
        };
        let file = object::File::parse(bytes).map_err(|err| parse_error(err.to_string()))?;
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
