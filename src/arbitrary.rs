//! proptest strategies for Memcached specs: every value the CRD schema admits, within its
//! documented bounds, so property tests cover what users can store.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{LocalObjectReference, ResourceRequirements, Toleration};
use k8s_openapi::api::networking::v1::{IPBlock, NetworkPolicyPeer};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use proptest::collection::btree_map;
use proptest::option;
use proptest::prelude::*;

use crate::api::{
    AuthSpec, BindingSpec, DisruptionBudgetSpec, EXPORTER_PORT, IssuerRef, MAX_ITEM_SIZE_MIB,
    MAX_SIZE, MemcachedSpec, MonitoringSpec, NetworkPolicySpec, RolloutSpec, Spread, TlsSpec,
};

/// An object name: a priority class, a Secret.
const OBJECT_NAME: &str = "[a-z]([a-z0-9-]{0,20}[a-z0-9])?";

/// A non-negative quantity in one of the forms the API accepts: plain, decimal, milli, binary
/// and decimal suffixes, exponent.
pub fn quantity() -> impl Strategy<Value = Quantity> {
    let suffix = prop_oneof![
        Just(""),
        Just("m"),
        Just("k"),
        Just("M"),
        Just("G"),
        Just("Ki"),
        Just("Mi"),
        Just("Gi"),
        Just("e3"),
        Just("E-2"),
    ];
    (0u32..5000, option::of(0u32..100), suffix).prop_map(|(whole, fraction, suffix)| {
        let number = match fraction {
            Some(f) => format!("{whole}.{f}"),
            None => whole.to_string(),
        };
        Quantity(format!("{number}{suffix}"))
    })
}

fn quantities() -> impl Strategy<Value = Option<BTreeMap<String, Quantity>>> {
    let resource = prop_oneof![
        Just("cpu".to_string()),
        Just("memory".to_string()),
        Just("ephemeral-storage".to_string()),
    ];
    option::of(btree_map(resource, quantity(), 0..3))
}

fn image() -> impl Strategy<Value = Option<String>> {
    option::of(prop_oneof![
        Just("memcached:1.6.45-alpine".to_string()),
        Just("memcached".to_string()),
        "[a-z][a-z0-9]{0,12}(/[a-z0-9]{1,12}){0,2}(:[a-z0-9.]{1,10})?",
    ])
}

/// Label maps as users write them: mostly valid, sometimes not (the schema cannot check map keys;
/// validation.rs does).
fn labels() -> impl Strategy<Value = Option<BTreeMap<String, String>>> {
    let key = prop_oneof![
        4 => "(example\\.com/)?[a-z][a-z0-9-]{0,10}[a-z0-9]",
        1 => "[a-zA-Z0-9./*_ -]{1,12}",
    ];
    let value = prop_oneof![
        4 => "[a-zA-Z0-9]([a-zA-Z0-9._-]{0,20}[a-zA-Z0-9])?",
        1 => ".{0,8}",
    ];
    option::of(btree_map(key, value, 0..3))
}

fn tolerations() -> impl Strategy<Value = Option<Vec<Toleration>>> {
    let toleration = (
        "[a-z]{1,10}(/[a-z]{1,10})?",
        option::of("[a-z0-9]{1,10}"),
        prop_oneof![
            Just("NoSchedule"),
            Just("PreferNoSchedule"),
            Just("NoExecute")
        ],
    )
        .prop_map(|(key, value, effect)| Toleration {
            operator: Some(if value.is_some() { "Equal" } else { "Exists" }.to_string()),
            key: Some(key),
            value,
            effect: Some(effect.to_string()),
            ..Toleration::default()
        });
    option::of(proptest::collection::vec(toleration, 0..3))
}

/// NetworkPolicy peers: pods by label, namespaces by label, both, or an address block.
fn peers() -> impl Strategy<Value = Vec<NetworkPolicyPeer>> {
    let selector = || {
        labels().prop_map(|match_labels| LabelSelector {
            match_labels,
            ..LabelSelector::default()
        })
    };
    let peer = prop_oneof![
        (option::of(selector()), option::of(selector())).prop_filter_map(
            "a peer names something",
            |(pods, namespaces)| {
                (pods.is_some() || namespaces.is_some()).then_some(NetworkPolicyPeer {
                    pod_selector: pods,
                    namespace_selector: namespaces,
                    ip_block: None,
                })
            }
        ),
        // Canonical blocks (no host bits): the API server refuses others.
        proptest::sample::select(
            &[
                "10.0.0.0/8",
                "192.168.0.0/16",
                "172.16.5.0/24",
                "10.244.0.1/32"
            ][..]
        )
        .prop_map(|cidr| NetworkPolicyPeer {
            ip_block: Some(IPBlock {
                cidr: cidr.to_string(),
                except: None,
            }),
            ..NetworkPolicyPeer::default()
        }),
    ];
    proptest::collection::vec(peer, 0..3)
}

/// `spec` with tuning flags, a disruption budget, a rollout and a spread; the item size is one
/// admission accepts (at most half of maxMemoryMiB).
fn with_tuning(spec: MemcachedSpec) -> impl Strategy<Value = MemcachedSpec> {
    let max_memory_mib = spec.max_memory_mib;
    let item_size = option::of(1..=(max_memory_mib / 2).clamp(1, MAX_ITEM_SIZE_MIB))
        .prop_map(move |size| size.filter(|s| s * 2 <= max_memory_mib));
    let budget = option::of(
        (any::<bool>(), 1..=10i32).prop_map(|(enabled, max_unavailable)| DisruptionBudgetSpec {
            enabled,
            max_unavailable,
        }),
    );
    let rollout = option::of(
        (0..=3i32, 0..=3i32, 0..=60i32, 0..=30i32, 1..=3600i32).prop_map(
            |(max_surge, max_unavailable, min_ready, pre_stop_delay, progress_deadline)| {
                RolloutSpec {
                    max_surge,
                    max_unavailable,
                    min_ready_seconds: min_ready,
                    pre_stop_delay_seconds: pre_stop_delay,
                    progress_deadline_seconds: progress_deadline,
                }
            },
        ),
    );
    let spread = option::of(prop_oneof![
        Just(Spread::Preferred),
        Just(Spread::Required),
        Just(Spread::Off)
    ]);
    // The schema refuses the exporter's port for memcached while monitoring is on.
    let port_free = spec.container_port != EXPORTER_PORT;
    let monitoring =
        option::of(
            (any::<bool>(), image()).prop_map(move |(enabled, image)| MonitoringSpec {
                enabled: enabled && port_free,
                image,
            }),
        );
    let secret = OBJECT_NAME;
    let auth = option::of((any::<bool>(), option::of(secret), 0..=86400i32).prop_map(
        |(enabled, secret_name, rotation_grace_seconds)| AuthSpec {
            enabled,
            secret_name,
            rotation_grace_seconds,
        },
    ));
    // The schema asks for a certificate (a Secret, or one cert-manager issues) while TLS is on,
    // and a plain port of its own.
    let port = spec.container_port;
    let issuer = (
        secret,
        proptest::sample::select(&["Issuer", "ClusterIssuer"][..]),
    )
        .prop_map(|(name, kind)| IssuerRef {
            name: name.to_string(),
            kind: kind.to_string(),
            group: "cert-manager.io".into(),
        });
    let tls = option::of(
        (
            any::<bool>(),
            prop_oneof![
                secret.prop_map(|s| (Some(s.to_string()), None)),
                issuer.prop_map(|i| (None, Some(i))),
            ],
            option::of(secret),
            option::of((1..=65535i32).prop_filter("a port of its own", move |p| {
                *p != port && *p != EXPORTER_PORT
            })),
        )
            .prop_map(
                |(enabled, (secret_name, issuer_ref), client_ca_secret_name, plaintext_port)| {
                    TlsSpec {
                        enabled,
                        secret_name,
                        issuer_ref,
                        client_ca_secret_name,
                        plaintext_port,
                    }
                },
            ),
    );
    let network_policy = option::of((any::<bool>(), peers(), peers()).prop_map(
        |(enabled, from, metrics_from)| NetworkPolicySpec {
            enabled,
            from,
            metrics_from,
        },
    ));
    let binding = option::of(any::<bool>().prop_map(|enabled| BindingSpec { enabled }));
    (
        (option::of(1..=256i32), option::of(1..=65536i32), item_size),
        budget,
        rollout,
        spread,
        monitoring,
        auth,
        tls,
        (network_policy, binding),
    )
        .prop_map(
            move |(
                (threads, connections, item_size),
                budget,
                rollout,
                spread,
                monitoring,
                auth,
                tls,
                (network_policy, binding),
            )| {
                MemcachedSpec {
                    monitoring,
                    auth,
                    tls,
                    network_policy,
                    binding,
                    threads,
                    max_connections: connections,
                    max_item_size_mib: item_size,
                    pod_disruption_budget: budget,
                    rollout,
                    spread,
                    ..spec.clone()
                }
            },
        )
}

/// `spec` with scheduling fields and pod metadata (`affinity` aside: the API server's own type,
/// passed through as given).
fn with_scheduling(spec: MemcachedSpec) -> impl Strategy<Value = MemcachedSpec> {
    let pull_secrets = option::of(proptest::collection::vec(
        "[a-z][a-z0-9-]{0,10}".prop_map(|name| LocalObjectReference { name }),
        0..2,
    ));
    (
        labels(),
        tolerations(),
        option::of(OBJECT_NAME),
        pull_secrets,
        option::of(btree_map(
            "[a-z][a-z0-9./-]{0,15}[a-z]|.{1,6}",
            ".{0,20}",
            0..3,
        )),
        labels(),
    )
        .prop_map(
            move |(node_selector, tolerations, priority, pull_secrets, annotations, pod_labels)| {
                MemcachedSpec {
                    node_selector,
                    tolerations,
                    priority_class_name: priority,
                    image_pull_secrets: pull_secrets,
                    pod_annotations: annotations,
                    pod_labels,
                    ..spec.clone()
                }
            },
        )
}

/// Any spec the schema admits.
pub fn spec() -> impl Strategy<Value = MemcachedSpec> {
    let resources = option::of((quantities(), quantities()).prop_map(|(requests, limits)| {
        Box::new(ResourceRequirements {
            requests,
            limits,
            ..Default::default()
        })
    }));
    (0..=MAX_SIZE, image(), 1..=65535i32, 1..=65536i32, resources)
        .prop_map(
            |(size, image, container_port, max_memory_mib, resources)| MemcachedSpec {
                size,
                image,
                container_port,
                max_memory_mib,
                resources,
                threads: None,
                max_connections: None,
                max_item_size_mib: None,
                pod_disruption_budget: None,
                rollout: None,
                spread: None,
                node_selector: None,
                tolerations: None,
                affinity: None,
                priority_class_name: None,
                image_pull_secrets: None,
                pod_annotations: None,
                pod_labels: None,
                monitoring: None,
                auth: None,
                tls: None,
                network_policy: None,
                binding: None,
                autoscaling: None,
                proxy: None,
            },
        )
        .prop_flat_map(with_tuning)
        .prop_flat_map(with_scheduling)
}
