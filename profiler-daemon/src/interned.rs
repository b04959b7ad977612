//! Tables whose entries are made once per key, as the profile encoders (pprof, OTLP) need them:
//! strings, functions, mappings, locations, stacks. A leaf module, so that both encoders share
//! it without importing each other.

use std::borrow::Cow;
use std::hash::Hash;

use hashbrown::HashMap;

use crate::printable::printable;
use crate::resolved_frame::SourceLine;

/// Entries in the order they were first asked for, each once per key.
pub struct Interned<K, V> {
    entries: Vec<V>,
    index: HashMap<K, usize>,
}

impl<K: Hash + Eq, V> Interned<K, V> {
    /// A table that starts with `entries` (e.g. the zero entry OTLP's tables begin with), known
    /// by no key.
    pub fn starting_with(entries: Vec<V>) -> Self {
        Self {
            entries,
            index: HashMap::new(),
        }
    }

    /// A table that goes on from `entries`, each known by the key `key_of` gives it.
    pub fn resumed(entries: Vec<V>, key_of: impl Fn(&V) -> K) -> Self {
        let index = entries
            .iter()
            .enumerate()
            .map(|(position, entry)| (key_of(entry), position))
            .collect();
        Self { entries, index }
    }

    /// The position of `key`'s entry, made from the key by `make` the first time only.
    pub fn intern(&mut self, key: K, make: impl FnOnce(&K) -> V) -> usize {
        let entries = &mut self.entries;
        *self.index.entry(key).or_insert_with_key(|key| {
            entries.push(make(key));
            entries.len() - 1
        })
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn into_entries(self) -> Vec<V> {
        self.entries
    }
}

/// A profile's string table: the empty string at 0, as both formats want, and only printable
/// text ([`printable`]): whatever a profiled process named its code or threads, every output
/// shows it without control characters. Raw strings that show the same share one entry.
pub struct StringTable {
    strings: Interned<String, String>,
    scratch: String,
}

impl Default for StringTable {
    fn default() -> Self {
        let mut strings = Interned::starting_with(Vec::new());
        strings.intern(String::new(), String::clone);
        Self {
            strings,
            scratch: String::new(),
        }
    }
}

impl StringTable {
    /// A table that goes on from `strings` (a table this type made: "" first, printable).
    pub fn resumed(strings: Vec<String>) -> Self {
        Self {
            strings: Interned::resumed(strings, String::clone),
            scratch: String::new(),
        }
    }

    pub fn index(&mut self, value: &str) -> usize {
        if let Some(&index) = self.strings.index.get(value) {
            return index;
        }
        let shown = printable(value);
        if let Cow::Owned(shown) = &shown {
            if let Some(&index) = self.strings.index.get(shown.as_str()) {
                return index;
            }
        }
        let shown = shown.into_owned();
        self.strings.intern(shown, String::clone)
    }

    /// The indices of the name, system name and file of `line`'s function, its name shown with
    /// `suffix` (empty where the output wants none); its system name is the name shown when the
    /// source gave none.
    pub fn function(&mut self, line: &SourceLine, suffix: &str) -> [usize; 3] {
        let name = if suffix.is_empty() {
            self.index(&line.function)
        } else {
            // Names repeat across a profile's frames: the suffixed name is built in a buffer
            // kept for it, not allocated per line.
            let mut shown = std::mem::take(&mut self.scratch);
            shown.clear();
            shown.push_str(&line.function);
            shown.push_str(suffix);
            let index = self.index(&shown);
            self.scratch = shown;
            index
        };
        let system_name = match &line.system_name {
            Some(system_name) => self.index(system_name),
            None => name,
        };
        [
            name,
            system_name,
            self.index(line.file.as_deref().unwrap_or("")),
        ]
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    pub fn into_strings(self) -> Vec<String> {
        self.strings.into_entries()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_made_once_per_key_after_the_starting_ones() {
        let mut table = Interned::starting_with(vec!["zero"]);
        assert_eq!(table.intern(7, |_| "seven"), 1);
        assert_eq!(table.intern(7, |_| panic!("made twice")), 1);
        assert_eq!(table.intern(8, |_| "eight"), 2);
        assert_eq!(table.into_entries(), ["zero", "seven", "eight"]);
    }

    #[test]
    fn a_resumed_table_knows_its_entries() {
        let mut strings = StringTable::default();
        let a = strings.index("a");
        let mut resumed = StringTable::resumed(strings.into_strings());
        assert_eq!(resumed.index("a"), a);
        assert_eq!(resumed.index("b"), 2);
        assert_eq!(resumed.into_strings(), ["", "a", "b"]);
    }

    #[test]
    fn strings_enter_printable_and_once_per_shown_text() {
        let mut strings = StringTable::default();
        assert_eq!(strings.index(""), 0);
        let escaped = strings.index("run\u{1b}[2J");
        assert_eq!(strings.index("run\u{7}[2J"), escaped, "shows the same");
        assert_eq!(strings.index("run?[2J"), escaped);
        assert_eq!(strings.into_strings(), ["", "run?[2J"]);
    }
}
