//! Turns one process's folded stacks into a symbolized pprof profile: the one local files and
//! the live stream get, and each other sink derives its own from (Pyroscope's:
//! `export::pyroscope::profile`).
//!
//! # Threads
//!
//! Stacks are folded per thread (tid), so every sample names one thread: by its full Java name
//! when the sidecar agent reported it and the sampled `comm` confirms it
//! ([`crate::sidecar::threads`]), else by `comm` (15 bytes at most).
//!
//! - Local files and the live stream ([`build`]) carry string labels `pid`, `comm`,
//!   `thread_name`, `thread_name_source` (`sidecar` or `comm`) and a numeric label `thread_id`
//!   (host tid). The stream's subscribers get one process's profiles, not series.
//! - Pyroscope (`export::pyroscope::profile`) gets no sample labels: Pyroscope makes one series per
//!   distinct set of string sample labels, so a thread name, a pid or a tid there would make a
//!   series per thread and per restart. By default stacks are merged across threads, as
//!   Pyroscope's own agents push them; the `threads` setting ([`crate::thread_roots::ThreadRoots`]) roots each stack
//!   at its thread's pool or at the thread instead. Samples whose stacks are then equal are
//!   merged into one.

use std::time::{Duration, SystemTime};

use hashbrown::HashMap;

use profiler_common::{JavaState, SampleKind, UnwindEnd};

pub use crate::aggregate::ProfileKind;
use crate::aggregate::{whole_events, ProcessStacks};
use crate::pprof::{proto, Label, LocationKey, ProfileBuilder};
use crate::printable::printable;
use crate::process::ProcessTable;
use crate::record::comm_to_string;
use crate::sidecar::threads::NameSource;
use crate::symbolize::symbolizers::Symbolizers;
use crate::symbolize::symbolizers::{user_frame_key, UserFrameKey};
use crate::symbolize::ResolvedFrame;

/// The `state` label of an off-CPU sample: what the thread was doing when it left the CPU (the
/// scheduler's task state).
fn wait_state_label(task_state: u8) -> &'static str {
    match task_state {
        0 => "runnable",
        state if state & 1 != 0 => "sleeping",
        state if state & 2 != 0 => "uninterruptible",
        _ => "other",
    }
}

pub struct ProfileRequest<'a> {
    pub kind: ProfileKind,
    pub pid: u32,
    pub stacks: &'a ProcessStacks,
    pub frequency_hz: u64,
    /// Allocation profiles' sampling interval (their period).
    pub alloc_interval_bytes: u64,
    pub start: SystemTime,
    pub duration: Duration,
}

pub struct BuiltProfile {
    pub pid: u32,
    /// The process's name, printable ([`crate::printable`]).
    pub comm: String,
    /// The profile of the local files (see the module documentation).
    pub profile: proto::Profile,
    /// The thread of each of `profile.sample`, in order.
    pub threads: Vec<SampleThread>,
}

/// The thread a sample was taken on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SampleThread {
    /// In the initial pid namespace.
    pub tid: u32,
    pub name: String,
    pub source: NameSource,
}

pub fn build(
    request: ProfileRequest<'_>,
    processes: &mut ProcessTable,
    symbolizers: &mut Symbolizers,
) -> BuiltProfile {
    let ProfileRequest {
        kind,
        pid,
        stacks,
        frequency_hz,
        alloc_interval_bytes,
        start,
        duration,
    } = request;

    let frames = symbolizers.prepare(pid, stacks, processes);
    let thread_comm = stacks
        .stacks()
        .next()
        .map(|(view, _)| comm_to_string(view.thread_name()));

    // Shown as is in file names, flame graph titles and the service-name fallback, hence
    // printable here; every string inside the profile is made so by the builder.
    let comm = processes
        .get(pid)
        .map(|info| info.comm.clone())
        .or(thread_comm)
        .map(|comm| printable(&comm).into_owned())
        .unwrap_or_default();
    let pid_label = pid.to_string();
    // Each thread is named once per profile.
    let mut thread_names: HashMap<(u32, [u8; profiler_common::COMM_LEN]), SampleThread> =
        HashMap::new();
    let mut threads = Vec::with_capacity(stacks.distinct_stacks());

    let mut builder = match kind {
        ProfileKind::Cpu => ProfileBuilder::new_cpu(frequency_hz, start, duration),
        ProfileKind::OffCpu => ProfileBuilder::new_off_cpu(start, duration),
        ProfileKind::Alloc => ProfileBuilder::new_alloc(alloc_interval_bytes, start, duration),
        ProfileKind::Mutex | ProfileKind::Block => {
            ProfileBuilder::new_lock(kind.pyroscope_name(), start, duration)
        }
    };
    // Locations whose frames include `Unsafe.park`: block profiles keep only the stacks
    // through one.
    let mut park_locations = hashbrown::HashSet::new();
    // The process's stacks, then what it had past its memory share (`crate::stack_memory`).
    let past_bound = stacks
        .past_bound()
        .map(|(view, totals)| (view, totals, true));
    for (view, totals, is_past_bound) in stacks
        .stacks()
        .map(|(view, totals)| (view, totals, false))
        .chain(past_bound)
    {
        if is_past_bound && kind == ProfileKind::Block {
            // Its waits cannot be told parked or not; counted in the metrics only.
            continue;
        }
        let mut locations = Vec::with_capacity(
            view.header.kernel_frames as usize + view.header.user_frames as usize + 1,
        );
        for ip in view.kernel_ips() {
            let annotate = symbolizers.annotate;
            locations.push(
                builder.location_with(LocationKey::Kernel(ip), ip, || frames.kernel(ip, annotate)),
            );
        }
        for (index, user) in view.user_frames().enumerate() {
            let key = user_frame_key(index, &user);
            let (location, address) = location_of(key);
            // Named once per location of the profile, as it shows them (not per sample).
            let mut parks = false;
            let id = builder.location_with(location, address, || {
                let frame = frames.user(symbolizers, key, &user);
                parks = kind == ProfileKind::Block
                    && frame
                        .lines
                        .iter()
                        .any(|line| crate::lock::is_park(&line.function));
                frame
            });
            if parks {
                park_locations.insert(id);
            }
            locations.push(id);
        }
        if kind == ProfileKind::Block && !locations.iter().any(|id| park_locations.contains(id)) {
            // Blocked, but not parked: `Thread.sleep`, a safepoint.
            continue;
        }
        if is_past_bound {
            let frame = ResolvedFrame::named(PAST_BOUND_FRAME.to_owned(), None);
            locations.push(builder.location(LocationKey::Marker(PAST_BOUND_MARKER), 0, &frame));
        }
        if let Some(marker) = truncation_marker(view.user_end()) {
            let frame = ResolvedFrame::named(format!("[truncated: {}]", marker.name()), None);
            locations.push(builder.location(LocationKey::Marker(marker as u8), 0, &frame));
        }
        let tid = view.header.tid;
        let thread = thread_names
            .entry((tid, *view.thread_name()))
            .or_insert_with(|| {
                let comm = comm_to_string(view.thread_name());
                let (name, source) = match symbolizers.java.thread_names(pid) {
                    Some(names) => names.name_of(tid, &comm),
                    None => (comm, NameSource::Comm),
                };
                SampleThread { tid, name, source }
            });
        let labels = vec![
            Label::Str("pid", &pid_label),
            Label::Str("comm", &comm),
            Label::Str("thread_name", &thread.name),
            Label::Str("thread_name_source", thread.source.as_str()),
            Label::Num {
                key: "thread_id",
                value: i64::from(tid),
                unit: "",
            },
        ];
        add_sample(kind, &mut builder, locations, (&view, &totals), labels);
        threads.push(thread.clone());
    }
    BuiltProfile {
        pid,
        comm,
        profile: builder.finish(),
        threads,
    }
}

/// The pprof location of a user frame, and its address (0 for Java frames, which have none of
/// their own in the process's mappings).
fn location_of(key: UserFrameKey) -> (LocationKey, u64) {
    match key {
        UserFrameKey::Native(addr) => (LocationKey::User(addr), addr),
        UserFrameKey::Java {
            kind,
            addr,
            aux,
            cookie,
            top,
        } => (
            LocationKey::Java {
                kind,
                addr,
                aux,
                cookie,
                top,
            },
            0,
        ),
    }
}

/// Adds one stack's sample with the values of the profile's kind.
fn add_sample(
    kind: ProfileKind,
    builder: &mut ProfileBuilder,
    locations: Vec<u64>,
    (view, totals): (
        &crate::record::SampleView<'_>,
        &crate::aggregate::StackTotals,
    ),
    labels: Vec<Label<'_>>,
) {
    match kind {
        ProfileKind::Cpu => builder.add_sample_with(locations, totals.count, &labels),
        ProfileKind::OffCpu => add_wait(builder, locations, view, totals, labels),
        ProfileKind::Alloc => add_allocation(builder, locations, view, totals, &labels),
        ProfileKind::Mutex | ProfileKind::Block => builder.add_sample_values(
            locations,
            vec![
                saturating_i64(whole_events(totals.events)),
                saturating_i64(totals.blocked_ns.saturating_add(totals.runqueue_ns)),
            ],
            &labels,
        ),
    }
}

/// Adds an off-CPU sample: its blocked and run-queue time and count, labelled with what the
/// thread waited in (the kernel's state, and the JVM's for Java threads).
fn add_wait(
    builder: &mut ProfileBuilder,
    locations: Vec<u64>,
    view: &crate::record::SampleView<'_>,
    totals: &crate::aggregate::StackTotals,
    mut labels: Vec<Label<'_>>,
) {
    labels.push(Label::Str(
        "state",
        wait_state_label(view.header.task_state),
    ));
    let java_state = JavaState::from_u8(view.header.java_state).unwrap_or(JavaState::Unknown);
    if java_state != JavaState::Unknown {
        labels.push(Label::Str("java_state", java_state.name()));
    }
    builder.add_sample_values(
        locations,
        vec![
            saturating_i64(totals.blocked_ns),
            saturating_i64(totals.runqueue_ns),
            saturating_i64(totals.count),
            saturating_i64(whole_events(totals.events)),
        ],
        &labels,
    )
}

/// Adds an allocation sample: its estimated events and bytes, in the TLAB or outside-TLAB
/// columns as its record says.
fn add_allocation(
    builder: &mut ProfileBuilder,
    locations: Vec<u64>,
    view: &crate::record::SampleView<'_>,
    totals: &crate::aggregate::StackTotals,
    labels: &[Label<'_>],
) {
    let events = saturating_i64(whole_events(totals.events));
    let bytes = saturating_i64(totals.alloc_bytes);
    let values = match SampleKind::from_u8(view.header.kind) {
        Some(SampleKind::AllocOutsideTlab) => vec![0, 0, events, bytes],
        _ => vec![events, bytes, 0, 0],
    };
    builder.add_sample_values(locations, values, labels)
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Which stack ends deserve a visible marker at the root. A frame-pointer walk that runs into
/// code built without frame pointers (libc's start-up code, typically) ends with a failed or
/// non-monotonic read: that is the normal end of native stacks, counted but not marked. A walk
/// cut by the depth bound, or stopped by a Java frame it could not unwind, is marked, so the
/// missing outer frames are visible instead of silently gone.
/// The frame of the samples whose stacks found no memory in their interval.
pub const PAST_BOUND_FRAME: &str = "[stacks past the bound]";
/// Its marker number, apart from the unwind ends' (`truncation_marker`).
const PAST_BOUND_MARKER: u8 = u8::MAX;

fn truncation_marker(end: Option<UnwindEnd>) -> Option<UnwindEnd> {
    match end? {
        end @ (UnwindEnd::MaxDepth
        | UnwindEnd::NoCodeBlob
        | UnwindEnd::BadJavaFrame
        | UnwindEnd::JavaReadFailed) => Some(end),
        UnwindEnd::Complete
        | UnwindEnd::ReadFailed
        | UnwindEnd::NotMonotonic
        | UnwindEnd::NoUserContext => None,
    }
}

/// Built profiles for the tests of this module and of the sinks that derive theirs from them.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::aggregate::Aggregator;
    use crate::record::tests::encode;
    use crate::record::SampleView;

    /// No such process: frames stay unknown, names come from the records.
    pub(crate) const PID: u32 = 0x7fff_fff0;

    /// A profile of one stack sampled 3 times on thread 70 and once on 71, both `pool-1`.
    pub(crate) fn built() -> BuiltProfile {
        built_on("pool-1")
    }

    /// [`built`] with both threads named `thread_name`.
    pub(crate) fn built_on(thread_name: &str) -> BuiltProfile {
        built_from(&[
            (70, thread_name),
            (70, thread_name),
            (70, thread_name),
            (71, thread_name),
        ])
    }

    /// A profile of one stack sampled once per (tid, thread name) of `samples`.
    pub(crate) fn built_from(samples: &[(u32, &str)]) -> BuiltProfile {
        let mut aggregator = Aggregator::new(100);
        let tid_at = std::mem::offset_of!(profiler_common::SampleHeader, tid);
        for &(tid, thread_name) in samples {
            let mut record = encode(PID, thread_name, &[], &[0x10, 0x20], UnwindEnd::Complete);
            record[tid_at..tid_at + 4].copy_from_slice(&tid.to_ne_bytes());
            aggregator.add(&SampleView::parse(&record).expect("valid"));
        }
        let interval = aggregator.take_interval();
        build(
            ProfileRequest {
                kind: ProfileKind::Cpu,
                pid: PID,
                stacks: &interval.processes[&PID],
                frequency_hz: 19,
                alloc_interval_bytes: profiler_common::ALLOC_INTERVAL_BYTES,
                start: SystemTime::UNIX_EPOCH,
                duration: Duration::from_secs(1),
            },
            &mut ProcessTable::default(),
            &mut Symbolizers::new(false),
        )
    }

    pub(crate) fn string(profile: &proto::Profile, index: i64) -> &str {
        &profile.string_table[index as usize]
    }

    /// Per sample: (count, string labels, numeric labels, outermost frame's name).
    #[allow(clippy::type_complexity)]
    pub(crate) fn summary(
        profile: &proto::Profile,
    ) -> Vec<(i64, Vec<(&str, &str)>, Vec<(&str, i64)>, &str)> {
        let mut samples: Vec<_> = profile
            .sample
            .iter()
            .map(|sample| {
                let strings = sample
                    .label
                    .iter()
                    .filter(|l| l.str != 0)
                    .map(|l| (string(profile, l.key), string(profile, l.str)))
                    .collect();
                let numbers = sample
                    .label
                    .iter()
                    .filter(|l| l.str == 0)
                    .map(|l| (string(profile, l.key), l.num))
                    .collect();
                let root = sample
                    .location_id
                    .last()
                    .and_then(|id| profile.location.iter().find(|l| l.id == *id))
                    .and_then(|l| l.line.first())
                    .and_then(|line| profile.function.iter().find(|f| f.id == line.function_id))
                    .map_or("", |f| string(profile, f.name));
                (sample.value[0], strings, numbers, root)
            })
            .collect();
        samples.sort();
        samples
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn local_profiles_label_each_thread_with_its_tid() {
        let built = built();
        assert_eq!(built.threads.len(), 2);
        let pid = PID.to_string();
        let labels = |tid: i64| {
            (
                vec![
                    ("pid", pid.as_str()),
                    ("comm", "pool-1"),
                    ("thread_name", "pool-1"),
                    ("thread_name_source", "comm"),
                ],
                vec![("thread_id", tid)],
            )
        };
        let samples = summary(&built.profile);
        assert_eq!(samples.len(), 2);
        assert_eq!(
            (samples[0].0, &samples[0].1, &samples[0].2),
            (1, &labels(71).0, &labels(71).1)
        );
        assert_eq!(
            (samples[1].0, &samples[1].1, &samples[1].2),
            (3, &labels(70).0, &labels(70).1)
        );
        // No synthetic frames locally: the root is the stack's own outermost frame.
        assert!(samples.iter().all(|s| s.3 == "[unknown]"));
    }

    #[test]
    fn java_unwind_failures_and_depth_cuts_are_marked() {
        assert_eq!(
            truncation_marker(Some(UnwindEnd::MaxDepth)),
            Some(UnwindEnd::MaxDepth)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::NoCodeBlob)),
            Some(UnwindEnd::NoCodeBlob)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::BadJavaFrame)),
            Some(UnwindEnd::BadJavaFrame)
        );
        assert_eq!(
            truncation_marker(Some(UnwindEnd::JavaReadFailed)),
            Some(UnwindEnd::JavaReadFailed)
        );
        assert_eq!(truncation_marker(Some(UnwindEnd::NotMonotonic)), None);
        assert_eq!(truncation_marker(Some(UnwindEnd::Complete)), None);
        assert_eq!(truncation_marker(None), None);
    }
}
