//! `spec.networkPolicy` on the API server: the policy kept, changed, put back and removed, and a
//! foreign one left alone. (A policy engine enforcing it is shown on the real node.)

use k8s_openapi::api::networking::v1::NetworkPolicy;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::{Memcached, MonitoringSpec, NetworkPolicySpec};
use memcached_operator::resources::is_controlled_by;
use serde_json::json;

use crate::harness::{
    CONVERGE, Operator, OperatorOptions, admin, apply, create, memcached, namespace,
    wait_converged, wait_degraded_saying, wait_for, wait_gone,
};

/// The policy's ingress rules as (ports, from), as a user reads them.
fn rules(policy: &NetworkPolicy) -> serde_json::Value {
    let ingress = policy.spec.as_ref().and_then(|s| s.ingress.clone());
    json!(
        ingress
            .unwrap_or_default()
            .into_iter()
            .map(|rule| json!([rule.ports, rule.from]))
            .collect::<Vec<_>>()
    )
}

fn port(n: i32) -> serde_json::Value {
    json!({"port": n, "protocol": "TCP"})
}

async fn wait_rules(api: &Api<NetworkPolicy>, what: &str, want: serde_json::Value) {
    wait_for(what, CONVERGE, || async {
        let policy = api.get_opt("cache").await.ok()??;
        (rules(&policy) == want).then_some(())
    })
    .await;
}

#[tokio::test]
async fn the_network_policy_follows_the_spec_and_is_put_back() {
    let client = admin().await;
    let ns = namespace(&client, "netpol").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);

    // On: memcached's port from the namespace's pods, the metrics from every namespace's.
    let mut mc = memcached("cache", 2);
    mc.spec.monitoring = Some(MonitoringSpec {
        enabled: true,
        image: None,
    });
    mc.spec.network_policy = Some(NetworkPolicySpec {
        enabled: true,
        ..NetworkPolicySpec::default()
    });
    let mc = create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 2).await;
    let defaults = json!([
        [[port(11211)], [{"podSelector": {}}]],
        [[port(9150)], [{"namespaceSelector": {}}]],
    ]);
    wait_rules(&policies, "the policy with the defaults", defaults.clone()).await;
    let policy = policies.get("cache").await.unwrap();
    assert!(is_controlled_by(&policy.metadata, &mc));
    let spec = policy.spec.unwrap();
    assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
    assert_eq!(
        json!(spec.pod_selector),
        json!({"matchLabels": {
            "app.kubernetes.io/instance": "cache",
            "app.kubernetes.io/name": "memcached",
        }})
    );

    // Someone opens it to everyone: put back.
    policies
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"ingress": [{}]}})),
        )
        .await
        .unwrap();
    wait_rules(&policies, "the policy put back", defaults).await;

    // The user names the peers: the policy follows.
    let apps = json!([{"namespaceSelector": {"matchLabels": {"team": "shop"}}}]);
    let prometheus = json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}]);
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"spec": {"networkPolicy": {"from": apps, "metricsFrom": prometheus}}}),
        ),
    )
    .await
    .unwrap();
    wait_rules(
        &policies,
        "the listed peers",
        json!([[[port(11211)], apps], [[port(9150)], prometheus]]),
    )
    .await;

    // With the proxy: its pods are under the policy too, and the members admit them whoever
    // the listed clients are.
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"proxy": {"enabled": true}}})),
    )
    .await
    .unwrap();
    let proxies = json!({"podSelector": {"matchLabels": {
        "app.kubernetes.io/instance": "cache", "app.kubernetes.io/name": "memcached-proxy"}}});
    let mut clients_and_proxies = apps.as_array().unwrap().clone();
    clients_and_proxies.push(proxies.clone());
    wait_rules(
        &policies,
        "the proxy's pods admitted to the members",
        json!([
            [[port(11211)], clients_and_proxies],
            [[port(9150)], prometheus]
        ]),
    )
    .await;
    let selector = policies
        .get("cache")
        .await
        .unwrap()
        .spec
        .unwrap()
        .pod_selector;
    assert_eq!(
        json!(selector),
        json!({"matchLabels": {"app.kubernetes.io/instance": "cache"},
               "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                     "values": ["memcached", "memcached-proxy"]}]})
    );

    // With auth too, the proxy reaches the members through their agents' relay, which asks no
    // login: that port is the proxy's pods' alone, and memcached's is the clients' only.
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"auth": {"enabled": true}}})),
    )
    .await
    .unwrap();
    wait_rules(
        &policies,
        "the members' relay admitting the proxy's pods only",
        json!([
            [[port(11211)], apps],
            [[port(11296)], [proxies]],
            [[port(9150)], prometheus]
        ]),
    )
    .await;
    // Which is why the policy cannot go while the proxy runs with auth.
    let refused = mcs
        .patch(
            "cache",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"networkPolicy": {"enabled": false}}})),
        )
        .await
        .unwrap_err();
    assert!(
        refused.to_string().contains("spec.proxy.enabled")
            && refused.to_string().contains("networkPolicy.enabled"),
        "{refused}"
    );

    // Off: the policy goes; the pods stay.
    mcs.patch(
        "cache",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"networkPolicy": {"enabled": false}, "auth": null}})),
    )
    .await
    .unwrap();
    wait_gone("the policy deleted", CONVERGE, &policies, "cache").await;
    wait_converged(&client, &ns, "cache", 2).await;
}

#[tokio::test]
async fn a_foreign_network_policy_is_left_alone() {
    let client = admin().await;
    let ns = namespace(&client, "netpol-foreign").await;
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let policies: Api<NetworkPolicy> = Api::namespaced(client.clone(), &ns);
    let foreign: NetworkPolicy = serde_json::from_value(json!({
        "apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
        "metadata": {"name": "cache", "namespace": ns},
        "spec": {"podSelector": {"matchLabels": {"app": "theirs"}}, "policyTypes": ["Ingress"]},
    }))
    .unwrap();
    let before = apply(&policies, &foreign).await;

    let mut mc = memcached("cache", 1);
    mc.spec.network_policy = Some(NetworkPolicySpec {
        enabled: true,
        ..NetworkPolicySpec::default()
    });
    create(&client, &ns, &mc).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let message =
        wait_degraded_saying(&mcs, "cache", "ResourceExists", "NetworkPolicy", CONVERGE).await;
    assert!(message.contains("cache"), "{message}");
    let after = policies.get("cache").await.unwrap();
    assert_eq!(after.spec, before.spec);
    assert_eq!(after.resource_version(), before.resource_version());

    // Once it is gone, the operator's takes its place.
    policies
        .delete("cache", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the operator's policy", CONVERGE, || async {
        let p = policies.get_opt("cache").await.ok()??;
        p.owner_references().first().map(|_| ())
    })
    .await;
    wait_converged(&client, &ns, "cache", 1).await;
}
