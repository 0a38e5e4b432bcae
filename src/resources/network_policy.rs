//! The NetworkPolicy of `spec.networkPolicy`: memcached's ports open to the peers the user lists,
//! the exporter's to the monitoring peers, the port where the autoscaler reads `stats` to the
//! operator's pods (with `spec.proxy` too, where the operator sweeps the members before the
//! layout changes), nothing else of the pods open to other pods. With `spec.proxy`, the proxy's pods are
//! under the same rules (clients reach them on memcached's port, monitoring on the metrics
//! port), and the members admit them.

use k8s_openapi::api::networking::v1::{
    NetworkPolicy, NetworkPolicyIngressRule, NetworkPolicyPeer, NetworkPolicyPort,
    NetworkPolicySpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::{agent, monitored, owned_metadata, proxy, tls};
use crate::api::{EXPORTER_PORT, Memcached};

/// The operator's pods, as config/manager labels them.
const OPERATOR_LABELS: [(&str, &str); 2] = [
    ("app.kubernetes.io/name", "memcached-operator"),
    ("control-plane", "controller-manager"),
];

/// The NetworkPolicy a Memcached should have; None unless `spec.networkPolicy.enabled`.
/// `operator_namespace`: where the operator runs, when in a cluster (its autoscaler reads the
/// members' `stats`).
pub fn network_policy(mc: &Memcached, operator_namespace: Option<&str>) -> Option<NetworkPolicy> {
    let wanted = mc.spec.network_policy.as_ref().filter(|p| p.enabled)?;
    let memcached_ports = std::iter::once(mc.spec.container_port)
        .chain(tls::plaintext_port(mc))
        .map(tcp)
        .collect();
    // Fronted (auth or TLS), the proxy reaches the members through their agents' relay.
    let (proxied, fronted) = (proxy::spec(mc).is_some(), proxy::fronted(mc));
    let mut from = or_default(&wanted.from, own_namespace);
    if proxied && !fronted {
        // The proxy reaches the members whoever the clients are.
        from.push(proxy::pods_peer(mc));
    }
    let mut ingress = vec![NetworkPolicyIngressRule {
        ports: Some(memcached_ports),
        from: Some(from),
    }];
    if fronted {
        // The members' agents' relay for the proxy asks no login: only the proxy's pods reach
        // it, and the operator's, which sweep the members through it before the layout changes.
        ingress.push(NetworkPolicyIngressRule {
            ports: Some(vec![tcp(proxy::backend_port(mc))]),
            from: Some(
                std::iter::once(proxy::pods_peer(mc))
                    .chain(operator_namespace.map(operator_pods))
                    .collect(),
            ),
        });
    }
    if monitored(mc) {
        ingress.push(NetworkPolicyIngressRule {
            ports: Some(vec![tcp(EXPORTER_PORT)]),
            from: Some(or_default(&wanted.metrics_from, every_namespace)),
        });
    }
    // The autoscaler reads the members' stats; with the proxy, the operator sweeps the members
    // before the layout changes (memcached's plain port: the proxy has no auth or TLS).
    let operator_reads = mc.spec.autoscaling_on().is_some() || (proxied && !fronted);
    if let (true, Some(namespace), Some((port, _))) =
        (operator_reads, operator_namespace, agent::stats_port(mc))
    {
        ingress.push(NetworkPolicyIngressRule {
            ports: Some(vec![tcp(port)]),
            from: Some(vec![operator_pods(namespace)]),
        });
    }
    Some(NetworkPolicy {
        metadata: owned_metadata(mc),
        spec: Some(NetworkPolicySpec {
            pod_selector: Some(proxy::members_and_proxies(mc)),
            policy_types: Some(vec!["Ingress".to_string()]),
            ingress: Some(ingress),
            ..NetworkPolicySpec::default()
        }),
    })
}

fn tcp(port: i32) -> NetworkPolicyPort {
    NetworkPolicyPort {
        port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".to_string()),
        end_port: None,
    }
}

/// The peers listed, or the default's when none are: an empty `from` in a NetworkPolicy would
/// mean everyone, the opposite of what an unset field asks here.
fn or_default(
    listed: &[NetworkPolicyPeer],
    default: fn() -> NetworkPolicyPeer,
) -> Vec<NetworkPolicyPeer> {
    match listed {
        [] => vec![default()],
        peers => peers.to_vec(),
    }
}

/// Every pod of the policy's own namespace.
fn own_namespace() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    }
}

/// The operator's pods in its namespace.
fn operator_pods(namespace: &str) -> NetworkPolicyPeer {
    let labels = |pairs: &[(&str, &str)]| {
        let map = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        Some(LabelSelector {
            match_labels: Some(map.collect()),
            ..LabelSelector::default()
        })
    };
    NetworkPolicyPeer {
        namespace_selector: labels(&[("kubernetes.io/metadata.name", namespace)]),
        pod_selector: labels(&OPERATOR_LABELS),
        ..NetworkPolicyPeer::default()
    }
}

/// Every pod of every namespace.
fn every_namespace() -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        ..NetworkPolicyPeer::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{memcached, memcached_with_spec};
    use crate::resources::is_controlled_by;
    use crate::resources::selector_labels;

    fn rules(mc: &Memcached) -> Vec<(Vec<i32>, serde_json::Value)> {
        let policy = network_policy(mc, None).expect("enabled");
        let spec = policy.spec.unwrap();
        assert_eq!(spec.policy_types, Some(vec!["Ingress".to_string()]));
        assert_eq!(
            spec.pod_selector.unwrap().match_labels,
            Some(selector_labels(mc))
        );
        spec.ingress
            .unwrap()
            .into_iter()
            .map(|rule| {
                let ports = rule.ports.unwrap().into_iter().map(|p| {
                    assert_eq!(p.protocol.as_deref(), Some("TCP"));
                    match p.port {
                        Some(IntOrString::Int(n)) => n,
                        other => panic!("a numbered port, not {other:?}"),
                    }
                });
                (ports.collect(), serde_json::to_value(rule.from).unwrap())
            })
            .collect()
    }

    #[test]
    fn an_autoscaled_memcached_lets_the_operators_pods_read_its_stats() {
        let operator = serde_json::json!([{
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ops"}},
            "podSelector": {"matchLabels": {
                "app.kubernetes.io/name": "memcached-operator", "control-plane": "controller-manager"
            }},
        }]);
        let stats_rule = |spec: serde_json::Value| {
            let mc = memcached_with_spec(spec);
            let policy = network_policy(&mc, Some("ops")).unwrap();
            let rules = policy.spec.unwrap().ingress.unwrap();
            let rule = rules.get(1).cloned()?;
            let port = rule.ports.unwrap()[0].port.clone();
            Some((port, serde_json::to_value(rule.from).unwrap()))
        };
        let plain = serde_json::json!({"networkPolicy": {"enabled": true},
                                       "autoscaling": {"enabled": true}});
        assert_eq!(
            stats_rule(plain),
            Some((Some(IntOrString::Int(11211)), operator.clone()))
        );
        // With a login, through the agent's endpoint.
        let auth = serde_json::json!({"networkPolicy": {"enabled": true},
                                      "autoscaling": {"enabled": true}, "auth": {"enabled": true}});
        assert_eq!(
            stats_rule(auth),
            Some((Some(IntOrString::Int(11297)), operator))
        );
        let off = serde_json::json!({"networkPolicy": {"enabled": true}});
        assert_eq!(stats_rule(off), None);
        // With the proxy, to sweep the members before the layout changes.
        let proxied = serde_json::json!({"networkPolicy": {"enabled": true},
                                         "proxy": {"enabled": true}});
        assert_eq!(
            stats_rule(proxied).map(|(port, _)| port),
            Some(Some(IntOrString::Int(11211)))
        );
    }

    #[test]
    fn with_the_proxy_its_pods_are_under_the_policy_and_the_members_admit_them() {
        let mc = memcached_with_spec(serde_json::json!({
            "networkPolicy": {"enabled": true}, "proxy": {"enabled": true},
            "monitoring": {"enabled": true}}));
        let spec = network_policy(&mc, None).unwrap().spec.unwrap();
        assert_eq!(
            serde_json::to_value(spec.pod_selector).unwrap(),
            serde_json::json!({
                "matchLabels": {"app.kubernetes.io/instance": "cache"},
                "matchExpressions": [{"key": "app.kubernetes.io/name", "operator": "In",
                                      "values": ["memcached", "memcached-proxy"]}],
            })
        );
        let ingress = serde_json::to_value(spec.ingress).unwrap();
        assert_eq!(
            ingress[0]["from"],
            serde_json::json!([
                {"podSelector": {}},
                {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "cache",
                                                 "app.kubernetes.io/name": "memcached-proxy"}}},
            ])
        );
        // The proxies' metrics are on the exporters' port, under the same rule.
        assert_eq!(ingress[1]["ports"][0]["port"], 9150);
    }

    #[test]
    fn with_the_proxy_and_auth_the_members_relay_is_the_proxys_and_the_operators_only() {
        let mc = memcached_with_spec(serde_json::json!({
            "networkPolicy": {"enabled": true}, "proxy": {"enabled": true},
            "auth": {"enabled": true}}));
        let spec = network_policy(&mc, Some("operators"))
            .unwrap()
            .spec
            .unwrap();
        let ingress = serde_json::to_value(spec.ingress).unwrap();
        // memcached's port: the clients only (the proxy cannot log in there).
        assert_eq!(ingress[0]["from"], serde_json::json!([{"podSelector": {}}]));
        assert_eq!(ingress[1]["ports"][0]["port"], 11296);
        assert_eq!(
            ingress[1]["from"],
            serde_json::json!([
                {"podSelector": {"matchLabels": {"app.kubernetes.io/instance": "cache",
                                                 "app.kubernetes.io/name": "memcached-proxy"}}},
                serde_json::to_value(operator_pods("operators")).unwrap(),
            ])
        );
        assert_eq!(ingress.as_array().unwrap().len(), 2, "{ingress}");
    }

    #[test]
    fn none_unless_enabled() {
        assert_eq!(network_policy(&memcached("cache", 3), None), None);
        let off = memcached_with_spec(serde_json::json!({"networkPolicy": {"enabled": false}}));
        assert_eq!(network_policy(&off, None), None);
    }

    #[test]
    fn by_default_memcached_is_open_to_its_own_namespace_only() {
        let mc = memcached_with_spec(serde_json::json!({"networkPolicy": {"enabled": true}}));
        assert!(is_controlled_by(
            &network_policy(&mc, None).unwrap().metadata,
            &mc
        ));
        assert_eq!(
            rules(&mc),
            vec![(vec![11211], serde_json::json!([{"podSelector": {}}]))]
        );
    }

    #[test]
    fn the_listed_peers_replace_the_defaults_and_metrics_get_their_own_rule() {
        let apps = serde_json::json!([{"namespaceSelector": {"matchLabels": {"team": "shop"}}}]);
        let prometheus = serde_json::json!([{"ipBlock": {"cidr": "10.0.0.1/32"}}]);
        let mc = memcached_with_spec(serde_json::json!({
            "monitoring": {"enabled": true},
            "tls": {"enabled": true, "secretName": "tls", "plaintextPort": 11212},
            "networkPolicy": {"enabled": true, "from": apps, "metricsFrom": prometheus},
        }));
        assert_eq!(
            rules(&mc),
            vec![(vec![11211, 11212], apps), (vec![9150], prometheus)]
        );
        // Unlisted, the metrics are open to every namespace's pods: counters, no cached data.
        let mc = memcached_with_spec(serde_json::json!({
            "monitoring": {"enabled": true},
            "networkPolicy": {"enabled": true},
        }));
        assert_eq!(
            rules(&mc)[1],
            (vec![9150], serde_json::json!([{"namespaceSelector": {}}]))
        );
    }
}
