//! Turns sampled addresses into function names, files and lines.
//!
//! One module per frame source: [`native`] (ELF files, through blazesym), [`kernel`]
//! (kallsyms) and [`java`] (HotSpot frames, named by [`crate::java_names`]). They return
//! [`ResolvedFrame`]s and cache them per binary or per JVM, not per sample. An address that
//! cannot be named still yields a frame (`module+0xoffset`, `[unknown]`, or a Java marker naming
//! the reason): frames never disappear from a stack. Every user frame's names pass
//! [`name_guard`] on their way into a profile. [`java_reader`] reads Java frames' methods and
//! code ahead, on a thread of its own, into the caches [`java`] names from.

pub mod cache_budget;
pub mod elf_facts;
pub mod java;
pub mod java_reader;
pub mod kernel;
pub mod name_guard;
pub mod native;
pub mod symbolizers;

pub use crate::resolved_frame::{ResolvedFrame, SourceLine};

use std::sync::Arc;

/// Converts one blazesym result into our frame. `fallback` names what could not be resolved.
fn from_blazesym(
    symbolized: &blazesym::symbolize::Symbolized<'_>,
    module: Option<Arc<str>>,
    fallback: impl FnOnce() -> String,
) -> ResolvedFrame {
    use blazesym::symbolize::{CodeInfo, Symbolized};

    fn file_of(info: &CodeInfo<'_>) -> String {
        match &info.dir {
            Some(dir) if !dir.as_os_str().is_empty() => {
                dir.join(&*info.file).to_string_lossy().into_owned()
            }
            _ => info.file.to_string_lossy().into_owned(),
        }
    }

    match symbolized {
        Symbolized::Sym(sym) => {
            // blazesym lists inlined calls outermost first, each with the location inside that
            // function; the symbol's own location is the call site in the outer function.
            let mut lines: Vec<SourceLine> = sym
                .inlined
                .iter()
                .rev()
                .map(|inlined| SourceLine {
                    function: inlined.name.to_string(),
                    system_name: None,
                    file: inlined.code_info.as_ref().map(file_of),
                    line: inlined.code_info.as_ref().and_then(|i| i.line).unwrap_or(0),
                })
                .collect();
            lines.push(SourceLine {
                function: sym.name.to_string(),
                system_name: None,
                file: sym.code_info.as_deref().map(file_of),
                line: sym.code_info.as_ref().and_then(|i| i.line).unwrap_or(0),
            });
            ResolvedFrame {
                lines,
                module,
                build_id: None,
            }
        }
        Symbolized::Unknown(_) => ResolvedFrame::named(fallback(), module),
    }
}
