//! A Memcached whose pods are not Ready says why, for each everyday cause, caused for real: an
//! image tag that does not exist, a memory limit memcached outgrows, a node selector nothing
//! matches, a quota that refuses a pod. Each is named by the conditions within 30 s of the pod
//! (or the ReplicaSet) reporting it, is one Warning event, and clears when the spec is fixed.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use memcached_operator::api::Memcached;
use memcached_operator_testkit::memcached::Connection;

use crate::harness::{
    CONVERGE, Operator, admin, create, events_for, member_pods, memcached, pod_is_ready,
    wait_converged, wait_for,
};
use crate::memcached::operator_for;
use crate::{RealNode, real_namespace};

/// Within this long of a pod reporting a cause, the Memcached names it.
const NAMED_WITHIN: Duration = Duration::from_secs(30);

/// (status, reason, message) of condition `type_`.
async fn condition(
    mcs: &Api<Memcached>,
    name: &str,
    type_: &str,
) -> Option<(String, String, String)> {
    let mc = mcs.get(name).await.ok()?;
    mc.status?
        .conditions
        .into_iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status, c.reason, c.message))
}

/// Waits until some pod of `name` reports what `reports` looks for; when it did.
async fn wait_pod_reports(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    timeout: Duration,
    reports: impl Fn(&Pod) -> bool,
) -> Instant {
    wait_for(
        &format!("a pod of {name} to report {what}"),
        timeout,
        || async {
            let pods = member_pods(client, ns, name).await;
            pods.iter().any(&reports).then(Instant::now)
        },
    )
    .await
}

/// Waits (at most `NAMED_WITHIN` after `since`) until Available=False names `reason`, and
/// checks Degraded says the same when the cause lasts; Available's message.
async fn wait_named(
    mcs: &Api<Memcached>,
    name: &str,
    reason: &str,
    lasting: bool,
    since: Instant,
) -> String {
    let left = NAMED_WITHIN.saturating_sub(since.elapsed());
    let message = wait_for(
        &format!("{name} Available=False {reason} within {NAMED_WITHIN:?} of the pod"),
        left,
        || async {
            let (status, got, message) = condition(mcs, name, "Available").await?;
            (status == "False" && got == reason).then_some(message)
        },
    )
    .await;
    println!(
        "{reason} named {:.1} s after the pod reported it: {message}",
        since.elapsed().as_secs_f64()
    );
    let degraded = condition(mcs, name, "Degraded").await.unwrap();
    if lasting {
        assert_eq!(
            (degraded.0.as_str(), degraded.1.as_str()),
            ("True", reason),
            "{degraded:?}"
        );
    } else {
        assert_eq!(degraded.0, "False", "{degraded:?}");
    }
    message
}

/// The Warning events on Memcached `name` with `reason`.
async fn warnings(client: &Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    events_for(client, ns, name)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
        .collect()
}

/// What each test starts from: a namespace on the real node with an operator of its own.
struct Scene {
    client: Client,
    node: RealNode,
    ns: String,
    mcs: Api<Memcached>,
    operator: Operator,
}

impl Scene {
    async fn start(prefix: &str) -> Scene {
        let client = admin().await;
        let node = RealNode::get();
        let ns = real_namespace(&client, prefix).await;
        let operator = operator_for(&client, &node, &ns).await;
        let mcs = Api::namespaced(client.clone(), &ns);
        Scene {
            client,
            node,
            ns,
            mcs,
            operator,
        }
    }
}

/// Waits for the cause's Warning, then checks it stays the only one while the pods keep failing.
async fn one_warning(client: &Client, ns: &str, name: &str, reason: &str, message: &str) {
    let first = wait_for(
        &format!("a {reason} Warning"),
        Duration::from_secs(10),
        || async { warnings(client, ns, name, reason).await.into_iter().next() },
    )
    .await;
    // The count may have moved since (a pod became Ready); the cause and its words have not.
    let cause = message.split_once("; ").map_or(message, |(_, cause)| cause);
    assert!(
        first.note.as_deref().is_some_and(|n| n.ends_with(cause)),
        "{:?} tells {cause}",
        first.note
    );
    // The kubelet retries meanwhile (pulls, restarts, scheduling attempts).
    tokio::time::sleep(Duration::from_secs(20)).await;
    let all = warnings(client, ns, name, reason).await;
    assert_eq!(all.len(), 1, "one Warning per cause: {all:#?}");
}

async fn patch_spec(mcs: &Api<Memcached>, name: &str, spec: serde_json::Value) {
    mcs.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(&serde_json::json!({ "spec": spec })),
    )
    .await
    .expect("patch the spec");
}

/// Fixed: Available=True with all pods Ready, and Degraded=False (the Deployment drops a
/// ReplicaFailure at its next rollout pass, after the scaling one).
async fn wait_fixed(client: &Client, mcs: &Api<Memcached>, ns: &str, name: &str, size: i32) {
    wait_converged(client, ns, name, size).await;
    wait_for("Degraded=False", CONVERGE, || async {
        let degraded = condition(mcs, name, "Degraded").await?;
        (degraded.0 == "False").then_some(())
    })
    .await;
}

fn waiting_reason(pod: &Pod) -> Vec<String> {
    pod.status
        .iter()
        .flat_map(|s| s.container_statuses.iter().flatten())
        .filter_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone())
        .collect()
}

#[tokio::test]
async fn an_image_tag_that_does_not_exist_is_image_pull_failed() {
    let Scene {
        client,
        node,
        ns,
        mcs,
        operator: _operator,
    } = Scene::start("why-image").await;
    let repository = node.memcached_image().rsplit_once(':').unwrap().0;
    let mut mc = memcached("cache", 2);
    mc.spec.image = Some(format!("{repository}:does-not-exist"));
    create(&client, &ns, &mc).await;

    let reported = wait_pod_reports(&client, &ns, "cache", "ErrImagePull", CONVERGE, |p| {
        waiting_reason(p)
            .iter()
            .any(|r| r == "ErrImagePull" || r == "ImagePullBackOff")
    })
    .await;
    let message = wait_named(&mcs, "cache", "ImagePullFailed", true, reported).await;
    assert!(
        message.starts_with("0/2 pods are ready; ") && message.contains("does-not-exist"),
        "the count and the kubelet's words: {message}"
    );
    one_warning(&client, &ns, "cache", "ImagePullFailed", &message).await;

    patch_spec(&mcs, "cache", serde_json::json!({"image": null})).await;
    wait_fixed(&client, &mcs, &ns, "cache", 2).await;
}

#[tokio::test]
async fn a_node_selector_nothing_matches_is_unschedulable() {
    let Scene {
        client,
        ns,
        mcs,
        operator: _operator,
        ..
    } = Scene::start("why-selector").await;
    let mut mc = memcached("cache", 2);
    mc.spec.node_selector = Some([("disk".to_string(), "none-has-this".to_string())].into());
    create(&client, &ns, &mc).await;

    let reported = wait_pod_reports(&client, &ns, "cache", "Unschedulable", CONVERGE, |p| {
        p.status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .any(|c| c.type_ == "PodScheduled" && c.reason.as_deref() == Some("Unschedulable"))
    })
    .await;
    // A node may yet join: not Degraded.
    let message = wait_named(&mcs, "cache", "Unschedulable", false, reported).await;
    assert!(
        message.starts_with("0/2 pods are ready; ")
            && message.contains("cannot be scheduled: ")
            && message.contains("node affinity/selector"),
        "the scheduler's words: {message}"
    );
    one_warning(&client, &ns, "cache", "Unschedulable", &message).await;

    patch_spec(&mcs, "cache", serde_json::json!({"nodeSelector": null})).await;
    wait_fixed(&client, &mcs, &ns, "cache", 2).await;
}

#[tokio::test]
async fn a_quota_that_refuses_the_second_pod_is_pod_creation_refused() {
    let Scene {
        client,
        ns,
        mcs,
        operator: _operator,
        ..
    } = Scene::start("why-quota").await;
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "one-pod"},
        "spec": {"hard": {"pods": "1"}}
    }))
    .unwrap();
    Api::<ResourceQuota>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &quota)
        .await
        .unwrap();
    create(&client, &ns, &memcached("cache", 2)).await;
    // The operator makes both members at once: the quota refuses one of them then.
    let reported = Instant::now();
    let message = wait_named(&mcs, "cache", "PodCreationRefused", true, reported).await;
    assert!(
        message.starts_with("1/2 pods are ready; pods cannot be created: ")
            || message.starts_with("0/2 pods are ready; pods cannot be created: "),
        "{message}"
    );
    assert!(
        message.contains("exceeded quota: one-pod"),
        "the API server's words: {message}"
    );
    one_warning(&client, &ns, "cache", "PodCreationRefused", &message).await;

    // The message settled on the pod that runs: 1/2 once it is Ready.
    patch_spec(&mcs, "cache", serde_json::json!({"size": 1})).await;
    wait_fixed(&client, &mcs, &ns, "cache", 1).await;
}

/// memcached's own memory beyond its items (hash table, connection buffers, threads) is a few
/// MiB: a limit 2 MiB above `maxMemoryMiB` passes the operator's check and is outgrown once the
/// cache fills (after some 630 items of 100 KiB at 64 MiB).
#[tokio::test]
async fn a_memory_limit_memcached_outgrows_is_oom_killed() {
    let Scene {
        client,
        ns,
        mcs,
        operator: _operator,
        ..
    } = Scene::start("why-oom").await;
    let mc: Memcached = serde_json::from_value(serde_json::json!({
        "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
        "metadata": {"name": "cache"},
        "spec": {"size": 1, "maxMemoryMiB": 64,
                 "resources": {"limits": {"memory": "66Mi"}, "requests": {"memory": "66Mi"}}}
    }))
    .unwrap();
    create(&client, &ns, &mc).await;
    wait_converged(&client, &ns, "cache", 1).await;

    // Fill the cache until memcached is killed, again after each restart, until the pod is not
    // Ready for it.
    let filling = tokio::spawn({
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let value = vec![b'x'; 100 * 1024];
            for round in 0.. {
                let Some(pod) = member_pods(&client, &ns, "cache").await.into_iter().next() else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let Some(ip) = pod.status.as_ref().and_then(|s| s.pod_ip.clone()) else {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                };
                let addr = SocketAddr::new(ip.parse().unwrap(), 11211);
                if let Ok(mut conn) = Connection::connect(addr).await {
                    for i in 0..2_000 {
                        if conn.set(&format!("r{round}-k{i}"), &value).await.is_err() {
                            break;
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let oom_killed = |p: &Pod| {
        let ready = pod_is_ready(p);
        let killed = p
            .status
            .iter()
            .flat_map(|s| s.container_statuses.iter().flatten())
            .filter(|c| c.name == "memcached")
            .any(|c| {
                [c.state.as_ref(), c.last_state.as_ref()]
                    .into_iter()
                    .flatten()
                    .filter_map(|s| s.terminated.as_ref())
                    .any(|t| t.reason.as_deref() == Some("OOMKilled"))
            });
        killed && !ready
    };
    let reported = wait_pod_reports(
        &client,
        &ns,
        "cache",
        "OOMKilled while not Ready",
        Duration::from_secs(180),
        oom_killed,
    )
    .await;
    let message = wait_named(&mcs, "cache", "OOMKilled", true, reported).await;
    assert_eq!(
        message,
        "0/1 pods are ready; 1 pod OOMKilled: container memcached was killed for exceeding its memory limit"
    );
    one_warning(&client, &ns, "cache", "OOMKilled", &message).await;
    filling.abort();

    patch_spec(
        &mcs,
        "cache",
        serde_json::json!({"resources": {"limits": {"memory": "96Mi"}, "requests": {"memory": "96Mi"}}}),
    )
    .await;
    wait_fixed(&client, &mcs, &ns, "cache", 1).await;
}
