//! Who is at the other end of a TCP connection to the metrics endpoint, when it is a local
//! socket: the kernel's socket diagnostics (`NETLINK_SOCK_DIAG`, an `inet_diag` request for the
//! one socket of a 4-tuple) give the uid that created the peer's socket. TCP itself says
//! nothing of its peer (no `SO_PEERCRED`), and `/proc/net/tcp` would mean reading every socket
//! of the host per connection.
//!
//! The uid is the kernel's, mapped to our user namespace: a process cannot choose it (a user
//! namespace's root is its creator's uid here). A lookup is one request and one reply on a
//! non-blocking socket: the kernel answers within the send, so an empty queue means no answer.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};

/// `SOCK_DIAG_BY_FAMILY` of `linux/sock_diag.h` (not in the libc crate).
const SOCK_DIAG_BY_FAMILY: u16 = 20;
/// `INET_DIAG_NOCOOKIE`: any socket of the 4-tuple.
const NO_COOKIE: [u8; 8] = [0xff; 8];
/// `nlmsghdr` (16 bytes) + `inet_diag_req_v2` (56 bytes).
const REQUEST_LEN: usize = 72;
/// `nlmsghdr` + `inet_diag_msg` up to `idiag_inode` (72 bytes); attributes may follow.
const REPLY_MIN_LEN: usize = 88;

/// A netlink socket for socket diagnostics, kept open for the endpoint's life (one descriptor).
pub struct SockDiag {
    socket: OwnedFd,
    sequence: u32,
    /// Whether a reply may be left in the queue (the last one was not read).
    unread: bool,
}

impl SockDiag {
    pub fn open() -> io::Result<Self> {
        // SAFETY: socket(2) has no memory preconditions; the descriptor is owned below.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_DGRAM | libc::SOCK_CLOEXEC | libc::SOCK_NONBLOCK,
                libc::NETLINK_SOCK_DIAG,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
            // SAFETY: a fresh descriptor nothing else owns.
            socket: unsafe { OwnedFd::from_raw_fd(fd) },
            sequence: 0,
            unread: false,
        })
    }

    /// The uid owning the TCP socket at `peer` connected to `local` (our end), if that socket
    /// is in this network namespace and still held open by a process. `None` for remote peers,
    /// peers in other network namespaces, and sockets their process already closed (the kernel
    /// reports those, timewait ones included, with uid 0: never taken as root).
    pub fn peer_uid(&mut self, local: SocketAddr, peer: SocketAddr) -> Option<u32> {
        let (local_ip, peer_ip) = (local.ip().to_canonical(), peer.ip().to_canonical());
        let family = match (local_ip, peer_ip) {
            (IpAddr::V4(_), IpAddr::V4(_)) => libc::AF_INET,
            (IpAddr::V6(_), IpAddr::V6(_)) => libc::AF_INET6,
            _ => return None,
        };
        if self.unread {
            self.drain();
        }
        self.sequence = self.sequence.wrapping_add(1);
        // The socket looked up is the one whose own address is the peer's.
        let request = request(
            self.sequence,
            family as u8,
            (peer_ip, peer.port()),
            (local_ip, local.port()),
        );
        // SAFETY: all zeros is a valid sockaddr_nl: pid 0, the kernel; no groups.
        let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        kernel.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        // SAFETY: the buffer and address are valid for the lengths given.
        let sent = unsafe {
            libc::sendto(
                self.socket.as_raw_fd(),
                request.as_ptr().cast(),
                request.len(),
                libc::MSG_DONTWAIT,
                (&kernel as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        if sent != request.len() as isize {
            return None;
        }
        let mut reply = [0u8; 1024];
        self.unread = true;
        let len = self.receive(&mut reply)?;
        let uid = parse_reply(&reply[..len], self.sequence, peer.port(), local.port());
        // Another reply than ours (a late one) leaves ours queued.
        self.unread = uid.is_none() && len >= 12 && reply[8..12] != self.sequence.to_ne_bytes();
        uid
    }

    /// One datagram, without waiting; its length (truncated to the buffer).
    fn receive(&self, buffer: &mut [u8]) -> Option<usize> {
        // SAFETY: the buffer is valid for its length.
        let len = unsafe {
            libc::recv(
                self.socket.as_raw_fd(),
                buffer.as_mut_ptr().cast(),
                buffer.len(),
                libc::MSG_DONTWAIT,
            )
        };
        usize::try_from(len).ok().map(|len| len.min(buffer.len()))
    }

    /// Replies to earlier requests still queued (none, as a rule): bounded, so a socket that
    /// keeps delivering cannot hold the accept loop.
    fn drain(&self) {
        let mut scratch = [0u8; 256];
        for _ in 0..16 {
            if self.receive(&mut scratch).is_none() {
                return;
            }
        }
    }
}

fn put_address(out: &mut [u8], ip: IpAddr) {
    match ip {
        IpAddr::V4(ip) => out[..4].copy_from_slice(&ip.octets()),
        IpAddr::V6(ip) => out[..16].copy_from_slice(&ip.octets()),
    }
}

/// `SOCK_DIAG_BY_FAMILY` for the TCP socket whose own address is `source` and whose peer's is
/// `destination` (`inet_diag_sockid` holds addresses and ports in network order).
fn request(
    sequence: u32,
    family: u8,
    source: (IpAddr, u16),
    destination: (IpAddr, u16),
) -> [u8; REQUEST_LEN] {
    let mut r = [0u8; REQUEST_LEN];
    r[0..4].copy_from_slice(&(REQUEST_LEN as u32).to_ne_bytes());
    r[4..6].copy_from_slice(&SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    r[6..8].copy_from_slice(&(libc::NLM_F_REQUEST as u16).to_ne_bytes());
    r[8..12].copy_from_slice(&sequence.to_ne_bytes());
    // nlmsg_pid 0: the kernel.
    r[16] = family;
    r[17] = libc::IPPROTO_TCP as u8;
    // idiag_ext, pad: no attributes wanted. idiag_states: any state.
    r[20..24].copy_from_slice(&u32::MAX.to_ne_bytes());
    r[24..26].copy_from_slice(&source.1.to_be_bytes());
    r[26..28].copy_from_slice(&destination.1.to_be_bytes());
    put_address(&mut r[28..44], source.0);
    put_address(&mut r[44..60], destination.0);
    // idiag_if 0: any interface.
    r[64..72].copy_from_slice(&NO_COOKIE);
    r
}

/// The uid of the reply to request `sequence`, if it describes a socket with ports
/// `source_port` -> `destination_port` that a process holds open (`idiag_inode` not 0).
fn parse_reply(
    reply: &[u8],
    sequence: u32,
    source_port: u16,
    destination_port: u16,
) -> Option<u32> {
    let u16_at = |at: usize| u16::from_ne_bytes([reply[at], reply[at + 1]]);
    let u32_at = |at: usize| u32::from_ne_bytes(reply[at..at + 4].try_into().expect("4 bytes"));
    if reply.len() < REPLY_MIN_LEN
        || u16_at(4) != SOCK_DIAG_BY_FAMILY
        || u32_at(8) != sequence
        || u16::from_be_bytes([reply[20], reply[21]]) != source_port
        || u16::from_be_bytes([reply[22], reply[23]]) != destination_port
    {
        // Also NLMSG_ERROR (ENOENT: no such socket here), shorter than REPLY_MIN_LEN.
        return None;
    }
    let (uid, inode) = (u32_at(80), u32_at(84));
    (inode != 0).then_some(uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};
    use std::os::unix::process::CommandExt as _;

    fn own_uid() -> u32 {
        // SAFETY: geteuid cannot fail.
        unsafe { libc::geteuid() }
    }

    #[test]
    fn a_local_peer_is_its_creators_uid() {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let client = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (server, peer) = listener.accept().expect("accept");
        let mut diag = SockDiag::open().expect("a sock_diag socket");
        let local = server.local_addr().expect("local");
        assert_eq!(diag.peer_uid(local, peer), Some(own_uid()));
        // Asked the other way round, it is our own accepted socket: the same uid; a port
        // nobody uses is no socket.
        assert_eq!(diag.peer_uid(peer, local), Some(own_uid()));
        let nobody = SocketAddr::new(peer.ip(), 1);
        assert_eq!(diag.peer_uid(local, nobody), None);
        // Once the peer closed and its socket is orphaned, it is nobody's.
        drop(client);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(diag.peer_uid(local, peer), None);
    }

    #[test]
    fn an_ipv6_peer_and_another_users_peer() {
        let Ok(listener) = TcpListener::bind("[::1]:0") else {
            crate::test_skip::unless_skipped("ipv6", "no IPv6 loopback here");
            return;
        };
        let _client = TcpStream::connect(listener.local_addr().expect("address")).expect("connect");
        let (server, peer) = listener.accept().expect("accept");
        let mut diag = SockDiag::open().expect("a sock_diag socket");
        let local = server.local_addr().expect("local");
        assert_eq!(diag.peer_uid(local, peer), Some(own_uid()));

        // Another uid's socket (root only: the test needs to change user).
        if own_uid() != 0 {
            return;
        }
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("address").port().to_string();
        // bash's /dev/tcp: a client socket created by uid 65534 that stays open a while.
        let mut child = std::process::Command::new("bash")
            .args(["-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{port}; sleep 5")])
            .uid(65534)
            .gid(65534)
            .spawn()
            .expect("bash");
        let (server, peer) = listener.accept().expect("accept");
        let uid = diag.peer_uid(server.local_addr().expect("local"), peer);
        let _ = child.kill();
        let _ = child.wait();
        assert_eq!(uid, Some(65534));
    }
}
