//! A frame as a name source resolved it: what every symbolizer (native, kernel, Java) and the
//! Java naming policy produce, and what the profile builder consumes. A leaf module, so that the
//! name sources and the policy share it without importing each other.

use std::sync::Arc;

/// One function on a frame's inline chain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SourceLine {
    pub function: String,
    /// A fuller name when there is one (a Java method with its signature); else `function`.
    pub system_name: Option<String>,
    pub file: Option<String>,
    /// 0 when unknown.
    pub line: u32,
}

/// What one sampled address resolved to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ResolvedFrame {
    /// Innermost inlined function first; the last entry is the function the code belongs to.
    /// Never empty.
    pub lines: Vec<SourceLine>,
    /// The file the address is in (its path in the process's namespace), if any.
    pub module: Option<Arc<str>>,
    /// That file's GNU build-id in hex, as the file claims it: shown in profiles (mappings),
    /// never a key to anything.
    pub build_id: Option<Arc<str>>,
}

impl ResolvedFrame {
    /// A frame with only a name: unknown addresses, markers.
    pub fn named(name: impl Into<String>, module: Option<Arc<str>>) -> Self {
        Self {
            lines: vec![SourceLine {
                function: name.into(),
                system_name: None,
                file: None,
                line: 0,
            }],
            module,
            build_id: None,
        }
    }

    /// This frame with its module's build-id.
    pub fn with_build_id(mut self, build_id: Option<Arc<str>>) -> Self {
        self.build_id = build_id;
        self
    }

    pub fn function(&self) -> &str {
        self.lines.last().map_or("", |line| line.function.as_str())
    }
}
