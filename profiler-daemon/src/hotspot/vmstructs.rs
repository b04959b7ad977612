//! Reading HotSpot's VMStructs tables out of a live JVM.
//!
//! libjvm exports (in `.dynsym`) pointers to four tables: struct fields, types, int and long
//! constants, plus the offsets and strides that describe their entries. The offsets and strides
//! live in `.bss` and are filled by libjvm's static initialisers, so everything is read from the
//! process, not from the file. Each table ends with an entry whose name pointer is null.
//!
//! Remote memory is untrusted: strides and offsets are checked for sanity, tables are capped at
//! [`MAX_ENTRIES`], strings at [`MAX_NAME`] bytes and [`MAX_STRING_BYTES`] in all, and any failed
//! read is an error for this JVM. The caps keep a hostile process's tables to a few milliseconds
//! and a few megabytes of the tracker's time and memory per inspection.

use std::collections::HashMap;

use serde::Serialize;

use super::libjvm::ExportedSymbols;
use super::remote::{ReadError, RemoteMemory};

/// More entries than any HotSpot build has (JDK 11 has 838 structs, the largest table).
pub const MAX_ENTRIES: usize = 5_000;
/// Bytes of distinct names read in all (real tables hold well under 100 KB of them).
pub const MAX_STRING_BYTES: usize = 512 << 10;
/// Longest type or field name accepted.
pub const MAX_NAME: usize = 256;
/// Largest entry stride accepted (HotSpot's are 16 to 48 bytes).
const MAX_STRIDE: u64 = 256;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VmStructsError {
    #[error("reading VMStructs: {0}")]
    Read(#[from] ReadError),
    #[error("implausible VMStructs {what}: {value}")]
    Implausible { what: &'static str, value: u64 },
    #[error("VMStructs {table} table has no end within {MAX_ENTRIES} entries")]
    TooManyEntries { table: &'static str },
    #[error("VMStructs names take more than {MAX_STRING_BYTES} bytes")]
    TooManyNames,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Field {
    /// Byte offset in the type (non-static fields).
    pub offset: u64,
    /// Address of a static field, relative to the load bias (the same for every process of this
    /// libjvm build).
    pub static_offset: Option<u64>,
    pub type_string: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TypeInfo {
    pub size: u64,
    pub superclass: Option<String>,
}

/// The four tables of one libjvm build.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct VmStructs {
    /// `"Type::field"` -> field.
    pub fields: HashMap<String, Field>,
    pub types: HashMap<String, TypeInfo>,
    pub int_constants: HashMap<String, i64>,
    pub long_constants: HashMap<String, i64>,
}

impl VmStructs {
    pub fn field(&self, type_name: &str, field: &str) -> Option<&Field> {
        self.fields.get(&format!("{type_name}::{field}"))
    }

    pub fn type_size(&self, type_name: &str) -> Option<u64> {
        self.types.get(type_name).map(|t| t.size)
    }
}

/// Reads the tables. `bias` is the load bias of libjvm in this process.
pub fn read(
    memory: &dyn RemoteMemory,
    symbols: &ExportedSymbols,
    bias: u64,
) -> Result<VmStructs, VmStructsError> {
    // Every symbol is a u64 variable in the process; read them all first.
    let mut values = [0u64; 24];
    for (value, link_address) in values.iter_mut().zip(symbols.values) {
        *value = memory.read_u64(bias.wrapping_add(link_address))?;
    }
    let mut strings = StringCache::default();
    let mut out = VmStructs::default();

    // Structs: typeName, fieldName, typeString, isStatic, offset, address.
    let layout = EntryLayout::new("struct", values[7], &values[1..7])?;
    for_each_entry(memory, "struct", values[0], &layout, |entry| {
        let type_name = strings.get(memory, entry.u64(0))?;
        let field_name = strings.get(memory, entry.u64(1))?;
        let type_string = match entry.u64(2) {
            0 => None,
            ptr => Some(strings.get(memory, ptr)?),
        };
        let is_static = entry.u32(3) != 0;
        let static_offset = is_static.then(|| entry.u64(5).wrapping_sub(bias));
        out.fields.insert(
            format!("{type_name}::{field_name}"),
            Field {
                offset: if is_static { 0 } else { entry.u64(4) },
                static_offset,
                type_string,
            },
        );
        Ok(())
    })?;

    // Types: typeName, superclassName, isOop, isInteger, isUnsigned, size.
    let layout = EntryLayout::new("type", values[15], &values[9..15])?;
    for_each_entry(memory, "type", values[8], &layout, |entry| {
        let name = strings.get(memory, entry.u64(0))?;
        let superclass = match entry.u64(1) {
            0 => None,
            ptr => Some(strings.get(memory, ptr)?),
        };
        out.types.insert(
            name,
            TypeInfo {
                size: entry.u64(5),
                superclass,
            },
        );
        Ok(())
    })?;

    // Constants: name, value (int32 or int64).
    let layout = EntryLayout::new("int constant", values[19], &values[17..19])?;
    for_each_entry(memory, "int constant", values[16], &layout, |entry| {
        let name = strings.get(memory, entry.u64(0))?;
        out.int_constants.insert(name, entry.u32(1) as i32 as i64);
        Ok(())
    })?;
    let layout = EntryLayout::new("long constant", values[23], &values[21..23])?;
    for_each_entry(memory, "long constant", values[20], &layout, |entry| {
        let name = strings.get(memory, entry.u64(0))?;
        out.long_constants.insert(name, entry.u64(1) as i64);
        Ok(())
    })?;
    Ok(out)
}

/// Where each column of a table's entries is, checked against the stride.
struct EntryLayout {
    stride: u64,
    offsets: Vec<u64>,
}

impl EntryLayout {
    fn new(table: &'static str, stride: u64, offsets: &[u64]) -> Result<Self, VmStructsError> {
        if !(8..=MAX_STRIDE).contains(&stride) {
            return Err(VmStructsError::Implausible {
                what: table_what(table, "stride"),
                value: stride,
            });
        }
        for &offset in offsets {
            // Every column is read as up to 8 bytes.
            if offset.checked_add(8).is_none_or(|end| end > stride) {
                return Err(VmStructsError::Implausible {
                    what: table_what(table, "column offset"),
                    value: offset,
                });
            }
        }
        Ok(Self {
            stride,
            offsets: offsets.to_vec(),
        })
    }
}

fn table_what(table: &'static str, what: &'static str) -> &'static str {
    match (table, what) {
        ("struct", "stride") => "struct entry stride",
        ("type", "stride") => "type entry stride",
        (_, "stride") => "constant entry stride",
        ("struct", _) => "struct entry column offset",
        ("type", _) => "type entry column offset",
        _ => "constant entry column offset",
    }
}

/// One table entry's bytes, read with the table's column offsets.
struct Entry<'a> {
    bytes: &'a [u8],
    layout: &'a EntryLayout,
}

impl Entry<'_> {
    fn u64(&self, column: usize) -> u64 {
        let at = self.layout.offsets[column] as usize;
        u64::from_le_bytes(self.bytes[at..at + 8].try_into().unwrap_or_default())
    }

    fn u32(&self, column: usize) -> u32 {
        let at = self.layout.offsets[column] as usize;
        u32::from_le_bytes(self.bytes[at..at + 4].try_into().unwrap_or_default())
    }
}

/// Calls `visit` for each entry until the one whose first column (the name) is null. Entries
/// are read a batch at a time; near the end of a mapping, one at a time.
fn for_each_entry(
    memory: &dyn RemoteMemory,
    table: &'static str,
    base: u64,
    layout: &EntryLayout,
    mut visit: impl FnMut(&Entry<'_>) -> Result<(), VmStructsError>,
) -> Result<(), VmStructsError> {
    const BATCH: usize = 64;
    if base == 0 {
        return Err(ReadError::Null.into());
    }
    let stride = layout.stride as usize;
    let mut buffer = vec![0u8; BATCH * stride];
    let mut index = 0usize;
    while index < MAX_ENTRIES {
        let address = base.wrapping_add((index * stride) as u64);
        let batch = if memory.read(address, &mut buffer).is_ok() {
            BATCH
        } else {
            memory.read(address, &mut buffer[..stride])?;
            1
        };
        for chunk in buffer.chunks_exact(stride).take(batch) {
            let entry = Entry {
                bytes: chunk,
                layout,
            };
            if entry.u64(0) == 0 {
                return Ok(());
            }
            // Checked per entry, not per batch: a table that ends just past the cap is refused.
            if index >= MAX_ENTRIES {
                return Err(VmStructsError::TooManyEntries { table });
            }
            visit(&entry)?;
            index += 1;
        }
    }
    Err(VmStructsError::TooManyEntries { table })
}

/// Names are shared by many entries (every field of a type points to the same type name).
#[derive(Default)]
struct StringCache {
    by_address: HashMap<u64, String>,
    /// Bytes read for names so far (each name's length and its terminator).
    bytes_read: usize,
}

impl StringCache {
    fn get(&mut self, memory: &dyn RemoteMemory, address: u64) -> Result<String, VmStructsError> {
        if let Some(name) = self.by_address.get(&address) {
            return Ok(name.clone());
        }
        if self.bytes_read >= MAX_STRING_BYTES {
            return Err(VmStructsError::TooManyNames);
        }
        let name = memory.read_c_string(address, MAX_NAME)?;
        self.bytes_read += name.len() + 1;
        self.by_address.insert(address, name.clone());
        Ok(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_unwind::fakes::FakeMemory;
    use proptest::prelude::*;

    /// Lays out a fake libjvm: the 24 symbol variables, four tables and their strings.
    pub(crate) struct FakeJvm {
        pub memory: FakeMemory,
        pub symbols: ExportedSymbols,
    }

    const SYMBOLS_AT: u64 = 0x10_0000;
    const TABLES_AT: u64 = 0x20_0000;
    const STRINGS_AT: u64 = 0x30_0000;

    impl FakeJvm {
        pub fn new(
            structs: &[(&str, &str, Option<u64>, u64)],
            types: &[(&str, u64)],
            ints: &[(&str, i32)],
        ) -> Self {
            let mut strings = Vec::new();
            let mut intern = |s: &str| {
                let at = STRINGS_AT + strings.len() as u64;
                strings.extend_from_slice(s.as_bytes());
                strings.push(0);
                at
            };
            let mut tables = Vec::new();
            // Struct entries: stride 48, HotSpot's layout.
            let structs_at = TABLES_AT;
            for (type_name, field, static_address, offset) in structs {
                let mut entry = vec![0u8; 48];
                entry[0..8].copy_from_slice(&intern(type_name).to_le_bytes());
                entry[8..16].copy_from_slice(&intern(field).to_le_bytes());
                entry[24..28].copy_from_slice(&(static_address.is_some() as u32).to_le_bytes());
                entry[32..40].copy_from_slice(&offset.to_le_bytes());
                entry[40..48].copy_from_slice(&static_address.unwrap_or(0).to_le_bytes());
                tables.extend(entry);
            }
            tables.extend(vec![0u8; 48]);
            let types_at = TABLES_AT + tables.len() as u64;
            for (name, size) in types {
                let mut entry = vec![0u8; 40];
                entry[0..8].copy_from_slice(&intern(name).to_le_bytes());
                entry[32..40].copy_from_slice(&size.to_le_bytes());
                tables.extend(entry);
            }
            tables.extend(vec![0u8; 40]);
            let ints_at = TABLES_AT + tables.len() as u64;
            for (name, value) in ints {
                let mut entry = vec![0u8; 16];
                entry[0..8].copy_from_slice(&intern(name).to_le_bytes());
                entry[8..12].copy_from_slice(&value.to_le_bytes());
                tables.extend(entry);
            }
            tables.extend(vec![0u8; 16]);
            let longs_at = TABLES_AT + tables.len() as u64;
            tables.extend(vec![0u8; 16]);

            let variables: [u64; 24] = [
                structs_at, 0, 8, 16, 24, 32, 40, 48, //
                types_at, 0, 8, 16, 20, 24, 32, 40, //
                ints_at, 0, 8, 16, //
                longs_at, 0, 8, 16,
            ];
            let mut memory = FakeMemory::default();
            memory.add(
                SYMBOLS_AT,
                variables.iter().flat_map(|v| v.to_le_bytes()).collect(),
            );
            memory.add(TABLES_AT, tables);
            // Like real memory, the page holding the strings is readable to its end.
            strings.resize(strings.len().next_multiple_of(4096), 0);
            memory.add(STRINGS_AT, strings);
            let symbols = ExportedSymbols {
                build_id: None,
                first_segment_vaddr: 0,
                values: std::array::from_fn(|i| SYMBOLS_AT + 8 * i as u64),
            };
            Self { memory, symbols }
        }
    }

    #[test]
    fn reads_the_four_tables() {
        let jvm = FakeJvm::new(
            &[
                ("Method", "_constMethod", None, 8),
                ("CodeCache", "_heaps", Some(0x7000_1000), 0),
            ],
            &[("Method", 88)],
            &[("frame::entry_frame_call_wrapper_offset", -6)],
        );
        let tables = read(&jvm.memory, &jvm.symbols, 0).expect("parses");
        assert_eq!(
            tables.field("Method", "_constMethod").map(|f| f.offset),
            Some(8)
        );
        assert_eq!(
            tables
                .field("CodeCache", "_heaps")
                .and_then(|f| f.static_offset),
            Some(0x7000_1000)
        );
        assert_eq!(tables.type_size("Method"), Some(88));
        assert_eq!(
            tables.int_constants["frame::entry_frame_call_wrapper_offset"],
            -6
        );
        assert!(tables.long_constants.is_empty());
    }

    #[test]
    fn garbage_strides_are_rejected() {
        let mut jvm = FakeJvm::new(&[], &[], &[]);
        // The struct stride variable holds nonsense.
        jvm.memory
            .overlay(SYMBOLS_AT + 7 * 8, 1_000_000u64.to_le_bytes().to_vec());
        assert!(matches!(
            read(&jvm.memory, &jvm.symbols, 0),
            Err(VmStructsError::Implausible {
                what: "struct entry stride",
                value: 1_000_000
            })
        ));
    }

    #[test]
    fn a_table_without_end_is_an_error() {
        let mut jvm = FakeJvm::new(&[], &[], &[]);
        // A struct table whose entries all have a name and never end.
        let mut entry = [0u8; 48];
        entry[0..8].copy_from_slice(&(STRINGS_AT + 0x100).to_le_bytes());
        entry[8..16].copy_from_slice(&(STRINGS_AT + 0x100).to_le_bytes());
        jvm.memory
            .overlay(TABLES_AT, entry.repeat(MAX_ENTRIES + 10));
        jvm.memory
            .overlay(STRINGS_AT + 0x100, [b"X\0".as_slice(), &[0; 126]].concat());
        assert_eq!(
            read(&jvm.memory, &jvm.symbols, 0),
            Err(VmStructsError::TooManyEntries { table: "struct" })
        );
    }

    /// The cap holds at any entry, not only at the end of a batch of reads: one entry past it,
    /// then the end, is refused; exactly at it is read.
    #[test]
    fn a_table_one_entry_past_the_cap_is_an_error() {
        let table_of = |entries: usize| {
            let mut jvm = FakeJvm::new(&[], &[], &[]);
            let mut entry = [0u8; 48];
            entry[0..8].copy_from_slice(&(STRINGS_AT + 0x100).to_le_bytes());
            entry[8..16].copy_from_slice(&(STRINGS_AT + 0x100).to_le_bytes());
            let mut table = entry.repeat(entries);
            table.extend_from_slice(&[0u8; 48 * 64]);
            jvm.memory.overlay(TABLES_AT, table);
            jvm.memory
                .overlay(STRINGS_AT + 0x100, [b"X\0".as_slice(), &[0; 126]].concat());
            read(&jvm.memory, &jvm.symbols, 0).map(|_| ())
        };
        assert_eq!(
            table_of(MAX_ENTRIES + 1),
            Err(VmStructsError::TooManyEntries { table: "struct" })
        );
        assert!(!matches!(
            table_of(MAX_ENTRIES),
            Err(VmStructsError::TooManyEntries { .. })
        ));
    }

    proptest! {
        /// Arbitrary bytes where the tables and strings should be: an error or a result, never a
        /// panic or a hang.
        #[test]
        fn arbitrary_memory_never_panics(
            variables in proptest::collection::vec(any::<u64>(), 24),
            small_variables in proptest::collection::vec(0u64..64, 24),
            tables in proptest::collection::vec(any::<u8>(), 0..4096),
            strings in proptest::collection::vec(any::<u8>(), 0..1024),
            use_small in any::<bool>(),
        ) {
            let mut variables = if use_small { small_variables } else { variables };
            // Point the table bases into the arbitrary bytes half of the time.
            if use_small {
                for base in [0, 8, 16, 20] {
                    variables[base] = TABLES_AT + variables[base] * 16;
                }
            }
            let mut memory = FakeMemory::default();
            memory.add(SYMBOLS_AT, variables.iter().flat_map(|v| v.to_le_bytes()).collect());
            memory.add(TABLES_AT, tables);
            memory.add(STRINGS_AT, strings);
            let symbols = ExportedSymbols {
                build_id: None,
                first_segment_vaddr: 0,
                values: std::array::from_fn(|i| SYMBOLS_AT + 8 * i as u64),
            };
            let _ = read(&memory, &symbols, 0);
        }
    }
}
