//! Updating a Memcached's members on the fake nodes (kwok restarts a container whose image is
//! patched, as a kubelet does: hack/templates/kwok-in-place-restart.yaml): a new image in place,
//! member by member from the highest ordinal, the pods and their names kept; new requests and
//! limits by resizing members in place; a change beyond those by replacing members one at a
//! time; and what the status says of each.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ContainerStatus, Pod};
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;

use super::harness::{
    CONVERGE, Operator, OperatorOptions, admin, condition, create, events_with_reason, memcached,
    namespace, wait_converged, wait_for,
};

/// The pods of Memcached `cache`.
async fn cache_pods(pods: &Api<Pod>) -> Vec<Pod> {
    pods.list(&ListParams::default().labels("app.kubernetes.io/instance=cache"))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
}

/// The status of `pod`'s container `name`.
fn status_of<'p>(pod: &'p Pod, name: &str) -> Option<&'p ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == name)
}

/// name → (uid, memcached's image, its restart count), of the pods not going away.
pub(super) async fn members(pods: &Api<Pod>) -> BTreeMap<String, (String, String, i32)> {
    cache_pods(pods)
        .await
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .map(|p| {
            let memcached = &p.spec.as_ref().unwrap().containers[0];
            let restarts = status_of(&p, "memcached").map_or(0, |c| c.restart_count);
            (
                p.name_any(),
                (
                    p.uid().unwrap(),
                    memcached.image.clone().unwrap_or_default(),
                    restarts,
                ),
            )
        })
        .collect()
}

/// Watches an update until the Memcached has converged again: the order in which members took
/// `image` (in place) or were replaced (a new uid), the most members out of service at once,
/// and the Progressing reasons seen.
struct Watched {
    order: Vec<String>,
    most_out: usize,
    reasons: Vec<String>,
}

impl Watched {
    fn went_one_at_a_time_from_the_top_saying(&self, reason: &str) {
        assert_eq!(self.order, ["cache-2", "cache-1", "cache-0"]);
        assert!(self.most_out <= 1, "{} members out at once", self.most_out);
        assert!(
            self.reasons.iter().any(|r| r == reason),
            "{:?}",
            self.reasons
        );
    }
}

/// How a member takes an update.
enum By<'a> {
    /// memcached restarted on this image.
    Image(&'a str),
    /// memcached restarted, in the same pod.
    Restart,
    /// A new pod.
    Replacement,
}

async fn watch_update(
    pods: &Api<Pod>,
    mcs: &Api<Memcached>,
    before: &BTreeMap<String, (String, String, i32)>,
    by: By<'_>,
) -> Watched {
    let mut watched = Watched {
        order: Vec::new(),
        most_out: 0,
        reasons: Vec::new(),
    };
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < CONVERGE,
            "update not done: {:?}",
            watched.order
        );
        let now = members(pods).await;
        let ready = cache_pods(pods)
            .await
            .iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none() && super::harness::pod_is_ready(p))
            .count();
        watched.most_out = watched.most_out.max(3usize.saturating_sub(ready));
        for (name, (uid, current, restarts)) in &now {
            let changed = match by {
                By::Image(image) => current == image,
                By::Restart => before.get(name).is_some_and(|(_, _, old)| old < restarts),
                By::Replacement => before.get(name).is_some_and(|(old, _, _)| old != uid),
            };
            if changed && !watched.order.contains(name) {
                watched.order.push(name.clone());
            }
        }
        let mc = mcs.get("cache").await.unwrap();
        if let Some((_, reason)) = condition(&mc, "Progressing")
            && watched.reasons.last() != Some(&reason)
        {
            watched.reasons.push(reason);
        }
        let done = condition(&mc, "Available") == Some(("True".into(), "AllPodsReady".into()))
            && watched.reasons.last().map(String::as_str) == Some("Converged")
            && watched.order.len() == 3;
        if done {
            return watched;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A new image for Memcached `cache` of 3: the same pods, each restarted once, from cache-2 down,
/// one at a time. The members after it.
pub(super) async fn a_new_image_restarts_each_member_once_in_place(
    pods: &Api<Pod>,
    mcs: &Api<Memcached>,
    before: &BTreeMap<String, (String, String, i32)>,
) -> BTreeMap<String, (String, String, i32)> {
    let patch = serde_json::json!({"spec": {"image": "memcached:another-build"}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let watched = watch_update(pods, mcs, before, By::Image("memcached:another-build")).await;
    watched.went_one_at_a_time_from_the_top_saying("RestartingInPlace");
    let after = members(pods).await;
    for (name, (uid, _, restarts)) in &after {
        let (old_uid, _, old_restarts) = &before[name];
        assert_eq!(uid, old_uid, "{name} is the same pod");
        assert_eq!(*restarts, old_restarts + 1, "{name} restarted once");
    }
    after
}

#[tokio::test]
async fn a_new_image_restarts_each_member_in_place_and_a_new_item_size_replaces_them() {
    let client = admin().await;
    let ns = namespace(&client, "members").await;
    let _operator = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&client, &ns, &memcached("cache", 3)).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let before = members(&pods).await;

    let after = a_new_image_restarts_each_member_once_in_place(&pods, &mcs, &before).await;
    let restarted = events_with_reason(&client, &ns, "cache", "Restarted")
        .await
        .len();
    assert_eq!(restarted, 3, "an event per member restarted");

    // A larger memory: memcached restarted in the same pods (by the agent, which kwok plays),
    // one at a time, each told its new size through the pod's annotation.
    let patch = serde_json::json!({"spec": {"maxMemoryMiB": 128}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let watched = watch_update(&pods, &mcs, &after, By::Restart).await;
    watched.went_one_at_a_time_from_the_top_saying("RestartingInPlace");
    let grown = members(&pods).await;
    for (name, (uid, _, restarts)) in &grown {
        let (old_uid, _, old_restarts) = &after[name];
        assert_eq!(uid, old_uid, "{name} is the same pod");
        assert_eq!(*restarts, old_restarts + 1, "{name} restarted once");
    }
    for pod in cache_pods(&pods).await {
        assert_eq!(
            pod.annotations()
                .get("cache.example.com/max-memory-mib")
                .map(String::as_str),
            Some("128"),
            "{}",
            pod.name_any()
        );
    }
    a_new_item_size_replaces_each_member(&pods, &mcs, &grown).await;
}

/// A new item size for Memcached `cache` of 3: memcached cannot restore its file with it, so each
/// member is replaced (evicted, made anew under its name), from cache-2 down, one at a time.
pub(super) async fn a_new_item_size_replaces_each_member(
    pods: &Api<Pod>,
    mcs: &Api<Memcached>,
    before: &BTreeMap<String, (String, String, i32)>,
) {
    let patch = serde_json::json!({"spec": {"maxItemSizeMiB": 2}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let watched = watch_update(pods, mcs, before, By::Replacement).await;
    watched.went_one_at_a_time_from_the_top_saying("ReplacingMembers");
    let names: Vec<_> = members(pods).await.into_keys().collect();
    assert_eq!(names, ["cache-0", "cache-1", "cache-2"]);
}

/// For each pod: (memcached's image in its spec, the agent's image as its status says it runs).
async fn images_of(pods: &Api<Pod>) -> BTreeMap<String, (String, String)> {
    cache_pods(pods)
        .await
        .into_iter()
        .map(|p| {
            let spec_image = |name: &str| {
                p.spec.as_ref().and_then(|s| {
                    s.containers
                        .iter()
                        .find(|c| c.name == name)
                        .and_then(|c| c.image.clone())
                })
            };
            let running = status_of(&p, "agent").map(|c| c.image.clone());
            (
                p.name_any(),
                (
                    spec_image("memcached").unwrap_or_default(),
                    running.unwrap_or_default(),
                ),
            )
        })
        .collect()
}

#[tokio::test]
async fn an_upgrade_of_the_agent_and_memcached_restarts_each_members_agent_before_its_memcached() {
    let client = admin().await;
    let ns = namespace(&client, "agentfirst").await;
    let with_agent = |image: &str| OperatorOptions {
        env: vec![("RELATED_IMAGE_AGENT".into(), image.into())],
        ..OperatorOptions::watching(&ns)
    };
    let mut old = Operator::start(&client, with_agent("operator:old")).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    create(&client, &ns, &memcached("cache", 3)).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let before = members(&pods).await;
    old.stop("TERM").await;

    // An operator upgrade that brings a new memcached too: both containers of every member change.
    let patch = serde_json::json!({"spec": {"image": "memcached:next"}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let _new = Operator::start(&client, with_agent("operator:new")).await;
    let start = Instant::now();
    let mut early = vec![];
    loop {
        assert!(start.elapsed() < CONVERGE, "update not done");
        for (name, (memcached, agent)) in images_of(&pods).await {
            // memcached's preStop asks the agent to save: its patch waits for the new agent.
            if memcached == "memcached:next" && agent != "operator:new" {
                early.push(name);
            }
        }
        let now = members(&pods).await;
        let done = now.len() == 3
            && now.values().all(|(_, image, _)| image == "memcached:next")
            && condition(&mcs.get("cache").await.unwrap(), "Progressing")
                .is_some_and(|(_, reason)| reason == "Converged");
        if done {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        early.is_empty(),
        "memcached patched while its agent still ran the old image: {early:?}"
    );
    let after = members(&pods).await;
    for (name, (uid, _, restarts)) in &after {
        let (old_uid, _, old_restarts) = &before[name];
        assert_eq!(uid, old_uid, "{name} is the same pod");
        assert_eq!(
            *restarts,
            old_restarts + 1,
            "{name}'s memcached restarted once"
        );
    }
    let restarted = events_with_reason(&client, &ns, "cache", "Restarted")
        .await
        .into_iter()
        .map(|e| e.related.and_then(|r| r.name).unwrap_or_default())
        .collect::<Vec<_>>();
    assert_eq!(
        restarted.len(),
        3,
        "one Restarted event per member, its two patches one update: {restarted:?}"
    );
}

/// name → memcached's resources in its pod spec and as its status reports them (kwok plays a
/// kubelet that resizes), of the pods of `cache`.
async fn resources_of(pods: &Api<Pod>) -> BTreeMap<String, [serde_json::Value; 2]> {
    cache_pods(pods)
        .await
        .into_iter()
        .map(|p| {
            let memcached = &p.spec.as_ref().unwrap().containers[0];
            let reported = status_of(&p, "memcached").and_then(|c| c.resources.clone());
            let both = [
                serde_json::json!(memcached.resources),
                serde_json::json!(reported),
            ];
            (p.name_any(), both)
        })
        .collect()
}

#[tokio::test]
async fn new_requests_and_limits_resize_each_member_in_place_and_restart_nothing() {
    let client = admin().await;
    let ns = namespace(&client, "resize").await;
    let _operator = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mut mc = memcached("cache", 3);
    mc.spec.resources = serde_json::from_value(serde_json::json!({
        "requests": {"cpu": "50m", "memory": "96Mi"},
        "limits": {"memory": "128Mi"},
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 3).await;
    let before = members(&pods).await;

    let resources = serde_json::json!({
        "requests": {"cpu": "100m", "memory": "96Mi"},
        "limits": {"memory": "192Mi"},
    });
    let patch = serde_json::json!({"spec": {"resources": resources}});
    mcs.patch("cache", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    wait_for(
        "every member resized and the update done",
        CONVERGE,
        || async {
            let all = resources_of(&pods).await;
            let resized = all.len() == 3 && all.values().all(|r| r.iter().all(|r| *r == resources));
            let mc = mcs.get("cache").await.ok()?;
            let converged = condition(&mc, "Progressing").is_some_and(|(_, r)| r == "Converged");
            (resized && converged).then_some(())
        },
    )
    .await;
    assert_eq!(
        members(&pods).await,
        before,
        "the same pods, nothing restarted"
    );
    let resized = events_with_reason(&client, &ns, "cache", "Resized")
        .await
        .len();
    assert_eq!(resized, 3, "an event per member resized");
}
