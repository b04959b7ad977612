//! What a process is called in exported profiles: its `service_name` and labels.
//!
//! The service name is, in order: the configured override; for a process in a Kubernetes pod,
//! the pod's `pyroscope.io/service_name` annotation; the configured mapping of the process's
//! program name; for a pod's container, `<namespace>/<container>`; else the program name itself,
//! which for a JVM is its main class, jar or module (`java -jar orders.jar` -> `orders`), and
//! otherwise the executable's file name.
//!
//! Most of it is the process's own text (its command line, its `comm`, its pod's annotation),
//! and these labels name a Pyroscope series: a value Pyroscope refuses (empty `service_name`,
//! longer than its limit) would get the whole push refused, other processes' profiles with it.
//! So every value is made printable ([`crate::printable`]) and bounded here, where the identity
//! is made, and an empty service name becomes [`UNNAMED_SERVICE`].

use std::collections::BTreeMap;
use std::path::Path;

use crate::config_error::{invalid, ConfigError};
use crate::kubernetes::PodIndex;
use crate::printable::printable_within;
use crate::process::ProcessInfo;

/// Longest label value exported, in bytes: half of Pyroscope's default limit
/// (`validation.max-length-label-value`, 2048), so a lower server setting is still met.
pub const MAX_LABEL_VALUE_BYTES: usize = 1024;

/// The service name of a process whose every name is empty (Pyroscope requires one).
pub const UNNAMED_SERVICE: &str = "unknown";

/// A label value from a process's text: printable and bounded.
fn label_value(text: &str) -> String {
    printable_within(text, MAX_LABEL_VALUE_BYTES).into_owned()
}

/// How service names are chosen (from the configuration).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServiceNaming {
    /// Every process gets this name (a host running one application).
    pub override_name: Option<String>,
    /// Program name (main class, jar stem, module or executable name) -> service name.
    pub by_program: BTreeMap<String, String>,
}

/// The labels a process's profiles are exported with.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ProcessIdentity {
    pub service_name: String,
    /// The program name the service name was derived from.
    pub program: String,
    /// The container it runs in, if any.
    pub container_id: Option<String>,
    /// Kubernetes labels (namespace, pod, container, node, workload, app) of its pod.
    pub pod_labels: Vec<(&'static str, String)>,
}

impl ProcessIdentity {
    /// Label pairs for Pyroscope, `__name__` (the profile type's `name`: `process_cpu`,
    /// `off_cpu`) first, sorted by name after it.
    pub fn labels(&self, extra: &BTreeMap<String, String>, name: &str) -> Vec<(String, String)> {
        let mut labels: BTreeMap<String, String> = extra.clone();
        labels.insert("service_name".into(), self.service_name.clone());
        labels.insert("process_executable_name".into(), self.program.clone());
        if let Some(id) = &self.container_id {
            // The name Grafana Alloy gives it: Pyroscope users can relabel on it the same way.
            labels.insert("__container_id__".into(), id.clone());
        }
        for (name, value) in &self.pod_labels {
            labels.insert(name.to_string(), value.clone());
        }
        let mut pairs = vec![("__name__".to_string(), name.to_string())];
        pairs.extend(labels);
        pairs
    }
}

impl ServiceNaming {
    /// The `service_name` and `service_names` keys.
    pub fn resolve(
        service_name: Option<String>,
        by_program: Option<BTreeMap<String, String>>,
    ) -> Result<Self, ConfigError> {
        let naming = Self {
            override_name: check_service_name("service_name", service_name)?,
            by_program: by_program.unwrap_or_default(),
        };
        if naming
            .by_program
            .values()
            .any(|name| name.trim().is_empty())
        {
            return Err(invalid("service_names", "service names must not be empty"));
        }
        Ok(naming)
    }

    /// Names a process from what was read of it; `comm` is the fallback when nothing else is
    /// known (a process that exited before it could be read). `pods` is this node's pods, when
    /// the daemon runs in Kubernetes.
    pub fn identify(
        &self,
        info: Option<&ProcessInfo>,
        comm: &str,
        pods: Option<&PodIndex>,
    ) -> ProcessIdentity {
        let program = label_value(&info.and_then(program_name).unwrap_or_else(|| comm.into()));
        let container = info.and_then(|info| info.container.as_ref());
        let pod = container.zip(pods).and_then(|(c, pods)| pods.lookup(c));
        let pod_service = pod.as_ref().and_then(|m| m.pod.service_name.clone());
        let namespace_container = pod.as_ref().and_then(|m| {
            let container = m.container.as_ref()?;
            Some(format!("{}/{container}", m.pod.namespace))
        });
        let service_name = self
            .override_name
            .clone()
            .or(pod_service)
            .or_else(|| self.by_program.get(&program).cloned())
            .or(namespace_container)
            .map_or_else(|| program.clone(), |name| label_value(&name));
        let service_name = if service_name.is_empty() {
            UNNAMED_SERVICE.to_string()
        } else {
            service_name
        };
        let mut pod_labels = Vec::new();
        if let Some(m) = &pod {
            pod_labels.push(("namespace", m.pod.namespace.clone()));
            pod_labels.push(("pod", m.pod.name.clone()));
            if let Some(container) = &m.container {
                pod_labels.push(("container", container.clone()));
            }
            if let Some(node) = &m.pod.node {
                pod_labels.push(("node", node.clone()));
            }
            if let Some((kind, name)) = &m.pod.workload {
                pod_labels.push(("workload_kind", kind.clone()));
                pod_labels.push(("workload_name", name.clone()));
            }
            if let Some(app) = &m.pod.app {
                pod_labels.push(("app", app.clone()));
            }
        }
        ProcessIdentity {
            service_name,
            program,
            container_id: container.and_then(|c| c.container_id.as_deref().map(label_value)),
            pod_labels: pod_labels
                .into_iter()
                .map(|(name, value)| (name, label_value(&value)))
                .collect(),
        }
    }
}

/// The program a process runs: a JVM's main class, jar or module, else its executable's name.
fn program_name(info: &ProcessInfo) -> Option<String> {
    let executable = info
        .executable
        .as_deref()
        .or_else(|| info.command_line.first().map(Path::new))
        .and_then(Path::file_name)
        .map(|name| {
            let name = name.to_string_lossy();
            // The kernel marks an executable replaced on disk (a package upgrade) this way.
            name.strip_suffix(" (deleted)").unwrap_or(&name).to_string()
        })?;
    if executable == "java" {
        if let Some(main) = java_main(info.command_line.get(1..).unwrap_or_default()) {
            return Some(main);
        }
    }
    Some(executable)
}

/// Launcher options that take the next argument as their value.
const JAVA_OPTIONS_WITH_VALUE: &[&str] = &[
    "-cp",
    "-classpath",
    "--class-path",
    "-p",
    "--module-path",
    "--upgrade-module-path",
    "--add-modules",
    "--add-opens",
    "--add-exports",
    "--add-reads",
    "--patch-module",
    "--limit-modules",
    "--enable-native-access",
    "--source",
];

/// Finds what the `java` launcher runs in its arguments (after `argv[0]`).
fn java_main(args: &[String]) -> Option<String> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "-jar" => {
                let jar = Path::new(args.next()?);
                return Some(jar.file_stem()?.to_string_lossy().into_owned());
            }
            "-m" | "--module" => {
                let module = args.next()?;
                // `module/main.Class` names the class; a bare module its declared main class.
                return Some(module.rsplit('/').next().unwrap_or(module).to_string());
            }
            option if JAVA_OPTIONS_WITH_VALUE.contains(&option) => {
                args.next();
            }
            option if option.starts_with("--module=") => {
                let module = &option["--module=".len()..];
                return Some(module.rsplit('/').next().unwrap_or(module).to_string());
            }
            // Other options and `@argfiles` (whose contents we do not read).
            option if option.starts_with('-') || option.starts_with('@') => {}
            // Single-file source programs: `java Main.java`.
            main if main.ends_with(".java") => {
                return Some(Path::new(main).file_stem()?.to_string_lossy().into_owned());
            }
            main => return Some(main.to_string()),
        }
    }
    None
}

fn check_service_name(
    field: &'static str,
    name: Option<String>,
) -> Result<Option<String>, ConfigError> {
    match name {
        Some(name) if name.trim().is_empty() => Err(invalid(field, "must not be empty")),
        name => Ok(name),
    }
}

/// The `labels` table: Prometheus-style label names; names starting with `__` and `service_name` are ours.
pub fn check_labels(labels: &BTreeMap<String, String>) -> Result<(), ConfigError> {
    for (name, value) in labels {
        let mut chars = name.chars();
        let well_formed = chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !well_formed {
            return Err(invalid(
                "labels",
                format!("{name:?} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ));
        }
        if name.starts_with("__") || name == "service_name" {
            return Err(invalid(
                "labels",
                format!("{name:?} is reserved (set `service_name` or `service_names` instead)"),
            ));
        }
        if value.is_empty() {
            return Err(invalid("labels", format!("{name:?} has an empty value")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn process(executable: &str, args: &[&str]) -> ProcessInfo {
        ProcessInfo {
            pid: 1,
            comm: "short".into(),
            command_line: args.iter().map(|a| a.to_string()).collect(),
            executable: Some(PathBuf::from(executable)),
            container: None,
            start_time: 0,
            uid: 0,
            shares_our_root: true,
            mappings: vec![],
            read_at: std::time::Instant::now(),
            young_when_read: false,
        }
    }

    fn name(executable: &str, args: &[&str]) -> String {
        ServiceNaming::default()
            .identify(Some(&process(executable, args)), "comm", None)
            .service_name
    }

    #[test]
    fn jvms_are_named_by_main_class_jar_or_module() {
        let java = "/usr/lib/jvm/java-17/bin/java";
        assert_eq!(
            name(
                java,
                &["java", "-Xmx1g", "-cp", "a.jar:b", "com.example.Main", "x"]
            ),
            "com.example.Main"
        );
        assert_eq!(
            name(
                java,
                &[
                    "java",
                    "-XX:+UseG1GC",
                    "-jar",
                    "/srv/orders-2.1.jar",
                    "--port=1"
                ]
            ),
            "orders-2.1"
        );
        assert_eq!(
            name(java, &["java", "-p", "mods", "-m", "app/com.example.App"]),
            "com.example.App"
        );
        assert_eq!(name(java, &["java", "--module=app"]), "app");
        assert_eq!(name(java, &["java", "@opts", "Tool.java"]), "Tool");
        // Nothing to run (java -version): the executable's name.
        assert_eq!(name(java, &["java", "-version"]), "java");
    }

    #[test]
    fn other_processes_are_named_by_executable() {
        assert_eq!(name("/usr/sbin/nginx", &["nginx: worker process"]), "nginx");
        assert_eq!(name("/opt/app/server (deleted)", &["server"]), "server");
        // A process that could not be read: its comm.
        assert_eq!(
            ServiceNaming::default()
                .identify(None, "kworker/0:1", None)
                .service_name,
            "kworker/0:1"
        );
    }

    #[test]
    fn names_from_a_process_are_printable_bounded_and_never_empty() {
        let java = "/usr/bin/java";
        assert_eq!(name(java, &["java", "a\u{1b}[2J\nb"]), "a?[2J?b");
        let long = "x".repeat(3 * MAX_LABEL_VALUE_BYTES);
        assert_eq!(name(java, &["java", &long]).len(), MAX_LABEL_VALUE_BYTES);
        // `java ''`, `prctl(PR_SET_NAME, "")` of a process that could not be read.
        assert_eq!(name(java, &["java", ""]), UNNAMED_SERVICE);
        let naming = ServiceNaming::default();
        let unread = naming.identify(None, "", None);
        assert_eq!(
            (unread.service_name.as_str(), unread.program.as_str()),
            (UNNAMED_SERVICE, "")
        );
        let unread = naming.identify(None, "\u{1b}]0;x\u{7}", None);
        assert_eq!(unread.service_name, "?]0;x?");
        for (_, value) in unread.labels(&BTreeMap::new(), "process_cpu") {
            assert!(!value.chars().any(crate::printable::is_unprintable));
        }
    }

    #[test]
    fn configuration_overrides_inference() {
        let info = process("/usr/bin/java", &["java", "com.example.Main"]);
        let mut naming = ServiceNaming::default();
        naming
            .by_program
            .insert("com.example.Main".into(), "orders".into());
        assert_eq!(
            naming.identify(Some(&info), "", None).service_name,
            "orders"
        );
        naming.override_name = Some("everything".into());
        let identity = naming.identify(Some(&info), "", None);
        assert_eq!(identity.service_name, "everything");
        assert_eq!(identity.program, "com.example.Main");
    }

    #[test]
    fn pods_name_their_containers_processes() {
        use crate::container::ContainerInfo;
        use crate::kubernetes::{PodIndex, PodInfo};
        let id = "c".repeat(64);
        let mut pods = PodIndex::default();
        let mut pod = PodInfo {
            uid: "uid-1".into(),
            namespace: "shop".into(),
            name: "orders-5d8f7c9b4-x2x7q".into(),
            node: Some("node-a".into()),
            service_name: None,
            workload: Some(("deployment".into(), "orders".into())),
            app: None,
            containers: [(id.clone(), "app".to_string())].into(),
        };
        pods.apply(pod.clone());
        let mut info = process("/usr/bin/java", &["java", "-jar", "orders.jar"]);
        info.container = Some(ContainerInfo {
            container_id: Some(id),
            ..Default::default()
        });
        let naming = ServiceNaming::default();
        let identity = naming.identify(Some(&info), "", Some(&pods));
        assert_eq!(identity.service_name, "shop/app");
        assert!(identity
            .pod_labels
            .contains(&("workload_name", "orders".into())));
        assert!(identity.pod_labels.contains(&("node", "node-a".into())));
        // The pod's annotation wins over inference, the configured override over everything.
        pod.service_name = Some("orders-api".into());
        pods.apply(pod);
        assert_eq!(
            naming.identify(Some(&info), "", Some(&pods)).service_name,
            "orders-api"
        );
        let forced = ServiceNaming {
            override_name: Some("all".into()),
            ..Default::default()
        };
        assert_eq!(
            forced.identify(Some(&info), "", Some(&pods)).service_name,
            "all"
        );
        // Outside Kubernetes (no pod index), the program name.
        assert_eq!(
            naming.identify(Some(&info), "", None).service_name,
            "orders"
        );
    }

    #[test]
    fn labels_start_with_the_profile_name() {
        let identity = ProcessIdentity {
            service_name: "orders".into(),
            program: "com.example.Main".into(),
            container_id: Some("ab".repeat(32)),
            pod_labels: vec![("namespace", "shop".into())],
        };
        let extra = BTreeMap::from([("env".to_string(), "prod".to_string())]);
        let labels = identity.labels(&extra, "process_cpu");
        assert_eq!(labels[0], ("__name__".into(), "process_cpu".into()));
        assert!(labels.contains(&("__container_id__".into(), "ab".repeat(32))));
        assert!(labels.contains(&("namespace".into(), "shop".into())));
        assert!(labels.contains(&("env".into(), "prod".into())));
        assert!(labels.contains(&("service_name".into(), "orders".into())));
    }
}
