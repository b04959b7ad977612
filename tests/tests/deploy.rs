//! Deployment artifacts (deploy/): the Kubernetes manifests validate against Kubernetes'
//! schemas and grant nothing but pod reads; the systemd unit verifies, its exposure is bounded,
//! and the daemon works as the unit runs it (an unprivileged user with the unit's capabilities,
//! the unit's system calls, JVM files hidden in its own mount namespace); the container image
//! profiles a JVM on the host.
//!
//! `cargo xtask test` installs the tools: kubectl, podman and runc, strace, and PyPI's
//! kubernetes-validate under `.tools/`.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use profiler_daemon::config::{Config, Environment, FileConfig, Overrides};
use profiler_tests::*;
use serde_json::Value;

/// The capabilities the DaemonSet adds and the systemd unit grants (both say why).
const CAPABILITIES: &[&str] = &[
    "BPF",
    "PERFMON",
    "SYS_PTRACE",
    "DAC_READ_SEARCH",
    "SYSLOG",
    "CHECKPOINT_RESTORE",
    "SETUID",
    "SETGID",
];

/// The bound on `systemd-analyze security`'s exposure (0 safe .. 10 exposed; the unit scores
/// 2.7 with systemd 252). A sandboxing option dropped by mistake shows here.
const MAX_EXPOSURE: f64 = 3.5;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn command_exists(name: &str) -> bool {
    Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn stdout_of(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("starting {command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Python with PyPI's kubernetes-validate (and its PyYAML) on the path.
fn python_with_validator() -> Command {
    let tools = root().join(".tools/kubernetes-validate");
    assert!(
        tools.join("kubernetes_validate").exists(),
        "kubernetes-validate missing under {} (cargo xtask test installs it)",
        tools.display()
    );
    let mut python = Command::new("python3");
    python.env("PYTHONPATH", tools);
    python
}

/// `kubectl kustomize deploy/kubernetes`: what `kubectl apply -k` would send.
fn render_kustomization() -> String {
    assert!(
        command_exists("kubectl"),
        "kubectl missing (cargo xtask test installs kubernetes-client)"
    );
    stdout_of(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(root().join("deploy/kubernetes")),
    )
}

/// Runs kubernetes-validate in strict mode (unknown fields are errors) on a file.
fn validate(manifests: &Path, kubernetes_version: Option<&str>) -> Output {
    let mut command = python_with_validator();
    command.args(["-m", "kubernetes_validate", "--strict"]);
    if let Some(version) = kubernetes_version {
        command.args(["--kubernetes-version", version]);
    }
    command
        .arg(manifests)
        .output()
        .expect("running kubernetes-validate")
}

/// Every YAML document, as JSON (PyYAML does the parsing; the tests crate has no YAML parser).
fn documents(yaml: &str) -> Vec<Value> {
    let mut child = python_with_validator()
        .args([
            "-c",
            "import json, sys, yaml; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d]))",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("python3");
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(yaml.as_bytes())
        .expect("writing YAML");
    let output = child.wait_with_output().expect("python3");
    assert!(output.status.success(), "YAML did not parse");
    serde_json::from_slice(&output.stdout).expect("JSON")
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The checked configuration of a config file, as the daemon would start with it on a node of a
/// cluster (where the DaemonSet's config runs).
fn resolve_config(text: &str, what: &str) -> Config {
    let file = FileConfig::parse(text).unwrap_or_else(|e| panic!("{what}: {e}"));
    let node = Environment {
        in_kubernetes: true,
        node_name: Some("node-a".into()),
        host_name: Some("host-a".into()),
    };
    Config::resolve(file, Overrides::default(), &node).unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[test]
fn kubernetes_manifests_validate_and_grant_only_pod_reads() {
    let rendered = render_kustomization();
    let dir = tempfile::tempdir().expect("tempdir");
    let manifests = dir.path().join("jvm-profiler.yaml");
    std::fs::write(&manifests, &rendered).expect("write");

    // The newest schemas the validator ships, and 1.30, the first release with the
    // securityContext.appArmorProfile field the DaemonSet uses.
    for version in [None, Some("1.30.0")] {
        let output = validate(&manifests, version);
        eprintln!(
            "--- kubernetes-validate {} ---\n{}{}",
            version.unwrap_or("(newest)"),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(output.status.success(), "manifests do not validate");
    }
    // The validator does reject what the API server would: a misspelt field.
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, rendered.replace("hostPID: true", "hostPid: true")).expect("write");
    assert!(
        !validate(&broken, None).status.success(),
        "a misspelt field passed validation"
    );

    let docs = documents(&rendered);
    let kinds: BTreeSet<&str> = docs.iter().filter_map(|d| d["kind"].as_str()).collect();
    assert_eq!(
        kinds,
        BTreeSet::from([
            "ClusterRole",
            "ClusterRoleBinding",
            "ConfigMap",
            "DaemonSet",
            "Namespace",
            "ServiceAccount",
        ]),
        "unexpected objects (another Role would need the same checks)"
    );
    let of_kind =
        |kind: &str| -> Vec<&Value> { docs.iter().filter(|d| d["kind"] == kind).collect() };

    // RBAC: pods get/list/watch (nodes get would be the only other grant allowed), nothing else.
    let role = of_kind("ClusterRole")[0];
    let mut granted = BTreeMap::new();
    for rule in role["rules"].as_array().expect("rules") {
        assert_eq!(
            strings(&rule["apiGroups"]),
            [""],
            "only the core API group: {rule}"
        );
        assert!(
            rule.get("nonResourceURLs").is_none() && rule.get("resourceNames").is_none(),
            "{rule}"
        );
        for resource in strings(&rule["resources"]) {
            let allowed: &[&str] = match resource {
                "pods" => &["get", "list", "watch"],
                "nodes" => &["get"],
                other => panic!("the role grants access to {other:?}: {rule}"),
            };
            for verb in strings(&rule["verbs"]) {
                assert!(allowed.contains(&verb), "{verb} on {resource}: {rule}");
                granted
                    .entry(resource)
                    .or_insert_with(BTreeSet::new)
                    .insert(verb);
            }
        }
    }
    assert_eq!(
        granted.get("pods"),
        Some(&BTreeSet::from(["get", "list", "watch"])),
        "the pod watch needs get, list and watch"
    );
    let binding = of_kind("ClusterRoleBinding")[0];
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    let subjects = binding["subjects"].as_array().expect("subjects");
    assert_eq!(subjects.len(), 1, "{subjects:?}");
    assert_eq!(subjects[0]["kind"], "ServiceAccount");
    assert_eq!(subjects[0]["name"], "jvm-profiler");
    assert_eq!(subjects[0]["namespace"], "jvm-profiler");

    // The DaemonSet: host PID namespace, the documented capabilities and no privileged mode,
    // the node name, the config from the generated ConfigMap.
    let daemonset = of_kind("DaemonSet")[0];
    let pod = &daemonset["spec"]["template"]["spec"];
    assert_eq!(pod["hostPID"], true);
    assert_eq!(pod["serviceAccountName"], "jvm-profiler");
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["privileged"], false);
    assert_eq!(strings(&security["capabilities"]["drop"]), ["ALL"]);
    assert_eq!(strings(&security["capabilities"]["add"]), CAPABILITIES);
    assert_eq!(
        strings(&container["args"]),
        ["run", "--config", "/etc/jvm-profiler/config.toml"]
    );
    let node_name = container["env"]
        .as_array()
        .expect("env")
        .iter()
        .find(|e| e["name"] == "NODE_NAME")
        .expect("NODE_NAME");
    assert_eq!(
        node_name["valueFrom"]["fieldRef"]["fieldPath"],
        "spec.nodeName"
    );
    for key in ["requests", "limits"] {
        for resource in ["cpu", "memory"] {
            assert!(
                container["resources"][key][resource].is_string(),
                "resources.{key}.{resource}"
            );
        }
    }
    let configmap = of_kind("ConfigMap")[0];
    let config_volume = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "config")
        .expect("config volume");
    assert_eq!(
        config_volume["configMap"]["name"],
        configmap["metadata"]["name"]
    );

    // The config file the ConfigMap carries starts the daemon, exporting in-cluster.
    let text = configmap["data"]["config.toml"]
        .as_str()
        .expect("config.toml");
    let config = resolve_config(text, "deploy/kubernetes/config.toml");
    let pyroscope = format!("{:?}", config.pyroscope.expect("[pyroscope] table"));
    assert!(
        pyroscope.contains("pyroscope.pyroscope.svc:4040"),
        "{pyroscope}"
    );
}

#[test]
fn default_config_starts_the_daemon() {
    let text = std::fs::read_to_string(root().join("deploy/config.toml")).expect("config");
    let config = resolve_config(&text, "deploy/config.toml");
    assert_eq!(
        config.output_dir,
        Path::new("/var/lib/jvm-profiler/profiles")
    );
    assert!(config.pyroscope.is_none(), "no export until a url is set");
}

/// Runs `cargo xtask ARGS` (already built by the `cargo xtask test` that runs this).
fn xtask(args: &[&str], daemon: &Path) -> Output {
    let output = Command::new(env!("CARGO"))
        .current_dir(root())
        .args(["run", "--quiet", "--package", "xtask", "--"])
        .args(args)
        .arg("--daemon")
        .arg(daemon)
        .output()
        .expect("running xtask");
    eprintln!(
        "--- cargo xtask {} ---\n{}",
        args.join(" "),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The values of every `KEY=` line of a unit, in order.
fn unit_values<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines()
        .filter_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .collect()
}

#[test]
fn systemd_unit_installs_verifies_and_is_sandboxed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("root");
    let output = xtask(
        &["install", "--destdir", dest.to_str().expect("utf-8")],
        &daemon_binary(),
    );
    assert!(output.status.success(), "cargo xtask install failed");
    let binary = dest.join("usr/local/bin/profiler-daemon");
    let unit_path = dest.join("etc/systemd/system/jvm-profiler.service");
    let config_path = dest.join("etc/jvm-profiler/config.toml");
    assert!(binary.exists() && unit_path.exists() && config_path.exists());
    // `attach = "auto"` looks for the agent beside the binary.
    assert!(
        dest.join("usr/local/bin/libprofiler_jvmti.so").exists(),
        "the sidecar agent is not installed beside the daemon"
    );
    assert_eq!(
        std::fs::read(&config_path).expect("config"),
        std::fs::read(root().join("deploy/config.toml")).expect("default config")
    );
    // A second install keeps the user's config.
    std::fs::write(&config_path, "frequency = 49\n").expect("edit config");
    assert!(xtask(
        &["install", "--destdir", dest.to_str().expect("utf-8")],
        &daemon_binary()
    )
    .status
    .success());
    assert_eq!(
        std::fs::read_to_string(&config_path).expect("config"),
        "frequency = 49\n"
    );

    // `systemd-analyze verify` checks that ExecStart's binary exists: point it at the installed
    // copy. Unknown keys and bad values are warnings with exit code 0, so stderr must be empty.
    let unit = std::fs::read_to_string(&unit_path).expect("unit");
    let checked = dir.path().join("jvm-profiler.service");
    std::fs::write(
        &checked,
        unit.replace(
            "/usr/local/bin/profiler-daemon",
            binary.to_str().expect("utf-8"),
        ),
    )
    .expect("write unit");
    let verify = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&checked)
        .output()
        .expect("systemd-analyze (cargo xtask test installs systemd)");
    let complaints = String::from_utf8_lossy(&verify.stderr);
    assert!(
        verify.status.success() && complaints.trim().is_empty(),
        "systemd-analyze verify: {complaints}"
    );

    let security = stdout_of(
        Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(&checked),
    );
    eprintln!("--- systemd-analyze security ---\n{security}");
    let exposure: f64 = security
        .lines()
        .find_map(|l| {
            l.split("Overall exposure level for jvm-profiler.service:")
                .nth(1)
        })
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|score| score.parse().ok())
        .expect("an overall exposure level");
    eprintln!("exposure level: {exposure}");
    assert!(
        exposure < MAX_EXPOSURE,
        "exposure {exposure} >= {MAX_EXPOSURE}"
    );

    let ambient = unit_values(&unit, "AmbientCapabilities");
    assert_eq!(ambient, unit_values(&unit, "CapabilityBoundingSet"));
    let expected: Vec<String> = CAPABILITIES.iter().map(|c| format!("CAP_{c}")).collect();
    assert_eq!(
        ambient,
        [expected.join(" ")],
        "the DaemonSet and the unit grant the same"
    );
}

/// Every system call the unit's `SystemCallFilter=` lines allow, expanded through the groups
/// `systemd-analyze syscall-filter` lists (an allow list first, then `~` removals).
fn allowed_syscalls(unit: &str) -> BTreeSet<String> {
    let listing = stdout_of(Command::new("systemd-analyze").args(["syscall-filter", "--no-pager"]));
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in listing.lines() {
        let item = line.trim();
        if item.is_empty() || item.starts_with('#') {
            continue;
        }
        if line.starts_with(char::is_whitespace) {
            if let Some(group) = &current {
                groups
                    .entry(String::clone(group))
                    .or_default()
                    .push(item.to_owned());
            }
        } else {
            current = Some(item.to_owned());
        }
    }
    fn expand(name: &str, groups: &BTreeMap<String, Vec<String>>, into: &mut BTreeSet<String>) {
        match groups.get(name) {
            Some(members) if name.starts_with('@') => {
                for member in members {
                    expand(member, groups, into);
                }
            }
            _ => {
                into.insert(name.to_owned());
            }
        }
    }
    let mut allowed = BTreeSet::new();
    for value in unit_values(unit, "SystemCallFilter") {
        let (remove, names) = match value.strip_prefix('~') {
            Some(names) => (true, names),
            None => (false, value),
        };
        let mut set = BTreeSet::new();
        for name in names.split_whitespace() {
            expand(name, &groups, &mut set);
        }
        if remove {
            allowed.retain(|s| !set.contains(s));
        } else {
            allowed.extend(set);
        }
    }
    assert!(allowed.contains("read"), "no allow list in the unit?");
    allowed
}

/// The system calls in an `strace -c` summary: its rows start with a percentage and end with
/// the call's name.
fn traced_syscalls(summary: &str) -> BTreeSet<String> {
    summary
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|first| first.parse::<f64>().is_ok())
        })
        .filter_map(|l| l.split_whitespace().last())
        .filter(|name| *name != "total")
        .map(str::to_owned)
        .collect()
}

#[test]
fn daemon_works_as_the_unit_runs_it() {
    // As the unit runs it: a non-root user (nobody stands in for the dynamic user) holding
    // only the unit's capabilities, in a mount namespace where the JVM's JDK and its classes
    // directory (in /tmp) are hidden (what ProtectHome, PrivateTmp or ProtectSystem could do to
    // a JVM's files), under strace to collect the system calls the unit's filter must allow.
    // Only those two directories are hidden, not all of /tmp: the checkout (with the daemon
    // binary and this test's output directory) may itself live under /tmp.
    let unit =
        std::fs::read_to_string(root().join("deploy/systemd/jvm-profiler.service")).expect("unit");
    let caps: Vec<String> = unit_values(&unit, "AmbientCapabilities")
        .join(" ")
        .split_whitespace()
        .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
        .collect();
    let caps = format!("-all,{}", caps.join(","));

    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let jdk_dir = jdk.java.parent().and_then(Path::parent).expect("JDK home");
    let work = tempfile::tempdir().expect("tempdir in /tmp");
    let classes = compile_java(&["Spin.java"], work.path()).expect("javac");
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");

    let out = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir");
    let nobody = 65534;
    let path = std::ffi::CString::new(out.path().to_str().expect("utf-8")).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::chown(path.as_ptr(), nobody, nobody) }, 0);
    let summary = out.path().join("strace.txt");
    // Exercise the network paths too: metrics, and a Pyroscope that refuses connections.
    let config = out.path().join("config.toml");
    std::fs::write(
        &config,
        "metrics_listen = \"127.0.0.1:0\"\n\
         [pyroscope]\nurl = \"http://127.0.0.1:9\"\nshutdown_grace_secs = 1\n",
    )
    .expect("config");
    let script = format!(
        "mount -t tmpfs tmpfs {jvm_files} && mount -t tmpfs tmpfs {jdk_dir} && \
         exec setpriv --reuid={nobody} --regid={nobody} --clear-groups \
         --inh-caps={caps} --ambient-caps={caps} --bounding-set={caps} \
         strace -f -qq -c -o {summary} {daemon} run --config {config} --pid {pid} \
         --duration 6 --interval 3 --output {out} --grpc-listen off",
        config = config.display(),
        jdk_dir = jdk_dir.display(),
        jvm_files = work.path().display(),
        summary = summary.display(),
        daemon = daemon_binary().display(),
        pid = jvm.pid(),
        out = out.path().display(),
    );
    let output = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .env("RUST_LOG", "info")
        .output()
        .expect("unshare");
    let log = String::from_utf8_lossy(&output.stderr);
    eprintln!("--- daemon (unit's user and capabilities) ---\n{log}");
    assert!(output.status.success(), "the daemon failed");
    assert!(
        !log.contains("without CAP_SYS_PTRACE"),
        "capability missing"
    );
    assert!(log.contains("JVM layout pushed"), "the JVM was not read");
    assert_java_frames(out.path(), jvm.pid(), "Spin.work");

    let used = traced_syscalls(&std::fs::read_to_string(&summary).expect("strace summary"));
    let allowed = allowed_syscalls(&unit);
    let denied: Vec<&String> = used.difference(&allowed).collect();
    eprintln!(
        "{} system calls used, all in the unit's filter: {used:?}",
        used.len()
    );
    assert!(
        denied.is_empty(),
        "the unit's SystemCallFilter denies {denied:?}"
    );
}

/// A pprof file of `pid` in `dir` has a sample with a frame named `name`.
fn assert_java_frames(dir: &Path, pid: u32, name: &str) {
    let profiles = profiles_of(dir, pid).expect("profiles readable");
    assert!(
        !profiles.is_empty(),
        "no profile of pid {pid} in {}",
        dir.display()
    );
    let named = profiles.iter().any(|(_, profile)| {
        profile.sample.iter().any(|s| {
            sample_frames(profile, s)
                .iter()
                .any(|f| f.name.contains(name))
        })
    });
    assert!(named, "no frame named {name} in the profiles of pid {pid}");
}

/// A container removed when dropped, so a failing test leaves none running.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args(["rm", "--force", "--ignore", &self.0])
            .output();
    }
}

/// `podman run` options this host needs. runc, because crun refuses hosts with cgroup v1 and
/// v2 hierarchies mounted side by side (this VM); explicit rlimits, because podman's default
/// raises them past what this sandbox may set.
fn podman_host_options() -> Vec<String> {
    let mut options = Vec::new();
    if command_exists("runc") {
        options.extend(["--runtime".to_owned(), "runc".to_owned()]);
    }
    let limit = |resource, cap: u64| {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: getrlimit writes into the struct it is given.
        unsafe { libc::getrlimit(resource, &mut limit) };
        limit.rlim_cur.min(cap)
    };
    let nofile = limit(libc::RLIMIT_NOFILE, 65_536);
    let nproc = limit(libc::RLIMIT_NPROC, 4096);
    options.push(format!("--ulimit=nofile={nofile}:{nofile}"));
    options.push(format!("--ulimit=nproc={nproc}:{nproc}"));
    options
}

/// Runs the image as `name` with `security` options against `pid`; checks, while it runs,
/// that the cgroup parser finds this container's id for the daemon's host process (false if
/// the container was gone before it could be looked at).
fn run_image(name: &str, security: &[String], pid: u32, out: &Path) -> (Output, bool) {
    let _guard = Container(name.to_owned());
    let child = Command::new("podman")
        .args(["run", "--rm", "--name", name, "--pid=host"])
        .args(podman_host_options())
        .args(security)
        .arg("--volume=/sys/kernel/btf:/sys/kernel/btf:ro")
        .arg(format!("--volume={}:/profiles", out.display()))
        .args(["--env", "RUST_LOG=info", "localhost/jvm-profiler:latest"])
        .args([
            "run",
            "--duration",
            "8",
            "--interval",
            "4",
            "--output",
            "/profiles",
        ])
        .args(["--grpc-listen", "off", "--pid", &pid.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("podman run");

    let deadline = Instant::now() + Duration::from_secs(6);
    let inspected = loop {
        let output = Command::new("podman")
            .args(["inspect", "--format", "{{.State.Pid}} {{.Id}}", name])
            .output()
            .expect("podman inspect");
        let text = String::from_utf8_lossy(&output.stdout).trim().to_owned();
        if output.status.success() && !text.starts_with("0 ") && !text.is_empty() {
            break Some(text);
        }
        if Instant::now() > deadline {
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let looked_at = inspected.is_some();
    if let Some((host_pid, id)) = inspected.as_deref().and_then(|t| t.split_once(' ')) {
        let host_pid: u32 = host_pid.parse().expect("pid");
        let info = profiler_daemon::container::read(host_pid)
            .expect("/proc/PID/cgroup")
            .expect("the daemon's process is in a container");
        eprintln!("daemon in container: host pid {host_pid}, {info:?}");
        assert_eq!(info.container_id.as_deref(), Some(id));
        assert_eq!(info.runtime_name(), Some("podman"));
    }
    let output = child.wait_with_output().expect("podman run");
    eprintln!(
        "--- containerised daemon ({name}) ---\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    (output, looked_at)
}

const IMAGE_TAG: &str = "localhost/jvm-profiler:latest";

#[test]
fn container_image_profiles_a_jvm_on_the_host() {
    if !command_exists("podman") {
        skip_or_fail(
            "podman",
            "podman is not installed (cargo xtask test installs it)",
        );
        return;
    }
    let built = xtask(&["image"], &daemon_binary());
    assert!(built.status.success(), "cargo xtask image failed");

    // Whether this host can run containers at all (storage, cgroups, runtime).
    let probe = Command::new("podman")
        .args(["run", "--rm"])
        .args(podman_host_options())
        .args(["localhost/jvm-profiler:latest", "--version"])
        .output()
        .expect("podman run");
    if !probe.status.success() {
        let why = String::from_utf8_lossy(&probe.stderr);
        let environment = ["OCI", "runtime", "cgroup", "storage", "namespace"]
            .iter()
            .any(|word| why.contains(word));
        assert!(environment, "the image does not start: {why}");
        skip_or_fail(
            "podman",
            &format!("podman cannot run containers on this host: {why}"),
        );
        return;
    }

    let dir = tempfile::tempdir().expect("tempdir");
    let classes = compile_java(&["Spin.java"], dir.path()).expect("javac");
    let jdk = jdks().into_iter().find(|j| j.major == 17).expect("JDK 17");
    let jvm = start_java(&jdk, &classes, "Spin", &[]).expect("JVM starts");

    // As the issue asks: privileged, in the host's PID namespace.
    let privileged = dir.path().join("privileged");
    std::fs::create_dir(&privileged).expect("mkdir");
    let name = format!("jvm-profiler-test-{}", std::process::id());
    let (output, looked_at) =
        run_image(&name, &["--privileged".to_owned()], jvm.pid(), &privileged);
    assert!(output.status.success(), "privileged container failed");
    assert!(looked_at, "the container's cgroup was not checked");
    assert_java_frames(&privileged, jvm.pid(), "Spin.work");

    // The sidecar agent ships in the image: attaching from the container copies it into the
    // JVM's filesystem and loads it (JDK 17 prints no dynamic-agent warning).
    let attach = Command::new("podman")
        .args(["run", "--rm", "--privileged", "--pid=host"])
        .args(podman_host_options())
        .args([IMAGE_TAG, "attach", &jvm.pid().to_string()])
        .output()
        .expect("podman run attach");
    eprintln!(
        "--- attach from the container ---\n{}{}",
        String::from_utf8_lossy(&attach.stdout),
        String::from_utf8_lossy(&attach.stderr)
    );
    assert!(attach.status.success(), "attach from the image failed");
    let records = agent_records_file(jvm.pid());
    assert!(
        records.exists(),
        "no agent records at {}",
        records.display()
    );

    // As the DaemonSet runs it: only its capabilities, no privilege escalation, read-only root,
    // seccomp and AppArmor unconfined.
    let minimal = dir.path().join("minimal");
    std::fs::create_dir(&minimal).expect("mkdir");
    let caps = CAPABILITIES
        .iter()
        .map(|c| c.to_lowercase())
        .collect::<Vec<_>>()
        .join(",");
    let security = [
        "--cap-drop=all".to_owned(),
        format!("--cap-add={caps}"),
        "--security-opt=seccomp=unconfined".to_owned(),
        "--security-opt=apparmor=unconfined".to_owned(),
        "--security-opt=no-new-privileges".to_owned(),
        "--read-only".to_owned(),
    ];
    let (output, _) = run_image(&format!("{name}-caps"), &security, jvm.pid(), &minimal);
    assert!(
        output.status.success(),
        "container with the DaemonSet's capabilities failed"
    );
    assert!(
        !String::from_utf8_lossy(&output.stderr).contains("without CAP_SYS_PTRACE"),
        "capability missing"
    );
    assert_java_frames(&minimal, jvm.pid(), "Spin.work");

    let size = stdout_of(Command::new("podman").args([
        "image",
        "inspect",
        "--format",
        "{{.Size}}",
        "localhost/jvm-profiler:latest",
    ]));
    eprintln!(
        "image size: {:.1} MB (debug daemon; `cargo xtask image` builds a release one)",
        size.trim().parse::<f64>().unwrap_or(0.0) / 1e6
    );
}
