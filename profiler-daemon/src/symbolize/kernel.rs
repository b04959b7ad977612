//! Kernel addresses to function names: asked of the kernel itself where it lets us
//! ([`KernelNameProgram`], Linux 5.13+), else from /proc/kallsyms (through blazesym), read once.

use std::sync::Arc;

use blazesym::symbolize::{source::Kernel, source::Source, Input, Symbolizer};
use blazesym::MaybeDefault;
use hashbrown::HashMap;

use super::{from_blazesym, ResolvedFrame};
use crate::sampler::kernel_names::KernelNameProgram;

/// Past this many cached addresses (or functions) the caches start over: about 3 MB of
/// addresses, and a whole-host run meets far fewer distinct kernel return addresses.
const MAX_CACHED: usize = 100_000;

pub struct KernelSymbolizer {
    /// The kernel's own symbol lookup, where it loaded: only the addresses met are named, and
    /// the symbol table stays in the kernel.
    program: Option<KernelNameProgram>,
    /// Over /proc/kallsyms, which it reads at its first use (only without `program`).
    symbolizer: Symbolizer,
    /// Address -> its function's frame.
    cache: HashMap<u64, Arc<ResolvedFrame>>,
    /// One frame per function, shared by all its addresses: kernel frames carry a name only
    /// (no lines), and a busy host's samples land on many return addresses per function.
    functions: HashMap<Box<str>, Arc<ResolvedFrame>>,
    module: Arc<str>,
}

impl Default for KernelSymbolizer {
    fn default() -> Self {
        Self::new()
    }
}

impl KernelSymbolizer {
    /// Names from /proc/kallsyms.
    pub fn new() -> Self {
        Self::with_program(None)
    }

    /// Names from the kernel's own lookup where `program` is given.
    pub fn with_program(program: Option<KernelNameProgram>) -> Self {
        Self {
            program,
            symbolizer: Symbolizer::builder().enable_code_info(false).build(),
            cache: HashMap::new(),
            functions: HashMap::new(),
            module: Arc::from("[kernel]"),
        }
    }

    /// The kernel's lookup, for a symbolizer built anew.
    pub fn take_program(&mut self) -> Option<KernelNameProgram> {
        self.program.take()
    }

    /// Resolves each address; unknown ones come back as `[kernel] 0x...` frames.
    pub fn resolve(&mut self, addrs: &[u64]) -> Vec<Arc<ResolvedFrame>> {
        if self.cache.len() > MAX_CACHED || self.functions.len() > MAX_CACHED {
            self.cache = HashMap::new();
            self.functions = HashMap::new();
        }
        let missing: Vec<u64> = addrs
            .iter()
            .copied()
            .filter(|a| !self.cache.contains_key(a))
            .collect();
        if !missing.is_empty() {
            let frames = self
                .named_by_kernel(&missing)
                .unwrap_or_else(|| self.named_from_kallsyms(&missing));
            for (addr, frame) in missing.iter().zip(frames) {
                let frame = shared(&mut self.functions, frame);
                self.cache.insert(*addr, frame);
            }
        }
        addrs.iter().map(|addr| self.cache[addr].clone()).collect()
    }

    /// `addrs` named by the kernel's lookup; `None` without it, or if it failed (then it is
    /// not used again: /proc/kallsyms from now on).
    fn named_by_kernel(&mut self, addrs: &[u64]) -> Option<Vec<ResolvedFrame>> {
        let names = match self.program.as_mut()?.names(addrs) {
            Ok(names) => names,
            Err(err) => {
                tracing::warn!(%err, "kernel_names program failed: kernel frames are named from /proc/kallsyms from now on");
                self.program = None;
                return None;
            }
        };
        Some(
            addrs
                .iter()
                .zip(names)
                .map(|(addr, name)| {
                    let function = name.map_or_else(|| unknown(*addr), |name| name.function);
                    ResolvedFrame::named(function, Some(self.module.clone()))
                })
                .collect(),
        )
    }

    /// `addrs` named from /proc/kallsyms.
    fn named_from_kallsyms(&mut self, addrs: &[u64]) -> Vec<ResolvedFrame> {
        // kallsyms is always there and is enough for names; searching for a vmlinux with
        // DWARF costs seconds and is rarely present on production hosts.
        let source = Source::Kernel(Kernel {
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        match self.symbolizer.symbolize(&source, Input::AbsAddr(addrs)) {
            Ok(results) => addrs
                .iter()
                .zip(results.iter())
                .map(|(addr, result)| {
                    from_blazesym(result, Some(self.module.clone()), || unknown(*addr))
                })
                .collect(),
            Err(err) => {
                tracing::warn!(%err, "kernel symbolization failed");
                addrs
                    .iter()
                    .map(|addr| ResolvedFrame::named(unknown(*addr), Some(self.module.clone())))
                    .collect()
            }
        }
    }
}

/// The one frame of `frame`'s function in `functions`.
fn shared(
    functions: &mut HashMap<Box<str>, Arc<ResolvedFrame>>,
    frame: ResolvedFrame,
) -> Arc<ResolvedFrame> {
    if let Some(known) = functions.get(frame.function()) {
        return known.clone();
    }
    let frame = Arc::new(frame);
    functions.insert(frame.function().into(), frame.clone());
    frame
}

fn unknown(addr: u64) -> String {
    format!("[kernel] {addr:#x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads the address of a well-known kernel function from kallsyms (needs root: others see
    /// zeros) and checks that it resolves to that name.
    #[test]
    fn resolves_a_kallsyms_address() {
        let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("/proc/kallsyms readable");
        let addr = kallsyms
            .lines()
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
                let _kind = fields.next()?;
                (fields.next()? == "do_sys_openat2").then_some(addr)
            })
            .expect("do_sys_openat2 in /proc/kallsyms (Linux 5.6 and later)");
        if addr == 0 {
            crate::test_skip::unless_skipped(
                "root",
                "kallsyms addresses are hidden (not root): run as root (cargo xtask test)",
            );
            return;
        }
        let mut symbolizer = KernelSymbolizer::new();
        let frames = symbolizer.resolve(&[addr + 4, addr + 8]);
        assert_eq!(frames[0].function(), "do_sys_openat2");
        // One frame for the function, however many of its addresses were sampled.
        assert!(Arc::ptr_eq(&frames[0], &frames[1]));
        let again = symbolizer.resolve(&[addr + 12]);
        assert!(Arc::ptr_eq(&frames[0], &again[0]));
    }
}
