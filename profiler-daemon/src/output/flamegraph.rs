//! Flame graphs (self-contained interactive SVG, through inferno) of pprof profiles, for the
//! local output and the `view` command: a look at a process or a service without any pprof
//! tooling.

use hashbrown::HashMap;

use crate::pprof::proto::{Location, Profile};
use crate::pprof::string_at;
use crate::thread_roots::ThreadRoots;
use crate::virtual_thread_roots::VIRTUAL_THREAD_RUN;

/// Whether a function named `name` in a pprof profile (maybe suffixed with its frame kind,
/// `_[0]`) is `java.lang.VirtualThread.run`.
fn is_virtual_thread_run(name: &str) -> bool {
    name.strip_prefix(VIRTUAL_THREAD_RUN)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with("_["))
}

/// Hands each sample of `profile` to `add` as flame graphs read it: its frames root first
/// (inlined frames expanded, each frame as `frame` makes it from its name), with its value
/// ([`FlameValue`]). Stacks are rooted at their thread as `threads` asks, from the
/// `thread_name` and `thread_id` labels local files and the live stream keep whatever the
/// setting. Samples with a value of 0 or less are skipped. `frame` is called once per
/// location and thread of the profile, not per sample.
pub fn fold_samples<F: Clone>(
    profile: &Profile,
    threads: ThreadRoots,
    mut frame: impl FnMut(&str) -> F,
    mut add: impl FnMut(&[F], u64),
) {
    let string = |index: i64| string_at(profile, index);
    let name_of = |function_id: u64| -> &str {
        profile
            .function
            .get(function_id.wrapping_sub(1) as usize)
            .filter(|f| f.id == function_id)
            .or_else(|| profile.function.iter().find(|f| f.id == function_id))
            .map_or("[unknown]", |f| string(f.name))
    };
    // Lines within a location are innermost first.
    let location_frames = |location: &Location, frame: &mut dyn FnMut(&str) -> F| -> Vec<F> {
        location
            .line
            .iter()
            .rev()
            .map(|line| frame(name_of(line.function_id)))
            .collect()
    };
    // Ids are usually positions + 1 (as the builder numbers them); others are looked up.
    let mut by_position: Vec<Option<Vec<F>>> = vec![None; profile.location.len()];
    let mut roots: HashMap<(i64, u32, bool), Option<F>> = HashMap::new();
    let key_of = |name: &str| profile.string_table.iter().position(|s| s == name);
    let (thread_key, tid_key) = (key_of("thread_name"), key_of("thread_id"));
    let mut stack: Vec<F> = Vec::new();
    let value = FlameValue::of(profile);
    for sample in &profile.sample {
        let Some(count) = value.of_sample(&sample.value) else {
            continue;
        };
        if count == 0 {
            continue;
        }
        stack.clear();
        let label = |key: Option<usize>| {
            let key = key?;
            sample.label.iter().find(|l| l.key as usize == key)
        };
        if let Some(thread) = label(thread_key).filter(|l| l.str != 0) {
            let tid = label(tid_key).map_or(0, |l| u32::try_from(l.num).unwrap_or(0));
            // A virtual thread's own stack ends at `VirtualThread.run` (its outermost line).
            let virtual_thread = sample
                .location_id
                .last()
                .and_then(|id| profile.location.iter().find(|l| l.id == *id))
                .and_then(|location| location.line.last())
                .is_some_and(|line| is_virtual_thread_run(name_of(line.function_id)));
            let root = roots
                .entry((thread.str, tid, virtual_thread))
                .or_insert_with(|| {
                    threads
                        .root_frame(string(thread.str), tid, virtual_thread)
                        .map(|root| frame(&root))
                });
            stack.extend(root.clone());
        }
        // Locations are innermost first.
        for id in sample.location_id.iter().rev() {
            let position = id.wrapping_sub(1) as usize;
            match profile.location.get(position).filter(|l| l.id == *id) {
                Some(location) => stack.extend_from_slice(
                    by_position[position]
                        .get_or_insert_with(|| location_frames(location, &mut frame)),
                ),
                None => {
                    if let Some(location) = profile.location.iter().find(|l| l.id == *id) {
                        stack.extend(location_frames(location, &mut frame));
                    }
                }
            }
        }
        add(&stack, count);
    }
}

/// Which of a sample's values a flame graph draws: the first sample type's (samples of CPU
/// profiles, time blocked of off-CPU ones), for allocation profiles the bytes, in and outside
/// TLABs together, for lock profiles the delay.
enum FlameValue {
    First,
    At(usize),
    Sum([usize; 2]),
}

impl FlameValue {
    fn of(profile: &Profile) -> Self {
        let type_at = |name: &str| {
            profile
                .sample_type
                .iter()
                .position(|t| string_at(profile, t.r#type) == name)
        };
        match (
            type_at(crate::profile_model::ALLOC_IN_NEW_TLAB_BYTES),
            type_at(crate::profile_model::ALLOC_OUTSIDE_TLAB_BYTES),
            type_at(crate::profile_model::LOCK_DELAY),
        ) {
            (Some(tlab), Some(outside), _) => Self::Sum([tlab, outside]),
            (_, _, Some(delay)) => Self::At(delay),
            _ => Self::First,
        }
    }

    /// `None` for a negative or missing value.
    fn of_sample(&self, values: &[i64]) -> Option<u64> {
        let value = |at: usize| values.get(at).and_then(|&v| u64::try_from(v).ok());
        match self {
            Self::First => value(0),
            Self::At(at) => value(*at),
            Self::Sum(at) => value(at[0])?.checked_add(value(at[1])?),
        }
    }
}

/// A frame's name as the folded form holds it: `;` separates frames there.
pub fn folded_frame(name: &str) -> std::borrow::Cow<'_, str> {
    if name.contains(';') {
        std::borrow::Cow::Owned(name.replace(';', ":"))
    } else {
        std::borrow::Cow::Borrowed(name)
    }
}

/// The profile's stacks in the folded form flame graph tools read, `root;...;leaf count`, one
/// line per sample (see [`fold_samples`]).
pub fn folded_stacks(profile: &Profile, threads: ThreadRoots) -> Vec<String> {
    let mut lines = Vec::with_capacity(profile.sample.len());
    fold_samples(
        profile,
        threads,
        |name| std::rc::Rc::<str>::from(folded_frame(name)),
        |frames, count| {
            let mut line = frames.join(";");
            line.push_str(&format!(" {count}"));
            lines.push(line);
        },
    );
    lines
}

/// Renders the profile as an SVG flame graph titled `title`, of its first sample type
/// (`count_name` says what that counts: `samples`, `ns off CPU`), threads shown as `threads`
/// asks. `None` when no stack has a count to draw (samples of weight 0 only: inferno refuses
/// an empty graph).
pub fn render_svg(
    profile: &Profile,
    threads: ThreadRoots,
    title: &str,
    count_name: &str,
) -> std::io::Result<Option<Vec<u8>>> {
    let lines = folded_stacks(profile, threads);
    if lines.is_empty() {
        return Ok(None);
    }
    render_folded(lines.iter().map(String::as_str), title, count_name).map(Some)
}

/// Renders folded lines (`stack count`, or `stack before after` for a differential flame
/// graph, coloured by the change) as an SVG flame graph.
pub fn render_folded<'a>(
    lines: impl IntoIterator<Item = &'a str>,
    title: &str,
    count_name: &str,
) -> std::io::Result<Vec<u8>> {
    let mut options = inferno::flamegraph::Options::default();
    // XML allows no control characters: the frames' names are printable as every string of a
    // profile is (`pprof::ProfileBuilder::string`); the title may name the process, so it is
    // made printable here.
    options.title = crate::printable::printable(title).into_owned();
    options.count_name = count_name.to_owned();
    // The Java palette reads the `_[j]`/`_[i]`/`_[0]`/`_[k]` suffixes to colour frames by kind
    // (and hides them from the labels), as async-profiler's flame graphs do.
    options.colors =
        inferno::flamegraph::color::Palette::Multi(inferno::flamegraph::color::MultiPalette::Java);
    let mut svg = Vec::new();
    inferno::flamegraph::from_lines(&mut options, lines, &mut svg)
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::encode;
    use crate::profile_model::testing::cpu_profile;
    use crate::profile_model::{Frame, FrameKind, SourceLine};

    /// A JIT frame with a method inlined, under `main`, sampled on two threads of one pool.
    fn profile() -> Profile {
        let mut profile = cpu_profile(&[
            (&["main"], 7, Some(("worker-1", 11))),
            (&["main"], 2, Some(("worker-2", 12))),
        ]);
        let line = |function: &str| SourceLine {
            function: function.into(),
            system_name: None,
            file: None,
            line: 0,
        };
        let leaf = profile.add_frame(Frame {
            kind: FrameKind::Jit,
            lines: vec![line("inner"), line("outer")],
            module: None,
            build_id: None,
            address: 1,
        });
        for sample in &mut profile.samples {
            sample.frames.insert(0, leaf);
        }
        encode(&profile, true)
    }

    #[test]
    fn stacks_fold_root_first_with_inlined_frames_rooted_as_asked() {
        assert_eq!(
            folded_stacks(&profile(), ThreadRoots::Merged),
            vec!["main;outer_[j];inner_[i] 7", "main;outer_[j];inner_[i] 2"]
        );
        assert_eq!(
            folded_stacks(&profile(), ThreadRoots::Pool),
            vec![
                "[worker-*];main;outer_[j];inner_[i] 7",
                "[worker-*];main;outer_[j];inner_[i] 2"
            ]
        );
        assert_eq!(
            folded_stacks(&profile(), ThreadRoots::Thread),
            vec![
                "[worker-1 tid=11];main;outer_[j];inner_[i] 7",
                "[worker-2 tid=12];main;outer_[j];inner_[i] 2"
            ]
        );
    }

    #[test]
    fn samples_without_thread_labels_have_no_root_and_separators_stay_inside_frames() {
        let profile = cpu_profile(&[(&["a;b"], 3, None), (&["a;b"], 0, None)]);
        assert_eq!(
            folded_stacks(&encode(&profile, true), ThreadRoots::Thread),
            vec!["a:b 3"]
        );
    }

    #[test]
    fn names_a_process_chose_reach_the_svg_printable_and_escaped() {
        let profile = cpu_profile(&[(&["f<&>\u{1b}[2J\n\u{9b}"], 2, Some(("t\u{7}\u{ffff}", 1)))]);
        let svg = String::from_utf8(
            render_svg(
                &encode(&profile, true),
                ThreadRoots::Thread,
                "cpu: x\u{1b}",
                "samples",
            )
            .expect("renders")
            .expect("a graph"),
        )
        .expect("utf-8");
        let bad: Vec<char> = svg
            .chars()
            .filter(|&c| crate::printable::is_unprintable(c) && !matches!(c, '\n' | '\t' | '\r'))
            .collect();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(svg.contains("f&lt;&amp;&gt;?[2J??") && svg.contains("t??"));
    }

    /// Samples whose values are all zero (an off-CPU profile whose waits were all filtered)
    /// draw nothing: no graph, rather than inferno's "No stack counts found" error.
    #[test]
    fn a_profile_of_zero_counts_has_no_graph() {
        let profile = encode(&cpu_profile(&[(&["f"], 0, None)]), true);
        assert!(!profile.sample.is_empty());
        assert!(render_svg(&profile, ThreadRoots::Merged, "cpu", "samples")
            .expect("renders")
            .is_none());
    }

    #[test]
    fn renders_an_svg_with_the_frames() {
        let svg = String::from_utf8(
            render_svg(&profile(), ThreadRoots::Merged, "cpu", "samples")
                .expect("renders")
                .expect("a graph"),
        )
        .expect("utf-8");
        assert!(
            svg.contains("<svg")
                && svg.contains("<title>outer (9 samples")
                && svg.contains("<title>inner (9 samples"),
            "{}",
            &svg[..svg.len().min(300)]
        );
    }
}
