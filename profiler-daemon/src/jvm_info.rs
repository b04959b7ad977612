//! The `jvm-info PID` command: what the daemon sees of one JVM (version, layout, code heaps),
//! for users checking why a JVM's frames look the way they do.

use serde::Serialize;

use crate::hotspot::jvm::{CodeCacheInfo, Jvm, JvmError};
use crate::hotspot::libjvm::LibJvmError;
use crate::hotspot::remote::ProcessMemory;
use crate::hotspot::virtual_threads::{self, VirtualThreadLayout, FIRST_VIRTUAL_THREADS_JDK};
use crate::process::ProcessInfo;

#[derive(Debug, thiserror::Error)]
pub enum JvmInfoError {
    #[error("no process with pid {0}")]
    NoProcess(u32),
    #[error("cannot read process {pid}: permission denied (run as root, or with CAP_SYS_PTRACE and CAP_DAC_READ_SEARCH)")]
    PermissionDenied { pid: u32 },
    #[error("process {pid} ({comm}) does not map libjvm.so: not a HotSpot JVM")]
    NotAJvm { pid: u32, comm: String },
    #[error("process {pid}: {source}")]
    Jvm { pid: u32, source: JvmError },
}

#[derive(Debug, Serialize)]
pub struct JvmReport {
    #[serde(flatten)]
    pub jvm: Jvm,
    pub comm: String,
    /// None while the VM is still starting (see `not_ready`).
    pub code_cache: Option<CodeCacheInfo>,
    pub not_ready: Option<String>,
    /// JDK 21 and later: what is known of its virtual threads' layout, or why it is unknown.
    pub virtual_threads: Option<Result<VirtualThreadLayout, String>>,
}

pub fn inspect(pid: u32) -> Result<JvmReport, JvmInfoError> {
    let process = ProcessInfo::read(pid).map_err(|err| match err {
        procfs::ProcError::PermissionDenied(_) => JvmInfoError::PermissionDenied { pid },
        _ => JvmInfoError::NoProcess(pid),
    })?;
    let memory = ProcessMemory::new(pid);
    let jvm = Jvm::inspect(&process, &memory).map_err(|err| match err {
        JvmError::LibJvm(LibJvmError::NotAJvm) => JvmInfoError::NotAJvm {
            pid,
            comm: process.comm.clone(),
        },
        err if err.is_permission_denied() => JvmInfoError::PermissionDenied { pid },
        // It exited while being read.
        _ if !std::path::Path::new(&format!("/proc/{pid}")).exists() => {
            JvmInfoError::NoProcess(pid)
        }
        source => JvmInfoError::Jvm { pid, source },
    })?;
    let (code_cache, not_ready) = match jvm.code_cache(&memory) {
        Ok(code) => (Some(code), None),
        Err(err) => (None, Some(err.to_string())),
    };
    let virtual_threads = (jvm.version.major >= FIRST_VIRTUAL_THREADS_JDK)
        .then(|| virtual_threads::layout_of(&jvm, &memory));
    Ok(JvmReport {
        jvm,
        comm: process.comm,
        code_cache,
        not_ready,
        virtual_threads,
    })
}

/// The human-readable form.
pub fn render_text(report: &JvmReport) -> String {
    use std::fmt::Write;
    let jvm = &report.jvm;
    let mut out = String::new();
    let _ = writeln!(out, "pid {} ({})", jvm.pid, report.comm);
    let _ = writeln!(
        out,
        "JVM        {} (major {})",
        jvm.version.release, jvm.version.major
    );
    let _ = writeln!(
        out,
        "libjvm     {} (build-id {})",
        jvm.libjvm_path,
        jvm.build_id.as_deref().unwrap_or("none")
    );
    let _ = writeln!(out, "load bias  {:#x}", jvm.bias);
    match &report.code_cache {
        Some(code) => {
            let _ = writeln!(
                out,
                "code cache [{:#x}, {:#x})",
                code.low_bound, code.high_bound
            );
            for heap in &code.heaps {
                let _ = writeln!(
                    out,
                    "  heap     [{:#x}, {:#x}) committed to {:#x}, segmap {:#x}, segment {} bytes",
                    heap.low,
                    heap.high,
                    heap.committed_high,
                    heap.segmap,
                    1u64 << heap.log2_segment_size
                );
            }
            let _ = writeln!(
                out,
                "interpreter [{:#x}, {:#x})",
                code.interpreter_low, code.interpreter_high
            );
            let _ = writeln!(
                out,
                "call stub return address {:#x}",
                code.call_stub_return_address
            );
        }
        None => {
            let _ = writeln!(
                out,
                "code cache not ready: {}",
                report.not_ready.as_deref().unwrap_or("?")
            );
        }
    }
    let _ = writeln!(
        out,
        "frames     interpreter Method* at fp{:+} words, bcp at fp{:+} words; UNSIGNED5 excludes zero: {}",
        jvm.facts.interpreter_method_slot, jvm.facts.interpreter_bcp_slot, jvm.facts.unsigned5_excludes_zero
    );
    match &report.virtual_threads {
        Some(Ok(vt)) => {
            let int = |value: Option<i32>| value.map_or("?".to_owned(), |v| v.to_string());
            let chunk = &vt.stack_chunk;
            let _ = writeln!(
                out,
                "virtual threads: StackChunk parent +{} size +{} sp +{} bottom +{} pc +{} flags +{} cont +{}, frames from +{}; Continuation.tail +{}; Thread.tid +{}; JavaThread::_cont_entry {}; return barrier {}",
                int(chunk.parent), int(chunk.size), int(chunk.sp), int(chunk.bottom), int(chunk.pc),
                int(chunk.flags), int(chunk.cont), int(chunk.stack), int(vt.continuation_tail),
                int(vt.thread_tid),
                vt.cont_entry.map_or("unknown".to_owned(), |o| format!("+{o}")),
                vt.return_barrier.map_or("?".to_owned(), |pc| format!("{pc:#x}")),
            );
        }
        Some(Err(why)) => {
            let _ = writeln!(out, "virtual threads: layout unknown: {why}");
        }
        None => {}
    }
    let _ = writeln!(out, "fields:");
    for (key, field) in &jvm.layout.fields {
        let kind = if field.is_static {
            "static +"
        } else {
            "offset"
        };
        let alias = if field.name != *key {
            format!(" (as {})", field.name)
        } else {
            String::new()
        };
        let _ = writeln!(out, "  {key:<45} {kind} {:#x}{alias}", field.offset);
    }
    let _ = writeln!(out, "sizes:");
    for (key, size) in &jvm.layout.sizes {
        let _ = writeln!(out, "  {key:<45} {size}");
    }
    let _ = writeln!(out, "constants:");
    for (key, value) in &jvm.layout.constants {
        let _ = writeln!(out, "  {key:<45} {value}");
    }
    out
}
