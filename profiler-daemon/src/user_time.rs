//! Time a thread of the daemon spends on each user's processes, in fixed windows: a user whose
//! processes make it work (fake JVMs to inspect, libraries to build tables for) waits for the
//! next window once their share is spent, and never delays another user's.
//!
//! The JVM tracker charges inspections the work's time ([`WorkTimer`]): wall time less what the
//! thread spent waiting for a CPU. On a busy node (the profiled JVMs themselves keep the CPUs
//! busy) wall time grows with everyone's load: charged that, a user's five JVMs took a share each, and their layouts
//! were pushed 1.3 s apart (measured: the last of five, under the short-threads workload, 5.4 s
//! after the daemon started; the same five idle, 0.35 s; charged the work's time, busy, 0.95 s).

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Each user's time in the current window, against a share per window.
pub struct UserTimeShares {
    /// What one user's processes may take per window.
    pub share: Duration,
    window: Duration,
    window_start: Option<Instant>,
    spent: HashMap<u32, Duration>,
}

impl UserTimeShares {
    pub fn new(share: Duration, window: Duration) -> Self {
        Self {
            share,
            window,
            window_start: None,
            spent: HashMap::new(),
        }
    }

    /// Whether `uid`'s processes may take more time in this window.
    pub fn allows(&mut self, uid: u32) -> bool {
        self.roll();
        self.spent.get(&uid).copied().unwrap_or_default() < self.share
    }

    /// What `uid`'s processes took in this window.
    pub fn spent(&self, uid: u32) -> Duration {
        self.spent.get(&uid).copied().unwrap_or_default()
    }

    /// Counts `took` against `uid`'s share.
    pub fn charge(&mut self, uid: u32, took: Duration) {
        self.roll();
        *self.spent.entry(uid).or_default() += took;
    }

    fn roll(&mut self) {
        if self
            .window_start
            .is_none_or(|start| start.elapsed() >= self.window)
        {
            self.window_start = Some(Instant::now());
            self.spent.clear();
        }
    }
}

/// Times a piece of this thread's work: the wall time since [`WorkTimer::start`] less the time
/// the kernel counted the thread as runnable but waiting for a CPU (`run_delay`, the second
/// field of `/proc/thread-self/schedstat`). Time the thread sleeps (a read that blocks) still
/// counts: that is the work's, and a process can cause it. Wall time where the file is missing
/// (a kernel without `CONFIG_SCHED_INFO`).
pub struct WorkTimer {
    started: Instant,
    run_delay_ns: Option<u64>,
}

impl WorkTimer {
    pub fn start() -> Self {
        Self {
            run_delay_ns: own_run_delay_ns(),
            started: Instant::now(),
        }
    }

    pub fn elapsed(&self) -> Duration {
        let wall = self.started.elapsed();
        let waited = match (self.run_delay_ns, own_run_delay_ns()) {
            (Some(before), Some(now)) => Duration::from_nanos(now.saturating_sub(before)),
            _ => Duration::ZERO,
        };
        wall.saturating_sub(waited)
    }
}

/// This thread's time spent runnable but not running, in nanoseconds, since it started.
fn own_run_delay_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn work_time_leaves_out_waiting_for_a_cpu_and_keeps_sleeping() {
        assert!(own_run_delay_ns().is_some(), "/proc/thread-self/schedstat");
        // Asleep: no CPU wanted, so the whole time is the work's.
        let timer = WorkTimer::start();
        std::thread::sleep(Duration::from_millis(50));
        let slept = timer.elapsed();
        assert!(slept >= Duration::from_millis(45), "{slept:?}");
        // Busy beside as many spinning threads as CPUs, twice over: this thread waits for a CPU
        // much of the time, which is left out.
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let spinners: Vec<_> = (0..2 * cpus)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect();
        let timer = WorkTimer::start();
        let wall = Instant::now();
        while wall.elapsed() < Duration::from_millis(300) {
            std::hint::spin_loop();
        }
        let worked = timer.elapsed();
        let wall = wall.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for spinner in spinners {
            let _ = spinner.join();
        }
        assert!(
            worked < wall.mul_f64(0.8),
            "worked {worked:?} of {wall:?} beside {} spinning threads",
            2 * cpus
        );
    }

    #[test]
    fn a_user_past_the_share_waits_and_others_do_not() {
        let mut shares = UserTimeShares::new(Duration::from_millis(10), Duration::from_secs(60));
        assert!(shares.allows(1));
        shares.charge(1, Duration::from_millis(10));
        assert!(!shares.allows(1));
        assert!(shares.allows(2));
        // A new window: everyone's share again.
        let mut short = UserTimeShares::new(Duration::from_millis(10), Duration::ZERO);
        short.charge(1, Duration::from_millis(10));
        assert!(short.allows(1));
    }
}
