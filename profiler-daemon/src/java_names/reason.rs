//! Why a Java frame has no name: one reason per kind of miss, shown in the marker frame that
//! takes the name's place and counted in `profiler_java_frames_unnamed_total{reason}`.

use std::sync::atomic::{AtomicU64, Ordering};

profiler_common::labelled_enum! {
    /// Why a Java frame (or one function of its inline chain) could not be named. A miss is a
    /// value, not an error: the frame stays in the stack as a marker naming the reason. `ALL`
    /// is in discriminant order, the counters' index.
    pub enum UnnamedReason: u8, from_u8 {
        /// The process's JVM could not be inspected (libjvm or its VMStructs unreadable): there is
        /// no layout to read names with.
        NoJvm = 0 => "no_jvm",
        /// The unwinder recorded a frame kind that is not a Java one.
        BadFrameKind = 1 => "bad_frame_kind",
        /// Reading the JVM's memory failed: unmapped, freed, or a null pointer where one must be.
        Unreadable = 2 => "unreadable",
        /// This JVM does not export a VMStructs field that naming needs.
        MissingField = 3 => "missing_field",
        /// A symbol or the debug info is larger than the bounds on what is read.
        OverBound = 4 => "over_bound",
        /// The interpreted frame's `Method*` now holds another method (its cookie differs): the
        /// memory was reused since the sample.
        MethodReused = 5 => "method_reused",
        /// The code blob holds another compilation now (its compile id differs): freed and reused
        /// since the sample.
        CodeReused = 6 => "code_reused",
        /// The allocated class's name `Symbol` is another one now (its cookie differs): the class
        /// was unloaded since the sample and its name freed.
        ClassReused = 7 => "class_reused",
        /// What was read where a name should be is none: not (modified) UTF-8, empty, with
        /// characters no Java or JVM name has (control characters, U+FFFD), or a `Symbol`
        /// that is not the one the sample recorded (its length or last bytes differ). Freed
        /// memory read as a name, mostly.
        BadName = 8 => "bad_name",
    }
}

/// What a marker stands for: the whole frame, one method of it, or a code blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unnamed {
    /// `[unknown java frame: no_jvm]`
    Frame,
    /// `[unknown java method: method_reused]`
    Method,
    /// `[unknown compiled frame: code_reused]`
    Compiled,
    /// `[unknown allocated class: class_reused]`
    AllocatedClass,
}

impl Unnamed {
    /// The marker shown in the name's place, e.g. `[unknown java method: method_reused]`.
    pub fn marker(self, reason: UnnamedReason) -> String {
        let what = match self {
            Self::Frame => "java frame",
            Self::Method => "java method",
            Self::Compiled => "compiled frame",
            Self::AllocatedClass => "allocated class",
        };
        format!("[unknown {what}: {}]", reason.name())
    }
}

/// Markers shown, by reason: an array indexed by the reason, so counting is one atomic add.
#[derive(Debug, Default)]
pub struct UnnamedCounts([AtomicU64; UnnamedReason::ALL.len()]);

impl UnnamedCounts {
    pub fn add(&self, reason: UnnamedReason) {
        self.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts the markers of one frame (see `Named::unnamed`).
    pub fn add_all(&self, reasons: &[UnnamedReason]) {
        for reason in reasons {
            self.add(*reason);
        }
    }

    pub fn get(&self, reason: UnnamedReason) -> u64 {
        self.0[reason as usize].load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reasons_index_their_counters_and_name_their_markers() {
        let counts = UnnamedCounts::default();
        for (index, reason) in UnnamedReason::ALL.iter().enumerate() {
            assert_eq!(*reason as usize, index, "ALL is in discriminant order");
            for _ in 0..=index {
                counts.add(*reason);
            }
        }
        for (index, reason) in UnnamedReason::ALL.iter().enumerate() {
            assert_eq!(counts.get(*reason), index as u64 + 1, "{reason:?}");
        }
        let names: std::collections::BTreeSet<_> =
            UnnamedReason::ALL.iter().map(|r| r.name()).collect();
        assert_eq!(names.len(), UnnamedReason::ALL.len(), "labels are distinct");
        assert_eq!(
            Unnamed::Method.marker(UnnamedReason::MethodReused),
            "[unknown java method: method_reused]"
        );
        assert_eq!(
            Unnamed::Compiled.marker(UnnamedReason::CodeReused),
            "[unknown compiled frame: code_reused]"
        );
        assert_eq!(
            Unnamed::Frame.marker(UnnamedReason::NoJvm),
            "[unknown java frame: no_jvm]"
        );
    }
}
