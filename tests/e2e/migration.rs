//! The move from the Deployments of 0.2.0 to StatefulSets: each Memcached once, within the
//! rollout budget, with its pods serving throughout and nothing of the Deployment left; then
//! the StatefulSets' members adopted, as 0.6.0's are.

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;

use super::harness::{
    CONVERGE, Operator, OperatorOptions, admin, condition, create, memcached, namespace,
    pod_is_ready, wait_converged, wait_for,
};

/// The Deployment 0.2.0 kept for `mc`: its name, labels, selector and controller reference.
fn deployment_of_0_2_0(mc: &Memcached, size: i32) -> Deployment {
    let name = mc.name_any();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {
            "name": name,
            "labels": {
                "app.kubernetes.io/name": "memcached",
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/managed-by": "memcached-operator",
            },
            "ownerReferences": [{
                "apiVersion": "cache.example.com/v1alpha1", "kind": "Memcached",
                "name": name, "uid": mc.uid().unwrap(),
                "controller": true, "blockOwnerDeletion": true,
            }],
        },
        "spec": {
            "replicas": size,
            "selector": {"matchLabels": {
                "app.kubernetes.io/name": "memcached",
                "app.kubernetes.io/instance": name,
            }},
            "template": {
                "metadata": {"labels": {
                    "app.kubernetes.io/name": "memcached",
                    "app.kubernetes.io/instance": name,
                    "app.kubernetes.io/managed-by": "memcached-operator",
                }},
                "spec": {"containers": [{"name": "memcached", "image": "memcached:0.2.0"}]},
            },
        },
    }))
    .unwrap()
}

/// Ready pods of the Memcached `name` (both workloads' pods carry its labels).
async fn ready_pods(pods: &Api<Pod>, name: &str) -> Vec<Pod> {
    let selector = format!("app.kubernetes.io/instance={name}");
    pods.list(&ListParams::default().labels(&selector))
        .await
        .map(|l| l.items)
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && pod_is_ready(p))
        .collect()
}

#[tokio::test]
async fn an_upgrade_from_deployments_moves_each_memcached_once_within_the_budget() {
    let client = admin().await;
    let ns = namespace(&client, "migration").await;
    let (names, size) = (["a", "b", "c"], 2);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    // What 0.2.0 left: Memcacheds, each with its Deployment and Ready pods, and no StatefulSet.
    for name in names {
        let mc = create(&client, &ns, &memcached(name, size)).await;
        deployments
            .create(&PostParams::default(), &deployment_of_0_2_0(&mc, size))
            .await
            .unwrap();
    }
    for name in names {
        wait_for(
            &format!("{name}'s Deployment pods Ready"),
            CONVERGE,
            || async { (ready_pods(&pods, name).await.len() == size as usize).then_some(()) },
        )
        .await;
    }
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    // And the status 0.2.0 reported of them: its spec seen, its pods Ready.
    let mut uids = vec![];
    for name in names {
        let mc = mcs.get(name).await.unwrap();
        let status = serde_json::json!({"status": {
            "observedGeneration": mc.metadata.generation,
            "nodes": [], "replicas": size, "readyReplicas": size, "availableReplicas": size,
            "conditions": [{
                "type": "Available", "status": "True", "reason": "AllPodsReady",
                "message": format!("{size}/{size} pods are ready"),
                "lastTransitionTime": "2026-11-26T00:00:00Z",
                "observedGeneration": mc.metadata.generation,
            }],
        }});
        mcs.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        uids.push(mc.uid());
    }

    let _op = Operator::start(
        &client,
        OperatorOptions {
            extra_args: vec!["--max-concurrent-rollouts=1".into()],
            ..OperatorOptions::watching(&ns)
        },
    )
    .await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    let started = Instant::now();

    let (mut most_moving, mut fewest_ready, mut migrating_seen) = (0, usize::MAX, false);
    loop {
        let left = deployments
            .list(&ListParams::default())
            .await
            .unwrap()
            .items;
        let created = sets.list(&ListParams::default()).await.unwrap().items;
        // Moving: a StatefulSet beside a Deployment not yet deleted.
        let moving = created
            .iter()
            .filter(|s| left.iter().any(|d| d.name_any() == s.name_any()))
            .count();
        most_moving = most_moving.max(moving);
        for name in names {
            fewest_ready = fewest_ready.min(ready_pods(&pods, name).await.len());
            let mc = mcs.get(name).await.unwrap();
            let available = condition(&mc, "Available").unwrap_or_default();
            assert_eq!(
                available.0, "True",
                "{name} stayed Available: {available:?}"
            );
            migrating_seen |= available.1 == "Migrating";
        }
        // A Deployment goes once its StatefulSet serves in its place.
        if left.is_empty() {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(180),
            "the move did not finish: Deployments left {:?}",
            left.iter().map(ResourceExt::name_any).collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    println!(
        "moved {} Memcacheds in {:.1} s; at most {most_moving} at once; at least {fewest_ready} Ready pods each throughout",
        names.len(),
        started.elapsed().as_secs_f64()
    );
    assert_eq!(most_moving, 1, "one Memcached moved at a time");
    assert!(migrating_seen, "the status said Migrating while moving");
    assert!(fewest_ready >= size as usize, "size pods Ready throughout");

    // Then, as 0.6.0's, the StatefulSets' members are adopted: the operator keeps the pods.
    wait_for("the StatefulSets' members adopted", CONVERGE, || async {
        let left = sets.list(&ListParams::default()).await.ok()?.items;
        left.is_empty().then_some(())
    })
    .await;
    let replica_sets: Api<ReplicaSet> = Api::namespaced(client.clone(), &ns);
    for (name, uid) in names.iter().zip(uids) {
        let members: Vec<String> = (0..size).map(|i| format!("{name}-{i}")).collect();
        assert_eq!(wait_converged(&client, &ns, name, size).await, members);
        assert_eq!(
            mcs.get(name).await.unwrap().uid(),
            uid,
            "the same Memcached"
        );
    }
    wait_for(
        "the Deployments' ReplicaSets and pods garbage-collected",
        CONVERGE,
        || async {
            let sets = replica_sets.list(&ListParams::default()).await.ok()?.items;
            let all = pods.list(&ListParams::default()).await.ok()?.items;
            (sets.is_empty() && all.len() == names.len() * size as usize).then_some(())
        },
    )
    .await;
}
