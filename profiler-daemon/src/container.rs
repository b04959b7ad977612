//! Which container and Kubernetes pod a process belongs to, read from `/proc/PID/cgroup`.
//!
//! Container runtimes name a container's cgroup after its id, and the kubelet names a pod's
//! cgroup after its uid, so both can be read off the cgroup path without asking any runtime.
//! The shapes differ by runtime (containerd, CRI-O, Docker, Podman), by cgroup driver (systemd
//! slices and scopes, or plain cgroupfs directories) and by cgroup version (one `0::` line in
//! v2, one line per hierarchy in v1); the parser looks at path components, so it needs no table
//! of whole paths and also copes with prefixes such as kind's `kubelet.slice` or a cgroup
//! namespace's `/../..`.

use std::io;

profiler_common::labelled_enum! {
    /// The runtime that created a container, when its cgroup name tells; its label is the
    /// runtime's usual name.
    pub enum Runtime {
        Containerd => "containerd",
        CriO => "cri-o",
        Docker => "docker",
        Podman => "podman",
    }
}

/// What a process's cgroup says about its container.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ContainerInfo {
    /// The runtime's full container id: 64 lowercase hex digits.
    pub container_id: Option<String>,
    /// The Kubernetes pod uid (a UUID with dashes, or a 32-hex config hash for static pods).
    pub pod_uid: Option<String>,
    /// The runtime, if the cgroup name identifies it (the cgroupfs driver's bare ids do not).
    pub runtime: Option<Runtime>,
}

impl ContainerInfo {
    /// The runtime's name (`containerd`, `cri-o`, `docker`, `podman`), if identifiable.
    pub fn runtime_name(&self) -> Option<&'static str> {
        self.runtime.map(Runtime::name)
    }
}

/// Reads `/proc/PID/cgroup`. `Ok(None)` for a process in no container (a host process, or one
/// whose cgroup namespace hides the path).
pub fn read(pid: u32) -> io::Result<Option<ContainerInfo>> {
    // The kernel writes it, but its paths name cgroups a container may create: bounded.
    Ok(parse(&crate::untrusted::read_proc_text(
        pid,
        "cgroup",
        crate::untrusted::MAX_PROC_FILE,
    )?))
}

/// Parses the text of a `/proc/PID/cgroup` file (v1, v2 or hybrid). `None` if no line names a
/// container or a pod.
pub fn parse(cgroup: &str) -> Option<ContainerInfo> {
    // Every hierarchy of a v1 host repeats the same path; the first line that names a container
    // decides, and a line naming only a pod is kept in case none does.
    let mut pod_only = None;
    for line in cgroup.lines() {
        // `hierarchy-id:controllers:path`; the path may itself contain ':'.
        let Some(path) = line.splitn(3, ':').nth(2) else {
            continue;
        };
        let info = parse_path(path);
        if info.container_id.is_some() {
            return Some(info);
        }
        if info.pod_uid.is_some() && pod_only.is_none() {
            pod_only = Some(info);
        }
    }
    pod_only
}

/// One cgroup path. The innermost component that is a container wins (nested containers,
/// and sub-cgroups a container makes below its own scope, such as Podman's `/container`).
fn parse_path(path: &str) -> ContainerInfo {
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty()).collect();
    let mut info = ContainerInfo::default();
    for (index, component) in components.iter().enumerate().rev() {
        if let Some((id, runtime)) = container_component(component) {
            // cgroupfs drivers name the container by its bare id; Docker's parent directory
            // is `docker`.
            let runtime = runtime.or_else(|| {
                (index > 0 && components[index - 1] == "docker").then_some(Runtime::Docker)
            });
            info.container_id = Some(id.to_owned());
            info.runtime = runtime;
            break;
        }
    }
    info.pod_uid = components.iter().rev().find_map(|c| pod_component(c));
    info
}

/// Scope prefixes of the systemd driver (and CRI-O's cgroupfs directories).
const RUNTIME_PREFIXES: &[(&str, Runtime)] = &[
    ("cri-containerd-", Runtime::Containerd),
    ("crio-", Runtime::CriO),
    ("docker-", Runtime::Docker),
    ("libpod-", Runtime::Podman),
];

/// `cri-containerd-<id>.scope`, `crio-<id>.scope`, `crio-<id>`, `docker-<id>.scope`,
/// `libpod-<id>.scope`, or a bare `<id>` (cgroupfs driver).
fn container_component(component: &str) -> Option<(&str, Option<Runtime>)> {
    let name = component.strip_suffix(".scope").unwrap_or(component);
    for (prefix, runtime) in RUNTIME_PREFIXES {
        if let Some(id) = name.strip_prefix(prefix) {
            // `crio-conmon-<id>.scope` holds CRI-O's monitor process, which is not in the
            // container: such a component does not match.
            return is_container_id(id).then_some((id, Some(*runtime)));
        }
    }
    is_container_id(name).then_some((name, None))
}

fn is_container_id(text: &str) -> bool {
    text.len() == 64 && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// `pod<uid>` (cgroupfs driver) or `kubepods[-<qos>]-pod<uid_with_underscores>.slice` (systemd
/// driver, which turns the uid's dashes into underscores because a dash separates slice levels).
fn pod_component(component: &str) -> Option<String> {
    let uid = match component.strip_suffix(".slice") {
        Some(slice) => slice
            .rsplit('-')
            .next()?
            .strip_prefix("pod")?
            .replace('_', "-"),
        None => component.strip_prefix("pod")?.to_owned(),
    };
    is_pod_uid(&uid).then_some(uid)
}

/// A UUID (8-4-4-4-12 hex digits) or, for static pods, the 32-hex hash of their manifest.
fn is_pod_uid(text: &str) -> bool {
    let hex = |b: u8| b.is_ascii_hexdigit();
    match text.len() {
        36 => text.bytes().enumerate().all(|(i, b)| match i {
            8 | 13 | 18 | 23 => b == b'-',
            _ => hex(b),
        }),
        32 => text.bytes().all(hex),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f4c1e0b9a8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a2f1e0d9c8b7a6f5e4d3c2b";
    const UID: &str = "5b2f7a4c-0d1e-4f3a-9b8c-7d6e5f4a3b2c";
    const UID_UNDERSCORED: &str = "5b2f7a4c_0d1e_4f3a_9b8c_7d6e5f4a3b2c";

    fn expect(
        text: &str,
        container_id: Option<&str>,
        pod_uid: Option<&str>,
        runtime: Option<&str>,
    ) {
        let info = parse(text).unwrap_or_else(|| panic!("nothing found in {text:?}"));
        assert_eq!(info.container_id.as_deref(), container_id, "{text}");
        assert_eq!(info.pod_uid.as_deref(), pod_uid, "{text}");
        assert_eq!(info.runtime_name(), runtime, "{text}");
    }

    #[test]
    fn containerd_systemd_driver_cgroup_v2() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
        );
        expect(&text, Some(ID), Some(UID), Some("containerd"));
    }

    #[test]
    fn guaranteed_pods_have_no_qos_slice() {
        let text = format!(
            "0::/kubepods.slice/kubepods-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
        );
        expect(&text, Some(ID), Some(UID), Some("containerd"));
    }

    #[test]
    fn containerd_cgroupfs_driver_cgroup_v1() {
        let lines: String = [
            "12:hugetlb",
            "11:memory",
            "10:cpu,cpuacct",
            "9:pids",
            "8:devices",
            "1:name=systemd",
        ]
        .iter()
        .map(|prefix| format!("{prefix}:/kubepods/burstable/pod{UID}/{ID}\n"))
        .collect();
        // A bare id: the runtime is containerd or Docker's shim, the path cannot tell.
        expect(&lines, Some(ID), Some(UID), None);
    }

    #[test]
    fn besteffort_cgroupfs_driver_cgroup_v2() {
        let text = format!("0::/kubepods/besteffort/pod{UID}/{ID}\n");
        expect(&text, Some(ID), Some(UID), None);
    }

    #[test]
    fn crio_systemd_driver_v1_and_v2() {
        let v2 = format!(
            "0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_UNDERSCORED}.slice/crio-{ID}.scope\n"
        );
        expect(&v2, Some(ID), Some(UID), Some("cri-o"));
        let v1 = format!(
            "11:blkio:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/crio-{ID}.scope\n\
             10:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/crio-{ID}.scope\n\
             1:name=systemd:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/crio-{ID}.scope\n\
             0::/\n"
        );
        expect(&v1, Some(ID), Some(UID), Some("cri-o"));
    }

    #[test]
    fn crio_cgroupfs_driver() {
        let text = format!("0::/kubepods/burstable/pod{UID}/crio-{ID}\n");
        expect(&text, Some(ID), Some(UID), Some("cri-o"));
    }

    #[test]
    fn crio_conmon_is_not_the_container() {
        let text = format!(
            "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/crio-conmon-{ID}.scope\n"
        );
        expect(&text, None, Some(UID), None);
    }

    #[test]
    fn docker_systemd_driver() {
        expect(
            &format!("0::/system.slice/docker-{ID}.scope\n"),
            Some(ID),
            None,
            Some("docker"),
        );
        // Rootless Docker lives under the user's manager.
        expect(
            &format!("0::/user.slice/user-1000.slice/user@1000.service/docker-{ID}.scope\n"),
            Some(ID),
            None,
            Some("docker"),
        );
        // Kubernetes with dockershim (or cri-dockerd), systemd driver.
        expect(
            &format!(
                "4:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_UNDERSCORED}.slice/docker-{ID}.scope\n"
            ),
            Some(ID),
            Some(UID),
            Some("docker"),
        );
    }

    #[test]
    fn docker_cgroupfs_driver_cgroup_v1() {
        let text = format!(
            "12:perf_event:/docker/{ID}\n11:cpu,cpuacct:/docker/{ID}\n1:name=systemd:/docker/{ID}\n0::/system.slice/containerd.service\n"
        );
        expect(&text, Some(ID), None, Some("docker"));
    }

    #[test]
    fn podman_and_sub_cgroups_below_the_scope() {
        expect(
            &format!("0::/machine.slice/libpod-{ID}.scope/container\n"),
            Some(ID),
            None,
            Some("podman"),
        );
    }

    #[test]
    fn kind_nested_and_cgroup_namespace_prefixes() {
        // kind runs the kubelet in a container, under its own slice.
        let kind = format!(
            "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_UNDERSCORED}.slice/cri-containerd-{ID}.scope\n"
        );
        expect(&kind, Some(ID), Some(UID), Some("containerd"));
        // Seen from inside another cgroup namespace, the path climbs out first.
        let climbed = format!("0::/../../kubepods/pod{UID}/{ID}\n");
        expect(&climbed, Some(ID), Some(UID), None);
    }

    #[test]
    fn static_pods_have_hash_uids() {
        let hash = "6d6b2f5e9c1a4b3d8e7f0a1b2c3d4e5f";
        let text = format!("0::/kubepods/burstable/pod{hash}/{ID}\n");
        expect(&text, Some(ID), Some(hash), None);
    }

    #[test]
    fn host_processes_are_in_no_container() {
        for text in [
            "0::/init.scope\n",
            "0::/system.slice/containerd.service\n",
            "0::/user.slice/user-0.slice/session-3.scope\n",
            "0::/\n",
            "12:cpu,cpuacct:/\n1:name=systemd:/init.scope\n0::/init.scope\n",
            // A pod slice whose name is not a uid, and ids of the wrong length or case.
            "0::/kubepods.slice/kubepods-burstable.slice\n",
            "0::/docker/3F4C1E0B9A8D7C6B5A4F3E2D1C0B9A8F7E6D5C4B3A2F1E0D9C8B7A6F5E4D3C2B\n",
            "0::/system.slice/docker-3f4c1e0b.scope\n",
            "",
            "garbage without colons\n",
        ] {
            assert_eq!(parse(text), None, "{text:?}");
        }
    }

    #[test]
    fn reads_this_process() {
        // Whatever this test runs in, reading must work; a container id, if any, is well formed.
        let info = read(std::process::id()).expect("/proc/self/cgroup is readable");
        if let Some(id) = info.and_then(|i| i.container_id) {
            assert!(is_container_id(&id), "{id}");
        }
        assert!(read(u32::MAX).is_err(), "no such pid");
    }
}
