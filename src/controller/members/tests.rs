use super::*;
use k8s_openapi::api::core::v1::{ContainerStatus, PodCondition, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::collections::BTreeMap;

mod paths;

const NOW: i64 = 1_800_000_000;

fn at(seconds: i64) -> Timestamp {
    Timestamp::from_second(seconds).unwrap()
}

/// Member `cache-<ordinal>` of `revision`, Ready since `ready_since` (None: not Ready), its
/// memcached container restarted `restarts` times.
fn member(ordinal: i32, revision: &str, ready_since: Option<i64>, restarts: i32) -> Pod {
    let mut pod = Pod::default();
    pod.metadata.name = Some(format!("cache-{ordinal}"));
    pod.metadata.labels = Some([(REVISION_LABEL.to_string(), revision.to_string())].into());
    pod.status = Some(PodStatus {
        conditions: Some(vec![PodCondition {
            type_: "Ready".into(),
            status: if ready_since.is_some() {
                "True"
            } else {
                "False"
            }
            .into(),
            last_transition_time: ready_since.map(|s| Time(at(s))),
            ..PodCondition::default()
        }]),
        container_statuses: Some(vec![ContainerStatus {
            name: "memcached".into(),
            restart_count: restarts,
            ..ContainerStatus::default()
        }]),
        ..PodStatus::default()
    });
    pod
}

fn view(at_once: i32) -> View<'static> {
    View {
        update_revision: "new",
        wanted: 3,
        at_once,
        min_ready: SignedDuration::from_secs(5),
        now: at(NOW),
        replacing: BTreeSet::new(),
        wait: Duration::ZERO,
    }
}

fn updated_name(step: Step) -> Option<String> {
    match step {
        Step::Update(pod) => pod.metadata.name.clone(),
        _ => None,
    }
}

const LONG_AGO: Option<i64> = Some(NOW - 600);

#[test]
fn members_are_updated_from_the_highest_ordinal_down_one_at_a_time() {
    let pods = [0, 1, 2].map(|i| member(i, "old", LONG_AGO, 0));
    assert_eq!(
        updated_name(view(1).next_step(&pods)).as_deref(),
        Some("cache-2")
    );

    // cache-2 is out (being replaced): nothing else moves.
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        member(2, "new", None, 0),
    ];
    assert!(matches!(view(1).next_step(&pods), Step::Wait(_)));
    // maxUnavailable 2 lets the next go meanwhile.
    assert_eq!(
        updated_name(view(2).next_step(&pods)).as_deref(),
        Some("cache-1")
    );
}

#[test]
fn a_member_waits_for_the_proxies_to_hold_before_it_is_taken_out() {
    let pods = [0, 1, 2].map(|i| member(i, "old", LONG_AGO, 0));
    let held = View {
        wait: Duration::from_secs(3),
        ..view(1)
    };
    assert_eq!(held.next_step(&pods), Step::Wait(Duration::from_secs(3)));
    // A member back from its restart is labelled all the same.
    let mut back = member(2, "old", LONG_AGO, 1);
    back.metadata.annotations = Some(
        [(
            IN_PLACE_ANNOTATION.to_string(),
            r#"{"revision":"new","restarts":{"memcached":0}}"#.to_string(),
        )]
        .into(),
    );
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        back,
    ];
    assert!(matches!(held.next_step(&pods), Step::Finish(_)));
}

#[test]
fn the_next_member_waits_until_the_last_one_is_ready_for_min_ready_seconds() {
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        member(2, "new", Some(NOW - 2), 1),
    ];
    assert_eq!(
        view(1).next_step(&pods),
        Step::Wait(Duration::from_secs(3)),
        "looked at again when cache-2 has been Ready for 5 s"
    );
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        member(2, "new", Some(NOW - 5), 1),
    ];
    assert_eq!(
        updated_name(view(1).next_step(&pods)).as_deref(),
        Some("cache-1")
    );
}

#[test]
fn a_member_patched_in_place_counts_as_out_until_it_has_restarted_and_is_available() {
    // The kubelet runs memcached's preStop (the save) with the pod still Ready.
    let mut patched = member(2, "old", LONG_AGO, 4);
    patched.metadata.annotations = Some(
        [(
            IN_PLACE_ANNOTATION.to_string(),
            r#"{"revision":"new","restarts":{"memcached":4}}"#.to_string(),
        )]
        .into(),
    );
    let mut pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        patched,
    ];
    assert!(restart_pending(&pods[2]));
    assert!(matches!(view(1).next_step(&pods), Step::Wait(_)));

    // Restarted, Ready for 2 s of the 5: still out.
    let status = pods[2].status.as_mut().unwrap();
    status.container_statuses.as_mut().unwrap()[0].restart_count = 5;
    status.conditions.as_mut().unwrap()[0].last_transition_time = Some(Time(at(NOW - 2)));
    assert!(!restart_pending(&pods[2]));
    assert_eq!(view(1).next_step(&pods), Step::Wait(Duration::from_secs(3)));

    // Available: it takes the revision (it counts updated only now), and then
    // the next member goes.
    let status = pods[2].status.as_mut().unwrap();
    status.conditions.as_mut().unwrap()[0].last_transition_time = Some(Time(at(NOW - 6)));
    assert!(matches!(view(1).next_step(&pods), Step::Finish(p) if p.name_any() == "cache-2"));
    pods[2]
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .insert(REVISION_LABEL.into(), "new".into());
    assert_eq!(
        updated_name(view(1).next_step(&pods)).as_deref(),
        Some("cache-1")
    );
}

#[test]
fn an_outdated_member_already_out_is_updated_first_whatever_the_budget() {
    // cache-0 crash-loops on the old template: the new one may fix it, and it is out anyway.
    let pods = [
        member(0, "old", None, 7),
        member(1, "old", LONG_AGO, 0),
        member(2, "old", LONG_AGO, 0),
    ];
    assert_eq!(
        updated_name(view(1).next_step(&pods)).as_deref(),
        Some("cache-0")
    );
}

#[test]
fn every_member_of_the_update_revision_is_done() {
    let pods = [0, 1, 2].map(|i| member(i, "new", LONG_AGO, 0));
    assert_eq!(view(1).next_step(&pods), Step::Done);
}

fn template(memcached_image: &str, args: &[&str]) -> Value {
    json!({
        "metadata": {"labels": {"app": "cache", "team": "a"}, "annotations": {"old": "x"}},
        "spec": {
            "containers": [
                {"name": "memcached", "image": memcached_image, "args": args},
                {"name": "agent", "image": "operator:1"},
            ],
            "initContainers": [{"name": "auth-init", "image": "operator:1"}],
        }
    })
}

/// `pod` running `template`'s spec, its containers memcached and the agent.
fn with_agent(mut pod: Pod, template: &Value) -> Pod {
    pod.spec = Some(serde_json::from_value(template["spec"].clone()).unwrap());
    pod
}

fn agent_status(restart_count: i32, ready: bool) -> ContainerStatus {
    ContainerStatus {
        name: "agent".into(),
        restart_count,
        ready,
        ..ContainerStatus::default()
    }
}

fn statuses(pod: &mut Pod) -> &mut Vec<ContainerStatus> {
    let status = pod.status.as_mut().unwrap();
    status.container_statuses.as_mut().unwrap()
}

#[test]
fn a_new_image_is_patched_in_place_recording_the_restart_count() {
    let pod = member(1, "old", LONG_AGO, 2);
    let old = template("memcached:1.6.18", &["-m", "64"]);
    let mut new = template("memcached:1.6.45", &["-m", "64"]);
    new["metadata"]["labels"]["team"] = json!("b");
    new["metadata"]["annotations"] = json!({});
    let patch = restart_patch(&pod, &made(&old), &new, "new").expect("only the image changes");
    assert_eq!(
        patch,
        json!({
            "metadata": {
                "labels": {"team": "b"},
                "annotations": {
                    "old": null,
                    IN_PLACE_ANNOTATION: r#"{"revision":"new","restarts":{"memcached":2}}"#,
                    TEMPLATE_ANNOTATION: Record::of(&new).annotation(),
                },
            },
            "spec": {"containers": [{"name": "memcached", "image": "memcached:1.6.45"}]},
        })
    );
}

#[test]
fn a_member_tells_from_its_record_which_labels_and_annotations_were_the_templates() {
    let old = template("memcached:1.6.18", &["-m", "64"]);
    let mut member = made_member(&old);
    // Someone else's, and the operator's own bookkeeping: not the template's.
    member.labels_mut().insert("someone".into(), "else".into());
    member
        .annotations_mut()
        .insert("kubectl.kubernetes.io/restartedAt".into(), "now".into());
    let mut new = template("memcached:1.6.45", &["-m", "64"]);
    new["metadata"]["labels"] = json!({"app": "cache"});
    new["metadata"]["annotations"] = json!({"new": "y"});
    let made = Made::of_pod(&member, &new).expect("a record");
    let patch = restart_patch(&member, &made, &new, "new").expect("only the image changes");
    assert_eq!(patch["metadata"]["labels"], json!({"team": null}));
    let annotations = &patch["metadata"]["annotations"];
    assert_eq!(
        (&annotations["old"], &annotations["new"]),
        (&json!(null), &json!("y"))
    );
    assert!(
        annotations
            .get("kubectl.kubernetes.io/restartedAt")
            .is_none()
    );
    assert_eq!(
        patch["metadata"]["annotations"][TEMPLATE_ANNOTATION],
        r#"{"fixed":"bd81b45f66487f7b","labels":["app"],"annotations":["new"]}"#,
        "the record of the new template; its digest pinned, as the next release reads it"
    );

    // Beyond what a running pod takes: a new pod, whatever the labels say.
    let mut moved = new.clone();
    moved["spec"]["containers"][0]["ports"] = json!([{"containerPort": 11212}]);
    assert_eq!(restart_patch(&member, &made, &moved, "moved"), None);

    // A member made before 0.9.0 has no record: its template is read from its revision.
    let mut before = member.clone();
    before.annotations_mut().remove(TEMPLATE_ANNOTATION);
    assert!(Made::of_pod(&before, &new).is_none());
}

#[test]
fn a_new_operator_image_restarts_the_agent_and_the_init_container_waits_for_a_new_pod() {
    let pod = member(1, "old", LONG_AGO, 0);
    let old = template("memcached:1", &[]);
    let new = json!({
        "metadata": old["metadata"],
        "spec": {
            "containers": [
                {"name": "memcached", "image": "memcached:1", "args": []},
                {"name": "agent", "image": "operator:2"},
            ],
            "initContainers": [{"name": "auth-init", "image": "operator:2"}],
        }
    });
    let patch = restart_patch(&pod, &made(&old), &new, "new").unwrap();
    assert_eq!(
        patch["spec"],
        json!({
            "containers": [{"name": "agent", "image": "operator:2"}],
            "initContainers": [{"name": "auth-init", "image": "operator:2"}],
        })
    );
    // The agent has no status here: counted from 0.
    assert_eq!(
        patch["metadata"]["annotations"][IN_PLACE_ANNOTATION],
        json!(r#"{"revision":"new","restarts":{"agent":0}}"#)
    );
}

#[test]
fn a_change_beyond_images_cannot_be_taken_in_place() {
    let pod = member(1, "old", LONG_AGO, 0);
    let old = template("memcached:1", &["-m", "64"]);
    // memcached restores its file only with the same -m: a new one replaces the member.
    let new = template("memcached:2", &["-m", "128"]);
    assert_eq!(restart_patch(&pod, &made(&old), &new, "new"), None);
}

#[test]
fn the_update_lasts_until_the_last_replaced_member_serves() {
    // cache-0 was evicted and made anew of the new revision (so counts every
    // member updated), and it is not Ready yet.
    let mut pods = [
        member(0, "new", None, 0),
        member(1, "new", LONG_AGO, 0),
        member(2, "new", LONG_AGO, 0),
    ];
    let mut replacing = view(1);
    replacing.replacing.insert("cache-0".into());
    assert!(matches!(replacing.next_step(&pods), Step::Wait(_)));
    assert_eq!(replacing.available(&pods), ["cache-1", "cache-2"]);
    // Not evicted by us (a crash, a drain): no update of ours.
    assert_eq!(view(1).next_step(&pods), Step::Done);

    pods[0] = member(0, "new", Some(NOW - 6), 0);
    assert_eq!(
        replacing.available(&pods),
        ["cache-0", "cache-1", "cache-2"]
    );
}

#[test]
fn a_member_whose_agent_and_memcached_both_change_restarts_the_agent_first_then_memcached() {
    // The kubelet stops a patch's containers in no set order: the agent that saves memcached on
    // its preStop must not be the one stopping meanwhile.
    let old = template("memcached:1", &[]);
    let mut new = template("memcached:2", &[]);
    new["spec"]["containers"][1]["image"] = json!("operator:2");
    let mut pod = with_agent(member(2, "old", LONG_AGO, 3), &old);
    statuses(&mut pod).push(agent_status(0, false));

    let first = restart_patch(&pod, &made(&old), &new, "new").unwrap();
    assert_eq!(
        first["spec"]["containers"],
        json!([{"name": "agent", "image": "operator:2"}])
    );
    assert_eq!(
        first["metadata"]["annotations"][IN_PLACE_ANNOTATION],
        json!(r#"{"revision":"new","restarts":{"agent":0},"memcached_next":true}"#)
    );

    // The agent patched and restarted, the member available again: the same member goes on,
    // with memcached's image alone.
    let annotation = first["metadata"]["annotations"][IN_PLACE_ANNOTATION].clone();
    pod.metadata.annotations = Some(
        [(
            IN_PLACE_ANNOTATION.to_string(),
            annotation.as_str().unwrap().to_string(),
        )]
        .into(),
    );
    pod.spec.as_mut().unwrap().containers[1].image = Some("operator:2".into());
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        pod.clone(),
    ];
    assert!(restart_pending(&pods[2]), "the agent has not restarted yet");
    statuses(&mut pod)[1].restart_count = 1;
    let pods = [
        member(0, "old", LONG_AGO, 0),
        member(1, "old", LONG_AGO, 0),
        pod.clone(),
    ];
    assert_eq!(
        updated_name(view(1).next_step(&pods)).as_deref(),
        Some("cache-2")
    );
    let second = restart_patch(&pod, &made(&old), &new, "new").unwrap();
    assert_eq!(
        second["spec"],
        json!({"containers": [{"name": "memcached", "image": "memcached:2"}]})
    );
    assert_eq!(
        second["metadata"]["annotations"][IN_PLACE_ANNOTATION],
        json!(r#"{"revision":"new","restarts":{"memcached":3}}"#)
    );
}

#[test]
fn memcached_restarts_only_while_its_agent_can_answer_the_save() {
    // Revision "new" brought a new agent: the member's agent is patched and restarting when
    // revision "newer" brings a new memcached too. memcached's preStop would ask an agent that is
    // stopping or not yet back, and memcached would go unsaved.
    let old = template("memcached:1", &[]);
    let mut newer = template("memcached:2", &[]);
    newer["spec"]["containers"][1]["image"] = json!("operator:2");
    let mut pod = with_agent(member(2, "old", None, 3), &old);
    pod.spec.as_mut().unwrap().containers[1].image = Some("operator:2".into());
    pod.metadata.annotations = Some(
        [(
            IN_PLACE_ANNOTATION.to_string(),
            r#"{"revision":"new","restarts":{"agent":0}}"#.to_string(),
        )]
        .into(),
    );

    statuses(&mut pod).push(agent_status(0, true));
    assert_eq!(
        next_move(&pod, &made(&old), &newer, "newer"),
        Move::AwaitAgent,
        "patched, the old agent still running: it is about to stop"
    );
    statuses(&mut pod)[1] = agent_status(1, false);
    assert_eq!(
        next_move(&pod, &made(&old), &newer, "newer"),
        Move::AwaitAgent,
        "restarted, not running yet"
    );
    statuses(&mut pod)[1] = agent_status(1, true);
    let Move::Patch(patch, _) = next_move(&pod, &made(&old), &newer, "newer") else {
        panic!("the agent is back: memcached goes");
    };
    assert_eq!(
        patch["spec"],
        json!({"containers": [{"name": "memcached", "image": "memcached:2"}]})
    );

    // An agent down for another cause, not for a patch of ours, does not hold memcached's.
    pod.metadata.annotations = None;
    statuses(&mut pod)[1] = agent_status(4, false);
    assert!(matches!(
        next_move(&pod, &made(&old), &newer, "newer"),
        Move::Patch(..)
    ));
}

/// A member's pod template as `resources::pod_template` builds it for a 3-member Memcached of
/// `memory` MiB.
fn built(memory: i32, image: &str) -> Value {
    let mut mc = crate::fixtures::memcached("cache", 3);
    mc.spec.max_memory_mib = memory;
    mc.spec.image = Some(image.to_string());
    let template = resources::pod_template(&mc, &resources::Images::new("unused"));
    serde_json::to_value(template).unwrap()
}

/// The same template as 0.6–0.8 built it: `-m` from its annotation, `-t` and `-c` literal
/// arguments, here left unset.
fn as_before_0_9(template: &Value) -> Value {
    let mut t = template.clone();
    let wr = resources::warm_restart::SETTINGS;
    let annotations = t["metadata"]["annotations"].as_object_mut().unwrap();
    for setting in &wr[1..] {
        annotations.remove(setting.annotation);
    }
    let memcached = &mut t["spec"]["containers"][0];
    let args = memcached["args"].as_array_mut().unwrap();
    for setting in &wr[1..] {
        let at = args.iter().position(|a| a == setting.flag).unwrap();
        args.drain(at..at + 2);
    }
    memcached["env"].as_array_mut().unwrap().truncate(1);
    let volumes = t["spec"]["volumes"].as_array_mut().unwrap();
    let agents = volumes
        .iter_mut()
        .find(|v| v["name"] == "max-memory")
        .unwrap();
    agents["downwardAPI"]["items"]
        .as_array_mut()
        .unwrap()
        .truncate(1);
    t
}

/// The same template as 0.5.0 built it: `-m` a literal argument, the cache's `emptyDir` limited
/// to it, the agent's view of the file read-only and no annotation for it to read.
fn as_before_0_6(template: &Value) -> Value {
    let mut t = as_before_0_9(template);
    let memory = t["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .remove(resources::warm_restart::MEMORY_ANNOTATION)
        .unwrap();
    let memcached = &mut t["spec"]["containers"][0];
    memcached["args"][1] = memory.clone();
    memcached.as_object_mut().unwrap().remove("env");
    let agent = &mut t["spec"]["containers"][1];
    agent["args"]
        .as_array_mut()
        .unwrap()
        .retain(|a| !a.as_str().unwrap().starts_with("--max-memory-file"));
    agent["volumeMounts"] = json!([{"name": "cache", "mountPath": "/cache", "readOnly": true}]);
    let limit = format!("{}Mi", memory.as_str().unwrap().parse::<i32>().unwrap() + 1);
    t["spec"]["volumes"] =
        json!([{"name": "cache", "emptyDir": {"medium": "Memory", "sizeLimit": limit}}]);
    t
}

/// A running member of `template`, its agent ready.
fn running(template: &Value) -> Pod {
    let mut pod = member(1, "old", LONG_AGO, 2);
    pod.metadata.annotations =
        serde_json::from_value(template["metadata"]["annotations"].clone()).unwrap();
    pod.spec = serde_json::from_value(template["spec"].clone()).unwrap();
    statuses(&mut pod).push(agent_status(0, true));
    pod
}

/// `template`'s member as the operator makes it: the template's labels and annotations, and
/// its record of the template.
fn made_member(template: &Value) -> Pod {
    let mut pod = running(template);
    let labels: BTreeMap<String, String> =
        serde_json::from_value(template["metadata"]["labels"].clone()).unwrap_or_default();
    pod.labels_mut().extend(labels);
    let record = Record::of(template).annotation();
    pod.annotations_mut()
        .insert(TEMPLATE_ANNOTATION.to_string(), record);
    pod
}

/// The template `old` as an update reads it from its ControllerRevision.
fn made(old: &Value) -> Made {
    Made::from_template(old.clone())
}

fn record(patch: &Value) -> InPlace {
    serde_json::from_str(
        patch["metadata"]["annotations"][IN_PLACE_ANNOTATION]
            .as_str()
            .unwrap(),
    )
    .unwrap()
}

#[test]
fn a_member_made_before_memory_came_from_an_annotation_is_kept_by_the_upgrade() {
    let new = built(64, "memcached:2");
    let old = as_before_0_6(&built(64, "memcached:1"));
    let pod = running(&old);
    let patch =
        restart_patch(&pod, &made(&old), &new, "new").expect("the same member in another form");
    assert_eq!(
        patch["spec"],
        json!({"containers": [{"name": "memcached", "image": "memcached:2"}]})
    );
    assert_eq!(
        patch["metadata"]["annotations"].get(resources::warm_restart::MEMORY_ANNOTATION),
        None,
        "its memcached does not read it"
    );
}

#[test]
fn a_larger_memory_is_a_restart_by_the_agent_in_the_same_pod() {
    let old = built(64, "memcached:1");
    let new = built(128, "memcached:1");
    let pod = running(&old);
    let Move::Patch(patch, _) = next_move(&pod, &made(&old), &new, "new") else {
        panic!("kept in place");
    };
    assert_eq!(
        patch["metadata"]["annotations"][resources::warm_restart::MEMORY_ANNOTATION],
        json!("128")
    );
    assert_eq!(patch["spec"], json!({}), "no image changes");
    assert_eq!(
        record(&patch).restarts,
        [("memcached".to_string(), 2)].into()
    );
}

#[test]
fn a_memory_the_member_cannot_take_in_place_replaces_it() {
    let old = built(128, "memcached:1");
    // memcached refuses a file saved larger.
    let smaller = built(64, "memcached:1");
    assert_eq!(
        next_move(&running(&old), &made(&old), &smaller, "new"),
        Move::Evict
    );
    // A member of 0.5.0 runs its -m as a literal argument.
    let before = as_before_0_6(&old);
    let larger = built(256, "memcached:1");
    assert_eq!(
        next_move(&running(&before), &made(&before), &larger, "new"),
        Move::Evict
    );
}

#[test]
fn a_larger_memory_with_a_new_image_restarts_for_the_image_first() {
    let old = built(64, "memcached:1");
    let new = built(128, "memcached:2");
    let mut pod = running(&old);
    let first = restart_patch(&pod, &made(&old), &new, "new").unwrap();
    assert_eq!(
        first["spec"],
        json!({"containers": [{"name": "memcached", "image": "memcached:2"}]})
    );
    assert_eq!(
        first["metadata"]["annotations"].get(resources::warm_restart::MEMORY_ANNOTATION),
        None,
        "memcached's save and restart for the image keeps its size"
    );
    assert!(record(&first).memcached_next);

    // Restarted with the new image: now the memory.
    pod.spec.as_mut().unwrap().containers[0].image = Some("memcached:2".into());
    statuses(&mut pod)[0].restart_count = 3;
    let second = restart_patch(&pod, &made(&old), &new, "new").unwrap();
    assert_eq!(second["spec"], json!({}));
    assert_eq!(
        second["metadata"]["annotations"][resources::warm_restart::MEMORY_ANNOTATION],
        json!("128")
    );
    assert_eq!(
        record(&second).restarts,
        [("memcached".to_string(), 3)].into()
    );
}

#[test]
fn a_new_image_waits_for_the_agents_restart_for_a_larger_memory() {
    let old = built(64, "memcached:1");
    let larger = built(128, "memcached:1");
    let mut pod = running(&old);
    let Move::Patch(grow, _) = next_move(&pod, &made(&old), &larger, "larger") else {
        panic!("kept in place");
    };
    assert!(record(&grow).settings);
    // Patched, the agent about to restart memcached when a new image comes: memcached's save for
    // it would race the agent's, and could start the file saved at 64 MiB at 128, empty.
    let annotations = pod.metadata.annotations.as_mut().unwrap();
    annotations.insert(
        resources::warm_restart::MEMORY_ANNOTATION.into(),
        "128".into(),
    );
    annotations.insert(
        IN_PLACE_ANNOTATION.into(),
        grow["metadata"]["annotations"][IN_PLACE_ANNOTATION]
            .as_str()
            .unwrap()
            .into(),
    );
    let newer = built(128, "memcached:2");
    assert_eq!(
        next_move(&pod, &made(&old), &newer, "newer"),
        Move::AwaitAgent
    );
    // Restarted larger: the image goes.
    statuses(&mut pod)[0].restart_count = 3;
    assert!(matches!(
        next_move(&pod, &made(&old), &newer, "newer"),
        Move::Patch(..)
    ));
}

#[test]
fn a_member_raised_past_its_revision_is_replaced_for_a_smaller_memory() {
    // Raised to 128 by an update that a change back to 64 (with a new image) overtook: its
    // revision's template and the new one agree on 64, but memcached runs at 128.
    let old = built(64, "memcached:1");
    let mut pod = running(&old);
    pod.metadata.annotations.as_mut().unwrap().insert(
        resources::warm_restart::MEMORY_ANNOTATION.into(),
        "128".into(),
    );
    let new = built(64, "memcached:2");
    assert_eq!(next_move(&pod, &made(&old), &new, "new"), Move::Evict);
}

/// `built`, memcached limited to `limit` of memory.
fn built_with_limit(memory: i32, limit: &str) -> Value {
    let mut template = built(memory, "memcached:1");
    template["spec"]["containers"][0]["resources"] = json!({"limits": {"memory": limit}});
    template
}

/// The resize of memcached's container to `resources`.
fn memcached_resized(resources: Value) -> Value {
    json!({"spec": {"containers": [{"name": "memcached", "resources": resources}]}})
}

/// `pod` once the API server has taken a resize to `template`'s resources, its memcached
/// reporting `reported`.
fn resized(mut pod: Pod, template: &Value, reported: Value) -> Pod {
    let spec: Pod = serde_json::from_value(json!({"spec": template["spec"]})).unwrap();
    let memcached = &mut pod.spec.as_mut().unwrap().containers[0];
    memcached.resources = spec.spec.unwrap().containers[0].resources.clone();
    statuses(&mut pod)[0].resources = Some(serde_json::from_value(reported).unwrap());
    pod
}

#[test]
fn a_larger_memory_and_its_limit_resize_the_member_before_the_agent_restarts_memcached() {
    let old = built_with_limit(64, "96Mi");
    let new = built_with_limit(128, "192Mi");
    let pod = running(&old);
    assert_eq!(
        next_move(&pod, &made(&old), &new, "new"),
        Move::Resize(memcached_resized(json!({"limits": {"memory": "192Mi"}}))),
        "the limit first"
    );
    // Taken by the API server, not applied by the kubelet yet: memcached waits.
    let pending = resized(pod, &new, json!({"limits": {"memory": "96Mi"}}));
    assert_eq!(
        next_move(&pending, &made(&old), &new, "new"),
        Move::AwaitResize
    );
    assert!(
        view(1).available_in(&pending).is_none(),
        "out while it waits"
    );
    let applied = resized(pending, &new, json!({"limits": {"memory": "192Mi"}}));
    let Move::Patch(patch, _) = next_move(&applied, &made(&old), &new, "new") else {
        panic!("then the larger memory, in place");
    };
    assert_eq!(
        patch["metadata"]["annotations"][resources::warm_restart::MEMORY_ANNOTATION],
        json!("128")
    );
}

#[test]
fn new_cpu_alone_resizes_the_member_and_restarts_nothing() {
    let mut old = built(64, "memcached:1");
    old["spec"]["containers"][0]["resources"] =
        json!({"requests": {"cpu": "100m", "memory": "80Mi"}});
    let mut new = old.clone();
    new["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "250m"}});
    let pod = running(&old);
    assert_eq!(
        next_move(&pod, &made(&old), &new, "new"),
        Move::Resize(memcached_resized(json!({"requests": {"cpu": "250m"}}))),
        "a request no longer named stays as it is"
    );
    let mut applied = pod;
    applied.spec.as_mut().unwrap().containers[0].resources =
        serde_json::from_value(json!({"requests": {"cpu": "250m", "memory": "80Mi"}})).unwrap();
    let Move::Patch(patch, _) = next_move(&applied, &made(&old), &new, "new") else {
        panic!("kept in place");
    };
    assert_eq!(patch["spec"], json!({}), "no image changes");
    assert!(record(&patch).restarts.is_empty(), "nothing restarts");
}

#[test]
fn the_resize_is_judged_by_the_pods_own_resources() {
    // Resized to 500m by an update that a change back to 100m (with a new image) overtook: its
    // revision's template and the new one agree on 100m, the pod does not.
    let mut old = built(64, "memcached:1");
    old["spec"]["containers"][0]["resources"] = json!({"requests": {"cpu": "100m"}});
    let mut pod = running(&old);
    pod.spec.as_mut().unwrap().containers[0].resources =
        serde_json::from_value(json!({"requests": {"cpu": "500m"}})).unwrap();
    let mut new = old.clone();
    new["spec"]["containers"][0]["image"] = json!("memcached:2");
    assert_eq!(
        next_move(&pod, &made(&old), &new, "new"),
        Move::Resize(memcached_resized(json!({"requests": {"cpu": "100m"}})))
    );
    // Without new resources, none is sent.
    let pod = running(&old);
    assert!(matches!(
        next_move(&pod, &made(&old), &new, "new"),
        Move::Patch(..)
    ));
}

#[test]
fn a_resize_the_node_cannot_take_replaces_the_member() {
    let old = built_with_limit(64, "96Mi");
    let new = built_with_limit(64, "192Mi");
    let mut pod = resized(running(&old), &new, json!({"limits": {"memory": "96Mi"}}));
    pod.status
        .as_mut()
        .unwrap()
        .conditions
        .as_mut()
        .unwrap()
        .push(PodCondition {
            type_: "PodResizePending".into(),
            status: "True".into(),
            reason: Some("Infeasible".into()),
            ..PodCondition::default()
        });
    assert_eq!(next_move(&pod, &made(&old), &new, "new"), Move::Evict);
}

#[test]
fn a_change_beside_cpu_and_memory_still_replaces_the_member() {
    let old = built_with_limit(64, "96Mi");
    let mut new = built_with_limit(64, "192Mi");
    new["spec"]["containers"][0]["resources"]["limits"]["ephemeral-storage"] = json!("1Gi");
    assert_eq!(
        next_move(&running(&old), &made(&old), &new, "new"),
        Move::Evict
    );
}
