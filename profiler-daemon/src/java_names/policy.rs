//! The naming policy: which source names a Java frame, and what is shown when none can.
//!
//! - Interpreted frames: the method memory read for the sampled `Method*` and cookie.
//! - Compiled frames: a stub by its blob name; an nmethod from the agent's record when it is this
//!   very nmethod (same `Method*`, pc inside its code) and the record's compiled method is the
//!   one memory names for this nmethod; else from memory's scope chain, each method named as it
//!   was read with the nmethod. A record that disagrees with memory, or that memory cannot
//!   confirm, is never used: the memory names are, or a marker.
//! - Every miss is a marker line naming its [`UnnamedReason`], reported in [`Named::unnamed`].

use std::collections::HashMap;
use std::sync::Arc;

use super::method::MethodInfo;
use super::reason::{Unnamed, UnnamedReason};
use super::recorded::RecordedNmethod;
use crate::symbolize::{ResolvedFrame, SourceLine};

/// A method's names, or why there are none.
pub type MethodName = Result<Arc<MethodInfo>, UnnamedReason>;

/// How a Java frame ran, shown as async-profiler's suffixes when annotation is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JavaFrameKind {
    Interpreted,
    /// C1 (tiers 1 to 3).
    C1,
    /// C2 (tier 4), or any other compiler.
    Jit,
    Inlined,
}

impl JavaFrameKind {
    pub fn suffix(self) -> &'static str {
        match self {
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

/// A named (or marked) Java frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub frame: ResolvedFrame,
    /// The reason of each marker line in `frame` (empty when every line is named).
    pub unnamed: Vec<UnnamedReason>,
    /// Whether the sidecar agent's records named it.
    pub from_sidecar: bool,
}

impl Named {
    /// A frame that is only a marker.
    pub fn unknown(what: Unnamed, reason: UnnamedReason) -> Self {
        Self {
            frame: ResolvedFrame::named(what.marker(reason), None),
            unnamed: vec![reason],
            from_sidecar: false,
        }
    }

    fn from_lines(lines: Vec<(SourceLine, Option<UnnamedReason>)>, from_sidecar: bool) -> Self {
        let unnamed = lines.iter().filter_map(|(_, reason)| *reason).collect();
        Self {
            frame: ResolvedFrame {
                lines: lines.into_iter().map(|(line, _)| line).collect(),
                module: None,
            },
            unnamed,
            from_sidecar,
        }
    }
}

/// What memory says a sampled code blob is.
#[derive(Clone, Copy, Debug)]
pub enum CodeNames<'a> {
    /// A stub, adapter or other non-nmethod blob, by `CodeBlob::_name`.
    Stub {
        name: &'a str,
    },
    Nmethod(NmethodNames<'a>),
}

/// An nmethod as memory describes it.
#[derive(Clone, Copy, Debug)]
pub struct NmethodNames<'a> {
    /// Its `Method*`.
    pub method: u64,
    pub comp_level: i32,
    /// Its methods (its own and every one its scopes name), read and verified by their identity
    /// when the nmethod was read.
    pub names: &'a HashMap<u64, MethodName>,
}

/// One line of a Java frame: the method, or a marker naming why there is none.
fn java_line(
    method: Result<&MethodInfo, UnnamedReason>,
    bci: Option<u32>,
    kind: JavaFrameKind,
    annotate: bool,
) -> (SourceLine, Option<UnnamedReason>) {
    let suffix = if annotate { kind.suffix() } else { "" };
    match method {
        Ok(method) => (
            SourceLine {
                function: format!("{}.{}{suffix}", method.class, method.name),
                system_name: Some(format!(
                    "{}.{}{}",
                    method.class, method.name, method.signature
                )),
                file: method.file.clone(),
                line: bci.map_or(0, |bci| method.line_of(bci)),
            },
            None,
        ),
        Err(reason) => (
            SourceLine {
                function: format!("{}{suffix}", Unnamed::Method.marker(reason)),
                system_name: None,
                file: None,
                line: 0,
            },
            Some(reason),
        ),
    }
}

/// An interpreted frame: `method` as memory read it for the sampled `Method*` and cookie.
pub fn interpreted(
    method: Result<&MethodInfo, UnnamedReason>,
    bci: Option<u32>,
    annotate: bool,
) -> Named {
    Named::from_lines(
        vec![java_line(method, bci, JavaFrameKind::Interpreted, annotate)],
        false,
    )
}

/// Where a compiled frame was sampled.
#[derive(Clone, Copy, Debug)]
pub struct CodePc {
    /// The pc's offset from the code start.
    pub offset: u32,
    /// The interrupted frame (its pc is not a return address).
    pub top: bool,
}

/// A compiled frame: `code` as memory read it, `recorded` the agent's record of the nmethod at
/// the same code start if there is one, `memory_chain` memory's (Method*, bci) chain at the pc,
/// innermost first (only asked for when the record is not used).
pub fn compiled(
    code: Result<CodeNames<'_>, UnnamedReason>,
    recorded: Option<&RecordedNmethod>,
    memory_chain: impl FnOnce() -> Vec<(u64, i32)>,
    pc: CodePc,
    annotate: bool,
) -> Named {
    let nmethod = match code {
        Err(reason) => return Named::unknown(Unnamed::Compiled, reason),
        Ok(CodeNames::Stub { name }) => {
            return Named {
                frame: ResolvedFrame::named(format!("[{name}]"), None),
                unnamed: Vec::new(),
                from_sidecar: false,
            }
        }
        Ok(CodeNames::Nmethod(nmethod)) => nmethod,
    };
    let kind = JavaFrameKind::of_level(nmethod.comp_level);
    let name_of = |method: u64| -> Result<&MethodInfo, UnnamedReason> {
        match nmethod.names.get(&method) {
            Some(Ok(info)) => Ok(info.as_ref()),
            Some(Err(reason)) => Err(*reason),
            // Every method a scope names is read with the nmethod: absent means not readable.
            None => Err(UnnamedReason::Unreadable),
        }
    };
    let root = name_of(nmethod.method);
    if let Some(named) = recorded
        .and_then(|recorded| from_record(recorded, nmethod.method, root.ok(), pc, kind, annotate))
    {
        return named;
    }
    let chain = memory_chain();
    let mut lines = Vec::with_capacity(chain.len().max(1));
    let outer = chain.len().saturating_sub(1);
    for (index, (method, bci)) in chain.iter().enumerate() {
        let frame_kind = if index == outer {
            kind
        } else {
            JavaFrameKind::Inlined
        };
        lines.push(java_line(
            name_of(*method),
            u32::try_from(*bci).ok(),
            frame_kind,
            annotate,
        ));
    }
    if lines.is_empty() {
        // No debug info at this pc (e.g. in the prologue): the method alone.
        lines.push(java_line(root, None, kind, annotate));
    }
    Named::from_lines(lines, false)
}

/// The frame from the agent's record, if it is this very nmethod and memory confirms it. Code
/// and metadata addresses are reused by same-shape classes of a later generation, and the
/// agent's unload record may not have been read yet: the record's compiled method must be the
/// one memory names for this nmethod (`root`, read when its first sample arrived).
fn from_record(
    recorded: &RecordedNmethod,
    method: u64,
    root: Option<&MethodInfo>,
    pc: CodePc,
    kind: JavaFrameKind,
    annotate: bool,
) -> Option<Named> {
    if recorded.method_ptr != method || pc.offset > recorded.code_size {
        return None;
    }
    if !recorded.root()?.same_method(root?) {
        return None;
    }
    let chain = recorded.chain(pc.offset, pc.top);
    let outer = chain.len().checked_sub(1)?;
    let lines = chain
        .iter()
        .enumerate()
        .map(|(index, (info, bci))| {
            let frame_kind = if index == outer {
                kind
            } else {
                JavaFrameKind::Inlined
            };
            java_line(Ok(info), u32::try_from(*bci).ok(), frame_kind, annotate)
        })
        .collect();
    Some(Named::from_lines(lines, true))
}
