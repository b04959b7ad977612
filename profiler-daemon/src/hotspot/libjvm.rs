//! Finding a process's libjvm.so and the `gHotSpot*` symbols that locate its VMStructs tables.

use std::path::{Path, PathBuf};

use object::{Object, ObjectSegment, ObjectSymbol};

use crate::process::ProcessInfo;

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
    /// Paths that open it from the daemon (through /proc/PID/root first).
    pub host_paths: Vec<PathBuf>,
    /// Start of the mapping of file offset 0.
    pub start: u64,
}

impl LibJvmMapping {
    pub fn find(process: &ProcessInfo) -> Option<Self> {
        // Executable mappings only are kept by ProcessInfo; libjvm's first segment (offset 0)
        // is read-only, so look at the full maps for it.
        let maps = procfs::process::Process::new(process.pid as i32)
            .ok()?
            .maps()
            .ok()?;
        maps.into_iter().find_map(|map| match map.pathname {
            procfs::process::MMapPath::Path(path)
                if map.offset == 0 && path.file_name().is_some_and(|n| n == "libjvm.so") =>
            {
                Some(Self {
                    host_paths: process.host_paths(&path),
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
    pub fn read(path: &Path) -> Result<Self, LibJvmError> {
        let bytes = std::fs::read(path).map_err(|source| LibJvmError::Read {
            path: path.to_owned(),
            source,
        })?;
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

/// Reads the first host path that works.
pub fn read_exported_symbols(mapping: &LibJvmMapping) -> Result<ExportedSymbols, LibJvmError> {
    let mut last = None;
    for path in &mapping.host_paths {
        match ExportedSymbols::read(path) {
            Ok(symbols) => return Ok(symbols),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or(LibJvmError::NotAJvm))
}
