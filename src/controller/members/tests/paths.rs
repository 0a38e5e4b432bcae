//! Which path each field of the spec that reaches the pod takes: in place, resized, replaced.

use super::*;

/// The template of a 3-member Memcached of 64 MiB with `spec`'s fields set.
fn built_with(spec: Value) -> Value {
    let mut mc = crate::fixtures::memcached_with_spec(spec);
    mc.spec.image = mc.spec.image.or(Some("memcached:1".into()));
    serde_json::to_value(resources::pod_template(
        &mc,
        &resources::Images::new("agent:1"),
    ))
    .unwrap()
}

/// How a running member takes a change, as the rule in in_place.rs has it.
#[derive(Debug, PartialEq)]
enum Path {
    /// Patched: its labels or annotations, and these containers restarted in the pod.
    InPlace(&'static [&'static str]),
    /// Its containers' CPU or memory resized: nothing restarts.
    Resized,
    /// A new pod.
    Replaced,
}

/// The path from the template itself (kept in a ControllerRevision before 0.9.0), checked
/// against the one the member's own record of its template gives.
fn path_of(before: Value, after: Value) -> Path {
    let (old, new) = (built_with(before), built_with(after));
    let from_template = next_move(&running(&old), &made(&old), &new, "new");
    let member = made_member(&old);
    let recorded = Made::of_pod(&member, &new).expect("the operator's member has a record");
    let from_member = next_move(&member, &recorded, &new, "new");
    assert_eq!(
        without_record(from_member),
        without_record(from_template.clone()),
        "the member's record tells what its template did"
    );
    match from_template {
        Move::Patch(patch, record) => {
            let restarted: Vec<&str> = record.restarts.keys().map(String::as_str).collect();
            let expected = match restarted.as_slice() {
                [] => &[][..],
                ["memcached"] => &["memcached"],
                ["exporter"] => &["exporter"],
                other => panic!("unexpected restarts {other:?} by {patch}"),
            };
            Path::InPlace(expected)
        }
        Move::Resize(_) => Path::Resized,
        Move::Evict => Path::Replaced,
        other => panic!("{other:?}"),
    }
}

/// A patch's record of the new template left out: a member made with the old one's record
/// writes it only where it changes.
fn without_record(step: Move) -> Move {
    match step {
        Move::Patch(mut patch, record) => {
            if let Some(a) = patch["metadata"]["annotations"].as_object_mut() {
                a.remove(TEMPLATE_ANNOTATION);
            }
            Move::Patch(patch, record)
        }
        other => other,
    }
}

/// Every field of the spec that reaches the member's pod, and the path its change takes: in the
/// same pod whatever memcached restores under a restart (its items come back from the memory
/// file), a new pod only for what a running pod cannot take or memcached checks against its file.
#[test]
fn each_field_of_the_pod_takes_the_path_memcached_allows() {
    use Path::*;
    let none = json!({});
    let monitored = json!({"monitoring": {"enabled": true}});
    let requests = json!({"resources": {"requests": {"cpu": "100m", "memory": "80Mi"}}});
    let rows: Vec<(&str, Value, Value, Path)> = vec![
        (
            "image",
            none.clone(),
            json!({"image": "memcached:2"}),
            InPlace(&["memcached"]),
        ),
        // Restored from the file under any -t and -c: restarted by the agent.
        (
            "threads",
            none.clone(),
            json!({"threads": 2}),
            InPlace(&["memcached"]),
        ),
        (
            "threads set",
            json!({"threads": 4}),
            json!({"threads": 8}),
            InPlace(&["memcached"]),
        ),
        (
            "threads, memcached's default written out",
            none.clone(),
            json!({"threads": 4}),
            InPlace(&[]),
        ),
        (
            "maxConnections",
            none.clone(),
            json!({"maxConnections": 2048}),
            InPlace(&["memcached"]),
        ),
        (
            "maxMemoryMiB larger",
            none.clone(),
            json!({"maxMemoryMiB": 128}),
            InPlace(&["memcached"]),
        ),
        // memcached refuses its file at a smaller -m.
        (
            "maxMemoryMiB smaller",
            json!({"maxMemoryMiB": 128}),
            none.clone(),
            Replaced,
        ),
        // memcached checks -I against its file.
        (
            "maxItemSizeMiB",
            none.clone(),
            json!({"maxItemSizeMiB": 2}),
            Replaced,
        ),
        (
            "resources: CPU",
            requests.clone(),
            json!({"resources": {"requests": {"cpu": "250m", "memory": "80Mi"}}}),
            Resized,
        ),
        // The API server refuses a resize into another QoS class (none to Burstable here).
        (
            "resources: first requests",
            none.clone(),
            requests.clone(),
            Replaced,
        ),
        (
            "resources: other",
            none.clone(),
            json!({"resources": {"limits": {"ephemeral-storage": "1Gi"}}}),
            Replaced,
        ),
        (
            "podAnnotations",
            none.clone(),
            json!({"podAnnotations": {"team": "a"}}),
            InPlace(&[]),
        ),
        (
            "podLabels",
            none.clone(),
            json!({"podLabels": {"team": "a"}}),
            InPlace(&[]),
        ),
        (
            "monitoring.image",
            monitored.clone(),
            json!({"monitoring": {"enabled": true, "image": "exporter:2"}}),
            InPlace(&["exporter"]),
        ),
        // Pod ports, containers, volumes, scheduling and stop settings are fixed for a pod's life.
        (
            "containerPort",
            none.clone(),
            json!({"containerPort": 11311}),
            Replaced,
        ),
        (
            "monitoring.enabled",
            none.clone(),
            monitored.clone(),
            Replaced,
        ),
        (
            "auth",
            none.clone(),
            json!({"auth": {"enabled": true}}),
            Replaced,
        ),
        (
            "tls",
            none.clone(),
            json!({"tls": {"enabled": true}}),
            Replaced,
        ),
        (
            "rollout.preStopDelaySeconds",
            none.clone(),
            json!({"rollout": {"preStopDelaySeconds": 20}}),
            Replaced,
        ),
        (
            "spread",
            none.clone(),
            json!({"spread": "Required"}),
            Replaced,
        ),
        (
            "nodeSelector",
            none.clone(),
            json!({"nodeSelector": {"disk": "ssd"}}),
            Replaced,
        ),
        (
            "tolerations",
            none.clone(),
            json!({"tolerations": [{"key": "k", "operator": "Exists"}]}),
            Replaced,
        ),
        (
            "affinity",
            none.clone(),
            json!({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 1, "preference": {"matchExpressions": [{"key": "k", "operator": "Exists"}]}}]}}}),
            Replaced,
        ),
        (
            "priorityClassName",
            none.clone(),
            json!({"priorityClassName": "high"}),
            Replaced,
        ),
        (
            "imagePullSecrets",
            none.clone(),
            json!({"imagePullSecrets": [{"name": "pull"}]}),
            Replaced,
        ),
    ];
    for (field, before, after, expected) in rows {
        assert_eq!(path_of(before, after), expected, "{field}");
    }
}

/// A member made by 0.6–0.8 has `-t` and `-c` as literal arguments: kept by the operator's
/// upgrade, but replaced for other threads (its memcached would not read the annotation).
#[test]
fn a_member_made_before_threads_came_from_an_annotation_is_kept_but_cannot_change_them() {
    let old = as_before_0_9(&built_with(json!({})));
    let pod = running(&old);
    let same = built_with(json!({"image": "memcached:2"}));
    let patch =
        restart_patch(&pod, &made(&old), &same, "new").expect("the same member in another form");
    let annotations = patch["metadata"]["annotations"].as_object().unwrap();
    assert!(
        !annotations.contains_key(resources::warm_restart::THREADS.annotation),
        "its memcached does not read it: {annotations:?}"
    );
    let threads = built_with(json!({"threads": 2}));
    assert_eq!(next_move(&pod, &made(&old), &threads, "new"), Move::Evict);
}

#[test]
fn other_threads_and_connections_are_a_restart_by_the_agent_in_the_same_pod() {
    let old = built_with(json!({}));
    let new = built_with(json!({"threads": 2, "maxConnections": 2048}));
    let Move::Patch(patch, record) = next_move(&running(&old), &made(&old), &new, "new") else {
        panic!("kept in place");
    };
    let annotations = &patch["metadata"]["annotations"];
    assert_eq!(
        annotations[resources::warm_restart::THREADS.annotation],
        json!("2")
    );
    assert_eq!(
        annotations[resources::warm_restart::MAX_CONNECTIONS.annotation],
        json!("2048")
    );
    assert_eq!(patch["spec"], json!({}), "no image changes");
    assert!(record.settings, "the agent restarts memcached");
}
