//! Interpreted methods found by earlier walks, kept across samples: what an interpreted frame
//! needs of its `Method*` (its `ConstMethod*`, bytecode size and [`interpreted_cookie`]) costs
//! seven dependent reads of the sampled process, and nearly every Java thread's stack starts in
//! the same few interpreted frames (`Thread.run`, a pool's `runWorker`: methods run once per
//! thread, never compiled) sample after sample.
//!
//! # Why a remembered method can be trusted for a while
//!
//! A `Method*`'s `ConstMethod*`, bytecode size and class name never change while the method
//! exists (a class redefinition makes new `Method`s; the rewriter changes bytecodes in place,
//! not their size). What can happen is that the method is freed (its class unloaded) and its
//! memory given to another method. The cookie is what lets the daemon see that: it reads the
//! `Method*` again when it names the frame and names it only if the cookie it recomputes is the
//! recorded one. So an entry is used without a read for [`PROOF_TTL_NS`] after it was read (the
//! same bound as remembered code blobs), then read anew. A method freed and its memory reused
//! within that time, and sampled there, is recorded with the old method's cookie: the daemon's
//! recomputation differs and the frame shows as unknown, never as another method; its bci is
//! found against the old bytecodes' range, and is unknown when the bcp falls outside it.
//!
//! [`interpreted_cookie`]: profiler_common::interpreted_cookie

use crate::recent_blobs::PROOF_TTL_NS;

/// log2 of [`RECENT_METHODS`].
const RECENT_METHOD_BITS: u32 = 9;

/// Entries of a [`RecentMethodTable`]: 16 KiB, one place per method. Interpreted stacks are
/// short and repeat few methods; a collision costs the reads this table saves, nothing more.
pub const RECENT_METHODS: usize = 1 << RECENT_METHOD_BITS;

/// Read times are kept in units of 2^20 ns (about a millisecond), as 32 bits: they wrap after
/// 52 days, and only differences under [`PROOF_TTL_NS`] matter.
const READ_TIME_SHIFT: u32 = 20;
const TTL_UNITS: u32 = (PROOF_TTL_NS >> READ_TIME_SHIFT) as u32;

/// What an interpreted frame needs of its `Method*`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MethodFacts {
    pub method: u64,
    pub const_method: u64,
    /// Bytes of bytecode (`ConstMethod::_code_size`).
    pub code_size: u32,
    pub cookie: u32,
}

impl MethodFacts {
    pub const EMPTY: Self = Self {
        method: 0,
        const_method: 0,
        code_size: 0,
        cookie: 0,
    };
}

/// A method an earlier walk read, with its JVM (`instance` 0: empty) and when it was read.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecentMethod {
    pub instance: u32,
    pub read_at: u32,
    pub facts: MethodFacts,
}

/// Methods earlier walks on this CPU read, each in the one entry its (JVM instance, `Method*`)
/// hashes to. Per CPU, like [`crate::RecentBlobTable`]: a walk only ever reads and writes its
/// own CPU's, so an entry is never torn by a concurrent writer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RecentMethodTable {
    pub entries: [RecentMethod; RECENT_METHODS],
}

const _: () = assert!(core::mem::size_of::<RecentMethodTable>() <= 32 << 10);

impl RecentMethodTable {
    pub const EMPTY: Self = Self {
        entries: [RecentMethod {
            instance: 0,
            read_at: 0,
            facts: MethodFacts::EMPTY,
        }; RECENT_METHODS],
    };

    #[inline(always)]
    fn index(instance: u32, method: u64) -> usize {
        // `Method`s are 8-aligned and at least 80 bytes apart.
        let key =
            (method >> 3) as u32 ^ ((method >> 32) as u32) ^ instance.wrapping_mul(0x9e37_79b9);
        (key.wrapping_mul(0x85eb_ca6b) >> (32 - RECENT_METHOD_BITS)) as usize & (RECENT_METHODS - 1)
    }

    /// Copies what was read of `method` of JVM `instance` less than [`PROOF_TTL_NS`] before
    /// `now_ns` into `out`, if this table has it; false (and `out` untouched) if not. Into the
    /// caller's place, not returned: the BPF program's stack has no room for copies.
    #[inline(always)]
    pub fn recall_into(
        &self,
        instance: u32,
        method: u64,
        now_ns: u64,
        out: &mut MethodFacts,
    ) -> bool {
        if instance == 0 || method == 0 {
            return false;
        }
        let Some(entry) = self.entries.get(Self::index(instance, method)) else {
            return false;
        };
        let fresh = ((now_ns >> READ_TIME_SHIFT) as u32).wrapping_sub(entry.read_at) < TTL_UNITS;
        if entry.instance != instance || entry.facts.method != method || !fresh {
            return false;
        }
        *out = entry.facts;
        true
    }

    /// [`RecentMethodTable::recall_into`], returned (for tests).
    #[cfg(test)]
    fn recall(&self, instance: u32, method: u64, now_ns: u64) -> Option<MethodFacts> {
        let mut out = MethodFacts::EMPTY;
        self.recall_into(instance, method, now_ns, &mut out)
            .then_some(out)
    }

    /// Remembers `facts`, just read at `now_ns` for JVM `instance`, in place of whatever its
    /// entry held.
    #[inline(always)]
    pub fn remember(&mut self, instance: u32, facts: &MethodFacts, now_ns: u64) {
        if instance == 0 || facts.method == 0 {
            return;
        }
        if let Some(entry) = self.entries.get_mut(Self::index(instance, facts.method)) {
            *entry = RecentMethod {
                instance,
                read_at: (now_ns >> READ_TIME_SHIFT) as u32,
                facts: *facts,
            };
        }
    }
}

impl Default for RecentMethodTable {
    fn default() -> Self {
        Self::EMPTY
    }
}

/// Where the walk keeps its [`RecentMethodTable`] (the BPF side: a per-CPU map slot).
pub trait RecentMethods {
    /// Runs `use_table` on the table; None if there is none.
    fn with_recent_methods<R>(
        &self,
        use_table: impl FnOnce(&mut RecentMethodTable) -> R,
    ) -> Option<R>;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(method: u64) -> MethodFacts {
        MethodFacts {
            method,
            const_method: method + 0x1000,
            code_size: 17,
            cookie: method as u32 ^ 0x5a5a,
        }
    }

    #[test]
    fn a_method_is_recalled_within_the_ttl_and_not_after() {
        let mut table = RecentMethodTable::EMPTY;
        let at = 5_000_000_000;
        table.remember(7, &facts(0x7f00_1000_0040), at);
        assert_eq!(
            table.recall(7, 0x7f00_1000_0040, at + PROOF_TTL_NS / 2),
            Some(facts(0x7f00_1000_0040))
        );
        assert_eq!(
            table.recall(
                7,
                0x7f00_1000_0040,
                at + PROOF_TTL_NS + (2 << READ_TIME_SHIFT)
            ),
            None
        );
    }

    #[test]
    fn a_method_of_another_jvm_or_address_is_not_recalled() {
        let mut table = RecentMethodTable::EMPTY;
        let at = 1 << 40;
        table.remember(7, &facts(0x7f00_1000_0040), at);
        assert_eq!(table.recall(8, 0x7f00_1000_0040, at), None);
        assert_eq!(table.recall(7, 0x7f00_1000_0048, at), None);
        assert_eq!(table.recall(0, 0x7f00_1000_0040, at), None);
    }

    #[test]
    fn read_times_wrap() {
        let mut table = RecentMethodTable::EMPTY;
        // Just before the 32-bit read time wraps.
        let at = (u32::MAX as u64) << READ_TIME_SHIFT;
        table.remember(3, &facts(0x8000_0040), at);
        assert!(table
            .recall(3, 0x8000_0040, at + PROOF_TTL_NS / 2)
            .is_some());
    }
}
