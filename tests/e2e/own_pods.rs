//! The members as pods the operator keeps itself (the default since 0.7.0), with the shipped
//! RBAC: no StatefulSet; the members made under the names the StatefulSet gave them, scaled from
//! the top, made again when lost, updated in place or replaced as under the StatefulSet, refused
//! by a quota in the API server's words, and collected with their Memcached; the members made
//! named in the Created events, an event for each member deleted; no ControllerRevision made,
//! and those of members made before 0.9.0 read for their update, then collected.

use std::time::Duration;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::{Pod, ResourceQuota};
use kube::Client;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::controller::TEMPLATE_ANNOTATION;
use memcached_operator::resources::{self, Images, REVISION_LABEL};

use super::adoption::assert_no_stateful_set;
use super::harness::{
    CONVERGE, Operator, OperatorOptions, admin, create, events_with_reason, memcached, namespace,
    set_size, wait_converged, wait_degraded, wait_for,
};
use super::members::{
    a_new_image_restarts_each_member_once_in_place, a_new_item_size_replaces_each_member, members,
};

#[tokio::test]
async fn members_kept_by_the_operator_scale_heal_update_in_place_or_anew_and_go_with_their_memcached()
 {
    let client = admin().await;
    let ns = namespace(&client, "own-pods").await;
    let operator = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let mc = create(&client, &ns, &memcached("cache", 3)).await;
    let names = wait_converged(&client, &ns, "cache", 3).await;
    assert_eq!(names, ["cache-0", "cache-1", "cache-2"]);
    // Available once Ready for minReadySeconds (5 s by default), which no event tells of.
    wait_for("3 available members reported", CONVERGE, || async {
        let status = mcs.get("cache").await.ok()?.status?;
        (status.available_replicas == 3).then_some(())
    })
    .await;

    // No StatefulSet: each member is the Memcached's, with its stable address under the Service.
    assert_no_stateful_set(&Api::<StatefulSet>::namespaced(client.clone(), &ns)).await;
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        let owner = &pod.owner_references()[0];
        assert_eq!(
            (owner.uid.as_str(), owner.controller),
            (mc.uid().unwrap().as_str(), Some(true))
        );
        let spec = pod.spec.as_ref().unwrap();
        assert_eq!(spec.hostname.as_deref(), Some(pod.name_any().as_str()));
        assert_eq!(spec.subdomain.as_deref(), Some("cache"));
        assert!(
            pod.annotations().contains_key(TEMPLATE_ANNOTATION),
            "{} records its template",
            pod.name_any()
        );
    }
    // Each member records what an update compares of its template: no revision object.
    let revisions = Api::<ControllerRevision>::namespaced(client.clone(), &ns);
    let kept = revisions.list(&ListParams::default()).await.unwrap().items;
    assert!(kept.is_empty(), "{kept:?}");
    wait_for(
        "the members made named in the Created events",
        CONVERGE,
        || async {
            let created = notes(&client, &ns, "Created").await;
            ["cache-0", "cache-1", "cache-2"]
                .iter()
                .all(|m| created.iter().any(|n| n.contains(&format!("Pod {m}"))))
                .then_some(())
        },
    )
    .await;

    // Down from the top, and up again under the same names.
    set_size(&client, &ns, "cache", 1).await;
    assert_eq!(wait_converged(&client, &ns, "cache", 1).await, ["cache-0"]);
    wait_for("an event for each member deleted", CONVERGE, || async {
        let deleted = notes(&client, &ns, "Deleted").await;
        ["cache-1", "cache-2"]
            .iter()
            .all(|m| {
                deleted
                    .iter()
                    .any(|n| n.starts_with(&format!("Deleted Pod {m}:")))
            })
            .then_some(())
    })
    .await;
    set_size(&client, &ns, "cache", 3).await;
    wait_converged(&client, &ns, "cache", 3).await;

    // A quota of three pods: a fourth member is refused, in the API server's words, and made
    // once the quota is gone (no watch event tells of that: the recheck finds it).
    let quotas = Api::<ResourceQuota>::namespaced(client.clone(), &ns);
    let quota: ResourceQuota = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "three-pods"},
        "spec": {"hard": {"pods": "3"}},
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &quota).await.unwrap();
    wait_for("the quota counted", CONVERGE, || async {
        let used = quotas.get("three-pods").await.ok()?.status?.used?;
        (used.get("pods")?.0 == "3").then_some(())
    })
    .await;
    set_size(&client, &ns, "cache", 4).await;
    let message = wait_degraded(&mcs, "cache", "PodCreationRefused", CONVERGE).await;
    assert!(
        message.starts_with("3/4 pods are ready; pods cannot be created: ")
            && message.contains("cache-3")
            && message.contains("exceeded quota: three-pods"),
        "{message}"
    );
    quotas
        .delete("three-pods", &DeleteParams::default())
        .await
        .unwrap();
    wait_converged(&client, &ns, "cache", 4).await;
    set_size(&client, &ns, "cache", 3).await;
    wait_converged(&client, &ns, "cache", 3).await;

    // A member lost is made again under its name.
    let lost = pods.get("cache-1").await.unwrap().uid();
    pods.delete("cache-1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("cache-1 made again", CONVERGE, || async {
        let pod = pods.get_opt("cache-1").await.ok()??;
        (pod.uid() != lost && super::harness::pod_is_ready(&pod)).then_some(())
    })
    .await;
    wait_converged(&client, &ns, "cache", 3).await;

    // Members as releases before 0.9.0 made them: no record on the pods, their template in the
    // ControllerRevision of their revision.
    let template = resources::pod_template(&mc, &Images::default());
    let first = resources::members::revision(&mc, &template);
    let history = resources::members::controller_revision(&mc, &template, &first);
    revisions
        .create(&PostParams::default(), &history)
        .await
        .unwrap();
    let unrecord = serde_json::json!({"metadata": {"annotations": {TEMPLATE_ANNOTATION: null}}});
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        assert_eq!(
            pod.labels()[REVISION_LABEL],
            first,
            "the template's revision"
        );
        pods.patch(
            &pod.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&unrecord),
        )
        .await
        .unwrap();
    }

    // A new image: each member restarted in place, as under the StatefulSet (their template
    // read from the revision).
    let before = members(&pods).await;
    let after = a_new_image_restarts_each_member_once_in_place(&pods, &mcs, &before).await;
    // A new item size: each member evicted (its budget holds, through the Memcached's scale
    // subresource) and made anew from the new revision by the operator.
    a_new_item_size_replaces_each_member(&pods, &mcs, &after).await;
    // The revision no member had any more when the third template's update started is
    // collected, and no other was made.
    let kept = revisions.list(&ListParams::default()).await.unwrap().items;
    assert!(kept.is_empty(), "{first} collected: {kept:?}");
    for pod in pods.list(&ListParams::default()).await.unwrap() {
        assert!(pod.annotations().contains_key(TEMPLATE_ANNOTATION));
    }
    operator.assert_no_failed_reconciles().await;

    // Deleted with their Memcached, by the garbage collector.
    mcs.delete("cache", &DeleteParams::default()).await.unwrap();
    wait_for("the members collected", Duration::from_secs(60), || async {
        let left = pods.list(&ListParams::default()).await.ok()?.items;
        left.is_empty().then_some(())
    })
    .await;
}

/// The notes of the events of `reason` on Memcached "cache".
async fn notes(client: &Client, ns: &str, reason: &str) -> Vec<String> {
    events_with_reason(client, ns, "cache", reason)
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect()
}
