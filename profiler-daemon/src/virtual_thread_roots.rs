//! What is shown below a virtual thread's own frames (the `virtual_threads` setting).
//!
//! A sample of a mounted virtual thread walks its whole stack: its frames (those on the
//! carrier's stack and those still frozen in its stack chunks), down to
//! `java.lang.VirtualThread.run`, then the continuation's entry and the carrier thread's
//! scheduler frames (`ForkJoinPool` worker loop, `VirtualThread.runContinuation`). The
//! carrier's frames say which pool ran the virtual thread, not what it did: by default
//! (`logical`) a virtual thread's stack ends at `VirtualThread.run`, as `jstack` and JFR show
//! it, and the samples of one task merge whichever carrier ran them. `carrier` keeps the
//! carrier's frames under a `[carrier <thread name>]` frame.

use crate::profile_model::{Frame, FrameId, FrameKind, SymbolizedProfile};

/// The root frame of every virtual thread's own stack.
pub const VIRTUAL_THREAD_RUN: &str = "java.lang.VirtualThread.run";

profiler_common::labelled_enum! {
    /// The `virtual_threads` setting; its label is the setting's value.
    #[derive(Default)]
    pub enum VirtualThreadRoots {
        /// A virtual thread's stack alone, rooted at `VirtualThread.run`.
        #[default]
        Logical => "logical",
        /// A virtual thread's stack above its carrier's, under `[carrier <name>]`.
        Carrier => "carrier",
    }
}

impl VirtualThreadRoots {
    pub const VALUES: &'static str = "\"logical\" or \"carrier\"";
}

/// Roots each virtual thread's sample in `profile` as `roots` says; other samples are left as
/// they are.
pub fn root_virtual_threads(profile: &mut SymbolizedProfile, roots: VirtualThreadRoots) {
    let runs: Vec<Option<usize>> = profile.frames.iter().map(virtual_thread_run_line).collect();
    if runs.iter().all(Option::is_none) {
        return;
    }
    let run_line = |id: &FrameId| runs.get(*id as usize).copied().flatten();
    // Frames where `VirtualThread.run` was inlined into the continuation's entry, split in two
    // once each: the virtual thread's lines, then the carrier's.
    let mut splits: Vec<(FrameId, [FrameId; 2])> = Vec::new();
    let mut carriers: Vec<(u32, FrameId)> = Vec::new();
    for index in 0..profile.samples.len() {
        let sample = &profile.samples[index];
        // Innermost first: the first `run` is this virtual thread's (a nested one's is above).
        let Some((at, line)) = sample
            .frames
            .iter()
            .enumerate()
            .find_map(|(at, id)| Some((at, run_line(id)?)))
        else {
            continue;
        };
        let id = sample.frames[at];
        let thread = sample.thread;
        let split = if line + 1 < profile.frames[id as usize].lines.len() {
            Some(match splits.iter().find(|(of, _)| *of == id) {
                Some((_, parts)) => *parts,
                None => {
                    let parts = split_at_line(profile, id, line);
                    splits.push((id, parts));
                    parts
                }
            })
        } else {
            None
        };
        let marker = match roots {
            VirtualThreadRoots::Logical => None,
            VirtualThreadRoots::Carrier => {
                let thread = thread.unwrap_or(u32::MAX);
                Some(match carriers.iter().find(|(of, _)| *of == thread) {
                    Some((_, marker)) => *marker,
                    None => {
                        let sample = &profile.samples[index];
                        let name = profile.thread(sample).map_or("?", |t| t.name.as_str());
                        let frame = Frame::marker(FrameKind::Root, format!("[carrier {name}]"));
                        let marker = profile.add_frame(frame);
                        carriers.push((thread, marker));
                        marker
                    }
                })
            }
        };
        let frames = &mut profile.samples[index].frames;
        match (marker, split) {
            (None, None) => frames.truncate(at + 1),
            (None, Some([inner, _])) => {
                frames.truncate(at);
                frames.push(inner);
            }
            (Some(marker), None) => frames.insert(at + 1, marker),
            (Some(marker), Some([inner, outer])) => {
                frames.splice(at..=at, [inner, marker, outer]);
            }
        }
    }
}

/// Splits frame `id` after its line `line`: a frame of the lines up to it (inlined code, as
/// they were), and one of the lines after it (the compiled method and what it inlined there).
fn split_at_line(profile: &mut SymbolizedProfile, id: FrameId, line: usize) -> [FrameId; 2] {
    let frame = profile.frames[id as usize].clone();
    let inner = Frame {
        kind: FrameKind::Inlined,
        lines: frame.lines[..=line].to_vec(),
        ..frame.clone()
    };
    let outer = Frame {
        lines: frame.lines[line + 1..].to_vec(),
        ..frame
    };
    [profile.add_frame(inner), profile.add_frame(outer)]
}

/// Which line of `frame` (innermost first) is `java.lang.VirtualThread.run`, if any: its last
/// when the method was not inlined, an inner one when it was inlined into its caller.
fn virtual_thread_run_line(frame: &Frame) -> Option<usize> {
    if !frame.kind.is_jvm() {
        return None;
    }
    frame
        .lines
        .iter()
        .position(|line| line.function == VIRTUAL_THREAD_RUN)
}

/// Whether `frame` ends with `java.lang.VirtualThread.run` (a virtual thread's stack, rooted
/// as `logical` roots it, ends with such a frame).
pub fn is_virtual_thread_run(frame: &Frame) -> bool {
    frame.kind.is_jvm()
        && frame
            .lines
            .last()
            .is_some_and(|line| line.function == VIRTUAL_THREAD_RUN)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profile_model::{ProfileKind, Sample, SampleThread};
    use crate::resolved_frame::{ResolvedFrame, SourceLine};

    /// A virtual thread's stack on carrier 0 (task, `VirtualThread.run`, entry, carrier's
    /// loop), and a platform thread's stack on thread 1.
    fn profile() -> SymbolizedProfile {
        let mut profile = SymbolizedProfile::new(
            ProfileKind::Cpu,
            1,
            std::time::SystemTime::UNIX_EPOCH,
            std::time::Duration::from_secs(1),
        );
        let java = |name: &str| Frame::new(FrameKind::Jit, 0, ResolvedFrame::named(name, None));
        let ids: Vec<FrameId> = [
            "App.task",
            VIRTUAL_THREAD_RUN,
            "jdk.internal.vm.Continuation.enter",
            "java.util.concurrent.ForkJoinPool.runWorker",
            "App.main",
        ]
        .into_iter()
        .map(|name| profile.add_frame(java(name)))
        .collect();
        for name in ["ForkJoinPool-1-worker-3", "main"] {
            profile.add_thread(SampleThread {
                tid: 7,
                name: name.into(),
                source: crate::profile_model::NameSource::Comm,
                virtual_thread: None,
            });
        }
        profile.samples.push(Sample {
            frames: ids[..4].to_vec(),
            values: [1, 0, 0, 0],
            thread: Some(0),
            wait: None,
        });
        profile.samples.push(Sample {
            frames: vec![ids[0], ids[4]],
            values: [1, 0, 0, 0],
            thread: Some(1),
            wait: None,
        });
        profile
    }

    fn names(profile: &SymbolizedProfile, sample: usize) -> Vec<String> {
        profile.samples[sample]
            .frames
            .iter()
            .map(|id| profile.frame(*id).expect("frame").lines[0].function.clone())
            .collect()
    }

    #[test]
    fn logical_stacks_end_at_the_virtual_thread_and_others_are_untouched() {
        let mut profile = profile();
        root_virtual_threads(&mut profile, VirtualThreadRoots::Logical);
        assert_eq!(names(&profile, 0), ["App.task", VIRTUAL_THREAD_RUN]);
        assert_eq!(names(&profile, 1), ["App.task", "App.main"]);
    }

    #[test]
    fn carrier_stacks_keep_the_carrier_under_its_name() {
        let mut profile = profile();
        root_virtual_threads(&mut profile, VirtualThreadRoots::Carrier);
        assert_eq!(
            names(&profile, 0),
            [
                "App.task",
                VIRTUAL_THREAD_RUN,
                "[carrier ForkJoinPool-1-worker-3]",
                "jdk.internal.vm.Continuation.enter",
                "java.util.concurrent.ForkJoinPool.runWorker",
            ]
        );
        assert_eq!(names(&profile, 1), ["App.task", "App.main"]);
    }

    /// The virtual thread's stack with `VirtualThread.run` inlined into the continuation's
    /// compiled `enter` (one frame: `run`, `enter0`, `enter`, innermost first).
    fn inlined_profile() -> SymbolizedProfile {
        let mut profile = profile();
        let mut entry = profile.frames[2].clone();
        entry.lines = [
            VIRTUAL_THREAD_RUN,
            "jdk.internal.vm.Continuation.enter0",
            "jdk.internal.vm.Continuation.enter",
        ]
        .into_iter()
        .map(|name| SourceLine {
            function: name.into(),
            system_name: None,
            file: None,
            line: 0,
        })
        .collect();
        let entry = profile.add_frame(entry);
        let sample = &mut profile.samples[0];
        sample.frames = vec![sample.frames[0], entry, sample.frames[3]];
        profile
    }

    fn lines(profile: &SymbolizedProfile, sample: usize) -> Vec<(String, FrameKind)> {
        profile.samples[sample]
            .frames
            .iter()
            .flat_map(|id| {
                let frame = profile.frame(*id).expect("frame");
                frame.lines.iter().map(|l| (l.function.clone(), frame.kind))
            })
            .collect()
    }

    #[test]
    fn an_inlined_virtual_thread_run_splits_its_frame() {
        let mut logical = inlined_profile();
        root_virtual_threads(&mut logical, VirtualThreadRoots::Logical);
        assert_eq!(
            lines(&logical, 0),
            [
                ("App.task".to_owned(), FrameKind::Jit),
                (VIRTUAL_THREAD_RUN.to_owned(), FrameKind::Inlined),
            ]
        );
        assert!(logical
            .frame(*logical.samples[0].frames.last().expect("a frame"))
            .is_some_and(is_virtual_thread_run));
        let mut carrier = inlined_profile();
        root_virtual_threads(&mut carrier, VirtualThreadRoots::Carrier);
        let names: Vec<String> = lines(&carrier, 0).into_iter().map(|(n, _)| n).collect();
        assert_eq!(
            names,
            [
                "App.task",
                VIRTUAL_THREAD_RUN,
                "[carrier ForkJoinPool-1-worker-3]",
                "jdk.internal.vm.Continuation.enter0",
                "jdk.internal.vm.Continuation.enter",
                "java.util.concurrent.ForkJoinPool.runWorker",
            ]
        );
    }

    #[test]
    fn the_setting_parses_its_two_values() {
        assert_eq!(VirtualThreadRoots::default(), VirtualThreadRoots::Logical);
        for roots in VirtualThreadRoots::ALL {
            assert_eq!(VirtualThreadRoots::from_name(roots.name()), Some(roots));
        }
        assert_eq!(VirtualThreadRoots::from_name("Logical"), None);
    }
}
