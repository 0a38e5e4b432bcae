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
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::{CustomResource, CustomResourceExt, KubeSchema};
use serde::{Deserialize, Serialize};

mod autoscaling;
pub use autoscaling::{AutoscalingSpec, AutoscalingStatus, LastScale, Signals};

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
}

/// The binding Secret applications mount (servicebinding.io's Provisioned Service).
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BindingSpec {
    /// true: the operator keeps the Secret `<name>-binding` current as pods come and go and as
    /// the credentials rotate. false: none (it holds a copy of the password).
    #[serde(default)]
    pub enabled: bool,
}

/// Who may connect to the pods, as a NetworkPolicy named after the Memcached.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    /// true: the operator keeps a NetworkPolicy `<name>` selecting the pods, admitting
    /// memcached's port (and tls.plaintextPort) from `from` and the exporter's 9150 from
    /// `metricsFrom`; every other port of the pods is closed to other pods. false: none.
    #[serde(default)]
    pub enabled: bool,

    /// Peers admitted to memcached, as in a NetworkPolicy's `ingress.from` (podSelector,
    /// namespaceSelector, ipBlock). Empty: every pod of the Memcached's namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub from: Vec<NetworkPolicyPeer>,

    /// Peers admitted to the exporter's metrics port (with monitoring on): e.g. the
    /// namespace of the cluster's Prometheus, or an ipBlock for one on the nodes' network.
    /// Empty: every pod of every namespace (the metrics hold counters, no cached data).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub metrics_from: Vec<NetworkPolicyPeer>,
}

/// memcached's TLS (`-Z`), from `kubernetes.io/tls` Secrets.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!self.enabled || has(self.secretName) || has(self.issuerRef)")
    .message("is required while TLS is enabled, unless issuerRef is set")
    .field_path(".secretName"))]
#[x_kube(validation = Rule::new("!(has(self.secretName) && has(self.issuerRef))")
    .message("and secretName are exclusive: the certificate comes from one or the other")
    .field_path(".issuerRef"))]
pub struct TlsSpec {
    /// true: memcached's port speaks TLS only (plain text only on plaintextPort, if set).
    /// Turning it on or off rolls the pods; renewing the certificate does not.
    #[serde(default)]
    pub enabled: bool,

    /// A `kubernetes.io/tls` Secret in the Memcached's namespace: `tls.crt` (the chain, leaf
    /// first) and `tls.key`. Clients that verify the server need its names, e.g.
    /// `<name>.<namespace>.svc`. A renewed certificate is in force within 2 minutes, without a
    /// restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub secret_name: Option<String>,

    /// cert-manager issues the certificate instead: the operator keeps a Certificate `<name>`
    /// from this Issuer or ClusterIssuer, for the Service's names (`<name>.<namespace>.svc`,
    /// its `cluster.local` form, and `*.` of both), in the Secret `<name>-tls`. Needs
    /// cert-manager's API (cert-manager.io/v1). cert-manager's renewals are in force within 2
    /// minutes, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issuer_ref: Option<IssuerRef>,

    /// A Secret with `ca.crt`: memcached then refuses clients without a certificate signed by
    /// it (mutual TLS).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        rename = "clientCASecretName"
    )]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub client_ca_secret_name: Option<String>,

    /// A second port where memcached also serves plain text, for clients that cannot speak
    /// TLS yet. Unset: none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub plaintext_port: Option<i32>,
}

/// A cert-manager issuer, as a Certificate's `issuerRef` names it.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
pub struct IssuerRef {
    /// The Issuer's (in the Memcached's namespace) or ClusterIssuer's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub name: String,

    /// Issuer (the default) or ClusterIssuer, or an external issuer's kind.
    #[serde(default = "default_issuer_kind")]
    #[schemars(length(min = 1, max = 63))]
    pub kind: String,

    /// The issuer's API group: cert-manager.io (the default), or an external issuer's.
    #[serde(default = "default_issuer_group")]
    #[schemars(length(min = 1, max = 253), regex(pattern = DNS_SUBDOMAIN))]
    pub group: String,
}

fn default_issuer_kind() -> String {
    "Issuer".into()
}

fn default_issuer_group() -> String {
    "cert-manager.io".into()
}

/// memcached's ASCII authentication, from a Secret with `username` and `password`.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AuthSpec {
    /// true: memcached refuses every command of a client that has not authenticated. Turning it
    /// on or off rolls the pods; changing the Secret's content does not.
    #[serde(default)]
    pub enabled: bool,

    /// A Secret in the Memcached's namespace with keys `username` and `password` (no spaces,
    /// colons or line breaks; together at most 250 bytes). Unset: the operator creates
    /// `<name>-auth` with a random password, owned by the Memcached. Changing the named Secret's
    /// content rotates the password in the running pods within 2 minutes, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 253),
        regex(pattern = DNS_SUBDOMAIN)
    )]
    pub secret_name: Option<String>,

    /// Seconds the previous password keeps working after the Secret changes, so clients can
    /// move to the new one without being refused.
    #[serde(default = "default_rotation_grace_seconds")]
    #[schemars(range(min = 0, max = 86400))]
    pub rotation_grace_seconds: i32,
}

impl Default for AuthSpec {
    fn default() -> Self {
        Self {
            enabled: false,
            secret_name: None,
            rotation_grace_seconds: default_rotation_grace_seconds(),
        }
    }
}

fn default_rotation_grace_seconds() -> i32 {
    300
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

/// The operator's PodDisruptionBudget for a Memcached's pods.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudgetSpec {
    /// false: no PodDisruptionBudget (e.g. a one-node cluster, where a budget would stall drains).
    #[serde(default = "yes")]
    pub enabled: bool,

    /// Pods a voluntary disruption (a drain's eviction) may take down at once.
    #[serde(default = "one")]
    #[schemars(range(min = 1))]
    pub max_unavailable: i32,
}

impl Default for DisruptionBudgetSpec {
    fn default() -> Self {
        Self {
            enabled: true,
            max_unavailable: 1,
        }
    }
}

/// How members are updated, and how a pod leaves.
#[derive(KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RolloutSpec {
    /// Unused since 0.3.0, kept so that specs written for 0.2.0 still apply: a member is
    /// updated under its own name, so an update cannot add one first.
    #[serde(default = "one")]
    #[schemars(range(min = 0, max = 1000))]
    pub max_surge: i32,

    /// Members updated at once (0 and 1 both mean one at a time).
    #[serde(default)]
    #[schemars(range(min = 0, max = 1000))]
    pub max_unavailable: i32,

    /// Seconds a new pod must stay Ready before the rollout counts it and moves on.
    #[serde(default = "default_min_ready_seconds")]
    #[schemars(range(min = 0, max = 3600))]
    pub min_ready_seconds: i32,

    /// Seconds a stopping pod keeps serving after it has left the Service, so clients that
    /// still hold its address (DNS caches) are not refused. The grace period is this plus 20.
    #[serde(default = "default_pre_stop_delay_seconds")]
    #[schemars(range(min = 0, max = 300))]
    pub pre_stop_delay_seconds: i32,
}

impl Default for RolloutSpec {
    fn default() -> Self {
        Self {
            max_surge: 1,
            max_unavailable: 0,
            min_ready_seconds: default_min_ready_seconds(),
            pre_stop_delay_seconds: default_pre_stop_delay_seconds(),
        }
    }
}

/// How a Memcached's pods are spread over nodes. Preferred (the default): over nodes and zones
/// where the scheduler can. Required: never two pods of this Memcached on one node (pods stay
/// Pending while there are fewer nodes than size, and a rollout needs a spare node for its extra
/// pod). Off: the scheduler's defaults and `affinity` only.
#[derive(
    schemars::JsonSchema, Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq,
)]
pub enum Spread {
    /// Spread over nodes and zones where the scheduler can (topology spread, ScheduleAnyway).
    #[default]
    Preferred,
    /// At most one pod per node (required pod anti-affinity); zones stay preferred.
    Required,
    /// No spreading of the operator's own.
    Off,
}

fn yes() -> bool {
    true
}

fn one() -> i32 {
    1
}

fn default_min_ready_seconds() -> i32 {
    5
}

fn default_pre_stop_delay_seconds() -> i32 {
    10
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

    /// Pods the StatefulSet currently runs (the scale subresource reads this).
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
