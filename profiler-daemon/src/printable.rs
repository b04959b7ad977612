//! The one rule for text a profiled process chose (its `comm`, thread names, command line,
//! symbol and Java names, file names) before any output shows it: control characters (C0,
//! including ESC and newline, DEL, C1) and the two code points XML forbids (U+FFFE, U+FFFF)
//! become [`REPLACEMENT`].
//!
//! Raw, they let any process rewrite the terminal of whoever reads a profile or a log of it
//! (escape sequences), split the one-line records of folded stacks, and make an SVG flame graph
//! unparsable (XML allows no control character but tab and newlines, even escaped). A leaf
//! module: every output path (`pprof`, `profiles`, `export`, `sidecar`) applies this same rule.

use std::borrow::Cow;

/// What a character that may not be shown becomes: visible, ASCII, and one byte, so a bound
/// on the raw text's length holds for the shown text too.
pub const REPLACEMENT: char = '?';

/// Whether `c` may not appear in shown text.
pub fn is_unprintable(c: char) -> bool {
    c.is_control() || c == '\u{fffe}' || c == '\u{ffff}'
}

/// `text` with every unprintable character replaced; borrowed when there is none (the usual
/// case, so callers pay a scan, not a copy).
pub fn printable(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_unprintable) {
        return Cow::Borrowed(text);
    }
    Cow::Owned(replace_unprintable(text))
}

/// [`printable`], cut to at most `max_bytes` on a character boundary.
pub fn printable_within(text: &str, max_bytes: usize) -> Cow<'_, str> {
    let mut end = text.len().min(max_bytes);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    printable(&text[..end])
}

fn replace_unprintable(text: &str) -> String {
    text.chars()
        .map(|c| if is_unprintable(c) { REPLACEMENT } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_of_every_range_are_replaced() {
        // C0 (ESC, BEL, newline, NUL, tab), DEL, C1 (CSI as a character), XML's non-characters.
        assert_eq!(
            printable("\u{1b}[31mX\u{7}\n\0\t\u{7f}\u{9b}2J\u{fffe}\u{ffff}"),
            "?[31mX??????2J??"
        );
        for c in (0u32..0x20).chain(0x7f..0xa0) {
            let c = char::from_u32(c).expect("a character");
            assert_eq!(printable(&format!("a{c}b")), "a?b", "U+{:04X}", c as u32);
        }
    }

    #[test]
    fn printable_text_is_kept_as_is_without_a_copy() {
        for text in [
            "",
            "java",
            "kworker/0:1",
            "<&\"'>;",
            "caf\u{e9} \u{65e5}\u{672c} \u{1f600}",
            // Format characters and U+FFFD are shown: only what breaks readers is replaced.
            "\u{200b}\u{fffd}\u{a0}",
        ] {
            assert!(
                matches!(printable(text), Cow::Borrowed(same) if same == text),
                "{text:?}"
            );
        }
    }

    #[test]
    fn bounded_text_is_cut_on_a_character_boundary() {
        assert_eq!(printable_within("abcdef", 4), "abcd");
        assert_eq!(printable_within("ab", 4), "ab");
        // A 2-byte character across the bound is left out whole.
        assert_eq!(printable_within("abc\u{e9}", 4), "abc");
        assert_eq!(printable_within("a\u{1b}b\u{1b}", 3), "a?b");
        assert_eq!(printable_within("\u{1f600}", 3), "");
        // The bound is on the raw text: the shown one may be shorter (a 2-byte C1 shows as `?`).
        let c1 = "\u{9b}".repeat(100);
        assert_eq!(printable_within(&c1, 11), "?????");
    }
}
