//! The `Memcached` custom resource, `cache.example.com/v1alpha1`.
//!
//! The CRD in `config/crd/bases/` is generated from these types (`memcached-operator crd`), so the
//! doc comments below are what `kubectl explain memcached.spec` shows.

// Several printcolumn(...) share argument names, which clippy takes for duplicated attributes.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, Toleration,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

mod autoscaling;
mod proxy;
mod rollout;
mod security;
pub use autoscaling::{AutoscalingSpec, AutoscalingStatus, LastScale, Signals};
pub use proxy::{Handover, ProxySpec, ProxyStatus, ZoneMembers};
pub use rollout::{DisruptionBudgetSpec, RolloutSpec, Spread};
pub use security::{AuthSpec, BindingSpec, IssuerRef, NetworkPolicySpec, TlsSpec};

/// Largest `spec.size` accepted at admission.
pub const MAX_SIZE: i32 = 1000;
/// memcached's default item memory (`-m`), in MiB.
pub const DEFAULT_MAX_MEMORY_MIB: i32 = 64;
/// memcached's well-known port.
pub const DEFAULT_CONTAINER_PORT: i32 = 11211;
/// Largest item memcached accepts (`-I`), in MiB: its own upper limit.
pub const MAX_ITEM_SIZE_MIB: i32 = 1024;
/// A DNS subdomain name (RFC 1123), what Kubernetes names most objects by.
const DNS_SUBDOMAIN: &str = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// The memcached exporter's port (its default), named `metrics` on the pod and the Service.
pub const EXPORTER_PORT: i32 = 9150;

/// Desired state of a Memcached cluster.
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cache.example.com",
    version = "v1alpha1",
    kind = "Memcached",
    plural = "memcacheds",
    shortname = "mc",
    namespaced,
    status = "MemcachedStatus",
    derive = "PartialEq",
    doc = "Memcached runs a set of memcached pods behind a headless Service.",
    scale(
        spec_replicas_path = ".spec.size",
        status_replicas_path = ".status.replicas",
        label_selector_path = ".status.selector"
    ),
    printcolumn(
        name = "Size",
        type_ = "integer",
        json_path = ".spec.size",
        description = "Desired number of memcached pods"
    ),
    printcolumn(
        name = "Ready",
        type_ = "integer",
        json_path = ".status.readyReplicas",
        description = "Memcached pods that are Ready"
    ),
    printcolumn(
        name = "Available",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].status",
        description = "True when all desired pods are Ready"
    ),
    printcolumn(
        name = "Reason",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Available\")].reason",
        description = "Why it is (not) Available, e.g. ImagePullFailed, Unschedulable, OOMKilled"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.maxItemSizeMiB) || self.maxItemSizeMiB * 2 <= self.maxMemoryMiB")
    .message("must be at most half of maxMemoryMiB: memcached refuses to start otherwise")
    .field_path(".maxItemSizeMiB"))]
#[x_kube(validation = Rule::new("!has(self.tls) || !has(self.tls.plaintextPort) || (self.tls.plaintextPort != self.containerPort && self.tls.plaintextPort != 9150)")
    .message("must differ from containerPort and from the exporter's 9150")
    .field_path(".tls.plaintextPort"))]
#[x_kube(validation = Rule::new("!has(self.monitoring) || !self.monitoring.enabled || self.containerPort != 9150")
    .message("must not be 9150 while monitoring is enabled: the exporter listens on 9150 in the same pod")
    .field_path(".containerPort"))]
#[x_kube(validation = Rule::new("!has(self.proxy) || !self.proxy.enabled || ((!has(self.auth) || !self.auth.enabled) && (!has(self.tls) || !self.tls.enabled)) || (has(self.networkPolicy) && self.networkPolicy.enabled)")
    .message("with auth or tls needs networkPolicy.enabled: memcached's proxy cannot log in or speak TLS to the members, so it reaches them on a port of their agents that asks no login, which only the policy keeps to the proxy's pods")
    .field_path(".proxy.enabled"))]
pub struct MemcachedSpec {
    /// Number of memcached pods. 0 scales the cluster down without deleting it.
    #[schemars(range(min = 0, max = 1000))]
    pub size: i32,

    /// Container image for memcached. Defaults to the operator's RELATED_IMAGE_MEMCACHED setting
    /// (a pinned memcached 1.6 alpine image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// TCP port memcached listens on, and the port of the headless Service.
    #[serde(default = "default_container_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub container_port: i32,

    /// Memory memcached may use for items, in MiB (memcached's -m flag).
    #[serde(default = "default_max_memory_mib", rename = "maxMemoryMiB")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_memory_mib: i32,

    /// Compute resources for the memcached container. A memory limit must exceed maxMemoryMiB,
    /// leaving room for connection buffers; otherwise the Memcached is Degraded (InvalidSpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(transform = bounded_resources)]
    // Boxed here and in `affinity`: few Memcacheds set them, and the cache holds every one.
    pub resources: Option<Box<ResourceRequirements>>,

    /// memcached worker threads (its -t flag). Unset: memcached's default, 4.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub threads: Option<i32>,

    /// Most simultaneous client connections per pod (memcached's -c flag). Unset: memcached's
    /// default, 1024.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65536))]
    pub max_connections: Option<i32>,

    /// Largest item memcached stores, in MiB (its -I flag): at most half of maxMemoryMiB, as
    /// memcached requires. Unset: memcached's default, 1 MiB.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "maxItemSizeMiB"
    )]
    #[schemars(range(min = 1, max = 1024))]
    pub max_item_size_mib: Option<i32>,

    /// The PodDisruptionBudget the operator keeps for the pods, so that a node drain evicts one
    /// memcached at a time. None is kept while size is below 2.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_disruption_budget: Option<DisruptionBudgetSpec>,

    /// How pods are replaced when the pod template changes. The defaults keep every desired pod
    /// serving throughout: one extra pod at a time, none taken away before its replacement is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutSpec>,

    /// How the pods are spread over nodes (see Spread).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,

    /// Node labels the pods must run on (the pod's nodeSelector).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<BTreeMap<String, String>>,

    /// Taints the pods tolerate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tolerations: Option<Vec<Toleration>>,

    /// Node and pod affinity for the pods. `spread: Required` adds its anti-affinity term to the
    /// ones given here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Box<Affinity>>,

    /// PriorityClass of the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub priority_class_name: Option<String>,

    /// Secrets for pulling the memcached image from a private registry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_secrets: Option<Vec<LocalObjectReference>>,

    /// Extra annotations on the pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod_annotations: Option<BTreeMap<String, String>>,

    /// Extra labels on the pods. The operator's own app.kubernetes.io/name, instance and
    /// managed-by labels select the pods and cannot be set here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new(
        "!('app.kubernetes.io/name' in self) && !('app.kubernetes.io/instance' in self) && !('app.kubernetes.io/managed-by' in self)"
    ).message(
        "must not set app.kubernetes.io/name, app.kubernetes.io/instance or app.kubernetes.io/managed-by: the operator selects its pods by them"
    ))]
    pub pod_labels: Option<BTreeMap<String, String>>,

    /// Prometheus metrics of memcached itself (hit ratio, evictions, connections, memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub monitoring: Option<MonitoringSpec>,

    /// Password authentication for clients (memcached's ASCII authentication): a client sends
    /// `set <any key> 0 0 <n>` with `<username> <password>` as its data before anything else.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<AuthSpec>,

    /// TLS for clients: memcached serves its port in TLS only, with the certificate of a
    /// Secret, optionally requiring client certificates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSpec>,

    /// A NetworkPolicy the operator keeps for the pods: memcached's ports admit only the peers
    /// listed (default: pods of the Memcached's own namespace). Takes effect where the cluster's
    /// network enforces NetworkPolicies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_policy: Option<NetworkPolicySpec>,

    /// A Secret `<name>-binding` for applications, in the Service Binding for Kubernetes
    /// layout (servicebinding.io): `type`, `provider`, `host`, `port`, `servers`, and
    /// `username`, `password` and `ca.crt` when auth and TLS are on. Its name is reported in
    /// `status.binding.name`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingSpec>,

    /// The operator sizes the Memcached from memcached's own signals (evictions of live items),
    /// one pod at a time between minSize and maxSize, through `spec.size`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingSpec>,

    /// One address for every client: memcached's own proxy in front of the members (see
    /// ProxySpec).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxySpec>,
}

/// memcached's own metrics: an exporter beside each memcached.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    /// true: each pod runs the Prometheus memcached exporter beside memcached, serving /metrics on
    /// port 9150, named `metrics` on the pod and on the headless Service; where the cluster serves
    /// the ServiceMonitor API (monitoring.coreos.com/v1), the operator also keeps a ServiceMonitor
    /// for it. Changing it rolls the pods.
    #[serde(default)]
    pub enabled: bool,

    /// Container image of the exporter. Defaults to the operator's RELATED_IMAGE_MEMCACHED_EXPORTER
    /// setting (a pinned memcached exporter image).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,
}

/// A non-negative Kubernetes quantity: an integer, or a string in the Quantity grammar without a
/// minus sign (`+` is allowed, as the API server allows it).
const QUANTITY_RULE: &str = r"type(self) == int ? self >= 0 : string(self).matches('^[+]?([0-9]+([.][0-9]*)?|[.][0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?([0-9]+([.][0-9]*)?|[.][0-9]+))?$')";

/// Bounds the sizes in the `resources` schema, so CEL rules over it stay within the API server's
/// cost budget and huge objects are refused early; real quantities are short and real maps small.
fn bounded_resources(schema: &mut schemars::Schema) {
    for map in ["limits", "requests"] {
        if let Some(m) = schema
            .get_mut("properties")
            .and_then(|p| p.get_mut(map))
            .and_then(|m| m.as_object_mut())
        {
            m.insert("maxProperties".into(), 16.into());
            if let Some(q) = m
                .get_mut("additionalProperties")
                .and_then(|q| q.as_object_mut())
            {
                q.insert("maxLength".into(), 64.into());
                // Each quantity alone (negative or malformed is refused with the field named);
                // requests against limits span two fields, so validation.rs checks those.
                q.insert(
                    "x-kubernetes-validations".into(),
                    serde_json::json!([{
                        "rule": QUANTITY_RULE,
                        "message": "must be a non-negative quantity such as 500m, 2, 128Mi or 1Gi",
                    }]),
                );
                q.insert(
                    "description".into(),
                    "A quantity such as 500m, 2, 128Mi or 1Gi (see the Kubernetes Quantity type)."
                        .into(),
                );
            }
        }
    }
    if let Some(claims) = schema
        .get_mut("properties")
        .and_then(|p| p.get_mut("claims"))
        .and_then(|c| c.as_object_mut())
    {
        claims.insert("maxItems".into(), 16.into());
    }
}

fn default_container_port() -> i32 {
    DEFAULT_CONTAINER_PORT
}

fn default_max_memory_mib() -> i32 {
    DEFAULT_MAX_MEMORY_MIB
}

/// Observed state of a Memcached cluster.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MemcachedStatus {
    /// Names of the memcached pods, sorted.
    #[serde(default)]
    pub nodes: Vec<String>,

    /// Every member the Memcached should have, by its stable address (`<name>-N.<name>.<ns>.svc:
    /// <port>`) in ordinal order, Ready or not: the server list for clients that hash keys over
    /// the members.
    #[serde(default)]
    pub servers: Vec<String>,

    /// Member pods running (the scale subresource reads this).
    #[serde(default)]
    pub replicas: i32,

    /// Pods that are Ready.
    #[serde(default)]
    pub ready_replicas: i32,

    /// Pods that have been Ready for the rollout's minReadySeconds.
    #[serde(default)]
    pub available_replicas: i32,

    /// Label selector of the memcached pods, for the scale subresource and autoscalers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,

    /// The metadata.generation this status was computed for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// Available: all desired pods are Ready. Progressing: the cluster is moving towards spec.
    /// Degraded: the operator cannot make the cluster match spec (see reason and message).
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,

    /// The binding Secret applications mount (servicebinding.io's Provisioned Service), while
    /// spec.binding is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub binding: Option<BindingStatus>,

    /// What the autoscaler last saw and decided, while spec.autoscaling is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<AutoscalingStatus>,

    /// Where clients reach the proxy, while spec.proxy is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy: Option<ProxyStatus>,
}

/// A Provisioned Service's `status.binding`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
pub struct BindingStatus {
    /// Name of the binding Secret, in the Memcached's namespace.
    pub name: String,
}

/// The CRD as YAML, as committed in `config/crd/bases/`.
pub fn crd_yaml() -> String {
    let yaml = serde_saphyr::to_string(&Memcached::crd()).expect("CRD serialises");
    format!("---\n{yaml}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn committed_crd_matches_the_rust_types() {
        let committed = include_str!("../config/crd/bases/cache.example.com_memcacheds.yaml");
        assert!(
            committed == crd_yaml(),
            "config/crd/bases/cache.example.com_memcacheds.yaml is stale: run `make manifests` and commit"
        );
    }

    #[test]
    fn defaults_fill_optional_fields() {
        let spec: MemcachedSpec = serde_json::from_value(serde_json::json!({"size": 3})).unwrap();
        assert_eq!(spec.container_port, 11211);
        assert_eq!(spec.max_memory_mib, 64);
        assert_eq!(spec.image, None);
    }

    #[test]
    fn crd_has_scale_and_status_subresources_and_columns() {
        let crd = serde_json::to_value(Memcached::crd()).unwrap();
        let version = &crd["spec"]["versions"][0];
        assert_eq!(
            version["subresources"]["scale"]["specReplicasPath"],
            ".spec.size"
        );
        assert_eq!(
            version["subresources"]["scale"]["labelSelectorPath"],
            ".status.selector"
        );
        assert!(version["subresources"]["status"].is_object());
        let columns: Vec<&str> = version["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        assert_eq!(columns, ["Size", "Ready", "Available", "Reason", "Age"]);
        let size =
            &version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["size"];
        assert_eq!(size["minimum"].as_f64(), Some(0.0));
        assert_eq!(size["maximum"].as_f64(), Some(f64::from(MAX_SIZE)));
    }
}
