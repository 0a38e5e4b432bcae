//! The proxy tier (`spec.proxy`): memcached in proxy mode in front of the members, by one
//! address.
//!
//! The operator declares the layout, the members' addresses in ordinal order, as data
//! (`layout.json` in the ConfigMap `<name>-proxy`); the agent beside each proxy checks it and
//! renders memcached's route configuration from it (`render`), then has memcached load it by
//! SIGHUP. memcached exits on a configuration it cannot load, so what it loads is only ever
//! text this module wrote from a checked layout. The pod template never carries the layout:
//! a change of members must not roll the proxies.
//!
//! Keys are placed by memcached's default jump hash over the backends' order: a member added at
//! the end takes its share from every other, and a member keeps its place (and its keys) when
//! it is replaced under its own name.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{Deployment, DeploymentSpec, DeploymentStrategy};
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, EnvVar, EnvVarSource,
    HTTPGetAction, Lifecycle, LifecycleHandler, ObjectFieldSelector, PodSpec, PodTemplateSpec,
    Probe, Service, ServiceSpec, SleepAction, TCPSocketAction, Volume,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector, LabelSelectorRequirement, ObjectMeta,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt;

use super::{
    LABEL_COMPONENT, LABEL_INSTANCE, LABEL_NAME, LABEL_PART_OF, MEMCACHED_UID, METRICS_PORT_NAME,
    monitored, mount, owned_metadata, restricted,
};
use crate::api::{EXPORTER_PORT, Memcached, ProxySpec};

/// The key of the layout in the ConfigMap.
pub const LAYOUT_KEY: &str = "layout.json";
/// Where the proxy's pods mount the ConfigMap.
pub const LAYOUT_DIR: &str = "/etc/memcached-proxy";
/// Where the agent writes the configuration memcached loads.
pub const CONFIG_DIR: &str = "/run/memcached-proxy";
/// The container running memcached in proxy mode.
pub const CONTAINER: &str = "proxy";
/// The agent beside it.
pub const AGENT_CONTAINER: &str = "route-agent";
/// The init container that runs the proxy's image as `memcached -o proxy_config=routelib -V`:
/// a memcached without the proxy refuses the option and exits, so an image without it is told
/// before anything runs (its message is memcached's).
pub const CHECK_CONTAINER: &str = "proxy-check";
/// `app.kubernetes.io/name` of the proxy's pods: not the members' (`memcached`), so that
/// nothing selecting members selects them.
pub const NAME_LABEL: &str = "memcached-proxy";
/// On the proxy's pods: the digest of the layout last written, which has the kubelet refresh
/// the mounted ConfigMap at once.
pub const LAYOUT_ANNOTATION: &str = "cache.example.com/proxy-layout";
/// Largest layout the agent reads: 1,000 members' addresses take about 60 KiB.
pub const MAX_LAYOUT_BYTES: usize = 256 * 1024;
/// The file the agent writes `ROUTES_LIBRARY` to, in `CONFIG_DIR`.
pub const ROUTES_FILE: &str = "routes.lua";
/// How long a proxy going away keeps serving its connections: kube-proxy drops its endpoint
/// within a second or two.
const PRE_STOP_SECONDS: i64 = 5;
/// The agent's zone, from its pod's label (with zone-local reads).
const ZONE_ENV: &str = "PROXY_ZONE";
const LAYOUT_VOLUME: &str = "layout";
const CONFIG_VOLUME: &str = "config";
const BINARY: &str = "/memcached-operator";

mod front;
mod image;
mod layout;
pub use super::relay::{backend_port, fronted};
pub use image::{FIRST_VERSION, failed_check, invalid_image, refused_by, refused_image, too_old};
pub use layout::{Layout, ROUTES_LIBRARY, owner};

/// Whether the Memcached runs the proxy.
pub fn enabled(mc: &Memcached) -> bool {
    spec(mc).is_some()
}

pub fn spec(mc: &Memcached) -> Option<&ProxySpec> {
    mc.spec.proxy_on()
}

/// The name of the proxy's Deployment, Service, ConfigMap and disruption budget.
pub fn name(mc: &Memcached) -> String {
    format!("{}-proxy", mc.name_any())
}

/// The proxy's address for clients (`status.proxy.address`, the binding's `host` and `port`).
pub fn address(mc: &Memcached) -> String {
    format!(
        "{}.{}.svc:{}",
        name(mc),
        mc.namespace().unwrap_or_default(),
        mc.spec.container_port
    )
}

/// The names the proxy's agent serves the members' certificate by (with `spec.tls.issuerRef`,
/// the Certificate lists them); none without the proxy.
pub fn certificate_names(mc: &Memcached) -> Vec<String> {
    if !enabled(mc) {
        return Vec::new();
    }
    let service = format!("{}.{}.svc", name(mc), mc.namespace().unwrap_or_default());
    vec![service.clone(), format!("{service}.cluster.local")]
}

/// The labels of the proxy's pods, which its Deployment and Service select.
fn selector(mc: &Memcached) -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_NAME.to_string(), NAME_LABEL.to_string()),
        (LABEL_INSTANCE.to_string(), mc.name_any()),
    ])
}

/// The members' pods and, with the proxy, the proxy's (their Services too, which carry the same
/// labels): what the Memcached's NetworkPolicy and ServiceMonitor select. Without the proxy,
/// the members' labels alone, as before the proxy existed.
pub fn members_and_proxies(mc: &Memcached) -> LabelSelector {
    if spec(mc).is_none() {
        return LabelSelector {
            match_labels: Some(super::selector_labels(mc)),
            ..LabelSelector::default()
        };
    }
    LabelSelector {
        match_labels: Some(BTreeMap::from([(
            LABEL_INSTANCE.to_string(),
            mc.name_any(),
        )])),
        match_expressions: Some(vec![LabelSelectorRequirement {
            key: LABEL_NAME.to_string(),
            operator: "In".to_string(),
            values: Some(vec!["memcached".to_string(), NAME_LABEL.to_string()]),
        }]),
    }
}

/// The proxy's pods, as a NetworkPolicy peer of the members.
pub fn pods_peer(mc: &Memcached) -> NetworkPolicyPeer {
    NetworkPolicyPeer {
        pod_selector: Some(LabelSelector {
            match_labels: Some(selector(mc)),
            ..LabelSelector::default()
        }),
        ..NetworkPolicyPeer::default()
    }
}

/// `selector` as a label selector string.
pub fn selector_string(mc: &Memcached) -> String {
    super::label_selector(&selector(mc))
}

/// The proxy objects' metadata: an owned object's (the operator's watches select its labels),
/// with the proxy's name and `app.kubernetes.io/name` and `component`.
fn metadata(mc: &Memcached) -> ObjectMeta {
    let mut metadata = owned_metadata(mc);
    metadata.name = Some(name(mc));
    let labels = metadata.labels.get_or_insert_default();
    labels.insert(LABEL_NAME.to_string(), NAME_LABEL.to_string());
    labels.insert(LABEL_COMPONENT.to_string(), "proxy".to_string());
    metadata
}

/// The ConfigMap holding `layout`.
pub fn config_map(mc: &Memcached, layout: &Layout) -> ConfigMap {
    let layout = serde_json::to_string(layout).expect("a layout serialises");
    ConfigMap {
        metadata: metadata(mc),
        data: Some(BTreeMap::from([(LAYOUT_KEY.to_string(), layout)])),
        ..ConfigMap::default()
    }
}

/// The ClusterIP Service clients use, on the members' port; with monitoring, also the agents'
/// `metrics` port, which the Memcached's ServiceMonitor selects as it does the members'.
/// None without the proxy.
pub fn service(mc: &Memcached) -> Option<Service> {
    spec(mc)?;
    let port = super::named_port;
    let mut ports = vec![port("memcached", mc.spec.container_port)];
    if let Some(plain) = super::tls::plaintext_port(mc).filter(|_| fronted(mc)) {
        ports.push(port(super::tls::PLAINTEXT_PORT_NAME, plain));
    }
    if monitored(mc) {
        ports.push(port(METRICS_PORT_NAME, EXPORTER_PORT));
    }
    Some(Service {
        metadata: metadata(mc),
        spec: Some(ServiceSpec {
            selector: Some(selector(mc)),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    })
}

/// The proxy's disruption budget: a drain takes one proxy at a time. None without the proxy
/// or with a single one.
pub fn pod_disruption_budget(mc: &Memcached) -> Option<PodDisruptionBudget> {
    let proxy = spec(mc)?;
    (proxy.replicas >= 2).then(|| PodDisruptionBudget {
        metadata: metadata(mc),
        spec: Some(PodDisruptionBudgetSpec {
            max_unavailable: Some(IntOrString::Int(1)),
            selector: Some(LabelSelector {
                match_labels: Some(selector(mc)),
                ..LabelSelector::default()
            }),
            ..PodDisruptionBudgetSpec::default()
        }),
        status: None,
    })
}

/// The proxy's Deployment; None without the proxy. `memcached_image` is the members' image
/// (the proxy's default), `agent_image` the operator's own.
pub fn deployment(mc: &Memcached, memcached_image: &str, agent_image: &str) -> Option<Deployment> {
    let proxy = spec(mc)?;
    let (listen, port) = front::memcached_listener(mc);
    let fronted = fronted(mc);
    let config = format!("{CONFIG_DIR}/config.lua");
    let library = format!("{CONFIG_DIR}/{ROUTES_FILE}");
    let layout = format!("{LAYOUT_DIR}/{LAYOUT_KEY}");
    let proxy_container = Container {
        name: CONTAINER.to_string(),
        image: Some(
            proxy
                .image
                .as_deref()
                .unwrap_or(memcached_image)
                .to_string(),
        ),
        command: Some(vec!["memcached".to_string()]),
        args: Some(vec![
            format!("--port={port}"),
            format!("--listen={listen}"),
            "-o".to_string(),
            format!("proxy_config=routelib:{library},proxy_arg={config}"),
        ]),
        // A proxy replaced (a new image, an operator upgrade) leaves the Service's endpoints
        // before memcached closes its clients' connections: a client that reconnects then
        // reaches a proxy that stays.
        lifecycle: Some(Lifecycle {
            pre_stop: Some(LifecycleHandler {
                sleep: Some(SleepAction {
                    seconds: PRE_STOP_SECONDS,
                }),
                ..LifecycleHandler::default()
            }),
            ..Lifecycle::default()
        }),
        // Fronted, the agent serves the clients' ports.
        ports: (!fronted).then(|| front::client_ports(mc)),
        // Fronted, the agent tells whether memcached answers on the loopback: its own port
        // would be open while memcached is down.
        readiness_probe: Some(match fronted {
            true => Probe {
                http_get: Some(HTTPGetAction {
                    path: Some("/readyz".to_string()),
                    port: IntOrString::Int(front::ready_port(mc)),
                    ..HTTPGetAction::default()
                }),
                period_seconds: Some(5),
                ..Probe::default()
            },
            false => Probe {
                tcp_socket: Some(TCPSocketAction {
                    port: IntOrString::String("memcached".to_string()),
                    ..TCPSocketAction::default()
                }),
                period_seconds: Some(5),
                ..Probe::default()
            },
        }),
        resources: Some(
            proxy
                .resources
                .as_deref()
                .cloned()
                .unwrap_or_else(|| super::requirements("50m", "64Mi", None)),
        ),
        volume_mounts: Some(vec![mount(CONFIG_VOLUME, CONFIG_DIR, true)]),
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    // With monitoring, the agent serves the proxy's metrics where the members' exporters serve
    // theirs, so one ServiceMonitor endpoint and one policy rule cover both.
    let metrics = monitored(mc);
    let zoned = proxy.zone_local_reads;
    let agent = |name: &str, once: bool| Container {
        name: name.to_string(),
        image: Some(agent_image.to_string()),
        command: Some(vec![BINARY.to_string(), "agent".to_string()]),
        args: Some(
            [
                "route".to_string(),
                format!("--layout={layout}"),
                format!("--config={config}"),
            ]
            .into_iter()
            .chain(once.then(|| "--once".to_string()))
            .chain(zoned.then(|| format!("--zone=$({ZONE_ENV})")))
            .chain((!once).then(|| format!("--memcached=127.0.0.1:{port}")))
            .chain((!once && metrics).then(|| format!("--metrics-address=0.0.0.0:{EXPORTER_PORT}")))
            .chain((!once).then(|| front::agent_args(mc)).into_iter().flatten())
            .collect(),
        ),
        ports: Some(
            (!once && fronted)
                .then(|| front::client_ports(mc))
                .into_iter()
                .flatten()
                .chain(
                    (!once && metrics)
                        .then(|| super::container_port(METRICS_PORT_NAME, EXPORTER_PORT)),
                )
                .collect::<Vec<_>>(),
        )
        .filter(|p| !p.is_empty()),
        volume_mounts: Some(
            [
                mount(LAYOUT_VOLUME, LAYOUT_DIR, true),
                mount(CONFIG_VOLUME, CONFIG_DIR, false),
            ]
            .into_iter()
            .chain((!once).then(|| front::mounts(mc)).into_iter().flatten())
            .collect(),
        ),
        env: zoned.then(|| {
            vec![EnvVar {
                name: ZONE_ENV.to_string(),
                value_from: Some(EnvVarSource {
                    field_ref: Some(ObjectFieldSelector {
                        field_path: format!("metadata.labels['{}']", super::TOPOLOGY_ZONE),
                        ..ObjectFieldSelector::default()
                    }),
                    ..EnvVarSource::default()
                }),
                ..EnvVar::default()
            }]
        }),
        resources: (!once).then(|| match fronted {
            true => front::agent_resources(),
            false => super::agent::resources(),
        }),
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    let check = Container {
        name: CHECK_CONTAINER.to_string(),
        image: proxy_container.image.clone(),
        command: Some(vec!["memcached".to_string()]),
        args: Some(vec![
            "-o".to_string(),
            "proxy_config=routelib".to_string(),
            "-V".to_string(),
        ]),
        termination_message_policy: Some("FallbackToLogsOnError".to_string()),
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    let pod = PodSpec {
        init_containers: Some(vec![check, agent("route-init", true)]),
        containers: vec![proxy_container, agent(AGENT_CONTAINER, false)],
        // The agent signals memcached (SIGHUP) as memcached's own user.
        share_process_namespace: Some(true),
        volumes: Some(
            [
                Volume {
                    name: LAYOUT_VOLUME.to_string(),
                    config_map: Some(ConfigMapVolumeSource {
                        name: name(mc),
                        ..ConfigMapVolumeSource::default()
                    }),
                    ..Volume::default()
                },
                Volume {
                    name: CONFIG_VOLUME.to_string(),
                    empty_dir: Some(EmptyDirVolumeSource::default()),
                    ..Volume::default()
                },
            ]
            .into_iter()
            .chain(front::volumes(mc))
            .collect(),
        ),
        security_context: Some(super::pod_security_context()),
        node_selector: mc.spec.node_selector.clone(),
        tolerations: mc.spec.tolerations.clone(),
        priority_class_name: mc.spec.priority_class_name.clone(),
        image_pull_secrets: mc.spec.image_pull_secrets.clone(),
        ..PodSpec::default()
    };
    let mut pod_labels = selector(mc);
    pod_labels.insert(LABEL_PART_OF.to_string(), "memcached-operator".to_string());
    Some(Deployment {
        metadata: metadata(mc),
        spec: Some(DeploymentSpec {
            replicas: Some(proxy.replicas),
            selector: LabelSelector {
                match_labels: Some(selector(mc)),
                ..LabelSelector::default()
            },
            // A new proxy Ready before an old one goes: clients keep an address that answers.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_string()),
                rolling_update: Some(k8s_openapi::api::apps::v1::RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(1)),
                    max_unavailable: Some(IntOrString::Int(0)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..DeploymentSpec::default()
        }),
        status: None,
    })
}

#[cfg(test)]
mod tests;
