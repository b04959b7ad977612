//! Profiles in OTLP's form. The profiles of one request share one dictionary (strings,
//! functions, locations, stacks, attributes), and each becomes one OTLP `Profile` per sample
//! type: in the current protocol a `Profile` has a single sample type, so a CPU profile's
//! sample counts and nanoseconds are two. Every location says what ran it
//! (`profile.frame.type`), from the frame's kind; names carry no suffix.

use crate::export::proto::opentelemetry::proto::common::v1::{any_value, AnyValue};
use crate::export::proto::opentelemetry::proto::profiles::v1development as otlp;
use crate::interned::{Interned, StringTable};
use crate::profile_model::{Frame, FrameKind, SourceLine, SymbolizedProfile, ValueType};

/// The attribute naming a frame's runtime, as the semantic conventions name it.
const FRAME_TYPE: &str = "profile.frame.type";
/// A mapping's GNU build-id (hex), as the semantic conventions name it.
const BUILD_ID: &str = "process.executable.build_id.gnu";

/// What ran a frame, as `profile.frame.type` says it: the semantic conventions' values where
/// one applies; `abort-marker` for where a stack was cut (the OpenTelemetry eBPF profiler's
/// value for it); `marker` for the roots the profiler adds.
fn frame_type(kind: FrameKind) -> &'static str {
    match kind {
        FrameKind::Kernel => "kernel",
        FrameKind::Native => "native",
        FrameKind::Interpreted
        | FrameKind::C1
        | FrameKind::Jit
        | FrameKind::Inlined
        | FrameKind::Jvm => "jvm",
        FrameKind::Truncated => "abort-marker",
        FrameKind::Root => "marker",
    }
}

#[derive(PartialEq, Eq, Hash)]
struct LocationKey {
    mapping_index: i32,
    address: u64,
    /// (function index, line) per line, innermost first.
    lines: Vec<(i32, i64)>,
    frame_type: &'static str,
}

/// One request's dictionary, built as its profiles are converted. Every table starts with its
/// zero value, which index 0 refers to.
pub struct Dictionary {
    strings: StringTable,
    /// By (name, system name, file) string indices.
    functions: Interned<[i32; 3], otlp::Function>,
    locations: Interned<LocationKey, otlp::Location>,
    stacks: Interned<Vec<i32>, otlp::Stack>,
    /// By (file, build-id) string indices.
    mappings: Interned<(i32, i32), otlp::Mapping>,
    /// By (key, value).
    attributes: Interned<(&'static str, String), otlp::KeyValueAndUnit>,
}

impl Default for Dictionary {
    fn default() -> Self {
        Self {
            strings: StringTable::default(),
            functions: Interned::starting_with(vec![otlp::Function::default()]),
            locations: Interned::starting_with(vec![otlp::Location::default()]),
            stacks: Interned::starting_with(vec![otlp::Stack::default()]),
            mappings: Interned::starting_with(vec![otlp::Mapping::default()]),
            attributes: Interned::starting_with(vec![otlp::KeyValueAndUnit::default()]),
        }
    }
}

/// A table index as the protocol carries it (tables are far below 2^31 entries: a request
/// holds a few MiB of profiles).
fn index(position: usize) -> i32 {
    i32::try_from(position).unwrap_or(i32::MAX)
}

impl Dictionary {
    pub fn finish(self) -> otlp::ProfilesDictionary {
        otlp::ProfilesDictionary {
            mapping_table: self.mappings.into_entries(),
            location_table: self.locations.into_entries(),
            function_table: self.functions.into_entries(),
            link_table: vec![otlp::Link::default()],
            string_table: self.strings.into_strings(),
            attribute_table: self.attributes.into_entries(),
            stack_table: self.stacks.into_entries(),
        }
    }

    fn string(&mut self, value: &str) -> i32 {
        index(self.strings.index(value))
    }

    /// The index of the string attribute `key` = `value`.
    fn attribute(&mut self, key: &'static str, value: &str) -> i32 {
        let key_strindex = self.string(key);
        index(
            self.attributes
                .intern((key, value.to_owned()), |_| otlp::KeyValueAndUnit {
                    key_strindex,
                    value: Some(AnyValue {
                        value: Some(any_value::Value::StringValue(value.to_owned())),
                    }),
                    unit_strindex: 0,
                }),
        )
    }

    /// The index of the mapping of the file `file`, with its build-id if known.
    fn mapping(&mut self, file: &str, build_id: Option<&str>) -> i32 {
        let build_id = build_id.unwrap_or("");
        let key = (self.string(file), self.string(build_id));
        let attribute_indices = match build_id {
            "" => Vec::new(),
            build_id => vec![self.attribute(BUILD_ID, build_id)],
        };
        index(self.mappings.intern(key, |_| otlp::Mapping {
            filename_strindex: key.0,
            attribute_indices,
            ..Default::default()
        }))
    }

    fn function(&mut self, line: &SourceLine) -> i32 {
        let key = self.strings.function(line, "").map(index);
        let [name_strindex, system_name_strindex, filename_strindex] = key;
        index(self.functions.intern(key, |_| otlp::Function {
            name_strindex,
            system_name_strindex,
            filename_strindex,
            start_line: 0,
        }))
    }

    fn location(&mut self, frame: &Frame) -> i32 {
        let lines = frame
            .lines
            .iter()
            .map(|line| (self.function(line), i64::from(line.line)))
            .collect();
        let mapping_index = match &frame.module {
            Some(module) => self.mapping(module, frame.build_id.as_deref()),
            None => 0,
        };
        let key = LocationKey {
            mapping_index,
            address: frame.address,
            lines,
            frame_type: frame_type(frame.kind),
        };
        let attribute_indices = vec![self.attribute(FRAME_TYPE, key.frame_type)];
        index(self.locations.intern(key, |key| {
            otlp::Location {
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
            }
        }))
    }

    fn value_type(&mut self, value: &ValueType) -> otlp::ValueType {
        otlp::ValueType {
            type_strindex: self.string(value.name),
            unit_strindex: self.string(value.unit),
        }
    }

    /// `profile` as OTLP profiles, one per sample type, its entries added to the dictionary.
    /// A sample with a zero value for a type is left out of that type's profile.
    pub fn profiles(&mut self, profile: &SymbolizedProfile) -> Vec<otlp::Profile> {
        let locations: Vec<i32> = profile.frames.iter().map(|f| self.location(f)).collect();
        let types = profile.kind.sample_types();
        let period_type = types.period_type.map(|value| self.value_type(&value));
        let (time_unix_nano, duration_nano) = profile.start_and_duration_nanos();
        let mut converted: Vec<otlp::Profile> = types
            .values
            .iter()
            .map(|value| otlp::Profile {
                sample_type: Some(self.value_type(value)),
                time_unix_nano,
                duration_nano,
                period_type,
                period: profile.period,
                ..Default::default()
            })
            .collect();
        for sample in &profile.samples {
            let stack: Vec<i32> = sample
                .frames
                .iter()
                .filter_map(|&id| locations.get(id as usize).copied())
                .collect();
            let stack_index = index(self.stacks.intern(stack, |stack| otlp::Stack {
                location_indices: stack.clone(),
            }));
            for (target, &value) in converted.iter_mut().zip(&sample.values) {
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
    use crate::profile_model::testing::java_profile;
    use crate::profile_model::Sample;
    use crate::resolved_frame::ResolvedFrame;

    /// [`java_profile`]'s Java stack sampled 3 times, and 2 samples of a kernel frame over a
    /// native one (in libc, with its build-id) over `Main.main`, cut by the depth bound.
    fn cpu_profile() -> SymbolizedProfile {
        let mut profile = java_profile();
        let interpreted = profile.samples[0].frames[1];
        let named = |name: &str| ResolvedFrame::named(name, None);
        let libc = ResolvedFrame::named("memcpy", Some("/usr/lib/libc.so.6".into()))
            .with_build_id(Some("00112233445566778899aabbccddeeff00112233".into()));
        let native = profile.add_frame(Frame::new(FrameKind::Native, 0x3000, libc));
        let kernel = profile.add_frame(Frame::new(
            FrameKind::Kernel,
            0x4000,
            named("do_syscall_64"),
        ));
        let cut = profile.add_frame(Frame::marker(
            FrameKind::Truncated,
            "[truncated: max_depth]",
        ));
        profile.samples.push(Sample {
            frames: vec![kernel, native, interpreted, cut],
            values: [2, 20_000_000, 0, 0],
            thread: None,
            wait: None,
        });
        profile
    }

    fn text(dictionary: &otlp::ProfilesDictionary, index: i32) -> &str {
        &dictionary.string_table[index as usize]
    }

    #[test]
    fn one_profile_per_sample_type_with_the_profile_s_totals() {
        let profile = cpu_profile();
        let mut dictionary = Dictionary::default();
        let profiles = dictionary.profiles(&profile);
        let dictionary = dictionary.finish();
        let types = profile.kind.sample_types().values;
        assert_eq!(profiles.len(), types.len());
        for (index, converted) in profiles.iter().enumerate() {
            let expected: i64 = profile.samples.iter().map(|s| s.values[index]).sum();
            let total: i64 = converted.samples.iter().map(|s| s.values[0]).sum();
            assert_eq!(total, expected);
            let sample_type = converted.sample_type.expect("set");
            assert_eq!(
                text(&dictionary, sample_type.type_strindex),
                types[index].name
            );
        }
        assert_eq!(
            profiles[0].samples.iter().map(|s| s.values[0]).sum::<i64>(),
            5
        );
        assert_eq!(profiles[1].period, 10_000_000);
    }

    #[test]
    fn tables_start_with_zero_values_and_every_frame_carries_its_type() {
        let mut dictionary = Dictionary::default();
        let profiles = dictionary.profiles(&cpu_profile());
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
        // The first sample's stack: the JIT frame (two lines, innermost first), then main.
        let stack = &dictionary.stack_table[profiles[0].samples[0].stack_index as usize];
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
        assert_eq!(kinds, ["kernel", "native", "jvm", "abort-marker"]);
        // Every location has its type, whatever the `annotate_frames` setting (names have none).
        for index in 1..dictionary.location_table.len() {
            assert!(!frame(index as i32).1.is_empty());
        }
    }

    #[test]
    fn profiles_of_one_request_share_the_dictionary() {
        let mut dictionary = Dictionary::default();
        let first = dictionary.profiles(&cpu_profile());
        let sizes = |d: &Dictionary| (d.strings.len(), d.locations.len(), d.stacks.len());
        let after_one = sizes(&dictionary);
        let second = dictionary.profiles(&cpu_profile());
        assert_eq!(
            sizes(&dictionary),
            after_one,
            "nothing new in the same profile again"
        );
        assert_eq!(first[0].samples, second[0].samples);
    }
}
