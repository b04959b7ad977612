//! What the sidecar agent recorded in one JVM, indexed by code address and kept current from its
//! records file (read incrementally, at most every [`REFRESH_EVERY`]).
//!
//! A name source of [`crate::java_names`]: this module only parses the agent's records into
//! [`RecordedNmethod`]s (names normalised as memory's are); which frames they name, and how they
//! are checked against the JVM's memory, is the naming policy's business. The agent's inline
//! chains and line tables were resolved by the JVM itself when the code was installed, so they
//! stay right after the class metadata moves or is freed.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use profiler_jvmti_records::channel::{ReadError, Reader, Update};
use profiler_jvmti_records::record::{self, AgentStats, Record};

use super::records_location::RecordsLocation;
use crate::java_names::{internal_of_signature, MethodInfo, RecordedNmethod};
use crate::untrusted::Refused;

const REFRESH_EVERY: Duration = Duration::from_millis(250);
/// Until a records file shows up (most JVMs never load the agent), look less often: each look
/// resolves a path through /proc/PID/root.
const LOOK_FOR_AGENT_EVERY: Duration = Duration::from_secs(2);
/// Bound on indexed nmethods per JVM (a code cache holds far fewer).
const MAX_NMETHODS: usize = 500_000;

/// The sidecar view of one JVM.
pub struct SidecarIndex {
    reader: Reader,
    /// Where the records are (shared with the reader's opener).
    location: Arc<Mutex<RecordsLocation>>,
    nmethods: HashMap<u64, Arc<RecordedNmethod>>,
    last_refresh: Option<Instant>,
    /// Whether any records file was seen: the agent is (or was) loaded.
    pub active: bool,
    /// The agent's latest stats record, and how many of its dropped records were counted.
    stats: Option<AgentStats>,
    drops_counted: u64,
    /// Why the last poll failed (a reason label), until one succeeds.
    refused: Option<&'static str>,
    /// The agent's latest status record.
    status: Option<record::AgentStatus>,
    /// Java thread names by native thread id (kept across generations: each replays them), and
    /// listed threads waiting for theirs.
    pub threads: super::threads::ThreadNames,
}

/// Every label [`SidecarIndex::refused`] can give.
pub const REFUSAL_REASONS: [&str; 8] = [
    "link",
    "not_regular",
    "wrong_owner",
    "too_large",
    "user_filesystem",
    "io_error",
    "malformed",
    "not_found",
];

/// The metric label for a failed poll: the open's refusal, else the kind of read error.
fn refusal_reason(err: &ReadError) -> &'static str {
    match err {
        ReadError::Io(io) => io
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<Refused>())
            .map_or("io_error", Refused::reason),
        ReadError::Format(_) => "malformed",
        ReadError::TooLarge { .. } => "too_large",
    }
}

impl SidecarIndex {
    /// For host pid `pid`, whose pid in its own namespace is `nspid` and whose effective uid
    /// (the owner the agent's files must have) is `euid`.
    pub fn new(pid: u32, nspid: u32, euid: u32) -> Self {
        // What logs call the file: the pid's directory or a fallback next to it.
        let description = PathBuf::from(format!(
            "/proc/{pid}/root{}[-*]/{}",
            profiler_jvmti_records::channel::records_dir(nspid).display(),
            profiler_jvmti_records::channel::RECORDS_FILE
        ));
        let max = profiler_jvmti_records::channel::DEFAULT_MAX_GENERATION_BYTES;
        let location = Arc::new(Mutex::new(RecordsLocation::new(pid, nspid, euid)));
        let opener = Arc::clone(&location);
        let open = move || match opener.lock() {
            Ok(mut location) => location.open(max).map_err(std::io::Error::other),
            Err(_) => Ok(None),
        };
        Self {
            reader: Reader::with_opener(description, Box::new(open), max),
            location,
            nmethods: HashMap::new(),
            last_refresh: None,
            active: false,
            stats: None,
            drops_counted: 0,
            refused: None,
            status: None,
            threads: super::threads::ThreadNames::new(pid, nspid),
        }
    }

    /// The JVM exited: removes the records its agent left if it was killed
    /// ([`RecordsLocation::remove_left_behind`]).
    pub fn jvm_exited(&self) {
        if let Ok(location) = self.location.lock() {
            location.remove_left_behind();
        }
    }

    /// Whether the records were never looked for: an agent loaded before the daemon met the
    /// JVM (`-agentpath`, or a previous daemon's attach) is found by the first look.
    pub fn never_read(&self) -> bool {
        self.last_refresh.is_none()
    }

    /// Reads what the agent appended since the last call (rate-limited).
    pub fn refresh(&mut self) {
        let every = if self.active {
            REFRESH_EVERY
        } else {
            LOOK_FOR_AGENT_EVERY
        };
        if self.last_refresh.is_some_and(|at| at.elapsed() < every) {
            return;
        }
        self.last_refresh = Some(Instant::now());
        let updates = match self.reader.poll() {
            Ok(updates) => {
                self.refused = None;
                updates
            }
            Err(err) => {
                let reason = refusal_reason(&err);
                if self.refused != Some(reason) {
                    tracing::warn!(
                        path = %self.reader.path().display(),
                        %err,
                        reason,
                        "sidecar records not read (frames are named from the JVM's memory)"
                    );
                }
                self.refused = Some(reason);
                return;
            }
        };
        for update in updates {
            self.apply(update);
        }
    }

    fn apply(&mut self, update: Update) {
        match update {
            Update::NewGeneration(header) => {
                // A new generation replays all live code: start over.
                tracing::debug!(generation = header.generation, "sidecar records generation");
                self.nmethods.clear();
                self.active = true;
            }
            Update::Record(Record::CompiledMethodLoad(compiled)) => {
                if self.nmethods.len() >= MAX_NMETHODS {
                    return;
                }
                let code_addr = compiled.code_addr;
                self.nmethods.insert(code_addr, Arc::new(convert(compiled)));
            }
            Update::Record(Record::CompiledMethodUnload { code_addr, .. }) => {
                self.nmethods.remove(&code_addr);
            }
            Update::Record(Record::AgentStats(stats)) => {
                if stats.records_dropped > self.stats.map_or(0, |s| s.records_dropped) {
                    tracing::warn!(
                        path = %self.reader.path().display(),
                        dropped = stats.records_dropped,
                        written = stats.records_written,
                        "the sidecar agent could not write some records (is the JVM's /tmp full?)"
                    );
                }
                self.stats = Some(stats);
            }
            Update::Record(Record::AgentStatus(status)) => {
                // Written at start and in every generation: say it once per change.
                if self.status.as_ref() != Some(&status) {
                    let path = self.reader.path().display();
                    if !status.recording() {
                        tracing::warn!(
                            %path,
                            error = %status.error,
                            jvm = %status.jvm_version,
                            "the sidecar agent is loaded but inert: frames are named from memory"
                        );
                    } else if status.flags & record::STATUS_METHOD_PTRS == 0 {
                        tracing::info!(
                            %path,
                            jvm = %status.jvm_version,
                            "the sidecar agent does not know this JVM version: its records are \
                             not matched to compiled frames, which are named from memory"
                        );
                    }
                    self.status = Some(status);
                }
            }
            Update::Record(Record::ThreadStart { tid, name }) => self.threads.started(tid, &name),
            Update::Record(Record::ThreadEnd { tid }) => self.threads.ended(tid),
            Update::Record(Record::LiveThread { java_thread, name }) => {
                self.threads.listed(java_thread, &name, Instant::now())
            }
            Update::Record(_) => {}
        }
    }

    /// The nmethod whose code starts at `code_begin`, if the agent reported it.
    pub fn nmethod(&self, code_begin: u64) -> Option<&Arc<RecordedNmethod>> {
        self.nmethods.get(&code_begin)
    }

    pub fn len(&self) -> usize {
        self.nmethods.len()
    }

    /// Why the records were last not read, if they were not (a metric label).
    pub fn refused(&self) -> Option<&'static str> {
        self.refused
    }

    /// The agent's latest report of itself, if it sent one.
    pub fn agent_stats(&self) -> Option<AgentStats> {
        self.stats
    }

    /// Records the agent dropped since the last call.
    pub fn take_new_drops(&mut self) -> u64 {
        let dropped = self.stats.map_or(0, |s| s.records_dropped);
        let new = dropped.saturating_sub(self.drops_counted);
        self.drops_counted = self.drops_counted.max(dropped);
        new
    }
}

fn convert(compiled: record::CompiledMethod) -> RecordedNmethod {
    let method_ptr = compiled.methods.first().map_or(0, |m| m.method_ptr);
    let methods = compiled
        .methods
        .into_iter()
        .map(|m| Arc::new(method_info(m)))
        .collect();
    let mut pcs: Vec<(u32, Vec<(u32, i32)>)> = compiled
        .pcs
        .into_iter()
        .filter_map(|pc| {
            let offset = u32::try_from(pc.pc.checked_sub(compiled.code_addr)?).ok()?;
            Some((
                offset,
                pc.frames.into_iter().map(|f| (f.method, f.bci)).collect(),
            ))
        })
        .collect();
    pcs.sort_by_key(|(offset, _)| *offset);
    RecordedNmethod {
        method_ptr,
        code_size: compiled.code_size,
        methods,
        pcs,
    }
}

/// The agent's JVM-form names (`Ljava/lang/Thread;`) as every name source gives them.
fn method_info(m: record::MethodInfo) -> MethodInfo {
    MethodInfo::from_internal(
        internal_of_signature(&m.class_signature),
        m.name,
        m.signature,
        Some(&m.source_file),
        m.lines.iter().map(|e| (e.bci, e.line)).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use profiler_jvmti_records::record::{CompiledMethod, InlineFrame, LineEntry, PcInfo};

    fn method(name: &str, line: u32) -> record::MethodInfo {
        record::MethodInfo {
            method_ptr: 0x100,
            class_signature: "Lcom/example/Work;".into(),
            name: name.into(),
            signature: "()V".into(),
            source_file: "Work.java".into(),
            lines: vec![LineEntry { bci: 0, line }],
        }
    }

    #[test]
    fn chains_are_found_by_pc_offset_with_jvm_names_made_readable() {
        let mut index = SidecarIndex::new(1, 1, 0);
        index.apply(Update::Record(Record::CompiledMethodLoad(CompiledMethod {
            code_addr: 0x1000,
            code_size: 0x100,
            methods: vec![method("outer", 10), method("inner", 20)],
            pcs: vec![
                PcInfo {
                    pc: 0x1040,
                    frames: vec![
                        InlineFrame { method: 1, bci: 3 },
                        InlineFrame { method: 0, bci: 7 },
                    ],
                },
                PcInfo {
                    pc: 0x1010,
                    frames: vec![InlineFrame { method: 0, bci: 1 }],
                },
            ],
        })));
        let nmethod = index.nmethod(0x1000).expect("indexed");
        assert_eq!(nmethod.method_ptr, 0x100);
        let root = nmethod.root().expect("root");
        assert_eq!(root.class, "com.example.Work");
        assert_eq!(root.file.as_deref(), Some("com/example/Work.java"));
        // A sampled pc inside the region the record at 0x40 ends.
        let chain = nmethod.chain(0x20, true);
        let names: Vec<_> = chain
            .iter()
            .map(|(m, bci)| (m.name.as_str(), *bci))
            .collect();
        assert_eq!(names, [("inner", 3), ("outer", 7)]);
        // A return address matches exactly.
        assert_eq!(nmethod.chain(0x10, false)[0].0.name, "outer");
        assert!(nmethod.chain(0x41, true).is_empty());

        index.apply(Update::Record(Record::CompiledMethodUnload {
            method_ptr: 0x100,
            code_addr: 0x1000,
        }));
        assert!(index.nmethod(0x1000).is_none());
    }
}
