//! The symbolized profile: one process's stacks of one interval, named once, with typed
//! frames. The worker builds it (`crate::profiles`) and every output is an encoder of it: the
//! pprof files and the live stream (`crate::pprof::encode`), Pyroscope and OTLP (of its remote
//! variant, `crate::remote_variant`). Names here are as their sources gave them: suffixes
//! (`_[j]`) are only added where a name is written for people.

use std::sync::Arc;
use std::time::{Duration, SystemTime};

pub use crate::frame_kind::FrameKind;
use crate::resolved_frame::ResolvedFrame;
pub use crate::resolved_frame::SourceLine;

/// Which profile a set of stacks makes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProfileKind {
    /// Where threads run: CPU-clock samples.
    Cpu,
    /// Where threads wait, and how long (`crate::off_cpu`).
    OffCpu,
    /// Where Java threads allocate, and how much (`crate::alloc`).
    Alloc,
    /// Where Java threads wait to enter contended monitors (`crate::lock`).
    Mutex,
    /// Where Java threads are parked (`crate::lock`).
    Block,
}

impl ProfileKind {
    pub const ALL: [Self; 5] = [
        Self::Cpu,
        Self::OffCpu,
        Self::Alloc,
        Self::Mutex,
        Self::Block,
    ];

    /// How local file names start: `cpu-...`, `offcpu-...`, `alloc-...`.
    pub const fn file_prefix(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::OffCpu => "offcpu",
            Self::Alloc => "alloc",
            Self::Mutex => "mutex",
            Self::Block => "block",
        }
    }

    /// Pyroscope's `__name__` for it (the names its own eBPF, OTLP and JFR ingestion use).
    pub const fn pyroscope_name(self) -> &'static str {
        match self {
            Self::Cpu => "process_cpu",
            Self::OffCpu => "off_cpu",
            Self::Alloc => "memory",
            Self::Mutex => "mutex",
            Self::Block => "block",
        }
    }

    /// For titles (flame graphs).
    pub const fn title(self) -> &'static str {
        match self {
            Self::Cpu => "CPU",
            Self::OffCpu => "Off-CPU",
            Self::Alloc => "Allocation",
            Self::Mutex => "Monitor contention",
            Self::Block => "Parked",
        }
    }

    /// What a flame graph of it counts (see `output::flamegraph`).
    pub const fn counted(self) -> &'static str {
        match self {
            Self::Cpu => "samples",
            Self::OffCpu => "ns blocked",
            Self::Alloc => "bytes",
            Self::Mutex | Self::Block => "ns waited",
        }
    }

    /// The kind whose files start with `prefix`.
    pub fn from_file_prefix(prefix: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.file_prefix() == prefix)
    }

    /// The kind Pyroscope calls `name`.
    pub fn from_pyroscope_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|kind| kind.pyroscope_name() == name)
    }
}

/// The sample types of allocation profiles, as Pyroscope names them for JFR's allocation events.
pub const ALLOC_IN_NEW_TLAB_OBJECTS: &str = "alloc_in_new_tlab_objects";
pub const ALLOC_IN_NEW_TLAB_BYTES: &str = "alloc_in_new_tlab_bytes";
pub const ALLOC_OUTSIDE_TLAB_OBJECTS: &str = "alloc_outside_tlab_objects";
pub const ALLOC_OUTSIDE_TLAB_BYTES: &str = "alloc_outside_tlab_bytes";
/// The time sample type of lock profiles.
pub const LOCK_DELAY: &str = "delay";

/// The most values a sample has (allocation and off-CPU profiles' four).
pub const MAX_VALUES: usize = 4;

/// One frame of a stack: what ran, where, and the functions it ran (more than one when calls
/// were inlined into it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Frame {
    pub kind: FrameKind,
    /// Innermost first: every line but the last is a function inlined into the last one (see
    /// [`FrameKind::of_line`]). Never empty.
    pub lines: Vec<SourceLine>,
    /// The file the code is in (its path in the process's namespace), if any.
    pub module: Option<Arc<str>>,
    /// That file's GNU build-id in hex, as the file claims it.
    pub build_id: Option<Arc<str>>,
    /// The sampled address for native and kernel frames; 0 for Java frames (their code has no
    /// address of its own in the process's mappings) and markers.
    pub address: u64,
}

impl Frame {
    pub fn new(kind: FrameKind, address: u64, resolved: ResolvedFrame) -> Self {
        let ResolvedFrame {
            lines,
            module,
            build_id,
        } = resolved;
        Self {
            kind,
            lines,
            module,
            build_id,
            address,
        }
    }

    /// A frame with a name only: the profile's markers and roots.
    pub fn marker(kind: FrameKind, name: impl Into<String>) -> Self {
        Self::new(kind, 0, ResolvedFrame::named(name, None))
    }

    /// The lines with the kind each is shown with, innermost first.
    pub fn typed_lines(&self) -> impl Iterator<Item = (FrameKind, &SourceLine)> {
        let count = self.lines.len();
        self.lines
            .iter()
            .enumerate()
            .map(move |(position, line)| (self.kind.of_line(position, count), line))
    }
}

/// A frame's index in its profile's [`SymbolizedProfile::frames`].
pub type FrameId = u32;

/// What a thread was in when it left the CPU (off-CPU samples).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WaitState {
    /// The scheduler's task state: `runnable`, `sleeping`, `uninterruptible`, `other`.
    pub task_state: &'static str,
    /// The JVM's state of a Java thread (`blocked`, `parked`...), when known.
    pub java_state: Option<&'static str>,
}

/// One stack and what it weighs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sample {
    /// Innermost first.
    pub frames: Vec<FrameId>,
    /// One value per sample type of the profile's kind, in [`SampleTypes::values`]' order;
    /// the rest 0.
    pub values: [i64; MAX_VALUES],
    /// The thread it ran on ([`SymbolizedProfile::threads`]); `None` once threads are merged.
    pub thread: Option<u32>,
    pub wait: Option<WaitState>,
}

/// Where a thread's name in a profile comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NameSource {
    /// The full Java name, from the sidecar agent.
    Sidecar,
    /// The kernel's `comm`, at most 15 bytes.
    Comm,
}

impl NameSource {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sidecar => "sidecar",
            Self::Comm => "comm",
        }
    }
}

/// A thread samples were taken on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleThread {
    /// In the initial pid namespace.
    pub tid: u32,
    /// Printable ([`crate::printable`]).
    pub name: String,
    pub source: NameSource,
    /// The virtual thread it ran (its `java.lang.Thread` id), mounted or unmounting: a
    /// carrier is one entry per virtual thread it ran.
    pub virtual_thread: Option<u64>,
}

/// One process's profile of one interval, symbolized.
#[derive(Clone, Debug)]
pub struct SymbolizedProfile {
    pub kind: ProfileKind,
    pub pid: u32,
    /// The process's name, printable ([`crate::printable`]).
    pub comm: String,
    pub start: SystemTime,
    pub duration: Duration,
    /// What one sample stands for, in the unit of [`SampleTypes::period_type`]: nanoseconds
    /// between CPU samples, bytes between allocation samples, 1 lock event; 0 for off-CPU
    /// profiles (waits are measured, not sampled at a rate).
    pub period: i64,
    /// Shared with its variants: the remote one adds frames only when it roots stacks at
    /// their threads.
    pub frames: Arc<Vec<Frame>>,
    pub samples: Vec<Sample>,
    pub threads: Vec<SampleThread>,
}

impl SymbolizedProfile {
    /// An empty profile of `kind` for process `pid`.
    pub fn new(kind: ProfileKind, pid: u32, start: SystemTime, duration: Duration) -> Self {
        Self {
            kind,
            pid,
            comm: String::new(),
            start,
            duration,
            period: 0,
            frames: Arc::default(),
            samples: Vec::new(),
            threads: Vec::new(),
        }
    }

    /// Adds a frame (the caller makes each distinct frame once); copies the frames first if a
    /// variant shares them.
    pub fn add_frame(&mut self, frame: Frame) -> FrameId {
        let frames = Arc::make_mut(&mut self.frames);
        frames.push(frame);
        FrameId::try_from(frames.len() - 1).unwrap_or(FrameId::MAX)
    }

    pub fn add_thread(&mut self, thread: SampleThread) -> u32 {
        self.threads.push(thread);
        u32::try_from(self.threads.len() - 1).unwrap_or(u32::MAX)
    }

    /// When the interval started, in nanoseconds since the Unix epoch (0 before it), and how
    /// long it lasted: what both encoders' messages carry.
    pub fn start_and_duration_nanos(&self) -> (u64, u64) {
        let start = self
            .start
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_nanos()).unwrap_or(u64::MAX)
            });
        let duration = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
        (start, duration)
    }

    pub fn frame(&self, id: FrameId) -> Option<&Frame> {
        self.frames.get(id as usize)
    }

    pub fn thread(&self, sample: &Sample) -> Option<&SampleThread> {
        self.threads.get(sample.thread? as usize)
    }

    /// About how many bytes the profile holds: what export queues bound.
    pub fn approximate_bytes(&self) -> usize {
        let line_bytes = |line: &SourceLine| {
            let texts = [line.system_name.as_deref(), line.file.as_deref()];
            line.function.len() + texts.iter().flatten().map(|text| text.len()).sum::<usize>() + 16
        };
        let frames: usize = self
            .frames
            .iter()
            .map(|frame| frame.lines.iter().map(line_bytes).sum::<usize>() + 48)
            .sum();
        let samples: usize = self
            .samples
            .iter()
            .map(|sample| sample.frames.len() * 4 + std::mem::size_of::<Sample>())
            .sum();
        frames + samples
    }

    /// The profile with its frames (shared) but no sample or thread: what a variant starts
    /// from.
    pub fn frames_only(&self) -> Self {
        Self {
            kind: self.kind,
            pid: self.pid,
            comm: self.comm.clone(),
            start: self.start,
            duration: self.duration,
            period: self.period,
            frames: self.frames.clone(),
            samples: Vec::new(),
            threads: Vec::new(),
        }
    }
}

/// A sample type: what a value measures and in what unit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ValueType {
    pub name: &'static str,
    pub unit: &'static str,
}

const fn value_type(name: &'static str, unit: &'static str) -> ValueType {
    ValueType { name, unit }
}

/// What a profile kind's samples hold.
#[derive(Clone, Copy, Debug)]
pub struct SampleTypes {
    pub values: &'static [ValueType],
    /// The one viewers show first.
    pub default: usize,
    /// What [`SymbolizedProfile::period`] counts, when it means something.
    pub period_type: Option<ValueType>,
}

const CPU: [ValueType; 2] = [
    value_type("samples", "count"),
    value_type("cpu", "nanoseconds"),
];
/// Time blocked (the type Pyroscope's `off_cpu` profiles carry), time runnable but waiting for
/// a CPU, the waits sampled and the waits they stand for.
const OFF_CPU: [ValueType; 4] = [
    value_type("off_cpu", "nanoseconds"),
    value_type("runqueue", "nanoseconds"),
    value_type("samples", "count"),
    value_type("waits", "count"),
];
/// The names and order of Pyroscope's `memory` profiles from JFR, so Grafana's views apply.
const ALLOC: [ValueType; 4] = [
    value_type(ALLOC_IN_NEW_TLAB_OBJECTS, "count"),
    value_type(ALLOC_IN_NEW_TLAB_BYTES, "bytes"),
    value_type(ALLOC_OUTSIDE_TLAB_OBJECTS, "count"),
    value_type(ALLOC_OUTSIDE_TLAB_BYTES, "bytes"),
];
const LOCK: [ValueType; 2] = [
    value_type("contentions", "count"),
    value_type(LOCK_DELAY, "nanoseconds"),
];

impl ProfileKind {
    /// The sample types of profiles of this kind. Lock profiles' period type is `mutex` or
    /// `block` (`/count`), the names Pyroscope gives JFR's monitor and park events.
    pub const fn sample_types(self) -> SampleTypes {
        match self {
            Self::Cpu => SampleTypes {
                values: &CPU,
                default: 1,
                period_type: Some(CPU[1]),
            },
            Self::OffCpu => SampleTypes {
                values: &OFF_CPU,
                default: 0,
                period_type: None,
            },
            Self::Alloc => SampleTypes {
                values: &ALLOC,
                default: 1,
                period_type: Some(value_type("space", "bytes")),
            },
            Self::Mutex | Self::Block => SampleTypes {
                values: &LOCK,
                default: 1,
                period_type: Some(value_type(self.pyroscope_name(), "count")),
            },
        }
    }
}

/// Profiles made by hand, for the tests of the encoders and outputs.
#[cfg(test)]
pub(crate) mod testing {
    use super::*;

    /// A stack's native frames named innermost first, its samples count, and the thread
    /// (name, tid) it ran on if any.
    pub(crate) type Stack<'a> = (&'a [&'a str], i64, Option<(&'a str, u32)>);

    /// A CPU profile at 100 Hz of a Java stack: a JIT frame with a method inlined
    /// (`Work.inner` into `Work.outer`), under an interpreted `Main.main`; sampled 3 times on
    /// thread 42 (`worker-1`, named by the sidecar agent) of `java`, pid 7.
    pub(crate) fn java_profile() -> SymbolizedProfile {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut profile =
            SymbolizedProfile::new(ProfileKind::Cpu, 7, start, Duration::from_secs(15));
        profile.comm = "java".into();
        profile.period = 10_000_000;
        let line = |function: &str, line| SourceLine {
            function: function.into(),
            system_name: None,
            file: Some("Work.java".into()),
            line,
        };
        let jit = profile.add_frame(Frame {
            kind: FrameKind::Jit,
            lines: vec![line("Work.inner", 7), line("Work.outer", 3)],
            module: None,
            build_id: None,
            address: 0,
        });
        let main = profile.add_frame(Frame::marker(FrameKind::Interpreted, "Main.main"));
        let thread = profile.add_thread(SampleThread {
            tid: 42,
            name: "worker-1".into(),
            source: NameSource::Sidecar,
            virtual_thread: None,
        });
        profile.samples.push(Sample {
            frames: vec![jit, main],
            values: [3, 30_000_000, 0, 0],
            thread: Some(thread),
            wait: None,
        });
        profile
    }

    /// A CPU profile at 100 Hz of `stacks`. Frames of one name are one frame.
    pub(crate) fn cpu_profile(stacks: &[Stack<'_>]) -> SymbolizedProfile {
        let mut profile = SymbolizedProfile::new(
            ProfileKind::Cpu,
            1,
            SystemTime::now(),
            Duration::from_secs(1),
        );
        profile.comm = "x".into();
        profile.period = 10_000_000;
        let mut ids: Vec<(String, FrameId)> = Vec::new();
        for &(names, count, thread) in stacks {
            let frames = names
                .iter()
                .map(|name| match ids.iter().find(|(known, _)| known == name) {
                    Some((_, id)) => *id,
                    None => {
                        let id = profile.add_frame(Frame::marker(FrameKind::Native, *name));
                        ids.push((name.to_string(), id));
                        id
                    }
                })
                .collect();
            let thread = thread.map(|(name, tid)| {
                profile.add_thread(SampleThread {
                    tid,
                    name: name.into(),
                    source: NameSource::Comm,
                    virtual_thread: None,
                })
            });
            profile.samples.push(Sample {
                frames,
                values: [count, count * profile.period, 0, 0],
                thread,
                wait: None,
            });
        }
        profile
    }
}
