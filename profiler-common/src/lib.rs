//! The contract between the kernel side (`profiler-ebpf`) and the daemon.
//!
//! Everything here is `#[repr(C)]` and shared byte for byte by both sides. Numbers given to
//! frame kinds, unwind ends and counters are part of that contract: they are never reused for
//! another meaning, only appended to.
#![no_std]

pub mod budget;
pub mod cfi;
pub mod kernel_names;
mod labelled_enum;
pub mod metric;

/// Deepest kernel stack we ask `bpf_get_stack` for (the kernel's `perf_event_max_stack` default).
pub const MAX_KERNEL_FRAMES: usize = 127;
/// Deepest user stack the BPF unwinder walks. Java stacks of several hundred frames are common
/// (frameworks, recursion); the per-CPU scratch record must stay under the 32 KiB value limit.
pub const MAX_USER_FRAMES: usize = 1024;
/// Size the BPF object declares for the sample ring buffer; the daemon sizes the real one at
/// load time with [`sample_ring_bytes`].
pub const DEFAULT_SAMPLE_RING_BYTES: u32 = 8 << 20;
/// Bounds of [`sample_ring_bytes`].
pub const MIN_SAMPLE_RING_BYTES: u32 = 1 << 20;
pub const MAX_SAMPLE_RING_BYTES: u32 = 64 << 20;

/// The sample ring buffer's size for `cpus` CPUs sampled at `frequency_hz`: about a second of
/// 1 KiB records, as a power of two within [`MIN_SAMPLE_RING_BYTES`, `MAX_SAMPLE_RING_BYTES`].
/// The daemon drains it every 250 ms and is woken when it is a quarter full, so a second leaves
/// room for a slow drain. The ring is memory charged to the daemon (and mapped twice into it):
/// a fixed 8 MiB cost 16 MB of RSS on a 2-CPU node that fills 0.2 MB a second.
pub const fn sample_ring_bytes(cpus: u32, frequency_hz: u64) -> u32 {
    let per_second = (cpus as u64)
        .saturating_mul(frequency_hz)
        .saturating_mul(1024);
    if per_second <= MIN_SAMPLE_RING_BYTES as u64 {
        return MIN_SAMPLE_RING_BYTES;
    }
    if per_second >= MAX_SAMPLE_RING_BYTES as u64 {
        return MAX_SAMPLE_RING_BYTES;
    }
    per_second.next_power_of_two() as u32
}
/// Most processes the `--pid` filter can name.
pub const MAX_TARGET_PIDS: u32 = 4096;
/// Length of a task's `comm`, NUL padded.
pub const COMM_LEN: usize = 16;

crate::labelled_enum! {
    /// What produced a user frame, and so how the daemon symbolizes it.
    pub enum FrameKind: u8, from_u8 {
        /// An instruction pointer in native code (ELF or anonymous memory).
        Native = 1 => "native",
        /// A HotSpot interpreter frame: `addr` is the `Method*`, `aux` the bci (`BCI_UNKNOWN` if the
        /// bcp was not plausible), `cookie` its [`interpreted_cookie`].
        Interpreted = 2 => "interpreted",
        /// A frame in a HotSpot code blob (an nmethod, or a stub): `addr` is the `CodeBlob*`, `aux`
        /// the pc's offset from the blob's code start, `cookie` the nmethod's `_compile_id`.
        Compiled = 3 => "compiled",
        /// The class of an allocated object (the first frame of allocation records): `addr` is
        /// the `Symbol*` of its name, `aux` the name's length, `cookie` its
        /// [`class_name_cookie`]. The name is read later, so the cookie proves it is still the
        /// symbol sampled.
        AllocatedClass = 4 => "allocated_class",
    }
}

/// `UserFrame::aux` of an interpreted frame whose bcp could not be trusted.
pub const BCI_UNKNOWN: u32 = u32::MAX;

crate::labelled_enum! {
    /// Why the user stack walk stopped.
    pub enum UnwindEnd: u8, from_u8 {
        /// Reached the outermost frame (null frame pointer or null return address).
        Complete = 0 => "complete",
        /// Stopped at `MAX_USER_FRAMES`.
        MaxDepth = 1 => "max_depth",
        /// A frame-pointer slot could not be read (paged out, or not a frame pointer at all).
        ReadFailed = 2 => "read_failed",
        /// The saved frame pointer did not point further up the stack: not a frame-pointer chain.
        NotMonotonic = 3 => "not_monotonic",
        /// The task has no user context (kernel thread, or registers unavailable).
        NoUserContext = 4 => "no_user_context",
        /// A pc inside a JVM's code cache that no code blob covers (segment map lookup failed).
        NoCodeBlob = 5 => "no_code_blob",
        /// A Java frame whose layout is implausible (frame size, sender sp, bcp).
        BadJavaFrame = 6 => "bad_java_frame",
        /// A Java frame could not be read (its memory was unmapped or paged out).
        JavaReadFailed = 7 => "java_read_failed",
        /// A mounted virtual thread's frames frozen in its stack chunks could not be read (a
        /// chunk being thawed or moved, or not the mounted continuation's): the walk stops at
        /// the return barrier rather than go on through it with frames that may be another
        /// virtual thread's.
        FrozenFramesUnread = 8 => "frozen_frames_unread",
    }
}

crate::labelled_enum! {
    /// Indexes into the per-CPU `COUNTERS` array. The daemon sums them over CPUs and exports them.
    pub enum Counter: u32, from_u32 {
        /// Every run of the sampling program.
        Samples = 0 => "samples",
        /// Samples of the idle task (pid 0), not recorded.
        Idle = 1 => "idle",
        /// Samples of processes outside the `--pid` filter, not recorded.
        Filtered = 2 => "filtered",
        /// Samples lost because the ring buffer was full.
        RingFull = 3 => "ring_full",
        /// `bpf_get_stack` failed for the kernel stack (the sample is still sent, without it).
        KernelStackFailed = 4 => "kernel_stack_failed",
        /// User stacks cut at `MAX_USER_FRAMES`.
        UserStackTruncated = 5 => "user_stack_truncated",
        /// The per-CPU scratch record could not be looked up (should never happen).
        ScratchMissing = 6 => "scratch_missing",
        /// Samples sent to the daemon.
        Sent = 7 => "sent",
        /// Process events (exec, exit) lost because their ring buffer was full.
        ProcessEventsLost = 8 => "process_events_lost",
        /// Switches off the CPU of profiled threads (off-CPU profiling on).
        OffCpuSwitches = 9 => "off_cpu_switches",
        /// Those whose stack was taken and sent.
        OffCpuSampled = 10 => "off_cpu_sampled",
        /// Sampled switches lost: the off-CPU ring was full (the stack or the wait's end).
        OffCpuRingFull = 11 => "off_cpu_ring_full",
        /// Switches not tracked: the thread's task storage could not be had (no memory, or busy in
        /// a nested program).
        OffCpuNoStorage = 12 => "off_cpu_no_storage",
        /// Threads given off-CPU task storage, and tracked threads that exited (their storage goes
        /// with them): the difference is the threads tracked now.
        OffCpuThreadsTracked = 13 => "off_cpu_threads_tracked",
        OffCpuThreadsGone = 14 => "off_cpu_threads_gone",
        /// Allocation hook calls in profiled JVMs (allocation profiling on).
        AllocEvents = 15 => "alloc_events",
        /// Those sampled and sent.
        AllocSampled = 16 => "alloc_sampled",
        /// Sampled allocations lost: the ring was full.
        AllocRingFull = 17 => "alloc_ring_full",
        /// Allocation hook calls not looked at because another one was under way on the CPU (a
        /// preempted hook program): not sampled.
        AllocNested = 18 => "alloc_nested",
        /// Sampled allocations whose walk could not start at the thread's last Java frame (its
        /// `JavaFrameAnchor`) and started at the hook's caller instead.
        AllocWalkFromHook = 19 => "alloc_walk_from_hook",
        /// Records refused because their process had spent its emit budget ([`budget`]), per
        /// producer; then those refused because their user had.
        CpuProcessBudget = 20 => "cpu_process_budget",
        CpuUserBudget = 21 => "cpu_user_budget",
        AllocProcessBudget = 22 => "alloc_process_budget",
        AllocUserBudget = 23 => "alloc_user_budget",
        OffCpuProcessBudget = 24 => "off_cpu_process_budget",
        OffCpuUserBudget = 25 => "off_cpu_user_budget",
        ProcessEventsProcessBudget = 26 => "process_events_process_budget",
        ProcessEventsUserBudget = 27 => "process_events_user_budget",
        /// Java threads described by the thread-start hook as they started.
        JavaThreadsStarted = 28 => "java_threads_started",
        /// Thread starts not described: their JVM had [`JAVA_THREADS_PER_TARGET`] described by
        /// the hook already, or the map was full (the thread list's scan still finds them).
        JavaThreadsStartRefused = 29 => "java_threads_start_refused",
        /// Objects HotSpot's allocation sampler reported in profiled JVMs (the sidecar agent's
        /// callback), before the walk: those JVMs' TLAB events are left out.
        AllocSamplerEvents = 30 => "alloc_sampler_events",
        /// Of those, each thread's first in a JVM whose sampler picks it by rule, not by chance
        /// ([`hotspot_flags::SAMPLER_TAKES_FIRST`]): not walked, not weighed.
        AllocSamplerFirstSkipped = 31 => "alloc_sampler_first_skipped",
        /// Virtual threads' unmounts from their carriers (freezes) in profiled JVMs, with
        /// off-CPU or lock profiling on; those that failed (the virtual thread was pinned);
        /// those whose stack was taken and sent.
        VirtualUnmounts = 32 => "virtual_unmounts",
        VirtualUnmountsFailed = 33 => "virtual_unmounts_failed",
        VirtualUnmountsSampled = 34 => "virtual_unmounts_sampled",
        /// Mounts (thaws) of virtual threads; those that ended a sampled wait.
        VirtualMounts = 35 => "virtual_mounts",
        VirtualWaitsEnded = 36 => "virtual_waits_ended",
        /// Unmount hooks not looked at: another hook was walking on the CPU, or the virtual
        /// thread could not be identified (its thread object unreadable).
        VirtualUnmountsUnseen = 37 => "virtual_unmounts_unseen",
        /// Java threads ending in JVMs that do not count their ended threads' bytes (before JDK
        /// 14) whose bytes the thread-exit hook added up; those whose counters it could not
        /// read (the JVM's allocation profile then counts a little short).
        ThreadExitsCounted = 38 => "thread_exits_counted",
        ThreadExitsUnread = 39 => "thread_exits_unread",
    }
}

/// Size of the ring buffer of process events (a power of two, in bytes): 16 K events of 8
/// bytes (plus the ring's 8-byte headers), ample for a node's exec rate over the daemon's
/// half-second polls.
pub const PROCESS_EVENT_RING_BYTES: u32 = 256 << 10;

crate::labelled_enum! {
    /// What a process did, as the BPF tracepoints saw it.
    pub enum ProcessEventKind: u32, from_u32 {
        /// It replaced its program (`execve`): a new image, maybe a JVM starting.
        Exec = 1 => "exec",
        /// Its main thread exited (the process is gone, or a zombie until its last thread ends).
        Exit = 2 => "exit",
    }
}

/// One record of the process event ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProcessEvent {
    /// A [`ProcessEventKind`].
    pub kind: u32,
    /// Process id (tgid) in the initial PID namespace.
    pub pid: u32,
}

const _: () = assert!(core::mem::size_of::<ProcessEvent>() == 8);

impl ProcessEvent {
    /// The event in a ring-buffer record, if the record has the size of one.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        let kind = u32::from_ne_bytes(bytes.get(0..4)?.try_into().ok()?);
        let pid = u32::from_ne_bytes(bytes.get(4..8)?.try_into().ok()?);
        (bytes.len() == 8).then_some(Self { kind, pid })
    }
}

/// The fixed head of every sample record in the ring buffer. It is followed by
/// `kernel_frames` kernel instruction pointers (`u64`, innermost first) and then by
/// `user_frames` [`UserFrame`]s (innermost first).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SampleHeader {
    /// `bpf_ktime_get_ns` at the sample.
    pub ktime_ns: u64,
    /// Process id (tgid) in the initial PID namespace.
    pub pid: u32,
    /// Thread id in the initial PID namespace.
    pub tid: u32,
    pub cpu: u32,
    pub kernel_frames: u16,
    pub user_frames: u16,
    /// An [`UnwindEnd`].
    pub user_end: u8,
    /// A [`SampleKind`]. (Scalars rather than byte arrays here: the BPF program zeroes an
    /// array with a call to a byte-at-a-time `memset`, a scalar with one store.)
    pub kind: u8,
    /// Off-CPU records: the task's state when it left the CPU (the scheduler's `prev_state`,
    /// low 8 bits: 0 runnable, i.e. preempted; 1 interruptible sleep; 2 uninterruptible).
    /// Zero in CPU samples.
    pub task_state: u8,
    /// Off-CPU records of Java threads: a [`JavaState`] (0 otherwise).
    pub java_state: u8,
    /// What the sample weighs, by kind (not part of its stack's identity):
    /// - off-CPU: the probability this switch was sampled, in units of
    ///   2^-[`OFF_CPU_PROBABILITY_BITS`] (a wait's time is weighted by its inverse);
    /// - allocation: the event's size in 8-byte heap words, saturating (see
    ///   [`SampleKind::AllocInNewTlab`]);
    /// - CPU: zero.
    pub weight: u32,
    /// The thread's name (`comm`), NUL padded.
    pub comm: [u8; COMM_LEN],
    /// The task's real uid (in the initial user namespace) when the record was taken: whose
    /// budget the record counts against in the daemon (`crate::budget` for the BPF side's).
    pub uid: u32,
    /// [`sample_flags`] bits (also what keeps the header free of implicit padding, which the
    /// daemon hashes).
    pub flags: u32,
    /// The virtual thread the sample was taken for (its `java.lang.Thread` id): the one mounted
    /// on the sampled carrier thread, or the one unmounting. 0 for every other sample.
    pub virtual_thread: u64,
}

/// [`SampleHeader::flags`] and [`VirtualWaitEnd::flags`] bits.
pub mod sample_flags {
    /// An off-CPU record of a virtual thread's wait: its stack when it unmounted from its
    /// carrier (`tid`, which went on running other work), its end when it was mounted again.
    /// Such a wait is told from its carrier's own by `tid` and `ktime_ns` together.
    pub const VIRTUAL_THREAD: u32 = 1;
    /// An end only: the unmount whose stack was sent failed (the virtual thread was pinned to
    /// its carrier and stayed mounted), so no wait began; its stack is dropped.
    pub const UNMOUNT_FAILED: u32 = 1 << 1;
}

crate::labelled_enum! {
    /// What a sample record stands for.
    pub enum SampleKind: u8, from_u8 {
        /// The CPU-clock event fired while the thread ran: `ktime_ns` is when.
        Cpu = 0 => "cpu",
        /// The thread left the CPU (`sched_switch`) and this switch was sampled: `ktime_ns` is
        /// when; the stack is where it waits. How long it waited comes later, in an
        /// [`OffCpuEnd`] with the same thread and `ktime_ns`.
        OffCpu = 1 => "off_cpu",
        /// A thread's TLAB was refilled (HotSpot's `AllocTracer::send_allocation_in_new_tlab`):
        /// `weight` is what the thread allocated since its previous event (the TLAB it
        /// filled; `profiler-ebpf/src/alloc.rs`). The first user frame is the class of the
        /// object whose allocation refilled it ([`FrameKind::AllocatedClass`]), then the
        /// thread's stack. Each event of weight `w` is sampled with probability
        /// `min(1, w / interval)` ([`ALLOC_INTERVAL_BYTES`] as set at load time).
        AllocInNewTlab = 2 => "alloc_in_new_tlab",
        /// An object allocated outside any TLAB (`send_allocation_outside_tlab`: large arrays,
        /// a full TLAB not worth retiring): `weight` as above (the object, and what the
        /// thread's TLABs held when retired since its previous event); sampled as above.
        AllocOutsideTlab = 3 => "alloc_outside_tlab",
        /// An object HotSpot's own allocation sampler picked (JVMTI `SampledObjectAlloc`, with
        /// the sidecar agent loaded and `alloc_interval` set: about one per interval bytes a
        /// thread allocates, wherever the bytes go): `weight` is the object's size. Taken
        /// whole (no draw here); the daemon weighs it by the inverse of the odds that an object
        /// of that size is picked. A JVM that sends these sends no TLAB events.
        AllocSampled = 4 => "alloc_sampled",
    }
}

/// The allocation sampling interval the BPF side starts with, in bytes (as async-profiler's
/// and Alloy's default); the daemon sets its own at load time.
pub const ALLOC_INTERVAL_BYTES: u64 = 512 << 10;

/// Threads whose allocation counter the allocation hooks keep at once (an LRU map's slots:
/// 24 bytes of value each).
pub const ALLOC_THREAD_SLOTS: u32 = 16_384;

/// Virtual threads whose unmounts are tracked at once (their sampling and open wait;
/// `profiler-ebpf/src/virtual_waits.rs`), and carriers (their unmount under way, their last
/// mount).
pub const VIRTUAL_WAIT_SLOTS: u32 = 32_768;
pub const VIRTUAL_CARRIER_SLOTS: u32 = 4_096;

/// The bytes of one unit of an allocation record's `weight` (a HotSpot heap word).
pub const ALLOC_WEIGHT_UNIT: u64 = 8;

/// Size of the allocation sample ring when allocation profiling is on (a power of two). The
/// allocation budget (`budget`) lets one user fill a quarter of it per drain.
pub const ALLOC_RING_BYTES: u32 = 4 << 20;

crate::labelled_enum! {
    /// What a Java thread was doing in the JVM when it left the CPU, from its
    /// `JavaThread::_thread_state` (for off-CPU records).
    pub enum JavaState: u8, from_u8 {
        /// Not a Java thread, or its state could not be read.
        Unknown = 0 => "unknown",
        /// In native code: JNI, and the JDK's blocking I/O (sockets, files).
        InNative = 1 => "in_native",
        /// In the VM's own code.
        InVm = 2 => "in_vm",
        /// Blocked by the VM, but neither on a monitor's entry nor in `Object.wait`:
        /// `LockSupport.park`, `Thread.sleep`, safepoints.
        Blocked = 3 => "blocked",
        /// Running Java code (preempted), or between two states.
        InJava = 4 => "in_java",
        /// Blocked waiting to enter a contended monitor (`synchronized`): its
        /// `_current_pending_monitor` is set (off-CPU records only).
        MonitorEnter = 5 => "monitor_enter",
        /// Blocked in `Object.wait`: its `_current_waiting_monitor` is set (off-CPU records only).
        MonitorWait = 6 => "monitor_wait",
    }
}

/// [`SampleHeader::weight`] of an off-CPU switch sampled for sure: probabilities are in units of
/// 2^-`OFF_CPU_PROBABILITY_BITS`.
pub const OFF_CPU_PROBABILITY_BITS: u32 = 24;
pub const OFF_CPU_PROBABILITY_ONE: u32 = 1 << OFF_CPU_PROBABILITY_BITS;

/// Whether a wait of a thread whose likely cycle is `likely_cycle` (shorter than `period`) is
/// sampled by `draw` (uniform below [`OFF_CPU_PROBABILITY_ONE`]), and if so with which
/// probability (in units of 2^-[`OFF_CPU_PROBABILITY_BITS`]): `likely_cycle / period`, at
/// least one unit, taken when the draw is below it. The test is a product, not the quotient:
/// the off-CPU program runs at every context switch of the host and nearly every switch is not
/// sampled, so the division is paid only by the sampled ones. The caller keeps
/// `likely_cycle < period`, and the daemon's period is at most 10 s (under 2^34 ns): no
/// product overflows.
#[inline(always)]
pub fn off_cpu_draw(likely_cycle: u64, period: u64, draw: u32) -> Option<u32> {
    let scaled = likely_cycle << OFF_CPU_PROBABILITY_BITS;
    // draw < max(1, scaled / period), without the quotient: (draw + 1) * period <= scaled.
    if draw != 0 && (draw as u64 + 1) * period > scaled {
        return None;
    }
    Some(((scaled / period) as u32).max(1))
}

/// The next of a per-CPU sequence of draws for [`off_cpu_draw`], from its `state` (xorshift64*:
/// three shifts and a multiply, where the kernel's generator costs a helper call on every
/// context switch of the host). `state` must start non-zero (a seed from the kernel's
/// generator), and stays so. The draws need only be independent of the waits they decide:
/// nobody outside the kernel sees the state.
#[inline(always)]
pub fn next_off_cpu_draw(state: &mut u64) -> u32 {
    let mut x = *state;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    ((x.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 32) as u32) & (OFF_CPU_PROBABILITY_ONE - 1)
}

/// The end of a sampled wait, sent when the thread is back on a CPU: the off-CPU ring carries
/// these and [`SampleKind::OffCpu`] sample records, told apart by length (an `OffCpuEnd` is
/// shorter than any sample header). The ring keeps the order in which they were written, and
/// a thread's wait starts on one CPU before it can end on any, so its end always follows its
/// stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuEnd {
    /// The `ktime_ns` of the wait's stack record: with `tid`, which wait ended.
    pub out_ktime_ns: u64,
    /// From leaving the CPU to being woken (0 for a thread that was preempted: it never
    /// waited for anything but a CPU).
    pub blocked_ns: u64,
    /// From being woken (or preempted) to running again: the run-queue delay.
    pub runqueue_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// For a wait to enter a monitor: when the whole wait began (its first block off the CPU;
    /// a thread woken without the monitor blocks again, and each block is a wait of its own
    /// here), and how long the whole wait had lasted when this block began (0 for its first).
    /// 0 and 0 for any other wait.
    pub monitor_wait_start_ns: u64,
    pub monitor_wait_before_ns: u64,
}

pub const OFF_CPU_END_BYTES: usize = core::mem::size_of::<OffCpuEnd>();

/// The native-endian word at `at` of a ring record (0 past its end).
fn word_at(bytes: &[u8], at: usize) -> u64 {
    let word = bytes.get(at..at + 8).and_then(|b| b.try_into().ok());
    u64::from_ne_bytes(word.unwrap_or([0; 8]))
}

/// The native-endian 32-bit value at `at` of a ring record (0 past its end).
fn half_at(bytes: &[u8], at: usize) -> u32 {
    let half = bytes.get(at..at + 4).and_then(|b| b.try_into().ok());
    u32::from_ne_bytes(half.unwrap_or([0; 4]))
}
const _: () = assert!(OFF_CPU_END_BYTES == 48 && OFF_CPU_END_BYTES < HEADER_BYTES);

/// The end of a virtual thread's wait, sent when it is mounted again (or the withdrawal of its
/// stack, when its unmount failed): the off-CPU ring carries these too, told apart by length.
/// A virtual thread's wait is its record's with the same `tid` (the carrier it unmounted from)
/// and `ktime_ns`: its carrier has waits of its own, and unmounts other virtual threads.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VirtualWaitEnd {
    pub out_ktime_ns: u64,
    /// From the unmount to the mount (the virtual thread's wait for a free carrier included).
    pub blocked_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// [`sample_flags`]: [`sample_flags::VIRTUAL_THREAD`], with
    /// [`sample_flags::UNMOUNT_FAILED`] for a withdrawal.
    pub flags: u32,
    pub _reserved: u32,
}

pub const VIRTUAL_WAIT_END_BYTES: usize = core::mem::size_of::<VirtualWaitEnd>();
const _: () = assert!(VIRTUAL_WAIT_END_BYTES == 32);

impl VirtualWaitEnd {
    /// The end in a ring record, if the record has its size.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != VIRTUAL_WAIT_END_BYTES {
            return None;
        }
        let (word, half) = (|at| word_at(bytes, at), |at| half_at(bytes, at));
        Some(Self {
            out_ktime_ns: word(0),
            blocked_ns: word(8),
            pid: half(16),
            tid: half(20),
            flags: half(24),
            _reserved: 0,
        })
    }

    /// The wait as an off-CPU end: all of it blocked (a virtual thread's run-queue delay, its
    /// wait for a carrier, is not told apart).
    pub fn as_off_cpu_end(&self) -> OffCpuEnd {
        OffCpuEnd {
            out_ktime_ns: self.out_ktime_ns,
            blocked_ns: self.blocked_ns,
            runqueue_ns: 0,
            pid: self.pid,
            tid: self.tid,
            monitor_wait_start_ns: 0,
            monitor_wait_before_ns: 0,
        }
    }
}

impl OffCpuEnd {
    /// The end in a ring record, if the record has its size.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != OFF_CPU_END_BYTES {
            return None;
        }
        let (word, half) = (|at| word_at(bytes, at), |at| half_at(bytes, at));
        Some(Self {
            out_ktime_ns: word(0),
            blocked_ns: word(8),
            runqueue_ns: word(16),
            pid: half(24),
            tid: half(28),
            monitor_wait_start_ns: word(32),
            monitor_wait_before_ns: word(40),
        })
    }
}

/// What the off-CPU programs keep per thread, in its task storage.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OffCpuThread {
    /// When it last left the CPU: from it, the length of each run-and-wait cycle. On its run
    /// queue's clock where the daemon found the kernel's run-queue account, else on the
    /// kernel's monotonic clock (the other times here and in the records).
    pub last_out_ns: u64,
    /// A moving average of its cycles (each weighs 1/8): with the cycle just ended, it sets the
    /// probability that this switch is sampled.
    pub average_cycle_ns: u64,
    /// When the wait whose stack was sent started; 0 when no sampled wait is open.
    pub sampled_out_ns: u64,
    /// When that wait was woken; 0 until then (and for a preempted thread).
    pub woken_ns: u64,
    pub pid: u32,
    pub tid: u32,
    /// The monitor the thread's open monitor wait is for (0: none, or lock waits not
    /// tracked), when that wait's first block began, and when the thread last came back on a
    /// CPU in it (the wait's end so far).
    pub monitor: u64,
    pub monitor_wait_start_ns: u64,
    pub monitor_wait_last_in_ns: u64,
}

/// Size of the off-CPU ring buffer when off-CPU profiling is on (a power of two).
pub const OFF_CPU_RING_BYTES: u32 = 4 << 20;
/// Bound on waits the daemon keeps open at once (one per thread off CPU whose switch was
/// sampled).
pub const MAX_OPEN_OFF_CPU_WAITS: u32 = 65_536;
/// The `sched_switch` `prev_state` bit of a task that is exiting: its last switch is no wait.
pub const TASK_DEAD: u32 = 0x80;

/// One user-space frame as the BPF unwinder found it: 16 bytes, so that a 200-frame stack is
/// 3.2 KB of the record, not 4.8 (the ring's copy of a record was about a seventh of the BPF
/// time of a deep Java stack's sample).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UserFrame {
    /// The frame's address ([`UserFrame::addr`]) in the low 56 bits, its [`FrameKind`] in the
    /// top byte: user addresses are below 2^56 even with 5-level page tables.
    addr_and_kind: u64,
    /// Kind-specific detail (unused for native frames).
    pub aux: u32,
    /// Kind-specific validation cookie (unused for native frames).
    pub cookie: u32,
}

/// The bits of [`UserFrame::addr_and_kind`] that hold the address.
const FRAME_ADDR_MASK: u64 = (1 << 56) - 1;

impl UserFrame {
    /// A frame of `kind` at `addr` (an address above the user range loses its top byte: it
    /// names nothing).
    pub const fn new(kind: FrameKind, addr: u64, aux: u32, cookie: u32) -> Self {
        Self {
            addr_and_kind: (addr & FRAME_ADDR_MASK) | (kind as u64) << 56,
            aux,
            cookie,
        }
    }

    /// For [`FrameKind::Native`]: the instruction pointer (frame 0) or return address
    /// (others); for the other kinds, the address their documentation says.
    #[inline(always)]
    pub const fn addr(&self) -> u64 {
        self.addr_and_kind & FRAME_ADDR_MASK
    }

    /// What produced it (`None`: a value this build does not know, from a newer BPF side).
    #[inline(always)]
    pub const fn kind(&self) -> Option<FrameKind> {
        FrameKind::from_u8(self.kind_byte())
    }

    /// Its [`FrameKind`] as recorded.
    #[inline(always)]
    pub const fn kind_byte(&self) -> u8 {
        (self.addr_and_kind >> 56) as u8
    }
}

/// The per-CPU scratch record the BPF program fills before copying its used prefix to the
/// ring buffer. Kernel and user frames share `frames` so the record stays contiguous: kernel
/// ips first, user frames right after them.
#[repr(C)]
pub struct SampleRecord {
    pub header: SampleHeader,
    pub frames: [u8; FRAMES_BYTES],
}

pub const HEADER_BYTES: usize = core::mem::size_of::<SampleHeader>();
pub const KERNEL_FRAME_BYTES: usize = core::mem::size_of::<u64>();
pub const USER_FRAME_BYTES: usize = core::mem::size_of::<UserFrame>();
pub const FRAMES_BYTES: usize =
    MAX_KERNEL_FRAMES * KERNEL_FRAME_BYTES + MAX_USER_FRAMES * USER_FRAME_BYTES;
pub const RECORD_BYTES: usize = core::mem::size_of::<SampleRecord>();

// The layout is the contract: pin it.
const _: () = assert!(HEADER_BYTES == 64);
const _: () = assert!(USER_FRAME_BYTES == 16);
const _: () = assert!(
    RECORD_BYTES < 32 * 1024,
    "per-CPU array values are limited to 32 KiB"
);

/// Most code heaps per JVM described to the BPF side (HotSpot uses 1, or 3 when segmented).
pub const MAX_CODE_HEAPS: usize = 4;
/// A Java thread described to the BPF side (the `JAVA_THREADS` map: host tid -> this): its
/// `JavaThread*` and the host pid of the JVM whose thread list named it, or whose thread
/// started it. The walk uses it only for a thread of that very process, so a tid reused by
/// another process, or claimed by a process it does not belong to, never lends that process's
/// thread state to another's stack.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct JavaThreadEntry {
    pub java_thread: u64,
    pub pid: u32,
    /// Who wrote it: [`JAVA_THREAD_FROM_LIST`] or [`JAVA_THREAD_FROM_START`].
    pub origin: u32,
}

/// [`JavaThreadEntry::origin`]: the daemon, from the JVM's thread list.
pub const JAVA_THREAD_FROM_LIST: u32 = 0;
/// [`JavaThreadEntry::origin`]: the BPF thread-start hook, in the thread itself as it started
/// (counted in the `JAVA_THREADS_STARTED` map's entry of its JVM until it exits).
pub const JAVA_THREAD_FROM_START: u32 = 1;

/// Bound on Java threads (host tid -> [`JavaThreadEntry`]) described to the BPF side, over all JVMs.
pub const MAX_JAVA_THREADS: u32 = 65_536;
/// Java threads described per JVM named with `--pid`, and most a JVM's thread-start hook may
/// describe at once (the `JAVA_THREADS_STARTED` count).
pub const JAVA_THREADS_PER_TARGET: u32 = 16_384;

/// Size of the BPF map of Java threads (set at load time): [`MAX_JAVA_THREADS`] for the whole
/// host, [`JAVA_THREADS_PER_TARGET`] per pid with `--pid`. A bound on its entries, not memory
/// set aside: the map is not preallocated.
pub const fn java_thread_slots(target_pids: usize) -> u32 {
    if target_pids == 0 {
        return MAX_JAVA_THREADS;
    }
    let slots = (target_pids as u64).saturating_mul(JAVA_THREADS_PER_TARGET as u64);
    if slots > MAX_JAVA_THREADS as u64 {
        MAX_JAVA_THREADS
    } else {
        slots as u32
    }
}
/// Default bound on JVMs described to the BPF side (the `HOTSPOT_PROCS` map size).
pub const DEFAULT_MAX_JVMS: u32 = 256;

/// One code heap of a JVM: its reserved range and segment map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeHeapRange {
    pub low: u64,
    pub high: u64,
    /// One byte per segment; see HotSpot's `CodeHeap::find_start`.
    pub segmap: u64,
    pub log2_segment_size: u32,
    pub _reserved: u32,
}

/// Flags of [`HotspotProc::flags`].
pub mod hotspot_flags {
    /// `CodeBlob` holds a 32-bit `_code_offset` (from the blob) instead of a `_code_begin` pointer.
    pub const CODE_OFFSET: u8 = 1 << 0;
    /// `CodeBlob::_frame_complete_offset` is 16 bits wide (else 32).
    pub const FRAME_COMPLETE_16: u8 = 1 << 1;
    /// `HeapBlock::Header::_used` is 32 bits wide (else 8: a bool).
    pub const HEAP_BLOCK_USED_32: u8 = 1 << 2;
    /// The nmethod's deopt handler is a 32-bit offset from the nmethod (JDK 23+), not a pointer.
    pub const DEOPT_HANDLER_OFFSET: u8 = 1 << 3;
    /// The nmethod's verified entry point is a 16-bit offset from its code (JDK 23+), not a
    /// pointer.
    pub const VERIFIED_ENTRY_OFFSET: u8 = 1 << 4;
    /// HotSpot's allocation sampler (before JDK 25) starts each thread with no bytes to go
    /// until its next sample: a thread's first allocation it checks is always reported, and
    /// only the reports after it are the random draws the weights assume.
    pub const SAMPLER_TAKES_FIRST: u8 = 1 << 5;
    /// Java heap references are 32-bit compressed oops (`UseCompressedOops`): decoded as
    /// `HotspotProc::narrow_oop_base + (narrow << narrow_oop_shift)`.
    pub const COMPRESSED_OOPS: u8 = 1 << 6;
    /// Java heap references are generational ZGC's coloured pointers: the address is the
    /// pointer shifted right past its colour bits, by 13 to 16 as its remapped bit (bits 12 to
    /// 15) says.
    pub const ZGC_COLORED_OOPS: u8 = 1 << 7;
}

/// The daemon's uprobes one JVM can have: the thread-start hook, the two allocation hooks,
/// the thread-exit hook and the code-free hook ([`BREAKPOINT_THREAD_START`],
/// [`BREAKPOINT_ALLOC`], [`BREAKPOINT_THREAD_EXIT`], [`BREAKPOINT_CODE_FREE`]).
pub const MAX_BREAKPOINTS: usize = 5;
/// Index of the thread-start hook in [`HotspotProc::breakpoints`].
pub const BREAKPOINT_THREAD_START: usize = 0;
/// Indexes of the allocation hooks (in a new TLAB, outside any) in [`HotspotProc::breakpoints`].
pub const BREAKPOINT_ALLOC: [usize; 2] = [1, 2];
/// Index of the thread-exit hook in [`HotspotProc::breakpoints`].
pub const BREAKPOINT_THREAD_EXIT: usize = 3;
/// Index of the code-free hook in [`HotspotProc::breakpoints`].
pub const BREAKPOINT_CODE_FREE: usize = 4;

/// A JVM's count of the code blobs it freed, kept by the code-free hook
/// (`profiler-ebpf/src/code_frees.rs`) while `counting` is non-zero: a blob the walk remembers
/// needs no proof read while the count is the one it was proven at. Key: host pid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CodeFreeCount {
    /// Goes up by [`CODE_FREE_STEP`] at each free, and by [`CODE_FREE_RESTART`] when counting
    /// starts again after a pause: always even, never back to a value of an earlier count.
    pub count: u32,
    /// Non-zero while the hook is attached in the JVM's libjvm (the daemon clears it before it
    /// detaches the hook).
    pub counting: u32,
    /// The JVM's [`HotspotProc::instance`]: a count the daemon kept for an earlier process of
    /// the same pid never stands for this one.
    pub instance: u32,
    pub _reserved: u32,
}

/// What a free adds to [`CodeFreeCount::count`]: counts stay even, so that an odd stamp (a
/// blob remembered while frees were not counted) never matches one.
pub const CODE_FREE_STEP: u32 = 2;
/// What a new start of counting adds to [`CodeFreeCount::count`]: the frees missed while the
/// hook was away are many fewer.
pub const CODE_FREE_RESTART: u32 = 1 << 24;

/// The bytes a JVM's ended threads allocated, added up by the thread-exit hook
/// (`profiler-ebpf/src/thread_exit.rs`) for a JVM that does not count them itself (before JDK
/// 14, no `ThreadService::_exited_allocated_bytes`). The daemon writes the offsets, the hook
/// adds to `exited_bytes`. Key: host pid.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitedAllocation {
    /// From a `JavaThread*`: `Thread::_allocated_bytes` (its retired TLABs and the objects
    /// outside any), and its TLAB's `_start` and `_top`.
    pub allocated_bytes_offset: u32,
    pub tlab_start_offset: u32,
    pub tlab_top_offset: u32,
    pub _reserved: u32,
    /// What the threads that ended since the entry was written allocated.
    pub exited_bytes: u64,
}

/// What the BPF unwinder needs to know about one JVM process: where its code is and how its
/// frames and code blobs are laid out. Written by the daemon (key: host pid) once the VM has
/// initialised; removed when the process exits.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HotspotProc {
    /// `CodeCache::_low_bound` / `_high_bound`: every code heap is inside.
    pub code_low: u64,
    pub code_high: u64,
    /// The template interpreter's code.
    pub interpreter_low: u64,
    pub interpreter_high: u64,
    /// `StubRoutines::_call_stub_return_address`: the boundary back into native code.
    pub call_stub_return: u64,
    /// Where the daemon's uprobes sit in this process (the allocation hooks; 0: none). A thread
    /// caught in the kernel's handling of one, before the kernel sets its pc back to the
    /// breakpoint, has its pc one byte past it, and the probed instruction has not run.
    pub breakpoints: [u64; MAX_BREAKPOINTS],
    pub heaps: [CodeHeapRange; MAX_CODE_HEAPS],
    pub heap_count: u8,
    /// `hotspot_flags` bits.
    pub flags: u8,
    /// Interpreter frame slots and the entry frame's call-wrapper slot, in words from fp.
    pub interpreter_method_slot: i8,
    pub interpreter_bcp_slot: i8,
    pub entry_frame_call_wrapper_slot: i8,
    /// `JavaThreadState` values (VMStructs constants) of a thread outside Java code, whose
    /// `JavaFrameAnchor` is then valid: in native code, in the VM, blocked.
    pub thread_in_native: u8,
    pub thread_in_vm: u8,
    pub thread_blocked: u8,
    /// Byte offsets (see HotSpot's VMStructs for each name).
    pub heap_block_size: u16,
    pub heap_block_used: u16,
    pub blob_size: u16,
    pub blob_frame_size: u16,
    pub blob_frame_complete: u16,
    pub blob_code: u16,
    pub nmethod_compile_id: u16,
    pub nmethod_method: u16,
    pub method_const_method: u16,
    pub java_thread_anchor: u16,
    pub java_thread_state: u16,
    pub anchor_sp: u16,
    pub anchor_pc: u16,
    pub anchor_fp: u16,
    pub call_wrapper_anchor: u16,
    /// `sizeof(ConstMethod)`: bytecodes follow it.
    pub const_method_size: u16,
    pub const_method_code_size: u16,
    /// `_deopt_handler_begin` (pointer) or `_deopt_handler_offset` (see `DEOPT_HANDLER_OFFSET`).
    pub nmethod_deopt_handler: u16,
    /// Where a deoptimized frame keeps its original pc: `[sp + _orig_pc_offset]`.
    pub nmethod_orig_pc_offset: u16,
    /// The path from a `ConstMethod` to its class's name, for [`interpreted_cookie`]:
    /// `ConstMethod::_constants`, `ConstantPool::_pool_holder`, `Klass::_name`.
    pub const_method_constants: u16,
    pub constant_pool_holder: u16,
    pub klass_name: u16,
    /// Offset in a `Symbol` of the 32-bit word whose upper half is its hash (random, set when
    /// the symbol is made), or [`NO_SYMBOL_HASH`].
    pub symbol_hash_word: u16,
    /// Offsets in a `Symbol` of its 16-bit length and of its bytes, for the name's tail.
    pub symbol_length: u16,
    pub symbol_body: u16,
    /// `JavaThread::_current_pending_monitor` and `_current_waiting_monitor`: the monitor a
    /// blocked thread waits to enter, or waits on in `Object.wait` (`u16::MAX`: not in this
    /// JVM's VMStructs).
    pub java_thread_pending_monitor: u16,
    pub java_thread_waiting_monitor: u16,
    /// `nmethod::_verified_entry_point` (pointer) or `_verified_entry_offset` (see
    /// `VERIFIED_ENTRY_OFFSET`): where the prologue starts, to decode it when a sample lands
    /// there. `u16::MAX` if the layout has neither.
    pub nmethod_verified_entry: u16,
    /// `Thread::_allocated_bytes`: the bytes the thread allocated, its current TLAB's but
    /// (counted when the TLAB is retired), what an allocation sample weighs the difference of.
    /// `u16::MAX` if the layout has none.
    pub thread_allocated_bytes: u16,
    /// Where a `java.lang.Class` object keeps its `Klass*` (the value of
    /// `java_lang_Class::_klass_offset`, read from the JVM's memory): the class of an object
    /// the JVM's allocation sampler reports, from the mirror JVMTI hands over. `u16::MAX` if
    /// unknown.
    pub class_mirror_klass: u16,
    /// Tells this JVM from every other the daemon pushed (a new number for each JVM it makes
    /// ready, never 0): what the walker's code blobs remembered across samples are tagged with,
    /// where a pid would be reused by the next JVM.
    pub instance: u32,
    /// Virtual threads (JDK 21+; all zero, and the walker leaves frozen frames alone, when the
    /// JVM has none or the daemon could not read them): a mounted virtual thread's oldest
    /// frames may still be frozen in its stack chunks on the Java heap; see
    /// docs/virtual-threads.md.
    pub frozen: FrozenFramesLayout,
}

/// What the walker needs to follow a mounted virtual thread's frames into its stack chunks:
/// the return barrier that marks where they start, how to reach the chunks from the carrier
/// thread, and the chunk object's fields. Offsets in bytes; `sp`, `bottom` and `size` count
/// words from `chunk_stack`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrozenFramesLayout {
    /// `StubRoutines::_cont_returnBarrier`: the return address of the oldest thawed frame
    /// while older ones stay frozen (0: no virtual-thread walking for this JVM).
    pub return_barrier: u64,
    /// `ContinuationEntry::_return_pc`: a pc inside `enterSpecial`, where the walk resumes on
    /// the carrier once every chunk is walked (0 until the JVM generated it: the walk then
    /// resumes at enterSpecial's caller).
    pub entry_return_pc: u64,
    /// `CompressedOops::_base` (with `hotspot_flags::COMPRESSED_OOPS`).
    pub narrow_oop_base: u64,
    /// `JavaThread::_cont_entry`: the innermost mounted continuation's entry.
    pub java_thread_cont_entry: u16,
    /// `jdk.internal.vm.Continuation.tail`: its newest chunk.
    pub continuation_tail: u16,
    /// `jdk.internal.vm.StackChunk` fields.
    pub chunk_parent: u16,
    pub chunk_size: u16,
    pub chunk_sp: u16,
    pub chunk_bottom: u16,
    pub chunk_pc: u16,
    pub chunk_cont: u16,
    /// Where a chunk's frames start (`InstanceStackChunkKlass::_offset_of_stack`).
    pub chunk_stack: u16,
    /// `CompressedOops::_shift`.
    pub narrow_oop_shift: u8,
    pub _reserved: u8,
    /// `java.lang.Thread.tid`: a virtual thread's id, which its waits are keyed by.
    pub thread_tid: u16,
    /// `JavaThread::_vthread` and `_threadObj` (`OopHandle`s): the thread object current on
    /// the carrier (the virtual thread while mounted) and the carrier's own.
    pub java_thread_vthread: u16,
    pub java_thread_thread_obj: u16,
    pub _reserved_tail: [u16; 3],
}

/// The cookie of an allocated class's name ([`FrameKind::AllocatedClass`]): its `Symbol*`, the
/// symbol's random hash and the name's tail, mixed as in [`interpreted_cookie`], so that a
/// symbol freed with its class and another made at its address later do not match.
pub const fn class_name_cookie(symbol: u64, name_hash_word: u32, name_tail: [u64; 2]) -> u32 {
    interpreted_cookie(symbol, name_hash_word, name_tail)
}

/// [`HotspotProc::symbol_hash_word`] when the layout has no such word.
pub const NO_SYMBOL_HASH: u16 = u16::MAX;

/// The cookie of an interpreted frame: what distinguishes a method from another one that later
/// took the same `Method*`. Same-shape classes of a reloaded generation reuse the very same
/// metaspace addresses for `Method` and `ConstMethod`, so the cookie also takes in their class's
/// name: the 16-bit random hash of its `Symbol` (new for every symbol made, even at a reused
/// address) and the name's last bytes (where generated names differ: `$$Lambda+0x...`,
/// `$Proxy12`, `GeneratedMethodAccessor7`). The hash alone was not enough: a class reloaded
/// hundreds of times meets a colliding 16-bit hash (the birthday bound), and a cached name
/// of an earlier generation then matched. All of it is mixed, not XORed, so that a difference
/// in any part changes the whole 32 bits. The daemon recomputes it from memory to verify a
/// name.
pub const fn interpreted_cookie(
    const_method: u64,
    name_hash_word: u32,
    name_tail: [u64; 2],
) -> u32 {
    let mut h = mix(0, const_method);
    h = mix(h, (name_hash_word & 0xffff_0000) as u64);
    h = mix(h, name_tail[0]);
    h = mix(h, name_tail[1]);
    ((h >> 32) ^ h) as u32
}

/// One multiply-rotate round (as in FxHash): cheap in BPF and spreads every input bit.
const fn mix(hash: u64, word: u64) -> u64 {
    (hash.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95)
}

/// How many of a class name's last bytes enter [`interpreted_cookie`].
pub const NAME_TAIL_BYTES: usize = 16;

/// Where the bytes for [`name_tail`] start within a name of `len` bytes: its last
/// [`NAME_TAIL_BYTES`], or all of it from the start when it is shorter.
pub const fn name_tail_start(len: u16) -> u64 {
    len.saturating_sub(NAME_TAIL_BYTES as u16) as u64
}

/// The tail of a name of `len` bytes from the [`NAME_TAIL_BYTES`] read at
/// [`name_tail_start`], as two words; bytes past the name's end (read when it is short) are
/// zeroed, so that whatever follows the symbol in memory does not matter.
pub const fn name_tail(bytes: [u8; NAME_TAIL_BYTES], len: u16) -> [u64; 2] {
    let lo = u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ]);
    let hi = u64::from_le_bytes([
        bytes[8], bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15],
    ]);
    let kept = if len as usize > NAME_TAIL_BYTES {
        NAME_TAIL_BYTES as u32
    } else {
        len as u32
    };
    [
        lo & low_bytes_mask(kept),
        hi & low_bytes_mask(kept.saturating_sub(8)),
    ]
}

/// A mask of the low `bytes` bytes of a word (all of it from 8).
const fn low_bytes_mask(bytes: u32) -> u64 {
    if bytes >= 8 {
        u64::MAX
    } else {
        (1u64 << (bytes * 8)) - 1
    }
}

#[cfg(test)]
mod cookie_tests {
    use super::*;

    fn tail_of(name: &[u8]) -> [u64; 2] {
        let start = name_tail_start(name.len() as u16) as usize;
        let mut bytes = [0xaa; NAME_TAIL_BYTES];
        for (slot, byte) in bytes.iter_mut().zip(&name[start..]) {
            *slot = *byte;
        }
        name_tail(bytes, name.len() as u16)
    }

    #[test]
    fn short_names_ignore_what_follows_them() {
        let mut garbage = [0x55; NAME_TAIL_BYTES];
        garbage[..3].copy_from_slice(b"Foo");
        assert_eq!(name_tail(garbage, 3), tail_of(b"Foo"));
        assert_eq!(tail_of(b"Foo")[1], 0);
    }

    #[test]
    fn generations_that_share_memory_and_hash_still_get_different_cookies() {
        let cm = 0x7f00_1234_5678;
        let hash = 0xbeef_0003;
        let a = interpreted_cookie(cm, hash, tail_of(b"NameChurn$G0223Inner"));
        let b = interpreted_cookie(cm, hash, tail_of(b"NameChurn$G0263Inner"));
        assert_ne!(a, b);
        // The refcount half of the hash word does not count; the hash half does.
        let same = interpreted_cookie(cm, 0xbeef_0009, tail_of(b"NameChurn$G0223Inner"));
        assert_eq!(a, same);
        let other_hash = interpreted_cookie(cm, 0xbeee_0003, tail_of(b"NameChurn$G0223Inner"));
        assert_ne!(a, other_hash);
    }

    #[test]
    fn the_tail_is_the_last_bytes_of_a_long_name() {
        let name = b"java/lang/invoke/LambdaForm$MH+0x00007f0001234567";
        let tail = tail_of(name);
        let mut expected = [0u8; NAME_TAIL_BYTES];
        expected.copy_from_slice(&name[name.len() - NAME_TAIL_BYTES..]);
        assert_eq!(tail, name_tail(expected, name.len() as u16));
    }
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain old data.
    unsafe impl aya::Pod for super::HotspotProc {}
    // SAFETY: plain old data, its padding explicit.
    unsafe impl aya::Pod for super::JavaThreadEntry {}
    // SAFETY: plain old data, its padding explicit.
    unsafe impl aya::Pod for super::ExitedAllocation {}
    // SAFETY: plain old data without padding.
    unsafe impl aya::Pod for super::CodeFreeCount {}
    // SAFETY: plain old data, no padding the kernel could leave uninitialised that we rely on.
    unsafe impl aya::Pod for super::SampleHeader {}
    unsafe impl aya::Pod for super::UserFrame {}
    // SAFETY: plain old data without padding (sizes are multiples of their alignment).
    unsafe impl aya::Pod for super::cfi::CfiProcess {}
    unsafe impl aya::Pod for super::cfi::CfiTableIndex {}
    unsafe impl aya::Pod for super::cfi::CfiBlock {}
    // SAFETY: plain old data without padding.
    unsafe impl aya::Pod for super::budget::EmitBudget {}
    // SAFETY: arrays of integers.
    unsafe impl aya::Pod for super::kernel_names::KernelNameQuery {}
    unsafe impl aya::Pod for super::kernel_names::KernelNameAnswer {}
}

#[cfg(test)]
mod off_cpu_draw_tests {
    extern crate std;
    use super::*;
    use std::vec;

    /// The rule as a quotient: the probability, and a draw below it.
    fn by_quotient(likely_cycle: u64, period: u64, draw: u32) -> Option<u32> {
        let probability = (((likely_cycle << OFF_CPU_PROBABILITY_BITS) / period) as u32).max(1);
        (draw < probability).then_some(probability)
    }

    #[test]
    fn the_product_test_takes_the_same_draws_as_the_quotient() {
        let periods = [1, 7, 1_000, 5_000_000, 9_999_999_999, 10_000_000_000];
        let mut state = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for period in periods {
            let mut cycles = vec![0, 1, period / 2, period - 1];
            cycles.extend((0..200).map(|_| next() % period));
            for cycle in cycles {
                // A draw of 0 is always taken: the probability is at least one unit.
                let Some(probability) = by_quotient(cycle, period, 0) else {
                    panic!("cycle {cycle}, period {period}: a draw of 0 not taken");
                };
                let mut draws = vec![0, 1, OFF_CPU_PROBABILITY_ONE - 1];
                draws.extend([probability - 1, probability, probability + 1]);
                draws.extend((0..50).map(|_| next() as u32 & (OFF_CPU_PROBABILITY_ONE - 1)));
                for draw in draws.into_iter().filter(|&d| d < OFF_CPU_PROBABILITY_ONE) {
                    assert_eq!(
                        off_cpu_draw(cycle, period, draw),
                        by_quotient(cycle, period, draw),
                        "cycle {cycle}, period {period}, draw {draw}"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod off_cpu_draw_sequence_tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    /// The share of `draws` under `probability` units, against that probability.
    fn taken_share(draws: impl Iterator<Item = u32>, probability: u32) -> f64 {
        let (mut taken, mut all) = (0u64, 0u64);
        for draw in draws {
            taken += u64::from(draw < probability);
            all += 1;
        }
        taken as f64 / all as f64
    }

    #[test]
    fn draws_take_each_probability_as_often_as_it_says() {
        let mut state = 1;
        let draws: Vec<u32> = (0..400_000)
            .map(|_| next_off_cpu_draw(&mut state))
            .collect();
        assert_ne!(state, 0);
        assert!(draws.iter().all(|&d| d < OFF_CPU_PROBABILITY_ONE));
        for share in [0.5, 0.1, 0.01, 0.002] {
            let probability = (share * f64::from(OFF_CPU_PROBABILITY_ONE)) as u32;
            // Every draw, and every other one (two threads taking turns on a CPU share its
            // sequence): within 5 standard deviations of the share.
            let tolerance = |n: f64| 5.0 * (share * (1.0 - share) / n).sqrt();
            let all = taken_share(draws.iter().copied(), probability);
            assert!((all - share).abs() < tolerance(4e5), "{share}: {all}");
            let every_other = taken_share(draws.iter().step_by(2).copied(), probability);
            assert!(
                (every_other - share).abs() < tolerance(2e5),
                "{share}: {every_other}"
            );
            // Two decisions in a row are independent: both taken as often as the square.
            let pairs = draws
                .windows(2)
                .filter(|w| w[0] < probability && w[1] < probability)
                .count() as f64
                / (draws.len() - 1) as f64;
            let both = share * share;
            assert!(
                (pairs - both).abs() < 5.0 * (both / 4e5).sqrt() + 1e-5,
                "{share}: {pairs}"
            );
        }
    }
}

#[cfg(test)]
mod map_size_tests {
    use super::*;

    #[test]
    fn maps_are_sized_for_the_node_and_targets() {
        assert_eq!(sample_ring_bytes(2, 99), MIN_SAMPLE_RING_BYTES);
        // 64 CPUs at 99 Hz fill 6.5 MB a second.
        assert_eq!(sample_ring_bytes(64, 99), 8 << 20);
        assert_eq!(sample_ring_bytes(128, 99), 16 << 20);
        assert_eq!(sample_ring_bytes(128, 999), MAX_SAMPLE_RING_BYTES);
        assert_eq!(sample_ring_bytes(u32::MAX, u64::MAX), MAX_SAMPLE_RING_BYTES);
        assert_eq!(java_thread_slots(0), MAX_JAVA_THREADS);
        assert_eq!(java_thread_slots(1), JAVA_THREADS_PER_TARGET);
        assert_eq!(java_thread_slots(1000), MAX_JAVA_THREADS);
        for (cpus, hz) in [(1, 1), (3, 250), (48, 497), (96, 1000)] {
            let bytes = sample_ring_bytes(cpus, hz);
            assert!(bytes.is_power_of_two(), "{cpus} CPUs at {hz} Hz: {bytes}");
            assert!(u64::from(bytes) >= (u64::from(cpus) * hz * 1024).min(64 << 20));
        }
    }
}

#[cfg(test)]
mod user_frame_tests {
    use super::*;

    #[test]
    fn every_kind_and_user_address_comes_back_as_written() {
        let kinds = [
            FrameKind::Native,
            FrameKind::Interpreted,
            FrameKind::Compiled,
            FrameKind::AllocatedClass,
        ];
        // The lowest and highest user addresses with 5-level page tables, and typical ones.
        let addresses = [0, 1, 0x5555_5555_4000, 0x7fff_ffff_f000, (1 << 56) - 1];
        for kind in kinds {
            for addr in addresses {
                let frame = UserFrame::new(kind, addr, 7, 9);
                assert_eq!(frame.kind(), Some(kind));
                assert_eq!(frame.addr(), addr);
                assert_eq!((frame.aux, frame.cookie), (7, 9));
            }
        }
    }

    #[test]
    fn an_address_above_the_user_range_never_changes_the_kind() {
        let frame = UserFrame::new(FrameKind::Native, u64::MAX, 0, 0);
        assert_eq!(frame.kind(), Some(FrameKind::Native));
        assert_eq!(frame.addr(), (1 << 56) - 1);
    }
}
