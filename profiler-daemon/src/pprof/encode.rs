//! A symbolized profile as pprof: one location per frame, functions and mappings each once,
//! names with their kind's suffix when `annotate` says so (async-profiler's `_[j]`, which the
//! flame graphs' Java palette reads). Samples that ran on a known thread carry the local files'
//! labels: `pid`, `comm`, `thread_name`, `thread_name_source` (`sidecar` or `comm`), the
//! numeric `thread_id` (host tid), and for off-CPU samples `state` and `java_state`. The live
//! stream's subscribers get one process's profiles, not series, so these labels cost nothing
//! there; the remote variant's samples have no thread and so no label.

use super::proto;
use crate::interned::{Interned, StringTable};
use crate::profile_model::{Frame, FrameKind, Sample, SymbolizedProfile, ValueType};

/// `profile` as pprof, with kind suffixes on function names if `annotate`.
pub fn encode(profile: &SymbolizedProfile, annotate: bool) -> proto::Profile {
    let mut tables = Tables::new(annotate);
    let types = profile.kind.sample_types();
    let sample_type: Vec<proto::ValueType> = types
        .values
        .iter()
        .map(|value| tables.value_type(value))
        .collect();
    let period_type = types.period_type.map(|value| tables.value_type(&value));
    let location = (1..)
        .zip(profile.frames.iter())
        .map(|(id, frame)| tables.location(id, frame))
        .collect();
    // Made only for a profile whose samples name their thread (not the remote variant's).
    let has_threads = !profile.threads.is_empty();
    let pid = profile.pid.to_string();
    let process_labels = has_threads.then(|| {
        [
            tables.text_label("pid", &pid),
            tables.text_label("comm", &profile.comm),
        ]
    });
    let sample = profile
        .samples
        .iter()
        .map(|sample| match &process_labels {
            Some(process_labels) => {
                tables.sample(profile, sample, sample_type.len(), process_labels)
            }
            None => unlabelled(sample, sample_type.len()),
        })
        .collect();
    let default_sample_type = sample_type.get(types.default).map_or(0, |t| t.r#type);
    let (start_nanos, duration_nanos) = profile.start_and_duration_nanos();
    proto::Profile {
        sample_type,
        sample,
        mapping: tables.mappings.into_entries(),
        location,
        function: tables.functions.into_entries(),
        string_table: tables.strings.into_strings(),
        drop_frames: 0,
        keep_frames: 0,
        time_nanos: i64::try_from(start_nanos).unwrap_or(i64::MAX),
        duration_nanos: i64::try_from(duration_nanos).unwrap_or(i64::MAX),
        period_type,
        period: profile.period,
        comment: Vec::new(),
        default_sample_type,
    }
}

/// `variant` as pprof, made from `base`: the pprof [`encode`] made, with the same `annotate`, of
/// the profile `variant` derives from (`crate::remote_variant`). The variant's frames begin
/// with that profile's, so `base`'s strings, functions, mappings and locations serve as they
/// are, and only the frames past them (thread roots) are added: no name is interned twice.
pub fn encode_variant(
    variant: &SymbolizedProfile,
    base: &proto::Profile,
    annotate: bool,
) -> proto::Profile {
    let mut encoded = without_samples(base);
    let known = encoded.location.len();
    let Some(added) = variant.frames.get(known..) else {
        // Not a variant of `base`'s profile after all.
        return encode(variant, annotate);
    };
    if !added.is_empty() {
        let mut tables = Tables::resume(&mut encoded, annotate);
        for (id, frame) in (known as u64 + 1..).zip(added) {
            encoded.location.push(tables.location(id, frame));
        }
        tables.put_back(&mut encoded);
    }
    let values = encoded.sample_type.len();
    encoded.sample = variant
        .samples
        .iter()
        .map(|sample| unlabelled(sample, values))
        .collect();
    encoded
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

/// A sample's frames and its `values` values, no label.
fn unlabelled(sample: &Sample, values: usize) -> proto::Sample {
    proto::Sample {
        location_id: sample.frames.iter().map(|&id| u64::from(id) + 1).collect(),
        value: sample.values[..values].to_vec(),
        label: Vec::new(),
    }
}

/// The profile's tables as its frames and samples fill them.
struct Tables {
    annotate: bool,
    strings: StringTable,
    /// By (name, system name, file) string indices.
    functions: Interned<[i64; 3], proto::Function>,
    /// By (file, build-id) string indices.
    mappings: Interned<(i64, i64), proto::Mapping>,
}

impl Tables {
    fn new(annotate: bool) -> Self {
        Self {
            annotate,
            strings: StringTable::default(),
            functions: Interned::starting_with(Vec::new()),
            mappings: Interned::starting_with(Vec::new()),
        }
    }

    /// The tables of `profile` (one [`encode`] made), taken out of it to go on with.
    fn resume(profile: &mut proto::Profile, annotate: bool) -> Self {
        let functions = std::mem::take(&mut profile.function);
        let mappings = std::mem::take(&mut profile.mapping);
        Self {
            annotate,
            strings: StringTable::resumed(std::mem::take(&mut profile.string_table)),
            functions: Interned::resumed(functions, |f| [f.name, f.system_name, f.filename]),
            mappings: Interned::resumed(mappings, |m| (m.filename, m.build_id)),
        }
    }

    /// Puts the tables back into `profile`.
    fn put_back(self, profile: &mut proto::Profile) {
        profile.string_table = self.strings.into_strings();
        profile.function = self.functions.into_entries();
        profile.mapping = self.mappings.into_entries();
    }

    fn string(&mut self, value: &str) -> i64 {
        i64::try_from(self.strings.index(value)).unwrap_or(0)
    }

    fn value_type(&mut self, value: &ValueType) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(value.name),
            unit: self.string(value.unit),
        }
    }

    /// The id of the function of one line of a frame, shown as `kind`.
    fn function(&mut self, kind: FrameKind, line: &crate::profile_model::SourceLine) -> u64 {
        let suffix = if self.annotate { kind.suffix() } else { "" };
        let key = self
            .strings
            .function(line, suffix)
            .map(|index| i64::try_from(index).unwrap_or(0));
        let next_id = self.functions.len() as u64 + 1;
        let [name, system_name, filename] = key;
        let position = self.functions.intern(key, |_| proto::Function {
            id: next_id,
            name,
            system_name,
            filename,
            start_line: 0,
        });
        position as u64 + 1
    }

    /// The id of the mapping of the file `module`: one mapping per file, so a reader sees which
    /// binary each frame is in (and can find its symbols by build-id). Addresses are not given
    /// ranges: a profile's frames are already named (`has_functions`).
    fn mapping(&mut self, module: &str, build_id: Option<&str>) -> u64 {
        let key = (self.string(module), self.string(build_id.unwrap_or("")));
        let next_id = self.mappings.len() as u64 + 1;
        let position = self.mappings.intern(key, |_| proto::Mapping {
            id: next_id,
            filename: key.0,
            build_id: key.1,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
            ..Default::default()
        });
        position as u64 + 1
    }

    fn location(&mut self, id: u64, frame: &Frame) -> proto::Location {
        let line = frame
            .typed_lines()
            .map(|(kind, line)| proto::Line {
                function_id: self.function(kind, line),
                line: i64::from(line.line),
                column: 0,
            })
            .collect();
        let mapping_id = match &frame.module {
            Some(module) => self.mapping(module, frame.build_id.as_deref()),
            None => 0,
        };
        proto::Location {
            id,
            mapping_id,
            address: frame.address,
            line,
            is_folded: false,
        }
    }

    /// One sample: `values` values, and `process_labels` (`pid`, `comm`) with its thread's if
    /// it has a thread.
    fn sample(
        &mut self,
        profile: &SymbolizedProfile,
        sample: &Sample,
        values: usize,
        process_labels: &[proto::Label; 2],
    ) -> proto::Sample {
        proto::Sample {
            label: self.labels(profile, sample, process_labels),
            ..unlabelled(sample, values)
        }
    }

    /// The local files' labels of a sample that has a thread (see the module header).
    fn labels(
        &mut self,
        profile: &SymbolizedProfile,
        sample: &Sample,
        process_labels: &[proto::Label; 2],
    ) -> Vec<proto::Label> {
        let Some(thread) = profile.thread(sample) else {
            return Vec::new();
        };
        let mut labels = Vec::with_capacity(7);
        labels.extend_from_slice(process_labels);
        labels.extend([
            self.text_label("thread_name", &thread.name),
            self.text_label("thread_name_source", thread.source.as_str()),
            proto::Label {
                key: self.string("thread_id"),
                num: i64::from(thread.tid),
                ..Default::default()
            },
        ]);
        if let Some(id) = thread.virtual_thread {
            labels.push(proto::Label {
                key: self.string("virtual_thread_id"),
                num: i64::try_from(id).unwrap_or(i64::MAX),
                ..Default::default()
            });
        }
        if let Some(wait) = sample.wait {
            labels.push(self.text_label("state", wait.task_state));
            if let Some(java_state) = wait.java_state {
                labels.push(self.text_label("java_state", java_state));
            }
        }
        labels
    }

    fn text_label(&mut self, key: &str, value: &str) -> proto::Label {
        proto::Label {
            key: self.string(key),
            str: self.string(value),
            ..Default::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::pprof::{decode, encode_gzipped};
    use crate::profile_model::testing::java_profile;
    use crate::profile_model::{ProfileKind, SourceLine, WaitState};
    use crate::resolved_frame::ResolvedFrame;

    fn names(profile: &proto::Profile) -> Vec<&str> {
        let text = |index: i64| profile.string_table[index as usize].as_str();
        profile
            .location
            .iter()
            .flat_map(|location| &location.line)
            .map(|line| text(profile.function[line.function_id as usize - 1].name))
            .collect()
    }

    #[test]
    fn a_cpu_profile_round_trips_with_its_types_labels_and_period() {
        let encoded = encode(&java_profile(), true);
        let profile = decode(&encode_gzipped(&encoded).expect("encodes")).expect("decodes");
        let s = |i: i64| profile.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<_> = profile
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        let period_type = profile.period_type.expect("period type");
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(s(profile.default_sample_type), "cpu");
        assert_eq!(profile.period, 10_000_000);
        assert_eq!(profile.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(profile.duration_nanos, 15_000_000_000);
        assert_eq!(profile.sample[0].value, [3, 30_000_000]);
        assert_eq!(profile.sample[0].location_id, [1, 2]);
        let labels: Vec<_> = profile.sample[0]
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str), l.num))
            .collect();
        assert_eq!(
            labels,
            [
                ("pid", "7", 0),
                ("comm", "java", 0),
                ("thread_name", "worker-1", 0),
                ("thread_name_source", "sidecar", 0),
                ("thread_id", "", 42),
            ]
        );
    }

    /// The profile's first sample once more, on thread `tid` named `name` (which ran the
    /// virtual thread `virtual_thread`).
    fn again_on(
        profile: &mut SymbolizedProfile,
        tid: u32,
        name: &str,
        virtual_thread: Option<u64>,
    ) {
        let thread = profile.add_thread(crate::profile_model::SampleThread {
            tid,
            name: name.into(),
            source: crate::profile_model::NameSource::Comm,
            virtual_thread,
        });
        let mut again = profile.samples[0].clone();
        again.thread = Some(thread);
        profile.samples.push(again);
    }

    #[test]
    fn a_virtual_thread_s_sample_carries_its_id() {
        let mut profile = java_profile();
        again_on(&mut profile, 44, "ForkJoinPool-1-worker-1", Some(9_001));
        let encoded = encode(&profile, true);
        let s = |i: i64| encoded.string_table[i as usize].as_str();
        let ids: Vec<Option<i64>> = encoded
            .sample
            .iter()
            .map(|sample| {
                let id = sample
                    .label
                    .iter()
                    .find(|l| s(l.key) == "virtual_thread_id");
                id.map(|l| l.num)
            })
            .collect();
        // The platform thread's sample has none.
        assert_eq!(ids, [None, Some(9_001)]);
    }

    #[test]
    fn suffixes_follow_each_line_s_kind_and_the_setting() {
        let profile = java_profile();
        assert_eq!(
            names(&encode(&profile, true)),
            ["Work.inner_[i]", "Work.outer_[j]", "Main.main_[0]"]
        );
        assert_eq!(
            names(&encode(&profile, false)),
            ["Work.inner", "Work.outer", "Main.main"]
        );
    }

    #[test]
    fn frames_of_one_file_share_its_mapping_and_build_id() {
        let mut profile = java_profile();
        let libc: Option<Arc<str>> = Some(Arc::from("/usr/lib/libc.so.6"));
        let build_id: Option<Arc<str>> = Some(Arc::from("0123456789abcdef0123"));
        for (name, address) in [("memcpy", 0x10), ("strlen", 0x20)] {
            let resolved = ResolvedFrame::named(name, libc.clone()).with_build_id(build_id.clone());
            profile.add_frame(Frame::new(FrameKind::Native, address, resolved));
        }
        let encoded = encode(&profile, true);
        assert_eq!(encoded.mapping.len(), 1);
        let mapping_ids: Vec<u64> = encoded.location.iter().map(|l| l.mapping_id).collect();
        assert_eq!(mapping_ids, [0, 0, 1, 1], "Java frames are in no file");
        assert_eq!(encoded.location[2].address, 0x10);
        let text = |index: i64| encoded.string_table[index as usize].as_str();
        assert_eq!(text(encoded.mapping[0].filename), "/usr/lib/libc.so.6");
        assert_eq!(text(encoded.mapping[0].build_id), "0123456789abcdef0123");
    }

    /// Each sample as names: its frames' functions (innermost first) and its values.
    fn shown_samples(profile: &proto::Profile) -> Vec<(Vec<&str>, Vec<i64>)> {
        let text = |index: i64| profile.string_table[index as usize].as_str();
        let function = |id: u64| text(profile.function[id as usize - 1].name);
        profile
            .sample
            .iter()
            .map(|sample| {
                let names = sample
                    .location_id
                    .iter()
                    .flat_map(|&id| &profile.location[id as usize - 1].line)
                    .map(|line| function(line.function_id))
                    .collect();
                (names, sample.value.clone())
            })
            .collect()
    }

    #[test]
    fn a_variant_is_encoded_from_its_profile_s_tables_as_it_would_be_alone() {
        use crate::remote_variant::remote_variant;
        use crate::thread_roots::ThreadRoots;

        let mut profile = java_profile();
        again_on(&mut profile, 43, "worker-2", None);
        let base = encode(&profile, true);
        for roots in [ThreadRoots::Merged, ThreadRoots::Pool, ThreadRoots::Thread] {
            let variant = remote_variant(&profile, roots);
            let from_base = encode_variant(&variant, &base, true);
            let alone = encode(&variant, true);
            assert_eq!(
                shown_samples(&from_base),
                shown_samples(&alone),
                "{roots:?}"
            );
            assert!(from_base
                .sample
                .iter()
                .all(|sample| sample.label.is_empty()));
            assert_eq!(from_base.location.len(), alone.location.len(), "{roots:?}");
        }
    }

    #[test]
    fn off_cpu_samples_say_what_their_thread_waited_in() {
        let mut profile = java_profile();
        profile.kind = ProfileKind::OffCpu;
        profile.samples[0].wait = Some(WaitState {
            task_state: "sleeping",
            java_state: Some("parked"),
        });
        let encoded = encode(&profile, true);
        let text = |index: i64| encoded.string_table[index as usize].as_str();
        let labels: Vec<_> = encoded.sample[0]
            .label
            .iter()
            .skip(5)
            .map(|l| (text(l.key), text(l.str)))
            .collect();
        assert_eq!(labels, [("state", "sleeping"), ("java_state", "parked")]);
        assert_eq!(encoded.sample[0].value.len(), 4);
        assert_eq!(encoded.period_type, None);
    }

    #[test]
    fn strings_a_process_chose_enter_the_table_printable() {
        let mut profile = java_profile();
        profile.comm = "\u{1b}[31mX\u{7}\n".into();
        profile.add_frame(Frame::new(
            FrameKind::Native,
            1,
            ResolvedFrame {
                lines: vec![SourceLine {
                    function: "run\u{1b}[2J".into(),
                    system_name: Some("run\u{1b}[2J(\n)".into()),
                    file: Some("a\u{9b}.c".into()),
                    line: 1,
                }],
                module: None,
                build_id: None,
            },
        ));
        let encoded = encode(&profile, true);
        for text in ["run?[2J", "run?[2J(?)", "a?.c", "?[31mX??"] {
            assert_eq!(
                encoded.string_table.iter().filter(|s| *s == text).count(),
                1,
                "{text:?} in {:?}",
                encoded.string_table
            );
        }
        assert!(!encoded
            .string_table
            .iter()
            .any(|s| s.chars().any(crate::printable::is_unprintable)));
    }
}
