//! Checks, before loading anything, that the daemon holds what the kernel will ask for, so that
//! a missing privilege is one clear message rather than an EPERM deep in the loader.

/// Capability numbers (linux/capability.h).
const CAP_SYS_ADMIN: u32 = 21;
const CAP_SYS_PTRACE: u32 = 19;
const CAP_PERFMON: u32 = 38;
const CAP_BPF: u32 = 39;

#[derive(Debug, thiserror::Error)]
#[error(
    "missing privileges: {missing}. Run as root, or grant CAP_BPF, CAP_PERFMON and CAP_SYS_PTRACE \
     (e.g. `setcap cap_bpf,cap_perfmon,cap_sys_ptrace,cap_dac_read_search+ep profiler-daemon`)"
)]
pub struct MissingPrivileges {
    pub missing: String,
}

/// The effective capability set of this process.
fn effective_capabilities() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| crate::proc_status::parse(&status))
        .map_or(0, |status| status.capeff)
}

fn has(caps: u64, cap: u32) -> bool {
    caps & (1 << cap) != 0
}

/// Errors if BPF programs or perf events cannot be used; warns if other processes' memory maps
/// cannot be read (their frames would stay unnamed).
pub fn check() -> Result<(), MissingPrivileges> {
    check_caps(effective_capabilities())
}

fn check_caps(caps: u64) -> Result<(), MissingPrivileges> {
    let admin = has(caps, CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !admin && !has(caps, CAP_BPF) {
        missing.push("CAP_BPF (or CAP_SYS_ADMIN) to load the BPF program");
    }
    if !admin && !has(caps, CAP_PERFMON) {
        missing.push("CAP_PERFMON (or CAP_SYS_ADMIN) to open system-wide perf events");
    }
    if !missing.is_empty() {
        return Err(MissingPrivileges {
            missing: missing.join("; "),
        });
    }
    if !has(caps, CAP_SYS_PTRACE) {
        tracing::warn!("without CAP_SYS_PTRACE, other users' processes cannot be symbolized");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_or_bpf_plus_perfmon_is_enough() {
        assert!(check_caps(1 << CAP_SYS_ADMIN).is_ok());
        assert!(check_caps((1 << CAP_BPF) | (1 << CAP_PERFMON)).is_ok());
    }

    #[test]
    fn names_what_is_missing() {
        let err = check_caps(1 << CAP_BPF)
            .expect_err("no perfmon")
            .to_string();
        assert!(
            err.contains("CAP_PERFMON") && !err.contains("CAP_BPF (or"),
            "{err}"
        );
        let err = check_caps(0).expect_err("nothing").to_string();
        assert!(
            err.contains("CAP_BPF (or CAP_SYS_ADMIN)") && err.contains("CAP_PERFMON (or"),
            "{err}"
        );
    }
}
