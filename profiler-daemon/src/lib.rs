//! The profiler daemon: loads the eBPF sampler, folds samples per process, symbolizes them and
//! writes pprof profiles.

pub mod aggregate;
pub mod alloc;
pub mod config;
pub mod config_error;
#[cfg(test)]
mod config_reference;
pub mod container;
pub mod daemon;
pub mod export;
pub mod frame_kind;
pub mod hotspot;
pub mod identity;
pub mod java_names;
pub mod jvm_info;
pub mod kernel_btf;
pub mod kernel_check;
pub mod kernel_features;
pub mod kubernetes;
pub mod lock;
pub mod metrics;
pub mod native_unwind;
pub mod off_cpu;
pub mod output;
pub mod own_memory;
pub mod pprof;
pub mod printable;
pub mod privileges;
pub mod proc_status;
pub mod process;
pub mod process_key;
pub mod profiles;
pub mod record;
pub mod resolved_frame;
pub mod sampler;
pub mod secret_hash;
pub mod sidecar;
pub mod sink;
pub mod stack_memory;
pub mod subscribe;
pub mod symbolize;
pub mod thread_roots;
pub mod untrusted;
pub mod user_time;
pub mod vdso;
pub mod worker;
