//! Kernel addresses to function names, from /proc/kallsyms (through blazesym).

use std::sync::Arc;

use blazesym::symbolize::{source::Kernel, source::Source, Input, Symbolizer};
use blazesym::MaybeDefault;
use hashbrown::HashMap;

use super::{from_blazesym, ResolvedFrame};

/// Past this many cached addresses (or functions) the caches start over: about 3 MB of
/// addresses, and a whole-host run meets far fewer distinct kernel return addresses.
const MAX_CACHED: usize = 100_000;

pub struct KernelSymbolizer {
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
    pub fn new() -> Self {
        Self {
            symbolizer: Symbolizer::builder().enable_code_info(false).build(),
            cache: HashMap::new(),
            functions: HashMap::new(),
            module: Arc::from("[kernel]"),
        }
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
            // kallsyms is always there and is enough for names; searching for a vmlinux with
            // DWARF costs seconds and is rarely present on production hosts.
            let source = Source::Kernel(Kernel {
                vmlinux: MaybeDefault::None,
                debug_syms: false,
                ..Kernel::default()
            });
            match self.symbolizer.symbolize(&source, Input::AbsAddr(&missing)) {
                Ok(results) => {
                    for (addr, result) in missing.iter().zip(results.iter()) {
                        let frame =
                            from_blazesym(result, Some(self.module.clone()), || unknown(*addr));
                        let frame = shared(&mut self.functions, frame);
                        self.cache.insert(*addr, frame);
                    }
                }
                Err(err) => {
                    tracing::warn!(%err, "kernel symbolization failed");
                    for addr in &missing {
                        self.cache.insert(
                            *addr,
                            Arc::new(ResolvedFrame::named(
                                unknown(*addr),
                                Some(self.module.clone()),
                            )),
                        );
                    }
                }
            }
        }
        addrs.iter().map(|addr| self.cache[addr].clone()).collect()
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
            // The tests crate's `skip_allowed`, inlined: this crate cannot depend on it.
            let skip = std::env::var("PROFILER_TESTS_SKIP")
                .is_ok_and(|list| list.split(',').any(|item| item.trim() == "root"));
            assert!(
                skip,
                "kallsyms addresses are hidden (not root): run as root (cargo xtask test), or \
                 set PROFILER_TESTS_SKIP=root to skip this test instead of failing"
            );
            eprintln!("SKIPPED (PROFILER_TESTS_SKIP lists root): kallsyms addresses are hidden");
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
