//! Opening and reading files that belong to profiled processes, which the daemon must treat as
//! untrusted input: it runs as root (or with `CAP_DAC_READ_SEARCH`, `CAP_SYS_PTRACE`), and the
//! processes it profiles belong to other users and containers.
//!
//! # What the daemon opens on behalf of a profiled process
//!
//! | file | who controls it | how it is opened |
//! |---|---|---|
//! | `/proc/PID/{status,stat,cmdline,maps,cgroup,mountinfo,task/*/status}` | the kernel (contents partly the process's: its name, arguments) | [`read_proc_file`]: bounded size, `O_NONBLOCK` |
//! | mapped ELF files (blazesym: native symbols; libjvm's `.dynsym`) | the process's user (it may map any file it can read, including one on a FUSE mount it serves) | `/proc/PID/map_files/START-END` (the very file mapped, no path lookup in the process's namespace); refused on FUSE; [`check_regular`] |
//! | sidecar records `/tmp/.jvm-profiler-NSPID/records` | the JVM's user (it owns the directory) | [`open_in_tmp`]: `openat2` confined to the process's root, no symlinks or mounts below `/tmp`, `O_NONBLOCK`, regular file owned by the JVM's euid, size bounded |
//! | attach trigger `.attach_pidNSPID` (cwd or `/tmp`) | the JVM's user | created by the attach child after it switched to the JVM's uid/gid, `O_CREAT|O_EXCL|O_NOFOLLOW` (see `sidecar::attach`) |
//! | attach socket `/tmp/.java_pidNSPID` | the JVM's user | connected to by the same child, through a `/tmp` directory descriptor resolved here |
//! | agent copy `/tmp/.jvm-profiler-agent-*.so` in another mount namespace | the JVM's user: written by the attach child after it became that user (created fresh, `O_EXCL|O_NOFOLLOW`, mode 0600, removed after the load), never by root | [`open_tmp_dir`] then `openat` by name, in the child |
//! | headers, notes and compressed sections of mapped ELF files | the process's user | `object` over [`BoundedReads`] before blazesym sees the file (`symbolize::elf_facts`) |
//! | process memory (`process_vm_readv`) | the process | bounded reads, decoded defensively (`hotspot::remote`) |
//!
//! Reads from `/proc` of a process take its memory-map lock; a process that keeps that lock
//! (a page fault served by its own FUSE daemon) can stall them. SECURITY.md lists this residual
//! risk.

use std::cell::Cell;
use std::ffi::CString;
use std::fs::File;
use std::io::{self, Read as _};
use std::ops::Range;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::{FileTypeExt as _, MetadataExt as _};
use std::path::Path;

use object::read::{ReadCache, ReadRef};

/// Largest `/proc/PID/*` text file read (maps of a process at the default `vm.max_map_count`
/// take about 7 MB).
pub const MAX_PROC_FILE: usize = 16 << 20;

/// Why an untrusted file was not read.
#[derive(Debug, thiserror::Error)]
pub enum Refused {
    #[error("not found")]
    NotFound,
    #[error("{0}")]
    Io(io::Error),
    #[error("a symbolic link or mount point on the way")]
    Link,
    #[error("not a regular file (a {0})")]
    NotRegular(&'static str),
    #[error("owned by uid {owner}, expected {expected}")]
    WrongOwner { owner: u32, expected: u32 },
    #[error("{size} bytes, over the bound of {max}")]
    TooLarge { size: u64, max: u64 },
    #[error("on a {0} filesystem, which its user may serve (reads could block)")]
    UserFilesystem(String),
}

impl Refused {
    /// A short label for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotFound => "not_found",
            Self::Io(_) => "io_error",
            Self::Link => "link",
            Self::NotRegular(_) => "not_regular",
            Self::WrongOwner { .. } => "wrong_owner",
            Self::TooLarge { .. } => "too_large",
            Self::UserFilesystem(_) => "user_filesystem",
        }
    }
}

impl From<io::Error> for Refused {
    fn from(err: io::Error) -> Self {
        match err.raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ESRCH) => Self::NotFound,
            // ELOOP: a symlink under RESOLVE_NO_SYMLINKS; EXDEV: a mount point under
            // RESOLVE_NO_XDEV or an escape attempt under RESOLVE_BENEATH.
            Some(libc::ELOOP) | Some(libc::EXDEV) => Self::Link,
            _ => Self::Io(err),
        }
    }
}

/// What an opened file must be.
#[derive(Clone, Copy, Debug)]
pub struct Expect {
    /// Owner uid, if it must be a given one.
    pub owner: Option<u32>,
    /// Largest size accepted.
    pub max_size: u64,
}

/// Accepts `file` only if it is a regular file as `expect` says.
pub fn check_regular(file: &File, expect: Expect) -> Result<std::fs::Metadata, Refused> {
    let meta = file.metadata()?;
    let kind = meta.file_type();
    if !kind.is_file() {
        return Err(Refused::NotRegular(if kind.is_fifo() {
            "FIFO"
        } else if kind.is_char_device() {
            "character device"
        } else if kind.is_block_device() {
            "block device"
        } else if kind.is_socket() {
            "socket"
        } else if kind.is_dir() {
            "directory"
        } else {
            "special file"
        }));
    }
    if let Some(expected) = expect.owner {
        if meta.uid() != expected {
            return Err(Refused::WrongOwner {
                owner: meta.uid(),
                expected,
            });
        }
    }
    if meta.len() > expect.max_size {
        return Err(Refused::TooLarge {
            size: meta.len(),
            max: expect.max_size,
        });
    }
    Ok(meta)
}

/// Reads `/proc/PID/NAME` (e.g. `status`, `task/7/status`), at most `max` bytes: longer
/// contents are an error, never a partial read taken for the whole.
pub fn read_proc_file(pid: u32, name: &str, max: usize) -> io::Result<Vec<u8>> {
    read_bounded(&format!("/proc/{pid}/{name}"), max)
}

/// [`read_proc_file`] as text (lossy: the process chooses parts of it).
pub fn read_proc_text(pid: u32, name: &str, max: usize) -> io::Result<String> {
    read_proc_file(pid, name, max).map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads a kernel-generated file without following a final symlink or blocking, bounded.
pub fn read_bounded(path: &str, max: usize) -> io::Result<Vec<u8>> {
    let file = open_nonblocking(Path::new(path), libc::O_NOFOLLOW)?;
    let mut bytes = Vec::new();
    file.take(max as u64 + 1).read_to_end(&mut bytes)?;
    if bytes.len() > max {
        return Err(io::Error::other(format!("{path} is over {max} bytes")));
    }
    Ok(bytes)
}

fn open_nonblocking(path: &Path, extra_flags: libc::c_int) -> io::Result<File> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: a NUL-terminated path; the returned descriptor is owned by the File.
    let fd = unsafe {
        libc::open(
            path.as_ptr(),
            libc::O_RDONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY | extra_flags,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// `openat2(2)`: `path` relative to `dir`, with `resolve` rules.
fn openat2(dir: libc::c_int, path: &Path, flags: libc::c_int, resolve: u64) -> io::Result<OwnedFd> {
    let path = CString::new(path.as_os_str().as_bytes())?;
    // SAFETY: all-zero is a valid open_how (no mode, no flags).
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    // openat2 refuses flags that do not apply (O_NOCTTY with O_PATH), unlike openat.
    let extra = if flags & libc::O_PATH != 0 {
        libc::O_CLOEXEC
    } else {
        libc::O_CLOEXEC | libc::O_NOCTTY
    };
    how.flags = (flags | extra) as u64;
    how.resolve = resolve;
    // SAFETY: openat2 with a valid struct and its size; the result is a fresh descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir,
            path.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The process's `/tmp` as an `O_PATH` directory descriptor, resolved inside its root (its
/// symlinks cannot leave it, no `/proc` magic links), and refused on a filesystem its user may
/// serve.
pub fn open_tmp_dir(pid: u32) -> Result<OwnedFd, Refused> {
    refuse_user_filesystem(pid, Path::new("/tmp"))?;
    let root = open_nonblocking_dir(&format!("/proc/{pid}/root"))?;
    Ok(openat2(
        root.as_raw_fd(),
        Path::new("tmp"),
        libc::O_PATH | libc::O_DIRECTORY,
        libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_MAGICLINKS,
    )?)
}

/// Removes `name` from `dir` below our own `/tmp` if it still is the inode `(dev, ino)`, then
/// `dir` if that left it empty: cleaning up after a process whose user owns `dir`, so nothing
/// below `/tmp` is followed (a link planted there is what would be removed, not its target).
/// Ok(false) when the file was gone or is another one now.
pub fn remove_file_below_tmp(dir: &Path, name: &str, (dev, ino): (u64, u64)) -> io::Result<bool> {
    let tmp = openat2(
        libc::AT_FDCWD,
        Path::new("/tmp"),
        libc::O_PATH | libc::O_DIRECTORY,
        0,
    )?;
    let no_links = libc::RESOLVE_BENEATH
        | libc::RESOLVE_NO_SYMLINKS
        | libc::RESOLVE_NO_MAGICLINKS
        | libc::RESOLVE_NO_XDEV;
    let dir_fd = openat2(
        tmp.as_raw_fd(),
        dir,
        libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW,
        no_links,
    )?;
    let name = CString::new(name)?;
    // SAFETY: all-zero is a valid stat.
    let mut stat: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor, C string and buffer.
    if unsafe {
        libc::fstatat(
            dir_fd.as_raw_fd(),
            name.as_ptr(),
            &mut stat,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    } != 0
    {
        let err = io::Error::last_os_error();
        return if err.kind() == io::ErrorKind::NotFound {
            Ok(false)
        } else {
            Err(err)
        };
    }
    if (stat.st_dev, stat.st_ino) != (dev, ino) {
        return Ok(false);
    }
    // SAFETY: a valid descriptor and C string.
    if unsafe { libc::unlinkat(dir_fd.as_raw_fd(), name.as_ptr(), 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let dir = CString::new(dir.as_os_str().as_bytes())?;
    // Fails, harmlessly, if something else is in there.
    // SAFETY: a valid descriptor and C string.
    unsafe { libc::unlinkat(tmp.as_raw_fd(), dir.as_ptr(), libc::AT_REMOVEDIR) };
    Ok(true)
}

/// The process's working directory as an `O_PATH` descriptor (the kernel resolves the magic
/// link itself: no path lookup in the process's namespace).
pub fn open_cwd_dir(pid: u32) -> Result<OwnedFd, Refused> {
    Ok(open_nonblocking_dir(&format!("/proc/{pid}/cwd"))?)
}

fn open_nonblocking_dir(path: &str) -> io::Result<OwnedFd> {
    let file = open_nonblocking(Path::new(path), libc::O_PATH | libc::O_DIRECTORY)?;
    Ok(OwnedFd::from(file))
}

/// Opens `relative` below the process's `/tmp` for reading: a path its user controls, so no
/// symlink, mount point or `..` is followed below `/tmp`, and the result must be a regular file
/// as `expect` says.
pub fn open_in_tmp(pid: u32, relative: &Path, expect: Expect) -> Result<File, Refused> {
    let tmp = open_tmp_dir(pid)?;
    let fd = openat2(
        tmp.as_raw_fd(),
        relative,
        libc::O_RDONLY | libc::O_NONBLOCK,
        libc::RESOLVE_BENEATH
            | libc::RESOLVE_NO_SYMLINKS
            | libc::RESOLVE_NO_MAGICLINKS
            | libc::RESOLVE_NO_XDEV,
    )?;
    let file = File::from(fd);
    check_regular(&file, expect)?;
    Ok(file)
}

/// Opens the file mapped at `start..end` in process `pid` through `/proc/PID/map_files`: the
/// very inode mapped, whatever its path now names. Needs `CAP_CHECKPOINT_RESTORE` (or
/// `CAP_SYS_ADMIN`).
pub fn open_mapped(
    pid: u32,
    start: u64,
    end: u64,
    dev: u64,
    expect: Expect,
) -> Result<File, Refused> {
    refuse_user_filesystem_dev(pid, dev)?;
    let file = open_nonblocking(
        Path::new(&format!("/proc/{pid}/map_files/{start:x}-{end:x}")),
        0,
    )?;
    check_regular(&file, expect)?;
    Ok(file)
}

/// Opens `path`, a mapped file's path from `/proc/PID/maps` (absolute, free of links: the
/// kernel prints the file's own path), inside the process's root; after the process exited,
/// in ours if `shares_our_root`. No symlink is followed: a path someone replaced by a link since
/// the mapping was made is refused rather than followed.
pub fn open_by_mapped_path(
    pid: u32,
    path: &Path,
    dev: u64,
    shares_our_root: bool,
    expect: Expect,
) -> Result<File, Refused> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let flags = libc::O_RDONLY | libc::O_NONBLOCK;
    let no_links = libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    let fd = match open_nonblocking_dir(&format!("/proc/{pid}/root")) {
        Ok(root) => {
            refuse_user_filesystem_dev(pid, dev)?;
            openat2(
                root.as_raw_fd(),
                relative,
                flags,
                no_links | libc::RESOLVE_IN_ROOT,
            )?
        }
        Err(_) if shares_our_root => {
            refuse_user_filesystem_dev(std::process::id(), dev)?;
            openat2(libc::AT_FDCWD, path, flags, no_links)?
        }
        Err(err) => return Err(err.into()),
    };
    let file = File::from(fd);
    check_regular(&file, expect)?;
    Ok(file)
}

/// A path through which a library such as blazesym, which opens files by path, reaches exactly
/// the file `file` is open on (valid while `file` is).
pub fn fd_path(file: &File) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()))
}

/// Filesystem types whose reads an unprivileged user may serve (and stall): FUSE, mountable by
/// any user through `fusermount` or in a user namespace.
fn user_served(fs_type: &str) -> bool {
    fs_type == "fuse" || fs_type == "fuseblk" || fs_type.starts_with("fuse.")
}

/// Refuses a path of process `pid` that lies on a user-served filesystem, per its mountinfo.
fn refuse_user_filesystem(pid: u32, path: &Path) -> Result<(), Refused> {
    let mountinfo = read_proc_text(pid, "mountinfo", MAX_PROC_FILE)?;
    match mount_of(&mountinfo, path) {
        Some(mount) if user_served(mount.fs_type) => {
            Err(Refused::UserFilesystem(mount.fs_type.to_owned()))
        }
        _ => Ok(()),
    }
}

/// Refuses a file of process `pid` on device `dev` (from its maps) if that device is a
/// user-served filesystem.
fn refuse_user_filesystem_dev(pid: u32, dev: u64) -> Result<(), Refused> {
    let mountinfo = read_proc_text(pid, "mountinfo", MAX_PROC_FILE)?;
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let wanted = format!("{major}:{minor}");
    for line in mountinfo.lines() {
        let Some(mount) = MountLine::parse(line) else {
            continue;
        };
        if mount.device == wanted && user_served(mount.fs_type) {
            return Err(Refused::UserFilesystem(mount.fs_type.to_owned()));
        }
    }
    Ok(())
}

/// One line of `/proc/PID/mountinfo`.
#[derive(Debug, PartialEq, Eq)]
struct MountLine<'a> {
    device: &'a str,
    mount_point: &'a str,
    fs_type: &'a str,
}

impl<'a> MountLine<'a> {
    /// `36 35 98:0 /mnt1 /mnt2 rw,noatime master:1 - ext3 /dev/root rw,errors=continue`
    fn parse(line: &'a str) -> Option<Self> {
        let (before, after) = line.split_once(" - ")?;
        let mut fields = before.split(' ');
        let device = fields.nth(2)?;
        let mount_point = fields.nth(1)?;
        let fs_type = after.split(' ').next()?;
        Some(Self {
            device,
            mount_point,
            fs_type,
        })
    }
}

/// The mount that holds `path` (the last listed mount whose mount point is a prefix: later
/// mounts stack over earlier ones).
fn mount_of<'a>(mountinfo: &'a str, path: &Path) -> Option<MountLine<'a>> {
    let path = path.as_os_str().as_bytes();
    let mut best: Option<MountLine<'a>> = None;
    for mount in mountinfo.lines().filter_map(MountLine::parse) {
        // Mount points escape spaces and the like as octal; ours never contain them.
        let point = mount.mount_point.as_bytes();
        let covers = point == b"/"
            || (path.starts_with(point) && matches!(path.get(point.len()), None | Some(b'/')));
        if covers
            && best
                .as_ref()
                .is_none_or(|b| point.len() >= b.mount_point.len())
        {
            best = Some(mount);
        }
    }
    best
}

/// Reads of a file through `object`'s cache, refused once they would pass `budget` bytes in
/// all: the file is the profiled process's, and its headers choose what is read.
pub struct BoundedReads {
    cache: ReadCache<File>,
    budget: u64,
    used: Cell<u64>,
}

impl BoundedReads {
    pub fn new(cache: ReadCache<File>, budget: u64) -> Self {
        Self {
            cache,
            budget,
            used: Cell::new(0),
        }
    }

    fn charge(&self, size: u64) -> Result<(), ()> {
        let used = self.used.get().saturating_add(size);
        if used > self.budget {
            return Err(());
        }
        self.used.set(used);
        Ok(())
    }
}

impl<'a> ReadRef<'a> for &'a BoundedReads {
    fn len(self) -> Result<u64, ()> {
        (&self.cache).len()
    }

    fn read_bytes_at(self, offset: u64, size: u64) -> Result<&'a [u8], ()> {
        // Charged before the cache allocates `size` bytes (repeated reads are charged again:
        // the budget only has to stop a file that asks for too much).
        self.charge(size)?;
        (&self.cache).read_bytes_at(offset, size)
    }

    fn read_bytes_at_until(self, range: Range<u64>, delimiter: u8) -> Result<&'a [u8], ()> {
        // The cache reads at most 4 KiB per string.
        self.charge(4096)?;
        (&self.cache).read_bytes_at_until(range, delimiter)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
25 22 0:22 / /tmp rw,nosuid shared:5 - tmpfs tmpfs rw
40 25 0:45 / /tmp/fusey rw,nosuid - fuse.sshfs host: rw
41 22 0:46 / /tmpx rw - fuse.other x rw
";

    #[test]
    fn the_mount_holding_a_path_is_the_longest_covering_one() {
        assert_eq!(
            mount_of(MOUNTINFO, Path::new("/tmp"))
                .expect("a mount")
                .fs_type,
            "tmpfs"
        );
        assert_eq!(
            mount_of(MOUNTINFO, Path::new("/tmp/.jvm-profiler-1/records"))
                .expect("a mount")
                .fs_type,
            "tmpfs"
        );
        assert_eq!(
            mount_of(MOUNTINFO, Path::new("/tmp/fusey/x"))
                .expect("a mount")
                .fs_type,
            "fuse.sshfs"
        );
        // A prefix by characters is not a parent directory.
        assert_eq!(
            mount_of(MOUNTINFO, Path::new("/tmpx2"))
                .expect("a mount")
                .fs_type,
            "ext4"
        );
        assert!(user_served("fuse.sshfs") && user_served("fuseblk"));
        assert!(!user_served("tmpfs") && !user_served("overlay"));
    }

    #[test]
    fn special_files_big_files_and_foreign_owners_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let any = Expect {
            owner: None,
            max_size: 100,
        };
        let fifo = dir.path().join("fifo");
        let c = CString::new(fifo.as_os_str().as_bytes()).expect("test setup");
        // SAFETY: a valid path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        // O_NONBLOCK: opening a FIFO nobody writes to returns at once.
        let file = open_nonblocking(&fifo, 0).expect("opens without blocking");
        assert!(matches!(
            check_regular(&file, any),
            Err(Refused::NotRegular("FIFO"))
        ));

        let zero = open_nonblocking(Path::new("/dev/zero"), 0).expect("/dev/zero");
        assert!(matches!(
            check_regular(&zero, any),
            Err(Refused::NotRegular("character device"))
        ));

        let big = dir.path().join("big");
        let f = File::create(&big).expect("test setup");
        f.set_len(10 << 30).expect("test setup");
        let f = File::open(&big).expect("test setup");
        assert!(matches!(
            check_regular(&f, any),
            Err(Refused::TooLarge { .. })
        ));
        assert!(check_regular(
            &f,
            Expect {
                owner: Some(12345),
                max_size: u64::MAX
            }
        )
        .is_err_and(|e| e.reason() == "wrong_owner"));
        std::fs::set_permissions(&big, std::fs::Permissions::from_mode(0o600)).expect("test setup");
    }

    #[test]
    fn proc_reads_are_bounded() {
        let pid = std::process::id();
        let status = read_proc_text(pid, "status", MAX_PROC_FILE).expect("own status");
        assert!(status.contains("Pid:"));
        assert!(
            read_proc_file(pid, "status", 10).is_err(),
            "longer than 10 bytes"
        );
    }

    #[test]
    fn paths_below_tmp_follow_no_symlink_and_stay_beneath() {
        // Our own /tmp, through /proc/self/root like any process's.
        let pid = std::process::id();
        let dir = tempfile::Builder::new()
            .prefix("untrusted-test")
            .tempdir_in("/tmp")
            .expect("tempdir in /tmp");
        let name = dir.path().file_name().expect("test setup").to_owned();
        std::fs::write(dir.path().join("file"), b"abc").expect("test setup");
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("link")).expect("test setup");
        std::os::unix::fs::symlink("/etc", dir.path().join("dirlink")).expect("test setup");
        let expect = Expect {
            owner: None,
            max_size: 1 << 20,
        };
        let relative = |leaf: &str| Path::new(&name).join(leaf);
        let mut file = open_in_tmp(pid, &relative("file"), expect).expect("a plain file");
        let mut text = String::new();
        file.read_to_string(&mut text).expect("test setup");
        assert_eq!(text, "abc");
        for leaf in ["link", "dirlink/passwd"] {
            let err = open_in_tmp(pid, &relative(leaf), expect).expect_err(leaf);
            assert_eq!(err.reason(), "link", "{leaf}: {err}");
        }
        let err = open_in_tmp(pid, Path::new("../etc/passwd"), expect).expect_err("escape");
        assert_eq!(err.reason(), "link", "{err}");
        assert_eq!(
            open_in_tmp(pid, &relative("missing"), expect)
                .expect_err("refused")
                .reason(),
            "not_found"
        );
    }
}
