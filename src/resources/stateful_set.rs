//! The StatefulSet a Memcached owns: stable members `<name>-0 … <name>-N-1`, its pod template,
//! memcached's flags, the exporter sidecar, the update strategy and where the pods may be
//! scheduled.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{StatefulSet, StatefulSetSpec, StatefulSetUpdateStrategy};
use k8s_openapi::api::core::v1::{
    Affinity, Capabilities, Container, ContainerPort, HTTPGetAction, Lifecycle, LifecycleHandler,
    PodAffinityTerm, PodAntiAffinity, PodSecurityContext, PodSpec, PodTemplateSpec, Probe,
    ResourceRequirements, SeccompProfile, SecurityContext, SleepAction, TCPSocketAction,
    TopologySpreadConstraint, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::api::{EXPORTER_PORT, Memcached, Spread};

use super::*;
use super::{agent, auth, tls, warm_restart};

/// A container as restricted as the Pod Security "restricted" profile asks: non-root as `uid`,
/// no privilege escalation, no capabilities, a read-only root.
pub(super) fn restricted(uid: i64) -> SecurityContext {
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
        ports: Some(vec![ContainerPort {
            name: Some(METRICS_PORT_NAME.to_string()),
            container_port: EXPORTER_PORT,
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
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
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_string(), Quantity("10m".to_string())),
                ("memory".to_string(), Quantity("16Mi".to_string())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_string(),
                Quantity("64Mi".to_string()),
            )])),
            ..ResourceRequirements::default()
        }),
        security_context: Some(restricted(EXPORTER_UID)),
        ..Container::default()
    }
}

/// The StatefulSet a Memcached should have.
pub fn stateful_set(mc: &Memcached, images: &Images) -> StatefulSet {
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
                .map(|(name, port)| ContainerPort {
                    name: Some(name.to_string()),
                    container_port: port,
                    protocol: Some("TCP".to_string()),
                    ..ContainerPort::default()
                })
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
        security_context: Some(PodSecurityContext {
            run_as_non_root: Some(true),
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_string(),
                ..SeccompProfile::default()
            }),
            ..PodSecurityContext::default()
        }),
        ..PodSpec::default()
    };
    let volumes: Vec<_> = warm_restart::enabled(mc)
        .then(|| warm_restart::volume(mc))
        .into_iter()
        .chain(auth::volumes(mc))
        .chain(tls::volumes(mc))
        .collect();
    pod.volumes = Some(volumes).filter(|v| !v.is_empty());
    agent::add_to_pod(mc, &mut pod, &images.agent);
    StatefulSet {
        metadata: owned_metadata(mc),
        spec: Some(StatefulSetSpec {
            replicas: Some(mc.spec.size),
            selector: LabelSelector {
                match_labels: Some(selector_labels(mc)),
                ..LabelSelector::default()
            },
            // The headless Service gives each member its DNS name, `<pod>.<name>.<ns>.svc`.
            service_name: Some(mc.name_any()),
            // Members are independent caches: start and stop them together, not in order.
            pod_management_policy: Some("Parallel".to_string()),
            // The operator updates the members (controller/members.rs): in place where only
            // images change, so that a member keeps its cache through a restart.
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("OnDelete".to_string()),
                rolling_update: None,
            }),
            min_ready_seconds: Some(rollout.min_ready_seconds),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(pod_labels(mc)),
                    annotations: mc.spec.pod_annotations.clone(),
                    ..ObjectMeta::default()
                }),
                spec: Some(pod),
            },
            ..StatefulSetSpec::default()
        }),
        status: None,
    }
}

/// memcached's command-line flags for a spec; tuning flags only when set, so memcached's own
/// defaults apply otherwise.
fn memcached_args(mc: &Memcached) -> Vec<String> {
    let spec = &mc.spec;
    let mut args = vec![
        "-m".to_string(),
        spec.max_memory_mib.to_string(),
        "-p".to_string(),
        spec.container_port.to_string(),
    ];
    for (flag, value, unit) in [
        ("-t", spec.threads, ""),
        ("-c", spec.max_connections, ""),
        ("-I", spec.max_item_size_mib, "m"),
    ] {
        if let Some(value) = value {
            args.extend([flag.to_string(), format!("{value}{unit}")]);
        }
    }
    if warm_restart::enabled(mc) {
        args.extend(warm_restart::memcached_args());
    }
    if auth::enabled(mc) {
        args.extend(auth::memcached_args());
    }
    args.extend(tls::memcached_args(mc, agent::LocalPorts::of(mc).plain));
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
mod tests {
    use super::*;
    use crate::fixtures::{
        memcached, memcached_with_spec as spec_from, monitored_memcached as monitored_cache,
    };

    #[test]
    fn stateful_set_runs_size_replicas_of_memcached_owned_by_the_cr() {
        let mc = memcached("cache", 3);
        let d = stateful_set(&mc, &Images::new("memcached:test"));
        let spec = d.spec.as_ref().unwrap();
        assert_eq!(spec.replicas, Some(3));
        assert_eq!(d.metadata.name.as_deref(), Some("cache"));
        // Members `cache-N` get their DNS names from the headless Service of the same name, and
        // start and stop together.
        assert_eq!(spec.service_name.as_deref(), Some("cache"));
        assert_eq!(service(&mc).metadata.name.as_deref(), Some("cache"));
        assert_eq!(spec.pod_management_policy.as_deref(), Some("Parallel"));
        assert_eq!(d.metadata.namespace.as_deref(), Some("default"));
        assert!(is_controlled_by(&d.metadata, &mc));
        let owner = &d.metadata.owner_references.as_ref().unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.block_owner_deletion),
            ("Memcached", Some(true))
        );

        let c = &spec.template.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("memcached:test"));
        assert_eq!(
            c.args.as_ref().unwrap(),
            &[
                "-m",
                "64",
                "-p",
                "11211",
                "-e",
                "/cache/memory_file",
                "-o",
                "modern",
                "-v"
            ]
        );
        assert_eq!(c.ports.as_ref().unwrap()[0].container_port, 11211);
        assert!(c.readiness_probe.as_ref().unwrap().tcp_socket.is_some());
        assert!(c.liveness_probe.as_ref().unwrap().tcp_socket.is_some());
    }

    #[test]
    fn selector_is_a_subset_of_pod_labels() {
        let mc = memcached("cache", 1);
        let d = stateful_set(&mc, &Images::new("img"));
        let spec = d.spec.unwrap();
        let pod_labels = spec.template.metadata.unwrap().labels.unwrap();
        for (k, v) in spec.selector.match_labels.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        assert_eq!(
            pod_labels.get(LABEL_MANAGED_BY).map(String::as_str),
            Some(MANAGER_NAME)
        );
        assert_eq!(
            selector_string(&mc),
            "app.kubernetes.io/instance=cache,app.kubernetes.io/name=memcached"
        );
    }

    #[test]
    fn pod_meets_the_restricted_pod_security_profile() {
        let d = stateful_set(&memcached("cache", 1), &Images::new("img"));
        let pod = d.spec.unwrap().template.spec.unwrap();
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let sc = pod.containers[0].security_context.clone().unwrap();
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.run_as_user, Some(MEMCACHED_UID));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
    }

    #[test]
    fn spec_overrides_reach_the_container() {
        let mut mc = memcached("cache", 2);
        mc.spec.image = Some("memcached:custom".into());
        mc.spec.max_memory_mib = 256;
        mc.spec.container_port = 12345;
        let d = stateful_set(&mc, &Images::new("default-image"));
        let c = &d.spec.unwrap().template.spec.unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("memcached:custom"));
        assert_eq!(c.args.as_ref().unwrap()[..4], ["-m", "256", "-p", "12345"]);
        let svc = service(&mc);
        assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 12345);
    }

    fn pod_of(mc: &Memcached) -> PodSpec {
        stateful_set(mc, &Images::new("img"))
            .spec
            .unwrap()
            .template
            .spec
            .unwrap()
    }

    /// A Memcached too small for memcached's warm restart.
    fn small(mut mc: Memcached) -> Memcached {
        mc.spec.max_memory_mib = warm_restart::MIN_MEMORY_MIB - 1;
        mc
    }

    #[test]
    fn the_operator_updates_the_members_and_a_stopping_member_drains() {
        let d = stateful_set(&small(memcached("cache", 3)), &Images::new("img"))
            .spec
            .unwrap();
        let strategy = d.update_strategy.unwrap();
        assert_eq!(strategy.type_.as_deref(), Some("OnDelete"));
        assert_eq!(strategy.rolling_update, None);
        assert_eq!(d.min_ready_seconds, Some(5));
        let pod = d.template.spec.unwrap();
        let pre_stop = pod.containers[0]
            .lifecycle
            .clone()
            .unwrap()
            .pre_stop
            .unwrap();
        assert_eq!(pre_stop.sleep.unwrap().seconds, 10);
        assert_eq!(pod.termination_grace_period_seconds, Some(30));
    }

    #[test]
    fn warm_restart_keeps_the_items_in_a_memory_backed_file_the_agent_has_saved() {
        let mut mc = memcached("cache", 3);
        mc.metadata.uid = Some("uid-1".into());
        let pod = pod_of(&mc);
        let server = &pod.containers[0];
        let args = server.args.clone().unwrap();
        assert!(
            args.windows(2)
                .any(|w| w == ["-e", warm_restart::MEMORY_FILE]),
            "{args:?}"
        );
        let volume = &pod.volumes.as_ref().unwrap()[0];
        let dir = volume.empty_dir.clone().unwrap();
        assert_eq!(dir.medium.as_deref(), Some("Memory"));
        assert_eq!(
            dir.size_limit,
            Some(Quantity("65Mi".into())),
            "-m and the metadata"
        );
        let mount = &server.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (mount.name.as_str(), mount.mount_path.as_str()),
            ("cache", "/cache")
        );

        // memcached's preStop: the agent saves after the drain delay, on the pod's address.
        let hook = server.lifecycle.clone().unwrap().pre_stop.unwrap();
        let get = hook.http_get.unwrap();
        assert_eq!(get.path.as_deref(), Some("/save?delay=10"));
        assert_eq!(get.port, IntOrString::Int(11297));
        let header = &get.http_headers.unwrap()[0];
        assert_eq!(
            (header.name.as_str(), header.value.as_str()),
            ("X-Save-Token", "uid-1")
        );
        assert_eq!(pod.termination_grace_period_seconds, Some(35));

        let agent = pod.containers.iter().find(|c| c.name == "agent").unwrap();
        let agent_args = agent.args.clone().unwrap();
        assert!(agent_args.contains(&"--save-listen=0.0.0.0:11297".to_string()));
        assert!(agent_args.contains(&"--memory-file=/cache/memory_file".to_string()));
        let env = &agent.env.as_ref().unwrap()[0];
        assert_eq!(
            (env.name.as_str(), env.value.as_deref()),
            ("AGENT_SAVE_TOKEN", Some("uid-1"))
        );
        let agent_mount = &agent.volume_mounts.as_ref().unwrap()[0];
        assert_eq!(
            (agent_mount.mount_path.as_str(), agent_mount.read_only),
            ("/cache", Some(true))
        );
        assert_eq!(
            pod.share_process_namespace,
            Some(true),
            "the agent signals memcached"
        );

        let cold = pod_of(&small(memcached("cache", 3)));
        assert!(cold.volumes.is_none() && cold.containers.len() == 1);
        assert!(
            !cold.containers[0]
                .args
                .clone()
                .unwrap()
                .contains(&"-e".to_string())
        );
    }

    #[test]
    fn rollout_settings_reach_the_stateful_set() {
        let mc = spec_from(serde_json::json!({"rollout": {
            "maxSurge": 3, "maxUnavailable": 2, "minReadySeconds": 0, "preStopDelaySeconds": 0}}));
        let d = stateful_set(&mc, &Images::new("img")).spec.unwrap();
        assert_eq!(d.min_ready_seconds, Some(0));
        // A member is replaced under its own name: there is nothing to surge with, and a
        // changed maxSurge changes nothing.
        let surge_one = spec_from(serde_json::json!({"rollout": {
            "maxSurge": 1, "maxUnavailable": 2, "minReadySeconds": 0, "preStopDelaySeconds": 0}}));
        assert_eq!(
            stateful_set(&surge_one, &Images::new("img")).spec.unwrap(),
            d
        );
        let pod = d.template.spec.unwrap();
        assert_eq!(pod.termination_grace_period_seconds, Some(25));
        let cold = pod_of(&small(mc));
        assert_eq!(
            cold.containers[0].lifecycle, None,
            "no delay, no save: no hook"
        );
        assert_eq!(cold.termination_grace_period_seconds, Some(20));
    }

    #[test]
    fn pods_spread_softly_over_nodes_and_zones_by_default() {
        let pod = pod_of(&memcached("cache", 3));
        let spread = pod.topology_spread_constraints.unwrap();
        let keys: Vec<_> = spread.iter().map(|c| c.topology_key.as_str()).collect();
        assert_eq!(keys, [TOPOLOGY_HOSTNAME, TOPOLOGY_ZONE]);
        assert!(
            spread
                .iter()
                .all(|c| c.when_unsatisfiable == "ScheduleAnyway"
                    && c.max_skew == 1
                    && c.label_selector.as_ref().unwrap().match_labels.as_ref()
                        == Some(&selector_labels(&memcached("cache", 3))))
        );
        assert_eq!(pod.affinity, None);
    }

    #[test]
    fn required_spread_keeps_two_pods_off_one_node_beside_the_users_affinity() {
        let mc = spec_from(serde_json::json!({
            "spread": "Required",
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [{"key": "disk", "operator": "In", "values": ["ssd"]}]}]}}}
        }));
        let pod = pod_of(&mc);
        let affinity = pod.affinity.unwrap();
        assert!(
            affinity.node_affinity.is_some(),
            "the user's affinity is kept"
        );
        let terms = affinity
            .pod_anti_affinity
            .unwrap()
            .required_during_scheduling_ignored_during_execution
            .unwrap();
        assert_eq!(terms.len(), 1);
        assert_eq!(terms[0].topology_key, TOPOLOGY_HOSTNAME);
        let keys: Vec<_> = pod
            .topology_spread_constraints
            .unwrap()
            .into_iter()
            .map(|c| c.topology_key)
            .collect();
        assert_eq!(keys, [TOPOLOGY_ZONE], "zones stay preferred");

        let off = pod_of(&spec_from(serde_json::json!({"spread": "Off"})));
        assert_eq!(
            (off.topology_spread_constraints, off.affinity),
            (None, None)
        );
    }

    #[test]
    fn scheduling_fields_reach_the_pod() {
        let mc = spec_from(serde_json::json!({
            "nodeSelector": {"disk": "ssd"},
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "cache", "effect": "NoSchedule"}],
            "priorityClassName": "high",
            "imagePullSecrets": [{"name": "regcred"}],
            "podAnnotations": {"prometheus.io/scrape": "true"},
            "podLabels": {"team": "web"},
        }));
        let template = stateful_set(&mc, &Images::new("img"))
            .spec
            .unwrap()
            .template;
        let pod = template.spec.unwrap();
        assert_eq!(pod.node_selector.unwrap()["disk"], "ssd");
        assert_eq!(pod.tolerations.unwrap()[0].value.as_deref(), Some("cache"));
        assert_eq!(pod.priority_class_name.as_deref(), Some("high"));
        assert_eq!(pod.image_pull_secrets.unwrap()[0].name, "regcred");
        let meta = template.metadata.unwrap();
        assert_eq!(meta.annotations.unwrap()["prometheus.io/scrape"], "true");
        let labels = meta.labels.unwrap();
        assert_eq!(labels["team"], "web");
        assert_eq!(labels[LABEL_INSTANCE], "cache");
    }

    #[test]
    fn the_operators_labels_win_over_pod_labels() {
        // Admission refuses these; an object stored before that rule must still be selected.
        let mc = spec_from(serde_json::json!({"podLabels": {LABEL_INSTANCE: "other"}}));
        let labels = stateful_set(&mc, &Images::new("img"))
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .labels
            .unwrap();
        assert_eq!(labels[LABEL_INSTANCE], "cache");
    }

    #[test]
    fn tuning_flags_reach_memcached_only_when_set() {
        let mc = spec_from(
            serde_json::json!({"threads": 8, "maxConnections": 4096, "maxItemSizeMiB": 2}),
        );
        let args = pod_of(&mc).containers[0].args.clone().unwrap();
        assert_eq!(
            args,
            [
                "-m",
                "64",
                "-p",
                "11211",
                "-t",
                "8",
                "-c",
                "4096",
                "-I",
                "2m",
                "-e",
                "/cache/memory_file",
                "-o",
                "modern",
                "-v"
            ]
        );
        let defaults = pod_of(&memcached("cache", 1)).containers[0]
            .args
            .clone()
            .unwrap();
        assert!(
            !defaults
                .iter()
                .any(|a| ["-t", "-c", "-I"].contains(&a.as_str()))
        );
    }

    #[test]
    fn monitoring_is_off_by_default_and_adds_nothing() {
        let mc = small(memcached("cache", 3));
        assert_eq!(pod_of(&mc).containers.len(), 1);
        let ports = service(&mc).spec.unwrap().ports.unwrap();
        assert_eq!(ports.len(), 1);
        assert!(service_monitor(&mc).is_none());
        let off = small(spec_from(
            serde_json::json!({"monitoring": {"enabled": false, "image": "x"}}),
        ));
        assert_eq!(pod_of(&off).containers.len(), 1);
        assert!(service_monitor(&off).is_none());
    }

    #[test]
    fn monitoring_adds_a_restricted_exporter_reading_memcached_over_localhost() {
        let mut mc = small(monitored_cache(None));
        mc.spec.container_port = 12000;
        let images = Images {
            exporter: "exporter:default".into(),
            ..Images::new("memcached:x")
        };
        let pod = stateful_set(&mc, &images)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let [memcached, exporter] = &pod.containers[..] else {
            panic!("two containers: {:?}", pod.containers)
        };
        assert_eq!(memcached.name, "memcached");
        assert_eq!(exporter.name, "exporter");
        assert_eq!(exporter.image.as_deref(), Some("exporter:default"));
        assert_eq!(
            exporter.args.clone().unwrap(),
            [
                "--memcached.address=localhost:12000",
                "--web.listen-address=:9150"
            ]
        );
        let port = &exporter.ports.as_ref().unwrap()[0];
        assert_eq!(
            (port.name.as_deref(), port.container_port),
            (Some("metrics"), 9150)
        );
        let sc = exporter.security_context.clone().unwrap();
        assert_eq!(sc.run_as_non_root, Some(true));
        assert_eq!(sc.run_as_user, Some(EXPORTER_UID));
        assert_eq!(sc.allow_privilege_escalation, Some(false));
        assert_eq!(sc.read_only_root_filesystem, Some(true));
        assert_eq!(sc.capabilities.unwrap().drop.unwrap(), ["ALL"]);
        // The pod's seccomp profile and non-root rule cover both containers.
        let psc = pod.security_context.unwrap();
        assert_eq!(psc.seccomp_profile.unwrap().type_, "RuntimeDefault");
        let liveness = exporter.liveness_probe.clone().unwrap().http_get.unwrap();
        assert_eq!(liveness.port, IntOrString::String("metrics".into()));
        assert_eq!(
            exporter.readiness_probe, None,
            "the exporter never takes memcached out of the Service"
        );
        let limits = exporter.resources.clone().unwrap().limits.unwrap();
        assert_eq!(limits["memory"], Quantity("64Mi".into()));

        let pinned = monitored_cache(Some("exporter:pinned"));
        assert_eq!(
            pod_of(&pinned).containers[1].image.as_deref(),
            Some("exporter:pinned")
        );
    }

    #[test]
    fn auth_is_off_by_default_and_adds_nothing() {
        let mut mc = small(memcached("cache", 1));
        mc.spec.auth = Some(crate::api::AuthSpec::default());
        let pod = pod_of(&mc);
        assert_eq!(pod, pod_of(&small(memcached("cache", 1))));
        assert!(pod.init_containers.is_none() && pod.volumes.is_none());
        assert_eq!(pod.share_process_namespace, None);
    }

    #[test]
    fn auth_gives_memcached_a_password_file_kept_by_a_restricted_agent() {
        let mut mc = monitored_cache(None);
        mc.spec.auth = Some(crate::api::AuthSpec {
            enabled: true,
            secret_name: Some("creds".into()),
            rotation_grace_seconds: 90,
        });
        let images = Images {
            agent: "operator:1".into(),
            ..Images::new("memcached:x")
        };
        let pod = stateful_set(&mc, &images)
            .spec
            .unwrap()
            .template
            .spec
            .unwrap();
        let memcached = &pod.containers[0];
        let args = memcached.args.clone().unwrap();
        assert!(
            args.windows(2).any(|w| w == ["-Y", auth::AUTH_FILE]),
            "{args:?}"
        );
        let mount = memcached
            .volume_mounts
            .iter()
            .flatten()
            .find(|m| m.mount_path == auth::AUTH_DIR)
            .unwrap();
        assert_eq!(
            (mount.mount_path.as_str(), mount.read_only),
            (auth::AUTH_DIR, Some(true))
        );

        let init = &pod.init_containers.as_ref().unwrap()[0];
        let agent = pod.containers.iter().find(|c| c.name == "agent").unwrap();
        for c in [init, agent] {
            assert_eq!(c.image.as_deref(), Some("operator:1"));
            assert_eq!(
                c.security_context,
                Some(restricted(MEMCACHED_UID)),
                "{}",
                c.name
            );
        }
        assert_eq!(init.args.as_ref().unwrap()[0], "init");
        let agent_args = agent.args.clone().unwrap();
        assert!(
            agent_args.contains(&"--rotation-grace=90s".to_string()),
            "{agent_args:?}"
        );
        assert!(agent_args.contains(&"--memcached=127.0.0.1:11211".to_string()));
        assert_eq!(
            pod.share_process_namespace,
            Some(true),
            "the agent signals memcached"
        );
        let secret = pod
            .volumes
            .as_ref()
            .unwrap()
            .iter()
            .find_map(|v| v.secret.as_ref())
            .unwrap();
        assert_eq!(secret.secret_name.as_deref(), Some("creds"));

        let exporter = pod
            .containers
            .iter()
            .find(|c| c.name == "exporter")
            .unwrap();
        assert_eq!(
            exporter.args.as_ref().unwrap()[0],
            format!(
                "--memcached.address=localhost:{}",
                agent::LocalPorts::of(&mc).agent
            ),
            "the exporter reads stats through the agent, which logs in"
        );
    }
}
