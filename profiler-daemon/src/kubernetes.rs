//! Kubernetes metadata: the pods of this node, watched through the API server, indexed by the
//! container ids and pod uids that `container` reads off each process's cgroup.
//!
//! Only pods on this node are listed and watched (field selector `spec.nodeName`), so the daemon
//! needs nothing beyond `get/list/watch pods`. kube's watcher relists on its own after a `410
//! Gone`; deleted pods are kept for a while, so the last profiles of a container that just exited
//! still get its labels.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt as _;
use tokio_stream::StreamExt as _;

use crate::config_error::{invalid, ConfigError};
use crate::container::ContainerInfo;

/// What configuration reads from the host rather than from the file or flags: the facts the
/// Kubernetes defaults depend on. Read once and passed in, so that resolving a configuration
/// is a function of its inputs (and testable).
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

/// The node whose pods label processes (`kubernetes`, `node_name`), or `None` when Kubernetes
/// metadata is off. On by default in a pod; the node defaults to `NODE_NAME`, then the host name.
pub fn node_to_watch(
    enabled: Option<bool>,
    node_name: Option<String>,
    environment: &Environment,
) -> Result<Option<String>, ConfigError> {
    if !enabled.unwrap_or(environment.in_kubernetes) {
        return Ok(None);
    }
    let node = node_name
        .or_else(|| environment.node_name.clone())
        .or_else(|| environment.host_name.clone())
        .unwrap_or_default();
    if node.trim().is_empty() {
        return Err(invalid(
            "node_name",
            "unknown: set it, or NODE_NAME (the downward API's spec.nodeName)",
        ));
    }
    Ok(Some(node))
}

/// How long a deleted pod's metadata is kept for the profiles of its last interval.
const DELETED_POD_GRACE: Duration = Duration::from_secs(300);
/// Pod annotation that names the service, as Grafana's agents read it.
pub const SERVICE_NAME_ANNOTATION: &str = "pyroscope.io/service_name";

/// What the profiles of a container of this pod are labelled with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInfo {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub node: Option<String>,
    /// The `pyroscope.io/service_name` annotation.
    pub service_name: Option<String>,
    /// The controller: kind (lowercase) and name, a Deployment rather than its ReplicaSet.
    pub workload: Option<(String, String)>,
    /// `app.kubernetes.io/name`, else `app`.
    pub app: Option<String>,
    /// Container id (runtime prefix removed) -> container name.
    pub containers: HashMap<String, String>,
}

/// A process's pod, and its container's name when the container id is known to the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodMatch {
    pub pod: Arc<PodInfo>,
    pub container: Option<String>,
}

#[derive(Default)]
pub struct PodIndex {
    by_uid: HashMap<String, Arc<PodInfo>>,
    by_container: HashMap<String, (Arc<PodInfo>, String)>,
    /// Pods deleted (or gone at a relist), with when.
    deleted: HashMap<String, Instant>,
}

pub type SharedPodIndex = Arc<RwLock<PodIndex>>;

impl PodIndex {
    pub fn apply(&mut self, pod: PodInfo) {
        self.deleted.remove(&pod.uid);
        let pod = Arc::new(pod);
        for (id, name) in &pod.containers {
            self.by_container
                .insert(id.clone(), (pod.clone(), name.clone()));
        }
        self.by_uid.insert(pod.uid.clone(), pod);
    }

    /// Marks a pod deleted; it stays findable for `DELETED_POD_GRACE`.
    pub fn delete(&mut self, uid: &str, now: Instant) {
        if self.by_uid.contains_key(uid) {
            self.deleted.entry(uid.to_string()).or_insert(now);
        }
    }

    /// After a (re)list: pods not in it are deleted.
    pub fn keep_only(&mut self, listed: &[String], now: Instant) {
        let gone: Vec<String> = self
            .by_uid
            .keys()
            .filter(|uid| !listed.contains(uid))
            .cloned()
            .collect();
        for uid in gone {
            self.delete(&uid, now);
        }
    }

    /// Forgets pods deleted more than the grace period ago.
    pub fn purge(&mut self, now: Instant) {
        let expired: Vec<String> = self
            .deleted
            .iter()
            .filter(|(_, at)| now.duration_since(**at) > DELETED_POD_GRACE)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in expired {
            self.deleted.remove(&uid);
            self.by_uid.remove(&uid);
            self.by_container.retain(|_, (pod, _)| pod.uid != uid);
        }
    }

    pub fn is_deleted(&self, uid: &str) -> bool {
        self.deleted.contains_key(uid)
    }

    pub fn len(&self) -> usize {
        self.by_uid.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_uid.is_empty()
    }

    /// The pod of a process, by its container id, else by its pod uid.
    pub fn lookup(&self, container: &ContainerInfo) -> Option<PodMatch> {
        if let Some((pod, name)) = container
            .container_id
            .as_ref()
            .and_then(|id| self.by_container.get(id))
        {
            return Some(PodMatch {
                pod: pod.clone(),
                container: Some(name.clone()),
            });
        }
        let pod = self.by_uid.get(container.pod_uid.as_ref()?)?;
        Some(PodMatch {
            pod: pod.clone(),
            container: None,
        })
    }
}

/// The labels and ids we keep of a pod; `None` for a pod without uid, name or namespace.
pub fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let meta = &pod.metadata;
    let labels = meta.labels.clone().unwrap_or_default();
    let mut containers = HashMap::new();
    if let Some(status) = &pod.status {
        let all = [
            &status.container_statuses,
            &status.init_container_statuses,
            &status.ephemeral_container_statuses,
        ];
        for status in all.into_iter().flatten().flatten() {
            // `containerd://<id>`, `cri-o://<id>`, `docker://<id>`.
            if let Some(id) = status.container_id.as_deref().and_then(strip_runtime) {
                containers.insert(id.to_string(), status.name.clone());
            }
        }
    }
    Some(PodInfo {
        uid: meta.uid.clone()?,
        namespace: meta.namespace.clone()?,
        name: meta.name.clone()?,
        node: pod.spec.as_ref().and_then(|spec| spec.node_name.clone()),
        service_name: meta
            .annotations
            .as_ref()
            .and_then(|a| a.get(SERVICE_NAME_ANNOTATION))
            .filter(|name| !name.trim().is_empty())
            .cloned(),
        workload: workload(pod, &labels),
        app: labels
            .get("app.kubernetes.io/name")
            .or_else(|| labels.get("app"))
            .cloned(),
        containers,
    })
}

fn strip_runtime(id: &str) -> Option<&str> {
    let (_, id) = id.split_once("://")?;
    (!id.is_empty()).then_some(id)
}

/// The pod's controller; a ReplicaSet made by a Deployment is reported as the Deployment.
fn workload(pod: &Pod, labels: &BTreeMap<String, String>) -> Option<(String, String)> {
    let owner = pod
        .metadata
        .owner_references
        .as_ref()?
        .iter()
        .find(|owner| owner.controller == Some(true))?;
    if owner.kind == "ReplicaSet" {
        if let Some(hash) = labels.get("pod-template-hash") {
            if let Some(deployment) = owner.name.strip_suffix(&format!("-{hash}")) {
                return Some(("deployment".into(), deployment.to_string()));
            }
        }
    }
    Some((owner.kind.to_lowercase(), owner.name.clone()))
}

/// Keeps `index` up to date with the pods of `node` until the task is dropped. Errors (API
/// server unreachable, forbidden) are logged and retried with backoff, never fatal.
pub async fn watch_node_pods(client: kube::Client, node: String, index: SharedPodIndex) {
    let pods: kube::Api<Pod> = kube::Api::all(client);
    let config = watcher::Config::default().fields(&format!("spec.nodeName={node}"));
    let mut events = std::pin::pin!(watcher::watcher(pods, config).default_backoff());
    let mut listing: Vec<String> = Vec::new();
    let mut errors: u64 = 0;
    while let Some(event) = events.next().await {
        let now = Instant::now();
        let Ok(mut index) = index.write() else {
            return;
        };
        match event {
            Ok(Event::Init) => listing.clear(),
            Ok(Event::InitApply(pod)) | Ok(Event::Apply(pod)) => {
                if let Some(info) = pod_info(&pod) {
                    listing.push(info.uid.clone());
                    index.apply(info);
                }
            }
            Ok(Event::InitDone) => {
                index.keep_only(&listing, now);
                tracing::info!(node = %node, pods = listing.len(), "kubernetes: pods of this node listed");
            }
            Ok(Event::Delete(pod)) => {
                if let Some(uid) = &pod.metadata.uid {
                    index.delete(uid, now);
                }
            }
            Err(err) => {
                errors += 1;
                if errors.is_power_of_two() {
                    tracing::warn!(%err, errors, "kubernetes: watching pods failed, retrying");
                }
            }
        }
        index.purge(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    const ID_A: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
    const ID_C: &str = "cccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccccc";

    fn pod_json(name: &str, uid: &str, container_id: &str) -> serde_json::Value {
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": "shop",
                "uid": uid,
                "resourceVersion": "1",
                "labels": {"app": "orders", "pod-template-hash": "5d8f7c9b4"},
                "annotations": {"pyroscope.io/service_name": format!("svc-{name}")},
                "ownerReferences": [{
                    "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "orders-5d8f7c9b4",
                    "uid": "rs-uid", "controller": true
                }]
            },
            "spec": {"nodeName": "node-a", "containers": [{"name": "app"}]},
            "status": {"containerStatuses": [{
                "name": "app", "containerID": format!("containerd://{container_id}"),
                "image": "orders:1", "imageID": "sha256:1", "ready": true, "restartCount": 0
            }]}
        })
    }

    fn list(resource_version: &str, pods: Vec<serde_json::Value>) -> String {
        serde_json::json!({
            "apiVersion": "v1", "kind": "PodList",
            "metadata": {"resourceVersion": resource_version},
            "items": pods
        })
        .to_string()
    }

    fn event(kind: &str, object: serde_json::Value) -> String {
        format!("{}\n", serde_json::json!({"type": kind, "object": object}))
    }

    /// Replays an API server: the first list, a watch that adds C, deletes B and then expires
    /// (410), the relist that follows, and a quiet watch.
    async fn serve_recorded_api(
        listener: tokio::net::TcpListener,
        requests: Arc<RwLock<Vec<String>>>,
    ) {
        let mut lists = 0;
        let mut watches = 0;
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            let mut buffer = vec![0u8; 8192];
            let n = stream.read(&mut buffer).await.unwrap_or(0);
            let request = String::from_utf8_lossy(&buffer[..n]).to_string();
            let path = request.split_whitespace().nth(1).unwrap_or("").to_string();
            requests.write().expect("lock").push(path.clone());
            assert!(
                path.contains("fieldSelector=spec.nodeName%3Dnode-a"),
                "{path}"
            );
            let body = if path.contains("watch=true") {
                watches += 1;
                if watches == 1 {
                    let mut body = event("ADDED", pod_json("c", "uid-c", ID_C));
                    body += &event("DELETED", pod_json("b", "uid-b", &"b".repeat(64)));
                    body += &event(
                        "ERROR",
                        serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {},
                            "status": "Failure", "message": "too old resource version",
                            "reason": "Expired", "code": 410}),
                    );
                    body
                } else {
                    // Stay quiet, like a watch with nothing to say.
                    tokio::time::sleep(Duration::from_secs(30)).await;
                    String::new()
                }
            } else {
                lists += 1;
                if lists == 1 {
                    list(
                        "100",
                        vec![
                            pod_json("a", "uid-a", ID_A),
                            pod_json("b", "uid-b", &"b".repeat(64)),
                        ],
                    )
                } else {
                    // The relist: A is gone too (deleted while we were expired), D is new.
                    list(
                        "200",
                        vec![
                            pod_json("c", "uid-c", ID_C),
                            pod_json("d", "uid-d", &"d".repeat(64)),
                        ],
                    )
                }
            };
            let head =
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: close\r\n\r\n";
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.shutdown().await;
        }
    }

    #[test]
    fn watch_lists_applies_deletes_and_relists_after_410() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind");
            let url = format!("http://{}", listener.local_addr().expect("address"));
            let requests = Arc::new(RwLock::new(Vec::new()));
            tokio::spawn(serve_recorded_api(listener, requests.clone()));
            let config = kube::Config::new(url.parse().expect("url"));
            let client = kube::Client::try_from(config).expect("client");
            let index: SharedPodIndex = Arc::default();
            let watch = tokio::spawn(watch_node_pods(client, "node-a".into(), index.clone()));

            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let done = {
                    let index = index.read().expect("lock");
                    index.by_uid.contains_key("uid-d")
                };
                if done || Instant::now() > deadline {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            watch.abort();

            let index = index.read().expect("lock");
            let lists = requests
                .read()
                .expect("lock")
                .iter()
                .filter(|path| !path.contains("watch=true"))
                .count();
            assert_eq!(lists, 2, "relisted after the 410: {:?}", requests.read());
            // B was deleted by a watch event, A by its absence from the relist: both kept for
            // the grace period, then forgotten.
            assert!(index.is_deleted("uid-b") && index.is_deleted("uid-a"));
            assert!(!index.is_deleted("uid-c") && !index.is_deleted("uid-d"));
            let by_container = index
                .lookup(&ContainerInfo {
                    container_id: Some(ID_C.into()),
                    ..Default::default()
                })
                .expect("pod C by container id");
            assert_eq!(by_container.pod.name, "c");
            assert_eq!(by_container.container.as_deref(), Some("app"));
            assert_eq!(by_container.pod.service_name.as_deref(), Some("svc-c"));
            assert_eq!(
                by_container.pod.workload,
                Some(("deployment".into(), "orders".into()))
            );
            assert_eq!(by_container.pod.app.as_deref(), Some("orders"));
            let by_uid = index
                .lookup(&ContainerInfo {
                    pod_uid: Some("uid-a".into()),
                    ..Default::default()
                })
                .expect("deleted pod A still known");
            assert_eq!(by_uid.container, None);
        });
    }

    #[test]
    fn deleted_pods_are_forgotten_after_the_grace_period() {
        let mut index = PodIndex::default();
        let pod: Pod = serde_json::from_value(pod_json("a", "uid-a", ID_A)).expect("pod");
        index.apply(pod_info(&pod).expect("complete pod"));
        let start = Instant::now();
        index.delete("uid-a", start);
        index.purge(start + Duration::from_secs(10));
        assert_eq!(index.len(), 1);
        index.purge(start + DELETED_POD_GRACE + Duration::from_secs(1));
        assert!(index.is_empty());
        let lookup = index.lookup(&ContainerInfo {
            container_id: Some(ID_A.into()),
            ..Default::default()
        });
        assert!(lookup.is_none());
    }
}
