//! The profile the remote sinks (Pyroscope and OTLP) get, derived once per process and
//! interval from the symbolized one and shared by both: no thread per sample, since Pyroscope
//! makes one series per distinct set of string sample labels and a thread name, pid or tid
//! there would make a series per thread and per restart. Stacks are merged across threads by
//! default, as Pyroscope's own agents push them, or rooted at their thread's pool or thread as
//! the `threads` setting says ([`ThreadRoots`]); samples whose stacks are then equal are merged.

use hashbrown::hash_map::Entry;
use hashbrown::HashMap;

use crate::profile_model::{Frame, FrameId, FrameKind, Sample, SymbolizedProfile};
use crate::thread_roots::ThreadRoots;
use crate::virtual_thread_roots::is_virtual_thread_run;

/// `profile` for the remote sinks: threads merged or rooted as `roots` asks, equal stacks
/// merged, no wait labels.
pub fn remote_variant(profile: &SymbolizedProfile, roots: ThreadRoots) -> SymbolizedProfile {
    let mut variant = profile.frames_only();
    let mut root_ids: HashMap<String, FrameId> = HashMap::new();
    let mut index_of: HashMap<Vec<FrameId>, usize> = HashMap::with_capacity(profile.samples.len());
    for sample in &profile.samples {
        let mut frames = sample.frames.clone();
        let virtual_thread = sample
            .frames
            .last()
            .and_then(|id| profile.frames.get(*id as usize))
            .is_some_and(is_virtual_thread_run);
        let root = profile
            .thread(sample)
            .and_then(|thread| roots.root_frame(&thread.name, thread.tid, virtual_thread));
        if let Some(root) = root {
            let id = *root_ids
                .entry(root)
                .or_insert_with_key(|root| variant.add_frame(Frame::marker(FrameKind::Root, root)));
            // Frames are innermost first: the root goes last.
            frames.push(id);
        }
        match index_of.entry(frames) {
            Entry::Occupied(entry) => {
                let merged = &mut variant.samples[*entry.get()].values;
                for (total, value) in merged.iter_mut().zip(sample.values) {
                    *total = total.saturating_add(value);
                }
            }
            Entry::Vacant(entry) => {
                variant.samples.push(Sample {
                    frames: entry.key().clone(),
                    values: sample.values,
                    thread: None,
                    wait: None,
                });
                entry.insert(variant.samples.len() - 1);
            }
        }
    }
    variant
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::fixtures::*;

    /// Three threads of one pool and `main`, all on one stack: 3, 2, 1 and 1 samples.
    fn pool_and_main() -> SymbolizedProfile {
        built_from(&[
            (70, "pool-1-thread-1"),
            (70, "pool-1-thread-1"),
            (70, "pool-1-thread-1"),
            (71, "pool-1-thread-2"),
            (71, "pool-1-thread-2"),
            (72, "pool-1-thread-13"),
            (73, "main"),
        ])
    }

    /// Per sample of the variant: its samples count and its root frame's name, sorted.
    fn roots_and_counts(variant: &SymbolizedProfile) -> Vec<(i64, String)> {
        let mut samples: Vec<_> = variant
            .samples
            .iter()
            .map(|sample| {
                let root = sample.frames.last().and_then(|id| variant.frame(*id));
                let name = root.map_or("", |frame| frame.lines[0].function.as_str());
                (sample.values[0], name.to_owned())
            })
            .collect();
        samples.sort();
        samples
    }

    #[test]
    fn threads_are_merged_by_default_and_no_sample_keeps_a_thread() {
        let profile = pool_and_main();
        assert_eq!(profile.samples.len(), 4, "one sample per thread locally");
        let variant = remote_variant(&profile, ThreadRoots::default());
        assert_eq!(roots_and_counts(&variant), [(7, "[unknown]".to_owned())]);
        // The merged stack is the local one, no frame added; both values summed.
        assert_eq!(variant.samples[0].frames, profile.samples[0].frames);
        assert_eq!(variant.samples[0].values[..2], [7, 7 * variant.period]);
        assert!(
            std::sync::Arc::ptr_eq(&variant.frames, &profile.frames),
            "merged, the variant shares the profile's frames"
        );
        assert!(variant.threads.is_empty());
        assert!(variant.samples.iter().all(|s| s.thread.is_none()));
    }

    #[test]
    fn stacks_are_rooted_at_their_pool_or_thread_when_asked() {
        let profile = pool_and_main();
        let pools = remote_variant(&profile, ThreadRoots::Pool);
        assert_eq!(
            roots_and_counts(&pools),
            [(1, "[main]".into()), (6, "[pool-1-thread-*]".into())]
        );
        let threads = remote_variant(&profile, ThreadRoots::Thread);
        assert_eq!(
            roots_and_counts(&threads),
            [
                (1, "[main tid=73]".into()),
                (1, "[pool-1-thread-13 tid=72]".into()),
                (2, "[pool-1-thread-2 tid=71]".into()),
                (3, "[pool-1-thread-1 tid=70]".into()),
            ]
        );
        // The stack under the root is the local one; roots are frames of their own kind.
        for sample in &threads.samples {
            let (root, stack) = sample.frames.split_last().expect("frames");
            assert_eq!(stack, profile.samples[0].frames);
            assert_eq!(threads.frames[*root as usize].kind, FrameKind::Root);
        }
        assert_eq!(threads.frames.len(), profile.frames.len() + 4);
    }

    #[test]
    fn names_a_process_chose_are_printable_in_every_variant() {
        // A `comm` set with escape sequences (prctl(PR_SET_NAME) takes any bytes).
        let profile = built_on("\u{1b}[31mX\u{7}\n\u{9b}");
        let shown = "?[31mX???";
        assert_eq!(profile.comm, shown);
        assert!(profile.threads.iter().all(|thread| thread.name == shown));
        let threads = remote_variant(&profile, ThreadRoots::Thread);
        assert_eq!(roots_and_counts(&threads)[0].1, format!("[{shown} tid=71]"));
        let pools = remote_variant(&profile, ThreadRoots::Pool);
        assert_eq!(roots_and_counts(&pools)[0].1, "[?[*mX???]");
    }
}
