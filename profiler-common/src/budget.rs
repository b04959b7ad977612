//! Emit budgets: how much work one process and one user may hand the daemon through each BPF
//! producer (token buckets in bytes, kept by the BPF side in `profiler-ebpf/src/budget.rs`).
//!
//! Every record a profiled process causes (a CPU sample of it, an allocation it makes, a wait
//! it starts, an exec or exit) costs the daemon memory and time in proportion to its bytes, and
//! shares a ring with every other process's. A producer's budget bounds what one process, and
//! all processes of one user together, emit per second, with a burst of at most a fraction of
//! the ring: one user can fill neither a ring nor the daemon's time, whatever stacks it makes.
//! Past a budget, records are refused and counted ([`crate::Counter`]'s `*_budget` counters).

/// CPU sample records up to this size are sent without being charged: the clock bounds them
/// (a sample per CPU per tick), and a record this small cannot fill the ring faster than it was
/// sized for. Only deeper stacks pay for the two bucket lookups, and are bounded by them.
pub const CPU_UNCHARGED_RECORD_BYTES: usize = 4096;

/// What emits records for the daemon. Numbers index [`EmitBudget`] arrays and counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Producer {
    /// The CPU sampler (`SAMPLES`).
    Cpu = 0,
    /// The allocation hooks (`ALLOC_SAMPLES`).
    Alloc = 1,
    /// The off-CPU and lock programs' wait stacks (`OFF_CPU_EVENTS`).
    OffCpu = 2,
    /// Exec and exit events (`PROCESS_EVENTS`).
    ProcessEvents = 3,
}

pub const PRODUCERS: usize = 4;

impl Producer {
    pub const ALL: [Self; PRODUCERS] = [Self::Cpu, Self::Alloc, Self::OffCpu, Self::ProcessEvents];

    /// The counters of records refused at the process's budget, then at the user's.
    pub const fn refusal_counters(self) -> (crate::Counter, crate::Counter) {
        use crate::Counter::*;
        match self {
            Self::Cpu => (CpuProcessBudget, CpuUserBudget),
            Self::Alloc => (AllocProcessBudget, AllocUserBudget),
            Self::OffCpu => (OffCpuProcessBudget, OffCpuUserBudget),
            Self::ProcessEvents => (ProcessEventsProcessBudget, ProcessEventsUserBudget),
        }
    }
}

/// One producer's budget, set by the daemon at load time. A rate of zero means unbounded.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EmitBudget {
    /// Bytes per second one process may emit, and the most it may emit at once.
    pub process_bytes_per_sec: u64,
    pub process_burst_bytes: u64,
    /// The same for all processes of one user together.
    pub user_bytes_per_sec: u64,
    pub user_burst_bytes: u64,
}

impl EmitBudget {
    /// A budget whose bursts are a quarter second of its rates: the daemon drains its rings
    /// every 250 ms (and sooner when one fills), so a burst is what one drain sees.
    pub const fn per_second(process_bytes: u64, user_bytes: u64) -> Self {
        Self {
            process_bytes_per_sec: process_bytes,
            process_burst_bytes: process_bytes / 4,
            user_bytes_per_sec: user_bytes,
            user_burst_bytes: user_bytes / 4,
        }
    }
}

/// A token bucket as the BPF side keeps it: a balance in bytes (negative after a record larger
/// than what was left: a record is admitted while the balance is positive), and when it was
/// last refilled.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    pub balance: i64,
    pub refilled_ns: u64,
}

/// Most processes and users whose buckets are kept at once (least recently used go first:
/// a process whose bucket was dropped starts again with a full one, which its user's bucket
/// still bounds; users cannot be made up by an unprivileged process, so their map does not
/// churn).
pub const PROCESS_BUCKETS: u32 = 8192;
pub const USER_BUCKETS: u32 = 1024;

/// `bucket` refilled at `rate` bytes per second up to `burst` for the time since its last
/// refill. The arithmetic the BPF side runs, here so that it is tested.
#[inline(always)]
pub fn refill(bucket: Bucket, now_ns: u64, rate: u64, burst: u64) -> Bucket {
    // Past a second the bucket is full whatever the rate: the product below stays in range.
    let elapsed = now_ns.saturating_sub(bucket.refilled_ns);
    let elapsed = if elapsed > 1_000_000_000 {
        1_000_000_000
    } else {
        elapsed
    };
    let rate = if rate > u32::MAX as u64 {
        u32::MAX as u64
    } else {
        rate
    };
    let added = (elapsed * rate / 1_000_000_000) as i64;
    let burst = if burst > i64::MAX as u64 {
        i64::MAX
    } else {
        burst as i64
    };
    let balance = bucket.balance.saturating_add(added);
    Bucket {
        balance: if balance > burst { burst } else { balance },
        refilled_ns: now_ns,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_refills_at_its_rate_up_to_its_burst() {
        let empty = Bucket {
            balance: 0,
            refilled_ns: 1_000,
        };
        // 100 ms at 1 MB/s: 100 KB.
        let later = refill(empty, 1_000 + 100_000_000, 1_000_000, 250_000);
        assert_eq!(later.balance, 100_000);
        // Never past the burst, even after an hour.
        let full = refill(later, 3_600_000_000_000, 1_000_000, 250_000);
        assert_eq!(full.balance, 250_000);
        // A debt is paid back before anything is admitted again.
        let owing = Bucket {
            balance: -50_000,
            refilled_ns: 0,
        };
        assert_eq!(
            refill(owing, 10_000_000, 1_000_000, 250_000).balance,
            -40_000
        );
        // A clock that went back adds nothing.
        assert_eq!(refill(later, 0, 1_000_000, 250_000).balance, later.balance);
    }

    #[test]
    fn every_producer_has_its_own_counters() {
        let mut seen = [false; crate::Counter::COUNT];
        for producer in Producer::ALL {
            let (process, user) = producer.refusal_counters();
            for counter in [process, user] {
                assert!(!seen[counter as usize], "{counter:?} used twice");
                seen[counter as usize] = true;
            }
        }
    }
}
