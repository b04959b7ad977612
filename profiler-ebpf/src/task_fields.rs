//! Fields of the kernel structures the scheduler tracepoints hand over (a task, its run
//! queue), read with plain loads: the tracepoint's task pointer has a BTF type the verifier
//! knows and the offsets are read-only globals the daemon sets from the kernel's BTF (constants
//! to the verifier), so it checks each load against that type and lets a fault read zero. The
//! switch program runs at every context switch of the host, and a load costs far less than a
//! helper call (`bpf_get_current_pid_tgid`, `bpf_ktime_get_ns`).

use aya_ebpf::{bindings::task_struct, helpers::bpf_get_current_pid_tgid};

/// Set by the daemon at load time from the kernel's BTF, all or none (0: the `sched_wakeup`
/// program marks wake-ups instead): where a task's `sched_info.last_queued` is, its
/// `se.cfs_rq`, a `cfs_rq`'s `rq`, and an `rq`'s `clock`.
#[no_mangle]
static TASK_LAST_QUEUED_OFFSET: u64 = 0;
#[no_mangle]
static TASK_CFS_RQ_OFFSET: u64 = 0;
#[no_mangle]
static CFS_RQ_RQ_OFFSET: u64 = 0;
#[no_mangle]
static RQ_CLOCK_OFFSET: u64 = 0;

/// Set by the daemon at load time from the kernel's BTF (0: not found, and the ids come from a
/// helper): where a task's `tgid` (its process id) and `pid` (its thread id) are.
#[no_mangle]
static TASK_TGID_OFFSET: u64 = 0;
#[no_mangle]
pub(crate) static TASK_PID_OFFSET: u64 = 0;

/// How long `task`, being switched in, has been runnable, by the scheduler's account: its run
/// queue's clock (brought up to date by this very switch) less the time it was queued on it.
/// `None` where the daemon found no such account, or it says nothing of this task.
#[inline(always)]
pub(crate) fn queued_for(task: *mut task_struct) -> Option<u64> {
    let clock = run_queue_clock(task)?;
    // SAFETY: a global the loader sets once; read-only afterwards.
    let last_queued_at = unsafe { core::ptr::read_volatile(&TASK_LAST_QUEUED_OFFSET) };
    // SAFETY: a field of the task, at its offset in the kernel's BTF (see `run_queue_clock`).
    let last_queued = unsafe { kernel_field::<u64>(task as *const u8, last_queued_at) };
    if last_queued == 0 {
        return None;
    }
    clock.checked_sub(last_queued)
}

/// The scheduler's clock of the run queue `task` is on, `task` being the thread leaving or
/// getting this CPU: `__schedule` brought it up to date just before this tracepoint. None
/// where the daemon found no run-queue account in the kernel's BTF.
///
/// What each switch of the host reads the time with: the kernel's clock (`bpf_ktime_get_ns`)
/// took about 30 ns of the switch program's 113 on the project's VM.
#[inline(always)]
pub(crate) fn run_queue_clock(task: *mut task_struct) -> Option<u64> {
    // SAFETY: globals the loader sets once; read-only afterwards.
    let (last_queued_at, cfs_rq_at, rq_at, clock_at) = unsafe {
        (
            core::ptr::read_volatile(&TASK_LAST_QUEUED_OFFSET),
            core::ptr::read_volatile(&TASK_CFS_RQ_OFFSET),
            core::ptr::read_volatile(&CFS_RQ_RQ_OFFSET),
            core::ptr::read_volatile(&RQ_CLOCK_OFFSET),
        )
    };
    if last_queued_at == 0 {
        return None;
    }
    // SAFETY: fields at their offsets in the kernel's BTF, of a task the kernel handed over
    // and of the structures it points to, which the verifier checks.
    let clock = unsafe {
        let cfs_rq = kernel_field::<*const u8>(task as *const u8, cfs_rq_at);
        let rq = kernel_field::<*const u8>(cfs_rq, rq_at);
        kernel_field::<u64>(rq, clock_at)
    };
    (clock != 0).then_some(clock)
}

/// The `T` at `offset` bytes into the kernel structure at `base`, a pointer the verifier knows
/// the BTF type of: a load it checks against that type (a fault reads zero).
///
/// # Safety
///
/// `offset` must be a field of `base`'s type, of type `T`, by the kernel's BTF, and a
/// read-only global (a constant to the verifier).
#[inline(always)]
pub(crate) unsafe fn kernel_field<T>(base: *const u8, offset: u64) -> T {
    // SAFETY: as the caller promises; the verifier turns the load into a checked one.
    unsafe { core::ptr::read_volatile(base.wrapping_add(offset as usize) as *const T) }
}

/// `task`'s process and thread ids, packed as `bpf_get_current_pid_tgid` packs them: `task` is
/// the current task (`prev`), read with plain loads where the daemon found the fields.
#[inline(always)]
pub(crate) fn ids_of(task: *mut task_struct) -> u64 {
    // SAFETY: globals the loader sets once; read-only afterwards.
    let (tgid_at, pid_at) = unsafe {
        (
            core::ptr::read_volatile(&TASK_TGID_OFFSET),
            core::ptr::read_volatile(&TASK_PID_OFFSET),
        )
    };
    if tgid_at == 0 || pid_at == 0 {
        return bpf_get_current_pid_tgid();
    }
    // SAFETY: fields of the task at their offsets in the kernel's BTF (see `kernel_field`).
    let (tgid, pid) = unsafe {
        (
            kernel_field::<u32>(task as *const u8, tgid_at),
            kernel_field::<u32>(task as *const u8, pid_at),
        )
    };
    (u64::from(tgid) << 32) | u64::from(pid)
}
