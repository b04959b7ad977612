//! HotSpot `Symbol`s read as names (class, method, signature, source file), from memory that
//! may have been freed and reused since the sample: a name comes out only if the bytes read
//! are one.
//!
//! - A `Symbol`'s identity (its hash, length and last bytes) is read as BPF reads it: the
//!   cookies are made of it, and a name is verified against the identity the sample recorded
//!   or the cookie proved.
//! - The identity is read again after the body: a symbol freed while its body was read differs.
//! - The body must be modified UTF-8 (HotSpot's encoding: no zero byte, surrogate pairs as two
//!   3-byte sequences) of at most [`MAX_SYMBOL_LENGTH`] bytes, and a name: not empty, without
//!   control characters or the replacement and non-characters U+FFFD-U+FFFF. Metaspace that
//!   holds anything else (other classes' data, zeros, pointers) fails this.

use super::jvm::Jvm;
use super::layout::Field;
use super::remote::RemoteMemory;
use crate::java_names::UnnamedReason;

/// HotSpot's `Symbol::max_length()`: a symbol's length is a 16-bit field. Longer than this is
/// no symbol.
pub const MAX_SYMBOL_LENGTH: usize = 65_535;

/// What tells a `Symbol` from another one made later at its address, read as BPF reads it (see
/// `profiler_common::name_tail`): what cookies are made of.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SymbolIdentity {
    /// The word whose upper half is the symbol's random hash (the lower half is its reference
    /// count, which changes while it lives); 0 where the layout has none.
    pub hash_word: u32,
    pub length: u16,
    pub tail: [u64; 2],
}

impl SymbolIdentity {
    /// Whether `other` is the same symbol (reference counts aside).
    pub fn same_symbol(&self, other: &SymbolIdentity) -> bool {
        self.hash_word & 0xffff_0000 == other.hash_word & 0xffff_0000
            && self.length == other.length
            && self.tail == other.tail
    }
}

/// The identity of the `Symbol` at `symbol`.
pub fn read_identity(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    symbol: u64,
) -> Result<SymbolIdentity, UnnamedReason> {
    let hash_at = super::unwind_info::symbol_hash_word(&jvm.layout);
    let hash_word = if hash_at == profiler_common::NO_SYMBOL_HASH {
        0
    } else {
        memory.read_u32(symbol.wrapping_add(hash_at as u64))?
    };
    let length_at =
        super::unwind_info::symbol_length(&jvm.layout).ok_or(UnnamedReason::MissingField)?;
    let length = memory.read_u16(symbol.wrapping_add(length_at as u64))?;
    let mut tail_bytes = [0u8; profiler_common::NAME_TAIL_BYTES];
    memory.read(
        symbol
            .wrapping_add(body_offset(jvm)?)
            .wrapping_add(profiler_common::name_tail_start(length)),
        &mut tail_bytes,
    )?;
    Ok(SymbolIdentity {
        hash_word,
        length,
        tail: profiler_common::name_tail(tail_bytes, length),
    })
}

fn body_offset(jvm: &Jvm) -> Result<u64, UnnamedReason> {
    jvm.layout
        .offset(Field::SymbolBody)
        .ok_or(UnnamedReason::MissingField)
}

/// The name in the `Symbol` at `symbol`. With `expected` (the identity a cookie proved or the
/// sample recorded), the symbol must still have it. A symbol that is not the expected one, or
/// changes while it is read, fails with `reused` (the reason of the memory it was reached
/// through); bytes that are no name fail with [`UnnamedReason::BadName`].
pub fn read_name(
    jvm: &Jvm,
    memory: &dyn RemoteMemory,
    symbol: u64,
    expected: Option<&SymbolIdentity>,
    reused: UnnamedReason,
) -> Result<String, UnnamedReason> {
    // Constant pool slots may carry a tag in bit 0.
    let symbol = symbol & !1;
    let before = read_identity(jvm, memory, symbol)?;
    if expected.is_some_and(|expected| !expected.same_symbol(&before)) {
        return Err(reused);
    }
    let length = usize::from(before.length);
    if length > MAX_SYMBOL_LENGTH {
        // Not with a 16-bit length field; kept should a layout ever widen it.
        return Err(UnnamedReason::OverBound);
    }
    let mut body = vec![0; length];
    memory.read(symbol.wrapping_add(body_offset(jvm)?), &mut body)?;
    // Freed (and its memory given to something else) while the body was read; or the body
    // read is not the one the identity was (its last bytes differ).
    let after = read_identity(jvm, memory, symbol)?;
    if !after.same_symbol(&before) || tail_of(&body) != before.tail {
        return Err(reused);
    }
    decode_modified_utf8(&body)
        .filter(|name| is_name(name))
        .ok_or(UnnamedReason::BadName)
}

/// `profiler_common::name_tail` of a whole name.
fn tail_of(body: &[u8]) -> [u64; 2] {
    let length = body.len().min(usize::from(u16::MAX)) as u16;
    let start = profiler_common::name_tail_start(length) as usize;
    let mut bytes = [0u8; profiler_common::NAME_TAIL_BYTES];
    for (slot, byte) in bytes.iter_mut().zip(body.get(start..).unwrap_or_default()) {
        *slot = *byte;
    }
    profiler_common::name_tail(bytes, length)
}

/// Whether `text` can be a Java or JVM name: not empty, and no character the JVM's names never
/// have in practice (control characters; U+FFFD, which only a lossy decoding makes; the
/// non-characters U+FFFE and U+FFFF).
pub fn is_name(text: &str) -> bool {
    !text.is_empty()
        && !text
            .chars()
            .any(|c| c.is_control() || matches!(c, '\u{fffd}' | '\u{fffe}' | '\u{ffff}'))
}

/// `bytes` decoded as modified UTF-8 (JVMS 4.4.7), or `None` if they are not: a zero byte, a
/// 4-byte form, a stray or missing continuation byte, an overlong form (but `C0 80`, which
/// is how U+0000 is written), or an unpaired surrogate.
pub fn decode_modified_utf8(bytes: &[u8]) -> Option<String> {
    let mut out = String::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let (unit, len) = code_unit(&bytes[at..])?;
        at += len;
        let c = match unit {
            0xd800..=0xdbff => {
                // A supplementary character: the low surrogate must follow.
                let (low, low_len) = code_unit(bytes.get(at..)?)?;
                if !(0xdc00..=0xdfff).contains(&low) {
                    return None;
                }
                at += low_len;
                0x1_0000 + ((unit - 0xd800) << 10) + (low - 0xdc00)
            }
            0xdc00..=0xdfff => return None,
            unit => unit,
        };
        out.push(char::from_u32(c)?);
    }
    Some(out)
}

/// One UTF-16 code unit from the start of `bytes`, and how many bytes it took.
fn code_unit(bytes: &[u8]) -> Option<(u32, usize)> {
    let continuation = |at: usize| -> Option<u32> {
        let byte = *bytes.get(at)?;
        (byte & 0xc0 == 0x80).then_some(u32::from(byte & 0x3f))
    };
    let first = *bytes.first()?;
    match first {
        0x01..=0x7f => Some((u32::from(first), 1)),
        0xc0..=0xdf => {
            let unit = (u32::from(first & 0x1f) << 6) | continuation(1)?;
            // Overlong, but for U+0000's own form.
            (unit >= 0x80 || unit == 0).then_some((unit, 2))
        }
        0xe0..=0xef => {
            let unit = (u32::from(first & 0x0f) << 12) | (continuation(1)? << 6) | continuation(2)?;
            (unit >= 0x800).then_some((unit, 3))
        }
        // A zero byte, a continuation byte first, or a 4-byte form: none is modified UTF-8.
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_in_modified_utf8_decode() {
        assert_eq!(
            decode_modified_utf8(b"java/lang/Thread").as_deref(),
            Some("java/lang/Thread")
        );
        // 2- and 3-byte forms, and a supplementary character as a surrogate pair.
        assert_eq!(
            decode_modified_utf8("caf\u{e9}\u{65e5}".as_bytes()).as_deref(),
            Some("caf\u{e9}\u{65e5}")
        );
        let emoji = [0xed, 0xa0, 0xbd, 0xed, 0xb8, 0x80];
        assert_eq!(decode_modified_utf8(&emoji).as_deref(), Some("\u{1f600}"));
        // U+0000 has its own 2-byte form; it decodes, but is no name.
        let nul = decode_modified_utf8(&[b'a', 0xc0, 0x80]).expect("modified UTF-8");
        assert_eq!(nul, "a\0");
        assert!(!is_name(&nul));
    }

    #[test]
    fn bytes_that_are_not_modified_utf8_are_refused() {
        for bytes in [
            &b"a\0b"[..],              // a raw zero byte
            &[0x80, b'a'],             // a continuation byte first
            &[b'a', 0xc3],             // cut short
            &[0xc3, b'a'],             // a missing continuation
            &[0xc1, 0x81],             // overlong
            &[0xe0, 0x81, 0x81],       // overlong 3-byte form
            &[0xf0, 0x9f, 0x98, 0x80], // standard UTF-8's 4-byte form
            &[0xed, 0xa0, 0xbd],       // a high surrogate alone
            &[0xed, 0xb8, 0x80, b'a'], // a low surrogate alone
            &[0xff, 0xfe, 0x00, 0x41], // metaspace
        ] {
            assert_eq!(decode_modified_utf8(bytes), None, "{bytes:x?}");
        }
    }

    #[test]
    fn only_names_pass_as_names() {
        assert!(is_name("NameChurn$G0042Outer"));
        assert!(is_name("<init>"));
        assert!(is_name("\u{65e5}\u{672c}"));
        for text in ["", "a\u{1b}[2J", "a\nb", "\u{9b}", "ab\u{fffd}", "\u{ffff}"] {
            assert!(!is_name(text), "{text:?}");
        }
    }

    #[test]
    fn a_tail_of_the_whole_body_is_the_identity_tail() {
        let body = b"NameChurn$G0042Outer";
        let start = profiler_common::name_tail_start(body.len() as u16) as usize;
        let mut bytes = [0u8; profiler_common::NAME_TAIL_BYTES];
        bytes.copy_from_slice(&body[start..]);
        assert_eq!(
            tail_of(body),
            profiler_common::name_tail(bytes, body.len() as u16)
        );
        assert_ne!(tail_of(b"NameChurn$G0043Outer"), tail_of(body));
        assert_eq!(tail_of(b""), [0, 0]);
    }
}
