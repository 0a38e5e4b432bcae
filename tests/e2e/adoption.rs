//! 0.6.0's members adopted: a Memcached kept by its StatefulSet (made here as releases up to
//! 0.6.0 made them, with their agent's image) becomes one whose pods the operator keeps, with no
//! pod replaced. The adoption's writes are a revision, the StatefulSet's delete (orphaning its
//! pods), the StatefulSet's revisions collected and the pods patched: an operator that lacks the
//! right for the next write stops after the one before, and is killed there; the next one
//! resumes where it stopped. Then the members take the current template in place.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;
use memcached_operator::controller::TEMPLATE_ANNOTATION;
use memcached_operator::resources::{self, Images};

use super::harness::{
    CONVERGE, Operator, OperatorOptions, Rbac, admin, condition, create, events_with_reason,
    member_pods, memcached, namespace, set_size, shipped_rules, wait_converged, wait_for,
};

const ADOPTED_FROM: &str = "cache.example.com/adopted-from";

/// The shipped rules, less `verb` on `resource`.
fn without(resource: &str, verb: &str) -> Vec<PolicyRule> {
    shipped_rules("role.yaml")
        .into_iter()
        .map(|mut rule| {
            if rule.resources.iter().flatten().any(|r| r == resource) {
                rule.verbs.retain(|v| v != verb);
            }
            rule
        })
        .collect()
}

/// The members' uids by name.
async fn uids(client: &Client, ns: &str) -> BTreeMap<String, String> {
    member_pods(client, ns, "cache")
        .await
        .iter()
        .map(|p| (p.name_any(), p.uid().unwrap()))
        .collect()
}

async fn revisions(client: &Client, ns: &str) -> Vec<ControllerRevision> {
    Api::<ControllerRevision>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
}

/// No StatefulSet in `sets`' namespace: the operator keeps the members itself.
pub async fn assert_no_stateful_set(sets: &Api<StatefulSet>) {
    let left = sets.list(&ListParams::default()).await.unwrap().items;
    let names: Vec<String> = left.iter().map(ResourceExt::name_any).collect();
    assert!(names.is_empty(), "StatefulSets left: {names:?}");
}

/// The agent's image in releases up to 0.6.0's members.
const OLD_AGENT: &str = "memcached-operator:0.6.0";

/// The StatefulSet a release up to 0.6.0 kept `mc`'s members in, with their agent's image.
fn stateful_set_of_before(mc: &Memcached) -> StatefulSet {
    let images = Images {
        agent: OLD_AGENT.into(),
        ..Images::default()
    };
    serde_json::from_value(serde_json::json!({
        "metadata": resources::service(mc).metadata,
        "spec": {
            "replicas": mc.spec.size,
            "selector": {"matchLabels": resources::selector_labels(mc)},
            "serviceName": mc.name_any(),
            "podManagementPolicy": "Parallel",
            "updateStrategy": {"type": "OnDelete"},
            "minReadySeconds": 5,
            "template": resources::pod_template(mc, &images),
        },
    }))
    .unwrap()
}

/// As 0.6.0 reported it: Available, every member ready.
async fn report_available(mcs: &Api<Memcached>, size: i32) {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let status = serde_json::json!({"status": {
        "replicas": size, "readyReplicas": size, "availableReplicas": size, "observedGeneration": 1,
        "conditions": [{"type": "Available", "status": "True", "reason": "AllPodsReady",
                        "message": format!("{size}/{size} pods are ready"), "lastTransitionTime": now}],
    }});
    mcs.patch_status("cache", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .unwrap();
}

/// The Memcached is Available with every member, as a user's `kubectl wait` sees it.
async fn assert_available(mcs: &Api<Memcached>, when: &str) {
    let mc = mcs.get("cache").await.unwrap();
    assert_eq!(
        condition(&mc, "Available")
            .map(|(status, _)| status)
            .as_deref(),
        Some("True"),
        "{when}: {:?}",
        mc.status
    );
}

#[tokio::test]
async fn a_stateful_sets_members_are_adopted_with_no_pod_replaced_wherever_the_operator_stops() {
    let client = admin().await;
    let ns = namespace(&client, "adoption").await;
    let mcs: Api<Memcached> = Api::namespaced(client.clone(), &ns);
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), &ns);
    // As 0.6.0 left it: three members of a StatefulSet, all of its current revision.
    let mc = create(&client, &ns, &memcached("cache", 3)).await;
    sets.create(&PostParams::default(), &stateful_set_of_before(&mc))
        .await
        .unwrap();
    let sts_revision = wait_for("3 Ready members of the StatefulSet", CONVERGE, || async {
        let status = sets.get("cache").await.ok()?.status?;
        (status.ready_replicas == Some(3)).then_some(status.update_revision?)
    })
    .await;
    report_available(&mcs, 3).await;
    let before = uids(&client, &ns).await;
    let sts = sets.get("cache").await.unwrap();
    let stopped = |resource: &str, verb: &str| OperatorOptions {
        rbac: Rbac::ClusterRules(without(resource, verb)),
        watch_namespace: Some(ns.clone()),
        ..Default::default()
    };

    // 1. The revision of the template the members run, naming the StatefulSet's; no delete.
    {
        let _op = Operator::start(&client, stopped("statefulsets", "delete")).await;
        wait_for(
            "the revision adopting the members made",
            CONVERGE,
            || async {
                let kept = revisions(&client, &ns).await;
                kept.iter()
                    .any(|r| r.annotations().get(ADOPTED_FROM) == Some(&sts_revision))
                    .then_some(())
            },
        )
        .await;
    }
    assert_eq!(sets.get("cache").await.unwrap().uid(), sts.metadata.uid);
    assert_available(&mcs, "after the revision").await;

    // 2. The StatefulSet deleted, its members orphaned; no revision collected.
    {
        let _op =
            Operator::start(&client, stopped("controllerrevisions", "deletecollection")).await;
        wait_for(
            "the StatefulSet gone, its members kept",
            CONVERGE,
            || async {
                let gone = sets.get_opt("cache").await.ok()?.is_none();
                let pods = member_pods(&client, &ns, "cache").await;
                let orphans = pods.iter().all(|p| p.owner_references().is_empty());
                (gone && orphans && pods.len() == 3).then_some(())
            },
        )
        .await;
    }
    assert_eq!(uids(&client, &ns).await, before, "no member replaced");
    assert_available(&mcs, "after the StatefulSet's delete").await;

    // 3. The StatefulSet's revisions collected; no pod patched.
    let adopting = {
        let _op = Operator::start(&client, stopped("pods", "patch")).await;
        wait_for("only the adopting revision left", CONVERGE, || async {
            let kept = revisions(&client, &ns).await;
            match kept.as_slice() {
                [only] if only.annotations().contains_key(ADOPTED_FROM) => Some(only.name_any()),
                _ => None,
            }
        })
        .await
    };
    assert_available(&mcs, "after the revisions' collection").await;

    // 4. The members the Memcached's, then of the current template: their agent updated in
    //    place.
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    let current =
        resources::members::revision(&mc, &resources::pod_template(&mc, &Images::default()));
    assert_ne!(adopting, current, "adopted as of the template they run");
    wait_for("the members adopted and updated", CONVERGE, || async {
        let pods = member_pods(&client, &ns, "cache").await;
        let agent = |p: &Pod| {
            let spec = p.spec.as_ref()?;
            let agent = spec.containers.iter().find(|c| c.name == "agent")?;
            agent.image.clone()
        };
        let adopted = |p: &Pod| {
            let owner = p.owner_references().first();
            owner.is_some_and(|o| o.uid == mc.uid().unwrap() && o.controller == Some(true))
                && p.labels().get("controller-revision-hash") == Some(&current)
                && agent(p) == Some(Images::default().agent)
        };
        (pods.len() == 3 && pods.iter().all(adopted)).then_some(())
    })
    .await;
    assert_eq!(uids(&client, &ns).await, before, "no member replaced");
    wait_converged(&client, &ns, "cache", 3).await;
    assert_eq!(
        mcs.get("cache")
            .await
            .unwrap()
            .status
            .unwrap()
            .available_replicas,
        3
    );
    assert_no_stateful_set(&sets).await;
    let kept: Vec<String> = revisions(&client, &ns)
        .await
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    assert_eq!(
        kept,
        std::slice::from_ref(&adopting),
        "the Memcached's own: the one adopted as, until the next update; none for the current \
         template, which each member records"
    );
    for pod in member_pods(&client, &ns, "cache").await {
        assert!(pod.annotations().contains_key(TEMPLATE_ANNOTATION));
    }
    wait_for(
        "an event for the release and each member adopted",
        CONVERGE,
        || async {
            let released = events_with_reason(&client, &ns, "cache", "Released").await;
            let adopted = events_with_reason(&client, &ns, "cache", "Adopted").await;
            (released.len() == 1 && adopted.len() == 3).then_some(())
        },
    )
    .await;

    // Kept by the operator from now on: a fourth member is its own pod, under the next name.
    set_size(&client, &ns, "cache", 4).await;
    assert_eq!(
        wait_converged(&client, &ns, "cache", 4).await,
        ["cache-0", "cache-1", "cache-2", "cache-3"]
    );
    assert_eq!(
        uids(&client, &ns)
            .await
            .into_iter()
            .filter(|(n, _)| n != "cache-3")
            .collect::<BTreeMap<_, _>>(),
        before
    );
    assert_no_stateful_set(&sets).await;
}
