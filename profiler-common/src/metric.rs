//! The names of the daemon's metrics (its `/metrics` endpoint), written once for the daemon that
//! serves them and the tests and bench that read them. Reason labels come from the enums that
//! count them: [`crate::Counter::name`], [`crate::UnwindEnd::name`], and the values below for
//! what only the daemon counts.

pub const BPF_SAMPLES: &str = "profiler_bpf_samples_total";
pub const BPF_SAMPLES_SENT: &str = "profiler_bpf_samples_sent_total";
/// Labelled `reason`: [`crate::Counter::Idle`], `Filtered`, `RingFull` and `ScratchMissing` by
/// their names, and [`not_profiled`]'s values.
pub const SAMPLES_NOT_PROFILED: &str = "profiler_samples_not_profiled_total";
pub const RING_WAKEUPS: &str = "profiler_ring_wakeups_total";
pub const KERNEL_STACK_FAILURES: &str = "profiler_kernel_stack_failures_total";
/// Labelled `reason`: every [`crate::UnwindEnd::name`].
pub const UNWIND_ENDS: &str = "profiler_unwind_ends_total";
pub const RECORDS: &str = "profiler_records_total";
pub const INTERVALS: &str = "profiler_intervals_total";
pub const PROFILES_WRITTEN: &str = "profiler_profiles_written_total";
pub const PROFILE_WRITE_ERRORS: &str = "profiler_profile_write_errors_total";
/// Labelled `thread`: `symbolizer`, `jvm_tracker`.
pub const THREAD_PANICS: &str = "profiler_thread_panics_total";
pub const SIDECAR_AGENTS: &str = "profiler_sidecar_agents";
pub const SIDECAR_AGENT_HEAP_BYTES: &str = "profiler_sidecar_agent_heap_bytes";
pub const SIDECAR_DROPPED_RECORDS: &str = "profiler_sidecar_dropped_records_total";
pub const UNWIND_TABLES: &str = "profiler_unwind_tables";
pub const UNWIND_TABLE_BYTES: &str = "profiler_unwind_table_bytes";
pub const UNWIND_TABLE_LIMIT_BYTES: &str = "profiler_unwind_table_limit_bytes";
pub const UNWIND_TABLE_PROCESSES: &str = "profiler_unwind_table_processes";
pub const UNWIND_TABLE_BUILDS: &str = "profiler_unwind_table_builds_total";
pub const UNWIND_TABLE_BUILD_MILLISECONDS: &str = "profiler_unwind_table_build_milliseconds_total";
pub const UNWIND_TABLE_EVICTIONS: &str = "profiler_unwind_table_evictions_total";
/// Labelled `reason`: the daemon's `NotLoaded` names.
pub const UNWIND_TABLES_NOT_LOADED: &str = "profiler_unwind_tables_not_loaded_total";
pub const SYMBOL_CACHE_BYTES: &str = "profiler_symbol_cache_bytes";
pub const SYMBOL_CACHE_LIMIT_BYTES: &str = "profiler_symbol_cache_limit_bytes";
pub const SYMBOL_CACHE_EVICTIONS: &str = "profiler_symbol_cache_evictions_total";
/// Labelled `state`: [`heap_state`]'s values.
pub const HEAP_BYTES: &str = "profiler_heap_bytes";
/// Labelled `reason`: the sidecar index's refusal reasons.
pub const SIDECAR_RECORDS_REFUSED: &str = "profiler_sidecar_records_refused";
pub const JAVA_PREFETCH_MISSES: &str = "profiler_java_prefetch_misses_total";
pub const ALLOC_PROFILES_SCALED: &str = "profiler_alloc_profiles_scaled_total";
pub const ALLOC_PROFILES_NOT_SCALED: &str = "profiler_alloc_profiles_not_scaled_total";
/// Labelled `reason`: the daemon's `UnnamedReason` names.
pub const JAVA_FRAMES_UNNAMED: &str = "profiler_java_frames_unnamed_total";
/// Labelled `reason`: the daemon's name guard's refusals (`empty`, `too_long`,
/// `bad_characters`).
pub const FRAME_NAMES_REFUSED: &str = "profiler_frame_names_refused_total";
/// Labelled `state`: [`jvm_state`]'s values.
pub const JVMS: &str = "profiler_jvms";
/// Labelled `map`: [`bpf_map`]'s values.
pub const BPF_MAP_ENTRIES: &str = "profiler_bpf_map_entries";
pub const BPF_MAP_CAPACITY: &str = "profiler_bpf_map_capacity";
pub const JAVA_THREADS_NOT_PUSHED: &str = "profiler_java_threads_not_pushed_total";
pub const JAVA_THREADS_STARTED: &str = "profiler_java_threads_started_total";
pub const JAVA_THREAD_STARTS_REFUSED: &str = "profiler_java_thread_starts_refused_total";
/// Labelled `kind`: `exec`, `exit`.
pub const PROCESS_EVENTS: &str = "profiler_process_events_total";
pub const PROCESS_EVENTS_LOST: &str = "profiler_process_events_lost_total";
/// Labelled `producer` (`cpu`, `alloc`, `off_cpu`, `process_events`) and `budget` (`process`,
/// `user`): records the BPF side refused because their process or user had spent its emit
/// budget ([`crate::budget`]).
pub const RECORDS_OVER_BUDGET: &str = "profiler_bpf_records_over_budget_total";
/// Samples (of every kind) kept in their process's `[stacks past the bound]` entry: their
/// stacks found no room in the interval's stack memory.
pub const SAMPLES_PAST_STACK_BOUND: &str = "profiler_samples_past_stack_bound_total";
/// Interval ends put off because the worker was still writing the last interval.
pub const INTERVALS_DEFERRED: &str = "profiler_intervals_deferred_total";
pub const PROC_RESCANS: &str = "profiler_proc_rescans_total";
pub const OFF_CPU_SWITCHES: &str = "profiler_off_cpu_switches_total";
pub const OFF_CPU_WAITS_SAMPLED: &str = "profiler_off_cpu_waits_sampled_total";
pub const OFF_CPU_WAITS: &str = "profiler_off_cpu_waits_total";
/// Labelled `reason`: [`crate::Counter::OffCpuRingFull`], `OffCpuNoStorage` by their names,
/// and `unmatched_end`, `filtered_short`, `over_open_bound`, `over_stack_bound`.
pub const OFF_CPU_WAITS_NOT_PROFILED: &str = "profiler_off_cpu_waits_not_profiled_total";
pub const OFF_CPU_OPEN_WAITS: &str = "profiler_off_cpu_open_waits";
pub const OFF_CPU_THREADS: &str = "profiler_off_cpu_threads";
/// Labelled `outcome`: `unmounted`, `pinned`, `unseen`.
pub const VIRTUAL_THREAD_UNMOUNTS: &str = "profiler_virtual_thread_unmounts_total";
pub const VIRTUAL_THREAD_UNMOUNTS_SAMPLED: &str = "profiler_virtual_thread_unmounts_sampled_total";
pub const VIRTUAL_THREAD_MOUNTS: &str = "profiler_virtual_thread_mounts_total";
pub const VIRTUAL_THREAD_WAITS_ENDED: &str = "profiler_virtual_thread_waits_ended_total";
pub const VIRTUAL_THREAD_STACKS_WITHDRAWN: &str = "profiler_virtual_thread_stacks_withdrawn_total";
/// Labelled `feature` and `mode`: each BPF feature the daemon probed at start, `present` or
/// `missing`, and `feature="object"` with the object loaded (`default` or `compat`); value 1.
pub const KERNEL_FEATURE: &str = "profiler_kernel_feature";
pub const ALLOC_EVENTS: &str = "profiler_alloc_events_total";
pub const ALLOC_SAMPLED: &str = "profiler_alloc_sampled_total";
/// Labelled `reason`: [`crate::Counter::AllocRingFull`], `AllocNested` by their names.
pub const ALLOC_NOT_PROFILED: &str = "profiler_alloc_not_profiled_total";
pub const ALLOC_WALKS_FROM_HOOK: &str = "profiler_alloc_walks_from_hook_total";
pub const ALLOC_THREAD_EXITS_COUNTED: &str = "profiler_alloc_thread_exits_counted_total";
pub const ALLOC_THREAD_EXITS_UNREAD: &str = "profiler_alloc_thread_exits_unread_total";
pub const ALLOC_SAMPLER_EVENTS: &str = "profiler_alloc_sampler_events_total";
pub const ALLOC_SAMPLER_FIRST_SKIPPED: &str = "profiler_alloc_sampler_first_skipped_total";
/// JVMs whose libjvm was hooked or not; labelled `hooked`: `true` or `false`.
pub const LIBJVM_HOOK_JVMS: &str = "profiler_libjvm_hook_jvms_total";
/// Libjvm files whose hooks could not be attached.
pub const LIBJVM_HOOK_ATTACH_FAILURES: &str = "profiler_libjvm_hook_attach_failures_total";
pub const LIBJVM_HOOKED_FILES: &str = "profiler_libjvm_hooked_files";
pub const LIBJVM_WAITING_FILES: &str = "profiler_libjvm_waiting_files";
pub const CPUS: &str = "profiler_cpus";
pub const FREQUENCY_HERTZ: &str = "profiler_frequency_hertz";
// The export families have one sample per remote sink, labelled `sink` (`pyroscope`).
pub const EXPORT_PROFILES: &str = "profiler_export_profiles_total";
pub const EXPORT_REQUESTS: &str = "profiler_export_requests_total";
pub const EXPORT_BYTES: &str = "profiler_export_bytes_total";
pub const EXPORT_RETRIES: &str = "profiler_export_retries_total";
/// Labelled `sink` and `reason`: [`export_dropped`]'s values.
pub const EXPORT_DROPPED_PROFILES: &str = "profiler_export_dropped_profiles_total";
pub const EXPORT_QUEUE_PROFILES: &str = "profiler_export_queue_profiles";
pub const EXPORT_QUEUE_BYTES: &str = "profiler_export_queue_bytes";
pub const STREAM_SUBSCRIBERS: &str = "profiler_stream_subscribers";
pub const STREAM_SKIPPED_PROFILES: &str = "profiler_stream_skipped_profiles_total";
/// Labelled `reason`: [`metrics_connections_closed`]'s values.
pub const METRICS_CONNECTIONS_CLOSED: &str = "profiler_metrics_connections_closed_total";

/// [`SAMPLES_NOT_PROFILED`] reasons the daemon counts (the kernel side's are
/// [`crate::Counter`] names).
pub mod not_profiled {
    /// A record the daemon could not parse.
    pub const MALFORMED: &str = "malformed";
    /// The sampling loop's queue to the symbolizing worker was full.
    pub const WORK_QUEUE_FULL: &str = "work_queue_full";
    /// A process's interval reached `max_stacks_per_interval`.
    pub const STACK_BOUND: &str = "stack_bound";
}

/// [`JVMS`] states.
pub mod jvm_state {
    /// Its layout is in the BPF map.
    pub const READY: &str = "ready";
    pub const PENDING: &str = "pending";
    pub const FAILED: &str = "failed";
    pub const OVER_BOUND: &str = "over_bound";
}

/// [`HEAP_BYTES`] states.
pub mod heap_state {
    /// Allocated by the daemon and not freed.
    pub const IN_USE: &str = "in_use";
    /// Freed, kept by the allocator.
    pub const FREE: &str = "free";
}

/// [`BPF_MAP_ENTRIES`] and [`BPF_MAP_CAPACITY`] maps.
pub mod bpf_map {
    pub const HOTSPOT_PROCS: &str = "hotspot_procs";
    pub const JAVA_THREADS: &str = "java_threads";
}

/// [`EXPORT_DROPPED_PROFILES`] reasons.
pub mod export_dropped {
    /// The export queue was at its bound.
    pub const EXPORT_QUEUE_FULL: &str = "queue_full";
    pub const SHUTDOWN: &str = "shutdown";
    pub const REJECTED: &str = "rejected";
}

/// [`METRICS_CONNECTIONS_CLOSED`] reasons: connections to `/metrics` the daemon closed itself.
pub mod metrics_connections_closed {
    /// Over the endpoint's connection limit: closed as soon as accepted.
    pub const OVER_LIMIT: &str = "over_limit";
    /// No complete request within the header timeout, or open longer than a connection may be.
    pub const TIMED_OUT: &str = "timed_out";
}
