//! Turns one process's folded stacks of an interval into its [`SymbolizedProfile`]: each
//! distinct frame named once, through [`ProfileNames`] (the symbolizers implement it), each
//! stack a sample with the values of the profile's kind and the thread it ran on.
//!
//! # Threads
//!
//! Stacks are folded per thread (tid), so every sample names one thread: by its full Java name
//! when the sidecar agent reported it and the sampled `comm` confirms it
//! (`crate::sidecar::threads`), else by `comm` (15 bytes at most). What each output makes of
//! it is the output's: the local files label samples with it, the remote sinks merge threads
//! or root stacks at them (`crate::remote_variant`).

use std::time::{Duration, SystemTime};

use hashbrown::HashMap;
use profiler_common::{JavaState, SampleKind, UnwindEnd, UserFrame, COMM_LEN};

use crate::aggregate::{whole_events, ProcessStacks, StackTotals};
use crate::printable::printable;
use crate::profile_model::{
    Frame, FrameId, FrameKind, NameSource, ProfileKind, Sample, SampleThread, SymbolizedProfile,
    WaitState, MAX_VALUES,
};
use crate::record::{comm_to_string, SampleView, UserFrameKey};

/// What names a profile's frames and threads. Each distinct frame of a profile is asked for
/// once, as the profile shows it (markers and refusals are counted per frame shown).
pub trait ProfileNames {
    fn kernel(&mut self, ip: u64) -> Frame;
    fn user(&mut self, key: UserFrameKey, frame: &UserFrame) -> Frame;
    /// The name of thread `tid`, whose `comm` is `comm`, and where the name comes from.
    fn thread(&mut self, tid: u32, comm: &str) -> (String, NameSource);
}

pub struct ProfileRequest<'a> {
    pub kind: ProfileKind,
    pub pid: u32,
    /// The process's name as its table knows it, if it does (else its first thread's).
    pub comm: Option<String>,
    pub stacks: &'a ProcessStacks,
    pub frequency_hz: u64,
    /// Allocation profiles' sampling interval (their period).
    pub alloc_interval_bytes: u64,
    pub start: SystemTime,
    pub duration: Duration,
}

/// The frame of the samples whose stacks found no memory in their interval.
pub const PAST_BOUND_FRAME: &str = "[stacks past the bound]";

/// What tells a profile's frames apart.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
enum FrameKey {
    Kernel(u64),
    User(UserFrameKey),
    /// `[stacks past the bound]`.
    PastBound,
    Truncated(UnwindEnd),
}

pub fn build(request: ProfileRequest<'_>, names: &mut impl ProfileNames) -> SymbolizedProfile {
    let ProfileRequest { kind, stacks, .. } = request;
    let mut profile = SymbolizedProfile::new(kind, request.pid, request.start, request.duration);
    profile.comm = process_name(request.comm, stacks);
    profile.period = period(kind, request.frequency_hz, request.alloc_interval_bytes);
    let mut made = Interned::new(profile);
    // The process's stacks, then what it had past its memory share (`crate::stack_memory`).
    let stacks_past_bound = stacks
        .past_bound()
        .map(|(view, totals)| (view, totals, true));
    let all = stacks.stacks().map(|(view, totals)| (view, totals, false));
    for (view, totals, past_bound) in all.chain(stacks_past_bound) {
        if past_bound && kind == ProfileKind::Block {
            // Its waits cannot be told parked or not (`crate::lock`): in the metrics only.
            continue;
        }
        let mut frames = Vec::with_capacity(stack_len(&view));
        for ip in view.kernel_ips() {
            frames.push(made.frame(FrameKey::Kernel(ip), || names.kernel(ip)));
        }
        for (key, user) in view.keyed_user_frames() {
            frames.push(made.frame(FrameKey::User(key), || names.user(key, &user)));
        }
        if past_bound {
            let marker = || Frame::marker(FrameKind::Truncated, PAST_BOUND_FRAME);
            frames.push(made.frame(FrameKey::PastBound, marker));
        }
        if let Some(end) = truncation_marker(view.user_end()) {
            let marker = || Frame::marker(FrameKind::Truncated, truncated_name(end));
            frames.push(made.frame(FrameKey::Truncated(end), marker));
        }
        let thread = made.thread(&view, names);
        let period = made.profile.period;
        made.profile.samples.push(Sample {
            frames,
            values: values(kind, &view, &totals, period),
            thread: Some(thread),
            wait: (kind == ProfileKind::OffCpu).then(|| wait_state(&view)),
        });
    }
    made.profile
}

/// A profile being built, with what it already has: each distinct frame and thread is named
/// once.
struct Interned {
    profile: SymbolizedProfile,
    frames: HashMap<FrameKey, FrameId>,
    threads: HashMap<(u32, [u8; COMM_LEN], u64), u32>,
}

impl Interned {
    fn new(profile: SymbolizedProfile) -> Self {
        Self {
            profile,
            frames: HashMap::new(),
            threads: HashMap::new(),
        }
    }

    fn frame(&mut self, key: FrameKey, name: impl FnOnce() -> Frame) -> FrameId {
        let profile = &mut self.profile;
        *self
            .frames
            .entry(key)
            .or_insert_with(|| profile.add_frame(name()))
    }

    fn thread(&mut self, view: &SampleView<'_>, names: &mut impl ProfileNames) -> u32 {
        let profile = &mut self.profile;
        *self
            .threads
            .entry((
                view.header.tid,
                *view.thread_name(),
                view.header.virtual_thread,
            ))
            .or_insert_with(|| profile.add_thread(sample_thread(view, names)))
    }
}

/// The process's name, printable: shown as is in file names, flame graph titles and the
/// service-name fallback.
fn process_name(known: Option<String>, stacks: &ProcessStacks) -> String {
    known
        .or_else(|| {
            let (view, _) = stacks.stacks().next()?;
            Some(comm_to_string(view.thread_name()))
        })
        .map(|comm| printable(&comm).into_owned())
        .unwrap_or_default()
}

fn sample_thread(view: &SampleView<'_>, names: &mut impl ProfileNames) -> SampleThread {
    let tid = view.header.tid;
    let (name, source) = names.thread(tid, &comm_to_string(view.thread_name()));
    SampleThread {
        tid,
        name: printable(&name).into_owned(),
        source,
        virtual_thread: (view.header.virtual_thread != 0).then_some(view.header.virtual_thread),
    }
}

fn stack_len(view: &SampleView<'_>) -> usize {
    view.header.kernel_frames as usize + view.header.user_frames as usize + 1
}

/// What one sample stands for (see [`SymbolizedProfile::period`]).
fn period(kind: ProfileKind, frequency_hz: u64, alloc_interval_bytes: u64) -> i64 {
    match kind {
        ProfileKind::Cpu => saturating_i64(1_000_000_000 / frequency_hz.max(1)),
        ProfileKind::OffCpu => 0,
        ProfileKind::Alloc => saturating_i64(alloc_interval_bytes),
        ProfileKind::Mutex | ProfileKind::Block => 1,
    }
}

/// A stack's values, in the order of its kind's sample types (`ProfileKind::sample_types`).
fn values(
    kind: ProfileKind,
    view: &SampleView<'_>,
    totals: &StackTotals,
    period: i64,
) -> [i64; MAX_VALUES] {
    let events = saturating_i64(whole_events(totals.events));
    match kind {
        ProfileKind::Cpu => {
            let count = saturating_i64(totals.count);
            [count, count.saturating_mul(period), 0, 0]
        }
        ProfileKind::OffCpu => [
            saturating_i64(totals.blocked_ns),
            saturating_i64(totals.runqueue_ns),
            saturating_i64(totals.count),
            events,
        ],
        // In the TLAB or outside-TLAB columns, as the record says.
        ProfileKind::Alloc => {
            let bytes = saturating_i64(totals.alloc_bytes);
            match SampleKind::from_u8(view.header.kind) {
                Some(SampleKind::AllocOutsideTlab) => [0, 0, events, bytes],
                _ => [events, bytes, 0, 0],
            }
        }
        ProfileKind::Mutex | ProfileKind::Block => [
            events,
            saturating_i64(totals.blocked_ns.saturating_add(totals.runqueue_ns)),
            0,
            0,
        ],
    }
}

/// What the thread of an off-CPU sample waited in: the kernel's task state, and the JVM's for
/// Java threads.
fn wait_state(view: &SampleView<'_>) -> WaitState {
    let virtual_thread = view.header.flags & profiler_common::sample_flags::VIRTUAL_THREAD != 0;
    let task_state = match view.header.task_state {
        // Its carrier went on running: the virtual thread waited unmounted.
        _ if virtual_thread => "unmounted",
        0 => "runnable",
        state if state & 1 != 0 => "sleeping",
        state if state & 2 != 0 => "uninterruptible",
        _ => "other",
    };
    let java_state = JavaState::from_u8(view.header.java_state)
        .filter(|state| *state != JavaState::Unknown)
        .map(JavaState::name);
    WaitState {
        task_state,
        java_state,
    }
}

fn saturating_i64(value: u64) -> i64 {
    i64::try_from(value).unwrap_or(i64::MAX)
}

/// Which stack ends deserve a visible marker at the root. A frame-pointer walk that runs into
/// code built without frame pointers (libc's start-up code, typically) ends with a failed or
/// non-monotonic read: that is the normal end of native stacks, counted but not marked. A walk
/// cut by the depth bound, or stopped by a Java frame it could not unwind, is marked, so the
/// missing outer frames are visible instead of silently gone.
fn truncation_marker(end: Option<UnwindEnd>) -> Option<UnwindEnd> {
    match end? {
        end @ (UnwindEnd::MaxDepth
        | UnwindEnd::NoCodeBlob
        | UnwindEnd::BadJavaFrame
        | UnwindEnd::JavaReadFailed
        | UnwindEnd::FrozenFramesUnread) => Some(end),
        UnwindEnd::Complete
        | UnwindEnd::ReadFailed
        | UnwindEnd::NotMonotonic
        | UnwindEnd::NoUserContext => None,
    }
}

fn truncated_name(end: UnwindEnd) -> String {
    format!("[truncated: {}]", end.name())
}

/// Profiles built from records, for the tests of this module and of the outputs.
#[cfg(test)]
pub(crate) mod fixtures {
    use super::*;
    use crate::aggregate::Aggregator;
    use crate::record::tests::encode;

    /// No such process: frames stay unknown, names come from the records.
    pub(crate) const PID: u32 = 0x7fff_fff0;

    /// Names every frame `[unknown]` and every thread by its `comm`.
    pub(crate) struct UnknownNames;

    impl ProfileNames for UnknownNames {
        fn kernel(&mut self, ip: u64) -> Frame {
            Frame::new(
                FrameKind::Kernel,
                ip,
                crate::resolved_frame::ResolvedFrame::named("[unknown]", None),
            )
        }

        fn user(&mut self, _: UserFrameKey, frame: &UserFrame) -> Frame {
            let named = crate::resolved_frame::ResolvedFrame::named("[unknown]", None);
            Frame::new(FrameKind::Native, frame.addr(), named)
        }

        fn thread(&mut self, _: u32, comm: &str) -> (String, NameSource) {
            (comm.to_owned(), NameSource::Comm)
        }
    }

    /// A profile of one stack sampled 3 times on thread 70 and once on 71, both `pool-1`.
    pub(crate) fn built() -> SymbolizedProfile {
        built_on("pool-1")
    }

    /// [`built`] with both threads named `thread_name`.
    pub(crate) fn built_on(thread_name: &str) -> SymbolizedProfile {
        built_from(&[
            (70, thread_name),
            (70, thread_name),
            (70, thread_name),
            (71, thread_name),
        ])
    }

    /// A CPU profile of one stack sampled once per (tid, thread name) of `samples`.
    pub(crate) fn built_from(samples: &[(u32, &str)]) -> SymbolizedProfile {
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
                comm: None,
                stacks: &interval.processes[&PID],
                frequency_hz: 19,
                alloc_interval_bytes: profiler_common::ALLOC_INTERVAL_BYTES,
                start: SystemTime::UNIX_EPOCH,
                duration: Duration::from_secs(1),
            },
            &mut UnknownNames,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;

    #[test]
    fn every_sample_names_its_thread_and_distinct_frames_are_made_once() {
        let profile = built();
        assert_eq!(profile.comm, "pool-1");
        assert_eq!(
            profile.frames.len(),
            2,
            "two frames, shared by both samples"
        );
        let mut samples: Vec<_> = profile
            .samples
            .iter()
            .map(|sample| {
                let thread = profile.thread(sample).expect("a thread");
                (
                    thread.tid,
                    thread.name.as_str(),
                    sample.values[0],
                    sample.frames.clone(),
                )
            })
            .collect();
        samples.sort();
        assert_eq!(
            samples,
            [(70, "pool-1", 3, vec![0, 1]), (71, "pool-1", 1, vec![0, 1])]
        );
        // 19 Hz: each sample stands for 1/19 s.
        assert_eq!(profile.period, 52_631_578);
        let on_70 = profile
            .samples
            .iter()
            .find(|s| s.values[0] == 3)
            .expect("3 samples");
        assert_eq!(on_70.values[1], 3 * 52_631_578);
    }

    #[test]
    fn java_unwind_failures_and_depth_cuts_are_marked() {
        for end in [
            UnwindEnd::MaxDepth,
            UnwindEnd::NoCodeBlob,
            UnwindEnd::BadJavaFrame,
            UnwindEnd::JavaReadFailed,
            UnwindEnd::FrozenFramesUnread,
        ] {
            assert_eq!(truncation_marker(Some(end)), Some(end));
        }
        assert_eq!(truncation_marker(Some(UnwindEnd::NotMonotonic)), None);
        assert_eq!(truncation_marker(Some(UnwindEnd::Complete)), None);
        assert_eq!(truncation_marker(None), None);
        assert_eq!(
            truncated_name(UnwindEnd::MaxDepth),
            "[truncated: max_depth]"
        );
    }
}
