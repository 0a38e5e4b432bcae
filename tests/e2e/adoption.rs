//! 0.6.0's members adopted: a Memcached kept by its StatefulSet (made here with
//! `--members=statefulset`, as releases up to 0.6.0 made them) becomes one whose pods the operator
//! keeps, with no pod replaced. The adoption's writes are a revision, the StatefulSet's delete
//! (orphaning its pods), the StatefulSet's revisions collected and the pods patched: an operator
//! that lacks the right for the next write stops after the one before, and is killed there; the
//! next one resumes where it stopped.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{ControllerRevision, StatefulSet};
use k8s_openapi::api::rbac::v1::PolicyRule;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use memcached_operator::api::Memcached;

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
    let mc = {
        let _old = Operator::start(
            &client,
            OperatorOptions {
                watch_namespace: Some(ns.clone()),
                ..OperatorOptions::stateful_sets()
            },
        )
        .await;
        let mc = create(&client, &ns, &memcached("cache", 3)).await;
        wait_converged(&client, &ns, "cache", 3).await;
        wait_for("3 available members reported", CONVERGE, || async {
            let status = mcs.get("cache").await.ok()?.status?;
            (status.available_replicas == 3).then_some(())
        })
        .await;
        mc
    };
    let before = uids(&client, &ns).await;
    let sts = sets.get("cache").await.unwrap();
    let sts_revision = sts.status.unwrap().update_revision.unwrap();
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

    // 4. The members the Memcached's, of its revision, and nothing else changed.
    let _op = Operator::start(&client, OperatorOptions::watching(&ns)).await;
    wait_for("the members adopted", CONVERGE, || async {
        let pods = member_pods(&client, &ns, "cache").await;
        pods.iter()
            .all(|p| {
                let owner = p.owner_references().first();
                owner.is_some_and(|o| o.uid == mc.uid().unwrap() && o.controller == Some(true))
                    && p.labels().get("controller-revision-hash") == Some(&adopting)
            })
            .then_some(())
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
    assert_eq!(revisions(&client, &ns).await.len(), 1);
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
