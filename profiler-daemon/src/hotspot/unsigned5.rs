//! HotSpot's UNSIGNED5 compressed integers (debug info streams, line number tables).
//!
//! A value takes one to five bytes; a byte below the threshold L ends it, each byte after the
//! first carries 6 more bits. From JDK 20 (JDK-8292758) encoders never emit a zero byte: every
//! byte is stored plus X = 1 and L = 256 - 64 - X = 191; before, X = 0 and L = 192. Either way a
//! raw byte below 192 ends a value.

/// L for X = 0; subtract X for the JDK 20+ variant.
const LOW: u32 = 192;
const HIGH_BITS: u32 = 6;
const MAX_BYTES: usize = 5;

/// A cursor over an UNSIGNED5 stream; reads past the end return `None`.
pub struct Reader<'a> {
    bytes: &'a [u8],
    position: usize,
    excluded_zero: u8,
}

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8], position: usize, excludes_zero: bool) -> Self {
        Self {
            bytes,
            position,
            excluded_zero: u8::from(excludes_zero),
        }
    }

    pub fn read_byte(&mut self) -> Option<u8> {
        let byte = *self.bytes.get(self.position)?;
        self.position += 1;
        Some(byte)
    }

    pub fn read_u32(&mut self) -> Option<u32> {
        let low = LOW - self.excluded_zero as u32;
        let mut sum: u32 = 0;
        for index in 0..MAX_BYTES {
            let byte = self.read_byte()?.wrapping_sub(self.excluded_zero) as u32;
            sum = sum.wrapping_add(byte << (HIGH_BITS * index as u32));
            if byte < low {
                return Some(sum);
            }
        }
        Some(sum)
    }

    /// Zig-zag signed value (line number table deltas).
    pub fn read_signed(&mut self) -> Option<i32> {
        let value = self.read_u32()?;
        Some(((value >> 1) as i32) ^ -((value & 1) as i32))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The encoder, as HotSpot writes it, to check the reader against.
    fn encode(mut value: u32, excludes_zero: bool) -> Vec<u8> {
        let x = u32::from(excludes_zero);
        let low = LOW - x;
        let mut out = Vec::new();
        for index in 0..MAX_BYTES {
            if value < low || index == MAX_BYTES - 1 {
                out.push((value + x) as u8);
                return out;
            }
            value -= low;
            out.push((low + (value & ((1 << HIGH_BITS) - 1)) + x) as u8);
            value >>= HIGH_BITS;
        }
        out
    }

    #[test]
    fn round_trips_both_variants() {
        for excludes_zero in [false, true] {
            for value in [0, 1, 191, 192, 255, 1000, 65_535, 1 << 20, 123_456_789] {
                let bytes = encode(value, excludes_zero);
                assert!(
                    !excludes_zero || !bytes.contains(&0),
                    "{value} encoded with a zero byte"
                );
                assert_eq!(
                    Reader::new(&bytes, 0, excludes_zero).read_u32(),
                    Some(value),
                    "{value}"
                );
            }
        }
    }

    #[test]
    fn signed_values_are_zigzag() {
        for (raw, signed) in [(0, 0), (1, -1), (2, 1), (3, -2), (200, 100)] {
            let bytes = encode(raw, false);
            assert_eq!(Reader::new(&bytes, 0, false).read_signed(), Some(signed));
        }
    }

    #[test]
    fn truncated_streams_end_cleanly() {
        assert_eq!(Reader::new(&[200], 0, false).read_u32(), None);
        assert_eq!(Reader::new(&[], 0, false).read_byte(), None);
    }
}
