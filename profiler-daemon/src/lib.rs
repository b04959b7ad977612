//! The profiler daemon: loads the eBPF sampler, folds samples per process, symbolizes them and
//! writes pprof profiles.

pub(crate) mod aggregate;
pub(crate) mod alloc;
pub(crate) mod alloc_scale;
pub(crate) mod bpf_syscall;
pub mod config;
pub(crate) mod config_error;
#[cfg(test)]
mod config_reference;
pub mod container;
pub(crate) mod daemon;
pub(crate) mod export;
pub(crate) mod frame_kind;
pub(crate) mod hotspot;
pub(crate) mod identity;
pub(crate) mod interned;
pub(crate) mod java_names;
pub(crate) mod jvm_info;
pub(crate) mod kernel_btf;
pub(crate) mod kernel_check;
pub(crate) mod kernel_features;
pub(crate) mod kubernetes;
pub(crate) mod lock;
pub(crate) mod metrics;
pub(crate) mod native_unwind;
pub(crate) mod off_cpu;
pub mod output;
pub mod own_memory;
pub mod pprof;
pub(crate) mod printable;
pub(crate) mod privileges;
pub(crate) mod proc_status;
pub(crate) mod process;
pub(crate) mod process_key;
pub mod profile_model;
pub(crate) mod profiles;
pub(crate) mod record;
pub(crate) mod remote_variant;
pub(crate) mod resolved_frame;
pub(crate) mod sampler;
pub(crate) mod secret_hash;
pub(crate) mod sidecar;
pub(crate) mod sink;
pub(crate) mod stack_memory;
pub mod subscribe;
pub(crate) mod symbolize;
#[cfg(test)]
mod test_skip;
pub(crate) mod thread_roots;
pub(crate) mod untrusted;
pub(crate) mod user_time;
pub(crate) mod vdso;
pub(crate) mod virtual_thread_roots;
pub(crate) mod worker;
pub(crate) mod worker_metrics;

/// What the command line (`main.rs`) runs, besides the modules it reads its settings and
/// outputs from (`config`, `output`, `subscribe`) and its own memory (`own_memory`).
pub mod commands {
    pub use crate::alloc::parse_bytes;
    pub use crate::daemon::run;
    pub use crate::jvm_info::{inspect as inspect_jvm, render_text as render_jvm_info};
    pub use crate::kernel_check::check as check_kernel;
    pub use crate::lock::parse_duration;
    pub use crate::native_unwind::describe as describe_unwind_tables;
    pub use crate::sidecar::attach as attach_agent;
}
