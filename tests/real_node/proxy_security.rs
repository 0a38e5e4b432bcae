//! spec.auth and spec.tls through the proxy, for real: an application given only the proxy's
//! address speaks TLS to it, verifying the proxy's name, and logs in as it would to a member;
//! without the login, with a wrong password or in plain text it gets nothing; a rotated
//! password is taken through the proxy while the previous one keeps working for its grace, the
//! proxy's processes unchanged; and the members' relay for the proxy, which asks no login, is
//! shut to everyone else by the NetworkPolicy.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::resources::auth::secret_data;
use serde_json::json;

use crate::harness::{admin, create, member_pods, wait_converged, wait_for};
use crate::proxy::proxies;
use crate::tls::{Ca, create_tls_secret};
use crate::{
    RealNode, busybox_pod, create_credentials, operator_with_agent, pod_ip, pymemcache,
    real_namespace, restart_counts,
};

const KEYS: u64 = 10_000;
/// The kubelet's refresh of a mounted Secret (up to a minute) and the agent's look.
const ROTATION: Duration = Duration::from_secs(150);

/// An application with the proxy's address only: `login` (user, password) or none, TLS
/// verifying against `ca` or plain text; its answer.
async fn app(
    ns: &str,
    ip: &str,
    ca: Option<&str>,
    login: Option<(&str, &str)>,
    keys: u64,
) -> serde_json::Value {
    app_reading(ns, ip, ca, login, keys, true).await
}

/// As `app`; with `write` false, it only reads the keys back.
async fn app_reading(
    ns: &str,
    ip: &str,
    ca: Option<&str>,
    login: Option<(&str, &str)>,
    keys: u64,
    write: bool,
) -> serde_json::Value {
    let host = format!("cache-proxy.{ns}.svc");
    pymemcache(json!({
        "servers": [format!("{host}:11211")], "addresses": {host: ip}, "keys": keys,
        "ca": ca, "login": login.map(|(u, p)| [u, p]), "write": write,
    }))
    .await
}

/// Each proxy pod's containers' restarts, by pod.
async fn proxy_restarts(client: &Client, ns: &str) -> BTreeMap<String, BTreeMap<String, i32>> {
    proxies(client, ns, 2)
        .await
        .iter()
        .map(|p| (p.name_any(), restart_counts(p)))
        .collect()
}

fn error(answer: &serde_json::Value) -> String {
    answer["error"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn auth_and_tls_hold_through_the_proxy_and_only_the_proxy_reaches_the_members_relay() {
    let client = admin().await;
    let node = RealNode::get();
    let ns = real_namespace(&client, "proxy-sec").await;
    let _op = operator_with_agent(&client, &node, &ns).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns);
    let ca = Ca::new("proxy-test-ca");
    let names = [
        format!("cache.{ns}.svc"),
        format!("*.cache.{ns}.svc"),
        format!("cache-proxy.{ns}.svc"),
    ];
    create_tls_secret(&secrets, "cache-tls", &names, &ca).await;
    create_credentials(&secrets, "cache-auth", "app", "first").await;
    // The host, where the application runs, is admitted by address (as in monitoring.rs), and
    // the namespace's pods.
    let host = json!({"ipBlock": {"cidr": format!("{}/32", node.var("REAL_NODE_GATEWAY"))}});
    let namespace = json!({"podSelector": {}});
    let mc: Memcached = serde_json::from_value(json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {
            "size": 3, "image": node.var("MEMCACHED_SID_IMAGE"),
            "proxy": {"enabled": true},
            "auth": {"enabled": true, "secretName": "cache-auth", "rotationGraceSeconds": 150},
            "tls": {"enabled": true, "secretName": "cache-tls"},
            "networkPolicy": {"enabled": true, "from": [host, namespace]},
        },
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;
    proxies(&client, &ns, 2).await;
    let service = Api::<Service>::namespaced(client.clone(), &ns)
        .get("cache-proxy")
        .await
        .unwrap();
    let ip = service.spec.unwrap().cluster_ip.unwrap();
    let ca = Some(ca.pem.as_str());

    // Each proxy marks a member it could not reach yet as down for a second: wait until a
    // round of keys all lands.
    wait_for(
        "keys through the proxy",
        Duration::from_secs(120),
        || async {
            let answer = app(&ns, &ip, ca, Some(("app", "first")), 300).await;
            (answer["found"] == 300).then_some(())
        },
    )
    .await;
    let answer = app(&ns, &ip, ca, Some(("app", "first")), KEYS).await;
    let found = answer["found"].as_u64().unwrap_or(0);
    println!("through the proxy with TLS and a login: {found} of {KEYS} keys read back");
    assert!(found * 100 >= KEYS * 99, "{answer}");

    // Nothing without the login, with a wrong password, or in plain text.
    // (A first set that is not a login is refused as memcached refuses it on a member.)
    let refused = app(&ns, &ip, ca, None, 1).await;
    assert!(
        error(&refused).contains("bad authentication token format"),
        "{refused}"
    );
    let wrong = app(&ns, &ip, ca, Some(("app", "guess")), 1).await;
    assert!(error(&wrong).contains("authentication failure"), "{wrong}");
    let plain = app(&ns, &ip, None, Some(("app", "first")), 1).await;
    assert!(plain.get("error").is_some(), "{plain}");

    // The members' relay asks no login: a pod of the namespace, which the policy admits to
    // memcached's port, gets no answer from it; the same script from a pod labelled as the
    // proxy's does (the policy's rule, not the script, is what refuses).
    let proxy_labels = json!({"labels": {
        "app.kubernetes.io/name": "memcached-proxy", "app.kubernetes.io/instance": "cache"}});
    for member in member_pods(&client, &ns, "cache").await {
        let ip = pod_ip(&member);
        let script = format!(
            "printf 'version\\r\\n' | /bin/busybox timeout 10 /bin/busybox nc -w 5 {ip} 11296 \
             | /bin/busybox grep -q VERSION"
        );
        let (answered, log) = busybox_pod(&client, &node, &ns, &script, json!({})).await;
        assert!(!answered, "{ip}:11296 answered a stranger: {log}");
        let (answered, log) = busybox_pod(&client, &node, &ns, &script, proxy_labels.clone()).await;
        assert!(answered, "{ip}:11296 did not answer a proxy's pod: {log}");
    }

    // A rotation: each proxy takes the new password within the kubelet's refresh and keeps the
    // old one for its grace (each pod asked on its own address: one that has not seen the
    // change yet would take the old one anyway), the proxy's processes as they were.
    let before = proxy_restarts(&client, &ns).await;
    secrets
        .patch(
            "cache-auth",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": secret_data("app", "second")})),
        )
        .await
        .unwrap();
    let pods: Vec<String> = proxies(&client, &ns, 2)
        .await
        .iter()
        .map(|p| pod_ip(p).to_string())
        .collect();
    for pod in &pods {
        wait_for("the new password on each proxy", ROTATION, || async {
            let answer = app(&ns, pod, ca, Some(("app", "second")), 1).await;
            (answer["found"] == 1).then_some(())
        })
        .await;
    }
    for pod in &pods {
        let old = app(&ns, pod, ca, Some(("app", "first")), 1).await;
        assert_eq!(
            old["found"], 1,
            "{pod}: the old password within its grace: {old}"
        );
    }
    assert_eq!(
        before,
        proxy_restarts(&client, &ns).await,
        "no proxy restarted"
    );
    let kept = app_reading(&ns, &ip, ca, Some(("app", "second")), KEYS, false).await;
    let kept = kept["found"].as_u64().unwrap_or(0);
    println!("after the rotation, read with the new password: {kept} of {KEYS}");
    assert!(kept * 100 >= KEYS * 99, "{kept}");
}
