//! Profiles in OTLP's form. The pprof profiles of one request share one dictionary (strings,
//! functions, locations, stacks, attributes), and each becomes one OTLP `Profile` per sample
//! type: in the current protocol a `Profile` has a single sample type, so a CPU profile's
//! sample counts and nanoseconds are two.

use hashbrown::HashMap;

use crate::export::proto::opentelemetry::proto::common::v1::{any_value, AnyValue};
use crate::export::proto::opentelemetry::proto::profiles::v1development as otlp;
use crate::frame_kind::ShownKind;
use crate::pprof::{proto as pprof, string_at};

/// The attribute naming a frame's runtime, as the semantic conventions name it.
const FRAME_TYPE: &str = "profile.frame.type";
/// A mapping's GNU build-id (hex), as the semantic conventions name it.
const BUILD_ID: &str = "process.executable.build_id.gnu";

/// What ran a frame, as `profile.frame.type` says it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum FrameType {
    Kernel,
    Jvm,
    Native,
}

impl FrameType {
    fn name(self) -> &'static str {
        match self {
            Self::Kernel => "kernel",
            Self::Jvm => "jvm",
            Self::Native => "native",
        }
    }
}

/// The JVM kinds' suffixes (`_[j]`...) and the kernel's: a frame name ending in one ran there.
const SUFFIXED_KINDS: [(ShownKind, FrameType); 5] = [
    (ShownKind::Kernel, FrameType::Kernel),
    (ShownKind::Interpreted, FrameType::Jvm),
    (ShownKind::C1, FrameType::Jvm),
    (ShownKind::Jit, FrameType::Jvm),
    (ShownKind::Inlined, FrameType::Jvm),
];

/// A frame name without its kind suffix, and the frame type the suffix gives. `annotated` says
/// whether the profile's frames carry suffixes at all (`annotate_frames`): when they do, a
/// frame without one is native code; when not, and for the profile's own marker frames
/// (`[pool-1-thread-*]`), the type is not known.
fn split_kind(name: &str, annotated: bool) -> (&str, Option<FrameType>) {
    for (kind, frame_type) in SUFFIXED_KINDS {
        if let Some(bare) = name.strip_suffix(kind.suffix()) {
            return (bare, Some(frame_type));
        }
    }
    let known = annotated && !name.starts_with('[');
    (name, known.then_some(FrameType::Native))
}

#[derive(PartialEq, Eq, Hash)]
struct LocationKey {
    mapping_index: i32,
    address: u64,
    /// (function index, line) per line, innermost first.
    lines: Vec<(i32, i64)>,
    frame_type: Option<FrameType>,
}

/// One request's dictionary, built as its profiles are converted. Every table starts with its
/// zero value, which index 0 refers to.
pub struct Dictionary {
    tables: otlp::ProfilesDictionary,
    strings: HashMap<String, i32>,
    functions: HashMap<(i32, i32, i32), i32>,
    locations: HashMap<LocationKey, i32>,
    stacks: HashMap<Vec<i32>, i32>,
    /// (file, build-id) string indices -> mapping index.
    mappings: HashMap<(i32, i32), i32>,
    /// (key, value) -> attribute index.
    attributes: HashMap<(&'static str, String), i32>,
}

impl Default for Dictionary {
    fn default() -> Self {
        let mut strings = HashMap::new();
        strings.insert(String::new(), 0);
        Self {
            tables: otlp::ProfilesDictionary {
                mapping_table: vec![otlp::Mapping::default()],
                location_table: vec![otlp::Location::default()],
                function_table: vec![otlp::Function::default()],
                link_table: vec![otlp::Link::default()],
                string_table: vec![String::new()],
                attribute_table: vec![otlp::KeyValueAndUnit::default()],
                stack_table: vec![otlp::Stack::default()],
            },
            strings,
            functions: HashMap::new(),
            locations: HashMap::new(),
            stacks: HashMap::new(),
            mappings: HashMap::new(),
            attributes: HashMap::new(),
        }
    }
}

/// The next index of a table of `len` entries (tables are far below 2^31 entries: a request
/// holds a few MiB of profiles).
fn next_index(len: usize) -> i32 {
    i32::try_from(len).unwrap_or(i32::MAX)
}

impl Dictionary {
    pub fn finish(self) -> otlp::ProfilesDictionary {
        self.tables
    }

    fn string(&mut self, value: &str) -> i32 {
        if let Some(&index) = self.strings.get(value) {
            return index;
        }
        let index = next_index(self.tables.string_table.len());
        self.tables.string_table.push(value.to_owned());
        self.strings.insert(value.to_owned(), index);
        index
    }

    /// The index of the string attribute `key` = `value`.
    fn attribute(&mut self, key: &'static str, value: &str) -> i32 {
        if let Some(&index) = self.attributes.get(&(key, value.to_owned())) {
            return index;
        }
        let key_strindex = self.string(key);
        let index = next_index(self.tables.attribute_table.len());
        self.tables.attribute_table.push(otlp::KeyValueAndUnit {
            key_strindex,
            value: Some(AnyValue {
                value: Some(any_value::Value::StringValue(value.to_owned())),
            }),
            unit_strindex: 0,
        });
        self.attributes.insert((key, value.to_owned()), index);
        index
    }

    /// The index of the mapping of the file `file`, with its build-id if known.
    fn mapping(&mut self, file: &str, build_id: &str) -> i32 {
        let key = (self.string(file), self.string(build_id));
        if let Some(&index) = self.mappings.get(&key) {
            return index;
        }
        let attribute_indices = if build_id.is_empty() {
            Vec::new()
        } else {
            vec![self.attribute(BUILD_ID, build_id)]
        };
        let index = next_index(self.tables.mapping_table.len());
        self.tables.mapping_table.push(otlp::Mapping {
            filename_strindex: key.0,
            attribute_indices,
            ..Default::default()
        });
        self.mappings.insert(key, index);
        index
    }

    fn function(&mut self, name: &str, system_name: &str, file: &str) -> i32 {
        let key = (
            self.string(name),
            self.string(system_name),
            self.string(file),
        );
        if let Some(&index) = self.functions.get(&key) {
            return index;
        }
        let index = next_index(self.tables.function_table.len());
        self.tables.function_table.push(otlp::Function {
            name_strindex: key.0,
            system_name_strindex: key.1,
            filename_strindex: key.2,
            start_line: 0,
        });
        self.functions.insert(key, index);
        index
    }

    /// The dictionary index of each of `profile`'s locations, by pprof location id - 1.
    fn locations(&mut self, profile: &pprof::Profile, annotated: bool) -> Vec<i32> {
        let text = |index: i64| string_at(profile, index);
        let function_by_id: HashMap<u64, &pprof::Function> =
            profile.function.iter().map(|f| (f.id, f)).collect();
        let mapping_by_id: HashMap<u64, &pprof::Mapping> =
            profile.mapping.iter().map(|m| (m.id, m)).collect();
        profile
            .location
            .iter()
            .map(|location| {
                // The frame's kind is its physical function's: the last line (the innermost
                // lines are the functions inlined into it).
                let mut frame_type = None;
                let mut lines = Vec::with_capacity(location.line.len());
                for (position, line) in location.line.iter().enumerate() {
                    let Some(function) = function_by_id.get(&line.function_id) else {
                        continue;
                    };
                    let (name, kind) = split_kind(text(function.name), annotated);
                    let (system_name, _) = split_kind(text(function.system_name), annotated);
                    if position + 1 == location.line.len() {
                        frame_type = kind;
                    }
                    let index = self.function(name, system_name, text(function.filename));
                    lines.push((index, line.line));
                }
                let mapping_index = mapping_by_id
                    .get(&location.mapping_id)
                    .map_or(0, |m| self.mapping(text(m.filename), text(m.build_id)));
                self.location(LocationKey {
                    mapping_index,
                    address: location.address,
                    lines,
                    frame_type,
                })
            })
            .collect()
    }

    fn location(&mut self, key: LocationKey) -> i32 {
        if let Some(&index) = self.locations.get(&key) {
            return index;
        }
        let attribute_indices = match key.frame_type {
            Some(frame_type) => vec![self.attribute(FRAME_TYPE, frame_type.name())],
            None => Vec::new(),
        };
        let index = next_index(self.tables.location_table.len());
        self.tables.location_table.push(otlp::Location {
            mapping_index: key.mapping_index,
            address: key.address,
            lines: key
                .lines
                .iter()
                .map(|&(function_index, line)| otlp::Line {
                    function_index,
                    line,
                    column: 0,
                })
                .collect(),
            attribute_indices,
        });
        self.locations.insert(key, index);
        index
    }

    fn stack(&mut self, location_indices: Vec<i32>) -> i32 {
        if let Some(&index) = self.stacks.get(&location_indices) {
            return index;
        }
        let index = next_index(self.tables.stack_table.len());
        self.stacks.insert(location_indices.clone(), index);
        self.tables
            .stack_table
            .push(otlp::Stack { location_indices });
        index
    }

    fn value_type(
        &mut self,
        profile: &pprof::Profile,
        value_type: &pprof::ValueType,
    ) -> otlp::ValueType {
        let text = |index: i64| string_at(profile, index);
        otlp::ValueType {
            type_strindex: self.string(text(value_type.r#type)),
            unit_strindex: self.string(text(value_type.unit)),
        }
    }

    /// `profile` as OTLP profiles, one per sample type, its entries added to the dictionary.
    /// A sample with a zero value for a type is left out of that type's profile.
    pub fn profiles(&mut self, profile: &pprof::Profile, annotated: bool) -> Vec<otlp::Profile> {
        let locations = self.locations(profile, annotated);
        let period_type = profile
            .period_type
            .as_ref()
            .map(|period_type| self.value_type(profile, period_type));
        let mut converted: Vec<otlp::Profile> = profile
            .sample_type
            .iter()
            .map(|sample_type| otlp::Profile {
                sample_type: Some(self.value_type(profile, sample_type)),
                time_unix_nano: u64::try_from(profile.time_nanos).unwrap_or(0),
                duration_nano: u64::try_from(profile.duration_nanos).unwrap_or(0),
                period_type,
                period: profile.period,
                ..Default::default()
            })
            .collect();
        for sample in &profile.sample {
            let stack: Vec<i32> = sample
                .location_id
                .iter()
                .filter_map(|&id| locations.get(usize::try_from(id).ok()?.checked_sub(1)?))
                .copied()
                .collect();
            let stack_index = self.stack(stack);
            for (target, &value) in converted.iter_mut().zip(&sample.value) {
                if value != 0 {
                    target.samples.push(otlp::Sample {
                        stack_index,
                        values: vec![value],
                        ..Default::default()
                    });
                }
            }
        }
        converted
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::LocationKey as PprofKey;
    use crate::pprof::ProfileBuilder;
    use crate::resolved_frame::{ResolvedFrame, SourceLine};
    use std::time::{Duration, SystemTime};

    fn line(function: &str, line: u32) -> SourceLine {
        SourceLine {
            function: function.into(),
            system_name: None,
            file: Some("Work.java".into()),
            line,
        }
    }

    /// A CPU profile: a Java stack (an inlined chain in a JIT frame, under an interpreted
    /// one), a native frame and a kernel frame; 3 samples of one stack, 2 of another.
    fn cpu_profile() -> pprof::Profile {
        let mut builder =
            ProfileBuilder::new_cpu(100, SystemTime::UNIX_EPOCH, Duration::from_secs(1));
        let jit = builder.location(
            PprofKey::User(0x1000),
            0x1000,
            &ResolvedFrame {
                lines: vec![line("Work.inner_[i]", 7), line("Work.outer_[j]", 3)],
                module: None,
                build_id: None,
            },
        );
        let interpreted = builder.location(
            PprofKey::User(0x2000),
            0x2000,
            &ResolvedFrame::named("Main.main_[0]", None),
        );
        let native = builder.location(
            PprofKey::User(0x3000),
            0x3000,
            &ResolvedFrame::named("memcpy", Some("/usr/lib/libc.so.6".into()))
                .with_build_id(Some("00112233445566778899aabbccddeeff00112233".into())),
        );
        let kernel = builder.location(
            PprofKey::Kernel(0x4000),
            0x4000,
            &ResolvedFrame::named("do_syscall_64_[k]", None),
        );
        builder.add_sample(vec![jit, interpreted], 3, &[]);
        builder.add_sample(vec![kernel, native, interpreted], 2, &[]);
        builder.finish()
    }

    fn text(dictionary: &otlp::ProfilesDictionary, index: i32) -> &str {
        &dictionary.string_table[index as usize]
    }

    #[test]
    fn one_profile_per_sample_type_with_the_pprof_totals() {
        let pprof = cpu_profile();
        let mut dictionary = Dictionary::default();
        let profiles = dictionary.profiles(&pprof, true);
        let dictionary = dictionary.finish();
        assert_eq!(profiles.len(), pprof.sample_type.len());
        for (index, profile) in profiles.iter().enumerate() {
            let pprof_total: i64 = pprof.sample.iter().map(|s| s.value[index]).sum();
            let total: i64 = profile.samples.iter().map(|s| s.values[0]).sum();
            assert_eq!(total, pprof_total);
            let sample_type = profile.sample_type.expect("set");
            let pprof_type = &pprof.sample_type[index];
            assert_eq!(
                text(&dictionary, sample_type.type_strindex),
                pprof.string_table[pprof_type.r#type as usize]
            );
        }
        assert_eq!(
            text(
                &dictionary,
                profiles[0].sample_type.expect("set").type_strindex
            ),
            "samples"
        );
        assert_eq!(
            profiles[0].samples.iter().map(|s| s.values[0]).sum::<i64>(),
            5
        );
    }

    #[test]
    fn tables_start_with_zero_values_and_frames_carry_their_type() {
        let mut dictionary = Dictionary::default();
        let profiles = dictionary.profiles(&cpu_profile(), true);
        let dictionary = dictionary.finish();
        assert_eq!(dictionary.string_table[0], "");
        assert_eq!(dictionary.location_table[0], otlp::Location::default());
        assert_eq!(dictionary.function_table[0], otlp::Function::default());
        assert_eq!(dictionary.stack_table[0], otlp::Stack::default());
        assert_eq!(dictionary.mapping_table[0], otlp::Mapping::default());
        assert_eq!(
            dictionary.attribute_table[0],
            otlp::KeyValueAndUnit::default()
        );
        // The first sample's stack: the JIT frame (two lines, innermost first), then main.
        let stack = &dictionary.stack_table[profiles[0].samples[0].stack_index as usize];
        let frame = |index: i32| {
            let location = &dictionary.location_table[index as usize];
            let names: Vec<&str> = location
                .lines
                .iter()
                .map(|line| {
                    let function = &dictionary.function_table[line.function_index as usize];
                    text(&dictionary, function.name_strindex)
                })
                .collect();
            let attribute = &dictionary.attribute_table[location.attribute_indices[0] as usize];
            let Some(any_value::Value::StringValue(kind)) =
                attribute.value.as_ref().and_then(|v| v.value.clone())
            else {
                panic!("a string frame type");
            };
            assert_eq!(text(&dictionary, attribute.key_strindex), FRAME_TYPE);
            (names.join(" < "), kind)
        };
        let frames: Vec<_> = stack.location_indices.iter().map(|&i| frame(i)).collect();
        assert_eq!(
            frames,
            [
                ("Work.inner < Work.outer".to_owned(), "jvm".to_owned()),
                ("Main.main".to_owned(), "jvm".to_owned())
            ]
        );
        let second = &dictionary.stack_table[profiles[0].samples[1].stack_index as usize];
        let kinds: Vec<String> = second
            .location_indices
            .iter()
            .map(|&i| frame(i).1)
            .collect();
        assert_eq!(kinds, ["kernel", "native", "jvm"]);
    }

    #[test]
    fn profiles_of_one_request_share_the_dictionary() {
        let mut dictionary = Dictionary::default();
        let first = dictionary.profiles(&cpu_profile(), true);
        let sizes = |d: &Dictionary| {
            (
                d.tables.string_table.len(),
                d.tables.location_table.len(),
                d.tables.stack_table.len(),
            )
        };
        let after_one = sizes(&dictionary);
        let second = dictionary.profiles(&cpu_profile(), true);
        assert_eq!(
            sizes(&dictionary),
            after_one,
            "nothing new in the same profile again"
        );
        assert_eq!(first[0].samples, second[0].samples);
    }

    #[test]
    fn without_suffixes_only_what_the_name_tells_is_typed() {
        assert_eq!(
            split_kind("memcpy", true),
            ("memcpy", Some(FrameType::Native))
        );
        assert_eq!(split_kind("memcpy", false), ("memcpy", None));
        assert_eq!(
            split_kind("[pool-1-thread-*]", true),
            ("[pool-1-thread-*]", None)
        );
        assert_eq!(
            split_kind("a.B.c_[1]", false),
            ("a.B.c", Some(FrameType::Jvm))
        );
    }
}
