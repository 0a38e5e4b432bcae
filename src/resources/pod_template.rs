//! The members' pod template: memcached's flags, the exporter sidecar, the agent, and where the
//! pods may be scheduled. Each member is this template under its own name (members.rs).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, Container, HTTPGetAction, Lifecycle, LifecycleHandler, PodAffinityTerm,
    PodAntiAffinity, PodSpec, PodTemplateSpec, Probe, SleepAction, TCPSocketAction,
    TopologySpreadConstraint, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::{EXPORTER_PORT, Memcached, Spread};

use super::ports::LocalPorts;
use super::*;
use super::{agent, auth, tls, warm_restart};

/// The memcached exporter beside memcached: it reads `stats` over localhost and serves them on
/// :9150/metrics. Only a liveness probe: a readiness probe would take a serving memcached out of
/// the Service whenever its exporter is not ready.
fn exporter(mc: &Memcached, default_image: &str) -> Container {
    let image = mc
        .spec
        .monitoring
        .as_ref()
        .and_then(|m| m.image.as_deref())
        .unwrap_or(default_image);
    Container {
        name: "exporter".to_string(),
        image: Some(image.to_string()),
        args: Some(vec![
            format!(
                "--memcached.address=localhost:{}",
                agent::exporter_target(mc)
            ),
            format!("--web.listen-address=:{EXPORTER_PORT}"),
        ]),
        ports: Some(vec![container_port(METRICS_PORT_NAME, EXPORTER_PORT)]),
        liveness_probe: Some(Probe {
            http_get: Some(HTTPGetAction {
                path: Some("/".to_string()),
                port: IntOrString::String(METRICS_PORT_NAME.to_string()),
                ..HTTPGetAction::default()
            }),
            initial_delay_seconds: Some(5),
            period_seconds: Some(20),
            ..Probe::default()
        }),
        // Its RSS is about 15 MiB whatever the cache holds; a scrape is one `stats` round trip.
        resources: Some(super::requirements("10m", "16Mi", Some("64Mi"))),
        security_context: Some(restricted(EXPORTER_UID)),
        ..Container::default()
    }
}

/// The pod template every member of a Memcached should run.
pub fn pod_template(mc: &Memcached, images: &Images) -> PodTemplateSpec {
    let default_image = images.memcached.as_str();
    let port = mc.spec.container_port;
    let rollout = mc.spec.rollout.clone().unwrap_or_default();
    let tcp_probe = |initial_delay, period| Probe {
        tcp_socket: Some(TCPSocketAction {
            port: IntOrString::String("memcached".to_string()),
            ..TCPSocketAction::default()
        }),
        initial_delay_seconds: Some(initial_delay),
        period_seconds: Some(period),
        ..Probe::default()
    };
    let container = Container {
        name: MEMCACHED_CONTAINER.to_string(),
        image: Some(image(mc, default_image).to_string()),
        command: Some(vec!["memcached".to_string()]),
        args: Some(memcached_args(mc)),
        ports: Some(
            std::iter::once(("memcached", port))
                .chain(tls::plaintext_port(mc).map(|p| (tls::PLAINTEXT_PORT_NAME, p)))
                .map(|(name, port)| container_port(name, port))
                .collect(),
        ),
        readiness_probe: Some(tcp_probe(1, 5)),
        // Kubernetes takes a stopping pod out of the Service at once, but clients may still hold
        // its address from DNS for a few seconds: it keeps serving them until they have moved on.
        lifecycle: if warm_restart::enabled(mc) {
            Some(warm_restart::pre_stop(mc, rollout.pre_stop_delay_seconds))
        } else {
            (rollout.pre_stop_delay_seconds > 0).then(|| Lifecycle {
                pre_stop: Some(LifecycleHandler {
                    sleep: Some(SleepAction {
                        seconds: i64::from(rollout.pre_stop_delay_seconds),
                    }),
                    ..LifecycleHandler::default()
                }),
                ..Lifecycle::default()
            })
        },
        liveness_probe: Some(tcp_probe(10, 10)),
        env: warm_restart::enabled(mc).then(warm_restart::settings_env),
        resources: mc.spec.resources.as_deref().cloned(),
        volume_mounts: Some(memcached_mounts(mc)).filter(|m| !m.is_empty()),
        security_context: Some(restricted(MEMCACHED_UID)),
        ..Container::default()
    };
    let mut containers = vec![container];
    if monitored(mc) {
        containers.push(exporter(mc, &images.exporter));
    }
    let mut pod = PodSpec {
        containers,
        termination_grace_period_seconds: Some(
            i64::from(rollout.pre_stop_delay_seconds)
                + STOP_MARGIN_SECONDS
                + if warm_restart::enabled(mc) {
                    warm_restart::SAVE_SECONDS
                } else {
                    0
                },
        ),
        topology_spread_constraints: topology_spread(mc),
        affinity: affinity(mc),
        node_selector: mc.spec.node_selector.clone(),
        tolerations: mc.spec.tolerations.clone(),
        priority_class_name: mc.spec.priority_class_name.clone(),
        image_pull_secrets: mc.spec.image_pull_secrets.clone(),
        // memcached needs no API access.
        automount_service_account_token: Some(false),
        security_context: Some(super::pod_security_context()),
        ..PodSpec::default()
    };
    let volumes: Vec<_> = warm_restart::enabled(mc)
        .then(|| [warm_restart::volume(), warm_restart::memory_volume()])
        .into_iter()
        .flatten()
        .chain(auth::volumes(mc))
        .chain(tls::volumes(mc))
        .collect();
    pod.volumes = Some(volumes).filter(|v| !v.is_empty());
    agent::add_to_pod(mc, &mut pod, &images.agent);
    PodTemplateSpec {
        metadata: Some(ObjectMeta {
            labels: Some(pod_labels(mc)),
            annotations: pod_annotations(mc),
            ..ObjectMeta::default()
        }),
        spec: Some(pod),
    }
}

/// The user's pod annotations, and with warm restart the settings a running member takes from
/// there (memory, threads, connections).
fn pod_annotations(mc: &Memcached) -> Option<BTreeMap<String, String>> {
    let mut all = mc.spec.pod_annotations.clone().unwrap_or_default();
    if warm_restart::enabled(mc) {
        all.extend(warm_restart::annotations(mc));
    }
    Some(all).filter(|a| !a.is_empty())
}

/// memcached's command-line flags for a spec. With warm restart, the settings a member takes in
/// place come from its annotations; without, tuning flags only when set, so memcached's own
/// defaults apply otherwise (a member without warm restart has no cache to keep).
fn memcached_args(mc: &Memcached) -> Vec<String> {
    let spec = &mc.spec;
    let warm = warm_restart::enabled(mc);
    let flag = |setting: warm_restart::Setting, value: Option<i32>| match (warm, value) {
        (true, _) => vec![setting.flag.to_string(), setting.arg()],
        (false, Some(value)) => vec![setting.flag.to_string(), value.to_string()],
        (false, None) => vec![],
    };
    let mut args = flag(warm_restart::MEMORY, Some(spec.max_memory_mib));
    args.extend(["-p".to_string(), spec.container_port.to_string()]);
    args.extend(flag(warm_restart::THREADS, spec.threads));
    args.extend(flag(warm_restart::MAX_CONNECTIONS, spec.max_connections));
    if let Some(mib) = spec.max_item_size_mib {
        args.extend(["-I".to_string(), format!("{mib}m")]);
    }
    if warm {
        args.extend(warm_restart::memcached_args());
    }
    if auth::enabled(mc) {
        args.extend(auth::memcached_args());
    }
    args.extend(tls::memcached_args(mc, LocalPorts::of(mc).plain));
    args.extend(["-o", "modern", "-v"].map(String::from));
    args
}

/// The cache's file, the password file and the certificates memcached reads.
fn memcached_mounts(mc: &Memcached) -> Vec<VolumeMount> {
    let mut mounts = Vec::new();
    if warm_restart::enabled(mc) {
        mounts.push(warm_restart::memcached_mount());
    }
    if auth::enabled(mc) {
        mounts.push(auth::memcached_mount());
    }
    mounts.extend(tls::mounts(mc));
    mounts
}

/// The user's pod labels under the operator's own, which select the pods and so always win
/// (admission refuses the user's attempt to set them).
fn pod_labels(mc: &Memcached) -> BTreeMap<String, String> {
    let mut all = mc.spec.pod_labels.clone().unwrap_or_default();
    all.extend(labels(mc));
    all
}

/// Soft spreading over nodes and zones: a node drain or a zone outage takes as few of one
/// Memcached's pods as the cluster allows, and scheduling never waits for it.
fn topology_spread(mc: &Memcached) -> Option<Vec<TopologySpreadConstraint>> {
    let keys: &[&str] = match mc.spec.spread.unwrap_or_default() {
        Spread::Off => return None,
        Spread::Preferred => &[TOPOLOGY_HOSTNAME, TOPOLOGY_ZONE],
        // Nodes are taken care of by the required anti-affinity.
        Spread::Required => &[TOPOLOGY_ZONE],
    };
    Some(
        keys.iter()
            .map(|key| TopologySpreadConstraint {
                max_skew: 1,
                topology_key: key.to_string(),
                when_unsatisfiable: "ScheduleAnyway".to_string(),
                label_selector: Some(LabelSelector {
                    match_labels: Some(selector_labels(mc)),
                    ..LabelSelector::default()
                }),
                ..TopologySpreadConstraint::default()
            })
            .collect(),
    )
}

/// The user's affinity, plus with `spread: Required` a term that keeps two pods of this
/// Memcached off one node.
fn affinity(mc: &Memcached) -> Option<Affinity> {
    let mut affinity = mc.spec.affinity.as_deref().cloned();
    if mc.spec.spread == Some(Spread::Required) {
        let term = PodAffinityTerm {
            topology_key: TOPOLOGY_HOSTNAME.to_string(),
            label_selector: Some(LabelSelector {
                match_labels: Some(selector_labels(mc)),
                ..LabelSelector::default()
            }),
            ..PodAffinityTerm::default()
        };
        affinity
            .get_or_insert_default()
            .pod_anti_affinity
            .get_or_insert_with(PodAntiAffinity::default)
            .required_during_scheduling_ignored_during_execution
            .get_or_insert_default()
            .push(term);
    }
    affinity
}

#[cfg(test)]
pub(crate) mod tests;
