//! What ran a frame. Every frame of a symbolized profile carries its kind from where it was
//! named; outputs show it their own way: pprof and flame graphs as async-profiler's name
//! suffixes (`_[j]`, `annotate_frames`, on by default: the flame graphs' Java palette colours
//! frames by them, and users filter on them), OTLP as the `profile.frame.type` attribute.

/// How a frame ran, or what the profiler put there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Kernel code.
    Kernel,
    /// Machine code of a file (or anonymous memory) that is no Java method's.
    Native,
    /// A Java method run by the interpreter.
    Interpreted,
    /// A Java method compiled by C1 (tiers 1 to 3).
    C1,
    /// A Java method compiled by C2 (tier 4), or any other compiler.
    Jit,
    /// A Java method inlined into a compiled caller: only ever a line of a compiled frame.
    Inlined,
    /// HotSpot code that is no Java method (stubs, adapters), the class an allocation
    /// profile's stack is topped with, and Java frames nothing could be read for.
    Jvm,
    /// A frame the profiler adds where a stack ends early (`[truncated: max_depth]`,
    /// `[stacks past the bound]`).
    Truncated,
    /// A frame the profiler adds at a stack's root for its thread or pool
    /// (`crate::thread_roots`), or its process in the whole-host view.
    Root,
}

impl FrameKind {
    /// The suffix async-profiler gives a function of this kind; empty for kinds it marks not.
    pub const fn suffix(self) -> &'static str {
        match self {
            Self::Kernel => "_[k]",
            Self::Interpreted => "_[0]",
            Self::C1 => "_[1]",
            Self::Jit => "_[j]",
            Self::Inlined => "_[i]",
            Self::Native | Self::Jvm | Self::Truncated | Self::Root => "",
        }
    }

    /// The kind of an nmethod compiled at `comp_level`.
    pub fn of_level(comp_level: i32) -> Self {
        if (1..=3).contains(&comp_level) {
            Self::C1
        } else {
            Self::Jit
        }
    }

    /// Whether Java code runs in frames of this kind.
    pub const fn is_jvm(self) -> bool {
        matches!(
            self,
            Self::Interpreted | Self::C1 | Self::Jit | Self::Inlined | Self::Jvm
        )
    }

    /// The kind of line `position` of `lines` lines of a frame of this kind (innermost first):
    /// in a compiled Java frame every line but the outermost is a method inlined into it.
    pub const fn of_line(self, position: usize, lines: usize) -> Self {
        match self {
            Self::C1 | Self::Jit if position + 1 < lines => Self::Inlined,
            kind => kind,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_outermost_line_of_a_compiled_frame_is_not_inlined() {
        assert_eq!(FrameKind::Jit.of_line(0, 3), FrameKind::Inlined);
        assert_eq!(FrameKind::C1.of_line(1, 3), FrameKind::Inlined);
        assert_eq!(FrameKind::Jit.of_line(2, 3), FrameKind::Jit);
        // Inlined native functions and the kernel's are shown as their frame.
        assert_eq!(FrameKind::Native.of_line(0, 2), FrameKind::Native);
        assert_eq!(FrameKind::Kernel.of_line(0, 2), FrameKind::Kernel);
        assert_eq!(FrameKind::Interpreted.of_line(0, 1), FrameKind::Interpreted);
    }
}
