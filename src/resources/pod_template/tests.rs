use super::*;
use crate::fixtures::{
    memcached, memcached_with_spec as spec_from, monitored_memcached as monitored_cache,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

#[test]
fn the_template_runs_memcached_with_its_probes() {
    let mc = memcached("cache", 3);
    let template = pod_template(&mc, &Images::new("memcached:test"));
    let c = &template.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.image.as_deref(), Some("memcached:test"));
    assert_eq!(
        args_as_started(&template),
        [
            "-m",
            "64",
            "-p",
            "11211",
            "-t",
            "4",
            "-c",
            "1024",
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
    let template = pod_template(&mc, &Images::new("img"));
    let pod_labels = template.metadata.unwrap().labels.unwrap();
    for (k, v) in selector_labels(&mc) {
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
    let pod = pod_of(&memcached("cache", 1));
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
    let template = pod_template(&mc, &Images::new("default-image"));
    let c = &template.spec.as_ref().unwrap().containers[0];
    assert_eq!(c.image.as_deref(), Some("memcached:custom"));
    assert_eq!(
        args_as_started(&template)[..4],
        ["-m", "256", "-p", "12345"]
    );
    let svc = service(&mc);
    assert_eq!(svc.spec.unwrap().ports.unwrap()[0].port, 12345);
}

fn pod_of(mc: &Memcached) -> PodSpec {
    pod_template(mc, &Images::new("img")).spec.unwrap()
}

/// A Memcached too small for memcached's warm restart.
fn small(mut mc: Memcached) -> Memcached {
    mc.spec.max_memory_mib = warm_restart::MIN_MEMORY_MIB - 1;
    mc
}

#[test]
fn a_stopping_member_drains() {
    let pod = pod_of(&small(memcached("cache", 3)));
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
    assert_eq!(dir.size_limit, None, "the file grows with -m in the pod");
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
    // It rewrites the saved size for a larger cache, which it reads from the annotation.
    let mounts: Vec<_> = agent
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| (m.mount_path.as_str(), m.read_only))
        .collect();
    assert_eq!(
        mounts,
        [
            ("/cache", None),
            ("/etc/memcached-agent/max-memory", Some(true))
        ]
    );
    assert!(
        agent_args.contains(&"--max-memory-file=/etc/memcached-agent/max-memory/mib".to_string())
    );
    let memory = pod.volumes.as_ref().unwrap()[1]
        .downward_api
        .clone()
        .unwrap();
    let item = &memory.items.unwrap()[0];
    assert_eq!(
        item.field_ref.as_ref().unwrap().field_path,
        "metadata.annotations['cache.example.com/max-memory-mib']"
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
fn rollout_settings_reach_the_pods() {
    let mc = spec_from(serde_json::json!({"rollout": {
        "maxSurge": 3, "maxUnavailable": 2, "minReadySeconds": 0, "preStopDelaySeconds": 0}}));
    let template = pod_template(&mc, &Images::new("img"));
    // A member is replaced under its own name: there is nothing to surge with, and a
    // changed maxSurge changes nothing.
    let surge_one = spec_from(serde_json::json!({"rollout": {
        "maxSurge": 1, "maxUnavailable": 2, "minReadySeconds": 0, "preStopDelaySeconds": 0}}));
    assert_eq!(pod_template(&surge_one, &Images::new("img")), template);
    let pod = template.spec.unwrap();
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
    let template = pod_template(&mc, &Images::new("img"));
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
    let labels = pod_template(&mc, &Images::new("img"))
        .metadata
        .unwrap()
        .labels
        .unwrap();
    assert_eq!(labels[LABEL_INSTANCE], "cache");
}

#[test]
fn tuning_flags_reach_memcached_from_annotations_a_running_member_can_change() {
    let mc =
        spec_from(serde_json::json!({"threads": 8, "maxConnections": 4096, "maxItemSizeMiB": 2}));
    let template = pod_template(&mc, &Images::new("img"));
    assert_eq!(
        args_as_started(&template),
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
    let memcached = &template.spec.as_ref().unwrap().containers[0];
    let args = memcached.args.as_ref().unwrap();
    assert_eq!(
        args[4..8],
        [
            "-t",
            "$(MEMCACHED_THREADS)",
            "-c",
            "$(MEMCACHED_MAX_CONNECTIONS)"
        ]
    );
    // The agent sees them too, to restart memcached when they change.
    let volumes = template.spec.as_ref().unwrap().volumes.as_ref().unwrap();
    let files: Vec<_> = volumes
        .iter()
        .find(|v| v.name == warm_restart::MEMORY_VOLUME)
        .and_then(|v| v.downward_api.as_ref()?.items.as_ref())
        .unwrap()
        .iter()
        .map(|i| i.path.as_str())
        .collect();
    assert_eq!(files, ["mib", "threads", "max-connections"]);
}

#[test]
fn without_warm_restart_tuning_flags_reach_memcached_only_when_set() {
    let set = small(spec_from(
        serde_json::json!({"threads": 8, "maxConnections": 4096}),
    ));
    assert_eq!(
        pod_of(&set).containers[0].args.as_ref().unwrap()[..8],
        ["-m", "38", "-p", "11211", "-t", "8", "-c", "4096"]
    );
    let defaults = pod_of(&small(memcached("cache", 1))).containers[0]
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
    let pod = pod_template(&mc, &images).spec.unwrap();
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
    let pod = pod_template(&mc, &images).spec.unwrap();
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
            ports::LocalPorts::of(&mc).agent
        ),
        "the exporter reads stats through the agent, which logs in"
    );
}

/// memcached's arguments as the kubelet starts it: `$(VAR)` expanded from the environment's
/// pod annotations.
pub(crate) fn args_as_started(template: &PodTemplateSpec) -> Vec<String> {
    let annotations = template
        .metadata
        .as_ref()
        .and_then(|m| m.annotations.clone())
        .unwrap_or_default();
    let memcached = &template.spec.as_ref().unwrap().containers[0];
    let env: BTreeMap<String, String> = memcached
        .env
        .iter()
        .flatten()
        .filter_map(|e| {
            let path = &e.value_from.as_ref()?.field_ref.as_ref()?.field_path;
            let key = path
                .strip_prefix("metadata.annotations['")?
                .strip_suffix("']")?;
            Some((format!("$({})", e.name), annotations.get(key)?.clone()))
        })
        .collect();
    memcached
        .args
        .iter()
        .flatten()
        .map(|a| env.get(a).unwrap_or(a).clone())
        .collect()
}
