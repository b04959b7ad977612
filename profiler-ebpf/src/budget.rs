//! Emit budgets (`profiler_common::budget`): before a record goes to a ring, its process's and
//! its user's token buckets for that producer must both have a positive balance; the record's
//! bytes are then taken from both. A refused record is counted, per producer and per reason.
//!
//! The buckets are read and written without atomics: two CPUs charging one bucket at the same
//! instant may both be admitted on the same balance, so a budget can be passed by a record per
//! CPU at most, never more.

use aya_ebpf::{
    helpers::{bpf_get_current_uid_gid, bpf_ktime_get_ns},
    macros::map,
    maps::LruHashMap,
};
use profiler_common::budget::{
    refill, Bucket, EmitBudget, Producer, PROCESS_BUCKETS, PRODUCERS, USER_BUCKETS,
};

use crate::count;

/// Set by the daemon at load time, indexed by [`Producer`]; a zero rate is unbounded.
#[no_mangle]
static EMIT_BUDGETS: [EmitBudget; PRODUCERS] = [EmitBudget {
    process_bytes_per_sec: 0,
    process_burst_bytes: 0,
    user_bytes_per_sec: 0,
    user_burst_bytes: 0,
}; PRODUCERS];

/// Buckets by producer and pid; by producer and uid. Two maps: a user who makes processes
/// without end evicts only process buckets, never the user buckets that bound them.
#[map]
static PROCESS_EMIT_BUCKETS: LruHashMap<u64, Bucket> =
    LruHashMap::with_max_entries(PROCESS_BUCKETS, 0);
#[map]
static USER_EMIT_BUCKETS: LruHashMap<u64, Bucket> = LruHashMap::with_max_entries(USER_BUCKETS, 0);

/// The current task's real uid, as records carry it.
#[inline(always)]
pub(crate) fn current_uid() -> u32 {
    bpf_get_current_uid_gid() as u32
}

/// Whether a record of `bytes` from `pid` of `uid` may go to `producer`'s ring; if so, its
/// bytes are charged to both budgets.
#[inline(always)]
pub(crate) fn admit(producer: Producer, pid: u32, uid: u32, bytes: usize) -> bool {
    // SAFETY: a global the loader sets once; read-only afterwards.
    let budget = unsafe { core::ptr::read_volatile(&EMIT_BUDGETS[producer as usize]) };
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let key = |id: u32| (producer as u64) << 32 | u64::from(id);
    let (process_refused, user_refused) = producer.refusal_counters();
    let process = charge_point(
        &PROCESS_EMIT_BUCKETS,
        key(pid),
        now,
        budget.process_bytes_per_sec,
        budget.process_burst_bytes,
    );
    let user = charge_point(
        &USER_EMIT_BUCKETS,
        key(uid),
        now,
        budget.user_bytes_per_sec,
        budget.user_burst_bytes,
    );
    if !process.admits() {
        count(process_refused);
        return false;
    }
    if !user.admits() {
        count(user_refused);
        return false;
    }
    process.take(bytes as i64);
    user.take(bytes as i64);
    true
}

/// A bucket refilled for now, ready to be charged; unbounded when its rate is zero or it
/// could not be had (the map refused a new entry: no memory).
enum ChargePoint {
    Unbounded,
    Bucket(*mut Bucket),
}

impl ChargePoint {
    #[inline(always)]
    fn admits(&self) -> bool {
        match self {
            Self::Unbounded => true,
            // SAFETY: a map value this program holds for its run.
            Self::Bucket(bucket) => unsafe { (**bucket).balance > 0 },
        }
    }

    #[inline(always)]
    fn take(&self, bytes: i64) {
        if let Self::Bucket(bucket) = self {
            // SAFETY: as above.
            unsafe { (**bucket).balance = (**bucket).balance.saturating_sub(bytes) };
        }
    }
}

#[inline(always)]
fn charge_point(
    buckets: &LruHashMap<u64, Bucket>,
    key: u64,
    now: u64,
    rate: u64,
    burst: u64,
) -> ChargePoint {
    if rate == 0 {
        return ChargePoint::Unbounded;
    }
    if let Some(bucket) = buckets.get_ptr_mut(&key) {
        // SAFETY: a map value this program holds for its run.
        unsafe { *bucket = refill(*bucket, now, rate, burst) };
        return ChargePoint::Bucket(bucket);
    }
    let full = Bucket {
        balance: burst.min(i64::MAX as u64) as i64,
        refilled_ns: now,
    };
    if buckets.insert(&key, &full, 0).is_err() {
        return ChargePoint::Unbounded;
    }
    match buckets.get_ptr_mut(&key) {
        Some(bucket) => ChargePoint::Bucket(bucket),
        None => ChargePoint::Unbounded,
    }
}
