//! docs/configuration.md documents every key of the configuration file, and only those. The keys
//! come from serde itself, not from a list kept by hand: a recording [`Deserializer`] is given to
//! [`FileConfig`]'s `Deserialize` and notes the field names each table's `deserialize_struct`
//! declares, recursing into nested tables (`[pyroscope]`, `[otlp]`). The document's tables are
//! rows `` | `key` | ... `` under a heading naming the table: `## Top-level keys`, or one or
//! more `[table]`s (`## [pyroscope] and [otlp]`).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, IntoDeserializer, MapAccess, Visitor};
use serde::Deserialize;

use crate::config::FileConfig;

const REFERENCE: &str = include_str!("../../docs/configuration.md");
const TOP_LEVEL_HEADING: &str = "Top-level keys";

#[derive(Debug)]
struct Error(String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

impl de::Error for Error {
    fn custom<T: fmt::Display>(msg: T) -> Self {
        Error(msg.to_string())
    }
}

/// What serde asked for: each table of fixed keys ("" is the top level, "pyroscope" a nested
/// one) with its keys, and the free-form tables (any key: `[labels]`).
#[derive(Debug, Default)]
struct Tables {
    fixed: BTreeMap<String, BTreeSet<String>>,
    free_form: BTreeSet<String>,
}

/// Deserializes a value at `path` from nothing: zeros, empty strings and sequences, and for a
/// struct every one of its fields, each recorded.
struct Recorder<'a> {
    path: String,
    tables: &'a RefCell<Tables>,
}

impl<'a> Recorder<'a> {
    fn child(&self, key: &str) -> Recorder<'a> {
        let path = if self.path.is_empty() {
            key.to_owned()
        } else {
            format!("{}.{key}", self.path)
        };
        Recorder {
            path,
            tables: self.tables,
        }
    }
}

macro_rules! zero {
    ($($method:ident => $visit:ident($($value:expr)?)),* $(,)?) => {
        $(fn $method<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
            visitor.$visit($($value)?)
        })*
    };
}

impl<'de> Deserializer<'de> for Recorder<'_> {
    type Error = Error;

    fn deserialize_any<V: Visitor<'de>>(self, _visitor: V) -> Result<V::Value, Error> {
        Err(Error(format!(
            "`{}`: a self-describing value; teach the recorder its type",
            self.path
        )))
    }

    zero! {
        deserialize_bool => visit_bool(false),
        deserialize_i8 => visit_i64(0),
        deserialize_i16 => visit_i64(0),
        deserialize_i32 => visit_i64(0),
        deserialize_i64 => visit_i64(0),
        deserialize_u8 => visit_u64(0),
        deserialize_u16 => visit_u64(0),
        deserialize_u32 => visit_u64(0),
        deserialize_u64 => visit_u64(0),
        deserialize_f32 => visit_f64(0.0),
        deserialize_f64 => visit_f64(0.0),
        deserialize_char => visit_char('x'),
        deserialize_str => visit_str(""),
        deserialize_string => visit_str(""),
        deserialize_bytes => visit_bytes(&[]),
        deserialize_byte_buf => visit_bytes(&[]),
        deserialize_unit => visit_unit(),
        deserialize_ignored_any => visit_unit(),
        deserialize_identifier => visit_str(""),
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_some(self)
    }

    fn deserialize_unit_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_unit()
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Error> {
        visitor.visit_newtype_struct(self)
    }

    fn deserialize_seq<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        visitor.visit_seq(de::value::SeqDeserializer::<_, Error>::new(
            std::iter::empty::<u8>(),
        ))
    }

    fn deserialize_tuple<V: Visitor<'de>>(
        self,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_tuple_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _len: usize,
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.deserialize_seq(visitor)
    }

    fn deserialize_map<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Error> {
        self.tables.borrow_mut().free_form.insert(self.path.clone());
        visitor.visit_map(de::value::MapDeserializer::<_, Error>::new(
            std::iter::empty::<(u8, u8)>(),
        ))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Error> {
        self.tables
            .borrow_mut()
            .fixed
            .entry(self.path.clone())
            .or_default()
            .extend(fields.iter().map(|f| f.to_string()));
        visitor.visit_map(Fields {
            recorder: self,
            fields,
            next: 0,
        })
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        _visitor: V,
    ) -> Result<V::Value, Error> {
        Err(Error(format!(
            "`{}`: an enum; teach the recorder its variants",
            self.path
        )))
    }
}

/// A struct's fields, each given once with a value recorded at its own path.
struct Fields<'a> {
    recorder: Recorder<'a>,
    fields: &'static [&'static str],
    next: usize,
}

impl<'de> MapAccess<'de> for Fields<'_> {
    type Error = Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, Error> {
        let Some(field) = self.fields.get(self.next) else {
            return Ok(None);
        };
        seed.deserialize((*field).into_deserializer()).map(Some)
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, Error> {
        let field = self.fields[self.next];
        self.next += 1;
        seed.deserialize(self.recorder.child(field))
    }
}

/// The tables `FileConfig` reads, from serde.
fn known() -> Tables {
    let tables = RefCell::new(Tables::default());
    FileConfig::deserialize(Recorder {
        path: String::new(),
        tables: &tables,
    })
    .expect("FileConfig from the recorder");
    tables.into_inner()
}

/// The tables the document describes: table ("" for the top level) -> keys, each with the line
/// of its row.
fn documented(text: &str) -> BTreeMap<String, BTreeMap<String, usize>> {
    let mut tables: BTreeMap<String, BTreeMap<String, usize>> = BTreeMap::new();
    let mut current: Vec<String> = Vec::new();
    let mut in_fence = false;
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#').trim();
            current = if heading == TOP_LEVEL_HEADING {
                vec![String::new()]
            } else {
                bracketed(heading)
            };
            for table in &current {
                tables.entry(table.clone()).or_default();
            }
            continue;
        }
        let Some(row) = line.strip_prefix("| `") else {
            continue;
        };
        let Some((key, _)) = row.split_once('`') else {
            continue;
        };
        for table in &current {
            tables
                .get_mut(table)
                .expect("entered at its heading")
                .insert(key.to_owned(), index + 1);
        }
    }
    tables
}

/// `[a]` and `[b.c]` in a heading, without the brackets (links `[text](url)` are not tables).
fn bracketed(heading: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = heading;
    while let Some(start) = rest.find('[') {
        let after = &rest[start + 1..];
        let Some(end) = after.find(']') else { break };
        let name = &after[..end];
        let is_link = after[end + 1..].starts_with('(');
        if !is_link
            && !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.')
        {
            found.push(name.to_owned());
        }
        rest = &after[end + 1..];
    }
    found
}

fn shown(table: &str, key: &str) -> String {
    if table.is_empty() {
        format!("`{key}`")
    } else {
        format!("`{table}.{key}` ([{table}])")
    }
}

/// Every mismatch between what serde reads and what the document says.
fn mismatches(
    known: &Tables,
    documented: &BTreeMap<String, BTreeMap<String, usize>>,
) -> Vec<String> {
    let mut problems = Vec::new();
    for (table, keys) in &known.fixed {
        let rows = documented.get(table);
        for key in keys {
            if !rows.is_some_and(|rows| rows.contains_key(key)) {
                problems.push(format!(
                    "{} is read by the daemon but not documented in docs/configuration.md",
                    shown(table, key)
                ));
            }
        }
    }
    for (table, rows) in documented {
        match known.fixed.get(table) {
            Some(keys) => {
                for (key, line) in rows {
                    if !keys.contains(key) {
                        problems.push(format!(
                            "docs/configuration.md:{line}: {} is documented but the daemon has no such key",
                            shown(table, key)
                        ));
                    }
                }
            }
            None if known.free_form.contains(table) => {
                for (key, line) in rows {
                    problems.push(format!(
                        "docs/configuration.md:{line}: `{key}` is documented as a key of [{table}], whose keys are the user's"
                    ));
                }
            }
            None => problems.push(format!(
                "docs/configuration.md documents a table [{table}] the daemon does not read"
            )),
        }
    }
    problems
}

#[test]
fn the_recorder_sees_every_table_serde_reads() {
    let known = known();
    let top = &known.fixed[""];
    for key in [
        "frequency",
        "pyroscope",
        "otlp",
        "labels",
        "lock_threshold_ms",
    ] {
        assert!(top.contains(key), "{key} missing from {top:?}");
    }
    assert!(known.fixed["pyroscope"].contains("url"));
    assert_eq!(known.fixed["pyroscope"], known.fixed["otlp"]);
    assert!(known.free_form.contains("labels"));
    assert!(known.free_form.contains("service_names"));
}

#[test]
fn the_reference_is_parsed_by_heading() {
    let text = "# Title\n## Top-level keys\n| `a` | x |\n## [p] and [q]\n| `u` | y |\n\
                ```toml\n| `not` |\n```\n## Flags\n| `--a` | z |\n";
    let tables = documented(text);
    assert_eq!(tables[""].keys().collect::<Vec<_>>(), ["a"]);
    assert_eq!(tables["p"].keys().collect::<Vec<_>>(), ["u"]);
    assert_eq!(tables["q"].keys().collect::<Vec<_>>(), ["u"]);
    assert_eq!(tables.len(), 3);
    assert_eq!(bracketed("see [the guide](x.md) and [labels]"), ["labels"]);
}

#[test]
fn docs_configuration_md_documents_every_key_and_no_other() {
    let problems = mismatches(&known(), &documented(REFERENCE));
    assert!(
        problems.is_empty(),
        "docs/configuration.md and the daemon's config disagree:\n{}",
        problems.join("\n")
    );
}
