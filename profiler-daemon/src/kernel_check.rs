//! `profiler-daemon check`: what this node's kernel lets the daemon do, and why not where it
//! does not. The first thing to run where profiles look wrong; `run` logs the same probes at
//! start (`kernel_features::choose_object`).

use std::fmt::Write as _;

use crate::kernel_features::{choose_for, KernelFeatures};
use crate::sampler::check_programs;

/// The report, and whether every program loaded.
pub struct CheckReport {
    pub text: String,
    pub all_loaded: bool,
}

/// `whole_logs`: each refused program's whole verifier log, not its end.
pub fn check(whole_logs: bool) -> CheckReport {
    let mut text = String::new();
    let mut all_loaded = true;
    let release = read_trimmed("/proc/sys/kernel/osrelease");
    let _ = writeln!(text, "kernel: {release}");
    let _ = writeln!(
        text,
        "BTF ({}): {}",
        crate::kernel_btf::VMLINUX_BTF,
        if std::path::Path::new(crate::kernel_btf::VMLINUX_BTF).exists() {
            "present"
        } else {
            "MISSING: no off-CPU or lock profiles; the compat object cannot walk in-kernel samples' user stacks"
        }
    );
    match crate::privileges::check() {
        Ok(()) => {
            let _ = writeln!(
                text,
                "privileges: enough to load BPF programs and open perf events"
            );
        }
        Err(err) => {
            all_loaded = false;
            let _ = writeln!(text, "privileges: {err}");
        }
    }
    let _ = writeln!(text, "locked-memory limit: {}", memlock_limit());
    for (name, path, meaning) in [
        (
            "perf_event_paranoid",
            "/proc/sys/kernel/perf_event_paranoid",
            "needs CAP_PERFMON or root above 1",
        ),
        (
            "unprivileged_bpf_disabled",
            "/proc/sys/kernel/unprivileged_bpf_disabled",
            "the daemon needs CAP_BPF either way",
        ),
        (
            "perf_event_max_stack",
            "/proc/sys/kernel/perf_event_max_stack",
            "bounds the kernel frames of a sample",
        ),
    ] {
        let _ = writeln!(text, "{name}: {} ({meaning})", read_trimmed(path));
    }
    let uprobes = std::path::Path::new("/sys/bus/event_source/devices/uprobe").exists();
    let _ = writeln!(
        text,
        "uprobes: {}",
        if uprobes {
            "present"
        } else {
            "MISSING: no allocation profiles"
        }
    );

    let _ = writeln!(
        text,
        "run-queue account: {}",
        if crate::sampler::run_queue_account_known() {
            "present (off-CPU waits split without a program at wake-ups)"
        } else {
            "MISSING from BTF: off-CPU profiling attaches a program to sched_wakeup"
        }
    );

    let features = KernelFeatures::probe();
    let _ = writeln!(text, "\nBPF features:");
    for probe in &features.probes {
        let state = if probe.present { "yes" } else { "no " };
        let _ = write!(text, "  {state}  {:<24}", probe.feature.name());
        if !probe.present {
            let _ = write!(text, "  instead: {}", probe.feature.without());
        }
        text.push('\n');
    }
    let object = match choose_for(features) {
        Ok(choice) => choice.object,
        Err(err) => {
            let _ = writeln!(text, "\n{err}");
            return CheckReport {
                text,
                all_loaded: false,
            };
        }
    };
    let _ = writeln!(
        text,
        "\nBPF object: {} (programs loaded, none attached)",
        object.name()
    );
    match check_programs(object, whole_logs) {
        Ok(programs) => {
            for program in programs {
                match (program.refused, program.instead) {
                    (None, _) => {
                        let _ = writeln!(text, "  ok       {}", program.name);
                    }
                    (Some(why), Some(instead)) => {
                        let why = crate::sampler::first_line(&why);
                        let _ = writeln!(text, "  without  {}: {instead} ({why})", program.name);
                    }
                    (Some(why), None) => {
                        all_loaded = false;
                        let _ = writeln!(text, "  REFUSED  {}: {why}", program.name);
                    }
                }
            }
        }
        Err(err) => {
            all_loaded = false;
            let _ = writeln!(text, "  the object's maps could not be created: {err}");
        }
    }
    CheckReport { text, all_loaded }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|text| text.trim().to_owned())
        .unwrap_or_else(|err| format!("unreadable ({err})"))
}

/// `RLIMIT_MEMLOCK`: what BPF maps are charged against on kernels without memory-cgroup
/// accounting of BPF (before 5.11).
fn memlock_limit() -> String {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a plain struct the call fills.
    if unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut limit) } != 0 {
        return "unknown".to_owned();
    }
    let show = |value: libc::rlim_t| {
        if value == libc::RLIM_INFINITY {
            "unlimited".to_owned()
        } else {
            format!("{} KiB", value / 1024)
        }
    };
    format!(
        "{} (hard {}); kernels before 5.11 charge BPF maps to it: the systemd unit sets LimitMEMLOCK=infinity",
        show(limit.rlim_cur),
        show(limit.rlim_max)
    )
}
