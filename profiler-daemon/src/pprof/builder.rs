//! Assembles one pprof profile: interns strings, functions and locations so each appears once.
//!
//! Every string of a profile passes through [`ProfileBuilder::string`], so that is where text a
//! profiled process chose (labels, function, file and thread names) is made printable
//! ([`crate::printable`]): once, for every output, since the local files, their flame graphs,
//! Pyroscope's variant and the live stream are all this profile or built from it.

use std::borrow::Cow;
use std::time::{Duration, SystemTime};

use hashbrown::HashMap;

use super::proto;
use crate::printable::printable;
use crate::symbolize::ResolvedFrame;

/// Identifies a location within one profile. Kernel and user addresses never collide (the
/// kernel lives in the upper half); synthetic frames get their own space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LocationKey {
    Kernel(u64),
    User(u64),
    /// A marker frame such as `[truncated: max_depth]`, by marker number.
    Marker(u8),
    /// A synthetic root frame naming a thread or its pool (`crate::thread_roots`), by the
    /// frame's text (string index): a thread renamed within the interval gets a root per name.
    ThreadRoot(i64),
    /// A HotSpot frame as the BPF unwinder recorded it (see `profiler_common::FrameKind`); the
    /// top frame resolves differently from a return address, hence `top`.
    Java {
        kind: u8,
        addr: u64,
        aux: u32,
        cookie: u32,
        top: bool,
    },
}

/// One sample label: a string (`str`), or a number (`num`, with an optional unit).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label<'a> {
    Str(&'a str, &'a str),
    Num {
        key: &'a str,
        value: i64,
        /// e.g. `bytes`; empty for none.
        unit: &'a str,
    },
}

pub struct ProfileBuilder {
    profile: proto::Profile,
    strings: HashMap<String, i64>,
    functions: HashMap<(i64, i64, i64), u64>,
    /// (file, build-id) string indices -> mapping id.
    mappings: HashMap<(i64, i64), u64>,
    locations: HashMap<LocationKey, u64>,
    period_ns: i64,
}

impl ProfileBuilder {
    /// A CPU profile: each sample counts `samples/count` and `cpu/nanoseconds` (count x period).
    pub fn new_cpu(frequency_hz: u64, start: SystemTime, duration: Duration) -> Self {
        let period_ns = (1_000_000_000 / frequency_hz.max(1)) as i64;
        let mut builder = Self::empty(period_ns, start, duration);
        let samples = builder.value_type("samples", "count");
        let cpu = builder.value_type("cpu", "nanoseconds");
        builder.profile.sample_type = vec![samples, cpu];
        builder.profile.period_type = Some(cpu);
        builder.profile.period = period_ns;
        builder.profile.default_sample_type = cpu.r#type;
        builder
    }

    /// An off-CPU profile: each sample has `off_cpu/nanoseconds` (time blocked, the type
    /// Pyroscope's `off_cpu` profiles carry), `runqueue/nanoseconds` (time runnable but waiting
    /// for a CPU), `samples/count` (waits sampled) and `waits/count` (the waits they stand
    /// for). No period: waits are measured, not counted at a rate.
    pub fn new_off_cpu(start: SystemTime, duration: Duration) -> Self {
        let mut builder = Self::empty(0, start, duration);
        let off_cpu = builder.value_type("off_cpu", "nanoseconds");
        let runqueue = builder.value_type("runqueue", "nanoseconds");
        let samples = builder.value_type("samples", "count");
        let waits = builder.value_type("waits", "count");
        builder.profile.sample_type = vec![off_cpu, runqueue, samples, waits];
        builder.profile.default_sample_type = off_cpu.r#type;
        builder
    }

    /// An allocation profile: per sample `alloc_in_new_tlab_objects/count`,
    /// `alloc_in_new_tlab_bytes/bytes`, `alloc_outside_tlab_objects/count` and
    /// `alloc_outside_tlab_bytes/bytes` (the names and order Pyroscope's `memory` profiles from
    /// JFR carry, so Grafana's views apply), period `space/bytes` of `interval_bytes`.
    pub fn new_alloc(interval_bytes: u64, start: SystemTime, duration: Duration) -> Self {
        let mut builder = Self::empty(0, start, duration);
        let types = [
            (super::ALLOC_IN_NEW_TLAB_OBJECTS, "count"),
            (super::ALLOC_IN_NEW_TLAB_BYTES, "bytes"),
            (super::ALLOC_OUTSIDE_TLAB_OBJECTS, "count"),
            (super::ALLOC_OUTSIDE_TLAB_BYTES, "bytes"),
        ]
        .map(|(name, unit)| builder.value_type(name, unit));
        builder.profile.sample_type = types.to_vec();
        builder.profile.default_sample_type = types[1].r#type;
        builder.profile.period_type = Some(builder.value_type("space", "bytes"));
        builder.profile.period = i64::try_from(interval_bytes).unwrap_or(i64::MAX);
        builder
    }

    /// A lock profile: per sample `contentions/count` (waits) and `delay/nanoseconds` (their
    /// time), period `<period_type>/count`: `mutex` or `block`, the names Pyroscope gives
    /// JFR's monitor and park events.
    pub fn new_lock(period_type: &str, start: SystemTime, duration: Duration) -> Self {
        let mut builder = Self::empty(0, start, duration);
        let contentions = builder.value_type("contentions", "count");
        let delay = builder.value_type(super::LOCK_DELAY, "nanoseconds");
        builder.profile.sample_type = vec![contentions, delay];
        builder.profile.default_sample_type = delay.r#type;
        builder.profile.period_type = Some(builder.value_type(period_type, "count"));
        builder.profile.period = 1;
        builder
    }

    fn empty(period_ns: i64, start: SystemTime, duration: Duration) -> Self {
        let mut builder = Self {
            profile: proto::Profile::default(),
            strings: HashMap::new(),
            functions: HashMap::new(),
            mappings: HashMap::new(),
            locations: HashMap::new(),
            period_ns,
        };
        builder.string(""); // index 0 is the empty string, by the format's rule
        builder.profile.time_nanos = start
            .duration_since(SystemTime::UNIX_EPOCH)
            .map(|d| d.as_nanos() as i64)
            .unwrap_or(0);
        builder.profile.duration_nanos = duration.as_nanos() as i64;
        builder
    }

    /// Carries on building `profile` (e.g. a copy of a finished one, to derive a variant):
    /// its strings and functions are interned again; new locations must use keys of their own
    /// (such as [`LocationKey::ThreadRoot`]), as the keys of its locations are not known.
    pub fn resume(profile: proto::Profile) -> Self {
        let strings = profile
            .string_table
            .iter()
            .enumerate()
            .map(|(index, value)| (value.clone(), index as i64))
            .collect();
        let functions = profile
            .function
            .iter()
            .map(|f| ((f.name, f.system_name, f.filename), f.id))
            .collect();
        let mappings = profile
            .mapping
            .iter()
            .map(|m| ((m.filename, m.build_id), m.id))
            .collect();
        Self {
            period_ns: profile.period,
            profile,
            strings,
            functions,
            mappings,
            locations: HashMap::new(),
        }
    }

    /// The index of `value` in the string table, as shown ([`printable`]: the table holds only
    /// printable text, whatever a profiled process named its code or threads).
    pub fn string(&mut self, value: &str) -> i64 {
        if let Some(&index) = self.strings.get(value) {
            return index;
        }
        let shown = printable(value);
        if let Cow::Owned(shown) = &shown {
            if let Some(&index) = self.strings.get(shown.as_str()) {
                return index;
            }
        }
        let index = self.profile.string_table.len() as i64;
        self.profile.string_table.push(shown.clone().into_owned());
        self.strings.insert(shown.into_owned(), index);
        index
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> proto::ValueType {
        proto::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    fn function(&mut self, name: &str, system_name: &str, file: &str) -> u64 {
        let key = (
            self.string(name),
            self.string(system_name),
            self.string(file),
        );
        if let Some(&id) = self.functions.get(&key) {
            return id;
        }
        let id = self.profile.function.len() as u64 + 1;
        self.profile.function.push(proto::Function {
            id,
            name: key.0,
            system_name: key.1,
            filename: key.2,
            start_line: 0,
        });
        self.functions.insert(key, id);
        id
    }

    /// The mapping id of the file `module` with `build_id`: one mapping per file, so a reader
    /// sees which binary each frame is in (and can find its symbols by build-id). Addresses are
    /// not given ranges: a profile covers processes whose files map at different addresses,
    /// and its frames are already named (`has_functions`).
    fn mapping(&mut self, module: &str, build_id: Option<&str>) -> u64 {
        let key = (self.string(module), self.string(build_id.unwrap_or("")));
        if let Some(&id) = self.mappings.get(&key) {
            return id;
        }
        let id = self.profile.mapping.len() as u64 + 1;
        self.profile.mapping.push(proto::Mapping {
            id,
            memory_start: 0,
            memory_limit: 0,
            file_offset: 0,
            filename: key.0,
            build_id: key.1,
            has_functions: true,
            has_filenames: true,
            has_line_numbers: true,
            has_inline_frames: true,
        });
        self.mappings.insert(key, id);
        id
    }

    /// The location id for `key`, creating it from `frame` the first time.
    pub fn location(&mut self, key: LocationKey, address: u64, frame: &ResolvedFrame) -> u64 {
        self.location_with(key, address, || frame.clone())
    }

    /// The location id for `key`, resolving the frame only the first time it is seen.
    pub fn location_with(
        &mut self,
        key: LocationKey,
        address: u64,
        resolve: impl FnOnce() -> ResolvedFrame,
    ) -> u64 {
        if let Some(&id) = self.locations.get(&key) {
            return id;
        }
        let frame = resolve();
        let lines = frame
            .lines
            .iter()
            .map(|line| proto::Line {
                function_id: self.function(
                    &line.function,
                    line.system_name.as_deref().unwrap_or(&line.function),
                    line.file.as_deref().unwrap_or(""),
                ),
                line: line.line as i64,
                column: 0,
            })
            .collect();
        let mapping_id = match &frame.module {
            Some(module) => self.mapping(module, frame.build_id.as_deref()),
            None => 0,
        };
        let id = self.profile.location.len() as u64 + 1;
        self.profile.location.push(proto::Location {
            id,
            mapping_id,
            address,
            line: lines,
            is_folded: false,
        });
        self.locations.insert(key, id);
        id
    }

    /// Adds `count` samples of one stack (location ids, innermost first) with string labels.
    pub fn add_sample(&mut self, location_ids: Vec<u64>, count: u64, labels: &[(&str, &str)]) {
        let labels: Vec<Label<'_>> = labels.iter().map(|(k, v)| Label::Str(k, v)).collect();
        self.add_sample_with(location_ids, count, &labels);
    }

    /// Adds `count` CPU samples of one stack (location ids, innermost first).
    pub fn add_sample_with(&mut self, location_ids: Vec<u64>, count: u64, labels: &[Label<'_>]) {
        let values = vec![count as i64, count as i64 * self.period_ns];
        self.add_sample_values(location_ids, values, labels);
    }

    /// Adds one stack with a value per sample type, in the profile's order.
    pub fn add_sample_values(
        &mut self,
        location_ids: Vec<u64>,
        values: Vec<i64>,
        labels: &[Label<'_>],
    ) {
        let label = labels.iter().map(|label| self.label(label)).collect();
        self.profile.sample.push(proto::Sample {
            location_id: location_ids,
            value: values,
            label,
        });
    }

    /// A label for a sample of this profile.
    pub fn label(&mut self, label: &Label<'_>) -> proto::Label {
        match *label {
            Label::Str(key, value) => proto::Label {
                key: self.string(key),
                str: self.string(value),
                num: 0,
                num_unit: 0,
            },
            Label::Num { key, value, unit } => proto::Label {
                key: self.string(key),
                str: 0,
                num: value,
                num_unit: if unit.is_empty() {
                    0
                } else {
                    self.string(unit)
                },
            },
        }
    }

    /// The samples added so far, e.g. to change their labels or locations.
    pub fn samples_mut(&mut self) -> &mut [proto::Sample] {
        &mut self.profile.sample
    }

    pub fn finish(self) -> proto::Profile {
        self.profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pprof::{decode, encode_gzipped};
    use std::sync::Arc;

    #[test]
    fn builds_a_cpu_profile_that_round_trips() {
        let start = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let mut builder = ProfileBuilder::new_cpu(100, start, Duration::from_secs(15));
        let leaf = ResolvedFrame::named("leaf", None);
        let main = ResolvedFrame::named("main", None);
        let leaf_id = builder.location(LocationKey::User(0x10), 0x10, &leaf);
        let main_id = builder.location(LocationKey::User(0x20), 0x20, &main);
        // Interned: asking again gives the same id.
        assert_eq!(
            builder.location(LocationKey::User(0x10), 0x10, &leaf),
            leaf_id
        );
        builder.add_sample(
            vec![leaf_id, main_id],
            3,
            &[("pid", "1"), ("thread_name", "t")],
        );

        let profile = decode(&encode_gzipped(&builder.finish()).expect("encode")).expect("decode");
        let s = |i: i64| profile.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        assert_eq!(
            profile
                .sample_type
                .iter()
                .map(|t| (s(t.r#type), s(t.unit)))
                .collect::<Vec<_>>(),
            vec![("samples", "count"), ("cpu", "nanoseconds")]
        );
        let period_type = profile.period_type.expect("period type");
        assert_eq!(
            (s(period_type.r#type), s(period_type.unit)),
            ("cpu", "nanoseconds")
        );
        assert_eq!(profile.period, 10_000_000);
        assert_eq!(profile.time_nanos, 1_700_000_000_000_000_000);
        assert_eq!(profile.duration_nanos, 15_000_000_000);
        assert_eq!(profile.sample.len(), 1);
        assert_eq!(profile.sample[0].value, vec![3, 30_000_000]);
        assert_eq!(profile.location.len(), 2);
        assert_eq!(profile.function.len(), 2);
        let labels: Vec<_> = profile.sample[0]
            .label
            .iter()
            .map(|l| (s(l.key), s(l.str)))
            .collect();
        assert_eq!(labels, vec![("pid", "1"), ("thread_name", "t")]);
    }

    #[test]
    fn frames_of_one_file_share_its_mapping_and_build_id() {
        let mut builder = ProfileBuilder::new_cpu(100, SystemTime::UNIX_EPOCH, Duration::ZERO);
        let libc: Option<Arc<str>> = Some(Arc::from("/usr/lib/libc.so.6"));
        let build_id: Option<Arc<str>> = Some(Arc::from("0123456789abcdef0123"));
        let memcpy = ResolvedFrame::named("memcpy", libc.clone()).with_build_id(build_id.clone());
        let strlen = ResolvedFrame::named("strlen", libc).with_build_id(build_id);
        let java = ResolvedFrame::named("Main.main_[j]", None);
        let ids = [
            builder.location(LocationKey::User(1), 1, &memcpy),
            builder.location(LocationKey::User(2), 2, &strlen),
            builder.location(LocationKey::User(3), 3, &java),
        ];
        let profile = builder.finish();
        let mapping_of = |id: u64| profile.location[id as usize - 1].mapping_id;
        assert_eq!(profile.mapping.len(), 1);
        assert_eq!(mapping_of(ids[0]), profile.mapping[0].id);
        assert_eq!(mapping_of(ids[1]), profile.mapping[0].id);
        assert_eq!(mapping_of(ids[2]), 0, "a frame of no file has no mapping");
        let text = |index: i64| profile.string_table[index as usize].as_str();
        assert_eq!(text(profile.mapping[0].filename), "/usr/lib/libc.so.6");
        assert_eq!(text(profile.mapping[0].build_id), "0123456789abcdef0123");
        // Resumed (Pyroscope's variant), the mapping is found again, not made twice.
        let mut resumed = ProfileBuilder::resume(profile);
        let again = ResolvedFrame::named("memset", Some(Arc::from("/usr/lib/libc.so.6")))
            .with_build_id(Some(Arc::from("0123456789abcdef0123")));
        resumed.location(LocationKey::ThreadRoot(9), 4, &again);
        assert_eq!(resumed.finish().mapping.len(), 1);
    }

    #[test]
    fn strings_a_process_chose_enter_the_table_printable() {
        let mut builder = ProfileBuilder::new_cpu(100, SystemTime::UNIX_EPOCH, Duration::ZERO);
        let frame = ResolvedFrame {
            lines: vec![crate::symbolize::SourceLine {
                function: "run\u{1b}[2J".into(),
                system_name: Some("run\u{1b}[2J(\n)".into()),
                file: Some("a\u{9b}.c".into()),
                line: 1,
            }],
            module: None,
            build_id: None,
        };
        let leaf = builder.location(LocationKey::User(1), 1, &frame);
        builder.add_sample(
            vec![leaf],
            1,
            &[("comm", "\u{1b}[31mX\u{7}\n"), ("thread_name", "t\u{7f}")],
        );
        // Raw texts that show the same share one entry.
        let once = builder.string("run\u{7}[2J");
        let profile = builder.finish();
        assert_eq!(profile.string_table[once as usize], "run?[2J");
        for text in ["run?[2J", "run?[2J(?)", "a?.c", "?[31mX??", "t?"] {
            assert_eq!(
                profile.string_table.iter().filter(|s| *s == text).count(),
                1,
                "{text:?} in {:?}",
                profile.string_table
            );
        }
        assert!(
            !profile
                .string_table
                .iter()
                .any(|s| s.chars().any(crate::printable::is_unprintable)),
            "{:?}",
            profile.string_table
        );
    }

    #[test]
    fn numeric_labels_and_resumed_builders() {
        let mut builder = ProfileBuilder::new_cpu(100, SystemTime::UNIX_EPOCH, Duration::ZERO);
        let main = builder.location(LocationKey::User(1), 1, &ResolvedFrame::named("main", None));
        builder.add_sample_with(
            vec![main],
            2,
            &[
                Label::Str("thread_name", "t"),
                Label::Num {
                    key: "thread_id",
                    value: 42,
                    unit: "",
                },
                Label::Num {
                    key: "size",
                    value: 7,
                    unit: "bytes",
                },
            ],
        );
        let profile = builder.finish();
        let s = |p: &proto::Profile, i: i64| p.string_table[i as usize].clone();
        let labels = &profile.sample[0].label;
        assert_eq!(
            (s(&profile, labels[1].key), labels[1].num),
            ("thread_id".into(), 42)
        );
        assert_eq!((labels[1].str, labels[1].num_unit), (0, 0));
        assert_eq!(s(&profile, labels[2].num_unit), "bytes");

        // Resumed: known strings and functions are not added again.
        let strings = profile.string_table.len();
        let mut resumed = ProfileBuilder::resume(profile.clone());
        assert_eq!(resumed.string("thread_name"), labels[0].key);
        let again = resumed.location(
            LocationKey::Marker(1),
            0,
            &ResolvedFrame::named("main", None),
        );
        let root = resumed.location(
            LocationKey::ThreadRoot(0),
            0,
            &ResolvedFrame::named("[t tid=42]", None),
        );
        let derived = resumed.finish();
        assert_eq!(derived.function.len(), 2, "main reused, the root added");
        assert_eq!(derived.string_table.len(), strings + 1);
        assert_eq!((again, root), (2, 3));
        assert_eq!(derived.period, profile.period);
    }
}
