//! The naming policy: which source names a Java frame, and what is shown when none can.
//!
//! - Interpreted frames: the method memory read for the sampled `Method*` and cookie.
//! - Compiled frames: a stub by its blob name; an nmethod from the agent's record when it is this
//!   very nmethod (same `Method*`, pc inside its code), the record's compiled method is the
//!   one memory names for this nmethod, and its scope chain at the pc is memory's (same methods
//!   and bcis: another compilation of the same method at a reused address inlines differently);
//!   else from memory's scope chain, each method named as it
//!   was read with the nmethod. A record that disagrees with memory, or that memory cannot
//!   confirm, is never used: the memory names are, or a marker.
//! - Every miss is a marker line naming its [`UnnamedReason`], reported in [`Named::unnamed`].

use std::collections::HashMap;
use std::sync::Arc;

use super::method::MethodInfo;
use super::reason::{Unnamed, UnnamedReason};
use super::recorded::RecordedNmethod;
use crate::frame_kind::FrameKind;
use crate::resolved_frame::{ResolvedFrame, SourceLine};

/// A method's names, or why there are none.
pub type MethodName = Result<Arc<MethodInfo>, UnnamedReason>;

/// A named (or marked) Java frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Named {
    pub frame: ResolvedFrame,
    /// How the frame ran: a compiled frame's lines other than its outermost are inlined.
    pub kind: FrameKind,
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
            kind: FrameKind::Jvm,
            unnamed: vec![reason],
            from_sidecar: false,
        }
    }

    fn from_lines(
        kind: FrameKind,
        lines: Vec<(SourceLine, Option<UnnamedReason>)>,
        from_sidecar: bool,
    ) -> Self {
        let unnamed = lines.iter().filter_map(|(_, reason)| *reason).collect();
        Self {
            frame: ResolvedFrame {
                lines: lines.into_iter().map(|(line, _)| line).collect(),
                module: None,
                build_id: None,
            },
            kind,
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
) -> (SourceLine, Option<UnnamedReason>) {
    match method {
        Ok(method) => (
            SourceLine {
                function: method.function_name().to_owned(),
                system_name: Some(method.name_with_signature().to_owned()),
                file: method.file.clone(),
                line: bci.map_or(0, |bci| method.line_of(bci)),
            },
            None,
        ),
        Err(reason) => (
            SourceLine {
                function: Unnamed::Method.marker(reason),
                system_name: None,
                file: None,
                line: 0,
            },
            Some(reason),
        ),
    }
}

/// The class of an allocated object, by its internal name as memory read it.
pub fn allocated_class(internal_name: Result<&str, UnnamedReason>) -> Named {
    match internal_name {
        Ok(internal) => Named {
            frame: ResolvedFrame::named(super::method::java_type_name(internal), None),
            kind: FrameKind::Jvm,
            unnamed: Vec::new(),
            from_sidecar: false,
        },
        Err(reason) => Named::unknown(Unnamed::AllocatedClass, reason),
    }
}

/// An interpreted frame: `method` as memory read it for the sampled `Method*` and cookie.
pub fn interpreted(method: Result<&MethodInfo, UnnamedReason>, bci: Option<u32>) -> Named {
    Named::from_lines(FrameKind::Interpreted, vec![java_line(method, bci)], false)
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
) -> Named {
    let nmethod = match code {
        Err(reason) => return Named::unknown(Unnamed::Compiled, reason),
        // A stub is named by what its blob says, never by nothing (`[]`).
        Ok(CodeNames::Stub { name: "" }) => {
            return Named::unknown(Unnamed::Compiled, UnnamedReason::BadName)
        }
        Ok(CodeNames::Stub { name }) => {
            return Named {
                frame: ResolvedFrame::named(format!("[{name}]"), None),
                kind: FrameKind::Jvm,
                unnamed: Vec::new(),
                from_sidecar: false,
            }
        }
        Ok(CodeNames::Nmethod(nmethod)) => nmethod,
    };
    let kind = FrameKind::of_level(nmethod.comp_level);
    let name_of = |method: u64| -> Result<&MethodInfo, UnnamedReason> {
        match nmethod.names.get(&method) {
            Some(Ok(info)) => Ok(info.as_ref()),
            Some(Err(reason)) => Err(*reason),
            // Every method a scope names is read with the nmethod: absent means not readable.
            None => Err(UnnamedReason::Unreadable),
        }
    };
    let root = name_of(nmethod.method);
    let chain = memory_chain();
    if let Some(named) = recorded.and_then(|recorded| {
        from_record(
            recorded,
            nmethod.method,
            root.ok(),
            (&chain, &name_of),
            pc,
            kind,
        )
    }) {
        return named;
    }
    let mut lines: Vec<_> = chain
        .iter()
        .map(|(method, bci)| java_line(name_of(*method), u32::try_from(*bci).ok()))
        .collect();
    if lines.is_empty() {
        // No debug info at this pc (e.g. in the prologue): the method alone.
        lines.push(java_line(root, None));
    }
    Named::from_lines(kind, lines, false)
}

/// Memory's scope chain at the pc, innermost first, and its names of the nmethod's methods.
type MemoryChain<'a, 'n> = (
    &'a [(u64, i32)],
    &'a dyn Fn(u64) -> Result<&'n MethodInfo, UnnamedReason>,
);

/// The frame from the agent's record, if it is this very nmethod and memory confirms it. Code
/// and metadata addresses are reused by same-shape classes of a later generation, the same
/// method is recompiled at a freed address, and the agent's unload record may not have been
/// read yet: the record's compiled method must be the one memory names for this nmethod
/// (`root`, read when its first sample arrived), and its scope chain at the pc must be memory's
/// (same methods, same bcis). So a record can never contradict memory; what it adds is the
/// agent's view of names and lines.
fn from_record(
    recorded: &RecordedNmethod,
    method: u64,
    root: Option<&MethodInfo>,
    (memory_chain, memory_name): MemoryChain<'_, '_>,
    pc: CodePc,
    kind: FrameKind,
) -> Option<Named> {
    if recorded.method_ptr != method || pc.offset > recorded.code_size {
        return None;
    }
    if !recorded.root()?.same_method(root?) {
        return None;
    }
    let chain = recorded.chain(pc.offset, pc.top);
    let agrees = chain.len() == memory_chain.len()
        && chain
            .iter()
            .zip(memory_chain)
            .all(|((info, bci), (memory_method, memory_bci))| {
                bci == memory_bci
                    && memory_name(*memory_method).is_ok_and(|named| named.same_method(info))
            });
    if !agrees {
        return None;
    }
    if chain.is_empty() {
        return None;
    }
    let lines = chain
        .iter()
        .map(|(info, bci)| java_line(Ok(info), u32::try_from(*bci).ok()))
        .collect();
    Some(Named::from_lines(kind, lines, true))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::java_names::reason::UnnamedCounts;

    const ROOT: u64 = 0x1000;
    const INLINED: u64 = 0x2000;

    fn method(class: &str, name: &str) -> Arc<MethodInfo> {
        Arc::new(MethodInfo::from_internal(
            class,
            name.into(),
            "()J".into(),
            Some("Gen.java"),
            vec![(0, 10), (5, 11)],
        ))
    }

    /// Memory's names of an nmethod of `ROOT` with `INLINED` inlined.
    fn memory_names(root: MethodName, inlined: MethodName) -> HashMap<u64, MethodName> {
        HashMap::from([(ROOT, root), (INLINED, inlined)])
    }

    fn nmethod(names: &HashMap<u64, MethodName>) -> Result<CodeNames<'_>, UnnamedReason> {
        Ok(CodeNames::Nmethod(NmethodNames {
            method: ROOT,
            comp_level: 4,
            names,
        }))
    }

    /// The agent's record of the nmethod of `ROOT`: `root` inlining `inlined` at pc 0x10.
    fn record(root: Arc<MethodInfo>, inlined: Arc<MethodInfo>) -> RecordedNmethod {
        RecordedNmethod {
            method_ptr: ROOT,
            code_size: 0x40,
            methods: vec![root, inlined],
            pcs: vec![(0x10, vec![(1, 2), (0, 5)]), (0x30, vec![(0, 6)])],
        }
    }

    fn memory_chain() -> Vec<(u64, i32)> {
        vec![(INLINED, 2), (ROOT, 5)]
    }

    /// The frame of the nmethod `names` describe, sampled at the call at 0x10, with `recorded`.
    fn at_call(names: &HashMap<u64, MethodName>, recorded: &RecordedNmethod) -> Named {
        compiled(nmethod(names), Some(recorded), memory_chain, AT_CALL)
    }

    const AT_CALL: CodePc = CodePc {
        offset: 0x10,
        top: false,
    };

    /// The frame's functions as an annotated profile shows them: with their kind's suffix.
    fn functions(named: &Named) -> Vec<String> {
        let lines = named.frame.lines.len();
        named
            .frame
            .lines
            .iter()
            .enumerate()
            .map(|(at, line)| {
                format!(
                    "{}{}",
                    line.function,
                    named.kind.of_line(at, lines).suffix()
                )
            })
            .collect()
    }

    #[test]
    fn a_record_memory_confirms_names_the_frame() {
        let names = memory_names(Ok(method("G1", "outer")), Ok(method("G1", "inner")));
        let recorded = record(method("G1", "outer"), method("G1", "inner"));
        let named = at_call(&names, &recorded);
        assert!(named.from_sidecar);
        assert_eq!(functions(&named), ["G1.inner_[i]", "G1.outer_[j]"]);
        assert_eq!(named.frame.lines[1].line, 11);
        assert!(named.unnamed.is_empty());
        // The interrupted pc at 0x10 is in the region the record at 0x30 ends.
        let top = compiled(
            nmethod(&names),
            Some(&recorded),
            Vec::new,
            CodePc {
                offset: 0x10,
                top: true,
            },
        );
        assert_eq!(functions(&top), ["G1.outer_[j]"]);
    }

    #[test]
    fn a_record_of_another_compilation_of_the_same_method_is_never_used() {
        // The same method recompiled at a freed address: the root agrees, the inlining at the
        // pc does not (another inlined method, or the same at another bci).
        let names = memory_names(Ok(method("G1", "outer")), Ok(method("G1", "inner")));
        let recorded = record(method("G1", "outer"), method("G1", "other_inner"));
        let named = at_call(&names, &recorded);
        assert!(!named.from_sidecar);
        assert_eq!(functions(&named), ["G1.inner_[i]", "G1.outer_[j]"]);
        let recorded = record(method("G1", "outer"), method("G1", "inner"));
        let shifted = || vec![(INLINED, 3), (ROOT, 5)];
        let named = compiled(nmethod(&names), Some(&recorded), shifted, AT_CALL);
        assert!(!named.from_sidecar);
    }

    #[test]
    fn a_record_memory_contradicts_is_never_used() {
        // The code and Method* were reused by the next generation of a same-shape class: the
        // record (not yet unloaded) names G1, memory G2.
        let names = memory_names(Ok(method("G2", "outer")), Ok(method("G2", "inner")));
        let recorded = record(method("G1", "outer"), method("G1", "inner"));
        let named = at_call(&names, &recorded);
        assert!(!named.from_sidecar);
        assert_eq!(functions(&named), ["G2.inner_[i]", "G2.outer_[j]"]);

        // A different signature is a different method too.
        let other = MethodInfo::from_internal(
            "G2",
            "outer".into(),
            "()V".into(),
            Some("Gen.java"),
            vec![(0, 10), (5, 11)],
        );
        let recorded = record(Arc::new(other), method("G2", "inner"));
        let named = at_call(&names, &recorded);
        assert!(!named.from_sidecar);
    }

    #[test]
    fn a_record_memory_cannot_confirm_leaves_markers_not_its_names() {
        // Memory could not read the nmethod's methods: the record is not checked, so not used.
        let names = memory_names(
            Err(UnnamedReason::Unreadable),
            Err(UnnamedReason::Unreadable),
        );
        let recorded = record(method("G1", "outer"), method("G1", "inner"));
        let named = at_call(&names, &recorded);
        assert!(!named.from_sidecar);
        assert_eq!(
            functions(&named),
            [
                "[unknown java method: unreadable]_[i]",
                "[unknown java method: unreadable]_[j]"
            ]
        );
        assert_eq!(
            named.unnamed,
            [UnnamedReason::Unreadable, UnnamedReason::Unreadable]
        );
        assert!(named.frame.lines.iter().all(|line| line.file.is_none()));
    }

    #[test]
    fn a_record_of_other_code_is_not_used() {
        let names = memory_names(Ok(method("G1", "outer")), Ok(method("G1", "inner")));
        // Another Method* at the same code start.
        let mut recorded = record(method("G1", "outer"), method("G1", "agent_inner"));
        recorded.method_ptr = 0x9999;
        let named = at_call(&names, &recorded);
        assert_eq!(functions(&named), ["G1.inner_[i]", "G1.outer_[j]"]);
        // A pc past the recorded code.
        recorded.method_ptr = ROOT;
        let past = CodePc {
            offset: 0x41,
            top: false,
        };
        let named = compiled(nmethod(&names), Some(&recorded), memory_chain, past);
        assert!(!named.from_sidecar);
        // No record at the pc (past the last one): memory's chain.
        let last = CodePc {
            offset: 0x30,
            top: true,
        };
        let named = compiled(nmethod(&names), Some(&recorded), memory_chain, last);
        assert!(!named.from_sidecar);
    }

    #[test]
    fn without_debug_info_at_the_pc_the_method_alone_is_shown() {
        let names = memory_names(Ok(method("G1", "outer")), Ok(method("G1", "inner")));
        let named = compiled(nmethod(&names), None, Vec::new, AT_CALL);
        assert_eq!(functions(&named), ["G1.outer_[j]"]);
        assert_eq!(named.frame.lines[0].line, 0);
        let c1 = HashMap::from([(ROOT, Ok(method("G1", "outer")))]);
        let named = compiled(
            Ok(CodeNames::Nmethod(NmethodNames {
                method: ROOT,
                comp_level: 3,
                names: &c1,
            })),
            None,
            memory_chain,
            AT_CALL,
        );
        // A scope method missing from the names read with the nmethod is not guessed.
        assert_eq!(
            functions(&named),
            ["[unknown java method: unreadable]_[i]", "G1.outer_[1]"]
        );
    }

    #[test]
    fn stubs_are_named_by_their_blob_and_misses_by_their_reason() {
        let stub = compiled(
            Ok(CodeNames::Stub {
                name: "vtable chunks",
            }),
            None,
            Vec::new,
            AT_CALL,
        );
        assert_eq!(functions(&stub), ["[vtable chunks]"]);
        assert!(stub.unnamed.is_empty());
        // Never `[]`: a stub without a name is a miss with its reason.
        let nameless = compiled(Ok(CodeNames::Stub { name: "" }), None, Vec::new, AT_CALL);
        assert_eq!(functions(&nameless), ["[unknown compiled frame: bad_name]"]);
        assert_eq!(nameless.unnamed, [UnnamedReason::BadName]);
        let reused = compiled(Err(UnnamedReason::CodeReused), None, Vec::new, AT_CALL);
        assert_eq!(
            functions(&reused),
            ["[unknown compiled frame: code_reused]"]
        );
        let interpreted_miss = interpreted(Err(UnnamedReason::MethodReused), Some(3));
        assert_eq!(
            functions(&interpreted_miss),
            ["[unknown java method: method_reused]_[0]"]
        );
        let method = method("A", "m");
        let named = interpreted(Ok(&method), Some(7));
        assert_eq!(functions(&named), ["A.m_[0]"]);
        assert_eq!(named.frame.lines[0].line, 11);
        assert_eq!(named.frame.lines[0].system_name.as_deref(), Some("A.m()J"));
    }

    #[test]
    fn every_reason_increments_its_own_counter() {
        let counts = UnnamedCounts::default();
        for reason in UnnamedReason::ALL {
            let before: Vec<u64> = UnnamedReason::ALL.iter().map(|r| counts.get(*r)).collect();
            // Each way a miss reaches a profile: a whole frame, a compiled frame, a method.
            let frame = Named::unknown(Unnamed::Frame, reason);
            let code = compiled(Err(reason), None, Vec::new, AT_CALL);
            let method = interpreted(Err(reason), None);
            for named in [&frame, &code, &method] {
                assert_eq!(named.unnamed, [reason]);
                assert!(functions(named)[0].contains(reason.name()));
                counts.add_all(&named.unnamed);
            }
            for (other, was) in UnnamedReason::ALL.iter().zip(before) {
                let expected = if *other == reason { was + 3 } else { was };
                assert_eq!(
                    counts.get(*other),
                    expected,
                    "{reason:?} counted as {other:?}"
                );
            }
        }
    }
}
