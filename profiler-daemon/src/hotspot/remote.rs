//! Reading another process's memory, which is untrusted: every read is bounded, and a failed or
//! short read is an error value, never a panic.

use std::io::IoSliceMut;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReadError {
    #[error("reading {len} bytes at {addr:#x}: {errno}")]
    Failed { addr: u64, len: usize, errno: i32 },
    #[error("short read at {addr:#x}: {got} of {len} bytes")]
    Short { addr: u64, len: usize, got: usize },
    #[error("string at {addr:#x} has no end within {max} bytes")]
    Unterminated { addr: u64, max: usize },
    #[error("null pointer read")]
    Null,
}

/// The target's address space.
pub trait RemoteMemory {
    /// Fills `buf` from `addr`, entirely or not at all.
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError>;

    fn read_u64(&self, addr: u64) -> Result<u64, ReadError> {
        let mut bytes = [0; 8];
        self.read(addr, &mut bytes)?;
        Ok(u64::from_le_bytes(bytes))
    }

    fn read_u32(&self, addr: u64) -> Result<u32, ReadError> {
        let mut bytes = [0; 4];
        self.read(addr, &mut bytes)?;
        Ok(u32::from_le_bytes(bytes))
    }

    fn read_i32(&self, addr: u64) -> Result<i32, ReadError> {
        self.read_u32(addr).map(|v| v as i32)
    }

    fn read_u16(&self, addr: u64) -> Result<u16, ReadError> {
        let mut bytes = [0; 2];
        self.read(addr, &mut bytes)?;
        Ok(u16::from_le_bytes(bytes))
    }

    fn read_u8(&self, addr: u64) -> Result<u8, ReadError> {
        let mut bytes = [0; 1];
        self.read(addr, &mut bytes)?;
        Ok(bytes[0])
    }

    /// A pointer that must not be null.
    fn read_ptr(&self, addr: u64) -> Result<u64, ReadError> {
        match self.read_u64(addr)? {
            0 => Err(ReadError::Null),
            ptr => Ok(ptr),
        }
    }

    /// A NUL-terminated string of at most `max` bytes, read in chunks that never cross a page
    /// boundary needlessly (the string may end right before an unmapped page).
    fn read_c_string(&self, addr: u64, max: usize) -> Result<String, ReadError> {
        if addr == 0 {
            return Err(ReadError::Null);
        }
        let mut out = Vec::new();
        let mut cursor = addr;
        while out.len() < max {
            let to_page_end = 4096 - (cursor % 4096) as usize;
            let chunk = to_page_end.min(64).min(max - out.len());
            let mut buf = vec![0; chunk];
            self.read(cursor, &mut buf)?;
            if let Some(end) = buf.iter().position(|&b| b == 0) {
                out.extend_from_slice(&buf[..end]);
                return Ok(String::from_utf8_lossy(&out).into_owned());
            }
            out.extend_from_slice(&buf);
            cursor += chunk as u64;
        }
        Err(ReadError::Unterminated { addr, max })
    }
}

/// A live process, read with `process_vm_readv` (needs ptrace permission over it).
pub struct ProcessMemory {
    pid: u32,
}

impl ProcessMemory {
    pub fn new(pid: u32) -> Self {
        Self { pid }
    }
}

impl RemoteMemory for ProcessMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        if buf.is_empty() {
            return Ok(());
        }
        if addr == 0 {
            return Err(ReadError::Null);
        }
        let len = buf.len();
        let mut local = [IoSliceMut::new(buf)];
        let remote = [libc::iovec {
            iov_base: addr as *mut libc::c_void,
            iov_len: len,
        }];
        // SAFETY: the local iovec covers `buf`, which we own mutably; the remote one is only
        // dereferenced by the kernel, in the target, with fault checks.
        let got = unsafe {
            libc::process_vm_readv(
                self.pid as libc::pid_t,
                local.as_mut_ptr() as *const libc::iovec,
                1,
                remote.as_ptr(),
                1,
                0,
            )
        };
        if got < 0 {
            let errno = std::io::Error::last_os_error().raw_os_error().unwrap_or(0);
            return Err(ReadError::Failed { addr, len, errno });
        }
        if got as usize != len {
            return Err(ReadError::Short {
                addr,
                len,
                got: got as usize,
            });
        }
        Ok(())
    }
}

/// The walker's synthetic process (`profiler_unwind::fakes`), read the way a process is: the
/// daemon's tests and the walker's share one fake memory.
#[cfg(test)]
impl RemoteMemory for profiler_unwind::fakes::FakeMemory {
    fn read(&self, addr: u64, buf: &mut [u8]) -> Result<(), ReadError> {
        use profiler_unwind::UserMemory as _;
        if addr == 0 {
            return Err(ReadError::Null);
        }
        let mut bytes = vec![std::mem::MaybeUninit::uninit(); buf.len()];
        if !self.read_into(addr, &mut bytes) {
            return Err(ReadError::Failed {
                addr,
                len: buf.len(),
                errno: libc::EFAULT,
            });
        }
        for (to, from) in buf.iter_mut().zip(bytes) {
            // SAFETY: `read_into` filled every byte.
            *to = unsafe { from.assume_init() };
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_unwind::fakes::FakeMemory;

    #[test]
    fn reads_our_own_memory() {
        let value: u64 = 0x1122_3344_5566_7788;
        let text = b"hello\0world";
        let memory = ProcessMemory::new(std::process::id());
        assert_eq!(memory.read_u64(&value as *const u64 as u64), Ok(value));
        assert_eq!(
            memory.read_c_string(text.as_ptr() as u64, 64),
            Ok("hello".into())
        );
        assert!(matches!(memory.read_u64(8), Err(ReadError::Failed { .. })));
        assert_eq!(memory.read_u64(0), Err(ReadError::Null));
    }

    #[test]
    fn strings_without_an_end_are_an_error() {
        let mut memory = FakeMemory::default();
        memory.add(0x1000, vec![b'a'; 100]);
        assert!(matches!(
            memory.read_c_string(0x1000, 50),
            Err(ReadError::Unterminated { .. })
        ));
        // Running off the mapped bytes is a read error, not a panic.
        assert!(memory.read_c_string(0x1000, 500).is_err());
    }

    #[test]
    fn dead_process_is_an_error() {
        // pid_max is far below this.
        let memory = ProcessMemory::new(4_000_000);
        assert!(matches!(
            memory.read_u64(0x1000),
            Err(ReadError::Failed { .. })
        ));
    }
}
