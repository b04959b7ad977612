//! Time a thread of the daemon spends on each user's processes, in fixed windows: a user whose
//! processes make it work (fake JVMs to inspect, libraries to build tables for) waits for the
//! next window once their share is spent, and never delays another user's.

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

#[cfg(test)]
mod tests {
    use super::*;

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
