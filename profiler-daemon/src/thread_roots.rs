//! How flame graphs show the thread a stack ran on (the `threads` setting): not at all
//! (`merged`, the default), as its pool (`pool`), or as the thread itself (`thread`).
//!
//! Merged is what Grafana users read: a service's flame graph merges every pod and interval,
//! and a root per thread (a 200-thread pool on 10 pods is 2,000 roots that differ by tid) makes
//! "what is hot here?" a sum done by eye; Pyroscope's own agents push merged stacks too. A
//! pool's name is its threads' name with the last run of digits collapsed
//! (`http-nio-8080-exec-12` -> `http-nio-8080-exec-*`), so a pool is one root whatever its size
//! and across restarts. Virtual threads' stacks are one root, `[virtual]`. A leaf module: Pyroscope's variant (`profiles`), the local flame graphs
//! and the `view` command all root stacks through it.

use std::borrow::Cow;

/// The root of virtual threads' stacks with `pool` or `thread`.
pub const VIRTUAL_ROOT: &str = "[virtual]";

profiler_common::labelled_enum! {
    /// The `threads` setting; its label is the setting's value.
    #[derive(Default)]
    pub enum ThreadRoots {
        /// No thread frame: stacks of every thread merged.
        #[default]
        Merged => "merged",
        /// Each stack rooted at its thread's pool, `[http-nio-8080-exec-*]`.
        Pool => "pool",
        /// Each stack rooted at its thread, `[http-nio-8080-exec-12 tid=4242]`.
        Thread => "thread",
    }
}

impl ThreadRoots {
    pub const VALUES: &'static str = "\"merged\", \"pool\" or \"thread\"";

    /// The synthetic root frame of a stack that ran on thread `tid` named `name`, if any; a
    /// virtual thread's own stack (rooted at `VirtualThread.run`: its carrier, named here, is
    /// not its thread, and a thread per task is no pool) is rooted at `[virtual]` instead.
    pub fn root_frame(self, name: &str, tid: u32, virtual_thread: bool) -> Option<String> {
        if virtual_thread && self != Self::Merged {
            return Some(VIRTUAL_ROOT.to_owned());
        }
        match self {
            Self::Merged => None,
            Self::Pool => Some(format!("[{}]", pool_name(name))),
            Self::Thread => Some(format!("[{name} tid={tid}]")),
        }
    }
}

/// The pool a thread named `name` belongs to: its last run of ASCII digits collapsed to `*`
/// (`GC Thread#3` -> `GC Thread#*`, `ForkJoinPool-1-worker-7` -> `ForkJoinPool-1-worker-*`);
/// a name without digits is its own pool (`main`).
pub fn pool_name(name: &str) -> Cow<'_, str> {
    let Some(last_digit) = name.rfind(|c: char| c.is_ascii_digit()) else {
        return Cow::Borrowed(name);
    };
    let start = name[..last_digit]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |before| before + 1);
    Cow::Owned(format!("{}*{}", &name[..start], &name[last_digit + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_collapse_the_last_run_of_digits() {
        for (thread, pool) in [
            ("http-nio-8080-exec-12", "http-nio-8080-exec-*"),
            ("http-nio-8080-exec-1", "http-nio-8080-exec-*"),
            ("GC Thread#3", "GC Thread#*"),
            ("ForkJoinPool-1-worker-7", "ForkJoinPool-1-worker-*"),
            ("C2 CompilerThread0", "C2 CompilerThread*"),
            ("pool-2-thread-15", "pool-2-thread-*"),
            ("worker-3a", "worker-*a"),
            ("42", "*"),
            ("main", "main"),
            ("", ""),
            // Digits elsewhere than ASCII are names, not numbers.
            ("w\u{0663}", "w\u{0663}"),
        ] {
            assert_eq!(pool_name(thread), pool, "{thread}");
        }
    }

    #[test]
    fn root_frames_per_setting() {
        let name = "http-nio-8080-exec-12";
        assert_eq!(ThreadRoots::Merged.root_frame(name, 4242, false), None);
        assert_eq!(
            ThreadRoots::Pool.root_frame(name, 4242, false).as_deref(),
            Some("[http-nio-8080-exec-*]")
        );
        assert_eq!(
            ThreadRoots::Thread.root_frame(name, 4242, false).as_deref(),
            Some("[http-nio-8080-exec-12 tid=4242]")
        );
        // A virtual thread's own stack: its carrier is not its thread.
        let carrier = "ForkJoinPool-1-worker-3";
        assert_eq!(ThreadRoots::Merged.root_frame(carrier, 7, true), None);
        for roots in [ThreadRoots::Pool, ThreadRoots::Thread] {
            assert_eq!(
                roots.root_frame(carrier, 7, true).as_deref(),
                Some("[virtual]")
            );
        }
    }

    #[test]
    fn settings_parse_by_name_only() {
        assert_eq!(ThreadRoots::default(), ThreadRoots::Merged);
        for roots in [ThreadRoots::Merged, ThreadRoots::Pool, ThreadRoots::Thread] {
            assert_eq!(ThreadRoots::from_name(roots.name()), Some(roots));
        }
        assert_eq!(ThreadRoots::from_name("Pool"), None);
        assert_eq!(ThreadRoots::from_name("true"), None);
    }
}
