//! Kernel addresses named by the kernel itself: the `kernel_names` program
//! (`profiler-ebpf/src/kernel_names.rs`), never attached, run on demand with a batch of
//! addresses. Where the kernel lacks `bpf_snprintf` (before 5.13) the daemon reads
//! /proc/kallsyms instead (`symbolize::kernel`).

use std::os::fd::{AsFd as _, AsRawFd as _, OwnedFd};

use aya::maps::{Array, MapData};
use aya::programs::RawTracePoint;
use aya::Ebpf;
use profiler_common::kernel_names::{
    KernelNameAnswer, KernelNameQuery, KERNEL_NAMES_PER_RUN, KERNEL_NAME_BYTES,
};

use super::{take_map, SamplerError};

/// The program's name in the object.
pub const PROGRAM: &str = "kernel_names";

/// A kernel function's name, and its module's if it is in one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KernelName {
    pub function: String,
    pub module: Option<String>,
}

/// The loaded program and its two maps, independent of the object they came from.
pub struct KernelNameProgram {
    program: OwnedFd,
    query: Array<MapData, KernelNameQuery>,
    answer: Array<MapData, KernelNameAnswer>,
}

impl KernelNameProgram {
    /// Loads the program of `ebpf` and takes its maps.
    pub(super) fn load(ebpf: &mut Ebpf) -> Result<Self, SamplerError> {
        let program: &mut RawTracePoint = ebpf
            .program_mut(PROGRAM)
            .ok_or(SamplerError::MissingProgram(PROGRAM))?
            .try_into()
            .map_err(|source| SamplerError::Program {
                name: PROGRAM,
                source,
            })?;
        program.load().map_err(|source| SamplerError::Program {
            name: PROGRAM,
            source,
        })?;
        let program = program
            .fd()
            .map_err(|source| SamplerError::Program {
                name: PROGRAM,
                source,
            })?
            .as_fd()
            .try_clone_to_owned()
            .map_err(|source| SamplerError::Descriptor {
                name: PROGRAM,
                source,
            })?;
        Ok(Self {
            program,
            query: take_map(ebpf, "KERNEL_NAME_QUERY")?,
            answer: take_map(ebpf, "KERNEL_NAME_ANSWER")?,
        })
    }

    /// The name of each of `addrs`, in order: `None` for an address in no symbol the kernel
    /// knows (now: a module unloaded since is unknown).
    pub fn names(&mut self, addrs: &[u64]) -> std::io::Result<Vec<Option<KernelName>>> {
        let mut names = Vec::with_capacity(addrs.len());
        for batch in addrs.chunks(KERNEL_NAMES_PER_RUN) {
            let mut query = KernelNameQuery {
                addrs: [0; KERNEL_NAMES_PER_RUN],
            };
            query.addrs[..batch.len()].copy_from_slice(batch);
            // An address of 0 ends the query: it has no name anyway.
            self.query.set(0, query, 0).map_err(map_io_error)?;
            run_once(&self.program)?;
            let answer = self.answer.get(&0, 0).map_err(map_io_error)?;
            for (addr, text) in batch.iter().zip(&answer.names) {
                names.push((*addr != 0).then(|| parse(text)).flatten());
            }
        }
        Ok(names)
    }
}

fn map_io_error(err: aya::maps::MapError) -> std::io::Error {
    std::io::Error::other(err)
}

/// `%ps`'s text: `function`, `function [module]`, or `0x...` for no symbol.
fn parse(text: &[u8; KERNEL_NAME_BYTES]) -> Option<KernelName> {
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    let text = std::str::from_utf8(&text[..end]).ok()?;
    if text.is_empty() || text.starts_with("0x") {
        return None;
    }
    let (function, module) = match text.split_once(" [") {
        Some((function, rest)) => (function, rest.strip_suffix(']')),
        None => (text, None),
    };
    Some(KernelName {
        function: function.to_owned(),
        module: module.map(str::to_owned),
    })
}

/// `BPF_PROG_TEST_RUN`'s attributes for a raw tracepoint program (uapi `union bpf_attr`'s
/// `test` member): no data, no context.
#[repr(C)]
#[derive(Default)]
struct TestRun {
    prog_fd: u32,
    retval: u32,
    data_size_in: u32,
    data_size_out: u32,
    data_in: u64,
    data_out: u64,
    repeat: u32,
    duration: u32,
    ctx_size_in: u32,
    ctx_size_out: u32,
    ctx_in: u64,
    ctx_out: u64,
    flags: u32,
    cpu: u32,
}

const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// Runs the program once, on this CPU.
fn run_once(program: &OwnedFd) -> std::io::Result<()> {
    let mut attr = TestRun {
        prog_fd: program.as_raw_fd() as u32,
        ..TestRun::default()
    };
    // SAFETY: `attr` is the command's attribute struct, alive for the call; the kernel reads
    // no pointer from it (no data, no context).
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &mut attr as *mut TestRun,
            std::mem::size_of::<TestRun>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if attr.retval != 0 {
        return Err(std::io::Error::other(
            "the kernel_names program found no query or answer map",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(s: &str) -> [u8; KERNEL_NAME_BYTES] {
        let mut out = [0u8; KERNEL_NAME_BYTES];
        out[..s.len()].copy_from_slice(s.as_bytes());
        out
    }

    #[test]
    fn percent_ps_texts_parse_to_functions_and_modules() {
        assert_eq!(
            parse(&text("do_sys_openat2")),
            Some(KernelName {
                function: "do_sys_openat2".into(),
                module: None
            })
        );
        assert_eq!(
            parse(&text("nf_conntrack_in [nf_conntrack]")),
            Some(KernelName {
                function: "nf_conntrack_in".into(),
                module: Some("nf_conntrack".into())
            })
        );
        assert_eq!(parse(&text("0xffffffffc0001234")), None);
        assert_eq!(parse(&text("")), None);
    }

    /// A function symbol of /proc/kallsyms: its address and every name given it there (aliases
    /// share an address).
    struct KallsymsFunction {
        addr: u64,
        names: Vec<String>,
        /// Whether kallsyms puts it in a module.
        in_module: bool,
    }

    /// Per address: whether a name there is a function's, its names, whether in a module.
    type ByAddress = std::collections::BTreeMap<u64, (bool, Vec<String>, bool)>;

    /// Function symbols of /proc/kallsyms at least 2 bytes below the next symbol.
    fn kallsyms_functions() -> Vec<KallsymsFunction> {
        let text = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms readable");
        let mut by_addr = ByAddress::new();
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(addr), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            let Ok(addr) = u64::from_str_radix(addr, 16) else {
                continue;
            };
            let entry = by_addr.entry(addr).or_default();
            entry.0 |= matches!(kind, "t" | "T");
            entry.1.push(name.to_owned());
            entry.2 |= fields.next().is_some();
        }
        let addrs: Vec<u64> = by_addr.keys().copied().collect();
        addrs
            .windows(2)
            .filter_map(|pair| {
                let (is_function, names, in_module) = by_addr[&pair[0]].clone();
                (is_function && pair[0] != 0 && pair[1] > pair[0] + 1).then_some(KallsymsFunction {
                    addr: pair[0],
                    names,
                    in_module,
                })
            })
            .collect()
    }

    /// The program names addresses inside kernel functions (core and modules) as /proc/kallsyms
    /// does, in both objects, and an address in no symbol as none. Needs root.
    #[test]
    fn the_kernel_names_its_functions_as_kallsyms_does() {
        let functions = kallsyms_functions();
        if functions.is_empty() {
            crate::test_skip::unless_skipped(
                "root",
                "kallsyms addresses are hidden (not root): run as root (cargo xtask test)",
            );
            return;
        }
        // 1,000 functions spread over the table (modules' are at its end), each asked at an
        // address inside it.
        let step = (functions.len() / 1000).max(1);
        let picked: Vec<&KallsymsFunction> = functions.iter().step_by(step).collect();
        let in_modules = picked.iter().filter(|f| f.in_module).count();
        let mut addrs: Vec<u64> = picked.iter().map(|f| f.addr + 1).collect();
        // User space: no kernel symbol.
        addrs.push(0x40_0000);
        for object in [
            crate::kernel_features::BpfObject::Default,
            crate::kernel_features::BpfObject::Compat,
        ] {
            let mut ebpf = super::super::load_for_check(object).expect("the object's maps");
            let mut program = KernelNameProgram::load(&mut ebpf).expect("the kernel_names program");
            let started = std::time::Instant::now();
            let names = program.names(&addrs).expect("a run");
            eprintln!(
                "{object:?}: {} addresses named in {:?} ({in_modules} functions in modules)",
                addrs.len(),
                started.elapsed()
            );
            assert_eq!(names.len(), addrs.len());
            assert_eq!(
                names.last(),
                Some(&None),
                "{object:?}: a user address named"
            );
            let mut wrong = Vec::new();
            for (function, name) in picked.iter().zip(&names) {
                // Functions only: kallsyms puts BPF programs and trampolines in pseudo
                // modules (`[bpf]`, `[__builtin__ftrace]`) that `%ps` does not name.
                let matches = name
                    .as_ref()
                    .is_some_and(|name| function.names.contains(&name.function));
                if !matches {
                    wrong.push(format!(
                        "{:#x}: {:?} against {:?}",
                        function.addr, name, function.names
                    ));
                }
            }
            // A symbol may be replaced between the two reads (a module or BPF program
            // loaded or unloaded meanwhile): a few may differ, not more.
            assert!(
                wrong.len() <= 2,
                "{object:?}: {} of {} named unlike /proc/kallsyms ({in_modules} in modules):\n{}",
                wrong.len(),
                picked.len(),
                wrong.join("\n")
            );
        }
    }
}
