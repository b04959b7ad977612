//! What the running kernel offers the BPF programs, found by asking it (a tiny program or map
//! loaded and dropped at once), never from its version: distributions backport.
//!
//! The answer picks which of the two BPF objects the daemon loads (`BpfObject`): the default
//! one needs task storage, `bpf_get_current_task_btf`, `bpf_task_pt_regs` and non-preallocated
//! hash maps in perf-event programs (all in 6.1); the compat one needs none of them (5.10+:
//! BTF-enabled tracepoints, ring buffers, global functions).

use std::os::fd::OwnedFd;

use crate::bpf_syscall::{bpf, insn, ProgSpec, BPF_PROG_LOAD, CALL, EXIT, MOV64_IMM};

/// The BPF object to load.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum BpfObject {
    /// Kernels with everything the default object uses (6.1+).
    Default,
    /// Older kernels (5.10+): preallocated maps, per-thread state in a hash, user registers
    /// found through the kernel's BTF offsets.
    Compat,
}

impl BpfObject {
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Compat => "compat",
        }
    }
}

/// One feature the programs may use, and whether this kernel has it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub feature: Feature,
    pub present: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Feature {
    /// `/sys/kernel/btf/vmlinux`: BTF-enabled tracepoints (off-CPU) and the compat offsets.
    VmlinuxBtf,
    /// Ring buffer maps (5.8): every record the programs send.
    RingBuffer,
    /// Task storage maps (5.11): off-CPU state kept with each thread.
    TaskStorage,
    /// `bpf_get_current_task_btf` (5.11).
    CurrentTaskBtf,
    /// `bpf_task_pt_regs` (5.15): the user registers of an in-kernel sample.
    TaskPtRegs,
    /// Hash maps without preallocation in perf-event programs (6.1): map memory that follows
    /// what is in the maps.
    PerfEventNoPrealloc,
    /// `bpf_snprintf` (5.13): kernel frames named by the kernel's own symbol lookup
    /// (`sampler::kernel_names`).
    Snprintf,
    /// `bpf_loop` (5.17): not used (the walk loops over a global function), reported for
    /// those comparing with other profilers.
    BpfLoop,
}

impl Feature {
    pub fn name(self) -> &'static str {
        match self {
            Self::VmlinuxBtf => "vmlinux_btf",
            Self::RingBuffer => "ring_buffer",
            Self::TaskStorage => "task_storage",
            Self::CurrentTaskBtf => "get_current_task_btf",
            Self::TaskPtRegs => "task_pt_regs",
            Self::PerfEventNoPrealloc => "perf_event_no_prealloc",
            Self::Snprintf => "snprintf",
            Self::BpfLoop => "bpf_loop",
        }
    }

    /// What the daemon does without it.
    pub fn without(self) -> &'static str {
        match self {
            Self::VmlinuxBtf => "no off-CPU or lock profiles, and the compat object cannot find the user registers of in-kernel samples",
            Self::RingBuffer => "the BPF programs cannot load (ring buffers came in Linux 5.8)",
            Self::TaskStorage => "compat object: off-CPU state in a preallocated hash by tid",
            Self::CurrentTaskBtf | Self::TaskPtRegs => "compat object: user registers found from task_struct::stack (BTF offset)",
            Self::PerfEventNoPrealloc => "compat object: preallocated maps, sized small (memory taken at start)",
            Self::Snprintf => "kernel frames are named from /proc/kallsyms, read once (the kernel takes about 60 ms to write it; the daemon keeps it, a few MB)",
            Self::BpfLoop => "none (not used)",
        }
    }
}

/// The features of the running kernel.
#[derive(Clone, Debug)]
pub struct KernelFeatures {
    pub probes: Vec<Probe>,
}

impl KernelFeatures {
    /// Asks the kernel. Needs the privileges to load BPF programs; a probe that cannot run
    /// reports its feature missing.
    pub fn probe() -> Self {
        let probes = [
            (
                Feature::VmlinuxBtf,
                std::path::Path::new(crate::kernel_btf::VMLINUX_BTF).exists(),
            ),
            (Feature::RingBuffer, map_creatable(MapSpec::RING_BUFFER)),
            (Feature::TaskStorage, task_storage_creatable()),
            (
                Feature::CurrentTaskBtf,
                helper_known(HELPER_GET_CURRENT_TASK_BTF),
            ),
            (Feature::TaskPtRegs, helper_known(HELPER_TASK_PT_REGS)),
            (
                Feature::PerfEventNoPrealloc,
                perf_event_takes_unpreallocated_hash(),
            ),
            (Feature::Snprintf, helper_known(HELPER_SNPRINTF)),
            (Feature::BpfLoop, helper_known(HELPER_LOOP)),
        ];
        Self {
            probes: probes
                .into_iter()
                .map(|(feature, present)| Probe { feature, present })
                .collect(),
        }
    }

    pub fn has(&self, feature: Feature) -> bool {
        self.probes
            .iter()
            .any(|probe| probe.feature == feature && probe.present)
    }

    /// The object this kernel takes.
    pub fn object(&self) -> BpfObject {
        let default_needs = [
            Feature::TaskStorage,
            Feature::CurrentTaskBtf,
            Feature::TaskPtRegs,
            Feature::PerfEventNoPrealloc,
        ];
        if default_needs.iter().all(|&feature| self.has(feature)) {
            BpfObject::Default
        } else {
            BpfObject::Compat
        }
    }
}

/// The environment variable that overrides the probes' choice of object: `default`, `compat`
/// or `auto` (the probes decide). For a node where the probes are wrong, and for the tests,
/// which run the compat object on this machine's kernel too.
pub const OBJECT_OVERRIDE_VAR: &str = "PROFILER_BPF_OBJECT";

#[derive(Debug, thiserror::Error)]
#[error("{OBJECT_OVERRIDE_VAR}={0:?}: expected \"auto\", \"default\" or \"compat\"")]
pub struct BadObjectOverride(String);

/// The object to load, and whether the override chose it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ObjectChoice {
    pub object: BpfObject,
    pub forced: bool,
}

/// What the daemon found at start: the probes and the object loaded (for the metrics).
static FOUND: std::sync::Mutex<Option<(KernelFeatures, BpfObject)>> = std::sync::Mutex::new(None);

/// Probes the kernel, logs each missing feature once with what the daemon does without it, and
/// picks the object (or takes the override's).
pub fn choose_object() -> Result<ObjectChoice, BadObjectOverride> {
    choose_for(KernelFeatures::probe())
}

/// [`choose_object`] with probes already made (`profiler-daemon check` shows them first).
pub fn choose_for(features: KernelFeatures) -> Result<ObjectChoice, BadObjectOverride> {
    let forced = match std::env::var(OBJECT_OVERRIDE_VAR) {
        Ok(value) => match value.as_str() {
            "auto" | "" => None,
            "default" => Some(BpfObject::Default),
            "compat" => Some(BpfObject::Compat),
            _ => return Err(BadObjectOverride(value)),
        },
        Err(_) => None,
    };
    for probe in features.probes.iter().filter(|probe| !probe.present) {
        tracing::info!(
            feature = probe.feature.name(),
            instead = probe.feature.without(),
            "kernel feature missing"
        );
    }
    let object = forced.unwrap_or_else(|| features.object());
    tracing::info!(
        object = object.name(),
        forced = forced.is_some(),
        "BPF object chosen"
    );
    if let Ok(mut found) = FOUND.lock() {
        *found = Some((features, object));
    }
    Ok(ObjectChoice {
        object,
        forced: forced.is_some(),
    })
}

/// The default object was refused and the compat one loaded instead: the metrics say so.
pub fn record_fallback() {
    if let Ok(mut found) = FOUND.lock() {
        if let Some((_, object)) = found.as_mut() {
            *object = BpfObject::Compat;
        }
    }
}

/// `(feature, mode)` pairs for `profiler_kernel_feature`: each feature "present" or "missing",
/// and `("object", "default" | "compat")`. Empty before [`choose_object`].
pub fn metric_labels() -> Vec<(&'static str, &'static str)> {
    let Ok(found) = FOUND.lock() else {
        return Vec::new();
    };
    let Some((features, object)) = found.as_ref() else {
        return Vec::new();
    };
    let mut labels: Vec<_> = features
        .probes
        .iter()
        .map(|probe| {
            let mode = if probe.present { "present" } else { "missing" };
            (probe.feature.name(), mode)
        })
        .collect();
    labels.push(("object", object.name()));
    labels
}

/// The `profiler_kernel_feature` family, from what [`choose_object`] found.
pub struct FeatureMetrics;

impl crate::metrics::families::MetricSource for FeatureMetrics {
    fn encode(&self, out: &mut crate::metrics::families::Families) -> std::fmt::Result {
        out.gauges(
            profiler_common::metric::KERNEL_FEATURE,
            "BPF features of this kernel as probed at start (mode present or missing), and the BPF object loaded (feature=\"object\")",
            metric_labels()
                .into_iter()
                .map(|(feature, mode)| ([("feature", feature), ("mode", mode)], 1)),
        )
    }
}

// Helper numbers (uapi `enum bpf_func_id`).
const HELPER_GET_CURRENT_TASK_BTF: i32 = 158;
const HELPER_TASK_PT_REGS: i32 = 175;
const HELPER_SNPRINTF: i32 = 165;
const HELPER_LOOP: i32 = 181;

// bpf(2) commands, program and map types, flags (uapi `linux/bpf.h`).
const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_BTF_LOAD: libc::c_long = 18;
const PROG_TYPE_KPROBE: u32 = 2;
const PROG_TYPE_PERF_EVENT: u32 = 7;
const MAP_TYPE_HASH: u32 = 1;
const MAP_TYPE_RINGBUF: u32 = 27;
const MAP_TYPE_TASK_STORAGE: u32 = 29;
const F_NO_PREALLOC: u32 = 1;

/// `BPF_MAP_CREATE`'s attributes, as far as the probes set them.
#[repr(C)]
#[derive(Default)]
struct MapSpec {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
    btf_vmlinux_value_type_id: u32,
}

impl MapSpec {
    const RING_BUFFER: MapSpec = MapSpec {
        map_type: MAP_TYPE_RINGBUF,
        key_size: 0,
        value_size: 0,
        max_entries: 4096,
        map_flags: 0,
        inner_map_fd: 0,
        numa_node: 0,
        map_name: [0; 16],
        map_ifindex: 0,
        btf_fd: 0,
        btf_key_type_id: 0,
        btf_value_type_id: 0,
        btf_vmlinux_value_type_id: 0,
    };
}

/// `BPF_BTF_LOAD`'s attributes.
#[repr(C)]
#[derive(Default)]
struct BtfSpec {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
}

fn map_creatable(spec: MapSpec) -> bool {
    let mut spec = spec;
    bpf(BPF_MAP_CREATE, &mut spec).is_ok()
}

/// Task storage needs BTF for its key and value: a one-type BTF (`int`) is loaded for it.
fn task_storage_creatable() -> bool {
    let Ok(btf) = load_int_btf() else {
        return false;
    };
    use std::os::fd::AsRawFd as _;
    let mut spec = MapSpec {
        map_type: MAP_TYPE_TASK_STORAGE,
        key_size: 4,
        value_size: 4,
        map_flags: F_NO_PREALLOC,
        btf_fd: btf.as_raw_fd() as u32,
        btf_key_type_id: 1,
        btf_value_type_id: 1,
        ..MapSpec::default()
    };
    bpf(BPF_MAP_CREATE, &mut spec).is_ok()
}

/// A BTF blob with one type, `int` (id 1).
fn load_int_btf() -> std::io::Result<OwnedFd> {
    let strings = b"\0int\0";
    let mut blob = Vec::new();
    // Header: magic, version 1, flags 0, its length, then type and string sections.
    blob.extend_from_slice(&0xeb9fu16.to_le_bytes());
    blob.extend_from_slice(&[1, 0]);
    for word in [24u32, 0, 16, 16, strings.len() as u32] {
        blob.extend_from_slice(&word.to_le_bytes());
    }
    // INT "int": name at 1, kind 1, size 4; encoding signed, 32 bits.
    for word in [1u32, 1 << 24, 4, (1 << 24) | 32] {
        blob.extend_from_slice(&word.to_le_bytes());
    }
    blob.extend_from_slice(strings);
    let mut spec = BtfSpec {
        btf: blob.as_ptr() as u64,
        btf_size: blob.len() as u32,
        ..BtfSpec::default()
    };
    bpf(BPF_BTF_LOAD, &mut spec)
}

/// A program's load with its verifier log: `Ok` if loaded, else the log.
fn load_program(prog_type: u32, insns: &[u64]) -> Result<OwnedFd, String> {
    let license = b"GPL\0";
    let mut log = vec![0u8; 4096];
    let mut spec = ProgSpec {
        prog_type,
        insn_cnt: insns.len() as u32,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        log_level: 1,
        log_size: log.len() as u32,
        log_buf: log.as_mut_ptr() as u64,
        ..ProgSpec::default()
    };
    bpf(BPF_PROG_LOAD, &mut spec).map_err(|err| {
        let end = log.iter().position(|&b| b == 0).unwrap_or(log.len());
        format!("{err}: {}", String::from_utf8_lossy(&log[..end]))
    })
}

const LD_IMM64: u8 = 0x18;
const PSEUDO_MAP_FD: u8 = 1;

/// Whether the kernel knows helper `id` in tracing programs: a program calling it with zeroed
/// arguments is refused either way, but with "invalid func" / "unknown func" only when the
/// helper does not exist.
fn helper_known(id: i32) -> bool {
    let mut insns: Vec<u64> = (1..=5).map(|r| insn(MOV64_IMM, r, 0, 0, 0)).collect();
    insns.extend([
        insn(CALL, 0, 0, 0, id),
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ]);
    match load_program(PROG_TYPE_KPROBE, &insns) {
        Ok(_) => true,
        Err(log) => !(log.contains("invalid func") || log.contains("unknown func")),
    }
}

/// Whether a perf-event program may use a hash map without preallocation (refused before
/// 6.1: "perf_event programs can only use preallocated hash map").
fn perf_event_takes_unpreallocated_hash() -> bool {
    use std::os::fd::AsRawFd as _;
    let mut spec = MapSpec {
        map_type: MAP_TYPE_HASH,
        key_size: 4,
        value_size: 4,
        max_entries: 1,
        map_flags: F_NO_PREALLOC,
        ..MapSpec::default()
    };
    let Ok(map) = bpf(BPF_MAP_CREATE, &mut spec) else {
        return false;
    };
    let insns = [
        insn(LD_IMM64, 1, PSEUDO_MAP_FD, 0, map.as_raw_fd()),
        0,
        insn(MOV64_IMM, 0, 0, 0, 0),
        insn(EXIT, 0, 0, 0, 0),
    ];
    load_program(PROG_TYPE_PERF_EVENT, &insns).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This machine's kernel (6.18) has every feature; the probes must say so (and each probe
    /// must be able to say no: see the kernel matrix, `tests/tests/kernel_matrix.rs`).
    #[test]
    fn this_kernel_has_every_feature() {
        let features = KernelFeatures::probe();
        for probe in &features.probes {
            assert!(probe.present, "{} reported missing", probe.feature.name());
        }
        assert_eq!(features.object(), BpfObject::Default);
    }

    #[test]
    fn an_unknown_helper_is_reported_missing() {
        assert!(!helper_known(100_000));
        assert!(helper_known(HELPER_LOOP));
    }
}
