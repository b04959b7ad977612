//! Loads the eBPF sampling program, attaches it to a CPU-clock perf event on every online CPU,
//! and hands out what it records: sample records from the ring buffer and its counters.

pub mod kernel_names;
pub mod metrics;

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf};
use aya::programs::perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent};
use aya::programs::{BtfTracePoint, PerfEvent, RawTracePoint, UProbe};
use aya::{Btf, Ebpf, EbpfLoader};
use profiler_common::budget::{EmitBudget, Producer, PRODUCERS};
use profiler_common::Counter;

use crate::hotspot::code_frees::CodeFreeCounts;
use crate::hotspot::libjvm_hooks::{
    HookPrograms, ALLOC_PROGRAMS, CODE_FREE_PROGRAM, THREAD_EXIT_PROGRAM, THREAD_START_PROGRAM,
    VIRTUAL_THREAD_PROGRAMS,
};
use crate::hotspot::thread_exits::ExitCounts;
use crate::hotspot::tracker::BpfMaps;
use crate::kernel_btf::KernelBtf;
use crate::kernel_features::BpfObject;
use crate::native_unwind::loader::BpfTableMaps;
use kernel_names::KernelNameProgram;

/// The objects built from `profiler-ebpf` by build.rs: the default one and the compat one (see
/// `kernel_features`).
static DEFAULT_OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler"));
static COMPAT_OBJECT: &[u8] =
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/profiler-compat"));

/// Entries of the compat object's preallocated maps, whose memory is taken at start whether
/// used or not (the default object's grow with their entries): each bound holds a busy node's
/// processes with tables, distinct files and threads with off-CPU state.
const COMPAT_CFI_PROCESSES: u32 = 1024;
const COMPAT_CFI_TABLES: u32 = 1024;
const COMPAT_OFF_CPU_THREADS: u32 = 32_768;

/// The process-event programs (`profiler-ebpf/src/process_events.rs`) and their tracepoints.
const PROCESS_EVENT_PROGRAMS: [(&str, &str); 2] = [
    ("process_exec", "sched_process_exec"),
    ("process_exit", "sched_process_exit"),
];

/// The off-CPU programs (`profiler-ebpf/src/off_cpu.rs`) and the scheduler tracepoints they
/// attach to.
const OFF_CPU_PROGRAMS: [(&str, &str); 2] = [
    ("off_cpu_switch", "sched_switch"),
    (WAKEUP_PROGRAM, "sched_wakeup"),
];

/// The off-CPU program that marks wake-ups, where the kernel's run-queue account is not known.
const WAKEUP_PROGRAM: &str = "off_cpu_wakeup";

/// The smallest ring the kernel takes (a page): what the off-CPU ring is sized to when off-CPU
/// profiling is off, so it costs nothing.
const UNUSED_RING_BYTES: u32 = 4096;

/// Off-CPU profiling, when on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OffCpuSampling {
    /// A thread's switches are sampled about once per this much of its time (see
    /// `profiler-ebpf/src/off_cpu.rs`).
    pub period_ns: u64,
    /// Whether monitor waits are followed across their blocks (lock profiles).
    pub monitor_waits: bool,
    /// Whether virtual threads' unmounts and mounts are hooked
    /// (`profiler-ebpf/src/virtual_waits.rs`).
    pub virtual_thread_waits: bool,
}

/// Allocation profiling, when on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AllocSampling {
    /// About one sample per this many bytes allocated (see `profiler-ebpf/src/alloc.rs`).
    pub interval_bytes: u64,
    /// The sidecar agent library, whose allocation sampler callback gets the `alloc_sampled`
    /// program (JVMs that load this very file, by the daemon's attach or `-agentpath`).
    pub agent: Option<std::path::PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum SamplerError {
    #[error("reading the kernel's BTF (off-CPU profiling needs it): {0}")]
    Btf(#[from] aya::BtfError),
    #[error("loading the BPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("BPF program `{name}`: {source}")]
    Program {
        name: &'static str,
        source: aya::programs::ProgramError,
    },
    #[error("BPF map `{name}`: {source}")]
    Map {
        name: &'static str,
        source: aya::maps::MapError,
    },
    #[error("BPF program `{name}`: duplicating its descriptor: {source}")]
    Descriptor {
        name: &'static str,
        source: std::io::Error,
    },
    #[error("BPF map `{0}` is missing from the object")]
    MissingMap(&'static str),
    #[error("BPF program `{0}` is missing from the object")]
    MissingProgram(&'static str),
    #[error("listing online CPUs ({path}): {source}")]
    OnlineCpus {
        path: &'static str,
        source: std::io::Error,
    },
    #[error("the compat BPF object needs the kernel's BTF: {0}")]
    KernelBtf(#[from] crate::kernel_btf::BtfError),
    #[error("attaching to the CPU-clock perf event of CPU {cpu}: {source}")]
    Attach {
        cpu: u32,
        source: aya::programs::ProgramError,
    },
}

impl SamplerError {
    /// Whether the kernel refused for lack of privileges (EPERM / EACCES somewhere in the chain).
    pub fn is_permission_denied(&self) -> bool {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(self);
        while let Some(err) = source {
            if let Some(io) = err.downcast_ref::<std::io::Error>() {
                if matches!(io.raw_os_error(), Some(libc::EPERM) | Some(libc::EACCES)) {
                    return true;
                }
            }
            source = err.source();
        }
        false
    }
}

/// Counter values summed over CPUs, indexed like [`Counter`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelCounters(pub [u64; Counter::COUNT]);

impl Default for KernelCounters {
    fn default() -> Self {
        Self([0; Counter::COUNT])
    }
}

impl KernelCounters {
    pub fn get(&self, counter: Counter) -> u64 {
        self.0[counter as usize]
    }

    /// What was counted since `earlier`.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut delta = *self;
        for (value, before) in delta.0.iter_mut().zip(earlier.0) {
            *value = value.saturating_sub(before);
        }
        delta
    }
}

pub struct Sampler {
    // Keeps the program and its perf-event links alive.
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    /// Off-CPU waits' stacks and ends, when off-CPU profiling is on.
    off_cpu: Option<RingBuf<MapData>>,
    /// Sampled allocations, when allocation profiling is on.
    alloc_ring: Option<RingBuf<MapData>>,
    counters: PerCpuArray<MapData, u64>,
    /// The online CPUs, each sampled by a perf event of its own once sampling starts.
    cpus: Vec<u32>,
    frequency_hz: u64,
    /// Whether the allocation programs are loaded.
    alloc: bool,
    /// Whether the virtual threads' programs are loaded.
    virtual_thread_waits: bool,
    /// The kernel's own symbol lookup, where the kernel lets the program load (5.13+).
    kernel_names: Option<KernelNameProgram>,
}

/// What the object is loaded with: its globals and map sizes.
struct ObjectSettings {
    filter: u8,
    ring_bytes: u32,
    ring_wakeup_bytes: u64,
    off_cpu_period_ns: u64,
    off_cpu_ring_bytes: u32,
    off_cpu: bool,
    /// Virtual threads' waits hooked (their maps sized).
    virtual_thread_waits: bool,
    /// 1 with lock profiles: `TRACK_MONITOR_WAITS`.
    monitor_waits: u64,
    alloc_interval: u64,
    alloc_ring_bytes: u32,
    budgets: [EmitBudget; PRODUCERS],
    max_jvms: u32,
    cfi_blocks: u32,
    java_threads: u32,
    /// Slots of the allocation hooks' per-thread counters (1 without `--alloc`).
    alloc_threads: u32,
    /// Where the off-CPU programs read a task's run-queue account, if the kernel has one.
    run_queue: Option<RunQueueOffsets>,
    /// Where the switch program reads the leaving thread's ids, if found.
    task_ids: Option<TaskIdOffsets>,
}

/// Whether the running kernel's BTF says where the scheduler keeps its run-queue account
/// (`profiler-daemon check`).
pub fn run_queue_account_known() -> bool {
    RunQueueOffsets::of_running_kernel().is_some()
}

/// Where a task's scheduler account of its run-queue wait is (`profiler-ebpf/src/task_fields.rs`,
/// `queued_for`): `task_struct.sched_info.last_queued`, `task_struct.se.cfs_rq`, `cfs_rq.rq`
/// and `rq.clock`, byte offsets from the kernel's BTF.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RunQueueOffsets([u64; 4]);

impl RunQueueOffsets {
    /// From the running kernel's BTF; `None` if any is missing (a kernel without
    /// `CONFIG_SCHED_INFO` or `CONFIG_FAIR_GROUP_SCHED`): the wake-up program is used then.
    fn of_running_kernel() -> Option<Self> {
        let btf = KernelBtf::from_sys_fs().ok()?;
        let at = |structure: &str, member: &str| btf.member_offset(structure, member).ok();
        Some(Self([
            u64::from(at("task_struct", "sched_info")? + at("sched_info", "last_queued")?),
            u64::from(at("task_struct", "se")? + at("sched_entity", "cfs_rq")?),
            u64::from(at("cfs_rq", "rq")?),
            u64::from(at("rq", "clock")?),
        ]))
    }
}

/// Where a task's process and thread ids are (`profiler-ebpf/src/task_fields.rs`, `ids_of`):
/// `task_struct.tgid` and `task_struct.pid`, byte offsets from the kernel's BTF. Without them
/// the switch program asks a helper, about 6 ns more per context switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct TaskIdOffsets([u64; 2]);

impl TaskIdOffsets {
    fn of_running_kernel() -> Option<Self> {
        let btf = KernelBtf::from_sys_fs().ok()?;
        let at = |member: &str| btf.member_offset("task_struct", member).ok();
        Some(Self([u64::from(at("tgid")?), u64::from(at("pid")?)]))
    }
}

/// The program on the sidecar agent's allocation sampler callback (`profiler-ebpf/src/alloc.rs`).
const ALLOC_SAMPLED_PROGRAM: &str = "alloc_sampled";
/// That callback's exported name in the agent library (`profiler-jvmti/src/agent.rs`).
const AGENT_SAMPLER_CALLBACK: &str = "jvm_profiler_sampled_object_alloc";

/// Attaches `program` to the agent library's sampler callback, for every process that maps
/// the file: one uprobe whatever the number of JVMs. Without it (an agent copied into a
/// container's `/tmp` is another file), allocations are weighed by the TLAB events.
fn attach_to_agent(program: &mut UProbe, agent: &std::path::Path) {
    use aya::programs::uprobe::{UProbeAttachLocation, UProbeScope};
    match program.attach(
        UProbeAttachLocation::Symbol(AGENT_SAMPLER_CALLBACK),
        agent,
        UProbeScope::AllProcesses,
    ) {
        Ok(_) => tracing::info!(
            agent = %agent.display(),
            "allocation profiling: HotSpot's sampler is used in JVMs that load this agent"
        ),
        Err(err) => tracing::warn!(
            agent = %agent.display(),
            %err,
            "allocation profiling: cannot hook the agent's sampler callback; TLAB events weigh \
             every JVM's allocations"
        ),
    }
}

/// Creates the object's maps (programs are loaded one by one afterwards).
/// The CPU sampler's program in `ebpf`.
fn sample_cpu_program(ebpf: &mut Ebpf) -> Result<&mut PerfEvent, SamplerError> {
    ebpf.program_mut("sample_cpu")
        .ok_or(SamplerError::MissingProgram("sample_cpu"))?
        .try_into()
        .map_err(|source| SamplerError::Program {
            name: "sample_cpu",
            source,
        })
}

fn load_object(object: BpfObject, settings: &ObjectSettings) -> Result<Ebpf, SamplerError> {
    let task_offsets;
    let run_queue = settings.run_queue.map_or([0; 4], |offsets| offsets.0);
    let task_ids = settings.task_ids.map_or([0; 2], |offsets| offsets.0);
    let mut loader = EbpfLoader::new();
    loader
        // The off-CPU programs' task storage, which aya has no userspace type for (the
        // daemon never reads it).
        .allow_unsupported_maps()
        .override_global("FILTER_PIDS", &settings.filter, true)
        .override_global("RING_WAKEUP_BYTES", &settings.ring_wakeup_bytes, true)
        .override_global("OFF_CPU_PERIOD_NS", &settings.off_cpu_period_ns, true)
        .override_global("TRACK_MONITOR_WAITS", &settings.monitor_waits, true)
        .override_global("ALLOC_INTERVAL", &settings.alloc_interval, true)
        .override_global("EMIT_BUDGETS", &settings.budgets, true)
        .override_global("TASK_LAST_QUEUED_OFFSET", &run_queue[0], true)
        .override_global("TASK_CFS_RQ_OFFSET", &run_queue[1], true)
        .override_global("CFS_RQ_RQ_OFFSET", &run_queue[2], true)
        .override_global("RQ_CLOCK_OFFSET", &run_queue[3], true)
        .override_global("TASK_TGID_OFFSET", &task_ids[0], true)
        .override_global("TASK_PID_OFFSET", &task_ids[1], true)
        .map_max_entries("OFF_CPU_EVENTS", settings.off_cpu_ring_bytes)
        .map_max_entries("ALLOC_SAMPLES", settings.alloc_ring_bytes)
        .map_max_entries("HOTSPOT_PROCS", settings.max_jvms)
        .map_max_entries("JAVA_THREADS_STARTED", settings.max_jvms)
        .map_max_entries("EXITED_ALLOCATIONS", settings.max_jvms)
        .map_max_entries("CODE_FREES", settings.max_jvms)
        .map_max_entries("SAMPLES", settings.ring_bytes)
        .map_max_entries("CFI_BLOCKS", settings.cfi_blocks)
        .map_max_entries("JAVA_THREADS", settings.java_threads)
        .map_max_entries("ALLOC_THREADS", settings.alloc_threads)
        .map_max_entries("SAMPLER_THREADS", settings.alloc_threads);
    // Virtual threads' waits ride on the off-CPU programs' ring and settings.
    let (virtual_waits, carriers) = if settings.virtual_thread_waits {
        (
            profiler_common::VIRTUAL_WAIT_SLOTS,
            profiler_common::VIRTUAL_CARRIER_SLOTS,
        )
    } else {
        (1, 1)
    };
    loader
        .map_max_entries("VIRTUAL_WAITS", virtual_waits)
        .map_max_entries("UNMOUNTING", carriers)
        .map_max_entries("MOUNTED", carriers);
    let bytes = match object {
        BpfObject::Default => DEFAULT_OBJECT,
        BpfObject::Compat => {
            let btf = KernelBtf::from_sys_fs()?;
            let state = btf
                .member_offset("task_struct", "__state")
                .or_else(|_| btf.member_offset("task_struct", "state"))?;
            task_offsets = [
                u64::from(btf.member_offset("task_struct", "stack")?),
                u64::from(state),
            ];
            let off_cpu_threads = if settings.off_cpu {
                COMPAT_OFF_CPU_THREADS
            } else {
                1
            };
            loader
                .override_global("TASK_STACK_OFFSET", &task_offsets[0], true)
                .override_global("TASK_STATE_OFFSET", &task_offsets[1], true)
                .map_max_entries("OFF_CPU_THREADS", off_cpu_threads)
                .map_max_entries("CFI_PROCS", COMPAT_CFI_PROCESSES)
                .map_max_entries("CFI_TABLES", COMPAT_CFI_TABLES);
            COMPAT_OBJECT
        }
    };
    Ok(loader.load(bytes)?)
}

/// One program of the object, loaded (not attached) by [`check_programs`].
pub struct ProgramCheck {
    pub name: String,
    /// Why it was refused: the error and the verifier's last lines.
    pub refused: Option<String>,
    /// Refused, and the daemon does without it this way: not a failure.
    pub instead: Option<&'static str>,
}

/// Loads `object` and each of its programs without attaching any, as `run` would with every
/// profile kind on: what `profiler-daemon check` reports.
pub fn check_programs(
    object: BpfObject,
    whole_logs: bool,
) -> Result<Vec<ProgramCheck>, SamplerError> {
    let mut ebpf = load_for_check(object)?;
    let btf = Btf::from_sys_fs().ok();
    let mut checks = Vec::new();
    for (name, program) in ebpf.programs_mut() {
        let tracepoint = OFF_CPU_PROGRAMS
            .iter()
            .find(|(program, _)| *program == name)
            .map(|(_, tracepoint)| *tracepoint);
        let result = match program {
            aya::programs::Program::PerfEvent(p) => p.load(),
            aya::programs::Program::RawTracePoint(p) => p.load(),
            aya::programs::Program::UProbe(p) => p.load(),
            aya::programs::Program::BtfTracePoint(p) => match (&btf, tracepoint) {
                (Some(btf), Some(tracepoint)) => p.load(tracepoint, btf),
                _ => {
                    checks.push(ProgramCheck {
                        name: name.to_owned(),
                        refused: Some("no kernel BTF (/sys/kernel/btf/vmlinux)".to_owned()),
                        instead: None,
                    });
                    continue;
                }
            },
            _ => continue,
        };
        let refused = result.err().map(|err| {
            let text = err.to_string();
            if whole_logs {
                text
            } else {
                verifier_tail(&text)
            }
        });
        // The kernel's symbol lookup is optional: before 5.13 (no `bpf_snprintf`) the daemon
        // reads /proc/kallsyms.
        let instead = (name == kernel_names::PROGRAM && refused.is_some())
            .then_some("kernel frames are named from /proc/kallsyms");
        checks.push(ProgramCheck {
            name: name.to_owned(),
            refused,
            instead,
        });
    }
    checks.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(checks)
}

/// `object`'s maps, created as `run` would with every profile kind on (no program loaded).
fn load_for_check(object: BpfObject) -> Result<Ebpf, SamplerError> {
    load_object(
        object,
        &ObjectSettings {
            filter: 0,
            ring_bytes: profiler_common::sample_ring_bytes(1, 19),
            ring_wakeup_bytes: 4096,
            off_cpu_period_ns: 5_000_000,
            off_cpu_ring_bytes: profiler_common::OFF_CPU_RING_BYTES,
            off_cpu: true,
            virtual_thread_waits: true,
            monitor_waits: 1,
            alloc_interval: profiler_common::ALLOC_INTERVAL_BYTES,
            alloc_ring_bytes: profiler_common::ALLOC_RING_BYTES,
            budgets: emit_budgets(&EmitSettings {
                ring_bytes: profiler_common::sample_ring_bytes(1, 19),
                cpus: 1,
                frequency_hz: 19,
                alloc_interval_bytes: profiler_common::ALLOC_INTERVAL_BYTES,
                off_cpu_period_ns: 5_000_000,
            }),
            max_jvms: profiler_common::DEFAULT_MAX_JVMS,
            cfi_blocks: 16,
            java_threads: 1024,
            alloc_threads: 16,
            run_queue: RunQueueOffsets::of_running_kernel(),
            task_ids: TaskIdOffsets::of_running_kernel(),
        },
    )
}

/// An error's first line (a verifier log follows it).
pub(crate) fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// An error with the verifier's log cut to its first line and its last 25: where it stopped and
/// why.
fn verifier_tail(error: &str) -> String {
    let lines: Vec<&str> = error.lines().collect();
    if lines.len() <= 30 {
        return error.to_owned();
    }
    let mut kept = vec![lines[0], "..."];
    kept.extend(&lines[lines.len() - 25..]);
    kept.join("\n")
}

impl Sampler {
    /// Loads the sampler's programs and attaches those but the CPU sampler's perf events
    /// ([`Self::start_sampling`]). `pids` empty means every process.
    /// `cfi_blocks` bounds the unwind tables' blocks (`native_unwind::loader::block_capacity`).
    #[allow(clippy::too_many_arguments)]
    pub fn start(
        object: BpfObject,
        frequency_hz: u64,
        pids: &[u32],
        max_jvms: u32,
        cfi_blocks: u32,
        off_cpu: Option<OffCpuSampling>,
        alloc: Option<AllocSampling>,
    ) -> Result<Self, SamplerError> {
        let filter: u8 = u8::from(!pids.is_empty());
        let cpus = aya::util::online_cpus()
            .map_err(|(path, source)| SamplerError::OnlineCpus { path, source })?;
        let ring_bytes = profiler_common::sample_ring_bytes(cpus.len() as u32, frequency_hz);
        let ring_wakeup_bytes = u64::from(ring_bytes / 4);
        let off_cpu_period_ns = off_cpu.map_or(1, |o| o.period_ns.max(1));
        let alloc_interval = alloc
            .as_ref()
            .map_or(profiler_common::ALLOC_INTERVAL_BYTES, |a| {
                a.interval_bytes.max(1)
            });
        let off_cpu_ring_bytes = match off_cpu {
            Some(_) => profiler_common::OFF_CPU_RING_BYTES,
            None => UNUSED_RING_BYTES,
        };
        let alloc_ring_bytes = match alloc {
            Some(_) => profiler_common::ALLOC_RING_BYTES,
            None => UNUSED_RING_BYTES,
        };
        let run_queue = off_cpu.and_then(|_| RunQueueOffsets::of_running_kernel());
        let task_ids = off_cpu.and_then(|_| TaskIdOffsets::of_running_kernel());
        if off_cpu.is_some() && task_ids.is_none() {
            tracing::warn!(
                "off-CPU profiling: the kernel's BTF does not say where a task's ids are \
                 (task_struct.tgid, .pid): each switch asks a helper instead, and the 5.10 \
                 object cannot find the state of a thread switched in, so its waits never end"
            );
        }
        let mut ebpf = load_object(
            object,
            &ObjectSettings {
                filter,
                ring_bytes,
                ring_wakeup_bytes,
                off_cpu_period_ns,
                off_cpu_ring_bytes,
                off_cpu: off_cpu.is_some(),
                virtual_thread_waits: off_cpu.is_some_and(|o| o.virtual_thread_waits),
                monitor_waits: u64::from(off_cpu.is_some_and(|o| o.monitor_waits)),
                alloc_interval,
                alloc_ring_bytes,
                budgets: emit_budgets(&EmitSettings {
                    ring_bytes,
                    cpus: cpus.len() as u64,
                    frequency_hz,
                    alloc_interval_bytes: alloc_interval,
                    off_cpu_period_ns,
                }),
                max_jvms,
                cfi_blocks,
                java_threads: profiler_common::java_thread_slots(pids.len()),
                alloc_threads: if alloc.is_some() {
                    profiler_common::ALLOC_THREAD_SLOTS
                } else {
                    1
                },
                run_queue,
                task_ids,
            },
        )?;
        tracing::debug!(ring_bytes, cpus = cpus.len(), "sample ring sized");

        if !pids.is_empty() {
            let map = ebpf
                .map_mut("TARGET_PIDS")
                .ok_or(SamplerError::MissingMap("TARGET_PIDS"))?;
            let mut targets: BpfHashMap<_, u32, u8> =
                BpfHashMap::try_from(map).map_err(|source| SamplerError::Map {
                    name: "TARGET_PIDS",
                    source,
                })?;
            for &pid in pids {
                targets
                    .insert(pid, 1, 0)
                    .map_err(|source| SamplerError::Map {
                        name: "TARGET_PIDS",
                        source,
                    })?;
            }
        }

        sample_cpu_program(&mut ebpf)?
            .load()
            .map_err(|source| SamplerError::Program {
                name: "sample_cpu",
                source,
            })?;

        // Process events feed the JVM tracker when it watches the whole host (with `--pid` the
        // programs send none), and drop unwind tables of processes that exec or exit.
        for (name, tracepoint) in PROCESS_EVENT_PROGRAMS {
            let program: &mut RawTracePoint = ebpf
                .program_mut(name)
                .ok_or(SamplerError::MissingProgram(name))?
                .try_into()
                .map_err(|source| SamplerError::Program { name, source })?;
            program
                .load()
                .map_err(|source| SamplerError::Program { name, source })?;
            program
                .attach(tracepoint)
                .map_err(|source| SamplerError::Program { name, source })?;
        }

        let virtual_thread_waits = off_cpu.is_some_and(|o| o.virtual_thread_waits);
        let off_cpu = match off_cpu {
            Some(_) => {
                let btf = Btf::from_sys_fs()?;
                if run_queue.is_none() {
                    tracing::info!(
                        "off-CPU: no run-queue account in the kernel's BTF; a program on \
                         sched_wakeup marks wake-ups"
                    );
                }
                // With the scheduler's own account, no program needs to run at each wake-up.
                let wanted = OFF_CPU_PROGRAMS
                    .into_iter()
                    .filter(|(name, _)| run_queue.is_none() || *name != WAKEUP_PROGRAM);
                for (name, tracepoint) in wanted {
                    let program: &mut BtfTracePoint = ebpf
                        .program_mut(name)
                        .ok_or(SamplerError::MissingProgram(name))?
                        .try_into()
                        .map_err(|source| SamplerError::Program { name, source })?;
                    program
                        .load(tracepoint, &btf)
                        .map_err(|source| SamplerError::Program { name, source })?;
                    program
                        .attach()
                        .map_err(|source| SamplerError::Program { name, source })?;
                }
                // Loaded now, attached to each libjvm file as JVMs are found.
                for name in VIRTUAL_THREAD_PROGRAMS
                    .iter()
                    .filter(|_| virtual_thread_waits)
                {
                    uprobe(&mut ebpf, name)?
                        .load()
                        .map_err(|source| SamplerError::Program { name, source })?;
                }
                Some(take_map(&mut ebpf, "OFF_CPU_EVENTS")?)
            }
            None => None,
        };

        // Loaded now, attached to each libjvm file as JVMs are found (`HookPrograms::attach`).
        for name in [THREAD_START_PROGRAM, CODE_FREE_PROGRAM] {
            uprobe(&mut ebpf, name)?
                .load()
                .map_err(|source| SamplerError::Program { name, source })?;
        }
        let alloc_ring = match &alloc {
            Some(alloc) => {
                for name in ALLOC_PROGRAMS.into_iter().chain([THREAD_EXIT_PROGRAM]) {
                    uprobe(&mut ebpf, name)?
                        .load()
                        .map_err(|source| SamplerError::Program { name, source })?;
                }
                let sampled = uprobe(&mut ebpf, ALLOC_SAMPLED_PROGRAM)?;
                sampled.load().map_err(|source| SamplerError::Program {
                    name: ALLOC_SAMPLED_PROGRAM,
                    source,
                })?;
                if let Some(agent) = alloc.agent.as_deref().filter(|agent| agent.exists()) {
                    attach_to_agent(sampled, agent);
                }
                Some(take_map(&mut ebpf, "ALLOC_SAMPLES")?)
            }
            None => None,
        };

        // Without it, kernel frames are named from /proc/kallsyms.
        let kernel_names = match KernelNameProgram::load(&mut ebpf) {
            Ok(program) => Some(program),
            Err(err) => {
                tracing::info!(
                    err = first_line(&err.to_string()),
                    "kernel frames are named from /proc/kallsyms (the kernel_names program needs \
                     bpf_snprintf, Linux 5.13)"
                );
                None
            }
        };
        let ring = take_map(&mut ebpf, "SAMPLES")?;
        let counters = take_map(&mut ebpf, "COUNTERS")?;
        Ok(Self {
            ebpf,
            ring,
            off_cpu,
            alloc_ring,
            counters,
            cpus,
            frequency_hz,
            alloc: alloc.is_some(),
            virtual_thread_waits,
            kernel_names,
        })
    }

    /// Starts sampling every CPU: the CPU sampler's perf events, attached only now, after every
    /// other program loaded and once the JVM tracker has had the time to push the layouts of
    /// the JVMs already running (see `daemon::run`). A sample of a JVM taken before its layout
    /// is in the map walks its compiled code as native code: its stack is one bogus frame.
    pub fn start_sampling(&mut self) -> Result<(), SamplerError> {
        let frequency_hz = self.frequency_hz;
        let program = sample_cpu_program(&mut self.ebpf)?;
        for &cpu in &self.cpus {
            program
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu },
                    SamplePolicy::Frequency(frequency_hz),
                    false,
                )
                .map_err(|source| SamplerError::Attach { cpu, source })?;
        }
        Ok(())
    }

    /// The kernel's own symbol lookup, if it loaded (can be taken once).
    pub fn take_kernel_names(&mut self) -> Option<KernelNameProgram> {
        self.kernel_names.take()
    }

    /// Handles of the loaded hook programs, for whoever attaches them to libjvm files (the JVM
    /// tracker's `LibjvmHooks`): the thread-start one, and the allocation ones with `--alloc`.
    /// Each handle owns its links, so hooks can be attached and released on that thread, and
    /// outlive this sampler.
    pub fn hook_programs(&self) -> Result<HookPrograms, SamplerError> {
        let handle = |name: &'static str| {
            let program = match self.ebpf.program(name) {
                Some(aya::programs::Program::UProbe(program)) => program,
                _ => return Err(SamplerError::MissingProgram(name)),
            };
            let info = program
                .info()
                .map_err(|source| SamplerError::Program { name, source })?;
            // SAFETY: the kind given is the loaded program's own (an entry uprobe).
            unsafe { UProbe::from_program_info(info, name.into(), program.kind()) }
                .map_err(|source| SamplerError::Program { name, source })
        };
        let alloc = if self.alloc {
            Some((
                [handle(ALLOC_PROGRAMS[0])?, handle(ALLOC_PROGRAMS[1])?],
                handle(THREAD_EXIT_PROGRAM)?,
            ))
        } else {
            None
        };
        let virtual_threads = if self.virtual_thread_waits {
            Some([
                handle(VIRTUAL_THREAD_PROGRAMS[0])?,
                handle(VIRTUAL_THREAD_PROGRAMS[1])?,
                handle(VIRTUAL_THREAD_PROGRAMS[2])?,
            ])
        } else {
            None
        };
        Ok(HookPrograms::new(
            (handle(THREAD_START_PROGRAM)?, handle(CODE_FREE_PROGRAM)?),
            alloc,
            virtual_threads,
        ))
    }

    /// The maps of per-JVM layouts and Java threads, and with `--alloc` the ended threads'
    /// counts, for the JVM tracker (can be taken once).
    pub fn take_hotspot_maps(&mut self) -> Result<BpfMaps, SamplerError> {
        let procs = take_map(&mut self.ebpf, "HOTSPOT_PROCS")?;
        let threads = take_map(&mut self.ebpf, "JAVA_THREADS")?;
        let exits = if self.alloc {
            Some(ExitCounts::new(take_map(
                &mut self.ebpf,
                "EXITED_ALLOCATIONS",
            )?))
        } else {
            None
        };
        Ok(BpfMaps {
            procs,
            threads,
            exits,
        })
    }

    /// The JVMs' counts of code frees, for the libjvm hooks' owner (can be taken once).
    pub fn take_code_frees(&mut self) -> Result<CodeFreeCounts, SamplerError> {
        Ok(CodeFreeCounts::new(take_map(&mut self.ebpf, "CODE_FREES")?))
    }

    /// The native unwind tables' maps, for their loader (can be taken once).
    pub fn take_unwind_maps(&mut self) -> Result<BpfTableMaps, SamplerError> {
        Ok(BpfTableMaps {
            procs: take_map(&mut self.ebpf, "CFI_PROCS")?,
            tables: take_map(&mut self.ebpf, "CFI_TABLES")?,
            blocks: take_map(&mut self.ebpf, "CFI_BLOCKS")?,
        })
    }

    /// The ring buffer of process events (exec, exit), for the JVM tracker (can be taken once;
    /// it stays empty with `--pid`).
    pub fn take_process_events(&mut self) -> Result<RingBuf<MapData>, SamplerError> {
        take_map(&mut self.ebpf, "PROCESS_EVENTS")
    }

    pub fn cpus(&self) -> usize {
        self.cpus.len()
    }

    /// Second descriptors of the rings, to wait on: each turns readable when the BPF side wakes
    /// us because that ring is filling up (a quarter of it).
    pub fn ring_wakeups(&self) -> std::io::Result<RingWakeups> {
        use std::os::fd::AsFd;
        let clone = |ring: &RingBuf<MapData>| ring.as_fd().try_clone_to_owned();
        Ok(RingWakeups {
            samples: clone(&self.ring)?,
            alloc: self.alloc_ring.as_ref().map(clone).transpose()?,
            off_cpu: self.off_cpu.as_ref().map(clone).transpose()?,
        })
    }

    /// Passes every record waiting in the allocation ring to `consume`.
    pub fn drain_alloc(&mut self, consume: impl FnMut(&[u8])) -> usize {
        self.alloc_ring
            .as_mut()
            .map_or(0, |ring| drain_records(ring, consume))
    }

    /// Passes every record waiting in the ring buffer to `consume`. The BPF side does not wake
    /// us per sample; the caller drains on a timer (and on the ring's wake-ups when it fills),
    /// so a batch costs no syscall per sample.
    pub fn drain(&mut self, consume: impl FnMut(&[u8])) -> usize {
        drain_records(&mut self.ring, consume)
    }

    /// Whether off-CPU profiling is on.
    pub fn off_cpu(&self) -> bool {
        self.off_cpu.is_some()
    }

    /// Passes every record waiting in the off-CPU ring to `consume`, in order (a wait's stack,
    /// a wait's end: see `profiler_common::OffCpuEnd`).
    pub fn drain_off_cpu(&mut self, consume: impl FnMut(&[u8])) -> usize {
        self.off_cpu
            .as_mut()
            .map_or(0, |ring| drain_records(ring, consume))
    }

    pub fn counters(&self) -> KernelCounters {
        let mut totals = KernelCounters::default();
        for counter in Counter::ALL {
            if let Ok(values) = self.counters.get(&(counter as u32), 0) {
                totals.0[counter as usize] = values.iter().sum();
            }
        }
        totals
    }
}

/// Passes every record waiting in `ring` to `consume`; returns how many.
fn drain_records(ring: &mut RingBuf<MapData>, mut consume: impl FnMut(&[u8])) -> usize {
    let mut records = 0;
    while let Some(item) = ring.next() {
        consume(&item);
        records += 1;
    }
    records
}

/// Takes the map `name` out of the object, as the type the daemon reads it with.
fn take_map<T>(ebpf: &mut Ebpf, name: &'static str) -> Result<T, SamplerError>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf.take_map(name).ok_or(SamplerError::MissingMap(name))?;
    T::try_from(map).map_err(|source| SamplerError::Map { name, source })
}

/// Descriptors that turn readable when a ring fills up (see [`Sampler::ring_wakeups`]).
pub struct RingWakeups {
    pub samples: std::os::fd::OwnedFd,
    pub alloc: Option<std::os::fd::OwnedFd>,
    pub off_cpu: Option<std::os::fd::OwnedFd>,
}

/// What the emit budgets are sized from.
pub struct EmitSettings {
    /// The CPU sample ring's size: about a second of the node's samples at 1 KiB each.
    pub ring_bytes: u32,
    pub cpus: u64,
    pub frequency_hz: u64,
    pub alloc_interval_bytes: u64,
    pub off_cpu_period_ns: u64,
}

/// What one process and one user may emit per second through each producer
/// (`profiler_common::budget`; docs/scale.md, "Emit budgets"). Rates follow what the settings
/// ask for (CPUs and frequency, the allocation sampling interval, the off-CPU period), so that
/// a normal workload never meets them; bursts are bounded by the rings, so that one user fills
/// at most half of one between two drains.
///
/// - CPU samples: records up to `CPU_UNCHARGED_RECORD_BYTES` are not charged (the clock bounds
///   them); a process may emit 8 KiB per sample a second on every CPU (a stack of 330 frames on
///   average, running everywhere), a user twice that.
/// - Allocations: 32 MiB a second per process at the default 512 KiB interval (about 8,000
///   records of 4 KB: a JVM allocating 4 GB/s, as a Clojure program does, with deep stacks),
///   more for a shorter interval, up to four times that; a user twice that.
/// - Waits: 8 MiB a second per process at the default 5 ms period (about 5,000 records of
///   1.5 KB), more for a shorter period, up to 64 MiB; a user twice that.
/// - Process events: 16 bytes each; 1,024 a second per process, 4,096 per user (a busy build
///   forks a few hundred).
pub fn emit_budgets(settings: &EmitSettings) -> [EmitBudget; PRODUCERS] {
    const MIB: u64 = 1 << 20;
    let ring = u64::from(settings.ring_bytes);
    // A rate that grows as the setting asks for more records than its default.
    let scaled = |base: u64, default: u64, setting: u64| {
        (base.saturating_mul(default) / setting.max(1)).clamp(base, (4 * base).max(64 * MIB))
    };
    let bounded = |process: u64, user: u64, ring: u64| EmitBudget {
        process_bytes_per_sec: process,
        process_burst_bytes: (process / 4).min(ring / 4),
        user_bytes_per_sec: user,
        user_burst_bytes: (user / 4).min(ring / 2),
    };
    let alloc = scaled(
        32 * MIB,
        profiler_common::ALLOC_INTERVAL_BYTES,
        settings.alloc_interval_bytes,
    );
    let off_cpu = scaled(
        8 * MIB,
        crate::off_cpu::DEFAULT_OFF_CPU_PERIOD.as_nanos() as u64,
        settings.off_cpu_period_ns,
    );
    let cpu = settings
        .cpus
        .max(1)
        .saturating_mul(settings.frequency_hz.max(1))
        .saturating_mul(8 << 10);
    let mut budgets = [EmitBudget::default(); PRODUCERS];
    budgets[Producer::Cpu as usize] = bounded(cpu, 2 * cpu, ring);
    budgets[Producer::Alloc as usize] = bounded(
        alloc,
        2 * alloc,
        u64::from(profiler_common::ALLOC_RING_BYTES),
    );
    budgets[Producer::OffCpu as usize] = bounded(
        off_cpu,
        2 * off_cpu,
        u64::from(profiler_common::OFF_CPU_RING_BYTES),
    );
    budgets[Producer::ProcessEvents as usize] = bounded(
        16 << 10,
        64 << 10,
        u64::from(profiler_common::PROCESS_EVENT_RING_BYTES),
    );
    budgets
}

/// The uprobe program `name` of the object.
fn uprobe<'a>(ebpf: &'a mut Ebpf, name: &'static str) -> Result<&'a mut UProbe, SamplerError> {
    ebpf.program_mut(name)
        .ok_or(SamplerError::MissingProgram(name))?
        .try_into()
        .map_err(|source| SamplerError::Program { name, source })
}

#[cfg(test)]
mod budget_tests {
    use super::*;

    fn settings(alloc_interval_bytes: u64, off_cpu_period_ns: u64) -> EmitSettings {
        EmitSettings {
            ring_bytes: profiler_common::sample_ring_bytes(2, 999),
            cpus: 2,
            frequency_hz: 999,
            alloc_interval_bytes,
            off_cpu_period_ns,
        }
    }

    #[test]
    fn budgets_follow_the_settings_and_bursts_the_rings() {
        let mib = |bytes: u64| bytes >> 20;
        let process = |budgets: &[EmitBudget; PRODUCERS], producer: Producer| {
            mib(budgets[producer as usize].process_bytes_per_sec)
        };
        let defaults = emit_budgets(&settings(profiler_common::ALLOC_INTERVAL_BYTES, 5_000_000));
        assert_eq!(process(&defaults, Producer::Alloc), 32);
        assert_eq!(
            mib(defaults[Producer::Alloc as usize].user_bytes_per_sec),
            64
        );
        assert_eq!(process(&defaults, Producer::OffCpu), 8);
        // A 200-frame Java stack (about 5 KB) on both CPUs at 999 Hz is within the CPU budget.
        let cpu = defaults[Producer::Cpu as usize];
        assert!(cpu.process_bytes_per_sec >= 2 * 999 * 5_000);
        assert_eq!(cpu.user_bytes_per_sec, 2 * cpu.process_bytes_per_sec);
        // A shorter interval or period asks for more records: the budget follows, up to four
        // times its base (64 MiB at least).
        let dense = emit_budgets(&settings(64 << 10, 1_000_000));
        assert_eq!(process(&dense, Producer::Alloc), 128);
        assert_eq!(process(&dense, Producer::OffCpu), 40);
        let densest = emit_budgets(&settings(1, 1));
        assert_eq!(process(&densest, Producer::Alloc), 128);
        assert_eq!(process(&densest, Producer::OffCpu), 64);
        // A sparser one never lowers it.
        let sparse = emit_budgets(&settings(64 << 20, 1_000_000_000));
        assert_eq!(process(&sparse, Producer::Alloc), 32);
        assert_eq!(process(&sparse, Producer::OffCpu), 8);
        // No user fills more than half a ring at once.
        for (producer, ring) in [
            (
                Producer::Cpu,
                u64::from(profiler_common::sample_ring_bytes(2, 999)),
            ),
            (
                Producer::Alloc,
                u64::from(profiler_common::ALLOC_RING_BYTES),
            ),
            (
                Producer::OffCpu,
                u64::from(profiler_common::OFF_CPU_RING_BYTES),
            ),
        ] {
            let budget = dense[producer as usize];
            assert!(budget.user_burst_bytes <= ring / 2, "{producer:?}");
            assert!(budget.process_burst_bytes <= budget.user_burst_bytes);
        }
    }

    /// The switch program reads the leaving thread's ids from its task: both fields are found,
    /// apart, where this kernel's BTF puts them.
    #[test]
    fn the_task_ids_are_found_in_this_kernels_btf() {
        let TaskIdOffsets([tgid, pid]) = TaskIdOffsets::of_running_kernel().expect("tgid, pid");
        assert!(tgid > 0 && pid > 0 && tgid != pid, "tgid {tgid}, pid {pid}");
    }

    /// This machine's kernel (the project's, and Debian's from 5.10) keeps the scheduler's
    /// run-queue account: the off-CPU programs read it, and no wake-up program is attached.
    #[test]
    fn the_run_queue_account_is_found_in_this_kernels_btf() {
        let offsets = RunQueueOffsets::of_running_kernel().expect("sched_info and cfs_rq.rq");
        let task_struct = KernelBtf::from_sys_fs()
            .expect("BTF")
            .member_offset("task_struct", "sched_info")
            .expect("task_struct.sched_info");
        // last_queued is inside task_struct's sched_info; the others are fields of their own.
        assert!(offsets.0[0] > u64::from(task_struct), "{offsets:?}");
        assert!(offsets.0[1] > 0 && offsets.0[3] > 0, "{offsets:?}");
    }
}
