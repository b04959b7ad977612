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
    let runs: Vec<bool> = profile.frames.iter().map(is_virtual_thread_run).collect();
    if !runs.contains(&true) {
        return;
    }
    let is_run = |id: &FrameId| runs.get(*id as usize).copied().unwrap_or(false);
    let mut carriers: Vec<(u32, FrameId)> = Vec::new();
    for index in 0..profile.samples.len() {
        let sample = &profile.samples[index];
        // Innermost first: the first `run` is this virtual thread's (a nested one's is above).
        let Some(at) = sample.frames.iter().position(is_run) else {
            continue;
        };
        match roots {
            VirtualThreadRoots::Logical => profile.samples[index].frames.truncate(at + 1),
            VirtualThreadRoots::Carrier => {
                let thread = sample.thread.unwrap_or(u32::MAX);
                let marker = match carriers.iter().find(|(of, _)| *of == thread) {
                    Some((_, marker)) => *marker,
                    None => {
                        let name = profile.thread(sample).map_or("?", |t| t.name.as_str());
                        let frame = Frame::marker(FrameKind::Root, format!("[carrier {name}]"));
                        let marker = profile.add_frame(frame);
                        carriers.push((thread, marker));
                        marker
                    }
                };
                profile.samples[index].frames.insert(at + 1, marker);
            }
        }
    }
}

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
    use crate::resolved_frame::ResolvedFrame;

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

    #[test]
    fn the_setting_parses_its_two_values() {
        assert_eq!(VirtualThreadRoots::default(), VirtualThreadRoots::Logical);
        for roots in VirtualThreadRoots::ALL {
            assert_eq!(VirtualThreadRoots::from_name(roots.name()), Some(roots));
        }
        assert_eq!(VirtualThreadRoots::from_name("Logical"), None);
    }
}
