//! Parsing of the sample records the eBPF program writes to the ring buffer.
//!
//! A record is untrusted bytes as far as this module is concerned: lengths are checked against
//! the buffer, and a record that does not parse is counted by the caller, never a panic.

use profiler_common::{
    FrameKind, SampleHeader, UnwindEnd, UserFrame, COMM_LEN, HEADER_BYTES, KERNEL_FRAME_BYTES,
    USER_FRAME_BYTES,
};

/// A borrowed view of one sample record.
#[derive(Clone, Copy, Debug)]
pub struct SampleView<'a> {
    pub header: SampleHeader,
    /// Kernel instruction pointers, innermost first, as raw little-endian bytes.
    kernel: &'a [u8],
    /// User frames, innermost first, as raw bytes.
    user: &'a [u8],
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RecordError {
    #[error("record of {len} bytes is shorter than its {HEADER_BYTES}-byte header")]
    ShortHeader { len: usize },
    #[error("record of {len} bytes announces {kernel} kernel and {user} user frames")]
    ShortFrames { len: usize, kernel: u16, user: u16 },
}

impl<'a> SampleView<'a> {
    pub fn parse(bytes: &'a [u8]) -> Result<Self, RecordError> {
        if bytes.len() < HEADER_BYTES {
            return Err(RecordError::ShortHeader { len: bytes.len() });
        }
        // SAFETY: SampleHeader is plain old data and the slice holds at least its size.
        let header: SampleHeader =
            unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SampleHeader) };
        let kernel_len = header.kernel_frames as usize * KERNEL_FRAME_BYTES;
        let user_len = header.user_frames as usize * USER_FRAME_BYTES;
        let frames = &bytes[HEADER_BYTES..];
        if frames.len() < kernel_len + user_len {
            return Err(RecordError::ShortFrames {
                len: bytes.len(),
                kernel: header.kernel_frames,
                user: header.user_frames,
            });
        }
        Ok(Self {
            header,
            kernel: &frames[..kernel_len],
            user: &frames[kernel_len..kernel_len + user_len],
        })
    }

    pub fn pid(&self) -> u32 {
        self.header.pid
    }

    /// The thread name, without its NUL padding.
    pub fn thread_name(&self) -> &[u8; COMM_LEN] {
        &self.header.comm
    }

    pub fn user_end(&self) -> Option<UnwindEnd> {
        UnwindEnd::from_u8(self.header.user_end)
    }

    pub fn kernel_ips(&self) -> impl Iterator<Item = u64> + 'a {
        self.kernel
            .chunks_exact(KERNEL_FRAME_BYTES)
            .map(|chunk| u64::from_ne_bytes(chunk.try_into().unwrap_or_default()))
    }

    pub fn user_frames(&self) -> impl Iterator<Item = UserFrame> + 'a {
        self.user.chunks_exact(USER_FRAME_BYTES).map(|chunk| {
            // SAFETY: UserFrame is plain old data and the chunk has exactly its size.
            unsafe { std::ptr::read_unaligned(chunk.as_ptr() as *const UserFrame) }
        })
    }

    /// The user frames with what tells each apart and names it ([`UserFrameKey`]).
    pub fn keyed_user_frames(&self) -> impl Iterator<Item = (UserFrameKey, UserFrame)> + 'a {
        self.user_frames()
            .enumerate()
            .map(|(index, frame)| (UserFrameKey::of(index, &frame), frame))
    }

    /// The bytes that identify this stack (kernel and user frames), for hashing and equality.
    pub fn stack_bytes(&self) -> (&'a [u8], &'a [u8]) {
        (self.kernel, self.user)
    }
}

/// How a user frame is told apart from a profile's others, and what names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UserFrameKey {
    /// A native frame, by the address to look up: the interrupted instruction for the top
    /// frame; one byte back from the others' return addresses, which point after their call.
    Native(u64),
    /// A HotSpot frame as the BPF unwinder recorded it; the top frame resolves differently from
    /// a return address, hence `top`.
    Java {
        kind: u8,
        addr: u64,
        aux: u32,
        cookie: u32,
        top: bool,
    },
}

impl UserFrameKey {
    /// The key of user frame `index` of a stack (0: the interrupted instruction).
    pub fn of(index: usize, frame: &UserFrame) -> Self {
        match frame.kind() {
            Some(FrameKind::Native) if index == 0 => Self::Native(frame.addr()),
            Some(FrameKind::Native) => Self::Native(frame.addr().saturating_sub(1)),
            // A kind BPF never writes goes to the Java symbolizer too, which shows it as the
            // `bad_frame_kind` marker.
            Some(FrameKind::Interpreted | FrameKind::Compiled | FrameKind::AllocatedClass)
            | None => Self::Java {
                kind: frame.kind_byte(),
                addr: frame.addr(),
                aux: frame.aux,
                cookie: frame.cookie,
                top: index == 0,
            },
        }
    }

    pub fn is_java(&self) -> bool {
        matches!(self, Self::Java { .. })
    }
}

/// The name bytes up to the first NUL, lossily decoded.
pub fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|&b| b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Builds a record the way the eBPF program lays it out.
    pub(crate) fn encode(
        pid: u32,
        comm: &str,
        kernel: &[u64],
        user: &[u64],
        end: UnwindEnd,
    ) -> Vec<u8> {
        let mut name = [0u8; COMM_LEN];
        name[..comm.len()].copy_from_slice(comm.as_bytes());
        let header = SampleHeader {
            ktime_ns: 1,
            pid,
            tid: pid,
            cpu: 0,
            kernel_frames: kernel.len() as u16,
            user_frames: user.len() as u16,
            user_end: end as u8,
            kind: profiler_common::SampleKind::Cpu as u8,
            task_state: 0,
            java_state: 0,
            weight: 0,
            comm: name,
            uid: 0,
            flags: 0,
            virtual_thread: 0,
        };
        let mut bytes = Vec::new();
        // SAFETY: plain old data viewed as bytes.
        bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts(&header as *const _ as *const u8, HEADER_BYTES)
        });
        for ip in kernel {
            bytes.extend_from_slice(&ip.to_ne_bytes());
        }
        for &addr in user {
            let frame = UserFrame::new(FrameKind::Native, addr, 0, 0);
            // SAFETY: as above.
            bytes.extend_from_slice(unsafe {
                std::slice::from_raw_parts(&frame as *const _ as *const u8, USER_FRAME_BYTES)
            });
        }
        bytes
    }

    #[test]
    fn parses_what_the_kernel_side_writes() {
        let bytes = encode(
            42,
            "worker",
            &[0xf001, 0xf002],
            &[0x401000, 0x402000, 0x403000],
            UnwindEnd::Complete,
        );
        let view = SampleView::parse(&bytes).expect("parses");
        assert_eq!(view.pid(), 42);
        assert_eq!(comm_to_string(view.thread_name()), "worker");
        assert_eq!(view.kernel_ips().collect::<Vec<_>>(), vec![0xf001, 0xf002]);
        assert_eq!(
            view.user_frames().map(|f| f.addr()).collect::<Vec<_>>(),
            vec![0x401000, 0x402000, 0x403000]
        );
        assert_eq!(view.user_end(), Some(UnwindEnd::Complete));
    }

    #[test]
    fn rejects_truncated_records() {
        let bytes = encode(1, "x", &[1], &[2, 3], UnwindEnd::Complete);
        assert!(matches!(
            SampleView::parse(&bytes[..10]),
            Err(RecordError::ShortHeader { len: 10 })
        ));
        assert!(matches!(
            SampleView::parse(&bytes[..bytes.len() - 1]),
            Err(RecordError::ShortFrames {
                kernel: 1,
                user: 2,
                ..
            })
        ));
    }
}
