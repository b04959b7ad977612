//! Kernel addresses to function names, for the daemon: a program never attached, run on demand
//! (`BPF_PROG_TEST_RUN`), that names each address of the query with the kernel's own symbol
//! lookup (`bpf_snprintf`'s `%ps`, Linux 5.13). The daemon thus keeps no copy of the kernel's
//! symbol table: reading /proc/kallsyms costs the kernel about 60 ms of formatting 120,000
//! lines, and holding it several megabytes, for the few thousand addresses a host's profiles
//! meet. Names are the kernel's at the time of asking, modules and BPF programs included.

use aya_ebpf::{
    helpers::generated as gen, macros::map, macros::raw_tracepoint, maps::Array,
    programs::RawTracePointContext,
};
use profiler_common::kernel_names::{KernelNameAnswer, KernelNameQuery, KERNEL_NAME_BYTES};

/// The addresses to name (one entry, written by the daemon before each run).
#[map]
static KERNEL_NAME_QUERY: Array<KernelNameQuery> = Array::with_max_entries(1, 0);

/// Their names (one entry, read by the daemon after each run).
#[map]
static KERNEL_NAME_ANSWER: Array<KernelNameAnswer> = Array::with_max_entries(1, 0);

/// `bpf_snprintf` takes its format from read-only map memory only: a global in `.rodata`.
#[no_mangle]
static KERNEL_NAME_FORMAT: [u8; 4] = *b"%ps\0";

/// Never attached (the section names no tracepoint): the daemon runs it with a query.
#[raw_tracepoint]
pub fn kernel_names(_ctx: RawTracePointContext) -> i32 {
    let (Some(query), Some(answer)) = (KERNEL_NAME_QUERY.get(0), KERNEL_NAME_ANSWER.get_ptr_mut(0))
    else {
        return 1;
    };
    // SAFETY: the one entry of an array map; the daemon runs this program from one thread.
    let answer = unsafe { &mut *answer };
    for (addr, name) in query.addrs.iter().zip(answer.names.iter_mut()) {
        if *addr == 0 {
            break;
        }
        let mut args = [*addr];
        // SAFETY: `name` is map memory of the size given, the format a NUL-terminated read-only
        // global and `args` one u64 on the stack, as the helper requires.
        unsafe {
            gen::bpf_snprintf(
                name.as_mut_ptr().cast(),
                KERNEL_NAME_BYTES as u32,
                KERNEL_NAME_FORMAT.as_ptr().cast(),
                args.as_mut_ptr(),
                core::mem::size_of_val(&args) as u32,
            );
        }
    }
    0
}
