//! A 128-bit hash keyed with a secret drawn when the daemon starts: the identity under which
//! something derived from a profiled process's bytes (an unwind table, a binary's names) is
//! shared with other processes.
//!
//! Build-ids, paths and inode numbers are claims the process's owner controls; equal digests of
//! the bytes an answer was derived from are not, because nobody outside the daemon knows the key
//! and so nobody can craft a collision. Two independently keyed SipHash states make a collision
//! by chance negligible as well.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher as _, Hasher as _};

/// The digest of some bytes under one daemon's secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Digest(pub u64, pub u64);

/// The daemon's secret; each [`SecretKeys::new`] draws a fresh one.
#[derive(Clone, Debug)]
pub struct SecretKeys {
    first: RandomState,
    second: RandomState,
}

impl Default for SecretKeys {
    fn default() -> Self {
        Self::new()
    }
}

impl SecretKeys {
    pub fn new() -> Self {
        Self {
            first: RandomState::new(),
            second: RandomState::new(),
        }
    }

    pub fn hasher(&self) -> SecretHasher {
        SecretHasher {
            first: self.first.build_hasher(),
            second: self.second.build_hasher(),
        }
    }
}

/// Hashes what is written into it; lengths are written with variable-size input so that two
/// different sequences of writes cannot produce the same byte stream.
pub struct SecretHasher {
    first: std::collections::hash_map::DefaultHasher,
    second: std::collections::hash_map::DefaultHasher,
}

impl SecretHasher {
    pub fn write_u64(&mut self, value: u64) {
        self.first.write_u64(value);
        self.second.write_u64(value);
    }

    /// Writes `bytes` preceded by their length.
    pub fn write_bytes(&mut self, bytes: &[u8]) {
        self.write_u64(bytes.len() as u64);
        self.write_raw(bytes);
    }

    /// Writes `bytes` as they are: for data streamed in pieces after its total length.
    pub fn write_raw(&mut self, bytes: &[u8]) {
        self.first.write(bytes);
        self.second.write(bytes);
    }

    pub fn finish(&self) -> Digest {
        Digest(self.first.finish(), self.second.finish())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn equal_input_equal_digest_and_another_secret_another_digest() {
        let keys = SecretKeys::new();
        let digest = |keys: &SecretKeys, parts: &[&[u8]]| {
            let mut hasher = keys.hasher();
            for part in parts {
                hasher.write_bytes(part);
            }
            hasher.finish()
        };
        assert_eq!(digest(&keys, &[b"ab", b"c"]), digest(&keys, &[b"ab", b"c"]));
        assert_ne!(digest(&keys, &[b"ab", b"c"]), digest(&keys, &[b"a", b"bc"]));
        assert_ne!(
            digest(&keys, &[b"ab", b"c"]),
            digest(&SecretKeys::new(), &[b"ab", b"c"])
        );
    }
}
