//! spec.tls.issuerRef for real: cert-manager's CA issuer issues memcached's certificate, a
//! client that trusts the binding's `ca.crt` verifies it by the binding's `host`, and a renewal
//! cert-manager makes is served by the same memcached processes, every key kept.

use std::net::SocketAddr;
use std::time::Instant;

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Patch, PatchParams, PostParams};
use kube::core::{DynamicObject, GroupVersionKind};
use kube::discovery::ApiResource;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator_testkit::cert_manager::CertManager;
use memcached_operator_testkit::memcached::Connection;
use serde_json::json;

use crate::harness::{
    CONVERGE, admin, cluster, create, member_pods, memcached, wait_converged, wait_for,
};
use crate::tls::{client_config, wait_renewal_served};
use crate::{
    RealNode, assert_keys, memcached_pid, operator_with_agent, pod_ip, real_namespace,
    restart_counts, write_keys,
};

fn cert_manager_api(client: &Client, ns: &str, kind: &str) -> Api<DynamicObject> {
    let gvk = GroupVersionKind::gvk("cert-manager.io", "v1", kind);
    Api::namespaced_with(client.clone(), ns, &ApiResource::from_gvk(&gvk))
}

/// A CA of cert-manager's own in `ns`: a self-signed root in Secret `ca`, and Issuer `ca` that
/// signs with it.
async fn ca_issuer(client: &Client, ns: &str) {
    let objects = [
        (
            "Issuer",
            json!({"metadata": {"name": "selfsigned"}, "spec": {"selfSigned": {}}}),
        ),
        (
            "Certificate",
            json!({"metadata": {"name": "ca"}, "spec": {
                "isCA": true, "commonName": "memcached test CA", "secretName": "ca",
                "issuerRef": {"name": "selfsigned", "kind": "Issuer"},
            }}),
        ),
        (
            "Issuer",
            json!({"metadata": {"name": "ca"}, "spec": {"ca": {"secretName": "ca"}}}),
        ),
    ];
    for (kind, mut object) in objects {
        object["apiVersion"] = json!("cert-manager.io/v1");
        object["kind"] = json!(kind);
        let object: DynamicObject = serde_json::from_value(object).unwrap();
        cert_manager_api(client, ns, kind)
            .create(&PostParams::default(), &object)
            .await
            .unwrap();
    }
}

/// A condition's status, reason and message.
fn condition_of(mc: &Memcached, type_: &str) -> Option<(String, String, String)> {
    let c = mc
        .status
        .as_ref()?
        .conditions
        .iter()
        .find(|c| c.type_ == type_)?;
    Some((c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// What `cmctl renew` does: marks the Certificate for issuance now.
async fn renew(client: &Client, ns: &str, name: &str) {
    let certificates = cert_manager_api(client, ns, "Certificate");
    let mut conditions = certificates.get_status(name).await.unwrap().data["status"]["conditions"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    conditions.retain(|c| c["type"] != "Issuing");
    conditions.push(json!({
        "type": "Issuing", "status": "True", "reason": "ManuallyTriggered",
        "message": "Certificate re-issuance manually triggered",
        "lastTransitionTime": k8s_openapi::jiff::Timestamp::now().to_string(),
    }));
    certificates
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"conditions": conditions}})),
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn cert_manager_issues_and_renews_the_certificate_memcached_serves_in_place() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "issuer").await;
    let cluster = cluster();
    // Installs cert-manager's CRDs before the operator asks which kinds are served.
    let _cert_manager = CertManager::start(&cluster, &ns, &cluster.dir.join("logs"))
        .await
        .unwrap();
    let _op = operator_with_agent(&client, &node, &ns).await;
    let mut mc = memcached("cache", 2);
    mc.spec = serde_json::from_value(json!({
        "size": 2, "binding": {"enabled": true},
        "tls": {"enabled": true, "issuerRef": {"name": "ca"}},
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    // The Issuer does not exist yet: the pods cannot start, and the status says where to look.
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pending = wait_for("Available=False, CertificatePending", CONVERGE, || async {
        let (status, reason, message) = condition_of(&mcs.get("cache").await.ok()?, "Available")?;
        (status == "False" && reason == "CertificatePending").then_some(message)
    })
    .await;
    assert!(
        pending.contains("cache-tls") && pending.contains("Certificate cache"),
        "{pending}"
    );
    ca_issuer(&client, &ns).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let pods = member_pods(&client, &ns, "cache").await;

    // What an application reads from its binding is enough to verify the server.
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let bound = wait_for("the binding with the issuer's CA", CONVERGE, || async {
        let data = secrets.get_opt("cache-binding").await.ok()??.data?;
        data.contains_key("ca.crt").then_some(data)
    })
    .await;
    let entry = |key: &str| String::from_utf8(bound[key].0.clone()).unwrap();
    let (host, verified) = (entry("host"), client_config(&entry("ca.crt"), None));
    assert_eq!(host, format!("cache.{ns}.svc"));
    let mut served = Vec::new();
    for pod in &pods {
        let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
        let mut conn = Connection::connect_tls(addr, &host, verified.clone())
            .await
            .unwrap();
        write_keys(&mut conn).await;
        served.push(conn.server_certificate().unwrap());
    }
    let pids: Vec<u32> = pods.iter().map(memcached_pid).collect();

    // cert-manager renews: the same processes serve the new certificate.
    let renewed = Instant::now();
    renew(&client, &ns, "cache").await;
    wait_renewal_served(&pods, &host, &verified, &served).await;
    println!(
        "cert-manager's renewal served after {:?}",
        renewed.elapsed()
    );
    for (i, pod) in member_pods(&client, &ns, "cache").await.iter().enumerate() {
        assert_eq!(pod.name_any(), pods[i].name_any());
        let restarts = restart_counts(pod);
        assert!(restarts.values().all(|&n| n == 0), "{restarts:?}");
        assert_eq!(memcached_pid(pod), pids[i]);
        let addr = SocketAddr::new(pod_ip(pod).into(), 11211);
        let mut conn = Connection::connect_tls(addr, &host, verified.clone())
            .await
            .unwrap();
        assert_keys(&mut conn, pod).await;
    }
}
