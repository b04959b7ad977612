//! HotSpot dynamic attach from outside the JVM, also into other mount namespaces.
//!
//! The protocol (JDK 9 to 25 on Linux; see docs/hotspot-attach.md): the JVM listens on
//! `/tmp/.java_pid<nspid>` in its own namespace, but only after it saw a trigger file
//! `.attach_pid<nspid>` (owned by its euid, in its working directory or /tmp) and a SIGQUIT. It
//! accepts a peer only with its own euid/egid (`SO_PEERCRED`). The request is
//! `1\0load\0PATH\0true\0OPTIONS\0`; the path is resolved inside the JVM's namespace, so the
//! agent is copied there first when the JVM has its own mount namespace. A socket that refuses
//! connections was left by a dead process with the same pid: the listener is started anyway
//! (and one of another user, which the JVM could not replace in a sticky `/tmp`, is removed
//! first).
//!
//! Everything in the JVM's directories belongs to the JVM's user, who may plant symlinks, FIFOs
//! or mounts there, and its mount namespace may put any directory at its `/tmp` (a bind mount
//! of the host's `/etc`). So the daemon, which runs as root, never creates, opens or removes a
//! file there by path. It resolves the two directories it needs (the JVM's working directory and
//! its `/tmp`) to descriptors, confined to the JVM's root, and opens the agent library (its own
//! file); a forked child then closes every other descriptor, switches to the JVM's uid and gid,
//! drops every capability, and only then writes the agent copy (another mount namespace only:
//! a fresh name, `O_CREAT|O_EXCL|O_NOFOLLOW`, in a `/tmp` where other users cannot replace it),
//! creates the trigger (the same flags), signals the JVM, waits for its socket, connects and
//! exchanges the request, and removes the copy: whatever the user planted, the child can do no
//! more than the user could, and a `/tmp` the user cannot write gets no copy.
//!
//! A socket at the JVM's name may also be someone else's: another user can bind
//! `/tmp/.java_pid<pid>` before the JVM does, and answer "loaded". As the JDK's own attach
//! client does, the child accepts only a socket file owned by the JVM's euid, and then only a
//! peer whose credentials (`SO_PEERCRED`) are the JVM's own pid and uid; anything else gets no
//! request ([`NotTheJvmsSocket`], which the daemon retries later). Replies are shown bounded
//! and printable in messages and logs.
//!
//! Written here rather than taken from a crate: the attach crates we know of connect as the
//! caller, in the caller's namespace, and follow paths; none creates the trigger from
//! descriptors in a child that has already given up root, which is what makes attaching safe
//! against the JVM's own user.

use std::cell::Cell;
use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context as _, Result};

use crate::untrusted;

/// How long the JVM may take to start its listener after SIGQUIT (jattach waits about as long).
const LISTENER_WAIT: Duration = Duration::from_secs(6);
/// How long a `load` may take, connect to reply.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest reply kept (`load` replies are a line or two).
const MAX_REPLY: usize = 64 * 1024;
/// Longest part of a reply put in a message or a log line.
const MAX_SHOWN_REPLY: usize = 256;
/// Largest agent library copied into a JVM's namespace.
const MAX_AGENT_BYTES: u64 = 256 << 20;

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
        let status = untrusted::read_proc_text(pid, "status", untrusted::MAX_PROC_FILE)
            .with_context(|| format!("process {pid} not found"))?;
        Self::parse_status(pid, &status)
    }

    fn parse_status(pid: u32, status: &str) -> Result<Self> {
        let status = crate::proc_status::parse(status)
            .ok_or_else(|| anyhow!("/proc/{pid}/status: unreadable"))?;
        // NSpid lists the pid from the outermost namespace in; kernels before 4.1 lack it.
        let nspid = match status.nspid.as_deref() {
            Some([.., inner]) => {
                u32::try_from(*inner).map_err(|_| anyhow!("/proc/{pid}/status: bad NSpid"))?
            }
            _ => pid,
        };
        Ok(Self {
            pid,
            nspid,
            euid: status.euid,
            egid: status.egid,
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

    /// The attach socket's name in the JVM's /tmp.
    fn socket_name(&self) -> String {
        format!(".java_pid{}", self.nspid)
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

/// The socket at the JVM's attach path is not the JVM's: a file of another user, or a listener
/// that is another process. No request was sent; it may be gone later.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct NotTheJvmsSocket(String);

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
    let tmp = untrusted::open_tmp_dir(pid)
        .map_err(|refused| anyhow!("the JVM's /tmp cannot be used: {refused}"))?;
    // The working directory is only a preferred place for the trigger.
    let cwd = untrusted::open_cwd_dir(pid).ok();
    let placement = place_agent(&target, &tmp, agent)?;
    if remove_stale_foreign_socket(&tmp, &target) {
        tracing::info!(
            pid,
            socket = format!("/tmp/{}", target.socket_name()),
            "removed a stale attach socket of another user (a dead process with the same pid left it)"
        );
    }
    // SIGQUIT kills a JVM that does not handle it yet (still starting) or at all (-Xrs); the
    // child only signals when the socket is missing, but it cannot read /proc as the JVM's user
    // in every setup, so the daemon checks first.
    // A socket that is there may be a stale one a dead process with this pid left: the child
    // then starts the listener too, if the JVM handles SIGQUIT now.
    let may_signal = if socket_exists(&tmp, &target.socket_name()) {
        untrusted::read_proc_text(pid, "status", untrusted::MAX_PROC_FILE)
            .is_ok_and(|status| catches_sigquit(&status))
    } else {
        wait_for_sigquit_handler(pid)?;
        true
    };
    let request = load_request(&placement.inside, options)?;
    let (started_listener, reply) = exchange_as(
        &target,
        &tmp,
        cwd.as_ref(),
        &placement,
        &request,
        may_signal,
    )?;
    parse_load_reply(&reply).map_err(|message| {
        anyhow!(
            "JVM {pid} refused to load {}: {message}",
            placement.inside.display()
        )
    })?;
    Ok(Attached {
        records: target.host_path(
            &profiler_jvmti_records::channel::records_dir(target.nspid)
                .join(profiler_jvmti_records::channel::RECORDS_FILE),
        ),
        agent_path: placement.inside,
        started_listener,
        elapsed: started.elapsed(),
    })
}

/// The agent as the JVM reaches it.
struct Placement {
    /// Its path inside the JVM's namespace.
    inside: PathBuf,
    /// The copy the attach child makes in the JVM's /tmp, if the JVM cannot reach our path.
    copy: Option<AgentCopy>,
}

/// What the attach child needs to copy the agent: the library, open, and the copy's name.
struct AgentCopy {
    source: File,
    name: CString,
}

/// Where the JVM will find the agent: the same path when it shares our mount namespace, else a
/// fresh copy in its /tmp that the attach child will make (the library is opened and checked
/// here, and the JVM's /tmp must be one where other users cannot replace the copy).
fn place_agent(target: &Target, tmp: &OwnedFd, agent: &Path) -> Result<Placement> {
    let agent = agent
        .canonicalize()
        .with_context(|| format!("agent library {}", agent.display()))?;
    if !target.other_mount_namespace() {
        return Ok(Placement {
            inside: agent,
            copy: None,
        });
    }
    let source = File::open(&agent).with_context(|| format!("reading {}", agent.display()))?;
    untrusted::check_regular(
        &source,
        untrusted::Expect {
            owner: None,
            max_size: MAX_AGENT_BYTES,
        },
    )
    .map_err(|refused| anyhow!("agent library {}: {refused}", agent.display()))?;
    refuse_open_tmp(tmp)?;
    let name = format!(
        ".jvm-profiler-agent-{}-{}.so",
        std::process::id(),
        unique_suffix()
    );
    Ok(Placement {
        inside: Path::new("/tmp").join(&name),
        copy: Some(AgentCopy {
            source,
            name: CString::new(name)?,
        }),
    })
}

/// Refuses a /tmp where users other than the JVM's could replace the copy: writable by group or
/// others without the sticky bit (which keeps them from renaming over or removing files they do
/// not own).
fn refuse_open_tmp(tmp: &OwnedFd) -> Result<()> {
    // SAFETY: all-zero is a valid stat buffer; fstat on our descriptor.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    if unsafe { libc::fstat(tmp.as_raw_fd(), &mut stat) } != 0 {
        bail!("the JVM's /tmp: {}", std::io::Error::last_os_error());
    }
    let writable_by_others = stat.st_mode & 0o022 != 0;
    if writable_by_others && stat.st_mode & libc::S_ISVTX == 0 {
        bail!(
            "the JVM's /tmp is writable by others and not sticky (mode {:o}): the agent copy could \
             be replaced there, so it is not placed",
            stat.st_mode & 0o7777
        );
    }
    Ok(())
}

/// A name part no one can predict or have planted before (a collision fails with EEXIST).
fn unique_suffix() -> String {
    let mut bytes = [0u8; 8];
    // SAFETY: getrandom fills our buffer; on failure the clock still makes the name fresh.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), libc::GRND_NONBLOCK) };
    let random = if n == bytes.len() as isize {
        u64::from_le_bytes(bytes)
    } else {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
    };
    format!("{random:016x}")
}

/// True if `name` in the directory `dir` is a socket (not followed if a link).
fn socket_exists(dir: &OwnedFd, name: &str) -> bool {
    // SAFETY: a directory descriptor we own.
    CString::new(name).is_ok_and(|name| unsafe { socket_file(dir.as_raw_fd(), &name) }.is_some())
}

/// The address of the JVM's socket in `tmp`, reached through the directory's descriptor.
fn socket_address(tmp: &OwnedFd, target: &Target) -> Result<libc::sockaddr_un> {
    unix_address(&format!(
        "/proc/self/fd/{}/{}",
        tmp.as_raw_fd(),
        target.socket_name()
    ))
}

/// A Unix socket address for `path`.
fn unix_address(path: &str) -> Result<libc::sockaddr_un> {
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = CString::new(path)?.into_bytes_with_nul();
    if bytes.len() > address.sun_path.len() {
        bail!("socket path too long");
    }
    for (dst, src) in address.sun_path.iter_mut().zip(&bytes) {
        *dst = *src as libc::c_char;
    }
    Ok(address)
}

/// Removes a stale socket of another user at the JVM's attach name; true if it did.
///
/// HotSpot binds its socket as the JVM's user, so one owned by anyone else is never the JVM's
/// listener, and in a sticky `/tmp` the JVM cannot replace it: its listener would never start.
/// Nobody listening on it, a dead process of that user with the same pid left it (a killed JVM
/// does not remove its socket, and pids come round). One that someone listens on stays, and is
/// refused as another user's ([`NotTheJvmsSocket`]). The daemon holds the socket file itself
/// (`O_PATH`, never a link) and connects through that descriptor, so a name swapped meanwhile
/// cannot lead its connection (which sends nothing) elsewhere; it removes the name only if the
/// name still holds that socket.
fn remove_stale_foreign_socket(tmp: &OwnedFd, target: &Target) -> bool {
    let Ok(name) = CString::new(target.socket_name()) else {
        return false;
    };
    // SAFETY: raw calls on our own descriptors; `OwnedFd` closes what we open.
    unsafe {
        let fd = libc::openat(
            tmp.as_raw_fd(),
            name.as_ptr(),
            libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return false;
        }
        let held = OwnedFd::from_raw_fd(fd);
        let mut stat: libc::stat = std::mem::zeroed();
        if libc::fstat(held.as_raw_fd(), &mut stat) != 0
            || stat.st_mode & libc::S_IFMT != libc::S_IFSOCK
            || stat.st_uid == target.euid
        {
            return false;
        }
        let Ok(address) = unix_address(&format!("/proc/self/fd/{}", held.as_raw_fd())) else {
            return false;
        };
        let probe = libc::socket(
            libc::AF_UNIX,
            libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
            0,
        );
        if probe < 0 {
            return false;
        }
        let probe = OwnedFd::from_raw_fd(probe);
        let connected = libc::connect(
            probe.as_raw_fd(),
            (&address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ) == 0;
        let refused = !connected
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ECONNREFUSED);
        let still = socket_file(tmp.as_raw_fd(), &name);
        refused
            && still.is_some_and(|s| s.inode == stat.st_ino && s.owner == stat.st_uid)
            && libc::unlinkat(tmp.as_raw_fd(), name.as_ptr(), 0) == 0
    }
}

/// Waits (briefly) until `pid` catches SIGQUIT, per the `SigCgt` mask of /proc/PID/status.
fn wait_for_sigquit_handler(pid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let status = untrusted::read_proc_text(pid, "status", untrusted::MAX_PROC_FILE)
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
    crate::proc_status::parse(status)
        .is_some_and(|status| status.sigcgt & (1 << (libc::SIGQUIT - 1)) != 0)
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

/// Reads a `load` reply: `Ok` for a loaded agent, else the JVM's message, as [`shown`].
///
/// JDK 9-20 answer `0\nreturn code: N\n` when the agent ran (N is its `Agent_OnAttach` result)
/// and `-1\n<message>` when loading failed; JDK 21+ answer `0\n<message>` for failures too, so
/// the text decides.
pub fn parse_load_reply(reply: &[u8]) -> std::result::Result<(), String> {
    let text = String::from_utf8_lossy(reply);
    let (code, rest) = text.split_once('\n').unwrap_or((&text, ""));
    let rest = rest.trim();
    match code.trim().parse::<i32>() {
        // JDK 9+ writes "return code: N" after the command's status; JDK 8 writes N alone.
        Ok(0) => match rest
            .strip_prefix("return code:")
            .map(str::trim)
            .or_else(|| rest.parse::<i32>().is_ok().then_some(rest))
        {
            Some("0") => Ok(()),
            Some(rc) => Err(format!("the agent's Agent_OnAttach returned {}", shown(rc))),
            None if rest.is_empty() => Err("empty reply".into()),
            None => Err(shown(rest)),
        },
        Ok(code) if rest.is_empty() => Err(format!("error {code}")),
        Ok(_) => Err(shown(rest)),
        Err(_) => Err(format!("unexpected reply \"{}\"", shown(&text))),
    }
}

/// Text of a reply as messages and logs show it: whoever listens on the socket chose it, up to
/// [`MAX_REPLY`] bytes. Its first [`MAX_SHOWN_REPLY`] bytes, control characters replaced
/// (`printable`), and its length when cut.
fn shown(text: &str) -> String {
    let head = crate::printable::printable_within(text, MAX_SHOWN_REPLY);
    if text.len() > MAX_SHOWN_REPLY {
        format!("{head}... ({} bytes)", text.len())
    } else {
        head.into_owned()
    }
}

/// What the child needs, all prepared before `fork` (the child may not allocate).
struct ChildPlan<'a> {
    target: &'a Target,
    /// Descriptors of the JVM's /tmp and working directory (`O_PATH`).
    tmp: RawFd,
    cwd: Option<RawFd>,
    /// The agent copy to make in the JVM's /tmp: the library's descriptor and the copy's name.
    copy: Option<(RawFd, &'a CString)>,
    trigger: CString,
    socket: CString,
    /// The socket reached through our /tmp descriptor: `/proc/self/fd/N/.java_pidNSPID`.
    address: libc::sockaddr_un,
    request: &'a [u8],
    /// The pipe's write end: the child's report.
    out: RawFd,
    /// Whether the JVM handles SIGQUIT (else signalling it would kill it).
    may_signal: bool,
}

/// Makes the agent copy `placement` asks for, starts the JVM's listener if needed and sends
/// `request`, as the JVM's euid/egid, from a forked child; returns whether the listener had to
/// be started, and the JVM's reply.
///
/// The daemon's credentials never change. Between fork and `_exit` the child only makes system
/// calls on memory prepared before the fork (the daemon is multi-threaded: allocating or locking
/// there could deadlock).
fn exchange_as(
    target: &Target,
    tmp: &OwnedFd,
    cwd: Option<&OwnedFd>,
    placement: &Placement,
    request: &[u8],
    may_signal: bool,
) -> Result<(bool, Vec<u8>)> {
    let address = socket_address(tmp, target)?;
    let mut copy_buffer = vec![0u8; 64 * 1024];
    let mut reply = vec![0u8; MAX_REPLY];
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let (read_end, write_end) = (fds[0], fds[1]);
    let plan = ChildPlan {
        target,
        tmp: tmp.as_raw_fd(),
        cwd: cwd.map(|fd| fd.as_raw_fd()),
        copy: placement
            .copy
            .as_ref()
            .map(|copy| (copy.source.as_raw_fd(), &copy.name)),
        trigger: CString::new(format!(".attach_pid{}", target.nspid))?,
        socket: CString::new(target.socket_name())?,
        address,
        request,
        out: write_end,
        may_signal,
    };
    let mut keep = [
        plan.tmp,
        plan.cwd.unwrap_or(plan.tmp),
        plan.copy.map_or(plan.tmp, |(source, _)| source),
        plan.out,
    ];
    keep.sort_unstable();
    // SAFETY: the child runs only async-signal-safe code (see `child_attach`).
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
            close_all_but(&keep);
            let status = child_attach(&plan, &mut copy_buffer, &mut reply);
            libc::_exit(status);
        }
    }
    // SAFETY: the parent's copy of the write end.
    unsafe { libc::close(write_end) };
    // SAFETY: read_end is ours; File takes ownership and closes it.
    let mut pipe = unsafe { File::from_raw_fd(read_end) };
    // The child removes its copy on every path it ends by itself; killed here, it leaves the
    // copy behind: a file of the JVM's own user, under a name nobody reuses.
    let result = read_with_deadline(&mut pipe, Instant::now() + LISTENER_WAIT + REQUEST_TIMEOUT);
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
    if code == 0 {
        let (started, reply) = output
            .split_first()
            .map_or((false, &[][..]), |(s, r)| (*s == 1, r));
        return Ok((started, reply.to_vec()));
    }
    let word = |at: usize| {
        output
            .get(at..at + 4)
            .map_or([0; 4], |b| [b[0], b[1], b[2], b[3]])
    };
    let err = std::io::Error::from_raw_os_error(i32::from_le_bytes(word(0)));
    let detail = u32::from_le_bytes(word(4));
    let socket = format!("/tmp/{}", target.socket_name());
    Err(match code {
        STEP_CREDENTIALS => anyhow!(
            "switching to the JVM's uid {} / gid {}: {err}",
            target.euid,
            target.egid
        ),
        STEP_COPY => anyhow!(
            "cannot copy the agent into the JVM's /tmp as the JVM's user (uid {}): {err}",
            target.euid
        ),
        STEP_TRIGGER => anyhow!(
            "cannot create the attach trigger file .attach_pid{} as the JVM's user, in its \
             working directory nor in its /tmp: {err}",
            target.nspid
        ),
        STEP_SIGNAL => anyhow!("cannot signal JVM {}: {err}", target.pid),
        STEP_LISTENER => anyhow!(
            "attach mechanism disabled or not responding: JVM {} opened no {socket} within {} s \
             of SIGQUIT (started with -XX:+DisableAttachMechanism?)",
            target.pid,
            LISTENER_WAIT.as_secs()
        ),
        STEP_FOREIGN_SOCKET => anyhow::Error::new(NotTheJvmsSocket(format!(
            "{socket} belongs to uid {detail}, not to the JVM's user (uid {}): another user's \
             socket, not connected to",
            target.euid
        ))),
        STEP_FOREIGN_PEER => anyhow::Error::new(NotTheJvmsSocket(format!(
            "the process listening on {socket} is not JVM {}, but {}: no request sent",
            target.pid,
            match detail {
                0 => "a process outside the daemon's pid namespace".to_owned(),
                pid => format!("process {pid}"),
            }
        ))),
        STEP_CONNECT => anyhow!("connecting to {socket}: {err} (attach mechanism not responding)"),
        STEP_SEND => anyhow!("sending the load request: {err}"),
        STEP_RECEIVE => anyhow!("no reply from the JVM: {err}"),
        _ => anyhow!("attach helper failed (status {status:#x})"),
    })
}

/// The step an attach child failed at: its exit status. It reports `errno` and a detail (an
/// owner uid, a peer pid) first.
const STEP_CREDENTIALS: i32 = 10;
const STEP_CONNECT: i32 = 11;
const STEP_SEND: i32 = 12;
const STEP_RECEIVE: i32 = 13;
const STEP_TRIGGER: i32 = 14;
const STEP_SIGNAL: i32 = 15;
const STEP_LISTENER: i32 = 16;
const STEP_COPY: i32 = 17;
const STEP_FOREIGN_SOCKET: i32 = 18;
const STEP_FOREIGN_PEER: i32 = 19;

/// Closes every descriptor but `keep` (sorted): the child must not carry the daemon's BPF maps,
/// export connections or files into the JVM user's hands.
///
/// # Safety
/// Only in a freshly forked child.
unsafe fn close_all_but(keep: &[RawFd]) {
    let mut from: libc::c_uint = 3;
    for &fd in keep {
        let fd = fd as libc::c_uint;
        if fd > from {
            // SAFETY: raw syscall on our own descriptor table.
            unsafe { libc::syscall(libc::SYS_close_range, from, fd - 1, 0) };
        }
        from = from.max(fd + 1);
    }
    // SAFETY: as above.
    unsafe { libc::syscall(libc::SYS_close_range, from, libc::c_uint::MAX, 0) };
}

/// Drops every capability of this (child) process: after switching from root the kernel does it,
/// but a daemon running as a non-root user with ambient capabilities would keep them.
///
/// # Safety
/// Raw syscall; affects only the calling process.
unsafe fn drop_capabilities() -> bool {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: libc::c_int,
    }
    #[repr(C)]
    #[derive(Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    // _LINUX_CAPABILITY_VERSION_3: two 32-bit words of each set.
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let data = [Data {
        effective: 0,
        permitted: 0,
        inheritable: 0,
    }; 2];
    // SAFETY: capset with a valid header and two data words.
    unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut Header, data.as_ptr()) == 0 }
}

/// The forked child: switch credentials, copy the agent if asked, start the listener if
/// needed, connect to the JVM's own socket only, send, receive, remove the copy, and write the
/// report to `plan.out`: a byte saying whether the listener was started, then the reply; or,
/// on failure, `errno` and a detail. Returns the exit status: 0 or the failed step.
///
/// # Safety
/// Only to be called in a freshly forked child; uses raw system calls only.
unsafe fn child_attach(
    plan: &ChildPlan<'_>,
    copy_buffer: &mut [u8],
    reply: &mut [u8],
) -> libc::c_int {
    let copied = Cell::new(false);
    let remove_copy = || {
        if let (true, Some((_, name))) = (copied.get(), plan.copy) {
            // SAFETY: a name in our /tmp descriptor; unlinkat does not follow it.
            unsafe { libc::unlinkat(plan.tmp, name.as_ptr(), 0) };
        }
    };
    let fail = |step: libc::c_int, detail: u32| -> libc::c_int {
        // SAFETY: errno location of this thread; writes to our pipe.
        unsafe {
            let errno = *libc::__errno_location();
            remove_copy();
            let mut report = [0u8; 8];
            report[..4].copy_from_slice(&errno.to_le_bytes());
            report[4..].copy_from_slice(&detail.to_le_bytes());
            write_all(plan.out, &report);
        }
        step
    };
    // SAFETY: raw syscalls affect only this (single-threaded) child.
    unsafe {
        let target = plan.target;
        if target.euid != libc::geteuid() || target.egid != libc::getegid() {
            let (uid, gid) = (target.euid as libc::c_long, target.egid as libc::c_long);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return fail(STEP_CREDENTIALS, 0);
            }
        }
        if !drop_capabilities() {
            return fail(STEP_CREDENTIALS, 0);
        }
        // Written with the JVM's user's rights only: where that user cannot write, no copy.
        if let Some((source, name)) = plan.copy {
            if !write_copy(plan.tmp, name, source, copy_buffer, &copied) {
                return fail(STEP_COPY, 0);
            }
        }
        // A socket already there is the JVM's listener, a stale one a dead process with the
        // same pid left behind (a killed JVM does not remove it), or someone else's. Refused,
        // it is stale, and the listener must be started as if there were none.
        let mut stale = None;
        let mut fd = -1;
        if let Some(socket) = socket_file(plan.tmp, &plan.socket) {
            if socket.owner != target.euid {
                return fail(STEP_FOREIGN_SOCKET, socket.owner);
            }
            fd = connect_to(plan);
            if fd < 0 {
                if *libc::__errno_location() != libc::ECONNREFUSED || !plan.may_signal {
                    return fail(STEP_CONNECT, 0);
                }
                stale = Some(socket.inode);
            }
        }
        let started = fd < 0;
        if started {
            // HotSpot looks in its working directory first, then in /tmp.
            let mut trigger_dir = -1;
            for dir in [plan.cwd, Some(plan.tmp)].into_iter().flatten() {
                let fd = create_new(dir, &plan.trigger);
                if fd >= 0 {
                    libc::close(fd);
                    trigger_dir = dir;
                    break;
                }
            }
            if trigger_dir < 0 {
                return fail(STEP_TRIGGER, 0);
            }
            let signalled = libc::kill(target.pid as libc::pid_t, libc::SIGQUIT) == 0;
            // The listener's socket: a new one (the JVM replaces a stale file).
            let listening = || {
                let inode = socket_file(plan.tmp, &plan.socket).map(|socket| socket.inode);
                inode.is_some() && inode != stale
            };
            let mut waited = Duration::ZERO;
            let mut pause = Duration::from_millis(10);
            while signalled && !listening() && waited < LISTENER_WAIT {
                let ts = libc::timespec {
                    tv_sec: 0,
                    tv_nsec: pause.as_nanos() as libc::c_long,
                };
                libc::nanosleep(&ts, std::ptr::null_mut());
                waited += pause;
                pause = (pause * 2).min(Duration::from_millis(200));
            }
            libc::unlinkat(trigger_dir, plan.trigger.as_ptr(), 0);
            if !signalled {
                return fail(STEP_SIGNAL, 0);
            }
            if !listening() {
                return fail(STEP_LISTENER, 0);
            }
            // Another user may have been quicker than the JVM.
            match socket_file(plan.tmp, &plan.socket) {
                Some(socket) if socket.owner != target.euid => {
                    return fail(STEP_FOREIGN_SOCKET, socket.owner)
                }
                _ => {}
            }
            fd = connect_to(plan);
            if fd < 0 {
                return fail(STEP_CONNECT, 0);
            }
        }
        // The file's owner was checked by path; the listener itself must be the JVM.
        if let Err(peer_pid) = peer_is(fd, target) {
            libc::close(fd);
            return fail(STEP_FOREIGN_PEER, peer_pid);
        }
        if !write_all(fd, plan.request) {
            return fail(STEP_SEND, 0);
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
                return fail(STEP_RECEIVE, 0);
            }
            if n == 0 {
                break;
            }
            received += n as usize;
        }
        // Loaded or not, the copy is no longer needed: a JVM that mapped it keeps its inode.
        remove_copy();
        write_all(plan.out, &[u8::from(started)]);
        write_all(plan.out, &reply[..received]);
        0
    }
}

/// Writes all of `bytes` to `fd`; false (with `errno`) on an error. Async-signal-safe.
///
/// # Safety
/// Raw system calls.
unsafe fn write_all(fd: RawFd, bytes: &[u8]) -> bool {
    let mut written = 0;
    while written < bytes.len() {
        // SAFETY: a write from our own buffer.
        let n = unsafe { libc::write(fd, bytes[written..].as_ptr().cast(), bytes.len() - written) };
        if n <= 0 {
            return false;
        }
        written += n as usize;
    }
    true
}

/// Creates `name` in `dir` for writing, mode 0600: never an existing file or a link, never a
/// blocking open. A descriptor, or -1 with `errno`. Async-signal-safe.
///
/// # Safety
/// A raw system call; `dir` must be a directory descriptor.
unsafe fn create_new(dir: RawFd, name: &CString) -> RawFd {
    // SAFETY: `name` is a valid C string; the caller's `dir`.
    unsafe {
        libc::openat(
            dir,
            name.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOFOLLOW
                | libc::O_NONBLOCK
                | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    }
}

/// Creates `name` in `dir` (never an existing file or a link) and fills it from `source`, at
/// most [`MAX_AGENT_BYTES`]; sets `created` once the file exists, for the caller to remove it
/// on any later failure. False with `errno` on an error. Async-signal-safe.
///
/// # Safety
/// Raw system calls; `dir` must be a directory descriptor.
unsafe fn write_copy(
    dir: RawFd,
    name: &CString,
    source: RawFd,
    buffer: &mut [u8],
    created: &Cell<bool>,
) -> bool {
    // SAFETY: raw calls on our descriptors and buffer.
    unsafe {
        // Mode 0600: the copy is the JVM's user's, and that user's JVM is its only reader.
        let fd = create_new(dir, name);
        if fd < 0 {
            return false;
        }
        created.set(true);
        let mut total = 0u64;
        let filled = loop {
            let n = libc::read(source, buffer.as_mut_ptr().cast(), buffer.len());
            if n <= 0 {
                break n == 0;
            }
            total += n as u64;
            if total > MAX_AGENT_BYTES {
                *libc::__errno_location() = libc::EFBIG;
                break false;
            }
            if !write_all(fd, &buffer[..n as usize]) {
                break false;
            }
        };
        let errno = *libc::__errno_location();
        libc::close(fd);
        *libc::__errno_location() = errno;
        filled
    }
}

/// A socket file: its inode, to tell a new one from a stale one, and its owner.
#[derive(Clone, Copy)]
struct SocketFile {
    inode: u64,
    owner: u32,
}

/// `fstatat` without following: `name` in `dir` if it is a socket. Async-signal-safe.
///
/// # Safety
/// `dir` must be a directory descriptor.
unsafe fn socket_file(dir: RawFd, name: &CString) -> Option<SocketFile> {
    // SAFETY: all-zero is a valid stat buffer; a raw fstatat.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        let found = libc::fstatat(dir, name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) == 0
            && stat.st_mode & libc::S_IFMT == libc::S_IFSOCK;
        found.then_some(SocketFile {
            inode: stat.st_ino,
            owner: stat.st_uid,
        })
    }
}

/// Whether the peer of the connected socket `fd` is the JVM itself (`SO_PEERCRED`: the
/// process that listens, its pid as seen from our pid namespace, its uid from our user
/// namespace, as `target`'s are); else the peer's pid (0 if unknown). Async-signal-safe.
///
/// # Safety
/// Raw system call on our descriptor.
unsafe fn peer_is(fd: RawFd, target: &Target) -> std::result::Result<(), u32> {
    let mut peer = libc::ucred {
        pid: 0,
        uid: u32::MAX,
        gid: u32::MAX,
    };
    let mut length = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: getsockopt fills our struct, of the size given.
    let read = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut peer as *mut libc::ucred).cast(),
            &mut length,
        )
    } == 0;
    let pid = u32::try_from(peer.pid).unwrap_or(0);
    if read && pid == target.pid && peer.uid == target.euid {
        Ok(())
    } else {
        Err(pid)
    }
}

/// A connected socket to the JVM's listener with the request timeouts set, or -1 with `errno`
/// from `connect`. Async-signal-safe.
///
/// # Safety
/// Raw system calls on memory prepared before the fork.
unsafe fn connect_to(plan: &ChildPlan<'_>) -> RawFd {
    // SAFETY: raw socket calls on our own descriptors and prepared memory.
    unsafe {
        let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return -1;
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
            (&plan.address as *const libc::sockaddr_un).cast(),
            std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
        ) != 0
        {
            let errno = *libc::__errno_location();
            libc::close(fd);
            *libc::__errno_location() = errno;
            return -1;
        }
        fd
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
        // JDK 8: the return code alone.
        assert_eq!(parse_load_reply(b"0\n0\n"), Ok(()));
        assert_eq!(
            parse_load_reply(b"0\n1\n"),
            Err("the agent's Agent_OnAttach returned 1".into())
        );
        assert!(parse_load_reply(b"").is_err());
        assert!(parse_load_reply(b"garbage").is_err());
        assert_eq!(parse_load_reply(b"101\n"), Err("error 101".into()));
    }

    #[test]
    fn replies_are_shown_bounded_and_printable() {
        // A listener may answer anything up to MAX_REPLY: one huge line of terminal escapes.
        let mut reply = b"-1\n".to_vec();
        reply.extend(b"\x1b[2J\x07A".iter().cycle().take(MAX_REPLY - 3));
        let message = parse_load_reply(&reply).expect_err("a failure");
        assert!(message.len() <= MAX_SHOWN_REPLY + 32, "{}", message.len());
        assert!(!message.chars().any(char::is_control), "{message:?}");
        assert!(
            message.ends_with(&format!("... ({} bytes)", MAX_REPLY - 3)),
            "{message}"
        );
        let message = parse_load_reply(b"\x1b]0;owned\x07").expect_err("not a reply");
        assert_eq!(message, "unexpected reply \"?]0;owned?\"");
        // A short message is shown whole.
        assert_eq!(
            parse_load_reply(b"0\nreturn code: \x1b7\n"),
            Err("the agent's Agent_OnAttach returned ?7".into())
        );
    }

    #[test]
    fn only_the_jvm_itself_is_accepted_as_the_peer() {
        let (ours, theirs) = std::os::unix::net::UnixStream::pair().expect("socketpair");
        // SAFETY: plain getters.
        let (pid, euid) = (std::process::id(), unsafe { libc::geteuid() });
        let target = |pid, euid| Target {
            pid,
            nspid: pid,
            euid,
            egid: 0,
        };
        // SAFETY: a connected socket we own.
        let peer = |target: &Target| unsafe { peer_is(ours.as_raw_fd(), target) };
        assert_eq!(peer(&target(pid, euid)), Ok(()));
        assert_eq!(peer(&target(pid + 1, euid)), Err(pid), "another process");
        assert_eq!(peer(&target(pid, euid + 1)), Err(pid), "another user");
        drop(theirs);
    }

    #[test]
    fn the_request_has_the_version_command_and_three_arguments() {
        let request = load_request(Path::new("/tmp/a.so"), "x=1").expect("request");
        assert_eq!(request, b"1\0load\0/tmp/a.so\0true\0x=1\0");
        assert!(load_request(Path::new("/tmp/a\0.so"), "").is_err());
    }

    #[test]
    fn sigquit_handling_is_read_from_the_caught_mask() {
        use crate::proc_status::test_status;
        assert!(catches_sigquit(&test_status(&[
            "SigIgn:\t0000000000000000",
            "SigCgt:\t0000000000000004"
        ])));
        assert!(!catches_sigquit(&test_status(&[
            "SigCgt:\t0000000000000002"
        ])));
        assert!(!catches_sigquit("Name:\tjava\n"));
    }

    #[test]
    fn status_gives_nspid_and_effective_ids() {
        let status = crate::proc_status::test_status(&[
            "Uid:\t1000\t1001\t1001\t1001",
            "Gid:\t50\t51\t51\t51",
            "NSpid:\t4242\t7",
        ]);
        let target = Target::parse_status(4242, &status).expect("parses");
        assert_eq!(
            target,
            Target {
                pid: 4242,
                nspid: 7,
                euid: 1001,
                egid: 51
            }
        );
        assert_eq!(target.socket_name(), ".java_pid7");
    }
}
