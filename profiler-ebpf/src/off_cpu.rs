//! Off-CPU profiling: where threads wait, and for how long.
//!
//! `sched_switch` runs in the context of the thread leaving the CPU, so its stacks can be walked
//! there, as the CPU sampler walks them. How long it will wait is not known yet, so the switch
//! is sampled first (with a probability set from the thread's past alone, so that weighting each
//! sampled wait by its inverse keeps every stack's total unbiased), its stack sent at once, and
//! the wait's end sent when the thread is back on a CPU. What part of the wait was run-queue
//! delay (runnable, waiting for a CPU), not waiting for something it asked for, comes from the
//! scheduler's own account where the daemon found it in the kernel's BTF: the time the thread
//! was queued (`sched_info.last_queued`, on its run queue's clock) against that clock now, read
//! at switch-in, so that no program runs at each wake-up. Elsewhere a `sched_wakeup` program
//! marks when a sleeping thread became runnable.
//!
//! The probability: a thread's cycle is the time from one of its switches off the CPU to the
//! next (it ran, then waited). A switch is always sampled when the cycle it ends, or the thread's
//! moving average of cycles, is at least `OFF_CPU_PERIOD_NS`, else with probability
//! max(cycle, average) / period. A thread's stacks are then taken about once per period of its
//! time at most, whatever its switch rate: threads that wait milliseconds at a time are sampled
//! at every wait, a pair ping-ponging 100,000 times a second costs a stack walk per period each.
//! The average keeps a thread that waits long from being sampled rarely just because its last
//! cycle was short (a preemption, a brief lock spin): every wait of such a thread weighs much,
//! so sampling it rarely would make its totals noisy, though not biased.
//!
//! Waits to enter a monitor (lock profiles): a thread woken without the monitor (another
//! thread took it first) blocks again, each block a wait here. With `--lock`, every switch of a
//! Java thread reads the monitor it waits to enter, sampled or not: consecutive blocks on the
//! same monitor, no more than `MONITOR_SPIN_GAP_NS` of running apart (the spin before blocking
//! again), are one wait, whose start and length so far each block's end carries; the daemon
//! applies the lock threshold to the whole wait and counts it once.
//!
//! Every switch of the host runs the switch program, so its common path (a thread that is not
//! sampled) calls as few helpers as it can: on the project's VM each call costs about 6 ns of a
//! path of about 70 (with an empty program's 34). The leaving thread's ids and task come from
//! the tracepoint's `prev` with plain loads, and the draws from a per-CPU generator
//! (`next_off_cpu_draw`) seeded once from the kernel's.
//!
//! Per-thread state lives in `thread_state.rs`: task storage where the kernel has it, a
//! preallocated hash by tid before (the compat object).

use aya_ebpf::{
    bindings::task_struct,
    helpers::{bpf_ktime_get_ns, generated as gen},
    macros::{btf_tracepoint, map},
    maps::{PerCpuArray, RingBuf},
    programs::BtfTracePointContext,
    EbpfContext,
};
use profiler_common::{
    budget::Producer, next_off_cpu_draw, off_cpu_draw, Counter, JavaState, OffCpuEnd, OffCpuThread,
    SampleKind, OFF_CPU_END_BYTES, OFF_CPU_PROBABILITY_ONE, OFF_CPU_RING_BYTES, TASK_DEAD,
};

use crate::memory::CurrentTask;
use crate::task_fields::{ids_of, queued_for, run_queue_clock};
use crate::{budget, thread_state};
use crate::{
    count, fill_record, kernel_stack, profiled, saved_user_regs, send_to, RecordOrigin, WalkSlot,
    WalkStart, BPF_RB_NO_WAKEUP, HOTSPOT_PROCS, SCRATCH,
};
use profiler_unwind::JavaThreads as _;

/// Innermost kernel frames of a stack taken here that are the tracing machinery (this program,
/// `bpf_trace_run4`), not the thread's: its stack starts at `__schedule`.
const TRACING_FRAMES: u64 = 2;

/// Cycles longer than this many periods count as this long in a thread's average.
pub(crate) const CYCLE_CAP_PERIODS: u64 = 16;

/// Set by the daemon at load time (`off_cpu_period_us`).
#[no_mangle]
pub(crate) static OFF_CPU_PERIOD_NS: u64 = 5_000_000;

/// Set by the daemon at load time: non-zero with `--lock`, whose monitor waits are tracked
/// across their blocks.
#[no_mangle]
static TRACK_MONITOR_WAITS: u64 = 0;

/// Most time a thread runs between two blocks of one monitor wait: HotSpot spins (adaptively,
/// microseconds) before it blocks again. Longer, and the thread got the monitor, held it and
/// contends anew: a new wait.
const MONITOR_SPIN_GAP_NS: u64 = 1_000_000;

/// Stacks of sampled waits ([`SampleKind::OffCpu`] records) and their ends ([`OffCpuEnd`]).
#[map]
pub(crate) static OFF_CPU_EVENTS: RingBuf = RingBuf::with_byte_size(OFF_CPU_RING_BYTES, 0);

/// What the switch program keeps per CPU (used by it alone, on that CPU).
#[repr(C)]
struct SwitchCpu {
    /// The CPU's idle task (`task_struct` address), learnt when it leaves the CPU: a switch to
    /// it needs no lookup. On an idle-ish machine half of the switches are to or from it.
    idle_task: u64,
    /// The CPU's sequence of draws (`next_off_cpu_draw`); 0 until seeded.
    draw_state: u64,
}

#[map]
static SWITCH_CPU: PerCpuArray<SwitchCpu> = PerCpuArray::with_max_entries(1, 0);

/// `sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next,
/// unsigned int prev_state)`: `prev` is the current task (`prev_state` since 5.18; see
/// `thread_state::prev_state`).
#[btf_tracepoint(function = "sched_switch")]
pub fn off_cpu_switch(ctx: BtfTracePointContext) -> i32 {
    let next: *mut task_struct = ctx.arg(2);
    let prev_state = thread_state::prev_state(&ctx);
    let Some(cpu) = SWITCH_CPU.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU slot, used by this program on this CPU only (it does not nest).
    let cpu = unsafe { &mut *cpu };
    if cpu.idle_task != next as u64 {
        switched_in(next);
    }
    switched_out(&ctx, prev_state, cpu);
    0
}

/// `sched_wakeup(struct task_struct *p)`: `p` is runnable again.
#[btf_tracepoint(function = "sched_wakeup")]
pub fn off_cpu_wakeup(ctx: BtfTracePointContext) -> i32 {
    let task: *mut task_struct = ctx.arg(0);
    if let Some(thread) = thread_state::of_task(task) {
        if thread.sampled_out_ns != 0 && thread.woken_ns == 0 {
            thread.woken_ns = ktime();
        }
    }
    0
}

/// The thread `task` gets the CPU: if its wait was sampled, send how long it lasted.
#[inline(always)]
fn switched_in(task: *mut task_struct) {
    let Some(thread) = thread_state::of_task(task) else {
        return;
    };
    let out = thread.sampled_out_ns;
    if out == 0 && thread.monitor == 0 {
        return;
    }
    let now = ktime();
    let (monitor_wait_start_ns, monitor_wait_before_ns) = if thread.monitor != 0 {
        let start = thread.monitor_wait_start_ns;
        let before = thread.monitor_wait_last_in_ns.saturating_sub(start);
        thread.monitor_wait_last_in_ns = now;
        (start, before)
    } else {
        (0, 0)
    };
    if out == 0 {
        return;
    }
    let woken = thread.woken_ns;
    let waited = now.saturating_sub(out);
    let (blocked_ns, runqueue_ns) = if let Some(queued) = queued_for(task) {
        let queued = queued.min(waited);
        (waited - queued, queued)
    } else if woken >= out && woken <= now {
        (woken - out, now - woken)
    } else {
        // No wake-up seen (woken by a path without the tracepoint): all of it counts as blocked.
        (waited, 0)
    };
    let end = OffCpuEnd {
        out_ktime_ns: out,
        blocked_ns,
        runqueue_ns,
        pid: thread.pid,
        tid: thread.tid,
        monitor_wait_start_ns,
        monitor_wait_before_ns,
    };
    thread.sampled_out_ns = 0;
    thread.woken_ns = 0;
    if OFF_CPU_EVENTS
        .output::<OffCpuEnd>(&end, BPF_RB_NO_WAKEUP)
        .is_err()
    {
        count(Counter::OffCpuRingFull);
    }
}

/// What the current thread, if it is a Java thread of a JVM in `HOTSPOT_PROCS`, is doing in
/// the JVM, and the monitor it waits to enter if it does.
#[inline(always)]
fn java_state(pid: u32, tid: u32) -> (JavaState, u64) {
    let task = CurrentTask::new(pid, WalkSlot::Interrupt as u32);
    // SAFETY: map values only read.
    let (Some(layout), Some(thread)) = (unsafe { HOTSPOT_PROCS.get(&pid) }, task.java_thread(tid))
    else {
        return (JavaState::Unknown, 0);
    };
    profiler_unwind::waiting_for(layout, &task, thread)
}

/// The top byte of [`off_cpu_java_waiting`]'s word: the state; the rest: the monitor (a user
/// address, under 2^56).
const JAVA_STATE_SHIFT: u32 = 56;

/// A moving average of cycles, one eighth of the way to the new `cycle`.
#[inline(always)]
pub(crate) fn next_average(average: u64, cycle: u64) -> u64 {
    if cycle >= average {
        average + (cycle - average) / 8
    } else {
        average - (average - cycle) / 8
    }
}

/// Whether a wait is sampled, and if so with which probability (in units of
/// 2^-`OFF_CPU_PROBABILITY_BITS`), from its thread's last `cycle` and `average` before it (see
/// the module's notes): always for a `first` one, else by a draw (`off_cpu_draw`) that `draw`
/// makes (uniform below `OFF_CPU_PROBABILITY_ONE`), only when one is needed.
#[inline(always)]
pub(crate) fn sampled_wait(
    first: bool,
    cycle: u64,
    average: u64,
    period: u64,
    draw: impl FnOnce() -> u32,
) -> Option<u32> {
    let likely_cycle = if cycle > average { cycle } else { average };
    if first || likely_cycle >= period {
        return Some(OFF_CPU_PROBABILITY_ONE);
    }
    off_cpu_draw(likely_cycle, period, draw())
}

/// A draw from the kernel's generator, uniform below `OFF_CPU_PROBABILITY_ONE`.
#[inline(always)]
pub(crate) fn kernel_draw() -> u32 {
    // SAFETY: helper without preconditions.
    unsafe { gen::bpf_get_prandom_u32() & (OFF_CPU_PROBABILITY_ONE - 1) }
}

/// The next draw of this CPU's sequence, seeded from the kernel's generator on first use.
#[inline(always)]
fn cpu_draw(cpu: &mut SwitchCpu) -> u32 {
    if cpu.draw_state == 0 {
        // SAFETY: helper without preconditions.
        cpu.draw_state = u64::from(unsafe { gen::bpf_get_prandom_u32() }) << 32 | 1;
    }
    next_off_cpu_draw(&mut cpu.draw_state)
}

/// [`java_state`] as one word, the state in the top byte: a global function (exported, not
/// inlined), which the verifier checks once on its own, so that reading it at every switch,
/// sampled or not, does not multiply the paths it walks through the rest of the program (on
/// 5.10, inlined, the switch program went past the verifier's million instructions).
#[inline(never)]
#[no_mangle]
pub extern "C" fn off_cpu_java_waiting(pid: u32, tid: u32) -> u64 {
    let (state, monitor) = java_state(pid, tid);
    ((state as u64) << JAVA_STATE_SHIFT) | (monitor & ((1 << JAVA_STATE_SHIFT) - 1))
}

/// [`off_cpu_java_waiting`]'s word, unpacked.
#[inline(always)]
fn java_waiting(pid: u32, tid: u32) -> (u8, u64) {
    let word = off_cpu_java_waiting(pid, tid);
    (
        (word >> JAVA_STATE_SHIFT) as u8,
        word & ((1 << JAVA_STATE_SHIFT) - 1),
    )
}

/// Notes the monitor the thread leaving the CPU now waits to enter (0: none): a block of the
/// wait it was in, if on the same monitor and soon after its last block, or a new wait.
#[inline(always)]
fn track_monitor_wait(thread: &mut OffCpuThread, monitor: u64) {
    if monitor == 0 {
        thread.monitor = 0;
        return;
    }
    let now = ktime();
    if thread.monitor != monitor
        || now.saturating_sub(thread.monitor_wait_last_in_ns) > MONITOR_SPIN_GAP_NS
    {
        thread.monitor = monitor;
        thread.monitor_wait_start_ns = now;
        thread.monitor_wait_last_in_ns = now;
    }
}

/// The kernel's monotonic clock, which the records' times are on.
#[inline(always)]
fn ktime() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

/// The current thread leaves the CPU: decide whether this wait is sampled, and if so send its
/// stacks.
#[inline(always)]
fn switched_out(ctx: &BtfTracePointContext, prev_state: u32, cpu: &mut SwitchCpu) {
    if prev_state & TASK_DEAD != 0 {
        // Its last switch: no wait to sample.
        return;
    }
    // The current task.
    let prev: *mut task_struct = ctx.arg(1);
    let pid_tgid = ids_of(prev);
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 {
        cpu.idle_task = prev as u64;
        return;
    }
    if !profiled(pid) {
        return;
    }
    // The time, for the cycle this switch ends: the run queue's clock where the daemon found
    // it, which costs less to read than the kernel's (the thread's cycles are all measured
    // on the one clock or the other, the daemon's choice at load time).
    let cycle_clock = run_queue_clock(prev).unwrap_or_else(ktime);
    count(Counter::OffCpuSwitches);
    let Some(thread) = thread_state::current_or_new(prev, pid_tgid as u32) else {
        // No memory for it, or its storage busy in a nested program.
        count(Counter::OffCpuNoStorage);
        return;
    };
    if thread.last_out_ns == 0 {
        count(Counter::OffCpuThreadsTracked);
    }
    // Stored each time: a thread that execs takes its leader's tid.
    thread.pid = pid;
    thread.tid = pid_tgid as u32;
    // SAFETY: a global the loader sets once; read-only afterwards.
    let period = unsafe { core::ptr::read_volatile(&OFF_CPU_PERIOD_NS) }.max(1);
    let first = thread.last_out_ns == 0;
    // A long idle spell counts as a few periods in the average, so that the thread's next
    // short cycles bring it down within tens of switches.
    let cycle = cycle_clock
        .wrapping_sub(thread.last_out_ns)
        .min(period * CYCLE_CAP_PERIODS);
    let average = thread.average_cycle_ns;
    thread.average_cycle_ns = if first {
        cycle
    } else {
        next_average(average, cycle)
    };
    thread.last_out_ns = cycle_clock;
    // A wait still open here had its end lost (a full ring); it must not be ended twice.
    thread.sampled_out_ns = 0;
    let tid = pid_tgid as u32;
    // SAFETY: a global the loader sets once; read-only afterwards.
    let tracking = unsafe { core::ptr::read_volatile(&TRACK_MONITOR_WAITS) } != 0;
    let waiting = if tracking {
        let waiting = java_waiting(pid, tid);
        track_monitor_wait(thread, waiting.1);
        Some(waiting)
    } else {
        None
    };

    let Some(probability) = sampled_wait(first, cycle, average, period, || cpu_draw(cpu)) else {
        return;
    };
    let now = ktime();

    // Kernel threads have no user stack; their waits are the kernel's business.
    let Some(user) = saved_user_regs() else {
        return;
    };
    let Some(record) = SCRATCH.get_ptr_mut(WalkSlot::Interrupt as u32) else {
        count(Counter::ScratchMissing);
        return;
    };
    // SAFETY: a per-CPU map value; see `fill_record` for why the two programs can share it.
    let record = unsafe { &mut *record };
    let kernel_bytes = kernel_stack(ctx.as_ptr(), record, TRACING_FRAMES);
    let origin = RecordOrigin {
        kind: SampleKind::OffCpu,
        ktime_ns: now,
        task_state: prev_state as u8,
        java_state: waiting.unwrap_or_else(|| java_waiting(pid, tid)).0,
        weight: probability,
        flags: 0,
        virtual_thread: 0,
    };
    let start = WalkStart {
        user: Some(user),
        slot: WalkSlot::Interrupt,
        allocated: None,
        anchor: 0,
    };
    let Some(bytes) = fill_record(record, pid_tgid, start, kernel_bytes, origin) else {
        return;
    };
    // The wait's end, sent later, is charged with its stack.
    let charged = bytes.len() + OFF_CPU_END_BYTES;
    if !budget::admit(Producer::OffCpu, pid, budget::current_uid(), charged) {
        return;
    }
    if send_to(&OFF_CPU_EVENTS, bytes, u64::from(OFF_CPU_RING_BYTES / 4)).is_err() {
        count(Counter::OffCpuRingFull);
        return;
    }
    count(Counter::OffCpuSampled);
    thread.sampled_out_ns = now;
    // A preempted thread is runnable from the start: all of its time off the CPU is
    // run-queue delay.
    thread.woken_ns = if prev_state == 0 { now } else { 0 };
}
