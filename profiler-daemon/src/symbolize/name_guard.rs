//! The last check on a user frame's names before they enter a profile: whatever source named
//! it (ELF symbols, the JVM's memory, the sidecar agent's records), a function name that is
//! empty, longer than [`MAX_FRAME_NAME_BYTES`], or with characters no Java or native name has
//! (control characters; U+FFFD, which only a lossy decoding of bytes that were no text makes;
//! the non-characters U+FFFE and U+FFFF) is refused: the line shows as
//! `[refused frame name: REASON]`, counted in `profiler_frame_names_refused_total{reason}`.
//! Characters are checked in names read from a process's memory (Java frames), where they mean
//! garbage was read; a native name is what its binary's symbol table says, even with escapes
//! in it, and is shown with them replaced (`crate::printable`), as every pprof string is.
//!
//! The sources validate their names already (`crate::hotspot::symbol`,
//! `crate::hotspot::code_proof`): a refusal here means one of them let garbage through, which
//! the counter makes visible, while the profile never shows it. Other text (a fuller name, a
//! file) that fails the same check is dropped from the line rather than shown.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::resolved_frame::ResolvedFrame;

/// Longest function name a profile takes. Java names are far shorter (a class and a method
/// name; HotSpot allows 65,535 bytes each, no real code comes near); a demangled C++ template
/// instance may reach it, and is then better refused than shown as a wall of text.
pub const MAX_FRAME_NAME_BYTES: usize = 4096;

profiler_common::labelled_enum! {
    /// Why a frame's name was refused.
    pub enum Refusal: u8, from_u8 {
        /// No name at all.
        Empty = 0 => "empty",
        /// Over [`MAX_FRAME_NAME_BYTES`].
        TooLong = 1 => "too_long",
        /// Characters no name has.
        BadCharacters = 2 => "bad_characters",
    }
}

/// Refused names, by reason (shared with the metrics endpoint).
#[derive(Debug, Default)]
pub struct RefusedNames([AtomicU64; Refusal::ALL.len()]);

impl RefusedNames {
    pub fn add(&self, refusal: Refusal) {
        self.0[refusal as usize].fetch_add(1, Ordering::Relaxed);
    }

    pub fn get(&self, refusal: Refusal) -> u64 {
        self.0[refusal as usize].load(Ordering::Relaxed)
    }
}

/// Where a frame's names were read from, which decides what is checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NameOrigin {
    /// A process's memory (Java frames): any byte may be garbage.
    Memory,
    /// A binary's symbol table: the name is the binary's own, whatever its characters.
    SymbolTable,
}

/// Why `text` cannot be shown as a name, if it cannot.
pub fn refusal(text: &str, origin: NameOrigin) -> Option<Refusal> {
    if text.is_empty() {
        return Some(Refusal::Empty);
    }
    if text.len() > MAX_FRAME_NAME_BYTES {
        return Some(Refusal::TooLong);
    }
    (origin == NameOrigin::Memory
        && text
            .chars()
            .any(|c| c.is_control() || matches!(c, '\u{fffd}' | '\u{fffe}' | '\u{ffff}')))
    .then_some(Refusal::BadCharacters)
}

/// The marker shown in place of a refused name.
pub fn marker(refusal: Refusal) -> String {
    format!("[refused frame name: {}]", refusal.name())
}

/// `frame` with every refused function name replaced by its marker (counted in `refused`),
/// and fuller names or files that fail the same check dropped.
pub fn guard(
    mut frame: ResolvedFrame,
    origin: NameOrigin,
    refused: &RefusedNames,
) -> ResolvedFrame {
    for line in &mut frame.lines {
        if let Some(why) = refusal(&line.function, origin) {
            refused.add(why);
            line.function = marker(why);
            line.system_name = None;
            line.file = None;
            line.line = 0;
            continue;
        }
        if line
            .system_name
            .as_deref()
            .is_some_and(|s| refusal(s, origin).is_some())
        {
            line.system_name = None;
        }
        if line
            .file
            .as_deref()
            .is_some_and(|f| refusal(f, origin).is_some())
        {
            line.file = None;
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resolved_frame::SourceLine;

    fn line(function: &str) -> SourceLine {
        SourceLine {
            function: function.to_owned(),
            system_name: Some(format!("{function}()V")),
            file: Some("a/B.java".to_owned()),
            line: 7,
        }
    }

    #[test]
    fn names_are_kept_as_they_are() {
        let refused = RefusedNames::default();
        for name in [
            "NameChurn$G0042Outer.getAsLong_[j]",
            "[vtable chunks]",
            "std::vector<int>::push_back",
            "caf\u{e9}.\u{65e5}",
            &"x".repeat(MAX_FRAME_NAME_BYTES),
        ] {
            let frame = ResolvedFrame {
                lines: vec![line(name)],
                module: None,
                build_id: None,
            };
            let shown = guard(frame, NameOrigin::Memory, &refused);
            assert_eq!(shown.lines[0].function, name);
            assert_eq!(shown.lines[0].file.as_deref(), Some("a/B.java"));
        }
        assert!(Refusal::ALL.iter().all(|r| refused.get(*r) == 0));
    }

    #[test]
    fn garbage_names_are_refused_and_counted_by_reason() {
        let refused = RefusedNames::default();
        // A metaspace read as a method name: 32 KB with control bytes.
        let metaspace = format!("ChurnG001B.{}", "ab\u{1}\u{fffd}".repeat(8000));
        let cases = [
            ("", Refusal::Empty),
            (metaspace.as_str(), Refusal::TooLong),
            ("ChurnG001B.run\u{1b}[2J", Refusal::BadCharacters),
            ("a\u{fffd}b", Refusal::BadCharacters),
            ("a\nb", Refusal::BadCharacters),
        ];
        for (name, why) in cases {
            let frame = ResolvedFrame {
                lines: vec![line("Outer.inlined"), line(name)],
                module: None,
                build_id: None,
            };
            let shown = guard(frame, NameOrigin::Memory, &refused);
            assert_eq!(
                shown.lines[0],
                line("Outer.inlined"),
                "the other line stays"
            );
            assert_eq!(shown.lines[1].function, marker(why));
            assert_eq!(shown.lines[1].system_name, None);
            assert_eq!(shown.lines[1].file, None);
        }
        assert_eq!(refused.get(Refusal::Empty), 1);
        assert_eq!(refused.get(Refusal::TooLong), 1);
        assert_eq!(refused.get(Refusal::BadCharacters), 3);
        assert_eq!(marker(Refusal::TooLong), "[refused frame name: too_long]");
    }

    #[test]
    fn a_bad_fuller_name_or_file_is_dropped_not_shown() {
        let refused = RefusedNames::default();
        let mut bad = line("A.m");
        bad.system_name = Some("A.m(\u{0})V".to_owned());
        bad.file = Some("\u{fffd}.java".to_owned());
        let shown = guard(
            ResolvedFrame::named("x", None),
            NameOrigin::Memory,
            &refused,
        );
        assert_eq!(shown.function(), "x");
        let shown = guard(
            ResolvedFrame {
                lines: vec![bad],
                module: None,
                build_id: None,
            },
            NameOrigin::Memory,
            &refused,
        );
        assert_eq!(shown.lines[0].function, "A.m");
        assert_eq!(shown.lines[0].system_name, None);
        assert_eq!(shown.lines[0].file, None);
        assert_eq!(shown.lines[0].line, 7);
        assert!(Refusal::ALL.iter().all(|r| refused.get(*r) == 0));
    }

    #[test]
    fn a_native_name_keeps_its_characters_but_not_its_length() {
        let refused = RefusedNames::default();
        // A binary's own symbol with a terminal escape: shown (escapes replaced downstream).
        let escaped = "spin\u{1b}[31m_until_done";
        let shown = guard(
            ResolvedFrame::named(escaped, None),
            NameOrigin::SymbolTable,
            &refused,
        );
        assert_eq!(shown.function(), escaped);
        assert_eq!(
            refusal(escaped, NameOrigin::Memory),
            Some(Refusal::BadCharacters)
        );
        // Empty or too long is refused wherever it came from.
        let long = "x".repeat(MAX_FRAME_NAME_BYTES + 1);
        assert_eq!(
            refusal(&long, NameOrigin::SymbolTable),
            Some(Refusal::TooLong)
        );
        assert_eq!(refusal("", NameOrigin::SymbolTable), Some(Refusal::Empty));
    }
}
