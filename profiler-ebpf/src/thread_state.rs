//! The off-CPU programs' state of each thread (`OffCpuThread`), found from the thread's
//! `task_struct` (the scheduler tracepoints hand one over for the thread switched in or woken)
//! or from the current thread.
//!
//! Where the kernel has task storage (5.11+), the state lives there: the kernel keeps it with the
//! thread and frees it with the thread, so nothing leaks, and a lookup is a pointer chase, not a
//! hash. Before that (the compat object, `--features compat`), it is a preallocated hash by tid:
//! the thread's tid is read from its `task_struct` at the offset the daemon found in the
//! kernel's BTF, and the entry is removed when the thread exits (`process_events.rs`); a full
//! table counts `OffCpuNoStorage`, as task storage out of memory does.

use profiler_common::OffCpuThread;

pub(crate) use imp::{current_or_new, forget_current, of_task, prev_state};

#[cfg(not(feature = "compat"))]
mod imp {
    use core::ffi::c_void;

    use aya_ebpf::bindings::{
        bpf_map_type::BPF_MAP_TYPE_TASK_STORAGE, task_struct, BPF_F_NO_PREALLOC,
        BPF_LOCAL_STORAGE_GET_F_CREATE,
    };
    use aya_ebpf::helpers::generated as gen;

    use super::OffCpuThread;

    /// A task storage map, as a BTF map definition (the `.maps` section's format: each field's
    /// type encodes one attribute; aya-ebpf has no task storage map). Task storage takes an
    /// `int` key (a pidfd from userspace, unused here), no entry bound and no preallocation.
    #[repr(C)]
    pub(crate) struct TaskStorage<T> {
        r#type: *const [i32; BPF_MAP_TYPE_TASK_STORAGE as usize],
        key: *const i32,
        value: *const T,
        map_flags: *const [i32; BPF_F_NO_PREALLOC as usize],
    }

    // SAFETY: the fields are placeholders for the loader (never dereferenced); the map is
    // shared through BPF helpers only.
    unsafe impl<T> Sync for TaskStorage<T> {}

    impl<T> TaskStorage<T> {
        const fn new() -> Self {
            Self {
                r#type: core::ptr::null(),
                key: core::ptr::null(),
                value: core::ptr::null(),
                map_flags: core::ptr::null(),
            }
        }

        /// The value of `task` (a BTF task pointer), created zeroed if `create` and missing.
        #[inline(always)]
        fn get(&self, task: *mut task_struct, create: bool) -> Option<&'static mut T> {
            let flags = if create {
                BPF_LOCAL_STORAGE_GET_F_CREATE as u64
            } else {
                0
            };
            // SAFETY: a task storage map and a task pointer the kernel handed over.
            let value = unsafe {
                gen::bpf_task_storage_get(
                    self as *const Self as *mut c_void,
                    task,
                    core::ptr::null_mut(),
                    flags,
                )
            } as *mut T;
            // SAFETY: non-null, a value of this map, owned by the task; the scheduler's locks
            // order the programs that touch one thread's value.
            unsafe { value.as_mut() }
        }
    }

    /// Each thread's switch state.
    #[unsafe(link_section = ".maps")]
    #[unsafe(export_name = "OFF_CPU_THREADS")]
    static OFF_CPU_THREADS: TaskStorage<OffCpuThread> = TaskStorage::new();

    /// The state the thread leaving the CPU leaves in: `sched_switch`'s fourth argument.
    #[inline(always)]
    pub(crate) fn prev_state(ctx: &aya_ebpf::programs::BtfTracePointContext) -> u32 {
        let state: u64 = ctx.arg(3);
        state as u32
    }

    /// The state of `task` (a BTF task pointer from a tracepoint), if it has one.
    #[inline(always)]
    pub(crate) fn of_task(task: *mut task_struct) -> Option<&'static mut OffCpuThread> {
        OFF_CPU_THREADS.get(task, false)
    }

    /// The state of `task`, the current thread (a BTF task pointer from a tracepoint), created
    /// if missing.
    #[inline(always)]
    pub(crate) fn current_or_new(
        task: *mut task_struct,
        _tid: u32,
    ) -> Option<&'static mut OffCpuThread> {
        OFF_CPU_THREADS.get(task, true)
    }

    /// The current thread exits: whether it had state (the kernel frees it with the task).
    #[inline(always)]
    pub(crate) fn forget_current(_tid: u32) -> bool {
        // SAFETY: helper without preconditions.
        OFF_CPU_THREADS
            .get(unsafe { gen::bpf_get_current_task_btf() }, false)
            .is_some()
    }
}

#[cfg(feature = "compat")]
mod imp {
    use aya_ebpf::bindings::{task_struct, BPF_NOEXIST};
    use aya_ebpf::helpers::bpf_probe_read_kernel;
    use aya_ebpf::macros::map;
    use aya_ebpf::maps::HashMap;

    use super::OffCpuThread;

    /// Each thread's switch state, by tid. Sized by the daemon at load time.
    #[map]
    static OFF_CPU_THREADS: HashMap<u32, OffCpuThread> = HashMap::with_max_entries(1, 0);

    /// Set by the daemon at load time: where `task_struct::__state` (`state` before 5.14) is.
    #[no_mangle]
    static TASK_STATE_OFFSET: u64 = 0;

    /// The state the thread leaving the CPU leaves in. `sched_switch` hands it over only since
    /// 5.18; before, it is read from the task, where a wake-up racing the switch may already
    /// have set it running (the wait then counts as a preemption).
    #[inline(always)]
    pub(crate) fn prev_state(ctx: &aya_ebpf::programs::BtfTracePointContext) -> u32 {
        let prev: *mut task_struct = ctx.arg(1);
        // SAFETY: a global the loader sets once; read-only afterwards.
        let offset = unsafe { core::ptr::read_volatile(&TASK_STATE_OFFSET) };
        // SAFETY: a checked read of kernel memory (the low half of a `long` before 5.14).
        unsafe { bpf_probe_read_kernel((prev as u64 + offset) as *const u32) }.unwrap_or(0)
    }

    #[inline(always)]
    pub(crate) fn of_task(task: *mut task_struct) -> Option<&'static mut OffCpuThread> {
        // SAFETY: a global the loader sets once; read-only afterwards.
        let offset = unsafe { core::ptr::read_volatile(&crate::task_fields::TASK_PID_OFFSET) };
        if offset == 0 {
            return None;
        }
        // SAFETY: `task_struct.pid` at its offset in the kernel's BTF, of a task the tracepoint
        // handed over: a load the verifier checks (cheaper than a helper, at every switch).
        let tid = unsafe { crate::task_fields::kernel_field::<u32>(task as *const u8, offset) };
        let value = OFF_CPU_THREADS.get_ptr_mut(&tid)?;
        // SAFETY: non-null, a value of this map; the scheduler's locks order the programs that
        // touch one thread's value.
        unsafe { value.as_mut() }
    }

    #[inline(always)]
    pub(crate) fn current_or_new(
        _task: *mut task_struct,
        tid: u32,
    ) -> Option<&'static mut OffCpuThread> {
        if let Some(value) = OFF_CPU_THREADS.get_ptr_mut(&tid) {
            // SAFETY: as above.
            return unsafe { value.as_mut() };
        }
        let fresh = OffCpuThread {
            last_out_ns: 0,
            average_cycle_ns: 0,
            sampled_out_ns: 0,
            woken_ns: 0,
            pid: 0,
            tid: 0,
            monitor: 0,
            monitor_wait_start_ns: 0,
            monitor_wait_last_in_ns: 0,
        };
        OFF_CPU_THREADS
            .insert(&tid, &fresh, BPF_NOEXIST as u64)
            .ok()?;
        // SAFETY: as above.
        unsafe { OFF_CPU_THREADS.get_ptr_mut(&tid)?.as_mut() }
    }

    #[inline(always)]
    pub(crate) fn forget_current(tid: u32) -> bool {
        OFF_CPU_THREADS.remove(&tid).is_ok()
    }
}
