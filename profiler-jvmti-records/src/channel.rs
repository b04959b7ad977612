//! The records file between agent and daemon: where it lives, the agent's [`Writer`] (append,
//! rotate) and the daemon's incremental [`Reader`].
//!
//! Layout: `/tmp/.jvm-profiler-<nspid>/records` in the JVM's mount namespace (mode 0700
//! directory, owned by the JVM's user). Rotation writes `records.next`, then renames it over
//! `records`: readers see either the whole old generation or a new file whose header has the
//! next generation number, never a half-written header.
//!
//! A JVM killed with SIGKILL leaves its directory behind, and pids are reused: the next JVM
//! with that pid takes over a directory of its own user, but one of another user (left over, or
//! planted to keep the agent out) cannot be used. The agent then writes into a fresh
//! `/tmp/.jvm-profiler-<nspid>-<random>` ([`fallback_dir_prefix`]), which nobody can plant in
//! advance; the daemon finds it by its prefix and owner.

use std::fs::{File, OpenOptions};
use std::io::{self, Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::{DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use crate::record::{self, DecodeError, FileHeader, Record, HEADER_LEN, VERSION};

/// File name of the current generation inside the records directory.
pub const RECORDS_FILE: &str = "records";
const NEXT_FILE: &str = "records.next";
/// Default size after which the agent starts a new generation.
pub const DEFAULT_MAX_BYTES: u64 = 32 << 20;
/// The least room a replay gets in a generation, however small the cap: a live set larger
/// than twice a small cap would otherwise be cut short at every replay.
const MIN_REPLAY_ROOM: u64 = 16 << 20;

/// The records directory of the JVM whose pid in its own namespace is `nspid`, as a path inside
/// that namespace. The daemon prefixes `/proc/PID/root`.
pub fn records_dir(nspid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/.jvm-profiler-{nspid}"))
}

/// The name (below `/tmp`) every fallback records directory of `nspid` starts with.
pub fn fallback_dir_prefix(nspid: u32) -> String {
    format!(".jvm-profiler-{nspid}-")
}

/// The agent's side: appends encoded records, one `write(2)` each.
pub struct Writer {
    dir: PathBuf,
    file: File,
    written: u64,
    /// Size of the generation right after its replay: the cap applies to growth past it, so a
    /// live set bigger than the cap cannot make every replay trigger the next rotation.
    baseline: u64,
    max_bytes: u64,
    header: FileHeader,
    /// Between [`begin_replay`](Self::begin_replay) and [`mark_baseline`](Self::mark_baseline).
    replaying: bool,
}

impl Writer {
    /// Creates (or takes over) `dir` and starts generation 1.
    pub fn create(dir: &Path, pid: u32, started_ns: u64, max_bytes: u64) -> io::Result<Self> {
        prepare_dir(dir)?;
        let header = FileHeader {
            version: VERSION,
            generation: 1,
            pid,
            started_ns,
        };
        let file = match new_generation(dir, &header) {
            // The directory was empty, and a daemon cleaning up after a killed JVM that had
            // this pid removed it just now.
            Err(err) if err.kind() == io::ErrorKind::NotFound => {
                prepare_dir(dir)?;
                new_generation(dir, &header)?
            }
            other => other?,
        };
        Ok(Self {
            dir: dir.to_path_buf(),
            file,
            written: HEADER_LEN as u64,
            baseline: HEADER_LEN as u64,
            max_bytes: max_bytes.max(HEADER_LEN as u64 + 1),
            header,
            replaying: false,
        })
    }

    /// Appends one encoded record. Returns true once the file grew past its cap, i.e. when the
    /// caller should [`rotate`](Self::rotate) and replay. A record past twice the cap is
    /// dropped (error), so a stalled rotation cannot fill the disk. During a replay the cap does
    /// not apply (it is never reported as reached), only a bound of twice the cap but at least
    /// 16 MiB.
    pub fn append(&mut self, bytes: &[u8]) -> io::Result<bool> {
        let twice = self.max_bytes.saturating_mul(2);
        let room = if self.replaying {
            twice.max(MIN_REPLAY_ROOM)
        } else {
            twice
        };
        let limit = self.baseline.saturating_add(room);
        if self.written + bytes.len() as u64 > limit {
            return Err(io::Error::other("records file over its hard cap"));
        }
        // O_APPEND and a single write: a short write only happens when the disk is full.
        let n = self.file.write(bytes)?;
        self.written += n as u64;
        if n != bytes.len() {
            return Err(io::Error::other("short write to the records file"));
        }
        Ok(!self.replaying && self.written > self.baseline.saturating_add(self.max_bytes))
    }

    /// Marks the start of a replay of the live code into this generation: until
    /// [`mark_baseline`](Self::mark_baseline), what is appended is the generation's baseline,
    /// not growth.
    pub fn begin_replay(&mut self) {
        self.replaying = true;
    }

    /// Marks the end of a replay: growth is measured from here.
    pub fn mark_baseline(&mut self) {
        self.baseline = self.written;
        self.replaying = false;
    }

    /// Starts the next generation (empty but for its header).
    pub fn rotate(&mut self) -> io::Result<()> {
        let header = FileHeader {
            generation: self.header.generation.wrapping_add(1),
            ..self.header
        };
        self.file = new_generation(&self.dir, &header)?;
        self.header = header;
        self.written = HEADER_LEN as u64;
        self.baseline = self.written;
        Ok(())
    }

    pub fn generation(&self) -> u32 {
        self.header.generation
    }

    /// Removes the records (at JVM exit).
    pub fn remove(&self) {
        remove_records(&self.dir);
    }

    /// Creates the records of the JVM whose pid (in its namespace) is `pid`: in
    /// [`records_dir`], or, when another user owns that path, in a fresh fallback directory.
    pub fn create_for_pid(pid: u32, started_ns: u64, max_bytes: u64) -> io::Result<Self> {
        let default = records_dir(pid);
        match Self::create(&default, pid, started_ns, max_bytes) {
            Err(refused) if refused.kind() == io::ErrorKind::PermissionDenied => {
                let mut last = io::Error::other("no name tried");
                // A few names, in case one is taken: each is 64 random bits.
                for _ in 0..4 {
                    let dir = PathBuf::from("/tmp").join(format!(
                        "{}{:016x}",
                        fallback_dir_prefix(pid),
                        random_u64()?
                    ));
                    match std::fs::DirBuilder::new().mode(0o700).create(&dir) {
                        Ok(()) => return Self::create(&dir, pid, started_ns, max_bytes),
                        Err(err) => last = err,
                    }
                }
                Err(io::Error::new(
                    last.kind(),
                    format!(
                        "{}: {refused}; and no fallback directory: {last}",
                        default.display()
                    ),
                ))
            }
            other => other,
        }
    }

    /// The records directory this writer writes into.
    pub fn dir(&self) -> &Path {
        &self.dir
    }
}

/// Removes the records files an agent wrote into `dir`, and `dir` if that leaves it empty: for
/// an agent that cannot get at its [`Writer`] at JVM exit (it is busy on a slow file system).
pub fn remove_records(dir: &Path) {
    let _ = std::fs::remove_file(dir.join(RECORDS_FILE));
    let _ = std::fs::remove_file(dir.join(NEXT_FILE));
    let _ = std::fs::remove_dir(dir);
}

fn random_u64() -> io::Result<u64> {
    let mut bytes = [0u8; 8];
    // SAFETY: the buffer is valid for its length.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    if n != bytes.len() as isize {
        return Err(io::Error::last_os_error());
    }
    Ok(u64::from_ne_bytes(bytes))
}

/// Makes `dir` a private directory of ours; refuses one someone else planted (e.g. a symlink
/// in a shared /tmp).
fn prepare_dir(dir: &Path) -> io::Result<()> {
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => return Ok(()),
        Err(err) if err.kind() == io::ErrorKind::AlreadyExists => {}
        Err(err) => return Err(err),
    }
    let meta = std::fs::symlink_metadata(dir)?;
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    if !meta.is_dir() || meta.uid() != euid {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} exists and is not our directory", dir.display()),
        ));
    }
    Ok(())
}

fn new_generation(dir: &Path, header: &FileHeader) -> io::Result<File> {
    let next = dir.join(NEXT_FILE);
    let _ = std::fs::remove_file(&next);
    let mut file = OpenOptions::new()
        .append(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&next)?;
    file.write_all(&header.encode())?;
    std::fs::rename(&next, dir.join(RECORDS_FILE))?;
    Ok(file)
}

/// What a [`Reader::poll`] found.
#[derive(Debug)]
pub enum Update {
    /// A new generation (or a new agent) started: forget everything read before.
    NewGeneration(FileHeader),
    Record(Record),
}

/// Opens the current records file: `Ok(None)` when there is none (yet).
pub type Opener = Box<dyn FnMut() -> io::Result<Option<File>> + Send>;

/// The daemon's side: follows one records file, reading only what was appended since the last
/// poll, and notices generation changes (the path then names a new inode).
///
/// The file is written by a profiled process, so it is untrusted: the daemon passes an
/// [`Opener`] that refuses links, special files and foreign owners, and the reader bounds what
/// it reads per poll and per generation.
pub struct Reader {
    description: PathBuf,
    open: Opener,
    current: Option<Current>,
    pending: Vec<u8>,
    /// Bytes of the current generation read so far, and the bound on them.
    consumed: u64,
    max_generation_bytes: u64,
}

struct Current {
    file: File,
    dev: u64,
    ino: u64,
}

/// Largest read per poll, so one poll's memory and time stay bounded.
const MAX_READ_PER_POLL: u64 = 16 << 20;
/// Default bound on one generation: a replay up to the agent's replay hard cap (twice its
/// default cap), then growth up to its hard cap (twice again), with room to spare.
pub const DEFAULT_MAX_GENERATION_BYTES: u64 = 8 * DEFAULT_MAX_BYTES;

impl Reader {
    /// Follows `path`, opened plainly (tests, tools): the daemon uses [`Reader::with_opener`].
    pub fn new(path: PathBuf) -> Self {
        let open_path = path.clone();
        Self::with_opener(
            path,
            Box::new(move || match File::open(&open_path) {
                Ok(file) => Ok(Some(file)),
                Err(err) if err.kind() == io::ErrorKind::NotFound => Ok(None),
                Err(err) => Err(err),
            }),
            DEFAULT_MAX_GENERATION_BYTES,
        )
    }

    /// Follows the file `open` returns; `description` names it in messages. A generation past
    /// `max_generation_bytes` is an error and is not read further.
    pub fn with_opener(description: PathBuf, open: Opener, max_generation_bytes: u64) -> Self {
        Self {
            description,
            open,
            current: None,
            pending: Vec::new(),
            consumed: 0,
            max_generation_bytes,
        }
    }

    pub fn path(&self) -> &Path {
        &self.description
    }

    /// Reads what is new. No file yet (agent not loaded) is not an error: nothing is returned.
    pub fn poll(&mut self) -> Result<Vec<Update>, ReadError> {
        let mut updates = Vec::new();
        let Some(mut file) = (self.open)().map_err(ReadError::Io)? else {
            return Ok(updates);
        };
        let meta = file.metadata().map_err(ReadError::Io)?;
        let same = self
            .current
            .as_ref()
            .is_some_and(|c| c.dev == meta.dev() && c.ino == meta.ino());
        if !same {
            let mut header = [0u8; HEADER_LEN];
            match file.read_exact(&mut header) {
                Ok(()) => {}
                // Rotation renames a complete header into place; a short file is a race with
                // an agent that is starting up: try again next poll.
                Err(err) if err.kind() == io::ErrorKind::UnexpectedEof => return Ok(updates),
                Err(err) => return Err(ReadError::Io(err)),
            }
            let header = FileHeader::decode(&header).map_err(ReadError::Format)?;
            self.current = Some(Current {
                file,
                dev: meta.dev(),
                ino: meta.ino(),
            });
            self.pending.clear();
            self.consumed = HEADER_LEN as u64;
            updates.push(Update::NewGeneration(header));
        }
        let Some(current) = self.current.as_mut() else {
            return Ok(updates);
        };
        let before = self.pending.len();
        let room = self.max_generation_bytes.saturating_sub(self.consumed);
        let read = (&mut current.file)
            .take(MAX_READ_PER_POLL.min(room + 1))
            .read_to_end(&mut self.pending)
            .map_err(ReadError::Io)?;
        self.consumed += read as u64;
        if self.consumed > self.max_generation_bytes {
            self.pending.clear();
            return Err(ReadError::TooLarge {
                max: self.max_generation_bytes,
            });
        }
        if self.pending.len() == before && updates.is_empty() {
            return Ok(updates);
        }
        let mut offset = 0;
        loop {
            match record::decode(&self.pending[offset..]) {
                Ok(Some((record, used))) => {
                    offset += used;
                    if let Some(record) = record {
                        updates.push(Update::Record(record));
                    }
                }
                Ok(None) => break,
                Err(err) => {
                    // Resynchronising inside a corrupt file is guesswork: drop it and wait
                    // for the next generation.
                    self.pending.clear();
                    let _ = current.file.seek(SeekFrom::End(0));
                    return Err(ReadError::Format(err));
                }
            }
        }
        self.pending.drain(..offset);
        Ok(updates)
    }
}

#[derive(Debug)]
pub enum ReadError {
    Io(io::Error),
    Format(DecodeError),
    /// The generation grew past the reader's bound; it is not read further.
    TooLarge {
        max: u64,
    },
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Io(err) => write!(f, "reading the sidecar records: {err}"),
            Self::Format(err) => write!(f, "sidecar records: {err}"),
            Self::TooLarge { max } => {
                write!(f, "sidecar records: a generation over {max} bytes")
            }
        }
    }
}

impl std::error::Error for ReadError {}

#[cfg(test)]
mod tests {
    use super::*;

    fn unload(code_addr: u64) -> Vec<u8> {
        let mut out = Vec::new();
        record::encode(
            &Record::CompiledMethodUnload {
                method_ptr: 7,
                code_addr,
            },
            &mut out,
        );
        out
    }

    fn addrs(updates: &[Update]) -> Vec<u64> {
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Record(Record::CompiledMethodUnload { code_addr, .. }) => Some(*code_addr),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn the_reader_follows_appends_partial_records_and_rotations() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join(".jvm-profiler-1");
        let mut reader = Reader::new(dir.join(RECORDS_FILE));
        assert!(reader.poll().expect("no file yet").is_empty());

        let one = unload(1);
        let mut writer = Writer::create(&dir, 1, 99, 40 + one.len() as u64).expect("writer");
        let updates = reader.poll().expect("poll");
        assert!(matches!(
            updates[..],
            [Update::NewGeneration(FileHeader {
                generation: 1,
                pid: 1,
                started_ns: 99,
                ..
            })]
        ));

        assert!(!writer.append(&one).expect("append"));
        let two = unload(2);
        // Half a record is held back until the rest arrives.
        writer.file.write_all(&two[..5]).expect("write");
        assert_eq!(addrs(&reader.poll().expect("poll")), [1]);
        writer.file.write_all(&two[5..]).expect("write");
        writer.written += two.len() as u64;
        assert_eq!(addrs(&reader.poll().expect("poll")), [2]);
        assert!(reader.poll().expect("poll").is_empty());

        // Over the cap: the writer asks for a rotation; the reader sees generation 2 only.
        assert!(writer.append(&unload(3)).expect("append"));
        writer.rotate().expect("rotate");
        writer.append(&unload(4)).expect("append");
        let updates = reader.poll().expect("poll");
        assert!(matches!(
            updates[0],
            Update::NewGeneration(FileHeader { generation: 2, .. })
        ));
        assert_eq!(addrs(&updates), [4]);
    }

    #[test]
    fn the_writer_stops_at_twice_the_cap() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("r");
        let record = unload(1);
        let mut writer = Writer::create(&dir, 1, 0, 64).expect("writer");
        let mut accepted = 0;
        while writer.append(&record).is_ok() {
            accepted += 1;
            assert!(accepted < 100);
        }
        let size = std::fs::metadata(dir.join(RECORDS_FILE))
            .expect("meta")
            .len();
        // The cap bounds growth past the header: at most the header and twice the cap.
        let hard_cap = crate::record::HEADER_LEN as u64 + 2 * 64;
        assert!(size <= hard_cap && size > hard_cap / 2, "{size}");
        assert_eq!(writer.generation(), 1);
    }

    #[test]
    fn a_replay_larger_than_the_cap_is_kept_whole_and_growth_is_capped_after_it() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("r");
        let record = unload(1);
        let mut writer = Writer::create(&dir, 1, 0, 64).expect("writer");
        writer.begin_replay();
        // Ten times the cap: kept, and never reported as a full generation.
        for _ in 0..(640 / record.len() + 1) {
            assert_eq!(writer.append(&record).ok(), Some(false));
        }
        writer.mark_baseline();
        let baseline = writer.written;
        let mut accepted = 0;
        let mut full = false;
        while let Ok(now_full) = writer.append(&record) {
            full |= now_full;
            accepted += 1;
            assert!(accepted < 100);
        }
        assert!(full, "growth past the cap asks for a rotation");
        let size = std::fs::metadata(dir.join(RECORDS_FILE))
            .expect("meta")
            .len();
        assert!(size <= baseline + 2 * 64 && size > baseline + 64, "{size}");
    }

    #[test]
    fn a_planted_symlink_is_refused() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = tmp.path().join("planted");
        std::os::unix::fs::symlink(tmp.path(), &dir).expect("symlink");
        assert!(Writer::create(&dir, 1, 0, 1024).is_err());
    }
}
