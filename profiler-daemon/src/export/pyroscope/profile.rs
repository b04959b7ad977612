//! The profile Pyroscope gets, derived from the one the local files get (`profiles::build`):
//! no sample labels, since Pyroscope makes one series per distinct set of string sample labels
//! and a thread name, pid or tid there would make a series per thread and per restart; stacks
//! merged across threads by default, or rooted at their thread's pool or thread as the
//! `threads` setting says ([`ThreadRoots`]); samples whose stacks are then equal, merged.

use hashbrown::HashMap;

use crate::pprof::{proto, LocationKey, ProfileBuilder};
use crate::profiles::BuiltProfile;
use crate::resolved_frame::ResolvedFrame;
use crate::thread_roots::ThreadRoots;

/// The profile Pyroscope gets: `built`'s without sample labels, each stack rooted as `threads`
/// asks, and samples whose stacks are then equal merged. The local samples are read, never
/// cloned; the builder (and its string index) is made only when roots are added.
pub fn export_profile(built: &BuiltProfile, threads: ThreadRoots) -> proto::Profile {
    let local = &built.profile;
    let mut profile = without_samples(local);
    let mut roots: Option<(ProfileBuilder, HashMap<String, u64>)> = None;
    let mut merged: Vec<proto::Sample> = Vec::with_capacity(local.sample.len());
    let mut index_of: HashMap<Vec<u64>, usize> = HashMap::with_capacity(local.sample.len());
    for (sample, thread) in local.sample.iter().zip(&built.threads) {
        let mut location_ids = sample.location_id.clone();
        if let Some(frame) = threads.root_frame(&thread.name, thread.tid) {
            let (builder, ids) = roots.get_or_insert_with(|| {
                (
                    ProfileBuilder::resume(std::mem::take(&mut profile)),
                    HashMap::new(),
                )
            });
            let id = *ids.entry(frame).or_insert_with_key(|frame| {
                let key = LocationKey::ThreadRoot(builder.string(frame));
                builder.location_with(key, 0, || ResolvedFrame::named(frame.clone(), None))
            });
            // Locations are innermost first: the root goes last.
            location_ids.push(id);
        }
        match index_of.entry(location_ids) {
            hashbrown::hash_map::Entry::Occupied(entry) => {
                let values = &mut merged[*entry.get()].value;
                for (total, value) in values.iter_mut().zip(&sample.value) {
                    *total = total.saturating_add(*value);
                }
            }
            hashbrown::hash_map::Entry::Vacant(entry) => {
                merged.push(proto::Sample {
                    location_id: entry.key().clone(),
                    value: sample.value.clone(),
                    label: Vec::new(),
                });
                entry.insert(merged.len() - 1);
            }
        }
    }
    if let Some((builder, _)) = roots {
        profile = builder.finish();
    }
    profile.sample = merged;
    profile
}

/// `profile` without its samples, every other field cloned. Written out field by field (no
/// `..`), so that a field added to the message fails to compile here rather than go missing.
fn without_samples(profile: &proto::Profile) -> proto::Profile {
    let proto::Profile {
        sample_type,
        sample: _,
        mapping,
        location,
        function,
        string_table,
        drop_frames,
        keep_frames,
        time_nanos,
        duration_nanos,
        period_type,
        period,
        comment,
        default_sample_type,
    } = profile;
    proto::Profile {
        sample_type: sample_type.clone(),
        sample: Vec::new(),
        mapping: mapping.clone(),
        location: location.clone(),
        function: function.clone(),
        string_table: string_table.clone(),
        drop_frames: *drop_frames,
        keep_frames: *keep_frames,
        time_nanos: *time_nanos,
        duration_nanos: *duration_nanos,
        period_type: *period_type,
        period: *period,
        comment: comment.clone(),
        default_sample_type: *default_sample_type,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::profiles::fixtures::*;

    /// Three threads of one pool and `main`, all on one stack: 3, 2, 1 and 1 samples.
    fn pool_and_main() -> BuiltProfile {
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

    #[test]
    fn exported_profiles_merge_threads_by_default_and_carry_no_labels() {
        let built = pool_and_main();
        assert_eq!(
            built.profile.sample.len(),
            4,
            "one sample per thread locally"
        );
        let export = export_profile(&built, ThreadRoots::default());
        assert_eq!(summary(&export), vec![(7, vec![], vec![], "[unknown]")]);
        // The merged stack is the local one, no frame added; both values summed.
        assert_eq!(
            export.sample[0].location_id,
            built.profile.sample[0].location_id
        );
        assert_eq!(export.sample[0].value, vec![7, 7 * export.period]);
        assert_eq!(export.location.len(), built.profile.location.len());
    }

    #[test]
    fn exported_profiles_root_stacks_at_their_pool_or_thread_when_asked() {
        let built = pool_and_main();
        let pools = export_profile(&built, ThreadRoots::Pool);
        assert_eq!(
            summary(&pools),
            vec![
                (1, vec![], vec![], "[main]"),
                (6, vec![], vec![], "[pool-1-thread-*]"),
            ]
        );
        let threads = export_profile(&built, ThreadRoots::Thread);
        assert_eq!(
            summary(&threads),
            vec![
                (1, vec![], vec![], "[main tid=73]"),
                (1, vec![], vec![], "[pool-1-thread-13 tid=72]"),
                (2, vec![], vec![], "[pool-1-thread-2 tid=71]"),
                (3, vec![], vec![], "[pool-1-thread-1 tid=70]"),
            ]
        );
        // The stack under the root is the local one.
        for exported in &threads.sample {
            assert_eq!(
                exported.location_id[..exported.location_id.len() - 1],
                built.profile.sample[0].location_id[..]
            );
        }
        assert_eq!(threads.location.len(), built.profile.location.len() + 4);
    }

    #[test]
    fn names_a_process_chose_are_printable_in_every_variant() {
        // A `comm` set with escape sequences (prctl(PR_SET_NAME) takes any bytes).
        let built = built_on("\u{1b}[31mX\u{7}\n\u{9b}");
        let shown = "?[31mX???";
        assert_eq!(built.comm, shown);
        let samples = summary(&built.profile);
        assert!(samples[0].1.contains(&("comm", shown)));
        assert!(samples[0].1.contains(&("thread_name", shown)));
        let threads = export_profile(&built, ThreadRoots::Thread);
        assert_eq!(summary(&threads)[0].3, format!("[{shown} tid=71]"));
        let pools = export_profile(&built, ThreadRoots::Pool);
        assert_eq!(summary(&pools)[0].3, "[?[*mX???]");
        for profile in [&built.profile, &threads, &pools] {
            assert!(!profile
                .string_table
                .iter()
                .any(|s| s.chars().any(crate::printable::is_unprintable)));
        }
    }
}
