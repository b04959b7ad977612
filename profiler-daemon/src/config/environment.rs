//! What configuration reads from the host rather than from the file or flags, read once and
//! passed in, so that resolving a configuration is a function of its inputs (and testable).

/// The host facts the defaults depend on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Environment {
    /// `KUBERNETES_SERVICE_HOST` is set: the daemon runs in a pod.
    pub in_kubernetes: bool,
    /// `NODE_NAME` (the downward API's `spec.nodeName` in the DaemonSet).
    pub node_name: Option<String>,
    /// The kernel's host name.
    pub host_name: Option<String>,
}

impl Environment {
    /// This process's environment and this host's name.
    pub fn of_this_process() -> Self {
        Self {
            in_kubernetes: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
            node_name: std::env::var("NODE_NAME").ok(),
            host_name: std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|name| name.trim().to_string()),
        }
    }
}
