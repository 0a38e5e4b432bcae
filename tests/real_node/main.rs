//! The real-node suite (`make test-real-node`, root): the local control plane with one real node
//! (containerd, runc, kubelet, kube-proxy, CoreDNS), where memcached and the operator run as real
//! containers from images built here. What kwok cannot show is shown here: processes, probes,
//! DNS, the memcached protocol.

mod auth;
mod autoscaling;
mod binding;
mod data_path;
#[allow(dead_code)]
#[path = "../e2e/harness.rs"]
mod harness;
mod issuer;
mod members;
mod memcached;
mod monitoring;
mod network_policy;
mod node;
mod operator_pod;
mod prometheus;
mod proxy;
mod proxy_cost;
mod proxy_security;
mod proxy_zones;
mod tls;
mod users_version;
mod why_not_ready;

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::{Api, Client, ResourceExt};
use memcached_operator_testkit::memcached::Connection;

/// `DIR/env` of the cluster started (`REAL_NODE=1 hack/e2e.sh`): the real node's facts.
pub struct RealNode {
    env: BTreeMap<String, String>,
}

impl RealNode {
    pub fn get() -> RealNode {
        let env = harness::cluster().env().expect("the cluster's env file");
        let node = RealNode { env };
        assert!(
            node.env.contains_key("REAL_NODE_NAME"),
            "the cluster has no real node: run with `make test-real-node`"
        );
        node
    }

    pub fn var(&self, key: &str) -> &str {
        self.env
            .get(key)
            .unwrap_or_else(|| panic!("{key} in the cluster's env"))
    }

    pub fn name(&self) -> &str {
        self.var("REAL_NODE_NAME")
    }

    /// The operator image (`hack/images.sh operator`: the Dockerfile's stages, cached), imported into
    /// the node's containerd.
    pub fn operator_image(&self) -> String {
        let images = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/images.sh");
        let status = std::process::Command::new(&images)
            .args(["import-operator", self.var("REAL_NODE_CONTAINERD_SOCKET")])
            .status()
            .expect("hack/images.sh runs");
        assert!(status.success(), "hack/images.sh import-operator");
        let env = std::process::Command::new(&images)
            .arg("--print-env")
            .output()
            .unwrap();
        String::from_utf8_lossy(&env.stdout)
            .lines()
            .find_map(|l| l.strip_prefix("OPERATOR_IMAGE="))
            .expect("OPERATOR_IMAGE from hack/images.sh --print-env")
            .to_string()
    }

    /// The memcached image built from Debian's package and imported into the node's containerd.
    pub fn memcached_image(&self) -> &str {
        self.var("MEMCACHED_IMAGE")
    }

    /// The kubelet's HTTPS endpoint (anonymous, AlwaysAllow on this throwaway node), e.g. for
    /// `/metrics/probes`.
    pub fn kubelet_url(&self) -> String {
        format!(
            "https://{}:{}",
            self.var("REAL_NODE_GATEWAY"),
            self.var("KUBELET_PORT")
        )
    }

    /// CoreDNS behind the kube-dns ClusterIP, which kube-proxy routes.
    pub fn dns(&self) -> SocketAddr {
        SocketAddr::new(self.var("REAL_NODE_DNS_IP").parse().unwrap(), 53)
    }

    /// Runs `ctr` against the node's containerd, in the kubelet's namespace.
    pub fn ctr(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("ctr")
            .arg("--address")
            .arg(self.var("REAL_NODE_CONTAINERD_SOCKET"))
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("ctr runs");
        assert!(
            out.status.success(),
            "ctr {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The operator as a process watching `ns`, with the node's memcached and exporter images and
/// its own image as the agent beside memcached (spec.auth, spec.tls).
pub async fn operator_with_agent(client: &Client, node: &RealNode, ns: &str) -> harness::Operator {
    operator_with_agent_image(client, node, ns, node.operator_image()).await
}

/// As `operator_with_agent`, the agent's image `agent` (an operator upgraded, for its
/// operands, is a new agent image).
pub async fn operator_with_agent_image(
    client: &Client,
    node: &RealNode,
    ns: &str,
    agent: String,
) -> harness::Operator {
    harness::Operator::start(
        client,
        harness::OperatorOptions {
            env: vec![
                (
                    "RELATED_IMAGE_MEMCACHED".into(),
                    node.memcached_image().into(),
                ),
                (
                    "RELATED_IMAGE_MEMCACHED_EXPORTER".into(),
                    node.var("EXPORTER_IMAGE").into(),
                ),
                ("RELATED_IMAGE_AGENT".into(), agent),
            ],
            ..harness::OperatorOptions::watching(ns)
        },
    )
    .await
}

/// The exporter's /metrics on `pod`, read from the host.
pub async fn exporter_metrics(pod: &Pod) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let addr = SocketAddr::new(pod_ip(pod).into(), 9150);
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: exporter\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).await.unwrap();
    body
}

/// Creates Secret `name` with the `username` and `password` keys spec.auth reads.
pub async fn create_credentials(
    secrets: &Api<k8s_openapi::api::core::v1::Secret>,
    name: &str,
    username: &str,
    password: &str,
) {
    let mut creds = k8s_openapi::api::core::v1::Secret {
        data: Some(memcached_operator::resources::auth::secret_data(
            username, password,
        )),
        ..Default::default()
    };
    creds.metadata.name = Some(name.into());
    secrets
        .create(&kube::api::PostParams::default(), &creds)
        .await
        .unwrap();
}

/// Runs `pymemcache_app.py` (Debian's python3 and python3-pymemcache, which the real node
/// installs) with `request`; its JSON answer.
pub async fn pymemcache(request: serde_json::Value) -> serde_json::Value {
    use tokio::io::AsyncWriteExt;
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/real_node/pymemcache_app.py");
    let mut child = tokio::process::Command::new("/usr/bin/python3")
        .arg(script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("/usr/bin/python3 runs");
    let mut stdin = child.stdin.take().unwrap();
    stdin
        .write_all(request.to_string().as_bytes())
        .await
        .unwrap();
    drop(stdin);
    let out = child.wait_with_output().await.unwrap();
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("pymemcache_app.py answered {out:?}: {e}"))
}

/// Keys the suites write and read back: `key-<i>` holds `value-<i>`.
pub const KEYS: usize = 100;

/// Writes the `KEYS` keys.
pub async fn write_keys<S>(conn: &mut Connection<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for i in 0..KEYS {
        conn.set(&format!("key-{i}"), format!("value-{i}").as_bytes())
            .await
            .unwrap();
    }
}

/// Reads every one of the `KEYS` keys back from memcached in `pod`.
pub async fn assert_keys<S>(conn: &mut Connection<S>, pod: &Pod)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    for k in 0..KEYS {
        assert_eq!(
            conn.get(&format!("key-{k}")).await.unwrap(),
            Some(format!("value-{k}")),
            "key-{k} on {}",
            pod.name_any()
        );
    }
}

/// The pid of the memcached process in `pod`.
pub fn memcached_pid(pod: &Pod) -> u32 {
    Process::in_pod(pod.metadata.uid.as_deref().unwrap(), "memcached")[0].pid
}

/// Each container's restart count, by name.
pub fn restart_counts(pod: &Pod) -> BTreeMap<String, i32> {
    pod.status
        .as_ref()
        .unwrap()
        .container_statuses
        .iter()
        .flatten()
        .map(|c| (c.name.clone(), c.restart_count))
        .collect()
}

/// A fresh namespace whose pods all go to the real node: the operator's Deployments carry no
/// toleration, so the namespace adds it and the node selector (PodTolerationRestriction and
/// PodNodeSelector admission, enabled with the real node).
pub async fn real_namespace(client: &Client, prefix: &str) -> String {
    let name = harness::namespace(client, prefix).await;
    send_pods_to_real_node(client, &name).await;
    name
}

/// Annotates (creating it if needed) namespace `name` so its pods go to the real node.
pub async fn send_pods_to_real_node(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "annotations": {
            "scheduler.alpha.kubernetes.io/node-selector": "type=real",
            "scheduler.alpha.kubernetes.io/defaultTolerations":
                r#"[{"key": "memcached-operator.dev/real-node", "operator": "Equal", "value": "true", "effect": "NoSchedule"}]"#,
        }}
    }))
    .unwrap();
    harness::apply(&Api::<Namespace>::all(client.clone()), &ns).await;
}

/// Runs `script` with the node's busybox in a pod of `ns` (non-root, no capabilities), with
/// `pod` merged into the pod's spec (volumes, the container's mounts and env under
/// `container`, the pod's labels under `labels`); whether it succeeded, and what it printed.
pub async fn busybox_pod(
    client: &Client,
    node: &RealNode,
    ns: &str,
    script: &str,
    mut pod: serde_json::Value,
) -> (bool, String) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let mut container = serde_json::json!({
        "name": "client",
        "image": node.var("PAUSE_IMAGE"),
        "imagePullPolicy": "Never",
        "command": ["/bin/busybox", "sh", "-c", script],
        "securityContext": {
            "runAsNonRoot": true, "runAsUser": 65534,
            "allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    });
    if let Some(extra) = pod.as_object_mut().and_then(|p| p.remove("container")) {
        container
            .as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
    }
    let labels = pod
        .as_object_mut()
        .and_then(|p| p.remove("labels"))
        .unwrap_or_default();
    let mut spec = serde_json::json!({
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    });
    spec.as_object_mut()
        .unwrap()
        .extend(pod.as_object().unwrap().clone());
    let manifest = serde_json::json!({
        "metadata": {"generateName": "client-", "labels": labels}, "spec": spec,
    });
    let pod: Pod = serde_json::from_value(manifest).unwrap();
    let pod = pods
        .create(&kube::api::PostParams::default(), &pod)
        .await
        .unwrap();
    let name = pod.metadata.name.unwrap();
    let phase = harness::wait_for(
        &format!("client {name} to finish"),
        harness::CONVERGE,
        || async {
            let phase = pods.get(&name).await.ok()?.status?.phase?;
            matches!(phase.as_str(), "Succeeded" | "Failed").then_some(phase)
        },
    )
    .await;
    let log = pods
        .logs(&name, &Default::default())
        .await
        .unwrap_or_else(|e| format!("(no log: {e})"));
    pods.delete(&name, &Default::default()).await.unwrap();
    (phase == "Succeeded", log)
}

pub fn pod_ip(pod: &Pod) -> Ipv4Addr {
    pod.status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .and_then(|ip| ip.parse().ok())
        .unwrap_or_else(|| panic!("pod {} has an IPv4 address", pod.name_any()))
}

/// What /proc says of one process.
pub struct Process {
    pub pid: u32,
    status: String,
    mountinfo: String,
}

impl Process {
    /// The processes named `comm` in the pod with this uid (its cgroup names the pod).
    pub fn in_pod(pod_uid: &str, comm: &str) -> Vec<Process> {
        let cgroup_key = format!("pod{pod_uid}");
        let mut found = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
                continue;
            };
            let read =
                |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap_or_default();
            if read("comm").trim() != comm || !read("cgroup").contains(&cgroup_key) {
                continue;
            }
            found.push(Process {
                pid,
                status: read("status"),
                mountinfo: read("mountinfo"),
            });
        }
        found
    }

    /// A field of /proc/PID/status, e.g. "Uid" or "CapEff".
    pub fn status(&self, field: &str) -> String {
        self.status
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")))
            .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
            .unwrap_or_default()
    }

    /// Whether its root file system is mounted read-only.
    pub fn root_is_read_only(&self) -> bool {
        self.mountinfo.lines().any(|l| {
            let fields: Vec<&str> = l.split_whitespace().collect();
            fields.get(4) == Some(&"/")
                && fields
                    .get(5)
                    .is_some_and(|o| o.split(',').any(|o| o == "ro"))
        })
    }
}
