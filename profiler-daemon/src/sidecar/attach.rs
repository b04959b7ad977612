//! HotSpot dynamic attach from outside the JVM, also into other mount namespaces.
//!
//! The protocol (JDK 9 to 25 on Linux; facts in hotspot-notes.md 5.2): the JVM listens on
//! `/tmp/.java_pid<nspid>` in its own namespace, but only after it saw a trigger file
//! `.attach_pid<nspid>` (owned by its euid) and a SIGQUIT. It accepts a peer only with its own
//! euid/egid (`SO_PEERCRED`), so the connection is made from a forked child that switched to the
//! JVM's credentials; the daemon never changes its own. The request is `1\0load\0PATH\0true\0
//! OPTIONS\0`; the path is resolved inside the JVM's namespace, so the agent is copied there
//! first when the JVM has its own mount namespace.

use std::ffi::CString;
use std::fs::File;
use std::io::Write as _;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, OpenOptionsExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

/// How long the JVM may take to start its listener after SIGQUIT (jattach waits about as long).
const LISTENER_WAIT: Duration = Duration::from_secs(6);
/// How long a `load` may take, connect to reply.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest reply kept (`load` replies are a line or two).
const MAX_REPLY: usize = 64 * 1024;

/// A JVM as seen from the daemon.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub pid: u32,
    /// Its pid in its own pid namespace: the JVM names its files after this one.
    pub nspid: u32,
    pub euid: u32,
    pub egid: u32,
}

impl Target {
    pub fn of(pid: u32) -> Result<Self> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("process {pid} not found"))?;
        Self::parse_status(pid, &status)
    }

    fn parse_status(pid: u32, status: &str) -> Result<Self> {
        let field = |name: &str| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(name))
                .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
                .ok_or_else(|| anyhow!("/proc/{pid}/status has no {name}"))
        };
        let number = |s: Option<&&str>, what: &str| -> Result<u32> {
            s.and_then(|s| s.parse().ok())
                .ok_or_else(|| anyhow!("/proc/{pid}/status: bad {what}"))
        };
        // NSpid lists the pid from the outermost namespace in; kernels before 4.1 lack it.
        let nspid = match field("NSpid:") {
            Ok(ids) => number(ids.last(), "NSpid")?,
            Err(_) => pid,
        };
        // Uid:/Gid: are real, effective, saved, filesystem.
        let euid = number(field("Uid:")?.get(1), "Uid")?;
        let egid = number(field("Gid:")?.get(1), "Gid")?;
        Ok(Self {
            pid,
            nspid,
            euid,
            egid,
        })
    }

    /// The JVM's root directory as the daemon reaches it.
    pub fn root(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/root", self.pid))
    }

    /// A path inside the JVM's mount namespace, as the daemon reaches it.
    pub fn host_path(&self, inside: &Path) -> PathBuf {
        self.root().join(inside.strip_prefix("/").unwrap_or(inside))
    }

    fn socket(&self) -> PathBuf {
        self.host_path(Path::new(&format!("/tmp/.java_pid{}", self.nspid)))
    }

    /// True if the JVM lives in another mount namespace than the daemon.
    pub fn other_mount_namespace(&self) -> bool {
        let theirs = std::fs::read_link(format!("/proc/{}/ns/mnt", self.pid));
        let ours = std::fs::read_link("/proc/self/ns/mnt");
        match (theirs, ours) {
            (Ok(theirs), Ok(ours)) => theirs != ours,
            // Cannot tell: copying is always correct, only slower.
            _ => true,
        }
    }
}

/// A successful attach.
#[derive(Debug)]
pub struct Attached {
    /// The agent's path inside the JVM's namespace.
    pub agent_path: PathBuf,
    /// True if the listener had to be started (trigger file and SIGQUIT).
    pub started_listener: bool,
    /// From the first look at the socket to the JVM's reply.
    pub elapsed: Duration,
    /// The sidecar's records file, as the daemon reaches it.
    pub records: PathBuf,
}

/// Loads `agent` into the JVM `pid` with `options`.
pub fn attach(pid: u32, agent: &Path, options: &str) -> Result<Attached> {
    let started = Instant::now();
    let target = Target::of(pid)?;
    let agent_path = place_agent(&target, agent)?;
    let started_listener = ensure_listener(&target)?;
    let request = load_request(&agent_path, options)?;
    let reply = exchange_as(&target, &target.socket(), &request)?;
    parse_load_reply(&reply).map_err(|message| {
        anyhow!(
            "JVM {pid} refused to load {}: {message}",
            agent_path.display()
        )
    })?;
    Ok(Attached {
        records: target.host_path(
            &profiler_jvmti_records::channel::records_dir(target.nspid)
                .join(profiler_jvmti_records::channel::RECORDS_FILE),
        ),
        agent_path,
        started_listener,
        elapsed: started.elapsed(),
    })
}

/// Makes the agent reachable from inside the JVM's mount namespace: the same path when it shares
/// ours, else a copy in its /tmp named after our version and the file's content.
fn place_agent(target: &Target, agent: &Path) -> Result<PathBuf> {
    let agent = agent
        .canonicalize()
        .with_context(|| format!("agent library {}", agent.display()))?;
    if !target.other_mount_namespace() {
        return Ok(agent);
    }
    let bytes = std::fs::read(&agent).with_context(|| format!("reading {}", agent.display()))?;
    let name = format!(
        "jvm-profiler-agent-{}-{:016x}.so",
        env!("CARGO_PKG_VERSION"),
        fnv1a(&bytes)
    );
    let inside = Path::new("/tmp").join(&name);
    let host = target.host_path(&inside);
    if std::fs::metadata(&host).is_ok_and(|m| m.len() == bytes.len() as u64) {
        return Ok(inside);
    }
    // Write beside, then rename: a JVM that mapped an earlier copy keeps its inode.
    let partial =
        target.host_path(&Path::new("/tmp").join(format!(".{name}.{}", std::process::id())));
    let write = || -> std::io::Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o644)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&partial)?;
        file.write_all(&bytes)?;
        file.set_permissions(std::fs::Permissions::from_mode(0o644))?;
        std::fs::rename(&partial, &host)
    };
    write().map_err(|err| {
        let _ = std::fs::remove_file(&partial);
        anyhow!(
            "copying the agent into the JVM's namespace ({}): {err}",
            host.display()
        )
    })?;
    Ok(inside)
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, b| {
        (hash ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn is_socket(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

/// Starts the JVM's attach listener unless it runs. Returns true if it had to be started.
fn ensure_listener(target: &Target) -> Result<bool> {
    let socket = target.socket();
    if is_socket(&socket) {
        return Ok(false);
    }
    // SIGQUIT kills a JVM that does not handle it yet (still starting) or at all (-Xrs).
    wait_for_sigquit_handler(target.pid)?;
    let trigger_name = format!(".attach_pid{}", target.nspid);
    // HotSpot looks in its working directory first, then in /tmp.
    let candidates = [
        PathBuf::from(format!("/proc/{}/cwd", target.pid)).join(&trigger_name),
        target.host_path(&Path::new("/tmp").join(&trigger_name)),
    ];
    let trigger = candidates
        .iter()
        .find(|path| create_trigger(path, target).is_ok())
        .ok_or_else(|| {
            anyhow!(
                "cannot create the attach trigger file {} (nor in the JVM's /tmp)",
                candidates[0].display()
            )
        })?;
    // SAFETY: plain kill(2) on the host pid.
    let rc = unsafe { libc::kill(target.pid as libc::pid_t, libc::SIGQUIT) };
    let signalled = if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    };
    let deadline = Instant::now() + LISTENER_WAIT;
    let mut pause = Duration::from_millis(10);
    while signalled.is_ok() && !is_socket(&socket) && Instant::now() < deadline {
        std::thread::sleep(pause);
        pause = (pause * 2).min(Duration::from_millis(200));
    }
    let _ = std::fs::remove_file(trigger);
    if let Err(err) = signalled {
        bail!("cannot signal JVM {}: {err}", target.pid);
    }
    if !is_socket(&socket) {
        bail!(
            "attach mechanism disabled or not responding: JVM {} opened no /tmp/.java_pid{} within \
             {} s of SIGQUIT (started with -XX:+DisableAttachMechanism?)",
            target.pid,
            target.nspid,
            LISTENER_WAIT.as_secs()
        );
    }
    Ok(true)
}

/// Waits (briefly) until `pid` catches SIGQUIT, per the `SigCgt` mask of /proc/PID/status.
fn wait_for_sigquit_handler(pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .with_context(|| format!("process {pid} exited"))?;
        if catches_sigquit(&status) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "JVM {pid} does not handle SIGQUIT (started with -Xrs, or still starting): \
                 its attach listener cannot be started safely"
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn catches_sigquit(status: &str) -> bool {
    status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGQUIT - 1)) != 0)
}

/// HotSpot honours the trigger only if the JVM's euid owns it.
fn create_trigger(path: &Path, target: &Target) -> std::io::Result<()> {
    let file = File::create(path)?;
    if let Err(err) = std::os::unix::fs::fchown(&file, Some(target.euid), Some(target.egid)) {
        let _ = std::fs::remove_file(path);
        return Err(err);
    }
    Ok(())
}

fn load_request(agent: &Path, options: &str) -> Result<Vec<u8>> {
    let path = agent.as_os_str().as_bytes();
    if path.contains(&0) || options.as_bytes().contains(&0) {
        bail!("agent path and options must not contain NUL");
    }
    let mut request = b"1\0load\0".to_vec();
    request.extend_from_slice(path);
    request.extend_from_slice(b"\0true\0");
    request.extend_from_slice(options.as_bytes());
    request.push(0);
    Ok(request)
}

/// Reads a `load` reply: `Ok` for a loaded agent, else the JVM's message.
///
/// JDK 9-20 answer `0\nreturn code: N\n` when the agent ran (N is its `Agent_OnAttach` result)
/// and `-1\n<message>` when loading failed; JDK 21+ answer `0\n<message>` for failures too, so
/// the text decides.
pub fn parse_load_reply(reply: &[u8]) -> std::result::Result<(), String> {
    let text = String::from_utf8_lossy(reply);
    let (code, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let rest = rest.trim();
    match code.trim().parse::<i32>() {
        Ok(0) => match rest.strip_prefix("return code:").map(str::trim) {
            Some("0") => Ok(()),
            Some(rc) => Err(format!("the agent's Agent_OnAttach returned {rc}")),
            None if rest.is_empty() => Err("empty reply".into()),
            None => Err(rest.to_string()),
        },
        Ok(code) if rest.is_empty() => Err(format!("error {code}")),
        Ok(_) => Err(rest.to_string()),
        Err(_) => Err(format!("unexpected reply {text:?}")),
    }
}

/// Sends `request` on the JVM's attach socket as the JVM's euid/egid and returns the reply.
///
/// A forked child does the exchange so the daemon's credentials never change. Between fork and
/// `_exit` the child only makes system calls on memory prepared before the fork (the daemon is
/// multi-threaded: allocating or locking there could deadlock).
fn exchange_as(target: &Target, socket: &Path, request: &[u8]) -> Result<Vec<u8>> {
    let path = CString::new(socket.as_os_str().as_bytes())?;
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_bytes_with_nul();
    if bytes.len() > addr.sun_path.len() {
        bail!("socket path {} is too long", socket.display());
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = *src as libc::c_char;
    }
    let mut reply = vec![0u8; MAX_REPLY];
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    // SAFETY: the child runs only async-signal-safe code (see `child_exchange`).
    let child = unsafe { libc::fork() };
    if child < 0 {
        let err = std::io::Error::last_os_error();
        // SAFETY: closing our own descriptors.
        unsafe {
            libc::close(read_end);
            libc::close(write_end);
        }
        bail!("fork: {err}");
    }
    if child == 0 {
        // SAFETY: in the child, with everything prepared above.
        unsafe {
            libc::close(read_end);
            let status = child_exchange(target, &addr, request, &mut reply, write_end);
            libc::_exit(status);
        }
    }
    // SAFETY: the parent's copy of the write end.
    unsafe { libc::close(write_end) };
    // SAFETY: read_end is ours; File takes ownership and closes it.
    let mut pipe = unsafe { <File as std::os::fd::FromRawFd>::from_raw_fd(read_end) };
    let result = read_with_deadline(&mut pipe, Instant::now() + REQUEST_TIMEOUT);
    if result.is_err() {
        // SAFETY: our child.
        unsafe { libc::kill(child, libc::SIGKILL) };
    }
    let mut status = 0;
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(child, &mut status, 0) };
    let output = result?;
    let code = if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        -1
    };
    match code {
        0 => Ok(output),
        _ => {
            let errno = output
                .get(..4)
                .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .unwrap_or(0);
            let err = std::io::Error::from_raw_os_error(errno);
            Err(match code {
                STEP_CREDENTIALS => anyhow!(
                    "switching to the JVM's uid {} / gid {}: {err}",
                    target.euid,
                    target.egid
                ),
                STEP_CONNECT => anyhow!(
                    "connecting to {}: {err} (attach mechanism not responding)",
                    socket.display()
                ),
                STEP_SEND => anyhow!("sending the load request: {err}"),
                STEP_RECEIVE => anyhow!("no reply from the JVM: {err}"),
                _ => anyhow!("attach helper failed (status {status:#x})"),
            })
        }
    }
}

const STEP_CREDENTIALS: i32 = 10;
const STEP_CONNECT: i32 = 11;
const STEP_SEND: i32 = 12;
const STEP_RECEIVE: i32 = 13;

/// The forked child: switch credentials, connect, send, receive, write the reply (or the errno)
/// to `out`. Returns the exit status: 0 or the failed step.
///
/// # Safety
/// Only to be called in a freshly forked child; uses raw system calls only.
unsafe fn child_exchange(
    target: &Target,
    addr: &libc::sockaddr_un,
    request: &[u8],
    reply: &mut [u8],
    out: libc::c_int,
) -> libc::c_int {
    let fail = |step: libc::c_int| -> libc::c_int {
        // SAFETY: errno location of this thread; write to our pipe.
        unsafe {
            let errno = (*libc::__errno_location()).to_le_bytes();
            libc::write(out, errno.as_ptr().cast(), errno.len());
        }
        step
    };
    // SAFETY: raw syscalls affect only this (single-threaded) child.
    unsafe {
        if target.euid != libc::geteuid() || target.egid != libc::getegid() {
            let (uid, gid) = (target.euid as libc::c_long, target.egid as libc::c_long);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return fail(STEP_CREDENTIALS);
            }
        }
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return fail(STEP_CONNECT);
        }
        let timeout = libc::timeval {
            tv_sec: REQUEST_TIMEOUT.as_secs() as libc::time_t,
            tv_usec: 0,
        };
        for option in [libc::SO_RCVTIMEO, libc::SO_SNDTIMEO] {
            libc::setsockopt(
                fd,
                libc::SOL_SOCKET,
                option,
                (&timeout as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            );
        }
        if libc::connect(
            fd,
            (addr as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ) != 0
        {
            return fail(STEP_CONNECT);
        }
        let mut sent = 0;
        while sent < request.len() {
            let n = libc::write(fd, request[sent..].as_ptr().cast(), request.len() - sent);
            if n <= 0 {
                return fail(STEP_SEND);
            }
            sent += n as usize;
        }
        // The JVM closes the connection after its reply.
        let mut received = 0;
        while received < reply.len() {
            let n = libc::read(
                fd,
                reply[received..].as_mut_ptr().cast(),
                reply.len() - received,
            );
            if n < 0 {
                return fail(STEP_RECEIVE);
            }
            if n == 0 {
                break;
            }
            received += n as usize;
        }
        let mut written = 0;
        while written < received {
            let n = libc::write(out, reply[written..].as_ptr().cast(), received - written);
            if n <= 0 {
                break;
            }
            written += n as usize;
        }
        0
    }
}

/// Reads `pipe` to its end, giving up at `deadline`.
fn read_with_deadline(pipe: &mut File, deadline: Instant) -> Result<Vec<u8>> {
    use std::io::Read as _;
    use std::os::fd::AsRawFd as _;
    let mut output = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            bail!(
                "the JVM did not answer within {} s",
                REQUEST_TIMEOUT.as_secs()
            );
        }
        let mut poll = libc::pollfd {
            fd: pipe.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut poll, 1, left.as_millis().min(1000) as libc::c_int) };
        if rc < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err.into());
        }
        if rc == 0 {
            continue;
        }
        let n = pipe.read(&mut chunk)?;
        if n == 0 {
            return Ok(output);
        }
        output.extend_from_slice(&chunk[..n.min(MAX_REPLY.saturating_sub(output.len()))]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_replies_of_every_jdk_are_told_apart() {
        // JDK 9-25 success.
        assert_eq!(parse_load_reply(b"0\nreturn code: 0\n"), Ok(()));
        // The agent ran but refused.
        assert_eq!(
            parse_load_reply(b"0\nreturn code: 1\n"),
            Err("the agent's Agent_OnAttach returned 1".into())
        );
        // JDK 9-20 failure.
        assert_eq!(
            parse_load_reply(b"-1\nFailed to load agent library\n"),
            Err("Failed to load agent library".into())
        );
        // JDK 21+ failure: code 0, the message says it.
        assert_eq!(
            parse_load_reply(b"0\nAgent_OnAttach failed\n"),
            Err("Agent_OnAttach failed".into())
        );
        assert!(parse_load_reply(b"").is_err());
        assert!(parse_load_reply(b"garbage").is_err());
        assert_eq!(parse_load_reply(b"101\n"), Err("error 101".into()));
    }

    #[test]
    fn the_request_has_the_version_command_and_three_arguments() {
        let request = load_request(Path::new("/tmp/a.so"), "x=1").expect("request");
        assert_eq!(request, b"1\0load\0/tmp/a.so\0true\0x=1\0");
        assert!(load_request(Path::new("/tmp/a\0.so"), "").is_err());
    }

    #[test]
    fn sigquit_handling_is_read_from_the_caught_mask() {
        assert!(catches_sigquit("SigIgn:\t0\nSigCgt:\t0000000000000004\n"));
        assert!(!catches_sigquit("SigCgt:\t0000000000000002\n"));
        assert!(!catches_sigquit("Name:\tjava\n"));
    }

    #[test]
    fn status_gives_nspid_and_effective_ids() {
        let status = "Name:\tjava\nUid:\t1000\t1001\t1001\t1001\nGid:\t50\t51\t51\t51\n\
                      NSpid:\t4242\t7\n";
        let target = Target::parse_status(4242, status).expect("parses");
        assert_eq!(
            target,
            Target {
                pid: 4242,
                nspid: 7,
                euid: 1001,
                egid: 51
            }
        );
        assert_eq!(
            target.socket(),
            PathBuf::from("/proc/4242/root/tmp/.java_pid7")
        );
    }
}
