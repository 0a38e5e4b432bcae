//! kwok nodes of the tests' own. A loopback node's pods answer on this host: kwok gives pods
//! addresses from their node's `podCIDR`, and on a loopback network (127.0.0.0/8) a scripted
//! server bound to a pod's address answers where the operator connects to the real one (the
//! autoscaler's `stats`). Zoned nodes give their pods zones (the proxy's zone-local reads).

use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::{Api, PostParams};

/// Kept off the node by a taint: only pods that tolerate it land there.
pub const LOOPBACK_TAINT: &str = "memcached-operator.dev/loopback";

/// Creates (or keeps) kwok node `name` with pods on `pod_cidr` (under 127.0.0.0/8), room for
/// `pods`, tainted with `LOOPBACK_TAINT`.
pub async fn loopback_node(
    client: &Client,
    name: &str,
    pod_cidr: &str,
    pods: u32,
) -> kube::Result<()> {
    let labels = serde_json::json!({"type": "kwok", "kubernetes.io/hostname": name});
    fake_node(client, name, labels, (pod_cidr, pods), LOOPBACK_TAINT).await
}

/// Creates (or keeps) kwok node `name` labelled `labels`, with room for `pods` on `pod_cidr`,
/// tainted with `taint`.
async fn fake_node(
    client: &Client,
    name: &str,
    labels: serde_json::Value,
    (pod_cidr, pods): (&str, u32),
    taint: &str,
) -> kube::Result<()> {
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {"node.alpha.kubernetes.io/ttl": "0", "kwok.x-k8s.io/node": "fake"},
            "labels": labels,
        },
        "spec": {
            "podCIDR": pod_cidr, "podCIDRs": [pod_cidr],
            "taints": [{"key": taint, "value": "true", "effect": "NoSchedule"}],
        },
        "status": {
            "allocatable": {"cpu": "1000", "memory": "4Ti", "pods": pods.to_string()},
            "capacity": {"cpu": "1000", "memory": "4Ti", "pods": pods.to_string()},
        },
    }))
    .expect("a Node");
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The spec fields that put a Memcached's pods on node `name`: its nodeSelector and toleration.
pub fn on_loopback_node(name: &str) -> serde_json::Value {
    serde_json::json!({
        "nodeSelector": {"kubernetes.io/hostname": name},
        "tolerations": [{"key": LOOPBACK_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    })
}

/// Kept off the zoned nodes by a taint: only pods that tolerate it land there.
pub const ZONE_TAINT: &str = "memcached-operator.dev/zoned";

/// Creates (or keeps) kwok node `name` in zone `zone` (`topology.kubernetes.io/zone`, which
/// the API server copies onto the pods bound to it), with pods on `pod_cidr`, tainted with
/// `ZONE_TAINT` and labelled `ZONE_TAINT=true` for the pods that choose it.
pub async fn zone_node(
    client: &Client,
    name: &str,
    zone: &str,
    pod_cidr: &str,
) -> kube::Result<()> {
    let labels = serde_json::json!({
        "type": "kwok", "kubernetes.io/hostname": name,
        "topology.kubernetes.io/zone": zone, ZONE_TAINT: "true",
    });
    fake_node(client, name, labels, (pod_cidr, 100), ZONE_TAINT).await
}

/// The spec fields that put a Memcached's pods on the zoned nodes: its nodeSelector and
/// toleration.
pub fn on_zone_nodes() -> serde_json::Value {
    serde_json::json!({
        "nodeSelector": {ZONE_TAINT: "true"},
        "tolerations": [{"key": ZONE_TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    })
}
