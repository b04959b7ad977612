//! The Java threads of each JVM as the tracker last read them, by `JavaThread*`, shared with the
//! symbolizer thread.
//!
//! The tracker reads every Java thread's `JavaThread*` and native tid from the JVM's thread list
//! (to fill the BPF map of Java threads); the sidecar agent can name a thread it has no tid for
//! only by its `JavaThread*` (`LiveThread` records). This directory lets the one answer the
//! other without a read of the JVM's memory of its own: the tracker publishes each set it reads,
//! and stamps it as current at every scan that finds the JVM's thread list unchanged. The time
//! a set was last known current matters: a `JavaThread*` is freed when its thread ends and may
//! be reused by the next thread, so a record may only be matched against a set known current
//! after the record was read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// One JVM's Java threads at a point in time.
#[derive(Clone, Debug)]
pub struct JvmThreads {
    /// `JavaThread*` -> tid in the JVM's pid namespace.
    pub by_java_thread: Arc<HashMap<u64, u32>>,
    /// When the set was last known to be the JVM's (read, or its list found unchanged).
    pub current_at: Instant,
}

/// Shared between the tracker (writes) and the symbolizer (reads); cheap to clone.
#[derive(Clone, Debug, Default)]
pub struct ThreadDirectory {
    jvms: Arc<Mutex<HashMap<u32, JvmThreads>>>,
}

impl ThreadDirectory {
    fn jvms(&self) -> MutexGuard<'_, HashMap<u32, JvmThreads>> {
        self.jvms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The JVM of host pid `pid` has these threads (`JavaThread*`, namespace tid), read now.
    pub fn publish(&self, pid: u32, threads: impl IntoIterator<Item = (u64, u32)>) {
        let by_java_thread = Arc::new(threads.into_iter().collect());
        self.jvms().insert(
            pid,
            JvmThreads {
                by_java_thread,
                current_at: Instant::now(),
            },
        );
    }

    /// The JVM's threads are still those last published (its thread list is unchanged).
    pub fn confirm(&self, pid: u32) {
        if let Some(jvm) = self.jvms().get_mut(&pid) {
            jvm.current_at = Instant::now();
        }
    }

    /// The JVM exited, or is no longer tracked.
    pub fn remove(&self, pid: u32) {
        self.jvms().remove(&pid);
    }

    /// The JVM's threads as last published, if it is tracked.
    pub fn get(&self, pid: u32) -> Option<JvmThreads> {
        self.jvms().get(&pid).cloned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_are_published_confirmed_and_removed() {
        let directory = ThreadDirectory::default();
        assert!(directory.get(7).is_none());
        directory.publish(7, [(0x1000, 12), (0x2000, 13)]);
        let first = directory.get(7).expect("published");
        assert_eq!(first.by_java_thread.get(&0x2000), Some(&13));
        directory.confirm(7);
        let confirmed = directory.clone().get(7).expect("still there");
        assert!(confirmed.current_at >= first.current_at);
        assert!(Arc::ptr_eq(
            &first.by_java_thread,
            &confirmed.by_java_thread
        ));
        directory.confirm(8);
        assert!(directory.get(8).is_none());
        directory.remove(7);
        assert!(directory.get(7).is_none());
    }
}
