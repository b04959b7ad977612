//! `profiler-daemon view`: the local output's profiles over a time window, selected by service,
//! process name or pid, merged into one flame graph; or a differential flame graph of two
//! windows (what changed between them).
//!
//! The local output writes a file per process per interval: thousands an hour on a busy host.
//! Files are selected by name alone ([`super::file_name`]: kind, start, pid, process, service),
//! then decoded on the other cores and folded ([`super::flamegraph::fold_samples`]) one at a
//! time into one table of stacks, and dropped. Memory is bounded by the distinct stacks, not by
//! the files: frame names are interned once, a stack is its frame ids, and past
//! [`MAX_DISTINCT_STACKS`] samples of new stacks are counted under one visible
//! `[stacks past the view's bound]` stack. What inferno gets is bounded by what can be drawn
//! (`drawn_lines`). Figures for an hour of a busy host are in docs/benchmarks.md.
//!
//! A view of the whole host (no service, process or pid asked for) roots each process's stacks
//! at its service (`[default/orders]`), or its process name where it has none (`[java]`): the
//! stacks of a compiler and of a JVM do not sit side by side with nothing saying whose they are.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use hashbrown::HashMap;

use super::file_name::{comm_in_name, service_in_name, ProfileFileName};
use super::flamegraph::{fold_samples, folded_frame, render_folded};
use crate::profile_model::ProfileKind;
use crate::thread_roots::ThreadRoots;

/// Distinct stacks the view keeps (about 100 MB of 30-frame stacks).
pub const MAX_DISTINCT_STACKS: usize = 500_000;

/// A file, gzipped or not, or its profile gunzipped, larger than this is counted as unreadable
/// and skipped (the daemon's are well under a megabyte): memory stays bounded whatever was put
/// in the directory.
pub const MAX_PROFILE_BYTES: u64 = 64 << 20;

/// The bytes of `path` if it is at most [`MAX_PROFILE_BYTES`] long.
fn read_bounded(path: &Path) -> Option<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_PROFILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .ok()?;
    (bytes.len() as u64 <= MAX_PROFILE_BYTES).then_some(bytes)
}

/// Where the samples of stacks past [`MAX_DISTINCT_STACKS`] go.
const PAST_THE_BOUND: &str = "[stacks past the view's bound]";

/// The command line as given (times and names unchecked).
#[derive(Clone, Debug, Default)]
pub struct ViewOptions {
    pub dir: PathBuf,
    /// RFC 3339 UTC time, or a duration (`10m`, `1h30m`) meaning that long ago.
    pub from: Option<String>,
    pub to: Option<String>,
    pub services: Vec<String>,
    pub processes: Vec<String>,
    pub pids: Vec<u32>,
    /// A profile kind's file prefix: `cpu`, `offcpu`, `alloc`, `mutex` or `block`.
    pub kind: String,
    /// `merged`, `pool` or `thread`.
    pub threads: String,
    /// The window to compare with (the "before" of a differential flame graph).
    pub before_from: Option<String>,
    pub before_to: Option<String>,
    pub output: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("--{flag}: {reason}")]
    Argument { flag: &'static str, reason: String },
    #[error("cannot list {path}: {source}")]
    List {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no {kind} profile in {path} matches{window} ({total} {kind} profiles there{range})")]
    NothingSelected {
        kind: &'static str,
        path: PathBuf,
        window: String,
        total: usize,
        range: String,
    },
    #[error("cannot render the flame graph: {0}")]
    Render(std::io::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl ViewError {
    /// 2 for what the user asked wrongly, 1 for the rest (as `run`).
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Argument { .. } => 2,
            _ => 1,
        }
    }
}

/// Which files a window takes: those of `kind` that started in `[from, to)` and match every
/// kind of selector given (any of its values).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selection {
    pub kind: ProfileKind,
    pub from: Option<SystemTime>,
    pub to: Option<SystemTime>,
    pub pids: Vec<u32>,
    /// As file names show them ([`comm_in_name`]).
    pub processes: Vec<String>,
    /// As file names hold them ([`service_in_name`]).
    pub services: Vec<String>,
}

impl Selection {
    /// No selector: every process of the host.
    pub fn is_whole_host(&self) -> bool {
        self.pids.is_empty() && self.processes.is_empty() && self.services.is_empty()
    }

    pub fn matches(&self, name: &ProfileFileName<'_>) -> bool {
        name.kind == self.kind
            && self.from.is_none_or(|from| name.start >= from)
            && self.to.is_none_or(|to| name.start < to)
            && (self.pids.is_empty() || self.pids.contains(&name.pid))
            && (self.processes.is_empty() || self.processes.iter().any(|p| p == name.comm))
            && (self.services.is_empty()
                || name
                    .service
                    .is_some_and(|service| self.services.iter().any(|s| s == service)))
    }
}

/// A time argument: RFC 3339 in UTC (`2026-11-26T10:00:00Z`, the `Z` optional) or a duration
/// before `now` (`10m`: ten minutes ago).
pub fn parse_time(text: &str, now: SystemTime) -> Result<SystemTime, String> {
    if let Ok(ago) = humantime::parse_duration(text) {
        return Ok(now.checked_sub(ago).unwrap_or(SystemTime::UNIX_EPOCH));
    }
    humantime::parse_rfc3339_weak(text.trim_end_matches('Z')).map_err(|_| {
        format!("{text:?} is neither a UTC time (2026-11-26T10:00:00Z) nor a duration (10m)")
    })
}

/// Frame names, each stored once; a stack is the ids of its frames, root first.
#[derive(Default)]
struct FrameNames {
    ids: HashMap<Box<str>, u32>,
    names: Vec<Box<str>>,
}

impl FrameNames {
    fn id(&mut self, name: &str) -> u32 {
        let name = folded_frame(name);
        if let Some(&id) = self.ids.get(name.as_ref()) {
            return id;
        }
        let id = self.names.len() as u32;
        self.names.push(name.as_ref().into());
        self.ids.insert(name.as_ref().into(), id);
        id
    }

    fn folded(&self, stack: &[u32]) -> String {
        let mut line = String::new();
        for (index, &id) in stack.iter().enumerate() {
            if index > 0 {
                line.push(';');
            }
            line.push_str(&self.names[id as usize]);
        }
        line
    }
}

/// One window's stacks, merged.
#[derive(Default)]
struct Window {
    counts: HashMap<Box<[u32]>, u64>,
    files: usize,
    unreadable: usize,
    samples: u64,
    past_bound: u64,
    first: Option<SystemTime>,
    last: Option<SystemTime>,
}

impl Window {
    fn add(&mut self, stack: &[u32], count: u64, past_bound: u32) {
        self.samples += count;
        if let Some(total) = self.counts.get_mut(stack) {
            *total += count;
        } else if self.counts.len() < MAX_DISTINCT_STACKS {
            self.counts.insert(stack.into(), count);
        } else {
            self.past_bound += count;
            *self.counts.entry(Box::from([past_bound])).or_insert(0) += count;
        }
    }
}

/// Reads the files `selection` takes in `dir` into `window`.
fn merge(
    dir: &Path,
    selection: &Selection,
    threads: ThreadRoots,
    names: &mut FrameNames,
    window: &mut Window,
) -> Result<(), ViewError> {
    // With the root of its stacks in a whole-host view.
    let mut files: Vec<(SystemTime, PathBuf, Option<String>)> = Vec::new();
    let mut all_of_kind: Vec<SystemTime> = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|source| ViewError::List {
        path: dir.to_owned(),
        source,
    })?;
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(parsed) = file_name.to_str().and_then(ProfileFileName::parse) else {
            continue;
        };
        if parsed.kind == selection.kind {
            all_of_kind.push(parsed.start);
        }
        if selection.matches(&parsed) {
            let root = selection.is_whole_host().then(|| process_root(&parsed));
            files.push((parsed.start, entry.path(), root));
        }
    }
    if files.is_empty() {
        return Err(nothing_selected(dir, selection, &all_of_kind));
    }
    let past_bound = names.id(PAST_THE_BOUND);
    // Reading and decoding (gunzip, protobuf) is most of the work: other threads do it while
    // this one folds; at most two decoded profiles per decoder wait, whatever the files.
    let decoders = std::thread::available_parallelism()
        .map_or(1, |cores| cores.get() - 1)
        .clamp(1, 8);
    let next = AtomicUsize::new(0);
    let (decoded, received) = std::sync::mpsc::sync_channel(2 * decoders);
    std::thread::scope(|scope| {
        for _ in 0..decoders {
            let (decoded, next, files) = (decoded.clone(), &next, &files);
            scope.spawn(move || {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some((_, path, _)) = files.get(index) else {
                        break;
                    };
                    // A file retention deleted since the listing, or one cut short, is counted
                    // and skipped.
                    let profile = read_bounded(path).and_then(|bytes| {
                        crate::pprof::decode_within(&bytes, MAX_PROFILE_BYTES).ok()
                    });
                    if decoded.send((index, profile)).is_err() {
                        break;
                    }
                }
            });
        }
        drop(decoded);
        let mut rooted: Vec<u32> = Vec::new();
        for (index, profile) in received {
            let (start, _, root) = &files[index];
            let Some(profile) = profile else {
                window.unreadable += 1;
                continue;
            };
            let root = root.as_deref().map(|root| names.id(root));
            fold_samples(
                &profile,
                threads,
                |name| names.id(name),
                |stack, count| match root {
                    Some(root) => {
                        rooted.clear();
                        rooted.push(root);
                        rooted.extend_from_slice(stack);
                        window.add(&rooted, count, past_bound);
                    }
                    None => window.add(stack, count, past_bound),
                },
            );
            let start = *start;
            window.files += 1;
            window.first = Some(window.first.map_or(start, |first| first.min(start)));
            window.last = Some(window.last.map_or(start, |last| last.max(start)));
        }
    });
    Ok(())
}

/// The frame a whole-host view roots a process's stacks at: its service, else its name.
fn process_root(name: &ProfileFileName<'_>) -> String {
    match name.service_name() {
        Some(service) => format!("[{service}]"),
        None => format!("[{}]", name.comm),
    }
}

fn nothing_selected(dir: &Path, selection: &Selection, all_of_kind: &[SystemTime]) -> ViewError {
    let kind = selection.kind.file_prefix();
    let mut window = String::new();
    if let Some(from) = selection.from {
        window.push_str(&format!(
            " from {}",
            humantime::format_rfc3339_seconds(from)
        ));
    }
    if let Some(to) = selection.to {
        window.push_str(&format!(" to {}", humantime::format_rfc3339_seconds(to)));
    }
    if !(selection.pids.is_empty() && selection.processes.is_empty()) {
        window.push_str(" for the processes asked");
    }
    if !selection.services.is_empty() {
        window.push_str(" for the services asked");
    }
    let range = match (all_of_kind.iter().min(), all_of_kind.iter().max()) {
        (Some(first), Some(last)) => format!(
            ", started {} to {}",
            humantime::format_rfc3339_seconds(*first),
            humantime::format_rfc3339_seconds(*last)
        ),
        _ => String::new(),
    };
    ViewError::NothingSelected {
        kind,
        path: dir.to_owned(),
        window,
        total: all_of_kind.len(),
        range,
    }
}

/// What a view read and drew, for its one-line summary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewSummary {
    pub files: usize,
    pub unreadable: usize,
    pub samples: u64,
    pub distinct_stacks: usize,
    /// Samples of stacks past [`MAX_DISTINCT_STACKS`].
    pub past_bound: u64,
    /// The "before" window's files and samples, for a differential flame graph.
    pub before: Option<(usize, u64)>,
    pub took: Duration,
    pub output: PathBuf,
}

impl std::fmt::Display for ViewSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "view: {} files read", self.files)?;
        if self.unreadable > 0 {
            write!(f, " ({} unreadable, skipped)", self.unreadable)?;
        }
        write!(
            f,
            ", {} samples, {} distinct stacks",
            self.samples, self.distinct_stacks
        )?;
        if let Some((files, samples)) = self.before {
            write!(f, "; before: {files} files, {samples} samples")?;
        }
        if self.past_bound > 0 {
            write!(
                f,
                "; {} samples of stacks past the bound of {MAX_DISTINCT_STACKS}",
                self.past_bound
            )?;
        }
        write!(
            f,
            "; {:.1} s -> {}",
            self.took.as_secs_f64(),
            self.output.display()
        )
    }
}

/// A checked view request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ViewRequest {
    pub dir: PathBuf,
    pub selection: Selection,
    pub threads: ThreadRoots,
    /// The "before" window of a differential flame graph (same selectors, other times).
    pub before: Option<Selection>,
    pub output: PathBuf,
}

impl ViewRequest {
    /// Checks `options`, relative times counted back from `now`.
    pub fn resolve(options: ViewOptions, now: SystemTime) -> Result<Self, ViewError> {
        let time = |flag: &'static str, text: &Option<String>| {
            text.as_deref()
                .map(|text| parse_time(text, now))
                .transpose()
                .map_err(|reason| ViewError::Argument { flag, reason })
        };
        let kind =
            ProfileKind::from_file_prefix(&options.kind).ok_or_else(|| ViewError::Argument {
                flag: "kind",
                reason: format!(
                    "{:?} is none of {}",
                    options.kind,
                    ProfileKind::ALL.map(ProfileKind::file_prefix).join(", ")
                ),
            })?;
        let threads =
            ThreadRoots::from_name(&options.threads).ok_or_else(|| ViewError::Argument {
                flag: "threads",
                reason: format!("{:?} is not {}", options.threads, ThreadRoots::VALUES),
            })?;
        let selection = Selection {
            kind,
            from: time("from", &options.from)?,
            to: time("to", &options.to)?,
            pids: options.pids,
            processes: options.processes.iter().map(|p| comm_in_name(p)).collect(),
            services: options
                .services
                .iter()
                .map(|s| service_in_name(s))
                .collect(),
        };
        let before = match (&options.before_from, &options.before_to) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(ViewError::Argument {
                    flag: "before-to",
                    reason: "needs --before-from".into(),
                })
            }
            (Some(_), None) if selection.from.is_none() => {
                return Err(ViewError::Argument {
                    flag: "before-from",
                    reason: "needs --from (where the earlier window ends, unless --before-to \
                             says)"
                        .into(),
                })
            }
            (Some(_), before_to) => Some(Selection {
                from: time("before-from", &options.before_from)?,
                // The window before the one viewed, by default.
                to: time("before-to", before_to)?.or(selection.from),
                ..selection.clone()
            }),
        };
        for window in std::iter::once(&selection).chain(&before) {
            if let (Some(from), Some(to)) = (window.from, window.to) {
                if from >= to {
                    return Err(ViewError::Argument {
                        flag: if Some(window) == before.as_ref() {
                            "before-from"
                        } else {
                            "from"
                        },
                        reason: "the window ends before it starts".into(),
                    });
                }
            }
        }
        Ok(Self {
            dir: options.dir,
            selection,
            threads,
            before,
            output: options.output,
        })
    }
}

/// Reads, merges and renders as `request` asks; writes the SVG.
pub fn run(request: &ViewRequest) -> Result<ViewSummary, ViewError> {
    let started = Instant::now();
    let mut names = FrameNames::default();
    let mut after = Window::default();
    merge(
        &request.dir,
        &request.selection,
        request.threads,
        &mut names,
        &mut after,
    )?;
    let before = match &request.before {
        Some(selection) => {
            let mut before = Window::default();
            merge(
                &request.dir,
                selection,
                request.threads,
                &mut names,
                &mut before,
            )?;
            Some(before)
        }
        None => None,
    };
    let kind = request.selection.kind;
    let count_name = kind.counted();
    let stacks = stack_counts(before.as_ref(), &after);
    let distinct_stacks = stacks.len();
    let lines = drawn_lines(&names, stacks, before.is_some());
    let title = title(request, &after, before.as_ref());
    let svg = render_folded(lines.iter().map(String::as_str), &title, count_name)
        .map_err(ViewError::Render)?;
    std::fs::write(&request.output, svg).map_err(|source| ViewError::Write {
        path: request.output.clone(),
        source,
    })?;
    Ok(ViewSummary {
        files: after.files,
        unreadable: after.unreadable + before.as_ref().map_or(0, |b| b.unreadable),
        samples: after.samples,
        distinct_stacks,
        past_bound: after.past_bound + before.as_ref().map_or(0, |b| b.past_bound),
        before: before.as_ref().map(|b| (b.files, b.samples)),
        took: started.elapsed(),
        output: request.output.clone(),
    })
}

/// Each distinct stack of the windows with its (before, after) counts: before is 0 without a
/// differential, and with one scaled to after's total, so that windows of different lengths or
/// load compare by share, not by count.
fn stack_counts<'w>(before: Option<&'w Window>, after: &'w Window) -> Vec<(&'w [u32], u64, u64)> {
    let Some(before) = before else {
        return after
            .counts
            .iter()
            .map(|(stack, &count)| (&stack[..], 0, count))
            .collect();
    };
    let scale = if before.samples == 0 {
        1.0
    } else {
        after.samples as f64 / before.samples as f64
    };
    let mut both: HashMap<&[u32], (u64, u64)> = HashMap::new();
    for (stack, &count) in &before.counts {
        both.entry(stack).or_default().0 = (count as f64 * scale).round() as u64;
    }
    for (stack, &count) in &after.counts {
        both.entry(stack).or_default().1 = count;
    }
    both.into_iter()
        .map(|(stack, (before, after))| (stack, before, after))
        .collect()
}

/// Inferno draws a frame only if it is at least 0.1 px wide in a 1200 px image: about one
/// 12,000th of the samples.
const SHOWN_SHARE: f64 = 0.1 / 1200.0;

/// The folded lines to draw (`stack count`, or inferno's differential `stack before after`,
/// drawn as after and coloured by the change), each stack cut after its last frame that would
/// be drawn. Widths are after's counts, so a frame is drawn if the stacks under it hold at
/// least [`SHOWN_SHARE`] of after's samples; cutting a stack there moves its counts to that
/// frame, so every drawn frame keeps its width and its change, and the lines (and inferno's
/// memory and time) are bounded by what can be seen, not by the distinct stacks read.
fn drawn_lines(
    names: &FrameNames,
    mut stacks: Vec<(&[u32], u64, u64)>,
    differential: bool,
) -> Vec<String> {
    stacks.retain(|(stack, _, _)| !stack.is_empty());
    // Stacks that share a prefix next to each other.
    stacks.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let total: u64 = stacks.iter().map(|&(_, _, after)| after).sum();
    // A frame of no width is never drawn (a differential's frames with no sample after).
    let shown_from = ((total as f64 * SHOWN_SHARE) as u64).max(1);
    // How many frames of each stack are drawn: a frame's width is the sum over the run of
    // stacks that share it, known when the run ends (frames deepest first).
    let mut drawn_depth = vec![0usize; stacks.len()];
    // The frames of the current stack: where their run started, their width so far.
    let mut open: Vec<(usize, u64)> = Vec::new();
    let close_deeper_than =
        |depth: usize, open: &mut Vec<(usize, u64)>, end: usize, drawn_depth: &mut [usize]| {
            while open.len() > depth {
                let (start, width) = open.pop().unwrap_or_default();
                if width >= shown_from {
                    let frame_depth = open.len() + 1;
                    for drawn in &mut drawn_depth[start..end] {
                        *drawn = (*drawn).max(frame_depth);
                    }
                }
            }
        };
    for index in 0..stacks.len() {
        let stack = stacks[index].0;
        let shared = match index.checked_sub(1) {
            Some(previous) => stacks[previous]
                .0
                .iter()
                .zip(stack)
                .take_while(|(a, b)| a == b)
                .count(),
            None => 0,
        };
        close_deeper_than(shared, &mut open, index, &mut drawn_depth);
        open.extend((open.len()..stack.len()).map(|_| (index, 0)));
        for (_, width) in &mut open {
            *width += stacks[index].2;
        }
    }
    close_deeper_than(0, &mut open, stacks.len(), &mut drawn_depth);

    // Stacks cut to the same frames are one line; a stack none of whose frames is drawn keeps
    // its root, so the total (every percentage's base) stays whole.
    let mut index_of: HashMap<&[u32], usize> = HashMap::new();
    let mut cut: Vec<(&[u32], u64, u64)> = Vec::new();
    for (&(stack, before, after), &depth) in stacks.iter().zip(&drawn_depth) {
        let prefix = &stack[..depth.max(1)];
        match index_of.get(prefix) {
            Some(&at) => {
                cut[at].1 += before;
                cut[at].2 += after;
            }
            None => {
                index_of.insert(prefix, cut.len());
                cut.push((prefix, before, after));
            }
        }
    }
    cut.iter()
        .map(|&(stack, before, after)| {
            if differential {
                format!("{} {before} {after}", names.folded(stack))
            } else {
                format!("{} {after}", names.folded(stack))
            }
        })
        .collect()
}

fn title(request: &ViewRequest, after: &Window, before: Option<&Window>) -> String {
    let selection = &request.selection;
    let mut what = Vec::new();
    if !selection.services.is_empty() {
        what.push(format!("service {}", selection.services.join(", ")));
    }
    if !selection.processes.is_empty() {
        what.push(format!("process {}", selection.processes.join(", ")));
    }
    if !selection.pids.is_empty() {
        let pids: Vec<String> = selection.pids.iter().map(u32::to_string).collect();
        what.push(format!("pid {}", pids.join(", ")));
    }
    if what.is_empty() {
        what.push("every process".into());
    }
    let span = |window: &Window| match (window.first, window.last) {
        (Some(first), Some(last)) => format!(
            "{} to {}",
            humantime::format_rfc3339_seconds(first),
            humantime::format_rfc3339_seconds(last)
        ),
        _ => "nothing".into(),
    };
    let kind = selection.kind.title();
    match before {
        None => format!(
            "{kind}: {}, profiles started {}",
            what.join("; "),
            span(after)
        ),
        Some(before) => format!(
            "{kind} change: {}, {} against {}",
            what.join("; "),
            span(after),
            span(before)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::file_name::file_stem;
    use crate::pprof::{encode, encode_gzipped};
    use crate::profile_model::testing::cpu_profile;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    /// Writes a CPU profile of `pid` started at `secs`: each (thread, leaf, count) one sample
    /// of `main;<leaf>` on that thread (its tid, 100 + its index).
    fn write(
        dir: &Path,
        secs: u64,
        pid: u32,
        comm: &str,
        service: &str,
        stacks: &[(&str, &str, u64)],
    ) {
        let frames: Vec<[&str; 2]> = stacks.iter().map(|&(_, leaf, _)| [leaf, "main"]).collect();
        let samples: Vec<_> = stacks
            .iter()
            .zip(&frames)
            .enumerate()
            .map(|(index, (&(thread, _, count), frames))| {
                let tid = 100 + index as u32;
                (&frames[..], count as i64, Some((thread, tid)))
            })
            .collect();
        let mut profile = cpu_profile(&samples);
        (profile.pid, profile.comm, profile.start) = (pid, comm.into(), at(secs));
        profile.duration = Duration::from_secs(10);
        let name = format!(
            "{}.pb.gz",
            file_stem(ProfileKind::Cpu, at(secs), pid, comm, service)
        );
        let bytes = encode_gzipped(&encode(&profile, true)).expect("encodes");
        std::fs::write(dir.join(name), bytes).expect("writes");
    }

    /// Two services over three intervals, plus files the view must pass over.
    fn directory() -> tempfile::TempDir {
        let dir = tempfile::tempdir().expect("tempdir");
        for secs in [0, 10, 20] {
            write(
                dir.path(),
                secs,
                10,
                "java",
                "default/orders",
                &[("exec-1", "orders_hot", 5), ("exec-2", "orders_hot", 3)],
            );
            write(
                dir.path(),
                secs,
                20,
                "java",
                "billing",
                &[("main", "billing_hot", 2)],
            );
        }
        // A later interval where orders got hotter elsewhere.
        write(
            dir.path(),
            30,
            10,
            "java",
            "default/orders",
            &[("exec-1", "orders_new", 8), ("exec-2", "orders_hot", 8)],
        );
        std::fs::write(dir.path().join("notes.txt"), "not a profile").expect("writes");
        std::fs::write(
            dir.path().join(format!(
                "{}.pb.gz",
                file_stem(ProfileKind::Cpu, at(0), 30, "x", "broken")
            )),
            "not gzip",
        )
        .expect("writes");
        dir
    }

    fn options(dir: &Path, output: &Path) -> ViewOptions {
        ViewOptions {
            dir: dir.to_owned(),
            kind: "cpu".into(),
            threads: "merged".into(),
            output: output.to_owned(),
            ..Default::default()
        }
    }

    fn view(options: ViewOptions) -> (ViewSummary, String) {
        let request = ViewRequest::resolve(options, at(3600)).expect("valid");
        let summary = run(&request).expect("renders");
        let svg = std::fs::read_to_string(&request.output).expect("written");
        (summary, svg)
    }

    #[test]
    fn merges_a_service_over_a_window_into_one_flame_graph() {
        let dir = directory();
        let output = dir.path().join("orders.svg");
        let (summary, svg) = view(ViewOptions {
            services: vec!["default/orders".into()],
            from: Some(humantime::format_rfc3339_seconds(at(0)).to_string()),
            to: Some(humantime::format_rfc3339_seconds(at(30)).to_string()),
            ..options(dir.path(), &output)
        });
        // Three intervals of 8 samples, threads merged: one stack.
        assert_eq!(
            (
                summary.files,
                summary.samples,
                summary.distinct_stacks,
                summary.unreadable
            ),
            (3, 24, 1, 0)
        );
        assert!(svg.contains("<title>orders_hot (24 samples"), "{svg}");
        assert!(!svg.contains("billing_hot") && !svg.contains("orders_new"));
        assert!(!svg.contains("exec-"), "merged: no thread frame");
    }

    #[test]
    fn selects_by_pid_or_process_and_roots_threads_as_asked() {
        let dir = directory();
        let output = dir.path().join("pid.svg");
        let (summary, svg) = view(ViewOptions {
            pids: vec![20],
            threads: "thread".into(),
            ..options(dir.path(), &output)
        });
        assert_eq!((summary.files, summary.samples), (3, 6));
        assert!(svg.contains("[main tid=100]") && svg.contains("billing_hot"));
        assert!(!svg.contains("orders_hot"));

        let (summary, svg) = view(ViewOptions {
            processes: vec!["java".into()],
            threads: "pool".into(),
            ..options(dir.path(), &output)
        });
        // Every interval of both JVMs (not the broken file, of another process).
        assert_eq!((summary.files, summary.samples), (7, 24 + 16 + 6));
        assert!(svg.contains("<title>[exec-*] (40 samples"), "{svg}");
    }

    #[test]
    fn unreadable_files_are_counted_and_skipped() {
        let dir = directory();
        let output = dir.path().join("all.svg");
        let (summary, _) = view(options(dir.path(), &output));
        assert_eq!((summary.files, summary.unreadable), (7, 1));
        assert!(summary.to_string().contains("1 unreadable"), "{summary}");
    }

    #[test]
    fn the_whole_host_view_roots_each_process_at_its_service() {
        let dir = directory();
        let output = dir.path().join("host.svg");
        let (summary, svg) = view(options(dir.path(), &output));
        // Both JVMs run `main`: one root each, not one `main` shared.
        assert_eq!(summary.samples, 24 + 16 + 6);
        assert!(svg.contains("<title>[default/orders] (40 samples"), "{svg}");
        assert!(svg.contains("<title>[billing] (6 samples"), "{svg}");
        // One service asked for: its stacks are not rooted.
        let (_, svg) = view(ViewOptions {
            services: vec!["billing".into()],
            ..options(dir.path(), &output)
        });
        assert!(!svg.contains("[billing]") && svg.contains("billing_hot"));
    }

    #[test]
    fn a_differential_flame_graph_compares_two_windows() {
        let dir = directory();
        let output = dir.path().join("diff.svg");
        let (summary, svg) = view(ViewOptions {
            services: vec!["default/orders".into()],
            from: Some(humantime::format_rfc3339_seconds(at(30)).to_string()),
            before_from: Some(humantime::format_rfc3339_seconds(at(0)).to_string()),
            ..options(dir.path(), &output)
        });
        // Before: 24 samples of orders_hot, scaled to after's 16; after: 8 and 8.
        assert_eq!(summary.before, Some((3, 24)));
        assert_eq!(
            (summary.files, summary.samples, summary.distinct_stacks),
            (1, 16, 2)
        );
        assert!(
            svg.contains("orders_new") && svg.contains("orders_hot"),
            "{svg}"
        );
        // inferno states each frame's change in its title, against after's total.
        assert!(
            svg.contains("orders_new (8 samples, 50.00%; +50.00%)")
                && svg.contains("orders_hot (8 samples, 50.00%; -50.00%)"),
            "{svg}"
        );
    }

    #[test]
    fn folded_lines_of_two_windows_are_scaled_to_the_later_total() {
        let mut names = FrameNames::default();
        let (a, b) = (names.id("a"), names.id("b;c"));
        let (mut before, mut after) = (Window::default(), Window::default());
        before.add(&[a], 30, u32::MAX);
        before.add(&[a, b], 10, u32::MAX);
        after.add(&[a], 10, u32::MAX);
        let stacks = stack_counts(Some(&before), &after);
        assert_eq!(stacks.len(), 2);
        let mut lines = drawn_lines(&names, stacks, true);
        lines.sort();
        // Before's 40 samples scaled to after's 10: 30 -> 7.5, 10 -> 2.5, rounded. `a;b:c`
        // has no sample after: too narrow to draw, its change goes to `a`.
        assert_eq!(lines, vec!["a 11 10"]);
    }

    #[test]
    fn stacks_are_cut_after_their_last_frame_wide_enough_to_draw() {
        let mut names = FrameNames::default();
        let [main, hot, cold, colder, other] =
            ["main", "hot", "cold", "colder", "other"].map(|name| names.id(name));
        let mut after = Window::default();
        after.add(&[main, hot], 100_000, u32::MAX);
        after.add(&[main, cold], 3, u32::MAX);
        after.add(&[main, cold, colder], 3, u32::MAX);
        after.add(&[main, hot, colder], 20, u32::MAX);
        after.add(&[other, cold], 2, u32::MAX);
        let mut lines = drawn_lines(&names, stack_counts(None, &after), false);
        lines.sort();
        // 100,028 samples: a frame needs 8 to be drawn. `main;cold` holds 6 (cut to `main`),
        // `other` 2 (kept as a root so the total stays whole); `main;hot;colder` 20.
        assert_eq!(
            lines,
            vec!["main 6", "main;hot 100000", "main;hot;colder 20", "other 2"]
        );
        let drawn: u64 = lines
            .iter()
            .map(|line| {
                line.rsplit(' ')
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            })
            .sum();
        assert_eq!(drawn, after.samples);
    }

    #[test]
    fn stacks_past_the_bound_are_counted_under_one_stack() {
        let mut window = Window::default();
        for id in 0..MAX_DISTINCT_STACKS as u32 {
            window.add(&[id], 1, u32::MAX);
        }
        window.add(&[0], 2, u32::MAX);
        window.add(&[u32::MAX - 1], 5, u32::MAX);
        window.add(&[u32::MAX - 2], 1, u32::MAX);
        assert_eq!(window.past_bound, 6);
        assert_eq!(window.counts[&[u32::MAX][..]], 6);
        assert_eq!(window.counts[&[0][..]], 3);
        assert_eq!(window.samples, MAX_DISTINCT_STACKS as u64 + 8);
    }

    #[test]
    fn times_are_utc_or_durations_ago() {
        let now = at(3600);
        assert_eq!(parse_time("10m", now), Ok(at(3000)));
        assert_eq!(parse_time("1h", now), Ok(at(0)));
        let text = humantime::format_rfc3339_seconds(at(5)).to_string();
        assert_eq!(parse_time(&text, now), Ok(at(5)));
        assert_eq!(parse_time(text.trim_end_matches('Z'), now), Ok(at(5)));
        assert!(parse_time("yesterday", now).is_err());
    }

    #[test]
    fn bad_arguments_name_their_flag() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = options(dir.path(), &dir.path().join("x.svg"));
        for (options, flag) in [
            (
                ViewOptions {
                    kind: "heap".into(),
                    ..base.clone()
                },
                "--kind",
            ),
            (
                ViewOptions {
                    threads: "all".into(),
                    ..base.clone()
                },
                "--threads",
            ),
            (
                ViewOptions {
                    from: Some("soon".into()),
                    ..base.clone()
                },
                "--from",
            ),
            (
                ViewOptions {
                    from: Some("1m".into()),
                    to: Some("2m".into()),
                    ..base.clone()
                },
                "--from",
            ),
            (
                ViewOptions {
                    before_to: Some("1m".into()),
                    ..base.clone()
                },
                "--before-to",
            ),
            (
                ViewOptions {
                    before_from: Some("2m".into()),
                    ..base.clone()
                },
                "--before-from",
            ),
            (
                ViewOptions {
                    from: Some("1m".into()),
                    before_from: Some("2m".into()),
                    before_to: Some("3m".into()),
                    ..base.clone()
                },
                "--before-from",
            ),
        ] {
            let err = ViewRequest::resolve(options, at(3600)).expect_err(flag);
            assert!(err.to_string().starts_with(flag), "{err}");
            assert_eq!(err.exit_code(), 2);
        }
    }

    #[test]
    fn an_empty_selection_says_what_is_there() {
        let dir = directory();
        let request = ViewRequest::resolve(
            ViewOptions {
                services: vec!["nobody".into()],
                ..options(dir.path(), &dir.path().join("x.svg"))
            },
            at(3600),
        )
        .expect("valid");
        let err = run(&request).expect_err("nothing selected").to_string();
        assert!(
            err.contains("no cpu profile") && err.contains("8 cpu profiles there"),
            "{err}"
        );
    }
}
