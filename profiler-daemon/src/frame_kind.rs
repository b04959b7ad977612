//! How a frame ran, and the suffix async-profiler gives it (`annotate`, on by default): the
//! flame graphs' Java palette colours frames by these suffixes, and users filter on them.

/// A frame's kind as a profile shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShownKind {
    /// Kernel code.
    Kernel,
    /// A Java method run by the interpreter.
    Interpreted,
    /// A Java method compiled by C1 (tiers 1 to 3).
    C1,
    /// A Java method compiled by C2 (tier 4), or any other compiler.
    Jit,
    /// A Java method inlined into a compiled caller.
    Inlined,
}

impl ShownKind {
    pub const fn suffix(self) -> &'static str {
        match self {
            Self::Kernel => "_[k]",
            Self::Interpreted => "_[0]",
            Self::C1 => "_[1]",
            Self::Jit => "_[j]",
            Self::Inlined => "_[i]",
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
}
