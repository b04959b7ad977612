//! Field offsets of kernel structures, read from the kernel's own BTF
//! (`/sys/kernel/btf/vmlinux`): what the compat BPF object needs where the kernel lacks the
//! helpers that find them (`task_struct::stack` for the user registers of an in-kernel sample
//! before `bpf_task_pt_regs`, `task_struct::pid` for a thread's tid before task storage).
//!
//! BTF's format is the kernel's (`Documentation/bpf/btf.rst`): a header, a type section of
//! records (a 12-byte common part, then a kind-specific tail), a string section. Only structs'
//! members are read; every other kind is stepped over by its tail's size.

use std::path::Path;

/// Where the running kernel's BTF is.
pub const VMLINUX_BTF: &str = "/sys/kernel/btf/vmlinux";

const BTF_MAGIC: u16 = 0xeb9f;
const KIND_STRUCT: u32 = 4;

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("reading {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("not BTF, or a layout this reader does not know: {0}")]
    Malformed(&'static str),
    #[error("struct {0} is not in the kernel's BTF")]
    NoStruct(String),
    #[error("struct {structure} has no member {member} in the kernel's BTF")]
    NoMember { structure: String, member: String },
}

/// A kernel's BTF, parsed enough to find struct members.
pub struct KernelBtf {
    data: Vec<u8>,
    types: std::ops::Range<usize>,
    strings: std::ops::Range<usize>,
}

impl KernelBtf {
    /// The running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new(VMLINUX_BTF))
    }

    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path).map_err(|source| BtfError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Self::parse(data)
    }

    pub fn parse(data: Vec<u8>) -> Result<Self, BtfError> {
        let u16_at = |at: usize| {
            data.get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err(BtfError::Malformed("no BTF magic (or not little-endian)"));
        }
        let header_len = read_u32(&data, 4).ok_or(BtfError::Malformed("short header"))? as usize;
        let field = |at: usize| {
            read_u32(&data, 8 + at)
                .map(|v| v as usize)
                .ok_or(BtfError::Malformed("short header"))
        };
        let (type_off, type_len, str_off, str_len) = (field(0)?, field(4)?, field(8)?, field(12)?);
        let types = header_len + type_off..header_len + type_off + type_len;
        let strings = header_len + str_off..header_len + str_off + str_len;
        if types.end > data.len() || strings.end > data.len() {
            return Err(BtfError::Malformed("sections past the end"));
        }
        Ok(Self {
            data,
            types,
            strings,
        })
    }

    /// The byte offset of `member` in struct `structure` (a member of the struct itself, not of
    /// a nested anonymous one).
    pub fn member_offset(&self, structure: &str, member: &str) -> Result<u32, BtfError> {
        let mut at = self.types.start;
        let mut found_struct = false;
        while at + 12 <= self.types.end {
            let name_off = read_u32(&self.data, at).unwrap_or(0);
            let info = read_u32(&self.data, at + 4).unwrap_or(0);
            let kind = (info >> 24) & 0x1f;
            let vlen = (info & 0xffff) as usize;
            let kind_flag = info >> 31 != 0;
            let tail = tail_bytes(kind, vlen).ok_or(BtfError::Malformed("unknown BTF kind"))?;
            if kind == KIND_STRUCT && self.string(name_off) == Some(structure) {
                found_struct = true;
                for index in 0..vlen {
                    let m = at + 12 + index * 12;
                    let name = read_u32(&self.data, m).unwrap_or(0);
                    if self.string(name) == Some(member) {
                        let offset = read_u32(&self.data, m + 8).unwrap_or(0);
                        // With kind_flag, the low 24 bits are the offset and the high 8 a
                        // bitfield's size; bits either way.
                        let bits = if kind_flag {
                            offset & 0xff_ffff
                        } else {
                            offset
                        };
                        return Ok(bits / 8);
                    }
                }
            }
            at += 12 + tail;
        }
        Err(if found_struct {
            BtfError::NoMember {
                structure: structure.to_owned(),
                member: member.to_owned(),
            }
        } else {
            BtfError::NoStruct(structure.to_owned())
        })
    }

    fn string(&self, offset: u32) -> Option<&str> {
        let start = self.strings.start + offset as usize;
        let bytes = self.data.get(start..self.strings.end)?;
        let end = bytes.iter().position(|&b| b == 0)?;
        std::str::from_utf8(&bytes[..end]).ok()
    }
}

/// Bytes after a type's common part, by kind.
fn tail_bytes(kind: u32, vlen: usize) -> Option<usize> {
    Some(match kind {
        // INT: one word of encoding.
        1 => 4,
        // PTR, FWD, TYPEDEF, VOLATILE, CONST, RESTRICT, FUNC, FLOAT, TYPE_TAG.
        2 | 7 | 8 | 9 | 10 | 11 | 12 | 16 | 18 => 0,
        // ARRAY.
        3 => 12,
        // STRUCT, UNION: members of three words; DATASEC: variables of three words.
        4 | 5 | 15 => 12 * vlen,
        // ENUM, FUNC_PROTO: two words each.
        6 | 13 => 8 * vlen,
        // VAR, DECL_TAG: one word.
        14 | 17 => 4,
        // ENUM64: three words each.
        19 => 12 * vlen,
        _ => return None,
    })
}

fn read_u32(data: &[u8], at: usize) -> Option<u32> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_task_struct_fields_in_this_kernel() {
        let btf = KernelBtf::from_sys_fs().expect("this machine's kernel has BTF");
        let stack = btf
            .member_offset("task_struct", "stack")
            .expect("task_struct::stack");
        let pid = btf
            .member_offset("task_struct", "pid")
            .expect("task_struct::pid");
        assert!(stack > 0 && pid > stack, "stack {stack}, pid {pid}");
        assert!(matches!(
            btf.member_offset("task_struct", "no_such_member"),
            Err(BtfError::NoMember { .. })
        ));
        assert!(matches!(
            btf.member_offset("no_such_struct", "pid"),
            Err(BtfError::NoStruct(_))
        ));
    }

    #[test]
    fn refuses_what_is_not_btf() {
        assert!(KernelBtf::parse(b"\x7fELF....".to_vec()).is_err());
        assert!(KernelBtf::parse(vec![0x9f, 0xeb, 1, 0, 24, 0, 0, 0]).is_err());
    }
}
