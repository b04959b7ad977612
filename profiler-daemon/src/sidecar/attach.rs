//! HotSpot dynamic attach from outside the JVM, also into other mount namespaces.
//!
//! The protocol (JDK 9 to 25 on Linux; see docs/hotspot-attach.md): the JVM listens on
//! `/tmp/.java_pid<nspid>` in its own namespace, but only after it saw a trigger file
//! `.attach_pid<nspid>` (owned by its euid, in its working directory or /tmp) and a SIGQUIT. It
//! accepts a peer only with its own euid/egid (`SO_PEERCRED`). The request is
//! `1\0load\0PATH\0true\0OPTIONS\0`; the path is resolved inside the JVM's namespace, so the
//! agent is copied there first when the JVM has its own mount namespace. A socket that refuses
//! connections was left by a dead process with the same pid: the listener is started anyway.
//!
//! Everything in the JVM's directories belongs to the JVM's user, who may plant symlinks, FIFOs
//! or mounts there. So the daemon, which runs as root, never creates, opens or removes a file
//! there by path. It resolves the two directories it needs (the JVM's working directory and its
//! `/tmp`) to descriptors, confined to the JVM's root; a forked child then closes every other
//! descriptor, switches to the JVM's uid and gid, drops every capability, and only then creates
//! the trigger (`O_CREAT|O_EXCL|O_NOFOLLOW`), signals the JVM, waits for its socket, connects and
//! exchanges the request: whatever the user planted, the child can do no more than the user
//! could. The agent copy (another mount namespace only) is created by the daemon under a fresh
//! name (`O_EXCL|O_NOFOLLOW`, mode 0644, in the sticky `/tmp` nobody else can replace it in) and
//! removed once loaded: a copy is never reused.
//!
//! Written here rather than taken from a crate: the attach crates we know of connect as the
//! caller, in the caller's namespace, and follow paths; none creates the trigger from
//! descriptors in a child that has already given up root, which is what makes attaching safe
//! against the JVM's own user.

use std::ffi::CString;
use std::fs::File;
use std::io::Write as _;
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
    let placed = place_agent(&target, &tmp, agent)?;
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
    let request = load_request(&placed.inside, options)?;
    let outcome = exchange_as(&target, &tmp, cwd.as_ref(), &request, may_signal);
    // Loaded or not, the copy is no longer needed: a JVM that mapped it keeps its inode.
    placed.remove(&tmp);
    let (started_listener, reply) = outcome?;
    parse_load_reply(&reply).map_err(|message| {
        anyhow!(
            "JVM {pid} refused to load {}: {message}",
            placed.inside.display()
        )
    })?;
    Ok(Attached {
        records: target.host_path(
            &profiler_jvmti_records::channel::records_dir(target.nspid)
                .join(profiler_jvmti_records::channel::RECORDS_FILE),
        ),
        agent_path: placed.inside,
        started_listener,
        elapsed: started.elapsed(),
    })
}

/// The agent as the JVM reaches it.
struct PlacedAgent {
    /// Its path inside the JVM's namespace.
    inside: PathBuf,
    /// The name of the copy made in the JVM's /tmp, if one was made.
    copy: Option<CString>,
}

impl PlacedAgent {
    fn remove(&self, tmp: &OwnedFd) {
        if let Some(name) = &self.copy {
            // SAFETY: a name relative to our directory descriptor; unlinkat does not follow it.
            unsafe { libc::unlinkat(tmp.as_raw_fd(), name.as_ptr(), 0) };
        }
    }
}

/// Makes the agent reachable from inside the JVM's mount namespace: the same path when it shares
/// ours, else a fresh copy in its /tmp that nobody else can have written.
fn place_agent(target: &Target, tmp: &OwnedFd, agent: &Path) -> Result<PlacedAgent> {
    let agent = agent
        .canonicalize()
        .with_context(|| format!("agent library {}", agent.display()))?;
    if !target.other_mount_namespace() {
        return Ok(PlacedAgent {
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
    let bytes = std::fs::read(&agent).with_context(|| format!("reading {}", agent.display()))?;
    let name = format!(
        ".jvm-profiler-agent-{}-{}.so",
        std::process::id(),
        unique_suffix()
    );
    let c_name = CString::new(name.clone())?;
    // SAFETY: a name relative to our directory descriptor. O_EXCL|O_NOFOLLOW: never an existing
    // file or a planted link; the result is a fresh descriptor we own.
    let fd = unsafe {
        libc::openat(
            tmp.as_raw_fd(),
            c_name.as_ptr(),
            libc::O_WRONLY
                | libc::O_CREAT
                | libc::O_EXCL
                | libc::O_NOFOLLOW
                | libc::O_CLOEXEC
                | libc::O_NONBLOCK,
            0o644 as libc::c_uint,
        )
    };
    if fd < 0 {
        bail!(
            "copying the agent into the JVM's /tmp ({}): {}",
            target.host_path(&Path::new("/tmp").join(&name)).display(),
            std::io::Error::last_os_error()
        );
    }
    // SAFETY: the fresh descriptor is ours.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let placed = PlacedAgent {
        inside: Path::new("/tmp").join(&name),
        copy: Some(c_name),
    };
    // The umask may have narrowed the mode; the JVM's user must read it, nobody else write it.
    let written = file.write_all(&bytes).and_then(|()| {
        // SAFETY: fchmod on our descriptor.
        match unsafe { libc::fchmod(file.as_raw_fd(), 0o644) } {
            0 => Ok(()),
            _ => Err(std::io::Error::last_os_error()),
        }
    });
    if let Err(err) = written {
        placed.remove(tmp);
        bail!("copying the agent into the JVM's /tmp: {err}");
    }
    Ok(placed)
}

/// Refuses a /tmp where others could replace our copy: writable by group or others without the
/// sticky bit (which keeps them from renaming over or removing files they do not own).
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
    CString::new(name).is_ok_and(|name| unsafe { socket_inode(dir.as_raw_fd(), &name) }.is_some())
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

/// What the child needs, all prepared before `fork` (the child may not allocate).
struct ChildPlan<'a> {
    target: &'a Target,
    /// Descriptors of the JVM's /tmp and working directory (`O_PATH`).
    tmp: RawFd,
    cwd: Option<RawFd>,
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

/// Starts the JVM's listener if needed and sends `request`, as the JVM's euid/egid, from a
/// forked child; returns whether the listener had to be started, and the JVM's reply.
///
/// The daemon's credentials never change. Between fork and `_exit` the child only makes system
/// calls on memory prepared before the fork (the daemon is multi-threaded: allocating or locking
/// there could deadlock).
fn exchange_as(
    target: &Target,
    tmp: &OwnedFd,
    cwd: Option<&OwnedFd>,
    request: &[u8],
    may_signal: bool,
) -> Result<(bool, Vec<u8>)> {
    let via_fd = format!("/proc/self/fd/{}/{}", tmp.as_raw_fd(), target.socket_name());
    // SAFETY: all-zero is a valid sockaddr_un.
    let mut address: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    address.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = CString::new(via_fd)?.into_bytes_with_nul();
    if bytes.len() > address.sun_path.len() {
        bail!("socket path too long");
    }
    for (dst, src) in address.sun_path.iter_mut().zip(&bytes) {
        *dst = *src as libc::c_char;
    }
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
        trigger: CString::new(format!(".attach_pid{}", target.nspid))?,
        socket: CString::new(target.socket_name())?,
        address,
        request,
        out: write_end,
        may_signal,
    };
    let mut keep = [plan.tmp, plan.cwd.unwrap_or(plan.tmp), plan.out];
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
            let status = child_attach(&plan, &mut reply);
            libc::_exit(status);
        }
    }
    // SAFETY: the parent's copy of the write end.
    unsafe { libc::close(write_end) };
    // SAFETY: read_end is ours; File takes ownership and closes it.
    let mut pipe = unsafe { File::from_raw_fd(read_end) };
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
    let errno = output
        .get(..4)
        .map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .unwrap_or(0);
    let err = std::io::Error::from_raw_os_error(errno);
    let socket = format!("/tmp/{}", target.socket_name());
    Err(match code {
        STEP_CREDENTIALS => anyhow!(
            "switching to the JVM's uid {} / gid {}: {err}",
            target.euid,
            target.egid
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
        STEP_CONNECT => anyhow!("connecting to {socket}: {err} (attach mechanism not responding)"),
        STEP_SEND => anyhow!("sending the load request: {err}"),
        STEP_RECEIVE => anyhow!("no reply from the JVM: {err}"),
        _ => anyhow!("attach helper failed (status {status:#x})"),
    })
}

const STEP_CREDENTIALS: i32 = 10;
const STEP_CONNECT: i32 = 11;
const STEP_SEND: i32 = 12;
const STEP_RECEIVE: i32 = 13;
const STEP_TRIGGER: i32 = 14;
const STEP_SIGNAL: i32 = 15;
const STEP_LISTENER: i32 = 16;

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

/// The forked child: switch credentials, start the listener if needed, connect, send, receive,
/// and write the report (a byte saying whether the listener was started, then the reply; or the
/// errno) to `plan.out`. Returns the exit status: 0 or the failed step.
///
/// # Safety
/// Only to be called in a freshly forked child; uses raw system calls only.
unsafe fn child_attach(plan: &ChildPlan<'_>, reply: &mut [u8]) -> libc::c_int {
    let out = plan.out;
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
        let target = plan.target;
        if target.euid != libc::geteuid() || target.egid != libc::getegid() {
            let (uid, gid) = (target.euid as libc::c_long, target.egid as libc::c_long);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                return fail(STEP_CREDENTIALS);
            }
        }
        if !drop_capabilities() {
            return fail(STEP_CREDENTIALS);
        }
        // A socket already there is either the JVM's listener or a stale one a dead process
        // with the same pid left behind (a killed JVM does not remove it): refused, it is
        // stale, and the listener must be started as if there were none.
        let mut stale = None;
        let mut fd = -1;
        if let Some(inode) = socket_inode(plan.tmp, &plan.socket) {
            fd = connect_to(plan);
            if fd < 0 {
                if *libc::__errno_location() != libc::ECONNREFUSED || !plan.may_signal {
                    return fail(STEP_CONNECT);
                }
                stale = Some(inode);
            }
        }
        let started = fd < 0;
        if started {
            // HotSpot looks in its working directory first, then in /tmp.
            let mut trigger_dir = -1;
            for dir in [plan.cwd, Some(plan.tmp)].into_iter().flatten() {
                let fd = libc::openat(
                    dir,
                    plan.trigger.as_ptr(),
                    libc::O_WRONLY
                        | libc::O_CREAT
                        | libc::O_EXCL
                        | libc::O_NOFOLLOW
                        | libc::O_NONBLOCK
                        | libc::O_CLOEXEC,
                    0o600 as libc::c_uint,
                );
                if fd >= 0 {
                    libc::close(fd);
                    trigger_dir = dir;
                    break;
                }
            }
            if trigger_dir < 0 {
                return fail(STEP_TRIGGER);
            }
            let signalled = libc::kill(target.pid as libc::pid_t, libc::SIGQUIT) == 0;
            // The listener's socket: a new one (the JVM replaces a stale file).
            let listening = || {
                let inode = socket_inode(plan.tmp, &plan.socket);
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
                return fail(STEP_SIGNAL);
            }
            if !listening() {
                return fail(STEP_LISTENER);
            }
            fd = connect_to(plan);
            if fd < 0 {
                return fail(STEP_CONNECT);
            }
        }
        let request = plan.request;
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
        let flag = [u8::from(started)];
        libc::write(out, flag.as_ptr().cast(), 1);
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

/// `fstatat` without following: the inode of `name` in `dir` if it is a socket.
/// Async-signal-safe.
///
/// # Safety
/// `dir` must be a directory descriptor.
unsafe fn socket_inode(dir: RawFd, name: &CString) -> Option<u64> {
    // SAFETY: all-zero is a valid stat buffer; a raw fstatat.
    unsafe {
        let mut stat: libc::stat = std::mem::zeroed();
        let found = libc::fstatat(dir, name.as_ptr(), &mut stat, libc::AT_SYMLINK_NOFOLLOW) == 0
            && stat.st_mode & libc::S_IFMT == libc::S_IFSOCK;
        found.then_some(stat.st_ino)
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
