//! spec.networkPolicy for real: kube-network-policies on the node enforces the operator's policy
//! on pod-to-pod connections; a client pod of the Memcached's namespace gets in, one of another
//! namespace does not.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use memcached_operator::api::Memcached;
use serde_json::json;

use crate::harness::{CONVERGE, admin, create, member_pods, memcached, wait_converged, wait_for};
use crate::{RealNode, busybox_pod, memcached::operator_for, pod_ip, real_namespace};

/// How long a new policy may take to be enforced: the engine's informers see it at once.
const ENFORCED: Duration = Duration::from_secs(60);

/// Runs a pod in `ns` that sets and gets a key on `ip`; whether it got the value back.
async fn client_gets_in(client: &Client, node: &RealNode, ns: &str, ip: Ipv4Addr) -> bool {
    let script = format!(
        "printf 'set k 0 0 2\\r\\nhi\\r\\nget k\\r\\nquit\\r\\n' \
         | /bin/busybox timeout 10 /bin/busybox nc -w 5 {ip} 11211 \
         | /bin/busybox grep -q 'VALUE k'"
    );
    busybox_pod(client, node, ns, &script, json!({})).await.0
}

#[tokio::test]
async fn the_policy_admits_the_namespace_and_refuses_other_namespaces() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "netpol").await;
    let elsewhere = real_namespace(&client, "netpol-other").await;
    let _op = operator_for(&client, &node, &ns).await;
    create(&client, &ns, &memcached("cache", 1)).await;
    wait_converged(&client, &ns, "cache", 1).await;
    let ip = pod_ip(&member_pods(&client, &ns, "cache").await[0]);

    // Without a policy the network lets everyone in: what follows is the policy's doing.
    assert!(client_gets_in(&client, &node, &elsewhere, ip).await);

    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"networkPolicy": {"enabled": true}}})),
    )
    .await
    .unwrap();
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    wait_for("the operator's NetworkPolicy", CONVERGE, || async {
        policies.get_opt("cache").await.ok()?
    })
    .await;
    let applied = Instant::now();
    wait_for(
        "a client of another namespace refused",
        ENFORCED,
        || async { (!client_gets_in(&client, &node, &elsewhere, ip).await).then_some(()) },
    )
    .await;
    println!(
        "policy enforced {:?} after it was applied",
        applied.elapsed()
    );
    assert!(
        client_gets_in(&client, &node, &ns, ip).await,
        "a client of the Memcached's own namespace gets in"
    );
    // Still refused: not a passing glitch.
    assert!(!client_gets_in(&client, &node, &elsewhere, ip).await);
}
