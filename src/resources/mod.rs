//! Pure builders for the objects a Memcached owns: its members' pod template, its headless
//! Service, its PodDisruptionBudget, its ServiceMonitor and its NetworkPolicy. No API calls here; the controller applies what these return.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Capabilities, ContainerPort, PodSecurityContext, ResourceRequirements, SeccompProfile,
    SecurityContext, Service, ServicePort, ServiceSpec,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use crate::api::{EXPORTER_PORT, Memcached};
use crate::service_monitor::{Endpoint, ServiceMonitor, ServiceMonitorSpec};

pub mod agent;
pub mod auth;
pub mod binding;
pub mod members;
mod network_policy;
mod pod_template;
pub mod ports;
pub mod proxy;
pub mod relay;
pub mod tls;
pub mod warm_restart;
pub use network_policy::network_policy;
pub use pod_template::pod_template;

/// memcached image used when neither `spec.image` nor `RELATED_IMAGE_MEMCACHED` is set.
pub const FALLBACK_MEMCACHED_IMAGE: &str = "memcached:1.6.45-alpine";
/// Exporter image used when neither `spec.monitoring.image` nor
/// `RELATED_IMAGE_MEMCACHED_EXPORTER` is set.
pub const FALLBACK_EXPORTER_IMAGE: &str = "prom/memcached-exporter:v0.16.0";
/// The in-pod agent's image (`spec.auth`) when `RELATED_IMAGE_AGENT` is not set: the operator's
/// own, as `config/manager` names it.
pub const FALLBACK_AGENT_IMAGE: &str = concat!("memcached-operator:", env!("CARGO_PKG_VERSION"));
/// uid of `nobody`, the exporter image's user (named in the image, so set as a number here:
/// the kubelet can only check runAsNonRoot for a numeric user).
pub const EXPORTER_UID: i64 = 65534;
/// Name of the exporter's port on the pod and on the Service, and the ServiceMonitor's endpoint.
pub const METRICS_PORT_NAME: &str = "metrics";
/// Name of the operator as field manager, event reporter and `managed-by` label.
pub const MANAGER_NAME: &str = "memcached-operator";
/// uid of the `memcache` user in the official memcached image. Set explicitly because the image
/// names its user rather than numbering it, and the kubelet refuses runAsNonRoot for named users.
pub const MEMCACHED_UID: i64 = 11211;
/// The memcached container's name in a member's pod.
pub const MEMCACHED_CONTAINER: &str = "memcached";

pub const LABEL_NAME: &str = "app.kubernetes.io/name";
pub const LABEL_INSTANCE: &str = "app.kubernetes.io/instance";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The label naming the revision of the template a member was made from (the name Kubernetes'
/// own controllers give it).
pub const REVISION_LABEL: &str = "controller-revision-hash";
const LABEL_COMPONENT: &str = "app.kubernetes.io/component";
const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
/// The keys of the operator's own labels (`labels`), on every owned object and pod.
pub const OWN_LABELS: [&str; 5] = [
    LABEL_NAME,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_COMPONENT,
    LABEL_PART_OF,
];
const TOPOLOGY_HOSTNAME: &str = "kubernetes.io/hostname";
/// A node's zone; Kubernetes copies it onto each pod bound there (the PodTopologyLabels
/// admission, on by default since 1.35), which is how the proxy learns its members' zones.
pub const TOPOLOGY_ZONE: &str = "topology.kubernetes.io/zone";
/// Seconds a pod gets to stop after its preStop delay: memcached exits at once on SIGTERM, so
/// this is margin, and with the default delay it gives Kubernetes' default grace of 30 s.
const STOP_MARGIN_SECONDS: i64 = 20;

/// Label selector (as a string) that finds everything this operator manages.
pub fn managed_by_selector() -> String {
    format!("{LABEL_MANAGED_BY}={MANAGER_NAME}")
}

/// Labels that pick out one Memcached's pods.
pub fn selector_labels(mc: &Memcached) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), "memcached".to_string()),
        (LABEL_INSTANCE.to_string(), mc.name_any()),
    ])
}

/// Every member a Memcached should have, by its stable address (the member's name under the
/// headless Service), in ordinal order: `status.servers` and the binding's.
pub fn servers(mc: &Memcached) -> Vec<String> {
    member_addresses(mc, mc.spec.size)
}

/// The stable addresses of `mc`'s first `n` members (beyond `spec.size`, those still draining).
pub fn member_addresses(mc: &Memcached, n: i32) -> Vec<String> {
    member_addresses_on(mc, n, mc.spec.container_port)
}

/// As `member_addresses`, on `port`.
pub fn member_addresses_on(mc: &Memcached, n: i32, port: i32) -> Vec<String> {
    let (name, ns) = (mc.name_any(), mc.namespace().unwrap_or_default());
    (0..n)
        .map(|i| format!("{name}-{i}.{name}.{ns}.svc:{port}"))
        .collect()
}

/// Members an update takes out at once: `rollout.maxUnavailable`, at least one (a member is
/// replaced under its own name, so it cannot surge).
pub fn members_at_once(mc: &Memcached) -> i32 {
    mc.spec
        .rollout
        .as_ref()
        .map_or(1, |r| r.max_unavailable.max(1))
}

/// `status.selector` for the scale subresource, e.g. `app.kubernetes.io/instance=x,...`.
pub fn selector_string(mc: &Memcached) -> String {
    label_selector(&selector_labels(mc))
}

/// `labels` as a label selector string, `k=v,...`.
fn label_selector(labels: &BTreeMap<String, String>) -> String {
    labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// The recommended `app.kubernetes.io/*` labels on every owned object and pod.
pub fn labels(mc: &Memcached) -> BTreeMap<String, String> {
    let mut labels = selector_labels(mc);
    labels.insert(LABEL_MANAGED_BY.to_string(), MANAGER_NAME.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "cache".to_string());
    labels.insert(LABEL_PART_OF.to_string(), "memcached-operator".to_string());
    labels
}

/// Controller reference, as controller-runtime's SetControllerReference: foreground deletion of
/// the Memcached waits for what it owns.
pub fn owner_reference(mc: &Memcached) -> OwnerReference {
    let mut owner = mc
        .controller_owner_ref(&())
        .expect("a Memcached read from the API server has a name and uid");
    owner.block_owner_deletion = Some(true);
    owner
}

/// A container as restricted as the Pod Security "restricted" profile asks: non-root as `uid`,
/// no privilege escalation, no capabilities, a read-only root.
fn restricted(uid: i64) -> SecurityContext {
    SecurityContext {
        run_as_non_root: Some(true),
        run_as_user: Some(uid),
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".to_string()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// Every pod's: non-root, and the runtime's default seccomp profile.
fn pod_security_context() -> PodSecurityContext {
    PodSecurityContext {
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".to_string(),
            ..SeccompProfile::default()
        }),
        ..PodSecurityContext::default()
    }
}

fn mount(volume: &str, path: &str, read_only: bool) -> k8s_openapi::api::core::v1::VolumeMount {
    k8s_openapi::api::core::v1::VolumeMount {
        name: volume.to_string(),
        mount_path: path.to_string(),
        // Only true: the API server drops `readOnly: false` (omitempty), and an applied field the
        // stored object lacks would read as drift on every reconcile.
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

fn owned_metadata(mc: &Memcached) -> ObjectMeta {
    ObjectMeta {
        name: Some(mc.name_any()),
        namespace: mc.namespace(),
        labels: Some(labels(mc)),
        owner_references: Some(vec![owner_reference(mc)]),
        ..ObjectMeta::default()
    }
}

/// The operator's default images (RELATED_IMAGE_MEMCACHED, RELATED_IMAGE_MEMCACHED_EXPORTER), for
/// Memcacheds that name none.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Images {
    pub memcached: String,
    pub exporter: String,
    /// The operator's own image, which runs the agent beside memcached (`spec.auth`).
    pub agent: String,
}

impl Images {
    /// `memcached` and the fallback exporter image.
    pub fn new(memcached: impl Into<String>) -> Self {
        Self {
            memcached: memcached.into(),
            exporter: FALLBACK_EXPORTER_IMAGE.into(),
            agent: FALLBACK_AGENT_IMAGE.into(),
        }
    }
}

impl Default for Images {
    fn default() -> Self {
        Self::new(FALLBACK_MEMCACHED_IMAGE)
    }
}

/// The memcached image for this CR: its own override, else the operator's default.
pub fn image<'a>(mc: &'a Memcached, default_image: &'a str) -> &'a str {
    mc.spec.image.as_deref().unwrap_or(default_image)
}

/// Whether the Memcached asks for memcached's own metrics.
pub fn monitored(mc: &Memcached) -> bool {
    mc.spec.monitoring.as_ref().is_some_and(|m| m.enabled)
}

/// The PodDisruptionBudget a Memcached should have: none below two pods (one pod cannot stay
/// up through a drain anyway) or when the user turned it off.
///
/// `maxUnavailable` of the spec is written as the members it leaves (`minAvailable`, a number):
/// with `maxUnavailable` the disruption controller must read the pods' owner's scale through
/// the Memcached kind, and until its discovery knows the kind (up to 30 s after the CRD is
/// installed, say) it fails the budget safe, allowing no eviction, and looks again only at the
/// next change of a pod. A number of pods needs no owner.
pub fn pod_disruption_budget(mc: &Memcached) -> Option<PodDisruptionBudget> {
    let budget = mc.spec.pod_disruption_budget.clone().unwrap_or_default();
    if !budget.enabled || mc.spec.size < 2 {
        return None;
    }
    Some(PodDisruptionBudget {
        metadata: owned_metadata(mc),
        spec: Some(PodDisruptionBudgetSpec {
            min_available: Some(IntOrString::Int(
                (mc.spec.size - budget.max_unavailable).max(0),
            )),
            selector: Some(LabelSelector {
                match_labels: Some(selector_labels(mc)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// A container's requests of `cpu` and `memory`, and its memory limit if any.
fn requirements(cpu: &str, memory: &str, memory_limit: Option<&str>) -> ResourceRequirements {
    let quantity = |q: &str| Quantity(q.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), quantity(cpu)),
            ("memory".to_string(), quantity(memory)),
        ])),
        limits: memory_limit.map(|limit| BTreeMap::from([("memory".to_string(), quantity(limit))])),
        ..ResourceRequirements::default()
    }
}

/// A container's TCP port `port`, named `name` (which Services and probes target).
fn container_port(name: &str, port: i32) -> ContainerPort {
    ContainerPort {
        name: Some(name.to_string()),
        container_port: port,
        protocol: Some("TCP".to_string()),
        ..ContainerPort::default()
    }
}

/// A Service's TCP port `port` that targets the pods' port of the same `name`.
fn named_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_string()),
        port,
        target_port: Some(IntOrString::String(name.to_string())),
        protocol: Some("TCP".to_string()),
        ..ServicePort::default()
    }
}

/// The headless Service through which clients find every memcached pod by DNS; with monitoring,
/// also the exporters' `metrics` port, which a ServiceMonitor (or any endpoints-based scrape
/// configuration) selects.
pub fn service(mc: &Memcached) -> Service {
    let port = named_port;
    let mut ports = vec![port("memcached", mc.spec.container_port)];
    if let Some(plain) = tls::plaintext_port(mc) {
        ports.push(port(tls::PLAINTEXT_PORT_NAME, plain));
    }
    if monitored(mc) {
        ports.push(port(METRICS_PORT_NAME, EXPORTER_PORT));
    }
    Service {
        metadata: owned_metadata(mc),
        spec: Some(ServiceSpec {
            cluster_ip: Some("None".to_string()),
            selector: Some(selector_labels(mc)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// The ServiceMonitor that has a prometheus-operator scrape this Memcached's exporters: the
/// `metrics` port of its Service (and of the proxy's, whose agents serve the proxy's metrics).
/// None unless monitoring is on.
pub fn service_monitor(mc: &Memcached) -> Option<ServiceMonitor> {
    if !monitored(mc) {
        return None;
    }
    Some(ServiceMonitor {
        metadata: owned_metadata(mc),
        spec: ServiceMonitorSpec {
            selector: proxy::members_and_proxies(mc),
            endpoints: vec![Endpoint {
                port: Some(METRICS_PORT_NAME.to_string()),
                path: Some("/metrics".to_string()),
            }],
        },
    })
}

/// True when `object` has a controller owner reference pointing at this Memcached (by uid).
pub fn is_controlled_by(object: &ObjectMeta, mc: &Memcached) -> bool {
    let uid = mc.uid();
    object
        .owner_references
        .iter()
        .flatten()
        .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures::{
        memcached, memcached_with_spec as spec_from, monitored_memcached as monitored_cache,
    };

    #[test]
    fn own_labels_names_every_label_the_operator_sets() {
        let keys: Vec<String> = labels(&memcached("cache", 1)).into_keys().collect();
        let mut own = OWN_LABELS.map(String::from).to_vec();
        own.sort();
        assert_eq!(keys, own);
    }

    #[test]
    fn service_is_headless_and_selects_the_pods() {
        let mc = memcached("cache", 1);
        let svc = service(&mc);
        assert!(is_controlled_by(&svc.metadata, &mc));
        let spec = svc.spec.unwrap();
        assert_eq!(spec.cluster_ip.as_deref(), Some("None"));
        assert_eq!(spec.selector.unwrap(), selector_labels(&mc));
    }

    #[test]
    fn servers_are_the_members_stable_names_in_ordinal_order() {
        let mut mc = memcached("web", 2);
        mc.metadata.namespace = Some("shop".into());
        mc.spec.container_port = 11311;
        assert_eq!(
            servers(&mc),
            ["web-0.web.shop.svc:11311", "web-1.web.shop.svc:11311"]
        );
        // The members' names come from their subdomain: the headless Service's.
        let template = pod_template(&mc, &Images::new("img"));
        let member = members::member(&mc, &template, "rev", 0);
        assert_eq!(member.spec.unwrap().subdomain, service(&mc).metadata.name);
        mc.spec.size = 0;
        assert!(servers(&mc).is_empty());
    }

    #[test]
    fn foreign_owner_is_not_control() {
        let mc = memcached("cache", 1);
        let mut meta = service(&mc).metadata;
        meta.owner_references.as_mut().unwrap()[0].uid = "someone-else".into();
        assert!(!is_controlled_by(&meta, &mc));
        meta.owner_references = None;
        assert!(!is_controlled_by(&meta, &mc));
    }

    #[test]
    fn a_budget_exists_from_two_pods_unless_turned_off() {
        assert_eq!(pod_disruption_budget(&memcached("cache", 1)), None);
        let budget = pod_disruption_budget(&memcached("cache", 2)).unwrap();
        assert!(is_controlled_by(&budget.metadata, &memcached("cache", 2)));
        let spec = budget.spec.unwrap();
        // One of two may go: written as the one that stays.
        assert_eq!(spec.min_available, Some(IntOrString::Int(1)));
        assert_eq!(
            spec.selector.unwrap().match_labels.unwrap(),
            selector_labels(&memcached("cache", 2))
        );
        assert_eq!(spec.max_unavailable, None);

        let mut wider =
            spec_from(serde_json::json!({"podDisruptionBudget": {"maxUnavailable": 2}}));
        wider.spec.size = 5;
        let min_available = |mc: &Memcached| {
            pod_disruption_budget(mc)
                .unwrap()
                .spec
                .unwrap()
                .min_available
        };
        assert_eq!(min_available(&wider), Some(IntOrString::Int(3)));
        wider.spec.size = 2;
        assert_eq!(min_available(&wider), Some(IntOrString::Int(0)));
        let off = spec_from(serde_json::json!({"podDisruptionBudget": {"enabled": false}}));
        assert_eq!(pod_disruption_budget(&off), None);
    }

    #[test]
    fn monitoring_adds_the_metrics_port_to_the_service_and_a_service_monitor_for_it() {
        let mc = monitored_cache(None);
        let ports = service(&mc).spec.unwrap().ports.unwrap();
        let named: Vec<_> = ports
            .iter()
            .map(|p| (p.name.clone().unwrap(), p.port, p.target_port.clone()))
            .collect();
        assert_eq!(
            named,
            [
                (
                    "memcached".to_string(),
                    11211,
                    Some(IntOrString::String("memcached".into()))
                ),
                (
                    "metrics".to_string(),
                    9150,
                    Some(IntOrString::String("metrics".into()))
                ),
            ]
        );
        let monitor = service_monitor(&mc).unwrap();
        assert!(is_controlled_by(&monitor.metadata, &mc));
        assert_eq!(monitor.metadata.name.as_deref(), Some("cache"));
        assert_eq!(
            monitor.spec.selector.match_labels.as_ref(),
            Some(&selector_labels(&mc))
        );
        // It selects the Service (whose labels include the selector's), and only its metrics port.
        let svc_labels = service(&mc).metadata.labels.unwrap();
        assert!(
            selector_labels(&mc)
                .iter()
                .all(|(k, v)| svc_labels.get(k) == Some(v))
        );
        assert_eq!(monitor.spec.endpoints.len(), 1);
        assert_eq!(monitor.spec.endpoints[0].port.as_deref(), Some("metrics"));
        let json = serde_json::to_value(&monitor).unwrap();
        assert_eq!(json["apiVersion"], "monitoring.coreos.com/v1");
        assert_eq!(json["kind"], "ServiceMonitor");
    }

    proptest::proptest! {
        /// Whatever the schema admits, the builders do not panic, and a spec the reconciler
        /// accepts comes out in the objects as written.
        #[test]
        fn every_admitted_spec_builds_objects_that_reflect_it(spec in crate::arbitrary::spec()) {
            let mut mc = memcached("cache", 1);
            mc.spec = spec.clone();
            let template = pod_template(&mc, &Images::default());
            let svc = service(&mc);
            if crate::validation::validate(&spec).is_err() {
                return Ok(());
            }
            let pod = template.spec.clone().unwrap();
            let c = &pod.containers[0];
            proptest::prop_assert_eq!(c.image.as_deref(), Some(spec.image.as_deref().unwrap_or(FALLBACK_MEMCACHED_IMAGE)));
            let args = pod_template::tests::args_as_started(&template);
            let memory = spec.max_memory_mib.to_string();
            proptest::prop_assert!(args.windows(2).any(|w| w[0] == "-m" && w[1] == memory));
            proptest::prop_assert_eq!(c.ports.as_ref().unwrap()[0].container_port, spec.container_port);
            proptest::prop_assert_eq!(c.resources.as_ref(), spec.resources.as_deref());
            let selector = selector_labels(&mc);
            let template_labels = template.metadata.unwrap().labels.unwrap();
            proptest::prop_assert!(selector.iter().all(|(k, v)| template_labels.get(k) == Some(v)));
            let ports = svc.spec.unwrap().ports.unwrap();
            proptest::prop_assert_eq!(ports[0].port, spec.container_port);
        }
    }
}
