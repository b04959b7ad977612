//! Flame graphs (self-contained interactive SVG, through inferno) of a pprof profile, for the
//! local output: a look at a process without any pprof tooling.

use crate::pprof::proto::Profile;

/// The profile's stacks in the "folded" form flame graph tools read: `root;...;leaf count`,
/// one line per sample, inlined frames expanded, thread name as the root frame.
pub fn folded_stacks(profile: &Profile) -> Vec<String> {
    let name_of = |function_id: u64| -> &str {
        profile
            .function
            .get(function_id.wrapping_sub(1) as usize)
            .filter(|f| f.id == function_id)
            .or_else(|| profile.function.iter().find(|f| f.id == function_id))
            .and_then(|f| profile.string_table.get(f.name as usize))
            .map_or("[unknown]", String::as_str)
    };
    let thread_key = profile
        .string_table
        .iter()
        .position(|s| s == "thread_name")
        .map(|i| i as i64);
    let mut lines = Vec::with_capacity(profile.sample.len());
    for sample in &profile.sample {
        let count = sample.value.first().copied().unwrap_or(0);
        if count <= 0 {
            continue;
        }
        let mut frames: Vec<&str> = Vec::new();
        if let Some(thread) = sample
            .label
            .iter()
            .find(|l| Some(l.key) == thread_key)
            .and_then(|l| profile.string_table.get(l.str as usize))
        {
            frames.push(thread);
        }
        // Locations are innermost first, and lines within a location innermost first too.
        for id in sample.location_id.iter().rev() {
            let location = profile
                .location
                .get(id.wrapping_sub(1) as usize)
                .filter(|l| l.id == *id)
                .or_else(|| profile.location.iter().find(|l| l.id == *id));
            if let Some(location) = location {
                frames.extend(
                    location
                        .line
                        .iter()
                        .rev()
                        .map(|line| name_of(line.function_id)),
                );
            }
        }
        // `;` separates frames in the folded format.
        let stack: Vec<String> = frames.iter().map(|f| f.replace(';', ":")).collect();
        lines.push(format!("{} {count}", stack.join(";")));
    }
    lines
}

/// Renders the profile as an SVG flame graph titled `title`, of its first sample type
/// (`count_name` says what that counts: `samples`, `ns off CPU`).
pub fn render_svg(profile: &Profile, title: &str, count_name: &str) -> std::io::Result<Vec<u8>> {
    let lines = folded_stacks(profile);
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
    inferno::flamegraph::from_lines(&mut options, lines.iter().map(String::as_str), &mut svg)
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{LocationKey, ProfileBuilder};
    use crate::symbolize::{ResolvedFrame, SourceLine};
    use std::time::{Duration, SystemTime};

    fn profile() -> Profile {
        let mut builder = ProfileBuilder::new_cpu(100, SystemTime::now(), Duration::from_secs(1));
        let leaf = ResolvedFrame {
            lines: vec![
                SourceLine {
                    function: "inner_[i]".into(),
                    system_name: None,
                    file: None,
                    line: 0,
                },
                SourceLine {
                    function: "outer_[j]".into(),
                    system_name: None,
                    file: None,
                    line: 0,
                },
            ],
            module: None,
        };
        let main = ResolvedFrame::named("main", None);
        let leaf = builder.location(LocationKey::User(1), 1, &leaf);
        let main = builder.location(LocationKey::User(2), 2, &main);
        builder.add_sample(vec![leaf, main], 7, &[("thread_name", "worker")]);
        builder.finish()
    }

    #[test]
    fn stacks_fold_root_first_with_inlined_frames() {
        assert_eq!(
            folded_stacks(&profile()),
            vec!["worker;main;outer_[j];inner_[i] 7".to_string()]
        );
    }

    #[test]
    fn names_a_process_chose_reach_the_svg_printable_and_escaped() {
        let mut builder = ProfileBuilder::new_cpu(100, SystemTime::now(), Duration::from_secs(1));
        let frame = ResolvedFrame::named("f<&>\u{1b}[2J\n\u{9b}", None);
        let leaf = builder.location(LocationKey::User(1), 1, &frame);
        builder.add_sample(vec![leaf], 2, &[("thread_name", "t\u{7}\u{ffff}")]);
        let svg = String::from_utf8(
            render_svg(&builder.finish(), "cpu: x\u{1b}", "samples").expect("renders"),
        )
        .expect("utf-8");
        let bad: Vec<char> = svg
            .chars()
            .filter(|&c| crate::printable::is_unprintable(c) && !matches!(c, '\n' | '\t' | '\r'))
            .collect();
        assert!(bad.is_empty(), "{bad:?}");
        assert!(svg.contains("f&lt;&amp;&gt;?[2J??") && svg.contains("t??"));
    }

    #[test]
    fn renders_an_svg_with_the_frames() {
        let svg = String::from_utf8(render_svg(&profile(), "cpu", "samples").expect("renders"))
            .expect("utf-8");
        assert!(
            svg.contains("<svg")
                && svg.contains("<title>outer (7 samples")
                && svg.contains("<title>inner (7 samples"),
            "{}",
            &svg[..svg.len().min(300)]
        );
    }
}
